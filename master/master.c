/*  master.c - the master actor (master.h).

    DESIGN
    One thread, one ROUTER socket, no connection of its own to any node: nodes ask, the
    master answers (protocol/cluster.proto). What it knows:
    - the nodes (node_table.h): identity, endpoints, free space, when each was last heard;
    - the directory (directory.h): for each key, its size and the nodes that hold it.
    Any message from a node counts as a sign of life. Every LIVENESS_TICK_MS the master
    declares dead the nodes silent for --node-ttl and drops them from every entry: an object
    whose last holder that was is gone (a get is OBJECT_NOT_FOUND), the others keep their
    other replicas. A dead node that speaks again is told it is unknown and registers anew.

    Puts are two-phase across the cluster: PLACE reserves the key (pending: invisible, and a
    second PLACE is refused) and chooses its nodes; the writing node moves the bytes, then
    COMMIT makes the key visible with the nodes that really hold it. A reservation neither
    committed nor aborted within --put-timeout (a writer that died mid-put) is dropped.

    A master restart loses the directory, not the cache: each node holds a record of what it
    stores, and re-reports it (REGISTER, then INVENTORY) when its heartbeat is answered by
    a master that does not know it. Until then its objects are not found through the master,
    but the node itself keeps serving them.

    Under CURVE, the connections of a node key removed from --curve-nodes are shut down
    within KEY_WATCH_INTERVAL_MS, and what they still sent is dropped (key_watch.h).

    Threads: one. Memory: each request and its reply live in one arena (the reply is built
    through master_reply.h).
*/
#include "master/master.h"

#include "infra/log.h"
#include "infra/metrics.h"

#include <pthread.h>
#include <sys/random.h>
#include <time.h>

#include "infra/actor_shell.h"
#include "infra/config.h"
#include "infra/curve.h"
#include "infra/key_watch.h"
#include "master/directory.h"
#include "master/ha.h"
#include "master/tombstones.h"
#include "infra/endpoints.h"
#include "master/node_table.h"
#include "master/master_reply.h"
#include "master/repair.h"
#include "infra/regex_matcher.h"
#include "kvpool_status.h"
#include "messages/arena.h"
#include "protocol/cluster.pb-c.h"
#include "protocol/contract.h"
#include "protocol/status.h"

#define LIVENESS_TICK_MS 50
//  Removed keys remembered (tombstones.h).
#define TOMBSTONES_MAX 262144
//  A tick this much later than due means the master itself did not run (stopped, swapped
//  out, starved of CPU): the nodes' messages waited in its socket unread meanwhile.
#define MASTER_STALL_MS 500
//  After such a stall, changes are refused this long: the requests that waited in the socket
//  meanwhile are read now, and their senders stopped waiting for an answer (--cluster-timeout)
//  long ago. Served, a put's reservation would block its key until --put-timeout (its writer
//  gave up on it), a commit would list copies its writer has dropped, and a remove's holders
//  would never be told (its remover does that, on the answer).
#define STALE_WINDOW_MS 250

typedef struct {
    char *key;
    uint64_t token;
    int64_t deadline;
} reservation_t;

typedef struct {
    zsock_t *pipe;
    zsock_t *router;
    zsock_t *monitor;  //  the router's DISCONNECTED events: a registered connection gone
    key_watch_t *keys; //  closes the connections of node keys removed from --curve-nodes
    const kvp_config_t *config;
    zlistx_t *endpoints;
    char bind_error[256];
    directory_t *directory;
    node_table_t *nodes;
    repair_t *repair;       //  objects that lack replicas, and drains (repair.h)
    zlistx_t *reservations; //  reservation_t, oldest first
    uint64_t next_token;    //  reservations and commits, one sequence (directory.h)
    uint64_t epoch;
    char master_id[96];
    int64_t next_tick;
    int64_t last_tick;        //  when s_tick last ran
    int64_t stale_until;      //  changes refused until then (STALE_WINDOW_MS)
    int64_t fenced_until;     //  changes answered to wait until then (s_fence)
    tombstones_t *tombstones; //  removed keys, for nodes that missed a removal while away
    //  per reply: slot -> index in reply.nodes (+1; 0: not in it yet)
    uint32_t node_index[NODE_TABLE_MAX];
    uint64_t requests, dropped, nodes_lost, impostors;
    //  With standby masters (--ha): the campaign, and the term this master's state is of
    //  (0: none yet). A new term starts the state afresh (s_new_term).
    ha_t *ha;
    uint64_t term;
    //  A master that restarted (or took over) places nothing before every live node had time
    //  to register and report what it holds: two of the returning nodes' heartbeats (the
    //  longest) after the start. A put of a key a node still has to report would make a
    //  second value of it, and that node's copy would be served until its report.
    int64_t started, recovered;
} self_t;

static void
s_reservation_free (void **item)
{
    reservation_t *reservation = (reservation_t *) *item;
    if (reservation) {
        free (reservation->key);
        free (reservation);
        *item = NULL;
    }
}

//  A pending entry keeps its reservation's list handle where its holders will go (it has
//  none until committed): the reservation ends, and its record goes, when the entry is
//  committed, aborted or removed.
static void
s_reservation_end (self_t *self, dir_entry_t *entry)
{
    if (entry->state != DIR_PENDING)
        return;
    void *handle;
    memcpy (&handle, entry->holders, sizeof handle);
    if (handle)
        zlistx_delete (self->reservations, handle);
    memset (entry->holders, 0, sizeof entry->holders);
}

//  Keeps each node's count of the keys it holds (NODES, and whether a node's entries need a
//  walk when it re-registers or dies) as an entry's holders change by delta.
static void
s_count (self_t *self, const dir_entry_t *entry, int delta)
{
    if (entry->state != DIR_COMMITTED)
        return;
    for (uint8_t h = 0; h < entry->holder_count; h++) {
        node_t *node = node_table_get (self->nodes, entry->holders[h]);
        if (node)
            node->objects += (uint64_t) (int64_t) delta;
    }
}

//  Removes entry from the directory, keeping the counts and the reservations right, and
//  remembers that key's value was removed now (its token).
static void
s_remove (self_t *self, dir_entry_t *entry)
{
    //  A reservation given up is no removal (the key had no value here): only a copy of its
    //  version, one its writer sent that landed late, is refused when its node reports it,
    //  not the value a holder that was away brings back (tombstones.h).
    if (entry->state == DIR_PENDING)
        tombstones_abort (self->tombstones, entry->key, ++self->next_token, entry->token);
    else
        tombstones_add (self->tombstones, entry->key, ++self->next_token, entry->version,
                        entry->holders, entry->holder_count);
    kvp_trace (entry->key, "trace %s: removed v%llu, holders %u (cache %x)", entry->key,
               (unsigned long long) entry->version, entry->holder_count, entry->cache_mask);
    s_reservation_end (self, entry);
    s_count (self, entry, -1);
    directory_remove (self->directory, entry);
}

//  Takes every key off node slot (a node that died or registers anew).
static size_t
s_drop_node (self_t *self, int slot, size_t *held_p)
{
    node_t *node = node_table_get (self->nodes, slot);
    *held_p = 0;
    if (!node || node->objects == 0)
        return 0; //  nothing to walk for
    size_t lost = directory_drop_node (self->directory, (uint16_t) slot, held_p);
    node->objects = 0;
    return lost;
}

