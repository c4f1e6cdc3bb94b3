/*  fast_path.h - libkvpool's same-machine path: values copied straight between the caller's
    buffers and the node's shared-memory segments (fast_path.c says how). Above
    connection.h, batch.h, sink.h and segment_view.h: it sends its own requests (PUT_START,
    PUT_END, PUT_REVOKE, GET_REPLICA_LIST, RELEASE, TOUCH, SEGMENTS) through the connection,
    and hands the keys it cannot serve back to its caller (the resolver for gets, the public
    API for puts), never to the socket operations.
*/
#ifndef KVPC_FAST_PATH_H_INCLUDED
#define KVPC_FAST_PATH_H_INCLUDED

#include <stdbool.h>

#include "client/batch.h"
#include "client/connection.h"
#include "client/sink.h"

typedef struct _kvpc_fast_path_t kvpc_fast_path_t;

//  The fast path of conn, off (nothing mapped) until kvpc_fast_path_open. Returns NULL when
//  out of memory. Caller owns the return value and must destroy it (before conn).
kvpc_fast_path_t *kvpc_fast_path_new (kvpc_conn_t *conn);
//  Closes it and frees it. Does nothing on NULL; sets *self_p to NULL.
void kvpc_fast_path_destroy (kvpc_fast_path_t **self_p);
//  Lists the node's segments and maps every one. Returns 0 (fast path on) or -1 (off,
//  nothing mapped).
int kvpc_fast_path_open (kvpc_fast_path_t *self);
//  Unmaps everything; the fast path is off.
void kvpc_fast_path_close (kvpc_fast_path_t *self);
bool kvpc_fast_path_on (kvpc_fast_path_t *self);
//  Whether reads may be served from the node's read index (on when made). Returns true if
//  reads now use it (enabled, the fast path on, the index mapped).
bool kvpc_fast_path_use_index (kvpc_fast_path_t *self, bool enabled);

//  Puts and gets with the fast path on. Keys it cannot serve are added to rest (with their
//  caller index, their results left to whoever serves them): the caller sends them to the
//  node. Arguments as for kvpc_socket_put; a get's sink must take shared memory
//  (kvpc_sink_takes_shared). Each returns the status of the requests it sent (KVPOOL_OK
//  when it needed none).
int kvpc_fast_put (kvpc_fast_path_t *self, const kvpc_keys_t *keys, const kvpc_value_t *values,
                   const kvpool_put_options_t *opts, int64_t *results, kvpc_keys_t *rest);
int kvpc_fast_get (kvpc_fast_path_t *self, const kvpc_keys_t *keys, const kvpc_sink_t *sink,
                   int64_t *results, kvpc_keys_t *rest);
//  Answers EXIST (as_size false: 1) or GET_SIZE (as_size true: the size) for the keys the
//  same-machine index holds, and (0, or OBJECT_NOT_FOUND) for those it vouches are absent
//  (shm_index.h); adds the others, with their caller index, to rest (empty on entry).
void kvpc_index_probe (kvpc_fast_path_t *self, const kvpc_keys_t *keys, bool as_size,
                       int64_t *results, kvpc_keys_t *rest);
//  The same for a caller's arrays, sending nothing (for kvpool_exist_batch_local): each
//  keys[i] (lens[i] bytes, not NULL, not empty) the index holds gets its result in exists
//  (1) or, when exists is NULL, in sizes (the size), and one it vouches is absent 0 or
//  OBJECT_NOT_FOUND; one whose byte at its length is not a
//  NUL gets INVALID_KEY. The positions of the others go to rest, in order; returns their
//  count (all n after a change of connection not yet acted on).
size_t kvpc_index_answer (kvpc_fast_path_t *self, size_t n, const char *const *keys,
                          const size_t *lens, int *exists, int64_t *sizes, size_t *rest);
//  Reports the values read from the index that no TOUCH has carried yet (at close).
void kvpc_index_report (kvpc_fast_path_t *self);

#endif
