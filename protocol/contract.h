/*  contract.h - what the client library and the node agree on beyond the wire format
    (protocol/kvpool.proto): how often same-machine readers report their reads, the host's
    identity, the owner names of same-machine processes, the replica limit. (Their leases
    are in the read index itself: shm/shm_index.h.)

    Both sides include this; it includes nothing of either.
*/
#ifndef KVP_CONTRACT_H_INCLUDED
#define KVP_CONTRACT_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  The protocol version of kvpool.proto this code speaks, and the node's default endpoints
//  (include/kvpool.h repeats them for applications, as KVPOOL_*; the self test checks that
//  the two agree).
#define KVP_PROTOCOL_VERSION 1
//  The release (kvpoold's /health and kvpool_info metric; the Python package's __version__).
#define KVP_VERSION "0.1.0"
#define KVP_DEFAULT_ENDPOINT "tcp://127.0.0.1:50051"
#define KVP_DEFAULT_IPC_ENDPOINT "ipc://@kvpool-50051"
#define KVP_DEFAULT_ADMIN_ENDPOINT "tcp://127.0.0.1:50052"
#define KVP_DEFAULT_MASTER_ENDPOINT "tcp://127.0.0.1:50060"

//  A same-machine client reports how many values it read from the read index itself (a
//  TOUCH's `reads`, counted in the node's stats) at most this often, and at close.
#define KVP_READS_REPORT_MS 1000

//  Replicas one key can have (KVPOOL_MAX_REPLICAS in include/kvpool.h is the same number).
#define KVP_MAX_REPLICAS 8

//  Reads the host's boot id (/proc/sys/kernel/random/boot_id, whitespace trimmed) into buf.
//  Two processes with the same boot id share the machine's memory. Returns 0, or -1 with
//  buf = "" when it cannot be read.
int kvp_boot_id (char *buf, size_t size);

//  The default host id (kvpoold --host-id): the boot id and the network namespace,
//  "<boot id>-net<inode of /proc/self/ns/net>" (the boot id alone when the namespace
//  cannot be read). Containers and network namespaces on one machine share its boot id, so
//  the boot id alone named their nodes alike (docs/cluster.md, "Identity"). Processes in one
//  namespace of one boot get one id: a node and its same-machine clients agree, and a
//  client in another namespace (another container) is not taken for a same-machine one
//  (it could not reach the node's abstract ipc endpoint either: those are per namespace).
//  Returns 0, or -1 with buf = "" when the boot id cannot be read.
int kvp_host_id (char *buf, size_t size);

//  The name the node gives a same-machine client process that owns reservations, pins or
//  segments: "pid:<pid>/<id>" (Segment.owner in SEGMENTS replies). kvp_owner_name_parse
//  returns 0 and the id for such a name, -1 for any other name.
void kvp_owner_name (char *buf, size_t size, int pid, uint64_t id);
int kvp_owner_name_parse (const char *name, uint64_t *id);

//  Self test.
void kvp_contract_test (bool verbose);

#endif
