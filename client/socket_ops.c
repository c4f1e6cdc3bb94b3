/*  socket_ops.c - the operations of include/kvpool.h over the socket (socket_ops.h).

    Each function builds one kind of request, calls the node through the connection and turns
    the reply into the caller's outcomes, checking first that the reply carries what the
    request needs (kvpc_reply_check): a reply is input, never trusted to have the right
    number of statuses, sizes, replica lists or frames.

    Batches that carry values, puts and gets into caller buffers, are cut into requests of at
    most KVPC_CHUNK_BYTES (batch.h says why), gets from smaller ones up; two of a batch's
    GETs are at the node at once, the next one sent once the first one's values landed. One GET
   serves every get shape: each value received lands in the call's sink (sink.h: the caller's
   buffers, a malloc'd buffer, or the frame itself, moved out). A key the node sends elsewhere
   (REDIRECT) is reported with its holders, not followed: the resolver (resolve.c) decides where to
   read it next.
*/
#include "client/socket_ops.h"
#include "transfer/value_checksum.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

//  Sends a request that carries no keys; returns its status (*reply_p kept only on success
//  when reply_p is not NULL).
static int
s_simple_call (kvpc_conn_t *conn, Kvpool__V1__Request *request, kvpc_reply_t *reply_p)
{
    kvpc_reply_t reply;
    int rc = kvpc_call (conn, request, NULL, 0, 0, &reply);
    if (rc)
        return rc;
    rc = reply.msg->status;
    if (rc == KVPOOL_OK && reply_p)
        *reply_p = reply;
    else
        kvpc_reply_free (&reply);
    return rc;
}

//  ---- keyed requests without values ------------------------------------------------------

//  One request of op for keys, about versions[j] of key j when versions is not NULL.
static int
s_keys_request (kvpc_conn_t *conn, Kvpool__V1__Op op, const kvpc_keys_t *keys, bool force,
                uint64_t *versions, kvpc_outcome_t as, int64_t *results)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = op;
    request.n_keys = keys->count;
    request.keys = keys->wire;
    request.force = force;
    if (versions) {
        request.n_versions = keys->count;
        request.versions = versions;
    }
    kvpc_reply_t reply;
    int rc = kvpc_call (conn, &request, NULL, 0, 0, &reply);
    if (rc == 0) {
        rc = kvpc_reply_check (conn, &reply, keys->count, as == KVPC_AS_SIZE ? KVPC_NEED_SIZES : 0);
        if (rc)
            kvpc_reply_free (&reply);
    }
    if (rc) {
        kvpc_fill (keys, results, rc);
        return rc;
    }
    for (size_t j = 0; j < keys->count; j++) {
        int status = kvpc_reply_key_status (&reply, j);
        int64_t outcome = status;
        if (as == KVPC_AS_EXIST)
            outcome = status == KVPOOL_OK ? 1 : status == KVPOOL_OBJECT_NOT_FOUND ? 0 : status;
        else if (as == KVPC_AS_SIZE && status == KVPOOL_OK)
            outcome = reply.msg->sizes[j] > INT64_MAX ? KVPOOL_PROTOCOL_ERROR
                                                      : (int64_t) reply.msg->sizes[j];
        results[keys->index[j]] = outcome;
    }
    rc = reply.msg->status;
    kvpc_reply_free (&reply);
    return rc;
}

int
kvpc_socket_keys (kvpc_conn_t *conn, Kvpool__V1__Op op, const kvpc_keys_t *keys, bool force,
                  kvpc_outcome_t as, int64_t *results)
{
    return s_keys_request (conn, op, keys, force, NULL, as, results);
}

int
kvpc_socket_exist_versions (kvpc_conn_t *conn, const kvpc_keys_t *keys, uint64_t *versions,
                            int64_t *results)
{
    return s_keys_request (conn, KVPOOL__V1__OP__EXIST, keys, false, versions, KVPC_AS_EXIST,
                           results);
}

int64_t
kvpc_socket_count (kvpc_conn_t *conn, Kvpool__V1__Request *request, uint64_t *kept)
{
    kvpc_reply_t reply;
    int rc = s_simple_call (conn, request, &reply);
    if (rc)
        return rc;
    int64_t count = reply.msg->count > INT64_MAX ? INT64_MAX : (int64_t) reply.msg->count;
    if (kept)
        *kept = reply.msg->kept;
    kvpc_reply_free (&reply);
    return count;
}

//  ---- puts ---------------------------------------------------------------------------------

