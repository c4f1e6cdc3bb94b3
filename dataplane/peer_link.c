/*  peer_link.c - one connection to another node's data plane (peer_link.h).

    The socket's settings are the ones both users had before they shared this file: no
    linger (a node that is gone holds nothing up), no high-water marks (a send never blocks
    the caller and a reply is never dropped), reconnects every 100 ms, and, for links that sit
    idle between calls, libzmq heartbeats. A reply is received whole (header and every value
    frame) before it is decoded, so a message cut short is dropped whole.

    Ids: peer_link_call takes the link's own sequence, and a reply with another id can only
    be a late answer to an earlier call of this link (a call that timed out leaves the link in
    doubt, and its owner closes it, so even that is rare). A link read from a poller
    (peer_link_send with the ids of the owner's rpc_calls table) never looks at ids itself.

    Threads: one a link.
*/
#include "dataplane/peer_link.h"

#include <assert.h>

#include "infra/curve.h"
#include "protocol/contract.h"

//  How far past a call's deadline its caller must wake to count as not having run, and how
//  long the answer then gets (peer_link_call).
#define PEER_LINK_STALL_MS 100

#define HEARTBEAT_IVL_MS 1000
#define HEARTBEAT_TIMEOUT_MS 3000

struct _peer_link_t {
    zsock_t *sock;
    char *endpoint;
    char *curve_key;
    const kvp_curve_t *curve;
    bool heartbeat;
    uint64_t next_id; //  peer_link_call's
    int64_t last_used;
};

static zsock_t *
s_connect (peer_link_t *self)
{
    zsock_t *sock = zsock_new (ZMQ_DEALER);
    if (!sock)
        return NULL;
    zsock_set_linger (sock, 0);
    zsock_set_sndhwm (sock, 0);
    zsock_set_rcvhwm (sock, 0);
    zsock_set_reconnect_ivl (sock, 100);
    if (self->heartbeat) {
        //  A connection that died without a FIN is found out, and made again.
        zsock_set_heartbeat_ivl (sock, HEARTBEAT_IVL_MS);
        zsock_set_heartbeat_timeout (sock, HEARTBEAT_TIMEOUT_MS);
    }
    kvp_curve_cluster_client (self->curve, sock, self->curve_key);
    if (zsock_connect (sock, "%s", self->endpoint) != 0)
        zsock_destroy (&sock);
    return sock;
}

peer_link_t *
peer_link_new (const char *endpoint, const char *curve_key, const kvp_curve_t *curve,
               bool heartbeat)
{
    assert (endpoint);
    peer_link_t *self = (peer_link_t *) zmalloc (sizeof (peer_link_t));
    self->endpoint = strdup (endpoint);
    self->curve_key = strdup (curve_key ? curve_key : "");
    assert (self->endpoint && self->curve_key);
    self->curve = curve;
    self->heartbeat = heartbeat;
    self->last_used = zclock_mono ();
    self->sock = s_connect (self);
    if (!self->sock)
        peer_link_destroy (&self);
    return self;
}

void
peer_link_destroy (peer_link_t **self_p)
{
    peer_link_t *self = *self_p;
    if (!self)
        return;
    zsock_destroy (&self->sock);
    free (self->endpoint);
    free (self->curve_key);
    free (self);
    *self_p = NULL;
}

int
peer_link_reconnect (peer_link_t *self)
{
    zsock_destroy (&self->sock);
    self->sock = s_connect (self);
    return self->sock ? 0 : -1;
}

zsock_t *
peer_link_sock (peer_link_t *self)
{
    return self->sock;
}

int64_t
peer_link_last_used (peer_link_t *self)
{
    return self->last_used;
}

int
peer_link_send (peer_link_t *self, Kvpool__V1__Request *request, uint64_t id, zmq_msg_t *values,
                size_t count)
{
    request->version = KVP_PROTOCOL_VERSION;
    request->request_id = id;
    self->last_used = zclock_mono ();
    int rc = -1;
    size_t sent = 0;
    if (self->sock) {
        void *handle = zsock_resolve (self->sock);
        zmq_msg_t msg;
        zmq_msg_init_size (&msg, kvpool__v1__request__get_packed_size (request));
        kvpool__v1__request__pack (request, (uint8_t *) zmq_msg_data (&msg));
        rc = zmq_msg_send (&msg, handle, count ? ZMQ_SNDMORE : 0);
        if (rc == -1)
            zmq_msg_close (&msg);
        for (; rc != -1 && sent < count; sent++)
            rc = zmq_msg_send (&values[sent], handle, sent + 1 < count ? ZMQ_SNDMORE : 0);
        //  (a frame that failed to go is still ours, as are those after it)
        if (rc == -1 && sent)
            sent--;
    }
    for (size_t k = sent; k < count; k++)
        zmq_msg_close (&values[k]);
    return rc == -1 ? -1 : 0;
}

