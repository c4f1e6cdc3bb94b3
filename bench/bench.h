/*  bench.h - the sections of kvpool-bench, and the processes they start. The lookup section
    runs against servers that are already up, the tier, cluster, hotcache and master sections
    start their own; each prints its own table to stdout. bench/kvpool_bench.c starts the main
    servers, calls the sections and prints the ratios; bench/bench_proc.c starts and stops
    every process the bench runs.
*/
#ifndef BENCH_H_INCLUDED
#define BENCH_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/types.h>

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
//  The batch floor (bench_floor.c): p50 in us of sending frames (at least 2) x size bytes as
//  one message from a bare libzmq DEALER to a ROUTER that acknowledges it, as above.
double bench_floor_batch_p50_us (int port, size_t frames, size_t size, int reps,
                                 double rep_seconds);
//  The echo server of the floor: a child process with a bare ROUTER on tcp://127.0.0.1:port
//  that sends every message of one frame back and acknowledges one of several frames with
//  "ok", until it is killed (or the bench dies). Its pid, or -1.
pid_t bench_echo_start (int port);

//  The curve section (bench_curve.c): what CURVE costs a client on tcp. Two kvpoolds of its
//  own (kvpoold at kvpoold_path): one plain, one with --curve-secret and --curve-allow
//  (certificates made in a scratch directory, the client's public one in the allow
//  directory), and the same workload against both over tcp (fast_path 0, keep_endpoint 1):
//  batched gets of 32 x 1 MiB (kvpool_get_batch_into, and kvpool_get_batch zero-copy) and
//  single 4 KiB gets (kvpool_get_into, p50 and p99). reps interleaved repetitions of
//  rep_seconds each; the medians, their ratio curve/plain and each side's CPU time per byte
//  or per get. Checks that the CURVE kvpoold refuses a client without CURVE and that every
//  value reads back intact. Returns 0, or -1 when a call or a check failed.
int bench_curve_run (const char *kvpoold_path, bool quick, int reps, double rep_seconds);

//  The latency section (bench_latency.c): single 4 KiB PING, PUT, GET and REMOVE over tcp
//  against a kvpoold of its own (kvpoold_path) and, when compare_path is not NULL, one of
//  that build too, with the floor's echo (bench_echo_start), all in turn in one loop so that
//  noise hits them alike: p50, p99, and p50 as a multiple of the floor and of a PING. reps
//  repetitions of rep_seconds. Returns 0, or -1 when a call or a check failed.
int bench_latency_run (const char *kvpoold_path, const char *compare_path, bool quick, int reps,
                       double rep_seconds);

//  The eviction and disk tier section (bench_tier.c): disk-tier get throughput of 1 MiB
//  values beside `dd iflag=direct` of the same bytes on the same disk, the time of an
//  eviction cycle over a million small objects, and 4 MiB put throughput into a pool in
//  constant overflow against an empty one. Starts its own kvpoold processes from
//  kvpoold_path, with their disk directories in a scratch directory under /tmp, and stops
//  and removes them at the end. quick: smaller figures (for smoke runs). Returns 0, or -1
//  when a call failed or a check did not pass (missed targets are reported, not failed).
int bench_tier_run (const char *kvpoold_path, bool quick);

//  The cluster section (bench_cluster.c): a master and two nodes of its own (kvpoold at
//  kvpoold_path, distinct host ids), and batched get and put throughput of 64 KiB, 1 MiB and
//  4 MiB values through libkvpool connected to node 1 while the values live on node 2 (read
//  and written over the nodes' data plane), beside the same calls through node 2 itself and
//  beside the loopback bandwidth iperf3 measures (a ratio; skipped when iperf3 is missing).
//  reps repetitions of rep_seconds each, the median reported. quick: smaller figures. Returns
//  0, or -1 when a call failed or a check did not pass (missed targets are reported only).
int bench_cluster_run (const char *kvpoold_path, bool quick, int reps, double rep_seconds);

//  The repair section (bench_repair.c): a master and three nodes of its own; 1 MiB values with
//  two replicas on nodes B and C (256 MiB, quick 64 MiB, big 1 GiB), node C killed, and the
//  rate node A restores the lost replicas at beside the node-to-node bandwidth measured in
//  the same run (remote gets through A of values B holds), as a ratio (goal >= 0.5). Returns
//  0, or -1 when a call failed or a check did not pass (a missed goal is reported only).
int bench_repair_run (const char *kvpoold_path, bool quick, bool big, int reps, double rep_seconds);

