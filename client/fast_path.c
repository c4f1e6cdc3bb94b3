/*  fast_path.c - libkvpool's same-machine path: copy values straight between the caller's
    buffers and the node's shared-memory segments.

    When the node runs on this machine (its PING host_id equals our kvp_host_id), the client
    lists the node's segments (SEGMENTS) and takes each one's mapping from the process
    context (process.h: a segment is mapped once per process, however many connections
    reach its node). Then:
      put   a batch of up to 2 MiB of host memory goes by address: one PUT naming where each
            value lies in this process, which the node reads itself (see "puts by address"
            below). Otherwise PUT_START reserves space and says where every replica goes
            (segment id, offset); the client copies the value into each replica and sends
            PUT_END. A key whose copy cannot be done after PUT_START succeeded is revoked
            (PUT_REVOKE) and handed back to the caller, which puts it over the socket.
      get   a key in the node's read index is copied with no round trip at all; otherwise
            GET_REPLICA_LIST with pin = true says where each value is and holds it in place;
            the client copies from one replica, then sends RELEASE asking for no reply. A key
            on a segment the client cannot map, with no replica in memory (on the node's disk
            only), or not found on a node of a cluster (another may hold it) is handed back:
            the resolver (resolve.c) asks the node for it.
    This layer never sends a value over the socket itself: what it cannot serve goes back
    up, and the layer above decides where it goes next.

    A replica on a segment id the client does not know makes it list the segments again, once
    per call (segments are mounted while clients run). After the socket reconnected (the node
    may have restarted and reused its segment ids) every mapping is let go and the segments
    listed again before a reply's segment ids are trusted. Offsets are checked against the
    segment's size, so a bad reply can never make the client touch memory outside a mapping.
    Batches of KVPC_POOL_MIN_BYTES or more are copied by the connection's copy threads.

    Ordering: a put's bytes are all written before its PUT_END is sent, so no reader can see
    the key before its value is complete; a get's RELEASE is sent only after its copies are
    done; an index read's read stamp (its lease) is written before the read returns.
    RELEASE and TOUCH ask for no reply (kvpc_send_oneway): nothing waits for them, and the
    connection sees that they leave before its socket closes. Only the TOUCH that reports the
    last gets at close waits for its answer (kvpc_index_report).
    Counting: every get this layer concludes (an index read, a value copied through a replica
    list, a key the node said was not found) is reported to the node with a TOUCH, which
    counts it as a hit or a miss; a key handed back is counted by the GET that asks for it.
    Threads: the caller's, plus the connection's copy threads for large copies.
*/
#include "client/fast_path.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/segment_view.h"
#include "protocol/contract.h"
#include "shm/shm_index.h"

struct _kvpc_fast_path_t {
    kvpc_conn_t *conn;
    bool on;                       //  segments are mapped and the fast path is in use
    kvpc_process_t *process;       //  where the mappings are shared (the connection's)
    kvpc_segment_view_t *segments; //  the node's segments as this connection sees them
    char server_id[128];           //  the node whose segments are mapped (SEGMENTS)
    shm_index_t *index;            //  the node's same-machine read index (read-only), or NULL
    bool use_index;                //  reads may be served from it (kvpool_set_index)
    uint64_t index_reads;          //  values read from the index not yet reported in a TOUCH
    uint64_t listed_reads;         //  values copied through a pinned replica list, the same
    uint64_t read_misses;          //  keys the node said were not found, with no GET after
    uint64_t cache_reads;          //  of index_reads, those of cache copies (Request.cache_reads)
    int64_t reported_at;           //  when the last TOUCH reported them (shm_index_clock_ms)
    void *monitor;                 //  PAIR receiving the socket's connect/disconnect events
    uint64_t generation;           //  the connection's socket the monitor watches
    bool by_address_refused;       //  the node took no put by address: PUT_START until it changes
};

static int s_refresh (kvpc_fast_path_t *self, bool strict);

static void
s_table_clear (kvpc_fast_path_t *self)
{
    if (self->segments)
        kvpc_segment_view_clear (self->segments);
    kvpc_process_index_close (self->process, &self->index);
    self->by_address_refused = false; //  another node may take them
}

//  Whether the connection replaced its socket since the monitor was opened: until the
//  segments are listed again over the new one, no replica's segment id is trusted.
static bool
s_stale (kvpc_fast_path_t *self)
{
    return self->generation != kvpc_conn_generation (self->conn);
}

//  ---- watching the connection ------------------------------------------------------------
//  Segment ids are only meaningful to the node that gave them: a node restarted on the same
//  endpoint numbers its new segments from the start again. The socket reconnects by itself,
//  so the client watches its connect/disconnect events and, after any, lists the segments
//  afresh before it trusts a replica's segment id. When the connection replaces the socket
//  itself (kvpc_conn_generation), the new one is watched from the next check on, and that
//  check counts as a change.

static int
s_monitor_open (kvpc_fast_path_t *self)
{
    self->generation = kvpc_conn_generation (self->conn);
    void *socket = kvpc_conn_socket (self->conn);
    if (!socket)
        return -1;
    self->monitor = kvpc_socket_watch (kvpc_conn_context (self->conn), socket,
                                       ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED);
    return self->monitor ? 0 : -1;
}

//  Stops watching (the socket too, unless it is one the connection has closed since).
static void
s_monitor_close (kvpc_fast_path_t *self)
{
    if (!self->monitor)
        return;
    void *socket = kvpc_conn_socket (self->conn);
    if (socket && !s_stale (self))
        zmq_socket_monitor (socket, NULL, 0);
    zmq_close (self->monitor);
    self->monitor = NULL;
}

