/*  segment_dir.c - a node's segments kept as files in a directory, and the adoption of the
    objects a previous run left in them (see segment_dir.h).

    WHY A COPY
    jemalloc cannot be told "this range is allocated": an arena hands out offsets of its own
    choosing, and the allocator's arenas are the only record of free space (alloc/
    segment_arena.c). Replaying the old allocations would not give the old offsets either.
    So adoption copies: a fresh arena per segment, and each verified object is placed through
    the allocator's normal path and copied into the new file. The copy also compacts the
    pool (a fresh arena packs the survivors) and costs one memcpy plus one XXH3 pass per
    byte adopted (see docs/tiers.md for measurements).

    MEMORY DURING ADOPTION
    The new files are created sparse (no pages committed), and the old file's pages are given
    back (MADV_REMOVE, a punched hole) as soon as every object that starts below them has been
    copied: records are walked in offset order, and after each one the whole pages below the
    next record's offset are released. So the two files together hold about one pool's worth
    of memory at any moment, not two; the new files' pages are committed (posix_fallocate)
    only once the old files are gone.

    WHAT IS ADOPTED
    A record's value is adopted only if its range lies inside its old file and its bytes hash
    to the checksum the record carries; a key's first verified replica is kept (one replica
    per object comes back). A record of a segment whose file is missing, whose value no new
    segment has room for (a smaller pool now), or that fails verification is dropped and
    counted; one summary line says what happened. An adoption cut short by a crash loses the
    objects not yet recorded by the new run (the old log's offsets then point into new files,
    where nothing verifies), and never adopts wrong bytes.

    Threads: one (the allocator's, during its start).
*/
#include "actors/segment_dir.h"

#include "infra/log.h"

#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "shm/segment.h"
#include "tier/object_log.h"

//  Segment indices a directory may hold (far more than any node has).
#define DIR_INDEX_MAX 65536

struct _segment_dir_t {
    char *dir;
    int lock_fd;
    object_record_t *records;
    size_t record_count;
    object_log_stats_t log_stats;
    uint8_t *old; //  old[i]: DIR/segment-<i>.old exists
    uint32_t old_count;
};

//  Parses "segment-<digits>" (with suffix, or none); returns the index or -1.
static long
s_index_of (const char *name, const char *suffix)
{
    if (strncmp (name, "segment-", 8) != 0)
        return -1;
    const char *c = name + 8;
    if (*c < '0' || *c > '9')
        return -1;
    char *end;
    long index = strtol (c, &end, 10);
    if (strcmp (end, suffix) != 0 || index < 0 || index >= DIR_INDEX_MAX)
        return -1;
    return index;
}

static void
s_old_path (segment_dir_t *self, uint32_t index, char *buf, size_t buf_size)
{
    snprintf (buf, buf_size, "%s/segment-%u.old", self->dir, index);
}

void
segment_dir_path (segment_dir_t *self, uint32_t index, char *buf, size_t buf_size)
{
    assert (self);
    snprintf (buf, buf_size, "%s/segment-%u", self->dir, index);
}

