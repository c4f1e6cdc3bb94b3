/*  master_reply.h - a master's reply to a node (protocol/cluster.proto MasterReply) under
    construction: its arrays in the request's arena, and the nodes its holder lists name,
    each once (reply.nodes, indexed through a table by node slot).

    Threads: none; the master actor's, one reply at a time.
*/
#ifndef MASTER_REPLY_H_INCLUDED
#define MASTER_REPLY_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "master/node_table.h"
#include "messages/arena.h"
#include "protocol/cluster.pb-c.h"

typedef struct {
    Kvpool__Cluster__V1__MasterReply reply;
    arena_t *arena;
    size_t nodes_capacity;
    node_table_t *nodes;
    uint32_t *node_index; //  slot -> index in reply.nodes + 1 (0: not in it yet)
} reply_t;

//  Starts the reply's arrays and node list: in arena, naming nodes of nodes, node_index
//  (NODE_TABLE_MAX entries, zeroed here) the caller's. The caller fills the reply's header.
void master_reply_start (reply_t *r, arena_t *arena, node_table_t *nodes, uint32_t *node_index);
//  Fails the reply as a whole: status and the reason (printf). Returns status.
int master_reply_fail (reply_t *r, int status, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));
//  Arrays for n keys' statuses (and, as asked, sizes and holders). Returns 0 or -1.
int master_reply_keys (reply_t *r, size_t n, bool sizes, bool holders);
//  The index of slot's node in reply.nodes, adding it. Returns -1 when out of memory.
int master_reply_node (reply_t *r, int slot);
//  Fills holders with the live nodes among slots[0..count); with caches, *caches gets a bit
//  per node listed that keeps a cache copy (bit i of cache_mask for slots[i]).
int master_reply_holders_cached (reply_t *r, Kvpool__Cluster__V1__Holders *holders,
                                 const uint16_t *slots, size_t count, uint8_t cache_mask,
                                 uint32_t *caches);
int master_reply_holders (reply_t *r, Kvpool__Cluster__V1__Holders *holders, const uint16_t *slots,
                          size_t count);
//  Arrays for n keys' versions and cache masks (zeroed). Returns 0 or -1.
int master_reply_versions (reply_t *r, size_t n, bool caches);
//  An empty holder list a key for n keys' old holders (PLACE of an upsert, COMMIT). Returns
//  0, or -1 (the reply failed) when out of memory.
int master_reply_old_holders (reply_t *r, size_t n);
//  A change (COMMIT, REMOVE, REMOVE_REGEX, REMOVE_ALL) answered OK waits at least wait_ms
//  before its asker answers its client (reply.wait_ms): a node fenced lately (the master's
//  FENCE) serves its own copies until its next heartbeat, and its keys changed without it
//  must not be read back through it once the change is acknowledged.
void master_reply_hold (reply_t *r, const Kvpool__Cluster__V1__NodeRequest *request,
                        int64_t wait_ms);
//  Says at debug level what was asked (request: NULL when it did not parse) and answered.
void master_reply_log (const reply_t *r, const Kvpool__Cluster__V1__NodeRequest *request);

#endif
