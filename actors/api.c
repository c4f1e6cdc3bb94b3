/*  api.c - the api actor (see api.h): decode, validate, route, reply.

    DESIGN
    Every client message is [routing id][optional empty delimiter (REQ clients)][Request]
    [value frames...]. A message that has no Request frame at all is dropped and counted; one
    whose Request can't be decoded is answered PROTOCOL_ERROR; every other problem is an
    error reply with a reason (request-level `status`, or a per-key `statuses` entry), and the
    server goes on serving. Nothing a client sends is trusted: sizes, counts and frame numbers
    are checked before any job is made.

    A request becomes one kvp_job_t (context: api_ctx_t holding the routing id, the decoded
    Request and the value frames, so key and value pointers in the job stay valid until the
    reply). What the api does with it comes from the operation's row in messages/ops.h: the
    checks (what the request must carry, who may send it), the stages it walks (each stage
    is a job kind, each kind one actor's), and the reply fields it fills. There is no
    per-operation code here beyond the options a row cannot say (put options, TOUCH's count
    of reads, the segment a MOUNT names).

    Three kinds of jobs come through: clients' (answered with a Reply), in-process actors'
    on the job socket (the lookup server's EXIST, TOUCH, RESET, STATS: answered by sending
    the job back), and the node's own (KVP_OP_*: the segment listing for the index reads, and
    the end of a client process that died). Reads answered from the read index send no job
    at all: their leases are the read stamps they leave in the index (shm/shm_index.h).

    Connections of a CURVE key removed from --curve-allow (the data plane's: --curve-nodes)
    are shut down within KEY_WATCH_INTERVAL_MS, and what they still sent is dropped
    (key_watch.h).

    Threads: one. Memory: value frames of a PUT are released after the reply; a GET's values
    are pinned objects handed to ZeroMQ with a free callback (kvp_object_unpin_cb); reply
    arrays live in the request's arena.
*/
#include "actors/api.h"

#include "infra/log.h"

#include <pthread.h>

#include <signal.h>
#include <sys/mman.h>

#include "actors/connections.h"
#include "infra/actor_shell.h"
#include "infra/conn_guard.h"
#include "infra/curve.h"
#include "infra/key_watch.h"
#include "shm/segment.h"
#include "infra/endpoints.h"
#include "actors/evictor.h"
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
//  Requests a connection may have queued at the node before libzmq stops reading its socket.
#define RCVHWM 1000
//  How far over --max-value-size a frame may be before libzmq drops the connection.
#define MAX_FRAME_SLACK (64ULL << 20)
//  GET values smaller than this are copied into the reply (cheaper than a zero-copy handle).
#define COPY_VALUE_BYTES 8192
#define OWNER_CHECK_INTERVAL_MS 1000
//  Same-machine client processes the node tracks at once (owners.h).
#define MAX_OWNERS 4096
//  A stop without a drain waits this long for jobs out at the actors.
#define ABANDON_WAIT_MS 1000
//  While jobs are out at the actors, wait this long for their replies before sleeping.
#define SPIN_US 50
//  After answering a request it served alone (a read from the index, an exist, a ping), the
//  api keeps polling for the next one (--spin-us, adapting as the replica-manager's window
//  does), if that request was at most this big: a larger one takes libzmq's I/O thread far
//  longer to read than the window, and a spinning api would only take a core from that
//  thread and from the copies.
#define IDLE_SPIN_REQUEST_BYTES (64 << 10)

typedef struct {
    zframe_t *routing_id;
    zsock_t *socket;     //  the socket it came on, and its reply goes out on
    bool cluster;        //  a cluster node's client: the cluster's rows (messages/ops.h)
    bool envelope;       //  REQ client: replies need the empty delimiter
    peer_t peer;         //  who sent it, by the kernel's word (owners.h)
    int64_t arrived_us;  //  when it came in (zclock_usecs), for its latency
    int fd;              //  the socket it came on (ZMQ_SRCFD), -1 for inproc
    owner_t *owner;      //  the sending process's record, for requests that need one
    uint64_t node_owner; //  another node on the data plane: KVP_OWNER_NODE | its credential
    char user_id[256];   //  the credential its connection proved (User-Id), or ""
    bool from_jobs;      //  an in-process actor's job (the job socket): answered with the job
    const kvp_op_t *row; //  the operation's row (messages/ops.h)
    Kvpool__V1__Request *request; //  NULL for a job from an in-process actor
    zmsg_t *values;
    arena_t arena; //  the decoded Request, the keys, the reply's arrays (arena.h)
} api_ctx_t;

typedef struct {
    zsock_t *pipe;
    zsock_t *router;
    zsock_t *peer; //  role node: the data plane (other nodes' requests, on local rows)
    zsock_t *jobs; //  jobs of in-process actors (inproc://<instance>-jobs)
    zsock_t *rm, *tx, *ev, *cl;
    bool cluster;               //  role node
    wait_set_t *waits;          //  every socket the api reads (wait_set.h)
    const kvp_config_t *config; //  = &settings
    kvp_config_t settings;      //  its own copy: settings changed at run time land here
    zlistx_t *endpoints;        //  resolved endpoint strings
    char bind_error[256];
    char host_id[64];
    char server_id[96];
    char index_name[96];        //  the replica-manager's same-machine index
    char index_published[96];   //  its name to clients ("/proc/<pid>/fd/<fd>"), once made
    char local_endpoint[300];   //  the ipc endpoint same-machine clients use (PING)
    char peer_endpoint[300];    //  role node: the data plane's, resolved
    owners_t *owners;           //  same-machine client processes
    connections_t *connections; //  unread reply bytes per connection
    int64_t started;
    index_reads_t *reads;       //  small reads answered from the read index, or NULL
    kvp_metrics_t *metrics;     //  per-operation counters (config's, or own_metrics)
    kvp_metrics_t *own_metrics; //  made here when the daemon gave none
    conn_guard_t *guard;        //  refuses connections past --max-connections
    key_watch_t *client_keys;   //  closes connections of revoked client keys (router)
    key_watch_t *node_keys;     //  ... and of revoked node keys (peer, the data plane)
    spin_window_t idle;         //  polling for the next request (spin_poll.h)
    bool idle_spin;             //  the last request was small and answered here alone
    size_t in_flight;           //  jobs out at an actor (client and internal)
    uint64_t client_index_gets; //  values clients read from the index themselves (TOUCH)
    size_t writes_in_flight;    //  PUT / PUT_START jobs between reserve and reply
    zlistx_t *resets;           //  RESET jobs waiting for the writes to drain
    zlistx_t *held;             //  puts that arrived during a reset
    bool reset_running;
    bool draining;
    bool map_due;             //  the segments changed: list them for the index reads
    int64_t next_owner_check; //  dead clients reaped, unread bytes swept
    uint64_t requests, errors, dropped, resets_done;
    bool drained; //  DRAINED was said
} self_t;

static void
s_ctx_destroy (api_ctx_t **ctx_p)
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