static self_t *
s_self_new (zsock_t *pipe, const kvp_config_t *config)
{
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->pipe = pipe;
    self->config = config;
    self->router = zsock_new (ZMQ_ROUTER);
    assert (self->router);
    zsock_set_linger (self->router, 0);
    zsock_set_sndhwm (self->router, 100000);
    zsock_set_rcvhwm (self->router, 100000);
    //  A request is keys and sizes, never values: 256 MiB bounds what a node may send.
    zsock_set_maxmsgsize (self->router, 256 << 20);
    kvp_curve_cluster_server (config->curve, self->router);
    //  Tokens are versions too (a value's, unique to one put or upsert of its key): a
    //  restarted master counts on from past what it gave before, the start time in seconds
    //  << 20 (it also moves past any version a node reports, s_inventory).
    self->next_token = (uint64_t) time (NULL) << 20;
    self->endpoints = zlistx_new ();
    zlistx_set_duplicator (self->endpoints, (zlistx_duplicator_fn *) strdup);
    zlistx_set_destructor (self->endpoints, (zlistx_destructor_fn *) zstr_free);
    int port = zsock_bind (self->router, "%s", config->master);
    if (port == -1)
        snprintf (self->bind_error, sizeof self->bind_error, "cannot bind %s: %s", config->master,
                  zmq_strerror (zmq_errno ()));
    else {
        char resolved[300];
        kvp_endpoint_resolved (config->master, port, resolved, sizeof resolved);
        zlistx_add_end (self->endpoints, resolved);
    }
    //  Which connections close: a node restarted under its old name may take its place at
    //  once when the connection that registered it is gone (s_register).
    char monitor[128];
    snprintf (monitor, sizeof monitor, "inproc://%s-master-monitor-%p", config->instance,
              (void *) self);
    int rc = zmq_socket_monitor (zsock_resolve (self->router), monitor, ZMQ_EVENT_DISCONNECTED);
    assert (rc == 0);
    self->monitor = zsock_new (ZMQ_PAIR);
    assert (self->monitor);
    rc = zsock_connect (self->monitor, "%s", monitor);
    assert (rc == 0);
    self->keys = key_watch_new (config->curve, KVP_ZAP_CLUSTER, "master");
    self->directory = directory_new ();
    self->nodes = node_table_new (config->placement, config->seed);
    assert (self->directory && self->nodes);
    node_table_set_max_objects (self->nodes, config->max_node_objects);
    self->repair = repair_new (self->directory, self->nodes);
    self->reservations = zlistx_new ();
    zlistx_set_destructor (self->reservations, s_reservation_free);
    //  The epoch tells nodes this is a master they have not registered with.
    self->epoch = (uint64_t) zclock_time ();
    char host[64];
    kvp_host_id (host, sizeof host);
    snprintf (self->master_id, sizeof self->master_id, "%s/%d/%llu", host, (int) getpid (),
              (unsigned long long) self->epoch);
    self->next_tick = zclock_mono () + LIVENESS_TICK_MS;
    self->last_tick = zclock_mono ();
    self->started = self->recovered = zclock_mono ();
    self->tombstones = tombstones_new (TOMBSTONES_MAX);
    const char *bound = (const char *) zlistx_first (self->endpoints);
    if (config->ha && bound) {
        self->ha = ha_new (config->ha, (int) config->ha_lease_ttl_s, bound, self->master_id,
                           self->bind_error, sizeof self->bind_error);
        if (!self->ha)
            zlistx_purge (self->endpoints);
    }
    return self;
}

static void
s_self_destroy (self_t **self_p)
{
    self_t *self = *self_p;
    if (!self)
        return;
    ha_destroy (&self->ha); //  a leader steps down first: a standby takes over at once
    zmq_socket_monitor (zsock_resolve (self->router), NULL, 0);
    zsock_destroy (&self->monitor);
    key_watch_destroy (&self->keys);
    zsock_destroy (&self->router);
    zlistx_destroy (&self->endpoints);
    zlistx_destroy (&self->reservations);
    repair_destroy (&self->repair);
    directory_destroy (&self->directory);
    node_table_destroy (&self->nodes);
    tombstones_destroy (&self->tombstones);
    free (self);
    *self_p = NULL;
}

//  ---- replies -----------------------------------------------------------------------

static void
s_reply_init (self_t *self, reply_t *r, arena_t *arena,
              const Kvpool__Cluster__V1__NodeRequest *request)
{
    kvpool__cluster__v1__master_reply__init (&r->reply);
    r->reply.version = KVP_PROTOCOL_VERSION;
    r->reply.request_id = request ? request->request_id : 0;
    r->reply.kind = request ? request->kind : 0;
    r->reply.epoch = self->epoch;
    r->reply.master_id = self->master_id;
    r->reply.term = self->term;
    master_reply_start (r, arena, self->nodes, self->node_index);
}

static void
s_send (self_t *self, zframe_t *routing_id, reply_t *r)
{
    r->reply.planned = self->next_token;
    size_t size = kvpool__cluster__v1__master_reply__get_packed_size (&r->reply);
    zframe_t *frame = zframe_new (NULL, size);
    kvpool__cluster__v1__master_reply__pack (&r->reply, zframe_data (frame));
    zframe_send (&routing_id, self->router, ZFRAME_MORE);
    zframe_send (&frame, self->router, 0);
}

//  ---- requests ----------------------------------------------------------------------

//  The key as a C string in the arena, or NULL when it is not a valid key.
static char *
s_key (self_t *self, arena_t *arena, const ProtobufCBinaryData *wire)
{
    if (wire->len == 0 || wire->len > self->config->max_key_len
        || memchr (wire->data, 0, wire->len))
        return NULL;
    char *key = (char *) arena_alloc (arena, wire->len + 1);
    if (key) {
        memcpy (key, wire->data, wire->len);
        key[wire->len] = 0;
    }
    return key;
}

static void
s_node_dead (self_t *self, int slot, const char *why)
{
    node_t *node = node_table_get (self->nodes, slot);
    node->alive = false;
    //  The next leader will not know what was removed while the node was away: etcd keeps
    //  that it was (ha.h). (FENCE writes it first, and fails if it cannot.)
    if (self->ha && node->fence_term != self->term
        && ha_fence_write (self->ha, node->node_id, self->term) == 0)
        node->fence_term = self->term;
    size_t held = 0;
    size_t lost = s_drop_node (self, slot, &held);
    self->nodes_lost++;
    repair_rescan (self->repair); //  what it held lacks a replica now
    kvp_warning ("node %s (%s) %s: %zu replicas dropped, %zu objects lost with it", node->node_id,
                 node->client_endpoint, why, held, lost);
}

static void
s_node_fill (node_t *node, const Kvpool__Cluster__V1__Node *info)
{
    snprintf (node->host_id, sizeof node->host_id, "%s", info->host_id ? info->host_id : "");
    snprintf (node->client_endpoint, sizeof node->client_endpoint, "%s",
              info->client_endpoint ? info->client_endpoint : "");
    snprintf (node->peer_endpoint, sizeof node->peer_endpoint, "%s",
              info->peer_endpoint ? info->peer_endpoint : "");
    snprintf (node->curve_key, sizeof node->curve_key, "%s",
              info->curve_key ? info->curve_key : "");
    node->capacity = info->capacity;
    node->disk_capacity = info->disk_capacity;
    node->free = info->free;
    node->placed = 0;
}

//  Where a request came from, by libzmq's word: the connection (routing id, descriptor) and
//  the credential its handshake proved (User-Id: a CURVE key, or "kvpool-node" for the
//  cluster key; "" where the socket authenticates nobody, as in the self test).
typedef struct {
    zframe_t *routing_id;
    int fd;
    char user_id[KVP_USER_ID_MAX + 1];
} origin_t;

static bool
s_same_conn (const node_t *node, const origin_t *from)
{
    return node->conn_size == zframe_size (from->routing_id)
           && memcmp (node->conn, zframe_data (from->routing_id), node->conn_size) == 0;
}

static uint64_t
s_random_registration (self_t *self)
{
    uint64_t number = 0;
    while (number == 0)
        if (getrandom (&number, sizeof number, 0) != (ssize_t) sizeof number)
            number = ++self->next_token ^ (uint64_t) zclock_usecs () << 20;
    return number;
}

