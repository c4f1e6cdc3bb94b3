"""Tests of kvpool.Client, the native API: every method, its return values and its errors,
against a real kvpoold (conftest.py)."""

import ctypes
import os
import socket
import threading
import time

import numpy as np
import pytest

import kvpool
from kvpool import _native


class FakeTensor:
    """What kvpool needs of a torch tensor: data_ptr(), numel(), element_size(),
    is_contiguous(), device (torch itself is not installed on the test machines)."""

    class _Device:
        type = "cpu"

    def __init__(self, array_, device="cpu"):
        self.array = array_
        self.device = self._Device()
        self.device.type = device

    def data_ptr(self):
        return self.array.ctypes.data

    def numel(self):
        return self.array.size

    def element_size(self):
        return self.array.itemsize

    def is_contiguous(self):
        return self.array.flags["C_CONTIGUOUS"]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_status_table_matches_library():
    for status in kvpool.Status:
        name = _native.status_name(int(status)).decode()
        assert name == status.name
        assert _native.strerror(int(status)).decode() == kvpool.strerror(status)
    assert kvpool.status_name(-704) == "OBJECT_NOT_FOUND"
    assert kvpool.status_name(-12345) == "UNKNOWN"


def test_error_classes():
    err = kvpool.error_for(-704, "why")
    assert isinstance(err, kvpool.ObjectNotFoundError)
    assert isinstance(err, kvpool.Error) and isinstance(err, KeyError)
    assert err.status == -704 and err.name == "OBJECT_NOT_FOUND" and err.reason == "why"
    assert "OBJECT_NOT_FOUND" in str(err) and "why" in str(err)
    assert kvpool.ObjectAlreadyExistsError.status == -705
    assert kvpool.ObjectHasLeaseError.status == -706
    assert kvpool.NoAvailableHandleError.status == -200
    assert kvpool.RpcFailError.status == -900
    unknown = kvpool.error_for(-4242)
    assert type(unknown) is kvpool.Error and unknown.status == -4242


def test_connect_ping_close(daemon):
    client = kvpool.connect(daemon.endpoint, timeout=2.0)
    assert not client.closed
    client.ping()
    assert daemon.endpoint in repr(client)
    client.close()
    assert client.closed
    client.close()
    with pytest.raises(kvpool.Error):
        client.ping()
    with kvpool.Client(daemon.endpoint) as c:
        c.ping()
    assert c.closed


def test_host_port_means_tcp(daemon):
    # "127.0.0.1:PORT", as people write an address, is tcp://127.0.0.1:PORT (kvpool_connect).
    assert daemon.endpoint.startswith("tcp://")
    with kvpool.Client(daemon.endpoint[len("tcp://"):], timeout=2.0) as c:
        c.ping()
        c.put("host-port", b"v")
        assert c.get("host-port") == b"v"
        c.remove("host-port", force=True)


def test_connect_to_nothing_fails_fast():
    start = time.monotonic()
    with pytest.raises(kvpool.RpcFailError):
        kvpool.Client("tcp://127.0.0.1:%d" % free_port(), timeout=0.3)
    assert time.monotonic() - start < 5


def test_put_get_exist_size_remove(client, prefix):
    key = prefix + "a"
    assert client.exist(key) is False
    client.put(key, b"hello world")
    assert client.exist(key) is True
    assert client.get(key) == b"hello world"
    assert client.get_size(key) == 11
    with pytest.raises(kvpool.ObjectAlreadyExistsError) as info:
        client.put(key, b"other")
    assert info.value.status == -705
    assert client.get(key) == b"hello world"       # immutable: the first value stays
    client.remove(key, force=True)
    assert client.exist(key) is False
    with pytest.raises(kvpool.ObjectNotFoundError) as info:
        client.get(key)
    assert info.value.status == -704
    with pytest.raises(KeyError):
        client.get_size(key)
    with pytest.raises(kvpool.ObjectNotFoundError):
        client.remove(key)