//  ---- binding -----------------------------------------------------------------------

static int
s_bind (self_t *self, const char *endpoint)
{
    int port = zsock_bind (self->router, "%s", endpoint);
    if (port == -1) {
        snprintf (self->bind_error, sizeof self->bind_error, "cannot bind %s: %s", endpoint,
                  zmq_strerror (zmq_errno ()));
        return -1;
    }
    //  Report ephemeral ports as the real port.
    char resolved[300];
    kvp_endpoint_resolved (endpoint, port, resolved, sizeof resolved);
    zlistx_add_end (self->endpoints, resolved);
    return 0;
}

//  Same-machine clients use an ipc endpoint: only there does the kernel say who they are
//  (owners.h). The first ipc endpoint configured is it; with none, the node binds one named
//  after its first tcp port (or its instance), which a restarted node binds again.
static void
s_bind_local (self_t *self)
{
    const char *port = NULL;
    for (const char *endpoint = (const char *) zlistx_first (self->endpoints); endpoint;
         endpoint = (const char *) zlistx_next (self->endpoints)) {
        if (strncmp (endpoint, "ipc://", 6) == 0) {
            snprintf (self->local_endpoint, sizeof self->local_endpoint, "%s", endpoint);
            return;
        }
        if (!port && strncmp (endpoint, "tcp://", 6) == 0)
            port = strrchr (endpoint, ':') + 1;
    }
    char endpoint[300];
    if (port)
        snprintf (endpoint, sizeof endpoint, "ipc://@kvpool-%s", port);
    else
        snprintf (endpoint, sizeof endpoint, "ipc://@kvpool-%s", self->config->instance);
    if (zsock_bind (self->router, "%s", endpoint) == -1) {
        kvp_warning ("cannot bind %s (%s): same-machine clients will use tcp", endpoint,
                     zmq_strerror (zmq_errno ()));
        return;
    }
    zlistx_add_end (self->endpoints, endpoint);
    snprintf (self->local_endpoint, sizeof self->local_endpoint, "%s", endpoint);
}

//  Role node: the data plane. Other nodes read and write this node's values there, with the
//  client protocol; its requests are about this node's own objects (the rows of one
//  process). By default it listens on the first client tcp endpoint's host, any port.
static void
s_bind_peer (self_t *self)
{
    char endpoint[300] = "";
    if (self->config->peer_endpoint)
        snprintf (endpoint, sizeof endpoint, "%s", self->config->peer_endpoint);
    else
        for (const char *e = (const char *) zlistx_first (self->endpoints); e;
             e = (const char *) zlistx_next (self->endpoints))
            if (strncmp (e, "tcp://", 6) == 0) {
                const char *colon = strrchr (e, ':');
                snprintf (endpoint, sizeof endpoint, "%.*s:*", (int) (colon - e), e);
                break;
            }
    if (!*endpoint)
        snprintf (endpoint, sizeof endpoint, "tcp://127.0.0.1:*");
    self->peer = zsock_new (ZMQ_ROUTER);
    assert (self->peer);
    zsock_set_sndhwm (self->peer, 100000);
    zsock_set_rcvhwm (self->peer, RCVHWM);
    zsock_set_linger (self->peer, 0);
    zsock_set_maxmsgsize (self->peer, -1);
    kvp_curve_cluster_server (self->config->curve, self->peer);
    int port = zsock_bind (self->peer, "%s", endpoint);
    if (port == -1) {
        snprintf (self->bind_error, sizeof self->bind_error,
                  "cannot bind the data plane %.120s: %s", endpoint, zmq_strerror (zmq_errno ()));
        return;
    }
    kvp_endpoint_resolved (endpoint, port, self->peer_endpoint, sizeof self->peer_endpoint);
}

//  Whether values are hashed as they arrive (transfer/value_checksum.h). Only a node of a
//  cluster sends values to other nodes, where the checksum is checked; the one-process store
//  never does, so it hashes nothing on its puts (the object log of --segment-dir hashes what
//  it logs itself), and its puts cost what they did.
static bool
s_checksums_wanted (const kvp_config_t *config)
{
    return config->verify_checksums && config->role == KVP_ROLE_NODE;
}

static void s_client_message (self_t *self, zsock_t *socket);
static void s_job_message (self_t *self);
static void s_actor_reply (self_t *self, zsock_t *actor);

static int
s_client_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell;
    s_client_message ((self_t *) arg, sock);
    return 0;
}

static int
s_jobs_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell, (void) sock;
    s_job_message ((self_t *) arg);
    return 0;
}

static int
s_actor_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell;
    s_actor_reply ((self_t *) arg, sock);
    return 0;
}

static int
s_guard_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell, (void) sock;
    conn_guard_handle (((self_t *) arg)->guard);
    return 0;
}

//  The actors a job's stages go to (kvp_job_kind_actor), by their inproc ROUTERs: jobs are
//  never held back (no high-water mark on the way out).
#define ACTOR_DEALER(name)                                                                         \
    {                                                                                              \
        ZMQ_DEALER, ">inproc://%s-" name, 0, ACTOR_HWM_LIBZMQ, s_actor_reader, false               \
    }
static const actor_socket_t s_actor_sockets[] = {ACTOR_DEALER ("rm"), ACTOR_DEALER ("tx"),
                                                 ACTOR_DEALER ("ev"), ACTOR_DEALER ("cl")};

