/*  gpu_check.c - kvpool-gpu-check: puts from and gets into real GPU memory through kvpoold.
    Run by hand on a machine with an NVIDIA GPU; not part of `make test`.

      kvpool-gpu-check [--kvpoold PATH | --endpoint ENDPOINT] [--total-mib N] [--sizes-mib LIST]
                       [--cudart PATH] [--reps N]

    Loads the CUDA runtime with dlopen (--cudart PATH, else libcudart.so.13, .12, .11.0 or
    libcudart.so; no CUDA headers or libraries at build time), allocates two device buffers of
    total bytes (default 1024 MiB) and fills the first with a pattern. For each value size
    (default 1,4,16,64 MiB) it puts the whole buffer as total/size keys (kvpool_put_batch of
    device addresses) and gets them back into the second buffer (kvpool_get_batch_into of
    device addresses), over the same-machine fast path and over tcp (the socket path on the
    tcp endpoint), checks every byte, and prints GB/s beside plain cudaMemcpy of the same sizes
    device-to-host and host-to-device, pinned and pageable, and beside the same puts and gets
    of host memory (best of --reps runs, default 3). A second line per size does it again with
    each value made of --layers parts (default 32), one from each of that many regions of the
    buffer, as vLLM's connector passes a block of every layer's KV-cache tensor.

    kvpoold: --kvpoold PATH starts that binary (named kvpoold: the tests' helper starts the
    kvpoold in PATH's folder) on loopback ports with a segment big enough; without it, the
    kvpoold beside this program; --endpoint uses a node already running instead (on this
    machine, with room for total bytes, for the fast path to be measured).
    Needs only libkvpool.so and what it links (libzmq, libczmq, libprotobuf-c, libmsgpackc);
    `make gpu-bundle` gathers them (LD_LIBRARY_PATH=the bundle).
*/
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvpool.h"
#include "tests/testutil.h"

#define MiB (1ull << 20)

static struct {
    int (*malloc_) (void **, size_t);
    int (*free_) (void *);
    int (*host_alloc) (void **, size_t, unsigned int);
    int (*free_host) (void *);
    int (*memcpy_) (void *, const void *, size_t, int);
    int (*memset_) (void *, int, size_t);
    int (*synchronize) (void);
    int (*get_device) (int *);
    int (*runtime_version) (int *);
    int (*properties) (void *, int);
    const char *(*error_string) (int);
    int (*pointer_attributes) (void *, const void *);
} R;

static testutil_server_t s_server;
static char s_runtime_path[PATH_MAX];

static void
s_stop_server (void)
{
    if (s_server.pid > 0)
        testutil_server_stop (&s_server, SIGTERM);
}

static void
s_on_signal (int signal)
{
    if (s_server.pid > 0)
        kill (s_server.pid, SIGKILL);
    _exit (128 + signal);
}

static void
s_cuda (int rc, const char *what)
{
    if (rc != 0) {
        fprintf (stderr, "kvpool-gpu-check: %s failed: %s (%d)\n", what, R.error_string (rc), rc);
        exit (1);
    }
}

static void
s_load_runtime (const char *path)
{
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                        "libcudart.so"};
    void *handle = NULL;
    if (path)
        handle = dlopen (path, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; !path && !handle && i < sizeof names / sizeof names[0]; i++)
        handle = dlopen (names[i], RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        fprintf (stderr, "kvpool-gpu-check: no CUDA runtime (%s)\n", dlerror ());
        exit (1);
    }
#define S_SYM(field, name)                                                                         \
    if (!(*(void **) &R.field = dlsym (handle, name))) {                                           \
        fprintf (stderr, "kvpool-gpu-check: the runtime lacks %s\n", name);                        \
        exit (1);                                                                                  \
    }
    S_SYM (malloc_, "cudaMalloc");
    S_SYM (free_, "cudaFree");
    S_SYM (host_alloc, "cudaHostAlloc");
    S_SYM (free_host, "cudaFreeHost");
    S_SYM (memcpy_, "cudaMemcpy");
    S_SYM (memset_, "cudaMemset");
    S_SYM (synchronize, "cudaDeviceSynchronize");
    S_SYM (get_device, "cudaGetDevice");
    S_SYM (runtime_version, "cudaRuntimeGetVersion");
    S_SYM (error_string, "cudaGetErrorString");
    S_SYM (pointer_attributes, "cudaPointerGetAttributes");
