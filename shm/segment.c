/*  segment.c - a segment: a shared-memory object mapped MAP_SHARED.

    WHAT A NODE MAPS, AND WHY IT CAN NEVER SHRINK
    A mapping whose object shrinks faults with SIGBUS on the next touch past the new end, and
    a SIGBUS in kvpoold kills the node and every object in it. So every object the node reads
    or writes through a mapping must be one nobody else can cut short:
      - the node's own segments are memfds it makes itself (segment_new_sealed), pages all
        committed, then sealed with F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL: no process,
        the node included, can change their size again, whoever opens them later;
      - the same-machine read index and its read stamps are sealed memfds too (shm_index.c);
      - memory a client contributes is mounted only if it is a memfd sealed against shrinking
        (segment_mount), with every page committed (st_blocks) and no larger than the
        machine's memory: a sparse sealed memfd costs its maker nothing, and the node would
        be the one to fault the memory in, and die of it.
    A memfd has no name in /dev/shm: it is named "/proc/<pid>/fd/<fd>" by the process holding
    it, and another process opens it by that name. The object lives while any process holds
    it open or mapped, so nothing is left behind when a process dies and there is no name to
    unlink.

    WHO MAY OPEN A NODE'S MEMFDS
    Opening /proc/<pid>/fd/<fd> passes the kernel's ptrace access check (PTRACE_MODE_READ):
    the node's own user and root may, a process of another user may not, whatever its group.
    So a same-machine client of the node's user maps the node's segments and index as before,
    and a --group client (another user) cannot: segment_open fails with EACCES, libkvpool's
    fast path does not start (kvpc_fast_path_open needs every segment of the node's own), and
    that client uses the socket path, which is what any client off the machine uses. We chose
    that over handing the descriptors to group members (SCM_RIGHTS over a unix socket checked
    with SO_PEERCRED): that is a second listener, a second authorisation path and a second
    client protocol to get right, for a speed-up; while the old way, group-shared /dev/shm
    objects, let any group member kill the node with one ftruncate. The kernel's check is the
    one we already rely on for client memory. (A client in another pid namespace finds another
    process, or none, under the node's pid: the identity the node lists with each segment,
    device and inode, makes it refuse what it opened, and it too uses the socket.)

    --segment-dir files (segment_new_file) are regular files, which cannot be sealed: they
    survive the process so that a restarted node finds its objects. They are mode 0600 in a
    directory of mode 0700 and never shared with --group, so only the node's user (or root)
    can shrink one, which is theirs to do (and the node's to suffer). Group clients get no fast
    path into them. segment_new (shm_open) remains for tests and tools that need an object
    that is NOT sealed; the node no longer makes one.

    COMMITTED PAGES
    tmpfs allocates pages on first touch, so a write into a page that memory can no longer
    supply faults with SIGBUS (or wakes the OOM killer). A node's segment therefore has all
    its pages committed at creation (posix_fallocate): too little memory fails kvpoold at
    start, never a write later. A memfd lives on the kernel's internal tmpfs, which has no
    size limit, so segment_new_sealed refuses a size larger than the machine's memory rather
    than fallocate its way into the OOM killer. Locking (segment_lock: mlock) additionally
    keeps the pages out of swap.
    Committed is not yet mapped: tmpfs zeroes a page and maps it on the first touch, which
    costs a page fault and a clear of 4 KiB, more than the copy of a value into it (a node's
    first 2 MiB put took half again as long as one into pages touched before).
    segment_prefault_start has a thread of its own fault every page in, at the lowest
    priority, right after the node starts (MADV_POPULATE_WRITE: the kernel's fault, without a
    write, so it can run while values are being copied in). It goes in steps of 2 MiB: a step
    holds the process's memory-map lock for reading, and a thread that waits to map or unmap
    anything (libzmq's and malloc's large buffers) waits for the step. So the thread is nice
    19 under SCHED_BATCH, which the scheduler still runs every few milliseconds, and not
    SCHED_IDLE, which a busy machine may keep off its cores, lock held, for much longer.
    MADV_HUGEPAGE is advisory: tmpfs (the internal one of memfds too) honours it only when the
    administrator enabled shmem huge pages ("advise" in
    /sys/kernel/mm/transparent_hugepage/shmem_enabled).

    STALE NAMES
    Daemons before the memfds left /dev/shm/kvpool-* objects when they died; the cleaner
    (segment_remove_stale) still removes those, and the objects segment_new makes. Which are
    left by dead processes is judged by a lock, not by pid: a pid means nothing to a daemon in
    another pid namespace sharing /dev/shm (it would see a live daemon's pid as dead and
    unlink its segments). The creator holds flock(LOCK_SH) on the object for its whole life
    (segment_hold: the descriptor stays open until destroy); segment_remove_stale unlinks an
    object only when it can take flock(LOCK_EX|LOCK_NB) on it, so only when nobody holds it.
    flock belongs to the open file, which every namespace sharing the file system sees. The
    creator checks after locking that the name still names its object, so a cleaner that
    slipped in between create and lock costs a retry, never a segment.

    Threads: a segment_t is used by one thread at a time, but for its prefault thread, which
    reads only base and size and its stop flag; the mapped bytes are shared and carry no
    ordering of their own (the protocol above orders writes and reads).
*/
#include "shm/segment.h"

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

//  Longest name: shm_open names ("/name"), "/proc/<pid>/fd/<fd>" and the paths of a
//  --segment-dir's files all fit.
#define SEGMENT_NAME_MAX 255

