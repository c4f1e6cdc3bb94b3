/*  kvpool_client.c - libkvpool: one connection to a kvpoold node and every operation of
    include/kvpool.h over its socket (the same-machine fast path is in fast_path.c).

    Wire: a DEALER socket connected to the node's ROUTER. A request goes out as
    [Request][value frames...] (no empty delimiter frame) and its reply comes back as
    [Reply][value frames...] (protocol/kvpool.proto). Request ids are monotonic per
    connection; a call waits for the reply carrying its id and discards any other reply it
    sees first: late replies to calls that timed out, and replies to fire-and-forget RELEASEs.

    Copies: a GET reply's value frames are kept as received (kvpool_get_batch hands out
    pointers into them); put values of KVPC_ZERO_COPY_MIN bytes or more are given to libzmq
    without a copy, and the call does not return before libzmq has let go of them (after a
    timeout the socket is closed and reopened to make it let go), so the caller may reuse its
    buffers as soon as a call returns.

    Threads: a kvpool_t belongs to one thread at a time. Connections share one ZeroMQ context
    (created with the first connection, terminated with the last, under a mutex). libzmq's
    I/O thread only touches zc_pending. Large copies run on the connection's transfer pool,
    and the calling thread waits for them.
*/
#include "client/kvpool_client.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <czmq.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#define KVPC_DEFAULT_TIMEOUT_MS 5000
//  Socket batches move in requests of at most this many value bytes. One reply of 32 x 4 MiB
//  made libzmq hold 128 MiB of fresh receive buffers at once, which the allocator hands back
//  to the kernel and faults in again every call (measured 0.35 GB/s); bounded messages reuse
//  the same memory (2.6 GB/s).
#define KVPC_CHUNK_BYTES (16u << 20)
//  How long kvpool_destroy waits for the replies of RELEASEs still in flight, so that the
//  node gets them before the socket closes (with linger 0, unsent frames are dropped).
#define KVPC_DESTROY_DRAIN_MS 1000
//  Fire-and-forget ids remembered at most (older ones are forgotten, not waited for).
#define KVPC_ONEWAY_MAX 4096

//  ---- the shared ZeroMQ context ----------------------------------------------------------

static pthread_mutex_t s_ctx_mutex = PTHREAD_MUTEX_INITIALIZER;
static void *s_ctx;
static size_t s_ctx_users;

//  inproc:// endpoints live in a context: an in-process client of kvpoold (the lookup
//  server) must use CZMQ's global context, where the api binds. Every other connection uses
//  the library's own context, so a host process that never closes a connection can still
//  exit (CZMQ terminates its context at exit and would wait for our sockets).
static bool
s_is_inproc (const char *endpoint)
{
    return endpoint && strncmp (endpoint, "inproc://", 9) == 0;
}

static void *
s_ctx_acquire (const char *endpoint)
{
    if (s_is_inproc (endpoint))
        return zsys_init ();
    pthread_mutex_lock (&s_ctx_mutex);
    if (!s_ctx)
        s_ctx = zmq_ctx_new ();
    if (s_ctx)
        s_ctx_users++;
    void *ctx = s_ctx;
    pthread_mutex_unlock (&s_ctx_mutex);
    return ctx;
}

static void
s_ctx_release (const char *endpoint)
{
    if (s_is_inproc (endpoint))
        return;
    pthread_mutex_lock (&s_ctx_mutex);
    if (s_ctx_users > 0 && --s_ctx_users == 0) {
        zmq_ctx_term (s_ctx);
        s_ctx = NULL;
    }
    pthread_mutex_unlock (&s_ctx_mutex);
}

//  ---- small helpers ------------------------------------------------------------------------

static int64_t
s_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *
s_op_name (int op)
{
    const ProtobufCEnumValue *value =
        protobuf_c_enum_descriptor_get_value (&kvpool__v1__op__descriptor, op);
    return value ? value->name : "request";
}

void
kvpc_set_error (kvpool_t *self, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    vsnprintf (self->last_error, sizeof self->last_error, format, args);
    va_end (args);
}

bool
kvpc_key_valid (const char *key)
{
    return key && *key;
}

void
kvpc_keys_init (kvpc_keys_t *self)
{
    memset (self, 0, sizeof *self);
    self->capacity = sizeof self->inline_keys / sizeof self->inline_keys[0];
    self->keys = self->inline_keys;
    self->wire = self->inline_wire;
    self->index = self->inline_index;
}

int
kvpc_keys_add (kvpc_keys_t *self, const char *key, size_t index)
{
    if (self->count == self->capacity) {
        size_t capacity = self->capacity * 2;
        char **keys = malloc (capacity * sizeof *keys);
        ProtobufCBinaryData *wire = malloc (capacity * sizeof *wire);
        size_t *indexes = malloc (capacity * sizeof *indexes);
        if (!keys || !wire || !indexes) {
            free (keys);
            free (wire);
            free (indexes);
            return -1;
        }
        memcpy (keys, self->keys, self->count * sizeof *keys);
        memcpy (wire, self->wire, self->count * sizeof *wire);
        memcpy (indexes, self->index, self->count * sizeof *indexes);
        if (self->keys != self->inline_keys) {
            free (self->keys);
            free (self->wire);
            free (self->index);
        }
        self->keys = keys;
        self->wire = wire;
        self->index = indexes;
        self->capacity = capacity;
    }
    //  protobuf-c wants char **; it only reads the strings.
    self->keys[self->count] = (char *) key;
    self->wire[self->count].data = (uint8_t *) key;
    self->wire[self->count].len = strlen (key);
    self->index[self->count] = index;
    self->count++;
    return 0;
}

void
kvpc_keys_fini (kvpc_keys_t *self)
{
    if (self->keys != self->inline_keys) {
        free (self->keys);
        free (self->wire);
        free (self->index);
    }
    self->keys = NULL;
    self->wire = NULL;
    self->index = NULL;
    self->count = self->capacity = 0;
}

void
kvpc_fill (const kvpc_keys_t *keys, int64_t *results, int64_t status)
{
    for (size_t j = 0; j < keys->count; j++)
        results[keys->index[j]] = status;
}

void
kvpc_put_options (const kvpool_put_options_t *opts, Kvpool__V1__PutOptions *out)
{
    kvpool__v1__put_options__init (out);
    if (!opts)
        return;
    out->replica_num = opts->replica_num;
    if (opts->preferred_segments && opts->preferred_segment_count) {
        out->n_preferred_segments = opts->preferred_segment_count;
        out->preferred_segments = (char **) opts->preferred_segments;
    }
    out->soft_pin = opts->soft_pin;
    out->soft_pin_ttl_ms = opts->soft_pin_ttl_ms;
    out->hard_pin = opts->hard_pin;
}

uint64_t
kvpc_bufs_capacity (const kvpool_buf_t *bufs, size_t nbufs)
{
    uint64_t total = 0;
    for (size_t i = 0; i < nbufs; i++)
        total += bufs[i].size;
    return total;
}

//  ---- copies -------------------------------------------------------------------------------

void
kvpc_copies_init (kvpc_copies_t *self)
{
    memset (self, 0, sizeof *self);
}

int
kvpc_copies_add (kvpc_copies_t *self, void *dst, const void *src, size_t len)
{
    if (len == 0)
        return 0;
    if (self->count == self->capacity) {
        size_t capacity = self->capacity ? self->capacity * 2 : 16;
        kvpc_copy_t *items = realloc (self->items, capacity * sizeof *items);
        if (!items)
            return -1;
        self->items = items;
        self->capacity = capacity;
    }
    self->items[self->count++] = (kvpc_copy_t){dst, src, len};
    self->bytes += len;
    return 0;
}

int
kvpc_copies_scatter (kvpc_copies_t *self, const void *src, size_t len, const kvpool_buf_t *bufs,
                     size_t nbufs)
{
    const char *from = src;
    for (size_t i = 0; i < nbufs && len > 0; i++) {
        size_t piece = bufs[i].size < len ? bufs[i].size : len;
        if (kvpc_copies_add (self, bufs[i].data, from, piece))
            return -1;
        from += piece;
        len -= piece;
    }
    return 0;
}

int
kvpc_copies_gather (kvpc_copies_t *self, void *dst, const kvpool_iov_t *parts, size_t nparts)
{
    char *to = dst;
    for (size_t i = 0; i < nparts; i++) {
        if (kvpc_copies_add (self, to, parts[i].data, parts[i].size))
            return -1;
        to += parts[i].size;
    }
    return 0;
}

