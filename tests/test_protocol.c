/*  test_protocol.c - integration test of kvpoold's client protocol with raw ZeroMQ frames.

    Starts the real daemon on an ephemeral loopback port and speaks protocol/kvpool.proto to
    it directly (no client library), so it checks exactly what any-language clients see:
    every operation and status, no dirty reads, leases, replicas on distinct segments, the
    discard timeout, a full pool, bad input of every kind (after which the server must still
    serve), several processes writing and reading at once, and shutdown with requests in
    flight.
*/
#include <czmq.h>
#include <signal.h>
#include <sys/wait.h>

#include "kvpool.h"
#include "protocol/kvpool.pb-c.h"
#include "tests/testutil.h"

static uint64_t s_next_id = 1;

typedef struct {
    Kvpool__V1__Reply *reply;
    zmsg_t *frames; //  the value frames after the header
} result_t;

static void
s_result_free (result_t *result)
{
    if (result->reply)
        kvpool__v1__reply__free_unpacked (result->reply, NULL);
    zmsg_destroy (&result->frames);
}

//  Sends a request with optional value frames and waits for its reply (5 s).
static result_t
s_call (zsock_t *sock, Kvpool__V1__Request *request, const char **values, const size_t *sizes,
        size_t nvalues)
{
    request->request_id = s_next_id++;
    if (request->version == 0)
        request->version = 1;
    zmsg_t *msg = zmsg_new ();
    size_t len = kvpool__v1__request__get_packed_size (request);
    uint8_t *buf = (uint8_t *) malloc (len ? len : 1);
    kvpool__v1__request__pack (request, buf);
    zmsg_addmem (msg, buf, len);
    free (buf);
    for (size_t i = 0; i < nvalues; i++)
        zmsg_addmem (msg, values[i], sizes ? sizes[i] : strlen (values[i]));
    CHECK (zmsg_send (&msg, sock) == 0);
    result_t result = {NULL, NULL};
    zsock_set_rcvtimeo (sock, 5000);
    while (true) {
        zmsg_t *reply = zmsg_recv (sock);
        CHECK (reply != NULL);
        zframe_t *header = zmsg_pop (reply);
        result.reply = kvpool__v1__reply__unpack (NULL, zframe_size (header), zframe_data (header));
        zframe_destroy (&header);
        CHECK (result.reply != NULL);
        if (result.reply->request_id == request->request_id) {
            result.frames = reply;
            break;
        }
        kvpool__v1__reply__free_unpacked (result.reply, NULL);
        zmsg_destroy (&reply);
    }
    return result;
}

//  Requests carry keys as bytes: the wire forms of the last request's keys live here.
static ProtobufCBinaryData *s_wire;
static size_t s_wire_size;

static Kvpool__V1__Request
s_request (Kvpool__V1__Op op, char **keys, size_t n)
{
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    if (n > s_wire_size) {
        free (s_wire);
        s_wire = (ProtobufCBinaryData *) malloc (n * sizeof *s_wire);
        s_wire_size = n;
        assert (s_wire);
    }
    for (size_t i = 0; i < n; i++)
        s_wire[i] = (ProtobufCBinaryData){strlen (keys[i]), (uint8_t *) keys[i]};
    request.op = op;
    request.keys = n ? s_wire : NULL;
    request.n_keys = n;
    return request;
}

//  One-key helpers returning the key's status.
static int
s_put_pinned (zsock_t *sock, const char *key, const char *value, size_t size, uint32_t replicas,
              bool hard_pin)
{
    char *keys[] = {(char *) key};
    Kvpool__V1__Request request = s_request (KVPOOL__V1__OP__PUT, keys, 1);
    Kvpool__V1__PutOptions put = KVPOOL__V1__PUT_OPTIONS__INIT;
    put.replica_num = replicas;
    put.hard_pin = hard_pin;
    request.put = &put;
    const char *values[] = {value};
    result_t r = s_call (sock, &request, values, &size, 1);
    int status = r.reply->status ? r.reply->status : r.reply->statuses[0];
    s_result_free (&r);
    return status;
}

static int
s_put (zsock_t *sock, const char *key, const char *value, size_t size, uint32_t replicas)
{
    return s_put_pinned (sock, key, value, size, replicas, false);
}

static int
s_key_op (zsock_t *sock, Kvpool__V1__Op op, const char *key, bool force)
{
    char *keys[] = {(char *) key};
    Kvpool__V1__Request request = s_request (op, keys, 1);
    request.force = force;
    result_t r = s_call (sock, &request, NULL, NULL, 0);
    int status = r.reply->status ? r.reply->status : r.reply->statuses[0];
    s_result_free (&r);
    return status;
}

