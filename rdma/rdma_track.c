/*  rdma_track.c - completion accounting for RDMA transfers (see rdma_track.h).

    Transfers live in a fixed array of slots; free slots are a linked list, and so are the
    finished ones waiting for kvp_rdma_track_next_done (in the order they finished). A slot is
    freed when its transfer is taken, so a caller that stops taking them stops getting new
    slots, and nothing here allocates after new.

    Per QP: outstanding WRs, the unsignalled ones posted since the last signalled one (run),
    and a ring with, for each signalled WR posted and not yet completed, how many slots its
    completion frees (the run before it, plus itself). A QP has at most max_outstanding WRs
    posted, each signalled one frees at least one slot, so the ring never holds more than
    max_outstanding entries.
*/
#include "rdma/rdma_track.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEN_BITS 23
#define GEN_MASK ((1u << GEN_BITS) - 1)
#define NONE UINT32_MAX

typedef struct {
    uint64_t tag;
    uint64_t len;
    uint32_t gen;       //  1 .. GEN_MASK; changes when the slot is freed
    uint32_t remaining; //  signalled WRs not yet completed (or given up)
    uint32_t next;      //  in the free list or the finished list
    bool active;        //  added, not yet taken
    bool finished;      //  in the finished list
    bool failed;
} s_slot_t;

typedef struct {
    unsigned outstanding; //  posted, slot not yet freed
    unsigned run;         //  unsignalled WRs posted since the last signalled one
    unsigned *frees;      //  ring of max_outstanding entries
    unsigned head, count;
    bool broken;
} s_qp_t;

struct _kvp_rdma_track_t {
    unsigned qp_count;
    unsigned max_outstanding;
    size_t capacity;
    s_slot_t *slots;
    uint32_t free_head;
    size_t free_count;
    uint32_t done_head, done_tail;
    s_qp_t qps[KVP_RDMA_PLAN_MAX_QPS];
    unsigned *frees; //  qp_count rings, one block
};

uint32_t
kvp_rdma_wr_id_slot (uint64_t wr_id)
{
    return (uint32_t) (wr_id >> 32);
}

static uint32_t
s_wr_id_gen (uint64_t wr_id)
{
    return (uint32_t) (wr_id >> 9) & GEN_MASK;
}

unsigned
kvp_rdma_wr_id_qp (uint64_t wr_id)
{
    return (unsigned) (wr_id >> 1) & 0xff;
}

bool
kvp_rdma_wr_id_signaled (uint64_t wr_id)
{
    return wr_id & 1;
}

kvp_rdma_track_t *
kvp_rdma_track_new (unsigned qp_count, unsigned max_outstanding, size_t max_transfers)
{
    if (qp_count == 0 || qp_count > KVP_RDMA_PLAN_MAX_QPS || max_outstanding == 0
        || max_transfers == 0 || max_transfers > KVP_RDMA_TRACK_MAX_TRANSFERS)
        return NULL;
    kvp_rdma_track_t *self = (kvp_rdma_track_t *) calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->qp_count = qp_count;
    self->max_outstanding = max_outstanding;
    self->capacity = max_transfers;
    self->slots = (s_slot_t *) calloc (max_transfers, sizeof (s_slot_t));
    self->frees = (unsigned *) calloc ((size_t) qp_count * max_outstanding, sizeof (unsigned));
    if (!self->slots || !self->frees) {
        kvp_rdma_track_destroy (&self);
        return NULL;
    }
    for (size_t i = 0; i < max_transfers; i++) {
        self->slots[i].gen = 1;
        self->slots[i].next = i + 1 < max_transfers ? (uint32_t) (i + 1) : NONE;
    }
    self->free_head = 0;
    self->free_count = max_transfers;
    self->done_head = self->done_tail = NONE;
    for (unsigned q = 0; q < qp_count; q++)
        self->qps[q].frees = self->frees + (size_t) q * max_outstanding;
    return self;
}

