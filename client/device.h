/*  device.h - libkvpool's device-memory layer: caller buffers in GPU memory.

    The calls that copy from or into a caller's buffers (puts, gets into buffers) may be given
    CUDA device addresses, as vLLM's connector passes its KV-cache tensors. A device address is
    no host memory: memcpy on it faults. This layer tells the two apart and moves device bytes
    through pinned host buffers with the CUDA runtime.

    The runtime is loaded at run time, never linked, by the process context (process.h,
    cuda_runtime.h: KVPOOL_CUDART names the library to load; unset, the one already in the
    process, once the CUDA driver is there). Without a runtime every buffer is host memory,
    as it always was (there is no telling otherwise).

    Classification: the API classifies each caller buffer of a call (kvpc_device_classify),
    which asks cudaPointerGetAttributes unless a cached range answers: device allocations are
    cached per connection (the whole allocation, when the driver says where it starts and
    ends), pinned host ranges for the call; pageable host memory is asked each time (freed, its
    range may come back as device memory, and device memory taken for host memory faults). A
    call that has device buffers arms the layer; the layers below ask it which copies touch
    device memory (kvpc_device_plan, kvpc_device_holds) only while it is armed, so host-only
    calls cost one check.

    Direct DMA: a copy whose host side lies in one of the node's segments that the process
    registered with the runtime (process.h: once per segment per process, on the first device
    copy that asks) moves by one DMA between device memory and the segment, with no staging
    copy. A call's direct copies are sorted by device address, runs adjacent on both sides
    merged, and spread over KVPC_DMA_STREAMS streams of their device, each stream's copies
    queued in one cudaMemcpyBatchAsync where the runtime has it (CUDA 13) and one by one
    otherwise; kvpc_device_copy returns only once every stream is done, so the layers above
    commit (PUT_END) or release (RELEASE) a value only after its bytes have landed. Where
    direct DMA is off (KVPOOL_DEVICE_DMA=staged) or the segment was refused, the copy is
    staged.

    Staging: kvpc_device_copy runs a list of copies between device and host memory through
    KVPC_STAGE_BUFFERS pinned buffers of KVPC_STAGE_BYTES in turn, on one CUDA stream per
    device: a put's device-to-host copy of chunk i+1 runs while chunk i is copied from its
    pinned buffer to its destination, a get's host-to-device copy of chunk i while chunk i+1
    is copied into the next pinned buffer. A buffer's pieces are laid out in the order of their
    device addresses, so pieces adjacent in device memory (one layer's blocks of a KV cache)
    move in one DMA. The host side of a chunk runs on the caller's copy threads (the
    connection's, as host copies do). The socket path's put sends each request's device
    values straight from pinned frame buffers (kvpc_device_frame), filled while the request
    before goes out. A CUDA error yields -1 with the reason in kvpc_device_error; the calls
    report it as KVPOOL_INVALID_PARAMS.

    Threads: one object per connection, used by the connection's thread; the runtime is loaded
    once per process context, which each object holds a reference to.
*/
#ifndef KVPC_DEVICE_H_INCLUDED
#define KVPC_DEVICE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  Pinned staging for kvpc_device_copy: this many buffers of this many bytes per connection,
//  allocated on its first device copy.
#define KVPC_STAGE_BYTES (8u << 20)
#define KVPC_STAGE_BUFFERS 4
//  Streams per device that a call's direct copies are spread over.
#define KVPC_DMA_STREAMS 4
//  Device allocations a connection remembers.
#define KVPC_DEVICE_RANGES 64
//  Device ordinals a connection can stage for (0 .. KVPC_MAX_DEVICES - 1).
#define KVPC_MAX_DEVICES 64

typedef struct _kvpc_device_t kvpc_device_t;

//  One copy of a call that has device memory on one side.
typedef struct {
    void *dst;
    const void *src;
    size_t len;
    int device;     //  the device whose memory the device side is
    bool to_device; //  dst is device memory (a get); otherwise src is (a put)
} kvpc_device_copy_t;

