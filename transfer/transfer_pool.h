/*  transfer_pool.h - a pool of copy workers with work stealing.

    The pool runs N worker threads, each with its own deque of tasks. A batch of copies is cut
    into tasks (a copy larger than the chunk size becomes several tasks) and spread round-robin
    over the workers' deques. A worker pops from the bottom of its own deque; an idle worker
    steals from the top of another's. A thread waiting on a batch (transfer_batch_wait) runs
    tasks too, so a caller never sits idle while its own copies are queued.

    When the last task of a batch finishes, the batch completes: either its done callback runs
    (on the worker thread that finished it), or a waiter in transfer_batch_wait returns.

    Ordering: tasks of one batch run in any order, concurrently. Copies must not overlap.
    Threads: every function may be called from any thread.
*/
#ifndef TRANSFER_POOL_H_INCLUDED
#define TRANSFER_POOL_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct _transfer_pool_t transfer_pool_t;
typedef struct _transfer_batch_t transfer_batch_t;

typedef void (transfer_done_fn) (transfer_batch_t *batch, void *arg);
//  A task that is not a copy: runs arg's work on a worker (worker is its index, 0 .. workers
//  - 1), or on a thread helping in transfer_batch_wait (worker -1).
typedef void (transfer_call_fn) (void *arg, int worker);

//  Starts a pool of workers threads (>= 1). chunk_size: the largest piece one task copies
//  (0 means 1 MiB). Returns NULL on failure. Caller owns the return value.
transfer_pool_t *transfer_pool_new (int workers, size_t chunk_size);

//  Finishes every task already submitted, stops the workers, frees the pool. Does nothing on
//  NULL; sets *self_p to NULL.
void transfer_pool_destroy (transfer_pool_t **self_p);

int transfer_pool_workers (transfer_pool_t *self);

//  Counters: tasks run, and tasks a worker stole from another's deque.
uint64_t transfer_pool_tasks_run (transfer_pool_t *self);
uint64_t transfer_pool_tasks_stolen (transfer_pool_t *self);

//  Creates an empty batch. done may be NULL (then use transfer_batch_wait). Caller owns the
//  return value until it is submitted; after completion the caller (or the done callback)
//  destroys it.
transfer_batch_t *transfer_batch_new (transfer_done_fn *done, void *arg);

//  Adds a copy of len bytes from src to dst.
void transfer_batch_add_copy (transfer_batch_t *self, void *dst, const void *src, size_t len);

//  Adds a task that runs call (arg, worker): one task, never cut, stolen like any other. The
//  node's data plane (transfer/data_plane.h) sends and receives on workers this way.
void transfer_batch_add_call (transfer_batch_t *self, transfer_call_fn *call, void *arg);

//  Number of copies (and calls) added, and total bytes copied.
size_t transfer_batch_copies (transfer_batch_t *self);
uint64_t transfer_batch_bytes (transfer_batch_t *self);

//  Hands the batch's tasks to the workers. An empty batch completes at once.
void transfer_pool_submit (transfer_pool_t *self, transfer_batch_t *batch);

//  Runs tasks (of any batch) until batch completes. Only for batches without a done callback.
void transfer_batch_wait (transfer_pool_t *self, transfer_batch_t *batch);

void transfer_batch_destroy (transfer_batch_t **self_p);

//  Self test.
void transfer_pool_test (bool verbose);

#endif
