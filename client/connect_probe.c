/*  connect_probe.c - why nothing answers at an endpoint (connect_probe.h).
 */
#include "client/connect_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stddef.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

//  Connects fd to address within wait_ms; returns 0, the errno, or -1 on no answer.
static int
s_connect (int fd, const struct sockaddr *address, socklen_t length, int wait_ms)
{
    if (connect (fd, address, length) == 0)
        return 0;
    if (errno != EINPROGRESS)
        return errno;
    struct pollfd item = {.fd = fd, .events = POLLOUT};
    int rc;
    do
        rc = poll (&item, 1, wait_ms);
    while (rc == -1 && errno == EINTR);
    if (rc <= 0)
        return -1;
    int error = 0;
    socklen_t size = sizeof error;
    if (getsockopt (fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0)
        return errno;
    return error;
}

static int
s_probe_ipc (const char *name)
{
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    size_t length = strlen (name);
    if (length == 0 || length >= sizeof address.sun_path)
        return -1;
    memcpy (address.sun_path, name, length);
    if (name[0] == '@')
        address.sun_path[0] = 0; //  abstract: no file, a name
    int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd == -1)
        return -1;
    int rc = s_connect (fd, (struct sockaddr *) &address,
                        (socklen_t) (offsetof (struct sockaddr_un, sun_path) + length), 0);
    close (fd);
    return rc;
}

static int
s_probe_tcp (const char *where, int wait_ms)
{
    //  [source;]HOST:PORT, HOST maybe [IPv6]
    const char *semicolon = strchr (where, ';');
    if (semicolon)
        where = semicolon + 1;
    char host[256];
    const char *colon = strrchr (where, ':');
    if (!colon || (size_t) (colon - where) >= sizeof host)
        return -1;
    size_t length = (size_t) (colon - where);
    if (length >= 2 && where[0] == '[' && where[length - 1] == ']') {
        where++;
        length -= 2;
    }
    memcpy (host, where, length);
    host[length] = 0;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *found = NULL;
    if (getaddrinfo (host, colon + 1, &hints, &found) != 0 || !found)
        return -1;
    int fd = socket (found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = fd == -1 ? -1 : s_connect (fd, found->ai_addr, found->ai_addrlen, wait_ms);
    if (fd != -1)
        close (fd);
    freeaddrinfo (found);
    return rc;
}

int
kvpc_connect_probe (const char *endpoint, int wait_ms)
{
    if (strncmp (endpoint, "ipc://", 6) == 0)
        return s_probe_ipc (endpoint + 6);
    if (strncmp (endpoint, "tcp://", 6) == 0)
        return s_probe_tcp (endpoint + 6, wait_ms);
    return -1;
}
