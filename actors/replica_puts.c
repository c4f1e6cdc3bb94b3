/*  replica_puts.c - the replica-manager's put state machine (DESIGN in replica_manager.c):
    a server-side put (INSERT, UPSERT), a client's reservation (RESERVE -> BIND -> COMMIT, or
    REVOKE; PUT_PART of another node's bytes), revoked reservations held until their writer
    lets go, and the objects adopted from a previous run (--segment-dir).

    Called by the actor (replica_manager.c); calls down only (replica_objects.c,
    replica_log.c). Threads: the replica-manager's only.
*/
#include "actors/replica_manager.h"
#include "actors/replica_objects.h"
#include "infra/log.h"
#include "protocol/kvpool.pb-c.h"

typedef rm_state_t self_t;

//  Revokes a pending, bound reservation for everyone but its writer: the key is free at
//  once, the space only when the writer is done with it (see DESIGN).
void
rm_reservation_revoke (self_t *self, kvp_object_t *object, kvp_job_t **free_job_p, int64_t now)
{
    assert (object->state == OBJECT_PENDING && !object->busy);
    self->revoked++;
    if (object->owner == 0 || (object->owner & KVP_OWNER_NODE) || !object->bound) {
        //  Nobody outside the node can be writing into it.
        rm_object_drop (self, object, free_job_p, now);
        return;
    }
    object_table_delete (self->objects, object);
    self->pending--;
    zlistx_add_end (self->held, object);
}

//  Takes owner's revoked reservation of key off the list and frees its space. Returns true
//  if there was one.
bool
rm_revoked_end (self_t *self, uint64_t owner, const char *key, kvp_job_t **free_job_p)
{
    for (kvp_object_t *object = (kvp_object_t *) zlistx_first (self->held); object;
         object = (kvp_object_t *) zlistx_next (self->held))
        if (object->owner == owner && (!key || streq (object->key, key))) {
            zlistx_delete (self->held, zlistx_cursor (self->held));
            rm_free_replicas (free_job_p, object);
            rm_object_destroy (&object);
            return true;
        }
    return false;
}

//  A client's PUT_START: a pending object, busy until the allocator's placement is bound.
void
rm_reserve (self_t *self, kvp_job_t *job, int64_t now)
{
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        item->object_id = 0;
        if (item->status != KVPOOL_OK)
            continue;
        if (object_table_lookup (self->objects, item->key)) {
            item->status = KVPOOL_OBJECT_ALREADY_EXISTS;
            continue;
        }
        kvp_object_t *object = rm_object_new (self, job, item, now);
        object->state = OBJECT_PENDING;
        object->busy = true;
        object->owner = job->owner_id;
        object->cluster_token = item->cluster.token;
        object->put_deadline = now + (int64_t) self->config->put_timeout_ms;
        self->pending++;
        item->object_id = object->id;
    }
}

//  Records the replicas the allocator chose. Items the allocator failed release their
//  reservation. For a client's PUT_START the reservation now waits for PUT_END.
void
rm_bind (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_need_replicas (job);
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        kvp_object_t *object = item->object_id ? rm_lookup_reserved (self, item) : NULL;
        if (!object) {
            if (item->status == KVPOOL_OK)
                item->status = KVPOOL_INVALID_WRITE;
            continue;
        }
        if (item->status == KVPOOL_OK && !rm_strip_gone (self, item, &free_job)) {
            item->status = KVPOOL_NO_AVAILABLE_HANDLE;
            snprintf (job->error, sizeof job->error,
                      "the segment a value was placed in was unmounted meanwhile");
        }
        if (item->status != KVPOOL_OK) {
            rm_object_drop (self, object, &free_job, now);
            continue;
        }
        object->replica_count = item->replica_count;
        memcpy (object->replicas, item->replicas, sizeof object->replicas);
        object->bound = true;
        object->busy = false;
        object->put_deadline = now + (int64_t) self->config->put_timeout_ms;
    }
    rm_frees_apply (self, &free_job);
}

//  Makes a pending object visible: published in the index and counted.
void
rm_object_complete (self_t *self, kvp_object_t *object, int64_t now)
{
    object->state = OBJECT_COMPLETE;
    object->busy = false;
    object->touched = object->memory_since = now;
    lru_append (&self->memory, &object->in_memory);
    if (self->eager && !object->hidden)
        lru_append (&self->unsaved, &object->unsaved);
    self->bytes_stored += object->size * object->replica_count;
    self->puts++;
    kvp_trace (object->key, "trace %s: stored v%llu%s%s", object->key,
               (unsigned long long) object->version, object->hidden ? " hidden" : "",
               object->cache ? " (cache)" : "");
    if (!object->hidden) {
        rm_publish (self, object);
        rm_log_put (self, object, object->checksum ? &object->checksum : NULL);
        rm_event_stored (self, object);
    }
}

