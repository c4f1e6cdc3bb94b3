/*  kv_events_encode.c - vLLM's KV-events batch payload, encoded with msgpack-c.

    The bytes must be those vLLM's msgspec encoder writes (notes: kvpool's research note on
    the KV-events wire format), because some consumers decode by position and type:
    - the batch is an array of exactly 3 (Dynamo decodes a fixed 3-tuple);
    - ts is always a float64 (0xcb), as a Python float is;
    - ints take their smallest form, strings fixstr/str8/..., bytes bin8/..., which is what
      msgpack_pack_uint64, msgpack_pack_str and msgpack_pack_bin choose (never the _fix_
      variants, which would pick a wider form);
    - an event is a map whose first key is "type", then its fields in vLLM's declaration
      order; fields with no default (all of BlockStored's seven, BlockRemoved's two) are
      written even when nil. kvpool's own keys come after them.

    Speed: an event is mostly constant bytes (its tag, its field names, the nils, block_size
    and medium, which are the encoder's). Those are packed once, at kv_events_encoder_new,
    into a prefix (map header to the block_hashes array header) and a suffix (the fields
    after the hash) per kind, so an event costs three appends; the buffer of a batch is
    sized for its events at begin, so it does not grow while it is written. The bytes are the
    same as packing each field in turn (the self test checks them against vLLM's bytes).

    Threads: none of its own; an encoder belongs to one thread.
*/
#include "actors/kv_events_encode.h"

#include <assert.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

//  Constant bytes of one kind of event: [map header .. block_hashes array header] and
//  [the fields after the hash]; with ranks the map header counts two more entries.
typedef struct {
    msgpack_sbuffer prefix[4]; //  by extra keys: + 2 with ranks, + 1 with a version
    msgpack_sbuffer suffix;
} event_bytes_t;

struct _kv_events_encoder_t {
    char *medium;
    uint32_t block_size;
    int data_parallel_rank;
    msgpack_sbuffer buffer;
    msgpack_packer packer;
    size_t expected, added; //  events of the batch begun
    event_bytes_t stored, removed;
    msgpack_sbuffer cleared;
};

static void s_event_pack (msgpack_packer *packer, kv_event_kind_t kind, const char *medium,
                          uint32_t block_size, int part, size_t extra);

static void
s_bytes_init (msgpack_sbuffer *bytes, kv_event_kind_t kind, const char *medium, uint32_t block_size,
              int part, size_t extra)
{
    msgpack_sbuffer_init (bytes);
    msgpack_packer packer;
    msgpack_packer_init (&packer, bytes, msgpack_sbuffer_write);
    s_event_pack (&packer, kind, medium, block_size, part, extra);
}

kv_events_encoder_t *
kv_events_encoder_new (const char *medium, uint32_t block_size, int data_parallel_rank)
{
    kv_events_encoder_t *self = (kv_events_encoder_t *) calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->medium = strdup (medium ? medium : "");
    if (!self->medium) {
        free (self);
        return NULL;
    }
    self->block_size = block_size;
    self->data_parallel_rank = data_parallel_rank;
    msgpack_sbuffer_init (&self->buffer);
    msgpack_packer_init (&self->packer, &self->buffer, msgpack_sbuffer_write);
    event_bytes_t *kinds[] = {&self->stored, &self->removed};
    for (int k = 0; k < 2; k++) {
        kv_event_kind_t kind = k == 0 ? KV_EVENT_STORED : KV_EVENT_REMOVED;
        for (size_t extra = 0; extra < 4; extra++)
            s_bytes_init (&kinds[k]->prefix[extra], kind, self->medium, block_size, 0, extra);
        s_bytes_init (&kinds[k]->suffix, kind, self->medium, block_size, 1, 0);
    }
    s_bytes_init (&self->cleared, KV_EVENT_CLEARED, self->medium, block_size, 0, 0);
    return self;
}

