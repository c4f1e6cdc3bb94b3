/*  rpc_calls.c - requests out and waiting for their reply (rpc_calls.h).

    A list in the order calls were made, which is their deadline order for an owner that
    gives every call the same timeout (so expiry looks at the head only, as long as the
    head is not due), and a hash from id to the call's place in the list, so a reply finds
    its call at once however many are out. An owner with calls of several timeouts still
    gets each one expired: the walk goes on past calls not yet due.
*/
#include "dataplane/rpc_calls.h"

#include <assert.h>
#include <czmq.h>

typedef struct {
    uint64_t id;
    void *handle;
    int64_t deadline;
} call_t;

struct _rpc_calls_t {
    zlistx_t *order; //  call_t, oldest first
    zhashx_t *by_id; //  &call->id -> the call's list handle
    uint64_t next_id;
};

static size_t
s_id_hash (const void *key)
{
    uint64_t id = *(const uint64_t *) key;
    return (size_t) (id * 0x9E3779B97F4A7C15ull);
}

static int
s_id_compare (const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
    return x < y ? -1 : x > y;
}

rpc_calls_t *
rpc_calls_new (void)
{
    rpc_calls_t *self = (rpc_calls_t *) zmalloc (sizeof (rpc_calls_t));
    self->order = zlistx_new ();
    self->by_id = zhashx_new ();
    assert (self->order && self->by_id);
    zhashx_set_key_hasher (self->by_id, s_id_hash);
    zhashx_set_key_comparator (self->by_id, s_id_compare);
    zhashx_set_key_duplicator (self->by_id, NULL);
    zhashx_set_key_destructor (self->by_id, NULL);
    return self;
}

void
rpc_calls_destroy (rpc_calls_t **self_p)
{
    rpc_calls_t *self = *self_p;
    if (!self)
        return;
    for (call_t *call = (call_t *) zlistx_first (self->order); call;
         call = (call_t *) zlistx_next (self->order))
        free (call);
    zlistx_destroy (&self->order);
    zhashx_destroy (&self->by_id);
    free (self);
    *self_p = NULL;
}

uint64_t
rpc_calls_next_id (rpc_calls_t *self)
{
    return ++self->next_id;
}

uint64_t
rpc_calls_add (rpc_calls_t *self, void *handle, int64_t deadline)
{
    call_t *call = (call_t *) zmalloc (sizeof (call_t));
    call->id = ++self->next_id;
    call->handle = handle;
    call->deadline = deadline;
    void *where = zlistx_add_end (self->order, call);
    assert (where);
    int rc = zhashx_insert (self->by_id, &call->id, where);
    assert (rc == 0);
    return call->id;
}

//  Takes the call at list handle where out of both indexes; returns its handle.
static void *
s_remove (rpc_calls_t *self, void *where)
{
    call_t *call = (call_t *) zlistx_handle_item (where);
    zhashx_delete (self->by_id, &call->id);
    zlistx_delete (self->order, where);
    void *handle = call->handle;
    free (call);
    return handle;
}

void *
rpc_calls_take (rpc_calls_t *self, uint64_t id)
{
    void *where = zhashx_lookup (self->by_id, &id);
    return where ? s_remove (self, where) : NULL;
}

void *
rpc_calls_expired (rpc_calls_t *self, int64_t now)
{
    for (call_t *call = (call_t *) zlistx_first (self->order); call;
         call = (call_t *) zlistx_next (self->order))
        if (call->deadline <= now)
            return s_remove (self, zlistx_cursor (self->order));
    return NULL;
}

void *
rpc_calls_first (rpc_calls_t *self)
{
    return zlistx_first (self->order) ? s_remove (self, zlistx_cursor (self->order)) : NULL;
}

size_t
rpc_calls_size (rpc_calls_t *self)
{
    return zlistx_size (self->order);
}

void
rpc_calls_test (bool verbose)
{
    rpc_calls_t *calls = rpc_calls_new ();
    int a, b, c;
    uint64_t ia = rpc_calls_add (calls, &a, 100);
    uint64_t ib = rpc_calls_add (calls, &b, 200);
    uint64_t free_id = rpc_calls_next_id (calls);
    uint64_t ic = rpc_calls_add (calls, &c, 150);
    assert (ia && ib > ia && free_id > ib && ic > free_id);
    assert (rpc_calls_size (calls) == 3);
    //  A reply to a request nobody waits for, or to no request, matches nothing.
    assert (rpc_calls_take (calls, free_id) == NULL);
    assert (rpc_calls_take (calls, 9999) == NULL);
    //  Nothing due yet; then the due ones, each once, oldest first.
    assert (rpc_calls_expired (calls, 99) == NULL);
    assert (rpc_calls_expired (calls, 160) == &a);
    assert (rpc_calls_expired (calls, 160) == &c);
    assert (rpc_calls_expired (calls, 160) == NULL);
    //  A late reply to an expired call is dropped; b is answered once.
    assert (rpc_calls_take (calls, ia) == NULL);
    assert (rpc_calls_take (calls, ib) == &b);
    assert (rpc_calls_take (calls, ib) == NULL);
    assert (rpc_calls_size (calls) == 0);
    //  Many out: each found by its id.
    uint64_t ids[1000];
    for (int i = 0; i < 1000; i++)
        ids[i] = rpc_calls_add (calls, (void *) (intptr_t) (i + 1), 1000 + i);
    for (int i = 999; i >= 500; i--)
        assert (rpc_calls_take (calls, ids[i]) == (void *) (intptr_t) (i + 1));
    size_t left = 0;
    while (rpc_calls_first (calls))
        left++;
    assert (left == 500);
    rpc_calls_add (calls, &a, 0); //  destroyed with one out: the handle is not ours
    rpc_calls_destroy (&calls);
    assert (calls == NULL);
    rpc_calls_destroy (&calls);
    if (verbose)
        printf ("rpc_calls ok ");
}
