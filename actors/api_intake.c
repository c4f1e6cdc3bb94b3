/*  api_intake.c - requests into the api (api_self.h): a client message decoded, checked
    against its operation's row (what it must carry, who may send it), and made a job;
    jobs of in-process actors (the lookup server) checked the same way. A request the
    checks refuse is answered here, before anything is placed or copied.

    Threads: the api's.
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

//  After answering a request it served alone (a read from the index, an exist, a ping), the
//  api keeps polling for the next one (--spin-us, adapting as the replica-manager's window
//  does), if that request was at most this big: a larger one takes libzmq's I/O thread far
//  longer to read than the window, and a spinning api would only take a core from that
//  thread and from the copies.
#define IDLE_SPIN_REQUEST_BYTES (64 << 10)

void
api_ctx_destroy (api_ctx_t **ctx_p)
{
    api_ctx_t *ctx = *ctx_p;
    if (!ctx)
        return;
    zframe_destroy (&ctx->routing_id);
    if (ctx->owner)
        ctx->owner->jobs_out--;
    arena_fini (&ctx->arena);
    zmsg_destroy (&ctx->values);
    free (ctx);
    *ctx_p = NULL;
}

//  ---- requests ----------------------------------------------------------------------

//  FNV-1a of a string: a credential's share of an owner id.
static uint64_t
s_hash (const char *text)
{
    uint64_t hash = 14695981039346656037ULL;
    for (; *text; text++)
        hash = (hash ^ (uint8_t) *text) * 1099511628211ULL;
    return hash | 1; //  never 0, with or without the node bit
}

//  An ipc client of the node's own user, root, or the --group the node was given.
static bool
s_user_allowed (api_t *self, const peer_t *peer)
{
    return peer->uid == 0 || peer->uid == geteuid ()
           || (self->config->group_set && peer->gid == self->config->group);
}

//  Who may do what: sets ctx->owner for a same-machine operation. Returns 0, or -1 with a
//  reason (status PERMISSION_DENIED).
static int
s_authorize (api_t *self, api_ctx_t *ctx, char *reason, size_t size)
{
    Kvpool__V1__Request *request = ctx->request;
    unsigned flags = ctx->row->flags;
    const peer_t *peer = &ctx->peer;
    if (peer->kind == PEER_LOCAL && !(flags & OP_ANYONE) && !s_user_allowed (self, peer)) {
        snprintf (reason, size, "user %u may not use this node (it runs as user %u)",
                  (unsigned) peer->uid, (unsigned) geteuid ());
        return -1;
    }
    if (ctx->socket == self->peer && (flags & (OP_PEER | OP_NODES))) {
        //  Another node, on the data plane (whose door admits only the cluster's nodes): its
        //  reservations are its own, by the credential its connection proved, so no other
        //  connection can write into, end or revoke them.
        ctx->node_owner = KVP_OWNER_NODE | (s_hash (ctx->user_id) & ~KVP_OWNER_NODE);
        return 0;
    }
    if ((flags & OP_NODES) && peer->kind != PEER_INPROC) {
        snprintf (reason, size,
                  "operation %s is for the cluster's nodes, on the data plane: no client may "
                  "use it",
                  ctx->row->name);
        return -1;
    }
    if (!(flags & OP_LOCAL) || peer->kind == PEER_INPROC)
        return 0;
    if (peer->kind == PEER_REMOTE) {
        snprintf (reason, size,
                  "operation %s works on the node's shared memory: only a client on the "
                  "node's ipc endpoint (%.80s) may use it",
                  ctx->row->name, self->local_endpoint[0] ? self->local_endpoint : "none");
        return -1;
    }
    ctx->owner = owners_get (self->owners, peer->pid);
    if (!ctx->owner) {
        snprintf (reason, size, "the node cannot follow client process %d: %s", (int) peer->pid,
                  peer->pid ? strerror (errno) : "not visible from the node's pid namespace");
        return -1;
    }
    ctx->owner->jobs_out++;
    if (request->op == KVPOOL__V1__OP__MOUNT_SEGMENT) {
        //  The node opens the name itself: it must be a descriptor of the asking process,
        //  never another's that the node (often root) could open and the client could not.
        const char *name = request->segment->name ? request->segment->name : "";
        int pid, fd;
        char tail;
        if (sscanf (name, "/proc/%d/fd/%d%c", &pid, &fd, &tail) != 2 || pid != peer->pid) {
            snprintf (reason, size,
                      "a client mounts only its own memory: /proc/%d/fd/<fd> of a sealed memfd, "
                      "not %.60s",
                      (int) peer->pid, name);
            return -1;
        }
    }
    return 0;
}

//  Validates a decoded request and builds its job. Returns NULL after replying an error.
//  CONFIG: the setting read, or changed here first (checked against the settings table; the
//  log level applies at once), then in the actors that read it (the row's stages). Returns
//  0, or -1 with why.
static int
s_config (api_t *self, const Kvpool__V1__Request *request, kvp_job_t *job, char *why,
          size_t why_size)
{
    const char *name = request->setting;
    char value[64];
    if (!name || !*name || kvp_config_value (self->config, name, value, sizeof value) != 0) {
        snprintf (why, why_size, "no setting '%s' (kvpoold --help lists them, without --)",
                  name ? name : "");
        return -1;
    }
    const char *change =
        request->setting_value && *request->setting_value ? request->setting_value : NULL;
    if (change) {
        if (kvp_config_change (&self->settings, name, change, why, why_size) != 0)
            return -1;
        kvp_log_level_t level;
        if (!strcmp (name, "log-level")
            && kvp_log_level_parse (self->settings.log_level, &level) == 0)
            kvp_log_setup (level, self->settings.log_syslog, "kvpoold");
        //  One switch for the whole process: the copy workers, the data plane's workers and
        //  the cluster actor read it as they go (transfer/value_checksum.h).
        if (!strcmp (name, "verify-checksums"))
            value_checksum_set_verify (api_checksums_wanted (&self->settings));
        kvp_info ("setting %s changed to %s", name, change);
    }
    kvp_job_payload (job, KVP_PAYLOAD_CONFIG);
    job->config.setting = name;
    job->config.value = change;
    return 0;
}

static kvp_job_t *
s_job_from_request (api_t *self, api_ctx_t *ctx)
{
    Kvpool__V1__Request *request = ctx->request;
    int op = request->op;
    uint64_t id = request->request_id;
    size_t value_frames = ctx->values ? zmsg_size (ctx->values) : 0;
    char reason[256];

    uint64_t value_bytes = 0;
    if (ctx->values)
        for (zframe_t *frame = zmsg_first (ctx->values); frame; frame = zmsg_next (ctx->values))
            value_bytes += zframe_size (frame);
    request_limits_t limits = {self->config->max_key_len, self->config->max_value_size,
                               self->config->max_keys, self->config->max_request_bytes};
    int status = request_check (request, value_frames, value_bytes, &limits, reason, sizeof reason);
    //  (known once the check passed)
    kvp_via_t via = request->rdma_conn    ? KVP_VIA_RDMA
                    : request->n_vm_addrs ? KVP_VIA_VM
                    : ctx->cluster        ? KVP_VIA_CLUSTER
                                          : KVP_VIA_PROCESS;
    ctx->row = kvp_op_route (op, via, ctx->cluster);
    if (status == KVPOOL_OK && s_authorize (self, ctx, reason, sizeof reason))
        status = KVPOOL_PERMISSION_DENIED;
    //  Values by address are read from a process the kernel named (the ipc peer), and only
    //  for a peer of the node's own user: a node with more rights than its client (root, or
    //  CAP_SYS_PTRACE under Yama) must not read for it what it could not read itself (a
    //  forked child speaking on its parent's connection). A node of a cluster places its
    //  puts at the master, which this row does not.
    if (status == KVPOOL_OK && request->n_vm_addrs
        && (!ctx->owner || !ctx->owner->pid || ctx->peer.uid != geteuid ())) {
        snprintf (reason, sizeof reason,
                  "values by address (vm_addrs) are read only from a client process of the "
                  "node's own user that the node can see");
        status = KVPOOL_PERMISSION_DENIED;
    }
    //  A value's version is the store's to give: only another node's write on the data
    //  plane carries the one the master gave it.
    if (status == KVPOOL_OK && request->n_versions && (ctx->row->flags & OP_WRITE)
        && !(self->peer && ctx->socket == self->peer)) {
        snprintf (reason, sizeof reason,
                  "versions are given by the store: a write may not name its own");
        status = KVPOOL_INVALID_PARAMS;
    }
    if (status == KVPOOL_OK && request->n_vm_addrs && ctx->cluster) {
        snprintf (reason, sizeof reason, "a node of a cluster takes no values by address");
        status = KVPOOL_INVALID_PARAMS;
    }
    if (status != KVPOOL_OK) {
        //  libzmq had the frames in memory already (it delivers a message whole); what it
        //  can refuse before reading, it did (--max-value-size per frame, RCVHWM). Nothing
        //  is placed or copied for a refused request, and its frames go at once.
        zmsg_destroy (&ctx->values);
        api_reply_error (self, ctx, id, op, status, reason);
        return NULL;
    }
    size_t n = request->n_keys;
    unsigned flags = ctx->row->flags;
    Kvpool__V1__PutOptions *put = request->put;

    kvp_job_t *job = kvp_job_new (KVP_JOB_NONE, n);
    job->op = op;
    job->context = ctx;
    job->cluster = ctx->cluster;
    zframe_t *frame = ctx->values ? zmsg_first (ctx->values) : NULL;
    for (size_t i = 0; i < n; i++) {
        kvp_item_t *item = &job->items[i];
        //  Keys are bytes with a length on the wire. Inside the node they are also
        //  NUL-terminated (hash tables, the index), which is why a NUL byte is refused here
        //  rather than cut the key short.
        const ProtobufCBinaryData *wire = &request->keys[i];
        item->key_len = wire->len;
        if (request_key_check (wire, self->config->max_key_len) != KVPOOL_OK) {
            item->status = KVPOOL_INVALID_KEY;
            item->key = "";
            item->key_len = 0;
        }
        else {
            char *key = (char *) arena_alloc (&ctx->arena, wire->len + 1);
            if (!key) {
                kvp_job_destroy (&job);
                api_reply_error (self, ctx, id, op, KVPOOL_INTERNAL_ERROR, "out of memory");
                return NULL;
            }
            memcpy (key, wire->data, wire->len);
            key[wire->len] = 0;
            item->key = key;
        }
        if (flags & OP_VALUES) {
            item->src = zframe_data (frame);
            item->size = zframe_size (frame);
            frame = zmsg_next (ctx->values);
        }
        else if (flags & OP_SIZES)
            item->size = request->sizes[i];
        if (request->n_vm_addrs)
            item->vm_addr = request->vm_addrs[i];
        //  The writer's checksum of the value (PUT, UPSERT: verified against the frame as it
        //  is copied; PUT_END: taken as the value's, or verified when a node wrote it).
        if (request->n_checksums)
            item->checksums.expect = request->checksums[i];
        if (request->n_versions)
            item->version = request->versions[i];
        if (request->n_offsets) {
            job->opt.ranged = true;
            item->offset = request->offsets[i];
            item->length = request->lengths[i];
        }
        if (flags & OP_RDMA) {
            item->rdma.addr = request->rdma_addrs[i];
            item->rdma.key = request->rdma_keys[i];
            item->rdma.len = request->n_rdma_lengths ? request->rdma_lengths[i] : 0;
            if (!(flags & OP_SIZES))
                item->size = item->length; //  a PUT_PART: its bytes are its range
        }
        if (item->size > self->config->max_value_size && item->status == KVPOOL_OK)
            item->status = KVPOOL_VALUE_TOO_LARGE;
    }
    if (put) {
        job->opt.replica_num = put->replica_num;
        for (size_t p = 0; p < put->n_preferred_segments; p++)
            job->opt.preferred[job->opt.preferred_count++] = put->preferred_segments[p];
        job->opt.soft_pin = put->soft_pin;
        job->opt.soft_pin_ttl_ms = put->soft_pin_ttl_ms;
        job->opt.hard_pin = put->hard_pin;
    }
    job->opt.force = request->force;
    job->opt.pin = request->pin;
    job->opt.redirect = request->redirect;
    //  A node that reads for its own client counts that get itself (a hit once it has the
    //  value); the holder it read from does not count it again.
    job->opt.peer = self->peer && ctx->socket == self->peer;
    job->rdma_conn = request->rdma_conn;
    //  The payload of the operation's own kind (kvp_job.h): only the operation that reads it
    //  carries it.
    if (op == KVPOOL__V1__OP__PREFIX_MATCH && kvp_job_payload (job, KVP_PAYLOAD_PREFIX))
        job->prefix.ranks = request->ranks ? request->ranks : 1;
    if (op == KVPOOL__V1__OP__REMOVE_BY_REGEX && kvp_job_payload (job, KVP_PAYLOAD_REGEX))
        job->regex.pattern = request->pattern;
    if (op == KVPOOL__V1__OP__DRAIN) {
        const char *action = request->pattern ? request->pattern : "";
        const char *why = !self->cluster ? "a one-process store has no other node to drain to"
                          : request->n_keys != 1 ? "DRAIN names one node (keys[0])"
                          : *action && strcmp (action, "start") && strcmp (action, "stop")
                              ? "DRAIN's pattern is \"start\", \"stop\" or \"\" (ask)"
                              : NULL;
        if (why) {
            kvp_job_destroy (&job);
            api_reply_error (self, ctx, id, op, KVPOOL_INVALID_PARAMS, why);
            return NULL;
        }
        kvp_job_payload (job, KVP_PAYLOAD_DRAIN);
        job->drain.action = action;
    }
    if (op == KVPOOL__V1__OP__RDMA_CONNECT && kvp_job_payload (job, KVP_PAYLOAD_RDMA_CONNECT)
        && request->rdma_data.len) {
        job->rdma_connect.data = (uint8_t *) malloc (request->rdma_data.len);
        if (!job->rdma_connect.data) {
            kvp_job_destroy (&job);
            api_reply_error (self, ctx, id, op, KVPOOL_INTERNAL_ERROR, "out of memory");
            return NULL;
        }
        memcpy (job->rdma_connect.data, request->rdma_data.data, request->rdma_data.len);
        job->rdma_connect.size = request->rdma_data.len;
    }
    if (op == KVPOOL__V1__OP__TOUCH) {
        self->client_index_gets += request->reads;
        self->client_listed += request->listed_reads;
        self->client_misses += request->read_misses;
        //  (at most its reads: a count past them is no read of a cache copy)
        self->client_cache_hits +=
            request->cache_reads < request->reads ? request->cache_reads : request->reads;
    }
    if (op == KVPOOL__V1__OP__CONFIG) {
        char why[300];
        if (s_config (self, request, job, why, sizeof why) != 0) {
            kvp_job_destroy (&job);
            api_reply_error (self, ctx, id, op, KVPOOL_INVALID_PARAMS, why);
            return NULL;
        }
    }
    if (request->segment && kvp_job_payload (job, KVP_PAYLOAD_SEGMENT)) {
        job->segment.id = request->segment->id;
        job->segment.name = request->segment->name;
        job->segment.size = request->segment->size;
        //  A segment belongs to the process that mounted it, by the kernel's word; only an
        //  in-process client names an owner itself. An unmount names who asks (NULL: the node).
        if (op == KVPOOL__V1__OP__MOUNT_SEGMENT)
            job->segment.owner = ctx->owner ? ctx->owner->name : request->segment->owner;
        else
            job->segment.owner = ctx->owner ? ctx->owner->name : NULL;
    }
    job->owner_id = ctx->owner ? ctx->owner->id : ctx->node_owner;
    if (request->n_vm_addrs) {
        job->vm.pid = (int32_t) ctx->owner->pid;
        job->vm.pidfd = ctx->owner->pidfd;
        job->vm.deadline_ns = request->vm_deadline_ns;
    }
    return job;
}

//  Answers a small read from the read index, without the replica-manager (index_reads.h).
//  Returns true when the job was answered (and destroyed).
static bool
s_serve_from_index (api_t *self, kvp_job_t *job)
{
    api_ctx_t *ctx = (api_ctx_t *) job->context;
    bool values = (ctx->row->fills & REPLY_VALUES) != 0;
    if (!self->reads || job->count > (values ? INDEX_READ_KEYS_MAX : INDEX_CHECK_KEYS_MAX)
        || !(ctx->row->flags & OP_INDEX) || job->opt.ranged)
        return false;
    //  Not before the master has confirmed what the node holds (infra/config.h): the
    //  replica-manager answers, and sends the read where the master says.
    if (kvp_lease_suspended (self->config->lease, zclock_mono ()))
        return false;
    zmq_msg_t small[8];
    zmq_msg_t *copies = NULL;
    if (values)
        copies = job->count <= 8 ? small : (zmq_msg_t *) malloc (job->count * sizeof *copies);
    bool served = (!values || copies) && index_reads_serve (self->reads, job, copies);
    if (served)
        api_reply (self, &job, copies);
    if (copies != small)
        free (copies);
    return served;
}

static void
s_handle_request (api_t *self, api_ctx_t *ctx)
{
    kvp_job_t *job = s_job_from_request (self, ctx);
    if (!job) {
        api_ctx_destroy (&ctx);
        return;
    }
    if (ctx->row->fills & REPLY_VALUES) {
        connection_t *connection =
            connections_get (self->connections, zframe_data (ctx->routing_id),
                             zframe_size (ctx->routing_id), ctx->fd);
        if (connection_over (self->connections, connection)) {
            char reason[160];
            snprintf (reason, sizeof reason,
                      "%llu bytes of earlier replies are still unread (--max-unread-bytes)",
                      (unsigned long long) connection_unread (connection));
            kvp_job_destroy (&job);
            api_reply_error (self, ctx, ctx->request->request_id, ctx->request->op,
                             KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, reason);
            api_ctx_destroy (&ctx);
            return;
        }
    }
    if (s_serve_from_index (self, job))
        return;
    //  Objects are immutable: a put of a key the index shows is refused before any space is
    //  placed or byte copied.
    if (self->reads && (ctx->row->flags & OP_NEW))
        index_reads_refuse_existing (self->reads, job);
    api_start (self, job);
}

void
api_client_message (api_t *self, zsock_t *socket)
{
    zmsg_t *msg = zmsg_recv (socket);
    if (!msg)
        return;
    uint64_t wire_bytes = zmsg_content_size (msg);
    size_t wire_frames = zmsg_size (msg);
    self->idle_spin = zmsg_content_size (msg) <= IDLE_SPIN_REQUEST_BYTES;
    api_ctx_t *ctx = (api_ctx_t *) zmalloc (sizeof (api_ctx_t));
    ctx->socket = socket;
    ctx->cluster = self->cluster && socket == self->router;
    ctx->routing_id = zmsg_pop (msg);
    ctx->fd = -1;
    ctx->arrived_us = zclock_usecs ();
    zframe_t *header = zmsg_pop (msg);
    if (header && zframe_size (header) == 0 && zmsg_size (msg) > 0) {
        //  REQ clients put an empty delimiter before the body.
        ctx->envelope = true;
        zframe_destroy (&header);
        header = zmsg_pop (msg);
    }
    if (header) {
        //  Properties of the connection a frame came on: libzmq's Peer-Address (with the
        //  kernel's credentials on ipc) and "__fd", its socket (what ZMQ_SRCFD reads; the
        //  routing id frame does not always carry them).
        ctx->peer = owners_peer (zframe_meta (header, "Peer-Address"));
        //  The credential the connection's handshake proved (curve.h), where one did.
        const char *user = zframe_meta (header, "User-Id");
        snprintf (ctx->user_id, sizeof ctx->user_id, "%s", user ? user : "");
        const char *fd = zframe_meta (header, "__fd");
        if (fd)
            ctx->fd = atoi (fd);
        if (socket == self->router)
            conn_guard_read (self->guard, ctx->fd, wire_bytes, wire_frames);
    }
    if (!ctx->routing_id || !header
        || !key_watch_seen (socket == self->peer ? self->node_keys : self->client_keys, ctx->fd,
                            ctx->user_id)) {
        //  Nothing to answer: a message of one frame can't hold a request; a revoked key's
        //  connection is being closed (key_watch.h).
        self->dropped++;
        zframe_destroy (&header);
        zmsg_destroy (&msg);
        api_ctx_destroy (&ctx);
        return;
    }
    arena_init (&ctx->arena, zframe_size (header));
    ctx->request = kvpool__v1__request__unpack (arena_allocator (&ctx->arena), zframe_size (header),
                                                zframe_data (header));
    zframe_destroy (&header);
    if (!ctx->request) {
        zmsg_destroy (&msg);
        api_reply_error (self, ctx, 0, 0, KVPOOL_PROTOCOL_ERROR,
                         "frame 0 is not a kvpool.v1.Request");
        api_ctx_destroy (&ctx);
        return;
    }
    if (zmsg_size (msg)) {
        metrics_bytes_in (self->metrics, api_transport (ctx), zmsg_content_size (msg));
        ctx->values = msg;
    }
    else
        zmsg_destroy (&msg);
    s_handle_request (self, ctx);
}

//  ---- jobs of in-process actors -----------------------------------------------------

//  A job from an actor of this process (the lookup server): the same operations as a
//  client's, with the same checks on its keys, answered by sending the job back.
void
api_job_message (api_t *self)
{
    zframe_t *routing_id = NULL;
    kvp_job_t *job = kvp_job_recv_routed (self->jobs, &routing_id);
    if (!job) {
        zframe_destroy (&routing_id);
        return;
    }
    //  A cluster node's repair actor sends its copies (KVP_OP_REPAIR_FILL) this way too.
    bool repair = self->cluster && job->op == KVP_OP_REPAIR_FILL;
    const kvp_op_t *row =
        repair ? kvp_op (job->op)
               : kvp_op_route (job->op, self->cluster ? KVP_VIA_CLUSTER : KVP_VIA_PROCESS,
                               self->cluster);
    //  Only the proto's operations that carry keys or nothing; not a write (values live in
    //  the caller), not the node's own operations (but a repair), not one on shared memory.
    if (!row || (job->op <= 0 && !repair)
        || (row->flags & (OP_VALUES | OP_SIZES | OP_SEGMENT | OP_LOCAL)) || job->context
        || job->kind != KVP_JOB_NONE)
        kvp_job_fail (job, KVPOOL_INVALID_PARAMS, "operation %d is not served to actors", job->op);
    else if (self->draining)
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "the node is stopping");
    else if (job->count > self->config->max_keys)
        kvp_job_fail (job, KVPOOL_INVALID_PARAMS, "%zu keys: at most %llu", job->count,
                      (unsigned long long) self->config->max_keys);
    if (job->status != KVPOOL_OK) {
        if (api_reply_job (self, &routing_id, job) != 0) {
            zframe_destroy (&routing_id);
            kvp_job_destroy (&job);
        }
        return;
    }
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        ProtobufCBinaryData key = {item->key_len, (uint8_t *) item->key};
        if (!item->key || request_key_check (&key, self->config->max_key_len) != KVPOOL_OK)
            item->status = KVPOOL_INVALID_KEY;
    }
    api_ctx_t *ctx = (api_ctx_t *) zmalloc (sizeof (api_ctx_t));
    ctx->routing_id = routing_id;
    ctx->from_jobs = true;
    ctx->row = row;
    ctx->cluster = self->cluster;
    job->cluster = self->cluster;
    ctx->fd = -1;
    job->context = ctx;
    api_start (self, job);
}
