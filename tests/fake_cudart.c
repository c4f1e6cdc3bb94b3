/*  fake_cudart.c - a stand-in CUDA runtime for the tests (build/lib/libfake_cudart.so).

    libkvpool loads it as it would load libcudart (KVPOOL_CUDART=path): the same symbols, with
    CUDA 13's cudaPointerAttributes, and the driver's cuPointerGetAttribute for allocation
    ranges. What it does:
      - "device memory" is what cudaMalloc hands out: a memfd mapped PROT_NONE at the address
        the caller gets (the CPU faults on it, as on a GPU, so a device buffer memcpy'd by
        mistake crashes the test) and mapped again read-write where the fake copies through;
      - "pinned memory" is what cudaHostAlloc / cudaMallocHost hand out (plain host memory,
        reported as cudaMemoryTypeHost), and host memory cudaHostRegister took (refused on
        demand; registering memory already registered fails as CUDA's does); anything else is
        unregistered host memory, and every async copy whose host side is such memory is
        counted (a direct DMA planned on memory never registered shows there);
      - cudaMemcpyBatchAsync queues its copies as cudaMemcpyAsync would (failing on demand);
      - copies on a stream run late: cudaMemcpyAsync only queues them, and they run when the
        caller waits (cudaEventSynchronize / cudaEventQuery up to the event's place in its
        stream, cudaStreamSynchronize, cudaStreamDestroy). A caller that reads a staging buffer
        before waiting, or rewrites one under a queued copy, gets wrong bytes;
      - a few devices (FAKE_CUDART_DEVICES, default 2), one current device per thread; events
        and streams belong to the device current when made, and cudaEventRecord of one
        device's event on another's stream fails, as CUDA's does.
    The test drives it through fake_cudart_* (dlsym on the same library): an operation log
    (queued copies, event records, waits), counters, and failures on demand.
*/
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__ ((visibility ("default")))

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    MEMORY_ALLOCATION = 2,
    INVALID_DEVICE = 101,
    INVALID_RESOURCE_HANDLE = 400,
    ILLEGAL_ADDRESS = 700,
    HOST_MEMORY_ALREADY_REGISTERED = 712,
    HOST_MEMORY_NOT_REGISTERED = 713,
    NOT_SUPPORTED = 801,
};

struct attributes {
    int type; //  0 unregistered, 1 host, 2 device, 3 managed
    int device;
    void *device_pointer;
    void *host_pointer;
    long reserved[8];
};

//  ---- allocations ----------------------------------------------------------------------------

typedef struct {
    uintptr_t base;
    size_t size;
    char *backing; //  read-write view of device memory; NULL for pinned memory
    int device;
    bool registered; //  cudaHostRegister's, not cudaHostAlloc's
} alloc_t;

#define MAX_ALLOCS 4096
static pthread_mutex_t s_mutex = PTHREAD_MUTEX_INITIALIZER;
static alloc_t s_allocs[MAX_ALLOCS];
static size_t s_nallocs;
static __thread int t_device;
static __thread int t_last_error;

static int
s_devices (void)
{
    const char *env = getenv ("FAKE_CUDART_DEVICES");
    int n = env ? atoi (env) : 2;
    return n > 0 ? n : 1;
}

static alloc_t *
s_find (uintptr_t at)
{
    for (size_t i = 0; i < s_nallocs; i++)
        if (at >= s_allocs[i].base && at < s_allocs[i].base + s_allocs[i].size)
            return &s_allocs[i];
    return NULL;
}

static int
s_error (int rc)
{
    if (rc)
        t_last_error = rc;
    return rc;
}

//  ---- test controls ------------------------------------------------------------------------

typedef struct {
    char op; //  'D' copy from device queued, 'H' copy to device queued, 'R' event recorded,
             //  'W' a wait (event or stream synchronize)
    size_t len;
} log_entry_t;

