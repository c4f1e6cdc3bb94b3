/*  allocator.h - the allocator: this node's segments and the space inside them.

    It creates the node's own segments at start (--segments N of --segment-size bytes, each a
    shared-memory object managed by its own jemalloc arena, see alloc/), mounts and unmounts
    segments that clients contribute, places replicas across segments (distinct segments per
    object; preferred segments first, then random with a seed or by free ratio) and allocates
    and frees ranges in them. The bytes themselves are never touched here.

    It is a module the replica-manager's thread owns and calls, not an actor: the KVP_AL_*
    jobs come to the replica-manager's socket, which hands them here (allocator_handle).
    Jobs are handled in arrival order, except UNMOUNT, whose reply waits until every
    allocation in the segment has been freed (or fails after a timeout): the owner then
    collects it with allocator_finished.
*/
#ifndef ALLOCATOR_H_INCLUDED
#define ALLOCATOR_H_INCLUDED

#include <czmq.h>

#include "infra/config.h"
#include "messages/kvp_job.h"

//  Creates the node's own segments (and, with --segment-dir, adopts the previous run's
//  objects into them). config must outlive the allocator. When the segments cannot be made
//  it is still made: allocator_error says why, and every job but FREE fails with
//  NO_AVAILABLE_HANDLE.
allocator_t *allocator_new (const kvp_config_t *config);
//  Answers what is parked with UNAVAILABLE_IN_CURRENT_STATUS (collect it with
//  allocator_finished before destroying, to reply).
void allocator_stop (allocator_t *self);
//  The thread that used the allocator is done with it, for good: a release, so that the
//  thread that destroys it sees all that thread did. (They are ordered by a ZeroMQ pipe
//  already, zactor_destroy's, which ThreadSanitizer does not see into.)
void allocator_hand_back (allocator_t *self);
//  Frees the segments' arenas and unmaps them; what is still parked is destroyed.
void allocator_destroy (allocator_t **self_p);

//  Why the node's own segments could not be made, or NULL.
const char *allocator_error (allocator_t *self);
//  Makes the allocator refuse every job but FREE from now on, for reason.
void allocator_fail (allocator_t *self, const char *reason);
//  With --segment-dir: the KVP_RM_ADOPT job holding the objects adopted at start (placed,
//  their bytes copied), once; the caller owns it. NULL without one.
kvp_job_t *allocator_adopted (allocator_t *self);

//  Does a KVP_AL_* job. Returns true when the job was parked (an UNMOUNT waiting for its
//  segment to empty): the allocator then holds the job and *reply_to_p (taken, set NULL)
//  until allocator_finished hands them back.
bool allocator_handle (allocator_t *self, kvp_job_t *job, zframe_t **reply_to_p);
//  The bytes of the segments mounted, and of the space allocated in them (as AL_STATS).
void allocator_usage (allocator_t *self, uint64_t *mounted, uint64_t *allocated);
//  Ends the unmounts whose segment emptied or whose time ran out; call it now and then.
void allocator_tick (allocator_t *self);
//  A parked job that is done, with the reply_to it came with; NULL when none.
kvp_job_t *allocator_finished (allocator_t *self, zframe_t **reply_to_p);

void allocator_test (bool verbose);

#endif