def test_empty_and_binary_values(client, prefix):
    client.put(prefix + "empty", b"")
    assert client.get(prefix + "empty") == b""
    assert client.get_size(prefix + "empty") == 0
    blob = bytes(range(256)) * 5 + b"\0\0"
    client.put(prefix + "bin", blob)
    assert client.get(prefix + "bin") == blob


def test_large_value(client, prefix):
    blob = os.urandom(3 << 20)
    client.put(prefix + "big", blob)
    assert client.get(prefix + "big") == blob
    out = bytearray(len(blob))
    assert client.get_into(prefix + "big", out) == len(blob)
    assert out == blob


def test_a_client_refuses_use_after_fork(client, prefix):
    """ZeroMQ sockets do not survive fork(): the child gets a clear error, not a hang or a
    corrupted connection, and the parent's client goes on working."""
    key = prefix + "fork"
    client.put(key, b"before")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            client.get(key)
        except kvpool.Error as exc:
            code = 0 if (exc.status == kvpool.Status.INVALID_PARAMS
                         and "another process" in str(exc)) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert client.get(key) == b"before"


def test_invalid_keys(client):
    with pytest.raises(kvpool.InvalidKeyError):
        client.put("a\0b", b"x")
    with pytest.raises(kvpool.InvalidKeyError):
        client.get("")
    with pytest.raises(TypeError):
        client.get(17)


def test_lease_blocks_remove_unless_forced(client, prefix):
    key = prefix + "leased"
    client.put(key, b"v")
    assert client.get(key) == b"v"              # a read grants a lease
    with pytest.raises(kvpool.ObjectHasLeaseError) as info:
        client.remove(key)
    assert info.value.status == -706
    client.remove(key, force=True)
    assert not client.exist(key)


def test_regex_remove_counts_keys_kept_by_leases(client, prefix):
    keys = [prefix + "rl-%d" % i for i in range(3)]
    assert client.put_batch(keys, [b"v"] * 3) == [0] * 3
    assert client.get(keys[0]) == b"v" and client.get(keys[1]) == b"v"   # two leases
    pattern = "^" + prefix + "rl-"
    got = client.remove_by_regex_counts(pattern)
    assert got == (1, 3, 2) and (got.removed, got.matched, got.kept) == (1, 3, 2)
    assert client.exist_batch(keys) == [True, True, False]
    assert client.remove_by_regex_counts(pattern, force=True) == (2, 2, 0)
    assert client.remove_by_regex_counts(pattern) == (0, 0, 0)
    with pytest.raises(kvpool.InvalidParamsError):
        client.remove_by_regex_counts("([unclosed")


def test_put_from_sources(client, prefix):
    arr = np.arange(1000, dtype=np.float32)
    client.put_from(prefix + "np", arr)
    assert client.get(prefix + "np") == arr.tobytes()
    client.put(prefix + "mv", memoryview(arr.tobytes())[10:20])
    assert client.get(prefix + "mv") == arr.tobytes()[10:20]
    client.put_from(prefix + "raw", arr.ctypes.data, 64)
    assert client.get(prefix + "raw") == arr.tobytes()[:64]
    client.put_from(prefix + "part", arr, 12)
    assert client.get(prefix + "part") == arr.tobytes()[:12]
    client.put_from(prefix + "tensor", FakeTensor(arr))
    assert client.get(prefix + "tensor") == arr.tobytes()
    readonly = np.frombuffer(b"read only bytes", dtype=np.uint8)
    assert not readonly.flags.writeable
    client.put(prefix + "ro", readonly)
    assert client.get(prefix + "ro") == b"read only bytes"
    with pytest.raises(kvpool.InvalidParamsError):
        client.put_from(prefix + "raw2", arr.ctypes.data)         # address without size
    with pytest.raises(kvpool.InvalidParamsError):
        client.put_from(prefix + "big", arr, arr.nbytes + 1)      # size beyond the buffer
    with pytest.raises(BufferError):
        client.put(prefix + "strided", np.arange(100, dtype=np.int64)[::2])
    with pytest.raises(kvpool.InvalidParamsError):
        client.put_from(prefix + "gpu", FakeTensor(arr, device="cuda"))
    with pytest.raises(kvpool.InvalidParamsError):
        client.put_from(prefix + "nc", FakeTensor(np.zeros((4, 4))[:, :2]))
    with pytest.raises(TypeError):
        client.put(prefix + "str", "text is not bytes")
    assert not client.exist(prefix + "raw2") and not client.exist(prefix + "strided")


