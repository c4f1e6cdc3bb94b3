/*  peer_link.h - one connection to another node's data plane: request, reply, timeout,
    reconnect.

    A node's data plane speaks the client protocol (kvpool.proto) on its --peer-endpoint.
    Both users of other nodes' data planes talk to them through this one layer: the data
    plane's transfer workers (data_plane.h: one link per node per worker, each request
    awaited where it was sent, peer_link_call) and the cluster actor's peer control (a few
    links per node, read from its poller; the calls matched by an rpc_calls.h table,
    peer_link_send and peer_link_recv).

    A link is one DEALER (linger 0, no high-water marks, CURVE with the node's server key
    when the cluster runs CURVE: infra/curve.h). A request is one header frame (a Request,
    its version and id filled here) and the value frames that go with it; a reply is one
    header frame (a Reply) and its value frames, received whole. A node that does not
    answer in time, or a send that fails, leaves the link in doubt: its owner closes it
    (peer_link_reconnect, or destroys it), so that what was queued goes, libzmq stops
    reconnecting to a port another process may take, and no late answer is read as the
    next request's. With heartbeats on (the cluster actor's links, which sit idle), a
    connection that died without a FIN is found out too.

    Threads: a link belongs to one thread.
*/
#ifndef PEER_LINK_H_INCLUDED
#define PEER_LINK_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/kvpool.pb-c.h"

typedef struct _peer_link_t peer_link_t;
struct _kvp_curve_t;

//  How a call on a link ended (peer_link_call).
typedef enum {
    PEER_LINK_OK = 0,
    PEER_LINK_SEND_FAILED = -1, //  the request did not go: the link is in doubt
    PEER_LINK_TIMEOUT = -2,     //  no answer in time: the link is in doubt
} peer_link_rc_t;

//  A link to endpoint, connected at once. curve: the cluster's CURVE (NULL: none);
//  curve_key: the node's CURVE public key (NULL or "": the cluster's own). heartbeat: libzmq
//  heartbeats on the connection (1 s, 3 s timeout). Returns NULL when the endpoint is not
//  one libzmq can connect to. Caller owns the return value and must destroy it.
peer_link_t *peer_link_new (const char *endpoint, const char *curve_key,
                            const struct _kvp_curve_t *curve, bool heartbeat);

//  Does nothing on NULL; sets *self_p to NULL.
void peer_link_destroy (peer_link_t **self_p);

//  Closes the connection and makes it again: what was queued for the node goes, and any
//  answer still due from it is never read. Returns 0, or -1 (the link has no socket then,
//  and every send fails until the next reconnect).
int peer_link_reconnect (peer_link_t *self);

//  The socket, for the owner's poller. The link keeps ownership.
zsock_t *peer_link_sock (peer_link_t *self);

//  When the link last sent (zclock_mono ms).
int64_t peer_link_last_used (peer_link_t *self);

//  Sends request with id (request->version and request_id are set here) and
//  values[0 .. count) after it, without blocking the caller on a slow node (the link has no
//  high-water mark). The value frames are taken (each is closed or sent, either way).
//  Returns 0, or -1 when the request did not go.
int peer_link_send (peer_link_t *self, Kvpool__V1__Request *request, uint64_t id, zmq_msg_t *values,
                    size_t count);

//  Receives one whole message from sock (a link's: the owner's poller said it is ready):
//  the decoded reply, or NULL when it is not a Reply (dropped). With a reply, *frames_p and
//  *count_p are its value frames (the header not among them); free both with
//  peer_link_reply_free.
Kvpool__V1__Reply *peer_link_recv (zsock_t *sock, zmq_msg_t **frames_p, size_t *count_p);

//  Frees what peer_link_recv or peer_link_call returned. Does nothing on NULL.
void peer_link_reply_free (Kvpool__V1__Reply **reply_p, zmq_msg_t **frames_p, size_t count);

//  One request and its reply, on the caller's thread: sends request (with the link's next
//  id) and values as peer_link_send, then waits up to timeout_ms for the answer with that
//  id; answers to earlier requests of this link, late, are dropped. PEER_LINK_OK with
//  *reply_p, *frames_p and *count_p set (free them with peer_link_reply_free).
peer_link_rc_t peer_link_call (peer_link_t *self, Kvpool__V1__Request *request, zmq_msg_t *values,
                               size_t count, int timeout_ms, Kvpool__V1__Reply **reply_p,
                               zmq_msg_t **frames_p, size_t *count_p);

void peer_link_test (bool verbose);

#endif
