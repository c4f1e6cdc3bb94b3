/*  ha.c - the campaign for leadership among standby masters (ha.h).

    The campaign's loop, on its own thread:
    - standing by: grant a lease and try to create the leader record under it. Won: read
      the fencing records, then lead. Lost: give the lease back, and wait on the record
      (an etcd watch, renewed every HA_WATCH_MS from the same revision) until it changes;
      then try again.
    - leading: renew the lease every third of its TTL (every HA_RETRY_MS while etcd does not
      answer). Each answer moves the end of leadership on to when that keep-alive was sent
      plus the TTL less HA_MARGIN_MS. A renewal etcd refuses (the lease ran out) ends it
      at once; so does the end passing with etcd silent.
    The master's thread reads the term and the end with atomics (ha_leading), so a stalled
    campaign can only end leadership early, never extend it.
*/
#include "master/ha.h"

#include <czmq.h>
#include <pthread.h>
#include <stdatomic.h>

#include "infra/etcd.h"
#include "infra/leader.h"
#include "infra/log.h"

#define HA_ETCD_TIMEOUT_MS 1000
#define HA_RETRY_MS 200
#define HA_WATCH_MS 5000
//  For clocks that run at slightly different rates here and at etcd.
#define HA_MARGIN_MS 100

struct _ha_t {
    pthread_t thread;
    atomic_bool stop;
    etcd_address_t address;
    char key[300];
    char record[400]; //  "ENDPOINT MASTER_ID"
    int ttl_s;
    _Atomic uint64_t term; //  the term led, or last led
    _Atomic int64_t until; //  leadership holds before this (zclock_mono)
    _Atomic uint64_t terms_won;
    pthread_mutex_t lock; //  over what follows
    char leader[256];     //  the leader seen while standing by
    uint64_t leader_term;
    zhashx_t *fenced;   //  node id -> term (as a pointer): fencing records
    etcd_t *etcd_fence; //  the master thread's connection (ha_fence_write, ha_fence_clear)
};

static void
s_fenced_read (const char *key, const char *value, void *arg)
{
    ha_t *self = (ha_t *) arg;
    const char *node = strrchr (key, '/');
    uint64_t term = strtoull (value, NULL, 10);
    if (node && node[1] && term)
        zhashx_update (self->fenced, node + 1, (void *) (uintptr_t) term);
}

//  Sleeps ms, or less when the campaign is asked to stop.
static void
s_sleep (ha_t *self, int64_t ms)
{
    int64_t end = zclock_mono () + ms;
    while (!atomic_load (&self->stop) && zclock_mono () < end)
        zclock_sleep (20);
}

//  Standing by: one try at the record. Returns the lease it leads under, or 0 (then
//  *watch_from is the store's revision to watch the record from).
static int64_t
s_campaign (ha_t *self, etcd_t *etcd, int64_t last_lease, int64_t *watch_from)
{
    *watch_from = 0;
    int64_t sent = zclock_mono ();
    int64_t lease;
    if (etcd_lease_grant (etcd, self->ttl_s, &lease) == -1) {
        s_sleep (self, HA_RETRY_MS);
        return 0;
    }
    bool won;
    etcd_kv_t kv;
    if (etcd_create (etcd, self->key, self->record, lease, &won, &kv) == -1) {
        etcd_lease_revoke (etcd, lease);
        s_sleep (self, HA_RETRY_MS);
        return 0;
    }
    if (!won && kv.lease && kv.lease == last_lease && streq (kv.value, self->record)) {
        //  Our own record, under the lease we lost track of (etcd was away): if that lease
        //  still holds, nobody else was elected, and the same term goes on.
        etcd_lease_revoke (etcd, lease);
        int64_t ttl = 0;
        sent = zclock_mono ();
        if (etcd_lease_keepalive (etcd, last_lease, &ttl) == 0 && ttl > 0) {
            atomic_store (&self->until, sent + ttl * 1000 - HA_MARGIN_MS);
            kvp_info ("the master leads again in term %lld (etcd answers again)",
                      (long long) kv.create_revision);
            return last_lease;
        }
        return 0;
    }
    if (!won) {
        etcd_lease_revoke (etcd, lease);
        pthread_mutex_lock (&self->lock);
        char endpoint[256], id[128];
        if (kv.create_revision
            && kvp_leader_record_parse (kv.value, endpoint, sizeof endpoint, id, sizeof id) == 0)
            snprintf (self->leader, sizeof self->leader, "%s", endpoint);
        else
            self->leader[0] = 0;
        self->leader_term = (uint64_t) kv.create_revision;
        pthread_mutex_unlock (&self->lock);
        *watch_from = kv.revision; //  until the record changes (its leader's lease ends)
        return 0;
    }
    //  Elected. The fencing records first: a node fenced under an earlier term must not be
    //  taken back whole (ha.h). Unreadable: the record goes, and the campaign starts over.
    char prefix[300];
    snprintf (prefix, sizeof prefix, "/kvpool/%s/fenced/", self->address.cluster);
    pthread_mutex_lock (&self->lock);
    zhashx_purge (self->fenced);
    int read = etcd_get_prefix (etcd, prefix, s_fenced_read, self);
    pthread_mutex_unlock (&self->lock);
    if (read == -1) {
        kvp_warning ("elected, but cannot read the fencing records: %s; standing by",
                     etcd_error (etcd));
        etcd_lease_revoke (etcd, lease);
        return 0;
    }
    atomic_store (&self->until, sent + self->ttl_s * 1000 - HA_MARGIN_MS);
    atomic_store (&self->term, (uint64_t) kv.create_revision);
    atomic_fetch_add (&self->terms_won, 1);
    kvp_info ("this master leads the cluster %s: term %lld (%d fenced node record(s))",
              self->address.cluster, (long long) kv.create_revision, read);
    return lease;
}

