/*  config.c - kvpoold's settings table and command-line parser.

    One declarative table (kvp_config_options) has a row per option: its name, the form of its
    argument, its bounds, its default and what it does. Everything about an option follows
    from its row: parsing and validation, the defaults (kvp_config_defaults feeds each row's
    default through the same parser as the command line, so a default is always a value the
    option accepts), --help, and the settings table of README.md (--help-markdown, written
    into the README by `make readme-settings`; tests/extra/readme_settings.sh fails when the
    two differ). So each default is written once, in its row.

    A few defaults are not a value but a rule applied at start-up (the number of cores, a
    share of the pool, the descriptor limit, the built-in endpoints): their rows say the rule
    in words, and the code that applies it is named beside the row.

    Settings come from the command line and from a config file (--config FILE), never from
    the environment (DESIGN section 7). The file holds the same settings under the same
    names, in ZPL (ZeroMQ's property language, read by CZMQ's zconfig, which the node links
    already: `name = value` lines, # comments, no other parser to trust or ship). The file is
    applied first and the command line after it, so a flag overrides the file; a repeatable
    setting (endpoint, admin) given on the command line replaces the file's list. An unknown
    name, a section, a value out of bounds: kvpoold refuses to start and names it. What the
    settings came to, defaults and rules included, is printed by --print-config in the same
    format, so its output is a valid config file.
*/
#include "infra/config.h"
#include "infra/config_options.h"

#include "infra/endpoints.h"
#include "infra/etcd.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <czmq.h>
#include <pthread.h>
#include <sys/stat.h>

#include "infra/log.h"

#include "protocol/contract.h"

#define CONFIG_FILE_MAX (1 << 20)

//  Where option errors are written: stderr at start-up; a buffer while a setting changes at
//  run time (kvp_config_change), on the thread that changes it.
static __thread FILE *s_errors;
#define ERRORS (s_errors ? s_errors : stderr)


static int s_set (kvp_config_t *config, const opt_t *opt, const char *value);

void
kvp_config_defaults (kvp_config_t *config)
{
    memset (config, 0, sizeof *config);
    snprintf (config->instance, sizeof config->instance, "kvpool");
    for (const opt_t *opt = kvp_config_options; opt->name; opt++)
        if (opt->default_value) {
            //  A default the option itself refuses is a mistake in the table.
            int rc = s_set (config, opt, opt->default_value);
            assert (rc == 0);
            (void) rc;
        }
    //  The defaults that are rules (their rows say them in words).
    long cores = sysconf (_SC_NPROCESSORS_ONLN);
    config->workers = cores > 0 ? (uint32_t) cores : 2;
    config->index_slots = UINT64_MAX; //  sized by the pool unless set
    config->hot_cache_size = UINT64_MAX; //  a quarter of the node's memory unless set
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
                fprintf (ERRORS, "kvpoold: at most %d --%s\n", KVP_MAX_ENDPOINTS, opt->name);
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
            else if (!strcmp (value, "local-first"))
                *(kvp_placement_t *) (base + opt->offset) = KVP_PLACEMENT_LOCAL_FIRST;
            else {
                fprintf (ERRORS,
                         "kvpoold: --%s takes random, free-ratio or local-first, not '%s'\n",
                         opt->name, value);
                return -1;
            }
            return 0;
        case OPT_GROUP: {
            struct group *entry = getgrnam (value);
            if (entry)
                number = entry->gr_gid;
            else if (s_parse_uint (value, &number) == -1 || number >= UINT32_MAX) {
                fprintf (ERRORS, "kvpoold: --%s: no group '%s'\n", opt->name, value);
                return -1;
            }
            config->group = (gid_t) number;
            config->group_set = true;
            return 0;
        }
        case OPT_RATIO: {
            char *end;
            errno = 0;
            double ratio = strtod (value, &end);
            if (errno || end == value || *end || !(ratio >= opt->min / 1000.0)
                || !(ratio <= opt->max / 1000.0)) {
                fprintf (ERRORS, "kvpoold: --%s takes a number from %g to %g, not '%s'\n",
                         opt->name, opt->min / 1000.0, opt->max / 1000.0, value);
                return -1;
            }
            *(double *) (base + opt->offset) = ratio;
            return 0;
        }
        case OPT_SWITCH:
            if (!strcmp (value, "on") || !strcmp (value, "true") || !strcmp (value, "1"))
                *(bool *) (base + opt->offset) = true;
            else if (!strcmp (value, "off") || !strcmp (value, "false") || !strcmp (value, "0"))
                *(bool *) (base + opt->offset) = false;
            else {
                fprintf (ERRORS, "kvpoold: --%s takes on or off, not '%s'\n", opt->name, value);
                return -1;
            }
            return 0;
        case OPT_ROLE:
            if (!strcmp (value, "all"))
                *(kvp_role_t *) (base + opt->offset) = KVP_ROLE_ALL;
            else if (!strcmp (value, "master"))
                *(kvp_role_t *) (base + opt->offset) = KVP_ROLE_MASTER;
            else if (!strcmp (value, "node"))
                *(kvp_role_t *) (base + opt->offset) = KVP_ROLE_NODE;
            else {
                fprintf (ERRORS, "kvpoold: --%s takes all, master or node, not '%s'\n", opt->name,
                         value);
                return -1;
            }
            return 0;
        case OPT_OFFLOAD:
            if (!strcmp (value, "off"))
                *(kvp_offload_t *) (base + opt->offset) = KVP_OFFLOAD_OFF;
            else if (!strcmp (value, "eager"))
                *(kvp_offload_t *) (base + opt->offset) = KVP_OFFLOAD_EAGER;
            else if (!strcmp (value, "on-evict"))
                *(kvp_offload_t *) (base + opt->offset) = KVP_OFFLOAD_ON_EVICT;
            else {
                fprintf (ERRORS, "kvpoold: --%s takes off, eager or on-evict, not '%s'\n",
                         opt->name, value);
                return -1;
            }
            return 0;
        case OPT_UINT:
        case OPT_SIZE:
            if ((opt->kind == OPT_SIZE ? kvp_parse_size (value, &number)
                                       : s_parse_uint (value, &number))
                == -1) {
                fprintf (ERRORS, "kvpoold: --%s: '%s' is not a %s\n", opt->name, value,
                         opt->kind == OPT_SIZE ? "size (e.g. 512MiB, 4GB)" : "whole number");
                return -1;
            }
            if (number < opt->min || number > opt->max) {
                fprintf (ERRORS, "kvpoold: --%s must be between %llu and %llu\n", opt->name,
                         (unsigned long long) opt->min, (unsigned long long) opt->max);
                return -1;
            }
            //  Every numeric field is a uint32_t or a uint64_t (its bounds fit the field).
            if (opt->size == sizeof (uint32_t))
                *(uint32_t *) (base + opt->offset) = (uint32_t) number;
            else {
                assert (opt->size == sizeof (uint64_t));
                *(uint64_t *) (base + opt->offset) = number;
            }
            return 0;
    }
    return -1;
}

