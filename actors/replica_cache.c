/*  replica_cache.c - the replica-manager's host hot cache (docs/tiers.md, "The hot cache").

    A node of a cluster keeps copies of values that only other nodes hold, once its clients
    read them often (the api admits them: actors/hot_cache.c): cache copies. They are objects
    like any other (in the table, in the read index, read by same-machine clients through
    shared memory), with these differences:
    - they go first: an eviction cycle lets them go, least recently used first, before it
      looks at any replica; a copy never pushes a replica out (a fill places only in free
      space, or in the space of other cache copies), and --hot-cache-size bounds them all;
    - they are never offloaded to disk, never logged (--segment-dir), never reported in the
      inventory, and raise no KV events: they are not where a key lives;
    - they are served only while the node's lease from its master holds (infra/config.h's
      kvp_lease_t, moved on by the membership actor with each answered heartbeat); the read
      index shows the lease to same-machine readers (shm_index_set_cache_until), who leave
      cache copies alone past it. A node stopped or cut off past its lease serves none, and
      a remove that could not reach it waits that long before it is acknowledged (FENCE).

    A copy comes in two steps (KVP_OP_CACHE_FILL, messages/ops.c): hidden (pending, as a
    reservation) once its bytes are written here, then served once the master has this node
    as a cache holder of that very version (CACHE). A remove between the two finds the hidden
    copy (rm_remove drops pending cache copies too), so no copy the master does not know of
    is ever served.

    Threads: the replica-manager's.
*/
#include "actors/replica_objects.h"

#include "actors/allocator.h"
#include "infra/log.h"
#include "messages/ops.h"
#include "shm/shm_index.h"

//  Bytes of a cache copy in memory.
static uint64_t
s_bytes (const kvp_object_t *object)
{
    return object->size * object->replica_count;
}

bool
rm_cache_servable (rm_state_t *self, const kvp_object_t *object, int64_t now)
{
    return !object->cache || kvp_lease_holds (self->config->lease, now);
}

uint64_t
rm_cache_limit (rm_state_t *self)
{
    if (self->config->hot_cache_size != UINT64_MAX)
        return self->config->hot_cache_size;
    uint64_t mounted = 0, allocated = 0;
    allocator_usage (self->allocator, &mounted, &allocated);
    return mounted / 4;
}

void
rm_cache_leave (rm_state_t *self, kvp_object_t *object)
{
    assert (object->cache);
    lru_remove (&self->cache, &object->in_memory);
    if (object->state == OBJECT_COMPLETE)
        self->cache_bytes -= s_bytes (object);
}

uint64_t
rm_cache_evict (rm_state_t *self, uint64_t want, kvp_job_t **free_job_p, int64_t now)
{
    uint64_t freed = 0;
    //  Each copy is looked at at most twice: once, and once more after a second chance.
    size_t budget = 2 * self->cache.count;
    lru_link_t *link = lru_first (&self->cache);
    while (link && freed < want && budget-- > 0) {
        lru_link_t *next = lru_next (&self->cache, link);
        kvp_object_t *object = lru_entry (link, kvp_object_t, in_memory);
        //  Read from the index since it last took its place (same-machine readers tell
        //  nobody else): a second chance, at the back.
        int64_t read = self->index && object->index_slot >= 0
                           ? shm_index_last_read (self->index, object->index_slot)
                           : 0;
        if (read > object->memory_since && read <= now) {
            object->memory_since = now;
            lru_append (&self->cache, link);
            if (!next)
                next = lru_first (&self->cache);
            link = next;
            continue;
        }
        //  Held (a zero-copy send, a pinned replica list): it waits for the next cycle. A
        //  read lease does not keep a cache copy: a reader that finds it gone reads the
        //  value where it lives.
        if (rm_epoch_pins (object, 0) == 0 && rm_epoch_pins (object, 1) == 0
            && object->departed_count == 0) {
            uint64_t bytes = s_bytes (object);
            rm_dropped_note (self, object); //  the master takes this node off its holders
            rm_object_drop (self, object, free_job_p, now);
            self->cache_evictions++;
            freed += bytes;
        }
        link = next;
    }
    return freed;
}

