/*  replica_manager.c - the replica-manager actor: object metadata and the put state machine.

    DESIGN
    Every object is a kvp_object_t in one hash table keyed by the object's key. Its life:

        INSERT  -> COMPLETE at once: a server-side PUT, its bytes already in place
        RESERVE -> PENDING (no replicas, busy until the allocator's placement is bound)
        BIND    -> PENDING with replicas (a client writes them itself, then PUT_END)
        COMMIT  -> COMPLETE: visible to readers; immutable from here on
        REVOKE / discard timeout -> gone, its space freed

    Readers see only COMPLETE objects, so no reader ever sees a half-written value. A second
    insert or reserve of a key that exists in any state is OBJECT_ALREADY_EXISTS: the first
    value wins (an insert that loses frees the space its bytes were written to).

    Leases. A read grants the object a lease: no removal without force (nor eviction) until
    --lease-ttl after the read. Reads this actor serves (GET, EXIST,
    GET_SIZE, GET_REPLICA_LIST, TOUCH) set lease_until to the later of its value and now +
    TTL, so a read never shortens a lease. Reads served from the read index (the api's own,
    a same-machine client's, the lookup server's) never come here: their readers leave the
    time in the slot's read stamp (shm/shm_index.h), and an object's lease ends at the later
    of lease_until and its last stamp + TTL (rm_lease_end). To remove a published object
    without force, it is withdrawn from the index first and its stamp looked at again after
    the withdrawal (rm_take_unleased): a read confirmed before the withdrawal is seen, and an
    object found leased then is published again. A withdrawal for any other reason (a
    republication) folds the stamp into lease_until, so no read is lost.

    Pins. Bytes that are being sent (zero-copy GET) or copied by a same-machine client
    (GET_REPLICA_LIST with pin) are protected by pins instead: a removed object with pins
    leaves the table at once (the key is free to be put again) but its space is freed only
    when the pins are gone - ZeroMQ pins end through kvp_object_unpin (atomic, any thread),
    client pins through RELEASE by the process that took them, or its death
    (KVP_RM_OWNER_GONE). A client pin never expires by time: a reader stopped in the middle
    of its copy (SIGSTOP, a GC pause) must find the bytes it was promised when it resumes.
    Pinned-and-removed objects wait on the `doomed` list, checked every tick. Client pins are
    kept per owner and key (`pins`), so a RELEASE finds its object even after a forced
    remove, and another client cannot drop them.

    Losing a segment (UNMOUNT_SEGMENT, the death of the client that mounted it: REMOVE_SEGMENT
    jobs) takes only the replicas on it. An object whose last replica was there is removed
    (forced: its memory is going away); the others keep their other replicas, and one whose
    published replica was there is published again with another. The space of a lost replica
    is freed at once unless the object has pins: a reader that pinned the object earlier may
    be copying from that very replica (a zero-copy send reads the node's mapping, which the
    allocator unmaps once the segment's space is all free). Such a replica is `departed`:
    it waits until every pin taken before its departure is gone. To know which pins those
    are without waiting for a moment when a hot object has none, pins are counted in two
    epochs (pins[], client_pins[]): a departure moves new pins to the other epoch when that
    one is empty, so the old count can only fall (s_departed_check). A pin handle (what GET
    puts in item->object, and what the client pin table keeps) is the object's address with
    the epoch in its low bit. Objects with departed replicas are on the `departing` list,
    checked every tick. The segment's id is remembered as gone (the allocator never reuses
    ids), so a put placed there before the unmount that reaches this actor after it keeps
    only its other replicas (rm_strip_gone).

    A client's PUT_START reservation belongs to the process that made it (job->owner_id):
    only that process commits or revokes it. It is busy until BIND (the discard timeout
    leaves it alone while the allocator places it). If it is not committed within
    put_timeout_ms, or a reset comes, it is revoked for everyone else at once - the key is
    free again - but its space is not: the writer may still be copying into it (stopped,
    swapping), so the reservation waits on the `held` list until its writer sends PUT_END
    (answered INVALID_WRITE: nothing is stored) or PUT_REVOKE for it, or dies. Only then is the
    space reused, so a late writer can never write into another object's bytes. A reservation
    that loses a segment keeps its other replicas (the space on the departing segment is freed
    at once: the allocator places nothing there any more), or is revoked if it had no other.

    REMOVE_REGEX is the one job answered later: its pattern is compiled (PCRE2, bounded) and,
    when its turn comes, the keys of the committed objects it may remove are copied into a
    batch for the regex-matcher's thread (infra/regex_matcher.h), so a costly pattern never
    stalls the other jobs. When the batch comes back, the objects that matched and are still
    the same objects (same id) and still removable are removed and the job is answered; a
    batch refused for a limit removes nothing. Batches go to the matcher one at a time, in
    arrival order.

    EVICTION. Objects with memory replicas are kept in `memory`, an intrusive list in the
    order they took their place (their commit, or a second chance); objects with a disk copy
    in `disk`, likewise. The evictor's RM_EVICT walks `memory` from the oldest: an object
    used since it took its place (touched here, or read from the index: its read stamp) goes
    to the back instead; hard-pinned objects stay; leased, pinned or departing ones are
    passed over and counted; soft-pinned ones are taken only in a second pass, if the plan
    allows. A victim with a disk copy loses its memory at once (s_memory_evict); one without
    is dropped when there is no disk tier, or pinned (`offloading`) and handed back to the
    evictor for a disk copy while the plan's queue and disk room allow, kept (skipped) past
    them, or dropped anyway if the plan forces it. Memory is only ever freed after the object
    left the index and its lease was looked at again (rm_take_unleased), exactly as a remove
    does, so no same-machine reader can validate bytes that are being reused. RM_OFFLOADED
    records the copies (the object must still be the same one, by id) and frees the memory
    of those still unleased and unpinned; RM_DISK_EVICT drops the least recently used disk
    copies (a disk-only object goes with its copy, unless leased). A disk-only object is
    COMPLETE with no replica: a GET answers its disk id (no pin: ids are never reused, and an
    unlinked file stays readable to a read that opened it) and the transfer-submitter reads
    it; reads of it are counted in a sketch (admission.h) for --promote-on-hit. Every disk
    copy an object loses (removed, replaced, dropped) is unlinked by the transfer-submitter
    (`unlinks`, sent after each job).

    KV EVENTS (--kv-events-endpoint, actors/kv_events.h). This actor is where keys become
    visible and go, so it is the source of the store's KV-events stream: s_object_complete
    (PUT_END, server-side PUT and UPSERT), an adopted object (--segment-dir) and a
    registered disk copy (a restart) note BlockStored; rm_object_drop of a committed object
    (remove, regex removal, eviction, a disk-only object losing its copy, a lost segment, an
    upsert's old value) notes BlockRemoved; a REMOVE_ALL or RESET that takes every committed
    object notes one AllBlocksCleared instead of an event per key. Going to disk and coming
    back (offload, promotion) is not an event: the key stays visible. Noting is an append to
    a buffer; the batch goes to the publisher over inproc, never waiting (the feed drops
    and counts when the publisher is behind), when due (the poll wakes for it).

    Threads: one, the actor's, and the regex-matcher's, which sees only its batch. The only
    cross-thread state is kvp_object_t.pins (atomic); read stamps are written by readers in
    any process (shm_index.h).
    Ordering: jobs are handled in arrival order (a regex removal acts on the objects that
    existed when its matching began).
*/
#include "actors/replica_manager.h"

#include "infra/log.h"
#include "actors/replica_objects.h"
#include "infra/spin_poll.h"

#include <pthread.h>

#include "actors/transfer_submitter.h"
#include "messages/ops.h"
#include "shm/segment.h"
#include "protocol/kvpool.pb-c.h"

typedef rm_state_t self_t;

//  A REMOVE_REGEX job waiting for its batch's verdicts.
typedef struct {
    kvp_job_t *job;
    zframe_t *routing_id;
    regex_batch_t *batch;
} regex_run_t;

#define SWEEP_INTERVAL_MS 50

static kvp_object_t *
s_pin_object (kvp_object_t *handle, unsigned *epoch)
{
    *epoch = (unsigned) ((uintptr_t) handle & 1);
    return (kvp_object_t *) ((uintptr_t) handle & ~(uintptr_t) 1);
}

void
kvp_object_unpin (kvp_object_t *handle)
{
    unsigned epoch;
    kvp_object_t *object = s_pin_object (handle, &epoch);
    int before = atomic_fetch_sub_explicit (&object->pins[epoch], 1, memory_order_release);
    assert (before > 0);
}

void
kvp_object_unpin_cb (void *data, void *hint)
{
    (void) data;
    kvp_object_unpin ((kvp_object_t *) hint);
}

static void
s_object_destroy (kvp_object_t **object_p)
{
    if (*object_p) {
        free ((*object_p)->departed);
        free (*object_p);
        *object_p = NULL;
    }
}

//  The key of an object, for the table (object_table.h).
static const char *
s_object_key (const void *object)
{
    return ((const kvp_object_t *) object)->key;
}