struct _segment_t {
    char name[SEGMENT_NAME_MAX + 1];
    void *base;
    size_t size;
    bool owner;  //  created here: unlink on destroy
    bool locked; //  mlock succeeded
    int fd;      //  a sealed memfd this process made, held open for its name; else -1
    int lock_fd; //  a created /dev/shm object, held open with flock(LOCK_SH); else -1
    int file_fd; //  a file made by segment_new_file, held open for segment_commit; else -1
    dev_t dev;   //  the object's identity, whatever name it was opened by
    ino_t ino;
    //  segment_prefault_start's thread, joined by destroy.
    pthread_t prefault;
    bool prefaulting;
    _Atomic bool prefault_stop;
    segment_prefault_fn *prefault_done;
    void *prefault_arg;
};

//  "/proc/<digits>/fd/<digits>" (pid may be "self" only for a process naming its own).
bool
segment_name_is_fd (const char *name)
{
    if (!name || strncmp (name, "/proc/", 6) != 0)
        return false;
    const char *c = name + 6;
    if (!(*c >= '0' && *c <= '9'))
        return false;
    while (*c >= '0' && *c <= '9')
        c++;
    if (strncmp (c, "/fd/", 4) != 0)
        return false;
    c += 4;
    if (!(*c >= '0' && *c <= '9'))
        return false;
    while (*c >= '0' && *c <= '9')
        c++;
    return *c == 0 && strlen (name) <= SEGMENT_NAME_MAX;
}

bool
segment_name_is_path (const char *name)
{
    if (!name || name[0] != '/' || segment_name_is_fd (name) || strncmp (name, "/proc/", 6) == 0)
        return false;
    size_t length = strlen (name);
    return length <= SEGMENT_NAME_MAX && strchr (name + 1, '/') != NULL && name[length - 1] != '/';
}

static bool
s_name_valid (const char *name)
{
    if (!name || name[0] != '/')
        return false;
    if (segment_name_is_fd (name) || segment_name_is_path (name))
        return true;
    size_t length = strlen (name);
    if (length < 2 || length > SEGMENT_NAME_MAX)
        return false;
    return strchr (name + 1, '/') == NULL;
}

//  Opens an existing object by either form of name.
static int
s_open_existing (const char *name, int flags)
{
    if (segment_name_is_fd (name))
        return open (name, flags | O_CLOEXEC);
    if (segment_name_is_path (name))
        return open (name, flags | O_CLOEXEC | O_NOFOLLOW);
    return shm_open (name, flags, 0);
}

//  Closes fd (and unlinks name when given) without losing the errno of the failure that
//  brought us here.
static void
s_cleanup (int fd, const char *unlink_name)
{
    int saved = errno;
    if (fd >= 0)
        close (fd);
    if (unlink_name)
        shm_unlink (unlink_name);
    errno = saved;
}

