/*  kvpool_client.c - libkvpool's public API (include/kvpool.h): the top layer of the client
    library.

    The layers, each calling only those below it:
      kvpool_client.c   the public API: checks the caller's arguments; chooses between the
                        fast path and the socket for puts, exist and get-size, and for each
                        get shape the sink its bytes land in
      resolve.c         the read path of every get: the same machine, the node, the holders
      local_hot_cache.c the process's cache of values read often, off the node's machine
      fast_path.c       the same-machine path: memcpy to and from the node's segments; hands
                        back the keys it cannot serve
      memory.c          memory this process gives the pool
      socket_ops.c      every operation as requests over the socket, values included
      sink.c            where a get's bytes land
      segment_view.c    a connection's segment id -> the process's mapping
      batch.c           keys of a request, copies of a call, chunks of a socket batch
      connection.c      the socket: requests, replies, one-way sends
      process.c         what the process shares: the ZeroMQ context, the node's mappings
    A kvpool_t is a connection, its fast path, the memory it gave and, when set, a reference
    to the process's hot cache of its node. Every outcome the layers below compute is an
    int64_t per caller index (batch.h); here it becomes the int or int64_t of each public
    signature.

    The fast path serves puts of KVPC_FAST_PUT_MIN bytes or more, gets of whole values into
    caller buffers, and exist / get-size through the node's read index; everything else goes
    over the socket, as does every call with the fast path off. No layer falls back by
    calling another: what the fast path cannot serve comes back here (puts) or to the
    resolver (gets), which sends it on.
*/
#include "kvpool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <czmq.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "client/batch.h"
#include "client/connection.h"
#include "client/fast_path.h"
#include "client/local_hot_cache.h"
#include "client/memory.h"
#include "client/resolve.h"
#include "client/sink.h"
#include "client/socket_ops.h"
#include "protocol/status.h"

#define KVPC_DEFAULT_TIMEOUT_MS 5000

struct _kvpool_t {
    kvpc_conn_t *conn;
    kvpc_fast_path_t *fast_path; //  made at connect, on while segments are mapped
    kvpc_memory_t *memory;       //  memory this connection gave the pool
    kvpc_hot_cache_t *hot_cache; //  the process's cache of this node's values, or NULL
};

//  ---- status names -------------------------------------------------------------------------

const char *
kvpool_strerror (int status)
{
    return kvp_strerror (status);
}

const char *
kvpool_status_name (int status)
{
    return kvp_status_name (status);
}

//  ---- the connection -----------------------------------------------------------------------

void
kvpool_options_init (kvpool_options_t *options)
{
    memset (options, 0, sizeof *options);
    options->timeout_ms = KVPC_DEFAULT_TIMEOUT_MS;
    options->connect_timeout_ms = 0;
    options->fast_path = 1;
}

//  Reads the CURVE keys the options name into curve. Returns 0, 1 when the options name
//  none, or -1 with errno EINVAL (one file alone, or not a certificate) or the file's error.
static int
s_curve_load (const kvpool_options_t *options, kvpc_curve_t *curve)
{
    if (!options->curve_secret_file && !options->curve_server_file)
        return 1;
    if (!options->curve_secret_file || !options->curve_server_file) {
        errno = EINVAL;
        return -1;
    }
    const char *files[2] = {options->curve_secret_file, options->curve_server_file};
    for (int i = 0; i < 2; i++) {
        if (access (files[i], R_OK) != 0)
            return -1;
        zcert_t *cert = zcert_load (files[i]);
        const char *public_key = cert ? zcert_public_txt (cert) : "";
        const char *secret_key = cert ? zcert_secret_txt (cert) : "";
        //  (A certificate read from a public file has an all-zero secret key.)
        bool ok = strlen (public_key) == 40
                  && (i == 1 || strcmp (secret_key, "0000000000000000000000000000000000000000"));
        if (ok && i == 0) {
            memcpy (curve->public_key, public_key, 41);
            memcpy (curve->secret_key, secret_key, 41);
        }
        else if (ok)
            memcpy (curve->server_key, public_key, 41);
        zcert_destroy (&cert);
        if (!ok) {
            errno = EINVAL;
            return -1;
        }
    }
    return 0;
}

kvpool_t *
kvpool_connect (const char *endpoint, const kvpool_options_t *options)
{
    kvpool_options_t defaults;
    if (!options) {
        kvpool_options_init (&defaults);
        options = &defaults;
    }
    if (!endpoint)
        endpoint = KVPOOL_DEFAULT_ENDPOINT;
    //  "host:port", as people write an address, means tcp://host:port.
    char with_scheme[512];
    if (!strstr (endpoint, "://")) {
        if (snprintf (with_scheme, sizeof with_scheme, "tcp://%s", endpoint)
            >= (int) sizeof with_scheme) {
            kvpc_set_connect_error ("the endpoint is too long");
            errno = EINVAL;
            return NULL;
        }
        endpoint = with_scheme;
    }
    kvpc_curve_t curve;
    int has_curve = s_curve_load (options, &curve);
    if (has_curve < 0) {
        int saved = errno;
        if (saved == EINVAL)
            kvpc_set_connect_error ("CURVE needs a certificate file each for curve_secret_file "
                                    "and curve_server_file (make them with kvpool keygen)");
        else
            kvpc_set_connect_error ("a CURVE certificate file: %s", strerror (saved));
        errno = saved;
        return NULL;
    }
    kvpool_t *self = calloc (1, sizeof *self);
    if (!self) {
        kvpc_set_connect_error ("out of memory");
        return NULL;
    }
    int timeout = options->timeout_ms > 0 ? options->timeout_ms : KVPC_DEFAULT_TIMEOUT_MS;
    self->conn = kvpc_conn_new (endpoint, timeout, options->connect_timeout_ms,
                                options->keep_endpoint != 0, has_curve == 0 ? &curve : NULL);
    if (self->conn) {
        self->fast_path = kvpc_fast_path_new (self->conn);
        self->memory = kvpc_memory_new (self->conn);
    }
    if (!self->conn || !self->fast_path || !self->memory) {
        int saved = self->conn ? ENOMEM : errno;
        if (self->conn)
            kvpc_set_connect_error ("out of memory");
        kvpool_destroy (&self);
        errno = saved;
        return NULL;
    }
    //  The fast path is an optimisation: when anything about it fails, the socket path
    //  does the work.
    //  (Only on the node's ipc endpoint: keep_endpoint on a tcp one leaves the shared-memory
    //  operations refused, so every call takes the socket.)
    if (options->fast_path && kvpc_conn_same_host (self->conn)
        && kvpc_conn_on_local_endpoint (self->conn))
        kvpc_fast_path_open (self->fast_path);
    kvpc_clear_error (self->conn);
    return self;
}

