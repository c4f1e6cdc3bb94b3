/*  bench_hotcache.c - the hotcache section of kvpool-bench (see bench.h): what the host hot
    cache (DESIGN §11, issue #32 item 8) saves the clients of a node that read values other
    nodes hold.

    Two arms, each a cluster of its own, one started after the other is stopped (so they
    share neither memory nor CPU): a master (--placement local-first) and three nodes.
    Node A is the readers' node and keeps the machine's real host id, so that clients here
    take the same-machine shared-memory path with it (a cache copy is then read like a local
    replica); nodes B and C get fake --host-ids and hold every value, written through them
    (replica 1, local-first: key i through B when i is even, through C when odd), so node A
    holds none. The arms differ in one setting, node A's --hot-cache-size: 0 (off) and a
    quarter of all the values' bytes (on; admission after --hot-cache-admit reads, default
    2). Same keys, same values, same seeds, same Zipf sequences in both.

    For each value size (256 KiB, then 1 MiB) 8 reader processes (forked, each with its own
    libkvpool connection to node A, fast path on) read keys drawn from Zipf(s = 1.0) over the
    size's keys, one key a kvpool_get_into into the reader's own buffer:

      warm-up   each reader's first draws (half as many as the timed pass), untimed, so that
                admission has happened before the timed pass
      timed     the next draws: every get's latency kept (shared memory), p50 and p99 over
                all readers' gets, throughput = all gets over the pass's wall time (from the
                common start to the last reader's end)
      steady    after one idle second (node A's background master requests: heartbeats),
                each reader rereads the 32 hottest keys four times: master requests per
                repeated remote get, less what the idle second says is background

    Node A's STATS before and after each pass give the hit rate (hot_cache_hits / (hits +
    misses)), master requests per get (master_requests / gets issued) and the cache's memory
    (hot_cache_bytes after the timed pass). A reader opens its connection at the start of a
    pass (before the common start) and closes it at the end: kvpool_destroy waits for the
    TOUCH that reports its same-machine reads, so the node's counters hold every get of the
    pass when the parent reads them.

    Zipf: a CDF precomputed per size, a draw is a binary search of a uniform number from
    splitmix64 (bench_mix) of the reader's stream and the draw's index: deterministic.
    Values: key i of size s holds bench_fill's pattern of seed (s, i); every read checks its
    first and last 8 bytes (poisoned before the call), every byte with --hotcache-verify. A
    wrong byte, a failed call or a reader that dies fails the section. So do a value found on
    node A after the fill, and, in the off arm, any object node A holds at the end.

    Scale: the issue asks for 20000 keys of each size; that is 25 GiB of values, so the
    default is 2000 keys of 256 KiB and 1000 of 1 MiB (about 1.5 GiB held, 3 GiB of segments
    an arm), --quick a tenth of that, --hotcache-keys N and --hotcache-reads N set them.

    Until node A has a cache, both arms behave as off: the hit rate reads "-" (the counters
    are 0) and the goals are reported not met.

    Threads: the bench's main thread; the readers are processes of their own, forked before
    this process opens a connection of its own: libkvpool keeps one ZeroMQ context a process
    (from the first connection to the last), and a child must not use its parent's. So no
    other section may leave a connection open when this one starts.
*/
#include "bench/bench.h"
#include "kvpool.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB ((uint64_t) 1 << 20)
#define READERS 8
#define KEY_MAX 64
#define FILL_BATCH 16
#define RPC_TIMEOUT_MS 60000
#define PASS_TIMEOUT_S 900 //  a pass that takes longer has a stuck reader
#define ZIPF_S 1.0
#define STEADY_HEAD 32 //  the hottest keys the steady pass rereads
#define STEADY_ROUNDS 4
#define IDLE_MS 1000 //  the idle window that measures background master requests

//  The goals (issue #32): at a hit rate of 30% or more, get p50 at least 40% lower and
//  throughput at least 1.5x with the cache on; no master request for a repeated remote get.
#define GOAL_HIT_RATE 0.30
#define GOAL_P50 0.60
#define GOAL_RATE 1.5

#define SIZE_COUNT 2
static const size_t s_sizes[SIZE_COUNT] = {256 << 10, 1 << 20};
static const char *s_size_names[SIZE_COUNT] = {"256KiB", "1MiB"};
//  Default keys and timed reads a reader, per size, and the --quick ones.
static const size_t s_keys_default[SIZE_COUNT] = {2000, 1000};
static const size_t s_reads_default[SIZE_COUNT] = {2000, 1000};
static const size_t s_keys_quick[SIZE_COUNT] = {200, 100};
static const size_t s_reads_quick[SIZE_COUNT] = {200, 100};

enum { ARM_OFF, ARM_ON, ARM_COUNT };
static const char *s_arm_names[ARM_COUNT] = {"off", "on"};

enum { NODE_A, NODE_B, NODE_C, NODE_COUNT };
static const char *s_node_ids[NODE_COUNT] = {"bench-hc-a", "bench-hc-b", "bench-hc-c"};
static const char *s_host_ids[NODE_COUNT] = {NULL, "bench-hc-host-b", "bench-hc-host-c"};
static const char *s_node_names[NODE_COUNT] = {"hotcache-a", "hotcache-b", "hotcache-c"};

typedef enum { PASS_WARM, PASS_TIMED, PASS_STEADY, PASS_QUIT } pass_t;
static const char *s_pass_names[] = {"warm-up", "timed", "steady", "quit"};

