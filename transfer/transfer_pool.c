/*  transfer_pool.c - a pool of copy workers with work stealing.

    DESIGN

    Each of the N worker threads owns a deque of task pointers guarded by its own mutex. A task
    is one memcpy of at most chunk_size bytes; the tasks of a batch live in one array the batch
    owns, built when it is submitted. Submission hands task k to the deque of worker
    (start + k) mod N, where start rotates from batch to batch, and locks each deque once per
    batch, not once per task. A worker pops from the bottom of its own deque (LIFO, the copies
    it was given most recently are the warmest) and, when that is empty, steals from the top of
    the others' (FIFO, the oldest work first). A thread in transfer_batch_wait takes tasks from
    the top of any deque, so a caller helps instead of sitting idle.

    Sleeping: a submission bumps pool->epoch after its pushes. A worker reads the epoch before
    it looks for work; when it finds none it spins briefly, then sleeps on pool->wake unless
    the epoch moved meanwhile. The worker's increment of pool->sleepers and the submitter's
    increment of the epoch are both sequentially consistent and each then reads the other's
    variable, so at least one of them notices the other: either the worker sees the new epoch
    and does not sleep, or the submitter sees a sleeper and signals it under pool->sleep_lock.
    Idle workers therefore never spin for long and no submission is ever missed.

    Completion: a batch counts its unfinished tasks. Each task decrements the count after its
    copy (release); the thread that takes it to zero (acquire) completes the batch, so the
    bytes of every copy are visible to whoever observes the completion. Completion calls the
    done callback on that thread, or sets batch->finished under batch->lock and wakes the
    waiter. The waiter always returns through batch->lock, never through the bare count, so it
    cannot free the batch while the finishing thread still touches it.

    Per-task work on the hot path: one uncontended mutex on the owner's deque, the memcpy, one
    atomic decrement of the batch count and one of a per-worker counter on its own cache line.

    Threads: all functions may be called from any thread. The done callback runs on the worker
    (or helping waiter) that finished the batch's last task; for a batch without tasks (empty,
    or only zero-length copies) it runs on the submitting thread before submit returns.
    Destroy must not race with submit or wait on the same pool; it finishes every task already
    submitted before it joins the workers.
*/
#include "transfer/transfer_pool.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRANSFER_DEFAULT_CHUNK (1u << 20)
#define TRANSFER_DEQUE_INITIAL 64
//  Rounds of looking for work before a worker sleeps: each is a scan of the deque hints and
//  a pause, a few microseconds in all. Enough to catch a batch that follows right behind the
//  last one without a futex wake-up, short enough not to burn a shared core.
#define TRANSFER_SPIN_ROUNDS 64

#if defined(__x86_64__) || defined(__i386__)
#define s_cpu_relax() __builtin_ia32_pause ()
#else
#define s_cpu_relax() atomic_signal_fence (memory_order_seq_cst)
#endif

typedef struct {
    char *dst;
    const char *src;
    size_t len;
    transfer_call_fn *call; //  a call task: call (src, worker) instead of a copy
    transfer_batch_t *batch;
} transfer_task_t;

typedef struct {
    void *dst;
    const void *src;
    size_t len;
    transfer_call_fn *call;
} transfer_copy_t;

//  One worker and its deque. Aligned to a cache line so that workers do not share lines.
typedef struct {
    _Alignas(64) pthread_mutex_t lock;
    transfer_task_t **ring; //  capacity is a power of two
    size_t mask;            //  capacity - 1
    //  top is the next task to steal, bottom the next free slot; both only grow, and are
    //  written under lock. They are atomics so that scans may read them as hints unlocked.
    atomic_size_t top;
    atomic_size_t bottom;
    atomic_uint_fast64_t tasks_run;
    atomic_uint_fast64_t tasks_stolen;
    transfer_pool_t *pool;
    int index;
    pthread_t thread;
} transfer_worker_t;

struct _transfer_pool_t {
    transfer_worker_t *workers;
    int worker_count;
    int started; //  threads created so far
    size_t chunk_size;
    atomic_uint_fast64_t epoch; //  bumped after each submission's pushes
    atomic_int sleepers;        //  workers in, or about to enter, cond wait
    atomic_bool stopping;       //  destroy has begun
    atomic_size_t rotor;        //  where the next batch's round-robin starts
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    //  Tasks run by threads in transfer_batch_wait. Written once per task, so on a line of its
    //  own, away from the fields every worker reads once per task.
    _Alignas(64) atomic_uint_fast64_t helper_run;
};

struct _transfer_batch_t {
    transfer_done_fn *done;
    void *arg;
    transfer_copy_t *copies;
    size_t copy_count;
    size_t copy_alloc;
    uint64_t bytes;
    transfer_task_t *tasks;
    atomic_size_t remaining; //  tasks not yet finished
    bool submitted;
    //  For transfer_batch_wait only.
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool finished;
};

//  Out of memory while cutting or queueing copies: the caller has no way to get half a batch
//  back, so, as CZMQ does, treat it as fatal.
static void *
s_alloc (size_t size)
{
    void *p = malloc (size);
    if (!p) {
        fprintf (stderr, "transfer_pool: out of memory (%zu bytes)\n", size);
        abort ();
    }
    return p;
}