static self_t *
s_self_new (zsock_t *pipe, const kvp_config_t *config)
{
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->pipe = pipe;
    self->settings = *config;
    self->config = &self->settings;
    self->router = zsock_new (ZMQ_ROUTER);
    assert (self->router);
    zsock_set_sndhwm (self->router, 0);
    zsock_set_rcvhwm (self->router, 0);
    int rc = zsock_bind (self->router, "inproc://%s-rm", config->instance);
    assert (rc == 0);
    self->allocator = config->allocator;
    if (!self->allocator)
        self->allocator = self->own_allocator = allocator_new (config);
    assert (self->allocator);
    self->readers = transfer_pool_new (1, 0);
    assert (self->readers);
    self->tx = zsock_new (ZMQ_DEALER);
    assert (self->tx);
    zsock_set_sndhwm (self->tx, 0);
    rc = zsock_connect (self->tx, "inproc://%s-tx", config->instance);
    assert (rc == 0);
    if (config->role == KVP_ROLE_NODE) {
        self->cluster = zsock_new (ZMQ_DEALER);
        assert (self->cluster);
        zsock_set_sndhwm (self->cluster, 0);
        zsock_set_linger (self->cluster, 0);
        zsock_connect (self->cluster, "inproc://%s-cl", config->instance);
    }
    lru_list_init (&self->memory);
    lru_list_init (&self->disk);
    lru_list_init (&self->unsaved);
    self->eager = config->offload == KVP_OFFLOAD_EAGER;
    rm_policy_init (self);
    self->disk_reads = admission_new (16384, (int64_t) config->promote_window_ms);
    assert (self->disk_reads);
    //  A key is stored once, in its object: the table points at the object, and objects are
    //  destroyed by us, not by the table. An object leaves the table before it is destroyed.
    self->objects = object_table_new (s_object_key);
    assert (self->objects);
    self->doomed = zlistx_new ();
    self->held = zlistx_new ();
    if (config->kv_events_endpoint)
        self->events = kv_events_feed_new (config->instance, config->kv_events_interval_ms);
    self->departing = zlistx_new ();
    self->pins = zhashx_new ();
    self->regex_runs = zlistx_new ();
    self->matcher = regex_matcher_new (config->regex_time_limit_ms);
    assert (self->regex_runs && self->matcher);
    self->next_id = 1;
    uint64_t slots = config->index_slots;
    //  One slot per 32 KiB of the node's own pool; a node that owns no memory (all of it
    //  comes from clients, which mount it later) sizes the index as for one segment.
    if (slots == UINT64_MAX)
        slots = (config->segments ? config->segments : 1) * config->segment_size / (32 * 1024);
    if (slots) {
        char name[96];
        shm_index_make_name (name, sizeof name, config->instance);
        self->index = shm_index_create (name, slots);
        //  Sealed memfds, for clients of the node's user only (shm/segment.c).
        if (!self->index)
            kvp_warning ("no same-machine index %s: %s", name, strerror (errno));
    }
    return self;
}

//  Answers a job on the router (and has the wait set ask the router again: wait_set.h).
static void
s_reply (self_t *self, zframe_t **routing_id_p, kvp_job_t *job)
{
    kvp_job_reply (self->router, routing_id_p, job);
    wait_set_touch (self->waits, self->router);
}

//  Answers the allocator's parked jobs (unmounts) that are done.
static void
s_replies_parked (self_t *self)
{
    zframe_t *reply_to;
    kvp_job_t *job;
    while ((job = allocator_finished (self->allocator, &reply_to))) {
        s_reply (self, &reply_to, job);
        zframe_destroy (&reply_to);
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
static void
s_free_replicas (kvp_job_t **free_job_p, kvp_object_t *object)
{
    if (object->bound)
        rm_free_range (free_job_p, object->size, object->replicas, object->replica_count);
    for (uint32_t d = 0; d < object->departed_count; d++)
        rm_free_range (free_job_p, object->size, &object->departed[d].replica, 1);
    object->departed_count = 0;
}

//  Whether a dropped object's bytes may still be read: sends in flight, client pins, or
//  (for one an upsert replaced) a lease whose readers may hold only a replica list.
static bool
s_has_pins (kvp_object_t *object, int64_t now)
{
    return rm_epoch_pins (object, 0) > 0 || rm_epoch_pins (object, 1) > 0
           || now < object->keep_until;
}

//  Takes an object off the departing list (its departed replicas are freed with it).
static void
s_departing_leave (self_t *self, kvp_object_t *object)
{
    if (object->departing_handle) {
        zlistx_delete (self->departing, object->departing_handle);
        object->departing_handle = NULL;
    }
}

//  ---- segments that went (see DESIGN) --------------------------------------------------

static bool
s_segment_gone (self_t *self, uint32_t id)
{
    return (size_t) id / 8 < self->gone_bytes && (self->gone[id / 8] >> (id % 8) & 1);
}

static void
s_segment_mark_gone (self_t *self, uint32_t id)
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
static uint32_t
s_replicas_split (self_t *self, kvp_replica_t *replicas, uint32_t *count, uint32_t segment,
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
    uint32_t went = s_replicas_split (self, item->replicas, &item->replica_count, 0, lost);
    rm_free_range (free_job_p, item->size, lost, went);
    return went == 0 || item->replica_count > 0;
}

//  Takes an object out of the table and frees (or dooms) it. The object pointer is invalid
//  afterwards unless it was doomed.
void
rm_object_drop (self_t *self, kvp_object_t *object, kvp_job_t **free_job_p, int64_t now)
{
    rm_log_del (self, object);
    //  Withdrawn from the index before its space can be freed (see shm_index.h).
    if (self->index && object->index_slot >= 0)
        shm_index_remove (self->index, object->index_slot);
    object->index_slot = -1;
    s_departing_leave (self, object);
    rm_lists_leave (self, object);
    object_table_delete (self->objects, object);
    if (object->state == OBJECT_PENDING)
        self->pending--;
    else {
        self->bytes_stored -= object->size * object->replica_count;
        rm_event_removed (self, object);
    }
    if (s_has_pins (object, now))
        zlistx_add_end (self->doomed, object);
    else {
        s_free_replicas (free_job_p, object);
        s_object_destroy (&object);
    }
}

//  Destroys a list of objects that are out of the table, and the list.
static void
s_objects_list_destroy (zlistx_t **list_p)
{
    kvp_object_t *object = (kvp_object_t *) zlistx_first (*list_p);
    while (object) {
        kvp_object_t *gone = object;
        object = (kvp_object_t *) zlistx_next (*list_p);
        s_object_destroy (&gone);
    }
    zlistx_destroy (list_p);
}

static void
s_self_destroy (self_t **self_p)
{
    self_t *self = *self_p;
    if (!self)
        return;
    //  At shutdown the segments go away with the process: no frees are sent.
    kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects);
    while (object) {
        kvp_object_t *doomed = object;
        object = (kvp_object_t *) object_table_next (self->objects);
        s_object_destroy (&doomed);
    }
    object_table_destroy (&self->objects);
    s_objects_list_destroy (&self->doomed);
    s_objects_list_destroy (&self->held);
    zlistx_destroy (&self->departing); //  its objects were destroyed above
    free (self->gone);
    for (pin_entry_t *entry = (pin_entry_t *) zhashx_first (self->pins); entry;
         entry = (pin_entry_t *) zhashx_next (self->pins)) {
        free (entry->objects);
        free (entry);
    }
    zhashx_destroy (&self->pins);
    free (self->pin_key);
    zlistx_destroy (&self->regex_runs);
    shm_index_destroy (&self->index);
    object_log_destroy (&self->log);
    kvp_job_destroy (&self->unlinks);
    rm_policy_destroy (self, self->router); //  placements still waiting are answered
    admission_destroy (&self->disk_reads);
    kv_events_feed_destroy (&self->events); //  hands over the last batch
    zsock_destroy (&self->router);
    allocator_destroy (&self->own_allocator);
    transfer_pool_destroy (&self->readers);
    zsock_destroy (&self->tx);
    kvp_job_destroy (&self->dropped);
    zsock_destroy (&self->cluster);
    free (self);
    *self_p = NULL;
}

//  ---- client pins, by owner ---------------------------------------------------------

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
    kvp_object_t *object = s_pin_object (handle, &epoch);
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
static void
s_pins_drop_owner (self_t *self, uint64_t owner)
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

//  ---- revoked reservations -----------------------------------------------------------

//  Revokes a pending, bound reservation for everyone but its writer: the key is free at
//  once, the space only when the writer is done with it (see DESIGN).
static void
s_reservation_revoke (self_t *self, kvp_object_t *object, kvp_job_t **free_job_p, int64_t now)
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
static bool
s_revoked_end (self_t *self, uint64_t owner, const char *key, kvp_job_t **free_job_p)
{
    for (kvp_object_t *object = (kvp_object_t *) zlistx_first (self->held); object;
         object = (kvp_object_t *) zlistx_next (self->held))
        if (object->owner == owner && (!key || streq (object->key, key))) {
            zlistx_delete (self->held, zlistx_cursor (self->held));
            s_free_replicas (free_job_p, object);
            s_object_destroy (&object);
            return true;
        }
    return false;
}

static kvp_object_t *
s_lookup_complete (self_t *self, const char *key)
{
    kvp_object_t *object = (kvp_object_t *) object_table_lookup (self->objects, key);
    return object && object->state == OBJECT_COMPLETE ? object : NULL;
}

//  The pending object a job item reserved, if it is still the same one.
static kvp_object_t *
s_lookup_reserved (self_t *self, kvp_item_t *item)
{
    kvp_object_t *object = (kvp_object_t *) object_table_lookup (self->objects, item->key);
    if (object && object->state == OBJECT_PENDING && item->object_id
        && object->id == item->object_id)
        return object;
    return NULL;
}

static void
s_fill_replicas (kvp_item_t *item, kvp_object_t *object, bool rotate)
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
    object->size = item->size;
    object->hard_pin = job->hard_pin;
    if (job->soft_pin)
        object->soft_pin_until = now
                                 + (int64_t) (job->soft_pin_ttl_ms ? job->soft_pin_ttl_ms
                                                                   : self->config->soft_pin_ttl_ms);
    atomic_init (&object->pins[0], 0);
    atomic_init (&object->pins[1], 0);
    object->index_slot = -1;
    int rc = object_table_insert (self->objects, object);
    assert (rc == 0); //  out of memory, as zhashx would abort
    return object;
}

//  A client's PUT_START: a pending object, busy until the allocator's placement is bound.
static void
s_reserve (self_t *self, kvp_job_t *job, int64_t now)
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
        object->cluster_token = item->cluster_token;
        object->put_deadline = now + (int64_t) self->config->put_timeout_ms;
        self->pending++;
        item->object_id = object->id;
    }
}

