/*  kvpool.h - the public C API of libkvpool, the kvpool client library.

    A kvpool_t is one connection to a kvpoold node (DEALER socket, protocol v1 of
    protocol/kvpool.proto). It is not thread-safe: use one per thread. Every call blocks until
    the reply arrives or the connection's timeout passes (then it returns KVPOOL_RPC_FAIL).

    Return conventions, the same everywhere:
      - int functions return KVPOOL_OK (0) or a negative kvpool_status_t;
      - int64_t functions return a count or size (>= 0) or a negative kvpool_status_t;
      - batch functions return KVPOOL_OK when the request was answered and put one outcome per
        key in the caller's array; they return a negative status when the request as a whole
        failed (then the per-key array is filled with that status too).

    Same-machine fast path: when the client runs on the node's machine (same boot id, same
    network namespace) and can map the node's shared-memory segments, the put/get calls that
    copy from or into a caller's buffer move the bytes with memcpy (put-start, memcpy,
    put-end; get-replica-list, memcpy, release) instead of sending them over the socket. It
    is chosen automatically at connect
    and can be switched off (kvpool_options_t.fast_path = 0, or kvpool_set_fast_path).

    GPU memory: the buffers of the puts and of the gets into buffers may be CUDA device
    memory. libkvpool loads the CUDA runtime at run time (KVPOOL_CUDART=path, "none" for
    none; unset: libcudart.so.13/.12/.11.0/libcudart.so, once libcuda.so.1 is in the process),
    tells device addresses from host ones and moves device bytes by DMA straight into and out
    of the node's segments, which the process registers with the runtime on its first device
    copy (through pinned staging buffers where the runtime refuses them, or with
    KVPOOL_DEVICE_DMA=staged). Without a runtime every address is host memory. A CUDA failure
    gives KVPOOL_INVALID_PARAMS for the keys it touched, the reason in kvpool_last_error;
    nothing half-copied is stored.
*/
#ifndef KVPOOL_H_INCLUDED
#define KVPOOL_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

//  What libkvpool.so exports: the functions below and nothing else (the library is built
//  with -fvisibility=hidden; this marks the exceptions).
#if defined(__GNUC__) || defined(__clang__)
#define KVPOOL_EXPORT __attribute__ ((visibility ("default")))
#else
#define KVPOOL_EXPORT
#endif

#define KVPOOL_PROTOCOL_VERSION 1
//  The release of this library (and of the kvpoold it comes with).
#define KVPOOL_VERSION "0.1.0"
#define KVPOOL_DEFAULT_ENDPOINT "tcp://127.0.0.1:50051"
#define KVPOOL_DEFAULT_ADMIN_ENDPOINT "tcp://127.0.0.1:50052"

/*  Status codes (kvpool_status_t, KVPOOL_STATUS_LIST): generated from protocol/kvpool.proto's
    enum Status, the one place they are defined; the numbers are stable and follow Mooncake
    Store's ErrorCode where one exists. kvpool_stats.h lists the fields of kvpool_stats_t,
    generated from the proto's message Stats. Both are installed beside this header.        */
#include "kvpool_stats.h"
#include "kvpool_status.h"

//  Returns a short English description of a status code (never NULL).
KVPOOL_EXPORT const char *kvpool_strerror (int status);
//  Returns the status's name, e.g. "OBJECT_NOT_FOUND" (never NULL; "UNKNOWN" if unknown).
KVPOOL_EXPORT const char *kvpool_status_name (int status);

//  For bindings, so that a batch of n keys costs them one buffer and not n strings: points
//  keys[0..n) at the n keys packed one after another in blob, each ending with a NUL (len
//  bytes in all, the last of them a NUL). The pointers point into blob: keep it while they
//  are used. Returns KVPOOL_OK, or KVPOOL_INVALID_PARAMS when blob holds other than n keys.
KVPOOL_EXPORT int kvpool_keys_unpack (const char *blob, size_t len, size_t n, const char **keys);

