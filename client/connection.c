/*  connection.c - one connection to a kvpoold node: the socket, requests and their replies
    (connection.h).

    Wire: a DEALER socket connected to the node's ROUTER. A request goes out as
    [Request][value frames...] (no empty delimiter frame) and its reply comes back as
    [Reply][value frames...] (protocol/kvpool.proto). Request ids are monotonic per
    connection; a call waits for the reply carrying its id and discards any other reply it
    sees first (late replies to calls that timed out). One-way requests (the fast path's
    RELEASE and TOUCH) set no_reply, so the node sends nothing back and there is nothing to
    remember of them: what has to be ensured is only that they leave before the socket is
    closed. Once a later call is answered the node has them (it reads a connection's
    requests in order); those sent since are given up to KVPC_CLOSE_WAIT_MS after the close
    (ZMQ_LINGER, kvpc_conn_destroy).

    Copies: put values of KVPC_ZERO_COPY_MIN bytes or more are given to libzmq without a copy,
    and a call does not return before libzmq has let go of them (after a timeout the socket is
    closed and reopened to make it let go), so the caller may reuse its buffers as soon as a
    call returns. A GET reply's value frames are kept as received, for the layers above to
    copy out or hand out.

    Threads: a connection belongs to one thread at a time. Connections share the process
    context (process.h): its ZeroMQ context, made with the first connection and terminated
    with the last. libzmq's I/O thread only touches zc_pending.
*/
#include "client/connection.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <czmq.h>

#include "client/connect_probe.h"
#include "protocol/contract.h"
#include "protocol/status.h"

//  Put values at least this large go to libzmq without a copy (see s_send_request).
#define KVPC_ZERO_COPY_MIN (64u << 10)
//  How long a connection waits for the node on its ipc endpoint before it stays where it is.
#define KVPC_LOCAL_PING_MS 1000
//  kvpc_conn_new: every connect attempt refused for this long (libzmq tries every 100 ms)
//  means nothing listens: long enough for a node that is binding its sockets as the client
//  starts, far shorter than the connect timeout a node that is there but slow gets.
#define KVPC_REFUSED_MS 500

struct _kvpc_conn_t {
    kvpc_process_t *process; //  the process context (a reference)
    void *ctx;               //  the ZeroMQ context of socket
    void *socket;            //  DEALER, or NULL after a reconnect failed
    char *endpoint;
    int timeout_ms;
    uint64_t next_id;    //  request ids, monotonic per connection
    uint64_t generation; //  sockets replaced so far
    bool oneway_pending; //  a one-way request went out after the last reply came
    bool same_host;      //  the node's host id is this process's (kvp_host_id)
    bool cluster;        //  the node is one of a cluster's (PING)
    char last_error[256];
    //  The node's master, as its last STATS said ("": none).
    char master_endpoint[256];
    char client_id[96];       //  owner name for segments this client mounts
    char host_id[64];         //  the node's host id (PING)
    char server_id[96];       //  the node's host id + pid (PING)
    char local_endpoint[256]; //  the node's ipc endpoint for same-machine clients (PING)
    transfer_pool_t *pool;    //  copy threads, made on the first large copy
    kvpc_device_t *device;    //  device memory of the calls (device.h), made on first need
    uint32_t *placed;         //  where puts say the replicas each key got, or NULL
    atomic_size_t zc_pending; //  zero-copy value frames libzmq still holds
    bool has_curve;
    kvpc_curve_t curve;                   //  CURVE keys, when has_curve
    bool watching;                        //  in kvpc_conn_new: connects and handshakes are watched
    void *auth_monitor;                   //  PAIR: the socket's events until the first PING
    int handshake;                        //  the first ZMQ_EVENT_HANDSHAKE_FAILED_* seen, or 0
    uint32_t handshake_value;             //  ... and its status
    int64_t refused_since;                //  every connect attempt failed since (ms), or 0
    int refused;                          //  why the first PING was given up: a connect errno, or 0
    kvpc_conn_t *peers[KVPC_MAX_PEERS];   //  other nodes of a cluster (kvpc_conn_peer)
    char *peer_endpoints[KVPC_MAX_PEERS]; //  ... as the REDIRECT named them
    size_t peer_count;
    //  The reply to a request still outstanding that came in while another was awaited
    //  (kvpc_call_recv_ahead), with its id: kvpc_call_recv of that request takes it.
    kvpc_reply_t early;
    uint64_t early_id;
    size_t early_extra; //  its value frames past those expected
    //  The last request id sent before the socket was last replaced: no reply to it or an
    //  earlier one can come any more.
    uint64_t reset_below;
};

