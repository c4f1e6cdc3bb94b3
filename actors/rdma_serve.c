/*  rdma_serve.c - this node's side of values moved by RDMA for other nodes (rdma_serve.h).

    DESIGN
    Connections live in a table of MAX_CONNS slots, each with an id that is never reused; when
    the table is full the connection used least recently goes (its node connects again when
    it next needs one, after its request fails with an unknown connection). A move registers
    each local range (unless a registration of this move covers it already: a key asked for
    twice), announces each of the asker's ranges to the connection under a temporary id, hands
    the transfers to the connection (rdma_plan stripes them over its queue pairs), and polls
    until every one is done or the timeout passes. A connection that timed out or whose
    polling failed is destroyed there and then: its queue pairs go, so nothing more moves
    through them, and its transfers count as failed. Registrations end with the move.

    Threads: callers' (the transfer-submitter's thread for connections, its workers for
    moves), serialised by self->lock.
*/
#include "actors/rdma_serve.h"

#include <assert.h>
#include <czmq.h>
#include <pthread.h>

#include "kvpool_status.h"
#include "rdma/rdma.h"

#define MAX_CONNS 256
//  Temporary ids for per-move registrations, far above any segment id.
#define TEMP_ID_BASE 0x80000000u

typedef struct {
    uint64_t id; //  0: free slot
    kvp_rdma_conn_t *conn;
    int64_t last_used;
} slot_t;

struct _rdma_serve_t {
    pthread_mutex_t lock;
    kvp_rdma_t *rdma;
    int timeout_ms;
    slot_t slots[MAX_CONNS];
    uint64_t next_id;
    uint32_t next_temp;
    uint64_t moved;
};

rdma_serve_t *
rdma_serve_new (const char *device, int timeout_ms, char *reason, size_t reason_size)
{
    kvp_rdma_t *rdma = kvp_rdma_open (device, reason, reason_size);
    if (!rdma)
        return NULL;
    rdma_serve_t *self = (rdma_serve_t *) zmalloc (sizeof (rdma_serve_t));
    pthread_mutex_init (&self->lock, NULL);
    self->rdma = rdma;
    self->timeout_ms = timeout_ms;
    return self;
}

void
rdma_serve_destroy (rdma_serve_t **self_p)
{
    rdma_serve_t *self = *self_p;
    if (!self)
        return;
    for (size_t i = 0; i < MAX_CONNS; i++)
        kvp_rdma_conn_destroy (&self->slots[i].conn);
    kvp_rdma_close (&self->rdma);
    pthread_mutex_destroy (&self->lock);
    free (self);
    *self_p = NULL;
}

void
rdma_serve_connect (rdma_serve_t *self, kvp_job_t *job)
{
    char reason[256];
    if (!kvp_job_payload (job, KVP_PAYLOAD_RDMA_CONNECT)) {
        kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "not an RDMA_CONNECT job");
        return;
    }
    pthread_mutex_lock (&self->lock);
    //  A free slot, or the one used least recently.
    slot_t *slot = &self->slots[0];
    for (size_t i = 0; i < MAX_CONNS && slot->id; i++)
        if (!self->slots[i].id || self->slots[i].last_used < slot->last_used)
            slot = &self->slots[i];
    kvp_rdma_conn_destroy (&slot->conn);
    slot->id = 0;
    uint8_t *data = NULL;
    size_t size = 0;
    kvp_rdma_conn_t *conn = kvp_rdma_conn_new (self->rdma, NULL, reason, sizeof reason);
    if (!conn
        || kvp_rdma_conn_connect (conn, job->rdma_connect.data, job->rdma_connect.size, reason,
                                  sizeof reason)
        || kvp_rdma_conn_local_data (conn, &data, &size, reason, sizeof reason)) {
        kvp_rdma_conn_destroy (&conn);
        pthread_mutex_unlock (&self->lock);
        kvp_job_fail (job, KVPOOL_TRANSFER_FAIL, "RDMA connection refused: %s", reason);
        return;
    }
    slot->conn = conn;
    slot->id = ++self->next_id;
    slot->last_used = zclock_mono ();
    free (job->rdma_connect.data);
    job->rdma_connect.data = data;
    job->rdma_connect.size = size;
    job->rdma_conn = slot->id;
    pthread_mutex_unlock (&self->lock);
}

