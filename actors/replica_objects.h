/*  replica_objects.h - the replica-manager's state, shared by its files (internal: no other
    file includes it). Each file calls only the ones below it, never back:

    actors/replica_manager.c   the actor: its loop, the jobs' dispatch, losing a segment,
                               regex removal, statistics, the sweep
    actors/replica_reads.c     reads, removals by key, client pins by owner
    actors/replica_puts.c      the put state machine, revoked reservations, adoption
    actors/replica_evict.c     eviction's policy: cycles, watermarks, the offload queue,
                               placements that found no room
    actors/replica_tier.c      eviction's walks (which objects go), disk copies recorded,
                               dropped, registered, lost; promotion
    actors/replica_objects.c   objects' life: made, dropped, freed; leases, the read index,
                               pins, segments gone, disk copy records
    actors/replica_log.c       the object log (--segment-dir), checksums

    All run on the actor's one thread; the functions below are its.
*/
#ifndef REPLICA_OBJECTS_H_INCLUDED
#define REPLICA_OBJECTS_H_INCLUDED

#include <czmq.h>
#include <stdatomic.h>

#include "actors/admission.h"
#include "actors/allocator.h"
#include "infra/config.h"
#include "actors/kv_events.h"
#include "actors/lru_list.h"
#include "infra/object_table.h"
#include "infra/regex_matcher.h"
#include "infra/spin_poll.h"
#include "infra/wait_set.h"
#include "messages/kvp_job.h"
#include "shm/shm_index.h"
#include "tier/object_log.h"
#include "transfer/transfer_pool.h"
#include "transfer/value_checksum.h"

//  A read stamp further ahead of the actor's clock than this is not taken for a read.
#define STAMP_FUTURE_MAX_MS 10000

typedef enum { OBJECT_PENDING = 1, OBJECT_COMPLETE = 2 } object_state_t;

//  A replica taken from its object (its segment went) whose space waits for the pins of the
//  epochs in `epochs` (bit e: epoch e) to end.
typedef struct {
    kvp_replica_t replica;
    uint8_t epochs;
} departed_t;

struct _kvp_object_t {
    uint64_t id; //  unique for the life of the actor; guards stale job references
    uint64_t size;
    object_state_t state;
    bool busy;  //  reserved, not yet bound: the allocator is still placing it
    bool bound; //  replicas recorded
    uint32_t replica_count;
    kvp_replica_t replicas[KVP_MAX_REPLICAS];
    atomic_int pins[2];      //  zero-copy sends in flight, by pin epoch
    uint32_t client_pins[2]; //  GET_REPLICA_LIST pins not yet released, by pin epoch
    uint8_t pin_epoch;       //  the epoch new pins count in
    departed_t *departed;    //  replicas lost with their segment, space not yet freed
    uint32_t departed_count;
    void *departing_handle; //  in self->departing while departed_count > 0
    int64_t lease_until;
    int64_t keep_until; //  replaced by an upsert under a lease: its space waits until then
    int64_t put_deadline;
    int64_t soft_pin_until;
    bool hard_pin;
    uint32_t next_replica;  //  round robin over replicas for reads
    int64_t index_slot;     //  where it is published in the same-machine index, or -1
    bool unlisted;          //  counted in the index's filter of held, unpublished keys
    uint64_t owner;         //  a reservation's writer (owners.h id; 0: the node)
    uint64_t written;       //  a reservation's bytes written by PUT_PART (another node's)
    uint64_t cluster_token; //  a cluster PUT_START's token from the master (kvp_job.h)
    //  Eviction (see EVICTION below).
    lru_link_t in_memory;    //  in self->memory while it has memory replicas
    lru_link_t on_disk;      //  in self->disk while it has a disk copy
    lru_link_t unsaved;      //  in self->unsaved while waiting for an eager disk copy
    int64_t touched;         //  its last read or write this actor saw
    int64_t memory_since;    //  when it took its place in self->memory
    int64_t disk_since;      //  ... in self->disk
    uint64_t disk_id;        //  its disk copy (tier/disk_store.h), or 0
    uint64_t disk_footprint; //  what that copy takes on disk
    bool offloading;         //  pinned while the evictor writes its disk copy
    bool logged;             //  --segment-dir: its PUT records are live in the object log
    //  XXH3-64 of the value (transfer/value_checksum.h; 0: not taken yet): from the copy of
    //  its frame, its writer's PUT_END, or taken when first needed (rm_checksum); the
    //  object log's records carry it too
    uint64_t checksum;
    //  Unique to one put or upsert of the key: the master's (a cluster), this node's own
    //  (role all: rm_version_next); the object log's records carry it
    uint64_t version;
    //  A copy of the host hot cache (actors/replica_cache.c): a value other nodes hold,
    //  kept because its readers here read it often; first to go, never offloaded
    bool cache;
    //  A replica another node's put wrote here (UPSERT, PUT_START on the data plane): not
    //  served to this node's clients, published, logged or reported until the master is
    //  known to hold it committed (rm_unhide): the writer's CONFIRM after its commit, or a
    //  read naming its version, which only the master gives out. A copy whose commit never
    //  came (its writer died, or fenced this node while the write waited in its socket) is
    //  never served, wherever the master's records stand.
    bool hidden;
    //  Last, in the same allocation: one allocation an object, and its key in the cache line
    //  after its eviction fields, which an eviction walk reads together.
    char key[];
};

