/*  bench_master.c - the master section of kvpool-bench (see bench.h): how many objects and
    operations one cluster master carries.

    Masters of its own (kvpoold --role master --node-ttl 600000, so that no fake node
    expires while the bench runs; it also heartbeats them between phases), driven over the
    ROUTER by a DEALER that speaks the cluster protocol (protocol/cluster.proto, with the
    generated codec) as the nodes' membership and cluster actors do. There are no real nodes:
    the bench registers fake ones (REGISTER: node id, host id, endpoints nobody listens on,
    1 TiB capacity) and uses the epoch the master answers. Keys are 64 hex digits, as the
    block hashes vLLM names its KV blocks by; every key's size follows from its number.

    One master, one node:
      1. INVENTORY of 10 million keys (200000 with quick) in chunks of 10000, as a node
         reports what it holds after registering; the master's resident memory (VmRSS of
         /proc/PID/status) before and after gives the bytes an object costs.
      2. LOCATE of all of them in batches of 1000.
      3. LOCATE of one key a call, one call at a time: round trips per second, p50 and p99,
         beside a bare libzmq echo's round trip (bench_floor.c).
      4. INVENTORY of 1000 keys a request, and PLACE then COMMIT of 1000 keys a request (a
         put's two steps; the COMMIT names the nodes PLACE chose), on keys not yet known.
      5. The REGISTER of one more node, and a NODES request, with all those keys in the
         directory (each walks every entry).
    Then a fresh master for each placement, random (the default) and free-ratio, with 256
    nodes: PLACE+COMMIT (placement orders every live node for every key) and, for random,
    LOCATE (a reply describes every node it names) and the memory a put holds.
    Batched requests are pipelined, WINDOW in flight (several nodes ask at once in a real
    cluster); a phase's rate is its keys over its wall time. The master's CPU time (utime +
    stime of /proc/PID/stat) is read around each phase: with one thread, keys per CPU-second
    is what a master on a core of its own would do.

    Checks: every reply's status and every key's status; INVENTORY's count of keys added;
    LOCATE's sizes and holders; PLACE's one holder a key. A failed check fails the section.
    Memory: the bench keeps no list of keys (each is made again from its number), so it
    stays small at any count; the master holds about 140 bytes an object with its 64-byte
    key, 1.3 GiB at 10 million.
*/
#include "bench/bench.h"
#include "protocol/cluster.pb-c.h"

#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#define KEY_LEN 64            //  hex digits of a 32-byte hash
#define INVENTORY_CHUNK 10000 //  keys a node's INVENTORY carries (actors/membership.c)
#define BATCH 1000
#define WINDOW 4 //  batched requests in flight
#define MANY_NODES 256
#define TIMEOUT_MS 120000
#define PROTOCOL_VERSION 1
#define TARGET_BYTES 150 //  per object, besides its key
#define MAX_LATENCIES 2000000

typedef Kvpool__Cluster__V1__NodeRequest request_t;
typedef Kvpool__Cluster__V1__MasterReply reply_t;

enum {
    PHASE_FILL,       //  INVENTORY, chunks of 10000
    PHASE_LOCATE,     //  LOCATE of the fill's keys, batches of 1000
    PHASE_INVENTORY,  //  INVENTORY, batches of 1000
    PHASE_PLACE,      //  PLACE+COMMIT, one node
    PHASE_PLACE_MANY, //  PLACE+COMMIT, MANY_NODES nodes, random placement
    PHASE_LOCATE_MANY,
    PHASE_PLACE_FREE, //  PLACE+COMMIT, MANY_NODES nodes, free-ratio placement
    PHASE_COUNT
};
static const char *s_phase_names[PHASE_COUNT] = {
    "INVENTORY", "LOCATE", "INVENTORY", "PLACE+COMMIT", "PLACE+COMMIT", "LOCATE", "PLACE+COMMIT"};

typedef struct {
    size_t keys;
    size_t batch;
    size_t nodes;
    const char *placement;
    size_t objects; //  in the directory before the phase
    double seconds;
    double cpu; //  the master's CPU seconds meanwhile
    bool done;
} phase_t;

