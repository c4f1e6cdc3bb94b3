/*  rdma_regs.h - a table of registered memory regions: [addr, addr + len) -> segment id, keys.

    The RDMA transport (rdma/rdma.h) keeps two of these: one for this node's segments, filled as
    the verbs layer registers them with ibv_reg_mr (lkey for the local side of a work request),
    and one per connection for the peer's segments, filled from the peer's connection data
    (rkey and the remote address of a work request). The work-request planner
    (rdma/rdma_plan.h) looks addresses up here so that no work request crosses the end of a
    region: a memory region's keys are only good for bytes inside it.

    Regions never overlap and segment ids are unique within a table; add refuses both. Lookups
    by address are a binary search over the regions in address order; lookups by id a linear
    scan (a node has a handful of segments, each large). At most KVP_RDMA_REGS_MAX regions.

    Pure bookkeeping: no verbs calls (handle carries the verbs layer's struct ibv_mr *, which
    this table never touches). Threads: not thread-safe; one thread uses a table.
*/
#ifndef KVP_RDMA_REGS_H_INCLUDED
#define KVP_RDMA_REGS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  Most regions one table holds (and one peer may announce, rdma/rdma_wire.h).
#define KVP_RDMA_REGS_MAX 4096

//  One registered region.
typedef struct {
    uint32_t id;   //  segment id, unique in the table
    uint64_t addr; //  first byte (a virtual address: this process's, or the peer's)
    uint64_t len;  //  > 0; addr + len does not overflow
    uint32_t lkey; //  local key (0 in a table of a peer's regions)
    uint32_t rkey; //  remote key: what the peer puts in its work requests
    void *handle;  //  the verbs layer's memory region (NULL in a peer's table)
} kvp_rdma_region_t;

typedef struct _kvp_rdma_regs_t kvp_rdma_regs_t;

//  Creates an empty table. Returns NULL when out of memory. Caller owns the return value and
//  must destroy it.
kvp_rdma_regs_t *kvp_rdma_regs_new (void);

//  Frees the table (not what the handles point at). Does nothing on NULL; sets *self_p to NULL.
void kvp_rdma_regs_destroy (kvp_rdma_regs_t **self_p);

//  Adds a copy of region. Returns 0, or -1 with *reason_p (may be NULL) set to a static reason:
//  zero length, a range that wraps past 2^64, an id already in the table, a range overlapping
//  another region, a full table, out of memory.
int kvp_rdma_regs_add (kvp_rdma_regs_t *self, const kvp_rdma_region_t *region,
                       const char **reason_p);

//  Removes the region with segment id; copies it to *removed (may be NULL) first, so the
//  caller can release its handle. Returns 0, or -1 when there is no such id.
int kvp_rdma_regs_remove (kvp_rdma_regs_t *self, uint32_t id, kvp_rdma_region_t *removed);

//  The region holding all of [addr, addr + len), or NULL: none holds addr, or the range runs
//  past the end of the region that holds addr (ranges crossing a region end are refused even
//  when the next region starts right there: one work request has one key). With len 0, the
//  region holding the byte at addr. The pointer is good until the next add or remove.
const kvp_rdma_region_t *kvp_rdma_regs_find (const kvp_rdma_regs_t *self, uint64_t addr,
                                             uint64_t len);

//  The region with segment id, or NULL. Good until the next add or remove.
const kvp_rdma_region_t *kvp_rdma_regs_by_id (const kvp_rdma_regs_t *self, uint32_t id);

//  Number of regions, and the index-th in address order (NULL past the end).
size_t kvp_rdma_regs_count (const kvp_rdma_regs_t *self);
const kvp_rdma_region_t *kvp_rdma_regs_at (const kvp_rdma_regs_t *self, size_t index);

void kvp_rdma_regs_test (bool verbose);

#endif
