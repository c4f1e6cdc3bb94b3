/*  replica_evict.c - eviction's policy, on the replica-manager's thread: when the memory
    pool and the disk tier are past their watermarks and how much goes, the offload queue, and
    the placements that found no room (see EVICTION in replica_manager.c's DESIGN; the walks
    that decide which objects go are replica_tier.c's).

    A cycle: the allocator (this thread's) says how full the pool is. Past the high watermark,
    or for a placement that found no room, the cycle frees enough to bring the pool down to
    (high watermark - eviction ratio) of its size, at least the ratio, plus what the waiting
    placements need. The walk (rm_evict) takes the least recently used objects first and
    decides each by the plan made here: leased and pinned objects stay; soft-pinned ones go
    only in a second pass, if --evict-soft-pinned; an object that has a disk copy loses its
    memory at once; one that has none is dropped when there is no disk tier, and otherwise
    pinned and queued for a disk copy, as long as the offload queue and the disk have room
    (a cycle may queue at most --offload-cap-ratio of --offload-queue-limit). Past that the
    object is kept (skipped) unless --offload-force-evict drops it. So no path loses data
    silently. The memory freed goes to the allocator at once, on this thread.

    Cycles run every TICK_MS (IDLE_TICK_MS while the pool is under three quarters of its high
    watermark) and at once for a placement that found no room (rm_make_room): its items are
    placed again (AL_RETRY) in the same visit, so a put that must evict costs no message more
    than one that need not. When the memory is only freed by disk copies still to be written,
    the placement waits for them (at most MAKE_ROOM_WAIT_MS): it is parked here and handed
    back to the actor's loop (rm_room_made) once placed, once no copy is under way, or at its
    deadline. After a cycle that freed nothing, placements are answered at once for
    STALL_BACKOFF_MS (no walk over every object for each put).

    Disk copies: the pinned objects go to the transfer-submitter as TX_DISK_WRITE jobs of
    about OFFLOAD_JOB_BYTES each, at most OFFLOAD_JOBS_OUT of them there at once (the others
    wait here, in order), each coming back on this thread's socket (rm_offload_done): the
    copies are recorded, the memory of the objects still unleased and unpinned freed
    (rm_offloaded), and copies nobody took unlinked. So the memory comes back a few MiB at a
    time, as fast as the disk writes, and a placement waiting for room waits for about one
    job's writes: a cycle's copies sent as one job, or written side by side, all landed at
    the end together (measured: 4 MiB puts under constant overflow, p99 13 ms as one job a
    cycle, 7.2 ms now, memory only 2.2 ms). Memory that copies in flight or waiting will free
    counts as freed for the next cycle's target, and for what a placement still needs.
    --offload eager: every committed object is queued for a disk copy as it comes (each
    cycle takes as many as the queue allows) and keeps its memory. The disk tier
    is kept under --disk-high-watermark by dropping its least recently used copies down to
    --disk-low-watermark (rm_disk_evict); a filesystem that fills before --disk-capacity
    lowers the capacity to what it holds (s_disk_full).

    What a cycle could not do is summed, not logged per object: one line at most every
    LOG_INTERVAL_MS with the skipped, forced and passed-over counts since the last line.

    Threads: the replica-manager's only (replica_objects.h).
*/
#include "actors/replica_manager.h"
#include "actors/replica_objects.h"
#include "infra/log.h"
#include "tier/disk_store.h"

typedef rm_state_t self_t;

#define TICK_MS 10
//  ... or this, while the pool is under three quarters of its high watermark.
#define IDLE_TICK_MS 50
//  A placement waits at most this long for room (disk copies in flight included).
#define MAKE_ROOM_WAIT_MS 5000
//  After a cycle that freed nothing, placements are answered at once for this long.
#define STALL_BACKOFF_MS 100
#define LOG_INTERVAL_MS 1000
//  Disk copies a TX_DISK_WRITE job carries, in bytes (at least one object), and such jobs
//  at the transfer-submitter at once: written side by side, a cycle's copies would all land
//  together at the end, and a placement waiting for the first would wait for them all.
#define OFFLOAD_JOB_BYTES (4ULL << 20)
#define OFFLOAD_JOBS_OUT 2

