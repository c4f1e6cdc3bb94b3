/*  kvpoold.c - the kvpool daemon: role `all` (master and node in one process, the default),
    `master` (a cluster's metadata and placement) or `node` (memory for a cluster).

    Starts the actors (replica-manager, allocator, transfer-submitter, evictor, api, lookup
    server; the kv-events publisher with --kv-events-endpoint; a node adds the cluster and
    membership actors; a master runs the master actor alone), reports where it listens, and
    waits for SIGINT or SIGTERM. Shutdown is orderly: the admin channel stops, the api stops
    reading requests and answers everything in flight, then the actors end in reverse order
    of dependence and the process exits 0.

    Threads: main only waits for signals (blocked in every thread, taken with sigtimedwait),
    so no actor is ever interrupted by a signal handler.
*/
#include <czmq.h>
#include <signal.h>

#include "actors/replica_repair.h"
#include "actors/allocator.h"
#include "actors/api.h"
#include "actors/cluster.h"
#include "infra/config.h"
#include "infra/conn_guard.h"
#include "infra/curve.h"
#include "infra/endpoints.h"
#include "infra/etcd.h"
#include "infra/leader.h"
#include "actors/evictor.h"
#include "actors/kv_events.h"
#include "infra/log.h"
#include "master/master.h"
#include "actors/membership.h"
#include "infra/metrics.h"
#include "infra/metrics_http.h"
#include "actors/replica_manager.h"
#include "actors/transfer_submitter.h"
#include "lookup_server/lookup_server.h"
#include "rdma/rdma.h"
#include "protocol/contract.h"
#include "transfer/value_checksum.h"

#include <xxhash.h>
#include <xxh_x86dispatch.h>

//  libxxhash's run-time choice of vector code (AVX2 where the CPU has it) for every value's
//  checksum (transfer/value_checksum.h).
static uint64_t
s_hash (const void *bytes, size_t size)
{
    return XXH3_64bits_dispatch (bytes, size);
}

static int
s_hash_update (void *state, const void *bytes, size_t size)
{
    return XXH3_64bits_update_dispatch ((XXH3_state_t *) state, bytes, size);
}

#define DRAIN_TIMEOUT_MS 30000

static int
s_write_ready_file (const char *path, zlist_t *endpoints, zlist_t *admin, zlist_t *kv_events,
                    zlist_t *metrics)
{
    char tmp[4096];
    snprintf (tmp, sizeof tmp, "%s.tmp", path);
    FILE *file = fopen (tmp, "w");
    if (!file)
        return -1;
    for (char *e = (char *) zlist_first (endpoints); e; e = (char *) zlist_next (endpoints))
        fprintf (file, "endpoint=%s\n", e);
    for (char *e = admin ? (char *) zlist_first (admin) : NULL; e; e = (char *) zlist_next (admin))
        fprintf (file, "admin=%s\n", e);
    //  The PUB endpoint first, then the replay one (actors/kv_events.h).
    const char *kv_names[] = {"kv_events", "kv_events_replay"};
    size_t kv_index = 0;
    for (char *e = kv_events ? (char *) zlist_first (kv_events) : NULL; e && kv_index < 2;
         e = (char *) zlist_next (kv_events))
        fprintf (file, "%s=%s\n", kv_names[kv_index++], e);
    for (char *e = metrics ? (char *) zlist_first (metrics) : NULL; e;
         e = (char *) zlist_next (metrics))
        fprintf (file, "metrics=%s\n", e);
    fprintf (file, "pid=%d\n", (int) getpid ());
    fclose (file);
    //  Rename, so a reader never sees half a file.
    return rename (tmp, path);
}

static int
s_wait_for_signal (sigset_t *signals)
{
    int signo;
    do
        signo = sigwaitinfo (signals, NULL);
    while (signo == -1 && errno == EINTR);
    printf ("kvpoold: %s: finishing requests in flight\n", strsignal (signo));
    fflush (stdout);
    return signo;
}