//  The option as --help and the README show it: "--segment-size SIZE".
static void
s_option_form (const opt_t *opt, char *form, size_t size)
{
    snprintf (form, size, "--%s%s%s", opt->name, opt->arg ? " " : "", opt->arg ? opt->arg : "");
}

void
kvp_config_usage (FILE *out)
{
    fprintf (out, "Usage: kvpoold [OPTION...]\n"
                  "Serves the kvpool store (role all: master and node in one process).\n\n");
    for (const opt_t *opt = kvp_config_options; opt->name; opt++) {
        char form[64];
        s_option_form (opt, form, sizeof form);
        const char *by_default =
            opt->default_value && *opt->default_value ? opt->default_value : opt->default_rule;
        fprintf (out, "  %-30s %s", form, opt->help);
        if (by_default)
            fprintf (out, " (default: %s)", by_default);
        if (opt->runtime)
            fprintf (out, " [changes at run time: kvpool config set %s VALUE]", opt->name);
        fprintf (out, "\n");
    }
    fprintf (out, "  %-30s %s\n", "--config FILE",
             "read settings from FILE (ZPL: name = value lines, the names without --); "
             "the command line overrides it");
    fprintf (out, "  %-30s %s\n", "--print-config",
             "print the settings as they came out, as a config file, and exit");
    fprintf (out, "  %-30s %s\n", "--help", "print this and exit");
    fprintf (out, "  %-30s %s\n", "--version", "print the version and exit");
    fprintf (out, "  %-30s %s\n", "--help-markdown",
             "print the settings as README.md's table and exit");
}

//  Text in a markdown table cell: a '|' would end the cell.
static void
s_markdown_cell (FILE *out, const char *text)
{
    for (; *text; text++) {
        if (*text == '|')
            fputc ('\\', out);
        fputc (*text, out);
    }
}

void
kvp_config_markdown (FILE *out)
{
    fprintf (out, "| option | default | run time | meaning |\n|---|---|---|---|\n");
    for (const opt_t *opt = kvp_config_options; opt->name; opt++) {
        char form[64];
        s_option_form (opt, form, sizeof form);
        fprintf (out, "| `%s` | ", form);
        //  A value in code style, as it would be typed; a rule in words.
        if (opt->default_value && *opt->default_value) {
            fprintf (out, "`");
            s_markdown_cell (out, opt->default_value);
            fprintf (out, "`");
        }
        else if (opt->default_rule)
            s_markdown_cell (out, opt->default_rule);
        fprintf (out, " | %s | ", opt->runtime ? "yes" : "");
        s_markdown_cell (out, opt->help);
        fprintf (out, " |\n");
    }
}

//  A non-loopback tcp bind without CURVE is refused unless --insecure (warn: say it in the
//  log instead). Returns 0 or -1.
static int
s_check_bind (const kvp_config_t *config, const char *option, const char *endpoint, bool warn)
{
    if (!endpoint || config->curve_secret || kvp_endpoint_is_loopback (endpoint))
        return 0;
    if (warn)
        kvp_warning ("%s %s binds without CURVE (--insecure): anyone who reaches it may read, "
                     "write and remove every value, in clear text",
                     option, endpoint);
    else if (!config->insecure) {
        fprintf (ERRORS,
                 "kvpoold: %s %s is not a loopback address: give --curve-secret and "
                 "--curve-allow so that only known clients get in, or --insecure to bind it "
                 "without authentication or encryption\n",
                 option, endpoint);
        return -1;
    }
    return 0;
}

