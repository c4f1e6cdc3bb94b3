/*  ops.c - the table of operations (ops.h): one array of rows, each keyed by (operation,
    way the job comes). Rows of one way are written together, the one-process rows first.
    A lookup indexes a table of row pointers made from the array on first use (pthread_once:
    any thread may look up; nothing is written after).
*/
#include "messages/ops.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "protocol/kvpool.pb-c.h"

//  A row's key: the operation (as in kvpool.proto) and the way its job comes (ops.h).
#define OP(name) KVPOOL__V1__OP__##name, #name, KVP_VIA_PROCESS
#define ROW(name, via) KVPOOL__V1__OP__##name, #name, KVP_VIA_##via
#define NODE_ROW(name) KVP_OP_##name, #name, KVP_VIA_NODE
#define STAGE(kind)                                                                                \
    {                                                                                              \
        KVP_##kind, GATE_ALWAYS                                                                    \
    }
#define STAGE_IF(kind, gate)                                                                       \
    {                                                                                              \
        KVP_##kind, GATE_##gate                                                                    \
    }

static const kvp_op_t s_ops[] = {
    {OP (PING), OP_ANYONE, REPLY_NODE, {{0}}},
    //  Place, write, then insert the objects committed in one step: nobody sees a key before
    //  its bytes are in. (A put of an existing key is refused by the insert, its space freed.)
    //  A placement that finds no space makes room where it is placed, and is placed again
    //  (the replica-manager's eviction: actors/replica_evict.c).
    {OP (PUT),
     OP_KEYS | OP_VALUES | OP_WRITE | OP_NEW,
     0,
     {STAGE_IF (AL_ALLOC, ANY_OK), STAGE_IF (TX_WRITE, ANY_OK), STAGE_IF (RM_INSERT, ANY_OK)}},
    //  Values only on disk are read from there.
    {OP (GET),
     OP_KEYS | OP_INDEX | OP_RANGES,
     REPLY_SIZES | REPLY_VALUES,
     {STAGE (RM_GET), STAGE_IF (TX_DISK_READ, ANY_ON_DISK)}},
    {OP (EXIST), OP_KEYS | OP_INDEX, 0, {STAGE (RM_EXIST)}},
    {OP (REMOVE), OP_KEYS, 0, {STAGE (RM_REMOVE)}},
    {OP (REMOVE_BY_REGEX), 0, REPLY_COUNT, {STAGE (RM_REMOVE_REGEX)}},
    {OP (REMOVE_ALL), 0, REPLY_COUNT, {STAGE (RM_REMOVE_ALL)}},
    {OP (GET_SIZE), OP_KEYS | OP_INDEX, REPLY_SIZES, {STAGE (RM_GET_SIZE)}},
    //  Reserve (the key stays invisible), place, and record where the client is to write;
    //  its PUT_END commits.
    {OP (PUT_START),
     OP_KEYS | OP_SIZES | OP_WRITE | OP_LOCAL | OP_PEER,
     REPLY_REPLICAS,
     {STAGE (RM_RESERVE), STAGE_IF (AL_ALLOC, ANY_RESERVED), STAGE_IF (RM_BIND, ANY_RESERVED)}},
    {OP (PUT_END), OP_KEYS | OP_LOCAL | OP_PEER, 0, {STAGE (RM_COMMIT)}},
    {OP (PUT_REVOKE), OP_KEYS | OP_LOCAL | OP_PEER, 0, {STAGE (RM_REVOKE)}},
    {OP (GET_REPLICA_LIST),
     OP_KEYS | OP_LOCAL,
     REPLY_SIZES | REPLY_REPLICAS,
     {STAGE (RM_REPLICA_LIST)}},
    {OP (RELEASE), OP_KEYS | OP_LOCAL, 0, {STAGE (RM_RELEASE)}},
    {OP (STATS), 0, REPLY_STATS, {STAGE (RM_STATS), STAGE (AL_STATS)}},
    {OP (SEGMENTS), 0, REPLY_SEGMENTS | REPLY_NODE, {STAGE (AL_SEGMENTS)}},
    {OP (MOUNT_SEGMENT), OP_SEGMENT | OP_LOCAL, REPLY_SEGMENTS, {STAGE (AL_MOUNT)}},
    //  Who may unmount it is checked before any object on it is removed.
    {OP (UNMOUNT_SEGMENT),
     OP_SEGMENT | OP_LOCAL,
     0,
     {STAGE (AL_UNMOUNT_CHECK), STAGE (RM_REMOVE_SEGMENT), STAGE (AL_UNMOUNT)}},
    {OP (RESET), OP_DRAIN, REPLY_COUNT, {STAGE (RM_REMOVE_ALL)}},
    //  Lease renewals of reads a client served from the read index itself; a TOUCH may carry
    //  only its count of reads, and then needs no stage.
    {OP (TOUCH), 0, 0, {STAGE_IF (RM_TOUCH, ANY_ITEM)}},
    //  As PUT, but the insert replaces an existing key's object.
    {OP (UPSERT),
     OP_KEYS | OP_VALUES | OP_WRITE,
     0,
     {STAGE_IF (AL_ALLOC, ANY_OK), STAGE_IF (TX_WRITE, ANY_OK), STAGE_IF (RM_UPSERT, ANY_OK)}},
    //  One process: the node itself holds what it has (the api names itself).
    {OP (LOCATE), OP_KEYS, REPLY_SIZES | REPLY_NODES, {STAGE (RM_GET_SIZE)}},
    {OP (NODES), 0, REPLY_NODES, {{0}}},
    //  A part of a reserved value: the reservation is found and pinned (a revoke meanwhile
    //  frees the space only after the copy), then the bytes are copied in.
    {OP (PUT_PART),
     OP_KEYS | OP_VALUES | OP_RANGES | OP_LOCAL | OP_PEER | OP_NODES,
     0,
     {STAGE (RM_PART), STAGE_IF (TX_WRITE, ANY_OK)}},
    //  Made by the transfer-submitter, which owns this node's RDMA device and connections.
    {OP (RDMA_CONNECT), OP_LOCAL | OP_PEER | OP_NODES, REPLY_RDMA, {STAGE (TX_RDMA_CONNECT)}},
    //  Leading whole blocks: the count is made from the items' statuses at the reply
    //  (kvp_job_prefix_count), so that the cluster's row can add what other nodes hold.
    {OP (PREFIX_MATCH), OP_KEYS, REPLY_COUNT, {STAGE (RM_PREFIX)}},
    //  The api checks the value against the settings table and keeps it; the actors that
    //  read the setting take it into their own copies of the settings.
    {OP (CONFIG), OP_LOCAL, REPLY_SETTING, {STAGE (RM_CONFIG)}},
    //  One process has no other node to drain to: refused at intake (api_intake.c).
    {OP (DRAIN), OP_KEYS | OP_LOCAL, REPLY_COUNT | REPLY_DRAIN, {{0}}},
    //  Another node committed what it wrote here (kvp_object_t.hidden in replica_objects.h).
    {OP (CONFIRM), OP_KEYS | OP_LOCAL | OP_PEER | OP_NODES, 0, {STAGE (RM_CONFIRM)}},

    //  ---- KVP_VIA_CLUSTER ----
    //  A node of a cluster (--role node) serves its clients with these rows where they
    //  differ: the master places and finds keys, other nodes hold some of them. What this
    //  node holds itself is found here first. (Requests on the data plane, from other nodes,
    //  take the one-process rows: they are about this node's own objects.)
    //  Placed by the master first: the items held here are written here as in one process,
    //  the rest are passed over (KVP_ITEM_ELSEWHERE); then the other nodes' copies are
    //  written and the master commits.
    {ROW (PUT, CLUSTER),
     OP_KEYS | OP_VALUES | OP_WRITE | OP_NEW,
     0,
     {STAGE_IF (CL_PLACE, ANY_OK), STAGE_IF (AL_ALLOC, ANY_OK), STAGE_IF (TX_WRITE, ANY_OK),
      STAGE_IF (RM_INSERT, ANY_OK), STAGE (CL_COMMIT)}},
    {ROW (UPSERT, CLUSTER),
     OP_KEYS | OP_VALUES | OP_WRITE,
     0,
     {STAGE_IF (CL_PLACE, ANY_OK), STAGE_IF (AL_ALLOC, ANY_OK), STAGE_IF (TX_WRITE, ANY_OK),
      STAGE_IF (RM_UPSERT, ANY_OK), STAGE (CL_COMMIT)}},
    {ROW (GET, CLUSTER),
     OP_KEYS | OP_INDEX | OP_RANGES,
     REPLY_SIZES | REPLY_VALUES,
     {STAGE (RM_GET), STAGE_IF (TX_DISK_READ, ANY_ON_DISK), STAGE_IF (CL_FETCH, ANY_MISSING)}},
    {ROW (EXIST, CLUSTER),
     OP_KEYS | OP_INDEX,
     0,
     {STAGE (RM_EXIST), STAGE_IF (CL_EXIST, ANY_MISSING)}},
    {ROW (REMOVE, CLUSTER), OP_KEYS, 0, {STAGE (CL_REMOVE)}},
    {ROW (REMOVE_BY_REGEX, CLUSTER), 0, REPLY_COUNT, {STAGE (CL_REMOVE)}},
    {ROW (REMOVE_ALL, CLUSTER), 0, REPLY_COUNT, {STAGE (CL_REMOVE)}},
    {ROW (GET_SIZE, CLUSTER),
     OP_KEYS | OP_INDEX,
     REPLY_SIZES,
     {STAGE (RM_GET_SIZE), STAGE_IF (CL_EXIST, ANY_MISSING)}},
    //  A same-machine client's put: reserved at the master for this node, then as in one
    //  process; the master's reservations of keys that could not be reserved here end.
    {ROW (PUT_START, CLUSTER),
     OP_KEYS | OP_SIZES | OP_WRITE | OP_LOCAL | OP_PEER,
     REPLY_REPLICAS,
     {STAGE_IF (CL_PLACE, ANY_OK), STAGE_IF (RM_RESERVE, ANY_OK), STAGE_IF (AL_ALLOC, ANY_RESERVED),
      STAGE_IF (RM_BIND, ANY_RESERVED), STAGE (CL_ABORT)}},
    {ROW (PUT_END, CLUSTER),
     OP_KEYS | OP_LOCAL | OP_PEER,
     0,
     {STAGE (RM_COMMIT), STAGE_IF (CL_COMMIT, ANY_OK)}},
    {ROW (PUT_REVOKE, CLUSTER),
     OP_KEYS | OP_LOCAL | OP_PEER,
     0,
     {STAGE (RM_REVOKE), STAGE (CL_ABORT)}},
    {ROW (RESET, CLUSTER), OP_DRAIN, REPLY_COUNT, {STAGE (CL_REMOVE)}},
    {ROW (LOCATE, CLUSTER), OP_KEYS, REPLY_SIZES | REPLY_NODES, {STAGE (CL_LOCATE)}},
    {ROW (NODES, CLUSTER), 0, REPLY_NODES, {STAGE (CL_NODES)}},
    //  A node of the cluster drained (master/repair.c): same-machine clients, as CONFIG.
    {ROW (DRAIN, CLUSTER), OP_KEYS | OP_LOCAL, REPLY_COUNT | REPLY_DRAIN, {STAGE (CL_DRAIN)}},
    //  This node's own blocks first; the master says which of the rest exist elsewhere.
    {ROW (PREFIX_MATCH, CLUSTER),
     OP_KEYS,
     REPLY_COUNT,
     {STAGE (RM_PREFIX), STAGE_IF (CL_EXIST, ANY_MISSING)}},
    {ROW (STATS, CLUSTER), 0, REPLY_STATS, {STAGE (RM_STATS), STAGE (AL_STATS), STAGE (CL_STATS)}},

    //  ---- KVP_VIA_RDMA ----
    //  The data plane's operations whose values move by RDMA (docs/cluster.md): as their
    //  one-process rows, but the bytes are written into the asking node's memory (GET) or
    //  read from it (UPSERT, PUT_PART) by the transfer-submitter, before the answer.
    {ROW (GET, RDMA),
     OP_KEYS | OP_RANGES | OP_LOCAL | OP_PEER | OP_RDMA | OP_NODES,
     REPLY_SIZES,
     {STAGE (RM_GET), STAGE_IF (TX_DISK_READ, ANY_ON_DISK), STAGE_IF (TX_RDMA_PUSH, ANY_OK)}},
    {ROW (UPSERT, RDMA),
     OP_KEYS | OP_SIZES | OP_WRITE | OP_LOCAL | OP_PEER | OP_RDMA | OP_NODES,
     0,
     {STAGE_IF (AL_ALLOC, ANY_OK), STAGE_IF (TX_RDMA_PULL, ANY_OK),
      STAGE (RM_UPSERT)}}, //  always: it frees the space of values whose pull failed
    {ROW (PUT_PART, RDMA),
     OP_KEYS | OP_RANGES | OP_LOCAL | OP_PEER | OP_RDMA | OP_NODES,
     0,
     {STAGE (RM_PART), STAGE_IF (TX_RDMA_PULL, ANY_OK)}},

    //  ---- KVP_VIA_VM ----
    //  A same-machine client's PUT by address (Request.vm_addrs): as PUT, but with sizes
    //  instead of frames, and the write reads each value from the client's memory. The
    //  insert runs whatever happened: it frees the space of values that could not be read.
    {ROW (PUT, VM),
     OP_KEYS | OP_SIZES | OP_WRITE | OP_NEW | OP_LOCAL,
     0,
     {STAGE_IF (AL_ALLOC, ANY_OK), STAGE_IF (TX_WRITE, ANY_OK), STAGE (RM_INSERT)}},

    //  ---- KVP_VIA_NODE ----
    //  The node's own work (negative operations: no client sends them).
    {NODE_ROW (OWNER_GONE), 0, 0, {STAGE (RM_OWNER_GONE), STAGE (AL_OWNER_SEGMENTS)}},
    {NODE_ROW (ORPHAN_UNMOUNT), 0, 0, {STAGE (RM_REMOVE_SEGMENT), STAGE (AL_UNMOUNT)}},
    {NODE_ROW (MAP_SEGMENTS), 0, 0, {STAGE (AL_SEGMENTS)}},
    {NODE_ROW (DISK_LOST), 0, 0, {STAGE (RM_DISK_LOST), STAGE (TX_DISK_DROP)}},
    //  No eviction for a promotion: a full pool keeps the value on disk.
    {NODE_ROW (PROMOTE),
     0,
     0,
     {STAGE_IF (AL_ALLOC, ANY_OK), STAGE_IF (TX_WRITE, ANY_OK), STAGE_IF (RM_PROMOTE, ANY_OK)}},
    //  A copy for the host hot cache: its bytes fetched if the client read them elsewhere
    //  (a redirect), placed (making room only from other cache copies) and written, then
    //  kept hidden until the master has this node as a cache holder of that version (so a
    //  remove that comes meanwhile reaches it), then served. Refused ones go.
    {NODE_ROW (CACHE_FILL),
     0,
     0,
     {STAGE_IF (CL_FETCH, ANY_MISSING), STAGE_IF (AL_ALLOC, ANY_OK), STAGE_IF (TX_WRITE, ANY_OK),
      STAGE_IF (RM_CACHE_INSERT, ANY_OK), STAGE_IF (CL_CACHE_CLAIM, ANY_RESERVED),
      STAGE_IF (RM_CACHE_PUBLISH, ANY_RESERVED)}},
    //  A replica the cluster lacks (master/repair.c), copied the way a cache copy is: fetched
    //  from a holder, placed (evicting as a put does) and written, hidden until the master
    //  takes this node as a holder of that version (REPAIRED), then served as a replica of
    //  this node's. Refused ones go.
    {NODE_ROW (REPAIR_FILL),
     0,
     0,
     {STAGE_IF (CL_FETCH, ANY_MISSING), STAGE_IF (AL_ALLOC, ANY_OK), STAGE_IF (TX_WRITE, ANY_OK),
      STAGE_IF (RM_CACHE_INSERT, ANY_OK), STAGE_IF (CL_CACHE_CLAIM, ANY_RESERVED),
      STAGE_IF (RM_CACHE_PUBLISH, ANY_RESERVED)}},
};

