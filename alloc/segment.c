/*  segment.c - a segment: a POSIX shared-memory object mapped MAP_SHARED.

    The creating node calls shm_open with O_CREAT|O_EXCL (mode 0600, so only the same user
    can map it), sizes the object with ftruncate and maps it; other processes on the machine
    map the same object by name with segment_open. The file descriptor is closed once the
    mapping exists: the mapping keeps the object alive, and the name is all another process
    needs. Only the creator unlinks the name, on destroy; mappings other processes still hold
    stay valid until they unmap.

    tmpfs allocates pages on first touch, so a segment that is not locked can hit SIGBUS later
    if /dev/shm runs out. Creation refuses a size larger than the filesystem has free at the
    time (it cannot stop others filling /dev/shm afterwards); locking (mlock) faults every
    page in up front and so settles the question for good.
    MADV_HUGEPAGE is advisory: tmpfs honours it only when the administrator enabled shmem
    huge pages ("advise" in /sys/kernel/mm/transparent_hugepage/shmem_enabled).

    Threads: a segment_t is used by one thread at a time; the mapped bytes are shared and
    carry no ordering of their own (the protocol above orders writes and reads).
*/
#include "alloc/segment.h"

#include <dirent.h>
#include <signal.h>

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

//  shm_open names: one leading '/', no other '/', at most this many characters in all.
#define SEGMENT_NAME_MAX 63

struct _segment_t {
    char name[SEGMENT_NAME_MAX + 1];
    void *base;
    size_t size;
    bool owner;  //  created here: unlink on destroy
    bool locked; //  mlock succeeded
};

static bool
s_name_valid (const char *name)
{
    if (!name || name[0] != '/')
        return false;
    size_t length = strlen (name);
    if (length < 2 || length > SEGMENT_NAME_MAX)
        return false;
    return strchr (name + 1, '/') == NULL;
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
    if (!s_name_valid (name) || size == 0 || size > (size_t) INT64_MAX) {
        errno = EINVAL;
        return NULL;
    }
    int fd = shm_open (name, O_CREAT | O_EXCL | O_RDWR, 0600);
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
    segment_t *self = s_segment_map (name, fd, size, true);
    if (!self) {
        s_cleanup (fd, name);
        return NULL;
    }
    close (fd);
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
    int fd = shm_open (name, O_RDWR, 0);
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

void
segment_destroy (segment_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    segment_t *self = *self_p;
    munmap (self->base, self->size);
    if (self->owner)
        shm_unlink (self->name);
    free (self);
    *self_p = NULL;
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
segment_locked (segment_t *self)
{
    assert (self);
    return self->locked;
}

void
segment_make_name (char *buf, size_t buf_size, const char *tag, unsigned index)
{
    assert (buf && buf_size > 0);
    snprintf (buf, buf_size, "/kvpool-%ld-%s-%u", (long) getpid (), tag ? tag : "", index);
    //  A '/' in the tag would make the name invalid for shm_open.
    for (char *c = buf + 1; *c; c++)
        if (*c == '/')
            *c = '_';
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
        const char *rest = entry->d_name;
        if (strncmp (rest, "kvpool-", 7) != 0)
            continue;
        rest += 7;
        if (strncmp (rest, "client-", 7) == 0)
            rest += 7;
        char *end;
        long pid = strtol (rest, &end, 10);
        if (end == rest || *end != '-' || pid <= 0)
            continue;
        //  Only a process that is certainly gone loses its objects.
        if (kill ((pid_t) pid, 0) == 0 || errno != ESRCH)
            continue;
        char name[300];
        snprintf (name, sizeof name, "/%s", entry->d_name);
        if (shm_unlink (name) == 0)
            removed++;
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
        assert (opened == NULL && errno == EINVAL);
    }
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

    if (verbose)
        printf ("done\n");
}
