/*  shm_index.c - the same-machine read index (see shm_index.h).

    DESIGN
    Open addressing with linear probing over a power-of-two table; a key may sit in one of
    PROBE_MAX slots after its home slot. There are no tombstones: removal empties the slot,
    which can hide an entry further along its run. That entry is still in the node's own
    table, so readers that miss ask the node: the index only ever loses speed, never
    correctness.

    Each slot is a seqlock. The writer makes seq odd, changes the slot, makes it even again
    (release). A reader takes seq (acquire), reads the slot, copies the value, then reads seq
    again after an acquire fence; equal and even means no writer touched the slot while the
    reader used it. Because the node withdraws an object here before its space can be freed
    and reused, a copy that overlapped a reuse always sees seq move.

    The creator keeps the object's descriptor open with flock(LOCK_SH) on it (segment_hold),
    so another daemon's start-up cleaner, in any pid namespace, knows it is alive.

    Threads: one writer thread; readers anywhere (other processes map the index read-only).
*/
#include "shm/shm_index.h"

#include "shm/racy.h"

#include "shm/segment.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC 0x3158444950564B00ULL //  "\0KVPIDX1"
#define HEADER_SIZE 4096
#define SLOT_SIZE 256
#define PROBE_MAX 8

typedef struct {
    uint64_t magic;
    uint64_t slot_count;
    uint64_t slot_size;
} header_t;

typedef struct {
    _Atomic uint64_t seq;
    _Atomic uint64_t hash; //  0: empty
    uint32_t segment_id;
    uint32_t key_len;
    uint64_t offset;
    uint64_t size;
    char key[SHM_INDEX_KEY_MAX];
} slot_t;

_Static_assert(sizeof (slot_t) == SLOT_SIZE, "slot layout");

struct _shm_index_t {
    char name[64];
    bool owner;
    int lock_fd; //  the creator's descriptor, holding flock(LOCK_SH) (see segment_hold)
    void *base;
    size_t length;
    slot_t *slots;
    uint64_t mask;
    size_t count;
};

uint64_t
shm_index_hash (const char *key, size_t len)
{
    const unsigned char *bytes = (const unsigned char *) key;
    uint64_t hash = 0x243F6A8885A308D3ULL ^ (len * 0x9E3779B97F4A7C15ULL);
    while (len >= 8) {
        uint64_t word;
        memcpy (&word, bytes, 8);
        hash = (hash ^ word) * 0xFF51AFD7ED558CCDULL;
        hash ^= hash >> 32;
        bytes += 8;
        len -= 8;
    }
    uint64_t tail = 0;
    memcpy (&tail, bytes, len);
    hash = (hash ^ tail) * 0xC4CEB9FE1A85EC53ULL;
    hash ^= hash >> 29;
    return hash ? hash : 1;
}

void
shm_index_make_name (char *buf, size_t size, const char *instance)
{
    snprintf (buf, size, "/kvpool-%d-%s-%s-index", (int) getpid (), segment_process_tag (),
              instance);
}

shm_index_t *
shm_index_create (const char *name, size_t slots)
{
    size_t count = 64;
    while (count < slots && count < (1ULL << 30))
        count <<= 1;
    size_t length = HEADER_SIZE + count * SLOT_SIZE;
    //  Held for the index's life, so a cleaner in another pid namespace leaves it alone.
    int fd = segment_create_held (name);
    if (fd == -1)
        return NULL;
    if (ftruncate (fd, (off_t) length) == -1) {
        close (fd);
        shm_unlink (name);
        return NULL;
    }
    void *base = mmap (NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        close (fd);
        shm_unlink (name);
        return NULL;
    }
    shm_index_t *self = (shm_index_t *) calloc (1, sizeof (shm_index_t));
    assert (self);
    snprintf (self->name, sizeof self->name, "%s", name);
    self->owner = true;
    self->lock_fd = fd;
    self->base = base;
    self->length = length;
    self->slots = (slot_t *) ((char *) base + HEADER_SIZE);
    self->mask = count - 1;
    header_t *header = (header_t *) base;
    header->slot_count = count;
    header->slot_size = SLOT_SIZE;
    atomic_thread_fence (memory_order_release);
    header->magic = MAGIC;
    return self;
}

