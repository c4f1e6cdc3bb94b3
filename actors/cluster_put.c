/*  cluster_put.c - the cluster actor's puts: PLACE, COMMIT, ABORT (cluster_op.h).

    PLACE: the master reserves each key and chooses its nodes; the api writes the replica held
    here, if any. COMMIT writes the other replicas, all nodes in parallel on the data plane's
    workers, then commits at the master with the nodes that acknowledged. A key no node could
    take is aborted at the master; a commit the master refuses removes the copies that were
    written. So a key is visible through the master only once every byte of it is on the
    nodes the master names.

    Checksums (transfer/value_checksum.h): a put's values go to other nodes with their
    checksum (the one taken as the replica here was written, or the client's, or one the
    data plane takes as it copies), and those nodes refuse bytes that do not match.

    Threads: the cluster actor's. A put's values are copied into the requests to other
    nodes (the client's frames belong to the api's request and may go before libzmq has
    sent a copy that timed out).
*/
#include "actors/cluster_op.h"

#include "transfer/value_checksum.h"

static void
s_plan_free (void *plan)
{
    free (plan);
}

static plan_t *
s_plan (kvp_job_t *job)
{
    if (!job->plan) {
        plan_t *plan = (plan_t *) zmalloc (sizeof (plan_t) + job->count * sizeof (plan_item_t));
        plan->count = job->count;
        job->plan = plan;
        job->plan_free = s_plan_free;
    }
    return (plan_t *) job->plan;
}

void
cluster_place_start (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    size_t n = 0;
    for (size_t i = 0; i < job->count; i++)
        n += job->items[i].status == KVPOOL_OK;
    size_t *items = (size_t *) malloc ((n ? n : 1) * sizeof (size_t));
    ProtobufCBinaryData *keys = (ProtobufCBinaryData *) malloc ((n ? n : 1) * sizeof *keys);
    uint64_t *sizes = (uint64_t *) malloc ((n ? n : 1) * sizeof (uint64_t));
    assert (items && keys && sizes);
    n = 0;
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVPOOL_OK) {
            items[n] = i;
            keys[n].data = (uint8_t *) job->items[i].key;
            keys[n].len = job->items[i].key_len;
            sizes[n++] = job->items[i].size;
        }
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = KVPOOL__CLUSTER__V1__KIND__PLACE;
    request.keys = keys;
    request.n_keys = n;
    request.sizes = sizes;
    request.n_sizes = n;
    request.upsert = job->op == KVPOOL__V1__OP__UPSERT;
    char *self_id = (char *) self->args->node_id;
    if (job->op == KVPOOL__V1__OP__PUT_START) {
        //  A same-machine client writes into this node's memory: held here.
        request.replica_num = 1;
        request.preferred = &self_id;
        request.n_preferred = 1;
    }
    else {
        request.replica_num = job->opt.replica_num;
        request.preferred = job->opt.preferred;
        request.n_preferred = job->opt.preferred_count;
    }
    if (cluster_master_send (self, op, &request, items, n) != 0)
        kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "%s is unreachable",
                      master_client_name (self->master));
    free (keys);
    free (sizes);
}

