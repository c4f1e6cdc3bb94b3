/*  kv_events.c - the kv-events publisher: vLLM's KV-events stream of what the store holds.

    DESIGN
    The replica-manager is the one place where keys become visible and go, so it is the one
    source of events, and its order is the stream's order. It must never wait for the
    publisher nor spend much per event, so it only appends a record (kind, key length, key)
    to a buffer (kv_events_feed_add: a memcpy, and a realloc when the buffer doubles) and,
    every --kv-events-interval ms, or at 4096 records or 1 MiB, sends the buffer's address to
    this actor over inproc with ZMQ_DONTWAIT (kv_events_feed_flush; the replica-manager's
    poll wakes for it). When the actor is so far behind that KV_EVENTS_QUEUE_MAX batches
    wait, the send fails: the batch is freed and its events counted as dropped (the next
    batch that gets through carries the count; STATS reports it). A put never stalls; a
    subscriber then misses those events with no sequence gap, which is why the queue is deep
    and the actor does nothing but encode and send.

    Each batch taken becomes one message of vLLM's ZmqEventPublisher:
        [topic, seq (8 bytes, big-endian, from 0, +1 a batch), payload]
    Keys are parsed here, off the data path, with the lookup key template
    (lookup_keys_parse): a key that follows it is an event with the hash as a u64
    (kv_events_hash_from_hex) and its tp/pp ranks; any other key is its own bytes hash.

    The payload's buffer is kept, shared (zmq_msg_copy counts references, no copy), in a
    ring of the last --kv-events-replay-size batches. A PUB socket drops messages for a
    subscriber more than KV_EVENTS_PUB_HWM behind, never blocking; the subscriber sees the
    gap in seq and asks the replay ROUTER for it: request [seq (8 bytes)] (a REQ socket, or a
    DEALER sending an empty delimiter first), replies [topic, seq, payload] for every kept
    batch from seq on, oldest first, then the end marker ["", ff ff ff ff ff ff ff ff, ""]
    (vLLM >= 0.26). A request older than the ring replays from its oldest batch (the
    subscriber sees that the first seq is not the one it asked for); a malformed request is
    dropped and counted.

    Replay limits. A replay sits in the ROUTER's queue for its requester until the requester
    reads it, and it holds its batches' buffers (shared with the ring while they are in it,
    its own once the ring moved on). So a requester (a routing id) has one replay queued at
    most, and all replays queued together take at most --kv-events-replay-bytes (one larger
    replay goes out when no other is queued); a request past either is dropped and counted
    (replays_refused). A replay's bytes are its payloads, frames and a fixed overhead. libzmq
    tells when a replay has left the queue: the end marker's seq frame is sent with
    zmq_msg_init_data and a free callback (s_replay_sent), which libzmq runs on its I/O
    thread once the frame is written to the connection, or dropped with it. The callback
    only subtracts the bytes and pushes the replay on a lock-free stack (replay_ledger_t)
    that this actor empties at its next request; the ledger is freed by the last of the
    actor and the callbacks still to run, so a replay freed after the actor ended is safe.

    Outside input. The only bytes from outside are replay requests, and they are not decoded:
    a request is taken only if it is exactly [identity, "", 8 bytes] (frame count and sizes,
    nothing else is read), so there is no parser here to fuzz. Everything else this actor
    reads (keys, through lookup_keys_parse) is the store's own, already checked by the api.

    Threads: this actor's (its loop: infra/actor_shell.h), which owns every socket here,
    the ring and the parser; the feed runs on the replica-manager's thread and shares
    nothing with it but the batches it hands over (ownership passes with the pointer).
    Ordering: batches are published in the order the replica-manager handed them over, and
    events in a batch in the order they happened there.
*/
#include "actors/kv_events.h"

#include "infra/log.h"

#include <stdatomic.h>
#include <time.h>

#include "infra/actor_shell.h"
#include "infra/curve.h"
#include "infra/endpoints.h"
#include "lookup_server/lookup_keys.h"

#define FEED_FLUSH_RECORDS 4096
#define FEED_FLUSH_BYTES (1 << 20)
#define FEED_INITIAL_BYTES 16384

