/*  cluster_get.c - the cluster actor's gets and lookups: LOCATE, FETCH, EXIST, NODES
    (cluster_op.h).

    What this node does not hold is located at the master and read from a node that holds
    it, one on this node's host first, else the one with fewest calls out (nodes that timed
    out lately last). A value larger than --stripe-size comes as ranged reads over the
    node's connections in parallel, into one buffer; a smaller one is the received frame
    itself, sent on to the client without a copy. A node that fails or does not have the key
    is passed over for the next one; only when none is left is the key missing or failed. A
    large value asked for with redirect is read by the client itself from its node.

    Checksums (transfer/value_checksum.h): a get verifies what it read before it is handed
    on: a whole value on the data plane's worker that received it, a striped one here once
    assembled; a mismatch is counted (checksum_failures) and the next holder read, as for a
    node that failed.

    Threads: the cluster actor's. A fetched value is owned by its job item (item->buffer)
    until it is sent.
*/
#include "actors/cluster_op.h"
#include "messages/ops.h"

#include "infra/log.h"
#include "transfer/value_checksum.h"

static void s_fetch_add (self_t *self, op_t *op, run_t *run, size_t i);
static void s_fetch_order (self_t *self, fetch_t *fetch);
static void s_redirect (self_t *self, kvp_job_t *job, kvp_item_t *item, const fetch_t *fetch);
static bool s_redirects (const kvp_job_t *job, const kvp_item_t *item);

//  Asks the master kind about n keys (with their versions, or NULL) for op's job items
//  items[0..n), which the call owns; items of a call that cannot go are UNAVAILABLE.
static void
s_master_keys (self_t *self, op_t *op, Kvpool__Cluster__V1__Kind kind, ProtobufCBinaryData *keys,
               uint64_t *versions, size_t *items, size_t n)
{
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = kind;
    request.keys = keys;
    request.n_keys = n;
    if (versions) {
        request.versions = versions;
        request.n_versions = n;
    }
    if (n == 0) {
        free (items);
        return;
    }
    //  (A call that cannot go frees items before it says so: the indices are kept here.)
    size_t *which = (size_t *) malloc (n * sizeof (size_t));
    assert (which);
    memcpy (which, items, n * sizeof (size_t));
    if (cluster_master_send (self, op, &request, items, n) != 0)
        for (size_t k = 0; k < n; k++)
            op->job->items[which[k]].status = KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS;
    free (which);
}

//  A get's items whose holders this node knows (cluster_locations.c) go to them at once, or
//  to the client in one hop: no master round trip. Returns whether item i was so served.
static bool
s_fetch_known (self_t *self, op_t *op, run_t **run_p, size_t i)
{
    kvp_job_t *job = op->job;
    kvp_item_t *item = &job->items[i];
    if (!op->fetch) {
        op->fetch = (fetch_t *) zmalloc (job->count * sizeof (fetch_t));
        kvp_job_need_replicas (job);
    }
    fetch_t *fetch = &op->fetch[i];
    if (fetch->relocate || !cluster_locations_find (self, item->key, fetch, item))
        return false;
    s_fetch_order (self, fetch);
    if (s_redirects (job, item)) {
        s_redirect (self, job, item, fetch);
        if (item->status == KVPOOL_REDIRECT) {
            self->location_hits++;
            return true;
        }
    }
    if (!*run_p)
        *run_p = cluster_run_new (self, op);
    s_fetch_add (self, op, *run_p, i);
    return true;
}

void
cluster_locate_start (self_t *self, op_t *op, bool missing_only)
{
    kvp_job_t *job = op->job;
    size_t n = 0;
    size_t *items = (size_t *) malloc ((job->count ? job->count : 1) * sizeof (size_t));
    ProtobufCBinaryData *keys =
        (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
    assert (items && keys);
    run_t *known = NULL;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (missing_only ? item->status != KVPOOL_OBJECT_NOT_FOUND
                         : (item->status != KVPOOL_OK || item->key_len == 0))
            continue;
        //  (a repair's copy is of the holders the master has now: a holder it knew before
        //  may be the node that died)
        if (job->kind == KVP_CL_FETCH && job->op != KVP_OP_REPAIR_FILL
            && s_fetch_known (self, op, &known, i))
            continue;
        items[n] = i;
        keys[n].data = (uint8_t *) item->key;
        keys[n++].len = item->key_len;
    }
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = KVPOOL__CLUSTER__V1__KIND__LOCATE;
    request.keys = keys;
    request.n_keys = n;
    if (n == 0)
        free (items);
    else if (cluster_master_send (self, op, &request, items, n) != 0) {
        for (size_t i = 0; i < job->count; i++)
            if (missing_only && job->items[i].status == KVPOOL_OBJECT_NOT_FOUND)
                job->items[i].status = KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS;
        kvp_job_fail (job, missing_only ? KVPOOL_OK : KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS,
                      "%s is unreachable", master_client_name (self->master));
    }
    free (keys);
    if (known)
        cluster_run_start (self, known, NULL);
}

