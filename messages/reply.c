/*  reply.c - job results as a Reply (reply.h). */
#include "messages/reply.h"

#include <assert.h>
#include <stdio.h>

//  n elements of size bytes from the request's arena (NULL when out of memory).
static void *
s_array (arena_t *arena, size_t n, size_t size)
{
    return arena_alloc (arena, (n ? n : 1) * size);
}

uint32_t
reply_replicas_placed (const kvp_job_t *job, const kvp_item_t *item)
{
    if (job->status != KVPOOL_OK || item->status != KVPOOL_OK)
        return 0;
    return item->cluster.replicas_placed ? item->cluster.replicas_placed : item->replica_count;
}

int
reply_encode (arena_t *arena, const kvp_op_t *row, const kvp_job_t *job, Kvpool__V1__Reply *reply)
{
    size_t n = job->count;
    if (n) {
        int32_t *statuses = (int32_t *) s_array (arena, n, sizeof (int32_t));
        if (!statuses)
            return -1;
        for (size_t i = 0; i < n; i++) {
            int status = job->status != KVPOOL_OK ? job->status : job->items[i].status;
            //  A job cut short may leave a node-internal item status (kvp_job.h): the item
            //  was not stored, and a client never sees such a number.
            statuses[i] = status == KVP_ITEM_CLUSTER_FULL ? KVPOOL_NO_AVAILABLE_HANDLE
                          : status > 0                    ? KVPOOL_INTERNAL_ERROR
                                                          : status;
        }
        reply->n_statuses = n;
        reply->statuses = statuses;
    }
    if (row->fills & REPLY_SIZES) {
        uint64_t *sizes = (uint64_t *) s_array (arena, n, sizeof (uint64_t));
        if (!sizes)
            return -1;
        for (size_t i = 0; i < n; i++)
            sizes[i] = job->items[i].status == KVPOOL_OK ? job->items[i].size : 0;
        reply->n_sizes = n;
        reply->sizes = sizes;
    }
    //  Each key's version, where known (none at all when none is).
    //  (A REDIRECT's too: the client reads that version from the holders named.)
    bool any_version = false;
    for (size_t i = 0; i < n && !any_version; i++)
        any_version = (job->items[i].status == KVPOOL_OK || job->items[i].status == KVPOOL_REDIRECT)
                      && job->items[i].version;
    if (any_version) {
        uint64_t *versions = (uint64_t *) s_array (arena, n, sizeof (uint64_t));
        if (!versions)
            return -1;
        for (size_t i = 0; i < n; i++)
            versions[i] =
                job->items[i].status == KVPOOL_OK || job->items[i].status == KVPOOL_REDIRECT
                    ? job->items[i].version
                    : 0;
        reply->n_versions = n;
        reply->versions = versions;
    }
    //  A put's replicas: how many each key got, which may be fewer than it asked for.
    if (row->op == KVPOOL__V1__OP__PUT || row->op == KVPOOL__V1__OP__UPSERT
        || row->op == KVPOOL__V1__OP__PUT_START) {
        uint32_t *placed = (uint32_t *) s_array (arena, n, sizeof (uint32_t));
        if (!placed)
            return -1;
        for (size_t i = 0; i < n; i++)
            placed[i] = reply_replicas_placed (job, &job->items[i]);
        reply->n_replicas_placed = n;
        reply->replicas_placed = placed;
    }
    //  A GET's checksums: of each whole value, where known (none at all when none is).
    bool any_checksum = false;
    for (size_t i = 0; (row->fills & REPLY_VALUES) && i < n && !any_checksum; i++)
        any_checksum = job->items[i].status == KVPOOL_OK && job->items[i].checksums.value;
    if (any_checksum) {
        uint64_t *checksums = (uint64_t *) s_array (arena, n, sizeof (uint64_t));
        if (!checksums)
            return -1;
        for (size_t i = 0; i < n; i++)
            checksums[i] = job->items[i].status == KVPOOL_OK ? job->items[i].checksums.value : 0;
        reply->n_checksums = n;
        reply->checksums = checksums;
    }
    if (row->fills & REPLY_REPLICAS) {
        size_t total = 0;
        for (size_t i = 0; i < n; i++)
            if (job->items[i].status == KVPOOL_OK)
                total += job->items[i].replica_count;
        Kvpool__V1__KeyReplicas *keys =
            (Kvpool__V1__KeyReplicas *) s_array (arena, n, sizeof *keys);
        Kvpool__V1__KeyReplicas **key_ptrs =
            (Kvpool__V1__KeyReplicas **) s_array (arena, n, sizeof *key_ptrs);
        Kvpool__V1__Replica *replicas =
            (Kvpool__V1__Replica *) s_array (arena, total, sizeof *replicas);
        Kvpool__V1__Replica **replica_ptrs =
            (Kvpool__V1__Replica **) s_array (arena, total, sizeof *replica_ptrs);
        if (!keys || !key_ptrs || !replicas || !replica_ptrs)
            return -1;
        size_t next = 0;
        for (size_t i = 0; i < n; i++) {
            kvpool__v1__key_replicas__init (&keys[i]);
            key_ptrs[i] = &keys[i];
            const kvp_item_t *item = &job->items[i];
            if (item->status != KVPOOL_OK)
                continue;
            keys[i].replicas = &replica_ptrs[next];
            keys[i].n_replicas = item->replica_count;
            for (uint32_t r = 0; r < item->replica_count; r++, next++) {
                kvpool__v1__replica__init (&replicas[next]);
                replicas[next].segment_id = item->replicas[r].segment_id;
                replicas[next].offset = item->replicas[r].offset;
                replica_ptrs[next] = &replicas[next];
            }
        }
        reply->n_replicas = n;
        reply->replicas = key_ptrs;
    }
    if ((row->fills & REPLY_NODES) || job->nodes.count) {
        size_t count = job->nodes.count;
        Kvpool__V1__NodeInfo *nodes =
            (Kvpool__V1__NodeInfo *) s_array (arena, count, sizeof *nodes);
        Kvpool__V1__NodeInfo **node_ptrs =
            (Kvpool__V1__NodeInfo **) s_array (arena, count, sizeof *node_ptrs);
        if (!nodes || !node_ptrs)
            return -1;
        for (size_t i = 0; i < count; i++) {
            const kvp_node_info_t *info = &job->nodes.list[i];
            kvpool__v1__node_info__init (&nodes[i]);
            nodes[i].node_id = (char *) info->node_id;
            nodes[i].host_id = (char *) info->host_id;
            nodes[i].client_endpoint = (char *) info->client_endpoint;
            nodes[i].curve_key = (char *) info->curve_key;
            nodes[i].capacity = info->capacity;
            nodes[i].free = info->free;
            nodes[i].alive = info->alive;
            nodes[i].objects = info->objects;
            nodes[i].last_heard_ms = info->last_heard_ms;
            node_ptrs[i] = &nodes[i];
        }
        reply->n_nodes = count;
        reply->nodes = node_ptrs;
        if (job->op == KVPOOL__V1__OP__LOCATE || job->op == KVPOOL__V1__OP__GET) {
            Kvpool__V1__KeyNodes *keys = (Kvpool__V1__KeyNodes *) s_array (arena, n, sizeof *keys);
            Kvpool__V1__KeyNodes **key_ptrs =
                (Kvpool__V1__KeyNodes **) s_array (arena, n, sizeof *key_ptrs);
            uint32_t *indices =
                (uint32_t *) s_array (arena, n * KVP_MAX_REPLICAS, sizeof (uint32_t));
            if (!keys || !key_ptrs || !indices)
                return -1;
            for (size_t i = 0; i < n; i++) {
                const kvp_item_t *item = &job->items[i];
                kvpool__v1__key_nodes__init (&keys[i]);
                key_ptrs[i] = &keys[i];
                if (item->status != KVPOOL_OK && item->status != KVPOOL_REDIRECT)
                    continue;
                keys[i].nodes = &indices[i * KVP_MAX_REPLICAS];
                for (uint8_t l = 0; l < item->cluster.location_count && l < KVP_MAX_REPLICAS; l++)
                    if (item->cluster.locations[l] < count)
                        keys[i].nodes[keys[i].n_nodes++] = item->cluster.locations[l];
            }
            reply->n_locations = n;
            reply->locations = key_ptrs;
        }
    }
    if (row->fills & REPLY_SEGMENTS) {
        //  The job's list (SEGMENTS), or the one segment a MOUNT made.
        bool mounted = job->segments.count == 0 && job->status == KVPOOL_OK
                       && job->payload == KVP_PAYLOAD_SEGMENT && job->segment.name;
        size_t count = mounted ? 1 : job->segments.count;
        if (count == 0)
            return 0;
        Kvpool__V1__Segment *segments =
            (Kvpool__V1__Segment *) s_array (arena, count, sizeof *segments);
        Kvpool__V1__Segment **segment_ptrs =
            (Kvpool__V1__Segment **) s_array (arena, count, sizeof *segment_ptrs);
        if (!segments || !segment_ptrs)
            return -1;
        for (size_t i = 0; i < count; i++) {
            kvpool__v1__segment__init (&segments[i]);
            segment_ptrs[i] = &segments[i];
        }
        if (mounted) {
            segments->id = job->segment.id;
            segments->name = (char *) job->segment.name;
            segments->size = job->segment.size;
            segments->owner = (char *) (job->segment.owner ? job->segment.owner : "");
        }
        else
            for (size_t i = 0; i < count; i++) {
                segments[i].id = job->segments.list[i].id;
                segments[i].name = job->segments.list[i].name;
                segments[i].size = job->segments.list[i].size;
                segments[i].used = job->segments.list[i].used;
                segments[i].owner = job->segments.list[i].owner;
                segments[i].device = job->segments.list[i].device;
                segments[i].inode = job->segments.list[i].inode;
            }
        reply->n_segments = count;
        reply->segments = segment_ptrs;
    }
    return 0;
}

