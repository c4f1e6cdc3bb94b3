/*  metrics.c - the node's counters and their Prometheus exposition (metrics.h).

    DESIGN
    The per-operation counters are arrays of relaxed atomics indexed by kvpool.v1.Op: the
    api is their one writer and pays an uncontended atomic add per figure, a scrape reads
    them as they are (a scrape may see a request's count before its latency bucket: Prometheus
    takes counters as monotonic samples, not as a consistent cut).

    The STATS snapshot is a kvp_stats_t (the struct generated from the proto's message Stats,
    one member per field) plus the segments, copied in and out under a mutex; the copy is the
    only thing done under it, so neither side ever waits for long.

    Names. The stats fields map to metrics through s_stat_metrics: a name, whether it is a
    counter, and a scale (milliseconds and microseconds become seconds). The help text is the
    field's comment in the proto (KVPOOL_STATS_FIELDS carries it), so the proto stays the one
    place a figure is described. The self test checks every field has its row.
*/
#include "infra/metrics.h"

#include <assert.h>
#include <czmq.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/contract.h"
#include "protocol/kvpool.pb-c.h"

static const uint64_t s_bounds_us[KVP_METRICS_BUCKETS - 1] = KVPOOL_LATENCY_BOUNDS_US;
static const char *s_transport_names[KVP_TRANSPORTS] = {"inproc", "ipc", "tcp"};

typedef struct {
    atomic_uint_fast64_t requests, failures, latency_sum_us;
    atomic_uint_fast64_t buckets[KVP_METRICS_BUCKETS];
} op_counters_t;

struct _kvp_metrics_t {
    char role[16];
    int64_t started; //  zclock_mono at metrics_new (a master's uptime)
    op_counters_t ops[KVP_METRICS_OPS];
    atomic_uint_fast64_t bytes_in[KVP_TRANSPORTS], bytes_out[KVP_TRANSPORTS];
    atomic_uint_fast64_t lookups, lookup_hit_tokens;
    atomic_uint_fast64_t nodes, nodes_alive, master_keys;
    atomic_int_fast64_t master_beat; //  the master's last tick (zclock_mono); 0: none
    //  A master's view of its cluster (kvp_cluster_figures_t's other members).
    atomic_uint_fast64_t cluster_objects, cluster_used, cluster_capacity;
    atomic_uint_fast64_t replicas_missing, repairs_done, repair_bytes, failovers, term, standby;
    //  A node's link to its master (metrics_link_*); the strings under lock.
    atomic_bool link_node, link_registered;
    atomic_int_fast64_t link_heard; //  zclock_mono of the master's last answer (or the start)
    atomic_uint_fast64_t link_term, link_lease_ms;
    char link_endpoint[256], link_refused[256];
    pthread_mutex_t lock; //  the snapshot's and the link's strings
    bool have_snapshot;
    int64_t snapshot_at;
    kvp_stats_t stats;
    kvp_segment_info_t segments[KVP_METRICS_SEGMENTS];
    size_t segment_count;
};

//  ---- how each stats field is exposed ----------------------------------------------------

typedef struct {
    const char *field;  //  kvp_stats_t's member (the proto field)
    const char *metric; //  the Prometheus name; NULL: served otherwise (its row says how)
    bool counter;       //  only ever grows (while the node runs)
    double scale;       //  multiplies the value (ms and us to seconds)
} stat_metric_t;

