/*  replica_objects.c - the replica-manager's objects: their life and records, the bottom of
    its files (replica_objects.h). Everything else the actor does is built on these.

    An object is made (rm_object_new) and dropped (rm_object_drop: out of the table, the
    index, the object log and the eviction orders, its space freed through the allocator, or
    doomed while pins hold it); its leases (rm_lease_end, rm_take_unleased: a removal looks
    at the lease again after the object left the index), its place in the read index
    (rm_publish, rm_withdraw), its pins (kvp_object_unpin, from any thread), the segments
    that went (rm_strip_gone), and its disk copy's record (rm_disk_attach, rm_disk_detach;
    copies to unlink and objects the master is to forget go out after each job:
    rm_unlinks_send). See the DESIGN in replica_manager.c.

    Calls only down (the allocator, the index, replica_log.c); never into the actor's other
    files. Threads: the replica-manager's, but for kvp_object_unpin (any thread, atomic).
*/
#include "actors/replica_manager.h"
#include "actors/replica_objects.h"
#include "infra/log.h"
#include "tier/disk_store.h"

typedef rm_state_t self_t;

kvp_object_t *
rm_pin_object (kvp_object_t *handle, unsigned *epoch)
{
    *epoch = (unsigned) ((uintptr_t) handle & 1);
    return (kvp_object_t *) ((uintptr_t) handle & ~(uintptr_t) 1);
}

void
kvp_object_unpin (kvp_object_t *handle)
{
    unsigned epoch;
    kvp_object_t *object = rm_pin_object (handle, &epoch);
    int before = atomic_fetch_sub_explicit (&object->pins[epoch], 1, memory_order_release);
    assert (before > 0);
}

void
kvp_object_unpin_cb (void *data, void *hint)
{
    (void) data;
    kvp_object_unpin ((kvp_object_t *) hint);
}

void
rm_object_destroy (kvp_object_t **object_p)
{
    if (*object_p) {
        free ((*object_p)->departed);
        free (*object_p);
        *object_p = NULL;
    }
}

//  Frees the replicas of objects in the allocator. Takes ownership of the job.
void
rm_frees_apply (self_t *self, kvp_job_t **job_p)
{
    kvp_job_t *job = *job_p;
    *job_p = NULL;
    if (!job)
        return;
    //  The DEL records of what is freed are on the file before the space can be reused.
    rm_log_flush (self);
    if (job->count == 0) {
        kvp_job_destroy (&job);
        return;
    }
    self->items_freed += job->count;
    zframe_t *reply_to = NULL;
    allocator_handle (self->allocator, job, &reply_to);
    kvp_job_destroy (&job);
}

//  Queues one range for freeing. Batches frees of one job into one message.
void
rm_free_range (kvp_job_t **free_job_p, uint64_t size, const kvp_replica_t *replicas, uint32_t count)
{
    if (count == 0)
        return;
    kvp_job_t *job = *free_job_p;
    if (!job) {
        job = kvp_job_new (KVP_AL_FREE, 0);
        *free_job_p = job;
    }
    kvp_item_t *item = kvp_job_append (job);
    item->size = size;
    item->replica_count = count;
    memcpy (item->replicas, replicas, count * sizeof *replicas);
}

//  Queues an object's space for freeing: its replicas and its departed ones.
void
rm_free_replicas (kvp_job_t **free_job_p, kvp_object_t *object)
{
    if (object->bound)
        rm_free_range (free_job_p, object->size, object->replicas, object->replica_count);
    for (uint32_t d = 0; d < object->departed_count; d++)
        rm_free_range (free_job_p, object->size, &object->departed[d].replica, 1);
    object->departed_count = 0;
}

//  Whether a dropped object's bytes may still be read: sends in flight, client pins, or
//  (for one an upsert replaced) a lease whose readers may hold only a replica list.
bool
rm_has_pins (kvp_object_t *object, int64_t now)
{
    return rm_epoch_pins (object, 0) > 0 || rm_epoch_pins (object, 1) > 0
           || now < object->keep_until;
}

