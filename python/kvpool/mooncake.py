"""kvpool.mooncake - a drop-in for Mooncake Store's MooncakeDistributedStore, on kvpool.

    from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    store.setup("localhost", "unused", 512 << 20, 128 << 20, "tcp", "", "127.0.0.1:50051")
    store.put("key", b"value")

Code written for `mooncake.store` keeps working: every method vLLM's, SGLang's and LMCache's
Mooncake connectors call has Mooncake's name, arguments, defaults and return conventions, as
Mooncake's binding (mooncake-integration/store/store_py.cpp) and its client
(mooncake-store/src/real_client.cpp, client_service.cpp) define them: integers (0 ok, negative
status codes with Mooncake's numbers), b"" from get on a miss, 1 / 0 / negative from is_exist,
bytes read or a negative code from the *_into calls, None from get_buffer on a miss. A put of a
key that exists is success (0): values are content-addressed, the first one stays (kvpool's
native API says OBJECT_ALREADY_EXISTS). A buffer too small for a value is INVALID_PARAMS, as
in Mooncake. Nothing raises for a store-level failure; arguments of the wrong type (a str for a
pointer, a negative size) raise TypeError as the pybind11 binding does. install() makes
`import mooncake.store` load this module. python/README.md has the table of every method of
Mooncake's class and kvpool's status for it, with the deliberate differences.

setup(): master_server_addr names the kvpoold node ("host:port" as Mooncake writes it, or a
ZeroMQ endpoint such as "tcp://host:port" or "ipc://@kvpool-50051"). metadata_server,
protocol, rdma_devices and local_buffer_size are accepted and unused: kvpool needs no metadata
service, picks its transport itself and needs no registered staging buffer. With
global_segment_size > 0 this process contributes that much memory, as Mooncake's embedded
client does: setup() creates a kvpool.SharedSegment of that size (a memfd sealed against
shrinking, its pages committed up front, so the node can never fault on it) and asks the
local kvpoold to mount it; objects may then land in it (ReplicateConfig.preferred_segment =
store.get_hostname() forces that). close() unmounts it (the node drops the replicas in it,
and the objects left with none) and closes it; so does interpreter exit. If the process dies without either, the node unmounts
the segment when it sees the owning process is gone, and the kernel frees the memory. With
global_segment_size 0 the process contributes nothing (vLLM's standalone-store mode).

get_hostname() is "host:port", unique per store as in Mooncake: local_hostname when it names
a port, else local_hostname and a port this store holds bound (12300-14300, or
MC_STORE_CLIENT_MIN_PORT / MC_STORE_CLIENT_MAX_PORT) until close().

Tenants: setup(..., tenant_id="acme") keeps the store's keys apart from every other
tenant's. The node stores them under a prefix no key of another tenant can produce:
"\\x1f" + tenant_id + "\\n" (tenant ids are printable ASCII, as Mooncake requires, so the
prefix ends at the first "\\n"); the default tenant's keys are stored as given and may not
begin with "\\x1f" (INVALID_KEY). remove_all() and remove_by_regex() act on the tenant's keys
only (a regex removal with the tenant's prefix; see _KeySpace.regex for the patterns it
refuses so that none can reach beyond it; ^ and \\A anchor where the tenant's part of
the key begins). Native kvpool clients see every key.

register_buffer / unregister_buffer are bookkeeping only: kvpool copies from and into any
host memory without registration.

Threads: a store may be shared by threads (kvpool.Client keeps a connection per concurrent
caller); setup() and close() must not run concurrently with other calls.
"""

import array
import ctypes
import dataclasses
import enum
import http.server
import itertools
import json
import logging
import operator
import os
import random
import re
import socket
import sys
import threading
import time
import types
import warnings
import weakref

from ctypes import byref, c_char_p

from . import _native
from .client import (Client, PutOptions, _Pins, _encode, _u64, _addr, _iov_table, _iov_nested,
                     fetch,
                     KeyTable, TENANT_MARK, _key_table, _int_list, _batch_lookup, EXIST_FN,
                     LOCAL_FNS, DEFAULT_TIMEOUT)
from .segment import SharedSegment
from .status import Status, Error, error_for

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ReplicaStatus",
           "ObjectDataType", "ReplicaDescriptor", "MemoryDescriptor", "DiskDescriptor",
           "Descriptor", "MooncakeHostMemAllocator", "MooncakeStoreConfig", "parse_size",
           "install"]

logger = logging.getLogger("kvpool.mooncake")

OK = 0
INTERNAL_ERROR = int(Status.INTERNAL_ERROR)
INVALID_PARAMS = int(Status.INVALID_PARAMS)
INVALID_KEY = int(Status.INVALID_KEY)
NOT_FOUND = int(Status.OBJECT_NOT_FOUND)
EXISTS = int(Status.OBJECT_ALREADY_EXISTS)
OVERFLOW = int(Status.BUFFER_OVERFLOW)
PERMISSION_DENIED = int(Status.PERMISSION_DENIED)
RPC_FAIL = int(Status.RPC_FAIL)
DFS_SERVICE_UNAVAILABLE = -1601     #  Mooncake's code; kvpool has no DFS tier
DFS_ARENA_STATUS = ("not configured: kvpool has no DFS tier; a session reads from the node's "
                    "memory or its disk tier, with no client-side arena to fill first")

#   health_check() (mooncake-store/include/pyclient.h, HealthCheckStatus)
HC_HEALTHY, HC_NOT_INITIALIZED, HC_MASTER_UNREACHABLE = 0, 1, 2

#   Mooncake's setup() defaults (store_py.cpp, types.h) and its connectors' config defaults.
DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024
DEFAULT_LOCAL_BUFFER_SIZE = 16 * 1024 * 1024
DEFAULT_MASTER = "127.0.0.1:50051"
DEFAULT_TENANT = "default"
DEFAULT_CLIENT_HTTP_PORT = 9300
CONFIG_GLOBAL_SEGMENT_SIZE = 3355443200
CONFIG_LOCAL_BUFFER_SIZE = 1073741824
CLIENT_PORT_RANGE = (12300, 14300)      #  real_client.cpp: MC_STORE_CLIENT_MIN/MAX_PORT

#   batch_replica_clear() clears only keys this store put (Mooncake's client_id check); the
#   store remembers at most this many of them, the oldest forgotten first.
OWNED_KEYS_MAX = 1 << 20

_U64_MAX = (1 << 64) - 1


class KvpoolDropInWarning(UserWarning):
    """A Mooncake argument kvpool accepts but does not act on (yet)."""


def _warn(text):
    logger.warning(text)
    warnings.warn(text, KvpoolDropInWarning, stacklevel=4)


# ---- Mooncake's local hot cache ---------------------------------------------------------

#   Mooncake's defaults (client_service.cpp, InitLocalHotCache): off unless the size is set;
#   16 MiB blocks; admission after 2 reads (its CountMinSketch threshold).
HOT_BLOCK_SIZE = 16 * 1024 * 1024
HOT_ADMISSION_THRESHOLD = 2
_hot_cache_said = False