void
kvpc_copies_run (kvpool_t *self, kvpc_copies_t *copies)
{
    //  Small batches are cheaper to copy here than to hand to other threads.
    if (copies->bytes >= KVPC_POOL_MIN_BYTES && !self->pool)
        self->pool = transfer_pool_new (KVPC_POOL_WORKERS, 0);
    transfer_batch_t *batch = NULL;
    if (copies->bytes >= KVPC_POOL_MIN_BYTES && self->pool)
        batch = transfer_batch_new (NULL, NULL);
    if (batch) {
        for (size_t i = 0; i < copies->count; i++)
            transfer_batch_add_copy (batch, copies->items[i].dst, copies->items[i].src,
                                     copies->items[i].len);
        transfer_pool_submit (self->pool, batch);
        transfer_batch_wait (self->pool, batch);
        transfer_batch_destroy (&batch);
    }
    else
        for (size_t i = 0; i < copies->count; i++)
            memcpy (copies->items[i].dst, copies->items[i].src, copies->items[i].len);
}

void
kvpc_copies_fini (kvpc_copies_t *self)
{
    free (self->items);
    memset (self, 0, sizeof *self);
}

//  ---- the socket ---------------------------------------------------------------------------

static int
s_socket_open (kvpool_t *self, void *ctx)
{
    void *socket = zmq_socket (ctx, ZMQ_DEALER);
    if (!socket)
        return -1;
    //  Linger 0: closing never blocks on a node that is gone. No high-water marks: a large
    //  batch is one multipart message and must never be refused or block half-sent.
    int zero = 0;
    zmq_setsockopt (socket, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt (socket, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt (socket, ZMQ_RCVHWM, &zero, sizeof zero);
    if (zmq_connect (socket, self->endpoint)) {
        int saved = errno;
        zmq_close (socket);
        errno = saved;
        return -1;
    }
    self->socket = socket;
    return 0;
}

//  Closes the socket (dropping everything queued on it) and connects a new one.
static void
s_socket_reset (kvpool_t *self)
{
    if (self->socket)
        zmq_close (self->socket);
    self->socket = NULL;
    self->oneway_count = 0;
    void *ctx = s_ctx_acquire (self->endpoint);
    if (ctx) {
        s_socket_open (self, ctx);
        s_ctx_release (self->endpoint);
    }
    if (self->fast_path)
        kvpc_fast_path_reconnected (self);
}

//  libzmq calls this (on its I/O thread) when it no longer needs a zero-copy value frame.
static void
s_zc_release (void *data, void *hint)
{
    (void) data;
    atomic_fetch_sub_explicit ((atomic_size_t *) hint, 1, memory_order_release);
}

//  Waits until libzmq has let go of every zero-copy frame. Only call it when it must: after
//  the node has received them, or after the socket that held them was closed.
static void
s_zc_wait (kvpool_t *self)
{
    while (atomic_load_explicit (&self->zc_pending, memory_order_acquire) > 0) {
        struct timespec pause = {0, 100000};
        nanosleep (&pause, NULL);
    }
}

//  Returns once libzmq holds no zero-copy frame of ours. Once the reply has come, the node
//  has every frame, and libzmq lets go of them within moments; after a timeout they may still
//  be queued, and only closing the socket drops them.
static void
s_zc_drain (kvpool_t *self, bool timed_out)
{
    if (atomic_load_explicit (&self->zc_pending, memory_order_acquire) == 0)
        return;
    int64_t deadline = s_now_ms () + (timed_out ? 0 : 1000);
    while (s_now_ms () < deadline) {
        if (atomic_load_explicit (&self->zc_pending, memory_order_acquire) == 0)
            return;
        sched_yield ();
    }
    s_socket_reset (self);
    s_zc_wait (self);
}

static int
s_send_request (kvpool_t *self, Kvpool__V1__Request *request, const kvpc_value_t *values,
                size_t nvalues)
{
    if (!self->socket) {
        kvpc_set_error (self, "not connected to %s", self->endpoint);
        return KVPOOL_RPC_FAIL;
    }
    request->version = KVPOOL_PROTOCOL_VERSION;
    request->request_id = ++self->next_id;
    zmq_msg_t msg;
    size_t len = kvpool__v1__request__get_packed_size (request);
    if (zmq_msg_init_size (&msg, len)) {
        kvpc_set_error (self, "out of memory for a %zu-byte request", len);
        return KVPOOL_INTERNAL_ERROR;
    }
    kvpool__v1__request__pack (request, zmq_msg_data (&msg));
    if (zmq_msg_send (&msg, self->socket, nvalues ? ZMQ_SNDMORE : 0) == -1) {
        zmq_msg_close (&msg);
        goto broken;
    }
    for (size_t i = 0; i < nvalues; i++) {
        const kvpc_value_t *value = &values[i];
        int flags = i + 1 < nvalues ? ZMQ_SNDMORE : 0;
        if (value->nparts == 1 && value->size >= KVPC_ZERO_COPY_MIN) {
            atomic_fetch_add_explicit (&self->zc_pending, 1, memory_order_relaxed);
            //  libzmq only reads the bytes; it wants a non-const pointer.
            if (zmq_msg_init_data (&msg, (void *) value->parts[0].data, value->size, s_zc_release,
                                   (void *) &self->zc_pending)) {
                atomic_fetch_sub_explicit (&self->zc_pending, 1, memory_order_relaxed);
                goto broken;
            }
        }
        else {
            if (zmq_msg_init_size (&msg, value->size))
                goto broken;
            char *to = zmq_msg_data (&msg);
            for (size_t p = 0; p < value->nparts; p++) {
                if (value->parts[p].size)
                    memcpy (to, value->parts[p].data, value->parts[p].size);
                to += value->parts[p].size;
            }
        }
        if (zmq_msg_send (&msg, self->socket, flags) == -1) {
            zmq_msg_close (&msg);
            goto broken;
        }
    }
    return 0;

broken:
    //  A multipart message may be half queued: only a new socket is sure to be clean.
    kvpc_set_error (self, "cannot send %s to %s: %s", s_op_name (request->op), self->endpoint,
                    zmq_strerror (errno));
    s_socket_reset (self);
    s_zc_wait (self);
    return KVPOOL_RPC_FAIL;
}

static void
s_oneway_forget (kvpool_t *self, uint64_t id)
{
    for (size_t i = 0; i < self->oneway_count; i++)
        if (self->oneway_ids[i] == id) {
            self->oneway_ids[i] = self->oneway_ids[--self->oneway_count];
            return;
        }
}

//  Receives whole messages until the reply to want_id arrives (0) or the deadline passes
//  (-1). Value frames of that reply are kept, up to expect_frames of them; further ones are
//  counted in extra.
static int
s_recv_reply (kvpool_t *self, int64_t deadline, uint64_t want_id, size_t expect_frames,
              kvpc_reply_t *reply, size_t *extra)
{
    while (self->socket) {
        int64_t left = deadline - s_now_ms ();
        if (left <= 0)
            return -1;
        zmq_pollitem_t item = {self->socket, 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll (&item, 1, (long) left);
        if (rc == -1 && errno != EINTR)
            return -1;
        if (rc <= 0)
            continue;
        zmq_msg_t head;
        zmq_msg_init (&head);
        if (zmq_msg_recv (&head, self->socket, ZMQ_DONTWAIT) == -1) {
            zmq_msg_close (&head);
            if (errno == EAGAIN || errno == EINTR)
                continue;
            return -1;
        }
        bool more = zmq_msg_more (&head);
        Kvpool__V1__Reply *msg =
            kvpool__v1__reply__unpack (NULL, zmq_msg_size (&head), zmq_msg_data (&head));
        zmq_msg_close (&head);
        bool mine = msg && msg->request_id == want_id;
        zmq_msg_t *frames = NULL;
        if (mine && expect_frames) {
            frames = malloc (expect_frames * sizeof *frames);
            if (!frames) {
                kvpc_set_error (self, "out of memory for %zu reply frames", expect_frames);
                mine = false; //  drained below; the call then times out
            }
        }
        size_t nframes = 0;
        size_t extras = 0;
        bool broken = false;
        while (more) {
            zmq_msg_t scratch;
            zmq_msg_t *part = mine && nframes < expect_frames ? &frames[nframes] : &scratch;
            zmq_msg_init (part);
            //  The rest of a multipart message is already here: libzmq delivers it whole.
            if (zmq_msg_recv (part, self->socket, 0) == -1) {
                zmq_msg_close (part);
                broken = true;
                break;
            }
            more = zmq_msg_more (part);
            if (part == &scratch) {
                zmq_msg_close (part);
                extras++;
            }
            else
                nframes++;
        }
        if (!mine || broken) {
            for (size_t i = 0; i < nframes; i++)
                zmq_msg_close (&frames[i]);
            free (frames);
            if (msg)
                s_oneway_forget (self, msg->request_id);
            if (msg)
                kvpool__v1__reply__free_unpacked (msg, NULL);
            if (broken)
                return -1;
            continue;
        }
        reply->msg = msg;
        reply->frames = frames;
        reply->nframes = nframes;
        *extra = extras;
        return 0;
    }
    return -1;
}

void
kvpc_reply_free (kvpc_reply_t *reply)
{
    for (size_t i = 0; i < reply->nframes; i++)
        zmq_msg_close (&reply->frames[i]);
    free (reply->frames);
    if (reply->msg)
        kvpool__v1__reply__free_unpacked (reply->msg, NULL);
    memset (reply, 0, sizeof *reply);
}

int
kvpc_call (kvpool_t *self, Kvpool__V1__Request *request, const kvpc_value_t *values, size_t nvalues,
           size_t expect_frames, kvpc_reply_t *reply)
{
    memset (reply, 0, sizeof *reply);
    int rc = s_send_request (self, request, values, nvalues);
    if (rc)
        return rc;
    size_t extra = 0;
    rc = s_recv_reply (self, s_now_ms () + self->timeout_ms, request->request_id, expect_frames,
                       reply, &extra);
    s_zc_drain (self, rc != 0);
    if (rc) {
        kvpc_set_error (self, "no reply to %s from %s within %d ms", s_op_name (request->op),
                        self->endpoint, self->timeout_ms);
        return KVPOOL_RPC_FAIL;
    }
    Kvpool__V1__Reply *msg = reply->msg;
    if (msg->error && *msg->error)
        snprintf (self->last_error, sizeof self->last_error, "%s", msg->error);
    //  Positive codes would read as counts or sizes to our callers.
    if (msg->status > 0) {
        kvpc_set_error (self, "%s reply with status %d", s_op_name (request->op), msg->status);
        msg->status = KVPOOL_PROTOCOL_ERROR;
    }
    for (size_t j = 0; j < msg->n_statuses; j++)
        if (msg->statuses[j] > 0)
            msg->statuses[j] = KVPOOL_PROTOCOL_ERROR;
    if (extra) {
        kvpc_set_error (self, "%s reply has %zu value frames more than expected",
                        s_op_name (request->op), extra);
        kvpc_reply_free (reply);
        return KVPOOL_PROTOCOL_ERROR;
    }
    return 0;
}

int
kvpc_send_oneway (kvpool_t *self, Kvpool__V1__Request *request)
{
    int rc = s_send_request (self, request, NULL, 0);
    if (rc)
        return rc;
    if (self->oneway_count == self->oneway_capacity) {
        if (self->oneway_capacity >= KVPC_ONEWAY_MAX) {
            //  The node does not answer these; stop remembering the oldest.
            memmove (self->oneway_ids, self->oneway_ids + 1,
                     (self->oneway_count - 1) * sizeof *self->oneway_ids);
            self->oneway_count--;
        }
        else {
            size_t capacity = self->oneway_capacity ? self->oneway_capacity * 2 : 16;
            uint64_t *ids = realloc (self->oneway_ids, capacity * sizeof *ids);
            if (!ids)
                return 0; //  only the wait in kvpool_destroy misses it
            self->oneway_ids = ids;
            self->oneway_capacity = capacity;
        }
    }
    self->oneway_ids[self->oneway_count++] = request->request_id;
    return 0;
}

int
kvpc_reply_key_status (kvpc_reply_t *reply, size_t j)
{
    Kvpool__V1__Reply *msg = reply->msg;
    if (j < msg->n_statuses)
        return msg->statuses[j];
    return msg->status != KVPOOL_OK ? msg->status : KVPOOL_PROTOCOL_ERROR;
}

int
kvpc_reply_check (kvpool_t *self, kvpc_reply_t *reply, size_t nkeys, int need)
{
    Kvpool__V1__Reply *msg = reply->msg;
    const char *op = msg->op ? s_op_name (msg->op) : "reply";
    if (msg->n_statuses != nkeys && (msg->status == KVPOOL_OK || msg->n_statuses != 0)) {
        kvpc_set_error (self, "%s reply has %zu statuses for %zu keys", op, msg->n_statuses, nkeys);
        return KVPOOL_PROTOCOL_ERROR;
    }
    bool any_ok = false;
    for (size_t j = 0; j < msg->n_statuses; j++)
        any_ok |= msg->statuses[j] == KVPOOL_OK;
    if (!any_ok)
        return 0;
    if ((need & KVPC_NEED_SIZES) && msg->n_sizes != nkeys) {
        kvpc_set_error (self, "%s reply has %zu sizes for %zu keys", op, msg->n_sizes, nkeys);
        return KVPOOL_PROTOCOL_ERROR;
    }
    if ((need & KVPC_NEED_REPLICAS) && msg->n_replicas != nkeys) {
        kvpc_set_error (self, "%s reply has %zu replica lists for %zu keys", op, msg->n_replicas,
                        nkeys);
        return KVPOOL_PROTOCOL_ERROR;
    }
    if ((need & KVPC_NEED_FRAMES) && reply->nframes != nkeys) {
        kvpc_set_error (self, "%s reply has %zu value frames for %zu keys", op, reply->nframes,
                        nkeys);
        return KVPOOL_PROTOCOL_ERROR;
    }
    return 0;
}

//  ---- requests without keys --------------------------------------------------------------

//  Sends a request that carries no keys; returns its status (*reply_p kept only on success
//  when reply_p is not NULL).
static int
s_simple_call (kvpool_t *self, Kvpool__V1__Request *request, kvpc_reply_t *reply_p)
{
    kvpc_reply_t reply;
    int rc = kvpc_call (self, request, NULL, 0, 0, &reply);
    if (rc)
        return rc;
    rc = reply.msg->status;
    if (rc == KVPOOL_OK && reply_p)
        *reply_p = reply;
    else
        kvpc_reply_free (&reply);
    return rc;
}

static int
s_ping (kvpool_t *self)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__PING;
    kvpc_reply_t reply;
    int rc = s_simple_call (self, &request, &reply);
    if (rc)
        return rc;
    if (reply.msg->host_id)
        snprintf (self->host_id, sizeof self->host_id, "%s", reply.msg->host_id);
    snprintf (self->ping_server_id, sizeof self->ping_server_id, "%s",
              reply.msg->server_id ? reply.msg->server_id : "");
    snprintf (self->local_endpoint, sizeof self->local_endpoint, "%s",
              reply.msg->local_endpoint ? reply.msg->local_endpoint : "");
    kvpc_reply_free (&reply);
    return KVPOOL_OK;
}

//  How long a connection waits for the node on its ipc endpoint before it stays where it is.
#define KVPC_LOCAL_PING_MS 1000

//  A client on the node's machine talks to the node's ipc endpoint: only there does the node
//  know which process it is, and only there does it serve the shared-memory operations
//  (docs/security.md). The move is kept only if the same node answers there (another
//  network namespace, say, has no such socket, or another node's).
static void
s_go_local (kvpool_t *self)
{
    if (!self->local_endpoint[0] || strcmp (self->endpoint, self->local_endpoint) == 0
        || s_is_inproc (self->endpoint))
        return;
    char server_id[sizeof self->ping_server_id];
    memcpy (server_id, self->ping_server_id, sizeof server_id);
    char *endpoint = strdup (self->local_endpoint);
    if (!endpoint)
        return;
    void *old_socket = self->socket;
    char *old_endpoint = self->endpoint;
    int timeout = self->timeout_ms;
    self->socket = NULL;
    self->endpoint = endpoint;
    self->timeout_ms = timeout < KVPC_LOCAL_PING_MS ? timeout : KVPC_LOCAL_PING_MS;
    bool moved = s_socket_open (self, self->ctx) == 0 && s_ping (self) == KVPOOL_OK
                 && strcmp (server_id, self->ping_server_id) == 0;
    self->timeout_ms = timeout;
    if (moved) {
        zmq_close (old_socket);
        free (old_endpoint);
        return;
    }
    if (self->socket)
        zmq_close (self->socket);
    self->socket = old_socket;
    self->endpoint = old_endpoint;
    free (endpoint);
    memcpy (self->ping_server_id, server_id, sizeof server_id);
}

//  ---- connection ---------------------------------------------------------------------------

int
kvpool_tune_malloc (void)
{
#if defined(__GLIBC__)
    //  Large values stay on the heap instead of a fresh mmap each, and freed ones stay there
    //  for the next receive.
    int ok = mallopt (M_MMAP_THRESHOLD, 32 << 20);
    ok &= mallopt (M_TRIM_THRESHOLD, 256 << 20);
    //  Threads started from now on share the main heap. libzmq's I/O thread, which allocates
    //  every received frame, would otherwise get an arena of its own made of 64 MiB heaps
    //  that glibc unmaps whenever one falls empty, so a batch of more than 64 MiB kept
    //  by the caller (kvpool_get_batch) was faulted in afresh on every call. Threads that
    //  already exist keep their arenas.
    ok &= mallopt (M_ARENA_MAX, 1);
    return ok ? 0 : -1;
#else
    return -1;
#endif
}

void
kvpool_options_init (kvpool_options_t *options)
{
    memset (options, 0, sizeof *options);
    options->timeout_ms = KVPC_DEFAULT_TIMEOUT_MS;
    options->connect_timeout_ms = 0;
    options->fast_path = 1;
}

kvpool_t *
kvpool_connect (const char *endpoint, const kvpool_options_t *options)
{
    kvpool_options_t defaults;
    if (!options) {
        kvpool_options_init (&defaults);
        options = &defaults;
    }
    if (!endpoint)
        endpoint = KVPOOL_DEFAULT_ENDPOINT;
    kvpool_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    atomic_init (&self->zc_pending, 0);
    self->endpoint = strdup (endpoint);
    void *ctx = s_ctx_acquire (endpoint);
    if (!self->endpoint || !ctx) {
        if (ctx)
            s_ctx_release (endpoint);
        free (self->endpoint);
        free (self);
        errno = ENOMEM;
        return NULL;
    }
    self->ctx = ctx;
    if (s_socket_open (self, ctx)) {
        int saved = errno;
        s_ctx_release (endpoint);
        free (self->endpoint);
        free (self);
        errno = saved;
        return NULL;
    }
    static atomic_uint s_connections;
    snprintf (self->client_id, sizeof self->client_id, "client-%d-%u", (int) getpid (),
              atomic_fetch_add (&s_connections, 1));

    int timeout = options->timeout_ms > 0 ? options->timeout_ms : KVPC_DEFAULT_TIMEOUT_MS;
    self->timeout_ms = options->connect_timeout_ms > 0 ? options->connect_timeout_ms : timeout;
    int rc = s_ping (self);
    self->timeout_ms = timeout;
    if (rc) {
        kvpool_destroy (&self);
        errno = rc == KVPOOL_RPC_FAIL ? ETIMEDOUT : EPROTO;
        return NULL;
    }
    char boot_id[64];
    self->same_host = self->host_id[0] && kvp_boot_id (boot_id, sizeof boot_id) == 0
                      && strcmp (boot_id, self->host_id) == 0;
    //  The fast path is an optimisation: when anything about it fails, the socket path
    //  does the work.
    self->use_index = true;
    if (self->same_host && !options->keep_endpoint)
        s_go_local (self);
    if (options->fast_path && self->same_host)
        kvpc_fast_path_open (self);
    self->last_error[0] = 0;
    return self;
}

void
kvpool_destroy (kvpool_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpool_t *self = *self_p;
    kvpc_index_report (self);
    //  Give RELEASEs in flight the chance to reach the node: their pins would otherwise
    //  hold the objects until the leases end.
    if (self->oneway_count && self->socket) {
        kvpc_reply_t reply;
        size_t extra;
        int64_t deadline =
            s_now_ms ()
            + (self->timeout_ms < KVPC_DESTROY_DRAIN_MS ? self->timeout_ms : KVPC_DESTROY_DRAIN_MS);
        //  Id 0 is never sent, so this only drains, until the deadline or no RELEASE is left
        //  (a node answers id 0 only to what it could not decode: dropped here too).
        while (self->oneway_count && s_now_ms () < deadline) {
            int64_t step = s_now_ms () + 10;
            memset (&reply, 0, sizeof reply);
            if (s_recv_reply (self, step < deadline ? step : deadline, 0, 0, &reply, &extra) == 0)
                kvpc_reply_free (&reply);
        }
    }
    kvpc_memory_release_all (self);
    kvpc_fast_path_close (self);
    transfer_pool_destroy (&self->pool);
    if (self->socket)
        zmq_close (self->socket);
    self->socket = NULL;
    //  Every call already waited for its zero-copy frames; this is only a safeguard.
    s_zc_wait (self);
    s_ctx_release (self->endpoint);
    kvpc_index_forget (self);
    free (self->oneway_ids);
    free (self->endpoint);
    free (self);
    *self_p = NULL;
}

bool
kvpool_set_fast_path (kvpool_t *self, bool enabled)
{
    if (!self)
        return false;
    if (!enabled) {
        kvpc_fast_path_close (self);
        return false;
    }
    if (!self->fast_path && self->same_host)
        kvpc_fast_path_open (self);
    return self->fast_path;
}

bool
kvpool_fast_path (kvpool_t *self)
{
    return self && self->fast_path;
}

bool
kvpool_set_index (kvpool_t *self, bool enabled)
{
    if (!self)
        return false;
    self->use_index = enabled;
    return enabled && self->fast_path && self->index;
}

const char *
kvpool_last_error (kvpool_t *self)
{
    return self ? self->last_error : "";
}

int
kvpool_ping (kvpool_t *self)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    return s_ping (self);
}

//  ---- keyed requests -----------------------------------------------------------------------

//  How a keyed request's per-key status becomes the caller's outcome.
typedef enum { KVPC_AS_STATUS, KVPC_AS_EXIST, KVPC_AS_SIZE } kvpc_outcome_t;

//  Collects the valid keys of keys[0..n) into out; invalid ones get INVALID_KEY in results.
//  Returns 0 or INTERNAL_ERROR (out of memory).
static int
s_collect_keys (kvpool_t *self, size_t n, const char *const *keys, kvpc_keys_t *out,
                int64_t *results)
{
    kvpc_keys_init (out);
    for (size_t i = 0; i < n; i++) {
        if (!kvpc_key_valid (keys[i])) {
            results[i] = KVPOOL_INVALID_KEY;
            kvpc_set_error (self, "key %zu is %s", i, keys[i] ? "empty" : "NULL");
        }
        else if (kvpc_keys_add (out, keys[i], i)) {
            kvpc_keys_fini (out);
            for (size_t k = 0; k < n; k++)
                results[k] = KVPOOL_INTERNAL_ERROR;
            kvpc_set_error (self, "out of memory for %zu keys", n);
            return KVPOOL_INTERNAL_ERROR;
        }
    }
    return 0;
}

static int
s_keys_op (kvpool_t *self, Kvpool__V1__Op op, size_t n, const char *const *keys, bool force,
           kvpc_outcome_t as, int64_t *results)
{
    if (!self || (n && (!keys || !results)))
        return KVPOOL_INVALID_PARAMS;
    kvpc_keys_t sent;
    int rc = s_collect_keys (self, n, keys, &sent, results);
    if (rc)
        return rc;
    //  On the node's machine, keys in its read index are answered without asking it.
    if (self->fast_path && (op == KVPOOL__V1__OP__EXIST || op == KVPOOL__V1__OP__GET_SIZE)) {
        kvpc_keys_t rest;
        kvpc_keys_init (&rest);
        kvpc_index_probe (self, &sent, op == KVPOOL__V1__OP__GET_SIZE, results, &rest);
        kvpc_keys_fini (&sent);
        sent = rest;
        //  rest may point at its own inline arrays: re-anchor them in the copy.
        if (rest.keys == rest.inline_keys) {
            sent.keys = sent.inline_keys;
            sent.wire = sent.inline_wire;
            sent.index = sent.inline_index;
        }
    }
    if (sent.count == 0) {
        kvpc_keys_fini (&sent);
        return KVPOOL_OK;
    }
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = op;
    request.n_keys = sent.count;
    request.keys = sent.wire;
    request.force = force;
    kvpc_reply_t reply;
    rc = kvpc_call (self, &request, NULL, 0, 0, &reply);
    if (rc == 0) {
        rc = kvpc_reply_check (self, &reply, sent.count, as == KVPC_AS_SIZE ? KVPC_NEED_SIZES : 0);
        if (rc)
            kvpc_reply_free (&reply);
    }
    if (rc) {
        kvpc_fill (&sent, results, rc);
        kvpc_keys_fini (&sent);
        return rc;
    }
    for (size_t j = 0; j < sent.count; j++) {
        int status = kvpc_reply_key_status (&reply, j);
        int64_t outcome = status;
        if (as == KVPC_AS_EXIST)
            outcome = status == KVPOOL_OK ? 1 : status == KVPOOL_OBJECT_NOT_FOUND ? 0 : status;
        else if (as == KVPC_AS_SIZE && status == KVPOOL_OK)
            outcome = reply.msg->sizes[j] > INT64_MAX ? KVPOOL_PROTOCOL_ERROR
                                                      : (int64_t) reply.msg->sizes[j];
        results[sent.index[j]] = outcome;
    }
    rc = reply.msg->status;
    kvpc_reply_free (&reply);
    kvpc_keys_fini (&sent);
    return rc;
}

//  s_keys_op with int outcomes.
static int
s_keys_op_int (kvpool_t *self, Kvpool__V1__Op op, size_t n, const char *const *keys, bool force,
               kvpc_outcome_t as, int *outcomes)
{
    if (!self || (n && (!keys || !outcomes)))
        return KVPOOL_INVALID_PARAMS;
    int64_t small[16];
    int64_t *results = n <= 16 ? small : malloc (n * sizeof *results);
    if (!results)
        return KVPOOL_INTERNAL_ERROR;
    int rc = s_keys_op (self, op, n, keys, force, as, results);
    for (size_t i = 0; i < n; i++)
        outcomes[i] = (int) results[i];
    if (results != small)
        free (results);
    return rc;
}

//  One key, one outcome.
static int64_t
s_key_op (kvpool_t *self, Kvpool__V1__Op op, const char *key, bool force, kvpc_outcome_t as)
{
    int64_t outcome = KVPOOL_INVALID_PARAMS;
    s_keys_op (self, op, 1, &key, force, as, &outcome);
    return outcome;
}

int
kvpool_exist (kvpool_t *self, const char *key)
{
    return (int) s_key_op (self, KVPOOL__V1__OP__EXIST, key, false, KVPC_AS_EXIST);
}

int64_t
kvpool_get_size (kvpool_t *self, const char *key)
{
    return s_key_op (self, KVPOOL__V1__OP__GET_SIZE, key, false, KVPC_AS_SIZE);
}

int
kvpool_remove (kvpool_t *self, const char *key, bool force)
{
    return (int) s_key_op (self, KVPOOL__V1__OP__REMOVE, key, force, KVPC_AS_STATUS);
}

int
kvpool_exist_batch (kvpool_t *self, size_t n, const char *const *keys, int *results)
{
    return s_keys_op_int (self, KVPOOL__V1__OP__EXIST, n, keys, false, KVPC_AS_EXIST, results);
}

int
kvpool_get_size_batch (kvpool_t *self, size_t n, const char *const *keys, int64_t *results)
{
    return s_keys_op (self, KVPOOL__V1__OP__GET_SIZE, n, keys, false, KVPC_AS_SIZE, results);
}

int
kvpool_remove_batch (kvpool_t *self, size_t n, const char *const *keys, bool force, int *statuses)
{
    return s_keys_op_int (self, KVPOOL__V1__OP__REMOVE, n, keys, force, KVPC_AS_STATUS, statuses);
}

int
kvpool_put_end (kvpool_t *self, size_t n, const char *const *keys, int *statuses)
{
    return s_keys_op_int (self, KVPOOL__V1__OP__PUT_END, n, keys, false, KVPC_AS_STATUS, statuses);
}

int
kvpool_put_revoke (kvpool_t *self, size_t n, const char *const *keys, int *statuses)
{
    return s_keys_op_int (self, KVPOOL__V1__OP__PUT_REVOKE, n, keys, false, KVPC_AS_STATUS,
                          statuses);
}

int
kvpool_release (kvpool_t *self, size_t n, const char *const *keys, int *statuses)
{
    return s_keys_op_int (self, KVPOOL__V1__OP__RELEASE, n, keys, false, KVPC_AS_STATUS, statuses);
}

//  ---- counts -------------------------------------------------------------------------------

static int64_t
s_count_call (kvpool_t *self, Kvpool__V1__Request *request)
{
    kvpc_reply_t reply;
    int rc = s_simple_call (self, request, &reply);
    if (rc)
        return rc;
    int64_t count = reply.msg->count > INT64_MAX ? INT64_MAX : (int64_t) reply.msg->count;
    kvpc_reply_free (&reply);
    return count;
}

int64_t
kvpool_remove_by_regex (kvpool_t *self, const char *pattern, bool force)
{
    if (!self || !pattern)
        return KVPOOL_INVALID_PARAMS;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__REMOVE_BY_REGEX;
    request.pattern = (char *) pattern;
    request.force = force;
    return s_count_call (self, &request);
}

int64_t
kvpool_remove_all (kvpool_t *self, bool force)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__REMOVE_ALL;
    request.force = force;
    return s_count_call (self, &request);
}

