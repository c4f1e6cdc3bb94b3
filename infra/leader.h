/*  leader.h - which master leads a cluster of standby masters, as a node knows it, and the
    watch of etcd that keeps it so (kvpoold --master etcd://HOST:PORT/CLUSTER).

    A cluster with standby masters (master/ha.h) has its leader's record in etcd, at
    /kvpool/CLUSTER/leader: the leader's endpoint and id, under the leader's etcd lease. The
    record's creation revision is the leader's term: every new leader's is higher, so a term
    says which of two masters was elected later. A node's leader watch reads the record and
    then waits on it (an etcd watch: no traffic while nothing changes); every change is read
    at once into the node's kvp_leader_t, which each of the node's master clients
    (actors/master_client.h) looks at before it sends: a new endpoint is connected to, and a
    reply from a master of an older term than the one known is dropped (that master was
    deposed, whatever it believes).

    When no master leads (the leader died and its lease has not run out yet, or etcd is
    unreachable), the endpoint is empty: requests to the master fail at once, saying so.

    Threads: the watch runs on a thread of its own; kvp_leader_t is read by any thread.
*/
#ifndef LEADER_H_INCLUDED
#define LEADER_H_INCLUDED

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvp_leader_s {
    pthread_mutex_t lock; //  over endpoint and master_id
    char endpoint[256];   //  the leader's; "": none now
    char master_id[128];
    _Atomic uint64_t term;       //  the highest term known (0: none yet)
    _Atomic uint64_t generation; //  moves on with every change of endpoint
    _Atomic uint64_t changes;    //  leaders followed since the start
    char url[600];               //  the etcd:// address, for messages
} kvp_leader_t;

//  The key of a cluster's leader record, and of the fencing record of node_id.
void kvp_leader_key (char *key, size_t size, const char *cluster);
void kvp_fence_key (char *key, size_t size, const char *cluster, const char *node_id);

//  A leader record's value: "ENDPOINT MASTER_ID". Parses it; returns 0, or -1 when it is not.
int kvp_leader_record_parse (const char *value, char *endpoint, size_t endpoint_size,
                             char *master_id, size_t id_size);

//  Copies the leader's endpoint (and its term) as known now; returns false when none leads.
bool kvp_leader_get (kvp_leader_t *leader, char *endpoint, size_t size, uint64_t *term);

//  Records what etcd said: endpoint elected at term (an older term than the one known
//  changes nothing), or "": none leads now (the term known stays). Returns true when the
//  endpoint changed.
bool kvp_leader_set (kvp_leader_t *leader, const char *endpoint, const char *master_id,
                     uint64_t term);

typedef struct _leader_watch_t leader_watch_t;

//  Starts the watch of url (etcd://HOST:PORT[,...]/CLUSTER) into leader, which must outlive
//  it. Returns NULL with why in error when url is not an etcd address.
//  Caller owns return value and must destroy it.
leader_watch_t *leader_watch_new (const char *url, kvp_leader_t *leader, char *error,
                                  size_t error_size);

//  Stops the watch (at once: its wait is ended) and frees it. Sets *self_p to NULL.
void leader_watch_destroy (leader_watch_t **self_p);

void leader_test (bool verbose);

#endif
