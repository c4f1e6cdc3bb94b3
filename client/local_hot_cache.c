/*  local_hot_cache.c - the per-process hot cache (local_hot_cache.h).

    One cache per node endpoint per process, shared by every connection to that endpoint and
    reference counted like the process context (process.c): a binding such as Python's keeps
    a pool of connections, one per thread at a time, and a cache per connection would keep a
    copy of a value per thread and split the reads that admission counts. Versions are unique
    to one put of a key in the cluster (the master's token, or in role all the node's own
    number, both drawn from the clock past a restart), so a (key, version) read through one
    connection is the same bytes through another.

    Entries: a key, its version and a copy of the whole value, in one allocation, in a
    hash table (CZMQ's zhashx, by key) and on an LRU list (most recently used at the head).
    The cache holds one reference to each entry it keeps; a lookup hands out another, and a
    value served as a frame (kvpool_get_batch) holds one for as long as the frame lives, so
    an entry evicted or invalidated while a caller still reads it is freed by the last
    holder. Bytes are counted while the cache keeps an entry.

    Admission: a direct-mapped table of ADMIT_SLOTS (hash of the key, reads, first read's
    time): a key whose slot another key took, or whose window passed, starts again at one.
    Bounded memory whatever the keys; a collision only delays an admission.

    Threads: any; one mutex per cache guards its table, list, slots and counters (held for
    lookups and bookkeeping, never while value bytes are copied out); the list of caches
    has a mutex of its own. Entry references are atomic.
*/
#include "client/local_hot_cache.h"

#include <assert.h>
#include <czmq.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ADMIT_SLOTS 4096 //  a power of two

struct _kvpc_hot_entry_t {
    atomic_size_t refs;
    kvpc_hot_entry_t *prev, *next; //  LRU list, while kept (under the cache's mutex)
    bool kept;                     //  in the table and on the list
    uint64_t version;
    size_t size;
    char *key; //  NUL-terminated, after the value
    unsigned char data[];
};

typedef struct {
    uint64_t hash;
    uint32_t reads;
    uint64_t first_ms;
} s_slot_t;

struct _kvpc_hot_cache_t {
    kvpc_hot_cache_t *next_cache; //  the process's list (s_caches)
    char *endpoint;
    size_t users;
    pthread_mutex_t mutex;
    zhashx_t *entries;             //  key -> kvpc_hot_entry_t (the cache's reference)
    kvpc_hot_entry_t *head, *tail; //  LRU: head most recently used
    uint64_t capacity, admit, window_ms, max_object;
    kvpool_hot_cache_stats_t stats;
    s_slot_t slots[ADMIT_SLOTS];
};

static pthread_mutex_t s_mutex = PTHREAD_MUTEX_INITIALIZER;
static kvpc_hot_cache_t *s_caches;

static uint64_t
s_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

//  FNV-1a, 64 bits: spreads keys that differ in their last bytes (block numbers) well.
static uint64_t
s_hash (const char *key, size_t len)
{
    uint64_t hash = 14695981039346656037ull;
    for (size_t i = 0; i < len; i++) {
        hash ^= (unsigned char) key[i];
        hash *= 1099511628211ull;
    }
    return hash;
}

//  ---- entries ------------------------------------------------------------------------------

static kvpc_hot_entry_t *
s_entry_new (const char *key, size_t len, uint64_t version, const void *data, size_t size)
{
    kvpc_hot_entry_t *entry = malloc (sizeof *entry + size + len + 1);
    if (!entry)
        return NULL;
    atomic_init (&entry->refs, 1);
    entry->prev = entry->next = NULL;
    entry->kept = false;
    entry->version = version;
    entry->size = size;
    if (size)
        memcpy (entry->data, data, size);
    entry->key = (char *) entry->data + size;
    memcpy (entry->key, key, len);
    entry->key[len] = 0;
    return entry;
}

void
kvpc_hot_entry_unref (kvpc_hot_entry_t *entry)
{
    if (entry && atomic_fetch_sub (&entry->refs, 1) == 1)
        free (entry);
}

void
kvpc_hot_entry_msg_free (void *data, void *hint)
{
    (void) data;
    kvpc_hot_entry_unref ((kvpc_hot_entry_t *) hint);
}

uint64_t
kvpc_hot_entry_version (const kvpc_hot_entry_t *entry)
{
    return entry->version;
}

const void *
kvpc_hot_entry_data (const kvpc_hot_entry_t *entry)
{
    return entry->data;
}