//  A node registers: it is bound to the connection and the credential it registers with.
//  A live node's name is taken by another connection only once the one that registered it
//  closed (a node restarted after a crash), and never by another credential: an impostor
//  (or a second process started under the same --node-id) is refused and logged, and the
//  node keeps its registration and its keys. One that announces other endpoints than a node
//  heard from within its lease is a second node under its id (node_table_claim): told so
//  (MasterReply.duplicate), it stops.
static void
s_register (self_t *self, reply_t *r, const Kvpool__Cluster__V1__NodeRequest *request,
            const origin_t *from)
{
    const Kvpool__Cluster__V1__Node *info = request->node;
    int known = node_table_find (self->nodes, info->node_id);
    node_t *old = node_table_get (self->nodes, known);
    //  With the cluster key a node says its id with it: it speaks for that node only.
    size_t prefix = strlen (KVP_NODE_USER_PREFIX);
    const char *said = strncmp (from->user_id, KVP_NODE_USER_PREFIX, prefix) == 0
                           ? from->user_id + prefix - 1
                           : NULL;
    if (said && strcmp (said + 1, info->node_id) != 0) {
        self->impostors++;
        kvp_warning ("refused a REGISTER of node %s from a connection that proved to be node "
                     "%s",
                     info->node_id, said + 1);
        master_reply_fail (r, KVPOOL_PERMISSION_DENIED,
                           "this connection proved to be node %s, not %s", said + 1, info->node_id);
        return;
    }
    if (old && old->alive && !s_same_conn (old, from)) {
        //  Other endpoints while the node is heard from: a second node, told to stop.
        node_claim_t claim = node_table_claim (old, info->client_endpoint, info->peer_endpoint,
                                               self->config->node_ttl_ms, zclock_mono ());
        char why[700] = "";
        if (strcmp (old->user_id, from->user_id) != 0)
            snprintf (why, sizeof why, "it registered with another credential");
        else if (claim == NODE_CLAIM_DUPLICATE)
            snprintf (why, sizeof why,
                      "another live node (clients %s) has this id: give each node its own "
                      "--node-id, or leave --node-id and --host-id to their defaults",
                      old->client_endpoint);
        else if (!old->conn_closed)
            snprintf (why, sizeof why,
                      "it is alive on another connection (a restarted node takes its place once "
                      "that connection closes, or --node-ttl after its last heartbeat)");
        if (*why) {
            self->impostors++;
            kvp_warning ("refused a REGISTER of node %s from another connection: %s", info->node_id,
                         why);
            master_reply_fail (r, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                               "node %s is registered already: %s", info->node_id, why);
            r->reply.duplicate = claim == NODE_CLAIM_DUPLICATE;
            return;
        }
    }
    int slot = node_table_slot (self->nodes, info->node_id);
    if (slot < 0) {
        master_reply_fail (r, KVPOOL_NO_AVAILABLE_HANDLE, "the master knows %d nodes: no more",
                           NODE_TABLE_MAX);
        return;
    }
    node_t *node = node_table_get (self->nodes, slot);
    //  What it held before is forgotten: the inventory that follows says what it holds now.
    size_t held = 0, lost = s_drop_node (self, slot, &held);
    if (held)
        kvp_info ("node %s registers again: %zu replicas it had reported dropped (%zu "
                  "objects until it reports them again)",
                  info->node_id, held, lost);
    s_node_fill (node, info);
    node->alive = true;
    node->draining = false;       //  a new life
    repair_rescan (self->repair); //  objects that lack replicas may go to it
    node->last_heard = zclock_mono ();
    //  Its inventory may hold copies from before: of keys written since it was last heard
    //  from (a new node: since this master started), only those writes' holders count.
    node->report_bar = node->seen_token;
    node->seen_token = self->next_token;
    node->registration = s_random_registration (self);
    node->conn_size = zframe_size (from->routing_id) <= sizeof node->conn
                          ? zframe_size (from->routing_id)
                          : sizeof node->conn;
    memcpy (node->conn, zframe_data (from->routing_id), node->conn_size);
    node->conn_fd = from->fd;
    node->conn_closed = false;
    snprintf (node->user_id, sizeof node->user_id, "%s", from->user_id);
    node->reported_bytes = 0;
    node->lease_ms = info->lease_ms;
    node->register_token = self->next_token;
    //  A node that was registered with another master (this one restarted, or took over):
    //  others may hold keys they have yet to report. Its heartbeat is a third of its lease:
    //  two of them after the start, every node like it has registered and reported. (A new
    //  cluster's nodes register with no epoch: no wait.)
    int64_t recovered = self->started + (int64_t) (2 * info->lease_ms / 3);
    if (request->epoch && request->epoch != self->epoch && recovered > self->recovered)
        self->recovered = recovered;
    node->fence_term = self->ha ? ha_fenced (self->ha, node->node_id) : 0;
    node->suspect = node->fence_term && node->fence_term < self->term;
    if (node->suspect)
        kvp_warning ("node %s was declared dead under term %llu, whose removals this master "
                     "does not know: of its copies, only those other holders confirm are "
                     "taken back",
                     node->node_id, (unsigned long long) node->fence_term);
    r->reply.registration = node->registration;
    kvp_info ("node %s (host %s) registered: clients %s, data plane %s, %llu MiB", node->node_id,
              node->host_id, node->client_endpoint, node->peer_endpoint,
              (unsigned long long) (node->capacity >> 20));
}

//  Whether request is a change (placing, committing, aborting, removing, reporting) that
//  its sender may not make: it is not registered with this master as it was when it asked
//  (declared dead since, frozen or cut off, or registered again), or it is not the process
//  that registered (s_proven). Then the reply says so and nothing changes: what a node
//  decided while it was away never lands, and nobody speaks for another node.
static bool
s_fenced (self_t *self, reply_t *r, const node_t *sender,
          const Kvpool__Cluster__V1__NodeRequest *request)
{
    switch (request->kind) {
        case KVPOOL__CLUSTER__V1__KIND__PLACE:
        case KVPOOL__CLUSTER__V1__KIND__COMMIT:
        case KVPOOL__CLUSTER__V1__KIND__ABORT:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE_REGEX:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE_ALL:
        case KVPOOL__CLUSTER__V1__KIND__DROPPED:
        case KVPOOL__CLUSTER__V1__KIND__CACHE:
        case KVPOOL__CLUSTER__V1__KIND__FENCE:
        case KVPOOL__CLUSTER__V1__KIND__REPAIR:
        case KVPOOL__CLUSTER__V1__KIND__REPAIRED:
        case KVPOOL__CLUSTER__V1__KIND__DRAIN: break;
        default: return false;
    }
    if (sender)
        return false;
    (void) self;
    master_reply_fail (r, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                       "node %s is not registered with this master as it was when it asked "
                       "(declared dead, or registered again since): nothing changed",
                       request->node->node_id);
    return true;
}

//  Whether request is a put or a remove that a master which just restarted (or took over)
//  may not serve yet: some node may still have to report a key it names (self->recovered).
//  A put would make a second value of it; a remove would miss the copy, which its node
//  would serve until its report is refused. Then the reply says so.
static bool
s_recovering (self_t *self, reply_t *r, const Kvpool__Cluster__V1__NodeRequest *request)
{
    switch (request->kind) {
        case KVPOOL__CLUSTER__V1__KIND__PLACE:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE_REGEX:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE_ALL: break;
        default: return false;
    }
    int64_t now = zclock_mono ();
    if (now >= self->recovered)
        return false;
    master_reply_fail (r, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                       "the master started %lld ms ago: the nodes are still reporting what they "
                       "hold (%lld ms more)",
                       (long long) (now - self->started), (long long) (self->recovered - now));
    return true;
}

//  Whether request is a change that may have waited in the socket through this master's own
//  stall (STALE_WINDOW_MS); then the reply says so.
static bool
s_stale (self_t *self, reply_t *r, const Kvpool__Cluster__V1__NodeRequest *request)
{
    switch (request->kind) {
        case KVPOOL__CLUSTER__V1__KIND__PLACE:
        case KVPOOL__CLUSTER__V1__KIND__COMMIT:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE_REGEX:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE_ALL:
        case KVPOOL__CLUSTER__V1__KIND__CACHE:
        case KVPOOL__CLUSTER__V1__KIND__FENCE:
        case KVPOOL__CLUSTER__V1__KIND__REPAIRED: break;
        default: return false;
    }
    int64_t now = zclock_mono ();
    //  (The tick may not have run since the stall: a request can be the first to notice.)
    if (now - self->last_tick > LIVENESS_TICK_MS + MASTER_STALL_MS)
        self->stale_until = now + STALE_WINDOW_MS;
    if (now >= self->stale_until)
        return false;
    master_reply_fail (r, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                       "the master did not run for a while (stopped or starved of CPU): changes "
                       "that waited meanwhile are refused for %d ms more",
                       (int) (self->stale_until - now));
    return true;
}