segment_dir_t *
segment_dir_open (const char *dir, char *reason, size_t reason_size)
{
    assert (dir && reason);
    if (dir[0] != '/' || strlen (dir) > 200) {
        snprintf (reason, reason_size,
                  "--segment-dir %s: give an absolute path of at most 200 "
                  "characters",
                  dir);
        return NULL;
    }
    if (mkdir (dir, 0700) == -1 && errno != EEXIST) {
        snprintf (reason, reason_size, "--segment-dir %s: cannot make it: %s", dir,
                  strerror (errno));
        return NULL;
    }
    //  The node's user's alone, whatever it was before (an older kvpoold opened it to
    //  --group): a file in it that another user could open, replace or truncate could kill
    //  the node with SIGBUS while it is mapped.
    if (chmod (dir, 0700) == -1) {
        snprintf (reason, reason_size,
                  "--segment-dir %s: cannot make it the node's user's alone (mode 0700): %s", dir,
                  strerror (errno));
        return NULL;
    }
    segment_dir_t *self = (segment_dir_t *) zmalloc (sizeof (segment_dir_t));
    self->dir = strdup (dir);
    //  Without a trailing '/': segment names are "<dir>/segment-<i>".
    size_t length = strlen (self->dir);
    while (length > 1 && self->dir[length - 1] == '/')
        self->dir[--length] = 0;
    char path[300];
    snprintf (path, sizeof path, "%s/LOCK", self->dir);
    self->lock_fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (self->lock_fd == -1) {
        snprintf (reason, reason_size, "--segment-dir %s: cannot open %s: %s", dir, path,
                  strerror (errno));
        segment_dir_destroy (&self);
        return NULL;
    }
    if (flock (self->lock_fd, LOCK_EX | LOCK_NB) == -1) {
        snprintf (reason, reason_size,
                  "--segment-dir %s is in use by another kvpoold (%s is locked): two nodes "
                  "never share one",
                  dir, path);
        segment_dir_destroy (&self);
        return NULL;
    }
    snprintf (path, sizeof path, "%s/objects.log", self->dir);
    if (object_log_read (path, &self->records, &self->record_count, &self->log_stats) != 0) {
        snprintf (reason, reason_size, "--segment-dir %s: cannot read %s: %s", dir, path,
                  strerror (errno));
        segment_dir_destroy (&self);
        return NULL;
    }
    //  The previous run's files go aside; a .old with no newer file is from an adoption
    //  that was cut short before it made its new file, and is still the source.
    self->old = (uint8_t *) zmalloc (DIR_INDEX_MAX);
    DIR *listing = opendir (self->dir);
    if (!listing) {
        snprintf (reason, reason_size, "--segment-dir %s: %s", dir, strerror (errno));
        segment_dir_destroy (&self);
        return NULL;
    }
    struct dirent *entry;
    while ((entry = readdir (listing))) {
        long index = s_index_of (entry->d_name, "");
        char from[300], to[300];
        if (index >= 0) {
            snprintf (from, sizeof from, "%s/%s", self->dir, entry->d_name);
            s_old_path (self, (uint32_t) index, to, sizeof to);
            if (rename (from, to) == 0)
                self->old[index] = 1;
        }
        else if ((index = s_index_of (entry->d_name, ".old")) >= 0)
            self->old[index] = 1;
        //  An older kvpoold made its files 0660 for --group: the node's user's alone now.
        if (index >= 0 && self->old[index]) {
            s_old_path (self, (uint32_t) index, to, sizeof to);
            chmod (to, 0600);
        }
    }
    closedir (listing);
    for (uint32_t i = 0; i < DIR_INDEX_MAX; i++)
        if (self->old[i])
            self->old_count = i + 1;
    return self;
}

void
segment_dir_destroy (segment_dir_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    segment_dir_t *self = *self_p;
    object_log_records_free (&self->records, self->record_count);
    if (self->lock_fd >= 0)
        close (self->lock_fd); //  the lock goes with it
    free (self->old);
    free (self->dir);
    free (self);
    *self_p = NULL;
}

//  Releases the whole pages of old below limit not yet released.
static void
s_release_below (segment_t *old, uint64_t *released, uint64_t limit)
{
    uint64_t end = limit / 4096 * 4096;
    if (end > *released) {
        segment_release (old, *released, end - *released);
        *released = end;
    }
}

size_t
segment_dir_adopt (segment_dir_t *self, segment_dir_place_fn *place, void *arg, kvp_job_t *job)
{
    assert (self && place && job);
    int64_t started = zclock_usecs ();
    uint64_t adopted = 0, adopted_bytes = 0, corrupt = 0, no_room = 0, missing = 0;
    uint64_t replicas = 0;
    zhashx_t *keys = zhashx_new (); //  keys adopted: one replica per object
    kvp_job_need_replicas (job);
    size_t next = 0;
    for (uint64_t index = 0; index < self->old_count || next < self->record_count; index++) {
        //  Past the old files only records of missing files are left: go to the next one.
        if (index >= self->old_count && self->records[next].segment > index)
            index = self->records[next].segment;
        //  The records of this index: [next, end).
        size_t end = next;
        while (end < self->record_count && self->records[end].segment == index)
            end++;
        if (end == next && (index >= self->old_count || !self->old[index]))
            continue;
        char path[300];
        s_old_path (self, (uint32_t) index, path, sizeof path);
        segment_t *old = NULL;
        struct stat st;
        if (index < self->old_count && self->old[index] && stat (path, &st) == 0 && st.st_size > 0)
            old = segment_open (path, (size_t) st.st_size);
        uint64_t old_size = old ? segment_size (old) : 0;
        const char *base = old ? (const char *) segment_base (old) : NULL;
        uint64_t released = 0;
        for (size_t r = next; r < end; r++) {
            object_record_t *record = &self->records[r];
            uint64_t limit = r + 1 < end ? self->records[r + 1].offset : old_size;
            if (!old || record->offset >= old_size || record->size > old_size - record->offset)
                missing++;
            else if (zhashx_lookup (keys, record->key))
                replicas++;
            else if (object_log_checksum (base + record->offset, record->size) != record->checksum)
                corrupt++;
            else {
                kvp_replica_t replica;
                if (place (arg, record->size, (uint32_t) index, &replica) != 0)
                    no_room++;
                else {
                    memcpy (replica.addr, base + record->offset, record->size);
                    kvp_item_t *item = kvp_job_append_key (job, record->key, record->key_len);
                    item->size = record->size;
                    item->checksums.value = record->checksum;
                    item->version = record->object_id; //  the log's "object" is its version
                    item->replica_count = 1;
                    item->replicas[0] = replica;
                    zhashx_insert (keys, record->key, (void *) 1);
                    adopted++;
                    adopted_bytes += record->size;
                }
            }
            if (old)
                s_release_below (old, &released, limit);
        }
        next = end;
        segment_destroy (&old);
        unlink (path);
    }
    zhashx_destroy (&keys);
    double seconds = (double) (zclock_usecs () - started) / 1e6;
    if (adopted || corrupt || no_room || missing || self->log_stats.bad)
        kvp_info ("kvpoold: segment dir %s: %llu objects (%llu MiB) adopted in %.3f s; dropped: "
                  "%llu failed verification, %llu did not fit, %llu not found in their "
                  "segment file; %llu extra replicas not kept; %llu damaged log records "
                  "skipped",
                  self->dir, (unsigned long long) adopted,
                  (unsigned long long) (adopted_bytes >> 20), seconds, (unsigned long long) corrupt,
                  (unsigned long long) no_room, (unsigned long long) missing,
                  (unsigned long long) replicas, (unsigned long long) self->log_stats.bad);
    return (size_t) adopted;
}