//  Whether the connection may have changed since the segments were listed. Events queue on
//  the monitor as they happen, before any reply that travels over the new connection, so
//  draining them after a reply tells whether that reply may come from another node.
static bool
s_connection_changed (kvpc_fast_path_t *self)
{
    bool changed = !self->monitor;
    if (s_stale (self)) {
        s_monitor_close (self);
        s_monitor_open (self); //  on failure every check reports a change
        changed = true;
    }
    if (self->monitor) {
        zmq_msg_t event;
        zmq_msg_init (&event);
        while (zmq_msg_recv (&event, self->monitor, ZMQ_DONTWAIT) >= 0)
            changed = true;
        zmq_msg_close (&event);
    }
    return changed;
}

//  After a reply that names segments: if the connection changed, forget every mapping and
//  list the segments again (an empty table on failure: every key then takes the socket).
static void
s_check_connection (kvpc_fast_path_t *self)
{
    if (s_connection_changed (self)) {
        s_table_clear (self);
        self->server_id[0] = 0;
        s_refresh (self, false);
    }
}

//  Lists the node's segments and makes the table match: mappings of segments that did not
//  change are kept, new ones are mapped, gone ones unmapped. strict (only with an empty
//  table): fail unless every segment of the node's own maps. Returns 0, or -1 with the
//  table unchanged.
static int
s_refresh (kvpc_fast_path_t *self, bool strict)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__SEGMENTS;
    kvpc_reply_t reply;
    if (kvpc_call (self->conn, &request, NULL, 0, 0, &reply))
        return -1;
    Kvpool__V1__Reply *msg = reply.msg;
    //  A node that answers from another machine cannot share memory with us.
    if (msg->status != KVPOOL_OK
        || (msg->host_id && *msg->host_id
            && strcmp (msg->host_id, kvpc_conn_host_id (self->conn)) != 0)) {
        kvpc_reply_free (&reply);
        return -1;
    }
    //  Mappings are reused only from the same node (a restarted one reuses segment ids).
    const char *server_id = msg->server_id ? msg->server_id : "";
    bool same_node = strcmp (server_id, self->server_id) == 0;
    size_t count = msg->n_segments;
    segment_listing_t *listing = calloc (count ? count : 1, sizeof *listing);
    if (!listing) {
        free (listing);
        kvpc_reply_free (&reply);
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        Kvpool__V1__Segment *from = msg->segments[i];
        listing[i].id = from->id;
        listing[i].name = from->name;
        listing[i].size = from->size;
        listing[i].device = from->device;
        listing[i].inode = from->inode;
        //  A segment another client mounted may be closed to us (its owner's permissions):
        //  keys on it take the socket. The node's own segments must all map.
        listing[i].required = strict && (!from->owner || !*from->owner);
    }
    uint32_t failed = 0;
    int rc = kvpc_segment_view_update (self->segments, server_id, listing, count, &failed);
    free (listing);
    if (rc) {
        kvpc_set_error (self->conn, "cannot map segment %u", failed);
        kvpc_reply_free (&reply);
        return -1;
    }
    snprintf (self->server_id, sizeof self->server_id, "%s", server_id);
    //  The node's read index: kept while it is the same one, else mapped afresh. Without it
    //  every read asks the node.
    const char *index_name = msg->index_name ? msg->index_name : "";
    if (self->index && (!same_node || strcmp (shm_index_name (self->index), index_name) != 0))
        kvpc_process_index_close (self->process, &self->index);
    if (!self->index && *index_name)
        self->index = kvpc_process_index_open (self->process, server_id, index_name);
    kvpc_reply_free (&reply);
    return 0;
}

kvpc_fast_path_t *
kvpc_fast_path_new (kvpc_conn_t *conn)
{
    kvpc_fast_path_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->conn = conn;
    self->process = kvpc_conn_process (conn);
    self->segments = kvpc_segment_view_new (self->process);
    if (!self->segments) {
        free (self);
        return NULL;
    }
    self->use_index = true;
    self->generation = kvpc_conn_generation (conn);
    return self;
}

void
kvpc_fast_path_destroy (kvpc_fast_path_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpc_fast_path_t *self = *self_p;
    kvpc_fast_path_close (self);
    kvpc_segment_view_destroy (&self->segments);
    free (self);
    *self_p = NULL;
}

int
kvpc_fast_path_open (kvpc_fast_path_t *self)
{
    kvpc_fast_path_close (self);
    //  The monitor first: a reconnect while the segments are listed must not go unseen.
    self->on = s_monitor_open (self) == 0 && s_refresh (self, true) == 0;
    if (!self->on)
        kvpc_fast_path_close (self);
    return self->on ? 0 : -1;
}

void
kvpc_fast_path_close (kvpc_fast_path_t *self)
{
    s_monitor_close (self);
    s_table_clear (self);
    self->server_id[0] = 0;
    self->on = false;
}

bool
kvpc_fast_path_on (kvpc_fast_path_t *self)
{
    return self->on;
}

bool
kvpc_fast_path_use_index (kvpc_fast_path_t *self, bool enabled)
{
    self->use_index = enabled;
    return enabled && self->on && self->index;
}

//  Where size bytes at offset of segment id are in our address space, or NULL when the
//  segment is not mapped or the range does not fit in it.
static void *
s_resolve (kvpc_fast_path_t *self, uint32_t id, uint64_t offset, uint64_t size)
{
    return kvpc_segment_view_resolve (self->segments, id, offset, size);
}

//  Per-key state while a fast call works.
typedef enum {
    KVPC_KEY_DONE,    //  outcome known, nothing to copy
    KVPC_KEY_COPY,    //  every replica it needs resolves
    KVPC_KEY_MISSING, //  a replica is on a segment we cannot reach: use the socket
    KVPC_KEY_FAILED   //  put only: reserved, then failed (revoke, keep the outcome)
} kvpc_key_state_t;

