/*  object_log.h - the record of the objects in a node's --segment-dir segments.

    DIR/objects.log is append-only: a PUT record for each replica of a committed object on one
    of the node's own segments (key, size, segment index, offset, object id, XXH3-64 of the
    value), a DEL record when that replica stops being the object's (removed, evicted,
    replaced, its memory about to be reused). Each record checks itself (its own XXH3-64), so a
    record torn by a kill, or damaged, is skipped; reading resynchronises on the next record.
    A restarted node reads the live PUT records (object_log_read), checks each value against
    its checksum and adopts what verifies (actors/segment_dir.c); then it writes a fresh log
    with only those (object_log_create + object_log_install): the log never grows past what
    one run wrote.

    Usage (writer): create, put / del (buffered), flush (one write(2) of everything buffered:
    on the file, in the page cache, when it returns), install once to make it DIR/objects.log.
    The fd is O_APPEND, so records land whole and in the order they were flushed.

    Threads: an object_log_t is used by one thread (the replica-manager's).
*/
#ifndef OBJECT_LOG_H_INCLUDED
#define OBJECT_LOG_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  Longest key a record may hold (the node's --max-key-len is at most 65536).
#define OBJECT_LOG_KEY_MAX (64 * 1024)

typedef struct _object_log_t object_log_t;

//  One live record, as object_log_read returns it.
typedef struct {
    char *key; //  NUL-terminated, owned by the record set
    uint32_t key_len;
    uint32_t segment; //  the segment's index in the directory (DIR/segment-<index>)
    uint64_t offset;
    uint64_t size;
    uint64_t object_id; //  the object's version: replicas of one object share it
    uint64_t checksum;  //  XXH3-64 of the value
    uint64_t seq;       //  its position in the log
} object_record_t;

//  What a read found.
typedef struct {
    uint64_t records; //  well-formed records
    uint64_t puts, dels;
    uint64_t bad;        //  stretches of bytes that were no record (torn, damaged), skipped
    uint64_t superseded; //  live PUTs of a key whose later object is live too (dropped)
    uint64_t bytes;      //  the file's size
    bool header_ok;      //  the file had a valid header
} object_log_stats_t;

//  XXH3-64 of a value, as records carry it.
uint64_t object_log_checksum (const void *bytes, size_t size);

//  Reads path and returns in *records_p (count in *count_p) the PUT records no later DEL
//  cancelled, sorted by segment and offset; for a key with records of several objects, only
//  the latest object's. A missing file is an empty log (returns 0). Returns -1 (errno set) only
//  when the file cannot be read; a damaged file is input: what does not check is skipped and
//  counted in stats. Caller frees the records with object_log_records_free.
int object_log_read (const char *path, object_record_t **records_p, size_t *count_p,
                     object_log_stats_t *stats);
void object_log_records_free (object_record_t **records_p, size_t count);

//  Starts a fresh log at "<path>.tmp" (replacing any), header written. Returns NULL with errno
//  set. Caller owns the return value.
object_log_t *object_log_create (const char *path);
//  Flushes, then renames "<path>.tmp" to path: from now on the log is path. Returns 0 or -1.
int object_log_install (object_log_t *self);
//  Appends a record to the buffer (flushed by object_log_flush). Returns 0 or -1 (key too
//  long, out of memory).
int object_log_put (object_log_t *self, const char *key, size_t key_len, uint32_t segment,
                    uint64_t offset, uint64_t size, uint64_t object_id, uint64_t checksum);
int object_log_del (object_log_t *self, const char *key, size_t key_len, uint32_t segment,
                    uint64_t offset, uint64_t object_id);
//  Writes what is buffered. Returns 0, or -1 with errno when the file refused it (the log
//  is then broken: object_log_failed).
int object_log_flush (object_log_t *self);
//  Whether any write failed. A broken log must not be trusted by the next start: the caller
//  removes it (object_log_abandon).
bool object_log_failed (object_log_t *self);
//  Unlinks the log's file (the installed one, or the .tmp): the next start adopts nothing.
void object_log_abandon (object_log_t *self);
//  Records written to the file since it was created.
uint64_t object_log_records (object_log_t *self);
//  Closes (flushing first). Does nothing on NULL; sets *self_p to NULL.
void object_log_destroy (object_log_t **self_p);

//  Self test.
void object_log_test (bool verbose);

#endif
