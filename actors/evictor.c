/*  evictor.c - the evictor actor (see evictor.h).

    DESIGN
    A cycle: AL_STATS says how much of the pool is allocated (every 10 ms; every 50 ms while
    the pool is far from its watermark). Past the high watermark (or
    when a placement is waiting for room) the evictor asks the replica-manager to free
    enough to bring the pool down to (high watermark - eviction ratio) of its size, at least
    the ratio, plus what the waiting placements need (RM_EVICT). The replica-manager walks
    its objects least recently used first (approximate LRU: a second chance for an object
    read since it took its place) and decides each candidate by the plan this actor gives:
    leased and pinned objects stay; soft-pinned ones go only in a second pass, if
    --evict-soft-pinned; an object that has a disk copy loses its memory at once; one that
    has none is dropped when there is no disk tier, and otherwise pinned and handed back
    here for a disk copy, as long as the offload queue and the disk have room (this cycle
    may queue at most --offload-cap-ratio of --offload-queue-limit). Past that the object is
    kept (skipped) unless --offload-force-evict drops it. So no path loses data silently.

    The memory a cycle freed comes back in the job (kvp_evict_t.frees): this actor hands it
    to the allocator and waits for it to come back, then answers the placements that waited,
    which the api retries once (AL_RETRY). Offloads run on: the transfer-submitter writes
    each pinned object (TX_DISK_WRITE), the replica-manager records the copy and frees the
    memory if the object is still unleased and unpinned (RM_OFFLOADED); a placement that
    waits for room waits for the offloads in flight too (at most MAKE_ROOM_WAIT_MS). Memory
    that offloads in flight will free counts as freed for the next cycle's target.

    --offload eager: every committed object is queued for a disk copy as it comes (each
    cycle takes as many as the queue allows, RM_EVICT's eager list), and its memory stays.
    The disk tier is kept under --disk-high-watermark by dropping its least recently used
    copies down to --disk-low-watermark (RM_DISK_EVICT; unlinked by the transfer-submitter).

    What a cycle could not do is summed, not logged per object: one line at most every
    LOG_INTERVAL_MS with the skipped, forced and passed-over counts since the last line.

    Threads: one, the actor's. Ordering: one cycle at a time; offloads overlap cycles.
*/
#include "actors/evictor.h"

#include "infra/log.h"

#include <pthread.h>

#include "actors/replica_manager.h"
#include "actors/transfer_submitter.h"
#include "messages/kvp_job.h"
#include "tier/disk_store.h"

#define TICK_MS 10
//  ... or this, while the pool is under three quarters of its high watermark.
#define IDLE_TICK_MS 50
//  A placement waits at most this long for room (offloads included) before its retry.
#define MAKE_ROOM_WAIT_MS 5000
//  After a cycle that freed nothing, placements are answered at once for this long.
#define STALL_BACKOFF_MS 100
#define LOG_INTERVAL_MS 1000

typedef struct {
    kvp_job_t *job;
    zframe_t *routing_id;
    int64_t deadline;
    uint64_t cycle; //  answered once a cycle started after it has ended
} waiter_t;

