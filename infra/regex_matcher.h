/*  regex_matcher.h - remove-by-regex's pattern matching, bounded and off the replica-manager.

    REMOVE_BY_REGEX used to run glibc's regcomp/regexec on the replica-manager's thread: a
    deeply nested pattern overflowed the stack, a backtracking one stalled every other request
    for tens of seconds, a{1,32767} took gigabytes. Now a pattern is compiled with PCRE2 under
    limits (a length limit, PCRE2's parens nest limit, its compiled-size limit) into a
    regex_batch_t, and the keys to test are copied into that batch, both on the
    replica-manager's thread (cheap, bounded). The matching, the part whose cost the pattern
    decides, runs on the regex_matcher_t's own low-priority thread under PCRE2's match, depth
    and heap limits and a time limit for the whole batch, while the replica-manager keeps
    serving. The batch comes back with one verdict per key, or with a reason it was refused.

    Semantics: PCRE2 syntax on the key's bytes (no UTF), an unanchored search like regexec,
    '.' matches any byte and '$' only the very end (as POSIX extended without REG_NEWLINE).

    Threads: a batch belongs to its owner; regex_matcher_submit lends it to the matcher's
    thread until regex_matcher_recv hands it back. One batch is matched at a time, in order.
*/
#ifndef REGEX_MATCHER_H_INCLUDED
#define REGEX_MATCHER_H_INCLUDED

#include <czmq.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvpool_status.h"

//  PCRE2 limits for matching one key. The match limit bounds backtracking (about 10 ms of
//  work per key here), the depth limit nested backtracking, the heap limit (KiB) the memory
//  PCRE2 may take for it.
#define REGEX_MATCH_LIMIT 1000000
#define REGEX_DEPTH_LIMIT 100000
#define REGEX_HEAP_LIMIT_KIB (64 * 1024)

typedef struct _regex_batch_t regex_batch_t;
typedef struct _regex_matcher_t regex_matcher_t;

//  Compiles pattern (pattern_len bytes; at most max_len). Returns a batch with no keys yet,
//  or NULL with a one-line reason in error (too long, or PCRE2's compile error and where).
regex_batch_t *regex_batch_new (const char *pattern, size_t pattern_len, size_t max_len,
                                char *error, size_t error_size);
//  Does nothing on NULL; sets *self_p to NULL.
void regex_batch_destroy (regex_batch_t **self_p);
//  Appends a copy of a key (key_len bytes, any bytes) and the caller's tag. Returns 0 or -1.
int regex_batch_add (regex_batch_t *self, const char *key, size_t key_len, uint64_t tag);
size_t regex_batch_count (regex_batch_t *self);
//  Key i as copied (NUL-terminated too), its length, its tag.
const char *regex_batch_key (regex_batch_t *self, size_t index, size_t *key_len_p);
uint64_t regex_batch_tag (regex_batch_t *self, size_t index);
//  After matching: whether key i matched.
bool regex_batch_hit (regex_batch_t *self, size_t index);
//  After matching: KVPOOL_OK; KVPOOL_INVALID_PARAMS when the batch was refused (a key
//  exceeded a PCRE2 limit, or the time limit ran out); KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS
//  when the matcher was stopped. Unless OK, no verdict is to be used.
int regex_batch_status (regex_batch_t *self);
const char *regex_batch_error (regex_batch_t *self);
//  Matches every key on the calling thread, giving up after time_limit_ms (0: no limit) or
//  when *cancel turns true. Returns 0 or -1 (then see regex_batch_status).
int regex_batch_match (regex_batch_t *self, uint64_t time_limit_ms, const atomic_bool *cancel);

//  Starts the matcher thread (at a lower scheduling priority than the store's threads).
//  time_limit_ms bounds one batch's matching.
regex_matcher_t *regex_matcher_new (uint64_t time_limit_ms);
//  Stops a match in progress at its next key and ends the thread. A batch still lent to the
//  matcher is not freed: it stays its owner's.
void regex_matcher_destroy (regex_matcher_t **self_p);
//  For a store that is stopping: the match in progress ends at its next key and this and
//  every later batch come back refused (KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS). Any thread.
void regex_matcher_stop (regex_matcher_t *self);
//  Lends batch to the matcher, to be matched after those before it. Returns 0 or -1.
int regex_matcher_submit (regex_matcher_t *self, regex_batch_t *batch);
//  The socket to poll: readable when a batch is back.
zsock_t *regex_matcher_sock (regex_matcher_t *self);
//  The next batch back, matched (or refused). NULL if interrupted.
regex_batch_t *regex_matcher_recv (regex_matcher_t *self);

void regex_matcher_test (bool verbose);

#endif
