/*  conn_guard.c - keeps the api's client listeners from running the daemon out of file
    descriptors (see conn_guard.h).

    DESIGN
    Counting: zmq_socket_monitor on the api's ROUTER reports ACCEPTED (+1), DISCONNECTED (-1:
    libzmq reports it for every accepted connection that ends, a failed handshake included)
    and ACCEPT_FAILED. The monitor's PAIR socket is read by the api's thread, so the guard
    needs no lock.

    Refusing: zmq_unbind would stop the listener, but libzmq closes every connection that
    listener accepted along with it, so the guard leaves libzmq's listeners in place and acts
    on their sockets underneath. At start it finds them by address among the process's
    descriptors (SO_ACCEPTCONN, getsockname). To pause a TCP listener it attaches a socket
    filter that drops every packet: new SYNs (and the last ACK of a half-open handshake) go
    unanswered, so no connection completes and the listener is never readable; clients
    retry on their own and get in after the resume, which detaches the filter. Sockets
    accepted before stay as they are (a filter is copied only into sockets cloned while it is
    attached, and none is). The kernel has no such filter for unix-domain connects, so an ipc
    listener is not paused: a connection libzmq accepts past the limit (ipc, or tcp that was
    already queued) is shut down (shutdown(2) on the descriptor the ACCEPTED event names;
    libzmq sees the end and closes it), so the count comes back under the limit at once.
    Connections queued on any listener when the guard pauses, or whenever libzmq reports a
    failed accept, are accepted by the guard and closed (with a spare descriptor released for
    the purpose at EMFILE), so the queue libzmq would spin on is empty. The guard makes the
    listeners non-blocking for that: libzmq's accept may then find the queue already empty,
    which it takes as EAGAIN.

    The limit is capped by the descriptor limit less a reserve: at EMFILE libzmq 4.3's tcp
    listener spins, and its ipc listener aborts the process (an assertion). Refusing is
    asynchronous (libzmq accepts, then the guard hears of it), so the reserve also covers a
    burst of connections libzmq takes before the guard acts: a listen backlog's worth.

    Threads: one, the owner's (the api actor).
*/
#include "infra/socket_cookie.h"
#include "infra/conn_guard.h"

#include "infra/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <netinet/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_LISTENERS 16
//  Connections refused per batch of monitor events before falling back to refusing at once.
#define REFUSE_BATCH 256
//  Bytes on the wire a frame may take besides its data: ZMTP's flags and size (9), and under
//  CURVE its MESSAGE command (8), nonce (8), MAC (16) and flags (1).
#define FRAME_WIRE_BYTES 64
//  The handshake's and heartbeats' bytes, never part of a message.
#define WIRE_SLACK_BYTES (64 << 10)

//  Linux's struct tcp_info goes on past glibc's, which ends at tcpi_total_retrans (and
//  <linux/tcp.h> cannot be included beside <netinet/tcp.h>): the fields up to the one read.
typedef struct {
    struct tcp_info glibc;
    uint64_t pacing_rate, max_pacing_rate, bytes_acked, bytes_received;
} tcp_info_more_t;

_Static_assert(offsetof (tcp_info_more_t, bytes_received) == 128, "Linux's tcp_info layout");

//  A connection's count of request bytes the api read (conn_guard_read).
typedef struct {
    int fd;
    uint64_t cookie; //  SO_COOKIE: the connection, not just the descriptor number
    uint64_t read;   //  bytes on the wire of the messages the api read
    bool not_tcp;    //  TCP_INFO failed: ipc, not bounded
} reader_t;

typedef struct {
    int fd;
    bool tcp; //  can be paused with a filter
} listener_t;

struct _conn_guard_t {
    zsock_t *router;
    zsock_t *monitor;
    uint64_t limit, low_mark;
    size_t connections;
    bool paused;
    bool warned; //  the pause is logged once per pause
    listener_t listeners[MAX_LISTENERS];
    size_t listener_count;
    int spare_fd; //  closed to make room for the guard's own accept at EMFILE
    uint64_t refused, accept_failures;
    uint64_t max_buffered; //  0: no bound
    zhashx_t *readers;     //  "fd" -> reader_t, the connections open
    int64_t next_sweep;
    uint64_t overfull;
};

