/*  test_absent.c - absent keys answered on the same machine, and never a key the node holds.

    A node without a master vouches for absence in its read index (shm/shm_index.h, "Absent
    keys"): a same-machine client answers "absent" for a key in no slot and not counted
    among the node's unlisted keys, with no message. The danger is a key the node holds
    that a reader finds in neither place while it moves: withdrawn for the disk tier,
    promoted back, replaced by an upsert. So:

      1. In turn, with nothing else running: an absent key is answered by
         kvpool_exist_batch_local (nothing sent), a key on the node's disk only is left for
         the node (it holds it), and so is a key too long for a slot; a get of an absent key
         is OBJECT_NOT_FOUND, and the node's stats count it a miss.
      2. Under fire: writers upsert a few keys without end (each upsert drops the old object
         and enters the new one) and push the pool over its memory with fresh values, so
         that keys go to disk and, read twice, come back; readers ask about the held keys and
         absent ones, with kvpool_exist_batch_local, kvpool_exist_batch and gets. No held key
         may ever be answered absent; the absent ones must mostly be answered without the
         node.
*/
#include <czmq.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "kvpool.h"
#include "tests/testutil.h"

#define HELD 16   //  keys the node holds from start to end
#define ABSENT 16 //  keys nobody ever puts
#define RUN_MS 3000
#define CHURN_SIZE (256 << 10)
#define COLD_CHECK_MS 300 //  how often a reader asks about the cold held keys
#define COLD_READ_MS 40   //  how often the churner gets one of them

//  The node under test: killed if a check fails (CHECK exits), so that nothing outlives
//  the test.
static testutil_server_t s_server;

static void
s_kill_server (void)
{
    if (s_server.pid > 0)
        kill (s_server.pid, SIGKILL);
}

//  Starts the node under test: a pool of segment, a disk tier of capacity in disk_dir, values
//  read twice from disk promoted, and read leases of 1 ms (the reads here keep nothing from
//  going to disk).
static testutil_server_t *
s_start (const char *segment, const char *disk_dir, const char *capacity)
{
    const char *args[] = {"--segment-size",
                          segment,
                          "--disk-dir",
                          disk_dir,
                          "--disk-capacity",
                          capacity,
                          "--promote-on-hit",
                          "2",
                          "--lease-ttl",
                          "1",
                          NULL};
    CHECK (testutil_server_start (&s_server, args) == 0);
    return &s_server;
}

static void
s_held_key (char *buf, size_t size, int i)
{
    snprintf (buf, size, "held/%02d", i);
}

//  The keys a reader asks about: HELD held ones, then ABSENT absent ones.
static void
s_keys (char names[][32], const char **keys, size_t *lens)
{
    for (int i = 0; i < HELD + ABSENT; i++) {
        if (i < HELD)
            s_held_key (names[i], 32, i);
        else
            snprintf (names[i], 32, "absent/%02d", i - HELD);
        keys[i] = names[i];
        lens[i] = strlen (names[i]);
    }
}

static kvpool_t *
s_connect (const char *endpoint)
{
    kvpool_t *pool = kvpool_connect (endpoint, NULL);
    CHECK (pool);
    CHECK (kvpool_fast_path (pool));
    CHECK (kvpool_set_index (pool, true));
    return pool;
}