//  --------------------------------------------------------------------------
//  Deques

static void
s_deque_grow (transfer_worker_t *w, size_t need)
{
    size_t top = atomic_load_explicit (&w->top, memory_order_relaxed);
    size_t bottom = atomic_load_explicit (&w->bottom, memory_order_relaxed);
    size_t capacity = w->mask + 1;
    while (capacity < need)
        capacity *= 2;
    if (capacity == w->mask + 1)
        return;
    transfer_task_t **ring = s_alloc (capacity * sizeof (*ring));
    //  Indices are absolute, so each task keeps its index modulo the new capacity.
    for (size_t i = top; i != bottom; i++)
        ring[i & (capacity - 1)] = w->ring[i & w->mask];
    free (w->ring);
    w->ring = ring;
    w->mask = capacity - 1;
}

static inline bool
s_deque_looks_empty (transfer_worker_t *w)
{
    return atomic_load_explicit (&w->top, memory_order_relaxed)
           == atomic_load_explicit (&w->bottom, memory_order_relaxed);
}

//  The owner's end: the most recently pushed task.
static transfer_task_t *
s_deque_pop_bottom (transfer_worker_t *w)
{
    if (s_deque_looks_empty (w))
        return NULL;
    transfer_task_t *task = NULL;
    pthread_mutex_lock (&w->lock);
    size_t top = atomic_load_explicit (&w->top, memory_order_relaxed);
    size_t bottom = atomic_load_explicit (&w->bottom, memory_order_relaxed);
    if (bottom != top) {
        bottom--;
        task = w->ring[bottom & w->mask];
        atomic_store_explicit (&w->bottom, bottom, memory_order_relaxed);
    }
    pthread_mutex_unlock (&w->lock);
    return task;
}

//  The thieves' end: the oldest task.
static transfer_task_t *
s_deque_steal_top (transfer_worker_t *w)
{
    if (s_deque_looks_empty (w))
        return NULL;
    transfer_task_t *task = NULL;
    pthread_mutex_lock (&w->lock);
    size_t top = atomic_load_explicit (&w->top, memory_order_relaxed);
    size_t bottom = atomic_load_explicit (&w->bottom, memory_order_relaxed);
    if (bottom != top) {
        task = w->ring[top & w->mask];
        atomic_store_explicit (&w->top, top + 1, memory_order_relaxed);
    }
    pthread_mutex_unlock (&w->lock);
    return task;
}

//  Takes a task from the top of any deque, trying them in order from first. NULL if all are
//  empty.
static transfer_task_t *
s_steal_any (transfer_pool_t *self, int first, int skip)
{
    for (int i = 0; i < self->worker_count; i++) {
        int victim = (first + i) % self->worker_count;
        if (victim == skip)
            continue;
        transfer_task_t *task = s_deque_steal_top (&self->workers[victim]);
        if (task)
            return task;
    }
    return NULL;
}

static bool
s_any_work (transfer_pool_t *self)
{
    for (int i = 0; i < self->worker_count; i++)
        if (!s_deque_looks_empty (&self->workers[i]))
            return true;
    return false;
}

//  --------------------------------------------------------------------------
//  Running tasks and completing batches

static void
s_batch_complete (transfer_batch_t *batch)
{
    if (batch->done)
        //  The callback may destroy the batch; nothing touches it afterwards.
        batch->done (batch, batch->arg);
    else {
        pthread_mutex_lock (&batch->lock);
        batch->finished = true;
        pthread_cond_broadcast (&batch->cond);
        pthread_mutex_unlock (&batch->lock);
    }
}

static void
s_task_run (transfer_task_t *task, int worker)
{
    //  Read everything first: once the count drops, the batch (and this task, which lives in
    //  the batch) may be freed by another thread.
    transfer_batch_t *batch = task->batch;
    if (task->call)
        task->call ((void *) task->src, worker);
    else
        memcpy (task->dst, task->src, task->len);
    //  Release publishes this copy; acquire on the last decrement gathers every other one.
    if (atomic_fetch_sub_explicit (&batch->remaining, 1, memory_order_acq_rel) == 1)
        s_batch_complete (batch);
}

//  --------------------------------------------------------------------------
//  Workers

