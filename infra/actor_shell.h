/*  actor_shell.h - what every actor of kvpoold repeats, written once: its sockets, the
    ready signal, the poll loop with a tick, $TERM, and the teardown.

    A kvpoold actor is a CZMQ actor (`void x_actor (zsock_t *pipe, void *args)`, one thread)
    that waits on its pipe and a few sockets (and descriptors, such as an eventfd its
    workers write), handles what comes in, does timed work between messages, and ends on
    $TERM. The shell does the waiting and the dispatch; the actor gives it one reader a
    socket, a handler for its pipe commands and a tick, as CZMQ's zloop takes handlers and
    Malamute's generated engines take actions:

        void
        x_actor (zsock_t *pipe, void *args)
        {
            actor_shell_t *shell = actor_shell_new (pipe, "kvp-x");
            self_t *self = s_self_new (shell, (const kvp_config_t *) args);
            actor_shell_on_command (shell, s_pipe_command); //  ENDPOINTS, STATS...
            actor_shell_on_tick (shell, s_tick);            //  timed work, next due time
            actor_shell_run (shell, self);                  //  signals ready, loops
            s_self_destroy (&self);
            actor_shell_destroy (&shell);                   //  closes the sockets it made
        }

    and in s_self_new, for each socket:

        static const actor_socket_t jobs = {
            .type = ZMQ_ROUTER, .endpoint = "@inproc://%s-x", .reader = s_job};
        self->router = actor_shell_open (shell, &jobs, config->instance);

    or, for a socket that needs options the description has not (CURVE, a message size
    limit), actor_shell_add (shell, sock, s_reader) on a socket the actor made and owns.

    The loop: the tick runs before every wait (the first included) and says when it must
    run next; the shell waits until a reader has input or that time came; it calls the
    readers whose input is waiting, in the order they were added (the pipe first), then
    ticks again. The pipe's $TERM (or the pipe gone) ends the loop, unless an on_term
    handler keeps it going (an actor that finishes the work in flight first, then calls
    actor_shell_stop), and the tick may run once more first (actor_shell_set_final_tick).
    Any handler may end the loop (return -1, or actor_shell_stop).

    Two ways to wait. By default one zmq_poll of every socket and descriptor (as zpoller).
    An actor on the request path uses a wait set instead (actor_shell_use_wait_set:
    wait_set.h, which asks a socket for its events only when they may have changed, and may
    spin first: actor_shell_on_wait); it must then touch a socket after each send on it
    (actor_shell_touch), and waits on sockets only.

    Threads: a shell belongs to its actor's thread, and every handler runs there.
*/
#ifndef ACTOR_SHELL_H_INCLUDED
#define ACTOR_SHELL_H_INCLUDED

#include <czmq.h>

#include "infra/wait_set.h"

typedef struct _actor_shell_t actor_shell_t;

//  A socket has a message waiting (receive one, or more). Returns 0, or -1 to end the loop.
typedef int (actor_shell_reader_fn) (actor_shell_t *shell, zsock_t *sock, void *arg);
//  A descriptor is readable. Returns 0, or -1 to end the loop.
typedef int (actor_shell_fd_fn) (actor_shell_t *shell, int fd, void *arg);
//  A pipe command other than $TERM: command is its first frame, msg what follows it (the
//  handler may take frames from it; the shell destroys it). Returns 0, or -1 to end the
//  loop. Commands come from kvpoold's own code: an unknown one is a bug.
typedef int (actor_shell_command_fn) (actor_shell_t *shell, const char *command, zmsg_t *msg,
                                      void *arg);
//  $TERM came (or the pipe went). Returns 0 to end the loop now, 1 to go on (the actor
//  calls actor_shell_stop once its work in flight is done).
typedef int (actor_shell_term_fn) (actor_shell_t *shell, void *arg);
//  Runs before every wait. Returns when it must run next (zclock_mono ms; at most that long
//  is waited), or -1 for no limit.
typedef int64_t (actor_shell_tick_fn) (actor_shell_t *shell, void *arg);
//  Waits on the wait set in place of wait_set_wait (timeout_ms as there): a socket with a
//  message waiting, or NULL when the time ran out. For an actor that spins before it
//  sleeps (spin_poll.h).
typedef zsock_t *(actor_shell_wait_fn) (actor_shell_t *shell, wait_set_t *set, int timeout_ms,
                                        void *arg);

