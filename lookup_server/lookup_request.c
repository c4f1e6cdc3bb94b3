/*  lookup_request.c - decoder of the lookup/reset admin channel's requests.

    See lookup_request.h for the wire forms and what is refused. The decoder reads only the
    frames it is given, checks every length before it reads, and allocates at most about
    twice the input size (hex doubles a binary blob) plus one pointer and one length per hash;
    a hash count is checked against both LOOKUP_REQUEST_MAX_HASHES and the bytes actually
    present before anything is allocated. No threads, no globals.
*/
#include "lookup_server/lookup_request.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define TOKEN_LEN_SIZE 4
#define HASH_LEN_SIZE 2

static bool
s_frame_is (const lookup_frame_t *frame, const char *text)
{
    size_t len = strlen (text);
    return frame->size == len && (len == 0 || memcmp (frame->data, text, len) == 0);
}

static uint32_t
s_get_u32 (const uint8_t *p)
{
    return ((uint32_t) p[0] << 24) | ((uint32_t) p[1] << 16) | ((uint32_t) p[2] << 8) | p[3];
}

static uint16_t
s_get_u16 (const uint8_t *p)
{
    return (uint16_t) (((unsigned) p[0] << 8) | p[1]);
}

//  Lowercase form of each hex digit, 0 for any other byte (uppercase is accepted and lowered,
//  since store keys are lowercase). A table: this runs once per byte of every lookup.
static const char s_hex_lower[256] = {
    ['0'] = '0', ['1'] = '1', ['2'] = '2', ['3'] = '3', ['4'] = '4', ['5'] = '5',
    ['6'] = '6', ['7'] = '7', ['8'] = '8', ['9'] = '9', ['a'] = 'a', ['b'] = 'b',
    ['c'] = 'c', ['d'] = 'd', ['e'] = 'e', ['f'] = 'f', ['A'] = 'a', ['B'] = 'b',
    ['C'] = 'c', ['D'] = 'd', ['E'] = 'e', ['F'] = 'f'};

//  Copies the leading 16-byte blocks of in that are lowercase hex digits only (what engines
//  send) to out, and returns how many bytes it copied; the byte-by-byte loop does the rest
//  (uppercase, bad bytes, the tail). SSE2 compares 16 bytes at once; without it, nothing.
static inline uint32_t
s_copy_lower_hex (char *out, const uint8_t *in, uint32_t len)
{
    uint32_t done = 0;
#if defined(__SSE2__)
    const __m128i below_0 = _mm_set1_epi8 ('0' - 1), above_9 = _mm_set1_epi8 ('9' + 1);
    const __m128i below_a = _mm_set1_epi8 ('a' - 1), above_f = _mm_set1_epi8 ('f' + 1);
    for (; done + 16 <= len; done += 16) {
        //  Signed compares: a byte of 0x80 or more is negative, so never a digit or letter.
        __m128i v = _mm_loadu_si128 ((const __m128i *) (in + done));
        __m128i digit = _mm_and_si128 (_mm_cmpgt_epi8 (v, below_0), _mm_cmplt_epi8 (v, above_9));
        __m128i letter = _mm_and_si128 (_mm_cmpgt_epi8 (v, below_a), _mm_cmplt_epi8 (v, above_f));
        if (_mm_movemask_epi8 (_mm_or_si128 (digit, letter)) != 0xFFFF)
            break;
        _mm_storeu_si128 ((__m128i *) (out + done), v);
    }
#else
    (void) out;
    (void) in;
    (void) len;
#endif
    return done;
}

static lookup_request_t *
s_request_new (lookup_request_type_t type)
{
    lookup_request_t *self = (lookup_request_t *) calloc (1, sizeof *self);
    if (self)
        self->type = type;
    return self;
}

//  Allocates room for count hashes and text_size bytes of strings.
static int
s_request_reserve (lookup_request_t *self, size_t count, size_t text_size)
{
    if (count == 0)
        return 0;
    self->hashes = (char **) malloc (count * sizeof (char *));
    self->hash_lens = (size_t *) malloc (count * sizeof (size_t));
    self->text_ = (char *) malloc (text_size);
    return self->hashes && self->hash_lens && self->text_ ? 0 : -1;
}

//  ---- msgpack: array of str -----------------------------------------------------------

typedef struct {
    const uint8_t *p;
    size_t left;
} s_reader_t;

static int
s_read_uint (s_reader_t *r, size_t width, uint32_t *value_p)
{
    if (r->left < width)
        return -1;
    uint32_t value = 0;
    for (size_t i = 0; i < width; i++)
        value = (value << 8) | r->p[i];
    r->p += width;
    r->left -= width;
    *value_p = value;
    return 0;
}