//  Role master: the master actor alone; it owns no memory.
static int
s_run_master (kvp_config_t *config, sigset_t *signals)
{
    config->metrics = metrics_new ("master");
    assert (config->metrics);
    zactor_t *master = zactor_new (master_actor, config);
    zlist_t *endpoints = kvp_endpoints_ask (master, "master endpoint");
    //  /metrics and /health: the nodes and keys the master knows, its liveness tick.
    zactor_t *metrics = NULL;
    zlist_t *metrics_endpoints = NULL;
    if (endpoints && config->metrics_port) {
        metrics = zactor_new (metrics_http_actor, config);
        metrics_endpoints = kvp_endpoints_ask (metrics, "metrics");
    }
    int status = 1;
    if (endpoints && (!metrics || metrics_endpoints)) {
        for (char *e = metrics_endpoints ? (char *) zlist_first (metrics_endpoints) : NULL; e;
             e = (char *) zlist_next (metrics_endpoints))
            printf ("kvpoold: metrics %s/metrics, health %s/health\n", e, e);
        if (config->ready_file
            && s_write_ready_file (config->ready_file, endpoints, NULL, NULL, metrics_endpoints)
                   != 0)
            fprintf (stderr, "kvpoold: cannot write %s: %s\n", config->ready_file,
                     strerror (errno));
        else {
            for (char *e = (char *) zlist_first (endpoints); e; e = (char *) zlist_next (endpoints))
                printf ("kvpoold: master: nodes join at %s (node ttl %llu ms)\n", e,
                        (unsigned long long) config->node_ttl_ms);
            fflush (stdout);
            s_wait_for_signal (signals);
            status = 0;
        }
    }
    zactor_destroy (&metrics);
    zactor_destroy (&master);
    zlist_destroy (&endpoints);
    zlist_destroy (&metrics_endpoints);
    //  (The counters stay until the exit: see main.)
    if (config->ready_file)
        unlink (config->ready_file);
    if (status == 0)
        printf ("kvpoold: stopped\n");
    return status;
}