typedef struct {
    zsock_t *pipe;
    zsock_t *router;            //  the api's jobs
    zsock_t *rm, *tx;           //  the replica-manager does the allocator's jobs too
    const kvp_config_t *config; //  = &settings
    kvp_config_t settings;      //  its own copy: settings changed at run time land here
    bool tier;                  //  a disk tier
    kvp_offload_t offload;      //  resolved: off, eager or on-evict
    char status[256];           //  "OK" or why the disk tier cannot start
    //  the cycle
    bool measuring;        //  AL_STATS out
    size_t cycle_out;      //  the cycle's jobs not back (RM_EVICT, RM_DISK_EVICT)
    uint64_t cycle_id;     //  cycles started
    uint64_t cycle_wanted; //  what the running cycle asked for
    uint64_t cycle_freed;  //  memory it freed or queued to free
    uint64_t pool_size, pool_used;
    int64_t next_tick;
    int64_t stalled_until; //  the last cycle freed nothing: no new one for a while
    bool disk_short;       //  the last cycle kept objects for want of disk room
    zlistx_t *waiters;     //  waiter_t: placements waiting for room
    //  offloads
    size_t writes_out;     //  TX_DISK_WRITE / RM_OFFLOADED jobs not back
    uint64_t queue;        //  disk copies being written
    uint64_t pending_free; //  memory those will free (on-evict)
    uint64_t pending_disk; //  disk bytes they will take
    uint64_t disk_bytes;   //  disk copies recorded (the replica-manager's last word)
    uint64_t disk_room;    //  what the filesystem held when it refused a write (ENOSPC,
                           //  EDQUOT); UINT64_MAX until then. See s_disk_capacity.
    size_t frees_out, drops_out;
    //  statistics
    uint64_t cycles, stalls, skipped, forced, blocked, offloads, offloaded_bytes, failures;
    uint64_t walk_us, walk_max_us;
    uint64_t log_skipped, log_forced, log_blocked, log_freed;
    int64_t next_log;
    bool terminated;
} self_t;

static zsock_t *
s_dealer (const char *instance, const char *suffix)
{
    zsock_t *sock = zsock_new (ZMQ_DEALER);
    assert (sock);
    zsock_set_sndhwm (sock, 0);
    zsock_set_rcvhwm (sock, 0);
    int rc = zsock_connect (sock, "inproc://%s-%s", instance, suffix);
    assert (rc == 0);
    return sock;
}

//  Sends a job and waits for it (start-up only, before anything else is under way).
static kvp_job_t *
s_call (zsock_t *sock, kvp_job_t *job)
{
    if (kvp_job_send (sock, job) == -1) {
        kvp_job_destroy (&job);
        return NULL;
    }
    return kvp_job_recv (sock);
}

//  Start-up: the copies a previous run left on disk become disk-only objects before the
//  node serves (the transfer-submitter scans and verifies them; it logs what it dropped).
static void
s_disk_register (self_t *self)
{
    kvp_job_t *scan = s_call (self->tx, kvp_job_new (KVP_TX_DISK_SCAN, 0));
    if (!scan || scan->status != KVPOOL_OK) {
        snprintf (self->status, sizeof self->status, "disk tier %s: %s", self->config->disk_dir,
                  scan ? scan->error : "no answer from the transfer-submitter");
        kvp_job_destroy (&scan);
        return;
    }
    uint64_t found = scan->count, bytes = 0;
    for (size_t i = 0; i < scan->count; i++)
        bytes += scan->items[i].disk_footprint;
    scan->kind = KVP_RM_DISK_REGISTER;
    kvp_job_t *registered = s_call (self->rm, scan);
    uint64_t duplicates = 0;
    for (size_t i = 0; registered && i < registered->count; i++)
        duplicates += registered->items[i].status != KVPOOL_OK;
    if (found)
        kvp_info ("kvpoold: disk tier %s: %llu objects (%llu MiB) found and registered",
                  self->config->disk_dir, (unsigned long long) (found - duplicates),
                  (unsigned long long) (bytes >> 20));
    self->disk_bytes = bytes;
    kvp_job_destroy (&registered);
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
    int rc = zsock_bind (self->router, "inproc://%s-ev", config->instance);
    assert (rc == 0);
    self->rm = s_dealer (config->instance, "rm");
    self->tx = s_dealer (config->instance, "tx");
    self->waiters = zlistx_new ();
    self->tier = config->disk_dir != NULL;
    self->disk_room = UINT64_MAX;
    self->offload = config->offload;
    if (self->offload == KVP_OFFLOAD_DEFAULT)
        self->offload = self->tier ? KVP_OFFLOAD_ON_EVICT : KVP_OFFLOAD_OFF;
    snprintf (self->status, sizeof self->status, "OK");
    if (self->tier)
        s_disk_register (self);
    self->next_tick = zclock_mono () + TICK_MS;
    return self;
}