shm_index_t *
shm_index_open (const char *name)
{
    int fd = shm_open (name, O_RDONLY, 0);
    if (fd == -1)
        return NULL;
    struct stat st;
    if (fstat (fd, &st) == -1 || (size_t) st.st_size < HEADER_SIZE) {
        close (fd);
        return NULL;
    }
    size_t length = (size_t) st.st_size;
    void *base = mmap (NULL, length, PROT_READ, MAP_SHARED, fd, 0);
    close (fd);
    if (base == MAP_FAILED)
        return NULL;
    header_t *header = (header_t *) base;
    uint64_t count = header->slot_count;
    if (header->magic != MAGIC || header->slot_size != SLOT_SIZE || count == 0
        || (count & (count - 1)) || HEADER_SIZE + count * SLOT_SIZE > length) {
        munmap (base, length);
        errno = EINVAL;
        return NULL;
    }
    shm_index_t *self = (shm_index_t *) calloc (1, sizeof (shm_index_t));
    assert (self);
    snprintf (self->name, sizeof self->name, "%s", name);
    self->lock_fd = -1;
    self->base = base;
    self->length = length;
    self->slots = (slot_t *) ((char *) base + HEADER_SIZE);
    self->mask = count - 1;
    return self;
}

void
shm_index_destroy (shm_index_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    shm_index_t *self = *self_p;
    munmap (self->base, self->length);
    if (self->owner)
        shm_unlink (self->name);
    if (self->lock_fd >= 0)
        close (self->lock_fd);
    free (self);
    *self_p = NULL;
}

const char *
shm_index_name (shm_index_t *self)
{
    return self->name;
}

size_t
shm_index_slots (shm_index_t *self)
{
    return (size_t) self->mask + 1;
}

size_t
shm_index_count (shm_index_t *self)
{
    return self->count;
}

int64_t
shm_index_insert (shm_index_t *self, const char *key, size_t key_len, uint32_t segment_id,
                  uint64_t offset, uint64_t size)
{
    assert (self->owner);
    if (key_len == 0 || key_len > SHM_INDEX_KEY_MAX)
        return -1;
    uint64_t hash = shm_index_hash (key, key_len);
    for (uint64_t probe = 0; probe < PROBE_MAX; probe++) {
        uint64_t index = (hash + probe) & self->mask;
        slot_t *slot = &self->slots[index];
        if (atomic_load_explicit (&slot->hash, memory_order_relaxed) != 0)
            continue;
        uint64_t seq = atomic_load_explicit (&slot->seq, memory_order_relaxed);
        atomic_store_explicit (&slot->seq, seq + 1, memory_order_relaxed);
        atomic_thread_fence (memory_order_release);
        slot->segment_id = segment_id;
        slot->key_len = (uint32_t) key_len;
        slot->offset = offset;
        slot->size = size;
        memcpy (slot->key, key, key_len);
        atomic_store_explicit (&slot->hash, hash, memory_order_relaxed);
        atomic_store_explicit (&slot->seq, seq + 2, memory_order_release);
        self->count++;
        return (int64_t) index;
    }
    return -1;
}

