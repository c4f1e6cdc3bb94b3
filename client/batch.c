/*  batch.c - the keys of one request, the copies of one call, chunks of a socket batch
    (batch.h).

    Keys are never copied: a kvpc_keys_t points at the caller's strings, in arrays inline in
    the struct for up to eight keys (the common case, no allocation) and on the heap beyond.
    Copies are collected first and run together, so that a large batch can be spread over
    the connection's copy threads while a small one is copied at once by the caller's.
*/
#include "client/batch.h"

#include <stdlib.h>
#include <string.h>

//  Copy threads a connection starts (on its first large copy list).
#define KVPC_POOL_WORKERS 2

//  ---- keys ---------------------------------------------------------------------------------

bool
kvpc_key_valid (const char *key)
{
    return key && *key;
}

void
kvpc_keys_init (kvpc_keys_t *self)
{
    memset (self, 0, sizeof *self);
    self->capacity = sizeof self->inline_keys / sizeof self->inline_keys[0];
    self->keys = self->inline_keys;
    self->wire = self->inline_wire;
    self->index = self->inline_index;
}

//  Frees the arrays when they are not the inline ones.
static void
s_keys_free (kvpc_keys_t *self)
{
    if (self->keys != self->inline_keys) {
        free (self->keys);
        free (self->wire);
        free (self->index);
    }
}

int
kvpc_keys_reserve (kvpc_keys_t *self, size_t capacity)
{
    if (capacity <= self->capacity)
        return 0;
    char **keys = malloc (capacity * sizeof *keys);
    ProtobufCBinaryData *wire = malloc (capacity * sizeof *wire);
    size_t *indexes = malloc (capacity * sizeof *indexes);
    if (!keys || !wire || !indexes) {
        free (keys);
        free (wire);
        free (indexes);
        return -1;
    }
    memcpy (keys, self->keys, self->count * sizeof *keys);
    memcpy (wire, self->wire, self->count * sizeof *wire);
    memcpy (indexes, self->index, self->count * sizeof *indexes);
    s_keys_free (self);
    self->keys = keys;
    self->wire = wire;
    self->index = indexes;
    self->capacity = capacity;
    return 0;
}

int
kvpc_keys_add_len (kvpc_keys_t *self, const char *key, size_t len, size_t index)
{
    if (self->count == self->capacity
        && kvpc_keys_reserve (self, self->capacity ? self->capacity * 2 : 8))
        return -1;
    //  protobuf-c wants char **; it only reads the strings.
    self->keys[self->count] = (char *) key;
    self->wire[self->count].data = (uint8_t *) key;
    self->wire[self->count].len = len;
    self->index[self->count] = index;
    self->count++;
    return 0;
}

int
kvpc_keys_add (kvpc_keys_t *self, const char *key, size_t index)
{
    return kvpc_keys_add_len (self, key, strlen (key), index);
}

int
kvpc_keys_add_from (kvpc_keys_t *self, const kvpc_keys_t *from, size_t j)
{
    return kvpc_keys_add_len (self, from->keys[j], from->wire[j].len, from->index[j]);
}

void
kvpc_keys_move (kvpc_keys_t *dst, kvpc_keys_t *src)
{
    *dst = *src;
    //  Inline arrays moved with the struct: point at the copies.
    if (src->keys == src->inline_keys) {
        dst->keys = dst->inline_keys;
        dst->wire = dst->inline_wire;
        dst->index = dst->inline_index;
    }
    kvpc_keys_init (src);
}

void
kvpc_keys_fini (kvpc_keys_t *self)
{
    s_keys_free (self);
    self->keys = NULL;
    self->wire = NULL;
    self->index = NULL;
    self->count = self->capacity = 0;
}

