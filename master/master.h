/*  master.h - the master actor (kvpoold --role master): a cluster's metadata and placement.

    Binds a ROUTER on --master and answers the nodes' kvpool.cluster.v1 requests
    (protocol/cluster.proto): membership (REGISTER, HEARTBEAT, INVENTORY), placement and the
    directory (PLACE, COMMIT, ABORT, LOCATE, REMOVE, REMOVE_ALL, REMOVE_REGEX, DROPPED), and
    the node list (NODES), repair of objects that lack replicas and drains (REPAIR,
    REPAIRED, DRAIN: repair.h). It owns no memory and never carries a value.

    Pipe commands:
        zstr_send (master, "ENDPOINTS")  ->  "OK", endpoint... | "ERROR", reason
        zstr_send (master, "$TERM")      ends the actor
*/
#ifndef MASTER_H_INCLUDED
#define MASTER_H_INCLUDED

#include <czmq.h>

//  args: the daemon's const kvp_config_t *.
void master_actor (zsock_t *pipe, void *args);

void master_test (bool verbose);

#endif
