/*  replica_repair.c - the repair actor (replica_repair.h).

    DESIGN
    A token bucket holds the bytes --repair-rate lets this node copy in: it fills every
    tick (at most REPAIR_BURST_S seconds' worth), and while it holds any and fewer than
    REPAIR_JOBS_MAX copies are under way, the actor asks the master for work (REPAIR, one
    call at a time) with what it holds, at most REPAIR_BATCH_MAX bytes. The work handed
    back is taken out of the bucket (it may go below zero: the next asks wait) and becomes
    one KVP_OP_REPAIR_FILL job to the api, whose stages do the copy (messages/ops.c): the
    cluster actor fetches each value from a holder, the allocator places it (evicting as a
    put does), the transfer-submitter writes it, the replica-manager keeps it hidden, the
    master takes it (REPAIRED) or refuses it, and the replica-manager serves it as a replica
    of this node's or drops it. --repair-rate 0: the actor asks for nothing.

    A drain of this node (the DRAIN pipe command, kvpoold --drain-on-exit) asks the master
    to start it, and again every DRAIN_POLL_MS (a standby master that took over meanwhile
    knows of no drain; a start of a drain under way changes nothing) to learn how it stands, until
   no object is held only here or --drain-timeout passed; then it tells the master the node is done
   (it leaves every holder list, so that no reader is sent here once it is gone) and answers.

    Threads: one (infra/actor_shell.h). Talks to the master through its own master client
    and to the api through its job socket, like the lookup server.
*/
#include "actors/replica_repair.h"

#include "actors/master_client.h"
#include "infra/actor_shell.h"
#include "infra/log.h"

#include "kvpool_status.h"
#include "messages/kvp_job.h"
#include "messages/ops.h"
#include "protocol/cluster.pb-c.h"

#define REPAIR_TICK_MS 20
//  A master with no work for this node is asked again this much later (not every tick: an
//  idle cluster's nodes asked 50 times a second each, and the master's CPU and the nodes'
//  went to it).
#define REPAIR_IDLE_MS 500
#define REPAIR_JOBS_MAX 2
#define REPAIR_BATCH_MAX (32ULL << 20)
#define REPAIR_BURST_S 0.25
#define DRAIN_POLL_MS 200
#define DRAIN_LOG_MS 2000
//  A drain whose master does not answer ends this long after --drain-timeout.
#define DRAIN_GRACE_MS 2000

typedef enum { DRAIN_NONE, DRAIN_STARTING, DRAIN_WAITING, DRAIN_ENDING } drain_state_t;

typedef struct {
    zsock_t *pipe;
    master_client_t *master;
    zsock_t *jobs; //  DEALER to the api's inproc://<instance>-jobs
    const cluster_args_t *args;
    const kvp_config_t *config;
    double tokens; //  bytes it may copy in now
    int64_t last_fill;
    bool asking;      //  a REPAIR call is out
    int64_t next_ask; //  not before (the master had no work: REPAIR_IDLE_MS)
    size_t jobs_out;
    //  The drain of this node.
    drain_state_t drain;
    bool drain_call_out;
    int64_t drain_deadline, drain_next, drain_logged;
    uint64_t drain_sole; //  objects only here, as the master last said
} self_t;

//  What the calls out are (the handle master_client gives back).
#define CALL_REPAIR ((void *) 1)
#define CALL_DRAIN ((void *) 2)

static void
s_ask_work (self_t *self)
{
    uint64_t budget = (uint64_t) self->tokens;
    if (budget > REPAIR_BATCH_MAX)
        budget = REPAIR_BATCH_MAX;
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = KVPOOL__CLUSTER__V1__KIND__REPAIR;
    request.repair_budget = budget;
    if (master_client_send (self->master, &request, CALL_REPAIR))
        self->asking = true;
}