//  The hotcache section (bench_hotcache.c): a master and three nodes of its own, twice (node
//  A's --hot-cache-size 0, then a quarter of the values' bytes, each arm a cluster of its
//  own); 8 client processes on node A's machine read 256 KiB and 1 MiB values held only by
//  nodes B and C, keys drawn from Zipf(s = 1.0), one key a get: hit rate, get p50 and p99,
//  throughput, master requests per get and the cache's memory, on against off, and the
//  issue's goals. keys and reads (timed gets a process) set both sizes' scale, 0 for the
//  defaults (quick: smaller); full_verify checks every byte read, not only the first and
//  last 8. It forks its readers: no libkvpool connection may be open in this process when
//  it is called. Returns 0, or -1 when a call failed or a check did not pass (missed goals
//  are reported only).
int bench_hotcache_run (const char *kvpoold_path, bool quick, size_t keys, size_t reads,
                        bool full_verify);

//  The master section (bench_master.c): a master of its own (kvpoold --role master), driven
//  over its ROUTER with the cluster protocol as fake nodes: keys per second of INVENTORY,
//  PLACE+COMMIT and LOCATE in batches, single-key LOCATE round trips, and the master's
//  resident memory per object, over 10 million keys (200000 with quick). Returns 0 or -1, as
//  bench_cluster_run.
int bench_master_run (const char *kvpoold_path, bool quick);

//  The kv-events section (bench_kv_events.c): put throughput of 4 KiB values in batches of
//  64 over tcp into a kvpoold without KV events and one publishing them to an attached
//  subscriber, interleaved repetitions, the medians and their ratio (target: at most 5%
//  cost). Starts and stops its own kvpoolds. Returns 0 or -1 (a missed target is reported,
//  not failed).
int bench_kv_events_run (const char *kvpoold_path, bool quick);

//  ---- samples (bench_values.c) ----------------------------------------------------------

//  A growing list of samples (seconds), for percentiles. Zeroed: empty.
typedef struct {
    double *samples;
    size_t count, capacity;
} bench_series_t;

//  Adds one sample (one lost to a failed allocation only thins the percentile).
void bench_series_add (bench_series_t *self, double seconds);
//  The q quantile (0..1) of the samples, in microseconds (sorts them); NAN when empty.
double bench_series_us (bench_series_t *self, double q);
void bench_series_free (bench_series_t *self);

//  ---- processes (bench_proc.c) ---------------------------------------------------------
//  Every child the bench starts goes through bench_spawn, so an interrupted bench stops them
//  all (bench_on_signal) and a bench that dies takes them with it (PR_SET_PDEATHSIG).

//  Seconds on the monotonic clock.
double bench_now (void);
void bench_sleep_ms (int ms);

//  Starts argv[0] (argv NULL-terminated) with stdin from /dev/null and stdout and stderr going
//  to the file log. Returns its pid, or -1.
pid_t bench_spawn (const char *const *argv, const char *log);

//  SIGTERM, then up to 10 s for the exit, then SIGKILL. Returns the exit status, 128+signal,
//  or -1 if it had to be killed (or was reaped already). 0 for pid <= 0.
int bench_stop (pid_t pid);

//  Waits for the child to exit. Returns its exit status, 128+signal, or -1.
int bench_wait (pid_t pid);

//  Loopback tcp bandwidth, seconds long, by iperf3: a server of its own (-s -1: one test, then
//  it exits) on a free port of 127.0.0.1 and one client stream (-J; its
//  end.sum_received.bits_per_second). Bytes per second, or NAN with the reason in note:
//  iperf3 missing (*failed false), or it ran and gave no figure (*failed true).
double bench_iperf3 (int seconds, char *note, size_t note_size, bool *failed);

//  CPU seconds (user and system, all threads) process pid has used, from /proc (in clock
//  ticks, 10 ms here), or NAN.
double bench_cpu_seconds (pid_t pid);

//  What of this machine changes every figure, for the header: the number of CPUs and, where
//  the kernel says, the CPU idle driver and a virtual machine's guest halt polling (a guest
//  whose idle CPUs halt at once pays tens of microseconds for every wake-up of a thread, on
//  every hop; docs/troubleshooting.md). Writes one line into out.
void bench_machine (char *out, size_t size);

