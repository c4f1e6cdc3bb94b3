/*  shm_index.c - the same-machine read index (see shm_index.h).

    DESIGN
    Open addressing with linear probing over a power-of-two table; a key sits in one of the
    PROBE_MAX slots from its home slot on (an insert takes the first empty one; with none,
    the key is not published, and readers that miss ask the node: the index only ever loses
    speed, never correctness). There are no tombstones: removal empties the slot. So a
    lookup does not stop at an empty slot but looks at all PROBE_MAX: an entry that went in
    past a slot emptied later stays found. (Stopping there would hide it for good, and a
    node that evicts and removes all day would see ever more of its keys miss.) A miss reads
    PROBE_MAX slot headers, adjacent in memory; a hit stops at its slot.

    Absence (shm_index.h, "Absent keys"). After the slots, a counting filter of the keys the
    node holds but has not published: FILTER_PER_SLOT one-byte counters a slot, each key
    counted in FILTER_HASHES of them (positions from its hash by double hashing), a counter
    at 255 stuck there for good (never counted down again: it only costs speed). One
    writer, so counts are plain loads and stores of atomic bytes. The header's absent_seq
    is a seqlock around what may move a held key out of the filter while it is not yet
    where a reader who looked earlier would have seen it; odd also while the node vouches
    for nothing (a node of a cluster, a node shutting down).

    Each slot is a seqlock. The writer makes seq odd, changes the slot, makes it even again
    (release). A reader takes seq (acquire), reads the slot, copies the value, then reads seq
    again after an acquire fence; equal and even means no writer touched the slot while the
    reader used it. Because the node withdraws an object here before its space can be freed
    and reused, a copy that overlapped a reuse always sees seq move.

    Read stamps (shm_index.h says what they are for and why no read is missed) live in an
    object of their own, beside the slots by slot number: readers map it read-write, the
    index read-only. Eight stamps share a cache line; a reader writes a stamp at most once a
    millisecond, so neighbouring hot keys cost little.

    Both objects are memfds the creator holds open (named "/proc/<pid>/fd/<fd>"), pages
    committed and sealed against shrinking and growing, so a reader that truncates one cannot
    kill the node with SIGBUS (shm/segment.c says who may open them). The index is sealed
    against writes too once the node has mapped it (F_SEAL_FUTURE_WRITE): its readers can map
    it only read-only, while the node's own mapping stays writable. The objects go with their
    last descriptor and mapping: nothing is left in /dev/shm.

    Threads: one writer thread; readers anywhere (other processes map the index read-only
    and the stamps read-write).
*/
#include "shm/shm_index.h"

#include "shm/racy.h"

#include "shm/segment.h"

//  XXH3 compiled in (libxxhash's header, every function inline): libkvpool links nothing for
//  it, and the key hash is inlined into the loops that call it.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

//  "\0KVPIDX6": version 2 has read stamps (a reader of version 1 would read without
//  stamping); version 3 hashes keys with XXH3 (a reader of version 2 would look in the wrong
//  slots); version 4 has versions and cache copies in its slots (a reader of version 3 would
//  take a version for a key); version 5 bounds the node's own copies in time as version 4
//  did its cache copies (a reader of version 4 would go on reading the index of a node
//  stopped past its lease); version 6 vouches for absent keys (a reader of version 5 would
//  not know to look at the filter of unlisted keys before it said a key was absent). A
//  reader must not find an index of another version usable.
#define MAGIC 0x3658444950564B00ULL
//  key_len's top bit: the slot's object is a cache copy (shm_index.h)
#define SLOT_CACHE 0x80000000u
#define HEADER_SIZE 4096
#define SLOT_SIZE 256
#define PROBE_MAX 8
#define NAME_MAX_LEN 64
//  The filter of unlisted keys: counters a slot, and the counters a key is counted in.
#define FILTER_PER_SLOT 4
#define FILTER_HASHES 3
#define FILTER_STUCK 255

//  A read stamp: the publication's tag above STAMP_TIME_BITS of milliseconds (2^40 ms is 34
//  years of uptime).
#define STAMP_TIME_BITS 40
#define STAMP_TIME_MASK ((1ULL << STAMP_TIME_BITS) - 1)
#define STAMP_TAG_MASK ((1ULL << (64 - STAMP_TIME_BITS)) - 1)

typedef struct {
    uint64_t magic;
    uint64_t slot_count;
    uint64_t slot_size;
    char reads_name[NAME_MAX_LEN]; //  the read stamps' object
    //  Until when (shm_index_clock_ms) cache copies may be read (shm_index_set_cache_until)
    _Atomic int64_t cache_until_ms;
    //  Until when the node's own copies may be read (shm_index_set_own_until)
    _Atomic int64_t own_until_ms;
    //  Even: the node vouches for absent keys (shm_index_set_complete) and nothing moved
    //  since a reader read it; odd: no answer of absence (a move under way, or no vouching)
    _Atomic uint64_t absent_seq;
    uint64_t filter_count; //  counters of the unlisted keys' filter, after the slots
} header_t;

typedef struct {
    _Atomic uint64_t seq;
    _Atomic uint64_t hash; //  0: empty
    uint32_t segment_id;
    uint32_t key_len;
    uint64_t offset;
    uint64_t size;
    uint64_t version;
    char key[SHM_INDEX_KEY_MAX];
} slot_t;

_Static_assert(sizeof (slot_t) == SLOT_SIZE, "slot layout");

struct _shm_index_t {
    char name[NAME_MAX_LEN];
    char reads_name[NAME_MAX_LEN];
    char created_as[NAME_MAX_LEN]; //  the creator's: the name it is listed under here
    bool owner;
    int fd; //  the creator's: the memfds, held open for their /proc/<pid>/fd names
    int reads_fd;
    void *base;
    size_t length;
    slot_t *slots;
    _Atomic uint64_t *stamps; //  one per slot, mapped read-write
    size_t stamps_length;
    uint64_t mask;
    size_t count;
    _Atomic uint8_t *filter; //  the unlisted keys' counters
    uint64_t filter_mask;
    bool complete; //  the creator's: it vouches for absent keys (shm_index_set_complete)
    bool moving;   //  the creator's: between shm_index_moves_begin and _end
};

