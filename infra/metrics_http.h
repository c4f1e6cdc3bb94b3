/*  metrics_http.h - the metrics actor: /metrics (Prometheus) and /health over HTTP on
    --metrics-host:--metrics-port, and the collector of the STATS snapshot they show
    (infra/metrics.h says what is counted and where).

        zactor_t *metrics = zactor_new (metrics_http_actor, &config);  //  config.metrics set
        zstr_send (metrics, "ENDPOINTS");  //  "OK"[, "http://127.0.0.1:9003"]

    Start it after the api (it sends STATS jobs to the api's job socket) and end it before.
*/
#ifndef KVP_METRICS_HTTP_H_INCLUDED
#define KVP_METRICS_HTTP_H_INCLUDED

#include <czmq.h>

#include "infra/config.h"
#include "infra/metrics.h"

//  The actor; args is the daemon's kvp_config_t, whose metrics member it reads and fills.
void metrics_http_actor (zsock_t *pipe, void *args);

#endif
