/*  rdma_wire.c - the RDMA connection data codec (see rdma_wire.h for the wire form).

    The decoder reads the fixed header, bounds both counts before it multiplies with them,
    then requires the input to be exactly as long as the counts say, then checks the checksum,
    and only then reads the entries: every read is inside a length already checked. It
    allocates once, the size the (bounded) counts give: at most about 100 KiB. One validation
    function serves encode and decode, so what one refuses the other refuses too. Uniqueness
    and overlap of segments are checked on sorted copies (n log n; n is up to 4096).
*/
#include "rdma/rdma_wire.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WIRE_MAGIC "KVPR"
#define WIRE_MTU_MIN 1 //  IBV_MTU_256
#define WIRE_MTU_MAX 5 //  IBV_MTU_4096
#define WIRE_24_BITS 0xffffffu

static void
s_put_u16 (uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t) (v >> 8);
    p[1] = (uint8_t) v;
}

static void
s_put_u32 (uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t) (v >> (24 - 8 * i));
}

static void
s_put_u64 (uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t) (v >> (56 - 8 * i));
}

static uint16_t
s_get_u16 (const uint8_t *p)
{
    return (uint16_t) (((unsigned) p[0] << 8) | p[1]);
}

static uint32_t
s_get_u32 (const uint8_t *p)
{
    return ((uint32_t) p[0] << 24) | ((uint32_t) p[1] << 16) | ((uint32_t) p[2] << 8) | p[3];
}

static uint64_t
s_get_u64 (const uint8_t *p)
{
    return ((uint64_t) s_get_u32 (p) << 32) | s_get_u32 (p + 4);
}

