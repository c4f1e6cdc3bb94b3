/*  socket_ops.h - every operation of include/kvpool.h as requests over the connection's
    socket, values included. Above connection.h and batch.h; used by the public API, and by
    the fast path for the keys it cannot serve itself.

    Keyed operations take the keys that passed validation (kvpc_keys_t) and store one outcome
    per caller index in results; they return the request's status (0 when answered, the
    failure of the request as a whole otherwise, then stored for every key too).
*/
#ifndef KVPC_SOCKET_OPS_H_INCLUDED
#define KVPC_SOCKET_OPS_H_INCLUDED

#include "client/batch.h"
#include "client/connection.h"

//  How a keyed request's per-key status becomes the caller's outcome: the status itself,
//  1 / 0 for EXIST (found / not found), or the size for GET_SIZE.
typedef enum { KVPC_AS_STATUS, KVPC_AS_EXIST, KVPC_AS_SIZE } kvpc_outcome_t;

//  One request of op (EXIST, GET_SIZE, REMOVE, PUT_END, PUT_REVOKE, RELEASE) for keys.
int kvpc_socket_keys (kvpc_conn_t *conn, Kvpool__V1__Op op, const kvpc_keys_t *keys, bool force,
                      kvpc_outcome_t as, int64_t *results);
//  A request without keys answered with a count (REMOVE_BY_REGEX, REMOVE_ALL, RESET).
//  Returns the count or a negative status.
int64_t kvpc_socket_count (kvpc_conn_t *conn, Kvpool__V1__Request *request);

//  PUT (or UPSERT) of keys' values (values indexed by caller index), in requests of bounded
//  size.
int kvpc_socket_put (kvpc_conn_t *conn, Kvpool__V1__Op op, const kvpc_keys_t *keys,
                     const kvpc_value_t *values, const kvpool_put_options_t *opts,
                     int64_t *results);
//  GET of keys into the caller's buffers (bufs and nbufs indexed by caller index), in
//  requests of bounded size; results[i] is the size written. With offsets (by caller index;
//  NULL: whole values) each key's range from its offset, as much as its buffers hold.
int kvpc_socket_get_into (kvpc_conn_t *conn, const kvpc_keys_t *keys,
                          const kvpool_buf_t *const *bufs, const size_t *nbufs,
                          const uint64_t *offsets, int64_t *results);
//  GET of one valid key into a buffer allocated with malloc (caller owns *data_p).
int kvpc_socket_get (kvpc_conn_t *conn, const char *key, void **data_p, size_t *size_p);
//  GET of keys, each value's frame moved as received into frames[i] (initialised by the
//  caller; left empty where the key failed).
int kvpc_socket_get_frames (kvpc_conn_t *conn, const kvpc_keys_t *keys, zmq_msg_t *frames,
                            int64_t *results);

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
int kvpc_socket_config (kvpc_conn_t *conn, const char *name, const char *value, char *out,
                        size_t size);

//  STATS: the node's figures, and up to max of its per-operation counters into ops
//  (*count: how many it sent; ops may be NULL when max is 0).
int kvpc_socket_stats (kvpc_conn_t *conn, kvpool_stats_t *stats, kvpool_op_stats_t *ops, size_t max,
                       size_t *count);

#endif
