/*  leader.c - a node's view of its cluster's leading master, kept by a watch of etcd
    (leader.h).

    The watch's loop: read the leader record, set the view from it, then wait on the record
    from the revision read (etcd_watch) until it changes, renewing the wait every
    LEADER_RECHECK_MS from the same revision (so no change can fall between two waits, and
    etcd is asked nothing else while none comes). An etcd that does not answer is tried
    again every LEADER_RETRY_MS; meanwhile the view keeps the last leader known, whose own
    lease check (master/ha.h) stops it serving once it cannot renew.
*/
#include "infra/leader.h"

#include <czmq.h>

#include "infra/etcd.h"
#include "infra/log.h"

#define LEADER_RECHECK_MS 10000
#define LEADER_RETRY_MS 200
#define LEADER_ETCD_TIMEOUT_MS 1000

void
kvp_leader_key (char *key, size_t size, const char *cluster)
{
    snprintf (key, size, "/kvpool/%s/leader", cluster);
}

void
kvp_fence_key (char *key, size_t size, const char *cluster, const char *node_id)
{
    snprintf (key, size, "/kvpool/%s/fenced/%s", cluster, node_id);
}

int
kvp_leader_record_parse (const char *value, char *endpoint, size_t endpoint_size, char *master_id,
                         size_t id_size)
{
    const char *space = strchr (value, ' ');
    if (!space || space == value || (size_t) (space - value) >= endpoint_size
        || strncmp (value, "tcp://", 6) != 0)
        return -1;
    memcpy (endpoint, value, (size_t) (space - value));
    endpoint[space - value] = 0;
    snprintf (master_id, id_size, "%s", space + 1);
    return 0;
}

bool
kvp_leader_get (kvp_leader_t *leader, char *endpoint, size_t size, uint64_t *term)
{
    pthread_mutex_lock (&leader->lock);
    snprintf (endpoint, size, "%s", leader->endpoint);
    if (term)
        *term = atomic_load (&leader->term);
    pthread_mutex_unlock (&leader->lock);
    return *endpoint != 0;
}

bool
kvp_leader_set (kvp_leader_t *leader, const char *endpoint, const char *master_id, uint64_t term)
{
    bool changed = false;
    pthread_mutex_lock (&leader->lock);
    //  None leads now: whatever term elected the last one.
    if (!*endpoint || term >= atomic_load (&leader->term)) {
        if (term > atomic_load (&leader->term))
            atomic_store (&leader->term, term);
        if (!streq (leader->endpoint, endpoint)) {
            snprintf (leader->endpoint, sizeof leader->endpoint, "%s", endpoint);
            atomic_fetch_add (&leader->generation, 1);
            changed = true;
        }
        snprintf (leader->master_id, sizeof leader->master_id, "%s", master_id);
    }
    pthread_mutex_unlock (&leader->lock);
    return changed;
}

struct _leader_watch_t {
    pthread_t thread;
    atomic_bool stop;
    kvp_leader_t *leader;
    etcd_address_t address;
    char key[300];
};

static void *
s_watch (void *arg)
{
    leader_watch_t *self = (leader_watch_t *) arg;
    kvp_leader_t *leader = self->leader;
    etcd_t *etcd = etcd_new (self->address.endpoints, LEADER_ETCD_TIMEOUT_MS);
    etcd_set_stop (etcd, &self->stop);
    bool unreachable = false;
    int64_t revision = 0; //  the store's revision the record was last read at
    while (!atomic_load (&self->stop)) {
        //  Watched with no change: watch on (no traffic while nothing changes).
        if (revision) {
            int rc = etcd_watch (etcd, self->key, revision, LEADER_RECHECK_MS);
            if (rc == 0)
                continue;
            revision = 0;
            if (rc == -1)
                zclock_sleep (LEADER_RETRY_MS);
            continue;
        }
        etcd_kv_t kv;
        if (etcd_get (etcd, self->key, &kv) == -1) {
            if (!unreachable && !atomic_load (&self->stop))
                kvp_warning ("cannot read the leading master from %s: %s (trying again)",
                             leader->url, etcd_error (etcd));
            unreachable = true;
            zclock_sleep (LEADER_RETRY_MS);
            continue;
        }
        if (unreachable)
            kvp_info ("etcd answers again (%s)", leader->url);
        unreachable = false;
        char endpoint[256] = "", master_id[128] = "";
        if (kv.create_revision
            && kvp_leader_record_parse (kv.value, endpoint, sizeof endpoint, master_id,
                                        sizeof master_id)
                   == -1)
            kvp_warning ("%s: the leader record '%s' is not a master's", leader->url, kv.value);
        uint64_t before = atomic_load (&leader->term);
        if (kvp_leader_set (leader, endpoint, master_id, (uint64_t) kv.create_revision)) {
            if (*endpoint) {
                atomic_fetch_add (&leader->changes, 1);
                kvp_info ("the master %s (%s) leads, term %lld", endpoint, master_id,
                          (long long) kv.create_revision);
            }
            else
                kvp_warning ("no master leads the cluster now (%s): puts fail until one does",
                             leader->url);
        }
        else if (kv.create_revision && (uint64_t) kv.create_revision < before)
            kvp_warning ("%s names a leader of term %lld, older than term %llu: ignored",
                         leader->url, (long long) kv.create_revision, (unsigned long long) before);
        revision = kv.revision;
    }
    etcd_destroy (&etcd);
    return NULL;
}

