/*  bench_curve.c - kvpool-bench's curve section: what CURVE costs a client on tcp (issue #15).

    Two kvpoolds of its own on loopback: "plain", and "curve" with --curve-secret and
    --curve-allow. The certificates are made here with CZMQ (zcert) in a scratch directory:
    the node's pair, and the client's, whose public half alone is in the allow directory. A
    client connects to each over tcp and stays there (fast_path = 0, keep_endpoint = 1:
    keep_endpoint alone would still take the same-machine path), so every byte of the curve
    figures crosses a CURVE handshake's session, encrypted and authenticated by libzmq.

    The workloads, on values put once before (untimed):
      batch  kvpool_get_batch_into of 32 x 1 MiB into the client's buffers (the kv section's
             "get 1MiB batch32 tcp")
      zc     kvpool_get_batch of the same 32 x 1 MiB (zero copy: values stay in the messages)
      one    kvpool_get_into of one 4 KiB value a call, for p50 and p99 latency
    Each repetition calls one workload until rep_seconds have passed; the repetitions are
    interleaved (plain, curve, then curve, plain, ...) so a burst of load from other users of
    this shared machine hits both alike. Throughput is the median over the repetitions;
    latency p50/p99 are over every call of every repetition, as in the kv section. Beside
    them, each daemon's CPU time (/proc/PID/stat) and the bench's own (its clients' I/O
    threads do the client's half of the encryption) per GB or per get: steadier than
    throughput on a busy machine, since both sides did the same work.

    Checks: before each repetition an untimed call reads into zeroed buffers and every byte is
    compared with what was put (values follow from their key's number, bench_fill); every
    call's statuses and sizes are checked; and a client without CURVE must be refused by the
    curve daemon, or the curve figures would not be what they say.

    Threads: the bench's only (libkvpool and libzmq run their own).
*/
#include "bench/bench.h"
#include "kvpool.h"

#include <czmq.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CV_BATCH 32
#define CV_LARGE (1u << 20)
#define CV_SMALL 4096u
#define CV_MAX_REPS 64
#define CV_RPC_TIMEOUT_MS 60000
#define CV_MIN_DAEMON_CPU 0.1 //  seconds: ten of /proc/PID/stat's ticks

enum { W_BATCH, W_ZC, W_ONE, W_COUNT };
enum { SIDE_PLAIN, SIDE_CURVE, SIDE_COUNT };

static const char *s_side_names[SIDE_COUNT] = {"plain", "curve"};

typedef struct {
    double rate[CV_MAX_REPS];      //  bytes per second (batch, zc) or gets per second (one)
    bench_series_t latency;        //  seconds per call, every repetition
    double daemon_cpu, client_cpu; //  seconds, over the timed repetitions
    double units;                  //  bytes (batch, zc) or gets (one) in the timed repetitions
    int reps;
} figures_t;

typedef struct {
    bench_kvpoold_t daemon;
    kvpool_t *client;
    figures_t figures[W_COUNT];
} side_t;

typedef struct {
    side_t sides[SIDE_COUNT];
    char large_keys[CV_BATCH][64], small_keys[CV_BATCH][64];
    const char *large[CV_BATCH], *small[CV_BATCH];
    void *src[CV_BATCH], *dst[CV_BATCH];
    size_t capacities[CV_BATCH];
    int64_t got[CV_BATCH];
    int statuses[CV_BATCH];
    char why[512];
} curve_bench_t;

