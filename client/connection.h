/*  connection.h - libkvpool's lowest layer: one connection to a kvpoold node.

    A connection owns a DEALER socket connected to the node's ROUTER, the request ids, the
    last error text and the copy threads its calls use, and holds a reference to the process
    context (process.h), whose ZeroMQ context its socket lives in. It sends requests and waits for
   their replies (kvpc_call), or sends them asking for none (kvpc_send_oneway); it knows nothing of
    keys, batches or the fast path. Everything above it (batch.h, socket_ops.h, fast_path.h,
    memory.h, the public API) works through these functions.

    A connection is used by one thread at a time; the only state another thread touches is
    its count of zero-copy frames, which libzmq's I/O thread decrements (connection.c).
*/
#ifndef KVPC_CONNECTION_H_INCLUDED
#define KVPC_CONNECTION_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "client/device.h"
#include "client/process.h"
#include "kvpool.h"
#include "protocol/kvpool.pb-c.h"
#include "transfer/transfer_pool.h"

typedef struct _kvpc_conn_t kvpc_conn_t;

//  One put value: the concatenation of nparts buffers, size bytes in all.
typedef struct {
    const kvpool_iov_t *parts;
    size_t nparts;
    uint64_t size;
} kvpc_value_t;

//  A received reply: the decoded header and the value frames after it (GET only).
typedef struct {
    Kvpool__V1__Reply *msg;
    zmq_msg_t *frames;
    size_t nframes;
} kvpc_reply_t;

//  CURVE keys of a connection, Z85 text (docs/security.md).
typedef struct {
    char public_key[41]; //  the client's certificate
    char secret_key[41];
    char server_key[41]; //  the node's public key
} kvpc_curve_t;

//  Connects to endpoint and checks that the node answers a PING within connect_timeout_ms;
//  then every call waits up to timeout_ms. On the node's machine the connection moves to the
//  node's ipc endpoint unless keep_endpoint. curve: CURVE keys, or NULL for none. Returns
//  NULL with errno set on failure (ENOMEM, a bad endpoint, ECONNREFUSED: nothing listens
//  there, every attempt refused for 500 ms or until connect_timeout_ms, EHOSTUNREACH and the
//  like: the kernel's reason, ETIMEDOUT: no answer, EPROTO: a bad one, EACCES: the node
//  refused this client's CURVE key, EKEYREJECTED: the CURVE handshake failed otherwise: a
//  wrong server key, or CURVE on one side only), and kvpc_connect_error saying why in words.
//  Caller owns the return value and must destroy it.
kvpc_conn_t *kvpc_conn_new (const char *endpoint, int timeout_ms, int connect_timeout_ms,
                            bool keep_endpoint, const kvpc_curve_t *curve);
//  Why this thread's last kvpc_conn_new failed ("" after one that succeeded); the layers
//  above set it for their own failures with kvpc_set_connect_error.
const char *kvpc_connect_error (void);
void kvpc_set_connect_error (const char *format, ...) __attribute__ ((format (printf, 1, 2)));
//  A connection to another node of the cluster (a client endpoint a GET's REDIRECT named),
//  made on first need with this connection's timeouts and CURVE certificate, the node's own
//  server key (curve_key; NULL or "": this connection's) and kept until this one is destroyed
//  (at most KVPC_MAX_PEERS). NULL when it cannot be made (the last error says why).
kvpc_conn_t *kvpc_conn_peer (kvpc_conn_t *self, const char *endpoint, const char *curve_key);
#define KVPC_MAX_PEERS 64

//  Closes the socket. One-way requests that may still be queued on it are given up to
//  KVPC_CLOSE_WAIT_MS to reach the node (ZMQ_LINGER); nothing waits for a reply. Does nothing on
//  NULL; sets *self_p to NULL.
void kvpc_conn_destroy (kvpc_conn_t **self_p);

