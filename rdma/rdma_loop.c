/*  rdma_loop.c - the loop device (KVP_RDMA_LOOP_DEVICE): RDMA's one-sided READ and WRITE
    done by the kernel between two processes of this machine, so that the RDMA path of the
    data plane runs end to end in the tests, where there is no HCA (rdma_device.h).

    It stands behind the same two calls a verbs device has, posting and polling
    (kvp_rdma_conn_t.post / .poll): per QP, a ring of posted WRs run in order at each poll with
    process_vm_readv / process_vm_writev against the peer process, after their keys are
    checked against this side's regions (lkey) and the peer's as announced (rkey). A peer is
    accepted only once it proved to be a kvpoold of this executable and this user holding the
    proof its GID points at, so no process is ever read or written on the strength of its pid.

    Threads: a connection belongs to one thread, as a verbs connection does.
*/
#include "rdma/rdma_device.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

//  The loop device (KVP_RDMA_LOOP_DEVICE) moves bytes as an HCA would, with the kernel's
//  process_vm_readv / process_vm_writev against the peer process: per QP, the posted WRs in
//  order; each poll runs them, checking their keys against this side's regions (lkey) and
//  the peer's (rkey) first. A WR whose keys do not cover it, or whose copy the kernel refuses
//  (the peer is gone), fails as a remote access error, and its QP is broken from then on.
typedef struct {
    uint64_t wr_id;
    enum ibv_wr_opcode opcode;
    unsigned flags;
    uint64_t local_addr, remote_addr;
    uint32_t len, lkey, rkey;
} s_loop_wr_t;

typedef struct {
    unsigned depth;
    s_loop_wr_t *ring[KVP_RDMA_PLAN_MAX_QPS];
    unsigned head[KVP_RDMA_PLAN_MAX_QPS], count[KVP_RDMA_PLAN_MAX_QPS];
    bool error[KVP_RDMA_PLAN_MAX_QPS];
    unsigned next_qp;
} s_loop_t;

static int
s_loop_post (kvp_rdma_conn_t *self, unsigned qp, struct ibv_send_wr *wr)
{
    s_loop_t *loop = (s_loop_t *) self->fake;
    if (wr->num_sge != 1 || loop->count[qp] == loop->depth) {
        errno = ENOMEM;
        return -1;
    }
    loop->ring[qp][(loop->head[qp] + loop->count[qp]++) % loop->depth] =
        (s_loop_wr_t){wr->wr_id,
                      wr->opcode,
                      wr->send_flags,
                      wr->sg_list->addr,
                      wr->wr.rdma.remote_addr,
                      wr->sg_list->length,
                      wr->sg_list->lkey,
                      wr->wr.rdma.rkey};
    return 0;
}

static bool
s_loop_covers (const kvp_rdma_regs_t *regs, uint64_t addr, uint32_t len, uint32_t key, bool rkey)
{
    const kvp_rdma_region_t *region = kvp_rdma_regs_find (regs, addr, len);
    return region && (rkey ? region->rkey : region->lkey) == key;
}

static int
s_loop_poll (kvp_rdma_conn_t *self, int max, struct ibv_wc *wc)
{
    s_loop_t *loop = (s_loop_t *) self->fake;
    unsigned qp_count = self->limits.qp_count;
    int n = 0;
    for (unsigned idle = 0; n < max && idle < qp_count;) {
        unsigned qp = loop->next_qp++ % qp_count;
        if (loop->count[qp] == 0) {
            idle++;
            continue;
        }
        idle = 0;
        s_loop_wr_t wr = loop->ring[qp][loop->head[qp]];
        loop->head[qp] = (loop->head[qp] + 1) % loop->depth;
        loop->count[qp]--;
        struct ibv_wc *c = &wc[n];
        memset (c, 0, sizeof *c);
        c->wr_id = wr.wr_id;
        c->qp_num = self->qpn[qp];
        c->opcode = wr.opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
        c->status = IBV_WC_SUCCESS;
        if (loop->error[qp])
            c->status = IBV_WC_WR_FLUSH_ERR;
        else if (!s_loop_covers (self->rdma->regs, wr.local_addr, wr.len, wr.lkey, false))
            c->status = IBV_WC_LOC_PROT_ERR;
        else if (!s_loop_covers (self->remote, wr.remote_addr, wr.len, wr.rkey, true))
            c->status = IBV_WC_REM_ACCESS_ERR;
        else {
            struct iovec local = {(void *) (uintptr_t) wr.local_addr, wr.len};
            struct iovec remote = {(void *) (uintptr_t) wr.remote_addr, wr.len};
            ssize_t moved = wr.opcode == IBV_WR_RDMA_WRITE
                                ? process_vm_writev (self->peer_pid, &local, 1, &remote, 1, 0)
                                : process_vm_readv (self->peer_pid, &local, 1, &remote, 1, 0);
            if (moved != (ssize_t) wr.len)
                c->status = IBV_WC_REM_ACCESS_ERR;
        }
        bool failed = c->status != IBV_WC_SUCCESS && c->status != IBV_WC_WR_FLUSH_ERR;
        if (failed)
            loop->error[qp] = true;
        //  Errors complete even unsignalled WRs; flushes and successes only signalled ones.
        if (failed || (wr.flags & IBV_SEND_SIGNALED))
            n++;
    }
    return n;
}