//  Records the replicas the allocator chose. Items the allocator failed release their
//  reservation. For a client's PUT_START the reservation now waits for PUT_END.
static void
s_bind (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_need_replicas (job);
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        kvp_object_t *object = item->object_id ? s_lookup_reserved (self, item) : NULL;
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

//  ---- leases ------------------------------------------------------------------------

//  The lease a read stamped at read_ms (shm_index_last_read; 0: none) grants. A stamp is a
//  reader's word: one further ahead of now than STAMP_FUTURE_MAX_MS is no read at all, so a
//  client can lease an object no longer than by reading it. (A true stamp can be ahead of
//  now, the time a job started, by as long as the job has been running.)
static int64_t
s_stamp_lease (self_t *self, int64_t read_ms, int64_t now)
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
            s_stamp_lease (self, shm_index_last_read (self->index, object->index_slot), now);
        if (stamped > end)
            end = stamped;
    }
    return end;
}

//  Publishes a committed object in the index (its first replica), unread.
void
rm_publish (self_t *self, kvp_object_t *object)
{
    if (self->index && object->replica_count && object->index_slot < 0)
        object->index_slot = shm_index_insert (self->index, object->key, strlen (object->key),
                                               object->replicas[0].segment_id,
                                               object->replicas[0].offset, object->size);
}

//  Withdraws an object from the index, keeping the lease its index reads granted.
static void
s_withdraw (self_t *self, kvp_object_t *object, int64_t now)
{
    if (!self->index || object->index_slot < 0)
        return;
    int64_t stamped = s_stamp_lease (self, shm_index_remove (self->index, object->index_slot), now);
    object->index_slot = -1;
    if (stamped > object->lease_until)
        object->lease_until = stamped;
}

//  Whether a removal without force may take the object now, as far as can be told without
//  touching the index: no lease, no client pin.
static bool
s_looks_removable (self_t *self, kvp_object_t *object, bool force, int64_t now)
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
    if (!s_looks_removable (self, object, force, now))
        return false;
    if (force || object->index_slot < 0)
        return true;
    s_withdraw (self, object, now);
    if (object->lease_until <= now)
        return true;
    rm_publish (self, object);
    return false;
}

//  Makes a pending object visible: published in the index and counted.
static void
s_object_complete (self_t *self, kvp_object_t *object, int64_t now)
{
    object->state = OBJECT_COMPLETE;
    object->busy = false;
    object->touched = object->memory_since = now;
    lru_append (&self->memory, &object->in_memory);
    if (self->eager)
        lru_append (&self->unsaved, &object->unsaved);
    rm_publish (self, object);
    rm_log_put (self, object, object->checksum ? &object->checksum : NULL);
    self->bytes_stored += object->size * object->replica_count;
    self->puts++;
    rm_event_stored (self, object);
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
    if (s_revoked_end (self, job->owner_id, item->key, free_job_p)) {
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
    object->checksum = item->expect_checksum;
    if (!(object->owner & KVP_OWNER_NODE) || !item->expect_checksum || !value_checksum_verify ()
        || object->replica_count == 0)
        return 0;
    uint64_t got = value_checksum (object->replicas[0].addr, object->size);
    if (got == item->expect_checksum)
        return 0;
    object->checksum = 0;
    item->status = KVPOOL_INVALID_WRITE;
    self->checksum_failures++;
    snprintf (job->error, sizeof job->error,
              "the stripes written (PUT_PART) do not match the value's checksum (%016llx, they "
              "hash to %016llx): nothing stored",
              (unsigned long long) item->expect_checksum, (unsigned long long) got);
    kvp_warning ("refused '%s' from another node: its stripes do not match its checksum",
                 item->key);
    return -1;
}

//  A client's PUT_END: the object it reserved and wrote becomes visible.
static void
s_commit (self_t *self, kvp_job_t *job, int64_t now)
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
        item->cluster_token = object->cluster_token;
        self->pending--;
        s_object_complete (self, object, now);
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
        if (item->status != KVPOOL_OK || !item->expect_checksum || !item->checksum
            || item->checksum == item->expect_checksum)
            continue;
        item->status = KVPOOL_INVALID_WRITE;
        self->checksum_failures++;
        snprintf (job->error, sizeof job->error,
                  "a value's bytes do not match the checksum its writer sent (%016llx, the "
                  "bytes received hash to %016llx): nothing stored for it",
                  (unsigned long long) item->expect_checksum, (unsigned long long) item->checksum);
        kvp_warning ("refused a value for '%s' whose bytes do not match its checksum (%s)",
                     item->key, job->owner_id & KVP_OWNER_NODE ? "from another node"
                                                               : "from a client");
    }
}

static void
s_insert (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_need_replicas (job);
    s_verify_written (self, job);
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
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
                s_free_replicas (&free_job, &ghost);
            }
            continue;
        }
        kvp_object_t *object = rm_object_new (self, job, item, now);
        object->replica_count = item->replica_count;
        memcpy (object->replicas, item->replicas, sizeof object->replicas);
        object->bound = true;
        object->checksum = item->checksum;
        s_object_complete (self, object, now);
    }
    rm_frees_apply (self, &free_job);
}

//  A server-side UPSERT: as an insert, but an existing committed object is replaced. The old
//  one leaves the index and the table before the new one enters, so a reader finds one or
//  the other whole; its space waits for its readers (s_has_pins). A key being written by a
//  client (PUT_START) is not replaced: REPLICA_IS_NOT_READY, and this value's space goes.
static void
s_upsert (self_t *self, kvp_job_t *job, int64_t now)
{
    s_verify_written (self, job); //  a refused value replaces nothing
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        kvp_object_t *old = item->status == KVPOOL_OK
                                ? (kvp_object_t *) object_table_lookup (self->objects, item->key)
                                : NULL;
        if (old && old->state != OBJECT_COMPLETE)
            item->status = KVPOOL_REPLICA_IS_NOT_READY;
        else if (old) {
            //  Out of the index first: its last read stamps are in its lease then.
            s_withdraw (self, old, now);
            old->keep_until = old->lease_until;
            rm_object_drop (self, old, &free_job, now);
        }
    }
    rm_frees_apply (self, &free_job);
    //  Every key that is OK is free now: the insert takes them.
    s_insert (self, job, now);
}

//  A PUT_PART: each item's bytes go at its offset into its key's reservation, which this job's
//  owner made (PUT_START) and which the allocator has bound. The reservation is pinned until
//  the api has copied them (it unpins at the reply), so a revoke or a put timeout meanwhile
//  frees the space only after the copy, as a removal waits for a zero-copy send.
static void
s_part (self_t *self, kvp_job_t *job, int64_t now)
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
        s_fill_replicas (item, object, false);
        item->size = size;
        for (uint32_t r = 0; r < item->replica_count; r++)
            item->replicas[r].addr = (char *) item->replicas[r].addr + item->offset;
        //  The writer is making progress: its reservation lasts.
        object->put_deadline = now + (int64_t) self->config->put_timeout_ms;
    }
}

static void
s_revoke (self_t *self, kvp_job_t *job, int64_t now)
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

static void
s_read (self_t *self, kvp_job_t *job, int64_t now)
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
        kvp_object_t *object = s_lookup_complete (self, item->key);
        if (job->kind == KVP_RM_GET)
            self->gets++;
        if (!object) {
            item->status = KVPOOL_OBJECT_NOT_FOUND;
            continue;
        }
        item->size = object->size;
        if (lease_until > object->lease_until)
            object->lease_until = lease_until;
        object->touched = now;
        if (job->kind == KVP_RM_GET)
            item->checksum = rm_checksum (self, job, object);
        if (job->kind == KVP_RM_GET && object->replica_count == 0) {
            //  On disk only: the transfer-submitter reads it next (no pin: an unlinked
            //  copy stays readable to a read that opened it, and ids are never reused).
            self->get_hits++;
            self->disk_hits++;
            item->replica_count = 0;
            item->disk_id = object->disk_id;
            item->object_id = object->id;
            item->promote = rm_promote_due (self, object, now);
            continue;
        }
        switch (job->kind) {
            case KVP_RM_GET:
                self->get_hits++;
                atomic_fetch_add_explicit (&object->pins[object->pin_epoch], 1,
                                           memory_order_relaxed);
                item->object = rm_pin_handle (object, object->pin_epoch);
                s_fill_replicas (item, object, true);
                break;
            case KVP_RM_REPLICA_LIST:
                if (job->pin)
                    s_pin_add (self, job->owner_id, object);
                s_fill_replicas (item, object, true);
                break;
            default: break; //  EXIST, GET_SIZE, TOUCH: the lease only
        }
    }
}

//  PREFIX_MATCH: blocks of job->ranks keys, in order. Every key of a whole block is leased as
//  a read leases it (the engine loads those blocks next); the first block with a key missing
//  ends the walk: from there on every key is OBJECT_NOT_FOUND, unchecked past the missing
//  one (kvp_job_prefix_count then counts the whole blocks).
static void
s_prefix (self_t *self, kvp_job_t *job, int64_t now)
{
    size_t ranks = job->ranks ? job->ranks : 1;
    int64_t lease_until = now + (int64_t) self->config->lease_ttl_ms;
    size_t at = 0;
    for (; at + ranks <= job->count; at += ranks) {
        bool whole = true;
        for (size_t r = 0; r < ranks && whole; r++) {
            kvp_item_t *item = &job->items[at + r];
            whole = item->status == KVPOOL_OK && s_lookup_complete (self, item->key);
        }
        if (!whole)
            break;
        for (size_t r = 0; r < ranks; r++) {
            kvp_object_t *object = s_lookup_complete (self, job->items[at + r].key);
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

static void
s_remove (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_job_t *free_job = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK)
            continue;
        kvp_object_t *object = s_lookup_complete (self, item->key);
        //  With an object id (a copy the master refused, membership.c): that object alone,
        //  never a newer one put under the key since.
        if (!object || (item->object_id && object->id != item->object_id))
            item->status = KVPOOL_OBJECT_NOT_FOUND;
        else if (!rm_take_unleased (self, object, job->force, now))
            item->status = KVPOOL_OBJECT_HAS_LEASE;
        else {
            rm_object_drop (self, object, &free_job, now);
            self->removes++;
        }
    }
    rm_frees_apply (self, &free_job);
}

//  REMOVE_ALL and RESET: one pass over the table.
static void
s_remove_many (self_t *self, kvp_job_t *job, int64_t now)
{
    //  A reset also revokes client reservations.
    bool reset = job->op == KVPOOL__V1__OP__RESET;
    zlistx_t *victims = zlistx_new ();
    bool all_go = true; //  every committed object: one AllBlocksCleared, no event per key
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects)) {
        if (object->state != OBJECT_COMPLETE && !(reset && !object->busy))
            continue;
        if (object->state == OBJECT_COMPLETE && !rm_take_unleased (self, object, job->force, now)) {
            all_go = false;
            continue;
        }
        zlistx_add_end (victims, object);
    }
    if (self->events && all_go) {
        kv_events_feed_add (self->events, KV_EVENT_CLEARED, NULL, 0);
        self->events_quiet = true;
    }
    kvp_job_t *free_job = NULL;
    uint64_t removed = 0;
    for (kvp_object_t *object = (kvp_object_t *) zlistx_first (victims); object;
         object = (kvp_object_t *) zlistx_next (victims)) {
        if (object->state == OBJECT_COMPLETE) {
            removed++;
            self->removes++;
            rm_object_drop (self, object, &free_job, now);
        }
        else
            //  Nothing lands after a reset, and no late writer lands in reused space.
            s_reservation_revoke (self, object, &free_job, now);
    }
    zlistx_destroy (&victims);
    self->events_quiet = false;
    rm_frees_apply (self, &free_job);
    job->result_count = removed;
}

