/*  kvpool.c - the kvpool command-line tool: put, get, inspect and remove objects of a kvpoold
    node through libkvpool.

        kvpool [-s ENDPOINT] [-t TIMEOUT_MS] [--no-fast-path] COMMAND [ARGS...]

    One connection, one command, then exit: 0 on success, 1 when the command failed (with a
    one-line "kvpool: COMMAND KEY: reason (STATUS)" on stderr) or, for exists, when a key is
    missing; 2 on a usage error. Single-threaded.
*/
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <czmq.h>

#include "kvpool.h"
#include "tools/kvpool_top.h"

#define EXIT_USAGE 2
//  The most put reads when the node does not say its limit (STATS max_value_size).
#define DEFAULT_MAX_VALUE (1ULL << 30)

static const char *s_usage =
    "Usage: kvpool [OPTION...] COMMAND [ARGS...]\n"
    "\n"
    "options:\n"
    "  -s, --server ENDPOINT   node to talk to (default " KVPOOL_DEFAULT_ENDPOINT ")\n"
    "  -t, --timeout MS        per-request timeout in milliseconds (default 5000)\n"
    "  --no-fast-path          never copy through shared memory, even on the node's machine\n"
    "  --curve-secret FILE     CURVE: this client's certificate (NAME_secret of keygen)\n"
    "  --curve-server FILE     CURVE: the node's public certificate\n"
    "  -h, --help              this text\n"
    "  --version               print the version and exit\n"
    "\n"
    "commands:\n"
    "  put [--replicas N] [--soft-pin] [--hard-pin] [--upsert] KEY [FILE]\n"
    "                          store FILE (standard input when absent) under KEY;\n"
    "                          --upsert replaces the value of a KEY that exists\n"
    "  get KEY [FILE]          write KEY's value to FILE (standard output when absent)\n"
    "  exists KEY...           print \"KEY: yes|no\"; exit 0 when all exist, 1 otherwise\n"
    "  prefix [--ranks N] KEY...\n"
    "                          how many leading blocks are stored (N keys a block, one\n"
    "                          per rank, in block order): print the count; exit 0 when\n"
    "                          all are, 1 otherwise\n"
    "  size KEY...             print \"KEY: SIZE\" (bytes)\n"
    "  rm [--force] KEY...     remove keys (--force: even under a read lease)\n"
    "  rm [--force] --regex PATTERN\n"
    "                          remove keys matching a PCRE2 regex (unanchored search);\n"
    "                          print the count removed; exit 1 when a read lease\n"
    "                          kept some that matched (stderr says how many)\n"
    "  rm --all [--force]      remove every object; print the count\n"
    "  reset                   drain transfers, remove every object; print the count\n"
    "  stats                   node statistics, one \"name: value\" per line\n"
    "  segments                mounted segments: id, name, size, used bytes\n"
    "  nodes                   the cluster's nodes: id, host, client endpoint, alive, space\n"
    "  locate KEY...           the nodes that hold each key\n"
    "  node drain [--no-wait] [--timeout S] NODE\n"
    "                          no new placements on NODE, and every object only it holds\n"
    "                          copied to other nodes; waits (at most S seconds, default\n"
    "                          600) until none is left, printing progress; exit 1 if some\n"
    "                          are left. Ask a same-machine node over its ipc endpoint\n"
    "  node undrain NODE       NODE takes new placements again\n"
    "  node status NODE        how its drain stands\n"
    "  ping                    round-trip time of one request\n"
    "  keygen NAME             write a CURVE certificate: NAME (public: for a node's\n"
    "                          --curve-allow directory, or a client's --curve-server)\n"
    "                          and NAME_secret (keep it private); no node needed\n"
    "  config get NAME         a setting of the node (a kvpoold option without --)\n"
    "  config set NAME VALUE   change one while the node runs: log-level, lease-ttl,\n"
    "                          eviction-high-watermark, eviction-ratio, disk watermarks\n"
    "  top [--once] [--interval MS]\n"
    "                          live view: ops/s and latency per operation, traffic,\n"
    "                          memory, disk, hit rate, evictions, nodes; q quits;\n"
    "                          --once prints one frame after one interval (default 1000)\n";

