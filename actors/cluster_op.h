/*  cluster_op.h - the cluster actor's own types, shared by its files (not a public header).

    The cluster actor (cluster.h) is one thread whose code lies in four files, one a concern:
    cluster.c      the actor: its sockets, peers (other nodes' data planes), calls to the
                   master and to peers, runs on the data plane, dispatch, expiry
    cluster_put.c  PLACE, COMMIT, ABORT: a put's placement, copies and commit
    cluster_get.c  LOCATE, FETCH, EXIST, NODES: finding keys and reading them from nodes
    cluster_remove.c  REMOVE, REMOVE_REGEX, REMOVE_ALL, RESET: the master, then the holders
    Everything here is touched by the actor's thread only, except a run's transfers, which
    the data plane's workers fill until its done callback (cluster.c, s_run_done).
*/
#ifndef CLUSTER_OP_H_INCLUDED
#define CLUSTER_OP_H_INCLUDED

#include "actors/cluster.h"
#include "actors/master_client.h"
#include "dataplane/data_plane.h"
#include "infra/actor_shell.h"
#include "dataplane/peer_link.h"
#include "dataplane/rpc_calls.h"
#include "kvpool_status.h"
#include "messages/kvp_job.h"
#include "protocol/cluster.pb-c.h"
#include "protocol/kvpool.pb-c.h"

#include <pthread.h>

#define MAX_PEERS 4096
//  Fetches striped across a node's connections: the most stripes one value is split into.
#define MAX_STRIPES 1024
//  A node whose call timed out is tried last for this long.
#define SUSPECT_MS 10000
#define TICK_MS 10
//  A tick this much later than due means this node did not run (stopped, starved of CPU):
//  the answers to its calls may be waiting to be read, and expiring the calls at once would
//  blame their nodes for its own stall (a write or drop not answered fences its node). The
//  answers get this long first.
#define STALL_GRACE_MS 100
//  A GET with redirect: values at least this large are read by the client from their node
//  (one hop); smaller ones are relayed here, where the extra round trip would cost more.
#define REDIRECT_MIN_BYTES (64 << 10)

typedef struct {
    char node_id[128];
    char host_id[64];
    char endpoint[300];
    char curve_key[41];        //  its CURVE public key, as the master said; "": ours
    char client_endpoint[300]; //  where its clients connect (a REDIRECT names it)
    peer_link_t **links;
    uint32_t count;
    uint32_t next;
    size_t calls_out;
    int64_t suspect_until;
    int64_t last_used;
    //  Raised each time the node fails to answer in time: locations learned before
    //  (cluster_locations.c) no longer send reads to it without asking the master.
    uint32_t epoch;
    //  Links in doubt (a call on them timed out), kept until retire_until: the calls still
    //  out on them may yet be answered (the node may have restarted, and libzmq connected
    //  them to its new life). New calls go on fresh links.
    peer_link_t **retired;
    uint32_t retired_count;
    int64_t retire_until;
    uint32_t links_made; //  times links were made: which ones a call went on
} peer_t;

typedef struct _op_t op_t;

typedef enum {
    CALL_MASTER,
    CALL_PEER,
} call_kind_t;

typedef struct {
    call_kind_t kind;
    op_t *op;
    int peer;      //  CALL_PEER: index into self->peers
    int what;      //  the master's Kind, or the client protocol's Op sent
    size_t *items; //  job item of each key sent, in order
    size_t count;
    uint32_t links; //  CALL_PEER: the peer's links it went on (peer_t.links_made)
} call_t;

//  A put's placement: what KVP_CL_PLACE decided, for KVP_CL_COMMIT (job->plan).
typedef struct {
    bool placed;
    bool local;
    uint8_t peer_count, done_count, old_count;
    int peers[KVP_MAX_REPLICAS]; //  other nodes to write (peer indices)
    int done[KVP_MAX_REPLICAS];  //  of which acknowledged
    int old[KVP_MAX_REPLICAS];   //  an upsert: the nodes of the old value
    int status;                  //  the first failure a node reported
    uint64_t token;              //  the master's for this write (PLACE), back in the COMMIT
    //  A value in stripes, by index into peers: reserved there, a stripe failed there, an
    //  orphan in the way there (a whole write instead)
    uint8_t reserved, part_failed, rewrite;
} plan_item_t;

typedef struct {
    size_t count;
    plan_item_t items[];
} plan_t;

//  A get's candidates for one item.
typedef struct {
    uint8_t count, next;
    int peers[KVP_MAX_REPLICAS];
    bool any_failure; //  a node failed (rather than not having it)
    //  The holders came from this node's location cache (cluster_locations.c), not the
    //  master: they are asked for that version alone, and when none has it the item is
    //  located at the master after all (relocate).
    bool known, relocate;
    //  Located at the master a second time already: the version it named first was gone
    //  from every holder (an upsert or a remove and put came between). Once only.
    bool relocated;
    bool corrupt; //  a holder sent bytes that did not verify
} fetch_t;

