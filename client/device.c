/*  device.c - caller buffers in GPU memory: classification and pinned staging (device.h).

    The CUDA runtime comes from the process context (process.h), which finds and loads it
    (cuda_runtime.c); each device object holds a reference to the context, so the runtime it
    was given outlives it.

    Staged copies go on one stream per device and connection, direct ones on
    KVPC_DMA_STREAMS more; all are made with cudaStreamCreate: a blocking
    stream, ordered after the legacy default stream, as a cudaMemcpy would be, so work the
    application queued there before the call (PyTorch's default stream) is done before its
    bytes are read. Pinned buffers are cudaHostAlloc'ed portable (usable from every device).
    A failed runtime call leaves the thread's last error as it found it (cudaGetLastError), so
    the application's next check does not see kvpool's failure.
*/
#include "client/device.h"
#include "client/process.h"

//  cudaErrorHostMemoryAlreadyRegistered
#define S_ERROR_ALREADY_REGISTERED 712

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

//  ---- the object ---------------------------------------------------------------------------

typedef struct {
    uintptr_t start;
    uintptr_t end;
    int device;
} s_range_t;

//  A device's stream and events, made on its first copy.
typedef struct {
    bool made;
    kvpc_cuda_stream_t stream;
    kvpc_cuda_event_t stage_events[KVPC_STAGE_BUFFERS];
    kvpc_cuda_event_t frame_events[2];
    kvpc_cuda_stream_t dma[KVPC_DMA_STREAMS]; //  direct copies
} s_gpu_t;

//  One direct copy, a run of them adjacent on both sides, or rows of them: height copies of
//  len bytes, the next one dpitch and spitch further on (one cudaMemcpy2DAsync).
typedef struct {
    char *dst;
    const char *src;
    size_t len;
    int device;
    bool to_device;
    int stream; //  which of the device's dma streams it goes on
    size_t height;
    size_t dpitch;
    size_t spitch;
} s_run_t;

//  One piece of a copy planned into a staging buffer.
typedef struct {
    void *host;   //  the host side: a put's destination, a get's source
    char *device; //  the device side
    size_t len;
} s_piece_t;

//  A staging buffer's state: the pieces planned into it and, once laid out, their host copies
//  (a put's: out of it once its event is done; a get's: into it before its DMAs are queued).
typedef struct {
    bool busy; //  sealed: its DMAs were queued and its event recorded
    size_t fill;
    s_piece_t *pieces;
    kvpc_device_copy_t *copies;
    size_t count;
    size_t capacity;
} s_stage_t;

//  Pinned host ranges one call may remember (they are asked again in the next call).
#define S_PINNED_RANGES 16
//  Registered segments one call may remember (likewise).
#define S_DMA_RANGES 8
//  Received frames one call may register for the length of its copies, and the least bytes
//  a copy out of one must have for that: below it a staging copy costs less than pinning.
#define S_RECEIVED_RANGES 64
#define S_RECEIVED_MIN (256u << 10)

struct _kvpc_device_t {
    kvpc_process_t *process; //  a reference: the runtime is the context's
    kvpc_cuda_t *cuda;       //  the context's finder of the runtime
    const kvpc_cudart_t *rt; //  NULL until a call found one
    s_range_t cache[KVPC_DEVICE_RANGES];
    size_t cached;
    size_t victim;   //  the entry a full cache replaces next
    size_t last;     //  the entry that answered last
    s_range_t *call; //  this call's device buffers (sorted and merged once armed)
    size_t ncall;
    size_t call_capacity;
    s_range_t pinned[S_PINNED_RANGES]; //  this call's pinned host ranges
    size_t npinned;
    s_range_t targets[S_DMA_RANGES]; //  this call's registered segments (process.h)
    size_t ntargets;
    s_range_t frames[S_RECEIVED_RANGES]; //  received frames registered for this call's copies
    size_t nframes;
    bool frames_off; //  the runtime refused a frame: they are staged from then on
    s_run_t *runs;   //  a call's direct copies
    size_t runs_capacity;
    kvpc_device_copy_t *staged; //  and those that go through the staging buffers
    size_t staged_capacity;
    const void **batch_dst; //  one stream's batch
    const void **batch_src;
    size_t *batch_len;
    bool batch_off; //  the runtime refused a batch: copies are queued one by one
    bool rows_off;  //  the runtime refused a 2D copy: rows are queued one by one
    bool armed;
    void *stage[KVPC_STAGE_BUFFERS];
    s_stage_t slots[KVPC_STAGE_BUFFERS];
    void *frame[2];
    size_t frame_size[2];
    uint64_t frame_pending[2]; //  devices with copies into the slot since its last seal
    uint64_t frame_sealed[2];  //  devices whose slot event was recorded since the last wait
    s_gpu_t *gpus;             //  KVPC_MAX_DEVICES, made on first need
    char error[256];
};

kvpc_device_t *
kvpc_device_new (void)
{
    kvpc_device_t *self = calloc (1, sizeof (kvpc_device_t));
    if (!self)
        return NULL;
    self->process = kvpc_process_acquire ();
    if (!self->process) {
        free (self);
        return NULL;
    }
    self->cuda = kvpc_process_cuda (self->process);
    return self;
}

const char *
kvpc_device_runtime (void)
{
    return kvpc_process_cuda_path ();
}

//  Makes the runtime's last-error state what it was before a call of ours failed.
static void
s_clear (const kvpc_cudart_t *rt)
{
    rt->get_last_error ();
}

static int s_fail (kvpc_device_t *self, kvpc_cuda_error_t rc, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));

