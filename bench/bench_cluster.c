/*  bench_cluster.c - the cluster section of kvpool-bench (see bench.h): what a value costs
    when it lives on another node.

    A master (kvpoold --role master --placement local-first) and two nodes (--role node),
    each with its own --host-id, so that no client and no node takes the same-machine
    shared-memory path to the other: every byte between them crosses loopback tcp, as it
    would cross the network between machines. libkvpool connects to node 1 over tcp (fast
    path off, as the main bench's tcp rows), batches of 32 keys:

      get, remote   kvpool_get_batch_into through node 1 of values held by node 2: node 1
                    locates them at the master and reads them from node 2's data plane
                    (--peer-endpoint), then sends them on
      put, remote   kvpool_put_batch through node 1 with preferred_segments = node 2's id
                    (in a cluster the preferred "segments" are node ids): node 1 places the
                    keys at the master, writes them to node 2, commits
    and, for reference, the same calls through node 2 itself (values held there: one tcp
    hop, no data plane). The get values are put through node 2 (local-first puts them on the
    writer's node); where every key is held is checked with LOCATE (the client protocol's
    op, sent on a raw DEALER with the generated codec) and with each node's STATS objects
    count, before and after the measurements: node 1 never holds one.

    The ceiling is loopback tcp itself: `iperf3 -c 127.0.0.1 -t 3 -J` (-t 1 with quick), one
    stream, against `iperf3 -s -1` (a child), end.sum_received.bits_per_second of its JSON.
    Full runs measure it before and after the kvpool figures and compare against the higher
    (the stricter reference on a noisy machine); each kvpool figure is printed as a share of
    it. Without iperf3 the shares are left out (noted, not failed).

    Method as the main bench's: reps repetitions of at least rep_seconds each (at least one
    call), interleaved across the rows, the median reported. Puts stop at a byte cap a
    repetition, and their keys are removed (through the same node, forced) after it, so
    node 2 never nears its watermark. Checks: every status and size; each get repetition
    (quick: the first only) starts with an untimed call into zeroed buffers compared byte for
    byte; after each put repetition (quick: the first only) LOCATE of all its keys names
    node 2 alone, the first and last values read back through node 1 and compare, and the
    STATS counts agree before and after the removal. A failed check fails the section.

    Checksums: values are hashed as they arrive and verified between nodes by default
    (--verify-checksums on). Each repetition also runs the two remote rows at 1 MiB with the
    checks off on both nodes (CONFIG at run time, on their ipc endpoints), interleaved with
    the rest, and the section prints on against off (target: at least 0.95 of off).
*/
#include "bench/bench.h"
#include "kvpool.h"
#include "protocol/kvpool.pb-c.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zmq.h>

#define MiB (1ULL << 20)
#define BATCH 32
#define MAX_REPS 32
#define KEY_MAX 96
#define RPC_TIMEOUT_MS 60000
#define RAW_TIMEOUT_MS 10000
#define LOCATE_CHUNK 1000
#define TARGET_SHARE 0.85 //  remote get, 1 MiB, batched, of iperf3's loopback bandwidth

#define SIZE_COUNT 3
static const size_t s_sizes[SIZE_COUNT] = {64 << 10, 1 << 20, 4 << 20};
static const char *s_size_names[SIZE_COUNT] = {"64KiB", "1MiB", "4MiB"};
#define TARGET_SIZE 1 //  1 MiB

enum { ROW_GET_REMOTE, ROW_GET_LOCAL, ROW_PUT_REMOTE, ROW_PUT_LOCAL, ROW_COUNT };
static const char *s_row_ops[ROW_COUNT] = {"get", "get", "put", "put"};
static const char *s_row_names[ROW_COUNT] = {
    "remote: via node 1, held by node 2", "local: via node 2, held there",
    "remote: via node 1, placed on node 2", "local: via node 2, placed there"};
static const char *s_row_tags[ROW_COUNT] = {"get-remote", "get-local", "put-remote", "put-local"};

//  Node 1 is the client's; node 2 holds the values.
#define NODE_1 0
#define NODE_2 1
static const char *s_node_ids[2] = {"bench-n1", "bench-n2"};
static const char *s_host_ids[2] = {"bench-h1", "bench-h2"};

