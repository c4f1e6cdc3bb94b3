/*  transfer_submitter.c - the transfer-submitter actor (see transfer_submitter.h).

    DESIGN
    A KVP_TX_WRITE job becomes one transfer batch: one copy per (item, replica), cut into
    chunks by the pool and spread over its workers. The batch's done callback runs on a worker
    thread, which must not touch this actor's sockets, so it pushes the finished job onto a
    mutex-protected list and writes to an eventfd; the actor polls that eventfd beside its
    sockets (zmq_poll accepts plain file descriptors) and answers the finished jobs.

    Checksums (transfer/value_checksum.h): with --verify-checksums on, an item's first replica
    is copied by one task that hashes the frame as it copies it (item->checksum), which the
    replica-manager keeps with the object and checks against the writer's (Request.checksums)
    before it commits. A PUT by address is not hashed here: the kernel does that copy, and a
    second pass would sit on the reply's path; its checksum is taken later, off that path
    (actors/replica_manager.c, rm_checksum).

    A PUT by address (job->vm.pid: Request.vm_addrs) is a KVP_TX_WRITE whose items name a
    place in the client's memory (vm_addr) instead of bytes the node holds (src): each value
    is read from there into its first replica (transfer/vm_read.h) and copied from that
    replica into the others. The values are cut into tasks of up to 64 ranges, each read in
    one process_vm_readv: 256 KiB a task on the pool. Up to 2 MiB such a job never
    comes here: the replica-manager reads it where it placed it, with a helper thread of its
    own (transfer_job_copy with its pool). A value that cannot be read fails
    alone (TRANSFER_FAIL; PERMISSION_DENIED when the kernel lets the node read nothing of the
    process), and the insert then frees its space.

    The disk tier's I/O runs here too (with --disk-dir): a disk store (tier/disk_store.h)
    whose io_uring completions wake this actor through the store's eventfd, polled beside the
    rest. A TX_DISK_WRITE or TX_DISK_READ job queues one disk op per item and is answered when
    the last of them is done, so a batch has all its reads in flight at once. A read that
    fails verification marks its item `lost` (the api then has the copy forgotten and
    unlinked: KVP_OP_DISK_LOST). Unlinks (TX_DISK_DROP) and the start-up scan (TX_DISK_SCAN)
    are synchronous.

    Threads: the actor's own, plus the pool's workers (only in copies and the done callback).
    Ordering: jobs are answered as they finish, not necessarily in arrival order.
*/
#include "actors/transfer_submitter.h"

#include "infra/log.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "actors/rdma_serve.h"
#include "infra/actor_shell.h"
#include "tier/disk_store.h"
#include "transfer/transfer_pool.h"
#include "transfer/value_checksum.h"
#include "transfer/vm_read.h"

//  The bytes of values by address one task reads, in one system call when all goes well:
//  small enough that a helper that starts late still takes its share. A thread that reads
//  a whole job alone takes them a megabyte at a time.
#define VM_TASK_BYTES (256 * 1024)
#define VM_TASK_ALONE_BYTES (1024 * 1024)
//  A job of up to this many bytes is read by the replica-manager's thread alone: waking its
//  helper costs more than the helper saves (measured: one 1 MiB value 179-186 us alone,
//  193-216 us shared).
#define VM_READ_ALONE_BYTES (1024 * 1024)

//  Bytes [offset, offset + length) of an item's value by address, and how their read went.
typedef struct {
    kvp_item_t *item;
    uint64_t offset;
    uint64_t length;
    int error; //  0 when read
} vm_piece_t;

//  One task: pieces that add up to its task size at most (VM_READV_MAX at most).
typedef struct {
    const kvp_job_t *job; //  whose process (vm.pid, vm.pidfd) and deadline
    vm_piece_t *pieces;
    size_t count;
} vm_task_t;

typedef struct {
    size_t task_count, piece_count;
    vm_task_t *tasks; //  after the pieces, in the same allocation
    vm_piece_t pieces[];
} vm_tasks_t;

typedef struct _pending_t {
    kvp_job_t *job;
    zframe_t *reply_to;
    transfer_batch_t *batch;
    void *move;     //  an RDMA move's task argument, freed with the entry
    vm_tasks_t *vm; //  a PUT by address: its tasks, whose outcomes the reply takes
    struct _pending_t *next;
} pending_t;

