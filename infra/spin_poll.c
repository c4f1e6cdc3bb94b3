/*  spin_poll.c - see spin_poll.h. */
#include "infra/spin_poll.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#define SPIN_CHECK_NS 2000
//  A window halved below this is closed.
#define SPIN_WINDOW_MIN_US 10

static int64_t
s_now_ns (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

//  Polls the set until deadline (CLOCK_MONOTONIC ns), every SPIN_CHECK_NS or, when
//  yielding, after each sched_yield.
static zsock_t *
s_spin_until (wait_set_t *set, int64_t deadline, bool yielding)
{
    do {
        zsock_t *ready = wait_set_wait (set, 0);
        if (ready)
            return ready;
        if (yielding) {
            sched_yield ();
            continue;
        }
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

zsock_t *
spin_poll (wait_set_t *set, int spin_us)
{
    return s_spin_until (set, s_now_ns () + (int64_t) spin_us * 1000, false);
}

void
spin_window_init (spin_window_t *self, int ceiling_us)
{
    assert (self);
    self->ceiling_us = ceiling_us > 0 ? ceiling_us : 0;
    self->window_us = self->ceiling_us;
}

zsock_t *
spin_window_wait (spin_window_t *self, wait_set_t *set, int timeout_ms)
{
    if (timeout_ms == 0)
        return wait_set_wait (set, 0); //  a look, not a wait: the window stays as it is
    int64_t start = s_now_ns ();
    if (self->window_us > 0) {
        int64_t spin_ns = (int64_t) self->window_us * 1000;
        bool cut = timeout_ms >= 0 && spin_ns > (int64_t) timeout_ms * 1000000;
        if (cut)
            spin_ns = (int64_t) timeout_ms * 1000000;
        zsock_t *ready = s_spin_until (set, start + spin_ns, true);
        if (ready)
            return ready;
        //  A whole window with nothing: the jobs come further apart now. (One cut short by
        //  the timeout says nothing of them.)
        if (!cut) {
            self->window_us /= 2;
            if (self->window_us < SPIN_WINDOW_MIN_US)
                self->window_us = 0;
        }
        if (timeout_ms >= 0) {
            timeout_ms -= (int) ((s_now_ns () - start) / 1000000);
            if (timeout_ms < 0)
                timeout_ms = 0;
        }
    }
    zsock_t *ready = wait_set_wait (set, timeout_ms);
    //  Slept for one that came within the ceiling: the next one may well come as soon.
    if (ready && s_now_ns () - start < (int64_t) self->ceiling_us * 1000)
        self->window_us = self->ceiling_us;
    return ready;
}

//  ---- self test -----------------------------------------------------------------------

static void *
s_send_late (void *arg)
{
    zclock_sleep (5); //  well past the 200 us ceiling
    zsock_t *out = zsock_new_push (">inproc://spin-poll-test");
    zstr_send (out, "late");
    zsock_destroy (&out);
    return arg;
}

void
spin_poll_test (bool verbose)
{
    printf (" * spin_poll: ");
    zsock_t *in = zsock_new_pull ("inproc://spin-poll-test");
    zsock_t *out = zsock_new_push (">inproc://spin-poll-test");
    assert (in && out);
    wait_set_t *set = wait_set_new ();
    wait_set_add (set, in);
    spin_window_t window;
    spin_window_init (&window, 200);
    assert (window.window_us == 200);

    //  Spins that catch nothing halve the window until it closes.
    int expected[] = {100, 50, 25, 12, 0, 0};
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        assert (spin_window_wait (&window, set, 1) == NULL);
        assert (window.window_us == expected[i]);
    }
    //  A message that comes soon after the actor went to sleep opens it again; one waiting
    //  when the actor looks keeps it open. (A wide ceiling: a slow machine, or a sanitizer,
    //  may take a while to return even a message that is there.)
    spin_window_t wide;
    spin_window_init (&wide, 10000);
    wide.window_us = 0;
    zstr_send (out, "soon");
    assert (spin_window_wait (&wide, set, 1000) == in);
    assert (wide.window_us == 10000);
    char *text = zstr_recv (in);
    assert (text && streq (text, "soon"));
    zstr_free (&text);
    zstr_send (out, "now");
    assert (spin_window_wait (&wide, set, 1000) == in);
    assert (wide.window_us == 10000);
    text = zstr_recv (in);
    zstr_free (&text);
    //  A spin cut short by the timeout leaves the window as it is.
    assert (spin_window_wait (&wide, set, 1) == NULL && wide.window_us == 10000);
    //  One that comes long after the actor slept leaves it closed.
    for (int i = 0; i < 5; i++)
        spin_window_wait (&window, set, 1);
    assert (window.window_us == 0);
    pthread_t late;
    int rc = pthread_create (&late, NULL, s_send_late, NULL);
    assert (rc == 0);
    assert (spin_window_wait (&window, set, 5000) == in);
    assert (window.window_us == 0);
    pthread_join (late, NULL);
    text = zstr_recv (in);
    assert (text && streq (text, "late"));
    zstr_free (&text);
    //  A look that may not wait leaves the window as it is.
    spin_window_init (&window, 200);
    assert (spin_window_wait (&window, set, 0) == NULL && window.window_us == 200);
    spin_window_t never;
    spin_window_init (&never, 0);
    assert (spin_window_wait (&never, set, 1) == NULL && never.window_us == 0);
    wait_set_destroy (&set);
    zsock_destroy (&out);
    zsock_destroy (&in);
    if (verbose)
        printf ("(window halves to closed, opens on a prompt job) ");
    printf ("OK\n");
}