void
shm_index_remove (shm_index_t *self, int64_t index)
{
    assert (self->owner);
    if (index < 0 || (uint64_t) index > self->mask)
        return;
    slot_t *slot = &self->slots[index];
    if (atomic_load_explicit (&slot->hash, memory_order_relaxed) == 0)
        return;
    uint64_t seq = atomic_load_explicit (&slot->seq, memory_order_relaxed);
    atomic_store_explicit (&slot->seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence (memory_order_release);
    atomic_store_explicit (&slot->hash, 0, memory_order_relaxed);
    //  seq_cst: the withdrawal is visible before anything the node does afterwards (such as
    //  freeing the object's space) can be.
    atomic_store_explicit (&slot->seq, seq + 2, memory_order_seq_cst);
    self->count--;
}

//  The slot's fields are read while the writer may change them (racy.h); the sequence
//  number decides.
static bool
s_lookup (shm_index_t *self, const char *key, size_t key_len, shm_index_hit_t *hit)
{
    if (key_len == 0 || key_len > SHM_INDEX_KEY_MAX)
        return false;
    uint64_t hash = shm_index_hash (key, key_len);
    for (uint64_t probe = 0; probe < PROBE_MAX; probe++) {
        slot_t *slot = &self->slots[(hash + probe) & self->mask];
        uint64_t seq = atomic_load_explicit (&slot->seq, memory_order_acquire);
        if (seq & 1)
            return false; //  being written: ask the node
        uint64_t slot_hash = atomic_load_explicit (&slot->hash, memory_order_relaxed);
        //  An empty slot ends the run: inserts take the first empty slot, so the key is not
        //  further on (unless a removal emptied this one after it went in: hidden, as the
        //  design allows). A miss then costs a probe or two, not PROBE_MAX.
        if (slot_hash == 0)
            return false;
        if (slot_hash != hash)
            continue;
        uint32_t len = slot->key_len;
        if (len != key_len || memcmp (slot->key, key, key_len) != 0)
            continue;
        hit->segment_id = slot->segment_id;
        hit->offset = slot->offset;
        hit->size = slot->size;
        hit->slot = slot;
        hit->seq = seq;
        hit->hash = hash;
        //  The key matched and nothing moved while we read it.
        RACY_READ_FENCE ();
        return atomic_load_explicit (&slot->seq, memory_order_relaxed) == seq;
    }
    return false;
}

bool
shm_index_lookup (shm_index_t *self, const char *key, size_t key_len, shm_index_hit_t *hit)
{
    RACY_BEGIN ();
    bool found = s_lookup (self, key, key_len, hit);
    RACY_END ();
    return found;
}

bool
shm_index_still_valid (const shm_index_hit_t *hit)
{
    slot_t *slot = (slot_t *) hit->slot;
    atomic_thread_fence (memory_order_seq_cst);
    return atomic_load_explicit (&slot->seq, memory_order_relaxed) == hit->seq;
}

void
shm_index_test (bool verbose)
{
    char name[64];
    snprintf (name, sizeof name, "/kvpool-%d-indextest-index", (int) getpid ());
    shm_index_t *writer = shm_index_create (name, 100);
    assert (writer && shm_index_slots (writer) == 128);
    shm_index_t *reader = shm_index_open (name);
    assert (reader);

    //  Published entries are found; unknown keys are not.
    int64_t a = shm_index_insert (writer, "alpha", 5, 3, 4096, 100);
    int64_t b = shm_index_insert (writer, "beta", 4, 4, 0, 7);
    assert (a >= 0 && b >= 0 && a != b && shm_index_count (writer) == 2);
    shm_index_hit_t hit;
    assert (shm_index_lookup (reader, "alpha", 5, &hit));
    assert (hit.segment_id == 3 && hit.offset == 4096 && hit.size == 100);
    assert (shm_index_still_valid (&hit));
    assert (!shm_index_lookup (reader, "alph", 4, &hit));
    assert (!shm_index_lookup (reader, "gamma", 5, &hit));

    //  A removal during a read invalidates the read.
    assert (shm_index_lookup (reader, "beta", 4, &hit));
    shm_index_remove (writer, b);
    assert (!shm_index_still_valid (&hit));
    assert (!shm_index_lookup (reader, "beta", 4, &hit));
    //  ... and so does a reuse of the slot by another key.
    assert (shm_index_lookup (reader, "alpha", 5, &hit));
    shm_index_remove (writer, a);
    int64_t c = shm_index_insert (writer, "alpha", 5, 9, 8192, 100);
    assert (c >= 0);
    assert (!shm_index_still_valid (&hit));
    assert (shm_index_lookup (reader, "alpha", 5, &hit) && hit.segment_id == 9);

    //  Too-long keys and full probe runs are simply not published.
    char big[SHM_INDEX_KEY_MAX + 1];
    memset (big, 'k', sizeof big);
    assert (shm_index_insert (writer, big, sizeof big, 1, 0, 1) == -1);
    int published = 0;
    for (int i = 0; i < 1000; i++) {
        char key[32];
        int len = snprintf (key, sizeof key, "key-%d", i);
        published += shm_index_insert (writer, key, (size_t) len, 1, (uint64_t) i, 1) >= 0;
    }
    assert (published > 64 && published <= 127);
    //  Every key it published is found with its own entry.
    for (int i = 0; i < 1000; i++) {
        char key[32];
        int len = snprintf (key, sizeof key, "key-%d", i);
        if (shm_index_lookup (reader, key, (size_t) len, &hit))
            assert (hit.offset == (uint64_t) i);
    }
    //  A reader can't open what is not an index.
    shm_index_destroy (&reader);
    shm_index_destroy (&writer);
    assert (shm_index_open (name) == NULL);
    if (verbose)
        printf ("publish, lookup, invalidation, lossy overflow ");
}