#define OPS_COUNT (sizeof s_ops / sizeof s_ops[0])

//  The rows by key, made once from the table: rows[via][op + NODE_OPS_MAX] (ops.h's
//  negative KVP_OP_* first, then the proto's). A lookup is an index.
#define NODE_OPS_MAX 16
#define OP_SLOTS (NODE_OPS_MAX + 64)

static const kvp_op_t *s_rows[KVP_VIA_COUNT][OP_SLOTS];
static pthread_once_t s_rows_once = PTHREAD_ONCE_INIT;

static void
s_rows_index (void)
{
    for (size_t i = 0; i < OPS_COUNT; i++) {
        const kvp_op_t *row = &s_ops[i];
        int slot = row->op + NODE_OPS_MAX;
        assert (slot >= 0 && slot < OP_SLOTS && row->via < KVP_VIA_COUNT);
        assert (!s_rows[row->via][slot]); //  (op, via) names one row
        s_rows[row->via][slot] = row;
    }
}

const kvp_op_t *
kvp_op_row (int op, kvp_via_t via)
{
    //  (op is the request's: checked before the sum, which must not overflow)
    if (op < -NODE_OPS_MAX || op >= OP_SLOTS - NODE_OPS_MAX || (unsigned) via >= KVP_VIA_COUNT)
        return NULL;
    int slot = op + NODE_OPS_MAX;
    pthread_once (&s_rows_once, s_rows_index);
    return s_rows[via][slot];
}

