/*  data_plane.h - values moved between nodes over their data planes, by transfer workers.

    A node's data plane is the client protocol (kvpool.proto) on its --peer-endpoint, about
    that node's own objects. A data_plane_t moves values to and from such endpoints for the
    cluster actor: reads (GET, whole or a range) and writes (UPSERT). It runs them on a
    transfer_pool (transfer_pool.h) of its own: a batch of transfers is cut into tasks, one
    request to one node each, spread over the workers' deques, and an idle worker steals from
    a busy one. Each worker keeps its own persistent DEALER to each node it has talked to
    (never a socket per transfer), so the stripes of one large value, given to different
    workers, travel over different TCP connections in parallel.

    A task sends its request and waits for the answer up to the data plane's timeout; a node
    that does not answer in time has that worker's connection closed (what was queued for it
    goes, and libzmq stops reconnecting to a port another process may take) and its transfers
    fail with KVPOOL_TRANSFER_FAIL, answered = false. A read is accepted only with exactly the
    bytes expected: a range exactly its length, a whole value exactly the size the node
    reported; anything else fails the transfer rather than pass on wrong bytes.

    Checksums (transfer/value_checksum.h): a write sends its value's checksum with it (one it
    was given, or one taken while the bytes are copied into the request), and the node
    verifies what it received against it. A read takes the checksum the node sent, and a
    whole value that does not match it fails (corrupt) on the worker that received it;
    ranges (stripes) are left for the caller to verify once assembled.

    Threads: data_plane_run may be called from any thread; the done callback runs on a worker
    thread (or on the caller's, for an empty batch). The transfers, their keys, sources and
    destinations belong to the caller and must stay put until done runs; workers write only
    the out fields of their own transfers and their destinations.
*/
#ifndef DATA_PLANE_H_INCLUDED
#define DATA_PLANE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

typedef struct _data_plane_t data_plane_t;

typedef enum {
    DATA_PLANE_READ = 1, //  GET key (a range when length > 0) from the node
    DATA_PLANE_WRITE,    //  UPSERT key = src[0 .. size) at the node
    //  A value in stripes: reserved, written in parts (in parallel), then committed or given
    //  up. The reservation is the node's own (PUT_START on its data plane).
    DATA_PLANE_RESERVE, //  PUT_START key, size bytes
    DATA_PLANE_PART,    //  PUT_PART key: src[0 .. size) at offset
    DATA_PLANE_END,     //  PUT_END key
    DATA_PLANE_REVOKE,  //  PUT_REVOKE key
} data_plane_kind_t;

typedef struct {
    //  in
    data_plane_kind_t kind;
    const char *endpoint;  //  the node's data plane
    const char *curve_key; //  its CURVE public key (Z85); NULL or "": the plane's own
    const char *key;
    size_t key_len;
    uint64_t offset, length; //  READ: a range (length 0: the whole value); PART: offset
    void *dst;               //  READ of a range: its length bytes land here
    const void *src;         //  WRITE, PART: the bytes
    uint64_t size;           //  WRITE, PART: their size; RESERVE: the value's; a whole READ:
                             //  the value's as far as known (0: unknown; needed for RDMA)
    //  in and out: the value's XXH3-64 (transfer/value_checksum.h; 0: unknown). WRITE: sent
    //  with it (0: taken as the bytes are copied into the request, with verification on);
    //  END: the whole value's, sent with it. READ, out: the node's for the whole value.
    uint64_t checksum;
    //  in and out: the value's version. READ: only this version is read (0: any; another is
    //  OBJECT_NOT_FOUND), out: the version read. WRITE, RESERVE: the version the value takes
    //  (the master's, from PLACE).
    uint64_t version;
    //  out
    bool corrupt;    //  READ: the bytes did not match their checksum (status TRANSFER_FAIL)
    int status;      //  KVPOOL_OK, the node's status for the key, or KVPOOL_TRANSFER_FAIL
    bool answered;   //  the node answered in time (false: it may be gone)
    bool rdma;       //  the bytes moved by RDMA
    zmq_msg_t frame; //  a whole READ, OK: the value as received (the caller closes it)
} data_plane_xfer_t;

//  Put options that every WRITE of one run carries.
typedef struct {
    bool soft_pin;
    uint64_t soft_pin_ttl_ms;
    bool hard_pin;
} data_plane_put_t;

typedef void (data_plane_done_fn) (data_plane_xfer_t *xfers, size_t count, void *arg);

//  Starts workers (>= 1) transfer workers. timeout_ms: how long a node has to answer one
//  request. rdma_device: NULL for tcp alone; else the device ("": the first; rdma/rdma.h) by which
//  values move wherever the other node serves RDMA (see RDMA below). Returns NULL on failure.
//  Caller owns the return value.
data_plane_t *data_plane_new (int workers, int timeout_ms, const char *rdma_device);

//  Connects with CURVE from now on, with curve's certificate (infra/curve.h); before the
//  first run. curve must outlive the plane.
struct _kvp_curve_t;
void data_plane_set_curve (data_plane_t *self, const struct _kvp_curve_t *curve);

//  Finishes the transfers under way, stops the workers, closes their connections. Does nothing
//  on NULL; sets *self_p to NULL.
void data_plane_destroy (data_plane_t **self_p);

//  Runs xfers[0 .. count) on the workers. Transfers to one endpoint of one kind (and, for
//  reads, all ranged or all whole) are sent together, up to task_bytes of values or 256 keys
//  a request; every range of task_bytes or more is a request of its own. put may be NULL.
//  done (xfers, count, arg) runs once all have ended. Every transfer ends with a status.
void data_plane_run (data_plane_t *self, data_plane_xfer_t *xfers, size_t count,
                     const data_plane_put_t *put, uint64_t task_bytes, data_plane_done_fn *done,
                     void *arg);

//  RDMA. With a device, each worker opens it on first use and makes, per node, a connection
//  (RDMA_CONNECT over its link to that node: queue pairs on both sides). Then reads, writes
//  and parts to that node carry no value frames: the worker registers the bytes on its side
//  (a read of a whole value lands in a buffer of the size the caller gave, which becomes the
//  frame) and the node moves them by one-sided RDMA before it answers (actors/rdma_serve.h).
//  A node that refuses the connection (it serves no RDMA) is asked again after a while;
//  meanwhile, and for whole reads of unknown size, tcp. A connection whose request timed out
//  is destroyed with its queue pairs before the registered memory is let go.

//  Counters: requests sent, requests that timed out, tasks stolen by an idle worker, values
//  and stripes moved by RDMA.
uint64_t data_plane_requests (data_plane_t *self);
uint64_t data_plane_timeouts (data_plane_t *self);
uint64_t data_plane_stolen (data_plane_t *self);
uint64_t data_plane_rdma_transfers (data_plane_t *self);

//  Self test: a fake node on inproc answers reads and writes, stays silent, or lies.
void data_plane_test (bool verbose);

#endif
