/*  object_table.h - the replica-manager's key -> object table: open addressing with linear
    probing over one array of (hash, entry) slots, grown at 70% load, deletion by backward
    shift (no tombstones).

    Why not CZMQ's zhashx: a zhashx entry is a separate allocation found through a chain, and
    every hit compares keys with strcmp; on a million objects an eviction cycle spent most of
    its time there. Here a slot holds the key's full 64-bit hash, so a probe compares keys
    only when the hashes match (practically only on the hit), a delete by entry compares
    pointers only, and the slots of a probe run share cache lines.

    Entries are the caller's (the table never frees them); their keys are NUL-terminated and
    must not change while they are in the table (key_of reads them).
    Threads: none of its own; one thread uses a table.
*/
#ifndef OBJECT_TABLE_H_INCLUDED
#define OBJECT_TABLE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct _object_table_t object_table_t;

//  The key of an entry.
typedef const char *(object_table_key_fn) (const void *entry);

//  Caller owns the return value and must destroy it. NULL when out of memory.
object_table_t *object_table_new (object_table_key_fn *key_of);
//  Does nothing on NULL; sets *self_p to NULL. The entries are not touched.
void object_table_destroy (object_table_t **self_p);

//  The entry whose key is key, or NULL.
void *object_table_lookup (object_table_t *self, const char *key);
//  Adds entry, whose key must not be in the table. Returns 0, or -1 when out of memory.
int object_table_insert (object_table_t *self, void *entry);
//  Takes entry out of the table (nothing if it is not there).
void object_table_delete (object_table_t *self, void *entry);
size_t object_table_size (object_table_t *self);

//  Iteration in slot order: first, then next until NULL. The table must not change
//  meanwhile (collect what to delete, then delete).
void *object_table_first (object_table_t *self);
void *object_table_next (object_table_t *self);

//  A walk with the caller's own cursor (*slot, from 0), which may stop and go on later: the
//  entry at or after *slot, *slot moved past it; NULL at the end. The table may change
//  between calls: an entry moved meanwhile (a growth, a deletion's shift) may be seen twice
//  or not at all, which is fine for counting, not for anything exact.
void *object_table_walk (object_table_t *self, size_t *slot);

void object_table_test (bool verbose);

#endif