const kvp_op_t *
kvp_op (int op)
{
    return kvp_op_row (op, op < 0 ? KVP_VIA_NODE : KVP_VIA_PROCESS);
}

const kvp_op_t *
kvp_op_route (int op, kvp_via_t via, bool cluster)
{
    const kvp_op_t *row = kvp_op_row (op, via);
    if (!row && cluster)
        row = kvp_op_row (op, KVP_VIA_CLUSTER);
    return row ? row : kvp_op (op);
}

kvp_via_t
kvp_via_of_job (const kvp_job_t *job)
{
    return job->rdma_conn ? KVP_VIA_RDMA
           : job->vm.pid  ? KVP_VIA_VM
           : job->op < 0  ? KVP_VIA_NODE
           : job->cluster ? KVP_VIA_CLUSTER
                          : KVP_VIA_PROCESS;
}

const kvp_op_t *
kvp_op_of_job (const kvp_job_t *job)
{
    return kvp_op_route (job->op, kvp_via_of_job (job), job->cluster);
}

const char *
kvp_via_name (kvp_via_t via)
{
    static const char *names[KVP_VIA_COUNT] = {"process", "cluster", "rdma", "vm", "node"};
    return (unsigned) via < KVP_VIA_COUNT ? names[via] : "?";
}

static bool
s_gate_holds (kvp_gate_t gate, const kvp_job_t *job)
{
    if (gate == GATE_ALWAYS)
        return true;
    if (gate == GATE_ANY_ITEM)
        return job->count > 0;
    for (size_t i = 0; i < job->count; i++) {
        const kvp_item_t *item = &job->items[i];
        bool holds;
        switch (gate) {
            case GATE_ANY_OK: holds = item->status == KVPOOL_OK; break;
            case GATE_ANY_RESERVED: holds = item->object_id != 0; break;
            case GATE_ANY_NO_ROOM: holds = item->status == KVPOOL_NO_AVAILABLE_HANDLE; break;
            case GATE_ANY_MISSING: holds = item->status == KVPOOL_OBJECT_NOT_FOUND; break;
            case GATE_ANY_ON_DISK:
                holds = item->status == KVPOOL_OK && item->disk.id && item->replica_count == 0;
                break;
            default: holds = false; break;
        }
        if (holds)
            return true;
    }
    return false;
}

