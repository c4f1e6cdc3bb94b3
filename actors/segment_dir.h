/*  segment_dir.h - a node's segments kept as files in a directory (--segment-dir), and the
    adoption of the objects a previous run left in them.

    DIR/LOCK             flock(LOCK_EX) while a node uses the directory
    DIR/segment-<i>      the node's segment i, a file mapped MAP_SHARED; kept when it stops
    DIR/segment-<i>.old  a previous run's segment i while its objects are being adopted
    DIR/objects.log      what the segments hold (tier/object_log.h), written by the
                         replica-manager

    Used by the allocator at start: open (lock, read the log, move the previous files aside),
    create the new segments (segment_dir_path), adopt (each verified object is copied into
    the new segments through the allocator's own placement, the old pages given back as it
    goes, the old files unlinked), then the allocator commits the new segments' pages and
    hands the adopted objects to the replica-manager (KVP_RM_ADOPT).

    Threads: one (the allocator's, during its start).
*/
#ifndef SEGMENT_DIR_H_INCLUDED
#define SEGMENT_DIR_H_INCLUDED

#include <czmq.h>

#include "messages/kvp_job.h"

typedef struct _segment_dir_t segment_dir_t;

//  Places size bytes for an adopted object, in the new segment of index hint if it has room,
//  else in another; fills replica (segment id, offset, address). Returns 0 or -1 (no room).
typedef int (segment_dir_place_fn) (void *arg, uint64_t size, uint32_t hint,
                                    kvp_replica_t *replica);

//  Opens dir (made if missing), locks it, reads its log and moves the previous run's
//  segment files aside. Returns NULL with a one-line reason (another node holds the
//  directory, it cannot be made or read). Caller owns the return value.
segment_dir_t *segment_dir_open (const char *dir, char *reason, size_t reason_size);

//  The path of segment index in the directory.
void segment_dir_path (segment_dir_t *self, uint32_t index, char *buf, size_t buf_size);

//  Adopts the previous run's objects: each live record whose value verifies is placed (place,
//  arg) and copied, and appended to job (owned key, size, one replica, checksum); what does
//  not verify, fit or exist is dropped and counted. The old files are unlinked. Logs one
//  summary line. Returns the number of objects adopted.
size_t segment_dir_adopt (segment_dir_t *self, segment_dir_place_fn *place, void *arg,
                          kvp_job_t *job);

//  Releases the lock. Does nothing on NULL; sets *self_p to NULL.
void segment_dir_destroy (segment_dir_t **self_p);

//  Self test.
void segment_dir_test (bool verbose);

#endif
