/*  resolve.c - the read path of every get (resolve.h).

    A key is looked for in order, and each source hands back what it could not serve:

      1. the same machine   the fast path (fast_path.c): the node's read index, then a pinned
                            replica list, copying from the node's segments. Only for sinks
                            that take shared memory (whole values into caller buffers); it
                            hands back keys on segments it cannot map, on the node's disk,
                            or not found on a node of a cluster.
      2. the node           one GET over the socket (socket_ops.c), landing in the sink. A
                            node of a cluster may answer REDIRECT for a value other nodes
                            hold, naming them; asked only for whole values and never with
                            device buffers (their copies run on this connection's device
                            layer, which a peer's connection does not share).
      3. the holders        one GET per holder (the connections to them are this one's peers,
                            kvpc_conn_peer), without redirect, each value checked against its
                            checksum; keys are tried at their next holder while one is left
                            and the last said not found, failed, or sent bytes that did not
                            verify.
      4. the node, again    what no holder served, asked without redirect: the node relays.

    Results: a key's result is final once a source lands it or answers anything but what
    sends it on; KVPOOL_REDIRECT marks a key still on its way between 3 and 4.

    Threads: the caller's (a connection's).
*/
#include "client/resolve.h"

#include <stdlib.h>
#include <string.h>

#include "client/socket_ops.h"

//  Whether a holder's answer for a key sends it on to the next holder.
static bool
s_try_next (int64_t result)
{
    return result == KVPOOL_OBJECT_NOT_FOUND || result == KVPOOL_RPC_FAIL
           || result == KVPOOL_TRANSFER_FAIL || result == KVPOOL_REDIRECT;
}

//  Steps 3 and 4 for the keys of redirects (results KVPOOL_REDIRECT): the holders, one
//  request a holder, in the order each key's reply named them; then the node, relaying.
static void
s_follow (kvpc_conn_t *conn, kvpc_redirects_t *redirects, const kvpc_sink_t *sink, int64_t *results)
{
    const kvpc_keys_t *keys = &redirects->keys;
    size_t *tried = calloc (keys->count ? keys->count : 1, sizeof *tried);
    size_t *members = malloc ((keys->count ? keys->count : 1) * sizeof *members);
    while (tried && members) {
        //  The next holder of the first key still on its way, and every key whose next
        //  holder is the same node.
        const char *endpoint = NULL, *curve_key = NULL;
        for (size_t j = 0; j < keys->count && !endpoint; j++)
            if (results[keys->index[j]] == KVPOOL_REDIRECT
                && tried[j] < redirects->holders[j].count) {
                endpoint = redirects->holders[j].endpoint[tried[j]];
                curve_key = redirects->holders[j].curve_key[tried[j]];
            }
        if (!endpoint)
            break;
        kvpc_keys_t batch;
        kvpc_keys_init (&batch);
        size_t count = 0;
        for (size_t j = 0; j < keys->count; j++) {
            const kvpc_holders_t *holders = &redirects->holders[j];
            if (results[keys->index[j]] == KVPOOL_REDIRECT && tried[j] < holders->count
                && strcmp (holders->endpoint[tried[j]], endpoint) == 0
                && kvpc_keys_add_from (&batch, keys, j) == 0)
                members[count++] = j;
        }
        kvpc_conn_t *peer = kvpc_conn_peer (conn, endpoint, curve_key);
        if (peer)
            kvpc_socket_get (peer, &batch, sink, true, NULL, results);
        for (size_t m = 0; m < count; m++) {
            size_t j = members[m];
            int64_t *result = &results[keys->index[j]];
            tried[j]++;
            if (!peer || s_try_next (*result))
                *result = KVPOOL_REDIRECT;
        }
        kvpc_keys_fini (&batch);
        if (count == 0)
            break; //  out of memory: what is left goes to the node below
    }
    free (tried);
    free (members);
    kvpc_keys_t again;
    kvpc_keys_init (&again);
    for (size_t j = 0; j < keys->count; j++)
        if (results[keys->index[j]] == KVPOOL_REDIRECT && kvpc_keys_add_from (&again, keys, j))
            results[keys->index[j]] = KVPOOL_INTERNAL_ERROR;
    if (again.count)
        kvpc_socket_get (conn, &again, sink, false, NULL, results);
    kvpc_keys_fini (&again);
}

int
kvpc_resolve_get (kvpc_conn_t *conn, kvpc_fast_path_t *fast_path, const kvpc_keys_t *keys,
                  const kvpc_sink_t *sink, int64_t *results)
{
    if (keys->count == 0)
        return KVPOOL_OK;
    //  1. The same machine.
    const kvpc_keys_t *ask = keys;
    kvpc_keys_t rest;
    kvpc_keys_init (&rest);
    bool fast = fast_path && kvpc_fast_path_on (fast_path) && kvpc_sink_takes_shared (sink);
    int rc = KVPOOL_OK;
    if (fast) {
        rc = kvpc_fast_get (fast_path, keys, sink, results, &rest);
        ask = &rest;
    }
    //  2. The node, and 3, 4 for what it sends elsewhere.
    if (ask->count) {
        bool redirect = kvpc_sink_takes_redirect (sink) && !kvpc_conn_device_armed (conn);
        kvpc_redirects_t redirects;
        kvpc_redirects_init (&redirects);
        int node_rc =
            kvpc_socket_get (conn, ask, sink, false, redirect ? &redirects : NULL, results);
        if (!fast)
            rc = node_rc;
        if (redirects.keys.count)
            s_follow (conn, &redirects, sink, results);
        kvpc_redirects_fini (&redirects);
    }
    kvpc_keys_fini (&rest);
    return rc;
}
