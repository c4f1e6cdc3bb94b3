/*  testutil.c - start and stop the real kvpoold for integration tests (see testutil.h). */
#include "tests/testutil.h"

#include "infra/ready_file.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *
testutil_bin (const char *program)
{
    static char path[4][512];
    static int next;
    char *buf = path[next++ % 4];
    const char *dir = getenv ("KVPOOL_BIN");
    snprintf (buf, 512, "%s/%s", dir ? dir : "build/bin", program);
    return buf;
}

pid_t
testutil_spawn (const char *argv0, const char *const *args)
{
    const char *argv[16];
    size_t argc = 0;
    argv[argc++] = argv0;
    while (args && *args && argc < 15)
        argv[argc++] = *args++;
    argv[argc] = NULL;
    pid_t pid = fork ();
    if (pid == 0) {
        execv (argv0, (char *const *) argv);
        _exit (127);
    }
    return pid;
}

int
testutil_wait_all (const pid_t *pids, size_t count)
{
    int failures = 0;
    for (size_t i = 0; i < count; i++) {
        int status = 0;
        failures += waitpid (pids[i], &status, 0) != pids[i] || !WIFEXITED (status)
                    || WEXITSTATUS (status) != 0;
    }
    return failures;
}

static int64_t
s_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int
testutil_server_start (testutil_server_t *server, const char *const *args)
{
    memset (server, 0, sizeof *server);
    snprintf (server->ready_file, sizeof server->ready_file, "/tmp/kvpool-test-%d-%ld.ready",
              (int) getpid (), (long) s_now_ms ());
    unlink (server->ready_file);
    const char *argv[64];
    int argc = 0;
    argv[argc++] = testutil_bin ("kvpoold");
    argv[argc++] = "--endpoint";
    argv[argc++] = "tcp://127.0.0.1:*";
    argv[argc++] = "--admin";
    argv[argc++] = "tcp://127.0.0.1:*";
    argv[argc++] = "--ready-file";
    argv[argc++] = server->ready_file;
    argv[argc++] = "--metrics-port"; //  no HTTP unless a test asks (its args come after)
    argv[argc++] = "0";
    for (int i = 0; args && args[i] && argc < 63; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;

    pid_t pid = fork ();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execv (argv[0], (char *const *) argv);
        fprintf (stderr, "exec %s: %s\n", argv[0], strerror (errno));
        _exit (127);
    }
    server->pid = pid;
    ready_file_t ready;
    int rc = ready_file_wait (server->ready_file, pid, 10000, &ready);
    if (rc == 0) {
        snprintf (server->endpoint, sizeof server->endpoint, "%s", ready.endpoint);
        snprintf (server->ipc_endpoint, sizeof server->ipc_endpoint, "%s", ready.ipc_endpoint);
        snprintf (server->admin_endpoint, sizeof server->admin_endpoint, "%s",
                  ready.admin_endpoint);
        return 0;
    }
    if (rc == -2) {
        fprintf (stderr, "kvpoold exited before it was ready\n");
        server->pid = 0;
        return -1;
    }
    fprintf (stderr, "kvpoold not ready within 10 s\n");
    testutil_server_stop (server, SIGKILL);
    return -1;
}

int
testutil_server_stop (testutil_server_t *server, int signal)
{
    if (server->pid <= 0)
        return -1;
    kill (server->pid, signal);
    int64_t deadline = s_now_ms () + 10000;
    int status = 0;
    int result = -1;
    while (s_now_ms () < deadline) {
        pid_t done = waitpid (server->pid, &status, WNOHANG);
        if (done == server->pid) {
            result = WIFEXITED (status) ? WEXITSTATUS (status) : 128 + WTERMSIG (status);
            break;
        }
        usleep (10000);
    }
    if (result == -1) {
        kill (server->pid, SIGKILL);
        waitpid (server->pid, &status, 0);
    }
    unlink (server->ready_file);
    server->pid = 0;
    return result;
}
