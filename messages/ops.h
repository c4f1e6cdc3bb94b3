/*  ops.h - the node's table of operations: one row per (kvpool.v1.Op, way the job comes).

    A row says what a request of the operation carries (keys, values, sizes, a segment), who
    may send it, whether it writes, which stages its job passes through (each stage is a job
    kind, and each kind belongs to one actor: kvp_job_kind_actor), and which fields of the
    reply it fills. The api validates, routes and encodes replies from this table only
    (request_check.c reads it too); adding an operation is adding a row (ops.c).

    One table, two dimensions: a row is keyed by its operation and by the way its job comes
    (kvp_via_t: one process, a cluster node's client, values by RDMA, values by address, the
    node's own work). An operation that walks the same stages every way has one row; a way
    that differs has a row of its own. Which row a job walks follows from the job
    (kvp_op_of_job), as Redis finds a command in its one table.

    A job walks its row's stages in order. A stage runs only while the job's status is OK and
    its gate holds: a stage whose gate does not hold is passed over, and a job whose status
    is not OK, or that has no stage left, is answered.
*/
#ifndef KVP_OPS_H_INCLUDED
#define KVP_OPS_H_INCLUDED

#include <stdbool.h>

#include "messages/kvp_job.h"

//  What a request carries, and who may send it.
typedef enum {
    OP_KEYS = 1 << 0,    //  at least one key
    OP_VALUES = 1 << 1,  //  one value frame per key (and none otherwise)
    OP_SIZES = 1 << 2,   //  one size per key (Request.sizes)
    OP_SEGMENT = 1 << 3, //  Request.segment
    OP_WRITE = 1 << 4,   //  writes objects: held back while a reset runs
    OP_DRAIN = 1 << 5,   //  runs alone: waits until no write is in flight (RESET)
    OP_LOCAL = 1 << 6,   //  works on the node's shared memory: same-machine clients on the
                         //  ipc endpoint only, tied to the asking process (docs/security.md)
    OP_ANYONE = 1 << 7,  //  open to ipc clients of other users too (PING)
    OP_INDEX = 1 << 8,   //  may be answered from the read index (actors/index_reads.h)
    OP_NEW = 1 << 9,     //  creates keys: one the read index shows is refused at once
    OP_RANGES = 1 << 10, //  may carry offsets / lengths (a byte range of each value)
    OP_PEER = 1 << 11,   //  OP_LOCAL, but open to other nodes on a cluster node's data plane
                         //  too (a reservation belongs to the node that made it: api.c)
    OP_RDMA = 1 << 12,   //  values move by RDMA, not in frames (Request.rdma_conn): each
                         //  key's rdma_addrs / rdma_keys (/ rdma_lengths); a PUT_PART's size
                         //  is its length
    OP_NODES = 1 << 13,  //  only other nodes, on the data plane: refused to every client,
                         //  same-machine ones too (PUT_PART, RDMA_CONNECT, values by RDMA)
} kvp_op_flag_t;

//  Which fields of the Reply it fills (every reply has status, error and one status a key).
typedef enum {
    REPLY_SIZES = 1 << 0,    //  sizes, one a key
    REPLY_REPLICAS = 1 << 1, //  replicas, one KeyReplicas a key
    REPLY_VALUES = 1 << 2,   //  one value frame a key after the Reply
    REPLY_SEGMENTS = 1 << 3, //  segments (the job's list, or the one mounted)
    REPLY_STATS = 1 << 4,    //  stats
    REPLY_COUNT = 1 << 5,    //  count (objects removed)
    REPLY_NODE = 1 << 6,     //  host_id, server_id, index_name, local_endpoint
    REPLY_NODES = 1 << 7,    //  nodes (job->nodes), locations (LOCATE: item->cluster.locations)
    REPLY_RDMA = 1 << 8,     //  rdma_data, rdma_conn (RDMA_CONNECT: job->rdma_connect)
    REPLY_SETTING = 1 << 9,  //  setting_value (CONFIG)
    REPLY_DRAIN = 1 << 10,   //  drain_short, draining (DRAIN: job->drain)
} kvp_reply_field_t;

//  When a stage runs, besides the job's status being OK.
typedef enum {
    GATE_ALWAYS = 0,
    GATE_ANY_ITEM,     //  the job has items
    GATE_ANY_OK,       //  some item's status is OK
    GATE_ANY_RESERVED, //  some item holds a reservation (item->object_id)
    GATE_ANY_NO_ROOM,  //  some item found no space (NO_AVAILABLE_HANDLE)
    GATE_ANY_ON_DISK,  //  some item found is on disk only (disk.id, no replica)
    GATE_ANY_MISSING,  //  some item is OBJECT_NOT_FOUND (here: the cluster may have it)
} kvp_gate_t;