//  A batch of records: kind (1 byte), key length (4 bytes, native), key.
typedef struct {
    uint64_t dropped_before; //  events the feed dropped since its last batch got through
    uint32_t count;
    size_t used, size;
    char data[];
} feed_batch_t;

struct _kv_events_feed_t {
    zsock_t *push;
    uint64_t interval_ms;
    feed_batch_t *batch; //  being gathered, or NULL
    int64_t started;     //  when its first record came
    uint64_t events, dropped, dropped_unreported;
};

kv_events_feed_t *
kv_events_feed_new (const char *instance, uint64_t interval_ms)
{
    kv_events_feed_t *self = (kv_events_feed_t *) zmalloc (sizeof *self);
    self->push = zsock_new (ZMQ_PUSH);
    assert (self->push);
    zsock_set_sndhwm (self->push, KV_EVENTS_QUEUE_MAX / 2);
    //  At shutdown the actor outlives us and takes what is queued.
    zsock_set_linger (self->push, 1000);
    int rc = zsock_connect (self->push, "inproc://%s-kvev", instance);
    assert (rc == 0);
    self->interval_ms = interval_ms ? interval_ms : 1;
    return self;
}

void
kv_events_feed_destroy (kv_events_feed_t **self_p)
{
    assert (self_p);
    kv_events_feed_t *self = *self_p;
    if (self) {
        kv_events_feed_flush (self, zclock_mono (), true);
        free (self->batch);
        zsock_destroy (&self->push);
        free (self);
        *self_p = NULL;
    }
}

void
kv_events_feed_add (kv_events_feed_t *self, kv_event_kind_t kind, const char *key, size_t len,
                    uint64_t version)
{
    if (!key)
        len = 0;
    if (len > UINT32_MAX)
        len = UINT32_MAX;
    self->events++;
    size_t need = 1 + sizeof (uint32_t) + sizeof (uint64_t) + len;
    feed_batch_t *batch = self->batch;
    if (!batch || batch->used + need > batch->size) {
        size_t size = batch ? batch->size * 2 : FEED_INITIAL_BYTES;
        while (size < (batch ? batch->used : 0) + need)
            size *= 2;
        feed_batch_t *grown = (feed_batch_t *) realloc (batch, sizeof (feed_batch_t) + size);
        if (!grown) {
            self->dropped++;
            self->dropped_unreported++;
            return;
        }
        if (!batch) {
            grown->used = 0;
            grown->count = 0;
            self->started = zclock_mono ();
        }
        grown->size = size;
        self->batch = batch = grown;
    }
    char *at = batch->data + batch->used;
    *at = (char) kind;
    uint32_t len32 = (uint32_t) len;
    memcpy (at + 1, &len32, sizeof len32);
    memcpy (at + 1 + sizeof len32, &version, sizeof version);
    if (len)
        memcpy (at + 1 + sizeof len32 + sizeof version, key, len);
    batch->used += need;
    batch->count++;
}

int64_t
kv_events_feed_wait (kv_events_feed_t *self, int64_t now)
{
    if (!self || !self->batch)
        return -1;
    int64_t due = self->started + (int64_t) self->interval_ms;
    return due > now ? due - now : 0;
}

void
kv_events_feed_flush (kv_events_feed_t *self, int64_t now, bool force)
{
    feed_batch_t *batch = self ? self->batch : NULL;
    if (!batch)
        return;
    if (!force && batch->count < FEED_FLUSH_RECORDS && batch->used < FEED_FLUSH_BYTES
        && now < self->started + (int64_t) self->interval_ms)
        return;
    self->batch = NULL;
    batch->dropped_before = self->dropped_unreported;
    if (zmq_send (zsock_resolve (self->push), &batch, sizeof batch, ZMQ_DONTWAIT) == sizeof batch)
        self->dropped_unreported = 0;
    else {
        //  The publisher is behind by a full queue: never wait for it.
        self->dropped += batch->count;
        self->dropped_unreported += batch->count;
        free (batch);
    }
}

uint64_t
kv_events_feed_events (kv_events_feed_t *self)
{
    return self ? self->events : 0;
}

uint64_t
kv_events_feed_dropped (kv_events_feed_t *self)
{
    return self ? self->dropped : 0;
}

//  ---- the actor ----------------------------------------------------------------------

typedef struct {
    uint64_t seq;
    zmq_msg_t payload;
} replay_slot_t;

