/*  lookup_server.c - the lookup/reset admin channel of kvpoold (DESIGN section 6).

    One actor thread owns a ROUTER socket bound to every --admin endpoint and reaches the
    store of its own process directly, as the other actors reach each other: it reads the
    node's read index (shm/shm_index.h) itself, and sends kvp_job_t jobs (messages/kvp_job.h)
    to the api actor over a DEALER connected to inproc://<instance>-jobs. The api validates
    a job like a client request, walks it through the same actors as the client operation,
    and sends the same pointer back. No protobuf is encoded and no client library is used
    (the op is a kvpool.v1.Op number, which is all this file takes from protocol/).

    Requests are served one at a time in arrival order, each answered before the next is
    read; REQ clients (vLLM's LookupKeyClient) and DEALER clients both work, many at once,
    since the ROUTER keeps their envelopes apart. A request is decoded by lookup_request.c;
    anything it refuses gets b"\x00" and is counted, and the actor goes on.
    Under CURVE, the connections of a client key removed from --curve-allow are shut down
    within KEY_WATCH_INTERVAL_MS, and what they still sent is dropped (key_watch.h).

    LOOKUP keeps only the hashes whose blocks start before token_len (the others cannot
    change the answer) and expands them over every tp x pp rank with lookup_keys.c. Blocks are
    probed in the read index first, in order: a block whose keys the index all shows
    published is present, with no job at all. The index is lossy (a miss means "ask the
    node", never "not found"), so from the first block it cannot vouch for on, the keys go to
    the api as ONE PREFIX_MATCH job (the store operation a client's prefix match is), and the
    actor waits for that job alone. The answer is block_size x the number of leading blocks
    whose keys all exist, capped at token_len, as 4 bytes big-endian; a store failure
    answers b"\x00".

    Leases. A lookup grants every key of the blocks it counts a read lease, so the engine can
    load them before the evictor takes them: PREFIX_MATCH leases what the replica-manager
    counts, and an index hit is confirmed with the time of the lookup, which leaves it in the
    slot's read stamp (shm/shm_index.h): the same lease, with no job at all, as libkvpool's
    same-machine reads do.

    RESET is the store's RESET: the api drains every transfer in flight and then removes all
    objects past leases before it sends the job back, so when this actor answers b"\x01" no
    put accepted before the reset can still land; a put that starts after the reply is kept.
    STATS asks the api for the store's counters and adds this actor's.

    Waiting. While a job is out, the actor polls its pipe and the DEALER only: $TERM ends the
    wait at once (the job is abandoned), and a job not back within the store timeout (60 s:
    a reset may drain long transfers) fails its request. After a timeout, requests that need
    the store fail at once for STORE_RETRY_MS, or until a late job comes back. Every job sent
    is counted until it returns: replies that arrive late are destroyed as they come, and at $TERM
   the actor waits up to EXIT_WAIT_MS for those still out, then abandons them (the api may be
   stopping and never answer). A job that cannot even be queued (the DEALER never blocks) is
   destroyed and its request fails.

    Threads: one, the actor's. The index is mapped read-only (its read stamps read-write);
    the replica-manager writes it.
*/
#include "lookup_server/lookup_server.h"

#include "infra/actor_shell.h"
#include "infra/curve.h"
#include "infra/key_watch.h"
#include "infra/log.h"

#include <pthread.h>

#include "infra/metrics.h"
#include "lookup_server/lookup_keys.h"
#include "lookup_server/lookup_request.h"
#include "messages/kvp_job.h"
#include "protocol/kvpool.pb-c.h"
#include "shm/shm_index.h"

//  Frames beyond this cannot be any request: refuse without looking.
#define MAX_REQUEST_FRAMES 8
//  Largest frame the socket accepts: a lookup at the hash cap with 32-byte hashes in msgpack
//  is about 67 MB; anything bigger is dropped by libzmq before it costs memory.
#define MAX_FRAME_BYTES (256 << 20)
//  Requests one admin connection may have queued before libzmq stops reading it.
#define MAX_QUEUED_REQUESTS 16
//  Jobs: reset drains in-flight transfers first, which can take a while.
#define STORE_TIMEOUT_MS 60000
//  After a job timed out, requests fail at once for this long rather than each waiting out
//  a timeout of its own.
#define STORE_RETRY_MS 1000
//  At $TERM, how long to wait for jobs still out before abandoning them.
#define EXIT_WAIT_MS 500
//  A missing read index (the replica-manager could not create it) is looked for again this
//  often.
#define INDEX_RETRY_MS 1000

static const uint8_t s_ok[] = {1};
static const uint8_t s_fail[] = {0};

typedef struct {
    zsock_t *pipe;
    zsock_t *router;
    zsock_t *jobs;          //  DEALER to the api's inproc://<instance>-jobs
    key_watch_t *key_watch; //  closes connections of client keys revoked (key_watch.h)
    lookup_keys_t *keys;
    uint32_t block_size, tp_size, pp_size;
    uint32_t scale;             //  the engine's hashes a block (block size / hash block size)
    lookup_grouping_t grouping; //  how a block's hash is made from them
    bool eagle;                 //  --lookup-eagle
    char **grouped;             //  scratch: the blocks' hashes (grouping CONCAT, TRAILING)
    size_t *grouped_lens;
    char *grouped_text;
    size_t grouped_size, grouped_text_size;
    size_t max_key_len;
    uint64_t store_timeout_ms;
    bool verbose;
    char index_name[128];
    shm_index_t *index; //  the node's read index, or NULL until it can be opened
    int64_t index_retry_at;
    size_t jobs_out;        //  jobs sent and not back yet
    int64_t store_retry_at; //  jobs fail at once before this (zclock_mono)
    zlistx_t *endpoints;    //  resolved bound endpoints (char *)
    char *error;            //  why the actor cannot serve, or NULL
    bool terminated;
    //  scratch, reused across lookups (grown to the largest lookup's key count)
    size_t scratch_size;
    size_t *key_lens;
    bool *present;
    const char **picked; //  keys of the job being built
    size_t *picked_lens;
    //  counters, reported by stats
    uint64_t requests, lookups, hit_tokens, resets, reset_failures, refused, store_errors;
    kvp_metrics_t *metrics; //  the daemon's counters, or NULL
} self_t;