def _env_count(name, default, low=1, high=None):
    """A positive decimal integer from the environment, read as Mooncake reads it (raw bytes
    or a count, no suffix): default when unset; default with a warning when it is not one."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text.strip(), 10)
    except ValueError:
        value = None
    if value is None or text.strip().startswith(("-", "+")) or value < low or (
            high is not None and value > high):
        logger.warning("Invalid %s=%r, using %s", name, text,
                       "no local hot cache" if default == 0 else "the default %d" % default)
        return default
    return value


def _local_hot_cache(client):
    """MC_STORE_LOCAL_HOT_CACHE_SIZE, MC_STORE_LOCAL_HOT_BLOCK_SIZE and
    MC_STORE_LOCAL_HOT_ADMISSION_THRESHOLD, with Mooncake's meaning, on kvpool's process hot
    cache (kvpool.Client's hot_cache_*): the size is the memory for copies of values read
    from other machines (raw bytes; unset, 0 or invalid: off); the block size, the largest
    value kept (Mooncake keeps a value in one block of that size, a larger one not at all;
    kvpool counts each value's own size against the total instead of a whole block); the
    threshold, the reads (1 to 255) that admit a key (within 60 s here, where Mooncake's
    sketch forgets slowly). Each get of a kept value asks the node one EXIST naming its
    version, so a value removed or written again is never served from memory (Mooncake's
    client bumps its own generations instead, which other clients' writes do not reach).
    On the node's machine (the fast path), nothing is kept in the process: the node's host
    cache (kvpoold --hot-cache-size) serves every process there; said once."""
    global _hot_cache_said
    size = _env_count("MC_STORE_LOCAL_HOT_CACHE_SIZE", 0)
    if not size:
        return
    if client.fast_path:
        if not _hot_cache_said:
            _hot_cache_said = True
            logger.info("MC_STORE_LOCAL_HOT_CACHE_SIZE: the kvpoold node is on this machine; "
                        "its host hot cache (kvpoold --hot-cache-size) serves this process, "
                        "which keeps no copies of its own")
        return
    block = _env_count("MC_STORE_LOCAL_HOT_BLOCK_SIZE", HOT_BLOCK_SIZE)
    admit = _env_count("MC_STORE_LOCAL_HOT_ADMISSION_THRESHOLD", HOT_ADMISSION_THRESHOLD,
                       high=255)
    try:
        client.set_hot_cache(size, admit=admit, max_object=block)
    except Error as exc:
        logger.warning("MC_STORE_LOCAL_HOT_CACHE_SIZE=%d: no local hot cache (%s)", size, exc)


# ---- argument conversion, as pybind11 does it -----------------------------------------

def _uint(value, what):
    """value as an unsigned 64-bit int (size_t, uintptr_t): pybind11 raises TypeError for
    anything else, a negative number included."""
    if isinstance(value, float):
        raise TypeError("%s must be an int, not float" % what)
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int, not %s" % (what, type(value).__name__)) from None
    if number < 0 or number > _U64_MAX:
        raise TypeError("%s out of range for an unsigned 64-bit int: %d" % (what, number))
    return number


def _uints(values, what):
    """A sequence of unsigned ints as an array.array("Q"); TypeError as pybind11 would."""
    if isinstance(values, (str, bytes, bytearray)) or not hasattr(values, "__len__"):
        raise TypeError("%s must be a list of ints, not %s" % (what, type(values).__name__))
    try:
        return array.array("Q", values)
    except OverflowError:
        raise TypeError("%s: a negative or too large int" % what) from None
    except TypeError:
        return array.array("Q", [_uint(v, what) for v in values])


def _key_list(keys):
    if isinstance(keys, (str, bytes, bytearray)) or not hasattr(keys, "__len__"):
        raise TypeError("keys must be a list of str, not %s" % type(keys).__name__)
    return keys


def _nested(lists, what):
    """A list of lists of unsigned ints (std::vector<std::vector<...>>)."""
    if isinstance(lists, (str, bytes, bytearray)) or not hasattr(lists, "__len__"):
        raise TypeError("%s must be a list of lists, not %s" % (what, type(lists).__name__))
    return [_uints(inner, what) for inner in lists]


def _outer(value, what):
    """The outer list of a nested argument (std::vector<...>): TypeError for a str or a
    non-sequence, as pybind11 raises."""
    if isinstance(value, (str, bytes, bytearray)) or not hasattr(value, "__len__"):
        raise TypeError("%s must be a list, not %s" % (what, type(value).__name__))
    return value


def _buffer_only(value):
    """A value is a buffer (or a CPU tensor): an int address is no value (TypeError, as
    pybind11's py::buffer raises)."""
    if isinstance(value, (int, str)):
        raise TypeError("a bytes-like object is required, not %s" % type(value).__name__)


def _as_str(key):
    if isinstance(key, str):
        return key
    return bytes(key).decode("utf-8", "replace")


# ---- enums and ReplicateConfig ---------------------------------------------------------

class SoftPinAction(enum.IntEnum):
    """What a put does to the object's soft pin (Mooncake's enum)."""
    PRESERVE = 0     #  leave as it is (a new object: not pinned)
    ENABLE = 1
    DISABLE = 2


class ReplicaStatus(enum.IntEnum):
    """A replica's state (Mooncake's replica.h). kvpool shows readers complete replicas only."""
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ObjectDataType(enum.IntEnum):
    """What an object holds (Mooncake's types.h); a label only, in kvpool as in Mooncake."""
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


def _str_list(value, what):
    if value is None or isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError("%s must be a list of str" % what)
    out = []
    for item in value:
        if isinstance(item, bytes):
            item = item.decode("utf-8")
        if not isinstance(item, str):
            raise TypeError("%s must be a list of str, not of %s" % (what, type(item).__name__))
        out.append(item)
    return out


class ReplicateConfig:
    """Placement and pinning of a put, with Mooncake's fields, defaults and type checks
    (store_py.cpp binds replica.h's ReplicateConfig field for field).

    soft_pin_ttl_ms is None (the node's default) or an int in [0, 2**64); anything else
    raises TypeError. group_ids is None or a list of str, one per key of the put."""

    def __init__(self):
        self._replica_num = 1
        self._nof_replica_num = 0
        self._dfs_replica_num = 0
        self._soft_pin_action = SoftPinAction.PRESERVE
        self._soft_pin_ttl_ms = None
        self._with_hard_pin = False
        self._preferred_segment = ""
        self._preferred_segments = []
        self._preferred_nof_segments = []
        self._prefer_alloc_in_same_node = False
        self._data_type = ObjectDataType.UNKNOWN
        self._group_ids = None

    def _size(name):    # noqa: N805 (a property factory)
        def get(self):
            return getattr(self, "_" + name)

        def set(self, value):
            setattr(self, "_" + name, _uint(value, name))
        return property(get, set)

    replica_num = _size("replica_num")
    nof_replica_num = _size("nof_replica_num")
    dfs_replica_num = _size("dfs_replica_num")

    def _flag(name):    # noqa: N805
        def get(self):
            return getattr(self, "_" + name)

        def set(self, value):
            setattr(self, "_" + name, bool(value))
        return property(get, set)

    with_hard_pin = _flag("with_hard_pin")
    prefer_alloc_in_same_node = _flag("prefer_alloc_in_same_node")

    def _strings(name):     # noqa: N805
        def get(self):
            return getattr(self, "_" + name)

        def set(self, value):
            setattr(self, "_" + name, _str_list(value, name))
        return property(get, set)

    preferred_segments = _strings("preferred_segments")
    preferred_nof_segments = _strings("preferred_nof_segments")
    del _size, _flag, _strings

    @property
    def preferred_segment(self):
        return self._preferred_segment

    @preferred_segment.setter
    def preferred_segment(self, value):
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        if not isinstance(value, str):
            raise TypeError("preferred_segment must be a str")
        self._preferred_segment = value

    @property
    def soft_pin_action(self):
        return self._soft_pin_action

    @soft_pin_action.setter
    def soft_pin_action(self, value):
        try:
            self._soft_pin_action = SoftPinAction(value)
        except ValueError:
            raise TypeError("soft_pin_action must be a SoftPinAction, not %r" % (value,)) from None

    @property
    def soft_pin_ttl_ms(self):
        """None: the node's default soft-pin TTL."""
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value):
        self._soft_pin_ttl_ms = None if value is None else _uint(value, "soft_pin_ttl_ms")

    @property
    def data_type(self):
        return self._data_type

    @data_type.setter
    def data_type(self, value):
        try:
            self._data_type = ObjectDataType(value)
        except ValueError:
            raise TypeError("data_type must be an ObjectDataType, not %r" % (value,)) from None

    @property
    def group_ids(self):
        """None, or per key of a put the group it belongs to ("" for none)."""
        return self._group_ids

    @group_ids.setter
    def group_ids(self, value):
        self._group_ids = None if value is None else _str_list(value, "group_ids")

    @property
    def with_soft_pin(self):
        """kvpool's shorthand: soft_pin_action == ENABLE."""
        return self._soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, value):
        self._soft_pin_action = SoftPinAction.ENABLE if value else SoftPinAction.PRESERVE

    def __str__(self):
        text = ("ReplicateConfig: { replica_num: %d, nof_replica_num: %d, dfs_replica_num: %d, "
                "soft_pin_action: %s, soft_pin_ttl_ms: %s, with_hard_pin: %d, "
                "preferred_segments: [%s]"
                % (self._replica_num, self._nof_replica_num, self._dfs_replica_num,
                   self._soft_pin_action.name,
                   "default" if self._soft_pin_ttl_ms is None else self._soft_pin_ttl_ms,
                   self._with_hard_pin, ", ".join(self._preferred_segments)))
        if self._preferred_segment:
            text += ", preferred_segment (deprecated): " + self._preferred_segment
        text += ", preferred_nof_segments: [%s]" % ", ".join(self._preferred_nof_segments)
        text += ", prefer_alloc_in_same_node: %d" % self._prefer_alloc_in_same_node
        if self._group_ids is not None:
            text += ", group_ids: [%s]" % ", ".join(self._group_ids)
        return text + " }"

    __repr__ = __str__

    def check(self, nkeys, multi_buffers=False):
        """The status Mooncake's client and master answer a put with this config for nkeys keys
        before storing anything: 0, or INVALID_PARAMS (replica_num 0, NoF replicas, a soft-pin
        TTL without ENABLE, group_ids not one per key, prefer_alloc_in_same_node where the put
        form refuses it) or DFS_SERVICE_UNAVAILABLE (a DFS replica: kvpool has no DFS tier)."""
        if self._replica_num == 0 and self._nof_replica_num == 0 and self._dfs_replica_num == 0:
            return INVALID_PARAMS
        if self._dfs_replica_num > 1 or (self._dfs_replica_num and not self._replica_num):
            return INVALID_PARAMS
        if self._nof_replica_num:
            return INVALID_PARAMS
        if self._dfs_replica_num:
            return DFS_SERVICE_UNAVAILABLE
        if self._prefer_alloc_in_same_node and (not multi_buffers or self._replica_num != 1):
            return INVALID_PARAMS
        if self._soft_pin_ttl_ms is not None and self._soft_pin_action != SoftPinAction.ENABLE:
            return INVALID_PARAMS
        if self._group_ids is not None and len(self._group_ids) != nkeys:
            return INVALID_PARAMS
        return OK

    def to_put_options(self, rename=None):
        """kvpool.PutOptions for this config; rename maps segment names (hostnames) to
        kvpool segment names. A soft pin with TTL 0 pins nothing, as in Mooncake; TTL None is
        the node's default."""
        names = list(self._preferred_segments)
        if not names and self._preferred_segment:
            names = [self._preferred_segment]
        if rename is not None:
            names = [rename(name) for name in names]
        ttl = self._soft_pin_ttl_ms
        soft = self._soft_pin_action == SoftPinAction.ENABLE and ttl != 0
        return PutOptions(replica_num=self._replica_num, preferred_segments=names,
                          soft_pin=soft, soft_pin_ttl_ms=ttl or 0,
                          hard_pin=self._with_hard_pin)


# ---- replica descriptors ----------------------------------------------------------------

class Descriptor:
    """Where a memory replica's bytes are (Mooncake's AllocatedBuffer::Descriptor). In kvpool:
    size, buffer_address the offset in its segment, transport_endpoint the segment (this
    store's hostname for its own segment, else the node's segment name)."""

    def __init__(self, size=0, buffer_address=0, transport_endpoint=""):
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self):
        return ("<Descriptor size=%d buffer_address=%d transport_endpoint=%s>"
                % (self.size, self.buffer_address, self.transport_endpoint))


class MemoryDescriptor:
    def __init__(self, buffer_descriptor):
        self.buffer_descriptor = buffer_descriptor

    def __repr__(self):
        return "<MemoryDescriptor %r>" % (self.buffer_descriptor,)


class DiskDescriptor:
    def __init__(self, file_path="", object_size=0):
        self.file_path = file_path
        self.object_size = object_size


class ReplicaDescriptor:
    """One replica of an object (Mooncake's Replica::Descriptor). Every kvpool replica is a
    complete memory replica."""

    def __init__(self, memory, status=ReplicaStatus.COMPLETE):
        self._memory = memory
        self.status = status

    def is_memory_replica(self):
        return True

    def is_disk_replica(self):
        return False

    def is_local_disk_replica(self):
        return False

    def get_memory_descriptor(self):
        return self._memory

    def get_disk_descriptor(self):
        raise RuntimeError("Expected DiskDescriptor")

    def __repr__(self):
        return "<ReplicaDescriptor %s %r>" % (self.status.name, self._memory.buffer_descriptor)


# ---- MooncakeHostMemAllocator -------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_PROT_RW, _MAP_SHARED = 0x1 | 0x2, 0x01

_host_memory = {}               #  address -> (fd, size): one table per process, as Mooncake's
_host_memory_lock = threading.Lock()    #  ShmHelper is one instance per process


class MooncakeHostMemAllocator:
    """Shared host memory for a KV pool (Mooncake's ShmHelper through
    MooncakeHostMemAllocator, which SGLang's standalone-storage mode allocates its host KV
    pool with). alloc(size) returns the address of size bytes of a memfd mapped shared, its
    pages committed; free(address) unmaps it and returns 0, or -1 for an address alloc did
    not return. alloc raises RuntimeError when the memory cannot be had."""

    def alloc(self, size):
        size = _uint(size, "size")
        try:
            fd = os.memfd_create("kvpool-host-mem", os.MFD_CLOEXEC)
        except OSError as exc:
            raise RuntimeError("Failed to create anonymous shared memory: %s" % exc) from None
        try:
            os.ftruncate(fd, size)
            if size:
                os.posix_fallocate(fd, 0, size)
            address = _libc.mmap(None, size, _PROT_RW, _MAP_SHARED, fd, 0)
            if address in (None, _MAP_FAILED):
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        except OSError as exc:
            os.close(fd)
            raise RuntimeError("Failed to map shared memory of %d bytes: %s"
                               % (size, exc)) from None
        with _host_memory_lock:
            _host_memory[address] = (fd, size)
        return address

    def free(self, ptr):
        ptr = _uint(ptr, "ptr")
        with _host_memory_lock:
            entry = _host_memory.pop(ptr, None)
        if entry is None:
            return -1
        fd, size = entry
        rc = _libc.munmap(ptr, size)
        os.close(fd)
        return 0 if rc == 0 else -1


# ---- sizes, addresses, hostnames ---------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value):
    """A size in bytes from an int or a string: 1073741824, "4GB", "512mb", "1.5GiB", "64k".
    Multiples are binary (1 KB = 1024 bytes), as in kvpoold and Mooncake's configs.
    Raises ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError("not a size: %r" % (value,))
    if isinstance(value, int):
        if value < 0:
            raise ValueError("negative size: %d" % value)
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        raise ValueError("not a size: %r" % (value,))
    match = _SIZE_RE.match(value)
    if not match or (match.group(3) and not match.group(2)):
        raise ValueError("not a size: %r" % (value,))
    number, unit = match.group(1), match.group(2).lower()
    if "." in number:
        bytes_ = float(number) * _SCALE[unit]
        if not bytes_.is_integer():
            raise ValueError("not a whole number of bytes: %r" % (value,))
        return int(bytes_)
    return int(number) * _SCALE[unit]


def endpoint_of(master_server_addr):
    """The ZeroMQ endpoint for a Mooncake master address: "host:port" -> "tcp://host:port",
    "host" -> "tcp://host:50051"; tcp://, ipc:// and inproc:// endpoints pass through."""
    addr = (master_server_addr or "").strip()
    if not addr:
        return "tcp://" + DEFAULT_MASTER
    if "://" in addr:
        scheme = addr.split("://", 1)[0]
        if scheme not in ("tcp", "ipc", "inproc"):
            raise ValueError("unsupported master address %r (kvpool speaks ZeroMQ: "
                             "host:port, tcp://, ipc://)" % addr)
        return addr
    if addr.startswith("["):                      #  [v6]:port
        return "tcp://" + addr if "]:" in addr else "tcp://%s:50051" % addr
    if addr.count(":") == 1:
        return "tcp://" + addr
    return "tcp://%s:50051" % addr


def has_explicit_port(hostname):
    """True for "host:port" and "[v6]:port" (Mooncake's hasExplicitPort)."""
    if hostname.startswith("["):
        head, _, port = hostname.rpartition("]:")
        return bool(head) and port.isdigit()
    if hostname.count(":") == 1:
        return hostname.rsplit(":", 1)[1].isdigit()
    return False


def _with_port(hostname, port):
    if ":" in hostname and not hostname.startswith("["):
        return "[%s]:%d" % (hostname, port)
    return "%s:%d" % (hostname, port)


def _port_range():
    """MC_STORE_CLIENT_MIN_PORT / MAX_PORT, falling back to 12300-14300 when either is not a
    port or the range is empty (Mooncake's ValidatePortRange)."""
    try:
        low = int(os.environ.get("MC_STORE_CLIENT_MIN_PORT", CLIENT_PORT_RANGE[0]))
        high = int(os.environ.get("MC_STORE_CLIENT_MAX_PORT", CLIENT_PORT_RANGE[1]))
    except ValueError:
        return CLIENT_PORT_RANGE
    if not (1 <= low <= high <= 65535):
        return CLIENT_PORT_RANGE
    return low, high


def _hold_port(tries=20):
    """A TCP socket bound to a free port of the client port range, held so no other store of
    this machine gets the port (Mooncake's AutoPortBinder); None when none is free."""
    low, high = _port_range()
    for _ in range(tries):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("0.0.0.0", random.randint(low, high)))
            return sock
        except OSError:
            sock.close()
    return None