//  The client pins one owner holds on one key: usually one object; more when the key was
//  removed and put again between its reads. Released first in, first out.
typedef struct {
    size_t count, capacity;
    kvp_object_t **objects; //  pin handles (rm_pin_handle)
} pin_entry_t;

//  Eviction's policy (replica_evict.c): the cycles, the offload queue, placements waiting.
typedef struct {
    bool tier;             //  a disk tier
    kvp_offload_t offload; //  resolved: off, eager or on-evict
    int64_t next_tick;
    int64_t stalled_until;         //  the last cycle freed nothing: placements answered at once
    bool disk_short;               //  the last cycle kept objects for want of disk room
    uint64_t pool_size, pool_used; //  at the last cycle
    zlistx_t *waiting;             //  placements waiting for room (disk copies in flight)
    zlistx_t *ready;               //  ... whose wait is over, for the actor to answer
    size_t writes_out;             //  TX_DISK_WRITE jobs at the transfer-submitter
    zlistx_t *unsent;              //  ... waiting for one of those to finish (replica_evict.c)
    uint64_t queue;                //  disk copies being written
    uint64_t pending_free;         //  memory those will free (on-evict)
    uint64_t pending_disk;         //  disk bytes they will take
    uint64_t disk_room;            //  what the filesystem held when it refused a write (ENOSPC,
                                   //  EDQUOT); UINT64_MAX until then
    uint64_t cycles, stalls, skipped, forced, blocked, offloads, offloaded_bytes, failures;
    uint64_t walk_us, walk_max_us;
    uint64_t log_skipped, log_forced, log_blocked, log_freed;
    int64_t next_log;
} rm_policy_t;