//  What the parent tells a reader (one write on its pipe, under PIPE_BUF: atomic).
typedef struct {
    int pass; //  pass_t
    int size; //  index into s_sizes
} command_t;

//  What a reader leaves in shared memory for the parent.
typedef struct {
    double start, end; //  of its last pass (bench_now: the monotonic clock, shared)
    uint64_t gets;     //  gets done in its last pass
    int errors;
    bool fast_path;  //  its connection took the same-machine path
    char error[256]; //  the first error
} reader_slot_t;

//  One arm's figures for one value size.
typedef struct {
    bool done;
    uint64_t gets;
    double wall, p50_us, p99_us;
    kvpool_stats_t before, after; //  node A around the timed pass
    bool steady_done;
    uint64_t steady_gets, steady_requests, idle_requests;
    double steady_seconds;
} result_t;

typedef struct {
    const char *kvpoold_path;
    bool quick, full_verify;
    size_t keys[SIZE_COUNT];
    size_t reads[SIZE_COUNT]; //  timed gets a reader
    size_t warm[SIZE_COUNT];  //  untimed gets a reader before them
    uint64_t cache_size;      //  node A's --hot-cache-size in the on arm
    uint64_t segment_a, segment_holder;
    double *cdf[SIZE_COUNT]; //  Zipf: cdf[s][r] = P(rank <= r)

    bench_kvpoold_t master, node[NODE_COUNT];
    kvpool_t *client[NODE_COUNT]; //  tcp, fast path off: the fill (B, C) and STATS (A)
    pid_t readers[READERS];
    int command[READERS]; //  write ends of the readers' command pipes
    int done;             //  read end of the pipe every reader answers on
    reader_slot_t *slots; //  shared with the readers
    double *latency;      //  shared: READERS x latency_cap seconds
    size_t latency_cap;
    size_t shared_size;
    bool fast_path_seen[ARM_COUNT], fast_path_missing[ARM_COUNT];

    result_t result[ARM_COUNT][SIZE_COUNT];
    int errors;
} hotcache_t;

static void
s_fail (hotcache_t *self, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    fprintf (stderr, "kvpool-bench: hotcache: ");
    vfprintf (stderr, format, args);
    fprintf (stderr, "\n");
    va_end (args);
    self->errors++;
}

static uint64_t
s_round_up (uint64_t value, uint64_t unit)
{
    return (value + unit - 1) / unit * unit;
}

//  ---- keys, values, Zipf ----------------------------------------------------------------

static void
s_key (char *key, int size, size_t index)
{
    snprintf (key, KEY_MAX, "hotcache-%s-%06zu", s_size_names[size], index);
}

static uint64_t
s_seed (int size, size_t index)
{
    return (5ULL << 40) + ((uint64_t) size << 32) + index;
}

//  Word i of the value of seed (bench_fill's pattern).
static uint64_t
s_word (uint64_t seed, size_t i)
{
    return bench_mix (seed) ^ (i * 0x100000001B3ULL);
}

static double *
s_zipf_cdf (size_t n)
{
    double *cdf = (double *) malloc (n * sizeof *cdf);
    if (!cdf)
        return NULL;
    double sum = 0;
    for (size_t r = 0; r < n; r++)
        cdf[r] = sum += 1.0 / pow ((double) (r + 1), ZIPF_S);
    for (size_t r = 0; r < n; r++)
        cdf[r] /= sum;
    cdf[n - 1] = 1.0;
    return cdf;
}

//  Draw number draw of reader's stream for size: a rank (0 the hottest), which is also the
//  key's index. The same in both arms.
static size_t
s_zipf_draw (const hotcache_t *self, int size, int reader, uint64_t draw)
{
    uint64_t stream = bench_mix (((uint64_t) size << 16) | (uint64_t) reader);
    double u = (double) (bench_mix (stream + draw) >> 11) * 0x1.0p-53;
    const double *cdf = self->cdf[size];
    size_t low = 0, high = self->keys[size] - 1;
    while (low < high) { //  the first rank whose cdf exceeds u
        size_t mid = low + (high - low) / 2;
        if (cdf[mid] > u)
            high = mid;
        else
            low = mid + 1;
    }
    return low;
}

//  ---- the readers -----------------------------------------------------------------------

#define POISON 0xDEADBEEFDEADBEEFULL

//  One get into buffer, checked. Returns its latency in seconds, or -1 (the reason in slot).
static double
s_reader_get (const hotcache_t *self, kvpool_t *client, reader_slot_t *slot, int size, size_t index,
              uint8_t *buffer)
{
    size_t bytes = s_sizes[size];
    size_t last = bytes / 8 - 1;
    uint64_t *words = (uint64_t *) buffer;
    char key[KEY_MAX];
    s_key (key, size, index);
    words[0] = words[last] = POISON;
    double start = bench_now ();
    int64_t got = kvpool_get_into (client, key, buffer, bytes);
    double elapsed = bench_now () - start;
    uint64_t seed = s_seed (size, index);
    const char *wrong = NULL;
    if (got != (int64_t) bytes)
        wrong = got < 0 ? kvpool_status_name ((int) got) : "a value of the wrong size";
    else if (words[0] != s_word (seed, 0) || words[last] != s_word (seed, last))
        wrong = "its first or last 8 bytes differ from what was put";
    else if (self->full_verify && !bench_holds (buffer, bytes, seed))
        wrong = "its bytes differ from what was put";
    if (!wrong)
        return elapsed;
    if (!slot->errors++)
        snprintf (slot->error, sizeof slot->error, "kvpool_get_into %s: %s%s%s", key, wrong,
                  got < 0 ? ": " : "", got < 0 ? kvpool_last_error (client) : "");
    return -1;
}