static void
s_self_destroy (self_t **self_p)
{
    self_t *self = *self_p;
    if (!self)
        return;
    waiter_t *waiter;
    while ((waiter = (waiter_t *) zlistx_first (self->waiters))) {
        zlistx_delete (self->waiters, zlistx_cursor (self->waiters));
        kvp_job_reply (self->router, &waiter->routing_id, waiter->job);
        zframe_destroy (&waiter->routing_id);
        free (waiter);
    }
    zlistx_destroy (&self->waiters);
    //  Take back what is out, so no job leaks (the actors it went to end after this one).
    //  Objects pinned for a disk copy stay pinned: the replica-manager is ending too.
    zpoller_t *poller = zpoller_new (self->rm, self->tx, NULL);
    while (self->measuring || self->cycle_out || self->writes_out || self->drops_out
           || self->frees_out) {
        zsock_t *ready = (zsock_t *) zpoller_wait (poller, 2000);
        kvp_job_t *job = ready ? kvp_job_recv (ready) : NULL;
        if (!job)
            break;
        switch (job->kind) {
            case KVP_AL_STATS: self->measuring = false; break;
            case KVP_AL_FREE: self->frees_out--; break;
            case KVP_RM_EVICT:
            case KVP_RM_DISK_EVICT: self->cycle_out--; break;
            case KVP_TX_DISK_DROP: self->drops_out--; break;
            default: self->writes_out--; break;
        }
        kvp_job_destroy (&job); //  and the frees it carries
    }
    zpoller_destroy (&poller);
    zsock_destroy (&self->router);
    zsock_destroy (&self->rm);
    zsock_destroy (&self->tx);
    free (self);
    *self_p = NULL;
}

//  ---- the cycle -------------------------------------------------------------------------

//  The disk's capacity: --disk-capacity, or less once its filesystem refused a write for want
//  of space (a filesystem smaller than the setting, or shared): then what the copies took at
//  that moment, so the watermarks drop copies to make room instead of every offload failing
//  and every put being refused.
static uint64_t
s_disk_capacity (self_t *self)
{
    return self->config->disk_capacity < self->disk_room ? self->config->disk_capacity
                                                         : self->disk_room;
}

//  A disk write failed with ENOSPC or EDQUOT: the capacity comes down to what the disk holds.
static void
s_disk_full (self_t *self)
{
    //  The objects whose writes failed are kept: like a cycle short of disk room, the next
    //  one runs at once (drops copies down to the new watermarks, or objects without a copy)
    //  and placements waiting for room wait for it.
    self->disk_short = true;
    self->next_tick = zclock_mono ();
    uint64_t before = s_disk_capacity (self);
    if (self->disk_bytes >= before)
        return;
    if (self->disk_room == UINT64_MAX)
        kvp_warning ("disk tier %s: the filesystem is full with %llu MiB of copies "
                     "(--disk-capacity %llu MiB): the tier's capacity is now what it holds, "
                     "and objects it has no room for are evicted without a copy",
                     self->config->disk_dir, (unsigned long long) (self->disk_bytes >> 20),
                     (unsigned long long) (self->config->disk_capacity >> 20));
    else
        kvp_debug ("disk tier: full again, capacity %llu -> %llu bytes",
                   (unsigned long long) before, (unsigned long long) self->disk_bytes);
    self->disk_room = self->disk_bytes;
}

static void
s_send (zsock_t *sock, kvp_job_t *job, size_t *out)
{
    if (kvp_job_send (sock, job) == 0)
        (*out)++;
    else
        kvp_job_destroy (&job);
}

