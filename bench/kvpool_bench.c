/*  kvpool_bench.c - kvpool-bench: measures kvpool against Redis on this machine, in one run.

    Sections (--only picks some; default all):
      memcpy  the machine's limit: single-thread memcpy of 32 x 1 MiB between pre-faulted
              buffers.
      kv      put and get of 4 KiB, 64 KiB, 1 MiB and 4 MiB values, one key per call and 32 keys
              per call, on three kvpool paths and on Redis:
                kvpool tcp            fast path off: kvpool_put / kvpool_put_batch and
                                      kvpool_get_into / kvpool_get_batch_into (client buffer)
                kvpool tcp zero-copy  fast path off: kvpool_get_batch (values stay in the
                                      received messages)
                kvpool same-machine   fast path on: the same calls, bytes moved by memcpy
                                      through the node's shared segments
                redis                 hiredis SET / MSET and GET / MGET
                redis pipelined       batches only: 32 pipelined SET or GET commands. MGET and
                                      MSET of large values are slow in Redis (it builds the
                                      whole reply in freshly allocated blocks), so the ratios
                                      use whichever Redis form was faster
              and the loopback floor under every tcp figure: a bare libzmq DEALER -> ROUTER
              echo of 4 KiB to another process (bench_floor.c)
      exist   kvpool_exist_batch of 1000 keys (all present, all absent) against 1000 pipelined
              Redis EXISTS (and, for reference, one EXISTS naming 1000 keys, which returns a
              count).
      redis   the Redis side of kv and exist (without it, no Redis is started).
      lookup  bench_lookup_run (bench/bench_lookup.c) against the same kvpoold.
      tier    bench_tier_run (bench/bench_tier.c): eviction and the disk tier, against
              kvpoolds of its own (started after the others are stopped): disk-tier reads
              beside dd, an eviction cycle over a million objects, puts under overflow.
    Not in the default set (each starts a cluster of its own and takes longer; --cluster or
    --only names them):
      cluster bench_cluster_run (bench/bench_cluster.c): a master and two nodes; batched get
              and put throughput through node 1 of values that live on node 2, as a share of
              the loopback bandwidth iperf3 measures.
      hotcache bench_hotcache_run (bench/bench_hotcache.c): a master and three nodes, node
              A's host hot cache off and on (a cluster each): 8 client processes on node A's
              machine read 256 KiB and 1 MiB values held by the other nodes, Zipf-drawn keys;
              hit rate, get p50/p99, throughput, master requests per get, the cache's memory.
              --cluster runs it with the cluster section.
      repair  bench_repair_run (bench/bench_repair.c): a master and three nodes; a node holding
              2-replica 1 MiB values killed, and the rate the lost replicas are restored at
              beside the node-to-node bandwidth of the same run (--repair-big: 1 GiB).
      master  bench_master_run (bench/bench_master.c): one master driven with the cluster
              protocol by fake nodes: keys per second of INVENTORY, LOCATE and PLACE+COMMIT,
              and its memory per object, over 10 million keys.
      kv-events  bench_kv_events_run (bench/bench_kv_events.c): 4 KiB batched put throughput
              with KV events published to a subscriber against none, and the ratio.
      curve   bench_curve_run (bench/bench_curve.c): a kvpoold with CURVE beside a plain one,
              the client on tcp: 32 x 1 MiB batched gets and single 4 KiB gets (p50, p99),
              the medians and the ratios curve/plain.
      latency bench_latency_run (bench/bench_latency.c): single 4 KiB ping, put, get and remove
              over tcp, in turn with the floor's bare echo and, with --compare PATH, another
              build's kvpoold, all in one loop so that noise hits them alike; p50 and p99,
              and p50 as a multiple of the floor.
    A summary of kvpool/Redis ratios and the targets follows the data sections; lookup, tier,
    cluster, hotcache and master print their own targets.

    Method: the machine is shared and noisy, so every measurement (operation, size, batch,
    path) is repeated --reps times and the median throughput is reported. A repetition calls
    the operation at least once and until --time-ms has passed (puts also stop at a byte cap,
    and their keys are removed after each repetition, so the pool never fills; the pool is
    emptied with kvpool_remove_all (force) when the daemon is the bench's own). The
    repetitions of the different paths are interleaved (repetition 1 of every path, then
    repetition 2, ...) so that a burst of load from other users hits all of them alike.
    Latency p50/p99 are per call (one key or one batch of 32) over all calls of all
    repetitions.
    Checks: every call's per-key status and size are checked; every get repetition (with
    --quick, the first only) starts with an untimed call that reads into zeroed buffers and is
    compared byte for byte with what was put; after the first repetition of every put, its
    first and last keys are read back (through TCP) and compared. A broken path therefore fails
    the run instead of looking fast. Values are distinct per key, so a value returned for the
    wrong key fails too.

    Servers: unless --endpoint is given, starts kvpoold from the directory of argv[0] (or
    --kvpoold) on ephemeral loopback ports (the endpoints come from its ready file; processes
    are started and stopped by bench/bench_proc.c) and stops it with SIGTERM at the end;
    against an external kvpoold only the bench's own keys are removed (by regex). Starts
    /usr/bin/redis-server on a free loopback port without persistence and stops it at the
    end. Every child is also sent SIGTERM if the bench dies (PR_SET_PDEATHSIG) or is
    interrupted (bench_on_signal, which also removes the tier section's scratch directory).

    Threads: one (libkvpool and libzmq run their own I/O threads). Output: tables on stdout,
    progress and errors on stderr. Exit status 0 when every call succeeded and every check
    passed, 1 otherwise, 2 on a usage error; missed targets are reported, not failed.
*/
#include "kvpool.h"
#include "bench/bench.h"
#include "bench/bench_plot.h"

#include <hiredis/hiredis.h>

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BATCH 32
#define MAX_VALUE (4u << 20)
#define EXIST_KEYS 1000
#define EXIST_VALUE 64
#define MAX_REPS 42 //  twice the most --reps: memcpy runs at the start and the end
#define KEY_MAX 128
#define RPC_TIMEOUT_MS 60000

enum { OP_PUT, OP_GET, OP_COUNT };
enum { PATH_TCP, PATH_TCP_ZC, PATH_LOCAL, PATH_REDIS, PATH_REDIS_PIPE, PATH_COUNT };
enum {
    EX_KV_HIT,
    EX_KV_MISS,
    EX_LOCAL_HIT,
    EX_LOCAL_MISS,
    //  1000 blocks x 2 ranks: PREFIX_MATCH, against exist of the same keys and counting
    EX_PREFIX_TCP,
    EX_COUNT_TCP,
    EX_PREFIX_LOCAL,
    EX_COUNT_LOCAL,
    EX_REDIS_PIPE,
    EX_REDIS_MULTI,
    EX_COUNT
};
enum { SECTION_KV, SECTION_EXIST };

#define SIZE_COUNT 4
static const size_t s_sizes[SIZE_COUNT] = {4096, 65536, 1 << 20, 4 << 20};
static const char *s_size_names[SIZE_COUNT] = {"4KiB", "64KiB", "1MiB", "4MiB"};
static const int s_batches[2] = {1, BATCH};
static const char *s_op_names[OP_COUNT] = {"put", "get"};
static const char *s_path_names[PATH_COUNT] = {"kvpool tcp", "kvpool tcp zero-copy",
                                               "kvpool same-machine", "redis", "redis pipelined"};
static const char *s_exist_names[EX_COUNT] = {
    "kvpool tcp, all present",     "kvpool tcp, all absent",      "kvpool same-machine, present",
    "kvpool same-machine, absent", "kvpool tcp, 1000x2 blocks",   "kvpool tcp, 1000x2 blocks",
    "kvpool same-machine, 1000x2", "kvpool same-machine, 1000x2", "redis, all present",
    "redis, all present"};
static const char *s_exist_apis[EX_COUNT] = {
    "kvpool_exist_batch",          "kvpool_exist_batch",          "kvpool_exist_batch (index)",
    "kvpool_exist_batch (index)",  "kvpool_prefix_match",         "exist_batch 2000 + count",
    "kvpool_prefix_match (index)", "exist_batch + count (index)", "1000 pipelined EXISTS",
    "EXISTS k1..k1000 (count)"};

//  A prefix row (2 x EXIST_KEYS keys a call).
static bool
s_exist_is_prefix (int row)
{
    return row == EX_PREFIX_TCP || row == EX_COUNT_TCP || row == EX_PREFIX_LOCAL
           || row == EX_COUNT_LOCAL;
}

//  A kvpool exist row: which keys, and over which connection.
static bool
s_exist_is_kvpool (int row)
{
    return row == EX_KV_HIT || row == EX_KV_MISS || row == EX_LOCAL_HIT || row == EX_LOCAL_MISS
           || s_exist_is_prefix (row);
}

//  Read after memcpy loops so the compiler keeps them.
static volatile uint8_t s_sink;

//  ---- samples and results ---------------------------------------------------------------

typedef struct {
    double *values;
    size_t count, capacity;
} samples_t;

typedef struct {
    int reps; //  repetitions measured
    bool failed;
    double rate[MAX_REPS];    //  bytes per second (kv) or keys per second (exist)
    double per_sec[MAX_REPS]; //  values (kv) or calls (exist) per second
    samples_t latency;        //  seconds per call, all repetitions
    uint64_t calls;
} result_t;

//  One measurement, as the generic repetition loop sees it.
typedef struct {
    int section;                     //  SECTION_KV or SECTION_EXIST
    int op, path, size_index, batch; //  kv
    int row;                         //  exist
} job_t;

