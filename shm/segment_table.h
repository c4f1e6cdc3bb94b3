/*  segment_table.h - the segments one process maps to reach values another process placed:
    segment id -> mapping.

    The node's api actor maps the node's segments with it, to answer small reads straight
    from the read index. (A same-machine client maps them too, once per process, through
    client/process.c and client/segment_view.c; it shares only the listing's type,
    segment_listing_t, with this table.) The table learns the segments from a listing (id,
    name, size) and keeps itself in step with it: a segment
    that did not change keeps its mapping, a new one is mapped (segment_open), a gone one is
    unmapped. A mapping is the table's own, so it stays valid while the table holds it, even
    after the node has unmounted the segment. Offsets are checked against the segment's
    size: resolve never returns memory outside a mapping.

    Threads: one at a time.
*/
#ifndef SEGMENT_TABLE_H_INCLUDED
#define SEGMENT_TABLE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  One segment of a listing.
typedef struct {
    uint32_t id;
    const char *name;
    uint64_t size;
    //  The object as the node mapped it (both 0: not checked). A name of the form
    //  /proc/<pid>/fd/<fd> can come to mean another file once its owner closes that
    //  descriptor; an object found by name with another identity is not mapped.
    uint64_t device, inode;
    bool required; //  the update fails if this one cannot be mapped
} segment_listing_t;

typedef struct _segment_table_t segment_table_t;

//  Creates an empty table. Caller owns the return value.
segment_table_t *segment_table_new (void);

//  Unmaps everything. Does nothing on NULL; sets *self_p to NULL.
void segment_table_destroy (segment_table_t **self_p);

//  Makes the table match the listing. With keep, mappings of segments listed again with the
//  same id, name and size are reused; without, everything is mapped afresh (ids from another
//  node mean other memory). A segment that cannot be mapped stays in the table unmapped (its
//  values are out of reach), unless it is required: then the update fails. Returns 0, or -1
//  with the table unchanged and the failed segment's id in *failed_id (when not NULL).
int segment_table_update (segment_table_t *self, const segment_listing_t *listing, size_t count,
                          bool keep, uint32_t *failed_id);

//  Unmaps everything; the table is empty.
void segment_table_clear (segment_table_t *self);

//  Where size bytes at offset of segment id are in this process, or NULL when the segment
//  is unknown or unmapped or the range does not fit in it.
void *segment_table_resolve (segment_table_t *self, uint32_t id, uint64_t offset, uint64_t size);

//  Whether segment id is in the table (mapped or not).
bool segment_table_knows (segment_table_t *self, uint32_t id);

//  Number of segments in the table.
size_t segment_table_size (segment_table_t *self);

void segment_table_test (bool verbose);

#endif
