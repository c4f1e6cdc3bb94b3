/*  directory.c - the master's key -> holders table (directory.h). */
#include "master/directory.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infra/object_table.h"

struct _directory_t {
    object_table_t *table;
    size_t committed;
};

static const char *
s_key_of (const void *entry)
{
    return ((const dir_entry_t *) entry)->key;
}

directory_t *
directory_new (void)
{
    directory_t *self = (directory_t *) calloc (1, sizeof (directory_t));
    if (self && !(self->table = object_table_new (s_key_of))) {
        free (self);
        self = NULL;
    }
    return self;
}

void
directory_destroy (directory_t **self_p)
{
    directory_t *self = *self_p;
    if (!self)
        return;
    for (void *entry = object_table_first (self->table); entry;
         entry = object_table_next (self->table))
        free (entry);
    object_table_destroy (&self->table);
    free (self);
    *self_p = NULL;
}

dir_entry_t *
directory_find (directory_t *self, const char *key)
{
    return (dir_entry_t *) object_table_lookup (self->table, key);
}

static dir_entry_t *
s_entry_new (directory_t *self, const char *key, size_t key_len, uint64_t size)
{
    dir_entry_t *entry = (dir_entry_t *) malloc (sizeof (dir_entry_t) + key_len + 1);
    if (!entry)
        return NULL;
    memset (entry, 0, sizeof *entry);
    entry->size = size;
    memcpy (entry->key, key, key_len);
    entry->key[key_len] = 0;
    if (object_table_insert (self->table, entry) != 0) {
        free (entry);
        return NULL;
    }
    return entry;
}

dir_entry_t *
directory_reserve (directory_t *self, const char *key, size_t key_len, uint64_t size,
                   uint64_t token)
{
    dir_entry_t *entry = s_entry_new (self, key, key_len, size);
    if (entry) {
        entry->state = DIR_PENDING;
        entry->token = token;
    }
    return entry;
}

static bool
s_holds (const dir_entry_t *entry, uint16_t node)
{
    for (uint8_t i = 0; i < entry->holder_count; i++)
        if (entry->holders[i] == node)
            return true;
    return false;
}

bool
directory_holds (const dir_entry_t *entry, uint16_t node)
{
    return s_holds (entry, node);
}

//  Takes holder i out of entry: the last one takes its place, with its cache bit.
static void
s_take_holder (dir_entry_t *entry, uint8_t i)
{
    uint8_t last = --entry->holder_count;
    uint8_t last_bit = (entry->cache_mask >> last) & 1;
    entry->holders[i] = entry->holders[last];
    entry->cache_mask = (uint8_t) ((entry->cache_mask & ~(1u << i) & ~(1u << last))
                                   | (i != last ? last_bit << i : 0));
}

void
directory_commit (directory_t *self, dir_entry_t *entry, const uint16_t *holders, size_t count,
                  uint64_t token)
{
    if (entry->state != DIR_COMMITTED)
        self->committed++;
    entry->state = DIR_COMMITTED;
    entry->token = token;
    entry->holder_count = 0;
    entry->cache_mask = 0;
    for (size_t i = 0; i < count && entry->holder_count < KVP_MAX_REPLICAS; i++)
        if (!s_holds (entry, holders[i]))
            entry->holders[entry->holder_count++] = holders[i];
}

dir_entry_t *
directory_add_holder (directory_t *self, const char *key, size_t key_len, uint64_t size,
                      uint16_t node)
{
    dir_entry_t *entry = directory_find (self, key);
    if (!entry && !(entry = s_entry_new (self, key, key_len, size)))
        return NULL;
    if (entry->state != DIR_COMMITTED) {
        self->committed++;
        entry->state = DIR_COMMITTED;
        entry->token = 0;
        entry->size = size;
    }
    if (s_holds (entry, node))
        return entry;
    if (entry->holder_count == KVP_MAX_REPLICAS)
        return NULL;
    entry->holders[entry->holder_count++] = node;
    uint8_t replicas = directory_replicas (entry);
    if (entry->want < replicas)
        entry->want = replicas;
    return entry;
}

int
directory_add_replica (dir_entry_t *entry, uint16_t node)
{
    if (entry->state != DIR_COMMITTED)
        return -1;
    for (uint8_t i = 0; i < entry->holder_count; i++)
        if (entry->holders[i] == node) {
            entry->cache_mask &= (uint8_t) ~(1u << i);
            return 0;
        }
    if (entry->holder_count == KVP_MAX_REPLICAS)
        return -1;
    entry->holders[entry->holder_count++] = node;
    return 1;
}

