/*  connect_probe.h - why nothing answers at an endpoint: one plain connect() to its address.

    libzmq retries a refused connect silently and its monitor events carry no errno, so a
    connection that saw its attempts fail (connection.c) asks the kernel itself, once:
    nothing listens (ECONNREFUSED; ENOENT for an ipc path that does not exist), the host or
    network cannot be reached, or someone listens after all (a node that just started).
*/
#ifndef KVPC_CONNECT_PROBE_H_INCLUDED
#define KVPC_CONNECT_PROBE_H_INCLUDED

//  Connects to endpoint's address (tcp://HOST:PORT, ipc://PATH, ipc://@NAME) within wait_ms
//  and closes at once. Returns 0 when the connect succeeded, the connect's errno when it
//  failed, or -1 when the endpoint cannot be probed (another transport, a name that does not
//  resolve, no answer within wait_ms).
int kvpc_connect_probe (const char *endpoint, int wait_ms);

#endif
