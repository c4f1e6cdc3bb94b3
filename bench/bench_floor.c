/*  bench_floor.c - the loopback floor: what ZeroMQ costs before kvpool does any work of its
    own.

    A child process runs a bare ROUTER that echoes every message of one frame and answers a
    message of several frames with a small acknowledgement; this process sends from a DEALER
    and waits for the answer, over tcp on loopback. Each side has its libzmq I/O thread, so
    the round trip crosses the same four thread hand-offs and two TCP hops as a request to
    kvpoold.
      - the echo of one 4 KiB message, as a kvpool client's GET would: what a kvpool 4 KiB
        get or put costs beyond it is kvpool's own share;
      - the transfer of a batch (32 frames of 64 KiB, acknowledged), as a kvpool client's
        batched PUT would send it: what moving those bytes over loopback costs at least.
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

//  The child: echoes [routing id][body], answers [routing id][frame]... (several) with
//  [routing id]["ok"], until it is killed.
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
        bool batch = zmq_msg_more (&body);
        while (zmq_msg_more (&body) && zmq_msg_recv (&body, router, 0) >= 0)
            ;
        zmq_msg_send (&id, router, ZMQ_SNDMORE);
        if (batch)
            zmq_send (router, "ok", 2, 0);
        else
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

//  Sends frames x size as one message from a DEALER to the echo child on port, waiting for
//  each answer, for reps runs of rep_seconds. Returns the p50 in us, or -1.
static double
s_floor_run (int port, size_t frames, size_t size, int reps, double rep_seconds)
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
    char *message = calloc (1, size), *back = malloc (size);
    size_t capacity = 1 << 16, count = 0;
    double *samples = malloc (capacity * sizeof *samples);
    double p50 = -1;
    //  One round trip: the echo of a single frame, or the acknowledgement of a batch.
    int answer = frames == 1 ? (int) size : 2;
    //  The first round trip also waits for the child to bind (the DEALER reconnects).
    bool up = false;
    for (int tries = 0; tries < 20 && !up; tries++) {
        up = true;
        for (size_t f = 0; up && f < frames; f++)
            up = zmq_send (dealer, message, size, f + 1 < frames ? ZMQ_SNDMORE : 0) == (int) size;
        up = up && zmq_recv (dealer, back, size, 0) == answer;
    }
    for (int rep = 0; up && rep < reps; rep++) {
        double start = s_now (), now = start;
        while (now - start < rep_seconds) {
            double before = now;
            for (size_t f = 0; up && f < frames; f++)
                up = zmq_send (dealer, message, size, f + 1 < frames ? ZMQ_SNDMORE : 0)
                     == (int) size;
            if (!up || zmq_recv (dealer, back, size, 0) != answer) {
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

double
bench_floor_p50_us (int port, int reps, double rep_seconds)
{
    return s_floor_run (port, 1, FLOOR_MESSAGE, reps, rep_seconds);
}

double
bench_floor_batch_p50_us (int port, size_t frames, size_t size, int reps, double rep_seconds)
{
    return frames >= 2 ? s_floor_run (port, frames, size, reps, rep_seconds) : -1;
}