//  One PUT of keys.
static int
s_put_chunk (kvpc_conn_t *conn, Kvpool__V1__Op op, const kvpc_keys_t *keys,
             const kvpc_value_t *values, const kvpool_put_options_t *opts, int64_t *results)
{
    if (keys->count == 0)
        return KVPOOL_OK;
    kvpc_value_t small[8];
    kvpc_value_t *sent = keys->count <= 8 ? small : malloc (keys->count * sizeof *sent);
    if (!sent) {
        kvpc_fill (keys, results, KVPOOL_INTERNAL_ERROR);
        return KVPOOL_INTERNAL_ERROR;
    }
    for (size_t j = 0; j < keys->count; j++)
        sent[j] = values[keys->index[j]];
    Kvpool__V1__PutOptions put;
    Kvpool__V1__Request request;
    kvpc_put_request (&request, op, keys, opts, &put);
    kvpc_reply_t reply;
    int rc = kvpc_call (conn, &request, sent, keys->count, 0, &reply);
    if (sent != small)
        free (sent);
    if (rc == 0) {
        rc = kvpc_reply_check (conn, &reply, keys->count, 0);
        if (rc)
            kvpc_reply_free (&reply);
    }
    if (rc) {
        kvpc_fill (keys, results, rc);
        return rc;
    }
    for (size_t j = 0; j < keys->count; j++)
        results[keys->index[j]] = kvpc_reply_key_status (&reply, j);
    uint32_t *placed = kvpc_conn_placed (conn);
    for (size_t j = 0; placed && j < keys->count; j++)
        placed[keys->index[j]] =
            j < reply.msg->n_replicas_placed ? reply.msg->replicas_placed[j] : 0;
    rc = reply.msg->status;
    kvpc_reply_free (&reply);
    return rc;
}

static uint64_t
s_value_bytes (const void *arg, size_t index)
{
    return ((const kvpc_value_t *) arg)[index].size;
}

//  ---- puts from device memory --------------------------------------------------------------
//  A call with device buffers (device.h) cannot hand them to libzmq. Each request's values
//  with a device part are copied into one of two pinned frame buffers, in turn, and sent from
//  there without a further copy; the device-to-host copies of request k + 1 are queued before
//  request k is sent, so they run while it is on its way.

//  Whether the value has bytes in device memory.
static bool
s_value_on_device (kvpc_device_t *device, const kvpc_value_t *value)
{
    for (size_t p = 0; p < value->nparts; p++)
        if (value->parts[p].size && kvpc_device_holds (device, value->parts[p].data, NULL))
            return true;
    return false;
}

//  Fills staged[i] for chunk's keys: the value itself, or for a value with device bytes one
//  part in frame slot, where its copies are queued (host parts are copied at once).
static int
s_stage_chunk (kvpc_device_t *device, int slot, const kvpc_keys_t *chunk,
               const kvpc_value_t *values, kvpc_value_t *staged, kvpool_iov_t *parts)
{
    uint64_t bytes = 0;
    for (size_t j = 0; j < chunk->count; j++) {
        size_t i = chunk->index[j];
        staged[i] = values[i];
        if (s_value_on_device (device, &values[i]))
            bytes += values[i].size;
    }
    if (bytes == 0)
        return 0;
    char *frame = bytes <= SIZE_MAX ? kvpc_device_frame (device, slot, (size_t) bytes) : NULL;
    if (!frame)
        return -1;
    char *to = frame;
    for (size_t j = 0; j < chunk->count; j++) {
        size_t i = chunk->index[j];
        const kvpc_value_t *value = &values[i];
        if (!s_value_on_device (device, value))
            continue;
        parts[i] = (kvpool_iov_t){to, value->size};
        staged[i] = (kvpc_value_t){&parts[i], 1, value->size};
        for (size_t p = 0; p < value->nparts; p++) {
            const kvpool_iov_t *part = &value->parts[p];
            int on;
            if (part->size == 0)
                continue;
            if (kvpc_device_holds (device, part->data, &on)) {
                if (kvpc_device_fetch (device, slot, to, part->data, part->size, on))
                    return -1;
            }
            else
                memcpy (to, part->data, part->size);
            to += part->size;
        }
    }
    return kvpc_device_frame_seal (device, slot);
}