uint8_t
directory_replicas (const dir_entry_t *entry)
{
    uint8_t count = 0;
    for (uint8_t i = 0; i < entry->holder_count; i++)
        count += !((entry->cache_mask >> i) & 1);
    return count;
}

int
directory_add_cache (dir_entry_t *entry, uint16_t node)
{
    if (entry->state != DIR_COMMITTED)
        return -1;
    for (uint8_t i = 0; i < entry->holder_count; i++)
        if (entry->holders[i] == node)
            return 0; //  a replica or a cache copy already
    if (entry->holder_count == KVP_MAX_REPLICAS)
        return -1;
    entry->cache_mask |= (uint8_t) (1u << entry->holder_count);
    entry->holders[entry->holder_count++] = node;
    return 0;
}

bool
directory_is_cache (const dir_entry_t *entry, uint8_t i)
{
    return (entry->cache_mask >> i) & 1;
}

void
directory_remove (directory_t *self, dir_entry_t *entry)
{
    if (entry->state == DIR_COMMITTED)
        self->committed--;
    object_table_delete (self->table, entry);
    free (entry);
}

bool
directory_drop_holder (directory_t *self, dir_entry_t *entry, uint16_t node)
{
    for (uint8_t i = 0; i < entry->holder_count; i++)
        if (entry->holders[i] == node) {
            s_take_holder (entry, i);
            break;
        }
    if (entry->holder_count == 0 && entry->state == DIR_COMMITTED) {
        directory_remove (self, entry);
        return true;
    }
    return false;
}

size_t
directory_drop_node (directory_t *self, uint16_t node, size_t *held_p)
{
    //  Entries can't be deleted while the table is walked: collect the emptied ones first.
    size_t removed = 0, held = 0, capacity = 0;
    dir_entry_t **empty = NULL;
    for (dir_entry_t *entry = directory_first (self); entry; entry = directory_next (self)) {
        if (!s_holds (entry, node))
            continue;
        held++;
        for (uint8_t i = 0; i < entry->holder_count; i++)
            if (entry->holders[i] == node) {
                s_take_holder (entry, i);
                break;
            }
        if (entry->holder_count == 0 && entry->state == DIR_COMMITTED) {
            if (removed == capacity) {
                capacity = capacity ? capacity * 2 : 1024;
                dir_entry_t **grown =
                    (dir_entry_t **) realloc (empty, capacity * sizeof (dir_entry_t *));
                if (!grown)
                    break; //  out of memory: the rest stay, holderless (LOCATE skips them)
                empty = grown;
            }
            empty[removed++] = entry;
        }
    }
    for (size_t i = 0; i < removed; i++)
        directory_remove (self, empty[i]);
    free (empty);
    if (held_p)
        *held_p = held;
    return removed;
}

size_t
directory_remove_all (directory_t *self)
{
    size_t removed = 0, capacity = directory_size (self);
    dir_entry_t **doomed = (dir_entry_t **) malloc ((capacity ? capacity : 1) * sizeof *doomed);
    if (!doomed)
        return 0;
    for (dir_entry_t *entry = directory_first (self); entry; entry = directory_next (self))
        if (entry->state == DIR_COMMITTED)
            doomed[removed++] = entry;
    for (size_t i = 0; i < removed; i++)
        directory_remove (self, doomed[i]);
    free (doomed);
    return removed;
}

size_t
directory_size (directory_t *self)
{
    return object_table_size (self->table);
}

size_t
directory_committed (directory_t *self)
{
    return self->committed;
}

dir_entry_t *
directory_first (directory_t *self)
{
    return (dir_entry_t *) object_table_first (self->table);
}

dir_entry_t *
directory_next (directory_t *self)
{
    return (dir_entry_t *) object_table_next (self->table);
}

//  ---- self test ---------------------------------------------------------------------