typedef struct {
    zsock_t *pipe;
    zsock_t *router;            //  jobs, all routed by the api
    wait_set_t *waits;          //  the sockets the loop reads (every send touches its socket)
    allocator_t *allocator;     //  the node's space, run on this thread (KVP_AL_* jobs)
    allocator_t *own_allocator; //  ... when the config brought none (self tests)
    //  A helper for the reads of a PUT by address done here (transfer_job_copy): with it this
    //  thread reads two megabytes at once. Its own pool, so that waiting for it never has
    //  this thread run the transfer-submitter's copies.
    transfer_pool_t *readers;
    const kvp_config_t *config; //  = &settings
    kvp_config_t settings;      //  its own copy: settings changed at run time land here
    object_table_t *objects;    //  key -> kvp_object_t
    shm_index_t *index;         //  committed objects published for same-machine readers
    bool index_complete;        //  it vouches for absent keys: unlisted objects are counted
    zlistx_t *doomed;           //  removed objects whose space waits for pins to end
    zlistx_t *held;             //  revoked reservations whose space waits for their writer
    zlistx_t *departing;        //  objects with departed replicas (see DESIGN)
    uint8_t *gone;              //  bitmap of the ids of segments that went (REMOVE_SEGMENT)
    size_t gone_bytes;
    zhashx_t *pins; //  "<owner>:<key>" -> pin_entry_t: client pins by owner
    char *pin_key;  //  scratch for building pin keys
    size_t pin_key_size;
    uint64_t next_id;
    uint64_t next_version; //  role all: the last version given (rm_object_new)
    int64_t next_sweep;
    size_t pending;
    uint64_t bytes_stored;
    //  pinned and leased objects: a walk of the table a slice per STATS (s_stats)
    size_t count_slot;                       //  where the walk goes on
    uint64_t pinned_seen, leased_seen;       //  in this pass so far
    uint64_t pinned_objects, leased_objects; //  of the last whole pass
    uint64_t puts, gets, get_hits, removes, revoked;
    uint64_t items_freed; //  items of free jobs given to the allocator (the self test's)
    //  Eviction and the disk tier (see EVICTION below).
    rm_policy_t policy;      //  when and how much (replica_evict.c)
    zsock_t *tx;             //  disk copies to write and to unlink go here
    kvp_job_t *unlinks;      //  disk copies to unlink, sent at the end of each job
    size_t unlinks_out;      //  unlink jobs the transfer-submitter has not handed back
    lru_list_t memory;       //  objects with memory replicas, least recently used first
    lru_list_t disk;         //  objects with a disk copy, least recently used first
    lru_list_t unsaved;      //  --offload eager: committed objects without a disk copy yet
    admission_t *disk_reads; //  reads of disk-only objects, for --promote-on-hit
    bool eager;              //  --offload eager
    uint64_t disk_bytes;     //  footprints of the disk copies recorded
    uint64_t evictions, evicted_bytes, dropped_evictions;
    uint64_t disk_hits, promotions, disk_drops, disk_lost;
    //  Role node: the cluster actor hears of objects evicted or lost here (for the master).
    zsock_t *cluster;
    kvp_job_t *dropped; //  KVP_CL_DROPPED, sent at the end of each job
    //  --segment-dir: the record of the objects in the node's own segments (see DESIGN)
    object_log_t *log;
    uint64_t log_live;          //  live PUT records in it
    uint64_t log_hash_us;       //  time spent hashing values for it (and for rm_checksum)
    uint64_t checksum_failures; //  values refused: bytes that do not match their checksum
    //  The host hot cache (replica_cache.c): its copies, least recently used first (their
    //  in_memory link: they are in no other eviction order), and its counters
    lru_list_t cache;
    uint64_t cache_bytes;
    uint64_t cache_hits, cache_admissions, cache_evictions, cache_invalidations;
    uint64_t repairs_done, repair_bytes; //  replicas copied in for the cluster (replica_cache.c)
    int64_t cache_until_published; //  the lease the read index has
    int64_t own_until_published;   //  the bound on own copies it has (rm_reads_tick)
    //  --kv-events-endpoint: keys that become visible and go, for the publisher (or NULL)
    kv_events_feed_t *events;
    bool events_quiet; //  a remove-all that ends in AllBlocksCleared: no event per key
    regex_matcher_t *matcher;
    zlistx_t *regex_runs; //  regex_run_t, oldest first; the first is at the matcher if out
    bool regex_out;
    //  The loop (replica_manager.c, on infra/actor_shell.h): its spin before it sleeps, and
    //  when eviction's next cycle is due.
    spin_window_t spin;
    int64_t next_cycle;
} rm_state_t;