static int
s_put_staged (kvpc_conn_t *conn, kvpc_device_t *device, Kvpool__V1__Op op, const kvpc_keys_t *keys,
              const kvpc_value_t *values, const kvpool_put_options_t *opts, int64_t *results)
{
    size_t n = 0; //  caller indexes 0 .. n - 1
    for (size_t j = 0; j < keys->count; j++)
        if (keys->index[j] >= n)
            n = keys->index[j] + 1;
    kvpc_value_t *staged = malloc ((n ? n : 1) * sizeof *staged);
    kvpool_iov_t *parts = malloc ((n ? n : 1) * sizeof *parts);
    if (!staged || !parts) {
        free (staged);
        free (parts);
        kvpc_set_error (conn, "out of memory for a put of %zu keys", keys->count);
        kvpc_fill (keys, results, KVPOOL_INTERNAL_ERROR);
        return KVPOOL_INTERNAL_ERROR;
    }
    //  Request k is chunk[k % 2], its values queued into frame slot k % 2 while request
    //  k - 1 went out.
    kvpc_keys_t chunk[2];
    bool have[2], ready[2];
    size_t start = 0;
    have[0] =
        kvpc_next_chunk (keys, &start, s_value_bytes, values, KVPC_CHUNK_BYTES, &chunk[0], results);
    ready[0] = have[0] && s_stage_chunk (device, 0, &chunk[0], values, staged, parts) == 0;
    int rc = KVPOOL_OK;
    for (int now = 0; have[now]; now = 1 - now) {
        int next = 1 - now;
        have[next] = kvpc_next_chunk (keys, &start, s_value_bytes, values, KVPC_CHUNK_BYTES,
                                      &chunk[next], results);
        ready[next] =
            have[next] && s_stage_chunk (device, next, &chunk[next], values, staged, parts) == 0;
        if (kvpc_device_frame_wait (device, now))
            ready[now] = false;
        if (ready[now]) {
            int chunk_rc = s_put_chunk (conn, op, &chunk[now], staged, opts, results);
            if (chunk_rc != KVPOOL_OK)
                rc = chunk_rc;
        }
        else {
            kvpc_set_error (conn, "%s", kvpc_device_error (device));
            kvpc_fill (&chunk[now], results, KVPOOL_INVALID_PARAMS);
        }
        kvpc_keys_fini (&chunk[now]);
    }
    free (staged);
    free (parts);
    return rc;
}

int
kvpc_socket_put (kvpc_conn_t *conn, Kvpool__V1__Op op, const kvpc_keys_t *keys,
                 const kvpc_value_t *values, const kvpool_put_options_t *opts, int64_t *results)
{
    kvpc_device_t *device = kvpc_conn_device_armed (conn);
    if (device)
        return s_put_staged (conn, device, op, keys, values, opts, results);
    int rc = KVPOOL_OK;
    size_t start = 0;
    kvpc_keys_t chunk;
    while (
        kvpc_next_chunk (keys, &start, s_value_bytes, values, KVPC_CHUNK_BYTES, &chunk, results)) {
        int chunk_rc = s_put_chunk (conn, op, &chunk, values, opts, results);
        if (chunk_rc != KVPOOL_OK)
            rc = chunk_rc;
        kvpc_keys_fini (&chunk);
    }
    return rc;
}

//  ---- gets ---------------------------------------------------------------------------------

//  ---- one GET --------------------------------------------------------------------------------
//  A batch's GETs go in chunks of 4 MiB, then 8, then 16 (batch.h), two at the node at once: when
//  chunk k's reply is in, its values land while the node works on chunk k + 1, and chunk
//  k + 2 is sent once they landed. So the node reads one chunk (from its disk, or its
//  segments) while it sends the other, and the client lands values meanwhile too (copies into
//  the caller's buffers, or DMAs into device memory). A reply that comes before the one
//  awaited is kept by the connection (kvpc_call_recv_ahead).

//  A GET of a chunk's keys on its way: the request (its id), or the failure that kept it from
//  being sent.
typedef struct {
    kvpc_keys_t keys;
    Kvpool__V1__Request request;
    int rc;
} s_get_t;

