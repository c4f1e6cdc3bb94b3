/*  allocator.c - the allocator: segments, placement and space (see allocator.h).

    DESIGN
    A segment here is {id, segment_t (the shared mapping), segment_arena_t (jemalloc arena over
    a shadow range), owner}. Ids start at 1 and are never reused while the actor lives, so a
    stale replica can never point into a different segment.

    Placement of an object with R replicas: first the preferred segments named in the job (in
    order), then the rest in random order (seeded, reproducible) or by decreasing free ratio;
    each replica on a distinct segment. If the R replicas can't all be allocated the partial
    ones are freed and the item fails with NO_AVAILABLE_HANDLE (the pool is full; the
    replica-manager then makes room and retries once: KVP_AL_RETRY, actors/replica_evict.c).

    Unmounting first stops new allocations in the segment ("draining"), as soon as the
    unmount is known to go ahead (UNMOUNT_CHECK passed, or OWNER_SEGMENTS named it for a
    dead owner); the replica-manager takes every replica off it and frees what lived there
    (some only once the readers that pinned them are gone); the unmount completes, and is
    answered, when the arena is empty. One that times out leaves the segment draining: the
    replica-manager has let go of it, and a reader or writer still holding a range there
    must never find that range given to another object.

    A node may own no segments at all (--segments 0): all its memory is then what clients
    mount, and a put before any is mounted is answered NO_AVAILABLE_HANDLE.

    Threads: the replica-manager's alone. The allocator was an actor of its own; a put then
    crossed two threads (place, then insert) and each crossing is a thread wake-up, tens of
    microseconds on a virtual machine. Owned by the replica-manager, placing and inserting a
    small value is one visit to one thread (replica_manager.c, "Stages run together").
*/
#include "actors/allocator.h"

#include "infra/log.h"

#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/segment.h"
#include "alloc/segment_arena.h"
#include "actors/segment_dir.h"

#define UNMOUNT_TIMEOUT_MS 30000

typedef struct {
    uint32_t id;
    segment_t *segment;
    segment_arena_t *arena;
    char owner[64];
    bool draining;
    kvp_job_t *unmount_job; //  waiting for the arena to empty
    zframe_t *unmount_reply_to;
    int64_t unmount_deadline;
} seg_t;

//  An UNMOUNT whose reply waited for its segment to empty, ready now.
typedef struct {
    kvp_job_t *job;
    zframe_t *reply_to;
} finished_t;

struct _allocator_t {
    const kvp_config_t *config;
    zlistx_t *segments; //  seg_t, in id order
    uint32_t next_id;
    uint64_t rng;
    char error[300];         //  why the node's own segments could not be made
    segment_dir_t *dir;      //  --segment-dir: its lock, held for the node's life
    kvp_job_t *adopted;      //  KVP_RM_ADOPT: the previous run's objects, for the replica-manager
    zlistx_t *finished;      //  finished_t: unmounts to answer
    atomic_bool handed_back; //  allocator_hand_back: the owning thread is done with it
};
typedef struct _allocator_t self_t;

static void
s_seg_destroy (seg_t **seg_p)
{
    seg_t *seg = *seg_p;
    if (!seg)
        return;
    segment_arena_destroy (&seg->arena);
    segment_destroy (&seg->segment);
    zframe_destroy (&seg->unmount_reply_to);
    free (seg);
    *seg_p = NULL;
}

static seg_t *
s_seg_add (self_t *self, segment_t *segment, const char *owner)
{
    segment_arena_t *arena = segment_arena_new (segment_size (segment));
    if (!arena)
        return NULL;
    seg_t *seg = (seg_t *) zmalloc (sizeof (seg_t));
    seg->id = self->next_id++;
    seg->segment = segment;
    seg->arena = arena;
    snprintf (seg->owner, sizeof seg->owner, "%s", owner ? owner : "");
    zlistx_add_end (self->segments, seg);
    return seg;
}

static seg_t *
s_seg_find (self_t *self, uint32_t id)
{
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments))
        if (seg->id == id)
            return seg;
    return NULL;
}

static seg_t *
s_seg_find_name (self_t *self, const char *name)
{
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments))
        if (streq (segment_name (seg->segment), name))
            return seg;
    return NULL;
}

//  Places an adopted object (segment_dir.h): in the new segment of the same index if it has
//  room, else in any other of the node's own.
static bool
s_adopt_try (seg_t *seg, uint64_t size, kvp_replica_t *replica)
{
    uint64_t offset;
    if (segment_arena_alloc (seg->arena, size ? size : 1, &offset) != 0)
        return false;
    replica->segment_id = seg->id;
    replica->offset = offset;
    replica->addr = (char *) segment_base (seg->segment) + offset;
    return true;
}