def test_get_into_targets(client, prefix):
    data = os.urandom(4096)
    client.put(prefix + "k", data)
    out = np.zeros(5000, dtype=np.uint8)
    assert client.get_into(prefix + "k", out) == 4096
    assert out[:4096].tobytes() == data and not out[4096:].any()
    buf = bytearray(4096)
    assert client.get_into(prefix + "k", buf) == 4096 and bytes(buf) == data
    raw = ctypes.create_string_buffer(4096)
    assert client.get_into(prefix + "k", ctypes.addressof(raw), 4096) == 4096
    assert raw.raw == data
    tensor = FakeTensor(np.zeros(1024, dtype=np.float32))
    assert client.get_into(prefix + "k", tensor) == 4096
    assert tensor.array.tobytes() == data
    small = bytearray(100)
    with pytest.raises(kvpool.BufferOverflowError) as info:
        client.get_into(prefix + "k", small)
    assert info.value.status == -10 and small == bytearray(100)
    with pytest.raises(kvpool.ObjectNotFoundError):
        client.get_into(prefix + "missing", buf)
    with pytest.raises((BufferError, TypeError)):
        client.get_into(prefix + "k", b"\0" * 4096)     # read-only target


def test_put_parts(client, prefix):
    a = np.arange(16, dtype=np.uint8)
    client.put_parts(prefix + "p", b"head-", memoryview(b"middle-"), a)
    assert client.get(prefix + "p") == b"head-middle-" + a.tobytes()
    client.put_parts(prefix + "none")
    assert client.get(prefix + "none") == b""


def test_get_buffer(client, prefix):
    data = os.urandom(10000)
    client.put(prefix + "b", data)
    handle = client.get_buffer(prefix + "b")
    assert handle.size() == len(handle) == 10000
    assert bytes(handle) == data
    assert memoryview(handle).nbytes == 10000
    view = np.frombuffer(handle, dtype=np.uint8)
    assert view.tobytes() == data
    assert ctypes.string_at(handle.ptr(), 16) == data[:16]
    client.put(prefix + "other", b"x" * 100)          # the connection is reused meanwhile
    del handle
    assert view.tobytes() == data                      # the array keeps the message alive
    with pytest.raises(kvpool.ObjectNotFoundError):
        client.get_buffer(prefix + "missing")
    client.put(prefix + "empty", b"")
    empty = client.get_buffer(prefix + "empty")
    assert len(empty) == 0 and bytes(empty) == b"" and not empty


def test_batch_put_get(client, prefix):
    keys = [prefix + str(i) for i in range(20)]
    values = [os.urandom(100 * i) for i in range(20)]
    assert client.put_batch(keys, values) == [0] * 20
    again = client.put_batch(keys[:2] + [prefix + "new"], [b"a", b"b", b"c"])
    assert again == [-705, -705, 0]
    got = client.get_batch(keys + [prefix + "missing"])
    assert got[:20] == values and got[20] is None
    handles = client.get_buffer_batch([keys[5], prefix + "missing", keys[7]])
    assert bytes(handles[0]) == values[5] and handles[1] is None
    assert bytes(handles[2]) == values[7]
    assert client.exist_batch(keys[:3] + [prefix + "missing"]) == [True, True, True, False]
    assert client.get_size_batch([keys[3], prefix + "missing"]) == [300, -704]
    assert client.get_batch([]) == [] and client.put_batch([], []) == []
    with pytest.raises(kvpool.InvalidParamsError):
        client.put_batch(keys, values[:3])


