/*  kvp_job.h - the message that moves between kvpool's actors inside one process.

    A client request becomes one kvp_job_t. The api actor creates it, then sends a pointer to
    it (one frame, zsock picture "p") to the actor that must work on it: replica-manager (whose
    thread also runs the allocator and eviction), transfer-submitter or cluster (the stages of its
    operation, messages/ops.h; each job kind belongs to one actor, kvp_job_kind_actor). Each
    of those is a server on an inproc ROUTER socket: it receives [routing id][job pointer],
    does its part, and sends the same pointer back to the routing id. Ownership passes with
    the message: whoever last received the pointer is the only one touching the job.

    A job is batch-native: items[] holds one entry per key, each with its own status.
    Objects (kvp_object_t) are owned by the replica-manager; a job item may reference one
    that the replica-manager pinned for reading (see kvp_object_unpin): the only state shared
    across threads, an atomic count.
*/
#ifndef KVP_JOB_H_INCLUDED
#define KVP_JOB_H_INCLUDED

//  owner_id of another node's request on the data plane: this bit, and a hash of the
//  credential its connection proved (api.c). Nobody outside the node writes into such a
//  reservation (the node copies each PUT_PART in itself), so its space is freed at once when
//  it is revoked.
#define KVP_OWNER_NODE (1ULL << 63)

#include <czmq.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvpool_stats.h"
#include "kvpool_status.h"
#include "protocol/contract.h"

#define KVP_MAX_PREFERRED 8

