/*  request_check.c - protocol and limit checks of a decoded client request (request_check.h).

    The order of the checks is the order of the reasons a client reads: a request from another
    protocol version is told so before anything else, then an unknown operation, then the
    shape of the request (keys, frames, sizes, options). Per-key problems are not request
    errors: each key gets its own status (request_key_check), and the other keys go on.
*/
#include "messages/request_check.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "messages/kvp_job.h"
#include "messages/ops.h"

int
request_check (const Kvpool__V1__Request *request, size_t value_frames, uint64_t value_bytes,
               const request_limits_t *limits, char *reason, size_t size)
{
    int op = request->op;
    size_t n = request->n_keys;
    if (request->version != KVP_PROTOCOL_VERSION) {
        snprintf (reason, size, "protocol version %u is not supported (this server: %d)",
                  request->version, KVP_PROTOCOL_VERSION);
        return KVPOOL_INVALID_VERSION;
    }
    //  The node's own operations are negative: never a client's.
    const kvp_op_t *row = op > 0 ? kvp_op (op) : NULL;
    if (!row) {
        snprintf (reason, size, "unknown operation %d", op);
        return KVPOOL_UNKNOWN_OPERATION;
    }
    if (request->n_vm_addrs) {
        row = request->rdma_conn ? NULL : kvp_op_row (op, KVP_VIA_VM);
        if (!row) {
            snprintf (reason, size, "operation %d does not take values by address (vm_addrs)", op);
            return KVPOOL_INVALID_PARAMS;
        }
        if (request->n_vm_addrs != n) {
            snprintf (reason, size, "%zu keys but %zu vm_addrs", n, request->n_vm_addrs);
            return KVPOOL_INVALID_PARAMS;
        }
    }
    else if (request->rdma_conn) {
        row = kvp_op_row (op, KVP_VIA_RDMA);
        if (!row) {
            snprintf (reason, size, "operation %d does not move values by RDMA (rdma_conn)", op);
            return KVPOOL_INVALID_PARAMS;
        }
        if (request->n_rdma_addrs != n || request->n_rdma_keys != n
            || (op == KVPOOL__V1__OP__GET && request->n_rdma_lengths != n)) {
            snprintf (reason, size,
                      "%zu keys but %zu rdma_addrs, %zu rdma_keys and %zu rdma_lengths", n,
                      request->n_rdma_addrs, request->n_rdma_keys, request->n_rdma_lengths);
            return KVPOOL_INVALID_PARAMS;
        }
    }
    else if (request->n_rdma_addrs || request->n_rdma_keys || request->n_rdma_lengths) {
        snprintf (reason, size, "rdma_addrs, rdma_keys and rdma_lengths need an rdma_conn");
        return KVPOOL_INVALID_PARAMS;
    }
    if ((row->flags & OP_KEYS) && n == 0) {
        snprintf (reason, size, "the request has no keys");
        return KVPOOL_INVALID_PARAMS;
    }
    if (n > limits->max_keys) {
        snprintf (reason, size, "%zu keys: at most %llu per request (--max-keys)", n,
                  (unsigned long long) limits->max_keys);
        return KVPOOL_INVALID_PARAMS;
    }
    if ((row->flags & OP_VALUES) ? value_frames != n : value_frames != 0) {
        snprintf (reason, size, "%zu keys but %zu value frames", n, value_frames);
        return KVPOOL_INVALID_PARAMS;
    }
    if (value_bytes > limits->max_request_bytes) {
        snprintf (reason, size,
                  "%llu bytes of values: at most %llu in one request (--max-request-bytes)",
                  (unsigned long long) value_bytes, (unsigned long long) limits->max_request_bytes);
        return KVPOOL_VALUE_TOO_LARGE;
    }
    if ((request->n_offsets || request->n_lengths) && !(row->flags & OP_RANGES)) {
        snprintf (reason, size, "offsets and lengths are only for GET and PUT_PART");
        return KVPOOL_INVALID_PARAMS;
    }
    if ((request->n_offsets || request->n_lengths)
        && (request->n_offsets != n || request->n_lengths != n)) {
        snprintf (reason, size, "%zu keys but %zu offsets and %zu lengths", n, request->n_offsets,
                  request->n_lengths);
        return KVPOOL_INVALID_PARAMS;
    }
    if (op == KVPOOL__V1__OP__PREFIX_MATCH && request->ranks > 1 && n % request->ranks != 0) {
        snprintf (reason, size, "%zu keys are not whole blocks of %u ranks", n, request->ranks);
        return KVPOOL_INVALID_PARAMS;
    }
    if (request->n_checksums && request->n_checksums != n) {
        snprintf (reason, size, "%zu keys but %zu checksums", n, request->n_checksums);
        return KVPOOL_INVALID_PARAMS;
    }
    if (request->n_versions && request->n_versions != n) {
        snprintf (reason, size, "%zu keys but %zu versions", n, request->n_versions);
        return KVPOOL_INVALID_PARAMS;
    }
    if (request->n_versions && !(row->flags & OP_WRITE) && op != KVPOOL__V1__OP__GET
        && op != KVPOOL__V1__OP__EXIST && op != KVPOOL__V1__OP__GET_SIZE
        && op != KVPOOL__V1__OP__REMOVE && op != KVPOOL__V1__OP__CONFIRM) {
        snprintf (reason, size, "versions are only for GET, EXIST, GET_SIZE, REMOVE and CONFIRM");
        return KVPOOL_INVALID_PARAMS;
    }
    if (op == KVPOOL__V1__OP__CONFIRM && request->n_versions != n) {
        snprintf (reason, size, "CONFIRM names the version of each of its %zu keys", n);
        return KVPOOL_INVALID_PARAMS;
    }
    if ((row->flags & OP_SIZES) && request->n_sizes != n) {
        snprintf (reason, size, "%zu keys but %zu sizes", n, request->n_sizes);
        return KVPOOL_INVALID_PARAMS;
    }
    const Kvpool__V1__PutOptions *put = request->put;
    if (put && put->replica_num > KVP_MAX_REPLICAS) {
        snprintf (reason, size, "replica_num %u: at most %d", put->replica_num, KVP_MAX_REPLICAS);
        return KVPOOL_INVALID_REPLICA;
    }
    if (put && put->n_preferred_segments > KVP_MAX_PREFERRED) {
        snprintf (reason, size, "%zu preferred segments: at most %d", put->n_preferred_segments,
                  KVP_MAX_PREFERRED);
        return KVPOOL_INVALID_PARAMS;
    }
    if ((row->flags & OP_SEGMENT) && !request->segment) {
        snprintf (reason, size, "the request has no segment");
        return KVPOOL_INVALID_PARAMS;
    }
    if (op == KVPOOL__V1__OP__TOUCH) {
        //  Each count a client reports of the reads it served itself.
        const struct {
            const char *name;
            uint64_t count;
        } counts[] = {{"reads", request->reads},
                      {"listed_reads", request->listed_reads},
                      {"read_misses", request->read_misses},
                      {"cache_reads", request->cache_reads}};
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
            if (counts[i].count > REQUEST_TOUCH_READS_MAX) {
                snprintf (reason, size, "%s %llu: at most %llu per TOUCH", counts[i].name,
                          (unsigned long long) counts[i].count,
                          (unsigned long long) REQUEST_TOUCH_READS_MAX);
                return KVPOOL_INVALID_PARAMS;
            }
    }
    return KVPOOL_OK;
}