//  A placement waiting for room.
typedef struct {
    kvp_job_t *job;
    zframe_t *routing_id;
    int64_t deadline;
} waiter_t;

void
rm_policy_init (self_t *self)
{
    rm_policy_t *policy = &self->policy;
    const kvp_config_t *config = self->config;
    policy->tier = config->disk_dir != NULL;
    policy->offload = config->offload;
    if (policy->offload == KVP_OFFLOAD_DEFAULT)
        policy->offload = policy->tier ? KVP_OFFLOAD_ON_EVICT : KVP_OFFLOAD_OFF;
    policy->disk_room = UINT64_MAX;
    policy->waiting = zlistx_new ();
    policy->ready = zlistx_new ();
    policy->unsent = zlistx_new ();
    assert (policy->waiting && policy->ready && policy->unsent);
    policy->next_tick = zclock_mono () + TICK_MS;
}

static void
s_waiters_destroy (zlistx_t **list_p, zsock_t *router)
{
    waiter_t *waiter;
    while ((waiter = (waiter_t *) zlistx_first (*list_p))) {
        zlistx_delete (*list_p, zlistx_cursor (*list_p));
        if (router)
            kvp_job_reply (router, &waiter->routing_id, waiter->job);
        else
            kvp_job_destroy (&waiter->job);
        zframe_destroy (&waiter->routing_id);
        free (waiter);
    }
    zlistx_destroy (list_p);
}

void
rm_policy_destroy (self_t *self, zsock_t *router)
{
    s_waiters_destroy (&self->policy.waiting, router);
    s_waiters_destroy (&self->policy.ready, router);
    //  (Objects pinned for a disk copy stay pinned: they end with the actor.)
    kvp_job_t *job;
    while ((job = (kvp_job_t *) zlistx_first (self->policy.unsent))) {
        zlistx_delete (self->policy.unsent, zlistx_cursor (self->policy.unsent));
        kvp_job_destroy (&job);
    }
    zlistx_destroy (&self->policy.unsent);
}

//  ---- placements waiting for room -----------------------------------------------------

//  Bytes the job's items that found no room need.
static uint64_t
s_no_room_bytes (const kvp_job_t *job)
{
    uint64_t bytes = 0;
    uint32_t replicas = job->opt.replica_num ? job->opt.replica_num : 1;
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVPOOL_NO_AVAILABLE_HANDLE)
            bytes += (job->items[i].size ? job->items[i].size : 1) * replicas;
    return bytes;
}

//  Bytes the waiting placements need.
static uint64_t
s_waiting_bytes (self_t *self)
{
    uint64_t bytes = 0;
    for (waiter_t *waiter = (waiter_t *) zlistx_first (self->policy.waiting); waiter;
         waiter = (waiter_t *) zlistx_next (self->policy.waiting))
        bytes += s_no_room_bytes (waiter->job);
    return bytes;
}

//  Places the items that found no room again (the job's stage stays the placement's).
static void
s_retry (self_t *self, kvp_job_t *job)
{
    kvp_job_kind_t kind = job->kind;
    zframe_t *none = NULL;
    job->kind = KVP_AL_RETRY;
    allocator_handle (self->allocator, job, &none);
    job->kind = kind;
}

//  Whether nothing under way may yet free memory for a waiting placement.
static bool
s_settled (self_t *self)
{
    return self->policy.writes_out == 0 && !self->policy.disk_short;
}

//  Hands back the waiting placements whose wait is over (all of them when the pool cannot be
//  helped for now): placed, nothing under way that may free more, or their deadline.
static void
s_waiters_check (self_t *self, bool all, int64_t now)
{
    rm_policy_t *policy = &self->policy;
    waiter_t *waiter = (waiter_t *) zlistx_first (policy->waiting);
    while (waiter) {
        s_retry (self, waiter->job);
        if (all || now >= waiter->deadline || s_settled (self)
            || s_no_room_bytes (waiter->job) == 0) {
            zlistx_delete (policy->waiting, zlistx_cursor (policy->waiting));
            zlistx_add_end (policy->ready, waiter);
            waiter = (waiter_t *) zlistx_first (policy->waiting);
        }
        else
            waiter = (waiter_t *) zlistx_next (policy->waiting);
    }
}