int
kvp_rdma_loop_attach (kvp_rdma_conn_t *self)
{
    s_loop_t *loop = (s_loop_t *) calloc (1, sizeof *loop);
    if (!loop)
        return -1;
    self->fake = loop;
    loop->depth = self->limits.max_outstanding;
    for (unsigned q = 0; q < self->limits.qp_count; q++) {
        loop->ring[q] = (s_loop_wr_t *) calloc (loop->depth, sizeof (s_loop_wr_t));
        if (!loop->ring[q])
            return -1;
        self->qpn[q] = (uint32_t) getpid () * 64 + q;
    }
    self->post = s_loop_post;
    self->poll = s_loop_poll;
    return 0;
}

//  The loop device's port: its address is the process id, behind a magic, and where in
//  that process its proof lies. The loop device moves bytes with process_vm_readv/writev,
//  which (as root) reaches any process, so a node connects to a peer only once the peer
//  proved to be a kvpoold of this user on the loop device (s_loop_peer_check): the process
//  named runs this very executable, as this user, and holds the proof where its address
//  said. A process that merely has a pid - anyone's - never has its memory read or written.
//  (The data plane that carries RDMA_CONNECT admits only the cluster's nodes, too.)
static const uint8_t s_loop_magic[4] = {'k', 'v', 'p', 'l'};

typedef struct {
    char magic[16];
    uint32_t pid;
} loop_proof_t;

static loop_proof_t s_loop_proof;

//  Whether pid is a kvpoold of this user on the loop device whose proof is at addr.
static int
s_loop_peer_check (pid_t pid, uint64_t addr, char *reason, size_t reason_size)
{
    char path[64];
    struct stat mine, theirs, proc;
    snprintf (path, sizeof path, "/proc/%d/exe", (int) pid);
    if (pid <= 0 || stat ("/proc/self/exe", &mine) != 0 || stat (path, &theirs) != 0
        || mine.st_dev != theirs.st_dev || mine.st_ino != theirs.st_ino) {
        kvp_rdma_reason (reason, reason_size,
                  "loop device: process %d is not a kvpoold of this executable", (int) pid);
        return -1;
    }
    snprintf (path, sizeof path, "/proc/%d", (int) pid);
    if (stat (path, &proc) != 0 || proc.st_uid != geteuid ()) {
        kvp_rdma_reason (reason, reason_size, "loop device: process %d is not this user's", (int) pid);
        return -1;
    }
    loop_proof_t proof;
    struct iovec local = {&proof, sizeof proof};
    struct iovec remote = {(void *) (uintptr_t) addr, sizeof proof};
    if (process_vm_readv (pid, &local, 1, &remote, 1, 0) != (ssize_t) sizeof proof
        || memcmp (proof.magic, KVP_RDMA_LOOP_DEVICE, sizeof KVP_RDMA_LOOP_DEVICE) != 0
        || proof.pid != (uint32_t) pid) {
        kvp_rdma_reason (reason, reason_size,
                  "loop device: process %d holds no loop device's proof where it said",
                  (int) pid);
        return -1;
    }
    return 0;
}

