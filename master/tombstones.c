/*  tombstones.c - removed keys, newest last, bounded (tombstones.h).

    A hash (key -> token) for the look-up and a list of the keys, oldest first, for the
    forgetting; the list owns the key strings the hash is keyed by (the hash copies its own).
*/
#include "master/tombstones.h"

#include <czmq.h>

struct _tombstones_t {
    zhashx_t *tokens; //  removed key -> the removal's token (as a pointer)
    zlistx_t *keys;   //  their keys, oldest first
    size_t max;
    uint64_t floor;
};

tombstones_t *
tombstones_new (size_t max)
{
    tombstones_t *self = (tombstones_t *) zmalloc (sizeof (tombstones_t));
    self->tokens = zhashx_new ();
    self->keys = zlistx_new ();
    assert (self->tokens && self->keys);
    zlistx_set_duplicator (self->keys, (zlistx_duplicator_fn *) strdup);
    zlistx_set_destructor (self->keys, (zlistx_destructor_fn *) zstr_free);
    self->max = max;
    return self;
}

void
tombstones_destroy (tombstones_t **self_p)
{
    tombstones_t *self = *self_p;
    if (!self)
        return;
    zhashx_destroy (&self->tokens);
    zlistx_destroy (&self->keys);
    free (self);
    *self_p = NULL;
}

void
tombstones_add (tombstones_t *self, const char *key, uint64_t token)
{
    if (!zhashx_lookup (self->tokens, key))
        zlistx_add_end (self->keys, (void *) key);
    zhashx_update (self->tokens, key, (void *) (uintptr_t) token);
    while (zlistx_size (self->keys) > self->max) {
        char *oldest = (char *) zlistx_first (self->keys);
        uint64_t forgotten = (uintptr_t) zhashx_lookup (self->tokens, oldest);
        if (forgotten > self->floor)
            self->floor = forgotten;
        zhashx_delete (self->tokens, oldest);
        zlistx_delete (self->keys, zlistx_cursor (self->keys));
    }
}

uint64_t
tombstones_find (tombstones_t *self, const char *key)
{
    return (uintptr_t) zhashx_lookup (self->tokens, key);
}

void
tombstones_clear (tombstones_t *self, uint64_t floor)
{
    zhashx_purge (self->tokens);
    zlistx_purge (self->keys);
    self->floor = floor;
}

uint64_t
tombstones_floor (tombstones_t *self)
{
    return self->floor;
}

void
tombstones_test (bool verbose)
{
    (void) verbose;
    printf (" * tombstones: ");
    tombstones_t *stones = tombstones_new (2);
    tombstones_add (stones, "a", 5);
    tombstones_add (stones, "b", 6);
    assert (tombstones_find (stones, "a") == 5 && tombstones_find (stones, "c") == 0);
    tombstones_add (stones, "a", 7); //  removed again (put back in between): one entry
    assert (tombstones_find (stones, "a") == 7 && tombstones_floor (stones) == 0);
    tombstones_add (stones, "c", 8); //  past max: the oldest key goes, and the floor rises
    assert (tombstones_find (stones, "a") == 0 && tombstones_floor (stones) == 7);
    assert (tombstones_find (stones, "b") == 6 && tombstones_find (stones, "c") == 8);
    tombstones_clear (stones, 9);
    assert (tombstones_find (stones, "c") == 0 && tombstones_floor (stones) == 9);
    tombstones_destroy (&stones);
    assert (!stones);
    printf ("OK\n");
}