void
cluster_place_reply (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    plan_t *plan = s_plan (job);
    job->opt.replica_num = 1; //  one replica a node: the one here, if any
    if (!reply) {
        //  The master did not answer in time (gone, or frozen): nothing is placed, and the
        //  job fails as a whole (cluster.c, s_call_done).
        for (size_t k = 0; k < call->count; k++)
            job->items[call->items[k]].status = KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS;
        return;
    }
    for (size_t k = 0; k < call->count; k++) {
        kvp_item_t *item = &job->items[call->items[k]];
        plan_item_t *placed = &plan->items[call->items[k]];
        if (reply->status != KVPOOL_OK) {
            //  Refused as a whole (this node is not registered as it was when it asked:
            //  fencing, master.c): nothing placed.
            item->status = reply->status;
            continue;
        }
        if (k >= reply->n_statuses || k >= reply->n_holders) {
            item->status = KVPOOL_INTERNAL_ERROR;
            continue;
        }
        if (reply->statuses[k] != KVPOOL_OK) {
            item->status = reply->statuses[k] == KVPOOL_NO_AVAILABLE_HANDLE ? KVP_ITEM_CLUSTER_FULL
                                                                            : reply->statuses[k];
            continue;
        }
        int holders[KVP_MAX_REPLICAS];
        uint8_t count = cluster_holders (self, reply, reply->holders[k], holders);
        placed->placed = true;
        item->cluster.replicas_placed = count;
        placed->token = k < reply->n_tokens ? reply->tokens[k] : 0;
        item->cluster.token = placed->token; //  a PUT_START's, for its PUT_END
        //  The value's version: its copies here and on the other nodes take it
        item->version = k < reply->n_versions ? reply->versions[k] : 0;
        for (uint8_t h = 0; h < count; h++) {
            if (cluster_is_self (self, holders[h]))
                placed->local = true;
            else
                placed->peers[placed->peer_count++] = holders[h];
        }
        if (k < reply->n_old_holders)
            placed->old_count = cluster_holders (self, reply, reply->old_holders[k], placed->old);
        if (job->op == KVPOOL__V1__OP__PUT_START && !placed->local) {
            item->status = KVPOOL_INTERNAL_ERROR;
            kvp_job_fail (job, KVPOOL_OK, "the master did not place the key on this node");
        }
        else if (!placed->local)
            item->status = KVP_ITEM_ELSEWHERE;
    }
}

//  Items the master found no room for get their status (KVP_ITEM_CLUSTER_FULL): at the end
//  of the job, once no stage of this node can mistake them for a local lack of room.
void
cluster_full_answer (kvp_job_t *job)
{
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVP_ITEM_CLUSTER_FULL)
            job->items[i].status = KVPOOL_NO_AVAILABLE_HANDLE;
}

