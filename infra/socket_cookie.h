/*  socket_cookie.h - which socket a descriptor number leads to, by the kernel's word.

    The api, its connection guard and its key watches each remember client connections by
    the descriptor libzmq accepted them on (a message's "__fd") and, later, shut some of them
    down (replies left unread, a request too large to buffer, a revoked CURVE key). By then
    the connection may have closed and its number been given to another socket. SO_COOKIE
    names a socket uniquely for as long as the machine runs, so a connection is remembered
    with its cookie and shut down only while its descriptor still carries that cookie.

    Threads: any; no state.
*/
#ifndef SOCKET_COOKIE_H_INCLUDED
#define SOCKET_COOKIE_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>

//  The cookie of the socket on fd, or 0 when fd is no open socket.
uint64_t socket_cookie (int fd);

//  Shuts the socket on fd down (both ways) if it is still the one with this cookie (not 0).
//  Returns true when it did.
bool socket_shutdown_if (int fd, uint64_t cookie);

void socket_cookie_test (bool verbose);

#endif