int64_t
kvpool_reset (kvpool_t *self)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__RESET;
    return s_count_call (self, &request);
}

//  ---- puts ---------------------------------------------------------------------------------

//  One PUT of keys.
static int
s_socket_put_chunk (kvpool_t *self, const kvpc_keys_t *keys, const kvpc_value_t *values,
                    const kvpool_put_options_t *opts, int64_t *results)
{
    if (keys->count == 0)
        return KVPOOL_OK;
    kvpc_value_t small[8];
    kvpc_value_t *sent = keys->count <= 8 ? small : malloc (keys->count * sizeof *sent);
    if (!sent) {
        kvpc_fill (keys, results, KVPOOL_INTERNAL_ERROR);
        return KVPOOL_INTERNAL_ERROR;
    }
    for (size_t j = 0; j < keys->count; j++)
        sent[j] = values[keys->index[j]];
    Kvpool__V1__PutOptions put;
    kvpc_put_options (opts, &put);
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__PUT;
    request.n_keys = keys->count;
    request.keys = keys->wire;
    request.put = &put;
    kvpc_reply_t reply;
    int rc = kvpc_call (self, &request, sent, keys->count, 0, &reply);
    if (sent != small)
        free (sent);
    if (rc == 0) {
        rc = kvpc_reply_check (self, &reply, keys->count, 0);
        if (rc)
            kvpc_reply_free (&reply);
    }
    if (rc) {
        kvpc_fill (keys, results, rc);
        return rc;
    }
    for (size_t j = 0; j < keys->count; j++)
        results[keys->index[j]] = kvpc_reply_key_status (&reply, j);
    rc = reply.msg->status;
    kvpc_reply_free (&reply);
    return rc;
}

