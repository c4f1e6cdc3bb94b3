/*  bench_tier.c - the eviction and disk tier section of kvpool-bench (see bench.h).

    Three measurements, each against a kvpoold of its own (bench_proc.c starts it from the
    bench's --kvpoold, so two builds can be compared), all through libkvpool over tcp with the
    fast path off, as the main bench's tcp rows:

    1. Disk-tier reads. A 64 MiB pool with a disk tier (--promote-on-hit 0, so reads stay on
       disk) takes 512 values of 1 MiB (128 with --quick), one a call; all but the newest 64
       can only be on disk. Those are read back in batches of 16, into buffers
       (kvpool_get_batch_into) and zero-copy (kvpool_get_batch), and disk_hits must grow by
       exactly their number: every byte came from the disk. In the same run, a file of the
       same size in the same scratch directory (written with O_DIRECT, so not cached) is read
       by `dd bs=1M iflag=direct`; the reads and dd alternate, and the medians are compared
       (the faster API against dd). For reference, the newest values (those in memory:
       how many varies, as a cycle can free more than it must) are read through the same
       tcp path; the puts are left to settle first (no copy being written, the pool under
       its watermark), so no cycle moves them meanwhile.
    2. An eviction cycle over a million small objects (100000 with --quick): a pool sized so
       that a million 512-byte values sit just under the high watermark (the bytes allocated
       per object are measured first, and the pool resized once if the guess was off), no
       disk tier, --lease-ttl 1 so nothing is leased. Batched puts fill it until it passes the
       watermark; then nothing is put until the evictor's cycle has run and its walk time
       (eviction_walk_us) is read. Repeated for several cycles; each walks a million cold
       objects from the oldest end until it has freed 5% of the pool.
    3. 4 MiB puts (kvpool_put, one key per call) into a 256 MiB pool: 0.8 x pool into an
       empty pool against 1.5 x pool into a full one (constant overflow: every put evicts),
       without and with a disk tier (on-evict: every evicted value is written to disk
       first). The pool is emptied (kvpool_remove_all, force) between repetitions.

    Checks: every status and size; values are distinct per key and compared on read back
    (every disk-tier read; the newest and some evicted keys after the fills); what must have
    happened did (values on disk, reads served from disk, cycles run, objects evicted). A
    failed check fails the section. A put refused NO_AVAILABLE_HANDLE (the pool could not
    make room: a documented answer, if not the promised one) is counted and reported: in 3.
    it misses the target; in 1., where the puts only set the stage, it is retried. A missed
    target is only reported. Timing: only the calls themselves (checks run between them),
    medians over the repetitions.

    Files: one scratch directory under /tmp (bench_scratch_new), removed at the end; every
    kvpoold is stopped before its part returns, also on failure. Logs stay in /tmp when
    something failed (named on stderr).
*/
#include "bench/bench.h"
#include "kvpool.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#define MiB (1ULL << 20)
#define MAX_REPS 8
#define RPC_TIMEOUT_MS 60000
#define KEY_MAX 64
#define HIGH_WATERMARK 0.90 //  --eviction-high-watermark, given where the bench relies on it

//  1. disk-tier reads
#define DISK_VALUE MiB
#define DISK_BATCH 16
#define DISK_POOL_MIB 64 //  so at most 64 values of 1 MiB are in memory
#define MEMORY_READS 192 //  values read from memory a run (the newest, several times over)

//  2. the eviction cycle
#define SMALL_VALUE 512
#define SMALL_BATCH 1000
#define WALK_TARGET_US 50000

//  3. puts under overflow
#define PUT_VALUE (4 * MiB)
#define PUT_POOL_MIB 256
#define PUT_SOURCES 8
#define MOONCAKE_P50_MS 10.8 //  Mooncake's p50 for 4 MiB puts under overflow

typedef struct {
    const char *kvpoold_path;
    bool quick;
    int reps;
    char scratch[256];
    char fs[32];            //  the scratch directory's filesystem
    bench_kvpoold_t daemon; //  the kvpoold of the part running
    kvpool_t *client;
    int errors; //  of the part running
    int failed_parts;
} tier_t;

//  ---- helpers ---------------------------------------------------------------------------

static void
s_fail (tier_t *self, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    fprintf (stderr, "kvpool-bench: tier: ");
    vfprintf (stderr, format, args);
    fprintf (stderr, "\n");
    va_end (args);
    self->errors++;
}

