/*  node_table.c - the master's nodes and replica placement (node_table.h). */
#include "master/node_table.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/contract.h"

#define ID_SLOTS (NODE_TABLE_MAX * 2) //  node id -> slot: open addressing, never deleted

struct _node_table_t {
    node_t *nodes[NODE_TABLE_MAX];
    size_t size;
    int16_t ids[ID_SLOTS]; //  slot + 1; 0: free
    kvp_placement_t strategy;
    uint64_t rng;
    uint64_t max_objects; //  0: no bound
};

node_table_t *
node_table_new (kvp_placement_t strategy, uint64_t seed)
{
    node_table_t *self = (node_table_t *) calloc (1, sizeof (node_table_t));
    if (self) {
        self->strategy = strategy;
        self->rng = seed ? seed : 0x9E3779B97F4A7C15ULL;
    }
    return self;
}

void
node_table_set_max_objects (node_table_t *self, uint64_t max_objects)
{
    self->max_objects = max_objects;
}

void
node_table_destroy (node_table_t **self_p)
{
    node_table_t *self = *self_p;
    if (!self)
        return;
    for (size_t i = 0; i < self->size; i++)
        free (self->nodes[i]);
    free (self);
    *self_p = NULL;
}

static size_t
s_id_hash (const char *id)
{
    uint64_t hash = 0xcbf29ce484222325ULL; //  FNV-1a
    for (; *id; id++)
        hash = (hash ^ (uint8_t) *id) * 0x100000001b3ULL;
    return (size_t) (hash % ID_SLOTS);
}

int
node_table_find (node_table_t *self, const char *node_id)
{
    for (size_t i = s_id_hash (node_id); self->ids[i]; i = (i + 1) % ID_SLOTS)
        if (strcmp (self->nodes[self->ids[i] - 1]->node_id, node_id) == 0)
            return self->ids[i] - 1;
    return -1;
}

int
node_table_slot (node_table_t *self, const char *node_id)
{
    int slot = node_table_find (self, node_id);
    if (slot >= 0)
        return slot;
    if (self->size == NODE_TABLE_MAX)
        return -1;
    node_t *node = (node_t *) calloc (1, sizeof (node_t));
    if (!node)
        return -1;
    snprintf (node->node_id, sizeof node->node_id, "%s", node_id);
    size_t i = s_id_hash (node->node_id);
    while (self->ids[i])
        i = (i + 1) % ID_SLOTS;
    self->ids[i] = (int16_t) (self->size + 1);
    self->nodes[self->size] = node;
    return (int) self->size++;
}

node_t *
node_table_get (node_table_t *self, int slot)
{
    return slot >= 0 && (size_t) slot < self->size ? self->nodes[slot] : NULL;
}

size_t
node_table_size (node_table_t *self)
{
    return self->size;
}

size_t
node_table_alive (node_table_t *self)
{
    size_t alive = 0;
    for (size_t i = 0; i < self->size; i++)
        alive += self->nodes[i]->alive;
    return alive;
}

//  xorshift64*: spread and reproducibility, not secrecy.
static uint64_t
s_random (node_table_t *self)
{
    self->rng ^= self->rng >> 12;
    self->rng ^= self->rng << 25;
    self->rng ^= self->rng >> 27;
    return self->rng * 0x2545F4914F6CDD1DULL;
}

static double
s_free_ratio (const node_t *node)
{
    if (node->capacity == 0)
        return 0;
    uint64_t free = node->free > node->placed ? node->free - node->placed : 0;
    return (double) free / (double) node->capacity;
}

//  Whether slot may take one more replica: alive, not draining, big enough, not chosen yet,
//  and (distinct)
//  on a host none of the chosen is on.
static bool
s_eligible (node_table_t *self, int slot, uint64_t size, const uint16_t *out, size_t chosen,
            bool distinct)
{
    const node_t *node = node_table_get (self, slot);
    if (!node || !node->alive || node->draining || node->capacity < size
        || (self->max_objects && node->objects >= self->max_objects))
        return false;
    for (size_t i = 0; i < chosen; i++) {
        if (out[i] == slot)
            return false;
        if (distinct && strcmp (self->nodes[out[i]]->host_id, node->host_id) == 0)
            return false;
    }
    return true;
}

