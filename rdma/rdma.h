/*  rdma.h - the RDMA transport: node-to-node data movement over libibverbs, beside TCP.

    NOT YET RUN ON RDMA HARDWARE. The machine this was written on has no RDMA device (no
    /sys/class/infiniband, ibv_get_device_list fails with ENOSYS) and no soft-RoCE, so no byte
    has moved through a real queue pair. What is tested (kvpool-selftest --test rdma_*; these
    modules and their tests also built with -fsanitize=address,undefined and with
    -fsanitize=thread, clean):
      - rdma_regs, rdma_wire, rdma_plan, rdma_track: all of the logic, with no device (region
        table against a brute-force model; the connection-data codec with a byte-exact golden
        encoding, every prefix and every bit flip refused, 20000 random edits never crashing;
        plans checked against their invariants on hundreds of random batches; completion
        accounting against a simulated in-order device that fails at random).
      - rdma_verbs: kvp_rdma_open on this machine (it must return NULL with a reason when there
        is no device), the transport choice with an injected probe, the QP attributes built for
        INIT, RTR and RTS, the struct ibv_send_wr built from a planned WR, GID selection, and
        the whole connect / submit / post / poll / done path of this file run against a fake
        device (in-process memcpy standing in for the HCA, with error injection), bytes
        checked. On a machine with a device, the same test also opens it, registers memory,
        connects two queue-pair sets back to back and moves data through them.
    What is not tested: ibv_create_qp/ibv_modify_qp/ibv_post_send/ibv_poll_cq against real
    hardware, RoCE GID selection on a real table, timeouts and retry counts under load. The
    first run on a machine with a device should be `kvpool-selftest --test rdma_verbs`.

    Shape. Pure logic lives in four modules that never call verbs: rdma_regs (which memory is
    registered, with which keys), rdma_wire (the connection data two nodes exchange over their
    ZeroMQ socket), rdma_plan (a batch of transfers cut into work requests, striped over the
    QPs, signalled every Nth) and rdma_track (completions mapped back to transfers, send-queue
    slots counted). This file is the thin layer that does call verbs: device and port
    discovery, memory registration, RC queue pairs and their INIT -> RTR -> RTS transitions,
    ibv_post_send and ibv_poll_cq.

    Use (by a transfer worker; the cluster code decides which peer and which segment):

        char why[256];
        int transport = kvp_rdma_choose (setting, device, NULL, NULL, why, sizeof why);
        //  log why once; on KVP_RDMA_TRANSPORT_TCP use the TCP transport
        kvp_rdma_t *rdma = kvp_rdma_open (device, why, sizeof why);  //  NULL: log, use TCP
        kvp_rdma_register (rdma, segment_id, base, size, why, sizeof why);  //  each segment
        kvp_rdma_conn_t *conn = kvp_rdma_conn_new (rdma, NULL, why, sizeof why);
        kvp_rdma_conn_local_data (conn, &data, &size, why, sizeof why);
        //  send data to the peer over the node's ZeroMQ socket; receive the peer's
        kvp_rdma_conn_connect (conn, peer_data, peer_size, why, sizeof why);
        kvp_rdma_conn_submit (conn, xfers, count, why, sizeof why);
        while (kvp_rdma_conn_active (conn) > 0)
            n = kvp_rdma_conn_poll (conn, done, 64);  //  done[i].tag, done[i].status

    A transfer whose status is -1 failed as a whole (an error or flushed completion, or a QP
    broken before its WRs were posted): retry it elsewhere, e.g. over TCP. A connection with a
    broken QP stays broken (its QP is in the error state); destroy it and make a new one. The
    peer's segments are those in its connection data; segments it registers later need a new
    connection.

    Fallback: with no device (ibv_get_device_list fails or lists none), kvp_rdma_open returns
    NULL with one line such as "no RDMA device found; using tcp"; kvp_rdma_choose turns
    "rdma" and "auto" into TCP with that line as the reason. Nothing crashes, nothing retries.

    Threads: not thread-safe. One thread (the transfer worker) owns a kvp_rdma_t and its
    connections and makes every call on them. There is no completion channel: the worker polls
    (kvp_rdma_conn_poll never blocks).
*/
#ifndef KVP_RDMA_H_INCLUDED
#define KVP_RDMA_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdma/rdma_plan.h"
#include "rdma/rdma_regs.h"
#include "rdma/rdma_track.h"
#include "rdma/rdma_wire.h"