//  Prints "kvpool: WHAT: reason (NAME)[: server's reason]".
static void
s_error (kvpool_t *pool, const char *what, int status)
{
    const char *detail = pool ? kvpool_last_error (pool) : "";
    fprintf (stderr, "kvpool: %s: %s (%s)%s%s\n", what, kvpool_strerror (status),
             kvpool_status_name (status), *detail ? ": " : "", detail);
}

static int __attribute__ ((format (printf, 1, 2))) s_usage_error (const char *format, ...)
{
    va_list args;
    va_start (args, format);
    fprintf (stderr, "kvpool: ");
    vfprintf (stderr, format, args);
    fprintf (stderr, "\nTry 'kvpool --help'.\n");
    va_end (args);
    return EXIT_USAGE;
}

//  What a command needs to connect: commands check their arguments first, so that a usage
//  error is reported as one whether or not a node answers.
typedef struct {
    const char *endpoint;
    kvpool_options_t options;
    kvpool_t *pool;
} cli_t;

//  Connects; returns the connection, or NULL after printing why not.
static kvpool_t *
s_connect (cli_t *cli)
{
    cli->pool = kvpool_connect (cli->endpoint, &cli->options);
    if (!cli->pool) {
        int error = errno;
        const char *why = kvpool_connect_error ();
        fprintf (stderr, "kvpool: cannot connect to %s: %s\n", cli->endpoint,
                 error == EINVAL && cli->options.curve_secret_file
                     ? "--curve-secret and --curve-server need a certificate each (kvpool "
                       "keygen)"
                 : *why ? why
                        : strerror (error));
    }
    return cli->pool;
}

static double
s_now_s (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

//  Reads all of fd into a malloc'd buffer, but no more than limit bytes: a longer input
//  (a file, or /dev/zero, that would never fit) fails with EFBIG. Returns 0 or -1 (errno
//  set).
static int
s_read_all (int fd, size_t limit, char **data_p, size_t *size_p)
{
    struct stat st;
    size_t capacity = 1 << 16;
    if (fstat (fd, &st) == 0 && S_ISREG (st.st_mode) && st.st_size > 0) {
        if ((uint64_t) st.st_size > limit) {
            errno = EFBIG;
            return -1;
        }
        capacity = (size_t) st.st_size + 1; //  +1: one read sees the end at once
    }
    if (capacity > limit + 1)
        capacity = limit + 1;
    char *data = malloc (capacity);
    size_t size = 0;
    if (!data)
        return -1;
    while (true) {
        if (size > limit) {
            free (data);
            errno = EFBIG;
            return -1;
        }
        if (size == capacity) {
            size_t grown = capacity * 2 > limit + 1 ? limit + 1 : capacity * 2;
            char *bigger = realloc (data, grown);
            if (!bigger) {
                free (data);
                return -1;
            }
            data = bigger;
            capacity = grown;
        }
        ssize_t got = read (fd, data + size, capacity - size);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int saved = errno;
            free (data);
            errno = saved;
            return -1;
        }
        if (got == 0)
            break;
        size += (size_t) got;
    }
    *data_p = data;
    *size_p = size;
    return 0;
}

static int
s_write_all (int fd, const char *data, size_t size)
{
    while (size > 0) {
        ssize_t put = write (fd, data, size);
        if (put < 0 && errno == EINTR)
            continue;
        if (put < 0)
            return -1;
        data += put;
        size -= (size_t) put;
    }
    return 0;
}

//  Parses a non-negative decimal integer up to max. Returns 0 or -1.
static int
s_parse_uint (const char *text, uint64_t max, uint64_t *value_p)
{
    if (!text || !*text || *text == '-')
        return -1;
    char *end;
    errno = 0;
    unsigned long long value = strtoull (text, &end, 10);
    if (errno || *end || value > max)
        return -1;
    *value_p = value;
    return 0;
}

//  ---- commands: each gets the arguments after its name --------------------------------------

