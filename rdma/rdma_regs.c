/*  rdma_regs.c - a table of registered memory regions (see rdma_regs.h).

    The regions sit in one array sorted by address. Since they never overlap, their ends are
    sorted too, so the region that could hold an address is the last one starting at or below
    it: one binary search answers find, and the same search tells add where a new region goes
    and which two neighbours it could overlap. Add and remove move the tail of the array
    (memmove); tables are small and change rarely (a segment mounted or dropped), lookups are
    per work request.
*/
#include "rdma/rdma_regs.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct _kvp_rdma_regs_t {
    kvp_rdma_region_t *regions; //  sorted by addr
    size_t count;
    size_t capacity;
};

kvp_rdma_regs_t *
kvp_rdma_regs_new (void)
{
    return (kvp_rdma_regs_t *) calloc (1, sizeof (kvp_rdma_regs_t));
}

void
kvp_rdma_regs_destroy (kvp_rdma_regs_t **self_p)
{
    assert (self_p);
    if (*self_p) {
        free ((*self_p)->regions);
        free (*self_p);
        *self_p = NULL;
    }
}

//  Index of the first region whose addr is above addr (count if none).
static size_t
s_upper_bound (const kvp_rdma_regs_t *self, uint64_t addr)
{
    size_t lo = 0, hi = self->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (self->regions[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static uint64_t
s_end (const kvp_rdma_region_t *region)
{
    return region->addr + region->len; //  no overflow: add checks it
}

static void
s_set_reason (const char **reason_p, const char *reason)
{
    if (reason_p)
        *reason_p = reason;
}

int
kvp_rdma_regs_add (kvp_rdma_regs_t *self, const kvp_rdma_region_t *region, const char **reason_p)
{
    assert (self);
    assert (region);
    if (region->len == 0) {
        s_set_reason (reason_p, "region has zero length");
        return -1;
    }
    if (region->len > UINT64_MAX - region->addr) {
        s_set_reason (reason_p, "region wraps past the end of the address space");
        return -1;
    }
    if (kvp_rdma_regs_by_id (self, region->id)) {
        s_set_reason (reason_p, "segment id already registered");
        return -1;
    }
    size_t at = s_upper_bound (self, region->addr);
    //  Only the neighbours can overlap: the one before must end at or below the new start,
    //  the one after must start at or above the new end.
    if ((at > 0 && s_end (&self->regions[at - 1]) > region->addr)
        || (at < self->count && self->regions[at].addr < s_end (region))) {
        s_set_reason (reason_p, "region overlaps a registered region");
        return -1;
    }
    if (self->count == KVP_RDMA_REGS_MAX) {
        s_set_reason (reason_p, "too many registered regions");
        return -1;
    }
    if (self->count == self->capacity) {
        size_t capacity = self->capacity ? self->capacity * 2 : 8;
        kvp_rdma_region_t *regions =
            (kvp_rdma_region_t *) realloc (self->regions, capacity * sizeof *regions);
        if (!regions) {
            s_set_reason (reason_p, "out of memory");
            return -1;
        }
        self->regions = regions;
        self->capacity = capacity;
    }
    memmove (&self->regions[at + 1], &self->regions[at],
             (self->count - at) * sizeof *self->regions);
    self->regions[at] = *region;
    self->count++;
    return 0;
}

int
kvp_rdma_regs_remove (kvp_rdma_regs_t *self, uint32_t id, kvp_rdma_region_t *removed)
{
    assert (self);
    const kvp_rdma_region_t *region = kvp_rdma_regs_by_id (self, id);
    if (!region)
        return -1;
    size_t at = (size_t) (region - self->regions);
    if (removed)
        *removed = *region;
    memmove (&self->regions[at], &self->regions[at + 1],
             (self->count - at - 1) * sizeof *self->regions);
    self->count--;
    return 0;
}

const kvp_rdma_region_t *
kvp_rdma_regs_find (const kvp_rdma_regs_t *self, uint64_t addr, uint64_t len)
{
    assert (self);
    size_t at = s_upper_bound (self, addr);
    if (at == 0)
        return NULL;
    const kvp_rdma_region_t *region = &self->regions[at - 1];
    uint64_t end = s_end (region);
    if (addr >= end)
        return NULL; //  in the gap after it
    if (len > end - addr)
        return NULL; //  runs past its end
    return region;
}

const kvp_rdma_region_t *
kvp_rdma_regs_by_id (const kvp_rdma_regs_t *self, uint32_t id)
{
    assert (self);
    for (size_t i = 0; i < self->count; i++)
        if (self->regions[i].id == id)
            return &self->regions[i];
    return NULL;
}

size_t
kvp_rdma_regs_count (const kvp_rdma_regs_t *self)
{
    assert (self);
    return self->count;
}

const kvp_rdma_region_t *
kvp_rdma_regs_at (const kvp_rdma_regs_t *self, size_t index)
{
    assert (self);
    return index < self->count ? &self->regions[index] : NULL;
}

//  ---- self test -----------------------------------------------------------------------

static kvp_rdma_region_t
s_region (uint32_t id, uint64_t addr, uint64_t len)
{
    kvp_rdma_region_t region = {id, addr, len, 0x1000 + id, 0x2000 + id, NULL};
    return region;
}

static int
s_add (kvp_rdma_regs_t *regs, uint32_t id, uint64_t addr, uint64_t len, const char **reason_p)
{
    kvp_rdma_region_t region = s_region (id, addr, len);
    return kvp_rdma_regs_add (regs, &region, reason_p);
}

//  The answer find must give, by looking at every region.
static const kvp_rdma_region_t *
s_reference_find (const kvp_rdma_regs_t *regs, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < kvp_rdma_regs_count (regs); i++) {
        const kvp_rdma_region_t *r = kvp_rdma_regs_at (regs, i);
        if (addr >= r->addr && addr - r->addr < r->len)
            return len <= r->len - (addr - r->addr) ? r : NULL;
    }
    return NULL;
}

static uint64_t
s_rand (uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

void
kvp_rdma_regs_test (bool verbose)
{
    const char *reason = NULL;
    kvp_rdma_regs_t *regs = kvp_rdma_regs_new ();
    assert (regs);
    assert (kvp_rdma_regs_count (regs) == 0);
    assert (kvp_rdma_regs_find (regs, 0, 0) == NULL);
    assert (kvp_rdma_regs_at (regs, 0) == NULL);

    //  [1000, 2000) id 1, [3000, 4000) id 2, [2000, 3000) id 3: touching is not overlapping.
    assert (s_add (regs, 1, 1000, 1000, &reason) == 0);
    assert (s_add (regs, 2, 3000, 1000, &reason) == 0);
    assert (s_add (regs, 3, 2000, 1000, &reason) == 0);
    assert (kvp_rdma_regs_count (regs) == 3);
    assert (kvp_rdma_regs_at (regs, 0)->id == 1);
    assert (kvp_rdma_regs_at (regs, 1)->id == 3);
    assert (kvp_rdma_regs_at (regs, 2)->id == 2);
    assert (kvp_rdma_regs_at (regs, 3) == NULL);
    assert (kvp_rdma_regs_at (regs, 1)->lkey == 0x1003
            && kvp_rdma_regs_at (regs, 1)->rkey == 0x2003);

    //  Refused: zero length, wrap, duplicate id, each kind of overlap.
    reason = NULL;
    assert (s_add (regs, 9, 5000, 0, &reason) == -1 && strstr (reason, "zero length"));
    assert (s_add (regs, 9, UINT64_MAX - 10, 12, &reason) == -1 && strstr (reason, "wraps"));
    assert (s_add (regs, 9, UINT64_MAX - 10, 10, &reason) == 0); //  ends exactly at 2^64 - 1
    assert (kvp_rdma_regs_find (regs, UINT64_MAX - 1, 1)->id == 9);
    assert (kvp_rdma_regs_find (regs, UINT64_MAX - 1, 2) == NULL);
    assert (kvp_rdma_regs_remove (regs, 9, NULL) == 0);
    assert (s_add (regs, 1, 9000, 10, &reason) == -1 && strstr (reason, "id already"));
    assert (s_add (regs, 10, 500, 501, &reason) == -1 && strstr (reason, "overlaps"));
    assert (s_add (regs, 10, 3999, 10, &reason) == -1 && strstr (reason, "overlaps"));
    assert (s_add (regs, 10, 1500, 10, &reason) == -1 && strstr (reason, "overlaps"));
    assert (s_add (regs, 10, 0, 10000, &reason) == -1 && strstr (reason, "overlaps"));
    assert (s_add (regs, 10, 1000, 1000, &reason) == -1 && strstr (reason, "overlaps"));
    assert (s_add (regs, 10, 500, 500, &reason) == 0); //  [500, 1000) touches [1000, ...)
    assert (kvp_rdma_regs_remove (regs, 10, NULL) == 0);
    assert (kvp_rdma_regs_count (regs) == 3);

    //  Find: inside, at both edges, crossing an end (even into the next region), in gaps.
    assert (kvp_rdma_regs_find (regs, 1000, 1000)->id == 1);
    assert (kvp_rdma_regs_find (regs, 1999, 1)->id == 1);
    assert (kvp_rdma_regs_find (regs, 1999, 2) == NULL);
    assert (kvp_rdma_regs_find (regs, 2000, 0)->id == 3);
    assert (kvp_rdma_regs_find (regs, 3500, 500)->id == 2);
    assert (kvp_rdma_regs_find (regs, 3500, 501) == NULL);
    assert (kvp_rdma_regs_find (regs, 999, 1) == NULL);
    assert (kvp_rdma_regs_find (regs, 4000, 0) == NULL);
    assert (kvp_rdma_regs_find (regs, 1500, UINT64_MAX) == NULL);
    assert (kvp_rdma_regs_by_id (regs, 2)->addr == 3000);
    assert (kvp_rdma_regs_by_id (regs, 4) == NULL);

    //  Remove hands back the region; a second remove fails; its range is free again.
    kvp_rdma_region_t removed;
    assert (kvp_rdma_regs_remove (regs, 3, &removed) == 0);
    assert (removed.id == 3 && removed.addr == 2000 && removed.len == 1000);
    assert (kvp_rdma_regs_remove (regs, 3, NULL) == -1);
    assert (kvp_rdma_regs_find (regs, 2500, 0) == NULL);
    assert (kvp_rdma_regs_at (regs, 1)->id == 2);
    assert (s_add (regs, 4, 2100, 100, NULL) == 0);
    assert (kvp_rdma_regs_find (regs, 2150, 50)->id == 4);
    kvp_rdma_regs_destroy (&regs);
    assert (regs == NULL);
    kvp_rdma_regs_destroy (&regs);

    //  Random adds, removes and finds, checked against a scan of every region.
    regs = kvp_rdma_regs_new ();
    uint64_t state = 0x9e3779b97f4a7c15ULL;
    size_t adds = 0, refused = 0, hits = 0;
    for (int round = 0; round < 20000; round++) {
        uint64_t addr = s_rand (&state) % 100000;
        uint64_t len = s_rand (&state) % 3000;
        uint32_t id = (uint32_t) (s_rand (&state) % 200);
        int op = (int) (s_rand (&state) % 4);
        if (op == 0) {
            //  Would it overlap, by brute force?
            bool clash = len == 0 || kvp_rdma_regs_by_id (regs, id);
            for (size_t i = 0; !clash && i < kvp_rdma_regs_count (regs); i++) {
                const kvp_rdma_region_t *r = kvp_rdma_regs_at (regs, i);
                clash = addr < r->addr + r->len && r->addr < addr + len;
            }
            int rc = s_add (regs, id, addr, len, NULL);
            assert (rc == (clash ? -1 : 0));
            adds += rc == 0;
            refused += rc != 0;
        }
        else if (op == 1) {
            bool had = kvp_rdma_regs_by_id (regs, id) != NULL;
            assert (kvp_rdma_regs_remove (regs, id, NULL) == (had ? 0 : -1));
        }
        else {
            const kvp_rdma_region_t *found = kvp_rdma_regs_find (regs, addr, len % 500);
            assert (found == s_reference_find (regs, addr, len % 500));
            hits += found != NULL;
        }
        for (size_t i = 1; i < kvp_rdma_regs_count (regs); i++)
            assert (kvp_rdma_regs_at (regs, i - 1)->addr + kvp_rdma_regs_at (regs, i - 1)->len
                    <= kvp_rdma_regs_at (regs, i)->addr);
    }
    assert (adds > 100 && refused > 100 && hits > 100);
    kvp_rdma_regs_destroy (&regs);

    //  The table is bounded.
    regs = kvp_rdma_regs_new ();
    for (uint32_t i = 0; i < KVP_RDMA_REGS_MAX; i++)
        assert (s_add (regs, i, (uint64_t) i * 4096, 4096, NULL) == 0);
    assert (s_add (regs, KVP_RDMA_REGS_MAX, 1ULL << 40, 4096, &reason) == -1);
    assert (strstr (reason, "too many"));
    assert (kvp_rdma_regs_find (regs, 4096ULL * 1234 + 7, 100)->id == 1234);
    kvp_rdma_regs_destroy (&regs);
    if (verbose)
        printf ("(%zu adds, %zu refused, %zu hits) ", adds, refused, hits);
}
