/*  bench_curve.h - kvpool-bench's curve section (bench_curve.c): what CURVE costs a client on
    tcp. Declared here rather than in bench.h only because this change was limited to new
    files and kvpool_bench.c; the declaration belongs beside the other sections' in bench.h.
*/
#ifndef BENCH_CURVE_H_INCLUDED
#define BENCH_CURVE_H_INCLUDED

#include <stdbool.h>

//  Two kvpoolds of its own (kvpoold at kvpoold_path): one plain, one with --curve-secret and
//  --curve-allow (certificates made in a scratch directory, the client's public one in the
//  allow directory), and the same workload against both over tcp (fast_path 0,
//  keep_endpoint 1): batched gets of 32 x 1 MiB (kvpool_get_batch_into, and kvpool_get_batch
//  zero-copy) and single 4 KiB gets (kvpool_get_into, p50 and p99). reps interleaved
//  repetitions of rep_seconds each; the medians, their ratio curve/plain and each side's CPU
//  time per byte or per get. Checks that the CURVE kvpoold refuses a client without CURVE and
//  that every value reads back intact. Returns 0, or -1 when a call or a check failed.
int bench_curve_run (const char *kvpoold_path, bool quick, int reps, double rep_seconds);

#endif
