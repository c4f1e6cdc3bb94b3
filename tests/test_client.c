/*  test_client.c - integration test of libkvpool (include/kvpool.h) against the real kvpoold.

    Starts kvpoold on a loopback port (two 256 MiB segments), then runs the same suite twice:
    once over the socket only and once with the same-machine fast path (which this test
    requires to come on, since client and node share the machine). Every value is checked
    byte for byte, from 1 byte to 8 MiB and in batches of 100; then error statuses, the
    low-level two-phase calls, segments, stats, and timeouts (the node is stopped with SIGSTOP
    so that requests go unanswered, then resumed).

    With KVPOOL_TEST_ENDPOINT set, it runs against that node instead of starting one (and
    skips the tests that need to stop the node).
*/
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "client/process.h"
#include "shm/segment.h"
#include "kvpool.h"
#include "tests/testutil.h"

#define MiB (1u << 20)

static const char *s_endpoint;
static testutil_server_t s_server;
static testutil_server_t s_other; //  the restart test's node

//  The node must never outlive a failed test, least of all stopped by SIGSTOP: kill it on
//  any exit (CHECK calls exit) and on the signals a test runner sends.
static void
s_kill_server (void)
{
    testutil_server_t *servers[] = {&s_server, &s_other};
    for (int i = 0; i < 2; i++)
        if (servers[i]->pid > 0) {
            kill (servers[i]->pid, SIGKILL);
            unlink (servers[i]->ready_file);
        }
}

static void
s_on_signal (int signal)
{
    s_kill_server ();
    _exit (128 + signal);
}

static int64_t
s_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

//  Deterministic bytes for (seed, size): a value check fails on any misplaced byte.
static void
s_fill (void *buffer, size_t size, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + size + 1;
    unsigned char *p = buffer;
    for (size_t i = 0; i < size; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (unsigned char) (x >> 24);
    }
}

static void *
s_value (size_t size, uint64_t seed)
{
    void *buffer = malloc (size ? size : 1);
    CHECK (buffer);
    s_fill (buffer, size, seed);
    return buffer;
}

static bool
s_equal (const void *data, size_t size, uint64_t seed)
{
    void *expected = s_value (size, seed);
    bool equal = memcmp (data, expected, size) == 0;
    free (expected);
    return equal;
}

static kvpool_t *
s_connect (bool fast, int timeout_ms)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    CHECK_EQ (options.timeout_ms, 5000);
    CHECK_EQ (options.fast_path, 1);
    options.fast_path = fast;
    if (timeout_ms)
        options.timeout_ms = timeout_ms;
    kvpool_t *pool = kvpool_connect (s_endpoint, &options);
    CHECK (pool);
    CHECK_EQ (kvpool_fast_path (pool), fast);
    return pool;
}

//  ---- connecting ------------------------------------------------------------------------------

//  A port on 127.0.0.1 that nobody listens on (bound, then closed, so it was free).
static int
s_dead_port (void)
{
    int fd = socket (AF_INET, SOCK_STREAM, 0);
    CHECK (fd >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl (0x7f000001)};
    CHECK (bind (fd, (struct sockaddr *) &addr, sizeof addr) == 0);
    socklen_t len = sizeof addr;
    CHECK (getsockname (fd, (struct sockaddr *) &addr, &len) == 0);
    close (fd);
    return ntohs (addr.sin_port);
}