//  What the job asks of the actor that receives it.
typedef enum {
    KVP_JOB_NONE = 0,
    //  replica-manager
    KVP_RM_RESERVE, //  items: keys (+ sizes) -> reserve pending entries
    KVP_RM_BIND,    //  items: replicas filled by the allocator -> record them (pending)
    KVP_RM_COMMIT,  //  items: make visible (PUT_END)
    KVP_RM_PART,    //  items (offset, src, size): the reservation's replicas, at offset,
                    //  pinned until the copy is sent (PUT_PART)
    KVP_RM_INSERT,  //  items placed and written by a server-side PUT -> committed objects
    KVP_RM_UPSERT,  //  as INSERT, but an existing key's object is replaced
    KVP_RM_REVOKE,  //  items: drop pending entries and free their space
    KVP_RM_GET,     //  items: look up, pin for reading, fill size/replicas/object
    KVP_RM_EXIST,   //  items: look up, grant lease
    KVP_RM_PREFIX,  //  items, job->prefix.ranks a block: OK while every block so far is whole
                    //  (leased), OBJECT_NOT_FOUND from the first missing key's block on
    KVP_RM_GET_SIZE,
    KVP_RM_REPLICA_LIST,   //  items: look up, lease (+ client pin when job->opt.pin)
    KVP_RM_RELEASE,        //  items: drop client pins
    KVP_RM_TOUCH,          //  items: lease them, as a read does (a client's TOUCH)
    KVP_RM_REMOVE,         //  items (with an object_id: only that object); job->opt.force
    KVP_RM_REMOVE_REGEX,   //  job->regex.pattern, job->opt.force -> job->count
    KVP_RM_REMOVE_ALL,     //  job->opt.force -> job->count
    KVP_RM_REMOVE_SEGMENT, //  job->segment.id: drop every replica there (and the objects
                           //  left with none)
    KVP_RM_OWNER_GONE,     //  job->owner_id died: its pins, reservations and revoked
                           //  reservations end
    KVP_RM_STATS,          //  fills job->stats (object side: kvp_job_stats)
    KVP_RM_CONFIG,         //  job->config.setting = job->config.value in its settings (when set)
    KVP_RM_DISK_REGISTER,  //  items (key, size, disk.id, disk.footprint): disk copies found
                           //  at start become disk-only objects
    KVP_RM_DISK_LOST,      //  items (key, disk.id): copies that failed verification
    KVP_RM_PROMOTE,        //  items placed and written from a disk copy: memory replicas
                           //  for disk-only objects
    KVP_RM_ADOPT,          //  at start, with --segment-dir: items (owned keys, size, one
                           //  replica, checksum) adopted from a previous run become
                           //  committed objects; the object log starts afresh with them
    //  allocator
    KVP_AL_ALLOC,          //  items with status OK: place replica_num replicas, fill replicas
    KVP_AL_FREE,           //  items: free their replicas
    KVP_AL_STATS,          //  fills job->stats (space side) and job->segments
    KVP_AL_SEGMENTS,       //  fills job->segments
    KVP_AL_MOUNT,          //  job->segment: name, size, owner
    KVP_AL_UNMOUNT_CHECK,  //  job->segment.id may be unmounted by .owner (NULL: the node)
    KVP_AL_UNMOUNT,        //  job->segment.id (objects must be gone already); .orphan:
                           //  also unlinks its name
    KVP_AL_OWNER_SEGMENTS, //  job->segment.owner: fills job->segments with what it mounted
    KVP_AL_RETRY,          //  as ALLOC, for the items NO_AVAILABLE_HANDLE once room was made
                           //  (the replica-manager's own: actors/replica_evict.c)
    //  transfer-submitter
    KVP_TX_WRITE,        //  items: copy value (src) into every replica
    KVP_TX_DISK_WRITE,   //  items: write a disk copy of src (size bytes); fills disk.id,
                         //  disk.footprint (status not OK: no copy); evict->no_space. The
                         //  replica-manager's, for the objects eviction pinned
    KVP_TX_DISK_READ,    //  items with disk.id and no replica: read and verify the copy into a
                         //  buffer (item->buffer), the value at replicas[0].addr
    KVP_TX_DISK_DROP,    //  items: unlink disk copy disk.id (0: none)
    KVP_TX_DISK_SCAN,    //  at start: items out (owned keys) are the verified copies on disk
    KVP_TX_RDMA_CONNECT, //  job->rdma_connect.data in (the asker's connection data), out
                         //  (this node's); job->rdma_conn out
    KVP_TX_RDMA_PUSH,    //  items OK: the value (its range, job->opt.ranged) written by RDMA
                         //  into the asker's memory (item->rdma: addr, key, room len)
    KVP_TX_RDMA_PULL,    //  items OK: the value read by RDMA from the asker's memory into
                         //  every replica
    //  replica-manager, for the cluster
    KVP_RM_INVENTORY, //  items out (owned keys, sizes): every committed object the node holds
    //  The host hot cache (actors/replica_cache.c): copies of values other nodes hold
    KVP_RM_CACHE_INSERT,  //  items OK, placed and written: hidden cache copies (object_id out)
    KVP_RM_CACHE_PUBLISH, //  items OK (the master took them as cache holders): the copies
                          //  are served; the others go
    KVP_RM_CACHE_DROP,    //  every cache copy goes, and every unconfirmed copy another node
                          //  wrote here (the node registers with its master again)
    KVP_RM_CONFIRM,       //  items (keys, versions): another node's writes here that it
                          //  committed at the master are served from now on (CONFIRM)
    //  cluster (role node: actors/cluster.c)
    KVP_CL_PLACE,   //  items OK: the master reserves them and chooses their nodes (job->plan);
                    //  items not to be held here become KVP_ITEM_ELSEWHERE
    KVP_CL_COMMIT,  //  writes the placed items to their other nodes, then commits them at the
                    //  master (a PUT_END's items: held here alone)
    KVP_CL_ABORT,   //  drops the master's reservations of items not OK (PUT_REVOKE: all)
    KVP_CL_FETCH,   //  GET items OBJECT_NOT_FOUND here: located, read from the nodes that
                    //  hold them (item->buffer)
    KVP_CL_EXIST,   //  EXIST / GET_SIZE items OBJECT_NOT_FOUND here: asked of the master
    KVP_CL_REMOVE,  //  REMOVE, REMOVE_BY_REGEX, REMOVE_ALL, RESET across the cluster
    KVP_CL_LOCATE,  //  items: the nodes that hold them (job->nodes, item->cluster)
    KVP_CL_NODES,   //  job->nodes: the cluster's nodes
    KVP_CL_STATS,   //  fills job->stats (the cluster side)
    KVP_CL_DROPPED, //  items (owned keys): objects this node no longer holds (evicted): the
                    //  master is told; no reply
    KVP_CL_DRAIN,       //  DRAIN: items[0] a node, job->drain.action: the master's answer in
                        //  job->result_count (objects only it holds) and job->drain
    KVP_CL_CACHE_CLAIM, //  items OK (key, version): this node becomes a cache holder of each
                        //  at the master (CACHE); items the master refuses are not OK
    KVP_JOB_KIND_COUNT
} kvp_job_kind_t;

