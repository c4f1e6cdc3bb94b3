/*  object_log.c - the record of the objects in a node's --segment-dir segments (see
    object_log.h).

    FORMAT (little-endian, the only kind the node runs on)
        file header  "KVPOLOG1", version (u32), zero (u32), XXH3-64 of those 16 bytes
        record       fields (48 bytes: magic "KVOR", type, 3 zero bytes, key length,
                     segment index, offset, size, object id, value checksum), the key, then
                     XXH3-64 of fields and key
    A record is written by one write(2) of an O_APPEND file (with the others buffered since
    the last flush), so after a kill at any moment the file is whole records followed by at
    most one torn one. A record that does not check (torn, or damaged in any way) is skipped:
    the reader looks for the next "KVOR" from the byte after its start, so one bad record
    never hides the ones after it.

    WHY IT IS SAFE TO ADOPT FROM IT
    The writer (the replica-manager) appends a PUT only once the value's bytes are complete,
    with their checksum, and a DEL, flushed to the file, before the replica's space can go
    back to the allocator. So for any (segment, offset) the last record says whether the bytes
    there are still that object's; and the checksum catches whatever happened to them since
    (a torn write, a change by hand). Records are not fsynced: the files are meant to outlive
    the process (tmpfs outlives no power cut anyway), and a record lost to a crash of the
    machine is at worst a value not adopted, or checked and dropped.

    LIVE RECORDS
    Records are sorted by (segment, offset, position): the last record of each range decides.
    A key with live PUTs of two objects (a replaced object whose DEL was lost) keeps only the
    later object's: never an older value.

    Threads: an object_log_t is used by one thread; object_log_read uses no shared state.
*/
#include "tier/object_log.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#define LOG_MAGIC "KVPOLOG1"
#define LOG_VERSION 1
#define RECORD_MAGIC "KVOR"
#define TYPE_PUT 1
#define TYPE_DEL 2

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t zero;
    uint64_t hash; //  XXH3-64 of the 16 bytes above
} log_header_t;
_Static_assert(sizeof (log_header_t) == 24, "the header takes 24 bytes");

typedef struct {
    char magic[4];
    uint8_t type;
    uint8_t zero[3];
    uint32_t key_len;
    uint32_t segment;
    uint64_t offset;
    uint64_t size;
    uint64_t object_id;
    uint64_t checksum;
} record_fields_t;
_Static_assert(sizeof (record_fields_t) == 48, "the fields take 48 bytes");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "records are little-endian");

struct _object_log_t {
    char *path; //  the log's name once installed
    char *tmp;  //  "<path>.tmp"
    int fd;     //  O_APPEND
    bool installed;
    bool failed;
    char *buffer; //  records not yet written
    size_t used, capacity;
    uint64_t records;
};

uint64_t
object_log_checksum (const void *bytes, size_t size)
{
    return XXH3_64bits (bytes, size);
}

//  ---- reading ----------------------------------------------------------------------

typedef struct {
    const char *key; //  in the mapped file
    uint32_t key_len;
    uint8_t type;
    uint32_t segment;
    uint64_t offset, size, object_id, checksum, seq;
} s_entry_t;