//  A get's source: one of the key's replicas that resolves, starting at a different one for
//  each key so that a batch's reads spread over the replicas.
static const void *
s_get_source (kvpc_fast_path_t *self, Kvpool__V1__KeyReplicas *list, uint64_t size, size_t j)
{
    size_t count = list ? list->n_replicas : 0;
    for (size_t k = 0; k < count; k++) {
        Kvpool__V1__Replica *replica = list->replicas[(j + k) % count];
        const void *source = s_resolve (self, replica->segment_id, replica->offset, size);
        if (source)
            return source;
    }
    return NULL;
}

//  Gets through a pinned replica list (one round trip, RELEASE sent without waiting).
static int
s_fast_get_listed (kvpc_fast_path_t *self, const kvpc_keys_t *keys, const kvpool_buf_t *const *bufs,
                   const size_t *nbufs, int64_t *results, kvpc_keys_t *rest)
{
    if (keys->count == 0)
        return KVPOOL_OK;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__GET_REPLICA_LIST;
    request.n_keys = keys->count;
    request.keys = keys->wire;
    request.pin = true;
    kvpc_reply_t reply;
    int rc = kvpc_call (self->conn, &request, NULL, 0, 0, &reply);
    if (rc == 0) {
        rc = kvpc_reply_check (self->conn, &reply, keys->count,
                               KVPC_NEED_SIZES | KVPC_NEED_REPLICAS);
        if (rc)
            kvpc_reply_free (&reply);
    }
    if (rc) {
        kvpc_fill (keys, results, rc);
        return rc;
    }
    s_check_connection (self);
    Kvpool__V1__Reply *msg = reply.msg;
    kvpc_key_state_t *state = malloc (keys->count * sizeof *state);
    kvpc_keys_t pinned;
    kvpc_keys_init (&pinned);
    kvpc_copies_t copies;
    kvpc_copies_init (&copies);
    if (!state) {
        kvpc_fill (keys, results, KVPOOL_INTERNAL_ERROR);
        rc = KVPOOL_INTERNAL_ERROR;
        goto release;
    }
    size_t missing = 0;
    for (size_t j = 0; j < keys->count; j++) {
        size_t i = keys->index[j];
        int status = kvpc_reply_key_status (&reply, j);
        state[j] = KVPC_KEY_DONE;
        results[i] = status;
        if (status == KVPOOL_OBJECT_NOT_FOUND && kvpc_conn_cluster (self->conn)) {
            //  Not in this node's memory: another node of the cluster may hold it, and a GET
            //  over the socket asks them.
            state[j] = KVPC_KEY_MISSING;
            continue;
        }
        if (status != KVPOOL_OK)
            continue;
        if (kvpc_keys_add_from (&pinned, keys, j))
            results[i] = KVPOOL_INTERNAL_ERROR;
        else if (msg->sizes[j] > INT64_MAX)
            results[i] = KVPOOL_PROTOCOL_ERROR;
        //  Checked before any byte moves: on overflow the caller's buffers stay untouched.
        else if (kvpc_bufs_capacity (bufs[i], nbufs[i]) < msg->sizes[j])
            results[i] = KVPOOL_BUFFER_OVERFLOW;
        else if (msg->sizes[j] == 0)
            results[i] = 0;
        else if (s_get_source (self, msg->replicas[j], msg->sizes[j], j))
            state[j] = KVPC_KEY_COPY;
        else {
            //  No replica at all: on the node's disk only, read over the socket. Segments
            //  listed again only for a replica that did not resolve.
            state[j] = KVPC_KEY_MISSING;
            if (msg->replicas[j] && msg->replicas[j]->n_replicas)
                missing++;
        }
    }
    //  Sources are looked up again after a refresh, which may unmap segments.
    if (missing && s_refresh (self, false) == 0) {
        for (size_t j = 0; j < keys->count; j++)
            if (state[j] == KVPC_KEY_COPY || state[j] == KVPC_KEY_MISSING)
                state[j] = s_get_source (self, msg->replicas[j], msg->sizes[j], j)
                               ? KVPC_KEY_COPY
                               : KVPC_KEY_MISSING;
    }
    for (size_t j = 0; j < keys->count; j++) {
        size_t i = keys->index[j];
        //  The gets concluded here (the node counts none of a replica list's keys): a key
        //  found is a hit whatever the copy does; one not found, a miss. A key handed back
        //  is counted by the GET that asks for it.
        int status = kvpc_reply_key_status (&reply, j);
        if (state[j] != KVPC_KEY_MISSING && status == KVPOOL_OK)
            self->listed_reads++;
        else if (state[j] != KVPC_KEY_MISSING && status == KVPOOL_OBJECT_NOT_FOUND)
            self->read_misses++;
        if (state[j] == KVPC_KEY_MISSING) {
            if (kvpc_keys_add_from (rest, keys, j))
                results[i] = KVPOOL_INTERNAL_ERROR;
        }
        else if (state[j] == KVPC_KEY_COPY) {
            const void *source = s_get_source (self, msg->replicas[j], msg->sizes[j], j);
            if (kvpc_copies_scatter (&copies, source, msg->sizes[j], bufs[i], nbufs[i]))
                results[i] = KVPOOL_INTERNAL_ERROR;
            else
                results[i] = (int64_t) msg->sizes[j];
        }
    }
    //  An out-of-memory mid-plan leaves some copies listed for keys reported as failed;
    //  running them anyway only writes into those keys' own buffers.
    if (kvpc_copies_run (self->conn, &copies))
        //  A device copy failed (the last error says why): no key copied here is sure to
        //  have its bytes.
        for (size_t j = 0; j < keys->count; j++)
            if (state[j] == KVPC_KEY_COPY)
                results[keys->index[j]] = KVPOOL_INVALID_PARAMS;
    rc = msg->status;

release:
    if (pinned.count) {
        Kvpool__V1__Request release = KVPOOL__V1__REQUEST__INIT;
        release.op = KVPOOL__V1__OP__RELEASE;
        release.n_keys = pinned.count;
        release.keys = pinned.wire;
        //  No reply wanted: the pins only have to go. They belong to this process, so one
        //  lost with a reset socket ends when the process does.
        kvpc_send_oneway (self->conn, &release);
    }
    kvpc_copies_fini (&copies);
    kvpc_keys_fini (&pinned);
    free (state);
    kvpc_reply_free (&reply);
    return rc;
}