static int
s_check_binds (const kvp_config_t *config, bool warn)
{
    int rc = 0;
    for (size_t i = 0; i < config->endpoint_count; i++)
        rc |= s_check_bind (config, "--endpoint", config->endpoints[i], warn);
    for (size_t i = 0; i < config->admin_endpoint_count; i++)
        rc |= s_check_bind (config, "--admin", config->admin_endpoints[i], warn);
    rc |= s_check_bind (config, "--peer-endpoint", config->peer_endpoint, warn);
    if (config->role == KVP_ROLE_MASTER)
        rc |= s_check_bind (config, "--master", config->master, warn);
    //  (A node's etcd:// master is not a bind.)
    rc |= s_check_bind (config, "--kv-events-endpoint", config->kv_events_endpoint, warn);
    rc |= s_check_bind (config, "--kv-events-replay-endpoint", config->kv_events_replay_endpoint,
                        warn);
    return rc ? -1 : 0;
}

void
kvp_config_say_security (const kvp_config_t *config)
{
    if (config->curve_secret)
        kvp_info ("CURVE on every endpoint: certificate %s, clients admitted from %s",
                  config->curve_secret, config->curve_allow);
    else if (config->insecure)
        s_check_binds (config, true);
    else
        kvp_info ("no CURVE: every endpoint binds loopback only (--curve-secret and "
                  "--curve-allow admit remote clients; docs/security.md)");
}

//  CURVE's settings go together; without them every endpoint bound is loopback unless
//  --insecure (docs/security.md).
static int
s_check_security (kvp_config_t *config)
{
    if (config->curve_secret && !*config->curve_secret)
        config->curve_secret = NULL;
    if (config->curve_allow && !*config->curve_allow)
        config->curve_allow = NULL;
    if (config->curve_master && !*config->curve_master)
        config->curve_master = NULL;
    if (!config->curve_secret != !config->curve_allow) {
        fprintf (ERRORS, "kvpoold: --curve-secret and --curve-allow go together\n");
        return -1;
    }
    if (config->curve_nodes && !*config->curve_nodes)
        config->curve_nodes = NULL;
    if (config->cluster_key && !*config->cluster_key)
        config->cluster_key = NULL;
    if (config->role != KVP_ROLE_ALL && config->curve_secret && !config->curve_nodes) {
        fprintf (ERRORS, "kvpoold: a cluster with CURVE needs --curve-nodes DIR: the public "
                         "certificates of its nodes and master, the only keys its master and "
                         "data planes admit (docs/security.md)\n");
        return -1;
    }
    if (config->curve_nodes && !config->curve_secret) {
        fprintf (ERRORS, "kvpoold: --curve-nodes needs --curve-secret and --curve-allow\n");
        return -1;
    }
    if (config->curve_master && !config->curve_secret) {
        fprintf (ERRORS, "kvpoold: --curve-master needs --curve-secret and --curve-allow\n");
        return -1;
    }
    return s_check_binds (config, false);
}

//  What no single row can say: settings that go together, and defaults that follow from
//  others.
static int
s_config_check (kvp_config_t *config)
{
    kvp_log_level_t level;
    if (kvp_log_level_parse (config->log_level, &level) != 0) {
        fprintf (ERRORS, "kvpoold: --log-level takes error, warning, info or debug, not '%s'\n",
                 config->log_level);
        return -1;
    }
    char why[300];
    if (kvp_trace_setup (config->trace_keys, why, sizeof why) != 0) {
        fprintf (ERRORS, "kvpoold: --trace-keys: %s\n", why);
        return -1;
    }
    if (config->disk_dir && !*config->disk_dir)
        config->disk_dir = NULL;
    if (config->segment_dir && !*config->segment_dir)
        config->segment_dir = NULL;
    if (config->segment_dir && config->segment_dir[0] != '/') {
        fprintf (ERRORS, "kvpoold: --segment-dir needs an absolute path\n");
        return -1;
    }
    if (config->segment_dir && strlen (config->segment_dir) > 200) {
        fprintf (ERRORS, "kvpoold: --segment-dir: a path of at most 200 characters\n");
        return -1;
    }
    if (config->disk_dir && config->disk_capacity == 0) {
        fprintf (ERRORS, "kvpoold: --disk-dir needs --disk-capacity (how much of the disk "
                         "the tier may use)\n");
        return -1;
    }
    if (config->disk_low_watermark >= config->disk_high_watermark) {
        fprintf (ERRORS, "kvpoold: --disk-low-watermark must be below --disk-high-watermark\n");
        return -1;
    }
    if (config->eviction_ratio >= config->eviction_high_watermark) {
        fprintf (ERRORS, "kvpoold: --eviction-ratio must be below --eviction-high-watermark\n");
        return -1;
    }
    //  Empty names mean "not set"; an empty master endpoint is a mistake.
    if (config->host_id && !*config->host_id)
        config->host_id = NULL;
    if (config->node_id && !*config->node_id)
        config->node_id = NULL;
    if (config->peer_endpoint && !*config->peer_endpoint)
        config->peer_endpoint = NULL;
    if (config->advertise && !*config->advertise)
        config->advertise = NULL;
    if (config->rdma_device && !*config->rdma_device)
        config->rdma_device = NULL;
    if (!config->master || !*config->master) {
        fprintf (ERRORS, "kvpoold: --master needs an endpoint (e.g. %s)\n",
                 KVP_DEFAULT_MASTER_ENDPOINT);
        return -1;
    }
    if (config->ha && !*config->ha)
        config->ha = NULL;
    if (config->ha && config->role != KVP_ROLE_MASTER) {
        fprintf (ERRORS, "kvpoold: --ha is for role master; a node follows the leader with "
                         "--master etcd://HOST:PORT/CLUSTER\n");
        return -1;
    }
    char etcd_error[300];
    etcd_address_t etcd_address;
    if (config->ha
        && etcd_address_parse (config->ha, &etcd_address, etcd_error, sizeof etcd_error) == -1) {
        fprintf (ERRORS, "kvpoold: --ha: %s\n", etcd_error);
        return -1;
    }
    if (etcd_is_address (config->master)) {
        if (config->role != KVP_ROLE_NODE) {
            fprintf (ERRORS, "kvpoold: --master etcd://... is for role node; a master binds a "
                             "tcp endpoint and campaigns with --ha\n");
            return -1;
        }
        if (etcd_address_parse (config->master, &etcd_address, etcd_error, sizeof etcd_error)
            == -1) {
            fprintf (ERRORS, "kvpoold: --master: %s\n", etcd_error);
            return -1;
        }
    }
    if (strcmp (config->transport, "tcp") && strcmp (config->transport, "rdma")
        && strcmp (config->transport, "auto")) {
        fprintf (ERRORS, "kvpoold: --transport takes tcp, rdma or auto, not '%s'\n",
                 config->transport);
        return -1;
    }
    if (config->kv_events_endpoint && !*config->kv_events_endpoint)
        config->kv_events_endpoint = NULL;
    if (config->kv_events_replay_endpoint && !*config->kv_events_replay_endpoint)
        config->kv_events_replay_endpoint = NULL;
    if (config->kv_events_replay_endpoint && !config->kv_events_endpoint) {
        fprintf (ERRORS, "kvpoold: --kv-events-replay-endpoint needs --kv-events-endpoint\n");
        return -1;
    }
    if (config->kv_events_endpoint && config->role == KVP_ROLE_MASTER) {
        fprintf (ERRORS, "kvpoold: --kv-events-endpoint: a master holds no objects; each "
                         "node publishes the events of the objects it holds\n");
        return -1;
    }
    if (s_check_security (config) != 0)
        return -1;
    if (config->offload == KVP_OFFLOAD_DEFAULT)
        config->offload = config->disk_dir ? KVP_OFFLOAD_ON_EVICT : KVP_OFFLOAD_OFF;
    else if (config->offload != KVP_OFFLOAD_OFF && !config->disk_dir) {
        fprintf (ERRORS, "kvpoold: --offload eager or on-evict needs --disk-dir\n");
        return -1;
    }
    return 0;
}