static void
s_self_destroy (self_t **self_p)
{
    assert (self_p);
    self_t *self = *self_p;
    if (self) {
        key_watch_destroy (&self->key_watch);
        zsock_destroy (&self->router);
        zsock_destroy (&self->jobs);
        lookup_keys_destroy (&self->keys);
        shm_index_destroy (&self->index);
        zlistx_destroy (&self->endpoints);
        zstr_free (&self->error);
        free (self->key_lens);
        free (self->present);
        free ((void *) self->picked);
        free (self->picked_lens);
        free (self->grouped);
        free (self->grouped_lens);
        free (self->grouped_text);
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
    const lookup_config_t *lookup = &args->lookup;
    self->block_size = lookup->block_size ? lookup->block_size : 16;
    self->tp_size = lookup->tp_size ? lookup->tp_size : 1;
    self->pp_size = lookup->pp_size ? lookup->pp_size : 1;
    self->max_key_len = args->max_key_len;
    self->store_timeout_ms = args->store_timeout_ms ? args->store_timeout_ms : STORE_TIMEOUT_MS;
    self->verbose = args->verbose;
    self->metrics = args->metrics;
    self->endpoints = zlistx_new ();
    assert (self->endpoints);
    zlistx_set_destructor (self->endpoints, (zlistx_destructor_fn *) zstr_free);
    const char *instance = args->instance ? args->instance : "";
    shm_index_make_name (self->index_name, sizeof self->index_name, instance);

    //  Jobs never block the actor: one the DEALER cannot queue fails its request.
    self->jobs = zsock_new (ZMQ_DEALER);
    assert (self->jobs);
    zsock_set_sndtimeo (self->jobs, 0);
    if (zsock_connect (self->jobs, "inproc://%s-jobs", instance) == -1) {
        self->error = zsys_sprintf ("cannot connect to the store's jobs at inproc://%s-jobs: %s",
                                    instance, zmq_strerror (zmq_errno ()));
        return self;
    }
    const char *reason = NULL;
    const char *template;
    if (lookup_key_scheme (lookup->key_scheme, &template, &self->grouping)) {
        self->error = zsys_sprintf ("bad --lookup-key-scheme '%s' (known: v1, group, current)",
                                    lookup->key_scheme);
        return self;
    }
    uint32_t hash_block = lookup->hash_block_size ? lookup->hash_block_size : self->block_size;
    if (hash_block > self->block_size || self->block_size % hash_block) {
        self->error = zsys_sprintf ("--lookup-hash-block-size %u does not divide "
                                    "--lookup-block-size %u",
                                    hash_block, self->block_size);
        return self;
    }
    self->scale = self->block_size / hash_block;
    if (self->scale > 1 && self->grouping == LOOKUP_GROUPING_NONE) {
        self->error = strdup ("the v1 key scheme has one hash a block: --lookup-hash-block-size "
                              "must equal --lookup-block-size");
        return self;
    }
    self->eagle = lookup->eagle;
    self->keys = lookup_keys_new (lookup, &reason);
    if (!self->keys) {
        self->error = zsys_sprintf ("bad --lookup-key-template: %s", reason);
        return self;
    }
    if (args->admin_endpoint_count == 0 || !args->admin_endpoints) {
        self->error = strdup ("no admin endpoint");
        return self;
    }
    self->router = zsock_new (ZMQ_ROUTER);
    assert (self->router);
    zsock_set_maxmsgsize (self->router, MAX_FRAME_BYTES);
    //  vLLM's clients are REQ sockets, one request at a time: a connection that queues more
    //  is not one of them, and libzmq stops reading its socket instead.
    zsock_set_rcvhwm (self->router, MAX_QUEUED_REQUESTS);
    kvp_curve_server (args->curve, self->router);
    self->key_watch = key_watch_new (args->curve, KVP_ZAP_CLIENTS, "admin channel");
    for (size_t i = 0; i < args->admin_endpoint_count; i++) {
        const char *endpoint = args->admin_endpoints[i];
        if (zsock_bind (self->router, "%s", endpoint) == -1) {
            self->error =
                zsys_sprintf ("cannot bind %s: %s", endpoint, zmq_strerror (zmq_errno ()));
            zsock_destroy (&self->router);
            return self;
        }
        //  ZMQ_LAST_ENDPOINT has the port an ephemeral bind got.
        char *resolved = zsock_last_endpoint (self->router);
        zlistx_add_end (self->endpoints, resolved ? resolved : strdup (endpoint));
    }
    return self;
}

//  ---- the pipe --------------------------------------------------------------------------

//  ENDPOINTS: "OK" and the endpoints, or "ERROR" and the reason.
static void
s_reply_endpoints (self_t *self)
{
    zmsg_t *reply = zmsg_new ();
    if (self->error) {
        zmsg_addstr (reply, "ERROR");
        zmsg_addstr (reply, self->error);
    }
    else {
        zmsg_addstr (reply, "OK");
        for (char *endpoint = (char *) zlistx_first (self->endpoints); endpoint;
             endpoint = (char *) zlistx_next (self->endpoints))
            zmsg_addstr (reply, endpoint);
    }
    zmsg_send (&reply, self->pipe);
}

//  A pipe command other than $TERM.
static void
s_command (self_t *self, const char *command)
{
    if (streq (command, "ENDPOINTS"))
        s_reply_endpoints (self);
    else
        kvp_error ("unknown pipe command '%s'", command);
}

//  The pipe, read while a job is out (s_job_call): $TERM ends the actor.
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
    else
        s_command (self, command ? command : "");
    zstr_free (&command);
    zmsg_destroy (&msg);
}

//  ---- the store: jobs -------------------------------------------------------------------

//  A job came back on the DEALER: it is the caller's again. Any job back shows the store
//  answers, so requests stop failing at once.
static kvp_job_t *
s_job_back (self_t *self)
{
    kvp_job_t *job = kvp_job_recv (self->jobs);
    if (job) {
        assert (self->jobs_out > 0);
        self->jobs_out--;
        self->store_retry_at = 0;
    }
    return job;
}

//  Queues job for the api; destroys it if it cannot be queued. Returns 0 or -1.
static int
s_job_send (self_t *self, kvp_job_t **job_p)
{
    if (kvp_job_send (self->jobs, *job_p) == -1) {
        kvp_warning ("cannot queue a job for the store: %s", zmq_strerror (zmq_errno ()));
        kvp_job_destroy (job_p);
        return -1;
    }
    *job_p = NULL; //  the api's until it comes back
    self->jobs_out++;
    return 0;
}

//  Sends job and waits for it to come back. Returns it (the caller destroys it), or NULL
//  when the store failed: the job could not be queued, did not come back in time, or the
//  actor was told to end meanwhile. Other jobs that come back meanwhile are destroyed.
static kvp_job_t *
s_job_call (self_t *self, kvp_job_t *job)
{
    int64_t now = zclock_mono ();
    if (now < self->store_retry_at) {
        kvp_job_destroy (&job);
        self->store_errors++;
        return NULL;
    }
    kvp_job_t *sent = job;
    if (s_job_send (self, &job)) {
        self->store_errors++;
        return NULL;
    }
    int64_t deadline = now + (int64_t) self->store_timeout_ms;
    zmq_pollitem_t items[] = {{zsock_resolve (self->pipe), 0, ZMQ_POLLIN, 0},
                              {zsock_resolve (self->jobs), 0, ZMQ_POLLIN, 0}};
    while (!self->terminated) {
        int64_t left = deadline - zclock_mono ();
        if (left <= 0)
            break;
        if (zmq_poll (items, 2, (long) left) == -1) {
            if (zmq_errno () == EINTR)
                continue;
            break;
        }
        if (items[0].revents & ZMQ_POLLIN)
            s_handle_pipe (self);
        if (items[1].revents & ZMQ_POLLIN) {
            kvp_job_t *back = s_job_back (self);
            if (back == sent)
                return back;
            kvp_job_destroy (&back); //  late, or a TOUCH
        }
    }
    self->store_errors++;
    if (!self->terminated) {
        kvp_warning ("the store did not answer within %" PRIu64 " ms", self->store_timeout_ms);
        self->store_retry_at = zclock_mono () + STORE_RETRY_MS;
    }
    return NULL;
}