size_t
kvpc_hot_entry_size (const kvpc_hot_entry_t *entry)
{
    return entry->size;
}

//  ---- the LRU list and the table (the cache's mutex held) ----------------------------------

static void
s_unlink (kvpc_hot_cache_t *self, kvpc_hot_entry_t *entry)
{
    if (entry->prev)
        entry->prev->next = entry->next;
    else
        self->head = entry->next;
    if (entry->next)
        entry->next->prev = entry->prev;
    else
        self->tail = entry->prev;
    entry->prev = entry->next = NULL;
}

static void
s_push_head (kvpc_hot_cache_t *self, kvpc_hot_entry_t *entry)
{
    entry->prev = NULL;
    entry->next = self->head;
    if (self->head)
        self->head->prev = entry;
    self->head = entry;
    if (!self->tail)
        self->tail = entry;
}

//  Takes a kept entry out of the cache and drops the cache's reference.
static void
s_drop (kvpc_hot_cache_t *self, kvpc_hot_entry_t *entry)
{
    s_unlink (self, entry);
    entry->kept = false;
    zhashx_delete (self->entries, entry->key);
    self->stats.bytes -= entry->size;
    self->stats.entries--;
    kvpc_hot_entry_unref (entry);
}

//  Evicts from the tail until extra more bytes fit.
static void
s_make_room (kvpc_hot_cache_t *self, uint64_t extra)
{
    while (self->tail && self->stats.bytes + extra > self->capacity) {
        s_drop (self, self->tail);
        self->stats.evictions++;
    }
}

//  ---- the process's caches -------------------------------------------------------------------

static void
s_apply (kvpc_hot_cache_t *self, uint64_t bytes, uint32_t admit, uint64_t window_ms,
         uint64_t max_object)
{
    pthread_mutex_lock (&self->mutex);
    self->capacity = bytes;
    self->admit = admit ? admit : KVPC_HOT_CACHE_ADMIT;
    self->window_ms = window_ms ? window_ms : KVPC_HOT_CACHE_WINDOW_MS;
    self->max_object = max_object ? max_object : KVPC_HOT_CACHE_MAX_OBJECT;
    self->stats.capacity = bytes;
    s_make_room (self, 0);
    pthread_mutex_unlock (&self->mutex);
}

kvpc_hot_cache_t *
kvpc_hot_cache_acquire (const char *endpoint, uint64_t bytes, uint32_t admit, uint64_t window_ms,
                        uint64_t max_object)
{
    pthread_mutex_lock (&s_mutex);
    kvpc_hot_cache_t *self = s_caches;
    while (self && strcmp (self->endpoint, endpoint) != 0)
        self = self->next_cache;
    if (!self) {
        self = calloc (1, sizeof *self);
        if (self) {
            self->endpoint = strdup (endpoint);
            self->entries = zhashx_new ();
        }
        if (!self || !self->endpoint || !self->entries) {
            if (self) {
                free (self->endpoint);
                zhashx_destroy (&self->entries);
                free (self);
            }
            pthread_mutex_unlock (&s_mutex);
            return NULL;
        }
        //  The table only finds entries; their references are dropped by s_drop.
        pthread_mutex_init (&self->mutex, NULL);
        self->next_cache = s_caches;
        s_caches = self;
    }
    self->users++;
    pthread_mutex_unlock (&s_mutex);
    s_apply (self, bytes, admit, window_ms, max_object);
    return self;
}

void
kvpc_hot_cache_release (kvpc_hot_cache_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpc_hot_cache_t *self = *self_p;
    *self_p = NULL;
    pthread_mutex_lock (&s_mutex);
    if (--self->users == 0) {
        kvpc_hot_cache_t **link = &s_caches;
        while (*link != self)
            link = &(*link)->next_cache;
        *link = self->next_cache;
        while (self->head)
            s_drop (self, self->head);
        zhashx_destroy (&self->entries);
        pthread_mutex_destroy (&self->mutex);
        free (self->endpoint);
        free (self);
    }
    pthread_mutex_unlock (&s_mutex);
}

//  ---- reads ----------------------------------------------------------------------------------

kvpc_hot_entry_t *
kvpc_hot_cache_lookup (kvpc_hot_cache_t *self, const char *key, size_t len)
{
    (void) len;
    pthread_mutex_lock (&self->mutex);
    kvpc_hot_entry_t *entry = (kvpc_hot_entry_t *) zhashx_lookup (self->entries, key);
    if (entry)
        atomic_fetch_add (&entry->refs, 1);
    pthread_mutex_unlock (&self->mutex);
    return entry;
}

