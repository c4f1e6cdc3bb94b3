/*  master_client.c - a node's conversation with its master (master_client.h).

    One DEALER to the one master there is today, and a table of the calls out on it
    (dataplane/rpc_calls.h: ids, deadlines, matching). Every id, a call's or not, comes
    from that table's one sequence, so a reply to a request nobody waits for never matches
    a call. The socket's settings are the ones the membership and cluster actors each set on
    their own before this file: see the header. With several masters (by key hash, or a
    standby taking over), the client keeps a socket per master and the table stays one: a
    reply is matched by id, whichever master sent it.

    Threads: the owner's. The registration pair is read and written with atomics: the
    membership actor's client writes it, the cluster actor's reads it.
*/
#include "actors/master_client.h"

#include "dataplane/rpc_calls.h"
#include "infra/curve.h"
#include "infra/leader.h"
#include "kvpool_status.h"
#include "protocol/contract.h"

struct _master_client_t {
    const cluster_args_t *args;
    const kvp_config_t *config;
    zsock_t *master;
    rpc_calls_t *calls;
    int timeout_ms;
    char name[1024]; //  "the master (EP)"
    //  The registration: the node's (args->registration), or this client's own when the
    //  node has none to share (a test).
    cluster_registration_t own;
    cluster_registration_t *registration;
    uint64_t capacity, free;
    uint64_t failures;
    uint64_t sent; //  requests sent
    //  With standby masters (config->leader): the leader connected to (its endpoint, "":
    //  none) and the view's generation when it was.
    kvp_leader_t *leader;
    char connected[256];
    uint64_t generation;
    uint64_t stale; //  replies dropped: from a master of an older term than the one known
    //  Who waits on the socket (master_client_wait_on, master_client_poll_on): a new leader
    //  gets a new socket, put in the old one's place there.
    actor_shell_t *shell;
    actor_shell_reader_fn *reader;
    zpoller_t *poller;
    int64_t connected_at; //  when the socket was made for the leader (zclock_mono)
};

//  Just after a new leader's socket is made, its connection takes a moment: a send waits
//  for it this long, rather than fail the first requests to a leader that is there.
#define LEADER_CONNECT_WAIT_MS 250

//  The DEALER to a master, its settings the ones the header lists.
static zsock_t *
s_socket_new (master_client_t *self)
{
    zsock_t *sock = zsock_new (ZMQ_DEALER);
    assert (sock);
    zsock_set_linger (sock, 0);
    //  While the master is away a request fails at once, rather than wait in a queue.
    zsock_set_immediate (sock, 1);
    zsock_set_sndhwm (sock, 100000);
    zsock_set_heartbeat_ivl (sock, 1000);
    zsock_set_heartbeat_timeout (sock, 3000);
    zsock_set_reconnect_ivl (sock, 100);
    //  No back-off: a returning master is found at once.
    zsock_set_reconnect_ivl_max (sock, 0);
    kvp_curve_cluster_client (self->config->curve, sock,
                              kvp_curve_master_key (self->config->curve));
    return sock;
}

//  With standby masters: connects to the leader the node's view names now, if that changed
//  since the last look (the socket's old connection goes; its calls time out).
static void
s_follow (master_client_t *self)
{
    kvp_leader_t *leader = self->leader;
    if (!leader || atomic_load (&leader->generation) == self->generation)
        return;
    self->generation = atomic_load (&leader->generation);
    char endpoint[256];
    kvp_leader_get (leader, endpoint, sizeof endpoint, NULL);
    if (streq (endpoint, self->connected))
        return;
    //  A socket of its own for the new leader: a message sent right after a disconnect may
    //  still leave on the old connection (libzmq ends it in the background), where a
    //  deposed master would answer it, or nobody would.
    if (self->shell)
        actor_shell_remove (self->shell, self->master);
    if (self->poller)
        zpoller_remove (self->poller, self->master);
    zsock_destroy (&self->master);
    self->master = s_socket_new (self);
    if (self->shell)
        actor_shell_add (self->shell, self->master, self->reader);
    if (self->poller)
        zpoller_add (self->poller, self->master);
    snprintf (self->connected, sizeof self->connected, "%s", endpoint);
    self->connected_at = zclock_mono ();
    if (*endpoint) {
        zsock_connect (self->master, "%s", endpoint);
        snprintf (self->name, sizeof self->name, "the master (%s, leader of %s)", endpoint,
                  leader->url);
    }
    else
        snprintf (self->name, sizeof self->name, "the master (none leads %s now)", leader->url);
}

