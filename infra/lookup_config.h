/*  lookup_config.h - settings of the lookup/reset admin channel (DESIGN section 6). */
#ifndef LOOKUP_CONFIG_H_INCLUDED
#define LOOKUP_CONFIG_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const char *key_scheme;   //  v1, group or current (docs/lookup.md); NULL: current
    const char *key_template; //  NULL or "": the scheme's; fields {model} {tp} {pp} {pcp}
                              //  {dcp} {group} {cache_prefix} {hash}
    const char *model;
    const char *cache_prefix; //  {cache_prefix}: "PREFIX@", or nothing when empty
    uint32_t tp_size;
    uint32_t pp_size;
    uint32_t pcp_rank;
    uint32_t dcp_rank;
    uint32_t group;           //  {group}: the KV-cache group
    uint32_t block_size;      //  tokens per block
    uint32_t hash_block_size; //  tokens per hash the engine sends (0: block_size)
    bool eagle;               //  the engine runs EAGLE/MTP: a hit drops its last block
} lookup_config_t;

//  The connector's key schemes (docs/lookup.md), and how a block's hash is made from the
//  engine's hashes when a block spans several (hash_block_size < block_size).
typedef enum {
    LOOKUP_GROUPING_NONE,     //  one hash a block (v1: the block size must be the hash's)
    LOOKUP_GROUPING_CONCAT,   //  the block's hashes, concatenated (group)
    LOOKUP_GROUPING_TRAILING, //  the block's last hash (current)
} lookup_grouping_t;

//  vLLM #40900 (2026-05-13 to 05-19)
#define LOOKUP_TEMPLATE_V1 "{model}@tp_rank:{tp}@pcp{pcp}@dcp{dcp}@pp_rank:{pp}@{hash}"
//  vLLM #42828 (2026-05-19) on: the group, and (#45767, 2026-06-16) an optional cache prefix
#define LOOKUP_TEMPLATE_GROUP                                                                      \
    "{cache_prefix}{model}@tp_rank:{tp}@pcp{pcp}@dcp{dcp}@pp_rank:{pp}@group:{group}@{hash}"
#define LOOKUP_DEFAULT_KEY_SCHEME "current"
#define LOOKUP_DEFAULT_KEY_TEMPLATE LOOKUP_TEMPLATE_GROUP

//  The template and grouping of scheme (NULL: the default). Returns 0, or -1 for a name that
//  is none of v1, group, current.
static inline int
lookup_key_scheme (const char *scheme, const char **template_p, lookup_grouping_t *grouping_p)
{
    if (!scheme || !*scheme)
        scheme = LOOKUP_DEFAULT_KEY_SCHEME;
    if (strcmp (scheme, "v1") == 0)
        *template_p = LOOKUP_TEMPLATE_V1, *grouping_p = LOOKUP_GROUPING_NONE;
    else if (strcmp (scheme, "group") == 0)
        *template_p = LOOKUP_TEMPLATE_GROUP, *grouping_p = LOOKUP_GROUPING_CONCAT;
    else if (strcmp (scheme, "current") == 0)
        *template_p = LOOKUP_TEMPLATE_GROUP, *grouping_p = LOOKUP_GROUPING_TRAILING;
    else
        return -1;
    return 0;
}

#endif