static segment_t *
s_segment_map (const char *name, int fd, size_t size, bool owner)
{
    void *base = mmap (NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return NULL;
    segment_t *self = (segment_t *) calloc (1, sizeof (segment_t));
    if (!self) {
        munmap (base, size);
        errno = ENOMEM;
        return NULL;
    }
    //  Name length was checked by s_name_valid, so this cannot truncate.
    snprintf (self->name, sizeof self->name, "%s", name);
    self->base = base;
    self->size = size;
    self->owner = owner;
    self->fd = -1;
    self->lock_fd = -1;
    self->file_fd = -1;
    struct stat st;
    if (fstat (fd, &st) == 0) {
        self->dev = st.st_dev;
        self->ino = st.st_ino;
    }
#ifdef MADV_HUGEPAGE
    //  Fewer TLB misses on multi-MiB copies where shmem THP is enabled; a no-op otherwise.
    if (size >= 2 * 1024 * 1024)
        madvise (base, size, MADV_HUGEPAGE);
#endif
    return self;
}

segment_t *
segment_new (const char *name, size_t size, bool lock)
{
    if (!s_name_valid (name) || segment_name_is_path (name) || segment_name_is_fd (name)
        || size == 0 || size > (size_t) INT64_MAX) {
        errno = EINVAL;
        return NULL;
    }
    int fd = segment_create_held (name);
    if (fd == -1)
        return NULL;
    //  Refuse what tmpfs cannot hold now, rather than SIGBUS on a later write. f_blocks is 0
    //  on a tmpfs mounted without a size limit.
    struct statvfs fs;
    if (fstatvfs (fd, &fs) == 0 && fs.f_blocks > 0
        && (uint64_t) fs.f_bavail * fs.f_frsize < (uint64_t) size) {
        errno = ENOSPC;
        s_cleanup (fd, name);
        return NULL;
    }
    if (ftruncate (fd, (off_t) size) == -1) {
        s_cleanup (fd, name);
        return NULL;
    }
    //  Commit every page now: a write into a hole that a full /dev/shm can no longer fill
    //  would kill the node with SIGBUS later.
    int rc = posix_fallocate (fd, 0, (off_t) size);
    if (rc != 0) {
        errno = rc;
        s_cleanup (fd, name);
        return NULL;
    }
    segment_t *self = s_segment_map (name, fd, size, true);
    if (!self) {
        s_cleanup (fd, name);
        return NULL;
    }
    self->lock_fd = fd; //  the flock lives as long as this descriptor
    if (lock)
        //  Often refused by RLIMIT_MEMLOCK; the caller sees it through segment_locked.
        self->locked = mlock (self->base, self->size) == 0;
    return self;
}

segment_t *
segment_open (const char *name, size_t size)
{
    if (!s_name_valid (name) || size == 0 || size > (size_t) INT64_MAX) {
        errno = EINVAL;
        return NULL;
    }
    int fd = s_open_existing (name, O_RDWR);
    if (fd == -1)
        return NULL;
    struct stat st;
    if (fstat (fd, &st) == -1) {
        s_cleanup (fd, NULL);
        return NULL;
    }
    //  Mapping past the end of the object would SIGBUS on first touch.
    if (st.st_size < 0 || (uint64_t) st.st_size < (uint64_t) size) {
        errno = EINVAL;
        s_cleanup (fd, NULL);
        return NULL;
    }
    segment_t *self = s_segment_map (name, fd, size, false);
    if (!self) {
        s_cleanup (fd, NULL);
        return NULL;
    }
    close (fd);
    return self;
}

segment_t *
segment_mount (const char *name, size_t size, char *reason, size_t reason_size)
{
    char unused[1];
    if (!reason) {
        reason = unused;
        reason_size = sizeof unused;
    }
    if (!s_name_valid (name) || segment_name_is_path (name) || size == 0
        || size > (size_t) INT64_MAX) {
        snprintf (reason, reason_size,
                  "mount needs a name (/proc/<pid>/fd/<fd> of a sealed memfd) and a size");
        errno = EINVAL;
        return NULL;
    }
    int fd = s_open_existing (name, O_RDWR);
    if (fd == -1) {
        snprintf (reason, reason_size, "cannot open %s: %s", name, strerror (errno));
        return NULL;
    }
    //  The seal is checked on the descriptor we map, so it can't be swapped in between.
    int seals = fcntl (fd, F_GET_SEALS);
    if (seals == -1 || !(seals & F_SEAL_SHRINK)) {
        snprintf (reason, reason_size,
                  "%s is not a memfd sealed against shrinking (F_SEAL_SHRINK): the node only "
                  "keeps data in memory that cannot be cut short under it",
                  name);
        s_cleanup (fd, NULL);
        errno = EPERM;
        return NULL;
    }
    struct stat st;
    if (fstat (fd, &st) == -1 || st.st_size < 0 || (uint64_t) st.st_size < (uint64_t) size) {
        snprintf (reason, reason_size, "%s holds %lld bytes, fewer than the %zu asked for", name,
                  (long long) st.st_size, size);
        s_cleanup (fd, NULL);
        errno = EINVAL;
        return NULL;
    }
    //  Every page must exist already: a sparse object would have the node allocate memory on
    //  first touch, where a lack of it is a SIGBUS or the OOM killer (a sealed 1 TiB memfd
    //  costs its maker nothing). segment_new_sealed commits its pages.
    uint64_t ram = (uint64_t) sysconf (_SC_PHYS_PAGES) * (uint64_t) sysconf (_SC_PAGESIZE);
    if (ram > 0 && (uint64_t) size > ram) {
        snprintf (reason, reason_size, "%s: %zu bytes is more than this machine's memory (%llu)",
                  name, size, (unsigned long long) ram);
        s_cleanup (fd, NULL);
        errno = EINVAL;
        return NULL;
    }
    if ((uint64_t) st.st_blocks * 512 < (uint64_t) size) {
        snprintf (reason, reason_size,
                  "%s has %llu of its %zu bytes committed: allocate every page first "
                  "(posix_fallocate) so the node never faults memory in",
                  name, (unsigned long long) st.st_blocks * 512, size);
        s_cleanup (fd, NULL);
        errno = EINVAL;
        return NULL;
    }
    segment_t *self = s_segment_map (name, fd, size, false);
    if (!self) {
        snprintf (reason, reason_size, "cannot map %s: %s", name, strerror (errno));
        s_cleanup (fd, NULL);
        return NULL;
    }
    close (fd);
    return self;
}

segment_t *
segment_new_sealed (size_t size, const char *tag)
{
    if (size == 0 || size > (size_t) INT64_MAX) {
        errno = EINVAL;
        return NULL;
    }
    //  The internal tmpfs of memfds has no size limit: more than the machine's memory would
    //  not fail posix_fallocate but wake the OOM killer.
    uint64_t ram = (uint64_t) sysconf (_SC_PHYS_PAGES) * (uint64_t) sysconf (_SC_PAGESIZE);
    if (ram > 0 && (uint64_t) size > ram) {
        errno = ENOMEM;
        return NULL;
    }
    int fd = memfd_create (tag && *tag ? tag : "kvpool-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd == -1)
        return NULL;
    //  Commit the pages now, so a lack of memory fails here and not on a later write.
    int rc = ftruncate (fd, (off_t) size);
    if (rc == 0)
        rc = posix_fallocate (fd, 0, (off_t) size) == 0 ? 0 : -1;
    if (rc == 0)
        rc = fcntl (fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    if (rc == -1) {
        s_cleanup (fd, NULL);
        return NULL;
    }
    char name[SEGMENT_NAME_MAX + 1];
    snprintf (name, sizeof name, "/proc/%ld/fd/%d", (long) getpid (), fd);
    segment_t *self = s_segment_map (name, fd, size, false);
    if (!self) {
        s_cleanup (fd, NULL);
        return NULL;
    }
    self->fd = fd;
    return self;
}

bool
segment_lock (segment_t *self)
{
    assert (self);
    if (!self->locked)
        self->locked = mlock (self->base, self->size) == 0;
    return self->locked;
}

void
segment_destroy (segment_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    segment_t *self = *self_p;
    if (self->prefaulting) {
        atomic_store (&self->prefault_stop, true);
        pthread_join (self->prefault, NULL);
    }
    munmap (self->base, self->size);
    if (self->owner)
        shm_unlink (self->name);
    if (self->fd >= 0)
        close (self->fd);
    if (self->lock_fd >= 0)
        close (self->lock_fd);
    if (self->file_fd >= 0)
        close (self->file_fd);
    free (self);
    *self_p = NULL;
}

segment_t *
segment_new_file (const char *path, size_t size, bool lock, bool commit)
{
    if (!segment_name_is_path (path) || size == 0 || size > (size_t) INT64_MAX) {
        errno = EINVAL;
        return NULL;
    }
    int fd = open (path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd == -1)
        return NULL;
    if (ftruncate (fd, (off_t) size) == -1)
        goto failed;
    if (commit) {
        int rc = posix_fallocate (fd, 0, (off_t) size);
        if (rc != 0) {
            errno = rc;
            goto failed;
        }
    }
    segment_t *self = s_segment_map (path, fd, size, false);
    if (!self)
        goto failed;
    self->file_fd = fd;
    if (lock)
        self->locked = mlock (self->base, self->size) == 0;
    return self;
failed:
    s_cleanup (fd, NULL);
    unlink (path);
    return NULL;
}

int
segment_commit (segment_t *self)
{
    assert (self);
    if (self->file_fd < 0) {
        errno = EINVAL;
        return -1;
    }
    int rc = posix_fallocate (self->file_fd, 0, (off_t) self->size);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return 0;
}

int
segment_release (segment_t *self, uint64_t offset, uint64_t length)
{
    assert (self);
    long page = sysconf (_SC_PAGESIZE);
    if (offset > self->size || length > self->size - offset) {
        errno = EINVAL;
        return -1;
    }
    //  Only whole pages inside the range: the pages at its ends may hold other bytes.
    uint64_t first = (offset + (uint64_t) page - 1) / (uint64_t) page * (uint64_t) page;
    uint64_t end = (offset + length) / (uint64_t) page * (uint64_t) page;
    if (end <= first)
        return 0;
    return madvise ((char *) self->base + first, end - first, MADV_REMOVE);
}

void *
segment_base (segment_t *self)
{
    assert (self);
    return self->base;
}

size_t
segment_size (segment_t *self)
{
    assert (self);
    return self->size;
}

const char *
segment_name (segment_t *self)
{
    assert (self);
    return self->name;
}

bool
segment_same_object (segment_t *self, segment_t *other)
{
    assert (self && other);
    return self->dev == other->dev && self->ino == other->ino;
}

void
segment_identity (segment_t *self, uint64_t *device, uint64_t *inode)
{
    assert (self && device && inode);
    *device = (uint64_t) self->dev;
    *inode = (uint64_t) self->ino;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 //  Linux 5.14
#endif
//  Pages faulted in per call: how long the call holds the memory-map lock, and a stop waits.
#define PREFAULT_STEP (2ULL << 20)

static void *
s_prefault_run (void *arg)
{
    segment_t *self = (segment_t *) arg;
    //  The lowest priority that still gets a core every few milliseconds (see the top).
    struct sched_param param = {0};
    pthread_setschedparam (pthread_self (), SCHED_BATCH, &param);
    setpriority (PRIO_PROCESS, (id_t) syscall (SYS_gettid), 19);
    pthread_setname_np (pthread_self (), "kvp-prefault");
    int error = 0;
    size_t done = 0;
    while (done < self->size && !atomic_load (&self->prefault_stop)) {
        size_t step = self->size - done < PREFAULT_STEP ? self->size - done : PREFAULT_STEP;
        if (madvise ((char *) self->base + done, step, MADV_POPULATE_WRITE) != 0) {
            if (errno == EINTR)
                continue;
            error = errno;
            break;
        }
        done += step;
    }
    if (self->prefault_done)
        self->prefault_done (self, done, error, self->prefault_arg);
    return NULL;
}

int
segment_prefault_start (segment_t *self, segment_prefault_fn *done, void *arg)
{
    assert (self);
    if (self->prefaulting) {
        errno = EALREADY;
        return -1;
    }
    self->prefault_done = done;
    self->prefault_arg = arg;
    atomic_store (&self->prefault_stop, false);
    int rc = pthread_create (&self->prefault, NULL, s_prefault_run, self);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    self->prefaulting = true;
    return 0;
}

bool
segment_locked (segment_t *self)
{
    assert (self);
    return self->locked;
}

static char s_process_tag[9];

static void
s_process_tag_draw (void)
{
    uint32_t bits = 0;
    if (getrandom (&bits, sizeof bits, 0) != (ssize_t) sizeof bits) {
        //  No entropy yet (early boot): the clock still tells two processes apart.
        struct timespec now;
        clock_gettime (CLOCK_REALTIME, &now);
        bits = (uint32_t) now.tv_nsec ^ (uint32_t) now.tv_sec ^ (uint32_t) getpid ();
    }
    snprintf (s_process_tag, sizeof s_process_tag, "%08x", bits);
}

const char *
segment_process_tag (void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once (&once, s_process_tag_draw);
    return s_process_tag;
}

void
segment_make_name (char *buf, size_t buf_size, const char *tag, unsigned index)
{
    assert (buf && buf_size > 0);
    snprintf (buf, buf_size, "/kvpool-%ld-%s-%s-%u", (long) getpid (), segment_process_tag (),
              tag ? tag : "", index);
    //  A '/' in the tag would make the name invalid for shm_open.
    for (char *c = buf + 1; *c; c++)
        if (*c == '/')
            *c = '_';
}

int
segment_create_held (const char *name)
{
    //  A cleaner in another daemon may unlink the new name before our lock is on it; then
    //  the name is free again and we make it anew.
    for (int attempt = 0;; attempt++) {
        int fd = shm_open (name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd == -1)
            return -1;
        if (segment_hold (fd, name) == 0)
            return fd;
        int held = errno;
        close (fd);
        if (held != ENOENT || attempt == 3) {
            errno = held == ENOENT ? EAGAIN : held;
            return -1;
        }
    }
}

int
segment_hold (int fd, const char *name)
{
    if (fd < 0 || !s_name_valid (name) || segment_name_is_fd (name)) {
        errno = EINVAL;
        return -1;
    }
    int rc;
    do
        rc = flock (fd, LOCK_SH);
    while (rc == -1 && errno == EINTR);
    if (rc == -1)
        return -1;
    char path[SEGMENT_NAME_MAX + 16];
    snprintf (path, sizeof path, "/dev/shm%s", name);
    struct stat by_fd, by_name;
    if (fstat (fd, &by_fd) == -1 || stat (path, &by_name) == -1)
        return -1; //  ENOENT: unlinked before the lock was on it
    if (by_fd.st_dev != by_name.st_dev || by_fd.st_ino != by_name.st_ino) {
        errno = EEXIST; //  and made again by someone else
        return -1;
    }
    return 0;
}

//  Whether a /dev/shm entry has the form of a name kvpool makes: kvpool-<pid>-... or
//  kvpool-client-<pid>-... (anything else there is not ours to judge).
static bool
s_stale_candidate (const char *entry, long *pid)
{
    const char *rest = entry;
    if (strncmp (rest, "kvpool-", 7) != 0)
        return false;
    rest += 7;
    if (strncmp (rest, "client-", 7) == 0)
        rest += 7;
    char *end;
    *pid = strtol (rest, &end, 10);
    return end != rest && *end == '-' && *pid > 0;
}

int
segment_remove_stale (void)
{
    DIR *dir = opendir ("/dev/shm");
    if (!dir)
        return 0;
    int removed = 0;
    struct dirent *entry;
    while ((entry = readdir (dir))) {
        long pid;
        if (!s_stale_candidate (entry->d_name, &pid) || strlen (entry->d_name) > 250)
            continue;
        //  A pid alive in our own namespace is never touched (a daemon from before the
        //  lock holds none); a dead-looking pid proves nothing, the lock decides.
        if (kill ((pid_t) pid, 0) == 0 || errno == EPERM)
            continue;
        char path[300], name[300];
        snprintf (path, sizeof path, "/dev/shm/%s", entry->d_name);
        snprintf (name, sizeof name, "/%s", entry->d_name);
        int fd = open (path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd == -1)
            continue; //  not ours to open (another user's): not ours to remove either
        struct stat by_fd, by_name;
        //  Held by a live creator in any namespace: the exclusive lock is refused.
        if (flock (fd, LOCK_EX | LOCK_NB) == 0 && fstat (fd, &by_fd) == 0 && S_ISREG (by_fd.st_mode)
            && stat (path, &by_name) == 0 && by_fd.st_dev == by_name.st_dev
            && by_fd.st_ino == by_name.st_ino && shm_unlink (name) == 0)
            removed++;
        close (fd);
    }
    closedir (dir);
    return removed;
}

//  --------------------------------------------------------------------------
//  Self test

static bool
s_name_exists (const char *name)
{
    int fd = shm_open (name, O_RDONLY, 0);
    if (fd == -1)
        return false;
    close (fd);
    return true;
}

typedef struct {
    _Atomic bool finished;
    size_t bytes;
    int error;
} prefault_result_t;

static void
s_prefault_done (segment_t *self, size_t bytes, int error, void *arg)
{
    (void) self;
    prefault_result_t *result = (prefault_result_t *) arg;
    result->bytes = bytes;
    result->error = error;
    atomic_store (&result->finished, true);
}

//  Bytes of this process's mapping at base that are mapped in (Rss in /proc/self/smaps).
static size_t
s_mapped_bytes (const void *base)
{
    FILE *smaps = fopen ("/proc/self/smaps", "r");
    assert (smaps);
    char line[512], start[32];
    snprintf (start, sizeof start, "%08lx-", (unsigned long) (uintptr_t) base);
    bool in = false;
    size_t kib = 0;
    while (fgets (line, sizeof line, smaps)) {
        if (!in)
            in = strncmp (line, start, strlen (start)) == 0;
        else if (sscanf (line, "Rss: %zu kB", &kib) == 1)
            break;
    }
    fclose (smaps);
    assert (in);
    return kib * 1024;
}

void
segment_test (bool verbose)
{
    if (verbose)
        printf ("\n * segment: ");

    char name[64];
    segment_make_name (name, sizeof name, "st/a", 7);
    assert (name[0] == '/' && strchr (name + 1, '/') == NULL);
    assert (strstr (name, "-st_a-7") != NULL);

    const size_t size = 4 * 1024 * 1024 + 4096;
    segment_t *seg = segment_new (name, size, false);
    assert (seg);
    assert (segment_size (seg) == size);
    assert (strcmp (segment_name (seg), name) == 0);
    assert (!segment_locked (seg));
    assert (s_name_exists (name));
    unsigned char *a = (unsigned char *) segment_base (seg);
    for (size_t i = 0; i < size; i += 4096)
        a[i] = (unsigned char) (i / 4096 + 1);
    a[size - 1] = 0xA5;

    //  The name is taken: a second create fails, the object is untouched.
    errno = 0;
    segment_t *dup = segment_new (name, size, false);
    assert (dup == NULL && errno == EEXIST);

    //  A second mapping by name sees the same bytes, both ways.
    segment_t *view = segment_open (name, size);
    assert (view);
    unsigned char *b = (unsigned char *) segment_base (view);
    assert (b != a);
    for (size_t i = 0; i < size; i += 4096)
        assert (b[i] == (unsigned char) (i / 4096 + 1));
    assert (b[size - 1] == 0xA5);
    b[12345] = 0x5A;
    assert (a[12345] == 0x5A);

    //  Another process maps it by name and writes; the creator sees the write.
    pid_t pid = fork ();
    assert (pid >= 0);
    if (pid == 0) {
        segment_t *child = segment_open (name, size);
        if (!child)
            _exit (1);
        unsigned char *c = (unsigned char *) segment_base (child);
        int rc = c[size - 1] == 0xA5 ? 0 : 2;
        c[size - 2] = 0x3C;
        segment_destroy (&child);
        _exit (rc);
    }
    int status = 0;
    pid_t waited = waitpid (pid, &status, 0);
    assert (waited == pid);
    assert (WIFEXITED (status) && WEXITSTATUS (status) == 0);
    assert (a[size - 2] == 0x3C);

    //  A smaller view is fine; a view larger than the object is refused.
    segment_t *small = segment_open (name, 4096);
    assert (small);
    assert (((unsigned char *) segment_base (small))[0] == 1);
    segment_destroy (&small);
    assert (small == NULL);
    errno = 0;
    segment_t *big = segment_open (name, size + 1);
    assert (big == NULL && errno == EINVAL);

    //  Destroying a view never unlinks; destroying the creator does.
    segment_destroy (&view);
    assert (view == NULL);
    assert (s_name_exists (name));
    segment_destroy (&seg);
    assert (seg == NULL);
    assert (!s_name_exists (name));
    errno = 0;
    segment_t *gone = segment_open (name, 4096);
    assert (gone == NULL && errno == ENOENT);
    segment_destroy (&seg); //  NULL is fine

    //  Bad names and sizes fail cleanly.
    char too_long[SEGMENT_NAME_MAX + 2];
    too_long[0] = '/';
    memset (too_long + 1, 'x', SEGMENT_NAME_MAX);
    too_long[SEGMENT_NAME_MAX + 1] = 0;
    const char *bad[] = {NULL, "", "/", "noslash", "/a/b", too_long};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        errno = 0;
        segment_t *created = segment_new (bad[i], 4096, false);
        assert (created == NULL && errno == EINVAL);
        errno = 0;
        segment_t *opened = segment_open (bad[i], 4096);
        //  "/a/b" is a file's path (a --segment-dir's), which does not exist.
        assert (opened == NULL && errno == (i == 4 ? ENOENT : EINVAL));
    }
    //  A file segment: kept after destroy, opened by its path, pages given back on demand.
    char dir_path[] = "/tmp/kvpool-segtest-XXXXXX";
    assert (mkdtemp (dir_path));
    char file_path[300];
    snprintf (file_path, sizeof file_path, "%s/segment-0", dir_path);
    assert (segment_name_is_path (file_path) && !segment_name_is_path ("/kvpool-1"));
    assert (!segment_name_is_path ("/proc/1/fd/3") && !segment_name_is_path ("/a/"));
    segment_t *file_seg = segment_new_file (file_path, 1 << 20, false, false);
    assert (file_seg && strcmp (segment_name (file_seg), file_path) == 0);
    errno = 0;
    assert (segment_new_file (file_path, 1 << 20, false, false) == NULL && errno == EEXIST);
    memset (segment_base (file_seg), 0x6B, 1 << 20);
    assert (segment_commit (file_seg) == 0);
    segment_t *file_view = segment_open (file_path, 1 << 20);
    assert (file_view && segment_same_object (file_view, file_seg));
    assert (((unsigned char *) segment_base (file_view))[4097] == 0x6B);
    //  Releasing a range zeroes only the whole pages inside it.
    assert (segment_release (file_seg, 100, 3 * 4096) == 0);
    assert (((unsigned char *) segment_base (file_view))[4095] == 0x6B);
    assert (((unsigned char *) segment_base (file_view))[4096] == 0);
    assert (((unsigned char *) segment_base (file_view))[3 * 4096 + 99] == 0x6B);
    assert (segment_release (file_seg, 1 << 20, 1) == -1);
    char reason_path[256];
    assert (!segment_mount (file_path, 4096, reason_path, sizeof reason_path));
    segment_destroy (&file_view);
    segment_destroy (&file_seg);
    struct stat kept;
    assert (stat (file_path, &kept) == 0 && kept.st_size == 1 << 20);
    file_view = segment_open (file_path, 1 << 20);
    assert (file_view && ((unsigned char *) segment_base (file_view))[0] == 0x6B);
    segment_destroy (&file_view);
    unlink (file_path);
    rmdir (dir_path);
    too_long[SEGMENT_NAME_MAX] = 0; //  exactly the limit is accepted
    segment_t *edge = segment_new (too_long, 4096, false);
    assert (edge);
    segment_destroy (&edge);
    assert (!s_name_exists (too_long));
    errno = 0;
    segment_t *empty = segment_new (name, 0, false);
    assert (empty == NULL && errno == EINVAL);
    assert (!s_name_exists (name));
    //  More than tmpfs can hold is refused up front and leaves no name behind.
    errno = 0;
    segment_t *huge = segment_new (name, (size_t) 1 << 60, false);
    assert (huge == NULL);
    assert (errno == ENOSPC || errno == EFBIG || errno == EINVAL || errno == ENOMEM);
    assert (!s_name_exists (name));

    //  Locking is best effort: either way the segment works.
    segment_make_name (name, sizeof name, "st-lock", 0);
    segment_t *locked = segment_new (name, 64 * 1024, true);
    assert (locked);
    memset (segment_base (locked), 0x11, 64 * 1024);
    if (verbose)
        printf ("lock %s; ", segment_locked (locked) ? "ok" : "refused");
    segment_destroy (&locked);
    assert (!s_name_exists (name));

    //  Prefault: every page of the mapping ends up mapped, the bytes already written stay.
    segment_make_name (name, sizeof name, "st-prefault", 0);
    const size_t fault_size = 8 * 1024 * 1024 + 4096;
    segment_t *faulted = segment_new (name, fault_size, false);
    assert (faulted);
    unsigned char *fb = (unsigned char *) segment_base (faulted);
    fb[4096] = 0x77;
    assert (s_mapped_bytes (fb) < fault_size / 2);
    prefault_result_t result = {0};
    int rc = segment_prefault_start (faulted, s_prefault_done, &result);
    assert (rc == 0);
    assert (segment_prefault_start (faulted, NULL, NULL) == -1 && errno == EALREADY);
    for (int i = 0; i < 60000 && !atomic_load (&result.finished); i++)
        usleep (1000);
    assert (atomic_load (&result.finished));
    if (result.error != EINVAL) { //  EINVAL: a kernel before 5.14 does not have it
        assert (result.error == 0 && result.bytes == fault_size);
        assert (s_mapped_bytes (fb) == fault_size);
    }
    assert (fb[4096] == 0x77 && fb[0] == 0 && fb[fault_size - 1] == 0);
    segment_destroy (&faulted);
    //  A segment destroyed while its pages are being faulted in stops the thread first.
    segment_t *stopped = segment_new (name, 64 * 1024 * 1024, false);
    assert (stopped);
    prefault_result_t early = {0};
    assert (segment_prefault_start (stopped, s_prefault_done, &early) == 0);
    segment_destroy (&stopped);
    assert (atomic_load (&early.finished)); //  joined: its callback has run
    assert (!s_name_exists (name));

    //  Contributed memory: a node mounts only what cannot shrink under it.
    segment_make_name (name, sizeof name, "st-plain", 0);
    segment_t *plain = segment_new (name, 64 * 1024, false);
    assert (plain);
    char reason[256] = "";
    errno = 0;
    segment_t *refused = segment_mount (name, 64 * 1024, reason, sizeof reason);
    assert (refused == NULL && errno == EPERM && strstr (reason, "F_SEAL_SHRINK"));
    segment_destroy (&plain);
    errno = 0;
    refused = segment_mount (name, 4096, reason, sizeof reason);
    assert (refused == NULL && errno == ENOENT && strstr (reason, "cannot open"));
    refused = segment_mount ("/proc/1/fd/x", 4096, reason, sizeof reason);
    assert (refused == NULL && errno == EINVAL);
    assert (segment_name_is_fd ("/proc/12/fd/3") && !segment_name_is_fd ("/proc/12/fd/"));
    assert (!segment_name_is_fd ("/proc/self/fd/3") && !segment_name_is_fd ("/kvpool-1"));

    //  An unsealed memfd is refused as well.
    int loose = memfd_create ("st-loose", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert (loose >= 0 && ftruncate (loose, 65536) == 0);
    char loose_name[64];
    snprintf (loose_name, sizeof loose_name, "/proc/%d/fd/%d", (int) getpid (), loose);
    errno = 0;
    refused = segment_mount (loose_name, 65536, reason, sizeof reason);
    assert (refused == NULL && errno == EPERM);
    close (loose);

    //  A sealed but sparse memfd is refused: its pages would be the node's to fault in. So
    //  is one larger than the machine's memory, however it was made.
    int sparse = memfd_create ("st-sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert (sparse >= 0);
    assert (ftruncate (sparse, (off_t) 1 << 40) == 0);
    assert (fcntl (sparse, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    char sparse_name[64];
    snprintf (sparse_name, sizeof sparse_name, "/proc/%d/fd/%d", (int) getpid (), sparse);
    errno = 0;
    refused = segment_mount (sparse_name, (size_t) 1 << 40, reason, sizeof reason);
    assert (refused == NULL && errno == EINVAL && strstr (reason, "more than this machine"));
    errno = 0;
    refused = segment_mount (sparse_name, 8 << 20, reason, sizeof reason);
    assert (refused == NULL && errno == EINVAL && strstr (reason, "committed"));
    close (sparse);
    //  Half committed is not enough either.
    sparse = memfd_create ("st-half", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert (sparse >= 0 && ftruncate (sparse, 1 << 20) == 0);
    assert (posix_fallocate (sparse, 0, 1 << 19) == 0);
    assert (fcntl (sparse, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
    snprintf (sparse_name, sizeof sparse_name, "/proc/%d/fd/%d", (int) getpid (), sparse);
    refused = segment_mount (sparse_name, 1 << 20, reason, sizeof reason);
    assert (refused == NULL && strstr (reason, "524288 of its 1048576 bytes committed"));
    close (sparse);

    //  A node's own segment: what a client of its user opens by name it cannot shrink or grow,
    //  and the node's pages stay (a truncation here would kill the node with SIGBUS on the
    //  touch below).
    segment_t *own = segment_new_sealed (2 << 20, "st-own");
    assert (own && segment_name_is_fd (segment_name (own)));
    if (verbose)
        printf ("own segment lock %s; ", segment_lock (own) ? "ok" : "refused");
    assert (segment_lock (own) == segment_locked (own));
    memset (segment_base (own), 0x2D, 2 << 20);
    pid = fork ();
    assert (pid >= 0);
    if (pid == 0) {
        int attacker = open (segment_name (own), O_RDWR | O_CLOEXEC);
        if (attacker == -1)
            _exit (1);
        errno = 0;
        bool shrunk = ftruncate (attacker, 4096) == 0 || errno != EPERM;
        errno = 0;
        bool grown = ftruncate (attacker, 4 << 20) == 0 || errno != EPERM;
        bool resealed = fcntl (attacker, F_ADD_SEALS, F_SEAL_WRITE) == 0;
        _exit (shrunk || grown || resealed ? 2 : 0);
    }
    assert (waitpid (pid, &status, 0) == pid);
    assert (WIFEXITED (status) && WEXITSTATUS (status) == 0);
    assert (((unsigned char *) segment_base (own))[(2 << 20) - 1] == 0x2D);
    ((unsigned char *) segment_base (own))[(2 << 20) - 1] = 0x2E;
    segment_destroy (&own);
    //  More than the machine's memory is refused up front (an unlimited tmpfs would let
    //  posix_fallocate run into the OOM killer).
    errno = 0;
    assert (segment_new_sealed ((size_t) 1 << 62, "st-huge") == NULL && errno == ENOMEM);

    const size_t sealed_size = 1 << 20;
    segment_t *sealed = segment_new_sealed (sealed_size, "st-sealed");
    assert (sealed && segment_name_is_fd (segment_name (sealed)));
    assert (segment_size (sealed) == sealed_size);
    memset (segment_base (sealed), 0x3C, sealed_size);
    //  The seals hold against its own creator.
    int fd = -1;
    sscanf (segment_name (sealed), "/proc/%*d/fd/%d", &fd);
    assert (fd >= 0);
    errno = 0;
    assert (ftruncate (fd, 4096) == -1 && errno == EPERM);
    assert (ftruncate (fd, sealed_size * 2) == -1 && errno == EPERM);
    //  Another process (the node) mounts it by name, sees the bytes and can write them;
    //  asking for more than it holds fails.
    pid = fork ();
    assert (pid >= 0);
    if (pid == 0) {
        char why[256];
        segment_t *mounted = segment_mount (segment_name (sealed), sealed_size, why, sizeof why);
        segment_t *too_big =
            segment_mount (segment_name (sealed), sealed_size + 1, why, sizeof why);
        if (!mounted || too_big)
            _exit (1);
        unsigned char *m = (unsigned char *) segment_base (mounted);
        int ok = m[0] == 0x3C && m[sealed_size - 1] == 0x3C;
        m[100] = 0x77;
        segment_destroy (&mounted);
        _exit (ok ? 0 : 2);
    }
    status = 0;
    assert (waitpid (pid, &status, 0) == pid);
    assert (WIFEXITED (status) && WEXITSTATUS (status) == 0);
    assert (((unsigned char *) segment_base (sealed))[100] == 0x77);
    //  The same object is recognised under any name.
    segment_t *again = segment_mount (segment_name (sealed), sealed_size, NULL, 0);
    assert (again && segment_same_object (again, sealed));
    segment_make_name (name, sizeof name, "st-other", 0);
    segment_t *other = segment_new (name, 4096, false);
    assert (other && !segment_same_object (other, sealed));
    segment_destroy (&other);
    segment_destroy (&again);
    //  Destroying the creator closes the descriptor: the name is gone with it.
    char sealed_name[SEGMENT_NAME_MAX + 1];
    snprintf (sealed_name, sizeof sealed_name, "%s", segment_name (sealed));
    segment_destroy (&sealed);
    errno = 0;
    assert (segment_open (sealed_name, 4096) == NULL && errno == ENOENT);

    //  Staleness is the lock, not the pid: names carrying a pid that looks dead here (as a
    //  live daemon's pid does from another pid namespace) survive while held, and go when
    //  nobody holds them.
    pid = fork ();
    assert (pid >= 0);
    if (pid == 0)
        _exit (0);
    assert (waitpid (pid, &status, 0) == pid); //  reaped: kill (pid, 0) says ESRCH
    char held_name[64], stale_name[64];
    snprintf (held_name, sizeof held_name, "/kvpool-%d-st-held-0", (int) pid);
    snprintf (stale_name, sizeof stale_name, "/kvpool-%d-st-stale-0", (int) pid);
    segment_t *held = segment_new (held_name, 64 * 1024, false);
    assert (held);
    memset (segment_base (held), 0x42, 64 * 1024);
    int loose_fd = shm_open (stale_name, O_CREAT | O_EXCL | O_RDWR, 0600);
    assert (loose_fd >= 0 && ftruncate (loose_fd, 4096) == 0);
    close (loose_fd);
    //  A view (a client mapping the segment) takes no lock and changes nothing.
    segment_t *reader = segment_open (held_name, 4096);
    assert (reader);
    //  The cleaner runs in another process, as another daemon would.
    pid = fork ();
    assert (pid >= 0);
    if (pid == 0)
        _exit (segment_remove_stale () >= 1 ? 0 : 1);
    assert (waitpid (pid, &status, 0) == pid);
    assert (WIFEXITED (status) && WEXITSTATUS (status) == 0);
    assert (s_name_exists (held_name));
    assert (!s_name_exists (stale_name));
    assert (((unsigned char *) segment_base (held))[4095] == 0x42);
    segment_destroy (&reader);
    //  segment_hold refuses a name that no longer names the descriptor's object.
    int unlinked = shm_open (stale_name, O_CREAT | O_EXCL | O_RDWR, 0600);
    assert (unlinked >= 0);
    shm_unlink (stale_name);
    errno = 0;
    assert (segment_hold (unlinked, stale_name) == -1 && errno == ENOENT);
    close (unlinked);
    segment_destroy (&held);
    assert (!s_name_exists (held_name));
    //  A creator that dies without destroying leaves the name, and with it no lock holder.
    //  (The child inherits this process's tag, drawn before the fork.)
    const char *process_tag = segment_process_tag ();
    assert (strlen (process_tag) == 8 && strspn (process_tag, "0123456789abcdef") == 8);
    pid = fork ();
    assert (pid >= 0);
    if (pid == 0) {
        char crashed[64];
        segment_make_name (crashed, sizeof crashed, "st-crash", 0);
        _exit (segment_new (crashed, 4096, false) ? 0 : 1);
    }
    assert (waitpid (pid, &status, 0) == pid);
    assert (WIFEXITED (status) && WEXITSTATUS (status) == 0);
    snprintf (held_name, sizeof held_name, "/kvpool-%d-%s-st-crash-0", (int) pid, process_tag);
    assert (s_name_exists (held_name));
    assert (segment_remove_stale () >= 1);
    assert (!s_name_exists (held_name));

    if (verbose)
        printf ("done\n");
}