//  ---- self test --------------------------------------------------------------------

typedef struct {
    segment_t *segment;
    uint64_t bump;
} s_test_place_t;

static int
s_test_place (void *arg, uint64_t size, uint32_t hint, kvp_replica_t *replica)
{
    (void) hint;
    s_test_place_t *place = (s_test_place_t *) arg;
    if (place->bump + size > segment_size (place->segment))
        return -1;
    replica->segment_id = 1;
    replica->offset = place->bump;
    replica->addr = (char *) segment_base (place->segment) + place->bump;
    place->bump += (size + 4095) / 4096 * 4096;
    return 0;
}

void
segment_dir_test (bool verbose)
{
    if (verbose)
        printf ("\n * segment_dir: ");
    char dir[] = "/tmp/kvpool-segdir-XXXXXX";
    assert (mkdtemp (dir));
    char reason[256];
    segment_dir_t *self = segment_dir_open (dir, reason, sizeof reason);
    assert (self);
    //  A second user of the directory is refused.
    segment_dir_t *second = segment_dir_open (dir, reason, sizeof reason);
    assert (!second && strstr (reason, "in use by another kvpoold"));
    //  A "previous run": one segment with three objects, one of them damaged after its PUT.
    char path[300];
    segment_dir_path (self, 0, path, sizeof path);
    segment_t *seg = segment_new_file (path, 1 << 20, false, true);
    assert (seg);
    char *bytes = (char *) segment_base (seg);
    char log_path[300];
    snprintf (log_path, sizeof log_path, "%s/objects.log", dir);
    object_log_t *log = object_log_create (log_path);
    assert (log);
    const char *keys[] = {"one", "two", "three"};
    for (int i = 0; i < 3; i++) {
        memset (bytes + i * 8192, 'a' + i, 5000);
        assert (object_log_put (log, keys[i], strlen (keys[i]), 0, (uint64_t) i * 8192, 5000,
                                (uint64_t) i + 1, object_log_checksum (bytes + i * 8192, 5000))
                == 0);
    }
    bytes[8192 + 17] ^= 1; //  "two" changed behind the log's back
    assert (object_log_install (log) == 0);
    object_log_destroy (&log);
    segment_destroy (&seg);
    segment_dir_destroy (&self);

    //  The restart: the old file goes aside, "one" and "three" come back, "two" is dropped.
    self = segment_dir_open (dir, reason, sizeof reason);
    assert (self);
    char old_path[300];
    s_old_path (self, 0, old_path, sizeof old_path);
    assert (access (old_path, F_OK) == 0 && access (path, F_OK) == -1);
    seg = segment_new_file (path, 1 << 20, false, false);
    assert (seg);
    s_test_place_t place = {seg, 0};
    kvp_job_t *job = kvp_job_new (KVP_RM_ADOPT, 0);
    assert (segment_dir_adopt (self, s_test_place, &place, job) == 2);
    assert (job->count == 2);
    assert (streq (job->items[0].key, "one") && streq (job->items[1].key, "three"));
    assert (((char *) job->items[1].replicas[0].addr)[4999] == 'c');
    assert (job->items[1].checksums.value
            == object_log_checksum (job->items[1].replicas[0].addr, 5000));
    assert (access (old_path, F_OK) == -1); //  unlinked once adopted
    kvp_job_destroy (&job);
    segment_destroy (&seg);
    segment_dir_destroy (&self);
    unlink (path);
    unlink (log_path);
    snprintf (path, sizeof path, "%s/LOCK", dir);
    unlink (path);
    assert (rmdir (dir) == 0);
    if (verbose)
        printf ("lock, adoption, verification ");
}