static self_t *
s_self_new (actor_shell_t *shell, zsock_t *pipe, const kvp_config_t *config)
{
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->pipe = pipe;
    self->settings = *config;
    self->config = &self->settings;
    spin_window_init (&self->idle, (int) config->spin_us);
    self->router = zsock_new (ZMQ_ROUTER);
    assert (self->router);
    //  Every socket the api reads is in its wait set (wait_set.h), the pipe first.
    self->waits = actor_shell_use_wait_set (shell);
    self->cluster = config->role == KVP_ROLE_NODE;
    value_checksum_set_verify (s_checksums_wanted (config));
    zsock_set_sndhwm (self->router, 100000);
    zsock_set_rcvhwm (self->router, RCVHWM);
    zsock_set_linger (self->router, 0);
    //  A frame far over the value limit is refused by libzmq before it is buffered (the peer
    //  is disconnected): nobody can make the node allocate gigabytes. Frames a little over
    //  the limit still arrive and get a VALUE_TOO_LARGE reply.
    zsock_set_maxmsgsize (self->router, (int64_t) (config->max_value_size + MAX_FRAME_SLACK));
    //  tcp and ipc clients alike (inproc never runs a handshake).
    kvp_curve_server (config->curve, self->router);
    zsock_t **actors[] = {&self->rm, &self->tx, &self->ev, &self->cl};
    for (size_t i = 0; i < sizeof actors / sizeof actors[0]; i++) {
        *actors[i] = actor_shell_open (shell, &s_actor_sockets[i], config->instance);
        assert (*actors[i]);
    }
    self->endpoints = zlistx_new ();
    zlistx_set_duplicator (self->endpoints, (zlistx_duplicator_fn *) strdup);
    zlistx_set_destructor (self->endpoints, (zlistx_destructor_fn *) zstr_free);
    if (config->endpoint_count == 0) {
        if (s_bind (self, KVP_DEFAULT_ENDPOINT) == 0)
            s_bind (self, KVP_DEFAULT_IPC_ENDPOINT);
    }
    else
        for (size_t i = 0; i < config->endpoint_count && !self->bind_error[0]; i++)
            s_bind (self, config->endpoints[i]);
    if (!self->bind_error[0])
        s_bind_local (self);
    if (self->cluster && !self->bind_error[0])
        s_bind_peer (self);
    self->owners = owners_new (MAX_OWNERS);
    self->connections = connections_new (config->max_unread_bytes);
    char inproc[64];
    snprintf (inproc, sizeof inproc, "inproc://%s-api", config->instance);
    if (zsock_bind (self->router, "%s", inproc) == -1 && !self->bind_error[0])
        snprintf (self->bind_error, sizeof self->bind_error, "cannot bind %s", inproc);
    self->jobs = zsock_new (ZMQ_ROUTER);
    assert (self->jobs);
    zsock_set_sndhwm (self->jobs, 0);
    //  A job whose actor has gone fails to send, and is destroyed, instead of vanishing.
    zsock_set_router_mandatory (self->jobs, 1);
    zsock_set_rcvhwm (self->jobs, 0);
    if (zsock_bind (self->jobs, "inproc://%s-jobs", config->instance) == -1 && !self->bind_error[0])
        snprintf (self->bind_error, sizeof self->bind_error, "cannot bind inproc://%s-jobs",
                  config->instance);
    self->resets = zlistx_new ();
    self->held = zlistx_new ();
    if (config->host_id)
        snprintf (self->host_id, sizeof self->host_id, "%s", config->host_id);
    else
        kvp_boot_id (self->host_id, sizeof self->host_id);
    snprintf (self->server_id, sizeof self->server_id, "%s/%d", self->host_id, (int) getpid ());
    if (config->index_slots != 0) {
        shm_index_make_name (self->index_name, sizeof self->index_name, config->instance);
        self->reads = index_reads_new (self->index_name);
    }
    self->started = zclock_mono ();
    self->metrics = config->metrics;
    if (!self->metrics) {
        self->own_metrics = metrics_new ("all");
        assert (self->own_metrics);
        self->metrics = self->own_metrics;
    }
    //  The first listing of the segments at once: index reads need the mappings.
    self->map_due = true;
    self->next_owner_check = self->started + OWNER_CHECK_INTERVAL_MS;
    actor_shell_add (shell, self->router, s_client_reader);
    actor_shell_add (shell, self->jobs, s_jobs_reader);
    if (self->peer)
        actor_shell_add (shell, self->peer, s_client_reader);
    self->guard =
        conn_guard_new (self->router, self->endpoints, config->max_connections, config->instance);
    if (self->guard) {
        actor_shell_add (shell, conn_guard_socket (self->guard), s_guard_reader);
        //  libzmq buffers a message of many frames whole before the api sees it, bounding
        //  frames one by one only: the guard shuts down a tcp connection that holds more
        //  than the largest request (--max-request-bytes of values, and a Request frame of
        //  at most the frame limit) unread, so that is what each may cost (conn_guard.h).
        uint64_t largest = config->max_request_bytes + config->max_value_size + MAX_FRAME_SLACK;
        conn_guard_set_max_buffered (self->guard, largest);
        uint64_t connections = conn_guard_limit (self->guard);
        double worst = (double) connections * (double) largest;
        double memory = (double) sysconf (_SC_PHYS_PAGES) * (double) sysconf (_SC_PAGESIZE);
        kvp_log (worst > memory ? KVP_LOG_WARNING : KVP_LOG_INFO,
                 "incoming requests buffered at most %.1f GiB: %llu client connections "
                 "(--max-connections) x %.2f GiB (--max-request-bytes, and one frame of at "
                 "most --max-value-size + %llu MiB); ipc connections are not bounded this "
                 "way%s",
                 worst / (double) (1ULL << 30), (unsigned long long) connections,
                 (double) largest / (double) (1ULL << 30),
                 (unsigned long long) (MAX_FRAME_SLACK >> 20),
                 worst > memory ? ": more than this machine's memory, lower those settings "
                                  "to bound what clients can make the node allocate"
                                : "");
    }
    //  A key removed from --curve-allow (--curve-nodes) loses its open connections too.
    self->client_keys = key_watch_new (config->curve, KVP_ZAP_CLIENTS, "api");
    if (self->peer)
        self->node_keys = key_watch_new (config->curve, KVP_ZAP_CLUSTER, "data plane");
    return self;
}

static void
s_self_destroy (self_t **self_p)
{
    self_t *self = *self_p;
    if (!self)
        return;
    conn_guard_destroy (&self->guard);
    key_watch_destroy (&self->client_keys);
    key_watch_destroy (&self->node_keys);
    index_reads_destroy (&self->reads);
    owners_destroy (&self->owners);
    zlistx_destroy (&self->endpoints);
    zlistx_destroy (&self->resets);
    zlistx_destroy (&self->held);
    //  Value frames libzmq still queues hold pins on objects the replica-manager frees when
    //  it stops: they must be released first. The connections they wait on are ended while
    //  the socket is still open (libzmq 4.3 aborts when a socket closes under a reply that is
    //  half sent, zeromq/libzmq#3442); the socket then takes in their pipes' ends.
    connections_shutdown_all (self->connections);
    int64_t deadline = zclock_mono () + 2000;
    while (!connections_wait_released (0) && zclock_mono () < deadline) {
        zsock_events (self->router);
        if (self->peer)
            zsock_events (self->peer);
        zclock_sleep (1);
    }
    if (!connections_wait_released (0))
        kvp_warning ("reply frames still held by libzmq at exit");
    connections_destroy (&self->connections);
    zsock_destroy (&self->router);
    zsock_destroy (&self->peer);
    zsock_destroy (&self->jobs);
    metrics_destroy (&self->own_metrics);
    free (self);
    *self_p = NULL;
}

//  ---- replies -----------------------------------------------------------------------

static int
s_send_frame (void *socket, const void *data, size_t size, bool more)
{
    return zmq_send (socket, data, size, more ? ZMQ_SNDMORE : 0) == -1 ? -1 : 0;
}

//  The transport a request came over, for the byte counters.
static kvp_transport_t
s_transport (const api_ctx_t *ctx)
{
    return ctx->peer.kind == PEER_REMOTE  ? KVP_TRANSPORT_TCP
           : ctx->peer.kind == PEER_LOCAL ? KVP_TRANSPORT_IPC
                                          : KVP_TRANSPORT_INPROC;
}

//  Sends [routing id][delimiter?][reply][values?]. Returns 0 or -1.
static int
s_send_header (self_t *self, api_ctx_t *ctx, Kvpool__V1__Reply *reply, bool more)
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