//  Takes an object off the departing list (its departed replicas are freed with it).
void
rm_departing_leave (self_t *self, kvp_object_t *object)
{
    if (object->departing_handle) {
        zlistx_delete (self->departing, object->departing_handle);
        object->departing_handle = NULL;
    }
}

static bool
s_segment_gone (self_t *self, uint32_t id)
{
    return (size_t) id / 8 < self->gone_bytes && (self->gone[id / 8] >> (id % 8) & 1);
}

void
rm_segment_mark_gone (self_t *self, uint32_t id)
{
    size_t need = (size_t) id / 8 + 1;
    if (need > self->gone_bytes) {
        size_t bytes = self->gone_bytes ? self->gone_bytes : 64;
        while (bytes < need)
            bytes *= 2;
        uint8_t *grown = (uint8_t *) realloc (self->gone, bytes);
        assert (grown);
        memset (grown + self->gone_bytes, 0, bytes - self->gone_bytes);
        self->gone = grown;
        self->gone_bytes = bytes;
    }
    self->gone[id / 8] |= (uint8_t) (1u << (id % 8));
}

//  Takes out of replicas[0..*count) those on a gone segment (or on segment, when not 0),
//  keeping the order of the rest, and copies them into lost (room for KVP_MAX_REPLICAS).
//  Returns how many went.
uint32_t
rm_replicas_split (self_t *self, kvp_replica_t *replicas, uint32_t *count, uint32_t segment,
                   kvp_replica_t *lost)
{
    uint32_t kept = 0, went = 0;
    for (uint32_t r = 0; r < *count; r++) {
        bool gone = segment ? replicas[r].segment_id == segment
                            : s_segment_gone (self, replicas[r].segment_id);
        if (gone)
            lost[went++] = replicas[r];
        else
            replicas[kept++] = replicas[r];
    }
    *count = kept;
    return went;
}

//  Puts placed on a segment before it went reach this actor after its REMOVE_SEGMENT: their
//  replicas there are freed and dropped. Returns false when that left the item none.
bool
rm_strip_gone (self_t *self, kvp_item_t *item, kvp_job_t **free_job_p)
{
    if (self->gone_bytes == 0)
        return true;
    kvp_replica_t lost[KVP_MAX_REPLICAS];
    uint32_t went = rm_replicas_split (self, item->replicas, &item->replica_count, 0, lost);
    rm_free_range (free_job_p, item->size, lost, went);
    return went == 0 || item->replica_count > 0;
}

//  Whether same-machine clients may be told about the object: committed, this node's own
//  (not a cache copy of another node's), confirmed (not hidden).
static bool
s_visible (const kvp_object_t *object)
{
    return object->state == OBJECT_COMPLETE && !object->cache && !object->hidden;
}

//  Counts the object among the index's unlisted keys, or no longer (held: it stays, now
//  published), while the index vouches for absent keys.
static void
s_unlisted_set (self_t *self, kvp_object_t *object, bool unlisted, bool held)
{
    if (!self->index_complete || object->unlisted == unlisted)
        return;
    if (unlisted)
        shm_index_unlisted_add (self->index, object->key, strlen (object->key));
    else
        shm_index_unlisted_remove (self->index, object->key, strlen (object->key), held);
    object->unlisted = unlisted;
}

//  Takes an object out of the table and frees (or dooms) it. The object pointer is invalid
//  afterwards unless it was doomed.
void
rm_object_drop (self_t *self, kvp_object_t *object, kvp_job_t **free_job_p, int64_t now)
{
    kvp_trace (object->key, "trace %s: dropped v%llu%s%s", object->key,
               (unsigned long long) object->version, object->cache ? " (cache)" : "",
               object->hidden ? " (hidden)" : "");
    rm_log_del (self, object);
    //  Withdrawn from the index before its space can be freed (see shm_index.h), and no
    //  longer counted held.
    if (self->index && object->index_slot >= 0)
        shm_index_remove (self->index, object->index_slot);
    object->index_slot = -1;
    s_unlisted_set (self, object, false, false);
    rm_departing_leave (self, object);
    rm_lists_leave (self, object);
    object_table_delete (self->objects, object);
    if (object->cache)
        rm_cache_leave (self, object); //  (no event: the key lives elsewhere)
    if (object->state == OBJECT_PENDING)
        self->pending--;
    else if (!object->cache) {
        self->bytes_stored -= object->size * object->replica_count;
        rm_event_removed (self, object);
    }
    if (rm_has_pins (object, now))
        zlistx_add_end (self->doomed, object);
    else {
        rm_free_replicas (free_job_p, object);
        rm_object_destroy (&object);
    }
}