typedef struct _kvp_rdma_t kvp_rdma_t;

//  The loop device: kvp_rdma_open of this name gives a software device that moves bytes with
//  process_vm_readv / process_vm_writev between processes of one machine (the peer's process
//  id travels in its connection data, in place of a GID). It exists to run the RDMA data
//  path end to end where there is no RDMA hardware (tests/python/test_cluster.py); it needs
//  ptrace rights over the peer (same user, or CAP_SYS_PTRACE). Never chosen by "auto".
#define KVP_RDMA_LOOP_DEVICE "kvpool-loop"
typedef struct _kvp_rdma_conn_t kvp_rdma_conn_t;

typedef enum { KVP_RDMA_TRANSPORT_TCP = 0, KVP_RDMA_TRANSPORT_RDMA = 1 } kvp_rdma_transport_t;

//  ---- choosing the transport -----------------------------------------------------------

//  Whether an RDMA device can be used: 0, with a description in reason; or -1 with why not.
typedef int (kvp_rdma_probe_fn) (void *arg, const char *want_device, char *reason,
                                 size_t reason_size);

//  The real probe: opens the device (kvp_rdma_open) and closes it again. arg is unused.
int kvp_rdma_probe (void *arg, const char *want_device, char *reason, size_t reason_size);

//  Decides the transport from a setting: "tcp" is TCP; "rdma" and "auto" are RDMA when probe
//  (NULL: kvp_rdma_probe) finds a device, else TCP, with the probe's reason. Writes one line
//  for the log into reason either way. Returns a kvp_rdma_transport_t, or -1 for a setting
//  that is none of the three (NULL included), with a reason.
int kvp_rdma_choose (const char *transport, const char *want_device, kvp_rdma_probe_fn *probe,
                     void *probe_arg, char *reason, size_t reason_size);

//  ---- the device ------------------------------------------------------------------------

//  Opens an RDMA device: want_device is NULL (the first device, its first active port) or
//  "NAME[:PORT[:GID_INDEX]]". The GID index defaults to 0 on InfiniBand and, on RoCE, to a
//  RoCE v2 GID (an IPv4-mapped one first). Allocates a protection domain. Returns NULL with a
//  one-line reason (no device, no such device, no active port, a verbs call failed), or the
//  context with its description in reason. Caller owns the return value and must close it.
kvp_rdma_t *kvp_rdma_open (const char *want_device, char *reason, size_t reason_size);

//  Deregisters all memory, frees the protection domain, closes the device. Every connection
//  made on it must be destroyed first. Does nothing on NULL; sets *self_p to NULL.
void kvp_rdma_close (kvp_rdma_t **self_p);

//  E.g. "mlx5_0 port 1 (InfiniBand, lid 3, mtu 4096, gid index 0, max message 1073741824)".
const char *kvp_rdma_describe (kvp_rdma_t *self);

//  Registers [addr, addr + len) as segment segment_id (ibv_reg_mr with local write, remote
//  read and remote write). Returns 0, or -1 with a reason (a duplicate id, an overlap with a
//  registered segment, ibv_reg_mr failed). Connections made afterwards announce it.
int kvp_rdma_register (kvp_rdma_t *self, uint32_t segment_id, void *addr, size_t len, char *reason,
                       size_t reason_size);

//  Deregisters segment segment_id. No transfer may be using it. Returns 0, or -1 when there is
//  no such segment or ibv_dereg_mr failed.
int kvp_rdma_deregister (kvp_rdma_t *self, uint32_t segment_id);

//  The registered segments (lkey, rkey per segment). Owned by the context.
const kvp_rdma_regs_t *kvp_rdma_regions (kvp_rdma_t *self);

