/*  touch_table.c - recently renewed keys (see touch_table.h). */
#include "shm/touch_table.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

struct _touch_table_t {
    uint64_t *hashes;
    int64_t *at; //  ms of the last renewal
    size_t mask;
    int64_t interval;
};

touch_table_t *
touch_table_new (size_t slots, int64_t interval_ms)
{
    assert (slots > 0 && (slots & (slots - 1)) == 0);
    touch_table_t *self = (touch_table_t *) calloc (1, sizeof (touch_table_t));
    if (self) {
        self->hashes = (uint64_t *) calloc (slots, sizeof *self->hashes);
        self->at = (int64_t *) calloc (slots, sizeof *self->at);
        self->mask = slots - 1;
        self->interval = interval_ms;
    }
    if (self && (!self->hashes || !self->at))
        touch_table_destroy (&self);
    return self;
}

void
touch_table_destroy (touch_table_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free ((*self_p)->hashes);
    free ((*self_p)->at);
    free (*self_p);
    *self_p = NULL;
}

bool
touch_table_due (touch_table_t *self, uint64_t hash, int64_t now_ms)
{
    size_t slot = hash & self->mask;
    if (self->hashes[slot] == hash && now_ms - self->at[slot] < self->interval)
        return false;
    self->hashes[slot] = hash;
    self->at[slot] = now_ms;
    return true;
}

void
touch_table_test (bool verbose)
{
    if (verbose)
        printf ("\n * touch_table: ");
    touch_table_t *table = touch_table_new (16, 1000);
    assert (table);
    assert (touch_table_due (table, 0x1234, 5000));
    assert (!touch_table_due (table, 0x1234, 5999));     //  within the interval
    assert (touch_table_due (table, 0x1234, 6000));      //  interval over
    assert (touch_table_due (table, 0x1234 + 16, 6001)); //  same slot, another key: due...
    assert (touch_table_due (table, 0x1234, 6002));      //  ... and it pushed the first one out
    touch_table_t *never = touch_table_new (4, 0);       //  interval 0: always due
    assert (touch_table_due (never, 7, 1) && touch_table_due (never, 7, 1));
    touch_table_destroy (&never);
    touch_table_destroy (&table);
    touch_table_destroy (&table);
    if (verbose)
        printf ("done\n");
}
