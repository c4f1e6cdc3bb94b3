/*  cluster.c - the cluster actor (cluster.h).

    DESIGN
    A job's cluster stage becomes an operation (op_t) made of calls: requests to the master
    (through this actor's master client, master_client.h: the connection, ids, deadlines,
    fencing, and the words that name the master in an error; while the master is away a
    call fails at once with a clear reason instead of queueing) and to other nodes' data
    planes (peer_t: a few links each, dataplane/peer_link.h, used in turn, their calls in an
    rpc_calls table, dataplane/rpc_calls.h). Every call has an id, echoed by the reply, and
    a deadline (--cluster-timeout); a call that times out counts as failed, and its late
    reply, if one comes, matches nothing and is dropped. When an operation has no call left
    out, its job goes back to the api.

    Puts: PLACE (the master reserves each key and chooses its nodes); the api writes the
    replica held here, if any; COMMIT writes the other replicas, all nodes in parallel, one
    request per node, then commits at the master with the nodes that acknowledged. A key no
    node could take is aborted at the master; a commit the master refuses removes the copies
    that were written. So a key is visible through the master only once every byte of it is
    on the nodes the master names.

    Gets: what this node does not hold is located at the master and read from a node that
    holds it, one on this node's host first, else the one with fewest calls out (nodes that
    timed out lately last). A value larger than --stripe-size comes as ranged reads over the
    node's connections in parallel, into one buffer; a smaller one is the received frame
    itself, sent on to the client without a copy. A node that fails or does not have the key
    is passed over for the next one; only when none is left is the key missing or failed.

    Checksums (transfer/value_checksum.h): a put's values go to other nodes with their
    checksum (the one taken as the replica here was written, or the client's, or one the
    data plane takes as it copies), and those nodes refuse bytes that do not match. A get
    verifies what it read before it is handed on: a whole value on the data plane's worker
    that received it, a striped one here once assembled; a mismatch is counted
    (checksum_failures) and the next holder read, as for a node that failed.

    Removes go to the master, which forgets the keys and says which nodes held them; those
    nodes are told to drop them (forced) before the client is answered.

    Threads: one. Memory: a fetched value is owned by its job item (item->buffer) until it is
    sent; a put's values are copied into the requests to other nodes (the client's frames
    belong to the api's request and may go before libzmq has sent a copy that timed out).
*/
#include "actors/cluster.h"

#include "actors/master_client.h"
#include "dataplane/peer_link.h"
#include "dataplane/rpc_calls.h"
#include "kvpool_status.h"
#include "messages/arena.h"
#include "messages/kvp_job.h"
#include "protocol/cluster.pb-c.h"
#include "protocol/contract.h"
#include "protocol/kvpool.pb-c.h"
#include "protocol/status.h"
#include "dataplane/data_plane.h"
#include "transfer/value_checksum.h"
#include "infra/curve.h"
#include "infra/log.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MAX_PEERS 4096
//  Fetches striped across a node's connections: the most stripes one value is split into.
#define MAX_STRIPES 1024
//  A node whose call timed out is tried last for this long.
#define SUSPECT_MS 10000
#define TICK_MS 10
//  A GET with redirect: values at least this large are read by the client from their node
//  (one hop); smaller ones are relayed here, where the extra round trip would cost more.
#define REDIRECT_MIN_BYTES (64 << 10)

typedef struct {
    char node_id[128];
    char host_id[64];
    char endpoint[300];
    char curve_key[41]; //  its CURVE public key, as the master said; "": ours
    peer_link_t **links;
    uint32_t count;
    uint32_t next;
    size_t calls_out;
    int64_t suspect_until;
    int64_t last_used;
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
};

typedef struct _self_t {
    zsock_t *pipe;
    zsock_t *router; //  jobs
    master_client_t *master;
    zpoller_t *poller;
    const cluster_args_t *args;
    const kvp_config_t *config;
    peer_t *peers[MAX_PEERS];
    size_t peer_count;
    rpc_calls_t *peer_calls; //  call_t, to other nodes' data planes
    data_plane_t *plane;  //  values to and from other nodes, on its workers
    int wake_fd;          //  an eventfd: runs finished
    pthread_mutex_t lock; //  guards finished
    run_t *finished;      //  runs the workers are done with
    uint64_t remote_gets, remote_get_bytes, redirects, remote_puts, failures;
    uint64_t remote_put_parts, remote_get_parts;
    uint64_t checksum_failures; //  values read from other nodes that did not match
    bool terminated;
} self_t;

//  ---- peers -------------------------------------------------------------------------

static void
s_peer_disconnect (self_t *self, peer_t *peer)
{
    for (uint32_t i = 0; i < peer->count; i++) {
        zpoller_remove (self->poller, peer_link_sock (peer->links[i]));
        peer_link_destroy (&peer->links[i]);
    }
    free (peer->links);
    peer->links = NULL;
    peer->count = 0;
}

static void
s_peer_connect (self_t *self, peer_t *peer)
{
    //  Heartbeats: a connection that died without a FIN is found out, and made again.
    uint32_t want = self->config->peer_connections;
    peer->links = (peer_link_t **) calloc (want, sizeof (peer_link_t *));
    assert (peer->links);
    peer->count = 0;
    for (uint32_t i = 0; i < want; i++) {
        peer_link_t *link =
            peer_link_new (peer->endpoint, peer->curve_key, self->config->curve, true);
        if (!link)
            break; //  not an endpoint libzmq connects to: calls to it fail
        zpoller_add (self->poller, peer_link_sock (link));
        peer->links[peer->count++] = link;
    }
}

//  The peer for a node the master named (connected on first sight, reconnected when its
//  endpoint changed). -1 when the table is full or the node has no data plane.
static int
s_peer (self_t *self, const char *node_id, const char *host_id, const char *endpoint,
        const char *curve_key)
{
    if (!node_id || !endpoint || !*endpoint)
        return -1;
    if (!curve_key)
        curve_key = "";
    for (size_t i = 0; i < self->peer_count; i++) {
        peer_t *peer = self->peers[i];
        if (strcmp (peer->node_id, node_id) != 0)
            continue;
        if (strcmp (peer->endpoint, endpoint) != 0 || strcmp (peer->curve_key, curve_key) != 0) {
            s_peer_disconnect (self, peer);
            snprintf (peer->endpoint, sizeof peer->endpoint, "%s", endpoint);
            snprintf (peer->curve_key, sizeof peer->curve_key, "%s", curve_key);
            s_peer_connect (self, peer);
        }
        if (host_id)
            snprintf (peer->host_id, sizeof peer->host_id, "%s", host_id);
        return (int) i;
    }
    if (self->peer_count == MAX_PEERS)
        return -1;
    peer_t *peer = (peer_t *) calloc (1, sizeof (peer_t));
    assert (peer);
    snprintf (peer->node_id, sizeof peer->node_id, "%s", node_id);
    snprintf (peer->host_id, sizeof peer->host_id, "%s", host_id ? host_id : "");
    snprintf (peer->endpoint, sizeof peer->endpoint, "%s", endpoint);
    snprintf (peer->curve_key, sizeof peer->curve_key, "%s", curve_key);
    peer->last_used = zclock_mono ();
    s_peer_connect (self, peer);
    self->peers[self->peer_count] = peer;
    return (int) self->peer_count++;
}

static bool
s_is_self (self_t *self, int peer)
{
    return peer >= 0 && strcmp (self->peers[peer]->node_id, self->args->node_id) == 0;
}

//  ---- calls -------------------------------------------------------------------------

static call_t *
s_call_new (op_t *op, call_kind_t kind, int what, int peer)
{
    call_t *call = (call_t *) zmalloc (sizeof (call_t));
    call->kind = kind;
    call->op = op;
    call->what = what;
    call->peer = peer;
    return call;
}

static void
s_call_destroy (call_t **call_p)
{
    call_t *call = *call_p;
    if (call) {
        free (call->items);
        free (call);
        *call_p = NULL;
    }
}

