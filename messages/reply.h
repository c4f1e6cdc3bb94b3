/*  reply.h - a finished job's results as a kvpool.v1.Reply, as its operation's row says.

    The api fills the reply's scalar fields (status, error, count, the node's identity); the
    per-key arrays and the segments come from here, allocated in the request's arena so that
    they go with it.
*/
#ifndef KVP_REPLY_H_INCLUDED
#define KVP_REPLY_H_INCLUDED

#include <stdbool.h>

#include "messages/arena.h"
#include "messages/kvp_job.h"
#include "messages/ops.h"
#include "protocol/kvpool.pb-c.h"

//  Fills reply's statuses (one a key; the job's status for every key when the job failed),
//  and sizes, replicas and segments where row->fills says. Returns 0, or -1 when the arena
//  is out of memory (the reply may then hold some arrays: send none of them).
//  The replicas a put's item got (PUT, UPSERT, PUT_START): the nodes of a cluster, or the
//  segments of one node; 0 when it failed.
uint32_t reply_replicas_placed (const kvp_job_t *job, const kvp_item_t *item);
int reply_encode (arena_t *arena, const kvp_op_t *row, const kvp_job_t *job,
                  Kvpool__V1__Reply *reply);

//  Copies every stats field (kvpool_stats.h) into the reply's Stats.
void reply_stats (const kvp_stats_t *from, Kvpool__V1__Stats *to);

void reply_test (bool verbose);

#endif