//  The record of the connection on fd now (made, or made anew for a new connection).
static reader_t *
s_reader (conn_guard_t *self, int fd)
{
    char name[16];
    snprintf (name, sizeof name, "%d", fd);
    reader_t *reader = (reader_t *) zhashx_lookup (self->readers, name);
    uint64_t cookie = socket_cookie (fd);
    if (!cookie)
        return NULL;
    if (!reader) {
        reader = (reader_t *) zmalloc (sizeof (reader_t));
        zhashx_insert (self->readers, name, reader);
    }
    if (reader->cookie != cookie) {
        memset (reader, 0, sizeof *reader);
        reader->fd = fd;
        reader->cookie = cookie;
        int domain = 0;
        socklen_t len = sizeof domain;
        reader->not_tcp = getsockopt (fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0
                          || (domain != AF_INET && domain != AF_INET6);
    }
    return reader;
}

uint64_t
conn_guard_raise_fd_limit (void)
{
    struct rlimit limit;
    if (getrlimit (RLIMIT_NOFILE, &limit) != 0)
        return 0;
    if (limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        if (setrlimit (RLIMIT_NOFILE, &limit) != 0)
            getrlimit (RLIMIT_NOFILE, &limit);
    }
    return limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t) limit.rlim_cur;
}