//  Whether the child has exited (then it is reaped).
bool bench_exited (pid_t pid);

//  A loopback tcp port that was free a moment ago (the kernel's pick), for a server that
//  cannot bind port 0 and say which it got; the caller retries if it was taken meanwhile.
//  -1 on failure.
int bench_free_port (void);
//  A "<field>: N kB" line of /proc/<pid>/status (VmRSS, RssShmem...), in bytes; 0 when it
//  cannot be read.
uint64_t bench_proc_status_bytes (pid_t pid, const char *field);

//  A kvpoold the bench started, and what its ready file said.
typedef struct {
    pid_t pid;            //  0 when not running
    char ready_file[256]; //  /tmp/kvpool-bench-PID-NAME.ready
    char log[256];        //  /tmp/kvpool-bench-PID-NAME.log; "" once removed
    char endpoint[256];   //  its tcp client endpoint
    char admin[256];      //  its lookup/reset endpoint
} bench_kvpoold_t;

//  Starts the kvpoold at path on ephemeral loopback ports (client and admin), with the
//  further arguments args (NULL-terminated, may be NULL), and waits up to 20 s for its ready
//  file, then (up to 60 s) while it faults its segments in: the figures are of a settled
//  node. name tells its files apart. Returns 0, or -1 (the reason on stderr; nothing left
//  running).
int bench_kvpoold_start (bench_kvpoold_t *self, const char *path, const char *name,
                         const char *const *args);

//  Whether the kvpoold at path takes option (e.g. "--hot-cache-size"): its --help names it.
//  A previous build given with --kvpoold may not.
bool bench_kvpoold_takes (const char *path, const char *option);

//  Stops it (as bench_stop) and removes its ready file, and its log when it exited with 0
//  and keep_log is false. Returns the exit status, reported on stderr when not 0.
int bench_kvpoold_stop (bench_kvpoold_t *self, bool keep_log);

//  Makes a fresh directory /tmp/kvpool-bench-NAME-XXXXXX (mkdtemp) and copies its path into
//  path. One at a time: bench_scratch_remove removes it with all it holds, and so does
//  bench_on_signal. Returns 0 or -1.
int bench_scratch_new (const char *name, char *path, size_t size);
void bench_scratch_remove (void);

//  The handler for SIGINT and SIGTERM: stops every child (SIGTERM, up to 5 s, then SIGKILL),
//  removes the scratch directory and exits with 128 + signum.
void bench_on_signal (int signum);

//  Values (bench_values.c): a 64-bit mix (splitmix64's finaliser); size bytes that follow
//  from seed (whole 8-byte words; a tail past them is left as it is); whether a buffer holds
//  them.
uint64_t bench_mix (uint64_t x);
void bench_fill (void *buffer, size_t size, uint64_t seed);
bool bench_holds (const void *buffer, size_t size, uint64_t seed);

//  Statistics (bench_values.c): the median of count values (NAN when none; the values are
//  left as they are); the nearest-rank quantile q of count values (NAN when none; sorts them
//  in place).
double bench_median (const double *values, int count);
double bench_quantile (double *values, size_t count, double q);

//  ---- verdicts (bench_verdict.c) ----------------------------------------------------------
//  A section's one-line verdict (where kvpool leads, where it trails, against what), printed
//  above all the tables; a goal (a figure kvpool's issues set for it) printed as "goal met:"
//  or "goal not met:" and the text; a ratio as "1.42x (faster)", "0.89x (slower)" or
//  "1.00x (even)" (within 2%), in buffer (returned); the verdicts printed to out (how many).
void bench_verdict (const char *section, const char *format, ...)
    __attribute__ ((format (printf, 2, 3)));
void bench_goal (bool met, const char *format, ...) __attribute__ ((format (printf, 2, 3)));
const char *bench_ratio (double ratio, char *buffer, size_t size);
size_t bench_verdicts_print (FILE *out);
//  Keeps the standard output aside from now on (0, or -1: it goes on as it comes); the end
//  prints the verdicts, then what was kept. bench_on_signal gives it back (abort).
int bench_detail_begin (void);
void bench_detail_end (void);
void bench_detail_abort (void);

#endif
