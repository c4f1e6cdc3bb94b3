/*  metrics_http.c - the metrics actor: /metrics and /health over HTTP, and the collector that
    keeps the STATS snapshot they read fresh.

    DESIGN
    HTTP is libmicrohttpd's, on a thread of its own (MHD_USE_INTERNAL_POLLING_THREAD), bound
    to --metrics-host:--metrics-port (loopback by default). Its handler only formats what
    kvp_metrics_t holds (metrics.h): atomics and a snapshot copied under a short mutex. It
    never sends an actor a job nor waits for one, so a scrape costs the data path nothing and
    a stalled node still answers (with a snapshot whose age grows, and /health 503).

    The collector is this actor's own loop: every KVP_METRICS_INTERVAL_MS it sends one STATS
    job through the api's job socket (inproc://<instance>-jobs, as the lookup server does)
    and stores the result with metrics_snapshot. It never has more than one job out, so a slow
    api gets one STATS a second at most.

    Limits, so that slow or idle clients cannot lock a scraper out (docs/security.md): at
    most HTTP_CONNECTIONS connections (an address may hold all but HTTP_RESERVED_FOR_OTHERS:
    a per-address limit does not help on loopback, where scraper and attacker are the same
    address, so the total is high instead), each closed after HTTP_IDLE_S without a byte,
    each with HTTP_MEMORY bytes for its request (a longer request line or header is refused),
    on one epoll thread where a silent connection costs a descriptor and nothing else. The
    descriptors come out of the reserve the client listener leaves (conn_guard.c). Only GET
    and HEAD of /metrics and /health; anything else is 404 or 405. A port that cannot be
    bound (in use: another node on this machine has the default port) fails the start:
    ENDPOINTS answers the reason, and kvpoold exits with it rather than serve without the
    metrics it was asked for (--metrics-port 0: no HTTP at all).

        zactor_t *metrics = zactor_new (metrics_http_actor, &config);  //  config.metrics set
        zstr_send (metrics, "ENDPOINTS");  //  "OK", "http://127.0.0.1:9003"; or "ERROR", why

    Threads: this actor's (the collector, owning the job socket) and libmicrohttpd's (the
    handler, reading kvp_metrics_t only).
*/
#include "infra/metrics_http.h"

#include "infra/log.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "infra/actor_shell.h"
#include "infra/endpoints.h"
#include "protocol/kvpool.pb-c.h"

#define KVP_METRICS_INTERVAL_MS 1000
#define HTTP_CONNECTIONS 512
#define HTTP_RESERVED_FOR_OTHERS 64
#define HTTP_IDLE_S 3
#define HTTP_MEMORY (16 * 1024)
//  At $TERM, how long the STATS job still out is waited for.
#define EXIT_WAIT_MS 1000

typedef struct {
    zsock_t *pipe;
    zsock_t *jobs; //  DEALER to the api's job socket
    const kvp_config_t *config;
    kvp_metrics_t *metrics;
    struct MHD_Daemon *http;
    char url[300];   //  where /metrics is, once bound
    char error[300]; //  why HTTP could not start ("" if it did)
    bool job_out;
    int64_t next_collect;
} self_t;