//  Sends a request to the master. With an op, the call is tracked and the op waits for it;
//  without, nobody waits (ABORT, DROPPED). Returns 0, or -1 when the master is unreachable.
static int
s_master_send (self_t *self, op_t *op, Kvpool__Cluster__V1__NodeRequest *request, size_t *items,
               size_t count)
{
    call_t *call = op ? s_call_new (op, CALL_MASTER, request->kind, -1) : NULL;
    if (master_client_send (self->master, request, call) == 0) {
        s_call_destroy (&call);
        free (items);
        return -1;
    }
    if (call) {
        call->items = items;
        call->count = count;
        op->calls_out++;
    }
    else
        free (items);
    return 0;
}

//  Sends a client-protocol request without values (a remove) to a node's data plane. With
//  an op, tracked as send_master's. Returns 0 or -1.
static int
s_peer_send (self_t *self, op_t *op, int peer_index, Kvpool__V1__Request *request, size_t *items,
             size_t count)
{
    peer_t *peer = self->peers[peer_index];
    call_t *call = op ? s_call_new (op, CALL_PEER, request->op, peer_index) : NULL;
    request->no_reply = call == NULL;
    if (peer->count == 0)
        s_peer_connect (self, peer); //  disconnected after a timeout, or idle
    peer->last_used = zclock_mono ();
    uint64_t id =
        call ? rpc_calls_add (self->peer_calls, call,
                              zclock_mono () + (int64_t) self->config->cluster_timeout_ms)
             : rpc_calls_next_id (self->peer_calls);
    if (peer->count == 0
        || peer_link_send (peer->links[peer->next++ % peer->count], request, id, NULL, 0) != 0) {
        if (call)
            rpc_calls_take (self->peer_calls, id);
        s_call_destroy (&call);
        free (items);
        return -1;
    }
    if (call) {
        call->items = items;
        call->count = count;
        op->calls_out++;
        peer->calls_out++;
    }
    else
        free (items);
    return 0;
}

//  Key k's outcome in a reply, the master's or a node's (both carry a request status and one
//  status a key); missing when no reply came (the call timed out).
#define s_key_status(reply, k, missing)                                                            \
    (!(reply)                             ? (missing)                                              \
     : (reply)->status != KVPOOL_OK       ? (reply)->status                                        \
     : (size_t) (k) < (reply)->n_statuses ? (reply)->statuses[k]                                   \
                                          : KVPOOL_INTERNAL_ERROR)

//  Whether the master answered a job's call and accepted it; fails the job otherwise.
static bool
s_master_answered (self_t *self, kvp_job_t *job, const Kvpool__Cluster__V1__MasterReply *reply)
{
    if (!reply)
        kvp_job_fail (job, KVPOOL_RPC_FAIL, "%s did not answer", master_client_name (self->master));
    else if (reply->status != KVPOOL_OK)
        kvp_job_fail (job, reply->status, "master: %s", reply->error ? reply->error : "refused");
    return reply && reply->status == KVPOOL_OK;
}

static void
s_op_done (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    if (kvp_job_reply (self->router, &op->routing_id, job) != 0) {
        zframe_destroy (&op->routing_id);
        kvp_job_destroy (&job);
    }
    free (op->fetch);
    free (op);
}

//  ---- runs on the data plane ---------------------------------------------------------

static run_t *
s_run_new (self_t *self, op_t *op)
{
    run_t *run = (run_t *) zmalloc (sizeof (run_t));
    run->self = self;
    run->op = op;
    return run;
}

static data_plane_xfer_t *
s_run_add (run_t *run, size_t item, int peer)
{
    if (run->count == run->capacity) {
        run->capacity = run->capacity ? run->capacity * 2 : 16;
        run->xfers =
            (data_plane_xfer_t *) realloc (run->xfers, run->capacity * sizeof (data_plane_xfer_t));
        run->items = (size_t *) realloc (run->items, run->capacity * sizeof (size_t));
        run->peers = (int *) realloc (run->peers, run->capacity * sizeof (int));
        assert (run->xfers && run->items && run->peers);
    }
    data_plane_xfer_t *xfer = &run->xfers[run->count];
    memset (xfer, 0, sizeof *xfer);
    run->items[run->count] = item;
    run->peers[run->count++] = peer;
    return xfer;
}

static void
s_run_destroy (run_t **run_p)
{
    run_t *run = *run_p;
    if (!run)
        return;
    for (size_t x = 0; x < run->count; x++)
        zmq_msg_close (&run->xfers[x].frame); //  (a frame taken by an item is empty now)
    free (run->xfers);
    free (run->items);
    free (run->peers);
    free (run);
    *run_p = NULL;
}

//  On a worker: the run is over; the actor takes it from here.
static void
s_run_done (data_plane_xfer_t *xfers, size_t count, void *arg)
{
    run_t *run = (run_t *) arg;
    self_t *self = run->self;
    pthread_mutex_lock (&self->lock);
    run->next = self->finished;
    self->finished = run;
    pthread_mutex_unlock (&self->lock);
    uint64_t one = 1;
    ssize_t rc = write (self->wake_fd, &one, sizeof one);
    (void) rc;
    (void) xfers;
    (void) count;
}

//  Hands a run to the workers, or frees it when it has nothing to move. The operation waits
//  for it as for a call.
static void
s_run_start (self_t *self, run_t *run, const data_plane_put_t *put)
{
    if (run->count == 0 || !self->plane) {
        if (run->count) //  the node is stopping (s_self_destroy)
            kvp_job_fail (run->op->job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                          "the node is stopping");
        s_run_destroy (&run);
        return;
    }
    run->op->calls_out++;
    for (size_t x = 0; x < run->count; x++) {
        peer_t *peer = self->peers[run->peers[x]];
        run->xfers[x].endpoint = peer->endpoint;
        run->xfers[x].curve_key = peer->curve_key;
        peer->calls_out++;
        peer->last_used = zclock_mono ();
    }
    data_plane_run (self->plane, run->xfers, run->count, put, self->config->stripe_size, s_run_done,
                    run);
}

//  ---- puts --------------------------------------------------------------------------

static void
s_plan_free (void *plan)
{
    free (plan);
}

static plan_t *
s_plan (kvp_job_t *job)
{
    if (!job->plan) {
        plan_t *plan = (plan_t *) zmalloc (sizeof (plan_t) + job->count * sizeof (plan_item_t));
        plan->count = job->count;
        job->plan = plan;
        job->plan_free = s_plan_free;
    }
    return (plan_t *) job->plan;
}

static void
s_place_start (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    size_t n = 0;
    for (size_t i = 0; i < job->count; i++)
        n += job->items[i].status == KVPOOL_OK;
    size_t *items = (size_t *) malloc ((n ? n : 1) * sizeof (size_t));
    ProtobufCBinaryData *keys = (ProtobufCBinaryData *) malloc ((n ? n : 1) * sizeof *keys);
    uint64_t *sizes = (uint64_t *) malloc ((n ? n : 1) * sizeof (uint64_t));
    assert (items && keys && sizes);
    n = 0;
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVPOOL_OK) {
            items[n] = i;
            keys[n].data = (uint8_t *) job->items[i].key;
            keys[n].len = job->items[i].key_len;
            sizes[n++] = job->items[i].size;
        }
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = KVPOOL__CLUSTER__V1__KIND__PLACE;
    request.keys = keys;
    request.n_keys = n;
    request.sizes = sizes;
    request.n_sizes = n;
    request.upsert = job->op == KVPOOL__V1__OP__UPSERT;
    char *self_id = (char *) self->args->node_id;
    if (job->op == KVPOOL__V1__OP__PUT_START) {
        //  A same-machine client writes into this node's memory: held here.
        request.replica_num = 1;
        request.preferred = &self_id;
        request.n_preferred = 1;
    }
    else {
        request.replica_num = job->replica_num;
        request.preferred = job->preferred;
        request.n_preferred = job->preferred_count;
    }
    if (s_master_send (self, op, &request, items, n) != 0)
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "%s is unreachable",
                      master_client_name (self->master));
    free (keys);
    free (sizes);
}

