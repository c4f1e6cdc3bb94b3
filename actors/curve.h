/*  curve.h - CURVE authentication and encryption of kvpoold's ZeroMQ sockets.

    A node (or master) has one certificate (--curve-secret, CZMQ's zcert format) and a
    directory of the public certificates it admits (--curve-allow): clients, the other nodes
    and the master. CZMQ's zauth answers libzmq's ZAP requests from that directory, and reads
    it again when it changes, so a key is admitted or revoked without a restart.

    Every socket another process reaches is a CURVE server with the node's certificate: the
    client ROUTER (tcp and ipc; inproc never runs a handshake), the data plane, the
    lookup/reset admin ROUTER, the master's ROUTER and the KV-events PUB and replay ROUTER.
    Sockets the node connects to other processes with (the master, other nodes' data planes)
    are CURVE clients with the same certificate, and the server key of the process they reach:
    a node's key comes from the master with its endpoints; the master's from --curve-master,
    or this node's own when the cluster shares one certificate.

    Without CURVE every function here does nothing, so actors call them unconditionally.
*/
#ifndef KVP_CURVE_H_INCLUDED
#define KVP_CURVE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

#include <czmq.h>

typedef struct _kvp_curve_t kvp_curve_t;

//  Loads the certificate (its secret key), and the master's public key if master_file is
//  set, and starts the ZAP handler admitting the public certificates in allow_dir. Returns
//  NULL with the reason in why when a file cannot be read or holds no key.
kvp_curve_t *kvp_curve_new (const char *secret_file, const char *allow_dir, const char *master_file,
                            char *why, size_t why_size);

//  Stops the ZAP handler and forgets the keys.
void kvp_curve_destroy (kvp_curve_t **self_p);

//  Stops the ZAP handler alone, at the end of a process whose threads may still read the
//  keys (nothing ThreadSanitizer sees orders their last reads before a free).
void kvp_curve_stop (kvp_curve_t *self);

//  Makes sock a CURVE server with the node's certificate (before it binds). NULL: nothing.
void kvp_curve_server (const kvp_curve_t *self, zsock_t *sock);

//  Makes sock a CURVE client with the node's certificate, of the server whose public key is
//  server_key (Z85); NULL or "" means this node's own key (a cluster sharing one
//  certificate). Before it connects. self NULL: nothing.
void kvp_curve_client (const kvp_curve_t *self, zsock_t *sock, const char *server_key);

//  The node's public key (Z85, 40 characters), or "" without CURVE.
const char *kvp_curve_public_key (const kvp_curve_t *self);

//  The master's public key: --curve-master's, or the node's own. "" without CURVE.
const char *kvp_curve_master_key (const kvp_curve_t *self);

void kvp_curve_test (bool verbose);

#endif