typedef struct {
    const char *kvpoold_path;
    bool no_cache; //  the nodes take --hot-cache-size 0 (a previous build may not know it)
    bool quick;
    int reps;
    double rep_seconds;
    uint64_t put_cap; //  bytes a put repetition writes at most (whole batches, at least one)

    bench_kvpoold_t master, node[2];
    kvpool_t *client[2]; //  libkvpool over tcp to each node
    void *zmq;           //  the raw DEALERs' context
    void *raw[2];        //  raw DEALERs to each node's client endpoint (LOCATE, NODES)
    uint64_t request_id;

    uint8_t *src[SIZE_COUNT][BATCH]; //  the values of batch position i, per size
    uint8_t *dst[BATCH];
    char names[LOCATE_CHUNK][KEY_MAX];
    const char *keys[LOCATE_CHUNK];

    double rate[SIZE_COUNT][ROW_COUNT][MAX_REPS]; //  bytes per second of the calls' time
    //  The remote rows at 1 MiB again with --verify-checksums off on both nodes, in the same
    //  repetitions (interleaved): [0] get, [1] put
    double rate_off[2][MAX_REPS];
    int done_off[2];
    kvpool_t *admin[2];              //  libkvpool on each node's ipc endpoint, for CONFIG
    int done[SIZE_COUNT][ROW_COUNT]; //  repetitions measured
    uint64_t calls[SIZE_COUNT][ROW_COUNT];
    double iperf[2]; //  loopback bytes per second (NAN: not measured)
    int iperf_runs;
    char iperf_note[160]; //  why there is no loopback figure
    int errors;
} cluster_t;

static void
s_fail (cluster_t *self, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    fprintf (stderr, "kvpool-bench: cluster: ");
    vfprintf (stderr, format, args);
    fprintf (stderr, "\n");
    va_end (args);
    self->errors++;
}

static void *
s_buffer (size_t size)
{
    void *buffer = mmap (NULL, size, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return buffer == MAP_FAILED ? NULL : buffer;
}

static uint64_t
s_seed (int size_index, int position)
{
    return (3ULL << 40) + (uint64_t) size_index * BATCH + (uint64_t) position;
}

static void
s_get_key (char *key, int size_index, int position)
{
    snprintf (key, KEY_MAX, "cluster-get-%s-%02d", s_size_names[size_index], position);
}

static void
s_put_key (char *key, int row, int size_index, int rep, size_t index)
{
    snprintf (key, KEY_MAX, "cluster-%s-%s-r%d-%06zu", s_row_tags[row], s_size_names[size_index],
              rep, index);
}

//  ---- the raw client protocol: LOCATE and NODES -------------------------------------

//  One request to node's client endpoint: frame 0 a Request, no value frames. Returns the
//  decoded Reply (the caller frees it with kvpool__v1__reply__free_unpacked), or NULL.
static Kvpool__V1__Reply *
s_raw_call (cluster_t *self, int node, Kvpool__V1__Op op, size_t n, const char *const *keys)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    ProtobufCBinaryData *wire = (ProtobufCBinaryData *) calloc (n ? n : 1, sizeof *wire);
    if (!wire)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        wire[i].data = (uint8_t *) keys[i];
        wire[i].len = strlen (keys[i]);
    }
    request.version = KVPOOL_PROTOCOL_VERSION;
    request.request_id = ++self->request_id;
    request.op = op;
    request.keys = wire;
    request.n_keys = n;
    size_t size = kvpool__v1__request__get_packed_size (&request);
    uint8_t *packed = (uint8_t *) malloc (size ? size : 1);
    Kvpool__V1__Reply *reply = NULL;
    if (packed) {
        kvpool__v1__request__pack (&request, packed);
        if (zmq_send (self->raw[node], packed, size, 0) == (int) size) {
            zmq_msg_t frame;
            zmq_msg_init (&frame);
            if (zmq_msg_recv (&frame, self->raw[node], 0) >= 0) {
                reply = kvpool__v1__reply__unpack (NULL, zmq_msg_size (&frame),
                                                   (const uint8_t *) zmq_msg_data (&frame));
                //  Value frames, were there any, are not this op's.
                while (zmq_msg_more (&frame) && zmq_msg_recv (&frame, self->raw[node], 0) >= 0)
                    ;
            }
            zmq_msg_close (&frame);
        }
    }
    free (packed);
    free (wire);
    if (reply && reply->request_id != request.request_id) {
        kvpool__v1__reply__free_unpacked (reply, NULL);
        reply = NULL;
    }
    if (!reply)
        s_fail (self, "no reply from node %d (%s) to a raw request: %s", node + 1,
                self->node[node].endpoint, zmq_strerror (zmq_errno ()));
    return reply;
}

