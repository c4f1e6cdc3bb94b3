/*  process.c - libkvpool's process-wide context (process.h).

    One context per process, made by the first connection and freed with the last: a
    reference count under a mutex. It holds what one connection must not own alone:

      the ZeroMQ context   every connection's socket lives in it; terminated with the last
                           connection, so a host process that closes its connections leaves
                           no libzmq thread behind. (An in-process client of kvpoold talks
                           inproc:// in CZMQ's context instead: connection.c.)
      the CUDA runtime     found and loaded by its finder (cuda_runtime.c) for every
                           connection's device layer, which holds a reference to the
                           context.
      the node's memory    each segment of a node, and each node's read index, mapped once
                           whichever connection asked first, and shared by reference count.
                           A connection that lists the segments again takes a reference to
                           each segment it lists and lets go of the ones gone, so a mapping
                           stays valid for as long as any connection can still resolve an
                           offset in it, and a connection's copies never race with another's
                           unmap. Mappings are keyed by the node (its server id: a restarted
                           node is another one, whose segment names may mean other memory),
                           the name, the size and the object's identity.

      DMA targets          a segment that device copies land in is registered with the CUDA
                           runtime (cudaHostRegister) on the first device copy that asks, and
                           unregistered before it is unmapped (process.h).

    A node has a handful of segments and a process a handful of nodes: the tables are lists
    searched under the mutex, and only listing the segments (at connect, after a reconnect, or
    for a segment mounted since) looks in them; copies resolve through the connection's own
    view (segment_view.c) without taking the lock.

    Threads: any; every function takes the mutex.
*/
#include "client/process.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "shm/segment.h"

struct _kvpc_mapping_t {
    kvpc_mapping_t *next;
    char node[96];
    char name[256];
    uint64_t size, device, inode;
    segment_t *segment;
    size_t refs;
    int dma; //  S_DMA_*: registered with the CUDA runtime or not
};

enum {
    S_DMA_UNASKED = 0, //  no device copy asked about it yet
    S_DMA_OURS,        //  registered by us: unregistered before it is unmapped
    S_DMA_THEIRS,      //  the application registered it before us: left alone
    S_DMA_REFUSED,     //  the runtime refused it (or has no cudaHostRegister): staged
};

//  cudaErrorHostMemoryAlreadyRegistered
#define S_ERROR_ALREADY_REGISTERED 712

typedef struct s_index_entry_t {
    struct s_index_entry_t *next;
    char node[96];
    char name[256];
    shm_index_t *index;
    size_t refs;
} s_index_entry_t;

struct _kvpc_process_t {
    size_t users;
    void *zmq;
    kvpc_cuda_t *cuda;
    kvpc_mapping_t *mappings;
    s_index_entry_t *indexes;
    uint64_t maps_made;
    bool dma_off; //  KVPOOL_DEVICE_DMA=staged
};

static pthread_mutex_t s_mutex = PTHREAD_MUTEX_INITIALIZER;
static kvpc_process_t *s_process;
//  A refused registration was reported (once per process, whatever contexts come and go).
static bool s_refusal_said;

kvpc_process_t *
kvpc_process_acquire (void)
{
    pthread_mutex_lock (&s_mutex);
    if (!s_process) {
        kvpc_process_t *self = calloc (1, sizeof *self);
        if (self) {
            self->zmq = zmq_ctx_new ();
            self->cuda = kvpc_cuda_new ();
            const char *dma = getenv ("KVPOOL_DEVICE_DMA");
            self->dma_off = dma && strcmp (dma, "staged") == 0;
        }
        if (self && self->zmq && self->cuda)
            s_process = self;
        else if (self) {
            if (self->zmq)
                zmq_ctx_term (self->zmq);
            kvpc_cuda_destroy (&self->cuda);
            free (self);
            errno = ENOMEM;
        }
        else
            errno = ENOMEM;
    }
    kvpc_process_t *self = s_process;
    if (self)
        self->users++;
    pthread_mutex_unlock (&s_mutex);
    return self;
}

//  Unregisters a mapping we registered (the lock held), before it is unmapped. Errors are of
//  no use here: at exit the runtime may already be gone.
static void
s_dma_forget (kvpc_process_t *self, kvpc_mapping_t *mapping)
{
    if (mapping->dma != S_DMA_OURS)
        return;
    const kvpc_cudart_t *rt = kvpc_cuda_get (self->cuda);
    if (rt && rt->host_unregister) {
        rt->host_unregister (segment_base (mapping->segment));
        rt->get_last_error ();
    }
    mapping->dma = S_DMA_UNASKED;
}

