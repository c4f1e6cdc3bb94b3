/*  bench.h - the sections of kvpool-bench. Each section runs against servers that are already
    up and prints its own table to stdout; bench/kvpool_bench.c starts the servers, calls the
    sections and prints the ratios.
*/
#ifndef BENCH_H_INCLUDED
#define BENCH_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  Lookup channel latency (p50, p99) for 1, 100, 1000 and 10000 hashes with 2 tp ranks, and
//  the time of a reset of a pool holding many objects. store_endpoint is kvpoold's client
//  endpoint, admin_endpoint its lookup/reset endpoint; the daemon was started with
//  --lookup-tp-size 2 --lookup-model bench. quick: fewer iterations (for smoke runs).
//  Returns 0 or -1.
int bench_lookup_run (const char *store_endpoint, const char *admin_endpoint, bool quick);

//  The loopback floor (bench_floor.c): p50 in us of a bare libzmq DEALER -> ROUTER echo of
//  4 KiB over tcp on 127.0.0.1:port, to a child process, over reps runs of rep_seconds.
//  Returns -1 if the echo could not be measured.
double bench_floor_p50_us (int port, int reps, double rep_seconds);

#endif
