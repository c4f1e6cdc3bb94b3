/*  cluster_remove.c - the cluster actor's removes: REMOVE, REMOVE_REGEX, REMOVE_ALL and
    a reset's (cluster_op.h).

    Removes go to the master, which forgets the keys and says which nodes held them; those
    nodes are told to drop them (forced) before the client is answered. A holder that
    refuses fails the job with its reason.

    Threads: the cluster actor's.
*/
#include "actors/cluster_op.h"

void
cluster_remove_start (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    ProtobufCBinaryData *keys = NULL;
    size_t *items = NULL, n = 0;
    switch (job->op) {
        case KVPOOL__V1__OP__REMOVE:
            request.kind = KVPOOL__CLUSTER__V1__KIND__REMOVE;
            keys = (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
            items = (size_t *) malloc ((job->count ? job->count : 1) * sizeof (size_t));
            assert (keys && items);
            for (size_t i = 0; i < job->count; i++)
                if (job->items[i].status == KVPOOL_OK) {
                    items[n] = i;
                    keys[n].data = (uint8_t *) job->items[i].key;
                    keys[n++].len = job->items[i].key_len;
                }
            request.keys = keys;
            request.n_keys = n;
            break;
        case KVPOOL__V1__OP__REMOVE_BY_REGEX:
            request.kind = KVPOOL__CLUSTER__V1__KIND__REMOVE_REGEX;
            request.pattern = (char *) (job->regex.pattern ? job->regex.pattern : "");
            break;
        default: request.kind = KVPOOL__CLUSTER__V1__KIND__REMOVE_ALL; break;
    }
    if (cluster_master_send (self, op, &request, items, n) != 0)
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "%s is unreachable",
                      master_client_name (self->master));
    free (keys);
}

//  The master forgot the keys: the nodes that held them drop them before the client hears.
void
cluster_remove_reply (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    if (!cluster_master_answered (self, job, reply))
        return;
    op->phase = 1;
    job->result_count = reply->count;
    bool all = reply->kind == KVPOOL__CLUSTER__V1__KIND__REMOVE_ALL;
    for (size_t k = 0; k < call->count && k < reply->n_statuses; k++)
        job->items[call->items[k]].status = reply->statuses[k];
    //  Where the keys were is no longer worth knowing (cluster_locations.c).
    if (all || reply->kind == KVPOOL__CLUSTER__V1__KIND__REMOVE_REGEX)
        cluster_locations_forget (self, NULL);
    for (size_t k = 0; k < call->count; k++)
        cluster_locations_forget (self, job->items[call->items[k]].key);
    //  One request per node: every key it held (or, for all, everything).
    for (size_t nix = 0; nix < reply->n_nodes; nix++) {
        const Kvpool__Cluster__V1__Node *node = reply->nodes[nix];
        int peer =
            cluster_peer (self, node->node_id, node->host_id, node->peer_endpoint, node->curve_key);
        if (peer < 0)
            continue;
        Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
        request.force = true;
        ProtobufCBinaryData *keys = NULL;
        uint64_t *versions = NULL;
        if (all)
            //  This node drained its own writes already (the reset that runs here): a RESET
            //  sent to itself would wait behind that one, and never be answered in time.
            request.op = job->op == KVPOOL__V1__OP__RESET && !cluster_is_self (self, peer)
                             ? KVPOOL__V1__OP__RESET
                             : KVPOOL__V1__OP__REMOVE_ALL;
        else {
            const ProtobufCBinaryData *names = reply->n_keys ? reply->keys : NULL;
            keys = (ProtobufCBinaryData *) malloc ((reply->n_holders ? reply->n_holders : 1)
                                                   * sizeof *keys);
            versions =
                (uint64_t *) calloc (reply->n_holders ? reply->n_holders : 1, sizeof *versions);
            assert (keys && versions);
            size_t n = 0;
            for (size_t k = 0; k < reply->n_holders; k++) {
                const Kvpool__Cluster__V1__Holders *holders = reply->holders[k];
                for (size_t h = 0; h < holders->n_nodes; h++)
                    if (holders->nodes[h] == nix && (names || k < call->count)) {
                        if (names)
                            keys[n] = names[k];
                        else {
                            keys[n].data = (uint8_t *) job->items[call->items[k]].key;
                            keys[n].len = job->items[call->items[k]].key_len;
                        }
                        //  Only the value removed: never one put since (0: any).
                        versions[n++] = k < reply->n_versions ? reply->versions[k] : 0;
                    }
            }
            if (n == 0) {
                free (keys);
                free (versions);
                continue;
            }
            request.op = KVPOOL__V1__OP__REMOVE;
            request.keys = keys;
            request.n_keys = n;
            request.versions = versions;
            request.n_versions = n;
        }
        cluster_peer_send (self, op, peer, &request, NULL, 0);
        free (keys);
        free (versions);
    }
}
