/*  kv_events.h - the kv-events publisher: vLLM's KV-events stream of what the store holds.

    Two halves, on two threads:

    The feed (kv_events_feed_*) is the replica-manager's: it notes each event as a small
    record (kind, key) in the batch it is gathering, and hands the batch over every
    --kv-events-interval ms (or when it is large) as one pointer over an inproc socket,
    never waiting: if the publisher is that far behind, the batch is dropped and counted.

    The actor (kv_events_actor) owns the PUB socket, the replay ROUTER and the replay ring.
    Each batch it takes becomes one message [topic, seq (8 bytes big-endian), payload], its
    keys parsed with the lookup key template (actors/kv_events_encode.h says the payload).

        zactor_t *events = zactor_new (kv_events_actor, &config);   //  before the rm
        zstr_send (events, "ENDPOINTS");  //  "OK", the PUB endpoint[, the replay endpoint]
        zstr_send (events, "STATS");      //  "batches", "events", "dropped" as decimal strings

    The actor binds "inproc://<instance>-kvev"; start it before the replica-manager and end
    it after, so that the last batch the replica-manager hands over is published.
*/
#ifndef KV_EVENTS_H_INCLUDED
#define KV_EVENTS_H_INCLUDED

#include <czmq.h>

#include "infra/config.h"
#include "actors/kv_events_encode.h"

//  Batches the feed may have handed over and the actor not yet taken; past this the feed
//  drops batches (and counts their events).
#define KV_EVENTS_QUEUE_MAX 10000

//  Messages a subscriber may fall behind on the PUB socket before it loses some (vLLM's hwm).
#define KV_EVENTS_PUB_HWM 100000

typedef struct _kv_events_feed_t kv_events_feed_t;

//  The replica-manager's feed into the actor of this instance. Caller owns the return value
//  and must destroy it (which hands over the batch being gathered).
kv_events_feed_t *kv_events_feed_new (const char *instance, uint64_t interval_ms);

//  Hands over what is gathered; destroys; does nothing on NULL; sets *self_p to NULL.
void kv_events_feed_destroy (kv_events_feed_t **self_p);

//  Notes an event: STORED or REMOVED of key (len bytes), or CLEARED (key NULL).
void kv_events_feed_add (kv_events_feed_t *self, kv_event_kind_t kind, const char *key, size_t len,
                         uint64_t version);

//  Hands the batch over if it is due (or force and not empty), at now (zclock_mono).
void kv_events_feed_flush (kv_events_feed_t *self, int64_t now, bool force);

//  Milliseconds from now until the batch is due; -1 when nothing is gathered.
int64_t kv_events_feed_wait (kv_events_feed_t *self, int64_t now);

//  Events noted (kv_events_feed_add), handed over or not.
uint64_t kv_events_feed_events (kv_events_feed_t *self);

//  Events dropped because the actor was behind (or memory ran out).
uint64_t kv_events_feed_dropped (kv_events_feed_t *self);

//  The actor; args is the daemon's kvp_config_t.
void kv_events_actor (zsock_t *pipe, void *args);

void kv_events_test (bool verbose);

#endif