//  The peers a holder list names.
static uint8_t
s_holders (self_t *self, const Kvpool__Cluster__V1__MasterReply *reply,
           const Kvpool__Cluster__V1__Holders *holders, int *out)
{
    uint8_t count = 0;
    for (size_t h = 0; holders && h < holders->n_nodes && count < KVP_MAX_REPLICAS; h++) {
        if (holders->nodes[h] >= reply->n_nodes)
            continue;
        const Kvpool__Cluster__V1__Node *node = reply->nodes[holders->nodes[h]];
        int peer =
            s_peer (self, node->node_id, node->host_id, node->peer_endpoint, node->curve_key);
        if (peer >= 0)
            out[count++] = peer;
    }
    return count;
}

static void
s_place_reply (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    plan_t *plan = s_plan (job);
    job->replica_num = 1; //  one replica a node: the one here, if any
    if (!reply) {
        //  The master did not answer in time (gone, or frozen): nothing is placed, and the
        //  job fails as a whole (s_call_done).
        for (size_t k = 0; k < call->count; k++)
            job->items[call->items[k]].status = KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS;
        return;
    }
    for (size_t k = 0; k < call->count; k++) {
        kvp_item_t *item = &job->items[call->items[k]];
        plan_item_t *placed = &plan->items[call->items[k]];
        if (reply->status != KVPOOL_OK) {
            //  Refused as a whole (this node is not registered as it was when it asked:
            //  fencing, master.c): nothing placed.
            item->status = reply->status;
            continue;
        }
        if (k >= reply->n_statuses || k >= reply->n_holders) {
            item->status = KVPOOL_INTERNAL_ERROR;
            continue;
        }
        if (reply->statuses[k] != KVPOOL_OK) {
            item->status = reply->statuses[k] == KVPOOL_NO_AVAILABLE_HANDLE ? KVP_ITEM_CLUSTER_FULL
                                                                            : reply->statuses[k];
            continue;
        }
        int holders[KVP_MAX_REPLICAS];
        uint8_t count = s_holders (self, reply, reply->holders[k], holders);
        placed->placed = true;
        placed->token = k < reply->n_tokens ? reply->tokens[k] : 0;
        item->cluster_token = placed->token; //  a PUT_START's, for its PUT_END
        for (uint8_t h = 0; h < count; h++) {
            if (s_is_self (self, holders[h]))
                placed->local = true;
            else
                placed->peers[placed->peer_count++] = holders[h];
        }
        if (k < reply->n_old_holders)
            placed->old_count = s_holders (self, reply, reply->old_holders[k], placed->old);
        if (job->op == KVPOOL__V1__OP__PUT_START && !placed->local) {
            item->status = KVPOOL_INTERNAL_ERROR;
            kvp_job_fail (job, KVPOOL_OK, "the master did not place the key on this node");
        }
        else if (!placed->local)
            item->status = KVP_ITEM_ELSEWHERE;
    }
}

//  Items the master found no room for get their status (KVP_ITEM_CLUSTER_FULL): at the end
//  of the job, once no stage of this node can mistake them for a local lack of room.
static void
s_cluster_full_answer (kvp_job_t *job)
{
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVP_ITEM_CLUSTER_FULL)
            job->items[i].status = KVPOOL_NO_AVAILABLE_HANDLE;
}

