/*  segment_view.h - the node's segments as one connection sees them: segment id -> a
    mapping the process shares (process.h). Above process.h; the fast path resolves every
    replica's (segment id, offset) through it.

    Threads: one view per connection, used by the connection's thread.
*/
#ifndef KVPC_SEGMENT_VIEW_H_INCLUDED
#define KVPC_SEGMENT_VIEW_H_INCLUDED

#include <stdint.h>

#include "client/process.h"
#include "shm/segment_table.h"

typedef struct _kvpc_segment_view_t kvpc_segment_view_t;

//  An empty view, mapping through process. Returns NULL when out of memory. Caller owns the
//  return value and must destroy it.
kvpc_segment_view_t *kvpc_segment_view_new (kvpc_process_t *process);
//  Lets go of every mapping. Does nothing on NULL; sets *self_p to NULL.
void kvpc_segment_view_destroy (kvpc_segment_view_t **self_p);
//  Makes the view match node's listing (segment_listing_t as the node's api uses it): each
//  segment listed takes the process's mapping of it (made if no connection holds one), those
//  no longer listed are let go. A segment that cannot be mapped stays in the view unmapped,
//  unless it is required: then the update fails. Returns 0, or -1 with the view unchanged
//  and the failed segment's id in *failed_id (when not NULL).
int kvpc_segment_view_update (kvpc_segment_view_t *self, const char *node,
                              const segment_listing_t *listing, size_t count, uint32_t *failed_id);
//  Lets go of every mapping; the view is empty.
void kvpc_segment_view_clear (kvpc_segment_view_t *self);
//  Where size bytes at offset of segment id are in this process, or NULL when the segment is
//  unknown or unmapped or the range does not fit in it.
void *kvpc_segment_view_resolve (kvpc_segment_view_t *self, uint32_t id, uint64_t offset,
                                 uint64_t size);

#endif
