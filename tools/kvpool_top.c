/*  kvpool_top.c - `kvpool top`: a live view of one node, refreshed every second.

    Reads nothing but the client protocol: a STATS request (kvpool_stats_ops: the node's
    figures and its per-operation counters and latency histograms) and a NODES request each
    interval. A cluster's node (master_lease_ms > 0) has a line for its link to its master:
    connected or degraded (as /health says it), the master it talks to (the STATS reply's
    master_endpoint: kvpool_master_endpoint), the leader's term and how long the master has
    been silent. Rates are differences between two samples over the time between them; p50 and
    p99 are the upper bounds of the histogram buckets where the interval's requests reach
    half and 99% (so "<= 0.25 ms" reads as "at most a quarter of a millisecond").

    Interactive on a terminal: the screen is redrawn each interval, 'q' (or Ctrl-C) quits and
    the terminal is put back as it was. --once waits one interval and prints one frame, for
    scripts and tests.

    Threads: one.
*/
#include "tools/kvpool_top.h"

#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define TOP_OPS 40
#define TOP_NODES 256

typedef struct {
    double at; //  seconds, monotonic
    kvpool_stats_t stats;
    kvpool_op_stats_t ops[TOP_OPS];
    size_t op_count;
    int nodes, nodes_alive; //  -1: not known
} sample_t;

static volatile sig_atomic_t s_interrupted;

static void
s_on_signal (int signum)
{
    (void) signum;
    s_interrupted = 1;
}

static double
s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int
s_sample (kvpool_t *pool, sample_t *sample)
{
    size_t count = 0;
    int rc = kvpool_stats_ops (pool, &sample->stats, sample->ops, TOP_OPS, &count);
    if (rc != KVPOOL_OK)
        return rc;
    sample->op_count = count < TOP_OPS ? count : TOP_OPS;
    sample->at = s_now ();
    kvpool_node_t *nodes = calloc (TOP_NODES, sizeof *nodes);
    int n = nodes ? kvpool_nodes (pool, nodes, TOP_NODES) : -1;
    sample->nodes = n;
    sample->nodes_alive = 0;
    for (int i = 0; i < n && i < TOP_NODES; i++)
        sample->nodes_alive += nodes[i].alive;
    free (nodes);
    return KVPOOL_OK;
}

//  "12.3 MiB"
static const char *
s_bytes (double bytes, char *out, size_t size)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    snprintf (out, size, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
    return out;
}

static const kvpool_op_stats_t *
s_find_op (const sample_t *sample, int op)
{
    for (size_t i = 0; i < sample->op_count; i++)
        if (sample->ops[i].op == op)
            return &sample->ops[i];
    return NULL;
}

//  The bucket bound (ms) under which fraction q of the interval's requests were answered;
//  NAN when there were none, INFINITY past the last bound.
static double
s_quantile_ms (const uint64_t *delta, uint64_t total, double q)
{
    static const uint64_t bounds[KVPOOL_LATENCY_BUCKETS - 1] = KVPOOL_LATENCY_BOUNDS_US;
    if (!total)
        return NAN;
    uint64_t want = (uint64_t) ceil (q * (double) total), seen = 0;
    for (size_t b = 0; b < KVPOOL_LATENCY_BUCKETS; b++) {
        seen += delta[b];
        if (seen >= want)
            return b < KVPOOL_LATENCY_BUCKETS - 1 ? (double) bounds[b] / 1000.0 : INFINITY;
    }
    return INFINITY;
}

static void
s_latency (char *out, size_t size, double ms)
{
    if (isnan (ms))
        snprintf (out, size, "-");
    else if (isinf (ms))
        snprintf (out, size, "> 5000");
    else
        snprintf (out, size, "<= %g", ms);
}

static double
s_rate (uint64_t now, uint64_t before, double seconds)
{
    return now >= before && seconds > 0 ? (double) (now - before) / seconds : 0;
}

