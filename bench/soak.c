/*  soak.c - kvpool-soak: the soak and chaos driver (issue #15, parts 2 and 4; docs/soak.md).

    make soak   one kvpoold (role all) whose pool is smaller than the working set, so the
                evictor runs all the time (--disk: evicted objects go to a disk tier), and N
                client processes doing puts, gets, exists and removes of Zipf-distributed keys
                for --duration seconds.
    make chaos  the same workload against a master and three nodes while the driver kills
                (SIGKILL), freezes (SIGSTOP, then SIGCONT) and restarts random nodes and the
                master; the nodes keep their segments in --segment-dir, so a restarted node
                adopts what it held.

    HOW IT WORKS
    The driver (this process) starts the daemons (bench_proc.c: every one is its child, with
    PR_SET_PDEATHSIG), maps one MAP_SHARED anonymous region and forks the clients. The
    clients share nothing but that region: counters (atomics) and a table with one slot per
    key. Half of them keep their tcp connection (kvpool_options_t.keep_endpoint = 1), the
    other half let libkvpool move to the node's ipc endpoint and its shared memory.

    Every value checks itself: a 32-byte header (magic, key number, version, length, a seed
    and a checksum of those), then bytes that follow from the seed and their position. Any
    read is checked against nothing but the key it asked for: a value of another key, of
    another length, torn between two versions, shifted or damaged counts its wrong bytes.
    A put of a key takes a version no put of that key took before (the slot's counter), so
    no two values in the store are ever the same bytes.

    The slot also says what the store should hold for the key, so that a miss can be told
    apart from a loss: the version a put committed (0: none, or removed), when, and (chaos)
    on which nodes (LOCATE after the put). Puts and removes of one key run concurrently on
    purpose; a mutation knows its outcome is the slot's truth only when it ran alone
    (nothing else mutated the key from its start to its end: the busy and starts counters),
    and otherwise marks the slot ambiguous until the next lone mutation. A read classifies
    its outcome only when no mutation of the key was in flight from its start to its end.

    Every second the driver sums the counters, reads each daemon's VmRSS, RssAnon, RssFile,
    RssShmem (/proc/PID/status) and open descriptors (/proc/PID/fd), and writes a CSV row;
    at the end it prints the summary, draws the PNG with gnuplot and exits 0 on a pass, 1 on
    a fail. Pass criteria, the memory bound and the loss rule are in docs/soak.md.
*/
#include "bench/bench.h"
#include "infra/ready_file.h"

#include <kvpool.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024.0 * 1024.0)
#define MAX_CLIENTS 256
#define NODES 3
#define DAEMONS (NODES + 1) //  the nodes, then the master (chaos); daemon 0 alone (soak)
#define MASTER NODES
#define HEADER_SIZE 32
#define VALUE_MAGIC 0x4B56534Bu //  "KSVK"
#define FD_SLACK 16             //  descriptors a daemon may gain after warm-up
#define OVERHEAD_MIB 128        //  the fixed part of the RSS bound: see docs/soak.md
#define GRACE_MS 5000           //  a fault window stays open this long after the heal
#define SAMPLE_MAX 7200

//  The operations of the workload, and what they may answer.
enum { OP_GET, OP_EXIST, OP_PUT, OP_REMOVE, OP_LOCATE, OPS };
static const char *s_op_names[OPS] = {"get", "exist", "put", "remove", "locate"};

//  Status codes as counter columns: KVPOOL_STATUS_LIST's order, then one for any other.
#define STATUS_INDEX(name, value, text) name##_INDEX,
enum { KVPOOL_STATUS_LIST (STATUS_INDEX) STATUS_OTHER, STATUSES };
#undef STATUS_INDEX

static int
s_status_index (int status)
{
    int index = 0;
#define STATUS_CASE(name, value, text)                                                             \
    if (status == value)                                                                           \
        return index;                                                                              \
    index++;
    KVPOOL_STATUS_LIST (STATUS_CASE)
#undef STATUS_CASE
    return STATUS_OTHER;
}

static int
s_status_of_index (int index)
{
    int i = 0;
#define STATUS_VALUE(name, value, text)                                                            \
    if (i++ == index)                                                                              \
        return value;
    KVPOOL_STATUS_LIST (STATUS_VALUE)
#undef STATUS_VALUE
    return 1;
}

//  What a status means for the verdict. Outcomes are answers the workload asks for by racing
//  on shared keys (a put of a key that exists, a remove of a leased one); expected errors
//  are those of a full pool (NO_AVAILABLE_HANDLE) and of eviction (OBJECT_NOT_FOUND), and in
//  chaos, inside a fault window, those of a node or master away. Anything else fails.
typedef enum { KIND_OK, KIND_OUTCOME, KIND_EXPECTED, KIND_FAULT, KIND_UNEXPECTED } kind_t;

static kind_t
s_kind (int op, int status, bool chaos)
{
    switch (status) {
        case KVPOOL_OK: return KIND_OK;
        case KVPOOL_OBJECT_NOT_FOUND:
            return op == OP_REMOVE || op == OP_LOCATE ? KIND_OUTCOME : KIND_EXPECTED;
        case KVPOOL_NO_AVAILABLE_HANDLE: return op == OP_PUT ? KIND_EXPECTED : KIND_UNEXPECTED;
        case KVPOOL_OBJECT_ALREADY_EXISTS: return op == OP_PUT ? KIND_OUTCOME : KIND_UNEXPECTED;
        case KVPOOL_OBJECT_HAS_LEASE: return op == OP_REMOVE ? KIND_OUTCOME : KIND_UNEXPECTED;
        case KVPOOL_REPLICA_IS_NOT_READY:
            //  A remove of a key another client is writing (between put-start and put-end).
            return op == OP_REMOVE || op == OP_PUT ? KIND_OUTCOME : KIND_UNEXPECTED;
        case KVPOOL_INVALID_WRITE:
            //  A same-machine put's reservation dropped by a restart between put-start and
            //  put-end.
            return chaos && op == OP_PUT ? KIND_FAULT : KIND_UNEXPECTED;
        case KVPOOL_INVALID_REPLICA:
            //  Two replicas asked for while one node is away: fewer nodes than replicas.
            return chaos && op == OP_PUT ? KIND_FAULT : KIND_UNEXPECTED;
        case KVPOOL_RPC_FAIL:
        case KVPOOL_TRANSFER_FAIL:
        case KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS:
        case KVPOOL_REDIRECT: return chaos ? KIND_FAULT : KIND_UNEXPECTED;
        default: return KIND_UNEXPECTED;
    }
}

//  ---- the shared region --------------------------------------------------------------

//  One key. version: what the store should hold (0: nothing); valid only while ambiguous
//  is 0. Written under lock, by a mutation that ran alone (see the file's comment).
typedef struct {
    atomic_uint lock;
    atomic_uint busy;         //  mutations in flight
    atomic_uint starts;       //  mutations started, ever
    atomic_uint next_version; //  the last version a put took
    atomic_uint version;
    atomic_uint ambiguous;
    atomic_uint holders;        //  chaos: bit i for node i (0: unknown)
    atomic_uint_fast64_t since; //  ms (driver clock) the version was committed
} slot_t;

typedef struct {
    atomic_int stop;
    atomic_uint_fast64_t ops[OPS][STATUSES];
    atomic_uint_fast64_t in_window[OPS][STATUSES]; //  chaos: answered inside a fault window
    atomic_uint_fast64_t wrong_bytes, wrong_values, verified_values, verified_bytes;
    atomic_uint_fast64_t stale_reads;       //  a committed key read as another version
    atomic_uint_fast64_t resurrected_reads; //  a removed key read back
    atomic_uint_fast64_t misses_committed;  //  a committed key not found (eviction in soak)
    atomic_uint_fast64_t misses_explained;  //  chaos: of those, a holder or master faulted
    atomic_uint_fast64_t misses_unexplained;
    atomic_uint_fast64_t misses_raced; //  a miss while the key was being mutated
    atomic_uint_fast64_t reconnects, connect_failures;
    atomic_uint fast_path_clients, tcp_clients, ipc_clients;
    //  chaos: when each daemon last began a fault (ms), and the fault window
    atomic_uint_fast64_t fault_start[DAEMONS];
    atomic_int window_open;
    atomic_uint_fast64_t window_end;
    char endpoints[NODES][256];
    slot_t slots[];
} shared_t;

typedef struct {
    double duration;
    int clients;
    uint64_t pool;
    int keys;
    double zipf;
    uint64_t min_size, max_size;
    bool disk, chaos, local_node;
    uint64_t disk_capacity;
    int lease_ms;
    const char *out, *kvpoold;
    const char *trace_keys; //  --trace-keys for every daemon, or NULL
    int seed;
    int fault_every_min, fault_every_max; //  chaos: seconds between faults
} options_t;

static options_t s_opt;
static shared_t *s_shared;
static double *s_zipf_cdf;
static double s_t0;

static uint64_t
s_now_ms (void)
{
    return (uint64_t) ((bench_now () - s_t0) * 1000);
}

//  ---- values ------------------------------------------------------------------------

static uint64_t
s_seed (uint32_t key, uint32_t version)
{
    return bench_mix (((uint64_t) key << 32) | version);
}

static uint64_t
s_header_check (uint32_t key, uint32_t version, uint32_t length, uint64_t seed)
{
    return bench_mix (seed ^ ((uint64_t) length << 32) ^ key ^ ((uint64_t) version << 16)
                      ^ VALUE_MAGIC);
}

//  The length of version of key: log-uniform in [min_size, max_size], at least a header.
static size_t
s_value_length (uint32_t key, uint32_t version)
{
    double u = (bench_mix (s_seed (key, version) ^ 0x5EED) >> 11) * (1.0 / 9007199254740992.0);
    double lo = log ((double) s_opt.min_size), hi = log ((double) s_opt.max_size);
    size_t length = (size_t) exp (lo + u * (hi - lo));
    return length < HEADER_SIZE + 1 ? HEADER_SIZE + 1 : length;
}

static inline uint64_t
s_word (uint64_t base, size_t i)
{
    return base ^ (i * 0x100000001B3ULL) ^ (i << 47);
}