//  One transfer of a move: which item, the local registration it made (0: none), the
//  asker's range's temporary id.
typedef struct {
    size_t item;
    uint32_t local_id, remote_id;
    bool remote_owner; //  this move announced remote_id (the item's first)
} move_t;

static void
s_fail_ok (kvp_job_t *job, int status)
{
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVPOOL_OK)
            job->items[i].status = status;
}

void
rdma_serve_move (rdma_serve_t *self, kvp_job_t *job)
{
    char reason[256];
    bool push = job->kind == KVP_TX_RDMA_PUSH;
    pthread_mutex_lock (&self->lock);
    slot_t *slot = NULL;
    for (size_t i = 0; i < MAX_CONNS && !slot; i++)
        if (self->slots[i].id && self->slots[i].id == job->rdma_conn)
            slot = &self->slots[i];
    if (!slot) {
        pthread_mutex_unlock (&self->lock);
        s_fail_ok (job, KVPOOL_TRANSFER_FAIL);
        kvp_job_fail (job, KVPOOL_OK, "unknown RDMA connection %llu: connect again",
                      (unsigned long long) job->rdma_conn);
        return;
    }
    slot->last_used = zclock_mono ();
    size_t most = 0;
    for (size_t i = 0; i < job->count; i++)
        most += push ? 1 : job->items[i].replica_count;
    move_t *moves = (move_t *) calloc (most ? most : 1, sizeof (move_t));
    kvp_rdma_xfer_t *xfers = (kvp_rdma_xfer_t *) calloc (most ? most : 1, sizeof *xfers);
    assert (moves && xfers);
    size_t count = 0;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK)
            continue;
        uint32_t copies = push ? 1 : item->replica_count;
        for (uint32_t r = 0; r < copies && item->status == KVPOOL_OK; r++) {
            char *local = (char *) item->replicas[r].addr;
            uint64_t len = item->size;
            if (push && job->opt.ranged) {
                if (item->offset > item->size) {
                    item->status = KVPOOL_INVALID_PARAMS;
                    break;
                }
                uint64_t left = item->size - item->offset;
                len = item->length < left ? item->length : left;
                local += item->offset;
                item->size = len; //  the reply's size is the range's
            }
            if (push && len > item->rdma.len) {
                item->status = KVPOOL_BUFFER_OVERFLOW;
                break;
            }
            if (len == 0)
                continue; //  nothing to move
            move_t *move = &moves[count];
            move->item = i;
            if (!kvp_rdma_regs_find (kvp_rdma_regions (self->rdma), (uint64_t) (uintptr_t) local,
                                     len)) {
                move->local_id = TEMP_ID_BASE + self->next_temp++ % 0x10000000u;
                if (kvp_rdma_register (self->rdma, move->local_id, local, len, reason,
                                       sizeof reason)) {
                    move->local_id = 0;
                    item->status = KVPOOL_TRANSFER_FAIL;
                    kvp_job_fail (job, KVPOOL_OK, "RDMA registration: %s", reason);
                    break;
                }
            }
            //  The asker's range, announced once an item (a pull reads it once a replica).
            move->remote_id =
                r ? moves[count - 1].remote_id : TEMP_ID_BASE + self->next_temp++ % 0x10000000u;
            move->remote_owner = r == 0;
            if (r == 0
                && kvp_rdma_conn_add_remote (slot->conn, move->remote_id, item->rdma.addr, len,
                                             item->rdma.key, reason, sizeof reason)) {
                if (move->local_id)
                    kvp_rdma_deregister (self->rdma, move->local_id);
                item->status = KVPOOL_TRANSFER_FAIL;
                kvp_job_fail (job, KVPOOL_OK, "RDMA: %s", reason);
                break;
            }
            xfers[count] = (kvp_rdma_xfer_t){count,
                                             push ? KVP_RDMA_WRITE : KVP_RDMA_READ,
                                             (uint64_t) (uintptr_t) local,
                                             move->remote_id,
                                             0,
                                             len};
            count++;
        }
    }
    bool dead = false;
    if (count && kvp_rdma_conn_submit (slot->conn, xfers, count, reason, sizeof reason)) {
        for (size_t x = 0; x < count; x++)
            job->items[moves[x].item].status = KVPOOL_TRANSFER_FAIL;
        kvp_job_fail (job, KVPOOL_OK, "RDMA: %s", reason);
    }
    else if (count) {
        int64_t deadline = zclock_mono () + self->timeout_ms;
        kvp_rdma_done_t done[64];
        while (kvp_rdma_conn_active (slot->conn) > 0) {
            int n = kvp_rdma_conn_poll (slot->conn, done, 64);
            if (n < 0 || zclock_mono () > deadline) {
                dead = true;
                break;
            }
            for (int d = 0; d < n; d++)
                if (done[d].status != 0) {
                    job->items[moves[done[d].tag].item].status = KVPOOL_TRANSFER_FAIL;
                    kvp_job_fail (job, KVPOOL_OK, "RDMA: %s", kvp_rdma_conn_error (slot->conn));
                }
                else
                    self->moved++;
        }
    }
    if (dead) {
        //  Its queue pairs go now: nothing more moves through them. What did not complete
        //  failed.
        kvp_job_fail (job, KVPOOL_OK, "RDMA: no completion within %d ms", self->timeout_ms);
        kvp_rdma_conn_destroy (&slot->conn);
        slot->id = 0;
        for (size_t x = 0; x < count; x++)
            job->items[moves[x].item].status = KVPOOL_TRANSFER_FAIL;
    }
    for (size_t x = 0; x < count; x++) {
        if (moves[x].local_id)
            kvp_rdma_deregister (self->rdma, moves[x].local_id);
        if (slot->conn && moves[x].remote_owner)
            kvp_rdma_conn_remove_remote (slot->conn, moves[x].remote_id);
    }
    pthread_mutex_unlock (&self->lock);
    free (moves);
    free (xfers);
}