typedef struct {
    //  options
    bool quick;
    const char *endpoint_opt, *admin_opt, *kvpoold_path, *redis_path;
    const char *plot_dir; //  --plot: charts of the kv figures go there
    int reps, min_calls;
    double rep_seconds;
    uint64_t put_cap; //  bytes per put repetition, so the pool never fills
    bool do_memcpy, do_kv, do_exist, do_lookup, do_tier, do_cluster, do_master, do_kv_events;
    bool do_repair, repair_big;
    bool do_curve, do_latency, do_hotcache;
    size_t hotcache_keys, hotcache_reads; //  --hotcache-keys, --hotcache-reads (0: defaults)
    bool hotcache_verify;                 //  --hotcache-verify: every byte read is checked
    const char *compare_path;             //  --compare: the other build of the latency section
    bool use_kvpool, use_redis;
    char prefix[32]; //  every key starts with it ("bench-PID/")
    char kvpoold_default[PATH_MAX + 16];

    //  servers
    bench_kvpoold_t kvpoold; //  when the bench started it
    char endpoint[256], admin[256];
    pid_t redis_pid;
    int redis_port;
    char redis_log[256];

    //  clients; path_ok[p] is false when a path is unavailable or has failed for good
    kvpool_t *tcp, *local;
    redisContext *redis;
    bool path_ok[PATH_COUNT];
    char local_note[160];
    char why[512]; //  what the last failed call said
    bool fatal;    //  the last failure broke the connection

    //  buffers: src[i] is the value of key i (distinct contents), dst[i] the get targets
    uint8_t *src[BATCH], *dst[BATCH];
    char put_keys[BATCH][KEY_MAX];
    char get_keys[BATCH][KEY_MAX];
    char hit_keys[EXIST_KEYS][KEY_MAX], miss_keys[EXIST_KEYS][KEY_MAX];
    const char *keyp[EXIST_KEYS];
    const char *hitp[EXIST_KEYS], *missp[EXIST_KEYS];
    char rank1_keys[EXIST_KEYS][KEY_MAX]; //  the prefix rows' second rank
    const char *prefixp[2 * EXIST_KEYS];  //  block-major: block i's rank 0, rank 1
    int prefix_status[2 * EXIST_KEYS];
    const void *datap[EXIST_KEYS];
    void *dstp[BATCH];
    size_t sizes[EXIST_KEYS];
    int status[EXIST_KEYS];
    int64_t got[BATCH];
    const char *argv[1 + 2 * EXIST_KEYS];
    size_t argvlen[1 + 2 * EXIST_KEYS];

    //  results
    result_t kv[OP_COUNT][SIZE_COUNT][2][PATH_COUNT];
    result_t exist[EX_COUNT];
    result_t memcpy_result;
    double floor_us; //  the loopback floor's p50 (0: not measured)
    int errors;
} bench_t;

static void
samples_add (samples_t *self, double value)
{
    if (self->count == self->capacity) {
        size_t capacity = self->capacity ? self->capacity * 2 : 1024;
        double *values = realloc (self->values, capacity * sizeof (double));
        if (!values)
            return; //  a lost sample only thins the percentile; not worth failing the run
        self->values = values;
        self->capacity = capacity;
    }
    self->values[self->count++] = value;
}

