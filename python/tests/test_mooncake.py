"""Tests of kvpool.mooncake.MooncakeDistributedStore: every method with Mooncake's return
conventions and argument checks (store_py.cpp, real_client.cpp, client_service.cpp in
Mooncake's source), every form of setup(), and this process's contributed segment
(global_segment_size > 0), against a real kvpoold (conftest.py). The methods the connectors
call beyond these are in test_mooncake_methods.py."""

import ctypes
import json
import multiprocessing
import os
import signal
import sys
import time

import numpy as np
import pytest

import kvpool
from kvpool import mooncake
from kvpool.mooncake import (MooncakeDistributedStore, ReplicateConfig, SoftPinAction,
                             MooncakeStoreConfig, parse_size)
from conftest import host_port

NOT_FOUND = -704
EXISTS = -705
HAS_LEASE = -706
OVERFLOW = -10
INVALID_PARAMS = -600
INVALID_KEY = -400


@pytest.fixture
def store(daemon):
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "http://unused:8080/metadata", 0, 16 << 20, "tcp", "",
                   host_port(daemon.endpoint)) == 0
    yield s
    s.close()


@pytest.fixture
def seg_store(daemon):
    """A store that contributes 32 MiB of this process's memory."""
    s = MooncakeDistributedStore()
    assert s.setup("pytest-host:1234", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "",
                   host_port(daemon.endpoint)) == 0
    yield s
    s.close()


def segment_named(client, name):
    return {s.name: s for s in client.segments()}.get(name)


# ---- setup -------------------------------------------------------------------------------

def test_parse_size():
    assert parse_size(123) == 123
    assert parse_size("1073741824") == 1 << 30
    assert parse_size("4GB") == 4 << 30
    assert parse_size("512mb") == 512 << 20
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("64k") == 64 << 10
    assert parse_size(" 2 MB ") == 2 << 20
    for bad in ("", "GB", "1.3", "-1", "12xb", "4ib", True, None, -5, [1]):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_endpoint_of():
    assert mooncake.endpoint_of("localhost:50051") == "tcp://localhost:50051"
    assert mooncake.endpoint_of("10.0.0.1") == "tcp://10.0.0.1:50051"
    assert mooncake.endpoint_of("") == "tcp://127.0.0.1:50051"
    assert mooncake.endpoint_of("ipc://@kvpool-50051") == "ipc://@kvpool-50051"
    assert mooncake.endpoint_of("tcp://h:1") == "tcp://h:1"
    assert mooncake.endpoint_of("[::1]:7000") == "tcp://[::1]:7000"
    with pytest.raises(ValueError):
        mooncake.endpoint_of("etcd://h:2379")


def test_setup_positional_and_keyword(daemon, prefix):
    a = MooncakeDistributedStore()
    assert a.health_check() == 1                               # not set up yet
    assert a.put(prefix + "x", b"v") == INVALID_PARAMS
    assert a.get(prefix + "x") == b""
    assert a.setup("localhost", "http://meta", 0, 1 << 20, "tcp", "",
                   host_port(daemon.endpoint)) == 0
    assert a.health_check() == 0
    b = MooncakeDistributedStore()
    assert b.setup(local_hostname="node-b", metadata_server="P2PHANDSHAKE",
                   global_segment_size=0, local_buffer_size="16MB", protocol="rdma",
                   rdma_devices="mlx5_0", master_server_addr=daemon.endpoint) == 0
    host, port = b.get_hostname().rsplit(":", 1)     # a port of its own, as in Mooncake
    assert host == "node-b" and 12300 <= int(port) <= 14300
    assert a.put(prefix + "kw", b"shared") == 0
    assert b.get(prefix + "kw") == b"shared"
    assert a.close() == 0 and b.close() == 0
    assert a.health_check() == 1
    assert a.get(prefix + "kw") == b""
    with pytest.raises(TypeError):
        MooncakeDistributedStore().setup("only-one-arg-that-is-not-a-dict")
    with pytest.raises(TypeError):
        MooncakeDistributedStore().setup("h", "m", bogus=1)
    with pytest.raises(TypeError):                 # the first seven have no default
        MooncakeDistributedStore().setup("h", "m")
    with pytest.raises(TypeError):
        MooncakeDistributedStore().setup("h", "m", -1, 0, "tcp", "", "x:1")
    assert MooncakeDistributedStore().setup("", "m", 0, 0, "tcp", "",
                                            host_port(daemon.endpoint)) == INVALID_PARAMS