typedef struct _kvpool_t kvpool_t;

typedef struct {
    int timeout_ms;         //  per request; 0 means the default (5000)
    int connect_timeout_ms; //  for the first PING at connect; 0 means timeout_ms
    int fast_path;          //  1: use the same-machine path when possible (default); 0: never
    //  On the node's machine a connection moves to the node's ipc endpoint (PING's
    //  local_endpoint), where the node knows which process it is and serves the
    //  shared-memory operations (put-start, get-replica-list, mount, ...). 1: stay on the
    //  endpoint given (those operations are then refused with KVPOOL_PERMISSION_DENIED).
    int keep_endpoint;
    //  CURVE (docs/security.md), both or neither: this client's certificate (the NAME_secret
    //  file `kvpool keygen NAME` writes; its public half, NAME, goes in the node's
    //  --curve-allow directory) and the node's public certificate. A node that refuses the
    //  key fails kvpool_connect with EACCES; a wrong server certificate, or CURVE on one side
    //  only, with EKEYREJECTED. NULL: no CURVE.
    const char *curve_secret_file;
    const char *curve_server_file;
} kvpool_options_t;

//  Fills options with the defaults (timeout 5000 ms, fast path auto).
KVPOOL_EXPORT void kvpool_options_init (kvpool_options_t *options);

//  Makes glibc's malloc keep large freed blocks instead of returning them to the kernel at
//  once (mmap threshold 32 MiB, trim threshold 256 MiB), and puts threads started after the
//  call (libzmq's I/O thread among them) on the main heap (M_ARENA_MAX 1), process-wide.
//  Without it every value of a few MiB received over tcp is page-faulted in afresh
//  (measured: 16 x 4 MiB gets at 0.31 GB/s, 1.24 GB/s with the thresholds; kvpool_get_batch
//  of 32 x 4 MiB at 0.5 GB/s, 3.3 GB/s with the arena limit too). Call it once at start-up,
//  before the first kvpool_connect, in a process that receives large values over tcp; it
//  does nothing with other C libraries. The Python package calls it unless
//  KVPOOL_MALLOC_TUNING=0. Returns 0, or -1 if the malloc is not glibc's.
KVPOOL_EXPORT int kvpool_tune_malloc (void);

//  Connects to a node and checks it answers a PING within the connect timeout. endpoint is
//  tcp://HOST:PORT, ipc://PATH or ipc://@NAME; a bare HOST:PORT means tcp://HOST:PORT.
//  Returns NULL on failure, with errno and kvpool_connect_error saying why: ECONNREFUSED when
//  nothing listens there (every attempt refused for 500 ms, or for the whole connect timeout
//  when shorter: a node that is still binding its sockets gets that long; retry, or wait for
//  the node's --ready-file, to wait longer), EHOSTUNREACH and the like when the kernel cannot
//  reach it, ETIMEDOUT when something listens but no PING reply came, EACCES or EKEYREJECTED
//  for CURVE (see curve_secret_file), EINVAL for a bad endpoint or certificate. Caller owns
//  the return value and must destroy it with kvpool_destroy. options may be NULL for the
//  defaults.
KVPOOL_EXPORT kvpool_t *kvpool_connect (const char *endpoint, const kvpool_options_t *options);
//  Why this thread's last kvpool_connect failed, in words, e.g. "connection refused: nothing
//  listens on tcp://127.0.0.1:1 (Connection refused)"; "" after one that succeeded.
KVPOOL_EXPORT const char *kvpool_connect_error (void);

//  Closes the connection; does nothing on NULL; sets *self_p to NULL.
KVPOOL_EXPORT void kvpool_destroy (kvpool_t **self_p);

