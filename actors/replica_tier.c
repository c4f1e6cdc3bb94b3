/*  replica_tier.c - eviction's walks and the disk tier's bookkeeping, on the
    replica-manager's thread (EVICTION in replica_manager.c's DESIGN; when and how much is
    replica_evict.c's).

    Objects with memory replicas are in self->memory, those with a disk copy in self->disk,
    each least recently used first (lru_list.h); --offload eager keeps committed objects
    without a disk copy in self->unsaved. A cycle (replica_evict.c) walks self->memory and decides
    each candidate by its plan (rm_evict); disk copies are recorded when written
    (rm_offloaded), dropped for room (rm_disk_evict), found at start (rm_disk_register) or
    lost to corruption (rm_disk_lost); hot disk-only objects come back (rm_promote).

    Threads: the replica-manager's only (replica_objects.h).
*/
#include "actors/replica_manager.h"
#include "actors/replica_objects.h"
#include "tier/disk_store.h"

typedef rm_state_t self_t;

//  ---- the disk tier's bookkeeping (see EVICTION below) -------------------------------

//  Whether a read of a disk-only object makes it hot enough to go back to memory.
bool
rm_promote_due (self_t *self, kvp_object_t *object, int64_t now)
{
    if (self->config->promote_on_hit == 0)
        return false;
    uint64_t hash = shm_index_hash (object->key, strlen (object->key));
    if (admission_hit (self->disk_reads, hash, now) < self->config->promote_on_hit)
        return false;
    admission_forget (self->disk_reads, hash);
    return true;
}

//  ---- eviction and the disk tier (see EVICTION) ------------------------------------

//  When the object was last used: its last write or read here, or its last read from the
//  index (its read stamp), whichever is later.
static int64_t
s_last_use (self_t *self, kvp_object_t *object, int64_t now)
{
    int64_t last = object->touched;
    if (self->index && object->index_slot >= 0) {
        int64_t read = shm_index_last_read (self->index, object->index_slot);
        if (read > last && read <= now + STAMP_FUTURE_MAX_MS)
            last = read;
    }
    return last;
}

//  Whether anything holds the object's bytes in memory: sends, client pins, departed
//  replicas, its disk copy being written.
static bool
s_held (kvp_object_t *object)
{
    return rm_epoch_pins (object, 0) > 0 || rm_epoch_pins (object, 1) > 0
           || object->departed_count > 0 || object->offloading;
}

//  Frees the memory replicas of an object that keeps its disk copy. It is out of the index
//  already (rm_take_unleased) and nothing holds it (s_held).
static void
s_memory_evict (self_t *self, kvp_object_t *object, kvp_job_t **free_job_p)
{
    assert (object->disk_id && object->index_slot < 0 && !s_held (object));
    lru_remove (&self->memory, &object->in_memory);
    lru_remove (&self->unsaved, &object->unsaved);
    self->bytes_stored -= object->size * object->replica_count;
    rm_log_del (self, object);
    rm_free_range (free_job_p, object->size, object->replicas, object->replica_count);
    object->replica_count = 0;
    self->evictions++;
}

//  Pins a committed object for a disk copy and lists it in the job (a TX_DISK_WRITE).
static void
s_offload_pin (kvp_job_t *job, kvp_object_t *object, bool evict)
{
    kvp_evict_t *plan = kvp_job_evict (job);
    object->offloading = true;
    atomic_fetch_add_explicit (&object->pins[object->pin_epoch], 1, memory_order_relaxed);
    kvp_item_t *item = kvp_job_append_key (job, object->key, strlen (object->key));
    item->object = rm_pin_handle (object, object->pin_epoch);
    item->object_id = object->id;
    item->size = object->size;
    item->src = object->replicas[0].addr;
    item->disk.evict = evict;
    plan->queued++;
    plan->queued_bytes += disk_store_footprint (strlen (object->key), object->size);
}

//  Whether the disk has room for a copy of the object, beside those recorded and queued.
static bool
s_disk_fits (self_t *self, kvp_evict_t *plan, kvp_object_t *object)
{
    uint64_t footprint = disk_store_footprint (strlen (object->key), object->size);
    return self->disk_bytes + plan->queued_bytes + footprint <= plan->disk_limit;
}

//  Whether a disk copy of the object fits what the plan still allows.
static bool
s_offload_fits (self_t *self, kvp_evict_t *plan, kvp_object_t *object)
{
    uint64_t footprint = disk_store_footprint (strlen (object->key), object->size);
    return plan->queued < plan->limit && s_disk_fits (self, plan, object)
           && (plan->queued == 0 || plan->queued_bytes + footprint <= plan->queue_bytes);
}

