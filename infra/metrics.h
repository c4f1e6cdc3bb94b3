/*  metrics.h - the node's counters as Prometheus reads them: what the actors count, kept
    where a scrape can read it without asking any actor anything.

    Three kinds of figures, each with one writer:
    - per client operation (requests, failures, latency histogram) and per transport (value
      bytes in and out): counted by the api as it answers, in relaxed atomics;
    - lookups and the tokens they hit: counted by the lookup server, in atomics;
    - everything STATS reports (kvp_stats_t: objects, bytes, evictions, disk tier, cluster)
      and the segments: a snapshot the collector (infra/metrics_http.c) takes every second
      with a STATS job through the api, under a mutex held only to copy it;
    - on a master (--role master): its nodes and keys, set by the master actor at each of its
      liveness ticks, which are also what /health watches there.
    A scrape (metrics_render) reads the atomics and copies the snapshot: it never waits for
    an actor, so a stalled node still answers /metrics, with a snapshot that ages (its age
    is a metric, and /health says stalled past KVP_METRICS_STALE_MS).

    Metric names follow Prometheus's conventions: the kvpool_ prefix, _total on counters,
    _bytes and _seconds for units. Every name is in one table (metrics.c) from which
    `kvpoold --metrics-markdown` prints docs/metrics.md's table; `make test` fails when the
    two differ.

    Threads: any. Writers are single per figure; readers take the atomics as they are.
*/
#ifndef KVP_METRICS_H_INCLUDED
#define KVP_METRICS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpool.h"
#include "messages/kvp_job.h"

//  Client operations counted: kvpool.v1.Op values below this (PREFIX_MATCH is 25).
#define KVP_METRICS_OPS 32
//  The latency histogram's buckets: the public API's (include/kvpool.h), since clients read
//  them in STATS replies.
#define KVP_METRICS_BUCKETS KVPOOL_LATENCY_BUCKETS
//  Segments the snapshot keeps (the node's own and mounted ones); past it they are summed
//  into the totals only.
#define KVP_METRICS_SEGMENTS 64
//  A snapshot older than this means the api has not answered the collector: stalled.
#define KVP_METRICS_STALE_MS 5000

//  How a request reached the api.
typedef enum {
    KVP_TRANSPORT_INPROC = 0,
    KVP_TRANSPORT_IPC,
    KVP_TRANSPORT_TCP,
    KVP_TRANSPORTS
} kvp_transport_t;

typedef struct _kvp_metrics_t kvp_metrics_t;

//  One operation's counters, as read (metrics_op_read).
typedef struct {
    uint64_t requests, failures, latency_sum_us;
    uint64_t buckets[KVP_METRICS_BUCKETS]; //  not cumulative: each bucket its own calls
} kvp_op_metrics_t;

//  Creates the counters, all zero; role and version go into /health. Caller owns the return
//  value and must destroy it.
kvp_metrics_t *metrics_new (const char *role);
void metrics_destroy (kvp_metrics_t **self_p);

//  The api: a request of op answered with status, latency_us after it came in.
void metrics_request (kvp_metrics_t *self, int op, int status, uint64_t latency_us);
//  The api: value bytes that came in with requests, or went out with replies.
void metrics_bytes_in (kvp_metrics_t *self, kvp_transport_t transport, uint64_t bytes);
void metrics_bytes_out (kvp_metrics_t *self, kvp_transport_t transport, uint64_t bytes);
//  Value bytes in and out, every transport together.
void metrics_bytes_totals (kvp_metrics_t *self, uint64_t *in, uint64_t *out);
//  The lookup server: one lookup answered with hit_tokens tokens.
void metrics_lookup (kvp_metrics_t *self, uint64_t hit_tokens);

//  The master: the nodes it knows (alive of all) and the keys its directory holds, at now_ms
//  (zclock_mono); also the master's sign of life for /health.
void metrics_cluster (kvp_metrics_t *self, uint64_t nodes, uint64_t alive, uint64_t keys,
                      int64_t now_ms);
//  A master's repairs (master/repair.c): replicas lacking, copies taken, their bytes.
void metrics_repair (kvp_metrics_t *self, uint64_t missing, uint64_t done, uint64_t bytes);

//  Reads op's counters (op < KVP_METRICS_OPS).
void metrics_op_read (kvp_metrics_t *self, int op, kvp_op_metrics_t *out);

//  The collector: a fresh STATS result (stats and segments), taken at now_ms (zclock_mono).
void metrics_snapshot (kvp_metrics_t *self, const kvp_stats_t *stats,
                       const kvp_segment_info_t *segments, size_t segment_count, int64_t now_ms);

//  Milliseconds since the last snapshot at now_ms, or -1 when none was taken yet.
int64_t metrics_snapshot_age (kvp_metrics_t *self, int64_t now_ms);

//  The exposition (Prometheus text format 0.0.4) at now_ms. Returns a string the caller
//  owns and frees, or NULL when out of memory; *size_p gets its length.
char *metrics_render (kvp_metrics_t *self, int64_t now_ms, size_t *size_p);

//  /health: a JSON object {status, role, uptime_seconds, version, ...} and whether the node
//  is healthy (status "ok"; "starting" before the first snapshot, "stalled" when it is older
//  than KVP_METRICS_STALE_MS). Returns a string the caller owns, or NULL; *ok_p gets it.
char *metrics_health (kvp_metrics_t *self, int64_t now_ms, bool *ok_p);

//  Prints the metric table as markdown (docs/metrics.md's table, --metrics-markdown).
void metrics_markdown (FILE *out);

void metrics_test (bool verbose);

#endif