static void *
s_worker_main (void *args)
{
    transfer_worker_t *me = (transfer_worker_t *) args;
    transfer_pool_t *self = me->pool;
    int spins = 0;
    while (true) {
        //  Stopping first, then the epoch, then the scan: if stopping is seen, every task
        //  submitted before destroy is visible to the scan that follows.
        bool stopping = atomic_load_explicit (&self->stopping, memory_order_acquire);
        uint_fast64_t epoch = atomic_load_explicit (&self->epoch, memory_order_acquire);
        bool stolen = false;
        transfer_task_t *task = s_deque_pop_bottom (me);
        if (!task) {
            task = s_steal_any (self, me->index + 1, me->index);
            stolen = task != NULL;
        }
        if (task) {
            //  Count before running: once the batch completes, its tasks are all counted.
            atomic_fetch_add_explicit (&me->tasks_run, 1, memory_order_relaxed);
            if (stolen)
                atomic_fetch_add_explicit (&me->tasks_stolen, 1, memory_order_relaxed);
            s_task_run (task, me->index);
            spins = 0;
            continue;
        }
        if (stopping)
            break;
        if (spins < TRANSFER_SPIN_ROUNDS) {
            spins++;
            s_cpu_relax ();
            continue;
        }
        spins = 0;
        pthread_mutex_lock (&self->sleep_lock);
        atomic_fetch_add (&self->sleepers, 1);
        //  A submission that bumped the epoch after we read it may have seen no sleeper, so
        //  look again before waiting; one that comes later will see us and signal.
        if (atomic_load (&self->epoch) == epoch && !atomic_load (&self->stopping))
            pthread_cond_wait (&self->wake, &self->sleep_lock);
        atomic_fetch_sub (&self->sleepers, 1);
        pthread_mutex_unlock (&self->sleep_lock);
    }
    return NULL;
}

static void
s_pool_stop (transfer_pool_t *self)
{
    atomic_store (&self->stopping, true);
    pthread_mutex_lock (&self->sleep_lock);
    pthread_cond_broadcast (&self->wake);
    pthread_mutex_unlock (&self->sleep_lock);
    for (int i = 0; i < self->started; i++)
        pthread_join (self->workers[i].thread, NULL);
}

static void
s_pool_free (transfer_pool_t *self)
{
    for (int i = 0; i < self->worker_count; i++) {
        transfer_worker_t *w = &self->workers[i];
        assert (s_deque_looks_empty (w));
        pthread_mutex_destroy (&w->lock);
        free (w->ring);
    }
    free (self->workers);
    pthread_mutex_destroy (&self->sleep_lock);
    pthread_cond_destroy (&self->wake);
    free (self);
}

//  --------------------------------------------------------------------------
//  Pool

transfer_pool_t *
transfer_pool_new (int workers, size_t chunk_size)
{
    if (workers < 1)
        return NULL;
    //  Over-aligned type: calloc would not honour its alignment.
    transfer_pool_t *self = aligned_alloc (_Alignof(transfer_pool_t), sizeof (*self));
    if (!self)
        return NULL;
    memset (self, 0, sizeof (*self));
    self->worker_count = workers;
    self->chunk_size = chunk_size ? chunk_size : TRANSFER_DEFAULT_CHUNK;
    pthread_mutex_init (&self->sleep_lock, NULL);
    pthread_cond_init (&self->wake, NULL);
    size_t bytes = (size_t) workers * sizeof (transfer_worker_t);
    self->workers = aligned_alloc (_Alignof(transfer_worker_t), bytes);
    if (!self->workers) {
        self->worker_count = 0;
        s_pool_free (self);
        return NULL;
    }
    memset (self->workers, 0, bytes);
    for (int i = 0; i < workers; i++) {
        transfer_worker_t *w = &self->workers[i];
        pthread_mutex_init (&w->lock, NULL);
        w->ring = malloc (TRANSFER_DEQUE_INITIAL * sizeof (*w->ring));
        w->mask = TRANSFER_DEQUE_INITIAL - 1;
        w->pool = self;
        w->index = i;
        if (!w->ring) {
            self->worker_count = i + 1;
            s_pool_free (self);
            return NULL;
        }
    }
    for (int i = 0; i < workers; i++) {
        if (pthread_create (&self->workers[i].thread, NULL, s_worker_main, &self->workers[i])) {
            s_pool_stop (self);
            s_pool_free (self);
            return NULL;
        }
        self->started++;
    }
    return self;
}

void
transfer_pool_destroy (transfer_pool_t **self_p)
{
    assert (self_p);
    transfer_pool_t *self = *self_p;
    if (!self)
        return;
    //  Workers leave only when stopping is set and they find every deque empty, so all
    //  submitted tasks have run (or are running on a worker that finishes them) by the joins.
    s_pool_stop (self);
    s_pool_free (self);
    *self_p = NULL;
}

int
transfer_pool_workers (transfer_pool_t *self)
{
    assert (self);
    return self->worker_count;
}

uint64_t
transfer_pool_tasks_run (transfer_pool_t *self)
{
    assert (self);
    uint64_t sum = atomic_load_explicit (&self->helper_run, memory_order_relaxed);
    for (int i = 0; i < self->worker_count; i++)
        sum += atomic_load_explicit (&self->workers[i].tasks_run, memory_order_relaxed);
    return sum;
}

uint64_t
transfer_pool_tasks_stolen (transfer_pool_t *self)
{
    assert (self);
    uint64_t sum = 0;
    for (int i = 0; i < self->worker_count; i++)
        sum += atomic_load_explicit (&self->workers[i].tasks_stolen, memory_order_relaxed);
    return sum;
}