//  ---- the same-machine read index ----------------------------------------------------
//  Keys the node published in its index are read with no round trip at all: look up,
//  copy, confirm the slot did not change during the copy (shm_index.h). Whatever is not
//  there, or changed under us, takes the replica-list path. A miss alone is never taken as
//  "not found" (the index is lossy), but a node that vouches for absent keys lets its
//  readers answer "absent" for a key found neither in its slots nor among the unlisted
//  (shm_index.h, "Absent keys"): a get is then not found, and counted a miss.
//
//  A read grants its object a lease (as a GET over the socket would) without a message:
//  confirming the slot leaves the time of the read in its read stamp, which the node looks
//  at before it removes the object. The node's stats still count these reads: a TOUCH
//  nobody waits for carries their number, at most once per KVP_READS_REPORT_MS.
//
//  The node counts every GET it answers as a get, but never a GET_REPLICA_LIST: only the
//  client knows whether it copied the value itself or asks for it with a GET after all. So
//  the same TOUCH carries the rest of this path's gets (Request.listed_reads, read_misses),
//  and a key handed back to the socket is left for the node's GET to count: each get once.

//  Whether gets are waiting to be reported.
static bool
s_reads_pending (kvpc_fast_path_t *self)
{
    return self->index_reads || self->listed_reads || self->read_misses;
}

//  Puts the gets waiting to be reported into request, and forgets them.
static void
s_reads_take (kvpc_fast_path_t *self, Kvpool__V1__Request *request)
{
    request->reads = self->index_reads;
    request->listed_reads = self->listed_reads;
    request->read_misses = self->read_misses;
    request->cache_reads = self->cache_reads;
    self->index_reads = self->listed_reads = self->read_misses = self->cache_reads = 0;
}

//  Puts back gets a TOUCH that could not be sent carried, for the next one.
static void
s_reads_keep (kvpc_fast_path_t *self, const Kvpool__V1__Request *request)
{
    self->index_reads += request->reads;
    self->listed_reads += request->listed_reads;
    self->read_misses += request->read_misses;
    self->cache_reads += request->cache_reads;
}

//  Sends a TOUCH nobody waits for with the count of values read from the index since the
//  last one (the node's stats count them as gets), if the last was long enough ago; the
//  count otherwise waits for the next, or for kvpc_index_report.
static void
s_reads_report (kvpc_fast_path_t *self, int64_t now)
{
    if (!s_reads_pending (self) || !kvpc_conn_socket (self->conn)
        || (self->reported_at && now - self->reported_at < KVP_READS_REPORT_MS))
        return;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__TOUCH;
    s_reads_take (self, &request);
    if (kvpc_send_oneway (self->conn, &request) == 0)
        self->reported_at = now;
    else
        s_reads_keep (self, &request);
}

void
kvpc_index_report (kvpc_fast_path_t *self)
{
    //  The one TOUCH that waits for its answer. Sent one-way, it would reach the node a
    //  moment after the connection closed, and a STATS asked at once on another connection
    //  could be answered first, without these reads (measured: in 1 to 28 % of tries on a
    //  busy machine). So the reads are in the node's stats when kvpool_destroy returns.
    if (!s_reads_pending (self) || !kvpc_conn_socket (self->conn))
        return;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__TOUCH;
    s_reads_take (self, &request);
    kvpc_reply_t reply;
    if (kvpc_call_brief (self->conn, &request, KVPC_CLOSE_WAIT_MS, &reply) == 0)
        kvpc_reply_free (&reply);
}

//  Starts a batch of read-index lookups of keys, with the lengths the request holds.
static void
s_index_batch (kvpc_fast_path_t *self, shm_index_batch_t *batch, const kvpc_keys_t *keys)
{
    shm_index_batch_start_step (batch, self->index, (const char *const *) keys->keys,
                                &keys->wire[0].len, sizeof keys->wire[0], keys->count);
}

//  Whether the connection may have changed, without acting on it (kvpc_index_answer sends
//  nothing): events wait on the monitor (left there for s_check_connection, which the full
//  call that follows runs), or the socket was replaced.
static bool
s_connection_may_have_changed (kvpc_fast_path_t *self)
{
    if (!self->monitor || s_stale (self))
        return true;
    int events = 0;
    size_t size = sizeof events;
    return zmq_getsockopt (self->monitor, ZMQ_EVENTS, &events, &size) != 0 || (events & ZMQ_POLLIN);
}

//  Whether a key the index says is absent may be answered so: one with a NUL inside its
//  length is not a key the node takes, and the node's refusal (INVALID_KEY) is the answer.
//  (The calls with lengths trust the caller to pass none, but a binding may pass any bytes.)
static bool
s_plain_key (const char *key, size_t len)
{
    return memchr (key, 0, len) == NULL;
}

