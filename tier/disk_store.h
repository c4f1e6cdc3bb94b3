/*  disk_store.h - the disk tier's on-disk store: one file per copy of an object.

    A directory holds copies of objects (key and value), each in its own file, written and
    read asynchronously through io_uring (O_DIRECT where the filesystem allows it). A copy is
    named by an id the store assigns; the caller keeps the index (key -> id, size) and passes
    key and size back on every read, which the store checks against the file.

    DIR/LOCK                  flock(LOCK_EX) while a store has the directory open
    DIR/<id % 256>/<id>.kv    a complete copy (ids in hex: "0a/000000000000010a.kv")
    DIR/<id % 256>/<id>.tmp   a copy being written; renamed to .kv once the write completed

    Usage: new, scan (finds the copies already there; ids continue above them), then writes,
    reads and drops; poll disk_store_fd and call disk_store_reap when it is readable: the done
    callbacks run there, on the caller's thread.

    Threads: not thread-safe; one thread uses a store. Only new, scan, drop, drain and destroy
    wait for the disk (open, rename, unlink and the start-up scan are synchronous); reads and
    writes never block the caller, unless io_uring is unavailable (disk_store_describe says).
*/
#ifndef DISK_STORE_H_INCLUDED
#define DISK_STORE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  Longest key, and largest value, a copy may hold.
#define DISK_STORE_KEY_MAX (64 * 1024)
#define DISK_STORE_VALUE_MAX (1ULL << 40)

typedef struct _disk_store_t disk_store_t;

//  One copy on disk. id is never 0; footprint is the bytes it takes on disk (header block
//  and value padded to 4096).
typedef struct {
    uint64_t id;
    uint64_t size;
    uint64_t footprint;
} disk_copy_t;

//  A value read from disk: an aligned block that owns the bytes.
typedef struct _disk_buffer_t disk_buffer_t;
const void *disk_buffer_data (disk_buffer_t *self);
uint64_t disk_buffer_size (disk_buffer_t *self);
//  Frees the buffer. Does nothing on NULL; sets *self_p to NULL.
void disk_buffer_destroy (disk_buffer_t **self_p);
//  Frees the buffer hint (data is ignored): zmq_msg_init_data (msg, disk_buffer_data (buffer),
//  disk_buffer_size (buffer), disk_buffer_free_cb, buffer) hands the buffer to a message.
void disk_buffer_free_cb (void *data, void *hint);

//  Called when an op finished, from disk_store_reap, drain or destroy, on the caller's
//  thread. status is 0 or -errno: -EBADMSG for a copy that fails verification (bad magic,
//  another key, size or id, a checksum that does not match, a short file), -ENOENT for a
//  missing file. copy is the copy the op concerns (for a failed write, the one not made).
//  For a read that succeeded, *buffer_p is the value: the callee takes it by setting
//  *buffer_p to NULL, else the store frees it after the callback. For writes and failed
//  reads *buffer_p is NULL. The callback may queue writes and reads and drop copies; it may
//  not call reap, drain or destroy.
typedef void (disk_done_fn) (void *arg, int status, const disk_copy_t *copy,
                             disk_buffer_t **buffer_p);

//  Opens the store in dir (created, with its subdirectories, if needed) and locks it: a
//  second store on the same directory, from any process, fails. queue_depth is the number of
//  io_uring entries (0 means 64); more ops wait in a FIFO. If io_uring cannot be set up the
//  store does the I/O synchronously with pread/pwrite, completions still delivered through
//  reap. Returns NULL on failure with a one-line reason in error. Caller owns the return
//  value and must destroy it.
disk_store_t *disk_store_new (const char *dir, unsigned queue_depth, char *error,
                              size_t error_size);

//  Waits for the ops in flight (their callbacks run), then closes the store and releases the
//  directory. Does nothing on NULL; sets *self_p to NULL.
void disk_store_destroy (disk_store_t **self_p);

//  How the store does I/O, e.g. "io_uring, O_DIRECT" or "io_uring, buffered".
const char *disk_store_describe (disk_store_t *self);

//  An eventfd that is readable when finished ops wait for disk_store_reap (poll it as a plain
//  file descriptor, e.g. with zmq_poll). The store owns it.
int disk_store_fd (disk_store_t *self);

//  Runs the callbacks of finished ops and submits waiting ones. Never blocks.
void disk_store_reap (disk_store_t *self);

//  Ops queued or under way whose callbacks have not yet run.
size_t disk_store_in_flight (disk_store_t *self);

//  Blocks until no op is in flight, running their callbacks.
void disk_store_drain (disk_store_t *self);

//  Queues a write of a new copy of (key, value). The value (and key) are copied before this
//  returns. done (may be NULL) gets the new copy. Returns 0, or -EINVAL for a key longer than
//  DISK_STORE_KEY_MAX or a value larger than DISK_STORE_VALUE_MAX, or -ENOMEM.
int disk_store_write (disk_store_t *self, const char *key, size_t key_len, const void *value,
                      uint64_t size, disk_done_fn *done, void *arg);

//  Queues a read of copy id, verified against key, size and the value's checksum. The key is
//  copied. Returns 0, -EINVAL or -ENOMEM; done (not NULL) gets the value.
int disk_store_read (disk_store_t *self, uint64_t id, const char *key, size_t key_len,
                     uint64_t size, disk_done_fn *done, void *arg);

//  Unlinks copy id, queued as the other ops are (through the ring where the kernel takes
//  unlinks: the unlink of a large file frees its blocks, which can take the filesystem
//  milliseconds, and the thread that asks has puts to copy meanwhile). A read already under
//  way still completes. Drop a copy only after its write's callback ran. Returns 0 (queued)
//  or -EINVAL, -ENOMEM; done, if not NULL, gets 0 or -errno (-ENOENT: no such copy).
int disk_store_drop (disk_store_t *self, uint64_t id, disk_done_fn *done, void *arg);

//  The bytes a copy of a key of key_len and a value of size bytes takes on disk.
uint64_t disk_store_footprint (uint64_t key_len, uint64_t size);

//  Called by disk_store_scan for each good copy; key is valid during the call only.
typedef void (disk_found_fn) (void *arg, const char *key, size_t key_len, const disk_copy_t *copy);

typedef struct {
    uint64_t copies;          //  good copies found
    uint64_t bytes;           //  their footprint on disk
    uint64_t partial_dropped; //  .tmp files deleted (writes a crash cut short)
    uint64_t corrupt_dropped; //  .kv files that failed verification, deleted
    uint64_t not_regular;     //  names of copies that are no regular file: left alone, unread
    char not_regular_example[300]; //  the first of them, relative to the directory
} disk_scan_report_t;

//  Start-up scan, synchronous: deletes .tmp files, reads and verifies every .kv file (its
//  length and both checksums), deletes those that fail, calls found (may be NULL) for each
//  good one. New ids continue above the largest found. Call it before the first write: a
//  store that has not scanned its directory may reuse an id. Fills report (may be NULL);
//  returns 0 or -errno (the scan stops at the first error that is not the file's fault).
int disk_store_scan (disk_store_t *self, disk_found_fn *found, void *arg,
                     disk_scan_report_t *report);

void disk_store_test (bool verbose);

#endif
