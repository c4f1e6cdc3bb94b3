/*  lookup_server.c - the lookup/reset admin channel of kvpoold (DESIGN section 6).

    One actor thread owns a ROUTER socket bound to every --admin endpoint, and a libkvpool
    connection to the store's api (inproc, same process, fast path off: the bytes never matter
    here, only metadata). Requests are served one at a time in arrival order, each answered
    before the next is read; REQ clients (vLLM's LookupKeyClient) and DEALER clients both work,
    many at once, since the ROUTER keeps their envelopes apart.

    A request is decoded by lookup_request.c; anything it refuses gets b"\x00" and is counted,
    and the actor goes on. A lookup keeps only the hashes whose blocks start before token_len
    (the others cannot change the answer), expands them over every tp x pp rank with
    lookup_keys.c, asks the store ONE exist batch for all those keys (exist grants each found
    key a read lease) and answers block_size x the number of leading blocks whose keys all
    exist, capped at token_len, as 4 bytes big-endian. A store failure answers b"\x00" too.
    A reset is the store's RESET: the api drains every transfer in flight and then removes all
    objects past leases before it replies, so when this actor answers b"\x01" no put accepted
    before the reset can still land; a put that starts after the reply is kept.

    The store connection is opened at the first request that needs it and reopened after a
    timeout, so the actor can start before the api and survives a stalled reply; while the
    store cannot be reached, requests that need it fail at once (b"\x00"), and a new connect
    is tried at most once a second.
*/
#include "lookup_server/lookup_server.h"

#include <pthread.h>

#include "actors/endpoints.h"

#include "kvpool.h"
#include "lookup_server/lookup_keys.h"
#include "lookup_server/lookup_request.h"

//  Frames beyond this cannot be any request: refuse without looking.
#define MAX_REQUEST_FRAMES 8
//  Largest frame the socket accepts: a lookup at the hash cap with 32-byte hashes in msgpack
//  is about 67 MB; anything bigger is dropped by libzmq before it costs memory.
#define MAX_FRAME_BYTES (256 << 20)
//  Requests one admin connection may have queued before libzmq stops reading it.
#define MAX_QUEUED_REQUESTS 16
//  Store requests: reset drains in-flight transfers first, which can take a while.
#define STORE_TIMEOUT_MS 60000
#define STORE_CONNECT_TIMEOUT_MS 2000
//  After a failed connect, requests fail at once for this long rather than each waiting out
//  a connect timeout of its own.
#define STORE_RETRY_MS 1000

static const uint8_t s_ok[] = {1};
static const uint8_t s_fail[] = {0};

typedef struct {
    zsock_t *pipe;
    zsock_t *router;
    const kvp_config_t *config;
    char *store_endpoint;
    kvpool_t *store;
    int64_t store_retry_at; //  no connect attempt before this (zclock_mono)
    lookup_keys_t *keys;
    uint32_t block_size;
    zlistx_t *endpoints; //  resolved bound endpoints (char *)
    char *error;         //  why the actor cannot serve, or NULL
    bool terminated;
    int *results; //  exist outcomes, reused across lookups
    size_t results_size;
    //  counters, reported by stats
    uint64_t requests, lookups, hit_tokens, resets, reset_failures, refused, store_errors;
} self_t;

static void
s_self_destroy (self_t **self_p)
{
    assert (self_p);
    self_t *self = *self_p;
    if (self) {
        zsock_destroy (&self->router);
        kvpool_destroy (&self->store);
        lookup_keys_destroy (&self->keys);
        zlistx_destroy (&self->endpoints);
        zstr_free (&self->store_endpoint);
        zstr_free (&self->error);
        free (self->results);
        free (self);
        *self_p = NULL;
    }
}