void
rm_unhide (self_t *self, kvp_object_t *object)
{
    assert (object->hidden && object->state == OBJECT_COMPLETE);
    object->hidden = false;
    kvp_trace (object->key, "trace %s: v%llu confirmed", object->key,
               (unsigned long long) object->version);
    rm_publish (self, object); //  (or counted unlisted, with no memory copy)
    if (object->replica_count && self->eager)
        lru_append (&self->unsaved, &object->unsaved);
    rm_log_put (self, object, object->checksum ? &object->checksum : NULL);
    rm_event_stored (self, object);
}

void
rm_confirm (self_t *self, kvp_job_t *job, int64_t now)
{
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK)
            continue;
        kvp_object_t *object = rm_lookup_complete (self, item->key);
        if (object && object->hidden && item->version && item->version == object->version)
            rm_unhide (self, object);
        else if (!object || object->version != item->version)
            item->status = KVPOOL_OBJECT_NOT_FOUND;
    }
    (void) now;
}

//  The reservation of item's key that this job's owner may end (PUT_END, PUT_REVOKE), or
//  NULL with the item's status and the job's reason set.
static kvp_object_t *
s_own_reservation (self_t *self, kvp_job_t *job, kvp_item_t *item, kvp_job_t **free_job_p)
{
    kvp_object_t *object = (kvp_object_t *) object_table_lookup (self->objects, item->key);
    if (object && object->state == OBJECT_PENDING && object->owner == job->owner_id && object->bound
        && !object->busy)
        return object;
    item->status = KVPOOL_INVALID_WRITE;
    if (rm_revoked_end (self, job->owner_id, item->key, free_job_p)) {
        //  Its writer is done with it: the space is free now. PUT_REVOKE asked for this.
        if (job->kind == KVP_RM_REVOKE)
            item->status = KVPOOL_OK;
        else
            snprintf (job->error, sizeof job->error,
                      "the reservation of a key was revoked (put timeout or reset) before its "
                      "PUT_END: nothing was stored");
    }
    else if (object && object->state == OBJECT_PENDING && object->owner != job->owner_id)
        snprintf (job->error, sizeof job->error, "a key is reserved by another client");
    return NULL;
}

//  The checksum a PUT_END gives its object. A same-machine client's (libkvpool hashes as
//  it copies) is taken as said: it wrote the bytes itself, and hashing them here would put
//  a pass over every value on the hot put's reply path; a client that sends none leaves it
//  unknown, to be taken off that path (rm_checksum). Another node's stripes are hashed here,
//  over the reservation they were written into, and must match what that node sent: it is
//  the one write between nodes whose bytes no copy worker saw whole. Returns 0, or -1 with
//  the item refused.
static int
s_commit_checksum (self_t *self, kvp_job_t *job, kvp_item_t *item, kvp_object_t *object)
{
    object->checksum = item->checksums.expect;
    if (!(object->owner & KVP_OWNER_NODE) || !item->checksums.expect || !value_checksum_verify ()
        || object->replica_count == 0)
        return 0;
    uint64_t got = value_checksum (object->replicas[0].addr, object->size);
    if (got == item->checksums.expect)
        return 0;
    object->checksum = 0;
    item->status = KVPOOL_INVALID_WRITE;
    self->checksum_failures++;
    snprintf (job->error, sizeof job->error,
              "the stripes written (PUT_PART) do not match the value's checksum (%016llx, they "
              "hash to %016llx): nothing stored",
              (unsigned long long) item->checksums.expect, (unsigned long long) got);
    kvp_warning ("refused '%s' from another node: its stripes do not match its checksum",
                 item->key);
    return -1;
}

//  A client's PUT_END: the object it reserved and wrote becomes visible.
void
rm_commit (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK)
            continue;
        kvp_object_t *object = s_own_reservation (self, job, item, &free_job);
        if (!object)
            continue;
        if (rm_epoch_pins (object, 0) + rm_epoch_pins (object, 1) > 0) {
            //  Only PUT_PART pins a reservation: its bytes are not all in yet.
            item->status = KVPOOL_INVALID_WRITE;
            snprintf (job->error, sizeof job->error,
                      "parts of a value are still being written (PUT_PART): PUT_END after "
                      "their replies");
            continue;
        }
        if ((object->owner & KVP_OWNER_NODE) && object->written < object->size) {
            //  Another node's reservation holds only what its PUT_PARTs wrote: the rest is
            //  whatever the space held before, never to be served as a value.
            item->status = KVPOOL_INVALID_WRITE;
            snprintf (job->error, sizeof job->error,
                      "PUT_END of a reservation of which %llu of %llu bytes were written "
                      "(PUT_PART): nothing stored",
                      (unsigned long long) object->written, (unsigned long long) object->size);
            continue;
        }
        if (s_commit_checksum (self, job, item, object) != 0) {
            //  Another node's stripes that do not add up to what it sent: never served.
            rm_object_drop (self, object, &free_job, now);
            continue;
        }
        item->cluster.token = object->cluster_token;
        item->version = object->version;
        self->pending--;
        rm_object_complete (self, object, now);
    }
    rm_frees_apply (self, &free_job);
}