void
kvpc_process_release (kvpc_process_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpc_process_t *self = *self_p;
    pthread_mutex_lock (&s_mutex);
    if (--self->users == 0) {
        //  Every connection let go of its mappings before it let go of the context; any
        //  left would be a leak, not memory in use.
        while (self->mappings) {
            kvpc_mapping_t *mapping = self->mappings;
            self->mappings = mapping->next;
            s_dma_forget (self, mapping);
            segment_destroy (&mapping->segment);
            free (mapping);
        }
        while (self->indexes) {
            s_index_entry_t *entry = self->indexes;
            self->indexes = entry->next;
            shm_index_destroy (&entry->index);
            free (entry);
        }
        zmq_ctx_term (self->zmq);
        kvpc_cuda_destroy (&self->cuda);
        free (self);
        s_process = NULL;
    }
    pthread_mutex_unlock (&s_mutex);
    *self_p = NULL;
}

void *
kvpc_process_zmq (kvpc_process_t *self)
{
    return self->zmq;
}

kvpc_cuda_t *
kvpc_process_cuda (kvpc_process_t *self)
{
    return self->cuda;
}

const char *
kvpc_process_cuda_path (void)
{
    pthread_mutex_lock (&s_mutex);
    const char *path = s_process ? kvpc_cuda_path (s_process->cuda) : "";
    pthread_mutex_unlock (&s_mutex);
    return path;
}

//  ---- segments -------------------------------------------------------------------------------

kvpc_mapping_t *
kvpc_process_map (kvpc_process_t *self, const char *node, const char *name, uint64_t size,
                  uint64_t device, uint64_t inode)
{
    if (!node)
        node = "";
    if (!name || !*name || strlen (name) >= sizeof ((kvpc_mapping_t *) 0)->name
        || strlen (node) >= sizeof ((kvpc_mapping_t *) 0)->node || size == 0 || size > SIZE_MAX)
        return NULL;
    pthread_mutex_lock (&s_mutex);
    kvpc_mapping_t *mapping = self->mappings;
    while (mapping
           && (mapping->size != size || mapping->device != device || mapping->inode != inode
               || strcmp (mapping->name, name) != 0 || strcmp (mapping->node, node) != 0))
        mapping = mapping->next;
    if (mapping) {
        mapping->refs++;
        pthread_mutex_unlock (&s_mutex);
        return mapping;
    }
    //  Mapped under the lock: two connections listing the same node at once map it once.
    segment_t *segment = segment_open (name, (size_t) size);
    if (segment && (device || inode)) {
        uint64_t mapped_device, mapped_inode;
        segment_identity (segment, &mapped_device, &mapped_inode);
        if (mapped_device != device || mapped_inode != inode)
            segment_destroy (&segment); //  the name now means another object
    }
    mapping = segment ? calloc (1, sizeof *mapping) : NULL;
    if (mapping) {
        snprintf (mapping->node, sizeof mapping->node, "%s", node);
        snprintf (mapping->name, sizeof mapping->name, "%s", name);
        mapping->size = size;
        mapping->device = device;
        mapping->inode = inode;
        mapping->segment = segment;
        mapping->refs = 1;
        mapping->next = self->mappings;
        self->mappings = mapping;
        self->maps_made++;
    }
    else
        segment_destroy (&segment);
    pthread_mutex_unlock (&s_mutex);
    return mapping;
}

void
kvpc_process_unmap (kvpc_process_t *self, kvpc_mapping_t **mapping_p)
{
    if (!mapping_p || !*mapping_p)
        return;
    kvpc_mapping_t *mapping = *mapping_p;
    pthread_mutex_lock (&s_mutex);
    if (--mapping->refs == 0) {
        kvpc_mapping_t **at = &self->mappings;
        while (*at && *at != mapping)
            at = &(*at)->next;
        if (*at)
            *at = mapping->next;
        s_dma_forget (self, mapping);
        segment_destroy (&mapping->segment);
        free (mapping);
    }
    pthread_mutex_unlock (&s_mutex);
    *mapping_p = NULL;
}

void *
kvpc_mapping_base (kvpc_mapping_t *mapping)
{
    return segment_base (mapping->segment);
}

uint64_t
kvpc_mapping_size (kvpc_mapping_t *mapping)
{
    return mapping->size;
}

//  ---- direct DMA -----------------------------------------------------------------------------

bool
kvpc_process_dma_enabled (kvpc_process_t *self)
{
    return !self->dma_off;
}

