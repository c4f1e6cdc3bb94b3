/*  lookup_server.h - the lookup/reset admin channel of kvpoold (DESIGN section 6).

    An actor serving vLLM's Mooncake store connector protocol on one ROUTER socket bound to
    the admin endpoints (kvpoold's --admin, default tcp://127.0.0.1:50052): lookups (how many
    leading tokens of a request are stored, over every tp x pp rank), reset (drain in-flight
    transfers, then remove everything, forced), ping and stats. It reaches the store of its
    own process directly: it probes the node's read index (shm/shm_index.h) and sends the
    api actor kvp_job_t jobs (EXIST, RESET, STATS) over a DEALER connected to
    inproc://<instance>-jobs. Wire forms: see lookup_request.h.

    Usage:
        lookup_server_args_t args = {.lookup = config.lookup, .admin_endpoints = endpoints,
                                     .admin_endpoint_count = 1, .instance = config.instance,
                                     .max_key_len = 4096};
        zactor_t *server = zactor_new (lookup_server_actor, &args);

    Pipe commands:
        zsock_send (server, "s", "ENDPOINTS")   replies "OK" then one frame per bound endpoint,
                                                resolved ("tcp://127.0.0.1:*" comes back with
                                                its port), or "ERROR" and a reason frame if a
                                                bind failed or the key template is bad
        zsock_send (server, "s", "$TERM")       ends the actor (zactor_destroy sends it), also
                                                while it waits for the store

    The actor copies what it needs from args before it signals ready: args and the strings it
    points to need only outlive zactor_new.
*/
#ifndef LOOKUP_SERVER_H_INCLUDED
#define LOOKUP_SERVER_H_INCLUDED

#include <czmq.h>

#include "infra/lookup_config.h"

typedef struct {
    lookup_config_t lookup;             //  key template, model, ranks, block size
    const char *const *admin_endpoints; //  where the admin ROUTER binds...
    size_t admin_endpoint_count;        //  ... at least one
    const char *instance;               //  the store's instance name: its job socket
                                        //  inproc://<instance>-jobs and its read index
    size_t max_key_len;                 //  longer lookup keys are refused (0: no limit)
    uint64_t store_timeout_ms;          //  how long a job may take (0: 60 s)
    bool verbose;                       //  log every request
    struct _kvp_metrics_t *metrics;     //  lookups and hit tokens are counted here (NULL:
                                        //  not counted; infra/metrics.h)
    struct _kvp_curve_t *curve;         //  CURVE for the admin ROUTER (infra/curve.h); NULL:
                                        //  none
} lookup_server_args_t;

//  The actor; args is a lookup_server_args_t *.
void lookup_server_actor (zsock_t *pipe, void *args);

void lookup_server_test (bool verbose);

#endif
