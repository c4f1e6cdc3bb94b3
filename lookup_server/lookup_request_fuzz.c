/*  lookup_request_fuzz.c - libFuzzer target: arbitrary multipart messages into the decoder of
    the lookup/reset admin channel (lookup_request.c), then into key expansion (lookup_keys.c).

    Built by tests/fuzz/fuzz.mk with clang -fsanitize=fuzzer,address,undefined into
    build/bin/lookup-fuzz; `make fuzz` runs it for a while, tests/extra/fuzz.sh briefly
    over the committed seed corpus tests/fuzz/lookup/.

    Input format: a sequence of frames, each a 2-byte big-endian length and that many bytes;
    a length running past the end takes what is left. So "\0\6lookup\0\4\0\0\0\x10..." is
    [b"lookup"][token_len 16][...]. Up to 64 frames; the rest of the input is ignored.

    Besides the sanitizers, it checks what an accepted request promises: every hash is
    non-empty lowercase hex of even length; a msgpack form decodes the same way with msgpack-c
    (safe to ask once our reader has bounded the counts); a binary form covers its blob
    exactly; and the keys expanded from the hashes end with them. Single-threaded.
*/
#include <assert.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lookup_server/lookup_keys.h"
#include "lookup_server/lookup_request.h"

#define MAX_FRAMES 64

static void
s_check (bool condition, const char *what)
{
    if (!condition) {
        fprintf (stderr, "lookup-fuzz: broken promise: %s\n", what);
        abort ();
    }
}

static void
s_check_msgpack (const lookup_request_t *request, const lookup_frame_t *frame)
{
    msgpack_unpacked unpacked;
    msgpack_unpacked_init (&unpacked);
    size_t offset = 0;
    int rc = msgpack_unpack_next (&unpacked, (const char *) frame->data, frame->size, &offset);
    s_check (rc == MSGPACK_UNPACK_SUCCESS, "msgpack-c decodes what we accepted");
    s_check (offset == frame->size, "msgpack-c uses the whole frame");
    msgpack_object array = unpacked.data;
    s_check (array.type == MSGPACK_OBJECT_ARRAY, "msgpack-c sees an array");
    s_check (array.via.array.size == request->hash_count, "same number of hashes");
    for (uint32_t i = 0; i < array.via.array.size; i++) {
        msgpack_object entry = array.via.array.ptr[i];
        s_check (entry.type == MSGPACK_OBJECT_STR, "msgpack-c sees a string");
        s_check (entry.via.str.size == request->hash_lens[i], "same hash length");
        for (uint32_t j = 0; j < entry.via.str.size; j++) {
            char c = entry.via.str.ptr[j];
            if (c >= 'A' && c <= 'F')
                c = (char) (c - 'A' + 'a');
            s_check (c == request->hashes[i][j], "same hash text");
        }
    }
    msgpack_unpacked_destroy (&unpacked);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    static lookup_keys_t *keys;
    if (!keys) {
        lookup_config_t config = {.model = "fuzz", .tp_size = 2, .pp_size = 1, .block_size = 16};
        keys = lookup_keys_new (&config, NULL);
        s_check (keys != NULL, "default template compiles");
    }
    lookup_frame_t frames[MAX_FRAMES];
    size_t count = 0;
    while (size >= 2 && count < MAX_FRAMES) {
        size_t len = ((size_t) data[0] << 8) | data[1];
        data += 2;
        size -= 2;
        if (len > size)
            len = size;
        frames[count].data = data;
        frames[count].size = len;
        count++;
        data += len;
        size -= len;
    }
    const char *reason = NULL;
    lookup_request_t *request = lookup_request_decode (frames, count, &reason);
    if (!request) {
        s_check (reason && *reason, "a refusal has a reason");
        return 0;
    }
    s_check (request->hash_count <= LOOKUP_REQUEST_MAX_HASHES, "hash cap");
    for (size_t i = 0; i < request->hash_count; i++) {
        size_t len = request->hash_lens[i];
        s_check (len > 0 && len % 2 == 0, "hash length even and non-zero");
        s_check (strlen (request->hashes[i]) == len, "hash length matches its text");
        for (size_t j = 0; j < len; j++) {
            char c = request->hashes[i][j];
            s_check ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'), "lowercase hex");
        }
    }
    if (request->type != LOOKUP_REQUEST_LOOKUP)
        s_check (request->hash_count == 0 && count == 1, "a bare tag is one frame");
    else if (request->form == LOOKUP_FORM_MSGPACK)
        s_check_msgpack (request, &frames[2]);
    else if (request->form == LOOKUP_FORM_UNTAGGED)
        s_check_msgpack (request, &frames[1]);
    else if (request->form == LOOKUP_FORM_BINARY || request->form == LOOKUP_FORM_BINARY_EAGLE) {
        size_t hex = 0;
        for (size_t i = 0; i < request->hash_count; i++)
            hex += request->hash_lens[i];
        s_check (hex == 2 * frames[3].size, "binary hashes cover the blob");
        if (request->form == LOOKUP_FORM_BINARY_EAGLE)
            s_check (count == 5 && frames[4].size == 1
                         && request->apply_eagle == (((const uint8_t *) frames[4].data)[0] == 1),
                     "apply_eagle is the fifth frame's one byte");
        else
            s_check (count == 4 && request->apply_eagle, "no eagle frame: apply_eagle");
    }
    else
        s_check (false, "a lookup has a form");

    const char *const *expanded;
    if (request->type == LOOKUP_REQUEST_LOOKUP
        && lookup_keys_expand (keys, request->hashes, request->hash_lens, request->hash_count, 4096,
                               &expanded, &reason)
               == 0) {
        for (size_t i = 0; i < request->hash_count; i++)
            for (size_t r = 0; r < 2; r++) {
                const char *key = expanded[i * 2 + r];
                size_t key_len = strlen (key);
                s_check (key_len > request->hash_lens[i], "key longer than its hash");
                s_check (strcmp (key + key_len - request->hash_lens[i], request->hashes[i]) == 0,
                         "key ends with its hash");
            }
    }
    lookup_request_destroy (&request);
    return 0;
}