static int
s_adopt_place (void *arg, uint64_t size, uint32_t hint, kvp_replica_t *replica)
{
    self_t *self = (self_t *) arg;
    seg_t *hinted = s_seg_find (self, hint + 1);
    if (hinted && s_adopt_try (hinted, size, replica))
        return 0;
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments))
        if (seg != hinted && s_adopt_try (seg, size, replica))
            return 0;
    return -1;
}

//  --segment-dir at start: the previous run's objects are copied into the new segments, the
//  segments' pages committed, and the objects handed to the replica-manager (which starts
//  the object log afresh with them), all before the node serves.
static void
s_adopt (self_t *self)
{
    kvp_job_t *job = kvp_job_new (KVP_RM_ADOPT, 0);
    segment_dir_adopt (self->dir, s_adopt_place, self, job);
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments))
        if (segment_commit (seg->segment) != 0) {
            snprintf (self->error, sizeof self->error, "cannot allocate the pages of %s: %s",
                      segment_name (seg->segment), strerror (errno));
            kvp_job_destroy (&job);
            return;
        }
    self->adopted = job;
}

//  The end of a segment's fault-in, on the segment's prefault thread (segment.h).
static void
s_prefault_done (segment_t *segment, size_t bytes, int error, void *arg)
{
    (void) arg;
    if (error == EINVAL)
        kvp_info ("%s: pages not faulted in ahead (no MADV_POPULATE_WRITE before Linux 5.14): "
                  "the first puts into them pay the page faults",
                  segment_name (segment));
    else if (error)
        kvp_warning ("%s: %zu of %zu MiB faulted in ahead, then: %s", segment_name (segment),
                     bytes >> 20, segment_size (segment) >> 20, strerror (error));
}

allocator_t *
allocator_new (const kvp_config_t *config)
{
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->config = config;
    self->segments = zlistx_new ();
    self->finished = zlistx_new ();
    self->next_id = 1;
    self->rng = config->seed * 0x9E3779B97F4A7C15ULL + 1;
    int stale = segment_remove_stale ();
    if (stale)
        kvp_info ("removed %d shared-memory segment(s) left by dead processes", stale);
    if (config->segment_dir) {
        self->dir = segment_dir_open (config->segment_dir, self->error, sizeof self->error);
        if (!self->dir)
            return self;
    }
    for (uint32_t i = 0; i < config->segments; i++) {
        char name[300];
        segment_t *segment;
        if (self->dir) {
            //  Sparse until the adoption is done (segment_dir.c: memory during adoption).
            segment_dir_path (self->dir, i, name, sizeof name);
            segment = segment_new_file (name, config->segment_size, config->lock_memory, false);
        }
        else {
            //  A sealed memfd: nobody can shrink it under the node (shm/segment.c). Clients
            //  of the node's user open it by its /proc/<pid>/fd name; --group ones cannot,
            //  and use the socket.
            snprintf (name, sizeof name, "kvpool-%s-%u", config->instance, i);
            segment = segment_new_sealed (config->segment_size, name);
            if (segment && config->lock_memory)
                segment_lock (segment);
        }
        //  mlock is often refused by RLIMIT_MEMLOCK: the node serves on, unlocked, and says so.
        if (segment && config->lock_memory && !segment_locked (segment))
            kvp_warning ("--lock-memory: segment %u (%s) is not locked in memory: raise the "
                         "memlock limit (ulimit -l; LimitMEMLOCK= in a systemd unit)",
                         i, segment_name (segment));
        if (!segment || !s_seg_add (self, segment, NULL)) {
            snprintf (self->error, sizeof self->error, "cannot create segment %u of %llu bytes: %s",
                      i, (unsigned long long) config->segment_size, strerror (errno));
            segment_destroy (&segment);
            break;
        }
        //  Its pages are committed but not yet mapped: fault them in now, in the background,
        //  rather than on the first puts (a locked segment's are in already; a --segment-dir
        //  file stays sparse until its adoption is done).
        if (!self->dir && !segment_locked (segment)
            && segment_prefault_start (segment, s_prefault_done, NULL) != 0)
            kvp_warning ("segment %u: cannot fault its pages in ahead: %s", i, strerror (errno));
    }
    if (self->dir && !self->error[0])
        s_adopt (self);
    return self;
}

//  Parks a finished unmount for allocator_finished.
static void
s_finished (self_t *self, kvp_job_t *job, zframe_t *reply_to)
{
    finished_t *done = (finished_t *) zmalloc (sizeof (finished_t));
    done->job = job;
    done->reply_to = reply_to;
    zlistx_add_end (self->finished, done);
}

