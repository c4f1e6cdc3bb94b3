/*  data_plane.c - values moved between nodes over their data planes (data_plane.h).

    DESIGN
    A run is cut into tasks when it is submitted: transfers are grouped by (endpoint, kind,
    ranged) in the order they come, a group closing at 256 keys or task_bytes of values, and a
    range of task_bytes or more is a group of its own. Each task is a transfer_pool call task
    (transfer_batch_add_call), so tasks are spread over the workers' deques and stolen by idle
    workers like the pool's copies. The pool's done callback is the run's.

    A task is one request and its reply, on the connection its worker keeps to that endpoint
    (worker_t.links, created on first use, owned and touched only by that worker's thread;
    the pool joins the workers before data_plane_destroy closes them). The request, its id,
    the wait for its reply and the sockets are dataplane/peer_link.h's, the layer the cluster
    actor's peer control uses too (peer_link_call: ids grow per connection). A connection
    whose node did not answer in time is closed (with its RDMA queue pairs), so a late answer
    can never be taken for a later request's. Connections unused for LINK_IDLE_MS are closed
    when their worker next runs a task.

    A write's value is copied into the request's frame on the worker: the source belongs to
    the caller only until done runs, and libzmq may hold a frame longer than that when a node
    stalls. Values received are kept as the received messages (whole reads) or copied into
    their destinations (ranges).

    That copy also takes the value's checksum when the caller did not know it (the one pass
    over the bytes this node makes anyway), and a whole value received is verified against
    the node's checksum on the worker that received it: both on the workers, in parallel,
    never on the cluster actor's thread (data_plane.h, "Checksums").

    Threads: the pool's workers; data_plane_run from any thread. Ordering: none between tasks.
*/
#include "dataplane/data_plane.h"

#include <assert.h>
#include <czmq.h>
#include <pthread.h>
#include <stdatomic.h>

#include "kvpool_status.h"
#include "protocol/contract.h"
#include "protocol/kvpool.pb-c.h"
#include "dataplane/peer_link.h"
#include "rdma/rdma.h"
#include "infra/curve.h"
#include "transfer/transfer_pool.h"
#include "transfer/value_checksum.h"

#define TASK_MAX_KEYS 256
#define LINK_IDLE_MS 60000
#define LINK_SWEEP_MS 1000
//  A node (or a device) that could not do RDMA is tried again after this long.
#define RDMA_RETRY_MS 10000
//  Ids of a worker's per-task registrations.
#define TEMP_ID_BASE 0x80000000u

typedef struct {
    char name[400];   //  its key in worker_t.links
    peer_link_t *rpc; //  requests and replies
    int64_t last_used;
    kvp_rdma_conn_t *conn; //  RDMA to this node, once connected ...
    uint64_t conn_id;      //  ... and the node's id for it
    int64_t rdma_retry_at; //  it refused: tcp until then
} link_t;

typedef struct {
    zhashx_t *links; //  endpoint -> link_t
    int64_t next_sweep;
    kvp_rdma_t *rdma; //  the device, opened on first use
    int64_t rdma_retry_at;
    uint32_t next_temp;
} worker_t;

struct _data_plane_t {
    transfer_pool_t *pool;
    worker_t *workers;
    int worker_count;
    int timeout_ms;
    char *rdma_device;        //  NULL: tcp alone
    const kvp_curve_t *curve; //  NULL: no CURVE
    atomic_uint_fast64_t requests, timeouts, rdma_transfers;
};

typedef struct _run_t run_t;

typedef struct {
    run_t *run;
    size_t *items; //  indices into run->xfers
    size_t count;
} task_t;

struct _run_t {
    data_plane_t *plane;
    data_plane_xfer_t *xfers;
    size_t count;
    data_plane_put_t put;
    bool has_put;
    data_plane_done_fn *done;
    void *arg;
    task_t *tasks;
    size_t task_count;
    size_t *indices; //  every task's items, in one block
};

//  ---- connections ---------------------------------------------------------------------

static void
s_link_destroy (void **item)
{
    link_t *link = (link_t *) *item;
    if (link) {
        //  The queue pairs go first: nothing moves into memory this side lets go of.
        kvp_rdma_conn_destroy (&link->conn);
        peer_link_destroy (&link->rpc);
        free (link);
        *item = NULL;
    }
}

//  The connection to an endpoint (with CURVE, to the endpoint with that server key: a node
//  that came back with another certificate gets a new one).
static link_t *
s_link (data_plane_t *plane, worker_t *worker, const data_plane_xfer_t *xfer)
{
    char name[400];
    const char *endpoint = xfer->endpoint;
    if (plane->curve && xfer->curve_key && *xfer->curve_key) {
        snprintf (name, sizeof name, "%s#%s", xfer->endpoint, xfer->curve_key);
        endpoint = name;
    }
    int64_t now = zclock_mono ();
    if (now >= worker->next_sweep) {
        worker->next_sweep = now + LINK_SWEEP_MS;
        zlistx_t *idle = zlistx_new ();
        for (link_t *link = (link_t *) zhashx_first (worker->links); link;
             link = (link_t *) zhashx_next (worker->links))
            if (now - link->last_used > LINK_IDLE_MS)
                zlistx_add_end (idle, (void *) zhashx_cursor (worker->links));
        for (const char *key = (const char *) zlistx_first (idle); key;
             key = (const char *) zlistx_next (idle))
            zhashx_delete (worker->links, key);
        zlistx_destroy (&idle);
    }
    link_t *link = (link_t *) zhashx_lookup (worker->links, endpoint);
    if (!link) {
        peer_link_t *rpc = peer_link_new (xfer->endpoint, xfer->curve_key, plane->curve, false);
        if (!rpc)
            return NULL;
        link = (link_t *) zmalloc (sizeof (link_t));
        link->rpc = rpc;
        snprintf (link->name, sizeof link->name, "%s", endpoint);
        zhashx_insert (worker->links, endpoint, link);
    }
    link->last_used = now;
    return link;
}