const char *
kvpool_connect_error (void)
{
    return kvpc_connect_error ();
}

void
kvpool_destroy (kvpool_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpool_t *self = *self_p;
    //  The last TOUCH goes first, one-way: the connection lets it leave before its socket
    //  closes (kvpc_conn_destroy).
    if (self->fast_path)
        kvpc_index_report (self->fast_path);
    kvpc_memory_destroy (&self->memory);
    kvpc_hot_cache_release (&self->hot_cache);
    kvpc_fast_path_destroy (&self->fast_path);
    kvpc_conn_destroy (&self->conn);
    free (self);
    *self_p = NULL;
}

bool
kvpool_set_fast_path (kvpool_t *self, bool enabled)
{
    if (!self)
        return false;
    if (!enabled) {
        kvpc_fast_path_close (self->fast_path);
        return false;
    }
    if (!kvpc_fast_path_on (self->fast_path) && kvpc_conn_same_host (self->conn)
        && kvpc_conn_on_local_endpoint (self->conn))
        kvpc_fast_path_open (self->fast_path);
    return kvpc_fast_path_on (self->fast_path);
}

bool
kvpool_fast_path (kvpool_t *self)
{
    return self && kvpc_fast_path_on (self->fast_path);
}

bool
kvpool_set_index (kvpool_t *self, bool enabled)
{
    if (!self)
        return false;
    return kvpc_fast_path_use_index (self->fast_path, enabled);
}

int
kvpool_set_hot_cache (kvpool_t *self, uint64_t bytes, uint32_t admit, uint64_t window_ms,
                      uint64_t max_object)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    kvpc_hot_cache_release (&self->hot_cache);
    if (bytes == 0)
        return KVPOOL_OK;
    self->hot_cache = kvpc_hot_cache_acquire (kvpc_conn_endpoint (self->conn), bytes, admit,
                                              window_ms, max_object);
    if (!self->hot_cache) {
        kvpc_set_error (self->conn, "out of memory for the hot cache");
        return KVPOOL_INTERNAL_ERROR;
    }
    return KVPOOL_OK;
}

int
kvpool_hot_cache_stats (kvpool_t *self, kvpool_hot_cache_stats_t *stats)
{
    if (!self || !stats)
        return KVPOOL_INVALID_PARAMS;
    memset (stats, 0, sizeof *stats);
    if (self->hot_cache)
        kvpc_hot_cache_stats (self->hot_cache, stats);
    return KVPOOL_OK;
}

const char *
kvpool_last_error (kvpool_t *self)
{
    return self ? kvpc_conn_last_error (self->conn) : "";
}

int
kvpool_ping (kvpool_t *self)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    return kvpc_conn_ping (self->conn);
}

//  ---- keyed requests -----------------------------------------------------------------------

//  Every request of keys without values comes here. On the node's machine, EXIST and
//  GET_SIZE of keys in its read index are answered without asking it. lens: the keys'
//  lengths, or NULL (measured here).
static int
s_keys_op (kvpool_t *self, Kvpool__V1__Op op, size_t n, const char *const *keys, const size_t *lens,
           bool force, kvpc_outcome_t as, int64_t *results)
{
    if (!self || (n && (!keys || !results)))
        return KVPOOL_INVALID_PARAMS;
    kvpc_keys_t sent;
    int rc = kvpc_keys_collect (self->conn, n, keys, lens, &sent, results);
    if (rc)
        return rc;
    if (kvpc_fast_path_on (self->fast_path)
        && (op == KVPOOL__V1__OP__EXIST || op == KVPOOL__V1__OP__GET_SIZE)) {
        kvpc_keys_t rest;
        kvpc_keys_init (&rest);
        kvpc_index_probe (self->fast_path, &sent, op == KVPOOL__V1__OP__GET_SIZE, results, &rest);
        kvpc_keys_fini (&sent);
        kvpc_keys_move (&sent, &rest);
    }
    if (sent.count)
        rc = kvpc_socket_keys (self->conn, op, &sent, force, as, results);
    kvpc_keys_fini (&sent);
    return rc;
}

//  s_keys_op with int outcomes.
static int
s_keys_op_int (kvpool_t *self, Kvpool__V1__Op op, size_t n, const char *const *keys,
               const size_t *lens, bool force, kvpc_outcome_t as, int *outcomes)
{
    if (!self || (n && (!keys || !outcomes)))
        return KVPOOL_INVALID_PARAMS;
    int64_t small[16];
    int64_t *results = n <= 16 ? small : malloc (n * sizeof *results);
    if (!results)
        return KVPOOL_INTERNAL_ERROR;
    int rc = s_keys_op (self, op, n, keys, lens, force, as, results);
    for (size_t i = 0; i < n; i++)
        outcomes[i] = (int) results[i];
    if (results != small)
        free (results);
    return rc;
}