//  Answers the placements a finished cycle made room for (all of them when the pool cannot
//  be helped for now, or at their deadline).
static void
s_answer_waiters (self_t *self, bool all, int64_t now)
{
    waiter_t *waiter = (waiter_t *) zlistx_first (self->waiters);
    while (waiter) {
        bool done = all || now >= waiter->deadline
                    || (waiter->cycle < self->cycle_id && self->cycle_out == 0
                        && self->frees_out == 0 && self->writes_out == 0 && !self->disk_short);
        if (done) {
            zlistx_delete (self->waiters, zlistx_cursor (self->waiters));
            kvp_job_reply (self->router, &waiter->routing_id, waiter->job);
            zframe_destroy (&waiter->routing_id);
            free (waiter);
            waiter = (waiter_t *) zlistx_first (self->waiters);
        }
        else
            waiter = (waiter_t *) zlistx_next (self->waiters);
    }
}

//  Bytes the waiting placements need.
static uint64_t
s_waiting_bytes (self_t *self)
{
    uint64_t bytes = 0;
    for (waiter_t *waiter = (waiter_t *) zlistx_first (self->waiters); waiter;
         waiter = (waiter_t *) zlistx_next (self->waiters)) {
        uint32_t replicas = waiter->job->replica_num ? waiter->job->replica_num : 1;
        for (size_t i = 0; i < waiter->job->count; i++)
            if (waiter->job->items[i].status == KVPOOL_NO_AVAILABLE_HANDLE)
                bytes += waiter->job->items[i].size * replicas;
    }
    return bytes;
}

//  The pool's use is known: starts a cycle if there is anything to do.
static void
s_cycle_start (self_t *self, int64_t now)
{
    const kvp_config_t *config = self->config;
    double size = (double) self->pool_size;
    uint64_t used = self->pool_used > self->pending_free ? self->pool_used - self->pending_free : 0;
    uint64_t want = 0;
    if (size > 0 && used > config->eviction_high_watermark * size)
        want =
            used - (uint64_t) ((config->eviction_high_watermark - config->eviction_ratio) * size);
    bool waiting = zlistx_size (self->waiters) > 0;
    if (waiting && now < self->stalled_until && self->writes_out == 0) {
        //  Nothing could be freed a moment ago: no walk over every object for each put.
        s_answer_waiters (self, true, now);
        waiting = false;
    }
    if (waiting) {
        uint64_t floor = (uint64_t) (config->eviction_ratio * size) + s_waiting_bytes (self);
        if (want < floor)
            want = floor;
    }
    bool offloading = self->offload != KVP_OFFLOAD_OFF;
    uint64_t queue_room =
        config->offload_queue_limit > self->queue ? config->offload_queue_limit - self->queue : 0;
    uint64_t cap = (uint64_t) (config->offload_queue_limit * config->offload_cap_ratio);
    uint64_t limit = queue_room < cap ? queue_room : cap;
    bool eager = self->offload == KVP_OFFLOAD_EAGER && limit > 0;
    //  The disk: past its high watermark, or short of room for what this cycle will write
    //  there, its least recently used copies go, down to the low watermark.
    double disk_size = (double) s_disk_capacity (self);
    uint64_t disk_used = self->disk_bytes + self->pending_disk;
    uint64_t to_write = self->offload == KVP_OFFLOAD_ON_EVICT ? want : 0;
    if (self->tier
        && (self->disk_short || disk_used + to_write > config->disk_high_watermark * disk_size)) {
        self->disk_short = false;
        kvp_job_t *drop = kvp_job_new (KVP_RM_DISK_EVICT, 0);
        //  Down to the low watermark, or lower if this cycle's copies would not fit under
        //  the high one from there.
        double target = config->disk_high_watermark * disk_size - (double) to_write;
        if (target > config->disk_low_watermark * disk_size)
            target = config->disk_low_watermark * disk_size;
        uint64_t floor_bytes = target > 0 ? (uint64_t) target : 0;
        //  Nothing to drop when the copies being written are what fills it: they land soon.
        drop->evict.want = disk_used > floor_bytes ? disk_used - floor_bytes : 0;
        s_send (self->rm, drop, &self->cycle_out);
    }
    if (want == 0 && !eager) {
        s_answer_waiters (self, false, now);
        return;
    }
    kvp_job_t *job = kvp_job_new (KVP_RM_EVICT, 0);
    kvp_evict_t *plan = &job->evict;
    plan->want = want;
    plan->offload = offloading;
    plan->force = config->offload_force_evict;
    plan->disk_full = self->disk_room != UINT64_MAX;
    plan->soft = config->evict_soft_pinned;
    plan->limit = limit;
    plan->eager = eager ? limit : 0;
    //  The replica-manager subtracts the copies it has recorded (after the drops above).
    double limit_bytes = config->disk_high_watermark * disk_size - (double) self->pending_disk;
    plan->disk_limit = limit_bytes > 0 ? (uint64_t) limit_bytes : 0;
    //  Queued copies are in memory until written: their bytes are bounded too, not only
    //  their number (--offload-queue-bytes).
    plan->queue_bytes = config->offload_queue_bytes > self->pending_disk
                            ? config->offload_queue_bytes - self->pending_disk
                            : 0;
    if (plan->queue_bytes == 0)
        plan->limit = plan->eager = 0;
    self->cycle_id++;
    self->cycle_wanted = want;
    self->cycle_freed = 0;
    if (want)
        self->cycles++;
    s_send (self->rm, job, &self->cycle_out);
}

