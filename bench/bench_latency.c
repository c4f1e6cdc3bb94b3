/*  bench_latency.c - kvpool-bench's latency section (bench.h): single 4 KiB requests over tcp,
    against the loopback floor and, with --compare, against another build, all in one loop.

    On a shared virtual machine the latency of one round trip moves by 20-40% from one minute
    to the next, more than most changes to the node are worth. So the targets are not measured
    one after the other: one client goes round them, one request each in turn, and a burst of
    load from elsewhere hits all of them alike. The targets:
      floor   a bare libzmq ROUTER echoing 4 KiB (bench_echo_start), what one ZeroMQ round
              trip costs before kvpool does any work
      this    the kvpoold the bench runs (--kvpoold, or the one beside it)
      other   with --compare PATH, the kvpoold at PATH (the build before a change)
    and against each kvpoold, in each turn: PING, PUT of a fresh 4 KiB key, GET of it into a
    buffer (checked byte for byte), REMOVE of it (force). The table gives p50 and p99 of each,
    and p50 as a multiple of the floor's p50 and of the same kvpoold's PING.
*/
#include "bench/bench.h"

#include <kvpool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define LAT_VALUE 4096
#define LAT_TIMEOUT_MS 5000
#define LAT_OPS 4

typedef struct {
    const char *name;
    bench_kvpoold_t daemon;
    kvpool_t *client;
    bench_series_t ops[LAT_OPS]; //  ping, put, get, remove
} target_t;

static const char *const s_op_names[LAT_OPS] = {"ping", "put", "get", "remove"};

//  One turn against a kvpoold: ping, put, get (checked), remove. Returns 0 or -1.
static int
s_turn (target_t *target, uint64_t seed, char *value, char *back)
{
    char key[64];
    snprintf (key, sizeof key, "bench-latency-%llu", (unsigned long long) seed);
    bench_fill (value, LAT_VALUE, seed);
    double start = bench_now ();
    if (kvpool_ping (target->client) != KVPOOL_OK)
        return -1;
    double pinged = bench_now ();
    if (kvpool_put (target->client, key, value, LAT_VALUE, NULL) != KVPOOL_OK)
        return -1;
    double put = bench_now ();
    memset (back, 0, LAT_VALUE);
    if (kvpool_get_into (target->client, key, back, LAT_VALUE) != LAT_VALUE)
        return -1;
    double got = bench_now ();
    if (kvpool_remove (target->client, key, true) != KVPOOL_OK)
        return -1;
    double removed = bench_now ();
    if (!bench_holds (back, LAT_VALUE, seed)) {
        fprintf (stderr, "kvpool-bench: latency: %s returned wrong bytes for %s\n", target->name,
                 key);
        return -1;
    }
    bench_series_add (&target->ops[0], pinged - start);
    bench_series_add (&target->ops[1], put - pinged);
    bench_series_add (&target->ops[2], got - put);
    bench_series_add (&target->ops[3], removed - got);
    return 0;
}

static kvpool_t *
s_connect (const char *endpoint)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = LAT_TIMEOUT_MS;
    options.fast_path = 0;
    options.keep_endpoint = 1;
    return kvpool_connect (endpoint, &options);
}

