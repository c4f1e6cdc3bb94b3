/*  cluster.c - the cluster actor (cluster.h): its sockets, peers, calls and dispatch.

    DESIGN
    A job's cluster stage becomes an operation (op_t) made of calls: requests to the master
    (through this actor's master client, master_client.h: the connection, ids, deadlines,
    fencing, and the words that name the master in an error; while the master is away a
    call fails at once with a clear reason instead of queueing) and to other nodes' data
    planes (peer_t: a few links each, dataplane/peer_link.h, used in turn, their calls in an
    rpc_calls table, dataplane/rpc_calls.h), and of runs: transfers of values on the data
    plane's workers (dataplane/data_plane.h), whose done callback wakes this thread through
    an eventfd. Every call has an id, echoed by the reply, and a deadline
    (--cluster-timeout); a call that times out counts as failed, and its late reply, if one
    comes, matches nothing and is dropped. When an operation has no call or run left out,
    its job goes back to the api.

    The operations themselves are written over these calls in files of their own
    (cluster_op.h): puts in cluster_put.c, gets and lookups in cluster_get.c, removes in
    cluster_remove.c.

    Threads: one (its loop: infra/actor_shell.h), and the data plane's workers for runs.
    Memory: a fetched value is owned by its job item (item->buffer) until it is sent.
*/
#include "actors/cluster_op.h"

#include "infra/curve.h"
#include "infra/log.h"

#include <sys/eventfd.h>
#include <unistd.h>

//  ---- peers -------------------------------------------------------------------------

static int s_peer_reader (actor_shell_t *shell, zsock_t *sock, void *arg);

static void
s_links_close (self_t *self, peer_link_t ***links_p, uint32_t *count_p)
{
    for (uint32_t i = 0; i < *count_p; i++) {
        actor_shell_remove (self->shell, peer_link_sock ((*links_p)[i]));
        peer_link_destroy (&(*links_p)[i]);
    }
    free (*links_p);
    *links_p = NULL;
    *count_p = 0;
}

static void
s_peer_disconnect (self_t *self, peer_t *peer)
{
    s_links_close (self, &peer->links, &peer->count);
    s_links_close (self, &peer->retired, &peer->retired_count);
}

//  A call to the node timed out: it may be gone, and its links are closed, so that libzmq
//  stops reconnecting to its port (which another process may take) and what was queued for
//  it goes. Not at once: calls sent on them since (to the node's new life, if it restarted:
//  libzmq reconnects by itself) would be lost with them, and a lost drop fences the node
//  for nothing. They are retired for a timeout; the next call connects afresh.
static void
s_peer_retire (self_t *self, peer_t *peer, int64_t now)
{
    peer_link_t **retired = (peer_link_t **) realloc (
        peer->retired, (peer->retired_count + peer->count) * sizeof (peer_link_t *));
    if (!retired) {
        s_peer_disconnect (self, peer);
        return;
    }
    memcpy (retired + peer->retired_count, peer->links, peer->count * sizeof (peer_link_t *));
    peer->retired = retired;
    peer->retired_count += peer->count;
    peer->retire_until = now + (int64_t) self->config->cluster_timeout_ms + STALL_GRACE_MS;
    free (peer->links);
    peer->links = NULL;
    peer->count = 0;
}

static void
s_peer_connect (self_t *self, peer_t *peer)
{
    //  Heartbeats: a connection that died without a FIN is found out, and made again.
    uint32_t want = self->config->peer_connections;
    peer->links_made++;
    peer->links = (peer_link_t **) calloc (want, sizeof (peer_link_t *));
    assert (peer->links);
    peer->count = 0;
    for (uint32_t i = 0; i < want; i++) {
        peer_link_t *link =
            peer_link_new (peer->endpoint, peer->curve_key, self->config->curve, true);
        if (!link)
            break; //  not an endpoint libzmq connects to: calls to it fail
        actor_shell_add (self->shell, peer_link_sock (link), s_peer_reader);
        peer->links[peer->count++] = link;
    }
}

