"""kvpool._native - loads libkvpool with ctypes and declares its C API (include/kvpool.h).

Where the library is looked for, first match wins:
  1. next to the installed package: `make install` puts this package in
     PREFIX/lib/python3/dist-packages/kvpool and the library in PREFIX/lib, so
     <package>/../../../libkvpool.so (and <package>/libkvpool.so, for a private copy);
  2. $KVPOOL_LIB, the library file itself or the directory holding it;
  3. the source tree's build: <package>/../../build/lib/libkvpool.so;
  4. the system loader's search path (libkvpool.so.1, then libkvpool.so).

Every function is loaded from a ctypes.CDLL, so each call releases the GIL for its duration:
other Python threads run while a call waits for the server or copies bytes. The structures
below mirror the header field for field; ctypes lays them out with the C compiler's rules.

Threads: loading happens once, at import; the declarations are read-only afterwards.
"""

import ctypes
import os

from ctypes import (POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_int,
                    c_int64, c_size_t, c_uint32, c_uint64, c_void_p)

LIBRARY_NAME = "libkvpool.so"
MAX_REPLICAS = 8


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, LIBRARY_NAME)
    if os.path.basename(os.path.dirname(here)) in ("dist-packages", "site-packages"):
        prefix_lib = os.path.normpath(os.path.join(here, "..", "..", ".."))
        yield os.path.join(prefix_lib, LIBRARY_NAME)
        yield os.path.join(prefix_lib, LIBRARY_NAME + ".1")
    env = os.environ.get("KVPOOL_LIB")
    if env:
        yield os.path.join(env, LIBRARY_NAME) if os.path.isdir(env) else env
    yield os.path.normpath(os.path.join(here, "..", "..", "build", "lib", LIBRARY_NAME))


def _load():
    tried = []
    for path in _candidates():
        if os.path.exists(path):
            try:
                return ctypes.CDLL(path), path
            except OSError as exc:
                tried.append("%s (%s)" % (path, exc))
        else:
            tried.append(path + " (absent)")
    for name in (LIBRARY_NAME + ".1", LIBRARY_NAME):
        try:
            return ctypes.CDLL(name), name
        except OSError as exc:
            tried.append("%s (%s)" % (name, exc))
    raise ImportError("kvpool: cannot load %s; build it with `make` or set KVPOOL_LIB. "
                      "Tried: %s" % (LIBRARY_NAME, "; ".join(tried)))


lib, path = _load()


class Options(Structure):
    _fields_ = [("timeout_ms", c_int), ("connect_timeout_ms", c_int), ("fast_path", c_int),
                ("keep_endpoint", c_int), ("curve_secret_file", c_char_p),
                ("curve_server_file", c_char_p)]


class Iov(Structure):
    """kvpool_iov_t and kvpool_buf_t: a pointer and a size (the same layout)."""
    _fields_ = [("data", c_void_p), ("size", c_size_t)]


class PutOptions(Structure):
    _fields_ = [("replica_num", c_uint32), ("preferred_segments", POINTER(c_char_p)),
                ("preferred_segment_count", c_size_t), ("soft_pin", c_bool),
                ("soft_pin_ttl_ms", c_uint64), ("hard_pin", c_bool)]


class Replica(Structure):
    _fields_ = [("segment_id", c_uint32), ("offset", c_uint64)]


class Placement(Structure):
    _fields_ = [("status", c_int), ("size", c_uint64), ("replica_count", c_uint32),
                ("replicas", Replica * MAX_REPLICAS)]


class Segment(Structure):
    _fields_ = [("id", c_uint32), ("name", c_char * 64), ("size", c_uint64), ("used", c_uint64)]


def _stats_fields():
    """kvpool_stats_t: one member per field of kvpool.proto's message Stats, in its order, as
    include/kvpool.h makes it (KVPOOL_STATS_FIELDS); the list is generated from the proto
    (_status_text.STATS), as the C header is."""
    from ._status_text import STATS
    ctype = {"uint64": c_uint64, "uint32": c_uint32, "double": c_double}
    return [(name, ctype[proto_type]) for name, proto_type in STATS]


class Stats(Structure):
    _fields_ = _stats_fields()


class HotCacheStats(Structure):
    """kvpool_hot_cache_stats_t: the counters of the process's hot cache (include/kvpool.h)."""
    _fields_ = [(name, c_uint64) for name in ("hits", "misses", "bytes", "admissions",
                                              "evictions", "invalidations", "entries",
                                              "capacity")]