typedef struct {
    zsock_t *pipe;
    zsock_t *router;
    transfer_pool_t *pool;
    int wake_fd;
    pthread_mutex_t lock; //  guards done
    pending_t *done;      //  finished batches, pushed by workers
    size_t in_flight;
    disk_store_t *disk; //  the disk tier, or NULL
    char disk_error[200];
    rdma_serve_t *rdma; //  values by RDMA for other nodes (config->rdma), or NULL
    char rdma_error[256];
    bool terminated;
} self_t;

//  A disk job under way: answered when its last op is done.
typedef struct {
    self_t *self;
    kvp_job_t *job;
    zframe_t *reply_to;
    size_t ops; //  ops not done yet
} disk_job_t;

//  One item's disk op.
typedef struct {
    disk_job_t *owner;
    kvp_item_t *item;
} disk_op_t;

//  The done callback needs both the actor and the pending entry.
typedef struct {
    self_t *self;
    pending_t *pending;
} done_arg_t;

//  An RDMA move, run as a call task on a worker.
typedef struct {
    rdma_serve_t *rdma;
    kvp_job_t *job;
} rdma_move_t;

static void
s_on_done (transfer_batch_t *batch, void *arg)
{
    done_arg_t *done = (done_arg_t *) arg;
    self_t *self = done->self;
    pthread_mutex_lock (&self->lock);
    done->pending->next = self->done;
    self->done = done->pending;
    pthread_mutex_unlock (&self->lock);
    uint64_t one = 1;
    ssize_t rc = write (self->wake_fd, &one, sizeof one);
    (void) rc;
    free (done);
    (void) batch;
}

uint64_t
transfer_job_bytes (kvp_job_t *job)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVPOOL_OK && (job->items[i].src || job->vm.pid))
            bytes += job->items[i].size * job->items[i].replica_count;
    return bytes;
}

//  Whether bytes just read from the client are its own and in time: it still lives (the
//  pid process_vm_readv named could otherwise be another process's by now; the pidfd names
//  that exact client and is readable once it exits) and its deadline has not passed (it may
//  have reused its memory since: the bytes are not trusted). Returns 0, ESRCH or ETIMEDOUT.
static int
s_vm_trusted (const kvp_job_t *job)
{
    struct pollfd exited = {job->vm.pidfd, POLLIN, 0};
    if (job->vm.pidfd >= 0 && poll (&exited, 1, 0) != 0)
        return ESRCH;
    if (job->vm.deadline_ns) {
        struct timespec ts;
        clock_gettime (CLOCK_MONOTONIC, &ts);
        if ((uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec > job->vm.deadline_ns)
            return ETIMEDOUT;
    }
    return 0;
}

//  Reads a task's pieces into their items' first replicas, all in one vm_readv; when that
//  fails, piece by piece to learn which could not be read. Pieces read and trusted are
//  copied from the first replica into the others.
static void
s_vm_task_run (vm_task_t *task)
{
    const kvp_job_t *job = task->job;
    struct iovec local[VM_READV_MAX], remote[VM_READV_MAX];
    assert (task->count <= VM_READV_MAX);
    for (size_t k = 0; k < task->count; k++) {
        vm_piece_t *piece = &task->pieces[k];
        local[k] =
            (struct iovec){(char *) piece->item->replicas[0].addr + piece->offset, piece->length};
        remote[k] = (struct iovec){(void *) (uintptr_t) (piece->item->vm_addr + piece->offset),
                                   piece->length};
    }
    if (vm_readv (job->vm.pid, local, remote, task->count) == 0) {
        int trusted = s_vm_trusted (job);
        for (size_t k = 0; k < task->count; k++)
            task->pieces[k].error = trusted;
    }
    else
        //  Each piece alone, each trusted right after its own read: a value that cannot be
        //  read fails alone, and its neighbours' reads are judged by when they ended.
        for (size_t k = 0; k < task->count; k++) {
            int error = vm_read (job->vm.pid, local[k].iov_base,
                                 (uint64_t) (uintptr_t) remote[k].iov_base, local[k].iov_len);
            task->pieces[k].error = error ? error : s_vm_trusted (job);
        }
    for (size_t k = 0; k < task->count; k++) {
        vm_piece_t *piece = &task->pieces[k];
        kvp_item_t *item = piece->item;
        for (uint32_t r = 1; r < item->replica_count && !piece->error; r++)
            memcpy ((char *) item->replicas[r].addr + piece->offset, local[k].iov_base,
                    piece->length);
    }
}

//  The status of a value by address that vm_read could not read, with the reason.
static void
s_vm_failed (kvp_job_t *job, kvp_item_t *item, int error)
{
    bool denied = error == EPERM || error == EACCES;
    item->status = denied ? KVPOOL_PERMISSION_DENIED : KVPOOL_TRANSFER_FAIL;
    snprintf (job->error, sizeof job->error, "cannot read a value from process %d: %s",
              (int) job->vm.pid,
              denied               ? "the kernel does not let the node read its memory"
              : error == ETIMEDOUT ? "read after the client's deadline"
                                   : strerror (error));
}

static void
s_vm_task (void *arg, int worker)
{
    s_vm_task_run ((vm_task_t *) arg);
    (void) worker;
}

bool
transfer_job_inline (kvp_job_t *job)
{
    return transfer_job_bytes (job)
           <= (job->vm.pid ? TRANSFER_INLINE_BY_ADDRESS_BYTES : TRANSFER_INLINE_BYTES);
}

//  An item to write with no bytes to write from would be committed holding whatever its
//  space held before: it fails instead (no row should ever make one).
static void
s_refuse_sourceless (kvp_job_t *job)
{
    if (job->vm.pid)
        return; //  its values are in the client's memory
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVPOOL_OK && !job->items[i].src && job->items[i].size) {
            job->items[i].status = KVPOOL_INTERNAL_ERROR;
            snprintf (job->error, sizeof job->error, "a value to write came without its bytes");
        }
}