static void
s_reader_pass (const hotcache_t *self, int reader, reader_slot_t *slot, const command_t *command,
               int command_fd, int done_fd, uint8_t *buffer)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = RPC_TIMEOUT_MS;
    options.connect_timeout_ms = 10000;
    //  fast_path and keep_endpoint as an application has them: node A is on this machine,
    //  so the connection moves to its ipc endpoint and maps its segments.
    kvpool_t *client = kvpool_connect (self->node[NODE_A].endpoint, &options);
    slot->gets = 0;
    if (!client) {
        if (!slot->errors++)
            snprintf (slot->error, sizeof slot->error, "cannot connect to node A (%.64s): %.160s",
                      self->node[NODE_A].endpoint, kvpool_connect_error ());
    }
    else
        slot->fast_path = kvpool_fast_path (client);
    //  Ready; then the common start.
    char byte = 'r';
    if (write (done_fd, &byte, 1) != 1 || read (command_fd, &byte, 1) != 1)
        _exit (3);
    int size = command->size;
    double *latency = self->latency + (size_t) reader * self->latency_cap;
    slot->start = bench_now ();
    for (uint64_t i = 0; client && slot->errors == 0; i++) {
        size_t index;
        if (command->pass == PASS_WARM && i < self->warm[size])
            index = s_zipf_draw (self, size, reader, i);
        else if (command->pass == PASS_TIMED && i < self->reads[size])
            index = s_zipf_draw (self, size, reader, self->warm[size] + i);
        else if (command->pass == PASS_STEADY && i < (uint64_t) STEADY_HEAD * STEADY_ROUNDS) {
            size_t head = self->keys[size] < STEADY_HEAD ? self->keys[size] : STEADY_HEAD;
            index = (i + (uint64_t) reader) % head;
        }
        else
            break;
        double elapsed = s_reader_get (self, client, slot, size, index, buffer);
        if (elapsed < 0)
            break;
        if (command->pass == PASS_TIMED)
            latency[i] = elapsed;
        slot->gets++;
    }
    slot->end = bench_now ();
    //  Closing waits for the TOUCH that reports this pass's same-machine reads, so node A's
    //  STATS count them all once the parent hears 'd'.
    kvpool_destroy (&client);
    byte = 'd';
    if (write (done_fd, &byte, 1) != 1)
        _exit (3);
}