//  ---- the ZeroMQ context ----------------------------------------------------------------

//  inproc:// endpoints live in a context: an in-process client of kvpoold (the lookup
//  server) must use CZMQ's global context, where the api binds. Every other connection uses
//  the process context's (process.h), so a host process that never closes a connection can
//  still exit (CZMQ terminates its context at exit and would wait for our sockets).
static bool
s_is_inproc (const char *endpoint)
{
    return endpoint && strncmp (endpoint, "inproc://", 9) == 0;
}

static void *
s_ctx_of (kvpc_process_t *process, const char *endpoint)
{
    return s_is_inproc (endpoint) ? zsys_init () : kvpc_process_zmq (process);
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
kvpc_set_error (kvpc_conn_t *self, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    vsnprintf (self->last_error, sizeof self->last_error, format, args);
    va_end (args);
}

void
kvpc_clear_error (kvpc_conn_t *self)
{
    self->last_error[0] = 0;
}

void
kvpc_conn_set_master_endpoint (kvpc_conn_t *self, const char *endpoint)
{
    snprintf (self->master_endpoint, sizeof self->master_endpoint, "%s", endpoint ? endpoint : "");
}

const char *
kvpc_conn_master_endpoint (kvpc_conn_t *self)
{
    return self->master_endpoint;
}

const char *
kvpc_conn_last_error (kvpc_conn_t *self)
{
    return self->last_error;
}

//  ---- the socket ---------------------------------------------------------------------------

static void s_auth_watch (kvpc_conn_t *self, void *ctx, void *socket);

static int
s_socket_open (kvpc_conn_t *self, void *ctx)
{
    void *socket = zmq_socket (ctx, ZMQ_DEALER);
    if (!socket)
        return -1;
    //  Linger 0: closing never blocks on a node that is gone (kvpc_conn_destroy raises it
    //  for one-way requests). No high-water marks: a large batch is one multipart message
    //  and must never be refused or block half-sent.
    int zero = 0;
    zmq_setsockopt (socket, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt (socket, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt (socket, ZMQ_RCVHWM, &zero, sizeof zero);
    if (self->has_curve) {
        zmq_setsockopt (socket, ZMQ_CURVE_SERVERKEY, self->curve.server_key, 40);
        zmq_setsockopt (socket, ZMQ_CURVE_PUBLICKEY, self->curve.public_key, 40);
        zmq_setsockopt (socket, ZMQ_CURVE_SECRETKEY, self->curve.secret_key, 40);
    }
    if (self->watching && !self->auth_monitor)
        s_auth_watch (self, ctx, socket);
    if (zmq_connect (socket, self->endpoint)) {
        int saved = errno;
        if (self->auth_monitor) {
            //  (An open PAIR would keep zmq_ctx_term waiting.)
            zmq_socket_monitor (socket, NULL, 0);
            zmq_close (self->auth_monitor);
            self->auth_monitor = NULL;
        }
        zmq_close (socket);
        errno = saved;
        return -1;
    }
    self->socket = socket;
    self->oneway_pending = false;
    return 0;
}

//  ---- CURVE handshake failures ------------------------------------------------------------

void *
kvpc_socket_watch (void *ctx, void *socket, int events)
{
    static atomic_uint s_watches;
    char endpoint[96];
    snprintf (endpoint, sizeof endpoint, "inproc://kvpool-watch-%d-%u", (int) getpid (),
              atomic_fetch_add (&s_watches, 1));
    if (zmq_socket_monitor (socket, endpoint, events))
        return NULL;
    void *pair = zmq_socket (ctx, ZMQ_PAIR);
    int zero = 0;
    if (pair)
        zmq_setsockopt (pair, ZMQ_LINGER, &zero, sizeof zero);
    if (!pair || zmq_connect (pair, endpoint)) {
        if (pair)
            zmq_close (pair);
        zmq_socket_monitor (socket, NULL, 0);
        return NULL;
    }
    return pair;
}

//  Watches socket's connects and handshakes (before it connects), so that a connection that
//  gets no answer can say whether nothing listens or the node refused its key.
static void
s_auth_watch (kvpc_conn_t *self, void *ctx, void *socket)
{
    self->auth_monitor = kvpc_socket_watch (
        ctx, socket,
        ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CLOSED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
            | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL);
}

//  Reads the events the monitor has. A connect attempt that failed closes its socket
//  (ZMQ_EVENT_CLOSED; a connection that ends after connecting says DISCONNECTED instead), one
//  that succeeded says CONNECTED.
static void
s_watch_read (kvpc_conn_t *self)
{
    while (self->auth_monitor) {
        zmq_msg_t frame;
        zmq_msg_init (&frame);
        if (zmq_msg_recv (&frame, self->auth_monitor, ZMQ_DONTWAIT) == -1) {
            zmq_msg_close (&frame);
            return;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size (&frame) >= 6) {
            const uint8_t *data = (const uint8_t *) zmq_msg_data (&frame);
            memcpy (&event, data, 2);
            memcpy (&value, data + 2, 4);
        }
        bool more = zmq_msg_more (&frame);
        zmq_msg_close (&frame);
        while (more) { //  the endpoint
            zmq_msg_init (&frame);
            more = zmq_msg_recv (&frame, self->auth_monitor, 0) != -1 && zmq_msg_more (&frame);
            zmq_msg_close (&frame);
        }
        if (event == ZMQ_EVENT_CONNECTED)
            self->refused_since = 0;
        else if (event == ZMQ_EVENT_CLOSED && !self->refused_since)
            self->refused_since = s_now_ms ();
        else if ((event
                  & (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL))
                 && !self->handshake) {
            self->handshake = event;
            self->handshake_value = value;
        }
    }
}

//  While the first PING waits (s_recv_reply): whether to give it up because nothing listens,
//  with the reason in self->refused. Every attempt refused for KVPC_REFUSED_MS, or until the
//  deadline, is asked of the kernel once (connect_probe.h): someone listening by now keeps
//  the wait going.
static bool
s_watch_refused (kvpc_conn_t *self, int64_t now, int64_t deadline)
{
    if (!self->auth_monitor || !self->refused_since
        || (now - self->refused_since < KVPC_REFUSED_MS && now < deadline))
        return false;
    int error = kvpc_connect_probe (self->endpoint, 100);
    if (error == 0) {
        self->refused_since = 0;
        return false;
    }
    self->refused = error > 0 ? error : ECONNREFUSED;
    return true;
}

//  Stops watching; returns the first handshake failure seen (a ZMQ_EVENT_HANDSHAKE_* event
//  and its status in *value), or 0.
static int
s_auth_unwatch (kvpc_conn_t *self, uint32_t *value)
{
    if (!self->auth_monitor)
        return 0;
    s_watch_read (self);
    int event = self->handshake;
    *value = self->handshake_value;
    if (self->socket)
        zmq_socket_monitor (self->socket, NULL, 0);
    zmq_close (self->auth_monitor);
    self->auth_monitor = NULL;
    return event;
}

//  Closes the socket (dropping everything queued on it) and connects a new one.
static void s_early_drop (kvpc_conn_t *self);

static void
s_socket_reset (kvpc_conn_t *self)
{
    s_early_drop (self); //  (no reply to an earlier request comes on the new socket)
    self->reset_below = self->next_id;
    if (self->socket)
        zmq_close (self->socket);
    self->socket = NULL;
    self->generation++;
    s_socket_open (self, self->ctx);
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
s_zc_wait (kvpc_conn_t *self)
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
s_zc_drain (kvpc_conn_t *self, bool timed_out)
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
s_send_request (kvpc_conn_t *self, Kvpool__V1__Request *request, const kvpc_value_t *values,
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

//  Receives whole messages until the reply to want_id arrives (0) or the deadline passes
//  (-1). Value frames of that reply are kept, up to expect_frames of them; further ones are
//  counted in extra.
static int
s_recv_reply (kvpc_conn_t *self, int64_t deadline, uint64_t want_id, size_t expect_frames,
              uint64_t keep_id, size_t keep_frames, kvpc_reply_t *reply, size_t *extra)
{
    while (self->socket) {
        int64_t now = s_now_ms ();
        if (s_watch_refused (self, now, deadline))
            return -2;
        int64_t left = deadline - now;
        if (left <= 0)
            return -1;
        //  While the first PING waits, the monitor's events too, and a look at least every
        //  100 ms at whether every connect was refused.
        zmq_pollitem_t items[2] = {{self->socket, 0, ZMQ_POLLIN, 0},
                                   {self->auth_monitor, 0, ZMQ_POLLIN, 0}};
        int nitems = self->auth_monitor ? 2 : 1;
        long wait = nitems == 2 && left > 100 ? 100 : (long) left;
        int rc = zmq_poll (items, nitems, wait);
        if (rc == -1 && errno != EINTR)
            return -1;
        if (nitems == 2 && (items[1].revents & ZMQ_POLLIN))
            s_watch_read (self);
        if (rc <= 0 || !(items[0].revents & ZMQ_POLLIN))
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
        //  The reply to the other request outstanding, ahead of this one's: kept.
        bool keep = msg && !mine && keep_id && msg->request_id == keep_id && !self->early_id;
        size_t frames_wanted = mine ? expect_frames : keep_frames;
        zmq_msg_t *frames = NULL;
        if ((mine || keep) && frames_wanted) {
            frames = malloc (frames_wanted * sizeof *frames);
            if (!frames) {
                kvpc_set_error (self, "out of memory for %zu reply frames", frames_wanted);
                mine = keep = false; //  drained below; the call then times out
            }
        }
        size_t nframes = 0;
        size_t extras = 0;
        bool broken = false;
        while (more) {
            zmq_msg_t scratch;
            zmq_msg_t *part =
                (mine || keep) && nframes < frames_wanted ? &frames[nframes] : &scratch;
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
        if (keep && !broken) {
            self->early = (kvpc_reply_t){msg, frames, nframes};
            self->early_id = keep_id;
            self->early_extra = extras;
            continue;
        }
        if (!mine || broken) {
            for (size_t i = 0; i < nframes; i++)
                zmq_msg_close (&frames[i]);
            free (frames);
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

//  ---- calls --------------------------------------------------------------------------------

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
kvpc_call (kvpc_conn_t *self, Kvpool__V1__Request *request, const kvpc_value_t *values,
           size_t nvalues, size_t expect_frames, kvpc_reply_t *reply)
{
    memset (reply, 0, sizeof *reply);
    int rc = s_send_request (self, request, values, nvalues);
    if (rc)
        return rc;
    return kvpc_call_recv (self, request, expect_frames, reply);
}

int
kvpc_call_send (kvpc_conn_t *self, Kvpool__V1__Request *request)
{
    return s_send_request (self, request, NULL, 0);
}

//  Lets go of a reply kept for a request nobody will ask for now.
static void
s_early_drop (kvpc_conn_t *self)
{
    if (self->early_id)
        kvpc_reply_free (&self->early);
    self->early_id = 0;
    self->early_extra = 0;
}

int
kvpc_call_recv (kvpc_conn_t *self, Kvpool__V1__Request *request, size_t expect_frames,
                kvpc_reply_t *reply)
{
    return kvpc_call_recv_ahead (self, request, expect_frames, NULL, 0, reply);
}

int
kvpc_call_recv_ahead (kvpc_conn_t *self, Kvpool__V1__Request *request, size_t expect_frames,
                      const Kvpool__V1__Request *ahead, size_t ahead_frames, kvpc_reply_t *reply)
{
    memset (reply, 0, sizeof *reply);
    int rc;
    size_t extra = 0;
    if (self->early_id && self->early_id == request->request_id) {
        *reply = self->early;
        extra = self->early_extra;
        memset (&self->early, 0, sizeof self->early);
        self->early_id = 0;
        self->early_extra = 0;
        rc = 0;
    }
    else if (request->request_id <= self->reset_below) {
        //  Sent on a socket since replaced (a send of a later request failed): its reply
        //  cannot come, and waiting for it would only run out the timeout.
        kvpc_set_error (self, "the connection to %s was reset before the reply to %s",
                        self->endpoint, s_op_name (request->op));
        return KVPOOL_RPC_FAIL;
    }
    else {
        s_early_drop (self); //  (a reply to a request given up)
        rc = s_recv_reply (self, s_now_ms () + self->timeout_ms, request->request_id, expect_frames,
                           ahead ? ahead->request_id : 0, ahead_frames, reply, &extra);
    }
    s_zc_drain (self, rc != 0);
    //  The node reads a connection's requests in order: it has every one-way request sent
    //  before this one.
    if (rc == 0)
        self->oneway_pending = false;
    if (rc == -2 && (self->refused == ECONNREFUSED || self->refused == ENOENT)) {
        kvpc_set_error (self, "connection refused: nothing listens on %s (%s)", self->endpoint,
                        strerror (self->refused));
        return KVPOOL_RPC_FAIL;
    }
    if (rc == -2) {
        kvpc_set_error (self, "cannot reach %s: %s", self->endpoint, strerror (self->refused));
        return KVPOOL_RPC_FAIL;
    }
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
kvpc_send_oneway (kvpc_conn_t *self, Kvpool__V1__Request *request)
{
    request->no_reply = true;
    int rc = s_send_request (self, request, NULL, 0);
    if (rc == 0)
        self->oneway_pending = true;
    return rc;
}

int
kvpc_call_brief (kvpc_conn_t *self, Kvpool__V1__Request *request, int timeout_ms,
                 kvpc_reply_t *reply)
{
    int timeout = self->timeout_ms;
    if (timeout_ms < timeout)
        self->timeout_ms = timeout_ms;
    int rc = kvpc_call (self, request, NULL, 0, 0, reply);
    self->timeout_ms = timeout;
    return rc;
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
kvpc_reply_check (kvpc_conn_t *self, kvpc_reply_t *reply, size_t nkeys, int need)
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

//  ---- connecting ---------------------------------------------------------------------------

int
kvpc_conn_ping (kvpc_conn_t *self)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__PING;
    kvpc_reply_t reply;
    int rc = kvpc_call (self, &request, NULL, 0, 0, &reply);
    if (rc)
        return rc;
    rc = reply.msg->status;
    if (rc == KVPOOL_OK) {
        if (reply.msg->host_id)
            snprintf (self->host_id, sizeof self->host_id, "%s", reply.msg->host_id);
        snprintf (self->server_id, sizeof self->server_id, "%s",
                  reply.msg->server_id ? reply.msg->server_id : "");
        snprintf (self->local_endpoint, sizeof self->local_endpoint, "%s",
                  reply.msg->local_endpoint ? reply.msg->local_endpoint : "");
        self->cluster = reply.msg->cluster;
    }
    kvpc_reply_free (&reply);
    return rc;
}

//  Whether the node serves this process here: a TOUCH with nothing in it (answered by the
//  api alone) is refused PERMISSION_DENIED on the ipc endpoint to a user the node does not
//  let in, where PING is not.
static bool
s_allowed (kvpc_conn_t *self)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__TOUCH;
    kvpc_reply_t reply;
    if (kvpc_call (self, &request, NULL, 0, 0, &reply))
        return false;
    bool allowed = reply.msg->status != KVPOOL_PERMISSION_DENIED;
    kvpc_reply_free (&reply);
    return allowed;
}

//  A client on the node's machine talks to the node's ipc endpoint: only there does the node
//  know which process it is, and only there does it serve the shared-memory operations
//  (docs/security.md). The move is kept only if the same node answers there (another
//  network namespace, say, has no such socket, or another node's) and lets this process's
//  user in (another user, not in --group, keeps the tcp connection and its whole values).
static void
s_go_local (kvpc_conn_t *self)
{
    if (!self->local_endpoint[0] || strcmp (self->endpoint, self->local_endpoint) == 0
        || s_is_inproc (self->endpoint))
        return;
    char server_id[sizeof self->server_id];
    memcpy (server_id, self->server_id, sizeof server_id);
    char *endpoint = strdup (self->local_endpoint);
    if (!endpoint)
        return;
    void *old_socket = self->socket;
    char *old_endpoint = self->endpoint;
    int timeout = self->timeout_ms;
    self->socket = NULL;
    self->endpoint = endpoint;
    self->timeout_ms = timeout < KVPC_LOCAL_PING_MS ? timeout : KVPC_LOCAL_PING_MS;
    bool moved = s_socket_open (self, self->ctx) == 0 && kvpc_conn_ping (self) == KVPOOL_OK
                 && strcmp (server_id, self->server_id) == 0 && s_allowed (self);
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
    memcpy (self->server_id, server_id, sizeof server_id);
}

static __thread char s_connect_error[400];

const char *
kvpc_connect_error (void)
{
    return s_connect_error;
}

void
kvpc_set_connect_error (const char *format, ...)
{
    va_list args;
    va_start (args, format);
    vsnprintf (s_connect_error, sizeof s_connect_error, format, args);
    va_end (args);
}

kvpc_conn_t *
kvpc_conn_new (const char *endpoint, int timeout_ms, int connect_timeout_ms, bool keep_endpoint,
               const kvpc_curve_t *curve)
{
    s_connect_error[0] = 0;
    kvpc_conn_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    atomic_init (&self->zc_pending, 0);
    if (curve) {
        self->has_curve = true;
        self->curve = *curve;
    }
    //  A node that refuses the key, or runs CURVE while this client does not (or the other
    //  way round), only fails the handshake: watching it tells that from no answer at all.
    self->watching = !s_is_inproc (endpoint);
    self->endpoint = strdup (endpoint);
    self->process = kvpc_process_acquire ();
    void *ctx = self->process ? s_ctx_of (self->process, endpoint) : NULL;
    if (!self->endpoint || !ctx) {
        kvpc_process_release (&self->process);
        free (self->endpoint);
        free (self);
        errno = ENOMEM;
        return NULL;
    }
    self->ctx = ctx;
    if (s_socket_open (self, ctx)) {
        int saved = errno;
        kvpc_set_connect_error ("%s", zmq_strerror (saved));
        kvpc_process_release (&self->process);
        free (self->endpoint);
        free (self);
        errno = saved;
        return NULL;
    }
    static atomic_uint s_connections;
    snprintf (self->client_id, sizeof self->client_id, "client-%d-%u", (int) getpid (),
              atomic_fetch_add (&s_connections, 1));

    self->timeout_ms = connect_timeout_ms > 0 ? connect_timeout_ms : timeout_ms;
    int rc = kvpc_conn_ping (self);
    self->timeout_ms = timeout_ms;
    uint32_t value = 0;
    int failure = s_auth_unwatch (self, &value);
    self->watching = false;
    if (rc) {
        int error = failure == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? EACCES
                    : failure                                  ? EKEYREJECTED
                    : self->refused == ENOENT                  ? ECONNREFUSED
                    : self->refused                            ? self->refused
                    : rc == KVPOOL_RPC_FAIL                    ? ETIMEDOUT
                                                               : EPROTO;
        if (error == EACCES)
            kvpc_set_connect_error ("the node refused this client's CURVE key (its public "
                                    "certificate is not in the node's --curve-allow directory)");
        else if (error == EKEYREJECTED && self->has_curve)
            kvpc_set_connect_error ("the CURVE handshake failed (a wrong server certificate, or "
                                    "CURVE on this client only)");
        else if (error == EKEYREJECTED)
            kvpc_set_connect_error ("the CURVE handshake failed (CURVE on the node but not on "
                                    "this client, or what listens there is not a kvpoold)");
        else if (error == EPROTO)
            kvpc_set_connect_error ("PING answered %s%s%s", kvp_status_name (rc),
                                    self->last_error[0] ? ": " : "", self->last_error);
        else
            kvpc_set_connect_error ("%s", self->last_error);
        kvpc_conn_destroy (&self);
        errno = error;
        return NULL;
    }
    //  The node's host id as this process would make it (kvp_host_id: boot id and network
    //  namespace): a node in another container is not on "this machine" for shared memory.
    char host_id[64];
    self->same_host = self->host_id[0] && kvp_host_id (host_id, sizeof host_id) == 0
                      && strcmp (host_id, self->host_id) == 0;
    if (self->same_host && !keep_endpoint)
        s_go_local (self);
    return self;
}

kvpc_conn_t *
kvpc_conn_peer (kvpc_conn_t *self, const char *endpoint, const char *curve_key)
{
    for (size_t i = 0; i < self->peer_count; i++)
        if (strcmp (self->peer_endpoints[i], endpoint) == 0)
            return self->peers[i];
    if (self->peer_count == KVPC_MAX_PEERS) {
        kvpc_set_error (self, "more than %d other nodes to read from", KVPC_MAX_PEERS);
        return NULL;
    }
    //  keep_endpoint: a REDIRECT names the node's tcp endpoint; a node on this machine
    //  moves the connection to its ipc endpoint as any connection does.
    kvpc_curve_t curve = self->curve;
    if (curve_key && strlen (curve_key) == 40)
        memcpy (curve.server_key, curve_key, sizeof curve.server_key);
    kvpc_conn_t *peer = kvpc_conn_new (endpoint, self->timeout_ms, self->timeout_ms, false,
                                       self->has_curve ? &curve : NULL);
    if (!peer) {
        kvpc_set_error (self, "cannot reach node %s: %s", endpoint, strerror (errno));
        return NULL;
    }
    if (!(self->peer_endpoints[self->peer_count] = strdup (endpoint))) {
        kvpc_conn_destroy (&peer);
        return NULL;
    }
    self->peers[self->peer_count++] = peer;
    return peer;
}

void
kvpc_conn_destroy (kvpc_conn_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpc_conn_t *self = *self_p;
    uint32_t value;
    s_auth_unwatch (self, &value);
    for (size_t i = 0; i < self->peer_count; i++) {
        kvpc_conn_destroy (&self->peers[i]);
        free (self->peer_endpoints[i]);
    }
    transfer_pool_destroy (&self->pool);
    if (self->socket) {
        //  A one-way request may still be queued: RELEASEs whose pins would otherwise hold
        //  their objects until the leases end. Nothing answers them, so instead of waiting
        //  here libzmq keeps sending them after the close (for the last connection,
        //  zmq_ctx_term waits for that, if the node does not take them at once).
        if (self->oneway_pending) {
            int linger =
                self->timeout_ms < KVPC_CLOSE_WAIT_MS ? self->timeout_ms : KVPC_CLOSE_WAIT_MS;
            zmq_setsockopt (self->socket, ZMQ_LINGER, &linger, sizeof linger);
        }
        zmq_close (self->socket);
    }
    self->socket = NULL;
    s_early_drop (self);
    //  Every call already waited for its zero-copy frames; this is only a safeguard.
    s_zc_wait (self);
    //  After the frames: they may be the device layer's pinned buffers.
    kvpc_device_destroy (&self->device);
    kvpc_process_release (&self->process);
    free (self->endpoint);
    free (self);
    *self_p = NULL;
}

//  ---- what the layers above read -----------------------------------------------------------

const char *
kvpc_conn_endpoint (kvpc_conn_t *self)
{
    return self->endpoint;
}

const char *
kvpc_conn_client_id (kvpc_conn_t *self)
{
    return self->client_id;
}

const char *
kvpc_conn_host_id (kvpc_conn_t *self)
{
    return self->host_id;
}

bool
kvpc_conn_same_host (kvpc_conn_t *self)
{
    return self->same_host;
}

bool
kvpc_conn_cluster (kvpc_conn_t *self)
{
    return self->cluster;
}

int
kvpc_conn_timeout_ms (kvpc_conn_t *self)
{
    return self->timeout_ms;
}

bool
kvpc_conn_on_local_endpoint (kvpc_conn_t *self)
{
    return s_is_inproc (self->endpoint)
           || (self->local_endpoint[0] && strcmp (self->endpoint, self->local_endpoint) == 0);
}

kvpc_process_t *
kvpc_conn_process (kvpc_conn_t *self)
{
    return self->process;
}

void *
kvpc_conn_context (kvpc_conn_t *self)
{
    return self->ctx;
}

void *
kvpc_conn_socket (kvpc_conn_t *self)
{
    return self->socket;
}

uint64_t
kvpc_conn_generation (kvpc_conn_t *self)
{
    return self->generation;
}

transfer_pool_t **
kvpc_conn_pool (kvpc_conn_t *self)
{
    return &self->pool;
}

kvpc_device_t *
kvpc_conn_device (kvpc_conn_t *self)
{
    if (!self->device)
        self->device = kvpc_device_new ();
    return self->device;
}

void
kvpc_conn_set_placed (kvpc_conn_t *self, uint32_t *placed)
{
    self->placed = placed;
}

uint32_t *
kvpc_conn_placed (kvpc_conn_t *self)
{
    return self->placed;
}

kvpc_device_t *
kvpc_conn_device_armed (kvpc_conn_t *self)
{
    return kvpc_device_armed (self->device) ? self->device : NULL;
}