void
kvp_rdma_track_destroy (kvp_rdma_track_t **self_p)
{
    assert (self_p);
    if (*self_p) {
        free ((*self_p)->slots);
        free ((*self_p)->frees);
        free (*self_p);
        *self_p = NULL;
    }
}

static void
s_finish (kvp_rdma_track_t *self, uint32_t index)
{
    s_slot_t *slot = &self->slots[index];
    assert (slot->active && !slot->finished && slot->remaining == 0);
    slot->finished = true;
    slot->next = NONE;
    if (self->done_tail == NONE)
        self->done_head = index;
    else
        self->slots[self->done_tail].next = index;
    self->done_tail = index;
}

int
kvp_rdma_track_add (kvp_rdma_track_t *self, kvp_rdma_plan_t *plan, const char **reason_p)
{
    assert (self);
    assert (plan);
    assert (plan->limits.qp_count == self->qp_count);
    assert (plan->limits.max_outstanding == self->max_outstanding);
    if (plan->xfer_count > self->free_count) {
        if (reason_p)
            *reason_p = "too many transfers in flight";
        return -1;
    }
    for (size_t i = 0; i < plan->xfer_count; i++) {
        kvp_rdma_plan_xfer_t *x = &plan->xfers[i];
        assert ((x->wrs == 0) == (x->signaled == 0));
        uint32_t index = self->free_head;
        s_slot_t *slot = &self->slots[index];
        self->free_head = slot->next;
        self->free_count--;
        slot->tag = x->tag;
        slot->len = x->len;
        slot->remaining = x->signaled;
        slot->active = true;
        slot->finished = false;
        slot->failed = false;
        x->id = ((uint64_t) index << 32) | ((uint64_t) slot->gen << 9);
        if (x->signaled == 0)
            s_finish (self, index);
    }
    for (size_t k = 0; k < plan->wr_count; k++) {
        kvp_rdma_wr_t *wr = &plan->wrs[k];
        assert (wr->xfer < plan->xfer_count && wr->qp < self->qp_count);
        wr->wr_id = plan->xfers[wr->xfer].id | ((uint64_t) wr->qp << 1) | wr->signaled;
    }
    return 0;
}

unsigned
kvp_rdma_track_room (kvp_rdma_track_t *self, unsigned qp)
{
    assert (self && qp < self->qp_count);
    s_qp_t *q = &self->qps[qp];
    return q->broken ? 0 : self->max_outstanding - q->outstanding;
}

bool
kvp_rdma_track_broken (kvp_rdma_track_t *self, unsigned qp)
{
    assert (self && qp < self->qp_count);
    return self->qps[qp].broken;
}

void
kvp_rdma_track_break (kvp_rdma_track_t *self, unsigned qp)
{
    assert (self && qp < self->qp_count);
    self->qps[qp].broken = true;
}

//  The slot a wr_id names, if it is a transfer being followed and not finished; else NULL.
static s_slot_t *
s_slot_of (kvp_rdma_track_t *self, uint64_t wr_id)
{
    uint32_t index = kvp_rdma_wr_id_slot (wr_id);
    if (index >= self->capacity || kvp_rdma_wr_id_qp (wr_id) >= self->qp_count)
        return NULL;
    s_slot_t *slot = &self->slots[index];
    if (!slot->active || slot->finished || slot->gen != s_wr_id_gen (wr_id))
        return NULL;
    return slot;
}

void
kvp_rdma_track_posted (kvp_rdma_track_t *self, const kvp_rdma_wr_t *wr)
{
    assert (self && wr);
    assert (s_slot_of (self, wr->wr_id));
    s_qp_t *q = &self->qps[wr->qp];
    assert (kvp_rdma_track_room (self, wr->qp) > 0);
    q->outstanding++;
    q->run++;
    if (wr->signaled) {
        assert (q->count < self->max_outstanding);
        q->frees[(q->head + q->count) % self->max_outstanding] = q->run;
        q->count++;
        q->run = 0;
    }
}

