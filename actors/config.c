/*  config.c - kvpoold's option table and command-line parser.

    One declarative table (s_options) lists every option with its kind, bounds, default and
    help text; parsing, validation and --help all come from it, so an option exists in exactly
    one place. Settings come from the command line only (DESIGN section 7: no environment).
*/
#include "actors/config.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum {
    OPT_FLAG,
    OPT_UINT,
    OPT_SIZE,
    OPT_STRING,
    OPT_LIST,
    OPT_PLACEMENT,
    OPT_GROUP
} opt_kind_t;

typedef struct {
    const char *name;
    opt_kind_t kind;
    size_t offset;       //  into kvp_config_t
    size_t count_offset; //  OPT_LIST: the count field
    uint64_t min, max;
    const char *help;
} opt_t;

#define OFF(field) offsetof (kvp_config_t, field)

static const opt_t s_options[] = {
    {"endpoint", OPT_LIST, OFF (endpoints), OFF (endpoint_count), 0, 0,
     "client endpoint to bind (repeatable; tcp:// or ipc://). Default tcp://127.0.0.1:50051 "
     "and ipc://@kvpool-50051"},
    {"admin", OPT_LIST, OFF (admin_endpoints), OFF (admin_endpoint_count), 0, 0,
     "lookup/reset admin endpoint (repeatable). Default tcp://127.0.0.1:50052"},
    {"ready-file", OPT_STRING, OFF (ready_file), 0, 0, 0,
     "write the bound endpoints here once serving (endpoint=..., admin=...)"},
    {"segment-size", OPT_SIZE, OFF (segment_size), 0, 1 << 20, 1ULL << 44,
     "bytes per segment (1073741824, 512MiB, 4GB, 1.5gb). Default 1GiB"},
    {"segments", OPT_UINT, OFF (segments), 0, 1, 64, "number of local segments. Default 1"},
    {"lock-memory", OPT_FLAG, OFF (lock_memory), 0, 0, 0, "mlock the segments"},
    {"lease-ttl", OPT_UINT, OFF (lease_ttl_ms), 0, 1, 86400000,
     "read lease in ms granted by get, exist and get-replica-list. Default 10000"},
    {"put-timeout", OPT_UINT, OFF (put_timeout_ms), 0, 1, 86400000,
     "ms after which an uncommitted put-start is revoked and its space reclaimed. "
     "Default 30000"},
    {"soft-pin-ttl", OPT_UINT, OFF (soft_pin_ttl_ms), 0, 1, UINT32_MAX * 1000ULL,
     "default soft pin lifetime in ms. Default 1800000"},
    {"max-key-len", OPT_UINT, OFF (max_key_len), 0, 1, 65536, "longest key in bytes. Default 4096"},
    {"max-value-size", OPT_SIZE, OFF (max_value_size), 0, 1, 1ULL << 40,
     "largest value. Default 1GiB (and never more than a segment)"},
    {"max-request-bytes", OPT_SIZE, OFF (max_request_bytes), 0, 1, 1ULL << 44,
     "largest request: all its value frames together. Default 4GiB"},
    {"max-keys", OPT_UINT, OFF (max_keys), 0, 1, 1 << 22,
     "most keys in one request. Default 262144"},
    {"max-unread-bytes", OPT_SIZE, OFF (max_unread_bytes), 0, 1, 1ULL << 44,
     "reply bytes a connection may leave unread: past it its GETs are refused, and after 10 s "
     "its connection is closed (its pinned values released). Default 4GiB"},
    {"max-regex-len", OPT_UINT, OFF (max_regex_len), 0, 1, 65536,
     "longest remove-by-regex pattern in bytes. Default 4096"},
    {"regex-time-limit", OPT_UINT, OFF (regex_time_limit_ms), 0, 1, 20000,
     "ms one remove-by-regex may spend matching keys before it is refused (nothing removed; "
     "at most 20000, within the 30 s a stopping daemon waits for requests). Default 4000"},
    {"workers", OPT_UINT, OFF (workers), 0, 1, 256,
     "transfer worker threads. Default: number of cores"},
    {"index-slots", OPT_UINT, OFF (index_slots), 0, 0, 1ULL << 30,
     "slots of the same-machine read index (256 bytes each; 0 disables it). "
     "Default: one per 32 KiB of pool"},
    {"placement", OPT_PLACEMENT, OFF (placement), 0, 0, 0,
     "replica placement across segments: random or free-ratio. Default random"},
    {"seed", OPT_UINT, OFF (seed), 0, 0, UINT64_MAX, "seed for random placement. Default 1"},
    {"group", OPT_GROUP, OFF (group), 0, 0, 0,
     "a group (name or gid) whose processes may use the ipc endpoint and shared memory too. "
     "Default: only the node's own user (and root)"},
    {"max-connections", OPT_UINT, OFF (max_connections), 0, 1, 1ULL << 24,
     "client connections at which new ones are refused until a tenth have closed. Default: "
     "the file descriptor limit less a reserve (a quarter, 256 to 1024)"},
    {"verbose", OPT_FLAG, OFF (verbose), 0, 0, 0, "log every request"},
    {"lookup-key-template", OPT_STRING, OFF (lookup.key_template), 0, 0, 0,
     "key template of the lookup channel. Default " LOOKUP_DEFAULT_KEY_TEMPLATE},
    {"lookup-model", OPT_STRING, OFF (lookup.model), 0, 0, 0, "{model} in lookup keys"},
    {"lookup-tp-size", OPT_UINT, OFF (lookup.tp_size), 0, 1, 1024,
     "tensor-parallel ranks a lookup checks. Default 1"},
    {"lookup-pp-size", OPT_UINT, OFF (lookup.pp_size), 0, 1, 1024,
     "pipeline-parallel ranks a lookup checks. Default 1"},
    {"lookup-pcp-rank", OPT_UINT, OFF (lookup.pcp_rank), 0, 0, 1024, "{pcp} in lookup keys"},
    {"lookup-dcp-rank", OPT_UINT, OFF (lookup.dcp_rank), 0, 0, 1024, "{dcp} in lookup keys"},
    {"lookup-block-size", OPT_UINT, OFF (lookup.block_size), 0, 1, 1 << 20,
     "tokens per block. Default 16"},
    {NULL, 0, 0, 0, 0, 0, NULL}};

