/*  rdma_plan.h - cutting RDMA transfers into work requests.

    A transfer moves len bytes between local memory and a segment of the peer: READ copies
    remote -> local, WRITE local -> remote. The planner turns a batch of transfers into the
    work requests (WRs) a poster hands to ibv_post_send, one per RDMA operation, and decides for
    each WR its queue pair and whether it asks for a completion:

      - Each transfer is cut into stripes of limits->stripe bytes (from its start; the last may
        be shorter). Stripes go round-robin over the QPs, continuing from transfer to transfer,
        so one large transfer uses every QP and a batch of small ones spreads over them too.
      - A stripe is cut into WRs of at most limits->max_msg bytes (the port's largest message),
        and a WR never crosses the end of a registered local region: a WR has one lkey, good
        for one region only. Local memory may span several adjacent regions; a gap is an error.
        The remote range must lie inside its one segment: [offset, offset + len) past the
        segment's end is refused, never clipped.
      - WRs are signalled (IBV_SEND_SIGNALED) every signal_every-th WR of a QP, so no more than
        that many send-queue slots wait for a completion to free them, and the last WR of each
        transfer on each QP it uses is signalled. RC completions on one QP arrive in order, so
        when a transfer's signalled WRs have all completed, every one of its WRs has: that is
        when it is done (rdma/rdma_track.h counts them).

    A zero-length transfer gets no WRs (its segment and offset are still checked); the tracker
    reports it done at once. The plan's wr_id fields are 0: the tracker stamps them
    (kvp_rdma_track_add) with the transfer and QP they belong to.

    Pure: addresses are numbers, keys come from the two region tables; no verbs, no globals.
    Threads: a plan belongs to one thread; the tables are only read.
*/
#ifndef KVP_RDMA_PLAN_H_INCLUDED
#define KVP_RDMA_PLAN_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdma/rdma_regs.h"

//  Most queue pairs a plan spreads over (the same bound as the connection data's).
#define KVP_RDMA_PLAN_MAX_QPS 64
//  Largest WR: an ibv_sge's length is 32 bits, and ports say 1 or 2 GiB.
#define KVP_RDMA_PLAN_MAX_MSG (1ULL << 31)
//  Most transfers in one batch, and most WRs in one plan: a larger batch is split by the
//  caller (a plan of 1M WRs takes 56 MiB).
#define KVP_RDMA_PLAN_MAX_XFERS (1u << 20)
#define KVP_RDMA_PLAN_MAX_WRS (1u << 20)

typedef enum {
    KVP_RDMA_READ = 1, //  remote -> local (IBV_WR_RDMA_READ)
    KVP_RDMA_WRITE = 2 //  local -> remote (IBV_WR_RDMA_WRITE)
} kvp_rdma_op_t;

//  One transfer.
typedef struct {
    uint64_t tag; //  the caller's name for it, given back when it is done
    kvp_rdma_op_t op;
    uint64_t local_addr;     //  inside regions of the local table
    uint32_t remote_segment; //  segment id in the remote table
    uint64_t remote_offset;  //  from the segment's start
    uint64_t len;            //  may be 0
} kvp_rdma_xfer_t;

//  What shapes a plan.
typedef struct {
    uint64_t max_msg;         //  largest WR: 1 .. KVP_RDMA_PLAN_MAX_MSG (the port's max_msg_sz)
    uint64_t stripe;          //  bytes of a transfer on one QP before the next; 0: no striping
    unsigned qp_count;        //  1 .. KVP_RDMA_PLAN_MAX_QPS
    unsigned max_outstanding; //  WRs one QP may have posted and not completed (send queue depth)
    unsigned signal_every;    //  signal every Nth WR of a QP: 1 .. max_outstanding; 0 means
                              //  max_outstanding / 2 (at least 1), so half the queue can be
                              //  reclaimed while the other half is in flight
} kvp_rdma_limits_t;

//  One work request.
typedef struct {
    uint64_t local_addr;
    uint64_t remote_addr;
    uint64_t wr_id; //  0 in a new plan; set by kvp_rdma_track_add
    uint32_t lkey;
    uint32_t rkey;
    uint32_t len;  //  1 .. max_msg
    uint32_t xfer; //  index of its transfer in the plan's xfers
    uint8_t qp;    //  queue pair index, < qp_count
    bool signaled;
    kvp_rdma_op_t op;
} kvp_rdma_wr_t;

//  One transfer of a plan.
typedef struct {
    uint64_t tag;
    uint64_t len;
    uint32_t wrs;      //  WRs it was cut into (0 for a zero-length transfer)
    uint32_t signaled; //  how many of them are signalled
    uint64_t id;       //  the tracker's id for it; 0 until kvp_rdma_track_add
} kvp_rdma_plan_xfer_t;

//  A plan: WRs in posting order (per QP, they must be posted in this order).
typedef struct {
    kvp_rdma_wr_t *wrs;
    size_t wr_count;
    kvp_rdma_plan_xfer_t *xfers;
    size_t xfer_count;
    kvp_rdma_limits_t limits; //  as used (signal_every resolved)
} kvp_rdma_plan_t;

//  Plans count transfers. local holds this node's regions (lkey), remote the peer's (rkey).
//  Returns a new plan, or NULL with a one-line reason in reason (naming the transfer's index
//  where one is at fault): bad limits, an unknown op, an unknown remote segment, a remote range
//  outside its segment, local memory not registered (or with a gap), too many transfers or
//  WRs, out of memory. Caller owns the return value and must destroy it.
kvp_rdma_plan_t *kvp_rdma_plan_build (const kvp_rdma_limits_t *limits, const kvp_rdma_regs_t *local,
                                      const kvp_rdma_regs_t *remote, const kvp_rdma_xfer_t *xfers,
                                      size_t count, char *reason, size_t reason_size);

//  Frees a plan. Does nothing on NULL; sets *self_p to NULL.
void kvp_rdma_plan_destroy (kvp_rdma_plan_t **self_p);

//  Checks limits and resolves signal_every's default into *resolved (may be NULL). Returns 0,
//  or -1 with a reason.
int kvp_rdma_limits_check (const kvp_rdma_limits_t *limits, kvp_rdma_limits_t *resolved,
                           char *reason, size_t reason_size);

void kvp_rdma_plan_test (bool verbose);

#endif