//  Per message of a replay, beyond its payload: frames, the pipe's entries.
#define REPLAY_MESSAGE_COST 512
//  Per replay: the record, the hash entry, the end marker.
#define REPLAY_FIXED_COST 4096

typedef struct _replay_t replay_t;

//  What the actor and libzmq's I/O thread share about queued replays (see Replay limits).
typedef struct {
    _Atomic uint64_t queued;   //  bytes of the replays still queued
    _Atomic (replay_t *) done; //  replays that left the queue, for the actor to forget
    _Atomic int refs;          //  the actor, and one per replay queued
} replay_ledger_t;

struct _replay_t {
    replay_ledger_t *ledger;
    replay_t *next; //  on the ledger's done stack
    uint64_t bytes;
    char key[]; //  the requester's routing id, in hex: the key of self->replays
};

static void
s_ledger_release (replay_ledger_t *ledger)
{
    if (atomic_fetch_sub (&ledger->refs, 1) != 1)
        return;
    replay_t *replay = atomic_exchange (&ledger->done, NULL);
    while (replay) {
        replay_t *next = replay->next;
        free (replay);
        replay = next;
    }
    free (ledger);
}

//  libzmq's free callback for a replay's end-marker seq frame (its I/O thread, or the actor's
//  when a send fails): the replay has left the queue.
static void
s_replay_sent (void *data, void *hint)
{
    (void) data;
    replay_t *replay = (replay_t *) hint;
    replay_ledger_t *ledger = replay->ledger;
    atomic_fetch_sub (&ledger->queued, replay->bytes);
    replay_t *head = atomic_load (&ledger->done);
    do
        replay->next = head;
    while (!atomic_compare_exchange_weak (&ledger->done, &head, replay));
    s_ledger_release (ledger);
}

typedef struct {
    zsock_t *pipe;
    zsock_t *pull;   //  batches from the feed
    zsock_t *pub;    //  the stream
    zsock_t *replay; //  the replay ROUTER, or NULL
    const kvp_config_t *config;
    lookup_keys_t *keys; //  the lookup key template, for parsing
    kv_events_encoder_t *encoder;
    zlistx_t *endpoints; //  as bound
    char error[256];     //  why a bind failed, for ENDPOINTS
    uint64_t next_seq;
    replay_slot_t *ring;
    size_t ring_size, ring_count, ring_first; //  ring_first: index of the oldest
    uint64_t batches, events, dropped, bad_replays;
    replay_ledger_t *ledger;
    zhashx_t *replays; //  routing id (hex) -> replay_t, while its replay is queued
    uint64_t replays_busy, replays_over_cap; //  requests refused (Replay limits)
} self_t;

static void
s_bind (self_t *self, zsock_t *sock, const char *endpoint)
{
    int port = zsock_bind (sock, "%s", endpoint);
    if (port == -1) {
        if (!*self->error)
            snprintf (self->error, sizeof self->error, "cannot bind %s: %s", endpoint,
                      zmq_strerror (zmq_errno ()));
        return;
    }
    char resolved[512];
    kvp_endpoint_resolved (endpoint, port, resolved, sizeof resolved);
    zlistx_add_end (self->endpoints, resolved);
}

