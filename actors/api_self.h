/*  api_self.h - the api actor's own state, shared by its files (private: only actors/api*.c
    include it).

    The api is one actor (one thread) written in four files, each about one thing:
        api.c         the actor: its sockets and endpoints, its loop (infra/actor_shell.h:
                      the wait with its spins, the tick), pipe commands, the way out
        api_intake.c  requests in: frames decoded, checked (messages/request_check.h), who
                      may send what, the job built; jobs of in-process actors
        api_route.c   a job walked through its operation's row (messages/ops.h): stages sent
                      to the actors, resets and held writes, the node's own jobs
        api_reply.c   replies out: the Reply encoded from what the row fills, value frames
                      (zero copy, pinned until sent), stats completed with the api's counters
    Everything here belongs to the api's thread.
*/
#ifndef API_SELF_H_INCLUDED
#define API_SELF_H_INCLUDED

#include <czmq.h>

#include "messages/arena.h"
#include "messages/kvp_job.h"
#include "messages/ops.h"
#include "actors/owners.h"
#include "actors/connections.h"
#include "actors/hot_cache.h"
#include "actors/index_reads.h"
#include "infra/config.h"
#include "infra/conn_guard.h"
#include "infra/key_watch.h"
#include "infra/metrics.h"
#include "infra/spin_poll.h"
#include "infra/wait_set.h"
#include "protocol/kvpool.pb-c.h"

//  Requests a connection may have queued at the node before libzmq stops reading its socket.
#define RCVHWM 1000

typedef struct {
    zframe_t *routing_id;
    zsock_t *socket;     //  the socket it came on, and its reply goes out on
    bool cluster;        //  a cluster node's client: the cluster's rows (messages/ops.h)
    bool envelope;       //  REQ client: replies need the empty delimiter
    peer_t peer;         //  who sent it, by the kernel's word (owners.h)
    int64_t arrived_us;  //  when it came in (zclock_usecs), for its latency
    int fd;              //  the socket it came on (ZMQ_SRCFD), -1 for inproc
    owner_t *owner;      //  the sending process's record, for requests that need one
    uint64_t node_owner; //  another node on the data plane: KVP_OWNER_NODE | its credential
    char user_id[256];   //  the credential its connection proved (User-Id), or ""
    bool from_jobs;      //  an in-process actor's job (the job socket): answered with the job
    const kvp_op_t *row; //  the operation's row (messages/ops.h)
    Kvpool__V1__Request *request; //  NULL for a job from an in-process actor
    zmsg_t *values;
    arena_t arena; //  the decoded Request, the keys, the reply's arrays (arena.h)
} api_ctx_t;