//  The actors that work on jobs (the api only routes them). The replica-manager's thread
//  also does the allocator's work (KVP_AL_*: allocator.h).
typedef enum { KVP_ACTOR_NONE, KVP_ACTOR_RM, KVP_ACTOR_TX, KVP_ACTOR_CL } kvp_actor_t;

//  An item status that is not a kvpool_status_t: placed on other nodes only (KVP_CL_PLACE),
//  so this node's own stages pass over it. Never sent to a client.
#define KVP_ITEM_ELSEWHERE 1
//  Another: the master found room for it on no node (KVP_CL_PLACE). This node's stages pass
//  over it too (it must not make room here, nor be stored here unplaced), and the commit or
//  abort that ends the job answers it KVPOOL_NO_AVAILABLE_HANDLE.
#define KVP_ITEM_CLUSTER_FULL 2

//  A node of the cluster as a reply names it (LOCATE, NODES).
typedef struct {
    char node_id[128];
    char host_id[64];
    char client_endpoint[256];
    char curve_key[41]; //  its CURVE public key (Z85), or ""
    uint64_t capacity, free, objects, last_heard_ms;
    bool alive;
} kvp_node_info_t;

typedef struct {
    uint32_t segment_id;
    uint64_t offset;
    void *addr; //  the replica's bytes as mapped in this process
} kvp_replica_t;

typedef struct _kvp_object_t kvp_object_t;

//  ---- an item's features (each declared with the feature that reads it) -------------------

//  The disk tier: the object's disk copy (0: none) and what it takes on disk; a GET of a
//  disk-only object carries its disk id and no replica until TX_DISK_READ.
typedef struct {
    uint64_t id;
    uint64_t footprint;
    bool evict;   //  TX_DISK_WRITE of an eviction: free the memory once the copy is written
    bool promote; //  a disk read of an object read often enough to go back to memory
    bool lost;    //  TX_DISK_READ: the copy failed verification (to be forgotten, unlinked)
} kvp_item_disk_t;

//  Checksums (transfer/value_checksum.h; 0: unknown / nothing said).
typedef struct {
    //  The value's XXH3-64: taken by TX_WRITE as it copies a frame, the object's for a GET
    //  (Reply.checksums), what a node sent with a value it read (CL_FETCH), an adopted
    //  object's (KVP_RM_ADOPT).
    uint64_t value;
    //  What the request said it must be (Request.checksums): a PUT or UPSERT whose copy
    //  hashed otherwise is refused; a PUT_END's becomes the object's.
    uint64_t expect;
} kvp_item_checksums_t;

//  Values by RDMA (job->rdma_conn): the asking node's memory for this value, its key, and
//  (GET) the room there.
typedef struct {
    uint64_t addr;
    uint32_t key;
    uint64_t len;
} kvp_item_rdma_t;

