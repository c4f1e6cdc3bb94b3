/*  rdma_wire_fuzz.c - libFuzzer target for the RDMA connection-data decoder (rdma_wire.c).

    The input is a peer's connection data as it would arrive on the node's ZeroMQ socket. The
    decoder must never crash, read out of bounds or leak; whatever it accepts must encode back
    to exactly the input (the wire form has one encoding per value). Most random inputs die at
    the checksum, so the target also tries each input with its last 8 bytes replaced by the
    right checksum, which lets the fuzzer reach the field checks behind it.

    Not yet in tests/fuzz/fuzz.mk's FUZZ_TARGETS (this module may not edit that file); built
    and run by hand the same way:
        clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -I. -D_GNU_SOURCE \
            rdma/rdma_wire_fuzz.c rdma/rdma_wire.c rdma/rdma_regs.c -o build/bin/rdma-wire-fuzz
        build/bin/rdma-wire-fuzz -max_total_time=60
    The Makefile leaves *_fuzz.c files out of the libraries.
*/
#include "rdma/rdma_wire.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

static void
s_check (const uint8_t *data, size_t size)
{
    const char *reason = NULL;
    kvp_rdma_wire_t *wire = kvp_rdma_wire_decode (data, size, &reason);
    if (!wire) {
        assert (reason && *reason);
        return;
    }
    uint8_t *again;
    size_t again_size;
    int rc = kvp_rdma_wire_encode (wire, &again, &again_size, &reason);
    assert (rc == 0);
    assert (again_size == size && memcmp (again, data, size) == 0);
    free (again);
    kvp_rdma_wire_destroy (&wire);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    s_check (data, size);
    if (size >= KVP_RDMA_WIRE_SUM_SIZE) {
        uint8_t *copy = (uint8_t *) malloc (size);
        if (!copy)
            return 0;
        memcpy (copy, data, size);
        size_t body = size - KVP_RDMA_WIRE_SUM_SIZE;
        uint64_t sum = kvp_rdma_wire_checksum (copy, body);
        for (int i = 0; i < 8; i++)
            copy[body + i] = (uint8_t) (sum >> (56 - 8 * i));
        s_check (copy, size);
        free (copy);
    }
    return 0;
}
