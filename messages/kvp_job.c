/*  kvp_job.c - the inproc job message: construction, failure reasons, pointer transport.

    A job travels as one 8-byte frame holding its address (zsock picture "p"); there is no
    serialisation because sender and receiver share the address space, and ownership moves
    with the message (see kvp_job.h).
*/
#include "messages/kvp_job.h"

#include <stdarg.h>
#include <stdatomic.h>

//  Ownership of a job moves through libzmq, which ThreadSanitizer does not instrument, so it
//  would take every hand-off for a data race. The sender releases the job and the receiver
//  acquires it, which tells ThreadSanitizer what the message already guarantees.
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define s_handoff_release(job) __tsan_release (job)
#define s_handoff_acquire(job) __tsan_acquire (job)
#else
#define s_handoff_release(job) ((void) (job))
#define s_handoff_acquire(job) ((void) (job))
#endif

//  Zeroed memory without calloc: jemalloc zeroes a recycled large block with
//  madvise(MADV_DONTNEED), so every calloc of a big job array paid a TLB shootdown and a page
//  fault per page (measured: ~19 faults and most of the time of a 1000-key EXIST). memset on
//  pages that stay resident is far cheaper. The call goes through a volatile pointer because
//  GCC otherwise fuses malloc + memset back into calloc.
static void *(*volatile s_memset) (void *, int, size_t) = memset;

static void *
s_zeroed (size_t size)
{
    void *block = malloc (size);
    assert (block);
    s_memset (block, 0, size);
    return block;
}

//  Which actor owns what each kind works on: objects and space (the replica-manager, whose
//  thread runs the allocator), bytes in flight, policy, or the cluster.
static const kvp_actor_t s_kind_actor[KVP_JOB_KIND_COUNT] = {
    [KVP_RM_RESERVE] = KVP_ACTOR_RM,       [KVP_RM_BIND] = KVP_ACTOR_RM,
    [KVP_RM_COMMIT] = KVP_ACTOR_RM,        [KVP_RM_INSERT] = KVP_ACTOR_RM,
    [KVP_RM_PART] = KVP_ACTOR_RM,          [KVP_RM_PREFIX] = KVP_ACTOR_RM,
    [KVP_RM_UPSERT] = KVP_ACTOR_RM,        [KVP_RM_REVOKE] = KVP_ACTOR_RM,
    [KVP_RM_GET] = KVP_ACTOR_RM,           [KVP_RM_EXIST] = KVP_ACTOR_RM,
    [KVP_RM_GET_SIZE] = KVP_ACTOR_RM,      [KVP_RM_REPLICA_LIST] = KVP_ACTOR_RM,
    [KVP_RM_RELEASE] = KVP_ACTOR_RM,       [KVP_RM_TOUCH] = KVP_ACTOR_RM,
    [KVP_RM_REMOVE] = KVP_ACTOR_RM,        [KVP_RM_REMOVE_REGEX] = KVP_ACTOR_RM,
    [KVP_RM_REMOVE_ALL] = KVP_ACTOR_RM,    [KVP_RM_REMOVE_SEGMENT] = KVP_ACTOR_RM,
    [KVP_RM_OWNER_GONE] = KVP_ACTOR_RM,    [KVP_RM_STATS] = KVP_ACTOR_RM,
    [KVP_AL_ALLOC] = KVP_ACTOR_RM,         [KVP_AL_FREE] = KVP_ACTOR_RM,
    [KVP_AL_STATS] = KVP_ACTOR_RM,         [KVP_AL_SEGMENTS] = KVP_ACTOR_RM,
    [KVP_AL_MOUNT] = KVP_ACTOR_RM,         [KVP_AL_UNMOUNT_CHECK] = KVP_ACTOR_RM,
    [KVP_AL_UNMOUNT] = KVP_ACTOR_RM,       [KVP_AL_OWNER_SEGMENTS] = KVP_ACTOR_RM,
    [KVP_RM_DISK_REGISTER] = KVP_ACTOR_RM, [KVP_RM_ADOPT] = KVP_ACTOR_RM,
    [KVP_RM_DISK_LOST] = KVP_ACTOR_RM,     [KVP_RM_PROMOTE] = KVP_ACTOR_RM,
    [KVP_AL_RETRY] = KVP_ACTOR_RM,         [KVP_TX_WRITE] = KVP_ACTOR_TX,
    [KVP_TX_DISK_WRITE] = KVP_ACTOR_TX,    [KVP_TX_DISK_READ] = KVP_ACTOR_TX,
    [KVP_TX_DISK_DROP] = KVP_ACTOR_TX,     [KVP_TX_DISK_SCAN] = KVP_ACTOR_TX,
    [KVP_RM_INVENTORY] = KVP_ACTOR_RM,     [KVP_TX_RDMA_CONNECT] = KVP_ACTOR_TX,
    [KVP_TX_RDMA_PUSH] = KVP_ACTOR_TX,     [KVP_TX_RDMA_PULL] = KVP_ACTOR_TX,
    [KVP_CL_PLACE] = KVP_ACTOR_CL,         [KVP_CL_COMMIT] = KVP_ACTOR_CL,
    [KVP_CL_ABORT] = KVP_ACTOR_CL,         [KVP_CL_FETCH] = KVP_ACTOR_CL,
    [KVP_CL_EXIST] = KVP_ACTOR_CL,         [KVP_CL_REMOVE] = KVP_ACTOR_CL,
    [KVP_CL_LOCATE] = KVP_ACTOR_CL,        [KVP_CL_NODES] = KVP_ACTOR_CL,
    [KVP_CL_DROPPED] = KVP_ACTOR_CL,       [KVP_CL_STATS] = KVP_ACTOR_CL,
    [KVP_RM_CONFIG] = KVP_ACTOR_RM,        [KVP_RM_CACHE_INSERT] = KVP_ACTOR_RM,
    [KVP_RM_CACHE_PUBLISH] = KVP_ACTOR_RM, [KVP_RM_CACHE_DROP] = KVP_ACTOR_RM,
    [KVP_CL_CACHE_CLAIM] = KVP_ACTOR_CL,   [KVP_CL_DRAIN] = KVP_ACTOR_CL,
    [KVP_RM_CONFIRM] = KVP_ACTOR_RM,
};