//  A job for the api: op, no keys.
static kvp_job_t *
s_job_new (int op)
{
    kvp_job_t *job = kvp_job_new (KVP_JOB_NONE, 0);
    assert (job);
    job->op = op;
    return job;
}

//  A job that failed as a whole is logged and destroyed; returns true then.
static bool
s_job_failed (self_t *self, kvp_job_t **job_p, const char *what)
{
    kvp_job_t *job = *job_p;
    if (!job)
        return true;
    if (job->status == KVPOOL_OK)
        return false;
    self->store_errors++;
    kvp_warning ("%s failed: status %d%s%s", what, job->status, *job->error ? ": " : "",
                 job->error);
    kvp_job_destroy (job_p);
    return true;
}

//  The node's read index, opened on first use (the replica-manager creates it).
static shm_index_t *
s_index (self_t *self)
{
    if (!self->index && zclock_mono () >= self->index_retry_at) {
        self->index = shm_index_open (self->index_name);
        if (!self->index)
            self->index_retry_at = zclock_mono () + INDEX_RETRY_MS;
    }
    return self->index;
}

//  Grows the scratch arrays to hold count keys. Returns 0 or -1.
static int
s_scratch (self_t *self, size_t count)
{
    if (count <= self->scratch_size)
        return 0;
    size_t *key_lens = (size_t *) realloc (self->key_lens, count * sizeof (size_t));
    if (key_lens)
        self->key_lens = key_lens;
    bool *present = (bool *) realloc (self->present, count * sizeof (bool));
    if (present)
        self->present = present;
    const char **picked = (const char **) realloc ((void *) self->picked, count * sizeof (char *));
    if (picked)
        self->picked = picked;
    size_t *picked_lens = (size_t *) realloc (self->picked_lens, count * sizeof (size_t));
    if (picked_lens)
        self->picked_lens = picked_lens;
    if (!key_lens || !present || !picked || !picked_lens)
        return -1;
    self->scratch_size = count;
    return 0;
}

//  How many leading blocks of keys[0 .. blocks x ranks) are whole (every rank's key stored)
//  into *whole. Returns 0, or -1 when the store failed.
static int
s_prefix (self_t *self, const char *const *keys, const size_t *lens, size_t blocks, size_t ranks,
          size_t *whole)
{
    //  The index first: a block it shows whole is there, and confirming the hits stamps the
    //  reads (their leases).
    shm_index_t *index = s_index (self);
    int64_t now = shm_index_clock_ms ();
    shm_index_batch_t batch;
    if (index)
        shm_index_batch_start (&batch, index, keys, lens, blocks * ranks);
    //  A block with a key the node vouches it does not hold (shm_index.h, "Absent keys")
    //  ends the count there, with no job either.
    size_t first = 0;
    bool absent = false;
    for (; first < blocks; first++) {
        size_t r = 0;
        for (; r < ranks; r++) {
            shm_index_hit_t hit;
            shm_index_find_t found =
                index ? shm_index_batch_find (&batch, first * ranks + r, &hit) : SHM_INDEX_ASK;
            if (found != SHM_INDEX_FOUND || !shm_index_confirm (&hit, now)) {
                absent = found == SHM_INDEX_ABSENT;
                break;
            }
        }
        if (r < ranks) {
            shm_index_hit_t hit;
            for (r++; index && !absent && r < ranks; r++)
                absent = shm_index_batch_find (&batch, first * ranks + r, &hit) == SHM_INDEX_ABSENT;
            break;
        }
    }
    *whole = first;
    if (first == blocks || (absent && shm_index_batch_absent_holds (&batch)))
        return 0;
    //  From the first block the index cannot vouch for: the store's PREFIX_MATCH, the same
    //  operation a client's prefix match is (it leases what it counts).
    size_t count = (blocks - first) * ranks;
    for (size_t i = 0; i < count; i++) {
        self->picked[i] = keys[first * ranks + i];
        self->picked_lens[i] = lens[first * ranks + i];
    }
    kvp_job_t *job = kvp_job_new_owning (KVP_JOB_NONE, count, self->picked, self->picked_lens);
    job->op = KVPOOL__V1__OP__PREFIX_MATCH;
    kvp_job_payload (job, KVP_PAYLOAD_PREFIX);
    job->prefix.ranks = (uint32_t) ranks;
    job = s_job_call (self, job);
    if (s_job_failed (self, &job, "prefix match"))
        return -1;
    *whole += job->result_count <= blocks - first ? (size_t) job->result_count : blocks - first;
    kvp_job_destroy (&job);
    return 0;
}

//  ---- requests --------------------------------------------------------------------------

//  The hashes of blocks [0, blocks) when a block spans scale of the engine's hashes: the
//  block's hashes concatenated (the group scheme) or its last one (current). Returns 0 with
//  *hashes_p / *lens_p pointing into self, or -1 when out of memory.
static int
s_group_hashes (self_t *self, const lookup_request_t *request, size_t blocks,
                char *const **hashes_p, const size_t **lens_p)
{
    if (self->scale == 1) {
        *hashes_p = request->hashes;
        *lens_p = request->hash_lens;
        return 0;
    }
    size_t text = 0;
    for (size_t b = 0; b < blocks; b++)
        for (size_t s = 0; s < self->scale; s++)
            if (self->grouping == LOOKUP_GROUPING_CONCAT || s + 1 == self->scale)
                text += request->hash_lens[b * self->scale + s];
    text += blocks;
    if (blocks > self->grouped_size) {
        char **grouped = (char **) realloc (self->grouped, blocks * sizeof (char *));
        if (grouped)
            self->grouped = grouped;
        size_t *lens = (size_t *) realloc (self->grouped_lens, blocks * sizeof (size_t));
        if (lens)
            self->grouped_lens = lens;
        if (!grouped || !lens)
            return -1;
        self->grouped_size = blocks;
    }
    if (text > self->grouped_text_size) {
        char *grown = (char *) realloc (self->grouped_text, text);
        if (!grown)
            return -1;
        self->grouped_text = grown;
        self->grouped_text_size = text;
    }
    char *at = self->grouped_text;
    for (size_t b = 0; b < blocks; b++) {
        self->grouped[b] = at;
        for (size_t s = 0; s < self->scale; s++)
            if (self->grouping == LOOKUP_GROUPING_CONCAT || s + 1 == self->scale) {
                size_t h = b * self->scale + s;
                memcpy (at, request->hashes[h], request->hash_lens[h]);
                at += request->hash_lens[h];
            }
        self->grouped_lens[b] = (size_t) (at - self->grouped[b]);
        *at++ = 0;
    }
    *hashes_p = self->grouped;
    *lens_p = self->grouped_lens;
    return 0;
}