static self_t *
s_self_new (zsock_t *pipe, const kvp_config_t *config)
{
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->pipe = pipe;
    self->config = config;
    self->endpoints = zlistx_new ();
    zlistx_set_duplicator (self->endpoints, (zlistx_duplicator_fn *) strdup);
    zlistx_set_destructor (self->endpoints, (zlistx_destructor_fn *) zstr_free);
    self->pull = zsock_new (ZMQ_PULL);
    assert (self->pull);
    zsock_set_rcvhwm (self->pull, KV_EVENTS_QUEUE_MAX / 2);
    int rc = zsock_bind (self->pull, "inproc://%s-kvev", config->instance);
    assert (rc == 0);
    const char *reason = NULL;
    self->keys = lookup_keys_new (&config->lookup, &reason);
    if (!self->keys)
        snprintf (self->error, sizeof self->error, "--lookup-key-template: %s", reason);
    self->encoder = kv_events_encoder_new (config->kv_events_medium ? config->kv_events_medium : "",
                                           config->lookup.block_size, 0);
    assert (self->encoder);
    self->ledger = (replay_ledger_t *) zmalloc (sizeof (replay_ledger_t));
    atomic_init (&self->ledger->refs, 1);
    self->replays = zhashx_new ();
    self->ring_size = config->kv_events_replay_size ? config->kv_events_replay_size : 1;
    self->ring = (replay_slot_t *) calloc (self->ring_size, sizeof (replay_slot_t));
    assert (self->ring);
    self->pub = zsock_new (ZMQ_PUB);
    assert (self->pub);
    zsock_set_sndhwm (self->pub, KV_EVENTS_PUB_HWM);
    //  The last batches (those the replica-manager hands over as it ends) still go out.
    zsock_set_linger (self->pub, 200);
    kvp_curve_server (config->curve, self->pub);
    if (config->kv_events_endpoint)
        s_bind (self, self->pub, config->kv_events_endpoint);
    if (config->kv_events_replay_endpoint) {
        self->replay = zsock_new (ZMQ_ROUTER);
        assert (self->replay);
        //  A whole replay fits in the queue: each reply is five frames.
        zsock_set_sndhwm (self->replay, (int) (self->ring_size * 5 + 64));
        //  What is queued at the end is dropped at once (its callbacks run).
        zsock_set_linger (self->replay, 0);
        kvp_curve_server (config->curve, self->replay);
        s_bind (self, self->replay, config->kv_events_replay_endpoint);
    }
    return self;
}

static void
s_self_destroy (self_t **self_p)
{
    self_t *self = *self_p;
    if (!self)
        return;
    for (size_t i = 0; i < self->ring_count; i++)
        zmq_msg_close (&self->ring[(self->ring_first + i) % self->ring_size].payload);
    free (self->ring);
    lookup_keys_destroy (&self->keys);
    kv_events_encoder_destroy (&self->encoder);
    zlistx_destroy (&self->endpoints);
    zsock_destroy (&self->replay);
    //  Replays still queued are freed by their callbacks, with the ledger by the last one.
    zhashx_destroy (&self->replays);
    s_ledger_release (self->ledger);
    zsock_destroy (&self->pub);
    zsock_destroy (&self->pull);
    free (self);
    *self_p = NULL;
}

static void
s_payload_free (void *data, void *hint)
{
    (void) hint;
    free (data);
}

static void
s_seq_bytes (uint64_t seq, unsigned char out[8])
{
    for (int i = 7; i >= 0; i--) {
        out[i] = (unsigned char) (seq & 0xff);
        seq >>= 8;
    }
}

static double
s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