uint64_t
conn_guard_default_limit (void)
{
    struct rlimit limit;
    if (getrlimit (RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY)
        return 1 << 20;
    uint64_t fds = (uint64_t) limit.rlim_cur;
    //  Room for the daemon's own descriptors (segments, index, sockets' mailboxes: about
    //  50) and for the connections libzmq accepts before the guard hears of them (up to a
    //  listen backlog, ZMQ_BACKLOG 100, per burst).
    uint64_t reserve = fds / 4;
    if (reserve < 256)
        reserve = 256;
    if (reserve > 1024)
        reserve = 1024;
    return fds > reserve ? fds - reserve : 1;
}

//  Whether the listening socket fd is the one endpoint names: same port for tcp (any
//  address: "tcp://*:port" and "tcp://host:port" alike), same path or abstract name for ipc.
static bool
s_matches (int fd, const char *endpoint, bool *tcp)
{
    struct sockaddr_storage address;
    socklen_t length = sizeof address;
    memset (&address, 0, sizeof address);
    if (getsockname (fd, (struct sockaddr *) &address, &length) != 0)
        return false;
    if (strncmp (endpoint, "tcp://", 6) == 0) {
        const char *colon = strrchr (endpoint, ':');
        if (!colon || colon < endpoint + 6)
            return false;
        char *end;
        long port = strtol (colon + 1, &end, 10);
        if (*end || port <= 0 || port > 65535)
            return false;
        *tcp = true;
        if (address.ss_family == AF_INET)
            return ntohs (((struct sockaddr_in *) &address)->sin_port) == port;
        if (address.ss_family == AF_INET6)
            return ntohs (((struct sockaddr_in6 *) &address)->sin6_port) == port;
        return false;
    }
    if (strncmp (endpoint, "ipc://", 6) == 0 && address.ss_family == AF_UNIX) {
        *tcp = false;
        const struct sockaddr_un *unix_address = (const struct sockaddr_un *) &address;
        const char *name = endpoint + 6;
        size_t path_length = length > offsetof (struct sockaddr_un, sun_path)
                                 ? length - offsetof (struct sockaddr_un, sun_path)
                                 : 0;
        if (name[0] == '@') //  abstract: a leading NUL, no terminator
            return path_length == strlen (name) && unix_address->sun_path[0] == 0
                   && memcmp (unix_address->sun_path + 1, name + 1, path_length - 1) == 0;
        return strncmp (unix_address->sun_path, name, sizeof unix_address->sun_path) == 0;
    }
    return false;
}

//  Finds libzmq's listening sockets for endpoints among this process's descriptors.
static void
s_find_listeners (conn_guard_t *self, zlistx_t *endpoints)
{
    DIR *dir = opendir ("/proc/self/fd");
    if (!dir)
        return;
    struct dirent *entry;
    while ((entry = readdir (dir)) && self->listener_count < MAX_LISTENERS) {
        char *end;
        long fd = strtol (entry->d_name, &end, 10);
        if (*end || end == entry->d_name || fd < 0 || fd == dirfd (dir))
            continue;
        int listening = 0;
        socklen_t size = sizeof listening;
        if (getsockopt ((int) fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || !listening)
            continue;
        for (const char *endpoint = (const char *) zlistx_first (endpoints); endpoint;
             endpoint = (const char *) zlistx_next (endpoints)) {
            bool tcp = false;
            if (s_matches ((int) fd, endpoint, &tcp)) {
                //  The guard accepts from it too, so libzmq's accept may find it empty:
                //  non-blocking, that is EAGAIN (which libzmq takes in its stride), not an
                //  I/O thread blocked until the next client comes.
                int flags = fcntl ((int) fd, F_GETFL);
                if (flags == -1 || fcntl ((int) fd, F_SETFL, flags | O_NONBLOCK) == -1)
                    break;
                self->listeners[self->listener_count].fd = (int) fd;
                self->listeners[self->listener_count].tcp = tcp;
                self->listener_count++;
                break;
            }
        }
    }
    closedir (dir);
}

//  Accepts and closes whatever is queued on the listeners: those are refused. At EMFILE the
//  spare descriptor makes room for one at a time.
static void
s_refuse_queued (conn_guard_t *self)
{
    for (size_t i = 0; i < self->listener_count; i++) {
        int fd = self->listeners[i].fd;
        for (int n = 0; n < 1024; n++) {
            int peer = accept4 (fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (peer == -1 && (errno == EMFILE || errno == ENFILE) && self->spare_fd >= 0) {
                close (self->spare_fd);
                self->spare_fd = -1;
                peer = accept4 (fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            }
            if (peer == -1)
                break; //  EAGAIN: empty (libzmq may have taken some first)
            close (peer);
            self->refused++;
        }
    }
    if (self->spare_fd == -1)
        self->spare_fd = open ("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void
s_set_paused (conn_guard_t *self, bool paused)
{
    struct sock_filter drop_all[] = {BPF_STMT (BPF_RET | BPF_K, 0)};
    struct sock_fprog program = {1, drop_all};
    for (size_t i = 0; i < self->listener_count; i++) {
        if (!self->listeners[i].tcp)
            continue;
        int fd = self->listeners[i].fd;
        int rc = paused ? setsockopt (fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof program)
                        : setsockopt (fd, SOL_SOCKET, SO_DETACH_FILTER, &(int){0}, sizeof (int));
        if (rc != 0 && !(errno == ENOENT && !paused))
            kvp_warning ("api: cannot %s listener %d: %s", paused ? "pause" : "resume", fd,
                         strerror (errno));
    }
    self->paused = paused;
    if (paused) {
        s_refuse_queued (self);
        if (!self->warned)
            kvp_warning ("api: %zu client connections (limit %llu): refusing new ones until "
                         "fewer than %llu",
                         self->connections, (unsigned long long) self->limit,
                         (unsigned long long) self->low_mark);
        self->warned = true;
    }
    else {
        kvp_info ("api: %zu client connections: accepting new ones again", self->connections);
        self->warned = false;
    }
}

conn_guard_t *
conn_guard_new (zsock_t *router, zlistx_t *endpoints, uint64_t limit, const char *name)
{
    assert (router && endpoints);
    conn_guard_t *self = (conn_guard_t *) zmalloc (sizeof (conn_guard_t));
    self->router = router;
    //  More connections than descriptors allow would end in EMFILE, which libzmq's ipc
    //  listener does not survive (it asserts): the descriptor limit caps the setting.
    uint64_t ceiling = conn_guard_default_limit ();
    self->limit = limit && limit < ceiling ? limit : ceiling;
    if (limit > ceiling)
        kvp_info ("api: at most %llu client connections (the file descriptor limit less a "
                  "reserve), not %llu",
                  (unsigned long long) ceiling, (unsigned long long) limit);
    self->low_mark = self->limit - self->limit / 10;
    if (self->low_mark >= self->limit)
        self->low_mark = self->limit - 1;
    self->spare_fd = open ("/dev/null", O_RDONLY | O_CLOEXEC);
    self->readers = zhashx_new ();
    zhashx_set_destructor (self->readers, (zhashx_destructor_fn *) zstr_free);
    char endpoint[128];
    snprintf (endpoint, sizeof endpoint, "inproc://%s-conn-guard-%p", name ? name : "",
              (void *) self);
    int rc =
        zmq_socket_monitor (zsock_resolve (router), endpoint,
                            ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_ACCEPT_FAILED);
    if (rc == 0)
        self->monitor = zsock_new_pair (NULL);
    if (!self->monitor || zsock_connect (self->monitor, "%s", endpoint) != 0) {
        if (rc == 0)
            zmq_socket_monitor (zsock_resolve (router), NULL, 0);
        zsock_destroy (&self->monitor);
        if (self->spare_fd >= 0)
            close (self->spare_fd);
        zhashx_destroy (&self->readers);
        free (self);
        return NULL;
    }
    s_find_listeners (self, endpoints);
    return self;
}

void
conn_guard_destroy (conn_guard_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    conn_guard_t *self = *self_p;
    zmq_socket_monitor (zsock_resolve (self->router), NULL, 0);
    zsock_destroy (&self->monitor);
    if (self->paused)
        s_set_paused (self, false); //  the listeners outlive the guard
    if (self->spare_fd >= 0)
        close (self->spare_fd);
    if (self->overfull)
        kvp_info ("api: %llu client connections shut down for holding more than %llu bytes "
                  "of requests",
                  (unsigned long long) self->overfull, (unsigned long long) self->max_buffered);
    zhashx_destroy (&self->readers);
    free (self);
    *self_p = NULL;
}

void
conn_guard_set_max_buffered (conn_guard_t *self, uint64_t bytes)
{
    self->max_buffered = bytes;
}

void
conn_guard_read (conn_guard_t *self, int fd, uint64_t bytes, size_t frames)
{
    if (!self || !self->max_buffered || fd < 0)
        return;
    //  ipc connections are not counted, and cost no system call here (the same-machine
    //  path is the fast one). A tcp one is known by its cookie: the monitor's events come
    //  later than the messages, and a descriptor number may be a new connection's already.
    char name[16];
    snprintf (name, sizeof name, "%d", fd);
    reader_t *reader = (reader_t *) zhashx_lookup (self->readers, name);
    if (reader && reader->not_tcp)
        return;
    reader = s_reader (self, fd);
    if (reader)
        reader->read += bytes + (uint64_t) frames * FRAME_WIRE_BYTES;
}

size_t
conn_guard_sweep (conn_guard_t *self, int64_t now)
{
    if (!self || !self->max_buffered || now < self->next_sweep)
        return 0;
    self->next_sweep = now + CONN_GUARD_SWEEP_MS;
    size_t dropped = 0;
    for (reader_t *reader = (reader_t *) zhashx_first (self->readers); reader;
         reader = (reader_t *) zhashx_next (self->readers)) {
        if (reader->not_tcp || socket_cookie (reader->fd) != reader->cookie)
            continue; //  ipc, or closed (a new connection on its number starts anew)
        tcp_info_more_t info;
        socklen_t len = sizeof info;
        memset (&info, 0, sizeof info);
        if (getsockopt (reader->fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 || len < sizeof info) {
            reader->not_tcp = true;
            continue;
        }
        uint64_t received = info.bytes_received;
        uint64_t held = received > reader->read + WIRE_SLACK_BYTES
                            ? received - reader->read - WIRE_SLACK_BYTES
                            : 0;
        if (held > self->max_buffered) {
            kvp_warning ("api: a client connection sent %llu bytes libzmq holds unread (more "
                         "than one request may be, %llu): closing it",
                         (unsigned long long) held, (unsigned long long) self->max_buffered);
            shutdown (reader->fd, SHUT_RDWR);
            reader->not_tcp = true; //  once
            self->overfull++;
            dropped++;
        }
    }
    return dropped;
}

uint64_t
conn_guard_overfull (conn_guard_t *self)
{
    return self ? self->overfull : 0;
}

zsock_t *
conn_guard_socket (conn_guard_t *self)
{
    assert (self);
    return self->monitor;
}

int
conn_guard_handle (conn_guard_t *self)
{
    assert (self);
    bool failed = false;
    //  Connections past the limit, to be shut down after the batch: one that closes within
    //  the batch is left alone, as its descriptor may already be another socket's.
    int refuse[REFUSE_BATCH];
    size_t refusing = 0;
    while (zsock_events (self->monitor) & ZMQ_POLLIN) {
        zmsg_t *msg = zmsg_recv (self->monitor);
        if (!msg)
            return -1;
        zframe_t *head = zmsg_first (msg);
        if (head && zframe_size (head) >= 6) {
            uint16_t event;
            uint32_t value; //  the connection's descriptor, or accept's errno
            memcpy (&event, zframe_data (head), 2);
            memcpy (&value, zframe_data (head) + 2, 4);
            if (event == ZMQ_EVENT_ACCEPTED) {
                self->connections++;
                if (self->max_buffered)
                    s_reader (self, (int) value);
                if (self->paused || self->connections > self->limit) {
                    if (refusing < REFUSE_BATCH)
                        refuse[refusing++] = (int) value;
                    else
                        shutdown ((int) value, SHUT_RDWR);
                }
            }
            else if (event == ZMQ_EVENT_DISCONNECTED) {
                if (self->connections > 0)
                    self->connections--;
                //  Forgotten unless its number is another connection's by now (the api
                //  may have read from that one before this event came).
                char name[16];
                snprintf (name, sizeof name, "%d", (int) value);
                reader_t *reader = (reader_t *) zhashx_lookup (self->readers, name);
                if (reader && socket_cookie ((int) value) != reader->cookie)
                    zhashx_delete (self->readers, name);
                for (size_t i = 0; i < refusing; i++)
                    if (refuse[i] == (int) value)
                        refuse[i--] = refuse[--refusing];
            }
            else if (event == ZMQ_EVENT_ACCEPT_FAILED && (value == EMFILE || value == ENFILE)) {
                self->accept_failures++;
                failed = true;
            }
        }
        zmsg_destroy (&msg);
    }
    //  Accepted past the limit (an ipc listener is never paused; a tcp one may have had
    //  some queued): shut down, libzmq sees the end and closes it.
    for (size_t i = 0; i < refusing; i++)
        if (shutdown (refuse[i], SHUT_RDWR) == 0)
            self->refused++;
    if (failed) {
        //  Out of descriptors before the limit (other files in use): refuse from here on,
        //  and take the queue libzmq spins on.
        if (!self->paused && self->connections > 0) {
            self->limit = self->connections;
            self->low_mark = self->limit - self->limit / 10;
            if (self->low_mark >= self->limit)
                self->low_mark = self->limit - 1;
        }
        if (!self->paused)
            s_set_paused (self, true);
        else
            s_refuse_queued (self);
    }
    else if (!self->paused && self->connections >= self->limit)
        s_set_paused (self, true);
    else if (self->paused && self->connections < self->low_mark)
        s_set_paused (self, false);
    return 0;
}

size_t
conn_guard_connections (conn_guard_t *self)
{
    assert (self);
    return self->connections;
}

bool
conn_guard_paused (conn_guard_t *self)
{
    assert (self);
    return self->paused;
}

uint64_t
conn_guard_limit (conn_guard_t *self)
{
    assert (self);
    return self->limit;
}

//  --------------------------------------------------------------------------
//  Self test

//  Reads the guard's events for up to timeout_ms, until connections reach want.
static void
s_settle (conn_guard_t *guard, size_t want, int timeout_ms)
{
    int64_t deadline = zclock_mono () + timeout_ms;
    while (zclock_mono () < deadline) {
        if (zsock_events (conn_guard_socket (guard)) & ZMQ_POLLIN)
            conn_guard_handle (guard);
        else if (conn_guard_connections (guard) == want)
            break;
        else
            zclock_sleep (5);
    }
}

//  A DEALER that sent "ping" through router and got the echo.
static bool
s_round_trip (zsock_t *router, zsock_t *dealer)
{
    zsock_set_rcvtimeo (router, 2000);
    zsock_set_rcvtimeo (dealer, 2000);
    if (zstr_send (dealer, "ping") != 0)
        return false;
    zmsg_t *msg = zmsg_recv (router);
    if (!msg)
        return false;
    zmsg_send (&msg, router);
    char *echo = zstr_recv (dealer);
    bool ok = echo && streq (echo, "ping");
    zstr_free (&echo);
    return ok;
}

void
conn_guard_test (bool verbose)
{
    if (verbose)
        printf (" * conn_guard: ");
    assert (conn_guard_default_limit () >= 1);
    assert (conn_guard_raise_fd_limit () >= 64);

    zsock_t *router = zsock_new (ZMQ_ROUTER);
    assert (router);
    int port = zsock_bind (router, "tcp://127.0.0.1:*");
    assert (port > 0);
    char ipc[64];
    snprintf (ipc, sizeof ipc, "ipc://@kvpool-conn-guard-test-%d", (int) getpid ());
    assert (zsock_bind (router, "%s", ipc) == 0);
    zlistx_t *endpoints = zlistx_new ();
    zlistx_set_duplicator (endpoints, (zlistx_duplicator_fn *) strdup);
    zlistx_set_destructor (endpoints, (zlistx_destructor_fn *) zstr_free);
    char tcp[64];
    snprintf (tcp, sizeof tcp, "tcp://127.0.0.1:%d", port);
    zlistx_add_end (endpoints, tcp);
    zlistx_add_end (endpoints, ipc);

    conn_guard_t *guard = conn_guard_new (router, endpoints, 4, "test");
    assert (guard);
    assert (guard->listener_count == 2);
    assert (conn_guard_limit (guard) == 4 && !conn_guard_paused (guard));

    //  Up to the limit: all served; the guard pauses at the fourth.
    zsock_t *clients[6] = {NULL};
    for (int i = 0; i < 4; i++) {
        clients[i] = zsock_new_dealer (i == 3 ? ipc : tcp);
        assert (clients[i] && s_round_trip (router, clients[i]));
    }
    s_settle (guard, 4, 2000);
    assert (conn_guard_connections (guard) == 4 && conn_guard_paused (guard));

    //  Over it: a tcp client gets no connection, the ones in keep being served.
    clients[4] = zsock_new_dealer (tcp);
    assert (clients[4]);
    zsock_set_sndtimeo (clients[4], 0);
    zstr_send (clients[4], "ping");
    zsock_set_rcvtimeo (router, 300);
    zmsg_t *none = zmsg_recv (router);
    assert (none == NULL);
    s_settle (guard, 4, 200);
    assert (conn_guard_connections (guard) == 4);
    for (int i = 0; i < 4; i++)
        assert (s_round_trip (router, clients[i]));

    //  Under the low mark (3 of 4): new connections again, the waiting one gets in.
    zsock_destroy (&clients[0]);
    zsock_destroy (&clients[1]);
    s_settle (guard, 2, 2000);
    assert (!conn_guard_paused (guard));
    zsock_set_rcvtimeo (router, 5000);
    zmsg_t *late = zmsg_recv (router); //  the "ping" sent while paused (SYN retried)
    assert (late);
    zmsg_send (&late, router);
    char *echo = zstr_recv (clients[4]);
    assert (echo && streq (echo, "ping"));
    zstr_free (&echo);
    s_settle (guard, 3, 2000);
    assert (conn_guard_connections (guard) == 3);

    for (int i = 0; i < 6; i++)
        zsock_destroy (&clients[i]);
    s_settle (guard, 0, 2000); //  (two more must not pass the limit of 4)
    assert (conn_guard_connections (guard) == 0 && !conn_guard_paused (guard));

    //  Request bytes held in libzmq: a connection that sent more than the bound unread is
    //  shut down; one whose messages the owner reads is not.
    conn_guard_set_max_buffered (guard, 1 << 20);
    zsock_t *reader = zsock_new_dealer (tcp), *flooder = zsock_new_dealer (tcp);
    assert (reader && flooder);
    zsock_set_rcvtimeo (router, 2000);
    for (int i = 0; i < 8; i++) { //  8 x 256 KiB, each read
        zframe_t *frame = zframe_new (NULL, 256 << 10);
        zframe_send (&frame, reader, 0);
        zmsg_t *msg = zmsg_recv (router);
        assert (msg);
        const char *fd = zframe_meta (zmsg_last (msg), "__fd");
        conn_guard_read (guard, fd ? atoi (fd) : -1, zmsg_content_size (msg), zmsg_size (msg));
        zmsg_destroy (&msg);
    }
    zsock_t *watch = zsock_new (ZMQ_PAIR);
    assert (zmq_socket_monitor (zsock_resolve (flooder), "inproc://conn-guard-test-flood",
                                ZMQ_EVENT_DISCONNECTED)
            == 0);
    assert (zsock_connect (watch, "inproc://conn-guard-test-flood") == 0);
    zmsg_t *flood = zmsg_new ();
    for (int i = 0; i < 8; i++) //  one message of 8 x 256 KiB, never read
        zmsg_append (flood, &(zframe_t *){zframe_new (NULL, 256 << 10)});
    zmsg_send (&flood, flooder);
    size_t dropped = 0;
    int64_t deadline = zclock_mono () + 5000;
    while (dropped == 0 && zclock_mono () < deadline) {
        conn_guard_handle (guard);
        dropped = conn_guard_sweep (guard, zclock_mono ());
        zclock_sleep (10);
    }
    assert (dropped == 1 && conn_guard_overfull (guard) == 1);
    zsock_set_rcvtimeo (watch, 2000);
    zmsg_t *event = zmsg_recv (watch); //  the flooder saw its connection end
    assert (event);
    zmsg_destroy (&event);
    assert (conn_guard_sweep (guard, zclock_mono () + CONN_GUARD_SWEEP_MS) == 0);
    zframe_t *frame = zframe_new ("still", 5);
    zframe_send (&frame, reader, 0);
    //  (The flood, whole before the shutdown, may still be queued at the router.)
    bool served = false;
    zmsg_t *still;
    while (!served && (still = zmsg_recv (router))) {
        served = zframe_streq (zmsg_last (still), "still");
        zmsg_destroy (&still);
    }
    assert (served);
    zmq_socket_monitor (zsock_resolve (flooder), NULL, 0);
    zsock_destroy (&watch);
    zsock_destroy (&reader);
    zsock_destroy (&flooder);

    conn_guard_destroy (&guard);
    assert (guard == NULL);
    conn_guard_destroy (&guard);
    zlistx_destroy (&endpoints);
    zsock_destroy (&router);
    if (verbose)
        printf ("OK\n");
}