//  A pin handle: the object's address with the pin's epoch in its low bit (objects are
//  malloc'd, so at least 8-byte aligned).
static inline kvp_object_t *
rm_pin_handle (kvp_object_t *object, unsigned epoch)
{
    return (kvp_object_t *) ((uintptr_t) object | epoch);
}

static inline int
rm_epoch_pins (kvp_object_t *object, unsigned epoch)
{
    return atomic_load_explicit (&object->pins[epoch], memory_order_acquire)
           + (int) object->client_pins[epoch];
}

//  The KV events (actors/kv_events.h): a committed object became visible / one went.
static inline void
rm_event_stored (rm_state_t *self, const kvp_object_t *object)
{
    if (self->events)
        kv_events_feed_add (self->events, KV_EVENT_STORED, object->key, strlen (object->key),
                            object->version);
}

static inline void
rm_event_removed (rm_state_t *self, const kvp_object_t *object)
{
    if (self->events && !self->events_quiet)
        kv_events_feed_add (self->events, KV_EVENT_REMOVED, object->key, strlen (object->key),
                            object->version);
}

//  ---- replica_objects.c: objects, leases, pins, frees, disk records -------------------------

kvp_object_t *rm_pin_object (kvp_object_t *handle, unsigned *epoch);
void rm_object_destroy (kvp_object_t **object_p);
//  Frees the replicas of objects in the allocator. Takes ownership of the job.
void rm_frees_apply (rm_state_t *self, kvp_job_t **job_p);
//  Queues one range for freeing. Batches frees of one job into one message.
void rm_free_range (kvp_job_t **free_job_p, uint64_t size, const kvp_replica_t *replicas,
                    uint32_t count);
//  Queues an object's space for freeing: its replicas and its departed ones.
void rm_free_replicas (kvp_job_t **free_job_p, kvp_object_t *object);
//  Whether a dropped object's bytes may still be read: sends in flight, client pins, or
//  (for one an upsert replaced) a lease whose readers may hold only a replica list.
bool rm_has_pins (kvp_object_t *object, int64_t now);
//  Takes an object off the departing list (its departed replicas are freed with it).
void rm_departing_leave (rm_state_t *self, kvp_object_t *object);
void rm_segment_mark_gone (rm_state_t *self, uint32_t id);
//  Takes out of replicas[0..*count) those on a gone segment (or on segment, when not 0),
//  keeping the order of the rest, and copies them into lost (room for KVP_MAX_REPLICAS).
//  Returns how many went.
uint32_t rm_replicas_split (rm_state_t *self, kvp_replica_t *replicas, uint32_t *count,
                            uint32_t segment, kvp_replica_t *lost);