def test_batch_put_from_addresses(client, prefix):
    arr = np.arange(4096, dtype=np.uint8)
    keys = [prefix + "a", prefix + "b"]
    addresses = [arr.ctypes.data, arr.ctypes.data + 1024]
    assert client.put_batch(keys, addresses, sizes=[1024, 2048]) == [0, 0]
    assert client.get_batch(keys) == [arr[:1024].tobytes(), arr[1024:3072].tobytes()]


def test_get_batch_into(client, prefix):
    keys = [prefix + "k%d" % i for i in range(4)]
    values = [os.urandom(1000 + i) for i in range(4)]
    assert client.put_batch(keys, values) == [0] * 4
    outs = [bytearray(2000) for _ in range(4)]
    outs[3] = bytearray(10)                            # too small
    results = client.get_batch_into(keys + [prefix + "missing"], outs + [bytearray(8)])
    assert results[:3] == [1000, 1001, 1002]
    assert results[3] == -10 and results[4] == -704
    for i in range(3):
        assert bytes(outs[i][:1000 + i]) == values[i]
    dest = np.zeros((4, 2048), dtype=np.uint8)
    results = client.get_batch_into(keys, [dest[i].ctypes.data for i in range(4)],
                                    sizes=[2048] * 4)
    assert results == [1000, 1001, 1002, 1003]
    for i in range(4):
        assert dest[i, :1000 + i].tobytes() == values[i]


def test_batch_parts(client, prefix):
    src = np.random.default_rng(1).integers(0, 255, size=(3, 4, 256), dtype=np.uint8)
    keys = [prefix + "x%d" % i for i in range(3)]
    parts = [[src[i, j] for j in range(4)] for i in range(3)]
    assert client.put_batch_parts(keys, parts) == [0, 0, 0]
    for i in range(3):
        assert client.get(keys[i]) == src[i].tobytes()
    dst = np.zeros_like(src)
    results = client.get_batch_into_parts(keys, [[dst[i, j] for j in range(4)]
                                                 for i in range(3)])
    assert results == [1024] * 3
    assert np.array_equal(src, dst)
    small = [bytearray(10)]
    assert client.get_batch_into_parts(keys[:1], [small]) == [-10]
    assert client.get_batch_into_parts([prefix + "none"], [[bytearray(10)]]) == [-704]
    addr = [[src[0, j].ctypes.data for j in range(4)]]
    assert client.put_batch_parts([prefix + "raw"], addr, sizes_per_key=[[256] * 4]) == [0]
    assert client.get(prefix + "raw") == src[0].tobytes()


def test_remove_batch_regex_all(client, prefix):
    keys = [prefix + "r%d" % i for i in range(10)]
    assert client.put_batch(keys, [b"v"] * 10) == [0] * 10
    assert client.remove_batch(keys[:2] + [prefix + "none"], force=True) == [0, 0, -704]
    assert client.remove_by_regex("^" + prefix + "r[2-4]$", force=True) == 3
    assert client.exist_batch(keys) == [False] * 5 + [True] * 5
    assert client.remove_by_regex("^" + prefix + "nothing", force=True) == 0
    with pytest.raises(kvpool.Error):
        client.remove_by_regex("([unclosed", force=True)
    removed = client.remove_all(force=True)
    assert removed >= 5
    assert client.exist_batch(keys) == [False] * 10