//  The cluster (role node).
typedef struct {
    //  A PUT_START: the master's token for the key's placement (CL_PLACE), kept on the
    //  reservation and given back at its PUT_END (CL_COMMIT: master.c commits only the
    //  write it placed last).
    uint64_t token;
    //  KVP_CL_LOCATE (and a GET's redirects): the nodes that hold it (indices into
    //  job->nodes.list)
    uint8_t location_count;
    uint16_t locations[KVP_MAX_REPLICAS];
    //  PUT, UPSERT, PUT_START: the nodes that took a replica (placed, then committed); 0 on
    //  one node, where replica_count says it (Reply.replicas_placed)
    uint8_t replicas_placed;
} kvp_item_cluster_t;

typedef struct {
    //  What every stage reads (hot fields first)
    const char *key; //  NUL-terminated; owned by the job's request
    size_t key_len;
    uint64_t size; //  value size
    int status;    //  KVPOOL_OK or a negative kvpool_status_t
    uint32_t replica_count;
    const void *src;         //  KVP_TX_WRITE: the value's bytes (a received frame)
    kvp_replica_t *replicas; //  KVP_MAX_REPLICAS slots once kvp_job_need_replicas ran
    kvp_object_t *object;    //  KVP_RM_GET: the pin on the object (a handle: only for
                             //  kvp_object_unpin, when the send completes)
    uint64_t object_id;      //  the pending object KVP_RM_RESERVE made for the key (PUT_START;
                             //  0: none), which KVP_RM_BIND then finds
    uint64_t offset;         //  a ranged GET (job->opt.ranged), a PUT_PART: the first byte ...
    uint64_t length;         //  ... and at most this many bytes from there
    //  A value read from disk or from another node: owned by the item until it is sent;
    //  freed with buffer_free.
    void *buffer;
    void (*buffer_free) (void *buffer);
    kvp_item_disk_t disk;           //  the disk tier
    kvp_item_checksums_t checksums; //  the value's checksum, and the one the writer expects
    //  Where the value is outside this node's memory: one way or the other, never both
    //  (request_check refuses vm_addrs with an rdma_conn; kvp_via_of_job picks one row).
    union {
        kvp_item_rdma_t rdma; //  values by RDMA (KVP_VIA_RDMA)
        uint64_t vm_addr;     //  a PUT by address (job->vm.pid): the value's place in the
                              //  asking process's memory (KVP_VIA_VM)
    };
    kvp_item_cluster_t cluster; //  the cluster: placement token, locations
    //  The value's version (Reply.versions): a read's and a write's result. Coming in
    //  (Request.versions): the only version a GET, EXIST, GET_SIZE or REMOVE is about (0:
    //  any); the version a node's write on the data plane gives the value.
    uint64_t version;
} kvp_item_t;

//  An eviction cycle's plan and its outcome (the replica-manager's: actors/replica_evict.c
//  plans, actors/replica_tier.c walks).
typedef struct {
    uint64_t want;        //  bytes of memory (rm_evict) or disk (rm_disk_evict) to free
    uint64_t limit;       //  most objects to pin for a disk copy
    uint64_t disk_limit;  //  disk bytes all recorded copies and these may take together
    uint64_t queue_bytes; //  bytes these copies may take while queued (each is a copy in
                          //  memory until it is written); one copy always fits
    uint64_t eager;       //  most committed objects without a disk copy to pin for one
    bool offload;         //  victims without a disk copy are written to disk, not dropped
    bool force;           //  ... and dropped when they cannot be (offload refused)
    bool disk_full;       //  ... and dropped when the disk has no room (its filesystem filled)
    bool soft;            //  soft-pinned objects may go, after all others
    //  outcome
    uint64_t freed_bytes, freed_objects; //  memory freed now (objects dropped or disk-only)
    uint64_t queued, queued_bytes;       //  pinned for a disk copy (freed when written)
    uint64_t skipped, forced;            //  no room for a disk copy: kept / dropped
    uint64_t leased, pinned;             //  passed over for a lease / a pin
    uint64_t disk_bytes, disk_objects;   //  the disk copies recorded, after the job
    uint64_t walk_us;                    //  how long the replica-manager's walk took
    uint64_t no_space;                   //  disk writes refused with ENOSPC or EDQUOT
} kvp_evict_t;

