/*  connections.c - unread reply bytes per client connection (see connections.h).

    DESIGN
    The table maps a routing id (hex) to a connection_t. A connection is reference counted:
    one reference for the table, one for each reply whose frames libzmq still holds, so the
    api can forget a connection while the I/O thread still releases its last frames.

    A reply's frames share one reply_frames_t. Its `held` count starts at the number of slots
    plus one for the api, so a callback that comes while the api is still queueing later
    frames never frees the block under it; reply_frames_done gives back the api's share and
    the unused slots at once.

    A descriptor is shut down only if its socket cookie (SO_COOKIE, unique per socket for the
    life of the system) is the one seen when the connection was first met.
*/
#include "infra/socket_cookie.h"
#include "actors/connections.h"

#include "infra/log.h"

#include <czmq.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "actors/replica_manager.h"

//  A connection with nothing unread is forgotten after this long without a GET.
#define CONNECTION_IDLE_MS 60000

struct _connection_t {
    atomic_uint_fast64_t unread; //  bytes queued in libzmq (any thread)
    atomic_int refs;             //  the table's + one per live reply_frames_t
    int fd;
    uint64_t cookie; //  SO_COOKIE of fd when first seen (0: unknown, never shut down)
    int64_t over_since;
    int64_t last_used;
};

typedef struct {
    reply_frames_t *frames;
    kvp_object_t *object;
    void *buffer;
    void (*buffer_free) (void *buffer);
    uint64_t size;
} slot_t;

struct _reply_frames_t {
    connection_t *connection;
    atomic_size_t held;
    size_t count;
    slot_t slots[];
};

//  Reply blocks libzmq still holds frames of, in the whole process.
static atomic_size_t s_frames_out;

struct _connections_t {
    zhashx_t *table; //  hex routing id -> connection_t
    uint64_t max_unread;
};

static void
s_connection_release (connection_t *connection)
{
    if (atomic_fetch_sub_explicit (&connection->refs, 1, memory_order_acq_rel) == 1)
        free (connection);
}

static void
s_table_free (void **item)
{
    if (*item)
        s_connection_release ((connection_t *) *item);
    *item = NULL;
}

connections_t *
connections_new (uint64_t max_unread_bytes)
{
    connections_t *self = (connections_t *) zmalloc (sizeof (connections_t));
    self->table = zhashx_new ();
    zhashx_set_destructor (self->table, s_table_free);
    self->max_unread = max_unread_bytes;
    return self;
}

void
connections_destroy (connections_t **self_p)
{
    connections_t *self = *self_p;
    if (!self)
        return;
    zhashx_destroy (&self->table);
    free (self);
    *self_p = NULL;
}

connection_t *
connections_get (connections_t *self, const void *routing_id, size_t size, int fd)
{
    char key[2 * 256 + 1];
    if (size > 256)
        size = 256;
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < size; i++) {
        key[2 * i] = hex[((const uint8_t *) routing_id)[i] >> 4];
        key[2 * i + 1] = hex[((const uint8_t *) routing_id)[i] & 15];
    }
    key[2 * size] = 0;
    connection_t *connection = (connection_t *) zhashx_lookup (self->table, key);
    if (!connection) {
        connection = (connection_t *) zmalloc (sizeof (connection_t));
        atomic_init (&connection->unread, 0);
        atomic_init (&connection->refs, 1);
        connection->fd = -1;
        zhashx_insert (self->table, key, connection);
    }
    if (fd != connection->fd) {
        connection->fd = fd;
        connection->cookie = socket_cookie (fd);
    }
    connection->last_used = zclock_mono ();
    return connection;
}

uint64_t
connection_unread (connection_t *connection)
{
    return atomic_load_explicit (&connection->unread, memory_order_relaxed);
}

bool
connection_over (connections_t *self, connection_t *connection)
{
    return connection_unread (connection) > self->max_unread;
}