//  Logs what cycles could not do, summed, at most once every LOG_INTERVAL_MS.
static void
s_log (self_t *self, int64_t now)
{
    if (now < self->next_log || (!self->log_skipped && !self->log_forced && !self->log_blocked))
        return;
    kvp_warning ("pool %.0f%% used; freed %llu MiB; kept %llu objects (no room for a "
                 "disk copy), evicted %llu without one, passed over %llu leased or pinned",
                 self->pool_size ? 100.0 * self->pool_used / self->pool_size : 0.0,
                 (unsigned long long) (self->log_freed >> 20),
                 (unsigned long long) self->log_skipped, (unsigned long long) self->log_forced,
                 (unsigned long long) self->log_blocked);
    self->log_skipped = self->log_forced = self->log_blocked = self->log_freed = 0;
    self->next_log = now + LOG_INTERVAL_MS;
}

//  RM_EVICT came back: its frees go to the allocator, its pinned objects to the disk.
static void
s_evicted (self_t *self, kvp_job_t *job, int64_t now)
{
    kvp_evict_t *plan = &job->evict;
    self->disk_bytes = plan->disk_bytes;
    kvp_debug ("%s wanted %llu, freed %llu (%llu objects), queued %llu, skipped %llu, "
               "forced %llu, leased %llu, pinned %llu; disk %llu",
               job->kind == KVP_RM_EVICT ? "memory" : "disk", (unsigned long long) plan->want,
               (unsigned long long) plan->freed_bytes, (unsigned long long) plan->freed_objects,
               (unsigned long long) plan->queued, (unsigned long long) plan->skipped,
               (unsigned long long) plan->forced, (unsigned long long) plan->leased,
               (unsigned long long) plan->pinned, (unsigned long long) plan->disk_bytes);
    if (job->kind == KVP_RM_EVICT) {
        if (plan->want) {
            self->walk_us = plan->walk_us;
            if (plan->walk_us > self->walk_max_us)
                self->walk_max_us = plan->walk_us;
        }
        self->skipped += plan->skipped;
        self->forced += plan->forced;
        self->blocked = plan->leased + plan->pinned;
        self->log_skipped += plan->skipped;
        self->log_forced += plan->forced;
        self->log_blocked += plan->leased + plan->pinned;
        self->log_freed += plan->freed_bytes;
        uint64_t gained = plan->freed_bytes;
        uint64_t pending = 0;
        for (size_t i = 0; i < job->count; i++)
            if (job->items[i].evict)
                pending += job->items[i].size;
        gained += pending;
        if (plan->want && gained < plan->want) {
            self->stalls++;
            //  Nothing to free because what there is is leased or pinned, no disk copy under
            //  way that will free some, and nothing kept for lack of disk room (which the
            //  next cycle's drops may make): the pool cannot be helped for now.
            if (gained == 0 && self->writes_out == 0 && plan->skipped == 0
                && plan->leased + plan->pinned > 0)
                self->stalled_until = now + STALL_BACKOFF_MS;
        }
        //  Objects kept for want of disk room: the next cycle drops disk copies first, and
        //  placements waiting for room wait for it.
        self->disk_short = self->tier && plan->skipped > 0 && gained == 0
                           && plan->queued < plan->limit; //  the queue had room: the disk had not
        if (self->disk_short)
            self->next_tick = now;
        if (job->count) {
            //  The pinned objects' disk copies: written, then recorded.
            self->queue += job->count;
            self->pending_free += pending;
            self->pending_disk += plan->queued_bytes;
            kvp_job_t *frees = (kvp_job_t *) plan->frees;
            plan->frees = NULL;
            if (frees)
                s_send (self->rm, frees, &self->frees_out);
            job->kind = KVP_TX_DISK_WRITE;
            s_send (self->tx, job, &self->writes_out);
            return;
        }
    }
    kvp_job_t *frees = (kvp_job_t *) plan->frees;
    plan->frees = NULL;
    if (frees)
        s_send (self->rm, frees, &self->frees_out);
    kvp_job_destroy (&job);
}

