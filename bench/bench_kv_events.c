/*  bench_kv_events.c - kvpool-bench's kv-events section: what publishing KV events costs puts.

    Two kvpoolds of its own: one without --kv-events-endpoint (nothing is spent on events),
    one with it and a subscriber attached (a SUB socket on a thread of its own, reading and
    counting every message and its events from the batch header). Each repetition puts `puts` fresh
   4 KiB values in batches of 64 over tcp (kvpool_put_batch) to one and then the other (interleaved,
   so load from other users hits both alike), then empties the pool untimed (kvpool_remove_all,
    forced). The medians and their ratio are printed, with the cost against the target (at
    most 5% at 100k puts/s), each daemon's CPU time per put (steadier than throughput when
    the machine is shared; the same work went to both), and whether the subscriber saw every
    event.

    Threads: the bench's, and the subscriber's, which shares only atomic counters and a
    stop flag with it.
*/
#include <czmq.h>
#include <kvpool.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

#include "bench/bench.h"

#define EV_VALUE 4096
#define EV_BATCH 64

typedef struct {
    char endpoint[64];
    atomic_bool stop;
    atomic_uint_fast64_t messages, events;
} subscriber_t;

//  The events in a batch payload: its array header after [0x93, 0xcb, 8 bytes of ts].
static uint64_t
s_event_count (const byte *data, size_t size)
{
    if (size < 11 || data[0] != 0x93 || data[1] != 0xcb)
        return 0;
    const byte *a = data + 10;
    if ((a[0] & 0xf0) == 0x90)
        return a[0] & 0x0f;
    if (a[0] == 0xdc && size >= 13)
        return ((uint64_t) a[1] << 8) | a[2];
    if (a[0] == 0xdd && size >= 15)
        return ((uint64_t) a[1] << 24) | ((uint64_t) a[2] << 16) | ((uint64_t) a[3] << 8) | a[4];
    return 0;
}

static void *
s_subscriber (void *args)
{
    subscriber_t *self = (subscriber_t *) args;
    zsock_t *sub = zsock_new_sub (self->endpoint, "");
    assert (sub);
    zsock_set_rcvtimeo (sub, 100);
    zsock_set_rcvhwm (sub, 0);
    while (!atomic_load (&self->stop)) {
        zmsg_t *msg = zmsg_recv (sub);
        if (!msg)
            continue;
        zframe_t *payload = zmsg_last (msg);
        if (zmsg_size (msg) == 3 && payload) {
            const byte *data = zframe_data (payload);
            size_t size = zframe_size (payload);
            atomic_fetch_add (&self->messages, 1);
            atomic_fetch_add (&self->events, s_event_count (data, size));
        }
        zmsg_destroy (&msg);
    }
    zsock_destroy (&sub);
    return NULL;
}

//  Puts `puts` fresh values through client; returns puts per second, or -1.
static double
s_put_rep (kvpool_t *client, int rep, uint64_t puts, char *const *values)
{
    char key_text[EV_BATCH][64];
    const char *keys[EV_BATCH];
    const void *data[EV_BATCH];
    size_t sizes[EV_BATCH];
    int statuses[EV_BATCH];
    for (int j = 0; j < EV_BATCH; j++) {
        keys[j] = key_text[j];
        data[j] = values[j];
        sizes[j] = EV_VALUE;
    }
    double start = bench_now ();
    for (uint64_t done = 0; done < puts; done += EV_BATCH) {
        for (int j = 0; j < EV_BATCH; j++)
            snprintf (key_text[j], sizeof key_text[j], "bench-ev-%d-%llu", rep,
                      (unsigned long long) (done + (uint64_t) j));
        int rc = kvpool_put_batch (client, EV_BATCH, keys, data, sizes, NULL, statuses);
        for (int j = 0; rc == KVPOOL_OK && j < EV_BATCH; j++)
            rc = statuses[j];
        if (rc != KVPOOL_OK) {
            fprintf (stderr, "kvpool-bench: kv-events: put failed: %d\n", rc);
            return -1;
        }
    }
    double rate = (double) puts / (bench_now () - start);
    if (kvpool_remove_all (client, true) < 0)
        return -1;
    return rate;
}