void
directory_test (bool verbose)
{
    directory_t *dir = directory_new ();
    assert (dir);
    //  A reservation is pending, then committed on two nodes.
    dir_entry_t *a = directory_reserve (dir, "a", 1, 100, 7);
    assert (a && a->state == DIR_PENDING && a->token == 7);
    assert (directory_find (dir, "a") == a && directory_committed (dir) == 0);
    uint16_t holders[] = {3, 5, 3};
    directory_commit (dir, a, holders, 3, 8);
    assert (a->token == 8);
    assert (a->state == DIR_COMMITTED && a->holder_count == 2 && directory_committed (dir) == 1);
    //  Inventory: a second holder of "a", a new key "b" from node 5.
    assert (directory_add_holder (dir, "a", 1, 100, 9) == a && a->holder_count == 3);
    assert (directory_add_holder (dir, "a", 1, 100, 9) == a && a->holder_count == 3);
    dir_entry_t *b = directory_add_holder (dir, "b", 1, 50, 5);
    assert (b && b->state == DIR_COMMITTED && directory_committed (dir) == 2);
    //  Node 5 dies: "b" is gone, "a" keeps 3 and 9.
    size_t held = 0;
    assert (directory_drop_node (dir, 5, &held) == 1 && held == 2);
    assert (!directory_find (dir, "b") && a->holder_count == 2);
    assert (!directory_drop_holder (dir, a, 3) && a->holder_count == 1 && a->holders[0] == 9);
    assert (directory_drop_holder (dir, a, 9) && !directory_find (dir, "a"));
    assert (directory_committed (dir) == 0 && directory_size (dir) == 0);
    //  Cache copies: marked, kept aligned with their holders as holders go.
    {
        dir_entry_t *c = directory_reserve (dir, "c", 1, 10, 20);
        assert (directory_add_cache (c, 4) == -1); //  pending: no cache copies
        uint16_t two[] = {1, 2};
        directory_commit (dir, c, two, 2, 21);
        assert (directory_add_cache (c, 4) == 0 && directory_add_cache (c, 6) == 0);
        assert (directory_add_cache (c, 1) == 0 && c->holder_count == 4); //  a replica already
        assert (!directory_is_cache (c, 0) && !directory_is_cache (c, 1));
        assert (directory_is_cache (c, 2) && directory_is_cache (c, 3));
        assert (!directory_drop_holder (dir, c, 1)); //  node 6 (cache) takes slot 0
        assert (c->holders[0] == 6 && directory_is_cache (c, 0) && !directory_is_cache (c, 1));
        assert (directory_is_cache (c, 2) && c->holder_count == 3);
        assert (!directory_drop_holder (dir, c, 4) && c->cache_mask == 1);
        directory_commit (dir, c, two, 1, 22); //  an upsert: the copies are the old value's
        assert (c->cache_mask == 0 && c->holder_count == 1);
        directory_remove (dir, c);
    }
    //  A repair's replica: added, or a cache copy counted as a replica from now on.
    {
        dir_entry_t *d = directory_reserve (dir, "d", 1, 10, 30);
        assert (directory_add_replica (d, 1) == -1); //  pending
        uint16_t one[] = {1};
        directory_commit (dir, d, one, 1, 31);
        assert (directory_add_cache (d, 2) == 0 && directory_replicas (d) == 1);
        assert (directory_add_replica (d, 2) == 0 && directory_replicas (d) == 2);
        assert (directory_add_replica (d, 3) == 1 && directory_replicas (d) == 3);
        assert (directory_add_replica (d, 3) == 0 && d->holder_count == 3);
        directory_remove (dir, d);
        //  What nodes report holding is what a repair keeps up.
        assert (directory_add_holder (dir, "e", 1, 1, 1)
                && directory_add_holder (dir, "e", 1, 1, 2));
        assert (directory_find (dir, "e")->want == 2);
        directory_remove (dir, directory_find (dir, "e"));
    }
    //  Many keys: growth, iteration, remove-all leaves pending reservations alone.
    char key[32];
    for (int i = 0; i < 10000; i++) {
        snprintf (key, sizeof key, "key-%d", i);
        assert (directory_add_holder (dir, key, strlen (key), (uint64_t) i, (uint16_t) (i % 4)));
    }
    assert (directory_reserve (dir, "pending", 7, 1, 1));
    size_t seen = 0;
    for (dir_entry_t *e = directory_first (dir); e; e = directory_next (dir))
        seen++;
    assert (seen == 10001);
    assert (directory_drop_node (dir, 2, &held) == 2500 && held == 2500);
    assert (directory_remove_all (dir) == 7500 && directory_size (dir) == 1);
    assert (directory_find (dir, "pending")->state == DIR_PENDING);
    //  A full holder list refuses one more.
    for (uint16_t n = 0; n < KVP_MAX_REPLICAS; n++)
        assert (directory_add_holder (dir, "full", 4, 1, n));
    assert (!directory_add_holder (dir, "full", 4, 1, 99));
    directory_destroy (&dir);
    assert (dir == NULL);
    if (verbose)
        printf ("directory ok ");
}