#undef S_SYM
    *(void **) &R.properties = dlsym (handle, "cudaGetDeviceProperties_v2");
    if (!R.properties)
        *(void **) &R.properties = dlsym (handle, "cudaGetDeviceProperties");
    Dl_info info;
    if (dladdr ((void *) R.malloc_, &info) && info.dli_fname)
        snprintf (s_runtime_path, sizeof s_runtime_path, "%s", info.dli_fname);
    //  libkvpool finds the same runtime (already in the process) by itself; a named one it
    //  is told.
    if (path)
        setenv ("KVPOOL_CUDART", path, 1);
}

static double
s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void
s_fill (unsigned char *buffer, size_t size)
{
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i + 8 <= size; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy (buffer + i, &x, 8);
    }
}

typedef struct {
    size_t total;
    unsigned char *pattern; //  host copy of the source
    unsigned char *pinned;  //  total bytes of pinned host memory
    unsigned char *pageable;
    void *source; //  device
    void *target; //  device
    int reps;
} s_check_t;

//  Best GB/s of plain cudaMemcpy of total bytes in pieces of size, kind 2 (D2H) or 1 (H2D).
static double
s_memcpy_rate (s_check_t *check, size_t size, int kind, unsigned char *host)
{
    double best = 0;
    for (int rep = 0; rep < check->reps; rep++) {
        double start = s_now ();
        for (size_t at = 0; at < check->total; at += size) {
            if (kind == 2)
                s_cuda (R.memcpy_ (host + at, (char *) check->source + at, size, 2), "cudaMemcpy");
            else
                s_cuda (R.memcpy_ ((char *) check->target + at, host + at, size, 1), "cudaMemcpy");
        }
        double rate = (double) check->total / (s_now () - start) / 1e9;
        best = rate > best ? rate : best;
    }
    return best;
}

//  Best GB/s of putting the source as values of size, and of getting them into the target
//  (device memory; with host, the pattern and the pageable buffer instead, for comparison);
//  every byte checked after every get. With layers, each value is layers parts, part p from
//  the p-th of layers equal regions of the buffer (a vLLM KV cache: a tensor per layer, a key
//  a block of each), put and got with the _parts calls.
static void
s_kvpool_rates (s_check_t *check, kvpool_t *pool, size_t size, bool host, size_t layers,
                double *put_rate, double *get_rate)
{
    char *source = host ? (char *) check->pattern : check->source;
    char *target = host ? (char *) check->pageable : check->target;
    size_t n = check->total / size;
    size_t nparts = layers ? layers : 1;
    size_t part = size / nparts;
    size_t region = check->total / nparts;
    char **keys = calloc (n, sizeof *keys);
    kvpool_iov_t *iovs = calloc (n * nparts, sizeof *iovs);
    kvpool_buf_t *bufs = calloc (n * nparts, sizeof *bufs);
    const kvpool_iov_t **puts = calloc (n, sizeof *puts);
    const kvpool_buf_t **gets = calloc (n, sizeof *gets);
    size_t *counts = calloc (n, sizeof *counts);
    int *statuses = calloc (n, sizeof *statuses);
    int64_t *results = calloc (n, sizeof *results);
    CHECK (keys && iovs && bufs && puts && gets && counts && statuses && results);
    CHECK (part * nparts == size);
    for (size_t i = 0; i < n; i++) {
        keys[i] = malloc (80);
        snprintf (keys[i], 80, "gpu-check-%zu-%zu-%zu", size >> 20, nparts, i);
        for (size_t p = 0; p < nparts; p++) {
            size_t at = layers ? p * region + i * part : i * size;
            iovs[i * nparts + p] = (kvpool_iov_t){source + at, part};
            bufs[i * nparts + p] = (kvpool_buf_t){target + at, part};
        }
        puts[i] = &iovs[i * nparts];
        gets[i] = &bufs[i * nparts];
        counts[i] = nparts;
    }
    *put_rate = *get_rate = 0;
    for (int rep = 0; rep < check->reps; rep++) {
        kvpool_remove_all (pool, true);
        double start = s_now ();
        int rc = kvpool_put_batch_parts (pool, n, (const char *const *) keys, puts, counts, NULL,
                                         statuses);
        double put = (double) (n * size) / (s_now () - start) / 1e9;
        for (size_t i = 0; i < n && rc == KVPOOL_OK; i++)
            rc = statuses[i];
        if (rc != KVPOOL_OK) {
            fprintf (stderr, "kvpool-gpu-check: put of %zu MiB values: %s (%s)\n", size >> 20,
                     kvpool_status_name (rc), kvpool_last_error (pool));
            exit (1);
        }
        if (host)
            memset (target, 0, check->total);
        else {
            s_cuda (R.memset_ (target, 0, check->total), "cudaMemset");
            s_cuda (R.synchronize (), "cudaDeviceSynchronize");
        }
        start = s_now ();
        rc = kvpool_get_batch_into_parts (pool, n, (const char *const *) keys, gets, counts,
                                          results);
        double get = (double) (n * size) / (s_now () - start) / 1e9;
        for (size_t i = 0; i < n && rc == KVPOOL_OK; i++)
            if (results[i] != (int64_t) size)
                rc = results[i] < 0 ? (int) results[i] : KVPOOL_INTERNAL_ERROR;
        if (rc != KVPOOL_OK) {
            fprintf (stderr, "kvpool-gpu-check: get of %zu MiB values: %s (%s)\n", size >> 20,
                     kvpool_status_name (rc), kvpool_last_error (pool));
            exit (1);
        }
        //  Values and regions tile the buffer: the target must be the source.
        unsigned char *back = host ? check->pageable : check->pinned;
        if (!host)
            s_cuda (R.memcpy_ (back, target, n * size, 2), "cudaMemcpy");
        if (memcmp (back, check->pattern, n * size) != 0) {
            size_t at = 0;
            while (back[at] == check->pattern[at])
                at++;
            fprintf (stderr, "kvpool-gpu-check: %zu MiB values: byte %zu differs after a get\n",
                     size >> 20, at);
            exit (1);
        }
        *put_rate = put > *put_rate ? put : *put_rate;
        *get_rate = get > *get_rate ? get : *get_rate;
    }
    kvpool_remove_all (pool, true);
    for (size_t i = 0; i < n; i++)
        free (keys[i]);
    free (keys);
    free (iovs);
    free (bufs);
    free (puts);
    free (gets);
    free (counts);
    free (statuses);
    free (results);
}