//  kvpc_index_probe's lookups; absence: whether keys absent from the index may be answered
//  so. Returns false if an answer of absence given does not stand (the node moved a key
//  while we looked): kvpc_index_probe asks again without them.
static bool
s_index_probe (kvpc_fast_path_t *self, const kvpc_keys_t *keys, bool as_size, int64_t *results,
               kvpc_keys_t *rest, bool absence)
{
    //  An EXIST or GET_SIZE is a read too: confirmed, it is stamped (its lease).
    int64_t now = shm_index_clock_ms ();
    bool use = self->index && self->use_index && !s_stale (self);
    shm_index_batch_t batch;
    if (use)
        s_index_batch (self, &batch, keys);
    size_t absent = 0;
    for (size_t j = 0; j < keys->count; j++) {
        size_t i = keys->index[j];
        shm_index_hit_t hit;
        shm_index_find_t found = use ? shm_index_batch_find (&batch, j, &hit) : SHM_INDEX_ASK;
        if (found == SHM_INDEX_FOUND && hit.size <= INT64_MAX && shm_index_confirm (&hit, now))
            results[i] = as_size ? (int64_t) hit.size : 1;
        else if (found == SHM_INDEX_ABSENT && absence
                 && s_plain_key (keys->keys[j], keys->wire[j].len)) {
            results[i] = as_size ? KVPOOL_OBJECT_NOT_FOUND : 0;
            absent++;
        }
        else if (kvpc_keys_add_from (rest, keys, j))
            results[i] = KVPOOL_INTERNAL_ERROR;
    }
    return !absent || shm_index_batch_absent_holds (&batch);
}

void
kvpc_index_probe (kvpc_fast_path_t *self, const kvpc_keys_t *keys, bool as_size, int64_t *results,
                  kvpc_keys_t *rest)
{
    s_check_connection (self);
    if (!s_index_probe (self, keys, as_size, results, rest, true)) {
        //  (Rare. The keys found are looked up again.)
        kvpc_keys_fini (rest);
        kvpc_keys_init (rest);
        s_index_probe (self, keys, as_size, results, rest, false);
    }
}

//  kvpc_index_answer's lookups; absence: whether keys absent from the index may be
//  answered so. Returns how many keys are left, or SIZE_MAX if an answer of absence given
//  does not stand (kvpc_index_answer asks again without them).
static size_t
s_index_answer (kvpc_fast_path_t *self, size_t n, const char *const *keys, const size_t *lens,
                int *exists, int64_t *sizes, size_t *rest, bool absence)
{
    size_t left = 0, absent = 0;
    bool use = self->on && self->index && self->use_index && !s_connection_may_have_changed (self);
    int64_t now = use ? shm_index_clock_ms () : 0;
    shm_index_batch_t batch;
    if (use)
        shm_index_batch_start_step (&batch, self->index, keys, lens, sizeof *lens, n);
    for (size_t i = 0; i < n; i++) {
        shm_index_hit_t hit;
        //  Every key is looked up, in order (the batch loads ahead); one whose byte at its
        //  length is not its NUL is not the key its length says.
        shm_index_find_t found = use ? shm_index_batch_find (&batch, i, &hit) : SHM_INDEX_ASK;
        if (keys[i][lens[i]] != 0) {
            if (exists)
                exists[i] = KVPOOL_INVALID_KEY;
            else
                sizes[i] = KVPOOL_INVALID_KEY;
        }
        else if (found == SHM_INDEX_FOUND && hit.size <= INT64_MAX
                 && shm_index_confirm (&hit, now)) {
            if (exists)
                exists[i] = 1;
            else
                sizes[i] = (int64_t) hit.size;
        }
        else if (found == SHM_INDEX_ABSENT && absence && s_plain_key (keys[i], lens[i])) {
            if (exists)
                exists[i] = 0;
            else
                sizes[i] = KVPOOL_OBJECT_NOT_FOUND;
            absent++;
        }
        else
            rest[left++] = i;
    }
    return absent && !shm_index_batch_absent_holds (&batch) ? SIZE_MAX : left;
}

size_t
kvpc_index_answer (kvpc_fast_path_t *self, size_t n, const char *const *keys, const size_t *lens,
                   int *exists, int64_t *sizes, size_t *rest)
{
    size_t left = s_index_answer (self, n, keys, lens, exists, sizes, rest, true);
    //  (Rare: the node moved a key while we looked. The keys found are looked up again.)
    if (left == SIZE_MAX)
        left = s_index_answer (self, n, keys, lens, exists, sizes, rest, false);
    return left;
}

