/*  cuda_runtime.h - the CUDA runtime as libkvpool uses it: found and loaded at run time,
    never linked, and owned by the process context (process.h), which makes one finder per
    context. The device layer (device.h) asks it for the runtime on every call with caller
    buffers.

    The runtime is declared here, not included: the few functions, enum values and the
    struct libkvpool uses, with the ABI of CUDA 11 to 13. cudaPointerAttributes is
    {type, device, devicePointer, hostPointer} since CUDA 11, and CUDA 13 appends
    long reserved[8]; it is passed with room to spare and zeroed. Runtimes older than 11.0
    (another layout) are not used.

    Which runtime: KVPOOL_CUDART names the library to load (a path; "none" or "0" for none
    at all), read when the finder is made; unset, libcudart.so.13, .12, .11.0 or libcudart.so
    already in the process is used, or loaded, but only once the CUDA driver (libcuda.so.1)
    is in the process: a process that never used CUDA holds no device memory, and a runtime
    call would give it a CUDA context for nothing.

    Threads: any; the runtime is loaded under the finder's lock, once.
*/
#ifndef KVPC_CUDA_RUNTIME_H_INCLUDED
#define KVPC_CUDA_RUNTIME_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

typedef int kvpc_cuda_error_t; //  cudaError_t: 0 is cudaSuccess
typedef void *kvpc_cuda_stream_t;
typedef void *kvpc_cuda_event_t;

#define KVPC_CUDA_MEMORY_HOST 1   //  cudaMemoryTypeHost: pinned or registered host memory
#define KVPC_CUDA_MEMORY_DEVICE 2 //  cudaMemoryTypeDevice
#define KVPC_CUDA_MEMCPY_DEFAULT 4
#define KVPC_CUDA_HOST_ALLOC_PORTABLE 1
#define KVPC_CUDA_EVENT_DISABLE_TIMING 2
#define KVPC_CUDA_HOST_REGISTER_PORTABLE 1
//  cudaMemcpySrcAccessOrderStream: a batch's sources are read in stream order.
#define KVPC_CUDA_SRC_ACCESS_ORDER_STREAM 1
//  The driver's CUpointer_attribute values for where an allocation starts and its size.
#define KVPC_CUDA_RANGE_START_ADDR 11
#define KVPC_CUDA_RANGE_SIZE 12

//  Errors that say this process has no working CUDA (no device, no driver, runtime going
//  away): then no buffer can be device memory.
#define KVPC_CUDA_ERROR_INITIALIZATION 3
#define KVPC_CUDA_ERROR_UNLOADING 4
#define KVPC_CUDA_ERROR_STUB_LIBRARY 34 //  cudaErrorStubLibrary: the stub libcuda, no real driver
#define KVPC_CUDA_ERROR_INSUFFICIENT_DRIVER 35
#define KVPC_CUDA_ERROR_NEWER_DRIVER 36
#define KVPC_CUDA_ERROR_DEVICES_UNAVAILABLE 46
#define KVPC_CUDA_ERROR_NO_DEVICE 100

typedef struct {
    int type; //  enum cudaMemoryType
    int device;
    void *device_pointer;
    void *host_pointer;
    long reserved[8]; //  CUDA 13
    long spare[16];   //  room for what a later runtime may append
} kvpc_cuda_attributes_t;

//  cudaMemcpyAttributes (CUDA 12.8 on): {srcAccessOrder, srcLocHint {type, id}, dstLocHint
//  {type, id}, flags}. The hints are for managed memory only and left zero.
typedef struct {
    int src_access_order;
    int src_type, src_id;
    int dst_type, dst_id;
    unsigned int flags;
} kvpc_cuda_memcpy_attributes_t;

//  cudaMemcpyBatchAsync as CUDA 13 declares it (12.8 to 12.9 took a failIdx before the
//  stream: that one is not used).
typedef kvpc_cuda_error_t (kvpc_cuda_batch_fn) (const void **dsts, const void **srcs,
                                                const size_t *sizes, size_t count,
                                                kvpc_cuda_memcpy_attributes_t *attrs,
                                                size_t *attrs_idxs, size_t num_attrs,
                                                kvpc_cuda_stream_t stream);