//  A socket an actor makes: its type, where it binds ("@" + a format) or connects (">" +
//  a format) with the instance name as the one %s (NULL: neither), its high-water marks
//  (ACTOR_HWM_LIBZMQ: libzmq's default; 0: none) and its reader (NULL: not waited on).
#define ACTOR_HWM_LIBZMQ (-1)
typedef struct {
    int type;
    const char *endpoint;
    int sndhwm, rcvhwm;
    actor_shell_reader_fn *reader;
    bool mandatory; //  ROUTER: a message to a peer that is gone fails (ZMQ_ROUTER_MANDATORY)
} actor_socket_t;

//  Creates the shell of the actor on pipe, and names the calling thread (at most 15
//  characters: "kvp-api"). Caller owns the return value and must destroy it.
actor_shell_t *actor_shell_new (zsock_t *pipe, const char *name);
//  Destroys the sockets actor_shell_open made (in reverse order), not the pipe nor the
//  sockets of actor_shell_add. Does nothing on NULL; sets *self_p to NULL.
void actor_shell_destroy (actor_shell_t **self_p);

//  Makes a socket as described, owned by the shell (destroyed with it), and waits on it
//  when it has a reader. Returns it, or NULL when it could not bind or connect (the reason
//  in actor_shell_error; the socket is destroyed).
zsock_t *actor_shell_open (actor_shell_t *self, const actor_socket_t *spec, const char *instance);
//  Why the last actor_shell_open failed ("" if none did).
const char *actor_shell_error (actor_shell_t *self);
//  Waits on a socket the actor owns, calling reader when it has input (arg: run's).
void actor_shell_add (actor_shell_t *self, zsock_t *sock, actor_shell_reader_fn *reader);
//  Waits on a descriptor (zmq_poll mode only: not with a wait set).
void actor_shell_add_fd (actor_shell_t *self, int fd, actor_shell_fd_fn *reader);
//  Stops waiting on a socket or descriptor (one not waited on: nothing). A socket removed
//  by a handler is not read again, not even in the pass that removed it.
void actor_shell_remove (actor_shell_t *self, zsock_t *sock);
void actor_shell_remove_fd (actor_shell_t *self, int fd);

void actor_shell_on_command (actor_shell_t *self, actor_shell_command_fn *handler);
void actor_shell_on_term (actor_shell_t *self, actor_shell_term_fn *handler);
void actor_shell_on_tick (actor_shell_t *self, actor_shell_tick_fn *handler);
//  The loop goes on when zsys_interrupted is set (CZMQ's SIGINT flag; kvpoold blocks the
//  signals in its actors) or a poll is interrupted, as zpoller_set_nonstop.
void actor_shell_set_nonstop (actor_shell_t *self, bool nonstop);
//  When $TERM (or the pipe gone) ends the loop, the tick runs once more before run returns
//  (no reader is called after the $TERM): for an actor whose work after a wake-up (answers
//  due, events to flush) must also follow the wake-up that brought $TERM.
void actor_shell_set_final_tick (actor_shell_t *self, bool final_tick);

//  Waits with a wait set from now on (before any add). Returns it (the shell owns it), for
//  touches and spins.
wait_set_t *actor_shell_use_wait_set (actor_shell_t *self);
//  With a wait set: the waiter run in place of wait_set_wait.
void actor_shell_on_wait (actor_shell_t *self, actor_shell_wait_fn *waiter);
//  With a wait set: the actor sent on sock (wait_set_touch). Otherwise nothing.
void actor_shell_touch (actor_shell_t *self, zsock_t *sock);

//  Signals the pipe that the actor is ready, with status (0: ready), if run has not. For an
//  actor whose start can fail: signal 1 and return.
void actor_shell_ready (actor_shell_t *self, int status);
//  Signals ready (0) unless done, then runs the loop until it ends. arg goes to every
//  handler.
void actor_shell_run (actor_shell_t *self, void *arg);
//  Ends the loop once the running handler returns.
void actor_shell_stop (actor_shell_t *self);
//  Whether $TERM came (or the pipe went).
bool actor_shell_terminated (actor_shell_t *self);
zsock_t *actor_shell_pipe (actor_shell_t *self);

void actor_shell_test (bool verbose);

#endif