int
bench_kv_events_run (const char *kvpoold_path, bool quick)
{
    int reps = quick ? 2 : 7;
    uint64_t puts = quick ? 20 * EV_BATCH * 16 : 2000 * EV_BATCH; //  quick 20480, else 128000
    int port = bench_free_port ();
    if (port < 0)
        return -1;
    char pub[64];
    snprintf (pub, sizeof pub, "tcp://127.0.0.1:%d", port);
    const char *off_args[] = {"--segment-size", "1GiB", NULL};
    const char *on_args[] = {"--segment-size", "1GiB", "--kv-events-endpoint", pub, NULL};
    bench_kvpoold_t off = {0}, on = {0};
    if (bench_kvpoold_start (&off, kvpoold_path, "kvev-off", off_args) != 0)
        return -1;
    if (bench_kvpoold_start (&on, kvpoold_path, "kvev-on", on_args) != 0) {
        bench_kvpoold_stop (&off, false);
        return -1;
    }
    subscriber_t subscriber = {0};
    snprintf (subscriber.endpoint, sizeof subscriber.endpoint, "%s", pub);
    pthread_t thread;
    pthread_create (&thread, NULL, s_subscriber, &subscriber);
    bench_sleep_ms (200); //  the subscription reaches the PUB socket

    kvpool_t *client_off = kvpool_connect (off.endpoint, NULL);
    kvpool_t *client_on = kvpool_connect (on.endpoint, NULL);
    char *values[EV_BATCH];
    for (int j = 0; j < EV_BATCH; j++) {
        values[j] = (char *) malloc (EV_VALUE);
        bench_fill (values[j], EV_VALUE, (uint64_t) j);
    }
    double rate_off[16], rate_on[16];
    int rc = client_off && client_on ? 0 : -1;
    //  One untimed warm-up each, then the repetitions, interleaved.
    if (rc == 0
        && (s_put_rep (client_off, 100, EV_BATCH * 16, values) < 0
            || s_put_rep (client_on, 100, EV_BATCH * 16, values) < 0))
        rc = -1;
    //  The warm-up's events (its puts and its clear) have all come before the count starts.
    for (int wait = 0; wait < 100 && atomic_load (&subscriber.events) < EV_BATCH * 16 + 1; wait++)
        bench_sleep_ms (10);
    uint64_t events_before = atomic_load (&subscriber.events);
    double cpu_off = bench_cpu_seconds (off.pid), cpu_on = bench_cpu_seconds (on.pid);
    for (int r = 0; r < reps && rc == 0; r++) {
        //  Which goes first alternates, so neither always follows the other's load.
        if (r % 2 == 0) {
            rate_off[r] = s_put_rep (client_off, r, puts, values);
            rate_on[r] = s_put_rep (client_on, r, puts, values);
        }
        else {
            rate_on[r] = s_put_rep (client_on, r, puts, values);
            rate_off[r] = s_put_rep (client_off, r, puts, values);
        }
        if (rate_off[r] < 0 || rate_on[r] < 0)
            rc = -1;
    }
    //  The last batches reach the subscriber: a BlockStored per put, an AllBlocksCleared per
    //  repetition.
    uint64_t expected = (uint64_t) reps * (puts + 1);
    for (int wait = 0; wait < 50 && rc == 0; wait++) {
        if (atomic_load (&subscriber.events) - events_before >= expected)
            break;
        bench_sleep_ms (20);
    }
    cpu_off = bench_cpu_seconds (off.pid) - cpu_off;
    cpu_on = bench_cpu_seconds (on.pid) - cpu_on;
    atomic_store (&subscriber.stop, true);
    pthread_join (thread, NULL);
    if (rc == 0) {
        double off_median = bench_median (rate_off, reps);
        double on_median = bench_median (rate_on, reps);
        double ratio = on_median / off_median;
        uint64_t seen = atomic_load (&subscriber.events) - events_before;
        printf ("\nkv events: put throughput of 4 KiB values, batches of %d, over tcp "
                "(median of %d x %llu puts)\n",
                EV_BATCH, reps, (unsigned long long) puts);
        printf ("  %-40s %12.0f puts/s\n", "no --kv-events-endpoint", off_median);
        printf ("  %-40s %12.0f puts/s\n", "--kv-events-endpoint, subscriber attached", on_median);
        printf ("  ratio with/without %.3f: cost %.1f%%\n", ratio, (1 - ratio) * 100);
        bench_goal (ratio >= 0.95, "KV events cost at most 5%% of put throughput: %.1f%%",
                    (1 - ratio) * 100);
        bench_verdict ("kv-events",
                       "publishing every put's event costs %.1f%% of put "
                       "throughput",
                       (1 - ratio) * 100);
        //  Steadier than throughput on a busy machine: the daemons did the same work.
        double per_put_off = cpu_off / (double) (reps * puts) * 1e6;
        double per_put_on = cpu_on / (double) (reps * puts) * 1e6;
        printf ("  kvpoold CPU per put (all threads): %.2f us without, %.2f us with events "
                "(%+.1f%%)\n",
                per_put_off, per_put_on, (per_put_on / per_put_off - 1) * 100);
        printf ("  subscriber: %llu messages, %llu of %llu events (a BlockStored per put, an "
                "AllBlocksCleared per repetition)%s\n",
                (unsigned long long) atomic_load (&subscriber.messages), (unsigned long long) seen,
                (unsigned long long) expected,
                seen == expected ? "" : "  (some lost: the subscriber fell behind)");
    }
    for (int j = 0; j < EV_BATCH; j++)
        free (values[j]);
    kvpool_destroy (&client_off);
    kvpool_destroy (&client_on);
    bench_kvpoold_stop (&on, rc != 0);
    bench_kvpoold_stop (&off, rc != 0);
    return rc;
}
