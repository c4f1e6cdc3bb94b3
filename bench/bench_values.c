/*  bench_values.c - the values the benchmark writes and checks (bench.h): every value's bytes
    follow from a seed (its key's number), so a value returned for the wrong key fails the
    check as surely as a damaged one.
*/
#include "bench/bench.h"

uint64_t
bench_mix (uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

void
bench_fill (void *buffer, size_t size, uint64_t seed)
{
    uint64_t *words = (uint64_t *) buffer;
    uint64_t base = bench_mix (seed);
    for (size_t i = 0; i < size / 8; i++)
        words[i] = base ^ (i * 0x100000001B3ULL);
}

bool
bench_holds (const void *buffer, size_t size, uint64_t seed)
{
    const uint64_t *words = (const uint64_t *) buffer;
    uint64_t base = bench_mix (seed);
    for (size_t i = 0; i < size / 8; i++)
        if (words[i] != (base ^ (i * 0x100000001B3ULL)))
            return false;
    return true;
}
