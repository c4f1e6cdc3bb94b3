/*  memory.c - memory a client gives the pool (memory.h).

    Mooncake's embedded client contributes a global segment of its own memory at setup;
    this is that, for C. The memory is a memfd made by segment_new_sealed (pages committed,
    sealed against shrinking and growing: the only memory a node mounts, see segment.h),
    mapped here for the fast path's copies and mounted at the node under the connection's
    owner name. Giving it back unmounts it first, so the node has removed every object in
    it and stopped using it before this process lets go of the memory. If the process dies
    instead, the node sees the owner gone, unmounts the segment, and the kernel frees it.
*/
#include "client/memory.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/socket_ops.h"
#include "shm/segment.h"

//  One piece of memory given: its segment here, its id at the node.
typedef struct {
    uint32_t id;
    segment_t *segment;
} s_piece_t;

struct _kvpc_memory_t {
    kvpc_conn_t *conn;
    s_piece_t *pieces;
    size_t count;
};

kvpc_memory_t *
kvpc_memory_new (kvpc_conn_t *conn)
{
    kvpc_memory_t *self = calloc (1, sizeof *self);
    if (self)
        self->conn = conn;
    return self;
}

void
kvpc_memory_destroy (kvpc_memory_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpc_memory_t *self = *self_p;
    //  Best effort: if the node does not answer, it unmounts the segment itself once this
    //  process is gone. Letting go here never pulls memory from under it: the node maps the
    //  memfd itself, and the kernel keeps the pages while any mapping remains.
    for (size_t i = 0; i < self->count; i++) {
        kvpc_socket_unmount (self->conn, self->pieces[i].id);
        segment_destroy (&self->pieces[i].segment);
    }
    free (self->pieces);
    free (self);
    *self_p = NULL;
}

int
kvpc_memory_give (kvpc_memory_t *self, uint64_t size, uint32_t *id_p, const char **name_p)
{
    if (!kvpc_conn_same_host (self->conn)) {
        kvpc_set_error (self->conn,
                        "the node at %s is not on this machine: it can't map our memory",
                        kvpc_conn_endpoint (self->conn));
        return KVPOOL_INVALID_PARAMS;
    }
    s_piece_t *grown = (s_piece_t *) realloc (self->pieces, (self->count + 1) * sizeof *grown);
    if (!grown)
        return KVPOOL_INTERNAL_ERROR;
    self->pieces = grown;
    segment_t *segment = segment_new_sealed ((size_t) size, "kvpool-client");
    if (!segment) {
        kvpc_set_error (self->conn, "cannot make %llu bytes of memory to give: %s",
                        (unsigned long long) size, strerror (errno));
        return KVPOOL_NO_AVAILABLE_HANDLE;
    }
    uint32_t id = 0;
    int rc = kvpc_socket_mount (self->conn, segment_name (segment), size, &id);
    if (rc != KVPOOL_OK) {
        segment_destroy (&segment);
        return rc;
    }
    self->pieces[self->count].id = id;
    self->pieces[self->count].segment = segment;
    self->count++;
    *id_p = id;
    if (name_p)
        *name_p = segment_name (segment);
    return KVPOOL_OK;
}

int
kvpc_memory_take_back (kvpc_memory_t *self, uint32_t id)
{
    for (size_t i = 0; i < self->count; i++) {
        if (self->pieces[i].id != id)
            continue;
        //  On failure (no answer) the memory stays given; the caller may try again.
        int rc = kvpc_socket_unmount (self->conn, id);
        if (rc != KVPOOL_OK && rc != KVPOOL_SEGMENT_NOT_FOUND)
            return rc;
        segment_destroy (&self->pieces[i].segment);
        self->pieces[i] = self->pieces[--self->count];
        return KVPOOL_OK;
    }
    kvpc_set_error (self->conn, "segment %u is not memory this connection gave", id);
    return KVPOOL_SEGMENT_NOT_FOUND;
}
