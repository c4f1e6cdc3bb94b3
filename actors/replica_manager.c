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
    when its turn comes, the keys of the committed objects are copied into a batch for the
    regex-matcher's thread (infra/regex_matcher.h), so a costly pattern never stalls the
    other jobs. When the batch comes back, the objects that matched and are still the same
    objects (same id) are removed if removable, or counted as kept (a lease: result_kept), and
    the job is answered; a batch refused for a limit removes nothing. Batches go to the
    matcher one at a time, in arrival order.

    EVICTION runs here, on this thread, where the objects, their order and the allocator
    are (replica_evict.c decides when and how much, replica_tier.c which objects go). A
    placement (AL_ALLOC) that finds no room runs a cycle at once and is placed again before
    it goes on (rm_make_room), or waits here for the disk copies that will free the room
    (rm_room_made); the watermark's cycles run on this loop's clock (rm_policy_tick).
    Objects with memory replicas are kept in `memory`, an intrusive list in the
    order they took their place (their commit, or a second chance); objects with a disk copy
    in `disk`, likewise. A cycle's walk (rm_evict) takes `memory` from the oldest: an object
    used since it took its place (touched here, or read from the index: its read stamp) goes
    to the back instead; hard-pinned objects stay; leased, pinned or departing ones are
    passed over and counted; soft-pinned ones are taken only in a second pass, if the plan
    allows. A victim with a disk copy loses its memory at once (s_memory_evict); one without
    is dropped when there is no disk tier, or pinned (`offloading`) and sent to the
    transfer-submitter for a disk copy while the plan's queue and disk room allow, kept
    (skipped) past them, or dropped anyway if the plan forces it. Memory is only ever freed
    after the object left the index and its lease was looked at again (rm_take_unleased),
    exactly as a remove does, so no same-machine reader can validate bytes that are being reused.
   The written copies come back here (TX_DISK_WRITE, rm_offloaded): they are recorded (the object
   must still be the same one, by id) and the memory of those still unleased and unpinned is freed;
   rm_disk_evict drops the least recently used disk copies (a disk-only object goes with its copy,
   unless leased). A disk-only object is COMPLETE with no replica: a GET answers its disk id (no
   pin: ids are never reused, and an unlinked file stays readable to a read that opened it) and the
   transfer-submitter reads it; reads of it are counted in a sketch (admission.h) for
   --promote-on-hit. Every disk copy an object loses (removed, replaced, dropped) is unlinked by the
   transfer-submitter
    (`unlinks`, sent after each job).

    KV EVENTS (--kv-events-endpoint, actors/kv_events.h). This actor is where keys become
    visible and go, so it is the source of the store's KV-events stream: rm_object_complete
    (PUT_END, server-side PUT and UPSERT), an adopted object (--segment-dir) and a
    registered disk copy (a restart) note BlockStored; rm_object_drop of a committed object
    (remove, regex removal, eviction, a disk-only object losing its copy, a lost segment, an
    upsert's old value) notes BlockRemoved; a REMOVE_ALL or RESET that takes every committed
    object notes one AllBlocksCleared instead of an event per key. Going to disk and coming
    back (offload, promotion) is not an event: the key stays visible. Noting is an append to
    a buffer; the batch goes to the publisher over inproc, never waiting (the feed drops
    and counts when the publisher is behind), when due (the poll wakes for it).

    Files: this one is the actor; the others are its layers, each calling only those below
    (replica_objects.h has the map).
    Threads: one, the actor's (its loop: infra/actor_shell.h), and the regex-matcher's,
    which sees only its batch. The only cross-thread state is kvp_object_t.pins (atomic);
    read stamps are written by readers in any process (shm_index.h).
    Ordering: jobs are handled in arrival order (a regex removal acts on the objects that
    existed when its matching began).
*/
#include "actors/replica_manager.h"

#include "infra/actor_shell.h"
#include "infra/log.h"
#include "actors/replica_objects.h"
#include "infra/spin_poll.h"

#include <pthread.h>
#include <time.h>

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
    lru_list_init (&self->cache);
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
    //  Versions of role all: counted up from the start time in seconds << 20, so that a
    //  restarted node (its objects keep theirs, from the object log) gives none twice unless
    //  it put over a million objects a second on average before.
    self->next_version = (uint64_t) time (NULL) << 20;
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
        //  A node of a cluster serves its own copies once its master confirmed them
        //  (rm_reads_tick).
        else if (config->lease)
            shm_index_set_own_until (self->index, 0);
        //  A node without a master holds every key there is: a key neither published nor
        //  counted unlisted is absent, which its same-machine clients may take as it is.
        else {
            shm_index_set_complete (self->index, true);
            self->index_complete = true;
        }
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

//  Destroys a list of objects that are out of the table, and the list.
static void
s_objects_list_destroy (zlistx_t **list_p)
{
    kvp_object_t *object = (kvp_object_t *) zlistx_first (*list_p);
    while (object) {
        kvp_object_t *gone = object;
        object = (kvp_object_t *) zlistx_next (*list_p);
        rm_object_destroy (&gone);
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
        rm_object_destroy (&doomed);
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
    //  Readers keep their mappings: they answer no absence of a node that has gone.
    if (self->index_complete)
        shm_index_set_complete (self->index, false);
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
    uint32_t segment = job->segment.id;
    if (segment == 0)
        return;
    rm_segment_mark_gone (self, segment);
    zlistx_t *victims = zlistx_new ();
    kvp_job_t *free_job = NULL;
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects)) {
        if (object->busy || !object->bound)
            continue; //  still being placed: rm_bind strips it
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
            rm_withdraw (self, object, now);
        kvp_replica_t lost[KVP_MAX_REPLICAS];
        uint32_t went =
            rm_replicas_split (self, object->replicas, &object->replica_count, segment, lost);
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
            rm_reservation_revoke (self, object, &free_job, now);
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
    rm_pins_drop_owner (self, owner);
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
    while (rm_revoked_end (self, owner, NULL, &free_job))
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

//  Copies the keys of the committed objects into the run's batch, with their ids: the leased
//  ones too, so that the reply can say how many matched and were kept (a removal refused
//  for a lease must not read as "nothing matched"). Returns 0 or -1.
static int
s_regex_fill (self_t *self, regex_run_t *run)
{
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects)) {
        if (object->state != OBJECT_COMPLETE)
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
        if (s_regex_fill (self, run) == -1)
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
    const char *pattern = job->regex.pattern ? job->regex.pattern : "";
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
    job->result_count = job->result_kept = 0;
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
        uint64_t removed = 0, kept = 0;
        for (size_t i = 0; i < regex_batch_count (batch); i++) {
            if (!regex_batch_hit (batch, i))
                continue;
            //  Only the object the key was copied from, if it is still there: removed, or
            //  kept for its lease (or a same-machine read in progress).
            kvp_object_t *object = (kvp_object_t *) object_table_lookup (
                self->objects, regex_batch_key (batch, i, NULL));
            if (!object || object->id != regex_batch_tag (batch, i)
                || object->state != OBJECT_COMPLETE)
                continue;
            if (!rm_take_unleased (self, object, job->opt.force, now)) {
                kept++;
                continue;
            }
            rm_object_drop (self, object, &free_job, now);
            self->removes++;
            removed++;
        }
        rm_frees_apply (self, &free_job);
        job->result_count = removed;
        job->result_kept = kept;
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

//  ---- the cluster's inventory, statistics, the sweep -------------------------------------

//  Every committed object held here (in memory or on disk), for the master (a node that
//  registers reports what it holds).
static void
s_inventory (self_t *self, kvp_job_t *job)
{
    for (kvp_object_t *object = (kvp_object_t *) object_table_first (self->objects); object;
         object = (kvp_object_t *) object_table_next (self->objects))
        if (object->state == OBJECT_COMPLETE && !object->cache && !object->hidden) {
            kvp_item_t *item = kvp_job_append_key (job, object->key, strlen (object->key));
            item->size = object->size;
            item->object_id = object->id;
            item->version = object->version;
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
    kvp_stats_t *stats = kvp_job_stats (job);
    s_count_pins (self);
    stats->pinned_objects = self->pinned_objects;
    stats->leased_objects = self->leased_objects;
    //  (cache copies are not objects of this node's: their keys live elsewhere)
    stats->objects = object_table_size (self->objects) - self->pending - self->cache.count;
    stats->hot_cache_hits = self->cache_hits;
    stats->hot_cache_bytes = self->cache_bytes;
    stats->hot_cache_admissions = self->cache_admissions;
    stats->repairs_done = self->repairs_done;
    stats->repair_bytes = self->repair_bytes;
    stats->hot_cache_evictions = self->cache_evictions;
    stats->hot_cache_invalidations = self->cache_invalidations;
    stats->pending_puts = self->pending;
    stats->bytes_stored = self->bytes_stored;
    stats->puts = self->puts;
    stats->gets = self->gets;
    stats->get_hits = self->get_hits;
    stats->removes = self->removes;
    stats->revoked_puts = self->revoked;
    stats->evictions = self->evictions;
    stats->evicted_bytes = self->evicted_bytes;
    stats->evictions_dropped = self->dropped_evictions;
    stats->disk_objects = self->disk.count;
    stats->disk_bytes = self->disk_bytes;
    stats->disk_hits = self->disk_hits;
    stats->disk_drops = self->disk_drops;
    stats->disk_corrupt = self->disk_lost;
    stats->checksum_failures = self->checksum_failures; //  the cluster adds its own
    stats->promotions = self->promotions;
    rm_policy_stats (self, stats);
    stats->kv_events = kv_events_feed_events (self->events);
    stats->kv_events_dropped = kv_events_feed_dropped (self->events);
}

//  A setting changed at run time (CONFIG; the api checked it): the lease of later reads.
static void
s_config (self_t *self, kvp_job_t *job)
{
    char why[256];
    if (job->config.setting && job->config.value
        && kvp_config_change (&self->settings, job->config.setting, job->config.value, why,
                              sizeof why))
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
        if (!rm_has_pins (object, now)) {
            zlistx_delete (self->doomed, zlistx_cursor (self->doomed));
            rm_free_replicas (&free_job, object);
            rm_object_destroy (&object);
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
                rm_reservation_revoke (self, object, &free_job, now);
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
        //  A copy for the hot cache takes only the room of other copies (replica_cache.c).
        if (job->kind == KVP_AL_ALLOC && job->op == KVP_OP_CACHE_FILL)
            return rm_cache_make_room (self, job, zclock_mono ()), false;
        return job->kind == KVP_AL_ALLOC && rm_make_room (self, job, reply_to_p, zclock_mono ());
    }
    int64_t now = zclock_mono ();
    switch (job->kind) {
        case KVP_RM_RESERVE: rm_reserve (self, job, now); break;
        case KVP_RM_BIND: rm_bind (self, job, now); break;
        case KVP_RM_COMMIT: rm_commit (self, job, now); break;
        case KVP_RM_PART: rm_part (self, job, now); break;
        case KVP_RM_INSERT: rm_insert (self, job, now); break;
        case KVP_RM_UPSERT: rm_upsert (self, job, now); break;
        case KVP_RM_REVOKE: rm_revoke (self, job, now); break;
        case KVP_RM_GET:
        case KVP_RM_EXIST:
        case KVP_RM_GET_SIZE:
        case KVP_RM_REPLICA_LIST:
        case KVP_RM_RELEASE:
        case KVP_RM_TOUCH: rm_read (self, job, now); break;
        case KVP_RM_PREFIX: rm_prefix (self, job, now); break;
        case KVP_RM_REMOVE: rm_remove (self, job, now); break;
        case KVP_RM_REMOVE_ALL: rm_remove_many (self, job, now); break;
        case KVP_RM_REMOVE_SEGMENT: s_remove_segment (self, job, now); break;
        case KVP_RM_OWNER_GONE: s_owner_gone (self, job, now); break;
        case KVP_RM_STATS: s_stats (self, job); break;
        case KVP_RM_CONFIG: s_config (self, job); break;
        case KVP_RM_INVENTORY: s_inventory (self, job); break;
        case KVP_RM_DISK_REGISTER: rm_disk_register (self, job, now); break;
        case KVP_RM_DISK_LOST: rm_disk_lost (self, job, now); break;
        case KVP_RM_PROMOTE: rm_promote (self, job, now); break;
        case KVP_RM_ADOPT: rm_adopt (self, job, now); break;
        case KVP_RM_CACHE_INSERT: rm_cache_insert (self, job, now); break;
        case KVP_RM_CACHE_PUBLISH: rm_cache_publish (self, job, now); break;
        case KVP_RM_CACHE_DROP: rm_cache_drop_all (self, job, now); break;
        case KVP_RM_CONFIRM: rm_confirm (self, job, now); break;
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
    rm_adopt (self, job, zclock_mono ());
    if (job->status != KVPOOL_OK) {
        char reason[400];
        snprintf (reason, sizeof reason, "--segment-dir %s: %s", self->config->segment_dir,
                  job->error);
        allocator_fail (self->allocator, reason);
    }
    kvp_job_destroy (&job);
}

//  ---- the actor ---------------------------------------------------------------------

static int
s_pipe_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    (void) msg;
    self_t *self = (self_t *) arg;
    if (streq (command, "STOPPING"))
        regex_matcher_stop (self->matcher);
    else if (streq (command, "STATUS")) {
        const char *error = allocator_error (self->allocator);
        zstr_send (actor_shell_pipe (shell), error ? error : "OK");
    }
    else if (streq (command, "FREED"))
        zsock_send (actor_shell_pipe (shell), "8", self->items_freed);
    else {
        kvp_error ("invalid pipe command '%s'", command);
        assert (false);
    }
    //  STOPPING speaks to the regex matcher (the shell touches the pipe).
    wait_set_touch (self->waits, regex_matcher_sock (self->matcher));
    return 0;
}

static int
s_router_reader (actor_shell_t *shell, zsock_t *router, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    zframe_t *routing_id;
    kvp_job_t *job = kvp_job_recv_routed (router, &routing_id);
    if (job && job->kind == KVP_RM_REMOVE_REGEX)
        s_regex_start (self, job, &routing_id);
    else if (job && !s_handle_job (self, job, &routing_id))
        s_finish (self, job, &routing_id);
    zframe_destroy (&routing_id);
    rm_unlinks_send (self);
    return 0;
}

//  The transfer-submitter hands our disk writes and unlinks back when done.
static int
s_tx_reader (actor_shell_t *shell, zsock_t *tx, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    kvp_job_t *job = kvp_job_recv (tx);
    if (job && job->kind == KVP_TX_DISK_WRITE)
        rm_offload_done (self, job, zclock_mono ());
    else {
        kvp_job_destroy (&job);
        self->unlinks_out--;
    }
    rm_unlinks_send (self);
    return 0;
}

static int
s_matcher_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell;
    (void) sock;
    s_regex_finish ((self_t *) arg);
    return 0;
}

//  Jobs that come one after another find it polling (spin_poll.h).
static zsock_t *
s_wait (actor_shell_t *shell, wait_set_t *waits, int timeout_ms, void *arg)
{
    (void) shell;
    return spin_window_wait (&((self_t *) arg)->spin, waits, timeout_ms);
}

//  After every wake-up (the one that brought $TERM too): the sweep, eviction's cycles, the
//  placements and unmounts that can be answered, the events due. Returns when it must run
//  next.
static int64_t
s_tick (actor_shell_t *shell, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    if (zclock_mono () >= self->next_sweep) {
        s_sweep (self, zclock_mono ());
        allocator_tick (self->allocator);
        rm_unlinks_send (self);
        self->next_sweep = zclock_mono () + SWEEP_INTERVAL_MS;
    }
    //  Eviction's cycles, when due.
    self->next_cycle = rm_policy_tick (self, zclock_mono ());
    rm_cache_tick (self);
    rm_reads_tick (self);
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
    int64_t now = zclock_mono ();
    int64_t due = self->next_cycle < self->next_sweep ? self->next_cycle : self->next_sweep;
    int64_t events_wait = kv_events_feed_wait (self->events, now);
    if (events_wait >= 0 && now + events_wait < due)
        due = now + events_wait;
    return due;
}

void
replica_manager_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-replicas");
    self_t *self = s_self_new (pipe, (const kvp_config_t *) args);
    //  Every socket it reads is in its wait set (wait_set.h), the pipe first.
    self->waits = actor_shell_use_wait_set (shell);
    actor_shell_add (shell, self->router, s_router_reader);
    actor_shell_add (shell, self->tx, s_tx_reader);
    actor_shell_add (shell, regex_matcher_sock (self->matcher), s_matcher_reader);
    if (!allocator_error (self->allocator))
        s_adopt_at_start (self);
    self->next_sweep = zclock_mono () + SWEEP_INTERVAL_MS;
    spin_window_init (&self->spin, (int) self->config->spin_us);
    self->next_cycle = zclock_mono ();
    actor_shell_on_command (shell, s_pipe_command);
    actor_shell_on_wait (shell, s_wait);
    actor_shell_on_tick (shell, s_tick);
    actor_shell_set_final_tick (shell, true);
    actor_shell_run (shell, self);
    actor_shell_remove (shell, regex_matcher_sock (self->matcher));
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
    //  Last: kvpoold destroys its allocator once this thread is done (config.h).
    allocator_t *borrowed = self->own_allocator ? NULL : self->allocator;
    s_self_destroy (&self);
    actor_shell_destroy (&shell); //  (its wait set)
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
    kvp_job_payload (job, KVP_PAYLOAD_SEGMENT);
    job->segment.id = segment;
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
    job->opt.force = true;
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
    //  The slow regex below matches for about 1.5 s on an idle machine: under a sanitizer or
    //  a loaded machine that passed the default limit (4 s), and the removal was refused.
    config.regex_time_limit_ms = 20000;
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
    job->opt.force = true;
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
    job->opt.force = true;
    job->items[0].status = 0;
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->items[0].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    zclock_sleep (50);
    s_test_drain_frees (actor);
    job = kvp_job_new (KVP_RM_REMOVE_REGEX, 0);
    kvp_job_payload (job, KVP_PAYLOAD_REGEX);
    job->regex.pattern = "^x";
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->status == 0 && job->result_count == 2);
    job->regex.pattern = "([";
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->status == KVPOOL_INVALID_PARAMS);
    kvp_job_destroy (&job);
    job = kvp_job_new (KVP_RM_STATS, 0);
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (kvp_job_stats (job)->objects == 1 && kvp_job_stats (job)->pending_puts == 1);
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
    //  A regex removal says it matched the leased object and kept it.
    job = kvp_job_new (KVP_RM_REMOVE_REGEX, 0);
    kvp_job_payload (job, KVP_PAYLOAD_REGEX);
    job->regex.pattern = "^y1$";
    assert (kvp_job_send (rm, job) == 0 && kvp_job_recv (rm) == job);
    assert (job->status == KVPOOL_OK && job->result_count == 0 && job->result_kept == 1);
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
    kvp_job_payload (regex, KVP_PAYLOAD_REGEX);
    regex->regex.pattern = "a*[bc]";
    regex->opt.force = true;
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
    regex->regex.pattern = "b|(a|a)+$";
    assert (kvp_job_send (rm, regex) == 0 && kvp_job_recv (rm) == regex);
    assert (regex->status == KVPOOL_INVALID_PARAMS && strstr (regex->error, "match limit")
            && strstr (regex->error, "nothing removed"));
    job = s_test_call (rm, KVP_RM_EXIST, q_all, 1);
    assert (job->items[0].status == KVPOOL_OK);
    kvp_job_destroy (&job);
    //  Too long a pattern (the limit is 64 here) is refused with the reason.
    regex->status = KVPOOL_OK;
    regex->regex.pattern = "^0123456789012345678901234567890123456789012345678901234567890123";
    assert (kvp_job_send (rm, regex) == 0 && kvp_job_recv (rm) == regex);
    assert (regex->status == KVPOOL_INVALID_PARAMS && strstr (regex->error, "limit of 64"));

    //  Stopped while a match runs: the actor ends promptly and the job is answered.
    regex->status = KVPOOL_OK;
    regex->error[0] = 0;
    regex->regex.pattern = "a*[bc]";
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
