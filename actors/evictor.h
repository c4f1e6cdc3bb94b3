/*  evictor.h - the evictor actor: keeps the memory pool, and the disk tier, under their
    watermarks (DESIGN section 7).

    It owns nothing but policy. Every tick it asks the allocator how full the pool is; past
    --eviction-high-watermark it has the replica-manager free the least recently used objects
    (RM_EVICT), writing their disk copies first through the transfer-submitter when there is a
    disk tier (TX_DISK_WRITE, then RM_OFFLOADED). A placement that found no space comes here
    (EV_MAKE_ROOM) and is answered when a cycle has run, so that its retry sees the space.
    With a disk tier it also keeps the disk under --disk-high-watermark (RM_DISK_EVICT), and
    at start registers the copies a previous run left on disk (TX_DISK_SCAN, then
    RM_DISK_REGISTER) before the node serves.

    It serves kvp_job_t pointers (EV_MAKE_ROOM, EV_STATS) on a ROUTER bound at
    inproc://<instance>-ev, and sends its own jobs to the replica-manager, the allocator and
    the transfer-submitter, which must be running first.

    Pipe commands:
        zsock_send (actor, "s", "STATUS")   replies "OK", or why the disk tier cannot be used
        zsock_send (actor, "s", "$TERM")    ends the actor
*/
#ifndef EVICTOR_H_INCLUDED
#define EVICTOR_H_INCLUDED

#include <czmq.h>

#include "infra/config.h"

//  The actor; args is a const kvp_config_t * that outlives it.
void evictor_actor (zsock_t *pipe, void *args);

void evictor_test (bool verbose);

#endif