typedef struct {
    uint32_t id;
    char name[256]; //  a shm name, a /proc/<pid>/fd/<fd> or a --segment-dir path
    uint64_t size;
    uint64_t used;
    char owner[64];
    uint64_t device, inode; //  the object the node mapped (segment_identity)
} kvp_segment_info_t;

//  The node's statistics, one member per field of kvpool.proto's message Stats: the
//  replica-manager fills the object side, the allocator the space side, the api the rest.
typedef struct {
#define KVP_STATS_MEMBER(type, name, text) type name;
    KVPOOL_STATS_FIELDS (KVP_STATS_MEMBER)
#undef KVP_STATS_MEMBER
} kvp_stats_t;

//  ---- a job's features (each declared with the feature that reads it) --------------------

//  A put's and a get's options (Request.put, force, pin, offsets, redirect): the operations
//  with keys read the ones that concern them.
typedef struct {
    uint32_t replica_num;
    char *preferred[KVP_MAX_PREFERRED]; //  segment names (owned by the request)
    size_t preferred_count;
    bool soft_pin;
    uint64_t soft_pin_ttl_ms;
    bool hard_pin;
    bool force;    //  REMOVE, REMOVE_BY_REGEX, REMOVE_ALL: pinned objects too
    bool pin;      //  GET_REPLICA_LIST: a client pin
    bool ranged;   //  GET: each item wants only its offset / length range
    bool redirect; //  GET (cluster): large values held elsewhere answer REDIRECT + locations
    bool peer;     //  from another node's data plane: its reads are no client's gets
} kvp_job_options_t;

//  A PUT by address (Request.vm_addrs, the (PUT, KVP_VIA_VM) row): the process whose memory
//  the values are read from (the kernel's word for the peer), else pid 0. Its items carry
//  vm_addr, not src. Set by the api, read by the transfer-submitter's reads.
typedef struct {
    int32_t pid;
    int pidfd;            //  ... that exact process (owners.h): a read is trusted only if it
                          //  still lives after it (its pid was not another's meanwhile)
    uint64_t deadline_ns; //  ... and when reads must have ended (CLOCK_MONOTONIC; 0: any time)
} kvp_job_vm_t;

//  LOCATE, NODES, a cluster GET's redirects: nodes of the cluster (owned by the job).
typedef struct {
    kvp_node_info_t *list;
    size_t count;
} kvp_job_nodes_t;

//  SEGMENTS, STATS, OWNER_GONE, MAP_SEGMENTS: the allocator's segment list (owned by the
//  job).
typedef struct {
    kvp_segment_info_t *list;
    size_t count;
} kvp_job_segments_t;

//  The payloads that one kind of job carries and no other (the union in kvp_job_t): the
//  tag says which is there; kvp_job_destroy frees what it owns.
typedef enum {
    KVP_PAYLOAD_NONE = 0,
    KVP_PAYLOAD_CONFIG,       //  config
    KVP_PAYLOAD_REGEX,        //  regex
    KVP_PAYLOAD_PREFIX,       //  prefix
    KVP_PAYLOAD_SEGMENT,      //  segment
    KVP_PAYLOAD_RDMA_CONNECT, //  rdma_connect (owns its data)
    KVP_PAYLOAD_PROMOTE,      //  promote (owns its bytes)
    KVP_PAYLOAD_DRAIN,        //  drain
} kvp_payload_t;

//  CONFIG: a setting to read or change.
typedef struct {
    const char *setting; //  the setting's name (the request's)
    const char *value;   //  its new value, checked by the api; NULL: a read
} kvp_job_config_t;

//  DRAIN: what to do (the request's pattern: "start", "stop", "" to ask), and what the
//  master answered besides the count.
typedef struct {
    const char *action;
    uint64_t short_count; //  objects the node holds with fewer replicas elsewhere than asked
    bool draining;
} kvp_job_drain_t;

