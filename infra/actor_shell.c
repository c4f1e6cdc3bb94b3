/*  actor_shell.c - the loop every actor runs (actor_shell.h).

    The readers are an array in the order they were added, the pipe first; it grows as
    readers are added (the cluster actor waits on a few links to every other node). Each
    reader has a serial number of its own. In zmq_poll mode a pass polls a snapshot of them
    (zmq_pollitem_t), then calls the handler of each one that was ready and is still there
    (the same serial: a socket destroyed by a handler and a new one that got its address, or
    a descriptor closed and another that got its number, is not the one that was polled),
    in order, unless the loop was stopped: so a handler that removes (and destroys) a socket
    never has it read again, and a reader added during a pass waits for the next. In
    wait-set mode the set returns one socket a wait.
*/
#include "infra/actor_shell.h"

#include <errno.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "infra/log.h"

//  The most sockets actor_shell_open makes for one actor.
#define OWNED_MAX 64

typedef struct {
    zsock_t *sock; //  NULL for a descriptor
    int fd;        //  -1 for a socket
    actor_shell_reader_fn *reader;
    actor_shell_fd_fn *fd_reader;
    uint64_t serial; //  this reader's, unique in the shell
    bool gone;       //  removed: skipped, then dropped before the next poll
} reader_t;

struct _actor_shell_t {
    zsock_t *pipe;
    char name[16];
    reader_t *readers;
    size_t count, capacity;
    uint64_t serials; //  the last reader's serial
    //  A zmq_poll pass's snapshot of the readers, and its poll items: grown before a pass
    //  only (a handler may add readers during one).
    reader_t *polled;
    zmq_pollitem_t *items;
    size_t polled_capacity;
    bool changed;             //  readers were added or removed since the last poll
    zsock_t *owned[OWNED_MAX]; //  actor_shell_open's sockets
    size_t owned_count;
    char error[256];
    actor_shell_command_fn *command;
    actor_shell_term_fn *term;
    actor_shell_tick_fn *tick;
    actor_shell_wait_fn *waiter;
    wait_set_t *waits; //  wait-set mode, else NULL
    bool nonstop;
    bool final_tick;
    bool signalled;
    bool stopped;
    bool terminated;
    void *arg;
};

static int s_pipe_reader (actor_shell_t *self, zsock_t *pipe, void *arg);

actor_shell_t *
actor_shell_new (zsock_t *pipe, const char *name)
{
    assert (pipe && name);
    actor_shell_t *self = (actor_shell_t *) zmalloc (sizeof (actor_shell_t));
    self->pipe = pipe;
    snprintf (self->name, sizeof self->name, "%s", name);
    pthread_setname_np (pthread_self (), self->name);
    actor_shell_add (self, pipe, s_pipe_reader);
    return self;
}

void
actor_shell_destroy (actor_shell_t **self_p)
{
    actor_shell_t *self = *self_p;
    if (!self)
        return;
    while (self->owned_count)
        zsock_destroy (&self->owned[--self->owned_count]);
    wait_set_destroy (&self->waits);
    free (self->readers);
    free (self->polled);
    free (self->items);
    free (self);
    *self_p = NULL;
}

zsock_t *
actor_shell_open (actor_shell_t *self, const actor_socket_t *spec, const char *instance)
{
    zsock_t *sock = zsock_new (spec->type);
    assert (sock && self->owned_count < OWNED_MAX);
    if (spec->sndhwm != ACTOR_HWM_LIBZMQ)
        zsock_set_sndhwm (sock, spec->sndhwm);
    if (spec->rcvhwm != ACTOR_HWM_LIBZMQ)
        zsock_set_rcvhwm (sock, spec->rcvhwm);
    if (spec->mandatory)
        zsock_set_router_mandatory (sock, 1);
    if (spec->endpoint) {
        assert (spec->endpoint[0] == '@' || spec->endpoint[0] == '>');
        char endpoint[300];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf (endpoint, sizeof endpoint, spec->endpoint + 1, instance ? instance : "");
#pragma GCC diagnostic pop
        int rc = spec->endpoint[0] == '@' ? zsock_bind (sock, "%s", endpoint)
                                          : zsock_connect (sock, "%s", endpoint);
        if (rc == -1) {
            snprintf (self->error, sizeof self->error, "cannot %s %.180s: %s",
                      spec->endpoint[0] == '@' ? "bind" : "connect", endpoint,
                      zmq_strerror (zmq_errno ()));
            zsock_destroy (&sock);
            return NULL;
        }
    }
    self->owned[self->owned_count++] = sock;
    if (spec->reader)
        actor_shell_add (self, sock, spec->reader);
    return sock;
}

