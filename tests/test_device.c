/*  test_device.c - caller buffers in GPU memory (client/device.h), with the stand-in CUDA
    runtime build/lib/libfake_cudart.so (tests/fake_cudart.c) against the real kvpoold.

    The stand-in's device memory faults on any CPU access, and its copies run only when the
    caller waits, so a device buffer touched with memcpy, a staging buffer read before its copy
    is waited for or rewritten under a queued copy, each shows as a crash or as wrong bytes.

    Each part runs in a child process of its own, since the runtime is looked for once per
    process (KVPOOL_CUDART, and KVPOOL_DEVICE_DMA):
      direct    puts and gets by direct DMA between device memory and the node's segments,
                registered once per process: no staging buffer, no pageable copy, one DMA
                per value (or per run adjacent on both sides), batches of a KV cache's layer
                blocks spread over streams in cudaMemcpyBatchAsync calls, a runtime that
                refuses batches, copies that fail mid-batch (no key committed), reads that
                see every byte as soon as the put returns, and every segment unregistered
                once the last connection is gone
      refused   a runtime that refuses to register the segments: staged, said once
      fake      (KVPOOL_DEVICE_DMA=staged) classification (host, pinned, device; the caches); puts
   from and gets into device memory, byte for byte, over the same-machine path (with and without the
                read index) and over tcp, across staging-chunk and request boundaries, single
                keys and batches, values gathered from and scattered to device and host parts,
                upserts and range reads;
                the order of the stand-in's operations (chunks of KVPC_STAGE_BYTES at most, the
                next chunk's copy queued before the last one is waited for); host calls stage
                nothing
      failures  a copy that fails, pinned memory that cannot be had, a pointer query that
                fails: KVPOOL_INVALID_PARAMS with the reason in kvpool_last_error, no key
                half-written, and the connection goes on working
      none, missing, auto
                no runtime (KVPOOL_CUDART=none, a path that does not load, unset on a machine
                where no CUDA is in the process): host calls as before, nothing asks a runtime
*/
#include <dlfcn.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/device.h"
#include "client/process.h"
#include "kvpool.h"
#include "tests/testutil.h"

#define KiB (1u << 10)
#define MiB (1u << 20)
#define STAGE KVPC_STAGE_BYTES

static testutil_server_t s_server;
static pid_t s_parent;
static char s_fake_path[PATH_MAX];

//  ---- the stand-in runtime, as the test drives it --------------------------------------------

static struct {
    int (*malloc_) (void **, size_t);
    int (*free_) (void *);
    int (*memcpy_) (void *, const void *, size_t, int);
    int (*memset_) (void *, int, size_t);
    int (*host_alloc) (void **, size_t, unsigned int);
    int (*free_host) (void *);
    int (*set_device) (int);
    void (*reset) (void);
    size_t (*log) (char *, size_t);
    size_t (*log_len) (size_t);
    long (*queries) (void);
    long (*host_allocs) (void);
    void (*fail_copies) (long, int);
    void (*fail_host_alloc) (bool);
    void (*fail_queries) (int);
    void (*no_ranges) (bool);
    void (*refuse_register) (int);
    void (*fail_batch) (int);
    void (*fail_2d) (int);
    long (*count) (char);
} F;

static void
s_fake_open (void)
{
    //  The same path as KVPOOL_CUDART: libkvpool's dlopen finds this very copy.
    void *handle = dlopen (s_fake_path, RTLD_NOW | RTLD_LOCAL);
    if (!handle)
        fprintf (stderr, "%s\n", dlerror ());
    CHECK (handle);
#define S_SYM(field, name) CHECK ((*(void **) &F.field = dlsym (handle, name)) != NULL)
    S_SYM (malloc_, "cudaMalloc");
    S_SYM (free_, "cudaFree");
    S_SYM (memcpy_, "cudaMemcpy");
    S_SYM (memset_, "cudaMemset");
    S_SYM (host_alloc, "cudaHostAlloc");
    S_SYM (free_host, "cudaFreeHost");
    S_SYM (set_device, "cudaSetDevice");
    S_SYM (reset, "fake_cudart_reset");
    S_SYM (log, "fake_cudart_log");
    S_SYM (log_len, "fake_cudart_log_len");
    S_SYM (queries, "fake_cudart_queries");
    S_SYM (host_allocs, "fake_cudart_host_allocs");
    S_SYM (fail_copies, "fake_cudart_fail_copies");
    S_SYM (fail_host_alloc, "fake_cudart_fail_host_alloc");
    S_SYM (fail_queries, "fake_cudart_fail_queries");
    S_SYM (no_ranges, "fake_cudart_no_ranges");
    S_SYM (refuse_register, "fake_cudart_refuse_register");
    S_SYM (fail_batch, "fake_cudart_fail_batch");
    S_SYM (fail_2d, "fake_cudart_fail_2d");
    S_SYM (count, "fake_cudart_count");
#undef S_SYM
}

static void *
s_gpu_alloc (size_t size)
{
    void *ptr = NULL;
    CHECK_EQ (F.malloc_ (&ptr, size), 0);
    CHECK_EQ (F.memset_ (ptr, 0, size), 0);
    return ptr;
}

//  ---- values ---------------------------------------------------------------------------------

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

//  A device buffer holding value (seed, size).
static void *
s_gpu_value (size_t size, uint64_t seed)
{
    void *host = s_value (size, seed);
    void *gpu = s_gpu_alloc (size);
    CHECK_EQ (F.memcpy_ (gpu, host, size, 1), 0);
    free (host);
    return gpu;
}

//  Whether size bytes of device memory at gpu are value (seed, size) from offset on.
static bool
s_gpu_equal (const void *gpu, size_t size, uint64_t seed)
{
    void *expected = s_value (size, seed);
    void *back = malloc (size ? size : 1);
    CHECK (back);
    CHECK_EQ (F.memcpy_ (back, gpu, size, 2), 0);
    bool equal = memcmp (back, expected, size) == 0;
    free (expected);
    free (back);
    return equal;
}

static kvpool_t *
s_connect (bool fast)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.fast_path = fast;
    options.keep_endpoint = !fast; //  "tcp": the socket path on the tcp endpoint
    kvpool_t *pool = kvpool_connect (s_server.endpoint, &options);
    CHECK (pool);
    CHECK_EQ (kvpool_fast_path (pool), fast);
    return pool;
}

static const char *
s_mode (bool fast)
{
    return fast ? "fast" : "tcp";
}

//  ---- classification ----------------------------------------------------------------------