//  Gets through the read index first, then a pinned replica list for what it did not serve.
static int
s_fast_get_indexed (kvpc_fast_path_t *self, const kvpc_keys_t *keys, const kvpc_sink_t *sink,
                    int64_t *results, kvpc_keys_t *rest)
{
    const kvpool_buf_t *const *bufs = sink->bufs;
    const size_t *nbufs = sink->nbufs;
    kvpc_keys_t listed; //  keys the index did not serve: asked where they are
    kvpc_keys_init (&listed);
    kvpc_copies_t copies;
    kvpc_copies_init (&copies);
    shm_index_hit_t *hits = malloc ((keys->count ? keys->count : 1) * sizeof *hits);
    enum { KEY_ASK, KEY_COPIED, KEY_ABSENT };
    uint8_t *copied = calloc (keys->count ? keys->count : 1, sizeof *copied);
    int rc = KVPOOL_OK;
    if (!hits || !copied) {
        free (hits);
        free (copied);
        return s_fast_get_listed (self, keys, bufs, nbufs, results, rest);
    }
    shm_index_batch_t batch;
    s_index_batch (self, &batch, keys);
    size_t absent = 0;
    for (size_t j = 0; j < keys->count; j++) {
        size_t i = keys->index[j];
        shm_index_hit_t *hit = &hits[j];
        const void *source = NULL;
        shm_index_find_t found = shm_index_batch_find (&batch, j, hit);
        if (found == SHM_INDEX_FOUND && hit->size <= INT64_MAX
            && kvpc_bufs_capacity (bufs[i], nbufs[i]) >= hit->size)
            source = hit->size ? s_resolve (self, hit->segment_id, hit->offset, hit->size)
                               : (const void *) hit;
        if (source
            && (hit->size == 0
                || kvpc_copies_scatter (&copies, source, hit->size, bufs[i], nbufs[i]) == 0))
            copied[j] = KEY_COPIED;
        else if (found == SHM_INDEX_ABSENT && s_plain_key (keys->keys[j], keys->wire[j].len)) {
            copied[j] = KEY_ABSENT;
            absent++;
        }
        else if (kvpc_keys_add_from (&listed, keys, j))
            results[i] = KVPOOL_INTERNAL_ERROR;
    }
    //  Keys the node does not hold: not found (a miss, counted as the node would), unless it
    //  moved a key while we looked; then it is asked about them.
    bool absence_holds = !absent || shm_index_batch_absent_holds (&batch);
    for (size_t j = 0; absent && j < keys->count; j++) {
        if (copied[j] != KEY_ABSENT)
            continue;
        size_t i = keys->index[j];
        if (absence_holds) {
            results[i] = KVPOOL_OBJECT_NOT_FOUND;
            self->read_misses++;
        }
        else if (kvpc_keys_add_from (&listed, keys, j))
            results[i] = KVPOOL_INTERNAL_ERROR;
    }
    //  A device copy that failed (the last error says why) fails every key copied here.
    bool failed = kvpc_copies_run (self->conn, &copies) != 0;
    //  Only copies whose slot stayed the same are the object's bytes; the rest ask the node
    //  (their buffers are simply written again). Confirming stamps the read: its lease runs
    //  from now, the end of the copy.
    int64_t now = shm_index_clock_ms ();
    for (size_t j = 0; j < keys->count; j++) {
        if (copied[j] != KEY_COPIED)
            continue;
        size_t i = keys->index[j];
        if (failed)
            results[i] = KVPOOL_INVALID_PARAMS;
        else if (shm_index_confirm (&hits[j], now)) {
            results[i] = (int64_t) hits[j].size;
            self->index_reads++;
            self->cache_reads += hits[j].cache;
        }
        else if (kvpc_keys_add_from (&listed, keys, j))
            results[i] = KVPOOL_INTERNAL_ERROR;
    }
    if (listed.count)
        rc = s_fast_get_listed (self, &listed, bufs, nbufs, results, rest);
    kvpc_copies_fini (&copies);
    kvpc_keys_fini (&listed);
    free (hits);
    free (copied);
    return rc;
}

int
kvpc_fast_get (kvpc_fast_path_t *self, const kvpc_keys_t *keys, const kvpc_sink_t *sink,
               int64_t *results, kvpc_keys_t *rest)
{
    s_check_connection (self);
    int rc = self->index && self->use_index && !s_stale (self)
                 ? s_fast_get_indexed (self, keys, sink, results, rest)
                 : s_fast_get_listed (self, keys, sink->bufs, sink->nbufs, results, rest);
    s_reads_report (self, shm_index_clock_ms ());
    return rc;
}

//  Whether every replica of a reserved key resolves for size bytes.
static bool
s_put_resolves (kvpc_fast_path_t *self, Kvpool__V1__KeyReplicas *list, uint64_t size)
{
    if (size == 0)
        return true;
    if (!list || list->n_replicas == 0)
        return false;
    for (size_t r = 0; r < list->n_replicas; r++)
        if (!s_resolve (self, list->replicas[r]->segment_id, list->replicas[r]->offset, size))
            return false;
    return true;
}

//  Sends op (PUT_END or PUT_REVOKE) for keys and stores its per-key outcomes in results
//  when results is not NULL.
static int
s_finish (kvpc_fast_path_t *self, Kvpool__V1__Op op, const kvpc_keys_t *keys, int64_t *results)
{
    if (keys->count == 0)
        return KVPOOL_OK;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = op;
    request.n_keys = keys->count;
    request.keys = keys->wire;
    kvpc_reply_t reply;
    int rc = kvpc_call (self->conn, &request, NULL, 0, 0, &reply);
    if (rc == 0) {
        rc = kvpc_reply_check (self->conn, &reply, keys->count, 0);
        if (rc)
            kvpc_reply_free (&reply);
    }
    if (rc) {
        if (results)
            kvpc_fill (keys, results, rc);
        return rc;
    }
    if (results)
        for (size_t j = 0; j < keys->count; j++)
            results[keys->index[j]] = kvpc_reply_key_status (&reply, j);
    rc = reply.msg->status;
    kvpc_reply_free (&reply);
    return rc;
}