//  The peer for a node the master named (connected on first sight, reconnected when its
//  endpoint changed). -1 when the table is full or the node has no data plane.
int
cluster_peer (self_t *self, const char *node_id, const char *host_id, const char *endpoint,
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

bool
cluster_is_self (self_t *self, int peer)
{
    return peer >= 0 && strcmp (self->peers[peer]->node_id, self->args->node_id) == 0;
}

//  The peers a holder list names.
uint8_t
cluster_holders (self_t *self, const Kvpool__Cluster__V1__MasterReply *reply,
                 const Kvpool__Cluster__V1__Holders *holders, int *out)
{
    uint8_t count = 0;
    for (size_t h = 0; holders && h < holders->n_nodes && count < KVP_MAX_REPLICAS; h++) {
        if (holders->nodes[h] >= reply->n_nodes)
            continue;
        const Kvpool__Cluster__V1__Node *node = reply->nodes[holders->nodes[h]];
        int peer =
            cluster_peer (self, node->node_id, node->host_id, node->peer_endpoint, node->curve_key);
        if (peer >= 0 && node->client_endpoint && *node->client_endpoint)
            snprintf (self->peers[peer]->client_endpoint, sizeof self->peers[peer]->client_endpoint,
                      "%s", node->client_endpoint);
        if (peer >= 0)
            out[count++] = peer;
    }
    return count;
}

int
cluster_self_peer (self_t *self)
{
    return cluster_peer (self, self->args->node_id, self->args->host_id, self->args->peer_endpoint,
                         kvp_curve_public_key (self->config->curve));
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
int
cluster_master_send (self_t *self, op_t *op, Kvpool__Cluster__V1__NodeRequest *request,
                     size_t *items, size_t count)
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
int
cluster_peer_send (self_t *self, op_t *op, int peer_index, Kvpool__V1__Request *request,
                   size_t *items, size_t count)
{
    peer_t *peer = self->peers[peer_index];
    call_t *call = op ? s_call_new (op, CALL_PEER, request->op, peer_index) : NULL;
    request->no_reply = call == NULL;
    if (peer->count == 0)
        s_peer_connect (self, peer); //  disconnected after a timeout, or idle
    if (call)
        call->links = peer->links_made;
    peer->last_used = zclock_mono ();
    uint64_t id = call ? rpc_calls_add (self->peer_calls, call,
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

//  Whether the master answered a job's call and accepted it; fails the job otherwise.
bool
cluster_master_answered (self_t *self, kvp_job_t *job,
                         const Kvpool__Cluster__V1__MasterReply *reply)
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

run_t *
cluster_run_new (self_t *self, op_t *op)
{
    run_t *run = (run_t *) zmalloc (sizeof (run_t));
    run->self = self;
    run->op = op;
    return run;
}

data_plane_xfer_t *
cluster_run_add (run_t *run, size_t item, int peer)
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
void
cluster_run_start (self_t *self, run_t *run, const data_plane_put_t *put)
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
        cluster_fetch_done (self, op, run);
    else if (op->job->kind == KVP_CL_COMMIT)
        cluster_commit_copies_done (self, op, run);
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
        cluster_master_send (self, NULL, &request, NULL, 0);
        free (keys);
        zframe_destroy (&routing_id);
        kvp_job_destroy (&job);
        return;
    }
    op_t *op = (op_t *) zmalloc (sizeof (op_t));
    op->job = job;
    op->routing_id = routing_id;
    switch (job->kind) {
        case KVP_CL_PLACE: cluster_place_start (self, op); break;
        case KVP_CL_COMMIT: cluster_commit_start (self, op); break;
        case KVP_CL_ABORT:
            cluster_full_answer (job);
            cluster_abort_keys (self, job, job->op == KVPOOL__V1__OP__PUT_REVOKE);
            break;
        case KVP_CL_FETCH:
        case KVP_CL_EXIST: cluster_locate_start (self, op, true); break;
        case KVP_CL_LOCATE: cluster_locate_start (self, op, false); break;
        case KVP_CL_NODES: {
            Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
            request.kind = KVPOOL__CLUSTER__V1__KIND__NODES;
            if (cluster_master_send (self, op, &request, NULL, 0) != 0)
                kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "%s is unreachable",
                              master_client_name (self->master));
            break;
        }
        case KVP_CL_REMOVE: cluster_remove_start (self, op); break;
        case KVP_CL_CACHE_CLAIM: cluster_cache_claim (self, op); break;
        case KVP_CL_DRAIN: cluster_drain_start (self, op); break;
        case KVP_CL_STATS:
            kvp_job_stats (job)->remote_gets = self->remote_gets;
            kvp_job_stats (job)->remote_get_bytes = self->remote_get_bytes;
            kvp_job_stats (job)->redirects = self->redirects;
            kvp_job_stats (job)->remote_puts = self->remote_puts;
            kvp_job_stats (job)->remote_put_parts = self->remote_put_parts;
            kvp_job_stats (job)->remote_get_parts = self->remote_get_parts;
            kvp_job_stats (job)->rdma_transfers = data_plane_rdma_transfers (self->plane);
            kvp_job_stats (job)->master_requests = master_client_sent (self->master);
            kvp_job_stats (job)->location_hits = self->location_hits;
            kvp_job_stats (job)->cluster_failures =
                self->failures + master_client_failures (self->master);
            kvp_job_stats (job)->checksum_failures +=
                self->checksum_failures; //  (and the replica-manager's)
            break;
        default: kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "cluster: job kind %d", job->kind);
    }
    s_op_next (self, op);
}

