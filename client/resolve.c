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

    With the process's hot cache (local_hot_cache.h: a client whose node is on another
    machine, so only while the fast path is off), a step comes before 2: the keys it keeps
    are asked of the node in one EXIST that names each kept version; those the node still
    holds at that version land from the cache, the others are dropped from it and go on to
    2 with the rest. After 2 to 4, each key read whole is offered to the cache with the
    version its reply named (a copy is kept when the read admits it).

    Results: a key's result is final once a source lands it or answers anything but what
    sends it on; KVPOOL_REDIRECT marks a key still on its way between 3 and 4.

    Threads: the caller's (a connection's).
*/
#include "client/resolve.h"

#include <stdlib.h>
#include <string.h>

#include "client/socket_ops.h"

#include <zmq.h>

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
    //  Each key's version as the node named it, by caller index: the holders read only that
    //  one (a holder fenced since, or holding another, says not found: the next is tried).
    size_t top = 0;
    for (size_t j = 0; j < keys->count; j++)
        if (keys->index[j] + 1 > top)
            top = keys->index[j] + 1;
    uint64_t *expect = calloc (top ? top : 1, sizeof *expect);
    for (size_t j = 0; expect && j < keys->count; j++)
        expect[keys->index[j]] = redirects->holders[j].version;
    kvpc_sink_t hop = *sink;
    hop.expect = expect;
    while (tried && members && expect) {
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
            kvpc_socket_get (peer, &batch, &hop, true, NULL, results);
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
    free (expect);
    kvpc_keys_t again;
    kvpc_keys_init (&again);
    for (size_t j = 0; j < keys->count; j++)
        if (results[keys->index[j]] == KVPOOL_REDIRECT && kvpc_keys_add_from (&again, keys, j))
            results[keys->index[j]] = KVPOOL_INTERNAL_ERROR;
    if (again.count)
        kvpc_socket_get (conn, &again, sink, false, NULL, results);
    kvpc_keys_fini (&again);
}

//  Steps 2 to 4: the node, and the holders it names.
static int
s_from_node (kvpc_conn_t *conn, const kvpc_keys_t *ask, const kvpc_sink_t *sink, int64_t *results)
{
    bool redirect = kvpc_sink_takes_redirect (sink) && !kvpc_conn_device_armed (conn);
    kvpc_redirects_t redirects;
    kvpc_redirects_init (&redirects);
    int rc = kvpc_socket_get (conn, ask, sink, false, redirect ? &redirects : NULL, results);
    if (redirects.keys.count)
        s_follow (conn, &redirects, sink, results);
    kvpc_redirects_fini (&redirects);
    return rc;
}

//  Lands key i's range of a kept value (the whole of it without offsets) from entry, whose
//  reference the caller hands over: to a frame over the entry's bytes that holds it (moved
//  out to a frames sink, else *frame kept open until the copies ran; *made says whether
//  *frame was made). Returns the size landed or a status.
static int64_t
s_land_kept (const kvpc_sink_t *sink, size_t i, kvpc_hot_entry_t *entry, zmq_msg_t *frame,
             bool *made, kvpc_copies_t *copies)
{
    *made = false;
    const char *data = kvpc_hot_entry_data (entry);
    size_t size = kvpc_hot_entry_size (entry);
    if (sink->offsets) {
        uint64_t offset = sink->offsets[i];
        if (offset > size) {
            kvpc_hot_entry_unref (entry);
            return KVPOOL_INVALID_PARAMS;
        }
        uint64_t room = kvpc_sink_bytes (sink, i);
        data += offset;
        size = size - offset < room ? size - offset : (size_t) room;
    }
    if (zmq_msg_init_data (frame, (void *) data, size, kvpc_hot_entry_msg_free, entry)) {
        kvpc_hot_entry_unref (entry);
        return KVPOOL_INTERNAL_ERROR;
    }
    *made = true;
    return kvpc_sink_land (sink, i, frame, copies);
}