const char *
actor_shell_error (actor_shell_t *self)
{
    return self->error;
}

static void
s_add (actor_shell_t *self, zsock_t *sock, int fd, actor_shell_reader_fn *reader,
       actor_shell_fd_fn *fd_reader)
{
    if (self->count == self->capacity) {
        self->capacity = self->capacity ? 2 * self->capacity : 8;
        self->readers = (reader_t *) realloc (self->readers, self->capacity * sizeof (reader_t));
        assert (self->readers);
    }
    self->readers[self->count++] = (reader_t){sock, fd, reader, fd_reader, ++self->serials, false};
    self->changed = true;
    if (self->waits)
        wait_set_add (self->waits, sock);
}

void
actor_shell_add (actor_shell_t *self, zsock_t *sock, actor_shell_reader_fn *reader)
{
    assert (sock && reader);
    s_add (self, sock, -1, reader, NULL);
}

void
actor_shell_add_fd (actor_shell_t *self, int fd, actor_shell_fd_fn *reader)
{
    assert (fd >= 0 && reader && !self->waits); //  a wait set waits on sockets only
    s_add (self, NULL, fd, NULL, reader);
}

static void
s_remove (actor_shell_t *self, zsock_t *sock, int fd)
{
    for (size_t i = 0; i < self->count; i++) {
        reader_t *reader = &self->readers[i];
        if (!reader->gone && (sock ? reader->sock == sock : reader->fd == fd)) {
            reader->gone = true;
            self->changed = true;
            if (self->waits)
                wait_set_remove (self->waits, sock);
        }
    }
}

void
actor_shell_remove (actor_shell_t *self, zsock_t *sock)
{
    if (sock)
        s_remove (self, sock, -1);
}

void
actor_shell_remove_fd (actor_shell_t *self, int fd)
{
    s_remove (self, NULL, fd);
}

void
actor_shell_on_command (actor_shell_t *self, actor_shell_command_fn *handler)
{
    self->command = handler;
}

void
actor_shell_on_term (actor_shell_t *self, actor_shell_term_fn *handler)
{
    self->term = handler;
}

void
actor_shell_on_tick (actor_shell_t *self, actor_shell_tick_fn *handler)
{
    self->tick = handler;
}

void
actor_shell_set_nonstop (actor_shell_t *self, bool nonstop)
{
    self->nonstop = nonstop;
}

void
actor_shell_set_final_tick (actor_shell_t *self, bool final_tick)
{
    self->final_tick = final_tick;
}

wait_set_t *
actor_shell_use_wait_set (actor_shell_t *self)
{
    if (!self->waits) {
        self->waits = wait_set_new ();
        for (size_t i = 0; i < self->count; i++) {
            assert (self->readers[i].sock);
            if (!self->readers[i].gone)
                wait_set_add (self->waits, self->readers[i].sock);
        }
    }
    return self->waits;
}

void
actor_shell_on_wait (actor_shell_t *self, actor_shell_wait_fn *waiter)
{
    self->waiter = waiter;
}

void
actor_shell_touch (actor_shell_t *self, zsock_t *sock)
{
    if (self->waits)
        wait_set_touch (self->waits, sock);
}

void
actor_shell_ready (actor_shell_t *self, int status)
{
    if (self->signalled)
        return;
    self->signalled = true;
    zsock_signal (self->pipe, (byte) status);
}

void
actor_shell_stop (actor_shell_t *self)
{
    self->stopped = true;
}

bool
actor_shell_terminated (actor_shell_t *self)
{
    return self->terminated;
}

zsock_t *
actor_shell_pipe (actor_shell_t *self)
{
    return self->pipe;
}

