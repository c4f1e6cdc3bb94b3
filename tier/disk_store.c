/*  disk_store.c - the disk tier's on-disk store (see disk_store.h).

    DESIGN

    A copy is one file: a header block (64 bytes of fields, disk_header_t, then the key,
    zero-padded to a multiple of 4096), then the value, padded to 4096. A read checks the key,
    size and id it expects and two checksums, one over the fields and key and one over the
    value: a torn or flipped header, a flipped value byte and a short file all read as
    -EBADMSG, never as someone's data.

    A write builds the whole file image in one aligned block (the caller's value is copied in
    before disk_store_write returns), writes it to <id>.tmp with one io_uring write and, once
    that completed, renames it to <id>.kv: a file with the .kv name is always complete, and a
    .tmp found at start-up is a write a crash cut short. There is no fsync: the tier is a
    cache, and a copy a power cut damaged fails its checksum at the next scan and is dropped.
    A read reads the whole file in one io_uring read (a value over 1 GiB in several) into an
    aligned block, verifies it, and hands the block on as a disk_buffer_t whose data pointer is
    at the value, with no further copy.

    O_DIRECT keeps the tier's traffic out of the page cache (the memory is the node's first
    tier). Buffers, offsets and lengths are multiples of 4096. A filesystem that refuses
    O_DIRECT (EINVAL at open: tmpfs before Linux 6.6) gets buffered I/O from then on; an
    O_DIRECT transfer the kernel refuses (EINVAL, e.g. at the unaligned end of a truncated
    file) is retried buffered on that file (fcntl clears O_DIRECT).

    FILES. Every name under the directory is opened O_NOFOLLOW and O_NONBLOCK (a FIFO's
    open would block, a symlink's would reach outside), then fstat-ed: anything but a regular
    file is closed unread (DISK_NOT_REGULAR). A write removes whatever has its .tmp name
    (unlinkat: a symlink goes, not its target) and creates the file O_EXCL, so it never
    writes into a file it did not create. The start-up scan lstat-s each name before it
    opens it; names that are not regular files are left in place, counted and logged.

    Queueing: the ring has queue_depth entries and at most that many ops are in it; more wait
    in a FIFO and start, in order, as entries free up. A file is opened (and a read's block
    allocated) when its op starts, not when it is queued, so a long queue holds no fds. A short
    transfer is resubmitted for the rest. Ops that fail before reaching the ring (open failed)
    go to a done list. Both paths signal the eventfd (io_uring through
    io_uring_register_eventfd, the done list by a write), and reap reads the eventfd before it
    looks at the CQ and the list, so a completion that lands during a reap leaves the fd
    readable: no wake-up is missed. Drops are ops too, queued in order with the others: an
    unlink in the ring (IORING_OP_UNLINKAT) where the kernel takes it, else done when the op
    starts. (Unlinking a 4 MiB file frees its blocks, about a millisecond on ext4: a hundred
    drops done in the caller's thread, after a remove-all, held the next put up 85 ms.)
    Without io_uring, ops run with pread/pwrite when they start and go to the done list.

    Threads: one thread uses a store. Ordering: ops start in the order they were queued;
    callbacks run in the order ops finish.
*/
#include "tier/disk_store.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
//  libxxhash picks the widest vector unit at run time (AVX2 where there is one): the same
//  hash, three times faster than its SSE2 default on a 1 MiB value.
#include <xxh_x86dispatch.h>
#endif

#define DISK_MAGIC "KVPDISK1"
#define DISK_VERSION 1
#define DISK_ALIGN 4096ULL
#define DISK_IO_MAX (1u << 30)     //  largest single transfer
#define DISK_SCAN_CHUNK (8u << 20) //  scan reads values this much at a time
#define DISK_DEFAULT_DEPTH 64
#define DISK_MAX_DEPTH 4096
//  What an open returns for a name that is not a regular file (a symlink, a FIFO, a device).
#define DISK_NOT_REGULAR (-EBADFD)
//  A copy's name, "<2 hex>/<16 hex>.kv", and its NUL, with room to spare
#define DISK_PATH_MAX 40

//  The header's fields, then the key. The struct is the disk image on a little-endian
//  machine, the only kind the node runs on (asserted below).
typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t header_size; //  fields, key and padding: a multiple of 4096
    uint64_t key_len;
    uint64_t size; //  of the value
    uint64_t id;
    uint64_t value_hash;  //  XXH3-64 of the value
    uint64_t header_hash; //  XXH3-64 of the fields (this one zero) and the key
    uint64_t reserved;    //  zero
} disk_header_t;
#define DISK_FIELDS sizeof (disk_header_t)
_Static_assert(sizeof (disk_header_t) == 64, "the fields take 64 bytes");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the header is little-endian");

typedef struct _disk_op_t {
    struct _disk_op_t *next; //  in the wait FIFO or the done list
    bool write;
    bool unlink; //  a drop: the copy's file unlinked (path in key, NUL-terminated)
    bool direct; //  fd is O_DIRECT
    int fd;
    int status;
    disk_copy_t copy;
    char *block;   //  the file image (aligned)
    uint64_t done; //  bytes of it transferred
    disk_done_fn *done_fn;
    void *arg;
    size_t key_len; //  reads: the key expected
    char key[];
} disk_op_t;

typedef struct {
    disk_op_t *head, *tail;
} disk_list_t;

struct _disk_store_t {
    int dir_fd;
    int lock_fd;
    int event_fd;
    bool uring;        //  ring is set up; else synchronous I/O
    bool uring_unlink; //  ... and takes unlinks (IORING_OP_UNLINKAT, Linux 5.11)
    bool direct;       //  try O_DIRECT on new files
    struct io_uring ring;
    unsigned depth;
    unsigned in_ring;     //  ops with an SQE or CQE outstanding
    unsigned max_in_ring; //  high-water mark (the self test checks concurrency)
    size_t ops;           //  ops whose callback has not run
    disk_list_t waiting;  //  queued, not started
    disk_list_t finished; //  finished outside the ring, callback pending
    uint64_t next_id;
    bool in_callback;
    char io_kind[96];
    char describe[128];
};

//  Lives at the start of the block a read filled: the header it overwrites was checked and is
//  no longer needed, and the buffer costs no allocation of its own.
struct _disk_buffer_t {
    uint64_t offset; //  of the value in the block
    uint64_t size;
};