//  GET one key: returns its status; on OK the value is copied into *value_p (caller frees).
static int
s_get (zsock_t *sock, const char *key, char **value_p, size_t *size_p)
{
    char *keys[] = {(char *) key};
    Kvpool__V1__Request request = s_request (KVPOOL__V1__OP__GET, keys, 1);
    result_t r = s_call (sock, &request, NULL, NULL, 0);
    int status = r.reply->status ? r.reply->status : r.reply->statuses[0];
    if (status == 0) {
        CHECK_EQ (zmsg_size (r.frames), 1);
        zframe_t *frame = zmsg_first (r.frames);
        CHECK_EQ (zframe_size (frame), r.reply->sizes[0]);
        *size_p = zframe_size (frame);
        *value_p = (char *) malloc (*size_p + 1);
        memcpy (*value_p, zframe_data (frame), *size_p);
    }
    s_result_free (&r);
    return status;
}

static uint64_t
s_count_op (zsock_t *sock, Kvpool__V1__Op op, const char *pattern, bool force, int *status_p)
{
    Kvpool__V1__Request request = s_request (op, NULL, 0);
    request.pattern = (char *) (pattern ? pattern : "");
    request.force = force;
    result_t r = s_call (sock, &request, NULL, NULL, 0);
    uint64_t count = r.reply->count;
    if (status_p)
        *status_p = r.reply->status;
    s_result_free (&r);
    return count;
}

static Kvpool__V1__Stats
s_stats (zsock_t *sock)
{
    Kvpool__V1__Request request = s_request (KVPOOL__V1__OP__STATS, NULL, 0);
    result_t r = s_call (sock, &request, NULL, NULL, 0);
    CHECK (r.reply->stats != NULL);
    Kvpool__V1__Stats stats = *r.reply->stats;
    s_result_free (&r);
    return stats;
}

static zsock_t *
s_connect (testutil_server_t *server)
{
    zsock_t *sock = zsock_new (ZMQ_DEALER);
    zsock_set_linger (sock, 0);
    CHECK (zsock_connect (sock, "%s", server->endpoint) == 0);
    return sock;
}

//  A socket on the node's ipc endpoint, where the shared-memory operations are served.
static zsock_t *
s_connect_local (testutil_server_t *server)
{
    CHECK (server->ipc_endpoint[0]);
    zsock_t *sock = zsock_new (ZMQ_DEALER);
    zsock_set_linger (sock, 0);
    CHECK (zsock_connect (sock, "%s", server->ipc_endpoint) == 0);
    return sock;
}

//  ---- the tests -----------------------------------------------------------------------

