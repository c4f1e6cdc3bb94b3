/*  test_index.c - the read index under fire: readers never see foreign bytes.

    A writer process keeps removing and re-putting the same keys with new contents in a small
    pool, so freed space is reused at once, while reader processes read those keys through
    the read index. Every value is self-describing (its key and generation in a header, and
    a body derived from both), so a read that returned a torn value, or bytes of another
    object that took over the space, is caught. Reads that raced with a removal must either
    return a whole, consistent value or an error - never a mix.

    Two rounds: 8 MiB values read by same-machine clients straight from the index (no round
    trip), then 60 KiB values read over tcp, which the node's api answers from the index
    itself (actors/index_reads.h).
*/
#include <czmq.h>
#include <signal.h>
#include <sys/wait.h>

#include "kvpool.h"
#include "tests/testutil.h"

#define KEYS 6
#define RUN_MS 3000

//  The round's value size, set from the command line in the writer and readers.
static size_t VALUE_SIZE = 8 << 20;

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
    char *value = (char *) malloc (VALUE_SIZE);
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
    printf ("writer: %llu puts of %zu bytes\n", (unsigned long long) generation, VALUE_SIZE);
    free (value);
    kvpool_destroy (&pool);
    return 0;
}

//  over_tcp: fast path off, so every read is a GET the node's api answers.
static int
s_reader (const char *endpoint, int id, bool over_tcp)
{
    kvpool_options_t options;
    kvpool_options_init (&options);
    options.fast_path = over_tcp ? 0 : 1;
    kvpool_t *pool = kvpool_connect (endpoint, &options);
    CHECK (pool);
    CHECK (kvpool_fast_path (pool) == !over_tcp);
    if (!over_tcp)
        CHECK (kvpool_set_index (pool, true));
    char *value = (char *) malloc (VALUE_SIZE);
    int64_t deadline = zclock_mono () + RUN_MS;
    uint64_t reads = 0, misses = 0;
    while (zclock_mono () < deadline) {
        for (int k = 0; k < KEYS; k++) {
            char key[32];
            snprintf (key, sizeof key, "idx/%d", (k * 7 + id) % KEYS);
            int64_t got = kvpool_get_into (pool, key, value, VALUE_SIZE);
            if (got == KVPOOL_OBJECT_NOT_FOUND) {
                misses++;
                continue;
            }
            CHECK_EQ (got, (int64_t) VALUE_SIZE);
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
    free (value);
    kvpool_destroy (&pool);
    return 0;
}

//  Runs a writer and two readers against a node started with args; returns how many failed.
static int
s_round (const char *argv0, const char **args, size_t value_size, bool over_tcp,
         uint64_t *index_gets)
{
    testutil_server_t server;
    CHECK (testutil_server_start (&server, args) == 0);
    char size[32];
    snprintf (size, sizeof size, "%zu", value_size);
    pid_t children[3];
    for (int c = 0; c < 3; c++) {
        char id[16];
        snprintf (id, sizeof id, "%d", c);
        const char *writer[] = {"--writer", size, server.endpoint, NULL};
        const char *reader[] = {over_tcp ? "--tcp-reader" : "--reader", size, id, server.endpoint,
                                NULL};
        CHECK ((children[c] = testutil_spawn (argv0, c == 0 ? writer : reader)) > 0);
    }
    int failures = testutil_wait_all (children, 3);
    kvpool_t *pool = kvpool_connect (server.endpoint, NULL);
    CHECK (pool);
    kvpool_stats_t stats;
    CHECK_EQ (kvpool_stats (pool, &stats), KVPOOL_OK);
    *index_gets = stats.index_gets;
    kvpool_destroy (&pool);
    CHECK_EQ (testutil_server_stop (&server, SIGTERM), 0);
    return failures;
}

int
main (int argc, char **argv)
{
    zsys_handler_set (NULL);
    if (argc == 4 && streq (argv[1], "--writer")) {
        VALUE_SIZE = (size_t) atol (argv[2]);
        return s_writer (argv[3]);
    }
    if (argc == 5 && (streq (argv[1], "--reader") || streq (argv[1], "--tcp-reader"))) {
        VALUE_SIZE = (size_t) atol (argv[2]);
        return s_reader (argv[4], atoi (argv[3]), streq (argv[1], "--tcp-reader"));
    }

    //  A pool of 64 MiB holds 8 values of 8 MiB: the writer's 6 keys reuse freed space at
    //  once, and a reader's copy of 8 MiB is long enough to overlap the next write into it,
    //  which is what could hand a reader another object's bytes.
    const char *big[] = {"--segment-size", "64MiB", "--lease-ttl", "1", NULL};
    uint64_t index_gets = 0;
    CHECK_EQ (s_round (argv[0], big, 8 << 20, false, &index_gets), 0);
    printf ("same-machine reads of 8 MiB values: no torn or foreign value\n");

    //  60 KiB values in a 1 MiB pool, read over tcp: the node's api copies them out of
    //  the index while the writer's puts reuse the space.
    const char *small[] = {"--segment-size", "1MiB", "--lease-ttl", "1", NULL};
    CHECK_EQ (s_round (argv[0], small, 60 << 10, true, &index_gets), 0);
    CHECK (index_gets > 100); //  the reads really took the api's index path
    printf ("tcp reads of 60 KiB values (%llu from the node's index): no torn or foreign "
            "value\n",
            (unsigned long long) index_gets);
    return 0;
}