//  Cuts a PUT by address's values into tasks: in order, a task takes values (or their
//  parts) until it holds task_bytes or VM_READV_MAX pieces. Counts them, and with out
//  fills out's arrays too.
static void
s_vm_cut (kvp_job_t *job, uint64_t task_bytes, vm_tasks_t *out, size_t *task_count,
          size_t *piece_count)
{
    size_t tasks = 0, pieces = 0, in_task = 0;
    uint64_t room = 0;
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK)
            continue;
        for (uint64_t offset = 0; offset < item->size;) {
            if (room == 0 || in_task == VM_READV_MAX) {
                if (out)
                    out->tasks[tasks] =
                        (vm_task_t){.job = job, .pieces = &out->pieces[pieces], .count = 0};
                tasks++;
                room = task_bytes;
                in_task = 0;
            }
            uint64_t left = item->size - offset;
            uint64_t length = left < room ? left : room;
            if (out) {
                out->pieces[pieces] =
                    (vm_piece_t){.item = item, .offset = offset, .length = length};
                out->tasks[tasks - 1].count++;
            }
            pieces++;
            in_task++;
            room -= length;
            offset += length;
        }
    }
    *task_count = tasks;
    *piece_count = pieces;
}

//  A PUT by address as tasks (s_vm_cut); with a batch, added to it as pool calls. Returns
//  the tasks (whose outcomes s_vm_tasks_done takes), or NULL out of memory.
static vm_tasks_t *
s_vm_tasks (kvp_job_t *job, uint64_t task_bytes, transfer_batch_t *batch)
{
    size_t task_count, piece_count;
    s_vm_cut (job, task_bytes, NULL, &task_count, &piece_count);
    vm_tasks_t *tasks = (vm_tasks_t *) malloc (
        sizeof (vm_tasks_t) + piece_count * sizeof (vm_piece_t) + task_count * sizeof (vm_task_t));
    if (!tasks)
        return NULL;
    tasks->task_count = task_count;
    tasks->piece_count = piece_count;
    tasks->tasks = (vm_task_t *) &tasks->pieces[piece_count];
    s_vm_cut (job, task_bytes, tasks, &task_count, &piece_count);
    for (size_t t = 0; batch && t < task_count; t++)
        transfer_batch_add_call (batch, s_vm_task, &tasks->tasks[t]);
    return tasks;
}

//  The tasks done: a value with a piece that could not be read fails. Frees them.
static void
s_vm_tasks_done (kvp_job_t *job, vm_tasks_t **tasks_p)
{
    vm_tasks_t *tasks = *tasks_p;
    for (size_t k = 0; tasks && k < tasks->piece_count; k++) {
        vm_piece_t *piece = &tasks->pieces[k];
        if (piece->error && piece->item->status == KVPOOL_OK)
            s_vm_failed (job, piece->item, piece->error);
    }
    free (tasks);
    *tasks_p = NULL;
}