//  This process's CPU seconds: the bench and its clients' I/O threads.
static double
s_own_cpu_seconds (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

//  ---- certificates and daemons ------------------------------------------------------------

//  The node's pair (dir/node, dir/node_secret), the client's (dir/client, dir/client_secret)
//  and the client's public certificate alone in dir/allow. Returns 0 or -1.
static int
s_make_certificates (const char *dir, char *why, size_t why_size)
{
    char path[512];
    snprintf (path, sizeof path, "%s/allow", dir);
    if (mkdir (path, 0700) != 0) {
        snprintf (why, why_size, "mkdir %.400s: %s", path, strerror (errno));
        return -1;
    }
    zcert_t *node = zcert_new ();
    zcert_t *client = zcert_new ();
    int rc = node && client ? 0 : -1;
    if (rc == 0) {
        zcert_set_meta (node, "name", "kvpool-bench node");
        zcert_set_meta (client, "name", "kvpool-bench client");
        snprintf (path, sizeof path, "%s/node", dir);
        rc = zcert_save (node, path);
    }
    if (rc == 0) {
        snprintf (path, sizeof path, "%s/client", dir);
        rc = zcert_save (client, path);
    }
    if (rc == 0) {
        snprintf (path, sizeof path, "%s/allow/client", dir);
        rc = zcert_save_public (client, path);
    }
    if (rc != 0)
        snprintf (why, why_size, "cannot make the certificates in %s", dir);
    zcert_destroy (&node);
    zcert_destroy (&client);
    return rc;
}

//  A tcp client of endpoint, on tcp for good; with CURVE when secret and server are set.
static kvpool_t *
s_connect (const char *endpoint, const char *secret, const char *server, int connect_timeout_ms)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = CV_RPC_TIMEOUT_MS;
    options.connect_timeout_ms = connect_timeout_ms;
    options.fast_path = 0;
    options.keep_endpoint = 1;
    options.curve_secret_file = secret;
    options.curve_server_file = server;
    return kvpool_connect (endpoint, &options);
}

//  ---- the calls ---------------------------------------------------------------------------

static int
s_fail (curve_bench_t *self, kvpool_t *client, const char *call, int status)
{
    const char *reason = client ? kvpool_last_error (client) : "";
    snprintf (self->why, sizeof self->why, "%s: %s%s%s", call, kvpool_status_name (status),
              *reason ? ": " : "", reason);
    return -1;
}

//  Puts the 32 large and 32 small values (the seeds: 0..31 large, 100..131 small).
static int
s_put_values (curve_bench_t *self, kvpool_t *client)
{
    size_t sizes[CV_BATCH];
    const void *data[CV_BATCH];
    for (int pass = 0; pass < 2; pass++) {
        size_t size = pass == 0 ? CV_LARGE : CV_SMALL;
        for (int j = 0; j < CV_BATCH; j++) {
            bench_fill (self->src[j], size, (uint64_t) (pass * 100 + j));
            data[j] = self->src[j];
            sizes[j] = size;
        }
        const char *const *keys = pass == 0 ? self->large : self->small;
        int rc = kvpool_put_batch (client, CV_BATCH, keys, data, sizes, NULL, self->statuses);
        for (int j = 0; rc == KVPOOL_OK && j < CV_BATCH; j++)
            rc = self->statuses[j];
        if (rc != KVPOOL_OK)
            return s_fail (self, client, "kvpool_put_batch", rc);
    }
    return 0;
}

static int
s_check (curve_bench_t *self, const char *call, const void *data, size_t got, size_t size,
         uint64_t seed)
{
    if (got != size || !data) {
        snprintf (self->why, sizeof self->why, "%s: a value of %zu bytes, not %zu", call, got,
                  size);
        return -1;
    }
    if (!bench_holds (data, size, seed)) {
        snprintf (self->why, sizeof self->why,
                  "%s: the value of seed %llu differs from what was "
                  "put",
                  call, (unsigned long long) seed);
        return -1;
    }
    return 0;
}