//  The hit, in tokens, of `whole` leading blocks stored, for a request of token_len whose
//  blocks may count up to `limit`: an EAGLE engine drops the last block of a nonzero hit
//  (unless the request says not to).
static uint64_t
s_hit (self_t *self, const lookup_request_t *request, size_t whole, uint64_t limit)
{
    uint64_t blocks = whole < limit ? whole : limit;
    if (self->eagle && request->apply_eagle && blocks > 0)
        blocks--;
    return blocks * self->block_size;
}

//  Answers a lookup: the hit token count as 4 bytes big-endian, or b"\x00" on a failure.
//
//  The binary forms follow vLLM's server since July 2026: frame 1 is the request's token count
//  as it is; only whole blocks within it count, and a hit of every token (which would leave
//  the engine nothing to compute) is taken again within one token less. The msgpack forms'
//  clients aligned token_len and lowered a full hit themselves: there the hit is the whole
//  blocks found, capped at token_len (docs/lookup.md).
static zframe_t *
s_lookup (self_t *self, lookup_request_t *request)
{
    bool binary = request->form == LOOKUP_FORM_BINARY || request->form == LOOKUP_FORM_BINARY_EAGLE;
    uint64_t token_len = request->token_len;
    //  Blocks that can count: those within token_len (binary), or that start before it.
    uint64_t limit = binary ? token_len / self->block_size
                            : (token_len + self->block_size - 1) / self->block_size;
    size_t chunks = request->hash_count / self->scale;
    size_t blocks = chunks < limit ? chunks : (size_t) limit;
    size_t whole = 0;
    if (blocks > 0) {
        const char *reason = NULL;
        const char *const *keys;
        char *const *hashes;
        const size_t *hash_lens;
        if (s_group_hashes (self, request, blocks, &hashes, &hash_lens))
            return zframe_new (s_fail, sizeof s_fail);
        if (lookup_keys_expand (self->keys, hashes, hash_lens, blocks, self->max_key_len, &keys,
                                &reason)) {
            self->refused++;
            kvp_debug ("lookup refused: %s", reason);
            return zframe_new (s_fail, sizeof s_fail);
        }
        size_t ranks = lookup_keys_ranks (self->keys);
        if (s_scratch (self, blocks * ranks)
            || s_prefix (self, keys, lookup_keys_lens (self->keys), blocks, ranks, &whole))
            return zframe_new (s_fail, sizeof s_fail);
    }
    uint64_t hit = s_hit (self, request, whole, limit);
    if (binary && hit >= token_len && token_len > 0)
        hit = s_hit (self, request, whole, (token_len - 1) / self->block_size);
    else if (hit > token_len)
        hit = token_len;
    self->lookups++;
    self->hit_tokens += hit;
    metrics_lookup (self->metrics, hit);
    kvp_debug ("lookup %s token_len=%u hashes=%zu -> %u", lookup_request_form_name (request->form),
               request->token_len, request->hash_count, (unsigned) hit);
    uint8_t reply[4] = {(uint8_t) (hit >> 24), (uint8_t) (hit >> 16), (uint8_t) (hit >> 8),
                        (uint8_t) hit};
    return zframe_new (reply, sizeof reply);
}

static zframe_t *
s_reset (self_t *self)
{
    kvp_job_t *job = s_job_call (self, s_job_new (KVPOOL__V1__OP__RESET));
    if (s_job_failed (self, &job, "reset")) {
        self->reset_failures++;
        return zframe_new (s_fail, sizeof s_fail);
    }
    self->resets++;
    kvp_info ("reset removed %" PRIu64 " objects", job->result_count);
    kvp_job_destroy (&job);
    return zframe_new (s_ok, sizeof s_ok);
}

static zframe_t *
s_stats (self_t *self)
{
    kvp_job_t *job = s_job_call (self, s_job_new (KVPOOL__V1__OP__STATS));
    if (s_job_failed (self, &job, "stats"))
        return zframe_new (s_fail, sizeof s_fail);
    const kvp_stats_t *stats = kvp_job_stats (job);
    char *json = zsys_sprintf (
        "{\"objects\":%" PRIu64 ",\"bytes_used\":%" PRIu64 ",\"bytes_allocated\":%" PRIu64
        ",\"bytes_mounted\":%" PRIu64 ",\"pending_puts\":%" PRIu64 ",\"requests\":%" PRIu64
        ",\"lookups_served\":%" PRIu64 ",\"hit_tokens\":%" PRIu64 ",\"resets\":%" PRIu64
        ",\"reset_failures\":%" PRIu64 ",\"refused_requests\":%" PRIu64 ",\"store_errors\":%" PRIu64
        ",\"tp_size\":%u,\"pp_size\":%u,\"block_size\":%u}",
        stats->objects, stats->bytes_stored, stats->bytes_allocated, stats->bytes_mounted,
        stats->pending_puts, self->requests, self->lookups, self->hit_tokens, self->resets,
        self->reset_failures, self->refused, self->store_errors, self->tp_size, self->pp_size,
        self->block_size);
    kvp_job_destroy (&job);
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
        kvp_debug ("refused a request: %s", reason);
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
    //  A client key revoked since its connection opened is served nothing more.
    zframe_t *last = zmsg_last (msg);
    const char *fd = last ? zframe_meta (last, "__fd") : NULL;
    if (last
        && !key_watch_seen (self->key_watch, fd ? atoi (fd) : -1, zframe_meta (last, "User-Id"))) {
        self->refused++;
        zframe_destroy (&identity);
        zmsg_destroy (&msg);
        zmsg_destroy (&reply);
        return;
    }
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

//  A job came back that nobody waits for (a TOUCH, or one whose wait ended): it is done.
static void
s_handle_jobs (self_t *self)
{
    kvp_job_t *job = s_job_back (self);
    kvp_job_destroy (&job);
}

//  At $TERM: the jobs still out get EXIT_WAIT_MS to come back, then are abandoned (a job out
//  at the api is the api's to touch, so it cannot be freed here).
static void
s_wait_jobs_out (self_t *self)
{
    int64_t deadline = zclock_mono () + EXIT_WAIT_MS;
    zmq_pollitem_t item = {zsock_resolve (self->jobs), 0, ZMQ_POLLIN, 0};
    while (self->jobs_out > 0) {
        int64_t left = deadline - zclock_mono ();
        if (left <= 0 || zmq_poll (&item, 1, (long) left) <= 0)
            break;
        s_handle_jobs (self);
    }
    if (self->jobs_out > 0)
        kvp_warning ("abandoning %zu job(s) the store has not answered", self->jobs_out);
}

static int
s_pipe_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    (void) shell, (void) msg;
    s_command ((self_t *) arg, command);
    return 0;
}