//  Out of memory for the tasks: no value is read, and none may be inserted.
static void
s_vm_fail_all (kvp_job_t *job)
{
    for (size_t i = 0; i < job->count; i++)
        if (job->items[i].status == KVPOOL_OK)
            s_vm_failed (job, &job->items[i], ENOMEM);
}

//  A PUT by address read here: on this thread alone, or, past VM_READ_ALONE_BYTES and with
//  a pool, on the pool with this thread's help, which waits.
static void
s_read_vm_here (kvp_job_t *job, transfer_pool_t *pool)
{
    bool shared = pool && transfer_job_bytes (job) > VM_READ_ALONE_BYTES;
    transfer_batch_t *batch = shared ? transfer_batch_new (NULL, NULL) : NULL;
    vm_tasks_t *tasks = !shared || batch
                            ? s_vm_tasks (job, shared ? VM_TASK_BYTES : VM_TASK_ALONE_BYTES, batch)
                            : NULL;
    if (!tasks) {
        transfer_batch_destroy (&batch);
        s_vm_fail_all (job);
        return;
    }
    if (batch) {
        transfer_pool_submit (pool, batch);
        transfer_batch_wait (pool, batch);
        transfer_batch_destroy (&batch);
    }
    else
        for (size_t t = 0; t < tasks->task_count; t++)
            s_vm_task_run (&tasks->tasks[t]);
    s_vm_tasks_done (job, &tasks);
}

//  On a worker (or inline): an item's first replica copied from its frame and the value's
//  checksum taken in the same pass (value_checksum.h), while the bytes are in the cache.
//  Only this task writes the item's checksum, and the job is not looked at before the
//  batch is done.
static void
s_copy_hashed (void *arg, int worker)
{
    kvp_item_t *item = (kvp_item_t *) arg;
    item->checksums.value = value_copy_checksum (item->replicas[0].addr, item->src, item->size);
    (void) worker;
}

void
transfer_job_copy (kvp_job_t *job, transfer_pool_t *pool)
{
    if (job->vm.pid) {
        s_read_vm_here (job, pool);
        return;
    }
    s_refuse_sourceless (job);
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK || !item->src)
            continue;
        bool hashed = item->replica_count && value_checksum_verify ();
        if (hashed)
            s_copy_hashed (item, 0);
        for (uint32_t r = hashed; r < item->replica_count; r++)
            memcpy (item->replicas[r].addr, item->src, item->size);
    }
}

static void
s_write (self_t *self, kvp_job_t *job, zframe_t **reply_to_p)
{
    //  Small puts never come here: they are copied where they are (transfer_job_inline).
    pending_t *pending = (pending_t *) zmalloc (sizeof (pending_t));
    done_arg_t *done = (done_arg_t *) zmalloc (sizeof (done_arg_t));
    done->self = self;
    done->pending = pending;
    pending->job = job;
    pending->reply_to = *reply_to_p;
    *reply_to_p = NULL;
    pending->batch = transfer_batch_new (s_on_done, done);
    if (job->vm.pid) {
        pending->vm = s_vm_tasks (job, VM_TASK_BYTES, pending->batch);
        if (!pending->vm)
            s_vm_fail_all (job);
        self->in_flight++;
        transfer_pool_submit (self->pool, pending->batch);
        return;
    }
    s_refuse_sourceless (job);
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK || !item->src)
            continue;
        //  The first replica is one task that hashes as it copies (a value is then copied by
        //  one worker, not cut into chunks: a batch's values still spread over the workers);
        //  the others are plain copies.
        bool hashed = item->replica_count && value_checksum_verify ();
        if (hashed)
            transfer_batch_add_call (pending->batch, s_copy_hashed, item);
        for (uint32_t r = hashed; r < item->replica_count; r++)
            transfer_batch_add_copy (pending->batch, item->replicas[r].addr, item->src, item->size);
    }
    self->in_flight++;
    transfer_pool_submit (self->pool, pending->batch);
}

static void
s_rdma_move (void *arg, int worker)
{
    rdma_move_t *move = (rdma_move_t *) arg;
    rdma_serve_move (move->rdma, move->job);
    (void) worker;
}

