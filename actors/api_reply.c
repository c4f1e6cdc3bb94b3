/*  api_reply.c - replies from the api (api_self.h): the Reply encoded from the fields its
    operation's row fills (messages/reply.h), error replies, jobs answered to in-process
    actors, GET values sent from segment memory (pinned until libzmq lets go of them) or
    copied when small.

    Threads: the api's; a value frame's free callback runs on libzmq's I/O thread and only
    drops its pin (connections.h).
*/
#include "actors/api_self.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>

#include "infra/log.h"
#include "actors/connections.h"
#include "infra/actor_shell.h"
#include "infra/conn_guard.h"
#include "infra/curve.h"
#include "infra/key_watch.h"
#include "shm/segment.h"
#include "infra/endpoints.h"
#include "actors/index_reads.h"
#include "infra/metrics.h"
#include "actors/owners.h"
#include "protocol/contract.h"
#include "protocol/status.h"
#include "actors/replica_manager.h"
#include "infra/spin_poll.h"
#include "infra/wait_set.h"
#include "actors/transfer_submitter.h"
#include "messages/kvp_job.h"
#include "messages/arena.h"
#include "messages/ops.h"
#include "messages/reply.h"
#include "protocol/kvpool.pb-c.h"
#include "messages/request_check.h"
#include "shm/shm_index.h"
#include "transfer/value_checksum.h"

//  GET values copied into the reply instead of sent from the segment: at most this many
//  bytes a reply, so that a GET naming one small key 100,000 times costs frames, not copies.
#define COPY_BUDGET_BYTES (16 << 20)
//  GET values smaller than this are copied into the reply (cheaper than a zero-copy handle).
#define COPY_VALUE_BYTES 8192

//  ---- replies -----------------------------------------------------------------------

static int
s_send_frame (void *socket, const void *data, size_t size, bool more)
{
    return zmq_send (socket, data, size, more ? ZMQ_SNDMORE : 0) == -1 ? -1 : 0;
}

//  The transport a request came over, for the byte counters.
kvp_transport_t
api_transport (const api_ctx_t *ctx)
{
    return ctx->peer.kind == PEER_REMOTE  ? KVP_TRANSPORT_TCP
           : ctx->peer.kind == PEER_LOCAL ? KVP_TRANSPORT_IPC
                                          : KVP_TRANSPORT_INPROC;
}

//  Sends [routing id][delimiter?][reply][values?]. Returns 0 or -1.
static int
s_send_header (api_t *self, api_ctx_t *ctx, Kvpool__V1__Reply *reply, bool more)
{
    void *socket = zsock_resolve (ctx->socket);
    //  The reply (and its values, sent next) goes out on ctx->socket: its events are asked
    //  again before the api sleeps (wait_set.h).
    wait_set_touch (self->waits, ctx->socket);
    self->requests++;
    if (reply->status != KVPOOL_OK)
        self->errors++;
    metrics_request (self->metrics, reply->op, reply->status,
                     ctx->arrived_us ? (uint64_t) (zclock_usecs () - ctx->arrived_us) : 0);
    if (ctx->request && ctx->request->no_reply)
        return -1; //  the client asked for none (its values, if any, are dropped)
    if (s_send_frame (socket, zframe_data (ctx->routing_id), zframe_size (ctx->routing_id), true)
        == -1)
        return -1;
    if (ctx->envelope && s_send_frame (socket, NULL, 0, true) == -1)
        return -1;
    zmq_msg_t msg;
    size_t size = kvpool__v1__reply__get_packed_size (reply);
    zmq_msg_init_size (&msg, size);
    kvpool__v1__reply__pack (reply, (uint8_t *) zmq_msg_data (&msg));
    if (zmq_msg_send (&msg, socket, more ? ZMQ_SNDMORE : 0) == -1) {
        zmq_msg_close (&msg);
        return -1;
    }
    return 0;
}

void
api_reply_error (api_t *self, api_ctx_t *ctx, uint64_t request_id, int op, int status,
                 const char *reason)
{
    Kvpool__V1__Reply reply = KVPOOL__V1__REPLY__INIT;
    reply.version = KVP_PROTOCOL_VERSION;
    reply.request_id = request_id;
    reply.op = (Kvpool__V1__Op) op;
    reply.status = status;
    reply.error = (char *) reason;
    //  Logged before the answer leaves, so a client that has its answer finds the line
    kvp_debug ("request %llu op %d: %s (%s)", (unsigned long long) request_id, op,
               kvp_status_name (status), reason);
    s_send_header (self, ctx, &reply, false);
}

