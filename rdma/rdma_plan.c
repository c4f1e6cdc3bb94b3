/*  rdma_plan.c - cutting RDMA transfers into work requests (see rdma_plan.h).

    One pass over the batch. Per QP the planner keeps how many WRs it placed since the last
    signalled one (signalling the signal_every-th); per transfer, the last WR it placed on each
    QP, which is signalled once the transfer is cut (resetting that QP's count: the completion
    covers every WR before it). The round-robin position carries over from one transfer to the
    next. Every size is checked before it is added, so nothing wraps: the remote range against
    its segment, each local piece against the region holding its first byte.
*/
#include "rdma/rdma_plan.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_WR SIZE_MAX

static void
s_reason (char *reason, size_t size, const char *format, ...)
{
    if (!reason || size == 0)
        return;
    va_list args;
    va_start (args, format);
    vsnprintf (reason, size, format, args);
    va_end (args);
}

int
kvp_rdma_limits_check (const kvp_rdma_limits_t *limits, kvp_rdma_limits_t *resolved, char *reason,
                       size_t reason_size)
{
    assert (limits);
    if (limits->max_msg == 0 || limits->max_msg > KVP_RDMA_PLAN_MAX_MSG) {
        s_reason (reason, reason_size, "max message size %llu is not 1 .. 2^31",
                  (unsigned long long) limits->max_msg);
        return -1;
    }
    if (limits->qp_count == 0 || limits->qp_count > KVP_RDMA_PLAN_MAX_QPS) {
        s_reason (reason, reason_size, "queue pair count %u is not 1 .. %d", limits->qp_count,
                  KVP_RDMA_PLAN_MAX_QPS);
        return -1;
    }
    if (limits->max_outstanding == 0) {
        s_reason (reason, reason_size, "max outstanding work requests is 0");
        return -1;
    }
    if (limits->signal_every > limits->max_outstanding) {
        //  The send queue would fill with WRs none of which ever completes.
        s_reason (reason, reason_size, "signal every %u is above max outstanding %u",
                  limits->signal_every, limits->max_outstanding);
        return -1;
    }
    if (resolved) {
        *resolved = *limits;
        if (resolved->signal_every == 0)
            resolved->signal_every =
                resolved->max_outstanding > 1 ? resolved->max_outstanding / 2 : 1;
    }
    return 0;
}

void
kvp_rdma_plan_destroy (kvp_rdma_plan_t **self_p)
{
    assert (self_p);
    if (*self_p) {
        free ((*self_p)->wrs);
        free ((*self_p)->xfers);
        free (*self_p);
        *self_p = NULL;
    }
}

//  Appends a WR; returns its index, or NO_WR when out of room or memory.
static size_t
s_push (kvp_rdma_plan_t *self, size_t *capacity, const kvp_rdma_wr_t *wr)
{
    if (self->wr_count == KVP_RDMA_PLAN_MAX_WRS)
        return NO_WR;
    if (self->wr_count == *capacity) {
        size_t grown = *capacity ? *capacity * 2 : 64;
        kvp_rdma_wr_t *wrs = (kvp_rdma_wr_t *) realloc (self->wrs, grown * sizeof *wrs);
        if (!wrs)
            return NO_WR;
        self->wrs = wrs;
        *capacity = grown;
    }
    self->wrs[self->wr_count] = *wr;
    return self->wr_count++;
}