master_client_t *
master_client_new (const cluster_args_t *args, int timeout_ms)
{
    assert (args && args->config && args->config->master);
    master_client_t *self = (master_client_t *) zmalloc (sizeof (master_client_t));
    self->args = args;
    self->config = args->config;
    self->timeout_ms = timeout_ms;
    self->registration = args->registration ? args->registration : &self->own;
    self->calls = rpc_calls_new ();
    snprintf (self->name, sizeof self->name, "the master (%s)", master_client_endpoint (self));
    self->master = s_socket_new (self);
    self->leader = self->config->leader;
    if (self->leader) {
        //  (Generation 0 is never a view's: the first look always connects.)
        self->generation = UINT64_MAX;
        s_follow (self);
    }
    else
        zsock_connect (self->master, "%s", master_client_endpoint (self));
    return self;
}

void
master_client_destroy (master_client_t **self_p)
{
    master_client_t *self = *self_p;
    if (!self)
        return;
    zsock_destroy (&self->master);
    rpc_calls_destroy (&self->calls);
    free (self);
    *self_p = NULL;
}

const char *
master_client_endpoint (master_client_t *self)
{
    //  The seam: with standby masters, the leader's (or "" while none leads); a key hash ->
    //  master map will answer here too.
    if (self->leader) {
        s_follow (self);
        return self->connected;
    }
    return self->config->master;
}

bool
master_client_follow (master_client_t *self)
{
    uint64_t before = self->generation;
    s_follow (self);
    return self->generation != before;
}

uint64_t
master_client_term (master_client_t *self)
{
    return self->leader ? atomic_load (&self->leader->term) : 0;
}

uint64_t
master_client_stale_replies (master_client_t *self)
{
    return self->stale;
}

const char *
master_client_name (master_client_t *self)
{
    return self->name;
}

void
master_client_poll_on (master_client_t *self, zpoller_t *poller)
{
    zpoller_add (poller, self->master);
    self->poller = poller;
}

void
master_client_wait_on (master_client_t *self, actor_shell_t *shell, actor_shell_reader_fn *reader)
{
    actor_shell_add (shell, self->master, reader);
    self->shell = shell;
    self->reader = reader;
}

bool
master_client_owns (master_client_t *self, void *which)
{
    return which && which == (void *) self->master;
}

void
master_client_set_space (master_client_t *self, uint64_t capacity, uint64_t free)
{
    self->capacity = capacity;
    self->free = free;
}

//  How a node names itself to the master: id, host, client endpoint, data plane, CURVE key.
static void
s_describe (master_client_t *self, Kvpool__Cluster__V1__Node *node)
{
    const cluster_args_t *args = self->args;
    node->node_id = (char *) args->node_id;
    node->host_id = (char *) args->host_id;
    node->client_endpoint = (char *) args->client_endpoint;
    node->peer_endpoint = (char *) args->peer_endpoint;
    node->curve_key = (char *) kvp_curve_public_key (self->config->curve);
    node->disk_capacity = self->config->disk_dir ? self->config->disk_capacity : 0;
    node->capacity = self->capacity;
    node->free = self->free;
    node->lease_ms = KVP_LEASE_BEATS * self->config->heartbeat_ms;
}

