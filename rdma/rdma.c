/*  rdma.c - the RDMA transport's verbs layer (see rdma.h; not yet run on RDMA hardware).

    DESIGN

    Everything that can be decided without a device is decided in the pure modules (regions,
    connection data, plans, completion accounting); this file only turns their answers into
    verbs calls. The few decisions made here are made by small pure functions the self test
    checks on their own: which device, port and GID (s_parse_device, s_pick_gid), the
    attributes of each QP state change (s_init_attr, s_rtr_attr, s_rts_attr), and the
    struct ibv_send_wr of a planned WR (s_fill_send_wr).

    Queue pairs: RC, one send queue of sq_depth slots each, all on one completion queue of
    qp_count x sq_depth entries (a posted WR makes at most one completion and at most sq_depth
    are posted per QP, so the CQ cannot overrun). No receive queue is used: RDMA READ and
    WRITE need nothing posted on the remote side. QP i of one side faces QP i of the other.
    The attributes are the usual ones for RC: path MTU the smaller of both ports' active MTU,
    min_rnr_timer 12, timeout 14 (about 67 ms per try), 7 retries, 7 RNR retries, as many
    outstanding RDMA READs as the device allows (up to 16). On RoCE (an Ethernet port), or when
    the peer has no LID, the address is a GID (is_global, hop limit 64); on InfiniBand a LID.

    Posting: WRs are posted in plan order, one ibv_post_send each, while the send queue of the
    next WR's QP has room; when it has none, posting waits for kvp_rdma_conn_poll to reap
    completions (head-of-line across QPs: a plan spreads evenly, so the QPs fill evenly).
    Chaining WRs of one QP into one call would save doorbells; it is left for when there is
    hardware to measure it on. A failed post breaks its QP (moved to the error state first, so
    nothing more runs on it) and its transfers fail.

    The loop device (rdma_loop.c) stands behind the same two calls, posting and polling, so
    the data plane's RDMA path runs end to end without an HCA; the structures both fill are in
    rdma_device.h.

    The self test replaces the two calls that need a device, posting and polling, through two
    function pointers in the connection; the fake device behind them checks each WR's keys
    against the regions, as an HCA would, copies the bytes with memcpy, completes WRs in order
    per QP and fails one on request.
*/
#include "rdma/rdma.h"
#include "rdma/rdma_device.h"

#include <assert.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

_Static_assert(KVP_RDMA_WIRE_MAX_QPS == KVP_RDMA_PLAN_MAX_QPS, "one bound on queue pairs");
_Static_assert(KVP_RDMA_PLAN_MAX_QPS <= 255, "a QP index fits the 8 bits of a wr_id");

#define DEFAULT_QPS 4
#define DEFAULT_SQ_DEPTH 128
#define DEFAULT_STRIPE (1ULL << 20)
#define DEFAULT_MAX_TRANSFERS 4096
#define POLL_BATCH 64
#define RD_ATOMIC_MAX 16
#define ACCESS_FLAGS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)
#define NAME_MAX_LEN 64
#define GID_INDEX_MAX 1023

void
kvp_rdma_reason (char *reason, size_t size, const char *format, ...)
{
    if (!reason || size == 0)
        return;
    va_list args;
    va_start (args, format);
    vsnprintf (reason, size, format, args);
    va_end (args);
}

//  ---- pure decisions --------------------------------------------------------------------

//  "NAME[:PORT[:GID_INDEX]]" -> name, port (0: first active), gid_index (-1: choose). NULL or
//  "" is the first device. Returns 0, or -1 when malformed.
static int
s_parse_device (const char *spec, char *name, size_t name_size, int *port, int *gid_index)
{
    *port = 0;
    *gid_index = -1;
    name[0] = 0;
    if (!spec || !*spec)
        return 0;
    const char *colon = strchr (spec, ':');
    size_t len = colon ? (size_t) (colon - spec) : strlen (spec);
    if (len == 0 || len >= name_size)
        return -1;
    memcpy (name, spec, len);
    name[len] = 0;
    if (!colon)
        return 0;
    char *end;
    errno = 0;
    long value = strtol (colon + 1, &end, 10);
    if (end == colon + 1 || errno || value < 1 || value > 255 || (*end && *end != ':'))
        return -1;
    *port = (int) value;
    if (!*end)
        return 0;
    const char *gid = end + 1;
    value = strtol (gid, &end, 10);
    if (end == gid || errno || value < 0 || value > GID_INDEX_MAX || *end)
        return -1;
    *gid_index = (int) value;
    return 0;
}

//  On RoCE, the GID to use: a RoCE v2 GID that maps an IPv4 address first (routable, what
//  most fabrics are set up for), then any RoCE v2 GID, then the first entry. -1 if none.
static int
s_pick_gid (const struct ibv_gid_entry *entries, size_t count)
{
    static const uint8_t v4_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    int v2 = -1;
    for (size_t i = 0; i < count; i++) {
        if (entries[i].gid_type != IBV_GID_TYPE_ROCE_V2)
            continue;
        if (memcmp (entries[i].gid.raw, v4_prefix, sizeof v4_prefix) == 0)
            return (int) entries[i].gid_index;
        if (v2 < 0)
            v2 = (int) entries[i].gid_index;
    }
    if (v2 >= 0)
        return v2;
    return count ? (int) entries[0].gid_index : -1;
}

static void
s_init_attr (const kvp_rdma_port_t *port, struct ibv_qp_attr *attr, int *mask)
{
    memset (attr, 0, sizeof *attr);
    attr->qp_state = IBV_QPS_INIT;
    attr->pkey_index = 0;
    attr->port_num = port->port;
    attr->qp_access_flags = ACCESS_FLAGS;
    *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
}

//  Ready to receive, facing the peer's QP of index i.
static void
s_rtr_attr (const kvp_rdma_port_t *port, const kvp_rdma_wire_t *peer, size_t i, struct ibv_qp_attr *attr,
            int *mask)
{
    memset (attr, 0, sizeof *attr);
    attr->qp_state = IBV_QPS_RTR;
    attr->path_mtu = (enum ibv_mtu) (peer->mtu < port->mtu ? peer->mtu : port->mtu);
    attr->dest_qp_num = peer->qps[i].qpn;
    attr->rq_psn = peer->qps[i].psn;
    attr->max_dest_rd_atomic = port->max_dest_rd_atomic;
    attr->min_rnr_timer = 12;
    attr->ah_attr.dlid = peer->lid;
    attr->ah_attr.sl = 0;
    attr->ah_attr.src_path_bits = 0;
    attr->ah_attr.port_num = port->port;
    if (port->link_layer == IBV_LINK_LAYER_ETHERNET || peer->lid == 0) {
        attr->ah_attr.is_global = 1;
        memcpy (attr->ah_attr.grh.dgid.raw, peer->gid, 16);
        attr->ah_attr.grh.sgid_index = (uint8_t) port->gid_index;
        attr->ah_attr.grh.hop_limit = 64;
    }
    *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
}

//  Ready to send, starting at psn.
static void
s_rts_attr (const kvp_rdma_port_t *port, uint32_t psn, struct ibv_qp_attr *attr, int *mask)
{
    memset (attr, 0, sizeof *attr);
    attr->qp_state = IBV_QPS_RTS;
    attr->sq_psn = psn;
    attr->timeout = 14;
    attr->retry_cnt = 7;
    attr->rnr_retry = 7;
    attr->max_rd_atomic = port->max_rd_atomic;
    *mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC;
}

static void
s_fill_send_wr (const kvp_rdma_wr_t *wr, struct ibv_send_wr *out, struct ibv_sge *sge)
{
    memset (out, 0, sizeof *out);
    sge->addr = wr->local_addr;
    sge->length = wr->len;
    sge->lkey = wr->lkey;
    out->wr_id = wr->wr_id;
    out->sg_list = sge;
    out->num_sge = 1;
    out->opcode = wr->op == KVP_RDMA_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    out->send_flags = wr->signaled ? IBV_SEND_SIGNALED : 0;
    out->wr.rdma.remote_addr = wr->remote_addr;
    out->wr.rdma.rkey = wr->rkey;
}

static const char *
s_mtu_text (uint8_t mtu)
{
    static const char *names[] = {"?", "256", "512", "1024", "2048", "4096"};
    return mtu < 6 ? names[mtu] : "?";
}

//  ---- choosing the transport -----------------------------------------------------------