Kvpool__V1__Reply *
peer_link_recv (zsock_t *sock, zmq_msg_t **frames_p, size_t *count_p)
{
    void *handle = zsock_resolve (sock);
    *frames_p = NULL;
    *count_p = 0;
    zmq_msg_t header;
    zmq_msg_init (&header);
    if (zmq_msg_recv (&header, handle, 0) == -1) {
        zmq_msg_close (&header);
        return NULL;
    }
    //  The value frames, kept as messages: a fetched value is sent on without a copy.
    size_t capacity = 8, count = 0;
    zmq_msg_t *frames = (zmq_msg_t *) malloc (capacity * sizeof (zmq_msg_t));
    assert (frames);
    int more = zmq_msg_more (&header);
    while (more) {
        if (count == capacity) {
            capacity *= 2;
            frames = (zmq_msg_t *) realloc (frames, capacity * sizeof (zmq_msg_t));
            assert (frames);
        }
        zmq_msg_init (&frames[count]);
        if (zmq_msg_recv (&frames[count], handle, 0) == -1) {
            zmq_msg_close (&frames[count]);
            break;
        }
        more = zmq_msg_more (&frames[count]);
        count++;
    }
    Kvpool__V1__Reply *reply =
        more ? NULL //  cut short: dropped whole
             : kvpool__v1__reply__unpack (NULL, zmq_msg_size (&header),
                                          (const uint8_t *) zmq_msg_data (&header));
    zmq_msg_close (&header);
    if (!reply) {
        peer_link_reply_free (NULL, &frames, count);
        return NULL;
    }
    *frames_p = frames;
    *count_p = count;
    return reply;
}

void
peer_link_reply_free (Kvpool__V1__Reply **reply_p, zmq_msg_t **frames_p, size_t count)
{
    if (reply_p && *reply_p) {
        kvpool__v1__reply__free_unpacked (*reply_p, NULL);
        *reply_p = NULL;
    }
    if (frames_p && *frames_p) {
        for (size_t i = 0; i < count; i++)
            zmq_msg_close (&(*frames_p)[i]);
        free (*frames_p);
        *frames_p = NULL;
    }
}

peer_link_rc_t
peer_link_call (peer_link_t *self, Kvpool__V1__Request *request, zmq_msg_t *values, size_t count,
                int timeout_ms, Kvpool__V1__Reply **reply_p, zmq_msg_t **frames_p, size_t *count_p)
{
    *reply_p = NULL;
    *frames_p = NULL;
    *count_p = 0;
    uint64_t id = ++self->next_id;
    if (peer_link_send (self, request, id, values, count) != 0)
        return PEER_LINK_SEND_FAILED;
    int64_t deadline = zclock_mono () + timeout_ms;
    void *handle = zsock_resolve (self->sock);
    bool grace = false;
    while (true) {
        int64_t wait = deadline - zclock_mono ();
        zmq_pollitem_t item = {handle, 0, ZMQ_POLLIN, 0};
        if (wait <= 0 || zmq_poll (&item, 1, (long) wait) <= 0 || !(item.revents & ZMQ_POLLIN)) {
            int64_t now = zclock_mono ();
            if (now < deadline)
                continue; //  interrupted
            //  Woken well past the deadline: this process did not run (stopped, starved of
            //  CPU), and the answer may be waiting in libzmq's I/O thread, which did not run
            //  either. It gets a moment: a node that blamed its peer for its own stall would
            //  fence it (actors/cluster.c).
            if (!grace && now - deadline > PEER_LINK_STALL_MS) {
                grace = true;
                deadline = now + PEER_LINK_STALL_MS;
                continue;
            }
            return PEER_LINK_TIMEOUT;
        }
        zmq_msg_t *frames = NULL;
        size_t frame_count = 0;
        Kvpool__V1__Reply *reply = peer_link_recv (self->sock, &frames, &frame_count);
        //  Not ours can only be a late answer to an earlier request of this link: dropped.
        if (reply && reply->request_id == id) {
            *reply_p = reply;
            *frames_p = frames;
            *count_p = frame_count;
            return PEER_LINK_OK;
        }
        peer_link_reply_free (&reply, &frames, frame_count);
    }
}

//  ---- self test ---------------------------------------------------------------------

