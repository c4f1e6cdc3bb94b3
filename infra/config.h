/*  config.h - kvpoold's settings: one table of options (name, argument, bounds, default,
    help), parsed from the command line, from which --help and README.md's settings table are
    printed. Every actor reads its settings from one kvp_config_t that the daemon fills before
    it starts them and never changes afterwards.
*/
#ifndef KVP_CONFIG_H_INCLUDED
#define KVP_CONFIG_H_INCLUDED

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "infra/lookup_config.h"

#define KVP_MAX_ENDPOINTS 8

typedef struct _kvp_metrics_t kvp_metrics_t;
typedef struct _kvp_curve_t kvp_curve_t;
typedef struct _allocator_t allocator_t;

typedef enum {
    KVP_PLACEMENT_RANDOM = 0,
    KVP_PLACEMENT_FREE_RATIO = 1,
    KVP_PLACEMENT_LOCAL_FIRST = 2 //  the writer's node first (a cluster; one node: random)
} kvp_placement_t;

//  What the process is (DESIGN §2).
typedef enum { KVP_ROLE_ALL = 0, KVP_ROLE_MASTER, KVP_ROLE_NODE } kvp_role_t;

//  Preferred nodes one PLACE may name.
#define KVP_MAX_PREFERRED_NODES 8

//  When objects get a disk copy (the disk tier, actors/evictor.c).
typedef enum {
    KVP_OFFLOAD_DEFAULT = 0, //  not set: on-evict with a disk dir, off without
    KVP_OFFLOAD_OFF,
    KVP_OFFLOAD_EAGER,
    KVP_OFFLOAD_ON_EVICT
} kvp_offload_t;

//  A node's lease (kvp_config_t.lease): until when, in zclock_mono milliseconds (CLOCK_MONOTONIC,
//  shm_index_clock_ms), it may serve cache copies. 0: not now.
//  And whether it may serve its own replicas: not after the node itself stopped running for
//  longer than its lease (SIGSTOP, a stall), for its master may have fenced it meanwhile
//  (FENCE: a remove or a write that could not reach it completed without it), until the
//  master has confirmed what it holds (actors/membership.c). beat_ms is when the membership
//  actor last sent its heartbeat (the master heard the node no earlier, and waits a lease
//  and a tenth past what it heard last before a change that fenced the node completes); a
//  gap of more than period_ms since then is such a stop, seen by a reader before the
//  membership actor has run again, and by same-machine readers of the read index, which
//  the replica-manager shows beat_ms + period_ms (shm_index_set_own_until).
typedef struct {
    _Atomic int64_t until_ms;
    _Atomic int64_t beat_ms;
    _Atomic int64_t period_ms;
    atomic_bool suspended;
} kvp_lease_t;

//  Whether a node with lease (NULL: none) must not serve its own copies at now: it stopped
//  past its lease, and its master has not confirmed what it holds since.
static inline bool
kvp_lease_suspended (const kvp_lease_t *lease, int64_t now)
{
    if (!lease)
        return false;
    kvp_lease_t *l = (kvp_lease_t *) lease;
    int64_t beat = atomic_load (&l->beat_ms), period = atomic_load (&l->period_ms);
    return atomic_load (&l->suspended) || (beat && period && now - beat > period);
}

//  Whether lease (NULL: none: always) holds at now (zclock_mono ms).
static inline bool
kvp_lease_holds (const kvp_lease_t *lease, int64_t now)
{
    return !lease
           || now < atomic_load_explicit (&((kvp_lease_t *) lease)->until_ms, memory_order_acquire);
}