//  EXIST or GET_SIZE answered here alone (kvpool_exist_batch_local): what the same-machine
//  index shows, and INVALID_KEY; the positions of the other keys go to rest. Results go to
//  exists (int), or to sizes when exists is NULL.
static int
s_keys_local (kvpool_t *self, size_t n, const char *const *keys, const size_t *lens, int *exists,
              int64_t *sizes, size_t *rest, size_t *nrest)
{
    if (!self || !nrest || (n && (!keys || !lens || !(exists || sizes) || !rest)))
        return KVPOOL_INVALID_PARAMS;
    *nrest = 0;
    bool plain = true; //  no NULL or empty key: the index can look every one up as given
    for (size_t i = 0; i < n && plain; i++)
        plain = keys[i] && lens[i] > 0;
    if (plain) {
        *nrest = kvpc_index_answer (self->fast_path, n, keys, lens, exists, sizes, rest);
        return KVPOOL_OK;
    }
    //  Otherwise the batch is collected as the full call collects it (each invalid key
    //  answered INVALID_KEY, the last error naming it), and every valid key is left.
    int64_t *answers = exists ? calloc (n, sizeof *answers) : sizes;
    if (!answers)
        return KVPOOL_INTERNAL_ERROR;
    kvpc_keys_t valid;
    int rc = kvpc_keys_collect (self->conn, n, keys, lens, &valid, answers);
    if (rc == 0) {
        for (size_t j = 0; j < valid.count; j++)
            rest[j] = valid.index[j];
        *nrest = valid.count;
        for (size_t i = 0; exists && i < n; i++)
            if (answers[i] == KVPOOL_INVALID_KEY)
                exists[i] = KVPOOL_INVALID_KEY;
        kvpc_keys_fini (&valid);
    }
    if (answers != sizes)
        free (answers);
    return rc;
}

int
kvpool_exist_batch_local (kvpool_t *self, size_t n, const char *const *keys, const size_t *lens,
                          int *results, size_t *rest, size_t *nrest)
{
    return s_keys_local (self, n, keys, lens, results, NULL, rest, nrest);
}

int
kvpool_get_size_batch_local (kvpool_t *self, size_t n, const char *const *keys, const size_t *lens,
                             int64_t *results, size_t *rest, size_t *nrest)
{
    return s_keys_local (self, n, keys, lens, NULL, results, rest, nrest);
}

//  One key, one outcome.
static int64_t
s_key_op (kvpool_t *self, Kvpool__V1__Op op, const char *key, bool force, kvpc_outcome_t as)
{
    int64_t outcome = KVPOOL_INVALID_PARAMS;
    s_keys_op (self, op, 1, &key, NULL, force, as, &outcome);
    return outcome;
}

int
kvpool_exist (kvpool_t *self, const char *key)
{
    return (int) s_key_op (self, KVPOOL__V1__OP__EXIST, key, false, KVPC_AS_EXIST);
}

int64_t
kvpool_get_size (kvpool_t *self, const char *key)
{
    return s_key_op (self, KVPOOL__V1__OP__GET_SIZE, key, false, KVPC_AS_SIZE);
}

int
kvpool_remove (kvpool_t *self, const char *key, bool force)
{
    return (int) s_key_op (self, KVPOOL__V1__OP__REMOVE, key, force, KVPC_AS_STATUS);
}

//  A key ends at the NUL found at byte at: the next starts after it.
#define KEYS_UNPACK_FOUND(at)                                                                      \
    do {                                                                                           \
        if (found == n)                                                                            \
            return KVPOOL_INVALID_PARAMS;                                                          \
        keys[found++] = start;                                                                     \
        start = blob + (at) + 1;                                                                   \
    } while (0)

int
kvpool_keys_unpack (const char *blob, size_t len, size_t n, const char **keys)
{
    if ((n && (!blob || !keys)) || (len && blob[len - 1] != '\0'))
        return KVPOOL_INVALID_PARAMS;
    //  One pass over the bytes; with SSE2, sixteen at a time (a thousand short keys take
    //  about a microsecond, a quarter of what a memchr per key costs).
    size_t found = 0, at = 0;
    const char *start = blob;
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128 ();
    for (; at + 16 <= len; at += 16) {
        __m128i bytes = _mm_loadu_si128 ((const __m128i *) (const void *) (blob + at));
        unsigned mask = (unsigned) _mm_movemask_epi8 (_mm_cmpeq_epi8 (bytes, zero));
        while (mask) {
            KEYS_UNPACK_FOUND (at + (size_t) __builtin_ctz (mask));
            mask &= mask - 1;
        }
    }
#endif
    for (; at < len; at++)
        if (blob[at] == '\0')
            KEYS_UNPACK_FOUND (at);
    return found == n ? KVPOOL_OK : KVPOOL_INVALID_PARAMS;
}

int
kvpool_exist_batch (kvpool_t *self, size_t n, const char *const *keys, int *results)
{
    return s_keys_op_int (self, KVPOOL__V1__OP__EXIST, n, keys, NULL, false, KVPC_AS_EXIST,
                          results);
}

int
kvpool_exist_batch_lens (kvpool_t *self, size_t n, const char *const *keys, const size_t *lens,
                         int *results)
{
    if (n && !lens)
        return KVPOOL_INVALID_PARAMS;
    return s_keys_op_int (self, KVPOOL__V1__OP__EXIST, n, keys, lens, false, KVPC_AS_EXIST,
                          results);
}

//  Whole blocks a request carries at most: well under the node's default --max-keys.
#define PREFIX_CHUNK_KEYS 65536
//  A prefix key's result before the same-machine probe: neither 1 (shown) nor 0 (absent).
#define PREFIX_UNKNOWN 2

