/*  master_reply.c - a master's reply under construction (master_reply.h). */
#include "master/master_reply.h"

#include <czmq.h>
#include <stdarg.h>

#include "infra/log.h"
#include "kvpool_status.h"
#include "protocol/status.h"

void
master_reply_start (reply_t *r, arena_t *arena, node_table_t *nodes, uint32_t *node_index)
{
    r->arena = arena;
    r->nodes_capacity = 0;
    r->nodes = nodes;
    r->node_index = node_index;
    memset (node_index, 0, NODE_TABLE_MAX * sizeof (uint32_t));
}

int
master_reply_fail (reply_t *r, int status, const char *format, ...)
{
    char *error = (char *) arena_alloc (r->arena, 400);
    if (error) {
        va_list args;
        va_start (args, format);
        vsnprintf (error, 400, format, args);
        va_end (args);
        r->reply.error = error;
    }
    r->reply.status = status;
    return status;
}

//  Arrays for n keys' statuses (and, as asked, sizes and holders). Returns 0 or -1.
int
master_reply_keys (reply_t *r, size_t n, bool sizes, bool holders)
{
    Kvpool__Cluster__V1__MasterReply *reply = &r->reply;
    reply->statuses = (int32_t *) arena_alloc (r->arena, (n ? n : 1) * sizeof (int32_t));
    if (!reply->statuses)
        return -1;
    memset (reply->statuses, 0, n * sizeof (int32_t));
    reply->n_statuses = n;
    if (sizes) {
        reply->sizes = (uint64_t *) arena_alloc (r->arena, (n ? n : 1) * sizeof (uint64_t));
        if (!reply->sizes)
            return -1;
        memset (reply->sizes, 0, n * sizeof (uint64_t));
        reply->n_sizes = n;
    }
    if (holders) {
        reply->holders = (Kvpool__Cluster__V1__Holders **) arena_alloc (
            r->arena, (n ? n : 1) * sizeof (Kvpool__Cluster__V1__Holders *));
        Kvpool__Cluster__V1__Holders *each = (Kvpool__Cluster__V1__Holders *) arena_alloc (
            r->arena, (n ? n : 1) * sizeof (Kvpool__Cluster__V1__Holders));
        if (!reply->holders || !each)
            return -1;
        for (size_t i = 0; i < n; i++) {
            kvpool__cluster__v1__holders__init (&each[i]);
            reply->holders[i] = &each[i];
        }
        reply->n_holders = n;
    }
    return 0;
}

//  The index of slot's node in reply.nodes, adding it. Returns -1 when out of memory.
int
master_reply_node (reply_t *r, int slot)
{
    if (r->node_index[slot])
        return (int) r->node_index[slot] - 1;
    Kvpool__Cluster__V1__MasterReply *reply = &r->reply;
    if (reply->n_nodes == r->nodes_capacity) {
        size_t capacity = r->nodes_capacity ? r->nodes_capacity * 2 : 8;
        Kvpool__Cluster__V1__Node **grown = (Kvpool__Cluster__V1__Node **) arena_alloc (
            r->arena, capacity * sizeof (Kvpool__Cluster__V1__Node *));
        if (!grown)
            return -1;
        if (reply->n_nodes)
            memcpy (grown, reply->nodes, reply->n_nodes * sizeof *grown);
        reply->nodes = grown;
        r->nodes_capacity = capacity;
    }
    Kvpool__Cluster__V1__Node *out =
        (Kvpool__Cluster__V1__Node *) arena_alloc (r->arena, sizeof (Kvpool__Cluster__V1__Node));
    if (!out)
        return -1;
    kvpool__cluster__v1__node__init (out);
    node_t *node = node_table_get (r->nodes, slot);
    out->node_id = node->node_id;
    out->host_id = node->host_id;
    out->client_endpoint = node->client_endpoint;
    out->peer_endpoint = node->peer_endpoint;
    out->curve_key = node->curve_key;
    out->capacity = node->capacity;
    out->free = node->free;
    out->alive = node->alive;
    out->objects = node->objects;
    out->last_heard_ms = (uint64_t) (zclock_mono () - node->last_heard);
    out->draining = node->draining;
    reply->nodes[reply->n_nodes] = out;
    r->node_index[slot] = (uint32_t) ++reply->n_nodes;
    return (int) reply->n_nodes - 1;
}