//  TX_RDMA_CONNECT here; TX_RDMA_PUSH and TX_RDMA_PULL on a worker, which waits for the
//  completions (rdma_serve.h).
static void
s_rdma_job (self_t *self, kvp_job_t *job, zframe_t **reply_to_p)
{
    if (!self->rdma) {
        //  Item by item, not the job: an upsert's next stage frees the space placed for it.
        kvp_job_fail (job, job->kind == KVP_TX_RDMA_CONNECT ? KVPOOL_TRANSFER_FAIL : KVPOOL_OK,
                      "this node moves no values by RDMA%s%s", self->rdma_error[0] ? ": " : "",
                      self->rdma_error);
        for (size_t i = 0; i < job->count; i++)
            if (job->items[i].status == KVPOOL_OK)
                job->items[i].status = KVPOOL_TRANSFER_FAIL;
        kvp_job_reply (self->router, reply_to_p, job);
        return;
    }
    if (job->kind == KVP_TX_RDMA_CONNECT) {
        rdma_serve_connect (self->rdma, job);
        kvp_job_reply (self->router, reply_to_p, job);
        return;
    }
    pending_t *pending = (pending_t *) zmalloc (sizeof (pending_t));
    done_arg_t *done = (done_arg_t *) zmalloc (sizeof (done_arg_t));
    rdma_move_t *move = (rdma_move_t *) zmalloc (sizeof (rdma_move_t));
    done->self = self;
    done->pending = pending;
    move->rdma = self->rdma;
    move->job = job;
    pending->job = job;
    pending->reply_to = *reply_to_p;
    pending->move = move;
    *reply_to_p = NULL;
    pending->batch = transfer_batch_new (s_on_done, done);
    transfer_batch_add_call (pending->batch, s_rdma_move, move);
    self->in_flight++;
    transfer_pool_submit (self->pool, pending->batch);
}

static void
s_answer_done (self_t *self)
{
    uint64_t count;
    ssize_t rc = read (self->wake_fd, &count, sizeof count);
    (void) rc;
    pthread_mutex_lock (&self->lock);
    pending_t *list = self->done;
    self->done = NULL;
    pthread_mutex_unlock (&self->lock);
    while (list) {
        pending_t *next = list->next;
        transfer_batch_destroy (&list->batch);
        free (list->move);
        s_vm_tasks_done (list->job, &list->vm);
        kvp_job_reply (self->router, &list->reply_to, list->job);
        zframe_destroy (&list->reply_to);
        free (list);
        self->in_flight--;
        list = next;
    }
}

//  ---- the disk tier ------------------------------------------------------------------

static void
s_disk_buffer_free (void *buffer)
{
    disk_buffer_t *disk_buffer = (disk_buffer_t *) buffer;
    disk_buffer_destroy (&disk_buffer);
}

static void
s_disk_job_end (disk_job_t *pending)
{
    self_t *self = pending->self;
    kvp_job_reply (self->router, &pending->reply_to, pending->job);
    zframe_destroy (&pending->reply_to);
    free (pending);
    self->in_flight--;
}

static void
s_disk_done (void *arg, int status, const disk_copy_t *copy, disk_buffer_t **buffer_p)
{
    disk_op_t *op = (disk_op_t *) arg;
    disk_job_t *pending = op->owner;
    kvp_item_t *item = op->item;
    kvp_job_t *job = pending->job;
    if (job->kind == KVP_TX_DISK_WRITE) {
        if (status == 0) {
            item->disk.id = copy->id;
            item->disk.footprint = copy->footprint;
        }
        else {
            item->status = KVPOOL_WRITE_FAIL;
            snprintf (job->error, sizeof job->error, "disk tier write: %s", strerror (-status));
            if (status == -ENOSPC || status == -EDQUOT)
                kvp_job_evict (job)->no_space++; //  the evictor lowers the disk's capacity
        }
    }
    else if (status == 0) {
        item->buffer = *buffer_p;
        item->buffer_free = s_disk_buffer_free;
        *buffer_p = NULL;
        item->replicas[0].addr = (void *) disk_buffer_data ((disk_buffer_t *) item->buffer);
        item->size = disk_buffer_size ((disk_buffer_t *) item->buffer);
    }
    else if (status == -ENOENT)
        item->status = KVPOOL_OBJECT_NOT_FOUND; //  removed since the replica-manager said
    else {
        //  -EBADMSG: the copy is not what was written. The key is lost, never served wrong.
        item->status = status == -EBADMSG ? KVPOOL_OBJECT_NOT_FOUND : KVPOOL_TRANSFER_FAIL;
        item->disk.lost = status == -EBADMSG;
        snprintf (job->error, sizeof job->error, "disk tier read: %s",
                  status == -EBADMSG ? "a copy failed verification and was dropped"
                                     : strerror (-status));
    }
    free (op);
    if (--pending->ops == 0)
        s_disk_job_end (pending);
}

