/*  wait_set.c - see wait_set.h. */
#include "infra/wait_set.h"

#include <poll.h>

#define WAIT_SET_MAX 16

struct _wait_set_t {
    size_t count;
    zsock_t *socks[WAIT_SET_MAX];
    struct pollfd fds[WAIT_SET_MAX];
    bool dirty[WAIT_SET_MAX]; //  its events must be asked before the next sleep
    bool ready[WAIT_SET_MAX]; //  it said ZMQ_POLLIN when last asked
    size_t next;              //  where the next turn starts
};

wait_set_t *
wait_set_new (void)
{
    return (wait_set_t *) zmalloc (sizeof (wait_set_t));
}

void
wait_set_destroy (wait_set_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free (*self_p);
    *self_p = NULL;
}

static int
s_find (wait_set_t *self, zsock_t *sock)
{
    for (size_t i = 0; i < self->count; i++)
        if (self->socks[i] == sock)
            return (int) i;
    return -1;
}

void
wait_set_add (wait_set_t *self, zsock_t *sock)
{
    assert (self->count < WAIT_SET_MAX && s_find (self, sock) == -1);
    size_t i = self->count++;
    self->socks[i] = sock;
    self->fds[i].fd = zsock_fd (sock);
    self->fds[i].events = POLLIN;
    self->dirty[i] = true;
    self->ready[i] = false;
}

void
wait_set_remove (wait_set_t *self, zsock_t *sock)
{
    int at = s_find (self, sock);
    if (at == -1)
        return;
    for (size_t i = (size_t) at; i + 1 < self->count; i++) {
        self->socks[i] = self->socks[i + 1];
        self->fds[i] = self->fds[i + 1];
        self->dirty[i] = self->dirty[i + 1];
        self->ready[i] = self->ready[i + 1];
    }
    self->count--;
    self->next = 0;
}

void
wait_set_touch (wait_set_t *self, zsock_t *sock)
{
    int at = s_find (self, sock);
    if (at != -1)
        self->dirty[at] = true;
}

//  Asks the dirty sockets for their events; returns a ready one, in turn, or NULL.
static zsock_t *
s_take_ready (wait_set_t *self)
{
    for (size_t i = 0; i < self->count; i++)
        if (self->dirty[i]) {
            self->ready[i] = (zsock_events (self->socks[i]) & ZMQ_POLLIN) != 0;
            self->dirty[i] = false;
        }
    for (size_t k = 0; k < self->count; k++) {
        size_t i = (self->next + k) % self->count;
        if (self->ready[i]) {
            //  The caller receives from it: its events change.
            self->ready[i] = false;
            self->dirty[i] = true;
            self->next = (i + 1) % self->count;
            return self->socks[i];
        }
    }
    return NULL;
}

zsock_t *
wait_set_wait (wait_set_t *self, int timeout_ms)
{
    int64_t deadline = timeout_ms > 0 ? zclock_mono () + timeout_ms : 0;
    while (true) {
        zsock_t *ready = s_take_ready (self);
        if (ready)
            return ready;
        int wait = timeout_ms;
        if (timeout_ms > 0) {
            int64_t left = deadline - zclock_mono ();
            wait = left > 0 ? (int) left : 0;
        }
        int rc = poll (self->fds, self->count, wait);
        if (rc == -1 && errno != EINTR)
            return NULL;
        for (size_t i = 0; rc > 0 && i < self->count; i++)
            if (self->fds[i].revents)
                self->dirty[i] = true;
        if (rc == 0 && wait >= 0 && (timeout_ms == 0 || zclock_mono () >= deadline))
            return NULL;
    }
}

//  ---- self test ---------------------------------------------------------------------

void
wait_set_test (bool verbose)
{
    zsock_t *a_in = zsock_new_pull ("inproc://wait-set-a");
    zsock_t *b_in = zsock_new_pull ("inproc://wait-set-b");
    zsock_t *a_out = zsock_new_push ("inproc://wait-set-a");
    zsock_t *b_out = zsock_new_push ("inproc://wait-set-b");
    assert (a_in && b_in && a_out && b_out);
    wait_set_t *set = wait_set_new ();
    wait_set_add (set, a_in);
    wait_set_add (set, b_in);

    //  Nothing waiting: a wait ends at its timeout.
    int64_t start = zclock_mono ();
    assert (wait_set_wait (set, 0) == NULL);
    assert (wait_set_wait (set, 30) == NULL);
    assert (zclock_mono () - start >= 25);

    //  Messages are found, several on one socket one by one, and two ready sockets in turn.
    zstr_send (a_out, "a1");
    zstr_send (a_out, "a2");
    zstr_send (b_out, "b1");
    zclock_sleep (10);
    int from_a = 0, from_b = 0;
    for (int i = 0; i < 3; i++) {
        zsock_t *which = wait_set_wait (set, 1000);
        assert (which == a_in || which == b_in);
        char *text = zstr_recv (which);
        assert (text);
        from_a += which == a_in;
        from_b += which == b_in;
        zstr_free (&text);
    }
    assert (from_a == 2 && from_b == 1);
    assert (wait_set_wait (set, 0) == NULL);

    //  A message sent while the set sleeps wakes it.
    zstr_send (b_out, "later");
    zsock_t *which = wait_set_wait (set, 1000);
    assert (which == b_in);
    char *text = zstr_recv (which);
    assert (text && streq (text, "later"));
    zstr_free (&text);

    //  A removed socket is not waited on.
    wait_set_remove (set, a_in);
    zstr_send (a_out, "ignored");
    assert (wait_set_wait (set, 20) == NULL);
    wait_set_touch (set, a_in); //  not in the set: nothing happens
    wait_set_destroy (&set);
    zsock_destroy (&a_out);
    zsock_destroy (&b_out);
    zsock_destroy (&a_in);
    zsock_destroy (&b_in);
    if (verbose)
        printf ("dirty sockets asked, ready ones in turn, timeouts ");
}