//  The node a request speaks for, if its sender proved to be the process that registered
//  it: the registration number only that process was told, the credential it registered
//  with, this master's epoch, and the node still alive. NULL otherwise.
static node_t *
s_proven (self_t *self, const Kvpool__Cluster__V1__NodeRequest *request, const origin_t *from)
{
    node_t *node =
        node_table_get (self->nodes, node_table_find (self->nodes, request->node->node_id));
    if (!node || !node->alive || request->epoch != self->epoch || !request->registration
        || request->registration != node->registration
        || strcmp (node->user_id, from->user_id) != 0)
        return NULL;
    return node;
}

//  The slot of the proven sender (s_proven), or -1 after failing the reply "unknown node":
//  the node then registers again and reports what it holds.
static int
s_member (self_t *self, reply_t *r, const Kvpool__Cluster__V1__NodeRequest *request,
          const node_t *sender)
{
    if (!sender) {
        master_reply_fail (r, KVPOOL_INVALID_PARAMS, "unknown node %s: register",
                           request->node->node_id);
        return -1;
    }
    return node_table_find (self->nodes, sender->node_id);
}

static void
s_inventory (self_t *self, reply_t *r, arena_t *arena,
             const Kvpool__Cluster__V1__NodeRequest *request, const node_t *sender)
{
    int slot = s_member (self, r, request, sender);
    if (slot < 0)
        return;
    if (request->n_sizes != request->n_keys
        || (request->n_versions && request->n_versions != request->n_keys)) {
        master_reply_fail (r, KVPOOL_INVALID_PARAMS, "%zu keys, %zu sizes, %zu versions",
                           request->n_keys, request->n_sizes, request->n_versions);
        return;
    }
    node_t *node = node_table_get (self->nodes, slot);
    r->reply.keys = (ProtobufCBinaryData *) arena_alloc (
        arena, (request->n_keys ? request->n_keys : 1) * sizeof (ProtobufCBinaryData));
    if (!r->reply.keys) {
        master_reply_fail (r, KVPOOL_INTERNAL_ERROR, "out of memory");
        return;
    }
    size_t added = 0, crowded = 0;
    for (size_t i = 0; i < request->n_keys; i++) {
        char *key = s_key (self, arena, &request->keys[i]);
        if (!key)
            continue;
        dir_entry_t *entry = directory_find (self->directory, key);
        uint64_t version = request->n_versions ? request->versions[i] : 0;
        //  Versions are drawn from the tokens' sequence: a restarted master draws past
        //  every version its nodes report.
        if (version > self->next_token)
            self->next_token = version;
        bool stale = entry ? !directory_holds (entry, (uint16_t) slot)
                                 && (entry->state == DIR_PENDING || entry->token > node->report_bar
                                     || (version && entry->version && version != entry->version))
                           : tombstones_refuse (self->tombstones, key, version, node->report_bar);
        //  A node away under an earlier leader: a copy nobody else holds may have been
        //  removed then (ha.h); one another holder has, of the same version, was not.
        if (node->suspect && !stale)
            stale = !entry || entry->state != DIR_COMMITTED || !version || version != entry->version
                    || directory_holds (entry, (uint16_t) slot) || entry->holder_count == 0;
        //  A node holds at most its memory and its disk: a report past that is a lie (or a
        //  bug), and the copies past it are refused, so that no node can fill the directory
        //  with keys it never stored.
        bool beyond =
            node->reported_bytes + request->sizes[i] > node->capacity + node->disk_capacity;
        //  Nor more entries than --max-node-objects: each costs the master memory, and time
        //  when the node dies, whatever its size.
        if (!stale && !beyond && node->objects >= self->config->max_node_objects
            && !(entry && entry->state == DIR_COMMITTED
                 && directory_holds (entry, (uint16_t) slot))) {
            beyond = true;
            crowded++;
        }
        kvp_trace (key, "trace %s: %s reports v%llu: %s", key, node->node_id,
                   (unsigned long long) version,
                   stale ? "refused (stale)" : beyond ? "refused (beyond)" : "taken");
        if (stale || beyond) {
            //  Written (or being written), or removed, since the node was last heard from:
            //  its copy is older than what the directory says, and must never be served.
            //  The node drops it.
            if (beyond && !stale)
                self->impostors++;
            r->reply.keys[r->reply.n_keys++] = request->keys[i];
            continue;
        }
        node->reported_bytes += request->sizes[i];
        uint8_t before = entry && entry->state == DIR_COMMITTED ? entry->holder_count : 0;
        bool back = !entry; //  a value the master lost with its holders, reported back
        entry = directory_add_holder (self->directory, key, request->keys[i].len, request->sizes[i],
                                      (uint16_t) slot);
        if (entry && !entry->version)
            entry->version = version;
        if (entry && back)
            tombstones_committed (self->tombstones, key);
        if (entry && entry->holder_count > before) {
            node_table_get (self->nodes, slot)->objects++;
            added++;
        }
    }
    r->reply.count = added;
    if (crowded)
        kvp_warning ("node %s holds %llu objects, --max-node-objects: %zu more it reported "
                     "refused",
                     node->node_id, (unsigned long long) node->objects, crowded);
}

static void
s_place (self_t *self, reply_t *r, arena_t *arena, const Kvpool__Cluster__V1__NodeRequest *request)
{
    size_t n = request->n_keys;
    if (request->n_sizes != n) {
        master_reply_fail (r, KVPOOL_INVALID_PARAMS, "%zu keys, %zu sizes", n, request->n_sizes);
        return;
    }
    if (request->replica_num > KVP_MAX_REPLICAS) {
        master_reply_fail (r, KVPOOL_INVALID_REPLICA, "replica_num %u: at most %d",
                           request->replica_num, KVP_MAX_REPLICAS);
        return;
    }
    r->reply.tokens = (uint64_t *) arena_alloc (arena, (n ? n : 1) * sizeof (uint64_t));
    if (r->reply.tokens) {
        memset (r->reply.tokens, 0, (n ? n : 1) * sizeof (uint64_t));
        r->reply.n_tokens = n;
    }
    if (!r->reply.tokens || master_reply_keys (r, n, false, true) != 0
        || master_reply_versions (r, n, false) != 0) {
        master_reply_fail (r, KVPOOL_INTERNAL_ERROR, "out of memory");
        return;
    }
    if (request->upsert && master_reply_old_holders (r, n) != 0)
        return;
    int writer = node_table_find (self->nodes, request->node->node_id);
    int preferred[KVP_MAX_PREFERRED_NODES];
    size_t preferred_count = 0;
    for (size_t p = 0; p < request->n_preferred && preferred_count < KVP_MAX_PREFERRED_NODES; p++) {
        int slot = node_table_find (self->nodes, request->preferred[p]);
        if (slot >= 0)
            preferred[preferred_count++] = slot;
    }
    int64_t deadline = zclock_mono () + (int64_t) self->config->put_timeout_ms;
    for (size_t i = 0; i < n; i++) {
        int32_t *status = &r->reply.statuses[i];
        char *key = s_key (self, arena, &request->keys[i]);
        if (!key) {
            *status = KVPOOL_INVALID_KEY;
            continue;
        }
        dir_entry_t *entry = directory_find (self->directory, key);
        if (entry && entry->state == DIR_PENDING) {
            *status = request->upsert ? KVPOOL_REPLICA_IS_NOT_READY : KVPOOL_OBJECT_ALREADY_EXISTS;
            continue;
        }
        if (entry && !request->upsert) {
            *status = KVPOOL_OBJECT_ALREADY_EXISTS;
            continue;
        }
        uint16_t chosen[KVP_MAX_REPLICAS];
        size_t count = node_table_place (self->nodes, request->sizes[i], request->replica_num,
                                         writer, preferred, preferred_count, chosen);
        if (count == 0) {
            *status = KVPOOL_NO_AVAILABLE_HANDLE;
            continue;
        }
        if (entry) {
            //  An upsert of a committed key: readers keep the old value until the commit,
            //  which must find the value this one replaces (no other commit between).
            if (master_reply_holders (r, r->reply.old_holders[i], entry->holders,
                                      entry->holder_count)
                != 0) {
                *status = KVPOOL_INTERNAL_ERROR;
                continue;
            }
            r->reply.tokens[i] = entry->token;
        }
        else {
            uint64_t token = ++self->next_token;
            reservation_t *reservation = (reservation_t *) malloc (sizeof (reservation_t));
            char *copy = strdup (key);
            if (!reservation || !copy
                || !directory_reserve (self->directory, key, request->keys[i].len,
                                       request->sizes[i], token)) {
                free (reservation);
                free (copy);
                *status = KVPOOL_INTERNAL_ERROR;
                continue;
            }
            reservation->key = copy;
            reservation->token = token;
            r->reply.tokens[i] = token;
            reservation->deadline = deadline;
            void *handle = zlistx_add_end (self->reservations, reservation);
            memcpy (directory_find (self->directory, key)->holders, &handle, sizeof handle);
        }
        if (master_reply_holders (r, r->reply.holders[i], chosen, count) != 0)
            *status = KVPOOL_INTERNAL_ERROR;
        //  The replicas asked for: what a repair keeps up (master/repair.c).
        dir_entry_t *placed = directory_find (self->directory, key);
        if (placed)
            placed->want = (uint8_t) (request->replica_num ? request->replica_num : 1);
        //  The version the value takes: new to this key (a new key's is its reservation's
        //  token; an upsert's is drawn now), stored with its copies, back in the COMMIT.
        r->reply.versions[i] = entry ? ++self->next_token : r->reply.tokens[i];
    }
}