void
kv_events_encoder_destroy (kv_events_encoder_t **self_p)
{
    assert (self_p);
    kv_events_encoder_t *self = *self_p;
    if (self) {
        msgpack_sbuffer_destroy (&self->buffer);
        event_bytes_t *kinds[] = {&self->stored, &self->removed};
        for (int k = 0; k < 2; k++) {
            for (size_t extra = 0; extra < 4; extra++)
                msgpack_sbuffer_destroy (&kinds[k]->prefix[extra]);
            msgpack_sbuffer_destroy (&kinds[k]->suffix);
        }
        msgpack_sbuffer_destroy (&self->cleared);
        free (self->medium);
        free (self);
        *self_p = NULL;
    }
}

static void
s_str (msgpack_packer *packer, const char *text)
{
    size_t len = strlen (text);
    msgpack_pack_str (packer, len);
    msgpack_pack_str_body (packer, text, len);
}

void
kv_events_encoder_begin (kv_events_encoder_t *self, double ts, size_t count)
{
    assert (self);
    msgpack_sbuffer_clear (&self->buffer);
    //  Room for count stored events with ranks and 64-byte keys; more grows as usual.
    size_t room = 32 + count * (self->stored.prefix[3].size + self->stored.suffix.size + 128);
    if (self->buffer.alloc < room) {
        char *data = (char *) realloc (self->buffer.data, room);
        if (data) {
            self->buffer.data = data;
            self->buffer.alloc = room;
        }
    }
    self->expected = count;
    self->added = 0;
    msgpack_pack_array (&self->packer, 3);
    msgpack_pack_double (&self->packer, ts);
    msgpack_pack_array (&self->packer, count);
}

//  The constant parts of an event, field by field: part 0 is the map header, the tag and
//  the block_hashes key with its array header; part 1 the fields after the hash. (The
//  ranks, when there are, follow part 1.)
static void
s_event_pack (msgpack_packer *packer, kv_event_kind_t kind, const char *medium, uint32_t block_size,
              int part, size_t extra)
{
    switch (kind) {
        case KV_EVENT_STORED:
            if (part == 0) {
                msgpack_pack_map (packer, 8 + extra);
                s_str (packer, "type");
                s_str (packer, "BlockStored");
                s_str (packer, "block_hashes");
                msgpack_pack_array (packer, 1);
            }
            else {
                s_str (packer, "parent_block_hash");
                msgpack_pack_nil (packer);
                s_str (packer, "token_ids");
                msgpack_pack_array (packer, 0);
                s_str (packer, "block_size");
                msgpack_pack_uint32 (packer, block_size);
                s_str (packer, "lora_id");
                msgpack_pack_nil (packer);
                s_str (packer, "medium");
                s_str (packer, medium);
                s_str (packer, "lora_name");
                msgpack_pack_nil (packer);
            }
            break;
        case KV_EVENT_REMOVED:
            if (part == 0) {
                msgpack_pack_map (packer, 3 + extra);
                s_str (packer, "type");
                s_str (packer, "BlockRemoved");
                s_str (packer, "block_hashes");
                msgpack_pack_array (packer, 1);
            }
            else {
                s_str (packer, "medium");
                s_str (packer, medium);
            }
            break;
        case KV_EVENT_CLEARED:
            msgpack_pack_map (packer, 1);
            s_str (packer, "type");
            s_str (packer, "AllBlocksCleared");
            break;
    }
}

static void
s_append (kv_events_encoder_t *self, const msgpack_sbuffer *bytes)
{
    msgpack_sbuffer_write (&self->buffer, bytes->data, bytes->size);
}