//  REMOVE_BY_REGEX: the keys' pattern (the request's).
typedef struct {
    const char *pattern;
} kvp_job_regex_t;

//  PREFIX_MATCH: keys a block (>= 1; read with kvp_job_ranks).
typedef struct {
    uint32_t ranks;
} kvp_job_prefix_t;

//  A segment named by the request or the node: MOUNT_SEGMENT, UNMOUNT_SEGMENT (and its
//  RM_REMOVE_SEGMENT), ORPHAN_UNMOUNT, OWNER_GONE.
typedef struct {
    uint32_t id;
    const char *name;
    uint64_t size;
    const char *owner; //  MOUNT: the segment's owner; UNMOUNT: who asks (NULL: the node);
                       //  OWNER_GONE: whose segments
    bool orphan;       //  UNMOUNT: the owner is gone, so nobody else will unlink the name
} kvp_job_segment_t;

//  RDMA_CONNECT: connection data, in (the asker's) and out (this node's); owned by the job.
typedef struct {
    uint8_t *data;
    size_t size;
} kvp_job_rdma_connect_t;

//  A promotion (KVP_OP_PROMOTE): the values' bytes, which the job owns (its items' src).
typedef struct {
    void *storage;
} kvp_job_promote_t;

typedef struct {
    kvp_job_kind_t kind;
    int op; //  the client operation (kvpool.v1.Op) this job serves
    //  Set by the api, which walks the job through its operation's stages (messages/ops.h):
    //  the actor it is sent to may run the stages after its own that are its own too, and
    //  answer with kind set to the last one it ran.
    bool walk;
    int status;      //  request-level status
    char error[160]; //  reason when status, or an item's status, is not OK
    size_t count;    //  number of items
    kvp_item_t *items;
    size_t capacity;              //  items allocated
    kvp_replica_t *replica_slots; //  KVP_MAX_REPLICAS per item, made on demand
    //  who made the request: a same-machine client process (owners.h), another node on the
    //  data plane (KVP_OWNER_NODE: by its proven credential), 0 for the node and its
    //  in-process clients. Reservations and read pins belong to it.
    uint64_t owner_id;
    uint64_t result_count; //  REPLY_COUNT: objects removed, leading whole blocks
    uint64_t result_kept;  //  REMOVE_BY_REGEX: objects that matched and were kept by a lease
    kvp_job_options_t opt; //  a put's and a get's options
    kvp_job_vm_t vm;       //  a PUT by address (KVP_VIA_VM)
    uint64_t rdma_conn;    //  values by RDMA on the data plane (KVP_VIA_RDMA): the connection
    //  the cluster (role node): the job walks the cluster's row of its operation; plan is
    //  the cluster actor's (placement between KVP_CL_PLACE and KVP_CL_COMMIT), freed with
    //  the job by plan_free
    bool cluster;
    void *plan;
    void (*plan_free) (void *plan);
    kvp_job_nodes_t nodes;       //  LOCATE, NODES, redirects
    kvp_job_segments_t segments; //  the segment list (SEGMENTS, STATS, OWNER_GONE, ...)
    //  One kind's own payload, by the tag (kvp_job_payload): a job of one kind does not
    //  carry another's.
    kvp_payload_t payload;
    union {
        kvp_job_config_t config;
        kvp_job_regex_t regex;
        kvp_job_prefix_t prefix;
        kvp_job_segment_t segment;
        kvp_job_rdma_connect_t rdma_connect;
        kvp_job_promote_t promote;
        kvp_job_drain_t drain;
    };
    //  Big and rare: made on first use (kvp_job_stats, kvp_job_evict), freed with the job;
    //  NULL in every other job.
    kvp_stats_t *stats; //  STATS (and the node's own reads of its statistics)
    kvp_evict_t *evict; //  KVP_TX_DISK_WRITE of an eviction (the plan, the outcome)
    void *key_chunks;   //  keys copied by kvp_job_append_key, freed with the job
    //  the api's context (client routing id, decoded request, received frames)
    void *context;
    char *key_storage; //  the items' keys when the job owns them (freed with the job)
} kvp_job_t;