//  ---- connections -----------------------------------------------------------------------

//  How a connection is shaped; zeros take the defaults.
typedef struct {
    unsigned qp_count;      //  RC queue pairs (both sides must agree); default 4, most 64
    unsigned sq_depth;      //  send-queue slots per QP; default 128 (capped at the device's)
    uint64_t stripe;        //  bytes of a transfer per QP before the next; default 1 MiB
    unsigned signal_every;  //  signal every Nth WR of a QP; default sq_depth / 2
    unsigned max_transfers; //  transfers in flight; default 4096
} kvp_rdma_conn_options_t;

//  Creates a connection's completion queue and queue pairs (moved to INIT). options may be
//  NULL. Returns NULL with a reason. Caller owns the return value and must destroy it.
kvp_rdma_conn_t *kvp_rdma_conn_new (kvp_rdma_t *rdma, const kvp_rdma_conn_options_t *options,
                                    char *reason, size_t reason_size);

//  Destroys the queue pairs and the completion queue; transfers in flight are abandoned (their
//  memory may still be written until the QPs are gone). Does nothing on NULL; sets *self_p to
//  NULL.
void kvp_rdma_conn_destroy (kvp_rdma_conn_t **self_p);

//  This side's connection data (rdma_wire.h): port address, MTU, QP numbers and PSNs, and the
//  context's registered segments, encoded. *data_p is the caller's to free (free). Returns 0,
//  or -1 with a reason.
int kvp_rdma_conn_local_data (kvp_rdma_conn_t *self, uint8_t **data_p, size_t *size_p, char *reason,
                              size_t reason_size);

//  Decodes the peer's connection data (any malformed input is refused with a reason), takes
//  its segments, and moves each QP to RTR then RTS facing the peer's QP of the same index.
//  Once per connection. Returns 0, or -1 with a reason (the connection is then unusable).
int kvp_rdma_conn_connect (kvp_rdma_conn_t *self, const void *peer_data, size_t peer_size,
                           char *reason, size_t reason_size);

//  Plans a batch of transfers (rdma_plan.h), follows them (rdma_track.h) and posts as many
//  WRs as the send queues take; the rest go out as completions free slots (in
//  kvp_rdma_conn_poll). Returns 0, or -1 with a reason when the batch is refused as a whole
//  (not connected, a transfer outside registered memory or its segment, too many in flight).
int kvp_rdma_conn_submit (kvp_rdma_conn_t *self, const kvp_rdma_xfer_t *xfers, size_t count,
                          char *reason, size_t reason_size);

//  Polls the completion queue once without blocking, posts what now fits, and copies up to max
//  finished transfers into done. Returns how many, or -1 when polling the CQ failed: the
//  connection is then dead; destroy it (after which none of its transfers touches memory)
//  and count every transfer it has not returned as failed.
int kvp_rdma_conn_poll (kvp_rdma_conn_t *self, kvp_rdma_done_t *done, size_t max);

//  Transfers submitted and not yet returned by kvp_rdma_conn_poll.
size_t kvp_rdma_conn_active (kvp_rdma_conn_t *self);

//  Adds a region of the peer's (its address, length and rkey, as it sent them) to the
//  connection's table, so that transfers may name it as remote_segment id: for memory the
//  peer registers per transfer, after the connection was made. Returns 0, or -1 with a
//  reason (an id in use, an overlap). kvp_rdma_conn_remove_remote takes it out again.
int kvp_rdma_conn_add_remote (kvp_rdma_conn_t *self, uint32_t id, uint64_t addr, uint64_t len,
                              uint32_t rkey, char *reason, size_t reason_size);
int kvp_rdma_conn_remove_remote (kvp_rdma_conn_t *self, uint32_t id);

//  The last error a completion or a verbs call reported, "" if none.
const char *kvp_rdma_conn_error (kvp_rdma_conn_t *self);

void kvp_rdma_test (bool verbose);

//  Self test of the loop device (rdma_loop.c).
void kvp_rdma_loop_test (bool verbose);

#endif
