/*  segment_arena.h - space management inside one segment with its own jemalloc arena.

    Each segment's space is managed by a dedicated jemalloc arena (arenas.create with custom
    extent hooks). jemalloc never sees the segment's data memory: the hooks hand it pieces of a
    *shadow* range, reserved address space of the segment's size (mmap PROT_READ|PROT_WRITE,
    MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE). An allocation's offset in the real segment is
    ptr - shadow_base. jemalloc's metadata stays in memory no client can write, and shadow
    pages jemalloc never touches cost nothing. Dirty and muzzy decay are -1 (extents are never
    purged or returned) and every call uses MALLOCX_TCACHE_NONE so no offset is cached per
    thread.

    Threads: an arena is used by one thread at a time (the allocator actor's).
*/
#ifndef SEGMENT_ARENA_H_INCLUDED
#define SEGMENT_ARENA_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct _segment_arena_t segment_arena_t;

//  Creates an arena managing size bytes (offsets 0 .. size-1). Returns NULL on failure.
//  Caller owns the return value.
segment_arena_t *segment_arena_new (size_t size);

//  Destroys the arena and releases the shadow range. Does nothing on NULL.
void segment_arena_destroy (segment_arena_t **self_p);

//  Allocates size bytes (size > 0). On success returns 0 and sets *offset_p; returns -1 when
//  the arena has no room.
int segment_arena_alloc (segment_arena_t *self, size_t size, uint64_t *offset_p);

//  Frees an allocation made by segment_arena_alloc.
void segment_arena_free (segment_arena_t *self, uint64_t offset);

//  Bytes managed (the size given to new).
size_t segment_arena_capacity (segment_arena_t *self);
//  Bytes currently handed out, counted at jemalloc's usable size (size-class rounding).
size_t segment_arena_allocated (segment_arena_t *self);
//  Number of live allocations.
size_t segment_arena_count (segment_arena_t *self);

//  Self test.
void segment_arena_test (bool verbose);

#endif
