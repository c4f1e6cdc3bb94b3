/*  lookup_keys.h - store keys of a lookup: a key template expanded over hashes and ranks.

    The template names fields in braces: {model} {tp} {pp} {pcp} {dcp} {hash}; "{{" and "}}"
    stand for literal braces (as in Python's str.format, which vLLM's connector uses). It must
    hold {hash} at least once. lookup_keys_new compiles it once per rank pair (tp, pp), so a
    lookup only concatenates prebuilt parts around each hash.

    Keys are laid out block-major: the keys of hash i are keys[i * ranks .. i * ranks +
    ranks - 1], one per (tp, pp) with tp outer. A pure module, no sockets, no CZMQ; an
    instance belongs to one thread.
*/
#ifndef LOOKUP_KEYS_H_INCLUDED
#define LOOKUP_KEYS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "infra/lookup_config.h"

//  Most keys one lookup may expand to (hashes x tp x pp); more is refused. Equal to the most
//  keys the api takes in one request (kvpoold's --max-keys default), since the keys a lookup
//  asks the store about go in one EXIST job.
#define LOOKUP_KEYS_MAX 262144

typedef struct _lookup_keys_t lookup_keys_t;

//  Compiles config's template (NULL or "" means LOOKUP_DEFAULT_KEY_TEMPLATE; a NULL model
//  means ""; sizes of 0 mean 1). Returns NULL with *reason_p set to a static reason when the
//  template is bad. Caller owns the return value and must destroy it.
lookup_keys_t *lookup_keys_new (const lookup_config_t *config, const char **reason_p);

//  Destroys; does nothing on NULL; sets *self_p to NULL.
void lookup_keys_destroy (lookup_keys_t **self_p);

//  Keys per hash: tp_size x pp_size.
size_t lookup_keys_ranks (lookup_keys_t *self);

//  Expands count hashes (NUL-terminated, lengths in hash_lens) into count x ranks keys.
//  *keys_p points into self and stays valid until the next call or destroy. Returns 0, or -1
//  with a reason when there would be more than LOOKUP_KEYS_MAX keys or a key longer than
//  max_key_len bytes (0: no limit).
int lookup_keys_expand (lookup_keys_t *self, char *const *hashes, const size_t *hash_lens,
                        size_t count, size_t max_key_len, const char *const **keys_p,
                        const char **reason_p);

//  The lengths of the keys the last successful lookup_keys_expand made, in its order; valid
//  as long as those keys are.
const size_t *lookup_keys_lens (lookup_keys_t *self);

//  The other way: whether key (len bytes) is one the template makes for some hash and rank
//  pair, with this instance's model, pcp and dcp. {tp} and {pp} match decimal numbers (any,
//  not only those below the sizes), {hash} a run of hex digits (the same run at every place
//  it appears). On a match, sets the hash (pointing into key) and the ranks and returns true.
//  Allocates nothing; the instance is only read.
bool lookup_keys_parse (const lookup_keys_t *self, const char *key, size_t len, const char **hash_p,
                        size_t *hash_len_p, uint32_t *tp_p, uint32_t *pp_p);

void lookup_keys_test (bool verbose);

#endif