def _valid_tenant(tenant):
    """Mooncake's TenantId::IsValid: printable ASCII, not starting with '_'."""
    return bool(tenant) and tenant[0] != "_" and all(0x20 <= ord(c) < 0x7f for c in tenant)


# ---- a tenant's keys ----------------------------------------------------------------------

TENANT_END = b"\n"             # TENANT_MARK comes from client, whose key tables refuse it

#   What regex() lets through: the syntax whose parentheses this parser and PCRE2 read alike.
_REGEX_REFUSED = (
    (re.compile(r"\(\?[a-zA-Z^-]*x"), "the x option (comments change where groups end)"),
    (re.compile(r"\(\?#"), "(?# comments"),
    (re.compile(r"\(\?C"), "callouts"),
    (re.compile(r"\(\*"), "verbs and start-of-pattern options"),
    (re.compile(r"\\Q"), "\\Q...\\E quoting"),
)


def _scan(pattern):
    """(reason, anchors) for pattern (bytes): reason None if it is a self-contained PCRE2
    pattern, every ')' closing a group it opened, so it cannot close a group around it and
    add an alternative outside it; anchors, the (offset, length) of each ^ and \\A that
    anchors at the subject's start. Conservative: refuses what it does not read exactly as
    PCRE2 does."""
    text = pattern.decode("latin-1")
    for regex, what in _REGEX_REFUSED:
        if regex.search(text):
            return "not supported in a scoped pattern: " + what, []
    anchors = []
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 >= n:
                return "a trailing backslash", []
            if text[i + 1] == "A":
                anchors.append((i, 2))
            i += 3 if text[i + 1] == "c" else 2         #  \cX takes one more character
            continue
        if c == "[":
            i += 1
            if i < n and text[i] == "^":
                i += 1
            if i < n and text[i] == "]":
                i += 1                                  #  a leading ']' is literal
            while i < n and text[i] != "]":
                if text[i] == "\\":
                    i += 2
                    continue
                if text[i] == "[":
                    return "'[' inside a character class (POSIX classes)", []
                i += 1
            if i >= n:
                return "an unterminated character class", []
            i += 1
            continue
        if c == "^":
            anchors.append((i, 1))
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return "an unmatched ')'", []
        i += 1
    return (None if depth == 0 else "an unclosed '('"), anchors


def _whole(names, index):
    return isinstance(index, range) and len(index) == len(names)


def _table(names, index):
    """C's key array (char *[]) of the names at index (a list of positions, or a range)."""
    if isinstance(names, KeyTable) and _whole(names, index):
        return names
    sub = [names[i] for i in index]
    return (c_char_p * len(sub))(*sub)


def _subset(names, index):
    """The names at index, as a list."""
    if _whole(names, index):
        return names.names() if isinstance(names, KeyTable) else names
    return [names[i] for i in index]


def _mapped(results, value, replacement):
    """results (an array.array) as a list, value replaced by replacement; the scan is C's."""
    out = _int_list(results)
    if value in results:
        out = [replacement if r == value else r for r in out]
    return out


class _KeySpace:
    """How a tenant's keys are named in the node: prefix + the key's UTF-8 bytes, the prefix
    "" for the default tenant and "\\x1f<tenant>\\n" for another (tenant ids are printable
    ASCII, so no tenant's prefix begins another's, and no key of the default tenant may begin
    with "\\x1f")."""

    def __init__(self, tenant=DEFAULT_TENANT):
        self.tenant = tenant
        self.prefix = (b"" if tenant == DEFAULT_TENANT
                       else TENANT_MARK + tenant.encode("ascii") + TENANT_END)

    def key(self, key):
        """The node's name for key; TypeError for a non-string, Error(INVALID_KEY) for a key
        no C string holds (a NUL byte) or a default-tenant key that would name another
        tenant's."""
        data = _encode(key)
        if b"\0" in data:
            raise error_for(Status.INVALID_KEY, "key contains a NUL byte")
        if not self.prefix and data.startswith(TENANT_MARK):
            raise error_for(Status.INVALID_KEY, "a key may not begin with \\x1f (the tenant "
                                                "mark)")
        return self.prefix + data

    def keys(self, keys):
        """(names, statuses): the node's name per key (None where it has none) and None, or a
        list with INVALID_KEY where a key has no name. TypeError for a non-string. When every
        key has a name, names is usually a KeyTable (client.KeyTable): C's key array of the
        names, made without a Python operation per key."""
        table = _key_table(_key_list(keys), self.prefix)
        if table is not None:
            return table, None
        names = []
        statuses = None
        for i, key in enumerate(_key_list(keys)):
            try:
                names.append(self.key(key))
            except Error as exc:
                if statuses is None:
                    statuses = [None] * len(keys)
                statuses[i] = exc.status
                names.append(None)
        return names, statuses

    def all_pattern(self):
        """The pattern of every key of this tenant."""
        if self.prefix:
            return b"\\A" + self._quoted_prefix()
        return b"\\A(?!\\x1f)"

    def regex(self, pattern):
        """(pattern, None): pattern (the caller's, on the tenant's keys) as a pattern on the
        node's keys that matches only this tenant's, or (None, reason) when the pattern is
        not self-contained (_scan). In another tenant's store ^ and \\A in the pattern anchor
        where the caller's key begins (after the prefix)."""
        why, anchors = _scan(pattern)
        if why is not None:
            return None, why
        if not self.prefix:
            return b"\\A(?!\\x1f)[\\s\\S]*?(?:" + pattern + b")", None
        start = b"(?<=\\A" + self._quoted_prefix() + b")"
        pieces, at = [], 0
        for offset, length in anchors:
            pieces.append(pattern[at:offset])
            pieces.append(start)
            at = offset + length
        pieces.append(pattern[at:])
        return (b"\\A" + self._quoted_prefix() + b"[\\s\\S]*?(?:" + b"".join(pieces) + b")",
                None)

    def _quoted_prefix(self):
        return b"".join(b"\\x%02x" % byte for byte in self.prefix)


# ---- the store ----------------------------------------------------------------------------

class _Resources:
    """What a set-up store holds, released by close() or at interpreter exit, only in the
    process that made it (a forked child must not unmount its parent's segment)."""

    def __init__(self):
        self.pid = os.getpid()
        self.client = None
        self.segment = None
        self.port_socket = None
        self.http = None
        self.sessions = {}          #  name -> pins this process holds for its get sessions
        self.leased = {}            #  names of get sessions held by a read's lease alone
        self.ttl = None             #  get_lease_ttl_ms(): (answer, higher TTL seen, since)
        self.lock = threading.Lock()

    def close(self):
        if self.pid != os.getpid():
            return
        if self.http is not None:
            self.http.close()
            self.http = None
        client = self.client
        if client is not None and not client.closed:
            with self.lock:
                pinned, self.sessions = list(self.sessions), {}
                self.leased = {}
            if pinned:
                _release(client, pinned)
        segment = self.segment
        if segment is not None and segment.pid == os.getpid():
            if segment.id is not None and client is not None and not client.closed:
                try:
                    client.unmount_segment(segment.id)
                except Error:
                    pass
                segment.id = None
            segment.close()
        if self.port_socket is not None:
            self.port_socket.close()
            self.port_socket = None
        if client is not None:
            client.close()


def _release(client, names):
    """RELEASE of the pins the session keys names hold (statuses ignored)."""
    try:
        handle = client._acquire()
    except Error:
        return
    try:
        karr = (c_char_p * len(names))(*names)
        statuses = array.array("i", bytes(4 * len(names)))
        _native.release(handle, len(names), karr, _addr(statuses))
    finally:
        client._idle.append(handle)


def _exists_to_ok(status):
    return OK if status == EXISTS else status


def _too_small_to_invalid(result):
    """A buffer too small for its value: INVALID_PARAMS in Mooncake."""
    return INVALID_PARAMS if result == OVERFLOW else result