typedef struct {
    zsock_t *pipe;
    zsock_t *router;
    zsock_t *peer; //  role node: the data plane (other nodes' requests, on local rows)
    zsock_t *jobs; //  jobs of in-process actors (inproc://<instance>-jobs)
    zsock_t *rm, *tx, *cl;
    bool cluster;               //  role node
    wait_set_t *waits;          //  every socket the api reads (wait_set.h)
    const kvp_config_t *config; //  = &settings
    kvp_config_t settings;      //  its own copy: settings changed at run time land here
    zlistx_t *endpoints;        //  resolved endpoint strings
    char bind_error[256];
    char host_id[64];
    char server_id[96];
    char index_name[96];        //  the replica-manager's same-machine index
    char index_published[96];   //  its name to clients ("/proc/<pid>/fd/<fd>"), once made
    char local_endpoint[300];   //  the ipc endpoint same-machine clients use (PING)
    char peer_endpoint[300];    //  role node: the data plane's, resolved
    owners_t *owners;           //  same-machine client processes
    connections_t *connections; //  unread reply bytes per connection
    int64_t started;
    index_reads_t *reads;       //  small reads answered from the read index, or NULL
    hot_cache_t *hot;           //  role node: the hot cache's admission filter, or NULL (off)
    uint64_t puts_under_replicated; //  keys put with fewer replicas than asked (api_route.c)
    uint64_t under_unlogged;        //  ... not said in the log yet
    int64_t under_logged;           //  when the log last said so (zclock_mono)
    uint64_t cache_misses;      //  gets of values only other nodes hold, found in no copy here
    uint64_t client_cache_hits; //  reads of cache copies same-machine clients did (TOUCH)
    kvp_metrics_t *metrics;     //  per-operation counters (config's, or own_metrics)
    kvp_metrics_t *own_metrics; //  made here when the daemon gave none
    conn_guard_t *guard;        //  refuses connections past --max-connections
    key_watch_t *client_keys;   //  closes connections of revoked client keys (router)
    key_watch_t *node_keys;     //  ... and of revoked node keys (peer, the data plane)
    spin_window_t idle;         //  polling for the next request (spin_poll.h)
    bool idle_spin;             //  the last request was small and answered here alone
    size_t in_flight;           //  jobs out at an actor (client and internal)
    uint64_t client_index_gets; //  values clients read from the index themselves (TOUCH)
    uint64_t client_listed;     //  ... through a pinned replica list (TOUCH: hits)
    uint64_t client_misses;     //  ... and keys they found nowhere (TOUCH: misses)
    size_t writes_in_flight;    //  PUT / PUT_START jobs between reserve and reply
    zlistx_t *resets;           //  RESET jobs waiting for the writes to drain
    zlistx_t *held;             //  puts that arrived during a reset
    bool reset_running;
    bool draining;
    bool map_due;             //  the segments changed: list them for the index reads
    int64_t next_owner_check; //  dead clients reaped, unread bytes swept
    uint64_t requests, errors, dropped, resets_done;
    bool drained; //  DRAINED was said
} api_t;

//  requests in: intake and checks (api_intake.c)
//  A message on the client ROUTER or the data plane: decoded, checked, started or answered.
void api_client_message (api_t *self, zsock_t *socket);
//  Frees a request's context (its frames, arena, owner's count). Nothing on NULL.
void api_ctx_destroy (api_ctx_t **ctx_p);
//  A job of an in-process actor on the job socket: checked, then walked as a client's.
void api_job_message (api_t *self);

//  routing over the operation table (api_route.c)
//  A job came back from an actor: on to its next stage, or answered.
void api_actor_reply (api_t *self, zsock_t *actor);
//  Lists the segments for the index reads (KVP_OP_MAP_SEGMENTS).
void api_map_segments (api_t *self);
//  A same-machine client process died (owners_reap's callback; arg: the api).
void api_owner_gone (void *arg, const owner_t *owner);
//  Starts a job: a reset waits for the writes in flight, a write waits for the resets.
void api_start (api_t *self, kvp_job_t *job);

//  replies out (api_reply.c)
//  Adds the api's own counters to the stats the actors filled.
void api_complete_stats (api_t *self, kvp_stats_t *stats);
//  Answers a finished client job (its values, or copies from the index) and destroys it.
void api_reply (api_t *self, kvp_job_t **job_p, zmq_msg_t *copies);
//  Answers a request with a request-level error and its reason.
void api_reply_error (api_t *self, api_ctx_t *ctx, uint64_t request_id, int op, int status,
                      const char *reason);
//  Sends an in-process actor its job back. Returns 0 or -1.
int api_reply_job (api_t *self, zframe_t **routing_id_p, kvp_job_t *job);
//  The transport a request came over (tcp, ipc, inproc), for the byte counters.
kvp_transport_t api_transport (const api_ctx_t *ctx);
//  Drops the pins a GET took on objects that will not be sent.
void api_unpin_items (kvp_job_t *job);

//  the actor (api.c)
//  Whether values are hashed as they arrive (a cluster node's, --verify-checksums).
bool api_checksums_wanted (const kvp_config_t *config);

#endif
