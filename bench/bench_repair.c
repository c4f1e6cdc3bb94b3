/*  bench_repair.c - the repair section of kvpool-bench (see bench.h): how fast a cluster
    restores the replicas a dead node took with it (issue 33: at no less than half the
    node-to-node bandwidth measured in the same run).

    A master (--node-ttl 1000) and three nodes A, B and C (--host-id each, so every byte
    between them crosses loopback tcp, as between machines; --repair-rate 64GiB, so that the
    figure is the repair path's own, not the limit's). Through A (libkvpool over tcp, fast
    path off), 1 MiB values with two replicas each, preferred on B and C: each is held by B
    and C. Then:

      node-to-node   kvpool_get_batch_into through A of values held by B (32 a batch): A
                     reads them from B's data plane, as `kvpool-bench --cluster`'s
                     "get, remote" row does; the median of reps repetitions
      repair         C is killed (SIGKILL). The master declares it dead after the TTL and
                     queues every object (each lacks a replica now); A, the one node that
                     holds none, copies them from B. The rate: the bytes A's STATS
                     repair_bytes counts, over the time from when NODES lists C dead to
                     when repair_bytes reaches them all (polled every 5 ms)

    and prints the repair rate next to the node-to-node bandwidth, as a ratio (goal >= 0.5).
    Checks: every put and get status; after the repair, LOCATE of every key names A and B
    (two live replicas), and a sample of values read back through A compares byte for byte.

    Size: 256 MiB by default (quick: 64 MiB); --repair-big: 1 GiB, the figure.
*/
#include "bench/bench.h"
#include "kvpool.h"

#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1ULL << 20)
#define VALUE (1 * MiB)
#define BATCH 32
#define TARGET_RATIO 0.5
#define NODES 3

static const char *s_hosts[NODES] = {"repair-hA", "repair-hB", "repair-hC"};
static const char *s_ids[NODES] = {"repair-a", "repair-b", "repair-c"};

typedef struct {
    bench_kvpoold_t master, node[NODES];
    kvpool_t *client; //  A's
    size_t count;     //  values
    char (*keys)[64];
    int errors;
} repair_t;

static void __attribute__ ((format (printf, 2, 3))) s_fail (repair_t *self, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    fprintf (stderr, "kvpool-bench: repair: ");
    vfprintf (stderr, format, args);
    fprintf (stderr, "\n");
    va_end (args);
    self->errors++;
}

static int
s_start (repair_t *self, const char *path, const char *segment_size)
{
    const char *master_args[] = {"--role",     "master", "--master", "tcp://127.0.0.1:*",
                                 "--node-ttl", "1000",   NULL};
    if (bench_kvpoold_start (&self->master, path, "repair-master", master_args))
        return -1;
    for (int n = 0; n < NODES; n++) {
        const char *args[] = {"--role",
                              "node",
                              "--master",
                              self->master.endpoint,
                              "--host-id",
                              s_hosts[n],
                              "--node-id",
                              s_ids[n],
                              "--segment-size",
                              segment_size,
                              "--heartbeat-interval",
                              "200",
                              "--repair-rate",
                              "64GiB",
                              "--hot-cache-size",
                              "0",
                              NULL};
        char name[32];
        snprintf (name, sizeof name, "repair-node%d", n);
        if (bench_kvpoold_start (&self->node[n], path, name, args))
            return -1;
    }
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = 60000;
    options.fast_path = 0;
    options.keep_endpoint = 1;
    if (!(self->client = kvpool_connect (self->node[0].endpoint, &options)))
        return -1;
    double deadline = bench_now () + 15;
    kvpool_node_t nodes[8];
    for (;;) {
        int count = kvpool_nodes (self->client, nodes, 8), alive = 0;
        for (int i = 0; i < count && i < 8; i++)
            alive += nodes[i].alive && nodes[i].capacity > 0;
        if (alive == NODES)
            return 0;
        if (bench_now () > deadline) {
            s_fail (self, "the master does not list the three nodes alive within 15 s");
            return -1;
        }
        bench_sleep_ms (50);
    }
}

static void
s_stop (repair_t *self)
{
    kvpool_destroy (&self->client);
    bool keep = self->errors > 0;
    for (int n = 0; n < NODES; n++)
        if (self->node[n].pid > 0 && bench_kvpoold_stop (&self->node[n], keep) != 0)
            self->errors++;
    if (self->master.pid > 0 && bench_kvpoold_stop (&self->master, keep) != 0)
        self->errors++;
}