void
kvp_config_defaults (kvp_config_t *config)
{
    memset (config, 0, sizeof *config);
    snprintf (config->instance, sizeof config->instance, "kvpool");
    config->segment_size = 1ULL << 30;
    config->segments = 1;
    config->lease_ttl_ms = 10000;
    config->put_timeout_ms = 30000;
    config->soft_pin_ttl_ms = 30 * 60 * 1000;
    config->max_key_len = 4096;
    config->max_value_size = 1ULL << 30;
    config->max_request_bytes = 4ULL << 30;
    config->max_keys = 262144;
    config->max_unread_bytes = 4ULL << 30;
    config->max_regex_len = 4096;
    config->regex_time_limit_ms = 4000; //  answered within a client's default 5 s timeout
    long cores = sysconf (_SC_NPROCESSORS_ONLN);
    config->workers = cores > 0 ? (uint32_t) cores : 2;
    config->placement = KVP_PLACEMENT_RANDOM;
    config->seed = 1;
    config->index_slots = UINT64_MAX; //  sized by the pool unless set
    config->lookup.key_template = LOOKUP_DEFAULT_KEY_TEMPLATE;
    config->lookup.model = "";
    config->lookup.tp_size = 1;
    config->lookup.pp_size = 1;
    config->lookup.block_size = 16;
}

int
kvp_parse_size (const char *text, uint64_t *size_p)
{
    if (!text || !*text)
        return -1;
    errno = 0;
    char *end;
    double number = strtod (text, &end);
    if (errno || end == text || number < 0 || !isfinite (number))
        return -1;
    double scale = 1;
    switch (tolower ((unsigned char) *end)) {
        case 'k':
            scale = 1024.0;
            end++;
            break;
        case 'm':
            scale = 1024.0 * 1024;
            end++;
            break;
        case 'g':
            scale = 1024.0 * 1024 * 1024;
            end++;
            break;
        case 't':
            scale = 1024.0 * 1024 * 1024 * 1024;
            end++;
            break;
        default: break;
    }
    if (scale > 1 && tolower ((unsigned char) *end) == 'i')
        end++;
    if (tolower ((unsigned char) *end) == 'b')
        end++;
    if (*end)
        return -1;
    double bytes = number * scale;
    if (bytes >= 18446744073709551615.0)
        return -1;
    //  "1.5" bytes is not a size; 1.5gb is.
    if (bytes != floor (bytes))
        return -1;
    *size_p = (uint64_t) bytes;
    return 0;
}

