/*  kvpool_top.h - `kvpool top`: a live view of one node (tools/kvpool_top.c). */
#ifndef KVPOOL_TOP_H_INCLUDED
#define KVPOOL_TOP_H_INCLUDED

#include <stdbool.h>

#include "kvpool.h"

//  Shows pool's node (reached at endpoint) every interval_ms until 'q', Ctrl-C or SIGTERM;
//  with once, one frame after one interval. Returns the exit status (0, or 1 when the node
//  stopped answering).
int kvpool_top (kvpool_t *pool, const char *endpoint, bool once, int interval_ms);

#endif