static void
s_abort_keys (self_t *self, kvp_job_t *job, bool all)
{
    plan_t *plan = (plan_t *) job->plan;
    size_t n = 0;
    ProtobufCBinaryData *keys =
        (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
    assert (keys);
    for (size_t i = 0; i < job->count; i++) {
        bool placed = plan && plan->items[i].placed;
        int status = job->items[i].status;
        if (all ? job->items[i].key_len > 0
                : (placed && status != KVPOOL_OK && status != KVP_ITEM_ELSEWHERE)) {
            keys[n].data = (uint8_t *) job->items[i].key;
            keys[n++].len = job->items[i].key_len;
        }
    }
    if (n) {
        Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        request.kind = KVPOOL__CLUSTER__V1__KIND__ABORT;
        request.keys = keys;
        request.n_keys = n;
        s_master_send (self, NULL, &request, NULL, 0);
    }
    free (keys);
}

//  Tells nodes to drop keys (forced), nobody waiting: a commit that failed after the bytes
//  were written, an upsert's old copies.
static void
s_drop_at (self_t *self, int peer, const char *key, size_t key_len)
{
    ProtobufCBinaryData wire = {key_len, (uint8_t *) key};
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__REMOVE;
    request.keys = &wire;
    request.n_keys = 1;
    request.force = true;
    s_peer_send (self, NULL, peer, &request, NULL, 0);
}

static int
s_self_peer (self_t *self)
{
    return s_peer (self, self->args->node_id, self->args->host_id, self->args->peer_endpoint,
                   kvp_curve_public_key (self->config->curve));
}

//  The checksum a put's value goes to other nodes with: the one this node's copy worker took
//  as it wrote the replica held here, else the one the client sent (a replica only
//  elsewhere); 0 has the data plane take it as it copies the value into its request.
static uint64_t
s_put_checksum (const kvp_item_t *item)
{
    return item->checksum ? item->checksum : item->expect_checksum;
}

//  The same for a value in stripes, which the node verifies over its reservation at PUT_END:
//  no copy here saw the value whole (each stripe is copied by the worker that sends it), so
//  an unknown one is taken here, on this thread: only for values over --stripe-size that
//  are not also held here.
static uint64_t
s_striped_checksum (kvp_item_t *item)
{
    if (!item->checksum && !item->expect_checksum && item->src && value_checksum_verify ())
        item->checksum = value_checksum (item->src, item->size);
    return s_put_checksum (item);
}

//  Phase 0 of a commit: the copies on other nodes, on the data plane's workers, all nodes and
//  all items at once. A value of up to a stripe is one write (an upsert; data_plane.c). A
//  larger one moves in stripes: reserved at the node (step 0), its stripes written in
//  parallel over the workers' connections (step 1), then committed there, or revoked if a
//  stripe failed (step 2). Each step is a run; the next starts when it ends.
static void
s_commit_start (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    plan_t *plan = (plan_t *) job->plan;
    op->phase = 0;
    op->step = 0;
    if (!plan)
        return;
    run_t *run = s_run_new (self, op);
    for (size_t i = 0; i < job->count; i++) {
        plan_item_t *placed = &plan->items[i];
        kvp_item_t *item = &job->items[i];
        if (!placed->placed || (item->status != KVPOOL_OK && item->status != KVP_ITEM_ELSEWHERE))
            continue;
        for (uint8_t h = 0; h < placed->peer_count; h++) {
            data_plane_xfer_t *xfer = s_run_add (run, i, placed->peers[h]);
            //  An upsert even for a put: the master reserved the key for this put, so a copy
            //  the node already has can only be an orphan (a commit that failed, whose
            //  removal did not reach it), and it may hold other bytes: it is replaced, never
            //  taken for the value. (A reservation finds such an orphan in the way: that
            //  node gets a whole write instead.)
            xfer->kind =
                item->size > self->config->stripe_size ? DATA_PLANE_RESERVE : DATA_PLANE_WRITE;
            xfer->key = item->key;
            xfer->key_len = item->key_len;
            xfer->src = item->src;
            xfer->size = item->size;
            xfer->checksum = s_put_checksum (item);
        }
    }
    data_plane_put_t put = {job->soft_pin, job->soft_pin_ttl_ms, job->hard_pin};
    s_run_start (self, run, &put);
}

//  Which of an item's other nodes a peer is.
static int
s_placed_index (const plan_item_t *placed, int peer)
{
    for (uint8_t h = 0; h < placed->peer_count; h++)
        if (placed->peers[h] == peer)
            return h;
    return -1;
}

//  The stripes of item i to node h of its placement.
static void
s_commit_parts (self_t *self, run_t *run, size_t i, int peer)
{
    kvp_item_t *item = &run->op->job->items[i];
    uint64_t stripe = self->config->stripe_size;
    if ((item->size + stripe - 1) / stripe > MAX_STRIPES)
        stripe = (item->size + MAX_STRIPES - 1) / MAX_STRIPES;
    for (uint64_t offset = 0; offset < item->size; offset += stripe) {
        data_plane_xfer_t *xfer = s_run_add (run, i, peer);
        xfer->kind = DATA_PLANE_PART;
        xfer->key = item->key;
        xfer->key_len = item->key_len;
        xfer->offset = offset;
        xfer->src = (const char *) item->src + offset;
        xfer->size = item->size - offset < stripe ? item->size - offset : stripe;
    }
}

//  A step of the copies ended: what was written is recorded, and the next step starts.
static void
s_commit_copies_done (self_t *self, op_t *op, run_t *run)
{
    kvp_job_t *job = op->job;
    plan_t *plan = (plan_t *) job->plan;
    for (size_t x = 0; x < run->count; x++) {
        plan_item_t *placed = &plan->items[run->items[x]];
        data_plane_xfer_t *xfer = &run->xfers[x];
        int h = s_placed_index (placed, run->peers[x]);
        assert (h >= 0);
        bool written = xfer->status == KVPOOL_OK
                       && (xfer->kind == DATA_PLANE_WRITE || xfer->kind == DATA_PLANE_END);
        if (written) {
            placed->done[placed->done_count++] = run->peers[x];
            self->remote_puts++;
        }
        else if (xfer->kind == DATA_PLANE_RESERVE && xfer->status == KVPOOL_OK)
            placed->reserved |= 1u << h;
        else if (xfer->kind == DATA_PLANE_PART && xfer->status == KVPOOL_OK)
            self->remote_put_parts++;
        else if (xfer->kind == DATA_PLANE_RESERVE && xfer->status == KVPOOL_OBJECT_ALREADY_EXISTS)
            placed->rewrite |= 1u << h;
        else if (xfer->status != KVPOOL_OK) {
            if (xfer->kind == DATA_PLANE_PART)
                placed->part_failed |= 1u << h;
            if (!placed->status && xfer->kind != DATA_PLANE_REVOKE)
                placed->status = xfer->status;
        }
        if (!xfer->answered)
            self->failures++;
    }
    if (op->step == 2)
        return;
    op->step++;
    run_t *next = s_run_new (self, op);
    for (size_t i = 0; i < job->count; i++) {
        plan_item_t *placed = &plan->items[i];
        kvp_item_t *item = &job->items[i];
        for (uint8_t h = 0; h < placed->peer_count; h++) {
            int peer = placed->peers[h];
            if (op->step == 1 && (placed->reserved & (1u << h)))
                s_commit_parts (self, next, i, peer);
            else if (op->step == 1 && (placed->rewrite & (1u << h))) {
                data_plane_xfer_t *xfer = s_run_add (next, i, peer);
                xfer->kind = DATA_PLANE_WRITE;
                xfer->key = item->key;
                xfer->key_len = item->key_len;
                xfer->src = item->src;
                xfer->size = item->size;
                xfer->checksum = s_put_checksum (item);
            }
            else if (op->step == 2 && (placed->reserved & (1u << h))) {
                data_plane_xfer_t *xfer = s_run_add (next, i, peer);
                xfer->kind = (placed->part_failed & (1u << h)) ? DATA_PLANE_REVOKE : DATA_PLANE_END;
                xfer->key = item->key;
                xfer->key_len = item->key_len;
                if (xfer->kind == DATA_PLANE_END)
                    xfer->checksum = s_striped_checksum (item);
            }
        }
    }
    data_plane_put_t put = {job->soft_pin, job->soft_pin_ttl_ms, job->hard_pin};
    s_run_start (self, next, &put);
}

//  Phase 1: the keys with at least one copy are committed at the master, the rest aborted.
static void
s_commit_master (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    plan_t *plan = (plan_t *) job->plan;
    op->phase = 1;
    s_cluster_full_answer (job);
    size_t n = 0;
    size_t *items = (size_t *) malloc ((job->count ? job->count : 1) * sizeof (size_t));
    ProtobufCBinaryData *keys =
        (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
    Kvpool__Cluster__V1__Holders *holders =
        (Kvpool__Cluster__V1__Holders *) malloc ((job->count ? job->count : 1) * sizeof *holders);
    Kvpool__Cluster__V1__Holders **holder_ptrs =
        (Kvpool__Cluster__V1__Holders **) malloc ((job->count ? job->count : 1) * sizeof (void *));
    uint32_t *indices =
        (uint32_t *) malloc ((job->count ? job->count : 1) * KVP_MAX_REPLICAS * sizeof (uint32_t));
    uint64_t *tokens = (uint64_t *) malloc ((job->count ? job->count : 1) * sizeof (uint64_t));
    char **node_ids = (char **) malloc ((self->peer_count + 1) * sizeof (char *));
    int *node_index = (int *) malloc ((self->peer_count + 1) * sizeof (int));
    assert (items && keys && holders && holder_ptrs && indices && tokens && node_ids && node_index);
    for (size_t p = 0; p <= self->peer_count; p++)
        node_index[p] = -1;
    size_t node_count = 0;
    int self_peer = s_self_peer (self);
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        plan_item_t *placed = plan ? &plan->items[i] : NULL;
        if (placed && !placed->placed)
            continue;
        bool local =
            placed ? placed->local && item->status == KVPOOL_OK : item->status == KVPOOL_OK;
        if (!placed && !local)
            continue;
        int who[KVP_MAX_REPLICAS + 1];
        size_t count = 0;
        if (local && self_peer >= 0)
            who[count++] = self_peer;
        for (uint8_t d = 0; placed && d < placed->done_count; d++)
            who[count++] = placed->done[d];
        if (count == 0) {
            //  Nowhere: the item fails, its reservation is aborted below.
            if (item->status == KVP_ITEM_ELSEWHERE || item->status == KVPOOL_OK)
                item->status = placed && placed->status ? placed->status : KVPOOL_TRANSFER_FAIL;
            continue;
        }
        kvpool__cluster__v1__holders__init (&holders[n]);
        holders[n].nodes = &indices[n * KVP_MAX_REPLICAS];
        for (size_t w = 0; w < count && holders[n].n_nodes < KVP_MAX_REPLICAS; w++) {
            int peer = who[w];
            if (node_index[peer] < 0) {
                node_index[peer] = (int) node_count;
                node_ids[node_count++] = self->peers[peer]->node_id;
            }
            holders[n].nodes[holders[n].n_nodes++] = (uint32_t) node_index[peer];
        }
        holder_ptrs[n] = &holders[n];
        items[n] = i;
        tokens[n] = placed ? placed->token : item->cluster_token;
        keys[n].data = (uint8_t *) item->key;
        keys[n++].len = item->key_len;
    }
    s_abort_keys (self, job, false);
    if (n == 0)
        free (items);
    else {
        Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        request.kind = KVPOOL__CLUSTER__V1__KIND__COMMIT;
        request.keys = keys;
        request.n_keys = n;
        request.holders = holder_ptrs;
        request.n_holders = n;
        request.nodes = node_ids;
        request.n_nodes = node_count;
        //  The master commits only the write it placed last (a writer stalled past its
        //  reservation commits nothing).
        request.tokens = tokens;
        request.n_tokens = n;
        if (s_master_send (self, op, &request, items, n) != 0) {
            //  The bytes are written but the master can't make them visible: undone.
            op->phase = 2;
            for (size_t i = 0; i < job->count; i++) {
                kvp_item_t *item = &job->items[i];
                plan_item_t *placed = plan ? &plan->items[i] : NULL;
                if (item->status != KVPOOL_OK && item->status != KVP_ITEM_ELSEWHERE)
                    continue;
                item->status = KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS;
                if ((placed ? placed->local : true) && self_peer >= 0)
                    s_drop_at (self, self_peer, item->key, item->key_len);
                for (uint8_t d = 0; placed && d < placed->done_count; d++)
                    s_drop_at (self, placed->done[d], item->key, item->key_len);
            }
            kvp_job_fail (job, KVPOOL_OK, "%s is unreachable: nothing committed",
                          master_client_name (self->master));
        }
    }
    free (keys);
    free (tokens);
    free (holders);
    free (holder_ptrs);
    free (indices);
    free (node_ids);
    free (node_index);
}

static void
s_commit_reply (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    plan_t *plan = (plan_t *) job->plan;
    int self_peer = s_self_peer (self);
    for (size_t k = 0; k < call->count; k++) {
        size_t i = call->items[k];
        kvp_item_t *item = &job->items[i];
        plan_item_t *placed = plan ? &plan->items[i] : NULL;
        int status = s_key_status (reply, k, KVPOOL_RPC_FAIL);
        if (status == KVPOOL_OK) {
            item->status = KVPOOL_OK;
            //  An upsert's old copies on nodes that do not hold the new value go.
            for (uint8_t o = 0; placed && o < placed->old_count; o++) {
                bool kept = (placed->local && s_is_self (self, placed->old[o]));
                for (uint8_t d = 0; d < placed->done_count; d++)
                    kept |= placed->done[d] == placed->old[o];
                if (!kept)
                    s_drop_at (self, placed->old[o], item->key, item->key_len);
            }
            continue;
        }
        //  Not committed: the copies written go again.
        item->status = status;
        if ((placed ? placed->local : true) && self_peer >= 0)
            s_drop_at (self, self_peer, item->key, item->key_len);
        for (uint8_t d = 0; placed && d < placed->done_count; d++)
            s_drop_at (self, placed->done[d], item->key, item->key_len);
    }
    if (!reply)
        kvp_job_fail (job, KVPOOL_OK, "%s did not answer the commit",
                      master_client_name (self->master));
}

//  ---- gets --------------------------------------------------------------------------

static void
s_locate_start (self_t *self, op_t *op, bool missing_only)
{
    kvp_job_t *job = op->job;
    size_t n = 0;
    size_t *items = (size_t *) malloc ((job->count ? job->count : 1) * sizeof (size_t));
    ProtobufCBinaryData *keys =
        (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
    assert (items && keys);
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (missing_only ? item->status != KVPOOL_OBJECT_NOT_FOUND
                         : (item->status != KVPOOL_OK || item->key_len == 0))
            continue;
        items[n] = i;
        keys[n].data = (uint8_t *) item->key;
        keys[n++].len = item->key_len;
    }
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;
    request.keys = keys;
    request.n_keys = n;
    if (n == 0)
        free (items);
    else if (s_master_send (self, op, &request, items, n) != 0) {
        for (size_t i = 0; i < job->count; i++)
            if (missing_only && job->items[i].status == KVPOOL_OBJECT_NOT_FOUND)
                job->items[i].status = KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS;
        kvp_job_fail (job, missing_only ? KVPOOL_OK : KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                      "%s is unreachable", master_client_name (self->master));
    }
    free (keys);
}

static void
s_msg_free (void *buffer)
{
    zmq_msg_t *msg = (zmq_msg_t *) buffer;
    zmq_msg_close (msg);
    free (msg);
}

static void s_fetch_add (self_t *self, op_t *op, run_t *run, size_t i);

//  The order in which a get tries the nodes that hold an item: this host's first, then the
//  least busy; nodes that timed out lately last.
static void
s_fetch_order (self_t *self, fetch_t *fetch)
{
    int64_t now = zclock_mono ();
    for (uint8_t a = 1; a < fetch->count; a++) {
        int peer = fetch->peers[a];
        uint8_t b = a;
        while (b > 0) {
            peer_t *x = self->peers[peer], *y = self->peers[fetch->peers[b - 1]];
            int rank_x =
                (x->suspect_until > now) * 4 + (strcmp (x->host_id, self->args->host_id) != 0) * 2;
            int rank_y =
                (y->suspect_until > now) * 4 + (strcmp (y->host_id, self->args->host_id) != 0) * 2;
            if (rank_x > rank_y || (rank_x == rank_y && x->calls_out >= y->calls_out))
                break;
            fetch->peers[b] = fetch->peers[b - 1];
            b--;
        }
        fetch->peers[b] = peer;
    }
}

//  The client reads item's value from a node that holds it, in one hop: its status says so,
//  and its locations name those nodes (job->nodes, the reply's node list).
static void
s_redirect (self_t *self, kvp_job_t *job, kvp_item_t *item,
            const Kvpool__Cluster__V1__MasterReply *reply,
            const Kvpool__Cluster__V1__Holders *holders)
{
    item->status = KVPOOL_REDIRECT;
    self->redirects++;
    item->location_count = 0;
    for (size_t h = 0; h < holders->n_nodes && item->location_count < KVP_MAX_REPLICAS; h++) {
        if (holders->nodes[h] >= reply->n_nodes)
            continue;
        const Kvpool__Cluster__V1__Node *node = reply->nodes[holders->nodes[h]];
        if (strcmp (node->node_id, self->args->node_id) == 0)
            continue;
        size_t index = 0;
        while (index < job->node_count && strcmp (job->nodes[index].node_id, node->node_id))
            index++;
        if (index == job->node_count) {
            kvp_node_info_t *grown = (kvp_node_info_t *) realloc (
                job->nodes, (job->node_count + 1) * sizeof (kvp_node_info_t));
            assert (grown);
            job->nodes = grown;
            kvp_node_info_t *to = &job->nodes[job->node_count++];
            memset (to, 0, sizeof *to);
            snprintf (to->node_id, sizeof to->node_id, "%s", node->node_id);
            snprintf (to->host_id, sizeof to->host_id, "%s", node->host_id);
            snprintf (to->client_endpoint, sizeof to->client_endpoint, "%s", node->client_endpoint);
            snprintf (to->curve_key, sizeof to->curve_key, "%s", node->curve_key);
            to->alive = true;
        }
        item->locations[item->location_count++] = (uint16_t) index;
    }
    if (item->location_count == 0)
        item->status = KVPOOL_OBJECT_NOT_FOUND; //  (fetched from a peer below)
}

static void
s_fetch_located (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    if (!op->fetch)
        op->fetch = (fetch_t *) zmalloc (job->count * sizeof (fetch_t));
    kvp_job_need_replicas (job);
    for (size_t k = 0; k < call->count; k++) {
        size_t i = call->items[k];
        kvp_item_t *item = &job->items[i];
        fetch_t *fetch = &op->fetch[i];
        int status = s_key_status (reply, k, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
        if (status != KVPOOL_OK) {
            item->status = status;
            continue;
        }
        int holders[KVP_MAX_REPLICAS];
        uint8_t count = s_holders (self, reply, reply->holders[k], holders);
        for (uint8_t h = 0; h < count; h++)
            if (!s_is_self (self, holders[h]))
                fetch->peers[fetch->count++] = holders[h];
        if (fetch->count == 0) {
            item->status = KVPOOL_OBJECT_NOT_FOUND;
            continue;
        }
        item->size = k < reply->n_sizes ? reply->sizes[k] : 0;
        s_fetch_order (self, fetch);
        if (job->redirect && !job->ranged && item->size >= REDIRECT_MIN_BYTES)
            s_redirect (self, job, item, reply, reply->holders[k]);
    }
    //  Small values to one node go in one request; large ones in stripes.
    run_t *run = s_run_new (self, op);
    for (size_t k = 0; k < call->count; k++) {
        size_t i = call->items[k];
        if (op->fetch[i].count && job->items[i].status == KVPOOL_OBJECT_NOT_FOUND)
            s_fetch_add (self, op, run, i);
    }
    s_run_start (self, run, NULL);
    if (!reply)
        kvp_job_fail (job, KVPOOL_OK, "%s did not answer", master_client_name (self->master));
}

//  Adds the reads of item i from its next candidate to run: the whole value, or stripes of
//  it into one buffer. Marks the item failed when no candidate is left.
static void
s_fetch_add (self_t *self, op_t *op, run_t *run, size_t i)
{
    kvp_job_t *job = op->job;
    kvp_item_t *item = &job->items[i];
    fetch_t *fetch = &op->fetch[i];
    if (item->buffer) {
        item->buffer_free (item->buffer);
        item->buffer = NULL;
    }
    if (fetch->next == fetch->count) {
        item->status = fetch->any_failure ? KVPOOL_TRANSFER_FAIL : KVPOOL_OBJECT_NOT_FOUND;
        return;
    }
    int peer = fetch->peers[fetch->next++];
    uint64_t stripe = self->config->stripe_size;
    uint64_t stripes = item->size > stripe ? (item->size + stripe - 1) / stripe : 1;
    if (stripes > MAX_STRIPES) {
        stripe = (item->size + MAX_STRIPES - 1) / MAX_STRIPES;
        stripes = (item->size + stripe - 1) / stripe;
    }
    char *buffer = NULL;
    if (stripes > 1) {
        buffer = (char *) malloc (item->size);
        if (!buffer) {
            item->status = KVPOOL_INTERNAL_ERROR;
            return;
        }
        item->buffer = buffer;
        item->buffer_free = free;
        item->replicas[0].addr = buffer;
    }
    for (uint64_t s = 0; s < stripes; s++) {
        data_plane_xfer_t *xfer = s_run_add (run, i, peer);
        xfer->kind = DATA_PLANE_READ;
        xfer->key = item->key;
        xfer->key_len = item->key_len;
        xfer->size = item->size; //  as the master knows it: the room for a read by RDMA
        if (stripes > 1) {
            xfer->offset = s * stripe;
            xfer->length = item->size - xfer->offset < stripe ? item->size - xfer->offset : stripe;
            xfer->dst = buffer + xfer->offset;
        }
    }
}

//  A value read from a node did not match its checksum: counted, and never served (the
//  next holder is read instead, as for a node that failed).
static void
s_checksum_failed (self_t *self, kvp_item_t *item, int peer)
{
    self->checksum_failures++;
    kvp_warning ("the value of '%s' read from node %s does not match its checksum: "
                 "reading another replica",
                 item->key, self->peers[peer]->node_id);
}

//  A get's reads ended: items read whole or in every stripe are done; the others are read
//  again from their next candidate, in a run of their own.
static void
s_fetch_done (self_t *self, op_t *op, run_t *run)
{
    kvp_job_t *job = op->job;
    run_t *again = s_run_new (self, op);
    for (size_t x = 0; x < run->count;) {
        size_t i = run->items[x], first = x;
        kvp_item_t *item = &job->items[i];
        fetch_t *fetch = &op->fetch[i];
        bool ok = true;
        for (; x < run->count && run->items[x] == i; x++) {
            data_plane_xfer_t *xfer = &run->xfers[x];
            if (xfer->status == KVPOOL_OK) {
                self->remote_get_parts += xfer->length > 0;
                continue;
            }
            ok = false;
            if (xfer->corrupt)
                s_checksum_failed (self, item, run->peers[x]);
            if (xfer->status != KVPOOL_OBJECT_NOT_FOUND)
                fetch->any_failure = true;
            if (!xfer->answered) {
                self->peers[run->peers[x]]->suspect_until = zclock_mono () + SUSPECT_MS;
                self->failures++;
            }
        }
        //  A value in stripes is verified here, whole, once they are all in.
        uint64_t checksum = run->xfers[first].checksum;
        if (ok && item->buffer && checksum && value_checksum_verify ()
            && value_checksum (item->buffer, item->size) != checksum) {
            s_checksum_failed (self, item, run->peers[first]);
            fetch->any_failure = true;
            ok = false;
        }
        if (!ok) {
            //  This node could not serve it: the next one is tried.
            s_fetch_add (self, op, again, i);
            continue;
        }
        item->checksum = checksum; //  sent on with the value (Reply.checksums)
        if (!item->buffer) {
            //  Read whole: the received message is the value, sent on without a copy.
            zmq_msg_t *msg = (zmq_msg_t *) malloc (sizeof (zmq_msg_t));
            assert (msg);
            zmq_msg_init (msg);
            zmq_msg_move (msg, &run->xfers[first].frame);
            item->buffer = msg;
            item->buffer_free = s_msg_free;
            item->size = zmq_msg_size (msg);
            item->replicas[0].addr = zmq_msg_data (msg);
        }
        item->replica_count = 0;
        item->status = KVPOOL_OK;
        self->remote_gets++;
        self->remote_get_bytes += item->size;
    }
    s_run_start (self, again, NULL);
}

//  The workers are done with a run: its operation goes on.
static void s_op_next (self_t *self, op_t *op);

static void
s_run_finished (self_t *self, run_t *run)
{
    op_t *op = run->op;
    op->calls_out--;
    for (size_t x = 0; x < run->count; x++)
        self->peers[run->peers[x]]->calls_out--;
    if (self->terminated) {
        kvp_job_fail (op->job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "the node is stopping");
        for (size_t x = 0; x < run->count; x++)
            if (op->job->items[run->items[x]].status == KVPOOL_OBJECT_NOT_FOUND)
                op->job->items[run->items[x]].status = KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS;
    }
    else if (op->job->kind == KVP_CL_FETCH)
        s_fetch_done (self, op, run);
    else if (op->job->kind == KVP_CL_COMMIT)
        s_commit_copies_done (self, op, run);
    s_run_destroy (&run);
    s_op_next (self, op);
}

static void
s_runs_finished (self_t *self)
{
    uint64_t count;
    ssize_t rc = read (self->wake_fd, &count, sizeof count);
    (void) rc;
    pthread_mutex_lock (&self->lock);
    run_t *list = self->finished;
    self->finished = NULL;
    pthread_mutex_unlock (&self->lock);
    while (list) {
        run_t *run = list;
        list = run->next;
        s_run_finished (self, run);
    }
}

static void
s_exist_reply (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    for (size_t k = 0; k < call->count; k++) {
        kvp_item_t *item = &job->items[call->items[k]];
        int status = s_key_status (reply, k, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
        item->status = status;
        if (status == KVPOOL_OK)
            item->size = k < reply->n_sizes ? reply->sizes[k] : 0;
    }
    if (!reply)
        kvp_job_fail (job, KVPOOL_OK, "%s did not answer", master_client_name (self->master));
}

//  LOCATE and NODES: the master's nodes as the client protocol names them.
static void
s_nodes_reply (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    if (!s_master_answered (self, job, reply))
        return;
    job->nodes =
        (kvp_node_info_t *) calloc (reply->n_nodes ? reply->n_nodes : 1, sizeof (kvp_node_info_t));
    assert (job->nodes);
    job->node_count = reply->n_nodes;
    for (size_t n = 0; n < reply->n_nodes; n++) {
        const Kvpool__Cluster__V1__Node *from = reply->nodes[n];
        kvp_node_info_t *to = &job->nodes[n];
        snprintf (to->node_id, sizeof to->node_id, "%s", from->node_id);
        snprintf (to->host_id, sizeof to->host_id, "%s", from->host_id);
        snprintf (to->client_endpoint, sizeof to->client_endpoint, "%s", from->client_endpoint);
        snprintf (to->curve_key, sizeof to->curve_key, "%s", from->curve_key);
        to->capacity = from->capacity;
        to->free = from->free;
        to->alive = from->alive;
        to->objects = from->objects;
        to->last_heard_ms = from->last_heard_ms;
    }
    for (size_t k = 0; call && k < call->count; k++) {
        kvp_item_t *item = &job->items[call->items[k]];
        item->status = k < reply->n_statuses ? reply->statuses[k] : KVPOOL_INTERNAL_ERROR;
        if (item->status != KVPOOL_OK)
            continue;
        item->size = k < reply->n_sizes ? reply->sizes[k] : 0;
        const Kvpool__Cluster__V1__Holders *holders =
            k < reply->n_holders ? reply->holders[k] : NULL;
        for (size_t h = 0;
             holders && h < holders->n_nodes && item->location_count < KVP_MAX_REPLICAS; h++)
            item->locations[item->location_count++] = (uint16_t) holders->nodes[h];
    }
}

//  ---- removes ------------------------------------------------------------------------

static void
s_remove_start (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    ProtobufCBinaryData *keys = NULL;
    size_t *items = NULL, n = 0;
    switch (job->op) {
        case KVPOOL__V1__OP__REMOVE:
            request.kind = KVPOOL__CLUSTER__V1__KIND__REMOVE;
            keys = (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
            items = (size_t *) malloc ((job->count ? job->count : 1) * sizeof (size_t));
            assert (keys && items);
            for (size_t i = 0; i < job->count; i++)
                if (job->items[i].status == KVPOOL_OK) {
                    items[n] = i;
                    keys[n].data = (uint8_t *) job->items[i].key;
                    keys[n++].len = job->items[i].key_len;
                }
            request.keys = keys;
            request.n_keys = n;
            break;
        case KVPOOL__V1__OP__REMOVE_BY_REGEX:
            request.kind = KVPOOL__CLUSTER__V1__KIND__REMOVE_REGEX;
            request.pattern = (char *) (job->pattern ? job->pattern : "");
            break;
        default: request.kind = KVPOOL__CLUSTER__V1__KIND__REMOVE_ALL; break;
    }
    if (s_master_send (self, op, &request, items, n) != 0)
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "%s is unreachable",
                      master_client_name (self->master));
    free (keys);
}

//  The master forgot the keys: the nodes that held them drop them before the client hears.
static void
s_remove_reply (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    if (!s_master_answered (self, job, reply))
        return;
    op->phase = 1;
    job->result_count = reply->count;
    bool all = reply->kind == KVPOOL__CLUSTER__V1__KIND__REMOVE_ALL;
    for (size_t k = 0; k < call->count && k < reply->n_statuses; k++)
        job->items[call->items[k]].status = reply->statuses[k];
    //  One request per node: every key it held (or, for all, everything).
    for (size_t nix = 0; nix < reply->n_nodes; nix++) {
        const Kvpool__Cluster__V1__Node *node = reply->nodes[nix];
        int peer =
            s_peer (self, node->node_id, node->host_id, node->peer_endpoint, node->curve_key);
        if (peer < 0)
            continue;
        Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
        request.force = true;
        ProtobufCBinaryData *keys = NULL;
        if (all)
            //  This node drained its own writes already (the reset that runs here): a RESET
            //  sent to itself would wait behind that one, and never be answered in time.
            request.op = job->op == KVPOOL__V1__OP__RESET && !s_is_self (self, peer)
                             ? KVPOOL__V1__OP__RESET
                             : KVPOOL__V1__OP__REMOVE_ALL;
        else {
            const ProtobufCBinaryData *names = reply->n_keys ? reply->keys : NULL;
            keys = (ProtobufCBinaryData *) malloc ((reply->n_holders ? reply->n_holders : 1)
                                                   * sizeof *keys);
            assert (keys);
            size_t n = 0;
            for (size_t k = 0; k < reply->n_holders; k++) {
                const Kvpool__Cluster__V1__Holders *holders = reply->holders[k];
                for (size_t h = 0; h < holders->n_nodes; h++)
                    if (holders->nodes[h] == nix) {
                        if (names)
                            keys[n++] = names[k];
                        else if (k < call->count) {
                            keys[n].data = (uint8_t *) job->items[call->items[k]].key;
                            keys[n++].len = job->items[call->items[k]].key_len;
                        }
                    }
            }
            if (n == 0) {
                free (keys);
                continue;
            }
            request.op = KVPOOL__V1__OP__REMOVE;
            request.keys = keys;
            request.n_keys = n;
        }
        s_peer_send (self, op, peer, &request, NULL, 0);
        free (keys);
    }
}

//  ---- dispatch ----------------------------------------------------------------------

static void
s_job (self_t *self, kvp_job_t *job, zframe_t *routing_id)
{
    if (job->kind == KVP_CL_DROPPED) {
        //  The replica-manager's: nobody waits.
        ProtobufCBinaryData *keys =
            (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
        assert (keys);
        for (size_t i = 0; i < job->count; i++) {
            keys[i].data = (uint8_t *) job->items[i].key;
            keys[i].len = job->items[i].key_len;
        }
        Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        request.kind = KVPOOL__CLUSTER__V1__KIND__DROPPED;
        request.keys = keys;
        request.n_keys = job->count;
        s_master_send (self, NULL, &request, NULL, 0);
        free (keys);
        zframe_destroy (&routing_id);
        kvp_job_destroy (&job);
        return;
    }
    op_t *op = (op_t *) zmalloc (sizeof (op_t));
    op->job = job;
    op->routing_id = routing_id;
    switch (job->kind) {
        case KVP_CL_PLACE: s_place_start (self, op); break;
        case KVP_CL_COMMIT: s_commit_start (self, op); break;
        case KVP_CL_ABORT:
            s_cluster_full_answer (job);
            s_abort_keys (self, job, job->op == KVPOOL__V1__OP__PUT_REVOKE);
            break;
        case KVP_CL_FETCH:
        case KVP_CL_EXIST: s_locate_start (self, op, true); break;
        case KVP_CL_LOCATE: s_locate_start (self, op, false); break;
        case KVP_CL_NODES: {
            Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
            request.kind = KVPOOL__CLUSTER__V1__KIND__NODES;
            if (s_master_send (self, op, &request, NULL, 0) != 0)
                kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                              "%s is unreachable", master_client_name (self->master));
            break;
        }
        case KVP_CL_REMOVE: s_remove_start (self, op); break;
        case KVP_CL_STATS:
            job->stats.remote_gets = self->remote_gets;
            job->stats.remote_get_bytes = self->remote_get_bytes;
            job->stats.redirects = self->redirects;
            job->stats.remote_puts = self->remote_puts;
            job->stats.remote_put_parts = self->remote_put_parts;
            job->stats.remote_get_parts = self->remote_get_parts;
            job->stats.rdma_transfers = data_plane_rdma_transfers (self->plane);
            job->stats.cluster_failures = self->failures + master_client_failures (self->master);
            job->stats.checksum_failures += self->checksum_failures; //  (and the replica-manager's)
            break;
        default: kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "cluster: job kind %d", job->kind);
    }
    s_op_next (self, op);
}

//  A call ended: replied (master_reply or reply, and value frames) or timed out (both
//  NULL). Advances its operation, and answers the job when nothing is left out.
static void
s_call_done (self_t *self, call_t *call, Kvpool__Cluster__V1__MasterReply *master_reply,
             Kvpool__V1__Reply *reply, zmq_msg_t *frames, size_t frame_count)
{
    op_t *op = call->op;
    op->calls_out--;
    if (call->kind == CALL_PEER)
        self->peers[call->peer]->calls_out--;
    switch (op->job->kind) {
        case KVP_CL_PLACE: s_place_reply (self, op, call, master_reply); break;
        case KVP_CL_COMMIT: s_commit_reply (self, op, call, master_reply); break;
        case KVP_CL_FETCH: s_fetch_located (self, op, call, master_reply); break;
        case KVP_CL_EXIST: s_exist_reply (self, op, call, master_reply); break;
        case KVP_CL_LOCATE:
        case KVP_CL_NODES: s_nodes_reply (self, op, call, master_reply); break;
        case KVP_CL_REMOVE:
            if (call->kind == CALL_MASTER)
                s_remove_reply (self, op, call, master_reply);
            else if (reply && reply->status != KVPOOL_OK)
                //  The master forgot the keys, but this holder refused to drop them (and
                //  may serve them to its own clients until it registers again): the client
                //  hears so. A holder that did not answer in time takes the request when it
                //  runs again (it waits in its socket), or, dead, has its copies refused
                //  when it registers again (the master's tombstones).
                kvp_job_fail (op->job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                              "node %s refused the removal (%s): it may serve its copies "
                              "until it registers with the master again",
                              self->peers[call->peer]->node_id,
                              reply->error && *reply->error ? reply->error : "no reason given");
            break;
        default: break;
    }
    if (call->kind == CALL_MASTER && !master_reply && op->job->kind == KVP_CL_PLACE)
        kvp_job_fail (op->job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                      "%s did not answer", master_client_name (self->master));
    (void) frames;
    (void) frame_count;
    s_op_next (self, op);
}

//  With nothing left out, an operation takes its next step or answers its job.
static void
s_op_next (self_t *self, op_t *op)
{
    if (op->calls_out == 0 && op->job->kind == KVP_CL_COMMIT && op->phase == 0)
        s_commit_master (self, op);
    if (op->calls_out == 0)
        s_op_done (self, op);
}

static void
s_master_message (self_t *self, void *which)
{
    void *handle;
    Kvpool__Cluster__V1__MasterReply *reply = master_client_recv (self->master, which, &handle);
    call_t *call = (call_t *) handle;
    if (call) {
        s_call_done (self, call, reply, NULL, NULL, 0);
        s_call_destroy (&call);
    }
    master_client_reply_free (&reply);
}

static void
s_peer_message (self_t *self, zsock_t *sock)
{
    zmq_msg_t *frames;
    size_t count;
    Kvpool__V1__Reply *reply = peer_link_recv (sock, &frames, &count);
    call_t *call = reply ? (call_t *) rpc_calls_take (self->peer_calls, reply->request_id) : NULL;
    if (call) {
        s_call_done (self, call, NULL, reply, frames, count);
        s_call_destroy (&call);
    }
    peer_link_reply_free (&reply, &frames, count);
}

//  Connections to nodes unused for this long are closed (a node that left the cluster is
//  not reconnected to forever); the next call to the node makes them again.
#define PEER_IDLE_MS 60000

//  Calls past their deadline end as failed; idle peers are disconnected.
static void
s_expire (self_t *self)
{
    int64_t now = zclock_mono ();
    for (size_t i = 0; i < self->peer_count; i++) {
        peer_t *peer = self->peers[i];
        if (peer->count && peer->calls_out == 0 && now - peer->last_used > PEER_IDLE_MS
            && strcmp (peer->node_id, self->args->node_id) != 0)
            s_peer_disconnect (self, peer);
    }
    call_t *call;
    while ((call = (call_t *) master_client_expired (self->master))) {
        s_call_done (self, call, NULL, NULL, NULL, 0);
        s_call_destroy (&call);
    }
    while ((call = (call_t *) rpc_calls_expired (self->peer_calls, now))) {
        //  A node that does not answer may be gone: its connections are closed, so that
        //  libzmq stops reconnecting to its port (which another process may take) and what
        //  was queued for it goes; the next call connects again.
        peer_t *peer = self->peers[call->peer];
        peer->suspect_until = now + SUSPECT_MS;
        s_peer_disconnect (self, peer);
        self->failures++;
        s_call_done (self, call, NULL, NULL, NULL, 0);
        s_call_destroy (&call);
    }
}

static self_t *
s_self_new (zsock_t *pipe, const cluster_args_t *args)
{
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->pipe = pipe;
    self->args = args;
    self->config = args->config;
    self->router = zsock_new (ZMQ_ROUTER);
    assert (self->router);
    zsock_set_sndhwm (self->router, 0);
    zsock_set_rcvhwm (self->router, 0);
    int rc = zsock_bind (self->router, "inproc://%s-cl", self->config->instance);
    assert (rc == 0);
    self->master = master_client_new (args, (int) self->config->cluster_timeout_ms);
    self->peer_calls = rpc_calls_new ();
    pthread_mutex_init (&self->lock, NULL);
    self->wake_fd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
    assert (self->wake_fd >= 0);
    const char *device = self->config->rdma_device ? self->config->rdma_device : "";
    self->plane =
        data_plane_new ((int) self->config->peer_connections,
                        (int) self->config->cluster_timeout_ms, self->config->rdma ? device : NULL);
    assert (self->plane);
    data_plane_set_curve (self->plane, self->config->curve);
    self->poller = zpoller_new (pipe, self->router, NULL);
    master_client_poll_on (self->master, self->poller);
    zpoller_add (self->poller, &self->wake_fd);
    return self;
}

static void
s_self_destroy (self_t **self_p)
{
    self_t *self = *self_p;
    if (!self)
        return;
    //  Jobs still waiting are failed back to the api, which is stopping: the transfers under
    //  way end first (within --cluster-timeout), then every call.
    self->terminated = true;
    data_plane_destroy (&self->plane);
    s_runs_finished (self);
    call_t *call;
    while ((call = (call_t *) master_client_cancel (self->master))
           || (call = (call_t *) rpc_calls_first (self->peer_calls))) {
        s_call_done (self, call, NULL, NULL, NULL, 0);
        s_call_destroy (&call);
    }
    rpc_calls_destroy (&self->peer_calls);
    for (size_t i = 0; i < self->peer_count; i++) {
        s_peer_disconnect (self, self->peers[i]);
        free (self->peers[i]);
    }
    zpoller_destroy (&self->poller);
    close (self->wake_fd);
    pthread_mutex_destroy (&self->lock);
    master_client_destroy (&self->master);
    zsock_destroy (&self->router);
    free (self);
    *self_p = NULL;
}

void
cluster_actor (zsock_t *pipe, void *args)
{
    pthread_setname_np (pthread_self (), "kvp-cluster");
    self_t *self = s_self_new (pipe, (const cluster_args_t *) args);
    //  Its own data plane is a peer too: removes reach what this node holds there.
    s_self_peer (self);
    zsock_signal (pipe, 0);
    int64_t next_tick = zclock_mono () + TICK_MS;
    while (!self->terminated) {
        int64_t wait = next_tick - zclock_mono ();
        void *which = zpoller_wait (self->poller, wait > 0 ? (int) wait : 0);
        if (which == pipe) {
            char *command = zstr_recv (pipe);
            if (!command || streq (command, "$TERM"))
                self->terminated = true;
            zstr_free (&command);
        }
        else if (which == self->router) {
            zframe_t *routing_id = NULL;
            kvp_job_t *job = kvp_job_recv_routed (self->router, &routing_id);
            if (job)
                s_job (self, job, routing_id);
            else
                zframe_destroy (&routing_id);
        }
        else if (master_client_owns (self->master, which))
            s_master_message (self, which);
        else if (which == &self->wake_fd)
            s_runs_finished (self);
        else if (which)
            s_peer_message (self, (zsock_t *) which);
        else if (zpoller_terminated (self->poller))
            break;
        if (zclock_mono () >= next_tick) {
            s_expire (self);
            next_tick = zclock_mono () + TICK_MS;
        }
    }
    s_self_destroy (&self);
}

void
cluster_test (bool verbose)
{
    //  The cluster's behaviour needs a master and nodes: tests/python/test_cluster.py runs
    //  them as processes. Here: the actor starts and stops with no master to talk to, and a
    //  job that needs the master fails at once with a reason instead of hanging.
    kvp_config_t config;
    kvp_config_defaults (&config);
    snprintf (config.instance, sizeof config.instance, "cltest%d", (int) getpid ());
    config.master = "tcp://127.0.0.1:1";
    config.cluster_timeout_ms = 200;
    cluster_args_t args = {&config, "n1", "h1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3", NULL};
    zactor_t *cluster = zactor_new (cluster_actor, &args);
    zsock_t *dealer = zsock_new_dealer (NULL);
    zsock_connect (dealer, "inproc://%s-cl", config.instance);
    zsock_set_rcvtimeo (dealer, 2000);
    const char *key = "k";
    size_t key_len = 1;
    kvp_job_t *job = kvp_job_new_owning (KVP_CL_EXIST, 1, &key, &key_len);
    job->op = KVPOOL__V1__OP__EXIST;
    job->items[0].status = KVPOOL_OBJECT_NOT_FOUND;
    assert (kvp_job_send (dealer, job) == 0);
    job = kvp_job_recv (dealer);
    assert (job && job->items[0].status == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
    assert (strstr (job->error, "unreachable"));
    kvp_job_destroy (&job);
    zsock_destroy (&dealer);
    zactor_destroy (&cluster);
    if (verbose)
        printf ("cluster ok ");
}