//  Closes link (its node did not answer, or a send failed): what was queued for the node
//  goes, and the next task to it connects again.
static void
s_link_close (worker_t *worker, link_t *link)
{
    char name[sizeof link->name];
    snprintf (name, sizeof name, "%s", link->name);
    zhashx_delete (worker->links, name);
}

//  ---- a task: one request, one reply ---------------------------------------------------

static void
s_fail (task_t *task, int status, bool answered)
{
    for (size_t k = 0; k < task->count; k++) {
        data_plane_xfer_t *xfer = &task->run->xfers[task->items[k]];
        xfer->status = status;
        xfer->answered = answered;
    }
}

//  One request and its reply on link (peer_link_call), counted.
static peer_link_rc_t
s_link_call (data_plane_t *plane, link_t *link, Kvpool__V1__Request *request, zmq_msg_t *values,
             size_t count, Kvpool__V1__Reply **reply_p, zmq_msg_t **frames_p, size_t *count_p)
{
    atomic_fetch_add_explicit (&plane->requests, 1, memory_order_relaxed);
    peer_link_rc_t rc = peer_link_call (link->rpc, request, values, count, plane->timeout_ms,
                                        reply_p, frames_p, count_p);
    if (rc == PEER_LINK_TIMEOUT)
        atomic_fetch_add_explicit (&plane->timeouts, 1, memory_order_relaxed);
    return rc;
}

//  The versions task's request carries (data_plane_xfer_t): for a read, those asked for; for
//  a write or a reservation, those its values take. NULL when there are none to send (the
//  caller frees the array).
static uint64_t *
s_versions (task_t *task)
{
    run_t *run = task->run;
    data_plane_kind_t kind = run->xfers[task->items[0]].kind;
    if (kind != DATA_PLANE_READ && kind != DATA_PLANE_WRITE && kind != DATA_PLANE_RESERVE)
        return NULL;
    bool any = false;
    for (size_t k = 0; k < task->count && !any; k++)
        any = run->xfers[task->items[k]].version != 0;
    uint64_t *versions = any ? (uint64_t *) malloc (task->count * sizeof (uint64_t)) : NULL;
    for (size_t k = 0; versions && k < task->count; k++)
        versions[k] = run->xfers[task->items[k]].version;
    return versions;
}

//  A reply's version of key k (0: none said).
static uint64_t
s_reply_version (const Kvpool__V1__Reply *reply, size_t k)
{
    return k < reply->n_versions ? reply->versions[k] : 0;
}

//  Sends task's request on link, values with it, and waits for the reply.
static peer_link_rc_t
s_call (task_t *task, link_t *link, Kvpool__V1__Reply **reply_p, zmq_msg_t **frames_p,
        size_t *count_p)
{
    run_t *run = task->run;
    data_plane_xfer_t *first = &run->xfers[task->items[0]];
    size_t n = task->count;
    ProtobufCBinaryData *keys = (ProtobufCBinaryData *) malloc (n * sizeof *keys);
    uint64_t *offsets = (uint64_t *) malloc (n * sizeof (uint64_t));
    uint64_t *lengths = (uint64_t *) malloc (n * sizeof (uint64_t));
    uint64_t *sizes = (uint64_t *) malloc (n * sizeof (uint64_t));
    uint64_t *checksums = (uint64_t *) malloc (n * sizeof (uint64_t));
    assert (keys && offsets && lengths && sizes && checksums);
    bool part = first->kind == DATA_PLANE_PART;
    //  Frames go with writes and parts; put options with what creates an object.
    bool write = first->kind == DATA_PLANE_WRITE || part;
    //  A whole value's bytes are copied into their frame before the header is packed: the
    //  copy takes the value's checksum, unless the caller knew it (value_checksum.h).
    zmq_msg_t *values = write ? (zmq_msg_t *) malloc (n * sizeof (zmq_msg_t)) : NULL;
    assert (values || !write);
    bool hash = first->kind == DATA_PLANE_WRITE && value_checksum_verify ();
    bool any_checksum = false;
    for (size_t k = 0; k < n; k++) {
        data_plane_xfer_t *xfer = &run->xfers[task->items[k]];
        keys[k].data = (uint8_t *) xfer->key;
        keys[k].len = xfer->key_len;
        offsets[k] = xfer->offset;
        lengths[k] = part ? xfer->size : xfer->length;
        sizes[k] = xfer->size;
        if (write) {
            zmq_msg_init_size (&values[k], xfer->size);
            if (hash && !xfer->checksum && xfer->size)
                xfer->checksum =
                    value_copy_checksum (zmq_msg_data (&values[k]), xfer->src, xfer->size);
            else if (xfer->size)
                memcpy (zmq_msg_data (&values[k]), xfer->src, xfer->size);
        }
        checksums[k] = part ? 0 : xfer->checksum;
        any_checksum |= checksums[k] != 0;
    }
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    Kvpool__V1__PutOptions put = KVPOOL__V1__PUT_OPTIONS__INIT;
    request.keys = keys;
    request.n_keys = n;
    bool ranged = part || (first->kind == DATA_PLANE_READ && first->length > 0);
    put.replica_num = 1;
    if (run->has_put) {
        put.soft_pin = run->put.soft_pin;
        put.soft_pin_ttl_ms = run->put.soft_pin_ttl_ms;
        put.hard_pin = run->put.hard_pin;
    }
    switch (first->kind) {
        case DATA_PLANE_READ: request.op = KVPOOL__V1__OP__GET; break;
        //  An upsert: see docs/cluster.md (a copy already there can only be an orphan).
        case DATA_PLANE_WRITE:
            request.op = KVPOOL__V1__OP__UPSERT;
            request.put = &put;
            break;
        case DATA_PLANE_RESERVE:
            request.op = KVPOOL__V1__OP__PUT_START;
            request.put = &put;
            request.sizes = sizes;
            request.n_sizes = n;
            break;
        case DATA_PLANE_PART: request.op = KVPOOL__V1__OP__PUT_PART; break;
        case DATA_PLANE_END: request.op = KVPOOL__V1__OP__PUT_END; break;
        case DATA_PLANE_REVOKE: request.op = KVPOOL__V1__OP__PUT_REVOKE; break;
    }
    if (ranged) {
        request.offsets = offsets;
        request.n_offsets = n;
        request.lengths = lengths;
        request.n_lengths = n;
    }
    //  The writer's checksums (an UPSERT's, a PUT_END's): the node verifies what it got.
    if (any_checksum && (first->kind == DATA_PLANE_WRITE || first->kind == DATA_PLANE_END)) {
        request.checksums = checksums;
        request.n_checksums = n;
    }
    uint64_t *versions = s_versions (task);
    if (versions) {
        request.versions = versions;
        request.n_versions = n;
    }
    peer_link_rc_t rc =
        s_link_call (run->plane, link, &request, values, write ? n : 0, reply_p, frames_p, count_p);
    free (versions);
    free (keys);
    free (offsets);
    free (lengths);
    free (sizes);
    free (checksums);
    free (values);
    return rc;
}

