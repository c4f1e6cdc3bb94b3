/*  curve.h - who may connect to kvpoold's ZeroMQ sockets: CURVE for clients, and the
    cluster's own credential for nodes and the master.

    Client doors (the client ROUTER, tcp and ipc; the lookup/reset admin ROUTER; the
    KV-events PUB and replay ROUTER) run CURVE with the node's certificate (--curve-secret)
    and admit the public certificates in --curve-allow; without CURVE they bind loopback only.

    Inner doors (the master's ROUTER, every node's data plane) admit only the cluster's nodes
    and master: with CURVE, the certificates in --curve-nodes (never a client's); without,
    whoever proves the cluster key (--cluster-key, mode 0600; by default
    ~/.config/kvpool/cluster.key, made on first use). The sockets a node connects to the
    master and to other nodes' data planes prove the same credential.

    The ZAP handler (curve.c) reads both directories again when they change, so a key is
    admitted or revoked without a restart; key_watch.h closes a revoked key's connections
    that were open already. In role all without CURVE nothing here is needed
    and every function does nothing, so actors call them unconditionally.
*/
#ifndef KVP_CURVE_H_INCLUDED
#define KVP_CURVE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

#include <czmq.h>

typedef struct _kvp_curve_t kvp_curve_t;

//  ZAP domains: which door a handshake is for.
#define KVP_ZAP_CLIENTS "kvpool"
#define KVP_ZAP_CLUSTER "kvpool-cluster"
//  The longest User-Id a connection gets: a CURVE key (40), or "kvpool-node/<node id>".
#define KVP_USER_ID_MAX 240
//  The User-Id of a node that proved the cluster key, before the id it said with it.
#define KVP_NODE_USER_PREFIX "kvpool-node/"

typedef struct {
    const char *secret_file;      //  --curve-secret; NULL: no CURVE
    const char *allow_dir;        //  --curve-allow: clients
    const char *nodes_dir;        //  --curve-nodes: nodes and the master (cluster, CURVE)
    const char *master_file;      //  --curve-master (role node); NULL: our own key
    const char *cluster_key_file; //  --cluster-key (cluster without CURVE); NULL: the default
    bool cluster;                 //  role master or node: the inner doors exist
} kvp_trust_args_t;

//  Loads the credentials and starts the ZAP handler. Returns NULL with the reason in why
//  when a file cannot be read, holds no key, or (the cluster key) is readable by others.
kvp_curve_t *kvp_curve_new (const kvp_trust_args_t *args, char *why, size_t why_size);

//  Stops the ZAP handler and forgets the keys.
void kvp_curve_destroy (kvp_curve_t **self_p);

//  Stops the ZAP handler alone, at the end of a process whose threads may still read the
//  keys (nothing ThreadSanitizer sees orders their last reads before a free).
void kvp_curve_stop (kvp_curve_t *self);

//  The node's id, which it says with the cluster key (its connections' User-Id is then
//  "kvpool-node/<id>"). Before the actors that connect start.
void kvp_curve_set_node (kvp_curve_t *self, const char *node_id);

//  Whether CURVE is on.
bool kvp_curve_on (const kvp_curve_t *self);

//  Makes sock a client door: a CURVE server with the node's certificate admitting
//  --curve-allow (before it binds). Without CURVE: nothing.
void kvp_curve_server (const kvp_curve_t *self, zsock_t *sock);

//  Makes sock an inner door (the master's ROUTER, a data plane): CURVE admitting
//  --curve-nodes, or PLAIN admitting the cluster key. Before it binds.
void kvp_curve_cluster_server (const kvp_curve_t *self, zsock_t *sock);

//  Makes sock a client of an inner door with this process's credential: CURVE with the
//  server's public key server_key (Z85; NULL or "" means our own, a cluster sharing one
//  certificate), or PLAIN with the cluster key. Before it connects.
void kvp_curve_cluster_client (const kvp_curve_t *self, zsock_t *sock, const char *server_key);

//  Whether the CURVE key user_id (a message's "User-Id") is still admitted at the door of
//  domain (KVP_ZAP_CLIENTS or KVP_ZAP_CLUSTER), its directory as it is now. True without
//  CURVE, and for a User-Id that is no CURVE key. Any thread.
bool kvp_curve_admitted (kvp_curve_t *self, const char *domain, const char *user_id);

//  For each of count CURVE keys (Z85), whether it is admitted at the door of domain now:
//  kvp_curve_admitted for many keys, the directory read once (key_watch.h). All true
//  without CURVE. Any thread.
void kvp_curve_admitted_keys (kvp_curve_t *self, const char *domain, const char *const *keys,
                              size_t count, bool *admitted);

//  The directory whose certificates the door of domain admits (--curve-allow or
//  --curve-nodes), or NULL without CURVE or without that door (key_watch.h watches it).
const char *kvp_curve_dir (const kvp_curve_t *self, const char *domain);

//  The node's public key (Z85, 40 characters), or "" without CURVE.
const char *kvp_curve_public_key (const kvp_curve_t *self);

//  The master's public key: --curve-master's, or the node's own. "" without CURVE.
const char *kvp_curve_master_key (const kvp_curve_t *self);

//  The cluster key's file, or NULL when none is used.
const char *kvp_curve_cluster_key_file (const kvp_curve_t *self);

//  The default --cluster-key: ~/.config/kvpool/cluster.key of this user. Returns 0, or -1
//  when there is no home folder.
int kvp_cluster_key_default (char *path, size_t size);

//  Writes a new cluster key (32 random bytes in hex) to file, mode 0600, never over an
//  existing file (making its folders, 0700). Returns 0, or -1 with why.
int kvp_cluster_key_write (const char *file, char *why, size_t why_size);

void kvp_curve_test (bool verbose);

#endif