typedef struct {
    char instance[32];                        //  names this store's inproc endpoints
    const char *endpoints[KVP_MAX_ENDPOINTS]; //  client ROUTER binds
    size_t endpoint_count;
    const char *admin_endpoints[KVP_MAX_ENDPOINTS];
    size_t admin_endpoint_count;
    const char *ready_file;
    uint64_t segment_size;
    uint32_t segments;
    bool lock_memory;
    const char *segment_dir; //  the segments as files that outlive the process, or NULL
    uint64_t lease_ttl_ms;
    uint64_t put_timeout_ms; //  discard timeout of an uncommitted put-start
    uint64_t soft_pin_ttl_ms;
    uint64_t max_key_len;
    uint64_t max_value_size;
    uint64_t max_request_bytes;   //  all value frames of one request together
    uint64_t max_keys;            //  keys in one request
    uint64_t max_unread_bytes;    //  reply bytes a connection may leave unread
    uint64_t max_regex_len;       //  longest remove-by-regex pattern, bytes
    uint64_t regex_time_limit_ms; //  matching time one remove-by-regex may take
    uint32_t workers;
    uint64_t spin_us;     //  the replica-manager's polling after a job (infra/spin_poll.h)
    uint64_t index_slots; //  same-machine read index; 0: sized by the pool
    kvp_placement_t placement;
    uint64_t seed;
    bool verbose;
    bool group_set; //  --group: processes of this gid may use the ipc endpoint and shm too
    gid_t group;
    uint64_t max_connections; //  client connections before new ones are refused; 0: by fd limit
    //  eviction and the disk tier (actors/evictor.c)
    double eviction_high_watermark; //  share of the pool in use that starts a cycle
    double eviction_ratio;          //  share of the pool a cycle frees at least
    bool evict_soft_pinned;         //  soft-pinned objects may go, after all others
    const char *disk_dir;           //  the disk tier's directory, or NULL: none
    uint64_t disk_capacity;
    double disk_high_watermark, disk_low_watermark;
    kvp_offload_t offload;
    uint64_t offload_queue_limit; //  disk copies queued at once
    uint64_t offload_queue_bytes; //  ... and their bytes (each a copy in memory until written)
    double offload_cap_ratio;     //  share of the queue limit one cycle may queue
    bool offload_force_evict;     //  evict without a disk copy when none can be made
    uint64_t promote_on_hit;      //  disk reads within the window that bring it back; 0: never
    uint64_t promote_window_ms;
    //  the cluster (DESIGN §2, docs/cluster.md)
    kvp_role_t role;
    const char *master;        //  master: the endpoint it binds; node: the master to join
    const char *ha;            //  master: etcd://.../CLUSTER to campaign in; NULL: alone
    uint64_t ha_lease_ttl_s;   //  master with ha: the leader's etcd lease
    const char *host_id;       //  NULL: kvp_host_id (boot id and network namespace)
    const char *node_id;       //  NULL: host id + the first client tcp port
    const char *peer_endpoint; //  the data plane's bind; NULL: the client tcp host, any port
    const char *advertise;     //  the host announced for a wildcard bind; NULL: none
    uint64_t node_ttl_ms;
    uint64_t max_node_objects; //  master: directory entries one node may hold
    uint64_t heartbeat_ms;
    uint64_t cluster_timeout_ms; //  a master or peer request unanswered this long fails
    uint32_t peer_connections;   //  data-plane connections to each other node
    uint64_t stripe_size;        //  remote reads larger than this move in stripes
    bool verify_checksums;       //  values hashed on arrival, verified between nodes
    uint64_t hot_cache_size;     //  the host hot cache's bytes; 0: off; UINT64_MAX: auto
    uint64_t hot_cache_admit;    //  reads within the window that admit a key
    uint64_t hot_cache_window_ms;
    uint64_t hot_cache_max_object; //  the largest value copied
    uint64_t repair_rate;          //  bytes a second copied in by repairs; 0: none
    bool drain_on_exit;            //  SIGTERM drains the node first (docs/cluster.md)
    uint64_t drain_timeout_ms;     //  ... for at most this long
    const char *transport;         //  tcp, rdma or auto
    const char *rdma_device;       //  NAME[:PORT[:GID_INDEX]]; NULL: the first device
    //  Not a setting: whether the data plane moves values by RDMA, decided at start from
    //  --transport and --rdma-device (kvpoold, kvp_rdma_choose).
    bool rdma;
    lookup_config_t lookup;
    //  KV events for KV-aware routers (actors/kv_events.c, docs/kv_events.md)
    const char *kv_events_endpoint;        //  the PUB bind, or NULL: no events at all
    const char *kv_events_replay_endpoint; //  the replay ROUTER bind, or NULL: none
    const char *kv_events_topic;           //  frame 1 of every message ("" by default)
    const char *kv_events_medium;          //  "medium" of every event
    uint64_t kv_events_replay_size;        //  batches kept for replay
    uint64_t kv_events_replay_bytes;       //  replay bytes queued for requesters at once
    uint64_t kv_events_interval_ms;        //  how long the replica-manager gathers a batch
    //  Metrics over HTTP (infra/metrics_http.c, docs/metrics.md)
    const char *log_level;    //  error, warning, info or debug
    bool log_syslog;          //  to syslog instead of stderr
    const char *trace_keys;   //  keys whose every step is logged (log.h), or NULL
    uint64_t metrics_port;    //  0: no HTTP
    const char *metrics_host; //  the address HTTP binds
    //  CURVE (infra/curve.h, docs/security.md)
    const char *curve_secret; //  this process's certificate (public and secret key)
    const char *curve_allow;  //  the public certificates admitted
    const char *curve_master; //  role node: the master's public certificate; NULL: our own
    const char *curve_nodes;  //  roles master, node: the nodes' and master's certificates
    const char *cluster_key;  //  roles master, node without CURVE: the cluster key's file
    bool insecure;            //  non-loopback binds without CURVE
    //  Not a setting: the loaded certificates and the ZAP handler; made by kvpoold before the
    //  actors start. NULL: no CURVE.
    kvp_curve_t *curve;
    //  Not a setting: the counters the api and the lookup server keep and the metrics actor
    //  serves (infra/metrics.h); made by kvpoold before the actors start. NULL: none kept.
    kvp_metrics_t *metrics;
    //  Not a setting: a node's lease from its master (role node; NULL otherwise), made by
    //  kvpoold before the actors start. The membership actor moves it on with each
    //  heartbeat the master answers; cache copies and reads of a named version are served
    //  only before it ends (docs/tiers.md, "The hot cache").
    kvp_lease_t *lease;
    //  Not a setting: which master leads (role node with --master etcd://..., NULL
    //  otherwise), made by kvpoold with the watch that keeps it (infra/leader.h); each master
    //  client follows it.
    struct kvp_leader_s *leader;
    //  Not a setting: the node's segments and their space (actors/allocator.h), made by
    //  kvpoold before the actors start and destroyed after them all, so that no copy or send
    //  still under way at the end reads unmapped memory; only the replica-manager's thread
    //  uses it. NULL: the replica-manager makes its own (self tests).
    allocator_t *allocator;
    //  Not a setting: the --config file's tree (a zconfig_t), whose strings the settings from
    //  it point into; kvp_config_release frees it.
    void *file;
} kvp_config_t;