static const opt_t *
s_find_option (const char *name, size_t name_len)
{
    for (const opt_t *opt = kvp_config_options; opt->name; opt++)
        if (strlen (opt->name) == name_len && !strncmp (opt->name, name, name_len))
            return opt;
    return NULL;
}

//  A flag's value in a file: true, yes, on, 1 or false, no, off, 0. Returns 0 or -1.
static int
s_set_flag (kvp_config_t *config, const opt_t *opt, const char *value)
{
    bool *flag = (bool *) ((char *) config + opt->offset);
    if (!strcmp (value, "true") || !strcmp (value, "yes") || !strcmp (value, "on")
        || !strcmp (value, "1"))
        *flag = true;
    else if (!strcmp (value, "false") || !strcmp (value, "no") || !strcmp (value, "off")
             || !strcmp (value, "0"))
        *flag = false;
    else {
        fprintf (ERRORS, "kvpoold: %s takes true or false, not '%s'\n", opt->name, value);
        return -1;
    }
    return 0;
}

//  Applies the settings of a ZPL file. The zconfig tree stays with config (its strings are
//  the settings' values) until kvp_config_release. Returns 0 or -1 with a message naming the
//  file and the setting.
static int
s_load_file (kvp_config_t *config, const char *path)
{
    struct stat st;
    if (stat (path, &st) != 0 || access (path, R_OK) != 0) {
        fprintf (ERRORS, "kvpoold: --config %s: %s\n", path, strerror (errno));
        return -1;
    }
    //  A device or a fifo would be read for ever; a settings file is small.
    if (!S_ISREG (st.st_mode) || st.st_size > CONFIG_FILE_MAX) {
        fprintf (ERRORS, "kvpoold: --config %s: not a regular file of at most %d bytes\n", path,
                 CONFIG_FILE_MAX);
        return -1;
    }
    zconfig_t *root = zconfig_load (path);
    if (!root) {
        fprintf (ERRORS, "kvpoold: --config %s: not a ZPL file (name = value lines)\n", path);
        return -1;
    }
    config->file = root;
    for (zconfig_t *item = zconfig_child (root); item; item = zconfig_next (item)) {
        const char *name = zconfig_name (item);
        const char *value = zconfig_value (item);
        const opt_t *opt = s_find_option (name, strlen (name));
        if (zconfig_child (item)) {
            fprintf (ERRORS,
                     "kvpoold: --config %s: '%s' is a section; settings are "
                     "'name = value' lines at the top level\n",
                     path, name);
            return -1;
        }
        if (!opt) {
            fprintf (ERRORS,
                     "kvpoold: --config %s: unknown setting '%s' (kvpoold --help lists "
                     "them, without the --)\n",
                     path, name);
            return -1;
        }
        if (!value || (!*value && opt->kind != OPT_STRING)) { //  a text may be empty
            fprintf (ERRORS, "kvpoold: --config %s: '%s' has no value\n", path, name);
            return -1;
        }
        int rc =
            opt->kind == OPT_FLAG ? s_set_flag (config, opt, value) : s_set (config, opt, value);
        if (rc != 0) {
            fprintf (ERRORS, "kvpoold: (in --config %s)\n", path);
            return -1;
        }
    }
    return 0;
}

