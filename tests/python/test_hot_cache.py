"""Versions and the host hot cache (issue 32): a master and three nodes on loopback, each its
own kvpoold process. Node A keeps this machine's boot id as its host id (so a libkvpool
client here reads A's cache copies through shared memory, as on a real host); nodes B and C
say they are on machines of their own (--host-id). The master places each key on the node it
was written through (--placement local-first): keys written through B live on B alone.

- Every write gets a version, the same wherever the key is read, a new one per upsert.
- Cache on (A) and off (C) return identical bytes over a mixed workload (every size, stripes,
  ranges, upserts, removes).
- Admission after --hot-cache-admit reads; LRU order; copies go first under memory pressure
  and never push out a replica.
- A hot key read through A stops touching its holder (B's bytes out stand still) and the
  master (A's master requests stand still); a repeated remote get with the cache off costs
  no master request either (the location cache).
- Never stale: upserts and removes through B racing reads through A (100,000 reads, none of
  an older value than one acknowledged before the read began); a cache holder frozen with
  SIGSTOP while its key is removed (the remove waits for its lease, and it serves nothing
  old when it wakes); a cache holder cut off in a network namespace of its own (as root);
  regex remove, remove-all and reset.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import os
import signal
import struct
import threading
import time

import pytest

import kvpool
from kvpool_daemon import Kvpoold, wait_for  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402
from test_cluster import value_of  # noqa: E402

OK = 0
OBJECT_NOT_FOUND = -704
KiB, MiB = 1 << 10, 1 << 20
HEARTBEAT_MS = 200
TIMEOUT_MS = 1000


class HotCluster:
    """A master and nodes a (this machine's host id), b and c (hosts of their own)."""

    def __init__(self, a=(), b=(), c=()):
        self.master = Kvpoold("--role", "master", "--node-ttl", "3000", "--placement",
                              "local-first", "--master", "tcp://127.0.0.1:*",
                              prefix="kvpool-master-")
        self.nodes = {}
        try:
            for name, extra in (("a", a), ("b", b), ("c", c)):
                host = () if name == "a" else ("--host-id", "h" + name)
                self.nodes[name] = Kvpoold(
                    "--role", "node", "--master", self.master.endpoint, "--node-id",
                    "node-" + name, *host, "--segment-size", "64MiB", "--heartbeat-interval",
                    str(HEARTBEAT_MS), "--cluster-timeout", str(TIMEOUT_MS), "--stripe-size",
                    "1MiB", *extra, prefix="kvpool-node-")
            assert wait_for(lambda: self.live() == 3, 10), self.logs()
        except BaseException:
            self.close()
            raise

    def raw(self, name, timeout_ms=10000):
        return Raw(self.nodes[name].endpoint, timeout_ms=timeout_ms)

    def live(self):
        reply, _ = self.raw("b").call(pb.NODES)
        return sum(1 for n in reply.nodes if n.alive) if reply.status == OK else -1

    def stats(self, name):
        raw = self.raw(name)
        try:
            return raw.stats()
        finally:
            raw.close()

    def logs(self):
        return "\n".join("--- %s\n%s" % (d.dir, d.log_text(3000))
                         for d in [self.master] + list(self.nodes.values()))

    def stop(self):
        """Stops every daemon (SIGTERM); each must exit 0 (and, built with a sanitizer,
        report nothing)."""
        daemons = list(self.nodes.values()) + [self.master]
        logs = [d.log_text(6000) for d in daemons]
        statuses = [d.stop() for d in daemons]
        assert statuses == [0] * len(statuses), (statuses, logs)

    def close(self):
        for d in list(self.nodes.values()) + [self.master]:
            d.remove()


@pytest.fixture
def cluster():
    c = HotCluster(c=("--hot-cache-size", "0"))
    yield c
    alive = [d.alive() for d in list(c.nodes.values()) + [c.master]]
    logs = c.logs()
    try:
        assert all(alive), (alive, logs)
        c.stop()
    finally:
        c.close()


def admitted(c, name, count, seconds=5):
    """Waits until node name has made count cache copies (they are made after the read that
    admits them)."""
    return wait_for(lambda: c.stats(name).hot_cache_admissions >= count, seconds)


def test_versions_are_the_same_everywhere_and_new_for_each_write(cluster):
    b = cluster.raw("b")
    reply, _ = b.call(pb.PUT, ["v1", "v2"], [b"one", b"two"])
    assert list(reply.statuses) == [OK, OK] and all(reply.versions)
    first = list(reply.versions)
    assert first[0] != first[1]
    for name in "abc":
        reply, frames = cluster.raw(name).call(pb.GET, ["v1", "v2"])
        assert list(reply.versions) == first and frames == [b"one", b"two"]
    reply, _ = cluster.raw("c").call(pb.LOCATE, ["v1"])
    assert list(reply.versions) == first[:1]
    reply, _ = cluster.raw("a").call(pb.UPSERT, ["v1"], [b"uno"])
    assert reply.statuses[0] == OK and reply.versions[0] not in first
    newer = reply.versions[0]
    for name in "abc":
        reply, _ = cluster.raw(name).call(pb.GET, ["v1"])
        assert reply.versions[0] == newer
    # A read of one version: the old one is gone, the new one is there.
    reply, _ = cluster.raw("c").call(pb.EXIST, ["v1", "v1"], versions=[first[0], newer])
    assert list(reply.statuses) == [OBJECT_NOT_FOUND, OK]
    # Clients may not name the version of what they write.
    reply, _ = b.call(pb.UPSERT, ["v2"], [b"x"], versions=[7])
    assert reply.status == -600 and "versions" in reply.error
    with kvpool.Client(cluster.nodes["c"].endpoint) as client:
        assert client.get_with_version("v1") == (b"uno", newer)


def test_cache_on_and_off_return_identical_bytes(cluster):
    # Values of every size through B (they live on B); read through A (cache on) and C
    # (cache off), whole and in ranges, four times each, then upserted and removed.
    sizes = [0, 1, 100, 64 * KiB - 1, 64 * KiB, 300 * KiB, MiB, 3 * MiB + 17]
    keys = ["mix-%d" % s for s in sizes]
    b = cluster.raw("b")
    for key, size in zip(keys, sizes):
        assert b.put(key, value_of(key, size)) == OK
    expected = {k: value_of(k, s) for k, s in zip(keys, sizes)}

    def check_all():
        for name in "ac":
            raw = cluster.raw(name)
            for _ in range(4):
                reply, frames = raw.call(pb.GET, keys)
                got = {k: f for k, f, s in zip(keys, frames, reply.statuses) if s == OK}
                assert got == {k: v for k, v in expected.items() if v is not None}, (name, str(list(reply.statuses)), reply.error)
                for k, s in zip(keys, reply.statuses):
                    assert (s == OK) == (expected[k] is not None), (name, k, s)
                live = [k for k in keys if expected[k] is not None and len(expected[k]) > 10]
                offsets = [len(expected[k]) // 3 for k in live]
                lengths = [len(expected[k]) // 2 for k in live]
                reply, frames = raw.call(pb.GET, live, offsets=offsets, lengths=lengths)
                assert frames == [expected[k][o:o + n] for k, o, n in zip(live, offsets, lengths)]
            raw.close()
        # libkvpool on this machine: A's copies through shared memory, the rest in one hop.
        with kvpool.Client(cluster.nodes["a"].endpoint) as client:
            for _ in range(3):
                for k in keys:
                    if expected[k] is None:
                        with pytest.raises(KeyError):
                            client.get(k)
                    else:
                        assert client.get(k) == expected[k], k

    check_all()
    assert admitted(cluster, "a", 4)
    check_all()
    stats = cluster.stats("a")
    assert stats.hot_cache_hits > 0 and stats.hot_cache_bytes > 0, stats
    assert cluster.stats("c").hot_cache_hits == 0
    # Upserts (another size) and removes through B: read the same through both nodes.
    for key in keys[::2]:
        expected[key] = value_of(key + "-2", 200 * KiB)
        reply, _ = b.call(pb.UPSERT, [key], [expected[key]])
        assert reply.statuses[0] == OK
    for key in keys[1::3]:
        assert b.remove(key, force=True) == OK
        expected[key] = None
    check_all()
    assert cluster.stats("a").hot_cache_invalidations > 0


def test_admission_and_lru_order():
    c = HotCluster(a=("--hot-cache-admit", "3", "--hot-cache-size", "1MiB"))
    try:
        b, a = c.raw("b"), c.raw("a")
        keys = ["lru-%d" % i for i in range(4)]
        for key in keys:
            assert b.put(key, value_of(key, 300 * KiB)) == OK

        def read(key):
            assert a.get(key) == (OK, value_of(key, 300 * KiB))

        # Two reads do not admit; the third does.
        read(keys[0])
        read(keys[0])
        time.sleep(0.3)
        assert c.stats("a").hot_cache_admissions == 0
        read(keys[0])
        assert admitted(c, "a", 1)
        for i, key in enumerate(keys[1:3]):
            for _ in range(3):
                read(key)
            assert admitted(c, "a", 2 + i)
        # 1 MiB holds three: k0 read last is the most recent, so k1 goes for k3.
        before = c.stats("a")
        read(keys[0])
        assert c.stats("a").hot_cache_hits == before.hot_cache_hits + 1
        for _ in range(3):
            read(keys[3])
        assert admitted(c, "a", 4)
        after = c.stats("a")
        assert after.hot_cache_evictions == 1 and after.hot_cache_bytes == 3 * 300 * KiB, after
        for key, hit in ((keys[0], True), (keys[2], True), (keys[3], True), (keys[1], False)):
            hits = c.stats("a").hot_cache_hits
            read(key)
            assert (c.stats("a").hot_cache_hits == hits + 1) == hit, key
        c.stop()
    finally:
        c.close()


def test_a_hot_key_stops_touching_its_holder_and_the_master(cluster):
    b = cluster.raw("b")
    assert b.put("hot", value_of("hot", 100 * KiB)) == OK
    assert b.put("warm", value_of("warm", 100 * KiB)) == OK
    a, c = cluster.raw("a"), cluster.raw("c")
    for _ in range(2):
        assert a.get("hot") == (OK, value_of("hot", 100 * KiB))
        assert c.get("warm") == (OK, value_of("warm", 100 * KiB))
    assert admitted(cluster, "a", 1)
    time.sleep(0.2)
    holder, at_a, at_c = cluster.stats("b"), cluster.stats("a"), cluster.stats("c")
    for _ in range(200):
        assert a.get("hot") == (OK, value_of("hot", 100 * KiB))
        assert c.get("warm") == (OK, value_of("warm", 100 * KiB))
    after_b, after_a, after_c = cluster.stats("b"), cluster.stats("a"), cluster.stats("c")
    # A serves "hot" from its copy: B sent nothing for it; A asked the master nothing.
    assert after_a.hot_cache_hits - at_a.hot_cache_hits == 200
    assert after_a.master_requests == at_a.master_requests
    # C has no cache: each get reads B, but straight from where it knows the key is.
    assert after_c.master_requests == at_c.master_requests
    assert after_c.location_hits - at_c.location_hits == 200
    assert after_b.value_bytes_out - holder.value_bytes_out == 200 * 100 * KiB


def test_upserts_and_removes_racing_reads_are_never_stale():
    # The writer, through B, writes each key's values in order (a counter in the value),
    # removing a key now and then; it notes when each write was acknowledged. The reader,
    # libkvpool on A's machine (A's copies through shared memory), checks every value it
    # gets against the writes acknowledged before its get began: never an older one.
    c = HotCluster()
    try:
        keys = ["race-%d" % i for i in range(4)]
        acked = {k: [] for k in keys}  # (ack time, counter or None for a remove), in order
        lock = threading.Lock()
        stop = threading.Event()
        errors = []

        def value(key, n):
            return struct.pack("<Q", n) + key.encode() * 8

        def writer():
            raw = c.raw("b")
            n = 0
            try:
                while not stop.is_set():
                    n += 1
                    key = keys[n % len(keys)]
                    if n % 17 == 0:
                        status = raw.remove(key, force=True)
                        done = None
                    else:
                        reply, _ = raw.call(pb.UPSERT, [key], [value(key, n)])
                        status = reply.status or reply.statuses[0]
                        done = n
                    if status not in (OK, OBJECT_NOT_FOUND):
                        errors.append(("write", key, status))
                        return
                    with lock:
                        acked[key].append((time.monotonic(), done))
                    time.sleep(0.02)
            except Exception as e:  # noqa: BLE001
                errors.append(("writer", repr(e)))
            finally:
                raw.close()

        for key in keys:
            reply, _ = c.raw("b").call(pb.UPSERT, [key], [value(key, 0)])
            acked[key].append((time.monotonic(), 0))
        thread = threading.Thread(target=writer)
        thread.start()
        reads = stale = found = 0
        examples = []
        try:
            with kvpool.Client(c.nodes["a"].endpoint) as client:
                deadline = time.monotonic() + 120
                while reads < 100000 and time.monotonic() < deadline and not errors:
                    key = keys[reads % len(keys)]
                    began = time.monotonic()
                    with lock:
                        known = [n for t, n in acked[key] if t < began]
                    try:
                        got = client.get(key)
                    except KeyError:
                        got = None
                    reads += 1
                    if got is None:
                        continue
                    found += 1
                    n = struct.unpack("<Q", got[:8])[0]
                    assert got == value(key, n), key
                    # Stale: older than the last write acknowledged before the get began,
                    # or, when that was a removal, written before it (counters only grow:
                    # a value written after the removal has a larger one).
                    if not known:
                        continue
                    writes = [w for w in known if w is not None]
                    if (known[-1] is None and writes and n <= max(writes)) or (
                            known[-1] is not None and n < known[-1]):
                        stale += 1
                        if len(examples) < 5:
                            examples.append((key, n, known[-3:]))
        finally:
            stop.set()
            thread.join()
        assert not errors, errors
        assert reads >= 100000, reads
        assert stale == 0, (stale, reads, examples)
        stats = c.stats("a")
        # The race really was with the cache: copies served and invalidated many times.
        assert found > reads // 2 and stats.hot_cache_invalidations > 50, (found, stats)
        assert stats.hot_cache_hits > 10000, stats
        c.stop()
    finally:
        c.close()


def test_a_frozen_cache_holder_is_fenced_before_a_remove_returns():
    c = HotCluster()
    try:
        b = c.raw("b")
        old, new = value_of("frozen-old", 50 * KiB), value_of("frozen-new", 50 * KiB)
        assert b.put("frozen", old) == OK
        a = c.raw("a")
        for _ in range(2):
            assert a.get("frozen") == (OK, old)
        assert admitted(c, "a", 1)
        with kvpool.Client(c.nodes["a"].endpoint) as client:
            assert client.get("frozen") == old
        assert c.stats("a").hot_cache_hits >= 1
        pid = c.nodes["a"].pid
        reader = kvpool.Client(c.nodes["a"].endpoint, timeout=0.5)
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert b.remove("frozen", force=True) == OK
            took = time.monotonic() - started
            # A did not answer (--cluster-timeout), was fenced, and its lease ran out.
            assert took >= TIMEOUT_MS / 1000, took
            assert b.put("frozen", new) == OK
            # While A is stopped, a reader on its machine finds its copy unusable (the lease
            # in the read index ended) and its node silent: an error, never the old bytes.
            with kvpool.Client(c.nodes["b"].endpoint) as other:
                assert other.get("frozen") == new
            try:
                value = reader.get("frozen")
            except Exception:  # noqa: BLE001
                value = None
            assert value != old
        finally:
            os.kill(pid, signal.SIGCONT)
            reader.close()
        # Awake, A learns it was fenced, drops its copies and registers again; it then
        # serves the new value, never the old one.
        assert wait_for(lambda: "registering again" in c.nodes["a"].log_text(), 10), c.logs()
        assert wait_for(lambda: c.raw("a").get("frozen") == (OK, new), 10)
        for _ in range(20):
            assert c.raw("a").get("frozen") == (OK, new)
        assert "fencing it at the master" in c.nodes["b"].log_text()
        c.stop()
    finally:
        c.close()


def test_regex_remove_all_and_reset_reach_cache_copies(cluster):
    b, a = cluster.raw("b"), cluster.raw("a")
    keys = ["sweep-%d" % i for i in range(6)]

    def fill():
        for key in keys:
            assert b.put(key, value_of(key, 20 * KiB)) == OK
        before = cluster.stats("a").hot_cache_admissions

        def read_all():
            for key in keys:
                assert a.get(key) == (OK, value_of(key, 20 * KiB))
            return cluster.stats("a").hot_cache_admissions >= before + len(keys)

        assert wait_for(read_all, 5)
        for key in keys:
            assert a.get(key) == (OK, value_of(key, 20 * KiB))

    def gone(expect):
        for key in keys:
            status = a.get(key)[0]
            assert (status == OBJECT_NOT_FOUND) == (key in expect), (key, status)

    fill()
    reply, _ = b.call(pb.REMOVE_BY_REGEX, pattern="sweep-[024]")
    assert reply.status == OK and reply.count == 3
    gone(set(keys[0::2]))
    for key in keys[1::2]:
        assert b.remove(key, force=True) == OK
    fill()
    reply, _ = cluster.raw("c").call(pb.REMOVE_ALL, force=True)
    assert reply.status == OK
    gone(set(keys))
    fill()
    reply, _ = b.call(pb.RESET)
    assert reply.status == OK
    gone(set(keys))
    stats = cluster.stats("a")
    assert stats.hot_cache_invalidations >= 3 + 3 + 6 + 6 and stats.hot_cache_bytes == 0, stats


def test_cache_copies_go_first_and_never_push_out_a_replica():
    # A's pool: 8 MiB. Cache copies of B's 1 MiB values fill part of it; then puts through A
    # (its own replicas) need the room: the copies go, every replica stays.
    c = HotCluster(a=("--segment-size", "8MiB", "--hot-cache-size", "8MiB"))
    try:
        b, a = c.raw("b"), c.raw("a")
        remote = ["far-%d" % i for i in range(5)]
        for key in remote:
            assert b.put(key, value_of(key, MiB)) == OK
        for _ in range(2):
            for key in remote:
                assert a.get(key) == (OK, value_of(key, MiB))
        assert admitted(c, "a", 5)
        assert c.stats("a").objects == 0  # copies are not A's objects
        local = ["near-%d" % i for i in range(6)]
        for key in local:
            assert a.put(key, value_of(key, MiB)) == OK
        stats = c.stats("a")
        assert stats.hot_cache_evictions >= 3 and stats.objects == len(local), stats
        for key in local:
            assert a.get(key) == (OK, value_of(key, MiB))
        # With the pool full of replicas, a copy finds no room and none is made: reads of
        # B's values still come back right, relayed.
        for _ in range(3):
            for key in remote:
                assert a.get(key) == (OK, value_of(key, MiB))
        assert c.stats("a").objects == len(local)
        c.stop()
    finally:
        c.close()


# ---- each node in its own network namespace -----------------------------------------------

from test_cluster import Netns, SUBNET, _ip, _netns_usable  # noqa: E402


def _get_in(netns, endpoint, key, timeout_ms):
    """A raw GET of key from inside network namespace netns: (status, value) or None when
    no answer came within timeout_ms."""
    import subprocess
    import sys
    code = ("import sys; from kvpool_raw import Raw; r = Raw(%r, timeout_ms=%d); "
            "reply, frames = r.recv(r.send(3, [%r])); "
            "print('none' if reply is None else '%%d %%s' %% (reply.status or reply.statuses[0], "
            "frames[0].hex() if frames else ''))" % (endpoint, timeout_ms, key))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    if words[0] == "none":
        return None
    return int(words[0]), bytes.fromhex(words[1]) if len(words) > 1 else None


@pytest.mark.skipif(not _netns_usable(), reason="needs root and ip netns")
def test_a_partitioned_cache_holder_in_its_own_namespace():
    # A, B and C each in a network namespace of its own, with its own address. A keeps a
    # copy of B's value; then A's link goes down: a remove through B cannot reach it, fences
    # it, and waits out its lease; a client beside A, cut off with it, gets no old bytes;
    # the link back, A re-registers and reads the key as gone.
    net = Netns(3)
    daemons = []
    try:
        master = Kvpoold("--role", "master", "--node-ttl", "3000", "--placement", "local-first",
                         "--master", "tcp://%s.1:*" % SUBNET, "--insecure",
                         prefix="kvpool-master-")
        daemons.append(master)
        nodes = []
        for i in range(3):
            here = "tcp://%s:*" % Netns.address(i)
            node = Kvpoold("--role", "node", "--master", master.endpoint, "--host-id", "ns%d" % i,
                           "--insecure", "--segment-size", "64MiB", "--heartbeat-interval",
                           str(HEARTBEAT_MS), "--cluster-timeout", str(TIMEOUT_MS),
                           endpoints=(here,), admins=(here,), prefix="kvpool-node-",
                           wrapper=("ip", "netns", "exec", net.names[i]))
            daemons.append(node)
            nodes.append(node)

        def live():
            reply, _ = Raw(nodes[1].endpoint).call(pb.NODES)
            return sum(1 for n in reply.nodes if n.alive and n.capacity) == 3

        assert wait_for(live, 10)
        a, b = Raw(nodes[0].endpoint), Raw(nodes[1].endpoint)
        value = value_of("cut", 40 * KiB)
        assert b.put("cut", value) == OK
        for _ in range(2):
            assert a.get("cut") == (OK, value)
        assert wait_for(lambda: a.stats().hot_cache_admissions == 1, 5)
        sent = b.stats().value_bytes_out
        for _ in range(20):
            assert a.get("cut") == (OK, value)
        assert b.stats().value_bytes_out == sent  # served from A's copy
        # A's link goes down (its end of the veth pair, inside its namespace).
        peer = "%sp0" % net.names[0][:-2]
        assert _ip("netns", "exec", net.names[0], "ip", "link", "set", peer, "down") == 0
        try:
            started = time.monotonic()
            assert b.remove("cut", force=True) == OK
            assert time.monotonic() - started >= TIMEOUT_MS / 1000
            # A client in A's namespace: A's lease has run out, its copy is not served.
            got = _get_in(net.names[0], nodes[0].endpoint, "cut", 3000)
            assert got is None or got[0] != OK, got
        finally:
            _ip("netns", "exec", net.names[0], "ip", "link", "set", peer, "up")
        assert wait_for(lambda: "registering again" in nodes[0].log_text(), 10)
        assert wait_for(lambda: a.get("cut")[0] == OBJECT_NOT_FOUND, 10)
        assert "fencing it at the master" in nodes[1].log_text()
        for d in reversed(daemons):
            assert d.stop() == 0, d.log_text(3000)
    finally:
        for d in daemons:
            d.remove()
        net.close()