class MooncakeDistributedStore:
    """Mooncake Store's Python class, served by kvpool. See the module docstring."""

    #  Seconds a request may wait for the node's reply (setup's first ping included).
    timeout = DEFAULT_TIMEOUT

    def __init__(self):
        self._res = None
        self._finalizer = None
        self._client = None
        self._segment = None
        self._space = _KeySpace()
        self._hostname = ""
        self._local_hostname = ""
        self._registered = {}
        self._owned = {}
        self._owned_lock = threading.Lock()
        self._prefetched_tokens = 0

    # ---- setup -----------------------------------------------------------------------
    def setup(self, *args, **kwargs):
        """setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
                 protocol, rdma_devices, master_server_addr, engine=None,
                 enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
                 enable_client_http_server=False, client_http_port=9300)
        or setup(config_dict) with those keys (or the MOONCAKE_CONFIG_PATH JSON names
        device_name, master_server_address) and string or int values; local_hostname and
        metadata_server are required there, as in Mooncake. Returns 0, or a negative status
        (INVALID_PARAMS for a bad argument, RPC_FAIL when the node does not answer).

        kvpool's own keywords curve_secret (this client's certificate, the NAME_secret file of
        `kvpool keygen NAME`) and curve_server (the node's public certificate), or the same keys
        in the dict, turn on CURVE for a node that runs it (docs/security.md); both or neither.

        engine, enable_ssd_offload and ssd_offload_path are accepted with a warning that names
        them: kvpool has no transfer engine to share, and its disk tier is the node's setting
        (kvpoold --disk-dir), not a client's."""
        if len(args) == 1 and not kwargs and isinstance(args[0], dict):
            try:
                params = _params_from_dict(args[0])
            except (ValueError, TypeError):
                return INVALID_PARAMS
        else:
            params = _bind_setup(*args, **kwargs)
            for name in ("global_segment_size", "local_buffer_size"):
                value = params[name]
                if isinstance(value, int) and not isinstance(value, bool):
                    params[name] = _uint(value, name)
                else:
                    try:
                        params[name] = parse_size(value)
                    except ValueError:
                        return INVALID_PARAMS
        return self._setup(params)

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address, *,
                    curve_secret=None, curve_server=None):
        """Mooncake's client-of-a-local-store mode: connects to server_address (here the
        kvpoold node), contributes nothing (mem_pool_size is the real client's business).
        curve_secret and curve_server as in setup(). Returns 0 or a negative status."""
        _uint(mem_pool_size, "mem_pool_size")
        _uint(local_buffer_size, "local_buffer_size")
        if not isinstance(server_address, str):
            raise TypeError("server_address must be a str")
        return self._setup({"local_hostname": "localhost", "metadata_server": "",
                            "global_segment_size": 0, "local_buffer_size": local_buffer_size,
                            "master_server_addr": server_address,
                            "curve_secret": curve_secret, "curve_server": curve_server})

    def _setup(self, params):
        if self._res is not None:
            self.close()
        local_hostname = params.get("local_hostname") or ""
        if not local_hostname:
            return INVALID_PARAMS
        tenant = params.get("tenant_id") or DEFAULT_TENANT
        if not _valid_tenant(tenant):
            return INVALID_PARAMS
        http_on = bool(params.get("enable_client_http_server"))
        http_port = params.get("client_http_port", DEFAULT_CLIENT_HTTP_PORT)
        if http_on and not 0 < http_port <= 65535:
            return INVALID_PARAMS
        try:
            endpoint = endpoint_of(params.get("master_server_addr", DEFAULT_MASTER))
        except ValueError:
            return INVALID_PARAMS
        res = _Resources()
        curve_secret, curve_server = params.get("curve_secret"), params.get("curve_server")
        if (curve_secret is None) != (curve_server is None):
            return INVALID_PARAMS
        try:
            res.client = Client(endpoint, timeout=self.timeout, curve_secret=curve_secret,
                                curve_server=curve_server)
        except Error as exc:
            return exc.status
        size = params.get("global_segment_size", 0)
        if size > 0:
            try:
                res.segment = SharedSegment(size)
            except OSError:
                res.close()
                return int(Status.NO_AVAILABLE_HANDLE)
            try:
                res.segment.id = res.client.mount_segment(res.segment.name, size)
            except Error as exc:
                res.close()
                return exc.status
        if has_explicit_port(local_hostname):
            hostname = local_hostname
        else:
            res.port_socket = _hold_port()
            if res.port_socket is None:
                res.close()
                return INTERNAL_ERROR
            hostname = _with_port(local_hostname, res.port_socket.getsockname()[1])
        self._res = res
        self._client = res.client
        self._segment = res.segment
        self._space = _KeySpace(tenant)
        self._hostname = hostname
        self._local_hostname = local_hostname
        self._owned = {}
        self._finalizer = weakref.finalize(self, res.close)
        if params.get("engine") is not None:
            _warn("setup(engine=...): kvpool has no Mooncake transfer engine to share; the "
                  "engine is not used")
        if params.get("enable_ssd_offload"):
            _warn("setup(enable_ssd_offload=True): not used; the disk tier is the node's own "
                  "setting (kvpoold --disk-dir, --disk-capacity), for every client at once")
        if params.get("ssd_offload_path"):
            _warn("setup(ssd_offload_path=%r): not used; the disk tier's directory is the "
                  "node's own setting (kvpoold --disk-dir)" % (params["ssd_offload_path"],))
        _local_hot_cache(res.client)
        if http_on:
            try:
                res.http = _HttpEndpoints(self, http_port)
            except OSError as exc:
                #  Mooncake goes on without the endpoints when the port is taken.
                _warn("setup(enable_client_http_server=True, client_http_port=%d): cannot "
                      "listen (%s); continuing without the HTTP endpoints" % (http_port, exc))
        return OK

    def close(self):
        """Releases get sessions, unmounts and removes this process's segment (if any),
        stops the HTTP endpoints, lets go of the port and disconnects. Returns 0."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._res = None
        self._client = None
        self._segment = None
        self._registered.clear()
        self._owned = {}
        return OK

    def health_check(self):
        """0 if the node answers, 1 before setup() or after close(), 2 if the node does not
        answer (Mooncake's HC_HEALTHY, HC_NOT_INITIALIZED, HC_MASTER_UNREACHABLE)."""
        if self._client is None:
            return HC_NOT_INITIALIZED
        return HC_HEALTHY if self._code(_native.ping) == OK else HC_MASTER_UNREACHABLE

    def get_hostname(self):
        """"host:port", unique per store: this store's segment name for
        ReplicateConfig.preferred_segment. "" before setup()."""
        return self._hostname

    def segment_name(self):
        """The kvpool name of this process's shared segment ("" without one)."""
        return self._segment.name if self._segment is not None else ""

    def register_buffer(self, buffer_ptr, size):
        """Returns 0 (INVALID_PARAMS before setup): kvpool needs no registration. Kept for
        Mooncake's callers. Host or GPU memory alike: libkvpool recognises CUDA device
        addresses in any put or get call and stages them through pinned host buffers
        (client/device.c), registered or not."""
        buffer_ptr = _uint(buffer_ptr, "buffer_ptr")
        size = _uint(size, "size")
        if self._client is None:
            return INVALID_PARAMS
        self._registered[buffer_ptr] = size
        return OK

    def unregister_buffer(self, buffer_ptr):
        """Returns 0 for a buffer registered before, INVALID_PARAMS otherwise."""
        buffer_ptr = _uint(buffer_ptr, "buffer_ptr")
        return OK if self._registered.pop(buffer_ptr, None) is not None else INVALID_PARAMS

    def get_offload_rpc_read_count(self):
        """Reads served by the SSD offload RPC: always 0, kvpool has no such RPC (its disk tier
        is the node's, read by the node: kvpool stats' disk_hits); Mooncake's answer for a
        client without one."""
        return 0

    def record_prefetched_tokens(self, tokens):
        """Adds tokens to the count of prefetched tokens SGLang's direct linker reports (shown
        by the HTTP endpoints' /metrics). Returns None."""
        self._prefetched_tokens += _uint(tokens, "tokens")

    # ---- internals -------------------------------------------------------------------
    def _lookup(self, fn, keys):
        """fn (client.EXIST_FN) over keys in one call into kvpool._batch: a status per key,
        the request's status for every key when it failed as a whole. None when a key has
        to be named on its own (the key-by-key path gives it its status)."""
        prefix = self._space.prefix
        local = LOCAL_FNS.get(fn)
        try:
            out = self._code(lambda handle: _batch_lookup(fn, handle, keys, prefix, False, local))
        except ValueError:
            return None
        if isinstance(out, int):
            return [out] * len(keys)
        rc, results = out
        return [rc] * len(results) if rc < 0 else results

    def _code(self, fn, *args):
        """fn(handle, *args) on one of the client's connections; its result, or a status."""
        client = self._client
        if client is None:
            return INVALID_PARAMS
        try:
            handle = client._acquire()
        except Error as exc:
            return exc.status
        try:
            return fn(handle, *args)
        finally:
            client._idle.append(handle)

    def _rename(self, name):
        segment = self._segment
        if segment is not None and name in (self._hostname, self._local_hostname,
                                            segment.name):
            return segment.name
        return name

    def _put_options(self, config, nkeys, multi_buffers=False):
        """(status, options): the C options for config (None for none), or a status for a
        config the put must refuse. TypeError for a config of another type."""
        if config is None:
            return OK, None
        if isinstance(config, PutOptions):
            native = config
        elif isinstance(config, ReplicateConfig):
            status = config.check(nkeys, multi_buffers)
            if status != OK:
                return status, None
            native = config.to_put_options(self._rename)
        else:
            raise TypeError("config must be a ReplicateConfig, not %s" % type(config).__name__)
        try:
            return OK, byref(native._native())
        except Error as exc:
            return exc.status, None

    def _own(self, names, statuses):
        """Remembers the keys this store stored (status 0: new objects, not ones that were
        there) for batch_replica_clear, at most OWNED_KEYS_MAX of them."""
        owned = self._owned
        if statuses.count(OK) == len(statuses):
            new = dict.fromkeys(names)
            new.pop(None, None)
        else:
            new = {name: None for name, status in zip(names, statuses)
                   if status == OK and name is not None}
        with self._owned_lock:
            owned.update(new)
            excess = len(owned) - OWNED_KEYS_MAX
            if excess > 0:
                for name in list(itertools.islice(owned, excess)):
                    del owned[name]

    def _disown(self, names):
        with self._owned_lock:
            owned = self._owned
            for name in owned.keys() & names:
                del owned[name]

    # ---- put -------------------------------------------------------------------------
    def put(self, key, value, config=None):
        """Stores value (any buffer: all its bytes) under key. Returns 0 (also when key
        exists: the first value stays), or a negative status (INVALID_PARAMS for an empty
        value or a refused config)."""
        _buffer_only(value)
        pins = _Pins()
        try:
            address, size = pins.address(value)
            return self._put_one(key, [address, size], config, empty=INVALID_PARAMS)
        finally:
            pins.release()

    def put_parts(self, key, *parts, config=None):
        """Stores the concatenation of parts (1-D bytes-likes; RuntimeError for others, as in
        Mooncake) as one value. Returns 0 (nothing is stored when the parts are all empty,
        as in Mooncake) or a negative status."""
        pins = _Pins()
        try:
            flat = []
            for part in parts:
                view = memoryview(part)          #  TypeError for a non-buffer
                if view.ndim != 1 or view.itemsize != 1:
                    raise RuntimeError("parts must be 1-D bytes-like")
                flat.extend(pins.address(part))
            return self._put_one(key, flat, config, empty=OK)
        finally:
            pins.release()

    def put_from(self, key, buffer_ptr, size, config=None):
        """Stores size bytes at address buffer_ptr under key. Returns 0 (also for a key that
        exists, and for size 0, which stores nothing, as in Mooncake) or a negative status."""
        buffer_ptr = _uint(buffer_ptr, "buffer_ptr")
        size = _uint(size, "size")
        return self._put_one(key, [buffer_ptr, size], config, empty=OK)

    def put_from_with_metadata(self, key, buffer_ptr, metadata_buffer_ptr, size, metadata_size,
                               config=None):
        """Stores metadata_size bytes at metadata_buffer_ptr followed by size bytes at
        buffer_ptr as one value. Mooncake's own codes: 0 (also for size 0, which stores
        nothing, and for a key that exists), -1 before setup or for prefer_alloc_in_same_node,
        and for a failed put the status negated (a positive number)."""
        buffer_ptr = _uint(buffer_ptr, "buffer_ptr")
        metadata_buffer_ptr = _uint(metadata_buffer_ptr, "metadata_buffer_ptr")
        size = _uint(size, "size")
        metadata_size = _uint(metadata_size, "metadata_size")
        if config is not None and not isinstance(config, (ReplicateConfig, PutOptions)):
            raise TypeError("config must be a ReplicateConfig")
        if self._client is None or (isinstance(config, ReplicateConfig)
                                    and config.prefer_alloc_in_same_node):
            return -1
        if size == 0:
            return OK
        rc = self._put_one(key, [metadata_buffer_ptr, metadata_size, buffer_ptr, size], config,
                           empty=OK)
        return -rc if rc < 0 else rc

    def _put_one(self, key, flat, config, empty):
        """Puts one value gathered from flat (address, size, ...). empty: the answer for a
        value of no bytes (Mooncake refuses an empty put, or skips it, by method)."""
        try:
            name = self._space.key(key)
        except Error as exc:
            return exc.status
        if self._client is None:
            return INVALID_PARAMS
        status, opts = self._put_options(config, 1)
        if status != OK:
            return status
        total = sum(flat[1::2])
        if total == 0:
            return empty
        if any(flat[i] == 0 and flat[i + 1] for i in range(0, len(flat), 2)):
            return INVALID_PARAMS
        if len(flat) == 2:
            rc = self._code(_native.put, name, flat[0], flat[1], opts)
        else:
            iov = _u64(flat)
            rc = self._code(_native.put_parts, name, _addr(iov), len(flat) // 2, opts)
        self._own([name], [rc])
        return _exists_to_ok(rc)

    def put_batch(self, keys, values, config=None):
        """Stores values[i] under keys[i]. Returns 0 if every put succeeded (a key that exists
        counts as success), else the first negative status."""
        _key_list(keys)
        if len(keys) != len(values):
            return INVALID_PARAMS
        pins = _Pins()
        try:
            addresses = []
            sizes = []
            for value in values:
                _buffer_only(value)
                address, size = pins.address(value)
                addresses.append(address)
                sizes.append(size)
            results = self._put_batch(keys, _u64(addresses), _u64(sizes), config)
        finally:
            pins.release()
        for result in results:
            if result != OK:
                return result
        return OK

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """put_from for each key. Returns a status per key (0 also for a key that exists;
        INVALID_PARAMS for size 0, as in Mooncake's batch put)."""
        _key_list(keys)
        addresses = _uints(buffer_ptrs, "buffer_ptrs")
        lengths = _uints(sizes, "sizes")
        n = len(keys)
        if len(addresses) != n or len(lengths) != n:
            return [INVALID_PARAMS] * n
        return self._put_batch(keys, addresses, lengths, config)

    def _put_batch(self, keys, addresses, sizes, config):
        n = len(keys)
        names, pre = self._space.keys(keys)
        if n == 0:
            return []
        if self._client is None:
            return [INVALID_PARAMS] * n
        status, opts = self._put_options(config, n)
        if status != OK:
            return [status] * n
        if 0 in sizes or 0 in addresses:
            for i in range(n):
                if sizes[i] == 0 or addresses[i] == 0:
                    if pre is None:
                        pre = [None] * n
                    if pre[i] is None:
                        pre[i] = INVALID_PARAMS

        def run(index):
            karr = _table(names, index)
            addr = _u64([addresses[i] for i in index]) if pre else addresses
            size = _u64([sizes[i] for i in index]) if pre else sizes
            statuses = array.array("i", bytes(4 * len(index)))
            rc = self._code(_native.put_batch, len(index), karr, _addr(addr), _addr(size),
                            opts, _addr(statuses))
            if rc < 0:
                return [rc] * len(index)
            results = _int_list(statuses)
            self._own(_subset(names, index), results)
            return _mapped(statuses, EXISTS, OK)
        return _partial(n, pre, run)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Stores, for each key, the concatenation of the buffers all_buffer_ptrs[i] (sizes
        all_sizes[i]). Returns a status per key (0 also for a key that exists)."""
        _key_list(keys)
        ptrs = _nested(all_buffer_ptrs, "all_buffer_ptrs")
        sizes = _nested(all_sizes, "all_sizes")
        n = len(keys)
        if not _shapes_agree(n, ptrs, sizes):
            return [INVALID_PARAMS] * n
        return self._store_batch(keys, ptrs, sizes, config, _native.put_batch_parts,
                                 multi_buffers=True)

    def _store_batch(self, keys, ptrs, sizes, config, fn, multi_buffers=False):
        """Each key's value gathered from its buffers ptrs[i] (sizes[i]), through fn
        (kvpool_put_batch_parts or kvpool_upsert_batch_parts). A status per key; a key that
        exists is success, as in Mooncake."""
        n = len(keys)
        names, pre = self._space.keys(keys)
        if n == 0:
            return []
        if self._client is None:
            return [INVALID_PARAMS] * n
        status, opts = self._put_options(config, n, multi_buffers=multi_buffers)
        if status != OK:
            return [status] * n
        for i in range(n):
            if sum(sizes[i]) == 0 or _null_buffer(ptrs[i], sizes[i]):
                if pre is None:
                    pre = [None] * n
                if pre[i] is None:
                    pre[i] = INVALID_PARAMS

        def run(index):
            karr = _table(names, index)
            iov, starts, nparts = _iov_nested([ptrs[i] for i in index],
                                              [sizes[i] for i in index])
            statuses = array.array("i", bytes(4 * len(index)))
            rc = self._code(fn, len(index), karr, _addr(starts), _addr(nparts), opts,
                            _addr(statuses))
            if rc < 0:
                return [rc] * len(index)
            results = _int_list(statuses)
            self._own(_subset(names, index), results)
            return _mapped(statuses, EXISTS, OK)
        return _partial(n, pre, run)

    # ---- upsert ----------------------------------------------------------------------
    #   As the put forms, but a key that exists gets the new value (kvpool's UPSERT: a reader
    #   sees the whole old or the whole new value; the old one's space is freed once its
    #   readers are done). 0 or a negative status; REPLICA_IS_NOT_READY (-703) while the key
    #   is being written.
    def upsert(self, key, value, config=None):
        """Stores value (any buffer: all its bytes) under key, replacing what is there."""
        _buffer_only(value)
        pins = _Pins()
        try:
            address, size = pins.address(value)
            return self._upsert_one(key, [address, size], config)
        finally:
            pins.release()

    def upsert_from(self, key, buffer_ptr, size, config=None):
        """upsert of size bytes at address buffer_ptr."""
        buffer_ptr = _uint(buffer_ptr, "buffer_ptr")
        size = _uint(size, "size")
        return self._upsert_one(key, [buffer_ptr, size], config)

    def upsert_parts(self, key, *parts, config=None):
        """upsert of the concatenation of parts (1-D bytes-likes)."""
        pins = _Pins()
        try:
            flat = []
            for part in parts:
                view = memoryview(part)
                if view.ndim != 1 or view.itemsize != 1:
                    raise RuntimeError("parts must be 1-D bytes-like")
                flat.extend(pins.address(part))
            return self._upsert_one(key, flat, config)
        finally:
            pins.release()

    def _upsert_one(self, key, flat, config):
        try:
            name = self._space.key(key)
        except Error as exc:
            return exc.status
        if self._client is None:
            return INVALID_PARAMS
        status, opts = self._put_options(config, 1)
        if status != OK:
            return status
        if sum(flat[1::2]) == 0 or any(flat[i] == 0 and flat[i + 1]
                                       for i in range(0, len(flat), 2)):
            return INVALID_PARAMS
        iov = _u64(flat)
        rc = self._code(_native.upsert_parts, name, _addr(iov), len(flat) // 2, opts)
        self._own([name], [rc])
        return rc

    def upsert_batch(self, keys, values, config=None):
        """upsert of values[i] under keys[i]. Returns 0 if every one succeeded, else the
        first negative status."""
        _key_list(keys)
        if len(keys) != len(values):
            return INVALID_PARAMS
        pins = _Pins()
        try:
            pairs = []
            for value in values:
                _buffer_only(value)
                pairs.append(pins.address(value))
            results = self._store_batch(keys, [[a] for a, _ in pairs], [[s] for _, s in pairs],
                                        config, _native.upsert_batch_parts)
        finally:
            pins.release()
        for result in results:
            if result != OK:
                return result
        return OK

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        """upsert_from for each key. Returns a status per key."""
        _key_list(keys)
        addresses = _uints(buffer_ptrs, "buffer_ptrs")
        lengths = _uints(sizes, "sizes")
        if len(addresses) != len(keys) or len(lengths) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        return self._store_batch(keys, [[a] for a in addresses], [[s] for s in lengths], config,
                                 _native.upsert_batch_parts)

    # ---- ranges ----------------------------------------------------------------------
    #   Byte ranges of values, read with kvpool's ranged GET: only the ranges travel. A range
    #   must lie inside its value (INVALID_PARAMS otherwise, as a short read would be).
    def _read_ranges(self, names, offsets, addresses, lengths):
        """One ranged read of len(names) ranges: a list of bytes read or a negative status."""
        n = len(names)
        if n == 0:
            return []
        karr = (c_char_p * n)(*names)
        starts, addrs, sizes = _u64(offsets), _u64(addresses), _u64(lengths)
        results = array.array("q", bytes(8 * n))
        rc = self._code(_native.get_ranges_into, n, karr, _addr(starts), _addr(addrs),
                        _addr(sizes), _addr(results))
        if rc < 0:
            return [rc] * n
        return [r if r < 0 or r == lengths[i] else INVALID_PARAMS
                for i, r in enumerate(_int_list(results))]

    def batch_get_into_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes, all_offsets):
        """For each key, reads all_sizes[i][j] bytes from byte all_offsets[i][j] of its value
        into all_buffer_ptrs[i][j]. Returns per key the bytes read (the sum of its sizes) or a
        negative status."""
        _key_list(keys)
        ptrs = _nested(all_buffer_ptrs, "all_buffer_ptrs")
        sizes = _nested(all_sizes, "all_sizes")
        offsets = _nested(all_offsets, "all_offsets")
        n = len(keys)
        if len(ptrs) != n or len(sizes) != n or len(offsets) != n:
            return [INVALID_PARAMS] * n
        names, pre = self._space.keys(keys)
        if n == 0:
            return []
        if self._client is None:
            return [INVALID_PARAMS] * n
        for i in range(n):
            if not (len(ptrs[i]) == len(sizes[i]) == len(offsets[i])) or any(
                    p == 0 and s for p, s in zip(ptrs[i], sizes[i])):
                if pre is None:
                    pre = [None] * n
                if pre[i] is None:
                    pre[i] = INVALID_PARAMS

        def run(index):
            flat_names, flat_offsets, flat_ptrs, flat_sizes, owner = [], [], [], [], []
            for i in index:
                for ptr, size, offset in zip(ptrs[i], sizes[i], offsets[i]):
                    if size == 0:
                        continue
                    flat_names.append(names[i])
                    flat_offsets.append(offset)
                    flat_ptrs.append(ptr)
                    flat_sizes.append(size)
                    owner.append(i)
            totals = {i: 0 for i in index}
            for i, result in zip(owner, self._read_ranges(flat_names, flat_offsets, flat_ptrs,
                                                          flat_sizes)):
                if totals[i] >= 0:
                    totals[i] = result if result < 0 else totals[i] + result
            return [totals[i] for i in index]
        return _partial(n, pre, run)

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """Ranges of many values into a few buffers: for buffer b, key k of all_keys[b] and
        range r, all_sizes[b][k][r] bytes from byte all_src_offsets[b][k][r] of the value go
        to buffer_ptrs[b] + all_dst_offsets[b][k][r]. Returns the same nesting: per range the
        bytes read or a negative status.

        Shapes that disagree are answered as Mooncake answers them (RealClient::
        get_into_ranges_internal), never raised: the answer has one row per buffer, one per
        key of it (one when all_keys has no entry for the buffer) and one result per range
        (as many as its dst offsets; one when there are none), each INVALID_PARAMS where the
        lists of the buffer (top level: of all buffers; a key: of its ranges) differ in length,
        and for a buffer at address 0. [] when no buffer is given. A range that does not fit
        a buffer registered with register_buffer is INVALID_PARAMS too (an unregistered
        buffer is taken as it is: kvpool needs no registration)."""
        buffers = _uints(buffer_ptrs, "buffer_ptrs")
        keys_of = [_key_list(keys) for keys in _outer(all_keys, "all_keys")]
        dst_of = [_nested(d, "all_dst_offsets") for d in _outer(all_dst_offsets,
                                                                 "all_dst_offsets")]
        src_of = [_nested(s, "all_src_offsets") for s in _outer(all_src_offsets,
                                                                 "all_src_offsets")]
        size_of = [_nested(s, "all_sizes") for s in _outer(all_sizes, "all_sizes")]
        out = []
        for b in range(len(buffers)):
            nkeys = len(keys_of[b]) if b < len(keys_of) else 1
            dst = dst_of[b] if b < len(dst_of) else []
            out.append([[INVALID_PARAMS] * (len(dst[k]) if k < len(dst) else 1)
                        for k in range(nkeys)])
        if self._client is None or not (len(keys_of) == len(dst_of) == len(src_of)
                                        == len(size_of) == len(buffers)):
            return out
        flat_names, flat_offsets, flat_ptrs, flat_sizes, where = [], [], [], [], []
        for b, base in enumerate(buffers):
            keys, dst, src, size = keys_of[b], dst_of[b], src_of[b], size_of[b]
            if base == 0 or not (len(keys) == len(dst) == len(src) == len(size)):
                continue
            capacity = self._registered.get(base)
            names, pre = self._space.keys(keys)
            for k in range(len(keys)):
                if not (len(dst[k]) == len(src[k]) == len(size[k])):
                    continue
                results = out[b][k]
                if pre is not None and pre[k] is not None:
                    results[:] = [pre[k]] * len(results)
                    continue
                for r in range(len(size[k])):
                    if capacity is not None and dst[k][r] + size[k][r] > capacity:
                        continue
                    if size[k][r] == 0:
                        results[r] = 0
                        continue
                    flat_names.append(names[k])
                    flat_offsets.append(src[k][r])
                    flat_ptrs.append(base + dst[k][r])
                    flat_sizes.append(size[k][r])
                    where.append((b, k, r))
        for (b, k, r), result in zip(where, self._read_ranges(flat_names, flat_offsets,
                                                              flat_ptrs, flat_sizes)):
            out[b][k][r] = result
        return out

    # ---- get -------------------------------------------------------------------------
    def get(self, key):
        """The value of key as bytes; b"" on a miss or any error."""
        return self.get_batch([key])[0]

    def get_batch(self, keys):
        """The values of keys as bytes, b"" for each miss or error. Each value is copied once
        (see kvpool.client.fetch)."""
        return self._values(keys, b"", False)

    def get_buffer(self, key):
        """The value of key as a BufferHandle (buffer protocol, ptr(), size()), or None on a
        miss or error."""
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys):
        """A BufferHandle per key, None for each miss or error."""
        return self._values(keys, None, True)

    def _values(self, keys, miss, handles):
        names, pre = self._space.keys(keys)
        n = len(names)
        if n == 0:
            return []
        if self._client is None:
            return [miss] * n

        def run(index):
            karr = _table(names, index)
            result = self._code(fetch, len(index), karr, handles)
            if isinstance(result, int):
                return [miss] * len(index)
            return [miss if isinstance(value, int) else value for value in result[1]]
        return [miss if r is None or isinstance(r, int) else r for r in _partial(n, pre, run)]

    def get_size(self, key):
        """The size of key's value, or a negative status (OBJECT_NOT_FOUND)."""
        try:
            name = self._space.key(key)
        except Error as exc:
            return exc.status
        return self._code(_native.get_size, name)

    def get_into(self, key, buffer_ptr, size):
        """Copies key's value into size bytes at buffer_ptr. Returns the bytes read or a
        negative status (OBJECT_NOT_FOUND; INVALID_PARAMS when the value is larger than the
        buffer, as in Mooncake)."""
        buffer_ptr = _uint(buffer_ptr, "buffer_ptr")
        size = _uint(size, "size")
        try:
            name = self._space.key(key)
        except Error as exc:
            return exc.status
        if buffer_ptr == 0 and size > 0:
            return INVALID_PARAMS
        return _too_small_to_invalid(self._code(_native.get_into, name, buffer_ptr, size))

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        """get_into for each key. Returns per key the bytes read or a negative status."""
        _key_list(keys)
        addresses = _uints(buffer_ptrs, "buffer_ptrs")
        capacities = _uints(sizes, "sizes")
        n = len(keys)
        if len(addresses) != n or len(capacities) != n:
            return [INVALID_PARAMS] * n
        names, pre = self._space.keys(keys)
        if n == 0:
            return []
        if self._client is None:
            return [INVALID_PARAMS] * n
        if 0 in addresses:
            for i in range(n):
                if addresses[i] == 0 and capacities[i]:
                    if pre is None:
                        pre = [None] * n
                    if pre[i] is None:
                        pre[i] = INVALID_PARAMS

        def run(index):
            karr = _table(names, index)
            addr = _u64([addresses[i] for i in index]) if pre else addresses
            cap = _u64([capacities[i] for i in index]) if pre else capacities
            results = array.array("q", bytes(8 * len(index)))
            rc = self._code(_native.get_batch_into, len(index), karr, _addr(addr), _addr(cap),
                            _addr(results))
            if rc < 0:
                return [rc] * len(index)
            return _mapped(results, OVERFLOW, INVALID_PARAMS)
        return _partial(n, pre, run)

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        """Scatters each key's value across its buffers all_buffer_ptrs[i] (sizes
        all_sizes[i]) in order. Returns per key the bytes read or a negative status.
        prefer_alloc_in_same_node is accepted and unused (kvpool reads in place)."""
        _key_list(keys)
        ptrs = _nested(all_buffer_ptrs, "all_buffer_ptrs")
        sizes = _nested(all_sizes, "all_sizes")
        n = len(keys)
        if not _shapes_agree(n, ptrs, sizes):
            return [INVALID_PARAMS] * n
        names, pre = self._space.keys(keys)
        if n == 0:
            return []
        if self._client is None:
            return [INVALID_PARAMS] * n
        for i in range(n):
            if _null_buffer(ptrs[i], sizes[i]):
                if pre is None:
                    pre = [None] * n
                if pre[i] is None:
                    pre[i] = INVALID_PARAMS

        def run(index):
            karr = _table(names, index)
            iov, starts, nbufs = _iov_nested([ptrs[i] for i in index], [sizes[i] for i in index])
            results = array.array("q", bytes(8 * len(index)))
            rc = self._code(_native.get_batch_into_parts, len(index), karr, _addr(starts),
                            _addr(nbufs), _addr(results))
            if rc < 0:
                return [rc] * len(index)
            return _mapped(results, OVERFLOW, INVALID_PARAMS)
        return _partial(n, pre, run)

    # ---- exist and remove ------------------------------------------------------------
    def is_exist(self, key):
        """1 if key exists, 0 if not, or a negative status."""
        try:
            name = self._space.key(key)
        except Error as exc:
            return exc.status
        return self._code(_native.exist, name)

    def batch_is_exist(self, keys):
        """is_exist for each key: a list of 1, 0 or negative statuses."""
        if _batch_lookup is not None and self._client is not None:
            results = self._lookup(EXIST_FN, _key_list(keys))
            if results is not None:
                return results
        names, pre = self._space.keys(keys)
        n = len(names)
        if n == 0:
            return []
        if self._client is None:
            return [INVALID_PARAMS] * n

        def run(index):
            karr = _table(names, index)
            results = array.array("i", bytes(4 * len(index)))
            rc = self._code(_native.exist_batch, len(index), karr, _addr(results))
            if rc < 0:
                return [rc] * len(index)
            return _int_list(results)
        return _partial(n, pre, run)

    def batch_prefix_match(self, keys, ranks=1):
        """kvpool's extension (Mooncake has none): how many leading blocks of keys are
        stored, keys being block-major with ranks keys a block (keys[b * ranks + r]), a block
        counting only if all its keys exist. One call to the node instead of batch_is_exist
        and counting; the counted blocks' keys are leased until the engine loads them.
        Returns the count, or a negative status."""
        ranks = int(ranks)
        if ranks < 1 or len(keys) % ranks:
            return INVALID_PARAMS
        names, pre = self._space.keys(keys)
        if pre is not None:
            #  A key with no name in the store ends the prefix at its block.
            bad = next(i for i, status in enumerate(pre) if status is not None)
            names = names[:bad - bad % ranks]
        if not len(names):
            return 0
        karr = _table(names, range(len(names)))
        return self._code(_native.prefix_match, len(names) // ranks, ranks, karr)

    def remove(self, key, force=False):
        """Removes key. Returns 0, OBJECT_NOT_FOUND, or OBJECT_HAS_LEASE (force=True removes
        past leases)."""
        try:
            name = self._space.key(key)
        except Error as exc:
            return exc.status
        rc = self._code(_native.remove, name, bool(force))
        if rc == OK:
            self._disown([name])
        return rc

    def batch_remove(self, keys, force=False):
        """remove for each key: a status per key."""
        names, pre = self._space.keys(keys)
        return self._remove_names(names, pre, bool(force))

    def _remove_names(self, names, pre, force):
        n = len(names)
        if n == 0:
            return []
        if self._client is None:
            return [INVALID_PARAMS] * n

        def run(index):
            karr = _table(names, index)
            statuses = array.array("i", bytes(4 * len(index)))
            rc = self._code(_native.remove_batch, len(index), karr, force, _addr(statuses))
            if rc < 0:
                return [rc] * len(index)
            results = _int_list(statuses)
            if OK in statuses:
                sub = _subset(names, index)
                self._disown(sub if results.count(OK) == len(results) else
                             [name for name, r in zip(sub, results) if r == OK])
            return results
        return _partial(n, pre, run)

    def remove_by_regex(self, regex_pattern, force=False):
        """Removes this tenant's keys matching the pattern (PCRE2, unanchored search in the
        key as the caller named it). Returns how many, or a negative status (INVALID_PARAMS
        for a pattern that does not compile, or one of the constructs _scan refuses: the x
        option, comments, callouts, verbs, \\Q, '[' inside a class)."""
        pattern, why = self._space.regex(_encode(regex_pattern))
        if pattern is None:
            logger.debug("remove_by_regex(%r) refused: %s", regex_pattern, why)
            return INVALID_PARAMS
        return self._code(_native.remove_by_regex, pattern, bool(force))

    def remove_all(self, force=False):
        """Removes every object of this tenant. Returns how many, or a negative status."""
        return self._code(_native.remove_by_regex, self._space.all_pattern(), bool(force))

    # ---- replica descriptors, get sessions, replica clear ------------------------------
    def _placements(self, names, pin):
        """Per name (status, size, [(segment_id, offset), ...]) from a replica list (pin: the
        bytes stay in place until released), or an int status for the whole request
        (PERMISSION_DENIED for a client on another machine)."""
        if not _native.has("get_replica_list"):
            return int(Status.UNKNOWN_OPERATION)
        n = len(names)
        karr = (c_char_p * n)(*names)
        table = (_native.Placement * n)()
        rc = self._code(_native.get_replica_list, n, karr, bool(pin), ctypes.addressof(table))
        if rc < 0:
            return rc
        return [(p.status, p.size, [(r.segment_id, r.offset)
                                    for r in p.replicas[:p.replica_count]]) for p in table]

    def _segment_names(self):
        """{segment id: the name a descriptor shows}."""
        try:
            segments = self._client.segments()
        except (Error, AttributeError):
            return {}
        own = self._segment.name if self._segment is not None else None
        return {s.id: (self._hostname if s.name == own else s.name) for s in segments}

    def get_replica_desc(self, key):
        """The ReplicaDescriptors of key's replicas ([] on a miss or error)."""
        return self.batch_get_replica_desc([key]).get(_as_str(key), [])

    def batch_get_replica_desc(self, keys):
        """{key: [ReplicaDescriptor, ...]} for the keys that exist (a missing key is left
        out, as in Mooncake). The query is a read: it renews the objects' leases."""
        names, pre = self._space.keys(keys)
        good = [i for i, name in enumerate(names) if name is not None]
        if self._client is None or not good:
            return {}
        sub = [names[i] for i in good]
        placements = self._placements(sub, False)
        out = {}
        if isinstance(placements, int):
            #  A client on another machine may not list replicas: sizes only.
            sizes = array.array("q", bytes(8 * len(sub)))
            karr = (c_char_p * len(sub))(*sub)
            if self._code(_native.get_size_batch, len(sub), karr, _addr(sizes)) < 0:
                return {}
            for i, size in zip(good, sizes):
                if size >= 0:
                    out[_as_str(keys[i])] = [ReplicaDescriptor(MemoryDescriptor(
                        Descriptor(size, 0, "")))]
            return out
        segment_names = self._segment_names()
        for i, (status, size, replicas) in zip(good, placements):
            if status != OK:
                continue
            out[_as_str(keys[i])] = [
                ReplicaDescriptor(MemoryDescriptor(Descriptor(
                    size, offset, segment_names.get(segment_id, str(segment_id)))))
                for segment_id, offset in replicas]
        return out

    # ---- get sessions ------------------------------------------------------------------
    #   A session keeps an object readable from its start to its end: with a pin of this
    #   process where the store is on the node's machine (res.sessions counts them; the bytes
    #   stay until RELEASE, close() or the process's death), else with the read's lease alone
    #   (res.leased: the object stays at least get_lease_ttl_ms() after the start or the last
    #   refresh). SGLang's direct linker starts, refreshes, prefetches and ends them.
    def batch_get_session_start(self, keys):
        """Starts a get session on keys: per key 0 (the object stays readable, in place, until
        batch_get_session_end or close(); a session already open is renewed) or a negative
        status (OBJECT_NOT_FOUND). The node keeps a session's bytes with a pin of this
        process (same machine) or, for a client on another machine, with a read's lease."""
        return self._session_start(keys)[0]

    def batch_get_session_start_with_sources(self, keys):
        """(statuses, sources) as batch_get_session_start, with per key the tier the session
        reads from: "memory" (kvpool's only tier), "" where the session did not start."""
        return self._session_start(keys)

    def _session_start(self, keys):
        names, pre = self._space.keys(keys)
        n = len(names)
        if self._client is None:
            return [INVALID_PARAMS] * n, [""] * n
        res = self._res

        def run(index):
            sub = [names[i] for i in index]
            with res.lock:
                fresh = [name for name in sub if name not in res.sessions]
            placements = self._placements(fresh, True) if fresh else []
            if isinstance(placements, int):
                if placements != PERMISSION_DENIED:
                    return [placements] * len(sub)
                #  A client on another machine holds sessions by lease (exist is a read).
                statuses = self._exist_statuses(sub)
                with res.lock:
                    for name, status in zip(sub, statuses):
                        if status == OK:
                            res.leased[name] = None
                        else:
                            res.leased.pop(name, None)
                return statuses
            status_of = {}
            with res.lock:
                for name, (status, _, _) in zip(fresh, placements):
                    status_of[name] = status
                    if status == OK:
                        res.sessions[name] = res.sessions.get(name, 0) + 1
            renew = [name for name in sub if name not in status_of]
            if renew:
                status_of.update(zip(renew, self._renew(renew)))
            gone = [name for name in renew if status_of[name] == NOT_FOUND]
            if gone:
                self._session_end_names(gone)
            return [status_of[name] for name in sub]
        results = _partial(n, pre, run) if n else []
        return results, ["memory" if r == OK else "" for r in results]

    def batch_get_session_refresh(self, keys):
        """Renews the get sessions this store holds on keys (SGLang's direct linker refreshes
        a session before it reads through it again): one read of the keys, which starts
        their leases again from now. Per key 0 (the object is there), OBJECT_NOT_FOUND (it is
        gone: the session is ended), INVALID_PARAMS for a key this store has no session on (a
        refresh never starts one), or another negative status; INVALID_PARAMS per key before
        setup."""
        names, pre = self._space.keys(keys)
        n = len(names)
        if self._client is None:
            return [INVALID_PARAMS] * n
        res = self._res

        def run(index):
            sub = [names[i] for i in index]
            with res.lock:
                held = [name in res.sessions or name in res.leased for name in sub]
            live = [name for name, has in zip(sub, held) if has]
            status_of = dict(zip(live, self._renew(live))) if live else {}
            gone = [name for name in live if status_of[name] == NOT_FOUND]
            if gone:
                self._session_end_names(gone)
            return [status_of[name] if has else INVALID_PARAMS for name, has in zip(sub, held)]
        return _partial(n, pre, run) if n else []

    def batch_get_session_prefetch(self, keys):
        """Readies the sessions on keys for reading. A kvpool session's bytes are already
        where its reads find them (the node's memory, or its disk tier, which the node reads
        itself), so there is nothing to fetch ahead and the node is not asked: per key 0 for a
        key this store has a session on, INVALID_PARAMS for one without (or before setup).
        Mooncake's prefetch reads sessions of its DFS tier into a host arena; kvpool has no
        DFS tier (dfs_prefetch_arena_available() is False)."""
        names, pre = self._space.keys(keys)
        n = len(names)
        if self._client is None:
            return [INVALID_PARAMS] * n
        res = self._res

        def run(index):
            with res.lock:
                return [OK if names[i] in res.sessions or names[i] in res.leased
                        else INVALID_PARAMS for i in index]
        return _partial(n, pre, run) if n else []

    def dfs_prefetch_arena_available(self):
        """False: kvpool has no DFS tier, so no host arena to prefetch DFS sessions into (SGLang
        then leaves its waiting-queue DFS prefetch off and loads as usual)."""
        return False

    def dfs_prefetch_arena_status(self):
        """Why dfs_prefetch_arena_available() is False, for the engine's log."""
        return DFS_ARENA_STATUS

    def get_lease_ttl_ms(self):
        """The read lease, in ms, of the node this store talks to (kvpoold --lease-ttl, which
        `kvpool config set lease-ttl` changes live): a session's object stays at least this
        long after its start or its last refresh, whichever path holds it. The answer never
        overstates a lease already granted: a lower TTL is answered at once, a higher one only
        once every lease granted under the lower one has run out (the lower TTL's length after
        this store first saw the higher one). 0 before setup or when the node does not answer
        (SGLang's linker then refreshes every session before reading it)."""
        res = self._res
        if self._client is None or res is None:
            return 0
        try:
            ttl = int(self._client.stats()["lease_ttl_ms"])
        except (Error, KeyError):
            return 0
        if ttl <= 0:
            return 0
        now = time.monotonic()
        with res.lock:
            if res.ttl is None or ttl <= res.ttl[0]:
                res.ttl = (ttl, None, None)
            else:
                answer, higher, since = res.ttl
                if higher != ttl:
                    res.ttl = (answer, ttl, now)
                elif now - since >= answer / 1000.0:
                    res.ttl = (ttl, None, None)
            return res.ttl[0]

    def _exist_statuses(self, names):
        """EXIST of names, a read (it leases them): per name 0, OBJECT_NOT_FOUND or a status."""
        karr = (c_char_p * len(names))(*names)
        found = array.array("i", bytes(4 * len(names)))
        rc = self._code(_native.exist_batch, len(names), karr, _addr(found))
        if rc < 0:
            return [rc] * len(names)
        return [OK if r == 1 else (NOT_FOUND if r == 0 else r) for r in found]

    def _renew(self, names):
        """A read of names (an unpinned replica list, or EXIST from another machine) that
        starts their read leases again: per name 0, OBJECT_NOT_FOUND or another status."""
        placements = self._placements(names, False)
        if not isinstance(placements, int):
            return [status for status, _, _ in placements]
        if placements == PERMISSION_DENIED:
            return self._exist_statuses(names)
        return [placements] * len(names)

    def batch_get_session_end(self, keys):
        """Ends the get sessions of keys (keys without one are ignored). Returns 0, or
        INVALID_PARAMS before setup."""
        names, _ = self._space.keys(keys)
        if self._client is None:
            return INVALID_PARAMS
        self._session_end_names([name for name in names if name is not None])
        return OK

    def _session_end_names(self, names):
        res = self._res
        pinned = []
        with res.lock:
            for name in names:
                count = res.sessions.pop(name, 0)
                pinned.extend([name] * count)
                res.leased.pop(name, None)
        if pinned:
            _release(self._client, pinned)

    def batch_replica_clear(self, keys, segment_name=""):
        """Removes the keys this store put whose lease has ended, as Mooncake's
        BatchReplicaClear does (another store's keys, leased ones and missing ones are
        skipped). Returns the keys cleared.

        With segment_name (this store's get_hostname(), or a node segment name), only keys
        whose every replica is on that segment are cleared: kvpool removes whole objects, so a
        key that also has replicas elsewhere is left alone (Mooncake drops only the replicas
        on that segment). Finding where the replicas are is itself a read, so these keys are
        removed whatever their lease (bytes a reader is copying stay until it is done)."""
        names, _ = self._space.keys(keys)
        if not isinstance(segment_name, str):
            raise TypeError("segment_name must be a str")
        if self._client is None:
            return []
        with self._owned_lock:
            mine = [i for i, name in enumerate(names) if name is not None and name in self._owned]
        if not mine:
            return []
        if not segment_name:
            statuses = self._remove_names([names[i] for i in mine], None, False)
            return [_as_str(keys[i]) for i, s in zip(mine, statuses) if s == OK]
        target = None
        if segment_name in (self._hostname, self._local_hostname) and self._segment is not None:
            target = self._segment.id
        else:
            try:
                target = {s.name: s.id for s in self._client.segments()}.get(segment_name)
            except Error:
                target = None
        if target is None:
            return []
        placements = self._placements([names[i] for i in mine], False)
        if isinstance(placements, int):
            return []
        chosen = [i for i, (status, _, replicas) in zip(mine, placements)
                  if status == OK and replicas and all(s == target for s, _ in replicas)]
        if not chosen:
            return []
        statuses = self._remove_names([names[i] for i in chosen], None, True)
        return [_as_str(keys[i]) for i, s in zip(chosen, statuses) if s == OK]


# ---- batch helpers ---------------------------------------------------------------------------

def _partial(n, pre, run):
    """run(indices) on the keys whose pre entry is None (all of them when pre is None), the
    others answered by their pre status. run returns one result per index."""
    if pre is None:
        return run(range(n))
    out = list(pre)
    good = [i for i in range(n) if pre[i] is None]
    if good:
        for i, result in zip(good, run(good)):
            out[i] = result
    return out


def _shapes_agree(n, all_ptrs, all_sizes):
    """Whether there are n keys of addresses and of sizes, each key as many of one as of the
    other."""
    return (len(all_ptrs) == n and len(all_sizes) == n
            and all(map(operator.eq, map(len, all_ptrs), map(len, all_sizes))))


def _null_buffer(ptrs, sizes):
    """Whether a buffer of a key is at address 0 with bytes to move (ptrs is searched in C
    first: this runs once per key of a batch)."""
    return 0 in ptrs and any(p == 0 and s for p, s in zip(ptrs, sizes))


# ---- the client's HTTP endpoints ------------------------------------------------------------

class _HttpEndpoints:
    """setup(enable_client_http_server=True)'s endpoints, as Mooncake's client serves them:
    GET /health ({"status": ..., "code": health_check()}, 200 when healthy, else 503),
    /metrics (Prometheus text: the node's counters and this client's), /metrics/summary
    (plain text), /version."""

    def __init__(self, store, port):
        ref = weakref.ref(store)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):   # noqa: N802 (http.server's name)
                store = ref()
                path = self.path.split("?", 1)[0]
                if path == "/health":
                    code = store.health_check() if store is not None else HC_NOT_INITIALIZED
                    text = {HC_HEALTHY: "healthy", HC_NOT_INITIALIZED: "not_initialized",
                            HC_MASTER_UNREACHABLE: "master_unreachable"}.get(code, "unknown")
                    self._send(200 if code == HC_HEALTHY else 503, "application/json",
                               json.dumps({"status": text, "code": code}))
                elif path in ("/metrics", "/metrics/summary"):
                    metrics = _metrics(store)
                    if metrics is None:
                        self._send(503, "text/plain", "client not initialized")
                    elif path == "/metrics":
                        body = "".join("# TYPE %s gauge\n%s %s\n" % (name, name, value)
                                       for name, value in metrics)
                        self._send(200, "text/plain; version=0.0.4", body)
                    else:
                        self._send(200, "text/plain",
                                   "".join("%s: %s\n" % item for item in metrics))
                elif path == "/version":
                    from . import __version__
                    self._send(200, "application/json",
                               json.dumps({"version": __version__, "store": "kvpool"}))
                else:
                    self._send(404, "text/plain", "not found")

            def _send(self, status, content_type, body):
                data = body.encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                       name="kvpool-mooncake-http")
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _metrics(store):
    """[(name, value)]: the node's counters (kvpool_node_*) and this store's
    (kvpool_client_*), or None when the store is not set up or the node does not answer."""
    client = store._client if store is not None else None
    if client is None:
        return None
    try:
        stats = client.stats()
    except Error:
        return None
    out = [("kvpool_node_" + name, value) for name, value in stats.items()]
    out.append(("kvpool_client_prefetched_tokens_total", store._prefetched_tokens))
    out.append(("kvpool_client_get_sessions", len(store._res.sessions) if store._res else 0))
    return out


# ---- setup's arguments, MOONCAKE_CONFIG_PATH -----------------------------------------------

def _bind_setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
                protocol, rdma_devices, master_server_addr, engine=None,
                enable_ssd_offload=False, ssd_offload_path="", tenant_id=DEFAULT_TENANT,
                enable_client_http_server=False, client_http_port=DEFAULT_CLIENT_HTTP_PORT, *,
                curve_secret=None, curve_server=None):
    """setup()'s positional form, as the pybind11 binding declares it: the first seven
    arguments are required (TypeError without them), strings are strings."""
    for name, value in (("local_hostname", local_hostname), ("metadata_server", metadata_server),
                        ("protocol", protocol), ("rdma_devices", rdma_devices),
                        ("master_server_addr", master_server_addr),
                        ("ssd_offload_path", ssd_offload_path), ("tenant_id", tenant_id)):
        if not isinstance(value, (str, bytes)):
            raise TypeError("setup(): %s must be a str, not %s" % (name, type(value).__name__))
    if isinstance(tenant_id, bytes):
        tenant_id = tenant_id.decode("utf-8")
    return {"local_hostname": _as_str(local_hostname), "metadata_server": metadata_server,
            "global_segment_size": global_segment_size, "local_buffer_size": local_buffer_size,
            "protocol": protocol, "rdma_devices": rdma_devices,
            "master_server_addr": _as_str(master_server_addr), "engine": engine,
            "enable_ssd_offload": bool(enable_ssd_offload),
            "ssd_offload_path": _as_str(ssd_offload_path), "tenant_id": tenant_id,
            "enable_client_http_server": bool(enable_client_http_server),
            "client_http_port": operator.index(client_http_port),
            "curve_secret": curve_secret, "curve_server": curve_server}