void
cluster_abort_keys (self_t *self, kvp_job_t *job, bool all)
{
    plan_t *plan = (plan_t *) job->plan;
    size_t n = 0;
    ProtobufCBinaryData *keys =
        (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
    assert (keys);
    for (size_t i = 0; i < job->count; i++) {
        bool placed = plan && plan->items[i].placed;
        int status = job->items[i].status;
        if (all ? job->items[i].key_len > 0
                : (placed && status != KVPOOL_OK && status != KVP_ITEM_ELSEWHERE)) {
            keys[n].data = (uint8_t *) job->items[i].key;
            keys[n++].len = job->items[i].key_len;
        }
    }
    if (n) {
        Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        request.kind = KVPOOL__CLUSTER__V1__KIND__ABORT;
        request.keys = keys;
        request.n_keys = n;
        cluster_master_send (self, NULL, &request, NULL, 0);
    }
    free (keys);
}

//  Tells nodes to drop keys (forced), nobody waiting: a commit that failed after the bytes
//  were written, an upsert's old copies.
static void
s_drop_at (self_t *self, op_t *op, int peer, const char *key, size_t key_len)
{
    ProtobufCBinaryData wire = {key_len, (uint8_t *) key};
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__REMOVE;
    request.keys = &wire;
    request.n_keys = 1;
    request.force = true;
    if (cluster_peer_send (self, op, peer, &request, NULL, 0) != 0 && op)
        cluster_fence_later (self, op, peer);
}

void
cluster_drop_reply (self_t *self, op_t *op, call_t *call, Kvpool__V1__Reply *reply)
{
    //  An upsert's old copy that its node did not confirm dropping (no answer, or refused):
    //  the node is fenced before the client hears, so that it serves the old value no more.
    if (!reply || reply->status != KVPOOL_OK
        || (reply->n_statuses && reply->statuses[0] != KVPOOL_OK
            && reply->statuses[0] != KVPOOL_OBJECT_NOT_FOUND))
        cluster_fence_later (self, op, call->peer);
}

//  The checksum a put's value goes to other nodes with: the one this node's copy worker took
//  as it wrote the replica held here, else the one the client sent (a replica only
//  elsewhere); 0 has the data plane take it as it copies the value into its request.
static uint64_t
s_put_checksum (const kvp_item_t *item)
{
    return item->checksums.value ? item->checksums.value : item->checksums.expect;
}

//  The same for a value in stripes, which the node verifies over its reservation at PUT_END:
//  no copy here saw the value whole (each stripe is copied by the worker that sends it), so
//  an unknown one is taken here, on this thread: only for values over --stripe-size that
//  are not also held here.
static uint64_t
s_striped_checksum (kvp_item_t *item)
{
    if (!item->checksums.value && !item->checksums.expect && item->src && value_checksum_verify ())
        item->checksums.value = value_checksum (item->src, item->size);
    return s_put_checksum (item);
}

//  Phase 0 of a commit: the copies on other nodes, on the data plane's workers, all nodes and
//  all items at once. A value of up to a stripe is one write (an upsert; data_plane.c). A
//  larger one moves in stripes: reserved at the node (step 0), its stripes written in
//  parallel over the workers' connections (step 1), then committed there, or revoked if a
//  stripe failed (step 2). Each step is a run; the next starts when it ends.
void
cluster_commit_start (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    plan_t *plan = (plan_t *) job->plan;
    op->phase = 0;
    op->step = 0;
    if (!plan)
        return;
    run_t *run = cluster_run_new (self, op);
    for (size_t i = 0; i < job->count; i++) {
        plan_item_t *placed = &plan->items[i];
        kvp_item_t *item = &job->items[i];
        if (!placed->placed || (item->status != KVPOOL_OK && item->status != KVP_ITEM_ELSEWHERE))
            continue;
        for (uint8_t h = 0; h < placed->peer_count; h++) {
            data_plane_xfer_t *xfer = cluster_run_add (run, i, placed->peers[h]);
            //  An upsert even for a put: the master reserved the key for this put, so a copy
            //  the node already has can only be an orphan (a commit that failed, whose
            //  removal did not reach it), and it may hold other bytes: it is replaced, never
            //  taken for the value. (A reservation finds such an orphan in the way: that
            //  node gets a whole write instead.)
            xfer->kind =
                item->size > self->config->stripe_size ? DATA_PLANE_RESERVE : DATA_PLANE_WRITE;
            xfer->key = item->key;
            xfer->key_len = item->key_len;
            xfer->src = item->src;
            xfer->size = item->size;
            xfer->checksum = s_put_checksum (item);
            xfer->version = item->version;
        }
    }
    data_plane_put_t put = {job->opt.soft_pin, job->opt.soft_pin_ttl_ms, job->opt.hard_pin};
    cluster_run_start (self, run, &put);
}

//  Which of an item's other nodes a peer is.
static int
s_placed_index (const plan_item_t *placed, int peer)
{
    for (uint8_t h = 0; h < placed->peer_count; h++)
        if (placed->peers[h] == peer)
            return h;
    return -1;
}

//  The stripes of item i to node h of its placement.
static void
s_commit_parts (self_t *self, run_t *run, size_t i, int peer)
{
    kvp_item_t *item = &run->op->job->items[i];
    uint64_t stripe = self->config->stripe_size;
    if ((item->size + stripe - 1) / stripe > MAX_STRIPES)
        stripe = (item->size + MAX_STRIPES - 1) / MAX_STRIPES;
    for (uint64_t offset = 0; offset < item->size; offset += stripe) {
        data_plane_xfer_t *xfer = cluster_run_add (run, i, peer);
        xfer->kind = DATA_PLANE_PART;
        xfer->key = item->key;
        xfer->key_len = item->key_len;
        xfer->offset = offset;
        xfer->src = (const char *) item->src + offset;
        xfer->size = item->size - offset < stripe ? item->size - offset : stripe;
    }
}

//  A step of the copies ended: what was written is recorded, and the next step starts.
void
cluster_commit_copies_done (self_t *self, op_t *op, run_t *run)
{
    kvp_job_t *job = op->job;
    plan_t *plan = (plan_t *) job->plan;
    for (size_t x = 0; x < run->count; x++) {
        plan_item_t *placed = &plan->items[run->items[x]];
        data_plane_xfer_t *xfer = &run->xfers[x];
        int h = s_placed_index (placed, run->peers[x]);
        assert (h >= 0);
        bool written = xfer->status == KVPOOL_OK
                       && (xfer->kind == DATA_PLANE_WRITE || xfer->kind == DATA_PLANE_END);
        if (written) {
            placed->done[placed->done_count++] = run->peers[x];
            self->remote_puts++;
        }
        else if (xfer->kind == DATA_PLANE_RESERVE && xfer->status == KVPOOL_OK)
            placed->reserved |= 1u << h;
        else if (xfer->kind == DATA_PLANE_PART && xfer->status == KVPOOL_OK)
            self->remote_put_parts++;
        else if (xfer->kind == DATA_PLANE_RESERVE && xfer->status == KVPOOL_OBJECT_ALREADY_EXISTS)
            placed->rewrite |= 1u << h;
        else if (xfer->status != KVPOOL_OK) {
            if (xfer->kind == DATA_PLANE_PART)
                placed->part_failed |= 1u << h;
            if (!placed->status && xfer->kind != DATA_PLANE_REVOKE)
                placed->status = xfer->status;
        }
        //  A write that was not answered may still land (the node frozen, the request waiting
        //  in its socket): a copy the master will not list. Nothing more is done about it:
        //  a copy written on the data plane is hidden until its writer confirms it after the
        //  commit, or a read names its version (kvp_object_t.hidden), and neither happens
        //  for a node the commit left out. (Fencing it, as was done before hidden copies,
        //  declared a node dead for one slow answer: every object it held left the
        //  directory until it registered again.)
        if (!xfer->answered)
            self->failures++;
    }
    if (op->step == 2)
        return;
    op->step++;
    run_t *next = cluster_run_new (self, op);
    for (size_t i = 0; i < job->count; i++) {
        plan_item_t *placed = &plan->items[i];
        kvp_item_t *item = &job->items[i];
        for (uint8_t h = 0; h < placed->peer_count; h++) {
            int peer = placed->peers[h];
            if (op->step == 1 && (placed->reserved & (1u << h)))
                s_commit_parts (self, next, i, peer);
            else if (op->step == 1 && (placed->rewrite & (1u << h))) {
                data_plane_xfer_t *xfer = cluster_run_add (next, i, peer);
                xfer->kind = DATA_PLANE_WRITE;
                xfer->key = item->key;
                xfer->key_len = item->key_len;
                xfer->src = item->src;
                xfer->size = item->size;
                xfer->checksum = s_put_checksum (item);
                xfer->version = item->version;
            }
            else if (op->step == 2 && (placed->reserved & (1u << h))) {
                data_plane_xfer_t *xfer = cluster_run_add (next, i, peer);
                xfer->kind = (placed->part_failed & (1u << h)) ? DATA_PLANE_REVOKE : DATA_PLANE_END;
                xfer->key = item->key;
                xfer->key_len = item->key_len;
                if (xfer->kind == DATA_PLANE_END)
                    xfer->checksum = s_striped_checksum (item);
            }
        }
    }
    data_plane_put_t put = {job->opt.soft_pin, job->opt.soft_pin_ttl_ms, job->opt.hard_pin};
    cluster_run_start (self, next, &put);
}

//  Phase 1: the keys with at least one copy are committed at the master, the rest aborted.
void
cluster_commit_master (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    plan_t *plan = (plan_t *) job->plan;
    op->phase = 1;
    cluster_full_answer (job);
    size_t n = 0;
    size_t *items = (size_t *) malloc ((job->count ? job->count : 1) * sizeof (size_t));
    ProtobufCBinaryData *keys =
        (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
    Kvpool__Cluster__V1__Holders *holders =
        (Kvpool__Cluster__V1__Holders *) malloc ((job->count ? job->count : 1) * sizeof *holders);
    Kvpool__Cluster__V1__Holders **holder_ptrs =
        (Kvpool__Cluster__V1__Holders **) malloc ((job->count ? job->count : 1) * sizeof (void *));
    uint32_t *indices =
        (uint32_t *) malloc ((job->count ? job->count : 1) * KVP_MAX_REPLICAS * sizeof (uint32_t));
    uint64_t *tokens = (uint64_t *) malloc ((job->count ? job->count : 1) * sizeof (uint64_t));
    uint64_t *versions = (uint64_t *) malloc ((job->count ? job->count : 1) * sizeof (uint64_t));
    uint64_t *sizes = (uint64_t *) malloc ((job->count ? job->count : 1) * sizeof (uint64_t));
    char **node_ids = (char **) malloc ((self->peer_count + 1) * sizeof (char *));
    int *node_index = (int *) malloc ((self->peer_count + 1) * sizeof (int));
    assert (items && keys && holders && holder_ptrs && indices && tokens && versions && sizes
            && node_ids && node_index);
    for (size_t p = 0; p <= self->peer_count; p++)
        node_index[p] = -1;
    size_t node_count = 0;
    int self_peer = cluster_self_peer (self);
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        plan_item_t *placed = plan ? &plan->items[i] : NULL;
        if (placed && !placed->placed)
            continue;
        bool local =
            placed ? placed->local && item->status == KVPOOL_OK : item->status == KVPOOL_OK;
        if (!placed && !local)
            continue;
        int who[KVP_MAX_REPLICAS + 1];
        size_t count = 0;
        if (local && self_peer >= 0)
            who[count++] = self_peer;
        for (uint8_t d = 0; placed && d < placed->done_count; d++)
            who[count++] = placed->done[d];
        if (count == 0) {
            //  Nowhere: the item fails, its reservation is aborted below.
            if (item->status == KVP_ITEM_ELSEWHERE || item->status == KVPOOL_OK)
                item->status = placed && placed->status ? placed->status : KVPOOL_TRANSFER_FAIL;
            continue;
        }
        kvpool__cluster__v1__holders__init (&holders[n]);
        holders[n].nodes = &indices[n * KVP_MAX_REPLICAS];
        for (size_t w = 0; w < count && holders[n].n_nodes < KVP_MAX_REPLICAS; w++) {
            int peer = who[w];
            if (node_index[peer] < 0) {
                node_index[peer] = (int) node_count;
                node_ids[node_count++] = self->peers[peer]->node_id;
            }
            holders[n].nodes[holders[n].n_nodes++] = (uint32_t) node_index[peer];
        }
        holder_ptrs[n] = &holders[n];
        items[n] = i;
        tokens[n] = placed ? placed->token : item->cluster.token;
        versions[n] = item->version;
        sizes[n] = item->size;
        keys[n].data = (uint8_t *) item->key;
        keys[n++].len = item->key_len;
    }
    cluster_abort_keys (self, job, false);
    if (n == 0)
        free (items);
    else {
        Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        request.kind = KVPOOL__CLUSTER__V1__KIND__COMMIT;
        request.keys = keys;
        request.n_keys = n;
        request.holders = holder_ptrs;
        request.n_holders = n;
        request.nodes = node_ids;
        request.n_nodes = node_count;
        //  The master commits only the write it placed last (a writer stalled past its
        //  reservation commits nothing).
        request.tokens = tokens;
        request.n_tokens = n;
        request.versions = versions;
        request.n_versions = n;
        request.sizes = sizes; //  (an upsert's value may be of another size)
        request.n_sizes = n;
        if (cluster_master_send (self, op, &request, items, n) != 0) {
            //  The bytes are written but the master can't make them visible: undone.
            op->phase = 2;
            for (size_t i = 0; i < job->count; i++) {
                kvp_item_t *item = &job->items[i];
                plan_item_t *placed = plan ? &plan->items[i] : NULL;
                if (item->status != KVPOOL_OK && item->status != KVP_ITEM_ELSEWHERE)
                    continue;
                item->status = KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS;
                if ((placed ? placed->local : true) && self_peer >= 0)
                    s_drop_at (self, NULL, self_peer, item->key, item->key_len);
                for (uint8_t d = 0; placed && d < placed->done_count; d++)
                    s_drop_at (self, NULL, placed->done[d], item->key, item->key_len);
            }
            kvp_job_fail (job, KVPOOL_OK, "%s is unreachable: nothing committed",
                          master_client_name (self->master));
        }
    }
    free (keys);
    free (tokens);
    free (versions);
    free (sizes);
    free (holders);
    free (holder_ptrs);
    free (indices);
    free (node_ids);
    free (node_index);
}

//  The nodes this job's committed items were written to (other than this one) are told, each
//  in one request, nobody waiting: until then they serve those copies to none of their
//  clients (kvp_object_t.hidden, actors/replica_objects.h).
static void
s_confirm (self_t *self, kvp_job_t *job)
{
    plan_t *plan = (plan_t *) job->plan;
    if (!plan)
        return;
    ProtobufCBinaryData *keys =
        (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
    uint64_t *versions = (uint64_t *) malloc ((job->count ? job->count : 1) * sizeof *versions);
    assert (keys && versions);
    for (size_t p = 0; p < self->peer_count; p++) {
        size_t n = 0;
        for (size_t i = 0; i < job->count; i++) {
            const plan_item_t *placed = &plan->items[i];
            const kvp_item_t *item = &job->items[i];
            if (!placed->placed || item->status != KVPOOL_OK)
                continue;
            for (uint8_t d = 0; d < placed->done_count; d++)
                if (placed->done[d] == (int) p) {
                    keys[n].data = (uint8_t *) item->key;
                    keys[n].len = item->key_len;
                    versions[n++] = item->version;
                    break;
                }
        }
        if (n == 0)
            continue;
        Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
        request.op = KVPOOL__V1__OP__CONFIRM;
        request.keys = keys;
        request.n_keys = n;
        request.versions = versions;
        request.n_versions = n;
        cluster_peer_send (self, NULL, (int) p, &request, NULL, 0);
    }
    free (keys);
    free (versions);
}

void
cluster_commit_reply (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    plan_t *plan = (plan_t *) job->plan;
    int self_peer = cluster_self_peer (self);
    for (size_t k = 0; k < call->count; k++) {
        size_t i = call->items[k];
        kvp_item_t *item = &job->items[i];
        plan_item_t *placed = plan ? &plan->items[i] : NULL;
        int status = cluster_key_status (reply, k, KVPOOL_RPC_FAIL);
        if (status == KVPOOL_OK) {
            item->status = KVPOOL_OK;
            if (placed)
                item->cluster.replicas_placed = (uint8_t) (placed->local + placed->done_count);
            cluster_locations_forget (self, item->key); //  (an upsert's old holders)
            //  An upsert's old copies on nodes that do not hold the new value go: those
            //  PLACE named, and those the master had when it committed (a node may have made
            //  a cache copy of the old value in between).
            int old[2 * KVP_MAX_REPLICAS];
            uint8_t old_count = 0;
            for (uint8_t o = 0; placed && o < placed->old_count; o++)
                old[old_count++] = placed->old[o];
            int now[KVP_MAX_REPLICAS];
            uint8_t now_count = k < reply->n_old_holders
                                    ? cluster_holders (self, reply, reply->old_holders[k], now)
                                    : 0;
            for (uint8_t o = 0; o < now_count; o++) {
                bool seen = false;
                for (uint8_t p = 0; p < old_count; p++)
                    seen |= old[p] == now[o];
                if (!seen)
                    old[old_count++] = now[o];
            }
            for (uint8_t o = 0; o < old_count; o++) {
                bool kept = (placed ? placed->local : true) && cluster_is_self (self, old[o]);
                for (uint8_t d = 0; placed && d < placed->done_count; d++)
                    kept |= placed->done[d] == old[o];
                if (!kept)
                    s_drop_at (self, op, old[o], item->key, item->key_len);
            }
            continue;
        }
        //  Not committed: the copies written go again.
        item->status = status;
        if ((placed ? placed->local : true) && self_peer >= 0)
            s_drop_at (self, NULL, self_peer, item->key, item->key_len);
        for (uint8_t d = 0; placed && d < placed->done_count; d++)
            s_drop_at (self, NULL, placed->done[d], item->key, item->key_len);
    }
    s_confirm (self, job);
    if (!reply)
        kvp_job_fail (job, KVPOOL_OK, "%s did not answer the commit",
                      master_client_name (self->master));
}
