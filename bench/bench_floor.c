/*  bench_floor.c - the loopback floor: what one ZeroMQ round trip costs before kvpool does
    any work of its own.

    A child process runs a bare ROUTER that echoes every message; this process sends a
    4 KiB message from a DEALER and waits for it to come back, as a kvpool client's GET
    would, over tcp on loopback. Each side has its libzmq I/O thread, so the round trip
    crosses the same four thread hand-offs and two TCP hops as a request to kvpoold; what a
    kvpool 4 KiB get costs beyond this is kvpool's own share.
*/
#include "bench/bench.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define FLOOR_MESSAGE 4096
#define FLOOR_TIMEOUT_MS 2000

static double
s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int
s_compare (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

//  The child: echoes [routing id][body] until it is killed.
static void
s_echo (const char *endpoint)
{
    void *ctx = zmq_ctx_new ();
    void *router = zmq_socket (ctx, ZMQ_ROUTER);
    if (!router || zmq_bind (router, endpoint) != 0)
        _exit (1);
    zmq_msg_t id, body;
    zmq_msg_init (&id);
    zmq_msg_init (&body);
    while (zmq_msg_recv (&id, router, 0) >= 0 && zmq_msg_recv (&body, router, 0) >= 0) {
        zmq_msg_send (&id, router, ZMQ_SNDMORE);
        zmq_msg_send (&body, router, 0);
    }
    _exit (0);
}

pid_t
bench_echo_start (int port)
{
    char endpoint[64];
    snprintf (endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    pid_t child = fork ();
    if (child == 0) {
        prctl (PR_SET_PDEATHSIG, SIGKILL);
        s_echo (endpoint);
    }
    return child;
}

double
bench_floor_p50_us (int port, int reps, double rep_seconds)
{
    char endpoint[64];
    snprintf (endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    pid_t child = bench_echo_start (port);
    if (child < 0)
        return -1;
    void *ctx = zmq_ctx_new ();
    void *dealer = zmq_socket (ctx, ZMQ_DEALER);
    int timeout = FLOOR_TIMEOUT_MS, linger = 0;
    zmq_setsockopt (dealer, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt (dealer, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect (dealer, endpoint);
    char *message = calloc (1, FLOOR_MESSAGE), *back = malloc (FLOOR_MESSAGE);
    size_t capacity = 1 << 16, count = 0;
    double *samples = malloc (capacity * sizeof *samples);
    double p50 = -1;
    //  The first echo also waits for the child to bind (the DEALER reconnects until then).
    bool up = false;
    for (int tries = 0; tries < 20 && !up; tries++)
        up = zmq_send (dealer, message, FLOOR_MESSAGE, 0) == FLOOR_MESSAGE
             && zmq_recv (dealer, back, FLOOR_MESSAGE, 0) == FLOOR_MESSAGE;
    for (int rep = 0; up && rep < reps; rep++) {
        double start = s_now (), now = start;
        while (now - start < rep_seconds) {
            double before = now;
            if (zmq_send (dealer, message, FLOOR_MESSAGE, 0) != FLOOR_MESSAGE
                || zmq_recv (dealer, back, FLOOR_MESSAGE, 0) != FLOOR_MESSAGE) {
                up = false;
                break;
            }
            now = s_now ();
            if (count == capacity) {
                double *more = realloc (samples, 2 * capacity * sizeof *samples);
                if (!more)
                    break;
                samples = more;
                capacity *= 2;
            }
            samples[count++] = (now - before) * 1e6;
        }
    }
    if (up && count) {
        qsort (samples, count, sizeof *samples, s_compare);
        p50 = samples[count / 2];
    }
    free (samples);
    free (message);
    free (back);
    zmq_close (dealer);
    zmq_ctx_term (ctx);
    kill (child, SIGKILL);
    waitpid (child, NULL, 0);
    return p50;
}