//  One eviction candidate, the oldest not yet looked at in this pass. Returns the memory
//  bytes its eviction frees now or once its disk copy is written (0: none).
static uint64_t
s_evict_one (self_t *self, kvp_job_t *job, kvp_object_t *object, int pass, kvp_job_t **free_job_p,
             int64_t now)
{
    kvp_evict_t *plan = kvp_job_evict (job);
    uint64_t bytes = object->size * object->replica_count;
    //  Second chance: used since it took its place, it goes to the back.
    if (s_last_use (self, object, now) > object->memory_since || object->hard_pin) {
        object->memory_since = now;
        lru_append (&self->memory, &object->in_memory);
        //  What holds it is counted all the same: a pool full of leased objects says so.
        if (object->hard_pin || s_held (object))
            plan->pinned++;
        else if (rm_lease_end (self, object, now) > now)
            plan->leased++;
        return 0;
    }
    bool soft = object->soft_pin_until > now;
    if (soft != (pass == 1))
        return 0; //  soft-pinned objects go in the second pass, the others in the first
    if (s_held (object)) {
        plan->pinned++;
        return 0;
    }
    if (rm_lease_end (self, object, now) > now) {
        plan->leased++;
        return 0;
    }
    bool keep_copy = object->disk_id != 0;
    //  (A copy no master is known to hold goes without one: replica_objects.h, hidden.)
    if (plan->offload && !keep_copy && !object->hidden) {
        if (s_offload_fits (self, plan, object)) {
            s_offload_pin (job, object, true);
            return bytes;
        }
        //  A filesystem that filled before --disk-capacity: the policy lowered the disk's
        //  capacity to what it holds, and the objects it has no room for go without a copy,
        //  so puts go on being placed.
        bool no_room = plan->disk_full && !s_disk_fits (self, plan, object);
        if (!plan->force && !no_room) {
            plan->skipped++;
            return 0;
        }
    }
    //  Out of the index now; a read confirmed just before keeps it (a lease after all).
    if (!rm_take_unleased (self, object, false, now)) {
        plan->leased++;
        return 0;
    }
    if (keep_copy)
        s_memory_evict (self, object, free_job_p);
    else {
        if (plan->offload)
            plan->forced++;
        self->evictions++;
        self->dropped_evictions++;
        rm_dropped_note (self, object);
        rm_object_drop (self, object, free_job_p, now);
    }
    self->evicted_bytes += bytes;
    plan->freed_objects++;
    plan->freed_bytes += bytes;
    return bytes;
}

//  rm_evict: frees plan->want bytes of memory, least recently used first (see EVICTION).
//  Items out: the objects pinned for a disk copy.
void
rm_evict (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_evict_t *plan = kvp_job_evict (job);
    kvp_job_t *free_job = NULL;
    int64_t started = zclock_usecs ();
    job->count = 0;
    //  Eager copies first: committed objects in the order they came.
    lru_link_t *link;
    while (plan->eager && (link = lru_first (&self->unsaved)) && plan->queued < plan->eager) {
        kvp_object_t *object = lru_entry (link, kvp_object_t, unsaved);
        lru_remove (&self->unsaved, link);
        if (!object->disk_id && !object->offloading && object->replica_count
            && s_offload_fits (self, plan, object))
            s_offload_pin (job, object, false);
        else if (!object->disk_id && !object->offloading && object->replica_count) {
            lru_append (&self->unsaved, link); //  no room now: it waits
            break;
        }
    }
    //  Cache copies go first (replica_cache.c): they are copies of values other nodes hold.
    uint64_t gained = plan->want ? rm_cache_evict (self, plan->want, &free_job, now) : 0;
    plan->freed_bytes += gained;
    for (int pass = 0; pass < 2 && gained < plan->want; pass++) {
        if (pass == 1 && !plan->soft)
            break;
        //  Each object is looked at at most twice a pass: once, and once more after a second
        //  chance sent it to the back. Looked at only once, a pool whose every object was
        //  read since it took its place would free nothing in a cycle, and the policy would
        //  refuse waiting puts for a while (its stall backoff) though every object could go.
        size_t budget = 2 * self->memory.count;
        link = lru_first (&self->memory);
        while (link && budget-- > 0 && gained < plan->want) {
            lru_link_t *next = lru_next (&self->memory, link);
            //  The walk is bound by cache misses (the object, its key, its index slot): the
            //  objects after this one are fetched while it is decided.
            if (next) {
                __builtin_prefetch (lru_entry (next, kvp_object_t, in_memory)->key);
                if (next->next)
                    __builtin_prefetch (lru_entry (next->next, kvp_object_t, in_memory));
            }
            kvp_object_t *object = lru_entry (link, kvp_object_t, in_memory);
            gained += s_evict_one (self, job, object, pass, &free_job, now);
            link = next;
        }
    }
    plan->disk_bytes = self->disk_bytes;
    plan->disk_objects = self->disk.count;
    rm_frees_apply (self, &free_job);
    plan->walk_us = (uint64_t) (zclock_usecs () - started);
}