void
allocator_stop (allocator_t *self)
{
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments))
        if (seg->unmount_job) {
            kvp_job_fail (seg->unmount_job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "shutting down");
            s_finished (self, seg->unmount_job, seg->unmount_reply_to);
            seg->unmount_job = NULL;
            seg->unmount_reply_to = NULL;
        }
}

void
allocator_hand_back (allocator_t *self)
{
    atomic_store_explicit (&self->handed_back, true, memory_order_release);
}

void
allocator_destroy (allocator_t **self_p)
{
    self_t *self = *self_p;
    if (!self)
        return;
    //  Everything the owning thread did is seen here (its hand-back was a release).
    (void) atomic_load_explicit (&self->handed_back, memory_order_acquire);
    allocator_stop (self);
    finished_t *done;
    while ((done = (finished_t *) zlistx_first (self->finished))) {
        zlistx_delete (self->finished, zlistx_cursor (self->finished));
        kvp_job_destroy (&done->job);
        zframe_destroy (&done->reply_to);
        free (done);
    }
    zlistx_destroy (&self->finished);
    seg_t *seg = (seg_t *) zlistx_first (self->segments);
    while (seg) {
        s_seg_destroy (&seg);
        seg = (seg_t *) zlistx_next (self->segments);
    }
    zlistx_destroy (&self->segments);
    segment_dir_destroy (&self->dir);
    kvp_job_destroy (&self->adopted);
    free (self);
    *self_p = NULL;
}

const char *
allocator_error (allocator_t *self)
{
    return self->error[0] ? self->error : NULL;
}

void
allocator_fail (allocator_t *self, const char *reason)
{
    snprintf (self->error, sizeof self->error, "%s", reason);
}

kvp_job_t *
allocator_adopted (allocator_t *self)
{
    kvp_job_t *job = self->adopted;
    self->adopted = NULL;
    return job;
}

kvp_job_t *
allocator_finished (allocator_t *self, zframe_t **reply_to_p)
{
    finished_t *done = (finished_t *) zlistx_first (self->finished);
    if (!done)
        return NULL;
    zlistx_delete (self->finished, zlistx_cursor (self->finished));
    kvp_job_t *job = done->job;
    *reply_to_p = done->reply_to;
    free (done);
    return job;
}

static uint64_t
s_random (self_t *self)
{
    //  xorshift64*: placement needs spread and reproducibility, not secrecy.
    self->rng ^= self->rng >> 12;
    self->rng ^= self->rng << 25;
    self->rng ^= self->rng >> 27;
    return self->rng * 0x2545F4914F6CDD1DULL;
}

static double
s_free_ratio (seg_t *seg)
{
    size_t capacity = segment_arena_capacity (seg->arena);
    return capacity ? 1.0 - (double) segment_arena_allocated (seg->arena) / capacity : 0;
}

//  Fills order[] with the candidate segments for one object, best first.
static size_t
s_candidates (self_t *self, kvp_job_t *job, seg_t **order, size_t capacity)
{
    size_t n = 0;
    for (size_t p = 0; p < job->opt.preferred_count && n < capacity; p++) {
        seg_t *seg = s_seg_find_name (self, job->opt.preferred[p]);
        bool dup = false;
        for (size_t k = 0; k < n; k++)
            dup |= order[k] == seg;
        if (seg && !seg->draining && !dup)
            order[n++] = seg;
    }
    size_t first_rest = n;
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg && n < capacity;
         seg = (seg_t *) zlistx_next (self->segments)) {
        bool dup = false;
        for (size_t k = 0; k < first_rest; k++)
            dup |= order[k] == seg;
        if (!seg->draining && !dup)
            order[n++] = seg;
    }
    size_t rest = n - first_rest;
    seg_t **tail = order + first_rest;
    if (self->config->placement == KVP_PLACEMENT_FREE_RATIO) {
        for (size_t i = 1; i < rest; i++)
            for (size_t j = i; j > 0 && s_free_ratio (tail[j]) > s_free_ratio (tail[j - 1]); j--) {
                seg_t *t = tail[j];
                tail[j] = tail[j - 1];
                tail[j - 1] = t;
            }
    }
    else
        for (size_t i = rest; i > 1; i--) {
            size_t j = s_random (self) % i;
            seg_t *t = tail[i - 1];
            tail[i - 1] = tail[j];
            tail[j] = t;
        }
    return n;
}