//  An object for one connection, holding a reference to the process context; no runtime is
//  touched before its first call. Returns NULL when out of memory. Caller owns it and
//  destroys it.
kvpc_device_t *kvpc_device_new (void);
//  Frees the pinned buffers, streams and events. Does nothing on NULL; sets *self_p to NULL.
void kvpc_device_destroy (kvpc_device_t **self_p);

//  What this process uses for a runtime: its path ("" when none, none yet (in automatic mode
//  the runtime is looked for only once CUDA is in the process), or no process context).
const char *kvpc_device_runtime (void);

//  ---- one call ---------------------------------------------------------------------------
//  Starts a call that takes caller buffers: forgets the last call's buffers. Returns false
//  when there is no runtime (then every buffer is host memory and nothing else need be
//  asked).
bool kvpc_device_begin (kvpc_device_t *self);
//  Classifies the caller buffer [ptr, ptr + len). Returns 1 for device memory (the call will
//  stage it), 0 for host memory, -1 when the runtime cannot say (the error says why: the
//  buffer must not be touched).
int kvpc_device_classify (kvpc_device_t *self, const void *ptr, size_t len);
//  After the buffers: arms the layer for the call if some buffer was device memory. Returns
//  whether it did.
bool kvpc_device_arm (kvpc_device_t *self);
//  Ends the call (disarms).
void kvpc_device_end (kvpc_device_t *self);
//  Whether the current call has device buffers (false on NULL).
bool kvpc_device_armed (const kvpc_device_t *self);

//  Whether ptr lies in a device buffer of the armed call; if so *device is its device.
bool kvpc_device_holds (const kvpc_device_t *self, const void *ptr, int *device);
//  Whether the copy of len bytes from src to dst has a device side in the armed call; if so
//  fills item.
bool kvpc_device_plan (const kvpc_device_t *self, void *dst, const void *src, size_t len,
                       kvpc_device_copy_t *item);

//  ---- moving bytes -----------------------------------------------------------------------
//  Makes count host-to-host copies (dst, src, len of each; device and to_device unused), all
//  done when it returns: the host side of the staging, into or out of a pinned buffer.
typedef void (kvpc_host_copy_fn) (void *arg, const kvpc_device_copy_t *copies, size_t count);

//  Runs count copies, each with its device side: by DMA straight into or out of a
//  registered segment where the host side lies in one, through the pinned staging buffers
//  otherwise (the host side of each buffer's chunk with host_copy (arg; NULL: memcpy in this
//  thread)). Returns when all are done, none still in flight: 0, or -1 (some copies may be
//  incomplete) with kvpc_device_error set.
int kvpc_device_copy (kvpc_device_t *self, const kvpc_device_copy_t *items, size_t count,
                      kvpc_host_copy_fn *host_copy, void *arg);

//  Pinned host memory of at least size bytes, frame buffer slot (0 or 1) of the socket path's
//  put; kept (and grown when needed) from call to call. NULL, with the error set, when it
//  cannot be had. The slot's copies must be done (kvpc_device_frame_wait) before it is asked
//  for again.
void *kvpc_device_frame (kvpc_device_t *self, int slot, size_t size);
//  Starts copying len bytes of device memory at src (on device) to dst, in frame slot.
//  Returns 0, or -1 with the error set.
int kvpc_device_fetch (kvpc_device_t *self, int slot, void *dst, const void *src, size_t len,
                       int device);
//  Marks the end of slot's copies so far; kvpc_device_frame_wait waits for them. Each
//  returns 0, or -1 with the error set.
int kvpc_device_frame_seal (kvpc_device_t *self, int slot);
int kvpc_device_frame_wait (kvpc_device_t *self, int slot);

//  Why the last device operation failed ("" if none did).
const char *kvpc_device_error (const kvpc_device_t *self);

#endif