kvp_actor_t
kvp_job_kind_actor (kvp_job_kind_t kind)
{
    assert (kind > KVP_JOB_NONE && kind < KVP_JOB_KIND_COUNT);
    assert (s_kind_actor[kind] != KVP_ACTOR_NONE);
    return s_kind_actor[kind];
}

bool
kvp_job_kind_is_allocators (kvp_job_kind_t kind)
{
    switch (kind) {
        case KVP_AL_ALLOC:
        case KVP_AL_RETRY:
        case KVP_AL_FREE:
        case KVP_AL_STATS:
        case KVP_AL_SEGMENTS:
        case KVP_AL_MOUNT:
        case KVP_AL_UNMOUNT_CHECK:
        case KVP_AL_UNMOUNT:
        case KVP_AL_OWNER_SEGMENTS: return true;
        default: return false;
    }
}

kvp_job_t *
kvp_job_new (kvp_job_kind_t kind, size_t count)
{
    kvp_job_t *self = (kvp_job_t *) zmalloc (sizeof (kvp_job_t));
    self->kind = kind;
    self->count = count;
    self->capacity = count;
    if (count)
        self->items = (kvp_item_t *) s_zeroed (count * sizeof (kvp_item_t));
    return self;
}

kvp_job_t *
kvp_job_new_owning (kvp_job_kind_t kind, size_t count, const char *const *keys,
                    const size_t *key_lens)
{
    kvp_job_t *self = kvp_job_new (kind, count);
    size_t bytes = 0;
    for (size_t i = 0; i < count; i++)
        bytes += key_lens[i] + 1;
    self->key_storage = (char *) malloc (bytes ? bytes : 1);
    assert (self->key_storage);
    char *next = self->key_storage;
    for (size_t i = 0; i < count; i++) {
        memcpy (next, keys[i], key_lens[i]);
        next[key_lens[i]] = 0;
        self->items[i].key = next;
        self->items[i].key_len = key_lens[i];
        next += key_lens[i] + 1;
    }
    return self;
}

static void
s_point_replicas (kvp_job_t *self)
{
    for (size_t i = 0; i < self->capacity; i++)
        self->items[i].replicas = self->replica_slots + i * KVP_MAX_REPLICAS;
}