//  A reader process: passes as the parent commands them, until PASS_QUIT or the end of its
//  pipe. Never returns.
static void
s_reader (hotcache_t *self, int reader, int command_fd, int done_fd)
{
    //  Not the bench's handler: it would stop the bench's kvpoolds from here.
    signal (SIGINT, SIG_DFL);
    signal (SIGTERM, SIG_DFL);
    prctl (PR_SET_PDEATHSIG, SIGKILL);
    if (getppid () == 1)
        _exit (3);
    reader_slot_t *slot = &self->slots[reader];
    uint8_t *buffer = (uint8_t *) mmap (NULL, s_sizes[SIZE_COUNT - 1], PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (buffer == MAP_FAILED) {
        snprintf (slot->error, sizeof slot->error, "out of memory for its buffer");
        slot->errors++;
        buffer = NULL;
    }
    command_t command;
    while (read (command_fd, &command, sizeof command) == (ssize_t) sizeof command
           && command.pass != PASS_QUIT) {
        if (buffer)
            s_reader_pass (self, reader, slot, &command, command_fd, done_fd, buffer);
        else {
            char byte = 'r';
            if (write (done_fd, &byte, 1) != 1 || read (command_fd, &byte, 1) != 1)
                _exit (3);
            byte = 'd';
            if (write (done_fd, &byte, 1) != 1)
                _exit (3);
        }
    }
    _exit (0);
}

static int
s_readers_start (hotcache_t *self)
{
    int done[2];
    if (pipe (done)) {
        s_fail (self, "pipe: %s", strerror (errno));
        return -1;
    }
    self->done = done[0];
    memset (self->slots, 0, READERS * sizeof *self->slots);
    fflush (stdout);
    fflush (stderr);
    for (int r = 0; r < READERS; r++) {
        int command[2];
        if (pipe (command)) {
            s_fail (self, "pipe: %s", strerror (errno));
            close (done[1]);
            return -1;
        }
        pid_t pid = fork ();
        if (pid == 0) {
            close (command[1]);
            close (done[0]);
            for (int other = 0; other < r; other++)
                close (self->command[other]);
            s_reader (self, r, command[0], done[1]);
        }
        close (command[0]);
        if (pid < 0) {
            close (command[1]);
            close (done[1]);
            s_fail (self, "fork: %s", strerror (errno));
            return -1;
        }
        self->readers[r] = pid;
        self->command[r] = command[1];
    }
    close (done[1]); //  the readers hold the write ends: a reader that dies is seen
    return 0;
}

//  Waits for one byte from each of the readers. Returns 0, or -1 if one died or it took too
//  long.
static int
s_readers_hear (hotcache_t *self, const char *what)
{
    double deadline = bench_now () + PASS_TIMEOUT_S;
    for (int heard = 0; heard < READERS;) {
        struct pollfd item = {self->done, POLLIN, 0};
        int rc = poll (&item, 1, 1000);
        if (rc > 0) {
            char bytes[READERS];
            ssize_t got = read (self->done, bytes, (size_t) (READERS - heard));
            if (got <= 0) {
                s_fail (self, "%s: the readers are gone", what);
                return -1;
            }
            heard += (int) got;
            continue;
        }
        if (rc < 0 && errno != EINTR) {
            s_fail (self, "poll: %s", strerror (errno));
            return -1;
        }
        for (int r = 0; r < READERS; r++)
            if (self->readers[r] > 0 && bench_exited (self->readers[r])) {
                s_fail (self, "%s: reader %d exited", what, r + 1);
                self->readers[r] = 0;
                return -1;
            }
        if (bench_now () > deadline) {
            s_fail (self, "%s: the readers did not finish within %d s", what, PASS_TIMEOUT_S);
            return -1;
        }
    }
    return 0;
}

//  One pass of every reader: connect, the common start, the gets, close. Returns 0 or -1
//  (a reader's error is a failure of the section).
static int
s_pass (hotcache_t *self, pass_t pass, int size)
{
    char what[64];
    snprintf (what, sizeof what, "%s pass, %s", s_pass_names[pass], s_size_names[size]);
    fprintf (stderr, "kvpool-bench: hotcache: %s\n", what);
    command_t command = {pass, size};
    for (int r = 0; r < READERS; r++)
        if (write (self->command[r], &command, sizeof command) != (ssize_t) sizeof command) {
            s_fail (self, "%s: cannot reach reader %d", what, r + 1);
            return -1;
        }
    if (s_readers_hear (self, what))
        return -1;
    char go = 'g';
    for (int r = 0; r < READERS; r++)
        if (write (self->command[r], &go, 1) != 1) {
            s_fail (self, "%s: cannot reach reader %d", what, r + 1);
            return -1;
        }
    if (s_readers_hear (self, what))
        return -1;
    int rc = 0;
    for (int r = 0; r < READERS; r++)
        if (self->slots[r].errors) {
            s_fail (self, "%s: reader %d: %s", what, r + 1, self->slots[r].error);
            rc = -1;
        }
    return rc;
}

static void
s_readers_stop (hotcache_t *self)
{
    command_t quit = {PASS_QUIT, 0};
    for (int r = 0; r < READERS; r++)
        if (self->readers[r] > 0) {
            if (write (self->command[r], &quit, sizeof quit) != (ssize_t) sizeof quit)
                kill (self->readers[r], SIGTERM);
        }
    for (int r = 0; r < READERS; r++) {
        if (self->readers[r] > 0) {
            double deadline = bench_now () + 10;
            while (!bench_exited (self->readers[r]) && bench_now () < deadline)
                bench_sleep_ms (20);
            if (bench_now () >= deadline) {
                kill (self->readers[r], SIGKILL);
                bench_wait (self->readers[r]);
            }
        }
        if (self->command[r] >= 0)
            close (self->command[r]);
        self->command[r] = -1;
        self->readers[r] = 0;
    }
    if (self->done >= 0)
        close (self->done);
    self->done = -1;
}

//  ---- the cluster -----------------------------------------------------------------------

static kvpool_t *
s_connect_tcp (hotcache_t *self, int node)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = RPC_TIMEOUT_MS;
    options.connect_timeout_ms = 5000;
    options.fast_path = 0;
    options.keep_endpoint = 1;
    kvpool_t *client = kvpool_connect (self->node[node].endpoint, &options);
    if (!client)
        s_fail (self, "cannot connect to node %s at %s: %s", s_node_ids[node],
                self->node[node].endpoint, kvpool_connect_error ());
    return client;
}

//  Whether the master lists the three nodes alive, as node A tells.
static bool
s_cluster_up (hotcache_t *self)
{
    kvpool_node_t nodes[8];
    int count = kvpool_nodes (self->client[NODE_A], nodes, 8);
    int alive = 0;
    for (int i = 0; i < count && i < 8; i++)
        for (int node = 0; node < NODE_COUNT; node++)
            if (nodes[i].alive && nodes[i].capacity > 0
                && !strcmp (nodes[i].node_id, s_node_ids[node]))
                alive++;
    return alive == NODE_COUNT;
}

static int
s_start (hotcache_t *self, int arm)
{
    const char *master_args[] = {"--role",      "master",      "--master", "tcp://127.0.0.1:*",
                                 "--placement", "local-first", "--seed",   "1",
                                 NULL};
    if (bench_kvpoold_start (&self->master, self->kvpoold_path, "hotcache-master", master_args)) {
        self->errors++;
        return -1;
    }
    for (int node = 0; node < NODE_COUNT; node++) {
        char segment[32], cache[32];
        snprintf (segment, sizeof segment, "%" PRIu64 "MiB",
                  (node == NODE_A ? self->segment_a : self->segment_holder) / MiB);
        snprintf (cache, sizeof cache, "%" PRIu64 "MiB",
                  node == NODE_A && arm == ARM_ON ? self->cache_size / MiB : 0);
        const char *args[16] = {
            "--role",         "node",           "--master", self->master.endpoint, "--node-id",
            s_node_ids[node], "--segment-size", segment,    "--hot-cache-size",    cache};
        size_t argc = 10;
        if (s_host_ids[node]) { //  node A keeps the machine's own: the same-machine path
            args[argc++] = "--host-id";
            args[argc++] = s_host_ids[node];
        }
        args[argc] = NULL;
        if (bench_kvpoold_start (&self->node[node], self->kvpoold_path, s_node_names[node], args)) {
            self->errors++;
            return -1;
        }
    }
    return 0;
}

