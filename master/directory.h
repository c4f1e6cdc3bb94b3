/*  directory.h - the master's metadata: key -> {size, the nodes that hold it, state}.

    The master of a cluster knows which nodes hold each object, never where inside a node
    (each node's allocator chooses its own offsets, DESIGN §4). An entry is one allocation:
    a small header and the key after it, found through object_table.h (open addressing,
    64-bit hashes in the slots). Measured at 10 million objects: 76 bytes per
    object besides a 64-byte key (kvpool-bench --only master, docs/scaling.md).

    An entry is pending from PLACE until COMMIT (invisible to LOCATE; a second PLACE of the
    key is refused) or until its reservation's token is swept by the master's put timeout.
    Nodes are named by their slot in the master's node table (node_table.h), at most
    KVP_MAX_REPLICAS holders an entry.

    Threads: none of its own; the master actor's thread owns a directory.
*/
#ifndef DIRECTORY_H_INCLUDED
#define DIRECTORY_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/contract.h"

typedef struct _directory_t directory_t;

typedef enum { DIR_PENDING = 1, DIR_COMMITTED = 2 } dir_state_t;

typedef struct {
    uint64_t size;
    //  PENDING: the reservation (directory_reserve's); COMMITTED: the commit's (0: known
    //  from an INVENTORY alone). One sequence for both, so a commit's token says when it
    //  came: a node away since an earlier token cannot hold this value (master.c).
    uint64_t token;
    //  COMMITTED: the value's version (as PLACE gave it, or as a node reported it; 0:
    //  unknown), which cache copies must have (CACHE)
    uint64_t version;
    uint8_t state; //  dir_state_t
    uint8_t holder_count;
    uint8_t cache_mask; //  bit i: holders[i] keeps a cache copy, not a replica
    //  COMMITTED: the replicas its put asked for (0: unknown, as 1), or as many as nodes
    //  reported holding it (INVENTORY): fewer live replicas than this is a repair's work
    //  (master/repair.c). An eviction (DROPPED) lowers it: a node let its copy go for room.
    uint8_t want;
    uint16_t holders[KVP_MAX_REPLICAS]; //  node slots
    char key[];                         //  NUL-terminated
} dir_entry_t;

//  Caller owns the return value. NULL when out of memory.
directory_t *directory_new (void);
//  Frees every entry. Does nothing on NULL; sets *self_p to NULL.
void directory_destroy (directory_t **self_p);

dir_entry_t *directory_find (directory_t *self, const char *key);
//  A new pending entry for key (which must not be in the directory). NULL when out of memory.
dir_entry_t *directory_reserve (directory_t *self, const char *key, size_t key_len, uint64_t size,
                                uint64_t token);
//  Makes entry committed with token, held by holders[0..count) (duplicates and count past
//  KVP_MAX_REPLICAS ignored).
void directory_commit (directory_t *self, dir_entry_t *entry, const uint16_t *holders, size_t count,
                       uint64_t token);
//  Whether node is one of entry's holders.
bool directory_holds (const dir_entry_t *entry, uint16_t node);
//  A node reports it holds key (INVENTORY): the entry is made (committed) or the node added
//  to its holders. A pending entry becomes committed. Returns the entry, or NULL when out of
//  memory or the entry has all the holders it can take.
dir_entry_t *directory_add_holder (directory_t *self, const char *key, size_t key_len,
                                   uint64_t size, uint16_t node);
//  Adds node to a committed entry's holders as a cache copy (the host hot cache). Returns 0
//  (also when node holds it already), or -1 when the entry is pending or full.
int directory_add_cache (dir_entry_t *entry, uint16_t node);
//  Makes node a holder of a committed entry's replica (a repair's copy, master/repair.c): a
//  cache copy it kept becomes a replica. Returns 1 when node was added, 0 when it held the
//  key already (a cache copy now counted as a replica), -1 when the entry is pending or full.
int directory_add_replica (dir_entry_t *entry, uint16_t node);
//  Holders of entry that keep a replica (not a cache copy).
uint8_t directory_replicas (const dir_entry_t *entry);
//  Whether entry's holder i keeps a cache copy.
bool directory_is_cache (const dir_entry_t *entry, uint8_t i);
//  Takes node out of entry's holders; when none is left the entry is removed (and freed).
//  Returns true when the entry was removed.
bool directory_drop_holder (directory_t *self, dir_entry_t *entry, uint16_t node);
//  Removes and frees entry.
void directory_remove (directory_t *self, dir_entry_t *entry);
//  Takes node out of every entry (a dead or re-registering node). Returns the entries removed
//  because node was their last holder; *held_p (optional) the entries node held.
size_t directory_drop_node (directory_t *self, uint16_t node, size_t *held_p);
//  Removes every committed entry. Returns how many.
size_t directory_remove_all (directory_t *self);

size_t directory_size (directory_t *self);
//  Committed entries.
size_t directory_committed (directory_t *self);

//  Iteration (the directory must not change meanwhile).
dir_entry_t *directory_first (directory_t *self);
dir_entry_t *directory_next (directory_t *self);

void directory_test (bool verbose);

#endif
