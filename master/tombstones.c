/*  tombstones.c - removed keys, newest last, bounded (tombstones.h).

    A hash (key -> token) for the look-up and a list of the keys, oldest first, for the
    forgetting; the list owns the key strings the hash is keyed by (the hash copies its own).
*/
#include "master/tombstones.h"

#include <czmq.h>

typedef struct {
    uint64_t token;   //  its last removal or abort (the floor's measure)
    uint64_t removed; //  its last removal (0: none, only aborts)
    uint64_t version; //  the version that removal removed
    uint64_t aborted_from, aborted_token; //  tombstones_abort's, until tombstones_committed
    uint8_t count;
    uint16_t holders[8];
} stone_t;

struct _tombstones_t {
    zhashx_t *tokens; //  removed key -> its stone_t
    zlistx_t *keys;   //  their keys, oldest first
    size_t max;
    uint64_t floor;
};

tombstones_t *
tombstones_new (size_t max)
{
    tombstones_t *self = (tombstones_t *) zmalloc (sizeof (tombstones_t));
    self->tokens = zhashx_new ();
    zhashx_set_destructor (self->tokens, (zhashx_destructor_fn *) zstr_free);
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

//  key's stone, made (and the oldest forgotten past max) if it has none.
static stone_t *
s_stone (tombstones_t *self, const char *key)
{
    stone_t *stone = (stone_t *) zhashx_lookup (self->tokens, key);
    if (stone)
        return stone;
    zlistx_add_end (self->keys, (void *) key);
    stone = (stone_t *) zmalloc (sizeof (stone_t));
    zhashx_insert (self->tokens, key, stone);
    while (zlistx_size (self->keys) > self->max) {
        char *oldest = (char *) zlistx_first (self->keys);
        stone_t *forgotten = (stone_t *) zhashx_lookup (self->tokens, oldest);
        if (forgotten && forgotten->token > self->floor)
            self->floor = forgotten->token;
        zhashx_delete (self->tokens, oldest);
        zlistx_delete (self->keys, zlistx_cursor (self->keys));
    }
    return stone;
}

void
tombstones_add (tombstones_t *self, const char *key, uint64_t token, uint64_t version,
                const uint16_t *holders, uint8_t count)
{
    stone_t *stone = s_stone (self, key);
    stone->token = stone->removed = token;
    //  A remove of a key already gone keeps what the last one held.
    if (count || !stone->count) {
        stone->version = version;
        stone->count = count < 8 ? count : 8;
        if (stone->count)
            memcpy (stone->holders, holders, stone->count * sizeof *holders);
    }
}

void
tombstones_abort (tombstones_t *self, const char *key, uint64_t token, uint64_t version)
{
    stone_t *stone = s_stone (self, key);
    stone->token = stone->aborted_token = token;
    if (!stone->aborted_from || version < stone->aborted_from)
        stone->aborted_from = version;
}

void
tombstones_committed (tombstones_t *self, const char *key)
{
    stone_t *stone = (stone_t *) zhashx_lookup (self->tokens, key);
    if (stone)
        stone->aborted_from = stone->aborted_token = 0;
}

uint64_t
tombstones_find (tombstones_t *self, const char *key)
{
    stone_t *stone = (stone_t *) zhashx_lookup (self->tokens, key);
    return stone ? stone->removed : 0;
}

bool
tombstones_holders (tombstones_t *self, const char *key, uint64_t *version, uint16_t *holders,
                    uint8_t *count)
{
    stone_t *stone = (stone_t *) zhashx_lookup (self->tokens, key);
    if (!stone || !stone->count)
        return false;
    *version = stone->version;
    *count = stone->count;
    memcpy (holders, stone->holders, stone->count * sizeof *holders);
    return true;
}

bool
tombstones_refuse (tombstones_t *self, const char *key, uint64_t version, uint64_t bar)
{
    if (self->floor > bar)
        return true;
    stone_t *stone = (stone_t *) zhashx_lookup (self->tokens, key);
    if (!stone)
        return false;
    return stone->removed > bar || (version && stone->version == version)
           || (stone->aborted_from
               && (version ? version >= stone->aborted_from : stone->aborted_token > bar));
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
    uint16_t held[2] = {3, 4}, got[8];
    uint64_t version;
    uint8_t count;
    tombstones_add (stones, "a", 5, 50, held, 2);
    tombstones_add (stones, "b", 6, 0, NULL, 0);
    assert (tombstones_find (stones, "a") == 5 && tombstones_find (stones, "c") == 0);
    assert (tombstones_holders (stones, "a", &version, got, &count));
    assert (version == 50 && count == 2 && got[0] == 3 && got[1] == 4);
    assert (!tombstones_holders (stones, "b", &version, got, &count));
    //  A copy of the version a removal removed is refused whenever its node last spoke.
    assert (tombstones_refuse (stones, "a", 50, 99) && !tombstones_refuse (stones, "a", 51, 99));
    tombstones_add (stones, "a", 7, 0, NULL, 0); //  removed again while gone: holders kept
    assert (tombstones_find (stones, "a") == 7 && tombstones_floor (stones) == 0);
    assert (tombstones_holders (stones, "a", &version, got, &count) && version == 50);
    tombstones_add (stones, "c", 8, 0, NULL, 0); //  past max: the oldest key goes, floor rises
    assert (tombstones_find (stones, "a") == 0 && tombstones_floor (stones) == 7);
    assert (tombstones_find (stones, "b") == 6 && tombstones_find (stones, "c") == 8);
    tombstones_clear (stones, 9);
    assert (tombstones_find (stones, "c") == 0 && tombstones_floor (stones) == 9);
    //  An abort is no removal: it remembers the lowest version given up, until a commit.
    tombstones_abort (stones, "d", 12, 11);
    assert (tombstones_find (stones, "d") == 0);
    assert (!tombstones_refuse (stones, "d", 10, 9) && tombstones_refuse (stones, "d", 11, 9));
    assert (tombstones_refuse (stones, "d", 0, 11) && !tombstones_refuse (stones, "d", 0, 12));
    tombstones_abort (stones, "d", 14, 13);
    assert (!tombstones_refuse (stones, "d", 10, 9) && tombstones_refuse (stones, "d", 11, 9));
    tombstones_add (stones, "d", 15, 0, NULL, 0); //  removed while absent: both remembered
    assert (tombstones_find (stones, "d") == 15);
    //  A node last heard at 14 reports: removed since (15 > 14), refused whatever its version.
    assert (tombstones_refuse (stones, "d", 5, 14));
    //  Heard at 15: a copy older than the first abort stands, one of an abort's version not.
    assert (!tombstones_refuse (stones, "d", 10, 15) && tombstones_refuse (stones, "d", 11, 15));
    assert (tombstones_refuse (stones, "d", 13, 15) && !tombstones_refuse (stones, "x", 13, 15));
    tombstones_committed (stones, "d");
    assert (!tombstones_refuse (stones, "d", 13, 15)); //  committed since: its aborts are past
    assert (tombstones_find (stones, "d") == 15);
    tombstones_committed (stones, "none"); //  (nothing to forget)
    //  Past max, a stone of aborts only raises the floor too.
    tombstones_abort (stones, "e", 17, 16);
    tombstones_abort (stones, "f", 19, 18);
    assert (tombstones_floor (stones) == 15 && tombstones_find (stones, "d") == 0);
    assert (tombstones_refuse (stones, "x", 1, 14) && !tombstones_refuse (stones, "x", 1, 15));
    tombstones_destroy (&stones);
    assert (!stones);
    printf ("OK\n");
}