static void
s_msg_free (void *buffer)
{
    zmq_msg_t *msg = (zmq_msg_t *) buffer;
    zmq_msg_close (msg);
    free (msg);
}

static void s_fetch_add (self_t *self, op_t *op, run_t *run, size_t i);

//  The order in which a get tries the nodes that hold an item: this host's first, then the
//  least busy; nodes that timed out lately last.
static void
s_fetch_order (self_t *self, fetch_t *fetch)
{
    int64_t now = zclock_mono ();
    for (uint8_t a = 1; a < fetch->count; a++) {
        int peer = fetch->peers[a];
        uint8_t b = a;
        while (b > 0) {
            peer_t *x = self->peers[peer], *y = self->peers[fetch->peers[b - 1]];
            int rank_x =
                (x->suspect_until > now) * 4 + (strcmp (x->host_id, self->args->host_id) != 0) * 2;
            int rank_y =
                (y->suspect_until > now) * 4 + (strcmp (y->host_id, self->args->host_id) != 0) * 2;
            if (rank_x > rank_y || (rank_x == rank_y && x->calls_out >= y->calls_out))
                break;
            fetch->peers[b] = fetch->peers[b - 1];
            b--;
        }
        fetch->peers[b] = peer;
    }
}

//  The client reads item's value from a node that holds it, in one hop: its status says so,
//  and its locations name those nodes (job->nodes, the reply's node list), in the order the
//  get would read them.
static void
s_redirect (self_t *self, kvp_job_t *job, kvp_item_t *item, const fetch_t *fetch)
{
    item->status = KVPOOL_REDIRECT;
    self->redirects++;
    item->cluster.location_count = 0;
    for (uint8_t h = 0; h < fetch->count && item->cluster.location_count < KVP_MAX_REPLICAS; h++) {
        const peer_t *node = self->peers[fetch->peers[h]];
        if (!node->client_endpoint[0])
            continue;
        size_t index = 0;
        while (index < job->nodes.count && strcmp (job->nodes.list[index].node_id, node->node_id))
            index++;
        if (index == job->nodes.count) {
            kvp_node_info_t *grown = (kvp_node_info_t *) realloc (
                job->nodes.list, (job->nodes.count + 1) * sizeof (kvp_node_info_t));
            assert (grown);
            job->nodes.list = grown;
            kvp_node_info_t *to = &job->nodes.list[job->nodes.count++];
            memset (to, 0, sizeof *to);
            snprintf (to->node_id, sizeof to->node_id, "%s", node->node_id);
            snprintf (to->host_id, sizeof to->host_id, "%s", node->host_id);
            snprintf (to->client_endpoint, sizeof to->client_endpoint, "%.255s",
                      node->client_endpoint);
            snprintf (to->curve_key, sizeof to->curve_key, "%s", node->curve_key);
            to->alive = true;
        }
        item->cluster.locations[item->cluster.location_count++] = (uint16_t) index;
    }
    if (item->cluster.location_count == 0) {
        item->status = KVPOOL_OBJECT_NOT_FOUND; //  (fetched from a peer below)
        self->redirects--;
    }
}

//  Whether a get of item goes to the client in one hop (a whole value of REDIRECT_MIN_BYTES
//  or more, for a client that asked for redirects).
static bool
s_redirects (const kvp_job_t *job, const kvp_item_t *item)
{
    return job->opt.redirect && !job->opt.ranged && item->size >= REDIRECT_MIN_BYTES;
}