//  A read's checksum, as the node sent it (the whole value's, for a range too), and whether
//  a whole value received does not match it: such bytes are never handed on (the caller
//  reads the next holder). Verified here, on the worker that received them, while they
//  are in its cache; a range is verified by the caller once its stripes are all in.
static bool
s_corrupt (data_plane_xfer_t *xfer, const Kvpool__V1__Reply *reply, size_t k, const void *bytes,
           size_t size)
{
    xfer->checksum = k < reply->n_checksums ? reply->checksums[k] : 0;
    if (xfer->length > 0 || !xfer->checksum || !value_checksum_verify ()
        || value_checksum (bytes, size) == xfer->checksum)
        return false;
    xfer->corrupt = true;
    return true;
}

//  Takes the node's answer: a status per key and, for reads, the bytes.
static void
s_take_reply (task_t *task, Kvpool__V1__Reply *reply, zmq_msg_t *frames, size_t frame_count)
{
    run_t *run = task->run;
    bool read = run->xfers[task->items[0]].kind == DATA_PLANE_READ;
    for (size_t k = 0; k < task->count; k++) {
        data_plane_xfer_t *xfer = &run->xfers[task->items[k]];
        xfer->answered = true;
        int status = reply->status != KVPOOL_OK ? reply->status
                     : k < reply->n_statuses    ? reply->statuses[k]
                                                : KVPOOL_INTERNAL_ERROR;
        if (status == KVPOOL_OK && s_reply_version (reply, k))
            xfer->version = s_reply_version (reply, k);
        if (status == KVPOOL_OK && read) {
            zmq_msg_t *got = k < frame_count ? &frames[k] : NULL;
            size_t got_size = got ? zmq_msg_size (got) : 0;
            if (!got)
                status = KVPOOL_TRANSFER_FAIL;
            else if (xfer->length > 0) {
                //  A range: exactly as long as asked, or it would leave a hole.
                if (got_size != xfer->length)
                    status = KVPOOL_TRANSFER_FAIL;
                else {
                    memcpy (xfer->dst, zmq_msg_data (got), got_size);
                    s_corrupt (xfer, reply, k, NULL, 0); //  (takes the checksum only)
                }
            }
            else if (k >= reply->n_sizes || reply->sizes[k] != got_size)
                status = KVPOOL_TRANSFER_FAIL; //  not the bytes the node says it has
            else if (s_corrupt (xfer, reply, k, zmq_msg_data (got), got_size))
                status = KVPOOL_TRANSFER_FAIL;
            else
                zmq_msg_move (&xfer->frame, got);
        }
        xfer->status = status;
    }
}

//  ---- RDMA ------------------------------------------------------------------------------

static void
s_buffer_free (void *data, void *hint)
{
    (void) hint;
    free (data);
}

//  Whether values to link's node can move by RDMA: connects on first use (RDMA_CONNECT).
static bool
s_rdma_ready (data_plane_t *plane, worker_t *worker, link_t *link)
{
    if (!plane->rdma_device)
        return false;
    if (link->conn)
        return true;
    int64_t now = zclock_mono ();
    if (now < link->rdma_retry_at || now < worker->rdma_retry_at)
        return false;
    char reason[256];
    const char *device = *plane->rdma_device ? plane->rdma_device : NULL; //  "": the first
    if (!worker->rdma && !(worker->rdma = kvp_rdma_open (device, reason, sizeof reason))) {
        worker->rdma_retry_at = now + RDMA_RETRY_MS;
        return false;
    }
    link->rdma_retry_at = now + RDMA_RETRY_MS; //  unless it works out below
    uint8_t *data = NULL;
    size_t size = 0;
    kvp_rdma_conn_t *conn = kvp_rdma_conn_new (worker->rdma, NULL, reason, sizeof reason);
    if (!conn || kvp_rdma_conn_local_data (conn, &data, &size, reason, sizeof reason)) {
        kvp_rdma_conn_destroy (&conn);
        return false;
    }
    Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
    request.op = KVPOOL__V1__OP__RDMA_CONNECT;
    request.rdma_data.data = data;
    request.rdma_data.len = size;
    Kvpool__V1__Reply *reply = NULL;
    zmq_msg_t *frames = NULL;
    size_t count = 0;
    peer_link_rc_t rc = s_link_call (plane, link, &request, NULL, 0, &reply, &frames, &count);
    free (data);
    if (rc == PEER_LINK_SEND_FAILED) {
        kvp_rdma_conn_destroy (&conn);
        return false;
    }
    bool connected = reply && reply->status == KVPOOL_OK && reply->rdma_conn
                     && kvp_rdma_conn_connect (conn, reply->rdma_data.data, reply->rdma_data.len,
                                               reason, sizeof reason)
                            == 0;
    if (connected) {
        link->conn = conn;
        link->conn_id = reply->rdma_conn;
        link->rdma_retry_at = 0;
    }
    else
        kvp_rdma_conn_destroy (&conn);
    peer_link_reply_free (&reply, &frames, count);
    return connected;
}