//  Answers an in-process actor's job on the job socket. Returns 0 or -1.
int
api_reply_job (api_t *self, zframe_t **routing_id_p, kvp_job_t *job)
{
    wait_set_touch (self->waits, self->jobs);
    return kvp_job_reply (self->jobs, routing_id_p, job);
}

//  Drops the pins a GET took on objects that will not be sent.
void
api_unpin_items (kvp_job_t *job)
{
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].object) {
            kvp_object_unpin (job->items[i].object);
            job->items[i].object = NULL;
        }
}

//  Sends the GET values: zero copy from the segment for large ones, pinned until sent, and
//  copies of small ones (COPY_BUDGET_BYTES a reply at most). Every value frame counts
//  against the client's connection until libzmq lets go of it (connections.h).
static void
s_send_values (api_t *self, kvp_job_t *job)
{
    api_ctx_t *ctx = (api_ctx_t *) job->context;
    void *socket = zsock_resolve (ctx->socket);
    connection_t *connection = connections_get (self->connections, zframe_data (ctx->routing_id),
                                                zframe_size (ctx->routing_id), ctx->fd);
    reply_frames_t *frames = reply_frames_new (connection, job->count);
    size_t used = 0;
    uint64_t copied = 0;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        bool more = i + 1 < job->count;
        zmq_msg_t msg;
        void *copy = NULL;
        bool held = item->object || item->buffer; //  a pinned object or a value read from disk
        if (item->status != KVPOOL_OK || !held || !frames || item->size == 0) {
            zmq_msg_init (&msg);
            if (held && item->status == KVPOOL_OK && item->size && !frames)
                item->status = KVPOOL_INTERNAL_ERROR; //  (the header is out: an empty frame)
        }
        else if (item->size < COPY_VALUE_BYTES && copied + item->size <= COPY_BUDGET_BYTES
                 && (copy = malloc (item->size))) {
            memcpy (copy, item->replicas[0].addr, item->size);
            copied += item->size;
            zmq_msg_init_data (&msg, copy, item->size, connections_frame_sent,
                               reply_frames_slot (frames, used++, NULL, copy, NULL, item->size));
        }
        else if (item->buffer) {
            zmq_msg_init_data (&msg, item->replicas[0].addr, item->size, connections_frame_sent,
                               reply_frames_slot (frames, used++, NULL, item->buffer,
                                                  item->buffer_free, item->size));
            item->buffer = NULL; //  the frame's callback frees it
        }
        else {
            zmq_msg_init_data (
                &msg, item->replicas[0].addr, item->size, connections_frame_sent,
                reply_frames_slot (frames, used++, item->object, NULL, NULL, item->size));
            item->object = NULL; //  the frame's callback unpins it
        }
        if (item->object) {
            kvp_object_unpin (item->object);
            item->object = NULL;
        }
        //  A failed send (client gone) still releases the pin when the message is closed.
        if (zmq_msg_send (&msg, socket, more ? ZMQ_SNDMORE : 0) == -1)
            zmq_msg_close (&msg);
    }
    reply_frames_done (&frames, used);
}