typedef struct {
    int kind;
    size_t first, count;
    uint64_t id;
} flight_t;

typedef struct {
    const char *kvpoold_path;
    bool quick;
    size_t fill_keys;  //  phase 1
    size_t extra_keys; //  each INVENTORY and PLACE+COMMIT phase's, but free-ratio's
    size_t free_keys;  //  PLACE+COMMIT with free-ratio placement over MANY_NODES nodes
    double single_seconds;

    bench_kvpoold_t master;
    const char *placement; //  the running master's
    size_t objects;        //  committed keys in its directory
    void *zmq, *dealer;
    uint64_t next_id, epoch;
    uint64_t *registrations; //  each fake node's, as REGISTER answered
    size_t nodes;            //  fake nodes registered
    Kvpool__Cluster__V1__Node node;
    char node_id[32], host_id[32], client_endpoint[64], peer_endpoint[64];
    char key_file[64]; //  the cluster key the master and the fake nodes share

    char (*names)[KEY_LEN + 1];
    ProtobufCBinaryData *wire;
    uint64_t *sizes;

    phase_t phases[PHASE_COUNT];
    uint64_t rss_start, rss_before, rss_filled, rss_located; //  bytes
    double single_rate, single_p50, single_p99, single_cpu;
    size_t single_calls;
    double floor_us;         //  p50 of a bare libzmq echo (bench_floor.c)
    double register_seconds; //  of a new node, with register_objects in the directory
    double nodes_seconds;    //  of a NODES request, as many objects
    size_t register_objects;
    uint64_t rss_place_before, rss_place_after; //  around PLACE+COMMIT on a fresh master
    int errors;
} master_t;

static void
s_fail (master_t *self, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    fprintf (stderr, "kvpool-bench: master: ");
    vfprintf (stderr, format, args);
    fprintf (stderr, "\n");
    va_end (args);
    self->errors++;
}

//  ---- keys, and the master's process ------------------------------------------------

static void
s_key (char *out, uint64_t index)
{
    static const char hex[] = "0123456789abcdef";
    for (int word = 0; word < 4; word++) {
        uint64_t bits = bench_mix (index * 4 + (uint64_t) word);
        for (int i = 0; i < 16; i++, bits >>= 4)
            out[word * 16 + i] = hex[bits & 15];
    }
    out[KEY_LEN] = 0;
}

static uint64_t
s_size (uint64_t index)
{
    return (1 + index % 16) * 65536;
}

//  VmRSS of the master, in bytes (0 when it cannot be read).
static uint64_t
s_rss (master_t *self)
{
    return bench_proc_status_bytes (self->master.pid, "VmRSS");
}

//  utime + stime of the master, in seconds (NAN when it cannot be read).
static double
s_cpu (master_t *self)
{
    char path[64], text[1024];
    snprintf (path, sizeof path, "/proc/%d/stat", (int) self->master.pid);
    FILE *file = fopen (path, "r");
    if (!file)
        return NAN;
    size_t length = fread (text, 1, sizeof text - 1, file);
    fclose (file);
    text[length] = 0;
    //  The name in parentheses may hold spaces: fields are counted from its closing one.
    char *at = strrchr (text, ')');
    unsigned long long utime, stime;
    if (!at
        || sscanf (at + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime)
               != 2)
        return NAN;
    return (double) (utime + stime) / (double) sysconf (_SC_CLK_TCK);
}

//  ---- the cluster protocol ----------------------------------------------------------

