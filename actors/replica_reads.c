/*  replica_reads.c - the replica-manager's reads and removals by key (DESIGN in
    replica_manager.c): GET, EXIST, GET_SIZE, GET_REPLICA_LIST, RELEASE, TOUCH, PREFIX_MATCH,
    REMOVE, REMOVE_ALL, and the client pins each owner holds (GET_REPLICA_LIST with pin,
    RELEASE, the owner's death).

    Called by the actor (replica_manager.c); calls down only (replica_objects.c,
    replica_log.c, replica_tier.c for promotion). Threads: the replica-manager's only.
*/
#include "actors/replica_manager.h"
#include "actors/replica_objects.h"
#include "infra/log.h"
#include "protocol/kvpool.pb-c.h"

typedef rm_state_t self_t;

//  "<owner in hex>:<key>" in the scratch buffer.
static const char *
s_pin_key (self_t *self, uint64_t owner, const char *key)
{
    size_t need = strlen (key) + 20;
    if (need > self->pin_key_size) {
        free (self->pin_key);
        self->pin_key_size = need * 2;
        self->pin_key = (char *) malloc (self->pin_key_size);
        assert (self->pin_key);
    }
    snprintf (self->pin_key, self->pin_key_size, "%llx:%s", (unsigned long long) owner, key);
    return self->pin_key;
}

static void
s_pin_add (self_t *self, uint64_t owner, kvp_object_t *object)
{
    const char *pin_key = s_pin_key (self, owner, object->key);
    pin_entry_t *entry = (pin_entry_t *) zhashx_lookup (self->pins, pin_key);
    if (!entry) {
        entry = (pin_entry_t *) zmalloc (sizeof (pin_entry_t));
        zhashx_insert (self->pins, pin_key, entry);
    }
    if (entry->count == entry->capacity) {
        entry->capacity = entry->capacity ? entry->capacity * 2 : 1;
        entry->objects =
            (kvp_object_t **) realloc (entry->objects, entry->capacity * sizeof (kvp_object_t *));
        assert (entry->objects);
    }
    entry->objects[entry->count++] = rm_pin_handle (object, object->pin_epoch);
    object->client_pins[object->pin_epoch]++;
}

//  Drops a client pin by its handle.
static void
s_client_unpin (kvp_object_t *handle)
{
    unsigned epoch;
    kvp_object_t *object = rm_pin_object (handle, &epoch);
    assert (object->client_pins[epoch] > 0);
    object->client_pins[epoch]--;
}

//  Drops the oldest pin owner holds on key. Returns false when it holds none.
static bool
s_pin_release (self_t *self, uint64_t owner, const char *key)
{
    const char *pin_key = s_pin_key (self, owner, key);
    pin_entry_t *entry = (pin_entry_t *) zhashx_lookup (self->pins, pin_key);
    if (!entry)
        return false;
    s_client_unpin (entry->objects[0]);
    memmove (entry->objects, entry->objects + 1, --entry->count * sizeof (kvp_object_t *));
    if (entry->count == 0) {
        free (entry->objects);
        free (entry);
        zhashx_delete (self->pins, pin_key);
    }
    return true;
}

//  Drops every pin of an owner that is gone.
void
rm_pins_drop_owner (self_t *self, uint64_t owner)
{
    char prefix[24];
    int prefix_len = snprintf (prefix, sizeof prefix, "%llx:", (unsigned long long) owner);
    zlistx_t *keys = zlistx_new ();
    zlistx_set_destructor (keys, (zlistx_destructor_fn *) zstr_free);
    for (pin_entry_t *entry = (pin_entry_t *) zhashx_first (self->pins); entry;
         entry = (pin_entry_t *) zhashx_next (self->pins)) {
        const char *pin_key = (const char *) zhashx_cursor (self->pins);
        if (strncmp (pin_key, prefix, (size_t) prefix_len) == 0) {
            for (size_t i = 0; i < entry->count; i++)
                s_client_unpin (entry->objects[i]);
            free (entry->objects);
            free (entry);
            zlistx_add_end (keys, strdup (pin_key));
        }
    }
    for (char *pin_key = (char *) zlistx_first (keys); pin_key;
         pin_key = (char *) zlistx_next (keys))
        zhashx_delete (self->pins, pin_key);
    zlistx_destroy (&keys);
}