int
kvp_rdma_probe (void *arg, const char *want_device, char *reason, size_t reason_size)
{
    (void) arg;
    kvp_rdma_t *rdma = kvp_rdma_open (want_device, reason, reason_size);
    if (!rdma)
        return -1;
    kvp_rdma_close (&rdma);
    return 0;
}

int
kvp_rdma_choose (const char *transport, const char *want_device, kvp_rdma_probe_fn *probe,
                 void *probe_arg, char *reason, size_t reason_size)
{
    if (!transport
        || (strcmp (transport, "tcp") && strcmp (transport, "rdma")
            && strcmp (transport, "auto"))) {
        kvp_rdma_reason (reason, reason_size, "unknown transport '%s' (expected tcp, rdma or auto)",
                  transport ? transport : "(none)");
        return -1;
    }
    if (strcmp (transport, "tcp") == 0) {
        kvp_rdma_reason (reason, reason_size, "transport tcp (as set)");
        return KVP_RDMA_TRANSPORT_TCP;
    }
    char why[200] = "";
    int rc = (probe ? probe : kvp_rdma_probe) (probe_arg, want_device, why, sizeof why);
    if (rc == 0) {
        kvp_rdma_reason (reason, reason_size, "transport rdma (%s): %s", transport, why);
        return KVP_RDMA_TRANSPORT_RDMA;
    }
    kvp_rdma_reason (reason, reason_size, "transport %s%s: %s", transport,
              strcmp (transport, "rdma") == 0 ? " was asked for, but" : "",
              why[0] ? why : "no RDMA device; using tcp");
    return KVP_RDMA_TRANSPORT_TCP;
}

//  ---- the device ------------------------------------------------------------------------

//  Fills port from the device, the port (0: first active) and the GID index (-1: choose).
static int
s_query_port (struct ibv_context *ctx, const char *name, int port_num, int gid_index,
              kvp_rdma_port_t *port, char *reason, size_t size)
{
    struct ibv_device_attr dev;
    if (ibv_query_device (ctx, &dev)) {
        kvp_rdma_reason (reason, size, "ibv_query_device (%s): %s; using tcp", name, strerror (errno));
        return -1;
    }
    struct ibv_port_attr attr;
    int first = port_num ? port_num : 1;
    int last = port_num ? port_num : dev.phys_port_cnt;
    int found = 0;
    for (int p = first; p <= last && !found; p++)
        if (ibv_query_port (ctx, (uint8_t) p, &attr) == 0 && attr.state == IBV_PORT_ACTIVE)
            found = p;
    if (!found) {
        if (port_num)
            kvp_rdma_reason (reason, size, "RDMA device %s port %d is not active; using tcp", name,
                      port_num);
        else
            kvp_rdma_reason (reason, size, "RDMA device %s has no active port; using tcp", name);
        return -1;
    }
    memset (port, 0, sizeof *port);
    port->port = (uint8_t) found;
    port->link_layer = attr.link_layer;
    port->mtu = (uint8_t) attr.active_mtu;
    port->lid = attr.lid;
    port->max_msg = attr.max_msg_sz;
    port->max_qp_wr = (unsigned) dev.max_qp_wr;
    port->max_cqe = (unsigned) dev.max_cqe;
    port->max_rd_atomic =
        (uint8_t) (dev.max_qp_init_rd_atom < RD_ATOMIC_MAX ? dev.max_qp_init_rd_atom
                                                           : RD_ATOMIC_MAX);
    port->max_dest_rd_atomic =
        (uint8_t) (dev.max_qp_rd_atom < RD_ATOMIC_MAX ? dev.max_qp_rd_atom : RD_ATOMIC_MAX);
    if (gid_index < 0) {
        gid_index = 0;
        if (attr.link_layer == IBV_LINK_LAYER_ETHERNET && attr.gid_tbl_len > 0) {
            size_t count = (size_t) attr.gid_tbl_len;
            struct ibv_gid_entry *entries =
                (struct ibv_gid_entry *) calloc (count * dev.phys_port_cnt, sizeof *entries);
            ssize_t got =
                entries ? ibv_query_gid_table (ctx, entries, count * dev.phys_port_cnt, 0) : -1;
            //  The table lists every port's GIDs; keep this port's.
            size_t kept = 0;
            for (ssize_t i = 0; i < got; i++)
                if (entries[i].port_num == (uint32_t) found)
                    entries[kept++] = entries[i];
            int pick = got > 0 ? s_pick_gid (entries, kept) : -1;
            gid_index = pick >= 0 ? pick : 0;
            free (entries);
        }
    }
    union ibv_gid gid;
    if (ibv_query_gid (ctx, port->port, gid_index, &gid)) {
        kvp_rdma_reason (reason, size, "RDMA device %s port %d: no GID at index %d; using tcp", name,
                  found, gid_index);
        return -1;
    }
    memcpy (port->gid, gid.raw, 16);
    port->gid_index = gid_index;
    return 0;
}

kvp_rdma_t *
kvp_rdma_open (const char *want_device, char *reason, size_t reason_size)
{
    if (want_device && strcmp (want_device, KVP_RDMA_LOOP_DEVICE) == 0)
        return kvp_rdma_loop_open (reason, reason_size);
    char name[NAME_MAX_LEN];
    int port_num, gid_index;
    if (s_parse_device (want_device, name, sizeof name, &port_num, &gid_index)) {
        kvp_rdma_reason (reason, reason_size, "RDMA device '%s' is not NAME[:PORT[:GID_INDEX]]; using tcp",
                  want_device);
        return NULL;
    }
    int count = 0;
    errno = 0;
    struct ibv_device **list = ibv_get_device_list (&count);
    if (!list) {
        kvp_rdma_reason (reason, reason_size, "no RDMA device found (%s); using tcp",
                  errno ? strerror (errno) : "ibv_get_device_list failed");
        return NULL;
    }
    if (count == 0) {
        ibv_free_device_list (list);
        kvp_rdma_reason (reason, reason_size, "no RDMA device found; using tcp");
        return NULL;
    }
    struct ibv_device *device = NULL;
    char have[160] = "";
    for (int i = 0; i < count && !device; i++) {
        const char *dev_name = ibv_get_device_name (list[i]);
        if (!name[0] || (dev_name && strcmp (dev_name, name) == 0))
            device = list[i];
        else if (dev_name && strlen (have) + strlen (dev_name) + 3 < sizeof have)
            snprintf (have + strlen (have), sizeof have - strlen (have), "%s%s",
                      have[0] ? ", " : "", dev_name);
    }
    if (!device) {
        ibv_free_device_list (list);
        kvp_rdma_reason (reason, reason_size, "RDMA device %s not found (there is %s); using tcp", name,
                  have);
        return NULL;
    }
    snprintf (name, sizeof name, "%s", ibv_get_device_name (device));
    kvp_rdma_t *self = (kvp_rdma_t *) calloc (1, sizeof *self);
    if (!self || !(self->regs = kvp_rdma_regs_new ())) {
        kvp_rdma_reason (reason, reason_size, "out of memory; using tcp");
        goto fail;
    }
    self->ctx = ibv_open_device (device);
    if (!self->ctx) {
        kvp_rdma_reason (reason, reason_size, "ibv_open_device (%s): %s; using tcp", name,
                  strerror (errno));
        goto fail;
    }
    if (s_query_port (self->ctx, name, port_num, gid_index, &self->port, reason, reason_size))
        goto fail;
    self->pd = ibv_alloc_pd (self->ctx);
    if (!self->pd) {
        kvp_rdma_reason (reason, reason_size, "ibv_alloc_pd (%s): %s; using tcp", name, strerror (errno));
        goto fail;
    }
    ibv_free_device_list (list);
    snprintf (
        self->describe, sizeof self->describe,
        "%s port %u (%s, lid %u, mtu %s, gid index %d, max message %llu)", name, self->port.port,
        self->port.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", self->port.lid,
        s_mtu_text (self->port.mtu), self->port.gid_index, (unsigned long long) self->port.max_msg);
    kvp_rdma_reason (reason, reason_size, "%s", self->describe);
    return self;

fail:
    ibv_free_device_list (list);
    kvp_rdma_close (&self);
    return NULL;
}