//  1. Each case in turn.
static void
s_test_in_turn (const char *disk_dir)
{
    testutil_server_t *server = s_start ("8MiB", disk_dir, "256MiB");
    kvpool_t *pool = s_connect (server->endpoint);
    char value[4096];
    memset (value, 'v', sizeof value);
    CHECK_EQ (kvpool_put (pool, "cold", value, sizeof value, NULL), KVPOOL_OK);
    char long_key[300];
    memset (long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = 0;
    CHECK_EQ (kvpool_put (pool, long_key, value, sizeof value, NULL), KVPOOL_OK);

    const char *keys[] = {"cold", "nobody", long_key};
    size_t lens[] = {4, 6, strlen (long_key)};
    int exists[3] = {7, 7, 7};
    size_t rest[3], nrest = 99;
    CHECK_EQ (kvpool_exist_batch_local (pool, 3, keys, lens, exists, rest, &nrest), KVPOOL_OK);
    CHECK_EQ (exists[0], 1);
    CHECK_EQ (exists[1], 0); //  absent, answered here
    CHECK_EQ (nrest, 1);     //  the long key: held, not in a slot, asked about
    CHECK_EQ (rest[0], 2);
    CHECK_EQ (exists[2], 7);
    int64_t sizes[3];
    CHECK_EQ (kvpool_get_size_batch_local (pool, 3, keys, lens, sizes, rest, &nrest), KVPOOL_OK);
    CHECK_EQ (sizes[0], (int64_t) sizeof value);
    CHECK_EQ (sizes[1], KVPOOL_OBJECT_NOT_FOUND);
    CHECK_EQ (nrest, 1);
    //  The full calls agree, the long key answered by the node.
    CHECK_EQ (kvpool_exist_batch (pool, 3, keys, exists), KVPOOL_OK);
    CHECK (exists[0] == 1 && exists[1] == 0 && exists[2] == 1);

    //  A get of the absent key: not found, and a miss in the node's stats.
    kvpool_stats_t before, after;
    CHECK_EQ (kvpool_stats (pool, &before), KVPOOL_OK);
    char out[4096];
    CHECK_EQ (kvpool_get_into (pool, "nobody", out, sizeof out), KVPOOL_OBJECT_NOT_FOUND);
    kvpool_destroy (&pool); //  (the last reads are reported at close)
    pool = s_connect (server->endpoint);
    CHECK_EQ (kvpool_stats (pool, &after), KVPOOL_OK);
    CHECK_EQ (after.gets - before.gets, 1);
    CHECK_EQ (after.get_hits, before.get_hits);

    //  Values that overflow the pool go to disk: held, so never answered absent, and left
    //  for the node while on disk only. (Asked about only once they settled: a read here
    //  counts as a use, which would keep a value in memory.)
    enum { FILLS = 24, FILL_SIZE = 1 << 20 };
    char *big = malloc (FILL_SIZE);
    CHECK (big);
    memset (big, 'b', FILL_SIZE);
    char fill_names[FILLS + 1][32];
    const char *fills[FILLS + 1];
    size_t fill_lens[FILLS + 1];
    for (int i = 0; i < FILLS; i++) {
        snprintf (fill_names[i], sizeof fill_names[i], "fill/%02d", i);
        fills[i] = fill_names[i];
        fill_lens[i] = strlen (fills[i]);
        CHECK_EQ (kvpool_put (pool, fills[i], big, FILL_SIZE, NULL), KVPOOL_OK);
    }
    fills[FILLS] = "nobody";
    fill_lens[FILLS] = 6;
    kvpool_stats_t stats;
    for (int tries = 0; tries < 500; tries++) {
        CHECK_EQ (kvpool_stats (pool, &stats), KVPOOL_OK);
        if (stats.disk_objects >= FILLS / 2 && stats.offload_queue == 0)
            break;
        zclock_sleep (10);
    }
    CHECK (stats.disk_objects >= FILLS / 2);
    int fill_exists[FILLS + 1];
    size_t fill_rest[FILLS + 1], on_disk = 0;
    CHECK_EQ (kvpool_exist_batch_local (pool, FILLS + 1, fills, fill_lens, fill_exists, fill_rest,
                                        &nrest),
              KVPOOL_OK);
    CHECK_EQ (fill_exists[FILLS], 0);
    int in_memory = -1;
    for (size_t i = 0, r = 0; i < FILLS; i++) {
        if (r < nrest && fill_rest[r] == i) {
            r++;
            on_disk++;
        }
        else {
            CHECK_EQ (fill_exists[i], 1); //  never 0: it is held
            in_memory = (int) i;
        }
    }
    CHECK (on_disk >= FILLS / 2 && on_disk == nrest);
    printf ("in turn: %zu of %d values on disk only, asked about\n", on_disk, FILLS);
    CHECK_EQ (kvpool_exist_batch (pool, FILLS + 1, fills, fill_exists), KVPOOL_OK);
    for (int i = 0; i <= FILLS; i++)
        CHECK_EQ (fill_exists[i], i < FILLS);
    //  Read twice from disk, one is promoted (given room): in a slot again, answered here.
    const char *promoted = fills[fill_rest[0]];
    size_t promoted_len = fill_lens[fill_rest[0]];
    if (in_memory >= 0)
        CHECK_EQ (kvpool_remove (pool, fills[in_memory], true), KVPOOL_OK);
    for (int i = 0; i < 2; i++)
        CHECK_EQ (kvpool_get_into (pool, promoted, big, FILL_SIZE), FILL_SIZE);
    for (int tries = 0; tries < 500; tries++) {
        CHECK_EQ (
            kvpool_exist_batch_local (pool, 1, &promoted, &promoted_len, exists, rest, &nrest),
            KVPOOL_OK);
        if (nrest == 0)
            break;
        zclock_sleep (10);
    }
    CHECK_EQ (nrest, 0);
    CHECK_EQ (exists[0], 1);
    free (big);
    kvpool_destroy (&pool);
    CHECK_EQ (testutil_server_stop (server, SIGTERM), 0);
    printf ("in turn: absent answered here, held keys on disk or too long asked about\n");
}

//  2. Under fire: the roles, each a process.

static int
s_upserter (const char *endpoint)
{
    kvpool_t *pool = s_connect (endpoint);
    char value[2048];
    uint64_t upserts = 0;
    int64_t deadline = zclock_mono () + RUN_MS;
    while (zclock_mono () < deadline)
        for (int i = 0; i < HELD / 2; i++) {
            char key[32];
            s_held_key (key, sizeof key, i);
            memset (value, 'a' + (int) (upserts % 26), sizeof value);
            int rc = kvpool_upsert (pool, key, value, sizeof value, NULL);
            CHECK (rc == KVPOOL_OK || rc == KVPOOL_NO_AVAILABLE_HANDLE
                   || rc == KVPOOL_REPLICA_IS_NOT_READY);
            upserts++;
        }
    printf ("upserter: %llu upserts\n", (unsigned long long) upserts);
    kvpool_destroy (&pool);
    return 0;
}

//  Fresh values that overflow the pool, so held keys the readers leave alone go to disk;
//  gets of those now and then (from disk, then promoted by the second).
static int
s_churner (const char *endpoint)
{
    kvpool_t *pool = s_connect (endpoint);
    char *value = malloc (CHURN_SIZE);
    CHECK (value);
    memset (value, 'c', CHURN_SIZE);
    char out[4096];
    uint64_t puts = 0, colds = 0;
    int64_t deadline = zclock_mono () + RUN_MS, next_cold = 0;
    while (zclock_mono () < deadline) {
        char key[32];
        snprintf (key, sizeof key, "churn/%llu", (unsigned long long) (puts % 256));
        int rc = kvpool_upsert (pool, key, value, CHURN_SIZE, NULL);
        CHECK (rc == KVPOOL_OK || rc == KVPOOL_NO_AVAILABLE_HANDLE
               || rc == KVPOOL_REPLICA_IS_NOT_READY);
        puts++;
        //  A cold key now and then: read from disk when it went there, promoted by the
        //  second read.
        if (zclock_mono () >= next_cold) {
            s_held_key (key, sizeof key, HELD / 2 + (int) (colds++ % (HELD / 2)));
            int64_t got = kvpool_get_into (pool, key, out, sizeof out);
            CHECK (got == (int64_t) sizeof out);
            next_cold = zclock_mono () + COLD_READ_MS;
        }
    }
    printf ("churner: %llu puts of %d KiB\n", (unsigned long long) puts, CHURN_SIZE >> 10);
    free (value);
    kvpool_destroy (&pool);
    return 0;
}

//  Asks about keys[0 .. n) (held ones first, then absent ones from absent_from on): here
//  alone, then with the full call. Returns false if a held key was answered absent.
static bool
s_ask (kvpool_t *pool, int id, size_t n, const char **keys, const size_t *lens, size_t absent_from,
       uint64_t *counts)
{
    int exists[HELD + ABSENT];
    size_t rest[HELD + ABSENT], nrest;
    CHECK_EQ (kvpool_exist_batch_local (pool, n, keys, lens, exists, rest, &nrest), KVPOOL_OK);
    for (size_t i = 0, r = 0; i < n; i++) {
        bool left = r < nrest && rest[r] == i;
        r += left;
        if (left)
            counts[2]++;
        else if (i < absent_from) {
            if (exists[i] != 1) {
                fprintf (stderr, "reader %d: %s held, answered %d here\n", id, keys[i], exists[i]);
                return false;
            }
            counts[0]++;
        }
        else {
            CHECK_EQ (exists[i], 0);
            counts[1]++;
        }
    }
    CHECK_EQ (kvpool_exist_batch (pool, n, keys, exists), KVPOOL_OK);
    for (size_t i = 0; i < n; i++)
        if (exists[i] != (i < absent_from)) {
            fprintf (stderr, "reader %d: %s answered %d\n", id, keys[i], exists[i]);
            return false;
        }
    return true;
}

static int
s_reader (const char *endpoint, int id)
{
    kvpool_t *pool = s_connect (endpoint);
    char names[HELD + ABSENT][32];
    const char *keys[HELD + ABSENT];
    size_t lens[HELD + ABSENT];
    s_keys (names, keys, lens);
    //  Most rounds ask about the hot held keys and the absent ones; the cold keys (HELD / 2
    //  on) only now and then, as any read is a use that would keep them in memory.
    const char *hot[HELD + ABSENT];
    size_t hot_lens[HELD + ABSENT], n_hot = 0;
    for (int i = 0; i < HELD + ABSENT; i++)
        if (i < HELD / 2 || i >= HELD) {
            hot[n_hot] = keys[i];
            hot_lens[n_hot++] = lens[i];
        }
    uint64_t rounds = 0, counts[3] = {0, 0, 0}; //  held and absent answered here, left
    char out[4096];
    int64_t deadline = zclock_mono () + RUN_MS, next_cold = 0;
    while (zclock_mono () < deadline) {
        rounds++;
        bool all = zclock_mono () >= next_cold;
        if (all) {
            next_cold = zclock_mono () + COLD_CHECK_MS;
            if (!s_ask (pool, id, HELD + ABSENT, keys, lens, HELD, counts))
                return 1;
        }
        else if (!s_ask (pool, id, n_hot, hot, hot_lens, HELD / 2, counts))
            return 1;
        const char *key = keys[rounds % (HELD / 2)];
        int64_t got = kvpool_get_into (pool, key, out, sizeof out);
        if (got < 0) {
            fprintf (stderr, "reader %d: get %s: %lld\n", id, key, (long long) got);
            return 1;
        }
        CHECK_EQ (kvpool_get_into (pool, keys[HELD + rounds % ABSENT], out, sizeof out),
                  KVPOOL_OBJECT_NOT_FOUND);
    }
    printf ("reader %d: %llu rounds; here: %llu held, %llu absent; %llu asked about\n", id,
            (unsigned long long) rounds, (unsigned long long) counts[0],
            (unsigned long long) counts[1], (unsigned long long) counts[2]);
    CHECK (counts[1] > rounds * ABSENT / 2); //  the absent keys mostly answered here
    kvpool_destroy (&pool);
    return 0;
}

static void
s_test_under_fire (const char *argv0, const char *disk_dir)
{
    testutil_server_t *server = s_start ("16MiB", disk_dir, "512MiB");
    {
        kvpool_t *pool = s_connect (server->endpoint);
        char value[4096];
        memset (value, 'h', sizeof value);
        for (int i = 0; i < HELD; i++) {
            char key[32];
            s_held_key (key, sizeof key, i);
            CHECK_EQ (kvpool_put (pool, key, value, sizeof value, NULL), KVPOOL_OK);
        }
        kvpool_destroy (&pool);
    }
    const char *roles[] = {"--upserter", "--churner", "--reader", "--reader"};
    pid_t children[4];
    for (int c = 0; c < 4; c++) {
        char id[16];
        snprintf (id, sizeof id, "%d", c);
        const char *args[] = {roles[c], id, server->endpoint, NULL};
        CHECK ((children[c] = testutil_spawn (argv0, args)) > 0);
    }
    int failures = testutil_wait_all (children, 4);
    kvpool_t *pool = s_connect (server->endpoint);
    kvpool_stats_t stats;
    CHECK_EQ (kvpool_stats (pool, &stats), KVPOOL_OK);
    printf ("under fire: %llu evictions, %llu promotions, %llu disk hits\n",
            (unsigned long long) stats.evictions, (unsigned long long) stats.promotions,
            (unsigned long long) stats.disk_hits);
    kvpool_destroy (&pool);
    CHECK_EQ (testutil_server_stop (server, SIGTERM), 0);
    CHECK_EQ (failures, 0);
    CHECK (stats.evictions > 0); //  the held keys really moved
    printf ("under fire: no held key answered absent\n");
}

int
main (int argc, char **argv)
{
    zsys_handler_set (NULL);
    if (argc == 4 && streq (argv[1], "--upserter"))
        return s_upserter (argv[3]);
    if (argc == 4 && streq (argv[1], "--churner"))
        return s_churner (argv[3]);
    if (argc == 4 && streq (argv[1], "--reader"))
        return s_reader (argv[3], atoi (argv[2]));

    atexit (s_kill_server);
    char disk_dir[] = "/tmp/kvpool-absent-XXXXXX";
    CHECK (mkdtemp (disk_dir));
    char in_turn[300], under_fire[300];
    snprintf (in_turn, sizeof in_turn, "%s/in-turn", disk_dir);
    snprintf (under_fire, sizeof under_fire, "%s/under-fire", disk_dir);
    CHECK (mkdir (in_turn, 0700) == 0 && mkdir (under_fire, 0700) == 0);
    s_test_in_turn (in_turn);
    s_test_under_fire (argv[0], under_fire);
    char command[400];
    snprintf (command, sizeof command, "rm -rf '%s'", disk_dir);
    CHECK (system (command) == 0);
    return 0;
}