//  The pipe: $TERM ends the loop (unless on_term keeps it); the rest is the actor's.
static int
s_pipe_reader (actor_shell_t *self, zsock_t *pipe, void *arg)
{
    zmsg_t *msg = zmsg_recv (pipe);
    char *command = msg ? zmsg_popstr (msg) : NULL;
    int rc = 0;
    if (!command || streq (command, "$TERM")) {
        self->terminated = true;
        rc = self->term && self->term (self, arg) == 1 ? 0 : -1;
    }
    else if (self->command)
        rc = self->command (self, command, msg, arg);
    else {
        kvp_error ("%s: invalid pipe command '%s'", self->name, command);
        assert (false);
    }
    zstr_free (&command);
    zmsg_destroy (&msg);
    //  A command may have been answered on the pipe.
    actor_shell_touch (self, pipe);
    return rc;
}

//  Calls the reader of a socket (or descriptor) that has input.
static void
s_dispatch (actor_shell_t *self, const reader_t *reader)
{
    int rc = reader->sock ? reader->reader (self, reader->sock, self->arg)
                          : reader->fd_reader (self, reader->fd, self->arg);
    if (rc != 0)
        self->stopped = true;
}

//  Drops the readers removed since the last poll, keeping the order of the rest.
static void
s_compact (actor_shell_t *self)
{
    size_t kept = 0;
    for (size_t i = 0; i < self->count; i++)
        if (!self->readers[i].gone)
            self->readers[kept++] = self->readers[i];
    self->count = kept;
}

static int
s_timeout (int64_t due)
{
    if (due < 0)
        return -1;
    int64_t wait = due - zclock_mono ();
    return wait > 0 ? (wait > INT32_MAX ? INT32_MAX : (int) wait) : 0;
}

//  One wait of the wait set, and its socket's reader.
static void
s_wait_set_pass (actor_shell_t *self, int timeout)
{
    zsock_t *which = self->waiter ? self->waiter (self, self->waits, timeout, self->arg)
                                  : wait_set_wait (self->waits, timeout);
    if (!which)
        return;
    for (size_t i = 0; i < self->count; i++)
        if (!self->readers[i].gone && self->readers[i].sock == which) {
            reader_t reader = self->readers[i];
            s_dispatch (self, &reader);
            return;
        }
}

//  Whether the reader with this serial is there and not removed. Serials rise along the
//  array (readers are appended, and compaction keeps their order): a binary search.
static bool
s_there (actor_shell_t *self, uint64_t serial)
{
    size_t low = 0, high = self->count;
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        if (self->readers[mid].serial < serial)
            low = mid + 1;
        else
            high = mid;
    }
    return low < self->count && self->readers[low].serial == serial && !self->readers[low].gone;
}

//  One zmq_poll of every reader, and the readers of what was ready.
static void
s_poll_pass (actor_shell_t *self, int timeout)
{
    size_t count = self->count;
    if (self->polled_capacity < count) {
        self->polled_capacity = self->capacity;
        self->polled = (reader_t *) realloc (self->polled, self->polled_capacity * sizeof (reader_t));
        self->items = (zmq_pollitem_t *) realloc (self->items,
                                                  self->polled_capacity * sizeof (zmq_pollitem_t));
        assert (self->polled && self->items);
    }
    zmq_pollitem_t *items = self->items;
    reader_t *readers = self->polled;
    for (size_t i = 0; i < count; i++) {
        readers[i] = self->readers[i];
        items[i] = (zmq_pollitem_t){readers[i].sock ? zsock_resolve (readers[i].sock) : NULL,
                                    readers[i].fd, ZMQ_POLLIN, 0};
    }
    self->changed = false;
    int rc = zmq_poll (items, (int) count, timeout);
    if (rc == -1) {
        if (errno != EINTR || !self->nonstop)
            self->stopped = true;
        return;
    }
    if (zsys_interrupted && !self->nonstop) {
        self->stopped = true;
        return;
    }
    for (size_t i = 0; i < count && !self->stopped; i++) {
        if (!(items[i].revents & ZMQ_POLLIN))
            continue;
        //  Still there? (A handler before it in this pass may have removed it.)
        if (s_there (self, readers[i].serial))
            s_dispatch (self, &readers[i]);
    }
}

void
actor_shell_run (actor_shell_t *self, void *arg)
{
    self->arg = arg;
    actor_shell_ready (self, 0);
    bool ticked_last = false; //  the loop ended in the tick
    while (!self->stopped) {
        int64_t due = self->tick ? self->tick (self, arg) : -1;
        if ((ticked_last = self->stopped))
            break;
        s_compact (self);
        if (self->waits)
            s_wait_set_pass (self, s_timeout (due));
        else
            s_poll_pass (self, s_timeout (due));
    }
    if (self->final_tick && self->terminated && self->tick && !ticked_last)
        self->tick (self, arg);
}

