/*  key_watch.h - closes the open connections of a CURVE key once it is revoked.

    libzmq asks the ZAP handler (curve.h) about a connection once, at its handshake; a key
    removed from --curve-allow or --curve-nodes afterwards keeps every connection it already
    has. A key watch, one per ROUTER socket that runs CURVE, remembers which connection
    (its descriptor, with the socket's SO_COOKIE) belongs to which key as messages arrive,
    and every KEY_WATCH_INTERVAL_MS stats the allow directory: when it changed, it asks the
    ZAP handler about each key it has seen (kvp_curve_admitted) and shuts down the sockets
    of those no longer admitted. libzmq then drops the connection, and the client's
    reconnection is refused at its handshake. A message of a revoked key that was already
    queued, or comes on a connection that had sent nothing before, is dropped and counted
    (key_watch_seen says false) and its socket shut down too. So a revoked key's
    connections close, and it is served nothing, within about KEY_WATCH_INTERVAL_MS.

    What counts as a change is the directory's own stat (inode, mtime, ctime, size): adding,
    removing or renaming a certificate file. A file rewritten in place is noticed at the
    next change of the directory.

    A descriptor is shut down only if its SO_COOKIE is the one seen with the key's last
    message on it, so a descriptor number reused by another connection is never hit.

    Threads: the owner's (an actor's); kvp_curve_admitted may be called from any thread.
*/
#ifndef KEY_WATCH_H_INCLUDED
#define KEY_WATCH_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "infra/curve.h"

typedef struct _key_watch_t key_watch_t;

//  How often the allow directory is looked at (a stat; the keys are asked about only when
//  it changed).
#define KEY_WATCH_INTERVAL_MS 250

//  A watch of the connections of one socket whose door is domain (KVP_ZAP_CLIENTS or
//  KVP_ZAP_CLUSTER); what names the socket in the log ("api", "data plane", "master").
//  Returns NULL without CURVE or without that door: every function does nothing on NULL.
key_watch_t *key_watch_new (kvp_curve_t *curve, const char *domain, const char *what);

//  Logs what it refused and forgets the connections. Sets *self_p to NULL.
void key_watch_destroy (key_watch_t **self_p);

//  A message came on the connection of socket descriptor fd (its "__fd"; -1: unknown) whose
//  handshake proved user_id (its "User-Id"). Returns false when that key is known to be
//  revoked: the caller drops the message (counted here); its socket is shut down.
bool key_watch_seen (key_watch_t *self, int fd, const char *user_id);

//  Call at least every KEY_WATCH_INTERVAL_MS (now: zclock_mono). When the directory changed
//  since the last look, shuts down the connections of every key no longer admitted.
//  Returns the number of connections shut down.
size_t key_watch_check (key_watch_t *self, int64_t now);

//  When key_watch_check is next due (zclock_mono), or INT64_MAX on NULL.
int64_t key_watch_due (key_watch_t *self);

//  Messages dropped and connections shut down so far.
uint64_t key_watch_refused (key_watch_t *self);
uint64_t key_watch_closed (key_watch_t *self);

void key_watch_test (bool verbose);

#endif
