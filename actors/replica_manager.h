/*  replica_manager.h - the replica-manager actor: owner of all object metadata.

    It keeps key -> object {size, replicas, state, lease, pins} and runs the put state machine
    (insert for the api's puts; reserve -> bind -> commit, or revoke, for a client's),
    reads (get, exist, get-size, replica lists, touches),
    removal (by key, by regex, all, by segment), leases, the discard timeout of uncommitted
    put-starts and the deferred freeing of objects that are still being read. It keeps the
    objects in least-recently-used order and evicts them (the memory pool and the disk tier
    kept under their watermarks, a placement that finds no room made room for at once:
    actors/replica_evict.c), writes their disk copies through the transfer-submitter and
    records them.

    It serves kvp_job_t pointers on a ROUTER bound at inproc://<instance>-rm (see
    messages/kvp_job.h), and sends space it frees to the allocator (inproc://<instance>-al)
    and disk copies to write and to unlink to the transfer-submitter (inproc://<instance>-tx).
    Jobs are handled one at a time in arrival order, so two jobs on the same key are ordered.

    Pipe commands:
        zsock_send (actor, "s", "STOPPING")       the store is stopping: a regex removal being
                                                  matched, and any later one, is answered
                                                  UNAVAILABLE_IN_CURRENT_STATUS at once
        zsock_send (actor, "s", "$TERM")          ends the actor
*/
#ifndef REPLICA_MANAGER_H_INCLUDED
#define REPLICA_MANAGER_H_INCLUDED

#include <czmq.h>

#include "infra/config.h"
#include "messages/kvp_job.h"

//  The actor; args is a const kvp_config_t * that outlives it.
void replica_manager_actor (zsock_t *pipe, void *args);

//  Ends a read pin that a KVP_RM_GET job took on an object: called when the bytes have been
//  sent (from any thread, e.g. ZeroMQ's I/O thread through zmq_msg_init_data's free
//  callback). The object's space is not freed or reused while a pin is held. pin is what the
//  job's item->object holds: a handle for this call, not a pointer to dereference.
void kvp_object_unpin (kvp_object_t *pin);

//  Same signature as zmq_free_fn: unpins hint (an item->object pin).
void kvp_object_unpin_cb (void *data, void *hint);

void replica_manager_test (bool verbose);

#endif