void
kv_events_encoder_add (kv_events_encoder_t *self, const kv_event_t *event)
{
    assert (self && event);
    assert (self->added < self->expected);
    self->added++;
    if (event->kind == KV_EVENT_CLEARED) {
        s_append (self, &self->cleared);
        return;
    }
    const event_bytes_t *bytes = event->kind == KV_EVENT_STORED ? &self->stored : &self->removed;
    s_append (self, &bytes->prefix[(event->has_ranks ? 2 : 0) + (event->version ? 1 : 0)]);
    if (event->hash_bytes) {
        msgpack_pack_bin (&self->packer, event->hash_len);
        msgpack_pack_bin_body (&self->packer, event->hash_bytes, event->hash_len);
    }
    else
        msgpack_pack_uint64 (&self->packer, event->hash_int);
    s_append (self, &bytes->suffix);
    if (event->has_ranks) {
        s_str (&self->packer, "kvpool_tp_rank");
        msgpack_pack_uint32 (&self->packer, event->tp_rank);
        s_str (&self->packer, "kvpool_pp_rank");
        msgpack_pack_uint32 (&self->packer, event->pp_rank);
    }
    if (event->version) {
        s_str (&self->packer, "kvpool_version");
        msgpack_pack_uint64 (&self->packer, event->version);
    }
}

void *
kv_events_encoder_end (kv_events_encoder_t *self, size_t *size_p)
{
    assert (self && size_p);
    assert (self->added == self->expected);
    msgpack_pack_int (&self->packer, self->data_parallel_rank);
    *size_p = self->buffer.size;
    //  The buffer goes to the caller (who may keep it long: the replay ring), trimmed to its
    //  bytes; the encoder starts a new one at the next batch.
    size_t size = self->buffer.size;
    char *data = msgpack_sbuffer_release (&self->buffer);
    char *trimmed = data && size ? (char *) realloc (data, size) : NULL;
    return trimmed ? trimmed : data;
}

uint64_t
kv_events_hash_from_hex (const char *hex, size_t len)
{
    uint64_t value = 0;
    for (size_t i = 0; i < len; i++) {
        char c = hex[i];
        unsigned digit = c >= '0' && c <= '9'   ? (unsigned) (c - '0')
                         : c >= 'a' && c <= 'f' ? (unsigned) (c - 'a' + 10)
                         : c >= 'A' && c <= 'F' ? (unsigned) (c - 'A' + 10)
                                                : 16;
        if (digit == 16)
            continue;
        value = (value << 4) | digit; //  the high digits shift out: the low 64 bits stay
    }
    return value;
}

//  ---- self test -----------------------------------------------------------------------

static void
s_check (const void *data, size_t size, const char *expected_hex)
{
    char hex[1024];
    assert (size * 2 < sizeof hex);
    for (size_t i = 0; i < size; i++)
        snprintf (hex + 2 * i, 3, "%02x", ((const unsigned char *) data)[i]);
    if (strcmp (hex, expected_hex) != 0) {
        printf ("\nkv_events_encode: got      %s\n                  expected %s\n", hex,
                expected_hex);
        assert (false);
    }
}