static int
s_fail (kvpc_device_t *self, kvpc_cuda_error_t rc, const char *format, ...)
{
    char what[160];
    va_list args;
    va_start (args, format);
    vsnprintf (what, sizeof what, format, args);
    va_end (args);
    const char *text = self->rt->get_error_string (rc);
    snprintf (self->error, sizeof self->error, "device memory: %s failed: %s (CUDA error %d)", what,
              text ? text : "unknown error", rc);
    s_clear (self->rt);
    return -1;
}

static int s_error (kvpc_device_t *self, const char *format, ...)
    __attribute__ ((format (printf, 2, 3)));

static int
s_error (kvpc_device_t *self, const char *format, ...)
{
    char what[200];
    va_list args;
    va_start (args, format);
    vsnprintf (what, sizeof what, format, args);
    va_end (args);
    snprintf (self->error, sizeof self->error, "device memory: %s", what);
    return -1;
}

void
kvpc_device_destroy (kvpc_device_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpc_device_t *self = *self_p;
    const kvpc_cudart_t *rt = self->rt;
    if (rt) {
        //  Errors are of no use here (at exit the runtime may already be gone).
        for (int d = 0; self->gpus && d < KVPC_MAX_DEVICES; d++) {
            s_gpu_t *gpu = &self->gpus[d];
            if (!gpu->made)
                continue;
            rt->stream_synchronize (gpu->stream);
            for (int i = 0; i < KVPC_STAGE_BUFFERS; i++)
                rt->event_destroy (gpu->stage_events[i]);
            for (int i = 0; i < 2; i++)
                rt->event_destroy (gpu->frame_events[i]);
            rt->stream_destroy (gpu->stream);
            for (int i = 0; i < KVPC_DMA_STREAMS; i++) {
                rt->stream_synchronize (gpu->dma[i]);
                rt->stream_destroy (gpu->dma[i]);
            }
        }
        for (int i = 0; i < KVPC_STAGE_BUFFERS; i++)
            if (self->stage[i])
                rt->free_host (self->stage[i]);
        for (int i = 0; i < 2; i++)
            if (self->frame[i])
                rt->free_host (self->frame[i]);
        s_clear (rt);
    }
    for (int i = 0; i < KVPC_STAGE_BUFFERS; i++) {
        free (self->slots[i].pieces);
        free (self->slots[i].copies);
    }
    free (self->gpus);
    free (self->call);
    free (self->runs);
    free (self->staged);
    free (self->batch_dst);
    free (self->batch_src);
    free (self->batch_len);
    kvpc_process_release (&self->process);
    free (self);
    *self_p = NULL;
}

const char *
kvpc_device_error (const kvpc_device_t *self)
{
    return self ? self->error : "";
}

//  ---- classification -----------------------------------------------------------------------

bool
kvpc_device_begin (kvpc_device_t *self)
{
    self->ncall = 0;
    self->npinned = 0;
    self->ntargets = 0;
    self->armed = false;
    if (!self->rt)
        self->rt = kvpc_cuda_get (self->cuda);
    else if (kvpc_cuda_dead (self->cuda))
        self->rt = NULL;
    return self->rt != NULL;
}

//  The cached device allocation that holds [start, end), or NULL.
static const s_range_t *
s_cache_find (kvpc_device_t *self, uintptr_t start, uintptr_t end)
{
    if (self->cached == 0)
        return NULL;
    const s_range_t *last = &self->cache[self->last];
    if (start >= last->start && end <= last->end)
        return last;
    for (size_t i = 0; i < self->cached; i++)
        if (start >= self->cache[i].start && end <= self->cache[i].end) {
            self->last = i;
            return &self->cache[i];
        }
    return NULL;
}

static void
s_cache_add (kvpc_device_t *self, const s_range_t *range)
{
    size_t slot = self->cached < KVPC_DEVICE_RANGES ? self->cached++ : self->victim++;
    self->victim %= KVPC_DEVICE_RANGES;
    self->cache[slot] = *range;
    self->last = slot;
}

//  Adds a device range to the call's (once for a run of buffers in the same one).
static int
s_call_add (kvpc_device_t *self, const s_range_t *range)
{
    if (self->ncall && self->call[self->ncall - 1].start == range->start
        && self->call[self->ncall - 1].end == range->end)
        return 0;
    if (self->ncall == self->call_capacity) {
        size_t capacity = self->call_capacity ? self->call_capacity * 2 : 16;
        s_range_t *call = realloc (self->call, capacity * sizeof *call);
        if (!call)
            return -1;
        self->call = call;
        self->call_capacity = capacity;
    }
    self->call[self->ncall++] = *range;
    return 0;
}

//  Widens [start, end) to the whole allocation holding it, when the driver says which.
static void
s_widen (kvpc_device_t *self, s_range_t *range)
{
    kvpc_cuda_range_fn *query = kvpc_cuda_range_query (self->cuda);
    if (!query)
        return;
    unsigned long long base = 0;
    size_t size = 0;
    if (query (&base, KVPC_CUDA_RANGE_START_ADDR, range->start) != 0
        || query (&size, KVPC_CUDA_RANGE_SIZE, range->start) != 0)
        return; //  a driver error leaves no last-error state in the runtime
    if (base <= range->start && size > 0 && range->end - base <= size) {
        range->start = (uintptr_t) base;
        range->end = (uintptr_t) base + size;
    }
}

static bool
s_dead_runtime_error (kvpc_cuda_error_t rc)
{
    return rc == KVPC_CUDA_ERROR_INITIALIZATION || rc == KVPC_CUDA_ERROR_UNLOADING
           || rc == KVPC_CUDA_ERROR_STUB_LIBRARY || rc == KVPC_CUDA_ERROR_INSUFFICIENT_DRIVER
           || rc == KVPC_CUDA_ERROR_NEWER_DRIVER || rc == KVPC_CUDA_ERROR_DEVICES_UNAVAILABLE
           || rc == KVPC_CUDA_ERROR_NO_DEVICE;
}

