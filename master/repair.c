/*  repair.c - the master's repair of objects that lack replicas, and drains (repair.h).

    DESIGN
    The queue holds keys (copies), each at most once (the `queued` set), oldest first; the
    entry is looked up again whenever a key is looked at, so a key removed, upserted or
    repaired meanwhile costs nothing but the look. A key handed to a node is `in flight`
    until the node claims it or REPAIR_INFLIGHT_MS pass (a node that died mid-copy): then
    it is queued again if it still lacks replicas. A walk of the directory (repair_rescan)
    finds what a node's death or drain left lacking; it runs at a tick, not in the request
    that asked for it, at most once a REPAIR_RESCAN_MIN_MS, and again every
    REPAIR_RESCAN_IDLE_MS while something still lacks replicas and nothing is queued (an
    object that lacked a node to go to finds one that joined; a copy that failed is tried
    again).

    Which node copies which object: the node that asks takes an object it holds no replica
    of, unless its host holds one already and a live node elsewhere holds none (then that
    node will take it when it asks): replicas on distinct hosts while there are enough.

    Threads: none; the master actor's.
*/
#include "master/repair.h"

#include <czmq.h>

#include "infra/log.h"
#include "kvpool_status.h"
#include "protocol/contract.h"

//  A copy handed out and not claimed within this long is handed out again.
#define REPAIR_INFLIGHT_MS 30000
#define REPAIR_RESCAN_MIN_MS 200
#define REPAIR_RESCAN_IDLE_MS 5000
//  Keys queued at most (a walk finds the rest at the next one).
#define REPAIR_QUEUE_MAX 1000000
//  Keys one REPAIR looks at, and hands out, at most.
#define REPAIR_LOOK_MAX 4096
#define REPAIR_HAND_MAX 512

struct _repair_t {
    directory_t *directory;
    node_table_t *nodes;
    zlistx_t *queue;    //  keys (owned), oldest first
    zhashx_t *queued;   //  key -> 1: in the queue
    zhashx_t *inflight; //  key -> deadline (zclock_mono ms, as a pointer)
    bool rescan;
    int64_t last_scan;
    uint64_t missing, done, bytes;
};

repair_t *
repair_new (directory_t *directory, node_table_t *nodes)
{
    repair_t *self = (repair_t *) zmalloc (sizeof (repair_t));
    self->directory = directory;
    self->nodes = nodes;
    self->queue = zlistx_new ();
    self->queued = zhashx_new ();
    self->inflight = zhashx_new ();
    assert (self->queue && self->queued && self->inflight);
    zlistx_set_destructor (self->queue, (zlistx_destructor_fn *) zstr_free);
    return self;
}

void
repair_restart (repair_t *self, directory_t *directory, node_table_t *nodes)
{
    self->directory = directory;
    self->nodes = nodes;
    zlistx_purge (self->queue);
    zhashx_purge (self->queued);
    zhashx_purge (self->inflight);
    self->missing = 0;
    self->rescan = true;
}

void
repair_destroy (repair_t **self_p)
{
    repair_t *self = *self_p;
    if (!self)
        return;
    zlistx_destroy (&self->queue);
    zhashx_destroy (&self->queued);
    zhashx_destroy (&self->inflight);
    free (self);
    *self_p = NULL;
}

static bool
s_counts (repair_t *self, uint16_t slot)
{
    const node_t *node = node_table_get (self->nodes, slot);
    return node && node->alive && !node->draining;
}

//  Live replicas of entry on nodes that are not draining (but for `except`).
static uint8_t
s_live (repair_t *self, const dir_entry_t *entry, int except)
{
    uint8_t live = 0;
    for (uint8_t i = 0; i < entry->holder_count; i++)
        if (!directory_is_cache (entry, i) && entry->holders[i] != except
            && s_counts (self, entry->holders[i]))
            live++;
    return live;
}

static uint8_t
s_want (const dir_entry_t *entry)
{
    return entry->want ? entry->want : 1;
}

static uint8_t
s_lacking (repair_t *self, const dir_entry_t *entry)
{
    if (entry->state != DIR_COMMITTED)
        return 0;
    uint8_t live = s_live (self, entry, -1);
    uint8_t want = s_want (entry);
    return live < want ? want - live : 0;
}

