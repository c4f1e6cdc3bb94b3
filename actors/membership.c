/*  membership.c - the membership actor (membership.h).

    States: unregistered (REGISTER sent each beat until answered), reporting (the inventory
    asked of the replica-manager, then sent in chunks of INVENTORY_CHUNK keys), registered
    (heartbeats). Any reply that says the master does not know this node, or carries another
    epoch, sends it back to unregistered. A reply that does not come is not an error: the
    next beat goes anyway (the master may be restarting), and requests to an absent master
    fail at once (ZMQ_IMMEDIATE) rather than queue up for its return. Every word to the master
    goes through this actor's master client (master_client.h): the connection, ids, the
    registration pair it keeps for the node, and what makes a reply stale.

    The link as /health and STATS show it (infra/metrics.h metrics_link_*): the master this
    node talks to, whether it knows the node as registered, when it last answered. A
    REGISTER refused because another live node holds this node's id (MasterReply.duplicate)
    twice in a row (the first may be a restart's, sent before the master saw the old
    process's connection close) stops the node: the reason in the log and in /health, then
    SIGTERM to its own process, and kvpoold exits 1. Retrying would never succeed, and the
    node would serve clients every put of which fails.

    Threads: one (its loop: infra/actor_shell.h). Talks to the replica-manager and the
    allocator with jobs, like any actor.
*/
#include "actors/membership.h"

#include "actors/master_client.h"
#include "infra/actor_shell.h"
#include "infra/log.h"
#include "infra/metrics.h"

#include <signal.h>
#include <unistd.h>

#include "kvpool_status.h"
#include "messages/kvp_job.h"
#include "protocol/cluster.pb-c.h"
#include "protocol/contract.h"

#define INVENTORY_CHUNK 10000

typedef enum { UNREGISTERED, REPORTING, REGISTERED } state_t;

typedef struct {
    zsock_t *pipe;
    master_client_t *master;
    zsock_t *rm; //  the replica-manager, whose thread also answers the allocator's AL_STATS
                 //  (the shell's)
    const cluster_args_t *args;
    const kvp_config_t *config;
    state_t state;
    bool stats_out, inventory_out;
    size_t drops_out; //  removes of refused copies at the replica-manager
    //  The objects the last inventory reported (key -> object id), until the master has
    //  answered every chunk of it: a refused copy is dropped only if it is still that object.
    zhashx_t *reported;
    size_t reports_out;
    uint64_t register_id; //  the REGISTER whose reply counts
    int64_t next_beat;
    int64_t last_heard; //  the master's last reply (zclock_mono), or the start
    bool silent;        //  said so in the log: the master has not answered for long
    //  The node's lease (infra/config.h): the last heartbeats sent (request id, when), so
    //  that an answer moves the lease on from when its heartbeat left; and whether the
    //  cache copies are being dropped before the node registers again.
    struct {
        uint64_t id;
        int64_t sent;
    } beats[16];
    size_t next_beat_slot;
    bool cache_drop_out;
    //  The node stopped past its lease (infra/config.h, kvp_lease_suspended): it serves its
    //  own copies again once a heartbeat of its registration is answered and the copies the
    //  master refused are dropped.
    bool confirmed;              //  answered; waiting for the drops
    unsigned duplicate_refusals; //  REGISTERs refused in a row: another node has this id
    bool stopping;               //  refused for good: nothing more is sent
} self_t;

//  Refusals that another live node holds this id, in a row, that stop the node.
#define DUPLICATE_REFUSALS_TO_STOP 2

//  Silence from the master this long is said in the log (once, and once when it answers).
#define MASTER_SILENT_MS 5000

//  Sends request to the master, nobody waiting (the next beat goes anyway).
static void
s_send (self_t *self, Kvpool__Cluster__V1__NodeRequest *request)
{
    master_client_send (self->master, request, NULL);
}

