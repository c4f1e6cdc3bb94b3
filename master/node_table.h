/*  node_table.h - the master's nodes: who they are, whether they live, how full they are,
    and the placement of an object's replicas across them.

    A node keeps its slot for the master's life: a node that dies and comes back (same node
    id) gets its old slot again, so a slot number in the directory always means one node.
    Liveness is the time since the node's last message; the master declares a node dead
    after --node-ttl and then drops it from every entry (directory_drop_node).

    Placement (DESIGN §4): the master chooses which nodes hold an object's replicas, each
    node the offsets. Order: the caller's preferred nodes, then (local-first) the writer's
    node, then the rest by the strategy: random (seeded, reproducible) or free-ratio (the
    node with the largest share of free space first, less what was placed on it since its
    last report). A node that holds --max-node-objects entries is passed over. Replicas go
    to distinct hosts while there are enough; then to distinct
    nodes of one host. Free space orders the choice but never refuses it: a full node evicts
    to make room, as a cache does, and only a node smaller than the value is passed over.

    Threads: none of its own; the master actor owns the table.
*/
#ifndef NODE_TABLE_H_INCLUDED
#define NODE_TABLE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "infra/config.h"

#define NODE_TABLE_MAX 4096

typedef struct {
    char node_id[128];
    char host_id[64];
    char client_endpoint[256];
    char peer_endpoint[256];
    char curve_key[41]; //  its CURVE public key (Z85), or ""
    uint64_t capacity;  //  bytes of memory it contributes
    uint64_t free;      //  as it last reported
    uint64_t placed;    //  bytes placed on it since that report
    int64_t last_heard; //  zclock_mono ms
    //  The master's token sequence (directory.h) when it last heard from the node, and, from
    //  its last REGISTER, that value from before: a value committed with a later token came
    //  while the node was away, so a copy it reports of that key is stale (master.c).
    uint64_t seen_token, report_bar;
    //  Its current registration (master.c): a random number only the registered process
    //  learns, sent back with every request, the connection it registered on (routing id
    //  and descriptor; closed: the connection is gone) and the credential it proved there.
    uint64_t registration;
    uint8_t conn[32];
    size_t conn_size;
    int conn_fd;
    bool conn_closed;
    char user_id[248];
    uint64_t disk_capacity;  //  bytes of its disk tier
    uint64_t reported_bytes; //  of the copies it reported (INVENTORY) since it registered
    bool alive;
    uint64_t objects; //  directory entries it holds
    //  How long after a heartbeat this master answered the node still serves its cache
    //  copies (REGISTER's lease_ms; 0: it keeps none): a node fenced now (FENCE) is safe
    //  from last_heard + lease_ms on.
    uint64_t lease_ms;
    uint64_t register_token; //  the token sequence when it last registered (FENCE)
    //  With standby masters (ha.h): the term under which etcd records the node fenced (0:
    //  none; the record goes once it has reported again), and whether that was an earlier
    //  term's, whose removals this master does not know: then only the copies other
    //  holders confirm are taken from its report (master.c, s_inventory).
    uint64_t fence_term;
    bool suspect;
    //  Being drained (DRAIN, master/repair.c): placed on no more, and what it holds counts
    //  as lacking elsewhere. A REGISTER (a new life) ends it.
    bool draining;
} node_t;

typedef struct _node_table_t node_table_t;

//  Caller owns the return value.
node_table_t *node_table_new (kvp_placement_t strategy, uint64_t seed);
void node_table_destroy (node_table_t **self_p);

//  The slot of node_id, or -1.
int node_table_find (node_table_t *self, const char *node_id);
//  The slot for node_id: its old one, or a new one. -1 when the table is full.
int node_table_slot (node_table_t *self, const char *node_id);
node_t *node_table_get (node_table_t *self, int slot);
//  Slots in use (alive or not).
size_t node_table_size (node_table_t *self);
size_t node_table_alive (node_table_t *self);

//  Nodes holding this many directory entries (node_t.objects) or more are never chosen
//  (--max-node-objects). Default: no bound.
void node_table_set_max_objects (node_table_t *self, uint64_t max_objects);

//  Chooses up to replica_num (at least 1, at most KVP_MAX_REPLICAS) live nodes for a value
//  of size bytes into out[], as described above; writer is the asking node's slot (-1: none),
//  preferred[0..preferred_count) slots to take first. Returns how many were chosen (0: no
//  live node can hold it).
size_t node_table_place (node_table_t *self, uint64_t size, uint32_t replica_num, int writer,
                         const int *preferred, size_t preferred_count, uint16_t *out);

//  What a REGISTER of an id a live node holds (node, registered on another connection) is:
//  - NODE_CLAIM_RESTART: it announces the same client and data-plane endpoints, which no two
//    live processes can bind: the node restarted, before its old connection was seen to
//    close. Never told to stop (it takes its place once that close is seen, as any
//    REGISTER from another connection does: master.c s_register).
//  - NODE_CLAIM_DUPLICATE: other endpoints, and node was heard from within its lease (or,
//    without one, within --node-ttl / 2) on a connection still open: a second live node
//    under one id. Refused for good (MasterReply.duplicate): the node stops.
//  - NODE_CLAIM_WAIT: anything else (the old process frozen, or its connection closed or
//    half dead): refused only while its connection is open, until it closes or the node is
//    declared dead.
typedef enum { NODE_CLAIM_RESTART, NODE_CLAIM_DUPLICATE, NODE_CLAIM_WAIT } node_claim_t;
node_claim_t node_table_claim (const node_t *node, const char *client_endpoint,
                               const char *peer_endpoint, uint64_t node_ttl_ms, int64_t now);

//  The connection on descriptor fd closed: a node registered on it may be taken over by
//  its restart (conn_closed).
void node_table_conn_closed (node_table_t *self, int fd);

//  The live nodes' memory (capacity), and what is in use of it as they last said.
void node_table_space (node_table_t *self, uint64_t *capacity, uint64_t *used);

void node_table_test (bool verbose);

#endif