kvp_job_t *
rm_room_made (self_t *self, zframe_t **reply_to_p)
{
    waiter_t *waiter = (waiter_t *) zlistx_first (self->policy.ready);
    if (!waiter)
        return NULL;
    zlistx_delete (self->policy.ready, zlistx_cursor (self->policy.ready));
    kvp_job_t *job = waiter->job;
    *reply_to_p = waiter->routing_id;
    free (waiter);
    return job;
}

//  ---- the cycle ---------------------------------------------------------------------------

//  The disk's capacity: --disk-capacity, or less once its filesystem refused a write for want
//  of space (a filesystem smaller than the setting, or shared): then what the copies took at
//  that moment, so the watermarks drop copies to make room instead of every offload failing
//  and every put being refused.
static uint64_t
s_disk_capacity (self_t *self)
{
    return self->config->disk_capacity < self->policy.disk_room ? self->config->disk_capacity
                                                                : self->policy.disk_room;
}

//  A disk write failed with ENOSPC or EDQUOT: the capacity comes down to what the disk holds.
static void
s_disk_full (self_t *self, int64_t now)
{
    rm_policy_t *policy = &self->policy;
    //  The objects whose writes failed are kept: like a cycle short of disk room, the next
    //  one runs at once (drops copies down to the new watermarks, or objects without a copy)
    //  and placements waiting for room wait for it.
    policy->disk_short = true;
    policy->next_tick = now;
    uint64_t before = s_disk_capacity (self);
    if (self->disk_bytes >= before)
        return;
    if (policy->disk_room == UINT64_MAX)
        kvp_warning ("disk tier %s: the filesystem is full with %llu MiB of copies "
                     "(--disk-capacity %llu MiB): the tier's capacity is now what it holds, "
                     "and objects it has no room for are evicted without a copy",
                     self->config->disk_dir, (unsigned long long) (self->disk_bytes >> 20),
                     (unsigned long long) (self->config->disk_capacity >> 20));
    else
        kvp_debug ("disk tier: full again, capacity %llu -> %llu bytes",
                   (unsigned long long) before, (unsigned long long) self->disk_bytes);
    policy->disk_room = self->disk_bytes;
}

//  Logs what cycles could not do, summed, at most once every LOG_INTERVAL_MS.
static void
s_log (self_t *self, int64_t now)
{
    rm_policy_t *policy = &self->policy;
    if (now < policy->next_log
        || (!policy->log_skipped && !policy->log_forced && !policy->log_blocked))
        return;
    kvp_warning ("pool %.0f%% used; freed %llu MiB; kept %llu objects (no room for a "
                 "disk copy), evicted %llu without one, passed over %llu leased or pinned",
                 policy->pool_size ? 100.0 * policy->pool_used / policy->pool_size : 0.0,
                 (unsigned long long) (policy->log_freed >> 20),
                 (unsigned long long) policy->log_skipped, (unsigned long long) policy->log_forced,
                 (unsigned long long) policy->log_blocked);
    policy->log_skipped = policy->log_forced = policy->log_blocked = policy->log_freed = 0;
    policy->next_log = now + LOG_INTERVAL_MS;
}

//  Sends a TX_DISK_WRITE job of pinned objects to the transfer-submitter, or queues it
//  while OFFLOAD_JOBS_OUT are there (rm_offload_done sends it).
static void
s_offload_send (self_t *self, kvp_job_t *job, int64_t now)
{
    memset (kvp_job_evict (job), 0, sizeof (kvp_evict_t));
    if (self->policy.writes_out >= OFFLOAD_JOBS_OUT) {
        zlistx_add_end (self->policy.unsent, job);
        return;
    }
    self->policy.writes_out++;
    if (kvp_job_send (self->tx, job) == 0)
        wait_set_touch (self->waits, self->tx);
    else {
        job->status = KVPOOL_INTERNAL_ERROR;
        for (size_t i = 0; i < job->count; i++)
            job->items[i].status = KVPOOL_INTERNAL_ERROR;
        rm_offload_done (self, job, now); //  as if it came back failed
    }
}

