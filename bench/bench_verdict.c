/*  bench_verdict.c - what each section of kvpool-bench comes to, in a line (bench.h).

    A section says where kvpool leads and where it trails, and against what, with
    bench_verdict; kvpool-bench prints every verdict first, above the tables they come from
    (its main keeps the detail aside until the sections are done). A goal is a figure one of
    kvpool's own issues set for it: bench_goal prints it as met or not met, never as a
    failure of the run. A ratio reads as what it means: "1.42x (faster)", "0.89x (slower)".

    The detail: between bench_detail_begin and bench_detail_end the bench's standard output
    goes to a temporary file (progress goes to standard error, as before); the end prints
    the verdicts and then the detail. A signal that stops the bench gives the detail back
    with async-signal-safe calls only (bench_detail_abort, from bench_on_signal).

    Threads: the bench's main thread only.
*/
#include "bench/bench.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_VERDICTS 32

static char s_verdicts[S_VERDICTS][512];
static size_t s_count;

void
bench_verdict (const char *section, const char *format, ...)
{
    if (s_count == S_VERDICTS)
        return;
    char text[448];
    va_list args;
    va_start (args, format);
    vsnprintf (text, sizeof text, format, args);
    va_end (args);
    snprintf (s_verdicts[s_count++], sizeof s_verdicts[0], "%-9s %s", section, text);
}

void
bench_goal (bool met, const char *format, ...)
{
    char text[480];
    va_list args;
    va_start (args, format);
    vsnprintf (text, sizeof text, format, args);
    va_end (args);
    printf ("goal %s: %s\n", met ? "met" : "not met", text);
}

const char *
bench_ratio (double ratio, char *buffer, size_t size)
{
    if (isnan (ratio) || isinf (ratio))
        snprintf (buffer, size, "n/a");
    else
        snprintf (buffer, size, "%.2fx (%s)", ratio,
                  ratio >= 1.02   ? "faster"
                  : ratio <= 0.98 ? "slower"
                                  : "even");
    return buffer;
}

size_t
bench_verdicts_print (FILE *out)
{
    if (s_count == 0)
        return 0;
    fprintf (out, "== verdict: one line a section (the tables below have every figure) ==\n");
    for (size_t i = 0; i < s_count; i++)
        fprintf (out, "%s\n", s_verdicts[i]);
    return s_count;
}

//  ---- the detail, kept aside ---------------------------------------------------------------

static int s_saved = -1;  //  the real standard output while the detail is kept aside
static int s_detail = -1; //  the temporary file holding it

int
bench_detail_begin (void)
{
    fflush (stdout);
    FILE *file = tmpfile ();
    int detail = file ? dup (fileno (file)) : -1;
    if (file)
        fclose (file); //  unlinked already; the duplicate keeps it
    int saved = detail >= 0 ? dup (STDOUT_FILENO) : -1;
    if (detail < 0 || saved < 0 || dup2 (detail, STDOUT_FILENO) < 0) {
        if (detail >= 0)
            close (detail);
        if (saved >= 0)
            close (saved);
        return -1; //  the detail then goes out as it comes, the verdicts at the end
    }
    s_detail = detail;
    s_saved = saved;
    return 0;
}

//  Copies the detail to the real standard output (async-signal-safe).
static void
s_detail_copy (void)
{
    char buffer[65536];
    off_t at = 0;
    for (;;) {
        ssize_t got = pread (s_detail, buffer, sizeof buffer, at);
        if (got <= 0)
            break;
        for (ssize_t done = 0; done < got;) {
            ssize_t put = write (STDOUT_FILENO, buffer + done, (size_t) (got - done));
            if (put <= 0)
                return;
            done += put;
        }
        at += got;
    }
}

void
bench_detail_end (void)
{
    fflush (stdout);
    if (s_saved < 0) {
        bench_verdicts_print (stdout);
        return;
    }
    dup2 (s_saved, STDOUT_FILENO);
    close (s_saved);
    s_saved = -1;
    if (bench_verdicts_print (stdout))
        printf ("\n");
    fflush (stdout);
    s_detail_copy ();
    close (s_detail);
    s_detail = -1;
}

void
bench_detail_abort (void)
{
    if (s_saved < 0)
        return;
    dup2 (s_saved, STDOUT_FILENO);
    s_saved = -1;
    s_detail_copy ();
}
