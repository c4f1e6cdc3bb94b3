/*  rpc_calls.h - requests out and waiting for their reply: ids, deadlines, matching.

    The one table of calls in flight that a thread keeps for the peers it asks (a node's
    data planes: peer_link.h) or for its master (actors/master_client.h). Each call gets an
    id, unique in its table, that the request carries and the reply echoes; a deadline; and
    an opaque handle (the owner's record of the call). A reply is matched to its call by id
    (rpc_calls_take); a call past its deadline is handed back once (rpc_calls_expired) and
    forgotten, so a reply that comes later matches nothing and is dropped by its reader: a
    late answer is never taken for a later request's.

    Ids also go to requests nobody waits for (rpc_calls_next_id): the sequence is one, so no
    reply to those is ever taken for a call's.

    Threads: one; the table belongs to the thread that owns the sockets it describes. The
    handles belong to the caller: the table never frees them.
*/
#ifndef RPC_CALLS_H_INCLUDED
#define RPC_CALLS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct _rpc_calls_t rpc_calls_t;

//  Caller owns the return value and must destroy it.
rpc_calls_t *rpc_calls_new (void);

//  Does nothing on NULL; sets *self_p to NULL. Handles still in the table are not freed:
//  take them first (rpc_calls_first).
void rpc_calls_destroy (rpc_calls_t **self_p);

//  A new call, handle waiting for it until deadline (zclock_mono ms). Returns its id (> 0).
uint64_t rpc_calls_add (rpc_calls_t *self, void *handle, int64_t deadline);

//  An id for a request nobody waits for.
uint64_t rpc_calls_next_id (rpc_calls_t *self);

//  The call id answers, taken out of the table: its handle, or NULL when no call waits for
//  that id (never sent here, already timed out, or already answered).
void *rpc_calls_take (rpc_calls_t *self, uint64_t id);

//  A call whose deadline is at or before now, taken out of the table (the oldest first), or
//  NULL when none is due. Call until NULL.
void *rpc_calls_expired (rpc_calls_t *self, int64_t now);

//  Any call, taken out of the table (the oldest first), or NULL when it is empty: for an
//  owner that stops, to end each call.
void *rpc_calls_first (rpc_calls_t *self);

size_t rpc_calls_size (rpc_calls_t *self);

void rpc_calls_test (bool verbose);

#endif
