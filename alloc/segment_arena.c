/*  segment_arena.c - space inside one segment, managed by a dedicated jemalloc arena.

    How it works
    ------------
    Each segment_arena_t owns a jemalloc arena created with custom extent hooks. The hooks
    hand jemalloc pieces of a *shadow* range: private, never-written address space of the
    segment's size (MAP_NORESERVE, so it costs nothing until touched, and jemalloc does not
    write into the extents it hands out for allocations). An allocation's offset in the real
    segment is its address minus the shadow's base. jemalloc never sees segment memory, so no
    client write into a segment can corrupt allocator state.

    The hook allocator is a bump pointer over the shadow. jemalloc is told it may never give
    an extent back (the dalloc, decommit and purge hooks are NULL, i.e. opt-out; split and
    merge always succeed, the shadow being one mapping), so every extent it has ever taken
    stays in the arena, and unused ones sit in its "retained" set where any request can split
    them. Reuse therefore happens inside jemalloc, with its address-ordered first fit and
    eager coalescing, and the hook only ever hands out fresh shadow. When the shadow is used
    up the hook returns NULL; jemalloc then fails the mallocx and we return -1.

    Three jemalloc behaviours shape the rest:
    - Metadata. An arena created with custom hooks allocates its own metadata (the arena
      struct, the edata_t of every extent) through the same alloc hook, in blocks of a
      multiple of 2 MiB aligned to 2 MiB with *zero and *commit set (base.c: base_map). Data
      extents are only ever asked for with page alignment (segment_arena_alloc never asks for
      more), so the hook sends such requests to separate private mappings instead of the
      shadow. Metadata then costs no segment offsets; segment_arena_new checks that creating
      the arena consumed no shadow, which catches a jemalloc that changed this.
    - Growth. With opt.retain (the default on Linux) jemalloc grows an arena in exponentially
      larger requests and never merges extents across two hook allocations, so a block cannot
      straddle the boundary between two grows; with 4 MiB blocks the tails of the early small
      grows would waste a quarter of the space. segment_arena_new therefore claims (almost)
      the whole shadow up front in a few large allocations, frees them and purges, so the
      arena starts with a few large retained extents and no later grow is needed. A capacity
      that is itself a jemalloc size class (2^k, or 1.25, 1.5, 1.75 times it) is claimed in
      one piece and fills exactly as far as the padding allows (measured for 8 MiB .. 1.75
      GiB); any other capacity takes a few pieces, each boundary stranding less than one
      block (measured: at most 1-3 blocks short over random capacities).
    - Dirty extents. A free puts the extent in the arena's dirty cache (decay is -1, so time
      never purges it). Allocations look there first, but a dirty extent is not split for a
      request 64 times smaller (opt.lg_extent_max_active_fit), and dirty extents never merge
      with retained neighbours; blocks placed into those pieces fragment the space (measured:
      after random frees and refills, a 1 MiB refill of the emptied arena reached only 85%).
      So the first allocation after any frees purges the arena: with our hooks (every purge
      hook is NULL) a purge makes no system call, it only moves the dirty extents into the
      retained set, where they coalesce. One purge covers a whole batch of frees.

    Values larger than jemalloc's largest small size class are allocated page aligned: the
    cache-oblivious random offset inside the first page buys nothing for a shadow that is never
    read, and page-aligned offsets suit direct I/O and RDMA. jemalloc still adds one page of
    padding to every large extent while opt.cache_oblivious is on; jemalloc 5.3.0 (Debian 12)
    has no way to turn it off at run time (the malloc_conf key came later), and that page is
    why 16 KiB values use at most 80% of a segment and 64 KiB values 94%.

    Threads: an arena is used by one thread at a time (the allocator actor's). Every call
    passes MALLOCX_TCACHE_NONE, so no offset is ever cached in a thread cache, and jemalloc's
    own locks make calls on different arenas from different threads safe.
*/
#include "alloc/segment_arena.h"

#include <assert.h>
#include <errno.h>
#include <jemalloc/jemalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

//  jemalloc's HUGEPAGE on x86-64 and most other targets: base (metadata) blocks are
//  requested with this alignment and data extents never are.
#define S_META_ALIGN ((size_t) 2 << 20)
//  Metadata blocks grow geometrically, so 64 cover far more than any segment needs.
#define S_META_MAX 64
//  Each up-front claim takes at least three quarters of what is left.
#define S_CLAIM_MAX 64

typedef struct {
    void *addr;
    size_t size;
} s_block_t;

struct _segment_arena_t {
    //  First member: jemalloc passes &hooks back to every hook, which finds self from it.
    extent_hooks_t hooks;
    unsigned ind;        //  jemalloc arena index
    bool have_arena;     //  arenas.create succeeded
    int flags;           //  MALLOCX_ARENA (ind) | MALLOCX_TCACHE_NONE
    int flags_large;     //  the same, page aligned
    char *shadow;        //  base of the shadow range
    size_t capacity;     //  size given to new
    size_t limit;        //  capacity rounded down to pages: offsets handed out stay below it
    size_t bump;         //  shadow offset not yet handed to jemalloc
    size_t page;         //  jemalloc's page size
    size_t small_max;    //  largest small size class
    size_t large_pad;    //  bytes jemalloc adds to each large extent
    size_t allocated;    //  usable bytes of live allocations
    size_t count;        //  live allocations
    bool maybe_dirty;    //  frees since the last purge
    size_t purge_mib[3]; //  "arena.<ind>.purge"
    size_t purge_miblen;
    s_block_t meta[S_META_MAX]; //  metadata blocks mapped outside the shadow
    size_t meta_count;
    size_t meta_bytes;
    size_t purges; //  for the self test
};