//  Sets --verify-checksums on both nodes (CONFIG, which a node takes only on its ipc
//  endpoint: PING names it). Returns 0 or -1.
static int
s_set_verify (cluster_t *self, bool on)
{
    for (int node = 0; node < 2; node++) {
        if (!self->admin[node]) {
            Kvpool__V1__Reply *ping = s_raw_call (self, node, KVPOOL__V1__OP__PING, 0, NULL);
            if (!ping)
                return -1;
            kvpool_options_t options;
            kvpool_options_init (&options);
            options.timeout_ms = RPC_TIMEOUT_MS;
            options.fast_path = 0;
            options.keep_endpoint = 1;
            self->admin[node] = kvpool_connect (ping->local_endpoint, &options);
            kvpool__v1__reply__free_unpacked (ping, NULL);
            if (!self->admin[node]) {
                s_fail (self, "cannot connect to node %d's ipc endpoint", node + 1);
                return -1;
            }
        }
        char out[64];
        int rc = kvpool_config (self->admin[node], "verify-checksums", on ? "on" : "off", out,
                                sizeof out);
        if (rc != KVPOOL_OK || strcmp (out, on ? "on" : "off")) {
            s_fail (self, "verify-checksums %s on node %d: %s: %s", on ? "on" : "off", node + 1,
                    kvpool_status_name (rc), kvpool_last_error (self->admin[node]));
            return -1;
        }
    }
    return 0;
}

//  Whether both nodes are registered and alive, as the master tells node 1.
static bool
s_cluster_up (cluster_t *self)
{
    Kvpool__V1__Reply *reply = s_raw_call (self, NODE_1, KVPOOL__V1__OP__NODES, 0, NULL);
    if (!reply)
        return false;
    int alive = 0;
    for (size_t i = 0; reply->status == KVPOOL_OK && i < reply->n_nodes; i++)
        for (int node = 0; node < 2; node++)
            if (reply->nodes[i]->alive && reply->nodes[i]->capacity > 0
                && !strcmp (reply->nodes[i]->node_id, s_node_ids[node]))
                alive++;
    kvpool__v1__reply__free_unpacked (reply, NULL);
    return alive == 2;
}

//  LOCATE of keys[0..n) through node 1: every one must be held by node 2 alone. Returns 0
//  or -1.
static int
s_check_located (cluster_t *self, size_t n, const char *const *keys)
{
    for (size_t done = 0; done < n; done += LOCATE_CHUNK) {
        size_t count = n - done < LOCATE_CHUNK ? n - done : LOCATE_CHUNK;
        Kvpool__V1__Reply *reply =
            s_raw_call (self, NODE_1, KVPOOL__V1__OP__LOCATE, count, keys + done);
        if (!reply)
            return -1;
        int rc = 0;
        if (reply->status != KVPOOL_OK || reply->n_statuses != count
            || reply->n_locations != count) {
            s_fail (self, "LOCATE of %zu keys: %s (%s)", count, kvpool_status_name (reply->status),
                    reply->error ? reply->error : "");
            rc = -1;
        }
        for (size_t i = 0; rc == 0 && i < count; i++) {
            const Kvpool__V1__KeyNodes *where = reply->locations[i];
            const char *holder = where->n_nodes == 1 && where->nodes[0] < reply->n_nodes
                                     ? reply->nodes[where->nodes[0]]->node_id
                                     : NULL;
            if (reply->statuses[i] != KVPOOL_OK || !holder || strcmp (holder, s_node_ids[NODE_2])) {
                s_fail (self, "LOCATE %s: %s, %zu holders (%s), expected %s alone", keys[done + i],
                        kvpool_status_name (reply->statuses[i]), where->n_nodes,
                        holder ? holder : "-", s_node_ids[NODE_2]);
                rc = -1;
            }
        }
        kvpool__v1__reply__free_unpacked (reply, NULL);
        if (rc)
            return -1;
    }
    return 0;
}

//  The objects node holds (its STATS), or -1.
static int64_t
s_objects (cluster_t *self, int node)
{
    kvpool_stats_t stats;
    int rc = kvpool_stats (self->client[node], &stats);
    if (rc != KVPOOL_OK) {
        s_fail (self, "kvpool_stats of node %d: %s", node + 1, kvpool_status_name (rc));
        return -1;
    }
    return (int64_t) stats.objects;
}