def test_segments_stats_mount(client, prefix):
    segments = client.segments()
    assert segments and all(isinstance(s, kvpool.SegmentInfo) for s in segments)
    assert segments[0].size == 256 << 20
    stats = client.stats()
    assert stats["segments"] >= 1 and stats["bytes_mounted"] >= 256 << 20
    before = stats["puts"]
    client.put(prefix + "s", b"x" * 100)
    assert client.stats()["puts"] == before + 1

    with kvpool.SharedSegment(8 << 20) as segment:
        name = segment.name
        seg_id = client.mount_segment(name, 8 << 20)
        mounted = {s.id: s for s in client.segments()}
        assert seg_id in mounted and mounted[seg_id].name == name
        assert mounted[seg_id].size == 8 << 20
        with pytest.raises(kvpool.SegmentAlreadyExistsError):
            client.mount_segment(name, 8 << 20)
        opts = kvpool.PutOptions(preferred_segments=[name])
        client.put(prefix + "in-seg", b"y" * 4096, options=opts)
        assert {s.id: s for s in client.segments()}[seg_id].used >= 4096
        assert client.get(prefix + "in-seg") == b"y" * 4096
        client.unmount_segment(seg_id)
        assert seg_id not in {s.id for s in client.segments()}
        assert not client.exist(prefix + "in-seg")
        with pytest.raises(kvpool.SegmentNotFoundError):
            client.unmount_segment(seg_id)
    with pytest.raises(kvpool.Error):
        client.mount_segment("/kvpool-pytest-no-such-object", 1 << 20)


def test_mount_refuses_memory_that_can_shrink(client, prefix):
    # A plain /dev/shm object and an unsealed memfd could both be cut short under the node
    # (SIGBUS); the node refuses them and says why.
    name = "/kvpool-pytest-%d-%s" % (os.getpid(), prefix[2:-1])
    path = "/dev/shm" + name
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    loose = os.memfd_create("kvpool-pytest", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 1 << 20)
        os.ftruncate(loose, 1 << 20)
        # The node opens only a descriptor of the asking process, never a path it names.
        with pytest.raises(kvpool.PermissionDeniedError) as info:
            client.mount_segment(name, 1 << 20)
        assert "its own memory" in str(info.value)
        with pytest.raises(kvpool.InvalidParamsError) as info:
            client.mount_segment("/proc/%d/fd/%d" % (os.getpid(), loose), 1 << 20)
        assert "F_SEAL_SHRINK" in str(info.value)
    finally:
        os.close(fd)
        os.close(loose)
        os.unlink(path)
    # A sealed segment is mounted; its owner can no longer shrink it, and the node keeps
    # serving what it stored there.
    with kvpool.SharedSegment(4 << 20) as segment:
        with pytest.raises(kvpool.InvalidParamsError) as info:
            client.mount_segment(segment.name, 8 << 20)     # more than it holds
        assert "fewer than" in str(info.value)
        seg_id = client.mount_segment(segment.name, segment.size)
        opts = kvpool.PutOptions(preferred_segments=[segment.name])
        client.put(prefix + "sealed", b"z" * 65536, options=opts)
        with pytest.raises(PermissionError):
            os.ftruncate(segment.fd, 4096)
        assert client.get(prefix + "sealed") == b"z" * 65536
        client.unmount_segment(seg_id)
    client.ping()


def test_put_options(client, prefix):
    opts = kvpool.PutOptions(replica_num=1, soft_pin=True, soft_pin_ttl_ms=60000)
    client.put(prefix + "soft", b"s", options=opts)
    client.put(prefix + "hard", b"h", options=kvpool.PutOptions(hard_pin=True))
    assert client.get_batch([prefix + "soft", prefix + "hard"]) == [b"s", b"h"]
    with pytest.raises(kvpool.Error) as info:
        client.put(prefix + "many", b"m", options=kvpool.PutOptions(replica_num=50))
    assert info.value.status < 0
    assert "replica_num=50" in repr(kvpool.PutOptions(replica_num=50))