static void *
s_buffer (size_t size)
{
    void *buffer = mmap (NULL, size, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return buffer == MAP_FAILED ? NULL : buffer;
}

static void
s_buffer_free (void *buffer, size_t size)
{
    if (buffer)
        munmap (buffer, size);
}

static const char *
s_fs_name (const char *path, char *name, size_t size)
{
    struct statfs info;
    if (statfs (path, &info) != 0)
        snprintf (name, size, "?");
    else if (info.f_type == 0xEF53)
        snprintf (name, size, "ext4");
    else if (info.f_type == 0x58465342)
        snprintf (name, size, "xfs");
    else if (info.f_type == 0x9123683E)
        snprintf (name, size, "btrfs");
    else if (info.f_type == 0x01021994)
        snprintf (name, size, "tmpfs");
    else
        snprintf (name, size, "fs 0x%lx", (unsigned long) info.f_type);
    return name;
}

//  Starts this part's kvpoold (name tells its files apart) and connects to it over tcp.
static int
s_start (tier_t *self, const char *name, const char *const *args)
{
    self->errors = 0;
    if (bench_kvpoold_start (&self->daemon, self->kvpoold_path, name, args)) {
        self->errors++;
        return -1;
    }
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.timeout_ms = RPC_TIMEOUT_MS;
    options.connect_timeout_ms = 5000;
    options.fast_path = 0;     //  the tcp path, as the main bench's tcp rows
    options.keep_endpoint = 1; //  and no move to the ipc endpoint
    self->client = kvpool_connect (self->daemon.endpoint, &options);
    if (!self->client) {
        s_fail (self, "cannot connect to kvpoold at %s", self->daemon.endpoint);
        return -1;
    }
    if (kvpool_fast_path (self->client)) {
        s_fail (self, "fast_path = 0 was ignored; the tcp figures would be wrong");
        return -1;
    }
    return 0;
}

//  Disconnects and stops the part's kvpoold (its log stays when the part failed). Returns 0,
//  or -1 when the part failed.
static int
s_finish (tier_t *self)
{
    kvpool_destroy (&self->client);
    if (self->daemon.pid > 0 && bench_kvpoold_stop (&self->daemon, self->errors > 0) != 0)
        self->errors++;
    if (self->errors && self->daemon.log[0])
        fprintf (stderr, "kvpool-bench: tier: kvpoold log kept: %s\n", self->daemon.log);
    if (self->errors)
        self->failed_parts++;
    return self->errors ? -1 : 0;
}

static int
s_stats (tier_t *self, kvpool_stats_t *stats)
{
    int rc = kvpool_stats (self->client, stats);
    if (rc != KVPOOL_OK) {
        s_fail (self, "kvpool_stats: %s", kvpool_status_name (rc));
        return -1;
    }
    return 0;
}

//  Waits (up to timeout_s) until no disk copy is being written. Returns 0 or -1.
static int
s_drain_offloads (tier_t *self, double timeout_s, kvpool_stats_t *stats)
{
    double deadline = bench_now () + timeout_s;
    while (s_stats (self, stats) == 0) {
        if (stats->offload_queue == 0)
            return 0;
        if (bench_now () > deadline) {
            s_fail (self, "%" PRIu64 " disk copies still being written after %.0f s",
                    stats->offload_queue, timeout_s);
            return -1;
        }
        bench_sleep_ms (10);
    }
    return -1;
}

//  Waits (up to timeout_s) until the evictor is done: no disk copy being written and the pool
//  under its high watermark, three looks in a row 20 ms apart (the evictor looks every
//  10 ms). Returns 0 or -1.
static int
s_settle (tier_t *self, double timeout_s, kvpool_stats_t *stats)
{
    double deadline = bench_now () + timeout_s;
    int calm = 0;
    while (calm < 3 && s_stats (self, stats) == 0) {
        bool settled = stats->offload_queue == 0
                       && stats->bytes_allocated <= HIGH_WATERMARK * stats->bytes_mounted;
        calm = settled ? calm + 1 : 0;
        if (calm < 3 && bench_now () > deadline) {
            s_fail (self,
                    "the evictor is not done %.0f s after the puts (%" PRIu64
                    " disk copies being written, %" PRIu64 " of %" PRIu64 " bytes allocated)",
                    timeout_s, stats->offload_queue, stats->bytes_allocated, stats->bytes_mounted);
            return -1;
        }
        if (calm < 3)
            bench_sleep_ms (20);
    }
    return calm == 3 ? 0 : -1;
}

//  The text in parentheses after "disk tier DIR " in the log: how the store does I/O.
static void
s_disk_io (const char *log, char *text, size_t size)
{
    snprintf (text, size, "I/O mode not logged");
    FILE *file = fopen (log, "r");
    if (!file)
        return;
    char line[1024];
    while (fgets (line, sizeof line, file)) {
        char *at = strstr (line, "disk tier ");
        char *open = at ? strchr (at, '(') : NULL;
        char *close = open ? strchr (open, ')') : NULL;
        if (close) {
            *close = 0;
            snprintf (text, size, "%s", open + 1);
            break;
        }
    }
    fclose (file);
}

//  ---- 1. disk-tier reads against dd ----------------------------------------------------

static void
s_disk_key (char *key, size_t index)
{
    snprintf (key, KEY_MAX, "tier-disk-%05zu", index);
}

//  Writes mib MiB of distinct bytes to path, bypassing the page cache where the filesystem
//  allows it (and dropping what was cached otherwise), so that dd reads them from the disk.
static int
s_write_file (tier_t *self, const char *path, size_t mib, uint8_t *buffer, size_t buffer_mib)
{
    int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd < 0)
        fd = open (path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        s_fail (self, "cannot create %s: %s", path, strerror (errno));
        return -1;
    }
    int rc = 0;
    for (size_t done = 0; rc == 0 && done < mib; done += buffer_mib) {
        size_t n = mib - done < buffer_mib ? mib - done : buffer_mib;
        for (size_t i = 0; i < n; i++)
            bench_fill (buffer + i * MiB, MiB, (1ULL << 40) + done + i);
        size_t length = n * MiB, written = 0;
        while (rc == 0 && written < length) {
            ssize_t w = write (fd, buffer + written, length - written);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                s_fail (self, "writing %s: %s", path, w < 0 ? strerror (errno) : "no progress");
                rc = -1;
            }
            else
                written += (size_t) w;
        }
    }
    if (rc == 0 && fsync (fd) != 0) {
        s_fail (self, "fsync %s: %s", path, strerror (errno));
        rc = -1;
    }
    posix_fadvise (fd, 0, 0, POSIX_FADV_DONTNEED);
    close (fd);
    return rc;
}

static const char *
s_dd_path (void)
{
    return access ("/usr/bin/dd", X_OK) == 0 ? "/usr/bin/dd" : "/bin/dd";
}

//  One `dd if=path of=/dev/null bs=1M iflag=direct`; *rate_p in bytes per second, from the
//  time dd reports (its own wall time when that cannot be parsed).
static int
s_dd_run (tier_t *self, const char *path, uint64_t bytes, double *rate_p)
{
    char input[320], log[300];
    snprintf (input, sizeof input, "if=%s", path);
    snprintf (log, sizeof log, "%s/dd.log", self->scratch);
    const char *argv[] = {s_dd_path (), input, "of=/dev/null", "bs=1M", "iflag=direct", NULL};
    double start = bench_now ();
    pid_t pid = bench_spawn (argv, log);
    if (pid < 0) {
        s_fail (self, "fork: %s", strerror (errno));
        return -1;
    }
    int status = bench_wait (pid);
    double wall = bench_now () - start;
    char text[2048] = "";
    FILE *file = fopen (log, "r");
    if (file) {
        size_t length = fread (text, 1, sizeof text - 1, file);
        text[length] = 0;
        fclose (file);
    }
    //  "536870912 bytes (537 MB, 512 MiB) copied, 0.811473 s, 662 MB/s"; a locale may write
    //  the seconds with a decimal comma.
    char *copied = strstr (text, " copied, ");
    char *line = copied;
    while (line && line > text && line[-1] != '\n')
        line--;
    uint64_t got = line ? strtoull (line, NULL, 10) : 0;
    if (status != 0 || got != bytes) {
        s_fail (self,
                "%s %s of=/dev/null bs=1M iflag=direct: exit status %d, %" PRIu64
                " bytes copied, not %" PRIu64 ": %s",
                argv[0], input, status, got, bytes, text);
        return -1;
    }
    double seconds = 0;
    char number[32];
    size_t n = 0;
    for (const char *p = copied + 9;
         n + 1 < sizeof number && (*p == ',' || *p == '.' || (*p >= '0' && *p <= '9')); p++)
        number[n++] = *p == ',' ? '.' : *p;
    number[n] = 0;
    seconds = strtod (number, NULL);
    *rate_p = bytes / (seconds > 0 ? seconds : wall);
    return 0;
}

