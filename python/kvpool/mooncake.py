"""kvpool.mooncake - a drop-in for Mooncake Store's MooncakeDistributedStore, on kvpool.

    from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    store.setup("localhost", "unused", 512 << 20, 128 << 20, "tcp", "", "127.0.0.1:50051")
    store.put("key", b"value")

Code written for `mooncake.store` keeps working: the methods vLLM's, SGLang's and LMCache's
Mooncake connectors call have Mooncake's names, arguments and return conventions: integers
(0 ok, negative status codes with Mooncake's numbers), b"" from get on a miss, 1 / 0 /
negative from is_exist, bytes read or a negative code from the *_into calls, None from
get_buffer on a miss. Nothing raises for a store-level failure; wrong argument types raise
TypeError as a pybind11 binding would. install() makes `import mooncake.store` load this.

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
the segment when it sees the owning process is gone (libkvpool names the owner
"client-<pid>-<n>"), and the kernel frees the memory. With global_segment_size 0 the process
contributes nothing (vLLM's standalone-store mode).

register_buffer / unregister_buffer are bookkeeping only: kvpool copies from and into any
host memory without registration.

Threads: a store may be shared by threads (kvpool.Client keeps a connection per concurrent
caller); setup() and close() must not run concurrently with other calls.
"""

import array
import dataclasses
import enum
import itertools
import json
import os
import re
import sys
import types
import weakref

from ctypes import byref

from . import _native
from .client import (Client, PutOptions, _Pins, _key, _key_array, _u64, _addr, _encode,
                     _iov_table,
                     fetch, DEFAULT_TIMEOUT)
from .segment import SharedSegment
from .status import Status, Error

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "MooncakeStoreConfig",
           "parse_size", "install"]

OK = 0
INVALID_PARAMS = int(Status.INVALID_PARAMS)
INVALID_KEY = int(Status.INVALID_KEY)
NOT_FOUND = int(Status.OBJECT_NOT_FOUND)
RPC_FAIL = int(Status.RPC_FAIL)

#   Mooncake's setup() defaults (store_py.cpp) and its connectors' config defaults.
DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024
DEFAULT_LOCAL_BUFFER_SIZE = 16 * 1024 * 1024
DEFAULT_MASTER = "127.0.0.1:50051"
CONFIG_GLOBAL_SEGMENT_SIZE = 3355443200
CONFIG_LOCAL_BUFFER_SIZE = 1073741824


class SoftPinAction(enum.IntEnum):
    """What a put does to the object's soft pin (Mooncake's enum)."""
    PRESERVE = 0     #  leave as it is (a new object: not pinned)
    ENABLE = 1
    DISABLE = 2


class ReplicateConfig:
    """Placement and pinning of a put, with Mooncake's field names."""

    def __init__(self):
        self.replica_num = 1
        self.soft_pin_action = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms = 0          #  0: the node's default
        self.with_hard_pin = False
        self.preferred_segment = ""
        self.preferred_segments = []
        self.prefer_alloc_in_same_node = False

    @property
    def with_soft_pin(self):
        return self.soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, value):
        self.soft_pin_action = SoftPinAction.ENABLE if value else SoftPinAction.PRESERVE

    def __str__(self):
        return ("ReplicateConfig: { replica_num: %d, with_soft_pin: %s, soft_pin_ttl_ms: %d, "
                "with_hard_pin: %s, preferred_segment: %s, preferred_segments: [%s] }"
                % (self.replica_num, self.with_soft_pin, self.soft_pin_ttl_ms,
                   self.with_hard_pin, self.preferred_segment,
                   ", ".join(self.preferred_segments)))

    __repr__ = __str__

    def to_put_options(self, rename=None):
        """kvpool.PutOptions for this config; rename maps segment names (hostnames) to
        kvpool segment names."""
        names = list(self.preferred_segments or ())
        if not names and self.preferred_segment:
            names = [self.preferred_segment]
        if rename is not None:
            names = [rename(name) for name in names]
        return PutOptions(replica_num=self.replica_num, preferred_segments=names,
                          soft_pin=self.soft_pin_action == SoftPinAction.ENABLE,
                          soft_pin_ttl_ms=self.soft_pin_ttl_ms, hard_pin=self.with_hard_pin)


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