//  Runs task by RDMA: registers this side's bytes and asks the node to move them. Returns 0
//  when the task is over (every transfer has its status), -1 when nothing was asked of the
//  node and tcp is to do it.
static int
s_task_rdma (task_t *task, worker_t *worker, link_t *link)
{
    run_t *run = task->run;
    data_plane_t *plane = run->plane;
    data_plane_xfer_t *first = &run->xfers[task->items[0]];
    if (first->kind != DATA_PLANE_READ && first->kind != DATA_PLANE_WRITE
        && first->kind != DATA_PLANE_PART)
        return -1;
    size_t n = task->count;
    for (size_t k = 0; k < n; k++) {
        data_plane_xfer_t *xfer = &run->xfers[task->items[k]];
        if (xfer->kind == DATA_PLANE_READ && xfer->length == 0 && xfer->size == 0)
            return -1; //  a whole value of unknown size: no room to offer
    }
    uint64_t *addrs = (uint64_t *) calloc (n, sizeof (uint64_t));
    uint32_t *keys = (uint32_t *) calloc (n, sizeof (uint32_t));
    uint64_t *lens = (uint64_t *) calloc (n, sizeof (uint64_t));
    uint64_t *offsets = (uint64_t *) calloc (n, sizeof (uint64_t));
    uint32_t *temps = (uint32_t *) calloc (n, sizeof (uint32_t));
    char **buffers = (char **) calloc (n, sizeof (char *));
    ProtobufCBinaryData *wire = (ProtobufCBinaryData *) calloc (n, sizeof *wire);
    assert (addrs && keys && lens && offsets && temps && buffers && wire);
    int rc = 0;
    char reason[256];
    const kvp_rdma_regs_t *regions = kvp_rdma_regions (worker->rdma);
    for (size_t k = 0; k < n && rc == 0; k++) {
        data_plane_xfer_t *xfer = &run->xfers[task->items[k]];
        wire[k].data = (uint8_t *) xfer->key;
        wire[k].len = xfer->key_len;
        offsets[k] = xfer->offset;
        char *addr;
        if (xfer->kind == DATA_PLANE_READ && xfer->length > 0) {
            addr = (char *) xfer->dst;
            lens[k] = xfer->length;
        }
        else if (xfer->kind == DATA_PLANE_READ) {
            addr = buffers[k] = (char *) malloc (xfer->size);
            lens[k] = xfer->size;
        }
        else {
            addr = (char *) xfer->src;
            lens[k] = xfer->size;
        }
        if (lens[k] == 0)
            continue; //  nothing to move: no memory named
        if (!addr) {
            rc = -1;
            break;
        }
        addrs[k] = (uint64_t) (uintptr_t) addr;
        if (!kvp_rdma_regs_find (regions, addrs[k], lens[k])) {
            temps[k] = TEMP_ID_BASE + worker->next_temp++ % 0x10000000u;
            if (kvp_rdma_register (worker->rdma, temps[k], addr, lens[k], reason, sizeof reason)) {
                temps[k] = 0;
                rc = -1;
                break;
            }
        }
        keys[k] = kvp_rdma_regs_find (regions, addrs[k], lens[k])->rkey;
    }
    Kvpool__V1__Reply *reply = NULL;
    zmq_msg_t *frames = NULL;
    size_t frame_count = 0;
    uint64_t *versions = rc == 0 ? s_versions (task) : NULL;
    if (rc == 0) {
        Kvpool__V1__Request request = KVPOOL__V1__REQUEST__INIT;
        Kvpool__V1__PutOptions put = KVPOOL__V1__PUT_OPTIONS__INIT;
        request.keys = wire;
        request.n_keys = n;
        if (versions) {
            request.versions = versions;
            request.n_versions = n;
        }
        request.rdma_conn = link->conn_id;
        request.rdma_addrs = addrs;
        request.n_rdma_addrs = n;
        request.rdma_keys = keys;
        request.n_rdma_keys = n;
        put.replica_num = 1;
        if (run->has_put) {
            put.soft_pin = run->put.soft_pin;
            put.soft_pin_ttl_ms = run->put.soft_pin_ttl_ms;
            put.hard_pin = run->put.hard_pin;
        }
        if (first->kind == DATA_PLANE_READ) {
            request.op = KVPOOL__V1__OP__GET;
            request.rdma_lengths = lens;
            request.n_rdma_lengths = n;
            if (first->length > 0) {
                request.offsets = offsets;
                request.n_offsets = n;
                request.lengths = lens;
                request.n_lengths = n;
            }
        }
        else if (first->kind == DATA_PLANE_WRITE) {
            request.op = KVPOOL__V1__OP__UPSERT;
            request.put = &put;
            request.sizes = lens;
            request.n_sizes = n;
        }
        else {
            request.op = KVPOOL__V1__OP__PUT_PART;
            request.offsets = offsets;
            request.n_offsets = n;
            request.lengths = lens;
            request.n_lengths = n;
        }
        if (s_link_call (plane, link, &request, NULL, 0, &reply, &frames, &frame_count)
            == PEER_LINK_SEND_FAILED)
            rc = -1;
        if (rc == 0 && !reply) {
            //  No answer: the queue pairs go before the memory they may write is let go.
            kvp_rdma_conn_destroy (&link->conn);
            s_fail (task, KVPOOL_TRANSFER_FAIL, false);
        }
    }
    size_t moved = 0;
    for (size_t k = 0; reply && k < n; k++) {
        int status = reply->status != KVPOOL_OK ? reply->status
                     : k < reply->n_statuses    ? reply->statuses[k]
                                                : KVPOOL_INTERNAL_ERROR;
        moved += status == KVPOOL_OK;
    }
    if (reply && moved == 0 && n > 0) {
        //  Nothing moved: the node forgot the connection (it restarted, or made room for
        //  others) or cannot move by RDMA now. Connect again later; tcp now.
        kvp_rdma_conn_destroy (&link->conn);
        link->rdma_retry_at = zclock_mono () + RDMA_RETRY_MS;
        rc = -1;
    }
    else if (reply) {
        for (size_t k = 0; k < n; k++) {
            data_plane_xfer_t *xfer = &run->xfers[task->items[k]];
            xfer->answered = true;
            int status = reply->status != KVPOOL_OK ? reply->status
                         : k < reply->n_statuses    ? reply->statuses[k]
                                                    : KVPOOL_INTERNAL_ERROR;
            if (status == KVPOOL_OK && s_reply_version (reply, k))
                xfer->version = s_reply_version (reply, k);
            if (status == KVPOOL_OK && xfer->kind == DATA_PLANE_READ) {
                uint64_t got = k < reply->n_sizes ? reply->sizes[k] : UINT64_MAX;
                if (xfer->length > 0 ? got != xfer->length : got > lens[k])
                    status = KVPOOL_TRANSFER_FAIL; //  not what was asked for
                else if (got > 0 && s_corrupt (xfer, reply, k, buffers[k], got))
                    status = KVPOOL_TRANSFER_FAIL;
                else if (xfer->length == 0) {
                    zmq_msg_close (&xfer->frame);
                    if (got == 0) {
                        free (buffers[k]);
                        zmq_msg_init (&xfer->frame);
                    }
                    else
                        zmq_msg_init_data (&xfer->frame, buffers[k], got, s_buffer_free, NULL);
                    buffers[k] = NULL;
                }
            }
            xfer->status = status;
            if (status == KVPOOL_OK && lens[k] > 0) {
                xfer->rdma = true;
                atomic_fetch_add_explicit (&plane->rdma_transfers, 1, memory_order_relaxed);
            }
        }
    }
    peer_link_reply_free (&reply, &frames, frame_count);
    free (versions);
    for (size_t k = 0; k < n; k++) {
        if (temps[k])
            kvp_rdma_deregister (worker->rdma, temps[k]);
        free (buffers[k]);
    }
    free (addrs);
    free (keys);
    free (lens);
    free (offsets);
    free (temps);
    free (buffers);
    free (wire);
    return rc;
}

