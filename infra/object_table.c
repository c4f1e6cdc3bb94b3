/*  object_table.c - open addressing key -> entry table (object_table.h). */
#include "infra/object_table.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shm/shm_index.h"

typedef struct {
    uint64_t hash;
    void *entry; //  NULL: free
} slot_t;

struct _object_table_t {
    object_table_key_fn *key_of;
    slot_t *slots;
    size_t mask; //  capacity - 1 (a power of two)
    size_t size;
    size_t cursor; //  iteration: the next slot to look at
};

#define MIN_CAPACITY 1024

static uint64_t
s_hash (const char *key)
{
    return shm_index_hash (key, strlen (key));
}

object_table_t *
object_table_new (object_table_key_fn *key_of)
{
    object_table_t *self = (object_table_t *) calloc (1, sizeof (object_table_t));
    if (!self)
        return NULL;
    self->key_of = key_of;
    self->slots = (slot_t *) calloc (MIN_CAPACITY, sizeof (slot_t));
    if (!self->slots) {
        free (self);
        return NULL;
    }
    self->mask = MIN_CAPACITY - 1;
    return self;
}

void
object_table_destroy (object_table_t **self_p)
{
    if (*self_p) {
        free ((*self_p)->slots);
        free (*self_p);
        *self_p = NULL;
    }
}

//  Places (hash, entry) in the first free slot of its run.
static void
s_place (slot_t *slots, size_t mask, uint64_t hash, void *entry)
{
    size_t i = (size_t) hash & mask;
    while (slots[i].entry)
        i = (i + 1) & mask;
    slots[i].hash = hash;
    slots[i].entry = entry;
}

static int
s_grow (object_table_t *self)
{
    size_t capacity = (self->mask + 1) * 2;
    slot_t *slots = (slot_t *) calloc (capacity, sizeof (slot_t));
    if (!slots)
        return -1;
    for (size_t i = 0; i <= self->mask; i++)
        if (self->slots[i].entry)
            s_place (slots, capacity - 1, self->slots[i].hash, self->slots[i].entry);
    free (self->slots);
    self->slots = slots;
    self->mask = capacity - 1;
    return 0;
}

void *
object_table_lookup (object_table_t *self, const char *key)
{
    uint64_t hash = s_hash (key);
    for (size_t i = (size_t) hash & self->mask; self->slots[i].entry; i = (i + 1) & self->mask)
        if (self->slots[i].hash == hash && strcmp (self->key_of (self->slots[i].entry), key) == 0)
            return self->slots[i].entry;
    return NULL;
}

int
object_table_insert (object_table_t *self, void *entry)
{
    assert (entry);
    //  Grown at 70% load: runs stay short.
    if ((self->size + 1) * 10 > (self->mask + 1) * 7 && s_grow (self) == -1)
        return -1;
    s_place (self->slots, self->mask, s_hash (self->key_of (entry)), entry);
    self->size++;
    return 0;
}

void
object_table_delete (object_table_t *self, void *entry)
{
    uint64_t hash = s_hash (self->key_of (entry));
    size_t i = (size_t) hash & self->mask;
    while (self->slots[i].entry && self->slots[i].entry != entry)
        i = (i + 1) & self->mask;
    if (!self->slots[i].entry)
        return;
    //  Backward shift: later slots of the run whose home is at or before the hole move into
    //  it, so that no lookup's run is cut short.
    size_t hole = i;
    for (size_t j = (i + 1) & self->mask; self->slots[j].entry; j = (j + 1) & self->mask) {
        size_t home = (size_t) self->slots[j].hash & self->mask;
        //  Whether home lies cyclically in (hole, j]: then the slot stays.
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            self->slots[hole] = self->slots[j];
            hole = j;
        }
    }
    self->slots[hole].entry = NULL;
    self->slots[hole].hash = 0;
    self->size--;
}

size_t
object_table_size (object_table_t *self)
{
    return self->size;
}

void *
object_table_next (object_table_t *self)
{
    while (self->cursor <= self->mask) {
        void *entry = self->slots[self->cursor++].entry;
        if (entry)
            return entry;
    }
    return NULL;
}

void *
object_table_walk (object_table_t *self, size_t *slot)
{
    while (*slot <= self->mask) {
        void *entry = self->slots[(*slot)++].entry;
        if (entry)
            return entry;
    }
    return NULL;
}

void *
object_table_first (object_table_t *self)
{
    self->cursor = 0;
    return object_table_next (self);
}

//  ---- self test ---------------------------------------------------------------------

typedef struct {
    char key[24];
} test_entry_t;

static const char *
s_test_key (const void *entry)
{
    return ((const test_entry_t *) entry)->key;
}

void
object_table_test (bool verbose)
{
    object_table_t *table = object_table_new (s_test_key);
    assert (table);
    enum { COUNT = 20000 };
    test_entry_t *entries = (test_entry_t *) calloc (COUNT, sizeof (test_entry_t));
    for (int i = 0; i < COUNT; i++) {
        snprintf (entries[i].key, sizeof entries[i].key, "key-%d", i);
        assert (object_table_insert (table, &entries[i]) == 0);
    }
    assert (object_table_size (table) == COUNT);
    for (int i = 0; i < COUNT; i++)
        assert (object_table_lookup (table, entries[i].key) == &entries[i]);
    assert (object_table_lookup (table, "key-none") == NULL);
    //  Deleting every third entry keeps every other one findable (backward shift).
    for (int i = 0; i < COUNT; i += 3)
        object_table_delete (table, &entries[i]);
    object_table_delete (table, &entries[0]); //  not there any more: nothing
    for (int i = 0; i < COUNT; i++)
        assert (object_table_lookup (table, entries[i].key) == (i % 3 ? &entries[i] : NULL));
    size_t seen = 0;
    for (void *entry = object_table_first (table); entry; entry = object_table_next (table)) {
        int index = (int) ((test_entry_t *) entry - entries);
        assert (index % 3 != 0);
        seen++;
    }
    assert (seen == object_table_size (table) && seen == COUNT - (COUNT + 2) / 3);
    //  Put back and deleted again in another order.
    for (int i = 0; i < COUNT; i += 3)
        assert (object_table_insert (table, &entries[i]) == 0);
    for (int i = COUNT - 1; i >= 0; i--) {
        assert (object_table_lookup (table, entries[i].key) == &entries[i]);
        object_table_delete (table, &entries[i]);
        assert (object_table_lookup (table, entries[i].key) == NULL);
    }
    assert (object_table_size (table) == 0 && object_table_first (table) == NULL);
    object_table_destroy (&table);
    free (entries);
    if (verbose)
        printf ("20000 keys inserted, found, deleted, iterated ");
}
