/*  spin_poll.c - see spin_poll.h. */
#include "actors/spin_poll.h"

#include <time.h>

#define SPIN_CHECK_NS 2000

static int64_t
s_now_ns (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

zsock_t *
spin_poll (wait_set_t *set, int spin_us)
{
    int64_t deadline = s_now_ns () + (int64_t) spin_us * 1000;
    do {
        zsock_t *ready = wait_set_wait (set, 0);
        if (ready)
            return ready;
        //  Each check is a system call (a poll of the sockets' descriptors), and system
        //  calls are dear on a virtual machine: look again only every couple of microseconds.
        int64_t next = s_now_ns () + SPIN_CHECK_NS;
        while (s_now_ns () < next) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause ();
#endif
        }
    } while (s_now_ns () < deadline);
    return NULL;
}