//  Fills config with the defaults (each option's row in the settings table says its own).
void kvp_config_defaults (kvp_config_t *config);

//  Parses argv (without argv[0]) into config: the --config file first, then the command line.
//  Returns 0, 1 when --help, --help-markdown or --print-config printed what was asked, or -1
//  with a one-line error on stderr. Strings in config point into argv or into the file's
//  tree (kvp_config_release frees it).
//  Settings that depend on each other are checked, and defaults that follow from others
//  (--offload) are applied, at the end.
int kvp_config_parse (kvp_config_t *config, int argc, char **argv);

//  Says in the log, once at start, how the endpoints are protected: CURVE, loopback only, or
//  each non-loopback bind that --insecure let through (a warning).
void kvp_config_say_security (const kvp_config_t *config);

//  Frees what parsing kept (the config file's tree); the strings from it go with it.
void kvp_config_release (kvp_config_t *config);

//  Whether the setting of this name may change while the node runs (its row says so).
bool kvp_config_runtime (const char *name);

//  The setting's value as text (a list's values comma-separated; "" when unset). Returns 0,
//  or -1 for an unknown name.
int kvp_config_value (const kvp_config_t *config, const char *name, char *out, size_t size);

//  Changes a setting that may change at run time, after checking value as the command line
//  would and with the settings that go with it; config is left as it was on failure.
//  Returns 0, or -1 with the reason in why. (A text value is copied: value need not last.)
int kvp_config_change (kvp_config_t *config, const char *name, const char *value, char *why,
                       size_t why_size);

//  Prints the settings as a config file (--print-config): `name = "value"` per setting.
void kvp_config_print (const kvp_config_t *config, FILE *out);

//  Parses a size: 1073741824, 512MiB, 4GB, 1.5gb, 64k (K/M/G/T, with or without i and B;
//  binary multiples). Returns 0 or -1.
int kvp_parse_size (const char *text, uint64_t *size_p);

//  Prints the option table (--help): each option, what it does and its default.
void kvp_config_usage (FILE *out);

//  Prints the settings as a markdown table (--help-markdown): the lines README.md holds
//  between its settings-table markers (`make readme-settings` writes them there).
void kvp_config_markdown (FILE *out);

void kvp_config_test (bool verbose);

#endif