void
kvp_job_need_replicas (kvp_job_t *self)
{
    if (self->replica_slots || self->capacity == 0)
        return;
    self->replica_slots =
        (kvp_replica_t *) s_zeroed (self->capacity * KVP_MAX_REPLICAS * sizeof (kvp_replica_t));
    s_point_replicas (self);
}

kvp_item_t *
kvp_job_append (kvp_job_t *self)
{
    if (self->count == self->capacity) {
        size_t capacity = self->capacity ? self->capacity * 2 : 8;
        self->items = (kvp_item_t *) realloc (self->items, capacity * sizeof (kvp_item_t));
        self->replica_slots = (kvp_replica_t *) realloc (
            self->replica_slots, capacity * KVP_MAX_REPLICAS * sizeof (kvp_replica_t));
        assert (self->items && self->replica_slots);
        self->capacity = capacity;
        s_point_replicas (self);
    }
    if (!self->replica_slots)
        kvp_job_need_replicas (self);
    kvp_item_t *item = &self->items[self->count++];
    kvp_replica_t *replicas = item->replicas;
    memset (item, 0, sizeof *item);
    memset (replicas, 0, KVP_MAX_REPLICAS * sizeof (kvp_replica_t));
    item->replicas = replicas;
    return item;
}

//  Keys appended by kvp_job_append_key live in chunks that never move (items point into them).
typedef struct _key_chunk_t {
    struct _key_chunk_t *next;
    size_t used, size;
    char data[];
} key_chunk_t;

#define KEY_CHUNK_BYTES (64 * 1024)

kvp_item_t *
kvp_job_append_key (kvp_job_t *self, const char *key, size_t key_len)
{
    key_chunk_t *chunk = (key_chunk_t *) self->key_chunks;
    if (!chunk || chunk->size - chunk->used < key_len + 1) {
        size_t size = key_len + 1 > KEY_CHUNK_BYTES ? key_len + 1 : KEY_CHUNK_BYTES;
        key_chunk_t *fresh = (key_chunk_t *) malloc (sizeof (key_chunk_t) + size);
        assert (fresh);
        fresh->next = chunk;
        fresh->used = 0;
        fresh->size = size;
        self->key_chunks = chunk = fresh;
    }
    char *copy = chunk->data + chunk->used;
    memcpy (copy, key, key_len);
    copy[key_len] = 0;
    chunk->used += key_len + 1;
    kvp_item_t *item = kvp_job_append (self);
    item->key = copy;
    item->key_len = key_len;
    return item;
}

void
kvp_job_destroy (kvp_job_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvp_job_t *self = *self_p;
    for (size_t i = 0; i < self->count; i++)
        if (self->items[i].buffer)
            self->items[i].buffer_free (self->items[i].buffer);
    if (self->payload == KVP_PAYLOAD_PROMOTE)
        free (self->promote.storage);
    else if (self->payload == KVP_PAYLOAD_RDMA_CONNECT)
        free (self->rdma_connect.data);
    if (self->plan && self->plan_free)
        self->plan_free (self->plan);
    free (self->nodes.list);
    free (self->stats);
    free (self->evict);
    for (key_chunk_t *chunk = (key_chunk_t *) self->key_chunks; chunk;) {
        key_chunk_t *next = chunk->next;
        free (chunk);
        chunk = next;
    }
    free (self->items);
    free (self->replica_slots);
    free (self->segments.list);
    free (self->key_storage);
    free (self);
    *self_p = NULL;
}

bool
kvp_job_payload (kvp_job_t *self, kvp_payload_t kind)
{
    if (self->payload == kind)
        return true;
    if (self->payload != KVP_PAYLOAD_NONE)
        return false;
    //  (the union is still as kvp_job_new made it: zeroed; a payload is never replaced)
    self->payload = kind;
    return true;
}

kvp_stats_t *
kvp_job_stats (kvp_job_t *self)
{
    if (!self->stats)
        self->stats = (kvp_stats_t *) zmalloc (sizeof (kvp_stats_t));
    return self->stats;
}

kvp_evict_t *
kvp_job_evict (kvp_job_t *self)
{
    if (!self->evict)
        self->evict = (kvp_evict_t *) zmalloc (sizeof (kvp_evict_t));
    return self->evict;
}

uint32_t
kvp_job_ranks (const kvp_job_t *self)
{
    return self->payload == KVP_PAYLOAD_PREFIX && self->prefix.ranks ? self->prefix.ranks : 1;
}

