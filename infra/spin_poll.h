/*  spin_poll.h - a short busy wait on sockets before an actor goes to sleep in poll.

    A hop between actors costs a thread wake-up when the receiving thread sleeps in poll; on
    a virtual machine that is tens of microseconds, more than the work of a whole request.
    An actor that expects a message soon (a reply to a job it sent, or the next request of a
    burst) checks its sockets for a few microseconds first. The wait is bounded and short so
    an idle daemon costs nothing.

    An actor that serves a stream of jobs (the replica-manager) keeps polling for a while
    after each one instead (spin_window_t): a job that comes in that time costs no wake-up.
    The window adapts, as the kernel's haltpoll governor does for idle virtual CPUs: a spin
    that catches a job keeps it, one that ends with nothing halves it, and a job that comes
    soon after one the actor slept for opens it again. Jobs far apart therefore soon cost
    no spinning at all; a burst of them has the window open. The spin gives the core to any
    thread that wants it between checks (sched_yield), so it delays no other thread that
    the scheduler places on the same core.

    Threads: called by the actor that owns the sockets.
*/
#ifndef SPIN_POLL_H_INCLUDED
#define SPIN_POLL_H_INCLUDED

#include <czmq.h>

#include "infra/wait_set.h"

//  Returns a socket of the set with a message waiting, checking for up to spin_us
//  microseconds, or NULL if none became readable in that time.
zsock_t *spin_poll (wait_set_t *set, int spin_us);

typedef struct {
    int ceiling_us; //  the longest spin; 0: never spin
    int window_us;  //  the next spin's length
} spin_window_t;

void spin_window_init (spin_window_t *self, int ceiling_us);

//  Waits for a socket of the set to be readable, up to timeout_ms (-1: forever; 0: one look,
//  the window untouched): first spinning for the window (yielding the core between checks),
//  then sleeping in wait_set_wait. Returns the socket, or NULL when the time ran out.
//  Adapts the window.
zsock_t *spin_window_wait (spin_window_t *self, wait_set_t *set, int timeout_ms);

void spin_poll_test (bool verbose);

#endif