void
reply_stats (const kvp_stats_t *from, Kvpool__V1__Stats *to)
{
#define REPLY_STATS_COPY(type, name, text) to->name = from->name;
    KVPOOL_STATS_FIELDS (REPLY_STATS_COPY)
#undef REPLY_STATS_COPY
}

//  ---- self test ---------------------------------------------------------------------

void
reply_test (bool verbose)
{
    arena_t arena;
    arena_init (&arena, 0);
    //  A replica list of two keys: one found on two segments, one missing.
    kvp_job_t *job = kvp_job_new (KVP_RM_REPLICA_LIST, 2);
    kvp_job_need_replicas (job);
    job->items[0].size = 100;
    job->items[0].replica_count = 2;
    job->items[0].replicas[0] = (kvp_replica_t){1, 4096, NULL};
    job->items[0].replicas[1] = (kvp_replica_t){2, 8192, NULL};
    job->items[1].status = KVPOOL_OBJECT_NOT_FOUND;
    job->items[1].size = 7; //  not reported for a key that failed
    Kvpool__V1__Reply reply = KVPOOL__V1__REPLY__INIT;
    assert (reply_encode (&arena, kvp_op (KVPOOL__V1__OP__GET_REPLICA_LIST), job, &reply) == 0);
    uint8_t buffer[512];
    size_t size = kvpool__v1__reply__pack (&reply, buffer);
    Kvpool__V1__Reply *back = kvpool__v1__reply__unpack (NULL, size, buffer);
    assert (back && back->n_statuses == 2 && back->statuses[1] == KVPOOL_OBJECT_NOT_FOUND);
    assert (back->n_sizes == 2 && back->sizes[0] == 100 && back->sizes[1] == 0);
    assert (back->n_replicas == 2 && back->replicas[0]->n_replicas == 2);
    assert (back->replicas[0]->replicas[1]->segment_id == 2);
    assert (back->replicas[0]->replicas[1]->offset == 8192);
    assert (back->replicas[1]->n_replicas == 0 && back->n_segments == 0);
    kvpool__v1__reply__free_unpacked (back, NULL);
    //  A GET sends each found value's checksum, 0 for the others; none when none is known.
    kvp_job_t *get = kvp_job_new (KVP_RM_GET, 2);
    get->items[0].size = 5;
    get->items[1].status = KVPOOL_OBJECT_NOT_FOUND;
    get->items[1].checksums.value = 7; //  not reported for a key that failed
    Kvpool__V1__Reply unknown = KVPOOL__V1__REPLY__INIT;
    assert (reply_encode (&arena, kvp_op (KVPOOL__V1__OP__GET), get, &unknown) == 0);
    assert (unknown.n_checksums == 0);
    get->items[0].checksums.value = 0x1234567890abcdefULL;
    Kvpool__V1__Reply known = KVPOOL__V1__REPLY__INIT;
    assert (reply_encode (&arena, kvp_op (KVPOOL__V1__OP__GET), get, &known) == 0);
    assert (known.n_checksums == 2 && known.checksums[0] == 0x1234567890abcdefULL
            && known.checksums[1] == 0);
    kvp_job_destroy (&get);
    //  A failed job reports its status for every key; an EXIST fills no sizes.
    kvp_job_fail (job, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "stopping");
    Kvpool__V1__Reply failed = KVPOOL__V1__REPLY__INIT;
    assert (reply_encode (&arena, kvp_op (KVPOOL__V1__OP__EXIST), job, &failed) == 0);
    assert (failed.n_statuses == 2 && failed.n_sizes == 0 && failed.n_replicas == 0);
    assert (failed.statuses[0] == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
    kvp_job_destroy (&job);
    //  Stats: every field.
    kvp_stats_t stats = {0};
    stats.objects = 3;
    stats.utilisation = 0.5;
    stats.index_gets = 9;
    Kvpool__V1__Stats out = KVPOOL__V1__STATS__INIT;
    reply_stats (&stats, &out);
    assert (out.objects == 3 && out.utilisation == 0.5 && out.index_gets == 9);
    arena_fini (&arena);
    if (verbose)
        printf ("statuses, sizes, replicas, stats ");
}
