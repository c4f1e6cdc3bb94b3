/*  index_reads.h - small reads the api actor answers itself, from the read index.

    The replica-manager publishes every committed object it can in the same-machine read
    index (shm/shm_index.h) for clients on the node's machine. The api reads it too: a
    GET whose values are all published and small, or an EXIST or GET_SIZE whose keys are all
    published, is answered without the hop to the replica-manager and back, two thread
    wake-ups that are most of a small request's time inside the node. Values are copied out
    of the api's own mappings of the segments (segment_table) and kept only if the index
    slot did not change during the copy, as a same-machine client does. Everything else
    takes the usual route: a key the index lacks (it is lossy, so a miss proves nothing), a
    large value (sent zero-copy, pinned by the replica-manager), a segment not mapped yet.

    Each read still grants its object a lease, as one through the replica-manager would,
    without a message: confirming a key's slot after the copy leaves the time of the read in
    the slot's read stamp (shm_index_confirm), which the replica-manager looks at when it
    decides whether the object may be removed. The stamp is written before the reply is
    sent, so a remove that follows a read finds its lease.

    Threads: the api's.
*/
#ifndef INDEX_READS_H_INCLUDED
#define INDEX_READS_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>

#include "messages/kvp_job.h"

//  A value at most this large is copied out of the index by the api...
#define INDEX_READ_VALUE_MAX (64u << 10)
//  ... and a request at most this many bytes in all (a longer copy would hold up the api).
#define INDEX_READ_REQUEST_MAX (256u << 10)
//  Reads of values for more keys take the usual route: the hop saved is small beside their
//  copies, and the api would do the lookups that the replica-manager then does again.
#define INDEX_READ_KEYS_MAX 256
//  Reads without values (EXIST, GET_SIZE) are lookups only: the index answers up to this
//  many keys (an engine asks about a thousand at a time), about 20 ns a key with the slots
//  loaded ahead, where the hop and the replica-manager's own lookups cost more. A key the
//  index lacks ends the attempt there (the first miss sends the request the usual way).
#define INDEX_CHECK_KEYS_MAX 4096

typedef struct _index_reads_t index_reads_t;

//  Reads the index named index_name (opened on first use, as the replica-manager creates
//  it). Caller owns the return value.
index_reads_t *index_reads_new (const char *index_name);

//  Does nothing on NULL; sets *self_p to NULL.
void index_reads_destroy (index_reads_t **self_p);

//  Brings the segment mappings in step with a listing of the node's segments.
void index_reads_segments (index_reads_t *self, const kvp_segment_info_t *segments, size_t count);

//  Tries to answer job (op GET, EXIST or GET_SIZE, items built from the request) from the
//  index. On true every item has status OK and its size, and for a GET values[i] holds item
//  i's bytes (the caller sends or closes them; values has room for job->count messages);
//  every key's read is stamped. On false nothing changed (but stamps of keys whose read did
//  hold: they were read).
bool index_reads_serve (index_reads_t *self, kvp_job_t *job, zmq_msg_t *values);

//  Marks the items of a PUT whose key the index shows OBJECT_ALREADY_EXISTS (objects are
//  immutable), so that no space is placed and no byte copied for them. A key the index
//  lacks may still exist: the replica-manager's insert decides then.
void index_reads_refuse_existing (index_reads_t *self, kvp_job_t *job);

//  Keys of the GETs answered since the start (each is a get and a hit in the stats).
uint64_t index_reads_gets (index_reads_t *self);
//  Of those, the reads of hot-cache copies (shm_index.h).
uint64_t index_reads_cache_hits (index_reads_t *self);

void index_reads_test (bool verbose);

#endif