static void
s_value_fill (uint8_t *buffer, uint32_t key, uint32_t version, size_t length)
{
    uint64_t seed = s_seed (key, version);
    uint32_t header[4] = {VALUE_MAGIC, key, version, (uint32_t) length};
    uint64_t check = s_header_check (key, version, (uint32_t) length, seed);
    memcpy (buffer, header, 16);
    memcpy (buffer + 16, &seed, 8);
    memcpy (buffer + 24, &check, 8);
    size_t words = (length - HEADER_SIZE) / 8;
    uint64_t base = bench_mix (seed);
    for (size_t i = 0; i < words; i++) {
        uint64_t w = s_word (base, i);
        memcpy (buffer + HEADER_SIZE + i * 8, &w, 8);
    }
    uint64_t tail = s_word (base, words);
    memcpy (buffer + HEADER_SIZE + words * 8, &tail, (length - HEADER_SIZE) % 8);
}

//  Checks a value read for key (size bytes). Returns the number of wrong bytes (0: right),
//  and its version in *version_p (0 when the header is not one of key's).
static uint64_t
s_value_check (const uint8_t *buffer, size_t size, uint32_t key, uint32_t *version_p)
{
    *version_p = 0;
    if (size < HEADER_SIZE + 1)
        return size ? size : 1;
    uint32_t header[4];
    uint64_t seed, check;
    memcpy (header, buffer, 16);
    memcpy (&seed, buffer + 16, 8);
    memcpy (&check, buffer + 24, 8);
    if (header[0] != VALUE_MAGIC || header[1] != key || header[3] != size || header[2] == 0
        || seed != s_seed (key, header[2])
        || check != s_header_check (key, header[2], header[3], seed)
        || size != s_value_length (key, header[2])
        || header[2] > atomic_load (&s_shared->slots[key].next_version))
        return size; //  not a value of this key that was ever written: all of it is wrong
    *version_p = header[2];
    uint64_t wrong = 0;
    size_t words = (size - HEADER_SIZE) / 8, tail = (size - HEADER_SIZE) % 8;
    uint64_t base = bench_mix (seed);
    const uint8_t *payload = buffer + HEADER_SIZE;
    for (size_t i = 0; i <= words; i++) {
        size_t n = i < words ? 8 : tail;
        if (n == 0)
            break;
        uint64_t want = s_word (base, i), got = 0;
        memcpy (&got, payload + i * 8, n);
        if (n < 8)
            want &= (1ULL << (n * 8)) - 1;
        if (got != want)
            for (size_t b = 0; b < n; b++)
                wrong += ((got >> (b * 8)) & 0xFF) != ((want >> (b * 8)) & 0xFF);
    }
    return wrong;
}

//  ---- keys ----------------------------------------------------------------------------

static void
s_key_name (uint32_t key, char *name, size_t size)
{
    snprintf (name, size, "soak/%08u", key);
}

//  Zipf over the keys: the cumulative distribution, key 0 the most popular.
static int
s_zipf_init (void)
{
    s_zipf_cdf = malloc (sizeof (double) * s_opt.keys);
    if (!s_zipf_cdf)
        return -1;
    double sum = 0;
    for (int i = 0; i < s_opt.keys; i++)
        s_zipf_cdf[i] = (sum += 1.0 / pow (i + 1, s_opt.zipf));
    for (int i = 0; i < s_opt.keys; i++)
        s_zipf_cdf[i] /= sum;
    return 0;
}

static uint64_t
s_rand (uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return bench_mix (*state);
}

static double
s_uniform (uint64_t *state)
{
    return (s_rand (state) >> 11) * (1.0 / 9007199254740992.0);
}

static uint32_t
s_zipf_key (uint64_t *state)
{
    double u = s_uniform (state);
    int lo = 0, hi = s_opt.keys - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (s_zipf_cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    //  Popular keys spread over the key space, not bunched at the low numbers.
    return (uint32_t) ((uint64_t) lo * 2654435761u % (uint64_t) s_opt.keys);
}

//  ---- the slot protocol ---------------------------------------------------------------

static void
s_slot_lock (slot_t *slot)
{
    unsigned expected = 0;
    while (!atomic_compare_exchange_weak (&slot->lock, &expected, 1)) {
        expected = 0;
        sched_yield ();
    }
}

static void
s_slot_unlock (slot_t *slot)
{
    atomic_store (&slot->lock, 0);
}

typedef struct {
    unsigned busy_before, starts_after;
    uint64_t started_ms; //  a fault from here on may have taken the value's holder
} mutation_t;

static mutation_t
s_mutation_begin (slot_t *slot)
{
    mutation_t m;
    m.busy_before = atomic_fetch_add (&slot->busy, 1);
    m.starts_after = atomic_fetch_add (&slot->starts, 1) + 1;
    m.started_ms = s_now_ms ();
    return m;
}

//  known: the outcome tells what the store holds (version: 0 for nothing, or keep: leave the
//  version as it is); not known: the slot becomes ambiguous.
#define KEEP_VERSION UINT32_MAX
static void
s_mutation_end (slot_t *slot, mutation_t m, bool known, uint32_t version, unsigned holders)
{
    s_slot_lock (slot);
    bool alone = m.busy_before == 0 && atomic_load (&slot->starts) == m.starts_after;
    if (!alone || !known)
        atomic_store (&slot->ambiguous, 1);
    else if (version != KEEP_VERSION) {
        atomic_store (&slot->version, version);
        atomic_store (&slot->holders, holders);
        //  From the put's start: a holder killed while the put was in flight, after the
        //  bytes landed, may still have its commit acknowledged; its value is away with it.
        atomic_store (&slot->since, m.started_ms);
        atomic_store (&slot->ambiguous, 0);
    }
    atomic_fetch_sub (&slot->busy, 1);
    s_slot_unlock (slot);
}

//  A read's view of the slot: stable when no mutation was in flight from start to end.
typedef struct {
    unsigned starts, busy;
} view_t;

static view_t
s_view (slot_t *slot)
{
    view_t v = {atomic_load (&slot->starts), atomic_load (&slot->busy)};
    return v;
}

static bool
s_stable (slot_t *slot, view_t before)
{
    return before.busy == 0 && atomic_load (&slot->busy) == 0
           && atomic_load (&slot->starts) == before.starts && !atomic_load (&slot->ambiguous);
}

//  chaos: whether a holder of the slot's version (any node when unknown) or the master began
//  a fault since the version was committed.
static bool
s_fault_since (slot_t *slot)
{
    uint64_t since = atomic_load (&slot->since);
    unsigned holders = atomic_load (&slot->holders);
    if (atomic_load (&s_shared->fault_start[MASTER]) >= since)
        return true;
    for (int i = 0; i < NODES; i++)
        if ((!holders || (holders & (1u << i))) && atomic_load (&s_shared->fault_start[i]) >= since)
            return true;
    return false;
}

//  ---- a client process ------------------------------------------------------------------

typedef struct {
    int index;
    bool tcp;
    const char *endpoint;
    kvpool_t *pool;
    uint64_t rng;
    uint8_t *value, *read;
} client_t;

static kvpool_t *
s_client_connect (client_t *self)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = s_opt.chaos ? 3000 : 10000;
    options.connect_timeout_ms = s_opt.chaos ? 1000 : 10000;
    options.keep_endpoint = self->tcp;
    //  keep_endpoint alone is not enough: libkvpool still opens the fast path on a
    //  same-machine tcp connection, whose shared-memory operations the node then refuses
    //  (PERMISSION_DENIED, no fall-back to the socket). The tcp half is tcp only.
    options.fast_path = !self->tcp;
    return kvpool_connect (self->endpoint, &options);
}

static void
s_count (int op, int status, uint64_t started_ms)
{
    int index = s_status_index (status);
    atomic_fetch_add_explicit (&s_shared->ops[op][index], 1, memory_order_relaxed);
    if (s_opt.chaos
        && (atomic_load (&s_shared->window_open)
            || started_ms <= atomic_load (&s_shared->window_end)))
        atomic_fetch_add_explicit (&s_shared->in_window[op][index], 1, memory_order_relaxed);
}

//  A committed key was not there (get or exist) while nothing mutated it.
static void
s_miss_of_committed (slot_t *slot, uint32_t key, const char *op, int client)
{
    atomic_fetch_add (&s_shared->misses_committed, 1);
    if (!s_opt.chaos)
        return;
    if (s_fault_since (slot)) {
        atomic_fetch_add (&s_shared->misses_explained, 1);
        return;
    }
    //  The first few, with what the slot says, to start an investigation from.
    if (atomic_fetch_add (&s_shared->misses_unexplained, 1) < 10)
        fprintf (stderr,
                 "kvpool-soak: %.1f s: client %d (%s, node %d): %s of key %u (%zu bytes): not "
                 "found; committed version %u at %.1f s on nodes 0x%x, last faults node-0 %.1f "
                 "node-1 %.1f node-2 %.1f master %.1f s\n",
                 s_now_ms () / 1000.0, client, client % 2 == 0 ? "tcp" : "ipc", client / 2 % NODES,
                 op, key, s_value_length (key, atomic_load (&slot->version)),
                 atomic_load (&slot->version), atomic_load (&slot->since) / 1000.0,
                 atomic_load (&slot->holders), atomic_load (&s_shared->fault_start[0]) / 1000.0,
                 atomic_load (&s_shared->fault_start[1]) / 1000.0,
                 atomic_load (&s_shared->fault_start[2]) / 1000.0,
                 atomic_load (&s_shared->fault_start[3]) / 1000.0);
}