kvp_rdma_t *
kvp_rdma_loop_open (char *reason, size_t reason_size)
{
    kvp_rdma_t *self = (kvp_rdma_t *) calloc (1, sizeof *self);
    if (!self || !(self->regs = kvp_rdma_regs_new ())) {
        free (self);
        kvp_rdma_reason (reason, reason_size, "out of memory; using tcp");
        return NULL;
    }
    self->loop = true;
    self->port = (kvp_rdma_port_t){.port = 1,
                            .link_layer = IBV_LINK_LAYER_ETHERNET,
                            .mtu = IBV_MTU_4096,
                            .max_msg = 1 << 30,
                            .max_qp_wr = 4096,
                            .max_cqe = 1 << 20,
                            .max_rd_atomic = 16,
                            .max_dest_rd_atomic = 16};
    uint32_t pid = (uint32_t) getpid ();
    memcpy (s_loop_proof.magic, KVP_RDMA_LOOP_DEVICE, sizeof KVP_RDMA_LOOP_DEVICE);
    s_loop_proof.pid = pid;
    uint64_t proof = (uint64_t) (uintptr_t) &s_loop_proof;
    memcpy (self->port.gid, s_loop_magic, 4);
    memcpy (self->port.gid + 4, &pid, 4);
    memcpy (self->port.gid + 8, &proof, 8);
    snprintf (self->describe, sizeof self->describe,
              "%s (software: one-sided READ and WRITE by process_vm_readv/writev between "
              "processes of this machine, for tests; pid %u)",
              KVP_RDMA_LOOP_DEVICE, (unsigned) pid);
    kvp_rdma_reason (reason, reason_size, "%s", self->describe);
    return self;
}

void
kvp_rdma_loop_detach (kvp_rdma_conn_t *self)
{
    s_loop_t *loop = (s_loop_t *) self->fake;
    if (!loop)
        return;
    for (unsigned q = 0; q < KVP_RDMA_PLAN_MAX_QPS; q++)
        free (loop->ring[q]);
    free (loop);
    self->fake = NULL;
}

int
kvp_rdma_loop_connect (kvp_rdma_conn_t *self, const uint8_t *gid, char *reason,
                       size_t reason_size)
{
    if (memcmp (gid, s_loop_magic, 4) != 0) {
        kvp_rdma_reason (reason, reason_size, "the peer is not on the loop device");
        return -1;
    }
    uint32_t pid;
    uint64_t proof;
    memcpy (&pid, gid + 4, 4);
    memcpy (&proof, gid + 8, 8);
    if (s_loop_peer_check ((pid_t) pid, proof, reason, reason_size) != 0)
        return -1;
    self->peer_pid = (pid_t) pid;
    return 0;
}

//  ---- self test ---------------------------------------------------------------------------