static void s_task_tcp (task_t *task, worker_t *worker, link_t *link);

static void
s_task_run (void *arg, int worker_index)
{
    task_t *task = (task_t *) arg;
    data_plane_t *plane = task->run->plane;
    assert (worker_index >= 0 && worker_index < plane->worker_count);
    worker_t *worker = &plane->workers[worker_index];
    link_t *link = s_link (plane, worker, &task->run->xfers[task->items[0]]);
    if (!link) {
        s_fail (task, KVPOOL_TRANSFER_FAIL, false);
        return;
    }
    if (s_rdma_ready (plane, worker, link)) {
        if (s_task_rdma (task, worker, link) == 0) {
            if (!link->conn && !task->run->xfers[task->items[0]].answered) {
                s_link_close (worker, link); //  timed out
                return;
            }
            //  Values larger than the room offered (replaced since the master said their
            //  size) come again over tcp.
            task_t again = {task->run, task->items, 0};
            size_t *items = (size_t *) malloc (task->count * sizeof (size_t));
            assert (items);
            for (size_t k = 0; k < task->count; k++)
                if (task->run->xfers[task->items[k]].status == KVPOOL_BUFFER_OVERFLOW)
                    items[again.count++] = task->items[k];
            again.items = items;
            if (again.count)
                s_task_tcp (&again, worker, link);
            free (items);
            return;
        }
    }
    s_task_tcp (task, worker, link);
}

//  Runs task over tcp: the values in frames.
static void
s_task_tcp (task_t *task, worker_t *worker, link_t *link)
{
    Kvpool__V1__Reply *reply = NULL;
    zmq_msg_t *frames = NULL;
    size_t count = 0;
    if (s_call (task, link, &reply, &frames, &count) != PEER_LINK_OK) {
        //  The node did not answer, or the request did not go: the connection goes, and
        //  with it what is queued.
        s_fail (task, KVPOOL_TRANSFER_FAIL, false);
        s_link_close (worker, link);
        return;
    }
    s_take_reply (task, reply, frames, count);
    peer_link_reply_free (&reply, &frames, count);
}

//  ---- runs --------------------------------------------------------------------------

static void
s_run_done (transfer_batch_t *batch, void *arg)
{
    run_t *run = (run_t *) arg;
    run->done (run->xfers, run->count, run->arg);
    transfer_batch_destroy (&batch);
    free (run->tasks);
    free (run->indices);
    free (run);
}