static void
s_render (FILE *out, const char *endpoint, const char *master, const sample_t *a, const sample_t *b,
          bool screen)
{
    if (!master || !*master)
        master = "-";
    const kvpool_stats_t *s = &b->stats, *p = &a->stats;
    double dt = b->at - a->at;
    char x[32], y[32], z[32];
    if (screen)
        fputs ("\033[H\033[2J", out);
    uint64_t up = s->uptime_ms / 1000;
    fprintf (out, "kvpool top  %s  up %" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s  every %.1f s%s\n",
             endpoint, up / 3600, up / 60 % 60, up % 60, dt, screen ? "  (q quits)" : "");
    fprintf (out,
             "memory       %s of %s (%.1f%%)  objects %" PRIu64 " (pinned %" PRIu64
             ", leased %" PRIu64 ")  pending puts %" PRIu64 "  segments %u\n",
             s_bytes ((double) s->bytes_allocated, x, sizeof x),
             s_bytes ((double) s->bytes_mounted, y, sizeof y),
             s->bytes_mounted ? 100.0 * (double) s->bytes_allocated / (double) s->bytes_mounted : 0,
             s->objects, s->pinned_objects, s->leased_objects, s->pending_puts, s->segments);
    fprintf (out, "disk         %s of %s  objects %" PRIu64 "  hits %.0f/s\n",
             s_bytes ((double) s->disk_bytes, x, sizeof x),
             s_bytes ((double) s->disk_capacity, y, sizeof y), s->disk_objects,
             s_rate (s->disk_hits, p->disk_hits, dt));
    fprintf (out, "traffic      in %s/s  out %s/s  connections %" PRIu64 "\n",
             s_bytes (s_rate (s->value_bytes_in, p->value_bytes_in, dt), x, sizeof x),
             s_bytes (s_rate (s->value_bytes_out, p->value_bytes_out, dt), y, sizeof y),
             s->connections);
    //  Every get, hit or miss, on every path (docs/metrics.md); those same-machine clients
    //  read from shared memory themselves make no GET request, so the GET row below lacks them.
    double gets = s_rate (s->gets, p->gets, dt), hits = s_rate (s->get_hits, p->get_hits, dt);
    if (gets > 0)
        snprintf (z, sizeof z, "%.1f%%", 100.0 * hits / gets);
    else
        snprintf (z, sizeof z, "-");
    fprintf (out,
             "hit rate     %s of %.0f gets/s (same machine %.0f/s)  evictions %.0f/s  offloads "
             "%.0f/s  promotions %.0f/s\n",
             z, gets, s_rate (s->client_gets, p->client_gets, dt),
             s_rate (s->evictions, p->evictions, dt), s_rate (s->offloads, p->offloads, dt),
             s_rate (s->promotions, p->promotions, dt));
    if (s->master_lease_ms)
        fprintf (out, "master       %s  %s  term %" PRIu64 "  silent %.1f s (lease %.1f s)\n",
                 s->master_connected ? "connected" : "DEGRADED (unregistered, or silent too long)",
                 master, s->master_term, (double) s->master_silence_ms / 1000.0,
                 (double) s->master_lease_ms / 1000.0);
    if (b->nodes >= 0)
        fprintf (out, "nodes        %d alive of %d  remote gets %.0f/s  remote puts %.0f/s\n",
                 b->nodes_alive, b->nodes, s_rate (s->remote_gets, p->remote_gets, dt),
                 s_rate (s->remote_puts, p->remote_puts, dt));
    else
        fprintf (out, "nodes        -\n");
    if (b->nodes >= 0) {
        //  The hot cache: gets of values only other nodes hold, served here or not, and what
        //  each cost in master round trips.
        double cache_hits = s_rate (s->hot_cache_hits, p->hot_cache_hits, dt);
        double remote = cache_hits + s_rate (s->hot_cache_misses, p->hot_cache_misses, dt);
        double asked = s_rate (s->master_requests, p->master_requests, dt);
        if (remote > 0)
            snprintf (z, sizeof z, "%.1f%%", 100.0 * cache_hits / remote);
        else
            snprintf (z, sizeof z, "-");
        fprintf (out,
                 "hot cache    %s of %.0f remote gets/s  %s  admissions %.0f/s  evictions "
                 "%.0f/s  master requests %.2f a remote get\n",
                 z, remote, s_bytes ((double) s->hot_cache_bytes, x, sizeof x),
                 s_rate (s->hot_cache_admissions, p->hot_cache_admissions, dt),
                 s_rate (s->hot_cache_evictions, p->hot_cache_evictions, dt),
                 remote > 0 ? asked / remote : 0.0);
    }
    fprintf (out, "\n%-18s %10s %10s %12s %12s\n", "operation", "req/s", "fail/s", "p50 ms",
             "p99 ms");
    for (size_t i = 0; i < b->op_count; i++) {
        const kvpool_op_stats_t *now = &b->ops[i];
        const kvpool_op_stats_t *before = s_find_op (a, now->op);
        uint64_t delta[KVPOOL_LATENCY_BUCKETS], total = 0;
        for (size_t k = 0; k < KVPOOL_LATENCY_BUCKETS; k++) {
            uint64_t was = before ? before->latency_buckets[k] : 0;
            delta[k] = now->latency_buckets[k] >= was ? now->latency_buckets[k] - was : 0;
            total += delta[k];
        }
        s_latency (x, sizeof x, s_quantile_ms (delta, total, 0.50));
        s_latency (y, sizeof y, s_quantile_ms (delta, total, 0.99));
        fprintf (out, "%-18s %10.1f %10.1f %12s %12s\n", now->name,
                 s_rate (now->requests, before ? before->requests : 0, dt),
                 s_rate (now->failures, before ? before->failures : 0, dt), x, y);
    }
    fflush (out);
}