static void
s_free_item (self_t *self, kvp_item_t *item)
{
    for (uint32_t r = 0; r < item->replica_count; r++) {
        seg_t *seg = s_seg_find (self, item->replicas[r].segment_id);
        if (seg)
            segment_arena_free (seg->arena, item->replicas[r].offset);
    }
    item->replica_count = 0;
}

//  Says why item could not be placed, in job->error: the reply carries it even when only
//  some keys failed (the request status stays OK, the key's status says which).
static void
s_alloc_reason (self_t *self, kvp_job_t *job, kvp_item_t *item, uint32_t wanted, size_t candidates)
{
    uint64_t free_bytes = 0, total = 0;
    size_t segments = 0;
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments)) {
        if (seg->draining)
            continue;
        size_t capacity = segment_arena_capacity (seg->arena);
        size_t allocated = segment_arena_allocated (seg->arena);
        free_bytes += capacity > allocated ? capacity - allocated : 0;
        total += capacity;
        segments++;
    }
    if (item->status == KVPOOL_INVALID_REPLICA)
        snprintf (job->error, sizeof job->error,
                  "%u replicas asked for, but only %zu segment(s) can take one", wanted,
                  candidates);
    else if (segments == 0)
        snprintf (job->error, sizeof job->error,
                  "no segment to place %llu bytes in (none mounted, or all unmounting)",
                  (unsigned long long) item->size);
    else
        snprintf (job->error, sizeof job->error,
                  "no segment has room for %llu bytes x %u replica(s) (free: %llu of %llu "
                  "bytes in %zu segment(s))",
                  (unsigned long long) item->size, wanted, (unsigned long long) free_bytes,
                  (unsigned long long) total, segments);
}

//  ALLOC places every item that is OK; RETRY (after eviction made room) only those that
//  found no space the first time.
static void
s_alloc (self_t *self, kvp_job_t *job, bool retry)
{
    uint32_t wanted = job->opt.replica_num ? job->opt.replica_num : 1;
    seg_t *order[64];
    kvp_job_need_replicas (job);
    if (retry)
        job->error[0] = 0; //  the reason is given again if it still holds
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (retry) {
            if (item->status != KVPOOL_NO_AVAILABLE_HANDLE)
                continue;
            item->status = KVPOOL_OK;
        }
        item->replica_count = 0;
        if (item->status != KVPOOL_OK)
            continue;
        size_t n = s_candidates (self, job, order, 64);
        if (wanted > KVP_MAX_REPLICAS || n == 0) {
            item->status = n == 0 ? KVPOOL_NO_AVAILABLE_HANDLE : KVPOOL_INVALID_REPLICA;
            if (!job->error[0])
                s_alloc_reason (self, job, item, wanted, n);
            continue;
        }
        //  More replicas than segments: one a segment, and the reply says how many
        //  (Reply.replicas_placed), as a cluster with fewer nodes than asked does.
        uint32_t target = wanted < n ? wanted : (uint32_t) n;
        for (size_t k = 0; k < n && item->replica_count < target; k++) {
            uint64_t offset;
            //  A zero-byte value still gets a distinct address.
            size_t size = item->size ? item->size : 1;
            if (segment_arena_alloc (order[k]->arena, size, &offset) == 0) {
                kvp_replica_t *replica = &item->replicas[item->replica_count++];
                replica->segment_id = order[k]->id;
                replica->offset = offset;
                replica->addr = (char *) segment_base (order[k]->segment) + offset;
            }
        }
        if (item->replica_count < target) {
            s_free_item (self, item);
            item->status = KVPOOL_NO_AVAILABLE_HANDLE;
        }
        if (item->status != KVPOOL_OK && !job->error[0])
            s_alloc_reason (self, job, item, wanted, n);
    }
}

static void
s_segments (self_t *self, kvp_job_t *job)
{
    size_t n = zlistx_size (self->segments);
    free (job->segments.list);
    job->segments.list = (kvp_segment_info_t *) zmalloc ((n ? n : 1) * sizeof (kvp_segment_info_t));
    job->segments.count = 0;
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments)) {
        kvp_segment_info_t *info = &job->segments.list[job->segments.count++];
        info->id = seg->id;
        snprintf (info->name, sizeof info->name, "%s", segment_name (seg->segment));
        info->size = segment_size (seg->segment);
        info->used = segment_arena_allocated (seg->arena);
        snprintf (info->owner, sizeof info->owner, "%s", seg->owner);
        segment_identity (seg->segment, &info->device, &info->inode);
    }
}