enum { READ_INTO, READ_ZERO_COPY, READ_MEMORY, READ_COUNT };
static const char *s_read_names[READ_COUNT] = {"kvpool tcp, values on disk only",
                                               "kvpool tcp, values on disk only",
                                               "kvpool tcp, values in memory"};
static const char *s_read_apis[READ_COUNT] = {
    "kvpool_get_batch_into, 16", "kvpool_get_batch (zero-copy), 16", "kvpool_get_batch_into, 16"};

//  Reads keys first .. first+count-1 in batches of DISK_BATCH (into buffers, or zero-copy),
//  passes times; *rate_p in bytes per second of the calls' time. Every value is checked, and
//  disk_hits must grow by exactly the values read (disk) or not at all (memory).
static int
s_read_run (tier_t *self, size_t first, size_t count, int passes, bool zero_copy, bool disk,
            uint8_t *buffers, double *rate_p)
{
    char names[DISK_BATCH][KEY_MAX];
    const char *keys[DISK_BATCH];
    void *targets[DISK_BATCH];
    size_t capacities[DISK_BATCH];
    int64_t results[DISK_BATCH];
    int statuses[DISK_BATCH];
    const char *api = zero_copy ? "kvpool_get_batch" : "kvpool_get_batch_into";
    kvpool_stats_t before, after;
    if (s_stats (self, &before))
        return -1;
    double busy = 0;
    for (size_t done = 0; done < count * passes; done += DISK_BATCH) {
        size_t n = count - done % count < DISK_BATCH ? count - done % count : DISK_BATCH;
        for (size_t i = 0; i < n; i++) {
            s_disk_key (names[i], first + done % count + i);
            keys[i] = names[i];
            targets[i] = buffers + i * DISK_VALUE;
            capacities[i] = DISK_VALUE;
            memset (targets[i], 0, 64); //  a stale value must not pass the check
        }
        kvpool_values_t *values = NULL;
        double start = bench_now ();
        int rc = zero_copy
                     ? kvpool_get_batch (self->client, n, keys, &values, statuses)
                     : kvpool_get_batch_into (self->client, n, keys, targets, capacities, results);
        busy += bench_now () - start;
        for (size_t i = 0; zero_copy && rc == KVPOOL_OK && i < n; i++) {
            results[i] =
                statuses[i] == KVPOOL_OK ? (int64_t) kvpool_values_size (values, i) : statuses[i];
            targets[i] = (void *) kvpool_values_data (values, i);
        }
        bool bad = false;
        for (size_t i = 0; rc == KVPOOL_OK && !bad && i < n; i++) {
            bad = true;
            if (results[i] != (int64_t) DISK_VALUE || !targets[i])
                s_fail (self, "%s %s: %s", api, keys[i],
                        results[i] < 0 ? kvpool_status_name ((int) results[i]) : "wrong size");
            else if (!bench_holds (targets[i], DISK_VALUE, first + done % count + i))
                s_fail (self, "%s %s: the value differs from what was put", api, keys[i]);
            else
                bad = false;
        }
        kvpool_values_destroy (&values);
        if (rc != KVPOOL_OK)
            s_fail (self, "%s: %s: %s", api, kvpool_status_name (rc),
                    kvpool_last_error (self->client));
        if (bad || rc != KVPOOL_OK)
            return -1;
    }
    if (s_stats (self, &after))
        return -1;
    uint64_t hits = after.disk_hits - before.disk_hits;
    if (hits != (disk ? count * passes : 0)) {
        s_fail (self, "reading %zu values %s raised disk_hits by %" PRIu64, count * passes,
                disk ? "on disk only" : "in memory", hits);
        return -1;
    }
    *rate_p = count * passes * (double) DISK_VALUE / busy;
    return 0;
}

static void
s_print_runs (const double *values, int count, double scale)
{
    printf ("  ");
    for (int i = 0; i < count; i++)
        printf (" %.3f", values[i] / scale);
    printf ("\n");
}

