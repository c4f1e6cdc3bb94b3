/*  lookup_keys.c - store keys of a lookup: a key template expanded over hashes and ranks.

    Compilation substitutes every field but {hash} once per (tp, pp) pair, leaving for each
    pair the literal parts between the {hash} places. Expansion then sizes one buffer for all
    keys of the lookup, writes them, and only then points keys[] into it (the buffer may move
    when it grows, so no pointer is taken before the last resize). The buffers are kept for the
    next lookup, so a steady stream of lookups does no allocation. One thread per instance.

    Parsing (lookup_keys_parse, for the KV events) compiles the template a second time into a
    pattern: literal runs (with {model}, {pcp} and {dcp} substituted) and the variable fields
    {tp}, {pp} and {hash}. A key is matched against it from the left; a variable field tries
    its longest run of digits first and backtracks, so "{hash}0" still parses "ab0".
*/
#include "lookup_server/lookup_keys.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct _lookup_keys_t {
    size_t ranks;       //  tp_size x pp_size
    size_t hash_places; //  how many times {hash} appears
    //  For rank r, parts r * (hash_places + 1) .. + hash_places: text in part_text at
    //  part_offset, part_len bytes. The key is part0 hash part1 hash ... part_n.
    char *part_text;
    size_t *part_offset;
    size_t *part_len;
    size_t *fixed_len; //  per rank: sum of its parts' lengths
    char *keys_text;   //  expansion buffer
    size_t keys_text_size;
    const char **keys;
    size_t *key_lens; //  each key's length (the last expansion's)
    size_t keys_size;
    //  The parse pattern: tokens, literal ones pointing into pattern_text.
    struct s_token *tokens;
    size_t token_count;
    char *pattern_text;
};

typedef enum {
    FIELD_NONE,
    FIELD_MODEL,
    FIELD_TP,
    FIELD_PP,
    FIELD_PCP,
    FIELD_DCP,
    FIELD_GROUP,
    FIELD_CACHE_PREFIX,
    FIELD_HASH
} field_t;

typedef struct s_token {
    field_t field; //  FIELD_NONE: literal text; else FIELD_TP, FIELD_PP or FIELD_HASH
    size_t offset, len;
} s_token_t;

//  A growable string for compilation.
typedef struct {
    char *data;
    size_t len, size;
} s_text_t;

static int
s_text_add (s_text_t *text, const char *data, size_t len)
{
    if (text->len + len + 1 > text->size) {
        size_t size = text->size ? text->size : 64;
        while (size < text->len + len + 1)
            size *= 2;
        char *data_new = (char *) realloc (text->data, size);
        if (!data_new)
            return -1;
        text->data = data_new;
        text->size = size;
    }
    memcpy (text->data + text->len, data, len);
    text->len += len;
    text->data[text->len] = 0;
    return 0;
}