//  Puts through reservations: PUT_START, the copies, PUT_END.
static int
s_put_reserved (kvpc_fast_path_t *self, const kvpc_keys_t *keys, const kvpc_value_t *values,
                const kvpool_put_options_t *opts, int64_t *results, kvpc_keys_t *rest)
{
    if (keys->count == 0)
        return KVPOOL_OK;
    uint64_t *sizes = malloc (keys->count * sizeof *sizes);
    kvpc_key_state_t *state = malloc (keys->count * sizeof *state);
    if (!sizes || !state) {
        free (sizes);
        free (state);
        kvpc_fill (keys, results, KVPOOL_INTERNAL_ERROR);
        return KVPOOL_INTERNAL_ERROR;
    }
    for (size_t j = 0; j < keys->count; j++)
        sizes[j] = values[keys->index[j]].size;
    Kvpool__V1__PutOptions put;
    Kvpool__V1__Request request;
    kvpc_put_request (&request, KVPOOL__V1__OP__PUT_START, keys, opts, &put);
    request.n_sizes = keys->count;
    request.sizes = sizes;
    kvpc_reply_t reply;
    int rc = kvpc_call (self->conn, &request, NULL, 0, 0, &reply);
    if (rc == 0) {
        rc = kvpc_reply_check (self->conn, &reply, keys->count, KVPC_NEED_REPLICAS);
        if (rc)
            kvpc_reply_free (&reply);
    }
    if (rc) {
        //  Without a reply we cannot tell what was reserved; the node revokes reservations
        //  that are never committed after its put timeout.
        kvpc_fill (keys, results, rc);
        free (sizes);
        free (state);
        return rc;
    }
    s_check_connection (self);
    Kvpool__V1__Reply *msg = reply.msg;
    size_t missing = 0;
    for (size_t j = 0; j < keys->count; j++) {
        results[keys->index[j]] = kvpc_reply_key_status (&reply, j);
        if (results[keys->index[j]] != KVPOOL_OK)
            state[j] = KVPC_KEY_DONE;
        else if (s_put_resolves (self, msg->replicas[j], sizes[j]))
            state[j] = KVPC_KEY_COPY;
        else {
            state[j] = KVPC_KEY_MISSING;
            missing++;
        }
    }
    if (missing && s_refresh (self, false) == 0) {
        for (size_t j = 0; j < keys->count; j++)
            if (state[j] == KVPC_KEY_COPY || state[j] == KVPC_KEY_MISSING)
                state[j] = s_put_resolves (self, msg->replicas[j], sizes[j]) ? KVPC_KEY_COPY
                                                                             : KVPC_KEY_MISSING;
    }
    kvpc_copies_t copies;
    kvpc_copies_init (&copies);
    for (size_t j = 0; j < keys->count; j++) {
        if (state[j] != KVPC_KEY_COPY || sizes[j] == 0)
            continue;
        const kvpc_value_t *value = &values[keys->index[j]];
        Kvpool__V1__KeyReplicas *list = msg->replicas[j];
        for (size_t r = 0; r < list->n_replicas; r++) {
            void *target = s_resolve (self, list->replicas[r]->segment_id,
                                      list->replicas[r]->offset, sizes[j]);
            if (kvpc_copies_gather (&copies, target, value->parts, value->nparts)) {
                state[j] = KVPC_KEY_FAILED;
                results[keys->index[j]] = KVPOOL_INTERNAL_ERROR;
                break;
            }
        }
    }
    //  A key that failed mid-plan may still have copies listed: they only write into its
    //  own reserved space, which is revoked below.
    if (kvpc_copies_run (self->conn, &copies))
        //  A device copy failed (the last error says why): every key with bytes copied here
        //  is revoked.
        for (size_t j = 0; j < keys->count; j++)
            if (state[j] == KVPC_KEY_COPY && sizes[j] != 0) {
                state[j] = KVPC_KEY_FAILED;
                results[keys->index[j]] = KVPOOL_INVALID_PARAMS;
            }
    kvpc_copies_fini (&copies);

    kvpc_keys_t commit, revoke, fallback;
    kvpc_keys_init (&commit);
    kvpc_keys_init (&revoke);
    kvpc_keys_init (&fallback);
    bool oom = false;
    for (size_t j = 0; j < keys->count; j++) {
        if (state[j] == KVPC_KEY_COPY)
            oom |= kvpc_keys_add_from (&commit, keys, j) != 0;
        else if (state[j] == KVPC_KEY_MISSING)
            oom |= kvpc_keys_add_from (&revoke, keys, j) || kvpc_keys_add_from (&fallback, keys, j);
        else if (state[j] == KVPC_KEY_FAILED)
            oom |= kvpc_keys_add_from (&revoke, keys, j) != 0;
    }
    if (oom) {
        //  Commit nothing we cannot account for: revoke every reservation.
        kvpc_keys_fini (&commit);
        kvpc_keys_fini (&revoke);
        kvpc_keys_fini (&fallback);
        kvpc_keys_init (&commit);
        kvpc_keys_init (&revoke);
        kvpc_keys_init (&fallback);
        for (size_t j = 0; j < keys->count; j++)
            if (state[j] != KVPC_KEY_DONE) {
                kvpc_keys_add_from (&revoke, keys, j);
                results[keys->index[j]] = KVPOOL_INTERNAL_ERROR;
            }
    }
    if (s_finish (self, KVPOOL__V1__OP__PUT_END, &commit, results) == KVPOOL_RPC_FAIL)
        //  The commit may or may not have landed; a revoke of a committed key is refused.
        for (size_t j = 0; j < commit.count; j++)
            kvpc_keys_add_from (&revoke, &commit, j);
    s_finish (self, KVPOOL__V1__OP__PUT_REVOKE, &revoke, NULL);
    for (size_t j = 0; j < fallback.count; j++)
        if (kvpc_keys_add_from (rest, &fallback, j))
            results[fallback.index[j]] = KVPOOL_INTERNAL_ERROR;
    rc = msg->status;
    kvpc_keys_fini (&commit);
    kvpc_keys_fini (&revoke);
    kvpc_keys_fini (&fallback);
    kvpc_reply_free (&reply);
    free (sizes);
    free (state);
    return rc;
}

//  ---- puts by address ------------------------------------------------------------------
//  A put whose values are each one buffer of host memory names where they are instead of
//  reserving and copying (Request.vm_addrs): the node reads them itself, straight into their
//  place, and answers once: one round trip where PUT_START and PUT_END take two. The request
//  carries the time this call gives up waiting; the node stores no value whose read ends
//  later, so a buffer reused after a timeout is never what gets stored. A node that takes no
//  put by address (an older one: INVALID_PARAMS; one the kernel does not let read this
//  process: PERMISSION_DENIED) is not asked again until the connection changes: those keys,
//  and later puts, take the reservations.

