/*  endpoints.h - the ENDPOINTS pipe command that socket-owning actors answer.

    An actor that binds sockets (the api, the lookup server) tells its parent where it
    listens with one message: "OK" followed by one frame per bound endpoint (ephemeral ports
    resolved), or "ERROR" followed by the reason the bind failed. The daemon asks each actor
    once at start and writes the answers into its ready file.
*/
#ifndef KVP_ENDPOINTS_H_INCLUDED
#define KVP_ENDPOINTS_H_INCLUDED

#include <czmq.h>

//  Answers ENDPOINTS on pipe: error (when not NULL or "") or the endpoints (strings).
int kvp_endpoints_reply (zsock_t *pipe, zlistx_t *endpoints, const char *error);

//  The endpoint a bind of endpoint made, into out: an ephemeral port ("tcp://host:*") as the
//  port zsock_bind returned.
void kvp_endpoint_resolved (const char *endpoint, int port, char *out, size_t size);

//  Asks an actor for its endpoints. Returns them (caller destroys the list) or NULL after
//  printing "kvpoold: <what>: <reason>" on stderr.
zlist_t *kvp_endpoints_ask (zactor_t *actor, const char *what);

//  Whether endpoint (tcp://HOST:PORT; other transports are local) binds only the loopback
//  interface: 127.0.0.0/8, ::1 or localhost. A wildcard or any other address is not.
bool kvp_endpoint_is_loopback (const char *endpoint);

//  Whether endpoint (tcp://HOST:PORT) binds every address: HOST is *, 0.0.0.0, :: or [::].
//  Nobody can connect to such an address from another machine, so a node does not announce it.
bool kvp_endpoint_is_wildcard (const char *endpoint);

//  The endpoint to announce for a bound endpoint, into out: with a wildcard host, advertise
//  in its place (an IPv6 address goes in brackets); any other endpoint as it is. Returns 0,
//  or -1 (out = "") when the host is a wildcard and advertise is NULL or "".
int kvp_endpoint_advertised (const char *endpoint, const char *advertise, char *out, size_t size);

#endif
