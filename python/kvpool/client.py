"""kvpool.client - kvpool.Client, the native Python client over libkvpool.

A Client talks to one kvpoold node. Values go in from anything with the buffer protocol
(bytes, bytearray, memoryview, numpy arrays), from objects with data_ptr() (CPU torch
tensors), or from a raw address and size; they come out as bytes, into caller buffers of the
same kinds (zero-copy: the library copies straight from the segment or the received message
into the buffer), or as BufferHandle views of the received message (no copy at all).

Errors raise kvpool.Error subclasses that carry the status code (status.py). Batch forms
answer one outcome per key instead of raising for a single key (see each docstring); they raise
only when the request as a whole failed.

Threads: a Client may be shared by threads. libkvpool's kvpool_t is one connection for one
thread at a time, so the Client keeps a pool of connections: a call takes an idle one (opening
a new one when none is idle) and puts it back when done. Calls release the GIL while in the
library, so threads run their requests in parallel on separate connections. Requests from one
thread are answered in order; there is no ordering between threads.

Processes: a Client belongs to the process that made it. After fork() the child must make its
own (ZeroMQ sockets do not survive fork); using the parent's raises kvpool.Error.
"""

import array
import collections
import errno
import ctypes
import itertools
import os
import threading

from ctypes import byref, c_char_p, c_uint32, c_void_p

# The C library's free, for what libkvpool allocated with malloc (kvpool_get_version).
_libc_free = ctypes.CDLL(None).free
_libc_free.argtypes = [c_void_p]
_libc_free.restype = None

from . import _native
from .status import Status, error_for, InvalidParamsError, RpcFailError

DEFAULT_ENDPOINT = "tcp://127.0.0.1:50051"
DEFAULT_TIMEOUT = 5.0

_NOT_FOUND = int(Status.OBJECT_NOT_FOUND)
_INT_MAX = 2**31 - 1

SegmentInfo = collections.namedtuple("SegmentInfo", "id name size used")
#   Client.remove_by_regex_counts: removed + kept == matched.
RegexRemoval = collections.namedtuple("RegexRemoval", "removed matched kept")


class PutOptions:
    """Options of a put: replica count, preferred segments (by name), soft pin, hard pin."""

    __slots__ = ("replica_num", "preferred_segments", "soft_pin", "soft_pin_ttl_ms", "hard_pin")

    def __init__(self, replica_num=1, preferred_segments=(), soft_pin=False, soft_pin_ttl_ms=0,
                 hard_pin=False):
        self.replica_num = replica_num
        self.preferred_segments = list(preferred_segments or ())
        self.soft_pin = soft_pin
        self.soft_pin_ttl_ms = soft_pin_ttl_ms
        self.hard_pin = hard_pin

    def __repr__(self):
        return "PutOptions(%s)" % ", ".join("%s=%r" % (name, getattr(self, name))
                                            for name in self.__slots__)

    def _native(self):
        """The C struct; it keeps the segment-name strings alive as long as itself."""
        opts = _native.PutOptions()
        if self.replica_num < 0 or self.replica_num > 0xFFFFFFFF:
            raise InvalidParamsError(reason="replica_num out of range")
        opts.replica_num = self.replica_num
        names = [_encode(name) for name in self.preferred_segments]
        if names:
            arr = (c_char_p * len(names))(*names)
            opts.preferred_segments = ctypes.cast(arr, ctypes.POINTER(c_char_p))
            opts.preferred_segment_count = len(names)
            opts._keep = arr
        opts.soft_pin = bool(self.soft_pin)
        opts.soft_pin_ttl_ms = int(self.soft_pin_ttl_ms or 0)
        opts.hard_pin = bool(self.hard_pin)
        return opts


def _encode(text):
    if isinstance(text, str):
        return text.encode("utf-8")
    if isinstance(text, (bytes, bytearray)):
        return bytes(text)
    raise TypeError("expected str or bytes, not %s" % type(text).__name__)


def _key(key):
    """A key as the C library wants it: UTF-8 bytes without NUL (C strings end at NUL)."""
    data = _encode(key)
    if b"\0" in data:
        raise error_for(Status.INVALID_KEY, "key contains a NUL byte")
    return data


_UNPACK = _native.has("keys_unpack")
#   The first byte of every other tenant's names in kvpool.mooncake ("\x1f<tenant>\n"): a
#   key table without a prefix refuses a key that begins with it, as kvpool._batch does.
TENANT_MARK = b"\x1f"


class _PackedKeys:
    """kvpool._batch.KeyTable (python/kvpool/_batch.c) in Python, for when that module is not
    built: C's key array (char *[n]) of a batch's keys, each after prefix. It refuses what
    KeyTable refuses (ValueError: a key neither str nor bytes, one that does not encode, one
    with a NUL byte, or without a prefix one beginning with the tenant mark \\x1f), and also a
    batch that mixes str and bytes keys. A few Python operations for any number of keys: the
    keys are joined into one buffer and kvpool_keys_unpack points the array into it."""

    __slots__ = ("_blob", "_as_parameter_", "_names")

    def __init__(self, keys, prefix=b""):
        if not _UNPACK:
            raise ValueError("the library cannot unpack keys")
        try:
            blob = ("\0".join(keys) + "\0").encode("utf-8")
        except TypeError:
            try:
                blob = b"\0".join(keys) + b"\0"
            except TypeError:
                raise ValueError("a key is neither str nor bytes") from None
        except UnicodeEncodeError:
            raise ValueError("a key does not encode to UTF-8") from None
        if prefix:
            blob = prefix + blob[:-1].replace(b"\0", b"\0" + prefix) + b"\0"
        elif blob.startswith(TENANT_MARK) or b"\0" + TENANT_MARK in blob:
            raise ValueError("a key begins with the tenant mark")
        n = len(keys)
        table = (c_char_p * n)()
        if n and _native.keys_unpack(blob, len(blob), n, table) != 0:
            raise ValueError("a key holds a NUL byte")
        self._blob = blob
        self._as_parameter_ = table
        self._names = None

    def __len__(self):
        return len(self._as_parameter_)

    @property
    def address(self):
        return ctypes.addressof(self._as_parameter_)

    def _split(self):
        if self._names is None:
            self._names = self._blob[:-1].split(b"\0") if len(self) else []
        return self._names

    def names(self):
        return list(self._split())

    def __getitem__(self, i):
        return self._split()[i]


