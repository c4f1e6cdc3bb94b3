/*  segment_view.c - segment id -> the process's shared mapping (segment_view.h).

    A flat array in listing order, as shm/segment_table.c keeps for the node: a node has a
    handful of segments, so a linear scan beats any structure. An update takes the new
    references before it lets go of the old ones, so a segment listed again is never
    unmapped in between, and a failed update leaves the view as it was.
*/
#include "client/segment_view.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint32_t id;
    uint64_t size;
    char *base;              //  the mapping's start, or NULL when unmapped
    kvpc_mapping_t *mapping; //  a reference to the process's mapping
} s_entry_t;

struct _kvpc_segment_view_t {
    kvpc_process_t *process;
    s_entry_t *entries;
    size_t count;
};

kvpc_segment_view_t *
kvpc_segment_view_new (kvpc_process_t *process)
{
    kvpc_segment_view_t *self = calloc (1, sizeof *self);
    if (self)
        self->process = process;
    return self;
}

static void
s_entries_free (kvpc_segment_view_t *self, s_entry_t *entries, size_t count)
{
    for (size_t i = 0; i < count; i++)
        kvpc_process_unmap (self->process, &entries[i].mapping);
    free (entries);
}

void
kvpc_segment_view_destroy (kvpc_segment_view_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpc_segment_view_clear (*self_p);
    free (*self_p);
    *self_p = NULL;
}

void
kvpc_segment_view_clear (kvpc_segment_view_t *self)
{
    s_entries_free (self, self->entries, self->count);
    self->entries = NULL;
    self->count = 0;
}

int
kvpc_segment_view_update (kvpc_segment_view_t *self, const char *node,
                          const segment_listing_t *listing, size_t count, uint32_t *failed_id)
{
    s_entry_t *entries = calloc (count ? count : 1, sizeof *entries);
    if (!entries)
        return -1;
    for (size_t i = 0; i < count; i++) {
        const segment_listing_t *from = &listing[i];
        s_entry_t *to = &entries[i];
        to->id = from->id;
        to->size = from->size;
        to->mapping = kvpc_process_map (self->process, node, from->name, from->size, from->device,
                                        from->inode);
        to->base = to->mapping ? kvpc_mapping_base (to->mapping) : NULL;
        if (from->required && !to->mapping) {
            if (failed_id)
                *failed_id = from->id;
            s_entries_free (self, entries, i);
            return -1;
        }
    }
    s_entries_free (self, self->entries, self->count);
    self->entries = entries;
    self->count = count;
    return 0;
}

void *
kvpc_segment_view_resolve (kvpc_segment_view_t *self, uint32_t id, uint64_t offset, uint64_t size)
{
    for (size_t i = 0; i < self->count; i++) {
        s_entry_t *entry = &self->entries[i];
        if (entry->id != id)
            continue;
        if (!entry->base || offset > entry->size || size > entry->size - offset)
            return NULL;
        return entry->base + offset;
    }
    return NULL;
}
