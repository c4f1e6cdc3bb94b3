/*  touch_table.h - which keys had their read lease renewed lately, remembered by hash.

    A reader that serves values from the read index itself (a same-machine client, or the
    node's api) must still renew their leases at the replica-manager, but not on every read
    of a hot key. This table says whether a key is due: not renewed within the interval. It
    is a direct-mapped cache of key hashes (shm_index_hash): a collision only costs an
    extra renewal, never a missed one.

    Threads: one at a time.
*/
#ifndef TOUCH_TABLE_H_INCLUDED
#define TOUCH_TABLE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct _touch_table_t touch_table_t;

//  A table of slots entries (a power of two), for renewals at most every interval_ms.
//  Returns NULL when out of memory. Caller owns the return value.
touch_table_t *touch_table_new (size_t slots, int64_t interval_ms);

//  Does nothing on NULL; sets *self_p to NULL.
void touch_table_destroy (touch_table_t **self_p);

//  Whether the key with this hash is due for renewal at now_ms; if it is, it counts as
//  renewed from now on.
bool touch_table_due (touch_table_t *self, uint64_t hash, int64_t now_ms);

void touch_table_test (bool verbose);

#endif
