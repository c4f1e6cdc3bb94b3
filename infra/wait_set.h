/*  wait_set.h - waits for input on several ZeroMQ sockets, asking a socket for its events
    only when they may have changed.

    zmq_poll (and zpoller, over it) asks every socket for ZMQ_EVENTS before it sleeps and
    again when it wakes, and for an idle socket each ask is a poll of its mailbox and a
    getpid: two system calls. The api waits on eight sockets, so a request paid for some
    twenty of them before any work. Measured on the 2-core VM: a bare echo server polling
    its socket with eight idle others answered 11-21% slower than one polling its socket
    alone.

    A socket's events change only when its file descriptor (ZMQ_FD) becomes readable, or
    when the thread that owns it sends or receives on it (libzmq then handles the socket's
    commands, which may make a message visible without the descriptor firing). So a set
    asks only the sockets that are "dirty": the one it last returned, those whose descriptor
    fired, and those the caller touched (wait_set_touch) after sending on them. When none is
    ready it sleeps in one poll of all the descriptors.

    Threads: the set belongs to the thread that owns its sockets.
*/
#ifndef WAIT_SET_H_INCLUDED
#define WAIT_SET_H_INCLUDED

#include <czmq.h>

typedef struct _wait_set_t wait_set_t;

wait_set_t *wait_set_new (void);
void wait_set_destroy (wait_set_t **self_p);

//  Adds / removes a socket (removing one not in the set does nothing).
void wait_set_add (wait_set_t *self, zsock_t *sock);
void wait_set_remove (wait_set_t *self, zsock_t *sock);

//  The caller sent on sock (or did anything else with it but receive the message
//  wait_set_wait returned): its events are asked again before the next sleep. Every send on
//  a socket of the set must be followed by a touch, or a message that arrived meanwhile may
//  wait until the next timeout.
void wait_set_touch (wait_set_t *self, zsock_t *sock);

//  A socket with a message waiting, or NULL once timeout_ms passed (0: do not sleep; -1:
//  no limit). Sockets that are ready together are returned in turn. The caller is expected
//  to receive one message from the socket returned.
zsock_t *wait_set_wait (wait_set_t *self, int timeout_ms);

void wait_set_test (bool verbose);

#endif
