/*  segment.h - a segment: a contiguous range of shared memory given to the pool.

    A segment is a POSIX shared-memory object (shm_open, so /dev/shm/<name>) mapped
    MAP_SHARED. The node that creates it owns the name and unlinks it on destroy; any other
    process on the machine (a same-machine client, or the node mounting a client's memory)
    opens it by name and maps the same bytes. Names follow shm_open rules: one leading '/',
    no other '/', at most 63 characters.

    Threads: a segment_t is used by one thread at a time; the mapped bytes are shared.
*/
#ifndef SEGMENT_H_INCLUDED
#define SEGMENT_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

typedef struct _segment_t segment_t;

//  Creates a new shared-memory object of size bytes named name (fails if it exists), maps it
//  read-write. With lock, mlocks it (failure to lock is reported through segment_locked, not
//  an error). Returns NULL on failure with errno set. Caller owns the return value.
segment_t *segment_new (const char *name, size_t size, bool lock);

//  Maps an existing shared-memory object created by another process. size must not exceed
//  the object's size (fails with EINVAL otherwise). Destroying it unmaps but never unlinks.
//  Returns NULL on failure with errno set. Caller owns the return value.
segment_t *segment_open (const char *name, size_t size);

//  Unmaps; unlinks the name if this process created it. Does nothing on NULL; sets *self_p
//  to NULL.
void segment_destroy (segment_t **self_p);

void *segment_base (segment_t *self);
size_t segment_size (segment_t *self);
const char *segment_name (segment_t *self);
bool segment_locked (segment_t *self);

//  Writes a segment name unique to this process into buf: "/kvpool-<pid>-<tag>-<index>".
void segment_make_name (char *buf, size_t buf_size, const char *tag, unsigned index);

//  Removes shared-memory objects left behind by kvpool processes that died without cleaning
//  up: names /kvpool-<pid>-... and /kvpool-client-<pid>-... whose pid no longer exists.
//  Returns how many were removed.
int segment_remove_stale (void);

//  Self test.
void segment_test (bool verbose);

#endif