//  The master's work: one job to the api that copies it.
static void
s_work (self_t *self, const Kvpool__Cluster__V1__MasterReply *reply)
{
    self->asking = false;
    size_t n = reply->n_keys;
    if (reply->status != KVPOOL_OK || n == 0 || reply->n_sizes != n || reply->n_versions != n) {
        self->next_ask = zclock_mono () + REPAIR_IDLE_MS;
        return;
    }
    kvp_job_t *job = kvp_job_new (KVP_JOB_NONE, 0);
    job->op = KVP_OP_REPAIR_FILL;
    kvp_job_payload (job, KVP_PAYLOAD_PROMOTE);
    for (size_t i = 0; i < n; i++) {
        kvp_item_t *item =
            kvp_job_append_key (job, (const char *) reply->keys[i].data, reply->keys[i].len);
        item->size = reply->sizes[i];
        item->version = reply->versions[i];
        item->status = KVPOOL_OBJECT_NOT_FOUND; //  fetched from a holder (CL_FETCH)
        self->tokens -= (double) reply->sizes[i];
    }
    if (kvp_job_send (self->jobs, job) == 0)
        self->jobs_out++;
    else
        kvp_job_destroy (&job);
}

static void
s_drain_send (self_t *self, uint32_t action)
{
    Kvpool__Cluster__V1__NodeRequest request = KVPOOL__CLUSTER__V1__NODE_REQUEST__INIT;
    request.kind = KVPOOL__CLUSTER__V1__KIND__DRAIN;
    request.pattern = (char *) self->args->node_id;
    request.drain = action;
    if (master_client_send (self->master, &request, CALL_DRAIN))
        self->drain_call_out = true;
}

static void
s_drain_answer (self_t *self, bool done)
{
    if (done)
        kvp_info ("drain of node %s done: nothing is held only here any more", self->args->node_id);
    else
        kvp_warning ("drain of node %s: --drain-timeout (%llu ms) passed with %llu objects "
                     "held only here: they go with the node",
                     self->args->node_id, (unsigned long long) self->config->drain_timeout_ms,
                     (unsigned long long) self->drain_sole);
    char left[32];
    snprintf (left, sizeof left, "%llu", (unsigned long long) self->drain_sole);
    zstr_sendx (self->pipe, done ? "OK" : "TIMEOUT", left, NULL);
    self->drain = DRAIN_NONE;
}

static void
s_drain_reply (self_t *self, const Kvpool__Cluster__V1__MasterReply *reply)
{
    self->drain_call_out = false;
    int64_t now = zclock_mono ();
    if (!reply || reply->status != KVPOOL_OK) {
        self->drain_next = now + DRAIN_POLL_MS; //  asked again (the master may be away)
        return;
    }
    if (self->drain == DRAIN_ENDING) {
        s_drain_answer (self, self->drain_sole == 0);
        return;
    }
    self->drain = DRAIN_WAITING;
    self->drain_sole = reply->count;
    if (now - self->drain_logged >= DRAIN_LOG_MS) {
        kvp_info ("draining node %s: %llu objects held only here, %llu with fewer replicas "
                  "elsewhere than asked",
                  self->args->node_id, (unsigned long long) reply->count,
                  (unsigned long long) reply->drain_short);
        self->drain_logged = now;
    }
    if (reply->count == 0 || now >= self->drain_deadline) {
        self->drain = DRAIN_ENDING;
        s_drain_send (self, 3);
        if (!self->drain_call_out)
            s_drain_answer (self, reply->count == 0);
        return;
    }
    self->drain_next = now + DRAIN_POLL_MS;
}

static int
s_master_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    void *call = NULL;
    Kvpool__Cluster__V1__MasterReply *reply = master_client_recv (self->master, sock, &call);
    if (reply && call == CALL_REPAIR)
        s_work (self, reply);
    else if (reply && call == CALL_DRAIN)
        s_drain_reply (self, reply);
    master_client_reply_free (&reply);
    return 0;
}