void
kvp_rdma_close (kvp_rdma_t **self_p)
{
    assert (self_p);
    kvp_rdma_t *self = *self_p;
    if (!self)
        return;
    assert (self->conns == 0); //  connections hold the context's QPs and keys
    if (self->regs) {
        while (kvp_rdma_regs_count (self->regs))
            kvp_rdma_deregister (self, kvp_rdma_regs_at (self->regs, 0)->id);
        kvp_rdma_regs_destroy (&self->regs);
    }
    if (self->pd)
        ibv_dealloc_pd (self->pd);
    if (self->ctx)
        ibv_close_device (self->ctx);
    free (self);
    *self_p = NULL;
}

const char *
kvp_rdma_describe (kvp_rdma_t *self)
{
    assert (self);
    return self->describe;
}

int
kvp_rdma_register (kvp_rdma_t *self, uint32_t segment_id, void *addr, size_t len, char *reason,
                   size_t reason_size)
{
    assert (self);
    if (!addr || len == 0) {
        kvp_rdma_reason (reason, reason_size, "segment %u is empty", segment_id);
        return -1;
    }
    if (kvp_rdma_regs_by_id (self->regs, segment_id)) {
        kvp_rdma_reason (reason, reason_size, "segment %u is already registered", segment_id);
        return -1;
    }
    kvp_rdma_region_t region = {segment_id, (uint64_t) (uintptr_t) addr, len, 0, 0, NULL};
    if (self->pd) {
        struct ibv_mr *mr = ibv_reg_mr (self->pd, addr, len, ACCESS_FLAGS);
        if (!mr) {
            kvp_rdma_reason (reason, reason_size, "ibv_reg_mr (segment %u, %zu bytes): %s", segment_id,
                      len, strerror (errno));
            return -1;
        }
        region.lkey = mr->lkey;
        region.rkey = mr->rkey;
        region.handle = mr;
    }
    else { //  the self test's fake device: keys made up, as an HCA would
        region.lkey = 0x10000 + segment_id;
        region.rkey = 0x20000 + segment_id;
    }
    const char *why;
    if (kvp_rdma_regs_add (self->regs, &region, &why)) {
        if (region.handle)
            ibv_dereg_mr ((struct ibv_mr *) region.handle);
        kvp_rdma_reason (reason, reason_size, "segment %u: %s", segment_id, why);
        return -1;
    }
    return 0;
}

int
kvp_rdma_deregister (kvp_rdma_t *self, uint32_t segment_id)
{
    assert (self);
    const kvp_rdma_region_t *region = kvp_rdma_regs_by_id (self->regs, segment_id);
    if (!region)
        return -1;
    if (region->handle && ibv_dereg_mr ((struct ibv_mr *) region->handle))
        return -1;
    return kvp_rdma_regs_remove (self->regs, segment_id, NULL);
}

const kvp_rdma_regs_t *
kvp_rdma_regions (kvp_rdma_t *self)
{
    assert (self);
    return self->regs;
}

//  ---- connections -----------------------------------------------------------------------

static uint32_t
s_random_psn (unsigned i)
{
    uint32_t value;
    if (getrandom (&value, sizeof value, GRND_NONBLOCK) != (ssize_t) sizeof value)
        value = (uint32_t) time (NULL) ^ ((uint32_t) getpid () << 8) ^ (i * 2654435761u);
    return value & 0xffffff;
}

static int
s_verbs_post (kvp_rdma_conn_t *self, unsigned qp, struct ibv_send_wr *wr)
{
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send (self->qps[qp], wr, &bad);
    if (rc)
        errno = rc; //  ibv_post_send returns the errno value
    return rc ? -1 : 0;
}

static int
s_verbs_poll (kvp_rdma_conn_t *self, int max, struct ibv_wc *wc)
{
    return ibv_poll_cq (self->cq, max, wc);
}

//  Marks QP qp broken and moves it to the error state, so that nothing more runs on it.
static void
s_break_qp (kvp_rdma_conn_t *self, unsigned qp)
{
    kvp_rdma_track_break (self->track, qp);
    if (self->qps[qp]) {
        struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
        ibv_modify_qp (self->qps[qp], &attr, IBV_QP_STATE);
    }
}