static void
s_part_disk (tier_t *self)
{
    size_t total = self->quick ? 128 : 512;
    size_t count = total - DISK_POOL_MIB; //  the oldest: they cannot be in memory
    char dir[300], file[300], io[128];
    snprintf (dir, sizeof dir, "%s/disk-tier", self->scratch);
    snprintf (file, sizeof file, "%s/dd-file", self->scratch);
    const char *args[] = {"--segment-size",
                          "64MiB",
                          "--disk-dir",
                          dir,
                          "--disk-capacity",
                          "4GiB",
                          "--promote-on-hit",
                          "0",
                          "--eviction-high-watermark",
                          "0.90",
                          NULL};
    uint8_t *buffers = (uint8_t *) s_buffer (DISK_BATCH * DISK_VALUE);
    double rate[READ_COUNT][MAX_REPS], dd_rate[MAX_REPS];
    int reps = 0;
    fprintf (stderr, "kvpool-bench: tier: disk-tier reads\n");
    if (s_start (self, "tier-disk", args))
        goto done;
    if (!buffers) {
        s_fail (self, "out of memory for buffers");
        goto done;
    }
    s_disk_io (self->daemon.log, io, sizeof io);

    //  The values, oldest first, one a call; all but the newest DISK_POOL_MIB are evicted to
    //  disk. With a disk tier, a put into the full pool can be refused (NO_AVAILABLE_HANDLE)
    //  when every candidate is still being copied to disk: the cycle frees nothing, and the
    //  evictor answers puts at once for a while (docs/tiers.md). That is counted, reported
    //  and retried here (the reads are what this part measures); any other failure fails it.
    char key[KEY_MAX];
    size_t refused_keys = 0, refusals = 0;
    double start = bench_now ();
    for (size_t k = 0; k < total; k++) {
        s_disk_key (key, k);
        bench_fill (buffers, DISK_VALUE, k);
        int rc;
        size_t before = refusals;
        double deadline = bench_now () + 5;
        while ((rc = kvpool_put (self->client, key, buffers, DISK_VALUE, NULL))
                   == KVPOOL_NO_AVAILABLE_HANDLE
               && bench_now () < deadline) {
            if (refusals++ == 0)
                fprintf (stderr, "kvpool-bench: tier: note: kvpool_put %s refused: %s (retried)\n",
                         key, kvpool_last_error (self->client));
            bench_sleep_ms (10);
        }
        refused_keys += refusals > before;
        if (rc != KVPOOL_OK) {
            s_fail (self, "kvpool_put of a 1 MiB value into a full pool (%s): %s: %s", key,
                    kvpool_status_name (rc), kvpool_last_error (self->client));
            goto done;
        }
    }
    double put_seconds = bench_now () - start;
    kvpool_stats_t stats;
    if (s_settle (self, 60, &stats))
        goto done;
    if (stats.disk_objects < count || stats.evictions_dropped != 0) {
        s_fail (self, "%" PRIu64 " values on disk (%" PRIu64 " dropped), expected at least %zu",
                stats.disk_objects, stats.evictions_dropped, count);
        goto done;
    }
    uint64_t bytes = count * DISK_VALUE;
    if (s_write_file (self, file, count, buffers, DISK_BATCH))
        goto done;

    //  The tcp path's own ceiling in this daemon: the newest values, those in memory (objects
    //  are evicted oldest first, and the ones on disk have no memory left).
    size_t in_memory = stats.objects - stats.disk_objects;
    in_memory = in_memory / DISK_BATCH * DISK_BATCH;
    for (int rep = 0; in_memory && rep < self->reps; rep++)
        if (s_read_run (self, total - in_memory, in_memory, MEMORY_READS / in_memory, false, false,
                        buffers, &rate[READ_MEMORY][rep]))
            goto done;
    //  Alternated, so that a burst of load from other users hits both alike.
    for (reps = 0; reps < self->reps; reps++)
        if (s_read_run (self, 0, count, 1, false, true, buffers, &rate[READ_INTO][reps])
            || s_read_run (self, 0, count, 1, true, true, buffers, &rate[READ_ZERO_COPY][reps])
            || s_dd_run (self, file, bytes, &dd_rate[reps]))
            goto done;

    double median[READ_COUNT], dd = bench_median (dd_rate, reps);
    for (int r = 0; r < READ_COUNT; r++)
        median[r] = bench_median (rate[r], r == READ_MEMORY && !in_memory ? 0 : reps);
    int best = median[READ_ZERO_COPY] > median[READ_INTO] ? READ_ZERO_COPY : READ_INTO;
    printf ("\n== tier: disk-tier reads of 1 MiB values against dd iflag=direct on the same disk "
            "(median of %d runs, alternated) ==\n",
            reps);
    printf ("kvpoold --segment-size %dMiB --disk-dir DIR --disk-capacity 4GiB --promote-on-hit 0 "
            "(%s, on %s)\n",
            DISK_POOL_MIB, io, self->fs);
    printf ("put %zu x 1 MiB, one a call, in %.2f s (%.2f GB/s; past 64 each evicts to disk); "
            "%" PRIu64 " on disk, the oldest %zu on disk only\n",
            total, put_seconds, total * (double) DISK_VALUE / put_seconds / 1e9, stats.disk_objects,
            count);
    if (refusals)
        printf ("note: %zu of the %zu puts were refused NO_AVAILABLE_HANDLE first (%zu refusals, "
                "each retried after 10 ms): a full pool with a disk tier does not always make "
                "room\n",
                refused_keys, total, refusals);
    printf ("%-34s %-34s %6s %7s   %s\n", "reader", "how", "MiB", "GB/s", "runs (GB/s)");
    for (int r = 0; r < READ_COUNT; r++) {
        printf ("%-34s %-34s %6zu %7.3f", s_read_names[r], s_read_apis[r],
                r != READ_MEMORY ? count : in_memory * (MEMORY_READS / (in_memory ? in_memory : 1)),
                median[r] / 1e9);
        s_print_runs (rate[r], r == READ_MEMORY && !in_memory ? 0 : reps, 1e9);
    }
    printf ("%-34s %-34s %6zu %7.3f", "dd, a file of the same bytes", "bs=1M iflag=direct", count,
            dd / 1e9);
    s_print_runs (dd_rate, reps, 1e9);
    printf ("disk tier / dd: %.2fx (kvpool_get_batch_into), %.2fx (kvpool_get_batch); disk_hits "
            "grew by %zu a run, by 0 for the %zu newest values (in memory)\n",
            median[READ_INTO] / dd, median[READ_ZERO_COPY] / dd, count, in_memory);
    double ratio = median[best] / dd;
    bench_goal (ratio >= 0.8,
                "disk-tier get throughput of 1 MiB objects >= 80%% of dd iflag=direct (%.2fx: "
                "%.3f GB/s (%s) against %.3f GB/s)",
                ratio, median[best] / 1e9,
                best == READ_INTO ? "kvpool_get_batch_into" : "kvpool_get_batch", dd / 1e9);
    bench_verdict ("tier",
                   "1 MiB gets from the disk tier at %.2fx of dd iflag=direct on the "
                   "same bytes (%.3f against %.3f GB/s)",
                   ratio, median[best] / 1e9, dd / 1e9);
done:
    if (self->errors)
        printf ("\n== tier: disk-tier reads: FAILED (see stderr) ==\n");
    s_finish (self);
    s_buffer_free (buffers, DISK_BATCH * DISK_VALUE);
    unlink (file);
}

