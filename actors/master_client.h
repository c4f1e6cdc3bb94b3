/*  master_client.h - a node's conversation with its master (protocol/cluster.proto).

    Every request a node sends its master, and every reply it takes, goes through a
    master_client_t: the membership actor's (REGISTER, HEARTBEAT, INVENTORY: membership.h)
    and the cluster actor's (PLACE, COMMIT, ABORT, LOCATE, REMOVE*, DROPPED, NODES:
    cluster.h) each own one, on their own thread and their own connection. It owns:

    - which master: master_client_endpoint. The one --master names, or, with standby masters
      (--master etcd://HOST:PORT/CLUSTER), the leader the node's view names
      (config->leader, infra/leader.h): before each send the client looks, and on a change
      makes a new socket to the new leader, in the old one's place in its owner's loop (a
      message sent just after a disconnect may still leave on the old connection). Every
      request carries the highest term known; a reply of an older term is dropped (its
      master was deposed). This is also the seam for several masters by key hash (a
      request's keys pick the master; the client keeps one connection each and splits a
      request by master). Its users never name a master themselves.
    - the connection: a DEALER with ZMQ_IMMEDIATE (while the master is away a request fails
      at once, with a clear reason, instead of queueing for its return), reconnecting every
      100 ms with no back-off, heartbeats (a master gone without a FIN is found out), and the
      cluster's CURVE (infra/curve.h kvp_curve_cluster_client, the master's server key).
    - the sender's identity on every request: the node (cluster_args_t), its free space as
      membership last said it, the protocol version, and the fencing pair: the epoch and the
      registration number the master gave at REGISTER (master/master.c s_proven: a change
      from a node the master declared dead, or that registered again since, is refused). The
      registration is one for the node, shared by its clients (cluster_registration_t):
      membership registers, and every client sends it from then on. The master reads it on
      every kind but REGISTER, LOCATE and NODES; it is sent on all, as before.
    - request ids, and for each call a deadline (the client's timeout): a reply is matched to
      its call by id (dataplane/rpc_calls.h); a call past its deadline is handed back once as
      timed out, and a reply to it that comes later, or a reply to any request nobody waits
      for, is handed back with no call.
    - what a reply says of the registration (master_client_stale): the master does not know
      this node as registered (it restarted, or declared the node dead): the node registers
      again, which membership does.
    - the words that name the master in an error (master_client_name): "the master (EP)".

    Retries: a REGISTER goes again each heartbeat until one is answered (membership's beat,
    not the client's); other requests are not retried: a cluster operation fails, with a
    reason, and its client decides.

    libkvpool (client/) does not talk to the master: a client reads what the master knows
    through its node (LOCATE, NODES on the client protocol). So this client is the node's.

    Threads: one a client (its owner's). The registration is shared through atomics.
*/
#ifndef MASTER_CLIENT_H_INCLUDED
#define MASTER_CLIENT_H_INCLUDED

#include <czmq.h>

#include "actors/cluster.h"
#include "infra/actor_shell.h"
#include "protocol/cluster.pb-c.h"

typedef struct _master_client_t master_client_t;

//  A client of args's master, connected at once. timeout_ms: how long a call waits for its
//  reply. args must outlive the client. Caller owns the return value and must destroy it.
master_client_t *master_client_new (const cluster_args_t *args, int timeout_ms);

//  Does nothing on NULL; sets *self_p to NULL. Calls still out are not ended: take them
//  first (master_client_cancel).
void master_client_destroy (master_client_t **self_p);

//  The master this node's requests go to (today: --master).
const char *master_client_endpoint (master_client_t *self);

//  "the master (EP)": how an error names the master.
const char *master_client_name (master_client_t *self);

//  Adds the client's sockets to poller; master_client_owns says whether one that poller
//  returned is the client's.
void master_client_poll_on (master_client_t *self, zpoller_t *poller);
bool master_client_owns (master_client_t *self, void *which);
//  Has the owner's shell wait on the client's sockets: reader is called with each one that
//  has a reply waiting (for master_client_recv).
void master_client_wait_on (master_client_t *self, actor_shell_t *shell,
                            actor_shell_reader_fn *reader);

//  Free space to describe the node with from now on (membership's, from the allocator).
void master_client_set_space (master_client_t *self, uint64_t capacity, uint64_t free);

//  Sends request: its version, id, node and fencing pair are filled here. With a handle,
//  a call: the handle comes back with its reply (master_client_recv) or, past the
//  timeout, as expired (master_client_expired). Without, nobody waits. Returns the
//  request's id (also in request->request_id, set either way), or 0 when it did not go: the
//  master is unreachable (counted, master_client_failures).
uint64_t master_client_send (master_client_t *self, Kvpool__Cluster__V1__NodeRequest *request,
                             void *handle);

//  Receives one reply from which (a socket the client owns): the reply (free it with
//  master_client_reply_free), and in *handle_p the call it answers, or NULL when no call
//  waits for it (a request nobody waits for, or a call that timed out). NULL when the
//  message is not a MasterReply (dropped).
Kvpool__Cluster__V1__MasterReply *master_client_recv (master_client_t *self, void *which,
                                                      void **handle_p);

void master_client_reply_free (Kvpool__Cluster__V1__MasterReply **reply_p);

//  A call whose timeout passed, taken (counted as a failure), or NULL: call until NULL.
void *master_client_expired (master_client_t *self);

//  Any call still out, taken, or NULL: for an owner that stops.
void *master_client_cancel (master_client_t *self);

//  The registration. master_client_registered: the master registered this node (REGISTER's
//  reply): every client of the node sends this pair from now on.
void master_client_registered (master_client_t *self, uint64_t epoch, uint64_t number);
uint64_t master_client_epoch (master_client_t *self);

//  Whether reply (to anything but a REGISTER) says the master does not know this node as
//  registered: refused, or from a master of another epoch. The node registers again.
bool master_client_stale (master_client_t *self, const Kvpool__Cluster__V1__MasterReply *reply);

//  Requests that did not go, and calls that timed out.
uint64_t master_client_failures (master_client_t *self);
//  A node's lease (infra/config.h) lasts this many heartbeat intervals from the sending of
//  a heartbeat its master answered: a heartbeat or two may be lost before its cache copies
//  stop being served.
#define KVP_LEASE_BEATS 3

//  Requests sent to the master.
uint64_t master_client_sent (master_client_t *self);

//  With standby masters (--master etcd://..., infra/leader.h): connects to the leader the
//  node's view names, if it changed since the last look; returns true when it did. (Every
//  send looks too; an owner that waits calls it to notice a new leader sooner.)
bool master_client_follow (master_client_t *self);

//  The highest leader term the node knows (0: one master, no terms), sent with every
//  request; replies of an older term are dropped, and counted here.
uint64_t master_client_term (master_client_t *self);
uint64_t master_client_stale_replies (master_client_t *self);

//  Self test: a fake master on inproc answers, stays silent, answers late, or says the
//  registration is stale.
void master_client_test (bool verbose);

#endif