static void
s_queue (repair_t *self, const char *key)
{
    if (zhashx_lookup (self->queued, key) || zhashx_lookup (self->inflight, key)
        || zlistx_size (self->queue) >= REPAIR_QUEUE_MAX)
        return;
    zhashx_insert (self->queued, key, (void *) 1);
    zlistx_add_end (self->queue, strdup (key));
}

void
repair_rescan (repair_t *self)
{
    self->rescan = true;
}

void
repair_note (repair_t *self, const dir_entry_t *entry)
{
    uint8_t lacking = s_lacking (self, entry);
    if (lacking) {
        self->missing += lacking;
        s_queue (self, entry->key);
    }
}

static void
s_scan (repair_t *self, int64_t now)
{
    uint64_t missing = 0;
    for (dir_entry_t *entry = directory_first (self->directory); entry;
         entry = directory_next (self->directory)) {
        uint8_t lacking = s_lacking (self, entry);
        if (!lacking)
            continue;
        missing += lacking;
        s_queue (self, entry->key);
    }
    self->missing = missing;
    self->rescan = false;
    self->last_scan = now;
}

void
repair_tick (repair_t *self, int64_t now)
{
    //  Copies never claimed (the node died, or its copy failed): queued again.
    if (zhashx_size (self->inflight)) {
        zlistx_t *expired = zhashx_keys (self->inflight);
        for (char *key = (char *) zlistx_first (expired); key;
             key = (char *) zlistx_next (expired)) {
            int64_t deadline = (int64_t) (intptr_t) zhashx_lookup (self->inflight, key);
            if (deadline > now)
                continue;
            zhashx_delete (self->inflight, key);
            dir_entry_t *entry = directory_find (self->directory, key);
            if (entry && s_lacking (self, entry))
                s_queue (self, key);
        }
        zlistx_destroy (&expired);
    }
    bool idle = self->missing && zlistx_size (self->queue) == 0 && zhashx_size (self->inflight) == 0
                && now - self->last_scan >= REPAIR_RESCAN_IDLE_MS;
    if ((self->rescan && now - self->last_scan >= REPAIR_RESCAN_MIN_MS) || idle)
        s_scan (self, now);
}

static void
s_unqueue (repair_t *self, void *handle, const char *key)
{
    zhashx_delete (self->queued, key);
    zlistx_delete (self->queue, handle);
}

//  Whether node slot should copy entry now (repair.h, "which node copies which object").
static bool
s_fits (repair_t *self, int slot, const dir_entry_t *entry)
{
    const node_t *node = node_table_get (self->nodes, slot);
    for (uint8_t i = 0; i < entry->holder_count; i++)
        if (entry->holders[i] == slot && !directory_is_cache (entry, i))
            return false;
    if (node->capacity < entry->size)
        return false;
    bool host_holds = false;
    for (uint8_t i = 0; i < entry->holder_count && !host_holds; i++) {
        const node_t *holder = node_table_get (self->nodes, entry->holders[i]);
        host_holds = !directory_is_cache (entry, i) && holder && holder->alive
                     && strcmp (holder->host_id, node->host_id) == 0;
    }
    if (!host_holds)
        return true;
    //  Another host with no replica yet, and a node there that could take it, goes first.
    for (size_t other = 0; other < node_table_size (self->nodes); other++) {
        const node_t *candidate = node_table_get (self->nodes, (int) other);
        if ((int) other == slot || !s_counts (self, (uint16_t) other)
            || candidate->capacity < entry->size || directory_holds (entry, (uint16_t) other))
            continue;
        bool holds = false;
        for (uint8_t i = 0; i < entry->holder_count && !holds; i++) {
            const node_t *holder = node_table_get (self->nodes, entry->holders[i]);
            holds = !directory_is_cache (entry, i) && holder && holder->alive
                    && strcmp (holder->host_id, candidate->host_id) == 0;
        }
        if (!holds)
            return false;
    }
    return true;
}