//  A disk write job came back: the copies go to the replica-manager; or RM_OFFLOADED came
//  back: the copies nobody took are unlinked, the memory freed goes to the allocator.
static void
s_offload_step (self_t *self, kvp_job_t *job)
{
    if (job->kind == KVP_TX_DISK_WRITE) {
        job->kind = KVP_RM_OFFLOADED;
        s_send (self->rm, job, &self->writes_out);
        return;
    }
    assert (job->kind == KVP_RM_OFFLOADED);
    self->disk_bytes = job->evict.disk_bytes;
    kvp_job_t *drop = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        self->queue--;
        if (item->evict)
            self->pending_free -= item->size;
        self->pending_disk -= disk_store_footprint (item->key_len, item->size);
        if (item->disk_id && item->status == KVPOOL_OK) {
            self->offloads++;
            self->offloaded_bytes += item->size;
        }
        else if (item->disk_id) {
            if (!drop)
                drop = kvp_job_new (KVP_TX_DISK_DROP, 0);
            kvp_job_append (drop)->disk_id = item->disk_id;
        }
        else
            self->failures++;
    }
    if (job->evict.no_space)
        s_disk_full (self);
    if (drop)
        s_send (self->tx, drop, &self->drops_out);
    kvp_job_t *frees = (kvp_job_t *) job->evict.frees;
    job->evict.frees = NULL;
    if (frees)
        s_send (self->rm, frees, &self->frees_out);
    kvp_job_destroy (&job);
}

//  A reply from the replica-manager, the allocator or the transfer-submitter.
static void
s_reply (self_t *self, zsock_t *sock, int64_t now)
{
    kvp_job_t *job = kvp_job_recv (sock);
    if (!job)
        return;
    switch (job->kind) {
        case KVP_AL_STATS:
            self->measuring = false;
            self->pool_size = job->stats.bytes_mounted;
            self->pool_used = job->stats.bytes_allocated;
            kvp_job_destroy (&job);
            s_cycle_start (self, now);
            break;
        case KVP_RM_EVICT:
        case KVP_RM_DISK_EVICT:
            self->cycle_out--;
            s_evicted (self, job, now);
            break;
        case KVP_AL_FREE:
            self->frees_out--;
            kvp_job_destroy (&job);
            break;
        case KVP_TX_DISK_WRITE:
        case KVP_RM_OFFLOADED:
            self->writes_out--;
            s_offload_step (self, job);
            break;
        case KVP_TX_DISK_DROP:
            self->drops_out--;
            kvp_job_destroy (&job);
            break;
        default: kvp_job_destroy (&job); break;
    }
    s_answer_waiters (self, false, now);
    s_log (self, now);
}

//  ---- the api's jobs ---------------------------------------------------------------------