static void
test_operations (testutil_server_t *server)
{
    zsock_t *sock = s_connect (server);
    char *value = NULL;
    size_t size = 0;

    CHECK_EQ (s_put (sock, "alpha", "first", 5, 1), KVPOOL_OK);
    //  Immutable: a second put is refused and the first value kept.
    CHECK_EQ (s_put (sock, "alpha", "second", 6, 1), KVPOOL_OBJECT_ALREADY_EXISTS);
    CHECK_EQ (s_get (sock, "alpha", &value, &size), KVPOOL_OK);
    CHECK (size == 5 && memcmp (value, "first", 5) == 0);
    free (value);
    CHECK_EQ (s_get (sock, "nope", &value, &size), KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__EXIST, "alpha", false), KVPOOL_OK);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__EXIST, "nope", false), KVPOOL_OBJECT_NOT_FOUND);

    //  GET_SIZE and a batch with a status per key, values in key order.
    char *keys[] = {"alpha", "nope", "alpha"};
    Kvpool__V1__Request request = s_request (KVPOOL__V1__OP__GET_SIZE, keys, 3);
    result_t r = s_call (sock, &request, NULL, NULL, 0);
    CHECK_EQ (r.reply->n_statuses, 3);
    CHECK_EQ (r.reply->statuses[1], KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (r.reply->sizes[0], 5);
    s_result_free (&r);
    request = s_request (KVPOOL__V1__OP__GET, keys, 3);
    r = s_call (sock, &request, NULL, NULL, 0);
    CHECK_EQ (zmsg_size (r.frames), 3);
    CHECK (zframe_streq (zmsg_first (r.frames), "first"));
    CHECK_EQ (zframe_size (zmsg_next (r.frames)), 0);
    CHECK (zframe_streq (zmsg_next (r.frames), "first"));
    s_result_free (&r);

    //  A large value (zero-copy path) comes back byte for byte.
    size_t big = 3 << 20;
    char *data = (char *) malloc (big);
    for (size_t i = 0; i < big; i++)
        data[i] = (char) (i * 31 + 7);
    CHECK_EQ (s_put (sock, "big", data, big, 1), KVPOOL_OK);
    CHECK_EQ (s_get (sock, "big", &value, &size), KVPOOL_OK);
    CHECK (size == big && memcmp (value, data, big) == 0);
    free (value);
    //  A small value is answered from the read index by the api itself, a large one by the
    //  replica-manager (zero-copy): index_gets counts only the first, gets both.
    Kvpool__V1__Stats before = s_stats (sock);
    CHECK_EQ (s_get (sock, "alpha", &value, &size), KVPOOL_OK);
    free (value);
    Kvpool__V1__Stats after = s_stats (sock);
    CHECK_EQ (after.index_gets, before.index_gets + 1);
    CHECK_EQ (after.gets, before.gets + 1);
    CHECK_EQ (s_get (sock, "big", &value, &size), KVPOOL_OK);
    free (value);
    before = after;
    after = s_stats (sock);
    CHECK_EQ (after.index_gets, before.index_gets);
    CHECK_EQ (after.gets, before.gets + 1);
    //  An empty value is a value.
    CHECK_EQ (s_put (sock, "empty", "", 0, 1), KVPOOL_OK);
    CHECK_EQ (s_get (sock, "empty", &value, &size), KVPOOL_OK);
    CHECK_EQ (size, 0);
    free (value);

    //  Remove: leased objects need force (the GETs above leased them).
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__REMOVE, "alpha", false), KVPOOL_OBJECT_HAS_LEASE);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__REMOVE, "alpha", true), KVPOOL_OK);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__EXIST, "alpha", false), KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__REMOVE, "alpha", true), KVPOOL_OBJECT_NOT_FOUND);
    //  The key is free again.
    CHECK_EQ (s_put (sock, "alpha", "third", 5, 1), KVPOOL_OK);

    //  Regex: leased objects are skipped unless forced; the count says what went.
    CHECK_EQ (s_put (sock, "re/1", "x", 1, 1), KVPOOL_OK);
    CHECK_EQ (s_put (sock, "re/2", "x", 1, 1), KVPOOL_OK);
    CHECK_EQ (s_put (sock, "re/3", "x", 1, 1), KVPOOL_OK);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__EXIST, "re/3", false), KVPOOL_OK); //  lease
    int status;
    CHECK_EQ (s_count_op (sock, KVPOOL__V1__OP__REMOVE_BY_REGEX, "^re/", false, &status), 2);
    CHECK_EQ (status, KVPOOL_OK);
    CHECK_EQ (s_count_op (sock, KVPOOL__V1__OP__REMOVE_BY_REGEX, "^re/", true, &status), 1);
    s_count_op (sock, KVPOOL__V1__OP__REMOVE_BY_REGEX, "([", true, &status);
    CHECK_EQ (status, KVPOOL_INVALID_PARAMS);

    //  TOUCH (a same-machine reader's lease renewal) leases like a read; an absent key is
    //  OBJECT_NOT_FOUND. A put alone leases nothing, so only the touch stops the remove.
    CHECK_EQ (s_put (sock, "touched", "t", 1, 1), KVPOOL_OK);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__TOUCH, "touched", false), KVPOOL_OK);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__TOUCH, "never-put", false), KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__REMOVE, "touched", false), KVPOOL_OBJECT_HAS_LEASE);
    CHECK_EQ (s_put (sock, "untouched", "u", 1, 1), KVPOOL_OK);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__REMOVE, "untouched", false), KVPOOL_OK);

    //  Remove-all: leased ones stay without force.
    Kvpool__V1__Stats stats = s_stats (sock);
    CHECK (stats.objects >= 3);
    uint64_t removed = s_count_op (sock, KVPOOL__V1__OP__REMOVE_ALL, NULL, false, &status);
    CHECK (removed < stats.objects);
    removed += s_count_op (sock, KVPOOL__V1__OP__REMOVE_ALL, NULL, true, &status);
    CHECK_EQ (removed, stats.objects);
    stats = s_stats (sock);
    CHECK_EQ (stats.objects, 0);
    CHECK_EQ (stats.bytes_stored, 0);

    //  PING answers with the host id.
    request = s_request (KVPOOL__V1__OP__PING, NULL, 0);
    r = s_call (sock, &request, NULL, NULL, 0);
    CHECK (r.reply->status == 0 && strlen (r.reply->host_id) > 0);
    s_result_free (&r);
    free (data);
    zsock_destroy (&sock);
}