//  A TX_DISK_WRITE job of items first .. end of job's, which hands them over (their pins).
static kvp_job_t *
s_slice (kvp_job_t *job, size_t first, size_t end)
{
    kvp_job_t *slice = kvp_job_new (KVP_TX_DISK_WRITE, 0);
    for (size_t i = first; i < end; i++) {
        kvp_item_t *from = &job->items[i];
        kvp_item_t *item = kvp_job_append_key (slice, from->key, from->key_len);
        item->object = from->object;
        item->object_id = from->object_id;
        item->size = from->size;
        item->src = from->src;
        item->disk.evict = from->disk.evict;
        from->object = NULL;
    }
    return slice;
}

//  A walk's outcome: its statistics; the objects it pinned go to the disk (job, a
//  TX_DISK_WRITE job with them as items).
static void
s_evicted (self_t *self, kvp_job_t *job, int64_t now)
{
    rm_policy_t *policy = &self->policy;
    kvp_evict_t *plan = kvp_job_evict (job);
    kvp_debug ("memory wanted %llu, freed %llu (%llu objects), queued %llu, skipped %llu, "
               "forced %llu, leased %llu, pinned %llu; disk %llu",
               (unsigned long long) plan->want, (unsigned long long) plan->freed_bytes,
               (unsigned long long) plan->freed_objects, (unsigned long long) plan->queued,
               (unsigned long long) plan->skipped, (unsigned long long) plan->forced,
               (unsigned long long) plan->leased, (unsigned long long) plan->pinned,
               (unsigned long long) self->disk_bytes);
    if (plan->want) {
        policy->walk_us = plan->walk_us;
        if (plan->walk_us > policy->walk_max_us)
            policy->walk_max_us = plan->walk_us;
    }
    policy->skipped += plan->skipped;
    policy->forced += plan->forced;
    policy->blocked = plan->leased + plan->pinned;
    policy->log_skipped += plan->skipped;
    policy->log_forced += plan->forced;
    policy->log_blocked += plan->leased + plan->pinned;
    policy->log_freed += plan->freed_bytes;
    uint64_t pending = 0;
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].disk.evict)
            pending += job->items[i].size;
    uint64_t gained = plan->freed_bytes + pending;
    if (plan->want && gained < plan->want) {
        policy->stalls++;
        //  Nothing to free because what there is is leased or pinned, no disk copy under way
        //  that will free some, and nothing kept for lack of disk room (which the next
        //  cycle's drops may make): the pool cannot be helped for now.
        if (gained == 0 && policy->writes_out == 0 && plan->skipped == 0
            && plan->leased + plan->pinned > 0)
            policy->stalled_until = now + STALL_BACKOFF_MS;
    }
    //  Objects kept for want of disk room: the next cycle drops disk copies first, and
    //  placements waiting for room wait for it.
    policy->disk_short = policy->tier && plan->skipped > 0 && gained == 0
                         && plan->queued < plan->limit; //  the queue had room: the disk had not
    if (policy->disk_short)
        policy->next_tick = now;
    if (job->count == 0) {
        kvp_job_destroy (&job);
        return;
    }
    //  The pinned objects' disk copies: written, then recorded (rm_offload_done), in jobs
    //  of about OFFLOAD_JOB_BYTES, each answered when its last copy is written: the memory
    //  of the first objects goes back to waiting placements while the others are written.
    policy->queue += job->count;
    policy->pending_free += pending;
    policy->pending_disk += plan->queued_bytes;
    for (size_t first = 0; first < job->count;) {
        size_t end = first;
        uint64_t bytes = 0;
        while (end < job->count && (end == first || bytes < OFFLOAD_JOB_BYTES))
            bytes += job->items[end++].size;
        if (first == 0 && end == job->count) {
            s_offload_send (self, job, now); //  one job is enough
            return;
        }
        s_offload_send (self, s_slice (job, first, end), now);
        first = end;
    }
    kvp_job_destroy (&job); //  (its items went to the slices)
}