//  Sends the GET of get->keys (each key's range, a ranged get asking for as many bytes as the
//  key's buffers hold, from its offset). A failure is kept in get->rc.
static void
s_get_send (kvpc_conn_t *conn, s_get_t *get, const kvpc_sink_t *sink, bool redirect)
{
    const kvpc_keys_t *keys = &get->keys;
    kvpool__v1__request__init (&get->request);
    get->rc = KVPOOL_OK;
    if (keys->count == 0)
        return;
    uint64_t *ranges = NULL;
    if (sink->offsets) {
        ranges = malloc (2 * keys->count * sizeof *ranges);
        if (!ranges) {
            get->rc = KVPOOL_INTERNAL_ERROR;
            return;
        }
        for (size_t j = 0; j < keys->count; j++) {
            size_t i = keys->index[j];
            ranges[j] = sink->offsets[i];
            ranges[keys->count + j] = kvpc_sink_bytes (sink, i);
        }
    }
    uint64_t *versions = NULL;
    if (sink->expect && !(versions = malloc (keys->count * sizeof *versions))) {
        free (ranges);
        get->rc = KVPOOL_INTERNAL_ERROR;
        return;
    }
    for (size_t j = 0; versions && j < keys->count; j++)
        versions[j] = sink->expect[keys->index[j]];
    Kvpool__V1__Request *request = &get->request;
    request->op = KVPOOL__V1__OP__GET;
    request->redirect = redirect;
    request->n_keys = keys->count;
    request->keys = keys->wire;
    if (ranges) {
        request->n_offsets = request->n_lengths = keys->count;
        request->offsets = ranges;
        request->lengths = ranges + keys->count;
    }
    if (versions) {
        request->n_versions = keys->count;
        request->versions = versions;
    }
    get->rc = kvpc_call_send (conn, request);
    //  Packed into the message: not needed past the send.
    free (ranges);
    free (versions);
    request->offsets = request->lengths = NULL;
    request->n_offsets = request->n_lengths = 0;
    request->versions = NULL;
    request->n_versions = 0;
}

//  Receives the reply of a GET that was sent, with one value frame per key; ahead, if not
//  NULL, is the GET sent after it (its reply may come first).
static int
s_get_recv (kvpc_conn_t *conn, s_get_t *get, const s_get_t *ahead, kvpc_reply_t *reply)
{
    if (get->rc || get->keys.count == 0)
        return get->rc;
    bool out = ahead && !ahead->rc && ahead->keys.count;
    int rc =
        kvpc_call_recv_ahead (conn, &get->request, get->keys.count, out ? &ahead->request : NULL,
                              out ? ahead->keys.count : 0, reply);
    if (rc == 0) {
        rc = kvpc_reply_check (conn, reply, get->keys.count, KVPC_NEED_FRAMES);
        if (rc)
            kvpc_reply_free (reply);
    }
    return rc;
}

//  The outcome of key j of a GET reply: its status, checked against its frame. With verify
//  (a whole value read from another node after a REDIRECT: bytes no node of ours checked),
//  a value that does not match the checksum the node sent is TRANSFER_FAIL, and the resolver
//  reads the next holder. A value relayed by our own node was verified there.
static int
s_get_key_status (kvpc_conn_t *conn, kvpc_reply_t *reply, size_t j, bool verify)
{
    int status = kvpc_reply_key_status (reply, j);
    if (status == KVPOOL_OK && j < reply->msg->n_sizes
        && reply->msg->sizes[j] != zmq_msg_size (&reply->frames[j])) {
        kvpc_set_error (conn, "GET reply: key %zu has size %" PRIu64 " but a %zu-byte frame", j,
                        reply->msg->sizes[j], zmq_msg_size (&reply->frames[j]));
        status = KVPOOL_PROTOCOL_ERROR;
    }
    if (status == KVPOOL_OK && verify && j < reply->msg->n_checksums && reply->msg->checksums[j]
        && value_checksum (zmq_msg_data (&reply->frames[j]), zmq_msg_size (&reply->frames[j]))
               != reply->msg->checksums[j]) {
        kvpc_set_error (conn, "GET reply: key %zu's value does not match its checksum", j);
        status = KVPOOL_TRANSFER_FAIL;
    }
    return status;
}

//  ---- redirects: the holders a node named ------------------------------------------------

void
kvpc_redirects_init (kvpc_redirects_t *self)
{
    memset (self, 0, sizeof *self);
    kvpc_keys_init (&self->keys);
}

void
kvpc_redirects_fini (kvpc_redirects_t *self)
{
    for (size_t j = 0; j < self->keys.count; j++)
        for (size_t h = 0; h < self->holders[j].count; h++) {
            free (self->holders[j].endpoint[h]);
            free (self->holders[j].curve_key[h]);
        }
    free (self->holders);
    kvpc_keys_fini (&self->keys);
    kvpc_redirects_init (self);
}