uint64_t
kvp_job_prefix_count (const kvp_job_t *self)
{
    size_t ranks = kvp_job_ranks (self);
    uint64_t blocks = 0;
    for (size_t at = 0; at + ranks <= self->count; at += ranks, blocks++)
        for (size_t r = 0; r < ranks; r++)
            if (self->items[at + r].status != KVPOOL_OK)
                return blocks;
    return blocks;
}

int
kvp_job_fail (kvp_job_t *self, int status, const char *format, ...)
{
    self->status = status;
    va_list args;
    va_start (args, format);
    vsnprintf (self->error, sizeof self->error, format, args);
    va_end (args);
    return status;
}

//  Messages sent, by kind (kvp_job_sends): relaxed counters, one add a send.
static atomic_uint_fast64_t s_sends[KVP_JOB_KIND_COUNT + 1];

static void
s_count_send (const kvp_job_t *job)
{
    size_t kind = (size_t) job->kind;
    if (kind > KVP_JOB_KIND_COUNT)
        kind = KVP_JOB_KIND_COUNT;
    atomic_fetch_add_explicit (&s_sends[kind], 1, memory_order_relaxed);
}

uint64_t
kvp_job_sends (kvp_job_kind_t kind)
{
    if ((size_t) kind < KVP_JOB_KIND_COUNT)
        return atomic_load_explicit (&s_sends[kind], memory_order_relaxed);
    uint64_t all = 0;
    for (size_t i = 0; i <= KVP_JOB_KIND_COUNT; i++)
        all += atomic_load_explicit (&s_sends[i], memory_order_relaxed);
    return all;
}

int
kvp_job_send (zsock_t *dealer, kvp_job_t *job)
{
    s_count_send (job);
    s_handoff_release (job);
    return zsock_send (dealer, "p", (void *) job);
}

int
kvp_job_reply (zsock_t *router, zframe_t **routing_id_p, kvp_job_t *job)
{
    if (zframe_send (routing_id_p, router, ZFRAME_MORE) == -1)
        return -1;
    s_count_send (job);
    s_handoff_release (job);
    return zsock_send (router, "p", (void *) job);
}

kvp_job_t *
kvp_job_recv (zsock_t *dealer)
{
    void *job = NULL;
    if (zsock_recv (dealer, "p", &job) == -1)
        return NULL;
    if (job)
        s_handoff_acquire (job);
    return (kvp_job_t *) job;
}

kvp_job_t *
kvp_job_recv_routed (zsock_t *router, zframe_t **routing_id_p)
{
    *routing_id_p = NULL;
    zmsg_t *msg = zmsg_recv (router);
    if (!msg)
        return NULL;
    kvp_job_t *job = NULL;
    if (zmsg_size (msg) == 2) {
        zframe_t *id = zmsg_pop (msg);
        zframe_t *ptr = zmsg_first (msg);
        if (zframe_size (ptr) == sizeof (void *)) {
            memcpy (&job, zframe_data (ptr), sizeof (void *));
            *routing_id_p = id;
            if (job)
                s_handoff_acquire (job);
        }
        else
            zframe_destroy (&id);
    }
    zmsg_destroy (&msg);
    return job;
}

