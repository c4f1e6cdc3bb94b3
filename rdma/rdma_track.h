/*  rdma_track.h - completion accounting for RDMA transfers: which are done, which failed, and
    how full each queue pair's send queue is.

    The poster (rdma/rdma.c) gives the tracker each plan (rdma/rdma_plan.h) before posting
    it; the tracker gives each transfer an id and stamps every WR's wr_id with it, so that a
    completion (struct ibv_wc) leads back to its transfer. Then, for each WR, the poster asks
    kvp_rdma_track_room whether its QP's send queue has a free slot, posts it and calls
    kvp_rdma_track_posted (or kvp_rdma_track_unposted when it gives up on it). Each completion
    polled from the CQ goes to kvp_rdma_track_complete; finished transfers come out of
    kvp_rdma_track_next_done in the order they finished.

    Rules, from how RC queue pairs behave:
      - A transfer is done when all its signalled WRs have completed. Completions on one QP
        come in posting order and the plan signals each transfer's last WR on every QP it
        uses, so by then no WR of it is still moving data. A failed transfer is reported only
        then too: a retry elsewhere must not race a late RDMA READ into the same buffer.
      - Any error completion fails its transfer (the caller retries elsewhere) and breaks its
        QP: an RC QP that reported an error is in the error state and flushes every WR after
        it (each signalled one comes back with IBV_WC_WR_FLUSH_ERR, failing its transfer too).
        A broken QP has no room; WRs still meant for it are given up (unposted), which fails
        their transfers at once. That is safe because nothing more runs on a broken QP: after
        an error completion the QP flushes all it holds, and a QP the caller breaks itself
        (kvp_rdma_track_break, after a failed post) must first be moved to the error state.
      - A send-queue slot is freed when a signalled WR completes: it frees itself and every
        unsignalled WR posted before it on that QP. An error completion of an unsignalled WR
        frees nothing (the flush of the next signalled one does).
      - A transfer with no WRs (zero length) is done at once.

    wr_id layout: slot (32 bits) | generation (23) | qp (8) | signalled (1). The generation
    changes every time a slot is reused, so a completion for a transfer that is gone (or a
    wr_id that was never stamped, 0) is refused rather than counted against another.

    Pure: no verbs, no allocation after kvp_rdma_track_new. Threads: not thread-safe; the thread
    that posts and polls owns the tracker.
*/
#ifndef KVP_RDMA_TRACK_H_INCLUDED
#define KVP_RDMA_TRACK_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdma/rdma_plan.h"

//  Most transfers one tracker follows at a time.
#define KVP_RDMA_TRACK_MAX_TRANSFERS (1u << 24)

typedef struct _kvp_rdma_track_t kvp_rdma_track_t;

//  A finished transfer.
typedef struct {
    uint64_t tag; //  the caller's, from kvp_rdma_xfer_t
    uint64_t len; //  bytes it was to move
    int status;   //  0: every byte moved; -1: failed (retry it elsewhere)
} kvp_rdma_done_t;

//  A tracker for qp_count QPs (1 .. KVP_RDMA_PLAN_MAX_QPS) of max_outstanding send-queue
//  slots each, following up to max_transfers transfers (1 .. KVP_RDMA_TRACK_MAX_TRANSFERS),
//  counting finished ones not yet taken by kvp_rdma_track_next_done. Returns NULL on bad
//  arguments or out of memory. Caller owns the return value and must destroy it.
kvp_rdma_track_t *kvp_rdma_track_new (unsigned qp_count, unsigned max_outstanding,
                                      size_t max_transfers);

//  Frees the tracker. Does nothing on NULL; sets *self_p to NULL.
void kvp_rdma_track_destroy (kvp_rdma_track_t **self_p);

//  Starts following the plan's transfers: fills plan->xfers[i].id and every plan->wrs[k].wr_id.
//  Transfers with no WRs are done at once. The plan's qp_count and max_outstanding must be the
//  tracker's. Returns 0, or -1 with *reason_p (may be NULL) set when there are not enough free
//  transfer slots (then nothing changed: take finished ones and try again).
int kvp_rdma_track_add (kvp_rdma_track_t *self, kvp_rdma_plan_t *plan, const char **reason_p);

//  Free send-queue slots of QP qp: WRs that may be posted on it now. 0 for a broken QP.
unsigned kvp_rdma_track_room (kvp_rdma_track_t *self, unsigned qp);

//  Whether QP qp is broken (an error completion, a failed post, or kvp_rdma_track_break).
bool kvp_rdma_track_broken (kvp_rdma_track_t *self, unsigned qp);

//  Marks QP qp broken: no more room. WRs in flight on it still complete (flushed).
void kvp_rdma_track_break (kvp_rdma_track_t *self, unsigned qp);

//  Records that wr (stamped by kvp_rdma_track_add) was posted. Needs room on its QP.
void kvp_rdma_track_posted (kvp_rdma_track_t *self, const kvp_rdma_wr_t *wr);

//  Records that wr will never be posted: its transfer fails; if wr was signalled, it counts as
//  completed. Returns 0, or -1 for a wr_id of no transfer being followed.
int kvp_rdma_track_unposted (kvp_rdma_track_t *self, const kvp_rdma_wr_t *wr);

//  Records a completion: wr_id and whether its status was IBV_WC_SUCCESS. Returns 0, or -1
//  for a wr_id the tracker does not expect (never stamped, of a transfer already finished, a
//  signalled completion with no signalled WR outstanding on its QP); such a completion
//  changes nothing.
int kvp_rdma_track_complete (kvp_rdma_track_t *self, uint64_t wr_id, bool ok);

//  Takes the next finished transfer, in the order they finished. Returns false when none.
bool kvp_rdma_track_next_done (kvp_rdma_track_t *self, kvp_rdma_done_t *done);

//  Transfers added and not yet taken by kvp_rdma_track_next_done.
size_t kvp_rdma_track_active (kvp_rdma_track_t *self);

//  WRs posted on QP qp whose slots are not yet free.
unsigned kvp_rdma_track_outstanding (kvp_rdma_track_t *self, unsigned qp);

//  The parts of a wr_id (for logs and tests).
uint32_t kvp_rdma_wr_id_slot (uint64_t wr_id);
unsigned kvp_rdma_wr_id_qp (uint64_t wr_id);
bool kvp_rdma_wr_id_signaled (uint64_t wr_id);

void kvp_rdma_track_test (bool verbose);

#endif