data_plane_t *
data_plane_new (int workers, int timeout_ms, const char *rdma_device)
{
    if (workers < 1 || timeout_ms < 1)
        return NULL;
    data_plane_t *self = (data_plane_t *) zmalloc (sizeof (data_plane_t));
    self->worker_count = workers;
    self->timeout_ms = timeout_ms;
    self->rdma_device = rdma_device ? strdup (rdma_device) : NULL;
    self->workers = (worker_t *) zmalloc (workers * sizeof (worker_t));
    for (int i = 0; i < workers; i++) {
        self->workers[i].links = zhashx_new ();
        zhashx_set_destructor (self->workers[i].links, s_link_destroy);
    }
    self->pool = transfer_pool_new (workers, 0);
    if (!self->pool) {
        data_plane_destroy (&self);
        return NULL;
    }
    return self;
}

void
data_plane_set_curve (data_plane_t *self, const kvp_curve_t *curve)
{
    self->curve = curve;
}

void
data_plane_destroy (data_plane_t **self_p)
{
    data_plane_t *self = *self_p;
    if (!self)
        return;
    //  The workers are joined first: the connections were theirs.
    transfer_pool_destroy (&self->pool);
    for (int i = 0; i < self->worker_count; i++) {
        zhashx_destroy (&self->workers[i].links);
        kvp_rdma_close (&self->workers[i].rdma);
    }
    free (self->workers);
    free (self->rdma_device);
    free (self);
    *self_p = NULL;
}

typedef struct {
    const char *endpoint;
    data_plane_kind_t kind;
    bool ranged;
    size_t task; //  the open task of this group
    uint64_t bytes;
} group_t;

void
data_plane_run (data_plane_t *self, data_plane_xfer_t *xfers, size_t count,
                const data_plane_put_t *put, uint64_t task_bytes, data_plane_done_fn *done,
                void *arg)
{
    assert (self && done);
    run_t *run = (run_t *) zmalloc (sizeof (run_t));
    run->plane = self;
    run->xfers = xfers;
    run->count = count;
    if (put) {
        run->put = *put;
        run->has_put = true;
    }
    run->done = done;
    run->arg = arg;
    //  Two passes over the groups: count each task's items, then place them.
    run->tasks = (task_t *) zmalloc ((count ? count : 1) * sizeof (task_t));
    run->indices = (size_t *) malloc ((count ? count : 1) * sizeof (size_t));
    size_t *task_of = (size_t *) malloc ((count ? count : 1) * sizeof (size_t));
    group_t *groups = (group_t *) malloc ((count ? count : 1) * sizeof (group_t));
    assert (run->indices && task_of && groups);
    size_t group_count = 0;
    for (size_t i = 0; i < count; i++) {
        data_plane_xfer_t *xfer = &xfers[i];
        xfer->status = KVPOOL_TRANSFER_FAIL;
        xfer->answered = false;
        zmq_msg_init (&xfer->frame);
        bool ranged =
            (xfer->kind == DATA_PLANE_READ && xfer->length > 0) || xfer->kind == DATA_PLANE_PART;
        uint64_t bytes = xfer->kind == DATA_PLANE_READ      ? xfer->length
                         : xfer->kind == DATA_PLANE_RESERVE ? 0
                                                            : xfer->size;
        group_t *group = NULL;
        if (!(ranged && bytes >= task_bytes))
            for (size_t g = 0; g < group_count && !group; g++)
                if (groups[g].kind == xfer->kind && groups[g].ranged == ranged
                    && strcmp (groups[g].endpoint, xfer->endpoint) == 0)
                    group = &groups[g];
        if (!group || group->bytes >= task_bytes
            || run->tasks[group->task].count >= TASK_MAX_KEYS) {
            if (!group)
                group = &groups[group_count++];
            *group = (group_t){xfer->endpoint, xfer->kind, ranged, run->task_count++, 0};
        }
        group->bytes += bytes;
        task_of[i] = group->task;
        run->tasks[group->task].count++;
    }
    size_t at = 0;
    for (size_t t = 0; t < run->task_count; t++) {
        run->tasks[t].run = run;
        run->tasks[t].items = &run->indices[at];
        at += run->tasks[t].count;
        run->tasks[t].count = 0;
    }
    for (size_t i = 0; i < count; i++) {
        task_t *task = &run->tasks[task_of[i]];
        task->items[task->count++] = i;
    }
    free (task_of);
    free (groups);
    transfer_batch_t *batch = transfer_batch_new (s_run_done, run);
    assert (batch);
    for (size_t t = 0; t < run->task_count; t++)
        transfer_batch_add_call (batch, s_task_run, &run->tasks[t]);
    transfer_pool_submit (self->pool, batch);
}

uint64_t
data_plane_requests (data_plane_t *self)
{
    return atomic_load_explicit (&self->requests, memory_order_relaxed);
}

uint64_t
data_plane_timeouts (data_plane_t *self)
{
    return atomic_load_explicit (&self->timeouts, memory_order_relaxed);
}

uint64_t
data_plane_stolen (data_plane_t *self)
{
    return transfer_pool_tasks_stolen (self->pool);
}

uint64_t
data_plane_rdma_transfers (data_plane_t *self)
{
    return atomic_load_explicit (&self->rdma_transfers, memory_order_relaxed);
}

//  ---- self test ------------------------------------------------------------------------

//  A fake node: answers GET from one value ("v" -> 0..size-1 pattern), ranges included, and
//  UPSERT by counting bytes; key "silent" is never answered, key "liar" gets one byte too
//  many.
typedef struct {
    const char *endpoint;
    uint8_t *value;
    size_t size;
    uint64_t written;
} fake_node_t;

