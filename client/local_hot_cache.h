/*  local_hot_cache.h - the per-process hot cache of a client with no node on its machine: whole
    values it read often, kept in its own memory by (key, version), each served only after
    the node said with one EXIST naming the version that the version is still the key's
    (no value bytes travel). Below the read path (resolve.c), which consults it for every get
    while the fast path is off; above nothing but libc (local_hot_cache.c says how it is shared).

      key -> {version, bytes}    least recently used first to go, bounded by bytes
      admission                  a key read `admit` times within `window_ms` is kept by the
                                 read that brought it the admit-th time (1: the first read)
      max_object                 larger values are never kept

    Entries are reference counted: a value served from the cache stays valid for whoever
    holds it (a frame of kvpool_get_batch) after the cache lets go of it.
*/
#ifndef KVPC_LOCAL_HOT_CACHE_H_INCLUDED
#define KVPC_LOCAL_HOT_CACHE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

#define KVPC_HOT_CACHE_ADMIT 2
#define KVPC_HOT_CACHE_WINDOW_MS 60000
#define KVPC_HOT_CACHE_MAX_OBJECT (16u << 20)

typedef struct _kvpc_hot_cache_t kvpc_hot_cache_t;
typedef struct _kvpc_hot_entry_t kvpc_hot_entry_t;

//  The cache of the node at endpoint, shared by every connection of the process to it; made
//  by the first acquire. The settings apply to it at once (a smaller size evicts what no
//  longer fits); 0 for admit, window_ms or max_object means the default. bytes must not be 0.
//  Returns NULL when out of memory. Each acquire is paired with a release.
kvpc_hot_cache_t *kvpc_hot_cache_acquire (const char *endpoint, uint64_t bytes, uint32_t admit,
                                          uint64_t window_ms, uint64_t max_object);
//  Lets go of it; the last release frees every entry no one else holds. Does nothing on
//  NULL; sets *self_p to NULL.
void kvpc_hot_cache_release (kvpc_hot_cache_t **self_p);

//  The entry kept for key (len bytes), with a reference the caller lets go of with
//  kvpc_hot_entry_unref; NULL when none is kept (not counted: the caller counts the read
//  with kvpc_hot_cache_served or kvpc_hot_cache_offer).
kvpc_hot_entry_t *kvpc_hot_cache_lookup (kvpc_hot_cache_t *self, const char *key, size_t len);
uint64_t kvpc_hot_entry_version (const kvpc_hot_entry_t *entry);
const void *kvpc_hot_entry_data (const kvpc_hot_entry_t *entry);
size_t kvpc_hot_entry_size (const kvpc_hot_entry_t *entry);
void kvpc_hot_entry_unref (kvpc_hot_entry_t *entry);
//  The free function of a zmq_msg_t made over an entry's bytes (zmq_msg_init_data with hint
//  the entry, whose reference the message then holds).
void kvpc_hot_entry_msg_free (void *data, void *hint);

//  Counts a read served from entry (a hit) and makes it the most recently used.
void kvpc_hot_cache_served (kvpc_hot_cache_t *self, kvpc_hot_entry_t *entry);
//  The node said entry's version is no longer the key's: the entry goes (if still kept).
void kvpc_hot_cache_invalidate (kvpc_hot_cache_t *self, kvpc_hot_entry_t *entry);

//  Counts a read of key that the cache did not serve (a miss) and that the node answered
//  with bytes: the whole value (data, size) at version, or with data NULL a part of it (a
//  range: counted toward admission, never kept). Keeps a copy when this read admits the key.
//  version 0 (unknown) counts the read and keeps nothing.
void kvpc_hot_cache_offer (kvpc_hot_cache_t *self, const char *key, size_t len, uint64_t version,
                           const void *data, size_t size);
//  Counts a read the cache did not serve and the node did not answer with bytes (a miss).
void kvpc_hot_cache_missed (kvpc_hot_cache_t *self);

//  Its counters now.
void kvpc_hot_cache_stats (kvpc_hot_cache_t *self, kvpool_hot_cache_stats_t *stats);

//  Self test (kvpool-selftest --test local_hot_cache).
void local_hot_cache_test (bool verbose);

#endif
