/*  api.h - the api actor: kvpool's client protocol front end (protocol/kvpool.proto).

    It owns the client ROUTER socket (bound to every --endpoint, plus
    inproc://<instance>-api for in-process clients), decodes and
    validates each request, turns it into a kvp_job_t and walks it through the actors that
    own the state - replica-manager, allocator, transfer-submitter - then encodes the reply.
    GET values are sent straight from segment memory (zero copy, pinned until sent).

    A put is: place (allocator) -> copy (transfer-submitter, or the api itself for small
    values) -> insert, committed (replica-manager); the stages of every operation are in
    messages/ops.h. In-process actors (the lookup server) send jobs to
    inproc://<instance>-jobs and get them back done, with no protobuf in between.

    A RESET waits until no put is in flight, holding new puts back, then removes everything;
    puts that arrive during it run after its reply.

    Threads: one, the actor's. Ordering: replies to one client may come back out of order
    when its requests go to different actors; they carry the request_id.

    Pipe commands:
        zstr_send (actor, "ENDPOINTS")  -> "OK" + one frame per bound endpoint (ephemeral
                                           ports resolved), or "ERROR" + reason
        zstr_send (actor, "DRAIN")      -> stops reading requests, replies "DRAINED" once every
                                           request in flight has been answered
        zstr_send (actor, "$TERM")         ends the actor
    Any other command is a programming error (asserts).
*/
#ifndef API_H_INCLUDED
#define API_H_INCLUDED

#include <czmq.h>

#include "infra/config.h"

//  The actor; args is a const kvp_config_t * that outlives it.
void api_actor (zsock_t *pipe, void *args);

void api_test (bool verbose);

#endif