static void
s_test_classification (void)
{
    kvpc_device_t *device = kvpc_device_new ();
    CHECK (device);
    CHECK (kvpc_device_begin (device));
    CHECK (strcmp (kvpc_device_runtime (), s_fake_path) == 0);
    void *host = malloc (MiB);
    void *pinned = NULL;
    CHECK_EQ (F.host_alloc (&pinned, MiB, 0), 0);
    char *gpu = s_gpu_alloc (4 * MiB);
    long queries = F.queries ();
    CHECK_EQ (kvpc_device_classify (device, host, MiB), 0);
    CHECK_EQ (kvpc_device_classify (device, gpu, 4 * KiB), 1);
    //  The whole allocation is known now: no further question.
    CHECK_EQ (kvpc_device_classify (device, gpu + MiB, 64 * KiB), 1);
    CHECK_EQ (kvpc_device_classify (device, gpu + 4 * MiB - 1, 1), 1);
    CHECK_EQ (F.queries () - queries, 2);
    //  Pinned host memory is host memory; its range is known for the rest of the call.
    CHECK_EQ (kvpc_device_classify (device, pinned, 4 * KiB), 0);
    CHECK_EQ (kvpc_device_classify (device, (char *) pinned + 8 * KiB, 4 * KiB), 0);
    CHECK_EQ (F.queries () - queries, 3);
    //  Empty and NULL buffers are nothing to copy.
    CHECK_EQ (kvpc_device_classify (device, NULL, 0), 0);
    CHECK_EQ (kvpc_device_classify (device, gpu, 0), 0);
    CHECK (kvpc_device_arm (device));
    int on = -1;
    CHECK (kvpc_device_holds (device, gpu + 123, &on));
    CHECK_EQ (on, 0);
    CHECK (!kvpc_device_holds (device, host, NULL));
    CHECK (!kvpc_device_holds (device, gpu + 4 * MiB + 4096, NULL));
    kvpc_device_copy_t item;
    char scratch[16];
    CHECK (kvpc_device_plan (device, scratch, gpu + 5, 16, &item));
    CHECK (!item.to_device && item.src == gpu + 5 && item.len == 16);
    CHECK (kvpc_device_plan (device, gpu, scratch, 16, &item));
    CHECK (item.to_device);
    CHECK (!kvpc_device_plan (device, scratch, host, 16, &item));
    kvpc_device_end (device);
    CHECK (!kvpc_device_armed (device));
    CHECK (!kvpc_device_holds (device, gpu, NULL));

    //  The next call: device allocations are remembered, host memory is asked again.
    CHECK (kvpc_device_begin (device));
    queries = F.queries ();
    CHECK_EQ (kvpc_device_classify (device, gpu + 2 * MiB, 4 * KiB), 1);
    CHECK_EQ (kvpc_device_classify (device, pinned, 4 * KiB), 0);
    CHECK_EQ (kvpc_device_classify (device, host, 4 * KiB), 0);
    CHECK_EQ (F.queries () - queries, 2);
    //  A call of host buffers only does not arm.
    kvpc_device_end (device);
    CHECK (kvpc_device_begin (device));
    CHECK_EQ (kvpc_device_classify (device, host, 4 * KiB), 0);
    CHECK (!kvpc_device_arm (device));
    kvpc_device_end (device);

    //  A buffer of device 1.
    CHECK_EQ (F.set_device (1), 0);
    char *gpu1 = s_gpu_alloc (MiB);
    CHECK_EQ (F.set_device (0), 0);
    CHECK (kvpc_device_begin (device));
    CHECK_EQ (kvpc_device_classify (device, gpu1 + 10, 10), 1);
    CHECK_EQ (kvpc_device_classify (device, gpu, 10), 1);
    CHECK (kvpc_device_arm (device));
    CHECK (kvpc_device_holds (device, gpu1 + 100, &on));
    CHECK_EQ (on, 1);
    CHECK (kvpc_device_holds (device, gpu + 100, &on));
    CHECK_EQ (on, 0);
    kvpc_device_end (device);

    //  Without the driver's ranges each buffer is its own range.
    kvpc_device_t *plain = kvpc_device_new ();
    F.no_ranges (true);
    CHECK (kvpc_device_begin (plain));
    queries = F.queries ();
    CHECK_EQ (kvpc_device_classify (plain, gpu, 4 * KiB), 1);
    CHECK_EQ (kvpc_device_classify (plain, gpu + KiB, KiB), 1);
    CHECK_EQ (kvpc_device_classify (plain, gpu + 8 * KiB, 4 * KiB), 1);
    CHECK_EQ (F.queries () - queries, 2);
    CHECK (kvpc_device_arm (plain));
    CHECK (kvpc_device_holds (plain, gpu + 9 * KiB, NULL));
    CHECK (!kvpc_device_holds (plain, gpu + 5 * KiB, NULL));
    kvpc_device_end (plain);
    F.no_ranges (false);
    kvpc_device_destroy (&plain);
    kvpc_device_destroy (&device);
    CHECK (device == NULL);

    F.free_ (gpu);
    F.free_ (gpu1);
    F.free_host (pinned);
    free (host);
    printf ("classification: host, pinned and device memory; allocations cached\n");
}

//  ---- single values --------------------------------------------------------------------------

static void
s_test_values (bool fast, bool index)
{
    kvpool_t *pool = s_connect (fast);
    if (fast)
        kvpool_set_index (pool, index);
    const size_t sizes[] = {1,         4095,  64 * KiB,  MiB + 3,
                            STAGE - 1, STAGE, STAGE + 1, 3 * STAGE + 12345};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t size = sizes[s];
        uint64_t seed = 1000 + s;
        char key[64];
        snprintf (key, sizeof key, "dev-%s-%d-%zu", s_mode (fast), index, size);
        void *source = s_gpu_value (size, seed);
        CHECK_EQ (kvpool_put (pool, key, source, size, NULL), KVPOOL_OK);
        //  Into device memory, with room to spare, which stays untouched.
        char *target = s_gpu_alloc (size + 16);
        CHECK_EQ (kvpool_get_into (pool, key, target, size + 16), (int64_t) size);
        CHECK (s_gpu_equal (target, size, seed));
        char tail[16];
        CHECK_EQ (F.memcpy_ (tail, target + size, 16, 2), 0);
        for (int i = 0; i < 16; i++)
            CHECK_EQ (tail[i], 0);
        //  Into host memory: the value is what the device held.
        void *host = malloc (size);
        CHECK_EQ (kvpool_get_into (pool, key, host, size), (int64_t) size);
        void *expected = s_value (size, seed);
        CHECK (memcmp (host, expected, size) == 0);
        //  A device buffer too small: BUFFER_OVERFLOW, nothing written.
        CHECK_EQ (F.memset_ (target, 0, size + 16), 0);
        if (size > 1) {
            CHECK_EQ (kvpool_get_into (pool, key, target, size - 1), KVPOOL_BUFFER_OVERFLOW);
            CHECK_EQ (F.memcpy_ (host, target, size, 2), 0);
            for (size_t i = 0; i < size; i += 4093)
                CHECK_EQ (((char *) host)[i], 0);
        }
        CHECK_EQ (kvpool_remove (pool, key, true), KVPOOL_OK);
        //  Put from host, get into device.
        CHECK_EQ (kvpool_put (pool, key, expected, size, NULL), KVPOOL_OK);
        CHECK_EQ (kvpool_get_into (pool, key, target, size), (int64_t) size);
        CHECK (s_gpu_equal (target, size, seed));
        CHECK_EQ (kvpool_remove (pool, key, true), KVPOOL_OK);
        free (expected);
        free (host);
        F.free_ (source);
        F.free_ (target);
    }
    kvpool_destroy (&pool);
    printf ("%s%s: single values of 1 B to %u MiB from and into device memory\n", s_mode (fast),
            fast ? (index ? " (read index)" : " (replica lists)") : "",
            (unsigned) ((3 * STAGE + 12345) >> 20));
}