static const stat_metric_t s_stat_metrics[] = {
    {"objects", "kvpool_objects", false, 1},
    {"pending_puts", "kvpool_pending_puts", false, 1},
    {"bytes_stored", "kvpool_stored_bytes", false, 1},
    {"bytes_allocated", "kvpool_allocated_bytes", false, 1},
    {"bytes_mounted", "kvpool_capacity_bytes", false, 1},
    {"utilisation", "kvpool_utilisation_ratio", false, 1},
    {"segments", "kvpool_segments", false, 1},
    {"requests", "kvpool_answered_requests_total", true, 1},
    {"errors", "kvpool_error_replies_total", true, 1},
    {"dropped_requests", "kvpool_dropped_requests_total", true, 1},
    {"puts", "kvpool_puts_total", true, 1},
    {"gets", "kvpool_gets_total", true, 1},
    {"get_hits", "kvpool_get_hits_total", true, 1},
    {"removes", "kvpool_removes_total", true, 1},
    {"revoked_puts", "kvpool_revoked_puts_total", true, 1},
    {"max_key_len", "kvpool_max_key_length_bytes", false, 1},
    {"max_value_size", "kvpool_max_value_size_bytes", false, 1},
    {"lease_ttl_ms", "kvpool_lease_ttl_seconds", false, 1e-3},
    {"uptime_ms", "kvpool_uptime_seconds", false, 1e-3},
    {"transfer_workers", "kvpool_transfer_workers", false, 1},
    {"resets", "kvpool_resets_total", true, 1},
    {"index_gets", "kvpool_index_gets_total", true, 1},
    {"evictions", "kvpool_evictions_total", true, 1},
    {"evicted_bytes", "kvpool_evicted_bytes_total", true, 1},
    {"evictions_dropped", "kvpool_evictions_dropped_total", true, 1},
    {"evict_skipped", "kvpool_evict_skipped_total", true, 1},
    {"evict_forced", "kvpool_evict_forced_total", true, 1},
    {"evict_blocked", "kvpool_evict_blocked_total", true, 1},
    {"eviction_cycles", "kvpool_eviction_cycles_total", true, 1},
    {"eviction_stalls", "kvpool_eviction_stalls_total", true, 1},
    {"offloads", "kvpool_offloads_total", true, 1},
    {"offloaded_bytes", "kvpool_offloaded_bytes_total", true, 1},
    {"offload_queue", "kvpool_offload_queue", false, 1},
    {"offload_failures", "kvpool_offload_failures_total", true, 1},
    {"disk_objects", "kvpool_disk_objects", false, 1},
    {"disk_bytes", "kvpool_disk_used_bytes", false, 1},
    {"disk_capacity", "kvpool_disk_capacity_bytes", false, 1},
    {"disk_hits", "kvpool_disk_hits_total", true, 1},
    {"disk_drops", "kvpool_disk_drops_total", true, 1},
    {"disk_corrupt", "kvpool_disk_corrupt_total", true, 1},
    {"promotions", "kvpool_promotions_total", true, 1},
    {"eviction_walk_us", "kvpool_eviction_walk_seconds", false, 1e-6},
    {"eviction_walk_max_us", "kvpool_eviction_walk_max_seconds", false, 1e-6},
    {"remote_gets", "kvpool_remote_gets_total", true, 1},
    {"remote_get_bytes", "kvpool_remote_get_bytes_total", true, 1},
    {"redirects", "kvpool_redirects_total", true, 1},
    {"remote_puts", "kvpool_remote_puts_total", true, 1},
    {"cluster_failures", "kvpool_cluster_failures_total", true, 1},
    {"remote_put_parts", "kvpool_remote_put_parts_total", true, 1},
    {"remote_get_parts", "kvpool_remote_get_parts_total", true, 1},
    {"rdma_transfers", "kvpool_rdma_transfers_total", true, 1},
    {"kv_events", "kvpool_kv_events_total", true, 1},
    {"kv_events_dropped", "kvpool_kv_events_dropped_total", true, 1},
    {"connections", "kvpool_client_connections", false, 1},
    //  Served per transport as kvpool_value_bytes_total (s_render_traffic).
    {"value_bytes_in", NULL, true, 1},
    {"value_bytes_out", NULL, true, 1},
    {"pinned_objects", "kvpool_pinned_objects", false, 1},
    {"leased_objects", "kvpool_leased_objects", false, 1},
    {"checksum_failures", "kvpool_checksum_failures_total", true, 1},
    {"client_gets", "kvpool_client_gets_total", true, 1},
    {"hot_cache_hits", "kvpool_hot_cache_hits_total", true, 1},
    {"hot_cache_misses", "kvpool_hot_cache_misses_total", true, 1},
    {"hot_cache_bytes", "kvpool_hot_cache_bytes", false, 1},
    {"hot_cache_admissions", "kvpool_hot_cache_admissions_total", true, 1},
    {"hot_cache_evictions", "kvpool_hot_cache_evictions_total", true, 1},
    {"hot_cache_invalidations", "kvpool_hot_cache_invalidations_total", true, 1},
    {"master_requests", "kvpool_master_requests_total", true, 1},
    {"location_hits", "kvpool_location_hits_total", true, 1},
    {"master_connected", "kvpool_master_connected", false, 1},
    {"master_silence_ms", "kvpool_master_silence_seconds", false, 1e-3},
    {"master_term", "kvpool_master_term", false, 1},
    {"master_lease_ms", "kvpool_master_lease_seconds", false, 1e-3},
    {"repairs_done", "kvpool_repairs_copied_total", true, 1},
    {"repair_bytes", "kvpool_repair_copied_bytes_total", true, 1},
    {"puts_under_replicated", "kvpool_puts_under_replicated_total", true, 1},
};
#define STAT_METRICS (sizeof s_stat_metrics / sizeof s_stat_metrics[0])

typedef enum { F_U64, F_U32, F_I64, F_I32, F_DOUBLE, F_BOOL } field_type_t;

typedef struct {
    const char *name;
    size_t offset;
    field_type_t type;
    const char *text;
} stat_field_t;

#define S_FIELD_ROW(type, name, text)                                                              \
    {#name, offsetof (kvp_stats_t, name),                                                          \
     _Generic(((kvp_stats_t *) 0)->name, double                                                    \
              : F_DOUBLE, uint32_t                                                                 \
              : F_U32, int64_t                                                                     \
              : F_I64, int32_t                                                                     \
              : F_I32, bool                                                                        \
              : F_BOOL, default                                                                    \
              : F_U64),                                                                            \
     text},
static const stat_field_t s_fields[] = {KVPOOL_STATS_FIELDS (S_FIELD_ROW)};
#undef S_FIELD_ROW
#define STAT_FIELDS (sizeof s_fields / sizeof s_fields[0])

static double
s_field_value (const kvp_stats_t *stats, const stat_field_t *field)
{
    const char *at = (const char *) stats + field->offset;
    union {
        uint64_t u64;
        uint32_t u32;
        int64_t i64;
        int32_t i32;
        double f64;
        bool b;
    } value = {0};
    switch (field->type) {
        case F_U32: memcpy (&value.u32, at, sizeof value.u32); return (double) value.u32;
        case F_I64: memcpy (&value.i64, at, sizeof value.i64); return (double) value.i64;
        case F_I32: memcpy (&value.i32, at, sizeof value.i32); return (double) value.i32;
        case F_DOUBLE: memcpy (&value.f64, at, sizeof value.f64); return value.f64;
        case F_BOOL: memcpy (&value.b, at, sizeof value.b); return value.b ? 1 : 0;
        default: memcpy (&value.u64, at, sizeof value.u64); return (double) value.u64;
    }
}

static const stat_metric_t *
s_metric_of (const char *field)
{
    for (size_t i = 0; i < STAT_METRICS; i++)
        if (!strcmp (s_stat_metrics[i].field, field))
            return &s_stat_metrics[i];
    return NULL;
}

//  ---- counting ------------------------------------------------------------------------------

kvp_metrics_t *
metrics_new (const char *role)
{
    kvp_metrics_t *self = (kvp_metrics_t *) calloc (1, sizeof (kvp_metrics_t));
    if (!self)
        return NULL;
    snprintf (self->role, sizeof self->role, "%s", role ? role : "all");
    self->started = zclock_mono ();
    pthread_mutex_init (&self->lock, NULL);
    return self;
}

