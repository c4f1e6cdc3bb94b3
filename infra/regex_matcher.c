/*  regex_matcher.c - PCRE2 matching of remove-by-regex patterns on a thread of its own.

    A regex_batch_t is one compiled pattern and a compact copy of the keys to test: the key
    bytes back to back (each NUL-terminated, so the owner can look them up again), their
    start offsets and the owner's tags, plus one verdict byte per key once matched. Copying
    costs one pass on the owner's thread; in exchange the matcher never touches the owner's
    tables, and the owner may change them while the batch is out.

    Limits, all PCRE2's own: the compile context bounds the pattern's length (also checked
    first, for a clear reason) and keeps the default parens nest limit (250), so a pattern of
    thousands of nested parentheses is a compile error, not a stack overflow; the library's
    compiled-size limit refuses things like (?:a{1,65535}){65535}. The match context bounds
    each key's backtracking (REGEX_MATCH_LIMIT, about 20 ms of work here), its nesting depth
    and its heap. A key that hits one of them refuses the whole batch, as does running past
    the time limit, so a caller either gets every verdict or none.

    The thread runs under SCHED_IDLE (the kernel's weight for it is a third of nice 19's):
    on a 2-core machine a long match takes only the time the api, I/O and transfer threads
    leave, instead of slices of a core from them (at nice 10 the p99 of concurrent 1 MiB gets
    over tcp was up to 6x its idle value here). A match starved that way ends at the time
    limit with a clear refusal, as any slow one does.

    The thread is an actor (its loop: infra/actor_shell.h): MATCH and a batch on its pipe,
    the batch back on the pipe once matched.
*/
#include "infra/regex_matcher.h"

#include "infra/actor_shell.h"
#include "infra/log.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <pthread.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <unistd.h>

#define MATCHER_NICE 10

//  Byte semantics as regexec without REG_NEWLINE: '.' matches every byte (a newline too), '$'
//  only the end of the key, and no (*UTF) from the pattern.
#define COMPILE_OPTIONS (PCRE2_DOTALL | PCRE2_DOLLAR_ENDONLY | PCRE2_NEVER_UTF)

struct _regex_batch_t {
    pcre2_code *code;
    char *keys;     //  key bytes, each followed by a NUL
    size_t bytes;   //  used
    size_t room;    //  allocated
    size_t *starts; //  count + 1 entries: key i is keys[starts[i] .. starts[i + 1] - 1)
    uint64_t *tags; //  the owner's, one per key
    uint8_t *hits;  //  verdicts, one per key, after matching
    size_t count;
    size_t capacity; //  entries of tags and hits (starts has one more)
    int status;
    char error[128];
};

//  Ownership of a batch moves through libzmq, which ThreadSanitizer does not see: the sender
//  releases, the receiver acquires (as messages/kvp_job.c does for jobs).
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define s_handoff_release(batch) __tsan_release (batch)
#define s_handoff_acquire(batch) __tsan_acquire (batch)
#else
#define s_handoff_release(batch) ((void) (batch))
#define s_handoff_acquire(batch) ((void) (batch))
#endif

regex_batch_t *
regex_batch_new (const char *pattern, size_t pattern_len, size_t max_len, char *error,
                 size_t error_size)
{
    if (pattern_len > max_len) {
        snprintf (error, error_size, "pattern of %zu bytes is longer than the limit of %zu",
                  pattern_len, max_len);
        return NULL;
    }
    pcre2_compile_context *context = pcre2_compile_context_create (NULL);
    if (!context) {
        snprintf (error, error_size, "no memory to compile the pattern");
        return NULL;
    }
    pcre2_set_max_pattern_length (context, max_len);
    int code_error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code *code = pcre2_compile ((PCRE2_SPTR) pattern, pattern_len, COMPILE_OPTIONS,
                                      &code_error, &offset, context);
    pcre2_compile_context_free (context);
    if (!code) {
        PCRE2_UCHAR message[96];
        if (pcre2_get_error_message (code_error, message, sizeof message) < 0)
            snprintf ((char *) message, sizeof message, "error %d", code_error);
        snprintf (error, error_size, "bad regular expression at offset %zu: %s", (size_t) offset,
                  (char *) message);
        return NULL;
    }
    regex_batch_t *self = (regex_batch_t *) zmalloc (sizeof (regex_batch_t));
    self->code = code;
    self->starts = (size_t *) zmalloc (sizeof (size_t));
    return self;
}

