/*  hot_cache.h - which remote keys earn a copy in the host hot cache (docs/tiers.md, "The
    hot cache"): the admission filter the api keeps for its node's reads of values that only
    other nodes hold.

    A key is admitted on its --hot-cache-admit-th read within --hot-cache-window (a read that
    reaches the count after the window has passed starts the count again). The filter is a
    table of 65536 slots, each the hash of one key with its count and the time of its first
    counted read; two keys that share a slot take it from each other, so the filter forgets
    (never invents) reads: a key may need a few more reads to be admitted under a flood of
    others, which is what a cache wants of a key read once. An admitted key is not admitted
    again for a second (its copy is being made).

    Threads: none of its own; the api's thread owns it.
*/
#ifndef HOT_CACHE_H_INCLUDED
#define HOT_CACHE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct _hot_cache_t hot_cache_t;

//  Caller owns the return value (NULL when out of memory).
hot_cache_t *hot_cache_new (uint64_t admit, uint64_t window_ms);
//  Does nothing on NULL; sets *self_p to NULL.
void hot_cache_destroy (hot_cache_t **self_p);
//  Settings changed at run time.
void hot_cache_set (hot_cache_t *self, uint64_t admit, uint64_t window_ms);

//  Counts a read of key (of key_len bytes) at now (ms). Returns true when this read admits
//  it: the caller makes its copy.
bool hot_cache_read (hot_cache_t *self, const char *key, size_t key_len, int64_t now);

void hot_cache_test (bool verbose);

#endif
