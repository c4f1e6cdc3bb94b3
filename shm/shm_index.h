/*  shm_index.h - the same-machine read index: key -> where the value is, in shared memory,
    and when each published object was last read from it.

    The replica-manager publishes every committed object it can (key, segment id, offset,
    size) in a hash table in a sealed memfd (shm_index.c). A client of the node's user on the
    same machine maps it read-only and finds a value without asking the node: look the key
    up, copy the bytes out of the mapped segment, then confirm the slot did not change
    meanwhile. A read that raced with a removal fails that check and goes to the node
    instead, so a reader never returns bytes of another object. (The node frees an object's
    space only after it has removed the object from this index.)

    The index is lossy on purpose: an object is not published when its key is too long for
    a slot or its probe run is full, or while it is on disk only. A miss alone therefore
    means "ask the node", never "not found" (but see "Absent keys" below).

    Read stamps: leases without a round trip. A read grants the object a lease (no removal
    without force until --lease-ttl after it). A reader of the index tells the node nothing,
    so it leaves the time of its read in the slot's read stamp, a 64-bit word in a second
    sealed memfd (the stamps: readers must write them, and must not be able to write
    the index itself, which other readers trust). The node, when it decides whether an object
    is leased, takes the later of the leases it granted itself and the last stamp plus the TTL.
    Times are shm_index_clock_ms: CLOCK_MONOTONIC, one clock for every process of a machine
    (a process in a Linux time namespace of its own sees it offset: such a client's index
    reads would lease wrongly, so same-machine clients must share the node's time namespace,
    as containers do unless asked otherwise).

    A stamp is (publication tag << 40 | ms): the tag is the low 24 bits of the slot's sequence
    number divided by two when the object was published, so a stamp left by a reader of an
    object that has since been withdrawn, and its slot given to another object, is not taken
    for a read of the new one. The writer zeroes the stamp while it publishes (seq odd), so a
    reused slot starts unread. A reader only raises the stamp (compare-and-swap), never
    replaces a stamp of a newer publication with its own, and writes it at most once per
    millisecond per slot, so a hot key costs one cache-line write a millisecond, not one a read.

    Why no read is missed. A reader stamps, then (seq_cst fence) confirms the sequence
    number; the node, to remove an object, withdraws it (seq_cst store of the sequence
    number), then (fence) reads the stamp once more (shm_index_remove returns it). Of two
    such pairs at least one sees the other's write: either the reader sees the slot changed
    (its copy is thrown away and it asks the node, which serialises with the removal), or
    the node sees the stamp (the object is leased: the node publishes it again and refuses
    the removal). A read that returns a value was therefore always seen by a removal that
    followed it. A reader that stamps a slot after its object was withdrawn and the slot
    reused writes the old tag, which the node ignores and later readers overwrite.

    The stamp is a reader's claim: the node bounds it by its own clock (a stamp in the future
    counts as now) so a client can lease an object no longer than by reading it.

    Absent keys. A miss in a lossy index says nothing, so without more a reader asks the node
    about every key it does not find, and a batch of absent keys costs a round trip. A node
    that holds every key there is to hold (one without a master: nobody else holds keys it
    could be asked for) vouches for absence (shm_index_set_complete) and counts each key it
    holds but has not published (too long for a slot, its probe run full, on disk only) in a
    counting filter beside the slots (shm_index_unlisted_add, _remove). A reader that reads
    every slot the key could be in, finds it in none, and finds it uncounted, may answer
    "absent" without asking. Why that is true: at every instant a key the node holds is in
    its slot or counted (the node counts a key before it withdraws it from its slot, and
    uncounts it only after publishing it), so a reader that saw it in neither place saw it
    move from slot to filter after it read the slot, which the release and acquire fences
    on both sides rule out, or from filter to slot, which a sequence number in the header
    (a seqlock, bumped around every uncounting and around changes that drop and re-add a
    key: shm_index_moves_begin, _end) shows: a batch's answers of absence stand only if it
    is unchanged and even from the batch's start to its end (shm_index_batch_absent_holds).
    Counters stuck at their top and false positives only send a key to the node.

    Layout: a 4 KiB header (with the stamps' name), then slot_count slots of 256 bytes, each
    guarded by a sequence number (odd while the writer changes it), then 4 one-byte counters
    a slot for the unlisted keys; the stamps object holds slot_count 8-byte stamps. One
    writer (the replica-manager's thread), any number of readers in any process.
*/
#ifndef SHM_INDEX_H_INCLUDED
#define SHM_INDEX_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SHM_INDEX_KEY_MAX 208 //  longest key a slot holds