def test_setup_config_dict(daemon, prefix):
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "dict-host", "metadata_server": "unused",
                    "global_segment_size": "16MB", "local_buffer_size": "512mb",
                    "protocol": "tcp", "device_name": "",
                    "master_server_address": host_port(daemon.endpoint)}) == 0
    try:
        assert s.get_hostname().startswith("dict-host:")
        assert s.segment_name().startswith("/proc/%d/fd/" % os.getpid())
        with kvpool.Client(daemon.endpoint) as c:
            assert segment_named(c, s.segment_name()).size == 16 << 20
        assert s.put(prefix + "d", b"dict") == 0 and s.get(prefix + "d") == b"dict"
    finally:
        s.close()
    bad = MooncakeDistributedStore()
    assert bad.setup({"global_segment_size": "lots",
                      "master_server_addr": host_port(daemon.endpoint)}) == INVALID_PARAMS
    assert bad.setup({"master_server_addr": "etcd://x:1"}) == INVALID_PARAMS
    # Mooncake's dict form requires local_hostname and metadata_server.
    assert bad.setup({"local_hostname": "h",
                      "master_server_addr": host_port(daemon.endpoint)}) == INVALID_PARAMS
    assert bad.setup({"metadata_server": "m",
                      "master_server_addr": host_port(daemon.endpoint)}) == INVALID_PARAMS


