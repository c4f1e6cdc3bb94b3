/*  batch.h - libkvpool's batches: the keys of one request, the copies of one call, and the
    cutting of a socket batch into requests of bounded size. Above connection.h; used by the
    socket operations, the fast path and the public API.

    Batch calls inside the library carry keys as a kvpc_keys_t (the keys that passed
    client-side validation, with each key's index in the caller's arrays) and outcomes as an
    int64_t per caller index, so that one implementation serves every public signature.
*/
#ifndef KVPC_BATCH_H_INCLUDED
#define KVPC_BATCH_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/connection.h"

//  The keys of one request: pointers to the caller's strings, each with its caller index.
typedef struct {
    size_t count;
    size_t capacity;
    char **keys;
    ProtobufCBinaryData *wire; //  the same keys as the request carries them (bytes)
    size_t *index;
    char *inline_keys[8];
    ProtobufCBinaryData inline_wire[8];
    size_t inline_index[8];
} kvpc_keys_t;

void kvpc_keys_init (kvpc_keys_t *self);
//  Makes room for capacity keys in all (a batch's size is known before its keys are added).
//  Returns 0, or -1 when out of memory.
int kvpc_keys_reserve (kvpc_keys_t *self, size_t capacity);
//  Each returns 0, or -1 when out of memory. _len takes the key's length (its strlen) where
//  it is already known: a key moved from one kvpc_keys_t to another (wire[j].len), or one a
//  binding gave with its length.
int kvpc_keys_add (kvpc_keys_t *self, const char *key, size_t index);
int kvpc_keys_add_len (kvpc_keys_t *self, const char *key, size_t len, size_t index);
//  kvpc_keys_add_len of from's j-th key.
int kvpc_keys_add_from (kvpc_keys_t *self, const kvpc_keys_t *from, size_t j);
//  Moves src's keys into dst (dst is not finished first; src is left empty).
void kvpc_keys_move (kvpc_keys_t *dst, kvpc_keys_t *src);
void kvpc_keys_fini (kvpc_keys_t *self);
//  True for a key the server could accept (non-NULL, non-empty).
bool kvpc_key_valid (const char *key);
//  Initialises out and collects the valid keys of keys[0..n) into it; invalid ones get
//  INVALID_KEY in results (with the last error saying which). lens, when not NULL, gives each
//  key's length (a key whose byte at its length is not its NUL is invalid). Returns 0, or
//  INTERNAL_ERROR (out of memory: every result is that, out is empty).
int kvpc_keys_collect (kvpc_conn_t *conn, size_t n, const char *const *keys, const size_t *lens,
                       kvpc_keys_t *out, int64_t *results);
//  Stores status in results[] for every key of keys.
void kvpc_fill (const kvpc_keys_t *keys, int64_t *results, int64_t status);

//  Fills a PutOptions from the caller's options (NULL: defaults).
void kvpc_put_options (const kvpool_put_options_t *opts, Kvpool__V1__PutOptions *out);
//  Makes request a write of op for keys with the caller's options, which are filled into
//  *put (it must live as long as the request).
void kvpc_put_request (Kvpool__V1__Request *request, Kvpool__V1__Op op, const kvpc_keys_t *keys,
                       const kvpool_put_options_t *opts, Kvpool__V1__PutOptions *put);
//  Total capacity of a scatter list.
uint64_t kvpc_bufs_capacity (const kvpool_buf_t *bufs, size_t nbufs);

//  ---- chunks: socket batches move in requests of at most KVPC_CHUNK_BYTES value bytes ----
//  One reply of 32 x 4 MiB made libzmq hold 128 MiB of fresh receive buffers at once, which
//  the allocator hands back to the kernel and faults in again every call (measured 0.35 GB/s);
//  bounded messages reuse the same memory (2.6 GB/s).
#define KVPC_CHUNK_BYTES (16u << 20)
//  Gets go two requests at the node at once (socket_ops.c): the node reads one (from its
//  disk, say) while it sends the other, which one message of the whole batch cannot do
//  (libzmq hands a message to the wire only once its last frame is queued). The first
//  request of a batch carries at most this much, each next one twice as much as the one
//  before, up to KVPC_CHUNK_BYTES: small ones start the overlap early, large ones cost less
//  a byte (measured on 32 x 1 MiB from memory, 4 MiB requests throughout were 13 % slower).
#define KVPC_GET_FIRST_CHUNK_BYTES (4u << 20)

//  The bytes key index (a caller index) adds to a chunk.
typedef uint64_t (kvpc_bytes_fn) (const void *arg, size_t index);

//  Fills chunk (initialised here; the caller finishes it) with the run of keys starting at
//  *start whose bytes add up to at most limit (KVPC_CHUNK_BYTES, or less for gets), at
//  least one key, and moves *start past it. Returns false when no keys are left.
bool kvpc_next_chunk (const kvpc_keys_t *keys, size_t *start, kvpc_bytes_fn *bytes_of,
                      const void *arg, uint64_t limit, kvpc_keys_t *chunk, int64_t *results);

//  ---- copies: a list of memcpys, run inline or on the connection's copy threads ---------
//  Lists of at least this many bytes go to the copy threads; smaller ones are cheaper to
//  copy in the caller's thread than to hand over.
#define KVPC_POOL_MIN_BYTES (1u << 20)

typedef struct {
    void *dst;
    const void *src;
    size_t len;
} kvpc_copy_t;

typedef struct {
    kvpc_copy_t *items;
    size_t count;
    size_t capacity;
    uint64_t bytes;
} kvpc_copies_t;

void kvpc_copies_init (kvpc_copies_t *self);
//  Each returns 0, or -1 when out of memory.
int kvpc_copies_add (kvpc_copies_t *self, void *dst, const void *src, size_t len);
//  Copies len bytes from src across bufs in order (the caller checked they are big enough).
int kvpc_copies_scatter (kvpc_copies_t *self, const void *src, size_t len, const kvpool_buf_t *bufs,
                         size_t nbufs);
//  Copies the concatenation of parts to dst.
int kvpc_copies_gather (kvpc_copies_t *self, void *dst, const kvpool_iov_t *parts, size_t nparts);
//  Runs every copy; returns when all are done. Lists of KVPC_POOL_MIN_BYTES or more run on
//  conn's copy threads. In a call with device buffers (kvpc_conn_device_armed) the copies
//  with a device side go through the device layer's pinned buffers (device.h). Returns 0, or
//  -1 when a device copy failed (some copies may not have been made; the last error says
//  why; the callers report KVPOOL_INVALID_PARAMS for the keys of the list).
int kvpc_copies_run (kvpc_conn_t *conn, kvpc_copies_t *copies);
void kvpc_copies_fini (kvpc_copies_t *self);

#endif
