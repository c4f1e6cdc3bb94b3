"""Tests of what the engines call on kvpool.mooncake today beyond Mooncake's own binding, and of
the conventions they rely on, against a real kvpoold:

- SGLang's direct linker probes with getattr for batch_get_session_refresh,
  batch_get_session_prefetch, get_lease_ttl_ms and dfs_prefetch_arena_available: their result
  shapes and semantics on both session paths (a pin on the node's machine, a read's lease from
  another machine), and the lease TTL as the node changes it live.
- vLLM's connector takes -200 (NO_AVAILABLE_HANDLE) from a put as back-pressure: every put
  form, single and batch, answers -200 from a full pool, and nothing else turns into -200.
- vLLM passes tenant_id only when it is not "default": setup without it, with "default" in
  every form, and with another tenant.
- Mooncake's get_into_ranges answers lists that disagree with INVALID_PARAMS in the shape of
  the request instead of raising, and [] for no buffers."""

import subprocess
import time

import numpy as np
import pytest

import kvpool
from kvpool import mooncake
from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig
from kvpool_daemon import Kvpoold, bin_dir
from conftest import host_port
from test_mooncake_methods import make_store

OK = 0
NO_SPACE = -200
INVALID_KEY = -400
INVALID_PARAMS = -600
PERMISSION_DENIED = -604
NOT_FOUND = -704
HAS_LEASE = -706
LEASE_MS = 400


@pytest.fixture(scope="module")
def lease_daemon():
    """A kvpoold whose read leases last LEASE_MS."""
    server = Kvpoold("--segment-size", "32MiB", "--lease-ttl", str(LEASE_MS),
                     prefix="kvpool-pytest-engine-")
    yield server
    assert server.stop() == 0, server.log_text(4000)
    server.remove()