//  One cycle: frees what the watermark wants, and at least need bytes more (for placements
//  that found no room; 0: none).
static void
s_cycle (self_t *self, uint64_t need, int64_t now)
{
    rm_policy_t *policy = &self->policy;
    const kvp_config_t *config = self->config;
    allocator_usage (self->allocator, &policy->pool_size, &policy->pool_used);
    double size = (double) policy->pool_size;
    uint64_t used =
        policy->pool_used > policy->pending_free ? policy->pool_used - policy->pending_free : 0;
    uint64_t want = 0;
    if (size > 0 && used > config->eviction_high_watermark * size)
        want =
            used - (uint64_t) ((config->eviction_high_watermark - config->eviction_ratio) * size);
    //  Placements that found no room: the ratio and what they need, less what the disk
    //  copies under way free as they land (queued ahead of any new copy, they come first).
    if (need) {
        uint64_t floor = (uint64_t) (config->eviction_ratio * size) + need;
        floor = floor > policy->pending_free ? floor - policy->pending_free : 0;
        if (want < floor)
            want = floor;
    }
    bool offloading = policy->offload != KVP_OFFLOAD_OFF;
    uint64_t queue_room = config->offload_queue_limit > policy->queue
                              ? config->offload_queue_limit - policy->queue
                              : 0;
    uint64_t cap = (uint64_t) (config->offload_queue_limit * config->offload_cap_ratio);
    uint64_t limit = queue_room < cap ? queue_room : cap;
    bool eager = policy->offload == KVP_OFFLOAD_EAGER && limit > 0;
    //  The disk: past its high watermark, or short of room for what this cycle will write
    //  there, its least recently used copies go, down to the low watermark.
    double disk_size = (double) s_disk_capacity (self);
    uint64_t disk_used = self->disk_bytes + policy->pending_disk;
    uint64_t to_write = policy->offload == KVP_OFFLOAD_ON_EVICT ? want : 0;
    if (policy->tier
        && (policy->disk_short || disk_used + to_write > config->disk_high_watermark * disk_size)) {
        policy->disk_short = false;
        kvp_evict_t drop = {0};
        //  Down to the low watermark, or lower if this cycle's copies would not fit under
        //  the high one from there.
        double target = config->disk_high_watermark * disk_size - (double) to_write;
        if (target > config->disk_low_watermark * disk_size)
            target = config->disk_low_watermark * disk_size;
        uint64_t floor_bytes = target > 0 ? (uint64_t) target : 0;
        //  Nothing to drop when the copies being written are what fills it: they land soon.
        drop.want = disk_used > floor_bytes ? disk_used - floor_bytes : 0;
        rm_disk_evict (self, &drop, now);
        kvp_debug ("disk wanted %llu, freed %llu (%llu objects), leased %llu; disk %llu",
                   (unsigned long long) drop.want, (unsigned long long) drop.freed_bytes,
                   (unsigned long long) drop.freed_objects, (unsigned long long) drop.leased,
                   (unsigned long long) self->disk_bytes);
    }
    if (want == 0 && !eager)
        return;
    kvp_job_t *job = kvp_job_new (KVP_TX_DISK_WRITE, 0);
    kvp_evict_t *plan = kvp_job_evict (job);
    plan->want = want;
    plan->offload = offloading;
    plan->force = config->offload_force_evict;
    plan->disk_full = policy->disk_room != UINT64_MAX;
    plan->soft = config->evict_soft_pinned;
    plan->limit = limit;
    plan->eager = eager ? limit : 0;
    //  The walk subtracts the copies recorded (after the drops above).
    double limit_bytes = config->disk_high_watermark * disk_size - (double) policy->pending_disk;
    plan->disk_limit = limit_bytes > 0 ? (uint64_t) limit_bytes : 0;
    //  Queued copies are in memory until written: their bytes are bounded too, not only
    //  their number (--offload-queue-bytes).
    plan->queue_bytes = config->offload_queue_bytes > policy->pending_disk
                            ? config->offload_queue_bytes - policy->pending_disk
                            : 0;
    if (plan->queue_bytes == 0)
        plan->limit = plan->eager = 0;
    if (want)
        policy->cycles++;
    rm_evict (self, job, now);
    s_evicted (self, job, now);
}

//  ---- what the actor calls ------------------------------------------------------------

void
rm_cache_make_room (self_t *self, kvp_job_t *job, int64_t now)
{
    uint64_t need = s_no_room_bytes (job);
    if (need == 0)
        return;
    kvp_job_t *free_job = NULL;
    uint64_t freed = rm_cache_evict (self, need, &free_job, now);
    rm_frees_apply (self, &free_job);
    if (freed)
        s_retry (self, job);
}