static uint64_t
s_round (uint64_t n)
{
    return (n + DISK_ALIGN - 1) & ~(DISK_ALIGN - 1);
}

static uint64_t
s_header_size (uint64_t key_len)
{
    return s_round (DISK_FIELDS + key_len);
}

uint64_t
disk_store_footprint (uint64_t key_len, uint64_t size)
{
    return s_header_size (key_len) + s_round (size);
}

static void
s_list_push (disk_list_t *list, disk_op_t *op)
{
    op->next = NULL;
    if (list->tail)
        list->tail->next = op;
    else
        list->head = op;
    list->tail = op;
}

static disk_op_t *
s_list_pop (disk_list_t *list)
{
    disk_op_t *op = list->head;
    if (op) {
        list->head = op->next;
        if (!list->head)
            list->tail = NULL;
    }
    return op;
}

//  "xx/<16 hex>.kv" relative to the store directory.
static void
s_path (char *buf, size_t size, uint64_t id, const char *ext)
{
    snprintf (buf, size, "%02x/%016llx.%s", (unsigned) (id % 256), (unsigned long long) id, ext);
}

static void
s_describe (disk_store_t *self)
{
    snprintf (self->describe, sizeof self->describe, "%s, %s", self->io_kind,
              self->direct ? "O_DIRECT" : "buffered");
}

static void
s_signal (disk_store_t *self)
{
    uint64_t one = 1;
    ssize_t rc = write (self->event_fd, &one, sizeof one);
    (void) rc; //  fails only when the count is saturated: readable anyway
}

//  Opens a regular file under dir_fd (see FILES), or returns DISK_NOT_REGULAR for anything
//  else, which is then neither read nor written.
static int
s_open_regular (int dir_fd, const char *path, int flags)
{
    int fd = openat (dir_fd, path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno == ELOOP ? DISK_NOT_REGULAR : -errno; //  ELOOP: the name is a symlink
    struct stat st;
    int rc = fstat (fd, &st) != 0 ? -errno : !S_ISREG (st.st_mode) ? DISK_NOT_REGULAR : 0;
    //  O_NONBLOCK was for the open only (a FIFO's open blocks): on a regular file it would
    //  only make io_uring answer -EAGAIN.
    int fl = rc == 0 ? fcntl (fd, F_GETFL) : -1;
    if (rc == 0 && (fl < 0 || fcntl (fd, F_SETFL, fl & ~O_NONBLOCK) != 0))
        rc = -errno;
    if (rc != 0) {
        close (fd);
        return rc;
    }
    return fd;
}

//  Opens path under the store directory, O_DIRECT while the filesystem takes it. A write
//  (O_CREAT) first removes whatever has the name (a crash's .tmp, or something planted
//  there) and creates a new file, O_EXCL.
static int
s_open (disk_store_t *self, const char *path, int flags, bool *direct)
{
    *direct = false;
    bool create = flags & O_CREAT;
    if (create)
        flags = (flags & ~O_TRUNC) | O_EXCL;
    if (self->direct) {
        if (create && unlinkat (self->dir_fd, path, 0) != 0 && errno != ENOENT)
            return -errno; //  a directory, say: not ours to remove
        int fd = s_open_regular (self->dir_fd, path, flags | O_DIRECT);
        if (fd >= 0) {
            *direct = true;
            return fd;
        }
        if (fd != -EINVAL)
            return fd;
        self->direct = false; //  the filesystem refuses O_DIRECT: buffered from now on
        s_describe (self);
    }
    //  Again after a refused O_DIRECT: that open may have created the file.
    if (create && unlinkat (self->dir_fd, path, 0) != 0 && errno != ENOENT)
        return -errno;
    return s_open_regular (self->dir_fd, path, flags);
}

static int
s_clear_direct (int fd)
{
    int flags = fcntl (fd, F_GETFL);
    return flags < 0 ? -1 : fcntl (fd, F_SETFL, flags & ~O_DIRECT);
}

//  Synchronous transfer of len bytes at off. Returns the bytes moved (fewer only at the end
//  of a file) or -errno.
static int64_t
s_io_full (int fd, bool *direct, bool write_, char *buf, uint64_t len, uint64_t off)
{
    uint64_t done = 0;
    while (done < len) {
        size_t chunk = len - done < DISK_IO_MAX ? len - done : DISK_IO_MAX;
        ssize_t n = write_ ? pwrite (fd, buf + done, chunk, off + done)
                           : pread (fd, buf + done, chunk, off + done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EINVAL && *direct && s_clear_direct (fd) == 0) {
            *direct = false;
            continue;
        }
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        done += n;
    }
    return done;
}

//  Checks the header at the start of block (avail bytes of it read): fields and header
//  checksum. 0 or -EBADMSG; fills *h.
static int
s_header_check (char *block, uint64_t avail, disk_header_t *h)
{
    if (avail < DISK_ALIGN)
        return -EBADMSG;
    memcpy (h, block, sizeof *h);
    if (memcmp (h->magic, DISK_MAGIC, 8) != 0 || h->version != DISK_VERSION
        || h->key_len > DISK_STORE_KEY_MAX || h->header_size != s_header_size (h->key_len)
        || avail < h->header_size || h->size > DISK_STORE_VALUE_MAX)
        return -EBADMSG;
    ((disk_header_t *) block)->header_hash = 0; //  block is 4096-aligned
    uint64_t hash = XXH3_64bits (block, DISK_FIELDS + h->key_len);
    ((disk_header_t *) block)->header_hash = h->header_hash;
    return hash == h->header_hash ? 0 : -EBADMSG;
}

// --------------------------------------------------------------------------------------
//  Buffers

const void *
disk_buffer_data (disk_buffer_t *self)
{
    return (const char *) self + self->offset;
}

uint64_t
disk_buffer_size (disk_buffer_t *self)
{
    return self->size;
}

void
disk_buffer_destroy (disk_buffer_t **self_p)
{
    if (self_p && *self_p) {
        free (*self_p); //  the whole block
        *self_p = NULL;
    }
}

void
disk_buffer_free_cb (void *data, void *hint)
{
    (void) data;
    disk_buffer_t *buffer = (disk_buffer_t *) hint;
    disk_buffer_destroy (&buffer);
}

// --------------------------------------------------------------------------------------
//  Ops

//  A read's block as read: the copy it expects, whole and intact. 0 or -EBADMSG.
static int
s_read_verify (disk_op_t *op)
{
    disk_header_t h;
    if (op->done < op->copy.footprint || s_header_check (op->block, op->done, &h) != 0
        || h.key_len != op->key_len || h.size != op->copy.size || h.id != op->copy.id
        || memcmp (op->block + DISK_FIELDS, op->key, h.key_len) != 0)
        return -EBADMSG;
    return XXH3_64bits (op->block + h.header_size, h.size) == h.value_hash ? 0 : -EBADMSG;
}

//  Runs once per op: finishes the file (rename or cleanup), then the callback.
static void
s_finish (disk_store_t *self, disk_op_t *op)
{
    char tmp[40], path[40];
    s_path (tmp, sizeof tmp, op->copy.id, "tmp");
    s_path (path, sizeof path, op->copy.id, "kv");
    if (op->fd >= 0)
        close (op->fd);
    disk_buffer_t *buffer = NULL;
    if (op->write) {
        if (op->status == 0 && renameat (self->dir_fd, tmp, self->dir_fd, path) != 0)
            op->status = -errno;
        if (op->status != 0)
            unlinkat (self->dir_fd, tmp, 0); //  may not exist (the open failed): fine
    }
    else if (op->status == 0 && !op->unlink)
        op->status = s_read_verify (op);
    if (!op->write && !op->unlink && op->status == 0) {
        buffer = (disk_buffer_t *) op->block;
        *buffer = (disk_buffer_t){s_header_size (op->key_len), op->copy.size};
        op->block = NULL;
    }
    free (op->block);
    self->ops--;
    if (op->done_fn) {
        self->in_callback = true;
        op->done_fn (op->arg, op->status, &op->copy, &buffer);
        self->in_callback = false;
    }
    disk_buffer_destroy (&buffer);
    free (op);
}

//  Puts the rest of the op's transfer in an SQE.
static void
s_prep (disk_store_t *self, disk_op_t *op)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe (&self->ring);
    assert (sqe); //  at most depth ops in the ring, each with one SQE or CQE outstanding
    uint64_t rest = op->copy.footprint - op->done;
    unsigned chunk = rest < DISK_IO_MAX ? (unsigned) rest : DISK_IO_MAX;
    if (op->unlink)
        io_uring_prep_unlinkat (sqe, self->dir_fd, op->key, 0);
    else if (op->write)
        io_uring_prep_write (sqe, op->fd, op->block + op->done, chunk, op->done);
    else
        io_uring_prep_read (sqe, op->fd, op->block + op->done, chunk, op->done);
    io_uring_sqe_set_data (sqe, op);
    if (++self->in_ring > self->max_in_ring)
        self->max_in_ring = self->in_ring;
}

