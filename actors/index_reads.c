/*  index_reads.c - small reads the api answers from the read index (see index_reads.h).

    A request is answered here whole or not at all: one key the index can't vouch for sends
    the whole job the usual way, so a reply never mixes the two paths and the replica-manager
    stays the only source of "not found".
*/
#include "actors/index_reads.h"

#include "infra/log.h"

#include <czmq.h>

#include "shm/segment.h"
#include "shm/segment_table.h"
#include "protocol/kvpool.pb-c.h"
#include "shm/racy.h"
#include "shm/shm_index.h"

//  A missing index (the replica-manager could not create it, or has not yet) is looked for
//  again this often.
#define INDEX_RETRY_MS 1000

struct _index_reads_t {
    char index_name[96];
    shm_index_t *index;
    int64_t index_retry_at;
    segment_table_t *segments;
    uint64_t gets;
    uint64_t cache_hits; //  of gets, those of hot-cache copies
};

index_reads_t *
index_reads_new (const char *index_name)
{
    index_reads_t *self = (index_reads_t *) zmalloc (sizeof (index_reads_t));
    snprintf (self->index_name, sizeof self->index_name, "%s", index_name ? index_name : "");
    self->segments = segment_table_new ();
    assert (self->segments);
    return self;
}

void
index_reads_destroy (index_reads_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    index_reads_t *self = *self_p;
    shm_index_destroy (&self->index);
    segment_table_destroy (&self->segments);
    free (self);
    *self_p = NULL;
}

static shm_index_t *
s_index (index_reads_t *self)
{
    if (!self->index && *self->index_name && zclock_mono () >= self->index_retry_at) {
        self->index = shm_index_open (self->index_name);
        if (!self->index)
            self->index_retry_at = zclock_mono () + INDEX_RETRY_MS;
    }
    return self->index;
}

void
index_reads_segments (index_reads_t *self, const kvp_segment_info_t *segments, size_t count)
{
    assert (self);
    segment_listing_t *listing = (segment_listing_t *) calloc (count ? count : 1, sizeof *listing);
    if (!listing)
        return;
    for (size_t i = 0; i < count; i++) {
        listing[i].id = segments[i].id;
        listing[i].name = segments[i].name;
        listing[i].size = segments[i].size;
        listing[i].device = segments[i].device;
        listing[i].inode = segments[i].inode;
    }
    //  Segment ids are never reused within a node: unchanged entries keep their mappings.
    segment_table_update (self->segments, listing, count, true, NULL);
    free (listing);
}

//  Copies a value out of segment memory that a writer may be reusing at the same moment:
//  the copy is checked against the index slot afterwards, and a torn one thrown away, so
//  the race is by design (racy.h; the same-machine client reads the same way).
static void
s_copy_racy (void *to, const void *from, size_t size)
{
    RACY_BEGIN ();
    memcpy (to, from, size);
    RACY_END ();
}