//  One call of workload w (call: its number within the repetition, which picks the 4 KiB
//  key). verify: zero the buffers first and compare every byte after.
static int
s_call (curve_bench_t *self, kvpool_t *client, int w, uint64_t call, bool verify)
{
    if (w == W_BATCH) {
        for (int j = 0; verify && j < CV_BATCH; j++)
            memset (self->dst[j], 0, CV_LARGE);
        int rc = kvpool_get_batch_into (client, CV_BATCH, self->large, self->dst, self->capacities,
                                        self->got);
        if (rc != KVPOOL_OK)
            return s_fail (self, client, "kvpool_get_batch_into", rc);
        for (int j = 0; j < CV_BATCH; j++) {
            if (self->got[j] < 0)
                return s_fail (self, client, "kvpool_get_batch_into", (int) self->got[j]);
            if ((verify || (size_t) self->got[j] != CV_LARGE)
                && s_check (self, "kvpool_get_batch_into", self->dst[j], (size_t) self->got[j],
                            CV_LARGE, (uint64_t) j))
                return -1;
        }
        return 0;
    }
    if (w == W_ZC) {
        kvpool_values_t *values = NULL;
        int rc = kvpool_get_batch (client, CV_BATCH, self->large, &values, self->statuses);
        for (int j = 0; rc == KVPOOL_OK && j < CV_BATCH; j++)
            rc = self->statuses[j];
        if (rc != KVPOOL_OK) {
            kvpool_values_destroy (&values);
            return s_fail (self, client, "kvpool_get_batch", rc);
        }
        for (int j = 0; rc == 0 && j < CV_BATCH; j++) {
            size_t got = kvpool_values_size (values, j);
            if (verify || got != CV_LARGE)
                rc = s_check (self, "kvpool_get_batch", kvpool_values_data (values, j), got,
                              CV_LARGE, (uint64_t) j);
        }
        kvpool_values_destroy (&values);
        return rc;
    }
    int j = (int) (call % CV_BATCH);
    if (verify)
        memset (self->dst[j], 0, CV_SMALL);
    int64_t got = kvpool_get_into (client, self->small[j], self->dst[j], CV_SMALL);
    if (got < 0)
        return s_fail (self, client, "kvpool_get_into", (int) got);
    if ((verify || (size_t) got != CV_SMALL)
        && s_check (self, "kvpool_get_into", self->dst[j], (size_t) got, CV_SMALL,
                    (uint64_t) (100 + j)))
        return -1;
    return 0;
}

//  One repetition of workload w against side: an untimed checked call, then calls until
//  seconds have passed. timed false: a warm-up, nothing recorded. Returns 0 or -1.
static int
s_rep (curve_bench_t *self, side_t *side, int w, double seconds, bool timed)
{
    if (s_call (self, side->client, w, 0, true) != 0)
        return -1;
    figures_t *figures = &side->figures[w];
    double daemon_cpu = bench_cpu_seconds (side->daemon.pid);
    double client_cpu = s_own_cpu_seconds ();
    double start = bench_now (), now = start, deadline = start + seconds;
    uint64_t calls = 0;
    do {
        double before = now;
        if (s_call (self, side->client, w, calls + 1, false) != 0)
            return -1;
        now = bench_now ();
        calls++;
        if (timed)
            bench_series_add (&figures->latency, now - before);
    } while (now < deadline);
    if (!timed)
        return 0;
    double units = w == W_ONE ? (double) calls : (double) calls * CV_BATCH * CV_LARGE;
    figures->rate[figures->reps++] = units / (now - start);
    figures->units += units;
    figures->daemon_cpu += bench_cpu_seconds (side->daemon.pid) - daemon_cpu;
    figures->client_cpu += s_own_cpu_seconds () - client_cpu;
    return 0;
}

//  ---- the report --------------------------------------------------------------------------

static void
s_row (const char *name, double plain, double curve, const char *format)
{
    char a[32], b[32];
    snprintf (a, sizeof a, format, plain);
    snprintf (b, sizeof b, format, curve);
    printf ("  %-52s %10s %10s %12.2f\n", name, a, b, curve / plain);
}