static void
s_reply_error (self_t *self, api_ctx_t *ctx, uint64_t request_id, int op, int status,
               const char *reason)
{
    Kvpool__V1__Reply reply = KVPOOL__V1__REPLY__INIT;
    reply.version = KVP_PROTOCOL_VERSION;
    reply.request_id = request_id;
    reply.op = (Kvpool__V1__Op) op;
    reply.status = status;
    reply.error = (char *) reason;
    s_send_header (self, ctx, &reply, false);
    kvp_debug ("request %llu op %d: %s (%s)", (unsigned long long) request_id, op,
               kvp_status_name (status), reason);
}

//  Answers an in-process actor's job on the job socket. Returns 0 or -1.
static int
s_reply_job (self_t *self, zframe_t **routing_id_p, kvp_job_t *job)
{
    wait_set_touch (self->waits, self->jobs);
    return kvp_job_reply (self->jobs, routing_id_p, job);
}

//  Drops the pins a GET took on objects that will not be sent.
static void
s_unpin_items (kvp_job_t *job)
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
s_send_values (self_t *self, kvp_job_t *job)
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
static void
s_complete_stats (self_t *self, kvp_stats_t *stats)
{
    stats->utilisation =
        stats->bytes_mounted ? (double) stats->bytes_stored / stats->bytes_mounted : 0;
    stats->requests = self->requests;
    stats->errors = self->errors;
    stats->dropped_requests = self->dropped;
    //  Reads answered from the index, by the api or by same-machine clients themselves, are
    //  gets and hits too.
    stats->index_gets =
        (self->reads ? index_reads_gets (self->reads) : 0) + self->client_index_gets;
    stats->gets += stats->index_gets;
    stats->get_hits += stats->index_gets;
    stats->max_key_len = self->config->max_key_len;
    stats->max_value_size = self->config->max_value_size;
    stats->lease_ttl_ms = self->config->lease_ttl_ms;
    stats->uptime_ms = (uint64_t) (zclock_mono () - self->started);
    stats->transfer_workers = self->config->workers;
    stats->resets = self->resets_done;
    stats->connections = self->guard ? conn_guard_connections (self->guard) : 0;
    metrics_bytes_totals (self->metrics, &stats->value_bytes_in, &stats->value_bytes_out);
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
s_name_self (self_t *self, kvp_job_t *job)
{
    if (!(job->nodes = (kvp_node_info_t *) calloc (1, sizeof (kvp_node_info_t))))
        return;
    kvp_node_info_t *node = job->nodes;
    job->node_count = 1;
    snprintf (node->node_id, sizeof node->node_id, "%s", self->server_id);
    snprintf (node->host_id, sizeof node->host_id, "%s", self->host_id);
    const char *first = (const char *) zlistx_first (self->endpoints);
    snprintf (node->client_endpoint, sizeof node->client_endpoint, "%s", first ? first : "");
    snprintf (node->curve_key, sizeof node->curve_key, "%s",
              kvp_curve_public_key (self->config->curve));
    node->alive = true;
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVPOOL_OK)
            job->items[i].location_count = 1; //  locations[0] is 0: this node
}

//  STATS: the per-operation counters, for the operations asked for since the start, in the
//  request's arena. (Out of memory: the reply goes without them.)
static void
s_op_stats (self_t *self, api_ctx_t *ctx, Kvpool__V1__Reply *reply)
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
static void
s_reply (self_t *self, kvp_job_t **job_p, zmq_msg_t *copies)
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
    if ((row->fills & REPLY_NODES) && !job->cluster)
        s_name_self (self, job);
    if (reply_encode (&ctx->arena, row, job, &reply) != 0) {
        reply.status = kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "out of memory for the reply");
        reply.n_statuses = reply.n_sizes = reply.n_replicas = reply.n_segments = 0;
    }
    if (row->fills & REPLY_RDMA) {
        reply.rdma_data.data = job->rdma_data;
        reply.rdma_data.len = job->rdma_size;
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
    if ((row->fills & REPLY_SETTING) && job->setting
        && (reply.setting_value = (char *) arena_alloc (&ctx->arena, 1024)))
        kvp_config_value (self->config, job->setting, reply.setting_value, 1024);
    if (row->fills & REPLY_STATS) {
        s_complete_stats (self, &job->stats);
        reply_stats (&job->stats, &stats);
        reply.stats = &stats;
        s_op_stats (self, ctx, &reply);
    }
    bool values = (row->fills & REPLY_VALUES) && reply.status == KVPOOL_OK && job->count > 0;
    bool sent = s_send_header (self, ctx, &reply, values) == 0;
    if (sent && values) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < job->count; i++)
            if (job->items[i].status == KVPOOL_OK)
                bytes += job->items[i].size;
        metrics_bytes_out (self->metrics, s_transport (ctx), bytes);
    }
    if (copies)
        s_send_copies (ctx->socket, copies, job->count, sent && values);
    else if (sent && values)
        s_send_values (self, job);
    else
        s_unpin_items (job);
    kvp_debug ("request %llu %s: %zu keys, status %s", (unsigned long long) request->request_id,
               row->name, job->count, kvp_status_name (job->status));
    s_ctx_destroy (&ctx);
    kvp_job_destroy (job_p);
}

//  ---- routing -----------------------------------------------------------------------

static void s_start_reset (self_t *self);
static void s_node_job_done (self_t *self, kvp_job_t *job);
static void s_advance (self_t *self, kvp_job_t *job, kvp_job_kind_t done);

static zsock_t *
s_actor_socket (self_t *self, kvp_job_kind_t kind)
{
    switch (kvp_job_kind_actor (kind)) {
        case KVP_ACTOR_RM: return self->rm;
        case KVP_ACTOR_TX: return self->tx;
        case KVP_ACTOR_EV: return self->ev;
        case KVP_ACTOR_CL: return self->cl;
        default: assert (false); return NULL;
    }
}

//  A ranged GET sends each value's range: the item then describes the range (its size and
//  address), so the reply and the frames need nothing else. An offset past the value is
//  that key's INVALID_PARAMS.
static void
s_apply_ranges (kvp_job_t *job)
{
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK || (!item->object && !item->buffer))
            continue;
        if (item->offset > item->size) {
            item->status = KVPOOL_INVALID_PARAMS;
            kvp_job_fail (job, KVPOOL_OK, "offset %llu is past the end of a %llu-byte value",
                          (unsigned long long) item->offset, (unsigned long long) item->size);
            if (item->object)
                kvp_object_unpin (item->object);
            item->object = NULL;
            continue;
        }
        uint64_t left = item->size - item->offset;
        item->size = item->length < left ? item->length : left;
        item->replicas[0].addr = (char *) item->replicas[0].addr + item->offset;
    }
}