def test_setup_from_mooncake_config_path(daemon, prefix, tmp_path, monkeypatch):
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({
        "local_hostname": "json-host", "metadata_server": "http://127.0.0.1:8080/metadata",
        "global_segment_size": "8MB", "local_buffer_size": 1073741824, "protocol": "tcp",
        "device_name": "", "master_server_address": host_port(daemon.endpoint)}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    config = MooncakeStoreConfig.load_from_env()
    assert config.global_segment_size == 8 << 20
    assert config.local_buffer_size == 1 << 30
    assert config.setup_args()[0] == "json-host"
    assert config.setup_args()[6] == host_port(daemon.endpoint)
    store = mooncake.store_from_env()
    try:
        assert store.get_hostname().startswith("json-host:")
        assert store.put(prefix + "j", b"json") == 0
        assert store.get(prefix + "j") == b"json"
    finally:
        store.close()
    defaults = MooncakeStoreConfig.from_dict({"master_server_address": "h:1"})
    assert defaults.global_segment_size == 3355443200 and defaults.protocol == "tcp"
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH")
    with pytest.raises(ValueError):
        MooncakeStoreConfig.load_from_env()


def test_setup_unreachable_master():
    s = MooncakeDistributedStore()
    s.timeout = 0.3
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    assert s.setup("h", "m", 0, 0, "tcp", "", "127.0.0.1:%d" % port) == -900
    assert time.monotonic() - start < 5
    assert s.health_check() == 1


def test_install_as_mooncake_store():
    saved = {name: sys.modules.get(name) for name in ("mooncake", "mooncake.store")}
    try:
        mooncake.install(force=True)
        from mooncake.store import MooncakeDistributedStore as Imported, ReplicateConfig as RC
        assert Imported is MooncakeDistributedStore and RC is ReplicateConfig
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


# ---- data methods ------------------------------------------------------------------------

def test_put_get_conventions(store, prefix):
    key = prefix + "k"
    assert store.is_exist(key) == 0
    assert store.get(key) == b""
    assert store.get_size(key) == NOT_FOUND
    assert store.get_buffer(key) is None
    assert store.put(key, b"value") == 0
    assert store.put(key, b"again") == 0             # Mooncake: a key that exists is success
    assert store.is_exist(key) == 1
    assert store.get(key) == b"value"                # and the first value stays
    assert store.get_size(key) == 5
    assert store.put("bad\0key", b"x") == INVALID_KEY
    assert store.get("bad\0key") == b""
    assert store.is_exist("bad\0key") == INVALID_KEY
    assert store.put("", b"x") < 0
    assert store.put(prefix + "empty", b"") == INVALID_PARAMS   # Mooncake refuses empty puts
    assert store.is_exist(prefix + "empty") == 0
    # Every byte of the buffer (Mooncake's put takes one byte per item: a deliberate
    # difference, see python/README.md).
    assert store.put(prefix + "np", np.arange(10, dtype=np.int16)) == 0
    assert store.get(prefix + "np") == np.arange(10, dtype=np.int16).tobytes()
    with pytest.raises(TypeError):
        store.put(prefix + "int", 12345)             # an address is no buffer


def test_batches(store, prefix):
    keys = [prefix + "b%d" % i for i in range(5)]
    values = [os.urandom(10 + i) for i in range(5)]
    assert store.put_batch(keys, values) == 0
    assert store.put_batch(keys[:1] + [prefix + "b-new"], [b"x", b"y"]) == 0
    assert store.get_batch([keys[0], prefix + "b-new"]) == [values[0], b"y"]
    assert store.put_batch([prefix + "b-e1", prefix + "b-e2"], [b"x", b""]) == INVALID_PARAMS
    assert store.put_batch(keys, values[:2]) == INVALID_PARAMS
    assert store.get_batch(keys + [prefix + "none"]) == values + [b""]
    assert store.get_batch([]) == []
    assert store.batch_is_exist(keys[:2] + [prefix + "none", "bad\0key"]) == [1, 1, 0,
                                                                              INVALID_KEY]
    assert store.get_batch([keys[0], "bad\0key", keys[1]]) == [values[0], b"", values[1]]
    buffers = store.batch_get_buffer([keys[2], prefix + "none", keys[3]])
    assert bytes(buffers[0]) == values[2] and buffers[1] is None
    assert np.array(buffers[2], copy=False).tobytes() == values[3]
    assert buffers[0].size() == len(values[2]) and len(buffers[0]) == len(values[2])
    assert ctypes.string_at(buffers[0].ptr(), buffers[0].size()) == values[2]


def test_put_parts_and_get_buffer(store, prefix):
    assert store.put_parts(prefix + "p", b"Hello, ", b"World!", memoryview(b" More")) == 0
    assert store.get(prefix + "p") == b"Hello, World! More"
    config = ReplicateConfig()
    assert store.put_parts(prefix + "pc", b"a", b"b", config=config) == 0
    assert store.put_parts(prefix + "pc", b"a", config=config) == 0
    assert store.get(prefix + "pc") == b"ab"
    assert store.put_parts(prefix + "none", b"", config=config) == 0   # nothing to store
    assert store.is_exist(prefix + "none") == 0
    with pytest.raises(RuntimeError):                # "parts must be 1-D bytes-like"
        store.put_parts(prefix + "2d", np.zeros((2, 2), dtype=np.uint8))
    with pytest.raises(RuntimeError):
        store.put_parts(prefix + "i16", np.zeros(4, dtype=np.int16))
    with pytest.raises(TypeError):
        store.put_parts(prefix + "int", 7)
    handle = store.get_buffer(prefix + "p")
    assert bytes(handle) == b"Hello, World! More"
    arr = np.array(handle, copy=False)
    assert arr.tobytes() == b"Hello, World! More"


def test_zero_copy_single(store, prefix):
    src = np.random.default_rng(2).standard_normal((100, 100)).astype(np.float32)
    assert store.register_buffer(src.ctypes.data, src.nbytes) == 0
    assert store.put_from(prefix + "t", src.ctypes.data, src.nbytes) == 0
    assert store.put_from(prefix + "t", src.ctypes.data, src.nbytes) == 0
    dst = np.empty_like(src)
    assert store.register_buffer(dst.ctypes.data, dst.nbytes) == 0
    assert store.get_into(prefix + "t", dst.ctypes.data, dst.nbytes) == src.nbytes
    assert np.array_equal(src, dst)
    assert store.get_into(prefix + "t", dst.ctypes.data, 100) == INVALID_PARAMS  # too small
    assert store.get_into(prefix + "none", dst.ctypes.data, dst.nbytes) == NOT_FOUND
    assert store.get_into(prefix + "t", 0, 100) == INVALID_PARAMS
    assert store.put_from(prefix + "zero", src.ctypes.data, 0) == 0   # stores nothing
    assert store.is_exist(prefix + "zero") == 0
    with pytest.raises(TypeError):                   # size_t, as pybind11 converts it
        store.put_from(prefix + "neg", src.ctypes.data, -1)
    with pytest.raises(TypeError):
        store.get_into(prefix + "t", -5, 100)
    assert store.unregister_buffer(src.ctypes.data) == 0
    assert store.unregister_buffer(dst.ctypes.data) == 0
    assert store.unregister_buffer(dst.ctypes.data) == INVALID_PARAMS
    with pytest.raises(TypeError):
        store.get_into(prefix + "t", dst, dst.nbytes)          # an array is not a pointer
    with pytest.raises(TypeError):
        store.put_from(prefix + "t2", src.ctypes.data, "100")
    with pytest.raises(TypeError):
        store.register_buffer(src, 10)


def test_zero_copy_batch(store, prefix):
    n, size = 8, 64 << 10
    src = np.random.default_rng(3).integers(0, 255, (n, size), dtype=np.uint8)
    keys = [prefix + "z%d" % i for i in range(n)]
    ptrs = [src[i].ctypes.data for i in range(n)]
    assert store.batch_put_from(keys, ptrs, [size] * n) == [0] * n
    assert store.batch_put_from(keys[:2], ptrs[:2], [size] * 2) == [0] * 2
    assert store.batch_put_from([prefix + "z-empty"], ptrs[:1], [0]) == [INVALID_PARAMS]
    assert store.batch_put_from(keys, ptrs[:1], [size]) == [INVALID_PARAMS] * n
    dst = np.zeros_like(src)
    out = [dst[i].ctypes.data for i in range(n)]
    assert store.batch_get_into(keys, out, [size] * n) == [size] * n
    assert np.array_equal(src, dst)
    results = store.batch_get_into([keys[0], prefix + "none", keys[1], "bad\0"],
                                   out[:4], [size, size, 10, size])
    assert results == [size, NOT_FOUND, INVALID_PARAMS, INVALID_KEY]   # too small: -600
    assert store.batch_get_into([], [], []) == []
    with pytest.raises(TypeError):
        store.batch_get_into(keys[:1], [-1], [size])
    with pytest.raises(TypeError):
        store.batch_get_into(keys[:1], [dst[0]], [size])
    with pytest.raises(TypeError):
        store.batch_get_into("one-key", out[:1], [size])   # keys: a list, not a str


def test_multi_buffers(store, prefix):
    layers, blocks, part = 3, 4, 4096
    src = np.random.default_rng(4).integers(0, 255, (layers, blocks, part), dtype=np.uint8)
    keys = [prefix + "m%d" % b for b in range(blocks)]
    ptrs = [[src[l, b].ctypes.data for l in range(layers)] for b in range(blocks)]
    sizes = [[part] * layers for _ in range(blocks)]
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * blocks
    assert store.get_size(keys[0]) == layers * part
    assert store.get(keys[1]) == b"".join(src[l, 1].tobytes() for l in range(layers))
    dst = np.zeros_like(src)
    out = [[dst[l, b].ctypes.data for l in range(layers)] for b in range(blocks)]
    assert store.batch_get_into_multi_buffers(keys, out, sizes) == [layers * part] * blocks
    assert np.array_equal(src, dst)
    assert store.batch_get_into_multi_buffers(keys[:1], out[:1], sizes[:1], True) == [
        layers * part]
    small = [[dst[0, 0].ctypes.data]]
    assert store.batch_get_into_multi_buffers(keys[:1], small, [[part]]) == [INVALID_PARAMS]
    assert store.batch_get_into_multi_buffers([prefix + "none"], small, [[part]]) == [NOT_FOUND]
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes[:1]) == [INVALID_PARAMS] * 4
    assert store.batch_put_from_multi_buffers(keys[:1], [ptrs[0][:1]], [sizes[0]]) == [
        INVALID_PARAMS]
    assert store.batch_put_from_multi_buffers(
        [prefix + "ok", "bad\0"], ptrs[:2], sizes[:2]) == [0, INVALID_KEY]
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * blocks   # exist: 0
    assert store.batch_put_from_multi_buffers(
        [prefix + "zero"], [ptrs[0]], [[0] * layers]) == [INVALID_PARAMS]
    with pytest.raises(TypeError):
        store.batch_put_from_multi_buffers(keys[:1], [[-1]], [[part]])


