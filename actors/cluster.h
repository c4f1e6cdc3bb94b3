/*  cluster.h - the cluster actor (kvpoold --role node): this node's part of a cluster's
    data path.

    The api sends it the KVP_CL_* stages of its clients' jobs (messages/ops.c, the cluster's
    rows): the master places and finds keys (protocol/cluster.proto), and values move to and
    from the other nodes over their data planes (the client protocol, kvpool.proto, on each
    node's --peer-endpoint), over persistent connections: --peer-connections DEALERs to each
    node, made once and kept. The replica-manager sends it KVP_CL_DROPPED jobs (objects it
    evicted) to tell the master.

    Pipe commands:
        zstr_send (cluster, "$TERM")

    Sockets: a ROUTER on inproc://<instance>-cl for jobs (answered by sending them back).
*/
#ifndef CLUSTER_H_INCLUDED
#define CLUSTER_H_INCLUDED

#include <czmq.h>
#include <stdatomic.h>

#include "infra/config.h"
#include "protocol/cluster.pb-c.h"

//  The node's registration with its master, as the membership actor last had it answered,
//  for the cluster actor to send back with every change it asks of the master (a node the
//  master declared dead, or that registered again since, changes nothing). 0: none.
typedef struct {
    atomic_uint_fast64_t epoch, number;
} cluster_registration_t;

typedef struct {
    const kvp_config_t *config;
    const char *node_id;                  //  this node's name in the cluster
    const char *host_id;                  //  its machine
    const char *peer_endpoint;            //  its own data plane (removes reach it there too)
    const char *client_endpoint;          //  where its clients connect
    cluster_registration_t *registration; //  shared by the membership and cluster actors
} cluster_args_t;

//  args: a cluster_args_t * that outlives the actor.
void cluster_actor (zsock_t *pipe, void *args);

void cluster_test (bool verbose);

#endif