static void
s_wake_workers (transfer_pool_t *self, size_t tasks)
{
    //  Pairs with the worker's increment of sleepers and reread of the epoch (see DESIGN).
    atomic_fetch_add (&self->epoch, 1);
    int sleepers = atomic_load (&self->sleepers);
    if (sleepers == 0)
        return;
    pthread_mutex_lock (&self->sleep_lock);
    //  Wake no more workers than there are tasks: a one-task batch need not stir a big pool.
    if (tasks >= (size_t) sleepers)
        pthread_cond_broadcast (&self->wake);
    else
        for (size_t i = 0; i < tasks; i++)
            pthread_cond_signal (&self->wake);
    pthread_mutex_unlock (&self->sleep_lock);
}

void
transfer_pool_submit (transfer_pool_t *self, transfer_batch_t *batch)
{
    assert (self);
    assert (batch);
    assert (!batch->submitted);
    batch->submitted = true;

    size_t chunk = self->chunk_size;
    size_t task_count = 0;
    for (size_t i = 0; i < batch->copy_count; i++)
        task_count += batch->copies[i].call
                          ? 1
                          : batch->copies[i].len / chunk + (batch->copies[i].len % chunk != 0);
    if (task_count == 0) {
        s_batch_complete (batch);
        return;
    }
    transfer_task_t *tasks = s_alloc (task_count * sizeof (*tasks));
    size_t k = 0;
    for (size_t i = 0; i < batch->copy_count; i++) {
        transfer_copy_t *copy = &batch->copies[i];
        if (copy->call) {
            tasks[k] = (transfer_task_t){NULL, (const char *) copy->src, 0, copy->call, batch};
            k++;
            continue;
        }
        for (size_t offset = 0; offset < copy->len; offset += chunk) {
            tasks[k].dst = (char *) copy->dst + offset;
            tasks[k].src = (const char *) copy->src + offset;
            tasks[k].len = copy->len - offset < chunk ? copy->len - offset : chunk;
            tasks[k].call = NULL;
            tasks[k].batch = batch;
            k++;
        }
    }
    assert (k == task_count);
    batch->tasks = tasks;
    atomic_store_explicit (&batch->remaining, task_count, memory_order_relaxed);

    //  Task k goes to worker (start + k) mod N. Continuing the rotor from where the last batch
    //  ended spreads a stream of small batches over all workers.
    size_t n = (size_t) self->worker_count;
    size_t start = atomic_fetch_add_explicit (&self->rotor, task_count, memory_order_relaxed) % n;
    size_t lanes = task_count < n ? task_count : n;
    for (size_t lane = 0; lane < lanes; lane++) {
        transfer_worker_t *w = &self->workers[(start + lane) % n];
        size_t share = (task_count - lane + n - 1) / n;
        pthread_mutex_lock (&w->lock);
        size_t top = atomic_load_explicit (&w->top, memory_order_relaxed);
        size_t bottom = atomic_load_explicit (&w->bottom, memory_order_relaxed);
        if (bottom - top + share > w->mask + 1)
            s_deque_grow (w, bottom - top + share);
        for (size_t t = lane; t < task_count; t += n)
            w->ring[bottom++ & w->mask] = &tasks[t];
        atomic_store_explicit (&w->bottom, bottom, memory_order_relaxed);
        pthread_mutex_unlock (&w->lock);
        //  From here on the batch may already be complete and freed: touch only the pool.
    }
    s_wake_workers (self, task_count);
}

//  --------------------------------------------------------------------------
//  Batches

transfer_batch_t *
transfer_batch_new (transfer_done_fn *done, void *arg)
{
    transfer_batch_t *self = calloc (1, sizeof (*self));
    if (!self)
        return NULL;
    self->done = done;
    self->arg = arg;
    pthread_mutex_init (&self->lock, NULL);
    pthread_cond_init (&self->cond, NULL);
    return self;
}

static void
s_batch_add (transfer_batch_t *self, transfer_copy_t copy)
{
    if (self->copy_count == self->copy_alloc) {
        size_t alloc = self->copy_alloc ? self->copy_alloc * 2 : 8;
        transfer_copy_t *copies = realloc (self->copies, alloc * sizeof (*copies));
        if (!copies) {
            fprintf (stderr, "transfer_pool: out of memory (%zu copies)\n", alloc);
            abort ();
        }
        self->copies = copies;
        self->copy_alloc = alloc;
    }
    self->copies[self->copy_count++] = copy;
}

void
transfer_batch_add_copy (transfer_batch_t *self, void *dst, const void *src, size_t len)
{
    assert (self);
    assert (!self->submitted);
    assert (len == 0 || (dst && src));
    s_batch_add (self, (transfer_copy_t){dst, src, len, NULL});
    self->bytes += len;
}

void
transfer_batch_add_call (transfer_batch_t *self, transfer_call_fn *call, void *arg)
{
    assert (self);
    assert (!self->submitted);
    assert (call);
    s_batch_add (self, (transfer_copy_t){NULL, arg, 0, call});
}

size_t
transfer_batch_copies (transfer_batch_t *self)
{
    assert (self);
    return self->copy_count;
}

uint64_t
transfer_batch_bytes (transfer_batch_t *self)
{
    assert (self);
    return self->bytes;
}

