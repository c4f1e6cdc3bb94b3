/*  socket_ops.h - every operation of include/kvpool.h as requests over the connection's
    socket, values included. Above connection.h, batch.h and sink.h; used by the public API
    and the read resolver (resolve.h), never by the fast path: what one layer cannot serve,
    the layer above hands to another.

    Keyed operations take the keys that passed validation (kvpc_keys_t) and store one outcome
    per caller index in results; they return the request's status (0 when answered, the
    failure of the request as a whole otherwise, then stored for every key too).
*/
#ifndef KVPC_SOCKET_OPS_H_INCLUDED
#define KVPC_SOCKET_OPS_H_INCLUDED

#include "client/batch.h"
#include "client/connection.h"
#include "client/sink.h"

//  How a keyed request's per-key status becomes the caller's outcome: the status itself,
//  1 / 0 for EXIST (found / not found), or the size for GET_SIZE.
typedef enum { KVPC_AS_STATUS, KVPC_AS_EXIST, KVPC_AS_SIZE } kvpc_outcome_t;

//  One request of op (EXIST, GET_SIZE, REMOVE, PUT_END, PUT_REVOKE, RELEASE) for keys.
int kvpc_socket_keys (kvpc_conn_t *conn, Kvpool__V1__Op op, const kvpc_keys_t *keys, bool force,
                      kvpc_outcome_t as, int64_t *results);
//  EXIST of keys, each about one version only (versions[j] for keys' j-th): results[i] is 1
//  when the node holds that version of the key, 0 when not (another version, or none).
int kvpc_socket_exist_versions (kvpc_conn_t *conn, const kvpc_keys_t *keys, uint64_t *versions,
                                int64_t *results);
//  A request without keys answered with a count (REMOVE_BY_REGEX, REMOVE_ALL, RESET).
//  Returns the count or a negative status; *kept (may be NULL): the reply's kept count
//  (REMOVE_BY_REGEX: objects that matched and were kept by a lease).
int64_t kvpc_socket_count (kvpc_conn_t *conn, Kvpool__V1__Request *request, uint64_t *kept);

//  PUT (or UPSERT) of keys' values (values indexed by caller index), in requests of bounded
//  size.
int kvpc_socket_put (kvpc_conn_t *conn, Kvpool__V1__Op op, const kvpc_keys_t *keys,
                     const kvpc_value_t *values, const kvpool_put_options_t *opts,
                     int64_t *results);
//  The holders a REDIRECT named for one key: client endpoints (and their CURVE keys, NULL
//  when none was named) in the order the node named them.
typedef struct {
    char *endpoint[KVPOOL_MAX_REPLICAS];
    char *curve_key[KVPOOL_MAX_REPLICAS];
    size_t count;
    uint64_t version; //  the version the node named (0: none): the holders read only that one
} kvpc_holders_t;

//  The keys a GET's node sent elsewhere, each with its holders (holders[j] for keys' j-th).
typedef struct {
    kvpc_keys_t keys;
    kvpc_holders_t *holders;
    size_t capacity;
} kvpc_redirects_t;

void kvpc_redirects_init (kvpc_redirects_t *self);
void kvpc_redirects_fini (kvpc_redirects_t *self);

//  GET of keys, each value landing in sink (sink.h; results[i]: the size landed, or the
//  key's status), in requests of bounded size. verify: check each value against the checksum
//  the node sent (TRANSFER_FAIL when it does not match: a node not ours served it). With
//  redirects, the node may answer REDIRECT for a key another node holds: the key's result is
//  then KVPOOL_REDIRECT and it is added, with its holders, to redirects; nothing here follows
//  them (the resolver does, resolve.h). Without, the node relays every value itself.
int kvpc_socket_get (kvpc_conn_t *conn, const kvpc_keys_t *keys, const kvpc_sink_t *sink,
                     bool verify, kvpc_redirects_t *redirects, int64_t *results);

//  PUT_START of keys[0..n) with their sizes, and GET_REPLICA_LIST (with pin or without):
//  every placement is filled, invalid keys with INVALID_KEY.
int kvpc_socket_put_start (kvpc_conn_t *conn, size_t n, const char *const *keys,
                           const uint64_t *sizes, const kvpool_put_options_t *opts,
                           kvpool_placement_t *placements);
int kvpc_socket_replica_list (kvpc_conn_t *conn, size_t n, const char *const *keys, bool pin,
                              kvpool_placement_t *placements);
//  Stores status in every placement, clearing the rest of it.
void kvpc_placements_fill (kvpool_placement_t *placements, size_t n, int status);

//  SEGMENTS: up to capacity segments; returns how many the node has, or a negative status.
int kvpc_socket_segments (kvpc_conn_t *conn, kvpool_segment_t *segments, size_t capacity);
//  NODES (key NULL) or LOCATE of one key: up to capacity nodes; returns how many, or a
//  negative status.
int kvpc_socket_nodes (kvpc_conn_t *conn, const char *key, uint64_t *size_p, kvpool_node_t *nodes,
                       size_t capacity);
//  MOUNT_SEGMENT owned by this connection, UNMOUNT_SEGMENT.
int kvpc_socket_mount (kvpc_conn_t *conn, const char *shm_name, uint64_t size, uint32_t *id_p);
int kvpc_socket_unmount (kvpc_conn_t *conn, uint32_t id);
//  CONFIG: the setting's value into out, changed to value first when value is not NULL.
//  DRAIN of node_id (action "start", "stop" or NULL), the master's answer in *state.
int kvpc_socket_drain (kvpc_conn_t *conn, const char *node_id, const char *action,
                       kvpool_drain_t *state);
int kvpc_socket_config (kvpc_conn_t *conn, const char *name, const char *value, char *out,
                        size_t size);

//  STATS: the node's figures, and up to max of its per-operation counters into ops
//  (*count: how many it sent; ops may be NULL when max is 0).
int kvpc_socket_stats (kvpc_conn_t *conn, kvpool_stats_t *stats, kvpool_op_stats_t *ops, size_t max,
                       size_t *count);

#endif