int
kvpc_device_classify (kvpc_device_t *self, const void *ptr, size_t len)
{
    if (!self->rt || !ptr || len == 0)
        return 0;
    uintptr_t start = (uintptr_t) ptr;
    uintptr_t end = start + len < start ? UINTPTR_MAX : start + len;
    const s_range_t *hit = s_cache_find (self, start, end);
    if (hit) {
        if (s_call_add (self, hit))
            return s_error (self, "out of memory");
        return 1;
    }
    for (size_t i = 0; i < self->npinned; i++)
        if (start >= self->pinned[i].start && end <= self->pinned[i].end)
            return 0;
    const kvpc_cudart_t *rt = self->rt;
    kvpc_cuda_attributes_t attributes;
    memset (&attributes, 0, sizeof attributes);
    kvpc_cuda_error_t rc = rt->pointer_get_attributes (&attributes, ptr);
    if (rc != 0) {
        if (s_dead_runtime_error (rc)) {
            //  No working CUDA in this process: no buffer of it is device memory.
            s_clear (rt);
            kvpc_cuda_mark_dead (self->cuda);
            self->rt = NULL;
            return 0;
        }
        return s_fail (self, rc, "cudaPointerGetAttributes (%p)", ptr);
    }
    s_range_t range = {start, end, attributes.device};
    if (attributes.type == KVPC_CUDA_MEMORY_DEVICE) {
        s_widen (self, &range);
        s_cache_add (self, &range);
        if (s_call_add (self, &range))
            return s_error (self, "out of memory");
        return 1;
    }
    if (attributes.type == KVPC_CUDA_MEMORY_HOST) {
        //  Pinned host memory (a registered pool, say): remembered for the rest of the call,
        //  whose buffers the application cannot free under it.
        s_widen (self, &range);
        self->pinned[self->npinned < S_PINNED_RANGES ? self->npinned++ : S_PINNED_RANGES - 1] =
            range;
    }
    return 0;
}

static int
s_range_compare (const void *a, const void *b)
{
    const s_range_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

bool
kvpc_device_arm (kvpc_device_t *self)
{
    if (self->ncall > 1) {
        qsort (self->call, self->ncall, sizeof *self->call, s_range_compare);
        size_t kept = 0;
        for (size_t i = 1; i < self->ncall; i++) {
            s_range_t *last = &self->call[kept];
            if (self->call[i].start <= last->end && self->call[i].device == last->device) {
                if (self->call[i].end > last->end)
                    last->end = self->call[i].end;
            }
            else
                self->call[++kept] = self->call[i];
        }
        self->ncall = kept + 1;
    }
    self->armed = self->ncall > 0;
    return self->armed;
}

void
kvpc_device_end (kvpc_device_t *self)
{
    if (!self)
        return;
    self->armed = false;
    self->ncall = 0;
    self->npinned = 0;
}

bool
kvpc_device_armed (const kvpc_device_t *self)
{
    return self && self->armed;
}

bool
kvpc_device_holds (const kvpc_device_t *self, const void *ptr, int *device)
{
    if (!self || !self->armed)
        return false;
    uintptr_t at = (uintptr_t) ptr;
    size_t low = 0, high = self->ncall; //  the last range starting at or before ptr
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        if (self->call[mid].start <= at)
            low = mid + 1;
        else
            high = mid;
    }
    if (low == 0 || at >= self->call[low - 1].end)
        return false;
    if (device)
        *device = self->call[low - 1].device;
    return true;
}

bool
kvpc_device_plan (const kvpc_device_t *self, void *dst, const void *src, size_t len,
                  kvpc_device_copy_t *item)
{
    int device;
    //  The other side of a copy is always the library's (a segment, a frame): host memory.
    if (kvpc_device_holds (self, dst, &device))
        *item = (kvpc_device_copy_t){dst, src, len, device, true};
    else if (kvpc_device_holds (self, src, &device))
        *item = (kvpc_device_copy_t){dst, src, len, device, false};
    else
        return false;
    return true;
}

//  ---- streams, events and pinned buffers ---------------------------------------------------

//  The stream and events of device, made on first need. Streams and events belong to the
//  device current when they are made: the thread is moved to device for that, then back.
static s_gpu_t *
s_gpu (kvpc_device_t *self, int device)
{
    if (device < 0 || device >= KVPC_MAX_DEVICES) {
        s_error (self, "device %d is not one of 0 to %d that kvpool stages for", device,
                 KVPC_MAX_DEVICES - 1);
        return NULL;
    }
    if (!self->gpus && !(self->gpus = calloc (KVPC_MAX_DEVICES, sizeof *self->gpus))) {
        s_error (self, "out of memory");
        return NULL;
    }
    s_gpu_t *gpu = &self->gpus[device];
    if (gpu->made)
        return gpu;
    const kvpc_cudart_t *rt = self->rt;
    int previous = -1;
    if (rt->get_device (&previous) != 0) {
        s_clear (rt);
        previous = -1;
    }
    kvpc_cuda_error_t rc = previous == device ? 0 : rt->set_device (device);
    if (rc != 0) {
        s_fail (self, rc, "cudaSetDevice (%d)", device);
        return NULL;
    }
    int made_events = 0, made_streams = 0;
    kvpc_cuda_event_t events[KVPC_STAGE_BUFFERS + 2];
    kvpc_cuda_stream_t streams[1 + KVPC_DMA_STREAMS];
    for (; made_streams < 1 + KVPC_DMA_STREAMS; made_streams++)
        if ((rc = rt->stream_create (&streams[made_streams])) != 0)
            break;
    if (rc == 0)
        for (; made_events < KVPC_STAGE_BUFFERS + 2; made_events++)
            if ((rc = rt->event_create (&events[made_events], KVPC_CUDA_EVENT_DISABLE_TIMING)) != 0)
                break;
    if (rc != 0) {
        s_fail (self, rc, "making streams and events on device %d", device);
        for (int i = 0; i < made_events; i++)
            rt->event_destroy (events[i]);
        for (int i = 0; i < made_streams; i++)
            rt->stream_destroy (streams[i]);
        s_clear (rt);
    }
    if (previous >= 0 && previous != device && rt->set_device (previous) != 0)
        s_clear (rt);
    if (rc != 0)
        return NULL;
    gpu->stream = streams[0];
    memcpy (gpu->dma, streams + 1, sizeof gpu->dma);
    memcpy (gpu->stage_events, events, sizeof gpu->stage_events);
    memcpy (gpu->frame_events, events + KVPC_STAGE_BUFFERS, sizeof gpu->frame_events);
    gpu->made = true;
    return gpu;
}

