/*  kvpool_client.h - libkvpool's internals, shared by its .c files. Not a public header: the
    API is include/kvpool.h.

    kvpool_client.c owns the connection (a DEALER socket), the request/reply machinery and
    every operation over the socket; fast_path.c owns the same-machine path (mapped server
    segments, put-start/memcpy/put-end and get-replica-list/memcpy/release). Both work on the
    one struct below. A kvpool_t is used by one thread at a time; the only state another
    thread touches is zc_pending, which libzmq's I/O thread decrements when it lets go of a
    value frame sent without a copy.

    Batch calls inside the library carry keys as a kvpc_keys_t (the keys that passed
    client-side validation, with each key's index in the caller's arrays) and outcomes as an
    int64_t per caller index, so that one implementation serves every public signature.
*/
#ifndef KVPOOL_CLIENT_H_INCLUDED
#define KVPOOL_CLIENT_H_INCLUDED

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "transfer/transfer_pool.h"
#include "shm/segment.h"
#include "shm/segment_table.h"
#include "shm/shm_index.h"
#include "shm/touch_table.h"
#include "kvpool.h"
#include "protocol/contract.h"
#include "protocol/status.h"
#include "protocol/kvpool.pb-c.h"

//  Everything declared here is internal: kept out of libkvpool.so's exported symbols.
#pragma GCC visibility push(hidden)

//  Batches whose copies total at least this many bytes are copied by the transfer pool.
#define KVPC_POOL_MIN_BYTES (1u << 20)
#define KVPC_POOL_WORKERS 2
//  Put values at least this large go to libzmq without a copy (see s_send_request).
#define KVPC_ZERO_COPY_MIN (64u << 10)

//  Memory this connection gave the pool: its segment here, its id at the node.
typedef struct {
    uint32_t id;
    segment_t *segment;
} kvpc_memory_t;

struct _kvpool_t {
    void *ctx;    //  the ZeroMQ context of socket
    void *socket; //  DEALER
    char *endpoint;
    int timeout_ms;
    uint64_t next_id; //  request ids, monotonic per connection
    char last_error[256];
    char client_id[96];        //  owner name for segments this client mounts
    char host_id[64];          //  the server's boot id (PING)
    char ping_server_id[96];   //  the server's boot id + pid (PING)
    char local_endpoint[256];  //  the server's ipc endpoint for same-machine clients (PING)
    bool same_host;            //  host_id equals this machine's boot id
    bool fast_path;            //  segments are mapped and the fast path is in use
    segment_table_t *segments; //  the node's segments as mapped here (fast path)
    char server_id[128];       //  the node whose segments are mapped (SEGMENTS)
    shm_index_t *index;        //  the node's same-machine read index (read-only), or NULL
    bool use_index;            //  reads may be served from it (kvpool_set_index)
    uint64_t index_reads;      //  values read from the index not yet reported in a TOUCH
    touch_table_t *touched;    //  keys whose lease we renewed lately (not every read)
    void *monitor;             //  PAIR receiving the socket's connect/disconnect events
    bool segments_stale;       //  the connection changed: the table must be listed again
    transfer_pool_t *pool;     //  created on the first large batch
    uint64_t *oneway_ids;      //  fire-and-forget requests whose replies have not come yet
    size_t oneway_count;
    size_t oneway_capacity;
    atomic_size_t zc_pending; //  zero-copy value frames libzmq still holds
    kvpc_memory_t *memory;    //  memory this connection gave the pool (kvpool_mount_memory)
    size_t memory_count;
};

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

//  Reports the values read from the index that no TOUCH has carried yet (kvpool_destroy).
void kvpc_index_report (kvpool_t *self);
//  Gives back every piece of memory the connection gave (kvpool_destroy).
void kvpc_memory_release_all (kvpool_t *self);

void kvpc_keys_init (kvpc_keys_t *self);
//  Returns 0, or -1 when out of memory.
int kvpc_keys_add (kvpc_keys_t *self, const char *key, size_t index);
void kvpc_keys_fini (kvpc_keys_t *self);
//  True for a key the server could accept (non-NULL, non-empty).
bool kvpc_key_valid (const char *key);

//  One put value: the concatenation of nparts buffers, size bytes in all.
typedef struct {
    const kvpool_iov_t *parts;
    size_t nparts;
    uint64_t size;
} kvpc_value_t;

