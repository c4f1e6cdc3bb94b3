/*  config_fuzz.c - libFuzzer target: arbitrary bytes into kvpoold's settings parser
    (infra/config.c): the size parser alone, then the whole command line.

    Built by tests/fuzz/fuzz.mk with clang -fsanitize=fuzzer,address,undefined into
    build/bin/config-fuzz; `make fuzz` runs it for a while, tests/extra/fuzz.sh briefly over
    the committed seed corpus tests/fuzz/config/.

    Input format: the bytes up to the first NUL are given to kvp_parse_size; the whole input,
    split at NUL bytes, is the argument vector of kvp_config_parse (at most 64 arguments; the
    last one ends at the end of the input). So "--segments\0 3\0--endpoint=tcp://a" is three
    arguments, and its first is also tried as a size.

    Besides the sanitizers, it checks what an accepted setting promises: a parsed size prints
    back as a decimal that parses to the same size; a parsed command line leaves every number
    within its option's bounds, the value limit no larger than a segment, and at most
    KVP_MAX_ENDPOINTS endpoints of each kind. Single-threaded.
*/
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infra/config.h"

#define MAX_ARGS 64

static void
s_check (bool condition, const char *what)
{
    if (!condition) {
        fprintf (stderr, "config-fuzz: broken promise: %s\n", what);
        abort ();
    }
}

static void
s_fuzz_size (const char *text)
{
    uint64_t size = 0;
    if (kvp_parse_size (text, &size) != 0)
        return;
    char again[32];
    snprintf (again, sizeof again, "%" PRIu64, size);
    uint64_t back = 0;
    s_check (kvp_parse_size (again, &back) == 0, "a parsed size prints as a size");
    s_check (back == size, "a parsed size round-trips through its decimal form");
}

static void
s_fuzz_command_line (char *buffer, size_t size)
{
    char *argv[MAX_ARGS];
    int argc = 0;
    char *start = buffer;
    for (size_t i = 0; i <= size && argc < MAX_ARGS; i++)
        if (i == size || buffer[i] == 0) {
            buffer[i] = 0;
            argv[argc++] = start;
            start = buffer + i + 1;
        }
    //  --config reads a file (the operator's, parsed by CZMQ's zconfig) and --print-config
    //  writes standard output: neither is the command line's own parsing.
    for (int i = 0; i < argc; i++)
        if (!strncmp (argv[i], "--config", 8) || !strcmp (argv[i], "--print-config"))
            return;
    kvp_config_t config;
    kvp_config_defaults (&config);
    int rc = kvp_config_parse (&config, argc, argv);
    kvp_config_release (&config);
    if (rc != 0)
        return;
    s_check (config.max_value_size <= config.segment_size, "values fit in a segment");
    s_check (config.segment_size >= (1 << 20) && config.segment_size <= (1ULL << 44),
             "segment size within bounds");
    s_check (config.segments <= 64, "segment count within bounds (0: no memory of its own)");
    s_check (config.workers >= 1 && config.workers <= 256, "workers within bounds");
    s_check (config.endpoint_count <= KVP_MAX_ENDPOINTS, "endpoints bounded");
    s_check (config.admin_endpoint_count <= KVP_MAX_ENDPOINTS, "admin endpoints bounded");
    for (size_t i = 0; i < config.endpoint_count; i++)
        s_check (config.endpoints[i] >= buffer && config.endpoints[i] <= buffer + size,
                 "endpoints point into argv");
    s_check (config.lease_ttl_ms >= 1 && config.put_timeout_ms >= 1, "timeouts positive");
    s_check (config.lookup.tp_size >= 1 && config.lookup.block_size >= 1, "lookup sizes");
    s_check (config.placement == KVP_PLACEMENT_RANDOM
                 || config.placement == KVP_PLACEMENT_FREE_RATIO
                 || config.placement == KVP_PLACEMENT_LOCAL_FIRST,
             "placement is a known policy");
    s_check (config.role == KVP_ROLE_ALL || config.role == KVP_ROLE_MASTER
                 || config.role == KVP_ROLE_NODE,
             "role is a known role");
    s_check (config.master && *config.master, "a cluster has a master endpoint");
    s_check ((!config.host_id || *config.host_id) && (!config.node_id || *config.node_id)
                 && (!config.peer_endpoint || *config.peer_endpoint),
             "names are set or not, never empty");
    s_check (config.peer_connections >= 1 && config.cluster_timeout_ms >= 10
                 && config.node_ttl_ms >= 100,
             "cluster settings within bounds");
    s_check (!strcmp (config.transport, "tcp") || !strcmp (config.transport, "rdma")
                 || !strcmp (config.transport, "auto"),
             "transport is a known one");
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    //  NUL-terminated copies: the parsers take C strings.
    char *buffer = (char *) malloc (size + 1);
    if (!buffer)
        return 0;
    memcpy (buffer, data, size);
    buffer[size] = 0;
    s_fuzz_size (buffer);
    s_fuzz_command_line (buffer, size);
    free (buffer);
    return 0;
}