static int
s_pinned_alloc (kvpc_device_t *self, void **buffer, size_t size, const char *what)
{
    *buffer = NULL;
    kvpc_cuda_error_t rc = self->rt->host_alloc (buffer, size, KVPC_CUDA_HOST_ALLOC_PORTABLE);
    if (rc != 0) {
        *buffer = NULL;
        return s_fail (self, rc, "cudaHostAlloc of %zu MiB of pinned memory for %s",
                       (size + (1u << 20) - 1) >> 20, what);
    }
    return 0;
}

//  The staging buffers, allocated on the first device copy.
static int
s_stage_ready (kvpc_device_t *self)
{
    for (int i = 0; i < KVPC_STAGE_BUFFERS; i++)
        if (!self->stage[i] && s_pinned_alloc (self, &self->stage[i], KVPC_STAGE_BYTES, "staging"))
            return -1;
    return 0;
}

//  ---- staged copies ------------------------------------------------------------------------
//  Pieces are planned into a buffer until it is full; then it is laid out in the order of
//  their device addresses, so that pieces adjacent in device memory (a KV cache's blocks of
//  one layer, say) are adjacent in the buffer too and move in one DMA: a DMA costs a few
//  microseconds however small it is.

static int
s_piece_add (s_stage_t *stage, void *host, const void *device, size_t len)
{
    if (stage->count == stage->capacity) {
        size_t capacity = stage->capacity ? stage->capacity * 2 : 64;
        s_piece_t *pieces = realloc (stage->pieces, capacity * sizeof *pieces);
        if (pieces)
            stage->pieces = pieces;
        kvpc_device_copy_t *copies = realloc (stage->copies, capacity * sizeof *copies);
        if (copies)
            stage->copies = copies;
        if (!pieces || !copies)
            return -1;
        stage->capacity = capacity;
    }
    stage->pieces[stage->count++] = (s_piece_t){host, (char *) device, len};
    return 0;
}

static void
s_stage_reset (kvpc_device_t *self)
{
    for (int i = 0; i < KVPC_STAGE_BUFFERS; i++) {
        self->slots[i].busy = false;
        self->slots[i].fill = 0;
        self->slots[i].count = 0;
    }
}

static int
s_piece_compare (const void *a, const void *b)
{
    const s_piece_t *x = a, *y = b;
    return x->device < y->device ? -1 : x->device > y->device;
}

//  Lays buffer index out in device-address order and lists its host copies.
static void
s_layout (kvpc_device_t *self, int index, bool put)
{
    s_stage_t *stage = &self->slots[index];
    if (stage->count > 1)
        qsort (stage->pieces, stage->count, sizeof *stage->pieces, s_piece_compare);
    char *staged = self->stage[index];
    for (size_t i = 0; i < stage->count; i++) {
        s_piece_t *piece = &stage->pieces[i];
        stage->copies[i] = put ? (kvpc_device_copy_t){piece->host, staged, piece->len, 0, false}
                               : (kvpc_device_copy_t){staged, piece->host, piece->len, 0, false};
        staged += piece->len;
    }
}

//  Queues buffer index's DMAs, one for each run of pieces adjacent in device memory.
static int
s_dma (kvpc_device_t *self, s_gpu_t *gpu, int index, bool put, int device)
{
    s_stage_t *stage = &self->slots[index];
    char *staged = self->stage[index];
    for (size_t k = 0; k < stage->count;) {
        char *start = stage->pieces[k].device;
        size_t run = stage->pieces[k].len;
        size_t j = k + 1;
        for (; j < stage->count && stage->pieces[j].device == start + run; j++)
            run += stage->pieces[j].len;
        kvpc_cuda_error_t rc = self->rt->memcpy_async (put ? staged : start, put ? start : staged,
                                                       run, KVPC_CUDA_MEMCPY_DEFAULT, gpu->stream);
        if (rc != 0)
            return s_fail (self, rc, "cudaMemcpyAsync of %zu bytes %s device %d", run,
                           put ? "to host from" : "from host to", device);
        staged += run;
        k = j;
    }
    return 0;
}

//  The host side of a buffer: the caller's copier (its copy threads), or memcpy.
typedef struct {
    kvpc_host_copy_fn *fn;
    void *arg;
} s_copier_t;

static void
s_host_copies (const s_copier_t *copier, const s_stage_t *stage)
{
    if (copier->fn)
        copier->fn (copier->arg, stage->copies, stage->count);
    else
        for (size_t i = 0; i < stage->count; i++)
            memcpy (stage->copies[i].dst, stage->copies[i].src, stage->copies[i].len);
}