int
request_key_check (const ProtobufCBinaryData *key, uint64_t max_key_len)
{
    if (key->len == 0 || key->len > max_key_len || memchr (key->data, 0, key->len))
        return KVPOOL_INVALID_KEY;
    return KVPOOL_OK;
}

//  ---- self test ---------------------------------------------------------------------

void
request_check_test (bool verbose)
{
    request_limits_t limits = {
        .max_key_len = 8, .max_value_size = 100, .max_keys = 3, .max_request_bytes = 150};
    char reason[256];
    ProtobufCBinaryData keys[4] = {
        {1, (uint8_t *) "a"}, {1, (uint8_t *) "b"}, {1, (uint8_t *) "c"}, {1, (uint8_t *) "d"}};
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.version = 1;
    request.op = KVPOOL__V1__OP__PUT;
    request.keys = keys;
    request.n_keys = 2;
    assert (request_check (&request, 2, 150, &limits, reason, sizeof reason) == KVPOOL_OK);
    assert (request_check (&request, 2, 151, &limits, reason, sizeof reason)
            == KVPOOL_VALUE_TOO_LARGE);
    assert (strstr (reason, "--max-request-bytes"));
    assert (request_check (&request, 1, 10, &limits, reason, sizeof reason)
            == KVPOOL_INVALID_PARAMS);
    request.n_keys = 4;
    assert (request_check (&request, 4, 10, &limits, reason, sizeof reason)
            == KVPOOL_INVALID_PARAMS);
    assert (strstr (reason, "--max-keys"));
    request.version = 2;
    assert (request_check (&request, 4, 10, &limits, reason, sizeof reason)
            == KVPOOL_INVALID_VERSION);
    request.version = 1;
    request.op = 999;
    assert (request_check (&request, 0, 0, &limits, reason, sizeof reason)
            == KVPOOL_UNKNOWN_OPERATION);
    request.op = -1; //  the node's own operations are not a client's
    assert (request_check (&request, 0, 0, &limits, reason, sizeof reason)
            == KVPOOL_UNKNOWN_OPERATION);
    request.op = KVPOOL__V1__OP__EXIST;
    request.n_keys = 0;
    assert (request_check (&request, 0, 0, &limits, reason, sizeof reason)
            == KVPOOL_INVALID_PARAMS);
    request.op = KVPOOL__V1__OP__PUT_START;
    request.n_keys = 1;
    assert (request_check (&request, 0, 0, &limits, reason, sizeof reason)
            == KVPOOL_INVALID_PARAMS);
    //  A range a key, on GET only.
    uint64_t offsets[1] = {4}, lengths[1] = {8};
    request.op = KVPOOL__V1__OP__GET;
    request.n_offsets = 1;
    request.offsets = offsets;
    assert (request_check (&request, 0, 0, &limits, reason, sizeof reason)
            == KVPOOL_INVALID_PARAMS);
    request.n_lengths = 1;
    request.lengths = lengths;
    assert (request_check (&request, 0, 0, &limits, reason, sizeof reason) == KVPOOL_OK);
    request.op = KVPOOL__V1__OP__EXIST;
    assert (request_check (&request, 0, 0, &limits, reason, sizeof reason)
            == KVPOOL_INVALID_PARAMS);
    request.n_offsets = request.n_lengths = 0;
    request.op = KVPOOL__V1__OP__MOUNT_SEGMENT;
    request.n_keys = 0;
    assert (request_check (&request, 0, 0, &limits, reason, sizeof reason)
            == KVPOOL_INVALID_PARAMS);

    ProtobufCBinaryData nul = {8, (uint8_t *) "nul\0tail"};
    ProtobufCBinaryData empty = {0, NULL};
    ProtobufCBinaryData long_key = {9, (uint8_t *) "123456789"};
    ProtobufCBinaryData bytes = {3, (uint8_t *) "\xff\x01\t"};
    assert (request_key_check (&nul, 8) == KVPOOL_INVALID_KEY);
    assert (request_key_check (&empty, 8) == KVPOOL_INVALID_KEY);
    assert (request_key_check (&long_key, 8) == KVPOOL_INVALID_KEY);
    assert (request_key_check (&bytes, 8) == KVPOOL_OK);
    if (verbose)
        printf ("version, operation, keys, frames, limits, key bytes ");
}
