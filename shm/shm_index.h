/*  shm_index.h - the same-machine read index: key -> where the value is, in shared memory.

    The replica-manager publishes every committed object it can (key, segment id, offset,
    size) in a hash table in a POSIX shared-memory object. A client on the same machine maps
    it read-only and finds a value without asking the node: look the key up, copy the bytes
    out of the mapped segment, then check the slot did not change meanwhile. A read that
    raced with a removal fails that check and goes to the node instead, so a reader never
    returns bytes of another object. (The node frees an object's space only after it has
    removed the object from this index.)

    The index is lossy on purpose: an object is not published when its key is too long for
    a slot or its probe run is full, and removing an entry may hide another one behind it.
    A miss therefore means "ask the node", never "not found".

    Layout: a 4 KiB header, then slot_count slots of 256 bytes, each guarded by a sequence
    number (odd while the writer changes it). One writer (the replica-manager's thread),
    any number of readers in any process.
*/
#ifndef SHM_INDEX_H_INCLUDED
#define SHM_INDEX_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHM_INDEX_KEY_MAX 216 //  longest key a slot holds

typedef struct _shm_index_t shm_index_t;

//  A key's entry as a reader saw it, to be checked again after the copy.
typedef struct {
    uint32_t segment_id;
    uint64_t offset;
    uint64_t size;
    const void *slot;
    uint64_t seq;
    uint64_t hash; //  the key's hash (readers may use it to remember keys cheaply)
} shm_index_hit_t;

//  Creates an index of at least slots slots (rounded up to a power of two) in a new
//  shared-memory object called name. Returns NULL on failure. Caller owns the return value.
shm_index_t *shm_index_create (const char *name, size_t slots);

//  Maps an existing index read-only. Returns NULL if it does not exist or is not an index.
shm_index_t *shm_index_open (const char *name);

//  Unmaps; the creator also unlinks the name. Does nothing on NULL; sets *self_p to NULL.
void shm_index_destroy (shm_index_t **self_p);

const char *shm_index_name (shm_index_t *self);
size_t shm_index_slots (shm_index_t *self);

//  The 64-bit hash of a key the index uses (never 0). Mixes 8 bytes per step: keys are long
//  (a connector key is ~100 bytes). The replica-manager's table uses it too.
uint64_t shm_index_hash (const char *key, size_t len);

//  Writes "/kvpool-<pid>-<instance>-index" into buf.
void shm_index_make_name (char *buf, size_t size, const char *instance);

//  Writer: publishes an object. Returns its slot number, or -1 if it was not published.
int64_t shm_index_insert (shm_index_t *self, const char *key, size_t key_len, uint32_t segment_id,
                          uint64_t offset, uint64_t size);
//  Writer: withdraws what insert published in slot (slot < 0 does nothing).
void shm_index_remove (shm_index_t *self, int64_t slot);
//  Number of published entries.
size_t shm_index_count (shm_index_t *self);

//  Reader: finds key. Returns true and fills hit when it is published.
bool shm_index_lookup (shm_index_t *self, const char *key, size_t key_len, shm_index_hit_t *hit);
//  Reader: after copying the bytes, whether the entry stayed the same all along. Only then
//  are the copied bytes the object's.
bool shm_index_still_valid (const shm_index_hit_t *hit);

void shm_index_test (bool verbose);

#endif