static int
s_cmd_put (cli_t *cli, int argc, char **argv)
{
    kvpool_put_options_t opts = {0};
    bool upsert = false;
    const char *args[2];
    int nargs = 0;
    bool options_done = false;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_done && strcmp (arg, "--") == 0)
            options_done = true;
        else if (!options_done && strcmp (arg, "--replicas") == 0) {
            uint64_t value;
            if (i + 1 >= argc || s_parse_uint (argv[++i], UINT32_MAX, &value) || value == 0)
                return s_usage_error ("put: --replicas needs a count of 1 or more");
            opts.replica_num = (uint32_t) value;
        }
        else if (!options_done && strcmp (arg, "--soft-pin") == 0)
            opts.soft_pin = true;
        else if (!options_done && strcmp (arg, "--hard-pin") == 0)
            opts.hard_pin = true;
        else if (!options_done && strcmp (arg, "--upsert") == 0)
            upsert = true;
        else if (!options_done && arg[0] == '-' && arg[1])
            return s_usage_error ("put: unknown option '%s'", arg);
        else if (nargs < 2)
            args[nargs++] = arg;
        else
            return s_usage_error ("put: too many arguments ('%s')", arg);
    }
    if (nargs < 1)
        return s_usage_error ("put: KEY missing");
    const char *key = args[0];
    const char *path = nargs > 1 && strcmp (args[1], "-") != 0 ? args[1] : NULL;
    int fd = path ? open (path, O_RDONLY) : STDIN_FILENO;
    if (fd < 0) {
        fprintf (stderr, "kvpool: put %s: cannot read %s: %s\n", key, path, strerror (errno));
        return 1;
    }
    kvpool_t *pool = s_connect (cli);
    if (!pool) {
        if (path)
            close (fd);
        return 1;
    }
    //  Read no more than the node takes: the input may be endless (/dev/zero).
    kvpool_stats_t stats;
    uint64_t limit = DEFAULT_MAX_VALUE;
    if (kvpool_stats (pool, &stats) == KVPOOL_OK && stats.max_value_size > 0)
        limit = stats.max_value_size;
    if (limit > SIZE_MAX - 1)
        limit = SIZE_MAX - 1;
    //  A put typed at a terminal would wait without a word for the value.
    if (!path && isatty (fd))
        fprintf (stderr,
                 "kvpool: %s %s: reading the value from standard input (end it with "
                 "Ctrl-D)\n",
                 upsert ? "upsert" : "put", key);
    char *data = NULL;
    size_t size = 0;
    int read_rc = s_read_all (fd, (size_t) limit, &data, &size);
    int read_errno = errno;
    if (path)
        close (fd);
    if (read_rc) {
        if (read_errno == EFBIG)
            fprintf (stderr,
                     "kvpool: put %s: %s is larger than the node's largest value (%" PRIu64
                     " bytes)\n",
                     key, path ? path : "stdin", limit);
        else
            fprintf (stderr, "kvpool: put %s: cannot read %s: %s\n", key, path ? path : "stdin",
                     strerror (read_errno));
        return 1;
    }
    int rc = upsert ? kvpool_upsert (pool, key, data, size, &opts)
                    : kvpool_put (pool, key, data, size, &opts);
    free (data);
    if (rc != KVPOOL_OK) {
        char what[512];
        snprintf (what, sizeof what, "put %s", key);
        s_error (pool, what, rc);
        return 1;
    }
    return 0;
}

//  Gets a value into a malloc'd buffer. On the node's machine it asks for the size, then
//  copies the value straight from shared memory; kvpool_get would read it over the socket.
static int
s_get_value (kvpool_t *pool, const char *key, void **data_p, size_t *size_p)
{
    //  The key may be removed and put again with another size in between: then retry.
    for (int attempt = 0; kvpool_fast_path (pool) && attempt < 3; attempt++) {
        int64_t size = kvpool_get_size (pool, key);
        if (size < 0)
            return (int) size;
        void *data = malloc (size ? (size_t) size : 1);
        if (!data)
            return KVPOOL_INTERNAL_ERROR;
        int64_t got = kvpool_get_into (pool, key, data, (size_t) size);
        if (got >= 0) {
            *data_p = data;
            *size_p = (size_t) got;
            return KVPOOL_OK;
        }
        free (data);
        if (got != KVPOOL_BUFFER_OVERFLOW)
            return (int) got;
    }
    return kvpool_get (pool, key, data_p, size_p);
}