#   Pointer-array arguments are declared c_void_p: the callers pass the address of an
#   array.array or ctypes array they keep alive across the call, which is the cheapest way to
#   hand ctypes a list of pointers or sizes.
P = c_void_p
K = c_void_p    #  self (kvpool_t *)
_PROTOTYPES = {
    "kvpool_strerror": (c_char_p, [c_int]),
    "kvpool_status_name": (c_char_p, [c_int]),
    "kvpool_options_init": (None, [POINTER(Options)]),
    "kvpool_connect": (K, [c_char_p, POINTER(Options)]),
    "kvpool_destroy": (None, [POINTER(c_void_p)]),
    "kvpool_set_fast_path": (c_bool, [K, c_bool]),
    "kvpool_fast_path": (c_bool, [K]),
    "kvpool_last_error": (c_char_p, [K]),
    "kvpool_ping": (c_int, [K]),
    "kvpool_put": (c_int, [K, c_char_p, P, c_size_t, POINTER(PutOptions)]),
    "kvpool_put_parts": (c_int, [K, c_char_p, P, c_size_t, POINTER(PutOptions)]),
    "kvpool_get": (c_int, [K, c_char_p, POINTER(c_void_p), POINTER(c_size_t)]),
    "kvpool_get_version": (c_int, [K, c_char_p, POINTER(c_void_p), POINTER(c_size_t),
                                   POINTER(c_uint64)]),
    "kvpool_get_into": (c_int64, [K, c_char_p, P, c_size_t]),
    "kvpool_exist": (c_int, [K, c_char_p]),
    "kvpool_get_size": (c_int64, [K, c_char_p]),
    "kvpool_remove": (c_int, [K, c_char_p, c_bool]),
    "kvpool_remove_by_regex": (c_int64, [K, c_char_p, c_bool]),
    "kvpool_connect_error": (c_char_p, []),
    "kvpool_remove_by_regex_counts": (c_int64, [K, c_char_p, c_bool, POINTER(c_uint64),
                                                POINTER(c_uint64)]),
    "kvpool_remove_all": (c_int64, [K, c_bool]),
    "kvpool_reset": (c_int64, [K]),
    "kvpool_put_batch": (c_int, [K, c_size_t, P, P, P, POINTER(PutOptions), P]),
    "kvpool_put_batch_parts": (c_int, [K, c_size_t, P, P, P, POINTER(PutOptions), P]),
    "kvpool_put_batch_placed": (c_int, [K, c_size_t, P, P, P, POINTER(PutOptions), P, P]),
    "kvpool_upsert": (c_int, [K, c_char_p, P, c_size_t, POINTER(PutOptions)]),
    "kvpool_upsert_parts": (c_int, [K, c_char_p, P, c_size_t, POINTER(PutOptions)]),
    "kvpool_upsert_batch_parts": (c_int, [K, c_size_t, P, P, P, POINTER(PutOptions), P]),
    "kvpool_get_range_into": (c_int64, [K, c_char_p, c_uint64, P, c_size_t]),
    "kvpool_get_ranges_into": (c_int, [K, c_size_t, P, P, P, P, P]),
    "kvpool_get_batch_into": (c_int, [K, c_size_t, P, P, P, P]),
    "kvpool_get_batch_into_parts": (c_int, [K, c_size_t, P, P, P, P]),
    "kvpool_exist_batch": (c_int, [K, c_size_t, P, P]),
    "kvpool_exist_batch_lens": (c_int, [K, c_size_t, P, P, P]),
    "kvpool_keys_unpack": (c_int, [c_char_p, c_size_t, c_size_t, P]),
    "kvpool_prefix_match": (ctypes.c_int64, [K, c_size_t, c_size_t, P]),
    "kvpool_get_size_batch": (c_int, [K, c_size_t, P, P]),
    "kvpool_get_size_batch_lens": (c_int, [K, c_size_t, P, P, P]),
    "kvpool_exist_batch_local": (c_int, [K, c_size_t, P, P, P, P, P]),
    "kvpool_get_size_batch_local": (c_int, [K, c_size_t, P, P, P, P, P]),
    "kvpool_remove_batch": (c_int, [K, c_size_t, P, c_bool, P]),
    "kvpool_get_batch": (c_int, [K, c_size_t, P, POINTER(c_void_p), P]),
    "kvpool_values_data": (c_void_p, [c_void_p, c_size_t]),
    "kvpool_values_size": (c_size_t, [c_void_p, c_size_t]),
    "kvpool_values_destroy": (None, [POINTER(c_void_p)]),
    "kvpool_put_start": (c_int, [K, c_size_t, P, P, POINTER(PutOptions), P]),
    "kvpool_put_end": (c_int, [K, c_size_t, P, P]),
    "kvpool_put_revoke": (c_int, [K, c_size_t, P, P]),
    "kvpool_get_replica_list": (c_int, [K, c_size_t, P, c_bool, P]),
    "kvpool_release": (c_int, [K, c_size_t, P, P]),
    "kvpool_segments": (c_int, [K, P, c_size_t]),
    "kvpool_mount_segment": (c_int, [K, c_char_p, c_uint64, POINTER(c_uint32)]),
    "kvpool_unmount_segment": (c_int, [K, c_uint32]),
    "kvpool_stats": (c_int, [K, POINTER(Stats)]),
    "kvpool_set_hot_cache": (c_int, [K, c_uint64, c_uint32, c_uint64, c_uint64]),
    "kvpool_hot_cache_stats": (c_int, [K, POINTER(HotCacheStats)]),
}