//  Creates the CQ and the QPs, and moves the QPs to INIT.
static int
s_verbs_create (kvp_rdma_conn_t *self, char *reason, size_t size)
{
    kvp_rdma_t *rdma = self->rdma;
    unsigned qp_count = self->limits.qp_count;
    unsigned depth = self->limits.max_outstanding;
    unsigned cqe = qp_count * depth;
    if (cqe > rdma->port.max_cqe) {
        kvp_rdma_reason (reason, size, "%u queue pairs of %u need a CQ of %u entries; the device has %u",
                  qp_count, depth, cqe, rdma->port.max_cqe);
        return -1;
    }
    self->cq = ibv_create_cq (rdma->ctx, (int) cqe, NULL, NULL, 0);
    if (!self->cq) {
        kvp_rdma_reason (reason, size, "ibv_create_cq (%u entries): %s", cqe, strerror (errno));
        return -1;
    }
    for (unsigned i = 0; i < qp_count; i++) {
        struct ibv_qp_init_attr init = {
            .send_cq = self->cq,
            .recv_cq = self->cq,
            .cap = {.max_send_wr = depth, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
            .qp_type = IBV_QPT_RC,
            .sq_sig_all = 0};
        self->qps[i] = ibv_create_qp (rdma->pd, &init);
        if (!self->qps[i]) {
            kvp_rdma_reason (reason, size, "ibv_create_qp (%u of %u): %s", i + 1, qp_count,
                      strerror (errno));
            return -1;
        }
        self->qpn[i] = self->qps[i]->qp_num;
        struct ibv_qp_attr attr;
        int mask;
        s_init_attr (&rdma->port, &attr, &mask);
        int rc = ibv_modify_qp (self->qps[i], &attr, mask);
        if (rc) {
            kvp_rdma_reason (reason, size, "ibv_modify_qp (INIT): %s", strerror (rc));
            return -1;
        }
    }
    self->post = s_verbs_post;
    self->poll = s_verbs_poll;
    return 0;
}

kvp_rdma_conn_t *
kvp_rdma_conn_new (kvp_rdma_t *rdma, const kvp_rdma_conn_options_t *options, char *reason,
                   size_t reason_size)
{
    assert (rdma);
    kvp_rdma_conn_options_t opt = options ? *options : (kvp_rdma_conn_options_t){0};
    if (!opt.qp_count)
        opt.qp_count = DEFAULT_QPS;
    if (!opt.sq_depth)
        opt.sq_depth = DEFAULT_SQ_DEPTH;
    if (rdma->port.max_qp_wr && opt.sq_depth > rdma->port.max_qp_wr)
        opt.sq_depth = rdma->port.max_qp_wr;
    if (!opt.stripe)
        opt.stripe = DEFAULT_STRIPE;
    if (!opt.max_transfers)
        opt.max_transfers = DEFAULT_MAX_TRANSFERS;
    if (opt.max_transfers > KVP_RDMA_TRACK_MAX_TRANSFERS) {
        kvp_rdma_reason (reason, reason_size, "max transfers %u is above %u", opt.max_transfers,
                  KVP_RDMA_TRACK_MAX_TRANSFERS);
        return NULL;
    }
    kvp_rdma_limits_t limits = {.max_msg = rdma->port.max_msg < KVP_RDMA_PLAN_MAX_MSG
                                               ? rdma->port.max_msg
                                               : KVP_RDMA_PLAN_MAX_MSG,
                                .stripe = opt.stripe,
                                .qp_count = opt.qp_count,
                                .max_outstanding = opt.sq_depth,
                                .signal_every = opt.signal_every};
    if (kvp_rdma_limits_check (&limits, &limits, reason, reason_size))
        return NULL;
    kvp_rdma_conn_t *self = (kvp_rdma_conn_t *) calloc (1, sizeof *self);
    if (!self) {
        kvp_rdma_reason (reason, reason_size, "out of memory");
        return NULL;
    }
    self->rdma = rdma;
    rdma->conns++;
    self->limits = limits;
    self->remote = kvp_rdma_regs_new ();
    self->track = kvp_rdma_track_new (limits.qp_count, limits.max_outstanding, opt.max_transfers);
    if (!self->remote || !self->track) {
        kvp_rdma_reason (reason, reason_size, "out of memory");
        kvp_rdma_conn_destroy (&self);
        return NULL;
    }
    for (unsigned i = 0; i < limits.qp_count; i++)
        self->psn[i] = s_random_psn (i);
    if (rdma->ctx && s_verbs_create (self, reason, reason_size)) {
        kvp_rdma_conn_destroy (&self);
        return NULL;
    }
    if (rdma->loop && kvp_rdma_loop_attach (self)) {
        kvp_rdma_reason (reason, reason_size, "out of memory");
        kvp_rdma_conn_destroy (&self);
        return NULL;
    }
    return self;
}

void
kvp_rdma_conn_destroy (kvp_rdma_conn_t **self_p)
{
    assert (self_p);
    kvp_rdma_conn_t *self = *self_p;
    if (!self)
        return;
    for (unsigned i = 0; i < KVP_RDMA_PLAN_MAX_QPS; i++)
        if (self->qps[i])
            ibv_destroy_qp (self->qps[i]);
    if (self->cq)
        ibv_destroy_cq (self->cq);
    while (self->head) {
        kvp_rdma_pending_t *pending = self->head;
        self->head = pending->link;
        kvp_rdma_plan_destroy (&pending->plan);
        free (pending);
    }
    kvp_rdma_track_destroy (&self->track);
    kvp_rdma_regs_destroy (&self->remote);
    if (self->rdma->loop)
        kvp_rdma_loop_detach (self);
    self->rdma->conns--;
    free (self);
    *self_p = NULL;
}

int
kvp_rdma_conn_local_data (kvp_rdma_conn_t *self, uint8_t **data_p, size_t *size_p, char *reason,
                          size_t reason_size)
{
    assert (self && data_p && size_p);
    const kvp_rdma_port_t *port = &self->rdma->port;
    const kvp_rdma_regs_t *regs = self->rdma->regs;
    kvp_rdma_wire_qp_t qps[KVP_RDMA_PLAN_MAX_QPS];
    size_t seg_count = kvp_rdma_regs_count (regs);
    kvp_rdma_wire_seg_t *segs =
        (kvp_rdma_wire_seg_t *) calloc (seg_count ? seg_count : 1, sizeof *segs);
    if (!segs) {
        kvp_rdma_reason (reason, reason_size, "out of memory");
        return -1;
    }
    for (unsigned i = 0; i < self->limits.qp_count; i++)
        qps[i] = (kvp_rdma_wire_qp_t){self->qpn[i], self->psn[i]};
    for (size_t i = 0; i < seg_count; i++) {
        const kvp_rdma_region_t *r = kvp_rdma_regs_at (regs, i);
        segs[i] = (kvp_rdma_wire_seg_t){r->id, r->rkey, r->addr, r->len};
    }
    kvp_rdma_wire_t info = {
        port->mtu, port->lid, {0}, self->limits.qp_count, qps, seg_count, seg_count ? segs : NULL};
    memcpy (info.gid, port->gid, 16);
    const char *why;
    int rc = kvp_rdma_wire_encode (&info, data_p, size_p, &why);
    if (rc)
        kvp_rdma_reason (reason, reason_size, "connection data: %s", why);
    free (segs);
    return rc;
}

int
kvp_rdma_conn_connect (kvp_rdma_conn_t *self, const void *peer_data, size_t peer_size, char *reason,
                       size_t reason_size)
{
    assert (self);
    if (self->connected) {
        kvp_rdma_reason (reason, reason_size, "already connected");
        return -1;
    }
    const char *why;
    int rc = -1;
    kvp_rdma_wire_t *peer = kvp_rdma_wire_decode (peer_data, peer_size, &why);
    if (!peer) {
        kvp_rdma_reason (reason, reason_size, "peer's connection data refused: %s", why);
        goto done;
    }
    if (self->rdma->loop && kvp_rdma_loop_connect (self, peer->gid, reason, reason_size) != 0)
        goto done;
    if (peer->qp_count != self->limits.qp_count) {
        kvp_rdma_reason (reason, reason_size, "peer has %zu queue pairs, this side %u", peer->qp_count,
                  self->limits.qp_count);
        goto done;
    }
    for (size_t i = 0; i < peer->seg_count; i++) {
        const kvp_rdma_wire_seg_t *s = &peer->segs[i];
        kvp_rdma_region_t region = {s->id, s->addr, s->len, 0, s->rkey, NULL};
        if (kvp_rdma_regs_add (self->remote, &region, &why)) {
            kvp_rdma_reason (reason, reason_size, "peer's segment %u: %s", s->id, why);
            goto done;
        }
    }
    for (unsigned i = 0; i < self->limits.qp_count; i++) {
        if (!self->qps[i])
            continue; //  the fake device has nothing to move
        struct ibv_qp_attr attr;
        int mask, err;
        s_rtr_attr (&self->rdma->port, peer, i, &attr, &mask);
        if ((err = ibv_modify_qp (self->qps[i], &attr, mask))) {
            kvp_rdma_reason (reason, reason_size, "ibv_modify_qp (QP %u to RTR): %s", i, strerror (err));
            goto done;
        }
        s_rts_attr (&self->rdma->port, self->psn[i], &attr, &mask);
        if ((err = ibv_modify_qp (self->qps[i], &attr, mask))) {
            kvp_rdma_reason (reason, reason_size, "ibv_modify_qp (QP %u to RTS): %s", i, strerror (err));
            goto done;
        }
    }
    self->connected = true;
    rc = 0;
done:
    if (rc) //  half-connected QPs are of no use: none of this connection is
        for (unsigned i = 0; i < self->limits.qp_count; i++)
            s_break_qp (self, i);
    kvp_rdma_wire_destroy (&peer);
    return rc;
}

//  Posts WRs of the pending plans, in order, while their QPs have room.
static void
s_progress (kvp_rdma_conn_t *self)
{
    while (self->head) {
        kvp_rdma_pending_t *pending = self->head;
        kvp_rdma_plan_t *plan = pending->plan;
        while (pending->next < plan->wr_count) {
            kvp_rdma_wr_t *wr = &plan->wrs[pending->next];
            if (kvp_rdma_track_broken (self->track, wr->qp)) {
                kvp_rdma_track_unposted (self->track, wr);
                pending->next++;
                continue;
            }
            if (kvp_rdma_track_room (self->track, wr->qp) == 0)
                return;
            struct ibv_send_wr send;
            struct ibv_sge sge;
            s_fill_send_wr (wr, &send, &sge);
            if (self->post (self, wr->qp, &send)) {
                snprintf (self->error, sizeof self->error, "ibv_post_send (QP %u): %s", wr->qp,
                          strerror (errno));
                s_break_qp (self, wr->qp); //  the WR is given up on the next turn
                continue;
            }
            kvp_rdma_track_posted (self->track, wr);
            pending->next++;
        }
        self->head = pending->link;
        if (!self->head)
            self->tail = NULL;
        kvp_rdma_plan_destroy (&pending->plan);
        free (pending);
    }
}

int
kvp_rdma_conn_submit (kvp_rdma_conn_t *self, const kvp_rdma_xfer_t *xfers, size_t count,
                      char *reason, size_t reason_size)
{
    assert (self);
    if (!self->connected) {
        kvp_rdma_reason (reason, reason_size, "not connected");
        return -1;
    }
    for (unsigned i = 0; i < self->limits.qp_count; i++)
        if (self->dead || kvp_rdma_track_broken (self->track, i)) {
            kvp_rdma_reason (reason, reason_size, "connection is broken (%s)",
                      self->error[0] ? self->error : "a queue pair failed");
            return -1;
        }
    kvp_rdma_plan_t *plan = kvp_rdma_plan_build (&self->limits, self->rdma->regs, self->remote,
                                                 xfers, count, reason, reason_size);
    if (!plan)
        return -1;
    const char *why;
    kvp_rdma_pending_t *pending = (kvp_rdma_pending_t *) calloc (1, sizeof *pending);
    if (!pending || kvp_rdma_track_add (self->track, plan, &why)) {
        kvp_rdma_reason (reason, reason_size, "%s", pending ? why : "out of memory");
        free (pending);
        kvp_rdma_plan_destroy (&plan);
        return -1;
    }
    pending->plan = plan;
    if (self->tail)
        self->tail->link = pending;
    else
        self->head = pending;
    self->tail = pending;
    s_progress (self);
    return 0;
}

int
kvp_rdma_conn_poll (kvp_rdma_conn_t *self, kvp_rdma_done_t *done, size_t max)
{
    assert (self);
    assert (done || max == 0);
    if (self->dead)
        return -1;
    struct ibv_wc wc[POLL_BATCH];
    int n = self->poll ? self->poll (self, POLL_BATCH, wc) : 0;
    if (n < 0) {
        snprintf (self->error, sizeof self->error, "ibv_poll_cq failed (%d)", n);
        self->dead = true;
        for (unsigned i = 0; i < self->limits.qp_count; i++)
            s_break_qp (self, i);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        unsigned qp = kvp_rdma_wr_id_qp (wc[i].wr_id);
        bool ok = wc[i].status == IBV_WC_SUCCESS;
        if (!ok && wc[i].status != IBV_WC_WR_FLUSH_ERR)
            snprintf (self->error, sizeof self->error,
                      "completion on QP %u: %s (vendor error 0x%x)", qp,
                      ibv_wc_status_str (wc[i].status), wc[i].vendor_err);
        //  A completion whose QP number is not the one its wr_id names is not ours.
        if (qp >= self->limits.qp_count || wc[i].qp_num != self->qpn[qp]
            || kvp_rdma_track_complete (self->track, wc[i].wr_id, ok))
            self->strays++;
    }
    s_progress (self);
    size_t count = 0;
    while (count < max && kvp_rdma_track_next_done (self->track, &done[count]))
        count++;
    return (int) count;
}

size_t
kvp_rdma_conn_active (kvp_rdma_conn_t *self)
{
    assert (self);
    return kvp_rdma_track_active (self->track);
}

const char *
kvp_rdma_conn_error (kvp_rdma_conn_t *self)
{
    assert (self);
    return self->error;
}

int
kvp_rdma_conn_add_remote (kvp_rdma_conn_t *self, uint32_t id, uint64_t addr, uint64_t len,
                          uint32_t rkey, char *reason, size_t reason_size)
{
    assert (self);
    kvp_rdma_region_t region = {id, addr, len, 0, rkey, NULL};
    const char *why;
    if (kvp_rdma_regs_add (self->remote, &region, &why)) {
        kvp_rdma_reason (reason, reason_size, "peer's region %u: %s", id, why);
        return -1;
    }
    return 0;
}

int
kvp_rdma_conn_remove_remote (kvp_rdma_conn_t *self, uint32_t id)
{
    assert (self);
    return kvp_rdma_regs_remove (self->remote, id, NULL);
}

//  ---- self test -----------------------------------------------------------------------

//  A fake device: per QP, the posted WRs in order; each poll runs a few of them, checking
//  their keys against the regions of both sides as an HCA would, copying bytes with memcpy.
typedef struct {
    uint64_t wr_id;
    enum ibv_wr_opcode opcode;
    unsigned flags;
    uint64_t local_addr, remote_addr;
    uint32_t len, lkey, rkey;
} s_fake_wr_t;

typedef struct {
    kvp_rdma_t *local;  //  whose lkeys the WRs carry
    kvp_rdma_t *remote; //  whose rkeys
    unsigned depth;
    s_fake_wr_t *ring[KVP_RDMA_PLAN_MAX_QPS];
    unsigned head[KVP_RDMA_PLAN_MAX_QPS], count[KVP_RDMA_PLAN_MAX_QPS];
    bool error[KVP_RDMA_PLAN_MAX_QPS];
    uint64_t ran;     //  WRs run (not flushed)
    uint64_t fail_at; //  the run that fails (0: none)
    uint64_t posted, overfull;
    uint64_t state;
    struct ibv_wc inject[4]; //  completions the next poll returns first
    int injects;
    bool paused; //  runs no WR
} s_fake_t;

static int
s_fake_post (kvp_rdma_conn_t *self, unsigned qp, struct ibv_send_wr *wr)
{
    s_fake_t *fake = (s_fake_t *) self->fake;
    assert (wr->num_sge == 1 && wr->next == NULL);
    if (fake->count[qp] == fake->depth) {
        fake->overfull++;
        errno = ENOMEM;
        return -1;
    }
    s_fake_wr_t *slot = &fake->ring[qp][(fake->head[qp] + fake->count[qp]++) % fake->depth];
    *slot = (s_fake_wr_t){wr->wr_id,
                          wr->opcode,
                          wr->send_flags,
                          wr->sg_list->addr,
                          wr->wr.rdma.remote_addr,
                          wr->sg_list->length,
                          wr->sg_list->lkey,
                          wr->wr.rdma.rkey};
    fake->posted++;
    return 0;
}

static bool
s_key_covers (const kvp_rdma_regs_t *regs, uint64_t addr, uint32_t len, uint32_t key, bool rkey)
{
    const kvp_rdma_region_t *region = kvp_rdma_regs_find (regs, addr, len);
    return region && (rkey ? region->rkey : region->lkey) == key;
}

static int
s_fake_poll (kvp_rdma_conn_t *self, int max, struct ibv_wc *wc)
{
    s_fake_t *fake = (s_fake_t *) self->fake;
    int n = 0;
    for (; n < fake->injects && n < max; n++)
        wc[n] = fake->inject[n];
    fake->injects = 0;
    unsigned qp_count = self->limits.qp_count;
    for (int steps = 0; steps < 8 && n < max && !fake->paused; steps++) {
        fake->state ^= fake->state << 13, fake->state ^= fake->state >> 7;
        fake->state ^= fake->state << 17;
        unsigned qp = (unsigned) (fake->state % qp_count);
        for (unsigned tries = 0; tries < qp_count && fake->count[qp] == 0; tries++)
            qp = (qp + 1) % qp_count;
        if (fake->count[qp] == 0)
            break;
        s_fake_wr_t wr = fake->ring[qp][fake->head[qp]];
        fake->head[qp] = (fake->head[qp] + 1) % fake->depth;
        fake->count[qp]--;
        struct ibv_wc *c = &wc[n];
        memset (c, 0, sizeof *c);
        c->wr_id = wr.wr_id;
        c->qp_num = self->qpn[qp];
        c->opcode = wr.opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
        c->status = IBV_WC_SUCCESS;
        if (fake->error[qp])
            c->status = IBV_WC_WR_FLUSH_ERR;
        else if (!s_key_covers (fake->local->regs, wr.local_addr, wr.len, wr.lkey, false))
            c->status = IBV_WC_LOC_PROT_ERR;
        else if (!s_key_covers (fake->remote->regs, wr.remote_addr, wr.len, wr.rkey, true))
            c->status = IBV_WC_REM_ACCESS_ERR;
        else if (++fake->ran == fake->fail_at)
            c->status = IBV_WC_RETRY_EXC_ERR;
        else if (wr.opcode == IBV_WR_RDMA_WRITE)
            memcpy ((void *) (uintptr_t) wr.remote_addr, (void *) (uintptr_t) wr.local_addr,
                    wr.len);
        else
            memcpy ((void *) (uintptr_t) wr.local_addr, (void *) (uintptr_t) wr.remote_addr,
                    wr.len);
        bool failed = c->status != IBV_WC_SUCCESS && c->status != IBV_WC_WR_FLUSH_ERR;
        if (failed)
            fake->error[qp] = true;
        //  Errors complete even unsignalled WRs; flushes and successes only signalled ones.
        if (failed || (wr.flags & IBV_SEND_SIGNALED))
            n++;
    }
    return n;
}

static kvp_rdma_t *
s_fake_rdma_new (uint16_t lid)
{
    kvp_rdma_t *self = (kvp_rdma_t *) calloc (1, sizeof *self);
    assert (self);
    self->regs = kvp_rdma_regs_new ();
    self->port = (kvp_rdma_port_t){.port = 1,
                            .link_layer = IBV_LINK_LAYER_INFINIBAND,
                            .mtu = IBV_MTU_4096,
                            .lid = lid,
                            .max_msg = 1 << 30,
                            .max_qp_wr = 16384,
                            .max_cqe = 1 << 20,
                            .max_rd_atomic = 16,
                            .max_dest_rd_atomic = 16};
    snprintf (self->describe, sizeof self->describe, "fake lid %u", lid);
    return self;
}

static s_fake_t *
s_fake_attach (kvp_rdma_conn_t *conn, kvp_rdma_t *local, kvp_rdma_t *remote, uint64_t seed)
{
    s_fake_t *fake = (s_fake_t *) calloc (1, sizeof *fake);
    assert (fake);
    fake->local = local;
    fake->remote = remote;
    fake->depth = conn->limits.max_outstanding;
    fake->state = seed;
    for (unsigned q = 0; q < conn->limits.qp_count; q++) {
        fake->ring[q] = (s_fake_wr_t *) calloc (fake->depth, sizeof (s_fake_wr_t));
        conn->qpn[q] = 1000 * local->port.lid + q; //  the QP numbers the fake device gives
    }
    conn->fake = fake;
    conn->post = s_fake_post;
    conn->poll = s_fake_poll;
    return fake;
}

static void
s_fake_free (s_fake_t *fake)
{
    for (unsigned q = 0; q < KVP_RDMA_PLAN_MAX_QPS; q++)
        free (fake->ring[q]);
    free (fake);
}

//  Polls until the connection has nothing in flight; fills status[tag] for each transfer that
//  ends (tags < tags, each once). For the self tests (here and rdma_loop.c).
size_t
kvp_rdma_test_drain (kvp_rdma_conn_t *conn, int *status, size_t tags)
{
    kvp_rdma_done_t done[16];
    size_t finished = 0;
    for (int rounds = 0; kvp_rdma_conn_active (conn) > 0; rounds++) {
        assert (rounds < 1000000);
        int n = kvp_rdma_conn_poll (conn, done, 16);
        assert (n >= 0);
        for (int i = 0; i < n; i++) {
            assert (done[i].tag < tags && status[done[i].tag] == 1); //  once each
            status[done[i].tag] = done[i].status;
            finished++;
        }
    }
    return finished;
}

static int
s_probe_yes (void *arg, const char *want_device, char *reason, size_t size)
{
    (*(int *) arg)++;
    snprintf (reason, size, "%s port 1", want_device ? want_device : "mlx5_0");
    return 0;
}

static int
s_probe_no (void *arg, const char *want_device, char *reason, size_t size)
{
    (void) want_device;
    (*(int *) arg)++;
    snprintf (reason, size, "no RDMA device found; using tcp");
    return -1;
}

//  Two connections back to back on rdma_a and rdma_b (fake devices or one real one): exchange
//  connection data, connect, write a pattern across, read it back, check the bytes.
static void
s_round_trip (kvp_rdma_conn_t *a, kvp_rdma_conn_t *b, uint8_t *src, uint8_t *dst,
              uint32_t dst_segment, size_t len)
{
    char reason[256];
    uint8_t *data_a, *data_b;
    size_t size_a, size_b;
    assert (kvp_rdma_conn_local_data (a, &data_a, &size_a, reason, sizeof reason) == 0);
    assert (kvp_rdma_conn_local_data (b, &data_b, &size_b, reason, sizeof reason) == 0);
    assert (kvp_rdma_conn_connect (a, data_b, size_b, reason, sizeof reason) == 0);
    assert (kvp_rdma_conn_connect (b, data_a, size_a, reason, sizeof reason) == 0);
    assert (kvp_rdma_conn_connect (a, data_b, size_b, reason, sizeof reason) == -1);
    free (data_a);
    free (data_b);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t) (i * 7 + 3);
    memset (dst, 0, len);
    int status[1000];
    for (int i = 0; i < 1000; i++)
        status[i] = 1;
    kvp_rdma_xfer_t write = {1, KVP_RDMA_WRITE, (uint64_t) (uintptr_t) src, dst_segment, 0, len};
    assert (kvp_rdma_conn_submit (a, &write, 1, reason, sizeof reason) == 0);
    assert (kvp_rdma_test_drain (a, status, 1000) == 1 && status[1] == 0);
    assert (memcmp (src, dst, len) == 0);
    memset (src, 0, len);
    kvp_rdma_xfer_t read = {2, KVP_RDMA_READ, (uint64_t) (uintptr_t) src, dst_segment, 0, len};
    assert (kvp_rdma_conn_submit (a, &read, 1, reason, sizeof reason) == 0);
    assert (kvp_rdma_test_drain (a, status, 1000) == 1 && status[2] == 0);
    for (size_t i = 0; i < len; i++)
        assert (src[i] == (uint8_t) (i * 7 + 3));
}

