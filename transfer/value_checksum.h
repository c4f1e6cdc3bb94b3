/*  value_checksum.h - the checksum every value carries: XXH3-64 of its bytes.

    A value's checksum is taken once, where its writer's bytes first arrive (while a copy
    worker copies a request frame into its place, or while a node copies a value into its
    request to another node), kept with the object, and sent with the value whenever it
    moves between nodes (Request.checksums, Reply.checksums), so that whoever receives the
    bytes can tell they are the ones written (docs/cluster.md, "Values are checked end to
    end"). It is the disk tier's hash (tier/object_log.h), so the object log reuses it.

    0 means "unknown": a value whose hash happens to be 0 (one in 2^64) is never verified,
    which costs nothing and keeps every wire field a plain fixed64.

    Threads: any. value_checksum_verify is one process-wide switch (--verify-checksums,
    which changes at run time), read with relaxed atomics on every path that verifies.
*/
#ifndef VALUE_CHECKSUM_H_INCLUDED
#define VALUE_CHECKSUM_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  XXH3-64 of size bytes.
uint64_t value_checksum (const void *bytes, size_t size);

//  Faster implementations of the same hash (libxxhash's XXH3_64bits_dispatch and
//  XXH3_64bits_update_dispatch, which choose AVX2 at run time), for a process that links
//  libxxhash (kvpoold). Before any thread hashes; NULL, NULL: the compiled-in code again.
typedef uint64_t (value_hash_fn) (const void *bytes, size_t size);
typedef int (value_hash_update_fn) (void *state, const void *bytes, size_t size);
void value_checksum_use (value_hash_fn *oneshot, value_hash_update_fn *update);

//  Copies size bytes from src to dst (not overlapping) and returns value_checksum (src):
//  one pass, block by block, each block hashed while it is still in the cache the copy
//  brought it into. About the cost of the copy alone (a second pass over a value larger
//  than the cache would read it from memory again).
uint64_t value_copy_checksum (void *dst, const void *src, size_t size);

//  Whether checksums are taken and verified (default true). Off, values move as before:
//  nothing is hashed on their way and nothing received is verified (for measuring the cost).
bool value_checksum_verify (void);
void value_checksum_set_verify (bool on);

void value_checksum_test (bool verbose);

#endif