//  Microseconds one cudaPointerGetAttributes takes on ptr (what classifying a buffer costs
//  when no cache answers).
static double
s_query_us (const void *ptr)
{
    long attributes[32];
    int count = 100000;
    double start = s_now ();
    for (int i = 0; i < count; i++)
        R.pointer_attributes (attributes, ptr);
    return (s_now () - start) / count * 1e6;
}

static void
s_usage (void)
{
    fprintf (stderr, "usage: kvpool-gpu-check [--kvpoold PATH | --endpoint ENDPOINT] "
                     "[--total-mib N] [--sizes-mib 1,4,16,64] [--layers N] [--cudart PATH] "
                     "[--reps N]\n");
    exit (2);
}

int
main (int argc, char **argv)
{
    const char *kvpoold = NULL, *endpoint = NULL, *cudart = NULL;
    const char *size_list = "1,4,16,64";
    size_t total_mib = 1024;
    int reps = 3;
    size_t layers = 32;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            s_usage ();
        if (strcmp (argv[i], "--kvpoold") == 0)
            kvpoold = argv[++i];
        else if (strcmp (argv[i], "--endpoint") == 0)
            endpoint = argv[++i];
        else if (strcmp (argv[i], "--cudart") == 0)
            cudart = argv[++i];
        else if (strcmp (argv[i], "--total-mib") == 0)
            total_mib = strtoull (argv[++i], NULL, 10);
        else if (strcmp (argv[i], "--sizes-mib") == 0)
            size_list = argv[++i];
        else if (strcmp (argv[i], "--reps") == 0)
            reps = atoi (argv[++i]);
        else if (strcmp (argv[i], "--layers") == 0)
            layers = strtoull (argv[++i], NULL, 10);
        else
            s_usage ();
    }
    if (total_mib == 0 || reps < 1)
        s_usage ();
    kvpool_tune_malloc ();
    s_load_runtime (cudart);

    s_check_t check = {.total = total_mib * MiB, .reps = reps};
    s_cuda (R.malloc_ (&check.source, check.total), "cudaMalloc");
    s_cuda (R.malloc_ (&check.target, check.total), "cudaMalloc");
    s_cuda (R.host_alloc ((void **) &check.pinned, check.total, 0), "cudaHostAlloc");
    check.pattern = malloc (check.total);
    check.pageable = malloc (check.total);
    CHECK (check.pattern && check.pageable);
    s_fill (check.pattern, check.total);
    memset (check.pageable, 1, check.total);
    s_cuda (R.memcpy_ (check.source, check.pattern, check.total, 1), "cudaMemcpy");

    int device = 0, version = 0;
    R.get_device (&device);
    R.runtime_version (&version);
    char name[256] = "?";
    static char properties[16384]; //  cudaDeviceProp starts with char name[256]
    if (R.properties && R.properties (properties, device) == 0)
        snprintf (name, sizeof name, "%.255s", properties);

    if (!endpoint) {
        char dir[PATH_MAX];
        if (kvpoold)
            snprintf (dir, sizeof dir, "%s", kvpoold);
        else {
            ssize_t len = readlink ("/proc/self/exe", dir, sizeof dir - 1);
            CHECK (len > 0);
            dir[len] = 0;
        }
        char *slash = strrchr (dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf (dir, sizeof dir, ".");
        setenv ("KVPOOL_BIN", dir, 1);
        atexit (s_stop_server);
        signal (SIGINT, s_on_signal);
        signal (SIGTERM, s_on_signal);
        char segment[32];
        snprintf (segment, sizeof segment, "%zuMiB", total_mib + total_mib / 4 + 64);
        const char *args[] = {"--segment-size", segment, NULL};
        if (testutil_server_start (&s_server, args) != 0) {
            fprintf (stderr, "kvpool-gpu-check: cannot start %s/kvpoold\n", dir);
            return 1;
        }
        endpoint = s_server.endpoint;
    }

    kvpool_options_t fast_options, tcp_options;
    kvpool_options_init (&fast_options);
    kvpool_options_init (&tcp_options);
    fast_options.timeout_ms = tcp_options.timeout_ms = 60000;
    tcp_options.fast_path = 0;
    tcp_options.keep_endpoint = 1;
    kvpool_t *fast = kvpool_connect (endpoint, &fast_options);
    kvpool_t *tcp = kvpool_connect (endpoint, &tcp_options);
    if (!fast || !tcp) {
        fprintf (stderr, "kvpool-gpu-check: cannot connect to %s\n", endpoint);
        return 1;
    }

    printf ("kvpool-gpu-check: %s (device %d), CUDA runtime %d.%d (%s), %zu MiB a pass, "
            "GB/s, best of %d%s\n",
            name, device, version / 1000, version % 1000 / 10, s_runtime_path, total_mib, reps,
            kvpool_fast_path (fast) ? "" : "; NO FAST PATH: the first pair is the socket path too");
    printf ("%8s | %-17s | %-17s | %-27s | %-27s\n", "value", "cudaMemcpy D2H", "cudaMemcpy H2D",
            "kvpool fast path put/get", "kvpool tcp put/get");
    printf ("%8s | %8s %8s | %8s %8s | %13s %13s | %13s %13s\n", "", "pinned", "pageable", "pinned",
            "pageable", "device", "host", "device", "host");
    char *list = strdup (size_list);
    for (char *item = strtok (list, ","); item; item = strtok (NULL, ",")) {
        size_t size = strtoull (item, NULL, 10) * MiB;
        if (size == 0 || size > check.total)
            continue;
        double d2h_pinned = s_memcpy_rate (&check, size, 2, check.pinned);
        double d2h_pageable = s_memcpy_rate (&check, size, 2, check.pageable);
        double h2d_pinned = s_memcpy_rate (&check, size, 1, check.pinned);
        double h2d_pageable = s_memcpy_rate (&check, size, 1, check.pageable);
        double rates[4][2]; //  fast device, fast host, tcp device, tcp host: put, get
        for (int i = 0; i < 4; i++)
            s_kvpool_rates (&check, i < 2 ? fast : tcp, size, i % 2, 0, &rates[i][0], &rates[i][1]);
        printf ("%4zu MiB | %8.1f %8.1f | %8.1f %8.1f |", size >> 20, d2h_pinned, d2h_pageable,
                h2d_pinned, h2d_pageable);
        for (int i = 0; i < 4; i++)
            printf (" %6.1f %6.1f%s", rates[i][0], rates[i][1], i == 1 ? " |" : "");
        printf ("\n");
        if (layers > 1 && size % layers == 0 && check.total % (layers * size) == 0) {
            //  The same values, each gathered from and scattered to a part in every layer.
            for (int i = 0; i < 4; i++)
                s_kvpool_rates (&check, i < 2 ? fast : tcp, size, i % 2, layers, &rates[i][0],
                                &rates[i][1]);
            char label[96];
            snprintf (label, sizeof label, "  the same as %zu layers of %zu KiB", layers,
                      (size / layers) >> 10);
            printf ("%-48s |", label);
            for (int i = 0; i < 4; i++)
                printf (" %6.1f %6.1f%s", rates[i][0], rates[i][1], i == 1 ? " |" : "");
            printf ("\n");
        }
        fflush (stdout);
    }
    free (list);
    printf ("every byte checked after every get: ok; cudaPointerGetAttributes %.2f us on host "
            "memory, %.2f us on device memory\n",
            s_query_us (check.pageable + 4096), s_query_us ((char *) check.source + 4096));
    kvpool_destroy (&fast);
    kvpool_destroy (&tcp);
    R.free_ (check.source);
    R.free_ (check.target);
    R.free_host (check.pinned);
    free (check.pattern);
    free (check.pageable);
    return 0;
}