//  ---- 2. the eviction cycle over a million objects -------------------------------------

typedef struct {
    uint64_t held;    //  objects in the pool when the cycle ran
    uint64_t evicted; //  objects it evicted
    uint64_t walk_us; //  eviction_walk_us after it
    uint64_t cycles;  //  cycles counted (more than 1: several ran back to back)
} cycle_t;

static void
s_small_key (char *key, size_t index)
{
    snprintf (key, KEY_MAX, "tier-small-%08zu", index);
}

//  Puts batches of SMALL_BATCH values, keys *next_p onwards. Returns 0 or -1.
static int
s_put_small (tier_t *self, size_t batches, size_t *next_p, uint8_t *values)
{
    char names[SMALL_BATCH][KEY_MAX];
    const char *keys[SMALL_BATCH];
    const void *data[SMALL_BATCH];
    size_t sizes[SMALL_BATCH];
    int statuses[SMALL_BATCH];
    for (size_t b = 0; b < batches; b++) {
        for (size_t i = 0; i < SMALL_BATCH; i++) {
            s_small_key (names[i], *next_p + i);
            keys[i] = names[i];
            bench_fill (values + i * SMALL_VALUE, SMALL_VALUE, *next_p + i);
            data[i] = values + i * SMALL_VALUE;
            sizes[i] = SMALL_VALUE;
        }
        int rc = kvpool_put_batch (self->client, SMALL_BATCH, keys, data, sizes, NULL, statuses);
        for (size_t i = 0; rc == KVPOOL_OK && i < SMALL_BATCH; i++)
            rc = statuses[i];
        if (rc != KVPOOL_OK) {
            s_fail (self, "kvpool_put_batch of %d small values (%s): %s: %s", SMALL_BATCH, keys[0],
                    kvpool_status_name (rc), kvpool_last_error (self->client));
            return -1;
        }
        *next_p += SMALL_BATCH;
    }
    return 0;
}

//  Fills the pool until it passes the high watermark, then waits for the cycle that follows
//  and reads what it did. Puts stop at the watermark, so the cycle walks a pool at rest.
static int
s_next_cycle (tier_t *self, size_t *next_p, uint8_t *values, double per_object, cycle_t *cycle)
{
    kvpool_stats_t stats, after;
    if (s_stats (self, &stats))
        return -1;
    uint64_t cycles = stats.eviction_cycles, evictions = stats.evictions;
    uint64_t walk_us = stats.eviction_walk_us, walk_max_us = stats.eviction_walk_max_us;
    size_t limit = *next_p + (size_t) (stats.bytes_mounted / per_object) + 10 * SMALL_BATCH;
    while (stats.eviction_cycles == cycles
           && stats.bytes_allocated < HIGH_WATERMARK * stats.bytes_mounted) {
        //  The batches that fit below the watermark, less one, between two looks.
        double room = HIGH_WATERMARK * stats.bytes_mounted - stats.bytes_allocated;
        size_t batches = (size_t) (room / per_object / SMALL_BATCH);
        batches = batches > 1 ? batches - 1 : 1;
        if (*next_p >= limit) {
            s_fail (self,
                    "the pool never reached its high watermark (%" PRIu64 " of %" PRIu64
                    " bytes allocated, %" PRIu64 " objects)",
                    stats.bytes_allocated, stats.bytes_mounted, stats.objects);
            return -1;
        }
        if (s_put_small (self, batches, next_p, values) || s_stats (self, &stats))
            return -1;
    }
    //  The evictor looks every 10 ms; its walk time is recorded when the cycle is back.
    double deadline = bench_now () + 5;
    do {
        if (s_stats (self, &after))
            return -1;
        if (after.eviction_cycles > cycles && after.evictions > evictions
            && (after.eviction_walk_us != walk_us || after.eviction_walk_max_us != walk_max_us))
            break;
        bench_sleep_ms (5);
    } while (bench_now () < deadline);
    if (after.eviction_cycles == cycles || after.evictions == evictions) {
        s_fail (self,
                "no eviction cycle ran within 5 s of passing the high watermark (%" PRIu64
                " objects, %" PRIu64 " of %" PRIu64 " bytes allocated)",
                after.objects, after.bytes_allocated, after.bytes_mounted);
        return -1;
    }
    if (after.evictions_dropped != after.evictions || after.eviction_stalls) {
        s_fail (self,
                "evictions %" PRIu64 ", of them dropped %" PRIu64 ", stalls %" PRIu64
                ": without a disk tier every eviction drops its object",
                after.evictions, after.evictions_dropped, after.eviction_stalls);
        return -1;
    }
    cycle->evicted = after.evictions - evictions;
    cycle->held = after.objects + cycle->evicted;
    cycle->walk_us = after.eviction_walk_us;
    cycle->cycles = after.eviction_cycles - cycles;
    return 0;
}