//  Takes a CQE's result. Returns true when the op needs another transfer.
static bool
s_progress (disk_op_t *op, int res)
{
    if (op->unlink) {
        op->status = res < 0 ? res : 0;
        return false;
    }
    if (res == -EINTR || res == -EAGAIN)
        return true;
    if (res == -EINVAL && op->direct && s_clear_direct (op->fd) == 0) {
        op->direct = false;
        return true;
    }
    if (res < 0)
        op->status = res;
    else if (res == 0)
        op->status = op->write ? -EIO : -EBADMSG; //  a write that moves nothing; a short file
    else
        op->done += res;
    return op->status == 0 && op->done < op->copy.footprint;
}

//  Starts waiting ops while the ring has room, and submits.
static void
s_pump (disk_store_t *self)
{
    while (self->waiting.head && (!self->uring || self->in_ring < self->depth)) {
        disk_op_t *op = s_list_pop (&self->waiting);
        if (op->unlink) {
            //  In the ring where it takes unlinks: an unlink of a large file frees its
            //  blocks, which takes the filesystem long enough to hold up the I/O behind it.
            if (self->uring_unlink)
                s_prep (self, op);
            else {
                op->status = unlinkat (self->dir_fd, op->key, 0) == 0 ? 0 : -errno;
                s_list_push (&self->finished, op);
                s_signal (self);
            }
            continue;
        }
        char path[40];
        s_path (path, sizeof path, op->copy.id, op->write ? "tmp" : "kv");
        int flags = op->write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY;
        int fd = s_open (self, path, flags, &op->direct);
        op->fd = fd < 0 ? -1 : fd;
        op->status = fd < 0 ? fd : 0;
        if (fd >= 0 && !op->write
            && posix_memalign ((void **) &op->block, DISK_ALIGN, op->copy.footprint) != 0) {
            op->block = NULL;
            op->status = -ENOMEM;
        }
        if (op->status == 0 && self->uring) {
            s_prep (self, op);
            continue;
        }
        if (op->status == 0) {
            //  No ring: the transfer happens here, the callback at the next reap.
            int64_t n =
                s_io_full (op->fd, &op->direct, op->write, op->block, op->copy.footprint, 0);
            if (n < 0)
                op->status = (int) n;
            else if ((op->done = n) < op->copy.footprint)
                op->status = op->write ? -EIO : -EBADMSG;
        }
        s_list_push (&self->finished, op);
        s_signal (self);
    }
    if (self->uring && io_uring_submit (&self->ring) < 0)
        s_signal (self); //  EAGAIN and the like: try again at the next reap
}

static void
s_queue (disk_store_t *self, disk_op_t *op, disk_done_fn *done, void *arg)
{
    op->fd = -1;
    op->done_fn = done;
    op->arg = arg;
    self->ops++;
    s_list_push (&self->waiting, op);
    s_pump (self);
}

int
disk_store_write (disk_store_t *self, const char *key, size_t key_len, const void *value,
                  uint64_t size, disk_done_fn *done, void *arg)
{
    assert (self);
    if (key_len > DISK_STORE_KEY_MAX || size > DISK_STORE_VALUE_MAX || (key_len && !key)
        || (size && !value))
        return -EINVAL;
    disk_op_t *op = (disk_op_t *) calloc (1, sizeof (disk_op_t));
    if (!op)
        return -ENOMEM;
    uint32_t header_size = s_header_size (key_len);
    op->copy = (disk_copy_t){self->next_id, size, disk_store_footprint (key_len, size)};
    if (posix_memalign ((void **) &op->block, DISK_ALIGN, op->copy.footprint) != 0) {
        free (op);
        return -ENOMEM;
    }
    char *block = op->block;
    memset (block, 0, header_size);
    if (size)
        memcpy (block + header_size, value, size);
    memset (block + header_size + size, 0, op->copy.footprint - header_size - size);
    disk_header_t h = {DISK_MAGIC, DISK_VERSION, header_size, key_len, size, op->copy.id, 0, 0, 0};
    h.value_hash = XXH3_64bits (block + header_size, size); //  the copy: the caller's may change
    memcpy (block, &h, sizeof h);
    if (key_len)
        memcpy (block + DISK_FIELDS, key, key_len);
    ((disk_header_t *) block)->header_hash = XXH3_64bits (block, DISK_FIELDS + key_len);
    self->next_id++;
    op->write = true;
    s_queue (self, op, done, arg);
    return 0;
}