bool
index_reads_serve (index_reads_t *self, kvp_job_t *job, zmq_msg_t *values)
{
    assert (self && job);
    bool get = job->op == KVPOOL__V1__OP__GET;
    if (job->count == 0 || job->status != KVPOOL_OK || !s_index (self))
        return false;
    if (job->count > (get ? INDEX_READ_KEYS_MAX : INDEX_CHECK_KEYS_MAX))
        return false;
    //  The hits, and the keys as the index's batch lookup takes them.
    shm_index_hit_t small_hits[8];
    const char *small_keys[8];
    size_t small_lens[8];
    shm_index_hit_t *hits = small_hits;
    const char **keys = small_keys;
    size_t *lens = small_lens;
    if (job->count > 8) {
        hits = (shm_index_hit_t *) malloc (job->count * sizeof *hits);
        keys = (const char **) malloc (job->count * sizeof *keys);
        lens = (size_t *) malloc (job->count * sizeof *lens);
    }
    bool whole = hits && keys && lens;
    for (size_t i = 0; i < job->count && whole; i++) {
        keys[i] = job->items[i].key;
        lens[i] = job->items[i].key_len;
    }
    shm_index_batch_t batch;
    if (whole)
        shm_index_batch_start (&batch, self->index, keys, lens, job->count);
    uint64_t bytes = 0;
    size_t copied = 0;
    for (size_t i = 0; i < job->count && whole; i++) {
        kvp_item_t *item = &job->items[i];
        shm_index_hit_t *hit = &hits[i];
        //  (a read of one version goes to the replica-manager, which knows the node's lease)
        whole =
            item->status == KVPOOL_OK && !item->version && shm_index_batch_lookup (&batch, i, hit);
        if (!whole || !get)
            continue;
        bytes += hit->size;
        const void *source = NULL;
        whole = hit->size <= INDEX_READ_VALUE_MAX && bytes <= INDEX_READ_REQUEST_MAX;
        if (whole && hit->size)
            source =
                segment_table_resolve (self->segments, hit->segment_id, hit->offset, hit->size);
        whole = whole && (source || hit->size == 0)
                && zmq_msg_init_size (&values[i], (size_t) hit->size) == 0;
        if (!whole)
            continue;
        copied++;
        if (hit->size)
            s_copy_racy (zmq_msg_data (&values[i]), source, (size_t) hit->size);
    }
    //  Only copies whose slot stayed the same hold the object's bytes; confirming stamps
    //  each read, which is its lease.
    int64_t now = shm_index_clock_ms ();
    for (size_t i = 0; i < job->count && whole; i++)
        whole = shm_index_confirm (&hits[i], now);
    if (!whole) {
        for (size_t i = 0; i < copied; i++)
            zmq_msg_close (&values[i]);
    }
    else {
        for (size_t i = 0; i < job->count; i++) {
            job->items[i].size = hits[i].size;
            job->items[i].version = hits[i].version;
            kvp_trace (job->items[i].key, "trace %s: v%llu read in the index%s%s",
                       job->items[i].key, (unsigned long long) hits[i].version,
                       job->opt.peer ? " by a node" : "", hits[i].cache ? " (cache)" : "");
            if (get && !job->opt.peer)
                self->cache_hits += hits[i].cache;
        }
        if (get && !job->opt.peer)
            self->gets += job->count;
    }
    if (hits != small_hits) {
        free (hits);
        free ((void *) keys);
        free (lens);
    }
    return whole;
}

void
index_reads_refuse_existing (index_reads_t *self, kvp_job_t *job)
{
    assert (self && job);
    if (!s_index (self))
        return;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        shm_index_hit_t hit;
        if (item->status == KVPOOL_OK
            && shm_index_lookup (self->index, item->key, item->key_len, &hit))
            item->status = KVPOOL_OBJECT_ALREADY_EXISTS;
    }
}

uint64_t
index_reads_gets (index_reads_t *self)
{
    assert (self);
    return self->gets;
}

uint64_t
index_reads_cache_hits (index_reads_t *self)
{
    assert (self);
    return self->cache_hits;
}

//  --------------------------------------------------------------------------
//  Self test

#include <pthread.h>

//  A writer that keeps rewriting one object in place, as a removal and a new put into the
//  freed space do: withdraw the slot, fill the bytes with the next generation, publish it.
typedef struct {
    shm_index_t *index;
    unsigned char *bytes;
    atomic_bool stop;
    atomic_uint_fast64_t reads; //  the reader's attempts so far
    uint64_t rounds;
} s_rewriter_t;

static void *
s_rewriter (void *arg)
{
    s_rewriter_t *self = (s_rewriter_t *) arg;
    int64_t slot = shm_index_insert (self->index, "hot", 3, 7, 0, INDEX_READ_VALUE_MAX, 1, false);
    for (unsigned char generation = 1; !atomic_load (&self->stop); generation++) {
        shm_index_remove (self->index, slot);
        RACY_BEGIN ();
        memset (self->bytes, generation, INDEX_READ_VALUE_MAX);
        RACY_END ();
        slot = shm_index_insert (self->index, "hot", 3, 7, 0, INDEX_READ_VALUE_MAX, 1, false);
        self->rounds++;
        //  Published until the reader has tried twice (or 1 ms has passed), so reads find it
        //  often however slow the build is; a read still in its copy meets the next rewrite.
        uint64_t seen = atomic_load (&self->reads);
        int64_t until = zclock_usecs () + 1000;
        while (atomic_load (&self->reads) < seen + 2 && zclock_usecs () < until
               && !atomic_load (&self->stop))
            ;
    }
    return NULL;
}