int
main (int argc, char **argv)
{
    if (argc == 2 && !strcmp (argv[1], "--metrics-markdown")) {
        metrics_markdown (stdout); //  docs/metrics.md's table
        return 0;
    }
    //  Static, as are the counters and the --config file's strings it points at: the actors
    //  read them until they end, and nothing ThreadSanitizer can see (libzmq's pipes) orders
    //  their last reads before a free here, so the exit frees them (still reachable: no leak
    //  report either).
    static kvp_config_t config;
    kvp_config_defaults (&config);
    int rc = kvp_config_parse (&config, argc - 1, argv + 1);
    if (rc != 0) {
        kvp_config_release (&config);
        return rc == 1 ? 0 : 2;
    }
    snprintf (config.instance, sizeof config.instance, "kvpool%d", (int) getpid ());
    kvp_log_level_t log_level = KVP_LOG_INFO;
    kvp_log_level_parse (config.log_level, &log_level); //  checked by the parser
    kvp_log_setup (config.verbose ? KVP_LOG_DEBUG : log_level, config.log_syslog, "kvpoold");
    pthread_setname_np (pthread_self (), "kvpoold");
    //  CURVE before any socket binds: the ZAP handler must answer the first handshake.
    kvp_config_say_security (&config);
    //  A cluster's master and data planes admit only its own nodes (curve.h): with CURVE
    //  the certificates of --curve-nodes, without it the cluster key.
    kvp_trust_args_t trust = {.secret_file = config.curve_secret,
                              .allow_dir = config.curve_allow,
                              .nodes_dir = config.curve_nodes,
                              .master_file =
                                  config.role == KVP_ROLE_NODE ? config.curve_master : NULL,
                              .cluster_key_file = config.cluster_key,
                              .cluster = config.role != KVP_ROLE_ALL};
    if (trust.secret_file || trust.cluster) {
        char why[600];
        config.curve = kvp_curve_new (&trust, why, sizeof why);
        if (!config.curve) {
            fprintf (stderr, "kvpoold: %s\n", why);
            return 2;
        }
        if (kvp_curve_cluster_key_file (config.curve))
            kvp_info ("nodes prove the cluster key %s (PLAIN, loopback or --insecure only)",
                      kvp_curve_cluster_key_file (config.curve));
        else if (trust.cluster)
            kvp_info ("nodes and the master are admitted from %s (CURVE)", config.curve_nodes);
    }
    value_checksum_use (s_hash, s_hash_update);
    //  Every client connection is a descriptor: take all the kernel allows (the api refuses
    //  connections short of it, --max-connections, rather than spin at it).
    conn_guard_raise_fd_limit ();

    //  Signals are taken by main alone, synchronously.
    zsys_handler_set (NULL);
    sigset_t signals;
    sigemptyset (&signals);
    sigaddset (&signals, SIGINT);
    sigaddset (&signals, SIGTERM);
    pthread_sigmask (SIG_BLOCK, &signals, NULL);
    signal (SIGPIPE, SIG_IGN);
    //  A file size limit fails a disk tier write (EFBIG), it does not end the node.
    signal (SIGXFSZ, SIG_IGN);
    zsys_set_logident ("kvpoold");
    if (config.role == KVP_ROLE_MASTER) {
        int status = s_run_master (&config, &signals);
        kvp_curve_stop (config.curve);
        return status;
    }
    //  A node's data plane: rdma when asked for (or auto) and the device opens; said in one
    //  line once the node has joined.
    char transport_why[256] = "";
    if (config.role == KVP_ROLE_NODE)
        config.rdma = kvp_rdma_choose (config.transport, config.rdma_device, NULL, NULL,
                                       transport_why, sizeof transport_why)
                      == KVP_RDMA_TRANSPORT_RDMA;

    //  The publisher binds the inproc socket the replica-manager's feed connects to.
    zactor_t *kv_events = NULL;
    zlist_t *kv_endpoints = NULL;
    if (config.kv_events_endpoint)
        kv_events = zactor_new (kv_events_actor, &config);
    //  The counters the api and the lookup server keep, and the metrics actor serves.
    //  A node's lease from its master (infra/config.h): none until the master answers.
    static kvp_lease_t lease;
    if (config.role == KVP_ROLE_NODE)
        config.lease = &lease;
    //  With standby masters, the node follows whichever leads (infra/leader.h).
    static kvp_leader_t leader = {.lock = PTHREAD_MUTEX_INITIALIZER};
    leader_watch_t *leader_watch = NULL;
    if (config.role == KVP_ROLE_NODE && etcd_is_address (config.master)) {
        char error[300];
        leader_watch = leader_watch_new (config.master, &leader, error, sizeof error);
        if (!leader_watch) {
            fprintf (stderr, "kvpoold: --master: %s\n", error);
            return 1;
        }
        config.leader = &leader;
    }
    config.metrics = metrics_new (config.role == KVP_ROLE_NODE ? "node" : "all");
    assert (config.metrics);
    //  The segments outlive every actor (config.h): made here, destroyed last.
    config.allocator = allocator_new (&config);
    assert (config.allocator);
    zactor_t *rm = zactor_new (replica_manager_actor, &config);
    zactor_t *tx = zactor_new (transfer_submitter_actor, &config);
    //  The evictor registers what the disk tier holds before the api serves.
    zactor_t *ev = zactor_new (evictor_actor, &config);
    zactor_t *api = zactor_new (api_actor, &config);
    zactor_t *lookup = NULL, *cluster = NULL, *membership = NULL, *metrics = NULL;
    zactor_t *repair = NULL;
    zlist_t *endpoints = NULL, *admin = NULL, *metrics_endpoints = NULL;
    char *peer_endpoint = NULL, *host_id = NULL;
    char node_id[256] = "", client_endpoint[300] = "";
    cluster_args_t cluster_args = {0};
    int status = 1;

    //  The node's own segments are the replica-manager's allocator's (allocator.h).
    zstr_send (rm, "STATUS");
    char *al_status = zstr_recv (rm);
    if (!al_status || !streq (al_status, "OK")) {
        fprintf (stderr, "kvpoold: %s\n", al_status ? al_status : "allocator failed");
        zstr_free (&al_status);
        goto shutdown;
    }
    zstr_free (&al_status);
    zstr_send (ev, "STATUS");
    char *ev_status = zstr_recv (ev);
    if (!ev_status || !streq (ev_status, "OK")) {
        fprintf (stderr, "kvpoold: %s\n", ev_status ? ev_status : "evictor failed");
        zstr_free (&ev_status);
        goto shutdown;
    }
    zstr_free (&ev_status);
    if (kv_events && !(kv_endpoints = kvp_endpoints_ask (kv_events, "kv events endpoint")))
        goto shutdown;
    endpoints = kvp_endpoints_ask (api, "client endpoint");
    if (!endpoints)
        goto shutdown;
    if (config.role == KVP_ROLE_NODE) {
        //  The node's identity: its data plane and host as the api bound and names them, its
        //  client endpoint (the first tcp one), its name.
        zstr_send (api, "PEER");
        zstr_recvx (api, &peer_endpoint, &host_id, NULL);
        for (char *e = (char *) zlist_first (endpoints); e; e = (char *) zlist_next (endpoints))
            if (strncmp (e, "tcp://", 6) == 0) {
                snprintf (client_endpoint, sizeof client_endpoint, "%s", e);
                break;
            }
        //  What it announces: a wildcard bind (0.0.0.0) is an address no other node can
        //  connect to, so --advertise names the one they reach it at; without it the node
        //  does not start rather than join with an address nobody can use.
        char client_announced[300], peer_announced[300];
        const char *wildcard = NULL;
        if (kvp_endpoint_advertised (client_endpoint, config.advertise, client_announced,
                                     sizeof client_announced)
            != 0)
            wildcard = client_endpoint;
        else if (kvp_endpoint_advertised (peer_endpoint, config.advertise, peer_announced,
                                          sizeof peer_announced)
                 != 0)
            wildcard = peer_endpoint;
        if (wildcard) {
            fprintf (stderr,
                     "kvpoold: %s binds every address, which other nodes and clients cannot "
                     "connect to: give --advertise HOST (the address they reach this node at), "
                     "or bind one address\n",
                     wildcard);
            goto shutdown;
        }
        if (strcmp (client_announced, client_endpoint) || strcmp (peer_announced, peer_endpoint))
            printf ("kvpoold: announced as %s, data plane %s (--advertise)\n", client_announced,
                    peer_announced);
        snprintf (client_endpoint, sizeof client_endpoint, "%s", client_announced);
        zstr_free (&peer_endpoint);
        peer_endpoint = strdup (peer_announced);
        if (config.node_id)
            snprintf (node_id, sizeof node_id, "%s", config.node_id);
        else
            snprintf (node_id, sizeof node_id, "%s:%s", host_id,
                      *client_endpoint ? strrchr (client_endpoint, ':') + 1 : config.instance);
        //  With the cluster key, the node says who it is as it proves it (curve.h).
        kvp_curve_set_node (config.curve, node_id);
        static cluster_registration_t registration;
        cluster_args = (cluster_args_t){&config,       node_id,         host_id,
                                        peer_endpoint, client_endpoint, &registration};
        cluster = zactor_new (cluster_actor, &cluster_args);
        membership = zactor_new (membership_actor, &cluster_args);
        repair = zactor_new (replica_repair_actor, &cluster_args);
        printf ("kvpoold: node %s joins the master at %s; data plane %s\n", node_id, config.master,
                peer_endpoint);
        if (config.rdma)
            printf ("kvpoold: data plane transport rdma (%s); requests still go over tcp\n",
                    transport_why);
        else
            printf ("kvpoold: data plane transport tcp (%s)\n", transport_why);
    }

    //  The lookup server reaches the store through the api's job socket, bound by now.
    const char *default_admin[] = {KVP_DEFAULT_ADMIN_ENDPOINT};
    lookup_server_args_t lookup_args = {
        .lookup = config.lookup,
        .admin_endpoints = config.admin_endpoint_count ? config.admin_endpoints : default_admin,
        .admin_endpoint_count = config.admin_endpoint_count ? config.admin_endpoint_count : 1,
        .instance = config.instance,
        .max_key_len = config.max_key_len,
        .verbose = config.verbose,
        .metrics = config.metrics,
        .curve = config.curve};
    lookup = zactor_new (lookup_server_actor, &lookup_args);
    admin = kvp_endpoints_ask (lookup, "admin endpoint");
    if (!admin)
        goto shutdown;

    //  /metrics and /health: on a thread of their own, sending STATS to the api's job socket.
    if (config.metrics_port) {
        metrics = zactor_new (metrics_http_actor, &config);
        if (!(metrics_endpoints = kvp_endpoints_ask (metrics, "metrics")))
            goto shutdown;
    }
    if (config.ready_file
        && s_write_ready_file (config.ready_file, endpoints, admin, kv_endpoints, metrics_endpoints)
               != 0) {
        fprintf (stderr, "kvpoold: cannot write %s: %s\n", config.ready_file, strerror (errno));
        goto shutdown;
    }
    if (config.segments)
        printf ("kvpoold: serving %u segment(s) of %llu MiB, %u transfer workers\n",
                config.segments, (unsigned long long) (config.segment_size >> 20), config.workers);
    else
        printf ("kvpoold: serving no memory of its own (clients mount it), %u transfer workers\n",
                config.workers);
    for (char *e = (char *) zlist_first (endpoints); e; e = (char *) zlist_next (endpoints))
        printf ("kvpoold: client endpoint %s\n", e);
    for (char *e = (char *) zlist_first (admin); e; e = (char *) zlist_next (admin))
        printf ("kvpoold: lookup/reset admin endpoint %s\n", e);
    for (char *e = kv_endpoints ? (char *) zlist_first (kv_endpoints) : NULL; e;
         e = (char *) zlist_next (kv_endpoints))
        printf ("kvpoold: kv events %s\n", e);
    for (char *e = metrics_endpoints ? (char *) zlist_first (metrics_endpoints) : NULL; e;
         e = (char *) zlist_next (metrics_endpoints))
        printf ("kvpoold: metrics %s/metrics, health %s/health\n", e, e);
    fflush (stdout);

    s_wait_for_signal (&signals);
    //  A node its master refused for good (another live node has its id: membership.c)
    //  stopped itself: it exits 1, having said why.
    kvp_master_link_t link;
    metrics_link_read (config.metrics, zclock_mono (), &link);
    status = link.refused[0] ? 1 : 0;
    if (status)
        fprintf (stderr, "kvpoold: %s\n", link.refused);
    if (repair && config.drain_on_exit) {
        //  What only this node holds goes to others first (replica_repair.h), while the node
        //  still serves their copies.
        zstr_send (repair, "DRAIN");
        char *how = NULL, *left = NULL;
        zstr_recvx (repair, &how, &left, NULL);
        printf ("kvpoold: drained (%s, %s objects left behind)\n", how ? how : "?",
                left ? left : "?");
        fflush (stdout);
        zstr_free (&how);
        zstr_free (&left);
    }

shutdown:
    zactor_destroy (&metrics);
    zactor_destroy (&lookup);
    zactor_destroy (&repair); //  before the api: its copies under way come back first
    //  A regex removal being matched (seconds, at worst) is cut short rather than waited for.
    zstr_send (rm, "STOPPING");
    //  Stop reading requests and let those in flight finish before the actors go.
    zstr_send (api, "DRAIN");
    zsock_set_rcvtimeo (api, DRAIN_TIMEOUT_MS);
    char *drained = zstr_recv (api);
    if (!drained && status == 0)
        fprintf (stderr, "kvpoold: requests still in flight after %d ms\n", DRAIN_TIMEOUT_MS);
    zstr_free (&drained);
    zactor_destroy (&api);
    zactor_destroy (&membership);
    zactor_destroy (&ev);
    zactor_destroy (&rm);        //  before the transfer-submitter: it waits for its unlinks
    zactor_destroy (&kv_events); //  after the replica-manager: it publishes its last batch
    zactor_destroy (&cluster);   //  after the replica-manager: it takes its last drop reports
    zactor_destroy (&tx);
    leader_watch_destroy (&leader_watch); //  after every master client
    allocator_destroy (&config.allocator);
    zlist_destroy (&endpoints);
    zlist_destroy (&admin);
    zlist_destroy (&kv_endpoints);
    zlist_destroy (&metrics_endpoints);
    zstr_free (&peer_endpoint);
    zstr_free (&host_id);
    kvp_curve_stop (config.curve);
    if (config.ready_file)
        unlink (config.ready_file);
    if (status == 0)
        printf ("kvpoold: stopped\n");
    return status;
}