static int
s_jobs_reader (actor_shell_t *shell, zsock_t *sock, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    kvp_job_t *job = kvp_job_recv (sock);
    if (job && self->jobs_out)
        self->jobs_out--;
    kvp_job_destroy (&job);
    return 0;
}

static int
s_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    (void) shell, (void) msg;
    self_t *self = (self_t *) arg;
    if (streq (command, "DRAIN")) {
        int64_t now = zclock_mono ();
        kvp_info ("node %s drains before it exits (at most %llu ms)", self->args->node_id,
                  (unsigned long long) self->config->drain_timeout_ms);
        self->drain = DRAIN_STARTING;
        self->drain_deadline = now + (int64_t) self->config->drain_timeout_ms;
        self->drain_next = now;
        self->drain_logged = 0;
    }
    else {
        kvp_error ("invalid pipe command '%s'", command);
        assert (false);
    }
    return 0;
}

static int64_t
s_tick (actor_shell_t *shell, void *arg)
{
    (void) shell;
    self_t *self = (self_t *) arg;
    int64_t now = zclock_mono ();
    //  Calls the master never answered.
    void *call;
    while ((call = master_client_expired (self->master))) {
        if (call == CALL_REPAIR)
            self->asking = false;
        else if (call == CALL_DRAIN)
            s_drain_reply (self, NULL);
    }
    double rate = (double) self->config->repair_rate;
    if (rate > 0) {
        self->tokens += rate * (double) (now - self->last_fill) / 1000.0;
        if (self->tokens > rate * REPAIR_BURST_S)
            self->tokens = rate * REPAIR_BURST_S;
        if (self->tokens >= 1 && !self->asking && self->jobs_out < REPAIR_JOBS_MAX
            && self->drain == DRAIN_NONE && now >= self->next_ask)
            s_ask_work (self);
    }
    self->last_fill = now;
    if (self->drain != DRAIN_NONE && !self->drain_call_out && now >= self->drain_next) {
        if (now >= self->drain_deadline + DRAIN_GRACE_MS)
            s_drain_answer (self, false); //  the master does not answer
        else {
            if (self->drain == DRAIN_WAITING && now >= self->drain_deadline)
                self->drain = DRAIN_ENDING;
            //  (start again each time: a master that took over since knows no drain)
            s_drain_send (self, self->drain == DRAIN_ENDING ? 3 : 1);
            self->drain_next = now + DRAIN_POLL_MS;
        }
    }
    //  Idle (nothing to ask for until then, no drain): asleep till the next ask.
    if (self->drain == DRAIN_NONE && !self->asking && !self->jobs_out && self->next_ask > now)
        return self->next_ask;
    return now + REPAIR_TICK_MS;
}

void
replica_repair_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-repair");
    self_t *self = (self_t *) zmalloc (sizeof (self_t));
    self->pipe = pipe;
    self->args = (const cluster_args_t *) args;
    self->config = self->args->config;
    self->master = master_client_new (self->args, (int) self->config->cluster_timeout_ms);
    assert (self->master);
    master_client_wait_on (self->master, shell, s_master_reader);
    static const actor_socket_t jobs = {ZMQ_DEALER, ">inproc://%s-jobs", 0,
                                        0,          s_jobs_reader,       false};
    self->jobs = actor_shell_open (shell, &jobs, self->config->instance);
    assert (self->jobs);
    self->last_fill = zclock_mono ();
    actor_shell_on_command (shell, s_command);
    actor_shell_on_tick (shell, s_tick);
    actor_shell_run (shell, self);
    //  Copies under way come back before the socket goes (the api ends after this actor).
    zsock_set_rcvtimeo (self->jobs, 5000);
    for (; self->jobs_out > 0; self->jobs_out--) {
        kvp_job_t *job = kvp_job_recv (self->jobs);
        if (!job)
            break;
        kvp_job_destroy (&job);
    }
    while (master_client_cancel (self->master))
        ;
    master_client_destroy (&self->master);
    free (self);
    actor_shell_destroy (&shell);
}