uint64_t
master_client_send (master_client_t *self, Kvpool__Cluster__V1__NodeRequest *request, void *handle)
{
    Kvpool__Cluster__V1__Node node = KVPOOL__CLUSTER__V1__NODE__INIT;
    s_describe (self, &node);
    request->version = KVP_PROTOCOL_VERSION;
    request->node = &node;
    s_follow (self);
    request->term = master_client_term (self);
    //  The master's secret for this registration: only with it does a change or a report
    //  count as this node's (fencing).
    request->epoch = atomic_load (&self->registration->epoch);
    request->registration = atomic_load (&self->registration->number);
    request->request_id =
        handle ? rpc_calls_add (self->calls, handle, zclock_mono () + self->timeout_ms)
               : rpc_calls_next_id (self->calls);
    size_t size = kvpool__cluster__v1__node_request__get_packed_size (request);
    zmq_msg_t msg;
    zmq_msg_init_size (&msg, size);
    kvpool__cluster__v1__node_request__pack (request, (uint8_t *) zmq_msg_data (&msg));
    request->node = NULL;
    //  No master leads now: the request fails at once, as to a master that is away.
    int sent = self->leader && !*self->connected
                   ? -1
                   : zmq_msg_send (&msg, zsock_resolve (self->master), ZMQ_DONTWAIT);
    int64_t waited = zclock_mono () - self->connected_at;
    if (sent == -1 && self->leader && *self->connected && waited < LEADER_CONNECT_WAIT_MS) {
        zmq_pollitem_t item = {zsock_resolve (self->master), 0, ZMQ_POLLOUT, 0};
        if (zmq_poll (&item, 1, LEADER_CONNECT_WAIT_MS - waited) == 1)
            sent = zmq_msg_send (&msg, zsock_resolve (self->master), ZMQ_DONTWAIT);
    }
    if (sent == -1) {
        zmq_msg_close (&msg);
        self->failures++;
        if (handle)
            rpc_calls_take (self->calls, request->request_id);
        return 0;
    }
    self->sent++;
    return request->request_id;
}

Kvpool__Cluster__V1__MasterReply *
master_client_recv (master_client_t *self, void *which, void **handle_p)
{
    *handle_p = NULL;
    zsock_t *sock = (zsock_t *) which;
    assert (master_client_owns (self, which));
    zframe_t *frame = zframe_recv (sock);
    if (!frame)
        return NULL;
    while (zsock_rcvmore (sock)) { //  one frame a reply: anything more is not ours
        zframe_t *extra = zframe_recv (sock);
        zframe_destroy (&extra);
    }
    Kvpool__Cluster__V1__MasterReply *reply =
        kvpool__cluster__v1__master_reply__unpack (NULL, zframe_size (frame), zframe_data (frame));
    zframe_destroy (&frame);
    //  A master of an older term than the one known was deposed, whatever it says: its
    //  answer is dropped, and the call it answers times out (or is answered by the leader).
    if (reply && self->leader && reply->term < atomic_load (&self->leader->term)) {
        self->stale++;
        master_client_reply_free (&reply);
        return NULL;
    }
    if (reply)
        *handle_p = rpc_calls_take (self->calls, reply->request_id);
    return reply;
}

void
master_client_reply_free (Kvpool__Cluster__V1__MasterReply **reply_p)
{
    if (*reply_p) {
        kvpool__cluster__v1__master_reply__free_unpacked (*reply_p, NULL);
        *reply_p = NULL;
    }
}

void *
master_client_expired (master_client_t *self)
{
    void *handle = rpc_calls_expired (self->calls, zclock_mono ());
    if (handle)
        self->failures++;
    return handle;
}

void *
master_client_cancel (master_client_t *self)
{
    return rpc_calls_first (self->calls);
}

void
master_client_registered (master_client_t *self, uint64_t epoch, uint64_t number)
{
    atomic_store (&self->registration->epoch, epoch);
    atomic_store (&self->registration->number, number);
}

uint64_t
master_client_epoch (master_client_t *self)
{
    return atomic_load (&self->registration->epoch);
}

bool
master_client_stale (master_client_t *self, const Kvpool__Cluster__V1__MasterReply *reply)
{
    return reply->kind != KVPOOL__CLUSTER__V1__KIND__REGISTER
           && (reply->status != KVPOOL_OK || reply->epoch != master_client_epoch (self));
}

