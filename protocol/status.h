/*  kvpool_status.h - status code names and descriptions (implements kvpool_strerror). */
#ifndef KVPOOL_STATUS_H_INCLUDED
#define KVPOOL_STATUS_H_INCLUDED

#include <stdbool.h>

#include "kvpool.h"

//  Self test: every code of include/kvpool.h equals the code of the same name in
//  protocol/kvpool.proto, and every code has a name and a description.
void kvpool_status_test (bool verbose);

#endif