static void
s_part_eviction (tier_t *self)
{
    size_t target = self->quick ? 100000 : 1000000;
    int wanted = self->quick ? 3 : 5;
    uint8_t *values = (uint8_t *) s_buffer (SMALL_BATCH * SMALL_VALUE);
    cycle_t cycles[MAX_REPS];
    int measured = 0;
    double per_object = SMALL_VALUE; //  allocated bytes per object: a guess, then measured
    size_t pool_mib = 0, next = 0;
    double fill_seconds = 0;
    fprintf (stderr, "kvpool-bench: tier: eviction cycle\n");
    if (!values) {
        self->errors = 1;
        s_fail (self, "out of memory for buffers");
        self->failed_parts++;
        return;
    }
    //  A million objects just under the watermark: the pool's size follows from the bytes
    //  each takes, measured on the first 2%; a guess that was off by more than 0.5% starts
    //  the pool again, sized by the measurement.
    for (int attempt = 0; attempt < 2; attempt++) {
        pool_mib = (size_t) ceil (target * 1.003 * per_object / HIGH_WATERMARK / MiB);
        char size[32];
        snprintf (size, sizeof size, "%zuMiB", pool_mib);
        const char *args[] = {
            "--segment-size", size, "--eviction-high-watermark", "0.90", "--lease-ttl", "1", NULL};
        if (s_start (self, "tier-evict", args))
            goto done;
        next = 0;
        double start = bench_now ();
        kvpool_stats_t stats;
        if (s_put_small (self, target / 50 / SMALL_BATCH, &next, values) || s_stats (self, &stats))
            goto done;
        fill_seconds = bench_now () - start;
        if (stats.objects != next || stats.eviction_cycles) {
            s_fail (self, "%zu objects put, the pool holds %" PRIu64 " (%" PRIu64 " cycles)", next,
                    stats.objects, stats.eviction_cycles);
            goto done;
        }
        double measured_per_object = (double) stats.bytes_allocated / stats.objects;
        if (fabs (measured_per_object - per_object) <= 0.005 * per_object || attempt == 1) {
            per_object = measured_per_object;
            break;
        }
        per_object = measured_per_object;
        if (s_finish (self))
            goto out;
    }
    double start = bench_now ();
    if (s_next_cycle (self, &next, values, per_object, &cycles[0]))
        goto done;
    fill_seconds += bench_now () - start;
    size_t filled = next;
    measured = 1;
    while (measured < wanted)
        if (s_next_cycle (self, &next, values, per_object, &cycles[measured++]))
            goto done;

    //  The newest values read back; the oldest are gone (no disk tier: dropped).
    uint8_t value[SMALL_VALUE];
    char key[KEY_MAX];
    for (size_t i = 1; i <= 3; i++) {
        s_small_key (key, next - i);
        int64_t got = kvpool_get_into (self->client, key, value, sizeof value);
        if (got != SMALL_VALUE || !bench_holds (value, SMALL_VALUE, next - i)) {
            s_fail (self, "get %s after the cycles: %s", key,
                    got < 0 ? kvpool_status_name ((int) got) : "the value differs");
            goto done;
        }
    }
    s_small_key (key, 0);
    if (kvpool_exist (self->client, key) != 0) {
        s_fail (self, "%s, the oldest object, is still there after %d cycles", key, measured);
        goto done;
    }
    kvpool_stats_t stats;
    if (s_stats (self, &stats))
        goto done;

    double walks[MAX_REPS];
    uint64_t held_min = UINT64_MAX;
    printf ("\n== tier: eviction cycles over %zu small objects (%d-byte values, no disk tier, "
            "--lease-ttl 1) ==\n",
            target, SMALL_VALUE);
    printf ("kvpoold --segment-size %zuMiB --eviction-high-watermark 0.90: %.0f bytes allocated "
            "an object; %zu objects put to the first cycle in %.2f s (batches of %d, %.0f "
            "objects/s)\n",
            pool_mib, per_object, filled, fill_seconds, SMALL_BATCH, filled / fill_seconds);
    printf ("%-6s %14s %10s %12s %8s\n", "cycle", "objects held", "evicted", "walk (ms)", "cycles");
    for (int i = 0; i < measured; i++) {
        walks[i] = (double) cycles[i].walk_us;
        if (cycles[i].held < held_min)
            held_min = cycles[i].held;
        printf ("%-6d %14" PRIu64 " %10" PRIu64 " %12.2f %8" PRIu64 "\n", i + 1, cycles[i].held,
                cycles[i].evicted, cycles[i].walk_us / 1e3, cycles[i].cycles);
    }
    double median = bench_median (walks, measured);
    printf ("walk (eviction_walk_us): median %.2f ms, last %.2f ms, longest %.2f ms "
            "(eviction_walk_max_us) over %" PRIu64 " cycles; the pool holds %" PRIu64 " objects\n",
            median / 1e3, stats.eviction_walk_us / 1e3, stats.eviction_walk_max_us / 1e3,
            stats.eviction_cycles, stats.objects);
    if (held_min < 1000000)
        printf ("goal not measured: an eviction cycle over a million cold objects < 50 ms "
                "(%s: %" PRIu64 " objects; median walk %.2f ms)\n",
                self->quick ? "quick run" : "fewer objects", held_min, median / 1e3);
    else
        bench_goal (median < WALK_TARGET_US,
                    "an eviction cycle over a million cold objects < 50 ms (median walk %.2f ms, "
                    "%.2fx the 50 ms; longest %.2f ms; %d cycles over %" PRIu64 "+ objects)",
                    median / 1e3, median / WALK_TARGET_US, stats.eviction_walk_max_us / 1e3,
                    measured, held_min);
done:
    if (self->errors)
        printf ("\n== tier: eviction cycles: FAILED (see stderr) ==\n");
    s_finish (self);
out:
    s_buffer_free (values, SMALL_BATCH * SMALL_VALUE);
}

//  ---- 3. 4 MiB puts, empty pool against constant overflow ------------------------------

enum { PHASE_EMPTY, PHASE_OVERFLOW, PHASE_COUNT };

typedef struct {
    const char *name;
    bool disk;
    int reps;
    double rate[PHASE_COUNT][MAX_REPS]; //  bytes per second of the calls' time
    double *latency[PHASE_COUNT];       //  seconds per put, all repetitions
    size_t calls[PHASE_COUNT];
    uint64_t failed[PHASE_COUNT]; //  puts refused
    uint64_t fill_failed;         //  puts refused while filling the pool (untimed)
    bool ok;
} put_row_t;

static void
s_put_key (char *key, int rep, size_t index)
{
    snprintf (key, KEY_MAX, "tier-put-%d-%05zu", rep, index);
}