static field_t
s_field (const char *name, size_t len)
{
    static const struct {
        const char *name;
        field_t field;
    } fields[] = {{"model", FIELD_MODEL}, {"tp", FIELD_TP},
                  {"pp", FIELD_PP},       {"pcp", FIELD_PCP},
                  {"dcp", FIELD_DCP},     {"group", FIELD_GROUP},
                  {"hash", FIELD_HASH},   {"cache_prefix", FIELD_CACHE_PREFIX}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (strlen (fields[i].name) == len && memcmp (fields[i].name, name, len) == 0)
            return fields[i].field;
    return FIELD_NONE;
}

//  Walks the template once for rank (tp, pp): appends its literal parts to text, recording
//  each part's offset and length. With parts NULL only checks and counts {hash} places.
static int
s_compile (const char *template, const lookup_config_t *config, uint32_t tp, uint32_t pp,
           s_text_t *text, size_t *offsets, size_t *lens, size_t *places_p, const char **reason_p)
{
    size_t places = 0;
    size_t part_start = text ? text->len : 0;
    const char *p = template;
    while (*p) {
        const char *literal = p;
        size_t literal_len = 0;
        field_t field = FIELD_NONE;
        if (p[0] == '{' && p[1] == '{') {
            literal_len = 1;
            p += 2;
        }
        else if (p[0] == '}' && p[1] == '}') {
            literal_len = 1;
            p += 2;
        }
        else if (p[0] == '}') {
            *reason_p = "key template has an unmatched '}'";
            return -1;
        }
        else if (p[0] == '{') {
            const char *close = strchr (p + 1, '}');
            if (!close) {
                *reason_p = "key template has an unmatched '{'";
                return -1;
            }
            field = s_field (p + 1, (size_t) (close - p - 1));
            if (field == FIELD_NONE) {
                *reason_p = "key template has an unknown field (known: {model} {tp} {pp} "
                            "{pcp} {dcp} {group} {cache_prefix} {hash})";
                return -1;
            }
            p = close + 1;
        }
        else {
            literal_len = strcspn (p, "{}");
            p += literal_len;
        }
        if (!text)
            places += field == FIELD_HASH;
        else if (field == FIELD_HASH) {
            offsets[places] = part_start;
            lens[places] = text->len - part_start;
            part_start = text->len;
            places++;
        }
        else {
            char number[16];
            const char *add = literal;
            size_t add_len = literal_len;
            if (field == FIELD_MODEL) {
                add = config->model ? config->model : "";
                add_len = strlen (add);
            }
            else if (field == FIELD_CACHE_PREFIX) {
                //  vLLM's: the prefix and an "@" when there is one, nothing otherwise.
                add = config->cache_prefix ? config->cache_prefix : "";
                add_len = strlen (add);
                if (add_len && s_text_add (text, add, add_len)) {
                    *reason_p = "out of memory";
                    return -1;
                }
                add = add_len ? "@" : "";
                add_len = add_len ? 1 : 0;
            }
            else if (field != FIELD_NONE) {
                uint32_t value = field == FIELD_TP    ? tp
                                 : field == FIELD_PP  ? pp
                                 : field == FIELD_PCP ? config->pcp_rank
                                 : field == FIELD_DCP ? config->dcp_rank
                                                      : config->group;
                add_len = (size_t) snprintf (number, sizeof number, "%u", value);
                add = number;
            }
            if (s_text_add (text, add, add_len)) {
                *reason_p = "out of memory";
                return -1;
            }
        }
    }
    if (text) {
        offsets[places] = part_start;
        lens[places] = text->len - part_start;
    }
    else if (places == 0) {
        *reason_p = "key template has no {hash}";
        return -1;
    }
    if (places_p)
        *places_p = places;
    return 0;
}

//  Compiles the parse pattern (the template is known to be good by now). Returns 0 or -1.
static int
s_pattern_compile (lookup_keys_t *self, const char *template, const lookup_config_t *config)
{
    size_t max_tokens = 2 * strlen (template) + 1;
    self->tokens = (s_token_t *) calloc (max_tokens, sizeof (s_token_t));
    s_text_t text = {NULL, 0, 0};
    if (!self->tokens || s_text_add (&text, "", 0))
        goto fail;
    size_t count = 0;
    const char *p = template;
    while (*p) {
        const char *add = p;
        size_t add_len = 0;
        char number[16];
        field_t field = FIELD_NONE;
        if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) {
            add_len = 1;
            p += 2;
        }
        else if (p[0] == '{') {
            const char *close = strchr (p + 1, '}');
            field = s_field (p + 1, (size_t) (close - p - 1));
            p = close + 1;
            if (field == FIELD_MODEL) {
                add = config->model ? config->model : "";
                add_len = strlen (add);
                field = FIELD_NONE;
            }
            else if (field == FIELD_PCP || field == FIELD_DCP || field == FIELD_GROUP) {
                add_len = (size_t) snprintf (number, sizeof number, "%u",
                                             field == FIELD_PCP   ? config->pcp_rank
                                             : field == FIELD_DCP ? config->dcp_rank
                                                                  : config->group);
                add = number;
                field = FIELD_NONE;
            }
            else if (field == FIELD_CACHE_PREFIX) {
                //  As compiled: the prefix and an "@", or nothing.
                const char *prefix = config->cache_prefix ? config->cache_prefix : "";
                if (*prefix && s_text_add (&text, "", 0))
                    goto fail;
                add_len = *prefix ? (size_t) snprintf (number, 0, "%s@", prefix) : 0;
                field = FIELD_NONE;
                if (add_len) {
                    if (count == 0 || self->tokens[count - 1].field != FIELD_NONE)
                        self->tokens[count++] = (s_token_t){FIELD_NONE, text.len, 0};
                    if (s_text_add (&text, prefix, strlen (prefix)) || s_text_add (&text, "@", 1))
                        goto fail;
                    self->tokens[count - 1].len += add_len;
                    add_len = 0;
                }
            }
        }
        else {
            add_len = strcspn (p, "{}");
            p += add_len;
        }
        if (field != FIELD_NONE)
            self->tokens[count++] = (s_token_t){field, 0, 0};
        else if (add_len) {
            //  Runs of literal text join into one token.
            if (count == 0 || self->tokens[count - 1].field != FIELD_NONE)
                self->tokens[count++] = (s_token_t){FIELD_NONE, text.len, 0};
            if (s_text_add (&text, add, add_len))
                goto fail;
            self->tokens[count - 1].len += add_len;
        }
    }
    self->token_count = count;
    self->pattern_text = text.data;
    return 0;
fail:
    free (text.data);
    return -1;
}