def test_remove_conventions(store, prefix):
    key = prefix + "r"
    assert store.remove(key) == NOT_FOUND
    assert store.put(key, b"v") == 0
    assert store.get(key) == b"v"                          # the read takes a lease
    assert store.remove(key) == HAS_LEASE
    assert store.remove(key, force=True) == 0
    assert store.is_exist(key) == 0
    keys = [prefix + "rx%d" % i for i in range(6)]
    assert store.put_batch(keys, [b"v"] * 6) == 0
    assert store.batch_remove(keys[:2] + [prefix + "none"], force=True) == [0, 0, NOT_FOUND]
    assert store.remove_by_regex("^" + prefix + "rx[23]$", force=True) == 2
    assert store.remove_by_regex("^" + prefix + "nothing") == 0
    assert store.remove_by_regex("(unclosed") < 0
    assert store.remove_all(force=True) >= 2
    assert store.batch_is_exist(keys) == [0] * 6


def test_replicate_config():
    config = ReplicateConfig()
    assert config.replica_num == 1
    assert config.soft_pin_action == SoftPinAction.PRESERVE and not config.with_soft_pin
    assert config.preferred_segment == "" and config.preferred_segments == []
    assert config.with_hard_pin is False and config.soft_pin_ttl_ms is None
    config.with_soft_pin = True
    assert config.soft_pin_action == SoftPinAction.ENABLE
    config.soft_pin_action = SoftPinAction.DISABLE
    assert not config.with_soft_pin
    config.replica_num = 3
    config.preferred_segment = "node1:12345"
    text = str(config)
    assert "3" in text and "node1:12345" in text
    opts = config.to_put_options()
    assert opts.replica_num == 3 and opts.preferred_segments == ["node1:12345"]
    assert opts.soft_pin is False
    config.preferred_segments = ["a", "b"]
    assert config.to_put_options(str.upper).preferred_segments == ["A", "B"]
    assert [a.name for a in SoftPinAction] == ["PRESERVE", "ENABLE", "DISABLE"]