static void
test_two_phase (testutil_server_t *server)
{
    char *keys[] = {"tp/a", "tp/b"};
    uint64_t sizes[] = {4096, 100};
    Kvpool__V1__Request request = s_request (KVPOOL__V1__OP__PUT_START, keys, 2);
    request.sizes = sizes;
    request.n_sizes = 2;
    //  Over tcp the node cannot tell who is asking: the shared-memory operations are refused.
    zsock_t *remote = s_connect (server);
    result_t r = s_call (remote, &request, NULL, NULL, 0);
    CHECK_EQ (r.reply->status, KVPOOL_PERMISSION_DENIED);
    CHECK (strstr (r.reply->error, "ipc endpoint"));
    s_result_free (&r);
    CHECK_EQ (s_key_op (remote, KVPOOL__V1__OP__PUT_END, "tp/a", false), KVPOOL_PERMISSION_DENIED);
    CHECK_EQ (s_key_op (remote, KVPOOL__V1__OP__RELEASE, "tp/a", false), KVPOOL_PERMISSION_DENIED);
    zsock_destroy (&remote);

    zsock_t *sock = s_connect_local (server);
    r = s_call (sock, &request, NULL, NULL, 0);
    CHECK_EQ (r.reply->status, 0);
    CHECK_EQ (r.reply->statuses[0], 0);
    CHECK_EQ (r.reply->n_replicas, 2);
    CHECK_EQ (r.reply->replicas[0]->n_replicas, 1);
    s_result_free (&r);

    //  No dirty reads: invisible between put-start and put-end, and not writable twice.
    char *value;
    size_t size;
    CHECK_EQ (s_get (sock, "tp/a", &value, &size), KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__EXIST, "tp/a", false), KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (s_put (sock, "tp/a", "x", 1, 1), KVPOOL_OBJECT_ALREADY_EXISTS);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__PUT_END, "tp/a", false), KVPOOL_OK);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__EXIST, "tp/a", false), KVPOOL_OK);
    CHECK_EQ (s_get (sock, "tp/a", &value, &size), KVPOOL_OK);
    CHECK_EQ (size, 4096);
    free (value);
    //  Revoke frees the reservation; ending or revoking twice is an error.
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__PUT_REVOKE, "tp/b", false), KVPOOL_OK);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__PUT_END, "tp/b", false), KVPOOL_INVALID_WRITE);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__PUT_END, "tp/a", false), KVPOOL_INVALID_WRITE);

    //  GET_REPLICA_LIST with pin, then RELEASE; releasing again is an error.
    request = s_request (KVPOOL__V1__OP__GET_REPLICA_LIST, keys, 1);
    request.pin = true;
    r = s_call (sock, &request, NULL, NULL, 0);
    CHECK_EQ (r.reply->statuses[0], 0);
    CHECK_EQ (r.reply->sizes[0], 4096);
    CHECK_EQ (r.reply->replicas[0]->n_replicas, 1);
    s_result_free (&r);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__RELEASE, "tp/a", false), KVPOOL_OK);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__RELEASE, "tp/a", false), KVPOOL_INVALID_READ);
    zsock_destroy (&sock);
}