//  The segments a client process mounted, to be unmounted now that it is gone (owners.h).
static void
s_owner_segments (self_t *self, kvp_job_t *job)
{
    free (job->segments.list);
    job->segments.list = NULL;
    job->segments.count = 0;
    size_t n = 0;
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments))
        n += job->segment.owner && streq (seg->owner, job->segment.owner);
    if (n == 0)
        return;
    job->segments.list = (kvp_segment_info_t *) zmalloc (n * sizeof (kvp_segment_info_t));
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments))
        if (streq (seg->owner, job->segment.owner)) {
            //  Going: nothing new is placed there while its objects are taken off it.
            seg->draining = true;
            kvp_segment_info_t *info = &job->segments.list[job->segments.count++];
            info->id = seg->id;
            snprintf (info->name, sizeof info->name, "%s", segment_name (seg->segment));
            snprintf (info->owner, sizeof info->owner, "%s", seg->owner);
        }
}

static void
s_stats (self_t *self, kvp_job_t *job)
{
    kvp_stats_t *stats = kvp_job_stats (job);
    stats->segments = (uint32_t) zlistx_size (self->segments);
    stats->bytes_allocated = 0;
    stats->bytes_mounted = 0;
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments)) {
        stats->bytes_allocated += segment_arena_allocated (seg->arena);
        stats->bytes_mounted += segment_size (seg->segment);
    }
    s_segments (self, job); //  each segment's size and use (the metrics show them)
}

void
allocator_usage (allocator_t *self, uint64_t *mounted, uint64_t *allocated)
{
    *mounted = *allocated = 0;
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments)) {
        *allocated += segment_arena_allocated (seg->arena);
        *mounted += segment_size (seg->segment);
    }
}

static void
s_mount (self_t *self, kvp_job_t *job)
{
    const char *name = job->segment.name;
    if (name && s_seg_find_name (self, name)) {
        kvp_job_fail (job, KVPOOL_SEGMENT_ALREADY_EXISTS, "segment %s is already mounted", name);
        return;
    }
    char reason[256];
    segment_t *segment = segment_mount (name, job->segment.size, reason, sizeof reason);
    if (!segment) {
        kvp_job_fail (job, errno == ENOENT ? KVPOOL_SEGMENT_NOT_FOUND : KVPOOL_INVALID_PARAMS, "%s",
                      reason);
        return;
    }
    //  Two arenas over one object would hand out the same bytes twice.
    for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
         seg = (seg_t *) zlistx_next (self->segments))
        if (segment_same_object (seg->segment, segment)) {
            kvp_job_fail (job, KVPOOL_SEGMENT_ALREADY_EXISTS,
                          "%s is segment %u (%s) under another name", name, seg->id,
                          segment_name (seg->segment));
            segment_destroy (&segment);
            return;
        }
    seg_t *seg = s_seg_add (self, segment, job->segment.owner);
    if (!seg) {
        segment_destroy (&segment);
        kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "cannot create an arena for %s", name);
        return;
    }
    job->segment.id = seg->id;
}

//  Ends the unmount of a drained segment. Returns true if it was ended.
static bool
s_unmount_finish (self_t *self, seg_t *seg, int64_t now)
{
    if (!seg->unmount_job)
        return false;
    bool empty = segment_arena_count (seg->arena) == 0;
    if (!empty && now < seg->unmount_deadline)
        return false;
    kvp_job_t *job = seg->unmount_job;
    seg->unmount_job = NULL;
    zframe_t *reply_to = seg->unmount_reply_to;
    seg->unmount_reply_to = NULL;
    if (empty) {
        //  A segment whose owner died: nobody else will unlink its name (one made with
        //  shm_open; a memfd goes with its last descriptor).
        const char *name = segment_name (seg->segment);
        if (job->segment.orphan && !segment_name_is_fd (name) && shm_unlink (name) == 0)
            kvp_info ("unlinked %s, left by a client that died", name);
        //  Position the list cursor on seg and delete it there.
        for (seg_t *it = (seg_t *) zlistx_first (self->segments); it;
             it = (seg_t *) zlistx_next (self->segments))
            if (it == seg) {
                zlistx_delete (self->segments, zlistx_cursor (self->segments));
                break;
            }
        s_seg_destroy (&seg);
    }
    else
        //  Still draining (see DESIGN): a later unmount may try again.
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                      "segment %u still holds %zu allocations (readers of it still pin "
                      "them); it takes no new ones",
                      seg->id, segment_arena_count (seg->arena));
    s_finished (self, job, reply_to);
    return true;
}

static void
s_check_unmounts (self_t *self)
{
    int64_t now = zclock_mono ();
    bool again = true;
    while (again) {
        again = false;
        for (seg_t *seg = (seg_t *) zlistx_first (self->segments); seg;
             seg = (seg_t *) zlistx_next (self->segments))
            if (s_unmount_finish (self, seg, now)) {
                again = true; //  the list changed under the iteration
                break;
            }
    }
}