//  ---- losing a segment ----------------------------------------------------------------

//  Moves the object's pins to the other epoch if its departed replicas wait for the current
//  one and the other is empty: from then on, the pins they wait for can only end.
static void
s_pin_epoch_turn (kvp_object_t *object)
{
    unsigned current = object->pin_epoch, other = current ^ 1;
    bool waiting = false;
    for (uint32_t d = 0; d < object->departed_count; d++)
        waiting |= (object->departed[d].epochs >> current & 1) != 0;
    if (waiting && rm_epoch_pins (object, other) == 0)
        object->pin_epoch = (uint8_t) other;
}

//  Frees the departed replicas whose readers are gone: an epoch whose count is zero now
//  holds no pin taken before the replica departed (pins are taken on this thread only).
//  Returns true when none is left.
static bool
s_departed_check (kvp_object_t *object, kvp_job_t **free_job_p)
{
    uint8_t empty =
        (uint8_t) ((rm_epoch_pins (object, 0) == 0) | (rm_epoch_pins (object, 1) == 0) << 1);
    uint32_t kept = 0;
    for (uint32_t d = 0; d < object->departed_count; d++) {
        departed_t *departed = &object->departed[d];
        departed->epochs &= (uint8_t) ~empty;
        if (departed->epochs == 0)
            rm_free_range (free_job_p, object->size, &departed->replica, 1);
        else
            object->departed[kept++] = *departed;
    }
    object->departed_count = kept;
    s_pin_epoch_turn (object);
    return kept == 0;
}

//  The object lost the replicas in lost[0..count) with their segment: their space is freed
//  now, or once the pins that may be reading them are gone.
static void
s_replicas_depart (self_t *self, kvp_object_t *object, const kvp_replica_t *lost, uint32_t count,
                   kvp_job_t **free_job_p)
{
    uint8_t epochs =
        (uint8_t) ((rm_epoch_pins (object, 0) > 0) | (rm_epoch_pins (object, 1) > 0) << 1);
    if (epochs == 0 || object->state != OBJECT_COMPLETE) {
        //  Nobody reads it (a reservation's writer writes into its own mapping of a segment
        //  on which the allocator places nothing any more).
        rm_free_range (free_job_p, object->size, lost, count);
        return;
    }
    if (!object->departed) {
        object->departed = (departed_t *) malloc (KVP_MAX_REPLICAS * sizeof (departed_t));
        assert (object->departed);
    }
    for (uint32_t r = 0; r < count; r++)
        object->departed[object->departed_count++] = (departed_t){lost[r], epochs};
    if (!object->departing_handle)
        object->departing_handle = zlistx_add_end (self->departing, object);
    s_pin_epoch_turn (object);
}

//  REMOVE_SEGMENT: the segment is going away (unmounted, or its owner died). Every object
//  loses its replicas there; one left with none is removed (forced: the memory goes), a
//  reservation left with none is revoked. The segment is remembered as gone for the puts
//  placed there that reach this actor later. result_count: objects removed.
static void
s_remove_segment (self_t *self, kvp_job_t *job, int64_t now)
{
    uint32_t segment = job->segment_id;
    if (segment == 0)
        return;
    s_segment_mark_gone (self, segment);
    zlistx_t *victims = zlistx_new ();
    kvp_job_t *free_job = NULL;
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects)) {
        if (object->busy || !object->bound)
            continue; //  still being placed: s_bind strips it
        bool on_segment = false;
        for (uint32_t r = 0; r < object->replica_count; r++)
            on_segment |= object->replicas[r].segment_id == segment;
        if (!on_segment)
            continue;
        if (object->replica_count == 1) {
            zlistx_add_end (victims, object);
            continue;
        }
        //  A reader of the index must not copy from the departing replica once its space
        //  can be freed: withdrawn first (its reads' lease kept), published again with a
        //  replica that stays.
        bool published = object->index_slot >= 0;
        if (published && object->replicas[0].segment_id == segment)
            s_withdraw (self, object, now);
        kvp_replica_t lost[KVP_MAX_REPLICAS];
        uint32_t went =
            s_replicas_split (self, object->replicas, &object->replica_count, segment, lost);
        if (object->state == OBJECT_COMPLETE)
            self->bytes_stored -= object->size * went;
        s_replicas_depart (self, object, lost, went, &free_job);
        if (published && object->index_slot < 0)
            rm_publish (self, object);
    }
    uint64_t removed = 0;
    for (kvp_object_t *object = (kvp_object_t *) zlistx_first (victims); object;
         object = (kvp_object_t *) zlistx_next (victims)) {
        if (object->state == OBJECT_COMPLETE) {
            removed++;
            self->removes++;
            rm_object_drop (self, object, &free_job, now);
        }
        else {
            //  Its space is freed now (nobody else can be given it: see above); the writer
            //  learns at PUT_END that nothing was stored.
            rm_free_range (&free_job, object->size, object->replicas, object->replica_count);
            object->replica_count = 0;
            s_reservation_revoke (self, object, &free_job, now);
        }
    }
    zlistx_destroy (&victims);
    self->events_quiet = false;
    rm_frees_apply (self, &free_job);
    job->result_count = removed;
}

//  A same-machine client process is gone, and none of its requests is still out (the api
//  waits for that): its pins, reservations and revoked reservations end.
static void
s_owner_gone (self_t *self, kvp_job_t *job, int64_t now)
{
    uint64_t owner = job->owner_id;
    if (owner == 0)
        return;
    s_pins_drop_owner (self, owner);
    kvp_job_t *free_job = NULL;
    zlistx_t *reservations = zlistx_new ();
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects))
        if (object->state == OBJECT_PENDING && object->owner == owner && !object->busy)
            zlistx_add_end (reservations, object);
    for (kvp_object_t *object = (kvp_object_t *) zlistx_first (reservations); object;
         object = (kvp_object_t *) zlistx_next (reservations)) {
        rm_object_drop (self, object, &free_job, now);
        self->revoked++;
    }
    job->result_count = zlistx_size (reservations);
    zlistx_destroy (&reservations);
    while (s_revoked_end (self, owner, NULL, &free_job))
        job->result_count++;
    rm_frees_apply (self, &free_job);
}

//  ---- remove by regex, matched on the regex-matcher's thread --------------------------

//  Answers a run's job and frees the run.
static void
s_regex_run_end (self_t *self, regex_run_t **run_p)
{
    regex_run_t *run = *run_p;
    s_reply (self, &run->routing_id, run->job);
    zframe_destroy (&run->routing_id);
    regex_batch_destroy (&run->batch);
    free (run);
    *run_p = NULL;
}

//  Copies the keys of the committed objects the run's job may remove now into its batch,
//  with their ids. Returns 0 or -1.
static int
s_regex_fill (self_t *self, regex_run_t *run, int64_t now)
{
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects)) {
        if (object->state != OBJECT_COMPLETE
            || !s_looks_removable (self, object, run->job->force, now))
            continue;
        if (regex_batch_add (run->batch, object->key, strlen (object->key), object->id) == -1)
            return -1;
    }
    return 0;
}

//  Unless a batch is out already, fills the oldest waiting run's batch and lends it to the
//  matcher. The keys are copied only now, so one copy of them exists at a time however many
//  requests wait. A run with no keys to match is answered at once.
static void
s_regex_next (self_t *self)
{
    while (!self->regex_out && zlistx_size (self->regex_runs) > 0) {
        regex_run_t *run = (regex_run_t *) zlistx_first (self->regex_runs);
        if (s_regex_fill (self, run, zclock_mono ()) == -1)
            kvp_job_fail (run->job, KVPOOL_INTERNAL_ERROR, "no memory for the keys to match");
        else if (regex_batch_count (run->batch) > 0
                 && regex_matcher_submit (self->matcher, run->batch) == 0) {
            wait_set_touch (self->waits, regex_matcher_sock (self->matcher));
            self->regex_out = true;
            break;
        }
        else if (regex_batch_count (run->batch) > 0)
            kvp_job_fail (run->job, KVPOOL_INTERNAL_ERROR, "regex matcher unavailable");
        zlistx_delete (self->regex_runs, zlistx_cursor (self->regex_runs));
        s_regex_run_end (self, &run); //  result_count 0 unless failed
    }
}