void
transfer_batch_wait (transfer_pool_t *self, transfer_batch_t *batch)
{
    assert (self);
    assert (batch);
    assert (batch->submitted);
    assert (!batch->done);
    //  Help while the batch is unfinished and there is anything queued. Each helper starts its
    //  scan at a different deque so that several helpers do not all queue on worker 0's lock.
    int first = (int) (atomic_load_explicit (&self->rotor, memory_order_relaxed)
                       % (size_t) self->worker_count);
    while (atomic_load_explicit (&batch->remaining, memory_order_acquire) > 0) {
        transfer_task_t *task = s_steal_any (self, first, -1);
        if (!task) {
            //  Our last tasks are running on workers; give them a moment before sleeping.
            for (int spin = 0; spin < TRANSFER_SPIN_ROUNDS; spin++) {
                if (atomic_load_explicit (&batch->remaining, memory_order_acquire) == 0
                    || s_any_work (self))
                    break;
                s_cpu_relax ();
            }
            if (s_any_work (self))
                continue;
            break;
        }
        atomic_fetch_add_explicit (&self->helper_run, 1, memory_order_relaxed);
        s_task_run (task, -1);
    }
    //  Return only through the lock: the finishing thread holds it until it is done with the
    //  batch, so the caller may destroy the batch as soon as we return.
    pthread_mutex_lock (&batch->lock);
    while (!batch->finished)
        pthread_cond_wait (&batch->cond, &batch->lock);
    pthread_mutex_unlock (&batch->lock);
}

void
transfer_batch_destroy (transfer_batch_t **self_p)
{
    assert (self_p);
    transfer_batch_t *self = *self_p;
    if (!self)
        return;
    //  A submitted batch may be destroyed only once complete.
    assert (!self->submitted || atomic_load (&self->remaining) == 0);
    pthread_mutex_destroy (&self->lock);
    pthread_cond_destroy (&self->cond);
    free (self->copies);
    free (self->tasks);
    free (self);
    *self_p = NULL;
}

//  --------------------------------------------------------------------------
//  Self test

//  A call task: records which worker ran it.
typedef struct {
    atomic_int ran;
    int worker;
} test_call_t;

static void
s_test_call (void *arg, int worker)
{
    test_call_t *call = (test_call_t *) arg;
    call->worker = worker;
    atomic_fetch_add (&call->ran, 1);
}

#define TEST_GUARD 64
#define TEST_GUARD_BYTE 0xA5
#define TEST_THREADS 4
#define TEST_ROUNDS 25
#define TEST_REGION (128 * 1024)
#define TEST_PENDING 24

//  Counts done callbacks; tests wait on it with a deadline so a lost completion fails the
//  test instead of hanging it.
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int completed;
    bool block; //  s_test_blocking_done: hold the worker until released
    bool entered;
} test_done_t;

static void
s_test_done_init (test_done_t *d)
{
    memset (d, 0, sizeof (*d));
    pthread_mutex_init (&d->lock, NULL);
    pthread_cond_init (&d->cond, NULL);
}

static void
s_test_done_fini (test_done_t *d)
{
    pthread_mutex_destroy (&d->lock);
    pthread_cond_destroy (&d->cond);
}

static void
s_test_done (transfer_batch_t *batch, void *arg)
{
    (void) batch;
    test_done_t *d = (test_done_t *) arg;
    pthread_mutex_lock (&d->lock);
    d->completed++;
    pthread_cond_broadcast (&d->cond);
    pthread_mutex_unlock (&d->lock);
}

//  Keeps the worker that finished the batch busy until the test clears d->block.
static void
s_test_blocking_done (transfer_batch_t *batch, void *arg)
{
    (void) batch;
    test_done_t *d = (test_done_t *) arg;
    pthread_mutex_lock (&d->lock);
    d->entered = true;
    pthread_cond_broadcast (&d->cond);
    while (d->block)
        pthread_cond_wait (&d->cond, &d->lock);
    d->completed++;
    pthread_cond_broadcast (&d->cond);
    pthread_mutex_unlock (&d->lock);
}

//  Waits until d->completed reaches count (or, with count < 0, until d->entered); aborts
//  after 5 seconds.
static void
s_test_done_await (test_done_t *d, int count)
{
    struct timespec deadline;
    clock_gettime (CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 5;
    pthread_mutex_lock (&d->lock);
    while (count < 0 ? !d->entered : d->completed < count) {
        int rc = pthread_cond_timedwait (&d->cond, &d->lock, &deadline);
        assert (rc == 0 || rc == ETIMEDOUT);
        if (rc == ETIMEDOUT) {
            fprintf (stderr, "transfer_pool_test: batch did not complete in time\n");
            abort ();
        }
    }
    pthread_mutex_unlock (&d->lock);
}

static void
s_test_fill (uint8_t *buf, size_t len, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        buf[i] = (uint8_t) x;
    }
}

//  A destination with guard bytes on both sides, to catch a copy that runs over.
static uint8_t *
s_test_dst_new (size_t len)
{
    uint8_t *raw = s_alloc (len + 2 * TEST_GUARD);
    memset (raw, TEST_GUARD_BYTE, len + 2 * TEST_GUARD);
    return raw + TEST_GUARD;
}