int64_t
kvpool_prefix_match (kvpool_t *self, size_t blocks, size_t ranks, const char *const *keys)
{
    if (!self || ranks == 0 || ranks > UINT32_MAX || (blocks && !keys)
        || (blocks && ranks > SIZE_MAX / blocks))
        return KVPOOL_INVALID_PARAMS;
    //  A block with a key that cannot exist ends the prefix before it.
    size_t limit = 0;
    for (; limit < blocks; limit++) {
        size_t r = 0;
        while (r < ranks && kvpc_key_valid (keys[limit * ranks + r]))
            r++;
        if (r < ranks)
            break;
    }
    size_t n = limit * ranks;
    if (n == 0)
        return 0;
    int64_t *results = (int64_t *) calloc (n, sizeof (int64_t));
    if (!results)
        return KVPOOL_INTERNAL_ERROR;
    kvpc_keys_t sent;
    int rc = kvpc_keys_collect (self->conn, n, keys, NULL, &sent, results);
    if (rc) {
        free (results);
        return rc;
    }
    //  Blocks the same-machine index shows whole need no request (the probe leases them);
    //  nor does the rest when the first block not shown whole has a key the node vouches
    //  is absent (PREFIX_UNKNOWN: a key the probe left for the node).
    size_t first = 0;
    bool ended = false;
    if (kvpc_fast_path_on (self->fast_path)) {
        for (size_t i = 0; i < n; i++)
            results[i] = PREFIX_UNKNOWN;
        kvpc_keys_t rest;
        kvpc_keys_init (&rest);
        kvpc_index_probe (self->fast_path, &sent, false, results, &rest);
        kvpc_keys_fini (&rest);
        while (first < limit) {
            size_t r = 0;
            while (r < ranks && results[first * ranks + r] == 1)
                r++;
            if (r < ranks)
                break;
            first++;
        }
        for (size_t r = 0; first < limit && r < ranks; r++)
            ended |= results[first * ranks + r] == 0;
    }
    int64_t count = (int64_t) first;
    if (ended)
        limit = first;
    size_t chunk = PREFIX_CHUNK_KEYS / ranks ? PREFIX_CHUNK_KEYS / ranks : 1;
    for (size_t at = first; at < limit;) {
        size_t take = limit - at < chunk ? limit - at : chunk;
        Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
        request.op = KVPOOL__V1__OP__PREFIX_MATCH;
        request.keys = sent.wire + at * ranks;
        request.n_keys = take * ranks;
        request.ranks = (uint32_t) ranks;
        int64_t got = kvpc_socket_count (self->conn, &request, NULL);
        if (got < 0) {
            count = got;
            break;
        }
        count += got;
        if ((size_t) got < take)
            break; //  a block is missing: the prefix ends there
        at += take;
    }
    kvpc_keys_fini (&sent);
    free (results);
    return count;
}

int
kvpool_get_size_batch (kvpool_t *self, size_t n, const char *const *keys, int64_t *results)
{
    return s_keys_op (self, KVPOOL__V1__OP__GET_SIZE, n, keys, NULL, false, KVPC_AS_SIZE, results);
}

int
kvpool_get_size_batch_lens (kvpool_t *self, size_t n, const char *const *keys, const size_t *lens,
                            int64_t *results)
{
    if (n && !lens)
        return KVPOOL_INVALID_PARAMS;
    return s_keys_op (self, KVPOOL__V1__OP__GET_SIZE, n, keys, lens, false, KVPC_AS_SIZE, results);
}

int
kvpool_remove_batch (kvpool_t *self, size_t n, const char *const *keys, bool force, int *statuses)
{
    return s_keys_op_int (self, KVPOOL__V1__OP__REMOVE, n, keys, NULL, force, KVPC_AS_STATUS,
                          statuses);
}

int
kvpool_put_end (kvpool_t *self, size_t n, const char *const *keys, int *statuses)
{
    return s_keys_op_int (self, KVPOOL__V1__OP__PUT_END, n, keys, NULL, false, KVPC_AS_STATUS,
                          statuses);
}

int
kvpool_put_revoke (kvpool_t *self, size_t n, const char *const *keys, int *statuses)
{
    return s_keys_op_int (self, KVPOOL__V1__OP__PUT_REVOKE, n, keys, NULL, false, KVPC_AS_STATUS,
                          statuses);
}

int
kvpool_release (kvpool_t *self, size_t n, const char *const *keys, int *statuses)
{
    return s_keys_op_int (self, KVPOOL__V1__OP__RELEASE, n, keys, NULL, false, KVPC_AS_STATUS,
                          statuses);
}

//  ---- counts -------------------------------------------------------------------------------

int64_t
kvpool_remove_by_regex (kvpool_t *self, const char *pattern, bool force)
{
    return kvpool_remove_by_regex_counts (self, pattern, force, NULL, NULL);
}

int64_t
kvpool_remove_by_regex_counts (kvpool_t *self, const char *pattern, bool force, uint64_t *matched,
                               uint64_t *kept)
{
    if (matched)
        *matched = 0;
    if (kept)
        *kept = 0;
    if (!self || !pattern)
        return KVPOOL_INVALID_PARAMS;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__REMOVE_BY_REGEX;
    request.pattern = (char *) pattern;
    request.force = force;
    uint64_t left = 0;
    int64_t removed = kvpc_socket_count (self->conn, &request, &left);
    if (removed < 0)
        return removed;
    if (matched)
        *matched = (uint64_t) removed + left;
    if (kept)
        *kept = left;
    return removed;
}

int64_t
kvpool_remove_all (kvpool_t *self, bool force)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__REMOVE_ALL;
    request.force = force;
    return kvpc_socket_count (self->conn, &request, NULL);
}

int64_t
kvpool_reset (kvpool_t *self)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__RESET;
    return kvpc_socket_count (self->conn, &request, NULL);
}

//  ---- puts ---------------------------------------------------------------------------------

//  Below this many bytes a batch is put over the socket even on the node's machine: the
//  reservations' way takes two round trips (put-start, put-end), the socket one, and for
//  small values the round trip is the whole cost (4 KiB: 484 us against 337 us). A put by
//  address takes one too, and for values this small costs what the socket does.
#define KVPC_FAST_PUT_MIN (64u << 10)

static uint64_t
s_batch_bytes (const kvpc_keys_t *keys, const kvpc_value_t *values)
{
    uint64_t bytes = 0;
    for (size_t j = 0; j < keys->count; j++)
        bytes += values[keys->index[j]].size;
    return bytes;
}