kvp_rdma_plan_t *
kvp_rdma_plan_build (const kvp_rdma_limits_t *limits, const kvp_rdma_regs_t *local,
                     const kvp_rdma_regs_t *remote, const kvp_rdma_xfer_t *xfers, size_t count,
                     char *reason, size_t reason_size)
{
    assert (limits);
    assert (local);
    assert (remote);
    assert (xfers || count == 0);
    kvp_rdma_limits_t lim;
    if (kvp_rdma_limits_check (limits, &lim, reason, reason_size))
        return NULL;
    if (count > KVP_RDMA_PLAN_MAX_XFERS) {
        s_reason (reason, reason_size, "%zu transfers in one batch (most %u)", count,
                  KVP_RDMA_PLAN_MAX_XFERS);
        return NULL;
    }
    kvp_rdma_plan_t *self = (kvp_rdma_plan_t *) calloc (1, sizeof *self);
    if (!self
        || (count
            && !(self->xfers =
                     (kvp_rdma_plan_xfer_t *) calloc (count, sizeof (kvp_rdma_plan_xfer_t))))) {
        s_reason (reason, reason_size, "out of memory");
        kvp_rdma_plan_destroy (&self);
        return NULL;
    }
    self->xfer_count = count;
    self->limits = lim;
    size_t capacity = 0;
    unsigned since_signal[KVP_RDMA_PLAN_MAX_QPS] = {0};
    size_t last_on_qp[KVP_RDMA_PLAN_MAX_QPS];
    unsigned next_qp = 0;

    for (size_t i = 0; i < count; i++) {
        const kvp_rdma_xfer_t *x = &xfers[i];
        kvp_rdma_plan_xfer_t *px = &self->xfers[i];
        px->tag = x->tag;
        px->len = x->len;
        if (x->op != KVP_RDMA_READ && x->op != KVP_RDMA_WRITE) {
            s_reason (reason, reason_size, "transfer %zu: unknown op %d", i, (int) x->op);
            goto fail;
        }
        const kvp_rdma_region_t *seg = kvp_rdma_regs_by_id (remote, x->remote_segment);
        if (!seg) {
            s_reason (reason, reason_size, "transfer %zu: peer has no segment %u", i,
                      x->remote_segment);
            goto fail;
        }
        if (x->remote_offset > seg->len || x->len > seg->len - x->remote_offset) {
            s_reason (reason, reason_size,
                      "transfer %zu: %llu bytes at offset %llu are outside segment %u (%llu bytes)",
                      i, (unsigned long long) x->len, (unsigned long long) x->remote_offset,
                      x->remote_segment, (unsigned long long) seg->len);
            goto fail;
        }
        for (unsigned q = 0; q < lim.qp_count; q++)
            last_on_qp[q] = NO_WR;
        uint64_t stripe = lim.stripe ? lim.stripe : x->len;
        uint64_t done = 0;
        while (done < x->len) {
            unsigned qp = next_qp;
            next_qp = (next_qp + 1) % lim.qp_count;
            uint64_t stripe_end = x->len - done > stripe ? done + stripe : x->len;
            while (done < stripe_end) {
                uint64_t local_addr = x->local_addr + done; //  no wrap: checked piece by piece
                const kvp_rdma_region_t *region = kvp_rdma_regs_find (local, local_addr, 0);
                if (!region) {
                    s_reason (reason, reason_size,
                              "transfer %zu: local address 0x%llx (offset %llu) is not in a "
                              "registered region",
                              i, (unsigned long long) local_addr, (unsigned long long) done);
                    goto fail;
                }
                uint64_t n = stripe_end - done;
                if (n > lim.max_msg)
                    n = lim.max_msg;
                uint64_t region_left = region->addr + region->len - local_addr;
                if (n > region_left)
                    n = region_left;
                kvp_rdma_wr_t wr = {.local_addr = local_addr,
                                    .remote_addr = seg->addr + x->remote_offset + done,
                                    .lkey = region->lkey,
                                    .rkey = seg->rkey,
                                    .len = (uint32_t) n,
                                    .xfer = (uint32_t) i,
                                    .qp = (uint8_t) qp,
                                    .op = x->op};
                if (++since_signal[qp] == lim.signal_every) {
                    wr.signaled = true;
                    since_signal[qp] = 0;
                }
                size_t at = s_push (self, &capacity, &wr);
                if (at == NO_WR) {
                    s_reason (reason, reason_size,
                              self->wr_count == KVP_RDMA_PLAN_MAX_WRS
                                  ? "batch needs more than %u work requests: split it"
                                  : "out of memory (%u)",
                              KVP_RDMA_PLAN_MAX_WRS);
                    goto fail;
                }
                last_on_qp[qp] = at;
                px->wrs++;
                done += n;
            }
        }
        for (unsigned q = 0; q < lim.qp_count; q++)
            if (last_on_qp[q] != NO_WR) {
                self->wrs[last_on_qp[q]].signaled = true;
                since_signal[q] = 0;
            }
        for (size_t k = self->wr_count - px->wrs; k < self->wr_count; k++)
            px->signaled += self->wrs[k].signaled;
    }
    return self;

fail:
    kvp_rdma_plan_destroy (&self);
    return NULL;
}

