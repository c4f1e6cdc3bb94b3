/*  allocator.h - the allocator actor: this node's segments and the space inside them.

    It creates the node's own segments at start (--segments N of --segment-size bytes, each a
    shared-memory object managed by its own jemalloc arena, see alloc/), mounts and unmounts
    segments that clients contribute, places replicas across segments (distinct segments per
    object; preferred segments first, then random with a seed or by free ratio) and allocates
    and frees ranges in them. The bytes themselves are never touched here.

    It serves kvp_job_t pointers (KVP_AL_*) on a ROUTER bound at inproc://<instance>-al.
    Jobs are handled in arrival order, except UNMOUNT, whose reply waits until every
    allocation in the segment has been freed (or fails after a timeout).

    Pipe commands:
        zsock_send (actor, "s", "$TERM")          ends the actor
        zstr_send (actor, "STATUS")                 replies "OK", or why the node's own
                                                    segments could not be created
*/
#ifndef ALLOCATOR_H_INCLUDED
#define ALLOCATOR_H_INCLUDED

#include <czmq.h>

#include "actors/config.h"
#include "messages/kvp_job.h"

//  The actor; args is a const kvp_config_t * that outlives it. When the node's segments
//  cannot be created it still starts, answers STATUS with the reason and every job with
//  NO_AVAILABLE_HANDLE.
void allocator_actor (zsock_t *pipe, void *args);

void allocator_test (bool verbose);

#endif