//  Decodes frame as a msgpack array of hex strings into self. Returns 0, or -1 with a reason.
static int
s_decode_msgpack (lookup_request_t *self, const lookup_frame_t *frame, const char **reason_p)
{
    s_reader_t r = {(const uint8_t *) frame->data, frame->size};
    if (r.left == 0) {
        *reason_p = "empty msgpack frame";
        return -1;
    }
    uint8_t head = *r.p++;
    r.left--;
    uint32_t count;
    if ((head & 0xf0) == 0x90)
        count = head & 0x0f;
    else if (head == 0xdc || head == 0xdd) {
        if (s_read_uint (&r, head == 0xdc ? 2 : 4, &count)) {
            *reason_p = "truncated msgpack array header";
            return -1;
        }
    }
    else {
        *reason_p = "msgpack value is not an array";
        return -1;
    }
    if (count > LOOKUP_REQUEST_MAX_HASHES) {
        *reason_p = "too many hashes";
        return -1;
    }
    //  Every entry takes at least one byte, so a count larger than what is left is a lie:
    //  refuse it before allocating for it.
    if (count > r.left) {
        *reason_p = "truncated msgpack array";
        return -1;
    }
    //  Each string costs at least its header byte, which pays for its NUL here.
    if (s_request_reserve (self, count, r.left)) {
        *reason_p = "out of memory";
        return -1;
    }
    char *text = self->text_;
    for (uint32_t i = 0; i < count; i++) {
        if (r.left == 0) {
            *reason_p = "truncated msgpack array";
            return -1;
        }
        uint8_t type = *r.p++;
        r.left--;
        uint32_t len;
        if ((type & 0xe0) == 0xa0)
            len = type & 0x1f;
        else if (type == 0xd9 || type == 0xda || type == 0xdb) {
            size_t width = type == 0xd9 ? 1 : type == 0xda ? 2 : 4;
            if (s_read_uint (&r, width, &len)) {
                *reason_p = "truncated msgpack string header";
                return -1;
            }
        }
        else {
            *reason_p = "hash entry is not a string";
            return -1;
        }
        if (len > r.left) {
            *reason_p = "truncated msgpack string";
            return -1;
        }
        if (len == 0) {
            *reason_p = "empty hash string";
            return -1;
        }
        if (len % 2) {
            *reason_p = "hash string of odd length";
            return -1;
        }
        if (len > 2 * (uint32_t) LOOKUP_REQUEST_MAX_HASH_BYTES) {
            *reason_p = "hash string too long";
            return -1;
        }
        //  Check the whole string at once: the common case has no bad byte.
        char bad = 0;
        uint32_t j = s_copy_lower_hex (text, r.p, len);
        for (; j < len; j++) {
            char lower = s_hex_lower[r.p[j]];
            bad |= (char) (lower == 0);
            text[j] = lower;
        }
        if (bad) {
            *reason_p = "hash string is not hex";
            return -1;
        }
        text[len] = 0;
        self->hashes[i] = text;
        self->hash_lens[i] = len;
        self->hash_count = i + 1;
        text += len + 1;
        r.p += len;
        r.left -= len;
    }
    if (r.left) {
        *reason_p = "trailing bytes after the msgpack array";
        return -1;
    }
    return 0;
}

//  ---- binary: hash_len + blob ---------------------------------------------------------

static int
s_decode_binary (lookup_request_t *self, const lookup_frame_t *len_frame,
                 const lookup_frame_t *blob, const char **reason_p)
{
    if (len_frame->size != HASH_LEN_SIZE) {
        *reason_p = "hash_len frame is not 2 bytes";
        return -1;
    }
    size_t hash_len = s_get_u16 ((const uint8_t *) len_frame->data);
    if (hash_len == 0) {
        if (blob->size) {
            *reason_p = "hash_len 0 with hash data";
            return -1;
        }
        return 0;
    }
    if (blob->size % hash_len) {
        *reason_p = "hash blob is not a multiple of hash_len";
        return -1;
    }
    size_t count = blob->size / hash_len;
    if (count > LOOKUP_REQUEST_MAX_HASHES) {
        *reason_p = "too many hashes";
        return -1;
    }
    if (s_request_reserve (self, count, count * (2 * hash_len + 1))) {
        *reason_p = "out of memory";
        return -1;
    }
    static const char digits[] = "0123456789abcdef";
    const uint8_t *in = (const uint8_t *) blob->data;
    char *text = self->text_;
    for (size_t i = 0; i < count; i++) {
        self->hashes[i] = text;
        self->hash_lens[i] = 2 * hash_len;
        for (size_t j = 0; j < hash_len; j++) {
            *text++ = digits[*in >> 4];
            *text++ = digits[*in & 15];
            in++;
        }
        *text++ = 0;
    }
    self->hash_count = count;
    return 0;
}