//  REMOVE_REGEX: a pattern that does not compile (or is too long) is answered at once;
//  otherwise the job waits in regex_runs (the routing id with it) for its turn at the matcher
//  and the verdicts.
static void
s_regex_start (self_t *self, kvp_job_t *job, zframe_t **routing_id_p)
{
    const char *pattern = job->pattern ? job->pattern : "";
    char reason[128];
    regex_run_t *run = (regex_run_t *) zmalloc (sizeof (regex_run_t));
    run->job = job;
    run->routing_id = *routing_id_p;
    *routing_id_p = NULL;
    run->batch = regex_batch_new (pattern, strlen (pattern), self->config->max_regex_len, reason,
                                  sizeof reason);
    if (!run->batch) {
        kvp_job_fail (job, KVPOOL_INVALID_PARAMS, "%s", reason);
        s_regex_run_end (self, &run);
        return;
    }
    job->result_count = 0;
    zlistx_add_end (self->regex_runs, run);
    s_regex_next (self);
}

//  The matcher handed a batch back: removes what matched, if nothing was refused, and
//  answers the job.
static void
s_regex_finish (self_t *self)
{
    regex_batch_t *batch = regex_matcher_recv (self->matcher);
    if (!batch)
        return;
    //  One batch is out at a time: the oldest run's.
    regex_run_t *run = (regex_run_t *) zlistx_first (self->regex_runs);
    assert (self->regex_out && run && run->batch == batch);
    zlistx_delete (self->regex_runs, zlistx_cursor (self->regex_runs));
    self->regex_out = false;
    kvp_job_t *job = run->job;
    if (regex_batch_status (batch) != KVPOOL_OK)
        kvp_job_fail (job, regex_batch_status (batch), "%s; nothing removed",
                      regex_batch_error (batch));
    else {
        int64_t now = zclock_mono ();
        kvp_job_t *free_job = NULL;
        uint64_t removed = 0;
        for (size_t i = 0; i < regex_batch_count (batch); i++) {
            if (!regex_batch_hit (batch, i))
                continue;
            //  Only the object the key was copied from, if it is still there and removable.
            kvp_object_t *object = (kvp_object_t *) object_table_lookup (
                self->objects, regex_batch_key (batch, i, NULL));
            if (!object || object->id != regex_batch_tag (batch, i)
                || object->state != OBJECT_COMPLETE
                || !rm_take_unleased (self, object, job->force, now))
                continue;
            rm_object_drop (self, object, &free_job, now);
            self->removes++;
            removed++;
        }
        rm_frees_apply (self, &free_job);
        job->result_count = removed;
    }
    s_regex_run_end (self, &run);
    s_regex_next (self);
}

//  At the end: stops the matcher (a match in progress ends at its next key) and answers the
//  waiting jobs, to a requester that is normally gone by now (the api drains first).
static void
s_regex_stop (self_t *self)
{
    regex_matcher_destroy (&self->matcher);
    regex_run_t *run;
    while ((run = (regex_run_t *) zlistx_first (self->regex_runs))) {
        zlistx_delete (self->regex_runs, zlistx_cursor (self->regex_runs));
        kvp_job_fail (run->job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                      "the store is stopping; nothing removed");
        s_regex_run_end (self, &run);
    }
    self->regex_out = false;
}

//  ---- the object log (--segment-dir) -------------------------------------------------

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
                            object->replicas[r].offset, object->size, object->id, object->checksum)
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
                        object->replicas[r].offset, object->id);
        self->log_live--;
    }
}

//  Starts a fresh log at DIR/objects.log with the live records of every object that has
//  them, replacing the old one. Returns 0 or -1 (the old log, if any, stays).
static int
s_log_rewrite (self_t *self)
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
        if (s_log_rewrite (self) != 0)
            s_log_broken (self);
        else
            kvp_debug ("object log compacted to %llu records in %lld us",
                       (unsigned long long) self->log_live,
                       (long long) (zclock_usecs () - started));
    }
}

//  KVP_RM_ADOPT (at start, with --segment-dir): the objects the allocator adopted from the
//  previous run become committed objects (in memory, published, in the eviction order), and
//  the object log starts afresh with exactly them (the compaction at start).
static void
s_adopt (self_t *self, kvp_job_t *job, int64_t now)
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
        object->checksum = item->checksum;
        object->touched = object->memory_since = now;
        lru_append (&self->memory, &object->in_memory);
        if (self->eager)
            lru_append (&self->unsaved, &object->unsaved);
        rm_publish (self, object);
        self->bytes_stored += object->size * object->replica_count;
        rm_event_stored (self, object);
    }
    object_log_destroy (&self->log);
    if (s_log_rewrite (self) != 0) {
        kvp_error ("cannot start the object log in %s: %s; objects put from "
                   "now on will not survive a restart",
                   self->config->segment_dir, strerror (errno));
        char path[300];
        snprintf (path, sizeof path, "%s/objects.log", self->config->segment_dir);
        unlink (path);
    }
    rm_frees_apply (self, &free_job);
}

//  Every committed object held here (in memory or on disk), for the master (a node that
//  registers reports what it holds).
static void
s_inventory (self_t *self, kvp_job_t *job)
{
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects))
        if (object->state == OBJECT_COMPLETE) {
            kvp_item_t *item = kvp_job_append_key (job, object->key, strlen (object->key));
            item->size = object->size;
            item->object_id = object->id;
        }
}

//  Objects looked at for the pinned and leased counts per STATS: a second's walk costs about
//  a millisecond (STATS comes once a second from the metrics thread).
#define COUNT_WALK_BUDGET 65536

//  Pinned and leased objects, by a walk of the table a slice at a time. A pass that ends
//  here gives the counts; below COUNT_WALK_BUDGET objects every STATS makes a whole pass.
static void
s_count_pins (self_t *self)
{
    int64_t now = zclock_mono ();
    for (size_t n = 0; n < COUNT_WALK_BUDGET; n++) {
        kvp_object_t *object =
            (kvp_object_t *) object_table_walk (self->objects, &self->count_slot);
        if (!object) {
            self->pinned_objects = self->pinned_seen;
            self->leased_objects = self->leased_seen;
            self->pinned_seen = self->leased_seen = 0;
            self->count_slot = 0;
            return;
        }
        if (object->state != OBJECT_COMPLETE)
            continue;
        if (object->hard_pin || object->soft_pin_until > now)
            self->pinned_seen++;
        if (rm_lease_end (self, object, now) > now)
            self->leased_seen++;
    }
}

static void
s_stats (self_t *self, kvp_job_t *job)
{
    s_count_pins (self);
    job->stats.pinned_objects = self->pinned_objects;
    job->stats.leased_objects = self->leased_objects;
    job->stats.objects = object_table_size (self->objects) - self->pending;
    job->stats.pending_puts = self->pending;
    job->stats.bytes_stored = self->bytes_stored;
    job->stats.puts = self->puts;
    job->stats.gets = self->gets;
    job->stats.get_hits = self->get_hits;
    job->stats.removes = self->removes;
    job->stats.revoked_puts = self->revoked;
    job->stats.evictions = self->evictions;
    job->stats.evicted_bytes = self->evicted_bytes;
    job->stats.evictions_dropped = self->dropped_evictions;
    job->stats.disk_objects = self->disk.count;
    job->stats.disk_bytes = self->disk_bytes;
    job->stats.disk_hits = self->disk_hits;
    job->stats.disk_drops = self->disk_drops;
    job->stats.disk_corrupt = self->disk_lost;
    job->stats.checksum_failures = self->checksum_failures; //  the cluster adds its own
    job->stats.promotions = self->promotions;
    rm_policy_stats (self, &job->stats);
    job->stats.kv_events = kv_events_feed_events (self->events);
    job->stats.kv_events_dropped = kv_events_feed_dropped (self->events);
}

//  A setting changed at run time (CONFIG; the api checked it): the lease of later reads.
static void
s_config (self_t *self, kvp_job_t *job)
{
    char why[256];
    if (job->setting && job->setting_value
        && kvp_config_change (&self->settings, job->setting, job->setting_value, why, sizeof why))
        kvp_job_fail (job, KVPOOL_INVALID_PARAMS, "%s", why);
    rm_policy_config (self);
}

//  Frees doomed objects whose pins are gone and revokes client reservations past their
//  discard timeout.
static void
s_sweep (self_t *self, int64_t now)
{
    kvp_job_t *free_job = NULL;
    //  Departed replicas whose readers are gone.
    kvp_object_t *object = (kvp_object_t *) zlistx_first (self->departing);
    while (object) {
        if (s_departed_check (object, &free_job)) {
            zlistx_delete (self->departing, zlistx_cursor (self->departing));
            object->departing_handle = NULL;
            object = (kvp_object_t *) zlistx_first (self->departing);
        }
        else
            object = (kvp_object_t *) zlistx_next (self->departing);
    }
    object = (kvp_object_t *) zlistx_first (self->doomed);
    while (object) {
        if (!s_has_pins (object, now)) {
            zlistx_delete (self->doomed, zlistx_cursor (self->doomed));
            s_free_replicas (&free_job, object);
            s_object_destroy (&object);
            object = (kvp_object_t *) zlistx_first (self->doomed);
        }
        else
            object = (kvp_object_t *) zlistx_next (self->doomed);
    }
    if (self->pending) {
        zlistx_t *expired = NULL;
        for (object = (kvp_object_t *) object_table_first (self->objects); object;
             object = (kvp_object_t *) object_table_next (self->objects))
            if (object->state == OBJECT_PENDING && !object->busy && object->put_deadline <= now) {
                if (!expired)
                    expired = zlistx_new ();
                zlistx_add_end (expired, object);
            }
        if (expired) {
            for (object = (kvp_object_t *) zlistx_first (expired); object;
                 object = (kvp_object_t *) zlistx_next (expired))
                s_reservation_revoke (self, object, &free_job, now);
            zlistx_destroy (&expired);
        }
    }
    rm_frees_apply (self, &free_job);
}