void
repair_work (repair_t *self, int slot, uint64_t budget, Kvpool__Cluster__V1__MasterReply *reply,
             arena_t *arena, int64_t now)
{
    if (budget == 0 || !s_counts (self, (uint16_t) slot) || zlistx_size (self->queue) == 0)
        return;
    size_t room =
        zlistx_size (self->queue) < REPAIR_HAND_MAX ? zlistx_size (self->queue) : REPAIR_HAND_MAX;
    reply->keys = (ProtobufCBinaryData *) arena_alloc (arena, room * sizeof (ProtobufCBinaryData));
    reply->sizes = (uint64_t *) arena_alloc (arena, room * sizeof (uint64_t));
    reply->versions = (uint64_t *) arena_alloc (arena, room * sizeof (uint64_t));
    if (!reply->keys || !reply->sizes || !reply->versions)
        return;
    uint64_t given = 0;
    size_t looked = 0, n = 0;
    char *key = (char *) zlistx_first (self->queue);
    while (key && looked++ < REPAIR_LOOK_MAX && n < room && given < budget) {
        void *handle = zlistx_cursor (self->queue);
        char *next = (char *) zlistx_next (self->queue);
        dir_entry_t *entry = directory_find (self->directory, key);
        if (!entry || !s_lacking (self, entry) || !entry->version) {
            //  Removed, repaired, or of no known version (nothing a copy could be checked
            //  against): not to be copied.
            s_unqueue (self, handle, key);
        }
        else if (s_fits (self, slot, entry)) {
            size_t len = strlen (key);
            char *copy = (char *) arena_alloc (arena, len + 1);
            if (!copy)
                break;
            memcpy (copy, key, len + 1);
            reply->keys[n].data = (uint8_t *) copy;
            reply->keys[n].len = len;
            reply->sizes[n] = entry->size;
            reply->versions[n++] = entry->version;
            given += entry->size;
            zhashx_update (self->inflight, key, (void *) (intptr_t) (now + REPAIR_INFLIGHT_MS));
            s_unqueue (self, handle, key);
        }
        key = next;
    }
    reply->n_keys = reply->n_sizes = reply->n_versions = n;
}

int
repair_claimed (repair_t *self, int slot, const char *key, uint64_t version)
{
    zhashx_delete (self->inflight, key);
    dir_entry_t *entry = directory_find (self->directory, key);
    if (!entry || entry->state != DIR_COMMITTED || !version || entry->version != version)
        return KVPOOL_OBJECT_NOT_FOUND;
    node_t *node = node_table_get (self->nodes, slot);
    bool cache_copy = false, replica = false;
    for (uint8_t i = 0; i < entry->holder_count; i++)
        if (entry->holders[i] == slot) {
            cache_copy = directory_is_cache (entry, i);
            replica = !cache_copy;
        }
    if (replica)
        return KVPOOL_OK; //  (a claim sent twice)
    if (!s_counts (self, (uint16_t) slot) || !s_lacking (self, entry))
        return KVPOOL_OBJECT_ALREADY_EXISTS;
    int added = directory_add_replica (entry, (uint16_t) slot);
    if (added < 0)
        return KVPOOL_OBJECT_ALREADY_EXISTS;
    if (added == 1)
        node->objects++;
    if (self->missing)
        self->missing--;
    self->done++;
    self->bytes += entry->size;
    if (s_lacking (self, entry))
        s_queue (self, key); //  another replica still to make (it lacked more than one)
    return KVPOOL_OK;
}

void
repair_drain (repair_t *self, int slot, uint32_t action, uint64_t *sole, uint64_t *short_p)
{
    node_t *node = node_table_get (self->nodes, slot);
    *sole = *short_p = 0;
    if (action == 1 || action == 2) {
        if (node->draining != (action == 1))
            repair_rescan (self);
        node->draining = action == 1;
    }
    if (action == 3) {
        //  It goes: what it holds is no longer found there (what only it held is lost).
        size_t held = 0;
        directory_drop_node (self->directory, (uint16_t) slot, &held);
        node->objects = 0;
        node->draining = true;
        return;
    }
    if (node->objects == 0)
        return;
    for (dir_entry_t *entry = directory_first (self->directory); entry;
         entry = directory_next (self->directory)) {
        if (entry->state != DIR_COMMITTED)
            continue;
        bool holds = false;
        for (uint8_t i = 0; i < entry->holder_count && !holds; i++)
            holds = entry->holders[i] == slot && !directory_is_cache (entry, i);
        if (!holds)
            continue;
        uint8_t elsewhere = s_live (self, entry, slot);
        *sole += elsewhere == 0;
        *short_p += elsewhere < s_want (entry);
    }
    //  Objects placed on it before it began to drain and committed since: found again.
    if (node->draining && *sole && zlistx_size (self->queue) == 0
        && zhashx_size (self->inflight) == 0)
        repair_rescan (self);
}