//  Socket batches are cut into runs of keys whose values (or buffers) add up to at most
//  KVPC_CHUNK_BYTES, one request each (see KVPC_CHUNK_BYTES).
typedef uint64_t (s_bytes_fn) (const void *arg, size_t index);

//  Fills chunk (initialised here; the caller finishes it) with the run of keys starting at
//  *start, at least one key, and moves *start past it. Returns false when no keys are left.
static bool
s_next_chunk (const kvpc_keys_t *keys, size_t *start, s_bytes_fn *bytes_of, const void *arg,
              kvpc_keys_t *chunk, int64_t *results)
{
    if (*start >= keys->count)
        return false;
    kvpc_keys_init (chunk);
    uint64_t bytes = 0;
    size_t j = *start;
    for (; j < keys->count; j++) {
        uint64_t size = bytes_of (arg, keys->index[j]);
        if (j > *start && bytes + size > KVPC_CHUNK_BYTES)
            break;
        bytes += size;
        if (kvpc_keys_add (chunk, keys->keys[j], keys->index[j]))
            results[keys->index[j]] = KVPOOL_INTERNAL_ERROR;
    }
    *start = j;
    return true;
}

static uint64_t
s_value_bytes (const void *arg, size_t index)
{
    return ((const kvpc_value_t *) arg)[index].size;
}