#   Functions the library may not have yet; callers check `has(name)`.
_OPTIONAL = {"kvpool_reset", "kvpool_put_start", "kvpool_put_end", "kvpool_put_revoke",
             "kvpool_get_replica_list", "kvpool_release", "kvpool_keys_unpack",
             "kvpool_exist_batch_lens", "kvpool_get_size_batch_lens",
             "kvpool_exist_batch_local", "kvpool_get_size_batch_local",
             "kvpool_remove_by_regex_counts", "kvpool_connect_error",
             "kvpool_set_hot_cache", "kvpool_hot_cache_stats", "kvpool_put_batch_placed"}

missing = []
for _name, (_restype, _argtypes) in _PROTOTYPES.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        missing.append(_name)
        continue
    _fn.restype = _restype
    _fn.argtypes = _argtypes
    globals()[_name[len("kvpool_"):]] = _fn

#   kvpool_connect again, through a handle that keeps errno (why a connection failed: EACCES
#   when the node refused the CURVE key); the other functions need not pay for it.
connect = ctypes.CDLL(path, use_errno=True).kvpool_connect
connect.restype, connect.argtypes = _PROTOTYPES["kvpool_connect"]

_required_missing = [name for name in missing if name not in _OPTIONAL]
if _required_missing:
    raise ImportError("kvpool: %s lacks %s" % (path, ", ".join(_required_missing)))


def has(name):
    """True if the loaded library exports kvpool_<name>."""
    return "kvpool_" + name not in missing


def _load_batch():
    """kvpool._batch (python/kvpool/_batch.c), which builds a batch's C key array and its
    result lists in C loops: installed in this package by `make install`, or built beside the
    library loaded above (build/lib/kvpool_batch<suffix>, by `make`). None when neither loads,
    for instance under another Python than the one it was built for; the binding then does the
    same in Python, slower for large batches."""
    try:
        from . import _batch as module
        return module
    except ImportError:
        pass
    import importlib.machinery
    import importlib.util
    if os.sep not in path:
        return None                 # the system loader's library: no build folder beside it
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = os.path.join(os.path.dirname(os.path.abspath(path)), "kvpool_batch" + suffix)
        if not os.path.exists(candidate):
            continue
        try:
            spec = importlib.util.spec_from_file_location(__package__ + "._batch", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        except ImportError:
            continue
    return None


batch_module = _load_batch()


#   The CPython buffer protocol, to get the address of any bytes-like object (read-only ones
#   included, which ctypes' from_buffer refuses) while holding the exporter's lock on it.
class PyBuffer(Structure):
    _fields_ = [("buf", c_void_p), ("obj", c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", c_int), ("ndim", c_int),
                ("format", c_char_p), ("shape", c_void_p), ("strides", c_void_p),
                ("suboffsets", c_void_p), ("internal", c_void_p)]


PYBUF_WRITABLE = 0x0001
PYBUF_ANY_CONTIGUOUS = 0x0098

get_buffer = ctypes.pythonapi.PyObject_GetBuffer
get_buffer.restype = c_int
get_buffer.argtypes = [ctypes.py_object, POINTER(PyBuffer), c_int]
release_buffer = ctypes.pythonapi.PyBuffer_Release
release_buffer.restype = None
release_buffer.argtypes = [POINTER(PyBuffer)]

#   A bytes object of a given size whose contents the caller writes before anyone else sees
#   it (what the C API allows for a fresh object), and the address of its contents: lets a
#   value be copied once, straight into the bytes object handed to the caller.
new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
new_bytes.restype = ctypes.py_object
new_bytes.argtypes = [c_void_p, ctypes.c_ssize_t]
bytes_address = ctypes.pythonapi.PyBytes_AsString
bytes_address.restype = c_void_p
bytes_address.argtypes = [ctypes.py_object]


#   glibc's malloc returns freed memory to the kernel as soon as 2 MiB or more sits free at the
#   top of the heap, serves each allocation above the mmap threshold with a fresh mmap, and
#   gives libzmq's I/O thread (which allocates every received frame) an arena of 64 MiB heaps
#   that are unmapped whenever one falls empty. Large values then cost fresh pages on every
#   call: a batch get that returns 32 x 1 MiB as new bytes objects, libzmq's receive buffers
#   on the socket path, libkvpool's own per-call buffers. On the reference machine page faults
#   cost more than the copies (32 MiB of fresh pages take 150-250 ms against 2-5 ms when the
#   heap keeps them; a same-machine batch_get_into of 32 x 1 MiB runs at 14 GB/s without,
#   22 GB/s with). So the first Client calls kvpool_tune_malloc() (see kvpool.h). Opt out with
#   KVPOOL_MALLOC_TUNING=0 in the environment, or kvpool.set_malloc_tuning(False) before the
#   first Client.
_malloc = {"enabled": os.environ.get("KVPOOL_MALLOC_TUNING", "1") != "0", "done": False}


def set_malloc_tuning(enabled):
    """Allows (True) or forbids (False) the malloc tuning above; it applies once, when the
    first Client connects. Returns whether it is applied already."""
    _malloc["enabled"] = bool(enabled)
    return _malloc["done"]


def tune_malloc():
    if _malloc["done"] or not _malloc["enabled"]:
        return
    _malloc["done"] = True
    lib.kvpool_tune_malloc()