static void
s_test_dst_check (uint8_t *dst, const uint8_t *src, size_t len)
{
    assert (len == 0 || memcmp (dst, src, len) == 0);
    for (size_t i = 0; i < TEST_GUARD; i++) {
        assert (dst[-1 - (ptrdiff_t) i] == TEST_GUARD_BYTE);
        assert (dst[len + i] == TEST_GUARD_BYTE);
    }
}

static void
s_test_dst_destroy (uint8_t *dst)
{
    free (dst - TEST_GUARD);
}

//  Copies of awkward sizes in one batch, verified byte for byte. Returns the task count.
static uint64_t
s_test_sizes (transfer_pool_t *pool, size_t chunk, bool use_wait)
{
    //  Empty, tiny, odd, either side of the chunk size, several chunks, and 10 MiB.
    size_t sizes[] = {0, 1, 3, 7, 0, 0, 0, 0, 65536 + 7, 10u << 20, 0, 1};
    sizes[4] = chunk - 1;
    sizes[5] = chunk;
    sizes[6] = chunk + 1;
    sizes[7] = 2 * chunk + 13;
    const size_t count = sizeof (sizes) / sizeof (sizes[0]);
    uint8_t *src[sizeof (sizes) / sizeof (sizes[0])];
    uint8_t *dst[sizeof (sizes) / sizeof (sizes[0])];
    test_done_t done;
    s_test_done_init (&done);
    transfer_batch_t *batch =
        transfer_batch_new (use_wait ? NULL : s_test_done, use_wait ? NULL : &done);
    assert (batch);
    uint64_t bytes = 0, tasks = 0;
    for (size_t i = 0; i < count; i++) {
        src[i] = s_alloc (sizes[i] + 1);
        s_test_fill (src[i], sizes[i], (uint32_t) i + 1);
        dst[i] = s_test_dst_new (sizes[i]);
        transfer_batch_add_copy (batch, dst[i], src[i], sizes[i]);
        bytes += sizes[i];
        tasks += (sizes[i] + chunk - 1) / chunk;
    }
    assert (transfer_batch_copies (batch) == count);
    assert (transfer_batch_bytes (batch) == bytes);
    transfer_pool_submit (pool, batch);
    if (use_wait)
        transfer_batch_wait (pool, batch);
    else
        s_test_done_await (&done, 1);
    for (size_t i = 0; i < count; i++) {
        s_test_dst_check (dst[i], src[i], sizes[i]);
        s_test_dst_destroy (dst[i]);
        free (src[i]);
    }
    transfer_batch_destroy (&batch);
    assert (batch == NULL);
    s_test_done_fini (&done);
    return tasks;
}

//  Several threads each keep a callback batch and a waited batch in flight at once.
typedef struct {
    transfer_pool_t *pool;
    const uint8_t *src; //  shared, read only
    uint32_t seed;
} test_thread_t;

static void
s_test_random_batch (transfer_batch_t *batch, const uint8_t *src, uint8_t *dst, uint32_t *seed,
                     size_t *offsets, size_t *lens, size_t *count)
{
    //  Copies go to disjoint, increasing ranges of dst; sources may repeat.
    size_t at = 0;
    *count = 1 + rand_r (seed) % 8;
    for (size_t i = 0; i < *count; i++) {
        size_t len = (size_t) rand_r (seed) % (TEST_REGION / 8 - 64);
        if (rand_r (seed) % 5 == 0)
            len = 0;
        offsets[i] = (size_t) rand_r (seed) % (TEST_REGION - len);
        lens[i] = len;
        transfer_batch_add_copy (batch, dst + at, src + offsets[i], len);
        at += len;
    }
}

static void
s_test_random_check (const uint8_t *src, const uint8_t *dst, const size_t *offsets,
                     const size_t *lens, size_t count)
{
    size_t at = 0;
    for (size_t i = 0; i < count; i++) {
        assert (memcmp (dst + at, src + offsets[i], lens[i]) == 0);
        at += lens[i];
    }
}

static void *
s_test_submitter (void *args)
{
    test_thread_t *t = (test_thread_t *) args;
    uint8_t *dst_cb = s_alloc (TEST_REGION);
    uint8_t *dst_wait = s_alloc (TEST_REGION);
    test_done_t done;
    s_test_done_init (&done);
    for (int round = 0; round < TEST_ROUNDS; round++) {
        size_t off_cb[8], len_cb[8], n_cb, off_wait[8], len_wait[8], n_wait;
        transfer_batch_t *cb = transfer_batch_new (s_test_done, &done);
        transfer_batch_t *waited = transfer_batch_new (NULL, NULL);
        assert (cb && waited);
        s_test_random_batch (cb, t->src, dst_cb, &t->seed, off_cb, len_cb, &n_cb);
        s_test_random_batch (waited, t->src, dst_wait, &t->seed, off_wait, len_wait, &n_wait);
        transfer_pool_submit (t->pool, cb);
        transfer_pool_submit (t->pool, waited);
        transfer_batch_wait (t->pool, waited);
        s_test_random_check (t->src, dst_wait, off_wait, len_wait, n_wait);
        s_test_done_await (&done, round + 1);
        s_test_random_check (t->src, dst_cb, off_cb, len_cb, n_cb);
        transfer_batch_destroy (&cb);
        transfer_batch_destroy (&waited);
    }
    s_test_done_fini (&done);
    free (dst_cb);
    free (dst_wait);
    return NULL;
}