//  Adds key j of a GET reply that answered REDIRECT, with the client endpoints (and CURVE
//  keys) of the nodes it names, in the order named. Returns 0, or -1 when out of memory.
static int
s_redirects_add (kvpc_redirects_t *self, const kvpc_keys_t *keys, size_t j, kvpc_reply_t *reply)
{
    if (self->keys.count == self->capacity) {
        size_t capacity = self->capacity ? 2 * self->capacity : 8;
        kvpc_holders_t *holders = realloc (self->holders, capacity * sizeof *holders);
        if (!holders)
            return -1;
        self->holders = holders;
        self->capacity = capacity;
    }
    kvpc_holders_t *to = &self->holders[self->keys.count];
    memset (to, 0, sizeof *to);
    Kvpool__V1__Reply *msg = reply->msg;
    to->version = j < msg->n_versions ? msg->versions[j] : 0;
    size_t named = j < msg->n_locations ? msg->locations[j]->n_nodes : 0;
    for (size_t a = 0; a < named && to->count < KVPOOL_MAX_REPLICAS; a++) {
        uint32_t node = msg->locations[j]->nodes[a];
        //  The holders are tried in order up to the first the reply does not name usably.
        if (node >= msg->n_nodes || !msg->nodes[node]->client_endpoint
            || !*msg->nodes[node]->client_endpoint)
            break;
        const char *curve_key = msg->nodes[node]->curve_key;
        char *endpoint = strdup (msg->nodes[node]->client_endpoint);
        char *key = curve_key ? strdup (curve_key) : NULL;
        if (!endpoint || (curve_key && !key)) {
            free (endpoint);
            free (key);
            break;
        }
        to->endpoint[to->count] = endpoint;
        to->curve_key[to->count++] = key;
    }
    if (kvpc_keys_add_from (&self->keys, keys, j)) {
        for (size_t h = 0; h < to->count; h++) {
            free (to->endpoint[h]);
            free (to->curve_key[h]);
        }
        return -1;
    }
    return 0;
}

//  Lands a GET reply's values in sink (the reply is freed). Returns the reply's status.
static int
s_get_land (kvpc_conn_t *conn, const kvpc_keys_t *keys, kvpc_reply_t *reply,
            const kvpc_sink_t *sink, bool verify, kvpc_redirects_t *redirects, int64_t *results)
{
    kvpc_copies_t copies;
    kvpc_copies_init (&copies);
    for (size_t j = 0; j < keys->count; j++) {
        size_t i = keys->index[j];
        int status = s_get_key_status (conn, reply, j, verify && !sink->offsets);
        if (status == KVPOOL_OK && sink->versions)
            sink->versions[i] = j < reply->msg->n_versions ? reply->msg->versions[j] : 0;
        if (status == KVPOOL_OK)
            results[i] = kvpc_sink_land (sink, i, &reply->frames[j], &copies);
        else if (status == KVPOOL_REDIRECT && redirects
                 && s_redirects_add (redirects, keys, j, reply))
            results[i] = KVPOOL_INTERNAL_ERROR;
        else
            results[i] = status;
    }
    if (kvpc_copies_run (conn, &copies))
        //  A device copy failed (the last error says why): no key copied here is sure to
        //  have its bytes.
        for (size_t j = 0; j < keys->count; j++)
            if (results[keys->index[j]] > 0)
                results[keys->index[j]] = KVPOOL_INVALID_PARAMS;
    kvpc_copies_fini (&copies);
    int rc = reply->msg->status;
    kvpc_reply_free (reply);
    return rc;
}

static uint64_t
s_sink_bytes (const void *arg, size_t index)
{
    return kvpc_sink_bytes ((const kvpc_sink_t *) arg, index);
}

//  A batch's GETs on their way: where the next chunk starts, and how large it may be.
typedef struct {
    const kvpc_keys_t *keys;
    const kvpc_sink_t *sink;
    bool redirect;
    size_t start;
    uint64_t limit;
    int64_t *results;
} s_gets_t;

//  Sends the GET of the batch's next chunk in get. Returns false when no keys are left.
static bool
s_get_next (kvpc_conn_t *conn, s_gets_t *gets, s_get_t *get)
{
    if (!kvpc_next_chunk (gets->keys, &gets->start, s_sink_bytes, gets->sink, gets->limit,
                          &get->keys, gets->results))
        return false;
    gets->limit = gets->limit < KVPC_CHUNK_BYTES / 2 ? 2 * gets->limit : KVPC_CHUNK_BYTES;
    s_get_send (conn, get, gets->sink, gets->redirect);
    return true;
}