uint64_t
rdma_serve_moved (rdma_serve_t *self)
{
    pthread_mutex_lock (&self->lock);
    uint64_t moved = self->moved;
    pthread_mutex_unlock (&self->lock);
    return moved;
}

//  ---- self test -------------------------------------------------------------------------

void
rdma_serve_test (bool verbose)
{
    //  Serving with the loop device, an asker in this process: connect, a GET pushed (whole,
    //  a range, one too large for its room), an UPSERT pulled into two replicas, an unknown
    //  connection refused.
    char reason[256];
    assert (rdma_serve_new ("no-such-device", 100, reason, sizeof reason) == NULL);
    rdma_serve_t *serve = rdma_serve_new (KVP_RDMA_LOOP_DEVICE, 1000, reason, sizeof reason);
    assert (serve);
    kvp_rdma_t *asker = kvp_rdma_open (KVP_RDMA_LOOP_DEVICE, reason, sizeof reason);
    kvp_rdma_conn_t *conn = kvp_rdma_conn_new (asker, NULL, reason, sizeof reason);
    assert (asker && conn);
    kvp_job_t *job = kvp_job_new (KVP_TX_RDMA_CONNECT, 0);
    assert (kvp_job_payload (job, KVP_PAYLOAD_RDMA_CONNECT));
    assert (kvp_rdma_conn_local_data (conn, &job->rdma_connect.data, &job->rdma_connect.size,
                                      reason, sizeof reason)
            == 0);
    rdma_serve_connect (serve, job);
    assert (job->status == KVPOOL_OK && job->rdma_conn);
    assert (kvp_rdma_conn_connect (conn, job->rdma_connect.data, job->rdma_connect.size, reason,
                                   sizeof reason)
            == 0);
    uint64_t id = job->rdma_conn;
    kvp_job_destroy (&job);

    size_t size = 200000;
    char *value = (char *) malloc (size), *room = (char *) calloc (1, size);
    char *small = (char *) calloc (1, 100);
    for (size_t i = 0; i < size; i++)
        value[i] = (char) (i * 13 + 1);
    assert (kvp_rdma_register (asker, 1, room, size, reason, sizeof reason) == 0);
    assert (kvp_rdma_register (asker, 2, small, 100, reason, sizeof reason) == 0);
    job = kvp_job_new (KVP_TX_RDMA_PUSH, 2);
    kvp_job_need_replicas (job);
    job->rdma_conn = id;
    for (int i = 0; i < 2; i++) {
        job->items[i].size = size;
        job->items[i].replica_count = 1;
        job->items[i].replicas[0].addr = value;
    }
    job->items[0].rdma.addr = (uint64_t) (uintptr_t) room;
    job->items[0].rdma.key = kvp_rdma_regs_by_id (kvp_rdma_regions (asker), 1)->rkey;
    job->items[0].rdma.len = size;
    job->items[1].rdma.addr = (uint64_t) (uintptr_t) small;
    job->items[1].rdma.key = kvp_rdma_regs_by_id (kvp_rdma_regions (asker), 2)->rkey;
    job->items[1].rdma.len = 100;
    rdma_serve_move (serve, job);
    assert (job->items[0].status == KVPOOL_OK && memcmp (room, value, size) == 0);
    assert (job->items[1].status == KVPOOL_BUFFER_OVERFLOW);
    //  A range of the same value into the small room.
    job->opt.ranged = true;
    job->items[0].status = KVPOOL_INVALID_KEY; //  passed over
    job->items[1].status = KVPOOL_OK;
    job->items[1].offset = 1000;
    job->items[1].length = 100;
    rdma_serve_move (serve, job);
    assert (job->items[1].status == KVPOOL_OK && job->items[1].size == 100);
    assert (memcmp (small, value + 1000, 100) == 0);
    kvp_job_destroy (&job);
    assert (rdma_serve_moved (serve) == 2);

    //  An upsert's value pulled from the asker into two replicas.
    char *replicas[2] = {(char *) calloc (1, size), (char *) calloc (1, size)};
    job = kvp_job_new (KVP_TX_RDMA_PULL, 1);
    kvp_job_need_replicas (job);
    job->rdma_conn = id;
    job->items[0].size = size;
    job->items[0].replica_count = 2;
    job->items[0].replicas[0].addr = replicas[0];
    job->items[0].replicas[1].addr = replicas[1];
    job->items[0].rdma.addr = (uint64_t) (uintptr_t) room;
    job->items[0].rdma.key = kvp_rdma_regs_by_id (kvp_rdma_regions (asker), 1)->rkey;
    rdma_serve_move (serve, job);
    assert (job->items[0].status == KVPOOL_OK);
    assert (memcmp (replicas[0], value, size) == 0 && memcmp (replicas[1], value, size) == 0);
    //  The same job on a connection the node does not have.
    job->rdma_conn = id + 1;
    rdma_serve_move (serve, job);
    assert (job->items[0].status == KVPOOL_TRANSFER_FAIL && strstr (job->error, "unknown"));
    kvp_job_destroy (&job);

    kvp_rdma_conn_destroy (&conn);
    kvp_rdma_close (&asker);
    rdma_serve_destroy (&serve);
    free (value);
    free (room);
    free (small);
    free (replicas[0]);
    free (replicas[1]);
    if (verbose)
        printf ("rdma_serve ok ");
}