//  Puts keys first .. first+count-1 (value of key k: sources[k % PUT_SOURCES]); the time of
//  each put goes to latency (when not NULL). Returns the seconds the puts took. A put refused
//  NO_AVAILABLE_HANDLE (the pool could not make room) is marked in refused[k] and counted in
//  *refused_p: a missed target, reported; any other failure fails the part.
static double
s_put_range (tier_t *self, int rep, size_t first, size_t count, uint8_t **sources, double *latency,
             bool *refused, uint64_t *refused_p)
{
    char key[KEY_MAX];
    double busy = 0;
    for (size_t k = first; k < first + count && !self->errors; k++) {
        s_put_key (key, rep, k);
        double start = bench_now ();
        int rc = kvpool_put (self->client, key, sources[k % PUT_SOURCES], PUT_VALUE, NULL);
        double elapsed = bench_now () - start;
        busy += elapsed;
        if (latency)
            latency[k - first] = elapsed;
        refused[k] = rc == KVPOOL_NO_AVAILABLE_HANDLE;
        if (rc == KVPOOL_NO_AVAILABLE_HANDLE && ++*refused_p == 1)
            fprintf (stderr, "kvpool-bench: tier: note: kvpool_put %s (4 MiB) refused: %s\n", key,
                     kvpool_last_error (self->client));
        else if (rc != KVPOOL_OK && rc != KVPOOL_NO_AVAILABLE_HANDLE)
            s_fail (self, "kvpool_put %s (4 MiB): %s: %s", key, kvpool_status_name (rc),
                    kvpool_last_error (self->client));
    }
    return busy;
}

static int
s_check_put (tier_t *self, int rep, size_t index, uint8_t **sources, uint8_t *target)
{
    char key[KEY_MAX];
    s_put_key (key, rep, index);
    memset (target, 0, 64);
    int64_t got = kvpool_get_into (self->client, key, target, PUT_VALUE);
    if (got != (int64_t) PUT_VALUE || memcmp (target, sources[index % PUT_SOURCES], PUT_VALUE)) {
        s_fail (self, "get %s after the puts: %s", key,
                got < 0 ? kvpool_status_name ((int) got) : "the value differs");
        return -1;
    }
    return 0;
}

//  One row: a kvpoold of its own, reps x (empty pool, fill, overflow).
static void
s_put_row (tier_t *self, put_row_t *row, uint8_t **sources, uint8_t *target)
{
    char dir[300];
    snprintf (dir, sizeof dir, "%s/put-tier", self->scratch);
    const char *memory[] = {"--segment-size", "256MiB", NULL};
    const char *disk[] = {"--segment-size",  "256MiB", "--disk-dir", dir,
                          "--disk-capacity", "4GiB",   NULL};
    size_t fits = PUT_POOL_MIB * MiB / PUT_VALUE; //  64
    size_t empty = (size_t) (0.8 * fits);         //  0.8 x pool
    size_t overflow = (size_t) ceil (1.5 * fits); //  1.5 x pool
    for (int phase = 0; phase < PHASE_COUNT; phase++) {
        size_t per_rep = phase == PHASE_EMPTY ? empty : overflow;
        row->latency[phase] = (double *) calloc (self->reps * per_rep, sizeof (double));
    }
    bool *refused = (bool *) calloc (fits + overflow, sizeof (bool)); //  by key, this rep
    if (s_start (self, row->disk ? "tier-put-disk" : "tier-put", row->disk ? disk : memory))
        goto done;
    if (!row->latency[PHASE_EMPTY] || !row->latency[PHASE_OVERFLOW] || !refused) {
        s_fail (self, "out of memory");
        goto done;
    }
    for (int rep = 0; rep < self->reps; rep++) {
        //  An empty pool: nothing stored, nothing being written to disk.
        kvpool_stats_t stats;
        int64_t removed = kvpool_remove_all (self->client, true);
        if (removed < 0) {
            s_fail (self, "kvpool_remove_all: %s", kvpool_status_name ((int) removed));
            goto done;
        }
        double deadline = bench_now () + 10;
        while (s_stats (self, &stats) == 0
               && (stats.objects || stats.bytes_allocated || stats.offload_queue
                   || stats.disk_objects)) {
            if (bench_now () > deadline) {
                s_fail (self,
                        "the pool is not empty 10 s after kvpool_remove_all (%" PRIu64
                        " objects, %" PRIu64 " bytes allocated, %" PRIu64 " on disk)",
                        stats.objects, stats.bytes_allocated, stats.disk_objects);
                goto done;
            }
            bench_sleep_ms (10);
        }
        if (self->errors)
            goto done;
        uint64_t evictions = stats.evictions;
        double busy = s_put_range (self, rep, 0, empty, sources,
                                   row->latency[PHASE_EMPTY] + row->calls[PHASE_EMPTY], refused,
                                   &row->failed[PHASE_EMPTY]);
        row->rate[PHASE_EMPTY][rep] = empty * (double) PUT_VALUE / busy;
        row->calls[PHASE_EMPTY] += empty;
        //  Untimed: to a full pool, where every put evicts.
        s_put_range (self, rep, empty, fits - empty, sources, NULL, refused, &row->fill_failed);
        busy = s_put_range (self, rep, fits, overflow, sources,
                            row->latency[PHASE_OVERFLOW] + row->calls[PHASE_OVERFLOW], refused,
                            &row->failed[PHASE_OVERFLOW]);
        if (self->errors)
            goto done;
        row->rate[PHASE_OVERFLOW][rep] = overflow * (double) PUT_VALUE / busy;
        row->calls[PHASE_OVERFLOW] += overflow;
        row->reps = rep + 1;
        //  With a disk tier an object's memory is freed (and counted) once its copy is written.
        kvpool_stats_t after;
        if (row->disk ? s_drain_offloads (self, 60, &after) : s_stats (self, &after))
            goto done;
        uint64_t evicted = after.evictions - evictions;
        if (evicted < overflow / 2) {
            s_fail (self, "%zu puts of 4 MiB into a full pool evicted only %" PRIu64 " objects",
                    overflow, evicted);
            goto done;
        }
        //  The newest two values (that were stored) are in memory; with a disk tier, the
        //  first of the rep was evicted to disk and reads back from there.
        size_t checked = 0;
        for (size_t k = fits + overflow; k-- > 0 && checked < 2;)
            if (!refused[k]) {
                if (s_check_put (self, rep, k, sources, target))
                    goto done;
                checked++;
            }
        if (row->disk && !refused[0] && s_check_put (self, rep, 0, sources, target))
            goto done;
    }
    row->ok = true;
done:
    free (refused);
    s_finish (self);
}