void
metrics_destroy (kvp_metrics_t **self_p)
{
    if (self_p && *self_p) {
        pthread_mutex_destroy (&(*self_p)->lock);
        free (*self_p);
        *self_p = NULL;
    }
}

static inline void
s_add (atomic_uint_fast64_t *counter, uint64_t n)
{
    atomic_fetch_add_explicit (counter, n, memory_order_relaxed);
}

static inline uint64_t
s_get (atomic_uint_fast64_t *counter)
{
    return atomic_load_explicit (counter, memory_order_relaxed);
}

void
metrics_request (kvp_metrics_t *self, int op, int status, uint64_t latency_us)
{
    if (!self || op < 0 || op >= KVP_METRICS_OPS)
        return;
    op_counters_t *counters = &self->ops[op];
    s_add (&counters->requests, 1);
    if (status != 0)
        s_add (&counters->failures, 1);
    s_add (&counters->latency_sum_us, latency_us);
    size_t bucket = 0;
    while (bucket < KVP_METRICS_BUCKETS - 1 && latency_us > s_bounds_us[bucket])
        bucket++;
    s_add (&counters->buckets[bucket], 1);
}

void
metrics_bytes_in (kvp_metrics_t *self, kvp_transport_t transport, uint64_t bytes)
{
    if (self && transport < KVP_TRANSPORTS && bytes)
        s_add (&self->bytes_in[transport], bytes);
}

void
metrics_bytes_out (kvp_metrics_t *self, kvp_transport_t transport, uint64_t bytes)
{
    if (self && transport < KVP_TRANSPORTS && bytes)
        s_add (&self->bytes_out[transport], bytes);
}

void
metrics_lookup (kvp_metrics_t *self, uint64_t hit_tokens)
{
    if (!self)
        return;
    s_add (&self->lookups, 1);
    s_add (&self->lookup_hit_tokens, hit_tokens);
}

void
metrics_bytes_totals (kvp_metrics_t *self, uint64_t *in, uint64_t *out)
{
    *in = *out = 0;
    for (int t = 0; self && t < KVP_TRANSPORTS; t++) {
        *in += s_get (&self->bytes_in[t]);
        *out += s_get (&self->bytes_out[t]);
    }
}

static inline void
s_set (atomic_uint_fast64_t *figure, uint64_t value)
{
    atomic_store_explicit (figure, value, memory_order_relaxed);
}

void
metrics_cluster (kvp_metrics_t *self, const kvp_cluster_figures_t *figures, int64_t now_ms)
{
    if (!self)
        return;
    s_set (&self->nodes, figures->nodes);
    s_set (&self->nodes_alive, figures->alive);
    s_set (&self->master_keys, figures->keys);
    s_set (&self->cluster_objects, figures->objects);
    s_set (&self->cluster_used, figures->used_bytes);
    s_set (&self->cluster_capacity, figures->capacity);
    s_set (&self->replicas_missing, figures->replicas_missing);
    s_set (&self->repairs_done, figures->repairs_done);
    s_set (&self->repair_bytes, figures->repair_bytes);
    s_set (&self->failovers, figures->failovers);
    s_set (&self->term, figures->term);
    s_set (&self->standby, figures->standby);
    atomic_store_explicit (&self->master_beat, now_ms ? now_ms : 1, memory_order_relaxed);
}

//  ---- a node's link to its master -----------------------------------------------------------

void
metrics_link_master (kvp_metrics_t *self, const char *endpoint, uint64_t lease_ms, int64_t now_ms)
{
    if (!self)
        return;
    pthread_mutex_lock (&self->lock);
    snprintf (self->link_endpoint, sizeof self->link_endpoint, "%s", endpoint ? endpoint : "");
    pthread_mutex_unlock (&self->lock);
    s_set (&self->link_lease_ms, lease_ms);
    atomic_store (&self->link_registered, false);
    atomic_store (&self->link_heard, now_ms);
    atomic_store (&self->link_node, true);
}

void
metrics_link_endpoint (kvp_metrics_t *self, const char *endpoint)
{
    if (!self)
        return;
    pthread_mutex_lock (&self->lock);
    snprintf (self->link_endpoint, sizeof self->link_endpoint, "%s", endpoint ? endpoint : "");
    pthread_mutex_unlock (&self->lock);
}

void
metrics_link_heard (kvp_metrics_t *self, bool registered, int64_t now_ms)
{
    if (!self)
        return;
    atomic_store (&self->link_registered, registered);
    atomic_store (&self->link_heard, now_ms);
}

void
metrics_link_term (kvp_metrics_t *self, uint64_t term)
{
    if (self)
        s_set (&self->link_term, term);
}

void
metrics_link_refused (kvp_metrics_t *self, const char *reason)
{
    if (!self)
        return;
    pthread_mutex_lock (&self->lock);
    snprintf (self->link_refused, sizeof self->link_refused, "%s",
              reason && *reason ? reason : "refused");
    pthread_mutex_unlock (&self->lock);
    atomic_store (&self->link_registered, false);
}

void
metrics_link_read (kvp_metrics_t *self, int64_t now_ms, kvp_master_link_t *out)
{
    memset (out, 0, sizeof *out);
    if (!self || !atomic_load (&self->link_node))
        return;
    out->node = true;
    out->registered = atomic_load (&self->link_registered);
    out->silence_ms = now_ms - atomic_load (&self->link_heard);
    if (out->silence_ms < 0)
        out->silence_ms = 0;
    out->term = s_get (&self->link_term);
    out->lease_ms = s_get (&self->link_lease_ms);
    pthread_mutex_lock (&self->lock);
    memcpy (out->endpoint, self->link_endpoint, sizeof out->endpoint);
    memcpy (out->refused, self->link_refused, sizeof out->refused);
    pthread_mutex_unlock (&self->lock);
    out->connected =
        out->registered && !out->refused[0] && (uint64_t) out->silence_ms <= out->lease_ms;
}

