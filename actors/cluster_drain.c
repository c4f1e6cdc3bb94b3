/*  cluster_drain.c - the cluster actor's DRAIN (cluster_op.h): a client's `kvpool node drain
    NODE` asks the master to start or stop draining a node, or how its drain stands
    (protocol/cluster.proto DRAIN, master/repair.c). The copies themselves are the repair's:
    each node's repair actor (replica_repair.c) copies what the drained node alone holds.

    Threads: the cluster actor's.
*/
#include "actors/cluster_op.h"

void
cluster_drain_start (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    const char *action = job->drain.action ? job->drain.action : "";
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = KVPOOL__CLUSTER__V1__KIND__DRAIN;
    request.pattern = (char *) job->items[0].key;
    request.drain = streq (action, "start") ? 1 : streq (action, "stop") ? 2 : 0;
    if (cluster_master_send (self, op, &request, NULL, 0) != 0)
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "%s is unreachable",
                      master_client_name (self->master));
}

void
cluster_drain_reply (self_t *self, op_t *op, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    if (!cluster_master_answered (self, job, reply))
        return;
    job->result_count = reply->count;
    job->drain.short_count = reply->drain_short;
    job->drain.draining = reply->draining;
    job->items[0].status = KVPOOL_OK;
}
