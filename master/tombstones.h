/*  tombstones.h - the keys a master removed, remembered for nodes that missed a removal
    while away.

    A node that was cut off, frozen or down while a key it held was removed comes back and
    reports its copy (INVENTORY); the master refuses a copy of a key removed since the node
    was last heard from (master.c, s_inventory), so a removed key never comes back. Each
    removal is remembered with its token (the master's sequence, directory.h). Past max
    keys the oldest are forgotten, and the floor says up to which token the memory is
    incomplete: a node away since before it has every report refused.

    A reservation given up (aborted, expired, or committed on no node) is not a removal: the
    key had no value the master knew of, and the put failed, so a copy of the key's last
    value that a holder brings back (it was away when the put came) stands. Only copies of
    the versions such puts would have written are refused: a key's aborts since it was last
    committed are remembered as the lowest version they reserved (versions grow with the
    master's sequence, so every later reservation's is higher, and the value a holder brings
    back from before is lower), until the key is committed again or reported back.

    Threads: the master's.
*/
#ifndef TOMBSTONES_H_INCLUDED
#define TOMBSTONES_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct _tombstones_t tombstones_t;

//  Caller owns return value and must destroy it.
tombstones_t *tombstones_new (size_t max);
void tombstones_destroy (tombstones_t **self_p);

//  key was removed at token (later than any before): the value of version (0: none) that
//  holders[0..count) held (node slots, at most 8).
void tombstones_add (tombstones_t *self, const char *key, uint64_t token, uint64_t version,
                     const uint16_t *holders, uint8_t count);

//  A reservation of key at version (its token) was given up at token: copies of version or
//  later are of no committed value, until tombstones_committed.
void tombstones_abort (tombstones_t *self, const char *key, uint64_t token, uint64_t version);

//  key has a committed value again (a commit, or a holder's report taken): its aborts are
//  forgotten.
void tombstones_committed (tombstones_t *self, const char *key);

//  The token of key's last removal remembered, or 0 (aborts are not removals).
uint64_t tombstones_find (tombstones_t *self, const char *key);

//  What key's last removal remembered removed: the version, and the nodes that held it
//  (*count of them into holders, room for 8). Returns false when none is remembered. A
//  later remove of the key tells those nodes again, naming the version: a node the first
//  remove's drop never reached (its remover lost the master's answer) drops it then.
bool tombstones_holders (tombstones_t *self, const char *key, uint64_t *version, uint16_t *holders,
                         uint8_t *count);

//  Whether a node last heard from at token bar, reporting a copy of key at version (0: a
//  node from before versions) that the directory does not list, must drop it: key was
//  removed since bar (or maybe: past the floor), or the copy is of the very value a removal
//  removed (whenever the node last spoke: a restarted node's old life may have spoken after
//  the remove, its drop never reaching it), or of a put given up (without a version: any
//  copy, if a put was given up since bar).
bool tombstones_refuse (tombstones_t *self, const char *key, uint64_t version, uint64_t bar);

//  Forgets every removal; floor: up to which token removals are not known (REMOVE_ALL:
//  now; a new term: 0, its state starts afresh).
void tombstones_clear (tombstones_t *self, uint64_t floor);

//  Removals up to this token are not all remembered.
uint64_t tombstones_floor (tombstones_t *self);

void tombstones_test (bool verbose);

#endif