//  rm_offloaded: the disk copies of the objects rm_evict pinned are written (or failed). Each
//  is recorded on its object, if that is still the same object and has none; an item whose
//  copy nobody wants comes back OBJECT_NOT_FOUND, and the policy unlinks it.
void
rm_offloaded (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        kvp_object_t *object = (kvp_object_t *) object_table_lookup (self->objects, item->key);
        if (object && (object->id != item->object_id || object->state != OBJECT_COMPLETE))
            object = NULL;
        if (object)
            object->offloading = false;
        //  The pin ends here; a doomed object waits for the sweep.
        if (item->object) {
            kvp_object_unpin (item->object);
            item->object = NULL;
        }
        if (item->status != KVPOOL_OK || !item->disk.id)
            continue; //  no copy: the object keeps its memory (skipped)
        if (!object || object->disk_id) {
            item->status = KVPOOL_OBJECT_NOT_FOUND;
            continue;
        }
        rm_disk_attach (self, object, item->disk.id, item->disk.footprint, now);
        if (item->disk.evict && object->replica_count && !s_held (object)
            && rm_lease_end (self, object, now) <= now
            && rm_take_unleased (self, object, false, now)) {
            self->evicted_bytes += object->size * object->replica_count;
            s_memory_evict (self, object, &free_job);
        }
    }
    kvp_job_evict (job)->disk_bytes = self->disk_bytes;
    kvp_job_evict (job)->disk_objects = self->disk.count;
    rm_frees_apply (self, &free_job);
}

//  rm_disk_evict: drops disk copies, least recently used first, until plan->want bytes of
//  disk are free. A copy whose object is in memory too is only forgotten; a disk-only object
//  goes with its copy, unless it is leased or pinned.
void
rm_disk_evict (self_t *self, kvp_evict_t *plan, int64_t now)
{
    kvp_job_t *free_job = NULL;
    uint64_t freed = 0;
    size_t budget = self->disk.count;
    lru_link_t *link = lru_first (&self->disk);
    while (link && budget-- > 0 && freed < plan->want) {
        lru_link_t *next = lru_next (&self->disk, link);
        kvp_object_t *object = lru_entry (link, kvp_object_t, on_disk);
        link = next;
        if (object->touched > object->disk_since || object->hard_pin) {
            object->disk_since = now;
            lru_append (&self->disk, &object->on_disk);
            continue;
        }
        uint64_t footprint = object->disk_footprint;
        if (object->replica_count == 0) {
            if (s_held (object) || !rm_take_unleased (self, object, false, now)) {
                plan->leased++;
                continue;
            }
            rm_dropped_note (self, object);
            rm_object_drop (self, object, &free_job, now);
        }
        else
            rm_disk_detach (self, object, true);
        self->disk_drops++;
        plan->freed_objects++;
        freed += footprint;
    }
    plan->freed_bytes = freed;
    plan->disk_bytes = self->disk_bytes;
    plan->disk_objects = self->disk.count;
    rm_frees_apply (self, &free_job);
}

//  RM_DISK_REGISTER: the copies a restarted node found on its disk become disk-only
//  objects; a key that exists already keeps its object (the item comes back
//  OBJECT_ALREADY_EXISTS, and its copy is unlinked).
void
rm_disk_register (self_t *self, kvp_job_t *job, int64_t now)
{
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK || !item->disk.id)
            continue;
        if (object_table_lookup (self->objects, item->key)) {
            item->status = KVPOOL_OBJECT_ALREADY_EXISTS;
            rm_unlink_queue (self, item->disk.id);
            continue;
        }
        kvp_object_t *object = rm_object_new (self, job, item, now);
        object->state = OBJECT_COMPLETE;
        object->bound = true;
        object->touched = now;
        rm_disk_attach (self, object, item->disk.id, item->disk.footprint, now);
        rm_publish (self, object); //  (on disk only: counted among the unlisted keys)
        self->puts++;
        rm_event_stored (self, object);
    }
}

//  RM_DISK_LOST: copies that failed a read's verification are forgotten (the job's next
//  stage unlinks them); a disk-only object goes with its copy.
void
rm_disk_lost (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        kvp_object_t *object = (kvp_object_t *) object_table_lookup (self->objects, item->key);
        if (!object || object->disk_id != item->disk.id || !item->disk.id)
            continue;
        self->disk_lost++;
        rm_disk_detach (self, object, false);
        if (object->state == OBJECT_COMPLETE && object->replica_count == 0) {
            self->removes++;
            rm_dropped_note (self, object);
            rm_object_drop (self, object, &free_job, now);
        }
    }
    rm_frees_apply (self, &free_job);
}

//  RM_PROMOTE: a disk-only object read often is back in memory (placed and written by the
//  job's earlier stages) if it is still the same object and still on disk only; otherwise
//  the space goes back.
void
rm_promote (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_need_replicas (job);
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK || item->replica_count == 0)
            continue;
        kvp_object_t *object = (kvp_object_t *) object_table_lookup (self->objects, item->key);
        if (!object || object->id != item->object_id || object->state != OBJECT_COMPLETE
            || object->replica_count || !rm_strip_gone (self, item, &free_job)
            || item->replica_count == 0) {
            rm_free_range (&free_job, item->size, item->replicas, item->replica_count);
            continue;
        }
        object->replica_count = item->replica_count;
        memcpy (object->replicas, item->replicas, item->replica_count * sizeof (kvp_replica_t));
        object->touched = object->memory_since = now;
        lru_append (&self->memory, &object->in_memory);
        self->bytes_stored += object->size * object->replica_count;
        self->promotions++;
        rm_publish (self, object);
        rm_log_put (self, object, NULL);
    }
    rm_frees_apply (self, &free_job);
}