//  Sends request as the fake node `node`, with the next request id. Returns the id, or 0.
static uint64_t
s_send (master_t *self, request_t *request, size_t node)
{
    snprintf (self->node_id, sizeof self->node_id, "bench-node-%04zu", node);
    snprintf (self->host_id, sizeof self->host_id, "bench-host-%04zu", node);
    snprintf (self->client_endpoint, sizeof self->client_endpoint, "tcp://127.0.0.1:%zu",
              10000 + 2 * node);
    snprintf (self->peer_endpoint, sizeof self->peer_endpoint, "tcp://127.0.0.1:%zu",
              10001 + 2 * node);
    request->version = PROTOCOL_VERSION;
    request->request_id = ++self->next_id;
    request->node = &self->node;
    request->epoch = self->epoch;
    request->registration = self->registrations ? self->registrations[node] : 0;
    size_t size = kvpool__cluster__v1__node_request__get_packed_size (request);
    zmq_msg_t frame;
    if (zmq_msg_init_size (&frame, size) != 0) {
        s_fail (self, "out of memory for a request of %zu bytes", size);
        return 0;
    }
    kvpool__cluster__v1__node_request__pack (request, (uint8_t *) zmq_msg_data (&frame));
    if (zmq_msg_send (&frame, self->dealer, 0) < 0) {
        zmq_msg_close (&frame);
        s_fail (self, "send to the master: %s", zmq_strerror (zmq_errno ()));
        return 0;
    }
    return request->request_id;
}

//  The next reply, which must answer request id. NULL on failure (reported).
static reply_t *
s_recv (master_t *self, uint64_t id)
{
    zmq_msg_t frame;
    zmq_msg_init (&frame);
    reply_t *reply = NULL;
    if (zmq_msg_recv (&frame, self->dealer, 0) < 0)
        s_fail (self, "no reply from the master within %d s: %s", TIMEOUT_MS / 1000,
                zmq_strerror (zmq_errno ()));
    else if (!(reply = kvpool__cluster__v1__master_reply__unpack (NULL, zmq_msg_size (&frame),
                                                                  zmq_msg_data (&frame))))
        s_fail (self, "a reply that is not a MasterReply (%zu bytes)", zmq_msg_size (&frame));
    else if (reply->request_id != id) {
        s_fail (self, "reply to request %" PRIu64 ", expected %" PRIu64, reply->request_id, id);
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        reply = NULL;
    }
    zmq_msg_close (&frame);
    return reply;
}

static reply_t *
s_call (master_t *self, request_t *request, size_t node)
{
    uint64_t id = s_send (self, request, node);
    return id ? s_recv (self, id) : NULL;
}

//  REGISTER fake nodes until there are count; each gets 1 TiB. Returns 0 or -1.
static int
s_register (master_t *self, size_t count)
{
    for (size_t node = self->nodes; node < count; node++) {
        request_t request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        request.kind = KVPOOL__CLUSTER__V1__KIND__REGISTER;
        reply_t *reply = s_call (self, &request, node);
        if (!reply)
            return -1;
        int status = reply->status;
        if (status == 0 && !self->epoch)
            self->epoch = reply->epoch;
        uint64_t *grown =
            (uint64_t *) realloc (self->registrations, (node + 1) * sizeof (uint64_t));
        assert (grown);
        self->registrations = grown;
        self->registrations[node] = reply->registration;
        if (status != 0 || reply->epoch != self->epoch)
            s_fail (self, "REGISTER of %s: status %d (%s), epoch %" PRIu64, self->node_id, status,
                    reply->error ? reply->error : "", reply->epoch);
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        if (self->errors)
            return -1;
        self->nodes = node + 1;
    }
    return 0;
}

//  A HEARTBEAT of every fake node: the master hears from each, whatever the phase sends.
static int
s_heartbeat (master_t *self)
{
    for (size_t node = 0; node < self->nodes; node++) {
        request_t request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        request.kind = KVPOOL__CLUSTER__V1__KIND__HEARTBEAT;
        reply_t *reply = s_call (self, &request, node);
        if (!reply)
            return -1;
        if (reply->status != 0)
            s_fail (self, "HEARTBEAT of %s: status %d (%s)", self->node_id, reply->status,
                    reply->error ? reply->error : "");
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        if (self->errors)
            return -1;
    }
    return 0;
}

//  Keys first .. first+count-1 (and their sizes) into the request.
static void
s_keys (master_t *self, request_t *request, size_t first, size_t count, bool sizes)
{
    for (size_t i = 0; i < count; i++) {
        s_key (self->names[i], first + i);
        self->wire[i].data = (uint8_t *) self->names[i];
        self->wire[i].len = KEY_LEN;
        self->sizes[i] = s_size (first + i);
    }
    request->keys = self->wire;
    request->n_keys = count;
    request->sizes = sizes ? self->sizes : NULL;
    request->n_sizes = sizes ? count : 0;
}

