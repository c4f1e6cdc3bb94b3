/*  testutil.h - helpers for integration tests: start the real kvpoold on loopback, stop it,
    and a tiny check macro that reports file:line and exits non-zero.

    The daemon is the binary in $KVPOOL_BIN (set by tests/run.sh) or build/bin. It binds
    tcp://127.0.0.1:* (an ephemeral port) and writes the endpoints it got into a ready file,
    which testutil_server_start waits for and reads (infra/ready_file.h).
*/
#ifndef TESTUTIL_H_INCLUDED
#define TESTUTIL_H_INCLUDED

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    char endpoint[256];       //  client endpoint, tcp://127.0.0.1:PORT
    char ipc_endpoint[256];   //  client endpoint over ipc (empty if none)
    char admin_endpoint[256]; //  lookup/reset admin endpoint (empty if none)
    char ready_file[256];
} testutil_server_t;

//  Starts kvpoold with the given extra arguments (NULL-terminated list, may be empty) plus
//  --endpoint tcp://127.0.0.1:* --admin tcp://127.0.0.1:* --ready-file. Returns 0 when the
//  daemon is ready (within 10 s), -1 otherwise.
int testutil_server_start (testutil_server_t *server, const char *const *args);

//  Sends signal (SIGTERM usually), waits up to 10 s; returns the exit status (0..255),
//  128+signal if killed by a signal, or -1 if it did not stop (then it is killed).
int testutil_server_stop (testutil_server_t *server, int signal);

//  Path of a program in the build's bin directory.
const char *testutil_bin (const char *program);

//  Runs this test program (argv0) again in a process of its own with args (NULL-terminated):
//  a worker is a fresh exec, since a ZeroMQ context does not survive fork. Returns its pid,
//  or -1 if it could not fork.
pid_t testutil_spawn (const char *argv0, const char *const *args);
//  Waits for count processes testutil_spawn started; returns how many did not exit 0.
int testutil_wait_all (const pid_t *pids, size_t count);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf (stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);              \
            exit (1);                                                                              \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long _a = (long long) (a), _b = (long long) (b);                                      \
        if (_a != _b) {                                                                            \
            fprintf (stderr, "%s:%d: check failed: %s == %s (%lld != %lld)\n", __FILE__, __LINE__, \
                     #a, #b, _a, _b);                                                              \
            exit (1);                                                                              \
        }                                                                                          \
    } while (0)

#endif
