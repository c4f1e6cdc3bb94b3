/*  sink.c - where a get's bytes land (sink.h).

    Landing is the last step of every get, whichever source served the key: the socket
    operations land received frames here; the fast path fills the caller's buffers itself,
    and only where kvpc_sink_takes_shared says it may.
*/
#include "client/sink.h"

#include <stdlib.h>
#include <string.h>

kvpc_sink_t
kvpc_sink_buffers (const kvpool_buf_t *const *bufs, const size_t *nbufs, const uint64_t *offsets)
{
    return (kvpc_sink_t){
        .kind = KVPC_SINK_BUFFERS, .bufs = bufs, .nbufs = nbufs, .offsets = offsets};
}

kvpc_sink_t
kvpc_sink_malloc (void **data, size_t *sizes)
{
    return (kvpc_sink_t){.kind = KVPC_SINK_MALLOC, .data = data, .sizes = sizes};
}

kvpc_sink_t
kvpc_sink_frames (zmq_msg_t *frames)
{
    return (kvpc_sink_t){.kind = KVPC_SINK_FRAMES, .frames = frames};
}

bool
kvpc_sink_takes_shared (const kvpc_sink_t *self)
{
    return self->kind == KVPC_SINK_BUFFERS && !self->offsets;
}

bool
kvpc_sink_takes_redirect (const kvpc_sink_t *self)
{
    return self->kind != KVPC_SINK_BUFFERS || !self->offsets;
}

uint64_t
kvpc_sink_bytes (const kvpc_sink_t *self, size_t i)
{
    return self->kind == KVPC_SINK_BUFFERS ? kvpc_bufs_capacity (self->bufs[i], self->nbufs[i]) : 0;
}

int64_t
kvpc_sink_land (const kvpc_sink_t *self, size_t i, zmq_msg_t *frame, kvpc_copies_t *copies)
{
    size_t size = zmq_msg_size (frame);
    switch (self->kind) {
        case KVPC_SINK_BUFFERS:
            if (kvpc_bufs_capacity (self->bufs[i], self->nbufs[i]) < size)
                return KVPOOL_BUFFER_OVERFLOW;
            if (kvpc_copies_scatter (copies, zmq_msg_data (frame), size, self->bufs[i],
                                     self->nbufs[i]))
                return KVPOOL_INTERNAL_ERROR;
            break;
        case KVPC_SINK_MALLOC: {
            void *data = malloc (size ? size : 1);
            if (!data)
                return KVPOOL_INTERNAL_ERROR;
            memcpy (data, zmq_msg_data (frame), size);
            self->data[i] = data;
            self->sizes[i] = size;
            break;
        }
        case KVPC_SINK_FRAMES:
            //  The frame moves out: no byte is copied.
            zmq_msg_move (&self->frames[i], frame);
            break;
    }
    return (int64_t) size;
}

const void *
kvpc_sink_landed (const kvpc_sink_t *self, size_t i, size_t size, void *scratch)
{
    switch (self->kind) {
        case KVPC_SINK_MALLOC: return self->sizes[i] == size ? self->data[i] : NULL;
        case KVPC_SINK_FRAMES:
            return zmq_msg_size (&self->frames[i]) == size ? zmq_msg_data (&self->frames[i]) : NULL;
        case KVPC_SINK_BUFFERS: break;
    }
    if (!scratch || self->offsets)
        return NULL;
    char *to = scratch;
    size_t left = size;
    for (size_t b = 0; b < self->nbufs[i] && left; b++) {
        size_t take = self->bufs[i][b].size < left ? self->bufs[i][b].size : left;
        memcpy (to, self->bufs[i][b].data, take);
        to += take;
        left -= take;
    }
    return left ? NULL : scratch;
}