//  Transfers of one operation on the data plane's workers (transfer/data_plane.h): a get's
//  reads or a put's copies. Its done callback, on a worker, queues it for the actor.
typedef struct _run_t {
    struct _self_t *self;
    op_t *op;
    data_plane_xfer_t *xfers;
    size_t *items; //  the job item of each transfer
    int *peers;    //  the node of each transfer
    size_t count, capacity;
    struct _run_t *next;
} run_t;

struct _op_t {
    kvp_job_t *job;
    zframe_t *routing_id;
    size_t calls_out;
    int phase;
    int step;       //  KVP_CL_COMMIT, phase 0: the step of the copies (s_commit_start)
    fetch_t *fetch; //  KVP_CL_FETCH: one a job item
    //  Removes and upserts: holders that were not told to drop the keys in time (peer
    //  indices), fenced at the master before the client hears (cluster_fence_later), and
    //  how long the answer then waits (zclock_mono ms: until their leases have ended).
    int fence[KVP_MAX_REPLICAS * 4];
    uint8_t fence_count, fence_sent;
    int64_t hold_until;
    uint64_t planned; //  the master's sequence in the last reply it had (FENCE sends it)
};

typedef struct _self_t {
    zsock_t *pipe;
    zsock_t *router; //  jobs
    master_client_t *master;
    actor_shell_t *shell; //  its loop (infra/actor_shell.h), which waits on the peers' links
    int64_t next_tick;    //  calls' deadlines and idle peers are looked at then (s_expire)
    bool stall_grace;     //  this node did not run for a while: expiry waits STALL_GRACE_MS
    const cluster_args_t *args;
    const kvp_config_t *config;
    peer_t *peers[MAX_PEERS];
    size_t peer_count;
    rpc_calls_t *peer_calls; //  call_t, to other nodes' data planes
    data_plane_t *plane;     //  values to and from other nodes, on its workers
    int wake_fd;             //  an eventfd: runs finished
    pthread_mutex_t lock;    //  guards finished
    run_t *finished;         //  runs the workers are done with
    uint64_t remote_gets, remote_get_bytes, redirects, remote_puts, failures;
    uint64_t remote_put_parts, remote_get_parts;
    uint64_t checksum_failures; //  values read from other nodes that did not match
    uint64_t location_hits;     //  remote gets that went to a holder known here (no LOCATE)
    zlistx_t *held;             //  op_t: answers waiting out fenced nodes' leases
    zhashx_t *locations;        //  key -> location_t: where keys read lately are (locations.c)
    bool terminated;
} self_t;

//  Key k's outcome in a reply, the master's or a node's (both carry a request status and one
//  status a key); missing when no reply came (the call timed out).
#define cluster_key_status(reply, k, missing)                                                      \
    (!(reply)                             ? (missing)                                              \
     : (reply)->status != KVPOOL_OK       ? (reply)->status                                        \
     : (size_t) (k) < (reply)->n_statuses ? (reply)->statuses[k]                                   \
                                          : KVPOOL_INTERNAL_ERROR)

//  ---- cluster.c: peers, calls, runs, dispatch -----------------------------------------

//  The peers a holder list names.
uint8_t cluster_holders (self_t *self, const Kvpool__Cluster__V1__MasterReply *reply,
                         const Kvpool__Cluster__V1__Holders *holders, int *out);

//  Whether peer is this node's own data plane.
bool cluster_is_self (self_t *self, int peer);

//  Whether the master answered a job's call and accepted it; fails the job otherwise.
bool cluster_master_answered (self_t *self, kvp_job_t *job,
                              const Kvpool__Cluster__V1__MasterReply *reply);

//  Sends a request to the master. With an op, the call is tracked and the op waits for it;
//  without, nobody waits (ABORT, DROPPED). Returns 0, or -1 when the master is unreachable.
//  items (count job item indices, malloc'd, or NULL) are taken whatever happens: kept with
//  the call, or freed at once (on failure too: copy what the caller still needs first).
int cluster_master_send (self_t *self, op_t *op, Kvpool__Cluster__V1__NodeRequest *request,
                         size_t *items, size_t count);

//  The peer for a node the master named (connected on first sight, reconnected when its
//  endpoint changed). -1 when the table is full or the node has no data plane.
int cluster_peer (self_t *self, const char *node_id, const char *host_id, const char *endpoint,
                  const char *curve_key);

//  Sends a client-protocol request without values (a remove) to a node's data plane. With
//  an op, tracked as send_master's (and takes items as it does). Returns 0 or -1.
int cluster_peer_send (self_t *self, op_t *op, int peer_index, Kvpool__V1__Request *request,
                       size_t *items, size_t count);

//  A new transfer in run, of job item item to or from peer (zeroed: the caller fills it).
data_plane_xfer_t *cluster_run_add (run_t *run, size_t item, int peer);

//  An empty run of op's transfers (cluster_run_start hands it to the workers).
run_t *cluster_run_new (self_t *self, op_t *op);

//  Hands a run to the workers, or frees it when it has nothing to move. The operation waits
//  for it as for a call.
void cluster_run_start (self_t *self, run_t *run, const data_plane_put_t *put);