void
cluster_fence_later (self_t *self, op_t *op, int peer)
{
    for (uint8_t i = 0; i < op->fence_count; i++)
        if (op->fence[i] == peer)
            return;
    if (op->fence_count < sizeof op->fence / sizeof op->fence[0])
        op->fence[op->fence_count++] = peer;
    else
        kvp_job_fail (op->job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                      "too many nodes did not confirm dropping the keys: they may serve them "
                      "until they register with the master again");
    (void) self;
}

//  Sends a FENCE for each holder cluster_fence_later named that has none yet.
static void
s_fence_send (self_t *self, op_t *op)
{
    for (; op->fence_sent < op->fence_count; op->fence_sent++) {
        peer_t *peer = self->peers[op->fence[op->fence_sent]];
        kvp_warning ("node %s did not confirm dropping keys in time: fencing it at the master",
                     peer->node_id);
        Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        request.kind = KVPOOL__CLUSTER__V1__KIND__FENCE;
        request.pattern = peer->node_id;
        //  As the master named it a holder: registered again since, it needs no fence.
        request.n_tokens = op->planned ? 1 : 0;
        request.tokens = &op->planned;
        if (cluster_master_send (self, op, &request, NULL, 0) != 0)
            kvp_job_fail (op->job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                          "node %s did not confirm dropping the keys and %s is unreachable to "
                          "fence it: it may serve them until it registers again",
                          peer->node_id, master_client_name (self->master));
    }
}

//  The master fenced a node (or could not): the answer waits out the node's lease.
static void
s_fence_reply (self_t *self, op_t *op, Kvpool__Cluster__V1__MasterReply *reply)
{
    if (!reply || reply->status != KVPOOL_OK) {
        kvp_job_fail (op->job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                      "a node did not confirm dropping the keys and %s did not fence it (%s): "
                      "it may serve them until it registers again",
                      master_client_name (self->master),
                      reply && reply->error ? reply->error : "no answer");
        return;
    }
    int64_t until = zclock_mono () + (int64_t) reply->wait_ms;
    if (until > op->hold_until)
        op->hold_until = until;
}

