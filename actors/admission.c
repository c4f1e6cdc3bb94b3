/*  admission.c - a count-min sketch of reads (admission.h). */
#include "actors/admission.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 4

struct _admission_t {
    uint32_t width; //  a power of two
    int64_t window_ms;
    int64_t next_halving;
    uint8_t *counters; //  ROWS x width
};

admission_t *
admission_new (uint32_t width, int64_t window_ms)
{
    assert (width && (width & (width - 1)) == 0 && window_ms > 0);
    admission_t *self = (admission_t *) calloc (1, sizeof (admission_t));
    if (!self)
        return NULL;
    self->width = width;
    self->window_ms = window_ms;
    self->counters = (uint8_t *) calloc (ROWS, width);
    if (!self->counters) {
        free (self);
        return NULL;
    }
    return self;
}

void
admission_destroy (admission_t **self_p)
{
    if (*self_p) {
        free ((*self_p)->counters);
        free (*self_p);
        *self_p = NULL;
    }
}

//  Row r's counter for hash: each row takes 16 bits of the hash, mixed so that keys whose
//  hashes share low bits still differ across rows.
static uint8_t *
s_counter (admission_t *self, uint64_t hash, int row)
{
    uint64_t mixed = (hash ^ (hash >> 29)) * 0xbf58476d1ce4e5b9ULL;
    uint32_t index = (uint32_t) (mixed >> (16 * row)) & (self->width - 1);
    return &self->counters[(size_t) row * self->width + index];
}

static void
s_age (admission_t *self, int64_t now)
{
    if (self->next_halving == 0)
        self->next_halving = now + self->window_ms;
    while (now >= self->next_halving) {
        for (size_t i = 0; i < (size_t) ROWS * self->width; i++)
            self->counters[i] >>= 1;
        self->next_halving += self->window_ms;
        //  After a long quiet spell everything is zero: start the windows from now.
        if (now - self->next_halving > 8 * self->window_ms)
            self->next_halving = now + self->window_ms;
    }
}

uint32_t
admission_hit (admission_t *self, uint64_t hash, int64_t now)
{
    s_age (self, now);
    uint32_t estimate = UINT32_MAX;
    for (int row = 0; row < ROWS; row++) {
        uint8_t *counter = s_counter (self, hash, row);
        if (*counter < UINT8_MAX)
            (*counter)++;
        if (*counter < estimate)
            estimate = *counter;
    }
    return estimate;
}

void
admission_forget (admission_t *self, uint64_t hash)
{
    uint32_t estimate = UINT32_MAX;
    for (int row = 0; row < ROWS; row++) {
        uint8_t *counter = s_counter (self, hash, row);
        if (*counter < estimate)
            estimate = *counter;
    }
    for (int row = 0; row < ROWS; row++) {
        uint8_t *counter = s_counter (self, hash, row);
        *counter = (uint8_t) (*counter - estimate);
    }
}

void
admission_test (bool verbose)
{
    admission_t *sketch = admission_new (1024, 1000);
    assert (sketch);
    //  A key read three times is counted three times; another key is unaffected.
    assert (admission_hit (sketch, 42, 10) == 1);
    assert (admission_hit (sketch, 42, 20) == 2);
    assert (admission_hit (sketch, 42, 30) == 3);
    assert (admission_hit (sketch, 0x1234567890ULL, 30) == 1);
    //  A window later the counts are halved, two later they are nearly gone.
    assert (admission_hit (sketch, 42, 1100) == 2); //  3 / 2 + 1
    assert (admission_hit (sketch, 42, 3200) == 1); //  2 / 4 + 1
    //  Forgetting a key clears its count.
    admission_forget (sketch, 42);
    assert (admission_hit (sketch, 42, 3300) == 1);
    //  Half as many keys as a row has counters seldom make a key read twice look hot:
    //  collisions overestimate, never underestimate.
    admission_t *crowded = admission_new (1024, 1000000);
    for (uint64_t key = 1; key <= 512; key++)
        admission_hit (crowded, key * 0x9e3779b97f4a7c15ULL, 1);
    int hot = 0;
    for (uint64_t key = 1; key <= 512; key++) {
        uint32_t estimate = admission_hit (crowded, key * 0x9e3779b97f4a7c15ULL, 2);
        assert (estimate >= 2);
        hot += estimate > 3;
    }
    assert (hot < 512 / 10);
    admission_destroy (&crowded);
    admission_destroy (&sketch);
    assert (sketch == NULL);
    if (verbose)
        printf ("reads counted, halved and forgotten ");
}