static bool s_trace = false; //  self test: log every hook call

//  --------------------------------------------------------------------------
//  Extent hooks. jemalloc calls them with its arena locks held: they must not allocate
//  through jemalloc (they only mmap and do arithmetic).

static void *
s_meta_alloc (segment_arena_t *self, size_t size, size_t alignment)
{
    if (self->meta_count == S_META_MAX || size > SIZE_MAX - alignment)
        return NULL;
    size_t map_size = size + alignment;
    char *map =
        (char *) mmap (NULL, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return NULL;
    //  Over-map and trim to get the alignment.
    char *addr = (char *) (((uintptr_t) map + alignment - 1) & ~(uintptr_t) (alignment - 1));
    size_t head = (size_t) (addr - map);
    size_t tail = map_size - head - size;
    if (head)
        munmap (map, head);
    if (tail)
        munmap (addr + size, tail);
    self->meta[self->meta_count].addr = addr;
    self->meta[self->meta_count].size = size;
    self->meta_count++;
    self->meta_bytes += size;
    return addr;
}

static void *
s_hook_alloc (extent_hooks_t *hooks, void *new_addr, size_t size, size_t alignment, bool *zero,
              bool *commit, unsigned arena_ind)
{
    segment_arena_t *self = (segment_arena_t *) hooks;
    void *result = NULL;
    //  new_addr asks to extend an extent in place, which only rallocx does; refusing is
    //  always allowed.
    if (new_addr == NULL) {
        if (alignment >= S_META_ALIGN && *zero && *commit)
            result = s_meta_alloc (self, size, alignment);
        else {
            uintptr_t start = (uintptr_t) self->shadow + self->bump;
            uintptr_t end = (uintptr_t) self->shadow + self->limit;
            uintptr_t addr = (start + alignment - 1) & ~(uintptr_t) (alignment - 1);
            //  The alignment gap, if any, is never handed out; only metadata asks for more
            //  than a page and it does not come here.
            if (addr >= start && addr <= end && size <= end - addr) {
                self->bump = (size_t) (addr + size - (uintptr_t) self->shadow);
                result = (void *) addr;
            }
        }
    }
    if (s_trace) {
        uintptr_t at = (uintptr_t) result, shadow = (uintptr_t) self->shadow;
        bool in_shadow = result && at >= shadow && at < shadow + self->limit;
        fprintf (stderr, "    hook alloc arena %u size %zu align %zu zero %d commit %d -> %s",
                 arena_ind, size, alignment, *zero, *commit,
                 !result     ? "failed\n"
                 : in_shadow ? "shadow offset "
                             : "metadata\n");
        if (in_shadow)
            fprintf (stderr, "%zu\n", (size_t) (at - shadow));
    }
    if (result) {
        //  Fresh shadow was never written, and fresh mappings are zero; both are committed
        //  in the overcommit sense.
        *zero = true;
        *commit = true;
    }
    return result;
}

static bool
s_hook_commit (extent_hooks_t *hooks, void *addr, size_t size, size_t offset, size_t length,
               unsigned arena_ind)
{
    (void) hooks, (void) addr, (void) size, (void) offset, (void) length, (void) arena_ind;
    //  Nothing is ever decommitted (the decommit hook is NULL), so committing always succeeds.
    return false;
}

static bool
s_hook_split (extent_hooks_t *hooks, void *addr, size_t size, size_t size_a, size_t size_b,
              bool committed, unsigned arena_ind)
{
    (void) hooks, (void) addr, (void) size, (void) size_a, (void) size_b, (void) committed,
        (void) arena_ind;
    //  The shadow is one mapping: any split or merge of it is bookkeeping only.
    return false;
}

static bool
s_hook_merge (extent_hooks_t *hooks, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
              bool committed, unsigned arena_ind)
{
    (void) hooks, (void) addr_a, (void) size_a, (void) addr_b, (void) size_b, (void) committed,
        (void) arena_ind;
    return false;
}

static const extent_hooks_t s_hooks = {
    .alloc = s_hook_alloc,
    .dalloc = NULL,  //  opt out: jemalloc retains every extent it was given
    .destroy = NULL, //  the shadow is unmapped as a whole on destroy
    .commit = s_hook_commit,
    .decommit = NULL, //  opt out
    //  Opt out of purging too: jemalloc never writes into the shadow, so there is nothing
    //  to drop, and a declined purge costs no madvise (measured: it halved the cost of a
    //  free and an allocation). jemalloc then records the extent as not zeroed, which is
    //  true enough: we never ask for zeroed memory.
    .purge_lazy = NULL,
    .purge_forced = NULL,
    .split = s_hook_split,
    .merge = s_hook_merge,
};

//  --------------------------------------------------------------------------

static int
s_arena_ctl_ssize (unsigned ind, const char *leaf, ssize_t value)
{
    char name[64];
    snprintf (name, sizeof name, "arena.%u.%s", ind, leaf);
    return mallctl (name, NULL, NULL, &value, sizeof value);
}

static void
s_purge (segment_arena_t *self)
{
    mallctlbymib (self->purge_mib, self->purge_miblen, NULL, NULL, NULL, 0);
    self->maybe_dirty = false;
    self->purges++;
}

//  Largest large size class not above x (x above the largest small class), or 0.
static size_t
s_class_floor (segment_arena_t *self, size_t x)
{
    int lg = 63 - __builtin_clzll ((unsigned long long) x);
    //  jemalloc has four size classes per doubling.
    size_t spacing = (size_t) 1 << (lg - 2);
    size_t c = x & ~(spacing - 1);
    //  Guard against a build with another class layout.
    while (c > self->small_max && nallocx (c, 0) > x)
        c -= self->page;
    return c > self->small_max ? c : 0;
}

//  Takes nearly all of the shadow into the arena in a few large extents, then gives them
//  back to the retained set (see the file comment: growth).
static void
s_claim_shadow (segment_arena_t *self)
{
    void *held[S_CLAIM_MAX];
    size_t held_count = 0;
    while (held_count < S_CLAIM_MAX) {
        size_t room = self->limit - self->bump;
        if (room <= self->small_max + self->large_pad + self->page)
            break;
        size_t want = s_class_floor (self, room - self->large_pad);
        if (want == 0)
            break;
        //  Either grows the arena from the shadow or, when an earlier grow was larger than
        //  asked, takes what that left retained; both bring the end of the shadow closer.
        void *ptr = mallocx (want, self->flags);
        if (!ptr)
            break;
        held[held_count++] = ptr;
    }
    for (size_t i = 0; i < held_count; i++)
        dallocx (held[i], self->flags);
    s_purge (self);
}

static size_t
s_ctl_size (const char *name, size_t fallback)
{
    size_t value = 0;
    size_t size = sizeof value;
    if (mallctl (name, &value, &size, NULL, 0) != 0)
        return fallback;
    return value;
}

segment_arena_t *
segment_arena_new (size_t size)
{
    size_t page = s_ctl_size ("arenas.page", (size_t) sysconf (_SC_PAGESIZE));
    if (size < page) {
        errno = EINVAL;
        return NULL;
    }
    segment_arena_t *self = (segment_arena_t *) calloc (1, sizeof (segment_arena_t));
    if (!self) {
        errno = ENOMEM;
        return NULL;
    }
    self->hooks = s_hooks;
    self->page = page;
    self->capacity = size;
    self->limit = size & ~(page - 1);
    self->shadow = (char *) mmap (NULL, self->limit, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (self->shadow == MAP_FAILED) {
        free (self);
        return NULL;
    }
#ifdef MADV_NOHUGEPAGE
    //  Should anything touch a shadow page, let it cost a page and not 2 MiB.
    madvise (self->shadow, self->limit, MADV_NOHUGEPAGE);
#endif

    unsigned nbins = 0;
    size_t nbins_size = sizeof nbins;
    if (mallctl ("arenas.nbins", &nbins, &nbins_size, NULL, 0) == 0 && nbins > 0) {
        char name[64];
        snprintf (name, sizeof name, "arenas.bin.%u.size", nbins - 1);
        self->small_max = s_ctl_size (name, 14336);
    }
    else
        self->small_max = 14336;
    bool cache_oblivious = true;
    size_t bool_size = sizeof cache_oblivious;
    if (mallctl ("opt.cache_oblivious", &cache_oblivious, &bool_size, NULL, 0) != 0)
        cache_oblivious = true; //  older jemalloc: assume the pad is there
    self->large_pad = cache_oblivious ? page : 0;

    extent_hooks_t *hooks = &self->hooks;
    size_t ind_size = sizeof self->ind;
    int rc = mallctl ("arenas.create", &self->ind, &ind_size, &hooks, sizeof hooks);
    if (rc != 0) {
        segment_arena_destroy (&self);
        errno = rc;
        return NULL;
    }
    self->have_arena = true;
    if (self->bump != 0) {
        //  Creating the arena only allocates metadata; if that landed in the shadow, this
        //  jemalloc asks for metadata differently and offsets would be lost to it.
        fprintf (stderr, "segment_arena: jemalloc metadata allocated in the shadow range; "
                         "unsupported jemalloc version\n");
        segment_arena_destroy (&self);
        errno = ENOTSUP;
        return NULL;
    }
    self->flags = MALLOCX_ARENA (self->ind) | MALLOCX_TCACHE_NONE;
    self->flags_large = self->flags | MALLOCX_ALIGN (page);
    self->purge_miblen = sizeof self->purge_mib / sizeof self->purge_mib[0];
    if (mallctlnametomib ("arena.0.purge", self->purge_mib, &self->purge_miblen) != 0
        || s_arena_ctl_ssize (self->ind, "dirty_decay_ms", -1) != 0
        || s_arena_ctl_ssize (self->ind, "muzzy_decay_ms", -1) != 0) {
        segment_arena_destroy (&self);
        errno = EINVAL;
        return NULL;
    }
    self->purge_mib[1] = self->ind;
    s_claim_shadow (self);
    return self;
}

void
segment_arena_destroy (segment_arena_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    segment_arena_t *self = *self_p;
    if (self->have_arena) {
        char name[64];
        snprintf (name, sizeof name, "arena.%u.destroy", self->ind);
        int rc = mallctl (name, NULL, NULL, NULL, 0);
        if (rc != 0) {
            //  jemalloc still points at the hooks and the shadow: leaking them is the only
            //  safe choice. It refuses only while a thread is bound to the arena, which
            //  this module never does.
            fprintf (stderr, "segment_arena: %s failed (%s); arena leaked\n", name, strerror (rc));
            *self_p = NULL;
            return;
        }
    }
    for (size_t i = 0; i < self->meta_count; i++)
        munmap (self->meta[i].addr, self->meta[i].size);
    munmap (self->shadow, self->limit);
    free (self);
    *self_p = NULL;
}

int
segment_arena_alloc (segment_arena_t *self, size_t size, uint64_t *offset_p)
{
    assert (self);
    assert (offset_p);
    if (size == 0 || size > self->limit) {
        errno = size ? ENOMEM : EINVAL;
        return -1;
    }
    int flags = size > self->small_max ? self->flags_large : self->flags;
    //  Frees since the last call left extents in the dirty cache; move them to the retained
    //  set first (see the file comment: dirty extents). One purge covers a batch of frees.
    if (self->maybe_dirty)
        s_purge (self);
    void *ptr = mallocx (size, flags);
    if (!ptr) {
        errno = ENOMEM;
        return -1;
    }
    char *start = (char *) ptr;
    size_t usable = sallocx (ptr, 0);
    if (start < self->shadow || start + usable > self->shadow + self->limit) {
        //  Cannot happen while the hooks are the only source of this arena's extents.
        fprintf (stderr, "segment_arena: jemalloc returned memory outside the shadow\n");
        dallocx (ptr, self->flags);
        errno = EFAULT;
        return -1;
    }
    self->allocated += usable;
    self->count++;
    *offset_p = (uint64_t) (start - self->shadow);
    return 0;
}

void
segment_arena_free (segment_arena_t *self, uint64_t offset)
{
    assert (self);
    assert (offset < self->limit);
    void *ptr = self->shadow + offset;
    size_t usable = sallocx (ptr, 0);
    assert (self->count > 0 && self->allocated >= usable);
    sdallocx (ptr, usable, self->flags);
    self->allocated -= usable;
    self->count--;
    self->maybe_dirty = true;
}

size_t
segment_arena_capacity (segment_arena_t *self)
{
    assert (self);
    return self->capacity;
}

size_t
segment_arena_allocated (segment_arena_t *self)
{
    assert (self);
    return self->allocated;
}

size_t
segment_arena_count (segment_arena_t *self)
{
    assert (self);
    return self->count;
}

//  --------------------------------------------------------------------------
//  Self test

#define S_KIB ((size_t) 1024)
#define S_MIB ((size_t) 1024 * 1024)

typedef struct {
    uint64_t offset;
    size_t size;   //  requested
    size_t usable; //  jemalloc's usable size
} s_rec_t;

typedef struct {
    s_rec_t *recs;
    size_t count;
    size_t limit;
    size_t requested; //  sum of requested sizes
} s_set_t;

static uint64_t s_rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t
s_rand (void)
{
    //  xorshift64*: deterministic, so a failure reproduces.
    s_rng_state ^= s_rng_state >> 12;
    s_rng_state ^= s_rng_state << 25;
    s_rng_state ^= s_rng_state >> 27;
    return s_rng_state * 2685821657736338717ull;
}

static void
s_set_init (s_set_t *set, size_t limit)
{
    set->recs = (s_rec_t *) calloc (limit, sizeof (s_rec_t));
    assert (set->recs);
    set->count = 0;
    set->limit = limit;
    set->requested = 0;
}

static int
s_set_alloc (s_set_t *set, segment_arena_t *arena, size_t size)
{
    uint64_t offset = UINT64_MAX;
    size_t before = segment_arena_allocated (arena);
    if (segment_arena_alloc (arena, size, &offset) == -1)
        return -1;
    assert (set->count < set->limit);
    size_t usable = segment_arena_allocated (arena) - before;
    assert (usable >= size);
    assert (offset < segment_arena_capacity (arena));
    assert (offset + usable <= segment_arena_capacity (arena));
    if (size > arena->small_max)
        assert (offset % arena->page == 0); //  large values start on a page
    set->recs[set->count++] = (s_rec_t){offset, size, usable};
    set->requested += size;
    return 0;
}

static void
s_set_free_at (s_set_t *set, segment_arena_t *arena, size_t index)
{
    assert (index < set->count);
    segment_arena_free (arena, set->recs[index].offset);
    set->requested -= set->recs[index].size;
    set->recs[index] = set->recs[--set->count];
}

//  Frees everything, in a random order.
static void
s_set_free_all (s_set_t *set, segment_arena_t *arena)
{
    while (set->count)
        s_set_free_at (set, arena, (size_t) (s_rand () % set->count));
    assert (segment_arena_count (arena) == 0);
    assert (segment_arena_allocated (arena) == 0);
}

static int
s_rec_compare (const void *a, const void *b)
{
    uint64_t x = ((const s_rec_t *) a)->offset;
    uint64_t y = ((const s_rec_t *) b)->offset;
    return x < y ? -1 : x > y;
}

//  Asserts the set's ranges (offset, usable) are inside the arena and do not overlap;
//  returns the sum of their usable sizes.
static size_t
s_set_check_ranges (s_set_t *set, segment_arena_t *arena)
{
    s_rec_t *sorted = (s_rec_t *) malloc ((set->count + 1) * sizeof (s_rec_t));
    assert (sorted);
    memcpy (sorted, set->recs, set->count * sizeof (s_rec_t));
    qsort (sorted, set->count, sizeof (s_rec_t), s_rec_compare);
    size_t usable = 0;
    for (size_t i = 0; i < set->count; i++) {
        assert (sorted[i].offset + sorted[i].usable <= segment_arena_capacity (arena));
        if (i > 0)
            assert (sorted[i - 1].offset + sorted[i - 1].usable <= sorted[i].offset);
        usable += sorted[i].usable;
    }
    free (sorted);
    return usable;
}

//  The same, and the arena's counters agree with the set.
static void
s_set_check (s_set_t *set, segment_arena_t *arena)
{
    size_t usable = s_set_check_ranges (set, arena);
    assert (segment_arena_count (arena) == set->count);
    assert (segment_arena_allocated (arena) == usable);
}

static double
s_util (s_set_t *set, segment_arena_t *arena)
{
    return (double) set->requested / (double) segment_arena_capacity (arena);
}

//  Allocates size_fn's sizes until one fails; returns the utilisation at that point.
static double
s_fill_until_fail (s_set_t *set, segment_arena_t *arena, size_t (*size_fn) (void))
{
    while (s_set_alloc (set, arena, size_fn ()) == 0)
        ;
    return s_util (set, arena);
}

//  Keeps allocating after failures until misses in a row fail, then tops up with the
//  smallest KV size; returns the utilisation reached.
static double
s_fill_saturate (s_set_t *set, segment_arena_t *arena, size_t (*size_fn) (void))
{
    int misses = 0;
    while (misses < 64)
        misses = s_set_alloc (set, arena, size_fn ()) == 0 ? 0 : misses + 1;
    while (s_set_alloc (set, arena, 16 * S_KIB) == 0)
        ;
    return s_util (set, arena);
}

static size_t
s_size_1m (void)
{
    return S_MIB;
}

static size_t
s_size_4m (void)
{
    return 4 * S_MIB;
}

static size_t
s_size_64k (void)
{
    return 64 * S_KIB;
}

static size_t
s_size_16k (void)
{
    return 16 * S_KIB;
}

static size_t
s_size_mixed (void)
{
    //  16 KiB .. 4 MiB, log-uniform, page multiples (KV blocks are), with some odd sizes.
    size_t lg = 14 + (size_t) (s_rand () % 9); //  2^14 .. 2^22
    size_t size = ((size_t) 1 << lg) + (size_t) (s_rand () % ((size_t) 1 << lg));
    if (size > 4 * S_MIB)
        size = 4 * S_MIB;
    return s_rand () % 4 ? (size + 4095) & ~(size_t) 4095 : size;
}

static size_t
s_size_blocks (void)
{
    static const size_t sizes[] = {64 * S_KIB, S_MIB, 4 * S_MIB};
    return sizes[s_rand () % 3];
}

//  Runs a cache over an empty arena: puts of size_fn's sizes, evicting (oldest first, or
//  random victims) until each put fits. Returns the mean utilisation after each put once
//  the cache is full, and in *at_fail_p the mean seen when a put had to evict. Leaves the
//  arena empty.
static double
s_steady_state (segment_arena_t *arena, size_t (*size_fn) (void), bool oldest_first,
                double *at_fail_p)
{
    assert (segment_arena_count (arena) == 0);
    const size_t ring_size = segment_arena_capacity (arena) / (16 * S_KIB) + 1024;
    s_rec_t *ring = (s_rec_t *) calloc (ring_size, sizeof (s_rec_t));
    assert (ring);
    size_t head = 0, live = 0, requested = 0;
    double sum = 0, fail_sum = 0;
    size_t samples = 0, failures = 0;
    const double capacity = (double) segment_arena_capacity (arena);
    const int puts = 3000;
    for (int put = 0; put < puts; put++) {
        size_t size = size_fn ();
        uint64_t offset;
        while (segment_arena_alloc (arena, size, &offset) == -1) {
            assert (live > 0);
            fail_sum += (double) requested / capacity;
            failures++;
            if (!oldest_first) {
                //  Evict a random object: swap it to the head, then evict the head.
                size_t victim = (head + (size_t) (s_rand () % live)) % ring_size;
                s_rec_t tmp = ring[victim];
                ring[victim] = ring[head];
                ring[head] = tmp;
            }
            segment_arena_free (arena, ring[head].offset);
            requested -= ring[head].size;
            head = (head + 1) % ring_size;
            live--;
        }
        assert (live < ring_size);
        assert (offset + size <= segment_arena_capacity (arena));
        ring[(head + live) % ring_size] = (s_rec_t){offset, size, 0};
        live++;
        requested += size;
        if (failures > 0) {
            sum += (double) requested / capacity;
            samples++;
        }
    }
    assert (failures > 0 && samples > 0);
    //  Whatever is left must still be disjoint.
    s_set_t left;
    s_set_init (&left, live + 1);
    while (live) {
        s_rec_t *rec = &ring[head];
        left.recs[left.count++] = *rec;
        head = (head + 1) % ring_size;
        live--;
    }
    for (size_t i = 0; i < left.count; i++)
        left.recs[i].usable = left.recs[i].size;
    s_set_check_ranges (&left, arena);
    for (size_t i = 0; i < left.count; i++)
        segment_arena_free (arena, left.recs[i].offset);
    assert (segment_arena_count (arena) == 0 && segment_arena_allocated (arena) == 0);
    free (left.recs);
    free (ring);
    if (at_fail_p)
        *at_fail_p = fail_sum / (double) failures;
    return sum / (double) samples;
}

static size_t
s_resident_pages (void *addr, size_t size)
{
    size_t pages = (size + 4095) / 4096;
    unsigned char *vec = (unsigned char *) malloc (pages);
    assert (vec);
    int rc = mincore (addr, size, vec);
    assert (rc == 0);
    size_t resident = 0;
    for (size_t i = 0; i < pages; i++)
        resident += vec[i] & 1;
    free (vec);
    return resident;
}

static size_t
s_vm_size_kib (void)
{
    FILE *file = fopen ("/proc/self/status", "r");
    assert (file);
    char line[256];
    size_t kib = 0;
    while (fgets (line, sizeof line, file))
        if (sscanf (line, "VmSize: %zu kB", &kib) == 1)
            break;
    fclose (file);
    return kib;
}

//  jemalloc's own view of the arena's metadata (stats.arenas.<i>.base), if stats are built in.
static size_t
s_jemalloc_base_bytes (segment_arena_t *self)
{
    uint64_t epoch = 1;
    size_t epoch_size = sizeof epoch;
    mallctl ("epoch", &epoch, &epoch_size, &epoch, epoch_size);
    char name[64];
    snprintf (name, sizeof name, "stats.arenas.%u.base", self->ind);
    return s_ctl_size (name, 0);
}

//  The hook allocator on its own, without jemalloc: alignment, metadata routing, exhaustion.
static void
s_test_hooks (void)
{
    segment_arena_t fake;
    memset (&fake, 0, sizeof fake);
    fake.hooks = s_hooks;
    fake.page = 4096;
    fake.limit = 8 * S_MIB;
    fake.shadow = (char *) mmap (NULL, fake.limit, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert (fake.shadow != MAP_FAILED);
    extent_hooks_t *hooks = &fake.hooks;

    bool zero = false, commit = false;
    char *a = (char *) hooks->alloc (hooks, NULL, 3 * 4096, 4096, &zero, &commit, 0);
    assert (a == fake.shadow && zero && commit);
    //  A 64 KiB alignment is honoured inside the shadow.
    zero = false;
    char *b = (char *) hooks->alloc (hooks, NULL, 4096, 64 * S_KIB, &zero, &commit, 0);
    assert (b && (uintptr_t) b % (64 * S_KIB) == 0);
    assert (b >= a + 3 * 4096 && b + 4096 <= fake.shadow + fake.limit);
    //  In-place extension is refused.
    char *c = (char *) hooks->alloc (hooks, b + 4096, 4096, 4096, &zero, &commit, 0);
    assert (c == NULL);
    //  Metadata goes to its own mapping, outside the shadow.
    zero = true;
    commit = true;
    char *meta = (char *) hooks->alloc (hooks, NULL, S_META_ALIGN, S_META_ALIGN, &zero, &commit, 0);
    assert (meta && (uintptr_t) meta % S_META_ALIGN == 0);
    assert (meta + S_META_ALIGN <= fake.shadow || meta >= fake.shadow + fake.limit);
    assert (fake.meta_count == 1 && fake.meta_bytes == S_META_ALIGN);
    meta[0] = 1; //  mapped and writable
    //  Exhaustion fails cleanly, and what still fits is still handed out.
    zero = false;
    commit = false;
    size_t used = (size_t) (b + 4096 - fake.shadow);
    char *big =
        (char *) hooks->alloc (hooks, NULL, fake.limit - used + 4096, 4096, &zero, &commit, 0);
    assert (big == NULL && !zero && !commit);
    char *rest = (char *) hooks->alloc (hooks, NULL, fake.limit - used, 4096, &zero, &commit, 0);
    assert (rest == b + 4096);
    char *none = (char *) hooks->alloc (hooks, NULL, 4096, 4096, &zero, &commit, 0);
    assert (none == NULL);
    munmap (meta, S_META_ALIGN);
    munmap (fake.shadow, fake.limit);
}

void
segment_arena_test (bool verbose)
{
    if (verbose) {
        printf ("\n");
        s_trace = getenv ("SEGMENT_ARENA_TRACE") != NULL;
    }
    s_test_hooks ();

    //  Bad sizes.
    segment_arena_t *bad = segment_arena_new (0);
    assert (bad == NULL);
    bad = segment_arena_new (100);
    assert (bad == NULL);

    //  Round trips on a small arena, including sizes that are not page multiples.
    segment_arena_t *arena = segment_arena_new (64 * S_MIB);
    assert (arena);
    assert (segment_arena_capacity (arena) == 64 * S_MIB);
    assert (segment_arena_count (arena) == 0 && segment_arena_allocated (arena) == 0);
    if (verbose)
        printf (" * arena %u: metadata %zu bytes mapped outside the shadow after create, "
                "shadow claimed %zu of %zu\n",
                arena->ind, arena->meta_bytes, arena->bump, arena->limit);
    assert (arena->bump == arena->limit || arena->limit - arena->bump < 64 * S_KIB);
    s_set_t set;
    s_set_init (&set, 32 * 1024);
    const size_t sizes[] = {1,
                            100,
                            4096,
                            14336,
                            14337,
                            16 * S_KIB,
                            65 * S_KIB,
                            S_MIB,
                            4 * S_MIB,
                            4 * S_MIB + 1,
                            7 * S_MIB + 12345};
    for (size_t round = 0; round < 3; round++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            int rc = s_set_alloc (&set, arena, sizes[i]);
            assert (rc == 0);
        }
        s_set_check (&set, arena);
        assert (segment_arena_count (arena) == sizeof sizes / sizeof sizes[0]);
        s_set_free_all (&set, arena);
    }
    uint64_t offset = 42;
    const size_t impossible[] = {0, 64 * S_MIB, 64 * S_MIB + 1, SIZE_MAX};
    for (size_t i = 0; i < sizeof impossible / sizeof impossible[0]; i++) {
        int rc = segment_arena_alloc (arena, impossible[i], &offset);
        assert (rc == -1 && offset == 42);
    }
    assert (segment_arena_count (arena) == 0);

    //  Two arenas at once do not interfere: filling one leaves the other untouched.
    segment_arena_t *other = segment_arena_new (32 * S_MIB);
    assert (other);
    s_set_t other_set;
    s_set_init (&other_set, 1024);
    for (int i = 0; i < 8; i++) {
        int rc = s_set_alloc (&other_set, other, S_MIB);
        assert (rc == 0);
        rc = s_set_alloc (&set, arena, S_MIB);
        assert (rc == 0);
    }
    s_fill_until_fail (&set, arena, s_size_1m);
    s_set_check (&set, arena);
    s_set_check (&other_set, other);
    assert (segment_arena_count (other) == 8);
    double other_util = s_fill_until_fail (&other_set, other, s_size_1m);
    assert (other_util >= 0.9);
    s_set_check (&other_set, other);
    s_set_free_all (&set, arena);
    segment_arena_destroy (&arena);
    assert (arena == NULL);
    segment_arena_destroy (&arena); //  NULL is fine
    s_set_free_all (&other_set, other);
    int rc = s_set_alloc (&other_set, other, S_MIB);
    assert (rc == 0);
    s_set_free_all (&other_set, other);
    segment_arena_destroy (&other);
    free (other_set.recs);

    //  Utilisation on 256 MiB: uniform blocks, then mixed KV sizes, on one arena, emptied in
    //  between, so every fill also reuses what the previous ones freed.
    const size_t capacity = 256 * S_MIB;
    arena = segment_arena_new (capacity);
    assert (arena);
    free (set.recs);
    s_set_init (&set, capacity / (16 * S_KIB) + 1024);

    double u1 = s_fill_until_fail (&set, arena, s_size_1m);
    size_t count_1m = set.count;
    s_set_check (&set, arena);
    assert (u1 >= 0.9);
    s_set_free_all (&set, arena);
    double u1_again = s_fill_until_fail (&set, arena, s_size_1m);
    assert (set.count == count_1m); //  no space leaked
    s_set_free_all (&set, arena);

    double u4 = s_fill_until_fail (&set, arena, s_size_4m);
    s_set_check (&set, arena);
    assert (u4 >= 0.9);
    s_set_free_all (&set, arena);

    double u64k = s_fill_until_fail (&set, arena, s_size_64k);
    s_set_check (&set, arena);
    assert (u64k >= 0.85);
    size_t meta_64k = arena->meta_bytes;
    size_t base_64k = s_jemalloc_base_bytes (arena);
    s_set_free_all (&set, arena);

    uint64_t seed = s_rng_state;
    double mixed_first = s_fill_until_fail (&set, arena, s_size_mixed);
    double mixed_full = s_fill_saturate (&set, arena, s_size_mixed);
    s_set_check (&set, arena);
    assert (mixed_full >= 0.8);
    s_set_free_all (&set, arena);
    s_rng_state = seed;
    double mixed_again = s_fill_saturate (&set, arena, s_size_mixed);
    assert (mixed_again >= mixed_full - 0.02);
    s_set_free_all (&set, arena);

    double blocks_first = s_fill_until_fail (&set, arena, s_size_blocks);
    double blocks_full = s_fill_saturate (&set, arena, s_size_blocks);
    s_set_check (&set, arena);
    assert (blocks_full >= 0.9);

    s_set_free_all (&set, arena);

    //  A cache in steady state, oldest evicted first (as LRU does when every object is read
    //  about equally) and, harder on fragmentation, random victims.
    double fifo_at_fail = 0, random_at_fail = 0;
    double fifo_mean = s_steady_state (arena, s_size_mixed, true, &fifo_at_fail);
    double random_mean = s_steady_state (arena, s_size_mixed, false, &random_at_fail);
    double blocks_mean = s_steady_state (arena, s_size_blocks, false, NULL);
    assert (fifo_mean >= 0.9);
    assert (random_mean >= 0.75);
    assert (blocks_mean >= 0.85);

    //  After all that, the whole arena is still there.
    s_fill_until_fail (&set, arena, s_size_1m);
    assert (set.count == count_1m);
    s_set_free_all (&set, arena);

    //  Metadata cost with the smallest KV blocks.
    s_fill_until_fail (&set, arena, s_size_16k);
    size_t meta_16k = arena->meta_bytes;
    size_t base_16k = s_jemalloc_base_bytes (arena);
    double u16k = s_util (&set, arena);
    //  Small values too, then check jemalloc wrote nothing into the shadow.
    while (s_set_alloc (&set, arena, 100) == 0)
        ;
    s_set_check (&set, arena);
    size_t shadow_resident = s_resident_pages (arena->shadow, arena->limit);
    assert (shadow_resident == 0);
    s_set_free_all (&set, arena);

    if (verbose) {
        printf (" * utilisation of %zu MiB (requested bytes / capacity):\n", capacity / S_MIB);
        printf ("   1 MiB blocks      %.2f%% (again after free-all %.2f%%)\n", u1 * 100,
                u1_again * 100);
        printf ("   4 MiB blocks      %.2f%%\n", u4 * 100);
        printf ("   64 KiB blocks     %.2f%%\n", u64k * 100);
        printf ("   16 KiB blocks     %.2f%%\n", u16k * 100);
        printf ("   mixed 16K-4M      %.2f%% at first failure, %.2f%% saturated "
                "(%.2f%% again)\n",
                mixed_first * 100, mixed_full * 100, mixed_again * 100);
        printf ("   64K/1M/4M blocks  %.2f%% at first failure, %.2f%% saturated\n",
                blocks_first * 100, blocks_full * 100);
        printf ("   steady state, evicting until each put fits (mean over time / mean at "
                "failed puts):\n"
                "     mixed 16K-4M, oldest first   %.2f%% / %.2f%%\n"
                "     mixed 16K-4M, random victims %.2f%% / %.2f%%\n"
                "     64K/1M/4M, random victims    %.2f%%\n",
                fifo_mean * 100, fifo_at_fail * 100, random_mean * 100, random_at_fail * 100,
                blocks_mean * 100);
        printf ("   (%zu purges)\n", arena->purges);
        printf (" * metadata (outside the shadow): 64 KiB fill %zu KiB mapped / jemalloc base "
                "%zu KiB; 16 KiB fill %zu KiB mapped / %zu KiB\n",
                meta_64k / S_KIB, base_64k / S_KIB, meta_16k / S_KIB, base_16k / S_KIB);
    }
    segment_arena_destroy (&arena);

    //  Creating and destroying many arenas leaks no address space.
    size_t vm_before = 0;
    for (int i = 0; i < 50; i++) {
        arena = segment_arena_new (capacity);
        assert (arena);
        for (int j = 0; j < 16; j++) {
            rc = s_set_alloc (&set, arena, (size_t) (j + 1) * 64 * S_KIB);
            assert (rc == 0);
        }
        s_set_free_at (&set, arena, 3);
        set.count = 0; //  the rest go with the arena
        set.requested = 0;
        segment_arena_destroy (&arena);
        if (i == 4)
            vm_before = s_vm_size_kib ();
    }
    size_t vm_after = s_vm_size_kib ();
    if (verbose)
        printf (" * 50 create/destroy: VmSize %zu -> %zu KiB\n", vm_before, vm_after);
    assert (vm_after < vm_before + 16 * 1024);

    //  Capacities that are no page multiple or size class, down to a single page.
    const size_t odd[] = {4096, 64 * S_KIB + 100, 3 * S_MIB + 5 * 4096 + 7, 100 * S_MIB + 12345};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        arena = segment_arena_new (odd[i]);
        assert (arena);
        assert (segment_arena_capacity (arena) == odd[i]);
        s_fill_until_fail (&set, arena, s_size_64k);
        double util = s_util (&set, arena);
        if (odd[i] >= S_MIB)
            assert (util >= 0.85);
        while (s_set_alloc (&set, arena, 100) == 0)
            ;
        s_set_check (&set, arena);
        if (verbose)
            printf (" * capacity %zu: 64 KiB blocks %.2f%%, then %zu allocations in all\n", odd[i],
                    util * 100, set.count);
        s_set_free_all (&set, arena);
        segment_arena_destroy (&arena);
    }

    free (set.recs);
}