//  Leave the reply at least this long before the call's own timeout (its clock reads whole
//  milliseconds).
#define KVPC_BY_ADDRESS_MARGIN_MS 2
//  Batches of at most this many bytes go by address: the node reads them where it places
//  them, on the replica-manager's thread and its helper (TRANSFER_INLINE_BY_ADDRESS_BYTES).
//  It reads another process's memory at a quarter to a half of memcpy's speed
//  (process_vm_readv pins each page), so past this the round trip saved is worth less than
//  the copy threads' parallel memcpy. Measured on the 2-core VM, by address against
//  reserved, values/s: 32 x 1 MiB 9.6 thousand against 14.3; 32 x 64 KiB (2 MiB) 58.5-67.8
//  thousand against 41.4-52.9 with the helper (45.6-50.6 against 46.9-59.1 without); one 64
//  KiB 4.7-5.3 thousand against 2.8-3.5.
#define KVPC_BY_ADDRESS_MAX_BYTES (2u << 20)

static bool
s_by_address_usable (kvpc_fast_path_t *self, const kvpc_keys_t *keys, const kvpc_value_t *values)
{
    if (self->by_address_refused || kvpc_conn_cluster (self->conn)
        || kvpc_conn_device_armed (self->conn)
        || kvpc_conn_timeout_ms (self->conn) <= 5 * KVPC_BY_ADDRESS_MARGIN_MS)
        return false;
    uint64_t bytes = 0;
    for (size_t j = 0; j < keys->count; j++) {
        const kvpc_value_t *value = &values[keys->index[j]];
        if (value->size && value->nparts != 1)
            return false;
        bytes += value->size;
    }
    return bytes <= KVPC_BY_ADDRESS_MAX_BYTES;
}

//  Puts keys by address; keys the node refused that way go to retry (the reservations'
//  way). Returns the request's status.
static int
s_put_by_address (kvpc_fast_path_t *self, const kvpc_keys_t *keys, const kvpc_value_t *values,
                  const kvpool_put_options_t *opts, int64_t *results, kvpc_keys_t *retry)
{
    uint64_t *sizes = malloc (2 * keys->count * sizeof *sizes);
    if (!sizes) {
        kvpc_fill (keys, results, KVPOOL_INTERNAL_ERROR);
        return KVPOOL_INTERNAL_ERROR;
    }
    uint64_t *addrs = sizes + keys->count;
    for (size_t j = 0; j < keys->count; j++) {
        const kvpc_value_t *value = &values[keys->index[j]];
        sizes[j] = value->size;
        addrs[j] = value->size ? (uint64_t) (uintptr_t) value->parts[0].data : 0;
    }
    Kvpool__V1__PutOptions put;
    Kvpool__V1__Request request;
    kvpc_put_request (&request, KVPOOL__V1__OP__PUT, keys, opts, &put);
    request.n_sizes = keys->count;
    request.sizes = sizes;
    request.n_vm_addrs = keys->count;
    request.vm_addrs = addrs;
    struct timespec now;
    clock_gettime (CLOCK_MONOTONIC, &now);
    request.vm_deadline_ns =
        (uint64_t) now.tv_sec * 1000000000u + (uint64_t) now.tv_nsec
        + (uint64_t) (kvpc_conn_timeout_ms (self->conn) - KVPC_BY_ADDRESS_MARGIN_MS) * 1000000u;
    kvpc_reply_t reply;
    int rc = kvpc_call (self->conn, &request, NULL, 0, 0, &reply);
    free (sizes);
    if (rc == 0) {
        rc = kvpc_reply_check (self->conn, &reply, keys->count, 0);
        if (rc)
            kvpc_reply_free (&reply);
    }
    if (rc == 0 && reply.msg->n_statuses == 0
        && (reply.msg->status == KVPOOL_INVALID_PARAMS
            || reply.msg->status == KVPOOL_PERMISSION_DENIED)) {
        //  Refused as a whole: nothing was stored.
        kvpc_reply_free (&reply);
        self->by_address_refused = true;
        for (size_t j = 0; j < keys->count; j++)
            if (kvpc_keys_add_from (retry, keys, j))
                results[keys->index[j]] = KVPOOL_INTERNAL_ERROR;
        return KVPOOL_OK;
    }
    if (rc) {
        kvpc_fill (keys, results, rc);
        return rc;
    }
    for (size_t j = 0; j < keys->count; j++) {
        int status = kvpc_reply_key_status (&reply, j);
        if (status == KVPOOL_PERMISSION_DENIED) {
            self->by_address_refused = true;
            if (kvpc_keys_add_from (retry, keys, j))
                results[keys->index[j]] = KVPOOL_INTERNAL_ERROR;
        }
        else
            results[keys->index[j]] = status;
    }
    rc = reply.msg->status;
    kvpc_reply_free (&reply);
    return rc;
}

int
kvpc_fast_put (kvpc_fast_path_t *self, const kvpc_keys_t *keys, const kvpc_value_t *values,
               const kvpool_put_options_t *opts, int64_t *results, kvpc_keys_t *rest)
{
    if (keys->count == 0 || !s_by_address_usable (self, keys, values))
        return s_put_reserved (self, keys, values, opts, results, rest);
    kvpc_keys_t retry;
    kvpc_keys_init (&retry);
    int rc = s_put_by_address (self, keys, values, opts, results, &retry);
    if (retry.count)
        rc = s_put_reserved (self, &retry, values, opts, results, rest);
    kvpc_keys_fini (&retry);
    return rc;
}