static void
s_beat (self_t *self)
{
    if (self->stopping) { //  refused for good: the process is stopping
        self->next_beat = zclock_mono () + (int64_t) self->config->heartbeat_ms;
        return;
    }
    //  (The master it talks to may change: a standby that took over.)
    metrics_link_endpoint (self->config->metrics, master_client_endpoint (self->master));
    //  Free space for the next beat; this one says what was known.
    if (!self->stats_out) {
        kvp_job_t *job = kvp_job_new (KVP_AL_STATS, 0);
        if (kvp_job_send (self->rm, job) == 0)
            self->stats_out = true;
        else
            kvp_job_destroy (&job);
    }
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    if (self->state == UNREGISTERED && self->cache_drop_out)
        ; //  not before its cache copies are gone (s_lease_lost)
    else {
        //  A REGISTER's answer starts the lease, a HEARTBEAT's moves it on (s_lease_renew).
        bool registering = self->state == UNREGISTERED;
        request.kind = registering ? KVPOOL__CLUSTER__V1__KIND__REGISTER
                                   : KVPOOL__CLUSTER__V1__KIND__HEARTBEAT;
        int64_t sent = zclock_mono ();
        s_send (self, &request);
        //  The lease's clock: the master heard this node no earlier than now, and fences it
        //  for a lease (and a tenth) past what it heard last (master.c, s_fence).
        if (self->config->lease)
            atomic_store (&self->config->lease->beat_ms, sent);
        if (registering)
            self->register_id = request.request_id; //  (set even when it did not go)
        self->beats[self->next_beat_slot].id = request.request_id;
        self->beats[self->next_beat_slot].sent = sent;
        self->next_beat_slot = (self->next_beat_slot + 1) % 16;
    }
    self->next_beat = zclock_mono () + (int64_t) self->config->heartbeat_ms;
    int64_t silent_ms = zclock_mono () - self->last_heard;
    if (!self->silent && silent_ms > MASTER_SILENT_MS) {
        kvp_warning ("no answer from the master %s for %lld ms: node %s serves what it holds and "
                     "registers when the master answers",
                     master_client_endpoint (self->master), (long long) silent_ms,
                     self->args->node_id);
        self->silent = true;
    }
}

static void
s_id_free (void **item)
{
    free (*item);
    *item = NULL;
}

static void
s_inventory_send (self_t *self, kvp_job_t *job)
{
    size_t chunk = INVENTORY_CHUNK;
    ProtobufCBinaryData *keys = (ProtobufCBinaryData *) malloc (chunk * sizeof *keys);
    uint64_t *sizes = (uint64_t *) malloc (chunk * sizeof (uint64_t));
    uint64_t *versions = (uint64_t *) malloc (chunk * sizeof (uint64_t));
    assert (keys && sizes && versions);
    zhashx_destroy (&self->reported);
    self->reported = zhashx_new ();
    assert (self->reported);
    zhashx_set_destructor (self->reported, s_id_free);
    zhashx_set_duplicator (self->reported, NULL);
    self->reports_out = 0;
    for (size_t i = 0; i < job->count; i++) {
        uint64_t *id = (uint64_t *) malloc (sizeof (uint64_t));
        assert (id);
        *id = job->items[i].object_id;
        //  (Keys are NUL-free strings: the object table's.)
        zhashx_update (self->reported, job->items[i].key, id);
    }
    for (size_t start = 0; start < job->count; start += chunk) {
        size_t n = job->count - start < chunk ? job->count - start : chunk;
        for (size_t k = 0; k < n; k++) {
            keys[k].data = (uint8_t *) job->items[start + k].key;
            keys[k].len = job->items[start + k].key_len;
            sizes[k] = job->items[start + k].size;
            versions[k] = job->items[start + k].version;
        }
        Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
        request.kind = KVPOOL__CLUSTER__V1__KIND__INVENTORY;
        request.keys = keys;
        request.n_keys = n;
        request.sizes = sizes;
        request.n_sizes = n;
        request.versions = versions;
        request.n_versions = n;
        s_send (self, &request);
        self->reports_out++;
    }
    free (keys);
    free (sizes);
    free (versions);
    kvp_info ("node %s registered with %s: %zu objects reported", self->args->node_id,
              master_client_endpoint (self->master), job->count);
}

//  The master refused copies this node reported: each key was written again while the node
//  was away, so the copy here is older than the value the cluster serves. They go at once,
//  so that no client of this node reads them.
static void
s_drop_refused (self_t *self, const Kvpool__Cluster__V1__MasterReply *reply)
{
    const char **keys = (const char **) malloc (reply->n_keys * sizeof (char *));
    size_t *lens = (size_t *) malloc (reply->n_keys * sizeof (size_t));
    assert (keys && lens);
    for (size_t k = 0; k < reply->n_keys; k++) {
        keys[k] = (const char *) reply->keys[k].data;
        lens[k] = reply->keys[k].len;
    }
    kvp_job_t *job = kvp_job_new_owning (KVP_RM_REMOVE, reply->n_keys, keys, lens);
    free (keys);
    free (lens);
    job->opt.force = true;
    //  Only the objects reported: a put of the key since then made a newer one, which the
    //  master knows and which stays. (A key not in the report gets an id no object has.)
    for (size_t k = 0; k < job->count; k++) {
        uint64_t *id =
            self->reported ? (uint64_t *) zhashx_lookup (self->reported, job->items[k].key) : NULL;
        job->items[k].object_id = id ? *id : UINT64_MAX;
    }
    if (kvp_job_send (self->rm, job) == 0)
        self->drops_out++;
    else
        kvp_job_destroy (&job);
    kvp_warning ("node %s: %zu stale copies dropped: their keys were written again while the "
                 "master did not hear from this node",
                 self->args->node_id, reply->n_keys);
}

