/*  kv_events_encode.h - vLLM's KV-events batch payload, encoded with msgpack-c.

    One payload is what vLLM's ZmqEventPublisher puts in frame 3 of a PUB message: a msgpack
    array [ts float64, events array, data_parallel_rank int], each event a map tagged by
    "type" (vLLM >= 0.24, map-encoded events; docs/kv_events.md has the bytes):

        {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": nil,
         "token_ids": [], "block_size": N, "lora_id": nil, "medium": M, "lora_name": nil}
        {"type": "BlockRemoved", "block_hashes": [h], "medium": M}
        {"type": "AllBlocksCleared"}

    kvpool knows keys, not tokens: token_ids is always empty, and there is no parent. A key
    that follows the lookup key template carries its hash as an unsigned 64-bit int and its
    ranks in two extra keys, "kvpool_tp_rank" and "kvpool_pp_rank" (unknown keys are ignored
    by every known decoder); any other key is its hash itself, as bytes.

    A pure module: no sockets, no clock, no state beyond its output buffer. An encoder belongs
    to one thread.
*/
#ifndef KV_EVENTS_ENCODE_H_INCLUDED
#define KV_EVENTS_ENCODE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    KV_EVENT_STORED = 1,  //  BlockStored: a key became visible
    KV_EVENT_REMOVED = 2, //  BlockRemoved: a visible key went (removed, evicted, lost)
    KV_EVENT_CLEARED = 3  //  AllBlocksCleared: every key went (reset, remove-all)
} kv_event_kind_t;

typedef struct {
    kv_event_kind_t kind;
    //  The block hash: hash_int when hash_bytes is NULL, else hash_len bytes.
    uint64_t hash_int;
    const void *hash_bytes;
    size_t hash_len;
    //  Ranks parsed from the key (only with an int hash).
    bool has_ranks;
    uint32_t tp_rank, pp_rank;
    //  The object's version (0: none), as kvpool's key "kvpool_version" after vLLM's fields.
    uint64_t version;
} kv_event_t;

typedef struct _kv_events_encoder_t kv_events_encoder_t;

//  An encoder whose events say medium (copied) and block_size, and whose batches carry
//  data_parallel_rank. Caller owns the return value and must destroy it.
kv_events_encoder_t *kv_events_encoder_new (const char *medium, uint32_t block_size,
                                            int data_parallel_rank);

//  Destroys; does nothing on NULL; sets *self_p to NULL.
void kv_events_encoder_destroy (kv_events_encoder_t **self_p);

//  Starts a batch of exactly count events, stamped ts (seconds since the epoch).
void kv_events_encoder_begin (kv_events_encoder_t *self, double ts, size_t count);

//  Adds one event to the batch begun.
void kv_events_encoder_add (kv_events_encoder_t *self, const kv_event_t *event);

//  Ends the batch: returns its payload, size in *size_p. Caller owns the return value (a
//  malloc'd buffer) and must free it.
void *kv_events_encoder_end (kv_events_encoder_t *self, size_t *size_p);

//  The block hash vLLM gives the block whose hash a key writes in hex: the low 64 bits of
//  the number the hex digits write (int(hex, 16) & (2**64 - 1)); the same as vLLM's
//  int.from_bytes(digest, "big") & (2**64 - 1) when the key holds the digest's hex. Only
//  hex digits are read; len may be any length.
uint64_t kv_events_hash_from_hex (const char *hex, size_t len);

void kv_events_encode_test (bool verbose);

#endif