//  ---- self test ---------------------------------------------------------------------

typedef struct {
    actor_shell_t *shell;
    zsock_t *router;
    int wake_fd;
    int ticks;
    int wakes;
    bool finishing; //  $TERM came: one more wake-up is awaited
} s_test_t;

static int
s_test_echo (actor_shell_t *shell, zsock_t *router, void *arg)
{
    (void) arg;
    zmsg_t *msg = zmsg_recv (router);
    zmsg_send (&msg, router);
    actor_shell_touch (shell, router);
    return 0;
}

static int
s_test_wake (actor_shell_t *shell, int fd, void *arg)
{
    s_test_t *test = (s_test_t *) arg;
    uint64_t value;
    if (read (fd, &value, sizeof value) == sizeof value)
        test->wakes++;
    if (test->finishing)
        actor_shell_stop (shell);
    return 0;
}

static int
s_test_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    (void) msg;
    s_test_t *test = (s_test_t *) arg;
    if (streq (command, "TICKS"))
        zsock_send (actor_shell_pipe (shell), "iii", test->ticks, test->wakes, test->wake_fd);
    else if (streq (command, "QUIT"))
        return -1;
    return 0;
}

static int
s_test_term (actor_shell_t *shell, void *arg)
{
    s_test_t *test = (s_test_t *) arg;
    if (test->wake_fd < 0)
        return 0;
    test->finishing = true;
    actor_shell_remove (shell, test->router); //  no more work after $TERM
    return 1;
}

static int64_t
s_test_tick (actor_shell_t *shell, void *arg)
{
    (void) shell;
    s_test_t *test = (s_test_t *) arg;
    test->ticks++;
    return zclock_mono () + 10;
}

//  args: "poll" (zmq_poll, an eventfd), "set" (a wait set)
static void
s_test_actor (zsock_t *pipe, void *args)
{
    bool set = streq ((const char *) args, "set");
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-shelltest");
    s_test_t test = {shell, NULL, -1, 0, 0, false};
    if (set)
        actor_shell_use_wait_set (shell);
    static const actor_socket_t router = {
        .type = ZMQ_ROUTER, .endpoint = "@inproc://%s-echo", .reader = s_test_echo};
    static const actor_socket_t taken = {.type = ZMQ_ROUTER, .endpoint = "@inproc://%s-echo"};
    test.router = actor_shell_open (shell, &router, set ? "shellset" : "shellpoll");
    assert (test.router && !*actor_shell_error (shell));
    assert (!actor_shell_open (shell, &taken, set ? "shellset" : "shellpoll"));
    assert (strstr (actor_shell_error (shell), "cannot bind inproc://shell"));
    if (!set) {
        test.wake_fd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
        actor_shell_add_fd (shell, test.wake_fd, s_test_wake);
    }
    actor_shell_on_command (shell, s_test_command);
    actor_shell_on_term (shell, s_test_term);
    actor_shell_on_tick (shell, s_test_tick);
    actor_shell_run (shell, &test);
    if (test.wake_fd >= 0)
        close (test.wake_fd);
    actor_shell_destroy (&shell);
}


//  Many readers (past the array's first sizes), and a reader swapped during a pass: the
//  first descriptor's handler removes the second, closes it and waits on a new eventfd,
//  which gets the same number. Every descriptor is readable at the first poll: each is read
//  once, except the removed one, and the new one (not polled yet, and not readable) is not
//  called in that pass.
#define TEST_MANY 100

typedef struct {
    int fds[TEST_MANY];
    int calls, reads, late, passes;
    bool swapped;
} s_test_many_t;

static int
s_test_late (actor_shell_t *shell, int fd, void *arg)
{
    (void) shell;
    (void) fd;
    ((s_test_many_t *) arg)->late++;
    return 0;
}

static int
s_test_many_read (actor_shell_t *shell, int fd, void *arg)
{
    s_test_many_t *many = (s_test_many_t *) arg;
    uint64_t value;
    many->calls++;
    if (read (fd, &value, sizeof value) == sizeof value)
        many->reads++;
    if (!many->swapped) {
        many->swapped = true;
        actor_shell_remove_fd (shell, many->fds[1]);
        close (many->fds[1]);
        many->fds[1] = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
        actor_shell_add_fd (shell, many->fds[1], s_test_late);
    }
    return 0;
}