//  Checks a reply to flight; for a PLACE, sends its COMMIT (into *commit_p). Returns 0 or -1.
static int
s_check (master_t *self, const flight_t *flight, reply_t *reply, flight_t *commit_p)
{
    size_t n = flight->count;
    const ProtobufCEnumValue *value =
        protobuf_c_enum_descriptor_get_value (&kvpool__cluster__v1__kind__descriptor, flight->kind);
    const char *kind = value ? value->name : "?";
    if (reply->status != 0) {
        s_fail (self, "%s of %zu keys: status %d (%s)", kind, n, reply->status,
                reply->error ? reply->error : "");
        return -1;
    }
    if (flight->kind == KVPOOL__CLUSTER__V1__KIND__INVENTORY) {
        if (reply->count != n) {
            s_fail (self, "INVENTORY of %zu new keys added %" PRIu64, n, reply->count);
            return -1;
        }
        return 0;
    }
    bool located = flight->kind == KVPOOL__CLUSTER__V1__KIND__LOCATE;
    bool placed = flight->kind == KVPOOL__CLUSTER__V1__KIND__PLACE;
    if (reply->n_statuses != n || (located && reply->n_sizes != n)
        || ((located || placed) && reply->n_holders != n)) {
        s_fail (self, "%s of %zu keys: %zu statuses, %zu sizes, %zu holder lists", kind, n,
                reply->n_statuses, reply->n_sizes, reply->n_holders);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        bool bad = reply->statuses[i] != 0;
        bad = bad || (located && reply->sizes[i] != s_size (flight->first + i));
        bad = bad
              || ((located || placed)
                  && (reply->holders[i]->n_nodes != 1
                      || reply->holders[i]->nodes[0] >= reply->n_nodes));
        if (bad) {
            char key[KEY_LEN + 1];
            s_key (key, flight->first + i);
            s_fail (self, "%s %s: status %d, size %" PRIu64 ", %zu holders", kind, key,
                    reply->statuses[i], located ? reply->sizes[i] : 0,
                    reply->n_holders > i ? reply->holders[i]->n_nodes : 0);
            return -1;
        }
    }
    if (!placed)
        return 0;
    //  The COMMIT names the nodes PLACE chose, as the writing node does once they hold the
    //  bytes: the reply's holder lists index its nodes, and the COMMIT's index its node ids.
    char *ids[MANY_NODES];
    if (reply->n_nodes > MANY_NODES) {
        s_fail (self, "PLACE names %zu nodes; %d are registered", reply->n_nodes, MANY_NODES);
        return -1;
    }
    for (size_t j = 0; j < reply->n_nodes; j++)
        ids[j] = reply->nodes[j]->node_id;
    request_t request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = KVPOOL__CLUSTER__V1__KIND__COMMIT;
    s_keys (self, &request, flight->first, n, false);
    request.holders = reply->holders;
    request.n_holders = n;
    request.nodes = ids;
    request.n_nodes = reply->n_nodes;
    request.tokens = reply->tokens; //  the master commits only the writes it placed
    request.n_tokens = reply->n_tokens;
    commit_p->kind = request.kind;
    commit_p->first = flight->first;
    commit_p->count = n;
    commit_p->id = s_send (self, &request, 0);
    return commit_p->id ? 0 : -1;
}

