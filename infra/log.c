/*  log.c - kvpoold's log (log.h). */
#include "infra/log.h"

#include <assert.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <syslog.h>
#include <time.h>

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int s_level = KVP_LOG_INFO;
static bool s_syslog;
static FILE *s_out; //  NULL: stderr (tests point it elsewhere)
//  --trace-keys: set once before the actors start, read by every thread after.
static regex_t s_trace;
static bool s_tracing;

void
kvp_log_setup (kvp_log_level_t level, bool use_syslog, const char *ident)
{
    pthread_mutex_lock (&s_lock);
    atomic_store (&s_level, (int) level);
    if (use_syslog && !s_syslog)
        openlog (ident ? ident : "kvpoold", LOG_PID | LOG_NDELAY, LOG_DAEMON);
    else if (!use_syslog && s_syslog)
        closelog ();
    s_syslog = use_syslog;
    pthread_mutex_unlock (&s_lock);
}

int
kvp_log_level_parse (const char *name, kvp_log_level_t *level)
{
    static const char *names[] = {"error", "warning", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (name && !strcmp (name, names[i])) {
            *level = (kvp_log_level_t) i;
            return 0;
        }
    return -1;
}

bool
kvp_log_enabled (kvp_log_level_t level)
{
    return (int) level <= atomic_load_explicit (&s_level, memory_order_relaxed);
}

//  Whether a line from the call site of this limit may be written in this second (the caller
//  holds s_lock). Returns false for a line to leave out; otherwise *suppressed is how many
//  were left out since the last one written.
static bool
s_limit_pass (kvp_log_limit_t *limit, time_t second, uint64_t *suppressed)
{
    if (limit->window != second) {
        limit->window = second;
        limit->written = 0;
    }
    if (limit->written >= KVP_LOG_BURST) {
        limit->suppressed++;
        return false;
    }
    limit->written++;
    *suppressed = limit->suppressed;
    limit->suppressed = 0;
    return true;
}

void
kvp_log_write (kvp_log_level_t level, kvp_log_limit_t *limit, const char *format, ...)
{
    struct timeval now;
    gettimeofday (&now, NULL);
    char thread[32] = "";
    if (pthread_getname_np (pthread_self (), thread, sizeof thread) != 0)
        snprintf (thread, sizeof thread, "kvpoold");
    const char *name = strncmp (thread, "kvp-", 4) ? thread : thread + 4;
    pthread_mutex_lock (&s_lock);
    uint64_t suppressed = 0;
    if (limit && !s_limit_pass (limit, now.tv_sec, &suppressed)) {
        pthread_mutex_unlock (&s_lock);
        return;
    }
    char note[64] = "";
    if (suppressed)
        snprintf (note, sizeof note, " (%llu more suppressed)", (unsigned long long) suppressed);
    //  Formatted only once it is known to be written: a flood costs a counter, not a printf.
    char message[2048];
    va_list args;
    va_start (args, format);
    vsnprintf (message, sizeof message, format, args);
    va_end (args);
    static const char letters[] = "EWID";
    if (s_syslog) {
        static const int priorities[] = {LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG};
        syslog (priorities[level], "%s: %s%s", name, message, note);
    }
    else {
        struct tm local;
        localtime_r (&now.tv_sec, &local);
        char stamp[32];
        strftime (stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
        FILE *out = s_out ? s_out : stderr;
        fprintf (out, "%s.%03ld %c %s: %s%s\n", stamp, (long) (now.tv_usec / 1000), letters[level],
                 name, message, note);
        fflush (out);
    }
    pthread_mutex_unlock (&s_lock);
}

int
kvp_trace_setup (const char *pattern, char *why, size_t why_size)
{
    if (s_tracing) {
        regfree (&s_trace);
        s_tracing = false;
    }
    if (!pattern || !*pattern)
        return 0;
    int rc = regcomp (&s_trace, pattern, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char error[200];
        regerror (rc, &s_trace, error, sizeof error);
        snprintf (why, why_size, "'%s' is not a POSIX extended regex: %s", pattern, error);
        return -1;
    }
    s_tracing = true;
    return 0;
}

bool
kvp_trace_key (const char *key)
{
    return s_tracing && key && regexec (&s_trace, key, 0, NULL, 0) == 0;
}

//  ---- self test -----------------------------------------------------------------------------

void
kvp_log_test (bool verbose)
{
    (void) verbose;
    kvp_log_level_t level;
    assert (kvp_log_level_parse ("debug", &level) == 0 && level == KVP_LOG_DEBUG);
    assert (kvp_log_level_parse ("loud", &level) == -1);
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream (&text, &size);
    assert (out);
    s_out = out;
    kvp_log_setup (KVP_LOG_WARNING, false, NULL);
    assert (!kvp_log_enabled (KVP_LOG_INFO) && kvp_log_enabled (KVP_LOG_ERROR));
    kvp_info ("not written");
    //  The limiter on a clock of its own: a burst a second, then the count of those left out.
    kvp_log_limit_t limit = {0};
    uint64_t suppressed = 99;
    int passed = 0;
    for (int i = 0; i < 1000; i++)
        passed += s_limit_pass (&limit, 7, &suppressed);
    assert (passed == KVP_LOG_BURST && suppressed == 0);
    assert (s_limit_pass (&limit, 8, &suppressed) && suppressed == 1000 - KVP_LOG_BURST);
    assert (s_limit_pass (&limit, 8, &suppressed) && suppressed == 0);
    assert (s_limit_pass (&limit, 9, &suppressed) && suppressed == 0);

    pthread_setname_np (pthread_self (), "kvp-logtest");
    //  A flood from one call site: KVP_LOG_BURST lines in a second, then silence; the next
    //  line a second later says how many were left out.
    for (int i = 0; i <= 1000; i++) {
        if (i == 1000) {
            struct timespec pause = {1, 50 * 1000 * 1000};
            nanosleep (&pause, NULL);
        }
        kvp_warning ("flood %d", i);
    }
    kvp_error ("another site");
    fclose (out);
    s_out = NULL;
    kvp_log_setup (KVP_LOG_INFO, false, NULL);
    size_t lines = 0;
    for (char *c = text; *c; c++)
        lines += *c == '\n';
    //  The flood may span second boundaries (a slow sanitizer build): a burst got through in
    //  each second it spanned, far fewer than the thousand lines asked for.
    assert (lines >= KVP_LOG_BURST + 2 && lines < 1000 / 4);
    assert (!strstr (text, "not written"));
    assert (strstr (text, " W logtest: flood 0\n"));
    //  (The line that says how many were left out is the first of a second: flood 1000 here,
    //  unless a second began within the flood's last lines.)
    assert (strstr (text, "flood 1000"));
    assert (strstr (text, "more suppressed)\n"));
    assert (strstr (text, " E logtest: another site\n"));
    free (text);
}