size_t
node_table_place (node_table_t *self, uint64_t size, uint32_t replica_num, int writer,
                  const int *preferred, size_t preferred_count, uint16_t *out)
{
    if (replica_num == 0)
        replica_num = 1;
    if (replica_num > KVP_MAX_REPLICAS)
        replica_num = KVP_MAX_REPLICAS;
    //  The candidates in the order they are taken.
    int order[NODE_TABLE_MAX + KVP_MAX_PREFERRED_NODES + 1];
    size_t count = 0;
    for (size_t i = 0; i < preferred_count && i < KVP_MAX_PREFERRED_NODES; i++)
        order[count++] = preferred[i];
    if (self->strategy == KVP_PLACEMENT_LOCAL_FIRST && writer >= 0)
        order[count++] = writer;
    size_t rest = count;
    for (size_t i = 0; i < self->size; i++)
        if (self->nodes[i]->alive)
            order[count++] = (int) i;
    bool by_ratio =
        self->strategy == KVP_PLACEMENT_FREE_RATIO || self->strategy == KVP_PLACEMENT_LOCAL_FIRST;
    if (!by_ratio)
        for (size_t i = count; i > rest + 1; i--) {
            size_t j = rest + (size_t) (s_random (self) % (i - rest));
            int swap = order[i - 1];
            order[i - 1] = order[j];
            order[j] = swap;
        }
    //  The preferred (and the writer's) first, in order; then the rest: in their shuffled
    //  order, or (by_ratio) the freest eligible each time, a scan per replica rather than a
    //  sort per key (a master may have thousands of nodes).
    size_t chosen = 0;
    for (int pass = 0; pass < 2 && chosen < replica_num; pass++) {
        for (size_t i = 0; i < rest && chosen < replica_num; i++)
            if (s_eligible (self, order[i], size, out, chosen, pass == 0))
                out[chosen++] = (uint16_t) order[i];
        while (chosen < replica_num) {
            int best = -1;
            double best_ratio = -1;
            for (size_t i = rest; i < count; i++) {
                if (!s_eligible (self, order[i], size, out, chosen, pass == 0))
                    continue;
                if (!by_ratio) {
                    best = order[i];
                    break;
                }
                double ratio = s_free_ratio (self->nodes[order[i]]);
                if (ratio > best_ratio) {
                    best = order[i];
                    best_ratio = ratio;
                }
            }
            if (best < 0)
                break;
            out[chosen++] = (uint16_t) best;
        }
    }
    for (size_t i = 0; i < chosen; i++)
        self->nodes[out[i]]->placed += size;
    return chosen;
}

node_claim_t
node_table_claim (const node_t *node, const char *client_endpoint, const char *peer_endpoint,
                  uint64_t node_ttl_ms, int64_t now)
{
    if (client_endpoint && peer_endpoint && *client_endpoint && *peer_endpoint
        && strcmp (node->client_endpoint, client_endpoint) == 0
        && strcmp (node->peer_endpoint, peer_endpoint) == 0)
        return NODE_CLAIM_RESTART;
    //  Its lease is KVP_LEASE_BEATS heartbeats: a live node is heard from well within it.
    uint64_t lease = node->lease_ms ? node->lease_ms : node_ttl_ms / 2;
    if (!node->conn_closed && now - node->last_heard <= (int64_t) lease)
        return NODE_CLAIM_DUPLICATE;
    return NODE_CLAIM_WAIT;
}

void
node_table_conn_closed (node_table_t *self, int fd)
{
    for (size_t i = 0; i < self->size; i++)
        if (self->nodes[i]->conn_fd == fd)
            self->nodes[i]->conn_closed = true;
}

void
node_table_space (node_table_t *self, uint64_t *capacity, uint64_t *used)
{
    *capacity = *used = 0;
    for (size_t i = 0; i < self->size; i++) {
        const node_t *node = self->nodes[i];
        if (!node->alive)
            continue;
        *capacity += node->capacity;
        *used += node->capacity > node->free ? node->capacity - node->free : 0;
    }
}

//  ---- self test ---------------------------------------------------------------------

static void
s_add (node_table_t *table, const char *id, const char *host, uint64_t capacity, uint64_t free)
{
    int slot = node_table_slot (table, id);
    assert (slot >= 0);
    node_t *node = node_table_get (table, slot);
    snprintf (node->host_id, sizeof node->host_id, "%s", host);
    node->capacity = capacity;
    node->free = free;
    node->alive = true;
}

