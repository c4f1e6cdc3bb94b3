/*  bench_values.c - the values the benchmark writes and checks (bench.h): every value's bytes
    follow from a seed (its key's number), so a value returned for the wrong key fails the
    check as surely as a damaged one. And the statistics the sections report.
*/
#include "bench/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

//  ---- statistics ----------------------------------------------------------------------

static int
s_compare_doubles (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

double
bench_median (const double *values, int count)
{
    if (count <= 0)
        return NAN;
    double sorted[64];
    count = count < 64 ? count : 64;
    memcpy (sorted, values, count * sizeof (double));
    qsort (sorted, count, sizeof (double), s_compare_doubles);
    return count % 2 ? sorted[count / 2] : (sorted[count / 2 - 1] + sorted[count / 2]) / 2;
}

double
bench_quantile (double *values, size_t count, double q)
{
    if (count == 0)
        return NAN;
    qsort (values, count, sizeof (double), s_compare_doubles);
    size_t rank = (size_t) ceil (q * count);
    return values[rank ? rank - 1 : 0];
}

void
bench_series_add (bench_series_t *self, double seconds)
{
    if (self->count == self->capacity) {
        size_t capacity = self->capacity ? self->capacity * 2 : 4096;
        double *grown = (double *) realloc (self->samples, capacity * sizeof (double));
        if (!grown)
            return;
        self->samples = grown;
        self->capacity = capacity;
    }
    self->samples[self->count++] = seconds;
}

double
bench_series_us (bench_series_t *self, double q)
{
    return bench_quantile (self->samples, self->count, q) * 1e6;
}

void
bench_series_free (bench_series_t *self)
{
    free (self->samples);
    *self = (bench_series_t){0};
}