void
rm_read (self_t *self, kvp_job_t *job, int64_t now)
{
    if (job->kind == KVP_RM_GET || job->kind == KVP_RM_REPLICA_LIST)
        kvp_job_need_replicas (job);
    //  Every read leases for the TTL from now; a lease already longer stays.
    int64_t lease_until = now + (int64_t) self->config->lease_ttl_ms;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK)
            continue;
        if (job->kind == KVP_RM_RELEASE) {
            //  Only the process that took a pin drops it; the object may be removed by now.
            if (!s_pin_release (self, job->owner_id, item->key))
                item->status = KVPOOL_INVALID_READ;
            continue;
        }
        kvp_object_t *object = rm_lookup_complete (self, item->key);
        //  Another node's write that the master is not known to hold committed: a read that
        //  names its version knows it from the master, which confirms it (kvp_object_t.hidden).
        if (object && object->hidden && (!item->version || item->version != object->version))
            object = NULL;
        //  Nothing held here before the master has confirmed it: at the start (a restarted
        //  node's adopted objects), and after the node stopped past its lease (infra/config.h):
        //  a remove may have completed without it. The key is read where the master says;
        //  another node reading here hears that this node cannot serve it now (not that it
        //  is gone), and reads another replica.
        if (object && kvp_lease_suspended (self->config->lease, now)) {
            if (job->opt.peer) {
                item->status = KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS;
                continue;
            }
            object = NULL;
        }
        //  A cache copy only while the node's lease holds (replica_cache.c); past it the key
        //  is read where it lives.
        if (object && !rm_cache_servable (self, object, now))
            object = NULL;
        //  A read of a version named without asking the master just now (another node's
        //  location cache, or a client sent here by one): served only under this node's
        //  lease, so that a node fenced by a remove it missed answers no such read
        //  (docs/tiers.md, "The hot cache").
        if (object && item->version && !kvp_lease_holds (self->config->lease, now))
            object = NULL;
        //  A get is counted by the node its client asked (docs/metrics.md): another node's
        //  read is that node's get, counted there.
        bool counted = job->kind == KVP_RM_GET && !job->opt.peer;
        if (counted)
            self->gets++;
        if (!object || (item->version && item->version != object->version)) {
            //  (another version of the key is not the object asked for)
            item->status = KVPOOL_OBJECT_NOT_FOUND;
            continue;
        }
        if (object->hidden)
            rm_unhide (self, object);
        kvp_trace (item->key, "trace %s: v%llu read%s%s", item->key,
                   (unsigned long long) object->version, job->opt.peer ? " by a node" : "",
                   object->cache ? " (cache)" : "");
        item->version = object->version;
        item->size = object->size;
        if (lease_until > object->lease_until)
            object->lease_until = lease_until;
        object->touched = now;
        if (object->cache && job->kind != KVP_RM_RELEASE) {
            self->cache_hits += counted;
            lru_append (&self->cache, &object->in_memory); //  the most recently used
        }
        if (job->kind == KVP_RM_GET)
            item->checksums.value = rm_checksum (self, job, object);
        if (job->kind == KVP_RM_GET && object->replica_count == 0) {
            //  On disk only: the transfer-submitter reads it next (no pin: an unlinked
            //  copy stays readable to a read that opened it, and ids are never reused).
            self->get_hits += counted;
            self->disk_hits++;
            item->replica_count = 0;
            item->disk.id = object->disk_id;
            item->object_id = object->id;
            item->disk.promote = rm_promote_due (self, object, now);
            continue;
        }
        switch (job->kind) {
            case KVP_RM_GET:
                self->get_hits += counted;
                atomic_fetch_add_explicit (&object->pins[object->pin_epoch], 1,
                                           memory_order_relaxed);
                item->object = rm_pin_handle (object, object->pin_epoch);
                rm_fill_replicas (item, object, true);
                break;
            case KVP_RM_REPLICA_LIST:
                if (job->opt.pin)
                    s_pin_add (self, job->owner_id, object);
                rm_fill_replicas (item, object, true);
                break;
            default: break; //  EXIST, GET_SIZE, TOUCH: the lease only
        }
    }
}

//  PREFIX_MATCH: blocks of job->ranks keys, in order. Every key of a whole block is leased as
//  a read leases it (the engine loads those blocks next); the first block with a key missing
//  ends the walk: from there on every key is OBJECT_NOT_FOUND, unchecked past the missing
//  one (kvp_job_prefix_count then counts the whole blocks).
void
rm_prefix (self_t *self, kvp_job_t *job, int64_t now)
{
    size_t ranks = kvp_job_ranks (job);
    int64_t lease_until = now + (int64_t) self->config->lease_ttl_ms;
    size_t at = 0;
    for (; at + ranks <= job->count; at += ranks) {
        bool whole = true;
        for (size_t r = 0; r < ranks && whole; r++) {
            kvp_item_t *item = &job->items[at + r];
            kvp_object_t *object =
                item->status == KVPOOL_OK ? rm_lookup_complete (self, item->key) : NULL;
            whole = object && !object->hidden;
        }
        if (!whole)
            break;
        for (size_t r = 0; r < ranks; r++) {
            kvp_object_t *object = rm_lookup_complete (self, job->items[at + r].key);
            job->items[at + r].size = object->size;
            if (lease_until > object->lease_until)
                object->lease_until = lease_until;
            object->touched = now;
        }
    }
    for (size_t i = at; i < job->count; i++)
        if (job->items[i].status == KVPOOL_OK)
            job->items[i].status = KVPOOL_OBJECT_NOT_FOUND;
}