//  The bench's own connections to the nodes, once the master lists the three. Returns 0 or
//  -1.
static int
s_connect (hotcache_t *self)
{
    for (int node = 0; node < NODE_COUNT; node++)
        if (!(self->client[node] = s_connect_tcp (self, node)))
            return -1;
    //  A node serves once it has started; it joins at its first heartbeat.
    double deadline = bench_now () + 15;
    while (!s_cluster_up (self)) {
        if (bench_now () > deadline) {
            s_fail (self, "the master does not list the three nodes alive within 15 s");
            return -1;
        }
        bench_sleep_ms (50);
    }
    return 0;
}

static void
s_stop (hotcache_t *self)
{
    for (int node = 0; node < NODE_COUNT; node++)
        kvpool_destroy (&self->client[node]);
    bool keep = self->errors > 0;
    bench_kvpoold_t *all[NODE_COUNT + 1] = {&self->node[NODE_A], &self->node[NODE_B],
                                            &self->node[NODE_C], &self->master};
    for (int i = 0; i < NODE_COUNT + 1; i++)
        if (all[i]->pid > 0 && bench_kvpoold_stop (all[i], keep) != 0)
            self->errors++;
    if (self->errors)
        for (int i = 0; i < NODE_COUNT + 1; i++)
            if (all[i]->log[0])
                fprintf (stderr, "kvpool-bench: hotcache: log kept: %s\n", all[i]->log);
}

static int
s_stats (hotcache_t *self, int node, kvpool_stats_t *stats)
{
    int rc = kvpool_stats (self->client[node], stats);
    if (rc != KVPOOL_OK) {
        s_fail (self, "kvpool_stats of node %s: %s", s_node_ids[node], kvpool_status_name (rc));
        return -1;
    }
    return 0;
}

//  The values: key i of each size through B when i is even, C when odd (local-first: held
//  there alone). Then where they are is checked: node A holds nothing, B and C their half,
//  and LOCATE names B or C alone for the first keys. Returns 0 or -1.
static int
s_fill (hotcache_t *self)
{
    fprintf (stderr, "kvpool-bench: hotcache: writing the values through nodes B and C\n");
    uint8_t *buffers[FILL_BATCH] = {NULL};
    int rc = 0;
    for (int i = 0; i < FILL_BATCH && rc == 0; i++)
        if (!(buffers[i] = (uint8_t *) malloc (s_sizes[SIZE_COUNT - 1]))) {
            s_fail (self, "out of memory for the values");
            rc = -1;
        }
    uint64_t held[NODE_COUNT] = {0};
    for (int size = 0; size < SIZE_COUNT && rc == 0; size++)
        for (int node = NODE_B; node <= NODE_C && rc == 0; node++) {
            size_t first = (size_t) (node - NODE_B);
            for (size_t index = first; index < self->keys[size] && rc == 0;) {
                char names[FILL_BATCH][KEY_MAX];
                const char *keys[FILL_BATCH];
                const void *data[FILL_BATCH];
                size_t sizes[FILL_BATCH];
                int statuses[FILL_BATCH];
                size_t n = 0;
                for (; n < FILL_BATCH && index < self->keys[size]; n++, index += 2) {
                    s_key (names[n], size, index);
                    keys[n] = names[n];
                    bench_fill (buffers[n], s_sizes[size], s_seed (size, index));
                    data[n] = buffers[n];
                    sizes[n] = s_sizes[size];
                }
                int status =
                    kvpool_put_batch (self->client[node], n, keys, data, sizes, NULL, statuses);
                for (size_t i = 0; i < n && status == KVPOOL_OK; i++)
                    if (statuses[i] != KVPOOL_OK)
                        status = statuses[i];
                if (status != KVPOOL_OK) {
                    s_fail (self, "kvpool_put_batch of %zu x %s through %s: %s: %s", n,
                            s_size_names[size], s_node_ids[node], kvpool_status_name (status),
                            kvpool_last_error (self->client[node]));
                    rc = -1;
                }
                held[node] += n;
            }
        }
    for (int i = 0; i < FILL_BATCH; i++)
        free (buffers[i]);
    for (int node = 0; node < NODE_COUNT && rc == 0; node++) {
        kvpool_stats_t stats;
        if (s_stats (self, node, &stats))
            return -1;
        if (stats.objects != held[node]) {
            s_fail (self, "after the fill node %s holds %" PRIu64 " objects, expected %" PRIu64,
                    s_node_ids[node], stats.objects, held[node]);
            rc = -1;
        }
    }
    for (int size = 0; size < SIZE_COUNT && rc == 0; size++)
        for (size_t index = 0; index < 2 && index < self->keys[size] && rc == 0; index++) {
            char key[KEY_MAX];
            s_key (key, size, index);
            kvpool_node_t nodes[4];
            int count = kvpool_locate (self->client[NODE_A], key, NULL, nodes, 4);
            const char *expected = s_node_ids[NODE_B + index % 2];
            if (count != 1 || strcmp (nodes[0].node_id, expected)) {
                s_fail (self, "LOCATE %s: %s, expected %s alone", key,
                        count < 0    ? kvpool_status_name (count)
                        : count == 1 ? nodes[0].node_id
                                     : "not one holder",
                        expected);
                rc = -1;
            }
        }
    return rc;
}

//  ---- the measurements ------------------------------------------------------------------

