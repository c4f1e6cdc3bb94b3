/*  etcd.h - the little of etcd's v3 API kvpool needs: leases, one key's read, a put that only
    the first writer wins, a delete, and a watch of one key.

    kvpool talks to etcd through its documented JSON gateway (/v3/kv/range, /v3/kv/txn,
    /v3/lease/grant, /v3/lease/keepalive, /v3/watch ...) over libcurl, with cJSON for the
    bodies: no protocol of our own, and any etcd from 3.4 on answers. Keys and values are
    base64 on that wire (CZMQ's zarmour); 64-bit numbers are JSON strings.

    etcd holds only what leadership needs (master/ha.h): the leader's record, under a lease,
    and one fencing record per node fenced while a failover may lose the memory of why.
    Nothing here is written per object or per put.

    An etcd_t is one libcurl handle: one thread uses it. Every call tries the endpoints in
    turn, starting with the one that answered last, and gives up after timeout_ms on each.

    Threads: the owner's.
*/
#ifndef ETCD_H_INCLUDED
#define ETCD_H_INCLUDED

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct _etcd_t etcd_t;

//  What an etcd:// address names: the endpoints (host:port, comma separated) and the cluster
//  (the path: every key kvpool writes starts with /kvpool/CLUSTER/).
typedef struct {
    char endpoints[512];
    char cluster[128];
} etcd_address_t;

//  Parses "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER". Returns 0, or -1 with why in error.
int etcd_address_parse (const char *url, etcd_address_t *address, char *error, size_t error_size);

//  Whether url is an etcd:// address.
bool etcd_is_address (const char *url);

//  A client of the endpoints ("h:p,h:p"); each call waits at most timeout_ms an endpoint.
//  Caller owns return value and must destroy it.
etcd_t *etcd_new (const char *endpoints, int timeout_ms);
void etcd_destroy (etcd_t **self_p);

//  A call that sees *stop become true ends early (a watch at once; others at their timeout).
void etcd_set_stop (etcd_t *self, atomic_bool *stop);

//  The last failure, for the log ("" after a success).
const char *etcd_error (etcd_t *self);

//  A key's value, as read: absent when create_revision is 0.
typedef struct {
    char value[512];
    int64_t create_revision, mod_revision, lease;
    int64_t revision; //  the store's revision when it was read (the header's)
} etcd_kv_t;

//  Grants a lease of ttl_s seconds: *id. Returns 0, or -1 (etcd_error).
int etcd_lease_grant (etcd_t *self, int ttl_s, int64_t *id);

//  Renews lease id: *ttl_s is what it has left (0 or less: it has expired). Returns 0, or -1.
int etcd_lease_keepalive (etcd_t *self, int64_t id, int64_t *ttl_s);

//  Ends lease id, and the keys it holds. Returns 0, or -1.
int etcd_lease_revoke (etcd_t *self, int64_t id);

//  Puts key = value (under lease, 0: none) only if the key does not exist. *won says whether
//  it did; kv is the key as it is after (ours, or the one that was there). Returns 0, or -1.
int etcd_create (etcd_t *self, const char *key, const char *value, int64_t lease, bool *won,
                 etcd_kv_t *kv);

//  Puts key = value, no lease, whatever was there. Returns 0, or -1.
int etcd_put (etcd_t *self, const char *key, const char *value);

//  Reads key into kv (create_revision 0: absent). Returns 0, or -1.
int etcd_get (etcd_t *self, const char *key, etcd_kv_t *kv);

//  Reads every key under prefix: calls fn for each (key, value). Returns the count, or -1.
typedef void (etcd_each_fn) (const char *key, const char *value, void *arg);
int etcd_get_prefix (etcd_t *self, const char *prefix, etcd_each_fn *fn, void *arg);

//  Deletes key; with create_revision > 0, only if it is still that creation of it. Returns 0,
//  or -1.
int etcd_delete (etcd_t *self, const char *key, int64_t create_revision);

//  Waits until key changes after revision (a put or a delete), for at most wait_ms. Returns 1
//  when it changed (or etcd ended the watch: read the key again), 0 when the wait ended
//  with no change (time, or *stop: watch again from the same revision), or -1 when etcd did
//  not answer. A wait costs etcd nothing while the key does not change.
int etcd_watch (etcd_t *self, const char *key, int64_t revision, int wait_ms);

void etcd_test (bool verbose);

#endif