def test_put_with_config(store, prefix):
    config = ReplicateConfig()
    config.with_soft_pin = True
    config.soft_pin_ttl_ms = 60000
    assert store.put(prefix + "soft", b"s", config) == 0
    ttl_without_enable = ReplicateConfig()
    ttl_without_enable.soft_pin_ttl_ms = 1000          # Mooncake: a TTL needs ENABLE
    assert store.put(prefix + "ttl", b"t", ttl_without_enable) == INVALID_PARAMS
    ttl_without_enable.soft_pin_action = SoftPinAction.DISABLE
    assert store.put(prefix + "ttl", b"t", ttl_without_enable) == INVALID_PARAMS
    hard = ReplicateConfig()
    hard.with_hard_pin = True
    assert store.put(prefix + "hard", b"h", config=hard) == 0
    assert store.get_batch([prefix + "soft", prefix + "hard"]) == [b"s", b"h"]
    too_many = ReplicateConfig()
    too_many.replica_num = 64
    assert store.put(prefix + "many", b"m", too_many) < 0
    nowhere = ReplicateConfig()
    nowhere.preferred_segment = "no-such-node:1"
    assert store.put(prefix + "nowhere", b"n", nowhere) == 0   # a hint, as in Mooncake
    assert store.get(prefix + "nowhere") == b"n"
    with pytest.raises(TypeError):
        store.put(prefix + "bad-config", b"x", "not a config")


# ---- the contributed segment -------------------------------------------------------------

def test_segment_receives_objects_and_goes_on_close(daemon, prefix):
    s = MooncakeDistributedStore()
    assert s.setup("seg-host:1", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "",
                   host_port(daemon.endpoint)) == 0
    name = s.segment_name()
    assert os.readlink(name).startswith("/memfd:kvpool-client")
    with kvpool.Client(daemon.endpoint) as c:
        seg = segment_named(c, name)
        assert seg is not None and seg.size == 32 << 20 and seg.used == 0
        config = ReplicateConfig()
        config.preferred_segment = s.get_hostname()
        data = os.urandom(1 << 20)
        assert s.put(prefix + "local", data, config) == 0
        assert segment_named(c, name).used >= len(data)
        assert s.get(prefix + "local") == data
        assert c.get(prefix + "local") == data            # another client reads it too
        out = np.zeros(1 << 20, dtype=np.uint8)
        assert s.get_into(prefix + "local", out.ctypes.data, out.nbytes) == len(data)
        assert out.tobytes() == data
        elsewhere = ReplicateConfig()
        # (The node's own segments are sealed memfds too, named under the node's pid.)
        elsewhere.preferred_segment = [seg.name for seg in c.segments()
                                       if not seg.name.startswith("/proc/%d/" % os.getpid())][0]
        assert s.put(prefix + "elsewhere", b"e" * 4096, elsewhere) == 0
        assert segment_named(c, name).used < (1 << 20) + 4096
        assert s.close() == 0
        assert segment_named(c, name) is None
        # The memfd is closed (its descriptor number may already serve something else).
        assert not os.path.exists(name) or not os.readlink(name).startswith("/memfd:")
        assert not c.exist(prefix + "local")               # it went with the segment
        assert c.get(prefix + "elsewhere") == b"e" * 4096  # objects elsewhere stay