static void
s_fake_node (zsock_t *pipe, void *args)
{
    fake_node_t *node = (fake_node_t *) args;
    zsock_t *router = zsock_new_router (node->endpoint);
    assert (router);
    zsock_signal (pipe, 0);
    zpoller_t *poller = zpoller_new (pipe, router, NULL);
    while (true) {
        void *which = zpoller_wait (poller, -1);
        if (which != router)
            break;
        zmsg_t *msg = zmsg_recv (router);
        zframe_t *id = zmsg_pop (msg);
        zframe_t *header = zmsg_pop (msg);
        Kvpool__V1__Request *request =
            kvpool__v1__request__unpack (NULL, zframe_size (header), zframe_data (header));
        assert (request);
        bool silent = false;
        Kvpool__V1__Reply reply = KVPOOL__V1__REPLY__INIT;
        reply.request_id = request->request_id;
        int32_t statuses[TASK_MAX_KEYS];
        uint64_t sizes[TASK_MAX_KEYS];
        zmsg_t *out = zmsg_new ();
        for (size_t k = 0; k < request->n_keys; k++) {
            const char *key = (const char *) request->keys[k].data;
            size_t len = request->keys[k].len;
            silent |= len == 6 && memcmp (key, "silent", 6) == 0;
            statuses[k] = KVPOOL_OK;
            sizes[k] = 0;
            bool framed =
                request->op == KVPOOL__V1__OP__UPSERT || request->op == KVPOOL__V1__OP__PUT_PART;
            if (request->op == KVPOOL__V1__OP__PUT_PART
                && (k >= request->n_offsets || k >= request->n_lengths))
                statuses[k] = KVPOOL_INVALID_PARAMS;
            if (framed) {
                zframe_t *value = zmsg_pop (msg);
                node->written += zframe_size (value);
                zframe_destroy (&value);
            }
            else if (request->op != KVPOOL__V1__OP__GET)
                ; //  PUT_START, PUT_END, PUT_REVOKE: OK
            else if (len == 1 && key[0] == 'v') {
                uint64_t off = k < request->n_offsets ? request->offsets[k] : 0;
                uint64_t want = k < request->n_lengths ? request->lengths[k] : node->size;
                if (off > node->size)
                    off = node->size;
                if (want > node->size - off)
                    want = node->size - off;
                sizes[k] = node->size;
                zmsg_addmem (out, node->value + off, want);
            }
            else if (len == 4 && memcmp (key, "liar", 4) == 0) {
                sizes[k] = 3;
                zmsg_addmem (out, "abcd", 4);
            }
            else {
                statuses[k] = KVPOOL_OBJECT_NOT_FOUND;
                zmsg_addmem (out, NULL, 0);
            }
        }
        reply.statuses = statuses;
        reply.n_statuses = request->n_keys;
        reply.sizes = sizes;
        reply.n_sizes = request->n_keys;
        size_t size = kvpool__v1__reply__get_packed_size (&reply);
        uint8_t *packed = (uint8_t *) malloc (size);
        kvpool__v1__reply__pack (&reply, packed);
        if (request->op != KVPOOL__V1__OP__GET)
            zmsg_destroy (&out), out = zmsg_new ();
        zmsg_pushmem (out, packed, size);
        zmsg_push (out, id);
        free (packed);
        if (silent)
            zmsg_destroy (&out);
        else
            zmsg_send (&out, router);
        kvpool__v1__request__free_unpacked (request, NULL);
        zframe_destroy (&header);
        zmsg_destroy (&msg);
    }
    zpoller_destroy (&poller);
    zsock_destroy (&router);
}

//  A run's end, seen by the test through a mutex (which the race checker sees, where it would
//  not see a message through libzmq).
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
} test_wait_t;

static void
s_test_done (data_plane_xfer_t *xfers, size_t count, void *arg)
{
    (void) xfers;
    (void) count;
    test_wait_t *wait = (test_wait_t *) arg;
    pthread_mutex_lock (&wait->lock);
    wait->done++;
    pthread_cond_signal (&wait->cond);
    pthread_mutex_unlock (&wait->lock);
}

static int
s_test_wait (test_wait_t *wait)
{
    pthread_mutex_lock (&wait->lock);
    while (wait->done == 0)
        pthread_cond_wait (&wait->cond, &wait->lock);
    wait->done--;
    pthread_mutex_unlock (&wait->lock);
    return 0;
}

