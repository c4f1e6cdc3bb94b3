/*  transfer_submitter.h - the transfer-submitter actor: executes the copies of the data plane.

    It owns a transfer_pool (work-stealing copy workers) and serves KVP_TX_WRITE jobs on a
    ROUTER bound at inproc://<instance>-tx: every item with status OK has its value (src,
    size) copied into each of its replicas (addr). A job's copies are spread over the workers;
    the job is answered when all of them are done. Jobs of at most TRANSFER_INLINE_BYTES never
    come here: the thread that holds them (the api, or the replica-manager that placed them)
    copies them itself (transfer_job_copy), where the hop would cost more than the copy.

    Later transports (node-to-node TCP, RDMA, disk) plug in here as other job kinds.

    Pipe commands:
        zsock_send (actor, "s", "$TERM")   finishes the copies in flight, ends the actor
*/
#ifndef TRANSFER_SUBMITTER_H_INCLUDED
#define TRANSFER_SUBMITTER_H_INCLUDED

#include <czmq.h>

#include "infra/config.h"
#include "messages/kvp_job.h"
#include "transfer/transfer_pool.h"

//  The actor; args is a const kvp_config_t * (workers) that outlives it.
void transfer_submitter_actor (zsock_t *pipe, void *args);

//  Jobs that move at most this many bytes are copied by the thread that holds them. The
//  way through this actor and its pool and back crosses four threads; measured on the
//  2-core VM (a single put over tcp, p50), that cost 50-320 us more than copying in place,
//  against 100 us for a 1 MiB copy: 64 KiB 217-229 us in place against 370-398 through the
//  pool, 1 MiB 547-624 against 674-872. Past 1 MiB the pool's parallel copy pays off, and
//  the replica-manager is not held up longer than a megabyte's copy.
#define TRANSFER_INLINE_BYTES (1024 * 1024)
//  The same for a PUT by address (job->vm.pid), whose reads the replica-manager shares with a
//  helper thread of its own (transfer_job_copy's pool): up to 2 MiB they are done there, in
//  one round trip and without the crossings to this actor and back.
#define TRANSFER_INLINE_BY_ADDRESS_BYTES (2 * 1024 * 1024)

//  Bytes a KVP_TX_WRITE job copies (every OK item's value into each of its replicas).
uint64_t transfer_job_bytes (kvp_job_t *job);
//  True when a KVP_TX_WRITE job is small enough to copy on the thread that holds it
//  (TRANSFER_INLINE_BYTES; TRANSFER_INLINE_BY_ADDRESS_BYTES for a PUT by address).
bool transfer_job_inline (kvp_job_t *job);
//  Does a KVP_TX_WRITE job's copies on the calling thread, which owns the job. A PUT by
//  address of more than a megabyte is read in 256 KiB tasks on pool when given (the caller
//  runs tasks too while it waits: give a pool of the caller's own, or it may run others').
void transfer_job_copy (kvp_job_t *job, transfer_pool_t *pool);

void transfer_submitter_test (bool verbose);

#endif