static enum MHD_Result
s_respond (struct MHD_Connection *connection, unsigned int code, char *body, size_t size,
           const char *type)
{
    struct MHD_Response *response =
        body ? MHD_create_response_from_buffer (size, body, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer (0, (void *) "", MHD_RESPMEM_PERSISTENT);
    if (!response) {
        free (body);
        return MHD_NO;
    }
    if (type)
        MHD_add_response_header (response, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header (response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result rc = MHD_queue_response (connection, code, response);
    MHD_destroy_response (response);
    return rc;
}

//  libmicrohttpd's thread: formats from kvp_metrics_t, nothing else.
static enum MHD_Result
s_answer (void *cls, struct MHD_Connection *connection, const char *url, const char *method,
          const char *version, const char *upload_data, size_t *upload_data_size, void **req_cls)
{
    (void) version;
    (void) upload_data;
    (void) req_cls;
    kvp_metrics_t *metrics = (kvp_metrics_t *) cls;
    if (strcmp (method, MHD_HTTP_METHOD_GET) && strcmp (method, MHD_HTTP_METHOD_HEAD))
        return s_respond (connection, MHD_HTTP_METHOD_NOT_ALLOWED, NULL, 0, NULL);
    if (*upload_data_size) //  a GET with a body: the body is ignored
        *upload_data_size = 0;
    int64_t now = zclock_mono ();
    if (!strcmp (url, "/metrics")) {
        size_t size = 0;
        char *text = metrics_render (metrics, now, &size);
        if (!text)
            return s_respond (connection, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, 0, NULL);
        return s_respond (connection, MHD_HTTP_OK, text, size,
                          "text/plain; version=0.0.4; charset=utf-8");
    }
    if (!strcmp (url, "/health")) {
        bool ok = false;
        char *text = metrics_health (metrics, now, &ok);
        if (!text)
            return s_respond (connection, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, 0, NULL);
        return s_respond (connection, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, text,
                          strlen (text), "application/json");
    }
    return s_respond (connection, MHD_HTTP_NOT_FOUND,
                      strdup ("not found: try /metrics or /health\n"),
                      strlen ("not found: try /metrics or /health\n"), "text/plain");
}

//  Why address:port cannot be bound: libmicrohttpd does not say, so a socket of our own
//  tries (it is closed at once). Returns an errno, or 0 when the bind works now.
static int
s_bind_errno (const struct addrinfo *address)
{
    int fd = socket (address->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd == -1)
        return errno;
    int one = 1;
    setsockopt (fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = bind (fd, address->ai_addr, address->ai_addrlen) == 0 ? 0 : errno;
    close (fd);
    return rc;
}

//  Starts HTTP on --metrics-host:--metrics-port; on failure, says why in self->error.
static void
s_http_start (self_t *self)
{
    const kvp_config_t *config = self->config;
    char port[16];
    snprintf (port, sizeof port, "%u", (unsigned) config->metrics_port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *found = NULL;
    int rc = getaddrinfo (config->metrics_host, port, &hints, &found);
    if (rc != 0 || !found) {
        snprintf (self->error, sizeof self->error,
                  "cannot resolve --metrics-host %s: %s (--metrics-port 0: no metrics over HTTP)",
                  config->metrics_host, gai_strerror (rc));
        return;
    }
    //  One internal thread polling with epoll (MHD_USE_AUTO picks it on Linux): silent
    //  connections cost it nothing per poll.
    unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD;
    if (found->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    self->http = MHD_start_daemon (
        flags, (uint16_t) config->metrics_port, NULL, NULL, s_answer, self->metrics,
        MHD_OPTION_SOCK_ADDR, found->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int) HTTP_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned int) (HTTP_CONNECTIONS - HTTP_RESERVED_FOR_OTHERS), MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned int) HTTP_IDLE_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) HTTP_MEMORY,
        MHD_OPTION_END);
    char host[INET6_ADDRSTRLEN] = "?";
    if (found->ai_family == AF_INET6)
        inet_ntop (AF_INET6, &((struct sockaddr_in6 *) found->ai_addr)->sin6_addr, host,
                   sizeof host);
    else
        inet_ntop (AF_INET, &((struct sockaddr_in *) found->ai_addr)->sin_addr, host, sizeof host);
    if (!self->http) {
        int why = s_bind_errno (found);
        snprintf (self->error, sizeof self->error,
                  "cannot serve /metrics on %s port %s: %s (give each node on a machine its own "
                  "--metrics-port, or --metrics-port 0 for no metrics over HTTP)",
                  host, port, why ? strerror (why) : "libmicrohttpd failed to start");
    }
    else
        snprintf (self->url, sizeof self->url,
                  found->ai_family == AF_INET6 ? "http://[%s]:%s" : "http://%s:%s", host, port);
    freeaddrinfo (found);
}

static self_t *
s_self_new (zsock_t *pipe, const kvp_config_t *config)
{
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->pipe = pipe;
    self->config = config;
    self->metrics = config->metrics;
    self->jobs = zsock_new (ZMQ_DEALER);
    assert (self->jobs);
    zsock_set_sndtimeo (self->jobs, 0);
    if (config->role != KVP_ROLE_MASTER) {
        int rc = zsock_connect (self->jobs, "inproc://%s-jobs", config->instance);
        assert (rc == 0);
    }
    s_http_start (self);
    return self;
}

static void
s_self_destroy (self_t **self_p)
{
    self_t *self = *self_p;
    if (!self)
        return;
    if (self->http)
        MHD_stop_daemon (self->http);
    zsock_destroy (&self->jobs);
    free (self);
    *self_p = NULL;
}

static void
s_collect (self_t *self, int64_t now)
{
    self->next_collect = now + KVP_METRICS_INTERVAL_MS;
    if (self->job_out)
        return;
    kvp_job_t *job = kvp_job_new (KVP_JOB_NONE, 0);
    assert (job);
    job->op = KVPOOL__V1__OP__STATS;
    if (kvp_job_send (self->jobs, job) == 0)
        self->job_out = true;
    else
        kvp_job_destroy (&job);
}

static void
s_collected (self_t *self)
{
    kvp_job_t *job = kvp_job_recv (self->jobs);
    if (!job)
        return;
    self->job_out = false;
    if (job->status == KVPOOL_OK)
        metrics_snapshot (self->metrics, kvp_job_stats (job), job->segments.list,
                          job->segments.count, zclock_mono ());
    kvp_job_destroy (&job);
}

static int
s_pipe_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    (void) shell, (void) msg;
    self_t *self = (self_t *) arg;
    if (streq (command, "ENDPOINTS")) {
        zlistx_t *endpoints = zlistx_new ();
        if (*self->url)
            zlistx_add_end (endpoints, self->url);
        kvp_endpoints_reply (self->pipe, endpoints, self->error);
        zlistx_destroy (&endpoints);
    }
    else {
        kvp_error ("invalid pipe command '%s'", command);
        assert (false);
    }
    return 0;
}

static int
s_jobs_reader (actor_shell_t *shell, zsock_t *jobs, void *arg)
{
    (void) shell, (void) jobs;
    s_collected ((self_t *) arg);
    return 0;
}

//  A master has no api to collect from: its actor sets its figures itself.
static int64_t
s_collect_due (actor_shell_t *shell, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    if (self->config->role == KVP_ROLE_MASTER)
        return -1;
    int64_t now = zclock_mono ();
    if (now >= self->next_collect)
        s_collect (self, now);
    return self->next_collect;
}

void
metrics_http_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-metrics");
    self_t *self = s_self_new (pipe, (const kvp_config_t *) args);
    actor_shell_add (shell, self->jobs, s_jobs_reader);
    actor_shell_on_command (shell, s_pipe_command);
    actor_shell_on_tick (shell, s_collect_due);
    actor_shell_run (shell, self);
    //  A STATS job still out is waited for (the api answers it while it drains), so that
    //  it is not sent back to a socket that is gone.
    zsock_set_rcvtimeo (self->jobs, EXIT_WAIT_MS);
    if (self->job_out)
        s_collected (self);
    s_self_destroy (&self);
    actor_shell_destroy (&shell);
}