//  ---- the request ---------------------------------------------------------------------

lookup_request_t *
lookup_request_decode (const lookup_frame_t *frames, size_t count, const char **reason_p)
{
    const char *reason = NULL;
    lookup_request_t *self = NULL;
    assert (frames || count == 0);

    if (count == 0)
        reason = "empty message";
    else if (s_frame_is (&frames[0], "reset") || s_frame_is (&frames[0], "ping")
             || s_frame_is (&frames[0], "stats")) {
        if (count != 1)
            reason = "extra frames after the tag";
        else {
            lookup_request_type_t type = s_frame_is (&frames[0], "reset")  ? LOOKUP_REQUEST_RESET
                                         : s_frame_is (&frames[0], "ping") ? LOOKUP_REQUEST_PING
                                                                           : LOOKUP_REQUEST_STATS;
            self = s_request_new (type);
            if (!self)
                reason = "out of memory";
        }
    }
    else {
        //  A lookup: tagged (3 or 4 frames) or untagged (2 frames, a 4-byte first frame).
        const lookup_frame_t *body = NULL;
        size_t body_count = 0;
        lookup_form_t form = LOOKUP_FORM_NONE;
        if (s_frame_is (&frames[0], "lookup")) {
            body = frames + 1;
            body_count = count - 1;
            if (body_count == 2)
                form = LOOKUP_FORM_MSGPACK;
            else if (body_count == 3)
                form = LOOKUP_FORM_BINARY;
            else if (body_count == 4)
                form = LOOKUP_FORM_BINARY_EAGLE;
            else
                reason = body_count < 2 ? "missing frames after lookup" : "extra frames";
            if (form == LOOKUP_FORM_BINARY_EAGLE
                && (body[3].size != 1 || ((const uint8_t *) body[3].data)[0] > 1))
                reason = "apply_eagle frame is not one byte 0 or 1";
        }
        else if (count == 2 && frames[0].size == TOKEN_LEN_SIZE) {
            body = frames;
            body_count = 2;
            form = LOOKUP_FORM_UNTAGGED;
        }
        else
            reason = "unknown tag";

        if (!reason && body[0].size != TOKEN_LEN_SIZE)
            reason = "token_len frame is not 4 bytes";
        if (!reason) {
            self = s_request_new (LOOKUP_REQUEST_LOOKUP);
            if (!self)
                reason = "out of memory";
        }
        if (!reason) {
            self->form = form;
            self->token_len = s_get_u32 ((const uint8_t *) body[0].data);
            self->apply_eagle =
                form != LOOKUP_FORM_BINARY_EAGLE || ((const uint8_t *) body[3].data)[0] == 1;
            int rc = form == LOOKUP_FORM_BINARY || form == LOOKUP_FORM_BINARY_EAGLE
                         ? s_decode_binary (self, &body[1], &body[2], &reason)
                         : s_decode_msgpack (self, &body[1], &reason);
            assert (rc == 0 || reason);
        }
    }
    if (reason) {
        lookup_request_destroy (&self);
        if (reason_p)
            *reason_p = reason;
        return NULL;
    }
    return self;
}

void
lookup_request_destroy (lookup_request_t **self_p)
{
    assert (self_p);
    lookup_request_t *self = *self_p;
    if (self) {
        free (self->hashes);
        free (self->hash_lens);
        free (self->text_);
        free (self);
        *self_p = NULL;
    }
}

const char *
lookup_request_type_name (lookup_request_type_t type)
{
    switch (type) {
        case LOOKUP_REQUEST_LOOKUP: return "lookup";
        case LOOKUP_REQUEST_RESET: return "reset";
        case LOOKUP_REQUEST_PING: return "ping";
        case LOOKUP_REQUEST_STATS: return "stats";
    }
    return "?";
}

const char *
lookup_request_form_name (lookup_form_t form)
{
    switch (form) {
        case LOOKUP_FORM_NONE: return "none";
        case LOOKUP_FORM_MSGPACK: return "msgpack";
        case LOOKUP_FORM_BINARY: return "binary";
        case LOOKUP_FORM_BINARY_EAGLE: return "binary+eagle";
        case LOOKUP_FORM_UNTAGGED: return "untagged";
    }
    return "?";
}