//  A full (or last) buffer: laid out; a put's DMAs queued; a get's pieces copied into it
//  (on the copier's threads) and then its DMAs queued; and its event recorded.
static int
s_seal (kvpc_device_t *self, s_gpu_t *gpu, int index, const s_copier_t *copier, bool put,
        int device)
{
    s_layout (self, index, put);
    if (!put)
        s_host_copies (copier, &self->slots[index]);
    if (s_dma (self, gpu, index, put, device))
        return -1;
    kvpc_cuda_error_t rc = self->rt->event_record (gpu->stage_events[index], gpu->stream);
    if (rc != 0)
        return s_fail (self, rc, "cudaEventRecord");
    self->slots[index].busy = true;
    return 0;
}

//  Waits for buffer index's DMAs; a put's buffer is then copied out to where its pieces go.
static int
s_drain (kvpc_device_t *self, s_gpu_t *gpu, int index, const s_copier_t *copier, bool put)
{
    s_stage_t *stage = &self->slots[index];
    kvpc_cuda_error_t rc = self->rt->event_synchronize (gpu->stage_events[index]);
    if (rc != 0)
        return s_fail (self, rc, "a %s copy (cudaEventSynchronize)",
                       put ? "device-to-host" : "host-to-device");
    if (put)
        s_host_copies (copier, stage);
    stage->busy = false;
    stage->fill = 0;
    stage->count = 0;
    return 0;
}

//  After a failure: waits for whatever was queued (a buffer must not be reused under a copy
//  still running), leaves the runtime's error state as it was, and forgets the buffers.
static void
s_abandon (kvpc_device_t *self, s_gpu_t *gpu)
{
    self->rt->stream_synchronize (gpu->stream);
    s_clear (self->rt);
    s_stage_reset (self);
}

//  One direction's copies of one device through the staging buffers, in turn. A buffer is
//  planned until full, then sealed: a put's DMAs into it queued, a get's pieces copied into
//  it and its DMAs queued. The next buffer is planned and sealed while they run; when the turn
//  comes back to a buffer still in flight, it is drained: waited for and, for a put, copied
//  out to the pieces' destinations while the DMAs queued after it run.
static int
s_stage (kvpc_device_t *self, const kvpc_device_copy_t *items, size_t count,
         const s_copier_t *copier, bool put)
{
    int device = items[0].device;
    s_gpu_t *gpu = s_gpu (self, device);
    if (!gpu)
        return -1;
    int current = 0;
    int rc = 0;
    for (size_t k = 0; k < count && rc == 0; k++) {
        const char *from = items[k].src;
        char *to = items[k].dst;
        size_t left = items[k].len;
        while (left && rc == 0) {
            s_stage_t *stage = &self->slots[current];
            //  Back at a buffer still in flight: it is the oldest; empty it first.
            if (stage->busy && (rc = s_drain (self, gpu, current, copier, put)) != 0)
                break;
            size_t piece = KVPC_STAGE_BYTES - stage->fill;
            piece = piece < left ? piece : left;
            if (put ? s_piece_add (stage, to, from, piece)
                    : s_piece_add (stage, (void *) from, to, piece)) {
                rc = s_error (self, "out of memory");
                break;
            }
            stage->fill += piece;
            from += piece;
            to += piece;
            left -= piece;
            if (stage->fill == KVPC_STAGE_BYTES) {
                rc = s_seal (self, gpu, current, copier, put, device);
                current = (current + 1) % KVPC_STAGE_BUFFERS;
            }
        }
    }
    if (rc == 0 && self->slots[current].fill && !self->slots[current].busy) {
        rc = s_seal (self, gpu, current, copier, put, device);
        current = (current + 1) % KVPC_STAGE_BUFFERS;
    }
    //  Buffers are sealed in turn: the oldest is the one after the last sealed.
    for (int n = 0; n < KVPC_STAGE_BUFFERS && rc == 0; n++) {
        int index = (current + n) % KVPC_STAGE_BUFFERS;
        if (self->slots[index].busy)
            rc = s_drain (self, gpu, index, copier, put);
    }
    if (rc)
        s_abandon (self, gpu);
    return rc;
}

//  ---- direct copies ------------------------------------------------------------------------
//  A copy whose host side lies in a registered segment is one DMA: no staging buffer, no CPU
//  copy. The call's direct copies are sorted by device address and runs adjacent on both
//  sides merged (a value put whole from one buffer into consecutive space, say); each run goes
//  to the least loaded of its device's dma streams, so several copy engines work at once, and
//  each stream's runs are queued in one batch where the runtime has cudaMemcpyBatchAsync: a
//  KV cache's blocks of 32 layers are 32 copies a key, and queuing each costs microseconds.

//  Whether item's host side lies in a segment the process registered (asked of the process
//  once per segment per call).
static bool
s_direct (kvpc_device_t *self, const kvpc_device_copy_t *item)
{
    uintptr_t at = (uintptr_t) (item->to_device ? item->src : item->dst);
    for (size_t i = 0; i < self->ntargets; i++) {
        const s_range_t *target = &self->targets[i];
        if (at >= target->start && at - target->start <= target->end - target->start
            && item->len <= target->end - at)
            return true;
    }
    uintptr_t start, end;
    if (!kvpc_process_dma_target (self->process, (const void *) at, item->len, &start, &end))
        return false;
    if (self->ntargets < S_DMA_RANGES)
        self->targets[self->ntargets++] = (s_range_t){start, end, 0};
    return true;
}