static self_t *
s_self_new (zsock_t *pipe, const lookup_server_args_t *args)
{
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    assert (self);
    self->pipe = pipe;
    self->config = args->config;
    self->store_endpoint = strdup (args->store_endpoint ? args->store_endpoint : "");
    self->endpoints = zlistx_new ();
    assert (self->store_endpoint && self->endpoints);
    zlistx_set_destructor (self->endpoints, (zlistx_destructor_fn *) zstr_free);
    const lookup_config_t *lookup = &self->config->lookup;
    self->block_size = lookup->block_size ? lookup->block_size : 16;

    const char *reason = NULL;
    self->keys = lookup_keys_new (lookup, &reason);
    if (!self->keys) {
        self->error = zsys_sprintf ("bad --lookup-key-template: %s", reason);
        return self;
    }
    self->router = zsock_new (ZMQ_ROUTER);
    assert (self->router);
    zsock_set_maxmsgsize (self->router, MAX_FRAME_BYTES);
    //  vLLM's clients are REQ sockets, one request at a time: a connection that queues more
    //  is not one of them, and libzmq stops reading its socket instead.
    zsock_set_rcvhwm (self->router, MAX_QUEUED_REQUESTS);
    size_t count = self->config->admin_endpoint_count;
    for (size_t i = 0; i < (count ? count : 1); i++) {
        const char *endpoint =
            count ? self->config->admin_endpoints[i] : KVPOOL_DEFAULT_ADMIN_ENDPOINT;
        if (zsock_bind (self->router, "%s", endpoint) == -1) {
            self->error = zsys_sprintf ("cannot bind admin endpoint %s: %s", endpoint,
                                        zmq_strerror (zmq_errno ()));
            zsock_destroy (&self->router);
            return self;
        }
        //  ZMQ_LAST_ENDPOINT has the port an ephemeral bind got.
        char *resolved = zsock_last_endpoint (self->router);
        zlistx_add_end (self->endpoints, resolved ? resolved : strdup (endpoint));
    }
    return self;
}

//  ---- the store -------------------------------------------------------------------------

static kvpool_t *
s_store (self_t *self)
{
    if (!self->store && zclock_mono () >= self->store_retry_at) {
        kvpool_options_t options;
        kvpool_options_init (&options);
        //  The store is in this process: present keys are answered from its read index
        //  (their leases renewed by a message nobody waits for), misses by the api.
        options.fast_path = 1;
        options.timeout_ms = STORE_TIMEOUT_MS;
        options.connect_timeout_ms = STORE_CONNECT_TIMEOUT_MS;
        self->store = kvpool_connect (self->store_endpoint, &options);
        if (!self->store) {
            zsys_warning ("lookup_server: cannot reach the store at %s", self->store_endpoint);
            self->store_retry_at = zclock_mono () + STORE_RETRY_MS;
        }
    }
    return self->store;
}

//  After a timeout a late reply may still be queued on the connection: start afresh.
static void
s_store_failed (self_t *self, int status)
{
    self->store_errors++;
    zsys_warning ("lookup_server: store request failed: %s", kvpool_strerror (status));
    if (status == KVPOOL_RPC_FAIL)
        kvpool_destroy (&self->store);
}

//  ---- requests --------------------------------------------------------------------------

//  Answers a lookup: the hit token count as 4 bytes big-endian, or b"\x00" on a failure.
static zframe_t *
s_lookup (self_t *self, lookup_request_t *request)
{
    //  Blocks that start at or past token_len cannot add to the hit.
    uint64_t useful = ((uint64_t) request->token_len + self->block_size - 1) / self->block_size;
    size_t blocks = request->hash_count < useful ? request->hash_count : (size_t) useful;
    size_t present = 0;
    if (blocks > 0) {
        const char *reason = NULL;
        const char *const *keys;
        if (lookup_keys_expand (self->keys, request->hashes, request->hash_lens, blocks,
                                self->config->max_key_len, &keys, &reason)) {
            self->refused++;
            if (self->config->verbose)
                zsys_info ("lookup_server: lookup refused: %s", reason);
            return zframe_new (s_fail, sizeof s_fail);
        }
        size_t ranks = lookup_keys_ranks (self->keys);
        size_t key_count = blocks * ranks;
        if (key_count > self->results_size) {
            int *results = (int *) realloc (self->results, key_count * sizeof (int));
            if (!results)
                return zframe_new (s_fail, sizeof s_fail);
            self->results = results;
            self->results_size = key_count;
        }
        kvpool_t *store = s_store (self);
        if (!store) {
            self->store_errors++;
            return zframe_new (s_fail, sizeof s_fail);
        }
        int rc = kvpool_exist_batch (store, key_count, keys, self->results);
        if (rc < 0) {
            s_store_failed (self, rc);
            return zframe_new (s_fail, sizeof s_fail);
        }
        //  A block counts only if every rank's key is there; the first gap ends the prefix.
        //  A per-key error counts as absent: a miss is always a safe answer.
        for (present = 0; present < blocks; present++) {
            const int *block = self->results + present * ranks;
            size_t r = 0;
            while (r < ranks && block[r] == 1)
                r++;
            if (r < ranks)
                break;
        }
    }
    uint64_t hit = (uint64_t) present * self->block_size;
    if (hit > request->token_len)
        hit = request->token_len;
    self->lookups++;
    self->hit_tokens += hit;
    if (self->config->verbose)
        zsys_info ("lookup_server: lookup %s token_len=%u hashes=%zu -> %u",
                   lookup_request_form_name (request->form), request->token_len,
                   request->hash_count, (unsigned) hit);
    uint8_t reply[4] = {(uint8_t) (hit >> 24), (uint8_t) (hit >> 16), (uint8_t) (hit >> 8),
                        (uint8_t) hit};
    return zframe_new (reply, sizeof reply);
}