_ALIASES = {"device_name": "rdma_devices", "master_server_address": "master_server_addr"}
_TRUE = ("true", "1", "yes", "on", "y")
_FALSE = ("false", "0", "no", "off", "n", "")


def _config_bool(value, default):
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return default       #  Mooncake logs a warning and keeps the default


def _params_from_dict(config):
    """setup() parameters from a config dict (values as strings or ints; setup's names or the
    JSON's). local_hostname and metadata_server are required, as in Mooncake."""
    params = {"global_segment_size": DEFAULT_SEGMENT_SIZE,
              "local_buffer_size": DEFAULT_LOCAL_BUFFER_SIZE, "protocol": "tcp",
              "rdma_devices": "", "master_server_addr": DEFAULT_MASTER,
              "tenant_id": DEFAULT_TENANT, "ssd_offload_path": "",
              "enable_ssd_offload": False, "enable_client_http_server": False,
              "client_http_port": DEFAULT_CLIENT_HTTP_PORT}
    for name, value in config.items():
        name = _ALIASES.get(str(name), str(name))
        if value is not None:
            params[name] = value
    for name in ("local_hostname", "metadata_server"):
        if not str(params.get(name) or ""):
            raise ValueError("%s is required" % name)
        params[name] = str(params[name])
    params["global_segment_size"] = parse_size(params["global_segment_size"])
    params["local_buffer_size"] = parse_size(params["local_buffer_size"])
    params["master_server_addr"] = str(params["master_server_addr"])
    params["tenant_id"] = str(params["tenant_id"]) or DEFAULT_TENANT
    params["ssd_offload_path"] = str(params["ssd_offload_path"])
    params["enable_ssd_offload"] = _config_bool(params["enable_ssd_offload"], False)
    params["enable_client_http_server"] = _config_bool(params["enable_client_http_server"],
                                                       False)
    params["client_http_port"] = int(str(params["client_http_port"]).strip())
    return params