//  Does one job, its own kind or the allocator's. Returns true when it was parked with
//  *reply_to_p: an UNMOUNT waiting for its segment to empty (the loop's s_replies_parked
//  answers it once a free or a tick ends it), or a placement waiting for disk copies to free
//  room (rm_room_made hands it back).
static bool
s_handle_job (self_t *self, kvp_job_t *job, zframe_t **reply_to_p)
{
    if (kvp_job_kind_is_allocators (job->kind)) {
        if (allocator_handle (self->allocator, job, reply_to_p))
            return true;
        //  A placement that found no room makes it here, now (replica_evict.c).
        return job->kind == KVP_AL_ALLOC
               && rm_make_room (self, job, reply_to_p, zclock_mono ());
    }
    int64_t now = zclock_mono ();
    switch (job->kind) {
        case KVP_RM_RESERVE: s_reserve (self, job, now); break;
        case KVP_RM_BIND: s_bind (self, job, now); break;
        case KVP_RM_COMMIT: s_commit (self, job, now); break;
        case KVP_RM_PART: s_part (self, job, now); break;
        case KVP_RM_INSERT: s_insert (self, job, now); break;
        case KVP_RM_UPSERT: s_upsert (self, job, now); break;
        case KVP_RM_REVOKE: s_revoke (self, job, now); break;
        case KVP_RM_GET:
        case KVP_RM_EXIST:
        case KVP_RM_GET_SIZE:
        case KVP_RM_REPLICA_LIST:
        case KVP_RM_RELEASE:
        case KVP_RM_TOUCH: s_read (self, job, now); break;
        case KVP_RM_PREFIX: s_prefix (self, job, now); break;
        case KVP_RM_REMOVE: s_remove (self, job, now); break;
        case KVP_RM_REMOVE_ALL: s_remove_many (self, job, now); break;
        case KVP_RM_REMOVE_SEGMENT: s_remove_segment (self, job, now); break;
        case KVP_RM_OWNER_GONE: s_owner_gone (self, job, now); break;
        case KVP_RM_STATS: s_stats (self, job); break;
        case KVP_RM_CONFIG: s_config (self, job); break;
        case KVP_RM_INVENTORY: s_inventory (self, job); break;
        case KVP_RM_DISK_REGISTER: rm_disk_register (self, job, now); break;
        case KVP_RM_DISK_LOST: rm_disk_lost (self, job, now); break;
        case KVP_RM_PROMOTE: rm_promote (self, job, now); break;
        case KVP_RM_ADOPT: s_adopt (self, job, now); break;
        default:
            kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "replica-manager: job kind %d", job->kind);
            break;
    }
    return false;
}

//  Stages run together. A job the api walks (job->walk) runs on here through the stages of
//  its row that follow and are this thread's too, and through a write small enough to copy
//  here, before it goes back: a put is placed, copied and inserted in one visit, a
//  put-start reserved, placed and bound in one. Every crossing saved is a thread wake-up
//  on each side. A stage that can park (UNMOUNT) or runs elsewhere (a regex) goes back to
//  the api as usual. Returns true when a stage parked the job (s_handle_job).
static bool
s_walk_on (self_t *self, kvp_job_t *job, zframe_t **reply_to_p)
{
    const kvp_op_t *row = job->walk ? kvp_op_of_job (job) : NULL;
    while (row) {
        kvp_job_kind_t next = kvp_op_next_stage (row, job, job->kind);
        bool copy_here = next == KVP_TX_WRITE && transfer_job_inline (job);
        bool ours = next != KVP_JOB_NONE && next != KVP_AL_UNMOUNT && next != KVP_RM_REMOVE_REGEX
                    && kvp_job_kind_actor (next) == KVP_ACTOR_RM;
        if (!copy_here && !ours)
            return false;
        job->kind = next;
        if (copy_here)
            transfer_job_copy (job, self->readers);
        else if (s_handle_job (self, job, reply_to_p))
            return true;
    }
    return false;
}

//  Answers a job whose stages here are done (or walks it on first).
static void
s_finish (self_t *self, kvp_job_t *job, zframe_t **reply_to_p)
{
    if (s_walk_on (self, job, reply_to_p))
        return; //  parked on the way
    //  A committed object's record is on the file before its writer hears OK.
    rm_log_flush (self);
    s_reply (self, reply_to_p, job);
}

//  --segment-dir: the objects the allocator adopted from the previous run are this table's
//  before the node serves; if they can't be, neither can the node.
static void
s_adopt_at_start (self_t *self)
{
    kvp_job_t *job = allocator_adopted (self->allocator);
    if (!job)
        return;
    s_adopt (self, job, zclock_mono ());
    if (job->status != KVPOOL_OK) {
        char reason[400];
        snprintf (reason, sizeof reason, "--segment-dir %s: %s", self->config->segment_dir,
                  job->error);
        allocator_fail (self->allocator, reason);
    }
    kvp_job_destroy (&job);
}

void
replica_manager_actor (zsock_t *pipe, void *args)
{
    pthread_setname_np (pthread_self (), "kvp-replicas");
    self_t *self = s_self_new (pipe, (const kvp_config_t *) args);
    self->waits = wait_set_new ();
    zsock_t *waited[] = {pipe, self->router, self->tx, regex_matcher_sock (self->matcher)};
    for (size_t i = 0; i < sizeof waited / sizeof waited[0]; i++)
        wait_set_add (self->waits, waited[i]);
    if (!allocator_error (self->allocator))
        s_adopt_at_start (self);
    zsock_signal (pipe, 0);
    self->next_sweep = zclock_mono () + SWEEP_INTERVAL_MS;
    spin_window_t spin;
    spin_window_init (&spin, (int) self->config->spin_us);
    int64_t next_cycle = zclock_mono ();
    while (!self->terminated) {
        int64_t wait = (next_cycle < self->next_sweep ? next_cycle : self->next_sweep) - zclock_mono ();
        int64_t events_wait = kv_events_feed_wait (self->events, zclock_mono ());
        if (events_wait >= 0 && events_wait < wait)
            wait = events_wait;
        //  Jobs that come one after another find it polling (spin_poll.h).
        void *which = spin_window_wait (&spin, self->waits, wait > 0 ? (int) wait : 0);
        if (which == pipe) {
            char *command = zstr_recv (pipe);
            if (!command || streq (command, "$TERM"))
                self->terminated = true;
            else if (streq (command, "STOPPING"))
                regex_matcher_stop (self->matcher);
            else if (streq (command, "STATUS")) {
                const char *error = allocator_error (self->allocator);
                zstr_send (pipe, error ? error : "OK");
            }
            else if (streq (command, "FREED"))
                zsock_send (pipe, "8", self->items_freed);
            else {
                kvp_error ("invalid pipe command '%s'", command);
                assert (false);
            }
            zstr_free (&command);
            //  A command may be answered, and STOPPING speaks to the regex matcher.
            wait_set_touch (self->waits, pipe);
            wait_set_touch (self->waits, regex_matcher_sock (self->matcher));
        }
        else if (which == self->router) {
            zframe_t *routing_id;
            kvp_job_t *job = kvp_job_recv_routed (self->router, &routing_id);
            if (job && job->kind == KVP_RM_REMOVE_REGEX)
                s_regex_start (self, job, &routing_id);
            else if (job && !s_handle_job (self, job, &routing_id))
                s_finish (self, job, &routing_id);
            zframe_destroy (&routing_id);
            rm_unlinks_send (self);
        }
        else if (which == self->tx) {
            //  The transfer-submitter hands our disk writes and unlinks back when done.
            kvp_job_t *job = kvp_job_recv (self->tx);
            if (job && job->kind == KVP_TX_DISK_WRITE)
                rm_offload_done (self, job, zclock_mono ());
            else {
                kvp_job_destroy (&job);
                self->unlinks_out--;
            }
            rm_unlinks_send (self);
        }
        else if (which == regex_matcher_sock (self->matcher))
            s_regex_finish (self);
        if (zclock_mono () >= self->next_sweep) {
            s_sweep (self, zclock_mono ());
            allocator_tick (self->allocator);
            rm_unlinks_send (self);
            self->next_sweep = zclock_mono () + SWEEP_INTERVAL_MS;
        }
        //  Eviction's cycles, when due.
        next_cycle = rm_policy_tick (self, zclock_mono ());
        rm_unlinks_send (self);
        //  Placements that waited for room, and unmounts whose segment emptied (a free, a
        //  tick) in this turn, are answered.
        zframe_t *reply_to;
        kvp_job_t *placed;
        while ((placed = rm_room_made (self, &reply_to))) {
            s_finish (self, placed, &reply_to);
            zframe_destroy (&reply_to);
        }
        s_replies_parked (self);
        //  The events gathered go to the publisher once the batch is due.
        if (self->events)
            kv_events_feed_flush (self->events, zclock_mono (), false);
    }
    s_regex_stop (self);
    //  Unmounts still waiting are answered: the node is going.
    allocator_stop (self->allocator);
    s_replies_parked (self);
    //  The transfer-submitter's jobs are taken back (objects pinned for a disk copy stay
    //  pinned: they end with this actor).
    zsock_set_rcvtimeo (self->tx, 2000);
    while (self->unlinks_out + self->policy.writes_out > 0) {
        kvp_job_t *job = kvp_job_recv (self->tx);
        if (!job)
            break;
        if (job->kind == KVP_TX_DISK_WRITE)
            self->policy.writes_out--;
        else
            self->unlinks_out--;
        kvp_job_destroy (&job);
    }
    wait_set_destroy (&self->waits);
    //  Last: kvpoold destroys its allocator once this thread is done (config.h).
    allocator_t *borrowed = self->own_allocator ? NULL : self->allocator;
    s_self_destroy (&self);
    if (borrowed)
        allocator_hand_back (borrowed);
}

//  ---- self test ---------------------------------------------------------------------

static kvp_job_t *
s_test_call (zsock_t *rm, kvp_job_kind_t kind, const char **keys, size_t n)
{
    kvp_job_t *job = kvp_job_new (kind, n);
    for (size_t i = 0; i < n; i++) {
        job->items[i].key = keys[i];
        job->items[i].key_len = strlen (keys[i]);
        job->items[i].size = 100;
    }
    assert (kvp_job_send (rm, job) == 0);
    kvp_job_t *back = kvp_job_recv (rm);
    assert (back == job);
    return job;
}

//  The items freed since the last call (the actor counts them: FREED).
static uint64_t s_test_freed_seen;