//  A client may unmount only memory it mounted itself; the node's own segments go only with
//  the node. Internal jobs (no owner) may unmount any segment.
static void
s_unmount_check (self_t *self, kvp_job_t *job)
{
    seg_t *seg = s_seg_find (self, job->segment.id);
    if (!seg)
        kvp_job_fail (job, KVPOOL_SEGMENT_NOT_FOUND, "no segment %u", job->segment.id);
    else if (job->segment.owner && !seg->owner[0])
        kvp_job_fail (job, KVPOOL_PERMISSION_DENIED,
                      "segment %u is the node's own memory: clients cannot unmount it", seg->id);
    else if (job->segment.owner && strcmp (job->segment.owner, seg->owner) != 0)
        kvp_job_fail (job, KVPOOL_PERMISSION_DENIED, "segment %u belongs to another process (%s)",
                      seg->id, seg->owner);
    else if (seg->unmount_job)
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "segment %u is unmounting",
                      seg->id);
    else
        //  The unmount goes ahead: nothing new is placed there from now on.
        seg->draining = true;
}

//  Returns true when the job was parked (the reply comes later).
static bool
s_unmount (self_t *self, kvp_job_t *job, zframe_t **reply_to_p)
{
    seg_t *seg = s_seg_find (self, job->segment.id);
    if (!seg) {
        kvp_job_fail (job, KVPOOL_SEGMENT_NOT_FOUND, "no segment %u", job->segment.id);
        return false;
    }
    if (seg->unmount_job) {
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "segment %u is unmounting",
                      seg->id);
        return false;
    }
    seg->draining = true;
    seg->unmount_job = job;
    seg->unmount_reply_to = *reply_to_p;
    *reply_to_p = NULL;
    seg->unmount_deadline = zclock_mono () + UNMOUNT_TIMEOUT_MS;
    s_check_unmounts (self);
    return true;
}

bool
allocator_handle (allocator_t *self, kvp_job_t *job, zframe_t **reply_to_p)
{
    if (self->error[0] && job->kind != KVP_AL_FREE) {
        kvp_job_fail (job, KVPOOL_NO_AVAILABLE_HANDLE, "%s", self->error);
        for (size_t i = 0; i < job->count; i++)
            if (job->items[i].status == KVPOOL_OK)
                job->items[i].status = KVPOOL_NO_AVAILABLE_HANDLE;
        return false;
    }
    switch (job->kind) {
        case KVP_AL_ALLOC: s_alloc (self, job, false); break;
        case KVP_AL_RETRY: s_alloc (self, job, true); break;
        case KVP_AL_FREE:
            for (size_t i = 0; i < job->count; i++)
                s_free_item (self, &job->items[i]);
            s_check_unmounts (self);
            break;
        case KVP_AL_STATS: s_stats (self, job); break;
        case KVP_AL_SEGMENTS: s_segments (self, job); break;
        case KVP_AL_MOUNT: s_mount (self, job); break;
        case KVP_AL_UNMOUNT_CHECK: s_unmount_check (self, job); break;
        case KVP_AL_UNMOUNT: return s_unmount (self, job, reply_to_p);
        case KVP_AL_OWNER_SEGMENTS: s_owner_segments (self, job); break;
        default:
            kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "allocator: job kind %d", job->kind);
            break;
    }
    return false;
}

void
allocator_tick (allocator_t *self)
{
    s_check_unmounts (self);
}

//  ---- self test ---------------------------------------------------------------------

static kvp_job_t *
s_test_call (allocator_t *al, kvp_job_t *job)
{
    zframe_t *reply_to = NULL;
    assert (!allocator_handle (al, job, &reply_to));
    return job;
}

