/*  evictor.h - the evictor actor: the disk tier's start (DESIGN section 7).

    Eviction itself runs on the replica-manager's thread, where the objects and the allocator
    are (actors/replica_evict.c: the memory pool and the disk tier kept under their
    watermarks, placements that find no room). This actor does what must happen once before
    the node serves: with a disk tier, the copies a previous run left on disk are scanned by
    the transfer-submitter (TX_DISK_SCAN) and registered by the replica-manager
    (RM_DISK_REGISTER), which must be running first.

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
