/*  ready_file.c - reads kvpoold's ready file (see ready_file.h). */
#include "infra/ready_file.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

//  Copies a value, cut to the field; a field already set keeps the first value.
static void
s_keep_first (char *field, size_t size, const char *value)
{
    if (!field[0])
        snprintf (field, size, "%s", value);
}

int
ready_file_read (const char *path, ready_file_t *ready)
{
    memset (ready, 0, sizeof *ready);
    FILE *file = fopen (path, "r");
    if (!file)
        return -1;
    char line[512];
    while (fgets (line, sizeof line, file)) {
        line[strcspn (line, "\r\n")] = 0;
        char *eq = strchr (line, '=');
        if (!eq)
            continue;
        *eq = 0;
        const char *name = line, *value = eq + 1;
        if (!strcmp (name, "endpoint") && !strncmp (value, "tcp://", 6))
            s_keep_first (ready->endpoint, sizeof ready->endpoint, value);
        else if (!strcmp (name, "endpoint") && !strncmp (value, "ipc://", 6))
            s_keep_first (ready->ipc_endpoint, sizeof ready->ipc_endpoint, value);
        else if (!strcmp (name, "admin"))
            s_keep_first (ready->admin_endpoint, sizeof ready->admin_endpoint, value);
        else if (!strcmp (name, "pid"))
            ready->pid = (pid_t) atoi (value);
    }
    fclose (file);
    return ready->endpoint[0] ? 0 : -1;
}

static int64_t
s_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int
ready_file_wait (const char *path, pid_t child, int timeout_ms, ready_file_t *ready)
{
    int64_t deadline = s_now_ms () + timeout_ms;
    while (s_now_ms () < deadline) {
        int status;
        if (waitpid (child, &status, WNOHANG) == child)
            return -2;
        if (ready_file_read (path, ready) == 0)
            return 0;
        usleep (10000);
    }
    return -1;
}