//  One signalled WR of slot is over (completed or given up).
static void
s_signalled_done (kvp_rdma_track_t *self, s_slot_t *slot)
{
    assert (slot->remaining > 0);
    if (--slot->remaining == 0)
        s_finish (self, (uint32_t) (slot - self->slots));
}

int
kvp_rdma_track_unposted (kvp_rdma_track_t *self, const kvp_rdma_wr_t *wr)
{
    assert (self && wr);
    s_slot_t *slot = s_slot_of (self, wr->wr_id);
    if (!slot)
        return -1;
    slot->failed = true;
    if (kvp_rdma_wr_id_signaled (wr->wr_id))
        s_signalled_done (self, slot);
    return 0;
}

int
kvp_rdma_track_complete (kvp_rdma_track_t *self, uint64_t wr_id, bool ok)
{
    assert (self);
    s_slot_t *slot = s_slot_of (self, wr_id);
    if (!slot)
        return -1;
    s_qp_t *q = &self->qps[kvp_rdma_wr_id_qp (wr_id)];
    bool signaled = kvp_rdma_wr_id_signaled (wr_id);
    if (signaled && q->count == 0)
        return -1; //  no signalled WR is outstanding on that QP
    if (!ok) {
        slot->failed = true;
        q->broken = true;
    }
    if (signaled) {
        unsigned frees = q->frees[q->head];
        q->head = (q->head + 1) % self->max_outstanding;
        q->count--;
        assert (frees <= q->outstanding);
        q->outstanding -= frees;
        s_signalled_done (self, slot);
    }
    return 0;
}

bool
kvp_rdma_track_next_done (kvp_rdma_track_t *self, kvp_rdma_done_t *done)
{
    assert (self && done);
    if (self->done_head == NONE)
        return false;
    uint32_t index = self->done_head;
    s_slot_t *slot = &self->slots[index];
    self->done_head = slot->next;
    if (self->done_head == NONE)
        self->done_tail = NONE;
    done->tag = slot->tag;
    done->len = slot->len;
    done->status = slot->failed ? -1 : 0;
    slot->active = slot->finished = false;
    slot->gen = slot->gen == GEN_MASK ? 1 : slot->gen + 1;
    slot->next = self->free_head;
    self->free_head = index;
    self->free_count++;
    return true;
}

size_t
kvp_rdma_track_active (kvp_rdma_track_t *self)
{
    assert (self);
    return self->capacity - self->free_count;
}

unsigned
kvp_rdma_track_outstanding (kvp_rdma_track_t *self, unsigned qp)
{
    assert (self && qp < self->qp_count);
    return self->qps[qp].outstanding;
}

//  ---- self test -----------------------------------------------------------------------

//  A plan by hand: xfer_count transfers, WRs given as (xfer, qp, signaled) triples.
static kvp_rdma_plan_t *
s_plan (unsigned qp_count, unsigned max_outstanding, size_t xfer_count, const int (*wrs)[3],
        size_t wr_count)
{
    kvp_rdma_plan_t *plan = (kvp_rdma_plan_t *) calloc (1, sizeof *plan);
    plan->limits.qp_count = qp_count;
    plan->limits.max_outstanding = max_outstanding;
    plan->xfer_count = xfer_count;
    plan->xfers = (kvp_rdma_plan_xfer_t *) calloc (xfer_count ? xfer_count : 1,
                                                   sizeof (kvp_rdma_plan_xfer_t));
    plan->wr_count = wr_count;
    plan->wrs = (kvp_rdma_wr_t *) calloc (wr_count ? wr_count : 1, sizeof (kvp_rdma_wr_t));
    for (size_t i = 0; i < xfer_count; i++) {
        plan->xfers[i].tag = 100 + i;
        plan->xfers[i].len = 1000 * (i + 1);
    }
    for (size_t k = 0; k < wr_count; k++) {
        plan->wrs[k].xfer = (uint32_t) wrs[k][0];
        plan->wrs[k].qp = (uint8_t) wrs[k][1];
        plan->wrs[k].signaled = wrs[k][2];
        plan->wrs[k].len = 1;
        plan->xfers[wrs[k][0]].wrs++;
        plan->xfers[wrs[k][0]].signaled += wrs[k][2];
    }
    return plan;
}