//  A received reply: the decoded header and the value frames after it (GET only).
typedef struct {
    Kvpool__V1__Reply *msg;
    zmq_msg_t *frames;
    size_t nframes;
} kvpc_reply_t;

//  What kvpc_reply_check requires of a reply to a keyed request.
#define KVPC_NEED_SIZES 1
#define KVPC_NEED_REPLICAS 2
#define KVPC_NEED_FRAMES 4

//  Sends request (with one frame per value) and waits up to the connection's timeout for its
//  reply. Returns 0 with *reply filled (free it with kvpc_reply_free), or a negative status:
//  RPC_FAIL on timeout or socket failure, with last_error saying why.
int kvpc_call (kvpool_t *self, Kvpool__V1__Request *request, const kvpc_value_t *values,
               size_t nvalues, size_t expect_frames, kvpc_reply_t *reply);
//  Sends request without waiting; its reply is discarded when it arrives. Returns 0 or
//  RPC_FAIL.
int kvpc_send_oneway (kvpool_t *self, Kvpool__V1__Request *request);
void kvpc_reply_free (kvpc_reply_t *reply);
//  Checks that the reply to a request of nkeys keys carries what need asks for wherever a
//  key succeeded. Returns 0, or PROTOCOL_ERROR with last_error set.
int kvpc_reply_check (kvpool_t *self, kvpc_reply_t *reply, size_t nkeys, int need);
//  The outcome of key j: its own status, or the request's when the reply has none per key.
int kvpc_reply_key_status (kvpc_reply_t *reply, size_t j);
//  Sets last_error (printf style).
void kvpc_set_error (kvpool_t *self, const char *format, ...)
    __attribute__ ((format (printf, 2, 3)));
//  Stores status in results[] for every key of keys.
void kvpc_fill (const kvpc_keys_t *keys, int64_t *results, int64_t status);
//  Fills a PutOptions from the caller's options (NULL: defaults).
void kvpc_put_options (const kvpool_put_options_t *opts, Kvpool__V1__PutOptions *out);

//  The socket paths, also the fast path's fallbacks. values/bufs/nbufs/results are indexed
//  by caller index. Return the request's status (0 when answered).
int kvpc_socket_put (kvpool_t *self, const kvpc_keys_t *keys, const kvpc_value_t *values,
                     const kvpool_put_options_t *opts, int64_t *results);
int kvpc_socket_get_into (kvpool_t *self, const kvpc_keys_t *keys, const kvpool_buf_t *const *bufs,
                          const size_t *nbufs, int64_t *results);

//  A list of copies, run inline or on the transfer pool.
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
//  Runs every copy; returns when all are done.
void kvpc_copies_run (kvpool_t *self, kvpc_copies_t *copies);
void kvpc_copies_fini (kvpc_copies_t *self);
//  Total capacity of a scatter list.
uint64_t kvpc_bufs_capacity (const kvpool_buf_t *bufs, size_t nbufs);

//  ---- fast_path.c --------------------------------------------------------------------
//  Lists the server's segments and maps every one. Returns 0 (fast path on) or -1 (off,
//  nothing mapped).
int kvpc_fast_path_open (kvpool_t *self);
void kvpc_fast_path_close (kvpool_t *self);
//  Called when the socket was replaced: watches the new one, lists the segments again.
void kvpc_fast_path_reconnected (kvpool_t *self);
int kvpc_fast_put (kvpool_t *self, const kvpc_keys_t *keys, const kvpc_value_t *values,
                   const kvpool_put_options_t *opts, int64_t *results);
int kvpc_fast_get (kvpool_t *self, const kvpc_keys_t *keys, const kvpool_buf_t *const *bufs,
                   const size_t *nbufs, int64_t *results);
//  Answers EXIST (as_size false: 1) or GET_SIZE (as_size true: the size) for the keys the
//  same-machine index holds; adds the others, with their caller index, to rest.
void kvpc_index_probe (kvpool_t *self, const kvpc_keys_t *keys, bool as_size, int64_t *results,
                       kvpc_keys_t *rest);
//  Frees the table of recently touched keys.
void kvpc_index_forget (kvpool_t *self);

#pragma GCC visibility pop

#endif