void
metrics_link_stats (kvp_metrics_t *self, int64_t now_ms, kvp_stats_t *stats)
{
    kvp_master_link_t link;
    metrics_link_read (self, now_ms, &link);
    if (!link.node)
        return;
    stats->master_connected = link.connected ? 1 : 0;
    stats->master_silence_ms = (uint64_t) link.silence_ms;
    stats->master_term = link.term;
    stats->master_lease_ms = link.lease_ms;
}

static bool
s_is_master (const kvp_metrics_t *self)
{
    return !strcmp (self->role, "master");
}

void
metrics_op_read (kvp_metrics_t *self, int op, kvp_op_metrics_t *out)
{
    memset (out, 0, sizeof *out);
    if (!self || op < 0 || op >= KVP_METRICS_OPS)
        return;
    op_counters_t *counters = &self->ops[op];
    out->requests = s_get (&counters->requests);
    out->failures = s_get (&counters->failures);
    out->latency_sum_us = s_get (&counters->latency_sum_us);
    for (size_t b = 0; b < KVP_METRICS_BUCKETS; b++)
        out->buckets[b] = s_get (&counters->buckets[b]);
}

void
metrics_snapshot (kvp_metrics_t *self, const kvp_stats_t *stats, const kvp_segment_info_t *segments,
                  size_t segment_count, int64_t now_ms)
{
    if (!self)
        return;
    size_t kept = segment_count < KVP_METRICS_SEGMENTS ? segment_count : KVP_METRICS_SEGMENTS;
    pthread_mutex_lock (&self->lock);
    self->stats = *stats;
    if (kept)
        memcpy (self->segments, segments, kept * sizeof *segments);
    self->segment_count = kept;
    self->snapshot_at = now_ms;
    self->have_snapshot = true;
    pthread_mutex_unlock (&self->lock);
}

int64_t
metrics_snapshot_age (kvp_metrics_t *self, int64_t now_ms)
{
    pthread_mutex_lock (&self->lock);
    int64_t age = self->have_snapshot ? now_ms - self->snapshot_at : -1;
    pthread_mutex_unlock (&self->lock);
    return age;
}

//  ---- the exposition ------------------------------------------------------------------------

//  A label value as the text format wants it: backslash, double quote and newline escaped.
static void
s_label (FILE *out, const char *value)
{
    for (const char *c = value; *c; c++) {
        if (*c == '\\' || *c == '"')
            fprintf (out, "\\%c", *c);
        else if (*c == '\n')
            fputs ("\\n", out);
        else
            fputc (*c, out);
    }
}