static int
s_parse_uint (const char *text, uint64_t *value_p)
{
    if (!text || !*text || *text == '-')
        return -1;
    errno = 0;
    char *end;
    unsigned long long value = strtoull (text, &end, 10);
    if (errno || *end)
        return -1;
    *value_p = value;
    return 0;
}

static int
s_set (kvp_config_t *config, const opt_t *opt, const char *value)
{
    char *base = (char *) config;
    uint64_t number = 0;
    switch (opt->kind) {
        case OPT_FLAG: *(bool *) (base + opt->offset) = true; return 0;
        case OPT_STRING: *(const char **) (base + opt->offset) = value; return 0;
        case OPT_LIST: {
            size_t *count = (size_t *) (base + opt->count_offset);
            if (*count >= KVP_MAX_ENDPOINTS) {
                fprintf (stderr, "kvpoold: at most %d --%s\n", KVP_MAX_ENDPOINTS, opt->name);
                return -1;
            }
            ((const char **) (base + opt->offset))[(*count)++] = value;
            return 0;
        }
        case OPT_PLACEMENT:
            if (!strcmp (value, "random"))
                *(kvp_placement_t *) (base + opt->offset) = KVP_PLACEMENT_RANDOM;
            else if (!strcmp (value, "free-ratio"))
                *(kvp_placement_t *) (base + opt->offset) = KVP_PLACEMENT_FREE_RATIO;
            else {
                fprintf (stderr, "kvpoold: --%s takes random or free-ratio, not '%s'\n", opt->name,
                         value);
                return -1;
            }
            return 0;
        case OPT_GROUP: {
            struct group *entry = getgrnam (value);
            if (entry)
                number = entry->gr_gid;
            else if (s_parse_uint (value, &number) == -1 || number >= UINT32_MAX) {
                fprintf (stderr, "kvpoold: --%s: no group '%s'\n", opt->name, value);
                return -1;
            }
            config->group = (gid_t) number;
            config->group_set = true;
            return 0;
        }
        case OPT_UINT:
        case OPT_SIZE:
            if ((opt->kind == OPT_SIZE ? kvp_parse_size (value, &number)
                                       : s_parse_uint (value, &number))
                == -1) {
                fprintf (stderr, "kvpoold: --%s: '%s' is not a %s\n", opt->name, value,
                         opt->kind == OPT_SIZE ? "size (e.g. 512MiB, 4GB)" : "whole number");
                return -1;
            }
            if (number < opt->min || number > opt->max) {
                fprintf (stderr, "kvpoold: --%s must be between %llu and %llu\n", opt->name,
                         (unsigned long long) opt->min, (unsigned long long) opt->max);
                return -1;
            }
            //  Each numeric field is uint64_t except the uint32_t ones below.
            if (opt->offset == OFF (segments) || opt->offset == OFF (workers)
                || opt->offset == OFF (lookup.tp_size) || opt->offset == OFF (lookup.pp_size)
                || opt->offset == OFF (lookup.pcp_rank) || opt->offset == OFF (lookup.dcp_rank)
                || opt->offset == OFF (lookup.block_size))
                *(uint32_t *) (base + opt->offset) = (uint32_t) number;
            else
                *(uint64_t *) (base + opt->offset) = number;
            return 0;
    }
    return -1;
}

void
kvp_config_usage (FILE *out)
{
    fprintf (out, "usage: kvpoold [OPTION...]\n"
                  "Serves the kvpool store (role all: master and node in one process).\n\n");
    for (const opt_t *opt = s_options; opt->name; opt++) {
        const char *arg = opt->kind == OPT_FLAG        ? ""
                          : opt->kind == OPT_SIZE      ? " SIZE"
                          : opt->kind == OPT_UINT      ? " N"
                          : opt->kind == OPT_LIST      ? " ENDPOINT"
                          : opt->kind == OPT_PLACEMENT ? " POLICY"
                                                       : " VALUE";
        char left[64];
        snprintf (left, sizeof left, "--%s%s", opt->name, arg);
        fprintf (out, "  %-28s %s\n", left, opt->help);
    }
    fprintf (out, "  %-28s %s\n", "--help", "print this and exit");
}