static int
s_by_range (const void *a, const void *b)
{
    const s_entry_t *x = (const s_entry_t *) a, *y = (const s_entry_t *) b;
    if (x->segment != y->segment)
        return x->segment < y->segment ? -1 : 1;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int
s_by_key (const void *a, const void *b)
{
    const s_entry_t *x = (const s_entry_t *) a, *y = (const s_entry_t *) b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp (x->key, y->key, n);
    if (c)
        return c;
    if (x->key_len != y->key_len)
        return x->key_len < y->key_len ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

//  Whether a well-formed record starts at data[pos]; fills e and *length if so.
static bool
s_record_at (const char *data, size_t size, size_t pos, s_entry_t *e, size_t *length)
{
    if (size - pos < sizeof (record_fields_t) + 8)
        return false;
    record_fields_t f;
    memcpy (&f, data + pos, sizeof f);
    if (memcmp (f.magic, RECORD_MAGIC, 4) != 0 || (f.type != TYPE_PUT && f.type != TYPE_DEL)
        || f.zero[0] || f.zero[1] || f.zero[2] || f.key_len == 0 || f.key_len > OBJECT_LOG_KEY_MAX
        || size - pos - sizeof f - 8 < f.key_len)
        return false;
    size_t body = sizeof f + f.key_len;
    uint64_t hash;
    memcpy (&hash, data + pos + body, 8);
    if (hash != XXH3_64bits (data + pos, body))
        return false;
    *e = (s_entry_t){.key = data + pos + sizeof f,
                     .key_len = f.key_len,
                     .type = f.type,
                     .segment = f.segment,
                     .offset = f.offset,
                     .size = f.size,
                     .object_id = f.object_id,
                     .checksum = f.checksum};
    *length = body + 8;
    return true;
}

int
object_log_read (const char *path, object_record_t **records_p, size_t *count_p,
                 object_log_stats_t *stats)
{
    assert (path && records_p && count_p && stats);
    memset (stats, 0, sizeof *stats);
    *records_p = NULL;
    *count_p = 0;
    //  O_NONBLOCK: a FIFO under the name must not hang the start-up (fstat refuses it next).
    int fd = open (path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd == -1)
        return errno == ENOENT ? 0 : -1;
    struct stat st;
    if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode)) {
        close (fd);
        errno = EINVAL;
        return -1;
    }
    size_t size = (size_t) st.st_size;
    stats->bytes = size;
    if (size < sizeof (log_header_t)) {
        close (fd);
        return 0;
    }
    const char *data = (const char *) mmap (NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close (fd);
    if (data == MAP_FAILED)
        return -1;
    log_header_t header;
    memcpy (&header, data, sizeof header);
    stats->header_ok = memcmp (header.magic, LOG_MAGIC, 8) == 0 && header.version == LOG_VERSION
                       && header.zero == 0 && header.hash == XXH3_64bits (data, 16);
    //  A log of another version is not ours to interpret: nothing is adopted from it.
    if (!stats->header_ok) {
        munmap ((void *) data, size);
        return 0;
    }
    size_t capacity = 1024, n = 0;
    s_entry_t *entries = (s_entry_t *) malloc (capacity * sizeof *entries);
    if (!entries) {
        munmap ((void *) data, size);
        errno = ENOMEM;
        return -1;
    }
    size_t pos = sizeof header;
    bool in_bad = false;
    while (pos < size) {
        s_entry_t e;
        size_t length;
        if (!s_record_at (data, size, pos, &e, &length)) {
            //  Skip to the next candidate record start.
            if (!in_bad)
                stats->bad++;
            in_bad = true;
            const char *next =
                (const char *) memmem (data + pos + 1, size - pos - 1, RECORD_MAGIC, 4);
            if (!next)
                break;
            pos = (size_t) (next - data);
            continue;
        }
        in_bad = false;
        if (n == capacity) {
            s_entry_t *grown = (s_entry_t *) realloc (entries, 2 * capacity * sizeof *entries);
            if (!grown) {
                free (entries);
                munmap ((void *) data, size);
                errno = ENOMEM;
                return -1;
            }
            entries = grown;
            capacity *= 2;
        }
        e.seq = stats->records++;
        stats->puts += e.type == TYPE_PUT;
        stats->dels += e.type == TYPE_DEL;
        entries[n++] = e;
        pos += length;
    }
    //  The last record of each range decides whether a PUT there is live.
    qsort (entries, n, sizeof *entries, s_by_range);
    size_t live = 0;
    for (size_t i = 0; i < n; i++) {
        bool last = i + 1 == n || entries[i + 1].segment != entries[i].segment
                    || entries[i + 1].offset != entries[i].offset;
        if (last && entries[i].type == TYPE_PUT)
            entries[live++] = entries[i];
    }
    //  Per key, only the latest object's replicas.
    qsort (entries, live, sizeof *entries, s_by_key);
    size_t kept = 0;
    for (size_t i = 0; i < live;) {
        size_t j = i;
        while (j + 1 < live && entries[j + 1].key_len == entries[i].key_len
               && memcmp (entries[j + 1].key, entries[i].key, entries[i].key_len) == 0)
            j++;
        uint64_t latest = entries[j].object_id;
        for (size_t k = i; k <= j; k++) {
            if (entries[k].object_id == latest)
                entries[kept++] = entries[k];
            else
                stats->superseded++;
        }
        i = j + 1;
    }
    qsort (entries, kept, sizeof *entries, s_by_range);
    object_record_t *records = (object_record_t *) calloc (kept ? kept : 1, sizeof *records);
    size_t key_bytes = 0;
    for (size_t i = 0; i < kept; i++)
        key_bytes += entries[i].key_len + 1;
    char *keys = (char *) malloc (key_bytes ? key_bytes : 1);
    if (!records || !keys) {
        free (records);
        free (keys);
        free (entries);
        munmap ((void *) data, size);
        errno = ENOMEM;
        return -1;
    }
    //  The first record's key starts the block object_log_records_free frees.
    char *at = keys;
    for (size_t i = 0; i < kept; i++) {
        memcpy (at, entries[i].key, entries[i].key_len);
        at[entries[i].key_len] = 0;
        records[i] = (object_record_t){.key = at,
                                       .key_len = entries[i].key_len,
                                       .segment = entries[i].segment,
                                       .offset = entries[i].offset,
                                       .size = entries[i].size,
                                       .object_id = entries[i].object_id,
                                       .checksum = entries[i].checksum,
                                       .seq = entries[i].seq};
        at += entries[i].key_len + 1;
    }
    if (kept == 0)
        free (keys);
    free (entries);
    munmap ((void *) data, size);
    *records_p = records;
    *count_p = kept;
    return 0;
}

void
object_log_records_free (object_record_t **records_p, size_t count)
{
    if (!records_p || !*records_p)
        return;
    if (count)
        free ((*records_p)[0].key);
    free (*records_p);
    *records_p = NULL;
}

//  ---- writing ----------------------------------------------------------------------

object_log_t *
object_log_create (const char *path)
{
    assert (path);
    object_log_t *self = (object_log_t *) calloc (1, sizeof (object_log_t));
    if (!self)
        return NULL;
    self->fd = -1;
    self->path = strdup (path);
    size_t tmp_size = strlen (path) + 5;
    self->tmp = (char *) malloc (tmp_size);
    if (!self->path || !self->tmp)
        goto failed;
    snprintf (self->tmp, tmp_size, "%s.tmp", path);
    //  Never into a file it did not create: whatever has the name (a crash's .tmp, a symlink
    //  planted there) goes first, then O_EXCL.
    if (unlink (self->tmp) != 0 && errno != ENOENT)
        goto failed;
    self->fd =
        open (self->tmp, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (self->fd == -1)
        goto failed;
    log_header_t header = {.version = LOG_VERSION};
    memcpy (header.magic, LOG_MAGIC, 8);
    header.hash = XXH3_64bits (&header, 16);
    if (write (self->fd, &header, sizeof header) != (ssize_t) sizeof header) {
        if (errno == 0)
            errno = ENOSPC;
        goto failed;
    }
    return self;
failed:;
    int saved = errno;
    if (self->fd >= 0) {
        close (self->fd);
        unlink (self->tmp);
    }
    free (self->path);
    free (self->tmp);
    free (self);
    errno = saved;
    return NULL;
}

int
object_log_install (object_log_t *self)
{
    assert (self && !self->installed);
    if (object_log_flush (self) != 0)
        return -1;
    if (rename (self->tmp, self->path) != 0) {
        self->failed = true;
        return -1;
    }
    self->installed = true;
    return 0;
}

static int
s_append (object_log_t *self, uint8_t type, const char *key, size_t key_len, uint32_t segment,
          uint64_t offset, uint64_t size, uint64_t object_id, uint64_t checksum)
{
    assert (self && key);
    if (key_len == 0 || key_len > OBJECT_LOG_KEY_MAX) {
        errno = EINVAL;
        return -1;
    }
    size_t length = sizeof (record_fields_t) + key_len + 8;
    if (self->used + length > self->capacity) {
        size_t capacity = self->capacity ? self->capacity : 4096;
        while (capacity < self->used + length)
            capacity *= 2;
        char *grown = (char *) realloc (self->buffer, capacity);
        if (!grown) {
            errno = ENOMEM;
            return -1;
        }
        self->buffer = grown;
        self->capacity = capacity;
    }
    record_fields_t f = {.type = type,
                         .key_len = (uint32_t) key_len,
                         .segment = segment,
                         .offset = offset,
                         .size = size,
                         .object_id = object_id,
                         .checksum = checksum};
    memcpy (f.magic, RECORD_MAGIC, 4);
    char *at = self->buffer + self->used;
    memcpy (at, &f, sizeof f);
    memcpy (at + sizeof f, key, key_len);
    uint64_t hash = XXH3_64bits (at, sizeof f + key_len);
    memcpy (at + sizeof f + key_len, &hash, 8);
    self->used += length;
    self->records++;
    return 0;
}

int
object_log_put (object_log_t *self, const char *key, size_t key_len, uint32_t segment,
                uint64_t offset, uint64_t size, uint64_t object_id, uint64_t checksum)
{
    return s_append (self, TYPE_PUT, key, key_len, segment, offset, size, object_id, checksum);
}

int
object_log_del (object_log_t *self, const char *key, size_t key_len, uint32_t segment,
                uint64_t offset, uint64_t object_id)
{
    return s_append (self, TYPE_DEL, key, key_len, segment, offset, 0, object_id, 0);
}

int
object_log_flush (object_log_t *self)
{
    assert (self);
    size_t done = 0;
    while (done < self->used && !self->failed) {
        ssize_t n = write (self->fd, self->buffer + done, self->used - done);
        if (n > 0)
            done += (size_t) n;
        else if (n == -1 && errno == EINTR)
            continue;
        else {
            if (n == 0)
                errno = ENOSPC;
            self->failed = true;
        }
    }
    self->used = 0;
    return self->failed ? -1 : 0;
}

bool
object_log_failed (object_log_t *self)
{
    assert (self);
    return self->failed;
}

void
object_log_abandon (object_log_t *self)
{
    assert (self);
    self->failed = true;
    self->used = 0;
    unlink (self->installed ? self->path : self->tmp);
}

uint64_t
object_log_records (object_log_t *self)
{
    assert (self);
    return self->records;
}

void
object_log_destroy (object_log_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    object_log_t *self = *self_p;
    if (!self->failed)
        object_log_flush (self);
    if (self->fd >= 0)
        close (self->fd);
    free (self->buffer);
    free (self->path);
    free (self->tmp);
    free (self);
    *self_p = NULL;
}

//  ---- self test --------------------------------------------------------------------

static const object_record_t *
s_find (const object_record_t *records, size_t count, const char *key)
{
    for (size_t i = 0; i < count; i++)
        if (strcmp (records[i].key, key) == 0)
            return &records[i];
    return NULL;
}

void
object_log_test (bool verbose)
{
    if (verbose)
        printf ("\n * object_log: ");
    char dir[] = "/tmp/kvpool-objlog-XXXXXX";
    assert (mkdtemp (dir));
    char path[128];
    snprintf (path, sizeof path, "%s/objects.log", dir);

    //  No file: an empty log.
    object_record_t *records;
    size_t count;
    object_log_stats_t stats;
    assert (object_log_read (path, &records, &count, &stats) == 0 && count == 0);
    object_log_records_free (&records, count);

    //  Round trip: puts, a delete, a replaced object, replicas.
    object_log_t *log = object_log_create (path);
    assert (log);
    uint64_t sum = object_log_checksum ("value", 5);
    assert (sum == object_log_checksum ("value", 5) && sum != object_log_checksum ("valuf", 5));
    assert (object_log_put (log, "a", 1, 0, 0, 100, 1, 11) == 0);
    assert (object_log_put (log, "b", 1, 0, 4096, 200, 2, 22) == 0);
    assert (object_log_put (log, "b", 1, 1, 0, 200, 2, 22) == 0); //  a second replica
    assert (object_log_put (log, "c", 1, 1, 8192, 300, 3, 33) == 0);
    assert (object_log_del (log, "c", 1, 1, 8192, 3) == 0);
    assert (object_log_put (log, "d", 1, 0, 8192, 5, 4, 44) == 0);
    //  "d" replaced (an upsert whose DEL of the old object was lost): the later one wins.
    assert (object_log_put (log, "d", 1, 1, 65536, 6, 5, 55) == 0);
    //  "e"'s range reused by "f" after e's DEL.
    assert (object_log_put (log, "e", 1, 2, 0, 10, 6, 66) == 0);
    assert (object_log_del (log, "e", 1, 2, 0, 6) == 0);
    assert (object_log_put (log, "f", 1, 2, 0, 10, 7, 77) == 0);
    assert (object_log_put (log, "", 0, 0, 0, 1, 1, 1) == -1); //  no empty keys
    assert (object_log_records (log) == 10);
    //  Not installed yet: the log is the old one (none).
    assert (object_log_flush (log) == 0);
    assert (object_log_read (path, &records, &count, &stats) == 0 && count == 0);
    assert (object_log_install (log) == 0);
    assert (object_log_read (path, &records, &count, &stats) == 0);
    assert (stats.header_ok && stats.records == 10 && stats.puts == 8 && stats.dels == 2);
    assert (stats.bad == 0 && stats.superseded == 1);
    assert (count == 5);
    assert (s_find (records, count, "a")->checksum == 11);
    assert (!s_find (records, count, "c") && !s_find (records, count, "e"));
    assert (s_find (records, count, "d")->object_id == 5
            && s_find (records, count, "d")->size == 6);
    assert (s_find (records, count, "f")->checksum == 77);
    //  Sorted by segment and offset.
    for (size_t i = 1; i < count; i++)
        assert (records[i - 1].segment < records[i].segment
                || (records[i - 1].segment == records[i].segment
                    && records[i - 1].offset < records[i].offset));
    object_log_records_free (&records, count);

    //  Appends after install land in the installed file.
    assert (object_log_del (log, "a", 1, 0, 0, 1) == 0);
    assert (object_log_put (log, "g", 1, 0, 0, 7, 8, 88) == 0);
    //  A torn record at the end (a kill in the middle of a write).
    assert (object_log_flush (log) == 0);
    object_log_destroy (&log);
    int fd = open (path, O_WRONLY | O_APPEND);
    assert (fd >= 0);
    assert (write (fd, "KVOR\001\0\0\0\005\0\0", 11) == 11);
    close (fd);
    assert (object_log_read (path, &records, &count, &stats) == 0);
    assert (stats.bad == 1 && count == 5 && !s_find (records, count, "a"));
    assert (s_find (records, count, "g")->offset == 0);
    object_log_records_free (&records, count);

    //  A damaged record in the middle: skipped alone, the ones after it still count.
    struct stat st;
    assert (stat (path, &st) == 0);
    fd = open (path, O_RDWR);
    assert (fd >= 0);
    char *image = (char *) malloc ((size_t) st.st_size);
    assert (pread (fd, image, (size_t) st.st_size, 0) == st.st_size);
    //  The second record is "b" on segment 0: flip a byte of its offset.
    size_t second = sizeof (log_header_t) + sizeof (record_fields_t) + 1 + 8;
    assert (memcmp (image + second, RECORD_MAGIC, 4) == 0);
    image[second + 16] ^= 0x40;
    assert (pwrite (fd, image, (size_t) st.st_size, 0) == st.st_size);
    close (fd);
    assert (object_log_read (path, &records, &count, &stats) == 0);
    assert (stats.bad == 2 && stats.records == 11 && count == 4);
    const object_record_t *b = s_find (records, count, "b");
    assert (b && b->segment == 1); //  its other replica's record is intact
    object_log_records_free (&records, count);
    //  Garbage everywhere: never a crash, nothing adopted from a bad header.
    for (off_t i = 0; i < st.st_size; i += 7)
        image[i] = (char) (i * 31);
    fd = open (path, O_WRONLY | O_TRUNC);
    assert (fd >= 0 && write (fd, image, (size_t) st.st_size) == st.st_size);
    close (fd);
    assert (object_log_read (path, &records, &count, &stats) == 0 && count == 0);
    assert (!stats.header_ok);
    object_log_records_free (&records, count);
    free (image);

    //  Compaction: a fresh log with the live records replaces the old one.
    log = object_log_create (path);
    assert (log);
    for (int i = 0; i < 1000; i++) {
        char key[32];
        int len = snprintf (key, sizeof key, "key-%d", i);
        assert (
            object_log_put (log, key, (size_t) len, 0, (uint64_t) i * 64, 64, (uint64_t) i + 1, i)
            == 0);
        if (i % 2)
            assert (object_log_del (log, key, (size_t) len, 0, (uint64_t) i * 64, (uint64_t) i + 1)
                    == 0);
    }
    assert (object_log_install (log) == 0);
    object_log_destroy (&log);
    assert (object_log_read (path, &records, &count, &stats) == 0 && count == 500);
    uint64_t full_bytes = stats.bytes;
    log = object_log_create (path);
    assert (log);
    for (size_t i = 0; i < count; i++)
        assert (object_log_put (log, records[i].key, records[i].key_len, records[i].segment,
                                records[i].offset, records[i].size, records[i].object_id,
                                records[i].checksum)
                == 0);
    object_log_records_free (&records, count);
    assert (object_log_install (log) == 0);
    object_log_destroy (&log);
    assert (object_log_read (path, &records, &count, &stats) == 0 && count == 500);
    assert (stats.bytes < full_bytes / 2 && stats.dels == 0);
    object_log_records_free (&records, count);

    //  A broken log is removed, so the next start adopts nothing.
    log = object_log_create (path);
    assert (log && object_log_install (log) == 0);
    object_log_abandon (log);
    assert (object_log_failed (log));
    assert (access (path, F_OK) == -1);
    object_log_destroy (&log);

    char tmp[160];
    snprintf (tmp, sizeof tmp, "%s.tmp", path);
    unlink (tmp);
    unlink (path);
    assert (rmdir (dir) == 0);
    if (verbose)
        printf ("round trip, torn and damaged records, compaction ");
}