static void
s_part_puts (tier_t *self)
{
    put_row_t rows[2] = {{.name = "memory only", .disk = false},
                         {.name = "memory + disk (on-evict)", .disk = true}};
    uint8_t *sources[PUT_SOURCES] = {NULL};
    uint8_t *target = (uint8_t *) s_buffer (PUT_VALUE);
    bool ok = target != NULL;
    fprintf (stderr, "kvpool-bench: tier: puts under overflow\n");
    for (int i = 0; i < PUT_SOURCES; i++) {
        sources[i] = (uint8_t *) s_buffer (PUT_VALUE);
        if (sources[i])
            bench_fill (sources[i], PUT_VALUE, (2ULL << 40) + i);
        ok = ok && sources[i];
    }
    if (!ok) {
        self->errors = 1;
        s_fail (self, "out of memory for buffers");
        self->failed_parts++;
        goto done;
    }
    for (int r = 0; r < 2; r++)
        s_put_row (self, &rows[r], sources, target);
    if (rows[0].reps == 0 && rows[1].reps == 0) {
        printf ("\n== tier: 4 MiB puts under overflow: FAILED (see stderr) ==\n");
        goto done;
    }

    size_t fits = PUT_POOL_MIB * MiB / PUT_VALUE;
    printf ("\n== tier: 4 MiB puts into a %d MiB pool, empty against constant overflow "
            "(kvpool_put over tcp, one key a call; median of %d runs) ==\n",
            PUT_POOL_MIB, self->reps);
    printf ("empty: %zu puts (0.8 x pool) after kvpool_remove_all; overflow: %zu puts (1.5 x "
            "pool) into a pool filled to 1.0 x, each evicting\n",
            (size_t) (0.8 * fits), (size_t) ceil (1.5 * fits));
    printf ("%-26s %-9s %9s %9s %9s %7s %7s   %s\n", "pool", "phase", "MB/s", "p50 ms", "p99 ms",
            "puts", "failed", "runs (MB/s)");
    double ratio[2] = {NAN, NAN}, p50_overflow[2] = {NAN, NAN};
    for (int r = 0; r < 2; r++) {
        put_row_t *row = &rows[r];
        for (int phase = 0; phase < PHASE_COUNT; phase++) {
            printf ("%-26s %-9s", row->name, phase == PHASE_EMPTY ? "empty" : "overflow");
            if (row->reps == 0) {
                printf (" %9s\n", "FAILED");
                continue;
            }
            double rate = bench_median (row->rate[phase], row->reps);
            double p50 = bench_quantile (row->latency[phase], row->calls[phase], 0.5) * 1e3;
            double p99 = bench_quantile (row->latency[phase], row->calls[phase], 0.99) * 1e3;
            printf (" %9.1f %9.2f %9.2f %7zu %7" PRIu64, rate / 1e6, p50, p99, row->calls[phase],
                    row->failed[phase]);
            s_print_runs (row->rate[phase], row->reps, 1e6);
            if (phase == PHASE_OVERFLOW) {
                ratio[r] = rate / bench_median (row->rate[PHASE_EMPTY], row->reps);
                p50_overflow[r] = p50;
            }
        }
    }
    printf ("overflow / empty: memory only %.2fx; with a disk tier %.2fx (every evicted value is "
            "written to disk before its memory is reused)\n",
            ratio[0], ratio[1]);
    printf ("p50 of a 4 MiB put under overflow: %.2f ms memory only (%.2fx Mooncake's), %.2f ms "
            "with a disk tier (%.2fx); reference: Mooncake reports %.1f ms on a machine of this "
            "kind\n",
            p50_overflow[0], p50_overflow[0] / MOONCAKE_P50_MS, p50_overflow[1],
            p50_overflow[1] / MOONCAKE_P50_MS, MOONCAKE_P50_MS);
    for (int r = 0; r < 2; r++)
        if (rows[r].fill_failed)
            printf ("note: %s: %" PRIu64
                    " puts refused while filling the pool to 1.0 x (untimed)\n",
                    rows[r].name, rows[r].fill_failed);
    uint64_t failed[2];
    for (int r = 0; r < 2; r++)
        failed[r] =
            rows[r].failed[PHASE_EMPTY] + rows[r].failed[PHASE_OVERFLOW] + rows[r].fill_failed;
    bool clean = rows[0].ok && failed[0] == 0;
    bench_goal (clean && ratio[0] >= 0.8,
                "4 MiB put throughput at 1.5x overflow >= 80%% of an empty pool's, 0 failed "
                "puts (memory only %.2fx, %" PRIu64 " failed, p50 %.2f ms; with a disk tier "
                "%.2fx, %" PRIu64 " failed)",
                ratio[0], failed[0], p50_overflow[0], ratio[1], failed[1]);
    bench_verdict ("overflow",
                   "4 MiB puts into a pool 1.5x over full run at %.2fx of an empty "
                   "pool's rate (%" PRIu64 " failed); with a disk tier %.2fx",
                   ratio[0], failed[0], ratio[1]);
done:
    for (int r = 0; r < 2; r++)
        for (int phase = 0; phase < PHASE_COUNT; phase++)
            free (rows[r].latency[phase]);
    for (int i = 0; i < PUT_SOURCES; i++)
        s_buffer_free (sources[i], PUT_VALUE);
    s_buffer_free (target, PUT_VALUE);
}

//  ---- the section ---------------------------------------------------------------------

int
bench_tier_run (const char *kvpoold_path, bool quick)
{
    tier_t *self = (tier_t *) calloc (1, sizeof *self);
    if (!self)
        return -1;
    self->kvpoold_path = kvpoold_path;
    self->quick = quick;
    self->reps = quick ? 2 : 3;
    if (bench_scratch_new ("tier", self->scratch, sizeof self->scratch)) {
        free (self);
        return -1;
    }
    s_fs_name (self->scratch, self->fs, sizeof self->fs);
    double start = bench_now ();
    printf ("\n== tier: eviction and the disk tier (kvpoolds of its own from %s; scratch %s on "
            "%s) ==\n",
            kvpoold_path, self->scratch, self->fs);
    s_part_disk (self);
    s_part_eviction (self);
    s_part_puts (self);
    bench_scratch_remove ();
    printf ("tier: %.1f s%s\n", bench_now () - start,
            self->failed_parts ? ", with failures (see stderr)" : "");
    int rc = self->failed_parts ? -1 : 0;
    free (self);
    return rc;
}