void
regex_batch_destroy (regex_batch_t **self_p)
{
    regex_batch_t *self = *self_p;
    if (!self)
        return;
    pcre2_code_free (self->code);
    free (self->keys);
    free (self->starts);
    free (self->tags);
    free (self->hits);
    free (self);
    *self_p = NULL;
}

//  Grows buffer (of *room bytes) to hold at least need bytes. Returns 0 or -1.
static int
s_grow (void **buffer, size_t *room, size_t need, size_t least)
{
    if (need <= *room)
        return 0;
    size_t size = *room ? *room : least;
    while (size < need)
        size *= 2;
    void *bigger = realloc (*buffer, size);
    if (!bigger)
        return -1;
    *buffer = bigger;
    *room = size;
    return 0;
}

int
regex_batch_add (regex_batch_t *self, const char *key, size_t key_len, uint64_t tag)
{
    assert (self);
    if (self->count == self->capacity) {
        size_t capacity = self->capacity ? self->capacity * 2 : 64;
        size_t *starts = (size_t *) realloc (self->starts, (capacity + 1) * sizeof (size_t));
        if (starts)
            self->starts = starts;
        uint64_t *tags = (uint64_t *) realloc (self->tags, capacity * sizeof (uint64_t));
        if (tags)
            self->tags = tags;
        if (!starts || !tags)
            return -1;
        self->capacity = capacity;
    }
    if (s_grow ((void **) &self->keys, &self->room, self->bytes + key_len + 1, 4096) == -1)
        return -1;
    memcpy (self->keys + self->bytes, key, key_len);
    self->keys[self->bytes + key_len] = 0;
    self->bytes += key_len + 1;
    self->tags[self->count] = tag;
    self->starts[++self->count] = self->bytes;
    return 0;
}

size_t
regex_batch_count (regex_batch_t *self)
{
    assert (self);
    return self->count;
}

const char *
regex_batch_key (regex_batch_t *self, size_t index, size_t *key_len_p)
{
    assert (self && index < self->count);
    if (key_len_p)
        *key_len_p = self->starts[index + 1] - self->starts[index] - 1;
    return self->keys + self->starts[index];
}

uint64_t
regex_batch_tag (regex_batch_t *self, size_t index)
{
    assert (self && index < self->count);
    return self->tags[index];
}

bool
regex_batch_hit (regex_batch_t *self, size_t index)
{
    assert (self && index < self->count);
    return self->status == KVPOOL_OK && self->hits && self->hits[index];
}

int
regex_batch_status (regex_batch_t *self)
{
    assert (self);
    return self->status;
}

const char *
regex_batch_error (regex_batch_t *self)
{
    assert (self);
    return self->error;
}

static int s_refuse (regex_batch_t *self, int status, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));

//  Sets the batch's status (a kvpool status) and reason; returns -1.
static int
s_refuse (regex_batch_t *self, int status, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    vsnprintf (self->error, sizeof self->error, format, args);
    va_end (args);
    self->status = status;
    return -1;
}