static void
test_bad_input (testutil_server_t *server)
{
    zsock_t *sock = s_connect (server);
    Kvpool__V1__Stats before = s_stats (sock);

    //  Garbage in frame 0: PROTOCOL_ERROR.
    zstr_send (sock, "\xff\xff\xff garbage");
    zmsg_t *msg = zmsg_recv (sock);
    CHECK (msg != NULL);
    zframe_t *frame = zmsg_first (msg);
    Kvpool__V1__Reply *reply =
        kvpool__v1__reply__unpack (NULL, zframe_size (frame), zframe_data (frame));
    CHECK (reply && reply->status == KVPOOL_PROTOCOL_ERROR && strlen (reply->error) > 0);
    kvpool__v1__reply__free_unpacked (reply, NULL);
    zmsg_destroy (&msg);

    //  Truncated multipart: a PUT of two keys with one value frame.
    char *keys2[] = {"bad/1", "bad/2"};
    Kvpool__V1__Request request = s_request (KVPOOL__V1__OP__PUT, keys2, 2);
    const char *one[] = {"v"};
    result_t r = s_call (sock, &request, one, NULL, 1);
    CHECK_EQ (r.reply->status, KVPOOL_INVALID_PARAMS);
    s_result_free (&r);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__EXIST, "bad/1", false), KVPOOL_OBJECT_NOT_FOUND);

    //  A key with a NUL byte is INVALID_KEY, never stored cut short at the NUL.
    {
        char *nul[] = {"nul"};
        request = s_request (KVPOOL__V1__OP__PUT, nul, 1);
        s_wire[0].len = 8;
        s_wire[0].data = (uint8_t *) "nul\0tail";
        r = s_call (sock, &request, one, NULL, 1);
        CHECK_EQ (r.reply->statuses[0], KVPOOL_INVALID_KEY);
        s_result_free (&r);
        CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__EXIST, "nul", false), KVPOOL_OBJECT_NOT_FOUND);
        //  Any other byte is a key byte.
        CHECK_EQ (s_put (sock, "k\xff\x01\t", "v", 1, 1), KVPOOL_OK);
        CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__EXIST, "k\xff\x01\t", false), KVPOOL_OK);
    }

    //  Values on a GET.
    request = s_request (KVPOOL__V1__OP__GET, keys2, 1);
    r = s_call (sock, &request, one, NULL, 1);
    CHECK_EQ (r.reply->status, KVPOOL_INVALID_PARAMS);
    s_result_free (&r);

    //  Unknown operation, wrong version, no keys.
    request = s_request ((Kvpool__V1__Op) 999, keys2, 1);
    r = s_call (sock, &request, NULL, NULL, 0);
    CHECK_EQ (r.reply->status, KVPOOL_UNKNOWN_OPERATION);
    s_result_free (&r);
    request = s_request (KVPOOL__V1__OP__EXIST, keys2, 1);
    request.version = 2;
    r = s_call (sock, &request, NULL, NULL, 0);
    CHECK_EQ (r.reply->status, KVPOOL_INVALID_VERSION);
    s_result_free (&r);
    request = s_request (KVPOOL__V1__OP__EXIST, NULL, 0);
    r = s_call (sock, &request, NULL, NULL, 0);
    CHECK_EQ (r.reply->status, KVPOOL_INVALID_PARAMS);
    s_result_free (&r);

    //  Too many keys in one request.
    {
        size_t many = 262145;
        char **keys = (char **) malloc (many * sizeof (char *));
        for (size_t i = 0; i < many; i++)
            keys[i] = "k";
        request = s_request (KVPOOL__V1__OP__EXIST, keys, many);
        r = s_call (sock, &request, NULL, NULL, 0);
        CHECK_EQ (r.reply->status, KVPOOL_INVALID_PARAMS);
        CHECK (strstr (r.reply->error, "keys"));
        s_result_free (&r);
        free (keys);
    }

    //  Empty and too-long keys, per key, next to a good one.
    char longkey[5000];
    memset (longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    char *mixed[] = {"", longkey, "bad/ok"};
    request = s_request (KVPOOL__V1__OP__PUT, mixed, 3);
    const char *three[] = {"a", "b", "c"};
    r = s_call (sock, &request, three, NULL, 3);
    CHECK_EQ (r.reply->status, 0);
    CHECK_EQ (r.reply->statuses[0], KVPOOL_INVALID_KEY);
    CHECK_EQ (r.reply->statuses[1], KVPOOL_INVALID_KEY);
    CHECK_EQ (r.reply->statuses[2], KVPOOL_OK);
    s_result_free (&r);

    //  Oversized value (the daemon runs with --max-value-size 4MiB).
    size_t huge = (4 << 20) + 1;
    char *data = (char *) zmalloc (huge);
    CHECK_EQ (s_put (sock, "bad/huge", data, huge, 1), KVPOOL_VALUE_TOO_LARGE);
    free (data);
    //  A frame far over the limit (4 MiB + 64 MiB of slack) is not even read: the node drops
    //  the connection instead of buffering it, and keeps serving everyone else.
    {
        zsock_t *greedy = s_connect (server);
        size_t enormous = 70u << 20;
        char *blob = (char *) zmalloc (enormous);
        char *keys1[] = {"bad/enormous"};
        Kvpool__V1__Request put = s_request (KVPOOL__V1__OP__PUT, keys1, 1);
        put.version = 1;
        put.request_id = 424242;
        uint8_t buf[128];
        size_t len = kvpool__v1__request__pack (&put, buf);
        zsock_send (greedy, "bb", buf, len, blob, enormous);
        free (blob);
        zsock_set_rcvtimeo (greedy, 1000);
        zmsg_t *none = zmsg_recv (greedy);
        CHECK (none == NULL);
        zsock_destroy (&greedy);
        CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__EXIST, "bad/enormous", false),
                  KVPOOL_OBJECT_NOT_FOUND);
    }
    //  Too many replicas: past the most a placement describes, refused; more than the
    //  segments, one a segment, and the reply says how many each key got.
    CHECK_EQ (s_put (sock, "bad/replicas", "x", 1, 9), KVPOOL_INVALID_REPLICA);
    {
        char *keys[] = {"few/replicas"};
        Kvpool__V1__Request request = s_request (KVPOOL__V1__OP__PUT, keys, 1);
        Kvpool__V1__PutOptions put = KVPOOL__V1__PUT_OPTIONS__INIT;
        put.replica_num = 4;
        request.put = &put;
        const char *values[] = {"x"};
        size_t one = 1;
        result_t r = s_call (sock, &request, values, &one, 1);
        CHECK_EQ (r.reply->statuses[0], KVPOOL_OK);
        CHECK_EQ (r.reply->n_replicas_placed, 1);
        CHECK_EQ (r.reply->replicas_placed[0], 3);
        s_result_free (&r);
        CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__REMOVE, "few/replicas", true), KVPOOL_OK);
    }

    //  An empty message decodes as an empty Request (version 0): answered, not dropped.
    zmq_send (zsock_resolve (sock), "", 0, 0);
    msg = zmsg_recv (sock);
    CHECK (msg != NULL);
    frame = zmsg_first (msg);
    reply = kvpool__v1__reply__unpack (NULL, zframe_size (frame), zframe_data (frame));
    CHECK (reply && reply->status == KVPOOL_INVALID_VERSION);
    kvpool__v1__reply__free_unpacked (reply, NULL);
    zmsg_destroy (&msg);

    //  A REQ client works too (the empty delimiter is handled).
    zsock_t *req = zsock_new (ZMQ_REQ);
    zsock_set_linger (req, 0);
    zsock_connect (req, "%s", server->endpoint);
    char *keys1[] = {"bad/ok"};
    request = s_request (KVPOOL__V1__OP__EXIST, keys1, 1);
    r = s_call (req, &request, NULL, NULL, 0);
    CHECK_EQ (r.reply->statuses[0], KVPOOL_OK);
    s_result_free (&r);
    zsock_destroy (&req);

    //  The server still serves, and counted the problems.
    CHECK_EQ (s_put (sock, "bad/after", "fine", 4, 1), KVPOOL_OK);
    Kvpool__V1__Stats after = s_stats (sock);
    CHECK (after.errors >= before.errors + 7);
    CHECK_EQ (after.dropped_requests, before.dropped_requests);
    zsock_destroy (&sock);
}