static void *
s_run (void *arg)
{
    ha_t *self = (ha_t *) arg;
    etcd_t *etcd = etcd_new (self->address.endpoints, HA_ETCD_TIMEOUT_MS);
    etcd_set_stop (etcd, &self->stop);
    int64_t lease = 0, last_lease = 0, watch_from = 0;
    bool silent = false; //  said so in the log: etcd does not answer the leader
    while (!atomic_load (&self->stop)) {
        if (!lease && watch_from) {
            //  Another leads: wait on its record, asking etcd nothing else meanwhile.
            int rc = etcd_watch (etcd, self->key, watch_from, HA_WATCH_MS);
            if (rc != 0)
                watch_from = 0;
            if (rc == -1)
                s_sleep (self, HA_RETRY_MS);
            continue;
        }
        if (!lease) {
            lease = s_campaign (self, etcd, last_lease, &watch_from);
            if (lease)
                last_lease = lease;
            continue;
        }
        int64_t until = atomic_load (&self->until);
        s_sleep (self, silent ? HA_RETRY_MS : self->ttl_s * 1000 / 3);
        if (atomic_load (&self->stop))
            break;
        int64_t sent = zclock_mono (), ttl = 0;
        if (etcd_lease_keepalive (etcd, lease, &ttl) == 0) {
            if (ttl > 0) {
                atomic_store (&self->until, sent + ttl * 1000 - HA_MARGIN_MS);
                if (silent)
                    kvp_info ("etcd answers the leader again");
                silent = false;
                continue;
            }
            kvp_warning ("this master's lease ran out (it was paused, or etcd was away): it "
                         "stands by");
            atomic_store (&self->until, 0);
            lease = 0;
            silent = false;
            continue;
        }
        if (!silent)
            kvp_warning ("etcd does not answer the leader: %s (it leads %lld ms more at most)",
                         etcd_error (etcd), (long long) (until - zclock_mono ()));
        silent = true;
        if (zclock_mono () >= until) {
            kvp_warning ("this master's leadership lapsed: etcd unreachable for its lease");
            lease = 0; //  (last_lease: taken up again if its record still stands)
            silent = false;
        }
    }
    //  A leader that stops gives the lease back: a standby is elected at once.
    if (lease && zclock_mono () < atomic_load (&self->until)) {
        atomic_store (&self->until, 0);
        etcd_set_stop (etcd, NULL); //  (so that the revoke is sent)
        if (etcd_lease_revoke (etcd, lease) == 0)
            kvp_info ("this master stepped down: its lease given back");
    }
    etcd_destroy (&etcd);
    return NULL;
}