static int
s_do_get (client_t *self, uint32_t key, const char *name, uint64_t started)
{
    slot_t *slot = &s_shared->slots[key];
    view_t view = s_view (slot);
    int64_t got = kvpool_get_into (self->pool, name, self->read, s_opt.max_size);
    bool stable = s_stable (slot, view);
    uint32_t committed = atomic_load (&slot->version);
    if (got >= 0) {
        uint32_t version;
        uint64_t wrong = s_value_check (self->read, (size_t) got, key, &version);
        atomic_fetch_add (&s_shared->verified_values, 1);
        atomic_fetch_add (&s_shared->verified_bytes, (uint64_t) got);
        if (wrong) {
            atomic_fetch_add (&s_shared->wrong_bytes, wrong);
            atomic_fetch_add (&s_shared->wrong_values, 1);
            fprintf (stderr, "kvpool-soak: client %d: %s: %llu wrong bytes of %lld\n", self->index,
                     name, (unsigned long long) wrong, (long long) got);
        }
        else if (stable && (committed == 0 || version != committed)) {
            uint64_t n = atomic_fetch_add (
                committed == 0 ? &s_shared->resurrected_reads : &s_shared->stale_reads, 1);
            //  The first few, with what the slot says, to start an investigation from.
            if (n < 5)
                fprintf (stderr,
                         "kvpool-soak: %.1f s: client %d (%s, node %d): get of key %u read "
                         "version %u, %s (since %.1f s); last faults node-0 %.1f node-1 %.1f "
                         "node-2 %.1f master %.1f s\n",
                         s_now_ms () / 1000.0, self->index, self->tcp ? "tcp" : "ipc",
                         self->index / 2 % NODES, key, version,
                         committed ? "another version is committed" : "it was removed",
                         atomic_load (&slot->since) / 1000.0,
                         atomic_load (&s_shared->fault_start[0]) / 1000.0,
                         atomic_load (&s_shared->fault_start[1]) / 1000.0,
                         atomic_load (&s_shared->fault_start[2]) / 1000.0,
                         atomic_load (&s_shared->fault_start[3]) / 1000.0);
        }
        s_count (OP_GET, KVPOOL_OK, started);
        return KVPOOL_OK;
    }
    if (got == KVPOOL_OBJECT_NOT_FOUND && committed) {
        if (stable)
            s_miss_of_committed (slot, key, "get", self->index);
        else
            atomic_fetch_add (&s_shared->misses_raced, 1);
    }
    s_count (OP_GET, (int) got, started);
    return (int) got;
}

static int
s_do_exist (client_t *self, uint32_t key, const char *name, uint64_t started)
{
    slot_t *slot = &s_shared->slots[key];
    view_t view = s_view (slot);
    int rc = kvpool_exist (self->pool, name);
    bool stable = s_stable (slot, view);
    uint32_t committed = atomic_load (&slot->version);
    if (rc == 0 && committed) {
        if (stable)
            s_miss_of_committed (slot, key, "exist", self->index);
        else
            atomic_fetch_add (&s_shared->misses_raced, 1);
    }
    s_count (OP_EXIST, rc > 0 ? 0 : rc, started);
    return rc > 0 ? 0 : rc;
}

//  chaos: the nodes that hold key (a bit per node), 0 when LOCATE could not say.
static unsigned
s_locate (client_t *self, const char *name, uint64_t started)
{
    kvpool_node_t nodes[8];
    int count = kvpool_locate (self->pool, name, NULL, nodes, 8);
    s_count (OP_LOCATE, count < 0 ? count : 0, started);
    unsigned holders = 0;
    for (int i = 0; i < count && i < 8; i++) {
        int node;
        if (sscanf (nodes[i].node_id, "soak-node-%d", &node) == 1 && node >= 0 && node < NODES)
            holders |= 1u << node;
    }
    return holders;
}

static int
s_do_put (client_t *self, uint32_t key, const char *name, uint64_t started)
{
    slot_t *slot = &s_shared->slots[key];
    mutation_t m = s_mutation_begin (slot);
    uint32_t version = atomic_fetch_add (&slot->next_version, 1) + 1;
    size_t length = s_value_length (key, version);
    s_value_fill (self->value, key, version, length);
    kvpool_put_options_t put = {.replica_num = 1};
    if (s_opt.chaos && (s_rand (&self->rng) & 1))
        put.replica_num = 2;
    int rc = kvpool_put (self->pool, name, self->value, length, &put);
    unsigned holders = 0;
    if (rc == KVPOOL_OK && s_opt.chaos)
        holders = s_locate (self, name, started);
    if (rc == KVPOOL_OK)
        s_mutation_end (slot, m, true, version, holders);
    else if (rc == KVPOOL_NO_AVAILABLE_HANDLE || rc == KVPOOL_REPLICA_IS_NOT_READY
             || (rc == KVPOOL_OBJECT_ALREADY_EXISTS && atomic_load (&slot->version)))
        s_mutation_end (slot, m, true, KEEP_VERSION, 0);
    else
        s_mutation_end (slot, m, false, 0, 0);
    s_count (OP_PUT, rc, started);
    return rc;
}

static int
s_do_remove (client_t *self, uint32_t key, const char *name, uint64_t started)
{
    slot_t *slot = &s_shared->slots[key];
    mutation_t m = s_mutation_begin (slot);
    int rc = kvpool_remove (self->pool, name, s_rand (&self->rng) & 1);
    if (rc == KVPOOL_OK || rc == KVPOOL_OBJECT_NOT_FOUND)
        s_mutation_end (slot, m, true, 0, 0);
    else if (rc == KVPOOL_OBJECT_HAS_LEASE || rc == KVPOOL_REPLICA_IS_NOT_READY)
        s_mutation_end (slot, m, true, KEEP_VERSION, 0);
    else
        s_mutation_end (slot, m, false, 0, 0);
    s_count (OP_REMOVE, rc, started);
    return rc;
}

static int
s_client_run (int index)
{
    client_t self = {.index = index, .tcp = index % 2 == 0};
    self.rng = bench_mix ((uint64_t) s_opt.seed << 32 | (uint64_t) index) | 1;
    self.endpoint = s_shared->endpoints[s_opt.chaos ? index / 2 % NODES : 0];
    self.value = malloc (s_opt.max_size);
    self.read = malloc (s_opt.max_size);
    if (!self.value || !self.read)
        return 2;
    while (!atomic_load (&s_shared->stop) && !(self.pool = s_client_connect (&self))) {
        atomic_fetch_add (&s_shared->connect_failures, 1);
        if (!s_opt.chaos) {
            fprintf (stderr, "kvpool-soak: client %d cannot connect to %s\n", index, self.endpoint);
            return 3;
        }
        bench_sleep_ms (200);
    }
    if (self.pool) {
        if (kvpool_fast_path (self.pool))
            atomic_fetch_add (&s_shared->fast_path_clients, 1);
        atomic_fetch_add (self.tcp ? &s_shared->tcp_clients : &s_shared->ipc_clients, 1);
    }
    char name[64];
    while (self.pool && !atomic_load (&s_shared->stop)) {
        uint32_t key = s_zipf_key (&self.rng);
        s_key_name (key, name, sizeof name);
        unsigned pick = s_rand (&self.rng) % 100;
        uint64_t started = s_now_ms ();
        int rc = 0;
        if (pick < 50)
            rc = s_do_get (&self, key, name, started);
        else if (pick < 65)
            rc = s_do_exist (&self, key, name, started);
        else if (pick < 90)
            rc = s_do_put (&self, key, name, started);
        else
            rc = s_do_remove (&self, key, name, started);
        //  A connection that timed out: a fresh one (chaos: the node may be away or frozen;
        //  keep trying until it is back).
        if (rc == KVPOOL_RPC_FAIL) {
            kvpool_destroy (&self.pool);
            atomic_fetch_add (&s_shared->reconnects, 1);
            while (!atomic_load (&s_shared->stop) && !(self.pool = s_client_connect (&self))) {
                atomic_fetch_add (&s_shared->connect_failures, 1);
                bench_sleep_ms (200);
            }
        }
    }
    kvpool_destroy (&self.pool);
    free (self.value);
    free (self.read);
    return 0;
}

//  ---- daemons -------------------------------------------------------------------------

typedef struct {
    const char *name; //  "kvpoold", "node-0", ..., "master"
    pid_t pid;        //  0: not running
    bool frozen;
    int port; //  its client (master: node) tcp port, kept across restarts
    char endpoint[256];
    char ready[512], log[1200], segment_dir[512];
    uint64_t pool;
    int incarnations;
    double started;     //  when this incarnation became ready
    int fd_min, fd_max; //  this incarnation, after warm-up
    //  Growth, not spikes: the lowest count of the first 10 samples after warm-up against
    //  the lowest of the last 10 (a burst of requests opens and closes descriptors).
    int fd_samples, fd_first_low, fd_recent[10];
    int fd_growth_max; //  the most any incarnation grew after warm-up
    uint64_t mem_max;  //  resident, each shared page once (s_proc_rss): the bound's
    uint64_t rss_max, rss_anon_at_max, rss_shmem_at_max, rss_file_at_max;
    int mem_now, rss_now, fd_now; //  the last sample (KiB, count), -1 when none
    int crashes;                  //  exits the driver did not cause
    double retry_at;              //  chaos: when to start it again after a crash
    int kills, freezes;
    int stop_status;
} daemon_t;

static daemon_t s_daemons[DAEMONS];
static int s_daemon_count;
static char s_dir[256];     //  the run's scratch folder (segments, disk tier, logs)
static char s_shm_dir[256]; //  chaos: the nodes' segment files, on tmpfs

//  chaos: a loopback port for a daemon that restarts on it. Not zmq's wildcard range
//  (49152 up) and not the kernel's ephemeral range (32768-60999 on Debian), where a client
//  connection's local port could take it while the daemon is down and fail the restart.
static int
s_pick_port (uint64_t *rng)
{
    for (int attempt = 0; attempt < 200; attempt++) {
        int port = 61000 + (int) (s_rand (rng) % 4000);
        int fd = socket (AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons (port)};
        addr.sin_addr.s_addr = htonl (INADDR_LOOPBACK);
        bool free_port = fd >= 0 && bind (fd, (struct sockaddr *) &addr, sizeof addr) == 0;
        if (fd >= 0)
            close (fd);
        if (free_port)
            return port;
    }
    return 0;
}

static int
s_daemon_start (daemon_t *self, const char *const *extra)
{
    char port_arg[64];
    const char *argv[64];
    int argc = 0;
    argv[argc++] = s_opt.kvpoold;
    if (self - s_daemons == MASTER && s_opt.chaos) {
        if (self->port)
            snprintf (port_arg, sizeof port_arg, "tcp://127.0.0.1:%d", self->port);
        else
            snprintf (port_arg, sizeof port_arg, "tcp://127.0.0.1:*");
        argv[argc++] = "--master";
        argv[argc++] = port_arg;
    }
    else {
        if (self->port)
            snprintf (port_arg, sizeof port_arg, "tcp://127.0.0.1:%d", self->port);
        else
            snprintf (port_arg, sizeof port_arg, "tcp://127.0.0.1:*");
        argv[argc++] = "--endpoint";
        argv[argc++] = port_arg;
        argv[argc++] = "--admin";
        argv[argc++] = "tcp://127.0.0.1:*";
    }
    argv[argc++] = "--ready-file";
    argv[argc++] = self->ready;
    argv[argc++] = "--metrics-port";
    argv[argc++] = "0";
    for (int i = 0; extra[i]; i++)
        argv[argc++] = extra[i];
    if (s_opt.trace_keys) {
        argv[argc++] = "--trace-keys";
        argv[argc++] = s_opt.trace_keys;
    }
    argv[argc] = NULL;
    unlink (self->ready);
    //  A log per incarnation: a restart keeps the log of the process it replaces.
    char log[1300];
    snprintf (log, sizeof log, "%s.%d", self->log, self->incarnations);
    self->pid = bench_spawn (argv, log);
    if (self->pid < 0) {
        self->pid = 0;
        return -1;
    }
    ready_file_t ready;
    int rc = ready_file_wait (self->ready, self->pid, 20000, &ready);
    if (rc != 0) {
        fprintf (stderr, "kvpool-soak: %s did not start (log %s)\n", self->name, log);
        if (rc == -1)
            bench_stop (self->pid);
        self->pid = 0;
        return -1;
    }
    snprintf (self->endpoint, sizeof self->endpoint, "%s", ready.endpoint);
    const char *colon = strrchr (ready.endpoint, ':');
    self->port = colon ? atoi (colon + 1) : 0;
    self->incarnations++;
    self->started = bench_now ();
    self->fd_min = self->fd_max = -1;
    self->fd_samples = 0;
    self->frozen = false;
    return 0;
}