//  The master answered a heartbeat: the lease runs on from when it was sent.
static void
s_lease_renew (self_t *self, uint64_t request_id)
{
    kvp_lease_t *lease = self->config->lease;
    for (size_t i = 0; lease && i < 16; i++)
        if (self->beats[i].id == request_id && request_id) {
            int64_t until =
                self->beats[i].sent + KVP_LEASE_BEATS * (int64_t) self->config->heartbeat_ms;
            if (until > atomic_load (&lease->until_ms))
                atomic_store (&lease->until_ms, until);
            return;
        }
}

//  The master no longer knows this node (it restarted, or declared the node dead: fenced by
//  a remove that could not reach it): the lease ends now, and every cache copy goes before
//  the node registers again, so that none the master does not know of is served later
//  (with the copies other nodes wrote here that no master confirmed yet: replica_cache.c).
static void
s_lease_lost (self_t *self)
{
    if (self->config->lease)
        atomic_store (&self->config->lease->until_ms, 0);
    kvp_job_t *job = kvp_job_new (KVP_RM_CACHE_DROP, 0);
    if (kvp_job_send (self->rm, job) == 0)
        self->cache_drop_out = true;
    else
        kvp_job_destroy (&job);
}

//  The master confirmed what this node holds: a stopped node serves its copies again.
static void
s_resume (self_t *self)
{
    kvp_lease_t *lease = self->config->lease;
    if (!lease || !atomic_load (&lease->suspended))
        return;
    if (self->drops_out) {
        self->confirmed = true; //  (once the refused copies are gone: s_rm_reply)
        return;
    }
    self->confirmed = false;
    atomic_store (&lease->suspended, false);
    kvp_info ("node %s: the master confirmed what it holds: serving its copies again",
              self->args->node_id);
}

//  The master refused this node's REGISTER. Another live node holding its id (told twice in
//  a row) stops it; anything else is tried again at the next beat.
static void
s_refused (self_t *self, const Kvpool__Cluster__V1__MasterReply *reply)
{
    const char *why = reply->error && *reply->error ? reply->error : "no reason given";
    self->duplicate_refusals = reply->duplicate ? self->duplicate_refusals + 1 : 0;
    if (self->duplicate_refusals < DUPLICATE_REFUSALS_TO_STOP) {
        kvp_warning ("the master %s refused node %s: %s (status %d); trying again",
                     master_client_endpoint (self->master), self->args->node_id, why,
                     reply->status);
        return;
    }
    char reason[512];
    snprintf (reason, sizeof reason, "the master %s refused node %s: %s",
              master_client_endpoint (self->master), self->args->node_id, why);
    kvp_error ("%s; this node stops", reason);
    metrics_link_refused (self->config->metrics, reason);
    self->stopping = true;
    //  kvpoold's main thread takes it (sigwaitinfo), stops every actor and exits 1.
    kill (getpid (), SIGTERM);
}

