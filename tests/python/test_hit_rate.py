"""The hit rate (kvpool_get_hits_total / kvpool_gets_total, STATS gets and get_hits) against
workloads of known hits and misses, on every path a get takes (docs/metrics.md, "Gets and
the hit rate"):

- same machine, read index on: libkvpool reads from the index and, for what it does not
  hold, through a pinned replica list; it reports its hits and misses with its TOUCHes;
- same machine, read index off: every get through a pinned replica list;
- tcp only (fast_path=False): GETs, counted by the node;
- an old client's TOUCH (reads alone) is counted as before; the new fields add up;
- a cluster node: reads of keys the other node holds (relayed, or redirected for large
  values) are hits, counted once across the cluster; misses are misses; the holder does
  not count another node's reads of its values.

Each workload reads every stored key once and asks for absent keys, through the Python
client's get, get_batch and get_batch_into; the node's counters must move by exactly that,
and the rate must match the workload's within 1%.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import ctypes
import zlib

import pytest

import kvpool
from kvpool import _native
from kvpool_daemon import Kvpoold, wait_for  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402

OK = 0
KiB = 1 << 10


def value_of(key, size):
    return (key.encode() * (size // len(key) + 1))[:size]


def counters(raw):
    s = raw.stats()
    return {"gets": s.gets, "hits": s.get_hits, "index": s.index_gets, "client": s.client_gets}


def delta(after, before):
    return {name: after[name] - before[name] for name in after}


def store(writer, prefix, count, sizes=(100, 3000, 40 * KiB)):
    """Puts count keys (sizes in turn) through a kvpool.Client; returns them."""
    keys = ["%s-hit-%d" % (prefix, i) for i in range(count)]
    for i, key in enumerate(keys):
        writer.put(key, value_of(key, sizes[i % len(sizes)]))
    return keys


def read(client, keys, absent):
    """Reads every key once and asks for every absent key once, a third each through get,
    get_batch and get_batch_into; checks what came back. Returns (gets, hits)."""
    present = {key: True for key in keys}
    present.update({key: False for key in absent})
    names = list(present)
    names.sort(key=lambda k: zlib.crc32(k.encode()))  # hits and misses mixed in each batch
    thirds = [names[0::3], names[1::3], names[2::3]]
    for key in thirds[0]:
        if present[key]:
            value = client.get(key)
            assert value == value_of(key, len(value)), key
        else:
            with pytest.raises(kvpool.ObjectNotFoundError):
                client.get(key)
    for start in range(0, len(thirds[1]), 16):
        batch = thirds[1][start:start + 16]
        values = client.get_batch(batch)
        for key, value in zip(batch, values):
            assert (value is not None) == present[key], key
            if value is not None:
                assert value == value_of(key, len(value)), key
    for start in range(0, len(thirds[2]), 16):
        batch = thirds[2][start:start + 16]
        buffers = [bytearray(256 * KiB) for _ in batch]
        results = client.get_batch_into(batch, buffers)
        for key, result, buffer in zip(batch, results, buffers):
            if present[key]:
                assert result > 0 and bytes(buffer[:result]) == value_of(key, result), key
            else:
                assert result == int(kvpool.Status.OBJECT_NOT_FOUND), (key, result)
    return len(names), len(keys)


def check_rate(moved, gets, hits, where):
    assert moved["gets"] == gets and moved["hits"] == hits, (where, moved, gets, hits)
    rate = moved["hits"] / moved["gets"]
    assert abs(rate - hits / gets) <= 0.01, (where, rate, hits / gets)


@pytest.fixture(scope="module")
def daemon():
    d = Kvpoold("--segment-size", "64MiB", prefix="kvpool-hits-test-")
    yield d
    alive = d.alive()
    rc = d.stop()
    log = d.log_text(4000)
    d.remove()
    assert alive and rc == 0, log


@pytest.fixture(scope="module")
def raw(daemon):
    r = Raw(daemon.endpoint)
    yield r
    r.close()


def test_same_machine_index(daemon, raw):
    client = kvpool.Client(daemon.endpoint)
    assert client.fast_path, "the test needs libkvpool's same-machine path"
    keys = store(client, "idx", 300)
    absent = ["idx-miss-%d" % i for i in range(200)]
    before = counters(raw)
    gets, hits = read(client, keys, absent)
    client.close()  # reports the last gets, and waits for the node to have them
    moved = delta(counters(raw), before)
    check_rate(moved, gets, hits, "same machine, index")
    assert moved["client"] == gets, moved   # every one read from shared memory
    assert moved["index"] > 0, moved        # ... the index served some


def test_same_machine_replica_lists(daemon, raw):
    client = kvpool.Client(daemon.endpoint)
    assert client.fast_path
    set_index = _native.lib.kvpool_set_index
    set_index.restype, set_index.argtypes = ctypes.c_bool, [ctypes.c_void_p, ctypes.c_bool]
    for handle in client._idle:
        assert not set_index(handle, False)
    keys = store(client, "list", 300)
    absent = ["list-miss-%d" % i for i in range(200)]
    before = counters(raw)
    gets, hits = read(client, keys, absent)
    client.close()
    moved = delta(counters(raw), before)
    check_rate(moved, gets, hits, "same machine, replica lists")
    assert moved["client"] == gets and moved["index"] == 0, moved


def test_tcp_only(daemon, raw):
    client = kvpool.Client(daemon.endpoint, fast_path=False)
    assert not client.fast_path
    keys = store(client, "tcp", 300)
    absent = ["tcp-miss-%d" % i for i in range(200)]
    before = counters(raw)
    gets, hits = read(client, keys, absent)
    client.close()
    moved = delta(counters(raw), before)
    check_rate(moved, gets, hits, "tcp")
    assert moved["client"] == 0, moved


def test_touch_reports(daemon, raw):
    # A client from before listed_reads and read_misses: its index reads count as before.
    before = counters(raw)
    reply, _ = raw.call(pb.TOUCH, reads=7)
    assert reply.status == OK
    moved = delta(counters(raw), before)
    assert moved == {"gets": 7, "hits": 7, "index": 7, "client": 7}, moved
    before = counters(raw)
    reply, _ = raw.call(pb.TOUCH, reads=2, listed_reads=3, read_misses=5)
    assert reply.status == OK
    moved = delta(counters(raw), before)
    assert moved == {"gets": 10, "hits": 5, "index": 2, "client": 10}, moved
    # Counts no client can have made since its last TOUCH are refused, not added: the stats
    # cannot be wrapped.
    for field in ("reads", "listed_reads", "read_misses"):
        before = counters(raw)
        reply, _ = raw.call(pb.TOUCH, **{field: (1 << 20) + 1})
        assert reply.status == -600 and "per TOUCH" in reply.error, (field, reply)
        assert delta(counters(raw), before) == {"gets": 0, "hits": 0, "index": 0, "client": 0}


# ---- a cluster ------------------------------------------------------------------------------

HEARTBEAT_MS = 200


@pytest.fixture
def cluster():
    master = Kvpoold("--role", "master", "--node-ttl", "2000", "--master", "tcp://127.0.0.1:*",
                     prefix="kvpool-hits-master-")
    nodes = []
    try:
        # Node A keeps the machine's boot id (same-machine clients take the fast path there);
        # node B says it is another host.
        for host in (None, "hB"):
            nodes.append(Kvpoold("--role", "node", "--master", master.endpoint,
                                 "--segment-size", "64MiB",
                                 "--heartbeat-interval", str(HEARTBEAT_MS),
                                 *(("--host-id", host) if host else ()),
                                 prefix="kvpool-hits-node-"))

        def live():
            reply, _ = Raw(nodes[0].endpoint).call(pb.NODES)
            return reply.status == OK and sum(n.alive and n.capacity > 0
                                              for n in reply.nodes) == 2
        assert wait_for(live, 10)
        yield master, nodes
    finally:
        logs = [d.log_text(3000) for d in nodes + [master]]
        alive = [d.alive() for d in nodes + [master]]
        statuses = [d.stop() for d in nodes + [master]]
        for d in nodes + [master]:
            d.remove()
        assert all(alive) and statuses == [0] * len(statuses), logs


def held_by_b(raw_a, keys):
    """The keys that only node B holds."""
    out = []
    for key in keys:
        reply, _ = raw_a.call(pb.LOCATE, [key])
        assert reply.status == OK and reply.statuses[0] == OK, key
        hosts = [reply.nodes[i].host_id for i in reply.locations[0].nodes]
        if hosts == ["hB"]:
            out.append(key)
    return out


@pytest.mark.parametrize("fast_path", [True, False], ids=["same-machine", "tcp"])
def test_cluster_node(cluster, fast_path):
    _, (a, b) = cluster
    raw_a, raw_b = Raw(a.endpoint), Raw(b.endpoint)
    try:
        # Put through B with sizes on both sides of the 64 KiB redirect threshold: the
        # master places each key on A or B.
        writer = kvpool.Client(b.endpoint, fast_path=False)
        keys = store(writer, "cl", 120, sizes=(100, 3000, 40 * KiB, 200 * KiB))
        writer.close()
        remote = held_by_b(raw_a, keys)
        assert len(remote) >= 20, "placement put too few keys on B alone: %d" % len(remote)
        absent = ["cl-miss-%d" % i for i in range(80)]
        reader = kvpool.Client(a.endpoint, fast_path=fast_path)
        assert reader.fast_path == fast_path
        before_a, before_b = counters(raw_a), counters(raw_b)
        gets, hits = read(reader, keys, absent)
        reader.close()
        moved_a = delta(counters(raw_a), before_a)
        moved_b = delta(counters(raw_b), before_b)
        # Counted once across the cluster: by A, or by B for the values A redirected.
        both = {name: moved_a[name] + moved_b[name] for name in moved_a}
        check_rate(both, gets, hits, "cluster")
        # B counted no more than the large values A redirected its clients to it for.
        large = sum(1 for key in remote if keys.index(key) % 4 == 3)
        assert moved_b["gets"] <= large and moved_b["gets"] == moved_b["hits"], (moved_b, large)
        # A alone: every get it did not redirect, and only misses that were misses.
        assert moved_a["gets"] - moved_a["hits"] == gets - hits, moved_a
    finally:
        raw_a.close()
        raw_b.close()
