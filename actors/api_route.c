/*  api_route.c - jobs walked through their operation's row (api_self.h, messages/ops.h):
    each stage sent to the actor that owns its kind, and the job answered when none is left.
    A RESET waits for the writes in flight and holds new ones back; the node's own jobs
    (segment listings, dead clients, orphan segments, disk follow-ups) walk rows too.

    Threads: the api's. A job out at an actor is that actor's until it comes back.
*/
#include "actors/api_self.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>

#include "infra/log.h"
#include "actors/connections.h"
#include "infra/actor_shell.h"
#include "infra/conn_guard.h"
#include "infra/curve.h"
#include "infra/key_watch.h"
#include "shm/segment.h"
#include "infra/endpoints.h"
#include "actors/index_reads.h"
#include "infra/metrics.h"
#include "actors/owners.h"
#include "protocol/contract.h"
#include "protocol/status.h"
#include "actors/replica_manager.h"
#include "infra/spin_poll.h"
#include "infra/wait_set.h"
#include "actors/transfer_submitter.h"
#include "messages/kvp_job.h"
#include "messages/arena.h"
#include "messages/ops.h"
#include "messages/reply.h"
#include "protocol/kvpool.pb-c.h"
#include "messages/request_check.h"
#include "shm/shm_index.h"
#include "transfer/value_checksum.h"

//  ---- routing -----------------------------------------------------------------------

static void s_start_reset (api_t *self);
static void s_node_job_done (api_t *self, kvp_job_t *job);
static void s_advance (api_t *self, kvp_job_t *job, kvp_job_kind_t done);

static zsock_t *
s_actor_socket (api_t *self, kvp_job_kind_t kind)
{
    switch (kvp_job_kind_actor (kind)) {
        case KVP_ACTOR_RM: return self->rm;
        case KVP_ACTOR_TX: return self->tx;
        case KVP_ACTOR_CL: return self->cl;
        default: assert (false); return NULL;
    }
}

//  A ranged GET sends each value's range: the item then describes the range (its size and
//  address), so the reply and the frames need nothing else. An offset past the value is
//  that key's INVALID_PARAMS.
static void
s_apply_ranges (kvp_job_t *job)
{
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK || (!item->object && !item->buffer))
            continue;
        if (item->offset > item->size) {
            item->status = KVPOOL_INVALID_PARAMS;
            kvp_job_fail (job, KVPOOL_OK, "offset %llu is past the end of a %llu-byte value",
                          (unsigned long long) item->offset, (unsigned long long) item->size);
            if (item->object)
                kvp_object_unpin (item->object);
            item->object = NULL;
            continue;
        }
        uint64_t left = item->size - item->offset;
        item->size = item->length < left ? item->length : left;
        item->replicas[0].addr = (char *) item->replicas[0].addr + item->offset;
    }
}

//  A job is done: answers its client (over the client socket, or the job socket for an
//  in-process actor), or finishes the node's own work.
//  After a GET that read from disk: copies that failed verification are forgotten and
//  unlinked (KVP_OP_DISK_LOST), and values read often enough go back to memory
//  (KVP_OP_PROMOTE, with its own copy of the bytes: the reply sends the read buffer).
static void
s_disk_follow_up (api_t *self, kvp_job_t *job)
{
    kvp_job_t *lost = NULL, *promote = NULL;
    size_t promote_bytes = 0;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->disk.lost) {
            if (!lost) {
                lost = kvp_job_new (KVP_JOB_NONE, 0);
                lost->op = KVP_OP_DISK_LOST;
            }
            kvp_job_append_key (lost, item->key, item->key_len)->disk.id = item->disk.id;
        }
        else if (item->disk.promote && item->buffer && item->status == KVPOOL_OK)
            promote_bytes += item->size;
    }
    if (promote_bytes && (promote = kvp_job_new (KVP_JOB_NONE, 0))) {
        promote->op = KVP_OP_PROMOTE;
        kvp_job_payload (promote, KVP_PAYLOAD_PROMOTE);
        promote->promote.storage = malloc (promote_bytes);
        char *next = (char *) promote->promote.storage;
        for (size_t i = 0; next && i < job->count; i++) {
            kvp_item_t *item = &job->items[i];
            if (!item->disk.promote || !item->buffer || item->status != KVPOOL_OK)
                continue;
            kvp_item_t *copy = kvp_job_append_key (promote, item->key, item->key_len);
            memcpy (next, item->replicas[0].addr, item->size);
            copy->src = next;
            copy->size = item->size;
            copy->object_id = item->object_id;
            next += item->size;
        }
        if (!next)
            kvp_job_destroy (&promote);
    }
    if (lost)
        s_advance (self, lost, KVP_JOB_NONE);
    if (promote)
        s_advance (self, promote, KVP_JOB_NONE);
}

