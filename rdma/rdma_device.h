/*  rdma_device.h - inside the RDMA transport: the device and connection structures that
    rdma.c (verbs) and rdma_loop.c (the loop device) both fill, and what each offers the
    other. Private to rdma/; the rest of the node sees rdma.h only.
*/
#ifndef KVP_RDMA_DEVICE_H_INCLUDED
#define KVP_RDMA_DEVICE_H_INCLUDED

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "rdma/rdma.h"

//  What connections need of the port, copied out of the verbs structures (the self test fills
//  one without a device).
typedef struct {
    uint8_t port;
    uint8_t link_layer; //  IBV_LINK_LAYER_*
    uint8_t mtu;        //  active MTU, enum ibv_mtu
    uint16_t lid;
    uint8_t gid[16];
    int gid_index;
    uint64_t max_msg;
    unsigned max_qp_wr;
    unsigned max_cqe;
    uint8_t max_rd_atomic;      //  RDMA READs this side may have outstanding (initiator)
    uint8_t max_dest_rd_atomic; //  RDMA READs it serves at once (responder)
} kvp_rdma_port_t;

struct _kvp_rdma_t {
    struct ibv_context *ctx; //  NULL for the self test's fake device and the loop device
    bool loop;               //  the loop device (KVP_RDMA_LOOP_DEVICE)
    struct ibv_pd *pd;
    kvp_rdma_port_t port;
    kvp_rdma_regs_t *regs;
    size_t conns;
    char describe[256];
};

typedef struct _kvp_rdma_pending_t {
    kvp_rdma_plan_t *plan;
    size_t next; //  next WR to post
    struct _kvp_rdma_pending_t *link;
} kvp_rdma_pending_t;

struct _kvp_rdma_conn_t {
    kvp_rdma_t *rdma;
    struct ibv_cq *cq;
    struct ibv_qp *qps[KVP_RDMA_PLAN_MAX_QPS];
    uint32_t qpn[KVP_RDMA_PLAN_MAX_QPS];
    uint32_t psn[KVP_RDMA_PLAN_MAX_QPS];
    kvp_rdma_limits_t limits;
    kvp_rdma_regs_t *remote; //  the peer's segments
    kvp_rdma_track_t *track;
    kvp_rdma_pending_t *head, *tail; //  plans not fully posted
    bool connected;
    bool dead;     //  polling failed
    size_t strays; //  completions the tracker refused
    //  The device: verbs, or the self test's fake.
    int (*post) (kvp_rdma_conn_t *self, unsigned qp, struct ibv_send_wr *wr);
    int (*poll) (kvp_rdma_conn_t *self, int max, struct ibv_wc *wc);
    void *fake;
    pid_t peer_pid; //  the loop device: the peer process
    char error[256];
};

//  Writes a reason into reason[size] (nothing when reason is NULL), printf-style.
void kvp_rdma_reason (char *reason, size_t size, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));

//  Self tests: polls until conn has nothing in flight, setting status[tag] (each tag below
//  tags, each once; 1 before) to each transfer's outcome. Returns how many ended.
size_t kvp_rdma_test_drain (kvp_rdma_conn_t *conn, int *status, size_t tags);

//  ---- the loop device (rdma_loop.c) ------------------------------------------------------

//  Opens the loop device: a kvp_rdma_t with no verbs context, whose port's GID carries this
//  process's pid and where its proof lies. NULL, with the reason, if memory ran out.
kvp_rdma_t *kvp_rdma_loop_open (char *reason, size_t reason_size);

//  Gives a new connection of the loop device its queues: self->post and self->poll move
//  bytes with process_vm_readv/writev. Returns 0, or -1 when memory ran out.
int kvp_rdma_loop_attach (kvp_rdma_conn_t *self);

//  Frees what kvp_rdma_loop_attach made (nothing if it made nothing).
void kvp_rdma_loop_detach (kvp_rdma_conn_t *self);

//  Checks the peer named by its GID (16 bytes) before a connection to it: a kvpoold of this
//  executable and this user that holds the proof where the GID says. Sets self->peer_pid and
//  returns 0, or writes the reason and returns -1.
int kvp_rdma_loop_connect (kvp_rdma_conn_t *self, const uint8_t *gid, char *reason,
                           size_t reason_size);

#endif