static size_t
s_test_drain_frees (zactor_t *actor)
{
    uint64_t seen = s_test_freed_seen;
    uint64_t freed = 0;
    zstr_send (actor, "FREED");
    assert (zsock_recv (actor, "8", &freed) == 0);
    s_test_freed_seen = freed;
    return (size_t) (freed - seen);
}

//  Inserts key, committed, with one replica of 100 bytes on each of segments[0..count).
static void
s_test_insert (zsock_t *rm, const char *key, const uint32_t *segments, uint32_t count)
{
    kvp_job_t *job = kvp_job_new (KVP_RM_INSERT, 1);
    kvp_job_need_replicas (job);
    job->items[0].key = key;
    job->items[0].key_len = strlen (key);
    job->items[0].size = 100;
    job->items[0].replica_count = count;
    for (uint32_t r = 0; r < count; r++) {
        job->items[0].replicas[r].segment_id = segments[r];
        job->items[0].replicas[r].offset = 4096 * (r + 1);
    }
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->items[0].status == KVPOOL_OK);
    kvp_job_destroy (&job);
}

static int
s_test_status (zsock_t *rm, kvp_job_kind_t kind, const char *key)
{
    const char *keys[] = {key};
    kvp_job_t *job = s_test_call (rm, kind, keys, 1);
    int status = job->items[0].status;
    if (job->items[0].object)
        kvp_object_unpin (job->items[0].object);
    kvp_job_destroy (&job);
    return status;
}

//  REMOVE_SEGMENT of segment; returns the objects it removed.
static uint64_t
s_test_lose_segment (zsock_t *rm, uint32_t segment)
{
    kvp_job_t *job = kvp_job_new (KVP_RM_REMOVE_SEGMENT, 0);
    job->segment_id = segment;
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    uint64_t removed = job->result_count;
    kvp_job_destroy (&job);
    return removed;
}

//  Reads from the index as a same-machine client would: the read stamp is the lease.
static void
s_test_stamps (zsock_t *rm, zactor_t *actor, const kvp_config_t *config)
{
    //  The stamps' clock is the actor's.
    int64_t mono = zclock_mono (), stamp_clock = shm_index_clock_ms ();
    assert (stamp_clock - mono <= 1 && mono - stamp_clock <= 2);
    char name[96];
    shm_index_make_name (name, sizeof name, config->instance);
    shm_index_t *reader = shm_index_open (name);
    assert (reader);
    const uint32_t one[] = {1};
    s_test_insert (rm, "stamped", one, 1);
    //  Published, unread: no lease.
    shm_index_hit_t hit;
    assert (shm_index_lookup (reader, "stamped", 7, &hit) && hit.segment_id == 1);
    //  A read from the index leases without a word to the actor...
    assert (shm_index_confirm (&hit, shm_index_clock_ms ()));
    int64_t read_at = shm_index_clock_ms ();
    assert (s_test_status (rm, KVP_RM_REMOVE, "stamped") == KVPOOL_OBJECT_HAS_LEASE);
    //  ... and the object stays published.
    assert (shm_index_lookup (reader, "stamped", 7, &hit));
    //  A read through the actor later than the stamp lengthens the lease; an earlier stamp
    //  does not shorten it.
    zclock_sleep (100);
    assert (s_test_status (rm, KVP_RM_EXIST, "stamped") == KVPOOL_OK);
    int64_t exist_at = zclock_mono ();
    assert (shm_index_confirm (&hit, read_at));
    zclock_sleep ((int) (read_at + 201 - zclock_mono ()));
    assert (s_test_status (rm, KVP_RM_REMOVE, "stamped") == KVPOOL_OBJECT_HAS_LEASE);
    zclock_sleep ((int) (exist_at + 201 - zclock_mono ()));
    assert (s_test_status (rm, KVP_RM_REMOVE, "stamped") == KVPOOL_OK);
    //  Gone from the index before its space was freed.
    assert (!shm_index_lookup (reader, "stamped", 7, &hit));
    zclock_sleep (20);
    assert (s_test_drain_frees (actor) == 1);

    //  A stamp far in the future is no read (a reader's claim is bounded by the clock).
    s_test_insert (rm, "future", one, 1);
    assert (shm_index_lookup (reader, "future", 6, &hit));
    assert (shm_index_confirm (&hit, shm_index_clock_ms () + 100 * STAMP_FUTURE_MAX_MS));
    assert (s_test_status (rm, KVP_RM_REMOVE, "future") == KVPOOL_OK);
    zclock_sleep (20);
    assert (s_test_drain_frees (actor) == 1);
    shm_index_destroy (&reader);
}

//  Losing a segment takes only the replicas on it.
static void
s_test_segment_loss (zsock_t *rm, zactor_t *actor)
{
    //  Three replicas, the first (published) on 11.
    const uint32_t three[] = {11, 12, 13};
    s_test_insert (rm, "r3", three, 3);
    s_test_drain_frees (actor);
    assert (s_test_lose_segment (rm, 12) == 0);
    zclock_sleep (20);
    assert (s_test_drain_frees (actor) == 1); //  the replica on 12, at once
    const char *r3[] = {"r3"};
    kvp_job_t *job = s_test_call (rm, KVP_RM_REPLICA_LIST, r3, 1);
    assert (job->items[0].status == KVPOOL_OK && job->items[0].replica_count == 2);
    for (uint32_t r = 0; r < 2; r++)
        assert (job->items[0].replicas[r].segment_id != 12);
    kvp_job_destroy (&job);
    //  A pinned reader may be reading the replica on 11: its space waits for that pin, and
    //  only that one (later readers pin another epoch).
    job = s_test_call (rm, KVP_RM_GET, r3, 1);
    kvp_object_t *first_pin = job->items[0].object;
    kvp_job_destroy (&job);
    assert (s_test_lose_segment (rm, 11) == 0);
    job = s_test_call (rm, KVP_RM_GET, r3, 1);
    assert (job->items[0].replica_count == 1 && job->items[0].replicas[0].segment_id == 13);
    kvp_object_t *second_pin = job->items[0].object;
    kvp_job_destroy (&job);
    zclock_sleep (120);
    assert (s_test_drain_frees (actor) == 0);
    kvp_object_unpin (first_pin);
    zclock_sleep (120);
    assert (s_test_drain_frees (actor) == 1); //  while the second pin still holds
    kvp_object_unpin (second_pin);
    //  Its last replica gone, the object is gone.
    assert (s_test_lose_segment (rm, 13) == 1);
    assert (s_test_status (rm, KVP_RM_EXIST, "r3") == KVPOOL_OBJECT_NOT_FOUND);
    zclock_sleep (20);
    assert (s_test_drain_frees (actor) == 1);

    //  A put placed on a segment that went before its insert arrived keeps the rest.
    const uint32_t late[] = {12, 14};
    s_test_insert (rm, "late", late, 2);
    zclock_sleep (20);
    assert (s_test_drain_frees (actor) == 1);
    job = s_test_call (rm, KVP_RM_REPLICA_LIST, (const char *[]){"late"}, 1);
    assert (job->items[0].replica_count == 1 && job->items[0].replicas[0].segment_id == 14);
    kvp_job_destroy (&job);
    job = kvp_job_new (KVP_RM_INSERT, 1);
    kvp_job_need_replicas (job);
    job->items[0].key = "only-gone";
    job->items[0].key_len = 9;
    job->items[0].replica_count = 1;
    job->items[0].replicas[0].segment_id = 13;
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->items[0].status == KVPOOL_NO_AVAILABLE_HANDLE && strstr (job->error, "unmounted"));
    kvp_job_destroy (&job);
    zclock_sleep (20);
    assert (s_test_drain_frees (actor) == 1);

    //  A reservation keeps its other replicas, or is revoked when it has none.
    const char *pending[] = {"pend-two", "pend-one"};
    job = s_test_call (rm, KVP_RM_RESERVE, pending, 2);
    job->kind = KVP_RM_BIND;
    kvp_job_need_replicas (job);
    job->items[0].replica_count = 2;
    job->items[0].replicas[0].segment_id = 15;
    job->items[0].replicas[1].segment_id = 16;
    job->items[1].replica_count = 1;
    job->items[1].replicas[0].segment_id = 15;
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    kvp_job_destroy (&job);
    assert (s_test_lose_segment (rm, 15) == 0);
    zclock_sleep (20);
    assert (s_test_drain_frees (actor) == 2);
    job = s_test_call (rm, KVP_RM_COMMIT, pending, 2);
    assert (job->items[0].status == KVPOOL_OK && job->items[1].status == KVPOOL_INVALID_WRITE);
    kvp_job_destroy (&job);
    job = s_test_call (rm, KVP_RM_REPLICA_LIST, pending, 1);
    assert (job->items[0].replica_count == 1 && job->items[0].replicas[0].segment_id == 16);
    kvp_job_destroy (&job);
    const char *cleanup[] = {"late", "pend-two"};
    job = s_test_call (rm, KVP_RM_REMOVE, cleanup, 2);
    job->force = true;
    job->items[0].status = job->items[1].status = KVPOOL_OK;
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->items[0].status == KVPOOL_OK && job->items[1].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    zclock_sleep (20);
    s_test_drain_frees (actor);
}