//  Node 1 holds nothing, node 2 the get values and extra more. Returns 0 or -1.
static int
s_check_objects (cluster_t *self, uint64_t extra, const char *when)
{
    int64_t held[2] = {s_objects (self, NODE_1), s_objects (self, NODE_2)};
    int64_t expected = SIZE_COUNT * BATCH + (int64_t) extra;
    if (held[0] < 0 || held[1] < 0)
        return -1;
    if (held[0] != 0 || held[1] != expected) {
        s_fail (self,
                "%s: node 1 holds %" PRId64 " objects, node 2 %" PRId64 "; expected 0 and %" PRId64,
                when, held[0], held[1], expected);
        return -1;
    }
    return 0;
}

//  ---- the cluster -------------------------------------------------------------------

static kvpool_t *
s_connect (cluster_t *self, int node)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = RPC_TIMEOUT_MS;
    options.connect_timeout_ms = 5000;
    options.fast_path = 0;     //  the tcp path, as the main bench's tcp rows
    options.keep_endpoint = 1; //  and no move to the ipc endpoint
    kvpool_t *client = kvpool_connect (self->node[node].endpoint, &options);
    if (!client)
        s_fail (self, "cannot connect to node %d at %s", node + 1, self->node[node].endpoint);
    else if (kvpool_fast_path (client)) {
        s_fail (self, "fast_path = 0 was ignored; the figures would not be tcp's");
        kvpool_destroy (&client);
    }
    return client;
}

static int
s_start (cluster_t *self)
{
    const char *master_args[] = {"--role",      "master",      "--master", "tcp://127.0.0.1:*",
                                 "--placement", "local-first", "--seed",   "1",
                                 NULL};
    self->no_cache = bench_kvpoold_takes (self->kvpoold_path, "--hot-cache-size");
    if (bench_kvpoold_start (&self->master, self->kvpoold_path, "cluster-master", master_args)) {
        self->errors++;
        return -1;
    }
    for (int node = 0; node < 2; node++) {
        const char *args[] = {"--role", "node", "--master", self->master.endpoint, "--host-id",
                              s_host_ids[node], "--node-id", s_node_ids[node], "--segment-size",
                              "1GiB", "--heartbeat-interval", "200",
                              //  (the data path, each read moving its value: the hot cache
                              //  has its own section, --only hotcache)
                              self->no_cache ? "--hot-cache-size" : NULL, "0", NULL};
        if (bench_kvpoold_start (&self->node[node], self->kvpoold_path,
                                 node == NODE_1 ? "cluster-node1" : "cluster-node2", args)) {
            self->errors++;
            return -1;
        }
    }
    self->zmq = zmq_ctx_new ();
    for (int node = 0; node < 2; node++) {
        if (!(self->client[node] = s_connect (self, node)))
            return -1;
        int timeout = RAW_TIMEOUT_MS, linger = 0;
        self->raw[node] = self->zmq ? zmq_socket (self->zmq, ZMQ_DEALER) : NULL;
        if (!self->raw[node]
            || zmq_setsockopt (self->raw[node], ZMQ_RCVTIMEO, &timeout, sizeof timeout)
            || zmq_setsockopt (self->raw[node], ZMQ_SNDTIMEO, &timeout, sizeof timeout)
            || zmq_setsockopt (self->raw[node], ZMQ_LINGER, &linger, sizeof linger)
            || zmq_connect (self->raw[node], self->node[node].endpoint)) {
            s_fail (self, "raw DEALER to %s: %s", self->node[node].endpoint,
                    zmq_strerror (zmq_errno ()));
            return -1;
        }
    }
    //  A node serves once it has started; it joins at its first heartbeat.
    double deadline = bench_now () + 15;
    while (!s_cluster_up (self)) {
        if (self->errors || bench_now () > deadline) {
            s_fail (self, "the master does not list both nodes alive within 15 s");
            return -1;
        }
        bench_sleep_ms (50);
    }
    return 0;
}

static void
s_stop (cluster_t *self)
{
    for (int node = 0; node < 2; node++) {
        kvpool_destroy (&self->client[node]);
        kvpool_destroy (&self->admin[node]);
        if (self->raw[node])
            zmq_close (self->raw[node]);
        self->raw[node] = NULL;
    }
    if (self->zmq)
        zmq_ctx_term (self->zmq);
    self->zmq = NULL;
    bool keep = self->errors > 0;
    for (int node = 0; node < 2; node++)
        if (self->node[node].pid > 0 && bench_kvpoold_stop (&self->node[node], keep) != 0)
            self->errors++;
    if (self->master.pid > 0 && bench_kvpoold_stop (&self->master, keep) != 0)
        self->errors++;
    if (self->errors) {
        bench_kvpoold_t *all[3] = {&self->master, &self->node[0], &self->node[1]};
        for (int i = 0; i < 3; i++)
            if (all[i]->log[0])
                fprintf (stderr, "kvpool-bench: cluster: log kept: %s\n", all[i]->log);
    }
}