lookup_keys_t *
lookup_keys_new (const lookup_config_t *config, const char **reason_p)
{
    assert (config);
    const char *reason = NULL;
    const char *template =
        config->key_template && *config->key_template ? config->key_template : NULL;
    lookup_grouping_t grouping;
    if (!template && lookup_key_scheme (config->key_scheme, &template, &grouping)) {
        if (reason_p)
            *reason_p = "unknown key scheme (known: v1, group, current)";
        return NULL;
    }
    uint32_t tp_size = config->tp_size ? config->tp_size : 1;
    uint32_t pp_size = config->pp_size ? config->pp_size : 1;
    lookup_keys_t *self = (lookup_keys_t *) calloc (1, sizeof *self);
    s_text_t text = {NULL, 0, 0};
    size_t places = 0;
    if (!self)
        reason = "out of memory";
    else if (s_compile (template, config, 0, 0, NULL, NULL, NULL, &places, &reason) == 0) {
        self->ranks = (size_t) tp_size * pp_size;
        self->hash_places = places;
        size_t parts = self->ranks * (places + 1);
        self->part_offset = (size_t *) calloc (parts, sizeof (size_t));
        self->part_len = (size_t *) calloc (parts, sizeof (size_t));
        self->fixed_len = (size_t *) calloc (self->ranks, sizeof (size_t));
        if (!self->part_offset || !self->part_len || !self->fixed_len)
            reason = "out of memory";
        for (uint32_t tp = 0; tp < tp_size && !reason; tp++)
            for (uint32_t pp = 0; pp < pp_size && !reason; pp++) {
                size_t rank = (size_t) tp * pp_size + pp;
                size_t first = rank * (places + 1);
                size_t before = text.len;
                if (s_compile (template, config, tp, pp, &text, self->part_offset + first,
                               self->part_len + first, NULL, &reason)
                    == 0)
                    self->fixed_len[rank] = text.len - before;
            }
    }
    if (reason) {
        free (text.data);
        lookup_keys_destroy (&self);
        if (reason_p)
            *reason_p = reason;
        return NULL;
    }
    //  A template of nothing but {hash} has no literal text at all.
    self->part_text = text.data ? text.data : (char *) calloc (1, 1);
    if (!self->part_text || s_pattern_compile (self, template, config)) {
        lookup_keys_destroy (&self);
        if (reason_p)
            *reason_p = "out of memory";
    }
    return self;
}

