/*  replica_repair.h - the repair actor (kvpoold --role node): this node's part in restoring
    replicas the cluster lost, and its own drain.

    It asks the master for repair work (REPAIR, protocol/cluster.proto) as its --repair-rate
    allows, and copies what it is handed through the api (KVP_OP_REPAIR_FILL,
    messages/ops.c): each value fetched from a holder, written hidden, claimed at the master
    at the version read (REPAIRED), then served as a replica of this node's, or dropped if
    the master refused it (master/repair.c).

    Pipe commands:
        zstr_send (repair, "DRAIN")  ->  "OK" | "TIMEOUT", objects left behind
            Drains this node: the master places nothing more on it and copies what only it
            holds elsewhere; once nothing is only here (or --drain-timeout passed) the node
            leaves every holder list. For a node about to exit (--drain-on-exit).
        zstr_send (repair, "$TERM")

    Threads: one (its loop: infra/actor_shell.h), its own connection to the master
    (master_client.h) and a DEALER to the api's job socket.
*/
#ifndef REPLICA_REPAIR_H_INCLUDED
#define REPLICA_REPAIR_H_INCLUDED

#include <czmq.h>

#include "actors/cluster.h"

//  args: a cluster_args_t * that outlives the actor.
void replica_repair_actor (zsock_t *pipe, void *args);

#endif