@dataclasses.dataclass
class MooncakeStoreConfig:
    """The engine configuration Mooncake's own MooncakeConfig (mooncake/mooncake_config.py of
    its wheel) reads, with its defaults: the MOONCAKE_CONFIG_PATH JSON file, or, when that
    variable is not set, the MOONCAKE_* environment variables (ENVIRONMENT below).

        config = MooncakeStoreConfig.load_from_env()
        store = MooncakeDistributedStore()
        rc = store.setup(*config.setup_args(), **config.setup_kwargs())  # or config.setup(store)
    """
    local_hostname: str = "localhost"
    metadata_server: str = ""
    global_segment_size: int = CONFIG_GLOBAL_SEGMENT_SIZE
    local_buffer_size: int = CONFIG_LOCAL_BUFFER_SIZE
    protocol: str = "tcp"
    device_name: str = ""
    master_server_address: str = DEFAULT_MASTER
    tenant_id: str = DEFAULT_TENANT
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""

    #  field: (variable, default) - Mooncake's load_from_env without MOONCAKE_CONFIG_PATH;
    #  MOONCAKE_MASTER must be set, the rest fall back to these defaults.
    ENVIRONMENT = {
        "local_hostname": ("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
        "metadata_server": ("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
        "global_segment_size": ("MOONCAKE_GLOBAL_SEGMENT_SIZE", CONFIG_GLOBAL_SEGMENT_SIZE),
        "local_buffer_size": ("MOONCAKE_LOCAL_BUFFER_SIZE", CONFIG_LOCAL_BUFFER_SIZE),
        "protocol": ("MOONCAKE_PROTOCOL", "tcp"),
        "device_name": ("MOONCAKE_DEVICE", ""),
        "master_server_address": ("MOONCAKE_MASTER", None),
        "enable_ssd_offload": ("MOONCAKE_OFFLOAD_ENABLED", False),
        "ssd_offload_path": ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
        "tenant_id": ("MOONCAKE_TENANT_ID", DEFAULT_TENANT),
    }

    @staticmethod
    def from_dict(config):
        """From a dict of the JSON's fields; sizes may be ints or strings ("4GB")."""
        fields = {field.name: field for field in dataclasses.fields(MooncakeStoreConfig)}
        values = {}
        for name, value in config.items():
            if name in fields and value is not None:
                values[name] = value
        result = MooncakeStoreConfig(**values)
        result.global_segment_size = parse_size(result.global_segment_size)
        result.local_buffer_size = parse_size(result.local_buffer_size)
        result.enable_ssd_offload = _config_bool(result.enable_ssd_offload, False)
        result.ssd_offload_path = str(result.ssd_offload_path)
        result.tenant_id = str(result.tenant_id).strip() or DEFAULT_TENANT
        return result

    @staticmethod
    def from_file(path):
        with open(path) as file:
            return MooncakeStoreConfig.from_dict(json.load(file))

    @staticmethod
    def from_environment(environ=None):
        """From the MOONCAKE_* variables (ENVIRONMENT); ValueError without MOONCAKE_MASTER."""
        environ = os.environ if environ is None else environ
        if not environ.get("MOONCAKE_MASTER"):
            raise ValueError("Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor "
                             "'MOONCAKE_MASTER' is set.")
        values = {}
        for field, (variable, default) in MooncakeStoreConfig.ENVIRONMENT.items():
            value = environ.get(variable)
            values[field] = default if value is None else value
        return MooncakeStoreConfig.from_dict(values)

    @staticmethod
    def load_from_env():
        """From the file $MOONCAKE_CONFIG_PATH names or, when it is not set, from the
        MOONCAKE_* variables, as Mooncake reads them; ValueError when neither
        MOONCAKE_CONFIG_PATH nor MOONCAKE_MASTER is set."""
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path:
            return MooncakeStoreConfig.from_file(path)
        return MooncakeStoreConfig.from_environment()

    def setup_args(self):
        """The positional arguments of MooncakeDistributedStore.setup() for this config."""
        return (self.local_hostname, self.metadata_server, self.global_segment_size,
                self.local_buffer_size, self.protocol, self.device_name,
                self.master_server_address)

    def setup_kwargs(self):
        """The keyword arguments: tenant_id when not the default (as vLLM passes it), the SSD
        offload settings when set (setup() warns that the node's disk tier stands for them)."""
        kwargs = {} if self.tenant_id == DEFAULT_TENANT else {"tenant_id": self.tenant_id}
        if self.enable_ssd_offload:
            kwargs["enable_ssd_offload"] = True
        if self.ssd_offload_path:
            kwargs["ssd_offload_path"] = self.ssd_offload_path
        return kwargs

    def setup(self, store):
        """store.setup(*self.setup_args(), **self.setup_kwargs()); returns its status."""
        return store.setup(*self.setup_args(), **self.setup_kwargs())


def store_from_env():
    """A MooncakeDistributedStore set up from $MOONCAKE_CONFIG_PATH (or the MOONCAKE_*
    variables), as the connectors do. Raises ValueError without either, kvpool.Error when
    setup fails."""
    config = MooncakeStoreConfig.load_from_env()
    store = MooncakeDistributedStore()
    rc = config.setup(store)
    if rc != OK:
        raise error_for(rc, "setup from %s failed" % os.getenv("MOONCAKE_CONFIG_PATH"))
    return store


def install(force=False):
    """Makes `import mooncake.store` (and `from mooncake.store import
    MooncakeDistributedStore`) load this module, for code written against Mooncake. Does
    nothing if a real `mooncake` package is importable, unless force. Returns the module."""
    if not force:
        try:
            import importlib.util
            if importlib.util.find_spec("mooncake") is not None:
                return sys.modules.get("mooncake.store")
        except (ImportError, ValueError):
            pass
    package = types.ModuleType("mooncake")
    package.__path__ = []
    package.__doc__ = "kvpool's stand-in for Mooncake (kvpool.mooncake.install())."
    store = sys.modules[__name__]
    package.store = store
    sys.modules["mooncake"] = package
    sys.modules["mooncake.store"] = store
    return store