//  Upserts from and range reads into device memory (both take the socket path, also on the
//  node's machine).
static void
s_test_upsert_ranges (bool fast)
{
    kvpool_t *pool = s_connect (fast);
    size_t size = 2 * STAGE + 999;
    char *first = s_gpu_value (size, 21);
    char *second = s_gpu_value (size, 22);
    CHECK_EQ (kvpool_upsert (pool, "dev-upsert", first, size, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_upsert (pool, "dev-upsert", second, size, NULL), KVPOOL_OK);
    char *target = s_gpu_alloc (size);
    CHECK_EQ (kvpool_get_into (pool, "dev-upsert", target, size), (int64_t) size);
    CHECK (s_gpu_equal (target, size, 22));
    //  A range across the staging chunk boundary, and ranges of a batch.
    char *expected = s_value (size, 22);
    char *back = malloc (size);
    CHECK_EQ (F.memset_ (target, 0, size), 0);
    CHECK_EQ (kvpool_get_range_into (pool, "dev-upsert", STAGE - 100, target, 300), 300);
    CHECK_EQ (F.memcpy_ (back, target, 300, 2), 0);
    CHECK (memcmp (back, expected + STAGE - 100, 300) == 0);
    const char *keys[] = {"dev-upsert", "dev-upsert"};
    uint64_t offsets[] = {0, size - 10};
    void *buffers[] = {target, target + MiB};
    size_t lengths[] = {MiB, 100};
    int64_t results[2];
    CHECK_EQ (kvpool_get_ranges_into (pool, 2, keys, offsets, buffers, lengths, results),
              KVPOOL_OK);
    CHECK_EQ (results[0], (int64_t) MiB);
    CHECK_EQ (results[1], 10);
    CHECK_EQ (F.memcpy_ (back, target, MiB + 10, 2), 0);
    CHECK (memcmp (back, expected, MiB) == 0);
    CHECK (memcmp (back + MiB, expected + size - 10, 10) == 0);
    CHECK_EQ (kvpool_remove (pool, "dev-upsert", true), KVPOOL_OK);
    free (expected);
    free (back);
    F.free_ (first);
    F.free_ (second);
    F.free_ (target);
    kvpool_destroy (&pool);
    printf ("%s: upserts from and range reads into device memory\n", s_mode (fast));
}

//  ---- batches --------------------------------------------------------------------------------

//  n values cut from one device allocation, put in one batch, read back into slices of
//  another.
static void
s_test_batch (bool fast, size_t n, size_t base_size)
{
    kvpool_t *pool = s_connect (fast);
    size_t *sizes = calloc (n, sizeof *sizes);
    size_t *offsets = calloc (n, sizeof *offsets);
    char **keys = calloc (n, sizeof *keys);
    const void **data = calloc (n, sizeof *data);
    void **targets = calloc (n, sizeof *targets);
    int *statuses = calloc (n, sizeof *statuses);
    int64_t *results = calloc (n, sizeof *results);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        sizes[i] = base_size + i * 37;
        offsets[i] = total;
        total += sizes[i];
        keys[i] = malloc (64);
        snprintf (keys[i], 64, "batch-%s-%zu-%zu-%zu", s_mode (fast), n, base_size, i);
    }
    char *host = malloc (total);
    for (size_t i = 0; i < n; i++)
        s_fill (host + offsets[i], sizes[i], 7 * i + n);
    char *source = s_gpu_alloc (total);
    CHECK_EQ (F.memcpy_ (source, host, total, 1), 0);
    char *target = s_gpu_alloc (total);
    for (size_t i = 0; i < n; i++) {
        data[i] = source + offsets[i];
        targets[i] = target + offsets[i];
    }
    CHECK_EQ (kvpool_put_batch (pool, n, (const char *const *) keys, data, sizes, NULL, statuses),
              KVPOOL_OK);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ (statuses[i], KVPOOL_OK);
    CHECK_EQ (kvpool_get_batch_into (pool, n, (const char *const *) keys, targets, sizes, results),
              KVPOOL_OK);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ (results[i], (int64_t) sizes[i]);
    char *back = malloc (total);
    CHECK_EQ (F.memcpy_ (back, target, total, 2), 0);
    CHECK (memcmp (back, host, total) == 0);
    CHECK_EQ (kvpool_remove_batch (pool, n, (const char *const *) keys, true, statuses), KVPOOL_OK);
    for (size_t i = 0; i < n; i++)
        free (keys[i]);
    free (back);
    free (host);
    F.free_ (source);
    F.free_ (target);
    free (sizes);
    free (offsets);
    free (keys);
    free (data);
    free (targets);
    free (statuses);
    free (results);
    kvpool_destroy (&pool);
    printf ("%s: batch of %zu values of %zu B and up, device to device\n", s_mode (fast), n,
            base_size);
}

//  Values gathered from device, host and device parts (vLLM's multi-buffer puts: a buffer
//  per layer), read back scattered over device and host buffers cut elsewhere.
static void
s_test_parts (bool fast, size_t n, size_t part_size)
{
    kvpool_t *pool = s_connect (fast);
    size_t value_size = 3 * part_size;
    char *gpu = s_gpu_alloc (2 * n * part_size);
    char *host = malloc (n * part_size);
    char *expected = malloc (n * value_size);
    kvpool_iov_t *iovs = calloc (3 * n, sizeof *iovs);
    const kvpool_iov_t **parts = calloc (n, sizeof *parts);
    size_t *nparts = calloc (n, sizeof *nparts);
    char **keys = calloc (n, sizeof *keys);
    int *statuses = calloc (n, sizeof *statuses);
    for (size_t i = 0; i < n; i++) {
        char *value = expected + i * value_size;
        s_fill (value, value_size, 99 + i);
        //  Part 0 and 2 from the device (layers far apart), part 1 from the host.
        char *first = gpu + i * part_size;
        char *last = gpu + (n + i) * part_size;
        CHECK_EQ (F.memcpy_ (first, value, part_size, 1), 0);
        memcpy (host + i * part_size, value + part_size, part_size);
        CHECK_EQ (F.memcpy_ (last, value + 2 * part_size, part_size, 1), 0);
        iovs[3 * i] = (kvpool_iov_t){first, part_size};
        iovs[3 * i + 1] = (kvpool_iov_t){host + i * part_size, part_size};
        iovs[3 * i + 2] = (kvpool_iov_t){last, part_size};
        parts[i] = &iovs[3 * i];
        nparts[i] = 3;
        keys[i] = malloc (64);
        snprintf (keys[i], 64, "parts-%s-%zu-%zu", s_mode (fast), part_size, i);
    }
    CHECK_EQ (
        kvpool_put_batch_parts (pool, n, (const char *const *) keys, parts, nparts, NULL, statuses),
        KVPOOL_OK);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ (statuses[i], KVPOOL_OK);

    //  Scatter: device (a third and a bit), host (up to two thirds), device (the rest).
    size_t cut1 = part_size + 5, cut2 = 2 * part_size - 3;
    char *gpu_back = s_gpu_alloc (n * value_size);
    char *host_back = malloc (n * value_size);
    memset (host_back, 0, n * value_size);
    kvpool_buf_t *bufs = calloc (3 * n, sizeof *bufs);
    const kvpool_buf_t **lists = calloc (n, sizeof *lists);
    size_t *nbufs = calloc (n, sizeof *nbufs);
    int64_t *results = calloc (n, sizeof *results);
    for (size_t i = 0; i < n; i++) {
        char *g = gpu_back + i * value_size;
        bufs[3 * i] = (kvpool_buf_t){g, cut1};
        bufs[3 * i + 1] = (kvpool_buf_t){host_back + i * value_size + cut1, cut2 - cut1};
        bufs[3 * i + 2] = (kvpool_buf_t){g + cut2, value_size - cut2};
        lists[i] = &bufs[3 * i];
        nbufs[i] = 3;
    }
    CHECK_EQ (
        kvpool_get_batch_into_parts (pool, n, (const char *const *) keys, lists, nbufs, results),
        KVPOOL_OK);
    char *gpu_copy = malloc (n * value_size);
    CHECK_EQ (F.memcpy_ (gpu_copy, gpu_back, n * value_size, 2), 0);
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ (results[i], (int64_t) value_size);
        const char *value = expected + i * value_size;
        CHECK (memcmp (gpu_copy + i * value_size, value, cut1) == 0);
        CHECK (memcmp (host_back + i * value_size + cut1, value + cut1, cut2 - cut1) == 0);
        CHECK (memcmp (gpu_copy + i * value_size + cut2, value + cut2, value_size - cut2) == 0);
    }
    CHECK_EQ (kvpool_remove_batch (pool, n, (const char *const *) keys, true, statuses), KVPOOL_OK);
    for (size_t i = 0; i < n; i++)
        free (keys[i]);
    F.free_ (gpu);
    F.free_ (gpu_back);
    free (gpu_copy);
    free (host);
    free (host_back);
    free (expected);
    free (iovs);
    free (parts);
    free (nparts);
    free (keys);
    free (statuses);
    free (bufs);
    free (lists);
    free (nbufs);
    free (results);
    kvpool_destroy (&pool);
    printf ("%s: %zu values of device, host and device parts of %zu B, scattered back\n",
            s_mode (fast), n, part_size);
}