uint64_t
master_client_failures (master_client_t *self)
{
    return self->failures;
}

uint64_t
master_client_sent (master_client_t *self)
{
    return self->sent;
}

//  ---- self test ---------------------------------------------------------------------

//  A fake master: answers each request by its kind. REGISTER: epoch 7, registration 99.
//  HEARTBEAT: OK with epoch 7 while the registration is 99, else "unknown node". LOCATE:
//  silent (the call times out), and answered late, just before the next request's reply.
//  Anything else: OK, echoing the request's registration in count.
static void
s_fake_master (zsock_t *pipe, void *args)
{
    zsock_t *router = zsock_new_router ((const char *) args);
    assert (router);
    zpoller_t *poller = zpoller_new (pipe, router, NULL);
    zsock_signal (pipe, 0);
    uint64_t held_id = 0;
    zframe_t *held_to = NULL;
    while (zpoller_wait (poller, -1) == router) {
        zframe_t *routing_id = zframe_recv (router);
        zframe_t *frame = zframe_recv (router);
        Kvpool__Cluster__V1__NodeRequest *request = kvpool__cluster__v1__node_request__unpack (
            NULL, zframe_size (frame), zframe_data (frame));
        zframe_destroy (&frame);
        assert (request && request->node && streq (request->node->node_id, "n1"));
        if (request->kind == KVPOOL__CLUSTER__V1__KIND__LOCATE) {
            held_id = request->request_id;
            zframe_destroy (&held_to);
            held_to = routing_id;
            kvpool__cluster__v1__node_request__free_unpacked (request, NULL);
            continue;
        }
        Kvpool__Cluster__V1__MasterReply reply = KVPOOL__CLUSTER__V1__MASTER_REPLY__INIT;
        reply.version = KVP_PROTOCOL_VERSION;
        if (held_id) {
            reply.request_id = held_id;
            reply.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;
            zframe_t *late =
                zframe_new (NULL, kvpool__cluster__v1__master_reply__get_packed_size (&reply));
            kvpool__cluster__v1__master_reply__pack (&reply, zframe_data (late));
            zframe_send (&held_to, router, ZFRAME_MORE);
            zframe_send (&late, router, 0);
            held_id = 0;
        }
        reply.request_id = request->request_id;
        reply.kind = request->kind;
        reply.epoch = 7;
        if (request->kind == KVPOOL__CLUSTER__V1__KIND__REGISTER)
            reply.registration = 99;
        else if (request->kind == KVPOOL__CLUSTER__V1__KIND__HEARTBEAT
                 && (request->registration != 99 || request->epoch != 7)) {
            reply.status = KVPOOL_INVALID_PARAMS;
            reply.error = (char *) "unknown node n1: register";
        }
        reply.count = request->registration;
        zframe_t *out =
            zframe_new (NULL, kvpool__cluster__v1__master_reply__get_packed_size (&reply));
        kvpool__cluster__v1__master_reply__pack (&reply, zframe_data (out));
        zframe_send (&routing_id, router, ZFRAME_MORE);
        zframe_send (&out, router, 0);
        kvpool__cluster__v1__node_request__free_unpacked (request, NULL);
    }
    zframe_destroy (&held_to);
    zpoller_destroy (&poller);
    zsock_destroy (&router);
}

//  Waits for the client's next reply: the reply and its call's handle.
static Kvpool__Cluster__V1__MasterReply *
s_next (master_client_t *client, zpoller_t *poller, void **handle_p)
{
    void *which = zpoller_wait (poller, 2000);
    assert (master_client_owns (client, which));
    return master_client_recv (client, which, handle_p);
}