static int
s_timed (hotcache_t *self, int arm, int size)
{
    result_t *result = &self->result[arm][size];
    if (s_stats (self, NODE_A, &result->before) || s_pass (self, PASS_TIMED, size)
        || s_stats (self, NODE_A, &result->after))
        return -1;
    size_t count = 0;
    double start = INFINITY, end = 0;
    double *all = (double *) malloc (READERS * self->reads[size] * sizeof *all);
    if (!all) {
        s_fail (self, "out of memory for the latencies");
        return -1;
    }
    for (int r = 0; r < READERS; r++) {
        const reader_slot_t *slot = &self->slots[r];
        memcpy (all + count, self->latency + (size_t) r * self->latency_cap,
                slot->gets * sizeof *all);
        count += slot->gets;
        start = slot->start < start ? slot->start : start;
        end = slot->end > end ? slot->end : end;
        if (slot->fast_path)
            self->fast_path_seen[arm] = true;
        else
            self->fast_path_missing[arm] = true;
    }
    result->gets = count;
    result->wall = end - start;
    result->p50_us = bench_quantile (all, count, 0.50) * 1e6;
    result->p99_us = bench_quantile (all, count, 0.99) * 1e6;
    free (all);
    result->done = true;
    return 0;
}

static int
s_steady (hotcache_t *self, int arm, int size)
{
    result_t *result = &self->result[arm][size];
    kvpool_stats_t idle, before, after;
    if (s_stats (self, NODE_A, &idle))
        return -1;
    bench_sleep_ms (IDLE_MS);
    if (s_stats (self, NODE_A, &before) || s_pass (self, PASS_STEADY, size)
        || s_stats (self, NODE_A, &after))
        return -1;
    result->idle_requests = before.master_requests - idle.master_requests;
    result->steady_requests = after.master_requests - before.master_requests;
    result->steady_gets = 0;
    double start = INFINITY, end = 0;
    for (int r = 0; r < READERS; r++) {
        result->steady_gets += self->slots[r].gets;
        start = self->slots[r].start < start ? self->slots[r].start : start;
        end = self->slots[r].end > end ? self->slots[r].end : end;
    }
    result->steady_seconds = end - start;
    result->steady_done = true;
    return 0;
}

static int
s_arm (hotcache_t *self, int arm)
{
    fprintf (stderr, "kvpool-bench: hotcache: cache %s: starting a master and three nodes\n",
             s_arm_names[arm]);
    int rc = -1;
    //  The readers are forked before this process opens a connection: libkvpool's
    //  process-wide context (its ZeroMQ context, whose threads a child would not have) is
    //  made by the first connection and freed with the last.
    if (s_start (self, arm) == 0 && s_readers_start (self) == 0 && s_connect (self) == 0
        && s_fill (self) == 0) {
        rc = 0;
        for (int size = 0; size < SIZE_COUNT && rc == 0; size++)
            if (s_pass (self, PASS_WARM, size) || s_timed (self, arm, size)
                || s_steady (self, arm, size))
                rc = -1;
    }
    s_readers_stop (self);
    //  With the cache off, node A keeps no copy of what its clients read.
    kvpool_stats_t stats;
    if (rc == 0 && arm == ARM_OFF && s_stats (self, NODE_A, &stats) == 0 && stats.objects) {
        s_fail (self, "with --hot-cache-size 0, node A holds %" PRIu64 " objects at the end",
                stats.objects);
        rc = -1;
    }
    s_stop (self);
    return rc;
}

//  ---- the table -------------------------------------------------------------------------

//  Hit rate of the timed pass, or NAN when node A counted no remote get (no cache).
static double
s_hit_rate (const result_t *result)
{
    uint64_t hits = result->after.hot_cache_hits - result->before.hot_cache_hits;
    uint64_t misses = result->after.hot_cache_misses - result->before.hot_cache_misses;
    return hits + misses ? (double) hits / (double) (hits + misses) : NAN;
}

static double
s_gets_per_s (const result_t *result)
{
    return result->wall > 0 ? (double) result->gets / result->wall : NAN;
}

//  Whether node A counts its master requests: it has sent some (registration, heartbeats)
//  by the end of any pass, so a total of 0 says the counter is not in this build.
static bool
s_counts_master (const result_t *result)
{
    return result->after.master_requests > 0;
}

//  Master requests per get of the timed pass; NAN where node A does not count them.
static double
s_master_per_get (const result_t *result)
{
    if (!s_counts_master (result))
        return NAN;
    uint64_t requests = result->after.master_requests - result->before.master_requests;
    return result->gets ? (double) requests / (double) result->gets : NAN;
}

//  The steady pass's master requests beyond the background the idle second measured (a
//  heartbeat may fall in either, so one more is allowed), per get.
static double
s_steady_per_get (const result_t *result, uint64_t *allowed_p)
{
    uint64_t allowed =
        (uint64_t) ceil ((double) result->idle_requests * result->steady_seconds * 1000 / IDLE_MS)
        + 1;
    *allowed_p = allowed;
    if (!s_counts_master (result))
        return NAN;
    uint64_t beyond = result->steady_requests > allowed ? result->steady_requests - allowed : 0;
    return result->steady_gets ? (double) beyond / (double) result->steady_gets : NAN;
}

static const char *
s_per_get_text (double per_get, char *buffer, size_t size)
{
    if (isnan (per_get))
        snprintf (buffer, size, "not counted (node A's master_requests reads 0)");
    else
        snprintf (buffer, size, "%.3f a get", per_get);
    return buffer;
}