//  A call ended: replied (master_reply or reply, and value frames) or timed out (both
//  NULL). Advances its operation, and answers the job when nothing is left out.
static void
s_call_done (self_t *self, call_t *call, Kvpool__Cluster__V1__MasterReply *master_reply,
             Kvpool__V1__Reply *reply, zmq_msg_t *frames, size_t frame_count)
{
    op_t *op = call->op;
    op->calls_out--;
    if (master_reply && master_reply->planned > op->planned)
        op->planned = master_reply->planned;
    //  A change the master made while a node it fenced may still serve its copies: the
    //  client hears once that node's lease has surely run out (as after a FENCE of our own).
    if (master_reply && master_reply->status == KVPOOL_OK && master_reply->wait_ms) {
        int64_t until = zclock_mono () + (int64_t) master_reply->wait_ms;
        if (until > op->hold_until)
            op->hold_until = until;
    }
    if (call->kind == CALL_PEER)
        self->peers[call->peer]->calls_out--;
    if (call->kind == CALL_MASTER && call->what == KVPOOL__CLUSTER__V1__KIND__FENCE) {
        s_fence_reply (self, op, master_reply);
        s_op_next (self, op);
        return;
    }
    switch (op->job->kind) {
        case KVP_CL_PLACE: cluster_place_reply (self, op, call, master_reply); break;
        case KVP_CL_COMMIT:
            if (call->kind == CALL_PEER)
                cluster_drop_reply (self, op, call, reply);
            else
                cluster_commit_reply (self, op, call, master_reply);
            break;
        case KVP_CL_FETCH: cluster_fetch_located (self, op, call, master_reply); break;
        case KVP_CL_EXIST: cluster_exist_reply (self, op, call, master_reply); break;
        case KVP_CL_CACHE_CLAIM: cluster_cache_claimed (self, op, call, master_reply); break;
        case KVP_CL_DRAIN: cluster_drain_reply (self, op, master_reply); break;
        case KVP_CL_LOCATE:
        case KVP_CL_NODES: cluster_nodes_reply (self, op, call, master_reply); break;
        case KVP_CL_REMOVE:
            if (call->kind == CALL_MASTER)
                cluster_remove_reply (self, op, call, master_reply);
            else if (!reply)
                cluster_fence_later (self, op, call->peer);
            else if (reply->status != KVPOOL_OK)
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
        kvp_job_fail (op->job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "%s did not answer",
                      master_client_name (self->master));
    (void) frames;
    (void) frame_count;
    s_op_next (self, op);
}

//  With nothing left out, an operation takes its next step or answers its job.
static void
s_op_next (self_t *self, op_t *op)
{
    if (op->calls_out == 0 && op->job->kind == KVP_CL_COMMIT && op->phase == 0)
        cluster_commit_master (self, op);
    if (op->calls_out == 0 && op->fence_sent < op->fence_count)
        s_fence_send (self, op);
    if (op->calls_out == 0 && zclock_mono () < op->hold_until) {
        zlistx_add_end (self->held, op); //  s_expire answers it when the time comes
        return;
    }
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
    //  Answers that waited out fenced nodes' leases.
    op_t *op = (op_t *) zlistx_first (self->held);
    while (op) {
        if (now >= op->hold_until) {
            zlistx_delete (self->held, zlistx_cursor (self->held));
            s_op_done (self, op);
            op = (op_t *) zlistx_first (self->held);
        }
        else
            op = (op_t *) zlistx_next (self->held);
    }
    for (size_t i = 0; i < self->peer_count; i++) {
        peer_t *peer = self->peers[i];
        if (peer->retired_count && now >= peer->retire_until)
            s_links_close (self, &peer->retired, &peer->retired_count);
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
        //  A node that does not answer may be gone (s_peer_retire).
        peer_t *peer = self->peers[call->peer];
        peer->suspect_until = now + SUSPECT_MS;
        peer->epoch++;
        if (peer->count && call->links == peer->links_made)
            s_peer_retire (self, peer, now);
        self->failures++;
        s_call_done (self, call, NULL, NULL, NULL, 0);
        s_call_destroy (&call);
    }
}

//  ---- the actor ---------------------------------------------------------------------

static int
s_router_reader (actor_shell_t *shell, zsock_t *router, void *arg)
{
    (void) shell;
    zframe_t *routing_id = NULL;
    kvp_job_t *job = kvp_job_recv_routed (router, &routing_id);
    if (job)
        s_job ((self_t *) arg, job, routing_id);
    else
        zframe_destroy (&routing_id);
    return 0;
}

static int
s_master_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell;
    s_master_message ((self_t *) arg, sock);
    return 0;
}