//  ---- the order of the staging copies ----------------------------------------------------

typedef struct {
    char ops[4096];
    size_t count;     //  copies logged
    size_t bytes;     //  their bytes
    size_t largest;   //  the largest
    long first_wait;  //  position of the first wait
    long second_copy; //  position of the second copy
} s_trace_t;

static void
s_trace (char op, s_trace_t *trace)
{
    memset (trace, 0, sizeof *trace);
    size_t total = F.log (trace->ops, sizeof trace->ops);
    CHECK (total < sizeof trace->ops);
    trace->first_wait = trace->second_copy = -1;
    for (size_t i = 0; i < total; i++) {
        char c = trace->ops[i];
        if (c == 'W' && trace->first_wait < 0)
            trace->first_wait = (long) i;
        if (c != op)
            continue;
        size_t len = F.log_len (i);
        trace->count++;
        trace->bytes += len;
        if (len > trace->largest)
            trace->largest = len;
        if (trace->count == 2)
            trace->second_copy = (long) i;
    }
}

static void
s_test_order (void)
{
    size_t size = 3 * STAGE + 5;
    void *source = s_gpu_value (size, 5);
    void *target = s_gpu_alloc (size);
    s_trace_t trace;

    //  Same machine: put in chunks of one staging buffer, the second queued before the first
    //  is waited for (and copied into the segment); get likewise the other way.
    kvpool_t *pool = s_connect (true);
    F.reset ();
    CHECK_EQ (kvpool_put (pool, "order-fast", source, size, NULL), KVPOOL_OK);
    s_trace ('D', &trace);
    CHECK_EQ (trace.count, 4);
    CHECK_EQ (trace.bytes, size);
    CHECK_EQ (trace.largest, STAGE);
    CHECK (trace.first_wait > trace.second_copy && trace.second_copy > 0);
    F.reset ();
    CHECK_EQ (kvpool_get_into (pool, "order-fast", target, size), (int64_t) size);
    s_trace ('H', &trace);
    CHECK_EQ (trace.count, 4);
    CHECK_EQ (trace.bytes, size);
    CHECK_EQ (trace.largest, STAGE);
    CHECK (trace.first_wait > trace.second_copy && trace.second_copy > 0);
    CHECK (s_gpu_equal (target, size, 5));
    kvpool_destroy (&pool);

    //  tcp: three requests of 12 MiB; the second's copy is queued before the first is sent.
    pool = s_connect (false);
    char *values = s_gpu_value (36 * MiB, 6);
    const char *keys[] = {"order-tcp-0", "order-tcp-1", "order-tcp-2"};
    const void *data[] = {values, values + 12 * MiB, values + 24 * MiB};
    size_t sizes[] = {12 * MiB, 12 * MiB, 12 * MiB};
    int statuses[3];
    F.reset ();
    CHECK_EQ (kvpool_put_batch (pool, 3, keys, data, sizes, NULL, statuses), KVPOOL_OK);
    s_trace ('D', &trace);
    CHECK_EQ (trace.count, 3);
    CHECK (trace.first_wait > trace.second_copy && trace.second_copy > 0);
    char *back = s_gpu_alloc (36 * MiB);
    void *targets[] = {back, back + 12 * MiB, back + 24 * MiB};
    int64_t results[3];
    F.reset ();
    CHECK_EQ (kvpool_get_batch_into (pool, 3, keys, targets, sizes, results), KVPOOL_OK);
    s_trace ('H', &trace);
    CHECK_EQ (trace.bytes, 36 * MiB);
    CHECK (trace.largest <= STAGE);
    CHECK (trace.first_wait > trace.second_copy && trace.second_copy > 0);
    CHECK (s_gpu_equal (back, 36 * MiB, 6));
    CHECK_EQ (kvpool_remove_batch (pool, 3, keys, true, statuses), KVPOOL_OK);
    CHECK_EQ (kvpool_remove (pool, "order-fast", true), KVPOOL_OK);

    //  A KV cache's layout: a buffer per layer, a key a block of each. A staging buffer's
    //  pieces are laid out in device order, so the blocks of one layer move in one DMA.
    //  (Layers a block apart, as separate tensors are.)
    kvpool_t *fast = s_connect (true);
    enum { LAYERS = 4, KEYS = 8, BLOCK = 64 * KiB, STRIDE = (KEYS + 1) * BLOCK };
    char *layers = s_gpu_value (LAYERS * STRIDE, 9);
    char *copy = s_gpu_alloc (LAYERS * STRIDE);
    kvpool_iov_t iovs[KEYS][LAYERS];
    kvpool_buf_t bufs[KEYS][LAYERS];
    const kvpool_iov_t *puts[KEYS];
    const kvpool_buf_t *gets[KEYS];
    size_t nparts[KEYS];
    const char *block_keys[KEYS];
    char names[KEYS][32];
    int block_statuses[KEYS];
    int64_t block_results[KEYS];
    for (int k = 0; k < KEYS; k++) {
        for (int l = 0; l < LAYERS; l++) {
            size_t at = (size_t) l * STRIDE + (size_t) k * BLOCK;
            iovs[k][l] = (kvpool_iov_t){layers + at, BLOCK};
            bufs[k][l] = (kvpool_buf_t){copy + at, BLOCK};
        }
        puts[k] = iovs[k];
        gets[k] = bufs[k];
        nparts[k] = LAYERS;
        snprintf (names[k], sizeof names[k], "order-block-%d", k);
        block_keys[k] = names[k];
    }
    F.reset ();
    CHECK_EQ (kvpool_put_batch_parts (fast, KEYS, block_keys, puts, nparts, NULL, block_statuses),
              KVPOOL_OK);
    s_trace ('D', &trace);
    CHECK_EQ (trace.count, LAYERS);
    CHECK_EQ (trace.largest, KEYS * BLOCK);
    F.reset ();
    CHECK_EQ (kvpool_get_batch_into_parts (fast, KEYS, block_keys, gets, nparts, block_results),
              KVPOOL_OK);
    s_trace ('H', &trace);
    CHECK_EQ (trace.count, LAYERS);
    void *expected = s_value (LAYERS * STRIDE, 9);
    char *copied = malloc (LAYERS * STRIDE);
    CHECK_EQ (F.memcpy_ (copied, copy, LAYERS * STRIDE, 2), 0);
    for (int l = 0; l < LAYERS; l++)
        CHECK (memcmp (copied + l * STRIDE, (char *) expected + l * STRIDE, KEYS * BLOCK) == 0);
    free (expected);
    free (copied);
    CHECK_EQ (kvpool_remove_batch (fast, KEYS, block_keys, true, block_statuses), KVPOOL_OK);
    F.free_ (layers);
    F.free_ (copy);
    kvpool_destroy (&fast);

    //  Host buffers with the runtime there: nothing staged.
    void *host = s_value (MiB, 8);
    void *host_back = malloc (MiB);
    for (int fast = 0; fast < 2; fast++) {
        kvpool_t *other = fast ? s_connect (true) : NULL;
        kvpool_t *use = other ? other : pool;
        F.reset ();
        CHECK_EQ (kvpool_put (use, "order-host", host, MiB, NULL), KVPOOL_OK);
        CHECK_EQ (kvpool_get_into (use, "order-host", host_back, MiB), (int64_t) MiB);
        CHECK (memcmp (host, host_back, MiB) == 0);
        CHECK_EQ (F.log (trace.ops, sizeof trace.ops), 0);
        CHECK_EQ (kvpool_remove (use, "order-host", true), KVPOOL_OK);
        kvpool_destroy (&other);
    }
    free (host);
    free (host_back);
    F.free_ (values);
    F.free_ (back);
    F.free_ (source);
    F.free_ (target);
    kvpool_destroy (&pool);
    printf ("staging: chunks of %u MiB at most, the next chunk's copy queued before the last is "
            "waited for, a layer's blocks in one copy; host buffers stage nothing\n",
            STAGE >> 20);
}