void
kvpc_hot_cache_served (kvpc_hot_cache_t *self, kvpc_hot_entry_t *entry)
{
    pthread_mutex_lock (&self->mutex);
    self->stats.hits++;
    if (entry->kept && self->head != entry) {
        s_unlink (self, entry);
        s_push_head (self, entry);
    }
    pthread_mutex_unlock (&self->mutex);
}

void
kvpc_hot_cache_invalidate (kvpc_hot_cache_t *self, kvpc_hot_entry_t *entry)
{
    pthread_mutex_lock (&self->mutex);
    if (entry->kept) {
        s_drop (self, entry);
        self->stats.invalidations++;
    }
    pthread_mutex_unlock (&self->mutex);
}

void
kvpc_hot_cache_missed (kvpc_hot_cache_t *self)
{
    pthread_mutex_lock (&self->mutex);
    self->stats.misses++;
    pthread_mutex_unlock (&self->mutex);
}

//  Counts a read of the key in its admission slot; true when this read admits it.
static bool
s_admits (kvpc_hot_cache_t *self, uint64_t hash)
{
    s_slot_t *slot = &self->slots[hash & (ADMIT_SLOTS - 1)];
    uint64_t now = s_now_ms ();
    if (slot->hash != hash || slot->reads == 0 || now - slot->first_ms > self->window_ms) {
        slot->hash = hash;
        slot->reads = 0;
        slot->first_ms = now;
    }
    if (slot->reads < UINT32_MAX)
        slot->reads++;
    return slot->reads >= self->admit;
}

void
kvpc_hot_cache_offer (kvpc_hot_cache_t *self, const char *key, size_t len, uint64_t version,
                      const void *data, size_t size)
{
    uint64_t hash = s_hash (key, len);
    pthread_mutex_lock (&self->mutex);
    self->stats.misses++;
    bool admit = s_admits (self, hash) && data && version && size <= self->max_object
                 && size <= self->capacity;
    kvpc_hot_entry_t *kept = admit ? zhashx_lookup (self->entries, key) : NULL;
    if (kept && kept->version == version)
        admit = false; //  another thread kept the same version meanwhile
    pthread_mutex_unlock (&self->mutex);
    if (!admit)
        return;
    //  The copy is made outside the lock; another thread may keep the key meanwhile (the
    //  newer entry wins: versions of a key only grow).
    kvpc_hot_entry_t *entry = s_entry_new (key, len, version, data, size);
    if (!entry)
        return;
    pthread_mutex_lock (&self->mutex);
    kept = zhashx_lookup (self->entries, key);
    if (kept && kept->version >= version) {
        pthread_mutex_unlock (&self->mutex);
        kvpc_hot_entry_unref (entry);
        return;
    }
    if (kept)
        s_drop (self, kept);
    s_make_room (self, size);
    if (self->stats.bytes + size <= self->capacity
        && zhashx_insert (self->entries, entry->key, entry) == 0) {
        entry->kept = true;
        s_push_head (self, entry);
        self->stats.bytes += size;
        self->stats.entries++;
        self->stats.admissions++;
        self->slots[hash & (ADMIT_SLOTS - 1)].reads = 0;
        entry = NULL;
    }
    pthread_mutex_unlock (&self->mutex);
    kvpc_hot_entry_unref (entry);
}

void
kvpc_hot_cache_stats (kvpc_hot_cache_t *self, kvpool_hot_cache_stats_t *stats)
{
    pthread_mutex_lock (&self->mutex);
    *stats = self->stats;
    pthread_mutex_unlock (&self->mutex);
}

//  ---- self test ------------------------------------------------------------------------------