static zframe_t *
s_reset (self_t *self)
{
    kvpool_t *store = s_store (self);
    int64_t removed = store ? kvpool_reset (store) : KVPOOL_RPC_FAIL;
    if (removed < 0) {
        if (store)
            s_store_failed (self, (int) removed);
        self->reset_failures++;
        zsys_warning ("lookup_server: reset failed: %s", kvpool_strerror ((int) removed));
        return zframe_new (s_fail, sizeof s_fail);
    }
    self->resets++;
    zsys_info ("lookup_server: reset removed %" PRId64 " objects", removed);
    return zframe_new (s_ok, sizeof s_ok);
}

static zframe_t *
s_stats (self_t *self)
{
    kvpool_t *store = s_store (self);
    kvpool_stats_t stats;
    int rc = store ? kvpool_stats (store, &stats) : KVPOOL_RPC_FAIL;
    if (rc < 0) {
        if (store)
            s_store_failed (self, rc);
        return zframe_new (s_fail, sizeof s_fail);
    }
    char *json = zsys_sprintf (
        "{\"objects\":%" PRIu64 ",\"bytes_used\":%" PRIu64 ",\"bytes_allocated\":%" PRIu64
        ",\"bytes_mounted\":%" PRIu64 ",\"pending_puts\":%" PRIu64 ",\"requests\":%" PRIu64
        ",\"lookups_served\":%" PRIu64 ",\"hit_tokens\":%" PRIu64 ",\"resets\":%" PRIu64
        ",\"reset_failures\":%" PRIu64 ",\"refused_requests\":%" PRIu64 ",\"store_errors\":%" PRIu64
        ",\"tp_size\":%u,\"pp_size\":%u,\"block_size\":%u}",
        stats.objects, stats.bytes_stored, stats.bytes_allocated, stats.bytes_mounted,
        stats.pending_puts, self->requests, self->lookups, self->hit_tokens, self->resets,
        self->reset_failures, self->refused, self->store_errors,
        self->config->lookup.tp_size ? self->config->lookup.tp_size : 1,
        self->config->lookup.pp_size ? self->config->lookup.pp_size : 1, self->block_size);
    zframe_t *frame = zframe_new (json, strlen (json));
    zstr_free (&json);
    return frame;
}

//  Decodes and serves one request body; returns the reply frame.
static zframe_t *
s_serve (self_t *self, zmsg_t *body)
{
    const char *reason = "too many frames";
    lookup_request_t *request = NULL;
    size_t count = zmsg_size (body);
    if (count <= MAX_REQUEST_FRAMES) {
        lookup_frame_t frames[MAX_REQUEST_FRAMES];
        size_t i = 0;
        for (zframe_t *frame = zmsg_first (body); frame; frame = zmsg_next (body), i++) {
            frames[i].data = zframe_data (frame);
            frames[i].size = zframe_size (frame);
        }
        request = lookup_request_decode (frames, count, &reason);
    }
    if (!request) {
        self->refused++;
        if (self->config->verbose)
            zsys_info ("lookup_server: refused a request: %s", reason);
        return zframe_new (s_fail, sizeof s_fail);
    }
    zframe_t *reply = NULL;
    switch (request->type) {
        case LOOKUP_REQUEST_LOOKUP: reply = s_lookup (self, request); break;
        case LOOKUP_REQUEST_RESET: reply = s_reset (self); break;
        case LOOKUP_REQUEST_STATS: reply = s_stats (self); break;
        case LOOKUP_REQUEST_PING: reply = zframe_new (s_ok, sizeof s_ok); break;
    }
    lookup_request_destroy (&request);
    return reply;
}

//  One message from the ROUTER: [identity][empty delimiter, from REQ][request frames...].
//  The reply carries the same envelope back.
static void
s_handle_router (self_t *self)
{
    zmsg_t *msg = zmsg_recv (self->router);
    if (!msg)
        return; //  interrupted
    self->requests++;
    zmsg_t *reply = zmsg_new ();
    assert (reply);
    zframe_t *identity = zmsg_pop (msg);
    assert (identity); //  a ROUTER always prepends one
    zmsg_append (reply, &identity);
    zframe_t *first = zmsg_first (msg);
    if (first && zframe_size (first) == 0) {
        zframe_t *delimiter = zmsg_pop (msg);
        zmsg_append (reply, &delimiter);
    }
    zframe_t *answer = s_serve (self, msg);
    zmsg_append (reply, &answer);
    zmsg_destroy (&msg);
    //  The ROUTER drops a reply to a peer that has gone, which is right: nobody waits for it.
    zmsg_send (&reply, self->router);
}