//  Switches the same-machine fast path on or off. Switching on succeeds only when the node is
//  on this machine and its segments can be mapped. Returns true if the fast path is now on.
KVPOOL_EXPORT bool kvpool_set_fast_path (kvpool_t *self, bool enabled);
KVPOOL_EXPORT bool kvpool_fast_path (kvpool_t *self);

//  With the fast path on, gets into caller buffers, exist and get-size first look in the
//  node's same-machine read index (a shared-memory table of committed objects): no round
//  trip at all. Such reads are validated against concurrent removal and lease the object as
//  a read through the node does (the time of the read is left in the index, where the node
//  looks before it removes the object). A node without a master also vouches there for the
//  keys it does not hold, which are then answered absent with no round trip either. Switch
//  the index off to have every read ask the node. On by default. Returns true if reads now
//  use the index.
KVPOOL_EXPORT bool kvpool_set_index (kvpool_t *self, bool enabled);

//  ---- the process's hot cache -------------------------------------------------------
//  A client whose node is on another machine may keep values it reads often in its own
//  memory: whole values of at most max_object bytes (0: 16 MiB), least recently used first
//  to go past bytes in all, each kept by the read that brought it the admit-th time (0: 2)
//  within window_ms (0: 60000); admit 1 keeps a value on its first read. A get of a kept
//  value asks the node one EXIST naming the value's version (Reply.versions), one for all
//  the kept keys of the call, and serves those the node still holds at that version from
//  memory: no value bytes travel, and a key removed or written again since (once the
//  remove or upsert was acknowledged) is read from the node as if never kept. Serves
//  kvpool_get, kvpool_get_batch, the get_into calls and their ranges; not used while the
//  fast path is on (the node's machine: its own hot cache serves there).
//  One cache per process per node endpoint, shared by every kvpool_t connected to it (the
//  last call's settings apply to it; a smaller size evicts what no longer fits); bytes 0
//  lets go of it for this connection. Returns KVPOOL_OK, KVPOOL_INVALID_PARAMS or
//  KVPOOL_INTERNAL_ERROR (out of memory).
KVPOOL_EXPORT int kvpool_set_hot_cache (kvpool_t *self, uint64_t bytes, uint32_t admit,
                                        uint64_t window_ms, uint64_t max_object);

//  The counters of the cache this connection uses (all zero without one). Reads are those
//  of gets while the cache was in use: each is a hit or a miss.
typedef struct {
    uint64_t hits;          //  reads served from the cache, after the node confirmed the version
    uint64_t misses;        //  reads the cache did not serve (not kept, or no longer current)
    uint64_t bytes;         //  bytes of values kept now
    uint64_t admissions;    //  values kept
    uint64_t evictions;     //  values let go for room
    uint64_t invalidations; //  values dropped because the node no longer had their version
    uint64_t entries;       //  values kept now
    uint64_t capacity;      //  the size set (kvpool_set_hot_cache's bytes)
} kvpool_hot_cache_stats_t;

//  Fills stats; returns KVPOOL_OK, or KVPOOL_INVALID_PARAMS for a NULL argument.
KVPOOL_EXPORT int kvpool_hot_cache_stats (kvpool_t *self, kvpool_hot_cache_stats_t *stats);

//  The reason text of the last error reply from the server ("" if none).
KVPOOL_EXPORT const char *kvpool_last_error (kvpool_t *self);

//  One value for a put: a caller's buffer, or several (gathered in order).
typedef struct {
    const void *data;
    size_t size;
} kvpool_iov_t;

//  One destination for a get: several buffers are filled in order (scatter).
typedef struct {
    void *data;
    size_t size;
} kvpool_buf_t;

typedef struct {
    uint32_t replica_num;                  //  0 means 1
    const char *const *preferred_segments; //  segment names, may be NULL
    size_t preferred_segment_count;
    bool soft_pin;
    uint64_t soft_pin_ttl_ms; //  0: server default
    bool hard_pin;
} kvpool_put_options_t;

KVPOOL_EXPORT int kvpool_ping (kvpool_t *self);

