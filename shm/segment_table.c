/*  segment_table.c - segment id -> this process's mapping of it (see segment_table.h).

    A flat array in listing order: a node has a handful of segments, so a linear scan beats
    any structure, and an update builds the new array beside the old one so that a failed
    update leaves the table as it was.
*/
#include "shm/segment_table.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shm/segment.h"

typedef struct {
    uint32_t id;
    char name[256];
    uint64_t size;
    uint64_t device, inode; //  as listed
    segment_t *map;         //  NULL when it could not be mapped
} s_entry_t;

struct _segment_table_t {
    s_entry_t *entries;
    size_t count;
};

static void
s_entries_free (s_entry_t *entries, size_t count)
{
    for (size_t i = 0; i < count; i++)
        segment_destroy (&entries[i].map);
    free (entries);
}

segment_table_t *
segment_table_new (void)
{
    return (segment_table_t *) calloc (1, sizeof (segment_table_t));
}

void
segment_table_destroy (segment_table_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    segment_table_clear (*self_p);
    free (*self_p);
    *self_p = NULL;
}

void
segment_table_clear (segment_table_t *self)
{
    assert (self);
    s_entries_free (self->entries, self->count);
    self->entries = NULL;
    self->count = 0;
}

int
segment_table_update (segment_table_t *self, const segment_listing_t *listing, size_t count,
                      bool keep, uint32_t *failed_id)
{
    assert (self);
    s_entry_t *entries = (s_entry_t *) calloc (count ? count : 1, sizeof *entries);
    if (!entries)
        return -1;
    for (size_t i = 0; i < count; i++) {
        const segment_listing_t *from = &listing[i];
        s_entry_t *to = &entries[i];
        to->id = from->id;
        to->size = from->size;
        to->device = from->device;
        to->inode = from->inode;
        size_t len = from->name ? strlen (from->name) : 0;
        bool usable = len > 0 && len < sizeof to->name && from->size > 0 && from->size <= SIZE_MAX;
        if (usable)
            memcpy (to->name, from->name, len + 1);
        for (size_t k = 0; usable && keep && k < self->count; k++) {
            s_entry_t *old = &self->entries[k];
            if (old->map && old->id == to->id && old->size == to->size && old->device == to->device
                && old->inode == to->inode && strcmp (old->name, to->name) == 0) {
                to->map = old->map;
                old->map = NULL;
                break;
            }
        }
        if (usable && !to->map)
            to->map = segment_open (to->name, (size_t) to->size);
        if (to->map && (to->device || to->inode)) {
            uint64_t device, inode;
            segment_identity (to->map, &device, &inode);
            if (device != to->device || inode != to->inode)
                segment_destroy (&to->map); //  the name now means another object
        }
        if (from->required && !to->map) {
            if (failed_id)
                *failed_id = from->id;
            //  Hand the reused mappings back before giving up.
            for (size_t j = 0; j <= i; j++)
                for (size_t k = 0; entries[j].map && k < self->count; k++)
                    if (!self->entries[k].map && self->entries[k].id == entries[j].id
                        && strcmp (self->entries[k].name, entries[j].name) == 0) {
                        self->entries[k].map = entries[j].map;
                        entries[j].map = NULL;
                    }
            s_entries_free (entries, count);
            return -1;
        }
    }
    s_entries_free (self->entries, self->count);
    self->entries = entries;
    self->count = count;
    return 0;
}

void *
segment_table_resolve (segment_table_t *self, uint32_t id, uint64_t offset, uint64_t size)
{
    assert (self);
    for (size_t i = 0; i < self->count; i++) {
        s_entry_t *entry = &self->entries[i];
        if (entry->id != id)
            continue;
        if (!entry->map || offset > entry->size || size > entry->size - offset)
            return NULL;
        return (char *) segment_base (entry->map) + offset;
    }
    return NULL;
}

bool
segment_table_knows (segment_table_t *self, uint32_t id)
{
    assert (self);
    for (size_t i = 0; i < self->count; i++)
        if (self->entries[i].id == id)
            return true;
    return false;
}

size_t
segment_table_size (segment_table_t *self)
{
    assert (self);
    return self->count;
}

//  --------------------------------------------------------------------------
//  Self test