//  Keys first .. first+total-1 through `kind` requests of batch keys, WINDOW in flight; a
//  PLACE is followed by its COMMIT. Fills phase. Returns 0 or -1.
static int
s_pipeline (master_t *self, int kind, size_t first, size_t total, size_t batch, phase_t *phase)
{
    flight_t ring[WINDOW];
    size_t head = 0, inflight = 0, sent = 0;
    double cpu = s_cpu (self), start = bench_now ();
    while (sent < total || inflight > 0) {
        while (inflight < WINDOW && sent < total) {
            size_t n = total - sent < batch ? total - sent : batch;
            request_t request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
            request.kind = kind;
            s_keys (self, &request, first + sent, n,
                    kind == KVPOOL__CLUSTER__V1__KIND__INVENTORY
                        || kind == KVPOOL__CLUSTER__V1__KIND__PLACE);
            flight_t *flight = &ring[(head + inflight) % WINDOW];
            flight->kind = kind;
            flight->first = first + sent;
            flight->count = n;
            if (!(flight->id = s_send (self, &request, 0)))
                return -1;
            inflight++;
            sent += n;
        }
        flight_t done = ring[head];
        head = (head + 1) % WINDOW;
        inflight--;
        reply_t *reply = s_recv (self, done.id);
        if (!reply)
            return -1;
        flight_t commit = {0};
        int rc = s_check (self, &done, reply, &commit);
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        if (rc)
            return -1;
        if (commit.id)
            ring[(head + inflight++) % WINDOW] = commit;
    }
    phase->seconds = bench_now () - start;
    phase->cpu = s_cpu (self) - cpu;
    phase->keys = total;
    phase->batch = batch;
    phase->nodes = self->nodes;
    phase->placement = self->placement;
    phase->objects = self->objects;
    phase->done = true;
    if (kind != KVPOOL__CLUSTER__V1__KIND__LOCATE)
        self->objects += total;
    return 0;
}

//  LOCATE of one key a call, one call at a time, for self->single_seconds.
static int
s_single_locate (master_t *self)
{
    double *latencies = (double *) malloc (MAX_LATENCIES * sizeof (double));
    if (!latencies) {
        s_fail (self, "out of memory");
        return -1;
    }
    size_t calls = 0;
    double cpu = s_cpu (self), start = bench_now (), now = start;
    while (now - start < self->single_seconds && calls < MAX_LATENCIES) {
        uint64_t index = bench_mix (calls) % self->fill_keys;
        request_t request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        request.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;
        s_keys (self, &request, index, 1, false);
        reply_t *reply = s_call (self, &request, 0);
        double then = now;
        now = bench_now ();
        if (!reply)
            break;
        flight_t flight = {.kind = request.kind, .first = index, .count = 1};
        int rc = s_check (self, &flight, reply, NULL);
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        if (rc)
            break;
        latencies[calls++] = now - then;
    }
    if (!self->errors) {
        self->single_calls = calls;
        self->single_rate = calls / (now - start);
        self->single_cpu = s_cpu (self) - cpu;
        self->single_p50 = bench_quantile (latencies, calls, 0.50);
        self->single_p99 = bench_quantile (latencies, calls, 0.99);
    }
    free (latencies);
    return self->errors ? -1 : 0;
}

//  ---- the section -------------------------------------------------------------------