//  Puts placed on a segment before it went reach this actor after its REMOVE_SEGMENT: their
//  replicas there are freed and dropped. Returns false when that left the item none.
bool rm_strip_gone (rm_state_t *self, kvp_item_t *item, kvp_job_t **free_job_p);
//  Takes an object out of the table and frees (or dooms) it. The object pointer is invalid
//  afterwards unless it was doomed.
void rm_object_drop (rm_state_t *self, kvp_object_t *object, kvp_job_t **free_job_p, int64_t now);
kvp_object_t *rm_lookup_complete (rm_state_t *self, const char *key);
//  The pending object a job item reserved, if it is still the same one.
kvp_object_t *rm_lookup_reserved (rm_state_t *self, kvp_item_t *item);
void rm_fill_replicas (kvp_item_t *item, kvp_object_t *object, bool rotate);
//  A new object for item, with the job's pins, in the table (the caller sets its state).
kvp_object_t *rm_object_new (rm_state_t *self, kvp_job_t *job, kvp_item_t *item, int64_t now);
//  The lease a read stamped at read_ms (shm_index_last_read; 0: none) grants. A stamp is a
//  reader's word: one further ahead of now than STAMP_FUTURE_MAX_MS is no read at all, so a
//  client can lease an object no longer than by reading it. (A true stamp can be ahead of
//  now, the time a job started, by as long as the job has been running.)
int64_t rm_stamp_lease (rm_state_t *self, int64_t read_ms, int64_t now);
//  When the object's lease ends: the later of the reads this actor served and the last
//  read from the index.
int64_t rm_lease_end (rm_state_t *self, kvp_object_t *object, int64_t now);
//  Publishes a committed object in the index (its first replica), unread. One it does not
//  publish (on disk only, no room, a key too long) is counted among the unlisted keys while
//  the index vouches for absent keys (shm_index.h), as every visible object not in its slot.
void rm_publish (rm_state_t *self, kvp_object_t *object);
//  Withdraws an object from the index, keeping the lease its index reads granted.
void rm_withdraw (rm_state_t *self, kvp_object_t *object, int64_t now);
//  Whether a removal without force may take the object now, as far as can be told without
//  touching the index: no lease, no client pin.
bool rm_looks_removable (rm_state_t *self, kvp_object_t *object, bool force, int64_t now);
//  Whether a removal may take the object now; if so, it is out of the index already. The
//  last word on a published object's lease comes after its withdrawal (shm_index.h): an
//  object found leased then is published again.
bool rm_take_unleased (rm_state_t *self, kvp_object_t *object, bool force, int64_t now);
//  Queues a disk copy for unlinking by the transfer-submitter (sent by rm_unlinks_send).
void rm_unlink_queue (rm_state_t *self, uint64_t disk_id);
//  Sends the disk copies queued for unlinking to the transfer-submitter, and the objects
//  dropped to the cluster actor.
void rm_unlinks_send (rm_state_t *self);
//  Role node: the object is no longer held here by the cache's own doing (evicted, its disk
//  copy dropped or lost): the master is to be told (rm_unlinks_send sends it with the rest).
void rm_dropped_note (rm_state_t *self, const kvp_object_t *object);
//  Records the object's disk copy.
void rm_disk_attach (rm_state_t *self, kvp_object_t *object, uint64_t disk_id, uint64_t footprint,
                     int64_t now);
//  Forgets the object's disk copy; it is unlinked too when unlink is true.
void rm_disk_detach (rm_state_t *self, kvp_object_t *object, bool unlink);
//  Takes a dropped object out of the eviction orders; its disk copy goes.
void rm_lists_leave (rm_state_t *self, kvp_object_t *object);

//  ---- replica_log.c: the object log, checksums ----------------------------------------------

//  The checksum a GET sends with the object's value (Reply.checksums; 0: unknown). One that
//  nobody took yet (a same-machine client's PUT_END without one, a put by address) is
//  taken here the first time another node reads the value, which is when a reader will
//  verify it: once per object, on this thread, off every put's path. Clients of this node
//  get what is known.
uint64_t rm_checksum (rm_state_t *self, kvp_job_t *job, kvp_object_t *object);
void rm_log_put (rm_state_t *self, kvp_object_t *object, const uint64_t *checksum);
void rm_log_del (rm_state_t *self, kvp_object_t *object);
void rm_log_flush (rm_state_t *self);
//  Starts a fresh log at DIR/objects.log with the live records of every object that has
//  them, replacing the old one. Returns 0 or -1 (the old log, if any, stays).
int rm_log_rewrite (rm_state_t *self);

//  ---- replica_puts.c: the put state machine -------------------------------------------------

//  Revokes a pending, bound reservation for everyone but its writer: the key is free at
//  once, the space only when the writer is done with it (see DESIGN).
void rm_reservation_revoke (rm_state_t *self, kvp_object_t *object, kvp_job_t **free_job_p,
                            int64_t now);