static void
s_handle_pipe (self_t *self)
{
    zmsg_t *msg = zmsg_recv (self->pipe);
    if (!msg) {
        self->terminated = true;
        return;
    }
    char *command = zmsg_popstr (msg);
    if (command && streq (command, "$TERM"))
        self->terminated = true;
    else if (command && streq (command, "ENDPOINTS"))
        kvp_endpoints_reply (self->pipe, self->endpoints, self->error);
    else
        zsys_error ("lookup_server: unknown pipe command '%s'", command ? command : "");
    zstr_free (&command);
    zmsg_destroy (&msg);
}

void
lookup_server_actor (zsock_t *pipe, void *args)
{
    pthread_setname_np (pthread_self (), "kvp-lookup");
    assert (args);
    const lookup_server_args_t *server_args = (const lookup_server_args_t *) args;
    assert (server_args->config);
    self_t *self = s_self_new (pipe, server_args);
    if (self->error)
        zsys_error ("lookup_server: %s", self->error);
    zpoller_t *poller = zpoller_new (pipe, self->router, NULL);
    assert (poller);
    zsock_signal (pipe, 0);
    while (!self->terminated) {
        void *which = zpoller_wait (poller, -1);
        if (which == pipe)
            s_handle_pipe (self);
        else if (which && which == self->router)
            s_handle_router (self);
        else if (zpoller_terminated (poller))
            break;
    }
    zpoller_destroy (&poller);
    s_self_destroy (&self);
}

//  ---- self test -------------------------------------------------------------------------
//  The actor against a fake store: a ROUTER speaking just enough of protocol v1 (PING, EXIST,
//  RESET, STATS) through the real libkvpool, so every path of the actor is checked here
//  without the rest of kvpoold. tests/python/test_lookup.py checks the real daemon.

#include <msgpack.h>

#include "protocol/kvpool.pb-c.h"

typedef struct {
    zhashx_t *keys;        //  the keys that exist
    size_t exist_requests; //  EXIST requests seen
    size_t exist_keys;     //  keys in the last one
    size_t resets;
} s_fake_t;

static void
s_fake_serve (s_fake_t *fake, zsock_t *router)
{
    zmsg_t *msg = zmsg_recv (router);
    if (!msg)
        return;
    zmsg_t *reply = zmsg_new ();
    zframe_t *identity = zmsg_pop (msg);
    zmsg_append (reply, &identity);
    if (zmsg_first (msg) && zframe_size (zmsg_first (msg)) == 0) {
        zframe_t *delimiter = zmsg_pop (msg);
        zmsg_append (reply, &delimiter);
    }
    zframe_t *header = zmsg_first (msg);
    Kvpool__V1__Request *request =
        header ? kvpool__v1__request__unpack (NULL, zframe_size (header), zframe_data (header))
               : NULL;
    assert (request);
    Kvpool__V1__Reply answer = KVPOOL__V1__REPLY__INIT;
    Kvpool__V1__Stats stats = KVPOOL__V1__STATS__INIT;
    int32_t *statuses = NULL;
    answer.version = 1;
    answer.request_id = request->request_id;
    answer.op = request->op;
    answer.server_id = "fake-store";
    answer.host_id = "fake-host";
    switch (request->op) {
        case KVPOOL__V1__OP__PING:
        case KVPOOL__V1__OP__SEGMENTS: break;
        case KVPOOL__V1__OP__EXIST:
            fake->exist_requests++;
            fake->exist_keys = request->n_keys;
            statuses = (int32_t *) calloc (request->n_keys + 1, sizeof (int32_t));
            for (size_t i = 0; i < request->n_keys; i++) {
                char key[512];
                snprintf (key, sizeof key, "%.*s", (int) request->keys[i].len,
                          (const char *) request->keys[i].data);
                statuses[i] = zhashx_lookup (fake->keys, key)
                                  ? KVPOOL__V1__STATUS__OK
                                  : KVPOOL__V1__STATUS__OBJECT_NOT_FOUND;
            }
            answer.statuses = statuses;
            answer.n_statuses = request->n_keys;
            break;
        case KVPOOL__V1__OP__RESET:
            answer.count = zhashx_size (fake->keys);
            zhashx_purge (fake->keys);
            fake->resets++;
            break;
        case KVPOOL__V1__OP__STATS:
            stats.objects = zhashx_size (fake->keys);
            stats.bytes_stored = 100 * stats.objects;
            answer.stats = &stats;
            break;
        default: answer.status = KVPOOL__V1__STATUS__UNKNOWN_OPERATION; break;
    }
    size_t size = kvpool__v1__reply__get_packed_size (&answer);
    zframe_t *packed = zframe_new (NULL, size);
    kvpool__v1__reply__pack (&answer, zframe_data (packed));
    zmsg_append (reply, &packed);
    zmsg_send (&reply, router);
    free (statuses);
    kvpool__v1__request__free_unpacked (request, NULL);
    zmsg_destroy (&msg);
}