//  The end of a server-side PUT, in one step: the allocator placed each value and the api
//  (or the transfer-submitter) wrote it, so the object goes in committed; nobody could see
//  it before. A key that exists by now, committed or being written, keeps its first value,
//  and this put's space is freed, as is the space of items that failed after placement.
//  Values whose copy hashed otherwise than their writer said (Request.checksums: another
//  node's UPSERT, a client's PUT) are refused before anything of them is stored or replaced:
//  their space is freed with the other failed items'.
static void
s_verify_written (self_t *self, kvp_job_t *job)
{
    if (!value_checksum_verify ())
        return;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK || !item->checksums.expect || !item->checksums.value
            || item->checksums.value == item->checksums.expect)
            continue;
        item->status = KVPOOL_INVALID_WRITE;
        self->checksum_failures++;
        snprintf (job->error, sizeof job->error,
                  "a value's bytes do not match the checksum its writer sent (%016llx, the "
                  "bytes received hash to %016llx): nothing stored for it",
                  (unsigned long long) item->checksums.expect,
                  (unsigned long long) item->checksums.value);
        kvp_warning ("refused a value for '%s' whose bytes do not match its checksum (%s)",
                     item->key,
                     job->owner_id & KVP_OWNER_NODE ? "from another node" : "from a client");
    }
}

void
rm_insert (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_need_replicas (job);
    s_verify_written (self, job);
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        //  A cache copy in the way (of an older value of the key, whose removal is on its
        //  way here) makes room: this is where the key lives now.
        kvp_object_t *in_way = item->status == KVPOOL_OK
                                   ? (kvp_object_t *) object_table_lookup (self->objects, item->key)
                                   : NULL;
        if (in_way && in_way->cache) {
            self->cache_invalidations++;
            rm_object_drop (self, in_way, &free_job, now);
        }
        //  So does another node's write that the master never committed (kvp_object_t.hidden):
        //  the master placed this put, so the key had no committed value.
        else if (in_way && in_way->hidden && in_way->state == OBJECT_COMPLETE)
            rm_object_drop (self, in_way, &free_job, now);
        if (item->status == KVPOOL_OK && object_table_lookup (self->objects, item->key))
            item->status = KVPOOL_OBJECT_ALREADY_EXISTS;
        if (item->status == KVPOOL_OK && !rm_strip_gone (self, item, &free_job)) {
            item->status = KVPOOL_NO_AVAILABLE_HANDLE;
            snprintf (job->error, sizeof job->error,
                      "the segment a value was placed in was unmounted meanwhile");
        }
        if (item->status != KVPOOL_OK) {
            if (item->replica_count) {
                kvp_object_t ghost = {
                    .size = item->size, .bound = true, .replica_count = item->replica_count};
                memcpy (ghost.replicas, item->replicas, sizeof ghost.replicas);
                rm_free_replicas (&free_job, &ghost);
            }
            continue;
        }
        kvp_object_t *object = rm_object_new (self, job, item, now);
        object->replica_count = item->replica_count;
        memcpy (object->replicas, item->replicas, sizeof object->replicas);
        object->bound = true;
        object->checksum = item->checksums.value;
        rm_object_complete (self, object, now);
    }
    rm_frees_apply (self, &free_job);
}