def test_fast_path_switch(daemon, prefix):
    with kvpool.Client(daemon.endpoint, fast_path=False) as slow:
        assert slow.fast_path is False
        slow.put(prefix + "f", b"over the socket")
        out = bytearray(64)
        assert slow.get_into(prefix + "f", out) == 15
    with kvpool.Client(daemon.endpoint) as fast:
        assert fast.get(prefix + "f") == b"over the socket"
        fast.fast_path = False
        assert fast.fast_path is False
        assert fast.get(prefix + "f") == b"over the socket"


def test_threads_share_a_client(client, prefix):
    errors = []

    def work(t):
        try:
            for i in range(40):
                key = "%sth%d-%d" % (prefix, t, i)
                value = os.urandom(512 + i)
                client.put(key, value)
                assert client.get(key) == value
                out = bytearray(1024)
                assert client.get_into(key, out) == len(value)
                assert bytes(out[:len(value)]) == value
        except Exception as exc:                      # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sum(client.exist_batch(["%sth%d-%d" % (prefix, t, i)
                                   for t in range(4) for i in range(40)])) == 160


def test_pointer_arrays_survive_the_call(client, prefix):
    # The address arrays the client builds must outlive the C call: check a big batch whose
    # arrays would be reused by the allocator if freed early.
    keys = [prefix + "p%03d" % i for i in range(300)]
    values = [bytes([i % 256]) * (i + 1) for i in range(300)]
    assert client.put_batch(keys, values) == [0] * 300
    outs = [bytearray(400) for _ in keys]
    assert client.get_batch_into(keys, outs) == [len(v) for v in values]
    assert all(bytes(o[:len(v)]) == v for o, v in zip(outs, values))


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "socket"])
def test_get_batch_both_paths(daemon, prefix, fast):
    with kvpool.Client(daemon.endpoint, fast_path=fast) as c:
        keys = [prefix + "g%d" % i for i in range(6)]
        values = [b"", b"x", os.urandom(300 << 10), os.urandom(70000), b"\0" * 9, b"end"]
        assert c.put_batch(keys, values) == [0] * 6
        assert c.get_batch(keys + [prefix + "none"]) == values + [None]
        handles = c.get_buffer_batch(keys + [prefix + "none"])
        assert [bytes(h) for h in handles[:6]] == values and handles[6] is None
        assert [h.size() for h in handles[:6]] == [len(v) for v in values]
        assert c.get(keys[2]) == values[2]
        assert isinstance(c.get(keys[1]), bytes)


def test_get_batch_after_key_changes_size(client, prefix):
    # fetch() asks sizes, then copies: a key put again with another size in between must be
    # read whole (the client falls back to a plain GET for it).
    from kvpool import client as client_module
    key = prefix + "changes"
    client.put(key, b"short")
    real = _native.get_size_batch

    def racing(handle, n, karr, results):
        rc = real(handle, n, karr, results)
        client.remove(key, force=True)
        client.put(key, b"a much longer value than before")
        return rc

    client_module._native.get_size_batch = racing
    try:
        handle = client._acquire()
        try:
            if not _native.fast_path(handle):
                pytest.skip("no same-machine fast path here")
            rc, values = client_module.fetch(handle, 1, client_module._key_array([key]))
        finally:
            client._idle.append(handle)
    finally:
        client_module._native.get_size_batch = real
    assert rc == 0 and values == [b"a much longer value than before"]


def test_malloc_tuning_switch():
    import subprocess
    import sys
    code = ("import kvpool; from kvpool import _native; _native.tune_malloc(); "
            "print(_native._malloc['done'])")
    for env_value, expect in (("0", "False"), ("1", "True")):
        env = dict(os.environ, KVPOOL_MALLOC_TUNING=env_value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.stdout.strip() == expect, out.stderr
    code = ("import kvpool; from kvpool import _native; kvpool.set_malloc_tuning(False); "
            "_native.tune_malloc(); print(_native._malloc['done'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "False", out.stderr