uint64_t
kvp_rdma_wire_checksum (const void *data, size_t size)
{
    const uint8_t *p = (const uint8_t *) data;
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < size; i++) {
        hash ^= p[i];
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

static size_t
s_wire_size (size_t qp_count, size_t seg_count)
{
    return KVP_RDMA_WIRE_HEADER + qp_count * KVP_RDMA_WIRE_QP_SIZE
           + seg_count * KVP_RDMA_WIRE_SEG_SIZE + KVP_RDMA_WIRE_SUM_SIZE;
}

static int
s_seg_by_addr (const void *a, const void *b)
{
    const kvp_rdma_wire_seg_t *x = (const kvp_rdma_wire_seg_t *) a;
    const kvp_rdma_wire_seg_t *y = (const kvp_rdma_wire_seg_t *) b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static int
s_seg_by_id (const void *a, const void *b)
{
    const kvp_rdma_wire_seg_t *x = (const kvp_rdma_wire_seg_t *) a;
    const kvp_rdma_wire_seg_t *y = (const kvp_rdma_wire_seg_t *) b;
    return x->id < y->id ? -1 : x->id > y->id;
}

//  Checks the fields (counts already bounded by the caller). Returns 0 or -1 with a reason.
static int
s_check (const kvp_rdma_wire_t *info, const char **reason_p)
{
    if (info->mtu < WIRE_MTU_MIN || info->mtu > WIRE_MTU_MAX) {
        *reason_p = "mtu is not 256, 512, 1024, 2048 or 4096 (ibv_mtu 1..5)";
        return -1;
    }
    bool gid_zero = true;
    for (size_t i = 0; i < sizeof info->gid; i++)
        gid_zero &= info->gid[i] == 0;
    if (info->lid == 0 && gid_zero) {
        *reason_p = "neither a LID nor a GID";
        return -1;
    }
    for (size_t i = 0; i < info->qp_count; i++) {
        if (info->qps[i].qpn < 2 || info->qps[i].qpn > WIRE_24_BITS) {
            *reason_p = "qp number out of range";
            return -1;
        }
        if (info->qps[i].psn > WIRE_24_BITS) {
            *reason_p = "psn out of range";
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (info->qps[j].qpn == info->qps[i].qpn) {
                *reason_p = "two queue pairs with one qp number";
                return -1;
            }
    }
    for (size_t i = 0; i < info->seg_count; i++) {
        if (info->segs[i].len == 0) {
            *reason_p = "segment of length 0";
            return -1;
        }
        if (info->segs[i].len > UINT64_MAX - info->segs[i].addr) {
            *reason_p = "segment wraps past the end of the address space";
            return -1;
        }
    }
    if (info->seg_count < 2)
        return 0;
    kvp_rdma_wire_seg_t *sorted =
        (kvp_rdma_wire_seg_t *) malloc (info->seg_count * sizeof (kvp_rdma_wire_seg_t));
    if (!sorted) {
        *reason_p = "out of memory";
        return -1;
    }
    memcpy (sorted, info->segs, info->seg_count * sizeof *sorted);
    int rc = 0;
    qsort (sorted, info->seg_count, sizeof *sorted, s_seg_by_id);
    for (size_t i = 1; i < info->seg_count && rc == 0; i++)
        if (sorted[i - 1].id == sorted[i].id) {
            *reason_p = "two segments with one id";
            rc = -1;
        }
    qsort (sorted, info->seg_count, sizeof *sorted, s_seg_by_addr);
    for (size_t i = 1; i < info->seg_count && rc == 0; i++)
        if (sorted[i - 1].addr + sorted[i - 1].len > sorted[i].addr) {
            *reason_p = "segments overlap";
            rc = -1;
        }
    free (sorted);
    return rc;
}

static int
s_check_counts (size_t qp_count, size_t seg_count, const char **reason_p)
{
    if (qp_count == 0) {
        *reason_p = "no queue pairs";
        return -1;
    }
    if (qp_count > KVP_RDMA_WIRE_MAX_QPS) {
        *reason_p = "too many queue pairs";
        return -1;
    }
    if (seg_count > KVP_RDMA_REGS_MAX) {
        *reason_p = "too many segments";
        return -1;
    }
    return 0;
}

int
kvp_rdma_wire_encode (const kvp_rdma_wire_t *info, uint8_t **data_p, size_t *size_p,
                      const char **reason_p)
{
    assert (info);
    assert (data_p);
    assert (size_p);
    const char *reason_local;
    if (!reason_p)
        reason_p = &reason_local;
    assert (info->qps || info->qp_count == 0);
    assert (info->segs || info->seg_count == 0);
    if (s_check_counts (info->qp_count, info->seg_count, reason_p) || s_check (info, reason_p))
        return -1;
    size_t size = s_wire_size (info->qp_count, info->seg_count);
    uint8_t *data = (uint8_t *) malloc (size);
    if (!data) {
        *reason_p = "out of memory";
        return -1;
    }
    memcpy (data, WIRE_MAGIC, 4);
    data[4] = KVP_RDMA_WIRE_VERSION;
    data[5] = info->mtu;
    s_put_u16 (data + 6, info->lid);
    memcpy (data + 8, info->gid, 16);
    s_put_u16 (data + 24, (uint16_t) info->qp_count);
    s_put_u16 (data + 26, (uint16_t) info->seg_count);
    uint8_t *p = data + KVP_RDMA_WIRE_HEADER;
    for (size_t i = 0; i < info->qp_count; i++, p += KVP_RDMA_WIRE_QP_SIZE) {
        s_put_u32 (p, info->qps[i].qpn);
        s_put_u32 (p + 4, info->qps[i].psn);
    }
    for (size_t i = 0; i < info->seg_count; i++, p += KVP_RDMA_WIRE_SEG_SIZE) {
        s_put_u32 (p, info->segs[i].id);
        s_put_u32 (p + 4, info->segs[i].rkey);
        s_put_u64 (p + 8, info->segs[i].addr);
        s_put_u64 (p + 16, info->segs[i].len);
    }
    s_put_u64 (p, kvp_rdma_wire_checksum (data, (size_t) (p - data)));
    assert ((size_t) (p - data) + KVP_RDMA_WIRE_SUM_SIZE == size);
    *data_p = data;
    *size_p = size;
    return 0;
}

kvp_rdma_wire_t *
kvp_rdma_wire_decode (const void *data_in, size_t size, const char **reason_p)
{
    const char *reason_local;
    if (!reason_p)
        reason_p = &reason_local;
    const uint8_t *data = (const uint8_t *) data_in;
    if (!data && size > 0) {
        *reason_p = "no data";
        return NULL;
    }
    //  The magic and version first, so that a newer peer is told apart from garbage.
    if (size < 5 || memcmp (data, WIRE_MAGIC, 4) != 0) {
        *reason_p = size < 5 && (size == 0 || memcmp (data, WIRE_MAGIC, size < 4 ? size : 4) == 0)
                        ? "truncated connection data"
                        : "not RDMA connection data (bad magic)";
        return NULL;
    }
    if (data[4] != KVP_RDMA_WIRE_VERSION) {
        *reason_p = "unsupported connection data version";
        return NULL;
    }
    if (size < KVP_RDMA_WIRE_HEADER) {
        *reason_p = "truncated connection data";
        return NULL;
    }
    size_t qp_count = s_get_u16 (data + 24);
    size_t seg_count = s_get_u16 (data + 26);
    if (s_check_counts (qp_count, seg_count, reason_p))
        return NULL;
    size_t expected = s_wire_size (qp_count, seg_count);
    if (size < expected) {
        *reason_p = "truncated connection data";
        return NULL;
    }
    if (size > expected) {
        *reason_p = "trailing bytes after connection data";
        return NULL;
    }
    size_t body = expected - KVP_RDMA_WIRE_SUM_SIZE;
    if (s_get_u64 (data + body) != kvp_rdma_wire_checksum (data, body)) {
        *reason_p = "connection data checksum does not match";
        return NULL;
    }
    //  One block: the struct, then the QPs, then the segments.
    kvp_rdma_wire_t *self =
        (kvp_rdma_wire_t *) calloc (1, sizeof *self + qp_count * sizeof (kvp_rdma_wire_qp_t)
                                           + seg_count * sizeof (kvp_rdma_wire_seg_t));
    if (!self) {
        *reason_p = "out of memory";
        return NULL;
    }
    self->qps = (kvp_rdma_wire_qp_t *) (self + 1);
    self->segs = seg_count ? (kvp_rdma_wire_seg_t *) (self->qps + qp_count) : NULL;
    self->qp_count = qp_count;
    self->seg_count = seg_count;
    self->mtu = data[5];
    self->lid = s_get_u16 (data + 6);
    memcpy (self->gid, data + 8, 16);
    const uint8_t *p = data + KVP_RDMA_WIRE_HEADER;
    for (size_t i = 0; i < qp_count; i++, p += KVP_RDMA_WIRE_QP_SIZE) {
        self->qps[i].qpn = s_get_u32 (p);
        self->qps[i].psn = s_get_u32 (p + 4);
    }
    for (size_t i = 0; i < seg_count; i++, p += KVP_RDMA_WIRE_SEG_SIZE) {
        self->segs[i].id = s_get_u32 (p);
        self->segs[i].rkey = s_get_u32 (p + 4);
        self->segs[i].addr = s_get_u64 (p + 8);
        self->segs[i].len = s_get_u64 (p + 16);
    }
    if (s_check (self, reason_p)) {
        free (self);
        return NULL;
    }
    return self;
}

void
kvp_rdma_wire_destroy (kvp_rdma_wire_t **self_p)
{
    assert (self_p);
    free (*self_p); //  one block
    *self_p = NULL;
}

//  ---- self test -----------------------------------------------------------------------

static bool
s_same (const kvp_rdma_wire_t *a, const kvp_rdma_wire_t *b)
{
    if (a->mtu != b->mtu || a->lid != b->lid || memcmp (a->gid, b->gid, 16) != 0
        || a->qp_count != b->qp_count || a->seg_count != b->seg_count)
        return false;
    for (size_t i = 0; i < a->qp_count; i++)
        if (a->qps[i].qpn != b->qps[i].qpn || a->qps[i].psn != b->qps[i].psn)
            return false;
    for (size_t i = 0; i < a->seg_count; i++)
        if (a->segs[i].id != b->segs[i].id || a->segs[i].rkey != b->segs[i].rkey
            || a->segs[i].addr != b->segs[i].addr || a->segs[i].len != b->segs[i].len)
            return false;
    return true;
}

//  Rewrites the checksum of an encoding edited by a test, so that the field checks behind it
//  are reached.
static void
s_restamp (uint8_t *data, size_t size)
{
    assert (size >= KVP_RDMA_WIRE_SUM_SIZE);
    size_t body = size - KVP_RDMA_WIRE_SUM_SIZE;
    s_put_u64 (data + body, kvp_rdma_wire_checksum (data, body));
}

//  Decodes a copy of data (exactly size bytes on the heap, so a read past the end is caught
//  by AddressSanitizer), expecting a refusal whose reason contains want (NULL: any reason).
static void
s_expect_refused (const uint8_t *data, size_t size, const char *want)
{
    uint8_t *copy = (uint8_t *) malloc (size ? size : 1);
    assert (copy);
    if (size)
        memcpy (copy, data, size);
    const char *reason = NULL;
    kvp_rdma_wire_t *decoded = kvp_rdma_wire_decode (copy, size, &reason);
    if (decoded || !reason || (want && !strstr (reason, want))) {
        fprintf (stderr, "rdma_wire: size %zu: expected '%s', got '%s'\n", size,
                 want ? want : "(any)",
                 decoded  ? "accepted"
                 : reason ? reason
                          : "(none)");
        assert (false);
    }
    free (copy);
}

//  Edits byte off of a copy of a valid encoding with the checksum put right, and expects a
//  refusal naming want.
static void
s_expect_field_refused (const uint8_t *valid, size_t size, size_t off, uint8_t value,
                        const char *want)
{
    uint8_t *copy = (uint8_t *) malloc (size);
    assert (copy);
    memcpy (copy, valid, size);
    copy[off] = value;
    s_restamp (copy, size);
    s_expect_refused (copy, size, want);
    free (copy);
}

static uint64_t
s_rand (uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

void
kvp_rdma_wire_test (bool verbose)
{
    const char *reason = NULL;
    uint8_t *data = NULL;
    size_t size = 0;

    //  A small one, byte for byte: the wire form is a contract with other nodes.
    kvp_rdma_wire_qp_t qps[2] = {{0x000102, 0x0a0b0c}, {0xfffffe, 0}};
    kvp_rdma_wire_seg_t segs[2] = {{7, 0x11223344, 0x7f0000001000ULL, 0x200000},
                                   {9, 0x55667788, 0x7f0000000000ULL, 0x1000}};
    kvp_rdma_wire_t info = {5, 0x0102, {0}, 2, qps, 2, segs};
    for (int i = 0; i < 16; i++)
        info.gid[i] = (uint8_t) (0xf0 + i);
    assert (kvp_rdma_wire_encode (&info, &data, &size, &reason) == 0);
    const uint8_t golden[] = {
        'K',  'V',  'P',  'R',  1,    5,    0x01, 0x02,                                        //
        0xf0, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xfb,                //
        0xfc, 0xfd, 0xfe, 0xff, 0,    2,    0,    2,                                           //
        0,    0,    0x01, 0x02, 0,    0x0a, 0x0b, 0x0c, 0,    0xff, 0xff, 0xfe, 0, 0, 0,    0, //
        0,    0,    0,    7,    0x11, 0x22, 0x33, 0x44, 0,    0,    0x7f, 0,    0, 0, 0x10, 0, //
        0,    0,    0,    0,    0,    0x20, 0,    0,                                           //
        0,    0,    0,    9,    0x55, 0x66, 0x77, 0x88, 0,    0,    0x7f, 0,    0, 0, 0,    0, //
        0,    0,    0,    0,    0,    0,    0x10, 0};
    assert (size == sizeof golden + KVP_RDMA_WIRE_SUM_SIZE);
    assert (memcmp (data, golden, sizeof golden) == 0);
    assert (s_get_u64 (data + sizeof golden) == kvp_rdma_wire_checksum (golden, sizeof golden));
    //  FNV-1a's published test value, so the checksum is the standard one.
    assert (kvp_rdma_wire_checksum ("a", 1) == 0xaf63dc4c8601ec8cULL);

    kvp_rdma_wire_t *decoded = kvp_rdma_wire_decode (data, size, &reason);
    assert (decoded);
    assert (s_same (decoded, &info));
    kvp_rdma_wire_destroy (&decoded);
    assert (decoded == NULL);
    kvp_rdma_wire_destroy (&decoded);

    //  Every prefix is refused as truncated; so is any byte more.
    for (size_t n = 0; n < size; n++)
        s_expect_refused (data, n, "truncated");
    uint8_t *longer = (uint8_t *) calloc (1, size + 1);
    memcpy (longer, data, size);
    s_expect_refused (longer, size + 1, "trailing");
    free (longer);
    assert (kvp_rdma_wire_decode (NULL, 0, &reason) == NULL);

    //  Every single-byte change is refused (FNV-1a detects them all; the header's own checks
    //  may speak first).
    size_t flips = 0;
    for (size_t off = 0; off < size; off++)
        for (unsigned bit = 0; bit < 8; bit++) {
            data[off] ^= (uint8_t) (1u << bit);
            s_expect_refused (data, size, NULL);
            data[off] ^= (uint8_t) (1u << bit);
            flips++;
        }

    //  Each field check, behind a checksum put right.
    s_expect_field_refused (data, size, 0, 'X', "magic");
    s_expect_field_refused (data, size, 4, 2, "version");
    s_expect_field_refused (data, size, 5, 0, "mtu");
    s_expect_field_refused (data, size, 5, 6, "mtu");
    s_expect_field_refused (data, size, 25, 0, "no queue pairs");       //  qp_count 0
    s_expect_field_refused (data, size, 24, 1, "too many queue pairs"); //  qp_count 258
    s_expect_field_refused (data, size, 26, 0x10, "too many segments"); //  seg_count 4098
    s_expect_field_refused (data, size, 28, 1, "qp number");            //  qpn 0x01000102
    s_expect_field_refused (data, size, 36, 1, "qp number");            //  qpn 0x01fffffe
    s_expect_field_refused (data, size, 32, 1, "psn");                  //  psn 0x010a0b0c
    s_expect_field_refused (data, size, 65, 0, "length 0");             //  1st segment's len 0
    s_expect_field_refused (data, size, 71, 7, "one id");               //  2nd segment's id 7
    s_expect_field_refused (data, size, 90, 0x20, "overlap");           //  2nd segment 0x2000 long
    {
        uint8_t *copy = (uint8_t *) malloc (size);
        //  QPs 0 and 1 are special.
        for (uint32_t qpn = 0; qpn < 2; qpn++) {
            memcpy (copy, data, size);
            s_put_u32 (copy + 28, qpn);
            s_restamp (copy, size);
            s_expect_refused (copy, size, "qp number");
        }
        //  Two equal qpns.
        memcpy (copy, data, size);
        s_put_u32 (copy + 36, 0x000102);
        s_restamp (copy, size);
        s_expect_refused (copy, size, "one qp number");
        //  No address at all.
        memcpy (copy, data, size);
        memset (copy + 6, 0, 18);
        s_restamp (copy, size);
        s_expect_refused (copy, size, "neither a LID nor a GID");
        //  A LID alone, and a GID alone, are addresses.
        memcpy (copy, data, size);
        memset (copy + 8, 0, 16);
        s_restamp (copy, size);
        decoded = kvp_rdma_wire_decode (copy, size, &reason);
        assert (decoded && decoded->lid == 0x0102 && decoded->gid[15] == 0);
        kvp_rdma_wire_destroy (&decoded);
        memset (copy + 6, 0, 2);
        copy[6 + 2 + 15] = 1;
        s_restamp (copy, size);
        decoded = kvp_rdma_wire_decode (copy, size, &reason);
        assert (decoded && decoded->lid == 0 && decoded->gid[15] == 1);
        kvp_rdma_wire_destroy (&decoded);
        //  A segment that wraps.
        memcpy (copy, data, size);
        s_put_u64 (copy + 52, UINT64_MAX - 0x1000);
        s_restamp (copy, size);
        s_expect_refused (copy, size, "wraps");
        free (copy);
    }

    //  Encode refuses what decode would refuse.
    kvp_rdma_wire_t bad = info;
    bad.mtu = 0;
    assert (kvp_rdma_wire_encode (&bad, &data, &size, &reason) == -1 && strstr (reason, "mtu"));
    bad = info;
    bad.qp_count = 0;
    assert (kvp_rdma_wire_encode (&bad, &data, &size, &reason) == -1);
    bad = info;
    kvp_rdma_wire_seg_t overlapping[2] = {{1, 1, 4096, 8192}, {2, 2, 8192, 4096}};
    bad.segs = overlapping;
    assert (kvp_rdma_wire_encode (&bad, &data, &size, &reason) == -1);
    assert (strstr (reason, "overlap"));
    free (data);

    //  The largest: KVP_RDMA_WIRE_MAX_QPS QPs and KVP_RDMA_REGS_MAX segments, round trip; no
    //  segments at all, round trip.
    kvp_rdma_wire_qp_t *many_qps =
        (kvp_rdma_wire_qp_t *) malloc (KVP_RDMA_WIRE_MAX_QPS * sizeof *many_qps);
    kvp_rdma_wire_seg_t *many_segs =
        (kvp_rdma_wire_seg_t *) malloc (KVP_RDMA_REGS_MAX * sizeof *many_segs);
    for (uint32_t i = 0; i < KVP_RDMA_WIRE_MAX_QPS; i++)
        many_qps[i] = (kvp_rdma_wire_qp_t){100 + i * 7, (i * 40503u) & WIRE_24_BITS};
    for (uint32_t i = 0; i < KVP_RDMA_REGS_MAX; i++) //  ids and addresses in different orders
        many_segs[i] =
            (kvp_rdma_wire_seg_t){KVP_RDMA_REGS_MAX - i, i * 31,
                                  (uint64_t) ((i * 2654435761u) % 65536) << 30, 1ULL << 30};
    kvp_rdma_wire_t big = {
        3, 0xffff, {0}, KVP_RDMA_WIRE_MAX_QPS, many_qps, KVP_RDMA_REGS_MAX, many_segs};
    assert (kvp_rdma_wire_encode (&big, &data, &size, &reason) == 0);
    assert (size == s_wire_size (KVP_RDMA_WIRE_MAX_QPS, KVP_RDMA_REGS_MAX));
    decoded = kvp_rdma_wire_decode (data, size, &reason);
    assert (decoded && s_same (decoded, &big));
    kvp_rdma_wire_destroy (&decoded);
    free (data);
    big.qp_count = KVP_RDMA_WIRE_MAX_QPS + 1;
    assert (kvp_rdma_wire_encode (&big, &data, &size, &reason) == -1);
    big.qp_count = 1;
    big.seg_count = KVP_RDMA_REGS_MAX + 1;
    assert (kvp_rdma_wire_encode (&big, &data, &size, &reason) == -1);
    big.seg_count = 0;
    big.segs = NULL;
    assert (kvp_rdma_wire_encode (&big, &data, &size, &reason) == 0);
    assert (size == KVP_RDMA_WIRE_HEADER + KVP_RDMA_WIRE_QP_SIZE + KVP_RDMA_WIRE_SUM_SIZE);
    decoded = kvp_rdma_wire_decode (data, size, &reason);
    assert (decoded && s_same (decoded, &big) && decoded->segs == NULL);
    kvp_rdma_wire_destroy (&decoded);

    //  Random damage to a valid encoding, with the checksum put right so the field checks are
    //  reached: never a crash, and whatever is accepted re-encodes to the same bytes.
    uint64_t state = 0x2545f4914f6cdd1dULL;
    size_t accepted = 0, refused = 0;
    free (data);
    info.seg_count = 2;
    assert (kvp_rdma_wire_encode (&info, &data, &size, &reason) == 0);
    uint8_t *work = (uint8_t *) malloc (size);
    for (int round = 0; round < 20000; round++) {
        memcpy (work, data, size);
        int edits = 1 + (int) (s_rand (&state) % 4);
        for (int e = 0; e < edits; e++)
            work[s_rand (&state) % size] = (uint8_t) s_rand (&state);
        size_t cut = s_rand (&state) % 8 == 0 ? s_rand (&state) % (size + 1) : size;
        if (cut >= KVP_RDMA_WIRE_SUM_SIZE)
            s_restamp (work, cut);
        decoded = kvp_rdma_wire_decode (work, cut, &reason);
        if (decoded) {
            uint8_t *again;
            size_t again_size;
            assert (kvp_rdma_wire_encode (decoded, &again, &again_size, &reason) == 0);
            assert (again_size == cut && memcmp (again, work, cut) == 0);
            free (again);
            kvp_rdma_wire_destroy (&decoded);
            accepted++;
        }
        else {
            assert (reason && *reason);
            refused++;
        }
    }
    //  Random bytes of random lengths: refused.
    for (int round = 0; round < 2000; round++) {
        size_t n = s_rand (&state) % 200;
        for (size_t i = 0; i < n && i < size; i++)
            work[i] = (uint8_t) s_rand (&state);
        s_expect_refused (work, n < size ? n : size, NULL);
    }
    assert (accepted > 100 && refused > 100);
    free (work);
    free (data);
    free (many_qps);
    free (many_segs);
    if (verbose)
        printf ("(%zu flips, %zu accepted, %zu refused) ", flips, accepted, refused);
}