void
kvp_config_release (kvp_config_t *config)
{
    zconfig_t *file = (zconfig_t *) config->file;
    zconfig_destroy (&file);
    config->file = NULL;
}

//  A setting's value as it would be written in a file (or on the command line); false when
//  it has none (an unset path, a flag that is off, an empty list).
static bool
s_value_text (const kvp_config_t *config, const opt_t *opt, size_t index, char *out, size_t size)
{
    const char *base = (const char *) config;
    const void *at = base + opt->offset;
    switch (opt->kind) {
        case OPT_FLAG:
            snprintf (out, size, "%s", *(const bool *) at ? "true" : "false");
            return true;
        case OPT_STRING: {
            const char *text = *(const char *const *) at;
            snprintf (out, size, "%s", text ? text : "");
            return text != NULL;
        }
        case OPT_LIST: {
            size_t count = *(const size_t *) (base + opt->count_offset);
            if (index >= count)
                return false;
            snprintf (out, size, "%s", ((const char *const *) at)[index]);
            return true;
        }
        case OPT_PLACEMENT: {
            kvp_placement_t placement = *(const kvp_placement_t *) at;
            snprintf (out, size, "%s",
                      placement == KVP_PLACEMENT_FREE_RATIO    ? "free-ratio"
                      : placement == KVP_PLACEMENT_LOCAL_FIRST ? "local-first"
                                                               : "random");
            return true;
        }
        case OPT_GROUP:
            if (!config->group_set)
                return false;
            snprintf (out, size, "%u", (unsigned) config->group);
            return true;
        case OPT_RATIO: snprintf (out, size, "%g", *(const double *) at); return true;
        case OPT_SWITCH: snprintf (out, size, "%s", *(const bool *) at ? "on" : "off"); return true;
        case OPT_ROLE: {
            kvp_role_t role = *(const kvp_role_t *) at;
            snprintf (out, size, "%s",
                      role == KVP_ROLE_MASTER ? "master"
                      : role == KVP_ROLE_NODE ? "node"
                                              : "all");
            return true;
        }
        case OPT_OFFLOAD: {
            kvp_offload_t offload = *(const kvp_offload_t *) at;
            if (offload == KVP_OFFLOAD_DEFAULT)
                return false;
            snprintf (out, size, "%s",
                      offload == KVP_OFFLOAD_EAGER      ? "eager"
                      : offload == KVP_OFFLOAD_ON_EVICT ? "on-evict"
                                                        : "off");
            return true;
        }
        case OPT_UINT:
        case OPT_SIZE: {
            uint64_t number =
                opt->size == sizeof (uint32_t) ? *(const uint32_t *) at : *(const uint64_t *) at;
            //  A rule applied later (--index-slots, --max-connections): no value of its own.
            if (number == UINT64_MAX || number < opt->min)
                return false;
            snprintf (out, size, "%llu", (unsigned long long) number);
            return true;
        }
    }
    return false;
}

void
kvp_config_print (const kvp_config_t *config, FILE *out)
{
    fprintf (out, "#   kvpoold's settings as they came out (kvpoold --print-config): a config "
                  "file for --config.\n#   Commented lines are unset; their default is a rule "
                  "(kvpoold --help).\n");
    for (const opt_t *opt = kvp_config_options; opt->name; opt++) {
        char value[4096];
        if (opt->kind == OPT_LIST) {
            size_t index = 0;
            while (s_value_text (config, opt, index, value, sizeof value))
                fprintf (out, "%s = \"%s\"\n", opt->name, value), index++;
            if (index == 0)
                fprintf (out, "# %s =\n", opt->name);
        }
        else if (s_value_text (config, opt, 0, value, sizeof value))
            fprintf (out, "%s = \"%s\"\n", opt->name, value);
        else
            fprintf (out, "# %s =\n", opt->name);
    }
}

bool
kvp_config_runtime (const char *name)
{
    const opt_t *opt = name ? s_find_option (name, strlen (name)) : NULL;
    return opt && opt->runtime;
}

int
kvp_config_value (const kvp_config_t *config, const char *name, char *out, size_t size)
{
    const opt_t *opt = name ? s_find_option (name, strlen (name)) : NULL;
    if (!opt)
        return -1;
    if (opt->kind == OPT_LIST) {
        //  Every value, comma-separated.
        size_t used = 0;
        out[0] = 0;
        char value[1024];
        for (size_t i = 0; s_value_text (config, opt, i, value, sizeof value); i++)
            used += (size_t) snprintf (out + used, used < size ? size - used : 0, "%s%s",
                                       i ? "," : "", value);
        return 0;
    }
    if (!s_value_text (config, opt, 0, out, size))
        snprintf (out, size, "%s", "");
    return 0;
}

//  A text setting changed at run time outlives the request it came in: its value is kept
//  here, once per distinct value, for the process's life (the settings that change at run
//  time take a few known words, so this stays a handful of strings).
static const char *
s_intern (const char *value)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static char *kept[32];
    static size_t count;
    pthread_mutex_lock (&lock);
    const char *found = NULL;
    for (size_t i = 0; i < count && !found; i++)
        if (!strcmp (kept[i], value))
            found = kept[i];
    if (!found && count < sizeof kept / sizeof kept[0] && (kept[count] = strdup (value)))
        found = kept[count++];
    pthread_mutex_unlock (&lock);
    return found;
}