//  ---- single-key operations ----------------------------------------------------------
//  opts may be NULL (one replica, no pin).
KVPOOL_EXPORT int kvpool_put (kvpool_t *self, const char *key, const void *data, size_t size,
                              const kvpool_put_options_t *opts);
//  Puts the concatenation of parts as one value.
KVPOOL_EXPORT int kvpool_put_parts (kvpool_t *self, const char *key, const kvpool_iov_t *parts,
                                    size_t nparts, const kvpool_put_options_t *opts);
//  Gets a value into a buffer the library allocates with malloc. Caller owns *data_p and
//  frees it with free(). Returns KVPOOL_OK or a negative status.
KVPOOL_EXPORT int kvpool_get (kvpool_t *self, const char *key, void **data_p, size_t *size_p);
//  As kvpool_get, and *version_p is the value's version: unique to one put or upsert of the
//  key in the cluster (a later write of the key has another), 0 when the node named none.
//  Read over the socket, never from shared memory or a cache, so that the bytes and the
//  version are one reply's.
KVPOOL_EXPORT int kvpool_get_version (kvpool_t *self, const char *key, void **data_p,
                                      size_t *size_p, uint64_t *version_p);
//  Gets at most length bytes of a value, from byte offset, into the caller's buffer: only
//  that range travels. Returns the bytes written (fewer than length at the value's end; 0 at
//  offset == size), or a negative status (KVPOOL_INVALID_PARAMS past the end).
KVPOOL_EXPORT int64_t kvpool_get_range_into (kvpool_t *self, const char *key, uint64_t offset,
                                             void *buffer, size_t length);
//  Replaces the key's value, or puts it if the key is new: a reader sees the whole old value
//  or the whole new one, and the old value's space is freed once its readers are done.
//  KVPOOL_REPLICA_IS_NOT_READY while the key is being written (put-start). Goes over the
//  socket even on the node's machine.
KVPOOL_EXPORT int kvpool_upsert (kvpool_t *self, const char *key, const void *data, size_t size,
                                 const kvpool_put_options_t *opts);
KVPOOL_EXPORT int kvpool_upsert_parts (kvpool_t *self, const char *key, const kvpool_iov_t *parts,
                                       size_t nparts, const kvpool_put_options_t *opts);
//  Gets a value into the caller's buffer. Returns the value's size, or a negative status
//  (KVPOOL_BUFFER_OVERFLOW when capacity is smaller than the value; nothing is written then).
KVPOOL_EXPORT int64_t kvpool_get_into (kvpool_t *self, const char *key, void *buffer,
                                       size_t capacity);
//  Returns 1 if the key exists (committed), 0 if not, or a negative status.
KVPOOL_EXPORT int kvpool_exist (kvpool_t *self, const char *key);
//  Returns the value's size, or a negative status (KVPOOL_OBJECT_NOT_FOUND).
KVPOOL_EXPORT int64_t kvpool_get_size (kvpool_t *self, const char *key);
KVPOOL_EXPORT int kvpool_remove (kvpool_t *self, const char *key, bool force);
//  Returns the number of objects removed, or a negative status.
KVPOOL_EXPORT int64_t kvpool_remove_by_regex (kvpool_t *self, const char *pattern, bool force);
//  kvpool_remove_by_regex, and what else matched: *matched the committed objects whose key
//  matched, *kept how many of them stayed, each for a read lease or a same-machine read in
//  progress (force removes them; in a cluster removes are forced, and kept is 0). Either
//  pointer may be NULL; both are 0 on failure. Returns the number removed (matched - kept),
//  or a negative status.
KVPOOL_EXPORT int64_t kvpool_remove_by_regex_counts (kvpool_t *self, const char *pattern,
                                                     bool force, uint64_t *matched, uint64_t *kept);