//  TX_DISK_WRITE (items: key, src, size) and TX_DISK_READ (items: key, disk_id, size).
static void
s_disk_io (self_t *self, kvp_job_t *job, zframe_t **reply_to_p)
{
    disk_job_t *pending = (disk_job_t *) zmalloc (sizeof (disk_job_t));
    pending->self = self;
    pending->job = job;
    pending->reply_to = *reply_to_p;
    *reply_to_p = NULL;
    pending->ops = 1; //  held until every op is queued
    self->in_flight++;
    bool write = job->kind == KVP_TX_DISK_WRITE;
    if (!write)
        kvp_job_need_replicas (job);
    for (size_t i = 0; i < job->count; i++) {
        kvp_item_t *item = &job->items[i];
        if (item->status != KVPOOL_OK
            || (write ? !item->src : !item->disk.id || item->replica_count))
            continue;
        disk_op_t *op = (disk_op_t *) zmalloc (sizeof (disk_op_t));
        op->owner = pending;
        op->item = item;
        pending->ops++;
        int rc = write ? disk_store_write (self->disk, item->key, item->key_len, item->src,
                                           item->size, s_disk_done, op)
                       : disk_store_read (self->disk, item->disk.id, item->key, item->key_len,
                                          item->size, s_disk_done, op);
        if (rc != 0) {
            free (op);
            pending->ops--;
            item->status = write ? KVPOOL_WRITE_FAIL : KVPOOL_TRANSFER_FAIL;
            snprintf (job->error, sizeof job->error, "disk tier: %s", strerror (-rc));
        }
    }
    if (--pending->ops == 0)
        s_disk_job_end (pending);
}

static void
s_disk_found (void *arg, const char *key, size_t key_len, const disk_copy_t *copy)
{
    kvp_item_t *item = kvp_job_append_key ((kvp_job_t *) arg, key, key_len);
    item->disk.id = copy->id;
    item->size = copy->size;
    item->disk.footprint = copy->footprint;
}

//  TX_DISK_SCAN: what a previous run left on disk, verified (tier/disk_store.h).
static void
s_disk_scan (self_t *self, kvp_job_t *job)
{
    disk_scan_report_t report;
    int rc = disk_store_scan (self->disk, s_disk_found, job, &report);
    if (rc != 0) {
        job->count = 0;
        kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "scan failed: %s", strerror (-rc));
        return;
    }
    if (report.partial_dropped || report.corrupt_dropped)
        kvp_warning ("kvpoold: disk tier: %llu half-written and %llu corrupt files dropped",
                     (unsigned long long) report.partial_dropped,
                     (unsigned long long) report.corrupt_dropped);
    if (report.not_regular)
        kvp_warning ("kvpoold: disk tier: %llu names of copies are not regular files (a "
                     "symlink, a FIFO, a device; the first: %s): skipped, never opened",
                     (unsigned long long) report.not_regular, report.not_regular_example);
}

static void
s_disk_job (self_t *self, kvp_job_t *job, zframe_t **reply_to_p)
{
    if (!self->disk) {
        kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "%s",
                      self->disk_error[0] ? self->disk_error : "this node has no disk tier");
        for (size_t i = 0; i < job->count; i++)
            if (job->kind != KVP_TX_DISK_DROP && job->items[i].status == KVPOOL_OK)
                job->items[i].status = KVPOOL_TRANSFER_FAIL;
    }
    else if (job->kind == KVP_TX_DISK_WRITE || job->kind == KVP_TX_DISK_READ) {
        s_disk_io (self, job, reply_to_p);
        return;
    }
    else if (job->kind == KVP_TX_DISK_SCAN)
        s_disk_scan (self, job);
    else
        for (size_t i = 0; i < job->count; i++)
            if (job->items[i].disk.id)
                disk_store_drop (self->disk, job->items[i].disk.id, NULL, NULL);
    kvp_job_reply (self->router, reply_to_p, job);
}

