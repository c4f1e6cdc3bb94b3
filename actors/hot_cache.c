/*  hot_cache.c - the host hot cache's admission filter (hot_cache.h). */
#include "actors/hot_cache.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shm/shm_index.h"

#define SLOTS 65536
//  An admitted key is not admitted again this long after (its copy is being made).
#define COOLDOWN_MS 100

typedef struct {
    uint64_t hash;    //  0: empty
    uint32_t count;   //  reads in the window
    int64_t first_ms; //  the window's first read
    int64_t admitted; //  when it was last admitted (0: never)
} slot_t;

struct _hot_cache_t {
    uint64_t admit, window_ms;
    slot_t *slots;
};

hot_cache_t *
hot_cache_new (uint64_t admit, uint64_t window_ms)
{
    hot_cache_t *self = (hot_cache_t *) calloc (1, sizeof (hot_cache_t));
    if (!self || !(self->slots = (slot_t *) calloc (SLOTS, sizeof (slot_t)))) {
        free (self);
        return NULL;
    }
    hot_cache_set (self, admit, window_ms);
    return self;
}

void
hot_cache_destroy (hot_cache_t **self_p)
{
    hot_cache_t *self = *self_p;
    if (!self)
        return;
    free (self->slots);
    free (self);
    *self_p = NULL;
}

void
hot_cache_set (hot_cache_t *self, uint64_t admit, uint64_t window_ms)
{
    self->admit = admit ? admit : 1;
    self->window_ms = window_ms;
}

bool
hot_cache_read (hot_cache_t *self, const char *key, size_t key_len, int64_t now)
{
    uint64_t hash = shm_index_hash (key, key_len);
    slot_t *slot = &self->slots[hash & (SLOTS - 1)];
    if (slot->hash != hash || now - slot->first_ms > (int64_t) self->window_ms) {
        int64_t admitted = slot->hash == hash ? slot->admitted : 0;
        *slot = (slot_t){hash, 0, now, admitted};
    }
    if (slot->admitted && now - slot->admitted < COOLDOWN_MS)
        return false;
    if (++slot->count < self->admit)
        return false;
    slot->count = 0;
    slot->first_ms = now;
    slot->admitted = now;
    return true;
}

void
hot_cache_test (bool verbose)
{
    (void) verbose;
    hot_cache_t *cache = hot_cache_new (2, 1000);
    assert (cache);
    //  The second read within the window admits; the first does not.
    assert (!hot_cache_read (cache, "a", 1, 10000));
    assert (hot_cache_read (cache, "a", 1, 10500));
    //  Not again while its copy is made ...
    assert (!hot_cache_read (cache, "a", 1, 10550));
    assert (!hot_cache_read (cache, "a", 1, 10580));
    //  ... then again after two more reads.
    assert (!hot_cache_read (cache, "a", 1, 10700));
    assert (hot_cache_read (cache, "a", 1, 10800));
    //  Reads further apart than the window never add up.
    assert (!hot_cache_read (cache, "b", 1, 20000));
    assert (!hot_cache_read (cache, "b", 1, 21500));
    assert (hot_cache_read (cache, "b", 1, 21600));
    //  Admitting on the first read.
    hot_cache_set (cache, 1, 1000);
    assert (hot_cache_read (cache, "c", 1, 30000));
    hot_cache_destroy (&cache);
    assert (!cache);
}