//  The socket path's gets land values from received frames, memory libzmq allocated: a copy
//  of S_RECEIVED_MIN bytes or more out of one into device memory registers the frame's pages for
//  the call (they are unregistered once its copies are done, before the frame is freed), so
//  it too is one DMA instead of a CPU copy into a staging buffer and a DMA. Pages a frame
//  shares with another one already registered are refused (cudaErrorHostMemoryAlreadyRegistered):
//  that copy is staged. Any other refusal stages every frame of this connection from then on.
static bool
s_frame_direct (kvpc_device_t *self, const kvpc_device_copy_t *item)
{
    if (!item->to_device || item->len < S_RECEIVED_MIN || self->frames_off
        || !self->rt->host_register || !kvpc_process_dma_enabled (self->process))
        return false;
    uintptr_t at = (uintptr_t) item->src;
    for (size_t i = 0; i < self->nframes; i++)
        if (at >= self->frames[i].start && item->len <= self->frames[i].end - at
            && at < self->frames[i].end)
            return true;
    if (self->nframes == S_RECEIVED_RANGES)
        return false;
    uintptr_t page = (uintptr_t) sysconf (_SC_PAGESIZE);
    uintptr_t start = at & ~(page - 1);
    uintptr_t end = (at + item->len + page - 1) & ~(page - 1);
    kvpc_cuda_error_t rc =
        self->rt->host_register ((void *) start, end - start, KVPC_CUDA_HOST_REGISTER_PORTABLE);
    if (rc != 0) {
        s_clear (self->rt);
        if (rc != S_ERROR_ALREADY_REGISTERED)
            self->frames_off = true;
        return false;
    }
    self->frames[self->nframes++] = (s_range_t){start, end, 0};
    return true;
}

//  Unregisters the frames registered for the call (its copies are done).
static void
s_frames_release (kvpc_device_t *self)
{
    for (size_t i = 0; i < self->nframes; i++)
        if (self->rt->host_unregister ((void *) self->frames[i].start) != 0)
            s_clear (self->rt);
    self->nframes = 0;
}

static int
s_run_compare (const void *a, const void *b)
{
    const s_run_t *x = a, *y = b;
    if (x->device != y->device)
        return x->device < y->device ? -1 : 1;
    if (x->to_device != y->to_device)
        return x->to_device ? 1 : -1;
    const char *p = x->to_device ? x->dst : x->src;
    const char *q = y->to_device ? y->dst : y->src;
    return p < q ? -1 : p > q;
}

//  Grows the arrays of a call's direct and staged copies to count.
static int
s_plan_room (kvpc_device_t *self, size_t count)
{
    if (count <= self->runs_capacity)
        return 0;
    s_run_t *runs = realloc (self->runs, count * sizeof *runs);
    if (runs)
        self->runs = runs;
    kvpc_device_copy_t *staged = realloc (self->staged, count * sizeof *staged);
    if (staged)
        self->staged = staged;
    const void **dst = realloc (self->batch_dst, count * sizeof *dst);
    if (dst)
        self->batch_dst = dst;
    const void **src = realloc (self->batch_src, count * sizeof *src);
    if (src)
        self->batch_src = src;
    size_t *len = realloc (self->batch_len, count * sizeof *len);
    if (len)
        self->batch_len = len;
    if (!runs || !staged || !dst || !src || !len)
        return s_error (self, "out of memory for %zu copies", count);
    self->runs_capacity = self->staged_capacity = count;
    return 0;
}

//  Pitches a 2D copy may have (CUDA's limit is the device's maxPitch, 2^31 - 1 on the GPUs
//  of this decade), and the rows that make one worth it.
#define S_MAX_PITCH ((size_t) INT32_MAX)
#define S_MIN_ROWS 4

//  Whether run b continues a's rows: the same device, direction and length, dst and src
//  steps equal to the rows' pitches (or, for a's second row, any steps of one row or more
//  that a 2D copy can take).
static bool
s_next_row (const s_run_t *a, const s_run_t *b)
{
    if (a->device != b->device || a->to_device != b->to_device || a->len != b->len
        || b->dst <= a->dst || b->src <= a->src)
        return false;
    const char *last_dst = a->dst + (a->height - 1) * a->dpitch;
    const char *last_src = a->src + (a->height - 1) * a->spitch;
    size_t dstep = (size_t) (b->dst - last_dst), sstep = (size_t) (b->src - last_src);
    if (a->height > 1)
        return b->dst == last_dst + a->dpitch && b->src == last_src + a->spitch;
    return dstep >= a->len && sstep >= a->len && dstep <= S_MAX_PITCH && sstep <= S_MAX_PITCH;
}

//  Finds rows among runs[0 .. count) in their order: a single copy and the ones after it
//  with the same steps on both sides, S_MIN_ROWS or more, become one run of rows (steps of
//  exactly the length on both sides: one plain copy). Returns the number of runs left.
static size_t
s_rows (kvpc_device_t *self, s_run_t *runs, size_t count)
{
    bool rows_ok = !self->rows_off && self->rt->memcpy_2d;
    size_t kept = 0;
    for (size_t i = 0; i < count;) {
        s_run_t run = runs[i];
        size_t j = i + 1;
        if (run.height == 1 && rows_ok) {
            for (; j < count && runs[j].height == 1 && s_next_row (&run, &runs[j]); j++) {
                if (run.height == 1) {
                    run.dpitch = (size_t) (runs[j].dst - run.dst);
                    run.spitch = (size_t) (runs[j].src - run.src);
                }
                run.height++;
            }
            if (run.height > 1 && run.dpitch == run.len && run.spitch == run.len) {
                //  Rows with no gaps on either side: one plain copy.
                run.len *= run.height;
                run.height = 1;
            }
            else if (run.height < S_MIN_ROWS) {
                //  Too few to be worth a 2D copy: the first goes as a single copy.
                j = i + 1;
                run = runs[i];
            }
        }
        runs[kept++] = run;
        i = j;
    }
    return kept;
}