int
regex_batch_match (regex_batch_t *self, uint64_t time_limit_ms, const atomic_bool *cancel)
{
    assert (self);
    self->status = KVPOOL_OK;
    self->error[0] = 0;
    free (self->hits);
    self->hits = (uint8_t *) zmalloc (self->count ? self->count : 1);
    pcre2_match_context *context = pcre2_match_context_create (NULL);
    pcre2_match_data *data = pcre2_match_data_create (1, NULL);
    if (!context || !data) {
        pcre2_match_context_free (context);
        pcre2_match_data_free (data);
        return s_refuse (self, KVPOOL_INTERNAL_ERROR, "no memory to match the pattern");
    }
    pcre2_set_match_limit (context, REGEX_MATCH_LIMIT);
    pcre2_set_depth_limit (context, REGEX_DEPTH_LIMIT);
    pcre2_set_heap_limit (context, REGEX_HEAP_LIMIT_KIB);
    int64_t deadline = time_limit_ms ? zclock_mono () + (int64_t) time_limit_ms : INT64_MAX;
    for (size_t i = 0; i < self->count; i++) {
        if (cancel && atomic_load_explicit (cancel, memory_order_relaxed)) {
            s_refuse (self, KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS, "the store is stopping");
            break;
        }
        if (zclock_mono () > deadline) {
            s_refuse (self, KVPOOL_INVALID_PARAMS,
                      "matching took more than %llu ms (%zu of %zu keys done)",
                      (unsigned long long) time_limit_ms, i, self->count);
            break;
        }
        size_t key_len = self->starts[i + 1] - self->starts[i] - 1;
        int rc = pcre2_match (self->code, (PCRE2_SPTR) (self->keys + self->starts[i]), key_len, 0,
                              0, data, context);
        //  0 is a match whose captures did not fit the one-pair ovector.
        if (rc >= 0)
            self->hits[i] = 1;
        else if (rc == PCRE2_ERROR_NOMATCH)
            continue;
        else if (rc == PCRE2_ERROR_MATCHLIMIT) {
            s_refuse (self, KVPOOL_INVALID_PARAMS, "pattern exceeded the match limit (%d) on a key",
                      REGEX_MATCH_LIMIT);
            break;
        }
        else if (rc == PCRE2_ERROR_DEPTHLIMIT) {
            s_refuse (self, KVPOOL_INVALID_PARAMS, "pattern exceeded the depth limit (%d) on a key",
                      REGEX_DEPTH_LIMIT);
            break;
        }
        else if (rc == PCRE2_ERROR_HEAPLIMIT) {
            s_refuse (self, KVPOOL_INVALID_PARAMS,
                      "pattern exceeded the heap limit (%d KiB) on a key", REGEX_HEAP_LIMIT_KIB);
            break;
        }
        else {
            PCRE2_UCHAR message[96];
            if (pcre2_get_error_message (rc, message, sizeof message) < 0)
                snprintf ((char *) message, sizeof message, "error %d", rc);
            s_refuse (self, KVPOOL_INVALID_PARAMS, "matching failed on a key: %s",
                      (char *) message);
            break;
        }
    }
    pcre2_match_data_free (data);
    pcre2_match_context_free (context);
    return self->status == KVPOOL_OK ? 0 : -1;
}

//  ---- the matcher thread ------------------------------------------------------------

struct _regex_matcher_t {
    zactor_t *actor;
    uint64_t time_limit_ms;
    atomic_bool cancel; //  set by regex_matcher_destroy; read between keys
};

//  MATCH <batch>: the batch is matched and handed back (nothing else is sent here).
static int
s_matcher_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    regex_matcher_t *self = (regex_matcher_t *) arg;
    zframe_t *frame = zmsg_first (msg);
    assert (streq (command, "MATCH") && frame && zframe_size (frame) == sizeof (void *));
    regex_batch_t *batch;
    memcpy (&batch, zframe_data (frame), sizeof batch);
    assert (batch);
    s_handoff_acquire (batch);
    regex_batch_match (batch, self->time_limit_ms, &self->cancel);
    s_handoff_release (batch);
    zsock_send (actor_shell_pipe (shell), "p", batch);
    return 0;
}

static void
s_matcher_actor (zsock_t *pipe, void *args)
{
    regex_matcher_t *self = (regex_matcher_t *) args;
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-regex");
    //  Per-thread on Linux; lowering one's own priority needs no privilege.
    struct sched_param idle = {0};
    if (pthread_setschedparam (pthread_self (), SCHED_IDLE, &idle) != 0
        && setpriority (PRIO_PROCESS, (id_t) gettid (), MATCHER_NICE) == -1)
        kvp_debug ("regex-matcher: cannot lower its priority: %s", strerror (errno));
    actor_shell_on_command (shell, s_matcher_command);
    //  Waits on its pipe alone, as a blocking read of it did.
    actor_shell_set_nonstop (shell, true);
    actor_shell_run (shell, self);
    actor_shell_destroy (&shell);
    //  Everything this thread did happens before regex_matcher_destroy returns.
    s_handoff_release (self);
}

regex_matcher_t *
regex_matcher_new (uint64_t time_limit_ms)
{
    regex_matcher_t *self = (regex_matcher_t *) zmalloc (sizeof (regex_matcher_t));
    self->time_limit_ms = time_limit_ms;
    atomic_init (&self->cancel, false);
    self->actor = zactor_new (s_matcher_actor, self);
    if (!self->actor) {
        free (self);
        return NULL;
    }
    //  One batch is out at a time in practice; never block the owner on a full pipe.
    zsock_set_sndhwm (self->actor, 0);
    return self;
}