static void
s_print (hotcache_t *self)
{
    char text[64];
    printf ("\n== hotcache: a master and three nodes on loopback; %d client processes on node "
            "A's machine (same-machine path) read, one key a get, values held only by nodes B "
            "and C, keys drawn from Zipf(s=%.1f); cache off and on, each in a cluster of its "
            "own ==\n",
            READERS, ZIPF_S);
    printf ("scale:");
    for (int size = 0; size < SIZE_COUNT; size++)
        printf ("%s %s: %zu keys, %zu timed gets a process after %zu untimed (warm-up)",
                size ? ";" : "", s_size_names[size], self->keys[size], self->reads[size],
                self->warm[size]);
    printf (" (%s; the issue's scale: --hotcache-keys 20000)\n",
            self->quick ? "--quick" : "this machine's default");
    printf ("node A: --hot-cache-size 0 (off) or %" PRIu64 "MiB (on: a quarter of the values' "
            "bytes; --hot-cache-admit 2, the default), --segment-size %" PRIu64 "MiB; nodes B "
            "and C: --segment-size %" PRIu64 "MiB, --host-id of their own; master "
            "--placement local-first; values checked: %s; kvpoold %s\n",
            self->cache_size / MiB, self->segment_a / MiB, self->segment_holder / MiB,
            self->full_verify ? "every byte" : "first and last 8 bytes", self->kvpoold_path);
    for (int arm = 0; arm < ARM_COUNT; arm++)
        if (self->fast_path_missing[arm])
            printf ("note: cache %s: %s readers' connections did not take the same-machine "
                    "path to node A\n",
                    s_arm_names[arm], self->fast_path_seen[arm] ? "some" : "the");
    printf ("%-4s %-7s %8s %9s %9s %9s %7s %15s %9s\n", "arm", "size", "hit rate", "p50 us",
            "p99 us", "gets/s", "GB/s", "master req/get", "cache MiB");
    for (int size = 0; size < SIZE_COUNT; size++)
        for (int arm = 0; arm < ARM_COUNT; arm++) {
            const result_t *result = &self->result[arm][size];
            printf ("%-4s %-7s", s_arm_names[arm], s_size_names[size]);
            if (!result->done) {
                printf (" %8s\n", "FAILED");
                continue;
            }
            double hit = s_hit_rate (result), rate = s_gets_per_s (result);
            if (isnan (hit))
                printf (" %8s", "-");
            else
                printf (" %7.1f%%", hit * 100);
            double master = s_master_per_get (result);
            printf (" %9.0f %9.0f %9.0f %7.3f", result->p50_us, result->p99_us, rate,
                    rate * (double) s_sizes[size] / 1e9);
            if (isnan (master))
                printf (" %15s", "-");
            else
                printf (" %15.3f", master);
            printf (" %9.1f\n", (double) result->after.hot_cache_bytes / MiB);
        }
    printf ("node A's counters over each timed pass (kvpool stats):\n");
    for (int size = 0; size < SIZE_COUNT; size++)
        for (int arm = 0; arm < ARM_COUNT; arm++) {
            const result_t *r = &self->result[arm][size];
            if (!r->done)
                continue;
#define DELTA(field) (r->after.field - r->before.field)
            printf ("  %-3s %-7s gets %" PRIu64 ", remote_gets %" PRIu64 ", redirects %" PRIu64
                    ", hot_cache hits %" PRIu64 " misses %" PRIu64 " admissions %" PRIu64
                    " evictions %" PRIu64 ", master_requests %" PRIu64 ", location_hits %" PRIu64
                    "\n",
                    s_arm_names[arm], s_size_names[size], DELTA (gets), DELTA (remote_gets),
                    DELTA (redirects), DELTA (hot_cache_hits), DELTA (hot_cache_misses),
                    DELTA (hot_cache_admissions), DELTA (hot_cache_evictions),
                    DELTA (master_requests), DELTA (location_hits));
#undef DELTA
        }
    printf ("steady state: each process rereads the %d hottest keys %d times, after an idle "
            "second that measures node A's background master requests (heartbeats):\n",
            STEADY_HEAD, STEADY_ROUNDS);
    for (int size = 0; size < SIZE_COUNT; size++)
        for (int arm = 0; arm < ARM_COUNT; arm++) {
            const result_t *r = &self->result[arm][size];
            if (!r->steady_done)
                continue;
            uint64_t allowed;
            double per_get = s_steady_per_get (r, &allowed);
            printf ("  %-3s %-7s %" PRIu64 " gets in %.3f s: %" PRIu64 " master requests (idle "
                    "second: %" PRIu64 "; up to %" PRIu64 " taken as background): %s\n",
                    s_arm_names[arm], s_size_names[size], r->steady_gets, r->steady_seconds,
                    r->steady_requests, r->idle_requests, allowed,
                    s_per_get_text (per_get, text, sizeof text));
        }

    //  On against off, and the goals.
    int met = 0, goals = 0;
    char verdict[256] = "";
    for (int size = 0; size < SIZE_COUNT; size++) {
        const result_t *off = &self->result[ARM_OFF][size], *on = &self->result[ARM_ON][size];
        const char *name = s_size_names[size];
        goals += 3;
        if (!off->done || !on->done) {
            bench_goal (false, "hotcache %s: not measured (failed)", name);
            continue;
        }
        double hit = s_hit_rate (on);
        double p50 = on->p50_us / off->p50_us;
        double rate = s_gets_per_s (on) / s_gets_per_s (off);
        printf ("on/off %s: p50 %.2f of off, p99 %.2f of off, throughput %s\n", name, p50,
                on->p99_us / off->p99_us, bench_ratio (rate, text, sizeof text));
        char hit_text[64];
        if (isnan (hit))
            snprintf (hit_text, sizeof hit_text, "no hot-cache counts (no cache in this build?)");
        else
            snprintf (hit_text, sizeof hit_text, "hit rate %.1f%%", hit * 100);
        bool hit_ok = !isnan (hit) && hit >= GOAL_HIT_RATE;
        bool ok = hit_ok && p50 <= GOAL_P50;
        met += ok;
        bench_goal (ok,
                    "hotcache %s: get p50 on %.0f us, off %.0f us: %.2f of off (goal <= %.2f at "
                    "a hit rate >= %.0f%%; %s)",
                    name, on->p50_us, off->p50_us, p50, GOAL_P50, GOAL_HIT_RATE * 100, hit_text);
        ok = hit_ok && rate >= GOAL_RATE;
        met += ok;
        bench_goal (ok,
                    "hotcache %s: throughput on %.0f gets/s, off %.0f: %.2fx (goal >= %.1fx at "
                    "a hit rate >= %.0f%%; %s)",
                    name, s_gets_per_s (on), s_gets_per_s (off), rate, GOAL_RATE,
                    GOAL_HIT_RATE * 100, hit_text);
        if (on->steady_done) {
            uint64_t allowed;
            double per_get = s_steady_per_get (on, &allowed);
            ok = per_get == 0;
            met += ok;
            if (isnan (per_get))
                bench_goal (false,
                            "hotcache %s: master requests per repeated remote get: not measured "
                            "(node A's master_requests reads 0: not counted in this build)",
                            name);
            else
                bench_goal (ok,
                            "hotcache %s: master requests per repeated remote get, cache on: %.3f "
                            "(goal 0; %" PRIu64 " requests over %" PRIu64 " gets, %" PRIu64
                            " taken as background)",
                            name, per_get, on->steady_requests, on->steady_gets, allowed);
        }
        else
            bench_goal (false, "hotcache %s: master requests per repeated get: not measured", name);
        size_t used = strlen (verdict);
        snprintf (verdict + used, sizeof verdict - used, "%s%s: %s, p50 %.2f of off, %.2fx gets/s",
                  used ? "; " : "", name, isnan (hit) ? "no hits counted" : hit_text, p50, rate);
    }
    bench_verdict ("hotcache", "cache on against off, %d of %d goals met: %s", met, goals,
                   verdict[0] ? verdict : "not measured");
}