int
kvp_config_change (kvp_config_t *config, const char *name, const char *value, char *why,
                   size_t why_size)
{
    const opt_t *opt = name ? s_find_option (name, strlen (name)) : NULL;
    if (!opt) {
        snprintf (why, why_size, "no setting '%s'", name ? name : "");
        return -1;
    }
    if (!opt->runtime) {
        snprintf (why, why_size,
                  "%s changes only with a restart (at run time: log-level, lease-ttl, "
                  "eviction-high-watermark, eviction-ratio, disk-high-watermark, "
                  "disk-low-watermark, verify-checksums)",
                  name);
        return -1;
    }
    //  On a copy, with the checks of settings that go together, so that config changes only
    //  when the value is good; the errors go to a buffer instead of stderr.
    kvp_config_t trial = *config;
    char *text = NULL;
    size_t size = 0;
    s_errors = open_memstream (&text, &size);
    int rc = opt->kind == OPT_FLAG ? s_set_flag (&trial, opt, value) : s_set (&trial, opt, value);
    if (rc == 0)
        rc = s_config_check (&trial);
    //  A good text value is kept where it outlives the request it came in.
    if (rc == 0 && opt->kind == OPT_STRING) {
        const char *kept = s_intern (value);
        if (kept)
            rc = s_set (&trial, opt, kept);
        else {
            fprintf (s_errors ? s_errors : stderr, "too many distinct values for %s\n", name);
            rc = -1;
        }
    }
    if (s_errors)
        fclose (s_errors);
    s_errors = NULL;
    if (rc == 0)
        *config = trial;
    else {
        //  "kvpoold: --x must be ...\n": the reason without the program's name.
        const char *reason = text && !strncmp (text, "kvpoold: ", 9) ? text + 9 : text;
        snprintf (why, why_size, "%s", reason && *reason ? reason : "refused");
        size_t len = strlen (why);
        while (len && why[len - 1] == '\n')
            why[--len] = 0;
    }
    free (text);
    return rc == 0 ? 0 : -1;
}

