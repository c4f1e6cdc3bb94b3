/*  lookup_config.h - settings of the lookup/reset admin channel (DESIGN section 6). */
#ifndef LOOKUP_CONFIG_H_INCLUDED
#define LOOKUP_CONFIG_H_INCLUDED

#include <stdint.h>

typedef struct {
    const char *key_template; //  fields {model} {tp} {pp} {pcp} {dcp} {hash}
    const char *model;
    uint32_t tp_size;
    uint32_t pp_size;
    uint32_t pcp_rank;
    uint32_t dcp_rank;
    uint32_t block_size; //  tokens per block
} lookup_config_t;

#define LOOKUP_DEFAULT_KEY_TEMPLATE "{model}@tp_rank:{tp}@pcp{pcp}@dcp{dcp}@pp_rank:{pp}@{hash}"

#endif