bool
rm_make_room (self_t *self, kvp_job_t *job, zframe_t **reply_to_p, int64_t now)
{
    rm_policy_t *policy = &self->policy;
    uint64_t need = s_no_room_bytes (job);
    if (need == 0)
        return false;
    //  Nothing could be freed a moment ago: no walk over every object for each put.
    if (now < policy->stalled_until && policy->writes_out == 0) {
        s_retry (self, job);
        return false;
    }
    need += s_waiting_bytes (self);
    s_cycle (self, need, now);
    //  Objects kept for want of disk room: a second cycle drops disk copies first.
    if (policy->disk_short)
        s_cycle (self, need, now);
    s_retry (self, job);
    s_log (self, now);
    if (s_no_room_bytes (job) == 0 || s_settled (self) || !reply_to_p || !*reply_to_p)
        return false;
    //  The memory comes with disk copies still to be written: the placement waits for them.
    waiter_t *waiter = (waiter_t *) zmalloc (sizeof (waiter_t));
    waiter->job = job;
    waiter->routing_id = *reply_to_p;
    *reply_to_p = NULL;
    waiter->deadline = now + MAKE_ROOM_WAIT_MS;
    zlistx_add_end (policy->waiting, waiter);
    return true;
}

int64_t
rm_policy_tick (self_t *self, int64_t now)
{
    rm_policy_t *policy = &self->policy;
    if (now < policy->next_tick)
        return policy->next_tick;
    double high = self->config->eviction_high_watermark * (double) policy->pool_size;
    bool idle = policy->pool_size && (double) policy->pool_used < 0.75 * high
                && zlistx_size (policy->waiting) == 0;
    policy->next_tick = now + (idle ? IDLE_TICK_MS : TICK_MS);
    bool waiting = zlistx_size (policy->waiting) > 0;
    if (waiting && now < policy->stalled_until && policy->writes_out == 0) {
        //  Nothing could be freed a moment ago: the waiting placements are answered.
        s_waiters_check (self, true, now);
        waiting = false;
    }
    s_cycle (self, waiting ? s_waiting_bytes (self) : 0, now);
    s_waiters_check (self, false, now);
    s_log (self, now);
    return policy->next_tick;
}

void
rm_offload_done (self_t *self, kvp_job_t *job, int64_t now)
{
    rm_policy_t *policy = &self->policy;
    assert (policy->writes_out > 0);
    policy->writes_out--;
    //  The copies are recorded and the memory they free goes to the allocator.
    rm_offloaded (self, job, now);
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        policy->queue--;
        if (item->disk.evict)
            policy->pending_free -= item->size;
        policy->pending_disk -= disk_store_footprint (item->key_len, item->size);
        if (item->disk.id && item->status == KVPOOL_OK) {
            policy->offloads++;
            policy->offloaded_bytes += item->size;
        }
        else if (item->disk.id)
            rm_unlink_queue (self, item->disk.id); //  a copy nobody took
        else
            policy->failures++;
    }
    if (kvp_job_evict (job)->no_space)
        s_disk_full (self, now);
    kvp_job_destroy (&job);
    kvp_job_t *next = (kvp_job_t *) zlistx_first (policy->unsent);
    if (next) {
        zlistx_delete (policy->unsent, zlistx_cursor (policy->unsent));
        s_offload_send (self, next, now);
    }
    s_waiters_check (self, false, now);
    s_log (self, now);
}

void
rm_policy_config (self_t *self)
{
    //  A watermark may have changed: at the next turn.
    self->policy.next_tick = zclock_mono ();
}

void
rm_policy_stats (self_t *self, kvp_stats_t *stats)
{
    rm_policy_t *policy = &self->policy;
    stats->evict_skipped = policy->skipped;
    stats->evict_forced = policy->forced;
    stats->evict_blocked = policy->blocked;
    stats->eviction_cycles = policy->cycles;
    stats->eviction_stalls = policy->stalls;
    stats->offloads = policy->offloads;
    stats->offloaded_bytes = policy->offloaded_bytes;
    stats->offload_queue = policy->queue;
    stats->offload_failures = policy->failures;
    stats->disk_capacity = policy->tier ? s_disk_capacity (self) : 0;
    stats->eviction_walk_us = policy->walk_us;
    stats->eviction_walk_max_us = policy->walk_max_us;
}