//  The tag of a publication whose (even) sequence number is seq.
static inline uint64_t
s_tag (uint64_t seq)
{
    return (seq >> 1) & STAMP_TAG_MASK;
}

//  Whether tag a is of a later publication than tag b (within half the tag space).
static inline bool
s_tag_later (uint64_t a, uint64_t b)
{
    uint64_t ahead = (a - b) & STAMP_TAG_MASK;
    return ahead != 0 && ahead < (STAMP_TAG_MASK >> 1);
}

uint64_t
shm_index_hash (const char *key, size_t len)
{
    uint64_t hash = XXH3_64bits (key, len);
    return hash ? hash : 1;
}

int64_t
shm_index_clock_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
shm_index_make_name (char *buf, size_t size, const char *instance)
{
    snprintf (buf, size, "/kvpool-%d-%s-%s-index", (int) getpid (), segment_process_tag (),
              instance);
}

//  ---- the names of this process's indexes ---------------------------------------------
//  An index's objects are memfds, named "/proc/<pid>/fd/<fd>" once made, while the node's
//  actors agree on a name before the replica-manager makes it (shm_index_make_name). This
//  process's indexes are listed here under that name, so that shm_index_open finds one by it
//  and the api can tell clients the name they open (shm_index_published_name).

#define REGISTRY_MAX 16

static struct {
    char name[NAME_MAX_LEN];      //  as given to shm_index_create; "" for a free row
    char published[NAME_MAX_LEN]; //  "/proc/<pid>/fd/<fd>" of the index's memfd
} s_registry[REGISTRY_MAX];
static pthread_mutex_t s_registry_lock = PTHREAD_MUTEX_INITIALIZER;

static void
s_registry_set (const char *name, const char *published)
{
    pthread_mutex_lock (&s_registry_lock);
    int row = -1;
    for (int i = 0; i < REGISTRY_MAX; i++) {
        if (strcmp (s_registry[i].name, name) == 0) {
            row = i;
            break;
        }
        if (row == -1 && !s_registry[i].name[0])
            row = i;
    }
    if (row >= 0) {
        snprintf (s_registry[row].name, NAME_MAX_LEN, "%s", published ? name : "");
        snprintf (s_registry[row].published, NAME_MAX_LEN, "%s", published ? published : "");
    }
    pthread_mutex_unlock (&s_registry_lock);
}

int
shm_index_published_name (const char *name, char *buf, size_t size)
{
    assert (buf && size > 0);
    int rc = -1;
    pthread_mutex_lock (&s_registry_lock);
    for (int i = 0; name && *name && i < REGISTRY_MAX; i++)
        if (strcmp (s_registry[i].name, name) == 0) {
            rc = (size_t) snprintf (buf, size, "%s", s_registry[i].published) < size ? 0 : -1;
            break;
        }
    pthread_mutex_unlock (&s_registry_lock);
    if (rc == -1)
        buf[0] = 0;
    return rc;
}

//  Opens an index's object by any of its names: "/proc/<pid>/fd/<fd>" (the memfds of a node
//  now), the name this process created one under, or a shm_open name (a node from before the
//  memfds).
static int
s_open_object (const char *name, int flags)
{
    char published[NAME_MAX_LEN];
    if (segment_name_is_fd (name))
        return open (name, flags | O_CLOEXEC);
    if (shm_index_published_name (name, published, sizeof published) == 0)
        return open (published, flags | O_CLOEXEC);
    return shm_open (name, flags, 0);
}

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 //  Linux 5.1
#endif