static void
s_with_fake (void)
{
    s_fake_open ();
    s_test_classification ();
    for (int fast = 1; fast >= 0; fast--) {
        s_test_values (fast, true);
        if (fast)
            s_test_values (fast, false);
        s_test_upsert_ranges (fast);
        s_test_batch (fast, 100, 64 * KiB);
        s_test_batch (fast, 5, 7 * MiB);
        s_test_parts (fast, 40, 16 * KiB + 3);
        s_test_parts (fast, 3, 3 * MiB);
    }
    s_test_order ();
    //  KVPOOL_DEVICE_DMA=staged: nothing was registered.
    CHECK_EQ (F.count ('r'), 0);
    CHECK_EQ (F.count ('c'), 0);
}

static void s_expect_error (kvpool_t *pool, const char *fragment);

//  ---- direct DMA ---------------------------------------------------------------------------

//  Copies logged since the last reset, of op ('D' from device, 'H' to device).
static size_t
s_copies (char op)
{
    s_trace_t trace;
    s_trace (op, &trace);
    return trace.count;
}

//  A KV cache as vLLM's connector hands it over: LAYERS buffers, a key a block of each. The
//  layers lie D_STRIDE apart (a key's blocks are rows of one 2D copy), or irregularly (each
//  a little further on than the last: one copy a block).
enum { D_LAYERS = 4, D_KEYS = 8, D_BLOCK = 64 * KiB, D_STRIDE = (D_KEYS + 1) * D_BLOCK };
#define D_BYTES (D_LAYERS * D_STRIDE + 16 * 4096)

typedef struct {
    char *layers; //  device memory, D_LAYERS * D_STRIDE
    char *copy;   //  where the blocks are got back into
    kvpool_iov_t iovs[D_KEYS][D_LAYERS];
    kvpool_buf_t bufs[D_KEYS][D_LAYERS];
    const kvpool_iov_t *puts[D_KEYS];
    const kvpool_buf_t *gets[D_KEYS];
    size_t nparts[D_KEYS];
    const char *keys[D_KEYS];
    char names[D_KEYS][32];
    int statuses[D_KEYS];
    int64_t results[D_KEYS];
} s_cache_t;

static void
s_cache_init (s_cache_t *cache, const char *prefix, uint64_t seed, bool irregular)
{
    cache->layers = s_gpu_value (D_BYTES, seed);
    cache->copy = s_gpu_alloc (D_BYTES);
    for (int k = 0; k < D_KEYS; k++) {
        for (int l = 0; l < D_LAYERS; l++) {
            size_t layer = (size_t) l * D_STRIDE + (irregular ? (size_t) (l * l) * 4096 : 0);
            size_t at = layer + (size_t) k * D_BLOCK;
            cache->iovs[k][l] = (kvpool_iov_t){cache->layers + at, D_BLOCK};
            //  Got back in the other order of keys: no run is adjacent on both sides.
            size_t back = layer + (size_t) (D_KEYS - 1 - k) * D_BLOCK;
            cache->bufs[k][l] = (kvpool_buf_t){cache->copy + back, D_BLOCK};
        }
        cache->puts[k] = cache->iovs[k];
        cache->gets[k] = cache->bufs[k];
        cache->nparts[k] = D_LAYERS;
        snprintf (cache->names[k], sizeof cache->names[k], "%s-%d", prefix, k);
        cache->keys[k] = cache->names[k];
    }
}

//  Whether every block came back where it was asked for.
static bool
s_cache_equal (s_cache_t *cache)
{
    char *source = malloc (D_BYTES);
    char *copied = malloc (D_BYTES);
    CHECK (source && copied);
    CHECK_EQ (F.memcpy_ (source, cache->layers, D_BYTES, 2), 0);
    CHECK_EQ (F.memcpy_ (copied, cache->copy, D_BYTES, 2), 0);
    bool equal = true;
    for (int k = 0; k < D_KEYS; k++)
        for (int l = 0; l < D_LAYERS; l++)
            equal &= memcmp ((char *) cache->bufs[k][l].data - cache->copy + copied,
                             (char *) cache->iovs[k][l].data - cache->layers + source, D_BLOCK)
                     == 0;
    free (source);
    free (copied);
    return equal;
}

//  Puts the cache's blocks (a batch of D_KEYS keys of D_LAYERS parts); all must succeed.
static void
s_cache_put (kvpool_t *pool, s_cache_t *cache)
{
    CHECK_EQ (kvpool_put_batch_parts (pool, D_KEYS, cache->keys, cache->puts, cache->nparts, NULL,
                                      cache->statuses),
              KVPOOL_OK);
}

//  Gets them back into a cleared copy; every key must come back whole.
static void
s_cache_get (kvpool_t *pool, s_cache_t *cache)
{
    CHECK_EQ (F.memset_ (cache->copy, 0, D_BYTES), 0);
    CHECK_EQ (kvpool_get_batch_into_parts (pool, D_KEYS, cache->keys, cache->gets, cache->nparts,
                                           cache->results),
              KVPOOL_OK);
    for (int k = 0; k < D_KEYS; k++)
        CHECK_EQ (cache->results[k], D_LAYERS * D_BLOCK);
}

static void
s_cache_remove (kvpool_t *pool, s_cache_t *cache)
{
    CHECK_EQ (kvpool_remove_batch (pool, D_KEYS, cache->keys, true, cache->statuses), KVPOOL_OK);
}