def set_lease_ttl(daemon, ms):
    out = subprocess.run([bin_dir() + "/kvpool", "-s", daemon.endpoint, "config", "set",
                          "lease-ttl", str(ms)], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr


def remote(store, monkeypatch):
    """Makes store act as a client on another machine: the node answers its replica lists
    PERMISSION_DENIED, so it holds sessions by a read's lease alone."""
    monkeypatch.setattr(store, "_placements", lambda names, pin: PERMISSION_DENIED)
    return store


# ---- SGLang's probed session methods ----------------------------------------------------

def test_session_methods_before_setup():
    s = MooncakeDistributedStore()
    assert s.batch_get_session_refresh(["a", "b"]) == [INVALID_PARAMS] * 2
    assert s.batch_get_session_prefetch(["a"]) == [INVALID_PARAMS]
    assert s.get_lease_ttl_ms() == 0
    assert s.dfs_prefetch_arena_available() is False
    assert s.batch_get_session_refresh([]) == [] and s.batch_get_session_prefetch([]) == []


def test_dfs_prefetch_arena_is_unavailable(lease_daemon):
    s = make_store(lease_daemon.endpoint)
    try:
        assert s.dfs_prefetch_arena_available() is False
        status = s.dfs_prefetch_arena_status()
        assert isinstance(status, str) and status.startswith("not configured")
    finally:
        s.close()


@pytest.mark.parametrize("path", ["pin", "lease"])
def test_refresh_and_prefetch(lease_daemon, prefix, path, monkeypatch):
    s = make_store(lease_daemon.endpoint)
    other = make_store(lease_daemon.endpoint)
    try:
        if path == "lease":
            remote(s, monkeypatch)
        keys = [prefix + "a", prefix + "b"]
        for k in keys:
            assert s.put(k, b"session bytes") == 0
        none = prefix + "no-session"
        assert s.put(none, b"x") == 0
        statuses, sources = s.batch_get_session_start_with_sources(keys)
        assert statuses == [OK, OK] and sources == ["memory", "memory"]
        # Only keys with a session: refresh renews, prefetch has nothing to fetch.
        assert s.batch_get_session_refresh(keys + [none, "bad\0key"]) == \
            [OK, OK, INVALID_PARAMS, INVALID_KEY]
        assert s.batch_get_session_prefetch(keys + [none, "bad\0key"]) == \
            [OK, OK, INVALID_PARAMS, INVALID_KEY]
        # Refreshed within each lease, the objects stay past several TTLs.
        for _ in range(4):
            time.sleep(LEASE_MS / 2000)
            assert s.batch_get_session_refresh(keys) == [OK, OK]
            assert other.remove(keys[0]) == HAS_LEASE
        # An object removed by force: its refresh says so and ends the session.
        assert other.remove(keys[1], force=True) == OK
        assert s.batch_get_session_refresh(keys) == [OK, NOT_FOUND]
        assert s.batch_get_session_refresh([keys[1]]) == [INVALID_PARAMS]
        assert s.batch_get_session_prefetch([keys[1]]) == [INVALID_PARAMS]
        # Ended: nothing left to refresh, and the object goes once its last lease ends.
        assert s.batch_get_session_end(keys) == OK
        assert s.batch_get_session_refresh(keys) == [INVALID_PARAMS] * 2
        deadline = time.monotonic() + 5
        while other.remove(keys[0]) != OK:
            assert time.monotonic() < deadline, "the ended session still holds the object"
            time.sleep(0.05)
    finally:
        s.close()
        other.close()


def test_lease_session_runs_out_without_refresh(lease_daemon, prefix, monkeypatch):
    """From another machine a session is a read's lease: unrefreshed, it ends with the TTL,
    as get_lease_ttl_ms() tells the linker."""
    s = remote(make_store(lease_daemon.endpoint), monkeypatch)
    try:
        k = prefix + "l"
        assert s.put(k, b"v") == 0
        started = time.monotonic()
        assert s.batch_get_session_start([k]) == [OK]
        ttl = s.get_lease_ttl_ms()
        assert ttl == LEASE_MS
        assert s.remove(k) == HAS_LEASE or time.monotonic() - started >= ttl / 1000
        time.sleep(ttl / 1000 + 0.2)
        assert s.remove(k) == OK
        assert s.batch_get_session_refresh([k]) == [NOT_FOUND]
        assert s.batch_get_session_refresh([k]) == [INVALID_PARAMS]
    finally:
        s.close()


def test_get_lease_ttl_ms_follows_the_node(monkeypatch):
    server = Kvpoold("--segment-size", "16MiB", "--lease-ttl", "500",
                     prefix="kvpool-pytest-ttl-")
    s = make_store(server.endpoint)
    try:
        assert s.get_lease_ttl_ms() == 500
        # A lower TTL is answered at once.
        set_lease_ttl(server, 300)
        assert s.get_lease_ttl_ms() == 300
        # A higher one only once the leases granted under the lower one have run out.
        set_lease_ttl(server, 2000)
        first = time.monotonic()
        assert s.get_lease_ttl_ms() == 300
        while s.get_lease_ttl_ms() != 2000:
            assert time.monotonic() - first < 5, "the higher TTL is never answered"
            time.sleep(0.05)
        assert time.monotonic() - first >= 0.3
        # The node not answering: 0, which a linker cannot use, so it refreshes. (A stopped
        # node's port may be taken by the next one started here: zmq's "*" reuses the
        # lowest free port, and the client reconnects to whatever listens there.)
        def no_reply():
            raise kvpool.Error(-900, "no reply")
        monkeypatch.setattr(s._client, "stats", no_reply)
        assert s.get_lease_ttl_ms() == 0
    finally:
        s.close()
        server.stop()
        server.remove()


# ---- -200 from a full pool, in every put form ---------------------------------------------

@pytest.mark.parametrize("fast_path", [True, False])
def test_full_pool_answers_no_available_handle(prefix, fast_path, monkeypatch):
    class Client(kvpool.Client):
        def __init__(self, *args, **kwargs):
            kwargs["fast_path"] = fast_path
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(mooncake, "Client", Client)
    server = Kvpoold("--segment-size", "1MiB", prefix="kvpool-pytest-full-")
    s = make_store(server.endpoint)
    try:
        pinned = ReplicateConfig()
        pinned.with_hard_pin = True       # never evicted: the pool stays full
        big = np.full(256 << 10, 3, dtype=np.uint8)
        filled = []
        for i in range(16):
            rc = s.put(prefix + "fill%d" % i, big, pinned)
            if rc == NO_SPACE:
                break
            assert rc == OK
            filled.append(prefix + "fill%d" % i)
        assert filled and rc == NO_SPACE
        addr, n = big.ctypes.data, big.nbytes
        k = prefix + "new"
        assert s.put(k, big) == NO_SPACE
        assert s.put_parts(k, big[:1000], big[1000:]) == NO_SPACE
        assert s.put_from(k, addr, n) == NO_SPACE
        assert s.put_batch([k, k + "2"], [big, big]) == NO_SPACE
        assert s.batch_put_from([k, k + "2"], [addr, addr], [n, n]) == [NO_SPACE] * 2
        assert s.batch_put_from_multi_buffers([k], [[addr, addr]], [[n, n]]) == [NO_SPACE]
        assert s.upsert(k, big) == NO_SPACE
        assert s.upsert_from(k, addr, n) == NO_SPACE
        assert s.upsert_parts(k, big) == NO_SPACE
        assert s.upsert_batch([k], [big]) == NO_SPACE
        assert s.batch_upsert_from([k], [addr], [n]) == [NO_SPACE]
        # Mooncake's own convention for this one: the status negated.
        assert s.put_from_with_metadata(k, addr, addr, n, 16) == -NO_SPACE
        # No other answer becomes -200: an existing key is success, a bad one its own code.
        assert s.put(filled[0], big) == OK
        assert s.batch_put_from([filled[0], "bad\0", k], [addr] * 3, [n, n, n]) == \
            [OK, INVALID_KEY, NO_SPACE]
        assert s.put(k, b"") == INVALID_PARAMS
        # Back-pressure passes: room made, the same put goes in.
        assert s.remove(filled[0], force=True) == OK
        assert s.batch_put_from_multi_buffers([k], [[addr]], [[n]]) == [OK]
        assert s.get(k) == big.tobytes()
    finally:
        s.close()
        server.stop()
        server.remove()


# ---- tenant_id: "default" is no tenant ---------------------------------------------------

def test_default_tenant_in_every_form(daemon, prefix):
    addr = host_port(daemon.endpoint)
    stores = []
    try:
        plain = make_store(daemon.endpoint)
        stores.append(plain)
        assert plain.put(prefix + "k", b"default tenant") == 0
        forms = [
            lambda s: s.setup("localhost", "", 0, 16 << 20, "tcp", "", addr,
                              tenant_id="default"),
            lambda s: s.setup("localhost", "", 0, 16 << 20, "tcp", "", addr, None, False, "",
                              "default"),
            lambda s: s.setup({"local_hostname": "localhost", "metadata_server": "P2P",
                               "master_server_address": addr, "tenant_id": "default"}),
            lambda s: s.setup({"local_hostname": "localhost", "metadata_server": "P2P",
                               "master_server_address": addr}),
        ]
        for setup in forms:
            s = MooncakeDistributedStore()
            stores.append(s)
            assert setup(s) == 0
            assert s.get(prefix + "k") == b"default tenant"
        other = make_store(daemon.endpoint, tenant_id="acme")
        stores.append(other)
        assert other.get(prefix + "k") == b"" and other.is_exist(prefix + "k") == 0
        assert other.put(prefix + "k", b"acme's") == 0
        assert plain.get(prefix + "k") == b"default tenant"
        # vLLM's form: tenant_id only when it is not "default".
        config = mooncake.MooncakeStoreConfig.from_dict(
            {"metadata_server": "P2P", "master_server_address": addr, "tenant_id": "default"})
        assert config.setup_kwargs() == {}
        config.tenant_id = "acme"
        assert config.setup_kwargs() == {"tenant_id": "acme"}
        s = MooncakeDistributedStore()
        stores.append(s)
        assert config.setup(s) == 0 and s.get(prefix + "k") == b"acme's"
    finally:
        for s in stores:
            s.close()


# ---- get_into_ranges: Mooncake's answers for lists that disagree ------------------------

def test_get_into_ranges_shapes(daemon, prefix):
    s = make_store(daemon.endpoint)
    try:
        assert s.put(prefix + "v", b"0123456789") == 0
        buf = np.zeros(32, dtype=np.uint8)
        base = buf.ctypes.data
        k = prefix + "v"
        assert s.get_into_ranges([], [], [], [], []) == []
        assert s.get_into_ranges([], [[k]], [[[0]]], [[[0]]], [[[1]]]) == []
        # Top level: buffers and lists of different lengths, nothing read; one row per
        # buffer, per key (one where all_keys has none), per range (one where none).
        assert s.get_into_ranges([base, base], [[k, k]], [[[0, 4]]], [[[0, 4]]],
                                 [[[2, 2]]]) == [[[INVALID_PARAMS] * 2, [INVALID_PARAMS]],
                                                 [[INVALID_PARAMS]]]
        assert not buf.any()
        # A buffer's keys and size lists disagree in number: the whole buffer.
        res = s.get_into_ranges([base], [[k, k, prefix + "missing"]],
                                [[[0, 4], [8], [12]]], [[[0, 4], [2, 3], [0]]],
                                [[[2, 2], [3]]])
        assert res == [[[INVALID_PARAMS] * 2, [INVALID_PARAMS], [INVALID_PARAMS]]]
        assert not buf.any()
        # One key's ranges disagree: that key alone; the rest is read.
        res = s.get_into_ranges([base], [[k, k, prefix + "missing"]],
                                [[[0, 4], [8], [12]]], [[[0, 4], [2, 3], [0]]],
                                [[[2, 2], [3], [1]]])
        assert res == [[[2, 2], [INVALID_PARAMS], [NOT_FOUND]]]
        buf[:] = 0
        res = s.get_into_ranges([base, base + 16], [[k, "bad\0"], [k]],
                                [[[0, 4], [0]], [[0]]], [[[0, 4], [0]], [[5]]],
                                [[[2, 2], [1]], [[3]]])
        assert res == [[[2, 2], [INVALID_KEY]], [[3]]]
        assert buf[:6].tobytes() == b"01\0\x0045" and buf[16:19].tobytes() == b"567"
        # One buffer's keys and offsets disagree, or it is at address 0: that buffer alone.
        res = s.get_into_ranges([base, 0, base], [[k, k], [k], [k]],
                                [[[0]], [[0]], [[20]]], [[[0]], [[0]], [[9]]],
                                [[[1]], [[1]], [[1]]])
        assert res == [[[INVALID_PARAMS], [INVALID_PARAMS]], [[INVALID_PARAMS]], [[1]]]
        assert buf[20] == ord("9")
        # A registered buffer bounds its ranges.
        assert s.register_buffer(base, 32) == 0
        assert s.get_into_ranges([base], [[k]], [[[28, 0]]], [[[0, 0]]], [[[8, 4]]]) == \
            [[[INVALID_PARAMS, 4]]]
        # Types are checked as pybind11 does.
        with pytest.raises(TypeError):
            s.get_into_ranges([base], "abc", [[[0]]], [[[0]]], [[[1]]])
        with pytest.raises(TypeError):
            s.get_into_ranges([base], [[k]], [[[0.5]]], [[[0]]], [[[1]]])
    finally:
        s.close()
    closed = MooncakeDistributedStore()
    assert closed.get_into_ranges([1], [["a", "b"]], [[[0], [0, 1]]], [[[0], [0, 1]]],
                                  [[[1], [1, 1]]]) == [[[INVALID_PARAMS],
                                                        [INVALID_PARAMS] * 2]]
