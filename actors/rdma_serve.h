/*  rdma_serve.h - this node's side of values moved by RDMA for other nodes.

    With --transport rdma (or auto) and a device, a node serves RDMA on its data plane: another
    node's data-plane worker first sends RDMA_CONNECT with its connection data
    (rdma/rdma_wire.h), and this module makes the matching queue pairs and answers with its own
    (rdma_serve_connect). Afterwards that node's GET, UPSERT and PUT_PART carry no value frames
    but the address, rkey and room of its memory for each value; the transfer-submitter runs
    rdma_serve_move on a transfer worker, which registers the bytes on this side (the replica,
    or a value read from disk), posts RDMA WRITE (a GET: pushed into the asker's memory) or
    RDMA READ (an UPSERT or PUT_PART: pulled into the replicas), and polls for the completions
    before the job goes on; the asker is answered only once its bytes have moved, or not.

    The node's side registers per transfer (ibv_reg_mr of exactly the bytes moved) rather than
    whole segments once: simple and always right, but on hardware a registration costs tens of
    microseconds a MiB; registering segments at mount is the next step once it can be measured.

    NOT YET RUN ON RDMA HARDWARE (see rdma/rdma.h): tested end to end with the loop device.

    Threads: any; one mutex serialises every use of the device and its connections (the verbs
    layer here is not thread-safe), so RDMA moves of different jobs do not overlap.
*/
#ifndef RDMA_SERVE_H_INCLUDED
#define RDMA_SERVE_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>

#include "messages/kvp_job.h"

typedef struct _rdma_serve_t rdma_serve_t;

//  Opens device (NULL: the first; rdma/rdma.h) for serving. timeout_ms bounds one job's moves.
//  Returns NULL with a reason. Caller owns the return value.
rdma_serve_t *rdma_serve_new (const char *device, int timeout_ms, char *reason, size_t reason_size);

//  Destroys the connections and closes the device. Does nothing on NULL; sets *self_p to NULL.
void rdma_serve_destroy (rdma_serve_t **self_p);

//  RDMA_CONNECT: job->rdma_connect.data (the asker's connection data) is replaced by this
//  node's, and job->rdma_conn is the new connection's id; or the job fails with a reason.
void rdma_serve_connect (rdma_serve_t *self, kvp_job_t *job);

//  KVP_TX_RDMA_PUSH or KVP_TX_RDMA_PULL: moves the values of the job's OK items; an item whose
//  bytes did not all move is KVPOOL_TRANSFER_FAIL (a GET whose value is larger than the room
//  the asker gave, BUFFER_OVERFLOW). Blocks until done or timed out.
void rdma_serve_move (rdma_serve_t *self, kvp_job_t *job);

//  Values and ranges moved so far.
uint64_t rdma_serve_moved (rdma_serve_t *self);

void rdma_serve_test (bool verbose);

#endif