//  TOUCH's `reads` is counted as gets, within a bound: a client cannot wrap the counters.
static void
test_touch_reads (testutil_server_t *server)
{
    zsock_t *sock = s_connect (server);
    CHECK_EQ (s_put (sock, "touch/a", "x", 1, 1), KVPOOL_OK);
    uint64_t gets = s_stats (sock).gets;
    char *keys[] = {"touch/a"};
    Kvpool__V1__Request touch = s_request (KVPOOL__V1__OP__TOUCH, keys, 1);
    touch.reads = 5;
    result_t r = s_call (sock, &touch, NULL, NULL, 0);
    CHECK_EQ (r.reply->status, KVPOOL_OK);
    s_result_free (&r);
    CHECK_EQ (s_stats (sock).gets, gets + 5);
    touch.reads = UINT64_MAX - 2;
    r = s_call (sock, &touch, NULL, NULL, 0);
    CHECK_EQ (r.reply->status, KVPOOL_INVALID_PARAMS);
    CHECK (r.reply->error && strstr (r.reply->error, "per TOUCH"));
    s_result_free (&r);
    touch.reads = (1 << 20) + 1;
    touch.n_keys = 0; //  a TOUCH may carry only the count
    r = s_call (sock, &touch, NULL, NULL, 0);
    CHECK_EQ (r.reply->status, KVPOOL_INVALID_PARAMS);
    s_result_free (&r);
    CHECK_EQ (s_stats (sock).gets, gets + 5);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__REMOVE, "touch/a", true), KVPOOL_OK);
    zsock_destroy (&sock);
}