int
kvp_config_parse (kvp_config_t *config, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp (arg, "--help") || !strcmp (arg, "-h")) {
            kvp_config_usage (stdout);
            return 1;
        }
        if (strncmp (arg, "--", 2) != 0) {
            fprintf (stderr, "kvpoold: unexpected argument '%s' (see --help)\n", arg);
            return -1;
        }
        const char *name = arg + 2;
        const char *eq = strchr (name, '=');
        size_t name_len = eq ? (size_t) (eq - name) : strlen (name);
        const opt_t *opt = s_options;
        while (opt->name
               && !(strlen (opt->name) == name_len && !strncmp (opt->name, name, name_len)))
            opt++;
        if (!opt->name) {
            fprintf (stderr, "kvpoold: unknown option '%s' (see --help)\n", arg);
            return -1;
        }
        const char *value = NULL;
        if (opt->kind != OPT_FLAG) {
            if (eq)
                value = eq + 1;
            else if (i + 1 < argc)
                value = argv[++i];
            else {
                fprintf (stderr, "kvpoold: --%s needs a value\n", opt->name);
                return -1;
            }
        }
        if (s_set (config, opt, value) == -1)
            return -1;
    }
    if (config->max_value_size > config->segment_size)
        config->max_value_size = config->segment_size;
    return 0;
}

void
kvp_config_test (bool verbose)
{
    uint64_t size;
    assert (kvp_parse_size ("1073741824", &size) == 0 && size == 1073741824ULL);
    assert (kvp_parse_size ("512MiB", &size) == 0 && size == 512ULL << 20);
    assert (kvp_parse_size ("4GB", &size) == 0 && size == 4ULL << 30);
    assert (kvp_parse_size ("1.5gb", &size) == 0 && size == 3ULL << 29);
    assert (kvp_parse_size ("64k", &size) == 0 && size == 65536);
    assert (kvp_parse_size ("", &size) == -1);
    assert (kvp_parse_size ("12x", &size) == -1);
    assert (kvp_parse_size ("-1", &size) == -1);
    assert (kvp_parse_size ("1.5", &size) == -1);

    kvp_config_t config;
    kvp_config_defaults (&config);
    char *args[] = {"--segment-size", "256MiB",        "--segments=3",     "--endpoint",
                    "tcp://a",        "--endpoint",    "ipc://@b",         "--placement",
                    "free-ratio",     "--lock-memory", "--lookup-tp-size", "2"};
    assert (kvp_config_parse (&config, 12, args) == 0);
    assert (config.segment_size == 256ULL << 20 && config.segments == 3);
    assert (config.endpoint_count == 2 && !strcmp (config.endpoints[1], "ipc://@b"));
    assert (config.placement == KVP_PLACEMENT_FREE_RATIO && config.lock_memory);
    assert (config.lookup.tp_size == 2 && config.lease_ttl_ms == 10000);
    //  The value limit never exceeds a segment.
    assert (config.max_value_size == 256ULL << 20);
    assert (config.max_regex_len == 4096 && config.regex_time_limit_ms == 4000);
    char *regex_args[] = {"--max-regex-len=100", "--regex-time-limit", "250"};
    assert (kvp_config_parse (&config, 3, regex_args) == 0);
    assert (config.max_regex_len == 100 && config.regex_time_limit_ms == 250);

    char *bad1[] = {"--segments", "0"};
    char *bad2[] = {"--nope"};
    char *bad3[] = {"--segment-size"};
    char *bad4[] = {"--placement", "best"};
    char *bad5[] = {"--regex-time-limit", "60000"}; //  past the daemon's drain wait
    FILE *saved = stderr;
    stderr = fopen ("/dev/null", "w");
    assert (kvp_config_parse (&config, 2, bad1) == -1);
    assert (kvp_config_parse (&config, 1, bad2) == -1);
    assert (kvp_config_parse (&config, 1, bad3) == -1);
    assert (kvp_config_parse (&config, 2, bad4) == -1);
    assert (kvp_config_parse (&config, 2, bad5) == -1);
    fclose (stderr);
    stderr = saved;
    if (verbose)
        printf ("sizes and options parsed ");
}