void
master_client_test (bool verbose)
{
    const char *endpoint = "inproc://master_client_test";
    zactor_t *master = zactor_new (s_fake_master, (void *) endpoint);
    kvp_config_t config;
    kvp_config_defaults (&config);
    config.master = endpoint;
    cluster_args_t args = {&config, "n1", "h1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3", NULL};
    master_client_t *client = master_client_new (&args, 100);
    assert (streq (master_client_endpoint (client), endpoint));
    assert (streq (master_client_name (client), "the master (inproc://master_client_test)"));
    zpoller_t *poller = zpoller_new (NULL);
    master_client_poll_on (client, poller);
    int call_a, call_b;
    void *handle;

    //  A reply: registered, the pair goes with every request from then on (fencing).
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = KVPOOL__CLUSTER__V1__KIND__REGISTER;
    uint64_t id = master_client_send (client, &request, &call_a);
    assert (id > 0 && request.request_id == id);
    Kvpool__Cluster__V1__MasterReply *reply = s_next (client, poller, &handle);
    assert (reply && handle == &call_a && reply->request_id == id && reply->registration == 99);
    master_client_registered (client, reply->epoch, reply->registration);
    master_client_reply_free (&reply);
    assert (reply == NULL);
    request.kind = KVPOOL__CLUSTER__V1__KIND__PLACE;
    master_client_send (client, &request, &call_a);
    reply = s_next (client, poller, &handle);
    assert (handle == &call_a && reply->count == 99 && !master_client_stale (client, reply));
    master_client_reply_free (&reply);

    //  A timeout: the master stays silent; the call is handed back once, as expired.
    request.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;
    uint64_t late_id = master_client_send (client, &request, &call_b);
    assert (master_client_expired (client) == NULL);
    zclock_sleep (150);
    assert (master_client_expired (client) == &call_b);
    assert (master_client_expired (client) == NULL);
    assert (master_client_failures (client) == 1);

    //  A reply to an older request is ignored: the late LOCATE answer comes first and
    //  matches no call; the next call's reply matches it.
    request.kind = KVPOOL__CLUSTER__V1__KIND__NODES;
    id = master_client_send (client, &request, &call_a);
    reply = s_next (client, poller, &handle);
    assert (reply && reply->request_id == late_id && handle == NULL);
    master_client_reply_free (&reply);
    reply = s_next (client, poller, &handle);
    assert (reply && reply->request_id == id && handle == &call_a);
    master_client_reply_free (&reply);

    //  A retry, as membership does: a heartbeat nobody waits for, answered without a call.
    request.kind = KVPOOL__CLUSTER__V1__KIND__HEARTBEAT;
    id = master_client_send (client, &request, NULL);
    reply = s_next (client, poller, &handle);
    assert (reply && reply->request_id == id && handle == NULL);
    assert (!master_client_stale (client, reply));
    master_client_reply_free (&reply);

    //  A stale registration: the master no longer knows this one (here: another epoch's
    //  pair), and says so; the client sees the node must register again.
    master_client_registered (client, 7, 98);
    id = master_client_send (client, &request, NULL);
    reply = s_next (client, poller, &handle);
    assert (reply && reply->status == KVPOOL_INVALID_PARAMS && master_client_stale (client, reply));
    master_client_reply_free (&reply);
    master_client_registered (client, 6, 99);
    master_client_send (client, &request, NULL);
    reply = s_next (client, poller, &handle);
    assert (master_client_stale (client, reply)); //  refused, and of another epoch
    master_client_reply_free (&reply);

    //  Stopping with a call out: the owner takes it back.
    master_client_send (client, &request, &call_b);
    assert (master_client_cancel (client) == &call_b);
    assert (master_client_cancel (client) == NULL);
    zpoller_destroy (&poller);
    master_client_destroy (&client);
    assert (client == NULL);
    master_client_destroy (&client);

    //  No master at all: a request does not go (ZMQ_IMMEDIATE), and says so.
    config.master = "tcp://127.0.0.1:1";
    client = master_client_new (&args, 100);
    assert (master_client_send (client, &request, &call_a) == 0);
    assert (master_client_cancel (client) == NULL && master_client_failures (client) == 1);
    master_client_destroy (&client);
    zactor_destroy (&master);
    if (verbose)
        printf ("master_client ok ");
}