//  The get values: BATCH keys of each size, put through node 2 (local-first: held there).
static int
s_fill (cluster_t *self)
{
    int statuses[BATCH];
    size_t sizes[BATCH];
    const void *data[BATCH];
    for (int s = 0; s < SIZE_COUNT; s++) {
        for (int i = 0; i < BATCH; i++) {
            s_get_key (self->names[i], s, i);
            self->keys[i] = self->names[i];
            data[i] = self->src[s][i];
            sizes[i] = s_sizes[s];
        }
        int rc =
            kvpool_put_batch (self->client[NODE_2], BATCH, self->keys, data, sizes, NULL, statuses);
        for (int i = 0; i < BATCH && rc == KVPOOL_OK; i++)
            if (statuses[i] != KVPOOL_OK)
                rc = statuses[i];
        if (rc != KVPOOL_OK) {
            s_fail (self, "kvpool_put_batch of the %s get values through node 2: %s: %s",
                    s_size_names[s], kvpool_status_name (rc),
                    kvpool_last_error (self->client[NODE_2]));
            return -1;
        }
        if (s_check_located (self, BATCH, self->keys))
            return -1;
    }
    return s_check_objects (self, 0, "after the get values were put");
}

//  ---- iperf3 ------------------------------------------------------------------------

//  Loopback tcp by iperf3 (bench_iperf3): bytes per second, or NAN (the reason in
//  iperf_note; a failure to run it is a failure of the section, its absence is not).
static double
s_iperf3 (cluster_t *self, int seconds)
{
    bool failed = false;
    double rate = bench_iperf3 (seconds, self->iperf_note, sizeof self->iperf_note, &failed);
    if (failed) {
        s_fail (self, "%s", self->iperf_note);
        snprintf (self->iperf_note, sizeof self->iperf_note, "iperf3 failed (see stderr)");
    }
    return rate;
}

static void
s_measure_iperf3 (cluster_t *self, int seconds)
{
    fprintf (stderr, "kvpool-bench: cluster: iperf3, %d s\n", seconds);
    double rate = s_iperf3 (self, seconds);
    if (!isnan (rate))
        self->iperf[self->iperf_runs++] = rate;
}

//  ---- the measurements --------------------------------------------------------------

static int
s_get_run (cluster_t *self, int s, int row, int rep, bool verify, double *rate_p)
{
    kvpool_t *client = self->client[row == ROW_GET_REMOTE ? NODE_1 : NODE_2];
    size_t size = s_sizes[s];
    void *buffers[BATCH];
    size_t capacities[BATCH];
    int64_t results[BATCH];
    for (int i = 0; i < BATCH; i++) {
        s_get_key (self->names[i], s, i);
        self->keys[i] = self->names[i];
        buffers[i] = self->dst[i];
        capacities[i] = size;
    }
    int calls = verify ? -1 : 0; //  the first call of a verified run is untimed
    double busy = 0;
    while (calls < 1 || busy < self->rep_seconds) {
        if (calls < 0)
            for (int i = 0; i < BATCH; i++)
                memset (self->dst[i], 0, size);
        double start = bench_now ();
        int rc = kvpool_get_batch_into (client, BATCH, self->keys, buffers, capacities, results);
        double elapsed = bench_now () - start;
        for (int i = 0; i < BATCH && rc == KVPOOL_OK; i++)
            if (results[i] != (int64_t) size)
                rc = results[i] < 0 ? (int) results[i] : KVPOOL_INTERNAL_ERROR;
        if (rc != KVPOOL_OK) {
            s_fail (self, "kvpool_get_batch_into of 32 x %s (%s, rep %d): %s: %s", s_size_names[s],
                    s_row_names[row], rep + 1, kvpool_status_name (rc), kvpool_last_error (client));
            return -1;
        }
        if (calls < 0) {
            for (int i = 0; i < BATCH; i++)
                if (!bench_holds (self->dst[i], size, s_seed (s, i))) {
                    s_fail (self,
                            "kvpool_get_batch_into %s (%s): the value differs from what "
                            "was put",
                            self->keys[i], s_row_names[row]);
                    return -1;
                }
        }
        else
            busy += elapsed;
        calls++;
    }
    *rate_p = (double) calls * BATCH * size / busy;
    self->calls[s][row] += calls;
    return 0;
}