int
kvp_config_parse (kvp_config_t *config, int argc, char **argv)
{
    //  The file first, wherever --config stands; the command line then overrides it.
    const char *file = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp (argv[i], "--config") && i + 1 < argc)
            file = argv[++i];
        else if (!strncmp (argv[i], "--config=", 9))
            file = argv[i] + 9;
    }
    if (file && s_load_file (config, file) != 0)
        return -1;
    bool print = false;
    //  Lists the command line has started: its values replace the file's.
    const opt_t *started[16];
    size_t started_count = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp (arg, "--config")) {
            i++;
            continue;
        }
        if (!strncmp (arg, "--config=", 9))
            continue;
        if (!strcmp (arg, "--print-config")) {
            print = true;
            continue;
        }
        if (!strcmp (arg, "--help") || !strcmp (arg, "-h")) {
            kvp_config_usage (stdout);
            return 1;
        }
        if (!strcmp (arg, "--help-markdown")) {
            kvp_config_markdown (stdout);
            return 1;
        }
        if (!strcmp (arg, "--version")) {
            printf ("kvpoold %s\n", KVP_VERSION);
            return 1;
        }
        if (strncmp (arg, "--", 2) != 0) {
            fprintf (ERRORS, "kvpoold: unexpected argument '%s' (see --help)\n", arg);
            return -1;
        }
        const char *name = arg + 2;
        const char *eq = strchr (name, '=');
        size_t name_len = eq ? (size_t) (eq - name) : strlen (name);
        const opt_t *opt = kvp_config_options;
        while (opt->name
               && !(strlen (opt->name) == name_len && !strncmp (opt->name, name, name_len)))
            opt++;
        if (!opt->name) {
            fprintf (ERRORS, "kvpoold: unknown option '%s' (see --help)\n", arg);
            return -1;
        }
        const char *value = NULL;
        if (opt->kind != OPT_FLAG) {
            if (eq)
                value = eq + 1;
            else if (i + 1 < argc)
                value = argv[++i];
            else {
                fprintf (ERRORS, "kvpoold: --%s needs a value\n", opt->name);
                return -1;
            }
        }
        if (opt->kind == OPT_LIST) {
            bool seen = false;
            for (size_t k = 0; k < started_count; k++)
                seen |= started[k] == opt;
            if (!seen && started_count < sizeof started / sizeof started[0]) {
                started[started_count++] = opt;
                *(size_t *) ((char *) config + opt->count_offset) = 0;
            }
        }
        if (s_set (config, opt, value) == -1)
            return -1;
    }
    if (config->max_value_size > config->segment_size)
        config->max_value_size = config->segment_size;
    int rc = s_config_check (config);
    if (rc == 0 && print) {
        kvp_config_print (config, stdout);
        return 1;
    }
    return rc;
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
    //  The defaults, each from its row of the table.
    assert (config.segment_size == 1ULL << 30 && config.segments == 1);
    assert (config.lease_ttl_ms == 10000 && config.put_timeout_ms == 30000);
    assert (config.soft_pin_ttl_ms == 30 * 60 * 1000 && config.max_key_len == 4096);
    assert (config.max_value_size == 1ULL << 30 && config.max_request_bytes == 4ULL << 30);
    assert (config.max_keys == 262144 && config.max_unread_bytes == 4ULL << 30);
    assert (config.placement == KVP_PLACEMENT_RANDOM && config.seed == 1);
    assert (config.index_slots == UINT64_MAX && config.max_connections == 0);
    assert (config.workers >= 1 && !config.lock_memory && !config.verbose && !config.group_set);
    assert (config.endpoint_count == 0 && config.admin_endpoint_count == 0 && !config.ready_file);
    assert (config.lookup.key_template == NULL && !config.lookup.eagle);
    assert (!strcmp (config.lookup.key_scheme, LOOKUP_DEFAULT_KEY_SCHEME));
    assert (config.lookup.group == 0 && config.lookup.hash_block_size == 0);
    assert (!strcmp (config.lookup.model, "") && config.lookup.tp_size == 1);
    assert (config.lookup.pp_size == 1 && config.lookup.pcp_rank == 0);
    assert (config.lookup.dcp_rank == 0 && config.lookup.block_size == 16);
    assert (config.eviction_high_watermark == 0.90 && config.eviction_ratio == 0.05);
    assert (config.evict_soft_pinned && !config.disk_dir && config.disk_capacity == 0);
    assert (config.disk_high_watermark == 0.90 && config.disk_low_watermark == 0.80);
    assert (config.offload_queue_limit == 50000 && config.offload_cap_ratio == 0.5);
    assert (!config.offload_force_evict && config.promote_on_hit == 2);
    //  --help and the README table print the same defaults, from the same rows.
    char *text = NULL;
    size_t text_size = 0;
    FILE *memory = open_memstream (&text, &text_size);
    assert (memory);
    kvp_config_usage (memory);
    fclose (memory);
    assert (strstr (text, "--segment-size SIZE"));
    assert (strstr (text, "bytes per segment: 1073741824, 512MiB, 4GB, 1.5gb (default: 1GiB)"));
    assert (strstr (text, "(default: " KVP_DEFAULT_ADMIN_ENDPOINT ")"));
    free (text);
    memory = open_memstream (&text, &text_size);
    assert (memory);
    kvp_config_markdown (memory);
    fclose (memory);
    assert (!strncmp (text, "| option | default | run time | meaning |\n|---|---|---|---|\n", 58));
    assert (strstr (text, "\n| `--segment-size SIZE` | `1GiB` |  | bytes per segment: "));
    assert (strstr (text, "\n| `--workers N` | number of cores |  | transfer worker threads |\n"));
    assert (strstr (text, "\n| `--lock-memory` |  |  | mlock the segments |\n"));
    assert (strstr (text, "\n| `--lease-ttl MS` | `10000` | yes | "));
    size_t rows = 0;
    for (const char *line = text; (line = strchr (line, '\n')); line++)
        rows++;
    size_t options = 0;
    for (const opt_t *opt = kvp_config_options; opt->name; opt++)
        options++;
    assert (rows == options + 2); //  the header, the rule, a row per option
    free (text);

    char *args[] = {"--segment-size",    "256MiB",        "--segments=3",     "--endpoint",
                    "tcp://127.0.0.1:7", "--endpoint",    "ipc://@b",         "--placement",
                    "free-ratio",        "--lock-memory", "--lookup-tp-size", "2"};
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

    //  The disk tier: on-evict by default once it has a directory; off without one.
    assert (config.offload == KVP_OFFLOAD_OFF);
    kvp_config_defaults (&config);
    char *tier_args[] = {
        "--disk-dir",          "/tmp/x", "--disk-capacity", "1GiB", "--eviction-high-watermark=0.5",
        "--evict-soft-pinned", "off"};
    assert (kvp_config_parse (&config, 7, tier_args) == 0);
    assert (config.offload == KVP_OFFLOAD_ON_EVICT && config.disk_capacity == 1ULL << 30);
    assert (config.eviction_high_watermark == 0.5 && !config.evict_soft_pinned);
    char *eager[] = {"--offload", "eager"};
    assert (kvp_config_parse (&config, 2, eager) == 0 && config.offload == KVP_OFFLOAD_EAGER);

    char *no_segments[] = {"--segments", "0"};
    assert (kvp_config_parse (&config, 2, no_segments) == 0 && config.segments == 0);
    char *bad1[] = {"--segments", "65"};
    char *bad2[] = {"--nope"};
    char *bad3[] = {"--segment-size"};
    char *bad4[] = {"--placement", "best"};
    char *bad5[] = {"--regex-time-limit", "60000"}; //  past the daemon's drain wait
    char *bad6[] = {"--eviction-ratio", "1.5"};
    char *bad7[] = {"--disk-dir", "/tmp/y"}; //  no capacity
    char *bad8[] = {"--offload", "sometimes"};
    char *bad9[] = {"--disk-low-watermark", "0.95"}; //  above the high one
    FILE *saved = stderr;
    stderr = fopen ("/dev/null", "w");
    assert (kvp_config_parse (&config, 2, bad1) == -1);
    assert (kvp_config_parse (&config, 1, bad2) == -1);
    assert (kvp_config_parse (&config, 1, bad3) == -1);
    assert (kvp_config_parse (&config, 2, bad4) == -1);
    assert (kvp_config_parse (&config, 2, bad5) == -1);
    assert (kvp_config_parse (&config, 2, bad6) == -1);
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 2, bad7) == -1);
    assert (kvp_config_parse (&config, 2, bad8) == -1);
    kvp_config_defaults (&config);
    char *bad_master[] = {"--master", ""};
    assert (kvp_config_parse (&config, 2, bad_master) == -1);
    char *bad_role[] = {"--role", "leader"};
    assert (kvp_config_parse (&config, 2, bad_role) == -1);
    char *bad_transport[] = {"--transport", "carrier-pigeon"};
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 2, bad_transport) == -1);
    kvp_config_defaults (&config);
    char *node[] = {"--role", "node", "--host-id", "", "--master", "tcp://10.0.0.1:1"};
    assert (kvp_config_parse (&config, 6, node) == 0);
    assert (config.role == KVP_ROLE_NODE && config.host_id == NULL);
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 2, bad9) == -1);
    kvp_config_defaults (&config);
    char *offload_alone[] = {"--offload", "eager"};
    assert (kvp_config_parse (&config, 2, offload_alone) == -1);
    //  Without CURVE only loopback binds, unless --insecure; CURVE's settings go together.
    char *wide[] = {"--endpoint", "tcp://*:5"};
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 2, wide) == -1);
    char *wide_admin[] = {"--admin-endpoint", "tcp://0.0.0.0:5"};
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 2, wide_admin) == -1);
    char *wide_master[] = {"--role", "master", "--master", "tcp://10.1.1.1:5"};
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 4, wide_master) == -1);
    char *wide_insecure[] = {"--endpoint", "tcp://*:5", "--insecure"};
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 3, wide_insecure) == 0 && config.insecure);
    //  A wildcard bind is announced as --advertise says, or not at all (kvpoold refuses).
    char *advertised[] = {"--role", "node", "--advertise", "10.0.0.7"};
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 4, advertised) == 0 && streq (config.advertise, "10.0.0.7"));
    char out[64];
    assert (kvp_endpoint_is_wildcard ("tcp://0.0.0.0:5") && kvp_endpoint_is_wildcard ("tcp://*:5")
            && kvp_endpoint_is_wildcard ("tcp://[::]:5") && kvp_endpoint_is_wildcard ("tcp://:::5")
            && !kvp_endpoint_is_wildcard ("tcp://10.0.0.1:5")
            && !kvp_endpoint_is_wildcard ("ipc://@x"));
    assert (kvp_endpoint_advertised ("tcp://0.0.0.0:5", "10.0.0.7", out, sizeof out) == 0
            && streq (out, "tcp://10.0.0.7:5"));
    assert (kvp_endpoint_advertised ("tcp://*:5", "fd00::7", out, sizeof out) == 0
            && streq (out, "tcp://[fd00::7]:5"));
    assert (kvp_endpoint_advertised ("tcp://10.0.0.1:5", "10.0.0.7", out, sizeof out) == 0
            && streq (out, "tcp://10.0.0.1:5"));
    assert (kvp_endpoint_advertised ("tcp://10.0.0.1:5", NULL, out, sizeof out) == 0);
    assert (kvp_endpoint_advertised ("tcp://0.0.0.0:5", NULL, out, sizeof out) == -1 && !*out);
    char *wide_curve[] = {"--endpoint", "tcp://*:5", "--curve-secret", "/k", "--curve-allow", "/d"};
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 6, wide_curve) == 0);
    char *half_curve[] = {"--curve-secret", "/k"};
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 2, half_curve) == -1);
    char *master_alone[] = {"--curve-master", "/m"};
    kvp_config_defaults (&config);
    assert (kvp_config_parse (&config, 2, master_alone) == -1);
    fclose (stderr);
    stderr = saved;
    if (verbose)
        printf ("sizes and options parsed ");

    //  Settings that change at run time: checked as on the command line, and with the
    //  settings that go with them; a refused change leaves config as it was.
    kvp_config_t live;
    kvp_config_defaults (&live);
    char why[256];
    char value[64];
    assert (kvp_config_runtime ("lease-ttl") && !kvp_config_runtime ("segment-size"));
    assert (kvp_config_change (&live, "lease-ttl", "2500", why, sizeof why) == 0);
    assert (live.lease_ttl_ms == 2500);
    assert (kvp_config_value (&live, "lease-ttl", value, sizeof value) == 0
            && !strcmp (value, "2500"));
    assert (kvp_config_change (&live, "segment-size", "2GiB", why, sizeof why) == -1);
    assert (strstr (why, "only with a restart"));
    assert (kvp_config_change (&live, "eviction-high-watermark", "3", why, sizeof why) == -1);
    assert (strstr (why, "--eviction-high-watermark takes a number")
            && live.eviction_high_watermark == 0.90);
    assert (kvp_config_change (&live, "nonsense", "1", why, sizeof why) == -1);
    //  The disk watermarks go together: low under high.
    assert (kvp_config_change (&live, "disk-low-watermark", "0.95", why, sizeof why) == -1);
    assert (live.disk_low_watermark == 0.80);
    //  A text value is kept: the caller's buffer need not last.
    char level[] = "debug";
    assert (kvp_config_change (&live, "log-level", level, why, sizeof why) == 0);
    level[0] = 'x';
    assert (!strcmp (live.log_level, "debug"));
    assert (kvp_config_change (&live, "log-level", "loud", why, sizeof why) == -1);
}