kvp_job_kind_t
kvp_op_next_stage (const kvp_op_t *self, const kvp_job_t *job, kvp_job_kind_t done)
{
    if (job->status != KVPOOL_OK)
        return KVP_JOB_NONE;
    size_t next = 0;
    if (done != KVP_JOB_NONE) {
        while (next < KVP_OP_STAGES_MAX && self->stages[next].kind != done)
            next++;
        assert (next < KVP_OP_STAGES_MAX); //  a job comes back only from its own stages
        next++;
    }
    //  A stage whose gate does not hold is passed over.
    for (; next < KVP_OP_STAGES_MAX && self->stages[next].kind != KVP_JOB_NONE; next++)
        if (s_gate_holds (self->stages[next].gate, job))
            return self->stages[next].kind;
    return KVP_JOB_NONE;
}

//  ---- self test ---------------------------------------------------------------------

void
kvp_ops_test (bool verbose)
{
    //  Every operation of the proto has its one-process row, under the proto's name.
    const ProtobufCEnumDescriptor *desc = &kvpool__v1__op__descriptor;
    size_t proto_ops = 0;
    for (unsigned i = 0; i < desc->n_values; i++) {
        int op = desc->values[i].value;
        if (op == KVPOOL__V1__OP__OP_NONE) {
            assert (kvp_op (op) == NULL);
            continue;
        }
        const kvp_op_t *row = kvp_op (op);
        assert (row && row->via == KVP_VIA_PROCESS && row->op == op);
        assert (strcmp (row->name, desc->values[i].name) == 0);
        proto_ops++;
    }
    //  Every row: an operation of the proto under its name (a KVP_OP_* for the node's own
    //  work), every stage's kind real, no (op, via) twice, and found by its key.
    size_t node_ops = 0;
    for (size_t i = 0; i < OPS_COUNT; i++) {
        const kvp_op_t *row = &s_ops[i];
        if (row->via == KVP_VIA_NODE) {
            assert (row->op < 0 && row->op >= -NODE_OPS_MAX);
            node_ops++;
        }
        else {
            const ProtobufCEnumValue *value = protobuf_c_enum_descriptor_get_value (desc, row->op);
            assert (value && row->op > 0 && strcmp (row->name, value->name) == 0);
            //  A way of its own changes the stages, never who may send it (flags) ...
            //  except the ways whose values move otherwise (RDMA, by address).
            if (row->via == KVP_VIA_CLUSTER)
                assert (kvp_op (row->op)->flags == row->flags);
        }
        for (size_t s = 0; s < KVP_OP_STAGES_MAX && row->stages[s].kind; s++)
            assert (row->stages[s].kind < KVP_JOB_KIND_COUNT);
        for (size_t j = 0; j < i; j++)
            assert (s_ops[j].op != row->op || s_ops[j].via != row->via);
        assert (kvp_op_row (row->op, row->via) == row);
    }
    size_t rows = proto_ops;
    assert (kvp_op (0) == NULL
            && kvp_op ((int) desc->values[desc->n_values - 1].value + 1) == NULL);
    assert (kvp_op (KVP_OP_MAP_SEGMENTS) && kvp_op (-(int) node_ops - 1) == NULL);
    for (int op = -(int) node_ops; op < 0; op++)
        assert (kvp_op (op) && kvp_op (op)->via == KVP_VIA_NODE);
    assert (kvp_op_row (KVPOOL__V1__OP__PUT, KVP_VIA_COUNT) == NULL);
    assert (kvp_op_row (1 << 20, KVP_VIA_PROCESS) == NULL
            && kvp_op_row (-(1 << 20), KVP_VIA_NODE) == NULL);
    assert (streq (kvp_via_name (KVP_VIA_RDMA), "rdma"));

    //  A put: placed and written while some key is OK, inserted once written.
    const kvp_op_t *put = kvp_op (KVPOOL__V1__OP__PUT);
    kvp_job_t *job = kvp_job_new (KVP_JOB_NONE, 2);
    assert (kvp_op_next_stage (put, job, KVP_JOB_NONE) == KVP_AL_ALLOC);
    job->items[0].status = KVPOOL_NO_AVAILABLE_HANDLE;
    //  ... a key that found no space (room was made and it was placed again where it was
    //  placed) is passed over.
    assert (kvp_op_next_stage (put, job, KVP_AL_ALLOC) == KVP_TX_WRITE);
    job->items[1].status = KVPOOL_NO_AVAILABLE_HANDLE;
    assert (kvp_op_next_stage (put, job, KVP_AL_ALLOC) == KVP_JOB_NONE);
    job->items[0].status = job->items[1].status = KVPOOL_INVALID_KEY;
    assert (kvp_op_next_stage (put, job, KVP_AL_ALLOC) == KVP_JOB_NONE);
    job->items[1].status = KVPOOL_OK;
    assert (kvp_op_next_stage (put, job, KVP_TX_WRITE) == KVP_RM_INSERT);
    job->items[1].status = KVPOOL_INVALID_KEY;
    assert (kvp_op_next_stage (put, job, KVP_RM_INSERT) == KVP_JOB_NONE);
    //  A put-start goes on while some key is reserved, even when its placement failed.
    const kvp_op_t *start = kvp_op (KVPOOL__V1__OP__PUT_START);
    assert (kvp_op_next_stage (start, job, KVP_JOB_NONE) == KVP_RM_RESERVE);
    assert (kvp_op_next_stage (start, job, KVP_RM_RESERVE) == KVP_JOB_NONE);
    job->items[1].object_id = 5;
    assert (kvp_op_next_stage (start, job, KVP_RM_RESERVE) == KVP_AL_ALLOC);
    assert (kvp_op_next_stage (start, job, KVP_AL_ALLOC) == KVP_RM_BIND);
    //  A get goes to disk only for a value found there alone.
    const kvp_op_t *get = kvp_op (KVPOOL__V1__OP__GET);
    job->items[1].status = KVPOOL_OK;
    assert (kvp_op_next_stage (get, job, KVP_RM_GET) == KVP_JOB_NONE);
    job->items[1].disk.id = 7;
    assert (kvp_op_next_stage (get, job, KVP_RM_GET) == KVP_TX_DISK_READ);
    job->items[1].replica_count = 1;
    assert (kvp_op_next_stage (get, job, KVP_RM_GET) == KVP_JOB_NONE);
    //  A failed job is answered at once.
    kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "test");
    assert (kvp_op_next_stage (start, job, KVP_AL_ALLOC) == KVP_JOB_NONE);
    kvp_job_destroy (&job);
    //  Values by RDMA: only a GET, an UPSERT and a PUT_PART, for the data plane alone; a get
    //  pushes what it found, an upsert pulls what it placed.
    assert (kvp_op_row (KVPOOL__V1__OP__PUT, KVP_VIA_RDMA) == NULL
            && kvp_op_row (KVPOOL__V1__OP__EXIST, KVP_VIA_RDMA) == NULL);
    const kvp_op_t *rdma_get = kvp_op_row (KVPOOL__V1__OP__GET, KVP_VIA_RDMA);
    assert (rdma_get && (rdma_get->flags & OP_PEER) && !(rdma_get->fills & REPLY_VALUES));
    job = kvp_job_new (KVP_JOB_NONE, 1);
    assert (kvp_op_next_stage (rdma_get, job, KVP_RM_GET) == KVP_TX_RDMA_PUSH);
    const kvp_op_t *rdma_upsert = kvp_op_row (KVPOOL__V1__OP__UPSERT, KVP_VIA_RDMA);
    assert (kvp_op_next_stage (rdma_upsert, job, KVP_AL_ALLOC) == KVP_TX_RDMA_PULL);
    assert (kvp_op_next_stage (rdma_upsert, job, KVP_TX_RDMA_PULL) == KVP_RM_UPSERT);
    assert (
        kvp_op_next_stage (kvp_op_row (KVPOOL__V1__OP__PUT_PART, KVP_VIA_RDMA), job, KVP_RM_PART)
        == KVP_TX_RDMA_PULL);
    job->items[0].status = KVPOOL_OBJECT_NOT_FOUND;
    assert (kvp_op_next_stage (rdma_get, job, KVP_RM_GET) == KVP_JOB_NONE);
    job->items[0].status = KVPOOL_TRANSFER_FAIL; //  a pull that failed: its space is freed
    assert (kvp_op_next_stage (rdma_upsert, job, KVP_TX_RDMA_PULL) == KVP_RM_UPSERT);
    kvp_job_destroy (&job);
    //  A cluster's put: placed by the master, written here, then elsewhere and committed
    //  even when nothing was held here.
    const kvp_op_t *cluster_put = kvp_op_route (KVPOOL__V1__OP__PUT, KVP_VIA_CLUSTER, true);
    assert (cluster_put != put && cluster_put->flags == put->flags);
    job = kvp_job_new (KVP_JOB_NONE, 1);
    assert (kvp_op_next_stage (cluster_put, job, KVP_JOB_NONE) == KVP_CL_PLACE);
    job->items[0].status = KVP_ITEM_ELSEWHERE;
    assert (kvp_op_next_stage (cluster_put, job, KVP_CL_PLACE) == KVP_CL_COMMIT);
    //  A cluster's get asks the cluster only for what is not here.
    const kvp_op_t *cluster_get = kvp_op_route (KVPOOL__V1__OP__GET, KVP_VIA_CLUSTER, true);
    job->items[0].status = KVPOOL_OK;
    assert (kvp_op_next_stage (cluster_get, job, KVP_RM_GET) == KVP_JOB_NONE);
    job->items[0].status = KVPOOL_OBJECT_NOT_FOUND;
    assert (kvp_op_next_stage (cluster_get, job, KVP_RM_GET) == KVP_CL_FETCH);
    assert (kvp_op_route (KVPOOL__V1__OP__PING, KVP_VIA_CLUSTER, true)
            == kvp_op (KVPOOL__V1__OP__PING));
    //  The way follows from the job: a cluster job takes the cluster's rows where they
    //  differ, and the one-process row where they do not.
    job->cluster = true;
    job->op = KVPOOL__V1__OP__GET;
    assert (kvp_via_of_job (job) == KVP_VIA_CLUSTER && kvp_op_of_job (job) == cluster_get);
    job->op = KVPOOL__V1__OP__PING;
    assert (kvp_op_of_job (job) == kvp_op (KVPOOL__V1__OP__PING));
    job->op = KVPOOL__V1__OP__PUT;
    job->rdma_conn = 9; //  no RDMA row of PUT: the cluster's
    assert (kvp_via_of_job (job) == KVP_VIA_RDMA && kvp_op_of_job (job) == cluster_put);
    job->op = KVPOOL__V1__OP__GET;
    assert (kvp_op_of_job (job) == kvp_op_row (KVPOOL__V1__OP__GET, KVP_VIA_RDMA));
    job->rdma_conn = 0;
    job->cluster = false;
    job->op = KVP_OP_PROMOTE;
    assert (kvp_via_of_job (job) == KVP_VIA_NODE && kvp_op_of_job (job) == kvp_op (KVP_OP_PROMOTE));
    //  A put by address: sizes, no frames, on the ipc endpoint; its insert runs even when no
    //  value could be read (it frees their space).
    const kvp_op_t *vm_put = kvp_op_row (KVPOOL__V1__OP__PUT, KVP_VIA_VM);
    assert (vm_put && kvp_op_row (KVPOOL__V1__OP__GET, KVP_VIA_VM) == NULL
            && kvp_op_row (KVPOOL__V1__OP__UPSERT, KVP_VIA_VM) == NULL);
    assert ((vm_put->flags & (OP_SIZES | OP_LOCAL)) == (OP_SIZES | OP_LOCAL)
            && !(vm_put->flags & OP_VALUES));
    job->items[0].status = KVPOOL_TRANSFER_FAIL;
    assert (kvp_op_next_stage (vm_put, job, KVP_TX_WRITE) == KVP_RM_INSERT);
    kvp_job_destroy (&job);
    //  A TOUCH without keys has nothing to renew.
    job = kvp_job_new (KVP_JOB_NONE, 0);
    assert (kvp_op_next_stage (kvp_op (KVPOOL__V1__OP__TOUCH), job, KVP_JOB_NONE) == KVP_JOB_NONE);
    assert (kvp_op_next_stage (kvp_op (KVPOOL__V1__OP__PING), job, KVP_JOB_NONE) == KVP_JOB_NONE);
    assert (kvp_op_next_stage (kvp_op (KVPOOL__V1__OP__STATS), job, KVP_RM_STATS) == KVP_AL_STATS);
    kvp_job_destroy (&job);
    if (verbose)
        printf ("%zu operations in %zu rows ", rows, OPS_COUNT);
}