//  The actor that works on jobs of this kind.
kvp_actor_t kvp_job_kind_actor (kvp_job_kind_t kind);
//  True for the allocator's kinds (KVP_AL_*), which the replica-manager's thread runs.
bool kvp_job_kind_is_allocators (kvp_job_kind_t kind);

//  Creates a job with count zeroed items. Caller owns the return value.
kvp_job_t *kvp_job_new (kvp_job_kind_t kind, size_t count);
//  Gives every item room for KVP_MAX_REPLICAS replicas (item->replicas). Jobs that never
//  carry replicas (exist, remove, ...) skip this, which keeps a 1000-key job small.
void kvp_job_need_replicas (kvp_job_t *self);
//  Appends a zeroed item (with replica room) and returns it.
kvp_item_t *kvp_job_append (kvp_job_t *self);
//  Appends an item (as kvp_job_append) whose key is a copy of key[0..key_len), owned by the
//  job: for an actor that builds a job of keys it does not own.
kvp_item_t *kvp_job_append_key (kvp_job_t *self, const char *key, size_t key_len);
//  Makes a job of count items whose keys are copies of keys[0..count) (key_lens given), held
//  in one block the job owns: for a job that outlives the request its keys came from.
kvp_job_t *kvp_job_new_owning (kvp_job_kind_t kind, size_t count, const char *const *keys,
                               const size_t *key_lens);
//  Does nothing on NULL; sets *self_p to NULL. Does not touch job->context.
void kvp_job_destroy (kvp_job_t **self_p);
//  Gives the job its kind's payload (the union's member named by kind, zeroed as the job was
//  made; set its fields after this), or keeps the one it has when it is that kind already.
//  Returns false, changing nothing, when the job carries another kind's payload.
bool kvp_job_payload (kvp_job_t *self, kvp_payload_t kind);
//  The job's statistics (STATS), made zeroed on first use. Never NULL.
kvp_stats_t *kvp_job_stats (kvp_job_t *self);
//  The job's eviction plan and outcome (KVP_TX_DISK_WRITE of an eviction), made zeroed on
//  first use. Never NULL.
kvp_evict_t *kvp_job_evict (kvp_job_t *self);
//  PREFIX_MATCH: keys a block (job->prefix.ranks; 1 when not set).
uint32_t kvp_job_ranks (const kvp_job_t *self);
//  PREFIX_MATCH: the number of leading blocks (kvp_job_ranks items each) whose items are all
//  KVPOOL_OK.
uint64_t kvp_job_prefix_count (const kvp_job_t *self);
//  Sets the request-level status and a printf-style reason; returns status.
int kvp_job_fail (kvp_job_t *self, int status, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));

//  Sends the job pointer to a server actor over a DEALER (no routing id) or back to a
//  requester over a ROUTER (with routing id). Return 0 or -1.
int kvp_job_send (zsock_t *dealer, kvp_job_t *job);
int kvp_job_reply (zsock_t *router, zframe_t **routing_id_p, kvp_job_t *job);
//  Receives a job pointer on a DEALER. Returns NULL on a malformed message.
kvp_job_t *kvp_job_recv (zsock_t *dealer);
//  Receives [routing id][job pointer] on a ROUTER. Caller owns *routing_id_p.
kvp_job_t *kvp_job_recv_routed (zsock_t *router, zframe_t **routing_id_p);
//  Jobs sent (kvp_job_send and kvp_job_reply: inproc messages) since the process started,
//  of one kind (by the kind the job had when sent), or of all kinds with KVP_JOB_KIND_COUNT.
//  A self test counts what an operation costs with it (evictor_test).
uint64_t kvp_job_sends (kvp_job_kind_t kind);

//  Self test.
void kvp_job_test (bool verbose);

#endif