typedef struct {
    kvp_job_kind_t kind; //  KVP_JOB_NONE ends the list
    kvp_gate_t gate;
} kvp_stage_t;

#define KVP_OP_STAGES_MAX 8

//  Which way a job comes, and so which of its operation's rows it walks: the table's
//  second dimension. Every operation of the proto has a one-process row; the other ways have
//  rows of their own only where they differ from it.
typedef enum {
    KVP_VIA_PROCESS = 0, //  one process; also other nodes' requests on a node's data plane
                         //  (they are about this node's own objects)
    KVP_VIA_CLUSTER,     //  a cluster node's clients (job->cluster): the master places and
                         //  finds keys, other nodes hold some of them
    KVP_VIA_RDMA,        //  values move by RDMA on the data plane (job->rdma_conn)
    KVP_VIA_VM,          //  values read from a same-machine client's memory (job->vm.pid)
    KVP_VIA_NODE,        //  the node's own work (KVP_OP_*: negative operations)
    KVP_VIA_COUNT
} kvp_via_t;

typedef struct {
    int op;           //  kvpool.v1.Op, or a KVP_OP_* (KVP_VIA_NODE)
    const char *name; //  as in kvpool.proto
    kvp_via_t via;    //  (op, via) names one row
    unsigned flags;   //  kvp_op_flag_t
    unsigned fills;   //  kvp_reply_field_t
    kvp_stage_t stages[KVP_OP_STAGES_MAX];
} kvp_op_t;

//  The node's own operations, beside the proto's (negative: no client sends them). Their jobs
//  have no client to answer.
#define KVP_OP_OWNER_GONE                                                                          \
    (-1)                           //  job->owner_id and job->segment.owner (its name) died:
                                   //  its pins and reservations end, and job->segments lists
                                   //  what it mounted (each then goes by an ORPHAN_UNMOUNT)
#define KVP_OP_ORPHAN_UNMOUNT (-2) //  job->segment.id: drop its replicas, unmount, unlink
#define KVP_OP_MAP_SEGMENTS (-3)   //  job->segments: every segment, for the api's index reads
#define KVP_OP_DISK_LOST                                                                           \
    (-4) //  items (key, disk.id): disk copies that failed a read's
         //  verification: forgotten, then unlinked
#define KVP_OP_PROMOTE                                                                             \
    (-5) //  items (key, src, size): values read from disk often go
         //  back to memory: placed, written, recorded
#define KVP_OP_CACHE_FILL                                                                          \
    (-6) //  items (key, version; src and size, or OBJECT_NOT_FOUND to be
         //  fetched): copies for the host hot cache (actors/replica_cache.c)
#define KVP_OP_REPAIR_FILL                                                                         \
    (-7) //  items (key, version, size; OBJECT_NOT_FOUND: to be fetched): replicas
         //  the master asked this node to restore (actors/replica_repair.c)

//  The row of (op, via), or NULL where op has no row of its own for via.
const kvp_op_t *kvp_op_row (int op, kvp_via_t via);
//  The home row of op: its one-process row (a kvpool.v1.Op), or its node row (a KVP_OP_*);
//  NULL for an operation this node does not serve.
const kvp_op_t *kvp_op (int op);
//  The row a job of op walks when it comes by via: via's own row where op has one, else
//  (cluster: a cluster node's client) the cluster's row where op has one, else kvp_op.
const kvp_op_t *kvp_op_route (int op, kvp_via_t via, bool cluster);
//  The way a job came, from its fields: KVP_VIA_RDMA (job->rdma_conn), KVP_VIA_VM
//  (job->vm.pid), KVP_VIA_NODE (a KVP_OP_*), KVP_VIA_CLUSTER (job->cluster), else
//  KVP_VIA_PROCESS.
kvp_via_t kvp_via_of_job (const kvp_job_t *job);
//  The row a job walks: kvp_op_route (job->op, kvp_via_of_job (job), job->cluster).
const kvp_op_t *kvp_op_of_job (const kvp_job_t *job);
//  The name of a way, for logs and tests ("process", "cluster", "rdma", "vm", "node").
const char *kvp_via_name (kvp_via_t via);

//  The stage after `done` (KVP_JOB_NONE: the job is new) for this job, or KVP_JOB_NONE when
//  the job is to be answered.
kvp_job_kind_t kvp_op_next_stage (const kvp_op_t *self, const kvp_job_t *job, kvp_job_kind_t done);

void kvp_ops_test (bool verbose);

#endif