ha_t *
ha_new (const char *url, int ttl_s, const char *endpoint, const char *master_id, char *error,
        size_t error_size)
{
    etcd_address_t address;
    if (etcd_address_parse (url, &address, error, error_size) == -1)
        return NULL;
    if (strncmp (endpoint, "tcp://", 6) != 0 || strchr (endpoint, ' ')) {
        snprintf (error, error_size, "--ha needs a tcp endpoint the nodes can reach, not %s",
                  endpoint);
        return NULL;
    }
    ha_t *self = (ha_t *) zmalloc (sizeof (ha_t));
    self->address = address;
    self->ttl_s = ttl_s;
    kvp_leader_key (self->key, sizeof self->key, address.cluster);
    snprintf (self->record, sizeof self->record, "%s %s", endpoint, master_id);
    pthread_mutex_init (&self->lock, NULL);
    self->fenced = zhashx_new ();
    self->etcd_fence = etcd_new (address.endpoints, HA_ETCD_TIMEOUT_MS);
    atomic_init (&self->stop, false);
    int rc = pthread_create (&self->thread, NULL, s_run, self);
    assert (rc == 0);
    return self;
}

void
ha_destroy (ha_t **self_p)
{
    ha_t *self = *self_p;
    if (!self)
        return;
    atomic_store (&self->stop, true);
    pthread_join (self->thread, NULL);
    zhashx_destroy (&self->fenced);
    etcd_destroy (&self->etcd_fence);
    pthread_mutex_destroy (&self->lock);
    free (self);
    *self_p = NULL;
}

uint64_t
ha_leading (ha_t *self, int64_t now)
{
    return now < atomic_load (&self->until) ? atomic_load (&self->term) : 0;
}

void
ha_leader (ha_t *self, char *endpoint, size_t size, uint64_t *term)
{
    pthread_mutex_lock (&self->lock);
    snprintf (endpoint, size, "%s", self->leader);
    *term = self->leader_term;
    pthread_mutex_unlock (&self->lock);
}

uint64_t
ha_terms_won (ha_t *self)
{
    return atomic_load (&self->terms_won);
}

uint64_t
ha_fenced (ha_t *self, const char *node_id)
{
    pthread_mutex_lock (&self->lock);
    uint64_t term = (uint64_t) (uintptr_t) zhashx_lookup (self->fenced, node_id);
    pthread_mutex_unlock (&self->lock);
    return term;
}

int
ha_fence_write (ha_t *self, const char *node_id, uint64_t term)
{
    if (ha_fenced (self, node_id) == term)
        return 0; //  recorded already
    char key[400], value[32];
    kvp_fence_key (key, sizeof key, self->address.cluster, node_id);
    snprintf (value, sizeof value, "%llu", (unsigned long long) term);
    if (etcd_put (self->etcd_fence, key, value) == -1) {
        kvp_warning ("cannot record the fence of node %s in etcd: %s", node_id,
                     etcd_error (self->etcd_fence));
        return -1;
    }
    pthread_mutex_lock (&self->lock);
    zhashx_update (self->fenced, node_id, (void *) (uintptr_t) term);
    pthread_mutex_unlock (&self->lock);
    return 0;
}

void
ha_fence_clear (ha_t *self, const char *node_id)
{
    char key[400];
    kvp_fence_key (key, sizeof key, self->address.cluster, node_id);
    if (etcd_delete (self->etcd_fence, key, 0) == -1) {
        kvp_warning ("cannot clear the fence of node %s in etcd: %s", node_id,
                     etcd_error (self->etcd_fence));
        return; //  (tried again when the node next registers)
    }
    pthread_mutex_lock (&self->lock);
    zhashx_delete (self->fenced, node_id);
    pthread_mutex_unlock (&self->lock);
}

//  ---- self test ---------------------------------------------------------------------
//  (Elections against a real etcd are tests/python/test_ha.py's part.)

void
ha_test (bool verbose)
{
    (void) verbose;
    printf (" * ha: ");
    char error[256];
    assert (!ha_new ("tcp://x:1", 3, "tcp://127.0.0.1:5", "m", error, sizeof error));
    assert (!ha_new ("etcd://127.0.0.1:1/c", 3, "ipc://x", "m", error, sizeof error));
    assert (strstr (error, "tcp endpoint"));
    //  No etcd: it never leads, and stops at once.
    ha_t *ha = ha_new ("etcd://127.0.0.1:1/c", 3, "tcp://127.0.0.1:5", "m", error, sizeof error);
    assert (ha);
    zclock_sleep (100);
    assert (ha_leading (ha, zclock_mono ()) == 0);
    assert (ha_terms_won (ha) == 0 && ha_fenced (ha, "n1") == 0);
    assert (ha_fence_write (ha, "n1", 7) == -1);
    assert (ha_fenced (ha, "n1") == 0);
    int64_t start = zclock_mono ();
    ha_destroy (&ha);
    assert (!ha && zclock_mono () - start < 2000);
    printf ("OK\n");
}
