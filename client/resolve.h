/*  resolve.h - libkvpool's read path: where each key of a get is read from. Above the fast
    path, the socket operations and sink.h; every get shape of the public API calls it.

    One order for every key of every shape: the same-machine read index and the node's
    segments (the fast path, when it is on and the sink takes shared memory), else the node
    over the socket, else the nodes the node names as holders (REDIRECT), else the node again,
    relaying. The shapes only choose the sink: where the bytes land (sink.h).
*/
#ifndef KVPC_RESOLVE_H_INCLUDED
#define KVPC_RESOLVE_H_INCLUDED

#include "client/batch.h"
#include "client/connection.h"
#include "client/fast_path.h"
#include "client/local_hot_cache.h"
#include "client/sink.h"

//  Gets keys (valid ones, batch.h) into sink; results[i] is the size landed or the key's
//  status. fast_path: the connection's, or NULL. Returns the status of the first source
//  asked: the fast path's when it served the call, else the node's.
//  hot_cache: the process's hot cache the connection uses, or NULL; consulted only while
//  the fast path is off.
int kvpc_resolve_get (kvpc_conn_t *conn, kvpc_fast_path_t *fast_path, kvpc_hot_cache_t *hot_cache,
                      const kvpc_keys_t *keys, const kvpc_sink_t *sink, int64_t *results);

#endif
