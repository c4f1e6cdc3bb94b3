/*  sink.h - where a get's bytes land: the one thing the get shapes of include/kvpool.h
    differ in. Above batch.h; the resolver (resolve.h) hands a sink to the layer that moves
    the bytes (the fast path, the socket operations), which lands each key's value in it.

      into buffers   a scatter list per key (kvpool_get_into, kvpool_get_batch_into*), each
                     key's range from an offset when offsets are given (kvpool_get_range*)
      malloc'd       one buffer per key, allocated here (kvpool_get); the caller owns it
      frames         the received frame itself, moved out without a copy (kvpool_get_batch)

    Every array is indexed by the caller's index (kvpc_keys_t.index).
*/
#ifndef KVPC_SINK_H_INCLUDED
#define KVPC_SINK_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>

#include "client/batch.h"

typedef enum { KVPC_SINK_BUFFERS, KVPC_SINK_MALLOC, KVPC_SINK_FRAMES } kvpc_sink_kind_t;

typedef struct {
    kvpc_sink_kind_t kind;
    const kvpool_buf_t *const *bufs; //  BUFFERS: each key's scatter list
    const size_t *nbufs;
    const uint64_t *offsets; //  BUFFERS: each key's range start, or NULL for whole values
    void **data;             //  MALLOC: each key's buffer (NULL until it lands)
    size_t *sizes;           //  MALLOC: its size
    zmq_msg_t *frames;       //  FRAMES: each key's frame (initialised by the caller)
    //  Any kind, or NULL: each key's version as the node that sent its bytes named it (0:
    //  none named), written when the key lands (the process's hot cache keeps it).
    uint64_t *versions;
    //  Any kind, or NULL: the only version of each key to read (0: any), as a REDIRECT named
    //  it; a holder with another, or whose lease from its master ended, answers not found.
    const uint64_t *expect;
} kvpc_sink_t;

//  A sink of the caller's buffers (offsets: NULL, or one range start a key).
kvpc_sink_t kvpc_sink_buffers (const kvpool_buf_t *const *bufs, const size_t *nbufs,
                               const uint64_t *offsets);
kvpc_sink_t kvpc_sink_malloc (void **data, size_t *sizes);
kvpc_sink_t kvpc_sink_frames (zmq_msg_t *frames);

//  Whether the fast path may fill it straight from the node's shared memory: whole values
//  into the caller's buffers. (A range, a malloc'd copy and a frame are the node's to cut
//  and to send.)
bool kvpc_sink_takes_shared (const kvpc_sink_t *self);
//  Whether the node may send the key elsewhere (a REDIRECT): only whole values, which can be
//  verified against their checksum.
bool kvpc_sink_takes_redirect (const kvpc_sink_t *self);
//  The most bytes key i's value may bring (what a request's size is bounded by: batch.h's
//  chunks); 0 when the sink does not bound it.
uint64_t kvpc_sink_bytes (const kvpc_sink_t *self, size_t i);
//  Lands key i's received value, frame: in the caller's buffers (a copy listed in copies,
//  which the caller runs), in a malloc'd buffer, or moved into the caller's frame. Returns
//  the size landed, or BUFFER_OVERFLOW (the buffers are too small: nothing lands) or
//  INTERNAL_ERROR (out of memory).
int64_t kvpc_sink_land (const kvpc_sink_t *self, size_t i, zmq_msg_t *frame, kvpc_copies_t *copies);
//  Where key i's landed value (size bytes) can be read back in one piece: the malloc'd
//  buffer or the frame, or, for the caller's buffers, a copy gathered into scratch (at least
//  size bytes; NULL: none is made). NULL when it cannot be read here.
const void *kvpc_sink_landed (const kvpc_sink_t *self, size_t i, size_t size, void *scratch);

#endif