//  A done callback that destroys its own batch, as the transfer submitter's may.
static void
s_test_done_destroys (transfer_batch_t *batch, void *arg)
{
    transfer_batch_destroy (&batch);
    s_test_done (NULL, arg);
}

void
transfer_pool_test (bool verbose)
{
    if (verbose)
        printf ("\n");
    struct timespec t0;
    clock_gettime (CLOCK_MONOTONIC, &t0);

    //  Bad arguments.
    assert (transfer_pool_new (0, 0) == NULL);
    assert (transfer_pool_new (-1, 4096) == NULL);
    transfer_pool_t *none = NULL;
    transfer_pool_destroy (&none);

    //  Awkward sizes, small chunks, with a waiter and with a callback.
    const size_t chunk = 4096;
    transfer_pool_t *pool = transfer_pool_new (3, chunk);
    assert (pool);
    assert (transfer_pool_workers (pool) == 3);
    assert (transfer_pool_tasks_run (pool) == 0);
    uint64_t tasks = s_test_sizes (pool, chunk, true);
    assert (transfer_pool_tasks_run (pool) == tasks);
    tasks += s_test_sizes (pool, chunk, false);
    assert (transfer_pool_tasks_run (pool) == tasks);
    if (verbose)
        printf (" sizes: %llu tasks, %llu stolen\n", (unsigned long long) tasks,
                (unsigned long long) transfer_pool_tasks_stolen (pool));

    //  Empty batches complete at once: the callback runs before submit returns.
    test_done_t done;
    s_test_done_init (&done);
    transfer_batch_t *batch = transfer_batch_new (s_test_done, &done);
    transfer_pool_submit (pool, batch);
    assert (done.completed == 1);
    transfer_batch_destroy (&batch);
    batch = transfer_batch_new (NULL, NULL);
    transfer_pool_submit (pool, batch);
    transfer_batch_wait (pool, batch);
    transfer_batch_destroy (&batch);

    //  Call tasks run once each, on a worker (0 .. 2) or the waiting thread (-1), mixed with
    //  copies in one batch.
    test_call_t calls[40];
    memset (calls, 0, sizeof calls);
    char call_src[10000], call_dst[10000];
    memset (call_src, 7, sizeof call_src);
    batch = transfer_batch_new (NULL, NULL);
    for (int i = 0; i < 40; i++)
        transfer_batch_add_call (batch, s_test_call, &calls[i]);
    transfer_batch_add_copy (batch, call_dst, call_src, sizeof call_src);
    assert (transfer_batch_copies (batch) == 41);
    assert (transfer_batch_bytes (batch) == sizeof call_src);
    uint64_t before = transfer_pool_tasks_run (pool);
    transfer_pool_submit (pool, batch);
    transfer_batch_wait (pool, batch);
    for (int i = 0; i < 40; i++)
        assert (atomic_load (&calls[i].ran) == 1 && calls[i].worker >= -1 && calls[i].worker < 3);
    assert (memcmp (call_dst, call_src, sizeof call_src) == 0);
    tasks += 40 + (sizeof call_src + chunk - 1) / chunk;
    assert (transfer_pool_tasks_run (pool) == tasks);
    assert (before + 40 + (sizeof call_src + chunk - 1) / chunk == tasks);
    transfer_batch_destroy (&batch);
    uint8_t byte = 0;
    batch = transfer_batch_new (NULL, NULL);
    transfer_batch_add_copy (batch, &byte, &byte, 0);
    assert (transfer_batch_copies (batch) == 1 && transfer_batch_bytes (batch) == 0);
    transfer_pool_submit (pool, batch);
    transfer_batch_wait (pool, batch);
    transfer_batch_destroy (&batch);
    assert (transfer_pool_tasks_run (pool) == tasks);

    //  A callback may destroy its batch.
    uint8_t small_src[100], small_dst[100] = {0};
    s_test_fill (small_src, sizeof (small_src), 99);
    batch = transfer_batch_new (s_test_done_destroys, &done);
    transfer_batch_add_copy (batch, small_dst, small_src, sizeof (small_dst));
    transfer_pool_submit (pool, batch);
    s_test_done_await (&done, 2);
    assert (memcmp (small_dst, small_src, sizeof (small_dst)) == 0);
    s_test_done_fini (&done);

    //  Many batches from several threads at once.
    uint8_t *shared_src = s_alloc (TEST_REGION);
    s_test_fill (shared_src, TEST_REGION, 7);
    pthread_t threads[TEST_THREADS];
    test_thread_t args[TEST_THREADS];
    for (int i = 0; i < TEST_THREADS; i++) {
        args[i] = (test_thread_t){pool, shared_src, (uint32_t) i * 7919 + 1};
        int rc = pthread_create (&threads[i], NULL, s_test_submitter, &args[i]);
        assert (rc == 0);
    }
    for (int i = 0; i < TEST_THREADS; i++)
        pthread_join (threads[i], NULL);
    if (verbose)
        printf (" concurrent: %llu tasks run, %llu stolen\n",
                (unsigned long long) transfer_pool_tasks_run (pool),
                (unsigned long long) transfer_pool_tasks_stolen (pool));
    transfer_pool_destroy (&pool);
    assert (pool == NULL);
    transfer_pool_destroy (&pool);

    //  Stealing, deterministically: with two workers, hold one inside a done callback, then
    //  submit a batch whose tasks are spread over both deques. It can only complete if the
    //  free worker steals every task queued to the held one.
    pool = transfer_pool_new (2, chunk);
    assert (pool);
    test_done_t held;
    s_test_done_init (&held);
    held.block = true;
    batch = transfer_batch_new (s_test_blocking_done, &held);
    transfer_batch_add_copy (batch, small_dst, small_src, 1);
    transfer_pool_submit (pool, batch);
    s_test_done_await (&held, -1);
    uint64_t stolen_before = transfer_pool_tasks_stolen (pool);
    s_test_done_init (&done);
    const size_t steal_len = 64 * chunk;
    uint8_t *steal_src = s_alloc (steal_len);
    uint8_t *steal_dst = s_test_dst_new (steal_len);
    s_test_fill (steal_src, steal_len, 3);
    transfer_batch_t *spread = transfer_batch_new (s_test_done, &done);
    transfer_batch_add_copy (spread, steal_dst, steal_src, steal_len);
    transfer_pool_submit (pool, spread);
    s_test_done_await (&done, 1);
    s_test_dst_check (steal_dst, steal_src, steal_len);
    uint64_t stolen = transfer_pool_tasks_stolen (pool) - stolen_before;
    if (verbose)
        printf (" stealing: %llu of 64 tasks stolen from the held worker\n",
                (unsigned long long) stolen);
    //  Round-robin gave the held worker exactly half, and only the free worker could run them.
    assert (stolen == 32);
    pthread_mutex_lock (&held.lock);
    held.block = false;
    pthread_cond_broadcast (&held.cond);
    pthread_mutex_unlock (&held.lock);
    s_test_done_await (&held, 1);
    transfer_batch_destroy (&batch);
    transfer_batch_destroy (&spread);
    s_test_done_fini (&held);
    s_test_done_fini (&done);

    //  Destroy with work pending finishes it: queue many batches, destroy at once.
    s_test_done_init (&done);
    transfer_batch_t *pending[TEST_PENDING];
    uint8_t *pending_dst = s_alloc (TEST_PENDING * steal_len);
    memset (pending_dst, 0, TEST_PENDING * steal_len);
    for (int i = 0; i < TEST_PENDING; i++) {
        pending[i] = transfer_batch_new (s_test_done, &done);
        transfer_batch_add_copy (pending[i], pending_dst + i * steal_len, steal_src, steal_len);
        transfer_pool_submit (pool, pending[i]);
    }
    transfer_pool_destroy (&pool);
    assert (done.completed == TEST_PENDING);
    for (int i = 0; i < TEST_PENDING; i++) {
        assert (memcmp (pending_dst + i * steal_len, steal_src, steal_len) == 0);
        transfer_batch_destroy (&pending[i]);
    }
    s_test_done_fini (&done);
    free (pending_dst);

    //  One worker, the default chunk (1 MiB), and a waiter that helps.
    pool = transfer_pool_new (1, 0);
    assert (pool);
    uint8_t *big_dst = s_test_dst_new (steal_len);
    batch = transfer_batch_new (NULL, NULL);
    for (size_t off = 0; off < steal_len; off += 1000)
        transfer_batch_add_copy (batch, big_dst + off, steal_src + off,
                                 steal_len - off < 1000 ? steal_len - off : 1000);
    transfer_batch_add_copy (batch, NULL, NULL, 0);
    transfer_pool_submit (pool, batch);
    transfer_batch_wait (pool, batch);
    s_test_dst_check (big_dst, steal_src, steal_len);
    assert (transfer_pool_tasks_run (pool) == (steal_len + 999) / 1000);
    transfer_batch_destroy (&batch);
    s_test_dst_destroy (big_dst);
    big_dst = s_test_dst_new ((10u << 20) + 1);
    uint8_t *big_src = s_alloc ((10u << 20) + 1);
    s_test_fill (big_src, (10u << 20) + 1, 5);
    batch = transfer_batch_new (NULL, NULL);
    transfer_batch_add_copy (batch, big_dst, big_src, (10u << 20) + 1);
    transfer_pool_submit (pool, batch);
    transfer_batch_wait (pool, batch);
    s_test_dst_check (big_dst, big_src, (10u << 20) + 1);
    assert (transfer_pool_tasks_run (pool) == (steal_len + 999) / 1000 + 11);
    transfer_batch_destroy (&batch);
    transfer_pool_destroy (&pool);
    s_test_dst_destroy (big_dst);
    free (big_src);

    s_test_dst_destroy (steal_dst);
    free (steal_src);
    free (shared_src);

    struct timespec t1;
    clock_gettime (CLOCK_MONOTONIC, &t1);
    if (verbose)
        printf (" transfer_pool_test: %.3f s\n",
                (double) (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
}