//  A job is done: answers its client (over the client socket, or the job socket for an
//  in-process actor), or finishes the node's own work.
//  After a GET that read from disk: copies that failed verification are forgotten and
//  unlinked (KVP_OP_DISK_LOST), and values read often enough go back to memory
//  (KVP_OP_PROMOTE, with its own copy of the bytes: the reply sends the read buffer).
static void
s_disk_follow_up (self_t *self, kvp_job_t *job)
{
    kvp_job_t *lost = NULL, *promote = NULL;
    size_t promote_bytes = 0;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->lost) {
            if (!lost) {
                lost = kvp_job_new (KVP_JOB_NONE, 0);
                lost->op = KVP_OP_DISK_LOST;
            }
            kvp_job_append_key (lost, item->key, item->key_len)->disk_id = item->disk_id;
        }
        else if (item->promote && item->buffer && item->status == KVPOOL_OK)
            promote_bytes += item->size;
    }
    if (promote_bytes && (promote = kvp_job_new (KVP_JOB_NONE, 0))) {
        promote->op = KVP_OP_PROMOTE;
        promote->value_storage = malloc (promote_bytes);
        char *next = (char *) promote->value_storage;
        for (size_t i = 0; next && i < job->count; i++) {
            kvp_item_t *item = &job->items[i];
            if (!item->promote || !item->buffer || item->status != KVPOOL_OK)
                continue;
            kvp_item_t *copy = kvp_job_append_key (promote, item->key, item->key_len);
            memcpy (next, item->replicas[0].addr, item->size);
            copy->src = next;
            copy->size = item->size;
            copy->object_id = item->object_id;
            next += item->size;
        }
        if (!next)
            kvp_job_destroy (&promote);
    }
    if (lost)
        s_advance (self, lost, KVP_JOB_NONE);
    if (promote)
        s_advance (self, promote, KVP_JOB_NONE);
}

static void
s_finish (self_t *self, kvp_job_t *job)
{
    api_ctx_t *ctx = (api_ctx_t *) job->context;
    if (ctx && job->kind == KVP_TX_DISK_READ)
        s_disk_follow_up (self, job);
    if (ctx && job->op == KVPOOL__V1__OP__PREFIX_MATCH && job->status == KVPOOL_OK)
        job->result_count = kvp_job_prefix_count (job);
    if (!ctx)
        s_node_job_done (self, job);
    else if (ctx->from_jobs) {
        if (ctx->row->fills & REPLY_STATS)
            s_complete_stats (self, &job->stats);
        job->context = NULL;
        zframe_t *routing_id = ctx->routing_id;
        ctx->routing_id = NULL;
        if (s_reply_job (self, &routing_id, job) != 0) {
            zframe_destroy (&routing_id);
            kvp_job_destroy (&job);
        }
        s_ctx_destroy (&ctx);
    }
    else {
        //  (A PUT_PART's offsets say where its frames went: nothing to cut.)
        if (job->ranged && job->status == KVPOOL_OK && (ctx->row->fills & REPLY_VALUES))
            s_apply_ranges (job);
        s_reply (self, &job, NULL);
    }
}

//  Sends the job to the next stage of its operation, or answers it.
static void
s_advance (self_t *self, kvp_job_t *job, kvp_job_kind_t done)
{
    const kvp_op_t *row = kvp_op_of_job (job);
    assert (row); //  jobs are made only for operations the table has
    kvp_job_kind_t next = kvp_op_next_stage (row, job, done);
    if (next == KVP_JOB_NONE) {
        bool write = (row->flags & OP_WRITE) && done != KVP_JOB_NONE;
        bool drain = (row->flags & OP_DRAIN) != 0;
        if (drain) {
            self->resets_done++;
            self->reset_running = false;
        }
        s_finish (self, job);
        if (write)
            self->writes_in_flight--;
        if (drain || write)
            s_start_reset (self);
        return;
    }
    job->kind = next;
    if (next == KVP_TX_WRITE && transfer_job_inline (job)) {
        //  Small puts are copied here: the hop would cost more than the copy.
        transfer_job_copy (job, NULL);
        s_advance (self, job, KVP_TX_WRITE);
        return;
    }
    //  The actor may run the stages after this one that are its own as well (kvp_job_t.walk).
    job->walk = true;
    zsock_t *target = s_actor_socket (self, next);
    if (done == KVP_JOB_NONE && (row->flags & OP_WRITE))
        self->writes_in_flight++;
    wait_set_touch (self->waits, target);
    //  The actor that takes it polls for its next job afterwards (the replica-manager's
    //  window): the api then sleeps after answering, so that two threads polling at once do
    //  not leave a small machine no core for the client and libzmq's I/O threads.
    self->idle_spin = false;
    if (kvp_job_send (target, job) == 0)
        self->in_flight++;
    else {
        kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "internal queue failure");
        s_advance (self, job, KVP_JOB_NONE);
    }
}

//  Runs the next reset when no write is in flight, and the held puts after the last reset.
static void
s_start_reset (self_t *self)
{
    if (self->reset_running || self->writes_in_flight)
        return;
    kvp_job_t *reset = (kvp_job_t *) zlistx_first (self->resets);
    if (reset) {
        zlistx_delete (self->resets, zlistx_cursor (self->resets));
        self->reset_running = true;
        reset->force = true;
        s_advance (self, reset, KVP_JOB_NONE);
        return;
    }
    kvp_job_t *held;
    while ((held = (kvp_job_t *) zlistx_first (self->held))) {
        zlistx_delete (self->held, zlistx_cursor (self->held));
        s_advance (self, held, KVP_JOB_NONE);
    }
}

static bool
s_resetting (self_t *self)
{
    return self->reset_running || zlistx_size (self->resets) > 0;
}

//  Starts a job: a reset waits for the writes in flight, a write waits for the resets.
static void
s_start (self_t *self, kvp_job_t *job)
{
    const kvp_op_t *row = kvp_op_of_job (job);
    if (row->flags & OP_DRAIN) {
        zlistx_add_end (self->resets, job);
        s_start_reset (self);
    }
    else if ((row->flags & OP_WRITE) && s_resetting (self))
        zlistx_add_end (self->held, job);
    else
        s_advance (self, job, KVP_JOB_NONE);
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
s_user_allowed (self_t *self, const peer_t *peer)
{
    return peer->uid == 0 || peer->uid == geteuid ()
           || (self->config->group_set && peer->gid == self->config->group);
}

//  Who may do what: sets ctx->owner for a same-machine operation. Returns 0, or -1 with a
//  reason (status PERMISSION_DENIED).
static int
s_authorize (self_t *self, api_ctx_t *ctx, char *reason, size_t size)
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
s_config (self_t *self, const Kvpool__V1__Request *request, kvp_job_t *job, char *why,
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
            value_checksum_set_verify (s_checksums_wanted (&self->settings));
        kvp_info ("setting %s changed to %s", name, change);
    }
    job->setting = name;
    job->setting_value = change;
    return 0;
}