void
lookup_keys_destroy (lookup_keys_t **self_p)
{
    assert (self_p);
    lookup_keys_t *self = *self_p;
    if (self) {
        free (self->part_text);
        free (self->part_offset);
        free (self->part_len);
        free (self->fixed_len);
        free (self->keys_text);
        free ((void *) self->keys);
        free (self->key_lens);
        free (self->tokens);
        free (self->pattern_text);
        free (self);
        *self_p = NULL;
    }
}

size_t
lookup_keys_ranks (lookup_keys_t *self)
{
    assert (self);
    return self->ranks;
}

int
lookup_keys_expand (lookup_keys_t *self, char *const *hashes, const size_t *hash_lens, size_t count,
                    size_t max_key_len, const char *const **keys_p, const char **reason_p)
{
    assert (self);
    assert (keys_p);
    const char *reason = NULL;
    if (count > LOOKUP_KEYS_MAX / self->ranks) {
        reason = "too many keys";
        goto fail;
    }
    size_t key_count = count * self->ranks;
    //  Size everything first: each hash is below 2^17 bytes and there are at most 10^6 keys,
    //  so none of these sums can overflow a 64-bit size_t.
    size_t fixed_total = 0, max_fixed = 0;
    for (size_t r = 0; r < self->ranks; r++) {
        fixed_total += self->fixed_len[r] + 1;
        if (self->fixed_len[r] > max_fixed)
            max_fixed = self->fixed_len[r];
    }
    size_t total = count * fixed_total;
    for (size_t i = 0; i < count; i++) {
        size_t hash_bytes = self->hash_places * hash_lens[i];
        if (max_key_len && max_fixed + hash_bytes > max_key_len) {
            reason = "key longer than the store's limit";
            goto fail;
        }
        total += self->ranks * hash_bytes;
    }
    if (total > self->keys_text_size) {
        char *text = (char *) realloc (self->keys_text, total);
        if (!text) {
            reason = "out of memory";
            goto fail;
        }
        self->keys_text = text;
        self->keys_text_size = total;
    }
    if (key_count > self->keys_size) {
        const char **keys =
            (const char **) realloc ((void *) self->keys, key_count * sizeof (char *));
        if (keys)
            self->keys = keys;
        size_t *lens = (size_t *) realloc (self->key_lens, key_count * sizeof (size_t));
        if (lens)
            self->key_lens = lens;
        if (!keys || !lens) {
            reason = "out of memory";
            goto fail;
        }
        self->keys_size = key_count;
    }
    char *out = self->keys_text;
    size_t places = self->hash_places;
    for (size_t i = 0; i < count; i++)
        for (size_t r = 0; r < self->ranks; r++) {
            char *key = out;
            self->keys[i * self->ranks + r] = key;
            const size_t *offset = self->part_offset + r * (places + 1);
            const size_t *len = self->part_len + r * (places + 1);
            for (size_t k = 0; k <= places; k++) {
                memcpy (out, self->part_text + offset[k], len[k]);
                out += len[k];
                if (k < places) {
                    memcpy (out, hashes[i], hash_lens[i]);
                    out += hash_lens[i];
                }
            }
            self->key_lens[i * self->ranks + r] = (size_t) (out - key);
            *out++ = 0;
        }
    assert ((size_t) (out - self->keys_text) == total || count == 0);
    *keys_p = self->keys;
    return 0;
fail:
    if (reason_p)
        *reason_p = reason;
    return -1;
}

//  ---- parsing ---------------------------------------------------------------------------

typedef struct {
    const char *hash;
    size_t hash_len;
    uint32_t tp, pp;
} s_parsed_t;