static int
s_peer_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell;
    s_peer_message ((self_t *) arg, sock);
    return 0;
}

static int
s_wake_reader (actor_shell_t *shell, int fd, void *arg)
{
    (void) shell;
    (void) fd;
    s_runs_finished ((self_t *) arg);
    return 0;
}

//  After every wake-up (the one that brought $TERM too): expiry, every TICK_MS.
static int64_t
s_tick (actor_shell_t *shell, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    int64_t now = zclock_mono ();
    if (now >= self->next_tick && now - self->next_tick > STALL_GRACE_MS && !self->stall_grace) {
        self->stall_grace = true;
        self->next_tick = now + STALL_GRACE_MS;
    }
    else if (now >= self->next_tick) {
        self->stall_grace = false;
        s_expire (self);
        self->next_tick = zclock_mono () + TICK_MS;
    }
    return self->next_tick;
}

static self_t *
s_self_new (actor_shell_t *shell, zsock_t *pipe, const cluster_args_t *args)
{
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->shell = shell;
    self->pipe = pipe;
    self->args = args;
    self->config = args->config;
    //  Jobs, never held back.
    static const actor_socket_t router = {ZMQ_ROUTER, "@inproc://%s-cl", 0,
                                          0,          s_router_reader,   false};
    self->router = actor_shell_open (shell, &router, self->config->instance);
    assert (self->router);
    self->master = master_client_new (args, (int) self->config->cluster_timeout_ms);
    self->peer_calls = rpc_calls_new ();
    self->held = zlistx_new ();
    cluster_locations_new (self);
    pthread_mutex_init (&self->lock, NULL);
    self->wake_fd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
    assert (self->wake_fd >= 0);
    const char *device = self->config->rdma_device ? self->config->rdma_device : "";
    self->plane =
        data_plane_new ((int) self->config->peer_connections,
                        (int) self->config->cluster_timeout_ms, self->config->rdma ? device : NULL);
    assert (self->plane);
    data_plane_set_curve (self->plane, self->config->curve);
    master_client_wait_on (self->master, shell, s_master_reader);
    actor_shell_add_fd (shell, self->wake_fd, s_wake_reader);
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
    for (op_t *op = (op_t *) zlistx_first (self->held); op; op = (op_t *) zlistx_next (self->held))
        s_op_done (self, op);
    zlistx_destroy (&self->held);
    cluster_locations_destroy (self);
    for (size_t i = 0; i < self->peer_count; i++) {
        s_peer_disconnect (self, self->peers[i]);
        free (self->peers[i]);
    }
    close (self->wake_fd);
    pthread_mutex_destroy (&self->lock);
    master_client_destroy (&self->master);
    free (self);
    *self_p = NULL;
}

void
cluster_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-cluster");
    self_t *self = s_self_new (shell, pipe, (const cluster_args_t *) args);
    //  Its own data plane is a peer too: removes reach what this node holds there.
    cluster_self_peer (self);
    actor_shell_ready (shell, 0);
    self->next_tick = zclock_mono () + TICK_MS;
    actor_shell_on_tick (shell, s_tick);
    actor_shell_set_final_tick (shell, true);
    actor_shell_run (shell, self);
    s_self_destroy (&self);
    actor_shell_destroy (&shell); //  (the router: jobs failed back above went on it)
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