int
kvpc_socket_put (kvpool_t *self, const kvpc_keys_t *keys, const kvpc_value_t *values,
                 const kvpool_put_options_t *opts, int64_t *results)
{
    int rc = KVPOOL_OK;
    size_t start = 0;
    kvpc_keys_t chunk;
    while (s_next_chunk (keys, &start, s_value_bytes, values, &chunk, results)) {
        int chunk_rc = s_socket_put_chunk (self, &chunk, values, opts, results);
        if (chunk_rc != KVPOOL_OK)
            rc = chunk_rc;
        kvpc_keys_fini (&chunk);
    }
    return rc;
}

//  Below this many bytes a batch is put over the socket even on the node's machine: the
//  same-machine path takes two round trips (put-start, put-end), the socket one, and for
//  small values the round trip is the whole cost (4 KiB: 484 us against 337 us).
#define KVPC_FAST_PUT_MIN (64u << 10)

static uint64_t
s_batch_bytes (const kvpc_keys_t *keys, const kvpc_value_t *values)
{
    uint64_t bytes = 0;
    for (size_t j = 0; j < keys->count; j++)
        bytes += values[keys->index[j]].size;
    return bytes;
}

//  Every put comes here: n values, value i the concatenation of parts[i][0..nparts[i]).
static int
s_put (kvpool_t *self, size_t n, const char *const *keys, const kvpool_iov_t *const *parts,
       const size_t *nparts, const kvpool_put_options_t *opts, int64_t *results)
{
    kvpc_value_t small[8];
    kvpc_value_t *values = n <= 8 ? small : malloc (n * sizeof *values);
    if (!values) {
        for (size_t i = 0; i < n; i++)
            results[i] = KVPOOL_INTERNAL_ERROR;
        return KVPOOL_INTERNAL_ERROR;
    }
    kvpc_keys_t sent;
    kvpc_keys_init (&sent);
    int rc = KVPOOL_OK;
    for (size_t i = 0; i < n && rc == KVPOOL_OK; i++) {
        values[i] = (kvpc_value_t){parts[i], nparts[i], 0};
        bool valid = parts[i] || nparts[i] == 0;
        for (size_t p = 0; valid && p < nparts[i]; p++) {
            valid = parts[i][p].data || parts[i][p].size == 0;
            values[i].size += parts[i][p].size;
        }
        if (!kvpc_key_valid (keys[i])) {
            results[i] = KVPOOL_INVALID_KEY;
            kvpc_set_error (self, "key %zu is %s", i, keys[i] ? "empty" : "NULL");
        }
        else if (!valid) {
            results[i] = KVPOOL_INVALID_PARAMS;
            kvpc_set_error (self, "value of key '%s' has a NULL buffer", keys[i]);
        }
        else if (kvpc_keys_add (&sent, keys[i], i))
            rc = KVPOOL_INTERNAL_ERROR;
    }
    if (rc) {
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
    }
    else if (self->fast_path && s_batch_bytes (&sent, values) >= KVPC_FAST_PUT_MIN)
        rc = kvpc_fast_put (self, &sent, values, opts, results);
    else
        rc = kvpc_socket_put (self, &sent, values, opts, results);
    kvpc_keys_fini (&sent);
    if (values != small)
        free (values);
    return rc;
}

