/*  owners.h - the api's table of same-machine client processes and what proves who they are.

    A client on the node's ipc endpoint is identified by the kernel, not by anything it sends:
    libzmq reads SO_PEERCRED when an ipc connection is accepted and reports it in each
    message's "Peer-Address" property as "localhost:<uid>:<gid>:<pid>". A tcp peer's property
    is its numeric address, which never starts with "localhost", so a remote client cannot
    pass for a local one. Messages from in-process clients (a kvpool_t over
    inproc://<instance>-api, as the tests use) carry no property at all.

    Reservations, read pins and mounted memory belong to an owner: one record per client
    process, with an id that is never reused. The record holds a pidfd, so the death of that
    exact process is seen (a pid can be reused; a pidfd cannot). A dead owner is reported
    only once none of its requests is still between actors, so everything it started has
    reached the replica-manager before the report that ends it.

    Threads: the api actor's only.
*/
#ifndef OWNERS_H_INCLUDED
#define OWNERS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
    PEER_INPROC = 0, //  an in-process client: no credentials, trusted (the node's own code)
    PEER_LOCAL,      //  an ipc client: the kernel's uid, gid and pid
    PEER_REMOTE      //  tcp: reaches only whole values
} peer_kind_t;

typedef struct {
    peer_kind_t kind;
    uid_t uid;
    gid_t gid;
    pid_t pid; //  0 when the process is not visible from the node's pid namespace
} peer_t;

typedef struct {
    uint64_t id; //  never reused while the node runs
    pid_t pid;
    int pidfd;       //  that exact process, readable once it exits; open while any request of
                     //  the owner is out (the record stays until then)
    size_t jobs_out; //  requests of this owner between actors
    char name[48];   //  "pid:<pid>/<id>": the owner of segments it mounts
} owner_t;

typedef struct _owners_t owners_t;

//  Classifies a message's "Peer-Address" property (NULL: none). Returns the peer.
peer_t owners_peer (const char *peer_address);

//  Creates the table, at most max_owners live processes. Caller owns return value.
owners_t *owners_new (size_t max_owners);
void owners_destroy (owners_t **self_p);

//  The record of this live process, made on first use. Returns NULL when the process is
//  already gone, its pid is not visible, or the table is full (errno says which).
owner_t *owners_get (owners_t *self, pid_t pid);

//  True while the owner with this id has not been reported dead.
bool owners_alive (owners_t *self, uint64_t id);

//  Calls gone (arg, owner) for every owner whose process has exited and that has no
//  request out, then forgets it. Returns the number reported.
typedef void (owners_gone_fn) (void *arg, const owner_t *owner);
size_t owners_reap (owners_t *self, owners_gone_fn *gone, void *arg);

size_t owners_size (owners_t *self);

void owners_test (bool verbose);

#endif