//  ---- self test -----------------------------------------------------------------------

static kvp_rdma_regs_t *
s_regs (const kvp_rdma_region_t *regions, size_t count)
{
    kvp_rdma_regs_t *regs = kvp_rdma_regs_new ();
    assert (regs);
    for (size_t i = 0; i < count; i++)
        assert (kvp_rdma_regs_add (regs, &regions[i], NULL) == 0);
    return regs;
}

//  Checks what must hold for any plan: WRs of a transfer tile its local and remote ranges in
//  order, within max_msg, never crossing a local region's end, with the keys of the regions
//  they fall in; QPs in range; per QP no run of more than signal_every unsignalled WRs; the
//  last WR of each transfer on each QP it uses signalled; counts add up.
static void
s_check_plan (const kvp_rdma_plan_t *plan, const kvp_rdma_regs_t *local,
              const kvp_rdma_regs_t *remote, const kvp_rdma_xfer_t *xfers, size_t count)
{
    const kvp_rdma_limits_t *lim = &plan->limits;
    assert (plan->xfer_count == count);
    unsigned run[KVP_RDMA_PLAN_MAX_QPS] = {0};
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        const kvp_rdma_xfer_t *x = &xfers[i];
        const kvp_rdma_region_t *seg = kvp_rdma_regs_by_id (remote, x->remote_segment);
        uint64_t done = 0;
        uint32_t wrs = 0, signaled = 0;
        size_t first = k;
        for (; k < plan->wr_count && plan->wrs[k].xfer == i; k++, wrs++) {
            const kvp_rdma_wr_t *wr = &plan->wrs[k];
            assert (wr->len > 0 && wr->len <= lim->max_msg);
            assert (wr->op == x->op && wr->wr_id == 0);
            assert (wr->qp < lim->qp_count);
            assert (wr->local_addr == x->local_addr + done);
            assert (wr->remote_addr == seg->addr + x->remote_offset + done);
            assert (wr->rkey == seg->rkey);
            const kvp_rdma_region_t *region = kvp_rdma_regs_find (local, wr->local_addr, wr->len);
            assert (region && wr->lkey == region->lkey);
            if (lim->stripe) //  no WR spans a stripe boundary
                assert (done / lim->stripe == (done + wr->len - 1) / lim->stripe);
            run[wr->qp] = wr->signaled ? 0 : run[wr->qp] + 1;
            assert (run[wr->qp] < lim->signal_every);
            signaled += wr->signaled;
            done += wr->len;
        }
        assert (done == x->len);
        assert (plan->xfers[i].wrs == wrs && plan->xfers[i].signaled == signaled);
        assert (plan->xfers[i].tag == x->tag && plan->xfers[i].len == x->len);
        assert ((wrs == 0) == (x->len == 0));
        //  The last WR on each QP this transfer used is signalled.
        for (unsigned q = 0; q < lim->qp_count; q++)
            for (size_t j = k; j-- > first;)
                if (plan->wrs[j].qp == q) {
                    assert (plan->wrs[j].signaled);
                    break;
                }
    }
    assert (k == plan->wr_count);
}