void
rm_cache_insert (rm_state_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_need_replicas (job);
    kvp_job_t *free_job = NULL;
    uint64_t limit = rm_cache_limit (self);
    //  A repair's copy (KVP_OP_REPAIR_FILL) takes the way hidden copies do, but it is to be
    //  a replica: it takes the place of a cache copy of the key, and is no cache's to bound.
    bool repair = job->op == KVP_OP_REPAIR_FILL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        item->object_id = 0;
        if (item->status != KVPOOL_OK)
            continue;
        kvp_object_t *in_way =
            repair ? (kvp_object_t *) object_table_lookup (self->objects, item->key) : NULL;
        if (in_way && in_way->cache && in_way->state == OBJECT_COMPLETE) {
            self->cache_invalidations++;
            rm_object_drop (self, in_way, &free_job, now);
        }
        //  A key held here already (a replica, a copy, or one being written) needs no copy;
        //  nor does a value the master gave no version.
        if (object_table_lookup (self->objects, item->key) || !item->version
            || !rm_strip_gone (self, item, &free_job)) {
            item->status = KVPOOL_OBJECT_ALREADY_EXISTS;
            rm_free_range (&free_job, item->size, item->replicas, item->replica_count);
            continue;
        }
        uint64_t bytes = item->size * item->replica_count;
        if (!repair && self->cache_bytes + bytes > limit)
            rm_cache_evict (self, self->cache_bytes + bytes - limit, &free_job, now);
        kvp_object_t *object = rm_object_new (self, job, item, now);
        object->cache = true;
        object->state = OBJECT_PENDING;
        object->replica_count = item->replica_count;
        memcpy (object->replicas, item->replicas, sizeof object->replicas);
        object->bound = true;
        object->checksum = item->checksums.value;
        object->put_deadline = now + (int64_t) self->config->put_timeout_ms;
        self->pending++;
        item->object_id = object->id;
    }
    rm_frees_apply (self, &free_job);
}

void
rm_cache_publish (rm_state_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        kvp_object_t *object = item->object_id ? rm_lookup_reserved (self, item) : NULL;
        if (!object || !object->cache) {
            //  Removed meanwhile (its key was removed or upserted): nothing to serve.
            if (item->status == KVPOOL_OK)
                item->status = KVPOOL_OBJECT_NOT_FOUND;
            continue;
        }
        if (item->status != KVPOOL_OK) {
            //  The master has another version, or none: this copy is of nothing current.
            rm_object_drop (self, object, &free_job, now);
            continue;
        }
        self->pending--;
        if (job->op == KVP_OP_REPAIR_FILL) {
            //  A replica of this node's now: logged, evicted and offloaded like any other.
            object->cache = false;
            rm_object_complete (self, object, now);
            self->repairs_done++;
            self->repair_bytes += object->size;
            continue;
        }
        object->state = OBJECT_COMPLETE;
        object->touched = object->memory_since = now;
        lru_append (&self->cache, &object->in_memory);
        self->cache_bytes += s_bytes (object);
        self->cache_admissions++;
        kvp_trace (object->key, "trace %s: cache copy v%llu served", object->key,
                   (unsigned long long) object->version);
        rm_publish (self, object);
    }
    rm_frees_apply (self, &free_job);
}

void
rm_cache_drop_all (rm_state_t *self, kvp_job_t *job, int64_t now)
{
    (void) job;
    kvp_job_t *free_job = NULL;
    //  Complete ones in the cache's order; hidden ones found in the table. So do the copies
    //  other nodes wrote here that no master confirmed (replica_objects.h, hidden): the
    //  master this node registers with again dropped whatever it knew of this node's
    //  copies, and a CONFIRM or a read naming a version still on its way would otherwise
    //  serve a value removed or replaced meanwhile.
    lru_link_t *link;
    while ((link = lru_first (&self->cache))) {
        rm_object_drop (self, lru_entry (link, kvp_object_t, in_memory), &free_job, now);
        self->cache_invalidations++;
    }
    zlistx_t *hidden = zlistx_new ();
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects))
        if (object->cache || (object->hidden && object->state == OBJECT_COMPLETE))
            zlistx_add_end (hidden, object);
    for (kvp_object_t *object = (kvp_object_t *) zlistx_first (hidden); object;
         object = (kvp_object_t *) zlistx_next (hidden))
        rm_object_drop (self, object, &free_job, now);
    zlistx_destroy (&hidden);
    rm_frees_apply (self, &free_job);
}

void
rm_cache_tick (rm_state_t *self)
{
    if (!self->index || !self->config->lease)
        return;
    int64_t until = atomic_load_explicit (&self->config->lease->until_ms, memory_order_acquire);
    if (until != self->cache_until_published) {
        shm_index_set_cache_until (self->index, until);
        self->cache_until_published = until;
    }
}