//  Pipe: "ADD" key (replies 0), "COUNTS" (replies exist_requests, exist_keys, resets, size).
static void
s_fake_store_actor (zsock_t *pipe, void *args)
{
    zsock_t *router = zsock_new_router ((const char *) args);
    assert (router);
    s_fake_t fake = {zhashx_new (), 0, 0, 0};
    zpoller_t *poller = zpoller_new (pipe, router, NULL);
    zsock_signal (pipe, 0);
    bool terminated = false;
    while (!terminated) {
        void *which = zpoller_wait (poller, -1);
        if (which == router)
            s_fake_serve (&fake, router);
        else if (which == pipe) {
            char *command, *key;
            zsock_recv (pipe, "ss", &command, &key);
            if (streq (command, "ADD")) {
                zhashx_insert (fake.keys, key, (void *) 1);
                zsock_signal (pipe, 0);
            }
            else if (streq (command, "COUNTS"))
                zsock_send (pipe, "8888", (uint64_t) fake.exist_requests,
                            (uint64_t) fake.exist_keys, (uint64_t) fake.resets,
                            (uint64_t) zhashx_size (fake.keys));
            else
                terminated = true;
            zstr_free (&command);
            zstr_free (&key);
        }
        else
            break;
    }
    zpoller_destroy (&poller);
    zhashx_destroy (&fake.keys);
    zsock_destroy (&router);
}

static void
s_fake_add (zactor_t *fake, const char *model, uint32_t tp, const char *hash)
{
    char key[256];
    snprintf (key, sizeof key, "%s@tp_rank:%u@pcp0@dcp0@pp_rank:0@%s", model, tp, hash);
    zsock_send (fake, "ss", "ADD", key);
    zsock_wait (fake);
}

static void
s_fake_counts (zactor_t *fake, uint64_t *requests, uint64_t *keys, uint64_t *resets, uint64_t *size)
{
    zsock_send (fake, "ss", "COUNTS", "");
    zsock_recv (fake, "8888", requests, keys, resets, size);
}

//  Sends a request of count frames (data, size pairs) and returns the one reply frame.
static zframe_t *
s_ask (zsock_t *client, size_t count, const void *const *data, const size_t *sizes)
{
    zmsg_t *msg = zmsg_new ();
    if (zsock_type (client) == ZMQ_DEALER)
        zmsg_addmem (msg, NULL, 0);
    for (size_t i = 0; i < count; i++)
        zmsg_addmem (msg, data[i], sizes[i]);
    zmsg_send (&msg, client);
    zmsg_t *reply = zmsg_recv (client);
    assert (reply);
    if (zsock_type (client) == ZMQ_DEALER) {
        zframe_t *delimiter = zmsg_pop (reply);
        assert (delimiter && zframe_size (delimiter) == 0);
        zframe_destroy (&delimiter);
    }
    assert (zmsg_size (reply) == 1);
    zframe_t *frame = zmsg_pop (reply);
    zmsg_destroy (&reply);
    return frame;
}