KVPOOL_EXPORT int64_t kvpool_remove_all (kvpool_t *self, bool force);
//  Drains transfers in flight, then removes every object past leases. Returns the number
//  removed or a negative status.
KVPOOL_EXPORT int64_t kvpool_reset (kvpool_t *self);

//  ---- batch operations: n keys, one outcome per key ---------------------------------
//  statuses[i]: KVPOOL_OK or a negative status for keys[i].
KVPOOL_EXPORT int kvpool_put_batch (kvpool_t *self, size_t n, const char *const *keys,
                                    const void *const *data, const size_t *sizes,
                                    const kvpool_put_options_t *opts, int *statuses);
//  As kvpool_put_batch, always over the socket, and placed[i] is how many replicas keys[i]
//  got: fewer than opts->replica_num when the cluster has fewer nodes (a node, segments),
//  which is no error (the key is stored; a cluster restores the rest as nodes join); 0 for
//  a key that failed.
KVPOOL_EXPORT int kvpool_put_batch_placed (kvpool_t *self, size_t n, const char *const *keys,
                                           const void *const *data, const size_t *sizes,
                                           const kvpool_put_options_t *opts, int *statuses,
                                           uint32_t *placed);
//  Each value is the concatenation of nparts[i] buffers parts[i][0..].
KVPOOL_EXPORT int kvpool_put_batch_parts (kvpool_t *self, size_t n, const char *const *keys,
                                          const kvpool_iov_t *const *parts, const size_t *nparts,
                                          const kvpool_put_options_t *opts, int *statuses);
//  results[i]: bytes written into buffers[i], or a negative status.
KVPOOL_EXPORT int kvpool_get_batch_into (kvpool_t *self, size_t n, const char *const *keys,
                                         void *const *buffers, const size_t *capacities,
                                         int64_t *results);
//  Scatter form: value i is written across nbufs[i] buffers bufs[i][0..] in order.
//  results[i]: bytes written, or a negative status (BUFFER_OVERFLOW if they are too small).
KVPOOL_EXPORT int kvpool_get_batch_into_parts (kvpool_t *self, size_t n, const char *const *keys,
                                               const kvpool_buf_t *const *bufs, const size_t *nbufs,
                                               int64_t *results);
//  Ranges of n values: results[i] is the bytes of keys[i] from offsets[i] written into
//  buffers[i] (at most lengths[i]), or a negative status.
KVPOOL_EXPORT int kvpool_get_ranges_into (kvpool_t *self, size_t n, const char *const *keys,
                                          const uint64_t *offsets, void *const *buffers,
                                          const size_t *lengths, int64_t *results);
//  Upserts n values, each the concatenation of nparts[i] buffers parts[i][0..].
KVPOOL_EXPORT int kvpool_upsert_batch_parts (kvpool_t *self, size_t n, const char *const *keys,
                                             const kvpool_iov_t *const *parts, const size_t *nparts,
                                             const kvpool_put_options_t *opts, int *statuses);
//  results[i]: 1, 0 or a negative status.
KVPOOL_EXPORT int kvpool_exist_batch (kvpool_t *self, size_t n, const char *const *keys,
                                      int *results);
//  How many leading blocks of keys are stored: keys holds blocks x ranks keys, block-major
//  (keys[b * ranks + r]); a block counts only if every one of its ranks' keys exists, and the
//  first block with one missing ends the count. The keys of the counted blocks get read
//  leases (they stay until the engine loads them). One request to the node (several past the
//  node's --max-keys), none at all when the same-machine index shows every block. Returns the
//  count, or a negative status (a NULL or empty key counts as missing).
KVPOOL_EXPORT int64_t kvpool_prefix_match (kvpool_t *self, size_t blocks, size_t ranks,
                                           const char *const *keys);
//  results[i]: size or a negative status.
KVPOOL_EXPORT int kvpool_get_size_batch (kvpool_t *self, size_t n, const char *const *keys,
                                         int64_t *results);
