/*  test_index.c - the same-machine read index under fire: readers never see foreign bytes.

    A writer process keeps removing and re-putting the same keys with new contents in a small
    pool, so freed space is reused at once, while reader processes read those keys through
    the read index (no round trip). Every value is self-describing (its key and generation
    in a header, and a body derived from both), so a read that returned a torn value, or
    bytes of another object that took over the space, is caught. Reads that raced with a
    removal must either return a whole, consistent value or an error - never a mix.
*/
#include <czmq.h>
#include <signal.h>
#include <sys/wait.h>

#include "kvpool.h"
#include "tests/testutil.h"

#define KEYS 6
#define VALUE_SIZE (8 << 20)
#define RUN_MS 3000

typedef struct {
    char key[32];
    uint64_t generation;
} header_t;

static uint64_t
s_word (const char *key, uint64_t generation, size_t offset)
{
    uint64_t seed = generation * 0x9E3779B97F4A7C15ULL + (uint64_t) key[4] * 0xC2B2AE3D27D4EB4FULL;
    return seed ^ (offset * 0xFF51AFD7ED558CCDULL);
}

static void
s_fill (char *value, const char *key, uint64_t generation)
{
    header_t header;
    memset (&header, 0, sizeof header);
    snprintf (header.key, sizeof header.key, "%s", key);
    header.generation = generation;
    memcpy (value, &header, sizeof header);
    for (size_t i = sizeof header; i + 8 <= VALUE_SIZE; i += 8) {
        uint64_t word = s_word (key, generation, i);
        memcpy (value + i, &word, 8);
    }
}

//  Whether value is what s_fill makes for key at the generation in its header: one word in
//  every 512 bytes is checked, enough to see bytes of another write anywhere in it.
static bool
s_consistent (const char *value, const char *key)
{
    header_t header;
    memcpy (&header, value, sizeof header);
    if (strncmp (header.key, key, sizeof header.key) != 0)
        return false;
    for (size_t i = 512; i + 8 <= VALUE_SIZE; i += 512) {
        uint64_t word;
        memcpy (&word, value + i, 8);
        if (word != s_word (key, header.generation, i))
            return false;
    }
    uint64_t last;
    memcpy (&last, value + VALUE_SIZE - 8, 8);
    return last == s_word (key, header.generation, VALUE_SIZE - 8);
}

static int
s_writer (const char *endpoint)
{
    kvpool_t *pool = kvpool_connect (endpoint, NULL);
    CHECK (pool);
    static char value[VALUE_SIZE];
    int64_t deadline = zclock_mono () + RUN_MS;
    uint64_t generation = 1;
    while (zclock_mono () < deadline) {
        for (int k = 0; k < KEYS; k++) {
            char key[32];
            snprintf (key, sizeof key, "idx/%d", k);
            kvpool_remove (pool, key, true);
            s_fill (value, key, ++generation);
            int rc = kvpool_put (pool, key, value, VALUE_SIZE, NULL);
            CHECK (rc == KVPOOL_OK || rc == KVPOOL_NO_AVAILABLE_HANDLE);
        }
    }
    printf ("writer: %llu puts\n", (unsigned long long) generation);
    kvpool_destroy (&pool);
    return 0;
}

static int
s_reader (const char *endpoint, int id)
{
    kvpool_t *pool = kvpool_connect (endpoint, NULL);
    CHECK (pool);
    CHECK (kvpool_fast_path (pool));
    CHECK (kvpool_set_index (pool, true));
    static char value[VALUE_SIZE];
    int64_t deadline = zclock_mono () + RUN_MS;
    uint64_t reads = 0, misses = 0;
    while (zclock_mono () < deadline) {
        for (int k = 0; k < KEYS; k++) {
            char key[32];
            snprintf (key, sizeof key, "idx/%d", (k * 7 + id) % KEYS);
            int64_t got = kvpool_get_into (pool, key, value, sizeof value);
            if (got == KVPOOL_OBJECT_NOT_FOUND) {
                misses++;
                continue;
            }
            CHECK_EQ (got, VALUE_SIZE);
            if (!s_consistent (value, key)) {
                fprintf (stderr, "reader %d: value of %s is torn or foreign\n", id, key);
                return 1;
            }
            reads++;
        }
    }
    printf ("reader %d: %llu whole reads, %llu misses\n", id, (unsigned long long) reads,
            (unsigned long long) misses);
    CHECK (reads > 20);
    kvpool_destroy (&pool);
    return 0;
}

int
main (int argc, char **argv)
{
    zsys_handler_set (NULL);
    if (argc == 3 && streq (argv[1], "--writer"))
        return s_writer (argv[2]);
    if (argc == 4 && streq (argv[1], "--reader"))
        return s_reader (argv[3], atoi (argv[2]));

    //  A pool of 64 MiB holds 8 values of 8 MiB: the writer's 6 keys reuse freed space at
    //  once, and a reader's copy of 8 MiB is long enough to overlap the next write into it,
    //  which is what could hand a reader another object's bytes.
    testutil_server_t server;
    const char *args[] = {"--segment-size", "64MiB", "--lease-ttl", "1", NULL};
    CHECK (testutil_server_start (&server, args) == 0);
    pid_t children[3];
    for (int c = 0; c < 3; c++) {
        children[c] = fork ();
        CHECK (children[c] >= 0);
        if (children[c] == 0) {
            char id[8];
            snprintf (id, sizeof id, "%d", c);
            if (c == 0)
                execl (argv[0], argv[0], "--writer", server.endpoint, (char *) NULL);
            else
                execl (argv[0], argv[0], "--reader", id, server.endpoint, (char *) NULL);
            _exit (127);
        }
    }
    int failures = 0;
    for (int c = 0; c < 3; c++) {
        int status;
        CHECK (waitpid (children[c], &status, 0) == children[c]);
        failures += !(WIFEXITED (status) && WEXITSTATUS (status) == 0);
    }
    CHECK_EQ (testutil_server_stop (&server, SIGTERM), 0);
    CHECK_EQ (failures, 0);
    printf ("read index: no torn or foreign value\n");
    return 0;
}