int
kvpc_keys_collect (kvpc_conn_t *conn, size_t n, const char *const *keys, const size_t *lens,
                   kvpc_keys_t *out, int64_t *results)
{
    kvpc_keys_init (out);
    if (kvpc_keys_reserve (out, n))
        goto oom;
    for (size_t i = 0; i < n; i++) {
        const char *key = keys[i];
        bool valid = lens ? key && lens[i] > 0 && key[lens[i]] == 0 : kvpc_key_valid (key);
        if (!valid) {
            results[i] = KVPOOL_INVALID_KEY;
            kvpc_set_error (conn, "key %zu is %s", i,
                            !key              ? "NULL"
                            : lens && lens[i] ? "not of its given length"
                                              : "empty");
        }
        else if (kvpc_keys_add_len (out, key, lens ? lens[i] : strlen (key), i))
            goto oom;
    }
    return 0;

oom:
    kvpc_keys_fini (out);
    kvpc_keys_init (out);
    for (size_t k = 0; k < n; k++)
        results[k] = KVPOOL_INTERNAL_ERROR;
    kvpc_set_error (conn, "out of memory for %zu keys", n);
    return KVPOOL_INTERNAL_ERROR;
}

void
kvpc_fill (const kvpc_keys_t *keys, int64_t *results, int64_t status)
{
    for (size_t j = 0; j < keys->count; j++)
        results[keys->index[j]] = status;
}

void
kvpc_put_options (const kvpool_put_options_t *opts, Kvpool__V1__PutOptions *out)
{
    kvpool__v1__put_options__init (out);
    if (!opts)
        return;
    out->replica_num = opts->replica_num;
    if (opts->preferred_segments && opts->preferred_segment_count) {
        out->n_preferred_segments = opts->preferred_segment_count;
        out->preferred_segments = (char **) opts->preferred_segments;
    }
    out->soft_pin = opts->soft_pin;
    out->soft_pin_ttl_ms = opts->soft_pin_ttl_ms;
    out->hard_pin = opts->hard_pin;
}

void
kvpc_put_request (Kvpool__V1__Request *request, Kvpool__V1__Op op, const kvpc_keys_t *keys,
                  const kvpool_put_options_t *opts, Kvpool__V1__PutOptions *put)
{
    kvpc_put_options (opts, put);
    kvpool__v1__request__init (request);
    request->op = op;
    request->n_keys = keys->count;
    request->keys = keys->wire;
    request->put = put;
}

uint64_t
kvpc_bufs_capacity (const kvpool_buf_t *bufs, size_t nbufs)
{
    uint64_t total = 0;
    for (size_t i = 0; i < nbufs; i++)
        total += bufs[i].size;
    return total;
}

//  ---- chunks -------------------------------------------------------------------------------

bool
kvpc_next_chunk (const kvpc_keys_t *keys, size_t *start, kvpc_bytes_fn *bytes_of, const void *arg,
                 uint64_t limit, kvpc_keys_t *chunk, int64_t *results)
{
    if (*start >= keys->count)
        return false;
    kvpc_keys_init (chunk);
    uint64_t bytes = 0;
    size_t j = *start;
    for (; j < keys->count; j++) {
        uint64_t size = bytes_of (arg, keys->index[j]);
        if (j > *start && bytes + size > limit)
            break;
        bytes += size;
        if (kvpc_keys_add_from (chunk, keys, j))
            results[keys->index[j]] = KVPOOL_INTERNAL_ERROR;
    }
    *start = j;
    return true;
}

//  ---- copies -------------------------------------------------------------------------------

void
kvpc_copies_init (kvpc_copies_t *self)
{
    memset (self, 0, sizeof *self);
}

int
kvpc_copies_add (kvpc_copies_t *self, void *dst, const void *src, size_t len)
{
    if (len == 0)
        return 0;
    if (self->count == self->capacity) {
        size_t capacity = self->capacity ? self->capacity * 2 : 16;
        kvpc_copy_t *items = realloc (self->items, capacity * sizeof *items);
        if (!items)
            return -1;
        self->items = items;
        self->capacity = capacity;
    }
    self->items[self->count++] = (kvpc_copy_t){dst, src, len};
    self->bytes += len;
    return 0;
}

int
kvpc_copies_scatter (kvpc_copies_t *self, const void *src, size_t len, const kvpool_buf_t *bufs,
                     size_t nbufs)
{
    const char *from = src;
    for (size_t i = 0; i < nbufs && len > 0; i++) {
        size_t piece = bufs[i].size < len ? bufs[i].size : len;
        if (kvpc_copies_add (self, bufs[i].data, from, piece))
            return -1;
        from += piece;
        len -= piece;
    }
    return 0;
}