void
rm_remove (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK)
            continue;
        kvp_object_t *object = rm_lookup_complete (self, item->key);
        //  A hidden cache copy (replica_cache.c) goes too: the master may have taken this
        //  node as its holder already, and must not see it served after the removal.
        kvp_object_t *hidden = (kvp_object_t *) object_table_lookup (self->objects, item->key);
        if (!object && hidden && hidden->cache && hidden->state == OBJECT_PENDING) {
            rm_object_drop (self, hidden, &free_job, now);
            self->cache_invalidations++;
            item->status = KVPOOL_OBJECT_NOT_FOUND;
            continue;
        }
        //  With an object id (a copy the master refused, membership.c): that object alone,
        //  never a newer one put under the key since.
        if (!object || (item->object_id && object->id != item->object_id)
            || (item->version && object->version != item->version))
            item->status = KVPOOL_OBJECT_NOT_FOUND;
        else if (!rm_take_unleased (self, object, job->opt.force, now)) {
            item->status = KVPOOL_OBJECT_HAS_LEASE;
            //  What to do about it, for the first such key: wait, or force.
            if (!job->error[0])
                snprintf (job->error, sizeof job->error,
                          "'%.40s' was read recently: its lease ends in %lld ms; a remove "
                          "with force (kvpool rm --force) takes it now",
                          item->key, (long long) (rm_lease_end (self, object, now) - now));
        }
        else {
            self->cache_invalidations += object->cache;
            self->removes += !object->cache;
            rm_object_drop (self, object, &free_job, now);
        }
    }
    rm_frees_apply (self, &free_job);
}

//  REMOVE_ALL and RESET: one pass over the table.
void
rm_remove_many (self_t *self, kvp_job_t *job, int64_t now)
{
    //  A reset also revokes client reservations.
    bool reset = job->op == KVPOOL__V1__OP__RESET;
    zlistx_t *victims = zlistx_new ();
    bool all_go = true; //  every committed object: one AllBlocksCleared, no event per key
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects)) {
        if (object->state != OBJECT_COMPLETE && !(reset && !object->busy) && !object->cache)
            continue;
        if (object->state == OBJECT_COMPLETE
            && !rm_take_unleased (self, object, job->opt.force || object->cache, now)) {
            all_go = false;
            continue;
        }
        zlistx_add_end (victims, object);
    }
    if (self->events && all_go) {
        kv_events_feed_add (self->events, KV_EVENT_CLEARED, NULL, 0, 0);
        self->events_quiet = true;
    }
    kvp_job_t *free_job = NULL;
    uint64_t removed = 0;
    for (kvp_object_t *object = (kvp_object_t *) zlistx_first (victims); object;
         object = (kvp_object_t *) zlistx_next (victims)) {
        if (object->cache) {
            //  (hidden or served: a cache copy of a key that no longer exists)
            self->cache_invalidations++;
            rm_object_drop (self, object, &free_job, now);
        }
        else if (object->state == OBJECT_COMPLETE) {
            removed++;
            self->removes++;
            rm_object_drop (self, object, &free_job, now);
        }
        else
            //  Nothing lands after a reset, and no late writer lands in reused space.
            rm_reservation_revoke (self, object, &free_job, now);
    }
    zlistx_destroy (&victims);
    self->events_quiet = false;
    rm_frees_apply (self, &free_job);
    job->result_count = removed;
}

//  Same-machine clients read the node's own copies through the read index without asking
//  it: they must stop when the node's own threads do (kvp_lease_suspended), at the end of
//  the lease of its last heartbeat while it is frozen, and at once while it is suspended
//  (a restart, a stop past its lease) until its master has confirmed what it holds. Else a
//  frozen node's readers would read on a copy whose removal its master completed without
//  it (FENCE). Published at least every sweep, well inside a lease.
void
rm_reads_tick (self_t *self)
{
    kvp_lease_t *lease = self->config->lease;
    if (!self->index || !lease)
        return; //  (no master: the index says "always")
    int64_t beat = atomic_load (&lease->beat_ms), period = atomic_load (&lease->period_ms);
    int64_t until = atomic_load (&lease->suspended) || !beat || !period ? 0 : beat + period;
    if (until != self->own_until_published) {
        shm_index_set_own_until (self->index, until);
        self->own_until_published = until;
    }
}