int
repair_request (repair_t *self, int slot, const Kvpool__Cluster__V1__NodeRequest *request,
                Kvpool__Cluster__V1__MasterReply *reply, arena_t *arena, size_t max_key_len,
                char *error, size_t error_size)
{
    if (request->kind == KVPOOL__CLUSTER__V1__KIND__REPAIR) {
        repair_work (self, slot, request->repair_budget, reply, arena, zclock_mono ());
        return KVPOOL_OK;
    }
    if (request->kind == KVPOOL__CLUSTER__V1__KIND__DRAIN) {
        const char *victim = request->pattern ? request->pattern : "";
        int target = node_table_find (self->nodes, victim);
        if (target < 0 || request->drain > 3) {
            snprintf (error, error_size, "unknown node '%.100s', or drain %u", victim,
                      request->drain);
            return KVPOOL_INVALID_PARAMS;
        }
        if (request->drain)
            kvp_info ("node %s asks: drain of node %s %s", request->node->node_id, victim,
                      request->drain == 1   ? "starts"
                      : request->drain == 2 ? "stops"
                                            : "done: it leaves every holder list");
        repair_drain (self, target, request->drain, &reply->count, &reply->drain_short);
        reply->draining = node_table_get (self->nodes, target)->draining;
        return KVPOOL_OK;
    }
    //  REPAIRED: one status a key.
    size_t n = request->n_keys;
    if (request->n_versions != n) {
        snprintf (error, error_size, "%zu keys, %zu versions", n, request->n_versions);
        return KVPOOL_INVALID_PARAMS;
    }
    reply->statuses = (int32_t *) arena_alloc (arena, (n ? n : 1) * sizeof (int32_t));
    char *key = (char *) arena_alloc (arena, max_key_len + 1);
    if (!reply->statuses || !key) {
        snprintf (error, error_size, "out of memory");
        return KVPOOL_INTERNAL_ERROR;
    }
    reply->n_statuses = n;
    for (size_t i = 0; i < n; i++) {
        const ProtobufCBinaryData *wire = &request->keys[i];
        if (wire->len == 0 || wire->len > max_key_len || memchr (wire->data, 0, wire->len)) {
            reply->statuses[i] = KVPOOL_INVALID_KEY;
            continue;
        }
        memcpy (key, wire->data, wire->len);
        key[wire->len] = 0;
        reply->statuses[i] = repair_claimed (self, slot, key, request->versions[i]);
        kvp_trace (key, "trace %s: %s repaired v%llu: %s", key,
                   node_table_get (self->nodes, slot)->node_id,
                   (unsigned long long) request->versions[i], reply->statuses[i] ? "no" : "ok");
    }
    return KVPOOL_OK;
}

uint64_t
repair_missing (repair_t *self)
{
    return self->missing;
}

uint64_t
repair_done (repair_t *self)
{
    return self->done;
}

uint64_t
repair_bytes (repair_t *self)
{
    return self->bytes;
}

//  ---- self test ---------------------------------------------------------------------

static int
s_node (node_table_t *nodes, const char *id, const char *host)
{
    int slot = node_table_slot (nodes, id);
    node_t *node = node_table_get (nodes, slot);
    snprintf (node->host_id, sizeof node->host_id, "%s", host);
    node->capacity = 1 << 20;
    node->free = 1 << 20;
    node->alive = true;
    return slot;
}