//  Names keys first .. first+n-1 of a put repetition in self->keys.
static void
s_put_names (cluster_t *self, int row, int s, int rep, size_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        s_put_key (self->names[i], row, s, rep, first + i);
        self->keys[i] = self->names[i];
    }
}

static int
s_put_verify (cluster_t *self, int row, int s, int rep, size_t count)
{
    for (size_t done = 0; done < count; done += LOCATE_CHUNK) {
        size_t n = count - done < LOCATE_CHUNK ? count - done : LOCATE_CHUNK;
        s_put_names (self, row, s, rep, done, n);
        if (s_check_located (self, n, self->keys))
            return -1;
    }
    //  The first and the last value, read back through node 1 (from node 2).
    size_t size = s_sizes[s];
    size_t check[2] = {0, count - 1};
    for (int c = 0; c < 2; c++) {
        s_put_names (self, row, s, rep, check[c], 1);
        memset (self->dst[0], 0, size);
        int64_t got = kvpool_get_into (self->client[NODE_1], self->keys[0], self->dst[0], size);
        if (got != (int64_t) size || memcmp (self->dst[0], self->src[s][check[c] % BATCH], size)) {
            s_fail (self, "kvpool_get_into %s after the put (%s): %s", self->keys[0],
                    s_row_names[row],
                    got < 0 ? kvpool_status_name ((int) got) : "the value differs");
            return -1;
        }
    }
    return s_check_objects (self, count, "after a put repetition");
}

static int
s_put_run (cluster_t *self, int s, int row, int rep, bool verify, double *rate_p)
{
    bool remote = row == ROW_PUT_REMOTE;
    kvpool_t *client = self->client[remote ? NODE_1 : NODE_2];
    const char *preferred[1] = {s_node_ids[NODE_2]};
    kvpool_put_options_t options = {
        .replica_num = 1, .preferred_segments = preferred, .preferred_segment_count = 1};
    size_t size = s_sizes[s];
    size_t sizes[BATCH];
    const void *data[BATCH];
    int statuses[BATCH];
    for (int i = 0; i < BATCH; i++) {
        sizes[i] = size;
        data[i] = self->src[s][i];
    }
    size_t count = 0;
    double busy = 0;
    while (count == 0 || (busy < self->rep_seconds && count * size < self->put_cap)) {
        s_put_names (self, row, s, rep, count, BATCH);
        double start = bench_now ();
        int rc = kvpool_put_batch (client, BATCH, self->keys, data, sizes, remote ? &options : NULL,
                                   statuses);
        busy += bench_now () - start;
        for (int i = 0; i < BATCH && rc == KVPOOL_OK; i++)
            if (statuses[i] != KVPOOL_OK)
                rc = statuses[i];
        if (rc != KVPOOL_OK) {
            s_fail (self, "kvpool_put_batch of 32 x %s (%s, rep %d): %s: %s", s_size_names[s],
                    s_row_names[row], rep + 1, kvpool_status_name (rc), kvpool_last_error (client));
            return -1;
        }
        count += BATCH;
    }
    *rate_p = (double) count * size / busy;
    self->calls[s][row] += count / BATCH;
    if (verify && s_put_verify (self, row, s, rep, count))
        return -1;
    //  Removed through the node that put them (the master tells node 2 to drop them).
    for (size_t done = 0; done < count; done += BATCH) {
        s_put_names (self, row, s, rep, done, BATCH);
        int rc = kvpool_remove_batch (client, BATCH, self->keys, true, statuses);
        for (int i = 0; i < BATCH && rc == KVPOOL_OK; i++)
            if (statuses[i] != KVPOOL_OK)
                rc = statuses[i];
        if (rc != KVPOOL_OK) {
            s_fail (self, "kvpool_remove_batch after the puts (%s): %s: %s", s_row_names[row],
                    kvpool_status_name (rc), kvpool_last_error (client));
            return -1;
        }
    }
    return verify ? s_check_objects (self, 0, "after the puts were removed") : 0;
}

//  ---- the table ---------------------------------------------------------------------