//  Plans the runs: rows in the caller's order (one key's blocks of evenly spaced layers:
//  adjacent in the segment, a layer apart in device memory); then, sorted by device address,
//  rows among the copies left (one layer's blocks of a batch's keys: adjacent in device
//  memory, a value apart in the segment), and single copies adjacent on both sides merged;
//  then each device's runs spread over its dma streams by bytes. Returns the number of runs
//  left.
static size_t
s_direct_plan (kvpc_device_t *self, s_run_t *runs, size_t count)
{
    size_t kept = s_rows (self, runs, count);
    qsort (runs, kept, sizeof *runs, s_run_compare);
    kept = s_rows (self, runs, kept);
    size_t merged = 0;
    for (size_t i = 0; i < kept; i++) {
        s_run_t *last = merged ? &runs[merged - 1] : NULL;
        if (last && last->height == 1 && runs[i].height == 1 && last->device == runs[i].device
            && last->to_device == runs[i].to_device && last->dst + last->len == runs[i].dst
            && last->src + last->len == runs[i].src) {
            last->len += runs[i].len;
            last->dpitch = last->spitch = last->len;
        }
        else
            runs[merged++] = runs[i];
    }
    uint64_t load[KVPC_DMA_STREAMS];
    for (size_t i = 0; i < merged; i++) {
        if (i == 0 || runs[i].device != runs[i - 1].device)
            memset (load, 0, sizeof load);
        int least = 0;
        for (int k = 1; k < KVPC_DMA_STREAMS; k++)
            if (load[k] < load[least])
                least = k;
        runs[i].stream = least;
        load[least] += runs[i].len * runs[i].height;
    }
    return merged;
}

//  Queues a run of rows with one 2D copy; 1 when the runtime refused it (its rows are then
//  queued as single copies), 0, or -1 with the error set.
static int
s_rows_queue (kvpc_device_t *self, s_gpu_t *gpu, int k, const s_run_t *run)
{
    const kvpc_cudart_t *rt = self->rt;
    if (!self->rows_off) {
        kvpc_cuda_error_t rc =
            rt->memcpy_2d (run->dst, run->dpitch, run->src, run->spitch, run->len, run->height,
                           KVPC_CUDA_MEMCPY_DEFAULT, gpu->dma[k]);
        if (rc == 0)
            return 0;
        //  Queuing every row again writes the same bytes as any part already queued.
        self->rows_off = true;
        s_clear (rt);
    }
    return 1;
}

//  Queues stream k's runs of one device (runs[0 .. count)): rows with one 2D copy each, the
//  single copies in one batch, or one by one.
static int
s_direct_queue (kvpc_device_t *self, s_gpu_t *gpu, int k, const s_run_t *runs, size_t count)
{
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        if (runs[i].stream != k)
            continue;
        int rows = runs[i].height > 1 ? s_rows_queue (self, gpu, k, &runs[i]) : 1;
        if (rows < 0)
            return -1;
        for (size_t r = 0; rows && r < runs[i].height; r++) {
            self->batch_dst[n] = runs[i].dst + r * runs[i].dpitch;
            self->batch_src[n] = runs[i].src + r * runs[i].spitch;
            self->batch_len[n] = runs[i].len;
            n++;
        }
    }
    if (n == 0)
        return 0;
    const kvpc_cudart_t *rt = self->rt;
    if (n > 1 && rt->memcpy_batch && !self->batch_off) {
        kvpc_cuda_memcpy_attributes_t attributes = {.src_access_order =
                                                        KVPC_CUDA_SRC_ACCESS_ORDER_STREAM};
        size_t first = 0;
        kvpc_cuda_error_t rc = rt->memcpy_batch (self->batch_dst, self->batch_src, self->batch_len,
                                                 n, &attributes, &first, 1, gpu->dma[k]);
        if (rc == 0)
            return 0;
        //  Whatever part of the batch was queued, queuing every copy again one by one
        //  writes the same bytes.
        self->batch_off = true;
        s_clear (rt);
    }
    for (size_t i = 0; i < n; i++) {
        kvpc_cuda_error_t rc =
            rt->memcpy_async ((void *) self->batch_dst[i], self->batch_src[i], self->batch_len[i],
                              KVPC_CUDA_MEMCPY_DEFAULT, gpu->dma[k]);
        if (rc != 0)
            return s_fail (self, rc, "cudaMemcpyAsync of %zu bytes between device %d and a segment",
                           self->batch_len[i], runs[0].device);
    }
    return 0;
}

//  Queues the planned runs (sorted by device) on their streams; *used gets the devices whose
//  streams must be waited for, even after a failure.
static int
s_direct_start (kvpc_device_t *self, const s_run_t *runs, size_t count, uint64_t *used)
{
    for (size_t i = 0; i < count;) {
        size_t j = i + 1;
        while (j < count && runs[j].device == runs[i].device)
            j++;
        s_gpu_t *gpu = s_gpu (self, runs[i].device);
        if (!gpu)
            return -1;
        *used |= 1ull << runs[i].device;
        for (int k = 0; k < KVPC_DMA_STREAMS; k++)
            if (s_direct_queue (self, gpu, k, runs + i, j - i))
                return -1;
        i = j;
    }
    return 0;
}

//  Waits for the dma streams of the devices in used. Returns 0, or -1 with the error set
//  (unless one was set before: the first failure is the one reported).
static int
s_direct_wait (kvpc_device_t *self, uint64_t used, bool failed)
{
    int rc = 0;
    for (int d = 0; d < KVPC_MAX_DEVICES && used; d++) {
        if (!(used & (1ull << d)))
            continue;
        used &= ~(1ull << d);
        for (int k = 0; k < KVPC_DMA_STREAMS; k++) {
            kvpc_cuda_error_t e = self->rt->stream_synchronize (self->gpus[d].dma[k]);
            if (e != 0 && rc == 0 && !failed)
                rc = s_fail (self, e,
                             "a copy between device %d and a segment "
                             "(cudaStreamSynchronize)",
                             d);
            else if (e != 0)
                s_clear (self->rt);
        }
    }
    return failed ? -1 : rc;
}