void
replica_manager_test (bool verbose)
{
    kvp_config_t config;
    kvp_config_defaults (&config);
    snprintf (config.instance, sizeof config.instance, "rmtest");
    config.lease_ttl_ms = 200;
    config.put_timeout_ms = 100;
    config.max_regex_len = 64;
    //  No segments: the replicas the test makes up are in none, and their frees are counted.
    config.segments = 0;
    s_test_freed_seen = 0;
    zactor_t *actor = zactor_new (replica_manager_actor, &config);
    zsock_t *rm = zsock_new_dealer ("inproc://rmtest-rm");
    assert (actor && rm);

    const char *ab[] = {"a", "b"};
    const char *a[] = {"a"};
    const char *c[] = {"c"};

    //  Reserve, bind, and the key stays invisible until commit.
    kvp_job_t *job = s_test_call (rm, KVP_RM_RESERVE, ab, 2);
    assert (job->items[0].status == 0 && job->items[0].object_id);
    job->kind = KVP_RM_BIND;
    kvp_job_need_replicas (job);
    job->items[1].status = KVPOOL_NO_AVAILABLE_HANDLE; //  b failed to allocate
    for (size_t i = 0; i < 1; i++) {
        job->items[i].replica_count = 1;
        job->items[i].replicas[0].segment_id = 1;
        job->items[i].replicas[0].offset = 4096;
    }
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    kvp_job_destroy (&job);
    job = s_test_call (rm, KVP_RM_EXIST, ab, 2);
    assert (job->items[0].status == KVPOOL_OBJECT_NOT_FOUND);
    kvp_job_destroy (&job);
    //  A second reserve of a pending key is refused; b's failed reservation is gone.
    job = s_test_call (rm, KVP_RM_RESERVE, ab, 2);
    assert (job->items[0].status == KVPOOL_OBJECT_ALREADY_EXISTS);
    assert (job->items[1].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    job = s_test_call (rm, KVP_RM_COMMIT, a, 1);
    assert (job->items[0].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    job = s_test_call (rm, KVP_RM_GET, a, 1);
    assert (job->items[0].status == KVPOOL_OK && job->items[0].object);
    assert (job->items[0].replicas[0].offset == 4096 && job->items[0].size == 100);
    kvp_object_t *pinned = job->items[0].object;
    kvp_job_destroy (&job);

    //  Leased: remove without force is refused; with force it goes, but the space waits
    //  for the pin.
    job = s_test_call (rm, KVP_RM_REMOVE, a, 1);
    assert (job->items[0].status == KVPOOL_OBJECT_HAS_LEASE);
    job->force = true;
    job->items[0].status = 0;
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->items[0].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    zclock_sleep (120);
    assert (s_test_drain_frees (actor) == 0);
    kvp_object_unpin (pinned);
    zclock_sleep (120);
    assert (s_test_drain_frees (actor) == 1);

    //  b's reservation (never bound, busy) survives the timeout; an unbusy one does not.
    job = s_test_call (rm, KVP_RM_RESERVE, c, 1);
    job->kind = KVP_RM_BIND;
    kvp_job_need_replicas (job);
    job->items[0].replica_count = 1;
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    kvp_job_destroy (&job);
    zclock_sleep (250);
    assert (s_test_drain_frees (actor) == 1);
    job = s_test_call (rm, KVP_RM_COMMIT, c, 1);
    assert (job->items[0].status == KVPOOL_INVALID_WRITE);
    kvp_job_destroy (&job);

    //  Regex removal counts what it removed; a bad pattern is an error, not a crash.
    const char *many[] = {"x1", "x2", "y1"};
    job = s_test_call (rm, KVP_RM_INSERT, many, 3);
    assert (job->items[0].status == KVPOOL_OK && job->items[2].status == KVPOOL_OK);
    kvp_job_destroy (&job);

    //  A server-side put's insert: visible at once. A key that exists keeps its value and
    //  the second put's space is freed; so is the space of an item that failed after it was
    //  placed (its copy failed).
    const char *fresh[] = {"ins-new", "y1", "ins-failed"};
    job = kvp_job_new (KVP_RM_INSERT, 3);
    kvp_job_need_replicas (job);
    for (size_t i = 0; i < 3; i++) {
        job->items[i].key = fresh[i];
        job->items[i].key_len = strlen (fresh[i]);
        job->items[i].size = 64;
        job->items[i].replica_count = 1;
        job->items[i].replicas[0].segment_id = 1;
        job->items[i].replicas[0].offset = 8192 * (i + 1);
    }
    //  y1 exists (inserted above).
    job->items[2].status = KVPOOL_WRITE_FAIL;
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->items[0].status == KVPOOL_OK);
    assert (job->items[1].status == KVPOOL_OBJECT_ALREADY_EXISTS);
    assert (job->items[2].status == KVPOOL_WRITE_FAIL);
    kvp_job_destroy (&job);
    zclock_sleep (50);
    assert (s_test_drain_frees (actor) == 2); //  both ranges
    const char *ins_new[] = {"ins-new"};
    job = s_test_call (rm, KVP_RM_GET, ins_new, 1);
    assert (job->items[0].status == KVPOOL_OK && job->items[0].replicas[0].offset == 8192);
    kvp_object_unpin (job->items[0].object);
    kvp_job_destroy (&job);
    job = s_test_call (rm, KVP_RM_REMOVE, ins_new, 1);
    job->force = true;
    job->items[0].status = 0;
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->items[0].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    zclock_sleep (50);
    s_test_drain_frees (actor);
    job = kvp_job_new (KVP_RM_REMOVE_REGEX, 0);
    job->pattern = "^x";
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->status == 0 && job->result_count == 2);
    job->pattern = "([";
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->status == KVPOOL_INVALID_PARAMS);
    kvp_job_destroy (&job);
    job = kvp_job_new (KVP_RM_STATS, 0);
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->stats.objects == 1 && job->stats.pending_puts == 1);
    kvp_job_destroy (&job);

    //  A touch (a client's report of a read) leases as any read does: for the TTL from
    //  then, exactly.
    zclock_sleep (250); //  y1's lease from its commit-time reads, if any, is over
    const char *y1[] = {"y1"};
    size_t y1_len[] = {2};
    job = kvp_job_new_owning (KVP_RM_TOUCH, 1, y1, y1_len);
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    int64_t touched = zclock_mono ();
    assert (job->items[0].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    job = s_test_call (rm, KVP_RM_REMOVE, y1, 1);
    assert (job->items[0].status == KVPOOL_OBJECT_HAS_LEASE);
    kvp_job_destroy (&job);
    zclock_sleep ((int) (touched + 201 - zclock_mono ()));
    job = s_test_call (rm, KVP_RM_REMOVE, y1, 1);
    assert (job->items[0].status == KVPOOL_OK);
    kvp_job_destroy (&job);

    s_test_stamps (rm, actor, &config);
    s_test_segment_loss (rm, actor);

    //  A regex removal is matched off this thread: while a slow one (a*[bc] is quadratic on
    //  the long keys, ~25 ms each) runs, other jobs are answered. It removes only the
    //  objects that were there when it arrived: q-b1, removed and put again meanwhile, and
    //  q-b3, new, stay; q-b2 goes.
    const char *matching[] = {"q-b1", "q-b2"};
    job = s_test_call (rm, KVP_RM_INSERT, matching, 2);
    kvp_job_destroy (&job);
    enum { SLOW_KEYS = 60 };
    char *slow_keys[SLOW_KEYS];
    for (size_t i = 0; i < SLOW_KEYS; i++) {
        slow_keys[i] = (char *) malloc (4005);
        memset (slow_keys[i], 'a', 4000);
        snprintf (slow_keys[i] + 4000, 5, "%04zu", i);
    }
    job = s_test_call (rm, KVP_RM_INSERT, (const char **) slow_keys, SLOW_KEYS);
    assert (job->items[SLOW_KEYS - 1].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    kvp_job_t *regex = kvp_job_new (KVP_RM_REMOVE_REGEX, 0);
    regex->pattern = "a*[bc]";
    regex->force = true;
    int64_t start = zclock_mono ();
    assert (kvp_job_send (rm, regex) == 0);
    const char *q_b1[] = {"q-b1"}, *q_b3[] = {"q-b3"};
    job = s_test_call (rm, KVP_RM_REMOVE, q_b1, 1); //  answered before the regex: see the call
    kvp_job_destroy (&job);
    job = s_test_call (rm, KVP_RM_INSERT, q_b1, 1);
    kvp_job_destroy (&job);
    job = s_test_call (rm, KVP_RM_INSERT, q_b3, 1);
    assert (job->items[0].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    int64_t others = zclock_mono () - start;
    assert (kvp_job_recv (rm) == regex);
    if (verbose)
        printf ("(regex %lld ms, other jobs meanwhile %lld ms) ",
                (long long) (zclock_mono () - start), (long long) others);
    assert (regex->status == KVPOOL_OK && regex->result_count == 1);
    const char *q_all[] = {"q-b1", "q-b2", "q-b3"};
    job = s_test_call (rm, KVP_RM_EXIST, q_all, 3);
    assert (job->items[0].status == KVPOOL_OK && job->items[2].status == KVPOOL_OK);
    assert (job->items[1].status == KVPOOL_OBJECT_NOT_FOUND);
    kvp_job_destroy (&job);
    //  A key over the match limit refuses the whole request: q-b1 matched 'b' but stays.
    regex->pattern = "b|(a|a)+$";
    assert (kvp_job_send (rm, regex) == 0 && kvp_job_recv (rm) == regex);
    assert (regex->status == KVPOOL_INVALID_PARAMS && strstr (regex->error, "match limit")
            && strstr (regex->error, "nothing removed"));
    job = s_test_call (rm, KVP_RM_EXIST, q_all, 1);
    assert (job->items[0].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    //  Too long a pattern (the limit is 64 here) is refused with the reason.
    regex->status = KVPOOL_OK;
    regex->pattern = "^0123456789012345678901234567890123456789012345678901234567890123";
    assert (kvp_job_send (rm, regex) == 0 && kvp_job_recv (rm) == regex);
    assert (regex->status == KVPOOL_INVALID_PARAMS && strstr (regex->error, "limit of 64"));

    //  Stopped while a match runs: the actor ends promptly and the job is answered.
    regex->status = KVPOOL_OK;
    regex->error[0] = 0;
    regex->pattern = "a*[bc]";
    assert (kvp_job_send (rm, regex) == 0);
    zclock_sleep (50);
    start = zclock_mono ();
    zactor_destroy (&actor);
    assert (zclock_mono () - start < 1000);
    zsock_set_rcvtimeo (rm, 1000);
    assert (kvp_job_recv (rm) == regex);
    assert (regex->status == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
    kvp_job_destroy (&regex);
    for (size_t i = 0; i < SLOW_KEYS; i++)
        free (slow_keys[i]);

    zsock_destroy (&rm);
    if (verbose)
        printf ("state machine, leases, pins, regex ");
}
