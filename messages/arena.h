/*  arena.h - a bump allocator for everything one request needs, freed at once with it.

    protobuf-c would otherwise make one malloc per key when it decodes a Request (1000 for a
    1000-key EXIST) and as many frees; with the arena as its ProtobufCAllocator, a request
    costs a chunk or two. The api also takes the keys' NUL-terminated copies and the reply's
    arrays from it.

    Usage:
        arena_t arena;
        arena_init (&arena, frame_size);            //  the first chunk, sized for the request
        Request *r = request__unpack (arena_allocator (&arena), size, data);
        char *copy = arena_alloc (&arena, len + 1);  //  NULL when out of memory
        arena_fini (&arena);                         //  everything at once

    Threads: none; one arena belongs to one request.
*/
#ifndef KVP_ARENA_H_INCLUDED
#define KVP_ARENA_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

typedef struct _arena_chunk_t arena_chunk_t;

typedef struct {
    arena_chunk_t *chunks;
    ProtobufCAllocator allocator;
} arena_t;

//  Prepares an empty arena whose first chunk has room for a request of about hint bytes.
void arena_init (arena_t *self, size_t hint);
//  Frees every block at once. The arena can be initialised again.
void arena_fini (arena_t *self);
//  size bytes aligned for any type, or NULL when out of memory.
void *arena_alloc (arena_t *self, size_t size);
//  The arena as protobuf-c's allocator (its free does nothing).
ProtobufCAllocator *arena_allocator (arena_t *self);

void arena_test (bool verbose);

#endif
