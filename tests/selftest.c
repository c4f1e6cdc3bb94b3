/*  selftest.c - runs the modules' self tests (each module's NAME_test function).

    kvpool-selftest --list          prints the test names, one a line
    kvpool-selftest --test NAME     runs one test (tests/run.sh runs each in its own process
                                    with a timeout, so one crash or hang fails one test)
    kvpool-selftest [-v]            runs them all in this process
*/
#include <czmq.h>

#include "actors/allocator.h"
#include "actors/api.h"
#include "infra/config.h"
#include "actors/admission.h"
#include "actors/hot_cache.h"
#include "actors/connections.h"
#include "actors/evictor.h"
#include "master/directory.h"
#include "master/master.h"
#include "actors/cluster.h"
#include "actors/master_client.h"
#include "master/node_table.h"
#include "master/repair.h"
#include "infra/object_table.h"
#include "infra/conn_guard.h"
#include "infra/curve.h"
#include "infra/key_watch.h"
#include "infra/etcd.h"
#include "infra/leader.h"
#include "master/ha.h"
#include "master/tombstones.h"
#include "actors/index_reads.h"
#include "actors/owners.h"
#include "infra/regex_matcher.h"
#include "actors/replica_manager.h"
#include "actors/kv_events.h"
#include "infra/log.h"
#include "infra/metrics.h"
#include "actors/kv_events_encode.h"
#include "transfer/transfer_pool.h"
#include "transfer/vm_read.h"
#include "transfer/value_checksum.h"
#include "dataplane/data_plane.h"
#include "dataplane/peer_link.h"
#include "dataplane/rpc_calls.h"
#include "actors/rdma_serve.h"
#include "infra/socket_cookie.h"
#include "actors/transfer_submitter.h"
#include "infra/spin_poll.h"
#include "infra/wait_set.h"
#include "infra/actor_shell.h"
#include "shm/segment.h"
#include "alloc/segment_arena.h"
#include "shm/segment_table.h"
#include "protocol/contract.h"
#include "protocol/status.h"
#include "lookup_server/lookup_keys.h"
#include "lookup_server/lookup_request.h"
#include "lookup_server/lookup_server.h"
#include "messages/kvp_job.h"
#include "messages/arena.h"
#include "messages/ops.h"
#include "messages/reply.h"
#include "messages/request_check.h"
#include "shm/shm_index.h"
#include "client/local_hot_cache.h"
#include "tier/disk_store.h"
#include "tier/object_log.h"
#include "actors/segment_dir.h"
#include "rdma/rdma.h"

typedef struct {
    const char *name;
    void (*test) (bool verbose);
} selftest_t;

static selftest_t s_tests[] = {{"kvp_status", kvp_status_test},
                               {"kvp_contract", kvp_contract_test},
                               {"kvp_config", kvp_config_test},
                               {"kvp_curve", kvp_curve_test},
                               {"kvp_job", kvp_job_test},
                               {"kvp_ops", kvp_ops_test},
                               {"arena", arena_test},
                               {"reply", reply_test},
                               {"request_check", request_check_test},
                               {"shm_index", shm_index_test},
                               {"local_hot_cache", local_hot_cache_test},
                               {"segment", segment_test},
                               {"segment_arena", segment_arena_test},
                               {"segment_table", segment_table_test},
                               {"transfer_pool", transfer_pool_test},
                               {"vm_read", vm_read_test},
                               {"value_checksum", value_checksum_test},
                               {"rpc_calls", rpc_calls_test},
                               {"peer_link", peer_link_test},
                               {"data_plane", data_plane_test},
                               {"rdma_serve", rdma_serve_test},
                               {"allocator", allocator_test},
                               {"index_reads", index_reads_test},
                               {"hot_cache", hot_cache_test},
                               {"owners", owners_test},
                               {"connections", connections_test},
                               {"socket_cookie", socket_cookie_test},
                               {"key_watch", key_watch_test},
                               {"etcd", etcd_test},
                               {"leader", leader_test},
                               {"ha", ha_test},
                               {"tombstones", tombstones_test},
                               {"regex_matcher", regex_matcher_test},
                               {"replica_manager", replica_manager_test},
                               {"kv_events_encode", kv_events_encode_test},
                               {"kv_events", kv_events_test},
                               {"metrics", metrics_test},
                               {"log", kvp_log_test},
                               {"admission", admission_test},
                               {"object_table", object_table_test},
                               {"evictor", evictor_test},
                               {"transfer_submitter", transfer_submitter_test},
                               {"conn_guard", conn_guard_test},
                               {"wait_set", wait_set_test},
                               {"spin_poll", spin_poll_test},
                               {"actor_shell", actor_shell_test},
                               {"api", api_test},
                               {"lookup_request", lookup_request_test},
                               {"lookup_keys", lookup_keys_test},
                               {"lookup_server", lookup_server_test},
                               {"disk_store", disk_store_test},
                               {"object_log", object_log_test},
                               {"segment_dir", segment_dir_test},
                               {"directory", directory_test},
                               {"node_table", node_table_test},
                               {"repair", repair_test},
                               {"master", master_test},
                               {"master_client", master_client_test},
                               {"cluster", cluster_test},
                               {"rdma_regs", kvp_rdma_regs_test},
                               {"rdma_wire", kvp_rdma_wire_test},
                               {"rdma_plan", kvp_rdma_plan_test},
                               {"rdma_track", kvp_rdma_track_test},
                               {"rdma_verbs", kvp_rdma_test},
                               {"rdma_loop", kvp_rdma_loop_test},
                               //  new self tests go above this line
                               {NULL, NULL}};

int
main (int argc, char **argv)
{
    bool verbose = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (streq (argv[i], "--list")) {
            for (selftest_t *t = s_tests; t->name; t++)
                printf ("%s\n", t->name);
            return 0;
        }
        else if (streq (argv[i], "--test") && i + 1 < argc)
            only = argv[++i];
        else if (streq (argv[i], "-v") || streq (argv[i], "--verbose"))
            verbose = true;
        else {
            fprintf (stderr, "usage: kvpool-selftest [--list] [--test NAME] [-v]\n");
            return 2;
        }
    }
    zsys_handler_set (NULL);
    int ran = 0;
    for (selftest_t *t = s_tests; t->name; t++) {
        if (only && !streq (only, t->name))
            continue;
        printf ("%s: ", t->name);
        fflush (stdout);
        t->test (verbose);
        printf ("OK\n");
        ran++;
    }
    if (only && ran == 0) {
        fprintf (stderr, "kvpool-selftest: no test named '%s'\n", only);
        return 2;
    }
    zsys_shutdown ();
    return 0;
}