//  For bindings, whose strings know their lengths: kvpool_exist_batch and
//  kvpool_get_size_batch with lens[i] the length of keys[i] (its strlen), so that the library
//  does not measure each key again. A key whose byte at lens[i] is not a NUL gets
//  KVPOOL_INVALID_KEY; the caller vouches that no NUL comes before it.
KVPOOL_EXPORT int kvpool_exist_batch_lens (kvpool_t *self, size_t n, const char *const *keys,
                                           const size_t *lens, int *results);
KVPOOL_EXPORT int kvpool_get_size_batch_lens (kvpool_t *self, size_t n, const char *const *keys,
                                              const size_t *lens, int64_t *results);
//  The _lens calls answered on this machine alone, for a binding that holds a lock while it
//  calls (Python's GIL): no message is sent and nothing is waited for. A key the node's
//  same-machine read index shows gets its result (1, or its size; a read lease, as any read),
//  a key the node vouches it does not hold 0 (or KVPOOL_OBJECT_NOT_FOUND: a node without a
//  master vouches for absence, docs/architecture.md), an invalid key KVPOOL_INVALID_KEY;
//  the positions of the others (in order, each below n)
//  are written to rest[0 .. *nrest), and their results are left as they were: ask the _lens
//  call for those. Off the node's machine, or with the index off, every key is in rest.
//  Returns 0, or a negative status (nothing answered).
KVPOOL_EXPORT int kvpool_exist_batch_local (kvpool_t *self, size_t n, const char *const *keys,
                                            const size_t *lens, int *results, size_t *rest,
                                            size_t *nrest);
KVPOOL_EXPORT int kvpool_get_size_batch_local (kvpool_t *self, size_t n, const char *const *keys,
                                               const size_t *lens, int64_t *results, size_t *rest,
                                               size_t *nrest);
KVPOOL_EXPORT int kvpool_remove_batch (kvpool_t *self, size_t n, const char *const *keys,
                                       bool force, int *statuses);

//  Values returned by kvpool_get_batch without a copy: each points into a message the
//  library received. They stay valid until kvpool_values_destroy.
typedef struct _kvpool_values_t kvpool_values_t;
//  Gets n values. Caller owns *values_p and must destroy it. statuses[i] as for get.
KVPOOL_EXPORT int kvpool_get_batch (kvpool_t *self, size_t n, const char *const *keys,
                                    kvpool_values_t **values_p, int *statuses);
KVPOOL_EXPORT const void *kvpool_values_data (kvpool_values_t *self, size_t index);
KVPOOL_EXPORT size_t kvpool_values_size (kvpool_values_t *self, size_t index);
KVPOOL_EXPORT void kvpool_values_destroy (kvpool_values_t **self_p);

//  ---- low-level two-phase put and replica lists -------------------------------------
typedef struct {
    uint32_t segment_id;
    uint64_t offset;
} kvpool_replica_t;

#define KVPOOL_MAX_REPLICAS 8

typedef struct {
    int status;
    uint64_t size;
    uint32_t replica_count;
    kvpool_replica_t replicas[KVPOOL_MAX_REPLICAS];
} kvpool_placement_t;

//  Reserves space for n keys of the given sizes. placements[i] says where key i's replicas
//  are to be written. The keys stay invisible to readers until kvpool_put_end.
KVPOOL_EXPORT int kvpool_put_start (kvpool_t *self, size_t n, const char *const *keys,
                                    const uint64_t *sizes, const kvpool_put_options_t *opts,
                                    kvpool_placement_t *placements);
KVPOOL_EXPORT int kvpool_put_end (kvpool_t *self, size_t n, const char *const *keys, int *statuses);
KVPOOL_EXPORT int kvpool_put_revoke (kvpool_t *self, size_t n, const char *const *keys,
                                     int *statuses);