static int
s_router_reader (actor_shell_t *shell, zsock_t *router, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    zframe_t *reply_to;
    kvp_job_t *job = kvp_job_recv_routed (router, &reply_to);
    if (job && job->kind == KVP_TX_WRITE)
        s_write (self, job, &reply_to);
    else if (job
             && (job->kind == KVP_TX_DISK_WRITE || job->kind == KVP_TX_DISK_READ
                 || job->kind == KVP_TX_DISK_DROP || job->kind == KVP_TX_DISK_SCAN))
        s_disk_job (self, job, &reply_to);
    else if (job
             && (job->kind == KVP_TX_RDMA_CONNECT || job->kind == KVP_TX_RDMA_PUSH
                 || job->kind == KVP_TX_RDMA_PULL))
        s_rdma_job (self, job, &reply_to);
    else if (job) {
        kvp_job_fail (job, KVPOOL_INTERNAL_ERROR, "transfer: job kind %d", job->kind);
        kvp_job_reply (router, &reply_to, job);
    }
    zframe_destroy (&reply_to);
    return 0;
}

//  The workers finished copies (the eventfd): their jobs go back.
static int
s_wake_reader (actor_shell_t *shell, int fd, void *arg)
{
    (void) shell, (void) fd;
    s_answer_done ((self_t *) arg);
    return 0;
}

static int
s_disk_reader (actor_shell_t *shell, int fd, void *arg)
{
    (void) shell, (void) fd;
    disk_store_reap (((self_t *) arg)->disk);
    return 0;
}

//  $TERM: the copies in flight are finished, but no more work is accepted (s_tick).
static int
s_term (actor_shell_t *shell, void *arg)
{
    (void) shell;
    ((self_t *) arg)->terminated = true;
    return 1;
}

static int64_t
s_tick (actor_shell_t *shell, void *arg)
{
    self_t *self = (self_t *) arg;
    if (self->terminated) {
        actor_shell_remove (shell, self->pipe);
        actor_shell_remove (shell, self->router);
        if (!self->in_flight)
            actor_shell_stop (shell);
    }
    return -1;
}

void
transfer_submitter_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-transfer");
    const kvp_config_t *config = (const kvp_config_t *) args;
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->pipe = pipe;
    static const actor_socket_t router = {.type = ZMQ_ROUTER,
                                          .endpoint = "@inproc://%s-tx",
                                          .sndhwm = 0,
                                          .rcvhwm = 0,
                                          .reader = s_router_reader};
    self->router = actor_shell_open (shell, &router, config->instance);
    assert (self->router);
    self->pool = transfer_pool_new ((int) config->workers, 0);
    assert (self->pool);
    self->wake_fd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
    assert (self->wake_fd >= 0);
    actor_shell_add_fd (shell, self->wake_fd, s_wake_reader);
    pthread_mutex_init (&self->lock, NULL);
    if (config->disk_dir) {
        self->disk =
            disk_store_new (config->disk_dir, 64, self->disk_error, sizeof self->disk_error);
        if (self->disk) {
            kvp_info ("kvpoold: disk tier %s (%s), %llu MiB", config->disk_dir,
                      disk_store_describe (self->disk),
                      (unsigned long long) (config->disk_capacity >> 20));
            actor_shell_add_fd (shell, disk_store_fd (self->disk), s_disk_reader);
        }
    }
    if (config->rdma) {
        self->rdma = rdma_serve_new (config->rdma_device, (int) config->cluster_timeout_ms,
                                     self->rdma_error, sizeof self->rdma_error);
        if (!self->rdma)
            kvp_warning ("kvpoold: cannot serve values by RDMA: %s", self->rdma_error);
    }
    //  Interrupted polls are retried: the copies in flight must come back.
    actor_shell_set_nonstop (shell, true);
    actor_shell_on_term (shell, s_term);
    actor_shell_on_tick (shell, s_tick);
    actor_shell_run (shell, self);
    disk_store_destroy (&self->disk);
    transfer_pool_destroy (&self->pool);
    rdma_serve_destroy (&self->rdma);
    close (self->wake_fd);
    pthread_mutex_destroy (&self->lock);
    free (self);
    actor_shell_destroy (&shell); //  (the router)
}

//  ---- self test ---------------------------------------------------------------------