static kvp_job_t *
s_job_from_request (self_t *self, api_ctx_t *ctx)
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
    if (status == KVPOOL_OK && request->n_vm_addrs && ctx->cluster) {
        snprintf (reason, sizeof reason, "a node of a cluster takes no values by address");
        status = KVPOOL_INVALID_PARAMS;
    }
    if (status != KVPOOL_OK) {
        //  libzmq had the frames in memory already (it delivers a message whole); what it
        //  can refuse before reading, it did (--max-value-size per frame, RCVHWM). Nothing
        //  is placed or copied for a refused request, and its frames go at once.
        zmsg_destroy (&ctx->values);
        s_reply_error (self, ctx, id, op, status, reason);
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
                s_reply_error (self, ctx, id, op, KVPOOL_INTERNAL_ERROR, "out of memory");
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
            item->expect_checksum = request->checksums[i];
        if (request->n_offsets) {
            job->ranged = true;
            item->offset = request->offsets[i];
            item->length = request->lengths[i];
        }
        if (flags & OP_RDMA) {
            item->rdma_addr = request->rdma_addrs[i];
            item->rdma_key = request->rdma_keys[i];
            item->rdma_len = request->n_rdma_lengths ? request->rdma_lengths[i] : 0;
            if (!(flags & OP_SIZES))
                item->size = item->length; //  a PUT_PART: its bytes are its range
        }
        if (item->size > self->config->max_value_size && item->status == KVPOOL_OK)
            item->status = KVPOOL_VALUE_TOO_LARGE;
    }
    if (put) {
        job->replica_num = put->replica_num;
        for (size_t p = 0; p < put->n_preferred_segments; p++)
            job->preferred[job->preferred_count++] = put->preferred_segments[p];
        job->soft_pin = put->soft_pin;
        job->soft_pin_ttl_ms = put->soft_pin_ttl_ms;
        job->hard_pin = put->hard_pin;
    }
    job->force = request->force;
    job->pin = request->pin;
    job->redirect = request->redirect;
    job->ranks = request->ranks ? request->ranks : 1;
    job->rdma_conn = request->rdma_conn;
    if (request->rdma_data.len) {
        job->rdma_data = (uint8_t *) malloc (request->rdma_data.len);
        if (!job->rdma_data) {
            kvp_job_destroy (&job);
            s_reply_error (self, ctx, id, op, KVPOOL_INTERNAL_ERROR, "out of memory");
            return NULL;
        }
        memcpy (job->rdma_data, request->rdma_data.data, request->rdma_data.len);
        job->rdma_size = request->rdma_data.len;
    }
    if (op == KVPOOL__V1__OP__TOUCH)
        self->client_index_gets += request->reads;
    if (op == KVPOOL__V1__OP__CONFIG) {
        char why[300];
        if (s_config (self, request, job, why, sizeof why) != 0) {
            kvp_job_destroy (&job);
            s_reply_error (self, ctx, id, op, KVPOOL_INVALID_PARAMS, why);
            return NULL;
        }
    }
    job->pattern = request->pattern;
    if (request->segment) {
        job->segment_id = request->segment->id;
        job->segment_name = request->segment->name;
        job->segment_size = request->segment->size;
        //  A segment belongs to the process that mounted it, by the kernel's word; only an
        //  in-process client names an owner itself. An unmount names who asks (NULL: the node).
        if (op == KVPOOL__V1__OP__MOUNT_SEGMENT)
            job->owner = ctx->owner ? ctx->owner->name : request->segment->owner;
        else
            job->owner = ctx->owner ? ctx->owner->name : NULL;
    }
    job->owner_id = ctx->owner ? ctx->owner->id : ctx->node_owner;
    if (request->n_vm_addrs) {
        job->vm_pid = (int32_t) ctx->owner->pid;
        job->vm_pidfd = ctx->owner->pidfd;
        job->vm_deadline_ns = request->vm_deadline_ns;
    }
    return job;
}

//  Answers a small read from the read index, without the replica-manager (index_reads.h).
//  Returns true when the job was answered (and destroyed).
static bool
s_serve_from_index (self_t *self, kvp_job_t *job)
{
    api_ctx_t *ctx = (api_ctx_t *) job->context;
    bool values = (ctx->row->fills & REPLY_VALUES) != 0;
    if (!self->reads || job->count > (values ? INDEX_READ_KEYS_MAX : INDEX_CHECK_KEYS_MAX)
        || !(ctx->row->flags & OP_INDEX) || job->ranged)
        return false;
    zmq_msg_t small[8];
    zmq_msg_t *copies = NULL;
    if (values)
        copies = job->count <= 8 ? small : (zmq_msg_t *) malloc (job->count * sizeof *copies);
    bool served = (!values || copies) && index_reads_serve (self->reads, job, copies);
    if (served)
        s_reply (self, &job, copies);
    if (copies != small)
        free (copies);
    return served;
}

static void
s_handle_request (self_t *self, api_ctx_t *ctx)
{
    kvp_job_t *job = s_job_from_request (self, ctx);
    if (!job) {
        s_ctx_destroy (&ctx);
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
            s_reply_error (self, ctx, ctx->request->request_id, ctx->request->op,
                           KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, reason);
            s_ctx_destroy (&ctx);
            return;
        }
    }
    if (s_serve_from_index (self, job))
        return;
    //  Objects are immutable: a put of a key the index shows is refused before any space is
    //  placed or byte copied.
    if (self->reads && (ctx->row->flags & OP_NEW))
        index_reads_refuse_existing (self->reads, job);
    s_start (self, job);
}

static void
s_client_message (self_t *self, zsock_t *socket)
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
        s_ctx_destroy (&ctx);
        return;
    }
    arena_init (&ctx->arena, zframe_size (header));
    ctx->request = kvpool__v1__request__unpack (arena_allocator (&ctx->arena), zframe_size (header),
                                                zframe_data (header));
    zframe_destroy (&header);
    if (!ctx->request) {
        zmsg_destroy (&msg);
        s_reply_error (self, ctx, 0, 0, KVPOOL_PROTOCOL_ERROR,
                       "frame 0 is not a kvpool.v1.Request");
        s_ctx_destroy (&ctx);
        return;
    }
    if (zmsg_size (msg)) {
        metrics_bytes_in (self->metrics, s_transport (ctx), zmsg_content_size (msg));
        ctx->values = msg;
    }
    else
        zmsg_destroy (&msg);
    s_handle_request (self, ctx);
}

//  ---- jobs of in-process actors -----------------------------------------------------