typedef struct _shm_index_t shm_index_t;

//  A key's entry as a reader saw it, to be confirmed after the copy.
typedef struct {
    uint32_t segment_id;
    uint64_t offset;
    uint64_t size;
    const void *slot;
    void *stamp; //  the slot's read stamp
    uint64_t seq;
    uint64_t hash;                //  the key's hash (readers may use it to remember keys cheaply)
    uint64_t version;             //  the value's (Reply.versions)
    bool cache;                   //  a cache copy of a value other nodes hold (the host hot cache)
    const _Atomic int64_t *until; //  the header's bound on reading it (cache or own copies)
} shm_index_hit_t;

//  Creates an index of at least slots slots (rounded up to a power of two) in a new sealed
//  memfd, and its read stamps in another; this process lists it under name (at most 63
//  characters, shm_index_make_name's), which shm_index_open and shm_index_published_name
//  take. Returns NULL on failure. Caller owns the return value.
shm_index_t *shm_index_create (const char *name, size_t slots);

//  Maps an existing index read-only and its read stamps read-write, by its published name
//  ("/proc/<pid>/fd/<fd>"), by the name this process created it under, or by a shm_open name
//  (a node from before the memfds). Returns NULL if either object does not exist, cannot be
//  opened so, or is not an index: a reader that cannot leave its read stamps must not read
//  from the index.
shm_index_t *shm_index_open (const char *name);

//  Unmaps; the creator also closes both memfds (they go with the last process holding them)
//  and takes the index off this process's list. Does nothing on NULL; sets *self_p to NULL.
void shm_index_destroy (shm_index_t **self_p);

//  The creator's: the index's published name, "/proc/<pid>/fd/<fd>", what a client opens.
//  A reader's: the name it opened it by.
const char *shm_index_name (shm_index_t *self);
//  The name of the read stamps' object.
const char *shm_index_reads_name (shm_index_t *self);
size_t shm_index_slots (shm_index_t *self);

//  Writes into buf the published name of the index this process created under name (what
//  the node tells clients to open). Returns 0, or -1 (and "" in buf) while there is none.
int shm_index_published_name (const char *name, char *buf, size_t size);

//  The 64-bit hash of a key the index uses (never 0): XXH3-64, about half the time of a
//  word-at-a-time multiply chain on connector keys of ~100 bytes. The replica-manager's
//  table uses it too.
uint64_t shm_index_hash (const char *key, size_t len);

//  The clock of read stamps and leases: CLOCK_MONOTONIC in whole milliseconds (the clock
//  CZMQ's zclock_mono reads), the same in every process of the machine.
int64_t shm_index_clock_ms (void);

//  Writes "/kvpool-<pid>-<tag>-<instance>-index" into buf: the name a node's actors know its
//  index by (not a file: the index is a memfd).
void shm_index_make_name (char *buf, size_t size, const char *instance);

//  Writer: publishes an object of version, unread; cache: a copy of the host hot cache,
//  which readers take only until the time shm_index_set_cache_until set. Returns its slot
//  number, or -1 if it was not published.
int64_t shm_index_insert (shm_index_t *self, const char *key, size_t key_len, uint32_t segment_id,
                          uint64_t offset, uint64_t size, uint64_t version, bool cache);
//  Writer: cache copies are read until until_ms (shm_index_clock_ms), and not from then on
//  (0, as at creation: not at all). The node's cache lease: it moves it on with each
//  heartbeat its master answers, so readers of a node stopped or cut off past the lease
//  leave its cache copies alone (docs/tiers.md, "The hot cache").
void shm_index_set_cache_until (shm_index_t *self, int64_t until_ms);
//  Writer: the node's own copies (every entry not a cache copy) are read until until_ms, and
//  not from then on: the node's own lease, moved on while it runs, 0 while it must not serve
//  them (stopped past its lease, a restart, until its master confirms what it holds:
//  infra/config.h, kvp_lease_t). At creation: INT64_MAX (a node without a master: always).
//  So the readers of a node that is frozen stop when its lease runs out, as its own threads
//  do, rather than read on a copy whose removal completed without it.
void shm_index_set_own_until (shm_index_t *self, int64_t until_ms);
//  Writer: whether the node vouches for absent keys: it holds no key unless published or
//  counted unlisted, and no other node holds keys for it (docs/architecture.md). Not at
//  creation: set it before any key is held, or count every key held so far first.
void shm_index_set_complete (shm_index_t *self, bool complete);
//  Writer: key is held but not published (not in its slot); counted before it is
//  withdrawn from its slot, or when it is held without ever being published.
void shm_index_unlisted_add (shm_index_t *self, const char *key, size_t key_len);
//  Writer: key, counted by shm_index_unlisted_add, is published now (held: counted down
//  after the insert, and batches under way answer no absence) or no longer held (dropped).
void shm_index_unlisted_remove (shm_index_t *self, const char *key, size_t key_len, bool held);
//  Writer: brackets changes in which a held key leaves the index and the filter and comes
//  back (an upsert drops the old object before the new one enters): no batch that overlaps
//  them answers "absent". Not nested.
void shm_index_moves_begin (shm_index_t *self);
void shm_index_moves_end (shm_index_t *self);
//  Writer: withdraws what insert published in slot (slot < 0 does nothing). Returns the
//  object's last read (as shm_index_last_read), looked at after the withdrawal was visible:
//  no read of it can be confirmed later.
int64_t shm_index_remove (shm_index_t *self, int64_t slot);
//  Writer: when the object published in slot was last read from the index (ms of
//  shm_index_clock_ms), or 0 if it was not read since it was published. Readers wrote it:
//  take it as at most now.
int64_t shm_index_last_read (shm_index_t *self, int64_t slot);
//  Number of published entries.
size_t shm_index_count (shm_index_t *self);