//  Where committed keys' replicas are. With pin, the bytes stay in place until
//  kvpool_release (or the lease ends).
KVPOOL_EXPORT int kvpool_get_replica_list (kvpool_t *self, size_t n, const char *const *keys,
                                           bool pin, kvpool_placement_t *placements);
KVPOOL_EXPORT int kvpool_release (kvpool_t *self, size_t n, const char *const *keys, int *statuses);

//  ---- segments ----------------------------------------------------------------------
typedef struct {
    uint32_t id;
    char name[64];
    uint64_t size;
    uint64_t used;
} kvpool_segment_t;

//  ---- the cluster -------------------------------------------------------------------
//  A node of the cluster (LOCATE, NODES). A one-process store is a cluster of one.
typedef struct {
    char node_id[128];
    char host_id[64];          //  its machine
    char client_endpoint[256]; //  where clients reach it
    uint64_t capacity;         //  bytes of memory it contributes
    uint64_t free;             //  of which free, as it last reported
    uint64_t objects;          //  kvpool_nodes: keys it holds
    uint64_t last_heard_ms;    //  kvpool_nodes: since the master last heard from it
    bool alive;
} kvpool_node_t;

//  Lists up to capacity of the cluster's nodes (alive or not) into nodes; returns how many
//  there are in all, or a negative status.
KVPOOL_EXPORT int kvpool_nodes (kvpool_t *self, kvpool_node_t *nodes, size_t capacity);
//  The nodes that hold key: up to capacity of them into nodes, its size into *size_p (may
//  be NULL); returns how many hold it, or a negative status (OBJECT_NOT_FOUND).
KVPOOL_EXPORT int kvpool_locate (kvpool_t *self, const char *key, uint64_t *size_p,
                                 kvpool_node_t *nodes, size_t capacity);

//  Lists up to capacity mounted segments into segments; returns how many there are in all
//  (may be more than capacity), or a negative status.
KVPOOL_EXPORT int kvpool_segments (kvpool_t *self, kvpool_segment_t *segments, size_t capacity);
//  Asks the node to mount size bytes of memory this process contributes, as a segment owned
//  by this connection. On success *id_p is its segment id. The node keeps other clients'
//  data there, so it mounts only memory that cannot shrink under it (a shrunk mapping would
//  kill it with SIGBUS): shm_name must be "/proc/<pid>/fd/<fd>" of a memfd sealed with
//  F_SEAL_SHRINK (memfd_create with MFD_ALLOW_SEALING, ftruncate, fcntl F_ADD_SEALS), held
//  open while mounted; anything else is KVPOOL_INVALID_PARAMS with the reason in
//  kvpool_last_error. The same object under a second name is KVPOOL_SEGMENT_ALREADY_EXISTS.
KVPOOL_EXPORT int kvpool_mount_segment (kvpool_t *self, const char *shm_name, uint64_t size,
                                        uint32_t *id_p);
//  Unmounts a segment: every object loses its replica there (forced, past leases); one left
//  with no replica is removed, the others stay on their other segments.
KVPOOL_EXPORT int kvpool_unmount_segment (kvpool_t *self, uint32_t id);

//  Gives the pool size bytes of this process's memory, as Mooncake's embedded client does
//  with its global segment: makes such a sealed memfd (pages committed up front), maps it,
//  and has the node mount it as a segment owned by this connection. On success *id_p is its
//  segment id and, when name_p is not NULL, *name_p its name (for preferred_segments), valid
//  until the memory is given back. Needs the node on this machine. Returns 0 or a negative
//  status (KVPOOL_NO_AVAILABLE_HANDLE when the memory can't be had).
KVPOOL_EXPORT int kvpool_mount_memory (kvpool_t *self, uint64_t size, uint32_t *id_p,
                                       const char **name_p);
