/*  repair.h - the master's repair of objects that lack replicas, and the drain of a node.

    An object lacks replicas when fewer live nodes that are not draining keep a replica of
    it (cache copies do not count) than its put asked for (dir_entry_t.want). That happens
    when a node dies, when a node is drained, and when a put placed fewer replicas than it
    asked for (the cluster had fewer nodes). The master finds such objects (a walk of the
    directory after a node dies, joins or starts draining; a commit that placed fewer) and
    queues them. Nodes ask for work (REPAIR, with the bytes their --repair-rate lets them
    copy now): the master hands each node objects it may hold (it holds none, it is alive
    and not draining, and no node on a host that holds no replica yet is left to take it
    instead). The node copies each from a holder, hidden, and claims it (REPAIRED): taken
    only while the object is at that version and still lacks replicas, so a repair never
    stands in for a newer value and never adds a replica past what was asked.

    A drain (DRAIN) marks a node: no new placements on it, and its replicas count as lacking
    elsewhere, so the same repair copies them to other nodes. The drain is done when no
    object is held only by it; the node then leaves every holder list ("done") and goes.

    Threads: none of its own; the master actor owns it.
*/
#ifndef REPAIR_H_INCLUDED
#define REPAIR_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>

#include "master/directory.h"
#include "master/node_table.h"
#include "messages/arena.h"
#include "protocol/cluster.pb-c.h"

typedef struct _repair_t repair_t;

//  Repairs of directory's objects across nodes (both outlive it). Caller owns the return
//  value and must destroy it.
repair_t *repair_new (directory_t *directory, node_table_t *nodes);

//  The master started afresh (a new term, master.c): repair the new directory and nodes,
//  forgetting what was queued or handed out; the counts done so far stay.
void repair_restart (repair_t *self, directory_t *directory, node_table_t *nodes);
//  Does nothing on NULL; sets *self_p to NULL.
void repair_destroy (repair_t **self_p);

//  Something changed that may leave objects lacking replicas, or let lacking ones find a
//  node (a node died, joined, started or stopped draining): the directory is walked at the
//  next tick.
void repair_rescan (repair_t *self);
//  entry (committed) may lack replicas now (its commit placed fewer than asked): queued.
void repair_note (repair_t *self, const dir_entry_t *entry);
//  The walks asked for, and copies handed out that were never claimed, given out again.
void repair_tick (repair_t *self, int64_t now);

//  REPAIR from node slot: fills reply's keys, sizes and versions (in arena) with objects it
//  may copy, about budget bytes of them (at least one when any fits).
void repair_work (repair_t *self, int slot, uint64_t budget,
                  Kvpool__Cluster__V1__MasterReply *reply, arena_t *arena, int64_t now);
//  REPAIRED: node slot holds a replica of key at version. Returns KVPOOL_OK (it is a holder
//  now), KVPOOL_OBJECT_NOT_FOUND (removed, or another version) or
//  KVPOOL_OBJECT_ALREADY_EXISTS (it has the replicas it asked for).
int repair_claimed (repair_t *self, int slot, const char *key, uint64_t version);

//  DRAIN of node slot: action 0 asks, 1 starts, 2 stops, 3 done (the node leaves every
//  holder list). *sole: objects only it holds; *short_p: objects it holds with fewer
//  replicas elsewhere than asked.
void repair_drain (repair_t *self, int slot, uint32_t action, uint64_t *sole, uint64_t *short_p);

//  A REPAIR, REPAIRED or DRAIN request of node slot (registered), answered into reply (its
//  arrays in arena); keys over max_key_len are not keys. Returns KVPOOL_OK, or a status
//  for the whole request with the reason in error.
int repair_request (repair_t *self, int slot, const Kvpool__Cluster__V1__NodeRequest *request,
                    Kvpool__Cluster__V1__MasterReply *reply, arena_t *arena, size_t max_key_len,
                    char *error, size_t error_size);

//  Replicas lacking at the last walk, less those repaired since.
uint64_t repair_missing (repair_t *self);
uint64_t repair_done (repair_t *self);
uint64_t repair_bytes (repair_t *self);

void repair_test (bool verbose);

#endif