static void
test_replicas_and_full (testutil_server_t *server)
{
    zsock_t *sock = s_connect_local (server);
    //  Three replicas land on three distinct segments (the daemon has 3).
    CHECK_EQ (s_put (sock, "rep/a", "replicated", 10, 3), KVPOOL_OK);
    char *keys[] = {"rep/a"};
    Kvpool__V1__Request request = s_request (KVPOOL__V1__OP__GET_REPLICA_LIST, keys, 1);
    result_t r = s_call (sock, &request, NULL, NULL, 0);
    CHECK_EQ (r.reply->replicas[0]->n_replicas, 3);
    uint32_t s0 = r.reply->replicas[0]->replicas[0]->segment_id;
    uint32_t s1 = r.reply->replicas[0]->replicas[1]->segment_id;
    uint32_t s2 = r.reply->replicas[0]->replicas[2]->segment_id;
    CHECK (s0 != s1 && s1 != s2 && s0 != s2);
    s_result_free (&r);
    Kvpool__V1__Stats stats = s_stats (sock);
    CHECK_EQ (stats.segments, 3);
    CHECK (stats.bytes_stored >= 30);

    //  Fill the pool with values the evictor may not take (hard-pinned): 3 x 16 MiB of 1 MiB
    //  values ends in NO_AVAILABLE_HANDLE.
    size_t mib = 1 << 20;
    char *data = (char *) zmalloc (mib);
    int ok = 0, full = 0;
    for (int i = 0; i < 60 && full == 0; i++) {
        char key[32];
        snprintf (key, sizeof key, "full/%d", i);
        int status = s_put_pinned (sock, key, data, mib, 1, true);
        ok += status == KVPOOL_OK;
        full += status == KVPOOL_NO_AVAILABLE_HANDLE;
    }
    CHECK (full == 1 && ok >= 40);
    //  A full pool says why: the key's status is NO_AVAILABLE_HANDLE, the reply's error
    //  names the size and the free space (the request itself is OK).
    char *full_key[] = {"full/over"};
    Kvpool__V1__Request over = s_request (KVPOOL__V1__OP__PUT, full_key, 1);
    const char *over_value[] = {data};
    r = s_call (sock, &over, over_value, &mib, 1);
    CHECK_EQ (r.reply->status, KVPOOL_OK);
    CHECK_EQ (r.reply->statuses[0], KVPOOL_NO_AVAILABLE_HANDLE);
    CHECK (r.reply->error && strstr (r.reply->error, "no segment has room for 1048576 bytes"));
    CHECK (strstr (r.reply->error, "in 3 segment(s)"));
    s_result_free (&r);
    stats = s_stats (sock);
    CHECK (stats.utilisation > 0.8);
    //  Freeing makes room again.
    s_count_op (sock, KVPOOL__V1__OP__REMOVE_BY_REGEX, "^full/", true, NULL);
    CHECK_EQ (s_put (sock, "full/again", data, mib, 1), KVPOOL_OK);
    free (data);
    zsock_destroy (&sock);
}

static void
test_discard_timeout (testutil_server_t *server)
{
    //  The daemon runs with --put-timeout 300: an uncommitted put-start is revoked.
    zsock_t *sock = s_connect_local (server);
    char *keys[] = {"dt/a"};
    uint64_t sizes[] = {1000};
    Kvpool__V1__Request request = s_request (KVPOOL__V1__OP__PUT_START, keys, 1);
    request.sizes = sizes;
    request.n_sizes = 1;
    result_t r = s_call (sock, &request, NULL, NULL, 0);
    CHECK_EQ (r.reply->statuses[0], 0);
    s_result_free (&r);
    Kvpool__V1__Stats stats = s_stats (sock);
    CHECK_EQ (stats.pending_puts, 1);
    uint64_t revoked = stats.revoked_puts;
    zclock_sleep (600);
    stats = s_stats (sock);
    CHECK_EQ (stats.pending_puts, 0);
    CHECK_EQ (stats.revoked_puts, revoked + 1);
    CHECK_EQ (s_key_op (sock, KVPOOL__V1__OP__PUT_END, "dt/a", false), KVPOOL_INVALID_WRITE);
    //  ... and the key can be written again.
    CHECK_EQ (s_put (sock, "dt/a", "x", 1, 1), KVPOOL_OK);
    zsock_destroy (&sock);
}

//  Each child process puts and reads back its own values; all are checked byte for byte.
static void
s_worker (testutil_server_t *server, int id)
{
    zsock_t *sock = s_connect (server);
    for (int i = 0; i < 100; i++) {
        char key[64];
        snprintf (key, sizeof key, "conc/%d/%d", id, i);
        size_t size = 1 + (size_t) ((i * 7919 + id * 104729) % (64 * 1024));
        char *data = (char *) malloc (size);
        for (size_t b = 0; b < size; b++)
            data[b] = (char) (b * 13 + i + id);
        CHECK_EQ (s_put (sock, key, data, size, 1 + i % 2), KVPOOL_OK);
        char *back;
        size_t back_size;
        CHECK_EQ (s_get (sock, key, &back, &back_size), KVPOOL_OK);
        CHECK (back_size == size && memcmp (back, data, size) == 0);
        free (back);
        free (data);
    }
    zsock_destroy (&sock);
}

