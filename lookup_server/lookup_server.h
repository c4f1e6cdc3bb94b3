/*  lookup_server.h - the lookup/reset admin channel of kvpoold (DESIGN section 6).

    An actor serving vLLM's Mooncake store connector protocol on one ROUTER socket bound to
    config->admin_endpoints (default tcp://127.0.0.1:50052): lookups (how many leading tokens
    of a request are stored, over every tp x pp rank), reset (drain in-flight transfers, then
    remove everything, forced), ping and stats. It talks to the store as a client of kvpoold's
    api through libkvpool, connected to store_endpoint (an inproc:// endpoint of the same
    process). Wire forms: see lookup_request.h.

    Usage:
        lookup_server_args_t args = {&config, "inproc://kvpool-api"};
        zactor_t *server = zactor_new (lookup_server_actor, &args);

    Pipe commands:
        zsock_send (server, "s", "ENDPOINTS")   replies "OK" then one frame per bound endpoint,
                                                resolved ("tcp://127.0.0.1:*" comes back with
                                                its port), or "ERROR" and a reason frame if a
                                                bind failed or the key template is bad
        zsock_send (server, "s", "$TERM")       ends the actor (zactor_destroy sends it)

    args and what it points to must outlive the actor.
*/
#ifndef LOOKUP_SERVER_H_INCLUDED
#define LOOKUP_SERVER_H_INCLUDED

#include <czmq.h>

#include "actors/config.h"

typedef struct {
    const kvp_config_t *config;
    const char *store_endpoint;
} lookup_server_args_t;

//  The actor; args is a lookup_server_args_t *.
void lookup_server_actor (zsock_t *pipe, void *args);

void lookup_server_test (bool verbose);

#endif