void
transfer_submitter_test (bool verbose)
{
    kvp_config_t config;
    kvp_config_defaults (&config);
    snprintf (config.instance, sizeof config.instance, "txtest");
    config.workers = 2;
    zactor_t *actor = zactor_new (transfer_submitter_actor, &config);
    zsock_t *tx = zsock_new_dealer ("inproc://txtest-tx");
    assert (actor && tx);

    //  Small and large jobs both copy every replica, over the pool.
    size_t sizes[] = {100, 3 << 20};
    for (int s = 0; s < 2; s++) {
        size_t size = sizes[s];
        char *src = (char *) malloc (size);
        for (size_t i = 0; i < size; i++)
            src[i] = (char) (i * 7 + s);
        char *dst[4];
        kvp_job_t *job = kvp_job_new (KVP_TX_WRITE, 2);
        kvp_job_need_replicas (job);
        for (int i = 0; i < 2; i++) {
            job->items[i].src = src;
            job->items[i].size = size;
            job->items[i].replica_count = 2;
            for (int r = 0; r < 2; r++) {
                dst[i * 2 + r] = (char *) zmalloc (size);
                job->items[i].replicas[r].addr = dst[i * 2 + r];
            }
        }
        job->items[1].status = KVPOOL_OBJECT_ALREADY_EXISTS; //  skipped
        assert (kvp_job_send (tx, job) == 0);
        assert (kvp_job_recv (tx) == job);
        assert (memcmp (dst[0], src, size) == 0 && memcmp (dst[1], src, size) == 0);
        assert (dst[2][size - 1] == 0 && dst[3][0] == 0);
        for (int i = 0; i < 4; i++)
            free (dst[i]);
        free (src);
        kvp_job_destroy (&job);
    }
    zsock_destroy (&tx);
    zactor_destroy (&actor);

    //  A PUT by address of this process's own memory, cut into tasks of grouped reads: 70
    //  small values (more than one read takes), values that cross a task's end, one with two
    //  replicas, and one at an address this process does not have, which fails alone.
    transfer_pool_t *pool = transfer_pool_new (1, 0);
    assert (pool);
    for (int pooled = 0; pooled < 2; pooled++) {
        enum { VALUES = 76, BAD = 40 };
        kvp_job_t *job = kvp_job_new (KVP_TX_WRITE, VALUES);
        kvp_job_need_replicas (job);
        job->vm.pid = getpid ();
        job->vm.pidfd = -1;
        char *src[VALUES];
        for (int i = 0; i < VALUES; i++) {
            kvp_item_t *item = &job->items[i];
            item->size = i < 70 ? 1000 + (size_t) i : (size_t) (700 << 10) + (size_t) i;
            item->replica_count = i == 72 ? 2 : 1;
            src[i] = (char *) malloc (item->size);
            for (size_t b = 0; b < item->size; b++)
                src[i][b] = (char) (b * 31 + (size_t) i);
            item->vm_addr = i == BAD ? 16 : (uint64_t) (uintptr_t) src[i];
            for (uint32_t r = 0; r < item->replica_count; r++)
                item->replicas[r].addr = zmalloc (item->size);
        }
        transfer_job_copy (job, pooled ? pool : NULL);
        for (int i = 0; i < VALUES; i++) {
            kvp_item_t *item = &job->items[i];
            if (i == BAD)
                assert (item->status == KVPOOL_TRANSFER_FAIL);
            else {
                assert (item->status == KVPOOL_OK);
                for (uint32_t r = 0; r < item->replica_count; r++)
                    assert (memcmp (item->replicas[r].addr, src[i], item->size) == 0);
            }
            for (uint32_t r = 0; r < item->replica_count; r++)
                free (item->replicas[r].addr);
            free (src[i]);
        }
        kvp_job_destroy (&job);
    }
    //  Reads that end after the client's deadline are not stored.
    char value[5000], place[5000];
    memset (value, 9, sizeof value);
    kvp_job_t *late = kvp_job_new (KVP_TX_WRITE, 2);
    kvp_job_need_replicas (late);
    late->vm.pid = getpid ();
    late->vm.pidfd = -1;
    late->vm.deadline_ns = 1;
    for (int i = 0; i < 2; i++) {
        late->items[i].size = sizeof value / 2;
        late->items[i].replica_count = 1;
        late->items[i].vm_addr = (uint64_t) (uintptr_t) (value + i * sizeof value / 2);
        late->items[i].replicas[0].addr = place + i * sizeof value / 2;
    }
    transfer_job_copy (late, NULL);
    assert (late->items[0].status == KVPOOL_TRANSFER_FAIL);
    assert (late->items[1].status == KVPOOL_TRANSFER_FAIL);
    assert (strstr (late->error, "deadline"));
    kvp_job_destroy (&late);
    transfer_pool_destroy (&pool);
    if (verbose)
        printf ("pooled copies, grouped reads by address ");
}