//  After a node's GET: each value only other nodes hold (relayed here, or read by the client
//  from its holder after a REDIRECT) is a miss of the hot cache, and a read toward its
//  admission (hot_cache.h). The admitted ones get a copy (KVP_OP_CACHE_FILL): with the bytes
//  relayed here, copied now (the reply sends the read buffer); the others fetched by the
//  cluster actor itself.
static void
s_cache_follow_up (api_t *self, kvp_job_t *job)
{
    kvp_job_t *fill = NULL;
    size_t bytes = 0;
    int64_t now = zclock_mono ();
    bool *admitted = (bool *) calloc (job->count ? job->count : 1, sizeof (bool));
    if (!admitted)
        return;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        bool relayed = item->status == KVPOOL_OK && item->buffer && !item->disk.id;
        if (!relayed && item->status != KVPOOL_REDIRECT)
            continue;
        self->cache_misses++;
        if (job->opt.ranged || !item->version || item->size == 0
            || item->size > self->config->hot_cache_max_object
            || !hot_cache_read (self->hot, item->key, item->key_len, now))
            continue;
        admitted[i] = true;
        bytes += relayed ? item->size : 0;
    }
    for (size_t i = 0; i < job->count; i++) {
        if (!admitted[i])
            continue;
        if (!fill) {
            fill = kvp_job_new (KVP_JOB_NONE, 0);
            fill->op = KVP_OP_CACHE_FILL;
            fill->cluster = true;
            kvp_job_payload (fill, KVP_PAYLOAD_PROMOTE);
            fill->promote.storage = bytes ? malloc (bytes) : NULL;
            if (bytes && !fill->promote.storage) {
                kvp_job_destroy (&fill);
                free (admitted);
                return;
            }
            bytes = 0;
        }
        kvp_item_t *item = &job->items[i];
        kvp_item_t *copy = kvp_job_append_key (fill, item->key, item->key_len);
        copy->size = item->size;
        copy->version = item->version;
        if (item->status == KVPOOL_OK) {
            char *to = (char *) fill->promote.storage + bytes;
            memcpy (to, item->replicas[0].addr, item->size);
            copy->src = to;
            copy->checksums.value = item->checksums.value;
            bytes += item->size;
        }
        else
            copy->status = KVPOOL_OBJECT_NOT_FOUND; //  the cluster actor reads it (CL_FETCH)
    }
    free (admitted);
    if (fill)
        s_advance (self, fill, KVP_JOB_NONE);
}

//  Puts that placed fewer replicas than they asked for (more than the cluster has nodes, or
//  one node segments): stored all the same, said per key in the reply
//  (Reply.replicas_placed), counted, and logged at most once a second.
static void
s_under_replicated (api_t *self, const api_ctx_t *ctx, const kvp_job_t *job)
{
    const Kvpool__V1__PutOptions *put = ctx->request ? ctx->request->put : NULL;
    uint32_t asked = put && put->replica_num ? put->replica_num : 1;
    if (asked == 1 || job->status != KVPOOL_OK)
        return;
    uint32_t fewest = asked;
    size_t short_keys = 0;
    for (size_t i = 0; i < job->count; i++) {
        uint32_t placed = reply_replicas_placed (job, &job->items[i]);
        if (job->items[i].status == KVPOOL_OK && placed < asked) {
            short_keys++;
            fewest = placed < fewest ? placed : fewest;
        }
    }
    if (!short_keys)
        return;
    self->puts_under_replicated += short_keys;
    self->under_unlogged += short_keys;
    int64_t now = zclock_mono ();
    if (now - self->under_logged >= 1000) {
        kvp_warning ("%llu key(s) put with fewer replicas than asked (this one: %u of %u): "
                     "stored; %s",
                     (unsigned long long) self->under_unlogged, fewest, asked,
                     self->cluster ? "the master restores them as nodes join (--repair-rate)"
                                   : "a node places one replica a segment");
        self->under_unlogged = 0;
        self->under_logged = now;
    }
}

