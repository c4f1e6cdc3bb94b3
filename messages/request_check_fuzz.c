/*  request_check_fuzz.c - libFuzzer target: a client message, decoded and checked as the api
    does it.

    The input is a whole client message: a frame count (one byte, at most 16), then each
    frame as a 4-byte little-endian length and its bytes (a length past the end of the input
    takes what is left). Frame 0 goes to protobuf-c's Request decoder; the others are value
    frames. A request that decodes is checked (request_check) and, if it passes, each key
    too (request_key_check), with small limits so that every limit is reached.
*/
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "messages/request_check.h"

#define MAX_FRAMES 16

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t count = data[0] % (MAX_FRAMES + 1);
    const uint8_t *frames[MAX_FRAMES];
    size_t sizes[MAX_FRAMES];
    size_t at = 1;
    for (size_t i = 0; i < count; i++) {
        uint32_t len = 0;
        if (at + 4 <= size)
            memcpy (&len, data + at, 4);
        at = at + 4 <= size ? at + 4 : size;
        if (len > size - at)
            len = (uint32_t) (size - at);
        frames[i] = data + at;
        sizes[i] = len;
        at += len;
    }
    if (count == 0)
        return 0;
    Kvpool__V1__Request *request = kvpool__v1__request__unpack (NULL, sizes[0], frames[0]);
    if (!request)
        return 0;
    uint64_t value_bytes = 0;
    for (size_t i = 1; i < count; i++)
        value_bytes += sizes[i];
    request_limits_t limits = {
        .max_key_len = 64, .max_value_size = 1024, .max_keys = 8, .max_request_bytes = 4096};
    char reason[256];
    int status = request_check (request, count - 1, value_bytes, &limits, reason, sizeof reason);
    if (status == 0)
        for (size_t i = 0; i < request->n_keys; i++)
            request_key_check (&request->keys[i], limits.max_key_len);
    //  A reason is always a terminated string.
    if (status != 0)
        (void) strlen (reason);
    kvpool__v1__request__free_unpacked (request, NULL);
    return 0;
}