int
kvpc_socket_get (kvpc_conn_t *conn, const kvpc_keys_t *keys, const kvpc_sink_t *sink, bool verify,
                 kvpc_redirects_t *redirects, int64_t *results)
{
    int rc = KVPOOL_OK;
    s_gets_t gets = {keys, sink, redirects != NULL, 0, KVPC_GET_FIRST_CHUNK_BYTES, results};
    s_get_t get[2];
    bool have[2];
    have[0] = s_get_next (conn, &gets, &get[0]);
    have[1] = have[0] && s_get_next (conn, &gets, &get[1]);
    for (int now = 0; have[now]; now = 1 - now) {
        int other = 1 - now;
        kvpc_reply_t reply;
        int chunk_rc = s_get_recv (conn, &get[now], have[other] ? &get[other] : NULL, &reply);
        if (chunk_rc == KVPOOL_OK && get[now].keys.count)
            chunk_rc = s_get_land (conn, &get[now].keys, &reply, sink, verify, redirects, results);
        else if (chunk_rc != KVPOOL_OK)
            kvpc_fill (&get[now].keys, results, chunk_rc);
        if (chunk_rc != KVPOOL_OK)
            rc = chunk_rc;
        kvpc_keys_fini (&get[now].keys);
        //  The next chunk, behind the other one still at the node.
        have[now] = s_get_next (conn, &gets, &get[now]);
    }
    return rc;
}

//  ---- two-phase puts and replica lists ---------------------------------------------------

//  Copies key j's placement out of a PUT_START or GET_REPLICA_LIST reply.
static void
s_placement (kvpc_conn_t *conn, kvpc_reply_t *reply, size_t j, kvpool_placement_t *placement)
{
    memset (placement, 0, sizeof *placement);
    placement->status = kvpc_reply_key_status (reply, j);
    if (placement->status != KVPOOL_OK)
        return;
    Kvpool__V1__Reply *msg = reply->msg;
    if (j < msg->n_sizes)
        placement->size = msg->sizes[j];
    Kvpool__V1__KeyReplicas *list = msg->replicas[j];
    size_t count = list ? list->n_replicas : 0;
    if (count > KVPOOL_MAX_REPLICAS) {
        kvpc_set_error (conn, "%zu replicas for one key (at most %d)", count, KVPOOL_MAX_REPLICAS);
        placement->status = KVPOOL_PROTOCOL_ERROR;
        return;
    }
    placement->replica_count = (uint32_t) count;
    for (size_t r = 0; r < count; r++) {
        placement->replicas[r].segment_id = list->replicas[r]->segment_id;
        placement->replicas[r].offset = list->replicas[r]->offset;
    }
}

void
kvpc_placements_fill (kvpool_placement_t *placements, size_t n, int status)
{
    for (size_t i = 0; i < n; i++) {
        memset (&placements[i], 0, sizeof placements[i]);
        placements[i].status = status;
    }
}

//  PUT_START (with sizes) or GET_REPLICA_LIST (with pin), reported as placements.
static int
s_placement_op (kvpc_conn_t *conn, Kvpool__V1__Request *request, size_t n, const char *const *keys,
                const uint64_t *sizes, kvpool_placement_t *placements)
{
    int64_t small[16];
    int64_t *results = n <= 16 ? small : malloc (n * sizeof *results);
    if (!results) {
        kvpc_placements_fill (placements, n, KVPOOL_INTERNAL_ERROR);
        return KVPOOL_INTERNAL_ERROR;
    }
    kvpc_placements_fill (placements, n, KVPOOL_OK);
    kvpc_keys_t sent;
    int rc = kvpc_keys_collect (conn, n, keys, NULL, &sent, results);
    uint64_t *sent_sizes = NULL;
    if (rc == 0 && sizes && sent.count) {
        sent_sizes = malloc (sent.count * sizeof *sent_sizes);
        if (sent_sizes)
            for (size_t j = 0; j < sent.count; j++)
                sent_sizes[j] = sizes[sent.index[j]];
        else
            rc = KVPOOL_INTERNAL_ERROR;
    }
    if (rc) {
        kvpc_placements_fill (placements, n, rc);
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (!kvpc_key_valid (keys[i]))
            placements[i].status = KVPOOL_INVALID_KEY;
    if (sent.count == 0)
        goto done;
    request->n_keys = sent.count;
    request->keys = sent.wire;
    if (sizes) {
        request->n_sizes = sent.count;
        request->sizes = sent_sizes;
    }
    kvpc_reply_t reply;
    rc = kvpc_call (conn, request, NULL, 0, 0, &reply);
    if (rc == 0) {
        rc = kvpc_reply_check (conn, &reply, sent.count,
                               KVPC_NEED_REPLICAS | (sizes ? 0 : KVPC_NEED_SIZES));
        if (rc)
            kvpc_reply_free (&reply);
    }
    if (rc) {
        for (size_t j = 0; j < sent.count; j++)
            placements[sent.index[j]].status = rc;
        goto done;
    }
    for (size_t j = 0; j < sent.count; j++) {
        size_t i = sent.index[j];
        s_placement (conn, &reply, j, &placements[i]);
        if (sizes && placements[i].status == KVPOOL_OK)
            placements[i].size = sizes[i];
    }
    rc = reply.msg->status;
    kvpc_reply_free (&reply);
done:
    free (sent_sizes);
    kvpc_keys_fini (&sent);
    if (results != small)
        free (results);
    return rc;
}

int
kvpc_socket_put_start (kvpc_conn_t *conn, size_t n, const char *const *keys, const uint64_t *sizes,
                       const kvpool_put_options_t *opts, kvpool_placement_t *placements)
{
    //  A placement holds at most KVPOOL_MAX_REPLICAS replicas.
    if (opts && opts->replica_num > KVPOOL_MAX_REPLICAS) {
        kvpc_set_error (conn, "replica_num %u is more than %d", opts->replica_num,
                        KVPOOL_MAX_REPLICAS);
        kvpc_placements_fill (placements, n, KVPOOL_INVALID_REPLICA);
        return KVPOOL_INVALID_REPLICA;
    }
    Kvpool__V1__PutOptions put;
    kvpc_put_options (opts, &put);
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__PUT_START;
    request.put = &put;
    return s_placement_op (conn, &request, n, keys, sizes, placements);
}

int
kvpc_socket_replica_list (kvpc_conn_t *conn, size_t n, const char *const *keys, bool pin,
                          kvpool_placement_t *placements)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__GET_REPLICA_LIST;
    request.pin = pin;
    return s_placement_op (conn, &request, n, keys, NULL, placements);
}