void
kvp_rdma_plan_test (bool verbose)
{
    char reason[256];
    //  Local: [0x10000, +1 MiB) lkey 0x11 and, touching it, [+1 MiB, +2 MiB) lkey 0x12; a gap;
    //  [0x800000, +64 KiB) lkey 0x13.
    kvp_rdma_region_t local_regions[] = {{1, 0x10000, 1 << 20, 0x11, 0, NULL},
                                         {2, 0x10000 + (1 << 20), 1 << 20, 0x12, 0, NULL},
                                         {3, 0x800000, 1 << 16, 0x13, 0, NULL}};
    //  Remote: segment 7 of 4 MiB at 0x7f0000000000 rkey 0x77, segment 8 of 4 KiB rkey 0x88.
    kvp_rdma_region_t remote_regions[] = {{7, 0x7f0000000000ULL, 4 << 20, 0, 0x77, NULL},
                                          {8, 0x7f1000000000ULL, 4096, 0, 0x88, NULL}};
    kvp_rdma_regs_t *local = s_regs (local_regions, 3);
    kvp_rdma_regs_t *remote = s_regs (remote_regions, 2);
    kvp_rdma_limits_t lim = {.max_msg = 64 * 1024,
                             .stripe = 256 * 1024,
                             .qp_count = 4,
                             .max_outstanding = 16,
                             .signal_every = 0};

    //  Limits: each bound, and the default signal interval.
    kvp_rdma_limits_t resolved, bad = lim;
    assert (kvp_rdma_limits_check (&lim, &resolved, reason, sizeof reason) == 0);
    assert (resolved.signal_every == 8);
    bad.max_msg = 0;
    assert (kvp_rdma_limits_check (&bad, NULL, reason, sizeof reason) == -1);
    bad.max_msg = KVP_RDMA_PLAN_MAX_MSG + 1;
    assert (kvp_rdma_limits_check (&bad, NULL, reason, sizeof reason) == -1);
    bad = lim;
    bad.qp_count = 0;
    assert (kvp_rdma_limits_check (&bad, NULL, reason, sizeof reason) == -1);
    bad.qp_count = KVP_RDMA_PLAN_MAX_QPS + 1;
    assert (kvp_rdma_limits_check (&bad, NULL, reason, sizeof reason) == -1);
    bad = lim;
    bad.max_outstanding = 0;
    assert (kvp_rdma_limits_check (&bad, NULL, reason, sizeof reason) == -1);
    bad = lim;
    bad.signal_every = 17;
    assert (kvp_rdma_limits_check (&bad, NULL, reason, sizeof reason) == -1);
    assert (strstr (reason, "signal every 17"));
    bad.max_outstanding = 1;
    bad.signal_every = 0;
    assert (kvp_rdma_limits_check (&bad, &resolved, reason, sizeof reason) == 0);
    assert (resolved.signal_every == 1);
    kvp_rdma_xfer_t one = {42, KVP_RDMA_WRITE, 0x10000, 7, 0, 100};
    lim.qp_count = 0;
    assert (kvp_rdma_plan_build (&lim, local, remote, &one, 1, reason, sizeof reason) == NULL);
    lim.qp_count = 4;

    //  One small transfer: one WR, signalled, on QP 0.
    kvp_rdma_plan_t *plan =
        kvp_rdma_plan_build (&lim, local, remote, &one, 1, reason, sizeof reason);
    assert (plan);
    assert (plan->wr_count == 1);
    assert (plan->wrs[0].qp == 0 && plan->wrs[0].signaled && plan->wrs[0].len == 100);
    assert (plan->wrs[0].lkey == 0x11 && plan->wrs[0].rkey == 0x77);
    assert (plan->wrs[0].remote_addr == 0x7f0000000000ULL);
    assert (plan->xfers[0].tag == 42 && plan->xfers[0].signaled == 1);
    kvp_rdma_plan_destroy (&plan);
    assert (plan == NULL);
    kvp_rdma_plan_destroy (&plan);

    //  1 MiB + 100 bytes read at local 0x10000 + 512 KiB: crosses from region 1 into region 2
    //  at +512 KiB; stripes of 256 KiB over 4 QPs; WRs of 64 KiB; the 100-byte tail on QP 0.
    kvp_rdma_xfer_t big = {43, KVP_RDMA_READ, 0x10000 + (512 << 10), 7, 4096, (1 << 20) + 100};
    plan = kvp_rdma_plan_build (&lim, local, remote, &big, 1, reason, sizeof reason);
    assert (plan);
    s_check_plan (plan, local, remote, &big, 1);
    assert (plan->wr_count == 16 + 1);
    for (size_t k = 0; k < 16; k++) {
        assert (plan->wrs[k].len == 64 * 1024);
        assert (plan->wrs[k].qp == k / 4);
        assert (plan->wrs[k].lkey == (k < 8 ? 0x11 : 0x12));
        assert (plan->wrs[k].op == KVP_RDMA_READ);
        //  Each QP's last WR of the transfer is signalled (QP 0's is the tail), and no other
        //  (4 per QP, below the interval of 8).
        assert (plan->wrs[k].signaled == (k % 4 == 3 && k / 4 != 0));
    }
    assert (plan->wrs[16].len == 100 && plan->wrs[16].qp == 0 && plan->wrs[16].signaled);
    assert (plan->xfers[0].wrs == 17 && plan->xfers[0].signaled == 4);
    kvp_rdma_plan_destroy (&plan);

    //  A region end inside a WR: the WR is cut there, the stripe goes on in the next region.
    lim.stripe = 0; //  no striping: all on one QP
    kvp_rdma_xfer_t cross = {44, KVP_RDMA_WRITE, 0x10000 + (1 << 20) - 1000, 7, 0, 3000};
    plan = kvp_rdma_plan_build (&lim, local, remote, &cross, 1, reason, sizeof reason);
    assert (plan && plan->wr_count == 2);
    assert (plan->wrs[0].len == 1000 && plan->wrs[0].lkey == 0x11 && !plan->wrs[0].signaled);
    assert (plan->wrs[1].len == 2000 && plan->wrs[1].lkey == 0x12 && plan->wrs[1].signaled);
    assert (plan->wrs[0].qp == 0 && plan->wrs[1].qp == 0);
    s_check_plan (plan, local, remote, &cross, 1);
    kvp_rdma_plan_destroy (&plan);
    lim.stripe = 256 * 1024;

    //  Refused: local memory past the last region (a gap), unregistered local memory, an
    //  unknown segment, a remote range past the segment's end, an offset past it, an unknown
    //  op. The reason names the transfer.
    kvp_rdma_xfer_t refused[] = {
        {1, KVP_RDMA_WRITE, 0x10000 + (2 << 20) - 10, 7, 0, 20}, //  runs into the gap
        {2, KVP_RDMA_WRITE, 0x5000, 7, 0, 10},                   //  not registered
        {3, KVP_RDMA_READ, 0x10000, 9, 0, 10},                   //  no segment 9
        {4, KVP_RDMA_READ, 0x10000, 8, 4000, 97},                //  4000 + 97 > 4096
        {5, KVP_RDMA_READ, 0x10000, 8, 4097, 0},                 //  offset past the end
        {6, (kvp_rdma_op_t) 3, 0x10000, 7, 0, 10}};
    const char *want[] = {
        "not in a registered region", "not in a registered region", "no segment 9",
        "outside segment 8",          "outside segment 8",          "unknown op"};
    for (size_t i = 0; i < 6; i++) {
        kvp_rdma_xfer_t pair[2] = {one, refused[i]};
        reason[0] = 0;
        assert (kvp_rdma_plan_build (&lim, local, remote, pair, 2, reason, sizeof reason) == NULL);
        assert (strstr (reason, want[i]) && strstr (reason, "transfer 1:"));
    }
    //  The edges that are fine: the segment's last byte, a zero-length transfer at its end.
    kvp_rdma_xfer_t edges[] = {{10, KVP_RDMA_READ, 0x800000, 8, 4095, 1},
                               {11, KVP_RDMA_READ, 0x800000, 8, 4096, 0},
                               {12, KVP_RDMA_WRITE, 0x800000, 8, 0, 4096},
                               {13, KVP_RDMA_WRITE, 0x800000 + (1 << 16) - 1, 8, 0, 1}};
    plan = kvp_rdma_plan_build (&lim, local, remote, edges, 4, reason, sizeof reason);
    assert (plan);
    s_check_plan (plan, local, remote, edges, 4);
    assert (plan->wr_count == 3);
    assert (plan->xfers[1].wrs == 0 && plan->xfers[1].signaled == 0);
    kvp_rdma_plan_destroy (&plan);

    //  An empty batch is an empty plan.
    plan = kvp_rdma_plan_build (&lim, local, remote, NULL, 0, reason, sizeof reason);
    assert (plan && plan->wr_count == 0 && plan->xfer_count == 0);
    kvp_rdma_plan_destroy (&plan);

    //  A batch of 1000 small transfers: round-robin over the QPs, one WR each, every one
    //  signalled (each is the last of its transfer on its QP).
    size_t n = 1000;
    kvp_rdma_xfer_t *many = (kvp_rdma_xfer_t *) calloc (n, sizeof *many);
    for (size_t i = 0; i < n; i++)
        many[i] = (kvp_rdma_xfer_t){
            i,           i % 2 ? KVP_RDMA_READ : KVP_RDMA_WRITE, 0x10000 + i * 2048, 7, i * 4096,
            1 + i % 2048};
    plan = kvp_rdma_plan_build (&lim, local, remote, many, n, reason, sizeof reason);
    assert (plan && plan->wr_count == n);
    s_check_plan (plan, local, remote, many, n);
    unsigned per_qp[4] = {0};
    for (size_t k = 0; k < n; k++) {
        assert (plan->wrs[k].qp == k % 4 && plan->wrs[k].signaled);
        per_qp[plan->wrs[k].qp]++;
    }
    assert (per_qp[0] == 250 && per_qp[3] == 250);
    kvp_rdma_plan_destroy (&plan);

    //  Signal every Nth: one QP, stripe and max_msg 4 KiB, 2 MiB: 512 WRs, signalled every
    //  8th and the last.
    lim.qp_count = 1;
    lim.max_msg = 4096;
    lim.stripe = 4096;
    kvp_rdma_xfer_t long_one = {50, KVP_RDMA_WRITE, 0x10000, 7, 0, 2 << 20};
    plan = kvp_rdma_plan_build (&lim, local, remote, &long_one, 1, reason, sizeof reason);
    assert (plan && plan->wr_count == 512);
    for (size_t k = 0; k < 512; k++)
        assert (plan->wrs[k].signaled == (k % 8 == 7));
    assert (plan->xfers[0].signaled == 64);
    s_check_plan (plan, local, remote, &long_one, 1);
    kvp_rdma_plan_destroy (&plan);

    //  Random batches and limits, checked by s_check_plan.
    uint64_t state = 88172645463325252ULL;
    size_t total_wrs = 0;
    for (int round = 0; round < 300; round++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        kvp_rdma_limits_t r = {.max_msg = 1 + state % 70000,
                               .stripe = (state >> 20) % 3 ? 1 + (state >> 24) % 300000 : 0,
                               .qp_count = 1 + (unsigned) ((state >> 40) % 8),
                               .max_outstanding = 1 + (unsigned) ((state >> 44) % 32)};
        r.signal_every = (unsigned) ((state >> 50) % (r.max_outstanding + 1));
        size_t count = 1 + (size_t) ((state >> 56) % 20);
        for (size_t i = 0; i < count; i++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            uint64_t len = state % 3 ? state % 500000 : state % 64;
            uint64_t at = (state >> 24) % ((2 << 20) - len + 1); //  in regions 1-2
            uint64_t off = (state >> 12) % ((4 << 20) - len + 1);
            many[i] = (kvp_rdma_xfer_t){
                i, (state >> 60) % 2 ? KVP_RDMA_READ : KVP_RDMA_WRITE, 0x10000 + at, 7, off, len};
        }
        plan = kvp_rdma_plan_build (&r, local, remote, many, count, reason, sizeof reason);
        assert (plan);
        s_check_plan (plan, local, remote, many, count);
        total_wrs += plan->wr_count;
        kvp_rdma_plan_destroy (&plan);
    }
    free (many);
    kvp_rdma_regs_destroy (&local);
    kvp_rdma_regs_destroy (&remote);
    if (verbose)
        printf ("(%zu random WRs) ", total_wrs);
}