static void
s_report (curve_bench_t *self, int reps, double rep_seconds)
{
    double batch[SIDE_COUNT], zc[SIDE_COUNT], p50[SIDE_COUNT], p99[SIDE_COUNT], per_sec[SIDE_COUNT];
    for (int s = 0; s < SIDE_COUNT; s++) {
        figures_t *f = self->sides[s].figures;
        batch[s] = bench_median (f[W_BATCH].rate, f[W_BATCH].reps) / 1e9;
        zc[s] = bench_median (f[W_ZC].rate, f[W_ZC].reps) / 1e9;
        per_sec[s] = bench_median (f[W_ONE].rate, f[W_ONE].reps);
        p50[s] = bench_series_us (&f[W_ONE].latency, 0.50);
        p99[s] = bench_series_us (&f[W_ONE].latency, 0.99);
    }
    printf ("\n== curve: CURVE against plain tcp (client on tcp: fast_path 0, keep_endpoint 1; "
            "two kvpoolds of its own;\n   median of %d interleaved runs of %.0f ms; p50/p99 per "
            "call over every run) ==\n",
            reps, rep_seconds * 1000);
    printf ("  %-52s %10s %10s %12s\n", "workload", "plain", "curve", "curve/plain");
    s_row ("get 1MiB batch32, kvpool_get_batch_into (GB/s)", batch[0], batch[1], "%.3f");
    s_row ("get 1MiB batch32, kvpool_get_batch zero-copy (GB/s)", zc[0], zc[1], "%.3f");
    s_row ("get 4KiB one key, kvpool_get_into (gets/s)", per_sec[0], per_sec[1], "%.0f");
    s_row ("get 4KiB one key, p50 latency (us)", p50[0], p50[1], "%.1f");
    s_row ("get 4KiB one key, p99 latency (us)", p99[0], p99[1], "%.1f");
    //  CPU per unit of work: ms per GB for the batches, us per get for the single gets.
    static const char *cpu_names[W_COUNT][2] = {
        {"CPU per GB, get_batch_into: kvpoold (ms)", "CPU per GB, get_batch_into: client (ms)"},
        {"CPU per GB, get_batch zero-copy: kvpoold (ms)",
         "CPU per GB, get_batch zero-copy: client (ms)"},
        {"CPU per 4KiB get: kvpoold (us)", "CPU per 4KiB get: client (us)"}};
    bool coarse = false;
    for (int w = 0; w < W_COUNT; w++) {
        double scale = w == W_ONE ? 1e6 : 1e3 * 1e9; //  us per get, ms per GB
        double daemon[SIDE_COUNT], client[SIDE_COUNT];
        for (int s = 0; s < SIDE_COUNT; s++) {
            figures_t *f = &self->sides[s].figures[w];
            //  /proc counts a daemon's CPU in clock ticks (10 ms): too few to divide.
            daemon[s] = f->daemon_cpu >= CV_MIN_DAEMON_CPU ? f->daemon_cpu / f->units * scale : NAN;
            coarse = coarse || isnan (daemon[s]);
            client[s] = f->client_cpu / f->units * scale;
        }
        s_row (cpu_names[w][0], daemon[0], daemon[1], "%.1f");
        s_row (cpu_names[w][1], client[0], client[1], "%.1f");
    }
    if (coarse)
        printf ("  (nan: the kvpoold used under %.0f ms of CPU, too few of /proc's 10 ms ticks; "
                "longer runs: --time-ms)\n",
                CV_MIN_DAEMON_CPU * 1e3);
    printf ("curve get 1MiB batch32 tcp: plain %.3f GB/s, curve %.3f GB/s, ratio %.2f "
            "(zero-copy: %.3f, %.3f, ratio %.2f)\n",
            batch[0], batch[1], batch[1] / batch[0], zc[0], zc[1], zc[1] / zc[0]);
    printf ("curve get 4KiB single tcp: p50 plain %.1f us, curve %.1f us, ratio %.2f; p99 plain "
            "%.1f us, curve %.1f us, ratio %.2f\n",
            p50[0], p50[1], p50[1] / p50[0], p99[0], p99[1], p99[1] / p99[0]);
    char gets[32], single[32];
    bench_verdict ("curve", "CURVE against plain tcp: 1 MiB batched gets %s, 4 KiB gets %s",
                   bench_ratio (batch[1] / batch[0], gets, sizeof gets),
                   bench_ratio (p50[0] / p50[1], single, sizeof single));
    fflush (stdout);
}

//  ---- the section -------------------------------------------------------------------------

