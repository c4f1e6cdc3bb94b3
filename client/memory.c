/*  memory.c - memory a client gives the pool (kvpool_mount_memory, kvpool_unmount_memory).

    Mooncake's embedded client contributes a global segment of its own memory at setup;
    this is that, for C. The memory is a memfd made by segment_new_sealed (pages committed,
    sealed against shrinking and growing: the only memory a node mounts, see segment.h),
    mapped here for the fast path's copies and mounted at the node under the connection's
    owner name. Giving it back unmounts it first, so the node has removed every object in
    it and stopped using it before this process lets go of the memory. If the process dies
    instead, the node sees the owner gone, unmounts the segment, and the kernel frees it.
*/
#include "client/kvpool_client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
kvpool_mount_memory (kvpool_t *self, uint64_t size, uint32_t *id_p, const char **name_p)
{
    if (!self || size == 0 || size > SIZE_MAX || !id_p)
        return KVPOOL_INVALID_PARAMS;
    if (!self->same_host) {
        kvpc_set_error (self, "the node at %s is not on this machine: it can't map our memory",
                        self->endpoint);
        return KVPOOL_INVALID_PARAMS;
    }
    kvpc_memory_t *grown =
        (kvpc_memory_t *) realloc (self->memory, (self->memory_count + 1) * sizeof *grown);
    if (!grown)
        return KVPOOL_INTERNAL_ERROR;
    self->memory = grown;
    segment_t *segment = segment_new_sealed ((size_t) size, "kvpool-client");
    if (!segment) {
        kvpc_set_error (self, "cannot make %llu bytes of memory to give: %s",
                        (unsigned long long) size, strerror (errno));
        return KVPOOL_NO_AVAILABLE_HANDLE;
    }
    uint32_t id = 0;
    int rc = kvpool_mount_segment (self, segment_name (segment), size, &id);
    if (rc != KVPOOL_OK) {
        segment_destroy (&segment);
        return rc;
    }
    self->memory[self->memory_count].id = id;
    self->memory[self->memory_count].segment = segment;
    self->memory_count++;
    *id_p = id;
    if (name_p)
        *name_p = segment_name (segment);
    return KVPOOL_OK;
}

int
kvpool_unmount_memory (kvpool_t *self, uint32_t id)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    for (size_t i = 0; i < self->memory_count; i++) {
        if (self->memory[i].id != id)
            continue;
        //  On failure (no answer) the memory stays given; the caller may try again.
        int rc = kvpool_unmount_segment (self, id);
        if (rc != KVPOOL_OK && rc != KVPOOL_SEGMENT_NOT_FOUND)
            return rc;
        segment_destroy (&self->memory[i].segment);
        self->memory[i] = self->memory[--self->memory_count];
        return KVPOOL_OK;
    }
    kvpc_set_error (self, "segment %u is not memory this connection gave", id);
    return KVPOOL_SEGMENT_NOT_FOUND;
}

void
kvpc_memory_release_all (kvpool_t *self)
{
    //  Best effort: if the node does not answer, it unmounts the segment itself once this
    //  process is gone. Letting go here never pulls memory from under it: the node maps the
    //  memfd itself, and the kernel keeps the pages while any mapping remains.
    for (size_t i = 0; i < self->memory_count; i++) {
        kvpool_unmount_segment (self, self->memory[i].id);
        segment_destroy (&self->memory[i].segment);
    }
    free (self->memory);
    self->memory = NULL;
    self->memory_count = 0;
}