//  Writes a fresh cluster key (64 hex digits) to self->key_file, mode 0600, and into key.
static int
s_cluster_key (master_t *self, char key[65])
{
    uint8_t random[32];
    FILE *urandom = fopen ("/dev/urandom", "r");
    size_t got = urandom ? fread (random, 1, sizeof random, urandom) : 0;
    if (urandom)
        fclose (urandom);
    for (size_t i = 0; i < sizeof random; i++)
        snprintf (key + 2 * i, 3, "%02x", random[i]);
    snprintf (self->key_file, sizeof self->key_file, "/tmp/kvpool-bench-key-%d", (int) getpid ());
    unlink (self->key_file);
    int fd = open (self->key_file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
    if (got != sizeof random || fd < 0 || write (fd, key, 64) != 64) {
        if (fd >= 0)
            close (fd);
        s_fail (self, "cannot write a cluster key to %s", self->key_file);
        return -1;
    }
    close (fd);
    return 0;
}

//  Starts a master with placement (NULL: the default, random) and connects to it; no node
//  is registered yet.
static int
s_start (master_t *self, const char *name, const char *placement)
{
    //  The fake nodes prove a cluster key of the bench's own (a file only this user reads),
    //  as real nodes do (PLAIN; infra/curve.h).
    char key[65];
    if (s_cluster_key (self, key) != 0)
        return -1;
    const char *args[] = {
        "--role",        "master",       "--master",    "tcp://127.0.0.1:*",
        "--node-ttl",    "600000",       "--placement", placement ? placement : "random",
        "--cluster-key", self->key_file, NULL};
    self->placement = placement ? placement : "random";
    self->nodes = self->objects = 0;
    self->epoch = 0;
    if (bench_kvpoold_start (&self->master, self->kvpoold_path, name, args)) {
        self->errors++;
        return -1;
    }
    int timeout = TIMEOUT_MS, linger = 0, unlimited = 0;
    self->zmq = zmq_ctx_new ();
    self->dealer = self->zmq ? zmq_socket (self->zmq, ZMQ_DEALER) : NULL;
    if (!self->dealer || zmq_setsockopt (self->dealer, ZMQ_RCVTIMEO, &timeout, sizeof timeout)
        || zmq_setsockopt (self->dealer, ZMQ_SNDTIMEO, &timeout, sizeof timeout)
        || zmq_setsockopt (self->dealer, ZMQ_LINGER, &linger, sizeof linger)
        || zmq_setsockopt (self->dealer, ZMQ_SNDHWM, &unlimited, sizeof unlimited)
        || zmq_setsockopt (self->dealer, ZMQ_RCVHWM, &unlimited, sizeof unlimited)
        || zmq_setsockopt (self->dealer, ZMQ_PLAIN_USERNAME, "kvpool-node", 11)
        || zmq_setsockopt (self->dealer, ZMQ_PLAIN_PASSWORD, key, strlen (key))
        || zmq_connect (self->dealer, self->master.endpoint)) {
        s_fail (self, "DEALER to %s: %s", self->master.endpoint, zmq_strerror (zmq_errno ()));
        return -1;
    }
    kvpool__cluster__v1__node__init (&self->node);
    self->node.node_id = self->node_id;
    self->node.host_id = self->host_id;
    self->node.client_endpoint = self->client_endpoint;
    self->node.peer_endpoint = self->peer_endpoint;
    self->node.capacity = self->node.free = 1ULL << 40;
    return 0;
}

static void
s_stop (master_t *self)
{
    if (self->dealer)
        zmq_close (self->dealer);
    if (self->zmq)
        zmq_ctx_term (self->zmq);
    self->dealer = self->zmq = NULL;
    if (self->master.pid > 0 && bench_kvpoold_stop (&self->master, self->errors > 0) != 0)
        self->errors++;
    if (self->errors && self->master.log[0])
        fprintf (stderr, "kvpool-bench: master: log kept: %s\n", self->master.log);
}

//  One master, one node: the directory's size, the batched operations, single LOCATEs, and
//  the REGISTER of a node once the directory is full.
static void
s_run_directory (master_t *self)
{
    const int inventory = KVPOOL__CLUSTER__V1__KIND__INVENTORY;
    const int locate = KVPOOL__CLUSTER__V1__KIND__LOCATE;
    const int place = KVPOOL__CLUSTER__V1__KIND__PLACE;
    size_t n = self->fill_keys, m = self->extra_keys;
    if (s_start (self, "master", NULL))
        return;
    self->rss_start = s_rss (self);
    if (s_register (self, 1))
        return;
    self->rss_before = s_rss (self);
    fprintf (stderr, "kvpool-bench: master: INVENTORY of %zu keys\n", n);
    if (s_pipeline (self, inventory, 0, n, INVENTORY_CHUNK, &self->phases[PHASE_FILL]))
        return;
    self->rss_filled = s_rss (self);
    if (s_heartbeat (self))
        return;
    fprintf (stderr, "kvpool-bench: master: LOCATE\n");
    if (s_pipeline (self, locate, 0, n, BATCH, &self->phases[PHASE_LOCATE]))
        return;
    self->rss_located = s_rss (self);
    if (s_single_locate (self) || s_heartbeat (self))
        return;
    //  What a round trip costs with no master in it.
    self->floor_us = bench_floor_p50_us (bench_free_port (), 3, self->single_seconds / 3);
    fprintf (stderr, "kvpool-bench: master: INVENTORY and PLACE+COMMIT, batches of %d\n", BATCH);
    if (s_pipeline (self, inventory, n, m, BATCH, &self->phases[PHASE_INVENTORY])
        || s_pipeline (self, place, n + m, m, BATCH, &self->phases[PHASE_PLACE]))
        return;
    //  REGISTER starts a node afresh: the master takes it out of every entry first. NODES
    //  counts every node's objects.
    double start = bench_now ();
    self->register_objects = self->objects;
    if (s_register (self, 2) != 0)
        return;
    self->register_seconds = bench_now () - start;
    request_t request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = KVPOOL__CLUSTER__V1__KIND__NODES;
    start = bench_now ();
    reply_t *reply = s_call (self, &request, 0);
    if (!reply)
        return;
    if (reply->status != 0 || reply->n_nodes != 2 || reply->count != self->objects)
        s_fail (self, "NODES: status %d, %zu nodes, %" PRIu64 " objects; expected 2 and %zu",
                reply->status, reply->n_nodes, reply->count, self->objects);
    else
        self->nodes_seconds = bench_now () - start;
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
}

//  A fresh master with MANY_NODES nodes: placement looks at every live node for every key.
static void
s_run_nodes (master_t *self, const char *placement, int place_phase, int locate_phase, size_t first,
             size_t count)
{
    fprintf (stderr, "kvpool-bench: master: %d nodes, --placement %s\n", MANY_NODES, placement);
    if (s_start (self, placement, placement) || s_register (self, MANY_NODES)) {
        s_stop (self);
        return;
    }
    //  A put's memory: its entry, and its reservation, kept until --put-timeout passes.
    uint64_t rss = s_rss (self);
    if (s_pipeline (self, KVPOOL__CLUSTER__V1__KIND__PLACE, first, count, BATCH,
                    &self->phases[place_phase])
            == 0
        && locate_phase >= 0) {
        self->rss_place_before = rss;
        self->rss_place_after = s_rss (self);
        s_pipeline (self, KVPOOL__CLUSTER__V1__KIND__LOCATE, first, count, BATCH,
                    &self->phases[locate_phase]);
    }
    s_stop (self);
}

static void
s_run (master_t *self)
{
    s_run_directory (self);
    s_stop (self);
    size_t first = self->fill_keys + 2 * self->extra_keys;
    if (!self->errors)
        s_run_nodes (self, "random", PHASE_PLACE_MANY, PHASE_LOCATE_MANY, first, self->extra_keys);
    if (!self->errors)
        s_run_nodes (self, "free-ratio", PHASE_PLACE_FREE, -1, first, self->free_keys);
}

static void
s_print (master_t *self)
{
    printf ("\n== master: kvpoold --role master, driven over its ROUTER with the cluster protocol "
            "by fake nodes; keys of 64 hex digits ==\n");
    printf ("batched requests pipelined, %d in flight; keys/s over wall time; master CPU = its "
            "utime + stime meanwhile (one thread does the work)\n",
            WINDOW);
    printf ("%-13s %6s %-11s %6s %10s %10s %9s %11s %7s %15s\n", "op", "nodes", "placement",
            "batch", "keys", "objects", "seconds", "keys/s", "CPU", "keys/CPU-second");
    for (int p = 0; p < PHASE_COUNT; p++) {
        phase_t *phase = &self->phases[p];
        if (!phase->done) {
            printf ("%-13s %6s\n", s_phase_names[p], "FAILED");
            continue;
        }
        printf ("%-13s %6zu %-11s %6zu %10zu %10zu %9.2f %11.0f %6.0f%% %15.0f\n", s_phase_names[p],
                phase->nodes, phase->placement, phase->batch, phase->keys, phase->objects,
                phase->seconds, phase->keys / phase->seconds, 100 * phase->cpu / phase->seconds,
                phase->cpu > 0 ? phase->keys / phase->cpu : NAN);
    }
    printf ("(objects: committed keys in the directory when the phase began)\n");
    if (self->single_calls)
        printf ("LOCATE, one key a call, one call at a time: %.0f round trips/s, p50 %.1f us, p99 "
                "%.1f us (%zu calls; master CPU %.0f%%)\n",
                self->single_rate, self->single_p50 * 1e6, self->single_p99 * 1e6,
                self->single_calls,
                100 * self->single_cpu * self->single_rate / self->single_calls);
    else
        printf ("LOCATE, one key a call: FAILED\n");
    if (self->floor_us > 0 && self->single_calls)
        printf ("loopback floor: a bare libzmq DEALER -> ROUTER echo of 4 KiB, p50 %.1f us (single "
                "LOCATE p50 / floor: %.2f)\n",
                self->floor_us, self->single_p50 * 1e6 / self->floor_us);
    if (self->register_seconds > 0)
        printf ("REGISTER of a new node with %zu objects in the directory: %.1f ms (the master "
                "takes the node out of every entry first)\n",
                self->register_objects, self->register_seconds * 1e3);
    if (self->nodes_seconds > 0)
        printf ("NODES with %zu objects in the directory: %.1f ms (it counts each node's objects "
                "over every entry)\n",
                self->register_objects, self->nodes_seconds * 1e3);
    if (!self->rss_filled || !self->rss_before) {
        printf ("memory: not measured (failed)\n");
        return;
    }
    uint64_t after = self->rss_located && self->rss_located < self->rss_filled ? self->rss_located
                                                                               : self->rss_filled;
    double per_object = (double) (after - self->rss_before) / (double) self->fill_keys;
    printf ("memory: VmRSS %.1f MiB at start, %.1f MiB with one node registered, %.1f MiB after "
            "the INVENTORY of %zu keys, %.1f MiB after their LOCATEs\n",
            self->rss_start / 1048576.0, self->rss_before / 1048576.0, self->rss_filled / 1048576.0,
            self->fill_keys, self->rss_located / 1048576.0);
    printf ("memory per object: %.1f bytes in all (the lower of the last two, less the one with "
            "no keys, over %zu keys), %.1f bytes besides its %d-byte key\n",
            per_object, self->fill_keys, per_object - KEY_LEN, KEY_LEN);
    phase_t *placed = &self->phases[PHASE_PLACE_MANY];
    if (self->rss_place_after > self->rss_place_before && placed->done)
        printf ("memory of puts: VmRSS %.1f MiB -> %.1f MiB over the PLACE+COMMIT of %zu keys on a "
                "fresh master: %.1f bytes a key, the reservations (kept until --put-timeout, "
                "30 s) included\n",
                self->rss_place_before / 1048576.0, self->rss_place_after / 1048576.0, placed->keys,
                (double) (self->rss_place_after - self->rss_place_before) / (double) placed->keys);
    bench_goal (per_object - KEY_LEN <= TARGET_BYTES,
                "master memory per object <= %d bytes plus the key (%.1f bytes plus the key)",
                TARGET_BYTES, per_object - KEY_LEN);
    bench_verdict ("master", "%.1f bytes of the master's memory an object, plus its key",
                   per_object - KEY_LEN);
}

int
bench_master_run (const char *kvpoold_path, bool quick)
{
    master_t *self = (master_t *) calloc (1, sizeof *self);
    if (!self)
        return -1;
    self->kvpoold_path = kvpoold_path;
    self->quick = quick;
    self->fill_keys = quick ? 200000 : 10000000;
    self->extra_keys = quick ? 50000 : 1000000;
    self->free_keys = quick ? 5000 : 50000;
    self->single_seconds = quick ? 0.5 : 3;
    self->names = (char (*)[KEY_LEN + 1]) malloc (INVENTORY_CHUNK * sizeof *self->names);
    self->wire = (ProtobufCBinaryData *) malloc (INVENTORY_CHUNK * sizeof *self->wire);
    self->sizes = (uint64_t *) malloc (INVENTORY_CHUNK * sizeof *self->sizes);
    double start = bench_now ();
    fprintf (stderr, "kvpool-bench: master\n");
    if (!self->names || !self->wire || !self->sizes)
        s_fail (self, "out of memory");
    else
        s_run (self);
    s_print (self);
    printf ("master: %.1f s%s\n", bench_now () - start,
            self->errors ? ", with failures (see stderr)" : "");
    free (self->names);
    free (self->wire);
    free (self->sizes);
    free (self->registrations);
    if (*self->key_file)
        unlink (self->key_file);
    int rc = self->errors ? -1 : 0;
    free (self);
    return rc;
}