KeyTable = _native.batch_module.KeyTable if _native.batch_module is not None else _PackedKeys


def _key_table(keys, prefix=b""):
    """C's key array of keys, each after prefix: a KeyTable, which a ctypes call takes for a
    key-array argument and which keeps the array alive; None when the batch must be named key
    by key (see _PackedKeys for which). One C loop over the keys with kvpool._batch, a few
    Python operations without it: either way not a Python operation per key, which is what
    keeps a batch of a thousand keys cheap."""
    try:
        return KeyTable(keys, prefix)
    except (ValueError, TypeError):
        return None


#   How many times this process is a child of fork() (os.register_at_fork). A Client made
#   before a fork must not be used after it; comparing this count with the one it was made
#   under checks that on every call without asking the kernel for the pid (a system call).
_forks = 0


def _count_fork():
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


#   list(results) for the array.array of statuses ("i") or sizes ("q") a batch call filled:
#   one C loop with kvpool._batch, array.tolist without.
_int_list = (_native.batch_module.int_list if _native.batch_module is not None
             else array.array.tolist)

#   A read-only batch (exist, get-size) in one call into kvpool._batch: the key array with
#   the keys' lengths, the C call without the GIL and the list of results, all in C
#   (python/kvpool/_batch.c). None without the module or a library with the _lens calls; the
#   callers then build the arrays here. LOCAL_FNS: each function's form answered on this
#   machine alone (kvpool_exist_batch_local), which lookup calls first with the GIL kept,
#   when the library has it.
_batch_lookup = None
EXIST_FN = GET_SIZE_FN = None
LOCAL_FNS = {}
if (_native.batch_module is not None and _native.has("exist_batch_lens")
        and _native.has("get_size_batch_lens")):
    _batch_lookup = _native.batch_module.lookup
    EXIST_FN = ctypes.cast(_native.exist_batch_lens, c_void_p).value
    GET_SIZE_FN = ctypes.cast(_native.get_size_batch_lens, c_void_p).value
    if _native.has("exist_batch_local") and _native.has("get_size_batch_local"):
        LOCAL_FNS = {EXIST_FN: ctypes.cast(_native.exist_batch_local, c_void_p).value,
                     GET_SIZE_FN: ctypes.cast(_native.get_size_batch_local, c_void_p).value}


def _key_array(keys):
    table = _key_table(keys)
    if table is not None:
        return table
    encoded = [_key(key) for key in keys]
    return (c_char_p * len(encoded))(*encoded)


def _u64(values):
    return array.array("Q", values)


def _addr(arr):
    return arr.buffer_info()[0]


def _iov_table(flat, counts):
    """The C library's scatter/gather arguments for several buffers per key: flat holds
    address, size, address, size... for every buffer of every key in order, counts the number
    of buffers of each key. Returns (iov, ptrs, nbufs): ptrs[i] points at key i's first
    kvpool_iov_t / kvpool_buf_t (16 bytes each) in iov. Keep all three alive for the call."""
    iov = _u64(flat)
    base = _addr(iov)
    starts = []
    offset = 0
    for count in counts:
        starts.append(base + 16 * offset)
        offset += count
    return iov, _u64(starts), _u64(counts)


def _iov_nested(ptrs, sizes):
    """_iov_table's result from each key's addresses and sizes (ptrs[i] and sizes[i]: ints,
    as lists or array.array("Q"), of one length per key), built with array operations: a KV
    cache's block is one buffer per layer, so a batch of 512 blocks of 32 layers is 16,384
    buffers, and a Python loop over them costs more than the copies do."""
    counts = array.array("Q", map(len, ptrs))
    addresses = array.array("Q")
    lengths = array.array("Q")
    for key_ptrs, key_sizes in zip(ptrs, sizes):
        addresses.extend(key_ptrs)
        lengths.extend(key_sizes)
    iov = array.array("Q", bytes(16 * len(addresses)))
    iov[0::2] = addresses
    iov[1::2] = lengths
    base = _addr(iov)
    offsets = itertools.accumulate(counts, initial=0)
    starts = array.array("Q", (base + 16 * offset for offset, _ in zip(offsets, counts)))
    return iov, starts, counts


def _flatten_buffers(pins, buffers_per_key, sizes_per_key, writable=False):
    """Pins every buffer of every key (sizes_per_key may be None) and returns (flat, counts)
    for _iov_table. A key whose buffers and sizes differ in number raises."""
    flat = []
    counts = []
    for i, buffers in enumerate(buffers_per_key):
        sizes = None if sizes_per_key is None else sizes_per_key[i]
        if sizes is not None and len(sizes) != len(buffers):
            raise InvalidParamsError(reason="buffers and sizes of key %d differ" % i)
        for j, buf in enumerate(buffers):
            flat.extend(pins.address(buf, None if sizes is None else sizes[j],
                                     writable=writable))
        counts.append(len(buffers))
    return flat, counts