static void
s_master_reply (self_t *self, void *which)
{
    void *call;
    Kvpool__Cluster__V1__MasterReply *reply = master_client_recv (self->master, which, &call);
    if (!reply)
        return;
    self->last_heard = zclock_mono ();
    if (self->silent) {
        kvp_info ("the master %s answers again", master_client_endpoint (self->master));
        self->silent = false;
    }
    if (reply->kind == KVPOOL__CLUSTER__V1__KIND__REGISTER && reply->status != KVPOOL_OK
        && reply->request_id == self->register_id)
        s_refused (self, reply);
    if (reply->kind == KVPOOL__CLUSTER__V1__KIND__INVENTORY) {
        if (reply->n_keys > 0)
            s_drop_refused (self, reply);
        if (self->reports_out && --self->reports_out == 0) {
            zhashx_destroy (&self->reported);
            //  Every report answered, the refused copies on their way out: what remains is
            //  what the master confirmed.
            if (self->state == REGISTERED)
                s_resume (self);
        }
    }
    if (reply->kind == KVPOOL__CLUSTER__V1__KIND__REGISTER) {
        if (reply->request_id == self->register_id && reply->status == KVPOOL_OK
            && self->state == UNREGISTERED) {
            self->duplicate_refusals = 0;
            //  The node's registration, for every client of the node to send back.
            master_client_registered (self->master, reply->epoch, reply->registration);
            s_lease_renew (self, reply->request_id);
            self->state = REPORTING;
            //  What this node holds, for the master to know again.
            kvp_job_t *job = kvp_job_new (KVP_RM_INVENTORY, 0);
            if (kvp_job_send (self->rm, job) == 0)
                self->inventory_out = true;
            else {
                kvp_job_destroy (&job);
                self->state = UNREGISTERED;
            }
        }
    }
    else if (master_client_stale (self->master, reply)) {
        //  The master does not know this node (restarted, or declared it dead): again.
        if (self->state == REGISTERED) {
            //  The same master, that no longer knows this registration: it declared the
            //  node dead (silent past --node-ttl, or fenced by a remove or an upsert it
            //  did not confirm in time), and that change completed without it. Its own
            //  copies wait, as after a stop past its lease, until the master has confirmed
            //  them (what it refuses dropped first): served meanwhile, a removed or
            //  replaced value was read back through this node after its remover had been
            //  answered. (A master restarted, or of a new term, lost no change this way.)
            bool declared_dead = reply->epoch == master_client_epoch (self->master);
            kvp_lease_t *lease = self->config->lease;
            if (declared_dead && lease && !atomic_load (&lease->suspended)) {
                atomic_store (&lease->suspended, true);
                kvp_warning ("%s declared node %s dead: registering again; it serves none "
                             "of its copies until the master confirms them",
                             master_client_name (self->master), self->args->node_id);
            }
            else
                kvp_warning ("%s does not know node %s: registering again",
                             master_client_name (self->master), self->args->node_id);
            self->state = UNREGISTERED;
            s_lease_lost (self);
            self->next_beat = zclock_mono (); //  at once
        }
    }
    else if (reply->kind == KVPOOL__CLUSTER__V1__KIND__HEARTBEAT && reply->status == KVPOOL_OK
             && self->state != UNREGISTERED) {
        s_lease_renew (self, reply->request_id);
        //  (Heartbeats follow the inventory: every report of it is answered by now.)
        if (self->state == REGISTERED && !self->reports_out)
            s_resume (self);
    }
    //  What /health says of the link: heard from now, registered or not.
    metrics_link_heard (self->config->metrics, self->state != UNREGISTERED && !self->stopping,
                        self->last_heard);
    master_client_reply_free (&reply);
}

//  A job back from the replica-manager: the allocator's free space, a drop report's removal,
//  or the inventory to report.
static void
s_rm_reply (self_t *self)
{
    kvp_job_t *job = kvp_job_recv (self->rm);
    if (job && job->kind == KVP_AL_STATS) {
        uint64_t capacity = kvp_job_stats (job)->bytes_mounted;
        master_client_set_space (self->master, capacity,
                                 capacity > kvp_job_stats (job)->bytes_allocated
                                     ? capacity - kvp_job_stats (job)->bytes_allocated
                                     : 0);
        self->stats_out = false;
    }
    else if (job && job->kind == KVP_RM_REMOVE) {
        self->drops_out--;
        if (self->confirmed && !self->drops_out)
            s_resume (self);
    }
    else if (job && job->kind == KVP_RM_CACHE_DROP) {
        self->cache_drop_out = false;
        self->next_beat = zclock_mono (); //  registers at once
    }
    else {
        self->inventory_out = false;
        if (job && self->state == REPORTING) {
            s_inventory_send (self, job);
            self->state = REGISTERED;
            if (!self->reports_out)
                s_resume (self); //  nothing held: nothing to confirm
        }
    }
    kvp_job_destroy (&job);
}

static int
s_master_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell;
    s_master_reply ((self_t *) arg, sock);
    return 0;
}

static int
s_rm_reader (actor_shell_t *shell, zsock_t *rm, void *arg)
{
    (void) shell;
    (void) rm;
    s_rm_reply ((self_t *) arg);
    return 0;
}