void
segment_table_test (bool verbose)
{
    if (verbose)
        printf ("\n * segment_table: ");
    char a_name[64], b_name[64];
    segment_make_name (a_name, sizeof a_name, "stt-a", 0);
    segment_make_name (b_name, sizeof b_name, "stt-b", 0);
    segment_t *a = segment_new (a_name, 1 << 20, false);
    segment_t *b = segment_new (b_name, 1 << 20, false);
    assert (a && b);
    memcpy ((char *) segment_base (a) + 100, "alpha", 5);
    memcpy ((char *) segment_base (b) + 200, "beta", 4);

    segment_table_t *table = segment_table_new ();
    assert (table && segment_table_size (table) == 0);
    assert (segment_table_resolve (table, 1, 0, 1) == NULL);
    segment_listing_t listing[] = {{.id = 1, .name = a_name, .size = 1 << 20, .required = true},
                                   {.id = 2, .name = b_name, .size = 1 << 20, .required = true}};
    assert (segment_table_update (table, listing, 2, true, NULL) == 0);
    assert (segment_table_size (table) == 2 && segment_table_knows (table, 2));
    char *alpha = (char *) segment_table_resolve (table, 1, 100, 5);
    assert (alpha && memcmp (alpha, "alpha", 5) == 0);
    assert (memcmp (segment_table_resolve (table, 2, 200, 4), "beta", 4) == 0);
    //  Ranges outside a segment, and unknown ids, resolve to nothing.
    assert (segment_table_resolve (table, 1, 1 << 20, 1) == NULL);
    assert (segment_table_resolve (table, 1, (1 << 20) - 4, 5) == NULL);
    assert (segment_table_resolve (table, 1, UINT64_MAX, 2) == NULL);
    assert (segment_table_resolve (table, 3, 0, 1) == NULL && !segment_table_knows (table, 3));

    //  Listed again unchanged: the same mapping. Without keep: a new one.
    assert (segment_table_update (table, listing, 2, true, NULL) == 0);
    assert (segment_table_resolve (table, 1, 100, 5) == alpha);
    assert (segment_table_update (table, listing, 1, false, NULL) == 0);
    assert (segment_table_size (table) == 1 && !segment_table_knows (table, 2));
    char *alpha2 = (char *) segment_table_resolve (table, 1, 100, 5);
    assert (alpha2 && memcmp (alpha2, "alpha", 5) == 0);

    //  A segment that can't be mapped: kept unmapped, or failing the update when required
    //  (the table is then unchanged).
    segment_listing_t bad[] = {{.id = 1, .name = a_name, .size = 1 << 20, .required = true},
                               {.id = 5, .name = "/kvpool-stt-none", .size = 4096}};
    assert (segment_table_update (table, bad, 2, true, NULL) == 0);
    assert (segment_table_knows (table, 5) && segment_table_resolve (table, 5, 0, 1) == NULL);
    assert (segment_table_resolve (table, 1, 100, 5) == alpha2);
    bad[1].required = true;
    uint32_t failed = 0;
    assert (segment_table_update (table, bad, 2, true, &failed) == -1 && failed == 5);
    assert (segment_table_size (table) == 2);
    assert (segment_table_resolve (table, 1, 100, 5) == alpha2);

    //  A mapping outlives the segment's creator (the node unmounting it).
    segment_destroy (&a);
    assert (memcmp (segment_table_resolve (table, 1, 100, 5), "alpha", 5) == 0);
    segment_table_clear (table);
    assert (segment_table_size (table) == 0);

    //  A /proc/<pid>/fd/<fd> name whose owner closed the descriptor can name another file
    //  later (the next one opened takes the number): with the identity the node listed, the
    //  stranger is not mapped.
    segment_t *given = segment_new_sealed (1 << 20, "stt-given");
    assert (given);
    segment_listing_t fd_listing = {.id = 9, .size = 1 << 20};
    char fd_name[64];
    snprintf (fd_name, sizeof fd_name, "%s", segment_name (given));
    fd_listing.name = fd_name;
    segment_identity (given, &fd_listing.device, &fd_listing.inode);
    assert (segment_table_update (table, &fd_listing, 1, true, NULL) == 0);
    assert (segment_table_resolve (table, 9, 0, 1) != NULL);
    segment_table_clear (table);
    segment_destroy (&given);
    segment_t *stranger = segment_new_sealed (1 << 20, "stt-stranger");
    assert (stranger);
    if (strcmp (segment_name (stranger), fd_name) == 0) { //  the number was reused, as feared
        assert (segment_table_update (table, &fd_listing, 1, true, NULL) == 0);
        assert (segment_table_knows (table, 9) && segment_table_resolve (table, 9, 0, 1) == NULL);
        fd_listing.required = true;
        assert (segment_table_update (table, &fd_listing, 1, true, NULL) == -1);
        if (verbose)
            printf ("a reused descriptor name refused; ");
    }
    segment_destroy (&stranger);
    segment_table_destroy (&table);
    segment_table_destroy (&table);
    segment_destroy (&b);
    if (verbose)
        printf ("done\n");
}