static double
s_loopback (cluster_t *self)
{
    double best = NAN;
    for (int i = 0; i < self->iperf_runs; i++)
        if (isnan (best) || self->iperf[i] > best)
            best = self->iperf[i];
    return best;
}

static void
s_print (cluster_t *self)
{
    double loopback = s_loopback (self);
    printf ("\n== cluster: a master and two nodes on loopback (host ids differ: every value "
            "between them crosses tcp), libkvpool over tcp to a node, batches of 32, median of "
            "%d runs ==\n",
            self->reps);
    printf ("master --placement local-first; nodes --segment-size 1GiB, --stripe-size 4MiB "
            "(default)%s; kvpoold %s\n",
            self->no_cache ? ", --hot-cache-size 0 (the data path; --only hotcache has the "
                             "cache)"
                           : "",
            self->kvpoold_path);
    if (self->iperf_runs) {
        printf ("loopback: iperf3 -c 127.0.0.1 -t %d -J, one stream: %.2f GB/s (%.1f Gbit/s)",
                self->quick ? 1 : 3, loopback / 1e9, loopback * 8 / 1e9);
        if (self->iperf_runs > 1) {
            printf (", the higher of %d runs (before and after the kvpool figures:",
                    self->iperf_runs);
            for (int i = 0; i < self->iperf_runs; i++)
                printf (" %.2f", self->iperf[i] / 1e9);
            printf (" GB/s)");
        }
        printf ("\n");
    }
    else
        printf ("loopback: not measured: %s; no ratios\n",
                self->iperf_note[0] ? self->iperf_note : "iperf3 not run");
    printf ("%-4s %-6s %-37s %8s %10s %8s %6s   %s\n", "op", "size", "path", "GB/s", "of iperf3",
            "of local", "calls", "runs (GB/s)");
    for (int op = 0; op < 2; op++)
        for (int s = 0; s < SIZE_COUNT; s++) {
            for (int r = op * 2; r < op * 2 + 2; r++) {
                int reps = self->done[s][r];
                printf ("%-4s %-6s %-37s", s_row_ops[r], s_size_names[s], s_row_names[r]);
                if (reps == 0) {
                    printf (" %8s\n", "FAILED");
                    continue;
                }
                double rate = bench_median (self->rate[s][r], reps);
                double local = bench_median (self->rate[s][op * 2 + 1], self->done[s][op * 2 + 1]);
                printf (" %8.3f", rate / 1e9);
                if (isnan (loopback))
                    printf (" %10s", "-");
                else
                    printf (" %10.2f", rate / loopback);
                if (r == op * 2 && !isnan (local))
                    printf (" %8.2f", rate / local);
                else
                    printf (" %8s", "");
                printf (" %6" PRIu64 "  ", self->calls[s][r]);
                for (int i = 0; i < reps; i++)
                    printf (" %.3f", self->rate[s][r][i] / 1e9);
                printf ("\n");
            }
        }
    //  What checking values end to end costs (--verify-checksums, on by default above).
    for (int op = 0; op < 2; op++) {
        int row = op ? ROW_PUT_REMOTE : ROW_GET_REMOTE;
        int on_reps = self->done[TARGET_SIZE][row], off_reps = self->done_off[op];
        if (!on_reps || !off_reps) {
            printf ("checksums: %s 1MiB remote: not measured (failed)\n", s_row_ops[row]);
            continue;
        }
        double on = bench_median (self->rate[TARGET_SIZE][row], on_reps);
        double off = bench_median (self->rate_off[op], off_reps);
        bench_goal (on / off >= 0.95,
                    "checksums: %s 1MiB remote, batched: on %.3f GB/s, off %.3f GB/s: %.3f of "
                    "off (goal >= 0.95)",
                    s_row_ops[row], on / 1e9, off / 1e9, on / off);
        printf ("  off runs (GB/s)");
        for (int i = 0; i < off_reps; i++)
            printf (" %.3f", self->rate_off[op][i] / 1e9);
        printf ("\n");
    }
    int reps = self->done[TARGET_SIZE][ROW_GET_REMOTE];
    double rate = bench_median (self->rate[TARGET_SIZE][ROW_GET_REMOTE], reps);
    if (reps == 0) {
        bench_goal (false, "remote get, 1 MiB, batched: not measured (failed) (goal >= %.2f)",
                    TARGET_SHARE);
        bench_verdict ("cluster", "remote gets failed: no figure");
    }
    else if (isnan (loopback)) {
        printf ("goal not measured: remote get, 1 MiB, batched: %.3f GB/s; no ratio: %s (goal >= "
                "%.2f of iperf3)\n",
                rate / 1e9, self->iperf_note, TARGET_SHARE);
        bench_verdict ("cluster", "remote get, 1 MiB batched, %.3f GB/s (no iperf3 to compare)",
                       rate / 1e9);
    }
    else {
        bench_goal (rate / loopback >= TARGET_SHARE,
                    "remote get, 1 MiB, batched: %.2f of iperf3 (goal >= %.2f; %.3f GB/s against "
                    "%.3f GB/s)",
                    rate / loopback, TARGET_SHARE, rate / 1e9, loopback / 1e9);
        bench_verdict ("cluster",
                       "a value held by the other node, 1 MiB batched: get at %.2f of iperf3's "
                       "single tcp stream (%.3f against %.3f GB/s)%s",
                       rate / loopback, rate / 1e9, loopback / 1e9,
                       self->quick ? "; --quick: iperf3 ran for a second, a rough figure" : "");
    }
}