void
regex_matcher_destroy (regex_matcher_t **self_p)
{
    regex_matcher_t *self = *self_p;
    if (!self)
        return;
    //  The match in progress stops at its next key; the batch pointer it then sends back is
    //  discarded by zactor_destroy's wait for the thread (the batch is its owner's).
    regex_matcher_stop (self);
    zactor_destroy (&self->actor);
    s_handoff_acquire (self);
    free (self);
    *self_p = NULL;
}

void
regex_matcher_stop (regex_matcher_t *self)
{
    assert (self);
    atomic_store (&self->cancel, true);
}

int
regex_matcher_submit (regex_matcher_t *self, regex_batch_t *batch)
{
    assert (self && batch);
    s_handoff_release (batch);
    return zsock_send (self->actor, "sp", "MATCH", batch);
}

zsock_t *
regex_matcher_sock (regex_matcher_t *self)
{
    assert (self);
    return zactor_sock (self->actor);
}

regex_batch_t *
regex_matcher_recv (regex_matcher_t *self)
{
    assert (self);
    void *pointer = NULL;
    if (zsock_recv (self->actor, "p", &pointer) == -1)
        return NULL;
    s_handoff_acquire (pointer);
    return (regex_batch_t *) pointer;
}

//  ---- self test ---------------------------------------------------------------------

//  Matches pattern against keys on this thread; returns the verdicts as a string of 0/1, or
//  "refused" / "bad".
static const char *
s_test_verdicts (const char *pattern, const char **keys, size_t count, char *out)
{
    char error[160];
    regex_batch_t *batch = regex_batch_new (pattern, strlen (pattern), 4096, error, sizeof error);
    if (!batch)
        return "bad";
    for (size_t i = 0; i < count; i++)
        assert (regex_batch_add (batch, keys[i], strlen (keys[i]), i) == 0);
    if (regex_batch_match (batch, 0, NULL) == -1) {
        regex_batch_destroy (&batch);
        return "refused";
    }
    for (size_t i = 0; i < count; i++)
        out[i] = regex_batch_hit (batch, i) ? '1' : '0';
    out[count] = 0;
    regex_batch_destroy (&batch);
    return out;
}