int
bench_latency_run (const char *kvpoold_path, const char *compare_path, bool quick, int reps,
                   double rep_seconds)
{
    target_t targets[2] = {{.name = "this"}, {.name = "other"}};
    size_t ntargets = compare_path ? 2 : 1;
    const char *paths[2] = {kvpoold_path, compare_path};
    const char *args[] = {"--segment-size", "256MiB", NULL};
    bench_series_t floor = {0};
    int rc = 0;
    for (size_t t = 0; rc == 0 && t < ntargets; t++) {
        char name[32];
        snprintf (name, sizeof name, "latency-%s", targets[t].name);
        if (bench_kvpoold_start (&targets[t].daemon, paths[t], name, args) != 0)
            rc = -1;
        else if (!(targets[t].client = s_connect (targets[t].daemon.endpoint))) {
            fprintf (stderr, "kvpool-bench: latency: cannot connect to %s\n",
                     targets[t].daemon.endpoint);
            rc = -1;
        }
    }
    int port = bench_free_port ();
    pid_t echo = rc == 0 && port > 0 ? bench_echo_start (port) : -1;
    void *ctx = zmq_ctx_new ();
    void *dealer = zmq_socket (ctx, ZMQ_DEALER);
    int timeout = LAT_TIMEOUT_MS, linger = 0;
    zmq_setsockopt (dealer, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt (dealer, ZMQ_LINGER, &linger, sizeof linger);
    char endpoint[64];
    snprintf (endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    if (echo > 0)
        zmq_connect (dealer, endpoint);
    else if (rc == 0) {
        fprintf (stderr, "kvpool-bench: latency: cannot start the echo server\n");
        rc = -1;
    }
    char *value = (char *) malloc (LAT_VALUE), *back = (char *) malloc (LAT_VALUE);
    //  The first echo also waits for the child to bind (the DEALER reconnects until then).
    bool up = false;
    for (int tries = 0; rc == 0 && tries < 20 && !up; tries++)
        up = zmq_send (dealer, value, LAT_VALUE, 0) == LAT_VALUE
             && zmq_recv (dealer, back, LAT_VALUE, 0) == LAT_VALUE;
    if (rc == 0 && !up) {
        fprintf (stderr, "kvpool-bench: latency: no echo from %s\n", endpoint);
        rc = -1;
    }
    uint64_t seed = 0;
    if (quick)
        reps = reps < 1 ? 1 : reps;
    for (int rep = 0; rc == 0 && rep < reps; rep++) {
        double end = bench_now () + rep_seconds;
        for (size_t turn = 0; rc == 0 && bench_now () < end; turn++)
            //  Each target leads in turn, so none always runs right after the floor.
            for (size_t k = 0; rc == 0 && k <= ntargets; k++) {
                size_t which = (turn + k) % (ntargets + 1);
                if (which == ntargets) {
                    double start = bench_now ();
                    if (zmq_send (dealer, value, LAT_VALUE, 0) != LAT_VALUE
                        || zmq_recv (dealer, back, LAT_VALUE, 0) != LAT_VALUE)
                        rc = -1;
                    else
                        bench_series_add (&floor, bench_now () - start);
                }
                else if (s_turn (&targets[which], ++seed, value, back) != 0) {
                    fprintf (stderr, "kvpool-bench: latency: a call to %s failed: %s\n",
                             targets[which].name, kvpool_last_error (targets[which].client));
                    rc = -1;
                }
            }
    }
    if (rc == 0 && floor.count) {
        double floor_p50 = bench_series_us (&floor, 0.5);
        printf ("\n== latency: single 4 KiB requests over tcp loopback, the targets in turn in "
                "one loop (%d x %.0f ms; %zu turns) ==\n",
                reps, rep_seconds * 1e3, floor.count);
        printf ("%-24s %-7s %9s %9s %9s %9s\n", "target", "op", "p50 us", "p99 us", "x floor",
                "x ping");
        printf ("%-24s %-7s %9.1f %9.1f %9s %9s\n", "floor (libzmq echo)", "echo", floor_p50,
                bench_series_us (&floor, 0.99), "1.00", "-");
        for (size_t t = 0; t < ntargets; t++) {
            double ping = bench_series_us (&targets[t].ops[0], 0.5);
            for (int op = 0; op < LAT_OPS; op++) {
                double p50 = bench_series_us (&targets[t].ops[op], 0.5);
                printf ("%-24s %-7s %9.1f %9.1f %9.2f %9.2f\n",
                        t == 0 ? "kvpoold (this)" : "kvpoold (--compare)", s_op_names[op], p50,
                        bench_series_us (&targets[t].ops[op], 0.99), p50 / floor_p50, p50 / ping);
            }
        }
        char against[160] = "";
        if (ntargets == 2)
            for (int op = 0; op < LAT_OPS; op++) {
                //  As a speed: the --compare build's p50 over this one's.
                double speed = bench_series_us (&targets[1].ops[op], 0.5)
                               / bench_series_us (&targets[0].ops[op], 0.5);
                char ratio[32];
                printf ("%s p50: this build against --compare: %s\n", s_op_names[op],
                        bench_ratio (speed, ratio, sizeof ratio));
                size_t used = strlen (against);
                snprintf (against + used, sizeof against - used, "%s%s %s",
                          op ? ", " : "; against --compare: ", s_op_names[op], ratio);
            }
        double put = bench_series_us (&targets[0].ops[1], 0.5) / floor_p50;
        double get = bench_series_us (&targets[0].ops[2], 0.5) / floor_p50;
        bench_goal (put <= 1.3, "4 KiB put p50 <= 1.3x floor: %.2fx", put);
        bench_goal (get <= 1.1, "4 KiB get p50 <= 1.1x floor: %.2fx", get);
        bench_verdict ("latency",
                       "4 KiB over tcp, p50: put %.2fx and get %.2fx of a bare libzmq echo (%.0f "
                       "us)%s",
                       put, get, floor_p50, against);
    }
    free (value);
    free (back);
    zmq_close (dealer);
    zmq_ctx_term (ctx);
    if (echo > 0)
        bench_stop (echo);
    for (size_t t = 0; t < ntargets; t++) {
        kvpool_destroy (&targets[t].client);
        if (targets[t].daemon.pid && bench_kvpoold_stop (&targets[t].daemon, false) != 0)
            rc = -1;
        for (int op = 0; op < LAT_OPS; op++)
            bench_series_free (&targets[t].ops[op]);
    }
    bench_series_free (&floor);
    return rc;
}