kvp_object_t *
rm_lookup_complete (self_t *self, const char *key)
{
    kvp_object_t *object = (kvp_object_t *) object_table_lookup (self->objects, key);
    return object && object->state == OBJECT_COMPLETE ? object : NULL;
}

//  The pending object a job item reserved, if it is still the same one.
kvp_object_t *
rm_lookup_reserved (self_t *self, kvp_item_t *item)
{
    kvp_object_t *object = (kvp_object_t *) object_table_lookup (self->objects, item->key);
    if (object && object->state == OBJECT_PENDING && item->object_id
        && object->id == item->object_id)
        return object;
    return NULL;
}

void
rm_fill_replicas (kvp_item_t *item, kvp_object_t *object, bool rotate)
{
    item->size = object->size;
    item->replica_count = object->replica_count;
    //  Reads rotate over the replicas to spread hot keys; the chosen one comes first.
    uint32_t first =
        rotate && object->replica_count ? object->next_replica++ % object->replica_count : 0;
    for (uint32_t r = 0; r < object->replica_count; r++)
        item->replicas[r] = object->replicas[(first + r) % object->replica_count];
}

//  A new object for item, with the job's pins, in the table (the caller sets its state).
kvp_object_t *
rm_object_new (self_t *self, kvp_job_t *job, kvp_item_t *item, int64_t now)
{
    size_t key_size = strlen (item->key) + 1;
    kvp_object_t *object = (kvp_object_t *) zmalloc (sizeof (kvp_object_t) + key_size);
    memcpy (object->key, item->key, key_size);
    object->id = self->next_id++;
    object->version = item->version ? item->version : ++self->next_version;
    item->version = object->version;
    object->size = item->size;
    object->hard_pin = job->opt.hard_pin;
    if (job->opt.soft_pin)
        object->soft_pin_until =
            now
            + (int64_t) (job->opt.soft_pin_ttl_ms ? job->opt.soft_pin_ttl_ms
                                                  : self->config->soft_pin_ttl_ms);
    atomic_init (&object->pins[0], 0);
    atomic_init (&object->pins[1], 0);
    object->index_slot = -1;
    object->hidden = job->opt.peer; //  (only a write of another node's put comes from a peer)
    int rc = object_table_insert (self->objects, object);
    assert (rc == 0); //  out of memory, as zhashx would abort
    return object;
}

//  The lease a read stamped at read_ms (shm_index_last_read; 0: none) grants. A stamp is a
//  reader's word: one further ahead of now than STAMP_FUTURE_MAX_MS is no read at all, so a
//  client can lease an object no longer than by reading it. (A true stamp can be ahead of
//  now, the time a job started, by as long as the job has been running.)
int64_t
rm_stamp_lease (self_t *self, int64_t read_ms, int64_t now)
{
    if (read_ms <= 0 || read_ms > now + STAMP_FUTURE_MAX_MS)
        return 0;
    return read_ms + (int64_t) self->config->lease_ttl_ms;
}

//  When the object's lease ends: the later of the reads this actor served and the last
//  read from the index.
int64_t
rm_lease_end (self_t *self, kvp_object_t *object, int64_t now)
{
    int64_t end = object->lease_until;
    if (self->index && object->index_slot >= 0) {
        int64_t stamped =
            rm_stamp_lease (self, shm_index_last_read (self->index, object->index_slot), now);
        if (stamped > end)
            end = stamped;
    }
    return end;
}

void
rm_publish (self_t *self, kvp_object_t *object)
{
    if (self->index && !object->hidden && object->replica_count && object->index_slot < 0)
        object->index_slot = shm_index_insert (
            self->index, object->key, strlen (object->key), object->replicas[0].segment_id,
            object->replicas[0].offset, object->size, object->version, object->cache);
    //  Counted down only after the insert: at every instant a reader finds it somewhere.
    s_unlisted_set (self, object, object->index_slot < 0 && s_visible (object), true);
}