void
kvp_job_test (bool verbose)
{
    if (verbose)
        printf (" * kvp_job: ");
    //  Leading whole blocks: 6 items, 2 a block; item 3 missing ends it after block 0.
    kvp_job_t *prefix = kvp_job_new (KVP_RM_PREFIX, 6);
    assert (kvp_job_ranks (prefix) == 1); //  (no payload: 1)
    assert (kvp_job_payload (prefix, KVP_PAYLOAD_PREFIX) && prefix->prefix.ranks == 0);
    assert (kvp_job_payload (prefix, KVP_PAYLOAD_PREFIX));   //  (the one it has)
    assert (!kvp_job_payload (prefix, KVP_PAYLOAD_SEGMENT)); //  not another
    prefix->prefix.ranks = 2;
    prefix->items[3].status = KVPOOL_OBJECT_NOT_FOUND;
    assert (kvp_job_prefix_count (prefix) == 1);
    prefix->items[3].status = KVPOOL_OK;
    assert (kvp_job_prefix_count (prefix) == 3);
    prefix->prefix.ranks = 4; //  a partial block at the end does not count
    assert (kvp_job_prefix_count (prefix) == 1);
    prefix->prefix.ranks = 0; //  (0 means 1)
    prefix->items[0].status = KVPOOL_INVALID_KEY;
    assert (kvp_job_prefix_count (prefix) == 0);
    kvp_job_destroy (&prefix);
    kvp_job_t *job = kvp_job_new (KVP_RM_GET, 3);
    assert (job->count == 3 && job->items[2].status == 0);
    assert (kvp_job_fail (job, KVPOOL_INVALID_KEY, "key %d", 7) == KVPOOL_INVALID_KEY);
    assert (streq (job->error, "key 7"));
    assert (job->items[0].replicas == NULL);
    kvp_job_need_replicas (job);
    job->items[2].replicas[KVP_MAX_REPLICAS - 1].offset = 9;
    for (int i = 0; i < 20; i++)
        kvp_job_append (job)->size = (uint64_t) i;
    assert (job->count == 23 && job->items[22].size == 19 && job->items[22].replicas);
    //  Appended keys are the job's own copies, and stay put as more are appended.
    char long_key[3000];
    memset (long_key, 'k', sizeof long_key);
    kvp_item_t *keyed = kvp_job_append_key (job, "first", 5);
    const char *first_copy = keyed->key;
    for (int i = 0; i < 100; i++)
        kvp_job_append_key (job, long_key, sizeof long_key);
    assert (streq (first_copy, "first") && streq (job->items[23].key, "first"));
    assert (job->items[123].key_len == sizeof long_key && job->items[123].key[2999] == 'k');
    job->count = 23;
    assert (job->items[2].replicas[KVP_MAX_REPLICAS - 1].offset == 9);
    job->count = 3;

    //  A job pointer makes a round trip DEALER -> ROUTER -> DEALER unchanged.
    zsock_t *router = zsock_new_router ("inproc://kvp-job-test");
    zsock_t *dealer = zsock_new_dealer ("inproc://kvp-job-test");
    assert (router && dealer);
    assert (kvp_job_send (dealer, job) == 0);
    zframe_t *id = NULL;
    kvp_job_t *got = kvp_job_recv_routed (router, &id);
    assert (got == job && id);
    assert (kvp_job_reply (router, &id, got) == 0);
    assert (id == NULL);
    assert (kvp_job_recv (dealer) == job);

    //  A malformed message on the ROUTER is dropped, not trusted.
    zstr_sendm (dealer, "a");
    zstr_send (dealer, "b");
    assert (kvp_job_recv_routed (router, &id) == NULL && id == NULL);

    zsock_destroy (&dealer);
    zsock_destroy (&router);
    kvp_job_destroy (&job);
    kvp_job_destroy (&job);
    assert (job == NULL);

    //  A job that owns its keys keeps them after the caller's are gone.
    char first[] = "alpha", second[] = "b";
    const char *keys[] = {first, second};
    size_t lens[] = {5, 1};
    job = kvp_job_new_owning (KVP_RM_TOUCH, 2, keys, lens);
    memset (first, 'x', 5);
    assert (streq (job->items[0].key, "alpha") && job->items[0].key_len == 5);
    assert (streq (job->items[1].key, "b") && job->items[1].key_len == 1);
    kvp_job_destroy (&job);
    //  A job carries the big, rare payloads only once asked for (STATS, an eviction).
    job = kvp_job_new (KVP_RM_STATS, 0);
    assert (!job->stats && !job->evict);
    kvp_job_stats (job)->objects = 3;
    assert (job->stats && kvp_job_stats (job)->objects == 3 && !job->evict);
    kvp_job_evict (job)->want = 1;
    assert (job->evict->want == 1);
    kvp_job_destroy (&job);
    //  ... and a payload it owns goes with it.
    job = kvp_job_new (KVP_TX_RDMA_CONNECT, 0);
    assert (kvp_job_payload (job, KVP_PAYLOAD_RDMA_CONNECT));
    job->rdma_connect.data = (uint8_t *) malloc (16);
    job->rdma_connect.size = 16;
    kvp_job_destroy (&job);
    if (verbose)
        printf ("(sizeof kvp_job_t %zu, kvp_item_t %zu) OK\n", sizeof (kvp_job_t),
                sizeof (kvp_item_t));
}