class _Pins:
    """The buffer exports taken for one call; released (with the GIL) once the call is over."""

    __slots__ = ("views",)

    def __init__(self):
        self.views = []

    def addresses(self, objs, sizes=None, writable=False):
        """address() of each of objs (sizes[i] with it, when given), as two uint64 arrays:
        the addresses and the sizes."""
        addresses, lengths = [], []
        for i, obj in enumerate(objs):
            address, size = self.address(obj, None if sizes is None else sizes[i], writable)
            addresses.append(address)
            lengths.append(size)
        return _u64(addresses), _u64(lengths)

    def address(self, obj, size=None, writable=False):
        """(address, size) of obj's memory. obj: an int address (size required), an object
        with data_ptr() (a CPU torch tensor), or anything with the buffer protocol."""
        if isinstance(obj, int):
            if size is None:
                raise InvalidParamsError(reason="a raw address needs a size")
            if size < 0 or (obj == 0 and size > 0):
                raise InvalidParamsError(reason="bad address or size")
            return obj, size
        data_ptr = getattr(obj, "data_ptr", None)
        if data_ptr is not None and callable(data_ptr):
            return self._tensor(obj, data_ptr, size)
        view = _native.PyBuffer()
        flags = _native.PYBUF_ANY_CONTIGUOUS | (_native.PYBUF_WRITABLE if writable else 0)
        try:
            _native.get_buffer(obj, byref(view), flags)   # BufferError, TypeError, ValueError
        except ValueError as exc:                         # numpy's word for "not contiguous"
            raise BufferError(str(exc)) from None
        self.views.append(view)
        if size is None:
            size = view.len
        elif size < 0 or size > view.len:
            raise InvalidParamsError(reason="size %d exceeds the buffer's %d bytes"
                                     % (size, view.len))
        return view.buf or 0, size

    @staticmethod
    def _tensor(obj, data_ptr, size):
        device = getattr(obj, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            raise InvalidParamsError(reason="tensor is on %s; kvpool copies host memory only"
                                     % device)
        is_contiguous = getattr(obj, "is_contiguous", None)
        if is_contiguous is not None and not is_contiguous():
            raise InvalidParamsError(reason="tensor is not contiguous")
        nbytes = obj.numel() * obj.element_size()
        if size is None:
            size = nbytes
        elif size < 0 or size > nbytes:
            raise InvalidParamsError(reason="size %d exceeds the tensor's %d bytes"
                                     % (size, nbytes))
        return data_ptr(), size

    def release(self):
        for view in self.views:
            _native.release_buffer(byref(view))
        self.views = []


class _Values:
    """Owns a kvpool_values_t; BufferHandles into it keep it alive."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def __del__(self):
        if self.ptr:
            handle = c_void_p(self.ptr)
            self.ptr = None
            _native.values_destroy(byref(handle))


class _BufferHandleMixin:
    """Methods of BufferHandle, after Mooncake's: ptr(), size(), len()."""

    __slots__ = ()

    def ptr(self):
        """The address of the value's first byte."""
        return ctypes.addressof(self)

    def size(self):
        """The value's size in bytes."""
        return len(self)

    def __repr__(self):
        return "<kvpool.BufferHandle %d bytes at 0x%x>" % (len(self), ctypes.addressof(self))


_handle_types = {}


def _buffer_handle(owner, address, size):
    """A read-only-by-convention view of size bytes at address that keeps owner alive. It is a
    ctypes array of unsigned bytes, so it has the buffer protocol (memoryview, numpy, bytes)."""
    cls = _handle_types.get(size)
    if cls is None:
        if len(_handle_types) > 4096:
            _handle_types.clear()
        cls = type("BufferHandle", (_BufferHandleMixin, ctypes.c_ubyte * size),
                   {"__module__": "kvpool"})
        _handle_types[size] = cls
    if size == 0:
        handle = cls()
    else:
        handle = cls.from_address(address)
    handle._owner = owner
    return handle


def fetch(handle, n, karr, handles=False):
    """Gets n values on one connection: (status, values). values[i] is bytes (or, with
    handles, a BufferHandle) or a negative status int; status < 0 means the request as a
    whole failed (values is None then).

    Each value is copied once. With the same-machine fast path on, the sizes are asked first
    and the values copied by the library straight from the node's segments into fresh bytes
    objects; otherwise kvpool_get_batch receives them (no copy) and each is copied out of the
    received message (or viewed in place by a BufferHandle)."""
    if _native.fast_path(handle):
        return _fetch_direct(handle, n, karr, handles)
    return _fetch_received(handle, n, karr, handles)


def _fetch_direct(handle, n, karr, handles):
    sizes = array.array("q", bytes(8 * n))
    rc = _native.get_size_batch(handle, n, karr, _addr(sizes))
    if rc < 0:
        return rc, None
    new_bytes = _native.new_bytes
    bytes_address = _native.bytes_address
    objects = [None] * n
    addresses = array.array("Q", bytes(8 * n))
    capacities = array.array("Q", bytes(8 * n))
    for i in range(n):
        size = sizes[i]
        if size >= 0:
            obj = new_bytes(None, size)
            objects[i] = obj
            addresses[i] = bytes_address(obj)
            capacities[i] = size
    results = array.array("q", bytes(8 * n))
    rc = _native.get_batch_into(handle, n, karr, _addr(addresses), _addr(capacities),
                                _addr(results))
    if rc < 0:
        return rc, None
    values = []
    retry = []
    for i in range(n):
        size = sizes[i]
        result = results[i]
        if size < 0:
            values.append(size)
        elif result == size:
            obj = objects[i]
            values.append(_buffer_handle(obj, addresses[i], size) if handles else obj)
        elif result == _NOT_FOUND:
            values.append(result)
        else:
            #  Removed and put again with another size between the two calls.
            values.append(None)
            retry.append(i)
    if retry:
        sub = (c_char_p * len(retry))(*[karr[i] for i in retry])
        rc, again = _fetch_received(handle, len(retry), sub, handles)
        if rc < 0:
            return rc, None
        for i, value in zip(retry, again):
            values[i] = value
    return 0, values


def _fetch_received(handle, n, karr, handles):
    statuses = array.array("i", bytes(4 * n))
    values_p = c_void_p()
    rc = _native.get_batch(handle, n, karr, byref(values_p), _addr(statuses))
    values = _Values(values_p.value)
    if rc < 0:
        values.__del__()
        return rc, None
    data = _native.values_data
    size = _native.values_size
    ptr = values.ptr
    out = []
    for i in range(n):
        status = statuses[i]
        if status != 0:
            out.append(status)
            continue
        length = size(ptr, i)
        address = data(ptr, i) or 0
        if handles:
            out.append(_buffer_handle(values, address, length))
        elif length <= _INT_MAX:
            out.append(ctypes.string_at(address, length))
        else:
            out.append((ctypes.c_char * length).from_address(address).raw)
    if not handles:
        values.__del__()
    return 0, out


#   Why kvpool_connect failed, by errno, for a library without kvpool_connect_error (which
#   says it in words: include/kvpool.h).
_CONNECT_ERRORS = {
    errno.ETIMEDOUT: "no reply to PING within the connect timeout",
    errno.EACCES: "the node refused this client's CURVE key (its public certificate is not in "
                  "the node's --curve-allow directory)",
    errno.ECONNREFUSED: "the CURVE handshake failed (a wrong server certificate, or CURVE on "
                        "one side only)",
    errno.EINVAL: "a CURVE certificate file is not one (make them with kvpool keygen)",
}


def _hot_cache_settings(size, admit, window, max_object):
    """kvpool_set_hot_cache's arguments for the Client's hot_cache_* ones, or None for off."""
    settings = (int(size), int(admit), max(1, int(window * 1000)), int(max_object))
    if settings[0] < 0 or not 0 <= settings[1] <= 0xFFFFFFFF or settings[3] < 0:
        raise InvalidParamsError(reason="hot cache size, admit and max_object must be >= 0")
    if not settings[0]:
        return None
    if not _native.has("set_hot_cache"):
        raise InvalidParamsError(reason="this libkvpool has no hot cache")
    return settings


class Client:
    """A connection to a kvpoold node. See the module docstring for threads and errors.

    Client(endpoint="tcp://127.0.0.1:50051", timeout=5.0, connect_timeout=None, fast_path=True,
           curve_secret=None, curve_server=None, hot_cache_bytes=0, hot_cache_admit=2,
           hot_cache_window=60.0, hot_cache_max_object=16 << 20)
    connects and pings the node; it raises RpcFailError, its reason saying why and its .errno
    the code, if nothing listens there (within 0.5 s: ECONNREFUSED), the node does not
    answer (ETIMEDOUT) or refuses the CURVE key (EACCES). timeout is per request, in seconds.
    fast_path=False never uses the same-machine shared memory path (everything goes over the
    socket). curve_secret (this client's certificate, the NAME_secret file of `kvpool keygen
    NAME`) and curve_server (the node's public certificate) turn on CURVE, both or neither
    (docs/security.md).

    hot_cache_bytes > 0 keeps values this process reads often in its own memory, for a client
    whose node is on another machine (kvpool_set_hot_cache in include/kvpool.h): a value read
    hot_cache_admit times within hot_cache_window seconds is kept (whole values of at most
    hot_cache_max_object bytes, least recently used first to go), and a later get of it costs
    one EXIST round trip naming its version instead of the value's bytes; the node's answer
    makes sure a removed or rewritten key is never served from memory. One cache per process
    and node endpoint, shared by the Clients connected there. Not used while the fast path is
    on (the node is on this machine: its own hot cache serves). hot_cache_stats() has its
    counters, and stats() adds them as client_hot_cache_*."""

    def __init__(self, endpoint=DEFAULT_ENDPOINT, timeout=DEFAULT_TIMEOUT, connect_timeout=None,
                 fast_path=True, curve_secret=None, curve_server=None, hot_cache_bytes=0,
                 hot_cache_admit=2, hot_cache_window=60.0, hot_cache_max_object=16 << 20):
        self.endpoint = endpoint
        self._endpoint = _encode(endpoint)
        options = _native.Options()
        _native.options_init(byref(options))
        options.timeout_ms = max(1, int(timeout * 1000))
        if connect_timeout is not None:
            options.connect_timeout_ms = max(1, int(connect_timeout * 1000))
        options.fast_path = 1 if fast_path else 0
        if (curve_secret is None) != (curve_server is None):
            raise error_for(Status.INVALID_PARAMS, "curve_secret and curve_server go together")
        if curve_secret is not None:
            # (ctypes keeps these bytes alive with the structure.)
            options.curve_secret_file = os.fsencode(curve_secret)
            options.curve_server_file = os.fsencode(curve_server)
        self._options = options
        self._hot_cache = _hot_cache_settings(hot_cache_bytes, hot_cache_admit,
                                              hot_cache_window, hot_cache_max_object)
        _native.tune_malloc()
        self._forks = _forks
        self._lock = threading.Lock()
        self._handles = []
        self._idle = []
        self._closed = False
        self._idle.append(self._open())

    # ---- connections -----------------------------------------------------------------
    def _open(self):
        handle = _native.connect(self._endpoint, byref(self._options))
        if not handle:
            code = ctypes.get_errno()
            # (Read on this thread, right after the call: the library keeps it per thread.)
            words = _native.connect_error() if _native.has("connect_error") else None
            why = (words.decode("utf-8", "replace") if words else
                   _CONNECT_ERRORS.get(code) or (os.strerror(code) if code else "no answer"))
            failed = RpcFailError(reason="cannot connect to %s: %s" % (self.endpoint, why))
            failed.errno = code  # ECONNREFUSED: nothing listens there; ETIMEDOUT: no reply
            raise failed
        if self._hot_cache:
            rc = _native.set_hot_cache(handle, *self._hot_cache)
            if rc < 0:
                failed = self._fail(handle, rc)
                _native.destroy(byref(c_void_p(handle)))
                raise failed
        with self._lock:
            self._handles.append(handle)
        return handle

    def _acquire(self):
        if self._closed:
            raise error_for(Status.INVALID_PARAMS, "client is closed")
        if self._forks != _forks:
            raise error_for(Status.INVALID_PARAMS, "client was made in another process "
                                                   "(after fork, make a new Client)")
        try:
            return self._idle.pop()
        except IndexError:
            return self._open()

    def _reason(self, handle):
        text = _native.last_error(handle)
        return text.decode("utf-8", "replace") if text else ""

    def _fail(self, handle, status):
        return error_for(status, self._reason(handle))

    def close(self):
        """Closes every connection. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._forks != _forks:
            return
        with self._lock:
            handles, self._handles, self._idle = self._handles, [], []
        for handle in handles:
            _native.destroy(byref(c_void_p(handle)))

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<kvpool.Client %s%s>" % (self.endpoint, " closed" if self._closed else "")

    @property
    def fast_path(self):
        """True if the same-machine shared-memory path is on. Settable."""
        handle = self._acquire()
        try:
            return bool(_native.fast_path(handle))
        finally:
            self._idle.append(handle)

    @fast_path.setter
    def fast_path(self, enabled):
        self._options.fast_path = 1 if enabled else 0
        with self._lock:
            handles = list(self._handles)
        for handle in handles:
            _native.set_fast_path(handle, bool(enabled))

    def set_hot_cache(self, size, admit=2, window=60.0, max_object=16 << 20):
        """Turns this process's hot cache on for this Client's connections (size bytes; 0
        turns it off for them), with the meaning of the constructor's hot_cache_* arguments.
        Returns whether it serves this Client's gets now: False while the fast path is on."""
        settings = _hot_cache_settings(size, admit, window, max_object)
        self._hot_cache = settings
        with self._lock:
            handles = list(self._handles)
        for handle in handles:
            rc = _native.set_hot_cache(handle, *(settings or (0, 0, 0, 0)))
            if rc < 0:
                raise self._fail(handle, rc)
        return settings is not None and not self.fast_path

    # ---- helpers ---------------------------------------------------------------------
    def _call(self, fn, *args):
        """Runs fn(handle, *args); raises for a negative result, returns it otherwise."""
        handle = self._acquire()
        try:
            rc = fn(handle, *args)
            if rc < 0:
                raise self._fail(handle, rc)
            return rc
        finally:
            self._idle.append(handle)

    def _batch(self, fn, n, *args):
        """Runs a batch function; raises if the request as a whole failed."""
        handle = self._acquire()
        try:
            rc = fn(handle, n, *args)
            if rc < 0:
                raise self._fail(handle, rc)
        finally:
            self._idle.append(handle)

    @staticmethod
    def _opts(options):
        if options is None:
            return None
        if isinstance(options, PutOptions):
            return byref(options._native())
        to_put_options = getattr(options, "to_put_options", None)
        if to_put_options is not None:
            return byref(to_put_options()._native())
        raise TypeError("options must be a kvpool.PutOptions")

    # ---- single-key operations -------------------------------------------------------
    def ping(self):
        """Checks the node answers; raises RpcFailError if not."""
        self._call(_native.ping)

    def put(self, key, value, options=None, size=None):
        """Stores value under key. value: bytes-like, a CPU tensor, or an int address with
        size. Raises ObjectAlreadyExistsError if key exists (objects are immutable)."""
        self._store(_native.put, key, value, options, size)

    def _store(self, fn, key, value, options, size):
        """One value through fn (kvpool_put or kvpool_upsert)."""
        pins = _Pins()
        try:
            address, size = pins.address(value, size)
            self._call(fn, _key(key), address, size, self._opts(options))
        finally:
            pins.release()

    def put_from(self, key, buffer, size=None, options=None):
        """put() from a buffer or raw address: put_from(key, arr) or put_from(key, ptr, n)."""
        self.put(key, buffer, options, size)

    def put_parts(self, key, *parts, options=None):
        """Stores the concatenation of parts (each bytes-like or a tensor) as one value."""
        self._store_parts(_native.put_parts, key, parts, options)

    def _store_parts(self, fn, key, parts, options):
        """One value of parts through fn (kvpool_put_parts or kvpool_upsert_parts)."""
        pins = _Pins()
        try:
            flat = []
            for part in parts:
                flat.extend(pins.address(part))
            iov = _u64(flat)
            self._call(fn, _key(key), _addr(iov), len(parts), self._opts(options))
        finally:
            pins.release()

    def upsert(self, key, value, options=None, size=None):
        """Stores value under key, replacing the value if key exists (a reader sees the whole
        old or the whole new value). Raises ReplicaIsNotReadyError while the key is being
        written. Goes over the socket even on the node's machine."""
        self._store(_native.upsert, key, value, options, size)

    def upsert_parts(self, key, *parts, options=None):
        """upsert() of the concatenation of parts."""
        self._store_parts(_native.upsert_parts, key, parts, options)

    def upsert_batch_parts(self, keys, parts_per_key, options=None, sizes_per_key=None):
        """upsert() of each key's parts. Returns a status per key."""
        n = len(keys)
        if len(parts_per_key) != n or (sizes_per_key is not None and len(sizes_per_key) != n):
            raise InvalidParamsError(reason="keys, parts and sizes differ in length")
        if n == 0:
            return []
        pins = _Pins()
        try:
            flat, counts = _flatten_buffers(pins, parts_per_key, sizes_per_key)
            return self._put_batch_parts(n, keys, flat, counts, options,
                                         fn=_native.upsert_batch_parts)
        finally:
            pins.release()

    def get_range_into(self, key, offset, buffer, size=None):
        """Copies at most len(buffer) (or size) bytes of key's value, from byte offset, into
        buffer; only that range travels. Returns the bytes written (fewer at the value's end).
        Raises InvalidParamsError for an offset past the end, ObjectNotFoundError on a miss."""
        pins = _Pins()
        try:
            address, size = pins.address(buffer, size, writable=True)
            return self._call(_native.get_range_into, _key(key), int(offset), address, size)
        finally:
            pins.release()

    def get_ranges_into(self, keys, offsets, buffers, sizes=None):
        """Ranges of several values: keys[i] from offsets[i] into buffers[i]. Returns per key
        the bytes written or a negative Status."""
        n = len(keys)
        if len(offsets) != n or len(buffers) != n or (sizes is not None and len(sizes) != n):
            raise InvalidParamsError(reason="keys, offsets, buffers and sizes differ in length")
        if n == 0:
            return []
        pins = _Pins()
        try:
            addresses, lengths = pins.addresses(buffers, sizes, writable=True)
            karr = _key_array(keys)
            starts = _u64(offsets)  # kept alive across the call
            results = array.array("q", bytes(8 * n))
            self._batch(_native.get_ranges_into, n, karr, _addr(starts),
                        _addr(addresses), _addr(lengths), _addr(results))
            return _int_list(results)
        finally:
            pins.release()

    def get(self, key):
        """The value of key as bytes. Raises ObjectNotFoundError (a KeyError) on a miss."""
        value = self.get_batch([key], _missing=True)[0]
        return value

    def get_with_version(self, key):
        """(value, version): the value of key as bytes and its version, a number unique to the
        put or upsert that wrote it (a later write of the key has another; 0 when the node
        named none). Raises ObjectNotFoundError on a miss."""
        data = ctypes.c_void_p()
        size = ctypes.c_size_t()
        version = ctypes.c_uint64()
        self._call(_native.get_version, _key(key), ctypes.byref(data), ctypes.byref(size),
                   ctypes.byref(version))
        try:
            return ctypes.string_at(data.value, size.value) if size.value else b"", version.value
        finally:
            _libc_free(data)

    def get_buffer(self, key):
        """The value of key as a BufferHandle: a view of the received bytes (no copy) with the
        buffer protocol, ptr() and size(). Raises ObjectNotFoundError on a miss."""
        return self.get_buffer_batch([key], _missing=True)[0]

    def get_into(self, key, buffer, size=None):
        """Copies the value of key into buffer (writable bytes-like, tensor, or int address
        with size); returns the value's size. Raises BufferOverflowError if it does not fit,
        ObjectNotFoundError on a miss."""
        pins = _Pins()
        try:
            address, size = pins.address(buffer, size, writable=True)
            return self._call(_native.get_into, _key(key), address, size)
        finally:
            pins.release()

    def exist(self, key):
        """True if key exists (committed), False if not."""
        return self._call(_native.exist, _key(key)) == 1

    def get_size(self, key):
        """The size of key's value. Raises ObjectNotFoundError on a miss."""
        return self._call(_native.get_size, _key(key))

    def remove(self, key, force=False):
        """Removes key. Raises ObjectNotFoundError, or ObjectHasLeaseError when a reader holds a
        lease (force=True removes anyway)."""
        self._call(_native.remove, _key(key), bool(force))

    def remove_by_regex(self, pattern, force=False):
        """Removes the keys matching pattern (PCRE2 regex, unanchored search); returns how many."""
        return self._call(_native.remove_by_regex, _encode(pattern), bool(force))

    def remove_by_regex_counts(self, pattern, force=False):
        """remove_by_regex, and what else matched: RegexRemoval(removed, matched, kept), kept
        being the matching keys that stayed for a read lease (force=True removes them; in a
        cluster removes are forced and kept is 0)."""
        if not _native.has("remove_by_regex_counts"):
            raise error_for(Status.UNKNOWN_OPERATION,
                            "library has no kvpool_remove_by_regex_counts")
        matched, kept = ctypes.c_uint64(), ctypes.c_uint64()
        removed = self._call(_native.remove_by_regex_counts, _encode(pattern), bool(force),
                             byref(matched), byref(kept))
        return RegexRemoval(removed, matched.value, kept.value)

    def remove_all(self, force=False):
        """Removes every object; returns how many."""
        return self._call(_native.remove_all, bool(force))

    def reset(self):
        """Drains transfers in flight, then removes everything past leases; returns how many."""
        if not _native.has("reset"):
            raise error_for(Status.UNKNOWN_OPERATION, "library has no kvpool_reset")
        return self._call(_native.reset)

    # ---- batch operations ------------------------------------------------------------
    def put_batch(self, keys, values, options=None, sizes=None):
        """Stores values[i] under keys[i]. Returns a status per key (0 or a negative Status).
        values: bytes-likes, tensors, or int addresses (then sizes is required)."""
        n = len(keys)
        if len(values) != n or (sizes is not None and len(sizes) != n):
            raise InvalidParamsError(reason="keys, values and sizes differ in length")
        if n == 0:
            return []
        pins = _Pins()
        try:
            addresses, lengths = pins.addresses(values, sizes)
            return self._put_batch(n, keys, addresses, lengths, options)
        finally:
            pins.release()

    def put_batch_placed(self, keys, values, options=None):
        """As put_batch, and how many replicas each key got: (statuses, placed). placed[i]
        may be fewer than options.replica_num (a cluster of fewer nodes, a node of fewer
        segments): the key is stored all the same, and a cluster restores the rest as nodes
        join. 0 for a key that failed."""
        n = len(keys)
        if len(values) != n:
            raise InvalidParamsError(reason="keys and values differ in length")
        if n == 0:
            return [], []
        if not _native.has("put_batch_placed"):
            raise error_for(Status.UNKNOWN_OPERATION, "library has no kvpool_put_batch_placed")
        pins = _Pins()
        try:
            addresses, lengths = pins.addresses(values, None)
            karr = _key_array(keys)
            statuses = array.array("i", bytes(4 * n))
            placed = array.array("I", bytes(4 * n))
            self._batch(_native.put_batch_placed, n, karr, _addr(addresses), _addr(lengths),
                        self._opts(options), _addr(statuses), _addr(placed))
            return _int_list(statuses), list(placed)
        finally:
            pins.release()

    def _put_batch(self, n, keys, addresses, sizes, options):
        karr = _key_array(keys)
        statuses = array.array("i", bytes(4 * n))
        self._batch(_native.put_batch, n, karr, _addr(addresses), _addr(sizes),
                    self._opts(options), _addr(statuses))
        return _int_list(statuses)

    def put_batch_parts(self, keys, parts_per_key, options=None, sizes_per_key=None):
        """Stores, for each key, the concatenation of its parts (bytes-likes, tensors, or int
        addresses with sizes_per_key). Returns a status per key."""
        n = len(keys)
        if len(parts_per_key) != n or (sizes_per_key is not None and len(sizes_per_key) != n):
            raise InvalidParamsError(reason="keys, parts and sizes differ in length")
        if n == 0:
            return []
        pins = _Pins()
        try:
            flat, counts = _flatten_buffers(pins, parts_per_key, sizes_per_key)
            return self._put_batch_parts(n, keys, flat, counts, options)
        finally:
            pins.release()

    def _put_batch_parts(self, n, keys, flat, counts, options, fn=None):
        """flat: address, size, address, size... for all parts of all keys in order. fn:
        kvpool_put_batch_parts (None) or kvpool_upsert_batch_parts."""
        iov, ptrs, nparts = _iov_table(flat, counts)
        karr = _key_array(keys)
        statuses = array.array("i", bytes(4 * n))
        self._batch(fn or _native.put_batch_parts, n, karr, _addr(ptrs), _addr(nparts),
                    self._opts(options), _addr(statuses))
        return _int_list(statuses)

    def get_batch(self, keys, _missing=False):
        """The values of keys as a list of bytes, None where a key is missing. (Other per-key
        errors raise.) Each value is copied once, into its bytes object."""
        return self._get_list(keys, _missing, handles=False)

    def get_buffer_batch(self, keys, _missing=False):
        """Like get_batch, but each value is a BufferHandle (buffer protocol, ptr(), size()).
        Over the socket it views the received message, so no byte is copied."""
        return self._get_list(keys, _missing, handles=True)

    def _get_list(self, keys, missing_raises, handles):
        n = len(keys)
        if n == 0:
            return []
        karr = _key_array(keys)
        handle = self._acquire()
        try:
            rc, values = fetch(handle, n, karr, handles)
            if rc < 0:
                raise self._fail(handle, rc)
        finally:
            self._idle.append(handle)
        for i, value in enumerate(values):
            if isinstance(value, int):
                if value == _NOT_FOUND and not missing_raises:
                    values[i] = None
                else:
                    raise error_for(value, "key %r" % (keys[i],))
        return values

    def get_batch_into(self, keys, buffers, sizes=None):
        """Copies value i into buffers[i] (writable bytes-likes, tensors, or int addresses
        with sizes). Returns per key the bytes written or a negative Status
        (OBJECT_NOT_FOUND, BUFFER_OVERFLOW...)."""
        n = len(keys)
        if len(buffers) != n or (sizes is not None and len(sizes) != n):
            raise InvalidParamsError(reason="keys, buffers and sizes differ in length")
        if n == 0:
            return []
        pins = _Pins()
        try:
            addresses, lengths = pins.addresses(buffers, sizes, writable=True)
            return self._get_batch_into(n, keys, addresses, lengths)
        finally:
            pins.release()

    def _get_batch_into(self, n, keys, addresses, capacities):
        karr = _key_array(keys)
        results = array.array("q", bytes(8 * n))
        self._batch(_native.get_batch_into, n, karr, _addr(addresses), _addr(capacities),
                    _addr(results))
        return _int_list(results)

    def get_batch_into_parts(self, keys, buffers_per_key, sizes_per_key=None):
        """Scatters value i across the buffers buffers_per_key[i] in order. Returns per key the
        bytes written or a negative Status."""
        n = len(keys)
        if len(buffers_per_key) != n or (sizes_per_key is not None
                                         and len(sizes_per_key) != n):
            raise InvalidParamsError(reason="keys, buffers and sizes differ in length")
        if n == 0:
            return []
        pins = _Pins()
        try:
            flat, counts = _flatten_buffers(pins, buffers_per_key, sizes_per_key, writable=True)
            return self._get_batch_into_parts(n, keys, flat, counts)
        finally:
            pins.release()

    def _get_batch_into_parts(self, n, keys, flat, counts):
        bufs, ptrs, nbufs = _iov_table(flat, counts)
        karr = _key_array(keys)
        results = array.array("q", bytes(8 * n))
        self._batch(_native.get_batch_into_parts, n, karr, _addr(ptrs), _addr(nbufs),
                    _addr(results))
        return _int_list(results)

    def exist_batch(self, keys):
        """A bool per key: True if it exists. A per-key error (e.g. INVALID_KEY) raises."""
        results = self._exist_batch(keys)
        if results and min(results) < 0:
            i = next(i for i, result in enumerate(results) if result < 0)
            raise error_for(results[i], "key %r" % (keys[i],))
        return list(map(bool, results))

    def prefix_match(self, keys, ranks=1):
        """How many leading blocks of keys are stored: keys is a flat list of blocks of ranks
        keys each (block-major: keys[b * ranks + r]); a block counts only if every one of its
        keys exists, and the first block with one missing ends the count. The counted blocks'
        keys are leased. One request to the node at most."""
        ranks = int(ranks)
        if ranks < 1 or len(keys) % ranks:
            raise error_for(Status.INVALID_PARAMS,
                            "%d keys are not whole blocks of %d ranks" % (len(keys), ranks))
        if not keys:
            return 0
        return self._call(_native.prefix_match, len(keys) // ranks, ranks, _key_array(keys))

    def _exist_batch(self, keys):
        n = len(keys)
        if n == 0:
            return []
        results = self._lookup(EXIST_FN, keys, False)
        if results is not None:
            return results
        karr = _key_array(keys)
        results = array.array("i", bytes(4 * n))
        self._batch(_native.exist_batch, n, karr, _addr(results))
        return _int_list(results)

    def get_size_batch(self, keys):
        """Per key the value's size or a negative Status (OBJECT_NOT_FOUND)."""
        n = len(keys)
        if n == 0:
            return []
        results = self._lookup(GET_SIZE_FN, keys, True)
        if results is not None:
            return results
        karr = _key_array(keys)
        results = array.array("q", bytes(8 * n))
        self._batch(_native.get_size_batch, n, karr, _addr(results))
        return _int_list(results)

    def _lookup(self, fn, keys, wide):
        """The results of fn (EXIST_FN or GET_SIZE_FN) over keys in one call into
        kvpool._batch; raises if the request as a whole failed. None when the batch goes the
        way of _key_array: no kvpool._batch, or a key it does not take."""
        if _batch_lookup is None:
            return None
        handle = self._acquire()
        try:
            try:
                rc, results = _batch_lookup(fn, handle, keys, b"", wide, LOCAL_FNS.get(fn))
            except ValueError:
                return None
            if rc < 0:
                raise self._fail(handle, rc)
            return results
        finally:
            self._idle.append(handle)

    def remove_batch(self, keys, force=False):
        """Removes keys; a status per key (0, OBJECT_NOT_FOUND, OBJECT_HAS_LEASE...)."""
        n = len(keys)
        if n == 0:
            return []
        karr = _key_array(keys)
        statuses = array.array("i", bytes(4 * n))
        self._batch(_native.remove_batch, n, karr, bool(force), _addr(statuses))
        return _int_list(statuses)

    # ---- segments and stats ----------------------------------------------------------
    def segments(self):
        """The node's mounted segments, as SegmentInfo(id, name, size, used)."""
        capacity = 16
        while True:
            table = (_native.Segment * capacity)()
            count = self._call(_native.segments, ctypes.addressof(table), capacity)
            if count <= capacity:
                return [SegmentInfo(s.id, s.name.decode("utf-8", "replace"), s.size, s.used)
                        for s in table[:count]]
            capacity = count

    def mount_segment(self, shm_name, size):
        """Asks the node to mount size bytes of the object shm_name as a segment owned by
        this client. Returns its segment id. The node mounts only memory that cannot shrink
        under it: a memfd sealed with F_SEAL_SHRINK, named "/proc/<pid>/fd/<fd>"
        (kvpool.SharedSegment makes one); anything else raises InvalidParamsError.

        The segment stays mounted while this Client is open; use a Client of its own for a
        segment whose lifetime differs."""
        handle = self._acquire()
        try:
            seg_id = c_uint32()
            rc = _native.mount_segment(handle, _encode(shm_name), size, byref(seg_id))
            if rc < 0:
                raise self._fail(handle, rc)
            return seg_id.value
        finally:
            self._idle.append(handle)

    def unmount_segment(self, segment_id):
        """Unmounts the segment: its replicas go (forced), and the objects that had no other;
        the rest stay on their other segments."""
        self._call(_native.unmount_segment, segment_id)

    def stats(self):
        """The node's counters as a dict (objects, bytes_stored, utilisation, requests...),
        and this process's hot cache's as client_hot_cache_<name> (hot_cache_stats(); all 0
        without one). The node's own hot_cache_* are its host cache's, for its clients."""
        stats = _native.Stats()
        self._call(_native.stats, byref(stats))
        out = {name: getattr(stats, name) for name, _ in _native.Stats._fields_}
        for name, value in self.hot_cache_stats().items():
            out["client_hot_cache_" + name] = value
        return out

    def hot_cache_stats(self):
        """The counters of this process's hot cache (see the class docstring) as a dict: hits
        (gets served from memory after the node confirmed the version), misses, bytes (kept
        now), admissions, evictions, invalidations (kept values the node no longer had at
        their version), entries (kept now) and capacity. All 0 without one."""
        out = {name: 0 for name, _ in _native.HotCacheStats._fields_}
        if not _native.has("hot_cache_stats"):
            return out
        stats = _native.HotCacheStats()
        self._call(_native.hot_cache_stats, byref(stats))
        out.update((name, getattr(stats, name)) for name, _ in _native.HotCacheStats._fields_)
        return out


def connect(endpoint=DEFAULT_ENDPOINT, timeout=DEFAULT_TIMEOUT, **kwargs):
    """Client(endpoint, timeout, ...): connects to a kvpoold node."""
    return Client(endpoint, timeout, **kwargs)