//  This node's own data plane as a peer (removes reach what it holds there too).
int cluster_self_peer (self_t *self);

//  A holder did not confirm that it dropped op's keys (its call timed out): it is fenced at
//  the master once op's calls are done (FENCE), and op's answer waits until its lease has
//  surely ended, so that no node serves the old value once the client hears.
void cluster_fence_later (self_t *self, op_t *op, int peer);

//  ---- cluster_put.c: puts -------------------------------------------------------------

//  Drops the master's reservations of job's keys, nobody waiting: those placed that failed,
//  or (all) every key.
void cluster_abort_keys (self_t *self, kvp_job_t *job, bool all);

//  Items the master found no room for get their status (KVP_ITEM_CLUSTER_FULL): at the end
//  of the job, once no stage of this node can mistake them for a local lack of room.
void cluster_full_answer (kvp_job_t *job);

//  A step of the copies ended: what was written is recorded, and the next step starts.
void cluster_commit_copies_done (self_t *self, op_t *op, run_t *run);

//  Phase 1: the keys with at least one copy are committed at the master, the rest aborted.
void cluster_commit_master (self_t *self, op_t *op);

//  An upsert's old holder answered the drop of its copy (reply NULL: it did not in time).
void cluster_drop_reply (self_t *self, op_t *op, call_t *call, Kvpool__V1__Reply *reply);

//  The master committed (or refused) the keys; copies of refused ones are dropped again.
void cluster_commit_reply (self_t *self, op_t *op, call_t *call,
                           Kvpool__Cluster__V1__MasterReply *reply);

//  Phase 0 of a commit: the copies on other nodes, on the data plane's workers, all nodes and
//  all items at once. A value of up to a stripe is one write (an upsert; data_plane.c). A
//  larger one moves in stripes: reserved at the node (step 0), its stripes written in
//  parallel over the workers' connections (step 1), then committed there, or revoked if a
//  stripe failed (step 2). Each step is a run; the next starts when it ends.
void cluster_commit_start (self_t *self, op_t *op);

//  The master placed the keys: each item's nodes (job->plan), for the COMMIT.
void cluster_place_reply (self_t *self, op_t *op, call_t *call,
                          Kvpool__Cluster__V1__MasterReply *reply);

//  PLACE: asks the master to reserve the job's keys and choose their nodes.
void cluster_place_start (self_t *self, op_t *op);

//  ---- cluster_locations.c: where keys read lately are ----------------------------------

//  The location cache: made and freed with the actor.
void cluster_locations_new (self_t *self);
void cluster_locations_destroy (self_t *self);
//  A LOCATE answered a key's version and holders (peer indices): kept.
void cluster_locations_learn (self_t *self, const char *key, uint64_t version, uint64_t size,
                              const int *peers, uint8_t count);
//  Fills fetch, item size and version from the cache. Returns false when key is unknown.
bool cluster_locations_find (self_t *self, const char *key, fetch_t *fetch, kvp_item_t *item);
//  key (NULL: every key) is to be located at the master next time.
void cluster_locations_forget (self_t *self, const char *key);

//  ---- cluster_drain.c: DRAIN of a node (master/repair.c) --------------------------------

void cluster_drain_start (self_t *self, op_t *op);
void cluster_drain_reply (self_t *self, op_t *op, Kvpool__Cluster__V1__MasterReply *reply);

//  ---- cluster_get.c: gets, lookups ----------------------------------------------------

//  KVP_CL_CACHE_CLAIM: the master takes this node as a cache holder of the items' versions.
void cluster_cache_claim (self_t *self, op_t *op);
void cluster_cache_claimed (self_t *self, op_t *op, call_t *call,
                            Kvpool__Cluster__V1__MasterReply *reply);

//  EXIST: the master's status and size for each key.
void cluster_exist_reply (self_t *self, op_t *op, call_t *call,
                          Kvpool__Cluster__V1__MasterReply *reply);

//  A get's reads ended: items read whole or in every stripe are done; the others are read
//  again from their next candidate, in a run of their own.
void cluster_fetch_done (self_t *self, op_t *op, run_t *run);

//  The master said where the keys are: each is read from a holder (or redirected).
void cluster_fetch_located (self_t *self, op_t *op, call_t *call,
                            Kvpool__Cluster__V1__MasterReply *reply);

//  LOCATE at the master: every key (missing_only: the ones this node did not find).
void cluster_locate_start (self_t *self, op_t *op, bool missing_only);

//  LOCATE and NODES: the master's nodes as the client protocol names them.
void cluster_nodes_reply (self_t *self, op_t *op, call_t *call,
                          Kvpool__Cluster__V1__MasterReply *reply);

//  ---- cluster_remove.c: removes -------------------------------------------------------

//  The master forgot the keys: the nodes that held them drop them before the client hears.
void cluster_remove_reply (self_t *self, op_t *op, call_t *call,
                           Kvpool__Cluster__V1__MasterReply *reply);

//  REMOVE, REMOVE_REGEX or REMOVE_ALL at the master.
void cluster_remove_start (self_t *self, op_t *op);

#endif