void
node_table_test (bool verbose)
{
    node_table_t *table = node_table_new (KVP_PLACEMENT_RANDOM, 42);
    s_add (table, "a1", "hostA", 1000, 1000);
    s_add (table, "a2", "hostA", 1000, 1000);
    s_add (table, "b1", "hostB", 1000, 1000);
    s_add (table, "c1", "hostC", 100, 100);
    assert (node_table_size (table) == 4 && node_table_alive (table) == 4);
    assert (node_table_slot (table, "b1") == 2 && node_table_find (table, "zz") == -1);
    uint16_t out[KVP_MAX_REPLICAS];
    //  Three replicas of a 50-byte value: three distinct hosts.
    for (int round = 0; round < 50; round++) {
        size_t n = node_table_place (table, 50, 3, -1, NULL, 0, out);
        assert (n == 3);
        bool host[3] = {false, false, false};
        for (size_t i = 0; i < n; i++) {
            const char *h = node_table_get (table, out[i])->host_id;
            int index = h[4] - 'A';
            assert (!host[index]);
            host[index] = true;
        }
    }
    //  A 500-byte value does not fit c1: hosts A and B, then the second node of A.
    size_t n = node_table_place (table, 500, 3, -1, NULL, 0, out);
    assert (n == 3);
    int a = 0;
    for (size_t i = 0; i < n; i++) {
        assert (out[i] != 3);
        a += out[i] <= 1;
    }
    assert (a == 2);
    //  Random placement spreads single replicas over every node.
    int seen[4] = {0};
    for (int i = 0; i < 400; i++) {
        assert (node_table_place (table, 10, 1, -1, NULL, 0, out) == 1);
        seen[out[0]]++;
    }
    for (int i = 0; i < 4; i++)
        assert (seen[i] > 40);
    //  Preferred first; a dead node is never chosen.
    int preferred[] = {3};
    assert (node_table_place (table, 10, 1, -1, preferred, 1, out) == 1 && out[0] == 3);
    node_table_get (table, 3)->alive = false;
    assert (node_table_place (table, 10, 1, -1, preferred, 1, out) == 1 && out[0] != 3);
    assert (node_table_alive (table) == 3);
    //  A node holding --max-node-objects entries is passed over, preferred or not.
    node_table_set_max_objects (table, 5);
    node_table_get (table, 0)->objects = 5;
    preferred[0] = 0;
    for (int i = 0; i < 50; i++)
        assert (node_table_place (table, 10, 1, -1, preferred, 1, out) == 1 && out[0] != 0);
    node_table_get (table, 0)->objects = 4;
    assert (node_table_place (table, 10, 1, -1, preferred, 1, out) == 1 && out[0] == 0);
    node_table_destroy (&table);

    //  Free-ratio: the emptiest first; what was placed since the last report counts.
    table = node_table_new (KVP_PLACEMENT_FREE_RATIO, 1);
    s_add (table, "x", "h1", 1000, 900);
    s_add (table, "y", "h2", 1000, 500);
    assert (node_table_place (table, 300, 1, -1, NULL, 0, out) == 1 && out[0] == 0);
    assert (node_table_place (table, 300, 1, -1, NULL, 0, out) == 1 && out[0] == 0);
    assert (node_table_place (table, 300, 1, -1, NULL, 0, out) == 1 && out[0] == 1);
    node_table_destroy (&table);

    //  Local-first: the writer's node, then the freest.
    table = node_table_new (KVP_PLACEMENT_LOCAL_FIRST, 1);
    s_add (table, "x", "h1", 1000, 100);
    s_add (table, "y", "h2", 1000, 900);
    s_add (table, "z", "h3", 1000, 500);
    assert (node_table_place (table, 10, 2, 0, NULL, 0, out) == 2 && out[0] == 0 && out[1] == 1);
    //  A draining node takes nothing new.
    node_table_get (table, 0)->draining = true;
    assert (node_table_place (table, 10, 3, 0, NULL, 0, out) == 2 && out[0] != 0 && out[1] != 0);
    node_table_get (table, 0)->draining = false;
    //  No live node: nothing.
    for (int i = 0; i < 3; i++)
        node_table_get (table, i)->alive = false;
    assert (node_table_place (table, 10, 1, 0, NULL, 0, out) == 0);
    node_table_destroy (&table);

    //  The space of live nodes; a REGISTER of a live node's id.
    table = node_table_new (KVP_PLACEMENT_RANDOM, 1);
    s_add (table, "p", "h1", 1000, 400);
    s_add (table, "q", "h2", 500, 500);
    s_add (table, "r", "h3", 700, 0);
    node_table_get (table, 2)->alive = false;
    uint64_t capacity, used;
    node_table_space (table, &capacity, &used);
    assert (capacity == 1500 && used == 600);
    node_t *p = node_table_get (table, 0);
    snprintf (p->client_endpoint, sizeof p->client_endpoint, "tcp://10.0.0.1:50051");
    snprintf (p->peer_endpoint, sizeof p->peer_endpoint, "tcp://10.0.0.1:40000");
    p->lease_ms = 3000;
    p->last_heard = 10000;
    //  Its own endpoints: restarted, whenever it was last heard from.
    assert (node_table_claim (p, "tcp://10.0.0.1:50051", "tcp://10.0.0.1:40000", 10000, 10100)
            == NODE_CLAIM_RESTART);
    //  Other endpoints while it is heard from: a second node under its id.
    assert (node_table_claim (p, "tcp://10.0.0.2:50051", "tcp://10.0.0.2:40000", 10000, 12000)
            == NODE_CLAIM_DUPLICATE);
    assert (node_table_claim (p, "tcp://10.0.0.1:50052", "tcp://10.0.0.1:40000", 10000, 12000)
            == NODE_CLAIM_DUPLICATE);
    //  Silent past its lease, or its connection closed: wait, never stop the newcomer.
    assert (node_table_claim (p, "tcp://10.0.0.2:50051", "tcp://10.0.0.2:40000", 10000, 13001)
            == NODE_CLAIM_WAIT);
    p->conn_closed = true;
    assert (node_table_claim (p, "tcp://10.0.0.2:50051", "tcp://10.0.0.2:40000", 10000, 10100)
            == NODE_CLAIM_WAIT);
    p->conn_closed = false;
    //  Without a lease: half of --node-ttl.
    p->lease_ms = 0;
    assert (node_table_claim (p, "", "", 10000, 14999) == NODE_CLAIM_DUPLICATE);
    assert (node_table_claim (p, "", "", 10000, 15001) == NODE_CLAIM_WAIT);
    node_table_destroy (&table);
    if (verbose)
        printf ("node_table ok ");
}