//  ---- self test -----------------------------------------------------------------------
//  Requests are built with msgpack-c's packer, an encoder independent of the reader above.

#include <msgpack.h>

static bool
s_streq (const char *a, const char *b)
{
    return strcmp (a, b) == 0;
}

typedef struct {
    lookup_frame_t frames[8];
    size_t count;
    msgpack_sbuffer buffers[8]; //  owned msgpack frames
    size_t buffer_count;
    uint8_t small[8][4]; //  token_len and hash_len frames
    size_t small_count;
} s_msg_t;

static void
s_msg_init (s_msg_t *m)
{
    memset (m, 0, sizeof *m);
}

static void
s_msg_free (s_msg_t *m)
{
    for (size_t i = 0; i < m->buffer_count; i++)
        msgpack_sbuffer_destroy (&m->buffers[i]);
    s_msg_init (m);
}

static void
s_msg_add (s_msg_t *m, const void *data, size_t size)
{
    assert (m->count < 8);
    m->frames[m->count].data = data;
    m->frames[m->count].size = size;
    m->count++;
}

static void
s_msg_str (s_msg_t *m, const char *text)
{
    s_msg_add (m, text, strlen (text));
}

static void
s_msg_u32 (s_msg_t *m, uint32_t value)
{
    uint8_t *p = m->small[m->small_count++];
    p[0] = (uint8_t) (value >> 24);
    p[1] = (uint8_t) (value >> 16);
    p[2] = (uint8_t) (value >> 8);
    p[3] = (uint8_t) value;
    s_msg_add (m, p, 4);
}

static void
s_msg_u16 (s_msg_t *m, uint16_t value)
{
    uint8_t *p = m->small[m->small_count++];
    p[0] = (uint8_t) (value >> 8);
    p[1] = (uint8_t) value;
    s_msg_add (m, p, 2);
}

//  Adds a frame: a msgpack array of the given strings.
static void
s_msg_hashes (s_msg_t *m, const char *const *hashes, size_t count)
{
    msgpack_sbuffer *buffer = &m->buffers[m->buffer_count++];
    msgpack_sbuffer_init (buffer);
    msgpack_packer pk;
    msgpack_packer_init (&pk, buffer, msgpack_sbuffer_write);
    msgpack_pack_array (&pk, count);
    for (size_t i = 0; i < count; i++) {
        msgpack_pack_str (&pk, strlen (hashes[i]));
        msgpack_pack_str_body (&pk, hashes[i], strlen (hashes[i]));
    }
    s_msg_add (m, buffer->data, buffer->size);
}

//  Adds a frame of raw bytes built by the caller with a packer on a fresh buffer.
static msgpack_packer
s_msg_packer (s_msg_t *m, msgpack_sbuffer **buffer_p)
{
    msgpack_sbuffer *buffer = &m->buffers[m->buffer_count++];
    msgpack_sbuffer_init (buffer);
    msgpack_packer pk;
    msgpack_packer_init (&pk, buffer, msgpack_sbuffer_write);
    *buffer_p = buffer;
    return pk;
}

static lookup_request_t *
s_decode (s_msg_t *m, const char **reason_p)
{
    *reason_p = NULL;
    return lookup_request_decode (m->frames, m->count, reason_p);
}

//  Decodes m, expects a refusal with the given reason.
static void
s_expect_refused (s_msg_t *m, const char *expected, bool verbose)
{
    const char *reason;
    lookup_request_t *request = s_decode (m, &reason);
    if (request || !reason || strcmp (reason, expected) != 0) {
        fprintf (stderr, "lookup_request: expected refusal '%s', got %s '%s'\n", expected,
                 request ? "a request" : "refusal", reason ? reason : "(none)");
        assert (false);
    }
    if (verbose)
        printf ("\n  refused: %s", reason);
    lookup_request_destroy (&request);
    s_msg_free (m);
}