void
allocator_test (bool verbose)
{
    kvp_config_t config;
    kvp_config_defaults (&config);
    snprintf (config.instance, sizeof config.instance, "altest%d", (int) getpid ());
    config.segments = 3;
    config.segment_size = 8 << 20;
    allocator_t *al = allocator_new (&config);
    assert (al && allocator_error (al) == NULL && allocator_adopted (al) == NULL);

    //  Three replicas land on three distinct segments, at writable addresses.
    kvp_job_t *job = kvp_job_new (KVP_AL_ALLOC, 2);
    job->opt.replica_num = 3;
    job->items[0].size = 1 << 20;
    job->items[1].size = 1000;
    s_test_call (al, job);
    for (int i = 0; i < 2; i++) {
        kvp_item_t *item = &job->items[i];
        assert (item->status == KVPOOL_OK && item->replica_count == 3);
        assert (item->replicas[0].segment_id != item->replicas[1].segment_id);
        assert (item->replicas[1].segment_id != item->replicas[2].segment_id);
        assert (item->replicas[0].segment_id != item->replicas[2].segment_id);
        memset (item->replicas[2].addr, 0xab, item->size);
    }
    //  Four replicas on three segments: three, one a segment (the reply says so).
    kvp_job_t *too_many = kvp_job_new (KVP_AL_ALLOC, 1);
    too_many->opt.replica_num = 4;
    too_many->items[0].size = 10;
    s_test_call (al, too_many);
    assert (too_many->items[0].status == KVPOOL_OK && too_many->items[0].replica_count == 3);
    too_many->kind = KVP_AL_FREE;
    s_test_call (al, too_many);
    kvp_job_destroy (&too_many);

    //  Preferred segment first.
    kvp_job_t *segs = kvp_job_new (KVP_AL_SEGMENTS, 0);
    s_test_call (al, segs);
    assert (segs->segments.count == 3);
    //  The node's own segments are sealed memfds: whoever can open one (here, by its name,
    //  as a same-machine client does) can neither shrink nor grow it under the node.
    for (size_t i = 0; i < segs->segments.count; i++) {
        assert (segment_name_is_fd (segs->segments.list[i].name));
        int seg_fd = open (segs->segments.list[i].name, O_RDWR | O_CLOEXEC);
        assert (seg_fd >= 0);
        int seals = fcntl (seg_fd, F_GET_SEALS);
        assert ((seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
                == (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
        errno = 0;
        assert (ftruncate (seg_fd, 0) == -1 && errno == EPERM);
        assert (ftruncate (seg_fd, 16 << 20) == -1 && errno == EPERM);
        close (seg_fd);
    }
    kvp_job_t *pref = kvp_job_new (KVP_AL_ALLOC, 1);
    pref->opt.preferred[0] = segs->segments.list[2].name;
    pref->opt.preferred_count = 1;
    pref->items[0].size = 100;
    s_test_call (al, pref);
    assert (pref->items[0].replicas[0].segment_id == segs->segments.list[2].id);
    pref->kind = KVP_AL_FREE;
    s_test_call (al, pref);
    kvp_job_destroy (&pref);

    //  Filling the pool ends in NO_AVAILABLE_HANDLE, and freeing gives the space back.
    kvp_job_t *fill = kvp_job_new (KVP_AL_ALLOC, 64);
    for (int i = 0; i < 64; i++)
        fill->items[i].size = 1 << 20;
    s_test_call (al, fill);
    int ok = 0, full = 0;
    for (int i = 0; i < 64; i++) {
        ok += fill->items[i].status == KVPOOL_OK;
        full += fill->items[i].status == KVPOOL_NO_AVAILABLE_HANDLE;
    }
    assert (ok >= 12 && full > 0 && ok + full == 64);
    //  The reply says why (the request itself is OK: only some keys failed).
    assert (fill->status == KVPOOL_OK);
    assert (strstr (fill->error, "no segment has room for 1048576 bytes x 1 replica(s) (free: "));
    assert (strstr (fill->error, "of 25165824 bytes in 3 segment(s))"));
    kvp_job_t *stats = kvp_job_new (KVP_AL_STATS, 0);
    s_test_call (al, stats);
    assert (kvp_job_stats (stats)->bytes_mounted == 3 * (8 << 20)
            && kvp_job_stats (stats)->segments == 3);
    uint64_t used_full = kvp_job_stats (stats)->bytes_allocated;
    fill->kind = KVP_AL_FREE;
    s_test_call (al, fill);
    s_test_call (al, stats);
    assert (kvp_job_stats (stats)->bytes_allocated < used_full);
    kvp_job_destroy (&fill);

    //  Memory that could shrink under the node is refused, with the reason.
    char name[64];
    segment_make_name (name, sizeof name, "altest-plain", 0);
    segment_t *plain = segment_new (name, 4 << 20, false);
    assert (plain);
    kvp_job_t *mount = kvp_job_new (KVP_AL_MOUNT, 0);
    kvp_job_payload (mount, KVP_PAYLOAD_SEGMENT);
    mount->segment.name = name;
    mount->segment.size = 4 << 20;
    mount->segment.owner = "pid:1";
    s_test_call (al, mount);
    assert (mount->status == KVPOOL_INVALID_PARAMS && strstr (mount->error, "F_SEAL_SHRINK"));
    segment_destroy (&plain);

    //  Mount a client's sealed memfd; unmount waits until it is empty.
    segment_t *client = segment_new_sealed (4 << 20, "altest-client");
    assert (client);
    snprintf (name, sizeof name, "%s", segment_name (client));
    mount->status = KVPOOL_OK;
    mount->error[0] = 0;
    s_test_call (al, mount);
    assert (mount->status == KVPOOL_OK && mount->segment.id == 4);
    s_test_call (al, mount);
    assert (mount->status == KVPOOL_SEGMENT_ALREADY_EXISTS);
    //  ... and under another name of the same object too.
    int fd = -1;
    sscanf (name, "/proc/%*d/fd/%d", &fd);
    int dup_fd = dup (fd);
    char other_name[64];
    snprintf (other_name, sizeof other_name, "/proc/%d/fd/%d", (int) getpid (), dup_fd);
    mount->segment.name = other_name;
    mount->status = KVPOOL_OK;
    mount->error[0] = 0;
    s_test_call (al, mount);
    assert (mount->status == KVPOOL_SEGMENT_ALREADY_EXISTS);
    close (dup_fd);
    mount->segment.name = name;
    kvp_job_t *on_client = kvp_job_new (KVP_AL_ALLOC, 1);
    on_client->opt.preferred[0] = name;
    on_client->opt.preferred_count = 1;
    on_client->items[0].size = 4096;
    s_test_call (al, on_client);
    assert (on_client->items[0].replicas[0].segment_id == 4);
    memcpy (on_client->items[0].replicas[0].addr, "hello", 5);
    //  The node's mapping and the client's are the same bytes.
    assert (
        memcmp ((char *) segment_base (client) + on_client->items[0].replicas[0].offset, "hello", 5)
        == 0);
    //  Only the process that mounted a segment may unmount it; nobody unmounts the node's.
    kvp_job_t *check = kvp_job_new (KVP_AL_UNMOUNT_CHECK, 0);
    kvp_job_payload (check, KVP_PAYLOAD_SEGMENT);
    check->segment.id = 4;
    check->segment.owner = "pid:2/9";
    s_test_call (al, check);
    assert (check->status == KVPOOL_PERMISSION_DENIED && strstr (check->error, "another process"));
    check->status = KVPOOL_OK;
    check->segment.id = 1;
    s_test_call (al, check);
    assert (check->status == KVPOOL_PERMISSION_DENIED && strstr (check->error, "node's own"));
    check->status = KVPOOL_OK;
    check->segment.id = 4;
    check->segment.owner = "pid:1";
    s_test_call (al, check);
    assert (check->status == KVPOOL_OK);
    kvp_job_destroy (&check);
    //  When its owner dies, the allocator names the segments to unmount: only its own.
    kvp_job_t *orphans = kvp_job_new (KVP_AL_OWNER_SEGMENTS, 0);
    kvp_job_payload (orphans, KVP_PAYLOAD_SEGMENT);
    orphans->segment.owner = "pid:1";
    s_test_call (al, orphans);
    assert (orphans->segments.count == 1 && orphans->segments.list[0].id == 4);
    assert (streq (orphans->segments.list[0].name, name));
    orphans->segment.owner = "pid:2/9";
    s_test_call (al, orphans);
    assert (orphans->segments.count == 0);
    kvp_job_destroy (&orphans);
    kvp_job_t *unmount = kvp_job_new (KVP_AL_UNMOUNT, 0);
    kvp_job_payload (unmount, KVP_PAYLOAD_SEGMENT);
    unmount->segment.id = 4;
    zframe_t *reply_to = zframe_new ("client", 6);
    assert (allocator_handle (al, unmount, &reply_to) && reply_to == NULL);
    allocator_tick (al);
    assert (allocator_finished (al, &reply_to) == NULL); //  parked: one allocation is left
    on_client->kind = KVP_AL_FREE;
    s_test_call (al, on_client);
    assert (allocator_finished (al, &reply_to) == unmount);
    assert (reply_to && zframe_streq (reply_to, "client"));
    zframe_destroy (&reply_to);
    assert (unmount->status == KVPOOL_OK);
    s_test_call (al, segs);
    assert (segs->segments.count == 3);
    kvp_job_destroy (&unmount);
    kvp_job_destroy (&on_client);
    kvp_job_destroy (&mount);
    segment_destroy (&client);

    job->kind = KVP_AL_FREE;
    s_test_call (al, job);
    s_test_call (al, stats);
    assert (kvp_job_stats (stats)->bytes_allocated == 0);
    kvp_job_destroy (&job);
    kvp_job_destroy (&stats);
    kvp_job_destroy (&segs);
    allocator_destroy (&al);
    if (verbose)
        printf ("placement, full pool, mount/unmount ");
}