//  ---- the section -----------------------------------------------------------------------

int
bench_hotcache_run (const char *kvpoold_path, bool quick, size_t keys, size_t reads,
                    bool full_verify)
{
    hotcache_t *self = (hotcache_t *) calloc (1, sizeof *self);
    if (!self)
        return -1;
    self->kvpoold_path = kvpoold_path;
    self->quick = quick;
    self->full_verify = full_verify;
    self->done = -1;
    for (int r = 0; r < READERS; r++)
        self->command[r] = -1;
    double start = bench_now ();
    fprintf (stderr, "kvpool-bench: hotcache\n");
    uint64_t bytes = 0, holder = 0;
    for (int size = 0; size < SIZE_COUNT; size++) {
        self->keys[size] = keys ? keys : quick ? s_keys_quick[size] : s_keys_default[size];
        self->reads[size] = reads ? reads : quick ? s_reads_quick[size] : s_reads_default[size];
        self->warm[size] = self->reads[size] / 2 ? self->reads[size] / 2 : 1;
        if (self->reads[size] > self->latency_cap)
            self->latency_cap = self->reads[size];
        bytes += self->keys[size] * s_sizes[size];
        holder += (self->keys[size] + 1) / 2 * s_sizes[size];
        if (!(self->cdf[size] = s_zipf_cdf (self->keys[size])))
            self->errors++;
    }
    //  The cache holds a quarter of the values (Zipf's head: over 2000 keys the hottest
    //  quarter draws about 80% of the reads). Node A's segments hold it too, should the
    //  cache live there, below the eviction watermark; the holders stay under 70% full.
    self->cache_size = s_round_up (bytes / 4 > 64 * MiB ? bytes / 4 : 64 * MiB, MiB);
    self->segment_a = s_round_up (self->cache_size * 10 / 7, 64 * MiB) + 64 * MiB;
    self->segment_holder = s_round_up (holder * 10 / 7, 64 * MiB);
    if (self->segment_holder < 256 * MiB)
        self->segment_holder = 256 * MiB;
    self->shared_size = s_round_up (
        READERS * sizeof (reader_slot_t) + READERS * self->latency_cap * sizeof (double), 4096);
    void *shared =
        mmap (NULL, self->shared_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED || self->errors)
        s_fail (self, "out of memory");
    else {
        self->slots = (reader_slot_t *) shared;
        self->latency = (double *) ((char *) shared + READERS * sizeof (reader_slot_t));
        for (int arm = 0; arm < ARM_COUNT && !self->errors; arm++)
            s_arm (self, arm);
        s_print (self);
    }
    if (shared != MAP_FAILED)
        munmap (shared, self->shared_size);
    for (int size = 0; size < SIZE_COUNT; size++)
        free (self->cdf[size]);
    printf ("hotcache: %.1f s%s\n", bench_now () - start,
            self->errors ? ", with failures (see stderr)" : "");
    int rc = self->errors ? -1 : 0;
    free (self);
    return rc;
}