//  (A reader ends the loop when $TERM came while it waited for a job: s_job_call.)
static int
s_jobs_reader (actor_shell_t *shell, zsock_t *jobs, void *arg)
{
    (void) shell, (void) jobs;
    self_t *self = (self_t *) arg;
    s_handle_jobs (self);
    return self->terminated ? -1 : 0;
}

static int
s_router_reader (actor_shell_t *shell, zsock_t *router, void *arg)
{
    (void) shell, (void) router;
    self_t *self = (self_t *) arg;
    s_handle_router (self);
    return self->terminated ? -1 : 0;
}

static int64_t
s_key_watch_due (actor_shell_t *shell, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    int64_t now = zclock_mono ();
    key_watch_check (self->key_watch, now);
    return self->key_watch ? now + KEY_WATCH_INTERVAL_MS : -1;
}

void
lookup_server_actor (zsock_t *pipe, void *args)
{
    assert (args);
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-lookup");
    self_t *self = s_self_new (pipe, (const lookup_server_args_t *) args);
    if (self->error)
        kvp_error ("%s", self->error);
    actor_shell_add (shell, self->jobs, s_jobs_reader);
    if (self->router)
        actor_shell_add (shell, self->router, s_router_reader);
    actor_shell_on_command (shell, s_pipe_command);
    actor_shell_on_tick (shell, s_key_watch_due);
    actor_shell_run (shell, self);
    s_wait_jobs_out (self);
    s_self_destroy (&self);
    actor_shell_destroy (&shell);
}

//  ---- self test -------------------------------------------------------------------------
//  The actor against a fake api: a ROUTER at inproc://<instance>-jobs that answers the jobs
//  itself (PREFIX_MATCH, TOUCH, RESET, STATS), as replica_manager's test plays
//  the allocator, and that publishes keys in a read index of that instance as the
//  replica-manager would. Every path of the actor is checked here without the rest of
//  kvpoold; tests/python/test_lookup.py checks the real daemon.

#include <msgpack.h>

typedef enum { FAKE_ANSWER, FAKE_UNAVAILABLE, FAKE_HOLD } s_fake_mode_t;

typedef struct {
    zsock_t *router;
    shm_index_t *index;
    //  the keys that exist: 1 if unpublished, else their index slot + 2
    zhashx_t *keys;
    s_fake_mode_t mode;
    bool complete;                   //  the index vouches for absent keys ("COMPLETE")
    zlistx_t *held;                  //  jobs kept unanswered (FAKE_HOLD)
    uint64_t exist_jobs, exist_keys; //  PREFIX_MATCH jobs seen; keys in the last one
    uint64_t touch_jobs, touch_keys; //  TOUCH jobs seen (none expected); keys in all of them
    uint64_t resets, stats_jobs;
} s_fake_t;

static void
s_fake_serve (s_fake_t *fake)
{
    zframe_t *id;
    kvp_job_t *job = kvp_job_recv_routed (fake->router, &id);
    if (!job)
        return;
    assert (job->kind == KVP_JOB_NONE && job->context == NULL);
    if (fake->mode == FAKE_HOLD) {
        zlistx_add_end (fake->held, job);
        zframe_destroy (&id);
        return;
    }
    if (fake->mode == FAKE_UNAVAILABLE)
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "the store is stopping");
    else if (job->op == KVPOOL__V1__OP__PREFIX_MATCH || job->op == KVPOOL__V1__OP__TOUCH) {
        if (job->op == KVPOOL__V1__OP__PREFIX_MATCH) {
            fake->exist_jobs++;
            fake->exist_keys = job->count;
        }
        else {
            fake->touch_jobs++;
            fake->touch_keys += job->count;
        }
        for (size_t i = 0; i < job->count; i++) {
            assert (job->items[i].key_len == strlen (job->items[i].key));
            job->items[i].status =
                zhashx_lookup (fake->keys, job->items[i].key) ? KVPOOL_OK : KVPOOL_OBJECT_NOT_FOUND;
        }
        //  As the api does for a prefix match: leading whole blocks.
        if (job->op == KVPOOL__V1__OP__PREFIX_MATCH)
            job->result_count = kvp_job_prefix_count (job);
    }
    else if (job->op == KVPOOL__V1__OP__RESET) {
        assert (job->count == 0);
        job->result_count = zhashx_size (fake->keys);
        for (void *slot = zhashx_first (fake->keys); slot; slot = zhashx_next (fake->keys))
            shm_index_remove (fake->index, (int64_t) (intptr_t) slot - 2);
        zhashx_purge (fake->keys);
        fake->resets++;
    }
    else if (job->op == KVPOOL__V1__OP__STATS) {
        fake->stats_jobs++;
        kvp_job_stats (job)->objects = zhashx_size (fake->keys);
        kvp_job_stats (job)->bytes_stored = 100 * kvp_job_stats (job)->objects;
    }
    else
        assert (false); //  the actor sends nothing else
    kvp_job_reply (fake->router, &id, job);
}

