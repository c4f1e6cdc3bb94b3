/*  rdma_wire.h - the RDMA connection data two nodes exchange, and its codec.

    Before two nodes can move data with RDMA, each must learn the other's queue pairs (number
    and first packet sequence number), port address (LID for InfiniBand, GID for RoCE or
    routed fabrics), path MTU, and the segments it may read and write (segment id, base
    address, length, rkey). Each node encodes its own with kvp_rdma_wire_encode and sends the
    bytes over the node-to-node ZeroMQ socket it already has; the other decodes them with
    kvp_rdma_wire_decode and connects its queue pairs (rdma/rdma.h). The bytes come from the
    network, so the decoder trusts nothing in them.

    Wire form, version 1 (integers big-endian):
        off  size
          0     4   magic "KVPR"
          4     1   version (1)
          5     1   mtu: enum ibv_mtu, 1 (256 bytes) .. 5 (4096 bytes)
          6     2   lid
          8    16   gid (raw, as in union ibv_gid)
         24     2   qp_count: 1 .. KVP_RDMA_WIRE_MAX_QPS
         26     2   seg_count: 0 .. KVP_RDMA_REGS_MAX
         28   8 q   qp_count times: qpn u32, psn u32
              24 s  seg_count times: id u32, rkey u32, addr u64, len u64
         end    8   FNV-1a 64 of every byte before it

    Refused (decode returns NULL with a reason): a wrong magic, another version, a size that
    is not exactly what the counts say (shorter is "truncated", longer "trailing bytes"), a
    checksum that does not match, an mtu outside 1..5, a LID of 0 with an all-zero GID (no
    address at all), a qp_count of 0 or above the bound, more segments than the bound, a qpn
    below 2 or above 2^24 - 1 (QPs 0 and 1 are special), two equal qpns, a psn above
    2^24 - 1, a segment of length 0 or that wraps past 2^64, two segments with one id, two
    segments that overlap. Everything accepted re-encodes to the same bytes.

    Why a checksum when ZeroMQ runs over TCP: the bytes may be relayed or stored by code that
    is not ours, and a flipped address or rkey would otherwise decode as a valid segment and
    send RDMA writes into the wrong memory. FNV-1a catches every change of a single byte
    (each step is a bijection of the running state), which the self test checks.

    A pure module: no sockets, no verbs, no state, no globals. Safe from any thread; each call
    owns what it returns.
*/
#ifndef KVP_RDMA_WIRE_H_INCLUDED
#define KVP_RDMA_WIRE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdma/rdma_regs.h"

#define KVP_RDMA_WIRE_VERSION 1
//  Most queue pairs one connection may have.
#define KVP_RDMA_WIRE_MAX_QPS 64
//  Bytes of the fixed header, of one QP, of one segment, of the checksum.
#define KVP_RDMA_WIRE_HEADER 28
#define KVP_RDMA_WIRE_QP_SIZE 8
#define KVP_RDMA_WIRE_SEG_SIZE 24
#define KVP_RDMA_WIRE_SUM_SIZE 8

//  One queue pair.
typedef struct {
    uint32_t qpn; //  2 .. 2^24 - 1
    uint32_t psn; //  0 .. 2^24 - 1: the first packet sequence number it sends with
} kvp_rdma_wire_qp_t;

//  One segment the peer may read and write.
typedef struct {
    uint32_t id;
    uint32_t rkey;
    uint64_t addr; //  in the sender's address space
    uint64_t len;
} kvp_rdma_wire_seg_t;

//  The connection data of one node. A decoded one owns its arrays (destroy it); one the caller
//  fills for encode points at the caller's arrays.
typedef struct {
    uint8_t mtu; //  enum ibv_mtu
    uint16_t lid;
    uint8_t gid[16];
    size_t qp_count;
    kvp_rdma_wire_qp_t *qps;
    size_t seg_count;
    kvp_rdma_wire_seg_t *segs;
} kvp_rdma_wire_t;

//  Encodes info into a new buffer: *data_p (caller frees it with free) and *size_p. Returns
//  0, or -1 with *reason_p (may be NULL) set to a static reason when info would be refused by
//  the decoder (the same checks), or when out of memory.
int kvp_rdma_wire_encode (const kvp_rdma_wire_t *info, uint8_t **data_p, size_t *size_p,
                          const char **reason_p);

//  Decodes size bytes. Returns a new kvp_rdma_wire_t, or NULL with *reason_p (may be NULL) set
//  to a static English reason. Caller owns the return value and must destroy it.
kvp_rdma_wire_t *kvp_rdma_wire_decode (const void *data, size_t size, const char **reason_p);

//  Frees a decoded kvp_rdma_wire_t. Does nothing on NULL; sets *self_p to NULL.
void kvp_rdma_wire_destroy (kvp_rdma_wire_t **self_p);

//  The FNV-1a 64 of size bytes (the trailer of the wire form).
uint64_t kvp_rdma_wire_checksum (const void *data, size_t size);

void kvp_rdma_wire_test (bool verbose);

#endif