static int
s_cmd_get (cli_t *cli, int argc, char **argv)
{
    int first = argc > 0 && strcmp (argv[0], "--") == 0 ? 1 : 0;
    if (argc - first < 1)
        return s_usage_error ("get: KEY missing");
    if (argc - first > 2)
        return s_usage_error ("get: too many arguments ('%s')", argv[first + 2]);
    const char *key = argv[first];
    const char *path =
        argc - first > 1 && strcmp (argv[first + 1], "-") != 0 ? argv[first + 1] : NULL;
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    void *data;
    size_t size;
    int rc = s_get_value (pool, key, &data, &size);
    if (rc != KVPOOL_OK) {
        char what[512];
        snprintf (what, sizeof what, "get %s", key);
        s_error (pool, what, rc);
        return 1;
    }
    //  The file is only created once the value is here: a failed get leaves no empty file.
    int fd = path ? open (path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : STDOUT_FILENO;
    int result = 0;
    if (fd < 0 || s_write_all (fd, data, size) || (path && close (fd))) {
        fprintf (stderr, "kvpool: get %s: cannot write %s: %s\n", key, path ? path : "stdout",
                 strerror (errno));
        result = 1;
    }
    free (data);
    return result;
}

//  Skips a leading "--" in a key list.
static void
s_skip_dashes (int *argc, char ***argv)
{
    if (*argc > 0 && strcmp ((*argv)[0], "--") == 0) {
        (*argc)--;
        (*argv)++;
    }
}

static int
s_cmd_prefix (cli_t *cli, int argc, char **argv)
{
    size_t ranks = 1;
    if (argc >= 2 && strcmp (argv[0], "--ranks") == 0) {
        char *end;
        unsigned long n = strtoul (argv[1], &end, 10);
        if (*end || n == 0 || n > 65536)
            return s_usage_error ("prefix: --ranks needs a count of 1 to 65536");
        ranks = n;
        argc -= 2;
        argv += 2;
    }
    s_skip_dashes (&argc, &argv);
    if (argc < 1)
        return s_usage_error ("prefix: KEY missing");
    if ((size_t) argc % ranks)
        return s_usage_error ("prefix: %d keys are not whole blocks of %zu ranks", argc, ranks);
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    size_t blocks = (size_t) argc / ranks;
    int64_t count = kvpool_prefix_match (pool, blocks, ranks, (const char *const *) argv);
    if (count < 0) {
        s_error (pool, "prefix", (int) count);
        return 1;
    }
    printf ("%lld\n", (long long) count);
    return (size_t) count == blocks ? 0 : 1;
}

static int
s_cmd_exists (cli_t *cli, int argc, char **argv)
{
    s_skip_dashes (&argc, &argv);
    if (argc < 1)
        return s_usage_error ("exists: KEY missing");
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    int *results = calloc ((size_t) argc, sizeof *results);
    if (!results)
        return 1;
    //  A failure of the request as a whole is in every key's result too.
    kvpool_exist_batch (pool, (size_t) argc, (const char *const *) argv, results);
    int exit_code = 0;
    for (int i = 0; i < argc; i++) {
        if (results[i] == 1)
            printf ("%s: yes\n", argv[i]);
        else if (results[i] == 0) {
            printf ("%s: no\n", argv[i]);
            exit_code = 1;
        }
        else {
            char what[512];
            snprintf (what, sizeof what, "exists %s", argv[i]);
            s_error (pool, what, results[i]);
            exit_code = 1;
        }
    }
    free (results);
    return exit_code;
}

static int
s_cmd_size (cli_t *cli, int argc, char **argv)
{
    s_skip_dashes (&argc, &argv);
    if (argc < 1)
        return s_usage_error ("size: KEY missing");
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    int64_t *results = calloc ((size_t) argc, sizeof *results);
    if (!results)
        return 1;
    kvpool_get_size_batch (pool, (size_t) argc, (const char *const *) argv, results);
    int exit_code = 0;
    for (int i = 0; i < argc; i++) {
        if (results[i] >= 0)
            printf ("%s: %" PRId64 "\n", argv[i], results[i]);
        else {
            char what[512];
            snprintf (what, sizeof what, "size %s", argv[i]);
            s_error (pool, what, (int) results[i]);
            exit_code = 1;
        }
    }
    free (results);
    return exit_code;
}

static int
s_cmd_rm (cli_t *cli, int argc, char **argv)
{
    bool force = false, all = false, options_done = false;
    const char *pattern = NULL;
    char **keys = calloc ((size_t) argc + 1, sizeof *keys);
    int nkeys = 0;
    if (!keys)
        return 1;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_done && strcmp (arg, "--") == 0)
            options_done = true;
        else if (!options_done && strcmp (arg, "--force") == 0)
            force = true;
        else if (!options_done && strcmp (arg, "--all") == 0)
            all = true;
        else if (!options_done && strcmp (arg, "--regex") == 0) {
            if (i + 1 >= argc) {
                free (keys);
                return s_usage_error ("rm: --regex needs a PATTERN");
            }
            pattern = argv[++i];
        }
        else if (!options_done && arg[0] == '-' && arg[1]) {
            free (keys);
            return s_usage_error ("rm: unknown option '%s'", arg);
        }
        else
            keys[nkeys++] = argv[i];
    }
    int modes = (all ? 1 : 0) + (pattern ? 1 : 0) + (nkeys ? 1 : 0);
    if (modes != 1) {
        free (keys);
        return s_usage_error (
            "rm: give either KEY..., --regex PATTERN or --all (exactly one of them)");
    }
    kvpool_t *pool = s_connect (cli);
    if (!pool) {
        free (keys);
        return 1;
    }
    int exit_code = 0;
    if (all || pattern) {
        uint64_t matched = 0, kept = 0;
        int64_t count = all ? kvpool_remove_all (pool, force)
                            : kvpool_remove_by_regex_counts (pool, pattern, force, &matched, &kept);
        if (count < 0) {
            char what[512];
            snprintf (what, sizeof what, all ? "rm --all" : "rm --regex %s", pattern);
            s_error (pool, what, (int) count);
            exit_code = 1;
        }
        else
            printf ("%" PRId64 "\n", count);
        //  Keys that matched and stayed must not read as "nothing matched".
        if (count >= 0 && kept > 0) {
            fprintf (stderr,
                     "kvpool: rm --regex %s: removed %" PRId64 " of %" PRIu64
                     " matching keys; %" PRIu64 " kept by a read lease (--force removes them)\n",
                     pattern, count, matched, kept);
            exit_code = 1;
        }
    }
    else {
        int *statuses = calloc ((size_t) nkeys, sizeof *statuses);
        if (!statuses) {
            free (keys);
            return 1;
        }
        kvpool_remove_batch (pool, (size_t) nkeys, (const char *const *) keys, force, statuses);
        for (int i = 0; i < nkeys; i++)
            if (statuses[i] != KVPOOL_OK) {
                char what[512];
                snprintf (what, sizeof what, "rm %s", keys[i]);
                s_error (pool, what, statuses[i]);
                exit_code = 1;
            }
        free (statuses);
    }
    free (keys);
    return exit_code;
}

