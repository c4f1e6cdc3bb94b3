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

    The module's only state is its table of small ints (immutable, made at import). It does
    not link libkvpool: it only makes the arrays and the lists.
    =========================================================================
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define TENANT_MARK '\x1f'

typedef struct {
    PyObject ob_base; //  PyObject_HEAD, spelled out
    Py_ssize_t n;
    const char **table; //  n pointers, each to a NUL-ended name
    PyObject **refs;    //  the keys the table points into (NULL when copied)
    char *copies;       //  the names, NUL-ended one after the other (when copied)
} key_table_t;

static void
s_key_table_dealloc (key_table_t *self)
{
    if (self->refs)
        for (Py_ssize_t i = 0; i < self->n; i++)
            Py_XDECREF (self->refs[i]);
    PyMem_Free (self->refs);
    PyMem_Free (self->table);
    PyMem_Free (self->copies);
    Py_TYPE (self)->tp_free ((PyObject *) self);
}

//  The UTF-8 bytes of key in *data, *size; 0, or -1 with ValueError set. *mutable is set for
//  a bytearray.

static int
s_key_bytes (PyObject *key, const char **data, Py_ssize_t *size, int *mutable)
{
    if (PyUnicode_Check (key) && PyUnicode_IS_COMPACT_ASCII (key)) {
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
    if (memchr (*data, 0, (size_t) *size)) {
        PyErr_SetString (PyExc_ValueError, "a key holds a NUL byte");
        return -1;
    }
    return 0;
}

static PyObject *
s_key_table_new (PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"keys", "prefix", NULL};
    PyObject *keys;
    Py_buffer prefix = {0};
    if (!PyArg_ParseTupleAndKeywords (args, kwargs, "O|y*", kwlist, &keys, &prefix))
        return NULL;
    PyObject *seq = PySequence_Fast (keys, "keys must be a sequence");
    if (!seq) {
        PyBuffer_Release (&prefix);
        return NULL;
    }
    key_table_t *self = (key_table_t *) type->tp_alloc (type, 0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE (seq);
    PyObject **items = PySequence_Fast_ITEMS (seq);
    if (!self)
        goto failed;
    self->n = n;
    self->table = PyMem_Calloc ((size_t) n + 1, sizeof (char *));
    self->refs = PyMem_Calloc ((size_t) n + 1, sizeof (PyObject *));
    if (!self->table || !self->refs) {
        PyErr_NoMemory ();
        goto failed;
    }
    //  One pass: every key's bytes, checked, and a reference to it.
    int copy = prefix.len > 0;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = items[i];
        const char *data;
        Py_ssize_t size;
        if (s_key_bytes (key, &data, &size, &copy))
            goto failed;
        if (prefix.len == 0 && size > 0 && data[0] == TENANT_MARK) {
            PyErr_SetString (PyExc_ValueError, "a key begins with the tenant mark");
            goto failed;
        }
        Py_INCREF (key);
        self->refs[i] = key;
        self->table[i] = data;
        total += prefix.len + size + 1;
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
            if (s_key_bytes (self->refs[i], &data, &size, &unused))
                goto failed;
            memcpy (at, prefix.buf, (size_t) prefix.len);
            memcpy (at + prefix.len, data, (size_t) size);
            at[prefix.len + size] = 0;
            self->table[i] = at;
            at += prefix.len + size + 1;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            Py_CLEAR (self->refs[i]);
        PyMem_Free (self->refs);
        self->refs = NULL;
    }
    PyBuffer_Release (&prefix);
    Py_DECREF (seq);
    return (PyObject *) self;

failed:
    PyBuffer_Release (&prefix);
    Py_DECREF (seq);
    Py_XDECREF (self);
    return NULL;
}

static Py_ssize_t
s_key_table_len (key_table_t *self)
{
    return self->n;
}

static PyObject *
s_key_table_address (key_table_t *self, void *closure)
{
    (void) closure;
    return PyLong_FromVoidPtr ((void *) self->table);
}

static PyObject *
s_key_table_item (key_table_t *self, Py_ssize_t i)
{
    if (i < 0 || i >= self->n) {
        PyErr_SetString (PyExc_IndexError, "KeyTable index out of range");
        return NULL;
    }
    return PyBytes_FromString (self->table[i]);
}

static PyObject *
s_key_table_names (key_table_t *self, PyObject *unused)
{
    (void) unused;
    PyObject *list = PyList_New (self->n);
    if (!list)
        return NULL;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        PyObject *name = PyBytes_FromString (self->table[i]);
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
    Py_ssize_t n = view.len / view.itemsize;
    PyObject *list = PyList_New (n);
    if (list) {
        for (Py_ssize_t i = 0; i < n; i++) {
            long long value =
                wide ? ((const int64_t *) view.buf)[i] : ((const int32_t *) view.buf)[i];
            PyObject *item = s_int (value);
            if (!item) {
                Py_CLEAR (list);
                break;
            }
            PyList_SET_ITEM (list, i, item);
        }
    }
    PyBuffer_Release (&view);
    return list;
}

static PyMethodDef s_methods[] = {
    {"int_list", (PyCFunction) s_int_list, METH_O,
     "int_list(results) - list(results) for an array.array of 'i' or 'q'."},
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