//  ---- device memory --------------------------------------------------------------------------
//  A caller buffer may be GPU memory (device.h): when the process has a CUDA runtime, every
//  buffer of a put or a get into buffers is classified first, and a call with device buffers
//  arms the device layer, which the layers below ask which copies to stage. Without a
//  runtime nothing is asked.

//  Classifies one buffer. Returns 0, or -1 when the runtime could not tell (the last error
//  says why; the key is INVALID_PARAMS).
static int
s_classify (kvpool_t *self, kvpc_device_t *device, const void *ptr, size_t size)
{
    if (kvpc_device_classify (device, ptr, size) >= 0)
        return 0;
    kvpc_set_error (self->conn, "%s", kvpc_device_error (device));
    return -1;
}

static int
s_classify_parts (kvpool_t *self, kvpc_device_t *device, const kvpool_iov_t *parts, size_t count)
{
    for (size_t k = 0; k < count; k++)
        if (s_classify (self, device, parts[k].data, parts[k].size))
            return -1;
    return 0;
}

static int
s_classify_bufs (kvpool_t *self, kvpc_device_t *device, const kvpool_buf_t *bufs, size_t count)
{
    for (size_t k = 0; k < count; k++)
        if (s_classify (self, device, bufs[k].data, bufs[k].size))
            return -1;
    return 0;
}

//  The call's device layer when the process has a CUDA runtime, else NULL.
static kvpc_device_t *
s_device_begin (kvpool_t *self)
{
    kvpc_device_t *device = kvpc_conn_device (self->conn);
    return device && kvpc_device_begin (device) ? device : NULL;
}

//  Every put and upsert comes here: n values, value i the concatenation of
//  parts[i][0..nparts[i]). An upsert always goes over the socket: the node replaces the old
//  value in one step.
static int
s_put (kvpool_t *self, Kvpool__V1__Op op, size_t n, const char *const *keys,
       const kvpool_iov_t *const *parts, const size_t *nparts, const kvpool_put_options_t *opts,
       int64_t *results)
{
    kvpc_value_t small[8];
    kvpc_value_t *values = n <= 8 ? small : malloc (n * sizeof *values);
    if (!values) {
        for (size_t i = 0; i < n; i++)
            results[i] = KVPOOL_INTERNAL_ERROR;
        return KVPOOL_INTERNAL_ERROR;
    }
    kvpc_keys_t sent;
    kvpc_keys_init (&sent);
    kvpc_device_t *device = s_device_begin (self);
    int rc = KVPOOL_OK;
    for (size_t i = 0; i < n && rc == KVPOOL_OK; i++) {
        values[i] = (kvpc_value_t){parts[i], nparts[i], 0};
        bool valid = parts[i] || nparts[i] == 0;
        for (size_t p = 0; valid && p < nparts[i]; p++) {
            valid = parts[i][p].data || parts[i][p].size == 0;
            values[i].size += parts[i][p].size;
        }
        if (!kvpc_key_valid (keys[i])) {
            results[i] = KVPOOL_INVALID_KEY;
            kvpc_set_error (self->conn, "key %zu is %s", i, keys[i] ? "empty" : "NULL");
        }
        else if (!valid) {
            results[i] = KVPOOL_INVALID_PARAMS;
            kvpc_set_error (self->conn, "value of key '%s' has a NULL buffer", keys[i]);
        }
        else if (device && s_classify_parts (self, device, parts[i], nparts[i]))
            results[i] = KVPOOL_INVALID_PARAMS;
        else if (kvpc_keys_add (&sent, keys[i], i))
            rc = KVPOOL_INTERNAL_ERROR;
    }
    bool armed = device && kvpc_device_arm (device);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
    }
    else if (op == KVPOOL__V1__OP__PUT && kvpc_fast_path_on (self->fast_path)
             && !kvpc_conn_placed (self->conn)
             && s_batch_bytes (&sent, values) >= KVPC_FAST_PUT_MIN) {
        //  What the fast path hands back (a replica it cannot reach) goes over the socket.
        kvpc_keys_t rest;
        kvpc_keys_init (&rest);
        rc = kvpc_fast_put (self->fast_path, &sent, values, opts, results, &rest);
        if (rest.count)
            kvpc_socket_put (self->conn, op, &rest, values, opts, results);
        kvpc_keys_fini (&rest);
    }
    else
        rc = kvpc_socket_put (self->conn, op, &sent, values, opts, results);
    if (armed)
        kvpc_device_end (device);
    kvpc_keys_fini (&sent);
    if (values != small)
        free (values);
    return rc;
}

//  One value of parts: a put or an upsert.
static int
s_put_one (kvpool_t *self, Kvpool__V1__Op op, const char *key, const kvpool_iov_t *parts,
           size_t nparts, const kvpool_put_options_t *opts)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    int64_t outcome;
    s_put (self, op, 1, &key, &parts, &nparts, opts, &outcome);
    return (int) outcome;
}