//  The arguments of node i (chaos) or of the one daemon (soak), NULL-terminated.
static int
s_node_start (int i)
{
    daemon_t *self = &s_daemons[i];
    static char size[32], lease[32], disk_capacity[32], node_id[32], host_id[32];
    const char *extra[40];
    int n = 0;
    snprintf (size, sizeof size, "%llu", (unsigned long long) self->pool);
    snprintf (lease, sizeof lease, "%d", s_opt.lease_ms);
    extra[n++] = "--segment-size";
    extra[n++] = size;
    extra[n++] = "--lease-ttl";
    extra[n++] = lease;
    if (s_opt.disk) {
        snprintf (disk_capacity, sizeof disk_capacity, "%llu",
                  (unsigned long long) s_opt.disk_capacity);
        extra[n++] = "--disk-dir";
        extra[n++] = self->segment_dir; //  (the disk tier's folder in soak)
        extra[n++] = "--disk-capacity";
        extra[n++] = disk_capacity;
    }
    if (s_opt.chaos) {
        snprintf (node_id, sizeof node_id, "soak-node-%d", i);
        extra[n++] = "--role";
        extra[n++] = "node";
        extra[n++] = "--master";
        extra[n++] = s_daemons[MASTER].endpoint;
        extra[n++] = "--node-id";
        extra[n++] = node_id;
        //  Each node counts as a machine of its own, as docs/cluster.md asks of nodes on one
        //  machine; --local-node keeps node 0 on this machine's host id, so that its
        //  same-machine clients map its segments (reads of keys other nodes hold then miss:
        //  docs/soak.md).
        if (i > 0 || !s_opt.local_node) {
            snprintf (host_id, sizeof host_id, "soak-host-%d", i);
            extra[n++] = "--host-id";
            extra[n++] = host_id;
        }
        extra[n++] = "--segment-dir";
        extra[n++] = self->segment_dir;
        extra[n++] = "--heartbeat-interval";
        extra[n++] = "200";
        extra[n++] = "--cluster-timeout";
        extra[n++] = "1000";
    }
    extra[n] = NULL;
    return s_daemon_start (self, extra);
}

static int
s_master_start (void)
{
    const char *extra[] = {"--role", "master", "--node-ttl", "2000", NULL};
    return s_daemon_start (&s_daemons[MASTER], extra);
}

//  VmRSS, RssAnon, RssFile, RssShmem of pid in KiB (/proc/PID/status), and in kib[4] its
//  resident memory with each shared page counted once: VmRSS counts a page once per mapping,
//  and kvpoold maps each segment twice (its own mapping, and actors/index_reads.c's, which
//  reads as a same-machine client does), so a pool the daemon touches all of shows as twice
//  its size. kib[4] = RssAnon + RssFile + for each /dev/shm object it maps (segments, the
//  read index, --segment-dir files) the smaller of its size and the Rss of its mappings
//  summed (/proc/PID/smaps). -1 when it cannot be read.
static int
s_proc_rss (pid_t pid, uint64_t kib[5])
{
    char path[64], line[1024];
    snprintf (path, sizeof path, "/proc/%d/status", (int) pid);
    FILE *file = fopen (path, "r");
    if (!file)
        return -1;
    const char *names[4] = {"VmRSS:", "RssAnon:", "RssFile:", "RssShmem:"};
    int found = 0;
    memset (kib, 0, 5 * sizeof kib[0]);
    while (fgets (line, sizeof line, file))
        for (int i = 0; i < 4; i++)
            if (!strncmp (line, names[i], strlen (names[i]))) {
                kib[i] = strtoull (line + strlen (names[i]), NULL, 10);
                found++;
            }
    fclose (file);
    if (!found)
        return -1;
    snprintf (path, sizeof path, "/proc/%d/smaps", (int) pid);
    file = fopen (path, "r");
    if (!file)
        return -1;
    //  Few objects: a small table of (name, size, rss summed).
    enum { OBJECTS = 160 };
    static char object_name[OBJECTS][256];
    uint64_t object_size[OBJECTS], object_rss[OBJECTS];
    int objects = 0, current = -1;
    while (fgets (line, sizeof line, file)) {
        unsigned long start, end;
        char name[512] = "";
        //  A mapping's line starts with its address (lower-case hex), its fields with a
        //  capital letter ("Rss:").
        bool mapping = (line[0] >= '0' && line[0] <= '9') || (line[0] >= 'a' && line[0] <= 'f');
        if (mapping && sscanf (line, "%lx-%lx %*s %*s %*s %*s %511s", &start, &end, name) >= 2) {
            current = -1;
            if (strncmp (name, "/dev/shm/", 9))
                continue;
            for (int i = 0; i < objects; i++)
                if (!strcmp (object_name[i], name))
                    current = i;
            if (current < 0 && objects < OBJECTS) {
                current = objects++;
                snprintf (object_name[current], sizeof object_name[current], "%s", name);
                object_size[current] = object_rss[current] = 0;
            }
            if (current >= 0 && (end - start) / 1024 > object_size[current])
                object_size[current] = (end - start) / 1024;
        }
        else if (current >= 0 && !strncmp (line, "Rss:", 4))
            object_rss[current] += strtoull (line + 4, NULL, 10);
    }
    fclose (file);
    kib[4] = kib[1] + kib[2];
    for (int i = 0; i < objects; i++)
        kib[4] += object_rss[i] < object_size[i] ? object_rss[i] : object_size[i];
    return 0;
}

static int
s_proc_fds (pid_t pid)
{
    char path[64];
    snprintf (path, sizeof path, "/proc/%d/fd", (int) pid);
    DIR *dir = opendir (path);
    if (!dir)
        return -1;
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir (dir)))
        if (entry->d_name[0] != '.')
            count++;
    closedir (dir);
    return count;
}

static uint64_t
s_bound_kib (const daemon_t *self)
{
    return (uint64_t) ((self->pool * 1.10 + OVERHEAD_MIB * MiB) / 1024);
}

static double
s_warmup (void)
{
    return s_opt.duration / 4 < 30 ? s_opt.duration / 4 : 30;
}

//  Chaos: a node's descriptors follow its peers (a link to each, the data plane's connections,
//  clients that come back): counted towards growth only once every daemon has run for
//  QUIET_SECONDS, so that a baseline taken while a peer was down is not mistaken for a leak.
#define QUIET_SECONDS 5
static double s_quiet_since;

static void
s_quiet_update (void)
{
    for (int d = 0; d < s_daemon_count; d++)
        if (!s_daemons[d].pid || s_daemons[d].frozen)
            s_quiet_since = bench_now ();
}

static void
s_daemon_sample (daemon_t *self)
{
    self->mem_now = self->rss_now = self->fd_now = -1;
    if (!self->pid || self->frozen)
        return;
    uint64_t kib[5];
    if (s_proc_rss (self->pid, kib) == 0) {
        self->rss_now = (int) kib[0];
        self->mem_now = (int) kib[4];
        if (kib[4] > self->mem_max)
            self->mem_max = kib[4];
        if (kib[0] > self->rss_max) {
            self->rss_max = kib[0];
            self->rss_anon_at_max = kib[1];
            self->rss_file_at_max = kib[2];
            self->rss_shmem_at_max = kib[3];
        }
    }
    self->fd_now = s_proc_fds (self->pid);
    if (self->fd_now >= 0 && bench_now () - self->started >= s_warmup ()
        && bench_now () - s_quiet_since >= QUIET_SECONDS) {
        if (self->fd_min < 0 || self->fd_now < self->fd_min)
            self->fd_min = self->fd_now;
        if (self->fd_now > self->fd_max)
            self->fd_max = self->fd_now;
        int n = self->fd_samples++;
        self->fd_recent[n % 10] = self->fd_now;
        if (n < 10 && (n == 0 || self->fd_now < self->fd_first_low))
            self->fd_first_low = self->fd_now;
        if (n >= 19) {
            int low = self->fd_recent[0];
            for (int i = 1; i < 10; i++)
                low = self->fd_recent[i] < low ? self->fd_recent[i] : low;
            if (low - self->fd_first_low > self->fd_growth_max)
                self->fd_growth_max = low - self->fd_first_low;
        }
    }
}

//  Whether a daemon that should run has exited by itself (then it counts as a crash).
static void
s_daemon_check (daemon_t *self)
{
    int status;
    if (self->pid && !self->frozen && waitpid (self->pid, &status, WNOHANG) == self->pid) {
        bench_wait (self->pid); //  (reaped already: this only takes it off bench_proc's list)
        fprintf (stderr, "kvpool-soak: %.1f s: %s (pid %d) exited by itself, %s %d (log %s.%d)\n",
                 s_now_ms () / 1000.0, self->name, (int) self->pid,
                 WIFSIGNALED (status) ? "signal" : "status",
                 WIFSIGNALED (status) ? WTERMSIG (status) : WEXITSTATUS (status), self->log,
                 self->incarnations - 1);
        self->pid = 0;
        self->crashes++;
        if (s_opt.chaos)
            atomic_store (&s_shared->fault_start[self - s_daemons], s_now_ms ());
    }
}

//  ---- chaos ---------------------------------------------------------------------------

typedef enum { FAULT_NONE, FAULT_KILL, FAULT_FREEZE } fault_kind_t;