//  A server-side UPSERT: as an insert, but an existing committed object is replaced. The old
//  one leaves the index and the table before the new one enters, so a reader finds one or
//  the other whole; its space waits for its readers (rm_has_pins). A key being written by a
//  client (PUT_START) is not replaced: REPLICA_IS_NOT_READY, and this value's space goes.
void
rm_upsert (self_t *self, kvp_job_t *job, int64_t now)
{
    s_verify_written (self, job); //  a refused value replaces nothing
    //  Between the old object's drop and the new one's entry a same-machine reader would
    //  find the key nowhere: no answer of absence overlaps the job (shm_index.h).
    if (self->index_complete)
        shm_index_moves_begin (self->index);
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        kvp_object_t *old = item->status == KVPOOL_OK
                                ? (kvp_object_t *) object_table_lookup (self->objects, item->key)
                                : NULL;
        if (old && old->cache)
            continue; //  a cache copy: the insert drops it
        if (old && old->state != OBJECT_COMPLETE)
            item->status = KVPOOL_REPLICA_IS_NOT_READY;
        else if (old) {
            //  Out of the index first: its last read stamps are in its lease then.
            rm_withdraw (self, old, now);
            old->keep_until = old->lease_until;
            rm_object_drop (self, old, &free_job, now);
        }
    }
    rm_frees_apply (self, &free_job);
    //  Every key that is OK is free now: the insert takes them.
    rm_insert (self, job, now);
    if (self->index_complete)
        shm_index_moves_end (self->index);
}

//  A PUT_PART: each item's bytes go at its offset into its key's reservation, which this job's
//  owner made (PUT_START) and which the allocator has bound. The reservation is pinned until
//  the api has copied them (it unpins at the reply), so a revoke or a put timeout meanwhile
//  frees the space only after the copy, as a removal waits for a zero-copy send.
void
rm_part (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_need_replicas (job);
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK)
            continue;
        kvp_object_t *object = (kvp_object_t *) object_table_lookup (self->objects, item->key);
        if (!object || object->state != OBJECT_PENDING || object->owner != job->owner_id
            || !object->bound || object->busy) {
            item->status = KVPOOL_INVALID_WRITE;
            snprintf (job->error, sizeof job->error,
                      "PUT_PART of a key with no reservation of this client's to write into "
                      "(PUT_START first)");
            continue;
        }
        if (item->length != item->size || item->offset > object->size
            || item->size > object->size - item->offset) {
            item->status = KVPOOL_INVALID_PARAMS;
            snprintf (job->error, sizeof job->error,
                      "PUT_PART of %llu bytes at %llu (length %llu) does not fit a %llu-byte "
                      "reservation",
                      (unsigned long long) item->size, (unsigned long long) item->offset,
                      (unsigned long long) item->length, (unsigned long long) object->size);
            continue;
        }
        atomic_fetch_add_explicit (&object->pins[object->pin_epoch], 1, memory_order_relaxed);
        item->object = rm_pin_handle (object, object->pin_epoch);
        //  (Stripes never overlap: parts that add up to the size wrote every byte.)
        object->written += item->size;
        uint64_t size = item->size;
        rm_fill_replicas (item, object, false);
        item->size = size;
        for (uint32_t r = 0; r < item->replica_count; r++)
            item->replicas[r].addr = (char *) item->replicas[r].addr + item->offset;
        //  The writer is making progress: its reservation lasts.
        object->put_deadline = now + (int64_t) self->config->put_timeout_ms;
    }
}

void
rm_revoke (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK)
            continue;
        kvp_object_t *object = s_own_reservation (self, job, item, &free_job);
        if (!object)
            continue;
        rm_object_drop (self, object, &free_job, now);
        self->revoked++;
    }
    rm_frees_apply (self, &free_job);
}

//  KVP_RM_ADOPT (at start, with --segment-dir): the objects the allocator adopted from the
//  previous run become committed objects (in memory, published, in the eviction order), and
//  the object log starts afresh with exactly them (the compaction at start).
void
rm_adopt (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_need_replicas (job);
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK || item->replica_count == 0)
            continue;
        if (object_table_lookup (self->objects, item->key)) {
            item->status = KVPOOL_OBJECT_ALREADY_EXISTS;
            rm_free_range (&free_job, item->size, item->replicas, item->replica_count);
            continue;
        }
        kvp_object_t *object = rm_object_new (self, job, item, now);
        object->replica_count = item->replica_count;
        memcpy (object->replicas, item->replicas, item->replica_count * sizeof (kvp_replica_t));
        object->bound = true;
        object->state = OBJECT_COMPLETE;
        object->checksum = item->checksums.value;
        object->touched = object->memory_since = now;
        lru_append (&self->memory, &object->in_memory);
        if (self->eager)
            lru_append (&self->unsaved, &object->unsaved);
        rm_publish (self, object);
        self->bytes_stored += object->size * object->replica_count;
        rm_event_stored (self, object);
    }
    object_log_destroy (&self->log);
    if (rm_log_rewrite (self) != 0) {
        kvp_error ("cannot start the object log in %s: %s; objects put from "
                   "now on will not survive a restart",
                   self->config->segment_dir, strerror (errno));
        char path[300];
        snprintf (path, sizeof path, "%s/objects.log", self->config->segment_dir);
        unlink (path);
    }
    rm_frees_apply (self, &free_job);
}