static bool
s_is_hex (char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

//  Matches tokens[t..] against key[at..len]; depth is bounded by the token count.
static bool
s_match (const lookup_keys_t *self, size_t t, const char *key, size_t at, size_t len,
         s_parsed_t *parsed)
{
    if (t == self->token_count)
        return at == len;
    const s_token_t *token = &self->tokens[t];
    if (token->field == FIELD_NONE)
        return token->len <= len - at
               && memcmp (key + at, self->pattern_text + token->offset, token->len) == 0
               && s_match (self, t + 1, key, at + token->len, len, parsed);
    size_t run = 0;
    if (token->field == FIELD_HASH)
        while (at + run < len && s_is_hex (key[at + run]))
            run++;
    else
        while (at + run < len && run < 9 && key[at + run] >= '0' && key[at + run] <= '9')
            run++; //  at most 9 digits: always a uint32_t
    for (; run > 0; run--) {
        s_parsed_t saved = *parsed;
        if (token->field == FIELD_HASH) {
            //  Every {hash} of a key is the same hash.
            if (parsed->hash
                && (parsed->hash_len != run || memcmp (parsed->hash, key + at, run) != 0))
                continue;
            parsed->hash = key + at;
            parsed->hash_len = run;
        }
        else {
            uint32_t value = 0;
            for (size_t i = 0; i < run; i++)
                value = value * 10 + (uint32_t) (key[at + i] - '0');
            *(token->field == FIELD_TP ? &parsed->tp : &parsed->pp) = value;
        }
        if (s_match (self, t + 1, key, at + run, len, parsed))
            return true;
        *parsed = saved;
    }
    return false;
}

const size_t *
lookup_keys_lens (lookup_keys_t *self)
{
    assert (self);
    return self->key_lens;
}

bool
lookup_keys_parse (const lookup_keys_t *self, const char *key, size_t len, const char **hash_p,
                   size_t *hash_len_p, uint32_t *tp_p, uint32_t *pp_p)
{
    assert (self && key);
    s_parsed_t parsed = {NULL, 0, 0, 0};
    if (!s_match (self, 0, key, 0, len, &parsed))
        return false;
    *hash_p = parsed.hash;
    *hash_len_p = parsed.hash_len;
    *tp_p = parsed.tp;
    *pp_p = parsed.pp;
    return true;
}

//  ---- self test -----------------------------------------------------------------------

static lookup_keys_t *
s_keys (const char *template, const char *model, uint32_t tp, uint32_t pp, const char **reason)
{
    lookup_config_t config = {.key_template = template,
                              .model = model,
                              .tp_size = tp,
                              .pp_size = pp,
                              .pcp_rank = 3,
                              .dcp_rank = 4,
                              .block_size = 16};
    *reason = NULL;
    return lookup_keys_new (&config, reason);
}

void
lookup_keys_test (bool verbose)
{
    const char *reason;
    const char *const *keys;
    char *hashes[] = {"ab01", "ffee"};
    size_t lens[] = {4, 4};

    //  The default template, 2 tp x 2 pp ranks: tp outer, pp inner, per hash.
    lookup_keys_t *self = s_keys (NULL, "llama", 2, 2, &reason);
    assert (self);
    assert (lookup_keys_ranks (self) == 4);
    assert (lookup_keys_expand (self, hashes, lens, 2, 0, &keys, &reason) == 0);
    assert (strcmp (keys[0], "llama@tp_rank:0@pcp3@dcp4@pp_rank:0@group:0@ab01") == 0);
    assert (strcmp (keys[1], "llama@tp_rank:0@pcp3@dcp4@pp_rank:1@group:0@ab01") == 0);
    assert (strcmp (keys[2], "llama@tp_rank:1@pcp3@dcp4@pp_rank:0@group:0@ab01") == 0);
    assert (strcmp (keys[3], "llama@tp_rank:1@pcp3@dcp4@pp_rank:1@group:0@ab01") == 0);
    assert (strcmp (keys[7], "llama@tp_rank:1@pcp3@dcp4@pp_rank:1@group:0@ffee") == 0);
    for (size_t i = 0; i < 8; i++)
        assert (lookup_keys_lens (self)[i] == strlen (keys[i]));
    if (verbose)
        printf ("\n  %s", keys[7]);
    //  An empty expansion, and a key-length limit: the longest key here is 48 bytes.
    assert (lookup_keys_expand (self, hashes, lens, 0, 0, &keys, &reason) == 0);
    assert (lookup_keys_expand (self, hashes, lens, 2, 48, &keys, &reason) == 0);
    assert (lookup_keys_expand (self, hashes, lens, 2, 47, &keys, &reason) == -1);
    assert (strcmp (reason, "key longer than the store's limit") == 0);
    //  The key-count cap: LOOKUP_KEYS_MAX / 4 hashes is the most.
    assert (lookup_keys_expand (self, hashes, lens, LOOKUP_KEYS_MAX / 4 + 1, 0, &keys, &reason)
            == -1);
    assert (strcmp (reason, "too many keys") == 0);
    lookup_keys_destroy (&self);
    assert (self == NULL);
    lookup_keys_destroy (&self);

    //  Another engine's template: every field, {hash} twice, escaped braces, big numbers.
    self = s_keys ("{{{model}}}/{hash}/t{tp}p{pp}/c{pcp}d{dcp}/{hash}", "m", 1, 12, &reason);
    assert (self && lookup_keys_ranks (self) == 12);
    assert (lookup_keys_expand (self, hashes, lens, 2, 0, &keys, &reason) == 0);
    assert (strcmp (keys[0], "{m}/ab01/t0p0/c3d4/ab01") == 0);
    assert (strcmp (keys[11], "{m}/ab01/t0p11/c3d4/ab01") == 0);
    assert (strcmp (keys[23], "{m}/ffee/t0p11/c3d4/ffee") == 0);
    //  Growing the buffers keeps earlier keys correct (the pointers are set after resizing).
    {
        size_t n = 5000;
        char **many = (char **) malloc (n * sizeof (char *));
        size_t *many_lens = (size_t *) malloc (n * sizeof (size_t));
        char *text = (char *) malloc (n * 9);
        assert (many && many_lens && text);
        for (size_t i = 0; i < n; i++) {
            many[i] = text + i * 9;
            snprintf (many[i], 9, "%08zx", i);
            many_lens[i] = 8;
        }
        assert (lookup_keys_expand (self, many, many_lens, n, 0, &keys, &reason) == 0);
        assert (strcmp (keys[0], "{m}/00000000/t0p0/c3d4/00000000") == 0);
        assert (strcmp (keys[12 * 4999 + 5], "{m}/00001387/t0p5/c3d4/00001387") == 0);
        free (many);
        free (many_lens);
        free (text);
    }
    lookup_keys_destroy (&self);

    //  Nothing but the hash; defaults for an empty template and zero sizes.
    self = s_keys ("{hash}", NULL, 1, 1, &reason);
    assert (self);
    assert (lookup_keys_expand (self, hashes, lens, 2, 0, &keys, &reason) == 0);
    assert (strcmp (keys[1], "ffee") == 0);
    lookup_keys_destroy (&self);
    self = s_keys ("", "x", 0, 0, &reason);
    assert (self && lookup_keys_ranks (self) == 1);
    assert (lookup_keys_expand (self, hashes, lens, 1, 0, &keys, &reason) == 0);
    assert (strcmp (keys[0], "x@tp_rank:0@pcp3@dcp4@pp_rank:0@group:0@ab01") == 0);
    lookup_keys_destroy (&self);

    //  The schemes: v1 (no group), and a cache prefix and a group in the default one.
    lookup_config_t scheme = {.key_scheme = "v1", .model = "m", .block_size = 16};
    self = lookup_keys_new (&scheme, &reason);
    assert (self && lookup_keys_expand (self, hashes, lens, 1, 0, &keys, &reason) == 0);
    assert (strcmp (keys[0], "m@tp_rank:0@pcp0@dcp0@pp_rank:0@ab01") == 0);
    lookup_keys_destroy (&self);
    scheme = (lookup_config_t){.model = "m", .cache_prefix = "tenant7", .group = 2};
    self = lookup_keys_new (&scheme, &reason);
    assert (self && lookup_keys_expand (self, hashes, lens, 1, 0, &keys, &reason) == 0);
    assert (strcmp (keys[0], "tenant7@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:2@ab01") == 0);
    lookup_keys_destroy (&self);
    scheme.key_scheme = "v9";
    assert (lookup_keys_new (&scheme, &reason) == NULL && strstr (reason, "key scheme"));
    //  Parsing: the keys the template makes come back to their hash and ranks.
    {
        const char *hash;
        size_t hash_len;
        uint32_t tp, pp;
        self = s_keys (NULL, "llama", 2, 2, &reason);
        assert (self);
        const char *key = "llama@tp_rank:1@pcp3@dcp4@pp_rank:12@group:0@ab01Ff";
        assert (lookup_keys_parse (self, key, strlen (key), &hash, &hash_len, &tp, &pp));
        assert (hash_len == 6 && memcmp (hash, "ab01Ff", 6) == 0 && tp == 1 && pp == 12);
        const char *others[] = {"llama@tp_rank:1@pcp3@dcp4@pp_rank:0@group:0@",    //  no hash
                                "llama@tp_rank:1@pcp3@dcp4@pp_rank:0@group:0@xyz", //  not hex
                                "llama@tp_rank:1@pcp9@dcp4@pp_rank:0@group:0@ab",  //  another pcp
                                "llamb@tp_rank:1@pcp3@dcp4@pp_rank:0@group:0@ab",  //  another model
                                "llama@tp_rank:@pcp3@dcp4@pp_rank:0@group:0@ab",   //  no rank
                                "llama@tp_rank:1234567890@pcp3@dcp4@pp_rank:0@group:0@ab",
                                "plain-key",
                                ""};
        for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
            assert (!lookup_keys_parse (self, others[i], strlen (others[i]), &hash, &hash_len, &tp,
                                        &pp));
        lookup_keys_destroy (&self);
        //  Backtracking: a hex literal after {hash}; {hash} twice must agree.
        self = s_keys ("{hash}0/{tp}{{x}}{hash}", "m", 1, 1, &reason);
        assert (self);
        key = "ab00/7{x}ab0";
        assert (lookup_keys_parse (self, key, strlen (key), &hash, &hash_len, &tp, &pp));
        assert (hash_len == 3 && memcmp (hash, "ab0", 3) == 0 && tp == 7 && pp == 0);
        key = "ab00/7{x}ab1";
        assert (!lookup_keys_parse (self, key, strlen (key), &hash, &hash_len, &tp, &pp));
        lookup_keys_destroy (&self);
    }

    //  Bad templates.
    const char *bad[][2] = {
        {"{model}@{tp}", "key template has no {hash}"},
        {"{hash}{rank}", "key template has an unknown field (known: {model} {tp} {pp} {pcp} "
                         "{dcp} {group} {cache_prefix} {hash})"},
        {"{hash}{", "key template has an unmatched '{'"},
        {"{hash}}", "key template has an unmatched '}'"},
        {"{}{hash}", "key template has an unknown field (known: {model} {tp} {pp} {pcp} "
                     "{dcp} {group} {cache_prefix} {hash})"},
        {"{{hash}}", "key template has no {hash}"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        self = s_keys (bad[i][0], "m", 1, 1, &reason);
        assert (self == NULL);
        assert (reason && strcmp (reason, bad[i][1]) == 0);
    }
    if (verbose)
        printf ("\n");
}