//  Staged copies: runs of one device and one direction each go through the buffers.
static int
s_staged (kvpc_device_t *self, const kvpc_device_copy_t *items, size_t count,
          const s_copier_t *copier)
{
    if (count == 0)
        return 0;
    if (s_stage_ready (self))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0;) {
        size_t j = i + 1;
        while (j < count && items[j].device == items[i].device
               && items[j].to_device == items[i].to_device)
            j++;
        rc = s_stage (self, items + i, j - i, copier, !items[i].to_device);
        i = j;
    }
    return rc;
}

int
kvpc_device_copy (kvpc_device_t *self, const kvpc_device_copy_t *items, size_t count,
                  kvpc_host_copy_fn *host_copy, void *arg)
{
    if (count == 0)
        return 0;
    if (!self->rt)
        return s_error (self, "no CUDA runtime");
    if (s_plan_room (self, count))
        return -1;
    size_t ndirect = 0, nstaged = 0;
    for (size_t i = 0; i < count; i++) {
        const kvpc_device_copy_t *item = &items[i];
        if (item->len == 0)
            continue;
        if (s_direct (self, item) || s_frame_direct (self, item))
            self->runs[ndirect++] =
                (s_run_t){item->dst, item->src, item->len, item->device, item->to_device,
                          0,         1,         item->len, item->len};
        else
            self->staged[nstaged++] = *item;
    }
    //  The direct copies are queued first and run while the staged ones go through the
    //  buffers; nothing is left in flight when this returns, failed or not.
    ndirect = ndirect ? s_direct_plan (self, self->runs, ndirect) : 0;
    uint64_t used = 0;
    int rc = s_direct_start (self, self->runs, ndirect, &used);
    s_copier_t copier = {host_copy, arg};
    if (rc == 0)
        rc = s_staged (self, self->staged, nstaged, &copier);
    rc = s_direct_wait (self, used, rc != 0);
    s_frames_release (self);
    return rc;
}

//  ---- frames of the socket path's puts -----------------------------------------------------

//  Frame buffers grow in powers of two from this size to the largest request seen (one of
//  KVPC_CHUNK_BYTES, 16 MiB, unless a single value is larger), and are kept.
#define S_FRAME_MIN (1u << 20)

void *
kvpc_device_frame (kvpc_device_t *self, int slot, size_t size)
{
    if (!self->rt) {
        s_error (self, "no CUDA runtime");
        return NULL;
    }
    if (size <= self->frame_size[slot] && self->frame[slot])
        return self->frame[slot];
    if (self->frame[slot]) {
        self->rt->free_host (self->frame[slot]);
        self->frame[slot] = NULL;
        self->frame_size[slot] = 0;
    }
    size_t want = S_FRAME_MIN;
    while (want < size && want <= SIZE_MAX / 2)
        want *= 2;
    if (want < size)
        want = size;
    if (s_pinned_alloc (self, &self->frame[slot], want, "a request's values"))
        return NULL;
    self->frame_size[slot] = want;
    return self->frame[slot];
}

int
kvpc_device_fetch (kvpc_device_t *self, int slot, void *dst, const void *src, size_t len,
                   int device)
{
    s_gpu_t *gpu = s_gpu (self, device);
    if (!gpu)
        return -1;
    kvpc_cuda_error_t rc =
        self->rt->memcpy_async (dst, src, len, KVPC_CUDA_MEMCPY_DEFAULT, gpu->stream);
    if (rc != 0)
        return s_fail (self, rc, "cudaMemcpyAsync of %zu bytes from device %d to host", len,
                       device);
    self->frame_pending[slot] |= 1ull << device;
    return 0;
}

int
kvpc_device_frame_seal (kvpc_device_t *self, int slot)
{
    int rc = 0;
    for (int d = 0; d < KVPC_MAX_DEVICES && self->frame_pending[slot]; d++) {
        if (!(self->frame_pending[slot] & (1ull << d)))
            continue;
        self->frame_pending[slot] &= ~(1ull << d);
        s_gpu_t *gpu = &self->gpus[d];
        kvpc_cuda_error_t e = self->rt->event_record (gpu->frame_events[slot], gpu->stream);
        if (e != 0) {
            //  Without the event, waiting means waiting for the whole stream.
            if (rc == 0)
                rc = s_fail (self, e, "cudaEventRecord");
            self->rt->stream_synchronize (gpu->stream);
            s_clear (self->rt);
            continue;
        }
        self->frame_sealed[slot] |= 1ull << d;
    }
    return rc;
}

int
kvpc_device_frame_wait (kvpc_device_t *self, int slot)
{
    int rc = kvpc_device_frame_seal (self, slot);
    for (int d = 0; d < KVPC_MAX_DEVICES && self->frame_sealed[slot]; d++) {
        if (!(self->frame_sealed[slot] & (1ull << d)))
            continue;
        self->frame_sealed[slot] &= ~(1ull << d);
        s_gpu_t *gpu = &self->gpus[d];
        kvpc_cuda_error_t e = self->rt->event_synchronize (gpu->frame_events[slot]);
        if (e != 0) {
            if (rc == 0)
                rc = s_fail (self, e, "a device-to-host copy (cudaEventSynchronize)");
            self->rt->stream_synchronize (gpu->stream);
            s_clear (self->rt);
        }
    }
    return rc;
}
