"""Tests of the methods and options of kvpool.mooncake that vLLM's, SGLang's and LMCache's
Mooncake connectors call beyond the basic data path, each with Mooncake's signature and
return convention (mooncake-integration/store/store_py.cpp, mooncake-store/src/real_client.cpp
and master_service.cpp in Mooncake's source): a put of a key that exists is success in every
put form, ReplicateConfig's typed fields (soft_pin_ttl_ms optional, group_ids), get_hostname()
as host:port unique per store, tenants, setup()'s keyword arguments and its client HTTP
endpoints, batch_get_replica_desc, get sessions, batch_replica_clear,
record_prefetched_tokens, MooncakeHostMemAllocator and put_from_with_metadata. Against a real
kvpoold (conftest.py); the lease tests start one with a short --lease-ttl."""

import ctypes
import glob
import json
import os
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import kvpool
from kvpool import _native, mooncake
from kvpool import client as client_module
from kvpool.mooncake import (MooncakeDistributedStore, ReplicateConfig, SoftPinAction,
                             ObjectDataType, ReplicaStatus, MooncakeHostMemAllocator,
                             KvpoolDropInWarning)
from kvpool_daemon import Kvpoold
from conftest import host_port

NOT_FOUND = -704
HAS_LEASE = -706
INVALID_PARAMS = -600
INVALID_KEY = -400
LEASE_MS = 300


def make_store(endpoint, hostname="localhost", segment=0, **kwargs):
    store = MooncakeDistributedStore()
    rc = store.setup(hostname, "P2PHANDSHAKE", segment, 16 << 20, "tcp", "",
                     endpoint if endpoint.startswith("ipc") else host_port(endpoint), **kwargs)
    assert rc == 0, rc
    return store


@pytest.fixture
def store(daemon):
    s = make_store(daemon.endpoint)
    yield s
    s.close()


@pytest.fixture(scope="module")
def lease_daemon():
    """A kvpoold whose read leases last LEASE_MS."""
    server = Kvpoold("--segment-size", "64MiB", "--lease-ttl", str(LEASE_MS),
                     prefix="kvpool-pytest-lease-")
    yield server
    assert server.stop() == 0, server.log_text(4000)
    server.remove()