//  Completes the statistics the replica-manager and the allocator filled with the api's own
//  counters.
void
api_complete_stats (api_t *self, kvp_stats_t *stats)
{
    stats->utilisation =
        stats->bytes_mounted ? (double) stats->bytes_stored / stats->bytes_mounted : 0;
    stats->requests = self->requests;
    stats->errors = self->errors;
    stats->dropped_requests = self->dropped;
    //  Every get is counted once, as a hit or a miss (docs/metrics.md). The replica-manager
    //  counted the GETs it answered; reads answered from the index, by the api or by
    //  same-machine clients themselves, are gets and hits too, and so are the values those
    //  clients copied through a pinned replica list; the keys they found nowhere are misses.
    stats->index_gets =
        (self->reads ? index_reads_gets (self->reads) : 0) + self->client_index_gets;
    stats->client_gets = self->client_index_gets + self->client_listed + self->client_misses;
    stats->gets += stats->index_gets + self->client_listed + self->client_misses;
    stats->get_hits += stats->index_gets + self->client_listed;
    //  A node of a cluster: the replica-manager counted a key held only by other nodes as a
    //  miss. A value relayed from one of them is a hit; one the client was told to read
    //  from another node (REDIRECT) is that node's get, counted there, not here.
    stats->get_hits += stats->remote_gets;
    //  The hot cache: the replica-manager counted the reads of cache copies it served; the
    //  index's readers (here, and same-machine clients by their TOUCHes) read some too.
    stats->hot_cache_hits +=
        (self->reads ? index_reads_cache_hits (self->reads) : 0) + self->client_cache_hits;
    stats->hot_cache_misses = self->cache_misses;
    stats->puts_under_replicated = self->puts_under_replicated;
    stats->gets -= stats->redirects < stats->gets ? stats->redirects : stats->gets;
    stats->max_key_len = self->config->max_key_len;
    stats->max_value_size = self->config->max_value_size;
    stats->lease_ttl_ms = self->config->lease_ttl_ms;
    stats->uptime_ms = (uint64_t) (zclock_mono () - self->started);
    stats->transfer_workers = self->config->workers;
    stats->resets = self->resets_done;
    stats->connections = self->guard ? conn_guard_connections (self->guard) : 0;
    metrics_bytes_totals (self->metrics, &stats->value_bytes_in, &stats->value_bytes_out);
    metrics_link_stats (self->metrics, zclock_mono (), stats);
}

//  Sends values copied out of the read index as a GET's value frames, or drops them when
//  send is false (the header did not go); every message is sent or closed.
static void
s_send_copies (zsock_t *sock, zmq_msg_t *copies, size_t count, bool send)
{
    void *socket = zsock_resolve (sock);
    for (size_t i = 0; i < count; i++)
        if (!send || zmq_msg_send (&copies[i], socket, i + 1 < count ? ZMQ_SNDMORE : 0) == -1)
            zmq_msg_close (&copies[i]);
}

//  LOCATE and NODES of the one-process store: the node itself holds what it has.
static void
s_name_self (api_t *self, kvp_job_t *job)
{
    if (!(job->nodes.list = (kvp_node_info_t *) calloc (1, sizeof (kvp_node_info_t))))
        return;
    kvp_node_info_t *node = job->nodes.list;
    job->nodes.count = 1;
    snprintf (node->node_id, sizeof node->node_id, "%s", self->server_id);
    snprintf (node->host_id, sizeof node->host_id, "%s", self->host_id);
    const char *first = (const char *) zlistx_first (self->endpoints);
    snprintf (node->client_endpoint, sizeof node->client_endpoint, "%s", first ? first : "");
    snprintf (node->curve_key, sizeof node->curve_key, "%s",
              kvp_curve_public_key (self->config->curve));
    node->alive = true;
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVPOOL_OK)
            job->items[i].cluster.location_count = 1; //  locations[0] is 0: this node
}

//  STATS: the per-operation counters, for the operations asked for since the start, in the
//  request's arena. (Out of memory: the reply goes without them.)
static void
s_op_stats (api_t *self, api_ctx_t *ctx, Kvpool__V1__Reply *reply)
{
    Kvpool__V1__OpStats **list = (Kvpool__V1__OpStats **) arena_alloc (
        &ctx->arena, KVP_METRICS_OPS * sizeof (Kvpool__V1__OpStats *));
    if (!list)
        return;
    size_t count = 0;
    for (int op = 0; op < KVP_METRICS_OPS; op++) {
        kvp_op_metrics_t counts;
        metrics_op_read (self->metrics, op, &counts);
        if (!counts.requests)
            continue;
        Kvpool__V1__OpStats *entry =
            (Kvpool__V1__OpStats *) arena_alloc (&ctx->arena, sizeof (Kvpool__V1__OpStats));
        uint64_t *buckets =
            (uint64_t *) arena_alloc (&ctx->arena, KVP_METRICS_BUCKETS * sizeof (uint64_t));
        if (!entry || !buckets)
            return;
        kvpool__v1__op_stats__init (entry);
        entry->op = (Kvpool__V1__Op) op;
        entry->requests = counts.requests;
        entry->failures = counts.failures;
        entry->latency_sum_us = counts.latency_sum_us;
        memcpy (buckets, counts.buckets, sizeof counts.buckets);
        entry->latency_buckets = buckets;
        entry->n_latency_buckets = KVP_METRICS_BUCKETS;
        list[count++] = entry;
    }
    reply->op_stats = list;
    reply->n_op_stats = count;
}