void
lookup_request_test (bool verbose)
{
    s_msg_t m;
    const char *reason;
    lookup_request_t *request;
    const char *three[] = {"00ff10", "abcdef0123456789", "deadbeef"};

    //  Tagged msgpack.
    s_msg_init (&m);
    s_msg_str (&m, "lookup");
    s_msg_u32 (&m, 0x01020304);
    s_msg_hashes (&m, three, 3);
    request = s_decode (&m, &reason);
    assert (request);
    assert (request->type == LOOKUP_REQUEST_LOOKUP);
    assert (request->form == LOOKUP_FORM_MSGPACK);
    assert (request->token_len == 0x01020304);
    assert (request->hash_count == 3);
    for (size_t i = 0; i < 3; i++) {
        assert (s_streq (request->hashes[i], three[i]));
        assert (request->hash_lens[i] == strlen (three[i]));
    }
    lookup_request_destroy (&request);
    assert (request == NULL);
    lookup_request_destroy (&request); //  NULL is fine
    s_msg_free (&m);

    //  Tagged msgpack, empty list; the largest token_len.
    s_msg_init (&m);
    s_msg_str (&m, "lookup");
    s_msg_u32 (&m, 0xffffffff);
    s_msg_hashes (&m, NULL, 0);
    request = s_decode (&m, &reason);
    assert (request && request->form == LOOKUP_FORM_MSGPACK);
    assert (request->token_len == 0xffffffff && request->hash_count == 0);
    lookup_request_destroy (&request);
    s_msg_free (&m);

    //  Uppercase hex and str8/str16 headers (long strings) are read and lowered.
    {
        char long_hash[301];
        for (int i = 0; i < 300; i++)
            long_hash[i] = "0123456789ABCDEF"[i % 16];
        long_hash[300] = 0;
        const char *mixed[] = {"ABCDEF", long_hash, "0123456789abcdef0123456789abcdef01"};
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 7);
        s_msg_hashes (&m, mixed, 3);
        request = s_decode (&m, &reason);
        assert (request && request->hash_count == 3);
        assert (s_streq (request->hashes[0], "abcdef"));
        assert (request->hash_lens[1] == 300);
        for (int i = 0; i < 300; i++)
            assert (request->hashes[1][i] == "0123456789abcdef"[i % 16]);
        assert (s_streq (request->hashes[2], mixed[2]));
        lookup_request_destroy (&request);
        s_msg_free (&m);
    }

    //  Long strings are checked 16 bytes at a time: the digits and letters at the ranges'
    //  edges pass, and a byte just outside them fails wherever it is.
    {
        const char *edges = "09af09af09af09af09af09af09af09af90fa";
        const char *one[] = {edges};
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 7);
        s_msg_hashes (&m, one, 1);
        request = s_decode (&m, &reason);
        assert (request && s_streq (request->hashes[0], edges));
        lookup_request_destroy (&request);
        s_msg_free (&m);
        const char outside[] = {'/', ':', '`', 'g', 'G' + 32 + 1, (char) 0x80, (char) 0xff, ' '};
        for (size_t k = 0; k < sizeof outside; k++)
            for (size_t at = 0; at < 36; at += 7) {
                char bad_hash[37];
                memcpy (bad_hash, edges, 37);
                bad_hash[at] = outside[k];
                const char *bad_one[] = {bad_hash};
                s_msg_init (&m);
                s_msg_str (&m, "lookup");
                s_msg_u32 (&m, 7);
                s_msg_hashes (&m, bad_one, 1);
                reason = NULL;
                request = s_decode (&m, &reason);
                assert (!request && reason && s_streq (reason, "hash string is not hex"));
                s_msg_free (&m);
            }
    }

    //  Tagged binary: hashes come out as lowercase hex.
    {
        const uint8_t blob[] = {0x00, 0x01, 0xab, 0xff, 0x10, 0x20,
                                0x30, 0x40, 0xde, 0xad, 0xbe, 0xef};
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 48);
        s_msg_u16 (&m, 4);
        s_msg_add (&m, blob, sizeof blob);
        request = s_decode (&m, &reason);
        assert (request && request->form == LOOKUP_FORM_BINARY);
        assert (request->token_len == 48 && request->hash_count == 3);
        assert (s_streq (request->hashes[0], "0001abff"));
        assert (s_streq (request->hashes[1], "10203040"));
        assert (s_streq (request->hashes[2], "deadbeef"));
        assert (request->hash_lens[2] == 8);
        lookup_request_destroy (&request);
        s_msg_free (&m);
    }
    //  Tagged binary, empty list: hash_len 0 and an empty frame, or any hash_len and an
    //  empty frame.
    for (int hash_len = 0; hash_len <= 32; hash_len += 32) {
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 16);
        s_msg_u16 (&m, (uint16_t) hash_len);
        s_msg_add (&m, "", 0);
        request = s_decode (&m, &reason);
        assert (request && request->form == LOOKUP_FORM_BINARY);
        assert (request->token_len == 16 && request->hash_count == 0);
        lookup_request_destroy (&request);
        s_msg_free (&m);
    }

    //  Untagged: [token_len][msgpack].
    s_msg_init (&m);
    s_msg_u32 (&m, 100);
    s_msg_hashes (&m, three, 2);
    request = s_decode (&m, &reason);
    assert (request && request->type == LOOKUP_REQUEST_LOOKUP);
    assert (request->form == LOOKUP_FORM_UNTAGGED);
    assert (request->token_len == 100 && request->hash_count == 2);
    assert (s_streq (request->hashes[1], three[1]));
    lookup_request_destroy (&request);
    s_msg_free (&m);
    //  Untagged, empty list.
    s_msg_init (&m);
    s_msg_u32 (&m, 0);
    s_msg_hashes (&m, NULL, 0);
    request = s_decode (&m, &reason);
    assert (request && request->form == LOOKUP_FORM_UNTAGGED && request->hash_count == 0);
    lookup_request_destroy (&request);
    s_msg_free (&m);

    //  reset, ping, stats.
    const char *tags[] = {"reset", "ping", "stats"};
    lookup_request_type_t types[] = {LOOKUP_REQUEST_RESET, LOOKUP_REQUEST_PING,
                                     LOOKUP_REQUEST_STATS};
    for (int i = 0; i < 3; i++) {
        s_msg_init (&m);
        s_msg_str (&m, tags[i]);
        request = s_decode (&m, &reason);
        assert (request && request->type == types[i]);
        assert (request->form == LOOKUP_FORM_NONE && request->hash_count == 0);
        assert (s_streq (lookup_request_type_name (request->type), tags[i]));
        lookup_request_destroy (&request);
        s_msg_free (&m);
        //  ... with an extra frame
        s_msg_init (&m);
        s_msg_str (&m, tags[i]);
        s_msg_str (&m, "x");
        s_expect_refused (&m, "extra frames after the tag", verbose);
    }

    //  ---- malformed ----
    //  No frames at all.
    s_msg_init (&m);
    s_expect_refused (&m, "empty message", verbose);
    //  Unknown tags, including a near miss, an empty tag and a tag with a NUL.
    const char *unknown[] = {"lookupx", "Lookup", "RESET", "", "hello", "pin"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        s_msg_init (&m);
        s_msg_str (&m, unknown[i]);
        s_expect_refused (&m, "unknown tag", verbose);
    }
    s_msg_init (&m);
    s_msg_add (&m, "ping\0", 5);
    s_expect_refused (&m, "unknown tag", verbose);
    //  A 4-byte frame alone is not an untagged lookup (one frame missing).
    s_msg_init (&m);
    s_msg_u32 (&m, 5);
    s_expect_refused (&m, "unknown tag", verbose);
    //  Untagged with an extra frame, and untagged with a 3- or 5-byte token_len.
    s_msg_init (&m);
    s_msg_u32 (&m, 5);
    s_msg_hashes (&m, three, 1);
    s_msg_str (&m, "");
    s_expect_refused (&m, "unknown tag", verbose);
    s_msg_init (&m);
    s_msg_add (&m, "\0\0\1", 3);
    s_msg_hashes (&m, three, 1);
    s_expect_refused (&m, "unknown tag", verbose);
    s_msg_init (&m);
    s_msg_add (&m, "\0\0\0\0\1", 5);
    s_msg_hashes (&m, three, 1);
    s_expect_refused (&m, "unknown tag", verbose);
    //  A token_len spelling "ping" is read as a tag, so as a ping with an extra frame.
    s_msg_init (&m);
    s_msg_str (&m, "ping");
    s_msg_hashes (&m, three, 1);
    s_expect_refused (&m, "extra frames after the tag", verbose);

    //  Missing frames after lookup.
    s_msg_init (&m);
    s_msg_str (&m, "lookup");
    s_expect_refused (&m, "missing frames after lookup", verbose);
    s_msg_init (&m);
    s_msg_str (&m, "lookup");
    s_msg_u32 (&m, 16);
    s_expect_refused (&m, "missing frames after lookup", verbose);
    //  A fifth frame after the binary form is vLLM's apply_eagle: one byte 0 or 1, nothing
    //  else; a sixth is one too many.
    s_msg_init (&m);
    s_msg_str (&m, "lookup");
    s_msg_u32 (&m, 16);
    s_msg_u16 (&m, 2);
    s_msg_add (&m, "ab", 2);
    s_msg_str (&m, "extra");
    s_expect_refused (&m, "apply_eagle frame is not one byte 0 or 1", verbose);
    for (uint8_t flag = 0; flag < 3; flag++) {
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 16);
        s_msg_u16 (&m, 2);
        s_msg_add (&m, "ab", 2);
        s_msg_add (&m, &flag, 1);
        if (flag == 2) {
            s_expect_refused (&m, "apply_eagle frame is not one byte 0 or 1", verbose);
            continue;
        }
        const char *reason = NULL;
        lookup_request_t *request = lookup_request_decode (m.frames, m.count, &reason);
        assert (request && request->form == LOOKUP_FORM_BINARY_EAGLE);
        assert (request->hash_count == 1 && strcmp (request->hashes[0], "6162") == 0);
        assert (request->apply_eagle == (flag == 1));
        lookup_request_destroy (&request);
    }
    s_msg_init (&m);
    s_msg_str (&m, "lookup");
    s_msg_u32 (&m, 16);
    s_msg_u16 (&m, 2);
    s_msg_add (&m, "ab", 2);
    s_msg_add (&m, "\0", 1);
    s_msg_add (&m, "", 0);
    s_expect_refused (&m, "extra frames", verbose);
    //  token_len frames of 0, 3, 5 and 8 bytes, in both tagged forms.
    const size_t bad_sizes[] = {0, 3, 5, 8};
    for (size_t i = 0; i < 4; i++) {
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_add (&m, "\0\0\0\0\0\0\0\x10", bad_sizes[i]);
        s_msg_hashes (&m, three, 1);
        s_expect_refused (&m, "token_len frame is not 4 bytes", verbose);
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_add (&m, "\0\0\0\0\0\0\0\x10", bad_sizes[i]);
        s_msg_u16 (&m, 1);
        s_msg_add (&m, "a", 1);
        s_expect_refused (&m, "token_len frame is not 4 bytes", verbose);
    }
    //  hash_len frames that are not 2 bytes.
    for (size_t size = 0; size <= 4; size += 1) {
        if (size == 2)
            continue;
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 16);
        s_msg_add (&m, "\0\1\0\0", size);
        s_msg_add (&m, "abcd", 4);
        s_expect_refused (&m, "hash_len frame is not 2 bytes", verbose);
    }
    //  A blob that is not a multiple of hash_len.
    s_msg_init (&m);
    s_msg_str (&m, "lookup");
    s_msg_u32 (&m, 16);
    s_msg_u16 (&m, 4);
    s_msg_add (&m, "abcdefg", 7);
    s_expect_refused (&m, "hash blob is not a multiple of hash_len", verbose);
    //  hash_len 0 with data.
    s_msg_init (&m);
    s_msg_str (&m, "lookup");
    s_msg_u32 (&m, 16);
    s_msg_u16 (&m, 0);
    s_msg_add (&m, "x", 1);
    s_expect_refused (&m, "hash_len 0 with hash data", verbose);

    //  Bad msgpack: empty frame, not an array, truncated headers, counts larger than the
    //  frame, strings running past the frame, trailing bytes.
    struct {
        const char *bytes;
        size_t size;
        const char *reason;
    } bad[] = {
        {"", 0, "empty msgpack frame"},
        {"\xc0", 1, "msgpack value is not an array"}, //  nil
        {"\x81\xa1"
         "a\x01",
         4, "msgpack value is not an array"}, //  map
        {"\xa2"
         "ab",
         3, "msgpack value is not an array"},         //  a bare string
        {"\x05", 1, "msgpack value is not an array"}, //  an int
        {"\xc1", 1, "msgpack value is not an array"}, //  never-used byte
        {"\xdc\x00", 2, "truncated msgpack array header"},
        {"\xdd\x00\x00\x01", 4, "truncated msgpack array header"},
        {"\x92\xa2"
         "ab",
         4, "truncated msgpack array"},
        {"\x9f", 1, "truncated msgpack array"},
        {"\xdc\xff\xff\xa2"
         "ab",
         6, "truncated msgpack array"},
        //  an array32 header claiming four billion entries, in 5 bytes: refused, not allocated
        {"\xdd\xff\xff\xff\xff", 5, "too many hashes"},
        {"\xdd\x00\x0f\x42\x41", 5, "too many hashes"}, //  1000001
        {"\x91\xa4"
         "ab",
         4, "truncated msgpack string"},
        {"\x91\xd9", 2, "truncated msgpack string header"},
        {"\x91\xda\x00", 3, "truncated msgpack string header"},
        {"\x91\xdb\x00\x00\x00", 5, "truncated msgpack string header"},
        {"\x91\xdb\xff\xff\xff\xff"
         "ab",
         8, "truncated msgpack string"},
        {"\x91\xa2"
         "abc",
         5, "trailing bytes after the msgpack array"},
        {"\x90\x90", 2, "trailing bytes after the msgpack array"},
        //  entries that are not strings: int, nil, bin, nested array, map, float, bool
        {"\x91\x01", 2, "hash entry is not a string"},
        {"\x91\xc0", 2, "hash entry is not a string"},
        {"\x91\xc4\x02\xab\xcd", 5, "hash entry is not a string"},
        {"\x91\x91\xa2"
         "ab",
         5, "hash entry is not a string"},
        {"\x91\x80", 2, "hash entry is not a string"},
        {"\x91\xca\x00\x00\x00\x00", 6, "hash entry is not a string"},
        {"\x92\xa2"
         "ab\xc3",
         5, "hash entry is not a string"},
        //  strings that are not hashes
        {"\x91\xa0", 2, "empty hash string"},
        {"\x91\xa3"
         "abc",
         5, "hash string of odd length"},
        {"\x91\xa2"
         "xy",
         4, "hash string is not hex"},
        {"\x91\xa2"
         "a ",
         4, "hash string is not hex"},
        {"\x91\xa2"
         "a\0",
         4, "hash string is not hex"},
        {"\x92\xa2"
         "ab\xa2"
         "g0",
         7, "hash string is not hex"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        //  In the tagged and in the untagged form.
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 16);
        s_msg_add (&m, bad[i].bytes, bad[i].size);
        s_expect_refused (&m, bad[i].reason, verbose);
        s_msg_init (&m);
        s_msg_u32 (&m, 16);
        s_msg_add (&m, bad[i].bytes, bad[i].size);
        s_expect_refused (&m, bad[i].reason, verbose);
    }
    //  A string too long to be a hash (more than 2 x 65535 hex digits), packed as str32.
    {
        size_t len = 2 * LOOKUP_REQUEST_MAX_HASH_BYTES + 2;
        char *huge = (char *) malloc (len + 1);
        assert (huge);
        memset (huge, 'a', len);
        huge[len] = 0;
        const char *list[] = {huge};
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 16);
        s_msg_hashes (&m, list, 1);
        s_expect_refused (&m, "hash string too long", verbose);
        free (huge);
    }
    //  Huge hash counts, for real: one more than the cap in each form is refused; the cap
    //  itself is accepted.
    {
        size_t n = LOOKUP_REQUEST_MAX_HASHES + 1;
        msgpack_sbuffer *buffer;
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 16);
        msgpack_packer pk = s_msg_packer (&m, &buffer);
        msgpack_pack_array (&pk, n);
        for (size_t i = 0; i < n; i++) {
            msgpack_pack_str (&pk, 2);
            msgpack_pack_str_body (&pk, "0a", 2);
        }
        s_msg_add (&m, buffer->data, buffer->size);
        s_expect_refused (&m, "too many hashes", verbose);

        uint8_t *blob = (uint8_t *) calloc (n, 1);
        assert (blob);
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 16);
        s_msg_u16 (&m, 1);
        s_msg_add (&m, blob, n);
        s_expect_refused (&m, "too many hashes", verbose);
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 16);
        s_msg_u16 (&m, 1);
        s_msg_add (&m, blob, n - 1);
        request = s_decode (&m, &reason);
        assert (request && request->hash_count == LOOKUP_REQUEST_MAX_HASHES);
        assert (s_streq (request->hashes[n - 2], "00"));
        lookup_request_destroy (&request);
        s_msg_free (&m);
        free (blob);
    }
    //  The decoder agrees with msgpack-c's unpacker on what it accepts.
    {
        s_msg_init (&m);
        s_msg_str (&m, "lookup");
        s_msg_u32 (&m, 16);
        s_msg_hashes (&m, three, 3);
        request = s_decode (&m, &reason);
        assert (request);
        msgpack_unpacked unpacked;
        msgpack_unpacked_init (&unpacked);
        size_t offset = 0;
        int rc = msgpack_unpack_next (&unpacked, (const char *) m.frames[2].data, m.frames[2].size,
                                      &offset);
        assert (rc == MSGPACK_UNPACK_SUCCESS && offset == m.frames[2].size);
        msgpack_object array = unpacked.data;
        assert (array.type == MSGPACK_OBJECT_ARRAY);
        assert (array.via.array.size == request->hash_count);
        for (uint32_t i = 0; i < array.via.array.size; i++) {
            msgpack_object_str str = array.via.array.ptr[i].via.str;
            assert (str.size == request->hash_lens[i]);
            assert (memcmp (str.ptr, request->hashes[i], str.size) == 0);
        }
        msgpack_unpacked_destroy (&unpacked);
        lookup_request_destroy (&request);
        s_msg_free (&m);
    }
    assert (s_streq (lookup_request_form_name (LOOKUP_FORM_UNTAGGED), "untagged"));
    if (verbose)
        printf ("\n");
}