//  Reader: finds key. Returns true and fills hit when it is published.
bool shm_index_lookup (shm_index_t *self, const char *key, size_t key_len, shm_index_hit_t *hit);
//  Reader, a batch of keys looked up in order: each lookup first starts loading the slot of
//  the key SHM_INDEX_AHEAD places further on. A large index is mostly out of the cache, so
//  each lookup waits for memory (and often a page walk); one after the other, a batch pays
//  those waits in turn, while with the slots loading ahead they overlap.
//      shm_index_batch_t batch;
//      shm_index_batch_start (&batch, index, keys, lens, count);      // lens NULL: strlen
//      for (i = 0; i < count; i++)
//          if (shm_index_batch_lookup (&batch, i, &hit)) ...          // i in order, from 0;
//                                                                      // stopping early is fine
//  The keys must stay as they are until the last lookup.
#define SHM_INDEX_AHEAD 8
typedef struct {
    shm_index_t *index;
    const char *const *keys;
    const char *lens; //  the first key's length, or NULL
    size_t lens_step; //  bytes from one length to the next
    size_t count;
    uint64_t hashes[SHM_INDEX_AHEAD]; //  of the keys loading, by position modulo AHEAD
    size_t key_lens[SHM_INDEX_AHEAD]; //  their lengths (strlen once, when lens is NULL)
    uint64_t absent_seq;              //  the header's at the start, 0 if no absence answers
} shm_index_batch_t;

//  What a lookup in a batch found: the key (hit filled); nothing the reader may act on (ask
//  the node); or that the node does not hold the key, if shm_index_batch_absent_holds
//  says so after the batch's last lookup (else ask the node about those keys too).
typedef enum { SHM_INDEX_ASK, SHM_INDEX_FOUND, SHM_INDEX_ABSENT } shm_index_find_t;

void shm_index_batch_start (shm_index_batch_t *batch, shm_index_t *self, const char *const *keys,
                            const size_t *lens, size_t count);
//  As shm_index_batch_start, the lengths step bytes apart: a field of an array of structs
//  (libkvpool's keys carry theirs in the request's ProtobufCBinaryData).
void shm_index_batch_start_step (shm_index_batch_t *batch, shm_index_t *self,
                                 const char *const *keys, const size_t *lens, size_t step,
                                 size_t count);
//  As shm_index_lookup of keys[i].
bool shm_index_batch_lookup (shm_index_batch_t *batch, size_t i, shm_index_hit_t *hit);
//  Looks keys[i] up, saying whether it is absent too (shm_index.h, "Absent keys").
shm_index_find_t shm_index_batch_find (shm_index_batch_t *batch, size_t i, shm_index_hit_t *hit);
//  After a batch's lookups: whether the SHM_INDEX_ABSENT answers it gave stand.
bool shm_index_batch_absent_holds (const shm_index_batch_t *batch);

//  Reader: after copying the bytes (or, for a read that needs no bytes, after the lookup),
//  records the read at now_ms (shm_index_clock_ms, taken after the copy) in the slot's read
//  stamp and says whether the entry stayed the same all along, and whether the node still
//  served it at now_ms (its lease: shm_index_set_own_until, _set_cache_until). Only then are
//  the copied bytes the object's, and only then does the read count.
bool shm_index_confirm (const shm_index_hit_t *hit, int64_t now_ms);

void shm_index_test (bool verbose);

#endif
