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

    Files: this one is the actor (its sockets, its loop on infra/actor_shell.h, pipe
    commands, the way out); requests come in through api_intake.c, jobs walk their rows in
    api_route.c, replies go out from api_reply.c; api_self.h holds the state they share.

    Threads: one. Memory: value frames of a PUT are released after the reply; a GET's values
    are pinned objects handed to ZeroMQ with a free callback (kvp_object_unpin_cb); reply
    arrays live in the request's arena.
*/
#include "actors/api.h"
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

//  How far over --max-value-size a frame may be before libzmq drops the connection.
#define MAX_FRAME_SLACK (64ULL << 20)
#define OWNER_CHECK_INTERVAL_MS 1000
//  Same-machine client processes the node tracks at once (owners.h).
#define MAX_OWNERS 4096
//  A stop without a drain waits this long for jobs out at the actors.
#define ABANDON_WAIT_MS 1000
//  While jobs are out at the actors, wait this long for their replies before sleeping.
#define SPIN_US 50

//  ---- binding -----------------------------------------------------------------------

static int
s_bind (api_t *self, const char *endpoint)
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
s_bind_local (api_t *self)
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
s_bind_peer (api_t *self)
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
bool
api_checksums_wanted (const kvp_config_t *config)
{
    return config->verify_checksums && config->role == KVP_ROLE_NODE;
}

static int
s_client_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell;
    api_client_message ((api_t *) arg, sock);
    return 0;
}

static int
s_jobs_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell, (void) sock;
    api_job_message ((api_t *) arg);
    return 0;
}

static int
s_actor_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell;
    api_actor_reply ((api_t *) arg, sock);
    return 0;
}

static int
s_guard_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell, (void) sock;
    conn_guard_handle (((api_t *) arg)->guard);
    return 0;
}

//  The actors a job's stages go to (kvp_job_kind_actor), by their inproc ROUTERs: jobs are
//  never held back (no high-water mark on the way out).
#define ACTOR_DEALER(name)                                                                         \
    {                                                                                              \
        ZMQ_DEALER, ">inproc://%s-" name, 0, ACTOR_HWM_LIBZMQ, s_actor_reader, false               \
    }
static const actor_socket_t s_actor_sockets[] = {ACTOR_DEALER ("rm"), ACTOR_DEALER ("tx"),
                                                 ACTOR_DEALER ("cl")};

static api_t *
s_self_new (actor_shell_t *shell, zsock_t *pipe, const kvp_config_t *config)
{
    api_t *self = (api_t *) zmalloc (sizeof (api_t));
    self->pipe = pipe;
    self->settings = *config;
    self->config = &self->settings;
    spin_window_init (&self->idle, (int) config->spin_us);
    self->router = zsock_new (ZMQ_ROUTER);
    assert (self->router);
    //  Every socket the api reads is in its wait set (wait_set.h), the pipe first.
    self->waits = actor_shell_use_wait_set (shell);
    self->cluster = config->role == KVP_ROLE_NODE;
    value_checksum_set_verify (api_checksums_wanted (config));
    zsock_set_sndhwm (self->router, 100000);
    zsock_set_rcvhwm (self->router, RCVHWM);
    zsock_set_linger (self->router, 0);
    //  A frame far over the value limit is refused by libzmq before it is buffered (the peer
    //  is disconnected): nobody can make the node allocate gigabytes. Frames a little over
    //  the limit still arrive and get a VALUE_TOO_LARGE reply.
    zsock_set_maxmsgsize (self->router, (int64_t) (config->max_value_size + MAX_FRAME_SLACK));
    //  tcp and ipc clients alike (inproc never runs a handshake).
    kvp_curve_server (config->curve, self->router);
    zsock_t **actors[] = {&self->rm, &self->tx, &self->cl};
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
        kvp_host_id (self->host_id, sizeof self->host_id);
    snprintf (self->server_id, sizeof self->server_id, "%s/%d", self->host_id, (int) getpid ());
    if (config->index_slots != 0) {
        shm_index_make_name (self->index_name, sizeof self->index_name, config->instance);
        self->reads = index_reads_new (self->index_name);
    }
    //  A node of a cluster keeps copies of values read often that other nodes hold.
    if (config->role == KVP_ROLE_NODE && config->hot_cache_size != 0)
        self->hot = hot_cache_new (config->hot_cache_admit, config->hot_cache_window_ms);
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
s_self_destroy (api_t **self_p)
{
    api_t *self = *self_p;
    if (!self)
        return;
    conn_guard_destroy (&self->guard);
    key_watch_destroy (&self->client_keys);
    key_watch_destroy (&self->node_keys);
    index_reads_destroy (&self->reads);
    hot_cache_destroy (&self->hot);
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

//  ---- the actor ---------------------------------------------------------------------

static int
s_pipe_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    (void) msg;
    api_t *self = (api_t *) arg;
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
    api_unpin_items (job);
    api_ctx_t *ctx = (api_ctx_t *) job->context;
    api_ctx_destroy (&ctx);
    kvp_job_destroy (job_p);
}

//  On the way out: waits (briefly) for the jobs still out at the actors, so that none is
//  lost in a closing socket, and frees them and the held ones.
//  After a DRAIN nothing is out; this is for a stop without one.
static void
s_abandon_all (api_t *self)
{
    zpoller_t *poller = zpoller_new (self->rm, self->tx, self->cl, NULL);
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
    api_t *self = (api_t *) arg;
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
    api_t *self = (api_t *) arg;
    key_watch_check (self->client_keys, zclock_mono ());
    key_watch_check (self->node_keys, zclock_mono ());
    conn_guard_sweep (self->guard, zclock_mono ());
    if (zclock_mono () >= self->next_owner_check) {
        if (!self->draining) {
            owners_reap (self->owners, api_owner_gone, self);
            connections_sweep (self->connections, zclock_mono ());
        }
        self->next_owner_check = zclock_mono () + OWNER_CHECK_INTERVAL_MS;
    }
    if (self->map_due && !self->draining)
        api_map_segments (self);
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
    api_t *self = s_self_new (shell, pipe, (const kvp_config_t *) args);
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
    assert (job->status == KVPOOL_OK && kvp_job_stats (job)->objects == 1
            && kvp_job_stats (job)->segments >= 1);
    assert (kvp_job_stats (job)->requests >= 2
            && kvp_job_stats (job)->max_key_len == config.max_key_len);
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