//  Every get while the process's hot cache is in use: the kept keys validated and served
//  from it, the rest from the node (2 to 4), each offered to the cache.
static int
s_resolve_cached (kvpc_conn_t *conn, kvpc_hot_cache_t *cache, const kvpc_keys_t *keys,
                  const kvpc_sink_t *sink, int64_t *results)
{
    size_t n = 0; //  caller indexes 0 .. n - 1
    for (size_t j = 0; j < keys->count; j++)
        if (keys->index[j] >= n)
            n = keys->index[j] + 1;
    size_t count = keys->count;
    kvpc_hot_entry_t **kept = calloc (count, sizeof *kept);
    uint64_t *kept_versions = malloc (count * sizeof *kept_versions);
    uint64_t *versions = calloc (n, sizeof *versions);
    zmq_msg_t *frames = malloc (count * sizeof *frames);
    size_t *served = malloc (count * sizeof *served); //  caller indexes landed from the cache
    if (!kept || !kept_versions || !versions || !frames || !served) {
        free (kept);
        free (kept_versions);
        free (versions);
        free (frames);
        free (served);
        return s_from_node (conn, keys, sink, results);
    }
    kvpc_keys_t asked, rest;
    kvpc_keys_init (&asked);
    kvpc_keys_init (&rest);
    int rc = KVPOOL_OK;
    for (size_t j = 0; j < count && rc == KVPOOL_OK; j++) {
        kept[j] = kvpc_hot_cache_lookup (cache, keys->keys[j], keys->wire[j].len);
        if (kept[j]) {
            kept_versions[asked.count] = kvpc_hot_entry_version (kept[j]);
            if (kvpc_keys_add_from (&asked, keys, j))
                rc = KVPOOL_INTERNAL_ERROR;
        }
    }
    //  One EXIST for every kept key, each about its kept version only. A failed EXIST
    //  leaves its keys to the node's GET (which fails too, or serves them).
    if (rc == KVPOOL_OK && asked.count)
        kvpc_socket_exist_versions (conn, &asked, kept_versions, results);
    kvpc_copies_t copies;
    kvpc_copies_init (&copies);
    size_t nframes = 0, nserved = 0;
    for (size_t j = 0; j < count && rc == KVPOOL_OK; j++) {
        size_t i = keys->index[j];
        kvpc_hot_entry_t *entry = kept[j];
        kept[j] = NULL;
        if (entry && results[i] == 1) {
            kvpc_hot_cache_served (cache, entry);
            bool made;
            results[i] = s_land_kept (sink, i, entry, &frames[nframes], &made, &copies);
            nframes += made;
            served[nserved++] = i;
            continue;
        }
        if (entry && results[i] == 0)
            kvpc_hot_cache_invalidate (cache, entry);
        kvpc_hot_entry_unref (entry);
        if (kvpc_keys_add_from (&rest, keys, j))
            rc = KVPOOL_INTERNAL_ERROR;
    }
    if (kvpc_copies_run (conn, &copies))
        //  A device copy failed (the last error says why).
        for (size_t s = 0; s < nserved; s++)
            if (results[served[s]] > 0)
                results[served[s]] = KVPOOL_INVALID_PARAMS;
    kvpc_copies_fini (&copies);
    for (size_t f = 0; f < nframes; f++)
        zmq_msg_close (&frames[f]);
    for (size_t j = 0; j < count; j++)
        kvpc_hot_entry_unref (kept[j]);
    if (rc != KVPOOL_OK) {
        //  Out of memory before the rest could be listed: every key from the node.
        kvpc_keys_fini (&rest);
        kvpc_keys_fini (&asked);
        free (kept);
        free (kept_versions);
        free (versions);
        free (frames);
        free (served);
        return s_from_node (conn, keys, sink, results);
    }
    //  The rest from the node, each key's version noted as it lands.
    kvpc_sink_t noted = *sink;
    noted.versions = versions;
    if (rest.count)
        rc = s_from_node (conn, &rest, &noted, results);
    //  Values of device memory are not read back here: they are never offered.
    bool host = sink->kind != KVPC_SINK_BUFFERS || !kvpc_conn_device_armed (conn);
    void *scratch = NULL;
    size_t scratch_size = 0;
    for (size_t j = 0; j < rest.count; j++) {
        size_t i = rest.index[j];
        if (results[i] < 0) {
            kvpc_hot_cache_missed (cache);
            continue;
        }
        size_t size = (size_t) results[i];
        const void *data = NULL;
        if (host && !sink->offsets) {
            if (sink->kind == KVPC_SINK_BUFFERS && size > scratch_size) {
                free (scratch);
                scratch = malloc (size ? size : 1);
                scratch_size = scratch ? size : 0;
            }
            data = kvpc_sink_landed (sink, i, size, scratch);
        }
        kvpc_hot_cache_offer (cache, rest.keys[j], rest.wire[j].len, data ? versions[i] : 0, data,
                              size);
    }
    free (scratch);
    kvpc_keys_fini (&rest);
    kvpc_keys_fini (&asked);
    free (kept);
    free (kept_versions);
    free (versions);
    free (frames);
    free (served);
    return rc;
}

int
kvpc_resolve_get (kvpc_conn_t *conn, kvpc_fast_path_t *fast_path, kvpc_hot_cache_t *hot_cache,
                  const kvpc_keys_t *keys, const kvpc_sink_t *sink, int64_t *results)
{
    if (keys->count == 0)
        return KVPOOL_OK;
    //  The process's hot cache, off the node's machine only.
    if (hot_cache && !(fast_path && kvpc_fast_path_on (fast_path)))
        return s_resolve_cached (conn, hot_cache, keys, sink, results);
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
        int node_rc = s_from_node (conn, ask, sink, results);
        if (!fast)
            rc = node_rc;
    }
    kvpc_keys_fini (&rest);
    return rc;
}