//  Puts every value through A, two replicas, preferred on B and C.
static int
s_put_all (repair_t *self, void **buffers)
{
    const char *preferred[2] = {s_ids[1], s_ids[2]};
    kvpool_put_options_t opts = {
        .replica_num = 2, .preferred_segments = preferred, .preferred_segment_count = 2};
    for (size_t first = 0; first < self->count; first += BATCH) {
        size_t n = self->count - first < BATCH ? self->count - first : BATCH;
        const char *keys[BATCH];
        const void *data[BATCH];
        size_t sizes[BATCH];
        int statuses[BATCH];
        uint32_t placed[BATCH];
        for (size_t i = 0; i < n; i++) {
            keys[i] = self->keys[first + i];
            bench_fill (buffers[i], VALUE, first + i);
            data[i] = buffers[i];
            sizes[i] = VALUE;
        }
        int rc =
            kvpool_put_batch_placed (self->client, n, keys, data, sizes, &opts, statuses, placed);
        for (size_t i = 0; i < n && rc == KVPOOL_OK; i++)
            if (statuses[i] != KVPOOL_OK || placed[i] != 2)
                rc = statuses[i] != KVPOOL_OK ? statuses[i] : KVPOOL_INTERNAL_ERROR;
        if (rc != KVPOOL_OK) {
            s_fail (self, "put of %s: %s (%s)", keys[0], kvpool_strerror (rc),
                    kvpool_last_error (self->client));
            return -1;
        }
    }
    return 0;
}

//  Node-to-node: gets through A of values B holds, bytes a second (the median of reps).
static double
s_node_to_node (repair_t *self, void **buffers, int reps, double rep_seconds)
{
    double rates[32];
    int done = 0;
    size_t capacities[BATCH];
    for (int i = 0; i < BATCH; i++)
        capacities[i] = VALUE;
    for (int rep = 0; rep < reps && rep < 32; rep++) {
        double start = bench_now (), elapsed = 0;
        uint64_t bytes = 0;
        size_t next = 0;
        while (elapsed < rep_seconds || bytes == 0) {
            const char *keys[BATCH];
            int64_t results[BATCH];
            for (int i = 0; i < BATCH; i++)
                keys[i] = self->keys[(next + (size_t) i) % self->count];
            int rc =
                kvpool_get_batch_into (self->client, BATCH, keys, buffers, capacities, results);
            for (int i = 0; i < BATCH && rc == KVPOOL_OK; i++)
                if (results[i] != (int64_t) VALUE)
                    rc = results[i] < 0 ? (int) results[i] : KVPOOL_INTERNAL_ERROR;
            if (rc != KVPOOL_OK) {
                s_fail (self, "get through A: %s", kvpool_strerror (rc));
                return 0;
            }
            if (rep == 0 && next == 0 && !bench_holds (buffers[1], VALUE, 1)) {
                s_fail (self, "get through A: a value differs from what was put");
                return 0;
            }
            bytes += BATCH * VALUE;
            next += BATCH;
            elapsed = bench_now () - start;
        }
        rates[done++] = (double) bytes / elapsed;
    }
    return bench_median (rates, done);
}

static uint64_t
s_repair_bytes (repair_t *self)
{
    kvpool_stats_t stats;
    return kvpool_stats (self->client, &stats) == KVPOOL_OK ? stats.repair_bytes : 0;
}

//  After the repair: every key on A and B, a sample read back right through A.
static void
s_check (repair_t *self, void **buffers)
{
    kvpool_node_t nodes[8];
    for (size_t k = 0; k < self->count; k++) {
        int count = kvpool_locate (self->client, self->keys[k], NULL, nodes, 8);
        int a = 0, b = 0;
        for (int i = 0; i < count && i < 8; i++) {
            a += nodes[i].alive && !strcmp (nodes[i].node_id, s_ids[0]);
            b += nodes[i].alive && !strcmp (nodes[i].node_id, s_ids[1]);
        }
        if (!a || !b) {
            s_fail (self, "after the repair %s is not held by A and B (%d holders)", self->keys[k],
                    count);
            return;
        }
    }
    size_t capacities[1] = {VALUE};
    for (size_t k = 0; k < self->count; k += self->count / 16 + 1) {
        const char *keys[1] = {self->keys[k]};
        int64_t result;
        if (kvpool_get_batch_into (self->client, 1, keys, buffers, capacities, &result) != KVPOOL_OK
            || result != (int64_t) VALUE || !bench_holds (buffers[0], VALUE, k))
            s_fail (self, "after the repair %s does not read back right", self->keys[k]);
    }
}