static void
s_stats (self_t *self, kvp_job_t *job)
{
    kvp_stats_t *stats = &job->stats;
    stats->evict_skipped = self->skipped;
    stats->evict_forced = self->forced;
    stats->evict_blocked = self->blocked;
    stats->eviction_cycles = self->cycles;
    stats->eviction_stalls = self->stalls;
    stats->offloads = self->offloads;
    stats->offloaded_bytes = self->offloaded_bytes;
    stats->offload_queue = self->queue;
    stats->offload_failures = self->failures;
    stats->disk_capacity = self->tier ? s_disk_capacity (self) : 0;
    stats->eviction_walk_us = self->walk_us;
    stats->eviction_walk_max_us = self->walk_max_us;
}

static void
s_job (self_t *self, int64_t now)
{
    zframe_t *routing_id = NULL;
    kvp_job_t *job = kvp_job_recv_routed (self->router, &routing_id);
    if (!job) {
        zframe_destroy (&routing_id);
        return;
    }
    if (job->kind == KVP_EV_MAKE_ROOM) {
        //  Answered once a cycle that starts from now has ended (s_answer_waiters).
        waiter_t *waiter = (waiter_t *) zmalloc (sizeof (waiter_t));
        waiter->job = job;
        waiter->routing_id = routing_id;
        waiter->deadline = now + MAKE_ROOM_WAIT_MS;
        waiter->cycle = self->cycle_id;
        zlistx_add_end (self->waiters, waiter);
        //  At once, not at the next tick.
        self->next_tick = now;
        return;
    }
    char why[256];
    if (job->kind == KVP_EV_STATS)
        s_stats (self, job);
    else if (job->kind == KVP_EV_CONFIG) {
        //  A setting changed at run time (the api checked it): the watermarks, at the next tick.
        if (job->setting && job->setting_value
            && kvp_config_change (&self->settings, job->setting, job->setting_value, why,
                                  sizeof why))
            kvp_job_fail (job, KVPOOL_INVALID_PARAMS, "%s", why);
        self->next_tick = now;
    }
    else
        kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "evictor: job kind %d", job->kind);
    kvp_job_reply (self->router, &routing_id, job);
    zframe_destroy (&routing_id);
}

//  Every tick, unless a cycle is under way: how full is the pool?
static void
s_tick (self_t *self, int64_t now)
{
    double high = self->config->eviction_high_watermark * (double) self->pool_size;
    bool idle = self->pool_size && (double) self->pool_used < 0.75 * high
                && zlistx_size (self->waiters) == 0;
    self->next_tick = now + (idle ? IDLE_TICK_MS : TICK_MS);
    if (self->measuring || self->cycle_out)
        return;
    kvp_job_t *job = kvp_job_new (KVP_AL_STATS, 0);
    if (kvp_job_send (self->rm, job) == 0)
        self->measuring = true;
    else
        kvp_job_destroy (&job);
}

void
evictor_actor (zsock_t *pipe, void *args)
{
    pthread_setname_np (pthread_self (), "kvp-evictor");
    self_t *self = s_self_new (pipe, (const kvp_config_t *) args);
    zpoller_t *poller = zpoller_new (pipe, self->router, self->rm, self->tx, NULL);
    zsock_signal (pipe, 0);
    while (!self->terminated) {
        int64_t wait = self->next_tick - zclock_mono ();
        void *which = zpoller_wait (poller, wait > 0 ? (int) wait : 0);
        int64_t now = zclock_mono ();
        if (which == pipe) {
            char *command = zstr_recv (pipe);
            if (!command || streq (command, "$TERM"))
                self->terminated = true;
            else if (streq (command, "STATUS"))
                zstr_send (pipe, self->status);
            else {
                kvp_error ("invalid pipe command '%s'", command);
                assert (false);
            }
            zstr_free (&command);
        }
        else if (which == self->router)
            s_job (self, now);
        else if (which)
            s_reply (self, (zsock_t *) which, now);
        if (now >= self->next_tick && streq (self->status, "OK"))
            s_tick (self, now);
    }
    zpoller_destroy (&poller);
    s_self_destroy (&self);
}

