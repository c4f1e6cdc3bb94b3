/*  segment.h - a segment: a contiguous range of shared memory given to the pool.

    A node's own segment is a memfd it creates (segment_new_sealed), every page committed and
    sealed so that it can neither shrink nor grow: nobody who can open it can kill the node
    with SIGBUS by cutting it short. Its name is "/proc/<pid>/fd/<fd>"; a same-machine client
    of the node's own user (or root) opens it by that name and maps the same bytes. A client
    of another user, --group or not, cannot (the kernel's ptrace access check on
    /proc/<pid>/fd) and uses the socket path instead. segment.c's opening comment says why.

    With --segment-dir a node's own segment is a file in that directory instead
    (segment_new_file): named by its path, mode 0600, kept when the node stops or dies, so
    that a node restarted on the same machine finds its objects in it (actors/segment_dir.c).
    Clients of the node's user open it by that path like any other name.

    Memory a client contributes is a memfd sealed against shrinking, named
    "/proc/<pid>/fd/<fd>" too (segment_new_sealed makes one, segment_mount maps one). A node
    refuses anything else: an object that can shrink under its mapping would kill it with
    SIGBUS.

    segment_new makes a named POSIX shared-memory object (/dev/shm), which anyone who can
    open it may truncate: the node no longer makes one; tests use it for an object that is
    not sealed.

    Threads: a segment_t is used by one thread at a time (its prefault thread aside, see
    segment_prefault_start); the mapped bytes are shared.
*/
#ifndef SEGMENT_H_INCLUDED
#define SEGMENT_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct _segment_t segment_t;

//  Creates a new POSIX shared-memory object of size bytes named name (fails if it exists),
//  mode 0600, maps it read-write. Not sealed: whoever can open it can truncate it, so a node
//  never keeps its data in one (segment_new_sealed). With lock, mlocks it (failure to lock is reported through segment_locked, not
//  an error). Returns NULL on failure with errno set. Caller owns the return value.
segment_t *segment_new (const char *name, size_t size, bool lock);

//  Maps an existing segment created by another process, by either form of name (a
//  same-machine client mapping the node's segments). size must not exceed
//  the object's size (fails with EINVAL otherwise). Destroying it unmaps but never unlinks.
//  Returns NULL on failure with errno set. Caller owns the return value.
segment_t *segment_open (const char *name, size_t size);

//  Maps memory another process contributes, for the node to keep data in: name (either
//  form) must be an object sealed with F_SEAL_SHRINK, at least size bytes long. Returns NULL
//  on failure with errno set and a one-line reason in reason (when not NULL).
segment_t *segment_mount (const char *name, size_t size, char *reason, size_t reason_size);

//  Creates a memfd of size bytes (pages committed up front), sealed so that it can neither
//  shrink nor grow (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), and maps it: a node's own
//  segments and a client's contributed memory. Its name is "/proc/<pid>/fd/<fd>": other
//  processes of this user open it by that name while this one holds it (the descriptor stays
//  open until destroy). tag names the memfd in /proc/<pid>/maps. A size above the machine's
//  memory fails with ENOMEM. Returns NULL on failure with errno set. Caller owns the return
//  value.
segment_t *segment_new_sealed (size_t size, const char *tag);

//  Locks the segment's pages in memory (mlock). Often refused by RLIMIT_MEMLOCK: the segment
//  works either way. Returns segment_locked.
bool segment_lock (segment_t *self);

//  Whether name has the "/proc/<pid>/fd/<fd>" form (nothing to unlink for it).
bool segment_name_is_fd (const char *name);
//  Whether name is the path of a file (absolute, with a directory, not under /proc): the
//  files of a --segment-dir.
bool segment_name_is_path (const char *name);

//  Creates the file path (fails if it exists), mode 0600, size bytes, mapped MAP_SHARED. With commit,
//  every page is allocated now (posix_fallocate); without, later by segment_commit (a node
//  that copies objects into it from a previous run's files first). Destroying it unmaps and
//  never unlinks: the file outlives the process. Returns NULL with errno set. Caller owns the
//  return value.
segment_t *segment_new_file (const char *path, size_t size, bool lock, bool commit);
//  Allocates every page of a segment made by segment_new_file. Returns 0 or -1 with errno.
int segment_commit (segment_t *self);
//  Gives the whole pages inside [offset, offset + length) back to the system (MADV_REMOVE:
//  a hole is punched in the object; they read as zeros after). Returns 0 or -1 with errno.
int segment_release (segment_t *self, uint64_t offset, uint64_t length);

//  Unmaps; unlinks the name if this process created it. Does nothing on NULL; sets *self_p
//  to NULL.
void segment_destroy (segment_t **self_p);

void *segment_base (segment_t *self);
size_t segment_size (segment_t *self);
const char *segment_name (segment_t *self);
bool segment_locked (segment_t *self);

//  Called by the prefault thread when it ends: bytes faulted in from the start of the
//  segment, and 0 or the errno that stopped it (EINVAL: a kernel before 5.14; EFAULT or
//  ENOMEM: the memory was not there). A stop by segment_destroy ends it early with 0.
typedef void (segment_prefault_fn) (segment_t *self, size_t bytes, int error, void *arg);

//  Faults every page of the mapping in from a thread of its own at the lowest priority
//  (MADV_POPULATE_WRITE), so that the first writes into the segment pay no page faults;
//  safe while other threads and processes write into it. done (may be NULL) is called on
//  that thread at the end; it must not destroy the segment. segment_destroy stops and joins
//  the thread. Returns 0 or -1 with errno set.
int segment_prefault_start (segment_t *self, segment_prefault_fn *done, void *arg);
//  Whether both map the same object (one object can have several names).
bool segment_same_object (segment_t *self, segment_t *other);
//  The mapped object's identity (device and inode numbers), whatever name it was opened by.
void segment_identity (segment_t *self, uint64_t *device, uint64_t *inode);

//  Eight hex digits drawn at random once per process: with the pid they make the names of
//  a process's shared-memory objects unique on the machine, even between daemons in
//  containers that share /dev/shm and have the same pid (1, say) in their namespaces.
const char *segment_process_tag (void);

//  Writes a segment name unique to this process into buf:
//  "/kvpool-<pid>-<process tag>-<tag>-<index>".
void segment_make_name (char *buf, size_t buf_size, const char *tag, unsigned index);

//  Marks the /dev/shm object fd (just created as name) as held by a live process: takes
//  flock(LOCK_SH) on fd, which stays until fd is closed, and checks that name still names
//  fd's object. Returns 0, or -1 with errno ENOENT (a cleaner unlinked it before the lock:
//  make it again) or EEXIST (the name now belongs to another object).
int segment_hold (int fd, const char *name);
//  Creates the shared-memory object name (O_EXCL, mode 0600) and holds it (segment_hold),
//  trying again if a cleaner unlinked it in between. Returns its descriptor, or -1 with
//  errno set (EEXIST: the name is taken).
int segment_create_held (const char *name);

//  Removes shared-memory objects left behind by kvpool processes that died without cleaning
//  up: names /kvpool-<pid>-... and /kvpool-client-<pid>-... that nobody holds (see
//  segment_hold; the pid in the name is only trusted to say "alive", never "dead", since a
//  daemon in another pid namespace has pids this one cannot see). Returns how many were
//  removed.
int segment_remove_stale (void);

//  Self test.
void segment_test (bool verbose);

#endif