int
bench_repair_run (const char *kvpoold_path, bool quick, bool big, int reps, double rep_seconds)
{
    repair_t *self = (repair_t *) calloc (1, sizeof (repair_t));
    uint64_t total = big ? 1024 * MiB : quick ? 64 * MiB : 256 * MiB;
    self->count = total / VALUE;
    self->keys = calloc (self->count, sizeof *self->keys);
    void *buffers[BATCH] = {NULL};
    for (int i = 0; i < BATCH; i++)
        buffers[i] = malloc (VALUE);
    for (size_t k = 0; k < self->count; k++)
        snprintf (self->keys[k], sizeof self->keys[k], "bench-repair-%zu", k);
    char segment_size[32];
    snprintf (segment_size, sizeof segment_size, "%lluMiB",
              (unsigned long long) ((total + 128 * MiB) / MiB));
    printf ("\n## repair: a node's replicas restored (%zu values of 1 MiB, 2 replicas, on B "
            "and C; C killed; A copies from B)\n",
            self->count);
    double link = 0, rate = 0, detect = 0, whole = 0;
    if (s_start (self, kvpoold_path, segment_size) == 0 && s_put_all (self, buffers) == 0) {
        link = s_node_to_node (self, buffers, quick ? 1 : reps, quick ? 0.5 : rep_seconds);
        uint64_t before = s_repair_bytes (self);
        double killed = bench_now ();
        kill (self->node[2].pid, SIGKILL);
        bench_wait (self->node[2].pid);
        self->node[2].pid = 0;
        //  From the moment the master lists C dead (it queues the work then) to the last copy.
        double dead = 0, last = 0, deadline = killed + 120;
        uint64_t bytes = 0;
        kvpool_node_t nodes[8];
        while (bytes < total && bench_now () < deadline && !self->errors) {
            if (!dead) {
                int count = kvpool_nodes (self->client, nodes, 8);
                for (int i = 0; i < count && i < 8; i++)
                    if (!strcmp (nodes[i].node_id, s_ids[2]) && !nodes[i].alive)
                        dead = bench_now ();
            }
            bytes = s_repair_bytes (self) - before;
            if (bytes && !dead)
                dead = bench_now (); //  (copies began before this poll saw C dead)
            if (bytes >= total)
                last = bench_now ();
            else
                bench_sleep_ms (5);
        }
        if (!last)
            s_fail (self, "%" PRIu64 " of %" PRIu64 " bytes repaired within 120 s", bytes, total);
        else {
            rate = last > dead ? (double) bytes / (last - dead) : 0;
            detect = dead - killed;
            whole = last - killed;
            s_check (self, buffers);
        }
    }
    else if (!self->errors)
        s_fail (self, "the cluster did not start");
    s_stop (self);
    if (!self->errors) {
        printf ("| what | figure |\n|---|---|\n");
        printf ("| node-to-node (remote get through A of values on B, 1 MiB, batch 32) | %.3f "
                "GB/s |\n",
                link / 1e9);
        printf ("| repair (A copies from B: from C declared dead to the last copy) | %.3f GB/s |\n",
                rate / 1e9);
        printf ("| kill to C declared dead (node TTL 1 s) | %.2f s |\n", detect);
        printf ("| kill to every replica restored | %.2f s |\n", whole);
        bench_goal (rate / link >= TARGET_RATIO,
                    "repair of %zu MiB of 1 MiB values: %.2f of the node-to-node bandwidth (goal "
                    ">= %.2f; %.3f GB/s against %.3f GB/s)",
                    self->count, rate / link, TARGET_RATIO, rate / 1e9, link / 1e9);
        bench_verdict ("repair",
                       "lost replicas restored at %.2f of node-to-node bandwidth (%zu MiB in "
                       "%.2f s after the kill)",
                       rate / link, self->count, whole);
    }
    for (int i = 0; i < BATCH; i++)
        free (buffers[i]);
    free (self->keys);
    int errors = self->errors;
    free (self);
    return errors ? -1 : 0;
}