void
regex_matcher_test (bool verbose)
{
    char out[64];
    char error[160];
    const char *keys[] = {"model.a", "xmodel.b", "model", "a\nb", "ab"};

    //  Unanchored search as regexec; ^ and $ at the key's ends; '.' matches a newline; '$'
    //  does not match before a final newline.
    assert (streq (s_test_verdicts ("model", keys, 5, out), "11100"));
    assert (streq (s_test_verdicts ("^model\\.", keys, 5, out), "10000"));
    assert (streq (s_test_verdicts ("^a.b$", keys, 5, out), "00010"));
    assert (streq (s_test_verdicts ("b$", keys, 5, out), "01011"));
    assert (streq (s_test_verdicts ("^(model|ab)$", keys, 5, out), "00101"));
    assert (streq (s_test_verdicts ("", keys, 5, out), "11111"));
    const char *newline_end[] = {"ab\n"};
    assert (streq (s_test_verdicts ("b$", newline_end, 1, out), "0"));

    //  Keys are matched by length: bytes after a NUL count.
    regex_batch_t *batch = regex_batch_new ("b$", 2, 4096, error, sizeof error);
    assert (batch);
    assert (regex_batch_add (batch, "a\0b", 3, 7) == 0);
    assert (regex_batch_add (batch, "ab\0c", 4, 8) == 0);
    assert (regex_batch_match (batch, 0, NULL) == 0);
    assert (regex_batch_hit (batch, 0) && !regex_batch_hit (batch, 1));
    size_t key_len;
    assert (memcmp (regex_batch_key (batch, 1, &key_len), "ab\0c", 5) == 0 && key_len == 4);
    assert (regex_batch_tag (batch, 1) == 8 && regex_batch_count (batch) == 2);
    regex_batch_destroy (&batch);

    //  Refused at compile: bad syntax, too long, 13,000 nested parentheses (PCRE2's nest
    //  limit; glibc's regcomp overflowed its stack), a repeat too large to compile.
    assert (!regex_batch_new ("([", 2, 4096, error, sizeof error));
    assert (strstr (error, "bad regular expression at offset"));
    char *deep = (char *) malloc (26002);
    memset (deep, '(', 13000);
    memset (deep + 13000, ')', 13000);
    deep[26000] = 0;
    assert (!regex_batch_new (deep, 26000, 4096, error, sizeof error));
    assert (strstr (error, "longer than the limit of 4096"));
    assert (!regex_batch_new (deep, 26000, 65536, error, sizeof error));
    assert (strstr (error, "too deeply nested"));
    free (deep);
    const char *huge = "(?:a{1,65535}){65535}";
    assert (!regex_batch_new (huge, strlen (huge), 4096, error, sizeof error));
    //  a{1,32767} compiles to one bounded repeat: small, and quick.
    const char *wide[] = {"aaaa", "bbbb"};
    assert (streq (s_test_verdicts ("a{1,32767}", wide, 2, out), "10"));

    //  A backtracking pattern hits the match limit on a long key: the batch is refused.
    char *long_key = (char *) malloc (4097);
    memset (long_key, 'a', 4095);
    long_key[4095] = 'b';
    long_key[4096] = 0;
    batch = regex_batch_new ("(a+)+$", 6, 4096, error, sizeof error);
    assert (regex_batch_add (batch, "aaa", 3, 0) == 0);
    assert (regex_batch_add (batch, long_key, 4096, 1) == 0);
    int64_t start = zclock_mono ();
    assert (regex_batch_match (batch, 0, NULL) == -1);
    assert (zclock_mono () - start < 2000);
    assert (strstr (regex_batch_error (batch), "match limit"));
    assert (!regex_batch_hit (batch, 0)); //  no verdict from a refused batch
    regex_batch_destroy (&batch);

    //  The time limit refuses a batch that is slow in sum, key by key under the limits.
    batch = regex_batch_new ("^(a|a)+$", 8, 4096, error, sizeof error);
    long_key[4095] = 'a';
    for (size_t i = 0; i < 2000; i++)
        assert (regex_batch_add (batch, long_key, 4096, i) == 0);
    start = zclock_mono ();
    assert (regex_batch_match (batch, 20, NULL) == -1);
    assert (strstr (regex_batch_error (batch), "more than 20 ms"));
    assert (zclock_mono () - start < 1000);

    //  On the matcher thread: submitted, matched, handed back.
    regex_matcher_t *matcher = regex_matcher_new (5000);
    assert (matcher);
    regex_batch_t *small = regex_batch_new ("^model", 6, 4096, error, sizeof error);
    for (size_t i = 0; i < 5; i++)
        assert (regex_batch_add (small, keys[i], strlen (keys[i]), i) == 0);
    assert (regex_matcher_submit (matcher, small) == 0);
    zpoller_t *poller = zpoller_new (regex_matcher_sock (matcher), NULL);
    assert (zpoller_wait (poller, 5000) == regex_matcher_sock (matcher));
    assert (regex_matcher_recv (matcher) == small);
    assert (regex_batch_status (small) == KVPOOL_OK && regex_batch_hit (small, 2)
            && !regex_batch_hit (small, 1));
    zpoller_destroy (&poller);

    //  Stopped while a slow batch runs (2000 keys of ~1.6 ms): the stop is prompt and the
    //  batch, still its owner's, is intact; a batch after the stop is refused at once.
    assert (regex_matcher_submit (matcher, batch) == 0);
    assert (regex_matcher_submit (matcher, small) == 0);
    zclock_sleep (30);
    start = zclock_mono ();
    regex_matcher_destroy (&matcher);
    assert (zclock_mono () - start < 1000);
    assert (regex_batch_status (batch) == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
    assert (strstr (regex_batch_error (batch), "stopping"));
    assert (regex_batch_status (small) == KVPOOL_UNAVAILABLE_IN_CURRENT_STATUS);
    regex_batch_destroy (&small);
    regex_batch_destroy (&batch);
    free (long_key);
    if (verbose)
        printf ("PCRE2 semantics, compile and match limits, time limit, stop ");
}