//  Sends a PING and records what the node says of itself. Returns 0 or a negative status.
int kvpc_conn_ping (kvpc_conn_t *self);
//  The endpoint the socket is connected to (after a move to the ipc endpoint, that one).
const char *kvpc_conn_endpoint (kvpc_conn_t *self);
//  The owner name this connection mounts segments under.
const char *kvpc_conn_client_id (kvpc_conn_t *self);
//  The node's host id, as its PING said ("" if it did not say).
const char *kvpc_conn_host_id (kvpc_conn_t *self);
//  Whether the node runs on this machine (its host id is this process's kvp_host_id).
bool kvpc_conn_same_host (kvpc_conn_t *self);
//  Starts libzmq's monitor of socket for events (ZMQ_EVENT_*) and returns a PAIR in ctx that
//  receives them, or NULL. Stop it with zmq_socket_monitor (socket, NULL, 0), then close it.
void *kvpc_socket_watch (void *ctx, void *socket, int events);
//  Whether the node is one of a cluster's (PING): a key it does not hold may be elsewhere.
bool kvpc_conn_cluster (kvpc_conn_t *self);
//  How long a call waits for its reply (ms).
int kvpc_conn_timeout_ms (kvpc_conn_t *self);
//  Whether the connection is on the node's ipc endpoint (or in its process), the only places
//  where it serves the shared-memory operations.
bool kvpc_conn_on_local_endpoint (kvpc_conn_t *self);
//  The process context this connection holds a reference to (process.h).
kvpc_process_t *kvpc_conn_process (kvpc_conn_t *self);
//  The ZeroMQ context and the socket, for watching the socket's events (fast_path.c); the
//  socket is NULL while not connected.
void *kvpc_conn_context (kvpc_conn_t *self);
void *kvpc_conn_socket (kvpc_conn_t *self);
//  How many times the socket was replaced (after a send failed or a call timed out with
//  values in flight): replies on a new socket may come from a restarted node.
uint64_t kvpc_conn_generation (kvpc_conn_t *self);
//  The copy threads of this connection's calls: made on first need (batch.h's
//  kvpc_copies_run), stopped with the connection.
transfer_pool_t **kvpc_conn_pool (kvpc_conn_t *self);
//  The device-memory layer of this connection's calls (device.h): made on first need (NULL
//  when out of memory), destroyed with the connection after its last zero-copy frame.
kvpc_device_t *kvpc_conn_device (kvpc_conn_t *self);
//  The same, only while the current call has device buffers (kvpc_device_arm); else NULL.
kvpc_device_t *kvpc_conn_device_armed (kvpc_conn_t *self);
//  While set, the puts of the connection write there, by caller index, the replicas each
//  key got (Reply.replicas_placed; 0 for a key that failed). NULL: nowhere.
void kvpc_conn_set_placed (kvpc_conn_t *self, uint32_t *placed);
uint32_t *kvpc_conn_placed (kvpc_conn_t *self);

//  Sets the last error (printf style); kvpc_conn_last_error returns it ("" if none).
void kvpc_set_error (kvpc_conn_t *self, const char *format, ...)
    __attribute__ ((format (printf, 2, 3)));
void kvpc_clear_error (kvpc_conn_t *self);
const char *kvpc_conn_last_error (kvpc_conn_t *self);
//  The master the node talks to, as its last STATS reply said ("" for none or before one).
void kvpc_conn_set_master_endpoint (kvpc_conn_t *self, const char *endpoint);
const char *kvpc_conn_master_endpoint (kvpc_conn_t *self);

//  Sends request (with one frame per value) and waits up to the connection's timeout for its
//  reply. Returns 0 with *reply filled (free it with kvpc_reply_free), or a negative status:
//  RPC_FAIL on timeout or socket failure, with the last error saying why. The caller may
//  reuse the values' buffers as soon as it returns.
int kvpc_call (kvpc_conn_t *self, Kvpool__V1__Request *request, const kvpc_value_t *values,
               size_t nvalues, size_t expect_frames, kvpc_reply_t *reply);
//  kvpc_call in two halves, for a caller that works on one reply while the node works on its
//  next request (the socket path's gets). Only requests without values. At most one is
//  outstanding, unless kvpc_call_recv_ahead says which other one is (a reply to any other is
//  taken for a stale one and dropped). kvpc_call_send returns 0 or a negative status (the
//  request is then not outstanding); kvpc_call_recv returns as kvpc_call does, request being
//  the one sent.
int kvpc_call_send (kvpc_conn_t *self, Kvpool__V1__Request *request);
int kvpc_call_recv (kvpc_conn_t *self, Kvpool__V1__Request *request, size_t expect_frames,
                    kvpc_reply_t *reply);
//  kvpc_call_recv with a second request outstanding, sent after request (ahead, NULL for
//  none): the node may answer it first (a GET of values in memory before one that reads its
//  disk), and such a reply is kept, for the kvpc_call_recv of ahead that comes next. Two
//  requests outstanding at most.
int kvpc_call_recv_ahead (kvpc_conn_t *self, Kvpool__V1__Request *request, size_t expect_frames,
                          const Kvpool__V1__Request *ahead, size_t ahead_frames,
                          kvpc_reply_t *reply);
//  kvpc_call without values, waiting at most timeout_ms (or the connection's timeout when
//  that is shorter).
int kvpc_call_brief (kvpc_conn_t *self, Kvpool__V1__Request *request, int timeout_ms,
                     kvpc_reply_t *reply);
//  Sends request asking the node for no reply (Request.no_reply) and returns at once.
//  Returns 0 or a negative status.
int kvpc_send_oneway (kvpc_conn_t *self, Kvpool__V1__Request *request);

//  The longest a closing connection spends on what it still has to tell the node: one-way
//  requests still queued when the socket closes (ZMQ_LINGER), the last TOUCH
//  (kvpc_index_report). Only a node that does not answer makes it wait that long.
#define KVPC_CLOSE_WAIT_MS 1000
void kvpc_reply_free (kvpc_reply_t *reply);

//  What kvpc_reply_check requires of a reply to a keyed request.
#define KVPC_NEED_SIZES 1
#define KVPC_NEED_REPLICAS 2
#define KVPC_NEED_FRAMES 4

//  Checks that the reply to a request of nkeys keys carries what need asks for wherever a
//  key succeeded. Returns 0, or PROTOCOL_ERROR with the last error set.
int kvpc_reply_check (kvpc_conn_t *self, kvpc_reply_t *reply, size_t nkeys, int need);
//  The outcome of key j: its own status, or the request's when the reply has none per key.
int kvpc_reply_key_status (kvpc_reply_t *reply, size_t j);

#endif
