/*  memory.h - memory a client gives the pool (kvpool_mount_memory, kvpool_unmount_memory):
    sealed memfds of this process, mounted at the node as segments owned by the connection.
    Above connection.h and socket_ops.h (MOUNT_SEGMENT, UNMOUNT_SEGMENT); the public API uses
    it.
*/
#ifndef KVPC_MEMORY_H_INCLUDED
#define KVPC_MEMORY_H_INCLUDED

#include <stdint.h>

#include "client/connection.h"

//  The pieces of memory one connection gave.
typedef struct _kvpc_memory_t kvpc_memory_t;

//  No memory given yet. Returns NULL when out of memory. Caller owns the return value and
//  must destroy it (before conn).
kvpc_memory_t *kvpc_memory_new (kvpc_conn_t *conn);
//  Gives back every piece still given (best effort: the node may not answer), then frees
//  self. Does nothing on NULL; sets *self_p to NULL.
void kvpc_memory_destroy (kvpc_memory_t **self_p);
//  Makes size bytes of memory and has the node mount them. On success *id_p is the segment
//  id and *name_p (when not NULL) its name, valid until it is given back. Returns 0 or a
//  negative status.
int kvpc_memory_give (kvpc_memory_t *self, uint64_t size, uint32_t *id_p, const char **name_p);
//  Has the node unmount segment id, then frees its memory. SEGMENT_NOT_FOUND if id is not
//  memory self gave.
int kvpc_memory_take_back (kvpc_memory_t *self, uint32_t id);

#endif