leader_watch_t *
leader_watch_new (const char *url, kvp_leader_t *leader, char *error, size_t error_size)
{
    etcd_address_t address;
    if (etcd_address_parse (url, &address, error, error_size) == -1)
        return NULL;
    leader_watch_t *self = (leader_watch_t *) zmalloc (sizeof (leader_watch_t));
    self->leader = leader;
    self->address = address;
    snprintf (leader->url, sizeof leader->url, "%s", url);
    kvp_leader_key (self->key, sizeof self->key, address.cluster);
    atomic_init (&self->stop, false);
    int rc = pthread_create (&self->thread, NULL, s_watch, self);
    assert (rc == 0);
    return self;
}

void
leader_watch_destroy (leader_watch_t **self_p)
{
    leader_watch_t *self = *self_p;
    if (!self)
        return;
    atomic_store (&self->stop, true);
    pthread_join (self->thread, NULL);
    free (self);
    *self_p = NULL;
}

//  ---- self test ---------------------------------------------------------------------

void
leader_test (bool verbose)
{
    (void) verbose;
    printf (" * leader: ");
    char endpoint[256], id[128];
    assert (kvp_leader_record_parse ("tcp://10.0.0.1:5555 host/12/34", endpoint, sizeof endpoint,
                                     id, sizeof id)
            == 0);
    assert (streq (endpoint, "tcp://10.0.0.1:5555") && streq (id, "host/12/34"));
    assert (kvp_leader_record_parse ("garbage", endpoint, sizeof endpoint, id, sizeof id) == -1);
    assert (kvp_leader_record_parse ("ipc://x y", endpoint, sizeof endpoint, id, sizeof id) == -1);

    static kvp_leader_t leader = {.lock = PTHREAD_MUTEX_INITIALIZER};
    assert (!kvp_leader_get (&leader, endpoint, sizeof endpoint, NULL));
    assert (kvp_leader_set (&leader, "tcp://a:1", "a", 5));
    uint64_t term;
    assert (kvp_leader_get (&leader, endpoint, sizeof endpoint, &term));
    assert (streq (endpoint, "tcp://a:1") && term == 5);
    //  A deposed leader's record, read late, is no news.
    assert (!kvp_leader_set (&leader, "tcp://old:1", "old", 4));
    assert (kvp_leader_get (&leader, endpoint, sizeof endpoint, &term));
    assert (streq (endpoint, "tcp://a:1") && term == 5);
    //  No leader: requests fail at once; the term known stays.
    assert (kvp_leader_set (&leader, "", "", 0));
    assert (!kvp_leader_get (&leader, endpoint, sizeof endpoint, &term) && term == 5);
    assert (kvp_leader_set (&leader, "tcp://b:1", "b", 9));
    assert (atomic_load (&leader.generation) == 3);

    //  A watch of an etcd nobody runs stops at once when asked.
    char error[200];
    assert (!leader_watch_new ("tcp://x:1", &leader, error, sizeof error));
    leader_watch_t *watch = leader_watch_new ("etcd://127.0.0.1:1/t", &leader, error, sizeof error);
    assert (watch);
    zclock_sleep (50);
    int64_t start = zclock_mono ();
    leader_watch_destroy (&watch);
    assert (!watch && zclock_mono () - start < 2000);
    printf ("OK\n");
}