static int
s_compare_doubles (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

//  Nearest-rank quantile; sorts the samples in place. NAN when there are none.
static double
samples_quantile (samples_t *self, double q)
{
    if (self->count == 0)
        return NAN;
    qsort (self->values, self->count, sizeof (double), s_compare_doubles);
    size_t rank = (size_t) ceil (q * self->count);
    return self->values[rank ? rank - 1 : 0];
}

static double
s_median (const double *values, int count)
{
    if (count == 0)
        return NAN;
    double sorted[MAX_REPS];
    memcpy (sorted, values, count * sizeof (double));
    qsort (sorted, count, sizeof (double), s_compare_doubles);
    return count % 2 ? sorted[count / 2] : (sorted[count / 2 - 1] + sorted[count / 2]) / 2;
}

static bool
s_measured (const result_t *result)
{
    return result->reps > 0 && !result->failed;
}

static double
s_rate (const result_t *result)
{
    return s_measured (result) ? s_median (result->rate, result->reps) : NAN;
}

static double
s_per_sec (const result_t *result)
{
    return s_measured (result) ? s_median (result->per_sec, result->reps) : NAN;
}

//  Latency quantile in microseconds.
static double
s_latency_us (result_t *result, double q)
{
    return s_measured (result) ? samples_quantile (&result->latency, q) * 1e6 : NAN;
}

//  ---- servers ---------------------------------------------------------------------------

static int
s_kvpoold_start (bench_t *self)
{
    const char *args[] = {
        "--segment-size", "4GiB", "--lookup-model", "bench", "--lookup-tp-size", "2", NULL};
    if (bench_kvpoold_start (&self->kvpoold, self->kvpoold_path, "kvpoold", args))
        return -1;
    snprintf (self->endpoint, sizeof self->endpoint, "%s", self->kvpoold.endpoint);
    snprintf (self->admin, sizeof self->admin, "%s", self->kvpoold.admin);
    return 0;
}

static int
s_redis_start (bench_t *self)
{
    snprintf (self->redis_log, sizeof self->redis_log, "/tmp/kvpool-bench-%d-redis.log",
              (int) getpid ());
    if (access (self->redis_path, X_OK) != 0) {
        fprintf (stderr, "kvpool-bench: cannot run %s: %s (apt-get install redis-server)\n",
                 self->redis_path, strerror (errno));
        return -1;
    }
    for (int attempt = 0; attempt < 3; attempt++) {
        int port = bench_free_port ();
        if (port < 0)
            return -1;
        char port_text[16];
        snprintf (port_text, sizeof port_text, "%d", port);
        const char *argv[] = {self->redis_path,
                              "--port",
                              port_text,
                              "--bind",
                              "127.0.0.1",
                              "--save",
                              "",
                              "--appendonly",
                              "no",
                              "--proto-max-bulk-len",
                              "1gb",
                              "--daemonize",
                              "no",
                              "--dir",
                              "/tmp",
                              NULL};
        self->redis_pid = bench_spawn (argv, self->redis_log);
        if (self->redis_pid < 0)
            return -1;
        double deadline = bench_now () + 10;
        while (bench_now () < deadline && !bench_exited (self->redis_pid)) {
            struct timeval timeout = {1, 0};
            redisContext *context = redisConnectWithTimeout ("127.0.0.1", port, timeout);
            if (context && !context->err) {
                redisReply *reply = redisCommand (context, "PING");
                bool pong =
                    reply && reply->type == REDIS_REPLY_STATUS && !strcmp (reply->str, "PONG");
                freeReplyObject (reply);
                if (pong) {
                    struct timeval rpc_timeout = {RPC_TIMEOUT_MS / 1000, 0};
                    redisSetTimeout (context, rpc_timeout);
                    self->redis = context;
                    self->redis_port = port;
                    return 0;
                }
            }
            redisFree (context);
            bench_sleep_ms (20);
        }
        bench_stop (self->redis_pid);
        self->redis_pid = 0;
    }
    fprintf (stderr, "kvpool-bench: redis-server did not start (log: %s)\n", self->redis_log);
    return -1;
}

//  ---- keys, values and checks -----------------------------------------------------------

static void
s_put_key (bench_t *self, char *key, int path, int size_index, int batch, int rep, uint64_t index)
{
    snprintf (key, KEY_MAX, "%sp/%d/%s/%d/%d/%llu", self->prefix, path, s_size_names[size_index],
              batch, rep, (unsigned long long) index);
}

static void
s_kv_error (bench_t *self, kvpool_t *client, const char *call, int status)
{
    const char *reason = client ? kvpool_last_error (client) : "";
    snprintf (self->why, sizeof self->why, "%s: %s%s%s", call, kvpool_status_name (status),
              *reason ? ": " : "", reason);
    self->fatal = status == KVPOOL_RPC_FAIL;
}

static void
s_redis_error (bench_t *self, const char *call, redisReply *reply)
{
    if (!reply)
        snprintf (self->why, sizeof self->why, "%s: %s", call,
                  self->redis->errstr[0] ? self->redis->errstr : "no reply");
    else if (reply->type == REDIS_REPLY_ERROR)
        snprintf (self->why, sizeof self->why, "%s: %s", call, reply->str);
    else
        snprintf (self->why, sizeof self->why, "%s: unexpected reply type %d", call, reply->type);
    self->fatal = !reply;
}

static int
s_check_value (bench_t *self, const void *data, size_t size, size_t expected, int index,
               const char *call)
{
    if (size != expected) {
        snprintf (self->why, sizeof self->why, "%s: value of key %d has %zu bytes, not %zu", call,
                  index, size, expected);
        return -1;
    }
    if (memcmp (data, self->src[index], size) != 0) {
        snprintf (self->why, sizeof self->why, "%s: value of key %d differs from what was put",
                  call, index);
        return -1;
    }
    return 0;
}

//  Removes the bench's keys from kvpool: the whole pool when the daemon is ours, else only
//  our prefix, so a shared daemon keeps its data.
static int
s_kvpool_clean (bench_t *self)
{
    if (!self->tcp)
        return 0;
    int64_t removed;
    if (self->kvpoold.pid > 0)
        removed = kvpool_remove_all (self->tcp, true);
    else {
        char pattern[64];
        snprintf (pattern, sizeof pattern, "^%s", self->prefix);
        removed = kvpool_remove_by_regex (self->tcp, pattern, true);
    }
    if (removed < 0) {
        s_kv_error (self, self->tcp, "cleanup", (int) removed);
        fprintf (stderr, "kvpool-bench: %s\n", self->why);
        self->errors++;
        return -1;
    }
    return 0;
}

static int
s_redis_clean (bench_t *self)
{
    if (!self->redis)
        return 0;
    redisReply *reply = redisCommand (self->redis, "FLUSHALL");
    int rc = reply && reply->type == REDIS_REPLY_STATUS ? 0 : -1;
    if (rc) {
        s_redis_error (self, "FLUSHALL", reply);
        fprintf (stderr, "kvpool-bench: %s\n", self->why);
        self->errors++;
    }
    freeReplyObject (reply);
    return rc;
}

static bool s_is_redis (int path);

static void
s_clean (bench_t *self, int path)
{
    if (s_is_redis (path))
        s_redis_clean (self);
    else
        s_kvpool_clean (self);
}

//  ---- the kv calls ------------------------------------------------------------------------

static bool
s_is_redis (int path)
{
    return path == PATH_REDIS || path == PATH_REDIS_PIPE;
}

static kvpool_t *
s_client (bench_t *self, int path)
{
    return path == PATH_LOCAL ? self->local : self->tcp;
}

//  batch SETs in one pipeline: all commands are written, then all replies read.
static int
s_redis_put_pipelined (bench_t *self, size_t size, int batch)
{
    for (int j = 0; j < batch; j++)
        redisAppendCommand (self->redis, "SET %s %b", self->keyp[j], self->datap[j], size);
    int rc = 0;
    for (int j = 0; j < batch; j++) {
        redisReply *reply = NULL;
        if (redisGetReply (self->redis, (void **) &reply) != REDIS_OK) {
            s_redis_error (self, "pipelined SET", NULL);
            return -1; //  the connection is broken; the remaining replies are lost
        }
        if (rc == 0 && (reply->type != REDIS_REPLY_STATUS || strcmp (reply->str, "OK"))) {
            s_redis_error (self, "pipelined SET", reply);
            rc = -1;
        }
        freeReplyObject (reply);
    }
    return rc;
}

static int
s_redis_put (bench_t *self, size_t size, int batch)
{
    redisReply *reply;
    if (batch == 1)
        reply = redisCommand (self->redis, "SET %s %b", self->keyp[0], self->datap[0], size);
    else {
        self->argv[0] = "MSET";
        self->argvlen[0] = 4;
        for (int j = 0; j < batch; j++) {
            self->argv[1 + 2 * j] = self->keyp[j];
            self->argvlen[1 + 2 * j] = strlen (self->keyp[j]);
            self->argv[2 + 2 * j] = self->datap[j];
            self->argvlen[2 + 2 * j] = size;
        }
        reply = redisCommandArgv (self->redis, 1 + 2 * batch, self->argv, self->argvlen);
    }
    int rc = 0;
    if (!reply || reply->type != REDIS_REPLY_STATUS || strcmp (reply->str, "OK")) {
        s_redis_error (self, batch == 1 ? "SET" : "MSET", reply);
        rc = -1;
    }
    freeReplyObject (reply);
    return rc;
}

//  One put call of batch fresh keys; key i of the call has the value src[i % BATCH].
static int
s_put_call (bench_t *self, const job_t *job, int rep, uint64_t call)
{
    size_t size = s_sizes[job->size_index];
    for (int j = 0; j < job->batch; j++) {
        uint64_t index = call * job->batch + j;
        s_put_key (self, self->put_keys[j], job->path, job->size_index, job->batch, rep, index);
        self->keyp[j] = self->put_keys[j];
        self->datap[j] = self->src[index % BATCH];
        self->sizes[j] = size;
    }
    if (job->path == PATH_REDIS_PIPE)
        return s_redis_put_pipelined (self, size, job->batch);
    if (job->path == PATH_REDIS)
        return s_redis_put (self, size, job->batch);
    kvpool_t *client = s_client (self, job->path);
    if (job->batch == 1) {
        int rc = kvpool_put (client, self->keyp[0], self->datap[0], size, NULL);
        if (rc != KVPOOL_OK)
            s_kv_error (self, client, "kvpool_put", rc);
        return rc ? -1 : 0;
    }
    int rc = kvpool_put_batch (client, job->batch, self->keyp, self->datap, self->sizes, NULL,
                               self->status);
    for (int j = 0; rc == KVPOOL_OK && j < job->batch; j++)
        rc = self->status[j];
    if (rc != KVPOOL_OK)
        s_kv_error (self, client, "kvpool_put_batch", rc);
    return rc ? -1 : 0;
}

static int
s_redis_get_pipelined (bench_t *self, size_t size, int batch, const int *index, bool verify)
{
    for (int j = 0; j < batch; j++)
        redisAppendCommand (self->redis, "GET %s", self->keyp[j]);
    int rc = 0;
    for (int j = 0; j < batch; j++) {
        redisReply *reply = NULL;
        if (redisGetReply (self->redis, (void **) &reply) != REDIS_OK) {
            s_redis_error (self, "pipelined GET", NULL);
            return -1;
        }
        if (rc == 0 && reply->type != REDIS_REPLY_STRING) {
            s_redis_error (self, "pipelined GET", reply);
            rc = -1;
        }
        else if (rc == 0 && (verify || reply->len != size))
            rc = s_check_value (self, reply->str, reply->len, size, index[j], "pipelined GET");
        freeReplyObject (reply);
    }
    return rc;
}

static int
s_redis_get (bench_t *self, size_t size, int batch, const int *index, bool verify)
{
    redisReply *reply;
    const char *call = batch == 1 ? "GET" : "MGET";
    if (batch == 1)
        reply = redisCommand (self->redis, "GET %s", self->keyp[0]);
    else {
        self->argv[0] = "MGET";
        self->argvlen[0] = 4;
        for (int j = 0; j < batch; j++) {
            self->argv[1 + j] = self->keyp[j];
            self->argvlen[1 + j] = strlen (self->keyp[j]);
        }
        reply = redisCommandArgv (self->redis, 1 + batch, self->argv, self->argvlen);
    }
    int rc = 0;
    if (!reply || (batch == 1 && reply->type != REDIS_REPLY_STRING)
        || (batch > 1 && (reply->type != REDIS_REPLY_ARRAY || reply->elements != (size_t) batch))) {
        s_redis_error (self, call, reply);
        rc = -1;
    }
    for (int j = 0; rc == 0 && j < batch; j++) {
        redisReply *value = batch == 1 ? reply : reply->element[j];
        if (value->type != REDIS_REPLY_STRING) {
            s_redis_error (self, call, value);
            rc = -1;
        }
        else if (verify)
            rc = s_check_value (self, value->str, value->len, size, index[j], call);
        else if (value->len != size)
            rc = s_check_value (self, value->str, value->len, size, index[j], call);
    }
    freeReplyObject (reply);
    return rc;
}

//  One get call: key i of the call is get_keys[i % BATCH], whose value is src[i % BATCH].
//  With verify, the destination buffers are zeroed first and every byte is compared after.
static int
s_get_call (bench_t *self, const job_t *job, uint64_t call, bool verify)
{
    size_t size = s_sizes[job->size_index];
    int batch = job->batch;
    int index[BATCH];
    for (int j = 0; j < batch; j++) {
        index[j] = (int) ((call * batch + j) % BATCH);
        self->keyp[j] = self->get_keys[index[j]];
        self->dstp[j] = self->dst[index[j]];
        self->sizes[j] = size;
        if (verify)
            memset (self->dst[index[j]], 0, size);
    }
    if (job->path == PATH_REDIS_PIPE)
        return s_redis_get_pipelined (self, size, batch, index, verify);
    if (job->path == PATH_REDIS)
        return s_redis_get (self, size, batch, index, verify);

    kvpool_t *client = s_client (self, job->path);
    if (job->path == PATH_TCP_ZC) {
        kvpool_values_t *values = NULL;
        int rc = kvpool_get_batch (client, batch, self->keyp, &values, self->status);
        for (int j = 0; rc == KVPOOL_OK && j < batch; j++)
            rc = self->status[j];
        if (rc != KVPOOL_OK) {
            s_kv_error (self, client, "kvpool_get_batch", rc);
            kvpool_values_destroy (&values);
            return -1;
        }
        for (int j = 0; rc == 0 && j < batch; j++) {
            size_t got = kvpool_values_size (values, j);
            const void *data = kvpool_values_data (values, j);
            if (verify || got != size) {
                if (!data && got) {
                    snprintf (self->why, sizeof self->why, "kvpool_get_batch: no data");
                    rc = -1;
                }
                else
                    rc = s_check_value (self, data, got, size, index[j], "kvpool_get_batch");
            }
        }
        kvpool_values_destroy (&values);
        return rc;
    }

    const char *name = batch == 1 ? "kvpool_get_into" : "kvpool_get_batch_into";
    if (batch == 1)
        self->got[0] = kvpool_get_into (client, self->keyp[0], self->dstp[0], size);
    else {
        int rc =
            kvpool_get_batch_into (client, batch, self->keyp, self->dstp, self->sizes, self->got);
        if (rc != KVPOOL_OK) {
            s_kv_error (self, client, name, rc);
            return -1;
        }
    }
    for (int j = 0; j < batch; j++) {
        if (self->got[j] < 0) {
            s_kv_error (self, client, name, (int) self->got[j]);
            return -1;
        }
        if (verify || (size_t) self->got[j] != size)
            if (s_check_value (self, self->dst[index[j]], (size_t) self->got[j], size, index[j],
                               name))
                return -1;
    }
    return 0;
}

//  Reads back the first and last key a put repetition wrote (through TCP where possible, so
//  a same-machine put is checked by the other path) and compares them with their sources.
static int
s_put_verify (bench_t *self, const job_t *job, int rep, uint64_t calls)
{
    size_t size = s_sizes[job->size_index];
    uint64_t last = calls * job->batch - 1;
    uint64_t indexes[2] = {0, last};
    char key[KEY_MAX];
    for (int i = 0; i < 2; i++) {
        s_put_key (self, key, job->path, job->size_index, job->batch, rep, indexes[i]);
        int source = (int) (indexes[i] % BATCH);
        if (s_is_redis (job->path)) {
            redisReply *reply = redisCommand (self->redis, "GET %s", key);
            int rc = -1;
            if (!reply || reply->type != REDIS_REPLY_STRING)
                s_redis_error (self, "GET after SET", reply);
            else
                rc = s_check_value (self, reply->str, reply->len, size, source, "GET after SET");
            freeReplyObject (reply);
            if (rc)
                return -1;
            continue;
        }
        kvpool_t *client = self->path_ok[PATH_TCP] ? self->tcp : s_client (self, job->path);
        memset (self->dst[0], 0, size);
        int64_t got = kvpool_get_into (client, key, self->dst[0], MAX_VALUE);
        if (got < 0) {
            s_kv_error (self, client, "kvpool_get_into after put", (int) got);
            return -1;
        }
        if (s_check_value (self, self->dst[0], (size_t) got, size, source,
                           "kvpool_get_into after put"))
            return -1;
    }
    return 0;
}

//  ---- the exist calls ---------------------------------------------------------------------

static int
s_exist_call (bench_t *self, int row)
{
    if (s_exist_is_prefix (row)) {
        kvpool_t *client =
            row == EX_PREFIX_LOCAL || row == EX_COUNT_LOCAL ? self->local : self->tcp;
        int64_t count;
        if (row == EX_PREFIX_TCP || row == EX_PREFIX_LOCAL)
            count = kvpool_prefix_match (client, EXIST_KEYS, 2, self->prefixp);
        else {
            int rc =
                kvpool_exist_batch (client, 2 * EXIST_KEYS, self->prefixp, self->prefix_status);
            count = rc;
            for (int b = 0; rc == KVPOOL_OK && b < EXIST_KEYS; b++, count++)
                if (self->prefix_status[2 * b] != 1 || self->prefix_status[2 * b + 1] != 1)
                    break;
        }
        if (count != EXIST_KEYS) {
            snprintf (self->why, sizeof self->why, "%s: %lld blocks, expected %d",
                      s_exist_apis[row], (long long) count, EXIST_KEYS);
            return -1;
        }
        return 0;
    }
    if (s_exist_is_kvpool (row)) {
        bool hit = row == EX_KV_HIT || row == EX_LOCAL_HIT;
        const char *const *keys = hit ? self->hitp : self->missp;
        int expected = hit;
        kvpool_t *client = row == EX_LOCAL_HIT || row == EX_LOCAL_MISS ? self->local : self->tcp;
        int rc = kvpool_exist_batch (client, EXIST_KEYS, keys, self->status);
        if (rc != KVPOOL_OK) {
            s_kv_error (self, client, "kvpool_exist_batch", rc);
            return -1;
        }
        for (int i = 0; i < EXIST_KEYS; i++)
            if (self->status[i] != expected) {
                snprintf (self->why, sizeof self->why,
                          "kvpool_exist_batch: key %d: %d, expected %d", i, self->status[i],
                          expected);
                return -1;
            }
        return 0;
    }
    if (row == EX_REDIS_PIPE) {
        for (int i = 0; i < EXIST_KEYS; i++)
            redisAppendCommand (self->redis, "EXISTS %s", self->hit_keys[i]);
        int rc = 0;
        for (int i = 0; i < EXIST_KEYS; i++) {
            redisReply *reply = NULL;
            if (redisGetReply (self->redis, (void **) &reply) != REDIS_OK) {
                s_redis_error (self, "EXISTS", NULL);
                return -1; //  the connection is broken; the remaining replies are lost
            }
            if (rc == 0 && (reply->type != REDIS_REPLY_INTEGER || reply->integer != 1)) {
                s_redis_error (self, "EXISTS", reply);
                snprintf (self->why, sizeof self->why, "EXISTS: key %d not found", i);
                rc = -1;
            }
            freeReplyObject (reply);
        }
        return rc;
    }
    self->argv[0] = "EXISTS";
    self->argvlen[0] = 6;
    for (int i = 0; i < EXIST_KEYS; i++) {
        self->argv[1 + i] = self->hit_keys[i];
        self->argvlen[1 + i] = strlen (self->hit_keys[i]);
    }
    redisReply *reply = redisCommandArgv (self->redis, 1 + EXIST_KEYS, self->argv, self->argvlen);
    int rc = 0;
    if (!reply || reply->type != REDIS_REPLY_INTEGER) {
        s_redis_error (self, "EXISTS k1..k1000", reply);
        rc = -1;
    }
    else if (reply->integer != EXIST_KEYS) {
        snprintf (self->why, sizeof self->why, "EXISTS k1..k1000: %lld, expected %d",
                  (long long) reply->integer, EXIST_KEYS);
        rc = -1;
    }
    freeReplyObject (reply);
    return rc;
}

//  ---- the repetition loop ----------------------------------------------------------------

static int
s_call (bench_t *self, const job_t *job, int rep, uint64_t call, bool verify)
{
    self->why[0] = 0;
    self->fatal = false;
    if (job->section == SECTION_EXIST)
        return s_exist_call (self, job->row);
    if (job->op == OP_PUT)
        return s_put_call (self, job, rep, call);
    return s_get_call (self, job, call, verify);
}

static int
s_job_path (const job_t *job)
{
    if (job->section == SECTION_KV)
        return job->path;
    if (job->row == EX_LOCAL_HIT || job->row == EX_LOCAL_MISS || job->row == EX_PREFIX_LOCAL
        || job->row == EX_COUNT_LOCAL)
        return PATH_LOCAL;
    return s_exist_is_kvpool (job->row) ? PATH_TCP : PATH_REDIS;
}

static void
s_job_name (const job_t *job, char *buf, size_t size)
{
    if (job->section == SECTION_EXIST)
        snprintf (buf, size, "exist %d keys, %s (%s)", EXIST_KEYS, s_exist_names[job->row],
                  s_exist_apis[job->row]);
    else
        snprintf (buf, size, "%s %s %s %s", s_op_names[job->op], s_size_names[job->size_index],
                  job->batch == 1 ? "single" : "batch32", s_path_names[job->path]);
}

//  Reports a failed measurement; a broken connection takes its whole path (for kvpool: all
//  three kvpool paths, they share the daemon) out of the run so nothing waits on timeouts.
static void
s_job_failed (bench_t *self, const job_t *job, result_t *result)
{
    char name[160];
    s_job_name (job, name, sizeof name);
    fprintf (stderr, "kvpool-bench: FAILED %s: %s\n", name, self->why);
    result->failed = true;
    self->errors++;
    if (self->fatal) {
        int path = s_job_path (job);
        fprintf (stderr, "kvpool-bench: %s no longer answers; skipping it from now on\n",
                 s_is_redis (path) ? "redis" : "kvpoold");
        if (s_is_redis (path))
            self->path_ok[PATH_REDIS] = self->path_ok[PATH_REDIS_PIPE] = false;
        else
            self->path_ok[PATH_TCP] = self->path_ok[PATH_TCP_ZC] = self->path_ok[PATH_LOCAL] =
                false;
    }
}

//  One repetition: calls the job until rep_seconds has passed (and at least min_calls times;
//  puts stop early at put_cap bytes). Gets start with an untimed, fully checked call.
static void
s_measure (bench_t *self, const job_t *job, int rep, result_t *result)
{
    int path = s_job_path (job);
    if (result->failed || !self->path_ok[path])
        return;
    uint64_t bytes_per_call = 0, values_per_call = 1;
    if (job->section == SECTION_KV) {
        bytes_per_call = (uint64_t) s_sizes[job->size_index] * job->batch;
        values_per_call = job->batch;
    }
    else //  "rate" of an exist row counts keys
        bytes_per_call = s_exist_is_prefix (job->row) ? 2 * EXIST_KEYS : EXIST_KEYS;
    bool is_put = job->section == SECTION_KV && job->op == OP_PUT;
    //  Quick runs check the first repetition only, to stay short; full runs check them all.
    bool verify = rep == 0 || !self->quick;
    if (verify && !is_put && s_call (self, job, rep, 0, true)) {
        s_job_failed (self, job, result);
        return;
    }
    uint64_t calls = 0;
    double start = bench_now ();
    double now = start;
    while (calls < (uint64_t) self->min_calls
           || (now - start < self->rep_seconds
               && (!is_put || (calls + 1) * bytes_per_call <= self->put_cap))) {
        double before = now;
        if (s_call (self, job, rep, calls, false)) {
            s_job_failed (self, job, result);
            if (is_put)
                s_clean (self, path);
            return;
        }
        now = bench_now ();
        samples_add (&result->latency, now - before);
        calls++;
    }
    double elapsed = now - start;
    result->rate[result->reps] = calls * bytes_per_call / elapsed;
    result->per_sec[result->reps] = calls * values_per_call / elapsed;
    result->reps++;
    result->calls += calls;
    if (is_put) {
        if (rep == 0 && s_put_verify (self, job, rep, calls))
            s_job_failed (self, job, result);
        s_clean (self, path);
    }
}

//  ---- sections ----------------------------------------------------------------------------

//  Adds --reps repetitions to the memcpy reference. It runs at the start and again at the end,
//  so its median spans the same stretch of machine noise as the rest.
static void
s_memcpy_reps (bench_t *self)
{
    const size_t chunk = 1 << 20;
    result_t *result = &self->memcpy_result;
    for (int rep = 0; rep < self->reps && result->reps < MAX_REPS; rep++) {
        uint64_t rounds = 0;
        double start = bench_now (), now = start;
        while (rounds < 2 || now - start < self->rep_seconds) {
            for (int j = 0; j < BATCH; j++)
                memcpy (self->dst[j], self->src[j], chunk);
            rounds++;
            now = bench_now ();
        }
        s_sink = self->dst[rounds % BATCH][rounds % chunk];
        result->rate[result->reps] = rounds * BATCH * chunk / (now - start);
        result->per_sec[result->reps] = rounds * BATCH / (now - start);
        result->reps++;
    }
}

static void
s_section_memcpy (bench_t *self)
{
    s_memcpy_reps (self);
    printf ("\n== memcpy reference: one thread, 32 x 1 MiB between pre-faulted buffers "
            "(median of %d) ==\n",
            self->reps);
    printf ("memcpy  %.2f GB/s\n", s_rate (&self->memcpy_result) / 1e9);
    fflush (stdout);
}

//  Puts the 32 keys every get of this size reads: get_keys[i] holds src[i].
static void
s_load_get_keys (bench_t *self, int size_index)
{
    size_t size = s_sizes[size_index];
    for (int i = 0; i < BATCH; i++) {
        snprintf (self->get_keys[i], KEY_MAX, "%sg/%s/%d", self->prefix, s_size_names[size_index],
                  i);
        self->keyp[i] = self->get_keys[i];
        self->datap[i] = self->src[i];
        self->sizes[i] = size;
    }
    if (self->path_ok[PATH_TCP]) {
        int rc = kvpool_put_batch (self->tcp, BATCH, self->keyp, self->datap, self->sizes, NULL,
                                   self->status);
        for (int i = 0; rc == KVPOOL_OK && i < BATCH; i++)
            rc = self->status[i];
        if (rc != KVPOOL_OK) {
            s_kv_error (self, self->tcp, "loading the get keys: kvpool_put_batch", rc);
            fprintf (stderr, "kvpool-bench: %s\n", self->why);
            self->errors++;
            for (int b = 0; b < 2; b++)
                for (int path = PATH_TCP; path <= PATH_LOCAL; path++)
                    self->kv[OP_GET][size_index][b][path].failed = true;
        }
    }
    if (self->path_ok[PATH_REDIS] && s_redis_put (self, size, BATCH)) {
        fprintf (stderr, "kvpool-bench: loading the get keys: %s\n", self->why);
        self->errors++;
        for (int b = 0; b < 2; b++)
            self->kv[OP_GET][size_index][b][PATH_REDIS].failed =
                self->kv[OP_GET][size_index][b][PATH_REDIS_PIPE].failed = true;
    }
}

static const char *
s_kv_api (int op, int path, int batch)
{
    if (path == PATH_REDIS)
        return op == OP_PUT ? (batch == 1 ? "SET" : "MSET") : (batch == 1 ? "GET" : "MGET");
    if (path == PATH_REDIS_PIPE)
        return op == OP_PUT ? "32 pipelined SET" : "32 pipelined GET";
    if (op == OP_PUT)
        return batch == 1 ? "kvpool_put" : "kvpool_put_batch";
    if (path == PATH_TCP_ZC)
        return "kvpool_get_batch";
    return batch == 1 ? "kvpool_get_into" : "kvpool_get_batch_into";
}

//  Prints a number right-aligned in width, or "-" when it is NAN.
static void
s_print_number (int width, const char *format, double value)
{
    char text[32];
    if (isnan (value))
        snprintf (text, sizeof text, "-");
    else
        snprintf (text, sizeof text, format, value);
    printf (" %*s", width, text);
}

//  The Redis baseline of a case: the faster of the Redis forms measured (for batches, MGET or
//  MSET against 32 pipelined commands). *api_p names it. NAN when none was measured.
static double
s_redis_best (bench_t *self, int op, int s, int b, const char **api_p)
{
    double best = NAN;
    const char *api = "-";
    for (int path = PATH_REDIS; path <= PATH_REDIS_PIPE; path++) {
        double rate = s_rate (&self->kv[op][s][b][path]);
        if (!isnan (rate) && (isnan (best) || rate > best)) {
            best = rate;
            api = s_kv_api (op, path, s_batches[b]);
        }
    }
    if (api_p)
        *api_p = api;
    return best;
}

static void
s_print_kv_table (bench_t *self)
{
    printf (
        "\n== kvpool and redis put/get (median of %d runs; p50/p99 per call, a call is one "
        "key or one batch of 32;\n   \"x redis\" = throughput ratio to the faster Redis form) ==\n",
        self->reps);
    printf ("%-4s %-6s %-7s %-20s %-22s %8s %11s %9s %9s %7s %8s\n", "op", "size", "batch", "path",
            "api", "GB/s", "values/s", "p50 us", "p99 us", "calls", "x redis");
    for (int op = 0; op < OP_COUNT; op++)
        for (int s = 0; s < SIZE_COUNT; s++)
            for (int b = 0; b < 2; b++) {
                double redis_rate = s_redis_best (self, op, s, b, NULL);
                bool any = false;
                for (int path = 0; path < PATH_COUNT; path++) {
                    if (op == OP_PUT && path == PATH_TCP_ZC)
                        continue;
                    result_t *result = &self->kv[op][s][b][path];
                    if (result->reps == 0 && !result->failed)
                        continue;
                    any = true;
                    printf ("%-4s %-6s %-7s %-20s %-22s", s_op_names[op], s_size_names[s],
                            b ? "32" : "1", s_path_names[path], s_kv_api (op, path, s_batches[b]));
                    if (result->failed) {
                        printf (" %8s\n", "FAILED");
                        continue;
                    }
                    double rate = s_rate (result);
                    s_print_number (8, "%.3f", rate / 1e9);
                    s_print_number (11, "%.0f", s_per_sec (result));
                    s_print_number (9, "%.1f", s_latency_us (result, 0.50));
                    s_print_number (9, "%.1f", s_latency_us (result, 0.99));
                    printf (" %7llu", (unsigned long long) result->calls);
                    if (!s_is_redis (path))
                        s_print_number (7, "%.2fx", rate / redis_rate);
                    printf ("\n");
                }
                if (any)
                    printf ("\n");
            }
    fflush (stdout);
}

static void
s_section_kv (bench_t *self)
{
    for (int s = 0; s < SIZE_COUNT; s++) {
        fprintf (stderr, "kvpool-bench: kv %s values\n", s_size_names[s]);
        for (int b = 0; b < 2; b++) {
            job_t job = {SECTION_KV, OP_PUT, 0, s, s_batches[b], 0};
            for (int rep = 0; rep < self->reps; rep++)
                for (int path = 0; path < PATH_COUNT; path++) {
                    if (path == PATH_TCP_ZC || (path == PATH_REDIS_PIPE && b == 0))
                        continue;
                    job.path = path;
                    s_measure (self, &job, rep, &self->kv[OP_PUT][s][b][path]);
                }
        }
        s_load_get_keys (self, s);
        for (int b = 0; b < 2; b++) {
            job_t job = {SECTION_KV, OP_GET, 0, s, s_batches[b], 0};
            for (int rep = 0; rep < self->reps; rep++)
                for (int path = 0; path < PATH_COUNT; path++) {
                    if (path == PATH_REDIS_PIPE && b == 0)
                        continue;
                    job.path = path;
                    s_measure (self, &job, rep, &self->kv[OP_GET][s][b][path]);
                }
        }
        if (self->path_ok[PATH_TCP])
            s_kvpool_clean (self);
        if (self->path_ok[PATH_REDIS])
            s_redis_clean (self);
    }
    s_print_kv_table (self);
}

static void
s_section_exist (bench_t *self)
{
    fprintf (stderr, "kvpool-bench: exist\n");
    //  Keys shaped like the vLLM connector's: a model/rank prefix and a 64-hex-digit hash.
    for (int i = 0; i < EXIST_KEYS; i++) {
        uint64_t h = bench_mix (i), g = bench_mix (h), f = bench_mix (g), e = bench_mix (f);
        snprintf (self->hit_keys[i], KEY_MAX,
                  "%sbench@tp_rank:0@pp_rank:0@%016llx%016llx%016llx%016llx", self->prefix,
                  (unsigned long long) h, (unsigned long long) g, (unsigned long long) f,
                  (unsigned long long) e);
        snprintf (self->miss_keys[i], KEY_MAX,
                  "%sbench@tp_rank:1@pp_rank:0@%016llx%016llx%016llx%016llx", self->prefix,
                  (unsigned long long) h, (unsigned long long) g, (unsigned long long) f,
                  (unsigned long long) e);
        snprintf (self->rank1_keys[i], KEY_MAX,
                  "%sbench@tp_rank:1@pp_rank:0@%016llx%016llx%016llx%016llxp", self->prefix,
                  (unsigned long long) h, (unsigned long long) g, (unsigned long long) f,
                  (unsigned long long) e);
        self->hitp[i] = self->hit_keys[i];
        self->missp[i] = self->miss_keys[i];
        self->prefixp[2 * i] = self->hit_keys[i];
        self->prefixp[2 * i + 1] = self->rank1_keys[i];
        self->datap[i] = self->src[i % BATCH];
        self->sizes[i] = EXIST_VALUE;
    }
    if (self->path_ok[PATH_TCP]) {
        int rc = kvpool_put_batch (self->tcp, EXIST_KEYS, self->hitp, self->datap, self->sizes,
                                   NULL, self->status);
        for (int i = 0; rc == KVPOOL_OK && i < EXIST_KEYS; i++)
            rc = self->status[i];
        const char *rank1[EXIST_KEYS];
        for (int i = 0; i < EXIST_KEYS; i++)
            rank1[i] = self->rank1_keys[i];
        if (rc == KVPOOL_OK)
            rc = kvpool_put_batch (self->tcp, EXIST_KEYS, rank1, self->datap, self->sizes, NULL,
                                   self->status);
        for (int i = 0; rc == KVPOOL_OK && i < EXIST_KEYS; i++)
            rc = self->status[i];
        if (rc != KVPOOL_OK) {
            s_kv_error (self, self->tcp, "exist: loading keys: kvpool_put_batch", rc);
            fprintf (stderr, "kvpool-bench: %s\n", self->why);
            self->errors++;
            self->exist[EX_KV_HIT].failed = self->exist[EX_KV_MISS].failed = true;
            self->exist[EX_LOCAL_HIT].failed = self->exist[EX_LOCAL_MISS].failed = true;
            for (int row = EX_PREFIX_TCP; row <= EX_COUNT_LOCAL; row++)
                self->exist[row].failed = true;
        }
    }
    if (self->path_ok[PATH_REDIS]) {
        self->argv[0] = "MSET";
        self->argvlen[0] = 4;
        for (int i = 0; i < EXIST_KEYS; i++) {
            self->argv[1 + 2 * i] = self->hit_keys[i];
            self->argvlen[1 + 2 * i] = strlen (self->hit_keys[i]);
            self->argv[2 + 2 * i] = self->datap[i];
            self->argvlen[2 + 2 * i] = EXIST_VALUE;
        }
        redisReply *reply =
            redisCommandArgv (self->redis, 1 + 2 * EXIST_KEYS, self->argv, self->argvlen);
        if (!reply || reply->type != REDIS_REPLY_STATUS) {
            s_redis_error (self, "exist: loading keys: MSET", reply);
            fprintf (stderr, "kvpool-bench: %s\n", self->why);
            self->errors++;
            self->exist[EX_REDIS_PIPE].failed = self->exist[EX_REDIS_MULTI].failed = true;
        }
        freeReplyObject (reply);
    }
    for (int rep = 0; rep < self->reps; rep++)
        for (int row = 0; row < EX_COUNT; row++) {
            job_t job = {.section = SECTION_EXIST, .row = row};
            s_measure (self, &job, rep, &self->exist[row]);
        }
    if (self->path_ok[PATH_TCP])
        s_kvpool_clean (self);
    if (self->path_ok[PATH_REDIS])
        s_redis_clean (self);

    printf ("\n== batch exist, %d keys per call, and prefix match of %d blocks x 2 ranks "
            "(median of %d runs; p50/p99 per call) ==\n",
            EXIST_KEYS, EXIST_KEYS, self->reps);
    printf ("%-26s %-26s %10s %9s %9s %7s %8s\n", "path", "api", "M keys/s", "p50 us", "p99 us",
            "calls", "x redis");
    double redis_rate = s_rate (&self->exist[EX_REDIS_PIPE]);
    for (int row = 0; row < EX_COUNT; row++) {
        result_t *result = &self->exist[row];
        if (result->reps == 0 && !result->failed)
            continue;
        printf ("%-26s %-26s", s_exist_names[row], s_exist_apis[row]);
        if (result->failed) {
            printf (" %10s\n", "FAILED");
            continue;
        }
        s_print_number (10, "%.3f", s_rate (result) / 1e6);
        s_print_number (9, "%.1f", s_latency_us (result, 0.50));
        s_print_number (9, "%.1f", s_latency_us (result, 0.99));
        printf (" %7llu", (unsigned long long) result->calls);
        if (s_exist_is_kvpool (row) && !s_exist_is_prefix (row))
            s_print_number (7, "%.2fx", s_rate (result) / redis_rate);
        printf ("\n");
    }
    //  The prefix rows side by side: one PREFIX_MATCH against exist of the same keys and
    //  counting the leading whole blocks in the caller.
    static const int pairs[2][2] = {{EX_PREFIX_TCP, EX_COUNT_TCP},
                                    {EX_PREFIX_LOCAL, EX_COUNT_LOCAL}};
    for (int p = 0; p < 2; p++) {
        result_t *prefix = &self->exist[pairs[p][0]], *count = &self->exist[pairs[p][1]];
        if (prefix->reps == 0 || count->reps == 0 || prefix->failed || count->failed)
            continue;
        printf ("prefix match %dx2, %s: p50 %.1f us against %.1f us for exist + count: %.2fx "
                "faster\n",
                EXIST_KEYS, p ? "same-machine" : "tcp", s_latency_us (prefix, 0.50),
                s_latency_us (count, 0.50),
                s_latency_us (count, 0.50) / s_latency_us (prefix, 0.50));
    }
    fflush (stdout);
}

//  ---- summary -----------------------------------------------------------------------------

//  The kvpool/Redis ratios of the summary, for the kv section's verdict.
typedef struct {
    int cases, faster;
    double best, worst;
    char best_case[96], worst_case[96];
} s_tally_t;

static void
s_tally (s_tally_t *tally, double ratio, const char *op, const char *size, const char *batch,
         const char *path)
{
    if (isnan (ratio) || isinf (ratio))
        return;
    tally->cases++;
    tally->faster += ratio >= 1;
    if (isnan (tally->best) || ratio > tally->best) {
        tally->best = ratio;
        snprintf (tally->best_case, sizeof tally->best_case, "%s %s %s %s", op, size, batch, path);
    }
    if (isnan (tally->worst) || ratio < tally->worst) {
        tally->worst = ratio;
        snprintf (tally->worst_case, sizeof tally->worst_case, "%s %s %s %s", op, size, batch,
                  path);
    }
}

static void
s_print_summary (bench_t *self)
{
    printf ("\n== summary: kvpool / redis throughput (medians) ==\n");
    bool redis = self->use_redis, kvpool = self->use_kvpool;
    s_tally_t tally = {0, 0, NAN, NAN, "", ""};
    if (self->do_kv && redis && kvpool)
        for (int op = 0; op < OP_COUNT; op++)
            for (int s = 0; s < SIZE_COUNT; s++)
                for (int b = 0; b < 2; b++) {
                    const char *redis_api;
                    double redis_rate = s_redis_best (self, op, s, b, &redis_api);
                    for (int path = 0; path < PATH_REDIS; path++) {
                        if (op == OP_PUT && path == PATH_TCP_ZC)
                            continue;
                        double rate = s_rate (&self->kv[op][s][b][path]);
                        static const char *short_names[] = {"tcp", "tcp zero-copy", "same-machine"};
                        char ratio[32];
                        printf ("%s %s %s %s: kvpool %.3g GB/s, redis %.3g GB/s, ratio %s "
                                "(redis %s)\n",
                                s_op_names[op], s_size_names[s], b ? "batch32" : "single",
                                short_names[path], rate / 1e9, redis_rate / 1e9,
                                bench_ratio (rate / redis_rate, ratio, sizeof ratio), redis_api);
                        s_tally (&tally, rate / redis_rate, s_op_names[op], s_size_names[s],
                                 b ? "batch32" : "single", short_names[path]);
                    }
                }
    if (tally.cases) {
        char best[32], worst[32];
        bench_verdict ("kv",
                       "against Redis on the same machine, kvpool is faster in %d of %d cases "
                       "(best %s: %s), slower in %d (worst %s: %s)",
                       tally.faster, tally.cases, tally.best_case,
                       bench_ratio (tally.best, best, sizeof best), tally.cases - tally.faster,
                       tally.worst_case, bench_ratio (tally.worst, worst, sizeof worst));
    }
    if (self->do_exist && kvpool && redis) {
        double rate = s_rate (&self->exist[EX_KV_HIT]);
        double redis_rate = s_rate (&self->exist[EX_REDIS_PIPE]);
        char ratio[32], local_ratio[32];
        printf ("exist %d keys tcp: kvpool %.3g M keys/s, redis %.3g M keys/s (1000 pipelined "
                "EXISTS), ratio %s\n",
                EXIST_KEYS, rate / 1e6, redis_rate / 1e6,
                bench_ratio (rate / redis_rate, ratio, sizeof ratio));
        double local = s_rate (&self->exist[EX_LOCAL_HIT]);
        printf ("exist %d keys same-machine: kvpool %.3g M keys/s, redis %.3g M keys/s, ratio "
                "%s\n",
                EXIST_KEYS, local / 1e6, redis_rate / 1e6,
                bench_ratio (local / redis_rate, local_ratio, sizeof local_ratio));
        bench_verdict ("exist",
                       "%d keys a batch against Redis's 1000 pipelined EXISTS: tcp %s, "
                       "same machine %s",
                       EXIST_KEYS, ratio, local_ratio);
    }
    if (self->do_kv) {
        int s = 0, b = 0;
        printf ("get 4KiB single p50: kvpool tcp %.1f us, kvpool same-machine %.1f us, redis "
                "%.1f us\n",
                s_latency_us (&self->kv[OP_GET][s][b][PATH_TCP], 0.5),
                s_latency_us (&self->kv[OP_GET][s][b][PATH_LOCAL], 0.5),
                s_latency_us (&self->kv[OP_GET][s][b][PATH_REDIS], 0.5));
        //  The floor under the tcp figure: a ZeroMQ round trip with no kvpool in it.
        double floor = bench_floor_p50_us (bench_free_port (), self->reps, self->rep_seconds);
        self->floor_us = floor > 0 ? floor : 0;
        if (floor > 0)
            printf ("loopback floor: a bare libzmq DEALER -> ROUTER echo of 4 KiB, p50 %.1f us "
                    "(kvpool tcp get / floor: %.2f)\n",
                    floor, s_latency_us (&self->kv[OP_GET][s][b][PATH_TCP], 0.5) / floor);
        //  Under batched puts over tcp: what moving their bytes over loopback costs at all.
        result_t *batch_put = &self->kv[OP_PUT][1][1][PATH_TCP];
        double batch_floor = s_measured (batch_put)
                                 ? bench_floor_batch_p50_us (bench_free_port (), BATCH, s_sizes[1],
                                                             self->reps, self->rep_seconds)
                                 : -1;
        if (batch_floor > 0)
            printf ("loopback batch floor: a bare libzmq DEALER -> ROUTER send of %d x 64 KiB, "
                    "acknowledged, p50 %.1f us (kvpool tcp put batch / floor: %.2f)\n",
                    BATCH, batch_floor, s_latency_us (batch_put, 0.5) / batch_floor);
        if (!self->path_ok[PATH_LOCAL] && self->local_note[0])
            printf ("same-machine path: %s\n", self->local_note);
    }
    if (self->do_memcpy) {
        printf ("memcpy reference: %.3g GB/s (one thread, 32 x 1 MiB, pre-faulted; median of %d "
                "runs at the start and the end)\n",
                s_rate (&self->memcpy_result) / 1e9, self->memcpy_result.reps);
        bench_verdict ("memcpy",
                       "%.3g GB/s on one thread: the machine's copy rate, the "
                       "reference for the same-machine figures",
                       s_rate (&self->memcpy_result) / 1e9);
    }

    //  The goals kvpool's issues set; a figure that was not measured is shown as nan and
    //  counts as not met. Not met is a finding, not a failure of the run.
    printf ("\n== goals ==\n");
    if (self->do_kv) {
        int s = 2, b = 1; //  1 MiB, batch of 32
        const char *redis_api;
        double redis_rate = s_redis_best (self, OP_GET, s, b, &redis_api);
        double into = s_rate (&self->kv[OP_GET][s][b][PATH_TCP]) / redis_rate;
        double zero_copy = s_rate (&self->kv[OP_GET][s][b][PATH_TCP_ZC]) / redis_rate;
        double best = isnan (into) || zero_copy > into ? zero_copy : into;
        bench_goal (best >= 2,
                    "tcp loopback 1 MiB batched get >= 2x redis: %.2fx (kvpool_get_batch_into "
                    "%.2fx, kvpool_get_batch zero-copy %.2fx; redis %s %.2f GB/s)",
                    best, into, zero_copy, redis_api, redis_rate / 1e9);
        //  Redis moves large values faster one GET at a time than batched; say so, so the
        //  ratio above is not read as more than it is.
        double single = s_rate (&self->kv[OP_GET][s][0][PATH_REDIS]);
        if (single > redis_rate)
            printf (
                "     (against redis one GET per call, %.2f GB/s, its fastest form here: %.2fx)\n",
                single / 1e9, best * redis_rate / single);
        double local = s_rate (&self->kv[OP_GET][s][b][PATH_LOCAL]) / 1e9;
        bench_goal (local >= 12,
                    "same-machine 1 MiB batched get into a client buffer >= 12 GB/s: %.2f GB/s "
                    "(memcpy reference %.2f GB/s)",
                    local, s_rate (&self->memcpy_result) / 1e9);
        double p50 = s_latency_us (&self->kv[OP_GET][0][0][PATH_TCP], 0.5);
        double local_p50 = s_latency_us (&self->kv[OP_GET][0][0][PATH_LOCAL], 0.5);
        double redis_p50 = s_latency_us (&self->kv[OP_GET][0][0][PATH_REDIS], 0.5);
        bench_goal (local_p50 <= redis_p50,
                    "4 KiB get p50 <= redis p50, same machine (kvpool_get_into, read index): "
                    "kvpool %.1f us, redis %.1f us",
                    local_p50, redis_p50);
        bench_goal (p50 <= redis_p50,
                    "4 KiB get p50 <= redis p50, tcp loopback (one key per call): kvpool %.1f "
                    "us, redis %.1f us",
                    p50, redis_p50);
    }
    if (self->do_exist) {
        double rate = s_rate (&self->exist[EX_KV_HIT]) / 1e6;
        double local = s_rate (&self->exist[EX_LOCAL_HIT]) / 1e6;
        bench_goal (local >= 3,
                    "batch exist 1000 keys >= 3 M keys/s, same machine (read index): %.2f M "
                    "keys/s",
                    local);
        bench_goal (rate >= 3, "batch exist 1000 keys >= 3 M keys/s, tcp loopback: %.2f M keys/s",
                    rate);
    }
    fflush (stdout);
}

static void
s_free_results (bench_t *self)
{
    result_t *kv = &self->kv[0][0][0][0];
    for (size_t i = 0; i < sizeof self->kv / sizeof (result_t); i++)
        free (kv[i].latency.values);
    for (int row = 0; row < EX_COUNT; row++)
        free (self->exist[row].latency.values);
}

//  ---- options and main ------------------------------------------------------------------

static void
s_usage (FILE *out)
{
    fprintf (out,
             "Usage: kvpool-bench [OPTION...]\n"
             "Measures kvpool put/get/exist against Redis on this machine and prints tables,\n"
             "the kvpool/redis ratios and the targets. Starts kvpoold (from its own directory)\n"
             "and redis-server on loopback itself and stops them at the end.\n\n"
             "  --quick            few iterations (smoke test; well under a minute)\n"
             "  --only LIST        sections, comma-separated: memcpy, kv, exist, redis, lookup,\n"
             "                     tier, cluster, hotcache, master, kv-events, curve, latency,\n"
             "                     repair. 'repair': a master and three nodes, a node that\n"
             "                     holds 2-replica 1 MiB values killed; the repair rate beside\n"
             "                     the node-to-node bandwidth of the same run, as a ratio.\n"
             "                     'redis' adds the Redis side to kv and exist; 'redis' alone\n"
             "                     runs kv and exist on Redis only. 'tier' (eviction and the\n"
             "                     disk tier) starts kvpoolds of its own, with disk\n"
             "                     directories under /tmp.\n"
             "                     'master' drives a master of its own with 10 million keys\n"
             "                     (200000 with --quick; the master reaches about 2 GB).\n"
             "                     'kv-events': put throughput with KV events published,\n"
             "                     against none. 'curve': a kvpoold with CURVE beside a plain\n"
             "                     one, the client on tcp: 32 x 1 MiB batched gets and 4 KiB\n"
             "                     get latency, and the ratios curve/plain (certificates in a\n"
             "                     scratch directory under /tmp). 'latency': single 4 KiB\n"
             "                     ping, put, get and remove over tcp, in turn with a bare\n"
             "                     libzmq echo (the floor) and, with --compare, another\n"
             "                     build's kvpoold, in one loop. 'hotcache': a master and\n"
             "                     three nodes, node A's host hot cache off then on; 8 client\n"
             "                     processes on its machine read 256 KiB and 1 MiB values the\n"
             "                     other nodes hold, Zipf(s=1.0) keys: hit rate, p50, p99,\n"
             "                     throughput, master requests per get, the cache's memory.\n"
             "                     Default: all but cluster, hotcache, master, kv-events,\n"
             "                     curve, latency and repair\n"
             "  --repair-big       the repair section with 1 GiB of values (default 256 MiB,\n"
             "                     --quick 64 MiB)\n"
             "  --cluster          the sections that start clusters of their own: 'cluster' (a\n"
             "                     master and two nodes; reads and writes of values held by the\n"
             "                     other node, against iperf3 on loopback) and 'hotcache' (alone,\n"
             "                     the same as --only cluster,hotcache; with --only, added to\n"
             "                     its list)\n"
             "  --hotcache-keys N  keys of each value size in the hotcache section (default 2000\n"
             "                     of 256 KiB and 1000 of 1 MiB, --quick 200 and 100; the\n"
             "                     issue's scale is 20000, 25 GiB of values)\n"
             "  --hotcache-reads N timed gets a client process makes per value size in the\n"
             "                     hotcache section, after N/2 untimed (default 2000 of 256 KiB\n"
             "                     and 1000 of 1 MiB, --quick 200 and 100)\n"
             "  --hotcache-verify  the hotcache section checks every byte read (default: the\n"
             "                     first and last 8 of each value)\n"
             "  --endpoint EP      use an already-running kvpoold at EP (only the bench's own\n"
             "                     keys are removed)\n"
             "  --admin EP         its lookup/reset endpoint (for the lookup section)\n"
             "  --reps N           repetitions per measurement (default 5, quick 2)\n"
             "  --time-ms N        duration of one repetition (default 200, quick 20)\n"
             "  --kvpoold PATH     daemon to start, for every section (default: kvpoold next to\n"
             "                     this program)\n"
             "  --compare PATH     the latency section also runs the kvpoold at PATH (another\n"
             "                     build), in turn with the first, and gives the ratios\n"
             "  --redis-server PATH (default /usr/bin/redis-server)\n"
             "  --plot DIR         also draw the kv figures as PNG charts in DIR (gnuplot):\n"
             "                     throughput and p50 latency against value size, kvpool\n"
             "                     beside Redis, with the memcpy and loopback limits\n"
             "  --help             print this and exit\n");
}

static int
s_parse_only (bench_t *self, const char *list)
{
    bool kv = false, exist = false, redis = false, lookup = false, mem = false, tier = false,
         cluster = false, master = false, kv_events = false, curve = false, latency = false,
         hotcache = false, repair = false;
    char copy[256];
    snprintf (copy, sizeof copy, "%s", list);
    char *save = NULL;
    for (char *item = strtok_r (copy, ",", &save); item; item = strtok_r (NULL, ",", &save)) {
        if (!strcmp (item, "kv"))
            kv = true;
        else if (!strcmp (item, "exist"))
            exist = true;
        else if (!strcmp (item, "redis"))
            redis = true;
        else if (!strcmp (item, "lookup"))
            lookup = true;
        else if (!strcmp (item, "memcpy"))
            mem = true;
        else if (!strcmp (item, "tier"))
            tier = true;
        else if (!strcmp (item, "cluster"))
            cluster = true;
        else if (!strcmp (item, "hotcache"))
            hotcache = true;
        else if (!strcmp (item, "master"))
            master = true;
        else if (!strcmp (item, "kv-events"))
            kv_events = true;
        else if (!strcmp (item, "curve"))
            curve = true;
        else if (!strcmp (item, "latency"))
            latency = true;
        else if (!strcmp (item, "repair"))
            repair = true;
        else {
            fprintf (stderr,
                     "kvpool-bench: unknown section '%s' (memcpy, kv, exist, redis, "
                     "lookup, tier, cluster, hotcache, master, kv-events, curve, latency, "
                     "repair)\n",
                     item);
            return -1;
        }
    }
    self->use_kvpool = kv || exist || lookup;
    if (redis && !kv && !exist)
        kv = exist = true;
    self->do_kv = kv;
    self->do_exist = exist;
    self->do_lookup = lookup;
    self->do_memcpy = mem;
    self->do_tier = tier;
    self->do_cluster = cluster;
    self->do_master = master;
    self->do_hotcache = hotcache;
    self->do_kv_events = kv_events;
    self->do_curve = curve;
    self->do_latency = latency;
    self->do_repair = repair;
    self->use_redis = redis;
    return 0;
}

static int
s_parse_options (bench_t *self, int argc, char **argv)
{
    static const struct option options[] = {{"quick", no_argument, NULL, 'q'},
                                            {"only", required_argument, NULL, 'o'},
                                            {"endpoint", required_argument, NULL, 'e'},
                                            {"admin", required_argument, NULL, 'a'},
                                            {"reps", required_argument, NULL, 'r'},
                                            {"time-ms", required_argument, NULL, 't'},
                                            {"kvpoold", required_argument, NULL, 'k'},
                                            {"redis-server", required_argument, NULL, 's'},
                                            {"cluster", no_argument, NULL, 'c'},
                                            {"plot", required_argument, NULL, 'p'},
                                            {"compare", required_argument, NULL, 'C'},
                                            {"hotcache-keys", required_argument, NULL, 'K'},
                                            {"hotcache-reads", required_argument, NULL, 'R'},
                                            {"hotcache-verify", no_argument, NULL, 'V'},
                                            {"repair-big", no_argument, NULL, 'B'},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    const char *only = NULL;
    bool cluster = false;
    int reps = 0, time_ms = 0;
    int c;
    while ((c = getopt_long (argc, argv, "h", options, NULL)) != -1) {
        char *end;
        switch (c) {
            case 'q': self->quick = true; break;
            case 'o': only = optarg; break;
            case 'c': cluster = true; break;
            case 'e': self->endpoint_opt = optarg; break;
            case 'a': self->admin_opt = optarg; break;
            case 'r':
            case 't': {
                long value = strtol (optarg, &end, 10);
                long high = c == 'r' ? MAX_REPS / 2 : 60000;
                if (*end || value < 1 || value > high) {
                    fprintf (stderr, "kvpool-bench: --%s takes 1..%ld\n",
                             c == 'r' ? "reps" : "time-ms", high);
                    return 2;
                }
                if (c == 'r')
                    reps = (int) value;
                else
                    time_ms = (int) value;
                break;
            }
            case 'K':
            case 'R': {
                long long value = strtoll (optarg, &end, 10);
                if (*end || value < 1 || value > 100000000) {
                    fprintf (stderr, "kvpool-bench: --hotcache-%s takes 1..100000000\n",
                             c == 'K' ? "keys" : "reads");
                    return 2;
                }
                if (c == 'K')
                    self->hotcache_keys = (size_t) value;
                else
                    self->hotcache_reads = (size_t) value;
                break;
            }
            case 'V': self->hotcache_verify = true; break;
            case 'B': self->repair_big = true; break;
            case 'k': self->kvpoold_path = optarg; break;
            case 'C': self->compare_path = optarg; break;
            case 'p': self->plot_dir = optarg; break;
            case 's': self->redis_path = optarg; break;
            case 'h': s_usage (stdout); return 1;
            default: s_usage (stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf (stderr, "kvpool-bench: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    self->do_memcpy = self->do_kv = self->do_exist = self->do_lookup = self->do_tier = true;
    self->use_kvpool = self->use_redis = true;
    if (only && s_parse_only (self, only))
        return 2;
    if (cluster && !only && s_parse_only (self, "cluster,hotcache"))
        return 2;
    self->do_cluster = self->do_cluster || cluster;
    self->do_hotcache = self->do_hotcache || cluster;
    self->reps = reps ? reps : self->quick ? 2 : 5;
    self->rep_seconds = (time_ms ? time_ms : self->quick ? 20 : 200) / 1000.0;
    self->min_calls = 1;
    self->put_cap = self->quick ? 128ULL << 20 : 512ULL << 20;
    return 0;
}

//  --plot DIR: throughput and latency against value size, kvpool beside Redis, with the
//  memcpy and loopback limits measured in the same run (iperf3 is run for the loopback
//  bandwidth here). Returns 0 or -1.
static int
s_plot (bench_t *self)
{
    if (mkdir (self->plot_dir, 0755) != 0 && errno != EEXIST) {
        fprintf (stderr, "kvpool-bench: --plot %s: %s\n", self->plot_dir, strerror (errno));
        return -1;
    }
    fprintf (stderr, "kvpool-bench: plot: iperf3 for the loopback bandwidth\n");
    char note[512];
    bool failed = false;
    double loopback = bench_iperf3 (self->quick ? 1 : 3, note, sizeof note, &failed);
    if (isnan (loopback))
        fprintf (stderr, "kvpool-bench: plot: no loopback line: %s\n", note);
    static bench_plot_t plots[4];
    memset (plots, 0, sizeof plots);
    const char *names[4] = {"get-throughput", "put-throughput", "get-latency", "put-latency"};
    const char *titles[4] = {"get, batches of 32 values: throughput (higher is better)",
                             "put, batches of 32 values: throughput (higher is better)",
                             "get, one value a call: p50 latency (lower is better)",
                             "put, one value a call: p50 latency (lower is better)"};
    for (int k = 0; k < 4; k++) {
        bench_plot_t *plot = &plots[k];
        int op = k % 2 == 0 ? OP_GET : OP_PUT;
        bool latency = k >= 2;
        int b = latency ? 0 : 1;
        plot->name = names[k];
        plot->title = titles[k];
        plot->xlabel = "value size";
        plot->ylabel = latency ? "p50 latency (us)" : "GB/s";
        plot->points = SIZE_COUNT;
        for (int s = 0; s < SIZE_COUNT; s++)
            plot->x[s] = (double) s_sizes[s];
        static const int paths[] = {PATH_TCP, PATH_TCP_ZC, PATH_LOCAL};
        static const char *path_titles[] = {"kvpool tcp", "kvpool tcp, zero-copy get",
                                            "kvpool same-machine"};
        for (int p = 0; p < 3; p++) {
            if (op == OP_PUT && paths[p] == PATH_TCP_ZC)
                continue;
            bench_plot_series_t *series = &plot->series[plot->series_count++];
            series->title = path_titles[p];
            for (int s = 0; s < SIZE_COUNT; s++) {
                result_t *result = &self->kv[op][s][b][paths[p]];
                series->y[s] = result->reps == 0 || result->failed ? NAN
                               : latency                           ? s_latency_us (result, 0.5)
                                                                   : s_rate (result) / 1e9;
            }
        }
        if (self->use_redis) {
            bench_plot_series_t *series = &plot->series[plot->series_count++];
            series->title = latency ? "redis" : "redis (its faster batched form)";
            for (int s = 0; s < SIZE_COUNT; s++) {
                result_t *redis = &self->kv[op][s][b][PATH_REDIS];
                series->y[s] = latency ? (redis->reps ? s_latency_us (redis, 0.5) : NAN)
                                       : s_redis_best (self, op, s, b, NULL) / 1e9;
            }
        }
        if (latency)
            plot->references[plot->reference_count++] =
                (bench_plot_reference_t){"loopback floor: a bare libzmq echo of 4 KiB",
                                         self->floor_us > 0 ? self->floor_us : NAN};
        else {
            plot->references[plot->reference_count++] = (bench_plot_reference_t){
                "memcpy, one thread",
                self->memcpy_result.reps ? s_rate (&self->memcpy_result) / 1e9 : NAN};
            plot->references[plot->reference_count++] =
                (bench_plot_reference_t){self->quick   ? "loopback tcp (iperf3, 1 s: rough)"
                                         : self->quick ? "loopback tcp (iperf3, 1 s: rough)"
                                                       : "loopback tcp (iperf3)",
                                         loopback / 1e9};
        }
    }
    char why[512];
    if (bench_plot_write (self->plot_dir, plots, 4, why, sizeof why) != 0) {
        fprintf (stderr, "kvpool-bench: --plot: %s\n", why);
        return -1;
    }
    printf ("\nplots: %s/{get,put}-{throughput,latency}.png (data: *.dat, script: plots.gp)\n",
            self->plot_dir);
    return 0;
}

//  kvpoold lives next to this program: the directory of argv[0], or of /proc/self/exe when
//  argv[0] was found on PATH.
static void
s_find_kvpoold (bench_t *self, const char *argv0)
{
    char dir[PATH_MAX];
    if (strchr (argv0, '/'))
        snprintf (dir, sizeof dir, "%s", argv0);
    else {
        ssize_t length = readlink ("/proc/self/exe", dir, sizeof dir - 1);
        dir[length > 0 ? length : 0] = 0;
    }
    char *slash = strrchr (dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf (dir, sizeof dir, ".");
    snprintf (self->kvpoold_default, sizeof self->kvpoold_default, "%s/kvpoold", dir);
}

static int
s_alloc_buffers (bench_t *self)
{
    for (int i = 0; i < BATCH; i++) {
        self->src[i] = mmap (NULL, MAX_VALUE, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        self->dst[i] = mmap (NULL, MAX_VALUE, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (self->src[i] == MAP_FAILED || self->dst[i] == MAP_FAILED) {
            fprintf (stderr, "kvpool-bench: out of memory for buffers\n");
            return -1;
        }
        bench_fill (self->src[i], MAX_VALUE, (uint64_t) i);
        memset (self->dst[i], 0, MAX_VALUE);
    }
    return 0;
}

static void
s_connect_kvpool (bench_t *self)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = RPC_TIMEOUT_MS;
    options.connect_timeout_ms = 5000;
    options.fast_path = 0;
    options.keep_endpoint = 1; //  these are the tcp figures
    self->tcp = kvpool_connect (self->endpoint, &options);
    if (!self->tcp) {
        fprintf (stderr, "kvpool-bench: cannot connect to kvpoold at %s\n", self->endpoint);
        self->errors++;
        return;
    }
    if (kvpool_fast_path (self->tcp)) {
        fprintf (stderr, "kvpool-bench: fast_path = 0 was ignored; the tcp figures would be "
                         "wrong\n");
        self->errors++;
        kvpool_destroy (&self->tcp);
        return;
    }
    self->path_ok[PATH_TCP] = self->path_ok[PATH_TCP_ZC] = true;

    options.fast_path = 1;
    options.keep_endpoint = 0;
    self->local = kvpool_connect (self->endpoint, &options);
    if (self->local && kvpool_fast_path (self->local))
        self->path_ok[PATH_LOCAL] = true;
    else {
        snprintf (self->local_note, sizeof self->local_note,
                  "fast path unavailable (%s); same-machine rows not measured",
                  self->local ? "the library did not enable it" : "connect failed");
        fprintf (stderr, "kvpool-bench: %s\n", self->local_note);
    }
}

int
main (int argc, char **argv)
{
    //  As the header asks of a client that receives large values over tcp.
    kvpool_tune_malloc ();
    bench_t *self = calloc (1, sizeof *self);
    if (!self)
        return 1;
    int rc = s_parse_options (self, argc, argv);
    if (rc) {
        free (self);
        return rc == 1 ? 0 : 2;
    }
    s_find_kvpoold (self, argv[0]);
    if (!self->kvpoold_path)
        self->kvpoold_path = self->kvpoold_default;
    if (!self->redis_path)
        self->redis_path = "/usr/bin/redis-server";
    snprintf (self->prefix, sizeof self->prefix, "bench-%d/", (int) getpid ());
    signal (SIGINT, bench_on_signal);
    signal (SIGTERM, bench_on_signal);
    signal (SIGPIPE, SIG_IGN);
    setvbuf (stdout, NULL, _IOLBF, 0);

    printf ("kvpool-bench%s: %d runs of %.0f ms per measurement\n", self->quick ? " --quick" : "",
            self->reps, self->rep_seconds * 1000);
    char machine[256];
    bench_machine (machine, sizeof machine);
    printf ("machine: %s\n", machine);
    //  The verdicts go first: the tables they come from are kept aside until the end.
    bench_detail_begin ();
    bool data = self->do_memcpy || self->do_kv || self->do_exist;
    if (data && s_alloc_buffers (self)) {
        bench_detail_end ();
        free (self);
        return 1;
    }
    if (self->do_memcpy)
        s_section_memcpy (self);

    if (self->use_kvpool) {
        if (self->endpoint_opt) {
            snprintf (self->endpoint, sizeof self->endpoint, "%s", self->endpoint_opt);
            if (self->admin_opt)
                snprintf (self->admin, sizeof self->admin, "%s", self->admin_opt);
        }
        else if (s_kvpoold_start (self))
            self->errors++;
        if (self->endpoint[0]) {
            printf ("kvpoold: %s (admin %s)%s\n", self->endpoint,
                    self->admin[0] ? self->admin : "none",
                    self->kvpoold.pid > 0 ? ", started by the bench" : "");
            s_connect_kvpool (self);
        }
    }
    if (self->use_redis && (self->do_kv || self->do_exist)) {
        if (s_redis_start (self) == 0) {
            self->path_ok[PATH_REDIS] = self->path_ok[PATH_REDIS_PIPE] = true;
            printf ("redis-server: 127.0.0.1:%d, started by the bench\n", self->redis_port);
        }
        else
            self->errors++;
    }

    if (self->do_kv)
        s_section_kv (self);
    if (self->do_exist)
        s_section_exist (self);
    if (self->do_memcpy && (self->do_kv || self->do_exist))
        s_memcpy_reps (self);
    if (data)
        s_print_summary (self);
    if (data && self->plot_dir && self->do_kv && s_plot (self) != 0)
        self->errors++;

    if (self->do_lookup) {
        if (!self->endpoint[0] || !self->admin[0]) {
            printf ("\nlookup: skipped (no %s endpoint)\n",
                    self->endpoint[0] ? "admin" : "kvpoold");
            self->errors += self->endpoint_opt ? 0 : 1;
        }
        else {
            fprintf (stderr, "kvpool-bench: lookup\n");
            if (self->path_ok[PATH_TCP] && self->kvpoold.pid > 0)
                s_kvpool_clean (self);
            if (bench_lookup_run (self->endpoint, self->admin, self->quick) != 0) {
                fprintf (stderr, "kvpool-bench: the lookup section failed\n");
                self->errors++;
            }
        }
    }

    kvpool_destroy (&self->tcp);
    kvpool_destroy (&self->local);
    if (self->redis)
        redisFree (self->redis);
    if (self->redis_pid > 0) {
        bench_stop (self->redis_pid);
        if (!self->errors)
            unlink (self->redis_log);
    }
    if (self->kvpoold.pid > 0 && bench_kvpoold_stop (&self->kvpoold, self->errors > 0) != 0)
        self->errors++;

    //  Last, with the main servers gone: it starts kvpoolds of its own.
    if (self->do_tier) {
        fprintf (stderr, "kvpool-bench: tier\n");
        if (bench_tier_run (self->kvpoold_path, self->quick) != 0) {
            fprintf (stderr, "kvpool-bench: the tier section failed\n");
            self->errors++;
        }
    }
    //  Each starts a cluster of its own, one after the other.
    if (self->do_cluster
        && bench_cluster_run (self->kvpoold_path, self->quick, self->reps, self->rep_seconds)
               != 0) {
        fprintf (stderr, "kvpool-bench: the cluster section failed\n");
        self->errors++;
    }
    if (self->do_hotcache
        && bench_hotcache_run (self->kvpoold_path, self->quick, self->hotcache_keys,
                               self->hotcache_reads, self->hotcache_verify)
               != 0) {
        fprintf (stderr, "kvpool-bench: the hotcache section failed\n");
        self->errors++;
    }
    if (self->do_repair
        && bench_repair_run (self->kvpoold_path, self->quick, self->repair_big, self->reps,
                             self->rep_seconds)
               != 0) {
        fprintf (stderr, "kvpool-bench: the repair section failed\n");
        self->errors++;
    }
    if (self->do_master && bench_master_run (self->kvpoold_path, self->quick) != 0) {
        fprintf (stderr, "kvpool-bench: the master section failed\n");
        self->errors++;
    }
    if (self->do_kv_events && bench_kv_events_run (self->kvpoold_path, self->quick) != 0) {
        fprintf (stderr, "kvpool-bench: the kv-events section failed\n");
        self->errors++;
    }
    if (self->do_curve
        && bench_curve_run (self->kvpoold_path, self->quick, self->reps, self->rep_seconds) != 0) {
        fprintf (stderr, "kvpool-bench: the curve section failed\n");
        self->errors++;
    }
    if (self->do_latency
        && bench_latency_run (self->kvpoold_path, self->compare_path, self->quick, self->reps,
                              self->rep_seconds)
               != 0) {
        fprintf (stderr, "kvpool-bench: the latency section failed\n");
        self->errors++;
    }
    for (int i = 0; i < BATCH; i++) {
        if (self->src[i] && self->src[i] != MAP_FAILED)
            munmap (self->src[i], MAX_VALUE);
        if (self->dst[i] && self->dst[i] != MAP_FAILED)
            munmap (self->dst[i], MAX_VALUE);
    }
    s_free_results (self);
    bench_detail_end ();
    int errors = self->errors;
    if (errors)
        fprintf (stderr, "kvpool-bench: %d error(s); see above%s%s%s%s\n", errors,
                 self->kvpoold.log[0] ? "; kvpoold log " : "", self->kvpoold.log,
                 self->redis_pid > 0 ? "; redis log " : "",
                 self->redis_pid > 0 ? self->redis_log : "");
    free (self);
    return errors ? 1 : 0;
}