typedef struct {
    fault_kind_t kind;
    int target;     //  a node, or MASTER
    double heal_at; //  bench_now () time of the restart or SIGCONT
    double next_at; //  when the next fault begins
    double grace_until;
    int count;
    char last[128]; //  the last event, for the CSV
} chaos_t;

//  Per daemon, when it was SIGKILLed (driver ms), for the final sweep's loss rule.
#define MAX_KILLS 512
static uint64_t s_kill_ms[DAEMONS][MAX_KILLS];
static int s_kill_count[DAEMONS];

static void
s_fault_begin (chaos_t *chaos, uint64_t *rng)
{
    chaos->target = (int) (s_rand (rng) % 5);
    if (chaos->target > MASTER)
        chaos->target = (int) (s_rand (rng) % NODES); //  nodes twice as often as the master
    daemon_t *d = &s_daemons[chaos->target];
    if (!d->pid)
        return;
    chaos->kind = s_rand (rng) % 2 ? FAULT_KILL : FAULT_FREEZE;
    atomic_store (&s_shared->window_open, 1);
    atomic_store (&s_shared->fault_start[chaos->target], s_now_ms ());
    double down = 0.5 + s_uniform (rng) * 5.5; //  sometimes past --node-ttl (2 s)
    if (chaos->kind == FAULT_KILL) {
        kill (d->pid, SIGKILL);
        bench_wait (d->pid);
        d->pid = 0;
        d->kills++;
        if (s_kill_count[chaos->target] < MAX_KILLS)
            s_kill_ms[chaos->target][s_kill_count[chaos->target]++] = s_now_ms ();
    }
    else {
        kill (d->pid, SIGSTOP);
        d->frozen = true;
        d->freezes++;
    }
    chaos->heal_at = bench_now () + down;
    chaos->count++;
    snprintf (chaos->last, sizeof chaos->last, "%s %s %.1fs",
              chaos->kind == FAULT_KILL ? "kill" : "freeze", d->name, down);
    printf ("  %6.1f s  %s\n", bench_now () - s_t0, chaos->last);
    fflush (stdout);
}

static void
s_fault_heal (chaos_t *chaos, uint64_t *rng)
{
    daemon_t *d = &s_daemons[chaos->target];
    if (chaos->kind == FAULT_KILL) {
        int rc = chaos->target == MASTER ? s_master_start () : s_node_start (chaos->target);
        if (rc != 0) {
            d->crashes++;
            chaos->heal_at = bench_now () + 1; //  try again
            return;
        }
    }
    else {
        kill (d->pid, SIGCONT);
        d->frozen = false;
    }
    snprintf (chaos->last, sizeof chaos->last, "%s %s",
              chaos->kind == FAULT_KILL ? "restart" : "thaw", d->name);
    chaos->kind = FAULT_NONE;
    chaos->grace_until = bench_now () + GRACE_MS / 1000.0;
    chaos->next_at = chaos->grace_until + s_opt.fault_every_min
                     + s_uniform (rng) * (s_opt.fault_every_max - s_opt.fault_every_min);
}

static void
s_chaos_tick (chaos_t *chaos, uint64_t *rng)
{
    double now = bench_now ();
    //  A daemon that died by itself (a crash, counted) is started again, as an operator
    //  would, so that one crash does not end the run's use; its keys' misses count as
    //  explained from then on (the crash is a fault too, if not a planned one).
    for (int d = 0; d < DAEMONS; d++)
        if (!s_daemons[d].pid && !(chaos->kind == FAULT_KILL && chaos->target == d)
            && now >= s_daemons[d].retry_at) {
            atomic_store (&s_shared->fault_start[d], s_now_ms ());
            atomic_store (&s_shared->window_open, 1);
            chaos->grace_until = now + GRACE_MS / 1000.0;
            int rc = d == MASTER ? s_master_start () : s_node_start (d);
            if (rc != 0)
                s_daemons[d].retry_at = now + 1;
            snprintf (chaos->last, sizeof chaos->last, "restart %s after its crash",
                      s_daemons[d].name);
            printf ("  %6.1f s  %s%s\n", now - s_t0, chaos->last, rc ? " failed" : "");
        }
    if (chaos->kind != FAULT_NONE && now >= chaos->heal_at)
        s_fault_heal (chaos, rng);
    else if (chaos->kind == FAULT_NONE && chaos->grace_until && now >= chaos->grace_until) {
        atomic_store (&s_shared->window_end, s_now_ms ());
        atomic_store (&s_shared->window_open, 0);
        chaos->grace_until = 0;
    }
    else if (chaos->kind == FAULT_NONE && !chaos->grace_until && now >= chaos->next_at)
        s_fault_begin (chaos, rng);
}

//  ---- the run ---------------------------------------------------------------------------

typedef struct {
    double t, ops_per_s, errors_per_s, unexpected_per_s, misses_per_s;
    uint64_t ops_total, wrong_bytes;
    int rss_kib[DAEMONS], fds[DAEMONS];
} sample_t;

static sample_t *s_samples;
static int s_sample_count;

static void
s_totals (uint64_t *ops, uint64_t *errors, uint64_t *unexpected)
{
    *ops = *errors = *unexpected = 0;
    for (int op = 0; op < OPS; op++)
        for (int st = 0; st < STATUSES; st++) {
            //  in_window first: a client counts ops before in_window, so this never exceeds n.
            uint64_t inside = atomic_load (&s_shared->in_window[op][st]);
            uint64_t n = atomic_load (&s_shared->ops[op][st]);
            int status = s_status_of_index (st);
            *ops += n;
            kind_t kind = s_kind (op, status, s_opt.chaos);
            if (kind == KIND_EXPECTED || kind == KIND_FAULT || kind == KIND_UNEXPECTED)
                *errors += n;
            if (kind == KIND_UNEXPECTED)
                *unexpected += n;
            else if (kind == KIND_FAULT) //  outside every fault window
                *unexpected += n - inside;
        }
}

static void
s_usage (void)
{
    printf ("Usage: kvpool-soak [OPTION...]\n"
            "The soak and chaos driver of kvpool (docs/soak.md). Exit 0: passed; 1: failed.\n\n"
            "  --duration S     seconds of load (default 600)\n"
            "  --clients N      client processes, half on tcp, half on the same-machine path "
            "(default 32)\n"
            "  --pool SIZE      memory pool of the daemon (chaos: of each node) "
            "(default 256MiB; chaos 192MiB)\n"
            "  --keys N         keys of the working set (default 20000; chaos 4000)\n"
            "  --zipf S         Zipf exponent of the key popularity (default 0.99)\n"
            "  --min-size SIZE  smallest value (default 512)\n"
            "  --max-size SIZE  largest value (default 256KiB); sizes are log-uniform\n"
            "  --disk           evicted objects go to a disk tier (--disk-capacity, default "
            "2 x pool)\n"
            "  --lease-ms MS    kvpoold --lease-ttl (default 1000)\n"
            "  --chaos          a master and three nodes, killed, frozen and restarted\n"
            "  --local-node     chaos: node 0 on this machine's host id (its ipc clients map "
            "its memory)\n"
            "  --fault-every A,B  chaos: seconds between faults, uniform in [A, B] (default "
            "5,15)\n"
            "  --seed N         the random seed (default 1)\n"
            "  --out DIR        soak.csv, soak.png, summary.txt, logs (default "
            "build/soak or build/chaos)\n"
            "  --kvpoold PATH   the daemon (default build/bin/kvpoold)\n"
            "  --trace-keys RE  kvpoold --trace-keys for every daemon: keys are soak/%%08u\n");
}

static uint64_t
s_parse_size (const char *text)
{
    char *end;
    double value = strtod (text, &end);
    if (!strcasecmp (end, "k") || !strcasecmp (end, "kib") || !strcasecmp (end, "kb"))
        value *= 1024;
    else if (!strcasecmp (end, "m") || !strcasecmp (end, "mib") || !strcasecmp (end, "mb"))
        value *= MiB;
    else if (!strcasecmp (end, "g") || !strcasecmp (end, "gib") || !strcasecmp (end, "gb"))
        value *= MiB * 1024;
    else if (*end)
        return 0;
    return (uint64_t) value;
}