void
cluster_fetch_located (self_t *self, op_t *op, call_t *call,
                       Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    if (!op->fetch)
        op->fetch = (fetch_t *) zmalloc (job->count * sizeof (fetch_t));
    kvp_job_need_replicas (job);
    for (size_t k = 0; k < call->count; k++) {
        size_t i = call->items[k];
        kvp_item_t *item = &job->items[i];
        fetch_t *fetch = &op->fetch[i];
        int status = cluster_key_status (reply, k, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
        if (status != KVPOOL_OK) {
            item->status = status;
            continue;
        }
        int holders[KVP_MAX_REPLICAS];
        uint8_t count = cluster_holders (self, reply, reply->holders[k], holders);
        bool relocated = fetch->relocated;
        memset (fetch, 0, sizeof *fetch);
        fetch->relocated = relocated;
        int self_holder = -1;
        for (uint8_t h = 0; h < count; h++)
            if (!cluster_is_self (self, holders[h]))
                fetch->peers[fetch->count++] = holders[h];
            else
                self_holder = holders[h];
        item->size = k < reply->n_sizes ? reply->sizes[k] : 0;
        item->version = k < reply->n_versions ? reply->versions[k] : 0;
        //  Kept for the next get of the key: no master round trip then.
        if (fetch->count)
            cluster_locations_learn (self, item->key, item->version, item->size, holders, count);
        s_fetch_order (self, fetch);
        //  This node, last: its own read found nothing servable, but the master has it hold
        //  this version: a copy another node wrote here whose CONFIRM has not come
        //  (kvp_object_t.hidden), which a read of the version confirms; or this node is not
        //  serving now (its lease, infra/config.h), which its answer says.
        if (self_holder >= 0 && item->version)
            fetch->peers[fetch->count++] = self_holder;
        if (fetch->count == 0) {
            item->status = KVPOOL_OBJECT_NOT_FOUND;
            continue;
        }
        if (s_redirects (job, item))
            s_redirect (self, job, item, fetch);
    }
    //  Small values to one node go in one request; large ones in stripes.
    run_t *run = cluster_run_new (self, op);
    for (size_t k = 0; k < call->count; k++) {
        size_t i = call->items[k];
        if (op->fetch[i].count && job->items[i].status == KVPOOL_OBJECT_NOT_FOUND)
            s_fetch_add (self, op, run, i);
    }
    cluster_run_start (self, run, NULL);
    if (!reply)
        kvp_job_fail (job, KVPOOL_OK, "%s did not answer", master_client_name (self->master));
}

//  Adds the reads of item i from its next candidate to run: the whole value, or stripes of
//  it into one buffer. Marks the item failed when no candidate is left.
static void
s_fetch_add (self_t *self, op_t *op, run_t *run, size_t i)
{
    kvp_job_t *job = op->job;
    kvp_item_t *item = &job->items[i];
    fetch_t *fetch = &op->fetch[i];
    if (item->buffer) {
        item->buffer_free (item->buffer);
        item->buffer = NULL;
    }
    if (fetch->next == fetch->count && !fetch->corrupt
        && (fetch->known || (!fetch->relocated && !fetch->any_failure))) {
        //  No holder it knew of has that version now (or answers): located at the master
        //  after all. So is a key whose holders the master named had no more the version it
        //  named (reads name it: kvp_object_t.hidden), once. (A holder that sent bytes that
        //  did not verify would be named again: the key fails as it would have.)
        cluster_locations_forget (self, item->key);
        bool relocated = !fetch->known || fetch->relocated;
        memset (fetch, 0, sizeof *fetch);
        fetch->relocate = true;
        fetch->relocated = relocated;
        item->status = KVPOOL_OBJECT_NOT_FOUND;
        return;
    }
    if (fetch->next == fetch->count) {
        if (fetch->known)
            cluster_locations_forget (self, item->key);
        item->status = fetch->any_failure ? KVPOOL_TRANSFER_FAIL : KVPOOL_OBJECT_NOT_FOUND;
        return;
    }
    int peer = fetch->peers[fetch->next++];
    uint64_t stripe = self->config->stripe_size;
    uint64_t stripes = item->size > stripe ? (item->size + stripe - 1) / stripe : 1;
    if (stripes > MAX_STRIPES) {
        stripe = (item->size + MAX_STRIPES - 1) / MAX_STRIPES;
        stripes = (item->size + stripe - 1) / stripe;
    }
    char *buffer = NULL;
    if (stripes > 1) {
        buffer = (char *) malloc (item->size);
        if (!buffer) {
            item->status = KVPOOL_INTERNAL_ERROR;
            return;
        }
        item->buffer = buffer;
        item->buffer_free = free;
        item->replicas[0].addr = buffer;
    }
    for (uint64_t s = 0; s < stripes; s++) {
        data_plane_xfer_t *xfer = cluster_run_add (run, i, peer);
        xfer->kind = DATA_PLANE_READ;
        xfer->key = item->key;
        xfer->key_len = item->key_len;
        xfer->size = item->size; //  as the master knows it: the room for a read by RDMA
        //  The version the master (or a known location) named: no other, and only under the
        //  holder's lease. A copy its writer has yet to confirm is served to such a read
        //  (kvp_object_t.hidden): the read races the writer's CONFIRM after a put returns.
        xfer->version = item->version;
        if (stripes > 1) {
            xfer->offset = s * stripe;
            xfer->length = item->size - xfer->offset < stripe ? item->size - xfer->offset : stripe;
            xfer->dst = buffer + xfer->offset;
        }
    }
}

//  A value read from a node did not match its checksum: counted, and never served (the
//  next holder is read instead, as for a node that failed).
static void
s_checksum_failed (self_t *self, kvp_item_t *item, int peer)
{
    self->checksum_failures++;
    kvp_warning ("the value of '%s' read from node %s does not match its checksum: "
                 "reading another replica",
                 item->key, self->peers[peer]->node_id);
}

//  A get's reads ended: items read whole or in every stripe are done; the others are read
//  again from their next candidate, in a run of their own.
void
cluster_fetch_done (self_t *self, op_t *op, run_t *run)
{
    kvp_job_t *job = op->job;
    run_t *again = cluster_run_new (self, op);
    for (size_t x = 0; x < run->count;) {
        size_t i = run->items[x], first = x;
        kvp_item_t *item = &job->items[i];
        fetch_t *fetch = &op->fetch[i];
        bool ok = true;
        for (; x < run->count && run->items[x] == i; x++) {
            data_plane_xfer_t *xfer = &run->xfers[x];
            if (xfer->status == KVPOOL_OK) {
                self->remote_get_parts += xfer->length > 0;
                continue;
            }
            ok = false;
            if (xfer->corrupt) {
                s_checksum_failed (self, item, run->peers[x]);
                fetch->corrupt = true;
            }
            if (xfer->status != KVPOOL_OBJECT_NOT_FOUND)
                fetch->any_failure = true;
            if (!xfer->answered) {
                self->peers[run->peers[x]]->suspect_until = zclock_mono () + SUSPECT_MS;
                self->peers[run->peers[x]]->epoch++;
                self->failures++;
            }
        }
        //  A value in stripes is verified here, whole, once they are all in.
        uint64_t checksum = run->xfers[first].checksum;
        if (ok && item->buffer && checksum && value_checksum_verify ()
            && value_checksum (item->buffer, item->size) != checksum) {
            s_checksum_failed (self, item, run->peers[first]);
            fetch->any_failure = fetch->corrupt = true;
            ok = false;
        }
        if (!ok) {
            //  This node could not serve it: the next one is tried.
            s_fetch_add (self, op, again, i);
            continue;
        }
        item->checksums.value = checksum; //  sent on with the value (Reply.checksums)
        if (!item->buffer) {
            //  Read whole: the received message is the value, sent on without a copy.
            zmq_msg_t *msg = (zmq_msg_t *) malloc (sizeof (zmq_msg_t));
            assert (msg);
            zmq_msg_init (msg);
            zmq_msg_move (msg, &run->xfers[first].frame);
            item->buffer = msg;
            item->buffer_free = s_msg_free;
            item->size = zmq_msg_size (msg);
            item->replicas[0].addr = zmq_msg_data (msg);
        }
        item->replica_count = 0;
        item->status = KVPOOL_OK;
        item->src = item->replicas[0].addr; //  (a copy for the hot cache is written from it)
        if (run->xfers[first].version)
            item->version = run->xfers[first].version; //  the version read
        self->location_hits += fetch->known;
        //  (a copy for the hot cache is no client's get)
        if (job->op != KVP_OP_CACHE_FILL && job->op != KVP_OP_REPAIR_FILL) {
            self->remote_gets++;
            self->remote_get_bytes += item->size;
        }
    }
    cluster_run_start (self, again, NULL);
    //  Items no known holder had: located at the master now.
    size_t n = 0;
    size_t *items = (size_t *) malloc ((job->count ? job->count : 1) * sizeof (size_t));
    ProtobufCBinaryData *keys =
        (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
    assert (items && keys);
    for (size_t i = 0; i < job->count; i++)
        if (op->fetch[i].relocate) {
            op->fetch[i].relocate = false;
            items[n] = i;
            keys[n].data = (uint8_t *) job->items[i].key;
            keys[n++].len = job->items[i].key_len;
        }
    s_master_keys (self, op, KVPOOL__CLUSTER__V1__KIND__LOCATE, keys, NULL, items, n);
    free (keys);
}

void
cluster_exist_reply (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    for (size_t k = 0; k < call->count; k++) {
        kvp_item_t *item = &job->items[call->items[k]];
        int status = cluster_key_status (reply, k, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
        uint64_t version = status == KVPOOL_OK && k < reply->n_versions ? reply->versions[k] : 0;
        //  Asked about one version (Request.versions): another is not the object asked for.
        if (status == KVPOOL_OK && item->version && version && item->version != version)
            status = KVPOOL_OBJECT_NOT_FOUND;
        item->status = status;
        if (status == KVPOOL_OK) {
            item->size = k < reply->n_sizes ? reply->sizes[k] : 0;
            item->version = version;
        }
    }
    if (!reply)
        kvp_job_fail (job, KVPOOL_OK, "%s did not answer", master_client_name (self->master));
}

//  LOCATE and NODES: the master's nodes as the client protocol names them.
void
cluster_nodes_reply (self_t *self, op_t *op, call_t *call, Kvpool__Cluster__V1__MasterReply *reply)
{
    kvp_job_t *job = op->job;
    if (!cluster_master_answered (self, job, reply))
        return;
    job->nodes.list =
        (kvp_node_info_t *) calloc (reply->n_nodes ? reply->n_nodes : 1, sizeof (kvp_node_info_t));
    assert (job->nodes.list);
    job->nodes.count = reply->n_nodes;
    for (size_t n = 0; n < reply->n_nodes; n++) {
        const Kvpool__Cluster__V1__Node *from = reply->nodes[n];
        kvp_node_info_t *to = &job->nodes.list[n];
        snprintf (to->node_id, sizeof to->node_id, "%s", from->node_id);
        snprintf (to->host_id, sizeof to->host_id, "%s", from->host_id);
        snprintf (to->client_endpoint, sizeof to->client_endpoint, "%s", from->client_endpoint);
        snprintf (to->curve_key, sizeof to->curve_key, "%s", from->curve_key);
        to->capacity = from->capacity;
        to->free = from->free;
        to->alive = from->alive;
        to->objects = from->objects;
        to->last_heard_ms = from->last_heard_ms;
    }
    for (size_t k = 0; call && k < call->count; k++) {
        kvp_item_t *item = &job->items[call->items[k]];
        item->status = k < reply->n_statuses ? reply->statuses[k] : KVPOOL_INTERNAL_ERROR;
        if (item->status != KVPOOL_OK)
            continue;
        item->size = k < reply->n_sizes ? reply->sizes[k] : 0;
        item->version = k < reply->n_versions ? reply->versions[k] : 0;
        const Kvpool__Cluster__V1__Holders *holders =
            k < reply->n_holders ? reply->holders[k] : NULL;
        uint32_t caches = k < reply->n_caches ? reply->caches[k] : 0;
        //  (the replicas: nodes that keep a cache copy are not where the key lives)
        for (size_t h = 0;
             holders && h < holders->n_nodes && item->cluster.location_count < KVP_MAX_REPLICAS;
             h++)
            if (!((caches >> h) & 1))
                item->cluster.locations[item->cluster.location_count++] =
                    (uint16_t) holders->nodes[h];
    }
}

//  CACHE: this node keeps copies of the items (key, version) the replica-manager holds hidden
//  (item->object_id); the master takes it as a cache holder of each, or refuses the ones
//  whose version is no longer the key's (they are not OK, and go).
void
cluster_cache_claim (self_t *self, op_t *op)
{
    kvp_job_t *job = op->job;
    size_t n = 0;
    size_t *items = (size_t *) malloc ((job->count ? job->count : 1) * sizeof (size_t));
    ProtobufCBinaryData *keys =
        (ProtobufCBinaryData *) malloc ((job->count ? job->count : 1) * sizeof *keys);
    uint64_t *versions = (uint64_t *) malloc ((job->count ? job->count : 1) * sizeof (uint64_t));
    assert (items && keys && versions);
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK || !item->object_id)
            continue;
        items[n] = i;
        keys[n].data = (uint8_t *) item->key;
        keys[n].len = item->key_len;
        versions[n++] = item->version;
    }
    //  (a repair's copy is claimed as a replica: master/repair.c)
    s_master_keys (self, op,
                   job->op == KVP_OP_REPAIR_FILL ? KVPOOL__CLUSTER__V1__KIND__REPAIRED
                                                 : KVPOOL__CLUSTER__V1__KIND__CACHE,
                   keys, versions, items, n);
    free (keys);
    free (versions);
}

void
cluster_cache_claimed (self_t *self, op_t *op, call_t *call,
                       Kvpool__Cluster__V1__MasterReply *reply)
{
    (void) self;
    for (size_t k = 0; k < call->count; k++) {
        kvp_item_t *item = &op->job->items[call->items[k]];
        item->status = cluster_key_status (reply, k, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
    }
}