def test_zero_segment_contributes_nothing(daemon, store):
    with kvpool.Client(daemon.endpoint) as c:
        names = [seg.name for seg in c.segments()]
    assert store.segment_name() == ""
    assert not [n for n in names if n.startswith("/proc/%d/" % os.getpid())]


def _die_with_segment(endpoint, key, queue):
    store = MooncakeDistributedStore()
    rc = store.setup("doomed:1", "x", 16 << 20, 0, "tcp", "", endpoint)
    config = ReplicateConfig()
    config.preferred_segment = "doomed:1"
    put = store.put(key, b"d" * 1000, config) if rc == 0 else rc
    queue.put((rc, put, store.segment_name()))
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)       # no close(), no atexit


def test_segment_unmounted_when_client_dies(daemon, prefix):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_die_with_segment,
                       args=(host_port(daemon.endpoint), prefix + "dies", queue))
    proc.start()
    rc, put, name = queue.get(timeout=30)
    proc.join(30)
    assert rc == 0 and put == 0 and name
    assert proc.exitcode == -signal.SIGKILL
    with kvpool.Client(daemon.endpoint) as c:
        deadline = time.monotonic() + 10
        while segment_named(c, name) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        # Unmounted, the node's was the last hold on the memfd: the kernel frees it, and
        # nothing is left in /dev/shm to clean up.
        assert segment_named(c, name) is None, "the dead client's segment is still mounted"
        assert not c.exist(prefix + "dies")


def test_replica_in_own_segment_with_seg_store(seg_store, prefix):
    config = ReplicateConfig()
    config.preferred_segments = [seg_store.get_hostname()]
    keys = [prefix + "s%d" % i for i in range(4)]
    src = np.arange(4 * 1024, dtype=np.uint8).reshape(4, 1024)
    assert seg_store.batch_put_from(keys, [src[i].ctypes.data for i in range(4)], [1024] * 4,
                                    config) == [0] * 4
    dst = np.zeros_like(src)
    assert seg_store.batch_get_into(keys, [dst[i].ctypes.data for i in range(4)],
                                    [1024] * 4) == [1024] * 4
    assert np.array_equal(src, dst)


def test_setup_from_mooncake_environment(daemon, prefix, monkeypatch):
    """Without MOONCAKE_CONFIG_PATH, the MOONCAKE_* variables, as Mooncake's own config reads
    them (SGLang's HiCache guide sets these)."""
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    for variable, _ in MooncakeStoreConfig.ENVIRONMENT.values():
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        MooncakeStoreConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_MASTER", host_port(daemon.endpoint))
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "0")
    monkeypatch.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "16mb")
    monkeypatch.setenv("MOONCAKE_TENANT_ID", "env-tenant")
    config = MooncakeStoreConfig.load_from_env()
    assert config.setup_args() == ("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "",
                                   host_port(daemon.endpoint))
    assert config.setup_kwargs() == {"tenant_id": "env-tenant"}
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "true")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/nvme/offload")
    assert MooncakeStoreConfig.load_from_env().setup_kwargs() == {
        "tenant_id": "env-tenant", "enable_ssd_offload": True,
        "ssd_offload_path": "/nvme/offload"}
    monkeypatch.delenv("MOONCAKE_OFFLOAD_ENABLED")
    monkeypatch.delenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH")
    store = mooncake.store_from_env()
    try:
        assert store.put(prefix + "env", b"from the environment") == 0
        assert store.get(prefix + "env") == b"from the environment"
    finally:
        store.close()