static size_t
s_work (repair_t *repair, int slot, Kvpool__Cluster__V1__MasterReply *reply, arena_t *arena)
{
    kvpool__cluster__v1__master_reply__init (reply);
    repair_work (repair, slot, 1 << 20, reply, arena, zclock_mono ());
    return reply->n_keys;
}

void
repair_test (bool verbose)
{
    directory_t *dir = directory_new ();
    node_table_t *nodes = node_table_new (KVP_PLACEMENT_RANDOM, 1);
    repair_t *repair = repair_new (dir, nodes);
    int a = s_node (nodes, "a", "h1"), b = s_node (nodes, "b", "h2");
    int c = s_node (nodes, "c", "h1"), d = s_node (nodes, "d", "h3");
    //  "k" asked for 2 replicas, has one on a (b died).
    dir_entry_t *k = directory_reserve (dir, "k", 1, 100, 1);
    uint16_t on_a[] = {(uint16_t) a};
    directory_commit (dir, k, on_a, 1, 2);
    k->want = 2;
    k->version = 7;
    repair_rescan (repair);
    repair_tick (repair, zclock_mono () + 1000);
    assert (repair_missing (repair) == 1);
    arena_t arena;
    arena_init (&arena, 1024);
    Kvpool__Cluster__V1__MasterReply reply;
    //  a holds it; c is on a's host while b and d are not: neither gets it.
    assert (s_work (repair, a, &reply, &arena) == 0);
    assert (s_work (repair, c, &reply, &arena) == 0);
    assert (s_work (repair, d, &reply, &arena) == 1 && reply.versions[0] == 7);
    //  In flight: nobody else gets it. A stale claim is refused; the right one taken once.
    assert (s_work (repair, b, &reply, &arena) == 0);
    assert (repair_claimed (repair, d, "k", 6) == KVPOOL_OBJECT_NOT_FOUND);
    assert (repair_claimed (repair, d, "k", 7) == KVPOOL_OK);
    assert (k->holder_count == 2 && repair_missing (repair) == 0 && repair_done (repair) == 1);
    assert (repair_claimed (repair, d, "k", 7) == KVPOOL_OK); //  (twice)
    assert (repair_claimed (repair, b, "k", 7) == KVPOOL_OBJECT_ALREADY_EXISTS);
    //  A drain of d: k lacks a replica again (d's does not count), and b takes it.
    uint64_t sole, short_count;
    repair_drain (repair, d, 1, &sole, &short_count);
    assert (sole == 0 && short_count == 1);
    repair_tick (repair, zclock_mono () + 2000);
    assert (s_work (repair, d, &reply, &arena) == 0); //  draining: takes nothing
    assert (s_work (repair, b, &reply, &arena) == 1);
    assert (repair_claimed (repair, b, "k", 7) == KVPOOL_OK && k->holder_count == 3);
    repair_drain (repair, d, 0, &sole, &short_count);
    assert (sole == 0 && short_count == 0);
    repair_drain (repair, d, 3, &sole, &short_count);
    assert (k->holder_count == 2 && !directory_holds (k, (uint16_t) d));
    //  A key that lacks two replicas is handed out again once the first copy is taken.
    dir_entry_t *m = directory_reserve (dir, "m", 1, 100, 3);
    directory_commit (dir, m, on_a, 1, 4);
    m->want = 3;
    m->version = 9;
    repair_drain (repair, d, 2, &sole, &short_count); //  d takes copies again
    repair_note (repair, m);
    assert (s_work (repair, b, &reply, &arena) == 1 && reply.versions[0] == 9);
    assert (repair_claimed (repair, b, "m", 9) == KVPOOL_OK);
    assert (s_work (repair, b, &reply, &arena) == 0); //  b holds it now
    assert (s_work (repair, c, &reply, &arena) == 0); //  on a's host, while d's has none
    assert (s_work (repair, d, &reply, &arena) == 1);
    assert (repair_claimed (repair, d, "m", 9) == KVPOOL_OK && directory_replicas (m) == 3);
    arena_fini (&arena);
    repair_destroy (&repair);
    node_table_destroy (&nodes);
    directory_destroy (&dir);
    if (verbose)
        printf ("repair ok ");
}