//  ---- the section -------------------------------------------------------------------

int
bench_cluster_run (const char *kvpoold_path, bool quick, int reps, double rep_seconds)
{
    cluster_t *self = (cluster_t *) calloc (1, sizeof *self);
    if (!self)
        return -1;
    self->kvpoold_path = kvpoold_path;
    self->quick = quick;
    self->reps = reps < MAX_REPS ? reps : MAX_REPS;
    self->rep_seconds = rep_seconds;
    self->put_cap = quick ? 64 * MiB : 256 * MiB;
    double start = bench_now ();
    fprintf (stderr, "kvpool-bench: cluster\n");
    for (int i = 0; i < BATCH && !self->errors; i++) {
        self->dst[i] = (uint8_t *) s_buffer (4 * MiB);
        for (int s = 0; s < SIZE_COUNT; s++)
            if ((self->src[s][i] = (uint8_t *) s_buffer (s_sizes[s])))
                bench_fill (self->src[s][i], s_sizes[s], s_seed (s, i));
            else
                self->errors++;
        if (!self->dst[i])
            self->errors++;
    }
    if (self->errors)
        s_fail (self, "out of memory for buffers");
    else if (s_start (self) == 0 && s_fill (self) == 0) {
        s_measure_iperf3 (self, quick ? 1 : 3);
        for (int rep = 0; rep < self->reps && !self->errors; rep++) {
            bool verify = rep == 0 || !quick;
            for (int s = 0; s < SIZE_COUNT && !self->errors; s++)
                for (int r = 0; r < ROW_COUNT && !self->errors; r++) {
                    double *rate = &self->rate[s][r][rep];
                    int rc = r == ROW_GET_REMOTE || r == ROW_GET_LOCAL
                                 ? s_get_run (self, s, r, rep, verify, rate)
                                 : s_put_run (self, s, r, rep, verify, rate);
                    if (rc == 0)
                        self->done[s][r] = rep + 1;
                }
            //  The same remote rows at 1 MiB with the checks off, in the same repetition:
            //  what verification costs (the calls are counted with the rows').
            if (!self->errors && s_set_verify (self, false) == 0) {
                if (s_get_run (self, TARGET_SIZE, ROW_GET_REMOTE, rep, verify,
                               &self->rate_off[0][rep])
                    == 0)
                    self->done_off[0] = rep + 1;
                if (!self->errors
                    && s_put_run (self, TARGET_SIZE, ROW_PUT_REMOTE, rep, verify,
                                  &self->rate_off[1][rep])
                           == 0)
                    self->done_off[1] = rep + 1;
                s_set_verify (self, true);
            }
        }
        //  Node 1 kept no copy of what it read or wrote for its client.
        if (!self->errors)
            s_check_objects (self, 0, "at the end");
        if (!quick && !self->errors)
            s_measure_iperf3 (self, 3);
    }
    s_print (self);
    s_stop (self);
    for (int i = 0; i < BATCH; i++) {
        for (int s = 0; s < SIZE_COUNT; s++)
            if (self->src[s][i])
                munmap (self->src[s][i], s_sizes[s]);
        if (self->dst[i])
            munmap (self->dst[i], 4 * MiB);
    }
    printf ("cluster: %.1f s%s\n", bench_now () - start,
            self->errors ? ", with failures (see stderr)" : "");
    int rc = self->errors ? -1 : 0;
    free (self);
    return rc;
}
