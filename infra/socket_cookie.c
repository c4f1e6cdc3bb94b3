/*  socket_cookie.c - which socket a descriptor number leads to (socket_cookie.h).
*/
#include "infra/socket_cookie.h"

#include <assert.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

uint64_t
socket_cookie (int fd)
{
    uint64_t cookie = 0;
    socklen_t len = sizeof cookie;
    if (fd < 0 || getsockopt (fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) != 0)
        return 0;
    return cookie;
}

bool
socket_shutdown_if (int fd, uint64_t cookie)
{
    return cookie && socket_cookie (fd) == cookie && shutdown (fd, SHUT_RDWR) == 0;
}

void
socket_cookie_test (bool verbose)
{
    if (verbose)
        printf (" * socket_cookie: ");
    int pair[2];
    assert (socketpair (AF_UNIX, SOCK_STREAM, 0, pair) == 0);
    uint64_t a = socket_cookie (pair[0]), b = socket_cookie (pair[1]);
    assert (a && b && a != b);
    assert (socket_cookie (-1) == 0);
    //  Another socket's cookie, or none, shuts nothing down.
    assert (!socket_shutdown_if (pair[0], b));
    assert (!socket_shutdown_if (pair[0], 0));
    assert (write (pair[1], "x", 1) == 1);
    char byte;
    assert (read (pair[0], &byte, 1) == 1);
    assert (socket_shutdown_if (pair[0], a));
    assert (read (pair[0], &byte, 1) == 0); //  shut down: end of stream
    close (pair[0]);
    close (pair[1]);
    assert (socket_cookie (pair[0]) == 0);
    if (verbose)
        printf ("OK\n");
}
