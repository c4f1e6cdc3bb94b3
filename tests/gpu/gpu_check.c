/*  gpu_check.c - kvpool-gpu-check: puts from and gets into real GPU memory through kvpoold.
    Run by hand on a machine with an NVIDIA GPU; not part of `make test`.

      kvpool-gpu-check [--kvpoold PATH | --endpoint ENDPOINT] [--total-mib N] [--sizes-mib LIST]
                       [--layers N] [--cudart PATH] [--reps N] [--tcp 0|1]

    Loads the CUDA runtime with dlopen (--cudart PATH, else libcudart.so.13, .12, .11.0 or
    libcudart.so; no CUDA headers or libraries at build time), allocates two device buffers of
    total bytes (default 1024 MiB) and fills the first with a pattern. For each value size
    (default 1,4,16,64 MiB) it puts the whole buffer as total/size keys (kvpool_put_batch of
    device addresses) and gets them back into the second buffer (kvpool_get_batch_into of
    device addresses), over the same-machine fast path and over tcp (the socket path on the
    tcp endpoint; --tcp 0 leaves it out), checks every byte, and prints GB/s beside plain
    cudaMemcpy of the same sizes device-to-host and host-to-device, pinned and pageable, and
    beside the same puts and gets of host memory (best of --reps runs, default 3). The
    same-machine path is measured both ways, side by side: by direct DMA into the node's
    segments (the default) and through pinned staging buffers (KVPOOL_DEVICE_DMA=staged, in a
    process context of its own), with the direct path's ratio to pinned cudaMemcpy. A second
    line per size does it again with each value made of --layers parts (default 32), one from
    each of that many regions of the buffer, as vLLM's connector passes a block of every
    layer's KV-cache tensor. The first device put of the direct pass registers the node's
    segment with the runtime; its time is printed.

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
                     "[--reps N] [--tcp 0|1]\n");
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
    bool with_tcp = true;
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
        else if (strcmp (argv[i], "--tcp") == 0)
            with_tcp = atoi (argv[++i]) != 0;
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

    char segment_label[32] = "already running";
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
        snprintf (segment_label, sizeof segment_label, "%zuMiB", total_mib + total_mib / 4 + 64);
        const char *args[] = {"--segment-size", segment_label, NULL};
        if (testutil_server_start (&s_server, args) != 0) {
            fprintf (stderr, "kvpool-gpu-check: cannot start %s/kvpoold\n", dir);
            return 1;
        }
        endpoint = s_server.endpoint;
    }

    printf ("kvpool-gpu-check: %s (device %d), CUDA runtime %d.%d (%s), %zu MiB a pass, "
            "GB/s, best of %d\n",
            name, device, version / 1000, version % 1000 / 10, s_runtime_path, total_mib, reps);

    //  rates[size][line][column][put, get]; line 0 whole values, 1 as layers; columns: fast
    //  path direct, fast path staged, fast path host, tcp device, tcp host.
    enum { DIRECT, STAGED, HOST, TCP_DEVICE, TCP_STAGED, TCP_HOST, COLUMNS };
    enum { MAX_SIZES = 16 };
    static double rates[MAX_SIZES][2][COLUMNS][2];
    size_t sizes[MAX_SIZES];
    size_t nsizes = 0;
    char *list = strdup (size_list);
    for (char *item = strtok (list, ","); item && nsizes < MAX_SIZES; item = strtok (NULL, ",")) {
        size_t size = strtoull (item, NULL, 10) * MiB;
        if (size && size <= check.total)
            sizes[nsizes++] = size;
    }
    free (list);
    double register_ms = 0;
    //  Each pass in a process context of its own: KVPOOL_DEVICE_DMA is read when the first
    //  connection makes it, and the last one to close frees it.
    for (int pass = 0; pass < 2; pass++) {
        bool staged = pass == 1;
        if (staged)
            setenv ("KVPOOL_DEVICE_DMA", "staged", 1);
        else
            unsetenv ("KVPOOL_DEVICE_DMA");
        kvpool_options_t fast_options, tcp_options;
        kvpool_options_init (&fast_options);
        kvpool_options_init (&tcp_options);
        fast_options.timeout_ms = tcp_options.timeout_ms = 60000;
        tcp_options.fast_path = 0;
        tcp_options.keep_endpoint = 1;
        kvpool_t *fast = kvpool_connect (endpoint, &fast_options);
        kvpool_t *tcp = with_tcp ? kvpool_connect (endpoint, &tcp_options) : NULL;
        if (!fast || (with_tcp && !tcp)) {
            fprintf (stderr, "kvpool-gpu-check: cannot connect to %s\n", endpoint);
            return 1;
        }
        if (!kvpool_fast_path (fast)) {
            fprintf (stderr, "kvpool-gpu-check: no same-machine path to %s\n", endpoint);
            return 1;
        }
        if (!staged) {
            double start = s_now ();
            if (kvpool_put (fast, "gpu-check-first", check.source, 4096, NULL) != KVPOOL_OK) {
                fprintf (stderr, "kvpool-gpu-check: first put: %s\n", kvpool_last_error (fast));
                return 1;
            }
            register_ms = (s_now () - start) * 1e3;
            kvpool_remove (fast, "gpu-check-first", true);
        }
        for (size_t k = 0; k < nsizes; k++)
            for (int line = 0; line < 2; line++) {
                size_t size = sizes[k];
                size_t parts = line ? layers : 0;
                if (line && (layers < 2 || size % layers || check.total % (layers * size)))
                    continue;
                double (*r)[2] = rates[k][line];
                s_kvpool_rates (&check, fast, size, false, parts, &r[staged ? STAGED : DIRECT][0],
                                &r[staged ? STAGED : DIRECT][1]);
                if (staged && tcp)
                    s_kvpool_rates (&check, tcp, size, false, parts, &r[TCP_STAGED][0],
                                    &r[TCP_STAGED][1]);
                if (staged)
                    continue;
                s_kvpool_rates (&check, fast, size, true, parts, &r[HOST][0], &r[HOST][1]);
                if (tcp) {
                    s_kvpool_rates (&check, tcp, size, false, parts, &r[TCP_DEVICE][0],
                                    &r[TCP_DEVICE][1]);
                    s_kvpool_rates (&check, tcp, size, true, parts, &r[TCP_HOST][0],
                                    &r[TCP_HOST][1]);
                }
            }
        kvpool_destroy (&fast);
        kvpool_destroy (&tcp);
    }
    unsetenv ("KVPOOL_DEVICE_DMA");

    printf ("the first device put registered the node's segment (%s) with the runtime: %.1f ms\n",
            segment_label, register_ms);
    printf ("%8s | %-17s | %-17s | %-41s | %-13s | %-41s | %s\n", "value", "cudaMemcpy D2H",
            "cudaMemcpy H2D", "kvpool same machine, device: put/get", "same, host",
            "kvpool tcp put/get", "direct/pinned");
    printf ("%8s | %8s %8s | %8s %8s | %13s %13s %13s | %13s | %13s %13s %13s | %s\n", "", "pinned",
            "pageable", "pinned", "pageable", "direct", "staged", "direct/staged", "", "device",
            "dev. staged", "host", "put get");
    for (size_t k = 0; k < nsizes; k++) {
        size_t size = sizes[k];
        double d2h_pinned = s_memcpy_rate (&check, size, 2, check.pinned);
        double d2h_pageable = s_memcpy_rate (&check, size, 2, check.pageable);
        double h2d_pinned = s_memcpy_rate (&check, size, 1, check.pinned);
        double h2d_pageable = s_memcpy_rate (&check, size, 1, check.pageable);
        for (int line = 0; line < 2; line++) {
            double (*r)[2] = rates[k][line];
            if (r[DIRECT][0] == 0)
                continue;
            if (line == 0)
                printf ("%4zu MiB | %8.1f %8.1f | %8.1f %8.1f |", size >> 20, d2h_pinned,
                        d2h_pageable, h2d_pinned, h2d_pageable);
            else {
                char label[96];
                snprintf (label, sizeof label, "  as %zu layers of %zu KiB", layers,
                          (size / layers) >> 10);
                printf ("%-47s |", label);
            }
            printf (" %6.1f %6.1f %6.1f %6.1f %6.2f %6.2f | %6.1f %6.1f |", r[DIRECT][0],
                    r[DIRECT][1], r[STAGED][0], r[STAGED][1], r[DIRECT][0] / r[STAGED][0],
                    r[DIRECT][1] / r[STAGED][1], r[HOST][0], r[HOST][1]);
            if (with_tcp)
                printf (" %6.1f %6.1f %6.1f %6.1f %6.1f %6.1f |", r[TCP_DEVICE][0],
                        r[TCP_DEVICE][1], r[TCP_STAGED][0], r[TCP_STAGED][1], r[TCP_HOST][0],
                        r[TCP_HOST][1]);
            else
                printf (" %41s |", "-");
            printf (" %5.2f %5.2f\n", r[DIRECT][0] / d2h_pinned, r[DIRECT][1] / h2d_pinned);
        }
        fflush (stdout);
    }
    printf ("every byte checked after every get: ok; cudaPointerGetAttributes %.2f us on host "
            "memory, %.2f us on device memory\n",
            s_query_us (check.pageable + 4096), s_query_us ((char *) check.source + 4096));
    R.free_ (check.source);
    R.free_ (check.target);
    R.free_host (check.pinned);
    free (check.pattern);
    free (check.pageable);
    return 0;
}
