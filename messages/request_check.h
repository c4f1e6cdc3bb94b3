/*  request_check.h - the checks a client request passes before the node does anything for it.

    The api decodes frame 0 of a client message with protobuf-c (protocol/kvpool.proto) and
    hands the decoded Request, with the count and total size of the value frames that came
    with it, to request_check. What each operation carries comes from the operation table
    (messages/ops.h). The checks are protocol facts and the node's limits only; no
    sockets, no state, so a fuzzer drives them with the decoder in front
    (request_check_fuzz.c), exactly as the api does. Who may ask for what is the api's
    business (actors/owners.h), after these checks.
*/
#ifndef REQUEST_CHECK_H_INCLUDED
#define REQUEST_CHECK_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/kvpool.pb-c.h"

//  A TOUCH reports the values a client read from the read index (and copied from listed
//  replicas, and missed) since its last TOUCH, which it sends at least once a second: more
//  than this in any of the three is not a count, and would wrap the stats.
#define REQUEST_TOUCH_READS_MAX (1ULL << 20)

typedef struct {
    uint64_t max_key_len;       //  bytes in one key
    uint64_t max_value_size;    //  bytes in one value (a put's frame, a put-start's size)
    uint64_t max_keys;          //  keys in one request
    uint64_t max_request_bytes; //  value frames of one request together
} request_limits_t;

//  Checks the request as a whole: version, operation, key count, value frames (count and
//  total bytes), put-start sizes, put options, segment. Returns KVPOOL_OK, or a negative
//  kvpool status with reason (size bytes) saying why.
int request_check (const Kvpool__V1__Request *request, size_t value_frames, uint64_t value_bytes,
                   const request_limits_t *limits, char *reason, size_t size);

//  One key's status: KVPOOL_OK, or KVPOOL_INVALID_KEY when it is empty, longer than
//  max_key_len or holds a NUL byte (inside the node keys are also C strings).
int request_key_check (const ProtobufCBinaryData *key, uint64_t max_key_len);

void request_check_test (bool verbose);

#endif
