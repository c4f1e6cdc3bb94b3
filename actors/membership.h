/*  membership.h - the membership actor (kvpoold --role node): the node's life at the master.

    On a thread of its own, so that a node busy moving values is never taken for dead: it
    registers the node, reports what the node holds (INVENTORY, from the replica-manager's
    list of committed objects), then sends a HEARTBEAT every --heartbeat-interval with the
    node's free space (the allocator's figures, asked each beat and never waited for). When a
    heartbeat comes back "unknown node" (the master restarted, or declared this node dead
    while it was cut off), it registers and reports again at once.

    Pipe commands:
        zstr_send (membership, "$TERM")
*/
#ifndef MEMBERSHIP_H_INCLUDED
#define MEMBERSHIP_H_INCLUDED

#include <czmq.h>

#include "actors/cluster.h"

//  args: a cluster_args_t * that outlives the actor.
void membership_actor (zsock_t *pipe, void *args);

#endif