static int64_t
s_test_many_tick (actor_shell_t *shell, void *arg)
{
    s_test_many_t *many = (s_test_many_t *) arg;
    if (many->passes++ == 1)
        actor_shell_stop (shell); //  after the first pass
    return -1;
}

static void
s_test_many_actor (zsock_t *pipe, void *args)
{
    (void) args;
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-shelltest");
    s_test_many_t many = {.reads = 0};
    uint64_t one = 1;
    for (int i = 0; i < TEST_MANY; i++) {
        many.fds[i] = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
        assert (many.fds[i] >= 0 && write (many.fds[i], &one, sizeof one) == sizeof one);
        actor_shell_add_fd (shell, many.fds[i], s_test_many_read);
    }
    actor_shell_on_tick (shell, s_test_many_tick);
    actor_shell_run (shell, &many);
    //  (the swap reused the number, or the test proves less)
    zsock_send (pipe, "iiii", many.calls, many.reads, many.late, many.swapped);
    for (int i = 0; i < TEST_MANY; i++)
        close (many.fds[i]);
    actor_shell_destroy (&shell);
}


//  A final tick: after $TERM the tick runs once more, and sees it (args: an int, the ticks
//  that saw $TERM).
static int64_t
s_test_final_tick (actor_shell_t *shell, void *arg)
{
    if (actor_shell_terminated (shell))
        (*(int *) arg)++;
    return -1;
}

static void
s_test_final_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-shelltest");
    actor_shell_on_tick (shell, s_test_final_tick);
    actor_shell_set_final_tick (shell, true);
    actor_shell_run (shell, args);
    actor_shell_destroy (&shell);
}

void
actor_shell_test (bool verbose)
{
    for (int mode = 0; mode < 2; mode++) {
        const char *name = mode ? "set" : "poll";
        zactor_t *actor = zactor_new (s_test_actor, (void *) name);
        assert (actor);
        zsock_t *client =
            zsock_new_dealer (mode ? "inproc://shellset-echo" : "inproc://shellpoll-echo");
        assert (client);
        for (int i = 0; i < 3; i++) {
            zstr_send (client, "hello");
            char *echo = zstr_recv (client);
            assert (echo && streq (echo, "hello"));
            zstr_free (&echo);
        }
        zclock_sleep (30);
        zstr_send (actor, "TICKS");
        int ticks = 0, wakes = 0, fd = -1;
        assert (zsock_recv (actor, "iii", &ticks, &wakes, &fd) == 0);
        assert (ticks >= 3 && wakes == 0); //  a tick at least every 10 ms, and after each
        zsock_destroy (&client);
        if (mode == 0) {
            //  The eventfd is read ...
            uint64_t one = 1;
            assert (fd >= 0 && write (fd, &one, sizeof one) == sizeof one);
            zclock_sleep (20);
            zstr_send (actor, "TICKS");
            assert (zsock_recv (actor, "iii", &ticks, &wakes, &fd) == 0 && wakes == 1);
            //  ... and after $TERM with work in flight, the loop goes on (commands are
            //  still answered) until the work says it is done (here: the next wake-up).
            zstr_send (actor, "$TERM");
            zstr_send (actor, "TICKS");
            assert (zsock_recv (actor, "iii", &ticks, &wakes, &fd) == 0 && wakes == 1);
            assert (write (fd, &one, sizeof one) == sizeof one);
        }
        else
            zstr_send (actor, "QUIT"); //  a command may end the loop too
        zactor_destroy (&actor);
    }
    zactor_t *many = zactor_new (s_test_many_actor, NULL);
    int calls = 0, reads = 0, late = 0, swapped = 0;
    assert (many && zsock_recv (many, "iiii", &calls, &reads, &late, &swapped) == 0);
    assert (swapped && calls == TEST_MANY - 1 && reads == calls && late == 0);
    zactor_destroy (&many);
    int final_ticks = 0;
    zactor_t *final = zactor_new (s_test_final_actor, &final_ticks);
    assert (final);
    zactor_destroy (&final);
    assert (final_ticks == 1);
    if (verbose)
        printf ("zmq_poll and wait-set loops, commands, ticks, $TERM, a final tick, %d readers ",
                TEST_MANY);
}
