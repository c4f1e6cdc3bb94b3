/*  arena.c - a bump allocator for one request (arena.h). */
#include "messages/arena.h"

#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct _arena_chunk_t {
    arena_chunk_t *next;
    size_t used, size;
    max_align_t data[];
};

static arena_chunk_t *
s_chunk_new (size_t capacity, arena_chunk_t *next)
{
    arena_chunk_t *chunk = (arena_chunk_t *) malloc (sizeof (arena_chunk_t) + capacity);
    if (chunk) {
        chunk->next = next;
        chunk->used = 0;
        chunk->size = capacity;
    }
    return chunk;
}

void *
arena_alloc (arena_t *self, size_t size)
{
    size = (size + sizeof (max_align_t) - 1) & ~(sizeof (max_align_t) - 1);
    arena_chunk_t *chunk = self->chunks;
    if (!chunk || chunk->used + size > chunk->size) {
        //  Each new chunk doubles the last, so a large request needs few.
        size_t capacity = chunk ? chunk->size * 2 : 16384;
        if (capacity < size)
            capacity = size;
        chunk = s_chunk_new (capacity, self->chunks);
        if (!chunk)
            return NULL;
        self->chunks = chunk;
    }
    void *block = (char *) chunk->data + chunk->used;
    chunk->used += size;
    return block;
}

static void *
s_protobuf_alloc (void *data, size_t size)
{
    return arena_alloc ((arena_t *) data, size);
}

static void
s_protobuf_free (void *data, void *block)
{
    //  Everything goes at once in arena_fini.
    (void) data;
    (void) block;
}

void
arena_init (arena_t *self, size_t hint)
{
    self->allocator.alloc = s_protobuf_alloc;
    self->allocator.free = s_protobuf_free;
    self->allocator.allocator_data = self;
    //  A decoded request takes about twice its encoded size (pointers beside the bytes).
    self->chunks = s_chunk_new (2 * hint + 4096, NULL);
}

void
arena_fini (arena_t *self)
{
    while (self->chunks) {
        arena_chunk_t *next = self->chunks->next;
        free (self->chunks);
        self->chunks = next;
    }
}

ProtobufCAllocator *
arena_allocator (arena_t *self)
{
    return &self->allocator;
}

void
arena_test (bool verbose)
{
    arena_t arena;
    arena_init (&arena, 100);
    //  Blocks are aligned for any type and do not overlap, across chunks too.
    char *blocks[200];
    for (int i = 0; i < 200; i++) {
        blocks[i] = (char *) arena_alloc (&arena, (size_t) (i * 37 % 500) + 1);
        assert (blocks[i] && (uintptr_t) blocks[i] % sizeof (max_align_t) == 0);
        memset (blocks[i], i, (size_t) (i * 37 % 500) + 1);
    }
    for (int i = 0; i < 200; i++)
        assert (blocks[i][0] == (char) i && blocks[i][i * 37 % 500] == (char) i);
    //  A block larger than any chunk gets a chunk of its own.
    char *big = (char *) arena_alloc (&arena, 1 << 20);
    assert (big);
    memset (big, 1, 1 << 20);
    //  protobuf-c allocates through it.
    ProtobufCAllocator *allocator = arena_allocator (&arena);
    void *through = allocator->alloc (allocator->allocator_data, 64);
    assert (through);
    allocator->free (allocator->allocator_data, through);
    arena_fini (&arena);
    assert (arena.chunks == NULL);
    if (verbose)
        printf ("aligned, chunked, freed at once ");
}