void
local_hot_cache_test (bool verbose)
{
    (void) verbose;
    printf (" * local_hot_cache: ");
    kvpc_hot_cache_t *cache = kvpc_hot_cache_acquire ("tcp://test:1", 300, 2, 0, 100);
    assert (cache);
    //  Shared by endpoint: a second acquire is the same cache, with its settings.
    kvpc_hot_cache_t *again = kvpc_hot_cache_acquire ("tcp://test:1", 300, 2, 0, 100);
    assert (again == cache);
    kvpc_hot_cache_release (&again);
    assert (again == NULL);

    char value[100];
    memset (value, 'a', sizeof value);
    //  Admission: the second read keeps it, not the first.
    kvpc_hot_cache_offer (cache, "k1", 2, 7, value, 100);
    assert (!kvpc_hot_cache_lookup (cache, "k1", 2));
    kvpc_hot_cache_offer (cache, "k1", 2, 7, value, 100);
    kvpc_hot_entry_t *entry = kvpc_hot_cache_lookup (cache, "k1", 2);
    assert (entry && kvpc_hot_entry_version (entry) == 7 && kvpc_hot_entry_size (entry) == 100);
    assert (memcmp (kvpc_hot_entry_data (entry), value, 100) == 0);
    kvpc_hot_cache_served (cache, entry);
    kvpool_hot_cache_stats_t stats;
    kvpc_hot_cache_stats (cache, &stats);
    assert (stats.hits == 1 && stats.misses == 2 && stats.admissions == 1 && stats.bytes == 100);

    //  An invalidated entry goes from the cache but stays valid for its holder.
    kvpc_hot_cache_invalidate (cache, entry);
    assert (!kvpc_hot_cache_lookup (cache, "k1", 2));
    assert (memcmp (kvpc_hot_entry_data (entry), value, 100) == 0);
    kvpc_hot_entry_unref (entry);
    kvpc_hot_cache_stats (cache, &stats);
    assert (stats.invalidations == 1 && stats.bytes == 0 && stats.entries == 0);

    //  Too large, ranges and unknown versions are counted, never kept.
    char big[101] = {0};
    kvpc_hot_cache_offer (cache, "big", 3, 1, big, 101);
    kvpc_hot_cache_offer (cache, "big", 3, 1, big, 101);
    kvpc_hot_cache_offer (cache, "r", 1, 1, NULL, 10);
    kvpc_hot_cache_offer (cache, "r", 1, 1, NULL, 10);
    kvpc_hot_cache_offer (cache, "v0", 2, 0, value, 10);
    kvpc_hot_cache_offer (cache, "v0", 2, 0, value, 10);
    assert (!kvpc_hot_cache_lookup (cache, "big", 3) && !kvpc_hot_cache_lookup (cache, "r", 1)
            && !kvpc_hot_cache_lookup (cache, "v0", 2));

    //  LRU: three of 100 bytes fit; a fourth evicts the least recently used.
    const char *keys[] = {"a", "b", "c", "d"};
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < 2; r++)
            kvpc_hot_cache_offer (cache, keys[k], 1, 1, value, 100);
    entry = kvpc_hot_cache_lookup (cache, "a", 1); //  a is now the most recently used
    kvpc_hot_cache_served (cache, entry);
    kvpc_hot_entry_unref (entry);
    for (int r = 0; r < 2; r++)
        kvpc_hot_cache_offer (cache, "d", 1, 1, value, 100);
    entry = kvpc_hot_cache_lookup (cache, "b", 1);
    assert (!entry);
    for (int k = 0; k < 4; k++)
        if (k != 1) {
            entry = kvpc_hot_cache_lookup (cache, keys[k], 1);
            assert (entry);
            kvpc_hot_entry_unref (entry);
        }
    kvpc_hot_cache_stats (cache, &stats);
    assert (stats.evictions == 1 && stats.bytes == 300 && stats.entries == 3);

    //  A newer version replaces the kept one; an older one does not.
    for (int r = 0; r < 2; r++)
        kvpc_hot_cache_offer (cache, "a", 1, 9, big, 100);
    entry = kvpc_hot_cache_lookup (cache, "a", 1);
    assert (entry && kvpc_hot_entry_version (entry) == 9);
    kvpc_hot_entry_unref (entry);
    for (int r = 0; r < 2; r++)
        kvpc_hot_cache_offer (cache, "a", 1, 3, value, 100);
    entry = kvpc_hot_cache_lookup (cache, "a", 1);
    assert (entry && kvpc_hot_entry_version (entry) == 9);
    kvpc_hot_entry_unref (entry);

    //  A smaller size evicts what no longer fits.
    again = kvpc_hot_cache_acquire ("tcp://test:1", 100, 1, 0, 100);
    kvpc_hot_cache_stats (cache, &stats);
    assert (stats.bytes <= 100 && stats.capacity == 100);
    //  admit 1: the first read keeps it.
    kvpc_hot_cache_offer (cache, "e", 1, 1, value, 50);
    entry = kvpc_hot_cache_lookup (cache, "e", 1);
    assert (entry);
    kvpc_hot_cache_release (&again);
    kvpc_hot_cache_release (&cache);
    //  The last holder of an entry outlives the cache.
    assert (memcmp (kvpc_hot_entry_data (entry), value, 50) == 0);
    kvpc_hot_entry_unref (entry);
    printf ("OK\n");
}