int
disk_store_read (disk_store_t *self, uint64_t id, const char *key, size_t key_len, uint64_t size,
                 disk_done_fn *done, void *arg)
{
    assert (self);
    assert (done);
    if (id == 0 || key_len > DISK_STORE_KEY_MAX || size > DISK_STORE_VALUE_MAX || (key_len && !key))
        return -EINVAL;
    disk_op_t *op = (disk_op_t *) calloc (1, sizeof (disk_op_t) + key_len);
    if (!op)
        return -ENOMEM;
    op->copy = (disk_copy_t){id, size, disk_store_footprint (key_len, size)};
    op->key_len = key_len;
    if (key_len)
        memcpy (op->key, key, key_len);
    s_queue (self, op, done, arg);
    return 0;
}

int
disk_store_drop (disk_store_t *self, uint64_t id, disk_done_fn *done, void *arg)
{
    assert (self);
    if (id == 0)
        return -EINVAL;
    disk_op_t *op = (disk_op_t *) calloc (1, sizeof (disk_op_t) + DISK_PATH_MAX);
    if (!op)
        return -ENOMEM;
    op->copy = (disk_copy_t){id, 0, 0};
    op->unlink = true;
    s_path (op->key, DISK_PATH_MAX, id, "kv");
    s_queue (self, op, done, arg);
    return 0;
}

void
disk_store_reap (disk_store_t *self)
{
    assert (self);
    if (self->in_callback)
        return;
    uint64_t count;
    ssize_t rc = read (self->event_fd, &count, sizeof count); //  first: see DESIGN
    (void) rc;
    struct io_uring_cqe *cqe;
    while (self->uring && io_uring_peek_cqe (&self->ring, &cqe) == 0) {
        disk_op_t *op = (disk_op_t *) io_uring_cqe_get_data (cqe);
        int res = cqe->res;
        io_uring_cqe_seen (&self->ring, cqe);
        self->in_ring--;
        if (s_progress (op, res))
            s_prep (self, op);
        else
            s_finish (self, op);
    }
    disk_op_t *op;
    while ((op = s_list_pop (&self->finished)))
        s_finish (self, op);
    s_pump (self);
}

size_t
disk_store_in_flight (disk_store_t *self)
{
    return self->ops;
}

void
disk_store_drain (disk_store_t *self)
{
    assert (!self->in_callback);
    while (self->ops > 0) {
        disk_store_reap (self);
        if (self->ops > 0 && !self->finished.head && self->uring && self->in_ring > 0)
            io_uring_submit_and_wait (&self->ring, 1);
    }
}

int
disk_store_fd (disk_store_t *self)
{
    return self->event_fd;
}

const char *
disk_store_describe (disk_store_t *self)
{
    return self->describe;
}

// --------------------------------------------------------------------------------------
//  Open and close

static int
s_mkdir_p (const char *dir)
{
    char path[4096];
    if (snprintf (path, sizeof path, "%s", dir) >= (int) sizeof path)
        return -ENAMETOOLONG;
    for (char *slash = path + 1;; slash++) {
        if (*slash != '/' && *slash != 0)
            continue;
        char end = *slash;
        *slash = 0;
        if (mkdir (path, 0700) != 0 && errno != EEXIST)
            return -errno;
        *slash = end;
        if (!end)
            return 0;
    }
}