//  After every wake-up (the one that brought $TERM too): the beat, when due. First, whether
//  this node itself stopped past its lease since the last look.
static void
s_stall_check (self_t *self)
{
    kvp_lease_t *lease = self->config->lease;
    if (!lease)
        return;
    int64_t now = zclock_mono ();
    int64_t beat = atomic_load (&lease->beat_ms);
    if (beat && now - beat > atomic_load (&lease->period_ms) && !atomic_load (&lease->suspended)) {
        atomic_store (&lease->suspended, true);
        kvp_warning ("node %s did not run for %lld ms, past its lease: it serves none of its "
                     "copies until the master confirms them (it may have been fenced meanwhile)",
                     self->args->node_id, (long long) (now - beat));
    }
}

static int64_t
s_tick (actor_shell_t *shell, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    s_stall_check (self);
    //  A new leader (standby masters): it does not know this node; register with it now.
    if (master_client_follow (self->master)) {
        kvp_info ("node %s follows %s", self->args->node_id, master_client_name (self->master));
        metrics_link_endpoint (self->config->metrics, master_client_endpoint (self->master));
        metrics_link_term (self->config->metrics, master_client_term (self->master));
        if (self->state != UNREGISTERED) {
            self->state = UNREGISTERED;
            s_lease_lost (self);
        }
        self->next_beat = zclock_mono ();
    }
    if (zclock_mono () >= self->next_beat)
        s_beat (self);
    //  (A new leader is looked for at least every 100 ms meanwhile.)
    int64_t follow = zclock_mono () + 100;
    return self->config->leader && follow < self->next_beat ? follow : self->next_beat;
}

static self_t *
s_self_new (actor_shell_t *shell, zsock_t *pipe, const cluster_args_t *args)
{
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->pipe = pipe;
    self->args = args;
    self->config = self->args->config;
    //  (Its calls are not tracked: the timeout is never used.)
    self->master = master_client_new (self->args, (int) self->config->cluster_timeout_ms);
    assert (self->master);
    master_client_wait_on (self->master, shell, s_master_reader);
    static const actor_socket_t rm = {ZMQ_DEALER,       ">inproc://%s-rm", ACTOR_HWM_LIBZMQ,
                                      ACTOR_HWM_LIBZMQ, s_rm_reader,       false};
    self->rm = actor_shell_open (shell, &rm, self->config->instance);
    assert (self->rm);
    return self;
}

static void
s_self_destroy (self_t **self_p)
{
    self_t *self = *self_p;
    if (!self)
        return;
    //  Jobs still out come back before the sockets go (the actors end after this one).
    zsock_set_rcvtimeo (self->rm, 5000);
    size_t out = self->drops_out + (self->inventory_out ? 1 : 0) + (self->stats_out ? 1 : 0);
    for (; out > 0; out--) {
        kvp_job_t *job = kvp_job_recv (self->rm);
        kvp_job_destroy (&job);
    }
    zhashx_destroy (&self->reported);
    master_client_destroy (&self->master);
    free (self);
    *self_p = NULL;
}

void
membership_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-membership");
    self_t *self = s_self_new (shell, pipe, (const cluster_args_t *) args);
    actor_shell_ready (shell, 0);
    //  The first REGISTER once the allocator said how much memory the node has (placement
    //  passes over a node too small for a value), and the connection had a moment.
    kvp_job_t *stats = kvp_job_new (KVP_AL_STATS, 0);
    if (kvp_job_send (self->rm, stats) == 0)
        self->stats_out = true;
    else
        kvp_job_destroy (&stats);
    self->next_beat = zclock_mono () + 20;
    self->last_heard = zclock_mono ();
    //  A node serves what it holds once the master has confirmed it: a restarted node's
    //  adopted objects may have been removed while it was down (infra/config.h).
    if (self->config->lease) {
        atomic_store (&self->config->lease->period_ms,
                      (int64_t) (KVP_LEASE_BEATS * self->config->heartbeat_ms));
        atomic_store (&self->config->lease->suspended, true);
    }
    metrics_link_master (self->config->metrics, master_client_endpoint (self->master),
                         KVP_LEASE_BEATS * self->config->heartbeat_ms, self->last_heard);
    actor_shell_on_tick (shell, s_tick);
    actor_shell_set_final_tick (shell, true);
    actor_shell_run (shell, self);
    s_self_destroy (&self);
    actor_shell_destroy (&shell); //  (the replica-manager's dealer)
}