//  Gives back memory that kvpool_mount_memory gave: the node takes the replicas in it off
//  their objects (removing those left with none, forced) and unmounts it, then it is freed.
//  kvpool_destroy gives back what is left. KVPOOL_SEGMENT_NOT_FOUND if id is not memory this
//  connection gave.
KVPOOL_EXPORT int kvpool_unmount_memory (kvpool_t *self, uint32_t id);

//  ---- stats -------------------------------------------------------------------------
//  The node's statistics: one member per field of protocol/kvpool.proto's message Stats, in
//  its order, with the comment there (KVPOOL_STATS_FIELDS).
typedef struct {
#define KVPOOL_STATS_MEMBER(type, name, text) type name;
    KVPOOL_STATS_FIELDS (KVPOOL_STATS_MEMBER)
#undef KVPOOL_STATS_MEMBER
} kvpool_stats_t;

KVPOOL_EXPORT int kvpool_stats (kvpool_t *self, kvpool_stats_t *stats);

//  One client operation's requests as the node answered them since it started.
#define KVPOOL_LATENCY_BUCKETS 17
//  The buckets' upper bounds in microseconds; the last bucket counts what is above them all.
#define KVPOOL_LATENCY_BOUNDS_US                                                                   \
    {                                                                                              \
        10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000, \
            5000000                                                                                \
    }
typedef struct {
    int op;                  //  kvpool.v1.Op
    const char *name;        //  its name, e.g. "PUT" (static)
    uint64_t requests;       //  answered
    uint64_t failures;       //  answered with a request-level error (a miss is not one)
    uint64_t latency_sum_us; //  arrival at the node to reply, summed
    uint64_t latency_buckets[KVPOOL_LATENCY_BUCKETS]; //  each bucket's own count
} kvpool_op_stats_t;

//  A setting of the node, by the name of its kvpoold option without --: its value as text
//  into out (size bytes, NUL-terminated). With value not NULL the setting changes to it
//  first, for those that may change while the node runs (log-level, lease-ttl, the
//  eviction and disk watermarks; kvpoold --help marks them): INVALID_PARAMS, with the
//  reason in kvpool_last_error, for any other, an unknown name or a value out of bounds.
//  A same-machine client of the node's user or group only (PERMISSION_DENIED otherwise).
KVPOOL_EXPORT int kvpool_config (kvpool_t *self, const char *name, const char *value, char *out,
                                 size_t size);

//  The master the node talks to, as the last kvpool_stats or kvpool_stats_ops said: "" for a
//  one-process store, or before either was called. How the link is: the stats'
//  master_connected, master_silence_ms, master_term and master_lease_ms. Owned by self,
//  valid until the next stats call.
KVPOOL_EXPORT const char *kvpool_master_endpoint (kvpool_t *self);

//  How the drain of a node of a cluster stands (kvpool_node_drain).
typedef struct {
    uint64_t sole;        //  objects only that node holds: a drain is done when none is left
    uint64_t short_count; //  objects it holds with fewer replicas elsewhere than asked
    bool draining;        //  no new placements on it; what it holds is copied elsewhere
} kvpool_drain_t;

//  Drains node_id, a node of the node's cluster (docs/cluster.md "Repair and drain"):
//  action "start" (no new placements on it, and every object it alone holds is copied to
//  other nodes, in the background), "stop", or NULL to ask how it stands; *state (may be
//  NULL) as the master answers. A same-machine client of the node's user or group only
//  (PERMISSION_DENIED otherwise); INVALID_PARAMS on one process or for an unknown node.
KVPOOL_EXPORT int kvpool_node_drain (kvpool_t *self, const char *node_id, const char *action,
                                     kvpool_drain_t *state);

//  kvpool_stats, and the operations clients asked for: up to max of them into ops (NULL
//  with max 0 for none), *count the number the node reported.
KVPOOL_EXPORT int kvpool_stats_ops (kvpool_t *self, kvpool_stats_t *stats, kvpool_op_stats_t *ops,
                                    size_t max, size_t *count);

#ifdef __cplusplus
}
#endif

#endif