static void
s_commit (self_t *self, reply_t *r, arena_t *arena, const Kvpool__Cluster__V1__NodeRequest *request)
{
    size_t n = request->n_keys;
    if (request->n_holders != n || request->n_tokens != n
        || (request->n_versions && request->n_versions != n)) {
        master_reply_fail (
            r, KVPOOL_INVALID_PARAMS,
            "%zu keys, %zu holder lists, %zu tokens: a commit names one of each per key", n,
            request->n_holders, request->n_tokens);
        return;
    }
    if (master_reply_keys (r, n, false, false) != 0) {
        master_reply_fail (r, KVPOOL_INTERNAL_ERROR, "out of memory");
        return;
    }
    if (master_reply_old_holders (r, n) != 0)
        return;
    for (size_t i = 0; i < n; i++) {
        int32_t *status = &r->reply.statuses[i];
        char *key = s_key (self, arena, &request->keys[i]);
        dir_entry_t *entry = key ? directory_find (self->directory, key) : NULL;
        if (!entry) {
            //  Its reservation timed out, or a remove-all came between.
            *status = KVPOOL_INVALID_WRITE;
            continue;
        }
        if (entry->token != request->tokens[i]) {
            //  Not the write the master placed last: its reservation expired (the writer was
            //  stalled, or away) and another write came, or another upsert committed first.
            //  What this one wrote must never stand in for the newer value.
            *status = KVPOOL_INVALID_WRITE;
            continue;
        }
        uint16_t slots[KVP_MAX_REPLICAS];
        size_t count = 0;
        const Kvpool__Cluster__V1__Holders *holders = request->holders[i];
        for (size_t h = 0; h < holders->n_nodes && count < KVP_MAX_REPLICAS; h++) {
            uint32_t index = holders->nodes[h];
            if (index >= request->n_nodes)
                continue;
            int slot = node_table_find (self->nodes, request->nodes[index]);
            node_t *node = node_table_get (self->nodes, slot);
            //  A holder at --max-node-objects is left out (PLACE did not choose it, or
            //  others' commits filled it since).
            if (node && node->alive
                && (node->objects < self->config->max_node_objects
                    || (entry->state == DIR_COMMITTED && directory_holds (entry, (uint16_t) slot))))
                slots[count++] = (uint16_t) slot;
        }
        if (count == 0) {
            if (entry->state == DIR_PENDING)
                s_remove (self, entry);
            *status = KVPOOL_TRANSFER_FAIL;
            continue;
        }
        //  An upsert's old holders as they are now (PLACE named them too, but a node may
        //  have become a cache holder of the old value since): the writer tells each to drop
        //  its copy before its client hears.
        if (entry->state == DIR_COMMITTED
            && master_reply_holders (r, r->reply.old_holders[i], entry->holders,
                                     entry->holder_count)
                   != 0) {
            *status = KVPOOL_INTERNAL_ERROR;
            continue;
        }
        //  A put of a key removed before: the nodes that held the removed value are told
        //  again by the writer, before its client hears. The removal's own drop may never
        //  have reached them: its remover stopped waiting for this master's answer (this
        //  master was stopped, or the remover was), and such a node would serve the removed
        //  value to its own clients beside this one (tombstones.h).
        uint16_t told[KVP_MAX_REPLICAS];
        uint8_t told_count = 0;
        uint64_t removed_version = 0;
        if (entry->state == DIR_PENDING
            && tombstones_holders (self->tombstones, key, &removed_version, told, &told_count)
            && master_reply_holders (r, r->reply.old_holders[i], told, told_count) != 0) {
            *status = KVPOOL_INTERNAL_ERROR;
            continue;
        }
        //  A new key's first value: the puts of it given up before are past (tombstones.h).
        if (entry->state == DIR_PENDING)
            tombstones_committed (self->tombstones, key);
        s_reservation_end (self, entry);
        s_count (self, entry, -1); //  an upsert's old holders
        directory_commit (self->directory, entry, slots, count, ++self->next_token);
        //  (a node from before versions sends none: the commit's token stands in)
        entry->version =
            request->n_versions && request->versions[i] ? request->versions[i] : entry->token;
        //  An upsert's value may be of another size than the one it replaces.
        if (request->n_sizes == n)
            entry->size = request->sizes[i];
        s_count (self, entry, 1);
        kvp_trace (key, "trace %s: committed v%llu on %u holders", key,
                   (unsigned long long) entry->version, entry->holder_count);
        repair_note (self->repair, entry); //  placed fewer than asked: repaired as nodes join
    }
}

static void
s_abort (self_t *self, arena_t *arena, const Kvpool__Cluster__V1__NodeRequest *request)
{
    for (size_t i = 0; i < request->n_keys; i++) {
        char *key = s_key (self, arena, &request->keys[i]);
        dir_entry_t *entry = key ? directory_find (self->directory, key) : NULL;
        if (entry && entry->state == DIR_PENDING)
            s_remove (self, entry);
    }
}