static void
s_test_connect (void)
{
    char endpoint[64];
    snprintf (endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", s_dead_port ());
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = 300;
    int64_t start = s_now_ms ();
    kvpool_t *pool = kvpool_connect (endpoint, &options);
    int64_t elapsed = s_now_ms () - start;
    CHECK (pool == NULL);
    CHECK (elapsed >= 250);
    CHECK (elapsed < 2000);
    //  (Refused for the whole of a timeout shorter than the refusal window: said as such.)
    CHECK_EQ (errno, ECONNREFUSED);

    //  Nothing listens: said within the refusal window (500 ms), far within the default
    //  timeout (5 s), in words and errno, for tcp and ipc.
    char expected[160];
    start = s_now_ms ();
    CHECK (kvpool_connect (endpoint, NULL) == NULL);
    elapsed = s_now_ms () - start;
    CHECK_EQ (errno, ECONNREFUSED);
    CHECK (elapsed >= 450 && elapsed < 1500);
    snprintf (expected, sizeof expected,
              "connection refused: nothing listens on %s (Connection refused)", endpoint);
    CHECK (strcmp (kvpool_connect_error (), expected) == 0);
    const char *no_file = "ipc:///tmp/kvpool-test-no-such-socket";
    start = s_now_ms ();
    CHECK (kvpool_connect (no_file, NULL) == NULL);
    CHECK_EQ (errno, ECONNREFUSED);
    CHECK (s_now_ms () - start < 1500);
    snprintf (expected, sizeof expected,
              "connection refused: nothing listens on %s (No such file or directory)", no_file);
    CHECK (strcmp (kvpool_connect_error (), expected) == 0);
    //  A connect that succeeds says nothing.
    kvpool_t *live = kvpool_connect (s_endpoint, NULL);
    CHECK (live && strcmp (kvpool_connect_error (), "") == 0);
    kvpool_destroy (&live);

    //  connect_timeout_ms overrides timeout_ms for the first PING.
    options.timeout_ms = 10000;
    options.connect_timeout_ms = 200;
    start = s_now_ms ();
    CHECK (kvpool_connect (endpoint, &options) == NULL);
    elapsed = s_now_ms () - start;
    CHECK (elapsed >= 150);
    CHECK (elapsed < 2000);

    //  An endpoint libzmq cannot parse fails at once.
    start = s_now_ms ();
    CHECK (kvpool_connect ("nonsense://nowhere", NULL) == NULL);
    CHECK (s_now_ms () - start < 1000);

    //  Two connections side by side, destroyed in either order (they share a context).
    kvpool_t *a = kvpool_connect (s_endpoint, NULL);
    kvpool_t *b = kvpool_connect (s_endpoint, NULL);
    CHECK (a && b);
    CHECK_EQ (kvpool_ping (a), KVPOOL_OK);
    CHECK_EQ (kvpool_ping (b), KVPOOL_OK);
    kvpool_destroy (&a);
    CHECK (a == NULL);
    CHECK_EQ (kvpool_ping (b), KVPOOL_OK);
    kvpool_destroy (&b);
    kvpool_destroy (&b); //  NULL is fine
    kvpool_destroy (NULL);

    //  Library-side argument checks need no server.
    CHECK_EQ (kvpool_ping (NULL), KVPOOL_INVALID_PARAMS);
    CHECK_EQ (kvpool_put (NULL, "k", "v", 1, NULL), KVPOOL_INVALID_PARAMS);
    CHECK (strcmp (kvpool_last_error (NULL), "") == 0);
    CHECK (strcmp (kvpool_strerror (KVPOOL_OBJECT_NOT_FOUND), "object not found") == 0);
    CHECK (strcmp (kvpool_status_name (KVPOOL_BUFFER_OVERFLOW), "BUFFER_OVERFLOW") == 0);

    //  Packed keys, as bindings hand them over: three keys, one of them empty.
    const char blob[] = "alpha\0\0gamma";
    const char *keys[3] = {NULL, NULL, NULL};
    CHECK_EQ (kvpool_keys_unpack (blob, sizeof blob, 3, keys), KVPOOL_OK);
    CHECK (keys[0] == blob && keys[1] == blob + 6 && keys[2] == blob + 7);
    CHECK (strcmp (keys[2], "gamma") == 0);
    CHECK_EQ (kvpool_keys_unpack (blob, sizeof blob, 2, keys), KVPOOL_INVALID_PARAMS);
    CHECK_EQ (kvpool_keys_unpack (blob, sizeof blob, 4, keys), KVPOOL_INVALID_PARAMS);
    CHECK_EQ (kvpool_keys_unpack (blob, sizeof blob - 1, 3, keys), KVPOOL_INVALID_PARAMS);
    CHECK_EQ (kvpool_keys_unpack (NULL, 0, 0, keys), KVPOOL_OK);
    CHECK_EQ (kvpool_keys_unpack (NULL, 0, 1, keys), KVPOOL_INVALID_PARAMS);
}

//  ---- single values ---------------------------------------------------------------------------

static void
s_key (char *buf, size_t size, const char *prefix, const char *name, size_t i)
{
    snprintf (buf, size, "%s-%s-%zu", prefix, name, i);
}

static void
s_test_values (kvpool_t *pool, const char *prefix)
{
    static const size_t sizes[] = {1,     2,     100,     4095,        4096,        65535,
                                   65536, 65537, 1 * MiB, 1 * MiB + 1, 3 * MiB + 7, 8 * MiB};
    size_t count = sizeof sizes / sizeof sizes[0];
    char key[128];
    for (size_t i = 0; i < count; i++) {
        size_t size = sizes[i];
        uint64_t seed = 1000 + i;
        s_key (key, sizeof key, prefix, "value", i);
        void *value = s_value (size, seed);
        CHECK_EQ (kvpool_exist (pool, key), 0);
        CHECK_EQ (kvpool_put (pool, key, value, size, NULL), KVPOOL_OK);
        free (value);
        CHECK_EQ (kvpool_exist (pool, key), 1);
        CHECK_EQ (kvpool_get_size (pool, key), (int64_t) size);

        //  kvpool_get: a malloc'd copy.
        void *data = NULL;
        size_t got = 0;
        CHECK_EQ (kvpool_get (pool, key, &data, &got), KVPOOL_OK);
        CHECK_EQ (got, size);
        CHECK (s_equal (data, got, seed));
        free (data);

        //  get_into: exact capacity, then a larger buffer (bytes past the value untouched).
        unsigned char *buffer = malloc (size + 16);
        CHECK (buffer);
        CHECK_EQ (kvpool_get_into (pool, key, buffer, size), (int64_t) size);
        CHECK (s_equal (buffer, size, seed));
        memset (buffer, 0xA5, size + 16);
        CHECK_EQ (kvpool_get_into (pool, key, buffer, size + 16), (int64_t) size);
        CHECK (s_equal (buffer, size, seed));
        for (size_t b = size; b < size + 16; b++)
            CHECK_EQ (buffer[b], 0xA5);

        //  One byte short: BUFFER_OVERFLOW and not a byte written.
        memset (buffer, 0x5A, size + 16);
        CHECK_EQ (kvpool_get_into (pool, key, buffer, size - 1), KVPOOL_BUFFER_OVERFLOW);
        for (size_t b = 0; b < size + 16; b++)
            CHECK_EQ (buffer[b], 0x5A);
        free (buffer);
    }

    //  Gather: a value put from three parts reads back as their concatenation.
    s_key (key, sizeof key, prefix, "parts", 0);
    unsigned char *whole = s_value (2 * MiB + 3, 77);
    kvpool_iov_t parts[3] = {{whole, 1}, {whole + 1, MiB}, {whole + 1 + MiB, MiB + 2}};
    CHECK_EQ (kvpool_put_parts (pool, key, parts, 3, NULL), KVPOOL_OK);
    void *data;
    size_t got;
    CHECK_EQ (kvpool_get (pool, key, &data, &got), KVPOOL_OK);
    CHECK_EQ (got, 2 * MiB + 3);
    CHECK (memcmp (data, whole, got) == 0);
    free (data);
    //  ... and small parts too (below the zero-copy size).
    s_key (key, sizeof key, prefix, "parts", 1);
    kvpool_iov_t small[3] = {{whole, 10}, {whole + 10, 0}, {whole + 10, 20}};
    CHECK_EQ (kvpool_put_parts (pool, key, small, 3, NULL), KVPOOL_OK);
    unsigned char buffer[64];
    CHECK_EQ (kvpool_get_into (pool, key, buffer, sizeof buffer), 30);
    CHECK (memcmp (buffer, whole, 30) == 0);
    free (whole);

    //  A second put of an existing key is refused and the first value kept.
    s_key (key, sizeof key, prefix, "value", 2); //  100 bytes of seed 1002
    void *other = s_value (100, 9999);
    CHECK_EQ (kvpool_put (pool, key, other, 100, NULL), KVPOOL_OBJECT_ALREADY_EXISTS);
    free (other);
    other = s_value (5000, 9999);
    CHECK_EQ (kvpool_put (pool, key, other, 5000, NULL), KVPOOL_OBJECT_ALREADY_EXISTS);
    free (other);
    CHECK_EQ (kvpool_get_size (pool, key), 100);
    CHECK_EQ (kvpool_get_into (pool, key, buffer, sizeof buffer), KVPOOL_BUFFER_OVERFLOW);
    CHECK_EQ (kvpool_get (pool, key, &data, &got), KVPOOL_OK);
    CHECK_EQ (got, 100);
    CHECK (s_equal (data, got, 1002));
    free (data);

    //  Missing keys.
    s_key (key, sizeof key, prefix, "missing", 0);
    data = (void *) 1;
    CHECK_EQ (kvpool_get (pool, key, &data, &got), KVPOOL_OBJECT_NOT_FOUND);
    CHECK (data == NULL);
    CHECK_EQ (got, 0);
    CHECK_EQ (kvpool_get_into (pool, key, buffer, sizeof buffer), KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (kvpool_exist (pool, key), 0);
    CHECK_EQ (kvpool_get_size (pool, key), KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (kvpool_remove (pool, key, false), KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (kvpool_remove (pool, key, true), KVPOOL_OBJECT_NOT_FOUND);

    //  Invalid keys are refused by the library for every call.
    const char *bad[] = {"", NULL};
    for (int b = 0; b < 2; b++) {
        CHECK_EQ (kvpool_put (pool, bad[b], "x", 1, NULL), KVPOOL_INVALID_KEY);
        CHECK_EQ (kvpool_get (pool, bad[b], &data, &got), KVPOOL_INVALID_KEY);
        CHECK_EQ (kvpool_get_into (pool, bad[b], buffer, sizeof buffer), KVPOOL_INVALID_KEY);
        CHECK_EQ (kvpool_exist (pool, bad[b]), KVPOOL_INVALID_KEY);
        CHECK_EQ (kvpool_get_size (pool, bad[b]), KVPOOL_INVALID_KEY);
        CHECK_EQ (kvpool_remove (pool, bad[b], true), KVPOOL_INVALID_KEY);
        CHECK (*kvpool_last_error (pool));
    }
    //  A NULL buffer with a size is refused, a NULL buffer of size 0 is a valid empty part.
    s_key (key, sizeof key, prefix, "nullbuf", 0);
    CHECK_EQ (kvpool_put (pool, key, NULL, 10, NULL), KVPOOL_INVALID_PARAMS);
    CHECK_EQ (kvpool_get_into (pool, key, NULL, 10), KVPOOL_INVALID_PARAMS);
    CHECK_EQ (kvpool_exist (pool, key), 0);

    //  A read lease holds an object against a remove without force. Reads served from the
    //  same-machine index take none, so this one is made to ask the node.
    bool indexed = kvpool_set_index (pool, true);
    CHECK (indexed == kvpool_fast_path (pool)); //  the fast path maps the node's index
    kvpool_set_index (pool, false);
    s_key (key, sizeof key, prefix, "leased", 0);
    CHECK_EQ (kvpool_put (pool, key, "leased", 6, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_get_into (pool, key, buffer, sizeof buffer), 6);
    CHECK_EQ (kvpool_remove (pool, key, false), KVPOOL_OBJECT_HAS_LEASE);
    CHECK_EQ (kvpool_exist (pool, key), 1);
    CHECK_EQ (kvpool_remove (pool, key, true), KVPOOL_OK);
    CHECK_EQ (kvpool_exist (pool, key), 0);
    kvpool_set_index (pool, true);
    if (indexed) {
        //  An index read: the right bytes, and a removed key is gone from the index.
        s_key (key, sizeof key, prefix, "indexed", 0);
        CHECK_EQ (kvpool_put (pool, key, "indexed", 7, NULL), KVPOOL_OK);
        memset (buffer, 0, sizeof buffer);
        CHECK_EQ (kvpool_get_into (pool, key, buffer, sizeof buffer), 7);
        CHECK (memcmp (buffer, "indexed", 7) == 0);
        CHECK_EQ (kvpool_get_size (pool, key), 7);
        //  The read renewed the key's lease through the node, like a socket GET.
        CHECK_EQ (kvpool_remove (pool, key, false), KVPOOL_OBJECT_HAS_LEASE);
        CHECK_EQ (kvpool_remove (pool, key, true), KVPOOL_OK);
        CHECK_EQ (kvpool_exist (pool, key), 0);
        CHECK_EQ (kvpool_get_into (pool, key, buffer, sizeof buffer), KVPOOL_OBJECT_NOT_FOUND);
    }

    //  Put options reach the node: soft and hard pins, replica count.
    kvpool_put_options_t opts = {.soft_pin = true, .soft_pin_ttl_ms = 60000};
    s_key (key, sizeof key, prefix, "soft", 0);
    CHECK_EQ (kvpool_put (pool, key, "soft", 4, &opts), KVPOOL_OK);
    opts = (kvpool_put_options_t){.hard_pin = true};
    s_key (key, sizeof key, prefix, "hard", 0);
    CHECK_EQ (kvpool_put (pool, key, "hard", 4, &opts), KVPOOL_OK);
    CHECK_EQ (kvpool_exist (pool, key), 1);
}

//  ---- replicas ------------------------------------------------------------------------------

static void
s_test_replicas (kvpool_t *pool, const char *prefix)
{
    //  Two replicas on the two segments; both must hold the value. A fast-path batch get of
    //  the same key twice reads one replica for each entry, so both are checked there.
    char key[128];
    s_key (key, sizeof key, prefix, "replicated", 0);
    size_t size = 2 * MiB + 5;
    void *value = s_value (size, 4242);
    kvpool_put_options_t opts = {.replica_num = 2};
    CHECK_EQ (kvpool_put (pool, key, value, size, &opts), KVPOOL_OK);
    kvpool_placement_t placement;
    const char *keys[2] = {key, key};
    CHECK_EQ (kvpool_get_replica_list (pool, 1, keys, false, &placement), KVPOOL_OK);
    CHECK_EQ (placement.status, KVPOOL_OK);
    CHECK_EQ (placement.size, size);
    CHECK_EQ (placement.replica_count, 2);
    CHECK (placement.replicas[0].segment_id != placement.replicas[1].segment_id);
    void *buffers[2] = {malloc (size), malloc (size)};
    size_t capacities[2] = {size, size};
    int64_t results[2];
    CHECK_EQ (kvpool_get_batch_into (pool, 2, keys, buffers, capacities, results), KVPOOL_OK);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ (results[i], (int64_t) size);
        CHECK (memcmp (buffers[i], value, size) == 0);
        free (buffers[i]);
    }
    free (value);

    //  More replicas than segments: one a segment, and the put says how many each key got.
    opts.replica_num = 3;
    s_key (key, sizeof key, prefix, "replicated", 1);
    const char *few[1] = {key};
    const void *few_data[1] = {"x"};
    size_t few_size[1] = {1};
    int few_status[1] = {-1};
    uint32_t placed[1] = {99};
    CHECK_EQ (kvpool_put_batch_placed (pool, 1, few, few_data, few_size, &opts, few_status, placed),
              KVPOOL_OK);
    CHECK_EQ (few_status[0], KVPOOL_OK);
    CHECK_EQ (placed[0], 2);
    CHECK_EQ (kvpool_exist (pool, key), 1);
    CHECK_EQ (kvpool_remove (pool, key, true), KVPOOL_OK);
    //  More than a placement can describe is refused by the library.
    opts.replica_num = KVPOOL_MAX_REPLICAS + 1;
    uint64_t one = 1;
    CHECK_EQ (kvpool_put_start (pool, 1, keys, &one, &opts, &placement), KVPOOL_INVALID_REPLICA);
    CHECK_EQ (placement.status, KVPOOL_INVALID_REPLICA);
}

//  ---- batches ---------------------------------------------------------------------------------

#define BATCH 100

static void
s_test_batches (kvpool_t *pool, const char *prefix)
{
    char names[BATCH][64];
    const char *keys[BATCH];
    void *values[BATCH];
    size_t sizes[BATCH];
    int statuses[BATCH];
    int64_t results[BATCH];
    for (size_t i = 0; i < BATCH; i++) {
        s_key (names[i], sizeof names[i], prefix, "batch", i);
        keys[i] = names[i];
        sizes[i] = 1 + (i * 7919) % 20000;
        values[i] = s_value (sizes[i], 5000 + i);
    }
    //  n == 0 does nothing and succeeds.
    CHECK_EQ (kvpool_put_batch (pool, 0, NULL, NULL, NULL, NULL, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_get_batch_into (pool, 0, NULL, NULL, NULL, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_exist_batch (pool, 0, NULL, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_remove_batch (pool, 0, NULL, true, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_get_size_batch (pool, 0, NULL, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_put_batch (pool, 1, NULL, NULL, NULL, NULL, statuses), KVPOOL_INVALID_PARAMS);

    CHECK_EQ (
        kvpool_put_batch (pool, BATCH, keys, (const void *const *) values, sizes, NULL, statuses),
        KVPOOL_OK);
    for (size_t i = 0; i < BATCH; i++)
        CHECK_EQ (statuses[i], KVPOOL_OK);
    //  Again: every key exists already.
    CHECK_EQ (
        kvpool_put_batch (pool, BATCH, keys, (const void *const *) values, sizes, NULL, statuses),
        KVPOOL_OK);
    for (size_t i = 0; i < BATCH; i++)
        CHECK_EQ (statuses[i], KVPOOL_OBJECT_ALREADY_EXISTS);

    CHECK_EQ (kvpool_exist_batch (pool, BATCH, keys, statuses), KVPOOL_OK);
    for (size_t i = 0; i < BATCH; i++)
        CHECK_EQ (statuses[i], 1);
    CHECK_EQ (kvpool_get_size_batch (pool, BATCH, keys, results), KVPOOL_OK);
    for (size_t i = 0; i < BATCH; i++)
        CHECK_EQ (results[i], (int64_t) sizes[i]);

    //  get_batch_into; entry 7 gets a buffer one byte short.
    void *buffers[BATCH];
    size_t capacities[BATCH];
    for (size_t i = 0; i < BATCH; i++) {
        capacities[i] = i == 7 ? sizes[i] - 1 : sizes[i] + i % 3;
        buffers[i] = malloc (capacities[i] ? capacities[i] : 1);
        memset (buffers[i], 0xEE, capacities[i]);
    }
    CHECK_EQ (kvpool_get_batch_into (pool, BATCH, keys, buffers, capacities, results), KVPOOL_OK);
    for (size_t i = 0; i < BATCH; i++) {
        if (i == 7) {
            CHECK_EQ (results[i], KVPOOL_BUFFER_OVERFLOW);
            for (size_t b = 0; b < capacities[i]; b++)
                CHECK_EQ (((unsigned char *) buffers[i])[b], 0xEE);
        }
        else {
            CHECK_EQ (results[i], (int64_t) sizes[i]);
            CHECK (s_equal (buffers[i], sizes[i], 5000 + i));
        }
        free (buffers[i]);
    }

    //  get_batch: values point into received frames; a missing and an invalid key mixed in.
    const char *mixed[BATCH + 2];
    memcpy (mixed, keys, sizeof keys);
    char missing[64];
    s_key (missing, sizeof missing, prefix, "batch-missing", 0);
    mixed[BATCH] = missing;
    mixed[BATCH + 1] = "";
    int mixed_statuses[BATCH + 2];
    kvpool_values_t *got = NULL;
    CHECK_EQ (kvpool_get_batch (pool, BATCH + 2, mixed, &got, mixed_statuses), KVPOOL_OK);
    CHECK (got);
    for (size_t i = 0; i < BATCH; i++) {
        CHECK_EQ (mixed_statuses[i], KVPOOL_OK);
        CHECK_EQ (kvpool_values_size (got, i), sizes[i]);
        CHECK (s_equal (kvpool_values_data (got, i), sizes[i], 5000 + i));
    }
    CHECK_EQ (mixed_statuses[BATCH], KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (kvpool_values_size (got, BATCH), 0);
    CHECK (kvpool_values_data (got, BATCH) == NULL);
    CHECK_EQ (mixed_statuses[BATCH + 1], KVPOOL_INVALID_KEY);
    CHECK_EQ (kvpool_values_size (got, BATCH + 1), 0);
    CHECK (kvpool_values_data (got, BATCH + 2) == NULL); //  out of range
    kvpool_values_destroy (&got);
    CHECK (got == NULL);
    kvpool_values_destroy (&got);

    //  Batches with invalid and missing keys: per-key outcomes, the rest proceeds.
    CHECK_EQ (kvpool_exist_batch (pool, BATCH + 2, mixed, mixed_statuses), KVPOOL_OK);
    CHECK_EQ (mixed_statuses[0], 1);
    CHECK_EQ (mixed_statuses[BATCH], 0);
    CHECK_EQ (mixed_statuses[BATCH + 1], KVPOOL_INVALID_KEY);
    int64_t mixed_results[BATCH + 2];
    CHECK_EQ (kvpool_get_size_batch (pool, BATCH + 2, mixed, mixed_results), KVPOOL_OK);
    CHECK_EQ (mixed_results[1], (int64_t) sizes[1]);
    CHECK_EQ (mixed_results[BATCH], KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (mixed_results[BATCH + 1], KVPOOL_INVALID_KEY);

    //  The same with the keys' lengths given (bindings): the same answers; a length that does
    //  not end at the key's NUL makes that key INVALID_KEY.
    size_t lens[BATCH + 2];
    for (size_t i = 0; i < BATCH + 2; i++)
        lens[i] = strlen (mixed[i]);
    lens[2] -= 1;
    CHECK_EQ (kvpool_exist_batch_lens (pool, BATCH + 2, mixed, lens, mixed_statuses), KVPOOL_OK);
    CHECK_EQ (mixed_statuses[0], 1);
    CHECK_EQ (mixed_statuses[2], KVPOOL_INVALID_KEY);
    CHECK_EQ (mixed_statuses[BATCH - 1], 1);
    CHECK_EQ (mixed_statuses[BATCH], 0);
    CHECK_EQ (mixed_statuses[BATCH + 1], KVPOOL_INVALID_KEY);
    CHECK_EQ (kvpool_get_size_batch_lens (pool, BATCH + 2, mixed, lens, mixed_results), KVPOOL_OK);
    CHECK_EQ (mixed_results[1], (int64_t) sizes[1]);
    CHECK_EQ (mixed_results[2], KVPOOL_INVALID_KEY);
    CHECK_EQ (mixed_results[BATCH], KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (mixed_results[BATCH + 1], KVPOOL_INVALID_KEY);
    CHECK_EQ (kvpool_exist_batch_lens (pool, 1, mixed, NULL, mixed_statuses),
              KVPOOL_INVALID_PARAMS);
    CHECK_EQ (kvpool_exist_batch_lens (pool, 0, NULL, NULL, NULL), KVPOOL_OK);

    //  Answered here alone (the _local calls): with the node's index in reach the stored
    //  keys are answered, and so is the missing one (a node without a master vouches for
    //  absent keys: shm_index.h); without it every valid key is left. The key of the wrong
    //  length is answered either way, and a left key's result is not touched.
    bool indexed = kvpool_set_index (pool, true);
    CHECK (indexed == kvpool_fast_path (pool));
    size_t rest[BATCH + 2], nrest = 99;
    for (size_t i = 0; i < BATCH + 2; i++) {
        mixed_statuses[i] = 7;
        mixed_results[i] = 7;
    }
    CHECK_EQ (kvpool_exist_batch_local (pool, BATCH + 1, mixed, lens, mixed_statuses, rest, &nrest),
              KVPOOL_OK);
    CHECK_EQ (mixed_statuses[2], KVPOOL_INVALID_KEY);
    if (indexed) {
        CHECK_EQ (nrest, 0);
        CHECK_EQ (mixed_statuses[BATCH], 0);
        CHECK_EQ (mixed_statuses[0], 1);
        CHECK_EQ (mixed_statuses[BATCH - 1], 1);
    }
    else {
        CHECK_EQ (mixed_statuses[BATCH], 7);
        CHECK_EQ (nrest, BATCH); //  all but the invalid one, in order
        CHECK_EQ (rest[1], 1);
        CHECK_EQ (rest[2], 3);
        CHECK_EQ (rest[BATCH - 1], BATCH);
        CHECK_EQ (mixed_statuses[0], 7);
    }
    CHECK_EQ (
        kvpool_get_size_batch_local (pool, BATCH + 1, mixed, lens, mixed_results, rest, &nrest),
        KVPOOL_OK);
    CHECK_EQ (mixed_results[2], KVPOOL_INVALID_KEY);
    CHECK_EQ (mixed_results[1], indexed ? (int64_t) sizes[1] : 7);
    CHECK_EQ (mixed_results[BATCH], indexed ? KVPOOL_OBJECT_NOT_FOUND : 7);
    CHECK_EQ (nrest, indexed ? 0 : BATCH);
    //  With the index off, nothing stored is answered.
    kvpool_set_index (pool, false);
    CHECK_EQ (kvpool_exist_batch_local (pool, BATCH + 1, mixed, lens, mixed_statuses, rest, &nrest),
              KVPOOL_OK);
    CHECK_EQ (nrest, BATCH);
    kvpool_set_index (pool, true);
    //  An empty key: answered INVALID_KEY, every valid key left.
    mixed_statuses[0] = 7;
    CHECK_EQ (kvpool_exist_batch_local (pool, BATCH + 2, mixed, lens, mixed_statuses, rest, &nrest),
              KVPOOL_OK);
    CHECK_EQ (mixed_statuses[BATCH + 1], KVPOOL_INVALID_KEY);
    CHECK_EQ (mixed_statuses[0], 7);
    CHECK_EQ (nrest, BATCH);
    CHECK_EQ (kvpool_exist_batch_local (pool, 1, mixed, lens, mixed_statuses, rest, NULL),
              KVPOOL_INVALID_PARAMS);
    CHECK_EQ (kvpool_exist_batch_local (pool, 1, mixed, NULL, mixed_statuses, rest, &nrest),
              KVPOOL_INVALID_PARAMS);
    CHECK_EQ (kvpool_exist_batch_local (pool, 0, NULL, NULL, NULL, NULL, &nrest), KVPOOL_OK);
    CHECK_EQ (nrest, 0);

    //  Remove half, check the other half is intact.
    CHECK_EQ (kvpool_remove_batch (pool, BATCH / 2, keys, true, statuses), KVPOOL_OK);
    for (size_t i = 0; i < BATCH / 2; i++)
        CHECK_EQ (statuses[i], KVPOOL_OK);
    CHECK_EQ (kvpool_exist_batch (pool, BATCH, keys, statuses), KVPOOL_OK);
    for (size_t i = 0; i < BATCH; i++)
        CHECK_EQ (statuses[i], i < BATCH / 2 ? 0 : 1);
    CHECK_EQ (kvpool_remove_batch (pool, BATCH, keys, true, statuses), KVPOOL_OK);
    for (size_t i = 0; i < BATCH; i++)
        CHECK_EQ (statuses[i], i < BATCH / 2 ? KVPOOL_OBJECT_NOT_FOUND : KVPOOL_OK);
    for (size_t i = 0; i < BATCH; i++)
        free (values[i]);

    //  A large batch: 32 x 1 MiB (copied by several threads on the fast path).
    enum { LARGE = 32 };
    for (size_t i = 0; i < LARGE; i++) {
        s_key (names[i], sizeof names[i], prefix, "large", i);
        sizes[i] = MiB;
        values[i] = s_value (MiB, 7000 + i);
    }
    CHECK_EQ (
        kvpool_put_batch (pool, LARGE, keys, (const void *const *) values, sizes, NULL, statuses),
        KVPOOL_OK);
    for (size_t i = 0; i < LARGE; i++) {
        CHECK_EQ (statuses[i], KVPOOL_OK);
        buffers[i] = malloc (MiB);
        capacities[i] = MiB;
    }
    CHECK_EQ (kvpool_get_batch_into (pool, LARGE, keys, buffers, capacities, results), KVPOOL_OK);
    for (size_t i = 0; i < LARGE; i++) {
        CHECK_EQ (results[i], MiB);
        CHECK (memcmp (buffers[i], values[i], MiB) == 0);
        free (buffers[i]);
        free (values[i]);
    }

    //  Scatter/gather batches: value i from two parts, read back into three buffers.
    enum { SG = 10 };
    kvpool_iov_t iovs[SG][2];
    const kvpool_iov_t *parts[SG];
    size_t nparts[SG];
    kvpool_buf_t bufs[SG][3];
    const kvpool_buf_t *buf_lists[SG];
    size_t nbufs[SG];
    unsigned char *wholes[SG];
    unsigned char *outs[SG];
    for (size_t i = 0; i < SG; i++) {
        s_key (names[i], sizeof names[i], prefix, "sg", i);
        size_t size = 1000 + i * 150000; //  up to ~1.3 MiB
        wholes[i] = s_value (size, 8000 + i);
        iovs[i][0] = (kvpool_iov_t){wholes[i], size / 3};
        iovs[i][1] = (kvpool_iov_t){wholes[i] + size / 3, size - size / 3};
        parts[i] = iovs[i];
        nparts[i] = 2;
        outs[i] = malloc (size + 10);
        bufs[i][0] = (kvpool_buf_t){outs[i], 7};
        bufs[i][1] = (kvpool_buf_t){outs[i] + 7, size / 2};
        bufs[i][2] = (kvpool_buf_t){outs[i] + 7 + size / 2, size + 10 - 7 - size / 2};
        buf_lists[i] = bufs[i];
        nbufs[i] = 3;
        sizes[i] = size;
    }
    //  Entry 0 gets too little room in all: BUFFER_OVERFLOW for it alone.
    bufs[0][2].size = sizes[0] - 7 - sizes[0] / 2 - 1;
    CHECK_EQ (kvpool_put_batch_parts (pool, SG, keys, parts, nparts, NULL, statuses), KVPOOL_OK);
    for (size_t i = 0; i < SG; i++)
        CHECK_EQ (statuses[i], KVPOOL_OK);
    CHECK_EQ (kvpool_get_batch_into_parts (pool, SG, keys, buf_lists, nbufs, results), KVPOOL_OK);
    CHECK_EQ (results[0], KVPOOL_BUFFER_OVERFLOW);
    for (size_t i = 1; i < SG; i++) {
        CHECK_EQ (results[i], (int64_t) sizes[i]);
        CHECK (memcmp (outs[i], wholes[i], sizes[i]) == 0);
    }
    for (size_t i = 0; i < SG; i++) {
        free (wholes[i]);
        free (outs[i]);
    }
}

//  ---- counts, two-phase puts, segments, stats ---------------------------------------------

static void
s_test_admin (kvpool_t *pool, const char *prefix)
{
    char key[128];
    //  remove_by_regex counts what it removed.
    const char *names[] = {"rx-a-1", "rx-a-2", "rx-a-3", "rx-b-1"};
    for (int i = 0; i < 4; i++) {
        snprintf (key, sizeof key, "%s-%s", prefix, names[i]);
        CHECK_EQ (kvpool_put (pool, key, names[i], strlen (names[i]), NULL), KVPOOL_OK);
    }
    char pattern[128];
    snprintf (pattern, sizeof pattern, "^%s-rx-a-[0-9]+$", prefix);
    CHECK_EQ (kvpool_remove_by_regex (pool, pattern, true), 3);
    CHECK_EQ (kvpool_remove_by_regex (pool, pattern, true), 0);
    snprintf (key, sizeof key, "%s-rx-a-1", prefix);
    CHECK_EQ (kvpool_exist (pool, key), 0);
    snprintf (key, sizeof key, "%s-rx-b-1", prefix);
    CHECK_EQ (kvpool_exist (pool, key), 1);
    CHECK_EQ (kvpool_remove_by_regex (pool, NULL, true), KVPOOL_INVALID_PARAMS);
    CHECK (kvpool_remove_by_regex (pool, "([unclosed", true) < 0);
    //  ... and, with _counts, what matched and what a read lease kept.
    const char *leased[] = {"rx-l-1", "rx-l-2", "rx-l-3"};
    for (int i = 0; i < 3; i++) {
        snprintf (key, sizeof key, "%s-%s", prefix, leased[i]);
        CHECK_EQ (kvpool_put (pool, key, leased[i], strlen (leased[i]), NULL), KVPOOL_OK);
        char read[16];
        if (i < 2) //  a read leases the key
            CHECK_EQ (kvpool_get_into (pool, key, read, sizeof read), (int64_t) strlen (leased[i]));
    }
    snprintf (pattern, sizeof pattern, "^%s-rx-l-", prefix);
    uint64_t matched = 99, kept = 99;
    CHECK_EQ (kvpool_remove_by_regex_counts (pool, pattern, false, &matched, &kept), 1);
    CHECK_EQ (matched, 3);
    CHECK_EQ (kept, 2);
    CHECK_EQ (kvpool_remove_by_regex_counts (pool, pattern, true, &matched, NULL), 2);
    CHECK_EQ (matched, 2);
    CHECK_EQ (kvpool_remove_by_regex_counts (pool, pattern, true, NULL, &kept), 0);
    CHECK_EQ (kept, 0);
    CHECK (kvpool_remove_by_regex_counts (pool, "([unclosed", true, &matched, &kept) < 0);
    CHECK (matched == 0 && kept == 0);

    //  Two-phase put: invisible until put_end; a revoked key never appears.
    const char *keys[3];
    char k0[128], k1[128];
    snprintf (k0, sizeof k0, "%s-2p-commit", prefix);
    snprintf (k1, sizeof k1, "%s-2p-revoke", prefix);
    keys[0] = k0;
    keys[1] = k1;
    keys[2] = "";
    uint64_t sizes[3] = {1000, 2000, 10};
    kvpool_placement_t placements[3];
    CHECK_EQ (kvpool_put_start (pool, 3, keys, sizes, NULL, placements), KVPOOL_OK);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ (placements[i].status, KVPOOL_OK);
        CHECK_EQ (placements[i].size, sizes[i]);
        CHECK_EQ (placements[i].replica_count, 1);
    }
    CHECK_EQ (placements[2].status, KVPOOL_INVALID_KEY);
    CHECK_EQ (kvpool_exist (pool, k0), 0);
    CHECK_EQ (kvpool_put (pool, k0, "x", 1, NULL), KVPOOL_OBJECT_ALREADY_EXISTS);
    int statuses[3];
    CHECK_EQ (kvpool_put_end (pool, 1, keys, statuses), KVPOOL_OK);
    CHECK_EQ (statuses[0], KVPOOL_OK);
    CHECK_EQ (kvpool_get_size (pool, k0), 1000);
    CHECK_EQ (kvpool_put_revoke (pool, 1, keys + 1, statuses), KVPOOL_OK);
    CHECK_EQ (statuses[0], KVPOOL_OK);
    CHECK_EQ (kvpool_exist (pool, k1), 0);
    CHECK_EQ (kvpool_put_end (pool, 2, keys, statuses), KVPOOL_OK);
    CHECK_EQ (statuses[0], KVPOOL_INVALID_WRITE); //  already committed
    CHECK_EQ (statuses[1], KVPOOL_INVALID_WRITE); //  revoked

    //  Replica lists with pins, and their release.
    CHECK_EQ (kvpool_get_replica_list (pool, 2, keys, true, placements), KVPOOL_OK);
    CHECK_EQ (placements[0].status, KVPOOL_OK);
    CHECK_EQ (placements[0].size, 1000);
    CHECK_EQ (placements[0].replica_count, 1);
    CHECK_EQ (placements[1].status, KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (kvpool_release (pool, 1, keys, statuses), KVPOOL_OK);
    CHECK_EQ (statuses[0], KVPOOL_OK);
    CHECK_EQ (kvpool_remove (pool, k0, true), KVPOOL_OK);

    //  Segments: the node's two, each listed with a name and a size.
    kvpool_segment_t segments[8];
    int count = kvpool_segments (pool, segments, 8);
    CHECK_EQ (count, 2);
    CHECK_EQ (kvpool_segments (pool, segments, 1), 2); //  the count even when capacity is less
    CHECK_EQ (kvpool_segments (pool, NULL, 0), 2);
    for (int i = 0; i < count; i++) {
        CHECK (segments[i].name[0] == '/');
        CHECK_EQ (segments[i].size, 256 * MiB);
    }
    CHECK (segments[0].id != segments[1].id);

    //  A shared-memory name: the node opens only descriptors of the asking process.
    char name[64];
    segment_make_name (name, sizeof name, "test", 0);
    segment_t *plain = segment_new (name, 16 * MiB, false);
    CHECK (plain);
    CHECK_EQ (kvpool_mount_segment (pool, name, 16 * MiB, NULL), KVPOOL_PERMISSION_DENIED);
    CHECK (strstr (kvpool_last_error (pool), "its own memory"));
    segment_destroy (&plain);
    //  A memfd that could shrink under the node: refused, with the reason.
    int loose = memfd_create ("kvpool-test-loose", MFD_CLOEXEC);
    CHECK (loose >= 0 && ftruncate (loose, 16 * MiB) == 0);
    snprintf (name, sizeof name, "/proc/%d/fd/%d", (int) getpid (), loose);
    CHECK_EQ (kvpool_mount_segment (pool, name, 16 * MiB, NULL), KVPOOL_INVALID_PARAMS);
    CHECK (strstr (kvpool_last_error (pool), "F_SEAL_SHRINK"));
    close (loose);

    //  A segment of our own (a sealed memfd): mount it, place a replica on it by name,
    //  unmount it.
    segment_t *mine = segment_new_sealed (16 * MiB, "test");
    CHECK (mine);
    snprintf (name, sizeof name, "%s", segment_name (mine));
    uint32_t id = 0;
    CHECK_EQ (kvpool_mount_segment (pool, name, 16 * MiB, &id), KVPOOL_OK);
    CHECK_EQ (kvpool_mount_segment (pool, name, 16 * MiB, NULL), KVPOOL_SEGMENT_ALREADY_EXISTS);
    CHECK_EQ (kvpool_segments (pool, segments, 8), 3);
    bool listed = false;
    for (int i = 0; i < 3; i++)
        listed |= segments[i].id == id && strcmp (segments[i].name, name) == 0;
    CHECK (listed);
    const char *preferred[] = {name};
    kvpool_put_options_t opts = {.preferred_segments = preferred, .preferred_segment_count = 1};
    snprintf (key, sizeof key, "%s-on-my-segment", prefix);
    void *value = s_value (300000, 31337);
    CHECK_EQ (kvpool_put (pool, key, value, 300000, &opts), KVPOOL_OK);
    keys[0] = key;
    CHECK_EQ (kvpool_get_replica_list (pool, 1, keys, false, placements), KVPOOL_OK);
    CHECK_EQ (placements[0].replica_count, 1);
    CHECK_EQ (placements[0].replicas[0].segment_id, id);
    //  The bytes are in our own mapping of the segment.
    CHECK (placements[0].replicas[0].offset + 300000 <= 16 * MiB);
    CHECK (memcmp ((char *) segment_base (mine) + placements[0].replicas[0].offset, value, 300000)
           == 0);
    //  ... and read back through the library (the fast path maps the new segment now).
    void *back = malloc (300000);
    CHECK_EQ (kvpool_get_into (pool, key, back, 300000), 300000);
    CHECK (memcmp (back, value, 300000) == 0);
    free (back);
    free (value);
    CHECK_EQ (kvpool_unmount_segment (pool, id), KVPOOL_OK);
    CHECK_EQ (kvpool_exist (pool, key), 0); //  its objects went with it
    CHECK_EQ (kvpool_unmount_segment (pool, id), KVPOOL_SEGMENT_NOT_FOUND);
    CHECK_EQ (kvpool_segments (pool, segments, 8), 2);
    CHECK_EQ (kvpool_mount_segment (pool, "/kvpool-test-no-such-object", MiB, &id) < 0, 1);
    segment_destroy (&mine);

    //  Memory given with kvpool_mount_memory: objects land in it, and it goes back on
    //  request or when the connection is destroyed.
    uint32_t mem_id = 0;
    const char *mem_name = NULL;
    CHECK_EQ (kvpool_mount_memory (pool, 8 * MiB, &mem_id, &mem_name), KVPOOL_OK);
    CHECK (mem_name && segment_name_is_fd (mem_name));
    CHECK_EQ (kvpool_segments (pool, segments, 8), 3);
    const char *in_mine[] = {mem_name};
    kvpool_put_options_t mem_opts = {.preferred_segments = in_mine, .preferred_segment_count = 1};
    snprintf (key, sizeof key, "%s-in-given-memory", prefix);
    void *given = s_value (100000, 4242);
    CHECK_EQ (kvpool_put (pool, key, given, 100000, &mem_opts), KVPOOL_OK);
    keys[0] = key;
    CHECK_EQ (kvpool_get_replica_list (pool, 1, keys, false, placements), KVPOOL_OK);
    CHECK_EQ (placements[0].replicas[0].segment_id, mem_id);
    void *given_back = malloc (100000);
    CHECK_EQ (kvpool_get_into (pool, key, given_back, 100000), 100000);
    CHECK (memcmp (given_back, given, 100000) == 0);
    free (given_back);
    free (given);
    CHECK_EQ (kvpool_unmount_memory (pool, mem_id), KVPOOL_OK);
    CHECK_EQ (kvpool_exist (pool, key), 0);
    CHECK_EQ (kvpool_unmount_memory (pool, mem_id), KVPOOL_SEGMENT_NOT_FOUND);
    CHECK_EQ (kvpool_unmount_memory (pool, segments[0].id), KVPOOL_SEGMENT_NOT_FOUND);
    CHECK_EQ (kvpool_segments (pool, segments, 8), 2);
    kvpool_t *giver = kvpool_connect (s_server.endpoint, NULL);
    CHECK (giver);
    CHECK_EQ (kvpool_mount_memory (giver, 4 * MiB, &mem_id, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_segments (pool, segments, 8), 3);
    kvpool_destroy (&giver);
    CHECK_EQ (kvpool_segments (pool, segments, 8), 2);

    //  Stats count what is stored.
    CHECK (kvpool_remove_all (pool, true) >= 0);
    kvpool_stats_t stats;
    CHECK_EQ (kvpool_stats (pool, &stats), KVPOOL_OK);
    CHECK_EQ (stats.objects, 0);
    CHECK_EQ (stats.segments, 2);
    CHECK_EQ (stats.bytes_mounted, 512 * MiB);
    uint64_t puts_before = stats.puts;
    for (int i = 0; i < 5; i++) {
        snprintf (key, sizeof key, "%s-stats-%d", prefix, i);
        CHECK_EQ (kvpool_put (pool, key, "0123456789", 10, NULL), KVPOOL_OK);
    }
    CHECK_EQ (kvpool_stats (pool, &stats), KVPOOL_OK);
    CHECK_EQ (stats.objects, 5);
    CHECK_EQ (stats.bytes_stored, 50);
    CHECK_EQ (stats.puts, puts_before + 5);
    CHECK (stats.requests > 0);
    CHECK (stats.uptime_ms > 0);
    CHECK (stats.utilisation > 0 && stats.utilisation < 1);
    CHECK_EQ (kvpool_remove_all (pool, true), 5);
    CHECK_EQ (kvpool_remove_all (pool, true), 0);

    //  Reset: removes everything past leases and counts it.
    for (int i = 0; i < 3; i++) {
        snprintf (key, sizeof key, "%s-reset-%d", prefix, i);
        CHECK_EQ (kvpool_put (pool, key, "r", 1, NULL), KVPOOL_OK);
        CHECK_EQ (kvpool_exist (pool, key), 1); //  a lease
    }
    CHECK_EQ (kvpool_reset (pool), 3);
    CHECK_EQ (kvpool_exist (pool, key), 0);
}

//  ---- switching the fast path --------------------------------------------------------------

static void
s_test_switch (void)
{
    kvpool_t *pool = s_connect (true, 0);
    CHECK_EQ (kvpool_put (pool, "switch-a", "through memory", 14, NULL), KVPOOL_OK);
    CHECK (!kvpool_set_fast_path (pool, false));
    CHECK (!kvpool_fast_path (pool));
    char buffer[32];
    CHECK_EQ (kvpool_get_into (pool, "switch-a", buffer, sizeof buffer), 14);
    CHECK (memcmp (buffer, "through memory", 14) == 0);
    CHECK_EQ (kvpool_put (pool, "switch-b", "through socket", 14, NULL), KVPOOL_OK);
    CHECK (kvpool_set_fast_path (pool, true));
    CHECK (kvpool_fast_path (pool));
    CHECK_EQ (kvpool_get_into (pool, "switch-b", buffer, sizeof buffer), 14);
    CHECK (memcmp (buffer, "through socket", 14) == 0);
    CHECK_EQ (kvpool_remove_all (pool, true), 2);
    kvpool_destroy (&pool);
    CHECK (!kvpool_set_fast_path (NULL, true));
    CHECK (!kvpool_fast_path (NULL));
}

//  keep_endpoint on the node's tcp endpoint, fast path left on (the default): the node serves
//  the shared-memory operations only on its ipc endpoint, so the connection takes the socket
//  for everything, and every call works.
static void
s_test_keep_endpoint (void)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.keep_endpoint = 1;
    kvpool_t *pool = kvpool_connect (s_endpoint, &options);
    CHECK (pool);
    CHECK (!kvpool_fast_path (pool));
    CHECK (!kvpool_set_fast_path (pool, true));
    void *value = s_value (300000, 900);
    CHECK_EQ (kvpool_put (pool, "kept-on-tcp", value, 300000, NULL), KVPOOL_OK);
    char *back = (char *) malloc (300000);
    CHECK_EQ (kvpool_get_into (pool, "kept-on-tcp", back, 300000), 300000);
    CHECK (memcmp (back, value, 300000) == 0);
    CHECK_EQ (kvpool_remove (pool, "kept-on-tcp", true), KVPOOL_OK);
    free (back);
    free (value);
    kvpool_destroy (&pool);
}

//  ---- timeouts -------------------------------------------------------------------------------

//  SIGSTOP takes effect asynchronously: wait until every thread of the node is stopped, or a
//  request sent right after kill could still be answered.
static void
s_stop_server (void)
{
    CHECK_EQ (kill (s_server.pid, SIGSTOP), 0);
    char path[64];
    snprintf (path, sizeof path, "/proc/%d/task", (int) s_server.pid);
    for (int attempt = 0; attempt < 1000; attempt++) {
        bool all_stopped = true;
        DIR *dir = opendir (path);
        CHECK (dir);
        struct dirent *entry;
        while ((entry = readdir (dir)) && all_stopped) {
            if (entry->d_name[0] == '.')
                continue;
            char stat_path[384], line[512];
            snprintf (stat_path, sizeof stat_path, "%s/%s/stat", path, entry->d_name);
            FILE *file = fopen (stat_path, "r");
            if (!file)
                continue; //  a thread that just ended
            char *state = fgets (line, sizeof line, file) ? strrchr (line, ')') : NULL;
            fclose (file);
            //  "pid (comm) S ...": the state follows the command's closing parenthesis.
            all_stopped = state && (state[2] == 'T' || state[2] == 't');
        }
        closedir (dir);
        if (all_stopped)
            return;
        usleep (2000);
    }
    CHECK (!"kvpoold did not stop");
}

static void
s_test_timeouts (bool fast)
{
    kvpool_t *pool = s_connect (fast, 300);
    //  Reads from the same-machine index would still succeed with the node stopped.
    kvpool_set_index (pool, false);
    CHECK_EQ (kvpool_put (pool, "late-a", "value a", 7, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_put (pool, "late-b", "value b", 7, NULL), KVPOOL_OK);

    s_stop_server ();
    int64_t start = s_now_ms ();
    CHECK_EQ (kvpool_ping (pool), KVPOOL_RPC_FAIL);
    int64_t elapsed = s_now_ms () - start;
    CHECK (elapsed >= 250 && elapsed < 3000);
    CHECK (strstr (kvpool_last_error (pool), "no reply"));
    char buffer[16];
    CHECK_EQ (kvpool_get_into (pool, "late-a", buffer, sizeof buffer), KVPOOL_RPC_FAIL);
    int results[2];
    const char *keys[2] = {"late-a", "late-b"};
    CHECK_EQ (kvpool_exist_batch (pool, 2, keys, results), KVPOOL_RPC_FAIL);
    CHECK_EQ (results[0], KVPOOL_RPC_FAIL);
    CHECK_EQ (results[1], KVPOOL_RPC_FAIL);
    //  A large put the node never reads: the call still returns in time, and the library
    //  has let go of the buffer by then (freed at once: AddressSanitizer would see a late read).
    void *big = s_value (8 * MiB, 1);
    start = s_now_ms ();
    CHECK_EQ (kvpool_put (pool, "late-big", big, 8 * MiB, NULL), KVPOOL_RPC_FAIL);
    CHECK (s_now_ms () - start < 4000);
    free (big);
    CHECK_EQ (kill (s_server.pid, SIGCONT), 0);

    //  The late replies to what timed out are told apart from the answers to new requests.
    CHECK_EQ (kvpool_ping (pool), KVPOOL_OK);
    memset (buffer, 0, sizeof buffer);
    CHECK_EQ (kvpool_get_into (pool, "late-b", buffer, sizeof buffer), 7);
    CHECK (memcmp (buffer, "value b", 7) == 0);
    CHECK_EQ (kvpool_get_into (pool, "late-a", buffer, sizeof buffer), 7);
    CHECK (memcmp (buffer, "value a", 7) == 0);
    kvpool_remove_all (pool, true);
    kvpool_destroy (&pool);
}

//  ---- a node restarted under a connected client -------------------------------------------

//  A node restarted on the same endpoint numbers its segments from the start again: the
//  fast path must not resolve the new node's segment ids against the old node's mappings.
//  What the fast client writes is read back over the socket by a second client, which sees
//  what the node really holds.
static void
s_test_restart (void)
{
    char endpoint[64];
    snprintf (endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", s_dead_port ());
    const char *args[] = {"--endpoint", endpoint, "--segment-size", "64MiB", NULL};
    CHECK_EQ (testutil_server_start (&s_other, args), 0);
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = 3000;
    kvpool_t *pool = kvpool_connect (endpoint, &options);
    CHECK (pool);
    CHECK (kvpool_fast_path (pool));
    void *value = s_value (3 * MiB, 600);
    CHECK_EQ (kvpool_put (pool, "before-restart", value, 3 * MiB, NULL), KVPOOL_OK);
    free (value);
    CHECK_EQ (testutil_server_stop (&s_other, SIGTERM), 0);
    CHECK_EQ (testutil_server_start (&s_other, args), 0);

    //  The same connection, now to the new node (the socket reconnects by itself).
    value = s_value (3 * MiB, 601);
    CHECK_EQ (kvpool_put (pool, "after-restart", value, 3 * MiB, NULL), KVPOOL_OK);
    options.fast_path = 0;
    kvpool_t *plain = kvpool_connect (endpoint, &options);
    CHECK (plain);
    void *data;
    size_t size;
    CHECK_EQ (kvpool_get (plain, "after-restart", &data, &size), KVPOOL_OK);
    CHECK_EQ (size, 3 * MiB);
    CHECK (memcmp (data, value, size) == 0);
    free (data);
    //  And the other way: a value put over the socket, read through the fast path.
    free (value);
    value = s_value (2 * MiB, 602);
    CHECK_EQ (kvpool_put (plain, "socket-put", value, 2 * MiB, NULL), KVPOOL_OK);
    void *buffer = malloc (2 * MiB);
    CHECK_EQ (kvpool_get_into (pool, "socket-put", buffer, 2 * MiB), 2 * MiB);
    CHECK (memcmp (buffer, value, 2 * MiB) == 0);
    CHECK (kvpool_fast_path (pool));
    CHECK_EQ (kvpool_exist (pool, "before-restart"), 0);
    free (buffer);
    free (value);
    kvpool_destroy (&plain);
    kvpool_destroy (&pool);
    CHECK_EQ (testutil_server_stop (&s_other, SIGTERM), 0);
}

//  ---- which path moved the bytes ---------------------------------------------------------------

//  A socket get of a value over 64 KiB is a GET the replica-manager answers (stats.gets, not
//  index_gets); a fast get reads the index itself and counts, when reported, as an index get
//  only. A fast put is one request, as a socket put: the node reads the value from this
//  process's memory (a PUT by address), so a value this process cannot read is refused by
//  the node (TRANSFER_FAIL) instead of faulting here, and nothing is stored for it.
static void
s_test_by_address (kvpool_t *pool)
{
    //  Not memory at all, in a batch with a good value: only the bad one fails.
    const char *keys[] = {"by-address-bad", "by-address-good"};
    char good[5000];
    memset (good, 'g', sizeof good);
    const void *values[] = {(const void *) (uintptr_t) 4096, good};
    size_t sizes[] = {100000, sizeof good};
    int statuses[2];
    CHECK_EQ (kvpool_put_batch (pool, 2, keys, values, sizes, NULL, statuses), KVPOOL_OK);
    CHECK_EQ (statuses[0], KVPOOL_TRANSFER_FAIL);
    CHECK_EQ (statuses[1], KVPOOL_OK);
    CHECK_EQ (kvpool_exist (pool, "by-address-bad"), 0);
    char back[sizeof good];
    CHECK_EQ (kvpool_get_into (pool, "by-address-good", back, sizeof back), (int64_t) sizeof good);
    CHECK (memcmp (back, good, sizeof good) == 0);
    //  A value of 2 MiB (read by the replica-manager and its helper, a megabyte each) whose
    //  last page is unmapped: the whole value fails, and nothing is stored.
    size_t size = 2 << 20, page = (size_t) sysconf (_SC_PAGESIZE);
    char *pages = mmap (NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK (pages != MAP_FAILED);
    for (size_t i = 0; i < size; i++)
        pages[i] = (char) (i * 7 + i / 4096);
    CHECK_EQ (kvpool_put (pool, "by-address-whole", pages, size, NULL), KVPOOL_OK);
    char *whole = malloc (size);
    CHECK_EQ (kvpool_get_into (pool, "by-address-whole", whole, size), (int64_t) size);
    CHECK (memcmp (whole, pages, size) == 0);
    CHECK_EQ (munmap (pages + size - page, page), 0);
    CHECK_EQ (kvpool_put (pool, "by-address-torn", pages, size, NULL), KVPOOL_TRANSFER_FAIL);
    CHECK_EQ (kvpool_exist (pool, "by-address-torn"), 0);
    free (whole);
    munmap (pages, size - page);
    CHECK_EQ (kvpool_remove (pool, "by-address-good", true), KVPOOL_OK);
    CHECK_EQ (kvpool_remove (pool, "by-address-whole", true), KVPOOL_OK);
}

static void
s_test_path (kvpool_t *pool, bool fast)
{
    kvpool_stats_t a, b;
    CHECK_EQ (kvpool_stats (pool, &a), KVPOOL_OK);
    CHECK_EQ (kvpool_stats (pool, &b), KVPOOL_OK);
    uint64_t baseline = b.requests - a.requests; //  what a STATS itself adds
    void *value = s_value (100000, 55);
    CHECK_EQ (kvpool_stats (pool, &a), KVPOOL_OK);
    CHECK_EQ (kvpool_put (pool, "path-probe", value, 100000, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_stats (pool, &b), KVPOOL_OK);
    CHECK_EQ (b.requests - a.requests, baseline + 1);
    CHECK_EQ (b.puts - a.puts, 1);
    if (fast)
        s_test_by_address (pool);

    void *back = malloc (100000);
    CHECK_EQ (kvpool_stats (pool, &a), KVPOOL_OK);
    CHECK_EQ (kvpool_get_into (pool, "path-probe", back, 100000), 100000);
    CHECK_EQ (kvpool_stats (pool, &b), KVPOOL_OK);
    CHECK (memcmp (back, value, 100000) == 0);
    if (fast)
        CHECK_EQ (b.gets - a.gets, b.index_gets - a.index_gets);
    else {
        CHECK_EQ (b.gets - a.gets, 1);
        CHECK_EQ (b.index_gets - a.index_gets, 0);
    }
    //  kvpool_get always reads over the socket.
    void *data;
    size_t size;
    CHECK_EQ (kvpool_get (pool, "path-probe", &data, &size), KVPOOL_OK);
    CHECK_EQ (kvpool_stats (pool, &a), KVPOOL_OK);
    CHECK_EQ (a.gets - b.gets, 1);
    CHECK (size == 100000 && memcmp (data, value, size) == 0);
    free (data);
    free (back);
    free (value);
    CHECK_EQ (kvpool_remove (pool, "path-probe", true), KVPOOL_OK);
}

//  Values a same-machine client reads from the index itself reach the node's stats: with its
//  TOUCHes, and what is left when the connection closes.
static void
s_test_index_reads_counted (void)
{
    kvpool_t *pool = kvpool_connect (s_server.endpoint, NULL);
    CHECK (pool && kvpool_fast_path (pool));
    CHECK_EQ (kvpool_put (pool, "counted-read", "0123456789", 10, NULL), KVPOOL_OK);
    kvpool_stats_t a, b;
    CHECK_EQ (kvpool_stats (pool, &a), KVPOOL_OK);
    kvpool_t *reader = kvpool_connect (s_server.endpoint, NULL);
    CHECK (reader && kvpool_fast_path (reader));
    char buf[16];
    for (int i = 0; i < 10; i++)
        CHECK_EQ (kvpool_get_into (reader, "counted-read", buf, sizeof buf), 10);
    kvpool_destroy (&reader);
    CHECK_EQ (kvpool_stats (pool, &b), KVPOOL_OK);
    CHECK_EQ (b.index_gets - a.index_gets, 10);
    CHECK_EQ (b.gets - a.gets, 10);
    CHECK_EQ (b.get_hits - a.get_hits, 10);
    CHECK_EQ (kvpool_remove (pool, "counted-read", true), KVPOOL_OK);
    kvpool_destroy (&pool);
}

//  ---- the process context and the read path ---------------------------------------------

//  Connections of one process share one context: two connections to the node map its
//  segments and its read index once, and the context goes with the last connection (and
//  its device layer, which holds the context's CUDA runtime).
//  (Runs while no other connection is open.)
static void
s_test_shared_context (void)
{
    kvpc_process_counts_t none, one, two, left;
    kvpc_process_counts (&none);
    CHECK_EQ (none.users, 0);
    kvpool_t *a = kvpool_connect (s_endpoint, NULL);
    CHECK (a && kvpool_fast_path (a));
    kvpc_process_counts (&one);
    CHECK_EQ (one.users, 1);
    CHECK (one.segments > 0 && one.indexes == 1);
    CHECK_EQ (one.maps_made, one.segments);
    kvpool_t *b = kvpool_connect (s_endpoint, NULL);
    CHECK (b && kvpool_fast_path (b));
    kvpc_process_counts (&two);
    CHECK_EQ (two.users, 2);
    CHECK_EQ (two.segments, one.segments);
    CHECK_EQ (two.maps_made, one.maps_made); //  nothing mapped again
    CHECK_EQ (two.indexes, 1);
    //  What one writes through the shared mappings, the other reads through them.
    size_t size = 256 << 10;
    void *value = s_value (size, 77);
    void *got = malloc (size);
    CHECK (got);
    CHECK_EQ (kvpool_put (a, "shared-context", value, size, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_get_into (b, "shared-context", got, size), (int64_t) size);
    CHECK (memcmp (got, value, size) == 0);
    CHECK_EQ (kvpool_remove (a, "shared-context", true), KVPOOL_OK);
    //  The mappings stay while a connection holds them.
    kvpool_destroy (&a);
    kvpc_process_counts (&left);
    CHECK (left.users >= 1);
    CHECK_EQ (left.segments, one.segments);
    CHECK_EQ (kvpool_get_into (b, "shared-context", got, size), KVPOOL_OBJECT_NOT_FOUND);
    kvpool_destroy (&b);
    kvpc_process_counts (&left);
    CHECK (left.users == 0 && left.segments == 0 && left.indexes == 0 && left.maps_made == 0);
    free (value);
    free (got);
}

//  The node's count of requests of one operation (by its name in the proto).
static uint64_t
s_op_requests (kvpool_t *pool, const char *name)
{
    kvpool_stats_t stats;
    kvpool_op_stats_t ops[64];
    size_t count = 0;
    CHECK_EQ (kvpool_stats_ops (pool, &stats, ops, 64, &count), KVPOOL_OK);
    for (size_t i = 0; i < count && i < 64; i++)
        if (strcmp (ops[i].name, name) == 0)
            return ops[i].requests;
    return 0;
}

//  Checks the GET and GET_REPLICA_LIST requests the node saw since *gets, *lists, and
//  moves them on.
static void
s_check_requests (kvpool_t *pool, uint64_t *gets, uint64_t *lists, uint64_t more_gets,
                  uint64_t more_lists)
{
    uint64_t now_gets = s_op_requests (pool, "GET");
    uint64_t now_lists = s_op_requests (pool, "GET_REPLICA_LIST");
    CHECK_EQ (now_gets - *gets, more_gets);
    CHECK_EQ (now_lists - *lists, more_lists);
    *gets = now_gets;
    *lists = now_lists;
}

//  Every get shape gives the same bytes whichever source the resolver takes: the read index,
//  a replica list, the node's socket. The node's request counts show which one served.
static void
s_test_read_path (void)
{
    kvpool_t *pool = kvpool_connect (s_endpoint, NULL);
    CHECK (pool && kvpool_fast_path (pool));
    const size_t size = 100 << 10;
    void *value = s_value (size, 4242);
    CHECK_EQ (kvpool_put (pool, "read-path", value, size, NULL), KVPOOL_OK);
    const char *key = "read-path";
    char *got = malloc (size);
    CHECK (got);
    uint64_t gets = s_op_requests (pool, "GET"), lists = s_op_requests (pool, "GET_REPLICA_LIST");

    //  The shapes into buffers, whole values.
    void *buffers[1] = {got};
    size_t capacities[1] = {size};
    int64_t results[1];
    kvpool_buf_t halves[2] = {{got, size / 2}, {got + size / 2, size - size / 2}};
    const kvpool_buf_t *parts[1] = {halves};
    size_t nparts[1] = {2};
#define S_GET_SHAPES_INTO()                                                                        \
    do {                                                                                           \
        memset (got, 0, size);                                                                     \
        CHECK_EQ (kvpool_get_into (pool, key, got, size), (int64_t) size);                         \
        CHECK (memcmp (got, value, size) == 0);                                                    \
        memset (got, 0, size);                                                                     \
        CHECK_EQ (kvpool_get_batch_into (pool, 1, &key, buffers, capacities, results), KVPOOL_OK); \
        CHECK (results[0] == (int64_t) size && memcmp (got, value, size) == 0);                    \
        memset (got, 0, size);                                                                     \
        CHECK_EQ (kvpool_get_batch_into_parts (pool, 1, &key, parts, nparts, results), KVPOOL_OK); \
        CHECK (results[0] == (int64_t) size && memcmp (got, value, size) == 0);                    \
    } while (0)

    //  1. The read index: no request at all.
    S_GET_SHAPES_INTO ();
    s_check_requests (pool, &gets, &lists, 0, 0);
    //  2. Without the index, a pinned replica list: one GET_REPLICA_LIST a call.
    kvpool_set_index (pool, false);
    S_GET_SHAPES_INTO ();
    s_check_requests (pool, &gets, &lists, 0, 3);
    kvpool_set_index (pool, true);
    //  3. The node: ranges, malloc'd values and frames always, and everything with the fast
    //  path off; one GET a call.
    memset (got, 0, size);
    CHECK_EQ (kvpool_get_range_into (pool, key, 1000, got, 5000), 5000);
    CHECK (memcmp (got, (char *) value + 1000, 5000) == 0);
    void *data = NULL;
    size_t data_size = 0;
    CHECK_EQ (kvpool_get (pool, key, &data, &data_size), KVPOOL_OK);
    CHECK (data && data_size == size && memcmp (data, value, size) == 0);
    free (data);
    kvpool_values_t *values = NULL;
    int status = -1;
    CHECK_EQ (kvpool_get_batch (pool, 1, &key, &values, &status), KVPOOL_OK);
    CHECK_EQ (status, KVPOOL_OK);
    CHECK (kvpool_values_size (values, 0) == size
           && memcmp (kvpool_values_data (values, 0), value, size) == 0);
    kvpool_values_destroy (&values);
    s_check_requests (pool, &gets, &lists, 3, 0);
    CHECK (!kvpool_set_fast_path (pool, false));
    S_GET_SHAPES_INTO ();
    s_check_requests (pool, &gets, &lists, 3, 0);
#undef S_GET_SHAPES_INTO
    //  A missing key is not found in every shape, whichever path.
    CHECK (kvpool_set_fast_path (pool, true));
    const char *missing = "read-path-missing";
    CHECK_EQ (kvpool_get_into (pool, missing, got, size), KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (kvpool_get (pool, missing, &data, &data_size), KVPOOL_OBJECT_NOT_FOUND);
    CHECK (data == NULL && data_size == 0);
    CHECK_EQ (kvpool_get_batch (pool, 1, &missing, &values, &status), KVPOOL_OK);
    CHECK (status == KVPOOL_OBJECT_NOT_FOUND && kvpool_values_data (values, 0) == NULL);
    kvpool_values_destroy (&values);
    CHECK_EQ (kvpool_remove (pool, key, true), KVPOOL_OK);
    kvpool_destroy (&pool);
    free (value);
    free (got);
}

//  ---- main -----------------------------------------------------------------------------------

//  Upsert replaces whole values (through either path, the reads see the new one); ranged
//  gets return exactly the bytes asked for, clipped at the value's end.
static void
s_test_upsert_ranges (kvpool_t *pool, const char *prefix)
{
    char key[128];
    s_key (key, sizeof key, prefix, "upsert", 0);
    void *first = s_value (3 * MiB, 1), *second = s_value (100 * 1024, 2);
    CHECK_EQ (kvpool_upsert (pool, key, first, 3 * MiB, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_put (pool, key, second, 100 * 1024, NULL), KVPOOL_OBJECT_ALREADY_EXISTS);
    CHECK_EQ (kvpool_upsert (pool, key, second, 100 * 1024, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_get_size (pool, key), 100 * 1024);
    char *out = malloc (3 * MiB);
    CHECK_EQ (kvpool_get_into (pool, key, out, 3 * MiB), 100 * 1024);
    CHECK (memcmp (out, second, 100 * 1024) == 0);
    //  Parts and batches: per-key outcomes.
    kvpool_iov_t parts[] = {{"ab", 2}, {"cd", 2}};
    CHECK_EQ (kvpool_upsert_parts (pool, key, parts, 2, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_get_into (pool, key, out, 10), 4);
    CHECK (memcmp (out, "abcd", 4) == 0);
    char other[128];
    s_key (other, sizeof other, prefix, "upsert", 1);
    const char *keys[] = {key, "", other};
    const kvpool_iov_t *lists[] = {parts, parts, parts + 1};
    size_t nparts[] = {1, 1, 1};
    int statuses[3];
    CHECK_EQ (kvpool_upsert_batch_parts (pool, 3, keys, lists, nparts, NULL, statuses), KVPOOL_OK);
    CHECK_EQ (statuses[0], KVPOOL_OK);
    CHECK_EQ (statuses[1], KVPOOL_INVALID_KEY);
    CHECK_EQ (statuses[2], KVPOOL_OK);
    CHECK_EQ (kvpool_get_into (pool, other, out, 10), 2);
    CHECK (memcmp (out, "cd", 2) == 0);

    //  Ranges of a 3 MiB value: inside, across the end, at the end, past it.
    CHECK_EQ (kvpool_upsert (pool, key, first, 3 * MiB, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_get_range_into (pool, key, 12345, out, 1 * MiB), 1 * MiB);
    CHECK (memcmp (out, (char *) first + 12345, 1 * MiB) == 0);
    CHECK_EQ (kvpool_get_range_into (pool, key, 3 * MiB - 10, out, 100), 10);
    CHECK (memcmp (out, (char *) first + 3 * MiB - 10, 10) == 0);
    CHECK_EQ (kvpool_get_range_into (pool, key, 3 * MiB, out, 100), 0);
    CHECK_EQ (kvpool_get_range_into (pool, key, 3 * MiB + 1, out, 100), KVPOOL_INVALID_PARAMS);
    char missing[128];
    s_key (missing, sizeof missing, prefix, "upsert-missing", 0);
    const char *range_keys[] = {key, missing, key};
    uint64_t offsets[] = {0, 0, 2 * MiB};
    char *buffers[] = {out, out + MiB, out + 2 * MiB};
    size_t lengths[] = {100, 100, MiB};
    int64_t results[3];
    CHECK_EQ (kvpool_get_ranges_into (pool, 3, range_keys, offsets, (void *const *) buffers,
                                      lengths, results),
              KVPOOL_OK);
    CHECK_EQ (results[0], 100);
    CHECK_EQ (results[1], KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (results[2], MiB);
    CHECK (memcmp (out, first, 100) == 0);
    CHECK (memcmp (out + 2 * MiB, (char *) first + 2 * MiB, MiB) == 0);
    free (out);
    free (first);
    free (second);
}

static void
s_suite (bool fast)
{
    const char *prefix = fast ? "fast" : "sock";
    kvpool_t *pool = s_connect (fast, 0);
    CHECK_EQ (kvpool_ping (pool), KVPOOL_OK);
    CHECK (kvpool_remove_all (pool, true) >= 0);
    s_test_path (pool, fast);
    s_test_values (pool, prefix);
    s_test_replicas (pool, prefix);
    s_test_batches (pool, prefix);
    s_test_admin (pool, prefix);
    s_test_upsert_ranges (pool, prefix);
    CHECK_EQ (kvpool_fast_path (pool), fast);
    kvpool_remove_all (pool, true);
    kvpool_destroy (&pool);
    printf ("suite %s: OK\n", prefix);
}

int
main (void)
{
    setvbuf (stdout, NULL, _IONBF, 0);
    atexit (s_kill_server);
    signal (SIGTERM, s_on_signal);
    signal (SIGINT, s_on_signal);
    signal (SIGALRM, s_on_signal);
    alarm (240); //  run.sh allows 300 s
    s_endpoint = getenv ("KVPOOL_TEST_ENDPOINT");
    if (!s_endpoint) {
        const char *args[] = {"--segment-size", "256MiB", "--segments", "2", NULL};
        CHECK_EQ (testutil_server_start (&s_server, args), 0);
        s_endpoint = s_server.endpoint;
    }
    printf ("kvpoold at %s\n", s_endpoint);
    s_test_connect ();
    printf ("connect: OK\n");
    s_test_shared_context ();
    printf ("shared context: OK\n");
    s_test_read_path ();
    printf ("read path: OK\n");
    s_suite (false);
    //  The rest runs with glibc's malloc tuned as kvpool_tune_malloc documents (and the
    //  Python package does): everything must behave the same. (Under a sanitizer the malloc
    //  is the sanitizer's and the call says -1.)
    kvpool_tune_malloc ();
    s_suite (true);
    s_test_switch ();
    printf ("switch: OK\n");
    s_test_keep_endpoint ();
    printf ("keep endpoint: OK\n");
    s_test_index_reads_counted ();
    printf ("index reads counted: OK\n");
    if (s_server.pid > 0) {
        s_test_timeouts (false);
        s_test_timeouts (true);
        printf ("timeouts: OK\n");
        s_test_restart ();
        printf ("restart: OK\n");
        CHECK_EQ (testutil_server_stop (&s_server, SIGTERM), 0);
    }
    return 0;
}