//  The runtime's functions libkvpool calls. The last four are optional (NULL when the
//  runtime lacks them): without host_register every device copy is staged, without
//  memcpy_batch direct copies are queued one by one, without memcpy_2d strided ones are.
typedef struct {
    char path[512]; //  what was loaded
    int version;    //  cudaRuntimeGetVersion
    kvpc_cuda_error_t (*pointer_get_attributes) (kvpc_cuda_attributes_t *, const void *);
    kvpc_cuda_error_t (*host_alloc) (void **, size_t, unsigned int);
    kvpc_cuda_error_t (*free_host) (void *);
    kvpc_cuda_error_t (*memcpy_async) (void *, const void *, size_t, int, kvpc_cuda_stream_t);
    kvpc_cuda_error_t (*stream_create) (kvpc_cuda_stream_t *);
    kvpc_cuda_error_t (*stream_synchronize) (kvpc_cuda_stream_t);
    kvpc_cuda_error_t (*stream_destroy) (kvpc_cuda_stream_t);
    kvpc_cuda_error_t (*event_create) (kvpc_cuda_event_t *, unsigned int);
    kvpc_cuda_error_t (*event_record) (kvpc_cuda_event_t, kvpc_cuda_stream_t);
    kvpc_cuda_error_t (*event_synchronize) (kvpc_cuda_event_t);
    kvpc_cuda_error_t (*event_destroy) (kvpc_cuda_event_t);
    kvpc_cuda_error_t (*get_device) (int *);
    kvpc_cuda_error_t (*set_device) (int);
    kvpc_cuda_error_t (*get_last_error) (void);
    const char *(*get_error_string) (kvpc_cuda_error_t);
    kvpc_cuda_error_t (*host_register) (void *, size_t, unsigned int);
    kvpc_cuda_error_t (*host_unregister) (void *);
    kvpc_cuda_batch_fn *memcpy_batch; //  CUDA 13 and later only
    //  cudaMemcpy2DAsync (dst, dpitch, src, spitch, width, height, kind, stream)
    kvpc_cuda_error_t (*memcpy_2d) (void *, size_t, const void *, size_t, size_t, size_t, int,
                                    kvpc_cuda_stream_t);
    void *handle;
} kvpc_cudart_t;

//  The driver's cuPointerGetAttribute.
typedef int (kvpc_cuda_range_fn) (void *, int, unsigned long long);

typedef struct _kvpc_cuda_t kvpc_cuda_t;

//  A finder that has looked for nothing yet (reads KVPOOL_CUDART). Returns NULL when out of
//  memory. Caller owns it and destroys it.
kvpc_cuda_t *kvpc_cuda_new (void);
//  Frees the finder. The runtime it loaded stays loaded: the application (PyTorch) may use
//  the same library, and CUDA registers exit handlers in it. Does nothing on NULL; sets
//  *self_p to NULL.
void kvpc_cuda_destroy (kvpc_cuda_t **self_p);
//  The runtime, looked for on each call until found (in automatic mode, only once CUDA is in
//  the process) and loaded once; NULL when there is none (yet), or once it said the process
//  has no working CUDA (kvpc_cuda_mark_dead).
const kvpc_cudart_t *kvpc_cuda_get (kvpc_cuda_t *self);
//  The runtime said this process has no working CUDA: it is not asked again.
void kvpc_cuda_mark_dead (kvpc_cuda_t *self);
bool kvpc_cuda_dead (kvpc_cuda_t *self);
//  The driver's cuPointerGetAttribute (from the runtime library itself, else from
//  libcuda.so.1), looked up once; NULL when there is none. Only with a runtime found.
kvpc_cuda_range_fn *kvpc_cuda_range_query (kvpc_cuda_t *self);
//  The loaded runtime's path, "" when none (yet).
const char *kvpc_cuda_path (kvpc_cuda_t *self);

#endif