def _teardown(client, segment):
    """Unmounts and closes segment, closes client; run by close() or at interpreter exit,
    only in the process that made them (a forked child must not unmount its parent's)."""
    if segment is not None and segment.pid == os.getpid():
        if segment.id is not None and client is not None and not client.closed:
            try:
                client.unmount_segment(segment.id)
            except Error:
                pass
            segment.id = None
        segment.close()
    if client is not None:
        client.close()


class MooncakeDistributedStore:
    """Mooncake Store's Python class, served by kvpool. See the module docstring."""

    #  Seconds a request may wait for the node's reply (setup's first ping included).
    timeout = DEFAULT_TIMEOUT

    def __init__(self):
        self._client = None
        self._segment = None
        self._finalizer = None
        self._hostname = ""
        self._registered = {}

    # ---- setup -----------------------------------------------------------------------
    def setup(self, *args, **kwargs):
        """setup(local_hostname, metadata_server, global_segment_size=16 MiB,
                 local_buffer_size=16 MiB, protocol="tcp", rdma_devices="",
                 master_server_addr="127.0.0.1:50051", engine=None)
        or setup(config_dict) with those keys (or the MOONCAKE_CONFIG_PATH JSON names
        device_name, master_server_address) and string or int values.
        Returns 0, or a negative status (RPC_FAIL when the node does not answer)."""
        if len(args) == 1 and not kwargs and isinstance(args[0], dict):
            try:
                params = _params_from_dict(args[0])
            except (ValueError, TypeError):
                return INVALID_PARAMS
        else:
            params = _bind_setup(*args, **kwargs)
            try:
                params["global_segment_size"] = parse_size(params["global_segment_size"])
                params["local_buffer_size"] = parse_size(params["local_buffer_size"])
            except ValueError:
                return INVALID_PARAMS
        return self._setup(params)

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Mooncake's client-of-a-local-store mode: connects to server_address, contributes
        nothing (mem_pool_size is the real client's business)."""
        return self._setup({"local_hostname": "localhost", "global_segment_size": 0,
                            "local_buffer_size": local_buffer_size,
                            "master_server_addr": server_address})

    def _setup(self, params):
        if self._client is not None:
            self.close()
        try:
            endpoint = endpoint_of(params.get("master_server_addr", DEFAULT_MASTER))
        except ValueError:
            return INVALID_PARAMS
        try:
            client = Client(endpoint, timeout=self.timeout)
        except Error as exc:
            return exc.status
        segment = None
        size = params.get("global_segment_size", 0)
        if size > 0:
            try:
                segment = SharedSegment(size)
            except OSError:
                client.close()
                return int(Status.NO_AVAILABLE_HANDLE)
            try:
                segment.id = client.mount_segment(segment.name, size)
            except Error as exc:
                segment.close()
                client.close()
                return exc.status
        self._client = client
        self._segment = segment
        self._hostname = params.get("local_hostname") or "localhost"
        self._finalizer = weakref.finalize(self, _teardown, client, segment)
        return OK

    def close(self):
        """Unmounts and removes this process's segment (if any) and disconnects. Returns 0."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._client = None
        self._segment = None
        self._registered.clear()
        return OK

    def health_check(self):
        """0 if the node answers, 1 if setup() has not succeeded, or a negative status."""
        if self._client is None:
            return 1
        return self._code(_native.ping)

    def get_hostname(self):
        """The local_hostname given to setup(): the name of this process's segment for
        ReplicateConfig.preferred_segment."""
        return self._hostname

    def segment_name(self):
        """The kvpool name of this process's shared segment ("" without one)."""
        return self._segment.name if self._segment is not None else ""

    def register_buffer(self, buffer_ptr, size):
        """Returns 0: kvpool needs no registration. Kept for Mooncake's callers."""
        _check_ints(buffer_ptr, size)
        self._registered[buffer_ptr] = size
        return OK

    def unregister_buffer(self, buffer_ptr):
        """Returns 0 for a buffer registered before, INVALID_PARAMS otherwise."""
        return OK if self._registered.pop(buffer_ptr, None) is not None else INVALID_PARAMS

    # ---- internals -------------------------------------------------------------------
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
        if self._segment is not None and name in (self._hostname, self._segment.name):
            return self._segment.name
        return name

    def _opts(self, config):
        if config is None:
            return None
        if isinstance(config, ReplicateConfig):
            return byref(config.to_put_options(self._rename)._native())
        if isinstance(config, PutOptions):
            return byref(config._native())
        raise TypeError("config must be a ReplicateConfig")

    # ---- put -------------------------------------------------------------------------
    def put(self, key, value, config=None):
        """Stores value (bytes-like) under key. Returns 0 or a negative status
        (OBJECT_ALREADY_EXISTS if the key exists)."""
        pins = _Pins()
        try:
            address, size = pins.address(value)
            try:
                bkey = _key(key)
            except Error as exc:
                return exc.status
            return self._code(_native.put, bkey, address, size, self._opts(config))
        finally:
            pins.release()

    def put_parts(self, key, *parts, config=None):
        """Stores the concatenation of parts (bytes-likes) as one value. Returns 0 or < 0."""
        pins = _Pins()
        try:
            flat = []
            for part in parts:
                flat.extend(pins.address(part))
            iov = _u64(flat)
            try:
                bkey = _key(key)
            except Error as exc:
                return exc.status
            return self._code(_native.put_parts, bkey, _addr(iov), len(parts),
                              self._opts(config))
        finally:
            pins.release()

    def put_batch(self, keys, values, config=None):
        """Stores values[i] under keys[i]. Returns 0 if every put succeeded, else the first
        negative status."""
        if len(keys) != len(values):
            return INVALID_PARAMS
        if not keys:
            return OK
        pins = _Pins()
        try:
            addresses = []
            sizes = []
            for value in values:
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

    def put_from(self, key, buffer_ptr, size, config=None):
        """Stores size bytes at address buffer_ptr under key. Returns 0 or < 0."""
        _check_ints(buffer_ptr, size)
        try:
            bkey = _key(key)
        except Error as exc:
            return exc.status
        if size < 0 or (buffer_ptr == 0 and size > 0):
            return INVALID_PARAMS
        return self._code(_native.put, bkey, buffer_ptr, size, self._opts(config))

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """put_from for each key. Returns a status per key."""
        n = len(keys)
        if len(buffer_ptrs) != n or len(sizes) != n:
            return [INVALID_PARAMS] * n
        if n == 0:
            return []
        try:
            addresses, lengths = _u64(buffer_ptrs), _u64(sizes)
        except OverflowError:                     #  a negative pointer or size
            return [INVALID_PARAMS] * n
        return self._put_batch(keys, addresses, lengths, config)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Stores, for each key, the concatenation of the buffers all_buffer_ptrs[i] (sizes
        all_sizes[i]). Returns a status per key."""
        n = len(keys)
        flat, counts = _flatten_parts(n, all_buffer_ptrs, all_sizes)
        if flat is None:
            return [INVALID_PARAMS] * n
        if n == 0:
            return []
        return self._batch_parts(_native.put_batch_parts, keys, flat, counts, config)

    def _put_batch(self, keys, addresses, sizes, config):
        n = len(keys)
        try:
            karr = _key_array(keys)
        except Error:
            return self._subset(lambda k, a, s: self._put_batch(k, _u64(a), _u64(s), config),
                                INVALID_KEY, keys, addresses, sizes)
        statuses = array.array("i", bytes(4 * n))
        rc = self._code(_native.put_batch, n, karr, _addr(addresses), _addr(sizes),
                        self._opts(config), _addr(statuses))
        if rc < 0:
            return [rc] * n
        return statuses.tolist()

    def _batch_parts(self, fn, keys, flat, counts, config=None, is_get=False):
        n = len(keys)
        try:
            karr = _key_array(keys)
        except Error:
            starts = list(itertools.accumulate([0] + counts))
            per_key = [flat[2 * starts[i]:2 * starts[i + 1]] for i in range(n)]
            return self._subset(
                lambda k, f, c: self._batch_parts(fn, k, [x for part in f for x in part], c,
                                                  config, is_get),
                INVALID_KEY, keys, per_key, counts)
        iov, ptrs, nparts = _iov_table(flat, counts)
        if is_get:
            results = array.array("q", bytes(8 * n))
            rc = self._code(fn, n, karr, _addr(ptrs), _addr(nparts), _addr(results))
        else:
            results = array.array("i", bytes(4 * n))
            rc = self._code(fn, n, karr, _addr(ptrs), _addr(nparts), self._opts(config),
                            _addr(results))
        if rc < 0:
            return [rc] * n
        return results.tolist()

    @staticmethod
    def _subset(method, fill, keys, *lists):
        """Runs method on the keys that are valid (and the matching items of lists); the
        others get fill. For batches with a key no C string can hold (a NUL byte)."""
        good = [i for i, key in enumerate(keys) if not _bad_key(key)]
        out = [fill] * len(keys)
        if good:
            sub = method([keys[i] for i in good], *[[items[i] for i in good] for items in lists])
            for j, i in enumerate(good):
                out[i] = sub[j]
        return out

    # ---- get -------------------------------------------------------------------------
    def get(self, key):
        """The value of key as bytes; b"" on a miss or any error."""
        return self.get_batch([key])[0]

    def get_batch(self, keys):
        """The values of keys as bytes, b"" for each miss or error. Each value is copied once
        (see kvpool.client.fetch)."""
        n = len(keys)
        if n == 0:
            return []
        try:
            karr = _key_array(keys)
        except Error:
            return self._subset(self.get_batch, b"", keys)
        rc, values = self._fetch(n, karr, False)
        if rc < 0:
            return [b""] * n
        return [b"" if isinstance(value, int) else value for value in values]

    def get_buffer(self, key):
        """The value of key as a BufferHandle (buffer protocol, ptr(), size()), or None on a
        miss or error."""
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys):
        """A BufferHandle per key, None for each miss or error."""
        n = len(keys)
        if n == 0:
            return []
        try:
            karr = _key_array(keys)
        except Error:
            return self._subset(self.batch_get_buffer, None, keys)
        rc, values = self._fetch(n, karr, True)
        if rc < 0:
            return [None] * n
        return [None if isinstance(value, int) else value for value in values]

    def _fetch(self, n, karr, handles):
        result = self._code(fetch, n, karr, handles)
        return (result, None) if isinstance(result, int) else result

    def get_size(self, key):
        """The size of key's value, or a negative status (OBJECT_NOT_FOUND)."""
        try:
            bkey = _key(key)
        except Error as exc:
            return exc.status
        return self._code(_native.get_size, bkey)

    def get_into(self, key, buffer_ptr, size):
        """Copies key's value into size bytes at buffer_ptr. Returns the bytes read or a
        negative status (OBJECT_NOT_FOUND, BUFFER_OVERFLOW when the value is larger)."""
        _check_ints(buffer_ptr, size)
        try:
            bkey = _key(key)
        except Error as exc:
            return exc.status
        if size < 0 or (buffer_ptr == 0 and size > 0):
            return INVALID_PARAMS
        return self._code(_native.get_into, bkey, buffer_ptr, size)

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        """get_into for each key. Returns per key the bytes read or a negative status."""
        n = len(keys)
        if len(buffer_ptrs) != n or len(sizes) != n:
            return [INVALID_PARAMS] * n
        if n == 0:
            return []
        try:
            karr = _key_array(keys)
        except Error:
            return self._subset(self.batch_get_into, INVALID_KEY, keys, buffer_ptrs, sizes)
        try:
            addresses, capacities = _u64(buffer_ptrs), _u64(sizes)
        except OverflowError:                     #  a negative pointer or size
            return [INVALID_PARAMS] * n
        results = array.array("q", bytes(8 * n))
        rc = self._code(_native.get_batch_into, n, karr, _addr(addresses), _addr(capacities),
                        _addr(results))
        if rc < 0:
            return [rc] * n
        return results.tolist()

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        """Scatters each key's value across its buffers all_buffer_ptrs[i] (sizes
        all_sizes[i]) in order. Returns per key the bytes read or a negative status.
        prefer_alloc_in_same_node is accepted and unused."""
        n = len(keys)
        flat, counts = _flatten_parts(n, all_buffer_ptrs, all_sizes)
        if flat is None:
            return [INVALID_PARAMS] * n
        if n == 0:
            return []
        return self._batch_parts(_native.get_batch_into_parts, keys, flat, counts, is_get=True)

    # ---- exist and remove ------------------------------------------------------------
    def is_exist(self, key):
        """1 if key exists, 0 if not, or a negative status."""
        try:
            bkey = _key(key)
        except Error as exc:
            return exc.status
        return self._code(_native.exist, bkey)

    def batch_is_exist(self, keys):
        """is_exist for each key: a list of 1, 0 or negative statuses."""
        n = len(keys)
        if n == 0:
            return []
        try:
            karr = _key_array(keys)
        except Error:
            return self._subset(self.batch_is_exist, INVALID_KEY, keys)
        results = array.array("i", bytes(4 * n))
        rc = self._code(_native.exist_batch, n, karr, _addr(results))
        if rc < 0:
            return [rc] * n
        return results.tolist()

    def remove(self, key, force=False):
        """Removes key. Returns 0, OBJECT_NOT_FOUND, or OBJECT_HAS_LEASE (force=True removes
        past leases)."""
        try:
            bkey = _key(key)
        except Error as exc:
            return exc.status
        return self._code(_native.remove, bkey, bool(force))

    def batch_remove(self, keys, force=False):
        """remove for each key: a status per key."""
        n = len(keys)
        if n == 0:
            return []
        try:
            karr = _key_array(keys)
        except Error:
            return self._subset(lambda k: self.batch_remove(k, force), INVALID_KEY, keys)
        statuses = array.array("i", bytes(4 * n))
        rc = self._code(_native.remove_batch, n, karr, bool(force), _addr(statuses))
        if rc < 0:
            return [rc] * n
        return statuses.tolist()

    def remove_by_regex(self, regex_pattern, force=False):
        """Removes the keys matching the pattern (PCRE2 regex, unanchored search). Returns how
        many, or a negative status."""
        return self._code(_native.remove_by_regex, _encode(regex_pattern), bool(force))

    def remove_all(self, force=False):
        """Removes every object. Returns how many, or a negative status."""
        return self._code(_native.remove_all, bool(force))


def _check_ints(buffer_ptr, size):
    """Addresses and sizes are ints, as in the pybind11 binding (which raises TypeError)."""
    if not isinstance(buffer_ptr, int) or not isinstance(size, int):
        raise TypeError("buffer_ptr and size must be ints, not %s and %s"
                        % (type(buffer_ptr).__name__, type(size).__name__))


def _bad_key(key):
    try:
        _key(key)
        return False
    except (Error, TypeError):
        return True


def _flatten_parts(n, all_ptrs, all_sizes):
    """([ptr, size, ptr, size...], [parts per key]) or (None, None) when shapes disagree."""
    if len(all_ptrs) != n or len(all_sizes) != n:
        return None, None
    flat = []
    counts = []
    for ptrs, sizes in zip(all_ptrs, all_sizes):
        if len(ptrs) != len(sizes):
            return None, None
        for ptr, size in zip(ptrs, sizes):
            if ptr < 0 or size < 0 or (ptr == 0 and size > 0):
                return None, None
            flat.append(ptr)
            flat.append(size)
        counts.append(len(ptrs))
    return flat, counts


# ---- MOONCAKE_CONFIG_PATH ------------------------------------------------------------


def _bind_setup(local_hostname, metadata_server, global_segment_size=DEFAULT_SEGMENT_SIZE,
                local_buffer_size=DEFAULT_LOCAL_BUFFER_SIZE, protocol="tcp", rdma_devices="",
                master_server_addr=DEFAULT_MASTER, engine=None):
    return {"local_hostname": local_hostname, "metadata_server": metadata_server,
            "global_segment_size": global_segment_size, "local_buffer_size": local_buffer_size,
            "protocol": protocol, "rdma_devices": rdma_devices,
            "master_server_addr": master_server_addr}


_ALIASES = {"device_name": "rdma_devices", "master_server_address": "master_server_addr"}


def _params_from_dict(config):
    """setup() parameters from a config dict (string or int values; JSON or setup names)."""
    params = {"local_hostname": "localhost", "metadata_server": "",
              "global_segment_size": DEFAULT_SEGMENT_SIZE,
              "local_buffer_size": DEFAULT_LOCAL_BUFFER_SIZE, "protocol": "tcp",
              "rdma_devices": "", "master_server_addr": DEFAULT_MASTER}
    for name, value in config.items():
        name = _ALIASES.get(name, name)
        if name in params and value is not None:
            params[name] = value
    params["global_segment_size"] = parse_size(params["global_segment_size"])
    params["local_buffer_size"] = parse_size(params["local_buffer_size"])
    for name in ("local_hostname", "master_server_addr"):
        if not isinstance(params[name], str):
            raise TypeError("%s must be a string" % name)
    return params


@dataclasses.dataclass
class MooncakeStoreConfig:
    """The MOONCAKE_CONFIG_PATH JSON file the Mooncake connectors read, with their defaults.

        config = MooncakeStoreConfig.load_from_env()
        store = MooncakeDistributedStore()
        rc = store.setup(*config.setup_args())      # or config.setup(store)
    """
    local_hostname: str = "localhost"
    metadata_server: str = ""
    global_segment_size: int = CONFIG_GLOBAL_SEGMENT_SIZE
    local_buffer_size: int = CONFIG_LOCAL_BUFFER_SIZE
    protocol: str = "tcp"
    device_name: str = ""
    master_server_address: str = DEFAULT_MASTER

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
        return result

    @staticmethod
    def from_file(path):
        with open(path) as file:
            return MooncakeStoreConfig.from_dict(json.load(file))

    @staticmethod
    def load_from_env():
        """From the file $MOONCAKE_CONFIG_PATH names; ValueError if it is not set."""
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if not path:
            raise ValueError("The environment variable 'MOONCAKE_CONFIG_PATH' is not set.")
        return MooncakeStoreConfig.from_file(path)

    def setup_args(self):
        """The positional arguments of MooncakeDistributedStore.setup() for this config."""
        return (self.local_hostname, self.metadata_server, self.global_segment_size,
                self.local_buffer_size, self.protocol, self.device_name,
                self.master_server_address)

    def setup(self, store):
        """store.setup(*self.setup_args()); returns its status."""
        return store.setup(*self.setup_args())


def store_from_env():
    """A MooncakeDistributedStore set up from $MOONCAKE_CONFIG_PATH, as the connectors do.
    Raises ValueError without the variable, kvpool.Error when setup fails."""
    config = MooncakeStoreConfig.load_from_env()
    store = MooncakeDistributedStore()
    rc = config.setup(store)
    if rc != OK:
        from .status import error_for
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