//  Takes owner's revoked reservation of key off the list and frees its space. Returns true
//  if there was one.
bool rm_revoked_end (rm_state_t *self, uint64_t owner, const char *key, kvp_job_t **free_job_p);
//  A client's PUT_START: a pending object, busy until the allocator's placement is bound.
void rm_reserve (rm_state_t *self, kvp_job_t *job, int64_t now);
//  Records the replicas the allocator chose. Items the allocator failed release their
//  reservation. For a client's PUT_START the reservation now waits for PUT_END.
void rm_bind (rm_state_t *self, kvp_job_t *job, int64_t now);
//  Makes a pending object visible: published in the index and counted.
void rm_object_complete (rm_state_t *self, kvp_object_t *object, int64_t now);
//  A client's PUT_END: the object it reserved and wrote becomes visible.
void rm_commit (rm_state_t *self, kvp_job_t *job, int64_t now);
void rm_insert (rm_state_t *self, kvp_job_t *job, int64_t now);
//  A server-side UPSERT: as an insert, but an existing committed object is replaced. The old
//  one leaves the index and the table before the new one enters, so a reader finds one or
//  the other whole; its space waits for its readers (rm_has_pins). A key being written by a
//  client (PUT_START) is not replaced: REPLICA_IS_NOT_READY, and this value's space goes.
void rm_upsert (rm_state_t *self, kvp_job_t *job, int64_t now);
//  A hidden replica (kvp_object_t.hidden) the master holds committed: served, published,
//  logged and announced from now on.
void rm_unhide (rm_state_t *self, kvp_object_t *object);
//  KVP_RM_CONFIRM: the items (keys, versions) their writer committed at the master; those of
//  another version, or not held hidden here, are OBJECT_NOT_FOUND.
void rm_confirm (rm_state_t *self, kvp_job_t *job, int64_t now);
//  A PUT_PART: each item's bytes go at its offset into its key's reservation, which this job's
//  owner made (PUT_START) and which the allocator has bound. The reservation is pinned until
//  the api has copied them (it unpins at the reply), so a revoke or a put timeout meanwhile
//  frees the space only after the copy, as a removal waits for a zero-copy send.
void rm_part (rm_state_t *self, kvp_job_t *job, int64_t now);
void rm_revoke (rm_state_t *self, kvp_job_t *job, int64_t now);
//  KVP_RM_ADOPT (at start, with --segment-dir): the objects the allocator adopted from the
//  previous run become committed objects (in memory, published, in the eviction order), and
//  the object log starts afresh with exactly them (the compaction at start).
void rm_adopt (rm_state_t *self, kvp_job_t *job, int64_t now);

//  ---- replica_reads.c: reads, removals, client pins -----------------------------------------

//  Drops every pin of an owner that is gone.
void rm_pins_drop_owner (rm_state_t *self, uint64_t owner);
void rm_read (rm_state_t *self, kvp_job_t *job, int64_t now);
//  PREFIX_MATCH: blocks of kvp_job_ranks keys, in order. Every key of a whole block is leased as
//  a read leases it (the engine loads those blocks next); the first block with a key missing
//  ends the walk: from there on every key is OBJECT_NOT_FOUND, unchecked past the missing
//  one (kvp_job_prefix_count then counts the whole blocks).
void rm_prefix (rm_state_t *self, kvp_job_t *job, int64_t now);
void rm_remove (rm_state_t *self, kvp_job_t *job, int64_t now);
//  REMOVE_ALL and RESET: one pass over the table.
void rm_remove_many (rm_state_t *self, kvp_job_t *job, int64_t now);

//  ---- replica_tier.c -----------------------------------------------------------------

//  Whether a read of a disk-only object makes it hot enough to go back to memory.
bool rm_promote_due (rm_state_t *self, kvp_object_t *object, int64_t now);
//  Frees job->evict->want bytes of memory, least recently used first, by the plan in
//  job->evict (kvp_job_evict); the objects pinned for a disk copy are added to the job as
//  items.
void rm_evict (rm_state_t *self, kvp_job_t *job, int64_t now);

