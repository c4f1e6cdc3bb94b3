/*  conn_guard.h - keeps the api's client listeners from running the daemon out of file
    descriptors.

    At the descriptor limit libzmq's listener spins: accept() fails with EMFILE, the pending
    connection stays queued, and level-triggered epoll reports it again at once, so an I/O
    thread burns a core until some connection closes. The guard counts the api ROUTER's
    connections (a socket monitor: accepted, disconnected, accept failed) and, at a limit
    below the descriptor limit, stops taking new ones while the existing ones go on being
    served; it starts again when the count falls under a low mark (nine tenths of the limit).

    The api owns a guard and calls it from its own thread: it adds conn_guard_socket() to its
    poller and calls conn_guard_handle() when that socket is readable.

    Request bytes held in libzmq. libzmq hands a multipart message over only once all of
    it has arrived, and bounds its frames one by one (ZMQ_MAXMSGSIZE), never their number
    or their sum; nor does ZMQ_RCVHWM, which counts whole messages. So one message of many
    frames, each under the frame limit, is buffered whole before the api can refuse it. The
    guard bounds it from outside: for each tcp connection the kernel counts the bytes it
    received (TCP_INFO tcpi_bytes_received), the api tells the guard what it has read
    (conn_guard_read); the difference, less the framing, is what libzmq holds for that
    connection. A connection past conn_guard_set_max_buffered is shut down
    (conn_guard_sweep), and libzmq frees what it held. ipc connections have no such
    counter and are not bounded this way (they are same-machine clients).
*/
#ifndef CONN_GUARD_H_INCLUDED
#define CONN_GUARD_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct _conn_guard_t conn_guard_t;

//  Watches router, which listens on endpoints (resolved strings: tcp://host:port,
//  ipc://path or ipc://@name), and keeps its connections at or under limit (0: the default,
//  conn_guard_default_limit). name makes the monitor's inproc endpoint unique. Returns NULL
//  when the monitor cannot be started. Destroy it before the router.
conn_guard_t *conn_guard_new (zsock_t *router, zlistx_t *endpoints, uint64_t limit,
                              const char *name);

//  Stops the monitor. Does nothing on NULL; sets *self_p to NULL.
void conn_guard_destroy (conn_guard_t **self_p);

//  The monitor socket, for the owner's poller.
zsock_t *conn_guard_socket (conn_guard_t *self);

//  Takes the events waiting on the monitor socket and acts on them. Returns 0, or -1 when
//  the monitor has gone.
int conn_guard_handle (conn_guard_t *self);

//  Client connections open now (as the monitor counted them).
size_t conn_guard_connections (conn_guard_t *self);

//  Whether new connections are being refused now.
bool conn_guard_paused (conn_guard_t *self);

//  The limit in effect.
uint64_t conn_guard_limit (conn_guard_t *self);

//  The descriptor limit (RLIMIT_NOFILE, soft) less a reserve for segments, files, inproc
//  sockets and a burst of accepts: a quarter of it, at least 256 and at most 1024 (and at
//  least 1 connection).
uint64_t conn_guard_default_limit (void);

//  Raises the soft RLIMIT_NOFILE to the hard limit. Returns the soft limit now in effect.
uint64_t conn_guard_raise_fd_limit (void);

//  Bytes of requests one tcp connection may have in libzmq, not yet read by the api (0: no
//  bound). Past it, conn_guard_sweep shuts the connection down.
void conn_guard_set_max_buffered (conn_guard_t *self, uint64_t bytes);

//  The api read a message of bytes (all frames) in frames frames from the connection on
//  descriptor fd.
void conn_guard_read (conn_guard_t *self, int fd, uint64_t bytes, size_t frames);

//  Every CONN_GUARD_SWEEP_MS at most (now: zclock_mono): shuts down the tcp connections that
//  hold more than the bound in libzmq. Returns how many.
size_t conn_guard_sweep (conn_guard_t *self, int64_t now);
#define CONN_GUARD_SWEEP_MS 100

//  Connections shut down for holding too many request bytes.
uint64_t conn_guard_overfull (conn_guard_t *self);

//  Self test.
void conn_guard_test (bool verbose);

#endif