//  LOCATE and REMOVE: statuses, sizes and holders of committed keys; REMOVE also removes.
static void
s_locate (self_t *self, reply_t *r, arena_t *arena, const Kvpool__Cluster__V1__NodeRequest *request,
          bool remove)
{
    size_t n = request->n_keys;
    if (master_reply_keys (r, n, true, true) != 0 || master_reply_versions (r, n, true) != 0) {
        master_reply_fail (r, KVPOOL_INTERNAL_ERROR, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        char *key = s_key (self, arena, &request->keys[i]);
        if (!key) {
            r->reply.statuses[i] = KVPOOL_INVALID_KEY;
            continue;
        }
        dir_entry_t *entry = directory_find (self->directory, key);
        //  Removed while nothing holds it (its holders declared dead): a copy a holder brings
        //  back later does not undo the remove. And the nodes its last removal named are
        //  told again, naming the version: one that removal's drop never reached (its
        //  remover lost this master's answer) still holds it (tombstones.h).
        if (!entry && remove) {
            tombstones_add (self->tombstones, key, ++self->next_token, 0, NULL, 0);
            kvp_trace (key, "trace %s: removed while absent", key);
        }
        //  A key being written again (a reservation) is not removed, but the nodes its last
        //  removal named are told again all the same, naming the removed version (never
        //  the one being written): that removal's remover may have stopped waiting for its
        //  answer, and they would serve the removed value meanwhile.
        if (remove && (!entry || entry->state == DIR_PENDING)) {
            uint16_t held[KVP_MAX_REPLICAS];
            uint8_t count = 0;
            uint64_t version = 0;
            if (tombstones_holders (self->tombstones, key, &version, held, &count)
                && master_reply_holders_cached (r, r->reply.holders[i], held, count, 0,
                                                &r->reply.caches[i])
                       == 0)
                r->reply.versions[i] = version;
        }
        if (!entry || entry->state != DIR_COMMITTED) {
            r->reply.statuses[i] = KVPOOL_OBJECT_NOT_FOUND;
            continue;
        }
        r->reply.sizes[i] = entry->size;
        r->reply.versions[i] = entry->version;
        if (master_reply_holders_cached (r, r->reply.holders[i], entry->holders,
                                         entry->holder_count, entry->cache_mask,
                                         &r->reply.caches[i])
            != 0) {
            r->reply.statuses[i] = KVPOOL_INTERNAL_ERROR;
            continue;
        }
        if (!remove && r->reply.holders[i]->n_nodes == 0)
            r->reply.statuses[i] = KVPOOL_OBJECT_NOT_FOUND;
        if (remove) {
            s_remove (self, entry);
            r->reply.count++;
        }
    }
}

static void
s_all_nodes (self_t *self, reply_t *r, bool live_only)
{
    for (size_t slot = 0; slot < node_table_size (self->nodes); slot++)
        if (!live_only || node_table_get (self->nodes, (int) slot)->alive)
            master_reply_node (r, (int) slot);
}

static void
s_remove_regex (self_t *self, reply_t *r, arena_t *arena,
                const Kvpool__Cluster__V1__NodeRequest *request)
{
    const char *pattern = request->pattern ? request->pattern : "";
    char error[200];
    regex_batch_t *batch = regex_batch_new (pattern, strlen (pattern), self->config->max_regex_len,
                                            error, sizeof error);
    if (!batch) {
        master_reply_fail (r, KVPOOL_INVALID_PARAMS, "%s", error);
        return;
    }
    for (dir_entry_t *entry = directory_first (self->directory); entry;
         entry = directory_next (self->directory))
        if (entry->state == DIR_COMMITTED
            && regex_batch_add (batch, entry->key, strlen (entry->key), 0) != 0) {
            regex_batch_destroy (&batch);
            master_reply_fail (r, KVPOOL_INTERNAL_ERROR, "out of memory");
            return;
        }
    if (regex_batch_match (batch, self->config->regex_time_limit_ms, NULL) != 0) {
        master_reply_fail (r, regex_batch_status (batch), "%s", regex_batch_error (batch));
        regex_batch_destroy (&batch);
        return;
    }
    size_t hits = 0, count = regex_batch_count (batch);
    for (size_t i = 0; i < count; i++)
        hits += regex_batch_hit (batch, i);
    if (master_reply_keys (r, hits, false, true) != 0
        || !(r->reply.keys = (ProtobufCBinaryData *) arena_alloc (
                 arena, (hits ? hits : 1) * sizeof (ProtobufCBinaryData)))) {
        regex_batch_destroy (&batch);
        master_reply_fail (r, KVPOOL_INTERNAL_ERROR, "out of memory");
        return;
    }
    size_t out = 0;
    for (size_t i = 0; i < count; i++) {
        if (!regex_batch_hit (batch, i))
            continue;
        size_t key_len;
        const char *key = regex_batch_key (batch, i, &key_len);
        dir_entry_t *entry = directory_find (self->directory, key);
        if (!entry)
            continue;
        char *copy = (char *) arena_alloc (arena, key_len + 1);
        if (!copy
            || master_reply_holders (r, r->reply.holders[out], entry->holders, entry->holder_count)
                   != 0)
            break;
        memcpy (copy, key, key_len + 1);
        r->reply.keys[out].data = (uint8_t *) copy;
        r->reply.keys[out].len = key_len;
        s_remove (self, entry);
        out++;
    }
    r->reply.n_keys = r->reply.n_statuses = r->reply.n_holders = out;
    r->reply.count = out;
    regex_batch_destroy (&batch);
}

static void
s_dropped (self_t *self, arena_t *arena, const Kvpool__Cluster__V1__NodeRequest *request,
           const node_t *sender)
{
    int slot = node_table_find (self->nodes, sender->node_id);
    for (size_t i = 0; i < request->n_keys; i++) {
        char *key = s_key (self, arena, &request->keys[i]);
        dir_entry_t *entry = key ? directory_find (self->directory, key) : NULL;
        if (!entry || entry->state != DIR_COMMITTED)
            continue;
        uint8_t before = entry->holder_count, replicas = directory_replicas (entry);
        bool gone = directory_drop_holder (self->directory, entry, (uint16_t) slot);
        kvp_trace (key, "trace %s: %s dropped it%s", key, sender->node_id, gone ? " (gone)" : "");
        if (gone || entry->holder_count < before)
            node_table_get (self->nodes, slot)->objects--;
        //  A replica evicted for room: no repair puts it back elsewhere (it would push
        //  another value out there). (A cache copy let go changes nothing.)
        if (!gone && directory_replicas (entry) < replicas
            && entry->want > directory_replicas (entry))
            entry->want = directory_replicas (entry) ? directory_replicas (entry) : 1;
    }
}

//  CACHE: the sender keeps a cache copy of each key at the version it names: it becomes a
//  holder marked as cache, told of the key's removal or upsert like any holder. Another
//  version (or none) is refused: the node drops its copy unread.
static void
s_cache (self_t *self, reply_t *r, arena_t *arena, const Kvpool__Cluster__V1__NodeRequest *request,
         const node_t *sender)
{
    int slot = s_member (self, r, request, sender);
    if (slot < 0)
        return;
    size_t n = request->n_keys;
    if (request->n_versions != n) {
        master_reply_fail (r, KVPOOL_INVALID_PARAMS, "%zu keys, %zu versions", n,
                           request->n_versions);
        return;
    }
    if (master_reply_keys (r, n, false, false) != 0) {
        master_reply_fail (r, KVPOOL_INTERNAL_ERROR, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        char *key = s_key (self, arena, &request->keys[i]);
        dir_entry_t *entry = key ? directory_find (self->directory, key) : NULL;
        bool held = entry && directory_holds (entry, (uint16_t) slot);
        if (!entry || entry->state != DIR_COMMITTED || !request->versions[i]
            || entry->version != request->versions[i]
            || directory_add_cache (entry, (uint16_t) slot) != 0)
            r->reply.statuses[i] = KVPOOL_OBJECT_NOT_FOUND;
        else if (!held)
            node_table_get (self->nodes, slot)->objects++;
        kvp_trace (key, "trace %s: %s caches v%llu: %s", key, sender->node_id,
                   (unsigned long long) request->versions[i], r->reply.statuses[i] ? "no" : "ok");
    }
}

//  FENCE: a node could not be told to drop keys (it did not answer in time). It is declared
//  dead here (its copies leave the directory; it registers again, dropping its cache
//  copies) and the asker learns how long until the node's cache lease has surely run out:
//  the node renews it only from heartbeats this master answered, so it ends at most
//  lease_ms after the last message heard from it (and a tenth more, for clocks that run
//  apart).
static void
s_fence (self_t *self, reply_t *r, const Kvpool__Cluster__V1__NodeRequest *request,
         const node_t *sender)
{
    if (!sender) {
        master_reply_fail (r, KVPOOL_INVALID_PARAMS, "unknown node %s: register",
                           request->node->node_id);
        return;
    }
    const char *victim = request->pattern ? request->pattern : "";
    int slot = node_table_find (self->nodes, victim);
    node_t *node = node_table_get (self->nodes, slot);
    if (!node) {
        master_reply_fail (r, KVPOOL_INVALID_PARAMS, "unknown node '%.100s'", victim);
        return;
    }
    //  Registered again since the reply that named it as a holder: its copies were judged
    //  against that removal or write when it reported them (s_inventory), and it dropped
    //  its cache copies before it registered. Nothing to fence.
    if (request->n_tokens == 1 && node->alive && node->register_token >= request->tokens[0])
        return;
    if (self->ha && node->fence_term != self->term) {
        if (ha_fence_write (self->ha, node->node_id, self->term) == -1) {
            master_reply_fail (r, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                               "cannot record the fence of node %s in etcd: try again",
                               node->node_id);
            return;
        }
        node->fence_term = self->term;
    }
    int64_t now = zclock_mono ();
    int64_t safe = node->last_heard + (int64_t) (node->lease_ms + node->lease_ms / 10);
    r->reply.wait_ms = node->lease_ms && safe > now ? (uint64_t) (safe - now) : 0;
    if (safe > self->fenced_until)
        self->fenced_until = safe;
    if (node->alive && node != sender) {
        char why[200];
        snprintf (why, sizeof why, "fenced: node %s could not tell it to drop keys",
                  sender->node_id);
        s_node_dead (self, slot, why);
    }
}

//  REPAIR, REPAIRED, DRAIN (master/repair.c).
static void
s_repair (self_t *self, reply_t *r, arena_t *arena, const Kvpool__Cluster__V1__NodeRequest *request,
          const node_t *sender)
{
    int slot = s_member (self, r, request, sender);
    char error[200] = "";
    int status = slot < 0 ? KVPOOL_OK
                          : repair_request (self->repair, slot, request, &r->reply, arena,
                                            self->config->max_key_len, error, sizeof error);
    if (status != KVPOOL_OK)
        master_reply_fail (r, status, "%s", error);
}

static void
s_nodes (self_t *self, reply_t *r)
{
    s_all_nodes (self, r, false);
    r->reply.count = directory_committed (self->directory);
}

//  Receives one message: [routing id, request]. Returns the request frame with where it
//  came from, or NULL (anything else is dropped and counted).
static zframe_t *
s_receive (self_t *self, origin_t *from)
{
    void *router = zsock_resolve (self->router);
    zmq_msg_t part;
    zframe_t *frames[2] = {NULL, NULL};
    size_t count = 0;
    bool more = true;
    from->fd = -1;
    from->user_id[0] = 0;
    while (more) {
        zmq_msg_init (&part);
        if (zmq_msg_recv (&part, router, 0) == -1) {
            zmq_msg_close (&part);
            break;
        }
        more = zmq_msg_more (&part);
        if (count == 1) {
            //  Properties of the connection (the routing id frame does not always carry
            //  them): the credential its handshake proved, and its socket ("__fd", what
            //  ZMQ_SRCFD reads), which the monitor names when it closes.
            const char *user = zmq_msg_gets (&part, "User-Id");
            snprintf (from->user_id, sizeof from->user_id, "%s", user ? user : "");
            const char *fd = zmq_msg_gets (&part, "__fd");
            from->fd = fd ? atoi (fd) : -1;
        }
        if (count < 2)
            frames[count] = zframe_new (zmq_msg_data (&part), zmq_msg_size (&part));
        count++;
        zmq_msg_close (&part);
    }
    //  A node key removed from --curve-nodes is served nothing more; its connections close
    //  (key_watch.h, checked every tick).
    if (count != 2 || !key_watch_seen (self->keys, from->fd, from->user_id)) {
        self->dropped++;
        zframe_destroy (&frames[0]);
        zframe_destroy (&frames[1]);
        return NULL;
    }
    from->routing_id = frames[0];
    return frames[1];
}

//  A connection closed: a node registered on it may be taken over by its restart.
static void
s_monitor_event (self_t *self)
{
    zmsg_t *event = zmsg_recv (self->monitor);
    zframe_t *head = event ? zmsg_first (event) : NULL;
    if (head && zframe_size (head) == 6) {
        uint16_t kind;
        uint32_t fd;
        memcpy (&kind, zframe_data (head), 2);
        memcpy (&fd, zframe_data (head) + 2, 4);
        if (kind == ZMQ_EVENT_DISCONNECTED)
            node_table_conn_closed (self->nodes, (int) fd);
    }
    zmsg_destroy (&event);
}

//  This master leads a new term: what it knew from an earlier one may have changed under
//  another leader since, so it starts afresh, as a restarted master does. Its new epoch
//  sends every node back to REGISTER and INVENTORY.
static void
s_new_term (self_t *self, uint64_t term)
{
    directory_destroy (&self->directory);
    node_table_destroy (&self->nodes);
    self->directory = directory_new ();
    self->nodes = node_table_new (self->config->placement, self->config->seed);
    assert (self->directory && self->nodes);
    node_table_set_max_objects (self->nodes, self->config->max_node_objects);
    repair_restart (self->repair, self->directory, self->nodes);
    zlistx_purge (self->reservations);
    tombstones_clear (self->tombstones, 0);
    uint64_t epoch = (uint64_t) zclock_time ();
    self->epoch = epoch > self->epoch ? epoch : self->epoch + 1;
    uint64_t base = (uint64_t) time (NULL) << 20;
    if (base > self->next_token)
        self->next_token = base;
    char *slash = strrchr (self->master_id, '/');
    if (slash)
        snprintf (slash + 1, sizeof self->master_id - (size_t) (slash + 1 - self->master_id),
                  "%llu", (unsigned long long) self->epoch);
    kvp_info ("the master leads term %llu: nodes register and report what they hold",
              (unsigned long long) term);
    self->term = term;
    self->started = self->recovered = zclock_mono ();
}

//  With standby masters: whether this master refuses request because it does not lead now
//  (the reply says which master does, as far as it knows), or because the node knows of a
//  later term than its own (it was deposed and has not noticed yet).
static bool
s_standing_by (self_t *self, reply_t *r, const Kvpool__Cluster__V1__NodeRequest *request)
{
    uint64_t term = ha_leading (self->ha, zclock_mono ());
    if (term && term != self->term)
        s_new_term (self, term);
    if (term && request->term <= term) {
        r->reply.term = term;
        return false;
    }
    char *leader = (char *) arena_alloc (r->arena, 256);
    uint64_t leader_term = 0;
    if (leader) {
        ha_leader (self->ha, leader, 256, &leader_term);
        r->reply.leader = leader;
    }
    r->reply.term = leader_term > self->term ? leader_term : self->term;
    if (term)
        master_reply_fail (r, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                           "this master's term %llu is over: the node knows term %llu",
                           (unsigned long long) term, (unsigned long long) request->term);
    else if (leader && *leader)
        master_reply_fail (r, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                           "this master stands by: %s leads (term %llu)", leader,
                           (unsigned long long) leader_term);
    else
        master_reply_fail (r, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                           "this master stands by: no master leads now");
    return true;
}

static void
s_request (self_t *self)
{
    origin_t from;
    zframe_t *body = s_receive (self, &from);
    if (!body)
        return;
    zframe_t *routing_id = from.routing_id;
    arena_t arena;
    arena_init (&arena, zframe_size (body) * 2);
    Kvpool__Cluster__V1__NodeRequest *request = kvpool__cluster__v1__node_request__unpack (
        arena_allocator (&arena), zframe_size (body), zframe_data (body));
    zframe_destroy (&body);
    reply_t r;
    s_reply_init (self, &r, &arena, request);
    self->requests++;
    if (!request)
        master_reply_fail (&r, KVPOOL_PROTOCOL_ERROR, "not a kvpool.cluster.v1.NodeRequest");
    else if (request->version != KVP_PROTOCOL_VERSION)
        master_reply_fail (&r, KVPOOL_INVALID_VERSION, "version %u: this master speaks %d",
                           request->version, KVP_PROTOCOL_VERSION);
    else if (!request->node || !request->node->node_id || !*request->node->node_id)
        master_reply_fail (&r, KVPOOL_INVALID_PARAMS, "the request names no node");
    else if (self->ha && s_standing_by (self, &r, request))
        ; //  (refused: another master leads, or none does now)
    else {
        //  A message from the process that registered the node is a sign of life; nobody
        //  else's is (s_proven).
        node_t *sender = s_proven (self, request, &from);
        if (sender) {
            sender->last_heard = zclock_mono ();
            sender->seen_token = self->next_token;
        }
        //  (A change from a node away since it asked is refused: s_fenced.)
        if (!s_fenced (self, &r, sender, request) && !s_recovering (self, &r, request)
            && !s_stale (self, &r, request))
            switch (request->kind) {
                case KVPOOL__CLUSTER__V1__KIND__REGISTER:
                    s_register (self, &r, request, &from);
                    break;
                case KVPOOL__CLUSTER__V1__KIND__HEARTBEAT:
                    if (s_member (self, &r, request, sender) >= 0) {
                        sender->free = request->node->free;
                        sender->capacity = request->node->capacity;
                        sender->placed = 0;
                        //  Its inventory is in (its heartbeats follow it): the record of
                        //  its fence has served.
                        if (sender->fence_term) {
                            ha_fence_clear (self->ha, sender->node_id);
                            sender->fence_term = 0;
                            sender->suspect = false;
                        }
                    }
                    break;
                case KVPOOL__CLUSTER__V1__KIND__INVENTORY:
                    s_inventory (self, &r, &arena, request, sender);
                    break;
                case KVPOOL__CLUSTER__V1__KIND__PLACE: s_place (self, &r, &arena, request); break;
                case KVPOOL__CLUSTER__V1__KIND__COMMIT: s_commit (self, &r, &arena, request); break;
                case KVPOOL__CLUSTER__V1__KIND__ABORT: s_abort (self, &arena, request); break;
                case KVPOOL__CLUSTER__V1__KIND__LOCATE:
                    s_locate (self, &r, &arena, request, false);
                    break;
                case KVPOOL__CLUSTER__V1__KIND__REMOVE:
                    s_locate (self, &r, &arena, request, true);
                    break;
                case KVPOOL__CLUSTER__V1__KIND__REMOVE_ALL:
                    r.reply.count = directory_remove_all (self->directory);
                    //  (Everything up to now was removed.)
                    tombstones_clear (self->tombstones, ++self->next_token);
                    for (size_t n = 0; n < node_table_size (self->nodes); n++)
                        node_table_get (self->nodes, (int) n)->objects = 0;
                    s_all_nodes (self, &r, true);
                    break;
                case KVPOOL__CLUSTER__V1__KIND__REMOVE_REGEX:
                    s_remove_regex (self, &r, &arena, request);
                    break;
                case KVPOOL__CLUSTER__V1__KIND__DROPPED:
                    s_dropped (self, &arena, request, sender);
                    break;
                case KVPOOL__CLUSTER__V1__KIND__NODES: s_nodes (self, &r); break;
                case KVPOOL__CLUSTER__V1__KIND__CACHE:
                    s_cache (self, &r, &arena, request, sender);
                    break;
                case KVPOOL__CLUSTER__V1__KIND__FENCE: s_fence (self, &r, request, sender); break;
                case KVPOOL__CLUSTER__V1__KIND__REPAIR:
                case KVPOOL__CLUSTER__V1__KIND__REPAIRED:
                case KVPOOL__CLUSTER__V1__KIND__DRAIN:
                    s_repair (self, &r, &arena, request, sender);
                    break;
                default:
                    master_reply_fail (&r, KVPOOL_UNKNOWN_OPERATION, "unknown kind %d",
                                       request->kind);
            }
    }
    master_reply_log (&r, request);
    //  A fenced node serves its own copies until it hears it was declared dead: until its
    //  lease has surely run out, a change is answered with that wait (s_fence).
    master_reply_hold (&r, request, self->fenced_until - zclock_mono ());
    s_send (self, routing_id, &r);
    arena_fini (&arena);
}

//  Nodes silent too long are dead; reservations nobody finished are dropped. A master that
//  was stalled itself first gives every node the stalled time back: their heartbeats are in
//  its socket, unread, and declaring them dead would drop every replica they hold.
static void
s_tick (self_t *self)
{
    int64_t now = zclock_mono ();
    int64_t stalled = now - self->last_tick - LIVENESS_TICK_MS;
    self->last_tick = now;
    if (self->ha) {
        uint64_t term = ha_leading (self->ha, now);
        if (term && term != self->term)
            s_new_term (self, term);
        if (!term) { //  a standby declares nobody dead
            self->next_tick = now + LIVENESS_TICK_MS;
            kvp_cluster_figures_t figures = {
                .failovers = ha_terms_won (self->ha), .term = self->term, .standby = true};
            metrics_cluster (self->config->metrics, &figures, now);
            return;
        }
    }
    if (stalled > MASTER_STALL_MS) {
        self->stale_until = now + STALE_WINDOW_MS;
        kvp_warning ("the master did not run for %lld ms (stopped or starved of CPU): the "
                     "nodes get that time back before any is declared dead",
                     (long long) stalled);
        for (size_t slot = 0; slot < node_table_size (self->nodes); slot++) {
            node_t *node = node_table_get (self->nodes, (int) slot);
            if (node->alive)
                node->last_heard += stalled;
        }
    }
    for (size_t slot = 0; slot < node_table_size (self->nodes); slot++) {
        node_t *node = node_table_get (self->nodes, (int) slot);
        if (node->alive && now - node->last_heard > (int64_t) self->config->node_ttl_ms) {
            char why[64];
            snprintf (why, sizeof why, "silent for %lld ms", (long long) (now - node->last_heard));
            s_node_dead (self, (int) slot, why);
        }
    }
    reservation_t *reservation;
    while ((reservation = (reservation_t *) zlistx_first (self->reservations))
           && reservation->deadline <= now) {
        dir_entry_t *entry = directory_find (self->directory, reservation->key);
        if (entry && entry->state == DIR_PENDING && entry->token == reservation->token) {
            tombstones_abort (self->tombstones, entry->key, ++self->next_token, entry->token);
            directory_remove (self->directory, entry); //  (its record goes just below)
        }
        zlistx_delete (self->reservations, zlistx_cursor (self->reservations));
    }
    key_watch_check (self->keys, now);
    repair_tick (self->repair, now);
    self->next_tick = now + LIVENESS_TICK_MS;
    kvp_cluster_figures_t figures = {.nodes = node_table_size (self->nodes),
                                     .alive = node_table_alive (self->nodes),
                                     .keys = directory_size (self->directory),
                                     .objects = directory_committed (self->directory),
                                     .failovers = self->ha ? ha_terms_won (self->ha) : 0,
                                     .term = self->term,
                                     .replicas_missing = repair_missing (self->repair),
                                     .repairs_done = repair_done (self->repair),
                                     .repair_bytes = repair_bytes (self->repair)};
    node_table_space (self->nodes, &figures.capacity, &figures.used_bytes);
    metrics_cluster (self->config->metrics, &figures, now);
}

static int
s_pipe_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    (void) shell, (void) msg;
    self_t *self = (self_t *) arg;
    if (streq (command, "ENDPOINTS"))
        kvp_endpoints_reply (self->pipe, self->endpoints, self->bind_error);
    else {
        kvp_error ("invalid pipe command '%s'", command);
        assert (false);
    }
    return 0;
}

static int
s_router_reader (actor_shell_t *shell, zsock_t *router, void *arg)
{
    (void) shell;
    //  Drain what is queued, but let the liveness tick run between bursts.
    for (int i = 0; i < 1000 && (zsock_events (router) & ZMQ_POLLIN); i++)
        s_request ((self_t *) arg);
    return 0;
}

static int
s_monitor_reader (actor_shell_t *shell, zsock_t *monitor, void *arg)
{
    (void) shell, (void) monitor;
    s_monitor_event ((self_t *) arg);
    return 0;
}

static int64_t
s_tick_due (actor_shell_t *shell, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    if (zclock_mono () >= self->next_tick)
        s_tick (self);
    return self->next_tick;
}

void
master_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-master");
    self_t *self = s_self_new (pipe, (const kvp_config_t *) args);
    actor_shell_add (shell, self->router, s_router_reader);
    actor_shell_add (shell, self->monitor, s_monitor_reader);
    actor_shell_on_command (shell, s_pipe_command);
    actor_shell_on_tick (shell, s_tick_due);
    actor_shell_run (shell, self);
    s_self_destroy (&self);
    actor_shell_destroy (&shell);
}