//  Fills holders with the live nodes among slots[0..count); with caches, *caches gets a bit
//  per node listed that keeps a cache copy (bit i of cache_mask for slots[i]).
int
master_reply_holders_cached (reply_t *r, Kvpool__Cluster__V1__Holders *holders,
                             const uint16_t *slots, size_t count, uint8_t cache_mask,
                             uint32_t *caches)
{
    holders->nodes = (uint32_t *) arena_alloc (r->arena, (count ? count : 1) * sizeof (uint32_t));
    if (!holders->nodes)
        return -1;
    holders->n_nodes = 0;
    if (caches)
        *caches = 0;
    for (size_t i = 0; i < count; i++) {
        node_t *node = node_table_get (r->nodes, slots[i]);
        if (!node || !node->alive)
            continue;
        int index = master_reply_node (r, slots[i]);
        if (index < 0)
            return -1;
        if (caches && ((cache_mask >> i) & 1))
            *caches |= 1u << holders->n_nodes;
        holders->nodes[holders->n_nodes++] = (uint32_t) index;
    }
    return 0;
}

int
master_reply_holders (reply_t *r, Kvpool__Cluster__V1__Holders *holders, const uint16_t *slots,
                      size_t count)
{
    return master_reply_holders_cached (r, holders, slots, count, 0, NULL);
}

//  Arrays for n keys' versions and cache masks (zeroed). Returns 0 or -1.
int
master_reply_versions (reply_t *r, size_t n, bool caches)
{
    Kvpool__Cluster__V1__MasterReply *reply = &r->reply;
    reply->versions = (uint64_t *) arena_alloc (r->arena, (n ? n : 1) * sizeof (uint64_t));
    if (!reply->versions)
        return -1;
    memset (reply->versions, 0, (n ? n : 1) * sizeof (uint64_t));
    reply->n_versions = n;
    if (caches) {
        reply->caches = (uint32_t *) arena_alloc (r->arena, (n ? n : 1) * sizeof (uint32_t));
        if (!reply->caches)
            return -1;
        memset (reply->caches, 0, (n ? n : 1) * sizeof (uint32_t));
        reply->n_caches = n;
    }
    return 0;
}

//  An empty holder list a key for n keys' old holders (PLACE of an upsert, COMMIT). Returns
//  0, or -1 (the reply failed) when out of memory.
int
master_reply_old_holders (reply_t *r, size_t n)
{
    r->reply.old_holders = (Kvpool__Cluster__V1__Holders **) arena_alloc (
        r->arena, (n ? n : 1) * sizeof (Kvpool__Cluster__V1__Holders *));
    Kvpool__Cluster__V1__Holders *each = (Kvpool__Cluster__V1__Holders *) arena_alloc (
        r->arena, (n ? n : 1) * sizeof (Kvpool__Cluster__V1__Holders));
    if (!r->reply.old_holders || !each) {
        master_reply_fail (r, KVPOOL_INTERNAL_ERROR, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        kvpool__cluster__v1__holders__init (&each[i]);
        r->reply.old_holders[i] = &each[i];
    }
    r->reply.n_old_holders = n;
    return 0;
}

void
master_reply_log (const reply_t *r, const Kvpool__Cluster__V1__NodeRequest *request)
{
    if (!request)
        return;
    const ProtobufCEnumValue *kind =
        protobuf_c_enum_descriptor_get_value (&kvpool__cluster__v1__kind__descriptor, request->kind);
    kvp_debug ("%s from %s: %zu keys, %s", kind ? kind->name : "?",
               request->node && request->node->node_id ? request->node->node_id : "?",
               request->n_keys, kvp_status_name (r->reply.status));
}

void
master_reply_hold (reply_t *r, const Kvpool__Cluster__V1__NodeRequest *request, int64_t wait_ms)
{
    if (!request || wait_ms <= 0 || r->reply.status != KVPOOL_OK
        || r->reply.wait_ms >= (uint64_t) wait_ms)
        return;
    switch (request->kind) {
        case KVPOOL__CLUSTER__V1__KIND__COMMIT:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE_REGEX:
        case KVPOOL__CLUSTER__V1__KIND__REMOVE_ALL: r->reply.wait_ms = (uint64_t) wait_ms; break;
        default: break;
    }
}