void
kvp_rdma_test (bool verbose)
{
    char reason[256];

    //  Device specs.
    char name[NAME_MAX_LEN];
    int port, gid;
    assert (s_parse_device (NULL, name, sizeof name, &port, &gid) == 0 && !name[0] && port == 0
            && gid == -1);
    assert (s_parse_device ("mlx5_0", name, sizeof name, &port, &gid) == 0);
    assert (strcmp (name, "mlx5_0") == 0 && port == 0 && gid == -1);
    assert (s_parse_device ("mlx5_1:2", name, sizeof name, &port, &gid) == 0);
    assert (strcmp (name, "mlx5_1") == 0 && port == 2 && gid == -1);
    assert (s_parse_device ("rxe0:1:3", name, sizeof name, &port, &gid) == 0);
    assert (strcmp (name, "rxe0") == 0 && port == 1 && gid == 3);
    const char *bad_specs[] = {
        ":1", "x:", "x:0", "x:256", "x:1:", "x:1:-1", "x:1:1024", "x:1:2:3", "x:a", "x:1x"};
    for (size_t i = 0; i < sizeof bad_specs / sizeof *bad_specs; i++)
        assert (s_parse_device (bad_specs[i], name, sizeof name, &port, &gid) == -1);
    char long_name[100];
    memset (long_name, 'a', 99);
    long_name[99] = 0;
    assert (s_parse_device (long_name, name, sizeof name, &port, &gid) == -1);

    //  GID choice on RoCE: IPv4-mapped RoCE v2, else RoCE v2, else the first.
    struct ibv_gid_entry table[4];
    memset (table, 0, sizeof table);
    for (uint32_t i = 0; i < 4; i++) {
        table[i].gid_index = i;
        table[i].gid.raw[0] = 0xfe;
        table[i].gid.raw[1] = 0x80;
    }
    table[0].gid_type = IBV_GID_TYPE_ROCE_V1;
    table[1].gid_type = IBV_GID_TYPE_ROCE_V2;
    table[2].gid_type = IBV_GID_TYPE_ROCE_V1;
    table[3].gid_type = IBV_GID_TYPE_ROCE_V2;
    assert (s_pick_gid (table, 4) == 1);
    memset (table[3].gid.raw, 0, 16);
    table[3].gid.raw[10] = table[3].gid.raw[11] = 0xff;
    table[3].gid.raw[12] = 10;
    assert (s_pick_gid (table, 4) == 3);
    table[1].gid_type = table[3].gid_type = IBV_GID_TYPE_ROCE_V1;
    assert (s_pick_gid (table, 4) == 0);
    assert (s_pick_gid (table, 0) == -1);

    //  QP attributes: INIT, RTR on InfiniBand (LID) and RoCE (GID), RTS.
    kvp_rdma_port_t ib = {.port = 1,
                   .link_layer = IBV_LINK_LAYER_INFINIBAND,
                   .mtu = IBV_MTU_4096,
                   .lid = 5,
                   .gid_index = 0,
                   .max_rd_atomic = 16,
                   .max_dest_rd_atomic = 8};
    struct ibv_qp_attr attr;
    int mask;
    s_init_attr (&ib, &attr, &mask);
    assert (attr.qp_state == IBV_QPS_INIT && attr.port_num == 1);
    assert (attr.qp_access_flags
            == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE));
    assert (mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    kvp_rdma_wire_qp_t peer_qps[2] = {{0x123, 0x456}, {0x789, 0xabc}};
    kvp_rdma_wire_t peer = {IBV_MTU_2048, 9, {0}, 2, peer_qps, 0, NULL};
    peer.gid[0] = 0xfe;
    s_rtr_attr (&ib, &peer, 1, &attr, &mask);
    assert (attr.qp_state == IBV_QPS_RTR && attr.path_mtu == IBV_MTU_2048);
    assert (attr.dest_qp_num == 0x789 && attr.rq_psn == 0xabc);
    assert (attr.ah_attr.dlid == 9 && attr.ah_attr.port_num == 1 && !attr.ah_attr.is_global);
    assert (attr.max_dest_rd_atomic == 8 && attr.min_rnr_timer == 12);
    assert (mask & IBV_QP_AV && mask & IBV_QP_DEST_QPN && mask & IBV_QP_RQ_PSN);
    assert (mask & IBV_QP_MAX_DEST_RD_ATOMIC && mask & IBV_QP_MIN_RNR_TIMER);
    kvp_rdma_port_t roce = ib;
    roce.link_layer = IBV_LINK_LAYER_ETHERNET;
    roce.mtu = IBV_MTU_1024;
    roce.gid_index = 3;
    s_rtr_attr (&roce, &peer, 0, &attr, &mask);
    assert (attr.path_mtu == IBV_MTU_1024 && attr.dest_qp_num == 0x123);
    assert (attr.ah_attr.is_global && attr.ah_attr.grh.sgid_index == 3);
    assert (attr.ah_attr.grh.dgid.raw[0] == 0xfe && attr.ah_attr.grh.hop_limit == 64);
    s_rts_attr (&ib, 0x777, &attr, &mask);
    assert (attr.qp_state == IBV_QPS_RTS && attr.sq_psn == 0x777);
    assert (attr.timeout == 14 && attr.retry_cnt == 7 && attr.rnr_retry == 7);
    assert (attr.max_rd_atomic == 16 && mask & IBV_QP_SQ_PSN && mask & IBV_QP_MAX_QP_RD_ATOMIC);

    //  A planned WR as verbs sees it.
    kvp_rdma_wr_t wr = {.local_addr = 0x1000,
                        .remote_addr = 0x2000,
                        .wr_id = 0xabcdef,
                        .lkey = 11,
                        .rkey = 22,
                        .len = 333,
                        .qp = 1,
                        .signaled = true,
                        .op = KVP_RDMA_READ};
    struct ibv_send_wr send;
    struct ibv_sge sge;
    s_fill_send_wr (&wr, &send, &sge);
    assert (send.wr_id == 0xabcdef && send.opcode == IBV_WR_RDMA_READ);
    assert (send.send_flags == IBV_SEND_SIGNALED && send.num_sge == 1 && send.sg_list == &sge);
    assert (sge.addr == 0x1000 && sge.length == 333 && sge.lkey == 11);
    assert (send.wr.rdma.remote_addr == 0x2000 && send.wr.rdma.rkey == 22 && !send.next);
    wr.op = KVP_RDMA_WRITE;
    wr.signaled = false;
    s_fill_send_wr (&wr, &send, &sge);
    assert (send.opcode == IBV_WR_RDMA_WRITE && send.send_flags == 0);

    //  Choosing the transport, with an injected probe.
    int probes = 0;
    assert (kvp_rdma_choose ("tcp", NULL, s_probe_yes, &probes, reason, sizeof reason)
            == KVP_RDMA_TRANSPORT_TCP);
    assert (probes == 0 && strstr (reason, "tcp"));
    assert (kvp_rdma_choose ("rdma", "mlx5_2", s_probe_yes, &probes, reason, sizeof reason)
            == KVP_RDMA_TRANSPORT_RDMA);
    assert (probes == 1 && strstr (reason, "mlx5_2"));
    assert (kvp_rdma_choose ("auto", NULL, s_probe_yes, &probes, reason, sizeof reason)
            == KVP_RDMA_TRANSPORT_RDMA);
    assert (probes == 2);
    assert (kvp_rdma_choose ("rdma", NULL, s_probe_no, &probes, reason, sizeof reason)
            == KVP_RDMA_TRANSPORT_TCP);
    assert (probes == 3 && strstr (reason, "rdma was asked for") && strstr (reason, "using tcp"));
    assert (kvp_rdma_choose ("auto", NULL, s_probe_no, &probes, reason, sizeof reason)
            == KVP_RDMA_TRANSPORT_TCP);
    assert (probes == 4 && strstr (reason, "no RDMA device"));
    assert (kvp_rdma_choose ("infiniband", NULL, s_probe_yes, &probes, reason, sizeof reason)
            == -1);
    assert (probes == 4 && strstr (reason, "unknown transport 'infiniband'"));
    assert (kvp_rdma_choose ("RDMA", NULL, s_probe_yes, &probes, reason, sizeof reason) == -1);
    assert (kvp_rdma_choose ("", NULL, s_probe_yes, &probes, reason, sizeof reason) == -1);
    assert (kvp_rdma_choose (NULL, NULL, s_probe_yes, &probes, reason, sizeof reason) == -1);
    assert (probes == 4);

    //  This machine: a device opens, or kvp_rdma_open says in one line why not, and the real
    //  probe makes "auto" and "rdma" agree with it.
    reason[0] = 0;
    kvp_rdma_t *rdma = kvp_rdma_open (NULL, reason, sizeof reason);
    char open_reason[256];
    snprintf (open_reason, sizeof open_reason, "%s", reason);
    int chose = kvp_rdma_choose ("auto", NULL, NULL, NULL, reason, sizeof reason);
    assert (chose == (rdma ? KVP_RDMA_TRANSPORT_RDMA : KVP_RDMA_TRANSPORT_TCP));
    assert (kvp_rdma_choose ("rdma", NULL, NULL, NULL, reason, sizeof reason) == chose);
    if (!rdma) {
        assert (strstr (open_reason, "no RDMA device found") && strstr (open_reason, "tcp"));
        assert (!strchr (open_reason, '\n'));
        assert (strstr (reason, "using tcp"));
        assert (kvp_rdma_open ("mlx5_9:1", reason, sizeof reason) == NULL && reason[0]);
        if (verbose)
            printf ("(no device: %s) ", open_reason);
    }
    else {
        //  A real device: register, connect two sets of QPs back to back, move bytes.
        if (verbose)
            printf ("(device: %s) ", kvp_rdma_describe (rdma));
        size_t len = (4 << 20) + 12345;
        uint8_t *src = (uint8_t *) malloc (len), *dst = (uint8_t *) malloc (len);
        assert (kvp_rdma_register (rdma, 1, src, len, reason, sizeof reason) == 0);
        assert (kvp_rdma_register (rdma, 2, dst, len, reason, sizeof reason) == 0);
        assert (kvp_rdma_register (rdma, 2, dst, len, reason, sizeof reason) == -1);
        kvp_rdma_conn_options_t options = {.qp_count = 2, .stripe = 256 << 10};
        kvp_rdma_conn_t *a = kvp_rdma_conn_new (rdma, &options, reason, sizeof reason);
        assert (a);
        kvp_rdma_conn_t *b = kvp_rdma_conn_new (rdma, &options, reason, sizeof reason);
        assert (b);
        s_round_trip (a, b, src, dst, 2, len);
        kvp_rdma_conn_destroy (&a);
        kvp_rdma_conn_destroy (&b);
        assert (kvp_rdma_deregister (rdma, 1) == 0 && kvp_rdma_deregister (rdma, 1) == -1);
        kvp_rdma_close (&rdma);
        free (src);
        free (dst);
    }
    kvp_rdma_close (&rdma);

    //  The rest of this file against the fake device: node A (lid 1) and node B (lid 2).
    kvp_rdma_t *node_a = s_fake_rdma_new (1), *node_b = s_fake_rdma_new (2);
    size_t len = 2 << 20;
    uint8_t *mem_a = (uint8_t *) malloc (2 * len), *mem_b = (uint8_t *) malloc (2 * len);
    //  A: two touching segments (a transfer may span both); B: one segment.
    assert (kvp_rdma_register (node_a, 10, mem_a, len, reason, sizeof reason) == 0);
    assert (kvp_rdma_register (node_a, 11, mem_a + len, len, reason, sizeof reason) == 0);
    assert (kvp_rdma_register (node_a, 12, mem_a + 100, 10, reason, sizeof reason) == -1);
    assert (strstr (reason, "overlaps"));
    assert (kvp_rdma_register (node_a, 10, mem_b, 10, reason, sizeof reason) == -1);
    assert (kvp_rdma_register (node_a, 13, NULL, 10, reason, sizeof reason) == -1);
    assert (kvp_rdma_register (node_b, 20, mem_b, 2 * len, reason, sizeof reason) == 0);
    assert (kvp_rdma_regs_count (kvp_rdma_regions (node_a)) == 2);

    kvp_rdma_conn_options_t options = {.qp_count = 3, .sq_depth = 8, .stripe = 64 << 10};
    kvp_rdma_conn_t *a = kvp_rdma_conn_new (node_a, &options, reason, sizeof reason);
    kvp_rdma_conn_t *b = kvp_rdma_conn_new (node_b, &options, reason, sizeof reason);
    assert (a && b);
    assert (a->limits.signal_every == 4 && a->limits.max_msg == 1 << 30);
    s_fake_t *fake = s_fake_attach (a, node_a, node_b, 7);
    s_fake_t *fake_b = s_fake_attach (b, node_b, node_a, 8);
    kvp_rdma_xfer_t early = {1, KVP_RDMA_WRITE, (uint64_t) (uintptr_t) mem_a, 20, 0, 10};
    assert (kvp_rdma_conn_submit (a, &early, 1, reason, sizeof reason) == -1);
    assert (strstr (reason, "not connected"));

    //  Connection data: refused when malformed or shaped otherwise; taken when good.
    uint8_t *data;
    size_t size;
    assert (kvp_rdma_conn_local_data (b, &data, &size, reason, sizeof reason) == 0);
    kvp_rdma_conn_options_t two = {.qp_count = 2, .sq_depth = 8};
    kvp_rdma_conn_t *c = kvp_rdma_conn_new (node_a, &two, reason, sizeof reason);
    assert (kvp_rdma_conn_connect (c, data, size, reason, sizeof reason) == -1);
    assert (strstr (reason, "peer has 3 queue pairs, this side 2"));
    kvp_rdma_conn_destroy (&c);
    assert (kvp_rdma_conn_connect (a, data, size - 1, reason, sizeof reason) == -1);
    assert (strstr (reason, "refused: truncated"));
    assert (!a->connected);
    //  (a's QPs were broken by the failed connect: a fresh connection takes over.)
    kvp_rdma_conn_destroy (&a);
    s_fake_free (fake);
    a = kvp_rdma_conn_new (node_a, &options, reason, sizeof reason);
    fake = s_fake_attach (a, node_a, node_b, 7);
    free (data);
    s_round_trip (a, b, mem_a + len - 5000, mem_b, 20, (1 << 20) + 777); //  spans A's segments
    assert (kvp_rdma_regs_by_id (a->remote, 20)->rkey == 0x20000 + 20);
    assert (fake->posted > 32 && fake->overfull == 0 && a->strays == 0);

    //  A batch of many small transfers, mixed, some zero-length: all done, bytes right.
    int status[1000];
    for (int i = 0; i < 1000; i++)
        status[i] = 1;
    kvp_rdma_xfer_t batch[300];
    for (size_t i = 0; i < 300; i++) {
        size_t n = i % 50 == 0 ? 0 : 1 + (i * 7919) % 6000;
        batch[i] = (kvp_rdma_xfer_t){i,
                                     i % 3 ? KVP_RDMA_WRITE : KVP_RDMA_READ,
                                     (uint64_t) (uintptr_t) (mem_a + i * 6000),
                                     20,
                                     i * 6000,
                                     n};
        for (size_t k = 0; k < n; k++) //  what each side should end up with
            (i % 3 ? mem_a : mem_b)[i * 6000 + k] = (uint8_t) (i + k);
    }
    assert (kvp_rdma_conn_submit (a, batch, 300, reason, sizeof reason) == 0);
    assert (kvp_rdma_test_drain (a, status, 1000) == 300);
    for (size_t i = 0; i < 300; i++) {
        assert (status[i] == 0);
        assert (memcmp (mem_a + i * 6000, mem_b + i * 6000, batch[i].len) == 0);
        for (size_t k = 0; k < batch[i].len; k++)
            assert (mem_a[i * 6000 + k] == (uint8_t) (i + k));
    }
    assert (fake->overfull == 0 && a->strays == 0);

    //  Refused batches: outside the segment, local memory not registered.
    kvp_rdma_xfer_t out = {1, KVP_RDMA_READ, (uint64_t) (uintptr_t) mem_a, 20, 2 * len - 10, 11};
    assert (kvp_rdma_conn_submit (a, &out, 1, reason, sizeof reason) == -1);
    assert (strstr (reason, "outside segment 20"));
    out = (kvp_rdma_xfer_t){1, KVP_RDMA_READ, (uint64_t) (uintptr_t) mem_b, 20, 0, 10};
    assert (kvp_rdma_conn_submit (a, &out, 1, reason, sizeof reason) == -1);
    assert (strstr (reason, "not in a registered region"));

    //  Completions that are not ours (an unknown wr_id; a known one from another QP number)
    //  are counted and ignored.
    kvp_rdma_done_t done[4];
    kvp_rdma_xfer_t single = {7, KVP_RDMA_WRITE, (uint64_t) (uintptr_t) mem_a, 20, 0, 1000};
    memset (mem_b, 0, 1000);
    fake->paused = true;
    assert (kvp_rdma_conn_submit (a, &single, 1, reason, sizeof reason) == 0);
    unsigned busy = 0;
    while (fake->count[busy] == 0)
        busy++;
    uint64_t real_wr_id = fake->ring[busy][fake->head[busy]].wr_id;
    fake->inject[0] = (struct ibv_wc){.wr_id = 12345, .qp_num = a->qpn[0]};
    fake->inject[1] = (struct ibv_wc){.wr_id = real_wr_id, .qp_num = 77};
    fake->inject[2] = (struct ibv_wc){.wr_id = real_wr_id, .qp_num = a->qpn[(busy + 1) % 3]};
    fake->injects = 3;
    assert (kvp_rdma_conn_poll (a, done, 4) == 0);
    assert (a->strays == 3 && kvp_rdma_conn_active (a) == 1);
    fake->paused = false;
    status[7] = 1;
    assert (kvp_rdma_test_drain (a, status, 1000) == 1 && status[7] == 0);
    assert (memcmp (mem_a, mem_b, 1000) == 0 && a->strays == 3);
    assert (!kvp_rdma_track_broken (a->track, 0));

    //  A failure in the middle: the 20th WR to run fails. Its transfer and every transfer
    //  with a WR behind it on that QP fail; no transfer is reported twice or lost; the others
    //  moved their bytes; the connection then refuses new work.
    fake->fail_at = fake->ran + 20;
    memset (mem_b, 0, 2 * len);
    for (size_t i = 0; i < 100; i++) {
        batch[i] = (kvp_rdma_xfer_t){i,  KVP_RDMA_WRITE, (uint64_t) (uintptr_t) (mem_a + i * 20000),
                                     20, i * 20000,      20000};
        status[i] = 1;
    }
    assert (kvp_rdma_conn_submit (a, batch, 100, reason, sizeof reason) == 0);
    assert (kvp_rdma_test_drain (a, status, 1000) == 100);
    size_t failed = 0;
    for (size_t i = 0; i < 100; i++) {
        if (status[i] == 0)
            assert (memcmp (mem_a + i * 20000, mem_b + i * 20000, 20000) == 0);
        failed += status[i] != 0;
    }
    assert (failed >= 1 && failed < 100);
    assert (strstr (kvp_rdma_conn_error (a), "transport retry counter exceeded")
            || strstr (kvp_rdma_conn_error (a), "RETRY"));
    assert (kvp_rdma_conn_submit (a, batch, 1, reason, sizeof reason) == -1);
    assert (strstr (reason, "broken"));
    assert (kvp_rdma_conn_active (a) == 0);

    //  A WR whose key does not cover its memory fails as the HCA would fail it.
    uint64_t posted = fake->posted;
    kvp_rdma_conn_destroy (&a);
    s_fake_free (fake);
    a = kvp_rdma_conn_new (node_a, &options, reason, sizeof reason);
    fake = s_fake_attach (a, node_a, node_b, 9);
    assert (kvp_rdma_conn_local_data (b, &data, &size, reason, sizeof reason) == 0);
    assert (kvp_rdma_conn_connect (a, data, size, reason, sizeof reason) == 0);
    free (data);
    //  B drops segment 20 and registers the same memory again, with a new rkey; A still has
    //  the old one.
    assert (kvp_rdma_deregister (node_b, 20) == 0);
    assert (kvp_rdma_register (node_b, 21, mem_b, 2 * len, reason, sizeof reason) == 0);
    status[5] = 1;
    kvp_rdma_xfer_t one = {5, KVP_RDMA_WRITE, (uint64_t) (uintptr_t) mem_a, 20, 0, 100};
    assert (kvp_rdma_conn_submit (a, &one, 1, reason, sizeof reason) == 0);
    assert (kvp_rdma_test_drain (a, status, 1000) == 1 && status[5] == -1);
    assert (strstr (kvp_rdma_conn_error (a), "remote access error"));

    if (verbose)
        printf ("(fake device: %llu WRs posted) ", (unsigned long long) (fake->posted + posted));
    kvp_rdma_conn_destroy (&a);
    kvp_rdma_conn_destroy (&b);
    s_fake_free (fake);
    s_fake_free (fake_b);
    kvp_rdma_close (&node_a);
    kvp_rdma_close (&node_b);
    free (mem_a);
    free (mem_b);
}