//  A job from an actor of this process (the lookup server): the same operations as a
//  client's, with the same checks on its keys, answered by sending the job back.
static void
s_job_message (self_t *self)
{
    zframe_t *routing_id = NULL;
    kvp_job_t *job = kvp_job_recv_routed (self->jobs, &routing_id);
    if (!job) {
        zframe_destroy (&routing_id);
        return;
    }
    const kvp_op_t *row =
        kvp_op_route (job->op, self->cluster ? KVP_VIA_CLUSTER : KVP_VIA_PROCESS, self->cluster);
    //  Only the proto's operations that carry keys or nothing; not a write (values live in
    //  the caller), not the node's own operations, not one on shared memory.
    if (!row || job->op <= 0 || (row->flags & (OP_VALUES | OP_SIZES | OP_SEGMENT | OP_LOCAL))
        || job->context || job->kind != KVP_JOB_NONE)
        kvp_job_fail (job, KVPOOL_INVALID_PARAMS, "operation %d is not served to actors", job->op);
    else if (self->draining)
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "the node is stopping");
    else if (job->count > self->config->max_keys)
        kvp_job_fail (job, KVPOOL_INVALID_PARAMS, "%zu keys: at most %llu", job->count,
                      (unsigned long long) self->config->max_keys);
    if (job->status != KVPOOL_OK) {
        if (s_reply_job (self, &routing_id, job) != 0) {
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
    s_start (self, job);
}

//  ---- the node's own jobs -----------------------------------------------------------

//  Lists the segments for the index reads' mappings: at start and after any change.
static void
s_map_segments (self_t *self)
{
    self->map_due = false;
    kvp_job_t *job = kvp_job_new (KVP_JOB_NONE, 0);
    job->op = KVP_OP_MAP_SEGMENTS;
    s_advance (self, job, KVP_JOB_NONE);
}

//  A same-machine client process died and none of its requests is out: its pins and
//  reservations end (replica-manager), and the allocator names the segments it mounted.
static void
s_owner_gone (void *arg, const owner_t *owner)
{
    self_t *self = (self_t *) arg;
    kvp_debug ("client process %d (%s) is gone", (int) owner->pid, owner->name);
    kvp_job_t *job = kvp_job_new (KVP_JOB_NONE, 0);
    job->op = KVP_OP_OWNER_GONE;
    job->owner_id = owner->id;
    job->key_storage = strdup (owner->name); //  the record goes before the job is done
    job->owner = job->key_storage;
    s_advance (self, job, KVP_JOB_NONE);
}

static void
s_node_job_done (self_t *self, kvp_job_t *job)
{
    if (job->op == KVP_OP_MAP_SEGMENTS && self->reads && job->status == KVPOOL_OK)
        index_reads_segments (self->reads, job->segments, job->segment_count);
    else if (job->op == KVP_OP_OWNER_GONE)
        //  Each of its segments goes: objects removed, unmounted, its name unlinked.
        for (size_t i = 0; i < job->segment_count; i++) {
            kvp_info ("kvpoold: owner of segment %u (%s) is gone: unmounting it",
                      job->segments[i].id, job->segments[i].name);
            kvp_job_t *unmount = kvp_job_new (KVP_JOB_NONE, 0);
            unmount->op = KVP_OP_ORPHAN_UNMOUNT;
            unmount->segment_id = job->segments[i].id;
            unmount->orphan = true;
            s_advance (self, unmount, KVP_JOB_NONE);
        }
    else if (job->op == KVP_OP_ORPHAN_UNMOUNT)
        self->map_due = true;
    kvp_job_destroy (&job);
}

//  A job came back from an actor.
static void
s_actor_reply (self_t *self, zsock_t *actor)
{
    kvp_job_t *job = kvp_job_recv (actor);
    if (!job)
        return;
    self->in_flight--;
    //  An actor has just worked, and polls for its next job: the api sleeps after answering.
    self->idle_spin = false;
    //  A segment came or went: the index reads' mappings follow.
    if (job->kind == KVP_AL_MOUNT || job->kind == KVP_AL_UNMOUNT)
        self->map_due = true;
    s_advance (self, job, job->kind);
}

//  ---- the actor ---------------------------------------------------------------------

static int
s_pipe_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    (void) msg;
    self_t *self = (self_t *) arg;
    if (streq (command, "ENDPOINTS"))
        kvp_endpoints_reply (self->pipe, self->endpoints, self->bind_error);
    else if (streq (command, "PEER"))
        zstr_sendx (self->pipe, self->peer_endpoint, self->host_id, NULL);
    else if (streq (command, "DRAIN")) {
        self->draining = true;
        actor_shell_remove (shell, self->router);
        actor_shell_remove (shell, self->peer);
    }
    else {
        //  Commands come from kvpoold's code, not from outside: an unknown one is a bug.
        kvp_error ("invalid pipe command '%s'", command);
        assert (false);
    }
    return 0;
}

//  Frees a job that will not be answered (the api is stopping): its pins, its request.
static void
s_abandon (kvp_job_t **job_p)
{
    kvp_job_t *job = *job_p;
    if (!job)
        return;
    s_unpin_items (job);
    api_ctx_t *ctx = (api_ctx_t *) job->context;
    s_ctx_destroy (&ctx);
    kvp_job_destroy (job_p);
}

//  On the way out: waits (briefly) for the jobs still out at the actors, so that none is
//  lost in a closing socket, and frees them and the held ones.
//  After a DRAIN nothing is out; this is for a stop without one.
static void
s_abandon_all (self_t *self)
{
    zpoller_t *poller = zpoller_new (self->rm, self->tx, self->ev, self->cl, NULL);
    int64_t deadline = zclock_mono () + ABANDON_WAIT_MS;
    while (self->in_flight > 0 && zclock_mono () < deadline) {
        zsock_t *which = (zsock_t *) zpoller_wait (poller, (int) (deadline - zclock_mono ()));
        kvp_job_t *job = which ? kvp_job_recv (which) : NULL;
        if (!job)
            continue;
        self->in_flight--;
        s_abandon (&job);
    }
    zpoller_destroy (&poller);
    kvp_job_t *job;
    while ((job = (kvp_job_t *) zlistx_first (self->held))) {
        zlistx_delete (self->held, zlistx_cursor (self->held));
        s_abandon (&job);
    }
    while ((job = (kvp_job_t *) zlistx_first (self->resets))) {
        zlistx_delete (self->resets, zlistx_cursor (self->resets));
        s_abandon (&job);
    }
}

//  The wait: a short spin for the replies a request waits on, then (nothing out at the
//  actors, after a small request answered here alone: the next of a burst may come soon)
//  the idle window, or plain sleep.
static zsock_t *
s_wait (actor_shell_t *shell, wait_set_t *waits, int timeout_ms, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    zsock_t *which = NULL;
    if (self->in_flight > 0)
        which = spin_poll (waits, SPIN_US);
    if (!which) {
        if (self->in_flight == 0 && self->idle_spin)
            which = spin_window_wait (&self->idle, waits, timeout_ms);
        else
            which = wait_set_wait (waits, timeout_ms);
    }
    return which;
}