int
bench_curve_run (const char *kvpoold_path, bool quick, int reps, double rep_seconds)
{
    fprintf (stderr, "kvpool-bench: curve\n");
    if (reps > CV_MAX_REPS)
        reps = CV_MAX_REPS;
    curve_bench_t *self = (curve_bench_t *) calloc (1, sizeof *self);
    if (!self)
        return -1;
    int rc = 0;
    for (int j = 0; j < CV_BATCH; j++) {
        snprintf (self->large_keys[j], sizeof self->large_keys[j], "bench-curve/1MiB/%d", j);
        snprintf (self->small_keys[j], sizeof self->small_keys[j], "bench-curve/4KiB/%d", j);
        self->large[j] = self->large_keys[j];
        self->small[j] = self->small_keys[j];
        self->capacities[j] = CV_LARGE;
        self->src[j] = malloc (CV_LARGE);
        self->dst[j] = malloc (CV_LARGE);
        if (!self->src[j] || !self->dst[j])
            rc = -1;
        else
            memset (self->dst[j], 0, CV_LARGE); //  faulted in before any timing
    }
    char dir[256] = "", secret[512], server[512], client_secret[512], allow[512];
    if (rc == 0 && bench_scratch_new ("curve", dir, sizeof dir) != 0)
        rc = -1;
    if (rc == 0) {
        snprintf (secret, sizeof secret, "%s/node_secret", dir);
        snprintf (server, sizeof server, "%s/node", dir);
        snprintf (client_secret, sizeof client_secret, "%s/client_secret", dir);
        snprintf (allow, sizeof allow, "%s/allow", dir);
        rc = s_make_certificates (dir, self->why, sizeof self->why);
    }
    side_t *plain = &self->sides[SIDE_PLAIN], *curve = &self->sides[SIDE_CURVE];
    const char *plain_args[] = {"--segment-size", "256MiB", NULL};
    const char *curve_args[] = {
        "--segment-size", "256MiB", "--curve-secret", secret, "--curve-allow", allow, NULL};
    if (rc == 0 && bench_kvpoold_start (&plain->daemon, kvpoold_path, "curve-plain", plain_args))
        rc = -1;
    if (rc == 0 && bench_kvpoold_start (&curve->daemon, kvpoold_path, "curve-on", curve_args))
        rc = -1;
    if (rc == 0) {
        plain->client = s_connect (plain->daemon.endpoint, NULL, NULL, 5000);
        curve->client = s_connect (curve->daemon.endpoint, client_secret, server, 5000);
        if (!plain->client || !curve->client) {
            snprintf (self->why, sizeof self->why, "cannot connect to the %s kvpoold: %s",
                      plain->client ? "curve" : "plain", strerror (errno));
            rc = -1;
        }
    }
    for (int s = 0; rc == 0 && s < SIDE_COUNT; s++) {
        kvpool_t *client = self->sides[s].client;
        if (kvpool_fast_path (client)) {
            snprintf (self->why, sizeof self->why, "fast_path = 0 was ignored (%s)",
                      s_side_names[s]);
            rc = -1;
        }
        else
            rc = s_put_values (self, client);
    }
    //  The curve figures mean something only if that daemon admits nothing without CURVE.
    if (rc == 0) {
        kvpool_t *intruder = s_connect (curve->daemon.endpoint, NULL, NULL, 2000);
        if (intruder) {
            snprintf (self->why, sizeof self->why,
                      "the curve kvpoold admitted a client without CURVE");
            kvpool_destroy (&intruder);
            rc = -1;
        }
    }
    //  A warm-up of each workload on each side, then the repetitions: whichever side goes
    //  first alternates, so neither always follows the other's load.
    for (int w = 0; rc == 0 && w < W_COUNT; w++)
        for (int s = 0; rc == 0 && s < SIDE_COUNT; s++)
            rc = s_rep (self, &self->sides[s], w, quick ? 0.01 : 0.05, false);
    const char *failed_side = "";
    for (int r = 0; rc == 0 && r < reps; r++)
        for (int w = 0; rc == 0 && w < W_COUNT; w++)
            for (int k = 0; rc == 0 && k < SIDE_COUNT; k++) {
                int s = r % 2 == 0 ? k : SIDE_COUNT - 1 - k;
                rc = s_rep (self, &self->sides[s], w, rep_seconds, true);
                if (rc != 0)
                    failed_side = s_side_names[s];
            }
    if (rc == 0)
        s_report (self, reps, rep_seconds);
    else
        fprintf (stderr, "kvpool-bench: curve%s%s: %s\n", *failed_side ? ", " : "", failed_side,
                 self->why[0] ? self->why : "failed");

    for (int s = 0; s < SIDE_COUNT; s++) {
        side_t *side = &self->sides[s];
        if (side->client && kvpool_remove_all (side->client, true) < 0 && rc == 0) {
            fprintf (stderr, "kvpool-bench: curve: cleanup of the %s kvpoold failed\n",
                     s_side_names[s]);
            rc = -1;
        }
        kvpool_destroy (&side->client);
        if (bench_kvpoold_stop (&side->daemon, rc != 0) != 0)
            rc = -1;
        for (int w = 0; w < W_COUNT; w++)
            bench_series_free (&side->figures[w].latency);
    }
    if (dir[0])
        bench_scratch_remove ();
    for (int j = 0; j < CV_BATCH; j++) {
        free (self->src[j]);
        free (self->dst[j]);
    }
    free (self);
    return rc;
}
