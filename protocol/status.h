/*  status.h - the names and descriptions of the status codes (kvpool_strerror and
    kvpool_status_name of include/kvpool.h). The codes themselves are generated from
    protocol/kvpool.proto (kvpool_status.h).
*/
#ifndef KVP_STATUS_H_INCLUDED
#define KVP_STATUS_H_INCLUDED

#include <stdbool.h>

#include "kvpool_status.h"

//  Returns the status's name, e.g. "OBJECT_NOT_FOUND" (never NULL; "UNKNOWN" if unknown).
const char *kvp_status_name (int status);
//  Returns a short English description of a status code (never NULL).
const char *kvp_strerror (int status);

//  Self test: every code generated for C equals the code of the same name in the protobuf
//  descriptor, and every code has a name and a description.
void kvp_status_test (bool verbose);

#endif