//  The workers are fresh processes (exec), since a ZeroMQ context does not survive fork.
static void
test_concurrent (testutil_server_t *server, const char *argv0)
{
    pid_t children[4];
    for (int c = 0; c < 4; c++) {
        char id[16];
        snprintf (id, sizeof id, "%d", c);
        const char *args[] = {"--worker", id, server->endpoint, NULL};
        CHECK ((children[c] = testutil_spawn (argv0, args)) > 0);
    }
    CHECK_EQ (testutil_wait_all (children, 4), 0);
    zsock_t *sock = s_connect (server);
    //  Every value is still there and whole after the storm.
    char *value;
    size_t size;
    CHECK_EQ (s_get (sock, "conc/3/99", &value, &size), KVPOOL_OK);
    free (value);
    zsock_destroy (&sock);
}

//  SIGTERM while clients are busy: the daemon answers what it took in and exits 0.
static void
test_shutdown_in_flight (void)
{
    testutil_server_t server;
    const char *args[] = {"--segment-size", "64MiB", NULL};
    CHECK (testutil_server_start (&server, args) == 0);
    zsock_t *sock = s_connect (&server);
    size_t size = 256 * 1024;
    char *data = (char *) zmalloc (size);
    //  Fire 50 puts without waiting, then stop the server.
    for (int i = 0; i < 50; i++) {
        char key[32];
        snprintf (key, sizeof key, "sd/%d", i);
        char *keys[] = {key};
        Kvpool__V1__Request request = s_request (KVPOOL__V1__OP__PUT, keys, 1);
        request.version = 1;
        request.request_id = 1000 + i;
        uint8_t buf[128];
        size_t len = kvpool__v1__request__pack (&request, buf);
        zsock_send (sock, "bb", buf, len, data, size);
    }
    zclock_sleep (20);
    CHECK_EQ (testutil_server_stop (&server, SIGTERM), 0);
    //  Every reply that arrived is a complete, valid reply.
    zsock_set_rcvtimeo (sock, 100);
    zmsg_t *msg;
    int replies = 0;
    while ((msg = zmsg_recv (sock))) {
        zframe_t *frame = zmsg_first (msg);
        Kvpool__V1__Reply *reply =
            kvpool__v1__reply__unpack (NULL, zframe_size (frame), zframe_data (frame));
        CHECK (reply
               && (reply->status == 0 || reply->status == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS));
        kvpool__v1__reply__free_unpacked (reply, NULL);
        zmsg_destroy (&msg);
        replies++;
    }
    printf ("shutdown: %d of 50 puts answered before exit\n", replies);
    free (data);
    zsock_destroy (&sock);
}

int
main (int argc, char **argv)
{
    zsys_handler_set (NULL);
    if (argc == 4 && streq (argv[1], "--worker")) {
        testutil_server_t server;
        memset (&server, 0, sizeof server);
        snprintf (server.endpoint, sizeof server.endpoint, "%s", argv[3]);
        s_worker (&server, atoi (argv[2]));
        zsys_shutdown ();
        return 0;
    }
    const char *argv0 = argv[0];
    testutil_server_t server;
    const char *args[] = {"--segments",
                          "3",
                          "--segment-size",
                          "16MiB",
                          "--put-timeout",
                          "300",
                          "--max-value-size",
                          "4MiB",
                          "--lease-ttl",
                          "2000",
                          NULL};
    CHECK (testutil_server_start (&server, args) == 0);
    test_operations (&server);
    printf ("operations: ok\n");
    test_two_phase (&server);
    printf ("two-phase put and replica lists: ok\n");
    test_bad_input (&server);
    printf ("bad input: ok\n");
    test_discard_timeout (&server);
    printf ("discard timeout: ok\n");
    test_touch_reads (&server);
    printf ("touch reads: ok\n");
    test_replicas_and_full (&server);
    printf ("replicas and full pool: ok\n");
    zsock_t *sock = s_connect (&server);
    s_count_op (sock, KVPOOL__V1__OP__REMOVE_ALL, NULL, true, NULL);
    zsock_destroy (&sock);
    test_concurrent (&server, argv0);
    printf ("concurrent clients: ok\n");
    CHECK_EQ (testutil_server_stop (&server, SIGTERM), 0);
    test_shutdown_in_flight ();
    printf ("shutdown in flight: ok\n");
    zsys_shutdown ();
    return 0;
}
