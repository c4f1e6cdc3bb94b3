/*  log.h - kvpoold's log: levels, one line per event with a timestamp and the actor's name,
    to stderr or to syslog, and a rate limit per call site.

        kvp_log_setup (KVP_LOG_INFO, false, "kvpoold");   //  once, before the actors start
        kvp_warning ("disk tier: cannot write %s: %s", path, strerror (errno));
        kvp_debug ("api: request %llu %s", id, name);      //  only at --log-level debug

    A line reads `2026-11-23 12:43:40.123 W api: cannot write ...`: the time (local, with
    milliseconds), the level's letter (E, W, I, D), the thread's name without its `kvp-`
    prefix (every actor names its thread), then the message. With syslog the time and the
    name go to syslog's own fields (ident kvpoold, facility daemon).

    Nothing is logged per request at the default level (info): requests are debug. A call
    site writes at most KVP_LOG_BURST lines a second; what it would have written beyond that
    is counted and said in its next line ("... (N more suppressed)"), so a flood of bad
    requests cannot flood the log.

    Threads: any; a line is written whole (one mutex around the formatting and the write).
*/
#ifndef KVP_LOG_H_INCLUDED
#define KVP_LOG_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { KVP_LOG_ERROR = 0, KVP_LOG_WARNING, KVP_LOG_INFO, KVP_LOG_DEBUG } kvp_log_level_t;

//  Lines one call site may write in one second.
#define KVP_LOG_BURST 10

//  A call site's rate limit (kvp_log's macros keep one each).
typedef struct {
    int64_t window;      //  the second its count is for
    uint32_t written;    //  lines written in that second
    uint64_t suppressed; //  lines not written since the last one that was
} kvp_log_limit_t;

//  Where lines go and from which level on. Until it is called: info and up, to stderr.
void kvp_log_setup (kvp_log_level_t level, bool use_syslog, const char *ident);

//  The level a name names (error, warning, info, debug). Returns 0 or -1.
int kvp_log_level_parse (const char *name, kvp_log_level_t *level);

//  Whether lines of level are written.
bool kvp_log_enabled (kvp_log_level_t level);

//  Writes one line (the macros below call it); limit NULL: no rate limit.
void kvp_log_write (kvp_log_level_t level, kvp_log_limit_t *limit, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));

#define kvp_log(level, ...)                                                                        \
    do {                                                                                           \
        static kvp_log_limit_t kvp_log_limit_;                                                     \
        if (kvp_log_enabled (level))                                                               \
            kvp_log_write (level, &kvp_log_limit_, __VA_ARGS__);                                   \
    } while (0)
//  Key tracing (--trace-keys REGEX): every step of the keys the POSIX extended regex
//  matches (placed, committed, written, confirmed, read, removed, reported, dropped, cached)
//  is logged at info, without the rate limit: to follow a key through the cluster's
//  daemons from their logs. Set once, before the actors start (NULL or "": none). Returns
//  0, or -1 with why when the pattern is not a regex.
int kvp_trace_setup (const char *pattern, char *why, size_t why_size);
//  Whether key is traced (false at once when nothing is).
bool kvp_trace_key (const char *key);
#define kvp_trace(key, ...)                                                                        \
    do {                                                                                           \
        if (kvp_trace_key (key))                                                                   \
            kvp_log_write (KVP_LOG_INFO, NULL, __VA_ARGS__);                                       \
    } while (0)

#define kvp_error(...) kvp_log (KVP_LOG_ERROR, __VA_ARGS__)
#define kvp_warning(...) kvp_log (KVP_LOG_WARNING, __VA_ARGS__)
#define kvp_info(...) kvp_log (KVP_LOG_INFO, __VA_ARGS__)
#define kvp_debug(...) kvp_log (KVP_LOG_DEBUG, __VA_ARGS__)

void kvp_log_test (bool verbose);

#endif
