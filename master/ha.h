/*  ha.h - a master's campaign for leadership among standby masters, over etcd
    (kvpoold --role master --ha etcd://HOST:PORT[,HOST:PORT...]/CLUSTER).

    Every master of a cluster runs one; the first to create the leader record
    (/kvpool/CLUSTER/leader, infra/leader.h) under its etcd lease leads, the others stand by,
    watching the record. The record's creation revision is the leader's term.

    Leadership is a lease, and the leader checks it on its own clock before every request:
    it leads until the time it last sent a keep-alive that etcd answered, plus the lease's
    TTL (less a margin). etcd counts the same TTL from when it received that keep-alive,
    later, so the leader always stops before etcd lets the record go and a standby can be
    elected: a leader paused (SIGSTOP, a long stall) wakes up with its lease over, and
    refuses everything before it has even asked etcd. A leader that loses etcd stops at the
    same moment; if etcd returns while its record still stands (a restarted etcd keeps its
    leases), it leads on in the same term, for no other master was elected meanwhile.

    etcd holds the leader record and, besides it, one fencing record per node a leader
    declared dead to finish a remove (FENCE, /kvpool/CLUSTER/fenced/NODE_ID): the next leader
    knows no tombstones, so a node fenced under an earlier term is taken back only with the
    copies other holders confirm (master.c, s_inventory). Nothing is written per object or
    per put: in steady state etcd sees the leader's keep-alives and nothing else.

    Threads: the campaign runs on a thread of its own; ha_leading, ha_fenced and the counters
    are called from the master's thread. ha_fence_write and ha_fence_clear talk to etcd from
    the caller's thread (the master's), with their own connection.
*/
#ifndef HA_H_INCLUDED
#define HA_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct _ha_t ha_t;

//  Starts the campaign of the master at endpoint (what nodes connect to) named master_id, in
//  the cluster of url, with leases of ttl_s seconds. Returns NULL with why in error.
//  Caller owns return value and must destroy it.
ha_t *ha_new (const char *url, int ttl_s, const char *endpoint, const char *master_id, char *error,
              size_t error_size);

//  Ends the campaign; a leader gives its lease back, so that a standby takes over at once.
void ha_destroy (ha_t **self_p);

//  The term this master leads now (its lease holds at now, zclock_mono), or 0: it stands by.
uint64_t ha_leading (ha_t *self, int64_t now);

//  The leader as this master last saw it (when it stands by): its endpoint ("": unknown)
//  and term.
void ha_leader (ha_t *self, char *endpoint, size_t size, uint64_t *term);

//  Terms won since the start.
uint64_t ha_terms_won (ha_t *self);

//  The term under which node_id was last fenced (recorded in etcd), or 0: not fenced.
uint64_t ha_fenced (ha_t *self, const char *node_id);

//  Records in etcd that node_id is fenced under term, before the fence is answered. Returns
//  0, or -1 when etcd did not take it (the fence fails: nothing may be removed around a node
//  the next leader would not know was away).
int ha_fence_write (ha_t *self, const char *node_id, uint64_t term);

//  The node came back and reported what it holds: its fencing record goes.
void ha_fence_clear (ha_t *self, const char *node_id);

void ha_test (bool verbose);

#endif