//  ---- segments and stats -------------------------------------------------------------------

int
kvpc_socket_segments (kvpc_conn_t *conn, kvpool_segment_t *segments, size_t capacity)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__SEGMENTS;
    kvpc_reply_t reply;
    int rc = s_simple_call (conn, &request, &reply);
    if (rc)
        return rc;
    Kvpool__V1__Reply *msg = reply.msg;
    for (size_t i = 0; i < msg->n_segments && i < capacity; i++) {
        Kvpool__V1__Segment *from = msg->segments[i];
        kvpool_segment_t *to = &segments[i];
        memset (to, 0, sizeof *to);
        to->id = from->id;
        snprintf (to->name, sizeof to->name, "%s", from->name ? from->name : "");
        to->size = from->size;
        to->used = from->used;
    }
    int count = msg->n_segments > INT32_MAX ? INT32_MAX : (int) msg->n_segments;
    kvpc_reply_free (&reply);
    return count;
}

static void
s_node_copy (const Kvpool__V1__NodeInfo *from, kvpool_node_t *to)
{
    memset (to, 0, sizeof *to);
    snprintf (to->node_id, sizeof to->node_id, "%s", from->node_id ? from->node_id : "");
    snprintf (to->host_id, sizeof to->host_id, "%s", from->host_id ? from->host_id : "");
    snprintf (to->client_endpoint, sizeof to->client_endpoint, "%s",
              from->client_endpoint ? from->client_endpoint : "");
    to->capacity = from->capacity;
    to->free = from->free;
    to->objects = from->objects;
    to->last_heard_ms = from->last_heard_ms;
    to->alive = from->alive;
}

int
kvpc_socket_nodes (kvpc_conn_t *conn, const char *key, uint64_t *size_p, kvpool_node_t *nodes,
                   size_t capacity)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    ProtobufCBinaryData wire = {0};
    if (key) {
        request.op = KVPOOL__V1__OP__LOCATE;
        wire.data = (uint8_t *) key;
        wire.len = strlen (key);
        request.keys = &wire;
        request.n_keys = 1;
    }
    else
        request.op = KVPOOL__V1__OP__NODES;
    kvpc_reply_t reply;
    int rc = s_simple_call (conn, &request, &reply);
    if (rc)
        return rc;
    Kvpool__V1__Reply *msg = reply.msg;
    int count = 0;
    if (key) {
        if (msg->n_statuses < 1 || msg->n_locations < 1)
            count = KVPOOL_INTERNAL_ERROR;
        else if (msg->statuses[0] != KVPOOL_OK)
            count = msg->statuses[0];
        else {
            const Kvpool__V1__KeyNodes *where = msg->locations[0];
            for (size_t i = 0; i < where->n_nodes; i++)
                if (where->nodes[i] < msg->n_nodes && (size_t) count < capacity)
                    s_node_copy (msg->nodes[where->nodes[i]], &nodes[count++]);
            count = (int) where->n_nodes;
            if (size_p)
                *size_p = msg->n_sizes ? msg->sizes[0] : 0;
        }
    }
    else {
        for (size_t i = 0; i < msg->n_nodes && i < capacity; i++)
            s_node_copy (msg->nodes[i], &nodes[i]);
        count = msg->n_nodes > INT32_MAX ? INT32_MAX : (int) msg->n_nodes;
    }
    kvpc_reply_free (&reply);
    return count;
}