def eventually(check, timeout=5.0):
    """Polls check() until it is true (leases end a little after their TTL today)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- a put of a key that exists: success, in every put form ----------------------------

def test_existing_key_is_success_in_every_put_form(store, client, prefix):
    src = np.frombuffer(b"first-value!", dtype=np.uint8).copy()
    other = np.frombuffer(b"second-value", dtype=np.uint8).copy()
    k = [prefix + "e%d" % i for i in range(8)]
    assert store.put(k[0], src) == 0 and store.put(k[0], other) == 0
    assert store.put_from(k[1], src.ctypes.data, src.nbytes) == 0
    assert store.put_from(k[1], other.ctypes.data, other.nbytes) == 0
    assert store.put_parts(k[2], b"first-", b"value!") == 0
    assert store.put_parts(k[2], b"second", b"-value") == 0
    assert store.put_batch([k[3]], [src]) == 0 and store.put_batch([k[3]], [other]) == 0
    assert store.batch_put_from([k[4]], [src.ctypes.data], [12]) == [0]
    assert store.batch_put_from([k[4], k[5]], [other.ctypes.data] * 2, [12, 12]) == [0, 0]
    assert store.batch_put_from_multi_buffers([k[6]], [[src.ctypes.data]], [[12]]) == [0]
    assert store.batch_put_from_multi_buffers([k[6]], [[other.ctypes.data]], [[12]]) == [0]
    # The first value stays (Mooncake's values are content-addressed: put never replaces).
    assert store.get_batch(k[:5] + [k[6]]) == [b"first-value!"] * 6
    assert store.get(k[5]) == b"second-value"
    # The native API keeps saying so.
    with pytest.raises(kvpool.ObjectAlreadyExistsError):
        client.put(k[0], b"x")
    assert client.put_batch([k[0]], [b"x"]) == [int(kvpool.Status.OBJECT_ALREADY_EXISTS)]


def test_put_argument_checks(store, prefix):
    buf = np.arange(64, dtype=np.uint8)
    ptr = buf.ctypes.data
    same_node = ReplicateConfig()
    same_node.prefer_alloc_in_same_node = True
    # Mooncake's put, put_parts, put_batch, put_from and batch_put_from refuse it...
    assert store.put(prefix + "p", b"v", same_node) == INVALID_PARAMS
    assert store.put_parts(prefix + "p", b"v", config=same_node) == INVALID_PARAMS
    assert store.put_batch([prefix + "p"], [b"v"], same_node) == INVALID_PARAMS
    assert store.put_from(prefix + "p", ptr, 8, same_node) == INVALID_PARAMS
    assert store.batch_put_from([prefix + "p"], [ptr], [8], same_node) == [INVALID_PARAMS]
    # ... the multi-buffer put takes it with one replica.
    assert store.batch_put_from_multi_buffers([prefix + "p"], [[ptr]], [[8]], same_node) == [0]
    same_node.replica_num = 2
    assert store.batch_put_from_multi_buffers(
        [prefix + "p2"], [[ptr]], [[8]], same_node) == [INVALID_PARAMS]
    zero = ReplicateConfig()
    zero.replica_num = 0
    assert store.put(prefix + "z", b"v", zero) == INVALID_PARAMS
    nof = ReplicateConfig()
    nof.nof_replica_num = 1
    assert store.put(prefix + "n", b"v", nof) == INVALID_PARAMS
    dfs = ReplicateConfig()
    dfs.dfs_replica_num = 1
    assert store.put(prefix + "d", b"v", dfs) == mooncake.DFS_SERVICE_UNAVAILABLE
    dfs.dfs_replica_num = 2
    assert store.put(prefix + "d", b"v", dfs) == INVALID_PARAMS
    assert store.batch_put_from([prefix + "x"], [ptr, ptr], [8, 8]) == [INVALID_PARAMS]
    assert store.batch_put_from([], [], []) == []
    with pytest.raises(TypeError):
        store.batch_put_from([prefix + "x"], ["0x10"], [8])
    with pytest.raises(TypeError):
        store.put_from(prefix + "x", 1.5, 8)
    with pytest.raises(TypeError):
        store.put(prefix + "x", b"v", "config")
    assert store.is_exist(prefix + "z") == 0 and store.is_exist(prefix + "n") == 0


def test_calls_before_setup():
    s = MooncakeDistributedStore()
    assert s.health_check() == 1
    assert s.get_hostname() == ""
    assert s.register_buffer(4096, 10) == INVALID_PARAMS
    assert s.batch_is_exist(["a", "b"]) == [INVALID_PARAMS] * 2
    assert s.batch_put_from(["a"], [4096], [1]) == [INVALID_PARAMS]
    assert s.batch_get_into_multi_buffers(["a"], [[4096]], [[1]]) == [INVALID_PARAMS]
    assert s.batch_get_replica_desc(["a"]) == {}
    assert s.batch_get_session_start(["a"]) == [INVALID_PARAMS]
    assert s.batch_get_session_end(["a"]) == INVALID_PARAMS
    assert s.batch_replica_clear(["a"]) == []
    assert s.remove_all() == INVALID_PARAMS
    assert s.get_offload_rpc_read_count() == 0
    assert s.close() == 0


# ---- ReplicateConfig -------------------------------------------------------------------------

def test_replicate_config_types():
    config = ReplicateConfig()
    assert config.soft_pin_ttl_ms is None                  # the node's default
    config.soft_pin_ttl_ms = 1000
    assert config.soft_pin_ttl_ms == 1000
    config.soft_pin_ttl_ms = None
    assert config.soft_pin_ttl_ms is None
    for bad in (-1, 1 << 64, 1.5, "10"):
        with pytest.raises(TypeError):
            config.soft_pin_ttl_ms = bad
    config.soft_pin_ttl_ms = (1 << 64) - 1
    assert config.group_ids is None
    config.group_ids = ["g1", "", "g2"]
    assert config.group_ids == ["g1", "", "g2"]
    config.group_ids = None
    for bad in ("g1", [1, 2], 5):
        with pytest.raises(TypeError):
            config.group_ids = bad
    for name in ("replica_num", "nof_replica_num", "dfs_replica_num"):
        with pytest.raises(TypeError):
            setattr(config, name, -1)
    assert config.data_type == ObjectDataType.UNKNOWN
    config.data_type = ObjectDataType.KVCACHE
    with pytest.raises(TypeError):
        config.data_type = 99
    with pytest.raises(TypeError):
        config.preferred_segments = "node-a"
    config.preferred_nof_segments = ["nof-a"]
    assert "group_ids" not in str(config) and "soft_pin_ttl_ms: " in str(config)


def test_soft_pin_and_group_ids_on_puts(store, prefix):
    enable = ReplicateConfig()
    enable.soft_pin_action = SoftPinAction.ENABLE
    assert store.put(prefix + "s0", b"v", enable) == 0          # TTL None: the default
    enable.soft_pin_ttl_ms = 5000
    assert store.put(prefix + "s1", b"v", enable) == 0
    enable.soft_pin_ttl_ms = 0                                  # zero: no pin, accepted
    assert store.put(prefix + "s2", b"v", enable) == 0
    grouped = ReplicateConfig()
    keys = [prefix + "g%d" % i for i in range(3)]
    grouped.group_ids = ["group-a", "group-a", ""]
    assert store.batch_put_from_multi_buffers(
        keys, [[np.zeros(8, np.uint8).ctypes.data]] * 3, [[8]] * 3, grouped) == [0, 0, 0]
    grouped.group_ids = ["group-a"]                             # not one per key
    assert store.batch_put_from([prefix + "g3", prefix + "g4"],
                                [4096, 4096], [8, 8], grouped) == [INVALID_PARAMS] * 2
    assert store.put(prefix + "g5", b"v", grouped) == 0         # one key, one group id
    assert store.batch_is_exist(keys + [prefix + "g3", prefix + "g5"]) == [1, 1, 1, 0, 1]


# ---- get_hostname ----------------------------------------------------------------------------

def test_hostname_is_host_port_unique_per_store(daemon, monkeypatch):
    stores = [make_store(daemon.endpoint, "localhost") for _ in range(3)]
    try:
        names = [s.get_hostname() for s in stores]
        assert len(set(names)) == 3
        for name in names:
            host, port = name.rsplit(":", 1)
            assert host == "localhost" and 12300 <= int(port) <= 14300
        # The port is held: nobody else on the machine binds it while the store lives.
        port = int(names[0].rsplit(":", 1)[1])
        with socket.socket() as sock:
            with pytest.raises(OSError):
                sock.bind(("0.0.0.0", port))
        stores[0].close()
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", port))
        explicit = make_store(daemon.endpoint, "node-7:4321")
        assert explicit.get_hostname() == "node-7:4321"
        explicit.close()
        v6 = make_store(daemon.endpoint, "::1")
        assert v6.get_hostname().startswith("[::1]:")
        v6.close()
        monkeypatch.setenv("MC_STORE_CLIENT_MIN_PORT", "20000")
        monkeypatch.setenv("MC_STORE_CLIENT_MAX_PORT", "20100")
        ranged = make_store(daemon.endpoint, "h")
        assert 20000 <= int(ranged.get_hostname().rsplit(":", 1)[1]) <= 20100
        ranged.close()
    finally:
        for s in stores:
            s.close()


def test_hostname_names_own_segment(daemon, prefix):
    s = make_store(daemon.endpoint, "seg-host", segment=16 << 20)
    try:
        config = ReplicateConfig()
        config.preferred_segment = s.get_hostname()
        assert s.put(prefix + "own", b"x" * 4096, config) == 0
        desc = s.batch_get_replica_desc([prefix + "own"])[prefix + "own"]
        assert desc[0].get_memory_descriptor().buffer_descriptor.transport_endpoint == \
            s.get_hostname()
    finally:
        s.close()


# ---- tenants ---------------------------------------------------------------------------------

def test_tenants_never_see_each_others_keys(daemon, client, prefix):
    a = make_store(daemon.endpoint, tenant_id="tenant-a")
    b = make_store(daemon.endpoint, tenant_id="tenant-b")
    d = make_store(daemon.endpoint)                      # the default tenant
    try:
        key = prefix + "shared-name"
        assert a.put(key, b"from-a") == 0
        assert b.put(key, b"from-b") == 0
        assert d.put(key, b"from-default") == 0
        assert [s.get(key) for s in (a, b, d)] == [b"from-a", b"from-b", b"from-default"]
        assert a.put(prefix + "only-a", b"a") == 0
        assert b.is_exist(prefix + "only-a") == 0 and d.is_exist(prefix + "only-a") == 0
        assert b.batch_is_exist([prefix + "only-a", key]) == [0, 1]
        assert b.get_size(prefix + "only-a") == NOT_FOUND
        # The default tenant cannot name another tenant's key.
        assert d.put("\x1ftenant-a\n" + key, b"forged") == INVALID_KEY
        assert d.get("\x1ftenant-a\n" + key) == b""
        assert d.batch_is_exist(["\x1ftenant-b\n" + key, key]) == [INVALID_KEY, 1]
        # A tenant's key bytes stay inside its own prefix.
        assert a.put("\x1ftenant-b\n" + key, b"inside-a") == 0
        assert b.get(key) == b"from-b"
        # Regex removal and remove_all act on the tenant's keys only.
        # ^ anchors where a's key begins: not inside a's own "\x1ftenant-b\n..." key.
        assert a.remove_by_regex("^" + prefix + "shared", force=True) == 1
        assert a.remove_by_regex("\\A\x1ftenant-b", force=True) == 1
        assert b.get(key) == b"from-b" and d.get(key) == b"from-default"
        assert a.remove_by_regex(".", force=True) == 1          # only-a
        assert b.get(key) == b"from-b"
        # A pattern that would close the group around it and add an alternative is refused.
        assert b.remove_by_regex("x))|((?:", force=True) == INVALID_PARAMS
        assert b.remove_by_regex("x)|(?:", force=True) == INVALID_PARAMS
        assert b.remove_by_regex("(?x)#[\n))|((?:]", force=True) == INVALID_PARAMS
        assert b.remove_by_regex("[)]|(", force=True) == INVALID_PARAMS
        assert d.remove_by_regex("x))|((?:", force=True) == INVALID_PARAMS
        assert d.get(key) == b"from-default"
        assert b.put(prefix + "b2", b"b2") == 0
        assert b.remove_all(force=True) == 2
        assert d.get(key) == b"from-default" and client.get(key) == b"from-default"
        assert a.put(key, b"again-a") == 0
        removed = d.remove_all(force=True)                      # the default tenant's all
        assert removed >= 1
        assert a.get(key) == b"again-a"
        assert d.is_exist(key) == 0
    finally:
        for s in (a, b, d):
            s.close()


KEY_TABLES = [pytest.param(client_module.KeyTable, id="KeyTable")]
if client_module.KeyTable is not client_module._PackedKeys:
    KEY_TABLES.append(pytest.param(client_module._PackedKeys, id="_PackedKeys"))


def test_the_key_table_module_is_built_and_loaded():
    """make builds kvpool._batch beside libkvpool; the binding must find it there (without it
    every batch method still works, slower: the tests below run both)."""
    built = glob.glob(os.path.join(os.path.dirname(_native.path), "kvpool_batch*.so"))
    assert built, "make did not build kvpool._batch beside %s" % _native.path
    assert _native.batch_module is not None
    assert client_module.KeyTable is _native.batch_module.KeyTable


@pytest.mark.parametrize("key_table", KEY_TABLES)
def test_key_tables_take_and_refuse_the_same_batches(key_table):
    for keys in (["k-%d-\u00e9" % i for i in range(100)] + [""],
                 [b"k-%d" % i for i in range(100)] + [bytearray(b"ba")]):
        for prefix in (b"", b"\x1ften\n"):
            table = key_table(keys, prefix)
            assert len(table) == len(keys)
            want = [prefix + (k.encode() if isinstance(k, str) else bytes(k)) for k in keys]
            assert table.names() == want and table[0] == want[0] and table[100] == want[100]
            # The array the library reads holds the same names.
            array = ctypes.cast(table.address, ctypes.POINTER(ctypes.c_char_p))
            assert [array[i] for i in range(len(keys))] == want
    assert key_table([], b"").names() == []
    assert key_table(["\x1fx"], b"p").names() == [b"p\x1fx"]
    for bad in (["ok", "a\0b"], [b"a\0"], ["\x1fx"], ["ok", 5], ["\ud800"], [None]):
        with pytest.raises(ValueError):
            key_table(bad, b"")


def test_result_lists_are_the_arrays_as_lists():
    """The statuses and sizes a batch call fills become the list the method returns."""
    import array
    for code, values in (("i", [0, 1, -1, -704, 63, 64, -64, -65, 2 ** 31 - 1, -2 ** 31]),
                         ("q", [0, 2 ** 40, -2 ** 63, 2 ** 63 - 1, 5, -10]),
                         ("i", [])):
        got = client_module._int_list(array.array(code, values))
        assert got == values and type(got) is list
        assert all(type(v) is int for v in got)
    if _native.batch_module is not None:
        with pytest.raises(TypeError):
            client_module._int_list(array.array("d", [1.0]))


@pytest.mark.parametrize("key_table", KEY_TABLES)
def test_batches_pack_their_keys_and_answer_like_one_by_one(daemon, client, prefix, key_table,
                                                           monkeypatch):
    """A batch's keys go to the library as one C key array (a KeyTable, built without a
    Python operation per key); the answers are those of the per-key path, in every corner: a
    tenant's prefix, bytes keys, UTF-8, a NUL inside a key, the tenant mark. Both builders of
    the array: kvpool._batch, and the Python one used when that is not built."""
    monkeypatch.setattr(client_module, "KeyTable", key_table)
    monkeypatch.setattr(mooncake, "KeyTable", key_table)
    if key_table is client_module._PackedKeys:
        # Without kvpool._batch there is no one-call lookup either.
        monkeypatch.setattr(client_module, "_batch_lookup", None)
        monkeypatch.setattr(mooncake, "_batch_lookup", None)
    a = make_store(daemon.endpoint, tenant_id="tenant-p")
    d = make_store(daemon.endpoint)
    try:
        keys = [prefix + "packed-%04d-\u00e9" % i for i in range(1000)]
        values = [(b"%04d" % i) * 16 for i in range(1000)]
        buffers = [ctypes.create_string_buffer(v, len(v)) for v in values]
        ptrs = [ctypes.addressof(b) for b in buffers]
        sizes = [len(v) for v in values]
        for store in (a, d):
            names, pre = store._space.keys(keys)
            assert pre is None and isinstance(names, key_table)
            assert names[999] == store._space.key(keys[999])
            assert store.batch_put_from(keys, ptrs, sizes) == [0] * 1000
            assert store.batch_is_exist(keys) == [1] * 1000
            out = [ctypes.create_string_buffer(64) for _ in keys]
            got = store.batch_get_into(keys, [ctypes.addressof(b) for b in out], [64] * 1000)
            assert got == sizes and [b.raw for b in out] == values
        # The tenant's copies are its own: removing them leaves the default tenant's.
        assert a.batch_remove(keys, force=True) == [0] * 1000
        assert a.batch_is_exist(keys) == [0] * 1000 and d.batch_is_exist(keys) == [1] * 1000
        # bytes keys pack too, and name the same objects as their str form.
        assert d.batch_is_exist([k.encode() for k in keys[:3]]) == [1, 1, 1]
        # A NUL inside a key: that key alone is INVALID_KEY, as one by one.
        mixed = [keys[0], "bad\0key", keys[1], ""]
        assert d.batch_is_exist(mixed) == [1, INVALID_KEY, 1, d.is_exist("")]
        # The tenant mark: at a key's start it is refused in the default tenant, elsewhere
        # it is an ordinary byte.
        assert d.batch_is_exist([keys[2], "\x1fx\nk", "k\x1f" + prefix]) == [
            1, INVALID_KEY, 0]
        assert client.exist_batch(keys[:2]) == [True, True]
        with pytest.raises(kvpool.Error) as error:
            client.exist_batch([keys[0], "bad\0key"])
        assert error.value.status == INVALID_KEY
        assert d.batch_remove(keys, force=True) == [0] * 1000
    finally:
        a.close()
        d.close()


@pytest.mark.skipif(client_module._batch_lookup is None, reason="kvpool._batch not built")
def test_lookup_is_one_call_with_the_answers_of_the_library(daemon, client, prefix):
    """kvpool._batch.lookup: the key array with the keys' lengths, the library's call and the
    list of results in one call. Its answers are the library's; a key with a NUL goes with
    its length and the node refuses that key alone; a batch it does not take raises
    ValueError (the caller then names the keys one by one)."""
    keys = [prefix + "lookup-%03d-\u00e9" % i for i in range(300)]
    assert client.put_batch(keys[:200], [b"v" * (i + 1) for i in range(200)]) == [0] * 200
    lookup = client_module._batch_lookup
    exist, get_size = client_module.EXIST_FN, client_module.GET_SIZE_FN
    # The library built here has the forms answered on this machine alone.
    assert set(client_module.LOCAL_FNS) == {exist, get_size}
    handle = client._acquire()
    try:
        mixed = keys + ["with\0nul", b"" + keys[0].encode(), ""]
        # The same answers with the local form first (the bindings' way) and without; then
        # without the empty key, which makes the local form leave every valid key.
        for batch in (mixed, mixed[:-1]):
            for local in (None, client_module.LOCAL_FNS[exist]):
                rc, got = lookup(exist, handle, batch, b"", False, local)
                assert rc == 0
                assert got == ([1] * 200 + [0] * 100 + [INVALID_KEY, 1, INVALID_KEY])[:len(batch)]
            for local in (None, client_module.LOCAL_FNS[get_size]):
                rc, got = lookup(get_size, handle, batch, b"", True, local)
                assert rc == 0
                assert got[:200] == list(range(1, 201)) and got[200:300] == [NOT_FOUND] * 100
                assert got[300:] == [INVALID_KEY, 1, INVALID_KEY][:len(batch) - 300]
        # On the node's machine the local form answers the stored keys from the read index,
        # and the others too: a node without a master vouches for absent keys.
        if client.fast_path:
            table = client_module.KeyTable(keys)
            lens = (ctypes.c_size_t * 300)(*[len(k.encode()) for k in keys])
            results = (ctypes.c_int * 300)()
            rest = (ctypes.c_size_t * 300)()
            nrest = ctypes.c_size_t(0)
            assert client_module._native.exist_batch_local(
                handle, 300, table, lens, results, rest, ctypes.byref(nrest)) == 0
            assert list(results) == [1] * 200 + [0] * 100 and nrest.value == 0
        assert lookup(client_module.EXIST_FN, handle, [], b"", False) == (0, [])
        # A prefix is put before every key (a tenant's): none of these names exist.
        assert lookup(client_module.EXIST_FN, handle, keys[:3], b"\x1fother\n", False) == (
            0, [0, 0, 0])
        for bad in ([keys[0], 5], ["\ud800"], ["\x1fmark"], [None]):
            with pytest.raises(ValueError):
                lookup(client_module.EXIST_FN, handle, bad, b"", False)
        with pytest.raises(TypeError):
            lookup(client_module.EXIST_FN, handle, 7, b"", False)
    finally:
        client._idle.append(handle)
    assert client.get_size_batch(keys[:2]) == [1, 2]
    assert client.exist_batch(keys[199:201]) == [True, False]
    assert client.remove_batch(keys[:200], force=True) == [0] * 200


@pytest.mark.skipif(client_module._batch_lookup is None, reason="kvpool._batch not built")
@pytest.mark.parametrize("wide", [False, True])
def test_lookup_asks_the_full_call_only_for_what_the_local_one_left(wide):
    """lookup with a local function: the local function sees the whole batch; the full one
    only the keys it left, in order; each answer lands at its key's place. A local function
    that fails leaves the whole batch to the full one."""
    result = ctypes.c_int64 if wide else ctypes.c_int32
    seen = {"local": [], "full": []}

    def names(keys, lens, n):
        keys = ctypes.cast(keys, ctypes.POINTER(ctypes.c_char_p))
        lens = ctypes.cast(lens, ctypes.POINTER(ctypes.c_size_t))
        assert all(len(keys[i]) == lens[i] for i in range(n))
        return [keys[i].decode() for i in range(n)]

    def local(handle, n, keys, lens, results, rest, nrest):
        got = names(keys, lens, n)
        seen["local"].append(got)
        if fail_local:
            return -600
        results = ctypes.cast(results, ctypes.POINTER(result))
        rest = ctypes.cast(rest, ctypes.POINTER(ctypes.c_size_t))
        left = 0
        for i, key in enumerate(got):
            if int(key[1:]) % 3 == 0:
                results[i] = 100 + int(key[1:])   # answered here
            else:
                rest[left] = i
                left += 1
        ctypes.cast(nrest, ctypes.POINTER(ctypes.c_size_t))[0] = left
        return 0

    def full(handle, n, keys, lens, results):
        got = names(keys, lens, n)
        seen["full"].append(got)
        results = ctypes.cast(results, ctypes.POINTER(result))
        for i, key in enumerate(got):
            results[i] = -int(key[1:])        # answered by the node
        return 0

    local_fn = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 7)(local)
    full_fn = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 5)(full)
    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value
    keys = ["k%d" % i for i in range(10)]
    lookup = client_module._batch_lookup
    fail_local = False
    rc, got = lookup(address(full_fn), 1, keys, b"", wide, address(local_fn))
    assert rc == 0
    assert got == [100 + i if i % 3 == 0 else -i for i in range(10)]
    assert seen["local"] == [keys]
    assert seen["full"] == [[k for i, k in enumerate(keys) if i % 3]]
    # Every key answered here: the full function is not called.
    seen["full"].clear()
    rc, got = lookup(address(full_fn), 1, ["k0", "k3"], b"", wide, address(local_fn))
    assert (rc, got, seen["full"]) == (0, [100, 103], [])
    # The local function fails: the full one answers every key.
    fail_local = True
    rc, got = lookup(address(full_fn), 1, keys, b"", wide, address(local_fn))
    assert (rc, got) == (0, [-i for i in range(10)]) and seen["full"] == [keys]


def test_tenant_ids(daemon):
    for bad in ("_reserved", "tab\there", "caf\u00e9"):
        s = MooncakeDistributedStore()
        assert s.setup("h", "m", 0, 0, "tcp", "", host_port(daemon.endpoint),
                       tenant_id=bad) == INVALID_PARAMS
    with pytest.raises(TypeError):
        MooncakeDistributedStore().setup("h", "m", 0, 0, "tcp", "", "x:1", tenant_id=5)
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "h", "metadata_server": "m", "tenant_id": "dict-tenant",
                    "master_server_addr": host_port(daemon.endpoint)}) == 0
    other = make_store(daemon.endpoint, tenant_id="")          # empty: the default tenant
    try:
        assert s.put("tenant-key", b"t") == 0
        assert other.is_exist("tenant-key") == 0
    finally:
        s.close()
        other.close()


# ---- setup's keyword arguments -----------------------------------------------------------

def test_setup_keyword_arguments_warn(daemon):
    s = MooncakeDistributedStore()
    with pytest.warns(KvpoolDropInWarning) as record:
        assert s.setup("h", "m", 0, 16 << 20, "tcp", "", host_port(daemon.endpoint), None,
                       enable_ssd_offload=True, ssd_offload_path="/nvme/offload") == 0
    texts = " ".join(str(w.message) for w in record)
    assert "enable_ssd_offload" in texts and "ssd_offload_path" in texts
    s.close()
    with pytest.warns(KvpoolDropInWarning, match="engine"):
        assert s.setup("h", "m", 0, 0, "tcp", "", host_port(daemon.endpoint),
                       object()) == 0
    s.close()
    assert s.setup("h", "m", 0, 0, "tcp", "", host_port(daemon.endpoint),
                   enable_client_http_server=True, client_http_port=0) == INVALID_PARAMS
    assert s.setup("h", "m", 0, 0, "tcp", "", host_port(daemon.endpoint),
                   enable_client_http_server=True, client_http_port=70000) == INVALID_PARAMS


def _http(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_client_http_server(daemon, prefix):
    port = free_port()
    s = make_store(daemon.endpoint, enable_client_http_server=True, client_http_port=port)
    try:
        status, body = _http(port, "/health")
        assert status == 200 and json.loads(body) == {"status": "healthy", "code": 0}
        assert s.put(prefix + "m", b"metrics") == 0
        s.record_prefetched_tokens(128)
        s.record_prefetched_tokens(64)
        status, body = _http(port, "/metrics")
        assert status == 200
        assert "kvpool_client_prefetched_tokens_total 192" in body
        assert "kvpool_node_objects" in body
        status, body = _http(port, "/metrics/summary")
        assert status == 200 and "kvpool_node_objects:" in body
        status, body = _http(port, "/version")
        assert status == 200 and json.loads(body)["store"] == "kvpool"
        assert _http(port, "/nothing")[0] == 404
        # The port is taken now: a second store warns and goes on without endpoints.
        with pytest.warns(KvpoolDropInWarning, match="client_http_port"):
            other = make_store(daemon.endpoint, enable_client_http_server=True,
                               client_http_port=port)
        other.close()
    finally:
        s.close()
    with pytest.raises(OSError):
        urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2)
    with pytest.raises(TypeError):
        s.record_prefetched_tokens(-1)


def test_health_check_node_gone(prefix):
    # An ipc name of its own: a tcp port (and the ipc name kvpoold derives from it) may be
    # taken by another node on this machine as soon as this one is gone, and the client's
    # socket reconnects to whatever binds it.
    endpoint = "ipc://@kvpool-pytest-gone-" + prefix
    server = Kvpoold("--segment-size", "16MiB", endpoints=(endpoint,),
                     prefix="kvpool-pytest-gone-")
    s = MooncakeDistributedStore()
    s.timeout = 0.5
    try:
        assert s.setup("h", "m", 0, 0, "tcp", "", endpoint) == 0
        assert s.health_check() == 0
        assert server.stop() == 0
        assert s.health_check() == 2                  # HC_MASTER_UNREACHABLE
    finally:
        s.close()
        server.remove()
    assert s.health_check() == 1


# ---- replica descriptors -------------------------------------------------------------------

def test_batch_get_replica_desc(store, prefix):
    keys = [prefix + "r0", prefix + "r1"]
    assert store.put(keys[0], b"x" * 1000) == 0
    assert store.put(keys[1], b"y" * 10) == 0
    descs = store.batch_get_replica_desc(keys + [prefix + "missing", "bad\0key"])
    assert sorted(descs) == sorted(keys)                 # a missing key is left out
    replica = descs[keys[0]][0]
    assert replica.is_memory_replica() and not replica.is_disk_replica()
    assert not replica.is_local_disk_replica()
    assert replica.status == ReplicaStatus.COMPLETE
    buffer = replica.get_memory_descriptor().buffer_descriptor
    assert buffer.size == 1000 and buffer.transport_endpoint
    assert descs[keys[1]][0].get_memory_descriptor().buffer_descriptor.size == 10
    with pytest.raises(RuntimeError):
        replica.get_disk_descriptor()
    assert store.get_replica_desc(keys[1])[0].get_memory_descriptor().buffer_descriptor.size == 10
    assert store.get_replica_desc(prefix + "missing") == []
    assert store.batch_get_replica_desc([]) == {}
    # vLLM's tier logging reads them exactly this way.
    tiers = {k: ("memory" if v and v[0].is_memory_replica() else "unknown")
             for k, v in descs.items()}
    assert tiers == {keys[0]: "memory", keys[1]: "memory"}


# ---- get sessions --------------------------------------------------------------------------

def test_get_sessions(lease_daemon, prefix):
    s = make_store(lease_daemon.endpoint)
    try:
        keys = [prefix + "s0", prefix + "s1"]
        for k in keys:
            assert s.put(k, b"session-value") == 0
        assert s.batch_get_session_start(keys + [prefix + "missing"]) == [0, 0, NOT_FOUND]
        statuses, sources = s.batch_get_session_start_with_sources([keys[0], prefix + "gone"])
        assert statuses == [0, NOT_FOUND] and sources == ["memory", ""]
        time.sleep(LEASE_MS * 3 / 1000)
        # In a session the object stays: a remove without force is refused past the lease.
        assert s.remove(keys[0]) == HAS_LEASE
        dst = np.zeros(64, dtype=np.uint8)
        assert s.batch_get_into(keys, [dst.ctypes.data] * 2, [64, 64]) == [13, 13]
        assert s.batch_get_session_end(keys + [prefix + "never-started"]) == 0
        assert eventually(lambda: s.remove(keys[0]) == 0)
        assert s.batch_get_session_start([keys[1]]) == [0]
        s.close()                                             # close ends every session
        other = make_store(lease_daemon.endpoint)
        try:
            assert eventually(lambda: other.remove(keys[1]) == 0)
        finally:
            other.close()
    finally:
        s.close()


# ---- batch_replica_clear ---------------------------------------------------------------------

def test_batch_replica_clear(lease_daemon, prefix):
    s = make_store(lease_daemon.endpoint)
    other = make_store(lease_daemon.endpoint)
    try:
        mine = [prefix + "c%d" % i for i in range(3)]
        for k in mine:
            assert s.put(k, b"clear-me") == 0
        assert other.put(prefix + "theirs", b"not-mine") == 0
        assert s.put(prefix + "theirs", b"x") == 0            # exists: still not s's
        assert s.batch_replica_clear([]) == []
        assert s.batch_replica_clear([prefix + "nonexistent"]) == []
        assert s.get(mine[0]) == b"clear-me"                  # a read: a lease
        assert mine[0] not in s.batch_replica_clear([mine[0]])
        assert eventually(lambda: s.batch_replica_clear([mine[0]]) == [mine[0]])
        assert s.get(mine[0]) == b""
        cleared = s.batch_replica_clear(mine[1:] + [prefix + "theirs"])
        assert sorted(cleared) == sorted(mine[1:])            # not another store's key
        assert other.get(prefix + "theirs") == b"not-mine"
    finally:
        s.close()
        other.close()


def test_batch_replica_clear_segment(daemon, prefix):
    s = make_store(daemon.endpoint, "clear-host", segment=16 << 20)
    try:
        here = ReplicateConfig()
        here.preferred_segment = s.get_hostname()
        assert s.put(prefix + "here", b"h" * 100, here) == 0
        assert s.batch_replica_clear([prefix + "here"], "nonexistent_host:99999") == []
        assert s.is_exist(prefix + "here") == 1
        assert s.batch_replica_clear([prefix + "here"],
                                     segment_name=s.get_hostname()) == [prefix + "here"]
        assert s.is_exist(prefix + "here") == 0
        with pytest.raises(TypeError):
            s.batch_replica_clear([prefix + "here"], 5)
    finally:
        s.close()


# ---- MooncakeHostMemAllocator, put_from_with_metadata ------------------------------------

def test_host_mem_allocator(store, prefix):
    allocator = MooncakeHostMemAllocator()
    size = 1 << 20
    ptr = allocator.alloc(size)
    assert isinstance(ptr, int) and ptr % 4096 == 0
    view = (ctypes.c_ubyte * size).from_address(ptr)
    arr = np.frombuffer(view, dtype=np.uint8)           # as SGLang wraps it in a tensor
    arr[:] = np.arange(size, dtype=np.uint64).astype(np.uint8)
    assert store.register_buffer(ptr, size) == 0
    assert store.put_from(prefix + "host", ptr, size) == 0
    assert store.get(prefix + "host") == arr.tobytes()
    second = MooncakeHostMemAllocator()                 # one table per process, as in Mooncake
    assert second.free(ptr) == 0
    assert allocator.free(ptr) == -1                    # freed already
    assert allocator.free(12345) == -1
    with pytest.raises(TypeError):
        allocator.alloc(-1)


def test_put_from_with_metadata(store, prefix):
    meta = np.frombuffer(b"META", dtype=np.uint8).copy()
    data = np.frombuffer(b"payload", dtype=np.uint8).copy()
    assert store.put_from_with_metadata(prefix + "m", data.ctypes.data, meta.ctypes.data,
                                        data.nbytes, meta.nbytes) == 0
    assert store.get(prefix + "m") == b"METApayload"
    assert store.put_from_with_metadata(prefix + "m", data.ctypes.data, meta.ctypes.data,
                                        data.nbytes, meta.nbytes) == 0
    assert store.put_from_with_metadata(prefix + "z", data.ctypes.data, meta.ctypes.data,
                                        0, meta.nbytes) == 0
    assert store.is_exist(prefix + "z") == 0
    same_node = ReplicateConfig()
    same_node.prefer_alloc_in_same_node = True
    assert store.put_from_with_metadata(prefix + "p", data.ctypes.data, meta.ctypes.data,
                                        data.nbytes, meta.nbytes, same_node) == -1
    assert MooncakeDistributedStore().put_from_with_metadata("k", 1, 1, 1, 1) == -1