//  Registers mapping with the runtime (the lock held): pinning a segment of gigabytes takes a
//  while, once.
static void
s_dma_register (kvpc_process_t *self, kvpc_mapping_t *mapping)
{
    const kvpc_cudart_t *rt = kvpc_cuda_get (self->cuda);
    if (!rt || !rt->host_register) {
        mapping->dma = S_DMA_REFUSED;
        return;
    }
    void *base = segment_base (mapping->segment);
    kvpc_cuda_error_t rc =
        rt->host_register (base, (size_t) mapping->size, KVPC_CUDA_HOST_REGISTER_PORTABLE);
    if (rc == 0)
        mapping->dma = S_DMA_OURS;
    else if (rc == S_ERROR_ALREADY_REGISTERED)
        mapping->dma = S_DMA_THEIRS;
    else {
        mapping->dma = S_DMA_REFUSED;
        if (!s_refusal_said) {
            s_refusal_said = true;
            const char *text = rt->get_error_string (rc);
            fprintf (stderr,
                     "libkvpool: GPU copies into kvpoold's segment %s go through pinned staging "
                     "buffers: the CUDA runtime refused to register it (cudaHostRegister: %s, "
                     "CUDA error %d)\n",
                     mapping->name, text ? text : "unknown error", rc);
        }
    }
    if (rc != 0)
        rt->get_last_error ();
}

bool
kvpc_process_dma_target (kvpc_process_t *self, const void *ptr, size_t len, uintptr_t *start,
                         uintptr_t *end)
{
    if (self->dma_off)
        return false;
    uintptr_t at = (uintptr_t) ptr;
    bool target = false;
    pthread_mutex_lock (&s_mutex);
    for (kvpc_mapping_t *mapping = self->mappings; mapping; mapping = mapping->next) {
        uintptr_t base = (uintptr_t) segment_base (mapping->segment);
        if (at < base || at - base >= mapping->size || len > mapping->size - (at - base))
            continue;
        if (mapping->dma == S_DMA_UNASKED)
            s_dma_register (self, mapping);
        target = mapping->dma == S_DMA_OURS || mapping->dma == S_DMA_THEIRS;
        if (target) {
            *start = base;
            *end = base + (uintptr_t) mapping->size;
        }
        break;
    }
    pthread_mutex_unlock (&s_mutex);
    return target;
}

//  ---- read indexes ---------------------------------------------------------------------------

shm_index_t *
kvpc_process_index_open (kvpc_process_t *self, const char *node, const char *name)
{
    if (!node)
        node = "";
    if (!name || !*name || strlen (name) >= sizeof ((s_index_entry_t *) 0)->name
        || strlen (node) >= sizeof ((s_index_entry_t *) 0)->node)
        return NULL;
    pthread_mutex_lock (&s_mutex);
    s_index_entry_t *entry = self->indexes;
    while (entry && (strcmp (entry->name, name) != 0 || strcmp (entry->node, node) != 0))
        entry = entry->next;
    if (!entry) {
        shm_index_t *index = shm_index_open (name);
        entry = index ? calloc (1, sizeof *entry) : NULL;
        if (entry) {
            snprintf (entry->node, sizeof entry->node, "%s", node);
            snprintf (entry->name, sizeof entry->name, "%s", name);
            entry->index = index;
            entry->next = self->indexes;
            self->indexes = entry;
        }
        else
            shm_index_destroy (&index);
    }
    if (entry)
        entry->refs++;
    shm_index_t *index = entry ? entry->index : NULL;
    pthread_mutex_unlock (&s_mutex);
    return index;
}

void
kvpc_process_index_close (kvpc_process_t *self, shm_index_t **index_p)
{
    if (!index_p || !*index_p)
        return;
    pthread_mutex_lock (&s_mutex);
    s_index_entry_t **at = &self->indexes;
    while (*at && (*at)->index != *index_p)
        at = &(*at)->next;
    s_index_entry_t *entry = *at;
    if (entry && --entry->refs == 0) {
        *at = entry->next;
        shm_index_destroy (&entry->index);
        free (entry);
    }
    pthread_mutex_unlock (&s_mutex);
    *index_p = NULL;
}

//  ---- for tests ------------------------------------------------------------------------------

void
kvpc_process_counts (kvpc_process_counts_t *counts)
{
    memset (counts, 0, sizeof *counts);
    pthread_mutex_lock (&s_mutex);
    if (s_process) {
        counts->users = s_process->users;
        counts->maps_made = s_process->maps_made;
        for (kvpc_mapping_t *mapping = s_process->mappings; mapping; mapping = mapping->next) {
            counts->segments++;
            counts->registered += mapping->dma == S_DMA_OURS;
        }
        for (s_index_entry_t *entry = s_process->indexes; entry; entry = entry->next)
            counts->indexes++;
    }
    pthread_mutex_unlock (&s_mutex);
}