reply_frames_t *
reply_frames_new (connection_t *connection, size_t count)
{
    reply_frames_t *self =
        (reply_frames_t *) malloc (sizeof (reply_frames_t) + count * sizeof (slot_t));
    if (!self)
        return NULL;
    self->connection = connection;
    atomic_fetch_add_explicit (&connection->refs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit (&s_frames_out, 1, memory_order_relaxed);
    atomic_init (&self->held, count + 1);
    self->count = count;
    return self;
}

static void
s_frames_release (reply_frames_t *self, size_t n)
{
    if (atomic_fetch_sub_explicit (&self->held, n, memory_order_acq_rel) == n) {
        s_connection_release (self->connection);
        free (self);
        atomic_fetch_sub_explicit (&s_frames_out, 1, memory_order_release);
    }
}

void *
reply_frames_slot (reply_frames_t *self, size_t i, kvp_object_t *object, void *buffer,
                   void (*buffer_free) (void *), uint64_t size)
{
    assert (i < self->count);
    slot_t *slot = &self->slots[i];
    slot->frames = self;
    slot->object = object;
    slot->buffer = buffer;
    slot->buffer_free = buffer_free;
    slot->size = size;
    atomic_fetch_add_explicit (&self->connection->unread, size, memory_order_relaxed);
    return slot;
}

void
reply_frames_done (reply_frames_t **self_p, size_t used)
{
    reply_frames_t *self = *self_p;
    if (!self)
        return;
    *self_p = NULL;
    s_frames_release (self, self->count - used + 1);
}

void
connections_frame_sent (void *data, void *hint)
{
    (void) data;
    slot_t *slot = (slot_t *) hint;
    reply_frames_t *frames = slot->frames;
    if (slot->object)
        kvp_object_unpin (slot->object);
    if (slot->buffer_free)
        slot->buffer_free (slot->buffer);
    else
        free (slot->buffer);
    atomic_fetch_sub_explicit (&frames->connection->unread, slot->size, memory_order_relaxed);
    s_frames_release (frames, 1);
}

bool
connections_wait_released (int timeout_ms)
{
    int64_t deadline = zclock_mono () + timeout_ms;
    while (atomic_load_explicit (&s_frames_out, memory_order_acquire) > 0) {
        if (zclock_mono () >= deadline)
            return false;
        zclock_sleep (1);
    }
    return true;
}

void
connections_shutdown_all (connections_t *self)
{
    for (connection_t *connection = (connection_t *) zhashx_first (self->table); connection;
         connection = (connection_t *) zhashx_next (self->table))
        if (connection_unread (connection))
            socket_shutdown_if (connection->fd, connection->cookie);
}

size_t
connections_sweep (connections_t *self, int64_t now)
{
    size_t dropped = 0;
    zlistx_t *idle = zlistx_new ();
    zlistx_set_destructor (idle, (zlistx_destructor_fn *) zstr_free);
    for (connection_t *connection = (connection_t *) zhashx_first (self->table); connection;
         connection = (connection_t *) zhashx_next (self->table)) {
        uint64_t unread = connection_unread (connection);
        if (unread > self->max_unread) {
            if (!connection->over_since)
                connection->over_since = now;
            else if (now - connection->over_since >= CONNECTION_DROP_MS
                     && socket_shutdown_if (connection->fd, connection->cookie)) {
                kvp_warning ("api: a client left %llu bytes of replies unread for %d s: "
                             "closing its connection",
                             (unsigned long long) unread, CONNECTION_DROP_MS / 1000);
                connection->over_since = now;
                dropped++;
            }
        }
        else
            connection->over_since = 0;
        if (unread == 0 && now - connection->last_used > CONNECTION_IDLE_MS)
            zlistx_add_end (idle, strdup ((const char *) zhashx_cursor (self->table)));
    }
    for (char *key = (char *) zlistx_first (idle); key; key = (char *) zlistx_next (idle))
        zhashx_delete (self->table, key);
    zlistx_destroy (&idle);
    return dropped;
}

//  ---- self test ---------------------------------------------------------------------

void
connections_test (bool verbose)
{
    connections_t *connections = connections_new (1000);
    connection_t *a = connections_get (connections, "\0abcd", 5, -1);
    assert (a == connections_get (connections, "\0abcd", 5, -1));
    connection_t *b = connections_get (connections, "\0abce", 5, -1);
    assert (a != b);

    //  Frames count as unread until libzmq lets go of them, in any order.
    reply_frames_t *frames = reply_frames_new (a, 3);
    void *one = reply_frames_slot (frames, 0, NULL, malloc (600), NULL, 600);
    void *two = reply_frames_slot (frames, 1, NULL, NULL, NULL, 500);
    assert (connection_unread (a) == 1100 && connection_over (connections, a));
    connections_frame_sent (NULL, one); //  before the api is done: the block stays
    assert (connection_unread (a) == 500 && !connection_over (connections, a));
    reply_frames_done (&frames, 2);
    assert (frames == NULL);
    connections_frame_sent (NULL, two); //  the last one frees the block
    assert (connection_unread (a) == 0);

    //  A connection the table forgets lives on until its last frame is released.
    frames = reply_frames_new (b, 1);
    void *last = reply_frames_slot (frames, 0, NULL, NULL, NULL, 10);
    reply_frames_done (&frames, 1);
    connections_destroy (&connections);
    connections_frame_sent (NULL, last);

    //  A socket past the limit for CONNECTION_DROP_MS is shut down; only that socket.
    int pair[2];
    assert (socketpair (AF_UNIX, SOCK_STREAM, 0, pair) == 0);
    connections = connections_new (100);
    connection_t *slow = connections_get (connections, "slow", 4, pair[0]);
    frames = reply_frames_new (slow, 1);
    last = reply_frames_slot (frames, 0, NULL, NULL, NULL, 1000);
    reply_frames_done (&frames, 1);
    int64_t now = zclock_mono ();
    assert (connections_sweep (connections, now) == 0);
    assert (connections_sweep (connections, now + CONNECTION_DROP_MS - 1) == 0);
    assert (connections_sweep (connections, now + CONNECTION_DROP_MS) == 1);
    char byte;
    assert (recv (pair[1], &byte, 1, 0) == 0); //  the peer sees the end
    connections_frame_sent (NULL, last);
    assert (connections_sweep (connections, now + 2 * CONNECTION_DROP_MS) == 0);
    connections_destroy (&connections);
    close (pair[0]);
    close (pair[1]);
    if (verbose)
        printf ("unread bytes, late releases, shutdown of a slow reader ");
}