static void
s_finish (api_t *self, kvp_job_t *job)
{
    if (job->context
        && (job->op == KVPOOL__V1__OP__PUT || job->op == KVPOOL__V1__OP__UPSERT
            || job->op == KVPOOL__V1__OP__PUT_START))
        s_under_replicated (self, (const api_ctx_t *) job->context, job);
    api_ctx_t *ctx = (api_ctx_t *) job->context;
    if (ctx && job->kind == KVP_TX_DISK_READ)
        s_disk_follow_up (self, job);
    if (ctx && self->hot && job->cluster && job->op == KVPOOL__V1__OP__GET && !job->opt.peer)
        s_cache_follow_up (self, job);
    if (ctx && job->op == KVPOOL__V1__OP__PREFIX_MATCH && job->status == KVPOOL_OK)
        job->result_count = kvp_job_prefix_count (job);
    if (!ctx)
        s_node_job_done (self, job);
    else if (ctx->from_jobs) {
        if (ctx->row->fills & REPLY_STATS)
            api_complete_stats (self, kvp_job_stats (job));
        job->context = NULL;
        zframe_t *routing_id = ctx->routing_id;
        ctx->routing_id = NULL;
        if (api_reply_job (self, &routing_id, job) != 0) {
            zframe_destroy (&routing_id);
            kvp_job_destroy (&job);
        }
        api_ctx_destroy (&ctx);
    }
    else {
        //  (A PUT_PART's offsets say where its frames went: nothing to cut.)
        if (job->opt.ranged && job->status == KVPOOL_OK && (ctx->row->fills & REPLY_VALUES))
            s_apply_ranges (job);
        api_reply (self, &job, NULL);
    }
}

//  Sends the job to the next stage of its operation, or answers it.
static void
s_advance (api_t *self, kvp_job_t *job, kvp_job_kind_t done)
{
    const kvp_op_t *row = kvp_op_of_job (job);
    assert (row); //  jobs are made only for operations the table has
    kvp_job_kind_t next = kvp_op_next_stage (row, job, done);
    if (next == KVP_JOB_NONE) {
        bool write = (row->flags & OP_WRITE) && done != KVP_JOB_NONE;
        bool drain = (row->flags & OP_DRAIN) != 0;
        if (drain) {
            self->resets_done++;
            self->reset_running = false;
        }
        s_finish (self, job);
        if (write)
            self->writes_in_flight--;
        if (drain || write)
            s_start_reset (self);
        return;
    }
    job->kind = next;
    if (next == KVP_TX_WRITE && transfer_job_inline (job)) {
        //  Small puts are copied here: the hop would cost more than the copy.
        transfer_job_copy (job, NULL);
        s_advance (self, job, KVP_TX_WRITE);
        return;
    }
    //  The actor may run the stages after this one that are its own as well (kvp_job_t.walk).
    job->walk = true;
    zsock_t *target = s_actor_socket (self, next);
    if (done == KVP_JOB_NONE && (row->flags & OP_WRITE))
        self->writes_in_flight++;
    wait_set_touch (self->waits, target);
    //  The actor that takes it polls for its next job afterwards (the replica-manager's
    //  window): the api then sleeps after answering, so that two threads polling at once do
    //  not leave a small machine no core for the client and libzmq's I/O threads.
    self->idle_spin = false;
    if (kvp_job_send (target, job) == 0)
        self->in_flight++;
    else {
        kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "internal queue failure");
        s_advance (self, job, KVP_JOB_NONE);
    }
}

