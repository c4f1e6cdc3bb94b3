/*  value_checksum.c - XXH3-64 of values, and a copy that takes it (value_checksum.h).

    The copy hashes in blocks of COPY_BLOCK bytes with XXH3's streaming state, which gives
    exactly the one-shot hash of the whole value (XXH3 defines it so), so the checksum taken
    while copying is the one any reader computes over the value at rest. A block is small
    enough to stay in L1/L2 between its memcpy and its hash, large enough that the state's
    update costs nothing beside it.

    Linked into the node and into libkvpool, which must not grow a run-time dependency for a
    hash: xxhash is compiled in (XXH_INLINE_ALL), its symbols kept inside the library, with
    the vector code the compiler's target allows (SSE2 on x86-64). The node has libxxhash,
    whose x86 dispatch picks AVX2 where the CPU has it: kvpoold hands its functions over at
    start (value_checksum_use), and both the one-shot hash and the copy's blocks go through
    them. The streaming state is the same structure either way (one xxhash version, from
    one Debian package).
*/
#include "transfer/value_checksum.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define COPY_BLOCK (32 * 1024)

static atomic_bool s_verify = true;
//  libxxhash's dispatching functions, when the process handed them over (value_checksum_use).
static value_hash_fn *s_oneshot;
static value_hash_update_fn *s_update;

void
value_checksum_use (value_hash_fn *oneshot, value_hash_update_fn *update)
{
    s_oneshot = oneshot;
    s_update = update;
}

uint64_t
value_checksum (const void *bytes, size_t size)
{
    return s_oneshot ? s_oneshot (bytes, size) : XXH3_64bits (bytes, size);
}

uint64_t
value_copy_checksum (void *dst, const void *src, size_t size)
{
    if (size <= COPY_BLOCK) {
        memcpy (dst, src, size);
        return value_checksum (dst, size);
    }
    XXH3_state_t state;
    XXH3_64bits_reset (&state);
    for (size_t at = 0; at < size; at += COPY_BLOCK) {
        size_t block = size - at < COPY_BLOCK ? size - at : COPY_BLOCK;
        memcpy ((char *) dst + at, (const char *) src + at, block);
        if (s_update)
            s_update (&state, (const char *) dst + at, block);
        else
            XXH3_64bits_update (&state, (const char *) dst + at, block);
    }
    return XXH3_64bits_digest (&state);
}

bool
value_checksum_verify (void)
{
    return atomic_load_explicit (&s_verify, memory_order_relaxed);
}

void
value_checksum_set_verify (bool on)
{
    atomic_store_explicit (&s_verify, on, memory_order_relaxed);
}

void
value_checksum_test (bool verbose)
{
    if (verbose)
        printf (" * value_checksum: ");
    //  The copy's hash is the one-shot hash, at every size around the block edges.
    size_t sizes[] = {0, 1, 17, COPY_BLOCK - 1, COPY_BLOCK, COPY_BLOCK + 1, 3 * COPY_BLOCK + 5,
                      (1 << 20) + 3};
    size_t max = (1 << 20) + 3;
    unsigned char *src = (unsigned char *) malloc (max);
    unsigned char *dst = (unsigned char *) malloc (max);
    assert (src && dst);
    for (size_t i = 0; i < max; i++)
        src[i] = (unsigned char) (i * 131 + (i >> 9));
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        memset (dst, 0, max);
        uint64_t copied = value_copy_checksum (dst, src, sizes[s]);
        assert (copied == value_checksum (src, sizes[s]));
        assert (copied == XXH3_64bits (src, sizes[s]));
        assert (memcmp (dst, src, sizes[s]) == 0);
    }
    //  One flipped bit anywhere changes it.
    uint64_t whole = value_checksum (src, max);
    src[max / 2] ^= 0x10;
    assert (value_checksum (src, max) != whole);
    src[max / 2] ^= 0x10;
    assert (value_checksum (src, max) == whole);
    //  The switch.
    assert (value_checksum_verify ());
    value_checksum_set_verify (false);
    assert (!value_checksum_verify ());
    value_checksum_set_verify (true);
    free (src);
    free (dst);
    if (verbose)
        printf ("OK\n");
}