int
kvpool_put (kvpool_t *self, const char *key, const void *data, size_t size,
            const kvpool_put_options_t *opts)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    kvpool_iov_t part = {data, size};
    const kvpool_iov_t *parts = &part;
    size_t nparts = 1;
    int64_t outcome;
    s_put (self, 1, &key, &parts, &nparts, opts, &outcome);
    return (int) outcome;
}

int
kvpool_put_parts (kvpool_t *self, const char *key, const kvpool_iov_t *parts, size_t nparts,
                  const kvpool_put_options_t *opts)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    int64_t outcome;
    s_put (self, 1, &key, &parts, &nparts, opts, &outcome);
    return (int) outcome;
}

int
kvpool_put_batch (kvpool_t *self, size_t n, const char *const *keys, const void *const *data,
                  const size_t *sizes, const kvpool_put_options_t *opts, int *statuses)
{
    if (!self || (n && (!keys || !data || !sizes || !statuses)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    kvpool_iov_t *iovs = malloc (n * sizeof *iovs);
    const kvpool_iov_t **parts = malloc (n * sizeof *parts);
    size_t *nparts = malloc (n * sizeof *nparts);
    int64_t *results = malloc (n * sizeof *results);
    int rc = KVPOOL_INTERNAL_ERROR;
    if (iovs && parts && nparts && results) {
        for (size_t i = 0; i < n; i++) {
            iovs[i] = (kvpool_iov_t){data[i], sizes[i]};
            parts[i] = &iovs[i];
            nparts[i] = 1;
        }
        rc = s_put (self, n, keys, parts, nparts, opts, results);
        for (size_t i = 0; i < n; i++)
            statuses[i] = (int) results[i];
    }
    else
        for (size_t i = 0; i < n; i++)
            statuses[i] = rc;
    free (iovs);
    free (parts);
    free (nparts);
    free (results);
    return rc;
}

int
kvpool_put_batch_parts (kvpool_t *self, size_t n, const char *const *keys,
                        const kvpool_iov_t *const *parts, const size_t *nparts,
                        const kvpool_put_options_t *opts, int *statuses)
{
    if (!self || (n && (!keys || !parts || !nparts || !statuses)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    int64_t *results = malloc (n * sizeof *results);
    if (!results) {
        for (size_t i = 0; i < n; i++)
            statuses[i] = KVPOOL_INTERNAL_ERROR;
        return KVPOOL_INTERNAL_ERROR;
    }
    int rc = s_put (self, n, keys, parts, nparts, opts, results);
    for (size_t i = 0; i < n; i++)
        statuses[i] = (int) results[i];
    free (results);
    return rc;
}

//  ---- gets ---------------------------------------------------------------------------------

//  Sends GET for keys and receives the reply with one value frame per key.
static int
s_get_call (kvpool_t *self, const kvpc_keys_t *keys, kvpc_reply_t *reply)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__GET;
    request.n_keys = keys->count;
    request.keys = keys->wire;
    int rc = kvpc_call (self, &request, NULL, 0, keys->count, reply);
    if (rc == 0) {
        rc = kvpc_reply_check (self, reply, keys->count, KVPC_NEED_FRAMES);
        if (rc)
            kvpc_reply_free (reply);
    }
    return rc;
}

//  The outcome of key j of a GET reply: its status, checked against its frame.
static int
s_get_key_status (kvpool_t *self, kvpc_reply_t *reply, size_t j)
{
    int status = kvpc_reply_key_status (reply, j);
    if (status == KVPOOL_OK && j < reply->msg->n_sizes
        && reply->msg->sizes[j] != zmq_msg_size (&reply->frames[j])) {
        kvpc_set_error (self, "GET reply: key %zu has size %" PRIu64 " but a %zu-byte frame", j,
                        reply->msg->sizes[j], zmq_msg_size (&reply->frames[j]));
        status = KVPOOL_PROTOCOL_ERROR;
    }
    return status;
}

//  One GET of keys into the caller's buffers.
static int
s_socket_get_chunk (kvpool_t *self, const kvpc_keys_t *keys, const kvpool_buf_t *const *bufs,
                    const size_t *nbufs, int64_t *results)
{
    if (keys->count == 0)
        return KVPOOL_OK;
    kvpc_reply_t reply;
    int rc = s_get_call (self, keys, &reply);
    if (rc) {
        kvpc_fill (keys, results, rc);
        return rc;
    }
    kvpc_copies_t copies;
    kvpc_copies_init (&copies);
    for (size_t j = 0; j < keys->count; j++) {
        size_t i = keys->index[j];
        int status = s_get_key_status (self, &reply, j);
        if (status != KVPOOL_OK) {
            results[i] = status;
            continue;
        }
        size_t size = zmq_msg_size (&reply.frames[j]);
        if (kvpc_bufs_capacity (bufs[i], nbufs[i]) < size) {
            results[i] = KVPOOL_BUFFER_OVERFLOW;
            continue;
        }
        if (kvpc_copies_scatter (&copies, zmq_msg_data (&reply.frames[j]), size, bufs[i], nbufs[i]))
            results[i] = KVPOOL_INTERNAL_ERROR;
        else
            results[i] = (int64_t) size;
    }
    kvpc_copies_run (self, &copies);
    kvpc_copies_fini (&copies);
    rc = reply.msg->status;
    kvpc_reply_free (&reply);
    return rc;
}

typedef struct {
    const kvpool_buf_t *const *bufs;
    const size_t *nbufs;
} s_bufs_t;

static uint64_t
s_buffer_bytes (const void *arg, size_t index)
{
    const s_bufs_t *bufs = (const s_bufs_t *) arg;
    return kvpc_bufs_capacity (bufs->bufs[index], bufs->nbufs[index]);
}

int
kvpc_socket_get_into (kvpool_t *self, const kvpc_keys_t *keys, const kvpool_buf_t *const *bufs,
                      const size_t *nbufs, int64_t *results)
{
    int rc = KVPOOL_OK;
    size_t start = 0;
    s_bufs_t arg = {bufs, nbufs};
    kvpc_keys_t chunk;
    while (s_next_chunk (keys, &start, s_buffer_bytes, &arg, &chunk, results)) {
        int chunk_rc = s_socket_get_chunk (self, &chunk, bufs, nbufs, results);
        if (chunk_rc != KVPOOL_OK)
            rc = chunk_rc;
        kvpc_keys_fini (&chunk);
    }
    return rc;
}

//  Every get into caller buffers comes here.
static int
s_get_into (kvpool_t *self, size_t n, const char *const *keys, const kvpool_buf_t *const *bufs,
            const size_t *nbufs, int64_t *results)
{
    kvpc_keys_t sent;
    kvpc_keys_init (&sent);
    int rc = KVPOOL_OK;
    for (size_t i = 0; i < n && rc == KVPOOL_OK; i++) {
        bool valid = bufs[i] || nbufs[i] == 0;
        for (size_t b = 0; valid && b < nbufs[i]; b++)
            valid = bufs[i][b].data || bufs[i][b].size == 0;
        if (!kvpc_key_valid (keys[i])) {
            results[i] = KVPOOL_INVALID_KEY;
            kvpc_set_error (self, "key %zu is %s", i, keys[i] ? "empty" : "NULL");
        }
        else if (!valid) {
            results[i] = KVPOOL_INVALID_PARAMS;
            kvpc_set_error (self, "buffer for key '%s' is NULL", keys[i]);
        }
        else if (kvpc_keys_add (&sent, keys[i], i))
            rc = KVPOOL_INTERNAL_ERROR;
    }
    if (rc) {
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
    }
    else if (self->fast_path)
        rc = kvpc_fast_get (self, &sent, bufs, nbufs, results);
    else
        rc = kvpc_socket_get_into (self, &sent, bufs, nbufs, results);
    kvpc_keys_fini (&sent);
    return rc;
}

int64_t
kvpool_get_into (kvpool_t *self, const char *key, void *buffer, size_t capacity)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    kvpool_buf_t buf = {buffer, capacity};
    const kvpool_buf_t *bufs = &buf;
    size_t nbufs = 1;
    int64_t outcome;
    s_get_into (self, 1, &key, &bufs, &nbufs, &outcome);
    return outcome;
}

int
kvpool_get_batch_into (kvpool_t *self, size_t n, const char *const *keys, void *const *buffers,
                       const size_t *capacities, int64_t *results)
{
    if (!self || (n && (!keys || !buffers || !capacities || !results)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    kvpool_buf_t *bufs = malloc (n * sizeof *bufs);
    const kvpool_buf_t **lists = malloc (n * sizeof *lists);
    size_t *nbufs = malloc (n * sizeof *nbufs);
    int rc = KVPOOL_INTERNAL_ERROR;
    if (bufs && lists && nbufs) {
        for (size_t i = 0; i < n; i++) {
            bufs[i] = (kvpool_buf_t){buffers[i], capacities[i]};
            lists[i] = &bufs[i];
            nbufs[i] = 1;
        }
        rc = s_get_into (self, n, keys, lists, nbufs, results);
    }
    else
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
    free (bufs);
    free (lists);
    free (nbufs);
    return rc;
}

int
kvpool_get_batch_into_parts (kvpool_t *self, size_t n, const char *const *keys,
                             const kvpool_buf_t *const *bufs, const size_t *nbufs, int64_t *results)
{
    if (!self || (n && (!keys || !bufs || !nbufs || !results)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    return s_get_into (self, n, keys, bufs, nbufs, results);
}

int
kvpool_get (kvpool_t *self, const char *key, void **data_p, size_t *size_p)
{
    if (!self || !data_p || !size_p)
        return KVPOOL_INVALID_PARAMS;
    *data_p = NULL;
    *size_p = 0;
    if (!kvpc_key_valid (key)) {
        kvpc_set_error (self, "key is %s", key ? "empty" : "NULL");
        return KVPOOL_INVALID_KEY;
    }
    kvpc_keys_t sent;
    kvpc_keys_init (&sent);
    kvpc_keys_add (&sent, key, 0); //  fits inline
    kvpc_reply_t reply;
    int rc = s_get_call (self, &sent, &reply);
    kvpc_keys_fini (&sent);
    if (rc)
        return rc;
    rc = s_get_key_status (self, &reply, 0);
    if (rc == KVPOOL_OK) {
        size_t size = zmq_msg_size (&reply.frames[0]);
        void *data = malloc (size ? size : 1);
        if (data) {
            memcpy (data, zmq_msg_data (&reply.frames[0]), size);
            *data_p = data;
            *size_p = size;
        }
        else
            rc = KVPOOL_INTERNAL_ERROR;
    }
    kvpc_reply_free (&reply);
    return rc;
}

//  ---- values received without a copy -----------------------------------------------------

struct _kvpool_values_t {
    size_t count;
    zmq_msg_t *frames; //  one per key; empty where the key failed
};

int
kvpool_get_batch (kvpool_t *self, size_t n, const char *const *keys, kvpool_values_t **values_p,
                  int *statuses)
{
    if (!self || !values_p || (n && (!keys || !statuses)))
        return KVPOOL_INVALID_PARAMS;
    *values_p = NULL;
    kvpool_values_t *values = calloc (1, sizeof *values);
    if (values)
        values->frames = malloc ((n ? n : 1) * sizeof *values->frames);
    int64_t *results = malloc ((n ? n : 1) * sizeof *results);
    if (!values || !values->frames || !results) {
        if (values)
            free (values->frames);
        free (values);
        free (results);
        for (size_t i = 0; i < n; i++)
            statuses[i] = KVPOOL_INTERNAL_ERROR;
        return KVPOOL_INTERNAL_ERROR;
    }
    values->count = n;
    for (size_t i = 0; i < n; i++)
        zmq_msg_init (&values->frames[i]);
    *values_p = values;

    kvpc_keys_t sent;
    int rc = s_collect_keys (self, n, keys, &sent, results);
    if (rc == 0 && sent.count) {
        kvpc_reply_t reply;
        rc = s_get_call (self, &sent, &reply);
        if (rc)
            kvpc_fill (&sent, results, rc);
        else {
            for (size_t j = 0; j < sent.count; j++) {
                size_t i = sent.index[j];
                results[i] = s_get_key_status (self, &reply, j);
                //  The frame moves into values: no byte is copied.
                if (results[i] == KVPOOL_OK)
                    zmq_msg_move (&values->frames[i], &reply.frames[j]);
            }
            rc = reply.msg->status;
            kvpc_reply_free (&reply);
        }
    }
    kvpc_keys_fini (&sent);
    for (size_t i = 0; i < n; i++)
        statuses[i] = (int) results[i];
    free (results);
    return rc;
}

const void *
kvpool_values_data (kvpool_values_t *self, size_t index)
{
    if (!self || index >= self->count || zmq_msg_size (&self->frames[index]) == 0)
        return NULL;
    return zmq_msg_data (&self->frames[index]);
}

size_t
kvpool_values_size (kvpool_values_t *self, size_t index)
{
    if (!self || index >= self->count)
        return 0;
    return zmq_msg_size (&self->frames[index]);
}

void
kvpool_values_destroy (kvpool_values_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpool_values_t *self = *self_p;
    for (size_t i = 0; i < self->count; i++)
        zmq_msg_close (&self->frames[i]);
    free (self->frames);
    free (self);
    *self_p = NULL;
}

//  ---- two-phase puts and replica lists ---------------------------------------------------

//  Copies key j's placement out of a PUT_START or GET_REPLICA_LIST reply.
static void
s_placement (kvpool_t *self, kvpc_reply_t *reply, size_t j, kvpool_placement_t *placement)
{
    memset (placement, 0, sizeof *placement);
    placement->status = kvpc_reply_key_status (reply, j);
    if (placement->status != KVPOOL_OK)
        return;
    Kvpool__V1__Reply *msg = reply->msg;
    if (j < msg->n_sizes)
        placement->size = msg->sizes[j];
    Kvpool__V1__KeyReplicas *list = msg->replicas[j];
    size_t count = list ? list->n_replicas : 0;
    if (count > KVPOOL_MAX_REPLICAS) {
        kvpc_set_error (self, "%zu replicas for one key (at most %d)", count, KVPOOL_MAX_REPLICAS);
        placement->status = KVPOOL_PROTOCOL_ERROR;
        return;
    }
    placement->replica_count = (uint32_t) count;
    for (size_t r = 0; r < count; r++) {
        placement->replicas[r].segment_id = list->replicas[r]->segment_id;
        placement->replicas[r].offset = list->replicas[r]->offset;
    }
}

static void
s_placements_fill (kvpool_placement_t *placements, size_t n, int status)
{
    for (size_t i = 0; i < n; i++) {
        memset (&placements[i], 0, sizeof placements[i]);
        placements[i].status = status;
    }
}

//  PUT_START (with sizes) or GET_REPLICA_LIST (with pin), reported as placements.
static int
s_placement_op (kvpool_t *self, Kvpool__V1__Request *request, size_t n, const char *const *keys,
                const uint64_t *sizes, kvpool_placement_t *placements)
{
    int64_t small[16];
    int64_t *results = n <= 16 ? small : malloc (n * sizeof *results);
    if (!results) {
        s_placements_fill (placements, n, KVPOOL_INTERNAL_ERROR);
        return KVPOOL_INTERNAL_ERROR;
    }
    s_placements_fill (placements, n, KVPOOL_OK);
    kvpc_keys_t sent;
    int rc = s_collect_keys (self, n, keys, &sent, results);
    uint64_t *sent_sizes = NULL;
    if (rc == 0 && sizes && sent.count) {
        sent_sizes = malloc (sent.count * sizeof *sent_sizes);
        if (sent_sizes)
            for (size_t j = 0; j < sent.count; j++)
                sent_sizes[j] = sizes[sent.index[j]];
        else
            rc = KVPOOL_INTERNAL_ERROR;
    }
    if (rc) {
        s_placements_fill (placements, n, rc);
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (!kvpc_key_valid (keys[i]))
            placements[i].status = KVPOOL_INVALID_KEY;
    if (sent.count == 0)
        goto done;
    request->n_keys = sent.count;
    request->keys = sent.wire;
    if (sizes) {
        request->n_sizes = sent.count;
        request->sizes = sent_sizes;
    }
    kvpc_reply_t reply;
    rc = kvpc_call (self, request, NULL, 0, 0, &reply);
    if (rc == 0) {
        rc = kvpc_reply_check (self, &reply, sent.count,
                               KVPC_NEED_REPLICAS | (sizes ? 0 : KVPC_NEED_SIZES));
        if (rc)
            kvpc_reply_free (&reply);
    }
    if (rc) {
        for (size_t j = 0; j < sent.count; j++)
            placements[sent.index[j]].status = rc;
        goto done;
    }
    for (size_t j = 0; j < sent.count; j++) {
        size_t i = sent.index[j];
        s_placement (self, &reply, j, &placements[i]);
        if (sizes && placements[i].status == KVPOOL_OK)
            placements[i].size = sizes[i];
    }
    rc = reply.msg->status;
    kvpc_reply_free (&reply);
done:
    free (sent_sizes);
    kvpc_keys_fini (&sent);
    if (results != small)
        free (results);
    return rc;
}

int
kvpool_put_start (kvpool_t *self, size_t n, const char *const *keys, const uint64_t *sizes,
                  const kvpool_put_options_t *opts, kvpool_placement_t *placements)
{
    if (!self || (n && (!keys || !sizes || !placements)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    //  A placement holds at most KVPOOL_MAX_REPLICAS replicas.
    if (opts && opts->replica_num > KVPOOL_MAX_REPLICAS) {
        kvpc_set_error (self, "replica_num %u is more than %d", opts->replica_num,
                        KVPOOL_MAX_REPLICAS);
        s_placements_fill (placements, n, KVPOOL_INVALID_REPLICA);
        return KVPOOL_INVALID_REPLICA;
    }
    Kvpool__V1__PutOptions put;
    kvpc_put_options (opts, &put);
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__PUT_START;
    request.put = &put;
    return s_placement_op (self, &request, n, keys, sizes, placements);
}

int
kvpool_get_replica_list (kvpool_t *self, size_t n, const char *const *keys, bool pin,
                         kvpool_placement_t *placements)
{
    if (!self || (n && (!keys || !placements)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__GET_REPLICA_LIST;
    request.pin = pin;
    return s_placement_op (self, &request, n, keys, NULL, placements);
}

//  ---- segments and stats -------------------------------------------------------------------

int
kvpool_segments (kvpool_t *self, kvpool_segment_t *segments, size_t capacity)
{
    if (!self || (capacity && !segments))
        return KVPOOL_INVALID_PARAMS;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__SEGMENTS;
    kvpc_reply_t reply;
    int rc = s_simple_call (self, &request, &reply);
    if (rc)
        return rc;
    Kvpool__V1__Reply *msg = reply.msg;
    for (size_t i = 0; i < msg->n_segments && i < capacity; i++) {
        Kvpool__V1__Segment *from = msg->segments[i];
        kvpool_segment_t *to = &segments[i];
        memset (to, 0, sizeof *to);
        to->id = from->id;
        snprintf (to->name, sizeof to->name, "%s", from->name ? from->name : "");
        to->size = from->size;
        to->used = from->used;
    }
    int count = msg->n_segments > INT32_MAX ? INT32_MAX : (int) msg->n_segments;
    kvpc_reply_free (&reply);
    return count;
}

int
kvpool_mount_segment (kvpool_t *self, const char *shm_name, uint64_t size, uint32_t *id_p)
{
    if (!self || !shm_name || !*shm_name)
        return KVPOOL_INVALID_PARAMS;
    Kvpool__V1__Segment segment = KVPOOL__V1__SEGMENT__INIT;
    segment.name = (char *) shm_name;
    segment.size = size;
    segment.owner = self->client_id;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__MOUNT_SEGMENT;
    request.segment = &segment;
    kvpc_reply_t reply;
    int rc = s_simple_call (self, &request, &reply);
    if (rc)
        return rc;
    if (reply.msg->n_segments < 1) {
        kvpc_set_error (self, "MOUNT_SEGMENT reply carries no segment");
        rc = KVPOOL_PROTOCOL_ERROR;
    }
    else if (id_p)
        *id_p = reply.msg->segments[0]->id;
    kvpc_reply_free (&reply);
    return rc;
}

int
kvpool_unmount_segment (kvpool_t *self, uint32_t id)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    Kvpool__V1__Segment segment = KVPOOL__V1__SEGMENT__INIT;
    segment.id = id;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__UNMOUNT_SEGMENT;
    request.segment = &segment;
    return s_simple_call (self, &request, NULL);
}

int
kvpool_stats (kvpool_t *self, kvpool_stats_t *stats)
{
    if (!self || !stats)
        return KVPOOL_INVALID_PARAMS;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__STATS;
    kvpc_reply_t reply;
    int rc = s_simple_call (self, &request, &reply);
    if (rc)
        return rc;
    Kvpool__V1__Stats *from = reply.msg->stats;
    if (!from) {
        kvpc_set_error (self, "STATS reply carries no stats");
        kvpc_reply_free (&reply);
        return KVPOOL_PROTOCOL_ERROR;
    }
    memset (stats, 0, sizeof *stats);
#define KVPC_STATS_COPY(type, name, text) stats->name = from->name;
    KVPOOL_STATS_FIELDS (KVPC_STATS_COPY)
#undef KVPC_STATS_COPY
    kvpc_reply_free (&reply);
    return KVPOOL_OK;
}

const char *
kvpool_strerror (int status)
{
    return kvp_strerror (status);
}

const char *
kvpool_status_name (int status)
{
    return kvp_status_name (status);
}
