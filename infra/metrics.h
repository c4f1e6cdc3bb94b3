/*  metrics.h - the node's counters as Prometheus reads them: what the actors count, kept
    where a scrape can read it without asking any actor anything.

    Three kinds of figures, each with one writer:
    - per client operation (requests, failures, latency histogram) and per transport (value
      bytes in and out): counted by the api as it answers, in relaxed atomics;
    - lookups and the tokens they hit: counted by the lookup server, in atomics;
    - everything STATS reports (kvp_stats_t: objects, bytes, evictions, disk tier, cluster)
      and the segments: a snapshot the collector (infra/metrics_http.c) takes every second
      with a STATS job through the api, under a mutex held only to copy it;
    - on a master (--role master): its nodes and keys, and the cluster's objects, bytes and
      capacity (kvp_cluster_figures_t), set by the master actor at each of its liveness
      ticks, which are also what /health watches there;
    - on a node (--role node): its link to its master (metrics_link_*), set by the membership
      actor as its master answers or does not: /health says "degraded" while the node is not
      registered or has not heard from its master for longer than its lease.
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

//  What a master knows of its cluster, at each liveness tick.
typedef struct {
    uint64_t nodes, alive; //  nodes it knows, of which alive
    uint64_t keys;         //  directory entries (committed and being written)
    uint64_t objects;      //  committed objects (each once, however many replicas)
    uint64_t used_bytes;   //  live nodes' memory in use, as their heartbeats last said
    uint64_t capacity;     //  live nodes' memory
    //  Filled by the parts of the master that count them; 0 until they do.
    uint64_t replicas_missing; //  replicas objects lack of their replica count (repair's)
    uint64_t repairs_done;     //  replicas made again since the master started (repair's)
    uint64_t repair_bytes;     //  ... their bytes (repair's)
    uint64_t failovers;        //  times this master took over leadership (standby masters')
    uint64_t term;             //  with standby masters: the term it leads, or last led
    bool standby;              //  with standby masters: it does not lead now
} kvp_cluster_figures_t;

//  The master: its figures at now_ms (zclock_mono); also the master's sign of life for
//  /health.
void metrics_cluster (kvp_metrics_t *self, const kvp_cluster_figures_t *figures, int64_t now_ms);

//  A node's link to its master, as /health and STATS (master_connected, master_silence_ms,
//  master_term, master_lease_ms; Reply.master_endpoint) show it. The membership actor is the writer
//  of all but the term.
typedef struct {
    bool node;          //  role node: a link is kept (metrics_link_master was called)
    bool registered;    //  the master registered the node and has not forgotten it since
    bool connected;     //  registered and heard from within the lease
    int64_t silence_ms; //  since the master last answered (or since the start)
    uint64_t term;      //  the leader's term (0: masters without terms)
    uint64_t lease_ms;  //  silence past this is "degraded"
    char endpoint[256]; //  the master the node talks to
    char refused[256];  //  why the master refused the node for good ("" if it did not)
} kvp_master_link_t;

//  The node keeps a link to endpoint; silence past lease_ms (KVP_LEASE_BEATS heartbeats) is
//  degraded. Called at the start and whenever the node follows another master.
void metrics_link_master (kvp_metrics_t *self, const char *endpoint, uint64_t lease_ms,
                          int64_t now_ms);
//  The node follows another master (endpoint) from now on.
void metrics_link_endpoint (kvp_metrics_t *self, const char *endpoint);
//  The master answered at now_ms; registered: whether it knows the node as registered.
void metrics_link_heard (kvp_metrics_t *self, bool registered, int64_t now_ms);
//  The leader's term (for the master client, once masters have terms; 0 until then).
void metrics_link_term (kvp_metrics_t *self, uint64_t term);
//  The master refused the node's identity for good: the node stops (kvpoold exits 1).
void metrics_link_refused (kvp_metrics_t *self, const char *reason);
//  Reads the link at now_ms (all zero and false on a process with none).
void metrics_link_read (kvp_metrics_t *self, int64_t now_ms, kvp_master_link_t *out);
//  The link's figures into a STATS reply (role node; nothing otherwise).
void metrics_link_stats (kvp_metrics_t *self, int64_t now_ms, kvp_stats_t *stats);

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
//  than KVP_METRICS_STALE_MS; a node: "refused" when its master refused its identity,
//  "degraded" when it is not registered with its master or has not heard from it for
//  longer than its lease, with "master": {connected, registered, endpoint, term,
//  silence_seconds}). Returns a string the caller owns, or NULL; *ok_p gets it.
char *metrics_health (kvp_metrics_t *self, int64_t now_ms, bool *ok_p);

//  Prints the metric table as markdown (docs/metrics.md's table, --metrics-markdown).
void metrics_markdown (FILE *out);

void metrics_test (bool verbose);

#endif
