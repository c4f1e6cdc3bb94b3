/*  process.h - libkvpool's process-wide context: what belongs to the process, not to one
    connection (process.c says how it is shared).

    It owns the ZeroMQ context every connection's socket lives in, the CUDA runtime
    (cuda_runtime.h), and the node's shared memory as this process maps it: each segment of a node,
   and each node's same-machine read index, is mapped once per process however many connections
   reach that node, and unmapped when the last of them lets go. The lowest layer of the client:
   below the connection and the device layer, which acquire it, and the fast path, which maps
   through it.
*/
#ifndef KVPC_PROCESS_H_INCLUDED
#define KVPC_PROCESS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/cuda_runtime.h"
#include "shm/shm_index.h"

typedef struct _kvpc_process_t kvpc_process_t;

//  The process's context, made by the first call and shared by every later one. Returns
//  NULL (errno set) when it cannot be made. Each acquire is paired with a release.
kvpc_process_t *kvpc_process_acquire (void);
//  Lets go of it; the last release terminates the ZeroMQ context and frees it (every
//  mapping must have been let go first). Does nothing on NULL; sets *self_p to NULL.
void kvpc_process_release (kvpc_process_t **self_p);
//  The ZeroMQ context the connections' sockets live in.
void *kvpc_process_zmq (kvpc_process_t *self);
//  The finder of the CUDA runtime (cuda_runtime.h) every device layer asks.
kvpc_cuda_t *kvpc_process_cuda (kvpc_process_t *self);
//  The path of the runtime the process context loaded; "" when none (yet), or when there is
//  no context. Valid while the caller holds the context (a connection, a device object).
const char *kvpc_process_cuda_path (void);

//  ---- the node's shared memory, mapped once per process ----------------------------------

typedef struct _kvpc_mapping_t kvpc_mapping_t;

//  The mapping of segment name (size bytes) of node (its server id), shared with every
//  connection that maps the same one. device and inode: the object as the node mapped it
//  (both 0: not checked); an object found by name with another identity is not mapped.
//  Returns NULL when it cannot be mapped. Let it go with kvpc_process_unmap.
kvpc_mapping_t *kvpc_process_map (kvpc_process_t *self, const char *node, const char *name,
                                  uint64_t size, uint64_t device, uint64_t inode);
//  Lets go of a mapping; the last holder's release unmaps it. Does nothing on NULL; sets
//  *mapping_p to NULL.
void kvpc_process_unmap (kvpc_process_t *self, kvpc_mapping_t **mapping_p);
//  Where the mapping starts in this process, and its size.
void *kvpc_mapping_base (kvpc_mapping_t *mapping);
uint64_t kvpc_mapping_size (kvpc_mapping_t *mapping);

//  The read index name of node, opened read-only and shared like a segment. Returns NULL
//  when it cannot be opened. Let it go with kvpc_process_index_close.
shm_index_t *kvpc_process_index_open (kvpc_process_t *self, const char *node, const char *name);
void kvpc_process_index_close (kvpc_process_t *self, shm_index_t **index_p);

//  ---- direct DMA: segments registered with the CUDA runtime --------------------------------
//  A device copy whose host side lies in a registered segment moves by DMA straight between
//  device memory and the segment (device.h). A segment is registered (cudaHostRegister) the
//  first time a device copy asks about it, once per process however many connections map it,
//  and unregistered before it is unmapped: a process that never copies device memory pins
//  nothing. KVPOOL_DEVICE_DMA=staged (read when the context is made) turns this off; every
//  device copy then goes through pinned staging buffers, as it does where the runtime lacks
//  cudaHostRegister or refuses a segment (said once per process on standard error).

//  Whether [ptr, ptr + len) lies inside one segment this process maps that is registered with
//  the CUDA runtime (registering it now, if it was never asked about). On true, *start and
//  *end are the segment's range: a caller that holds the mapping may take any range inside
//  it as registered without asking again.
bool kvpc_process_dma_target (kvpc_process_t *self, const void *ptr, size_t len, uintptr_t *start,
                              uintptr_t *end);
//  Whether direct DMA is on for this process (KVPOOL_DEVICE_DMA is not "staged").
bool kvpc_process_dma_enabled (kvpc_process_t *self);

//  ---- for tests ------------------------------------------------------------------------------

//  What the context holds now (all zero when no context exists).
typedef struct {
    size_t users;       //  acquires not yet released
    size_t segments;    //  segments mapped now
    size_t indexes;     //  read indexes open now
    uint64_t maps_made; //  segments mapped since the context was made (shared ones once)
    size_t registered;  //  segments registered with the CUDA runtime now
} kvpc_process_counts_t;

void kvpc_process_counts (kvpc_process_counts_t *counts);

#endif