//  Makes a memfd of length bytes (tag names it in /proc/<pid>/maps), pages committed, maps it
//  read-write and seals it against shrinking and growing: a reader that truncates it cannot
//  kill the node with SIGBUS. With read_only_to_others, it is sealed against any writable
//  mapping from now on as well (F_SEAL_FUTURE_WRITE: the node's own mapping stays
//  writable), so a reader can map the index only read-only. Returns the mapping (MAP_FAILED
//  on failure, nothing left behind) and the descriptor, held for the memfd's name, in *fd_p.
static void *
s_create_mapped (const char *tag, size_t length, bool read_only_to_others, int *fd_p)
{
    int fd = memfd_create (tag, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd == -1)
        return MAP_FAILED;
    void *base = MAP_FAILED;
    int rc = ftruncate (fd, (off_t) length);
    if (rc == 0 && (rc = posix_fallocate (fd, 0, (off_t) length)) != 0) {
        errno = rc;
        rc = -1;
    }
    if (rc == 0)
        rc = fcntl (fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
    if (rc == 0)
        base = mmap (NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    //  A kernel before 5.1 has no F_SEAL_FUTURE_WRITE: readers could then write the index,
    //  as the node's own user always could; never shrink it.
    if (base != MAP_FAILED && read_only_to_others)
        fcntl (fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE);
    if (base != MAP_FAILED && fcntl (fd, F_ADD_SEALS, F_SEAL_SEAL) != 0) {
        munmap (base, length);
        base = MAP_FAILED;
    }
    if (base == MAP_FAILED) {
        int error = errno;
        close (fd);
        errno = error;
        return MAP_FAILED;
    }
    *fd_p = fd;
    return base;
}

shm_index_t *
shm_index_create (const char *name, size_t slots)
{
    size_t count = 64;
    while (count < slots && count < (1ULL << 30))
        count <<= 1;
    //  The memfds' tags: the name without its '/', and for the stamps "-reads" for "-index".
    size_t name_len = name ? strlen (name) : 0;
    if (name_len < 2 || name_len >= NAME_MAX_LEN) {
        errno = name_len ? ENAMETOOLONG : EINVAL;
        return NULL;
    }
    char tag[NAME_MAX_LEN + 8], reads_tag[NAME_MAX_LEN + 8];
    const char *bare = name[0] == '/' ? name + 1 : name;
    snprintf (tag, sizeof tag, "%s", bare);
    size_t bare_len = strlen (bare);
    if (bare_len > 6 && strcmp (bare + bare_len - 6, "-index") == 0)
        snprintf (reads_tag, sizeof reads_tag, "%.*s-reads", (int) (bare_len - 6), bare);
    else
        snprintf (reads_tag, sizeof reads_tag, "%s-reads", bare);
    size_t filter_count = count * FILTER_PER_SLOT;
    size_t length = HEADER_SIZE + count * SLOT_SIZE + filter_count;
    size_t stamps_length = count * sizeof (uint64_t);
    int fd = -1, reads_fd = -1;
    void *base = s_create_mapped (tag, length, true, &fd);
    if (base == MAP_FAILED)
        return NULL;
    void *stamps = s_create_mapped (reads_tag, stamps_length, false, &reads_fd);
    if (stamps == MAP_FAILED) {
        int error = errno;
        munmap (base, length);
        close (fd);
        errno = error;
        return NULL;
    }
    shm_index_t *self = (shm_index_t *) calloc (1, sizeof (shm_index_t));
    assert (self);
    snprintf (self->name, sizeof self->name, "/proc/%ld/fd/%d", (long) getpid (), fd);
    snprintf (self->reads_name, sizeof self->reads_name, "/proc/%ld/fd/%d", (long) getpid (),
              reads_fd);
    snprintf (self->created_as, sizeof self->created_as, "%s", name);
    self->owner = true;
    self->fd = fd;
    self->reads_fd = reads_fd;
    self->base = base;
    self->length = length;
    self->slots = (slot_t *) ((char *) base + HEADER_SIZE);
    self->stamps = (_Atomic uint64_t *) stamps;
    self->stamps_length = stamps_length;
    self->mask = count - 1;
    self->filter = (_Atomic uint8_t *) ((char *) self->slots + count * SLOT_SIZE);
    self->filter_mask = filter_count - 1;
    header_t *header = (header_t *) base;
    header->slot_count = count;
    header->slot_size = SLOT_SIZE;
    header->filter_count = filter_count;
    atomic_store_explicit (&header->absent_seq, 1, memory_order_relaxed); //  no vouching yet
    snprintf (header->reads_name, sizeof header->reads_name, "%s", self->reads_name);
    atomic_store_explicit (&header->own_until_ms, INT64_MAX, memory_order_relaxed);
    atomic_thread_fence (memory_order_release);
    header->magic = MAGIC;
    s_registry_set (name, self->name);
    return self;
}

shm_index_t *
shm_index_open (const char *name)
{
    if (!name || !*name) {
        errno = EINVAL;
        return NULL;
    }
    int fd = s_open_object (name, O_RDONLY);
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
    char reads_name[NAME_MAX_LEN];
    memcpy (reads_name, header->reads_name, sizeof reads_name);
    uint64_t filter_count = header->filter_count;
    if (header->magic != MAGIC || header->slot_size != SLOT_SIZE || count == 0
        || (count & (count - 1)) || count > (1ULL << 30) || filter_count == 0
        || (filter_count & (filter_count - 1)) || filter_count > count * FILTER_PER_SLOT
        || HEADER_SIZE + count * SLOT_SIZE + filter_count > length
        || memchr (reads_name, 0, sizeof reads_name) == NULL) {
        munmap (base, length);
        errno = EINVAL;
        return NULL;
    }
    //  The stamps, read-write: without them this process must not read from the index.
    size_t stamps_length = count * sizeof (uint64_t);
    void *stamps = MAP_FAILED;
    fd = s_open_object (reads_name, O_RDWR);
    if (fd != -1) {
        if (fstat (fd, &st) == 0 && (size_t) st.st_size >= stamps_length)
            stamps = mmap (NULL, stamps_length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        else
            errno = EINVAL;
        int error = errno;
        close (fd);
        errno = error;
    }
    if (stamps == MAP_FAILED) {
        int error = errno;
        munmap (base, length);
        errno = error;
        return NULL;
    }
    shm_index_t *self = (shm_index_t *) calloc (1, sizeof (shm_index_t));
    assert (self);
    snprintf (self->name, sizeof self->name, "%s", name);
    snprintf (self->reads_name, sizeof self->reads_name, "%s", reads_name);
    self->fd = -1;
    self->reads_fd = -1;
    self->base = base;
    self->length = length;
    self->slots = (slot_t *) ((char *) base + HEADER_SIZE);
    self->stamps = (_Atomic uint64_t *) stamps;
    self->stamps_length = stamps_length;
    self->mask = count - 1;
    self->filter = (_Atomic uint8_t *) ((char *) self->slots + count * SLOT_SIZE);
    self->filter_mask = filter_count - 1;
    return self;
}

void
shm_index_destroy (shm_index_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    shm_index_t *self = *self_p;
    munmap (self->base, self->length);
    munmap ((void *) self->stamps, self->stamps_length);
    if (self->owner)
        s_registry_set (self->created_as, NULL);
    //  The memfds go with their last descriptor and mapping: nothing to unlink.
    if (self->fd >= 0)
        close (self->fd);
    if (self->reads_fd >= 0)
        close (self->reads_fd);
    free (self);
    *self_p = NULL;
}

const char *
shm_index_name (shm_index_t *self)
{
    return self->name;
}

const char *
shm_index_reads_name (shm_index_t *self)
{
    return self->reads_name;
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
                  uint64_t offset, uint64_t size, uint64_t version, bool cache)
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
        //  Unread: a stamp of the slot's last object does not carry over (its tag differs
        //  anyway; zero says so plainly).
        atomic_store_explicit (&self->stamps[index], 0, memory_order_relaxed);
        slot->segment_id = segment_id;
        slot->key_len = (uint32_t) key_len | (cache ? SLOT_CACHE : 0);
        slot->offset = offset;
        slot->size = size;
        slot->version = version;
        memcpy (slot->key, key, key_len);
        atomic_store_explicit (&slot->hash, hash, memory_order_relaxed);
        atomic_store_explicit (&slot->seq, seq + 2, memory_order_release);
        self->count++;
        return (int64_t) index;
    }
    return -1;
}

void
shm_index_set_cache_until (shm_index_t *self, int64_t until_ms)
{
    assert (self->owner);
    atomic_store_explicit (&((header_t *) self->base)->cache_until_ms, until_ms,
                           memory_order_release);
}

void
shm_index_set_own_until (shm_index_t *self, int64_t until_ms)
{
    assert (self->owner);
    atomic_store_explicit (&((header_t *) self->base)->own_until_ms, until_ms,
                           memory_order_release);
}

//  The FILTER_HASHES counters of a key's hash (double hashing over a mixed hash: the slots
//  use the hash's low bits).
static inline void
s_filter_positions (const shm_index_t *self, uint64_t hash, uint64_t *at)
{
    uint64_t a = hash * 0x9E3779B97F4A7C15ULL;
    uint64_t b = ((hash >> 32) | (hash << 32)) * 0xC2B2AE3D27D4EB4FULL | 1;
    for (int i = 0; i < FILTER_HASHES; i++)
        at[i] = ((a + (uint64_t) i * b) >> 20) & self->filter_mask;
}

//  Whether the filter may count hash among the unlisted keys (no false "no").
static inline bool
s_unlisted (const shm_index_t *self, uint64_t hash)
{
    uint64_t at[FILTER_HASHES];
    s_filter_positions (self, hash, at);
    bool all = true;
    for (int i = 0; i < FILTER_HASHES; i++)
        all &= atomic_load_explicit (&self->filter[at[i]], memory_order_relaxed) != 0;
    return all;
}

//  The absence seqlock's writer side: odd while a held key may be where a reader misses it.
static void
s_absent_seq_bump (shm_index_t *self, memory_order order)
{
    _Atomic uint64_t *seq = &((header_t *) self->base)->absent_seq;
    atomic_store_explicit (seq, atomic_load_explicit (seq, memory_order_relaxed) + 1, order);
}

void
shm_index_set_complete (shm_index_t *self, bool complete)
{
    assert (self->owner && !self->moving);
    if (complete == self->complete)
        return;
    self->complete = complete;
    //  Odd to even: answers from now on; even to odd: none, and none of a batch under way.
    s_absent_seq_bump (self, memory_order_seq_cst);
}

void
shm_index_moves_begin (shm_index_t *self)
{
    assert (self->owner && !self->moving);
    self->moving = true;
    if (self->complete) {
        s_absent_seq_bump (self, memory_order_relaxed);
        atomic_thread_fence (memory_order_release);
    }
}

void
shm_index_moves_end (shm_index_t *self)
{
    assert (self->owner && self->moving);
    self->moving = false;
    if (self->complete)
        s_absent_seq_bump (self, memory_order_release);
}

void
shm_index_unlisted_add (shm_index_t *self, const char *key, size_t key_len)
{
    assert (self->owner);
    if (key_len == 0 || key_len > SHM_INDEX_KEY_MAX)
        return; //  never answered absent: readers ask the node for such keys
    uint64_t at[FILTER_HASHES];
    s_filter_positions (self, shm_index_hash (key, key_len), at);
    for (int i = 0; i < FILTER_HASHES; i++) {
        uint8_t count = atomic_load_explicit (&self->filter[at[i]], memory_order_relaxed);
        if (count != FILTER_STUCK)
            atomic_store_explicit (&self->filter[at[i]], count + 1, memory_order_relaxed);
    }
    //  Counted before anything that follows (a withdrawal from its slot) can be seen.
    atomic_thread_fence (memory_order_release);
}

void
shm_index_unlisted_remove (shm_index_t *self, const char *key, size_t key_len, bool held)
{
    assert (self->owner);
    if (key_len == 0 || key_len > SHM_INDEX_KEY_MAX)
        return; //  never answered absent: readers ask the node for such keys
    uint64_t at[FILTER_HASHES];
    s_filter_positions (self, shm_index_hash (key, key_len), at);
    //  A reader that missed the key in its slot before it was published there, and finds it
    //  uncounted now, must see that something moved. (A key no longer held may simply be
    //  absent from then on.)
    bool bracket = held && !self->moving;
    if (bracket)
        shm_index_moves_begin (self);
    for (int i = 0; i < FILTER_HASHES; i++) {
        uint8_t count = atomic_load_explicit (&self->filter[at[i]], memory_order_relaxed);
        assert (count > 0);
        if (count != FILTER_STUCK && count > 0)
            atomic_store_explicit (&self->filter[at[i]], count - 1, memory_order_relaxed);
    }
    if (bracket)
        shm_index_moves_end (self);
}

//  The time in a stamp if it belongs to the publication with sequence number seq, else 0.
static int64_t
s_stamp_time (uint64_t stamp, uint64_t seq)
{
    if (stamp >> STAMP_TIME_BITS != s_tag (seq))
        return 0;
    return (int64_t) (stamp & STAMP_TIME_MASK);
}

int64_t
shm_index_last_read (shm_index_t *self, int64_t index)
{
    assert (self->owner);
    if (index < 0 || (uint64_t) index > self->mask)
        return 0;
    slot_t *slot = &self->slots[index];
    if (atomic_load_explicit (&slot->hash, memory_order_relaxed) == 0)
        return 0;
    uint64_t seq = atomic_load_explicit (&slot->seq, memory_order_relaxed);
    return s_stamp_time (atomic_load_explicit (&self->stamps[index], memory_order_relaxed), seq);
}

int64_t
shm_index_remove (shm_index_t *self, int64_t index)
{
    assert (self->owner);
    if (index < 0 || (uint64_t) index > self->mask)
        return 0;
    slot_t *slot = &self->slots[index];
    if (atomic_load_explicit (&slot->hash, memory_order_relaxed) == 0)
        return 0;
    uint64_t seq = atomic_load_explicit (&slot->seq, memory_order_relaxed);
    atomic_store_explicit (&slot->seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence (memory_order_release);
    atomic_store_explicit (&slot->hash, 0, memory_order_relaxed);
    //  seq_cst: the withdrawal is visible before anything the node does afterwards (such as
    //  freeing the object's space) can be.
    atomic_store_explicit (&slot->seq, seq + 2, memory_order_seq_cst);
    self->count--;
    //  The other half of the readers' stamp-then-confirm (shm_index.h): a read confirmed
    //  before the withdrawal left its stamp where this load sees it.
    atomic_thread_fence (memory_order_seq_cst);
    return s_stamp_time (atomic_load_explicit (&self->stamps[index], memory_order_relaxed), seq);
}

//  The slot's fields are read while the writer may change them (racy.h); the sequence
//  number decides. Returns LOOK_FOUND (hit filled), LOOK_MISSED (every slot the key could be
//  in was read whole, none holds it), or LOOK_UNSURE (ask the node).
enum { LOOK_UNSURE = -1, LOOK_MISSED = 0, LOOK_FOUND = 1 };

static int
s_lookup (shm_index_t *self, const char *key, size_t key_len, uint64_t hash, shm_index_hit_t *hit)
{
    if (key_len == 0 || key_len > SHM_INDEX_KEY_MAX)
        return LOOK_UNSURE;
    for (uint64_t probe = 0; probe < PROBE_MAX; probe++) {
        slot_t *slot = &self->slots[(hash + probe) & self->mask];
        uint64_t seq = atomic_load_explicit (&slot->seq, memory_order_acquire);
        if (seq & 1)
            return LOOK_UNSURE; //  being written: ask the node
        uint64_t slot_hash = atomic_load_explicit (&slot->hash, memory_order_relaxed);
        //  An empty slot does not end the search: a removal may have emptied it after the
        //  key went in further on (see DESIGN).
        if (slot_hash != hash)
            continue;
        uint32_t len = slot->key_len;
        if ((len & ~SLOT_CACHE) != key_len || memcmp (slot->key, key, key_len) != 0)
            continue;
        //  A cache copy only while the node's cache lease holds: a node stopped (or cut off
        //  from its master) past it may have missed the key's removal.
        hit->cache = (len & SLOT_CACHE) != 0;
        header_t *header = (header_t *) self->base;
        hit->until = hit->cache ? &header->cache_until_ms : &header->own_until_ms;
        if (hit->cache
            && shm_index_clock_ms () >= atomic_load_explicit (hit->until, memory_order_acquire))
            return LOOK_UNSURE;
        hit->segment_id = slot->segment_id;
        hit->offset = slot->offset;
        hit->size = slot->size;
        hit->version = slot->version;
        hit->slot = slot;
        hit->stamp = (void *) &self->stamps[(hash + probe) & self->mask];
        hit->seq = seq;
        hit->hash = hash;
        //  The key matched and nothing moved while we read it.
        RACY_READ_FENCE ();
        return atomic_load_explicit (&slot->seq, memory_order_relaxed) == seq ? LOOK_FOUND
                                                                              : LOOK_UNSURE;
    }
    return LOOK_MISSED;
}

bool
shm_index_lookup (shm_index_t *self, const char *key, size_t key_len, shm_index_hit_t *hit)
{
    RACY_BEGIN ();
    bool found = s_lookup (self, key, key_len, shm_index_hash (key, key_len), hit) == LOOK_FOUND;
    RACY_END ();
    return found;
}

//  Starts loading key's home slot (its header and the first bytes of its key: the two cache
//  lines a hit reads) and its read stamp (written by the confirmation) into the cache.
static uint64_t
s_prefetch (shm_index_t *self, const char *key, size_t key_len)
{
    uint64_t hash = shm_index_hash (key, key_len);
    const char *slot = (const char *) &self->slots[hash & self->mask];
    __builtin_prefetch (slot, 0, 3);
    __builtin_prefetch (slot + 64, 0, 3);
    __builtin_prefetch ((const void *) &self->stamps[hash & self->mask], 1, 3);
    return hash;
}

static size_t
s_batch_len (const shm_index_batch_t *batch, size_t i)
{
    if (!batch->lens)
        return strlen (batch->keys[i]);
    size_t len;
    memcpy (&len, batch->lens + i * batch->lens_step, sizeof len);
    return len;
}

void
shm_index_batch_start (shm_index_batch_t *batch, shm_index_t *self, const char *const *keys,
                       const size_t *lens, size_t count)
{
    shm_index_batch_start_step (batch, self, keys, lens, sizeof (size_t), count);
}

void
shm_index_batch_start_step (shm_index_batch_t *batch, shm_index_t *self, const char *const *keys,
                            const size_t *lens, size_t step, size_t count)
{
    assert (batch && self && (keys || count == 0));
    batch->index = self;
    batch->keys = keys;
    batch->lens = (const char *) lens;
    batch->lens_step = step;
    batch->count = count;
    //  Answers of absence stand only if nothing moved from here to shm_index_batch_absent_holds.
    uint64_t seq =
        atomic_load_explicit (&((header_t *) self->base)->absent_seq, memory_order_acquire);
    batch->absent_seq = seq & 1 ? 0 : seq;
    for (size_t i = 0; i < count && i < SHM_INDEX_AHEAD; i++) {
        batch->key_lens[i] = s_batch_len (batch, i);
        batch->hashes[i] = s_prefetch (self, keys[i], batch->key_lens[i]);
    }
}

shm_index_find_t
shm_index_batch_find (shm_index_batch_t *batch, size_t i, shm_index_hit_t *hit)
{
    assert (batch && i < batch->count);
    shm_index_t *self = batch->index;
    uint64_t hash = batch->hashes[i % SHM_INDEX_AHEAD];
    size_t key_len = batch->key_lens[i % SHM_INDEX_AHEAD];
    size_t ahead = i + SHM_INDEX_AHEAD;
    if (ahead < batch->count) {
        batch->key_lens[i % SHM_INDEX_AHEAD] = s_batch_len (batch, ahead);
        batch->hashes[i % SHM_INDEX_AHEAD] =
            s_prefetch (self, batch->keys[ahead], batch->key_lens[i % SHM_INDEX_AHEAD]);
    }
    RACY_BEGIN ();
    int looked = s_lookup (self, batch->keys[i], key_len, hash, hit);
    RACY_END ();
    if (looked == LOOK_FOUND)
        return SHM_INDEX_FOUND;
    //  Not in the slots when we read them; absent if the node did not hold it unlisted
    //  either. (A key withdrawn while held is counted in the filter before it leaves its
    //  slot: if our read of the slot saw it gone, this fence lets us see it counted.)
    if (looked == LOOK_UNSURE || !batch->absent_seq)
        return SHM_INDEX_ASK;
    RACY_READ_FENCE ();
    return s_unlisted (self, hash) ? SHM_INDEX_ASK : SHM_INDEX_ABSENT;
}

bool
shm_index_batch_lookup (shm_index_batch_t *batch, size_t i, shm_index_hit_t *hit)
{
    return shm_index_batch_find (batch, i, hit) == SHM_INDEX_FOUND;
}

bool
shm_index_batch_absent_holds (const shm_index_batch_t *batch)
{
    if (!batch->absent_seq)
        return true; //  no answer of absence was given
    RACY_READ_FENCE ();
    header_t *header = (header_t *) batch->index->base;
    return atomic_load_explicit (&header->absent_seq, memory_order_relaxed) == batch->absent_seq;
}

bool
shm_index_confirm (const shm_index_hit_t *hit, int64_t now_ms)
{
    //  Read while the node served it: a node stopped past its lease may have missed its
    //  removal (shm_index_set_own_until).
    if (now_ms >= atomic_load_explicit (hit->until, memory_order_acquire))
        return false;
    //  Raise the stamp to now, unless it says now or later already, or belongs to a later
    //  publication in this slot (then this read's object is gone, and the confirmation
    //  below fails).
    _Atomic uint64_t *stamp = (_Atomic uint64_t *) hit->stamp;
    uint64_t tag = s_tag (hit->seq);
    uint64_t now = (uint64_t) now_ms & STAMP_TIME_MASK;
    uint64_t mine = tag << STAMP_TIME_BITS | now;
    uint64_t old = atomic_load_explicit (stamp, memory_order_relaxed);
    for (;;) {
        uint64_t old_tag = old >> STAMP_TIME_BITS;
        if (old != 0 && old_tag == tag && (old & STAMP_TIME_MASK) >= now)
            break;
        if (old != 0 && old_tag != tag && s_tag_later (old_tag, tag))
            break;
        if (atomic_compare_exchange_weak_explicit (stamp, &old, mine, memory_order_relaxed,
                                                   memory_order_relaxed))
            break;
    }
    //  The stamp before the check, and the node's withdrawal before its look at the stamp:
    //  one of the two sees the other (shm_index.h).
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
    int64_t a = shm_index_insert (writer, "alpha", 5, 3, 4096, 100, 5, false);
    int64_t b = shm_index_insert (writer, "beta", 4, 4, 0, 7, 6, false);
    assert (a >= 0 && b >= 0 && a != b && shm_index_count (writer) == 2);
    shm_index_hit_t hit;
    assert (shm_index_lookup (reader, "alpha", 5, &hit));
    assert (hit.segment_id == 3 && hit.offset == 4096 && hit.size == 100);
    assert (!shm_index_lookup (reader, "alph", 4, &hit));
    assert (!shm_index_lookup (reader, "gamma", 5, &hit));

    //  A confirmed read leaves its time in the slot's stamp; the stamp only goes up, and
    //  a published object starts unread.
    assert (shm_index_last_read (writer, a) == 0);
    int64_t now = shm_index_clock_ms ();
    assert (now > 0);
    assert (shm_index_lookup (reader, "alpha", 5, &hit));
    assert (shm_index_confirm (&hit, now));
    assert (shm_index_last_read (writer, a) == now);
    assert (shm_index_confirm (&hit, now + 5));
    assert (shm_index_confirm (&hit, now + 2)); //  a late reader of an earlier instant
    assert (shm_index_last_read (writer, a) == now + 5);

    //  A removal during a read invalidates the read, and the removal sees every read
    //  confirmed before it.
    assert (shm_index_lookup (reader, "beta", 4, &hit));
    assert (shm_index_confirm (&hit, now + 7));
    shm_index_hit_t late = hit;
    assert (shm_index_remove (writer, b) == now + 7);
    assert (!shm_index_confirm (&late, now + 8));
    assert (!shm_index_lookup (reader, "beta", 4, &hit));
    //  ... and so does a reuse of the slot by another key; a stamp left by a reader of the
    //  old object is not a read of the new one, nor does it replace the new one's stamp.
    assert (shm_index_lookup (reader, "alpha", 5, &hit));
    late = hit;
    assert (shm_index_remove (writer, a) == now + 5);
    int64_t c = shm_index_insert (writer, "alpha", 5, 9, 8192, 100, 42, false);
    assert (c >= 0 && c == a);
    assert (!shm_index_confirm (&late, now + 9));
    assert (shm_index_last_read (writer, c) == 0);
    assert (shm_index_lookup (reader, "alpha", 5, &hit) && hit.segment_id == 9);
    assert (shm_index_confirm (&hit, now + 10));
    assert (!shm_index_confirm (&late, now + 20));
    assert (shm_index_last_read (writer, c) == now + 10);
    assert (hit.version == 42 && !hit.cache);

    //  A cache copy is found only while the cache lease holds.
    {
        int64_t d = shm_index_insert (writer, "cached", 6, 3, 0, 10, 77, true);
        assert (d >= 0);
        assert (!shm_index_lookup (reader, "cached", 6, &hit)); //  no lease yet
        shm_index_set_cache_until (writer, shm_index_clock_ms () + 60000);
        assert (shm_index_lookup (reader, "cached", 6, &hit) && hit.cache && hit.version == 77);
        shm_index_set_cache_until (writer, shm_index_clock_ms () - 1);
        assert (!shm_index_lookup (reader, "cached", 6, &hit));
        assert (shm_index_lookup (reader, "alpha", 5, &hit)); //  own copies: their own bound
        shm_index_remove (writer, d);
    }

    //  The node's own copies are read while its own lease holds: always, until it sets one;
    //  a confirmation after it (a node frozen past it) fails.
    {
        int64_t now_ms = shm_index_clock_ms ();
        assert (shm_index_lookup (reader, "alpha", 5, &hit) && !hit.cache);
        assert (shm_index_confirm (&hit, now_ms));
        shm_index_set_own_until (writer, now_ms + 1000);
        assert (shm_index_lookup (reader, "alpha", 5, &hit));
        assert (shm_index_confirm (&hit, now_ms + 999));
        assert (!shm_index_confirm (&hit, now_ms + 1000));
        shm_index_set_own_until (writer, 0); //  suspended
        assert (shm_index_lookup (reader, "alpha", 5, &hit));
        assert (!shm_index_confirm (&hit, now_ms));
        shm_index_set_own_until (writer, INT64_MAX);
        assert (shm_index_confirm (&hit, now_ms));
    }

    //  Absent keys: answered only while the node vouches, for a key in no slot and not
    //  counted unlisted, and only if nothing moved during the batch.
    {
        const char *keys[] = {"alpha", "nothing", "on-disk"};
        shm_index_find_t found[3];
        shm_index_batch_t batch;
        shm_index_hit_t one;
#define FIND_ALL()                                                                                 \
    do {                                                                                           \
        shm_index_batch_start (&batch, reader, keys, NULL, 3);                                     \
        for (size_t i = 0; i < 3; i++)                                                             \
            found[i] = shm_index_batch_find (&batch, i, &one);                                     \
    } while (0)
        FIND_ALL (); //  not vouching (as at creation): a miss is only a miss
        assert (found[0] == SHM_INDEX_FOUND && found[1] == SHM_INDEX_ASK);
        assert (found[2] == SHM_INDEX_ASK);
        shm_index_set_complete (writer, true);
        FIND_ALL ();
        assert (found[0] == SHM_INDEX_FOUND && found[1] == SHM_INDEX_ABSENT);
        assert (found[2] == SHM_INDEX_ABSENT && shm_index_batch_absent_holds (&batch));
        //  A key held but not published is counted: asked about, not absent.
        shm_index_unlisted_add (writer, "on-disk", 7);
        FIND_ALL ();
        assert (found[1] == SHM_INDEX_ABSENT && found[2] == SHM_INDEX_ASK);
        //  Published while held: uncounting it fails a batch that overlapped it.
        FIND_ALL ();
        int64_t slot = shm_index_insert (writer, "on-disk", 7, 1, 0, 1, 1, false);
        assert (slot >= 0);
        shm_index_unlisted_remove (writer, "on-disk", 7, true);
        assert (!shm_index_batch_absent_holds (&batch));
        FIND_ALL ();
        assert (found[2] == SHM_INDEX_FOUND && shm_index_batch_absent_holds (&batch));
        //  Withdrawn while held (counted first), then dropped (uncounted, gone: no move).
        shm_index_unlisted_add (writer, "on-disk", 7);
        shm_index_remove (writer, slot);
        FIND_ALL ();
        assert (found[2] == SHM_INDEX_ASK);
        shm_index_unlisted_remove (writer, "on-disk", 7, false);
        assert (shm_index_batch_absent_holds (&batch));
        FIND_ALL ();
        assert (found[2] == SHM_INDEX_ABSENT);
        //  A batch begun inside a move answers no absence; one across it gives none that
        //  stands.
        shm_index_moves_begin (writer);
        FIND_ALL ();
        assert (found[1] == SHM_INDEX_ASK && shm_index_batch_absent_holds (&batch));
        shm_index_moves_end (writer);
        FIND_ALL ();
        shm_index_moves_begin (writer);
        shm_index_moves_end (writer);
        assert (found[1] == SHM_INDEX_ABSENT && !shm_index_batch_absent_holds (&batch));
        //  Counters at their top stay there: the key is asked about for good.
        for (int i = 0; i < 300; i++)
            shm_index_unlisted_add (writer, "stuck", 5);
        for (int i = 0; i < 300; i++)
            shm_index_unlisted_remove (writer, "stuck", 5, false);
        const char *stuck[] = {"stuck"};
        shm_index_batch_start (&batch, reader, stuck, NULL, 1);
        assert (shm_index_batch_find (&batch, 0, &one) == SHM_INDEX_ASK);
        //  Keys a slot cannot hold are never answered absent.
        char long_key[SHM_INDEX_KEY_MAX + 2];
        memset (long_key, 'l', sizeof long_key - 1);
        long_key[sizeof long_key - 1] = 0;
        const char *longs[] = {long_key};
        shm_index_batch_start (&batch, reader, longs, NULL, 1);
        assert (shm_index_batch_find (&batch, 0, &one) == SHM_INDEX_ASK);
        //  A node that stops vouching: nothing absent, and a batch across it fails.
        FIND_ALL ();
        shm_index_set_complete (writer, false);
        assert (!shm_index_batch_absent_holds (&batch));
        FIND_ALL ();
        assert (found[1] == SHM_INDEX_ASK);
#undef FIND_ALL
    }

    //  An entry that went in past its home slot stays found when the home slot is emptied
    //  later (a lookup does not stop at an empty slot).
    {
        char first[32], second[32];
        int first_len = snprintf (first, sizeof first, "home-0");
        uint64_t home = shm_index_hash (first, (size_t) first_len) & 127;
        int second_len = 0;
        for (int i = 1; i < 100000 && !second_len; i++) {
            int len = snprintf (second, sizeof second, "home-%d", i);
            if ((shm_index_hash (second, (size_t) len) & 127) == home)
                second_len = len;
        }
        assert (second_len);
        int64_t one = shm_index_insert (writer, first, (size_t) first_len, 1, 11, 1, 1, false);
        int64_t two = shm_index_insert (writer, second, (size_t) second_len, 1, 22, 1, 2, false);
        assert (one >= 0 && two >= 0 && two != one);
        shm_index_remove (writer, one);
        assert (!shm_index_lookup (reader, first, (size_t) first_len, &hit));
        assert (shm_index_lookup (reader, second, (size_t) second_len, &hit) && hit.offset == 22);
        //  A batch finds what one-by-one lookups find, in order, with lengths or without.
        const char *keys[] = {"alpha", second, first, "nothing", second};
        size_t lens[] = {5, (size_t) second_len, (size_t) first_len, 7, (size_t) second_len};
        //  (2: the lengths as a field of structs, every other size_t.)
        size_t pairs[10];
        for (size_t i = 0; i < 5; i++) {
            pairs[2 * i] = lens[i];
            pairs[2 * i + 1] = 0;
        }
        for (int with_lens = 0; with_lens < 3; with_lens++) {
            shm_index_batch_t batch;
            if (with_lens == 2)
                shm_index_batch_start_step (&batch, reader, keys, pairs, 2 * sizeof (size_t), 5);
            else
                shm_index_batch_start (&batch, reader, keys, with_lens ? lens : NULL, 5);
            for (size_t i = 0; i < 5; i++) {
                shm_index_hit_t one_hit, batch_hit;
                bool found = shm_index_lookup (reader, keys[i], lens[i], &one_hit);
                assert (shm_index_batch_lookup (&batch, i, &batch_hit) == found);
                assert (!found
                        || (batch_hit.offset == one_hit.offset && batch_hit.slot == one_hit.slot));
            }
        }
        shm_index_remove (writer, two);
    }

    //  Too-long keys and full probe runs are simply not published.
    char big[SHM_INDEX_KEY_MAX + 1];
    memset (big, 'k', sizeof big);
    assert (shm_index_insert (writer, big, sizeof big, 1, 0, 1, 1, false) == -1);
    int published = 0;
    for (int i = 0; i < 1000; i++) {
        char key[32];
        int len = snprintf (key, sizeof key, "key-%d", i);
        published +=
            shm_index_insert (writer, key, (size_t) len, 1, (uint64_t) i, 1, 1, false) >= 0;
    }
    assert (published > 64 && published <= 127);
    //  Every key it published is found with its own entry.
    for (int i = 0; i < 1000; i++) {
        char key[32];
        int len = snprintf (key, sizeof key, "key-%d", i);
        if (shm_index_lookup (reader, key, (size_t) len, &hit))
            assert (hit.offset == (uint64_t) i);
    }
    shm_index_destroy (&reader);

    //  The objects are sealed memfds: a reader (here: anyone who can open them by their
    //  /proc/<pid>/fd names) can neither shrink nor grow them, which would kill the node with
    //  SIGBUS, and can map or write the index itself only read-only.
    char public_name[NAME_MAX_LEN];
    assert (shm_index_published_name (name, public_name, sizeof public_name) == 0);
    assert (strcmp (public_name, shm_index_name (writer)) == 0);
    assert (segment_name_is_fd (shm_index_name (writer)));
    assert (segment_name_is_fd (shm_index_reads_name (writer)));
    int index_fd = open (shm_index_name (writer), O_RDWR | O_CLOEXEC);
    int reads_fd = open (shm_index_reads_name (writer), O_RDWR | O_CLOEXEC);
    assert (index_fd >= 0 && reads_fd >= 0);
    int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    assert ((fcntl (index_fd, F_GET_SEALS) & want) == want);
    assert ((fcntl (reads_fd, F_GET_SEALS) & want) == want);
    errno = 0;
    assert (ftruncate (index_fd, 0) == -1 && errno == EPERM);
    errno = 0;
    assert (ftruncate (reads_fd, 0) == -1 && errno == EPERM);
    assert (ftruncate (reads_fd, 1 << 20) == -1 && errno == EPERM);
    assert (fcntl (index_fd, F_ADD_SEALS, F_SEAL_WRITE) == -1); //  no more seals either
    if (fcntl (index_fd, F_GET_SEALS) & F_SEAL_FUTURE_WRITE) {
        assert (mmap (NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, index_fd, 0) == MAP_FAILED);
        assert (write (index_fd, "x", 1) == -1 && errno == EPERM);
    }
    close (index_fd);
    close (reads_fd);
    //  Another process opens it by the public_name name, the creator's included.
    pid_t pid = fork ();
    assert (pid >= 0);
    if (pid == 0) {
        shm_index_t *child = shm_index_open (public_name);
        shm_index_hit_t found;
        _exit (child && shm_index_lookup (child, "alpha", 5, &found) && found.segment_id == 9 ? 0
                                                                                              : 1);
    }
    int status = 0;
    assert (waitpid (pid, &status, 0) == pid && WIFEXITED (status) && WEXITSTATUS (status) == 0);
    reader = shm_index_open (public_name);
    assert (reader && shm_index_lookup (reader, "alpha", 5, &hit));
    shm_index_destroy (&reader);

    //  A reader that cannot write the stamps (here: the header names stamps that are gone)
    //  does not get the index.
    int copy = memfd_create ("indextest-copy", MFD_CLOEXEC);
    assert (copy >= 0);
    header_t forged = *(header_t *) writer->base;
    snprintf (forged.reads_name, sizeof forged.reads_name, "/proc/%d/fd/%d", (int) getpid (),
              copy + 1000);
    assert (ftruncate (copy, (off_t) writer->length) == 0);
    assert (pwrite (copy, &forged, sizeof forged, 0) == (ssize_t) sizeof forged);
    char copy_name[NAME_MAX_LEN];
    snprintf (copy_name, sizeof copy_name, "/proc/%d/fd/%d", (int) getpid (), copy);
    assert (shm_index_open (copy_name) == NULL);
    //  ... nor what is not an index.
    memset (&forged, 0, sizeof forged);
    assert (pwrite (copy, &forged, sizeof forged, 0) == (ssize_t) sizeof forged);
    assert (shm_index_open (copy_name) == NULL && errno == EINVAL);
    close (copy);
    //  Gone with its creator: no name is left behind, in /dev/shm or this process.
    shm_index_destroy (&writer);
    assert (shm_index_open (name) == NULL);
    assert (shm_index_published_name (name, public_name, sizeof public_name) == -1);
    char dev_shm[NAME_MAX_LEN + 16];
    snprintf (dev_shm, sizeof dev_shm, "/dev/shm%s", name);
    assert (access (dev_shm, F_OK) == -1);
    if (verbose)
        printf ("publish, lookup, read stamps, invalidation, absent keys, emptied home slots, "
                "batches, lossy overflow, sealed memfds ");
}