//  ---- replica_cache.c: the host hot cache ---------------------------------------------

//  Whether object may be served now: not a cache copy, or one while the node's lease holds.
bool rm_cache_servable (rm_state_t *self, const kvp_object_t *object, int64_t now);
//  KVP_RM_CACHE_INSERT, KVP_RM_CACHE_PUBLISH, KVP_RM_CACHE_DROP (kvp_job.h).
void rm_cache_insert (rm_state_t *self, kvp_job_t *job, int64_t now);
void rm_cache_publish (rm_state_t *self, kvp_job_t *job, int64_t now);
void rm_cache_drop_all (rm_state_t *self, kvp_job_t *job, int64_t now);
//  Lets go of the least recently used cache copies nothing holds until want bytes are
//  free or none is left (their master is told). Returns the bytes freed.
uint64_t rm_cache_evict (rm_state_t *self, uint64_t want, kvp_job_t **free_job_p, int64_t now);
//  A cache copy leaves the cache's order and counts (rm_object_drop's).
void rm_cache_leave (rm_state_t *self, kvp_object_t *object);
//  The lease the read index shows its readers, brought up to the node's (each loop turn).
void rm_cache_tick (rm_state_t *self);
//  The same for the node's own copies: the bound its read index shows on reading them.
void rm_reads_tick (rm_state_t *self);
//  The cache's size limit: --hot-cache-size, or a quarter of the node's memory.
uint64_t rm_cache_limit (rm_state_t *self);
//  A TX_DISK_WRITE of the objects rm_evict pinned came back: the copies are recorded, pins
//  end; items whose copy nobody wants come back OBJECT_NOT_FOUND (to be unlinked).
void rm_offloaded (rm_state_t *self, kvp_job_t *job, int64_t now);
//  Drops disk copies, least recently used first, until plan->want bytes of disk are free.
void rm_disk_evict (rm_state_t *self, kvp_evict_t *plan, int64_t now);
//  The jobs: RM_DISK_REGISTER, RM_DISK_LOST, RM_PROMOTE (messages/kvp_job.h).
void rm_disk_register (rm_state_t *self, kvp_job_t *job, int64_t now);
void rm_disk_lost (rm_state_t *self, kvp_job_t *job, int64_t now);
void rm_promote (rm_state_t *self, kvp_job_t *job, int64_t now);

//  ---- replica_evict.c ----------------------------------------------------------------

void rm_policy_init (rm_state_t *self);
//  Answers the placements still waiting on router (or destroys them when NULL).
void rm_policy_destroy (rm_state_t *self, zsock_t *router);
//  A placement (AL_ALLOC) left items NO_AVAILABLE_HANDLE: a cycle runs now and they are
//  placed again. Returns true when the job waits for disk copies in flight: it is parked
//  here with *reply_to_p (taken) until rm_room_made hands it back.
bool rm_make_room (rm_state_t *self, kvp_job_t *job, zframe_t **reply_to_p, int64_t now);
//  A placement of copies for the hot cache that found no room: other cache copies go for it
//  (never a replica), and it is placed again once.
void rm_cache_make_room (rm_state_t *self, kvp_job_t *job, int64_t now);
//  A parked placement whose wait is over, with its reply_to; NULL when none.
kvp_job_t *rm_room_made (rm_state_t *self, zframe_t **reply_to_p);
//  Runs a cycle when one is due; returns when the next is.
int64_t rm_policy_tick (rm_state_t *self, int64_t now);
//  A TX_DISK_WRITE job came back from the transfer-submitter.
void rm_offload_done (rm_state_t *self, kvp_job_t *job, int64_t now);
//  A setting changed (CONFIG): the watermarks are looked at again at once.
void rm_policy_config (rm_state_t *self);
//  Fills the eviction and disk tier side of the statistics.
void rm_policy_stats (rm_state_t *self, kvp_stats_t *stats);

#endif
