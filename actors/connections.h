/*  connections.h - the api's account of reply bytes each client connection has not read.

    A GET reply is queued in libzmq until the client reads it, and its values stay pinned
    (zero copy) or allocated (copies) until then. A client that sends GETs and never reads
    the replies would hold the pool's memory for as long as it stays connected, forced
    removes or not. So every value frame of a reply is counted against its connection, from
    the moment it is queued to the moment libzmq lets go of it (its free callback, on
    libzmq's I/O thread). Past --max-unread-bytes a connection's new GETs are refused; if it
    stays past the limit for CONNECTION_DROP_MS the api shuts its socket down, which makes
    libzmq drop everything queued for it: the pins and copies are released, and a client
    that is merely slow reconnects.

    A connection is known by its ROUTER routing id; the socket's descriptor comes with each
    message (ZMQ_SRCFD). Before shutting a descriptor down the api checks it still leads to
    the same peer address, so a descriptor number reused by another connection is never hit.

    Threads: the api actor's, except connections_frame_sent (any thread: libzmq's I/O thread).
    Shared state: each connection's byte count and reference count, both atomic.
*/
#ifndef CONNECTIONS_H_INCLUDED
#define CONNECTIONS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "messages/kvp_job.h"

typedef struct _connections_t connections_t;
typedef struct _connection_t connection_t;
typedef struct _reply_frames_t reply_frames_t;

//  How long a connection may stay past the unread limit before it is shut down.
#define CONNECTION_DROP_MS 10000

connections_t *connections_new (uint64_t max_unread_bytes);
//  Destroys the table; connections with frames still held by libzmq are freed by the last
//  frame's callback.
void connections_destroy (connections_t **self_p);

//  The connection with this routing id (made on first use); fd is the socket it came on.
connection_t *connections_get (connections_t *self, const void *routing_id, size_t size, int fd);

//  Bytes of replies queued for the connection and not yet read.
uint64_t connection_unread (connection_t *connection);
//  True when the connection may not be sent more values (its unread bytes passed the limit).
bool connection_over (connections_t *self, connection_t *connection);

//  A reply's value frames: count slots, each for one frame. Frame i is handed to libzmq with
//  zmq_msg_init_data (data, size, connections_frame_sent, reply_frames_slot (frames, i)).
reply_frames_t *reply_frames_new (connection_t *connection, size_t count);
//  Records what slot i releases when its frame is done: the object's pin (object may be
//  NULL) and the buffer to free (NULL for a zero-copy frame of segment memory) with
//  buffer_free (NULL: free()); counts size as unread.
void *reply_frames_slot (reply_frames_t *self, size_t i, kvp_object_t *object, void *buffer,
                         void (*buffer_free) (void *), uint64_t size);
//  Gives up the slots never used (count - used of them); frees the whole when none is held.
void reply_frames_done (reply_frames_t **self_p, size_t used);

//  libzmq's free callback for a value frame (hint: a slot).
void connections_frame_sent (void *data, void *hint);

//  Waits up to timeout_ms until libzmq has let go of every value frame of this process (after
//  the api closed its socket: the pins they hold must end before the objects do). Returns
//  true if none is left.
bool connections_wait_released (int timeout_ms);

//  Shuts down every connection that has reply frames queued (the node is stopping).
void connections_shutdown_all (connections_t *self);

//  Shuts down connections past the limit for longer than CONNECTION_DROP_MS and forgets idle
//  ones. Returns the number shut down.
size_t connections_sweep (connections_t *self, int64_t now);

void connections_test (bool verbose);

#endif