static int64_t
s_ask_hit (zsock_t *client, size_t count, const void *const *data, const size_t *sizes)
{
    zframe_t *frame = s_ask (client, count, data, sizes);
    int64_t hit = -1;
    if (zframe_size (frame) == 4) {
        const uint8_t *p = zframe_data (frame);
        hit = ((int64_t) p[0] << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
    }
    zframe_destroy (&frame);
    return hit;
}

//  True if the reply to the request is exactly the one byte value.
static bool
s_ask_byte (zsock_t *client, size_t count, const void *const *data, const size_t *sizes,
            uint8_t value)
{
    zframe_t *frame = s_ask (client, count, data, sizes);
    bool match = zframe_size (frame) == 1 && zframe_data (frame)[0] == value;
    zframe_destroy (&frame);
    return match;
}

static zframe_t *
s_msgpack_hashes (const char *const *hashes, size_t count)
{
    msgpack_sbuffer buffer;
    msgpack_sbuffer_init (&buffer);
    msgpack_packer pk;
    msgpack_packer_init (&pk, &buffer, msgpack_sbuffer_write);
    msgpack_pack_array (&pk, count);
    for (size_t i = 0; i < count; i++) {
        msgpack_pack_str (&pk, strlen (hashes[i]));
        msgpack_pack_str_body (&pk, hashes[i], strlen (hashes[i]));
    }
    zframe_t *frame = zframe_new (buffer.data, buffer.size);
    msgpack_sbuffer_destroy (&buffer);
    return frame;
}

//  A lookup in each wire form; returns the hit, checking the three forms agree.
static int64_t
s_lookup_all_forms (zsock_t *client, uint32_t token_len, const char *const *hashes, size_t count)
{
    uint8_t tl[4] = {(uint8_t) (token_len >> 24), (uint8_t) (token_len >> 16),
                     (uint8_t) (token_len >> 8), (uint8_t) token_len};
    zframe_t *packed = s_msgpack_hashes (hashes, count);
    const void *tagged[] = {"lookup", tl, zframe_data (packed)};
    size_t tagged_sizes[] = {6, 4, zframe_size (packed)};
    int64_t hit = s_ask_hit (client, 3, tagged, tagged_sizes);
    const void *untagged[] = {tl, zframe_data (packed)};
    size_t untagged_sizes[] = {4, zframe_size (packed)};
    assert (s_ask_hit (client, 2, untagged, untagged_sizes) == hit);
    //  Binary: every hash here is the hex of 4 bytes.
    uint8_t blob[64];
    assert (count <= 16);
    for (size_t i = 0; i < count; i++) {
        assert (strlen (hashes[i]) == 8);
        for (size_t j = 0; j < 4; j++) {
            unsigned byte;
            sscanf (hashes[i] + 2 * j, "%2x", &byte);
            blob[4 * i + j] = (uint8_t) byte;
        }
    }
    uint8_t hash_len[2] = {0, 4};
    const void *binary[] = {"lookup", tl, hash_len, blob};
    size_t binary_sizes[] = {6, 4, 2, 4 * count};
    assert (s_ask_hit (client, 4, binary, binary_sizes) == hit);
    zframe_destroy (&packed);
    return hit;
}

void
lookup_server_test (bool verbose)
{
    char store_endpoint[64], ipc_endpoint[64];
    //  ipc rather than inproc: libkvpool has a ZeroMQ context of its own.
    snprintf (store_endpoint, sizeof store_endpoint, "ipc://@kvpool-lookup-test-store-%d",
              getpid ());
    snprintf (ipc_endpoint, sizeof ipc_endpoint, "ipc://@kvpool-lookup-test-%d", getpid ());
    zactor_t *fake = zactor_new (s_fake_store_actor, store_endpoint);
    assert (fake);

    kvp_config_t config;
    kvp_config_defaults (&config);
    config.admin_endpoints[0] = "tcp://127.0.0.1:*";
    config.admin_endpoints[1] = ipc_endpoint;
    config.admin_endpoint_count = 2;
    config.lookup.model = "m";
    config.lookup.tp_size = 2;
    config.lookup.block_size = 16;
    config.verbose = verbose;
    lookup_server_args_t args = {&config, store_endpoint};
    zactor_t *server = zactor_new (lookup_server_actor, &args);
    assert (server);

    //  ENDPOINTS: both, the tcp one with the port it got.
    zsock_send (server, "s", "ENDPOINTS");
    zmsg_t *endpoints = zmsg_recv (server);
    assert (endpoints && zmsg_size (endpoints) == 3);
    char *status = zmsg_popstr (endpoints);
    char *tcp = zmsg_popstr (endpoints);
    char *ipc = zmsg_popstr (endpoints);
    assert (streq (status, "OK"));
    assert (strncmp (tcp, "tcp://127.0.0.1:", 16) == 0 && atoi (tcp + 16) > 0);
    assert (streq (ipc, ipc_endpoint));
    if (verbose)
        zsys_info ("lookup_server_test: bound %s and %s", tcp, ipc);
    zmsg_destroy (&endpoints);

    zsock_t *req = zsock_new_req (tcp);
    zsock_t *dealer = zsock_new_dealer (ipc);
    assert (req && dealer);
    zsock_set_rcvtimeo (req, 10000);
    zsock_set_rcvtimeo (dealer, 10000);

    //  ping, on both sockets.
    const void *ping[] = {"ping"};
    size_t ping_size[] = {4};
    assert (s_ask_byte (req, 1, ping, ping_size, 1));
    assert (s_ask_byte (dealer, 1, ping, ping_size, 1));

    //  Blocks 0 and 1 on both ranks, block 2 on rank 0 only, block 3 on both.
    const char *hashes[] = {"0a0b0c0d", "1a1b1c1d", "2a2b2c2d", "3a3b3c3d"};
    for (int b = 0; b < 4; b++)
        for (uint32_t tp = 0; tp < 2; tp++)
            if (b != 2 || tp == 0)
                s_fake_add (fake, "m", tp, hashes[b]);
    uint64_t exist_requests, exist_keys, resets, size;
    s_fake_counts (fake, &exist_requests, &exist_keys, &resets, &size);
    assert (size == 7);

    //  Two leading blocks on every rank: 32 tokens; the miss in the middle ends the count.
    assert (s_lookup_all_forms (req, 100, hashes, 4) == 32);
    assert (s_lookup_all_forms (dealer, 100, hashes, 4) == 32);
    //  One exist batch per lookup, over every key (4 blocks x 2 ranks).
    s_fake_counts (fake, &exist_requests, &exist_keys, &resets, &size);
    assert (exist_requests == 6 && exist_keys == 8);
    //  token_len shorter than the stored blocks: capped, and blocks past it are not asked.
    assert (s_lookup_all_forms (req, 20, hashes, 4) == 20);
    s_fake_counts (fake, &exist_requests, &exist_keys, &resets, &size);
    assert (exist_requests == 9 && exist_keys == 4);
    assert (s_lookup_all_forms (req, 32, hashes, 4) == 32);
    assert (s_lookup_all_forms (req, 1, hashes, 4) == 1);
    //  A miss in the first block; an empty list; token_len 0 (neither asks the store).
    assert (s_lookup_all_forms (req, 100, hashes + 2, 2) == 0);
    assert (s_lookup_all_forms (req, 100, hashes, 0) == 0);
    assert (s_lookup_all_forms (req, 0, hashes, 4) == 0);
    s_fake_counts (fake, &exist_requests, &exist_keys, &resets, &size);
    assert (exist_requests == 18);
    //  Without the partial block: three full blocks.
    const char *tail[] = {"0a0b0c0d", "1a1b1c1d", "3a3b3c3d"};
    assert (s_lookup_all_forms (req, 1000, tail, 3) == 48);

    //  Malformed requests: one byte 0 each, and the server keeps serving.
    uint8_t tl16[4] = {0, 0, 0, 16};
    const void *bad_tag[] = {"lookupx"};
    size_t bad_tag_size[] = {7};
    assert (s_ask_byte (req, 1, bad_tag, bad_tag_size, 0));
    const void *missing[] = {"lookup", tl16};
    size_t missing_size[] = {6, 4};
    assert (s_ask_byte (req, 2, missing, missing_size, 0));
    const void *short_tl[] = {"lookup", tl16,
                              "\x91\xa2"
                              "ab"};
    size_t short_tl_size[] = {6, 3, 4};
    assert (s_ask_byte (req, 3, short_tl, short_tl_size, 0));
    const void *bad_msgpack[] = {"lookup", tl16,
                                 "\x92\xa2"
                                 "ab"};
    size_t bad_msgpack_size[] = {6, 4, 4};
    assert (s_ask_byte (dealer, 3, bad_msgpack, bad_msgpack_size, 0));
    const void *huge[] = {"lookup", tl16, "\xdd\xff\xff\xff\xff"};
    size_t huge_size[] = {6, 4, 5};
    assert (s_ask_byte (req, 3, huge, huge_size, 0));
    const void *many[10] = {"lookup", tl16, "", "", "", "", "", "", "", ""};
    size_t many_size[10] = {6, 4, 0, 0, 0, 0, 0, 0, 0, 0};
    assert (s_ask_byte (req, 10, many, many_size, 0));
    //  An empty message from a DEALER (delimiter only).
    assert (s_ask_byte (dealer, 0, NULL, NULL, 0));
    assert (s_lookup_all_forms (dealer, 100, hashes, 4) == 32);

    //  stats: JSON with the counters.
    const void *stats[] = {"stats"};
    size_t stats_size[] = {5};
    zframe_t *json = s_ask (req, 1, stats, stats_size);
    char *text = zframe_strdup (json);
    if (verbose)
        zsys_info ("lookup_server_test: stats %s", text);
    assert (text[0] == '{' && text[strlen (text) - 1] == '}');
    assert (strstr (text, "\"objects\":7,"));
    assert (strstr (text, "\"bytes_used\":700,"));
    assert (strstr (text, "\"resets\":0,"));
    assert (strstr (text, "\"lookups_served\":"));
    assert (strstr (text, "\"hit_tokens\":"));
    zstr_free (&text);
    zframe_destroy (&json);

    //  reset: the store's RESET, then nothing is found.
    const void *reset[] = {"reset"};
    size_t reset_size[] = {5};
    assert (s_ask_byte (req, 1, reset, reset_size, 1));
    s_fake_counts (fake, &exist_requests, &exist_keys, &resets, &size);
    assert (resets == 1 && size == 0);
    assert (s_lookup_all_forms (req, 100, hashes, 4) == 0);

    //  A second server on the same tcp endpoint cannot bind: ENDPOINTS says why.
    kvp_config_t taken = config;
    taken.admin_endpoints[0] = tcp;
    taken.admin_endpoint_count = 1;
    lookup_server_args_t taken_args = {&taken, store_endpoint};
    zactor_t *second = zactor_new (lookup_server_actor, &taken_args);
    zsock_send (second, "s", "ENDPOINTS");
    char *second_status, *second_reason;
    zsock_recv (second, "ss", &second_status, &second_reason);
    assert (streq (second_status, "ERROR"));
    assert (strstr (second_reason, tcp));
    zstr_free (&second_status);
    zstr_free (&second_reason);
    zactor_destroy (&second);
    //  ... nor with a bad key template.
    kvp_config_t bad_template = config;
    bad_template.lookup.key_template = "{model}/{rank}/{hash}";
    bad_template.admin_endpoints[0] = "tcp://127.0.0.1:*";
    bad_template.admin_endpoint_count = 1;
    lookup_server_args_t bad_args = {&bad_template, store_endpoint};
    second = zactor_new (lookup_server_actor, &bad_args);
    zsock_send (second, "s", "ENDPOINTS");
    zsock_recv (second, "ss", &second_status, &second_reason);
    assert (streq (second_status, "ERROR"));
    assert (strstr (second_reason, "unknown field"));
    zstr_free (&second_status);
    zstr_free (&second_reason);
    zactor_destroy (&second);

    //  A key longer than the store's limit is refused before the store is asked.
    kvp_config_t short_keys = config;
    short_keys.admin_endpoints[0] = "tcp://127.0.0.1:*";
    short_keys.admin_endpoint_count = 1;
    short_keys.max_key_len = 20;
    lookup_server_args_t short_args = {&short_keys, store_endpoint};
    second = zactor_new (lookup_server_actor, &short_args);
    zsock_send (second, "s", "ENDPOINTS");
    char *short_endpoint;
    zsock_recv (second, "ss", &second_status, &short_endpoint);
    assert (streq (second_status, "OK"));
    zsock_t *short_req = zsock_new_req (short_endpoint);
    zsock_set_rcvtimeo (short_req, 10000);
    s_fake_counts (fake, &exist_requests, &exist_keys, &resets, &size);
    uint64_t before = exist_requests;
    assert (s_lookup_all_forms (short_req, 100, hashes, 4) == -1);
    assert (s_lookup_all_forms (short_req, 100, hashes, 0) == 0);
    s_fake_counts (fake, &exist_requests, &exist_keys, &resets, &size);
    assert (exist_requests == before);
    zsock_destroy (&short_req);
    zstr_free (&second_status);
    zstr_free (&short_endpoint);
    zactor_destroy (&second);

    //  With no store behind it, a lookup, a reset and stats fail with b"\x00"; ping works.
    kvp_config_t alone = config;
    alone.admin_endpoints[0] = "tcp://127.0.0.1:*";
    alone.admin_endpoint_count = 1;
    lookup_server_args_t alone_args = {&alone, "ipc://@kvpool-lookup-test-nobody"};
    second = zactor_new (lookup_server_actor, &alone_args);
    zsock_send (second, "s", "ENDPOINTS");
    char *alone_endpoint;
    zsock_recv (second, "ss", &second_status, &alone_endpoint);
    assert (streq (second_status, "OK"));
    zsock_t *alone_req = zsock_new_req (alone_endpoint);
    zsock_set_rcvtimeo (alone_req, 10000);
    assert (s_ask_byte (alone_req, 1, ping, ping_size, 1));
    uint8_t tl100[4] = {0, 0, 0, 100};
    const char *one[] = {"0a0b0c0d"};
    zframe_t *one_packed = s_msgpack_hashes (one, 1);
    const void *alone_lookup[] = {"lookup", tl100, zframe_data (one_packed)};
    size_t alone_lookup_size[] = {6, 4, zframe_size (one_packed)};
    assert (s_ask_byte (alone_req, 3, alone_lookup, alone_lookup_size, 0));
    zframe_destroy (&one_packed);
    assert (s_ask_byte (alone_req, 1, reset, reset_size, 0));
    assert (s_ask_byte (alone_req, 1, ping, ping_size, 1));
    zsock_destroy (&alone_req);
    zstr_free (&second_status);
    zstr_free (&alone_endpoint);
    zactor_destroy (&second);

    zsock_destroy (&req);
    zsock_destroy (&dealer);
    zstr_free (&status);
    zstr_free (&tcp);
    zstr_free (&ipc);
    zactor_destroy (&server);
    zactor_destroy (&fake);
}