static kvp_job_t *
s_test_job (int op, const char **keys, size_t count)
{
    kvp_job_t *job = kvp_job_new (KVP_JOB_NONE, count);
    job->op = op;
    for (size_t i = 0; i < count; i++) {
        job->items[i].key = keys[i];
        job->items[i].key_len = strlen (keys[i]);
    }
    return job;
}

void
index_reads_test (bool verbose)
{
    if (verbose)
        printf ("\n * index_reads: ");
    char index_name[64], seg_name[64];
    snprintf (index_name, sizeof index_name, "/kvpool-%d-irtest-index", (int) getpid ());
    segment_make_name (seg_name, sizeof seg_name, "irtest", 0);
    shm_index_t *writer = shm_index_create (index_name, 64);
    segment_t *segment = segment_new (seg_name, 1 << 20, false);
    assert (writer && segment);
    char *base = (char *) segment_base (segment);
    memcpy (base + 0, "hello", 5);
    memset (base + 4096, 'L', INDEX_READ_VALUE_MAX + 1);
    int64_t a_slot = shm_index_insert (writer, "a", 1, 7, 0, 5, 1, false);
    int64_t empty_slot = shm_index_insert (writer, "empty", 5, 7, 0, 0, 1, false);
    int64_t big_slot =
        shm_index_insert (writer, "big", 3, 7, 4096, INDEX_READ_VALUE_MAX + 1, 1, false);
    shm_index_insert (writer, "elsewhere", 9, 8, 0, 5, 1, false);

    index_reads_t *self = index_reads_new (index_name);
    zmq_msg_t values[4];
    //  Segment 7 is not mapped yet: the read takes the usual route.
    const char *a[] = {"a"};
    kvp_job_t *job = s_test_job (KVPOOL__V1__OP__GET, a, 1);
    assert (!index_reads_serve (self, job, values));
    kvp_segment_info_t listing = {.id = 7, .size = 1 << 20};
    snprintf (listing.name, sizeof listing.name, "%s", seg_name);
    index_reads_segments (self, &listing, 1);

    //  Now a GET of published keys is answered here, value bytes and all, and each read
    //  is stamped: that is its lease.
    const char *two[] = {"a", "empty"};
    kvp_job_destroy (&job);
    job = s_test_job (KVPOOL__V1__OP__GET, two, 2);
    int64_t before = shm_index_clock_ms ();
    assert (index_reads_serve (self, job, values));
    int64_t read_at = shm_index_last_read (writer, a_slot);
    assert (read_at >= before && read_at <= shm_index_clock_ms ());
    assert (shm_index_last_read (writer, empty_slot) == read_at);
    assert (job->items[0].size == 5 && job->items[1].size == 0);
    assert (zmq_msg_size (&values[0]) == 5 && memcmp (zmq_msg_data (&values[0]), "hello", 5) == 0);
    assert (zmq_msg_size (&values[1]) == 0);
    zmq_msg_close (&values[0]);
    zmq_msg_close (&values[1]);
    assert (index_reads_gets (self) == 2);
    kvp_job_destroy (&job);

    //  One key the index can't serve sends the whole request the usual way: a miss (maybe
    //  just not published), a large value, a segment not mapped.
    const char *missing[] = {"a", "nope"};
    const char *large[] = {"a", "big"};
    const char *unmapped[] = {"elsewhere"};
    const char **refused[] = {missing, large, unmapped};
    size_t counts[] = {2, 2, 1};
    for (size_t r = 0; r < 3; r++) {
        job = s_test_job (KVPOOL__V1__OP__GET, refused[r], counts[r]);
        assert (!index_reads_serve (self, job, values));
        kvp_job_destroy (&job);
    }
    //  ... but the large one exists, which is all an EXIST or GET_SIZE needs (a read too).
    job = s_test_job (KVPOOL__V1__OP__GET_SIZE, large, 2);
    assert (shm_index_last_read (writer, big_slot) == 0);
    assert (index_reads_serve (self, job, NULL));
    assert (job->items[1].size == INDEX_READ_VALUE_MAX + 1);
    assert (shm_index_last_read (writer, big_slot) >= read_at);
    kvp_job_destroy (&job);
    //  A key already refused by validation is left to the usual route, which reports it.
    job = s_test_job (KVPOOL__V1__OP__EXIST, a, 1);
    job->items[0].status = KVPOOL_INVALID_KEY;
    assert (!index_reads_serve (self, job, NULL));
    kvp_job_destroy (&job);
    //  Withdrawn from the index: no longer served.
    shm_index_remove (writer, big_slot);
    job = s_test_job (KVPOOL__V1__OP__EXIST, large, 2);
    assert (!index_reads_serve (self, job, NULL));
    kvp_job_destroy (&job);

    //  A put of a published key is refused at once; the rest is left for the usual route.
    const char *put_keys[] = {"a", "new-key"};
    job = s_test_job (KVPOOL__V1__OP__PUT, put_keys, 2);
    index_reads_refuse_existing (self, job);
    assert (job->items[0].status == KVPOOL_OBJECT_ALREADY_EXISTS);
    assert (job->items[1].status == KVPOOL_OK);
    kvp_job_destroy (&job);

    //  The api's mapping outlives the node's unmount of the segment.
    segment_destroy (&segment);
    job = s_test_job (KVPOOL__V1__OP__GET, a, 1);
    assert (index_reads_serve (self, job, values));
    assert (memcmp (zmq_msg_data (&values[0]), "hello", 5) == 0);
    zmq_msg_close (&values[0]);
    kvp_job_destroy (&job);
    //  Gone from the listing: unmapped, and reads of it take the usual route.
    index_reads_segments (self, NULL, 0);
    job = s_test_job (KVPOOL__V1__OP__GET, a, 1);
    assert (!index_reads_serve (self, job, values));
    kvp_job_destroy (&job);

    //  Reads racing a writer that reuses the bytes: whatever is served is one generation
    //  whole (a copy the writer cut into is thrown away, not served).
    segment = segment_new (seg_name, 1 << 20, false);
    assert (segment);
    index_reads_segments (self, &listing, 1);
    s_rewriter_t rewriter = {writer, (unsigned char *) segment_base (segment), false, 0, 0};
    pthread_t thread;
    assert (pthread_create (&thread, NULL, s_rewriter, &rewriter) == 0);
    const char *hot[] = {"hot"};
    size_t served = 0, refused_reads = 0;
    int64_t until = zclock_mono () + 300;
    while (zclock_mono () < until) {
        job = s_test_job (KVPOOL__V1__OP__GET, hot, 1);
        atomic_fetch_add (&rewriter.reads, 1);
        if (index_reads_serve (self, job, values)) {
            const unsigned char *got = (const unsigned char *) zmq_msg_data (&values[0]);
            assert (zmq_msg_size (&values[0]) == INDEX_READ_VALUE_MAX);
            for (size_t b = 0; b < INDEX_READ_VALUE_MAX; b += 64)
                assert (got[b] == got[0]);
            zmq_msg_close (&values[0]);
            served++;
        }
        else
            refused_reads++;
        kvp_job_destroy (&job);
    }
    atomic_store (&rewriter.stop, true);
    pthread_join (thread, NULL);
    if (verbose)
        printf ("racing reads: %zu served whole, %zu refused, %llu rewrites; ", served,
                refused_reads, (unsigned long long) rewriter.rounds);
    assert (served > 0);
    segment_destroy (&segment);

    //  No index at all: nothing is served.
    index_reads_t *blind = index_reads_new ("/kvpool-irtest-no-such-index");
    job = s_test_job (KVPOOL__V1__OP__EXIST, a, 1);
    assert (!index_reads_serve (blind, job, NULL));
    kvp_job_destroy (&job);
    index_reads_destroy (&blind);

    index_reads_destroy (&self);
    index_reads_destroy (&self);
    shm_index_destroy (&writer);
    if (verbose)
        printf ("done\n");
}
