/*  cluster_locations.c - the cluster actor's location cache (cluster_op.h): where the keys
    this node read lately are, so that a repeated remote get goes straight to a holder with no
    master round trip (docs/tiers.md, "The hot cache").

    A LOCATE's answer is kept: the key's version, its size and its holders. A get of a known
    key reads that version from them; a holder answers it only if it still has that very
    version and its own lease from the master holds (actors/replica_reads.c), so a holder
    that dropped the key, holds a newer value, or was fenced by a remove it missed says not
    found, and the key is then located at the master after all. Removes and upserts through
    this node forget their keys here at once, and a holder that fails to answer in time is
    not read through locations learned before (its epoch moved on: the master, which knows
    whether it was declared dead, is asked). At most LOCATIONS_MAX keys are kept; past that
    the cache starts empty again (a LOCATE each refills it).

    Threads: the cluster actor's.
*/
#include "actors/cluster_op.h"

#define LOCATIONS_MAX 65536

typedef struct {
    uint64_t version, size;
    uint8_t count;
    int peers[KVP_MAX_REPLICAS];
    uint32_t epochs[KVP_MAX_REPLICAS]; //  each peer's epoch when learned (peer_t)
} location_t;

static void
s_location_free (void **item)
{
    free (*item);
    *item = NULL;
}

void
cluster_locations_new (self_t *self)
{
    self->locations = zhashx_new ();
    assert (self->locations);
    zhashx_set_destructor (self->locations, s_location_free);
}

void
cluster_locations_destroy (self_t *self)
{
    zhashx_destroy (&self->locations);
}

void
cluster_locations_learn (self_t *self, const char *key, uint64_t version, uint64_t size,
                         const int *peers, uint8_t count)
{
    if (!version || count == 0)
        return;
    if (zhashx_size (self->locations) >= LOCATIONS_MAX)
        zhashx_purge (self->locations);
    location_t *location = (location_t *) malloc (sizeof (location_t));
    if (!location)
        return;
    location->version = version;
    location->size = size;
    location->count = count;
    memcpy (location->peers, peers, count * sizeof (int));
    for (uint8_t h = 0; h < count; h++)
        location->epochs[h] = self->peers[peers[h]]->epoch;
    zhashx_update (self->locations, key, location);
}

bool
cluster_locations_find (self_t *self, const char *key, fetch_t *fetch, kvp_item_t *item)
{
    location_t *location = (location_t *) zhashx_lookup (self->locations, key);
    if (!location)
        return false;
    memset (fetch, 0, sizeof *fetch);
    //  (a holder that has not answered in time since is the master's to vouch for again)
    for (uint8_t h = 0; h < location->count; h++)
        if (!cluster_is_self (self, location->peers[h])
            && self->peers[location->peers[h]]->epoch == location->epochs[h])
            fetch->peers[fetch->count++] = location->peers[h];
    if (fetch->count == 0) {
        zhashx_delete (self->locations, key);
        return false;
    }
    fetch->known = true;
    item->size = location->size;
    item->version = location->version;
    return true;
}

void
cluster_locations_forget (self_t *self, const char *key)
{
    if (key)
        zhashx_delete (self->locations, key);
    else
        zhashx_purge (self->locations);
}