//  n values of parts, a status each: puts or upserts.
static int
s_put_batch_parts (kvpool_t *self, Kvpool__V1__Op op, size_t n, const char *const *keys,
                   const kvpool_iov_t *const *parts, const size_t *nparts,
                   const kvpool_put_options_t *opts, int *statuses)
{
    if (!self || (n && (!keys || !parts || !nparts || !statuses)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    int64_t *results = malloc (n * sizeof *results);
    if (!results) {
        for (size_t i = 0; i < n; i++)
            statuses[i] = KVPOOL_INTERNAL_ERROR;
        return KVPOOL_INTERNAL_ERROR;
    }
    int rc = s_put (self, op, n, keys, parts, nparts, opts, results);
    for (size_t i = 0; i < n; i++)
        statuses[i] = (int) results[i];
    free (results);
    return rc;
}

int
kvpool_put (kvpool_t *self, const char *key, const void *data, size_t size,
            const kvpool_put_options_t *opts)
{
    kvpool_iov_t part = {data, size};
    return s_put_one (self, KVPOOL__V1__OP__PUT, key, &part, 1, opts);
}

int
kvpool_put_batch_placed (kvpool_t *self, size_t n, const char *const *keys, const void *const *data,
                         const size_t *sizes, const kvpool_put_options_t *opts, int *statuses,
                         uint32_t *placed)
{
    if (!self || !placed || (n && (!keys || !data || !sizes || !statuses)))
        return KVPOOL_INVALID_PARAMS;
    for (size_t i = 0; i < n; i++)
        placed[i] = 0;
    //  (over the socket: s_put takes no fast path while the connection counts replicas)
    kvpc_conn_set_placed (self->conn, placed);
    int rc = kvpool_put_batch (self, n, keys, data, sizes, opts, statuses);
    kvpc_conn_set_placed (self->conn, NULL);
    return rc;
}

int
kvpool_put_parts (kvpool_t *self, const char *key, const kvpool_iov_t *parts, size_t nparts,
                  const kvpool_put_options_t *opts)
{
    return s_put_one (self, KVPOOL__V1__OP__PUT, key, parts, nparts, opts);
}

int
kvpool_put_batch (kvpool_t *self, size_t n, const char *const *keys, const void *const *data,
                  const size_t *sizes, const kvpool_put_options_t *opts, int *statuses)
{
    if (!self || (n && (!keys || !data || !sizes || !statuses)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    kvpool_iov_t *iovs = malloc (n * sizeof *iovs);
    const kvpool_iov_t **parts = malloc (n * sizeof *parts);
    size_t *nparts = malloc (n * sizeof *nparts);
    int rc = KVPOOL_INTERNAL_ERROR;
    if (iovs && parts && nparts) {
        for (size_t i = 0; i < n; i++) {
            iovs[i] = (kvpool_iov_t){data[i], sizes[i]};
            parts[i] = &iovs[i];
            nparts[i] = 1;
        }
        rc = s_put_batch_parts (self, KVPOOL__V1__OP__PUT, n, keys, parts, nparts, opts, statuses);
    }
    else
        for (size_t i = 0; i < n; i++)
            statuses[i] = rc;
    free (iovs);
    free (parts);
    free (nparts);
    return rc;
}

int
kvpool_put_batch_parts (kvpool_t *self, size_t n, const char *const *keys,
                        const kvpool_iov_t *const *parts, const size_t *nparts,
                        const kvpool_put_options_t *opts, int *statuses)
{
    return s_put_batch_parts (self, KVPOOL__V1__OP__PUT, n, keys, parts, nparts, opts, statuses);
}

int
kvpool_upsert (kvpool_t *self, const char *key, const void *data, size_t size,
               const kvpool_put_options_t *opts)
{
    kvpool_iov_t part = {data, size};
    return s_put_one (self, KVPOOL__V1__OP__UPSERT, key, &part, 1, opts);
}

int
kvpool_upsert_parts (kvpool_t *self, const char *key, const kvpool_iov_t *parts, size_t nparts,
                     const kvpool_put_options_t *opts)
{
    return s_put_one (self, KVPOOL__V1__OP__UPSERT, key, parts, nparts, opts);
}

int
kvpool_upsert_batch_parts (kvpool_t *self, size_t n, const char *const *keys,
                           const kvpool_iov_t *const *parts, const size_t *nparts,
                           const kvpool_put_options_t *opts, int *statuses)
{
    return s_put_batch_parts (self, KVPOOL__V1__OP__UPSERT, n, keys, parts, nparts, opts, statuses);
}

//  ---- gets ---------------------------------------------------------------------------------

//  Every get into caller buffers comes here: the keys are checked and the buffers classified
//  here, and read through the resolver (resolve.h). With offsets (one a key), each key's
//  range from there, as much as its buffers hold.
static int
s_get_into (kvpool_t *self, size_t n, const char *const *keys, const kvpool_buf_t *const *bufs,
            const size_t *nbufs, const uint64_t *offsets, int64_t *results)
{
    kvpc_keys_t sent;
    kvpc_keys_init (&sent);
    kvpc_device_t *device = s_device_begin (self);
    int rc = KVPOOL_OK;
    for (size_t i = 0; i < n && rc == KVPOOL_OK; i++) {
        bool valid = bufs[i] || nbufs[i] == 0;
        for (size_t b = 0; valid && b < nbufs[i]; b++)
            valid = bufs[i][b].data || bufs[i][b].size == 0;
        if (!kvpc_key_valid (keys[i])) {
            results[i] = KVPOOL_INVALID_KEY;
            kvpc_set_error (self->conn, "key %zu is %s", i, keys[i] ? "empty" : "NULL");
        }
        else if (!valid) {
            results[i] = KVPOOL_INVALID_PARAMS;
            kvpc_set_error (self->conn, "buffer for key '%s' is NULL", keys[i]);
        }
        else if (device && s_classify_bufs (self, device, bufs[i], nbufs[i]))
            results[i] = KVPOOL_INVALID_PARAMS;
        else if (kvpc_keys_add (&sent, keys[i], i))
            rc = KVPOOL_INTERNAL_ERROR;
    }
    bool armed = device && kvpc_device_arm (device);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
    }
    else {
        kvpc_sink_t sink = kvpc_sink_buffers (bufs, nbufs, offsets);
        rc = kvpc_resolve_get (self->conn, self->fast_path, self->hot_cache, &sent, &sink, results);
    }
    if (armed)
        kvpc_device_end (device);
    kvpc_keys_fini (&sent);
    return rc;
}

int64_t
kvpool_get_into (kvpool_t *self, const char *key, void *buffer, size_t capacity)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    kvpool_buf_t buf = {buffer, capacity};
    const kvpool_buf_t *bufs = &buf;
    size_t nbufs = 1;
    int64_t outcome;
    s_get_into (self, 1, &key, &bufs, &nbufs, NULL, &outcome);
    return outcome;
}

//  n gets into one buffer each (whole values, or ranges from offsets when given).
static int
s_get_buffers (kvpool_t *self, size_t n, const char *const *keys, void *const *buffers,
               const size_t *capacities, const uint64_t *offsets, int64_t *results)
{
    if (n == 0)
        return KVPOOL_OK;
    kvpool_buf_t *bufs = malloc (n * sizeof *bufs);
    const kvpool_buf_t **lists = malloc (n * sizeof *lists);
    size_t *nbufs = malloc (n * sizeof *nbufs);
    int rc = KVPOOL_INTERNAL_ERROR;
    if (bufs && lists && nbufs) {
        for (size_t i = 0; i < n; i++) {
            bufs[i] = (kvpool_buf_t){buffers[i], capacities[i]};
            lists[i] = &bufs[i];
            nbufs[i] = 1;
        }
        rc = s_get_into (self, n, keys, lists, nbufs, offsets, results);
    }
    else
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
    free (bufs);
    free (lists);
    free (nbufs);
    return rc;
}

int
kvpool_get_batch_into (kvpool_t *self, size_t n, const char *const *keys, void *const *buffers,
                       const size_t *capacities, int64_t *results)
{
    if (!self || (n && (!keys || !buffers || !capacities || !results)))
        return KVPOOL_INVALID_PARAMS;
    return s_get_buffers (self, n, keys, buffers, capacities, NULL, results);
}

int
kvpool_get_batch_into_parts (kvpool_t *self, size_t n, const char *const *keys,
                             const kvpool_buf_t *const *bufs, const size_t *nbufs, int64_t *results)
{
    if (!self || (n && (!keys || !bufs || !nbufs || !results)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    return s_get_into (self, n, keys, bufs, nbufs, NULL, results);
}

int64_t
kvpool_get_range_into (kvpool_t *self, const char *key, uint64_t offset, void *buffer,
                       size_t length)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    kvpool_buf_t buf = {buffer, length};
    const kvpool_buf_t *bufs = &buf;
    size_t nbufs = 1;
    int64_t outcome;
    s_get_into (self, 1, &key, &bufs, &nbufs, &offset, &outcome);
    return outcome;
}

int
kvpool_get_ranges_into (kvpool_t *self, size_t n, const char *const *keys, const uint64_t *offsets,
                        void *const *buffers, const size_t *lengths, int64_t *results)
{
    if (!self || (n && (!keys || !offsets || !buffers || !lengths || !results)))
        return KVPOOL_INVALID_PARAMS;
    return s_get_buffers (self, n, keys, buffers, lengths, offsets, results);
}

//  A get into a buffer the library allocates. With version_p, over the socket alone (its
//  reply names the version of the bytes it carries; the node relays a value other nodes
//  hold); without, on the read path (shared memory, caches, one-hop reads).
static int
s_get_malloc (kvpool_t *self, const char *key, void **data_p, size_t *size_p, uint64_t *version_p)
{
    *data_p = NULL;
    *size_p = 0;
    if (!kvpc_key_valid (key)) {
        kvpc_set_error (self->conn, "key is %s", key ? "empty" : "NULL");
        return KVPOOL_INVALID_KEY;
    }
    kvpc_keys_t sent;
    kvpc_keys_init (&sent);
    kvpc_keys_add (&sent, key, 0); //  fits inline
    kvpc_sink_t sink = kvpc_sink_malloc (data_p, size_p);
    int64_t outcome = KVPOOL_INTERNAL_ERROR;
    if (version_p) {
        *version_p = 0;
        sink.versions = version_p;
        int rc = kvpc_socket_get (self->conn, &sent, &sink, false, NULL, &outcome);
        if (rc != KVPOOL_OK && outcome >= 0)
            outcome = rc;
    }
    else
        kvpc_resolve_get (self->conn, self->fast_path, self->hot_cache, &sent, &sink, &outcome);
    kvpc_keys_fini (&sent);
    return outcome < 0 ? (int) outcome : KVPOOL_OK;
}

int
kvpool_get (kvpool_t *self, const char *key, void **data_p, size_t *size_p)
{
    if (!self || !data_p || !size_p)
        return KVPOOL_INVALID_PARAMS;
    return s_get_malloc (self, key, data_p, size_p, NULL);
}

int
kvpool_get_version (kvpool_t *self, const char *key, void **data_p, size_t *size_p,
                    uint64_t *version_p)
{
    if (!self || !data_p || !size_p || !version_p)
        return KVPOOL_INVALID_PARAMS;
    return s_get_malloc (self, key, data_p, size_p, version_p);
}

//  ---- values received without a copy -----------------------------------------------------

struct _kvpool_values_t {
    size_t count;
    zmq_msg_t *frames; //  one per key; empty where the key failed
};

int
kvpool_get_batch (kvpool_t *self, size_t n, const char *const *keys, kvpool_values_t **values_p,
                  int *statuses)
{
    if (!self || !values_p || (n && (!keys || !statuses)))
        return KVPOOL_INVALID_PARAMS;
    *values_p = NULL;
    kvpool_values_t *values = calloc (1, sizeof *values);
    if (values)
        values->frames = malloc ((n ? n : 1) * sizeof *values->frames);
    int64_t *results = malloc ((n ? n : 1) * sizeof *results);
    if (!values || !values->frames || !results) {
        if (values)
            free (values->frames);
        free (values);
        free (results);
        for (size_t i = 0; i < n; i++)
            statuses[i] = KVPOOL_INTERNAL_ERROR;
        return KVPOOL_INTERNAL_ERROR;
    }
    values->count = n;
    for (size_t i = 0; i < n; i++)
        zmq_msg_init (&values->frames[i]);
    *values_p = values;

    kvpc_keys_t sent;
    int rc = kvpc_keys_collect (self->conn, n, keys, NULL, &sent, results);
    kvpc_sink_t sink = kvpc_sink_frames (values->frames);
    if (rc == 0 && sent.count)
        rc = kvpc_resolve_get (self->conn, self->fast_path, self->hot_cache, &sent, &sink, results);
    kvpc_keys_fini (&sent);
    for (size_t i = 0; i < n; i++)
        statuses[i] = results[i] < 0 ? (int) results[i] : KVPOOL_OK;
    free (results);
    return rc;
}

const void *
kvpool_values_data (kvpool_values_t *self, size_t index)
{
    if (!self || index >= self->count || zmq_msg_size (&self->frames[index]) == 0)
        return NULL;
    return zmq_msg_data (&self->frames[index]);
}

size_t
kvpool_values_size (kvpool_values_t *self, size_t index)
{
    if (!self || index >= self->count)
        return 0;
    return zmq_msg_size (&self->frames[index]);
}

void
kvpool_values_destroy (kvpool_values_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpool_values_t *self = *self_p;
    for (size_t i = 0; i < self->count; i++)
        zmq_msg_close (&self->frames[i]);
    free (self->frames);
    free (self);
    *self_p = NULL;
}

//  ---- two-phase puts and replica lists ---------------------------------------------------

int
kvpool_put_start (kvpool_t *self, size_t n, const char *const *keys, const uint64_t *sizes,
                  const kvpool_put_options_t *opts, kvpool_placement_t *placements)
{
    if (!self || (n && (!keys || !sizes || !placements)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    return kvpc_socket_put_start (self->conn, n, keys, sizes, opts, placements);
}

int
kvpool_get_replica_list (kvpool_t *self, size_t n, const char *const *keys, bool pin,
                         kvpool_placement_t *placements)
{
    if (!self || (n && (!keys || !placements)))
        return KVPOOL_INVALID_PARAMS;
    if (n == 0)
        return KVPOOL_OK;
    return kvpc_socket_replica_list (self->conn, n, keys, pin, placements);
}

//  ---- segments, memory and stats -----------------------------------------------------------

int
kvpool_segments (kvpool_t *self, kvpool_segment_t *segments, size_t capacity)
{
    if (!self || (capacity && !segments))
        return KVPOOL_INVALID_PARAMS;
    return kvpc_socket_segments (self->conn, segments, capacity);
}

int
kvpool_nodes (kvpool_t *self, kvpool_node_t *nodes, size_t capacity)
{
    if (!self || (capacity && !nodes))
        return KVPOOL_INVALID_PARAMS;
    return kvpc_socket_nodes (self->conn, NULL, NULL, nodes, capacity);
}

int
kvpool_locate (kvpool_t *self, const char *key, uint64_t *size_p, kvpool_node_t *nodes,
               size_t capacity)
{
    if (!self || !key || !*key || (capacity && !nodes))
        return KVPOOL_INVALID_PARAMS;
    return kvpc_socket_nodes (self->conn, key, size_p, nodes, capacity);
}

int
kvpool_mount_segment (kvpool_t *self, const char *shm_name, uint64_t size, uint32_t *id_p)
{
    if (!self || !shm_name || !*shm_name)
        return KVPOOL_INVALID_PARAMS;
    return kvpc_socket_mount (self->conn, shm_name, size, id_p);
}

int
kvpool_unmount_segment (kvpool_t *self, uint32_t id)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    return kvpc_socket_unmount (self->conn, id);
}

int
kvpool_mount_memory (kvpool_t *self, uint64_t size, uint32_t *id_p, const char **name_p)
{
    if (!self || size == 0 || size > SIZE_MAX || !id_p)
        return KVPOOL_INVALID_PARAMS;
    return kvpc_memory_give (self->memory, size, id_p, name_p);
}

int
kvpool_unmount_memory (kvpool_t *self, uint32_t id)
{
    if (!self)
        return KVPOOL_INVALID_PARAMS;
    return kvpc_memory_take_back (self->memory, id);
}

int
kvpool_stats (kvpool_t *self, kvpool_stats_t *stats)
{
    if (!self || !stats)
        return KVPOOL_INVALID_PARAMS;
    return kvpc_socket_stats (self->conn, stats, NULL, 0, NULL);
}

int
kvpool_node_drain (kvpool_t *self, const char *node_id, const char *action, kvpool_drain_t *state)
{
    if (!self || !node_id || !*node_id)
        return KVPOOL_INVALID_PARAMS;
    return kvpc_socket_drain (self->conn, node_id, action, state);
}

int
kvpool_config (kvpool_t *self, const char *name, const char *value, char *out, size_t size)
{
    if (!self || !name || !*name || !out || !size || (value && !*value))
        return KVPOOL_INVALID_PARAMS;
    return kvpc_socket_config (self->conn, name, value, out, size);
}

const char *
kvpool_master_endpoint (kvpool_t *self)
{
    return self ? kvpc_conn_master_endpoint (self->conn) : "";
}

int
kvpool_stats_ops (kvpool_t *self, kvpool_stats_t *stats, kvpool_op_stats_t *ops, size_t max,
                  size_t *count)
{
    if (!self || !stats || (max && !ops))
        return KVPOOL_INVALID_PARAMS;
    return kvpc_socket_stats (self->conn, stats, ops, max, count);
}

//  ---- process-wide -------------------------------------------------------------------------

int
kvpool_tune_malloc (void)
{
#if defined(__GLIBC__)
    //  Large values stay on the heap instead of a fresh mmap each, and freed ones stay there
    //  for the next receive.
    int ok = mallopt (M_MMAP_THRESHOLD, 32 << 20);
    ok &= mallopt (M_TRIM_THRESHOLD, 256 << 20);
    //  Threads started from now on share the main heap. libzmq's I/O thread, which allocates
    //  every received frame, would otherwise get an arena of its own made of 64 MiB heaps
    //  that glibc unmaps whenever one falls empty, so a batch of more than 64 MiB kept
    //  by the caller (kvpool_get_batch) was faulted in afresh on every call. Threads that
    //  already exist keep their arenas.
    ok &= mallopt (M_ARENA_MAX, 1);
    return ok ? 0 : -1;
#else
    return -1;
#endif
}