void
data_plane_test (bool verbose)
{
    char endpoint[64];
    snprintf (endpoint, sizeof endpoint, "inproc://dptest-%d", (int) getpid ());
    fake_node_t node = {endpoint, NULL, 3 << 20, 0};
    node.value = (uint8_t *) malloc (node.size);
    for (size_t i = 0; i < node.size; i++)
        node.value[i] = (uint8_t) (i * 7 + 3);
    zactor_t *fake = zactor_new (s_fake_node, &node);
    test_wait_t wait = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    test_wait_t *done_tx = &wait;
    assert (data_plane_new (0, 100, NULL) == NULL);
    data_plane_t *plane = data_plane_new (3, 300, NULL);
    assert (plane);

    //  A whole read, six striped ranges into one buffer, a missing key, a liar, writes.
    uint8_t *striped = (uint8_t *) malloc (node.size);
    size_t stripe = node.size / 6;
    data_plane_xfer_t xfers[12];
    memset (xfers, 0, sizeof xfers);
    xfers[0] = (data_plane_xfer_t){
        .kind = DATA_PLANE_READ, .endpoint = endpoint, .key = "v", .key_len = 1};
    for (int s = 0; s < 6; s++)
        xfers[1 + s] = (data_plane_xfer_t){.kind = DATA_PLANE_READ,
                                           .endpoint = endpoint,
                                           .key = "v",
                                           .key_len = 1,
                                           .offset = s * stripe,
                                           .length = stripe,
                                           .dst = striped + s * stripe};
    xfers[7] = (data_plane_xfer_t){
        .kind = DATA_PLANE_READ, .endpoint = endpoint, .key = "nope", .key_len = 4};
    xfers[8] = (data_plane_xfer_t){
        .kind = DATA_PLANE_READ, .endpoint = endpoint, .key = "liar", .key_len = 4};
    static const char small[] = "hello";
    for (int w = 0; w < 3; w++)
        xfers[9 + w] = (data_plane_xfer_t){.kind = DATA_PLANE_WRITE,
                                           .endpoint = endpoint,
                                           .key = "w",
                                           .key_len = 1,
                                           .src = w == 2 ? (const void *) node.value : small,
                                           .size = w == 2 ? node.size : 5};
    data_plane_put_t put = {true, 1000, false};
    data_plane_run (plane, xfers, 12, &put, stripe, s_test_done, done_tx);
    assert (s_test_wait (&wait) == 0);
    assert (xfers[0].status == KVPOOL_OK && xfers[0].answered);
    assert (zmq_msg_size (&xfers[0].frame) == node.size);
    assert (memcmp (zmq_msg_data (&xfers[0].frame), node.value, node.size) == 0);
    for (int s = 0; s < 6; s++)
        assert (xfers[1 + s].status == KVPOOL_OK);
    assert (memcmp (striped, node.value, node.size) == 0);
    assert (xfers[7].status == KVPOOL_OBJECT_NOT_FOUND && xfers[7].answered);
    assert (xfers[8].status == KVPOOL_TRANSFER_FAIL && xfers[8].answered);
    for (int w = 0; w < 3; w++)
        assert (xfers[9 + w].status == KVPOOL_OK);
    assert (node.written == 10 + node.size);
    //  Ranges went out as requests of their own (one each), whole reads and writes grouped:
    //  one whole-read request (v, nope, liar) and one of writes (the group was under a
    //  stripe's bytes when the large one came).
    assert (data_plane_requests (plane) == 6 + 1 + 1);
    for (int i = 0; i < 12; i++)
        zmq_msg_close (&xfers[i].frame);

    //  A value in stripes: a reservation, parts (each of a stripe or more goes alone, with
    //  offsets and lengths), an end.
    node.written = 0;
    uint64_t requests = data_plane_requests (plane);
    data_plane_xfer_t parts[5];
    memset (parts, 0, sizeof parts);
    parts[0] = (data_plane_xfer_t){.kind = DATA_PLANE_RESERVE,
                                   .endpoint = endpoint,
                                   .key = "p",
                                   .key_len = 1,
                                   .size = node.size};
    for (int s = 0; s < 3; s++)
        parts[1 + s] = (data_plane_xfer_t){.kind = DATA_PLANE_PART,
                                           .endpoint = endpoint,
                                           .key = "p",
                                           .key_len = 1,
                                           .offset = s * (node.size / 3),
                                           .src = node.value + s * (node.size / 3),
                                           .size = node.size / 3};
    parts[4] =
        (data_plane_xfer_t){.kind = DATA_PLANE_END, .endpoint = endpoint, .key = "p", .key_len = 1};
    data_plane_run (plane, parts, 5, &put, stripe, s_test_done, done_tx);
    assert (s_test_wait (&wait) == 0);
    for (int i = 0; i < 5; i++) {
        assert (parts[i].status == KVPOOL_OK && parts[i].answered);
        zmq_msg_close (&parts[i].frame);
    }
    assert (node.written == node.size);
    assert (data_plane_requests (plane) == requests + 5);

    //  A node that does not answer: the transfer fails in about the timeout, not answered.
    int64_t started = zclock_mono ();
    data_plane_xfer_t quiet = {
        .kind = DATA_PLANE_READ, .endpoint = endpoint, .key = "silent", .key_len = 6};
    data_plane_run (plane, &quiet, 1, NULL, stripe, s_test_done, done_tx);
    assert (s_test_wait (&wait) == 0);
    int64_t took = zclock_mono () - started;
    assert (quiet.status == KVPOOL_TRANSFER_FAIL && !quiet.answered);
    assert (took >= 250 && took < 3000);
    assert (data_plane_timeouts (plane) == 1);
    zmq_msg_close (&quiet.frame);
    //  ... and the connection made again afterwards works.
    data_plane_xfer_t again = {
        .kind = DATA_PLANE_READ, .endpoint = endpoint, .key = "v", .key_len = 1};
    data_plane_run (plane, &again, 1, NULL, stripe, s_test_done, done_tx);
    assert (s_test_wait (&wait) == 0);
    assert (again.status == KVPOOL_OK && zmq_msg_size (&again.frame) == node.size);
    zmq_msg_close (&again.frame);

    //  An empty run is done at once; an endpoint nobody serves times out.
    data_plane_run (plane, NULL, 0, NULL, stripe, s_test_done, done_tx);
    assert (s_test_wait (&wait) == 0);
    data_plane_xfer_t nobody = {.kind = DATA_PLANE_WRITE,
                                .endpoint = "inproc://dptest-nobody",
                                .key = "k",
                                .key_len = 1,
                                .src = small,
                                .size = 5};
    data_plane_run (plane, &nobody, 1, NULL, stripe, s_test_done, done_tx);
    assert (s_test_wait (&wait) == 0);
    assert (nobody.status == KVPOOL_TRANSFER_FAIL && !nobody.answered);

    data_plane_destroy (&plane);
    assert (plane == NULL);
    zactor_destroy (&fake);
    free (striped);
    free (node.value);
    if (verbose)
        printf ("data_plane ok ");
}
