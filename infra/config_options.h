/*  config_options.h - the rows of kvpoold's settings table (config_options.c), as config.c
    reads them. Private to infra/: the rest of the daemon sees kvp_config_t (config.h).
*/
#ifndef KVP_CONFIG_OPTIONS_H_INCLUDED
#define KVP_CONFIG_OPTIONS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    OPT_FLAG,
    OPT_UINT,
    OPT_SIZE,
    OPT_STRING,
    OPT_LIST,
    OPT_PLACEMENT,
    OPT_GROUP,
    OPT_RATIO,   //  a double from min/1000 to max/1000
    OPT_SWITCH,  //  on or off
    OPT_OFFLOAD, //  off, eager or on-evict
    OPT_ROLE,    //  all, master or node
} opt_kind_t;

typedef struct {
    const char *name; //  --name
    const char *arg;  //  the argument as --help and the README show it; NULL for a flag
    opt_kind_t kind;
    size_t offset;       //  into kvp_config_t
    size_t size;         //  of that field: a number is uint32_t or uint64_t
    size_t count_offset; //  OPT_LIST: the count field
    uint64_t min, max;
    //  The default as it would be written on the command line: kvp_config_defaults parses it
    //  into the field, --help and the README print it. NULL when the default is a rule
    //  (default_rule) or nothing (a flag that is off, an optional path).
    const char *default_value;
    const char *default_rule; //  the default in words, when it is computed at start-up
    const char *help;
    //  May change while the node runs (kvpool config set; CONFIG in the protocol): the
    //  actors that read it each keep their own copy of the settings and take the change.
    bool runtime;
} opt_t;

//  Every option, in the order --help and the README list them; the last row's name is NULL.
extern const opt_t kvp_config_options[];

#endif