static uint64_t
s_rand (uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

//  A device for the simulation: per QP, the WRs posted and not yet executed, in order.
typedef struct {
    kvp_rdma_wr_t *fifo;
    size_t head, count, size;
    bool error; //  the QP is in the error state: the rest are flushed
} s_sim_qp_t;

//  Random plans over several QPs run against an in-order device that fails now and then.
//  Every transfer must finish exactly once, failed exactly when one of its WRs did not run
//  cleanly; no completion is refused; healthy QPs end with nothing outstanding.
static void
s_simulate (uint64_t seed, size_t *finished_p, size_t *failed_p)
{
    uint64_t state = seed;
    unsigned qp_count = 1 + (unsigned) (s_rand (&state) % 4);
    unsigned depth = 1 + (unsigned) (s_rand (&state) % 8);
    kvp_rdma_track_t *track = kvp_rdma_track_new (qp_count, depth, 64);
    assert (track);
    //  Local and remote memory, one region each.
    kvp_rdma_region_t lr = {1, 1 << 20, 1 << 20, 0x11, 0, NULL};
    kvp_rdma_region_t rr = {2, 1ULL << 40, 1 << 20, 0, 0x22, NULL};
    kvp_rdma_regs_t *local = kvp_rdma_regs_new ();
    kvp_rdma_regs_t *remote = kvp_rdma_regs_new ();
    assert (kvp_rdma_regs_add (local, &lr, NULL) == 0);
    assert (kvp_rdma_regs_add (remote, &rr, NULL) == 0);
    kvp_rdma_limits_t lim = {.max_msg = 1 + s_rand (&state) % 5000,
                             .stripe = s_rand (&state) % 8000,
                             .qp_count = qp_count,
                             .max_outstanding = depth,
                             .signal_every = (unsigned) (s_rand (&state) % (depth + 1))};
    kvp_rdma_xfer_t xfers[40];
    size_t count = 1 + s_rand (&state) % 40;
    for (size_t i = 0; i < count; i++)
        xfers[i] =
            (kvp_rdma_xfer_t){i, KVP_RDMA_WRITE, (1 << 20) + i * 20000,
                              2, i * 20000,      s_rand (&state) % 4 ? s_rand (&state) % 20000 : 0};
    char reason[200];
    kvp_rdma_plan_t *plan =
        kvp_rdma_plan_build (&lim, local, remote, xfers, count, reason, sizeof reason);
    assert (plan);
    assert (kvp_rdma_track_add (track, plan, NULL) == 0);
    assert (kvp_rdma_track_active (track) == count);

    s_sim_qp_t sim[KVP_RDMA_PLAN_MAX_QPS];
    for (unsigned q = 0; q < qp_count; q++)
        sim[q] = (s_sim_qp_t){calloc (depth, sizeof (kvp_rdma_wr_t)), 0, 0, depth, false};
    bool clean[40];
    for (size_t i = 0; i < count; i++)
        clean[i] = true;
    unsigned error_odds = 1 + (unsigned) (s_rand (&state) % 200); //  1 in this many fails
    size_t next = 0;                                              //  next WR to post
    int seen[40] = {0};
    size_t finished = 0, failed = 0;
    while (finished < count) {
        //  Post in plan order while there is room; give up WRs of broken QPs.
        while (next < plan->wr_count) {
            kvp_rdma_wr_t *wr = &plan->wrs[next];
            if (kvp_rdma_track_broken (track, wr->qp)) {
                assert (kvp_rdma_track_unposted (track, wr) == 0);
                clean[wr->xfer] = false;
            }
            else if (kvp_rdma_track_room (track, wr->qp) == 0)
                break;
            else {
                s_sim_qp_t *s = &sim[wr->qp];
                assert (s->count < s->size); //  room never lies
                s->fifo[(s->head + s->count++) % s->size] = *wr;
                kvp_rdma_track_posted (track, wr);
            }
            next++;
        }
        //  The device runs the head WR of a random QP that has one.
        unsigned q = (unsigned) (s_rand (&state) % qp_count);
        for (unsigned tries = 0; tries < qp_count && sim[q].count == 0; tries++)
            q = (q + 1) % qp_count;
        if (sim[q].count) {
            s_sim_qp_t *s = &sim[q];
            kvp_rdma_wr_t wr = s->fifo[s->head];
            s->head = (s->head + 1) % s->size;
            s->count--;
            if (!s->error && s_rand (&state) % error_odds == 0) {
                s->error = true; //  errors complete even unsignalled WRs
                clean[wr.xfer] = false;
                assert (kvp_rdma_track_complete (track, wr.wr_id, false) == 0);
            }
            else if (s->error) {
                clean[wr.xfer] = false; //  flushed
                if (wr.signaled)
                    assert (kvp_rdma_track_complete (track, wr.wr_id, false) == 0);
            }
            else if (wr.signaled)
                assert (kvp_rdma_track_complete (track, wr.wr_id, true) == 0);
        }
        kvp_rdma_done_t done;
        while (kvp_rdma_track_next_done (track, &done)) {
            assert (done.tag < count && !seen[done.tag]);
            seen[done.tag] = 1;
            assert (done.len == xfers[done.tag].len);
            assert ((done.status == 0) == clean[done.tag]);
            finished++;
            failed += done.status != 0;
        }
    }
    assert (next == plan->wr_count);
    assert (kvp_rdma_track_active (track) == 0);
    for (unsigned q = 0; q < qp_count; q++) {
        //  What is left on a QP in the error state are unsignalled WRs of transfers already
        //  reported (their signalled WRs were given up); flushed, they change nothing.
        for (; sim[q].count; sim[q].count--, sim[q].head = (sim[q].head + 1) % sim[q].size) {
            kvp_rdma_wr_t *wr = &sim[q].fifo[sim[q].head];
            assert (sim[q].error && !wr->signaled);
            assert (kvp_rdma_track_complete (track, wr->wr_id, false) == -1);
        }
        if (!sim[q].error)
            assert (kvp_rdma_track_outstanding (track, q) == 0
                    && kvp_rdma_track_room (track, q) == depth);
        free (sim[q].fifo);
    }
    kvp_rdma_plan_destroy (&plan);
    kvp_rdma_regs_destroy (&local);
    kvp_rdma_regs_destroy (&remote);
    kvp_rdma_track_destroy (&track);
    *finished_p += finished;
    *failed_p += failed;
}

void
kvp_rdma_track_test (bool verbose)
{
    const char *reason = NULL;
    kvp_rdma_done_t done;
    assert (kvp_rdma_track_new (0, 4, 8) == NULL);
    assert (kvp_rdma_track_new (KVP_RDMA_PLAN_MAX_QPS + 1, 4, 8) == NULL);
    assert (kvp_rdma_track_new (2, 0, 8) == NULL);
    assert (kvp_rdma_track_new (2, 4, 0) == NULL);

    //  Two QPs of 4 slots, 3 transfer slots. Transfer 0: five WRs on QP 0, signalled at the
    //  2nd and the 5th. Transfer 1: one WR on QP 1. Transfer 2: none (zero length).
    kvp_rdma_track_t *track = kvp_rdma_track_new (2, 4, 3);
    assert (track);
    const int wrs[][3] = {{0, 0, 0}, {0, 0, 1}, {0, 0, 0}, {0, 0, 0}, {1, 1, 1}, {0, 0, 1}};
    kvp_rdma_plan_t *plan = s_plan (2, 4, 3, wrs, 6);
    assert (kvp_rdma_track_add (track, plan, &reason) == 0);
    assert (kvp_rdma_track_active (track) == 3);
    //  Ids stamped: distinct, never 0, carrying QP and signalled bit.
    assert (plan->xfers[0].id != plan->xfers[1].id);
    for (size_t k = 0; k < 6; k++) {
        assert (plan->wrs[k].wr_id != 0);
        assert (kvp_rdma_wr_id_qp (plan->wrs[k].wr_id) == plan->wrs[k].qp);
        assert (kvp_rdma_wr_id_signaled (plan->wrs[k].wr_id) == plan->wrs[k].signaled);
        assert (kvp_rdma_wr_id_slot (plan->wrs[k].wr_id)
                == kvp_rdma_wr_id_slot (plan->xfers[plan->wrs[k].xfer].id));
    }
    //  The zero-length transfer is done at once.
    assert (kvp_rdma_track_next_done (track, &done));
    assert (done.tag == 102 && done.status == 0 && done.len == 3000);
    assert (!kvp_rdma_track_next_done (track, &done));
    //  Post: QP 0 takes four, then has no room for the fifth.
    assert (kvp_rdma_track_room (track, 0) == 4);
    for (size_t k = 0; k < 5; k++)
        kvp_rdma_track_posted (track, &plan->wrs[k]);
    assert (kvp_rdma_track_room (track, 0) == 0 && kvp_rdma_track_outstanding (track, 0) == 4);
    assert (kvp_rdma_track_room (track, 1) == 3);
    //  The first signalled completion on QP 0 frees two slots (it and the one before it).
    assert (kvp_rdma_track_complete (track, plan->wrs[1].wr_id, true) == 0);
    assert (kvp_rdma_track_room (track, 0) == 2);
    assert (!kvp_rdma_track_next_done (track, &done)); //  one signalled WR still to go
    kvp_rdma_track_posted (track, &plan->wrs[5]);
    //  Transfer 1 completes.
    assert (kvp_rdma_track_complete (track, plan->wrs[4].wr_id, true) == 0);
    assert (kvp_rdma_track_next_done (track, &done) && done.tag == 101 && done.status == 0);
    assert (kvp_rdma_track_room (track, 1) == 4);
    //  A second completion for it, and made-up ones, are refused and change nothing.
    assert (kvp_rdma_track_complete (track, plan->wrs[4].wr_id, true) == -1);
    assert (kvp_rdma_track_complete (track, 0, true) == -1);
    assert (kvp_rdma_track_complete (track, UINT64_MAX, true) == -1);
    assert (kvp_rdma_track_complete (track, plan->wrs[5].wr_id ^ (1ULL << 9), true) == -1);
    assert (kvp_rdma_track_complete (track, plan->wrs[5].wr_id | (7 << 1), true) == -1);
    assert (kvp_rdma_track_room (track, 0) == 1 && kvp_rdma_track_outstanding (track, 0) == 3);
    //  Transfer 0's last signalled WR frees the rest; it is done, ok.
    assert (kvp_rdma_track_complete (track, plan->wrs[5].wr_id, true) == 0);
    assert (kvp_rdma_track_room (track, 0) == 4 && kvp_rdma_track_outstanding (track, 0) == 0);
    assert (kvp_rdma_track_next_done (track, &done) && done.tag == 100 && done.status == 0);
    assert (kvp_rdma_track_active (track) == 0);
    uint64_t old = plan->wrs[5].wr_id;
    kvp_rdma_plan_destroy (&plan);

    //  Slot reuse: the new transfer in the old slot has a new generation, and a late
    //  completion with the old wr_id is refused, even with signalled WRs outstanding.
    const int two[][3] = {{0, 0, 0}, {0, 1, 1}, {0, 0, 1}, {1, 0, 1}};
    plan = s_plan (2, 4, 2, two, 4);
    assert (kvp_rdma_track_add (track, plan, &reason) == 0);
    assert (kvp_rdma_wr_id_slot (plan->xfers[0].id) == kvp_rdma_wr_id_slot (old));
    assert (plan->xfers[0].id >> 9 != old >> 9);
    //  No room for three more transfers: refused, nothing changed.
    kvp_rdma_plan_t *more = s_plan (2, 4, 2, two, 4);
    assert (kvp_rdma_track_add (track, more, &reason) == -1 && strstr (reason, "too many"));
    assert (kvp_rdma_track_active (track) == 2 && more->wrs[0].wr_id == 0);
    //  An error on an unsignalled WR: its transfer fails, but is not reported until its
    //  signalled WRs come back (flushed); the QP is broken.
    for (size_t k = 0; k < 4; k++)
        kvp_rdma_track_posted (track, &plan->wrs[k]);
    assert (kvp_rdma_track_complete (track, old, true) == -1);
    assert (kvp_rdma_track_outstanding (track, 0) == 3);
    assert (kvp_rdma_track_complete (track, plan->wrs[0].wr_id, false) == 0);
    assert (kvp_rdma_track_broken (track, 0) && kvp_rdma_track_room (track, 0) == 0);
    assert (!kvp_rdma_track_broken (track, 1) && kvp_rdma_track_room (track, 1) == 3);
    assert (!kvp_rdma_track_next_done (track, &done));
    assert (kvp_rdma_track_complete (track, plan->wrs[1].wr_id, true) == 0); //  QP 1: fine
    assert (!kvp_rdma_track_next_done (track, &done));
    assert (kvp_rdma_track_complete (track, plan->wrs[2].wr_id, false) == 0); //  flushed
    assert (kvp_rdma_track_next_done (track, &done) && done.tag == 100 && done.status == -1);
    assert (kvp_rdma_track_complete (track, plan->wrs[3].wr_id, false) == 0); //  flushed
    assert (kvp_rdma_track_next_done (track, &done) && done.tag == 101 && done.status == -1);
    assert (kvp_rdma_track_room (track, 0) == 0); //  broken stays broken
    kvp_rdma_plan_destroy (&plan);

    //  Unposted WRs fail their transfer; a signalled one counts as over.
    assert (kvp_rdma_track_add (track, more, &reason) == 0);
    //  A signalled completion with no signalled WR outstanding on its QP is refused.
    assert (kvp_rdma_track_complete (track, more->wrs[1].wr_id, true) == -1);
    kvp_rdma_track_posted (track, &more->wrs[1]); //  QP 1 is fine
    assert (kvp_rdma_track_unposted (track, &more->wrs[0]) == 0);
    assert (kvp_rdma_track_unposted (track, &more->wrs[2]) == 0);
    assert (!kvp_rdma_track_next_done (track, &done)); //  wrs[1] still in flight
    assert (kvp_rdma_track_complete (track, more->wrs[1].wr_id, true) == 0);
    assert (kvp_rdma_track_next_done (track, &done) && done.tag == 100 && done.status == -1);
    assert (kvp_rdma_track_unposted (track, &more->wrs[3]) == 0);
    assert (kvp_rdma_track_next_done (track, &done) && done.tag == 101 && done.status == -1);
    assert (kvp_rdma_track_unposted (track, &more->wrs[3]) == -1); //  already over
    kvp_rdma_plan_destroy (&more);
    kvp_rdma_track_break (track, 1);
    assert (kvp_rdma_track_room (track, 1) == 0);
    kvp_rdma_track_destroy (&track);
    assert (track == NULL);
    kvp_rdma_track_destroy (&track);

    //  Random plans against a simulated device.
    size_t finished = 0, failed = 0;
    for (uint64_t seed = 1; seed <= 400; seed++)
        s_simulate (seed * 0x9e3779b97f4a7c15ULL, &finished, &failed);
    assert (failed > 10 && finished - failed > 1000);
    if (verbose)
        printf ("(simulated %zu transfers, %zu failed) ", finished, failed);
}
