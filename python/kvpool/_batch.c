/*  =========================================================================
    _batch.c - kvpool._batch: a batch's arguments and results, each in one C loop

    The binding's batch methods hand libkvpool an array of C strings (char *[n]) and turn the
    array of statuses or sizes it fills into a list. Done in Python, each costs a few
    operations per key: for a thousand keys, more than the C call that answers them from the
    read index. This module does each in one loop in C.

        table = _batch.KeyTable(keys, prefix)   # prefix: b"" or a tenant's b"\x1f...\n"
        table.address                           # char *[len(table)]
        table.names()                           # the node's names, a list of bytes
        table[i]                                # one of them

    A table passes itself to a ctypes function's c_void_p argument (_as_parameter_ is its
    address), and the array lives as long as the table.

    Without a prefix each pointer is the key's own UTF-8 bytes (a str keeps them, ending with
    a NUL; so does a bytes object), and the table holds a reference to every key, so the
    array stays valid while a call runs without the GIL, whatever other threads do to the
    list. With a prefix, or for a bytearray (which another thread could resize), the names
    are copied into one buffer the table owns.

    KeyTable raises ValueError for a batch it does not take, and the caller then names the
    keys one by one, which also gives each bad key its own status: an item that is not str,
    bytes or bytearray; a str that does not encode to UTF-8 (a lone surrogate); a key with a
    NUL byte (C strings end there); without a prefix, a key beginning with \x1f (the tenant
    mark: a default-tenant key may not name another tenant's).

        _batch.int_list(results)                # list(results), results an array.array
                                                # of "i" or "q" (statuses, sizes)

        rc, out = _batch.lookup(fn, handle, keys, prefix, wide)

        rc, out = _batch.lookup(fn, handle, keys, prefix, wide, local)

    lookup is a whole read-only batch call in one: fn is the address of a libkvpool function
    shaped like kvpool_exist_batch_lens (handle, n, keys, lens, results), handle a kvpool_t *;
    it makes the key array as KeyTable does (and raises as it does, but for a NUL byte: the
    key goes with its length and the node refuses it) with each key's length, which a str
    knows and the library would otherwise measure, calls fn without the GIL, and
    returns fn's result with the list of the n results (int32 each, or int64 when wide). A
    thousand-key exist is then one Python call where it was a table, a results array, a
    ctypes call and a list, each with its own cost.

    local, when given, is the address of fn's form answered on this machine alone
    (kvpool_exist_batch_local): it is called first, with the GIL kept (it never waits), on
    a key array that takes no reference to its keys, since no other thread can run to
    change them; only the keys it leaves (not in the node's read index) go to fn, without the
    GIL, as above. On the node's machine a batch of stored keys is then answered without
    touching each key's reference count twice.

    The module's only state is its table of small ints (immutable, made at import). It does
    not link libkvpool: it makes the arrays and the lists, and calls what it is given.
    =========================================================================
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define TENANT_MARK '\x1f'

//  A batch's key array and what keeps it valid.
typedef struct {
    Py_ssize_t n;
    const char **table; //  n pointers, each to a NUL-ended name; owns the block
    PyObject **refs;    //  the keys the table points into (NULL when copied), in the block
    int held;           //  refs hold a reference each (else the caller keeps the GIL)
    char *copies;       //  the names, NUL-ended one after the other (when copied)
    size_t *lens;       //  each name's length, when asked for (else NULL), in the block
} key_array_t;

typedef struct {
    PyObject ob_base; //  PyObject_HEAD, spelled out
    key_array_t keys;
} key_table_t;

static void
s_key_array_fini (key_array_t *self)
{
    if (self->refs && self->held)
        for (Py_ssize_t i = 0; i < self->n; i++)
            Py_DECREF (self->refs[i]);
    PyMem_Free ((void *) self->table); //  the block of table, refs and lens
    PyMem_Free (self->copies);
    memset (self, 0, sizeof *self);
}

static void
s_key_table_dealloc (key_table_t *self)
{
    s_key_array_fini (&self->keys);
    Py_TYPE (self)->tp_free ((PyObject *) self);
}

//  The UTF-8 bytes of key in *data, *size; 0, or -1 with ValueError set. *mutable is set for
//  a bytearray. A NUL byte is refused when nul_check.

//  Inlined: one call per key was a tenth of a thousand-key lookup (measured).
static inline __attribute__ ((always_inline)) int
s_key_bytes (PyObject *key, const char **data, Py_ssize_t *size, int *mutable, int nul_check)
{
    //  The common key first, by its exact type (a pointer compare, no look at the type's
    //  flags); a subclass of str takes the next branch.
    if ((Py_IS_TYPE (key, &PyUnicode_Type) || PyUnicode_Check (key))
        && PyUnicode_IS_COMPACT_ASCII (key)) {
        //  ASCII: the characters are the UTF-8 bytes, kept NUL-ended in the object.
        *data = (const char *) PyUnicode_DATA (key);
        *size = PyUnicode_GET_LENGTH (key);
    }
    else if (PyUnicode_Check (key)) {
        *data = PyUnicode_AsUTF8AndSize (key, size);
        if (!*data) {
            PyErr_Clear ();
            PyErr_SetString (PyExc_ValueError, "a key does not encode to UTF-8");
            return -1;
        }
    }
    else if (PyBytes_Check (key)) {
        *data = PyBytes_AS_STRING (key);
        *size = PyBytes_GET_SIZE (key);
    }
    else if (PyByteArray_Check (key)) {
        *data = PyByteArray_AS_STRING (key);
        *size = PyByteArray_GET_SIZE (key);
        *mutable = 1;
    }
    else {
        PyErr_SetString (PyExc_ValueError, "a key is neither str nor bytes");
        return -1;
    }
    if (nul_check && memchr (*data, 0, (size_t) *size)) {
        PyErr_SetString (PyExc_ValueError, "a key holds a NUL byte");
        return -1;
    }
    return 0;
}

//  Fills self (zeroed) with the array of keys (any sequence), each after prefix, and their
//  lengths when with_lens. hold: take a reference to every key the table points into, so
//  that it stays valid without the GIL; without, it is valid only while the caller keeps the
//  GIL and keys. 0, or -1 with an exception set (ValueError for a batch it does not take;
//  self then holds nothing).
//
//  With the lengths, a key's NUL bytes are not looked for: the key goes with its whole
//  length, no name in the read index holds a NUL, and the node refuses such a key
//  (INVALID_KEY, for that key). Measured, the scan was a quarter of what this module adds to
//  a thousand-key exist. Without them, C ends the key at its first NUL, so it is refused
//  here.
static int
s_key_array_init (key_array_t *self, PyObject *keys, const char *prefix, Py_ssize_t prefix_len,
                  int with_lens, int hold)
{
    PyObject *seq = PySequence_Fast (keys, "keys must be a sequence");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE (seq);
    PyObject **items = PySequence_Fast_ITEMS (seq);
    //  One block: the table (with a NULL after the last), the references, the lengths.
    _Static_assert(sizeof (size_t) == sizeof (void *), "the lengths share the block's slots");
    size_t slots = (size_t) n + 1;
    void **block = PyMem_Malloc (slots * (with_lens ? 3 : 2) * sizeof (void *));
    if (!block) {
        Py_DECREF (seq);
        PyErr_NoMemory ();
        return -1;
    }
    self->table = (const char **) block;
    self->refs = (PyObject **) (block + slots);
    self->lens = with_lens ? (size_t *) (block + 2 * slots) : NULL;
    self->table[n] = NULL;
    self->held = hold;
    //  One pass: every key's bytes, checked, and a reference to it. (self->n counts the
    //  references held, for a failure half way.)
    int copy = prefix_len > 0;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = items[i];
        const char *data;
        Py_ssize_t size;
        if (s_key_bytes (key, &data, &size, &copy, !with_lens))
            goto failed;
        if (prefix_len == 0 && size > 0 && data[0] == TENANT_MARK) {
            PyErr_SetString (PyExc_ValueError, "a key begins with the tenant mark");
            goto failed;
        }
        if (hold)
            Py_INCREF (key);
        self->refs[i] = key;
        self->n = i + 1;
        self->table[i] = data;
        if (with_lens)
            self->lens[i] = (size_t) (prefix_len + size);
        total += prefix_len + size + 1;
    }
    if (copy) {
        //  Names copied into one buffer: the prefix's case, and a bytearray's.
        self->copies = PyMem_Malloc ((size_t) total + 1);
        if (!self->copies) {
            PyErr_NoMemory ();
            goto failed;
        }
        char *at = self->copies;
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *data;
            Py_ssize_t size;
            int unused;
            //  Read again: nothing ran since the first pass, so this cannot fail.
            if (s_key_bytes (self->refs[i], &data, &size, &unused, 0))
                goto failed;
            memcpy (at, prefix, (size_t) prefix_len);
            memcpy (at + prefix_len, data, (size_t) size);
            at[prefix_len + size] = 0;
            self->table[i] = at;
            at += prefix_len + size + 1;
        }
        if (hold)
            for (Py_ssize_t i = 0; i < n; i++)
                Py_CLEAR (self->refs[i]);
        self->refs = NULL;
    }
    Py_DECREF (seq);
    return 0;

failed:
    Py_DECREF (seq);
    s_key_array_fini (self);
    return -1;
}

static PyObject *
s_key_table_new (PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"keys", "prefix", NULL};
    PyObject *keys;
    Py_buffer prefix = {0};
    if (!PyArg_ParseTupleAndKeywords (args, kwargs, "O|y*", kwlist, &keys, &prefix))
        return NULL;
    key_table_t *self = (key_table_t *) type->tp_alloc (type, 0);
    if (self && s_key_array_init (&self->keys, keys, prefix.buf, prefix.len, 0, 1))
        Py_CLEAR (self);
    PyBuffer_Release (&prefix);
    return (PyObject *) self;
}

static Py_ssize_t
s_key_table_len (key_table_t *self)
{
    return self->keys.n;
}

static PyObject *
s_key_table_address (key_table_t *self, void *closure)
{
    (void) closure;
    return PyLong_FromVoidPtr ((void *) self->keys.table);
}

static PyObject *
s_key_table_item (key_table_t *self, Py_ssize_t i)
{
    if (i < 0 || i >= self->keys.n) {
        PyErr_SetString (PyExc_IndexError, "KeyTable index out of range");
        return NULL;
    }
    return PyBytes_FromString (self->keys.table[i]);
}

static PyObject *
s_key_table_names (key_table_t *self, PyObject *unused)
{
    (void) unused;
    PyObject *list = PyList_New (self->keys.n);
    if (!list)
        return NULL;
    for (Py_ssize_t i = 0; i < self->keys.n; i++) {
        PyObject *name = PyBytes_FromString (self->keys.table[i]);
        if (!name) {
            Py_DECREF (list);
            return NULL;
        }
        PyList_SET_ITEM (list, i, name);
    }
    return list;
}

static PyMethodDef s_key_table_methods[] = {{"names", (PyCFunction) s_key_table_names, METH_NOARGS,
                                             "The node's name of every key, a list of bytes."},
                                            {NULL}};

static PyGetSetDef s_key_table_getset[] = {
    {"address", (getter) s_key_table_address, NULL,
     "The address of the char *[n] array, valid while the table lives.", NULL},
    {"_as_parameter_", (getter) s_key_table_address, NULL,
     "What ctypes passes for the table: its address.", NULL},
    {NULL}};

static PySequenceMethods s_key_table_sequence = {
    .sq_length = (lenfunc) s_key_table_len,
    .sq_item = (ssizeargfunc) s_key_table_item,
};

//  PyVarObject_HEAD_INIT ends with its own comma, which the formatter cannot see.
// clang-format off
static PyTypeObject s_key_table_type = {
    PyVarObject_HEAD_INIT (NULL, 0)
    .tp_name = "kvpool._batch.KeyTable",
    .tp_doc = "KeyTable(keys, prefix=b'') - C's key array (char *[n]) of a batch's keys.",
    .tp_basicsize = sizeof (key_table_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = s_key_table_new,
    .tp_dealloc = (destructor) s_key_table_dealloc,
    .tp_methods = s_key_table_methods,
    .tp_getset = s_key_table_getset,
    .tp_as_sequence = &s_key_table_sequence,
};
// clang-format on

//  The statuses and small sizes a batch answers, made once: a list of them takes a reference
//  each instead of a PyLong_FromLong call each.
#define SMALL_MIN (-64)
#define SMALL_MAX 64
static PyObject *s_small[SMALL_MAX - SMALL_MIN];

static inline PyObject *
s_int (long long value)
{
    if (value >= SMALL_MIN && value < SMALL_MAX) {
        PyObject *object = s_small[value - SMALL_MIN];
        Py_INCREF (object);
        return object;
    }
    return PyLong_FromLongLong (value);
}

//  A list of the n results at values (int64 each when wide, else int32), or NULL.
static PyObject *
s_list_of (const void *values, Py_ssize_t n, int wide)
{
    PyObject *list = PyList_New (n);
    if (!list)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long value = wide ? ((const int64_t *) values)[i] : ((const int32_t *) values)[i];
        PyObject *item = s_int (value);
        if (!item) {
            Py_DECREF (list);
            return NULL;
        }
        PyList_SET_ITEM (list, i, item);
    }
    return list;
}

static PyObject *
s_int_list (PyObject *module, PyObject *results)
{
    (void) module;
    Py_buffer view;
    if (PyObject_GetBuffer (results, &view, PyBUF_FORMAT) < 0)
        return NULL;
    const char *format = view.format ? view.format : "B";
    int wide;
    if (strcmp (format, "i") == 0 && view.itemsize == 4)
        wide = 0;
    else if ((strcmp (format, "q") == 0 || strcmp (format, "l") == 0) && view.itemsize == 8)
        wide = 1;
    else {
        PyBuffer_Release (&view);
        PyErr_SetString (PyExc_TypeError, "int_list takes an array of 'i' or 'q'");
        return NULL;
    }
    PyObject *list = s_list_of (view.buf, view.len / view.itemsize, wide);
    PyBuffer_Release (&view);
    return list;
}

//  libkvpool's read-only batch calls that take the keys' lengths (kvpool_exist_batch_lens,
//  kvpool_get_size_batch_lens): results is an int or int64_t array of n.
typedef int (*batch_fn_t) (void *handle, size_t n, const char *const *keys, const size_t *lens,
                           void *results);
//  Their forms answered on this machine alone (kvpool_exist_batch_local,
//  kvpool_get_size_batch_local): the positions of the keys left unanswered go to rest.
typedef int (*local_fn_t) (void *handle, size_t n, const char *const *keys, const size_t *lens,
                           void *results, size_t *rest, size_t *nrest);

//  A function's address from a Python int (C has no cast between object and function
//  pointers; the bytes carry over). NULL for None or 0; sets an exception on a bad value.
static void *
s_function (PyObject *address)
{
    if (address == Py_None)
        return NULL;
    void *pointer = PyLong_AsVoidPtr (address);
    return PyErr_Occurred () ? NULL : pointer;
}

//  fn over the keys of seq (a list or tuple) at rest[0 .. nrest), or all of them when rest
//  is NULL, without the GIL; each result goes to its key's place in results, fn's result to
//  *rc_p. Returns 0, or -1 with an exception set.
static int
s_lookup_rest (batch_fn_t fn, void *handle, PyObject *seq, const size_t *rest, size_t nrest,
               const char *prefix, Py_ssize_t prefix_len, int wide, void *results, int *rc_p)
{
    PyObject *subset = seq;
    if (rest) {
        subset = PyList_New ((Py_ssize_t) nrest);
        if (!subset)
            return -1;
        PyObject **items = PySequence_Fast_ITEMS (seq);
        for (size_t j = 0; j < nrest; j++) {
            Py_INCREF (items[rest[j]]);
            PyList_SET_ITEM (subset, (Py_ssize_t) j, items[rest[j]]);
        }
    }
    key_array_t array = {0};
    int rc = s_key_array_init (&array, subset, prefix, prefix_len, 1, 1);
    if (subset != seq)
        Py_DECREF (subset);
    if (rc)
        return -1;
    size_t width = wide ? sizeof (int64_t) : sizeof (int32_t);
    char *answers = PyMem_Calloc (nrest + 1, width);
    if (!answers) {
        s_key_array_fini (&array);
        PyErr_NoMemory ();
        return -1;
    }
    //  The array holds a reference to every key it points into (or copies): other threads
    //  may change the list meanwhile.
    Py_BEGIN_ALLOW_THREADS rc = fn (handle, nrest, array.table, array.lens, answers);
    Py_END_ALLOW_THREADS for (size_t j = 0; j < nrest; j++)
        memcpy ((char *) results + (rest ? rest[j] : j) * width, answers + j * width, width);
    PyMem_Free (answers);
    s_key_array_fini (&array);
    *rc_p = rc;
    return 0;
}

static PyObject *
s_lookup (PyObject *module, PyObject *args)
{
    (void) module;
    PyObject *fn_address, *handle_address, *keys, *local_address = Py_None;
    Py_buffer prefix = {0};
    int wide;
    if (!PyArg_ParseTuple (args, "OOOy*p|O", &fn_address, &handle_address, &keys, &prefix, &wide,
                           &local_address))
        return NULL;
    batch_fn_t fn;
    local_fn_t local;
    void *fn_pointer = s_function (fn_address);
    void *local_pointer = s_function (local_address);
    void *handle = PyErr_Occurred () ? NULL : PyLong_AsVoidPtr (handle_address);
    memcpy (&fn, &fn_pointer, sizeof fn);
    memcpy (&local, &local_pointer, sizeof local);
    if (PyErr_Occurred () || !fn || !handle) {
        PyBuffer_Release (&prefix);
        if (!PyErr_Occurred ())
            PyErr_SetString (PyExc_TypeError, "lookup needs a function and a handle");
        return NULL;
    }
    PyObject *list = NULL;
    PyObject *seq = PySequence_Fast (keys, "keys must be a sequence");
    key_array_t array = {0};
    void *results = NULL;
    size_t *rest = NULL;
    int rc = 0;
    if (!seq)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE (seq);
    size_t width = wide ? sizeof (int64_t) : sizeof (int32_t);
    results = PyMem_Calloc ((size_t) n + 1, width);
    if (!results) {
        PyErr_NoMemory ();
        goto done;
    }
    size_t nrest = (size_t) n;
    if (local && n > 0) {
        //  First what this machine answers alone, with the GIL kept: no message, no wait,
        //  and so no reference to take on every key (nothing else runs meanwhile). Measured
        //  on a thousand keys, the references were a quarter of what this module adds.
        rest = PyMem_Malloc ((size_t) n * sizeof *rest);
        if (!rest) {
            PyErr_NoMemory ();
            goto done;
        }
        if (s_key_array_init (&array, seq, prefix.buf, prefix.len, 1, 0))
            goto done;
        if (local (handle, (size_t) n, array.table, array.lens, results, rest, &nrest) != 0) {
            PyMem_Free (rest);
            rest = NULL;
            nrest = (size_t) n;
        }
        s_key_array_fini (&array);
    }
    //  Then the rest (all keys without a local function), asking the node without the GIL.
    if (nrest > 0
        && s_lookup_rest (fn, handle, seq, rest, nrest, prefix.buf, prefix.len, wide, results, &rc))
        goto done;
    list = s_list_of (results, n, wide);

done:
    PyBuffer_Release (&prefix);
    Py_XDECREF (seq);
    PyMem_Free (results);
    PyMem_Free (rest);
    if (!list)
        return NULL;
    return Py_BuildValue ("(iN)", rc, list);
}

static PyMethodDef s_methods[] = {
    {"int_list", (PyCFunction) s_int_list, METH_O,
     "int_list(results) - list(results) for an array.array of 'i' or 'q'."},
    {"lookup", (PyCFunction) s_lookup, METH_VARARGS,
     "lookup(fn, handle, keys, prefix, wide, local=None) - (rc, results): fn(handle, n, "
     "key array, lengths, results) called without the GIL, fn the address of a function "
     "shaped like kvpool_exist_batch_lens; results int64 when wide. local, the address of "
     "one shaped like kvpool_exist_batch_local, answers first, with the GIL; fn then gets "
     "only the keys it left."},
    {NULL}};

static struct PyModuleDef s_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvpool._batch",
    .m_doc = "A batch's key array and result lists, each built in one C loop "
             "(python/kvpool/_batch.c).",
    .m_methods = s_methods,
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__batch (void)
{
    if (PyType_Ready (&s_key_table_type) < 0)
        return NULL;
    for (int value = SMALL_MIN; value < SMALL_MAX; value++)
        if (!s_small[value - SMALL_MIN] && !(s_small[value - SMALL_MIN] = PyLong_FromLong (value)))
            return NULL;
    PyObject *module = PyModule_Create (&s_module);
    if (!module)
        return NULL;
    Py_INCREF (&s_key_table_type);
    if (PyModule_AddObject (module, "KeyTable", (PyObject *) &s_key_table_type) < 0) {
        Py_DECREF (&s_key_table_type);
        Py_DECREF (module);
        return NULL;
    }
    return module;
}
