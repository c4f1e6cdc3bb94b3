/*  lookup_request.h - decoder of the lookup/reset admin channel's requests (DESIGN section 6).

    A pure module: it turns the frames of one request (the routing envelope already removed)
    into a lookup_request_t, or refuses them with a short reason. It opens no socket, keeps no
    state and uses no CZMQ, so the libFuzzer target (lookup_request_fuzz.c) drives it directly.
    Safe to call from any thread; each call owns what it returns.

    Wire forms (integers big-endian unsigned):
        [b"lookup"][token_len:4][msgpack array of hex strings]     tagged msgpack
        [b"lookup"][token_len:4][hash_len:2][raw hashes, concatenated]   tagged binary
        [b"lookup"][token_len:4][hash_len:2][raw hashes][apply_eagle:1]  tagged binary with
                                                                   vLLM's apply_eagle flag
        [token_len:4][msgpack array of hex strings]                untagged (two frames)
        [b"reset"]   [b"ping"]   [b"stats"]                        one frame each
    A first frame equal to a tag is always read as that tag (so a 4-byte token_len that spells
    "ping" is a ping with an extra frame, refused); the untagged form is a two-frame message
    whose first frame is exactly 4 bytes and not a tag.

    Hashes come out as lowercase hex strings (uppercase hex in a msgpack entry is accepted and
    lowered, since store keys are lowercase). Refused: any other tag, a missing or extra frame,
    a token_len frame that is not 4 bytes or a hash_len frame that is not 2, bad or truncated
    msgpack, trailing bytes after the array, an entry that is not a string, an empty, odd-length
    or non-hex string, a blob that is not a multiple of hash_len, hash_len 0 with data, an
    apply_eagle frame that is not one byte 0 or 1, and more
    than LOOKUP_REQUEST_MAX_HASHES hashes.

    msgpack is read by a small bounded reader of exactly this shape (array of str) rather than
    by msgpack-c's msgpack_unpack_next: msgpack-c allocates count x 24 bytes for an array as
    soon as it reads the array's header, so a 5-byte frame could make it ask for 100 GB. The
    self test and the fuzz target check this reader against msgpack-c's packer and unpacker.
*/
#ifndef LOOKUP_REQUEST_H_INCLUDED
#define LOOKUP_REQUEST_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  Most hashes one lookup may carry; more is refused (the reply is b"\x00").
#define LOOKUP_REQUEST_MAX_HASHES 1000000
//  Longest hash in bytes (what a 2-byte hash_len can say); as hex, twice that.
#define LOOKUP_REQUEST_MAX_HASH_BYTES 65535

typedef enum {
    LOOKUP_REQUEST_LOOKUP = 1,
    LOOKUP_REQUEST_RESET,
    LOOKUP_REQUEST_PING,
    LOOKUP_REQUEST_STATS
} lookup_request_type_t;

typedef enum {
    LOOKUP_FORM_NONE = 0,    //  not a lookup
    LOOKUP_FORM_MSGPACK,     //  [b"lookup"][token_len][msgpack]
    LOOKUP_FORM_BINARY,      //  [b"lookup"][token_len][hash_len][blob]
    LOOKUP_FORM_UNTAGGED,    //  [token_len][msgpack]
    LOOKUP_FORM_BINARY_EAGLE //  [b"lookup"][token_len][hash_len][blob][apply_eagle: 0 or 1]
} lookup_form_t;

//  One frame of a request, as received.
typedef struct {
    const void *data;
    size_t size;
} lookup_frame_t;

//  A decoded request. Read-only for the caller.
typedef struct {
    lookup_request_type_t type;
    lookup_form_t form;
    uint32_t token_len; //  lookups only
    bool apply_eagle;   //  lookups: false only when the eagle frame says 0 (docs/lookup.md)
    size_t hash_count;  //  lookups only; may be 0
    char **hashes;      //  hash_count NUL-terminated lowercase hex strings
    size_t *hash_lens;  //  their lengths (even, > 0)
    char *text_;        //  storage of the strings
} lookup_request_t;

//  Decodes count frames. Returns a new request, or NULL with *reason_p set to a static
//  English reason (reason_p may be NULL). Caller owns the return value and must destroy it.
lookup_request_t *lookup_request_decode (const lookup_frame_t *frames, size_t count,
                                         const char **reason_p);

//  Destroys a request; does nothing on NULL; sets *self_p to NULL.
void lookup_request_destroy (lookup_request_t **self_p);

//  Names of the types and forms, for logs ("lookup", "binary", ...).
const char *lookup_request_type_name (lookup_request_type_t type);
const char *lookup_request_form_name (lookup_form_t form);

void lookup_request_test (bool verbose);

#endif