static void
s_cache_fini (s_cache_t *cache)
{
    F.free_ (cache->layers);
    F.free_ (cache->copy);
}

static void
s_test_direct (void)
{
    kvpc_process_counts_t counts;
    //  Host calls register nothing.
    kvpool_t *pool = s_connect (true);
    void *host = s_value (MiB, 21);
    CHECK_EQ (kvpool_put (pool, "direct-host", host, MiB, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_get_into (pool, "direct-host", host, MiB), (int64_t) MiB);
    CHECK_EQ (F.count ('r'), 0);

    //  One value of three staging buffers' size: one DMA each way, straight into and out of
    //  the segment, no pinned buffer allocated, no pageable copy.
    size_t size = 3 * STAGE + 5;
    void *source = s_gpu_value (size, 22);
    void *target = s_gpu_alloc (size);
    long allocs = F.host_allocs ();
    F.reset ();
    CHECK_EQ (kvpool_put (pool, "direct-one", source, size, NULL), KVPOOL_OK);
    CHECK_EQ (F.count ('r'), 1);
    kvpc_process_counts (&counts);
    CHECK_EQ (counts.registered, 1);
    CHECK_EQ (s_copies ('D'), 1);
    CHECK_EQ (F.count ('c'), 1);
    //  Committed only after its DMA completed: another connection reads every byte at once
    //  (the stand-in runs a copy only when it is waited for).
    kvpool_t *other = s_connect (true);
    void *read = malloc (size);
    CHECK_EQ (kvpool_get_into (other, "direct-one", read, size), (int64_t) size);
    void *expected = s_value (size, 22);
    CHECK (memcmp (read, expected, size) == 0);
    free (read);
    free (expected);
    F.reset ();
    CHECK_EQ (kvpool_get_into (pool, "direct-one", target, size), (int64_t) size);
    CHECK_EQ (s_copies ('H'), 1);
    CHECK (s_gpu_equal (target, size, 22));
    CHECK_EQ (F.count ('p'), 0);
    CHECK_EQ (F.host_allocs (), allocs);
    //  Another connection of the same process: the segment is not registered again.
    F.reset ();
    CHECK_EQ (kvpool_put (other, "direct-two", source, size, NULL), KVPOOL_OK);
    CHECK_EQ (F.count ('c'), 1);
    CHECK_EQ (F.count ('r'), 1);

    //  A KV cache's blocks, its layers evenly spaced: a key's blocks are the rows of one 2D
    //  copy each way (adjacent in the segment, a layer apart in device memory).
    s_cache_t cache;
    s_cache_init (&cache, "direct-rows", 23, false);
    F.reset ();
    s_cache_put (pool, &cache);
    CHECK_EQ (F.count ('c'), D_KEYS * D_LAYERS);
    CHECK_EQ (F.count ('2'), D_KEYS);
    F.reset ();
    s_cache_get (pool, &cache);
    CHECK_EQ (F.count ('2'), D_KEYS);
    CHECK_EQ (F.count ('p'), 0);
    CHECK (s_cache_equal (&cache));
    s_cache_remove (pool, &cache);
    //  A runtime that refuses 2D copies: the rows go one by one (in batches) from then on.
    kvpool_t *rows = s_connect (true);
    F.reset ();
    F.fail_2d (801);
    s_cache_put (rows, &cache);
    s_cache_get (rows, &cache);
    CHECK_EQ (F.count ('2'), 0);
    CHECK_EQ (F.count ('b'), 2 * KVPC_DMA_STREAMS);
    CHECK (s_cache_equal (&cache));
    s_cache_remove (rows, &cache);
    kvpool_destroy (&rows);
    s_cache_fini (&cache);

    //  Its layers irregularly spaced. The put: in device order, a layer's blocks of the
    //  batch's keys are adjacent in device memory and a value apart in the segment (the node
    //  places a batch's values one after another in free space): rows of 2D copies. The get
    //  scatters the keys in the other order (a value apart backwards): one DMA a block, in
    //  one batch per stream, spread over the streams.
    s_cache_init (&cache, "direct-block", 23, true);
    F.reset ();
    s_cache_put (pool, &cache);
    CHECK_EQ (F.count ('c'), D_KEYS * D_LAYERS);
    CHECK (F.count ('2') >= 1);
    F.reset ();
    s_cache_get (pool, &cache);
    CHECK_EQ (F.count ('c'), D_KEYS * D_LAYERS);
    CHECK_EQ (F.count ('2'), 0);
    CHECK_EQ (F.count ('b'), KVPC_DMA_STREAMS);
    CHECK_EQ (F.count ('p'), 0);
    CHECK (s_cache_equal (&cache));

    //  A runtime that refuses batches: the copies are queued one by one, the bytes the same.
    s_cache_remove (pool, &cache);
    F.reset ();
    F.fail_batch (801);
    s_cache_put (pool, &cache);
    s_cache_get (pool, &cache);
    CHECK_EQ (F.count ('b'), 0);
    CHECK (F.count ('c') >= 2 * D_KEYS); //  the get's blocks, one by one
    CHECK (s_cache_equal (&cache));
    s_cache_remove (pool, &cache);

    //  A copy fails mid-batch: every key fails with the reason, none is stored, and the
    //  connection goes on working; likewise a get.
    for (int fail_batch = 0; fail_batch < 2; fail_batch++) {
        F.reset ();
        F.fail_batch (fail_batch ? 801 : 0);
        F.fail_copies (5, 700);
        kvpool_put_batch_parts (pool, D_KEYS, cache.keys, cache.puts, cache.nparts, NULL,
                                cache.statuses);
        F.fail_copies (-1, 0);
        s_expect_error (pool, "illegal memory access");
        for (int k = 0; k < D_KEYS; k++) {
            CHECK_EQ (cache.statuses[k], KVPOOL_INVALID_PARAMS);
            CHECK_EQ (kvpool_exist (other, cache.keys[k]), 0);
        }
    }
    F.reset ();
    s_cache_put (pool, &cache);
    F.fail_copies (5, 700);
    kvpool_get_batch_into_parts (pool, D_KEYS, cache.keys, cache.gets, cache.nparts, cache.results);
    F.fail_copies (-1, 0);
    for (int k = 0; k < D_KEYS; k++)
        CHECK_EQ (cache.results[k], KVPOOL_INVALID_PARAMS);
    s_cache_get (pool, &cache);
    CHECK (s_cache_equal (&cache));
    s_cache_remove (pool, &cache);
    s_cache_fini (&cache);

    //  tcp: a received frame is registered for the get's copies and unregistered after them
    //  (one DMA, no staging); small frames, and frames the runtime refuses, are staged.
    kvpool_t *tcp = s_connect (false);
    allocs = F.host_allocs ();
    F.reset ();
    CHECK_EQ (kvpool_get_into (tcp, "direct-one", target, size), (int64_t) size);
    CHECK (s_gpu_equal (target, size, 22));
    CHECK_EQ (F.count ('c'), 1);
    CHECK_EQ (s_copies ('H'), 1);
    CHECK_EQ (F.count ('r') - F.count ('u'), 1); //  only the segment stays registered
    CHECK_EQ (F.count ('n'), 1);
    CHECK_EQ (F.host_allocs (), allocs);
    void *small = s_gpu_value (64 * KiB, 25);
    CHECK_EQ (kvpool_put (tcp, "direct-small", small, 64 * KiB, NULL), KVPOOL_OK);
    F.reset ();
    CHECK_EQ (kvpool_get_into (tcp, "direct-small", target, 64 * KiB), (int64_t) (64 * KiB));
    CHECK (s_gpu_equal (target, 64 * KiB, 25));
    CHECK_EQ (F.count ('c'), 0);
    CHECK_EQ (kvpool_remove (tcp, "direct-small", true), KVPOOL_OK);
    F.free_ (small);
    F.reset ();
    F.refuse_register (801);
    for (int round = 0; round < 2; round++) {
        CHECK_EQ (kvpool_get_into (tcp, "direct-one", target, size), (int64_t) size);
        CHECK (s_gpu_equal (target, size, 22));
    }
    CHECK_EQ (F.count ('c'), 0);
    F.refuse_register (0);
    kvpool_destroy (&tcp);

    CHECK_EQ (kvpool_remove (pool, "direct-one", true), KVPOOL_OK);
    CHECK_EQ (kvpool_remove (pool, "direct-two", true), KVPOOL_OK);
    CHECK_EQ (kvpool_remove (pool, "direct-host", true), KVPOOL_OK);
    //  The segment stays registered while a connection maps it, and is unregistered before
    //  the last one lets go of it.
    kvpool_destroy (&other);
    CHECK_EQ (F.count ('n'), 1);
    kvpool_destroy (&pool);
    CHECK_EQ (F.count ('n'), 0);
    CHECK_EQ (F.count ('u'), F.count ('r'));
    free (host);
    F.free_ (source);
    F.free_ (target);
    printf ("direct: one DMA a value between device memory and the segment, registered once "
            "per process and unregistered with the last connection; a KV cache's blocks as a 2D "
            "copy a key, or in %d batches; no 2D copies, no batches, failures mid-batch: as "
            "they should\n",
            KVPC_DMA_STREAMS);
}

static void
s_direct (void)
{
    s_fake_open ();
    s_test_direct ();
    for (int fast = 1; fast >= 0; fast--) {
        s_test_values (fast, true);
        s_test_upsert_ranges (fast);
        s_test_batch (fast, 100, 64 * KiB);
        s_test_batch (fast, 5, 7 * MiB);
        s_test_parts (fast, 40, 16 * KiB + 3);
        s_test_parts (fast, 3, 3 * MiB);
    }
    CHECK_EQ (F.count ('p'), 0);
}

//  A runtime that will not register the segments: staged, said once on standard error.
static void
s_refused (void)
{
    s_fake_open ();
    char path[] = "/tmp/kvpool-test-device-XXXXXX";
    int fd = mkstemp (path);
    CHECK (fd >= 0);
    fflush (stderr);
    int saved = dup (2);
    CHECK (dup2 (fd, 2) == 2);
    F.refuse_register (801);
    for (int round = 0; round < 2; round++) {
        kvpool_t *pool = s_connect (true);
        void *source = s_gpu_value (3 * MiB, 24);
        void *target = s_gpu_alloc (3 * MiB);
        CHECK_EQ (kvpool_put (pool, "refused", source, 3 * MiB, NULL), KVPOOL_OK);
        CHECK_EQ (kvpool_get_into (pool, "refused", target, 3 * MiB), (int64_t) (3 * MiB));
        CHECK (s_gpu_equal (target, 3 * MiB, 24));
        CHECK_EQ (kvpool_remove (pool, "refused", true), KVPOOL_OK);
        F.free_ (source);
        F.free_ (target);
        kvpool_destroy (&pool);
    }
    fflush (stderr);
    CHECK (dup2 (saved, 2) == 2);
    close (saved);
    char said[4096] = "";
    ssize_t got = pread (fd, said, sizeof said - 1, 0);
    close (fd);
    unlink (path);
    CHECK (got > 0);
    CHECK_EQ (F.count ('r'), 0);
    CHECK_EQ (F.count ('c'), 0);
    CHECK (F.host_allocs () > 0);
    const char *line = strstr (said, "libkvpool: GPU copies");
    CHECK (line && strstr (line, "refused to register") && strstr (line, "CUDA error 801"));
    CHECK (!strstr (line + 1, "libkvpool: GPU copies")); //  once
    printf ("refused: staged, said once: %.*s\n", (int) strcspn (line, "\n"), line);
}

//  ---- failures -----------------------------------------------------------------------------

static void
s_expect_error (kvpool_t *pool, const char *fragment)
{
    const char *error = kvpool_last_error (pool);
    if (!strstr (error, fragment)) {
        fprintf (stderr, "last error '%s' does not say '%s'\n", error, fragment);
        CHECK (strstr (error, fragment));
    }
}

static void
s_test_failures (bool fast)
{
    kvpool_t *pool = s_connect (fast);
    size_t size = 2 * STAGE + 100;
    void *source = s_gpu_value (size, 11);
    void *target = s_gpu_alloc (size);
    char key[64];
    snprintf (key, sizeof key, "fail-%s", s_mode (fast));

    //  A copy fails (half-way, on the same machine, where the value takes three chunks; over
    //  tcp it is one copy into a frame): the put fails, and no part of the value was stored.
    F.fail_copies (fast ? 1 : 0, 700);
    CHECK_EQ (kvpool_put (pool, key, source, size, NULL), KVPOOL_INVALID_PARAMS);
    s_expect_error (pool, "illegal memory access");
    s_expect_error (pool, "device");
    F.fail_copies (-1, 0);
    CHECK_EQ (kvpool_exist (pool, key), 0);
    CHECK_EQ (kvpool_put (pool, key, source, size, NULL), KVPOOL_OK);

    //  A get whose copy fails half-way: INVALID_PARAMS; the next works.
    F.fail_copies (1, 700);
    CHECK_EQ (kvpool_get_into (pool, key, target, size), KVPOOL_INVALID_PARAMS);
    s_expect_error (pool, "illegal memory access");
    F.fail_copies (-1, 0);
    CHECK_EQ (kvpool_get_into (pool, key, target, size), (int64_t) size);
    CHECK (s_gpu_equal (target, size, 11));

    //  A batch whose copies fail: every key fails, none is stored; host values of the same
    //  connection still go through.
    const char *keys[] = {"fail-batch-0", "fail-batch-1", "fail-batch-2", "fail-batch-3"};
    char *slices = source;
    const void *data[] = {slices, slices + 64 * KiB, slices + 128 * KiB, slices + 192 * KiB};
    size_t sizes[] = {64 * KiB, 64 * KiB, 64 * KiB, 64 * KiB};
    int statuses[4];
    F.fail_copies (0, 700);
    kvpool_put_batch (pool, 4, keys, data, sizes, NULL, statuses);
    F.fail_copies (-1, 0);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ (statuses[i], KVPOOL_INVALID_PARAMS);
        CHECK_EQ (kvpool_exist (pool, keys[i]), 0);
    }
    void *host = s_value (size, 12);
    CHECK_EQ (kvpool_put (pool, "fail-host", host, size, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_remove (pool, "fail-host", true), KVPOOL_OK);
    CHECK_EQ (kvpool_remove (pool, key, true), KVPOOL_OK);
    free (host);
    F.free_ (source);
    F.free_ (target);
    kvpool_destroy (&pool);

    //  Pinned memory cannot be had (a new connection has none yet).
    pool = s_connect (fast);
    source = s_gpu_value (MiB, 13);
    F.fail_host_alloc (true);
    CHECK_EQ (kvpool_put (pool, key, source, MiB, NULL), KVPOOL_INVALID_PARAMS);
    s_expect_error (pool, "pinned");
    s_expect_error (pool, "out of memory");
    CHECK_EQ (kvpool_exist (pool, key), 0);
    host = s_value (MiB, 13);
    CHECK_EQ (kvpool_put (pool, key, host, MiB, NULL), KVPOOL_OK);
    F.fail_host_alloc (false);
    target = s_gpu_alloc (MiB);
    CHECK_EQ (kvpool_get_into (pool, key, target, MiB), (int64_t) MiB);
    CHECK (s_gpu_equal (target, MiB, 13));
    CHECK_EQ (kvpool_remove (pool, key, true), KVPOOL_OK);

    //  The runtime cannot say what a buffer is (one it did not see before: known
    //  allocations are not asked again): INVALID_PARAMS, the buffer untouched.
    void *fresh = s_gpu_value (MiB, 15);
    CHECK_EQ (kvpool_put (pool, key, host, MiB, NULL), KVPOOL_OK);
    F.fail_queries (700);
    CHECK_EQ (kvpool_put (pool, "fail-query", fresh, MiB, NULL), KVPOOL_INVALID_PARAMS);
    s_expect_error (pool, "cudaPointerGetAttributes");
    CHECK_EQ (kvpool_get_into (pool, key, host, MiB), KVPOOL_INVALID_PARAMS);
    CHECK_EQ (kvpool_get_into (pool, key, target, MiB), (int64_t) MiB);
    F.fail_queries (0);
    CHECK_EQ (kvpool_exist (pool, "fail-query"), 0);
    CHECK_EQ (kvpool_remove (pool, key, true), KVPOOL_OK);
    F.free_ (fresh);
    free (host);
    F.free_ (source);
    F.free_ (target);
    kvpool_destroy (&pool);
    printf ("%s: failed copies, no pinned memory, failed pointer queries: INVALID_PARAMS with "
            "the reason, nothing stored\n",
            s_mode (fast));
}

static void
s_failures (void)
{
    s_fake_open ();
    s_test_failures (true);
    s_test_failures (false);
    //  A runtime that says there is no device: this process has no device memory, and
    //  host buffers go on as before.
    kvpool_t *pool = s_connect (true);
    void *host = s_value (MiB, 14);
    void *back = malloc (MiB);
    F.fail_queries (100);
    CHECK_EQ (kvpool_put (pool, "no-device", host, MiB, NULL), KVPOOL_OK);
    CHECK_EQ (kvpool_get_into (pool, "no-device", back, MiB), (int64_t) MiB);
    CHECK (memcmp (host, back, MiB) == 0);
    long queries = F.queries ();
    CHECK_EQ (kvpool_get_into (pool, "no-device", back, MiB), (int64_t) MiB);
    CHECK_EQ (F.queries (), queries); //  not asked again
    CHECK_EQ (kvpool_remove (pool, "no-device", true), KVPOOL_OK);
    free (host);
    free (back);
    kvpool_destroy (&pool);
    printf ("a runtime without devices: host memory as before, not asked again\n");
}

//  ---- no runtime -------------------------------------------------------------------------------

static void
s_without_runtime (void)
{
    for (int fast = 1; fast >= 0; fast--) {
        kvpool_t *pool = s_connect (fast);
        const size_t sizes[] = {1, 64 * KiB, 3 * STAGE + 7};
        for (size_t s = 0; s < 3; s++) {
            void *value = s_value (sizes[s], s);
            void *back = malloc (sizes[s]);
            CHECK_EQ (kvpool_put (pool, "plain", value, sizes[s], NULL), KVPOOL_OK);
            CHECK_EQ (kvpool_get_into (pool, "plain", back, sizes[s]), (int64_t) sizes[s]);
            CHECK (memcmp (value, back, sizes[s]) == 0);
            CHECK_EQ (kvpool_remove (pool, "plain", true), KVPOOL_OK);
            free (value);
            free (back);
        }
        kvpool_destroy (&pool);
    }
    kvpc_device_t *device = kvpc_device_new ();
    CHECK (!kvpc_device_begin (device));
    CHECK_EQ (kvpc_device_classify (device, &device, 8), 0);
    CHECK (!kvpc_device_arm (device));
    kvpc_device_destroy (&device);
    CHECK_EQ (strlen (kvpc_device_runtime ()), 0);
    const char *env = getenv ("KVPOOL_CUDART");
    printf ("no runtime (KVPOOL_CUDART%s%s): host calls as before\n", env ? "=" : " unset",
            env ? env : "");
}

//  ---- main -----------------------------------------------------------------------------------

static void
s_kill_server (void)
{
    if (getpid () == s_parent && s_server.pid > 0) {
        kill (s_server.pid, SIGKILL);
        unlink (s_server.ready_file);
    }
}

static void
s_on_signal (int signal)
{
    s_kill_server ();
    _exit (128 + signal);
}

//  Runs part in a child process with KVPOOL_CUDART set to cudart (NULL: unset) and
//  KVPOOL_DEVICE_DMA to dma (NULL: unset, direct DMA).
static void
s_run (const char *name, void (*part) (void), const char *cudart, const char *dma)
{
    if (dma)
        setenv ("KVPOOL_DEVICE_DMA", dma, 1);
    else
        unsetenv ("KVPOOL_DEVICE_DMA");
    //  KVPOOL_TEST_PART=name runs that part alone, in this process (for a debugger).
    const char *only = getenv ("KVPOOL_TEST_PART");
    if (only && strcmp (only, name) != 0)
        return;
    if (only) {
        if (cudart)
            setenv ("KVPOOL_CUDART", cudart, 1);
        part ();
        return;
    }
    fflush (stdout);
    pid_t pid = fork ();
    CHECK (pid >= 0);
    if (pid == 0) {
        if (cudart)
            setenv ("KVPOOL_CUDART", cudart, 1);
        else
            unsetenv ("KVPOOL_CUDART");
        part ();
        fflush (stdout);
        _exit (0);
    }
    int status = 0;
    CHECK (waitpid (pid, &status, 0) == pid);
    if (!WIFEXITED (status) || WEXITSTATUS (status) != 0) {
        fprintf (stderr, "part '%s' failed (status %d)\n", name, status);
        exit (1);
    }
}

int
main (void)
{
    s_parent = getpid ();
    atexit (s_kill_server);
    signal (SIGTERM, s_on_signal);
    signal (SIGINT, s_on_signal);
    const char *bin = getenv ("KVPOOL_BIN");
    char lib[PATH_MAX];
    snprintf (lib, sizeof lib, "%s/../lib/libfake_cudart.so", bin ? bin : "build/bin");
    CHECK (realpath (lib, s_fake_path) != NULL);

    const char *args[] = {"--segment-size", "256MiB", NULL};
    CHECK_EQ (testutil_server_start (&s_server, args), 0);
    s_run ("direct", s_direct, s_fake_path, NULL);
    s_run ("refused", s_refused, s_fake_path, NULL);
    s_run ("fake", s_with_fake, s_fake_path, "staged");
    s_run ("failures", s_failures, s_fake_path, "staged");
    s_run ("none", s_without_runtime, "none", NULL);
    s_run ("missing", s_without_runtime, "/nonexistent/libcudart.so.12", NULL);
    s_run ("auto", s_without_runtime, NULL, NULL);
    CHECK_EQ (testutil_server_stop (&s_server, SIGTERM), 0);
    printf ("device memory: all passed\n");
    return 0;
}