//  Withdraws an object from the index, keeping the lease its index reads granted.
void
rm_withdraw (self_t *self, kvp_object_t *object, int64_t now)
{
    if (!self->index || object->index_slot < 0)
        return;
    //  Counted before it leaves its slot (it may stay held: shm_index.h, "Absent keys").
    s_unlisted_set (self, object, s_visible (object), true);
    int64_t stamped =
        rm_stamp_lease (self, shm_index_remove (self->index, object->index_slot), now);
    object->index_slot = -1;
    if (stamped > object->lease_until)
        object->lease_until = stamped;
}

//  Whether a removal without force may take the object now, as far as can be told without
//  touching the index: no lease, no client pin.
bool
rm_looks_removable (self_t *self, kvp_object_t *object, bool force, int64_t now)
{
    return force
           || (object->client_pins[0] == 0 && object->client_pins[1] == 0
               && rm_lease_end (self, object, now) <= now);
}

//  Whether a removal may take the object now; if so, it is out of the index already. The
//  last word on a published object's lease comes after its withdrawal (shm_index.h): an
//  object found leased then is published again.
bool
rm_take_unleased (self_t *self, kvp_object_t *object, bool force, int64_t now)
{
    if (!rm_looks_removable (self, object, force, now))
        return false;
    if (force || object->index_slot < 0)
        return true;
    rm_withdraw (self, object, now);
    if (object->lease_until <= now)
        return true;
    rm_publish (self, object);
    return false;
}

//  Queues a disk copy for unlinking by the transfer-submitter (sent by rm_unlinks_send).
void
rm_unlink_queue (self_t *self, uint64_t disk_id)
{
    if (!self->unlinks)
        self->unlinks = kvp_job_new (KVP_TX_DISK_DROP, 0);
    kvp_job_append (self->unlinks)->disk.id = disk_id;
}

void
rm_unlinks_send (self_t *self)
{
    if (self->dropped && kvp_job_send (self->cluster, self->dropped) == -1)
        kvp_job_destroy (&self->dropped);
    self->dropped = NULL;
    if (self->unlinks && kvp_job_send (self->tx, self->unlinks) == -1)
        kvp_job_destroy (&self->unlinks);
    else if (self->unlinks) {
        self->unlinks_out++;
        wait_set_touch (self->waits, self->tx);
    }
    self->unlinks = NULL;
}

void
rm_dropped_note (self_t *self, const kvp_object_t *object)
{
    if (!self->cluster)
        return;
    if (!self->dropped) {
        self->dropped = kvp_job_new (KVP_CL_DROPPED, 0);
    }
    kvp_job_append_key (self->dropped, object->key, strlen (object->key));
}

//  Records the object's disk copy.
void
rm_disk_attach (self_t *self, kvp_object_t *object, uint64_t disk_id, uint64_t footprint,
                int64_t now)
{
    object->disk_id = disk_id;
    object->disk_footprint = footprint;
    object->disk_since = now;
    lru_append (&self->disk, &object->on_disk);
    lru_remove (&self->unsaved, &object->unsaved);
    self->disk_bytes += footprint;
}

//  Forgets the object's disk copy; it is unlinked too when unlink is true.
void
rm_disk_detach (self_t *self, kvp_object_t *object, bool unlink)
{
    if (!object->disk_id)
        return;
    if (unlink)
        rm_unlink_queue (self, object->disk_id);
    lru_remove (&self->disk, &object->on_disk);
    self->disk_bytes -= object->disk_footprint;
    object->disk_id = 0;
    object->disk_footprint = 0;
}

//  Takes a dropped object out of the eviction orders; its disk copy goes.
void
rm_lists_leave (self_t *self, kvp_object_t *object)
{
    if (!object->cache)
        lru_remove (&self->memory, &object->in_memory);
    lru_remove (&self->unsaved, &object->unsaved);
    rm_disk_detach (self, object, true);
}