#define MAX_LOG 65536
static log_entry_t s_log[MAX_LOG];
static size_t s_nlog;
static long s_queries;         //  cudaPointerGetAttributes calls
static long s_fail_after = -1; //  copies that still succeed before every one fails
static int s_fail_error = ILLEGAL_ADDRESS;
static bool s_fail_alloc;        //  cudaHostAlloc fails
static bool s_no_ranges;         //  cuPointerGetAttribute knows no ranges
static int s_fail_queries;       //  cudaPointerGetAttributes fails with this error (0: never)
static long s_host_allocs;       //  cudaHostAlloc calls that succeeded
static int s_refuse_register;    //  cudaHostRegister fails with this error (0: never)
static int s_fail_batch;         //  cudaMemcpyBatchAsync fails with this error (0: never)
static long s_registers;         //  cudaHostRegister calls that succeeded
static long s_unregisters;       //  cudaHostUnregister calls that succeeded
static long s_registered_copies; //  async copies whose host side is registered memory
static long s_pageable_copies;   //  async copies whose host side is neither pinned nor registered
static long s_batches;           //  cudaMemcpyBatchAsync calls that queued their copies
static int s_fail_2d;            //  cudaMemcpy2DAsync fails with this error (0: never)
static long s_copies_2d;         //  cudaMemcpy2DAsync calls that queued their rows

static void
s_log_add (char op, size_t len)
{
    if (s_nlog < MAX_LOG)
        s_log[s_nlog++] = (log_entry_t){op, len};
}

EXPORT void
fake_cudart_reset (void)
{
    pthread_mutex_lock (&s_mutex);
    s_nlog = 0;
    s_queries = 0;
    s_fail_after = -1;
    s_fail_alloc = false;
    s_no_ranges = false;
    s_fail_queries = 0;
    s_refuse_register = 0;
    s_fail_batch = 0;
    s_registered_copies = 0;
    s_pageable_copies = 0;
    s_batches = 0;
    s_fail_2d = 0;
    s_copies_2d = 0;
    pthread_mutex_unlock (&s_mutex);
}

EXPORT void
fake_cudart_fail_2d (int error)
{
    s_fail_2d = error;
}

EXPORT void
fake_cudart_refuse_register (int error)
{
    s_refuse_register = error;
}

EXPORT void
fake_cudart_fail_batch (int error)
{
    s_fail_batch = error;
}

//  Counters: which == 'r' registrations, 'u' unregistrations, 'c' copies with a registered
//  host side, 'p' copies with a pageable host side, 'b' batches, '2' 2D copies; 'n'
//  registrations alive.
EXPORT long
fake_cudart_count (char which)
{
    pthread_mutex_lock (&s_mutex);
    long n = 0;
    switch (which) {
        case 'r': n = s_registers; break;
        case 'u': n = s_unregisters; break;
        case 'c': n = s_registered_copies; break;
        case 'p': n = s_pageable_copies; break;
        case 'b': n = s_batches; break;
        case '2': n = s_copies_2d; break;
        case 'n':
            for (size_t i = 0; i < s_nallocs; i++)
                n += s_allocs[i].registered;
            break;
    }
    pthread_mutex_unlock (&s_mutex);
    return n;
}

//  The log as a string of ops ("DDRDDRW..."), and entry i's length.
EXPORT size_t
fake_cudart_log (char *ops, size_t capacity)
{
    pthread_mutex_lock (&s_mutex);
    size_t n = s_nlog < capacity - 1 ? s_nlog : capacity - 1;
    for (size_t i = 0; i < n; i++)
        ops[i] = s_log[i].op;
    ops[n] = 0;
    size_t total = s_nlog;
    pthread_mutex_unlock (&s_mutex);
    return total;
}

EXPORT size_t
fake_cudart_log_len (size_t i)
{
    return i < s_nlog ? s_log[i].len : 0;
}

EXPORT long
fake_cudart_queries (void)
{
    return s_queries;
}

EXPORT long
fake_cudart_host_allocs (void)
{
    return s_host_allocs;
}

//  After n more successful copies, every copy fails with error (n < 0: none fails).
EXPORT void
fake_cudart_fail_copies (long n, int error)
{
    pthread_mutex_lock (&s_mutex);
    s_fail_after = n;
    s_fail_error = error;
    pthread_mutex_unlock (&s_mutex);
}

EXPORT void
fake_cudart_fail_host_alloc (bool on)
{
    s_fail_alloc = on;
}

EXPORT void
fake_cudart_fail_queries (int error)
{
    s_fail_queries = error;
}

EXPORT void
fake_cudart_no_ranges (bool on)
{
    s_no_ranges = on;
}

//  ---- device and pinned memory ---------------------------------------------------------------