static int
s_parse (int argc, char **argv)
{
    s_opt = (options_t){.duration = 600,
                        .clients = 32,
                        .zipf = 0.99,
                        .min_size = 512,
                        .max_size = 256 << 10,
                        .lease_ms = 1000,
                        .kvpoold = "build/bin/kvpoold",
                        .seed = 1,
                        .fault_every_min = 5,
                        .fault_every_max = 15};
    static struct option longs[] = {
        {"duration", 1, 0, 'd'},   {"clients", 1, 0, 'c'},  {"pool", 1, 0, 'p'},
        {"keys", 1, 0, 'k'},       {"zipf", 1, 0, 'z'},     {"min-size", 1, 0, 'm'},
        {"max-size", 1, 0, 'M'},   {"disk", 0, 0, 'D'},     {"disk-capacity", 1, 0, 'C'},
        {"chaos", 0, 0, 'X'},      {"out", 1, 0, 'o'},      {"kvpoold", 1, 0, 'K'},
        {"seed", 1, 0, 's'},       {"lease-ms", 1, 0, 'l'}, {"fault-every", 1, 0, 'f'},
        {"local-node", 0, 0, 'L'}, {"help", 0, 0, 'h'},     {"trace-keys", 1, 0, 'T'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long (argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
            case 'd': s_opt.duration = atof (optarg); break;
            case 'c': s_opt.clients = atoi (optarg); break;
            case 'p': s_opt.pool = s_parse_size (optarg); break;
            case 'k': s_opt.keys = atoi (optarg); break;
            case 'z': s_opt.zipf = atof (optarg); break;
            case 'm': s_opt.min_size = s_parse_size (optarg); break;
            case 'M': s_opt.max_size = s_parse_size (optarg); break;
            case 'D': s_opt.disk = true; break;
            case 'C': s_opt.disk_capacity = s_parse_size (optarg); break;
            case 'X': s_opt.chaos = true; break;
            case 'o': s_opt.out = optarg; break;
            case 'K': s_opt.kvpoold = optarg; break;
            case 's': s_opt.seed = atoi (optarg); break;
            case 'l': s_opt.lease_ms = atoi (optarg); break;
            case 'f':
                if (sscanf (optarg, "%d,%d", &s_opt.fault_every_min, &s_opt.fault_every_max) != 2
                    || s_opt.fault_every_min < 0 || s_opt.fault_every_max < s_opt.fault_every_min) {
                    fprintf (stderr, "kvpool-soak: --fault-every A,B\n");
                    return -1;
                }
                break;
            case 'L': s_opt.local_node = true; break;
            case 'T': s_opt.trace_keys = optarg; break;
            case 'h': s_usage (); exit (0);
            default: s_usage (); return -1;
        }
    }
    if (!s_opt.pool)
        s_opt.pool = s_opt.chaos ? 192 << 20 : 256 << 20;
    if (!s_opt.keys)
        s_opt.keys = s_opt.chaos ? 4000 : 20000;
    if (!s_opt.disk_capacity)
        s_opt.disk_capacity = 2 * s_opt.pool;
    if (!s_opt.out)
        s_opt.out = s_opt.chaos ? "build/chaos" : "build/soak";
    if (s_opt.duration <= 0 || s_opt.clients < 1 || s_opt.clients > MAX_CLIENTS || s_opt.keys < 1
        || s_opt.min_size < HEADER_SIZE + 1 || s_opt.max_size < s_opt.min_size
        || s_opt.max_size > (1u << 30) || s_opt.zipf < 0) {
        fprintf (stderr, "kvpool-soak: bad options (see --help)\n");
        return -1;
    }
    if (s_opt.chaos && s_opt.disk) {
        fprintf (stderr, "kvpool-soak: --chaos and --disk do not go together\n");
        return -1;
    }
    return 0;
}

static void
s_on_signal (int signum)
{
    if (s_shared)
        atomic_store (&s_shared->stop, 1);
    if (s_shm_dir[0]) {
        pid_t rm = fork ();
        if (rm == 0) {
            //  The daemons first (bench_on_signal stops them); this child waits a moment.
            struct timespec pause = {6, 0};
            nanosleep (&pause, NULL);
            char *const argv[] = {"/bin/rm", "-rf", s_shm_dir, NULL};
            execv (argv[0], argv);
            _exit (127);
        }
    }
    bench_on_signal (signum);
}

static void
s_write_plot (char *why, size_t why_size)
{
    char script[1100], png[1100], csv[1100], log[1100];
    snprintf (script, sizeof script, "%s/soak.gp", s_opt.out);
    snprintf (png, sizeof png, "%s/soak.png", s_opt.out);
    snprintf (csv, sizeof csv, "%s/soak.csv", s_opt.out);
    snprintf (log, sizeof log, "%s/gnuplot.log", s_opt.out);
    FILE *gp = fopen (script, "w");
    if (!gp) {
        snprintf (why, why_size, "cannot write %s", script);
        return;
    }
    double bound = (s_daemons[0].pool * 1.10 + OVERHEAD_MIB * MiB) / MiB;
    fprintf (gp, "# kvpool-soak: redraw with `gnuplot %s`\n", script);
    fprintf (gp, "set terminal pngcairo size 1100,1000 font 'sans,10'\n");
    fprintf (gp, "set output '%s'\nset datafile separator ','\nset datafile missing 'NaN'\n", png);
    fprintf (gp,
             "set multiplot layout 3,1 title \"kvpool-soak%s: %d clients, %.0f MiB pool%s, %d "
             "keys, Zipf %.2f, %.0f s\"\n",
             s_opt.chaos  ? " --chaos"
             : s_opt.disk ? " --disk"
                          : "",
             s_opt.clients, s_opt.pool / MiB, s_opt.chaos ? " per node" : "", s_opt.keys,
             s_opt.zipf, s_opt.duration);
    fprintf (gp, "set grid\nset key outside right\nset xlabel 'seconds'\n");
    fprintf (gp, "set ylabel 'resident (MiB)'\nset yrange [0:*]\n");
    fprintf (gp, "plot ");
    for (int d = 0; d < s_daemon_count; d++)
        fprintf (gp,
                 "'%s' using 1:($%d/1024) skip 1 with lines lw 2 title '%s resident', "
                 "'%s' using 1:($%d/1024) skip 1 with lines dt 3 title '%s VmRSS', ",
                 csv, 12 + d, s_daemons[d].name, csv, 16 + d, s_daemons[d].name);
    fprintf (gp, "%.1f with lines dt 2 lw 2 title 'bound (pool + 10%% + %d MiB)'\n", bound,
             OVERHEAD_MIB);
    fprintf (gp,
             "set ylabel 'ops/s'\nplot '%s' using 1:2 skip 1 with lines lw 2 title "
             "'throughput'\n",
             csv);
    fprintf (gp,
             "set ylabel 'per second'\nset logscale y\nset yrange [0.5:*]\n"
             "plot '%s' using 1:($4+0.5) skip 1 with lines lw 2 title 'errors (all kinds)', "
             "'%s' using 1:($5+0.5) skip 1 with lines lw 2 title 'misses of committed keys', "
             "'%s' using 1:($6+0.5) skip 1 with impulses lw 3 title 'unexpected errors'",
             csv, csv, csv);
    if (s_opt.chaos)
        fprintf (gp,
                 ", '%s' using 1:($24>0?$24*1000:NaN) skip 1 with impulses lc rgb 'gray' "
                 "title 'faults'",
                 csv);
    fprintf (gp, "\nunset multiplot\n");
    fclose (gp);
    const char *argv[] = {"/usr/bin/gnuplot", script, NULL};
    pid_t pid = bench_spawn (argv, log);
    int status = pid > 0 ? bench_wait (pid) : -1;
    if (status != 0)
        snprintf (why, why_size, "gnuplot exited with %d (see %s)", status, log);
    else
        unlink (log);
}

//  chaos: after the load, every fault healed and the nodes re-registered, each key whose
//  slot says committed is read once more through node 0. A miss is an object lost; it had
//  no surviving replica when every node that held it (every node when LOCATE could not say)
//  was SIGKILLed after its commit, and a surviving one otherwise. See docs/soak.md.
static void
s_final_sweep (uint64_t *checked, uint64_t *lost_no_replica, uint64_t *lost_with_replica,
               uint64_t *sweep_errors, uint64_t *sweep_wrong, uint64_t *sweep_stale)
{
    *checked = *lost_no_replica = *lost_with_replica = *sweep_errors = *sweep_wrong = *sweep_stale =
        0;
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.keep_endpoint = 1;
    kvpool_t *pool = kvpool_connect (s_daemons[0].endpoint, &options);
    if (!pool) {
        fprintf (stderr, "kvpool-soak: the sweep cannot connect to %s\n", s_daemons[0].endpoint);
        (*sweep_errors)++;
        return;
    }
    uint8_t *buffer = malloc (s_opt.max_size);
    char name[64];
    for (int key = 0; key < s_opt.keys && buffer; key++) {
        slot_t *slot = &s_shared->slots[key];
        uint32_t version = atomic_load (&slot->version);
        if (atomic_load (&slot->ambiguous) || !version)
            continue;
        s_key_name (key, name, sizeof name);
        int64_t got = kvpool_get_into (pool, name, buffer, s_opt.max_size);
        (*checked)++;
        if (got >= 0) {
            uint32_t read_version;
            uint64_t wrong = s_value_check (buffer, (size_t) got, key, &read_version);
            *sweep_wrong += wrong;
            if (!wrong && read_version != version)
                (*sweep_stale)++;
            continue;
        }
        if (got != KVPOOL_OBJECT_NOT_FOUND) {
            (*sweep_errors)++;
            continue;
        }
        uint64_t since = atomic_load (&slot->since);
        unsigned holders = atomic_load (&slot->holders);
        bool all_killed = true;
        for (int i = 0; i < NODES; i++) {
            if (holders && !(holders & (1u << i)))
                continue;
            bool killed = false;
            for (int k = 0; k < s_kill_count[i]; k++)
                killed |= s_kill_ms[i][k] >= since;
            all_killed &= killed;
        }
        if (all_killed)
            (*lost_no_replica)++;
        else if ((*lost_with_replica)++ < 5) //  the first few, to start an investigation from
            fprintf (stderr,
                     "kvpool-soak: the sweep found no key %u (%s): version %u committed at "
                     "%.1f s on nodes 0x%x, and one of them was not killed since\n",
                     key, name, version, since / 1000.0, holders);
    }
    free (buffer);
    kvpool_destroy (&pool);
}

int
main (int argc, char **argv)
{
    if (s_parse (argc, argv) != 0)
        return 2;
    setvbuf (stdout, NULL, _IOLBF, 0);
    s_t0 = bench_now ();
    if (s_zipf_init () != 0)
        return 2;
    mkdir (s_opt.out, 0755);
    char realout[PATH_MAX];
    if (!realpath (s_opt.out, realout)) {
        fprintf (stderr, "kvpool-soak: %s: %s\n", s_opt.out, strerror (errno));
        return 2;
    }
    s_opt.out = strdup (realout);
    size_t region = sizeof (shared_t) + sizeof (slot_t) * (size_t) s_opt.keys;
    s_shared = mmap (NULL, region, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s_shared == MAP_FAILED) {
        fprintf (stderr, "kvpool-soak: mmap: %s\n", strerror (errno));
        return 2;
    }
    s_samples = calloc (SAMPLE_MAX, sizeof *s_samples);
    signal (SIGINT, s_on_signal);
    signal (SIGTERM, s_on_signal);
    signal (SIGPIPE, SIG_IGN);

    //  The daemons.
    if (bench_scratch_new (s_opt.chaos ? "chaos" : "soak", s_dir, sizeof s_dir) != 0)
        return 2;
    static const char *node_names[NODES] = {"node-0", "node-1", "node-2"};
    s_daemon_count = s_opt.chaos ? DAEMONS : 1;
    for (int d = 0; d < s_daemon_count; d++) {
        daemon_t *self = &s_daemons[d];
        self->name = !s_opt.chaos ? "kvpoold" : d == MASTER ? "master" : node_names[d];
        self->pool = d == MASTER ? 0 : s_opt.pool;
        snprintf (self->ready, sizeof self->ready, "%s/%s.ready", s_dir, self->name);
        snprintf (self->log, sizeof self->log, "%s/%s.log", s_opt.out, self->name);
    }
    int rc = 0;
    uint64_t rng = bench_mix ((uint64_t) s_opt.seed * 7919) | 1;
    uint64_t port_rng = bench_mix ((uint64_t) getpid () << 20 ^ (uint64_t) time (NULL)) | 1;
    if (s_opt.chaos) {
        //  Segment files on tmpfs, as a node would keep them (test_node_restart.py).
        snprintf (s_shm_dir, sizeof s_shm_dir, "/dev/shm/kvpool-soak-%d", (int) getpid ());
        mkdir (s_shm_dir, 0700);
        for (int d = 0; d < NODES; d++)
            snprintf (s_daemons[d].segment_dir, sizeof s_daemons[d].segment_dir, "%s/%s", s_shm_dir,
                      s_daemons[d].name);
        for (int d = 0; d < DAEMONS; d++)
            s_daemons[d].port = s_pick_port (&port_rng);
        rc = s_master_start ();
        for (int d = 0; d < NODES && rc == 0; d++)
            rc = s_node_start (d);
    }
    else {
        snprintf (s_daemons[0].segment_dir, sizeof s_daemons[0].segment_dir, "%s/disk", s_dir);
        rc = s_node_start (0);
    }
    if (rc != 0) {
        for (int d = 0; d < s_daemon_count; d++)
            if (s_daemons[d].pid)
                bench_stop (s_daemons[d].pid);
        bench_scratch_remove ();
        return 2;
    }
    for (int d = 0; d < NODES && d < s_daemon_count; d++)
        snprintf (s_shared->endpoints[d], sizeof s_shared->endpoints[d], "%s",
                  s_daemons[d].endpoint);
    if (s_opt.chaos) {
        //  Every node registered before the load starts.
        kvpool_t *pool = kvpool_connect (s_daemons[0].endpoint, NULL);
        for (int i = 0; pool && i < 100; i++) {
            kvpool_node_t nodes[8];
            int n = kvpool_nodes (pool, nodes, 8), alive = 0;
            for (int j = 0; j < n && j < 8; j++)
                alive += nodes[j].alive && nodes[j].capacity > 0;
            if (alive == NODES)
                break;
            bench_sleep_ms (100);
        }
        kvpool_destroy (&pool);
    }

    printf ("kvpool-soak%s%s: %d clients, %.0f s, %d keys (Zipf %.2f), values %llu B - %llu "
            "KiB, pool %.0f MiB%s; output in %s\n",
            s_opt.chaos ? " --chaos" : "", s_opt.disk ? " --disk" : "", s_opt.clients,
            s_opt.duration, s_opt.keys, s_opt.zipf, (unsigned long long) s_opt.min_size,
            (unsigned long long) s_opt.max_size >> 10, s_opt.pool / MiB,
            s_opt.chaos ? " per node, master + 3 nodes" : "", s_opt.out);
    for (int d = 0; d < s_daemon_count; d++)
        printf ("  %s pid %d %s\n", s_daemons[d].name, (int) s_daemons[d].pid,
                s_daemons[d].endpoint);

    //  The clients.
    pid_t clients[MAX_CLIENTS];
    pid_t parent = getpid ();
    for (int i = 0; i < s_opt.clients; i++) {
        clients[i] = fork ();
        if (clients[i] == 0) {
            prctl (PR_SET_PDEATHSIG, SIGKILL);
            if (getppid () != parent)
                _exit (127);
            signal (SIGINT, SIG_DFL);
            signal (SIGTERM, SIG_DFL);
            _exit (s_client_run (i));
        }
    }

    char csv_path[1024];
    snprintf (csv_path, sizeof csv_path, "%s/soak.csv", s_opt.out);
    FILE *csv = fopen (csv_path, "w");
    if (csv)
        fprintf (csv, "seconds,ops_per_s,ops_total,errors_per_s,misses_per_s,unexpected_per_s,"
                      "gets_per_s,puts_per_s,exists_per_s,removes_per_s,wrong_bytes,"
                      "mem_kib_0,mem_kib_1,mem_kib_2,mem_kib_3,vmrss_kib_0,vmrss_kib_1,vmrss_kib_2,"
                      "vmrss_kib_3,fds_0,fds_1,fds_2,fds_3,fault,"
                      "event\n");

    //  The load, sampled every second.
    chaos_t chaos = {.next_at = bench_now () + 5};
    double start = bench_now (), next_sample = start + 1;
    uint64_t last_ops = 0, last_errors = 0, last_unexpected = 0, last_misses = 0;
    uint64_t last_by_op[OPS] = {0};
    int client_crashes = 0, clients_running = s_opt.clients;
    bool client_done[MAX_CLIENTS] = {false};
    while (bench_now () - start < s_opt.duration) {
        if (s_opt.chaos)
            s_chaos_tick (&chaos, &rng);
        for (int d = 0; d < s_daemon_count; d++)
            s_daemon_check (&s_daemons[d]);
        for (int i = 0; i < s_opt.clients; i++) {
            int status;
            if (!client_done[i] && waitpid (clients[i], &status, WNOHANG) == clients[i]) {
                client_done[i] = true;
                clients_running--;
                client_crashes++;
                fprintf (stderr, "kvpool-soak: client %d ended early: %s %d\n", i,
                         WIFSIGNALED (status) ? "signal" : "status",
                         WIFSIGNALED (status) ? WTERMSIG (status) : WEXITSTATUS (status));
            }
        }
        if (bench_now () < next_sample) {
            bench_sleep_ms (s_opt.chaos ? 50 : 100);
            continue;
        }
        double elapsed = bench_now () - next_sample + 1;
        next_sample += 1;
        uint64_t ops, errors, unexpected;
        s_totals (&ops, &errors, &unexpected);
        uint64_t misses = atomic_load (&s_shared->misses_committed);
        uint64_t by_op[OPS];
        for (int op = 0; op < OPS; op++) {
            by_op[op] = 0;
            for (int st = 0; st < STATUSES; st++)
                by_op[op] += atomic_load (&s_shared->ops[op][st]);
        }
        sample_t *sample = s_sample_count < SAMPLE_MAX ? &s_samples[s_sample_count++] : NULL;
        s_quiet_update ();
        for (int d = 0; d < s_daemon_count; d++)
            s_daemon_sample (&s_daemons[d]);
        if (sample) {
            sample->t = bench_now () - start;
            sample->ops_per_s = (ops - last_ops) / elapsed;
        }
        if (csv) {
            fprintf (csv, "%.1f,%.0f,%llu,%.0f,%.0f,%.0f", bench_now () - start,
                     (ops - last_ops) / elapsed, (unsigned long long) ops,
                     (errors - last_errors) / elapsed, (misses - last_misses) / elapsed,
                     (unexpected - last_unexpected) / elapsed);
            for (int op = 0; op < 4; op++)
                fprintf (csv, ",%.0f", (by_op[op] - last_by_op[op]) / elapsed);
            fprintf (csv, ",%llu", (unsigned long long) atomic_load (&s_shared->wrong_bytes));
            for (int d = 0; d < DAEMONS; d++)
                if (d < s_daemon_count && s_daemons[d].mem_now >= 0)
                    fprintf (csv, ",%d", s_daemons[d].mem_now);
                else
                    fprintf (csv, ",NaN");
            for (int d = 0; d < DAEMONS; d++)
                if (d < s_daemon_count && s_daemons[d].rss_now >= 0)
                    fprintf (csv, ",%d", s_daemons[d].rss_now);
                else
                    fprintf (csv, ",NaN");
            for (int d = 0; d < DAEMONS; d++)
                if (d < s_daemon_count && s_daemons[d].fd_now >= 0)
                    fprintf (csv, ",%d", s_daemons[d].fd_now);
                else
                    fprintf (csv, ",NaN");
            fprintf (csv, ",%d,%s\n", s_opt.chaos && chaos.kind != FAULT_NONE ? 1 : 0, chaos.last);
            chaos.last[0] = 0;
            fflush (csv);
        }
        last_ops = ops;
        last_errors = errors;
        last_unexpected = unexpected;
        last_misses = misses;
        memcpy (last_by_op, by_op, sizeof by_op);
        int second = (int) (bench_now () - start + 0.5);
        if (second % 30 == 0 || second < 2)
            printf ("  %4d s  %7.0f ops/s  %llu ops  %llu errors  %llu unexpected  %llu wrong "
                    "bytes  rss %s %d MiB\n",
                    second, sample ? sample->ops_per_s : 0.0, (unsigned long long) ops,
                    (unsigned long long) errors, (unsigned long long) unexpected,
                    (unsigned long long) atomic_load (&s_shared->wrong_bytes), s_daemons[0].name,
                    s_daemons[0].mem_now / 1024);
    }
    double load_seconds = bench_now () - start;

    //  The clients stop after the operation they are in (at most a request timeout).
    atomic_store (&s_shared->stop, 1);
    int client_hangs = 0;
    double deadline = bench_now () + 20;
    while (clients_running > 0 && bench_now () < deadline) {
        for (int i = 0; i < s_opt.clients; i++) {
            int status;
            if (!client_done[i] && waitpid (clients[i], &status, WNOHANG) == clients[i]) {
                client_done[i] = true;
                clients_running--;
                if (!WIFEXITED (status) || WEXITSTATUS (status) != 0) {
                    client_crashes++;
                    fprintf (stderr, "kvpool-soak: client %d ended with %s %d\n", i,
                             WIFSIGNALED (status) ? "signal" : "status",
                             WIFSIGNALED (status) ? WTERMSIG (status) : WEXITSTATUS (status));
                }
            }
        }
        bench_sleep_ms (50);
    }
    for (int i = 0; i < s_opt.clients; i++)
        if (!client_done[i]) {
            kill (clients[i], SIGKILL);
            waitpid (clients[i], NULL, 0);
            client_hangs++;
        }
    uint64_t ops_total, errors_total, unexpected_total;
    s_totals (&ops_total, &errors_total, &unexpected_total);

    //  chaos: heal what is still broken, let the nodes re-register, and sweep.
    uint64_t checked = 0, lost_none = 0, lost_some = 0, sweep_errors = 0, sweep_wrong = 0,
             sweep_stale = 0;
    if (s_opt.chaos) {
        if (chaos.kind != FAULT_NONE)
            s_fault_heal (&chaos, &rng);
        for (int d = 0; d < DAEMONS; d++) {
            s_daemon_check (&s_daemons[d]);
            if (!s_daemons[d].pid)
                (d == MASTER ? s_master_start () : s_node_start (d));
        }
        bench_sleep_ms (2000 + 2 * 200 + 3000); //  node ttl, two heartbeats, slack
        for (int d = 0; d < DAEMONS; d++)
            s_daemon_check (&s_daemons[d]);
        s_final_sweep (&checked, &lost_none, &lost_some, &sweep_errors, &sweep_wrong, &sweep_stale);
    }

    //  The daemons' own view, then SIGTERM: each must stop cleanly (status 0).
    kvpool_stats_t stats[DAEMONS];
    memset (stats, 0, sizeof stats);
    for (int d = 0; d < s_daemon_count && d < NODES; d++) {
        kvpool_options_t options;
        kvpool_options_init (&options);
        options.keep_endpoint = 1;
        kvpool_t *pool = s_daemons[d].pid ? kvpool_connect (s_daemons[d].endpoint, &options) : NULL;
        if (pool)
            kvpool_stats (pool, &stats[d]);
        kvpool_destroy (&pool);
    }
    for (int d = 0; d < s_daemon_count; d++)
        s_daemon_check (&s_daemons[d]);
    int stop_failures = 0;
    for (int d = 0; d < s_daemon_count; d++) {
        if (!s_daemons[d].pid)
            continue;
        s_daemons[d].stop_status = bench_stop (s_daemons[d].pid);
        s_daemons[d].pid = 0;
        stop_failures += s_daemons[d].stop_status != 0;
    }
    if (csv)
        fclose (csv);

    //  The verdict.
    char summary_path[1024];
    snprintf (summary_path, sizeof summary_path, "%s/summary.txt", s_opt.out);
    FILE *outs[2] = {stdout, fopen (summary_path, "w")};
    uint64_t wrong = atomic_load (&s_shared->wrong_bytes) + sweep_wrong;
    int daemon_crashes = 0;
    bool rss_ok = true, fd_ok = true;
    for (int d = 0; d < s_daemon_count; d++) {
        daemon_crashes += s_daemons[d].crashes;
        uint64_t bound =
            d == MASTER ? (uint64_t) (OVERHEAD_MIB * 1024) : s_bound_kib (&s_daemons[d]);
        rss_ok &= s_daemons[d].mem_max <= bound;
        fd_ok &= s_daemons[d].fd_growth_max <= FD_SLACK;
    }
    uint64_t stale = atomic_load (&s_shared->stale_reads);
    uint64_t resurrected = atomic_load (&s_shared->resurrected_reads);
    uint64_t unexplained = atomic_load (&s_shared->misses_unexplained);
    bool pass = wrong == 0 && atomic_load (&s_shared->wrong_values) == 0 && daemon_crashes == 0
                && client_crashes == 0 && client_hangs == 0 && unexpected_total == 0 && rss_ok
                && fd_ok && stop_failures == 0 && ops_total > 0;
    //  A removed key read back, or an older version read after a newer one committed, is a
    //  broken promise: in a cluster whose nodes die, stop and come back with what they held
    //  too (docs/cluster.md, "What a node that was away cannot bring back").
    pass &= stale == 0 && resurrected == 0;
    if (s_opt.chaos)
        pass &= unexplained == 0 && lost_some == 0 && sweep_errors == 0 && sweep_stale == 0;

    for (int o = 0; o < 2; o++) {
        FILE *f = outs[o];
        if (!f)
            continue;
        fprintf (f,
                 "\nkvpool-soak%s%s summary: %d clients (%u tcp, %u ipc, %u of them on shared "
                 "memory), %.0f s, %d keys, Zipf %.2f\n",
                 s_opt.chaos ? " --chaos" : "", s_opt.disk ? " --disk" : "", s_opt.clients,
                 atomic_load (&s_shared->tcp_clients), atomic_load (&s_shared->ipc_clients),
                 atomic_load (&s_shared->fast_path_clients), load_seconds, s_opt.keys, s_opt.zipf);
        fprintf (f, "  throughput        %.0f ops/s (%llu ops), %.1f MiB/s verified reads\n",
                 ops_total / load_seconds, (unsigned long long) ops_total,
                 atomic_load (&s_shared->verified_bytes) / MiB / load_seconds);
        fprintf (f, "  %-8s %10s", "op", "total");
        for (int st = 0; st < STATUSES; st++) {
            uint64_t any = 0;
            for (int op = 0; op < OPS; op++)
                any += atomic_load (&s_shared->ops[op][st]);
            if (any)
                fprintf (f, " %12.12s",
                         st == STATUS_OTHER ? "OTHER"
                                            : kvpool_status_name (s_status_of_index (st)));
        }
        fprintf (f, "\n");
        for (int op = 0; op < OPS; op++) {
            uint64_t total = 0;
            for (int st = 0; st < STATUSES; st++)
                total += atomic_load (&s_shared->ops[op][st]);
            if (!total)
                continue;
            fprintf (f, "  %-8s %10llu", s_op_names[op], (unsigned long long) total);
            for (int st = 0; st < STATUSES; st++) {
                uint64_t any = 0;
                for (int o2 = 0; o2 < OPS; o2++)
                    any += atomic_load (&s_shared->ops[o2][st]);
                if (any)
                    fprintf (f, " %12llu",
                             (unsigned long long) atomic_load (&s_shared->ops[op][st]));
            }
            fprintf (f, "\n");
        }
        fprintf (f, "  errors by kind   ");
        for (int op = 0; op < OPS; op++)
            for (int st = 0; st < STATUSES; st++) {
                uint64_t n = atomic_load (&s_shared->ops[op][st]);
                int status = s_status_of_index (st);
                kind_t kind = s_kind (op, status, s_opt.chaos);
                if (!n || kind == KIND_OK || kind == KIND_OUTCOME)
                    continue;
                fprintf (f, " %s %s %llu%s", s_op_names[op],
                         st == STATUS_OTHER ? "OTHER" : kvpool_status_name (status),
                         (unsigned long long) n,
                         kind == KIND_UNEXPECTED ? " (UNEXPECTED)"
                         : kind == KIND_FAULT    ? (n > atomic_load (&s_shared->in_window[op][st])
                                                        ? " (some OUTSIDE a fault window)"
                                                        : " (in fault windows)")
                                                 : "");
            }
        fprintf (f, "\n  unexpected errors %llu\n", (unsigned long long) unexpected_total);
        fprintf (f, "  wrong bytes       %llu (in %llu values; %llu values, %.1f GiB verified)\n",
                 (unsigned long long) wrong,
                 (unsigned long long) atomic_load (&s_shared->wrong_values),
                 (unsigned long long) atomic_load (&s_shared->verified_values),
                 atomic_load (&s_shared->verified_bytes) / MiB / 1024);
        fprintf (f,
                 "  reads of a committed key: %llu misses (%s), %llu misses racing a "
                 "mutation, %llu stale versions, %llu removed keys read back\n",
                 (unsigned long long) atomic_load (&s_shared->misses_committed),
                 s_opt.chaos ? "faults" : "eviction",
                 (unsigned long long) atomic_load (&s_shared->misses_raced),
                 (unsigned long long) stale, (unsigned long long) resurrected);
        if (s_opt.chaos) {
            fprintf (f,
                     "  misses of committed keys: %llu with a holder or the master faulted "
                     "since the commit, %llu with none (must be 0)\n",
                     (unsigned long long) atomic_load (&s_shared->misses_explained),
                     (unsigned long long) unexplained);
            fprintf (f, "  faults            %d (", chaos.count);
            for (int d = 0; d < DAEMONS; d++)
                fprintf (f, "%s%s %d kills %d freezes", d ? ", " : "", s_daemons[d].name,
                         s_daemons[d].kills, s_daemons[d].freezes);
            fprintf (f, "); client reconnects %llu\n",
                     (unsigned long long) atomic_load (&s_shared->reconnects));
            fprintf (f,
                     "  final sweep       %llu committed keys read: objects lost %llu with no "
                     "surviving replica, %llu with one (must be 0); %llu errors, %llu stale\n",
                     (unsigned long long) checked, (unsigned long long) lost_none,
                     (unsigned long long) lost_some, (unsigned long long) sweep_errors,
                     (unsigned long long) sweep_stale);
        }
        for (int d = 0; d < s_daemon_count; d++) {
            const daemon_t *dm = &s_daemons[d];
            uint64_t bound = d == MASTER ? (uint64_t) (OVERHEAD_MIB * 1024) : s_bound_kib (dm);
            fprintf (f,
                     "  %-8s max resident %.1f MiB (shared pages once) vs bound %.1f MiB %s; "
                     "max VmRSS %.1f MiB (anon %.1f, file %.1f, shmem %.1f); fds after "
                     "warm-up: growth %d (bound %d) %s, range %d..%d; crashes %d, stop status "
                     "%d\n",
                     dm->name, dm->mem_max / 1024.0, bound / 1024.0,
                     dm->mem_max <= bound ? "ok" : "OVER", dm->rss_max / 1024.0,
                     dm->rss_anon_at_max / 1024.0, dm->rss_file_at_max / 1024.0,
                     dm->rss_shmem_at_max / 1024.0, dm->fd_growth_max, FD_SLACK,
                     dm->fd_growth_max <= FD_SLACK ? "ok" : "GREW", dm->fd_min, dm->fd_max,
                     dm->crashes, dm->stop_status);
        }
        for (int d = 0; d < s_daemon_count && d < NODES; d++)
            fprintf (
                f,
                "  %-8s stats: objects %llu, evictions %llu, offloads %llu, disk hits "
                "%llu, disk drops %llu, disk corrupt %llu, utilisation %.2f\n",
                s_daemons[d].name, (unsigned long long) stats[d].objects,
                (unsigned long long) stats[d].evictions, (unsigned long long) stats[d].offloads,
                (unsigned long long) stats[d].disk_hits, (unsigned long long) stats[d].disk_drops,
                (unsigned long long) stats[d].disk_corrupt, stats[d].utilisation);
        fprintf (f, "  clients: %d crashed, %d hung\n", client_crashes, client_hangs);
        fprintf (f, "%s\n", pass ? "PASS" : "FAIL");
    }
    if (outs[1])
        fclose (outs[1]);
    char why[2400] = "";
    s_write_plot (why, sizeof why);
    printf ("  files: %s/soak.csv, %s/soak.png, %s/summary.txt%s%s\n", s_opt.out, s_opt.out,
            s_opt.out, why[0] ? "; no plot: " : "", why);
    bench_scratch_remove ();
    if (s_shm_dir[0]) {
        char command[600];
        snprintf (command, sizeof command, "rm -rf '%s'", s_shm_dir);
        if (system (command) != 0)
            fprintf (stderr, "kvpool-soak: cannot remove %s\n", s_shm_dir);
    }
    return pass ? 0 : 1;
}