//  Answers a finished client job and destroys it. A GET's values come from the job's pinned
//  objects, or from copies (count of them) when the api read them from the index. What the
//  reply carries is what the operation's row fills (messages/ops.h); its arrays live in the
//  request's arena, which goes with the request.
void
api_reply (api_t *self, kvp_job_t **job_p, zmq_msg_t *copies)
{
    kvp_job_t *job = *job_p;
    api_ctx_t *ctx = (api_ctx_t *) job->context;
    const kvp_op_t *row = ctx->row;
    Kvpool__V1__Request *request = ctx->request;
    Kvpool__V1__Reply reply = KVPOOL__V1__REPLY__INIT;
    Kvpool__V1__Stats stats = KVPOOL__V1__STATS__INIT;
    reply.version = KVP_PROTOCOL_VERSION;
    reply.request_id = request->request_id;
    reply.op = request->op;
    reply.status = job->status;
    reply.error = job->error;
    reply.count = job->result_count;
    reply.kept = job->result_kept;
    if ((row->fills & REPLY_NODES) && !job->cluster)
        s_name_self (self, job);
    if (reply_encode (&ctx->arena, row, job, &reply) != 0) {
        reply.status = kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "out of memory for the reply");
        reply.n_statuses = reply.n_sizes = reply.n_replicas = reply.n_segments = 0;
    }
    if (row->fills & REPLY_RDMA) {
        reply.rdma_data.data = job->rdma_connect.data;
        reply.rdma_data.len = job->rdma_connect.size;
        reply.rdma_conn = job->rdma_conn;
    }
    if (row->fills & REPLY_NODE) {
        reply.host_id = self->host_id;
        reply.server_id = self->server_id;
        //  The index's memfd name, once the replica-manager has made it.
        if (self->index_name[0] && !self->index_published[0])
            shm_index_published_name (self->index_name, self->index_published,
                                      sizeof self->index_published);
        reply.index_name = self->index_published;
        reply.local_endpoint = self->local_endpoint;
        reply.cluster = self->cluster;
    }
    if ((row->fills & REPLY_DRAIN) && job->payload == KVP_PAYLOAD_DRAIN) {
        reply.drain_short = job->drain.short_count;
        reply.draining = job->drain.draining;
    }
    if ((row->fills & REPLY_SETTING) && job->config.setting
        && (reply.setting_value = (char *) arena_alloc (&ctx->arena, 1024)))
        kvp_config_value (self->config, job->config.setting, reply.setting_value, 1024);
    if (row->fills & REPLY_STATS) {
        api_complete_stats (self, kvp_job_stats (job));
        reply_stats (kvp_job_stats (job), &stats);
        reply.stats = &stats;
        kvp_master_link_t link;
        metrics_link_read (self->metrics, zclock_mono (), &link);
        char *master = link.node ? (char *) arena_alloc (&ctx->arena, sizeof link.endpoint) : NULL;
        if (master) {
            memcpy (master, link.endpoint, sizeof link.endpoint);
            reply.master_endpoint = master;
        }
        s_op_stats (self, ctx, &reply);
    }
    bool values = (row->fills & REPLY_VALUES) && reply.status == KVPOOL_OK && job->count > 0;
    kvp_debug ("request %llu %s: %zu keys, status %s", (unsigned long long) request->request_id,
               row->name, job->count, kvp_status_name (job->status));
    bool sent = s_send_header (self, ctx, &reply, values) == 0;
    if (sent && values) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < job->count; i++)
            if (job->items[i].status == KVPOOL_OK)
                bytes += job->items[i].size;
        metrics_bytes_out (self->metrics, api_transport (ctx), bytes);
    }
    if (copies)
        s_send_copies (ctx->socket, copies, job->count, sent && values);
    else if (sent && values)
        s_send_values (self, job);
    else
        api_unpin_items (job);
    api_ctx_destroy (&ctx);
    kvp_job_destroy (job_p);
}