//  Waits up to ms for a key; true when it was q (or the run was interrupted).
static bool
s_wait_quit (int ms, bool tty)
{
    double deadline = s_now () + ms / 1000.0;
    while (!s_interrupted) {
        int left = (int) ((deadline - s_now ()) * 1000);
        if (left <= 0)
            return false;
        struct pollfd item = {.fd = STDIN_FILENO, .events = POLLIN};
        int rc = tty ? poll (&item, 1, left) : poll (NULL, 0, left);
        if (rc > 0 && (item.revents & (POLLIN | POLLHUP))) {
            char c = 0;
            ssize_t got = read (STDIN_FILENO, &c, 1);
            if (got <= 0 || c == 'q' || c == 'Q')
                return true;
        }
    }
    return true;
}

int
kvpool_top (kvpool_t *pool, const char *endpoint, bool once, int interval_ms)
{
    sample_t *a = calloc (1, sizeof *a), *b = calloc (1, sizeof *b);
    if (!a || !b) {
        free (a);
        free (b);
        return 1;
    }
    int status = 0;
    int rc = s_sample (pool, a);
    if (rc != KVPOOL_OK) {
        fprintf (stderr, "kvpool: top: %s (%s)\n", kvpool_strerror (rc), kvpool_status_name (rc));
        free (a);
        free (b);
        return 1;
    }
    bool tty = !once && isatty (STDIN_FILENO);
    struct termios saved;
    if (tty && tcgetattr (STDIN_FILENO, &saved) == 0) {
        struct termios raw = saved;
        raw.c_lflag &= ~(tcflag_t) (ICANON | ECHO);
        raw.c_cc[VMIN] = 1;
        raw.c_cc[VTIME] = 0;
        tcsetattr (STDIN_FILENO, TCSANOW, &raw);
    }
    else
        tty = false;
    struct sigaction action = {.sa_handler = s_on_signal}, old_int, old_term;
    sigaction (SIGINT, &action, &old_int);
    sigaction (SIGTERM, &action, &old_term);
    if (!once)
        fputs ("\033[H\033[2Jkvpool top: first sample taken, the rates follow...\n", stdout);
    fflush (stdout);
    while (true) {
        if (s_wait_quit (interval_ms, tty))
            break;
        rc = s_sample (pool, b);
        if (rc != KVPOOL_OK) {
            fprintf (stderr, "kvpool: top: %s (%s): %s\n", kvpool_strerror (rc),
                     kvpool_status_name (rc), kvpool_last_error (pool));
            status = 1;
            break;
        }
        s_render (stdout, endpoint, kvpool_master_endpoint (pool), a, b, !once);
        if (once)
            break;
        sample_t *t = a;
        a = b;
        b = t;
    }
    if (tty)
        tcsetattr (STDIN_FILENO, TCSANOW, &saved);
    sigaction (SIGINT, &old_int, NULL);
    sigaction (SIGTERM, &old_term, NULL);
    free (a);
    free (b);
    return status;
}