//  Pipe, each command with one argument: "ADD" key (replies 0); "PUBLISH" key, an added key
//  into the index (replies 0); "MODE" answer|unavailable|hold (replies 0); "DROP" "" destroys
//  the held jobs (replies 0); "STAMP" key, a published key: replies its last read
//  (shm_index_last_read, "8"); "COUNTS" "" serves the jobs queued first, then replies
//  exist_jobs, exist_keys, touch_jobs, touch_keys, resets, size, held.
static void
s_fake_api_actor (zsock_t *pipe, void *args)
{
    const char *instance = (const char *) args;
    char index_name[128];
    shm_index_make_name (index_name, sizeof index_name, instance);
    s_fake_t fake = {.router = zsock_new (ZMQ_ROUTER),
                     .index = shm_index_create (index_name, 1024),
                     .keys = zhashx_new (),
                     .mode = FAKE_ANSWER,
                     .held = zlistx_new ()};
    assert (fake.router && zsock_bind (fake.router, "inproc://%s-jobs", instance) == 0);
    assert (fake.router && fake.index && fake.keys && fake.held);
    zpoller_t *poller = zpoller_new (pipe, fake.router, NULL);
    zsock_signal (pipe, 0);
    bool terminated = false;
    while (!terminated) {
        void *which = zpoller_wait (poller, -1);
        if (which == fake.router)
            s_fake_serve (&fake);
        else if (which == pipe) {
            char *command, *arg;
            zsock_recv (pipe, "ss", &command, &arg);
            if (streq (command, "ADD")) {
                zhashx_insert (fake.keys, arg, (void *) 1);
                if (fake.complete)
                    shm_index_unlisted_add (fake.index, arg, strlen (arg));
                zsock_signal (pipe, 0);
            }
            else if (streq (command, "PUBLISH")) {
                assert (zhashx_lookup (fake.keys, arg));
                int64_t slot =
                    shm_index_insert (fake.index, arg, strlen (arg), 1, 0, 100, 1, false);
                assert (slot >= 0);
                if (fake.complete && zhashx_lookup (fake.keys, arg) == (void *) 1)
                    shm_index_unlisted_remove (fake.index, arg, strlen (arg), true);
                zhashx_update (fake.keys, arg, (void *) (intptr_t) (slot + 2));
                zsock_signal (pipe, 0);
            }
            else if (streq (command, "COMPLETE")) {
                //  As a node without a master: its unpublished keys counted, absence vouched
                //  for ("1"); or neither ("0").
                bool complete = streq (arg, "1");
                for (void *slot = zhashx_first (fake.keys); slot && complete != fake.complete;
                     slot = zhashx_next (fake.keys)) {
                    const char *key = (const char *) zhashx_cursor (fake.keys);
                    if (slot == (void *) 1 && complete)
                        shm_index_unlisted_add (fake.index, key, strlen (key));
                    else if (slot == (void *) 1)
                        shm_index_unlisted_remove (fake.index, key, strlen (key), true);
                }
                fake.complete = complete;
                shm_index_set_complete (fake.index, complete);
                zsock_signal (pipe, 0);
            }
            else if (streq (command, "STAMP")) {
                intptr_t slot = (intptr_t) zhashx_lookup (fake.keys, arg);
                assert (slot >= 2);
                zsock_send (pipe, "8", (uint64_t) shm_index_last_read (fake.index, slot - 2));
            }
            else if (streq (command, "MODE")) {
                fake.mode = streq (arg, "hold")          ? FAKE_HOLD
                            : streq (arg, "unavailable") ? FAKE_UNAVAILABLE
                                                         : FAKE_ANSWER;
                zsock_signal (pipe, 0);
            }
            else if (streq (command, "DROP")) {
                //  Their sender is gone: nobody else will destroy them.
                for (kvp_job_t *job = (kvp_job_t *) zlistx_first (fake.held); job;
                     job = (kvp_job_t *) zlistx_next (fake.held))
                    kvp_job_destroy (&job);
                zlistx_purge (fake.held);
                zsock_signal (pipe, 0);
            }
            else if (streq (command, "COUNTS")) {
                //  Jobs sent before the question are queued here already (inproc).
                while (zsock_events (fake.router) & ZMQ_POLLIN)
                    s_fake_serve (&fake);
                zsock_send (pipe, "8888888", fake.exist_jobs, fake.exist_keys, fake.touch_jobs,
                            fake.touch_keys, fake.resets, (uint64_t) zhashx_size (fake.keys),
                            (uint64_t) zlistx_size (fake.held));
            }
            else
                terminated = true;
            zstr_free (&command);
            zstr_free (&arg);
        }
        else
            break;
    }
    assert (zlistx_size (fake.held) == 0);
    zpoller_destroy (&poller);
    zlistx_destroy (&fake.held);
    zhashx_destroy (&fake.keys);
    shm_index_destroy (&fake.index);
    zsock_destroy (&fake.router);
}

static void
s_fake_command (zactor_t *fake, const char *command, const char *arg)
{
    zsock_send (fake, "ss", command, arg);
    zsock_wait (fake);
}

static void
s_fake_key (zactor_t *fake, const char *command, uint32_t tp, const char *hash)
{
    char key[256];
    snprintf (key, sizeof key, "m@tp_rank:%u@pcp0@dcp0@pp_rank:0@group:0@%s", tp, hash);
    s_fake_command (fake, command, key);
}

typedef struct {
    uint64_t exist_jobs, exist_keys, touch_jobs, touch_keys, resets, size, held;
} s_counts_t;

//  The last read of a key the fake published (0: none since it was published).
static int64_t
s_fake_stamp (zactor_t *fake, uint32_t tp, const char *hash)
{
    char key[256];
    snprintf (key, sizeof key, "m@tp_rank:%u@pcp0@dcp0@pp_rank:0@group:0@%s", tp, hash);
    zsock_send (fake, "ss", "STAMP", key);
    uint64_t read_ms = 0;
    zsock_recv (fake, "8", &read_ms);
    return (int64_t) read_ms;
}

static s_counts_t
s_fake_counts (zactor_t *fake)
{
    s_counts_t counts;
    zsock_send (fake, "ss", "COUNTS", "");
    zsock_recv (fake, "8888888", &counts.exist_jobs, &counts.exist_keys, &counts.touch_jobs,
                &counts.touch_keys, &counts.resets, &counts.size, &counts.held);
    return counts;
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
s_lookup_all_forms (zsock_t *client, uint32_t token_len, const char *const *hashes, size_t count,
                    int64_t binary_hit)
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
    //  The binary forms take frame 1 as the request's token count, vLLM's newest rule: whole
    //  blocks within it, and never all of it (binary_hit); the same with apply_eagle 1 or 0
    //  when the server runs no EAGLE.
    uint8_t hash_len[2] = {0, 4};
    uint8_t eagle[2] = {1, 0};
    const void *binary[] = {"lookup", tl, hash_len, blob, eagle};
    size_t binary_sizes[] = {6, 4, 2, 4 * count, 1};
    assert (s_ask_hit (client, 4, binary, binary_sizes) == binary_hit);
    assert (s_ask_hit (client, 5, binary, binary_sizes) == binary_hit);
    binary[4] = eagle + 1;
    assert (s_ask_hit (client, 5, binary, binary_sizes) == binary_hit);
    zframe_destroy (&packed);
    return hit;
}

//  Starts a server with args; returns it with the first endpoint it bound in *endpoint_p, or
//  NULL (the server) with the reason in *endpoint_p when it cannot serve. Caller frees
//  *endpoint_p.
static zactor_t *
s_server_start (const lookup_server_args_t *args, char **endpoint_p)
{
    zactor_t *server = zactor_new (lookup_server_actor, (void *) args);
    assert (server);
    zsock_send (server, "s", "ENDPOINTS");
    char *status;
    zsock_recv (server, "ss", &status, endpoint_p);
    bool ok = streq (status, "OK");
    zstr_free (&status);
    if (!ok)
        zactor_destroy (&server);
    return server;
}