//  ---- self test ---------------------------------------------------------------------

//  Sends a job to an actor and waits for it back.
static kvp_job_t *
s_test_call (zsock_t *sock, kvp_job_t *job)
{
    assert (kvp_job_send (sock, job) == 0);
    kvp_job_t *back = kvp_job_recv (sock);
    assert (back == job);
    return back;
}

void
evictor_test (bool verbose)
{
    //  Puts through the allocator and the replica-manager, as the api makes them, past the
    //  high watermark: the evictor brings the pool back under it, oldest objects first.
    kvp_config_t config;
    kvp_config_defaults (&config);
    snprintf (config.instance, sizeof config.instance, "evtest");
    config.segment_size = 8 << 20;
    config.index_slots = 0;
    zactor_t *rm = zactor_new (replica_manager_actor, &config);
    zactor_t *tx = zactor_new (transfer_submitter_actor, &config);
    zactor_t *ev = zactor_new (evictor_actor, &config);
    assert (rm && tx && ev);
    zstr_send (ev, "STATUS");
    char *status = zstr_recv (ev);
    assert (status && streq (status, "OK"));
    zstr_free (&status);
    zsock_t *to_rm = zsock_new_dealer ("inproc://evtest-rm");
    zsock_t *to_ev = zsock_new_dealer ("inproc://evtest-ev");
    assert (to_rm && to_ev);
    char keys[40][16];
    for (int i = 0; i < 40; i++) {
        snprintf (keys[i], sizeof keys[i], "key-%02d", i);
        kvp_job_t *put = kvp_job_new (KVP_AL_ALLOC, 1);
        put->op = 1;
        put->items[0].key = keys[i];
        put->items[0].key_len = strlen (keys[i]);
        put->items[0].size = 256 << 10;
        s_test_call (to_rm, put);
        if (put->items[0].status == KVPOOL_NO_AVAILABLE_HANDLE) {
            //  As the api would: make room, retry once.
            put->kind = KVP_EV_MAKE_ROOM;
            s_test_call (to_ev, put);
            put->kind = KVP_AL_RETRY;
            s_test_call (to_rm, put);
        }
        assert (put->items[0].status == KVPOOL_OK);
        put->kind = KVP_RM_INSERT;
        s_test_call (to_rm, put);
        assert (put->items[0].status == KVPOOL_OK);
        kvp_job_destroy (&put);
        zclock_sleep (2);
    }
    //  40 x 256 KiB is 10 MiB in an 8 MiB pool: every put found room, and the pool ends
    //  under the watermark, the newest object kept, the oldest gone.
    zclock_sleep (100);
    kvp_job_t *stats = s_test_call (to_rm, kvp_job_new (KVP_AL_STATS, 0));
    assert (stats->stats.bytes_allocated <= 0.9 * stats->stats.bytes_mounted);
    kvp_job_destroy (&stats);
    const char *probe[] = {keys[0], keys[39]};
    size_t probe_lens[] = {6, 6};
    kvp_job_t *exist = kvp_job_new_owning (KVP_RM_EXIST, 2, probe, probe_lens);
    s_test_call (to_rm, exist);
    assert (exist->items[0].status == KVPOOL_OBJECT_NOT_FOUND);
    assert (exist->items[1].status == KVPOOL_OK);
    kvp_job_destroy (&exist);
    stats = s_test_call (to_rm, kvp_job_new (KVP_RM_STATS, 0));
    assert (stats->stats.evictions >= 8
            && stats->stats.evictions_dropped == stats->stats.evictions);
    stats->kind = KVP_EV_STATS;
    s_test_call (to_ev, stats);
    assert (stats->stats.eviction_cycles >= 1 && stats->stats.disk_capacity == 0);
    kvp_job_destroy (&stats);
    zsock_destroy (&to_rm);
    zsock_destroy (&to_ev);
    zactor_destroy (&ev);
    zactor_destroy (&rm);
    zactor_destroy (&tx);
    if (verbose)
        printf ("a pool past its watermark evicted, oldest first ");
}