EXPORT int
cudaMalloc (void **ptr, size_t size)
{
    size_t page = (size_t) sysconf (_SC_PAGESIZE);
    size_t rounded = (size ? size + page - 1 : page) / page * page;
    int fd = memfd_create ("fake-device", MFD_CLOEXEC);
    if (fd < 0 || ftruncate (fd, (off_t) rounded)) {
        if (fd >= 0)
            close (fd);
        return s_error (MEMORY_ALLOCATION);
    }
    void *device = mmap (NULL, rounded, PROT_NONE, MAP_SHARED, fd, 0);
    void *backing = mmap (NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close (fd);
    if (device == MAP_FAILED || backing == MAP_FAILED) {
        if (device != MAP_FAILED)
            munmap (device, rounded);
        if (backing != MAP_FAILED)
            munmap (backing, rounded);
        return s_error (MEMORY_ALLOCATION);
    }
    pthread_mutex_lock (&s_mutex);
    if (s_nallocs == MAX_ALLOCS) {
        pthread_mutex_unlock (&s_mutex);
        munmap (device, rounded);
        munmap (backing, rounded);
        return s_error (MEMORY_ALLOCATION);
    }
    s_allocs[s_nallocs++] =
        (alloc_t){(uintptr_t) device, size ? size : 1, backing, t_device, false};
    pthread_mutex_unlock (&s_mutex);
    *ptr = device;
    return SUCCESS;
}

static int
s_free (void *ptr, bool device)
{
    pthread_mutex_lock (&s_mutex);
    alloc_t *alloc = s_find ((uintptr_t) ptr);
    if (!alloc || alloc->base != (uintptr_t) ptr || (alloc->backing != NULL) != device
        || alloc->registered) {
        pthread_mutex_unlock (&s_mutex);
        return s_error (INVALID_VALUE);
    }
    alloc_t gone = *alloc;
    *alloc = s_allocs[--s_nallocs];
    pthread_mutex_unlock (&s_mutex);
    if (device) {
        size_t page = (size_t) sysconf (_SC_PAGESIZE);
        size_t rounded = (gone.size + page - 1) / page * page;
        munmap ((void *) gone.base, rounded);
        munmap (gone.backing, rounded);
    }
    else
        free ((void *) gone.base);
    return SUCCESS;
}

EXPORT int
cudaFree (void *ptr)
{
    return ptr ? s_free (ptr, true) : SUCCESS;
}

EXPORT int
cudaHostAlloc (void **ptr, size_t size, unsigned int flags)
{
    (void) flags;
    if (s_fail_alloc)
        return s_error (MEMORY_ALLOCATION);
    void *memory = NULL;
    if (posix_memalign (&memory, 4096, size ? size : 1))
        return s_error (MEMORY_ALLOCATION);
    pthread_mutex_lock (&s_mutex);
    if (s_nallocs == MAX_ALLOCS) {
        pthread_mutex_unlock (&s_mutex);
        free (memory);
        return s_error (MEMORY_ALLOCATION);
    }
    s_allocs[s_nallocs++] = (alloc_t){(uintptr_t) memory, size ? size : 1, NULL, t_device, false};
    s_host_allocs++;
    pthread_mutex_unlock (&s_mutex);
    *ptr = memory;
    return SUCCESS;
}

EXPORT int
cudaMallocHost (void **ptr, size_t size)
{
    return cudaHostAlloc (ptr, size, 0);
}

EXPORT int
cudaFreeHost (void *ptr)
{
    return ptr ? s_free (ptr, false) : SUCCESS;
}

//  Registration pins nothing here: the range is only remembered as host memory the
//  runtime knows.
EXPORT int
cudaHostRegister (void *ptr, size_t size, unsigned int flags)
{
    (void) flags;
    if (!ptr || !size)
        return s_error (INVALID_VALUE);
    pthread_mutex_lock (&s_mutex);
    if (s_refuse_register) {
        int error = s_refuse_register;
        pthread_mutex_unlock (&s_mutex);
        return s_error (error);
    }
    uintptr_t at = (uintptr_t) ptr;
    for (size_t i = 0; i < s_nallocs; i++)
        if (at < s_allocs[i].base + s_allocs[i].size && s_allocs[i].base < at + size) {
            pthread_mutex_unlock (&s_mutex);
            return s_error (HOST_MEMORY_ALREADY_REGISTERED);
        }
    if (s_nallocs == MAX_ALLOCS) {
        pthread_mutex_unlock (&s_mutex);
        return s_error (MEMORY_ALLOCATION);
    }
    s_allocs[s_nallocs++] = (alloc_t){at, size, NULL, t_device, true};
    s_registers++;
    pthread_mutex_unlock (&s_mutex);
    return SUCCESS;
}

EXPORT int
cudaHostUnregister (void *ptr)
{
    pthread_mutex_lock (&s_mutex);
    alloc_t *alloc = s_find ((uintptr_t) ptr);
    if (!alloc || !alloc->registered || alloc->base != (uintptr_t) ptr) {
        pthread_mutex_unlock (&s_mutex);
        return s_error (HOST_MEMORY_NOT_REGISTERED);
    }
    *alloc = s_allocs[--s_nallocs];
    s_unregisters++;
    pthread_mutex_unlock (&s_mutex);
    return SUCCESS;
}

EXPORT int
cudaPointerGetAttributes (struct attributes *attributes, const void *ptr)
{
    pthread_mutex_lock (&s_mutex);
    s_queries++;
    if (s_fail_queries) {
        pthread_mutex_unlock (&s_mutex);
        return s_error (s_fail_queries);
    }
    alloc_t *alloc = s_find ((uintptr_t) ptr);
    memset (attributes, 0, sizeof *attributes);
    if (alloc) {
        attributes->type = alloc->backing ? 2 : 1;
        attributes->device = alloc->device;
        attributes->device_pointer = (void *) ptr;
        attributes->host_pointer = alloc->backing ? NULL : (void *) ptr;
    }
    else
        attributes->host_pointer = (void *) ptr;
    pthread_mutex_unlock (&s_mutex);
    return SUCCESS;
}

//  The driver's: where an allocation starts (11) and its size (12).
EXPORT int
cuPointerGetAttribute (void *data, int attribute, unsigned long long ptr)
{
    pthread_mutex_lock (&s_mutex);
    alloc_t *alloc = s_no_ranges ? NULL : s_find ((uintptr_t) ptr);
    int rc = 1; //  CUDA_ERROR_INVALID_VALUE
    if (alloc && attribute == 11) {
        *(unsigned long long *) data = alloc->base;
        rc = 0;
    }
    else if (alloc && attribute == 12) {
        *(size_t *) data = alloc->size;
        rc = 0;
    }
    pthread_mutex_unlock (&s_mutex);
    return rc;
}

//  ---- devices, errors --------------------------------------------------------------------------

EXPORT int
cudaGetDeviceCount (int *count)
{
    *count = s_devices ();
    return SUCCESS;
}

EXPORT int
cudaGetDevice (int *device)
{
    *device = t_device;
    return SUCCESS;
}

EXPORT int
cudaSetDevice (int device)
{
    if (device < 0 || device >= s_devices ())
        return s_error (INVALID_DEVICE);
    t_device = device;
    return SUCCESS;
}

EXPORT int
cudaGetLastError (void)
{
    int rc = t_last_error;
    t_last_error = 0;
    return rc;
}

EXPORT int
cudaPeekAtLastError (void)
{
    return t_last_error;
}

EXPORT const char *
cudaGetErrorString (int error)
{
    switch (error) {
        case SUCCESS: return "no error";
        case INVALID_VALUE: return "invalid argument";
        case MEMORY_ALLOCATION: return "out of memory";
        case INVALID_DEVICE: return "invalid device ordinal";
        case INVALID_RESOURCE_HANDLE: return "invalid resource handle";
        case ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
        case 100: return "no CUDA-capable device is detected";
        default: return "unknown error";
    }
}

EXPORT int
cudaRuntimeGetVersion (int *version)
{
    *version = 13000;
    return SUCCESS;
}

EXPORT int
cudaDriverGetVersion (int *version)
{
    *version = 13000;
    return SUCCESS;
}

//  ---- streams, events, copies ----------------------------------------------------------------

typedef struct {
    void *dst; //  resolved: host addresses or backing views
    const void *src;
    size_t len;
} copy_t;

typedef struct {
    int device;
    copy_t *queue;
    size_t queued; //  copies queued so far
    size_t done;   //  of which run
    size_t capacity;
} stream_t;

typedef struct {
    int device;
    stream_t *stream; //  where it was last recorded (NULL: never)
    size_t mark;      //  queued copies at that time
} event_t;

//  Where the bytes of [ptr, ptr + len) are for the fake's memcpy: a device range's backing
//  view, or ptr itself. NULL when the range runs off a device allocation.
static void *
s_resolve (const void *ptr, size_t len, bool *device)
{
    alloc_t *alloc = s_find ((uintptr_t) ptr);
    *device = alloc && alloc->backing;
    if (!*device)
        return (void *) ptr;
    size_t offset = (uintptr_t) ptr - alloc->base;
    if (len > alloc->size - offset)
        return NULL;
    return alloc->backing + offset;
}

static void
s_run (stream_t *stream, size_t upto)
{
    for (; stream->done < upto; stream->done++) {
        copy_t *copy = &stream->queue[stream->done];
        memcpy (copy->dst, copy->src, copy->len);
    }
}

EXPORT int
cudaStreamCreate (stream_t **stream)
{
    stream_t *made = calloc (1, sizeof *made);
    if (!made)
        return s_error (MEMORY_ALLOCATION);
    made->device = t_device;
    *stream = made;
    return SUCCESS;
}

EXPORT int
cudaStreamCreateWithFlags (stream_t **stream, unsigned int flags)
{
    (void) flags;
    return cudaStreamCreate (stream);
}

EXPORT int
cudaStreamSynchronize (stream_t *stream)
{
    pthread_mutex_lock (&s_mutex);
    s_log_add ('W', 0);
    if (stream)
        s_run (stream, stream->queued);
    pthread_mutex_unlock (&s_mutex);
    return SUCCESS;
}

EXPORT int
cudaStreamDestroy (stream_t *stream)
{
    if (!stream)
        return s_error (INVALID_RESOURCE_HANDLE);
    pthread_mutex_lock (&s_mutex);
    s_run (stream, stream->queued);
    pthread_mutex_unlock (&s_mutex);
    free (stream->queue);
    free (stream);
    return SUCCESS;
}

static int
s_copy (void *dst, const void *src, size_t count, stream_t *stream, bool sync)
{
    pthread_mutex_lock (&s_mutex);
    if (s_fail_after == 0) {
        pthread_mutex_unlock (&s_mutex);
        return s_error (s_fail_error);
    }
    if (s_fail_after > 0)
        s_fail_after--;
    bool dst_device, src_device;
    void *to = s_resolve (dst, count, &dst_device);
    const void *from = s_resolve (src, count, &src_device);
    if (!to || !from) {
        pthread_mutex_unlock (&s_mutex);
        return s_error (INVALID_VALUE);
    }
    if (!sync) {
        s_log_add (dst_device ? 'H' : 'D', count);
        alloc_t *host = s_find ((uintptr_t) (dst_device ? src : dst));
        if (host && host->registered)
            s_registered_copies++;
        else if (!host)
            s_pageable_copies++;
    }
    if (sync || !stream) {
        memcpy (to, from, count);
        pthread_mutex_unlock (&s_mutex);
        return SUCCESS;
    }
    if (stream->queued == stream->capacity) {
        size_t capacity = stream->capacity ? stream->capacity * 2 : 64;
        copy_t *queue = realloc (stream->queue, capacity * sizeof *queue);
        if (!queue) {
            pthread_mutex_unlock (&s_mutex);
            return s_error (MEMORY_ALLOCATION);
        }
        stream->queue = queue;
        stream->capacity = capacity;
    }
    stream->queue[stream->queued++] = (copy_t){to, from, count};
    pthread_mutex_unlock (&s_mutex);
    return SUCCESS;
}

EXPORT int
cudaMemcpyAsync (void *dst, const void *src, size_t count, int kind, stream_t *stream)
{
    (void) kind; //  every kind is taken as cudaMemcpyDefault: the addresses say
    return s_copy (dst, src, count, stream, false);
}

//  CUDA 13's: every copy with attributes, srcAccessOrder set, on a stream of its own.
typedef struct {
    int src_access_order;
    int src_type, src_id, dst_type, dst_id;
    unsigned int flags;
} memcpy_attributes_t;

EXPORT int
cudaMemcpyBatchAsync (const void **dsts, const void **srcs, const size_t *sizes, size_t count,
                      memcpy_attributes_t *attrs, size_t *attrs_idxs, size_t num_attrs,
                      stream_t *stream)
{
    if (s_fail_batch)
        return s_error (s_fail_batch);
    if (!dsts || !srcs || !sizes || !count || !attrs || !attrs_idxs || num_attrs == 0
        || num_attrs > count || attrs_idxs[0] != 0 || !stream)
        return s_error (INVALID_VALUE);
    for (size_t i = 0; i < num_attrs; i++)
        if (attrs[i].src_access_order < 1 || attrs[i].src_access_order > 3)
            return s_error (INVALID_VALUE);
    for (size_t i = 0; i < count; i++) {
        int rc = s_copy ((void *) dsts[i], srcs[i], sizes[i], stream, false);
        if (rc)
            return rc;
    }
    pthread_mutex_lock (&s_mutex);
    s_batches++;
    pthread_mutex_unlock (&s_mutex);
    return SUCCESS;
}

//  Each row is queued (and logged) as one copy.
EXPORT int
cudaMemcpy2DAsync (void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, int kind, stream_t *stream)
{
    (void) kind;
    if (s_fail_2d)
        return s_error (s_fail_2d);
    if (dpitch < width || spitch < width || dpitch > 0x7fffffff || spitch > 0x7fffffff || !stream)
        return s_error (INVALID_VALUE);
    for (size_t r = 0; r < height; r++) {
        int rc = s_copy ((char *) dst + r * dpitch, (const char *) src + r * spitch, width, stream,
                         false);
        if (rc)
            return rc;
    }
    pthread_mutex_lock (&s_mutex);
    s_copies_2d++;
    pthread_mutex_unlock (&s_mutex);
    return SUCCESS;
}

//  For the test's own use: copies at once, never fails, not logged.
EXPORT int
cudaMemcpy (void *dst, const void *src, size_t count, int kind)
{
    (void) kind;
    bool dst_device, src_device;
    pthread_mutex_lock (&s_mutex);
    void *to = s_resolve (dst, count, &dst_device);
    const void *from = s_resolve (src, count, &src_device);
    if (to && from)
        memcpy (to, from, count);
    pthread_mutex_unlock (&s_mutex);
    return to && from ? SUCCESS : s_error (INVALID_VALUE);
}

EXPORT int
cudaMemset (void *dst, int value, size_t count)
{
    bool device;
    pthread_mutex_lock (&s_mutex);
    void *to = s_resolve (dst, count, &device);
    if (to)
        memset (to, value, count);
    pthread_mutex_unlock (&s_mutex);
    return to ? SUCCESS : s_error (INVALID_VALUE);
}

EXPORT int
cudaDeviceSynchronize (void)
{
    return SUCCESS;
}

EXPORT int
cudaEventCreateWithFlags (event_t **event, unsigned int flags)
{
    (void) flags;
    event_t *made = calloc (1, sizeof *made);
    if (!made)
        return s_error (MEMORY_ALLOCATION);
    made->device = t_device;
    *event = made;
    return SUCCESS;
}

EXPORT int
cudaEventCreate (event_t **event)
{
    return cudaEventCreateWithFlags (event, 0);
}

EXPORT int
cudaEventRecord (event_t *event, stream_t *stream)
{
    if (!event || !stream || event->device != stream->device)
        return s_error (INVALID_RESOURCE_HANDLE);
    pthread_mutex_lock (&s_mutex);
    s_log_add ('R', 0);
    event->stream = stream;
    event->mark = stream->queued;
    pthread_mutex_unlock (&s_mutex);
    return SUCCESS;
}

EXPORT int
cudaEventSynchronize (event_t *event)
{
    if (!event)
        return s_error (INVALID_RESOURCE_HANDLE);
    pthread_mutex_lock (&s_mutex);
    s_log_add ('W', 0);
    if (event->stream)
        s_run (event->stream, event->mark);
    pthread_mutex_unlock (&s_mutex);
    return SUCCESS;
}

EXPORT int
cudaEventQuery (event_t *event)
{
    return cudaEventSynchronize (event);
}

EXPORT int
cudaEventDestroy (event_t *event)
{
    free (event);
    return SUCCESS;
}