int
kvpc_socket_mount (kvpc_conn_t *conn, const char *shm_name, uint64_t size, uint32_t *id_p)
{
    Kvpool__V1__Segment segment = KVPOOL__V1__SEGMENT__INIT;
    segment.name = (char *) shm_name;
    segment.size = size;
    segment.owner = (char *) kvpc_conn_client_id (conn);
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__MOUNT_SEGMENT;
    request.segment = &segment;
    kvpc_reply_t reply;
    int rc = s_simple_call (conn, &request, &reply);
    if (rc)
        return rc;
    if (reply.msg->n_segments < 1) {
        kvpc_set_error (conn, "MOUNT_SEGMENT reply carries no segment");
        rc = KVPOOL_PROTOCOL_ERROR;
    }
    else if (id_p)
        *id_p = reply.msg->segments[0]->id;
    kvpc_reply_free (&reply);
    return rc;
}

int
kvpc_socket_unmount (kvpc_conn_t *conn, uint32_t id)
{
    Kvpool__V1__Segment segment = KVPOOL__V1__SEGMENT__INIT;
    segment.id = id;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__UNMOUNT_SEGMENT;
    request.segment = &segment;
    return s_simple_call (conn, &request, NULL);
}

int
kvpc_socket_drain (kvpc_conn_t *conn, const char *node_id, const char *action,
                   kvpool_drain_t *state)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__DRAIN;
    ProtobufCBinaryData key = {strlen (node_id), (uint8_t *) node_id};
    request.keys = &key;
    request.n_keys = 1;
    request.pattern = (char *) (action ? action : "");
    kvpc_reply_t reply;
    int rc = s_simple_call (conn, &request, &reply);
    if (rc)
        return rc;
    if (reply.msg->n_statuses && reply.msg->statuses[0] != KVPOOL_OK)
        rc = reply.msg->statuses[0];
    else if (state) {
        state->sole = reply.msg->count;
        state->short_count = reply.msg->drain_short;
        state->draining = reply.msg->draining;
    }
    kvpc_reply_free (&reply);
    return rc;
}

int
kvpc_socket_config (kvpc_conn_t *conn, const char *name, const char *value, char *out, size_t size)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__CONFIG;
    request.setting = (char *) name;
    request.setting_value = (char *) (value ? value : "");
    kvpc_reply_t reply;
    int rc = s_simple_call (conn, &request, &reply);
    if (rc)
        return rc;
    snprintf (out, size, "%s", reply.msg->setting_value ? reply.msg->setting_value : "");
    kvpc_reply_free (&reply);
    return KVPOOL_OK;
}

int
kvpc_socket_stats (kvpc_conn_t *conn, kvpool_stats_t *stats, kvpool_op_stats_t *ops, size_t max,
                   size_t *count)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__STATS;
    kvpc_reply_t reply;
    int rc = s_simple_call (conn, &request, &reply);
    if (rc)
        return rc;
    Kvpool__V1__Stats *from = reply.msg->stats;
    if (!from) {
        kvpc_set_error (conn, "STATS reply carries no stats");
        kvpc_reply_free (&reply);
        return KVPOOL_PROTOCOL_ERROR;
    }
    memset (stats, 0, sizeof *stats);
    kvpc_conn_set_master_endpoint (conn, reply.msg->master_endpoint);
#define KVPC_STATS_COPY(type, name, text) stats->name = from->name;
    KVPOOL_STATS_FIELDS (KVPC_STATS_COPY)
#undef KVPC_STATS_COPY
    if (count)
        *count = reply.msg->n_op_stats;
    for (size_t i = 0; ops && i < max && i < reply.msg->n_op_stats; i++) {
        const Kvpool__V1__OpStats *entry = reply.msg->op_stats[i];
        kvpool_op_stats_t *op = &ops[i];
        memset (op, 0, sizeof *op);
        op->op = (int) entry->op;
        const ProtobufCEnumValue *value =
            protobuf_c_enum_descriptor_get_value (&kvpool__v1__op__descriptor, op->op);
        op->name = value ? value->name : "UNKNOWN";
        op->requests = entry->requests;
        op->failures = entry->failures;
        op->latency_sum_us = entry->latency_sum_us;
        for (size_t b = 0; b < entry->n_latency_buckets && b < KVPOOL_LATENCY_BUCKETS; b++)
            op->latency_buckets[b] = entry->latency_buckets[b];
    }
    kvpc_reply_free (&reply);
    return KVPOOL_OK;
}