static int
s_cmd_reset (cli_t *cli, int argc, char **argv)
{
    if (argc > 0)
        return s_usage_error ("reset: unexpected argument '%s'", argv[0]);
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    int64_t count = kvpool_reset (pool);
    if (count < 0) {
        s_error (pool, "reset", (int) count);
        return 1;
    }
    printf ("%" PRId64 "\n", count);
    return 0;
}

static int
s_cmd_stats (cli_t *cli, int argc, char **argv)
{
    if (argc > 0)
        return s_usage_error ("stats: unexpected argument '%s'", argv[0]);
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    kvpool_stats_t stats;
    int rc = kvpool_stats (pool, &stats);
    if (rc != KVPOOL_OK) {
        s_error (pool, "stats", rc);
        return 1;
    }
    //  One "name: value" line per field of the proto's Stats, in its order (kvpool_stats.h).
#define CLI_STATS_ROW(type, name, text)                                                            \
    if (sizeof (type) == sizeof (double) && (type) 0.5 != 0)                                       \
        printf ("%s: %.6f\n", #name, (double) stats.name);                                         \
    else                                                                                           \
        printf ("%s: %" PRIu64 "\n", #name, (uint64_t) stats.name);
    KVPOOL_STATS_FIELDS (CLI_STATS_ROW)
#undef CLI_STATS_ROW
    return 0;
}

static int
s_cmd_segments (cli_t *cli, int argc, char **argv)
{
    if (argc > 0)
        return s_usage_error ("segments: unexpected argument '%s'", argv[0]);
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    //  Ask once for the count, then for all of them (a mount in between is caught below).
    int count = kvpool_segments (pool, NULL, 0);
    kvpool_segment_t *segments = NULL;
    if (count > 0) {
        segments = calloc ((size_t) count, sizeof *segments);
        if (!segments)
            return 1;
        int again = kvpool_segments (pool, segments, (size_t) count);
        count = again < 0 ? again : (again < count ? again : count);
    }
    if (count < 0) {
        s_error (pool, "segments", count);
        free (segments);
        return 1;
    }
    printf ("%-6s %-40s %16s %16s\n", "id", "name", "size", "used");
    for (int i = 0; i < count; i++)
        printf ("%-6u %-40s %16" PRIu64 " %16" PRIu64 "\n", segments[i].id, segments[i].name,
                segments[i].size, segments[i].used);
    free (segments);
    return 0;
}

//  The cluster's nodes, or (with keys) the nodes that hold each key.
static int
s_cmd_nodes (cli_t *cli, int argc, char **argv, bool locate)
{
    if (!locate && argc > 0)
        return s_usage_error ("nodes: unexpected argument '%s'", argv[0]);
    if (locate && argc == 0)
        return s_usage_error ("locate: which keys?");
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    kvpool_node_t nodes[64];
    int failed = 0;
    if (!locate) {
        int count = kvpool_nodes (pool, nodes, 64);
        if (count < 0) {
            s_error (pool, "nodes", count);
            return 1;
        }
        printf ("%-32s %-24s %-28s %6s %12s %12s %10s\n", "node", "host", "clients", "alive",
                "capacity", "free", "objects");
        for (int i = 0; i < count && i < 64; i++)
            printf ("%-32s %-24.24s %-28s %6s %12" PRIu64 " %12" PRIu64 " %10" PRIu64 "\n",
                    nodes[i].node_id, nodes[i].host_id, nodes[i].client_endpoint,
                    nodes[i].alive ? "yes" : "no", nodes[i].capacity, nodes[i].free,
                    nodes[i].objects);
        return 0;
    }
    for (int k = 0; k < argc; k++) {
        uint64_t size = 0;
        int count = kvpool_locate (pool, argv[k], &size, nodes, 64);
        if (count < 0) {
            s_error (pool, argv[k], count);
            failed = 1;
            continue;
        }
        printf ("%s: %" PRIu64 " bytes on", argv[k], size);
        for (int i = 0; i < count && i < 64; i++)
            printf (" %s (%s)", nodes[i].node_id, nodes[i].client_endpoint);
        printf ("\n");
    }
    return failed;
}

static int
s_cmd_list_nodes (cli_t *cli, int argc, char **argv)
{
    return s_cmd_nodes (cli, argc, argv, false);
}

static int
s_cmd_locate (cli_t *cli, int argc, char **argv)
{
    return s_cmd_nodes (cli, argc, argv, true);
}

//  node drain | undrain | status NODE (docs/cluster.md "Repair and drain").
static int
s_cmd_node (cli_t *cli, int argc, char **argv)
{
    bool wait = true;
    double timeout_s = 600;
    int i = 1;
    const char *verb = argc >= 1 ? argv[0] : "";
    for (; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; i++) {
        if (!strcmp (argv[i], "--no-wait"))
            wait = false;
        else if (!strcmp (argv[i], "--timeout") && i + 1 < argc)
            timeout_s = atof (argv[++i]);
        else
            return s_usage_error ("node: unknown option '%s'", argv[i]);
    }
    if (i != argc - 1
        || (strcmp (verb, "drain") && strcmp (verb, "undrain") && strcmp (verb, "status")))
        return s_usage_error ("node drain [--no-wait] [--timeout S] NODE, node undrain NODE, or "
                              "node status NODE");
    const char *node = argv[i];
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    const char *action = !strcmp (verb, "drain")     ? "start"
                         : !strcmp (verb, "undrain") ? "stop"
                                                     : NULL;
    kvpool_drain_t state;
    int rc = kvpool_node_drain (pool, node, action, &state);
    if (rc != KVPOOL_OK) {
        s_error (pool, node, rc);
        return 1;
    }
    if (!strcmp (verb, "drain") && wait) {
        int64_t deadline = zclock_mono () + (int64_t) (timeout_s * 1000);
        uint64_t shown = UINT64_MAX;
        while (rc == KVPOOL_OK && state.sole > 0 && zclock_mono () < deadline) {
            if (state.sole != shown)
                fprintf (stderr, "kvpool: node %s: %" PRIu64 " objects only there still\n", node,
                         state.sole);
            shown = state.sole;
            zclock_sleep (500);
            //  (start again: a master that took over since knows of no drain)
            rc = kvpool_node_drain (pool, node, "start", &state);
        }
        if (rc != KVPOOL_OK) {
            s_error (pool, node, rc);
            return 1;
        }
    }
    printf ("node %s: %s, %" PRIu64 " objects only there, %" PRIu64
            " with fewer replicas elsewhere than asked\n",
            node, state.draining ? "draining" : "not draining", state.sole, state.short_count);
    return !strcmp (verb, "drain") && wait && state.sole > 0 ? 1 : 0;
}

static int
s_cmd_config (cli_t *cli, int argc, char **argv)
{
    bool set = argc >= 1 && !strcmp (argv[0], "set");
    if (!(argc == 2 && !strcmp (argv[0], "get")) && !(argc == 3 && set))
        return s_usage_error ("config get NAME, or config set NAME VALUE");
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    char value[1024];
    int rc = kvpool_config (pool, argv[1], set ? argv[2] : NULL, value, sizeof value);
    if (rc != KVPOOL_OK) {
        s_error (pool, argv[1], rc);
        return 1;
    }
    printf ("%s = %s\n", argv[1], value);
    return 0;
}

static int
s_cmd_top (cli_t *cli, int argc, char **argv)
{
    bool once = false;
    int interval = 1000;
    for (int i = 0; i < argc; i++) {
        if (!strcmp (argv[i], "--once"))
            once = true;
        else if (!strcmp (argv[i], "--interval") && i + 1 < argc) {
            char *end = NULL;
            long value = strtol (argv[++i], &end, 10);
            if (!end || *end || value < 100 || value > 3600000)
                return s_usage_error ("top: --interval takes milliseconds, 100 to 3600000");
            interval = (int) value;
        }
        else
            return s_usage_error ("top: unexpected argument '%s'", argv[i]);
    }
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    return kvpool_top (pool, cli->endpoint, once, interval);
}

//  keygen NAME: a new CURVE key pair, as CZMQ's zcert_save writes it (NAME and NAME_secret,
//  the secret one readable by its owner alone). Existing files are never overwritten.
static int
s_cmd_keygen (cli_t *cli, int argc, char **argv)
{
    (void) cli;
    if (argc != 1 || !*argv[0])
        return s_usage_error ("keygen NAME");
    char secret[4096];
    snprintf (secret, sizeof secret, "%s_secret", argv[0]);
    if (access (argv[0], F_OK) == 0 || access (secret, F_OK) == 0) {
        fprintf (stderr, "kvpool: keygen: %s or %s exists; not overwritten\n", argv[0], secret);
        return 1;
    }
    zcert_t *cert = zcert_new ();
    if (!cert) {
        fprintf (stderr, "kvpool: keygen: cannot make a key pair\n");
        return 1;
    }
    zcert_set_meta (cert, "name", "%s", argv[0]);
    zcert_set_meta (cert, "created-by", "kvpool keygen");
    int rc = zcert_save (cert, argv[0]);
    if (rc == 0)
        chmod (secret, 0600);
    if (rc != 0)
        fprintf (stderr, "kvpool: keygen: cannot write %s: %s\n", argv[0], strerror (errno));
    else
        printf ("%s: public certificate (key %s)\n%s: secret certificate\n", argv[0],
                zcert_public_txt (cert), secret);
    zcert_destroy (&cert);
    return rc == 0 ? 0 : 1;
}

static int
s_cmd_ping (cli_t *cli, int argc, char **argv)
{
    if (argc > 0)
        return s_usage_error ("ping: unexpected argument '%s'", argv[0]);
    kvpool_t *pool = s_connect (cli);
    if (!pool)
        return 1;
    double start = s_now_s ();
    int rc = kvpool_ping (pool);
    double elapsed = s_now_s () - start;
    if (rc != KVPOOL_OK) {
        s_error (pool, "ping", rc);
        return 1;
    }
    printf ("pong from %s: %.3f ms%s\n", cli->endpoint, elapsed * 1000,
            kvpool_fast_path (pool) ? " (same machine, fast path on)" : "");
    return 0;
}

int
main (int argc, char **argv)
{
    cli_t cli = {.endpoint = KVPOOL_DEFAULT_ENDPOINT};
    kvpool_options_init (&cli.options);
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *arg = argv[i];
        if (!strcmp (arg, "-h") || !strcmp (arg, "--help")) {
            fputs (s_usage, stdout);
            return 0;
        }
        if (!strcmp (arg, "--version")) {
            printf ("kvpool %s\n", KVPOOL_VERSION);
            return 0;
        }
        else if (!strcmp (arg, "-s") || !strcmp (arg, "--server") || !strcmp (arg, "--endpoint")) {
            if (i + 1 >= argc)
                return s_usage_error ("%s needs an ENDPOINT", arg);
            cli.endpoint = argv[++i];
        }
        else if (!strcmp (arg, "-t") || !strcmp (arg, "--timeout")) {
            uint64_t value;
            if (i + 1 >= argc || s_parse_uint (argv[i + 1], INT32_MAX, &value) || value == 0)
                return s_usage_error ("%s needs a timeout in milliseconds (1 or more)", arg);
            cli.options.timeout_ms = (int) value;
            i++;
        }
        else if (!strcmp (arg, "--no-fast-path"))
            cli.options.fast_path = 0;
        else if (!strcmp (arg, "--curve-secret") || !strcmp (arg, "--curve-server")) {
            if (i + 1 >= argc)
                return s_usage_error ("%s needs a certificate FILE", arg);
            if (!strcmp (arg, "--curve-secret"))
                cli.options.curve_secret_file = argv[++i];
            else
                cli.options.curve_server_file = argv[++i];
        }
        else
            return s_usage_error ("unknown option '%s'", arg);
    }
    if (i >= argc)
        return s_usage_error ("no COMMAND given");
    const char *command = argv[i++];
    int cargc = argc - i;
    char **cargv = argv + i;
    static const struct {
        const char *name;
        int (*run) (cli_t *cli, int argc, char **argv);
    } commands[] = {{"put", s_cmd_put},
                    {"get", s_cmd_get},
                    {"exists", s_cmd_exists},
                    {"size", s_cmd_size},
                    {"rm", s_cmd_rm},
                    {"reset", s_cmd_reset},
                    {"segments", s_cmd_segments},
                    {"nodes", s_cmd_list_nodes},
                    {"locate", s_cmd_locate},
                    {"prefix", s_cmd_prefix},
                    {"stats", s_cmd_stats},
                    {"ping", s_cmd_ping},
                    {"top", s_cmd_top},
                    {"config", s_cmd_config},
                    {"node", s_cmd_node},
                    {"keygen", s_cmd_keygen}};
    if (!strcmp (command, "help")) {
        fputs (s_usage, stdout);
        return 0;
    }
    int rc = -1;
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++)
        if (!strcmp (commands[c].name, command))
            rc = commands[c].run (&cli, cargc, cargv);
    if (rc == -1)
        return s_usage_error ("unknown command '%s'", command);
    if (fflush (stdout) || ferror (stdout)) {
        if (rc == 0)
            fprintf (stderr, "kvpool: %s: cannot write to stdout\n", command);
        rc = 1;
    }
    kvpool_destroy (&cli.pool);
    return rc;
}
