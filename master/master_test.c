/*  master_test.c - the master actor's self test (master.h): a master on inproc and a DEALER
    speaking kvpool.cluster.v1 to it as nodes do: registration, placement, commits and their
    tokens, versions, cache holders, locates, removes, fencing, liveness.
*/
#include "master/master.h"

#include <assert.h>
#include <string.h>

#include "infra/config.h"
#include "kvpool_status.h"
#include "protocol/cluster.pb-c.h"
#include "protocol/contract.h"

static Kvpool__Cluster__V1__MasterReply *
s_call (zsock_t *dealer, Kvpool__Cluster__V1__NodeRequest *request)
{
    size_t size = kvpool__cluster__v1__node_request__get_packed_size (request);
    zframe_t *frame = zframe_new (NULL, size);
    kvpool__cluster__v1__node_request__pack (request, zframe_data (frame));
    zframe_send (&frame, dealer, 0);
    frame = zframe_recv (dealer);
    assert (frame);
    Kvpool__Cluster__V1__MasterReply *reply =
        kvpool__cluster__v1__master_reply__unpack (NULL, zframe_size (frame), zframe_data (frame));
    zframe_destroy (&frame);
    assert (reply);
    return reply;
}

void
master_test (bool verbose)
{
    kvp_config_t config;
    kvp_config_defaults (&config);
    config.master = "inproc://master-test";
    config.node_ttl_ms = 300;
    zactor_t *master = zactor_new (master_actor, &config);
    zsock_t *dealer = zsock_new_dealer ("inproc://master-test");
    zsock_set_rcvtimeo (dealer, 2000);

    Kvpool__Cluster__V1__Node node = KVPOOL__CLUSTER__V1__NODE__INIT;
    node.node_id = "n1";
    node.host_id = "h1";
    node.client_endpoint = "tcp://127.0.0.1:1";
    node.peer_endpoint = "tcp://127.0.0.1:2";
    node.capacity = node.free = 1 << 20;
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.version = 1;
    request.node = &node;
    request.kind = KVPOOL__CLUSTER__V1__KIND__REGISTER;
    Kvpool__Cluster__V1__MasterReply *reply = s_call (dealer, &request);
    assert (reply->status == 0 && reply->epoch && reply->registration);
    uint64_t epoch = reply->epoch;
    request.registration = reply->registration;
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    //  A heartbeat with a wrong epoch is told to register.
    request.kind = KVPOOL__CLUSTER__V1__KIND__HEARTBEAT;
    request.epoch = epoch + 1;
    reply = s_call (dealer, &request);
    assert (reply->status == KVPOOL_INVALID_PARAMS);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    request.epoch = epoch;

    //  PLACE, then LOCATE misses until COMMIT.
    ProtobufCBinaryData keys[2] = {{1, (uint8_t *) "a"}, {1, (uint8_t *) "b"}};
    uint64_t sizes[2] = {10, 20};
    request.kind = KVPOOL__CLUSTER__V1__KIND__PLACE;
    request.keys = keys;
    request.n_keys = 2;
    request.sizes = sizes;
    request.n_sizes = 2;
    reply = s_call (dealer, &request);
    assert (reply->status == 0 && reply->n_statuses == 2 && reply->statuses[0] == 0);
    assert (reply->n_holders == 2 && reply->holders[0]->n_nodes == 1 && reply->n_nodes == 1);
    assert (streq (reply->nodes[0]->peer_endpoint, "tcp://127.0.0.1:2"));
    assert (reply->n_tokens == 2);
    uint64_t tokens[2] = {reply->tokens[0], reply->tokens[1]};
    //  Each value's version: new to the key (a new key's is its reservation's token).
    assert (reply->n_versions == 2 && reply->versions[0] == tokens[0]);
    uint64_t versions[2] = {reply->versions[0], reply->versions[1]};
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    reply = s_call (dealer, &request); //  a second PLACE of the same keys is refused
    assert (reply->statuses[0] == KVPOOL_OBJECT_ALREADY_EXISTS);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    request.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;
    reply = s_call (dealer, &request);
    assert (reply->statuses[0] == KVPOOL_OBJECT_NOT_FOUND);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    char *ids[] = {"n1"};
    uint32_t zero = 0;
    Kvpool__Cluster__V1__Holders holders = KVPOOL__CLUSTER__V1__HOLDERS__INIT;
    holders.nodes = &zero;
    holders.n_nodes = 1;
    Kvpool__Cluster__V1__Holders *each[2] = {&holders, &holders};
    request.kind = KVPOOL__CLUSTER__V1__KIND__COMMIT;
    request.n_sizes = 0;
    request.holders = each;
    request.n_holders = 2;
    request.nodes = ids;
    request.n_nodes = 1;
    //  A commit without the tokens PLACE gave is refused: it could move any key.
    reply = s_call (dealer, &request);
    assert (reply->status == KVPOOL_INVALID_PARAMS);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    request.tokens = tokens;
    request.n_tokens = 2;
    request.versions = versions;
    request.n_versions = 2;
    reply = s_call (dealer, &request);
    assert (reply->status == 0 && reply->statuses[0] == 0 && reply->statuses[1] == 0);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    request.n_holders = request.n_nodes = request.n_tokens = request.n_versions = 0;
    request.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;
    reply = s_call (dealer, &request);
    assert (reply->n_versions == 2 && reply->versions[1] == versions[1]);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);

    //  Cache holders: a second node keeps a copy of "a" at its version (not of another),
    //  LOCATE marks it, and a node that cannot be told to drop it is fenced: declared dead,
    //  with the time its lease needs to run out.
    {
        zsock_t *second = zsock_new_dealer ("inproc://master-test");
        zsock_set_rcvtimeo (second, 2000);
        Kvpool__Cluster__V1__Node node2 = node;
        node2.node_id = "n2";
        node2.host_id = "h2";
        node2.lease_ms = 600;
        Kvpool__Cluster__V1__NodeRequest other = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        other.version = 1;
        other.node = &node2;
        other.kind = KVPOOL__CLUSTER__V1__KIND__REGISTER;
        reply = s_call (second, &other);
        assert (reply->status == 0);
        other.epoch = reply->epoch;
        other.registration = reply->registration;
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        uint64_t claims[2] = {versions[0], versions[1] + 1000};
        other.kind = KVPOOL__CLUSTER__V1__KIND__CACHE;
        other.keys = keys;
        other.n_keys = 2;
        other.versions = claims;
        other.n_versions = 2;
        reply = s_call (second, &other);
        assert (reply->status == 0 && reply->statuses[0] == 0);
        assert (reply->statuses[1] == KVPOOL_OBJECT_NOT_FOUND); //  not the key's version
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        reply = s_call (dealer, &request); //  LOCATE
        assert (reply->holders[0]->n_nodes == 2 && reply->n_caches == 2);
        assert (reply->caches[0] == 2 && reply->caches[1] == 0); //  the second holder of "a"
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        request.kind = KVPOOL__CLUSTER__V1__KIND__FENCE;
        request.pattern = "n2";
        reply = s_call (dealer, &request);
        assert (reply->status == 0 && reply->wait_ms > 0 && reply->wait_ms <= 660);
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        request.pattern = NULL;
        request.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;
        reply = s_call (dealer, &request);
        assert (reply->holders[0]->n_nodes == 1 && reply->caches[0] == 0);
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        other.kind = KVPOOL__CLUSTER__V1__KIND__HEARTBEAT; //  fenced: it must register
        other.n_keys = other.n_versions = 0;
        reply = s_call (second, &other);
        assert (reply->status == KVPOOL_INVALID_PARAMS);
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        //  Until n2's lease has surely run out (it serves its own copies until it hears it
        //  is dead), a change is answered with that wait; a read is not.
        ProtobufCBinaryData absent = {6, (uint8_t *) "absent"};
        Kvpool__Cluster__V1__NodeRequest change = request;
        change.keys = &absent;
        change.n_keys = 1;
        change.kind = KVPOOL__CLUSTER__V1__KIND__REMOVE;
        reply = s_call (dealer, &change);
        assert (reply->status == 0 && reply->wait_ms > 0 && reply->wait_ms <= 660);
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        change.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;
        reply = s_call (dealer, &change);
        assert (reply->status == 0 && reply->wait_ms == 0);
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
        zsock_destroy (&second);
    }

    //  Another connection cannot take a live node's name, nor speak for it without its
    //  registration: its REGISTER is refused, its heartbeat is "unknown node", its changes
    //  are refused, and the node keeps its keys.
    zsock_t *impostor = zsock_new_dealer ("inproc://master-test");
    zsock_set_rcvtimeo (impostor, 2000);
    Kvpool__Cluster__V1__NodeRequest fake = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    fake.version = 1;
    fake.node = &node;
    fake.epoch = epoch;
    fake.kind = KVPOOL__CLUSTER__V1__KIND__REGISTER;
    reply = s_call (impostor, &fake);
    assert (reply->status == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS && reply->registration == 0);
    assert (!reply->duplicate); //  n1's own endpoints: n1 restarted, perhaps: never told to stop
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    //  A second node under n1's id, with endpoints of its own while n1 is heard from: told
    //  that it is one, so that it stops.
    Kvpool__Cluster__V1__Node twin = node;
    twin.client_endpoint = "tcp://127.0.0.1:3";
    fake.node = &twin;
    reply = s_call (impostor, &fake);
    assert (reply->status == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS && reply->registration == 0);
    assert (reply->duplicate
            && strstr (reply->error, "another live node (clients tcp://127.0.0.1:1)"));
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    fake.node = &node;
    fake.kind = KVPOOL__CLUSTER__V1__KIND__HEARTBEAT;
    fake.registration = request.registration + 1;
    reply = s_call (impostor, &fake);
    assert (reply->status == KVPOOL_INVALID_PARAMS);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    fake.kind = KVPOOL__CLUSTER__V1__KIND__REMOVE_ALL;
    reply = s_call (impostor, &fake);
    assert (reply->status == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    fake.kind = KVPOOL__CLUSTER__V1__KIND__INVENTORY;
    reply = s_call (impostor, &fake);
    assert (reply->status == KVPOOL_INVALID_PARAMS);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    //  Nor may it become a cache holder of the node's keys, or fence anyone.
    fake.kind = KVPOOL__CLUSTER__V1__KIND__CACHE;
    reply = s_call (impostor, &fake);
    assert (reply->status == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    fake.kind = KVPOOL__CLUSTER__V1__KIND__FENCE;
    fake.pattern = "n1";
    reply = s_call (impostor, &fake);
    assert (reply->status == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS && reply->wait_ms == 0);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    //  Nor ask for repair work, claim a replica, or drain a node (master/repair.c).
    Kvpool__Cluster__V1__Kind repairs[] = {KVPOOL__CLUSTER__V1__KIND__REPAIR,
                                           KVPOOL__CLUSTER__V1__KIND__REPAIRED,
                                           KVPOOL__CLUSTER__V1__KIND__DRAIN};
    fake.repair_budget = 1 << 20;
    fake.drain = 1;
    for (size_t k = 0; k < 3; k++) {
        fake.kind = repairs[k];
        reply = s_call (impostor, &fake);
        assert (reply->status == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS && reply->n_keys == 0);
        assert (!reply->draining);
        kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    }
    fake.pattern = NULL;
    zsock_destroy (&impostor);
    //  The node itself may ask how a drain of itself would stand: both keys are only on it.
    request.kind = KVPOOL__CLUSTER__V1__KIND__DRAIN;
    request.pattern = "n1";
    reply = s_call (dealer, &request);
    assert (reply->status == 0 && !reply->draining && reply->count == 2);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    request.pattern = NULL;
    request.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;
    reply = s_call (dealer, &request);
    assert (reply->statuses[0] == 0 && reply->sizes[1] == 20 && reply->holders[1]->n_nodes == 1);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    //  NODES counts what each node holds.
    request.kind = KVPOOL__CLUSTER__V1__KIND__NODES;
    reply = s_call (dealer, &request);
    assert (reply->n_nodes == 2 && reply->nodes[0]->objects == 2 && reply->count == 2);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    request.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;

    //  The node falls silent: after the TTL its objects are gone and it must register.
    zclock_sleep (500);
    reply = s_call (dealer, &request);
    assert (reply->statuses[0] == KVPOOL_OBJECT_NOT_FOUND);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    request.kind = KVPOOL__CLUSTER__V1__KIND__HEARTBEAT;
    request.n_keys = 0;
    reply = s_call (dealer, &request);
    assert (reply->status == KVPOOL_INVALID_PARAMS);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    //  It comes back and reports what it holds: found again. A change it asks for with its
    //  earlier registration is refused (fencing).
    request.kind = KVPOOL__CLUSTER__V1__KIND__REGISTER;
    reply = s_call (dealer, &request);
    assert (reply->status == 0 && reply->registration != request.registration);
    uint64_t registration = reply->registration;
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    request.kind = KVPOOL__CLUSTER__V1__KIND__REMOVE;
    request.keys = keys;
    request.n_keys = 1;
    reply = s_call (dealer, &request);
    assert (reply->status == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    request.registration = registration;
    request.kind = KVPOOL__CLUSTER__V1__KIND__INVENTORY;
    request.keys = keys;
    request.n_keys = 2;
    request.n_sizes = 2;
    reply = s_call (dealer, &request);
    assert (reply->status == 0 && reply->count == 2);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    //  A node reports no more than it has room for (1 MiB here): the rest is refused.
    ProtobufCBinaryData many[3] = {
        {1, (uint8_t *) "x"}, {1, (uint8_t *) "y"}, {1, (uint8_t *) "z"}};
    uint64_t big[3] = {600 << 10, 600 << 10, 1};
    request.keys = many;
    request.n_keys = 3;
    request.sizes = big;
    request.n_sizes = 3;
    reply = s_call (dealer, &request);
    assert (reply->status == 0 && reply->count == 2 && reply->n_keys == 1);
    assert (reply->keys[0].len == 1 && reply->keys[0].data[0] == 'y');
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    request.keys = keys;
    request.n_keys = 2;
    request.sizes = sizes;
    request.n_sizes = 2;
    request.kind = KVPOOL__CLUSTER__V1__KIND__REMOVE;
    request.n_sizes = 0;
    reply = s_call (dealer, &request);
    assert (reply->count == 2 && reply->holders[0]->n_nodes == 1);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    //  Garbage is answered PROTOCOL_ERROR.
    zstr_send (dealer, "garbage");
    zframe_t *frame = zframe_recv (dealer);
    reply =
        kvpool__cluster__v1__master_reply__unpack (NULL, zframe_size (frame), zframe_data (frame));
    assert (reply && reply->status == KVPOOL_PROTOCOL_ERROR);
    kvpool__cluster__v1__master_reply__free_unpacked (reply, NULL);
    zframe_destroy (&frame);
    zsock_destroy (&dealer);
    zactor_destroy (&master);
    if (verbose)
        printf ("master ok ");
}