static disk_store_t *
s_store_new (const char *dir, unsigned depth, bool try_uring, char *error, size_t error_size)
{
    disk_store_t *self = (disk_store_t *) calloc (1, sizeof (disk_store_t));
    if (!self) {
        snprintf (error, error_size, "disk store %s: out of memory", dir);
        return NULL;
    }
    self->depth = depth == 0 ? DISK_DEFAULT_DEPTH : depth > DISK_MAX_DEPTH ? DISK_MAX_DEPTH : depth;
    self->next_id = 1;
    self->lock_fd = self->event_fd = -1;
    int rc = s_mkdir_p (dir);
    self->dir_fd = rc == 0 ? open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (self->dir_fd >= 0)
        self->lock_fd = s_open_regular (self->dir_fd, "LOCK", O_RDWR | O_CREAT);
    if (self->lock_fd >= 0 && flock (self->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            snprintf (error, error_size, "disk store %s is in use (%s/LOCK is locked)", dir, dir);
        else
            snprintf (error, error_size, "disk store %s: flock: %s", dir, strerror (errno));
        disk_store_destroy (&self);
        return NULL;
    }
    for (unsigned sub = 0; self->lock_fd >= 0 && sub < 256; sub++) {
        char name[4];
        snprintf (name, sizeof name, "%02x", sub);
        if (mkdirat (self->dir_fd, name, 0700) != 0 && errno != EEXIST)
            rc = -errno;
    }
    if (rc == 0 && self->dir_fd < 0)
        rc = -errno; //  the directory's open
    else if (rc == 0 && self->lock_fd < 0)
        rc = self->lock_fd == DISK_NOT_REGULAR ? -EEXIST : self->lock_fd; //  LOCK is no file
    if (rc == 0 && (self->event_fd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        rc = -errno;
    if (rc != 0) {
        snprintf (error, error_size, "disk store %s: %s", dir, strerror (-rc));
        disk_store_destroy (&self);
        return NULL;
    }
    //  Whether the filesystem takes O_DIRECT (tmpfs before Linux 6.6 did not).
    int probe = s_open_regular (self->dir_fd, "LOCK", O_RDONLY | O_DIRECT);
    self->direct = probe >= 0;
    if (probe >= 0)
        close (probe);
    int uring_rc = try_uring ? io_uring_queue_init (self->depth, &self->ring, 0) : -ENOSYS;
    if (uring_rc == 0 && (uring_rc = io_uring_register_eventfd (&self->ring, self->event_fd)) != 0)
        io_uring_queue_exit (&self->ring);
    self->uring = uring_rc == 0;
    if (self->uring) {
        struct io_uring_probe *probe_ops = io_uring_get_probe_ring (&self->ring);
        self->uring_unlink = probe_ops && io_uring_opcode_supported (probe_ops, IORING_OP_UNLINKAT);
        if (probe_ops)
            io_uring_free_probe (probe_ops);
    }
    if (self->uring)
        snprintf (self->io_kind, sizeof self->io_kind, "io_uring");
    else
        snprintf (self->io_kind, sizeof self->io_kind, "pread/pwrite (io_uring: %s)",
                  strerror (-uring_rc));
    s_describe (self);
    return self;
}

disk_store_t *
disk_store_new (const char *dir, unsigned queue_depth, char *error, size_t error_size)
{
    return s_store_new (dir, queue_depth, true, error, error_size);
}

void
disk_store_destroy (disk_store_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    disk_store_t *self = *self_p;
    if (self->event_fd >= 0)
        disk_store_drain (self);
    if (self->uring)
        io_uring_queue_exit (&self->ring);
    if (self->event_fd >= 0)
        close (self->event_fd);
    if (self->lock_fd >= 0)
        close (self->lock_fd); //  releases the flock
    if (self->dir_fd >= 0)
        close (self->dir_fd);
    free (self);
    *self_p = NULL;
}

// --------------------------------------------------------------------------------------
//  Start-up scan

//  "<16 hex>.kv" or "<16 hex>.tmp", id not 0. Anything else is not ours and left alone.
static bool
s_parse_name (const char *name, uint64_t *id, bool *tmp)
{
    if (strlen (name) < 17 || name[16] != '.' || strspn (name, "0123456789abcdef") != 16)
        return false;
    *tmp = strcmp (name + 17, "tmp") == 0;
    *id = strtoull (name, NULL, 16);
    return *id != 0 && (*tmp || strcmp (name + 17, "kv") == 0);
}

//  Verifies one .kv file: length, header, key, value checksum. buf holds a header of any
//  size, then DISK_SCAN_CHUNK bytes for the value. 0 (the key is at buf + DISK_FIELDS),
//  -EBADMSG, or another -errno.
static int
s_scan_file (disk_store_t *self, const char *path, uint64_t id, char *buf, XXH3_state_t *state,
             disk_copy_t *copy, size_t *key_len_p)
{
    bool direct;
    int fd = s_open (self, path, O_RDONLY, &direct);
    if (fd < 0)
        return fd;
    struct stat st;
    disk_header_t h = {.key_len = 0, .size = 0, .id = 0};
    int64_t n = fstat (fd, &st) == 0 ? s_io_full (fd, &direct, false, buf, DISK_ALIGN, 0) : -errno;
    int rc = n < 0 ? (int) n : n < (int64_t) DISK_ALIGN ? -EBADMSG : 0;
    if (rc == 0) {
        //  Only how much more to read; s_header_check judges the field.
        uint64_t claimed = ((disk_header_t *) buf)->key_len;
        uint64_t header_size = claimed <= DISK_STORE_KEY_MAX ? s_header_size (claimed) : DISK_ALIGN;
        n = s_io_full (fd, &direct, false, buf + DISK_ALIGN, header_size - DISK_ALIGN, DISK_ALIGN);
        rc = n < 0 ? (int) n : s_header_check (buf, DISK_ALIGN + n, &h);
    }
    if (rc == 0
        && (h.id != id || (uint64_t) st.st_size != disk_store_footprint (h.key_len, h.size)))
        rc = -EBADMSG;
    char *value = buf + s_header_size (DISK_STORE_KEY_MAX);
    XXH3_64bits_reset (state);
    for (uint64_t off = 0; rc == 0 && off < h.size; off += DISK_SCAN_CHUNK) {
        uint64_t want = h.size - off < DISK_SCAN_CHUNK ? h.size - off : DISK_SCAN_CHUNK;
        n = s_io_full (fd, &direct, false, value, s_round (want), h.header_size + off);
        rc = n < 0 ? (int) n : n < (int64_t) s_round (want) ? -EBADMSG : 0;
        if (rc == 0)
            XXH3_64bits_update (state, value, want);
    }
    if (rc == 0 && XXH3_64bits_digest (state) != h.value_hash)
        rc = -EBADMSG;
    close (fd);
    *copy = (disk_copy_t){id, h.size, disk_store_footprint (h.key_len, h.size)};
    *key_len_p = h.key_len;
    return rc;
}

int
disk_store_scan (disk_store_t *self, disk_found_fn *found, void *arg, disk_scan_report_t *report)
{
    disk_scan_report_t r;
    memset (&r, 0, sizeof r);
    char *buf = NULL;
    XXH3_state_t *state = XXH3_createState ();
    size_t buf_size = s_header_size (DISK_STORE_KEY_MAX) + DISK_SCAN_CHUNK;
    int rc = state && posix_memalign ((void **) &buf, DISK_ALIGN, buf_size) == 0 ? 0 : -ENOMEM;
    for (unsigned sub = 0; rc == 0 && sub < 256; sub++) {
        char name[4];
        snprintf (name, sizeof name, "%02x", sub);
        int fd = openat (self->dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        DIR *dir = fd >= 0 ? fdopendir (fd) : NULL;
        if (!dir && errno == ENOENT)
            continue; //  removed by hand: it holds no copies
        if (!dir && (errno == ELOOP || errno == ENOTDIR)) {
            r.not_regular++; //  a symlink or a file where the directory should be: not ours
            continue;
        }
        if (!dir) {
            rc = -errno;
            if (fd >= 0)
                close (fd);
            break;
        }
        struct dirent *entry;
        while (rc == 0 && (entry = readdir (dir))) {
            uint64_t id;
            bool tmp;
            if (!s_parse_name (entry->d_name, &id, &tmp))
                continue;
            char path[300];
            snprintf (path, sizeof path, "%s/%s", name, entry->d_name);
            disk_copy_t copy = {0, 0, 0};
            size_t key_len = 0;
            //  lstat first: a FIFO, device or symlink named like a copy is never opened (the
            //  open would check again: the name may change in between).
            struct stat st;
            int file_rc = -EBADMSG; //  a .tmp, or a .kv in the wrong directory
            if (fstatat (self->dir_fd, path, &st, AT_SYMLINK_NOFOLLOW) != 0)
                file_rc = -errno;
            else if (!S_ISREG (st.st_mode))
                file_rc = DISK_NOT_REGULAR;
            if (file_rc == -EBADMSG && !tmp && id % 256 == sub)
                file_rc = s_scan_file (self, path, id, buf, state, &copy, &key_len);
            if (file_rc == -ENOMEM || file_rc == -EMFILE || file_rc == -ENFILE)
                rc = file_rc; //  not the file's fault: stop, delete nothing
            else if (file_rc == -ENOENT)
                continue; //  gone meanwhile
            else if (file_rc == DISK_NOT_REGULAR) {
                r.not_regular++; //  not ours: left in place, never followed or read
                if (!*r.not_regular_example)
                    snprintf (r.not_regular_example, sizeof r.not_regular_example, "%s", path);
            }
            else if (file_rc != 0) {
                unlinkat (self->dir_fd, path, 0);
                if (tmp)
                    r.partial_dropped++;
                else
                    r.corrupt_dropped++;
            }
            else {
                r.copies++;
                r.bytes += copy.footprint;
                if (id >= self->next_id)
                    self->next_id = id + 1;
                if (found)
                    found (arg, buf + DISK_FIELDS, key_len, &copy);
            }
        }
        closedir (dir);
    }
    free (buf);
    XXH3_freeState (state);
    if (report)
        *report = r;
    return rc;
}

// --------------------------------------------------------------------------------------
//  Self test

typedef struct {
    int calls, status;
    disk_copy_t copy;
    disk_buffer_t *buffer;
} test_op_t;

static void
s_test_done (void *arg, int status, const disk_copy_t *copy, disk_buffer_t **buffer_p)
{
    test_op_t *op = (test_op_t *) arg;
    op->calls++;
    op->status = status;
    op->copy = *copy;
    op->buffer = *buffer_p; //  takes it
    *buffer_p = NULL;
}

//  Waits on the eventfd, as the node's poll loop does, until nothing is in flight.
static void
s_test_settle (disk_store_t *store)
{
    while (disk_store_in_flight (store) > 0) {
        struct pollfd item = {disk_store_fd (store), POLLIN, 0};
        int rc = poll (&item, 1, 10000);
        assert (rc == 1); //  a completion that never signals the fd would hang the node
        disk_store_reap (store);
    }
}

static void
s_test_fill (char *buf, size_t size, unsigned seed)
{
    for (size_t i = 0; i < size; i++)
        buf[i] = (char) (i * 131 + seed * 7 + (i >> 12));
}

static disk_copy_t
s_test_write (disk_store_t *store, const char *key, size_t key_len, const char *value,
              uint64_t size)
{
    test_op_t op = {0, 1, {0, 0, 0}, NULL};
    int rc = disk_store_write (store, key, key_len, value, size, s_test_done, &op);
    assert (rc == 0);
    s_test_settle (store);
    assert (op.calls == 1 && op.status == 0 && op.copy.id != 0 && op.copy.size == size);
    assert (op.copy.footprint == disk_store_footprint (key_len, size));
    return op.copy;
}

//  Reads copy back; on success checks the bytes against value. Returns the status.
static int
s_test_read (disk_store_t *store, disk_copy_t copy, const char *key, size_t key_len,
             const char *value)
{
    test_op_t op = {0, 1, {0, 0, 0}, NULL};
    int rc = disk_store_read (store, copy.id, key, key_len, copy.size, s_test_done, &op);
    assert (rc == 0);
    s_test_settle (store);
    assert (op.calls == 1 && op.copy.id == copy.id && (op.status == 0) == (op.buffer != NULL));
    if (op.buffer) {
        assert (disk_buffer_size (op.buffer) == copy.size);
        assert (memcmp (disk_buffer_data (op.buffer), value, copy.size) == 0);
        disk_buffer_free_cb (NULL, op.buffer);
    }
    return op.status;
}

//  Drops copy id and waits for it. Returns the status.
static int
s_test_drop (disk_store_t *store, uint64_t id)
{
    test_op_t op = {0, 1, {0, 0, 0}, NULL};
    assert (disk_store_drop (store, id, s_test_done, &op) == 0);
    s_test_settle (store);
    assert (op.calls == 1 && op.copy.id == id && !op.buffer);
    return op.status;
}

//  The path of a copy's file; whether it exists.
static bool
s_test_path (char *buf, const char *dir, uint64_t id, const char *ext)
{
    char rel[40];
    s_path (rel, sizeof rel, id, ext);
    snprintf (buf, 512, "%s/%s", dir, rel);
    return access (buf, F_OK) == 0;
}

static void
s_test_flip (const char *dir, uint64_t id, uint64_t offset)
{
    char path[512], c;
    s_test_path (path, dir, id, "kv");
    int fd = open (path, O_RDWR);
    assert (fd >= 0 && pread (fd, &c, 1, offset) == 1);
    c ^= 0x40;
    assert (pwrite (fd, &c, 1, offset) == 1);
    close (fd);
}

//  A write the kernel refuses (the file size limit here; ENOSPC takes the same path)
//  reports the error and leaves no file behind.
static void
s_test_write_fails (disk_store_t *store, const char *dir, const char *value)
{
    struct rlimit old, small;
    getrlimit (RLIMIT_FSIZE, &old);
    small = (struct rlimit){64 * 1024, old.rlim_max};
    void (*old_handler) (int) = signal (SIGXFSZ, SIG_IGN);
    setrlimit (RLIMIT_FSIZE, &small);
    test_op_t op = {0, 0, {0, 0, 0}, NULL};
    int rc = disk_store_write (store, "too big", 7, value, 1 << 20, s_test_done, &op);
    assert (rc == 0);
    s_test_settle (store);
    setrlimit (RLIMIT_FSIZE, &old);
    signal (SIGXFSZ, old_handler);
    char path[512];
    assert (op.calls == 1 && op.status == -EFBIG);
    assert (!s_test_path (path, dir, op.copy.id, "tmp")
            && !s_test_path (path, dir, op.copy.id, "kv"));
}

typedef struct {
    const char *key;
    size_t key_len;
    disk_copy_t copy;
    bool found;
} test_copy_t;

typedef struct {
    test_copy_t *copies;
    size_t count, found;
} test_found_t;

static void
s_test_found (void *arg, const char *key, size_t key_len, const disk_copy_t *copy)
{
    test_found_t *found = (test_found_t *) arg;
    for (size_t i = 0; i < found->count; i++) {
        test_copy_t *expect = &found->copies[i];
        if (expect->copy.id != copy->id)
            continue;
        assert (!expect->found && key_len == expect->key_len);
        assert (memcmp (key, expect->key, key_len) == 0 && copy->size == expect->copy.size);
        assert (copy->footprint == expect->copy.footprint);
        expect->found = true;
        found->found++;
        return;
    }
    assert (false); //  a copy nobody kept
}

//  Scans, expecting exactly the copies kept.
static disk_scan_report_t
s_test_scan (disk_store_t *store, test_copy_t *kept, size_t count)
{
    test_found_t found = {kept, count, 0};
    disk_scan_report_t report;
    uint64_t bytes = 0;
    for (size_t i = 0; i < count; i++) {
        kept[i].found = false;
        bytes += kept[i].copy.footprint;
    }
    int rc = disk_store_scan (store, s_test_found, &found, &report);
    assert (rc == 0 && found.found == count && report.copies == count && report.bytes == bytes);
    return report;
}

static int
s_test_fds (void)
{
    int count = 0;
    DIR *dir = opendir ("/proc/self/fd");
    while (dir && readdir (dir))
        count++;
    if (dir)
        closedir (dir);
    return count;
}

static int
s_test_rm (const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void) st, (void) flag, (void) ftw;
    return remove (path);
}

#define TEST_BIG ((1u << 20) + 3)
#define TEST_MANY 100
#define TEST_VALUE (64 * 1024)

//  The whole life of a store in dir, with io_uring or without.
static void
s_test_store (const char *dir, bool uring, const char *big, bool verbose)
{
    char error[256], path[512];
    disk_store_t *store = s_store_new (dir, 8, uring, error, sizeof error);
    assert (store && store->uring == uring);
    if (verbose)
        printf (" %s: %s\n", dir, disk_store_describe (store));
    //  One store per directory, even within one process (flock is per open file).
    assert (disk_store_new (dir, 8, error, sizeof error) == NULL && strstr (error, dir));
    s_test_scan (store, NULL, 0);

    //  Round trips at the edges of 4096; keys with a zero byte; a key that needs 2 blocks.
    const uint64_t sizes[] = {0, 1, 4095, 4096, 4097, TEST_BIG};
    static char long_key[5000], keys[6][4];
    s_test_fill (long_key, sizeof long_key, 2);
    test_copy_t kept[6 + TEST_MANY + 3];
    size_t kept_count = 0;
    for (size_t i = 0; i < 6; i++) {
        memcpy (keys[i], "k\0", 2);
        keys[i][2] = (char) ('a' + i);
        const char *key = i == 2 ? long_key : keys[i];
        size_t key_len = i == 2 ? sizeof long_key : 3;
        disk_copy_t copy = s_test_write (store, key, key_len, big, sizes[i]);
        struct stat st;
        assert (s_test_path (path, dir, copy.id, "kv") && stat (path, &st) == 0);
        assert ((uint64_t) st.st_size == copy.footprint
                && !s_test_path (path, dir, copy.id, "tmp"));
        assert (s_test_read (store, copy, key, key_len, big) == 0);
        kept[kept_count++] = (test_copy_t){key, key_len, copy, false};
    }
    //  A read checks that the copy is the one the caller means.
    disk_copy_t other = kept[1].copy;
    assert (s_test_read (store, other, "k\0x", 3, big) == -EBADMSG);
    other.size = 2;
    assert (s_test_read (store, other, "k\0b", 3, big) == -EBADMSG);
    assert (disk_store_write (store, long_key, DISK_STORE_KEY_MAX + 1, big, 1, NULL, NULL)
            == -EINVAL);
    assert (disk_store_read (store, 0, "k", 1, 1, s_test_done, NULL) == -EINVAL);
    assert (disk_store_in_flight (store) == 0);

    //  100 writes of 64 KiB at once through 8 ring entries, then 100 reads; the caller's
    //  memory may change as soon as write returns.
    char *many = (char *) malloc (TEST_MANY * TEST_VALUE);
    static char many_keys[TEST_MANY][24];
    test_op_t ops[TEST_MANY];
    memset (ops, 0, sizeof ops);
    for (int i = 0; i < TEST_MANY; i++) {
        snprintf (many_keys[i], sizeof many_keys[i], "many-%03d", i);
        s_test_fill (many + (size_t) i * TEST_VALUE, TEST_VALUE, 10 + i);
        int rc = disk_store_write (store, many_keys[i], 8, many + (size_t) i * TEST_VALUE,
                                   TEST_VALUE, s_test_done, &ops[i]);
        assert (rc == 0);
    }
    memset (many, 0xee, (size_t) TEST_MANY * TEST_VALUE);
    assert (disk_store_in_flight (store) == TEST_MANY && (!uring || store->in_ring == 8));
    disk_store_drain (store);
    for (int i = 0; i < TEST_MANY; i++) {
        assert (ops[i].calls == 1 && ops[i].status == 0 && ops[i].copy.id == ops[0].copy.id + i);
        s_test_fill (many + (size_t) i * TEST_VALUE, TEST_VALUE, 10 + i);
        int rc = disk_store_read (store, ops[i].copy.id, many_keys[i], 8, TEST_VALUE, s_test_done,
                                  &ops[i]);
        assert (rc == 0);
    }
    store->max_in_ring = 0;
    s_test_settle (store);
    assert (!uring || store->max_in_ring == 8);
    for (int i = 0; i < TEST_MANY; i++) {
        assert (ops[i].calls == 2 && ops[i].status == 0 && ops[i].buffer);
        const void *data = disk_buffer_data (ops[i].buffer);
        assert (memcmp (data, many + (size_t) i * TEST_VALUE, TEST_VALUE) == 0);
        disk_buffer_destroy (&ops[i].buffer);
        if (i >= 4)
            kept[kept_count++] = (test_copy_t){many_keys[i], 8, ops[i].copy, false};
    }

    //  Drop: the file goes (through the ring where it takes unlinks); a read then says so.
    assert (s_test_drop (store, ops[0].copy.id) == 0);
    assert (s_test_drop (store, ops[0].copy.id) == -ENOENT);
    assert (disk_store_drop (store, 0, NULL, NULL) == -EINVAL);
    assert (s_test_read (store, ops[0].copy, many_keys[0], 8, many) == -ENOENT);

    //  Damage: a value byte, a header byte only the header checksum covers (reserved), a
    //  file cut short, and a write a crash interrupted (.tmp).
    s_test_flip (dir, ops[1].copy.id, 4096 + 1000);
    s_test_flip (dir, ops[2].copy.id, 56);
    s_test_path (path, dir, ops[3].copy.id, "kv");
    assert (truncate (path, ops[3].copy.footprint - 100) == 0);
    for (int i = 1; i <= 3; i++)
        assert (s_test_read (store, ops[i].copy, many_keys[i], 8, many + (size_t) i * TEST_VALUE)
                == -EBADMSG);
    s_test_path (path, dir, 12345, "tmp");
    FILE *partial = fopen (path, "w");
    assert (partial && fwrite (big, 1, 5000, partial) == 5000);
    fclose (partial);
    s_test_write_fails (store, dir, big);

    //  Planted names: a symlink at the next write's .tmp name (the write replaces the link,
    //  the file it points to keeps its bytes), a FIFO named like a copy (the scan skips it).
    char victim[512], fifo[512];
    snprintf (victim, sizeof victim, "%s/victim", dir);
    FILE *victim_file = fopen (victim, "w");
    assert (victim_file && fputs ("untouched", victim_file) >= 0);
    fclose (victim_file);
    s_test_path (path, dir, store->next_id, "tmp");
    assert (symlink (victim, path) == 0);
    disk_copy_t linked = s_test_write (store, "linked", 6, big, 5000);
    struct stat victim_st;
    assert (stat (victim, &victim_st) == 0 && victim_st.st_size == 9);
    assert (s_test_read (store, linked, "linked", 6, big) == 0);
    kept[kept_count++] = (test_copy_t){"linked", 6, linked, false};
    s_test_path (fifo, dir, 0x99999, "kv");
    assert (mkfifo (fifo, 0600) == 0);

    //  Destroy waits for the ops in flight: their callbacks run first.
    test_op_t late = {0, 1, {0, 0, 0}, NULL};
    assert (disk_store_write (store, "late", 4, big, 4097, s_test_done, &late) == 0);
    disk_store_destroy (&store);
    assert (!store && late.calls == 1 && late.status == 0);
    kept[kept_count++] = (test_copy_t){"late", 4, late.copy, false};

    //  Reopen: the scan finds every good copy and deletes the rest; ids go on above.
    store = s_store_new (dir, 8, uring, error, sizeof error);
    assert (store);
    disk_scan_report_t report = s_test_scan (store, kept, kept_count);
    assert (report.corrupt_dropped == 3 && report.partial_dropped == 1);
    assert (report.not_regular == 1 && access (fifo, F_OK) == 0);
    assert (strstr (fifo, report.not_regular_example));
    unlink (fifo);
    unlink (victim);
    for (int i = 1; i <= 3; i++)
        assert (!s_test_path (path, dir, ops[i].copy.id, "kv"));
    assert (!s_test_path (path, dir, 12345, "tmp"));
    assert (s_test_read (store, kept[5].copy, keys[5], 3, big) == 0);
    disk_copy_t fresh = s_test_write (store, "fresh", 5, big, 10);
    assert (fresh.id > late.copy.id);
    kept[kept_count++] = (test_copy_t){"fresh", 5, fresh, false};
    disk_store_destroy (&store);
    store = s_store_new (dir, 8, uring, error, sizeof error);
    report = s_test_scan (store, kept, kept_count);
    assert (report.corrupt_dropped == 0 && report.partial_dropped == 0);
    disk_store_destroy (&store);
    free (many);
}

void
disk_store_test (bool verbose)
{
    if (verbose)
        printf ("\n");
    char root[] = "/tmp/kvpool-disk-test-XXXXXX", dir[128], error[256], path[512];
    assert (mkdtemp (root));
    int fds = s_test_fds ();
    const char *bad = "/proc/self/status/store";
    assert (!disk_store_new (bad, 8, error, sizeof error) && strstr (error, bad));
    assert (disk_store_footprint (0, 0) == 4096 && disk_store_footprint (4032, 1) == 8192);
    assert (disk_store_footprint (4033, 0) == 8192 && disk_store_footprint (3, 4097) == 12288);
    char *big = (char *) malloc (TEST_BIG);
    s_test_fill (big, TEST_BIG, 1);
    //  With io_uring, and without: pread/pwrite, completions still through the fd and reap.
    snprintf (dir, sizeof dir, "%s/uring/nested", root);
    s_test_store (dir, true, big, verbose);
    snprintf (dir, sizeof dir, "%s/sync", root);
    s_test_store (dir, false, big, verbose);

    //  tmpfs: it refused O_DIRECT before Linux 6.6, and the store falls back to buffered
    //  I/O; where it takes O_DIRECT the test turns it off, so the buffered path runs anyway.
    char shm[] = "/dev/shm/kvpool-disk-test-XXXXXX";
    if (access ("/dev/shm", W_OK) == 0 && mkdtemp (shm)) {
        disk_store_t *store = disk_store_new (shm, 4, error, sizeof error);
        assert (store);
        snprintf (path, sizeof path, "%s/LOCK", shm);
        int probe = open (path, O_RDONLY | O_DIRECT);
        assert (store->direct == (probe >= 0));
        if (probe >= 0)
            close (probe);
        store->direct = false;
        s_describe (store);
        if (verbose)
            printf (" %s: %s (O_DIRECT %s)\n", shm, disk_store_describe (store),
                    probe >= 0 ? "taken, turned off" : "refused");
        disk_copy_t copy = s_test_write (store, "shm", 3, big, TEST_BIG);
        assert (s_test_read (store, copy, "shm", 3, big) == 0);
        disk_store_destroy (&store);
        store = disk_store_new (shm, 4, error, sizeof error);
        assert (store);
        s_test_scan (store, &(test_copy_t){"shm", 3, copy, false}, 1);
        disk_store_destroy (&store);
        nftw (shm, s_test_rm, 16, FTW_DEPTH | FTW_PHYS);
    }
    //  Every file, the lock, the eventfd and the ring closed: no more descriptors than at the
    //  start. (Not "as many": in the all-in-one kvpool-selftest, sockets of the tests before
    //  this one may still be closing theirs on ZeroMQ's threads, so the count can only fall.)
    assert (s_test_fds () <= fds);
    nftw (root, s_test_rm, 16, FTW_DEPTH | FTW_PHYS);
    assert (access (root, F_OK) != 0);
    free (big);
}