//  The answer to one request: its id echoed, status OK, the frames it came with after the
//  header. Takes msg (routing id, header, frames).
static void
s_answer (zsock_t *router, zmsg_t **msg_p)
{
    zmsg_t *msg = *msg_p;
    zframe_t *routing_id = zmsg_pop (msg);
    zframe_t *header = zmsg_pop (msg);
    Kvpool__V1__Request *request =
        kvpool__v1__request__unpack (NULL, zframe_size (header), zframe_data (header));
    assert (request && request->version == KVP_PROTOCOL_VERSION);
    Kvpool__V1__Reply reply = KVPOOL__V1__REPLY__INIT;
    reply.version = KVP_PROTOCOL_VERSION;
    reply.request_id = request->request_id;
    zframe_t *packed = zframe_new (NULL, kvpool__v1__reply__get_packed_size (&reply));
    kvpool__v1__reply__pack (&reply, zframe_data (packed));
    zmsg_push (msg, packed);
    zmsg_push (msg, routing_id);
    zmsg_send (msg_p, router);
    kvpool__v1__request__free_unpacked (request, NULL);
    zframe_destroy (&header);
}

//  A fake node: answers each request at once, but holds a REMOVE until the next request
//  comes, then answers both (the held one late, first).
static void
s_fake_node (zsock_t *pipe, void *args)
{
    zsock_t *router = zsock_new_router ((const char *) args);
    assert (router);
    zpoller_t *poller = zpoller_new (pipe, router, NULL);
    zsock_signal (pipe, 0);
    zmsg_t *held = NULL;
    while (true) {
        void *which = zpoller_wait (poller, -1);
        if (which != router)
            break;
        zmsg_t *msg = zmsg_recv (router);
        zframe_t *header = zmsg_next (msg);
        header = zmsg_next (msg);
        Kvpool__V1__Request *request =
            kvpool__v1__request__unpack (NULL, zframe_size (header), zframe_data (header));
        bool hold = request && request->op == KVPOOL__V1__OP__REMOVE;
        kvpool__v1__request__free_unpacked (request, NULL);
        if (hold) {
            zmsg_destroy (&held);
            held = msg;
            continue;
        }
        if (held)
            s_answer (router, &held);
        s_answer (router, &msg);
    }
    zmsg_destroy (&held);
    zpoller_destroy (&poller);
    zsock_destroy (&router);
}

void
peer_link_test (bool verbose)
{
    const char *endpoint = "inproc://peer_link_test";
    zactor_t *node = zactor_new (s_fake_node, (void *) endpoint);
    peer_link_t *link = peer_link_new (endpoint, NULL, NULL, true);
    assert (link && peer_link_sock (link));
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__GET;

    //  Sent from a poller's side: the reply and its frames come back whole.
    zmq_msg_t values[2];
    zmq_msg_init_size (&values[0], 2);
    zmq_msg_init_size (&values[1], 3);
    assert (peer_link_send (link, &request, 42, values, 2) == 0);
    zmq_msg_t *frames;
    size_t count;
    zsock_set_rcvtimeo (peer_link_sock (link), 2000);
    Kvpool__V1__Reply *reply = peer_link_recv (peer_link_sock (link), &frames, &count);
    assert (reply && reply->request_id == 42 && count == 2);
    assert (zmq_msg_size (&frames[0]) == 2 && zmq_msg_size (&frames[1]) == 3);
    peer_link_reply_free (&reply, &frames, count);
    assert (reply == NULL && frames == NULL);

    //  A call answered.
    assert (peer_link_call (link, &request, NULL, 0, 2000, &reply, &frames, &count)
            == PEER_LINK_OK);
    assert (reply && count == 0);
    uint64_t first = reply->request_id;
    peer_link_reply_free (&reply, &frames, count);
    //  A call the node does not answer in time.
    request.op = KVPOOL__V1__OP__REMOVE;
    assert (peer_link_call (link, &request, NULL, 0, 50, &reply, &frames, &count)
            == PEER_LINK_TIMEOUT);
    assert (!reply && !frames && count == 0);
    //  The next call: the late answer to the one before comes first, and is dropped.
    request.op = KVPOOL__V1__OP__GET;
    assert (peer_link_call (link, &request, NULL, 0, 2000, &reply, &frames, &count)
            == PEER_LINK_OK);
    assert (reply->request_id == first + 2);
    peer_link_reply_free (&reply, &frames, count);

    //  Reconnected after a timeout: calls go on, on a new connection.
    assert (peer_link_reconnect (link) == 0);
    assert (peer_link_call (link, &request, NULL, 0, 2000, &reply, &frames, &count)
            == PEER_LINK_OK);
    peer_link_reply_free (&reply, &frames, count);
    assert (zclock_mono () - peer_link_last_used (link) < 2000);
    peer_link_destroy (&link);
    assert (link == NULL);
    peer_link_destroy (&link);
    //  An endpoint libzmq cannot connect to: no link.
    assert (peer_link_new ("nonsense", NULL, NULL, true) == NULL);
    zactor_destroy (&node);
    if (verbose)
        printf ("peer_link ok ");
}
