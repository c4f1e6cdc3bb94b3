/*  admission.h - counts how often keys are read, in a fixed few kilobytes: a count-min sketch
    (four rows of saturating 8-bit counters, each row indexed by its own slice of the key's
    64-bit hash). An estimate is never below the true count within the window and is above
    it only on collisions. Every window all counters are halved, so old reads fade.

    The replica-manager uses it for --promote-on-hit: an object read from disk that often
    within the window is copied back to memory, without a table entry per key.
    Threads: none of its own; one thread uses it.
*/
#ifndef ADMISSION_H_INCLUDED
#define ADMISSION_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>

typedef struct _admission_t admission_t;

//  A sketch of width counters a row (a power of two), halved every window_ms. Caller owns the
//  return value.
admission_t *admission_new (uint32_t width, int64_t window_ms);
void admission_destroy (admission_t **self_p);

//  Counts one read of the key with this hash at time now (ms) and returns its estimated
//  reads within the window, this one included.
uint32_t admission_hit (admission_t *self, uint64_t hash, int64_t now);

//  Forgets a key's reads (it was admitted): its counters drop by its estimate.
void admission_forget (admission_t *self, uint64_t hash);

void admission_test (bool verbose);

#endif
