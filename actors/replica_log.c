/*  replica_log.c - the replica-manager's object log (--segment-dir: DESIGN in
    replica_manager.c) and the values' checksums.

    A committed object on the node's own segments has a PUT record in tier/object_log.h's
    file (rm_log_put, hashing its value unless its checksum is known), and a DEL record
    before its space can be freed (rm_log_del); records are written before the writer hears
    OK and before freed space is reused (rm_log_flush), and the file is rewritten when most
    of it is dead. A log that cannot be written is removed: a restart then adopts nothing.

    Calls nothing of the actor's other files. Threads: the replica-manager's only.
*/
#include "actors/replica_manager.h"
#include "actors/replica_objects.h"
#include "infra/log.h"

typedef rm_state_t self_t;

//  The checksum a GET sends with the object's value (Reply.checksums; 0: unknown). One that
//  nobody took yet (a same-machine client's PUT_END without one, a put by address) is
//  taken here the first time another node reads the value, which is when a reader will
//  verify it: once per object, on this thread, off every put's path. Clients of this node
//  get what is known.
uint64_t
rm_checksum (self_t *self, kvp_job_t *job, kvp_object_t *object)
{
    if (!object->checksum && (job->owner_id & KVP_OWNER_NODE) && object->replica_count
        && value_checksum_verify ()) {
        int64_t started = zclock_usecs ();
        object->checksum = value_checksum (object->replicas[0].addr, object->size);
        self->log_hash_us += (uint64_t) (zclock_usecs () - started);
    }
    return object->checksum;
}

//  The index of one of the node's own segments in the directory (the allocator makes them
//  first: ids 1..segments), or -1 for memory a client mounted (not kept across restarts).
static int64_t
s_own_index (self_t *self, uint32_t segment_id)
{
    return segment_id >= 1 && segment_id <= self->config->segments ? (int64_t) segment_id - 1 : -1;
}

//  A log that could not be written is no record: it is removed, so the next start adopts
//  nothing rather than something a lost DEL would have cancelled.
static void
s_log_broken (self_t *self)
{
    kvp_error ("the object log in %s cannot be written (%s): it is removed, "
               "and a restart will not adopt this run's objects",
               self->config->segment_dir, strerror (errno));
    object_log_abandon (self->log);
    object_log_destroy (&self->log);
}

void
rm_log_put (self_t *self, kvp_object_t *object, const uint64_t *checksum)
{
    if (!self->log || object->logged || object->state != OBJECT_COMPLETE)
        return;
    bool hashed = checksum != NULL;
    for (uint32_t r = 0; r < object->replica_count; r++) {
        int64_t index = s_own_index (self, object->replicas[r].segment_id);
        if (index < 0)
            continue;
        if (!hashed) {
            int64_t started = zclock_usecs ();
            object->checksum = object_log_checksum (object->replicas[r].addr, object->size);
            self->log_hash_us += (uint64_t) (zclock_usecs () - started);
            hashed = true;
        }
        else if (checksum)
            object->checksum = *checksum;
        if (object_log_put (self->log, object->key, strlen (object->key), (uint32_t) index,
                            object->replicas[r].offset, object->size, object->version,
                            object->checksum)
            == 0) {
            object->logged = true;
            self->log_live++;
        }
    }
}

void
rm_log_del (self_t *self, kvp_object_t *object)
{
    if (!self->log || !object->logged)
        return;
    object->logged = false;
    for (uint32_t r = 0; r < object->replica_count; r++) {
        int64_t index = s_own_index (self, object->replicas[r].segment_id);
        if (index < 0)
            continue;
        object_log_del (self->log, object->key, strlen (object->key), (uint32_t) index,
                        object->replicas[r].offset, object->version);
        self->log_live--;
    }
}

//  Starts a fresh log at DIR/objects.log with the live records of every object that has
//  them, replacing the old one. Returns 0 or -1 (the old log, if any, stays).
int
rm_log_rewrite (self_t *self)
{
    char path[300];
    snprintf (path, sizeof path, "%s/objects.log", self->config->segment_dir);
    object_log_t *fresh = object_log_create (path);
    if (!fresh)
        return -1;
    object_log_t *old = self->log;
    self->log = fresh;
    self->log_live = 0;
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects))
        if (object->logged || !old) {
            object->logged = false;
            rm_log_put (self, object, object->checksum ? &object->checksum : NULL);
        }
    if (object_log_install (fresh) != 0) {
        object_log_abandon (fresh);
        object_log_destroy (&fresh);
        self->log = old;
        return -1;
    }
    object_log_destroy (&old);
    return 0;
}

void
rm_log_flush (self_t *self)
{
    if (!self->log)
        return;
    if (object_log_flush (self->log) != 0) {
        s_log_broken (self);
        return;
    }
    //  Compaction: when the file holds far more records than are live.
    if (object_log_records (self->log) > 4 * self->log_live + 100000) {
        int64_t started = zclock_usecs ();
        if (rm_log_rewrite (self) != 0)
            s_log_broken (self);
        else
            kvp_debug ("object log compacted to %llu records in %lld us",
                       (unsigned long long) self->log_live,
                       (long long) (zclock_usecs () - started));
    }
}