static void
s_header (FILE *out, const char *name, const char *type, const char *help)
{
    fprintf (out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void
s_render_ops (kvp_metrics_t *self, FILE *out)
{
    s_header (out, "kvpool_requests_total", "counter",
              "client requests answered, by operation (kvpool.v1.Op)");
    kvp_op_metrics_t ops[KVP_METRICS_OPS];
    for (int op = 0; op < KVP_METRICS_OPS; op++)
        metrics_op_read (self, op, &ops[op]);
    const ProtobufCEnumDescriptor *names = &kvpool__v1__op__descriptor;
    for (int op = 0; op < KVP_METRICS_OPS; op++) {
        const ProtobufCEnumValue *value = protobuf_c_enum_descriptor_get_value (names, op);
        if (value && ops[op].requests)
            fprintf (out, "kvpool_requests_total{op=\"%s\"} %" PRIu64 "\n", value->name,
                     ops[op].requests);
    }
    s_header (out, "kvpool_request_failures_total", "counter",
              "client requests answered with a request-level error, by operation (a key "
              "not found is a miss, not a failure)");
    for (int op = 0; op < KVP_METRICS_OPS; op++) {
        const ProtobufCEnumValue *value = protobuf_c_enum_descriptor_get_value (names, op);
        if (value && ops[op].requests)
            fprintf (out, "kvpool_request_failures_total{op=\"%s\"} %" PRIu64 "\n", value->name,
                     ops[op].failures);
    }
    s_header (out, "kvpool_request_duration_seconds", "histogram",
              "time from a request's arrival at the api to its reply, by operation");
    for (int op = 0; op < KVP_METRICS_OPS; op++) {
        const ProtobufCEnumValue *value = protobuf_c_enum_descriptor_get_value (names, op);
        if (!value || !ops[op].requests)
            continue;
        uint64_t cumulative = 0;
        for (size_t b = 0; b < KVP_METRICS_BUCKETS; b++) {
            cumulative += ops[op].buckets[b];
            if (b < KVP_METRICS_BUCKETS - 1)
                fprintf (out,
                         "kvpool_request_duration_seconds_bucket{op=\"%s\",le=\"%g\"} %" PRIu64
                         "\n",
                         value->name, (double) s_bounds_us[b] / 1e6, cumulative);
            else
                fprintf (out,
                         "kvpool_request_duration_seconds_bucket{op=\"%s\",le=\"+Inf\"} %" PRIu64
                         "\n",
                         value->name, cumulative);
        }
        fprintf (out, "kvpool_request_duration_seconds_sum{op=\"%s\"} %.6f\n", value->name,
                 (double) ops[op].latency_sum_us / 1e6);
        fprintf (out, "kvpool_request_duration_seconds_count{op=\"%s\"} %" PRIu64 "\n", value->name,
                 cumulative);
    }
}

static void
s_render_traffic (kvp_metrics_t *self, FILE *out)
{
    s_header (out, "kvpool_value_bytes_total", "counter",
              "value bytes received with requests (in) and sent with replies (out), by the "
              "transport the client came over");
    for (int t = 0; t < KVP_TRANSPORTS; t++) {
        fprintf (out, "kvpool_value_bytes_total{transport=\"%s\",direction=\"in\"} %" PRIu64 "\n",
                 s_transport_names[t], s_get (&self->bytes_in[t]));
        fprintf (out, "kvpool_value_bytes_total{transport=\"%s\",direction=\"out\"} %" PRIu64 "\n",
                 s_transport_names[t], s_get (&self->bytes_out[t]));
    }
    s_header (out, "kvpool_lookups_total", "counter",
              "lookups answered on the lookup/reset channel");
    fprintf (out, "kvpool_lookups_total %" PRIu64 "\n", s_get (&self->lookups));
    s_header (out, "kvpool_lookup_hit_tokens_total", "counter",
              "tokens the lookups answered as stored");
    fprintf (out, "kvpool_lookup_hit_tokens_total %" PRIu64 "\n", s_get (&self->lookup_hit_tokens));
}

static void
s_render_snapshot (kvp_metrics_t *self, FILE *out, int64_t now_ms)
{
    kvp_stats_t stats;
    memset (&stats, 0, sizeof stats);
    kvp_segment_info_t *segments =
        (kvp_segment_info_t *) malloc (KVP_METRICS_SEGMENTS * sizeof (kvp_segment_info_t));
    pthread_mutex_lock (&self->lock);
    bool have = self->have_snapshot;
    int64_t age = now_ms - self->snapshot_at;
    stats = self->stats;
    size_t count = segments ? self->segment_count : 0;
    if (count)
        memcpy (segments, self->segments, count * sizeof *segments);
    pthread_mutex_unlock (&self->lock);
    s_header (out, "kvpool_stats_age_seconds", "gauge",
              "age of the node's statistics below (taken every second through the api; a "
              "growing age means the api does not answer)");
    fprintf (out, "kvpool_stats_age_seconds %.3f\n", have ? (double) age / 1e3 : -1.0);
    if (have) {
        for (size_t i = 0; i < STAT_FIELDS; i++) {
            const stat_metric_t *metric = s_metric_of (s_fields[i].name);
            if (!metric || !metric->metric)
                continue;
            s_header (out, metric->metric, metric->counter ? "counter" : "gauge", s_fields[i].text);
            fprintf (out, "%s %.17g\n", metric->metric,
                     s_field_value (&stats, &s_fields[i]) * metric->scale);
        }
        s_header (out, "kvpool_segment_capacity_bytes", "gauge",
                  "bytes of each segment (the node's own and those clients mounted)");
        for (size_t i = 0; i < count; i++) {
            fprintf (out, "kvpool_segment_capacity_bytes{segment=\"%u\",name=\"", segments[i].id);
            s_label (out, segments[i].name);
            fprintf (out, "\",owner=\"");
            s_label (out, segments[i].owner);
            fprintf (out, "\"} %" PRIu64 "\n", segments[i].size);
        }
        s_header (out, "kvpool_segment_used_bytes", "gauge", "bytes in use in each segment");
        for (size_t i = 0; i < count; i++) {
            fprintf (out, "kvpool_segment_used_bytes{segment=\"%u\",name=\"", segments[i].id);
            s_label (out, segments[i].name);
            fprintf (out, "\",owner=\"");
            s_label (out, segments[i].owner);
            fprintf (out, "\"} %" PRIu64 "\n", segments[i].used);
        }
    }
    free (segments);
}

char *
metrics_render (kvp_metrics_t *self, int64_t now_ms, size_t *size_p)
{
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream (&text, &size);
    if (!out)
        return NULL;
    s_header (out, "kvpool_info", "gauge", "the node: its role and version (always 1)");
    fprintf (out, "kvpool_info{role=\"%s\",version=\"%s\"} 1\n", self->role, KVP_VERSION);
    if (s_is_master (self)) {
        //  A master serves no clients: its nodes and the keys it places.
        int64_t beat = atomic_load_explicit (&self->master_beat, memory_order_relaxed);
        s_header (out, "kvpool_master_tick_age_seconds", "gauge",
                  "since the master last checked its nodes' liveness (it does every 50 ms)");
        fprintf (out, "kvpool_master_tick_age_seconds %.3f\n",
                 beat ? (double) (now_ms - beat) / 1e3 : -1.0);
        uint64_t nodes = s_get (&self->nodes), alive = s_get (&self->nodes_alive);
        s_header (out, "kvpool_cluster_nodes", "gauge",
                  "nodes the master knows, alive (heard within --node-ttl) and dead");
        fprintf (out, "kvpool_cluster_nodes{state=\"alive\"} %" PRIu64 "\n", alive);
        fprintf (out, "kvpool_cluster_nodes{state=\"dead\"} %" PRIu64 "\n",
                 nodes >= alive ? nodes - alive : 0);
        s_header (out, "kvpool_cluster_keys", "gauge",
                  "keys in the master's directory (committed and being written)");
        fprintf (out, "kvpool_cluster_keys %" PRIu64 "\n", s_get (&self->master_keys));
        //  The cluster as one store: what /health says too.
        const struct {
            const char *name, *type, *help;
            atomic_uint_fast64_t *value;
        } figures[] = {
            {"kvpool_cluster_objects", "gauge",
             "committed objects in the cluster (each once, whatever its replicas)",
             &self->cluster_objects},
            {"kvpool_cluster_used_bytes", "gauge",
             "memory in use on the live nodes, as their last heartbeats said", &self->cluster_used},
            {"kvpool_cluster_capacity_bytes", "gauge", "memory the live nodes contribute",
             &self->cluster_capacity},
            {"kvpool_cluster_replicas_missing", "gauge",
             "replicas objects lack of the count they were put with", &self->replicas_missing},
            {"kvpool_cluster_repairs_total", "counter",
             "replicas made again since this master started", &self->repairs_done},
            {"kvpool_cluster_repair_bytes_total", "counter", "bytes of the replicas made again",
             &self->repair_bytes},
            {"kvpool_master_failovers_total", "counter", "times this master took over leadership",
             &self->failovers},
            {"kvpool_master_term", "gauge",
             "the leader term this master leads or last led (standby masters; 0: alone)",
             &self->term},
            {"kvpool_master_standby", "gauge", "1 while this master stands by (does not lead)",
             &self->standby},
        };
        for (size_t i = 0; i < sizeof figures / sizeof figures[0]; i++) {
            s_header (out, figures[i].name, figures[i].type, figures[i].help);
            fprintf (out, "%s %" PRIu64 "\n", figures[i].name, s_get (figures[i].value));
        }
    }
    else {
        s_render_ops (self, out);
        s_render_traffic (self, out);
        s_render_snapshot (self, out, now_ms);
    }
    if (fclose (out) != 0) {
        free (text);
        return NULL;
    }
    *size_p = size;
    return text;
}

//  text as a JSON string, quotes included (control characters dropped).
static void
s_json_string (const char *text, char *out, size_t size)
{
    size_t n = 0;
    out[n++] = '"';
    for (const char *c = text; *c && n + 3 < size; c++) {
        if ((unsigned char) *c < 0x20)
            continue;
        if (*c == '"' || *c == '\\')
            out[n++] = '\\';
        out[n++] = *c;
    }
    out[n++] = '"';
    out[n] = 0;
}

char *
metrics_health (kvp_metrics_t *self, int64_t now_ms, bool *ok_p)
{
    pthread_mutex_lock (&self->lock);
    bool have = self->have_snapshot;
    int64_t age = now_ms - self->snapshot_at;
    kvp_stats_t stats = self->stats;
    pthread_mutex_unlock (&self->lock);
    char extra[1400] = "";
    if (s_is_master (self)) {
        //  A master's life is its liveness tick; its figures are the cluster's.
        int64_t beat = atomic_load_explicit (&self->master_beat, memory_order_relaxed);
        have = beat != 0;
        age = now_ms - beat;
        stats.uptime_ms = (uint64_t) (now_ms - self->started);
        stats.objects = s_get (&self->cluster_objects);
        stats.bytes_stored = s_get (&self->cluster_used);
        stats.bytes_mounted = s_get (&self->cluster_capacity);
        snprintf (extra, sizeof extra,
                  ",\"nodes\":%" PRIu64 ",\"nodes_alive\":%" PRIu64 ",\"keys\":%" PRIu64
                  ",\"replicas_missing\":%" PRIu64 ",\"repairs_done\":%" PRIu64
                  ",\"failovers\":%" PRIu64 ",\"term\":%" PRIu64 ",\"leads\":%s",
                  s_get (&self->nodes), s_get (&self->nodes_alive), s_get (&self->master_keys),
                  s_get (&self->replicas_missing), s_get (&self->repairs_done),
                  s_get (&self->failovers), s_get (&self->term),
                  s_get (&self->standby) ? "false" : "true");
    }
    const char *status = !have ? "starting" : age > KVP_METRICS_STALE_MS ? "stalled" : "ok";
    *ok_p = have && age <= KVP_METRICS_STALE_MS;
    kvp_master_link_t link;
    metrics_link_read (self, now_ms, &link);
    if (link.node) {
        //  A node cut off from its master serves what it holds, but no put, nor any key
        //  another node holds: degraded (503, so that a load balancer sends its clients to
        //  another node). Refused: it stops.
        if (*ok_p && (link.refused[0] || !link.connected)) {
            status = link.refused[0] ? "refused" : "degraded";
            *ok_p = false;
        }
        char endpoint[600], refused[600];
        s_json_string (link.endpoint, endpoint, sizeof endpoint);
        s_json_string (link.refused, refused, sizeof refused);
        snprintf (extra, sizeof extra,
                  ",\"master\":{\"connected\":%s,\"registered\":%s,\"endpoint\":%s,"
                  "\"term\":%" PRIu64 ",\"silence_seconds\":%.3f,\"lease_seconds\":%.3f%s%s}",
                  link.connected ? "true" : "false", link.registered ? "true" : "false", endpoint,
                  link.term, (double) link.silence_ms / 1e3, (double) link.lease_ms / 1e3,
                  link.refused[0] ? ",\"refused\":" : "", link.refused[0] ? refused : "");
    }
    char *text = NULL;
    if (asprintf (&text,
                  "{\"status\":\"%s\",\"role\":\"%s\",\"version\":\"%s\",\"uptime_seconds\":%.3f,"
                  "\"stats_age_seconds\":%.3f,\"objects\":%" PRIu64 ",\"stored_bytes\":%" PRIu64
                  ",\"capacity_bytes\":%" PRIu64 ",\"segments\":%u%s}\n",
                  status, self->role, KVP_VERSION, (double) stats.uptime_ms / 1e3,
                  have ? (double) age / 1e3 : -1.0, stats.objects, stats.bytes_stored,
                  stats.bytes_mounted, stats.segments, extra)
        < 0)
        return NULL;
    return text;
}

void
metrics_markdown (FILE *out)
{
    fprintf (out, "| metric | type | labels | meaning |\n|---|---|---|---|\n");
    fprintf (out, "| `kvpool_info` | gauge | role, version | the node (always 1) |\n");
    fprintf (out, "| `kvpool_requests_total` | counter | op | client requests answered |\n");
    fprintf (out, "| `kvpool_request_failures_total` | counter | op | client requests answered "
                  "with a request-level error (a key not found is a miss, not a failure) |\n");
    fprintf (out, "| `kvpool_request_duration_seconds` | histogram | op | from a request's "
                  "arrival at the api to its reply (buckets 10 us to 5 s) |\n");
    fprintf (out, "| `kvpool_value_bytes_total` | counter | transport (tcp, ipc, inproc), "
                  "direction (in, out) | value bytes with requests and replies |\n");
    fprintf (out, "| `kvpool_lookups_total` | counter | | lookups on the lookup/reset channel |\n");
    fprintf (out, "| `kvpool_lookup_hit_tokens_total` | counter | | tokens those lookups "
                  "answered as stored |\n");
    fprintf (out, "| `kvpool_stats_age_seconds` | gauge | | age of the statistics below "
                  "(taken every second) |\n");
    for (size_t i = 0; i < STAT_FIELDS; i++) {
        const stat_metric_t *metric = s_metric_of (s_fields[i].name);
        if (metric && metric->metric)
            fprintf (out, "| `%s` | %s | | %s%s |\n", metric->metric,
                     metric->counter ? "counter" : "gauge", s_fields[i].text,
                     metric->scale != 1 ? " (in seconds)" : "");
    }
    fprintf (out, "| `kvpool_segment_capacity_bytes` | gauge | segment, name, owner | bytes "
                  "of each segment |\n");
    fprintf (out, "| `kvpool_segment_used_bytes` | gauge | segment, name, owner | bytes in use "
                  "in each segment |\n");
    fprintf (out, "| `kvpool_cluster_nodes` | gauge | state (alive, dead) | a master's: the "
                  "nodes it knows |\n");
    fprintf (out, "| `kvpool_cluster_keys` | gauge | | a master's: keys in its directory |\n");
    fprintf (out, "| `kvpool_master_tick_age_seconds` | gauge | | a master's: since its last "
                  "liveness tick (every 50 ms; /health says stalled past 5 s) |\n");
    fprintf (out, "| `kvpool_cluster_objects` | gauge | | a master's: committed objects in the "
                  "cluster, each once |\n");
    fprintf (out, "| `kvpool_cluster_used_bytes` | gauge | | a master's: memory in use on the "
                  "live nodes, as their last heartbeats said |\n");
    fprintf (out, "| `kvpool_cluster_capacity_bytes` | gauge | | a master's: memory the live "
                  "nodes contribute |\n");
    fprintf (out, "| `kvpool_cluster_replicas_missing` | gauge | | a master's: replicas objects "
                  "lack of the count they were put with (fewer live ones that are not "
                  "draining: master/repair.c) |\n");
    fprintf (out, "| `kvpool_cluster_repairs_total` | counter | | a master's: replicas made "
                  "again since it started |\n");
    fprintf (out, "| `kvpool_cluster_repair_bytes_total` | counter | | a master's: their "
                  "bytes |\n");
    fprintf (out, "| `kvpool_master_failovers_total` | counter | | a master's: times it took "
                  "over leadership (standby masters: --ha) |\n");
    fprintf (out, "| `kvpool_master_term` | gauge | | a master's: the leader term it leads or "
                  "last led (--ha; 0: alone) |\n");
    fprintf (out, "| `kvpool_master_standby` | gauge | | a master's: 1 while it stands by, "
                  "another leading (--ha) |\n");
}

//  ---- self test -----------------------------------------------------------------------------

void
metrics_test (bool verbose)
{
    //  Every stats field has its metric, and no two metrics share a name.
    for (size_t i = 0; i < STAT_FIELDS; i++) {
        if (!s_metric_of (s_fields[i].name))
            fprintf (stderr, "metrics: stats field %s has no metric\n", s_fields[i].name);
        assert (s_metric_of (s_fields[i].name));
    }
    assert (STAT_METRICS == STAT_FIELDS);
    for (size_t i = 0; i < STAT_METRICS; i++)
        for (size_t j = i + 1; j < STAT_METRICS; j++)
            assert (!s_stat_metrics[i].metric || !s_stat_metrics[j].metric
                    || strcmp (s_stat_metrics[i].metric, s_stat_metrics[j].metric));

    kvp_metrics_t *metrics = metrics_new ("all");
    assert (metrics);
    bool ok = true;
    char *health = metrics_health (metrics, 1000, &ok);
    assert (health && !ok && strstr (health, "\"status\":\"starting\""));
    free (health);
    metrics_request (metrics, KVPOOL__V1__OP__PUT, 0, 7);      //  the first bucket
    metrics_request (metrics, KVPOOL__V1__OP__PUT, -400, 300); //  <= 500 us
    metrics_request (metrics, KVPOOL__V1__OP__PUT, 0, 9000000);
    metrics_request (metrics, 99, 0, 1); //  not an op: ignored
    metrics_bytes_in (metrics, KVP_TRANSPORT_TCP, 4096);
    metrics_lookup (metrics, 32);
    kvp_op_metrics_t put;
    metrics_op_read (metrics, KVPOOL__V1__OP__PUT, &put);
    assert (put.requests == 3 && put.failures == 1 && put.latency_sum_us == 9000307);
    assert (put.buckets[0] == 1 && put.buckets[5] == 1
            && put.buckets[KVP_METRICS_BUCKETS - 1] == 1);

    kvp_stats_t stats;
    memset (&stats, 0, sizeof stats);
    stats.objects = 12;
    stats.uptime_ms = 2500;
    stats.evictions = 3;
    kvp_segment_info_t segment = {.id = 1, .size = 1 << 20, .used = 4096};
    snprintf (segment.name, sizeof segment.name, "/kvpool-\"x\"");
    metrics_snapshot (metrics, &stats, &segment, 1, 2000);
    assert (metrics_snapshot_age (metrics, 2500) == 500);
    size_t size = 0;
    char *text = metrics_render (metrics, 2500, &size);
    assert (text && size == strlen (text));
    assert (strstr (text, "kvpool_requests_total{op=\"PUT\"} 3\n"));
    assert (strstr (text, "kvpool_request_failures_total{op=\"PUT\"} 1\n"));
    assert (strstr (text, "kvpool_request_duration_seconds_bucket{op=\"PUT\",le=\"1e-05\"} 1\n"));
    assert (strstr (text, "kvpool_request_duration_seconds_bucket{op=\"PUT\",le=\"+Inf\"} 3\n"));
    assert (strstr (text, "kvpool_request_duration_seconds_count{op=\"PUT\"} 3\n"));
    assert (!strstr (text, "op=\"GET\"")); //  operations never asked about are left out
    assert (strstr (text, "kvpool_value_bytes_total{transport=\"tcp\",direction=\"in\"} 4096\n"));
    assert (strstr (text, "kvpool_lookup_hit_tokens_total 32\n"));
    assert (strstr (text, "# TYPE kvpool_evictions_total counter\nkvpool_evictions_total 3\n"));
    assert (strstr (text, "kvpool_objects 12\n"));
    assert (strstr (text, "kvpool_uptime_seconds 2.5\n"));
    assert (strstr (text, "name=\"/kvpool-\\\"x\\\"\""));
    assert (strstr (text, "kvpool_segment_used_bytes{segment=\"1\""));
    if (verbose)
        printf ("\n%s", text);
    free (text);
    health = metrics_health (metrics, 2500, &ok);
    assert (health && ok && strstr (health, "\"status\":\"ok\"")
            && strstr (health, "\"objects\":12"));
    free (health);
    health = metrics_health (metrics, 2000 + KVP_METRICS_STALE_MS + 1, &ok);
    assert (health && !ok && strstr (health, "\"status\":\"stalled\""));
    free (health);
    metrics_destroy (&metrics);
    metrics_destroy (&metrics);
    assert (!metrics);

    //  A master: its nodes and keys, and its liveness tick as /health's sign of life.
    metrics = metrics_new ("master");
    assert (metrics);
    health = metrics_health (metrics, 100, &ok);
    assert (health && !ok && strstr (health, "\"status\":\"starting\""));
    free (health);
    kvp_cluster_figures_t figures = {.nodes = 3,
                                     .alive = 2,
                                     .keys = 1000,
                                     .objects = 990,
                                     .used_bytes = 4096,
                                     .capacity = 1 << 20,
                                     .failovers = 1};
    metrics_cluster (metrics, &figures, 5000);
    text = metrics_render (metrics, 5020, &size);
    assert (text && strstr (text, "kvpool_cluster_nodes{state=\"alive\"} 2\n"));
    assert (strstr (text, "kvpool_cluster_nodes{state=\"dead\"} 1\n"));
    assert (strstr (text, "kvpool_cluster_keys 1000\n") && !strstr (text, "kvpool_requests_total"));
    assert (strstr (text, "kvpool_cluster_objects 990\n")
            && strstr (text, "kvpool_cluster_used_bytes 4096\n")
            && strstr (text, "kvpool_cluster_capacity_bytes 1048576\n")
            && strstr (text, "kvpool_master_failovers_total 1\n")
            && strstr (text, "kvpool_cluster_replicas_missing 0\n"));
    free (text);
    health = metrics_health (metrics, 5020, &ok);
    assert (health && ok && strstr (health, "\"role\":\"master\"")
            && strstr (health, "\"objects\":990,\"stored_bytes\":4096,\"capacity_bytes\":1048576")
            && strstr (health, "\"nodes_alive\":2") && !strstr (health, "\"master\":"));
    free (health);
    health = metrics_health (metrics, 5000 + KVP_METRICS_STALE_MS + 1, &ok);
    assert (health && !ok);
    free (health);
    metrics_destroy (&metrics);

    //  A node: degraded until its master registers it, and past its lease without a word.
    metrics = metrics_new ("node");
    assert (metrics);
    metrics_snapshot (metrics, &stats, &segment, 1, 1000);
    health = metrics_health (metrics, 1000, &ok);
    assert (health && ok && !strstr (health, "\"master\":")); //  no link (yet): as before
    free (health);
    metrics_link_master (metrics, "tcp://10.0.0.9:50060", 3000, 1000);
    health = metrics_health (metrics, 1100, &ok);
    assert (health && !ok && strstr (health, "\"status\":\"degraded\"")
            && strstr (health, "\"connected\":false,\"registered\":false,"
                               "\"endpoint\":\"tcp://10.0.0.9:50060\",\"term\":0"));
    free (health);
    metrics_link_heard (metrics, true, 1200);
    metrics_link_term (metrics, 7);
    metrics_link_endpoint (metrics, "tcp://10.0.0.8:50060");
    health = metrics_health (metrics, 1300, &ok);
    assert (health && ok && strstr (health, "\"status\":\"ok\"")
            && strstr (health, "\"connected\":true,\"registered\":true")
            && strstr (health, "\"term\":7")
            && strstr (health, "\"endpoint\":\"tcp://10.0.0.8:50060\""));
    free (health);
    kvp_stats_t link_stats;
    memset (&link_stats, 0, sizeof link_stats);
    metrics_link_stats (metrics, 1300, &link_stats);
    assert (link_stats.master_connected == 1 && link_stats.master_silence_ms == 100
            && link_stats.master_term == 7 && link_stats.master_lease_ms == 3000);
    //  (the snapshot is fresh again, so that only the link can make it unhealthy)
    metrics_snapshot (metrics, &stats, &segment, 1, 4300);
    health = metrics_health (metrics, 4300, &ok); //  3.1 s silent: past the lease
    assert (health && !ok && strstr (health, "\"status\":\"degraded\""));
    free (health);
    metrics_link_stats (metrics, 4300, &link_stats);
    assert (link_stats.master_connected == 0 && link_stats.master_silence_ms == 3100);
    metrics_link_heard (metrics, true, 4300);
    metrics_link_refused (metrics, "node n is \"registered\" already");
    health = metrics_health (metrics, 4300, &ok);
    assert (health && !ok && strstr (health, "\"status\":\"refused\"")
            && strstr (health, "\"refused\":\"node n is \\\"registered\\\" already\""));
    free (health);
    metrics_destroy (&metrics);
    //  A process with no link reads one that is not there.
    kvp_master_link_t link;
    metrics_link_read (NULL, 0, &link);
    assert (!link.node && !link.connected);
}