void
kv_events_encode_test (bool verbose)
{
    //  Hand-checked against the research note's annotated bytes of vLLM >= 0.24 (the same
    //  layout python3-msgpack writes for the same dicts in order, which reproduced a
    //  fixture msgspec generated from vLLM's own structs).
    kv_events_encoder_t *self = kv_events_encoder_new ("CPU", 4, 0);
    assert (self);
    size_t size;

    //  One BlockStored with a u64 hash (0xcf: the note's first hash), ts 1760000000.5.
    kv_events_encoder_begin (self, 1760000000.5, 1);
    kv_event_t stored = {.kind = KV_EVENT_STORED, .hash_int = 15760518052499183552ULL};
    kv_events_encoder_add (self, &stored);
    void *payload = kv_events_encoder_end (self, &size);
    s_check (payload, size,
             "93"                                     //  array(3): the batch
             "cb41da39de00200000"                     //  ts float64 1760000000.5
             "91"                                     //  events: array(1)
             "88"                                     //  map(8)
             "a474797065ab426c6f636b53746f726564"     //  "type": "BlockStored"
             "ac626c6f636b5f686173686573"             //  "block_hashes":
             "91cfdab89baa7b5857c0"                   //  [u64]
             "b1706172656e745f626c6f636b5f68617368c0" //  "parent_block_hash": nil
             "a9746f6b656e5f69647390"                 //  "token_ids": []
             "aa626c6f636b5f73697a6504"               //  "block_size": 4
             "a76c6f72615f6964c0"                     //  "lora_id": nil
             "a66d656469756da3435055"                 //  "medium": "CPU"
             "a96c6f72615f6e616d65c0"                 //  "lora_name": nil
             "00");                                   //  data_parallel_rank 0
    free (payload);

    //  BlockRemoved with ranks and a small int hash (positive fixint), BlockRemoved with
    //  a bytes hash, AllBlocksCleared; ts 0.0, rank 0.
    kv_events_encoder_begin (self, 0.0, 3);
    kv_event_t removed = {.kind = KV_EVENT_REMOVED,
                          .hash_int = 0x1122334455667788ULL,
                          .has_ranks = true,
                          .tp_rank = 1,
                          .pp_rank = 200};
    kv_events_encoder_add (self, &removed);
    kv_event_t raw = {.kind = KV_EVENT_REMOVED, .hash_bytes = "k1", .hash_len = 2};
    kv_events_encoder_add (self, &raw);
    kv_event_t cleared = {.kind = KV_EVENT_CLEARED};
    kv_events_encoder_add (self, &cleared);
    payload = kv_events_encoder_end (self, &size);
    s_check (payload, size,
             "93cb000000000000000093"
             "85"                                   //  map(5)
             "a474797065ac426c6f636b52656d6f766564" //  "type": "BlockRemoved"
             "ac626c6f636b5f686173686573"           //  "block_hashes":
             "91cf1122334455667788"                 //  [u64]
             "a66d656469756da3435055"               //  "medium": "CPU"
             "ae6b76706f6f6c5f74705f72616e6b01"     //  "kvpool_tp_rank": 1
             "ae6b76706f6f6c5f70705f72616e6bccc8"   //  "kvpool_pp_rank": 200 (uint8)
             "83a474797065ac426c6f636b52656d6f766564"
             "ac626c6f636b5f686173686573"
             "91c4026b31" //  [bin8 "k1"]
             "a66d656469756da3435055"
             "81a474797065b0416c6c426c6f636b73436c6561726564" //  AllBlocksCleared
             "00");
    free (payload);
    kv_events_encoder_destroy (&self);
    assert (self == NULL);
    kv_events_encoder_destroy (&self);

    //  A long medium is str8 (0xd9), as msgspec writes strings of 32 to 255 bytes; an empty
    //  batch is an empty array; the rank is an int.
    self = kv_events_encoder_new ("a-medium-name-of-thirty-two-byte", 16, 3);
    kv_events_encoder_begin (self, 0.0, 0);
    payload = kv_events_encoder_end (self, &size);
    s_check (payload, size, "93cb00000000000000009003");
    free (payload);
    kv_events_encoder_begin (self, 0.0, 1);
    kv_event_t small = {.kind = KV_EVENT_REMOVED, .hash_int = 5};
    kv_events_encoder_add (self, &small);
    payload = kv_events_encoder_end (self, &size);
    s_check (payload, size,
             "93cb00000000000000009183a474797065ac426c6f636b52656d6f766564"
             "ac626c6f636b5f6861736865739105"
             "a66d656469756dd920612d6d656469756d2d6e616d652d6f662d7468697274792d74776f2d62797465"
             "03");
    free (payload);
    kv_events_encoder_destroy (&self);

    //  Hex hashes: the low 64 bits of the number.
    assert (kv_events_hash_from_hex ("ff", 2) == 255);
    assert (kv_events_hash_from_hex ("DAB89BAA7B5857C0", 16) == 15760518052499183552ULL);
    assert (kv_events_hash_from_hex ("0123456789abcdef1122334455667788", 32)
            == 0x1122334455667788ULL);
    assert (kv_events_hash_from_hex ("", 0) == 0);
    if (verbose)
        printf ("\n  payloads match vLLM's bytes\n");
}