int
kvpc_copies_gather (kvpc_copies_t *self, void *dst, const kvpool_iov_t *parts, size_t nparts)
{
    char *to = dst;
    for (size_t i = 0; i < nparts; i++) {
        if (kvpc_copies_add (self, to, parts[i].data, parts[i].size))
            return -1;
        to += parts[i].size;
    }
    return 0;
}

//  Host memory on both sides: memcpy, on the copy threads for large lists.
static void
s_run_host (kvpc_conn_t *conn, kvpc_copies_t *copies)
{
    transfer_pool_t **pool = kvpc_conn_pool (conn);
    if (copies->bytes >= KVPC_POOL_MIN_BYTES && !*pool)
        *pool = transfer_pool_new (KVPC_POOL_WORKERS, 0);
    transfer_batch_t *batch = NULL;
    if (copies->bytes >= KVPC_POOL_MIN_BYTES && *pool)
        batch = transfer_batch_new (NULL, NULL);
    if (batch) {
        for (size_t i = 0; i < copies->count; i++)
            transfer_batch_add_copy (batch, copies->items[i].dst, copies->items[i].src,
                                     copies->items[i].len);
        transfer_pool_submit (*pool, batch);
        transfer_batch_wait (*pool, batch);
        transfer_batch_destroy (&batch);
    }
    else
        for (size_t i = 0; i < copies->count; i++)
            memcpy (copies->items[i].dst, copies->items[i].src, copies->items[i].len);
}

//  The host side of the device layer's staging (into or out of a pinned buffer), on the
//  copy threads as a host copy list would run.
static void
s_run_pieces (void *arg, const kvpc_device_copy_t *pieces, size_t count)
{
    kvpc_conn_t *conn = arg;
    uint64_t bytes = 0;
    for (size_t i = 0; i < count; i++)
        bytes += pieces[i].len;
    transfer_pool_t **pool = kvpc_conn_pool (conn);
    if (bytes >= KVPC_POOL_MIN_BYTES && !*pool)
        *pool = transfer_pool_new (KVPC_POOL_WORKERS, 0);
    transfer_batch_t *batch =
        bytes >= KVPC_POOL_MIN_BYTES && *pool ? transfer_batch_new (NULL, NULL) : NULL;
    if (!batch) {
        for (size_t i = 0; i < count; i++)
            memcpy (pieces[i].dst, pieces[i].src, pieces[i].len);
        return;
    }
    for (size_t i = 0; i < count; i++)
        transfer_batch_add_copy (batch, pieces[i].dst, pieces[i].src, pieces[i].len);
    transfer_pool_submit (*pool, batch);
    transfer_batch_wait (*pool, batch);
    transfer_batch_destroy (&batch);
}

//  A call with device buffers: the copies with a device side go through the device layer's
//  pinned buffers, the others as usual.
static int
s_run_staged (kvpc_conn_t *conn, kvpc_device_t *device, kvpc_copies_t *copies)
{
    kvpc_device_copy_t *staged = malloc ((copies->count ? copies->count : 1) * sizeof *staged);
    kvpc_copies_t host;
    kvpc_copies_init (&host);
    size_t nstaged = 0;
    int rc = staged ? 0 : -1;
    for (size_t i = 0; i < copies->count && rc == 0; i++) {
        kvpc_copy_t *item = &copies->items[i];
        if (kvpc_device_plan (device, item->dst, item->src, item->len, &staged[nstaged]))
            nstaged++;
        else if (kvpc_copies_add (&host, item->dst, item->src, item->len))
            rc = -1;
    }
    if (rc)
        kvpc_set_error (conn, "out of memory for %zu copies", copies->count);
    else {
        s_run_host (conn, &host);
        if (kvpc_device_copy (device, staged, nstaged, s_run_pieces, conn)) {
            kvpc_set_error (conn, "%s", kvpc_device_error (device));
            rc = -1;
        }
    }
    kvpc_copies_fini (&host);
    free (staged);
    return rc;
}

int
kvpc_copies_run (kvpc_conn_t *conn, kvpc_copies_t *copies)
{
    kvpc_device_t *device = kvpc_conn_device_armed (conn);
    if (device)
        return s_run_staged (conn, device, copies);
    s_run_host (conn, copies);
    return 0;
}

void
kvpc_copies_fini (kvpc_copies_t *self)
{
    free (self->items);
    memset (self, 0, sizeof *self);
}