static zsock_t *
s_client (const char *endpoint)
{
    zsock_t *req = zsock_new_req (endpoint);
    assert (req);
    zsock_set_rcvtimeo (req, 10000);
    return req;
}

void
lookup_server_test (bool verbose)
{
    char instance[32], ipc_endpoint[64];
    snprintf (instance, sizeof instance, "lstest%d", getpid ());
    snprintf (ipc_endpoint, sizeof ipc_endpoint, "ipc://@kvpool-lookup-test-%d", getpid ());
    zactor_t *fake = zactor_new (s_fake_api_actor, instance);
    assert (fake);

    const char *admin[] = {"tcp://127.0.0.1:*", ipc_endpoint};
    lookup_server_args_t args = {.lookup = {.model = "m", .tp_size = 2, .block_size = 16},
                                 .admin_endpoints = admin,
                                 .admin_endpoint_count = 2,
                                 .instance = instance,
                                 .max_key_len = 4096,
                                 .verbose = verbose};
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
        kvp_info ("lookup_server_test: bound %s and %s", tcp, ipc);
    zmsg_destroy (&endpoints);

    zsock_t *req = s_client (tcp);
    zsock_t *dealer = zsock_new_dealer (ipc);
    assert (dealer);
    zsock_set_rcvtimeo (dealer, 10000);

    //  ping, on both sockets.
    const void *ping[] = {"ping"};
    size_t ping_size[] = {4};
    assert (s_ask_byte (req, 1, ping, ping_size, 1));
    assert (s_ask_byte (dealer, 1, ping, ping_size, 1));

    //  Blocks 0 and 1 on both ranks, block 2 on rank 0 only, block 3 on both; none of them
    //  in the read index yet.
    const char *hashes[] = {"0a0b0c0d", "1a1b1c1d", "2a2b2c2d", "3a3b3c3d"};
    for (int b = 0; b < 4; b++)
        for (uint32_t tp = 0; tp < 2; tp++)
            if (b != 2 || tp == 0)
                s_fake_key (fake, "ADD", tp, hashes[b]);
    s_counts_t counts = s_fake_counts (fake);
    assert (counts.size == 7);

    //  Two leading blocks on every rank: 32 tokens; the miss in the middle ends the count.
    assert (s_lookup_all_forms (req, 100, hashes, 4, 32) == 32);
    assert (s_lookup_all_forms (dealer, 100, hashes, 4, 32) == 32);
    //  One PREFIX_MATCH job per lookup, over every key (4 blocks x 2 ranks); no index hit,
    //  no TOUCH.
    counts = s_fake_counts (fake);
    assert (counts.exist_jobs == 10 && counts.exist_keys == 8); //  (5 forms a call)
    assert (counts.touch_jobs == 0);
    //  token_len shorter than the stored blocks: capped, and blocks past it are not asked.
    assert (s_lookup_all_forms (req, 20, hashes, 4, 16) == 20);
    counts = s_fake_counts (fake);
    //  (the binary forms ask about the one block within 20 tokens)
    assert (counts.exist_jobs == 15 && counts.exist_keys == 2);
    assert (s_lookup_all_forms (req, 32, hashes, 4, 16) == 32);
    assert (s_lookup_all_forms (req, 1, hashes, 4, 0) == 1);
    //  A miss in the first block; an empty list; token_len 0 (neither asks the store).
    assert (s_lookup_all_forms (req, 100, hashes + 2, 2, 0) == 0);
    assert (s_lookup_all_forms (req, 100, hashes, 0, 0) == 0);
    assert (s_lookup_all_forms (req, 0, hashes, 4, 0) == 0);
    counts = s_fake_counts (fake);
    assert (counts.exist_jobs == 27); //  (1 token: no block within it for the binary forms)
    //  Without the partial block: three full blocks.
    const char *tail[] = {"0a0b0c0d", "1a1b1c1d", "3a3b3c3d"};
    assert (s_lookup_all_forms (req, 1000, tail, 3, 48) == 48);

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
    assert (s_lookup_all_forms (dealer, 100, hashes, 4, 32) == 32);

    //  Blocks 0 and 1 published in the read index: their keys are hits with no job, and each
    //  hit leaves the time of the lookup in its read stamp (its lease); the store is asked
    //  from block 2 on.
    for (int b = 0; b < 2; b++)
        for (uint32_t tp = 0; tp < 2; tp++)
            s_fake_key (fake, "PUBLISH", tp, hashes[b]);
    s_counts_t before = s_fake_counts (fake);
    int64_t started = shm_index_clock_ms ();
    assert (s_fake_stamp (fake, 0, hashes[0]) == 0);
    assert (s_lookup_all_forms (req, 100, hashes, 4, 32) == 32);
    counts = s_fake_counts (fake);
    assert (counts.exist_jobs == before.exist_jobs + 5 && counts.exist_keys == 4);
    for (int b = 0; b < 2; b++)
        for (uint32_t tp = 0; tp < 2; tp++) {
            int64_t read_ms = s_fake_stamp (fake, tp, hashes[b]);
            assert (read_ms >= started && read_ms <= shm_index_clock_ms ());
        }
    //  Every key in the index: no job at all; the stamps follow the lookups.
    before = counts;
    zclock_sleep (5);
    started = shm_index_clock_ms ();
    assert (s_lookup_all_forms (req, 100, hashes, 2, 32) == 32);
    counts = s_fake_counts (fake);
    assert (counts.exist_jobs == before.exist_jobs);
    assert (s_fake_stamp (fake, 1, hashes[1]) >= started);
    assert (counts.touch_jobs == 0);
    //  A store that vouches for absent keys (a node without a master): block 2's rank-1
    //  key is absent, so the count ends there with no job; a block of keys held but not
    //  published (block 3) is still asked about.
    s_fake_command (fake, "COMPLETE", "1");
    before = counts;
    assert (s_lookup_all_forms (req, 100, hashes, 4, 32) == 32);
    counts = s_fake_counts (fake);
    assert (counts.exist_jobs == before.exist_jobs);
    assert (s_lookup_all_forms (req, 1000, tail, 3, 48) == 48);
    counts = s_fake_counts (fake);
    assert (counts.exist_jobs == before.exist_jobs + 5 && counts.exist_keys == 2);
    s_fake_command (fake, "COMPLETE", "0");

    //  stats: JSON with the store's counters and the server's.
    const void *stats[] = {"stats"};
    size_t stats_size[] = {5};
    zframe_t *json = s_ask (req, 1, stats, stats_size);
    char *text = zframe_strdup (json);
    if (verbose)
        kvp_info ("lookup_server_test: stats %s", text);
    assert (text[0] == '{' && text[strlen (text) - 1] == '}');
    assert (strstr (text, "\"objects\":7,"));
    assert (strstr (text, "\"bytes_used\":700,"));
    assert (strstr (text, "\"resets\":0,"));
    assert (strstr (text, "\"lookups_served\":"));
    assert (strstr (text, "\"hit_tokens\":"));
    assert (strstr (text, "\"tp_size\":2,\"pp_size\":1,\"block_size\":16}"));
    zstr_free (&text);
    zframe_destroy (&json);

    //  reset: the store's RESET, then nothing is found (the index is emptied too).
    const void *reset[] = {"reset"};
    size_t reset_size[] = {5};
    assert (s_ask_byte (req, 1, reset, reset_size, 1));
    counts = s_fake_counts (fake);
    assert (counts.resets == 1 && counts.size == 0);
    assert (s_lookup_all_forms (req, 100, hashes, 4, 0) == 0);

    //  A store that is stopping answers UNAVAILABLE: lookups, resets and stats fail with
    //  b"\x00" (at once: the store answered); ping works; then it serves again.
    uint8_t tl100[4] = {0, 0, 0, 100};
    const char *one[] = {"0a0b0c0d"};
    zframe_t *one_packed = s_msgpack_hashes (one, 1);
    const void *one_lookup[] = {"lookup", tl100, zframe_data (one_packed)};
    size_t one_lookup_size[] = {6, 4, zframe_size (one_packed)};
    s_fake_command (fake, "MODE", "unavailable");
    assert (s_ask_byte (req, 3, one_lookup, one_lookup_size, 0));
    assert (s_ask_byte (req, 1, reset, reset_size, 0));
    assert (s_ask_byte (req, 1, stats, stats_size, 0));
    assert (s_ask_byte (req, 1, ping, ping_size, 1));
    s_fake_command (fake, "MODE", "answer");
    assert (s_ask_hit (req, 3, one_lookup, one_lookup_size) == 0);

    //  A second server on the same tcp endpoint cannot bind: ENDPOINTS says why.
    lookup_server_args_t taken = args;
    const char *taken_admin[] = {tcp};
    taken.admin_endpoints = taken_admin;
    taken.admin_endpoint_count = 1;
    char *reason;
    assert (s_server_start (&taken, &reason) == NULL);
    assert (strstr (reason, tcp));
    zstr_free (&reason);
    //  ... nor with a bad key template, nor with no endpoint at all.
    const char *any_port[] = {"tcp://127.0.0.1:*"};
    lookup_server_args_t bad_template = args;
    bad_template.lookup.key_template = "{model}/{rank}/{hash}";
    bad_template.admin_endpoints = any_port;
    bad_template.admin_endpoint_count = 1;
    assert (s_server_start (&bad_template, &reason) == NULL);
    assert (strstr (reason, "unknown field"));
    zstr_free (&reason);
    lookup_server_args_t no_endpoint = args;
    no_endpoint.admin_endpoint_count = 0;
    assert (s_server_start (&no_endpoint, &reason) == NULL);
    zstr_free (&reason);

    //  A key longer than the store's limit is refused before the store is asked.
    lookup_server_args_t short_keys = args;
    short_keys.admin_endpoints = any_port;
    short_keys.admin_endpoint_count = 1;
    short_keys.max_key_len = 20;
    char *short_endpoint;
    zactor_t *second = s_server_start (&short_keys, &short_endpoint);
    assert (second);
    zsock_t *short_req = s_client (short_endpoint);
    before = s_fake_counts (fake);
    assert (s_lookup_all_forms (short_req, 100, hashes, 4, -1) == -1);
    assert (s_lookup_all_forms (short_req, 100, hashes, 0, 0) == 0);
    counts = s_fake_counts (fake);
    assert (counts.exist_jobs == before.exist_jobs);
    zsock_destroy (&short_req);
    zstr_free (&short_endpoint);
    zactor_destroy (&second);

    //  $TERM while a job is out (a store that never answers) ends the actor at once: the
    //  job is abandoned, and the store that kept it destroys it.
    lookup_server_args_t held_args = short_keys;
    held_args.max_key_len = 4096;
    char *held_endpoint;
    second = s_server_start (&held_args, &held_endpoint);
    assert (second);
    zsock_t *held_req = s_client (held_endpoint);
    s_fake_command (fake, "MODE", "hold");
    zmsg_t *held_lookup = zmsg_new ();
    for (size_t i = 0; i < 3; i++)
        zmsg_addmem (held_lookup, one_lookup[i], one_lookup_size[i]);
    zmsg_send (&held_lookup, held_req);
    int64_t deadline = zclock_mono () + 10000;
    while (s_fake_counts (fake).held == 0 && zclock_mono () < deadline)
        zclock_sleep (5);
    assert (s_fake_counts (fake).held == 1);
    int64_t stopping = zclock_mono ();
    zactor_destroy (&second);
    if (verbose)
        kvp_info ("lookup_server_test: ended with a job out in %" PRId64 " ms",
                  zclock_mono () - stopping);
    assert (zclock_mono () - stopping < 5000);
    zsock_destroy (&held_req);
    zstr_free (&held_endpoint);
    s_fake_command (fake, "DROP", "");
    s_fake_command (fake, "MODE", "answer");

    //  With no store behind it, a lookup and a reset fail with b"\x00"; ping works. The
    //  lookup's job waits, queued, for a store that binds later, which answers it.
    char nobody[32];
    snprintf (nobody, sizeof nobody, "lsnone%d", getpid ());
    lookup_server_args_t alone = short_keys;
    alone.max_key_len = 4096;
    alone.instance = nobody;
    alone.store_timeout_ms = 200;
    char *alone_endpoint;
    second = s_server_start (&alone, &alone_endpoint);
    assert (second);
    zsock_t *alone_req = s_client (alone_endpoint);
    assert (s_ask_byte (alone_req, 1, ping, ping_size, 1));
    assert (s_ask_byte (alone_req, 3, one_lookup, one_lookup_size, 0));
    assert (s_ask_byte (alone_req, 1, reset, reset_size, 0));
    assert (s_ask_byte (alone_req, 1, stats, stats_size, 0));
    assert (s_ask_byte (alone_req, 1, ping, ping_size, 1));
    zactor_t *late = zactor_new (s_fake_api_actor, nobody);
    assert (late);
    int64_t hit = -1;
    deadline = zclock_mono () + 10000;
    while (hit == -1 && zclock_mono () < deadline) {
        hit = s_ask_hit (alone_req, 3, one_lookup, one_lookup_size);
        if (hit == -1)
            zclock_sleep (50);
    }
    assert (hit == 0);
    assert (s_fake_counts (late).exist_jobs >= 2);
    zsock_destroy (&alone_req);
    zstr_free (&alone_endpoint);
    zactor_destroy (&second);
    zactor_destroy (&late);
    zframe_destroy (&one_packed);

    zsock_destroy (&req);
    zsock_destroy (&dealer);
    zstr_free (&status);
    zstr_free (&tcp);
    zstr_free (&ipc);
    zactor_destroy (&server);
    zactor_destroy (&fake);
}
