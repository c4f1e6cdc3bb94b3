"""The process's hot cache (issue 32, item 5: libkvpool's kvpool_set_hot_cache, Python's
Client(hot_cache_bytes=...), the Mooncake drop-in's MC_STORE_LOCAL_HOT_* variables), against
a real cluster whose nodes say they are on other machines: a master and two nodes with their
own --host-id, so the client on this machine has no node of its own (no fast path; it is
switched off too). Values are put through node B and read through node A.

- Bytes are the same with the cache on and off, over a mixed workload: every get shape,
  ranges, values relayed by A and values read from B after a REDIRECT.
- Admission: a key's first read is not kept; after `admit` reads it is served from memory:
  node A answers EXISTs for it and sends no more value bytes nor counts a get.
- LRU: a cache too small for every key lets go of the least recently used.
- Never stale: a kept key upserted through node B reads back new; removed through B it is
  OBJECT_NOT_FOUND.
- The Mooncake variables turn it on with Mooncake's meaning (size, largest value,
  admission threshold); on the node's machine they leave it off and say why.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import logging
import os

import pytest

import kvpool
from kvpool_test_pb import pb  # noqa: E402
from test_cluster import Cluster, value_of  # noqa: E402

OK = 0
KiB = 1 << 10


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(hosts=("hA", "hB"))
    yield c
    logs = c.logs()
    alive = [d.alive() for d in c.nodes + [c.master]]
    statuses = [d.stop() for d in c.nodes + [c.master]]
    c.close()
    assert all(alive), (alive, logs)
    assert statuses == [0] * len(statuses), logs


def put_on_b(cluster, key, value):
    """Puts key through node B (it lands on either node; the client's reads go through A)."""
    assert cluster.raw(1).put(key, value) == OK


def upsert_on_b(cluster, key, value):
    reply, _ = cluster.raw(1).call(pb.UPSERT, [key], [value])
    assert (reply.status or reply.statuses[0]) == OK


def node_a(cluster):
    """Node A's figures: (gets, value bytes sent, EXIST requests answered)."""
    reply, _ = cluster.raw(0).call(pb.STATS)
    exists = sum(o.requests for o in reply.op_stats if o.op == pb.EXIST)
    return reply.stats.gets, reply.stats.value_bytes_out, exists


def client_of(cluster, **hot):
    return kvpool.Client(cluster.nodes[0].endpoint, fast_path=False, **hot)


def test_bytes_are_the_same_with_the_cache_on_and_off(cluster):
    sizes = [0, 1, 100, 4 * KiB, 63 * KiB] + [200 * KiB] * 6 + [1 << 20] * 2
    keys = ["mixed-%d" % i for i in range(len(sizes))]
    for key, size in zip(keys, sizes):
        put_on_b(cluster, key, value_of(key, size))
    # Large values held by B alone come from B after a REDIRECT (node A relays the rest).
    holders = [cluster.locate(k) for k in keys]
    assert ["hB"] in holders[5:] and ["hA"] in holders[5:], holders

    def workload(client):
        out = []
        for _ in range(3):
            out.append([client.get(k) for k in keys])
            out.append(client.get_batch(keys + ["mixed-missing"]))
            into = [bytearray(s + 5) for s in sizes]
            out.append((list(client.get_batch_into(keys, into)), [bytes(b) for b in into]))
            one = bytearray(sizes[-1])
            out.append((client.get_into(keys[-1], one), bytes(one)))
            offsets = [s // 3 for s in sizes]
            ranges = [bytearray(max(1, s // 2)) for s in sizes]
            out.append((list(client.get_ranges_into(keys, offsets, ranges)),
                        [bytes(b) for b in ranges]))
            past = bytearray(8)
            out.append(client.get_ranges_into([keys[2]], [sizes[2] + 1], [past]))
            out.append([bytes(h) for h in client.get_batch_buffer(keys)]
                       if hasattr(client, "get_batch_buffer") else None)
        return out

    with client_of(cluster) as plain:
        expected = workload(plain)
        assert plain.hot_cache_stats()["capacity"] == 0
    assert expected[0] == [value_of(k, s) for k, s in zip(keys, sizes)]
    with client_of(cluster, hot_cache_bytes=64 << 20, hot_cache_admit=1) as cached:
        assert not cached.fast_path
        got = workload(cached)
        stats = cached.hot_cache_stats()
    assert got == expected
    # Every value was kept by its first read, and the later rounds came from memory.
    assert stats["admissions"] == len(keys)
    assert stats["hits"] > 2 * len(keys)
    assert stats["invalidations"] == 0
    assert stats["bytes"] == sum(sizes)


def test_a_key_is_kept_after_admit_reads_and_then_costs_an_exist(cluster):
    keys = ["admit-%d" % i for i in range(4)]
    for key in keys:
        put_on_b(cluster, key, value_of(key, 4 * KiB))
    with client_of(cluster, hot_cache_bytes=1 << 20, hot_cache_admit=3) as client:
        for read in range(1, 4):
            before = node_a(cluster)
            assert client.get_batch(keys) == [value_of(k, 4 * KiB) for k in keys]
            after = node_a(cluster)
            # Reads 1 to 3 fetch the bytes through node A; the third keeps them.
            assert after[0] - before[0] == len(keys), read
            assert after[1] - before[1] >= len(keys) * 4 * KiB, read
            assert client.hot_cache_stats()["admissions"] == (len(keys) if read == 3 else 0)
        for _ in range(5):
            before = node_a(cluster)
            assert client.get_batch(keys) == [value_of(k, 4 * KiB) for k in keys]
            assert client.get(keys[0]) == value_of(keys[0], 4 * KiB)
            after = node_a(cluster)
            # From memory: no get, no value byte; one EXIST a call, for all its keys.
            assert after[0] == before[0] and after[1] == before[1]
            assert after[2] - before[2] == 2
        stats = client.hot_cache_stats()
        assert stats["hits"] == 5 * (len(keys) + 1)
        assert stats["misses"] == 3 * len(keys)
        assert stats["entries"] == len(keys) and stats["bytes"] == len(keys) * 4 * KiB
        everything = client.stats()
        assert everything["client_hot_cache_hits"] == stats["hits"]
        assert "hot_cache_hits" in everything  # the node's own, unchanged


def test_a_cache_too_small_lets_go_of_the_least_recently_used(cluster):
    keys = ["lru-%d" % i for i in range(4)]
    for key in keys:
        put_on_b(cluster, key, value_of(key, 4 * KiB))
    with client_of(cluster, hot_cache_bytes=3 * 4 * KiB, hot_cache_admit=1) as client:
        for key in keys[:3]:
            assert client.get(key) == value_of(key, 4 * KiB)
        assert client.get(keys[0]) == value_of(keys[0], 4 * KiB)  # lru-0 is used again
        assert client.get(keys[3]) == value_of(keys[3], 4 * KiB)  # evicts lru-1
        stats = client.hot_cache_stats()
        assert stats["evictions"] == 1 and stats["entries"] == 3
        for key in (keys[0], keys[2], keys[3]):
            before = node_a(cluster)
            assert client.get(key) == value_of(key, 4 * KiB)
            assert node_a(cluster)[0] == before[0], key
        before = node_a(cluster)
        misses = client.hot_cache_stats()["misses"]
        assert client.get(keys[1]) == value_of(keys[1], 4 * KiB)
        assert node_a(cluster)[0] == before[0] + 1
        assert client.hot_cache_stats()["misses"] == misses + 1


def test_a_kept_key_is_never_served_stale(cluster):
    key, big = "stale", "stale-big"
    put_on_b(cluster, key, b"old" * 1000)
    put_on_b(cluster, big, value_of(big, 300 * KiB))
    with client_of(cluster, hot_cache_bytes=8 << 20, hot_cache_admit=1) as client:
        assert client.get(key) == b"old" * 1000
        assert client.get(big) == value_of(big, 300 * KiB)
        assert client.get(key) == b"old" * 1000
        assert client.hot_cache_stats()["hits"] == 1
        upsert_on_b(cluster, key, b"new" * 999)
        upsert_on_b(cluster, big, b"Big" * 100000)
        assert client.get(key) == b"new" * 999
        into = bytearray(300 * KiB)
        assert client.get_into(big, into) == 300000
        assert bytes(into[:300000]) == b"Big" * 100000
        stats = client.hot_cache_stats()
        assert stats["invalidations"] == 2
        # The new versions are kept (admit 1) and served.
        assert client.get(key) == b"new" * 999
        assert client.hot_cache_stats()["hits"] == stats["hits"] + 1
        assert cluster.raw(1).remove(key) == OK
        with pytest.raises(kvpool.ObjectNotFoundError):
            client.get(key)
        assert client.get_batch([key, big])[0] is None
        buf = bytearray(10)
        assert client.get_ranges_into([key], [0], [buf]) == [int(kvpool.Status.OBJECT_NOT_FOUND)]
        assert client.hot_cache_stats()["invalidations"] == 3


def test_mooncake_variables_turn_it_on_with_their_meaning(cluster, monkeypatch, caplog):
    from kvpool.mooncake import MooncakeDistributedStore
    small, large = "mc-small", "mc-large"
    put_on_b(cluster, small, value_of(small, 8 * KiB))
    put_on_b(cluster, large, value_of(large, 64 * KiB))
    monkeypatch.setenv("MC_STORE_LOCAL_HOT_CACHE_SIZE", str(4 << 20))
    monkeypatch.setenv("MC_STORE_LOCAL_HOT_BLOCK_SIZE", str(16 * KiB))
    monkeypatch.setenv("MC_STORE_LOCAL_HOT_ADMISSION_THRESHOLD", "3")
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "", 0, 16 << 20, "tcp", "", cluster.nodes[0].endpoint) == 0
    try:
        for _ in range(5):
            assert store.get(small) == value_of(small, 8 * KiB)
            assert store.get(large) == value_of(large, 64 * KiB)
        stats = store._client.hot_cache_stats()
        # Block size: the largest value kept; threshold 3: kept by the third read.
        assert stats["capacity"] == 4 << 20
        assert stats["admissions"] == 1 and stats["bytes"] == 8 * KiB
        assert stats["hits"] == 2 and stats["misses"] == 3 + 5
    finally:
        store.close()
    # A bad size leaves it off, as in Mooncake.
    monkeypatch.setenv("MC_STORE_LOCAL_HOT_CACHE_SIZE", "8gb")
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "", 0, 16 << 20, "tcp", "", cluster.nodes[0].endpoint) == 0
    try:
        assert store._client.hot_cache_stats()["capacity"] == 0
    finally:
        store.close()


def test_mooncake_variables_leave_it_to_the_node_on_its_machine(monkeypatch, caplog):
    from kvpool_daemon import Kvpoold
    from kvpool.mooncake import MooncakeDistributedStore
    import kvpool.mooncake as mooncake
    monkeypatch.setattr(mooncake, "_hot_cache_said", False)
    monkeypatch.setenv("MC_STORE_LOCAL_HOT_CACHE_SIZE", str(4 << 20))
    node = Kvpoold("--segment-size", "64MiB")
    try:
        store = MooncakeDistributedStore()
        with caplog.at_level(logging.INFO, logger="kvpool.mooncake"):
            assert store.setup("localhost", "", 0, 16 << 20, "tcp", "", node.endpoint) == 0
        try:
            assert store._client.fast_path
            assert store._client.hot_cache_stats()["capacity"] == 0
            assert "host hot cache" in caplog.text
            assert store.put("k", b"v" * 100) == 0
            for _ in range(3):
                assert store.get("k") == b"v" * 100
            assert store._client.hot_cache_stats()["hits"] == 0
        finally:
            store.close()
        assert node.stop() == 0
    finally:
        node.remove()


def test_threads_share_one_cache_and_see_every_write(cluster):
    import threading
    keys = ["threads-%d" % i for i in range(16)]
    for key in keys:
        put_on_b(cluster, key, value_of(key, 4 * KiB))
    errors = []
    with client_of(cluster, hot_cache_bytes=1 << 20, hot_cache_admit=2) as client:
        def reader():
            try:
                for _ in range(40):
                    values = client.get_batch(keys)
                    for key, value in zip(keys, values):
                        # A value read is the first one or the upserted one, never a mix.
                        assert value in (value_of(key, 4 * KiB), b"up-" + key.encode()), key
            except Exception as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)
        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        for key in keys[:4]:
            upsert_on_b(cluster, key, b"up-" + key.encode())
        for t in threads:
            t.join()
        assert not errors, errors
        # Once the upserts were acknowledged, every thread reads the new values.
        assert client.get_batch(keys[:4]) == [b"up-" + k.encode() for k in keys[:4]]
        stats = client.hot_cache_stats()
        assert stats["hits"] > 0 and stats["entries"] <= len(keys)
        # Several connections (one per thread at a time), one cache: each key kept once.
        assert stats["bytes"] <= len(keys) * 4 * KiB


def test_one_node_of_its_own_role_all_validates_the_same_way():
    # A store of one node (role all) on "another machine": its own version numbers.
    from kvpool_daemon import Kvpoold
    node = Kvpoold("--segment-size", "64MiB", "--host-id", "elsewhere")
    try:
        with kvpool.Client(node.endpoint, hot_cache_bytes=1 << 20, hot_cache_admit=1) as client:
            assert not client.fast_path
            client.put("solo", b"one" * 100)
            assert client.get("solo") == b"one" * 100
            assert client.get("solo") == b"one" * 100
            assert client.hot_cache_stats()["hits"] == 1
            client.upsert("solo", b"two" * 100)
            assert client.get("solo") == b"two" * 100
            client.remove("solo", force=True)
            with pytest.raises(kvpool.ObjectNotFoundError):
                client.get("solo")
            assert client.hot_cache_stats()["invalidations"] == 2
        assert node.stop() == 0
    finally:
        node.remove()