//  One batch from the feed: encoded, published, kept for replay; freed.
static void
s_publish (self_t *self, feed_batch_t *batch)
{
    self->dropped += batch->dropped_before;
    if (batch->count == 0 || !self->keys) {
        self->dropped += batch->count;
        free (batch);
        return;
    }
    kv_events_encoder_begin (self->encoder, s_now (), batch->count);
    const char *at = batch->data;
    for (uint32_t i = 0; i < batch->count; i++) {
        kv_event_t event = {.kind = (kv_event_kind_t) (unsigned char) at[0]};
        uint32_t len;
        memcpy (&len, at + 1, sizeof len);
        memcpy (&event.version, at + 1 + sizeof len, sizeof event.version);
        const char *key = at + 1 + sizeof len + sizeof event.version;
        at = key + len;
        const char *hash;
        size_t hash_len;
        if (event.kind == KV_EVENT_CLEARED)
            ;
        else if (lookup_keys_parse (self->keys, key, len, &hash, &hash_len, &event.tp_rank,
                                    &event.pp_rank)) {
            event.hash_int = kv_events_hash_from_hex (hash, hash_len);
            event.has_ranks = true;
        }
        else {
            event.hash_bytes = key;
            event.hash_len = len;
        }
        kv_events_encoder_add (self->encoder, &event);
    }
    uint32_t count = batch->count;
    free (batch);
    size_t size;
    void *payload = kv_events_encoder_end (self->encoder, &size);
    if (!payload) {
        self->dropped += count;
        return;
    }
    self->events += count;
    //  The ring's oldest slot gives way when the ring is full.
    if (self->ring_count == self->ring_size) {
        zmq_msg_close (&self->ring[self->ring_first].payload);
        self->ring_first = (self->ring_first + 1) % self->ring_size;
        self->ring_count--;
    }
    replay_slot_t *slot = &self->ring[(self->ring_first + self->ring_count) % self->ring_size];
    self->ring_count++;
    slot->seq = self->next_seq++;
    int rc = zmq_msg_init_data (&slot->payload, payload, size, s_payload_free, NULL);
    assert (rc == 0);
    self->batches++;

    //  PUB never blocks: a subscriber at its high-water mark loses the whole message.
    void *pub = zsock_resolve (self->pub);
    const char *topic = self->config->kv_events_topic ? self->config->kv_events_topic : "";
    unsigned char seq[8];
    s_seq_bytes (slot->seq, seq);
    zmq_msg_t copy;
    zmq_msg_init (&copy);
    zmq_msg_copy (&copy, &slot->payload);
    zmq_send (pub, topic, strlen (topic), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send (pub, seq, sizeof seq, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (zmq_msg_send (&copy, pub, ZMQ_DONTWAIT) == -1)
        zmq_msg_close (&copy);
}

//  Takes every batch waiting (at most limit), so a burst is published in one wake-up.
static void
s_take_batches (self_t *self, size_t limit)
{
    void *pull = zsock_resolve (self->pull);
    for (size_t n = 0; n < limit; n++) {
        feed_batch_t *batch;
        if (zmq_recv (pull, &batch, sizeof batch, ZMQ_DONTWAIT) != sizeof batch)
            break;
        s_publish (self, batch);
    }
}

static uint64_t
s_replay_from (self_t *self, zframe_t *start)
{
    uint64_t from = 0;
    const unsigned char *bytes = zframe_data (start);
    for (int i = 0; i < 8; i++)
        from = (from << 8) | bytes[i];
    uint64_t oldest = self->next_seq - self->ring_count;
    return from < oldest ? oldest : from;
}

//  Forgets the replays that left the queue since the last request.
static void
s_replays_forget (self_t *self)
{
    replay_t *replay = atomic_exchange (&self->ledger->done, NULL);
    while (replay) {
        replay_t *next = replay->next;
        zhashx_delete (self->replays, replay->key);
        free (replay);
        replay = next;
    }
}

//  Whether a request may have its replay (see Replay limits): the replay's record, counted
//  in the ledger and the requester's entry, or NULL (counted) when refused.
static replay_t *
s_replay_admit (self_t *self, zframe_t *identity, zframe_t *start)
{
    s_replays_forget (self);
    char *key = zframe_strhex (identity);
    if (zhashx_lookup (self->replays, key)) {
        self->replays_busy++; //  its previous replay is still queued
        free (key);
        return NULL;
    }
    const char *topic = self->config->kv_events_topic ? self->config->kv_events_topic : "";
    uint64_t oldest = self->next_seq - self->ring_count;
    uint64_t per_message = REPLAY_MESSAGE_COST + zframe_size (identity) + strlen (topic) + 8;
    uint64_t bytes = REPLAY_FIXED_COST;
    for (uint64_t seq = s_replay_from (self, start); seq < self->next_seq; seq++)
        bytes += per_message
                 + zmq_msg_size (
                     &self->ring[(self->ring_first + (seq - oldest)) % self->ring_size].payload);
    uint64_t queued = atomic_load (&self->ledger->queued);
    if (queued > 0 && queued + bytes > self->config->kv_events_replay_bytes) {
        self->replays_over_cap++;
        free (key);
        return NULL;
    }
    replay_t *replay = (replay_t *) malloc (sizeof (replay_t) + strlen (key) + 1);
    assert (replay);
    replay->ledger = self->ledger;
    replay->next = NULL;
    replay->bytes = bytes;
    strcpy (replay->key, key);
    free (key);
    atomic_fetch_add (&self->ledger->queued, bytes);
    atomic_fetch_add (&self->ledger->refs, 1);
    zhashx_insert (self->replays, replay->key, replay);
    return replay;
}

//  A replay request: [identity, "", seq (8 bytes)].
static void
s_replay (self_t *self)
{
    zmsg_t *request = zmsg_recv (self->replay);
    if (!request)
        return;
    zframe_t *identity = zmsg_pop (request);
    zframe_t *delimiter = zmsg_pop (request);
    zframe_t *start = zmsg_pop (request);
    bool good = identity && delimiter && zframe_size (delimiter) == 0 && start
                && zframe_size (start) == 8 && zmsg_size (request) == 0;
    replay_t *replay = NULL;
    if (!good)
        self->bad_replays++;
    else
        replay = s_replay_admit (self, identity, start);
    if (replay) {
        uint64_t from = s_replay_from (self, start);
        uint64_t oldest = self->next_seq - self->ring_count;
        void *router = zsock_resolve (self->replay);
        const char *topic = self->config->kv_events_topic ? self->config->kv_events_topic : "";
        int flags = ZMQ_SNDMORE | ZMQ_DONTWAIT;
        for (uint64_t seq = from; seq < self->next_seq; seq++) {
            replay_slot_t *slot =
                &self->ring[(self->ring_first + (seq - oldest)) % self->ring_size];
            unsigned char seq_bytes[8];
            s_seq_bytes (slot->seq, seq_bytes);
            zmq_msg_t copy;
            zmq_msg_init (&copy);
            zmq_msg_copy (&copy, &slot->payload);
            zmq_send (router, zframe_data (identity), zframe_size (identity), flags);
            zmq_send (router, "", 0, flags);
            zmq_send (router, topic, strlen (topic), flags);
            zmq_send (router, seq_bytes, 8, flags);
            if (zmq_msg_send (&copy, router, ZMQ_DONTWAIT) == -1)
                zmq_msg_close (&copy);
        }
        static const unsigned char end_seq[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        zmq_send (router, zframe_data (identity), zframe_size (identity), flags);
        zmq_send (router, "", 0, flags);
        zmq_send (router, "", 0, flags);
        zmq_msg_t last; //  its free callback says the replay left the queue
        zmq_msg_init_data (&last, (void *) end_seq, 8, s_replay_sent, replay);
        if (zmq_msg_send (&last, router, flags) == -1)
            zmq_msg_close (&last);
        zmq_send (router, "", 0, ZMQ_DONTWAIT);
    }
    zframe_destroy (&identity);
    zframe_destroy (&delimiter);
    zframe_destroy (&start);
    zmsg_destroy (&request);
}

//  $TERM (or the pipe gone): what the replica-manager handed over before it ended goes
//  out too.
static int
s_term (actor_shell_t *shell, void *arg)
{
    (void) shell;
    s_take_batches ((self_t *) arg, SIZE_MAX);
    return 0;
}

static int
s_pipe_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    (void) shell, (void) msg;
    self_t *self = (self_t *) arg;
    if (streq (command, "ENDPOINTS"))
        kvp_endpoints_reply (self->pipe, self->endpoints, self->error);
    else if (streq (command, "STATS")) {
        s_take_batches (self, SIZE_MAX);
        zsock_send (self->pipe, "888", self->batches, self->events, self->dropped);
    }
    else {
        kvp_error ("invalid pipe command '%s'", command);
        assert (false);
    }
    return 0;
}

static int
s_pull_reader (actor_shell_t *shell, zsock_t *pull, void *arg)
{
    (void) shell, (void) pull;
    s_take_batches ((self_t *) arg, 64);
    return 0;
}

static int
s_replay_reader (actor_shell_t *shell, zsock_t *replay, void *arg)
{
    (void) shell, (void) replay;
    s_replay ((self_t *) arg);
    return 0;
}

void
kv_events_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-kv-events");
    self_t *self = s_self_new (pipe, (const kvp_config_t *) args);
    actor_shell_add (shell, self->pull, s_pull_reader);
    if (self->replay)
        actor_shell_add (shell, self->replay, s_replay_reader);
    actor_shell_on_command (shell, s_pipe_command);
    actor_shell_on_term (shell, s_term);
    actor_shell_run (shell, self);
    if (self->dropped)
        kvp_warning ("%llu events dropped (the publisher was behind)",
                     (unsigned long long) self->dropped);
    if (self->replays_busy || self->replays_over_cap)
        kvp_warning ("replay requests refused: %llu while the requester's previous replay was "
                     "queued, %llu past --kv-events-replay-bytes",
                     (unsigned long long) self->replays_busy,
                     (unsigned long long) self->replays_over_cap);
    s_self_destroy (&self);
    actor_shell_destroy (&shell);
}

//  ---- self test ---------------------------------------------------------------------

void
kv_events_test (bool verbose)
{
    kvp_config_t config;
    kvp_config_defaults (&config);
    snprintf (config.instance, sizeof config.instance, "kvevtest");
    config.kv_events_endpoint = "inproc://kvevtest-pub";
    config.kv_events_replay_endpoint = "inproc://kvevtest-replay";
    config.kv_events_replay_size = 3;
    config.lookup.model = "m";
    zactor_t *actor = zactor_new (kv_events_actor, &config);
    assert (actor);
    zlist_t *endpoints = kvp_endpoints_ask (actor, "kv events");
    assert (endpoints && zlist_size (endpoints) == 2);
    zlist_destroy (&endpoints);
    zsock_t *sub = zsock_new_sub ("inproc://kvevtest-pub", "");
    assert (sub);
    zclock_sleep (50); //  the subscription reaches the PUB socket

    kv_events_feed_t *feed = kv_events_feed_new (config.instance, 1);
    const char *template_key = "m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@00ff";
    for (int batch = 0; batch < 5; batch++) {
        kv_events_feed_add (feed, KV_EVENT_STORED, template_key, strlen (template_key), 0);
        kv_events_feed_add (feed, KV_EVENT_REMOVED, "plain", 5, 0);
        if (batch == 4)
            kv_events_feed_add (feed, KV_EVENT_CLEARED, NULL, 0, 0);
        kv_events_feed_flush (feed, zclock_mono (), true);
    }
    assert (kv_events_feed_wait (feed, zclock_mono ()) == -1);
    for (uint64_t seq = 0; seq < 5; seq++) {
        zmsg_t *msg = zmsg_recv (sub);
        assert (msg && zmsg_size (msg) == 3);
        zframe_t *topic = zmsg_first (msg);
        assert (zframe_size (topic) == 0);
        zframe_t *seq_frame = zmsg_next (msg);
        assert (zframe_size (seq_frame) == 8 && zframe_data (seq_frame)[7] == seq);
        zframe_t *payload = zmsg_next (msg);
        //  [ts, [stored, removed(, cleared)], 0]: the stored event's hash is 0xff.
        const byte *data = zframe_data (payload);
        assert (data[0] == 0x93 && data[1] == 0xcb && data[10] == (seq == 4 ? 0x93 : 0x92));
        assert (memmem (data, zframe_size (payload),
                        "\xac"
                        "block_hashes\x91\xcc\xff",
                        16));
        assert (memmem (data, zframe_size (payload), "\x91\xc4\x05plain", 8));
        zmsg_destroy (&msg);
    }
    //  Replay from 0: the ring keeps 2, 3, 4; then the end marker.
    zsock_t *replay = zsock_new_dealer ("inproc://kvevtest-replay");
    assert (replay);
    zsock_send (replay, "zb", "\0\0\0\0\0\0\0\0", (size_t) 8);
    for (int expect = 2; expect <= 5; expect++) {
        zmsg_t *msg = zmsg_recv (replay);
        assert (msg && zmsg_size (msg) == 4);
        zmsg_first (msg); //  the empty delimiter, then the topic, then seq
        zmsg_next (msg);
        zframe_t *seq_frame = zmsg_next (msg);
        assert (zframe_size (seq_frame) == 8);
        if (expect < 5)
            assert (zframe_data (seq_frame)[7] == expect && zframe_size (zmsg_last (msg)) > 0);
        else
            assert (zframe_data (seq_frame)[0] == 0xff && zframe_size (zmsg_last (msg)) == 0);
        zmsg_destroy (&msg);
    }
    //  A malformed request is dropped; the actor keeps serving.
    zstr_send (replay, "nonsense");
    zsock_send (actor, "s", "STATS");
    uint64_t batches, events, dropped;
    zsock_recv (actor, "888", &batches, &events, &dropped);
    assert (batches == 5 && events == 11 && dropped == 0);
    if (verbose)
        printf ("\n  %llu batches, %llu events\n", (unsigned long long) batches,
                (unsigned long long) events);
    kv_events_feed_destroy (&feed);
    zsock_destroy (&replay);
    zsock_destroy (&sub);
    zactor_destroy (&actor);
}