//  After every wake-up: revoked keys, the connection guard, dead clients, the segment
//  listing, the end of a drain. Returns when it must run next.
static int64_t
s_tick (actor_shell_t *shell, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    key_watch_check (self->client_keys, zclock_mono ());
    key_watch_check (self->node_keys, zclock_mono ());
    conn_guard_sweep (self->guard, zclock_mono ());
    if (zclock_mono () >= self->next_owner_check) {
        if (!self->draining) {
            owners_reap (self->owners, s_owner_gone, self);
            connections_sweep (self->connections, zclock_mono ());
        }
        self->next_owner_check = zclock_mono () + OWNER_CHECK_INTERVAL_MS;
    }
    if (self->map_due && !self->draining)
        s_map_segments (self);
    if (self->draining && !self->drained && self->in_flight == 0 && zlistx_size (self->held) == 0
        && zlistx_size (self->resets) == 0) {
        self->drained = true;
        zstr_send (self->pipe, "DRAINED");
        wait_set_touch (self->waits, self->pipe);
    }
    int64_t due = self->next_owner_check;
    if (key_watch_due (self->client_keys) < due)
        due = key_watch_due (self->client_keys);
    if (key_watch_due (self->node_keys) < due)
        due = key_watch_due (self->node_keys);
    if (self->guard && zclock_mono () + CONN_GUARD_SWEEP_MS < due)
        due = zclock_mono () + CONN_GUARD_SWEEP_MS;
    return due;
}

void
api_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-api");
    self_t *self = s_self_new (shell, pipe, (const kvp_config_t *) args);
    actor_shell_on_command (shell, s_pipe_command);
    actor_shell_on_wait (shell, s_wait);
    actor_shell_on_tick (shell, s_tick);
    actor_shell_run (shell, self);
    s_abandon_all (self);
    s_self_destroy (&self);
    actor_shell_destroy (&shell); //  (the sockets to the actors)
}

//  ---- self test ---------------------------------------------------------------------

void
api_test (bool verbose)
{
    //  The whole store in this process, driven over its inproc endpoint with raw frames.
    kvp_config_t config;
    kvp_config_defaults (&config);
    snprintf (config.instance, sizeof config.instance, "apitest%d", (int) getpid ());
    config.segment_size = 16 << 20;
    config.workers = 2;
    config.endpoints[0] = "tcp://127.0.0.1:*";
    config.endpoint_count = 1;
    zactor_t *rm = zactor_new (replica_manager_actor, &config);
    zactor_t *tx = zactor_new (transfer_submitter_actor, &config);
    zactor_t *ev = zactor_new (evictor_actor, &config);
    zactor_t *api = zactor_new (api_actor, &config);
    zstr_send (api, "ENDPOINTS");
    zmsg_t *endpoints = zmsg_recv (api);
    char *ok = zmsg_popstr (endpoints);
    char *tcp = zmsg_popstr (endpoints);
    assert (streq (ok, "OK") && strncmp (tcp, "tcp://127.0.0.1:", 16) == 0);
    assert (!strchr (tcp, '*'));
    zsock_t *client = zsock_new_dealer (tcp);
    assert (client);

    //  PUT one key, then GET it back.
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    ProtobufCBinaryData keys[] = {{2, (uint8_t *) "k1"}};
    request.version = 1;
    request.request_id = 7;
    request.op = KVPOOL__V1__OP__PUT;
    request.n_keys = 1;
    request.keys = keys;
    uint8_t buf[256];
    size_t len = kvpool__v1__request__pack (&request, buf);
    zsock_send (client, "bs", buf, len, "hello");
    zmsg_t *msg = zmsg_recv (client);
    zframe_t *frame = zmsg_first (msg);
    Kvpool__V1__Reply *reply =
        kvpool__v1__reply__unpack (NULL, zframe_size (frame), zframe_data (frame));
    assert (reply && reply->request_id == 7 && reply->status == 0);
    assert (reply->n_statuses == 1 && reply->statuses[0] == 0);
    kvpool__v1__reply__free_unpacked (reply, NULL);
    zmsg_destroy (&msg);

    request.op = KVPOOL__V1__OP__GET;
    request.request_id = 8;
    len = kvpool__v1__request__pack (&request, buf);
    zsock_send (client, "b", buf, len);
    msg = zmsg_recv (client);
    assert (zmsg_size (msg) == 2);
    frame = zmsg_first (msg);
    reply = kvpool__v1__reply__unpack (NULL, zframe_size (frame), zframe_data (frame));
    assert (reply && reply->statuses[0] == 0 && reply->sizes[0] == 5);
    assert (zframe_streq (zmsg_next (msg), "hello"));
    kvpool__v1__reply__free_unpacked (reply, NULL);
    zmsg_destroy (&msg);

    //  In-process actors send jobs, and get them back done: an EXIST of a key that is there
    //  and one that is not, the stats, and a write refused (its values would live elsewhere).
    zsock_t *actor = zsock_new_dealer (NULL);
    assert (zsock_connect (actor, "inproc://%s-jobs", config.instance) == 0);
    const char *exist_keys[] = {"k1", "nope"};
    size_t exist_lens[] = {2, 4};
    kvp_job_t *job = kvp_job_new_owning (KVP_JOB_NONE, 2, exist_keys, exist_lens);
    job->op = KVPOOL__V1__OP__EXIST;
    assert (kvp_job_send (actor, job) == 0);
    assert (kvp_job_recv (actor) == job);
    assert (job->status == KVPOOL_OK && job->context == NULL);
    assert (job->items[0].status == KVPOOL_OK && job->items[1].status == KVPOOL_OBJECT_NOT_FOUND);
    kvp_job_destroy (&job);
    job = kvp_job_new (KVP_JOB_NONE, 0);
    job->op = KVPOOL__V1__OP__STATS;
    assert (kvp_job_send (actor, job) == 0);
    assert (kvp_job_recv (actor) == job);
    assert (job->status == KVPOOL_OK && job->stats.objects == 1 && job->stats.segments >= 1);
    assert (job->stats.requests >= 2 && job->stats.max_key_len == config.max_key_len);
    kvp_job_destroy (&job);
    job = kvp_job_new_owning (KVP_JOB_NONE, 1, exist_keys, exist_lens);
    job->op = KVPOOL__V1__OP__PUT;
    assert (kvp_job_send (actor, job) == 0);
    assert (kvp_job_recv (actor) == job && job->status == KVPOOL_INVALID_PARAMS);
    kvp_job_destroy (&job);
    zsock_destroy (&actor);

    //  Garbage is answered PROTOCOL_ERROR, and the server keeps serving.
    zstr_send (client, "garbage");
    msg = zmsg_recv (client);
    frame = zmsg_first (msg);
    reply = kvpool__v1__reply__unpack (NULL, zframe_size (frame), zframe_data (frame));
    assert (reply && reply->status == KVPOOL_PROTOCOL_ERROR);
    kvpool__v1__reply__free_unpacked (reply, NULL);
    zmsg_destroy (&msg);

    zsock_destroy (&client);
    zstr_free (&ok);
    zstr_free (&tcp);
    zmsg_destroy (&endpoints);
    zactor_destroy (&api);
    zactor_destroy (&ev);
    zactor_destroy (&rm);
    zactor_destroy (&tx);
    if (verbose)
        printf ("put, get, garbage over tcp; jobs of in-process actors ");
}