//  Runs the next reset when no write is in flight, and the held puts after the last reset.
static void
s_start_reset (api_t *self)
{
    if (self->reset_running || self->writes_in_flight)
        return;
    kvp_job_t *reset = (kvp_job_t *) zlistx_first (self->resets);
    if (reset) {
        zlistx_delete (self->resets, zlistx_cursor (self->resets));
        self->reset_running = true;
        reset->opt.force = true;
        s_advance (self, reset, KVP_JOB_NONE);
        return;
    }
    kvp_job_t *held;
    while ((held = (kvp_job_t *) zlistx_first (self->held))) {
        zlistx_delete (self->held, zlistx_cursor (self->held));
        s_advance (self, held, KVP_JOB_NONE);
    }
}

static bool
s_resetting (api_t *self)
{
    return self->reset_running || zlistx_size (self->resets) > 0;
}

//  Starts a job: a reset waits for the writes in flight, a write waits for the resets.
void
api_start (api_t *self, kvp_job_t *job)
{
    const kvp_op_t *row = kvp_op_of_job (job);
    if (row->flags & OP_DRAIN) {
        zlistx_add_end (self->resets, job);
        s_start_reset (self);
    }
    else if ((row->flags & OP_WRITE) && s_resetting (self))
        zlistx_add_end (self->held, job);
    else
        s_advance (self, job, KVP_JOB_NONE);
}

//  ---- the node's own jobs -----------------------------------------------------------

//  Lists the segments for the index reads' mappings: at start and after any change.
void
api_map_segments (api_t *self)
{
    self->map_due = false;
    kvp_job_t *job = kvp_job_new (KVP_JOB_NONE, 0);
    job->op = KVP_OP_MAP_SEGMENTS;
    s_advance (self, job, KVP_JOB_NONE);
}

//  A same-machine client process died and none of its requests is out: its pins and
//  reservations end (replica-manager), and the allocator names the segments it mounted.
void
api_owner_gone (void *arg, const owner_t *owner)
{
    api_t *self = (api_t *) arg;
    kvp_debug ("client process %d (%s) is gone", (int) owner->pid, owner->name);
    kvp_job_t *job = kvp_job_new (KVP_JOB_NONE, 0);
    job->op = KVP_OP_OWNER_GONE;
    job->owner_id = owner->id;
    job->key_storage = strdup (owner->name); //  the record goes before the job is done
    kvp_job_payload (job, KVP_PAYLOAD_SEGMENT);
    job->segment.owner = job->key_storage;
    s_advance (self, job, KVP_JOB_NONE);
}

static void
s_node_job_done (api_t *self, kvp_job_t *job)
{
    if (job->op == KVP_OP_MAP_SEGMENTS && self->reads && job->status == KVPOOL_OK)
        index_reads_segments (self->reads, job->segments.list, job->segments.count);
    else if (job->op == KVP_OP_OWNER_GONE)
        //  Each of its segments goes: objects removed, unmounted, its name unlinked.
        for (size_t i = 0; i < job->segments.count; i++) {
            kvp_info ("kvpoold: owner of segment %u (%s) is gone: unmounting it",
                      job->segments.list[i].id, job->segments.list[i].name);
            kvp_job_t *unmount = kvp_job_new (KVP_JOB_NONE, 0);
            unmount->op = KVP_OP_ORPHAN_UNMOUNT;
            kvp_job_payload (unmount, KVP_PAYLOAD_SEGMENT);
            unmount->segment.id = job->segments.list[i].id;
            unmount->segment.orphan = true;
            s_advance (self, unmount, KVP_JOB_NONE);
        }
    else if (job->op == KVP_OP_ORPHAN_UNMOUNT)
        self->map_due = true;
    kvp_job_destroy (&job);
}

//  A job came back from an actor.
void
api_actor_reply (api_t *self, zsock_t *actor)
{
    kvp_job_t *job = kvp_job_recv (actor);
    if (!job)
        return;
    self->in_flight--;
    //  An actor has just worked, and polls for its next job: the api sleeps after answering.
    self->idle_spin = false;
    //  A segment came or went: the index reads' mappings follow.
    if (job->kind == KVP_AL_MOUNT || job->kind == KVP_AL_UNMOUNT)
        self->map_due = true;
    s_advance (self, job, job->kind);
}