//  The loop device, both ends in this process (the peer pid is its own): a registration per
//  transfer on each side, as the data plane does, WRITE and READ striped over the QPs, a
//  wrong rkey and a region the peer never announced refused.
void
kvp_rdma_loop_test (bool verbose)
{
    char reason[256];
    kvp_rdma_t *a = kvp_rdma_open (KVP_RDMA_LOOP_DEVICE, reason, sizeof reason);
    kvp_rdma_t *b = kvp_rdma_open (KVP_RDMA_LOOP_DEVICE, reason, sizeof reason);
    assert (a && b && strstr (reason, "process_vm_readv"));
    //  Only a kvpoold of this user that holds the proof where it said is a peer: never a
    //  process named by its pid alone (here: the parent, a shell or the test runner, and
    //  this process with the wrong address).
    assert (s_loop_peer_check (getpid (), (uint64_t) (uintptr_t) &s_loop_proof, reason,
                               sizeof reason)
            == 0);
    assert (s_loop_peer_check (getppid (), (uint64_t) (uintptr_t) &s_loop_proof, reason,
                               sizeof reason)
            == -1);
    assert (s_loop_peer_check (getpid (), (uint64_t) (uintptr_t) reason, reason, sizeof reason)
            == -1);
    assert (strstr (reason, "no loop device's proof"));
    kvp_rdma_conn_options_t options = {.qp_count = 3, .sq_depth = 8, .stripe = 4096};
    kvp_rdma_conn_t *ca = kvp_rdma_conn_new (a, &options, reason, sizeof reason);
    kvp_rdma_conn_t *cb = kvp_rdma_conn_new (b, &options, reason, sizeof reason);
    assert (ca && cb);
    uint8_t *data_a, *data_b;
    size_t size_a, size_b;
    assert (kvp_rdma_conn_local_data (ca, &data_a, &size_a, reason, sizeof reason) == 0);
    assert (kvp_rdma_conn_local_data (cb, &data_b, &size_b, reason, sizeof reason) == 0);
    assert (kvp_rdma_conn_connect (ca, data_b, size_b, reason, sizeof reason) == 0);
    assert (kvp_rdma_conn_connect (cb, data_a, size_a, reason, sizeof reason) == 0);
    free (data_a);
    free (data_b);
    size_t len = 300000;
    uint8_t *src = (uint8_t *) malloc (len), *dst = (uint8_t *) calloc (1, len);
    uint8_t *back = (uint8_t *) calloc (1, len);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t) (i * 31 + 7);
    //  A's source and landing area registered locally; B's target made known to A as B's.
    assert (kvp_rdma_register (a, 1, src, len, reason, sizeof reason) == 0);
    assert (kvp_rdma_register (a, 2, back, len, reason, sizeof reason) == 0);
    assert (kvp_rdma_register (b, 7, dst, len, reason, sizeof reason) == 0);
    const kvp_rdma_region_t *target = kvp_rdma_regs_by_id (kvp_rdma_regions (b), 7);
    assert (kvp_rdma_conn_add_remote (ca, 7, target->addr, target->len, target->rkey, reason,
                                      sizeof reason)
            == 0);
    assert (kvp_rdma_conn_add_remote (ca, 8, target->addr, 10, 1, reason, sizeof reason) == -1);
    int status[4] = {1, 1, 1, 1};
    kvp_rdma_xfer_t write = {0, KVP_RDMA_WRITE, (uint64_t) (uintptr_t) src, 7, 0, len};
    assert (kvp_rdma_conn_submit (ca, &write, 1, reason, sizeof reason) == 0);
    assert (kvp_rdma_test_drain (ca, status, 4) == 1 && status[0] == 0);
    assert (memcmp (dst, src, len) == 0);
    kvp_rdma_xfer_t read = {1, KVP_RDMA_READ, (uint64_t) (uintptr_t) back, 7, 1000, len - 1000};
    assert (kvp_rdma_conn_submit (ca, &read, 1, reason, sizeof reason) == 0);
    assert (kvp_rdma_test_drain (ca, status, 4) == 1 && status[1] == 0);
    assert (memcmp (back, src + 1000, len - 1000) == 0);
    //  Memory the peer does not have (the kernel refuses the copy, as an HCA would refuse a
    //  key): a remote access error, the QP broken, the transfer failed. (The loop device
    //  cannot check a peer's keys: they live in the peer's process.)
    assert (kvp_rdma_conn_remove_remote (ca, 7) == 0);
    assert (kvp_rdma_conn_add_remote (ca, 9, 4096, 100, 5, reason, sizeof reason) == 0);
    kvp_rdma_xfer_t bad = {2, KVP_RDMA_WRITE, (uint64_t) (uintptr_t) src, 9, 0, 100};
    assert (kvp_rdma_conn_submit (ca, &bad, 1, reason, sizeof reason) == 0);
    assert (kvp_rdma_test_drain (ca, status, 4) == 1 && status[2] == -1);
    assert (strstr (kvp_rdma_conn_error (ca), "remote access error"));
    //  A region the peer never announced is refused before anything is posted.
    kvp_rdma_xfer_t unknown = {3, KVP_RDMA_WRITE, (uint64_t) (uintptr_t) src, 7, 0, 100};
    assert (kvp_rdma_conn_submit (ca, &unknown, 1, reason, sizeof reason) == -1);
    kvp_rdma_conn_destroy (&ca);
    kvp_rdma_conn_destroy (&cb);
    kvp_rdma_close (&a);
    kvp_rdma_close (&b);
    free (src);
    free (dst);
    free (back);
    if (verbose)
        printf ("(loop device ok) ");
}
