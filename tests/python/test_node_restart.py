"""A node restart keeps its objects (issue 12, item 8b): kvpoold --segment-dir DIR keeps its
segments as files in DIR with a record of the objects in them, and a node restarted with the
same DIR adopts every object whose bytes still verify.

- kill -9, and separately SIGTERM: every value (sizes from 0 bytes to over 1 MiB, put over
  the socket and by a same-machine client through the fast path) reads back byte for byte
  after the restart, over the socket and through the fast path (which maps the segment
  files by their paths).
- A value changed in its segment file while the node is down: exactly that object is dropped
  (OBJECT_NOT_FOUND); the others survive.
- A removed object does not come back; an upserted one comes back with its new value.
- Two live nodes never share a directory.
- In a cluster (master + 2 nodes, distinct host ids): the restarted node (same node id, host
  id and endpoint) registers again, and what it adopted reads back through the other node.

Binds loopback only; each daemon stops by itself at the end of its test.
"""

import os
import shutil
import tempfile
import time

import pytest

import kvpool

from kvpool_daemon import Kvpoold, wait_for  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402

OK = 0
OBJECT_NOT_FOUND = -704
MiB = 1 << 20
SIZES = [0, 1, 100, 4096, 5000, 70000, MiB, 3 * MiB + 7]


def value_of(key, size):
    """size bytes that only this key has."""
    seed = (key.encode() * 64)[:64]
    block = bytes((b * 7 + i) & 0xFF for i, b in enumerate(seed))
    return (block * (size // 64 + 1))[:size]


@pytest.fixture
def segment_dir():
    # tmpfs, as a node would use it; the files go with the test.
    base = tempfile.mkdtemp(prefix="kvpool-restart-", dir="/dev/shm")
    yield os.path.join(base, "segments")
    shutil.rmtree(base, ignore_errors=True)


def start(segment_dir, *extra, port=None):
    endpoints = ("tcp://127.0.0.1:%s" % port,) if port else ("tcp://127.0.0.1:*",)
    return Kvpoold("--segment-dir", segment_dir, "--segment-size", "32MiB", "--segments", "2",
                   *extra, endpoints=endpoints, prefix="kvpool-restart-")


def port_of(daemon):
    return daemon.endpoint.rsplit(":", 1)[1]


def kill9(daemon):
    daemon.proc.kill()
    daemon.proc.wait()


def put_all(daemon):
    """Puts values of every size over the socket and through the fast path; returns them."""
    values = {}
    raw = Raw(daemon.endpoint)
    for size in SIZES:
        key = "sock-%d" % size
        values[key] = value_of(key, size)
        assert raw.put(key, values[key]) == OK, key
    raw.close()
    client = kvpool.Client(daemon.endpoint)
    try:
        assert client.fast_path, "a same-machine client should map the segment files"
        for size in SIZES[1:]:
            key = "fast-%d" % size
            values[key] = value_of(key, size)
            client.put(key, values[key])
    finally:
        client.close()
    return values


def check_all(daemon, values):
    raw = Raw(daemon.endpoint)
    for key, value in values.items():
        assert raw.get(key) == (OK, value), (key, daemon.log_text(3000))
    raw.close()
    client = kvpool.Client(daemon.endpoint)
    try:
        assert client.fast_path
        for key, value in values.items():
            assert client.get(key) == value, key
    finally:
        client.close()


def adoption_line(daemon):
    return next((line for line in daemon.log_text().splitlines() if "adopted in" in line), "")


@pytest.mark.parametrize("how", ["kill9", "sigterm"])
def test_restart_keeps_every_value(segment_dir, how):
    first = start(segment_dir)
    values = put_all(first)
    check_all(first, values)
    port = port_of(first)
    if how == "kill9":
        kill9(first)
    else:
        assert first.stop() == 0, first.log_text()
    first.remove()
    second = start(segment_dir, port=port)
    try:
        check_all(second, values)
        line = adoption_line(second)
        assert "%d objects" % len(values) in line and "0 failed verification" in line, line
        # The restarted node works as any: new puts, and its files are still the record.
        raw = Raw(second.endpoint)
        assert raw.put("after", value_of("after", 2 * MiB)) == OK
        raw.close()
        values["after"] = value_of("after", 2 * MiB)
        kill9(second)
        second.remove()
        second = start(segment_dir, port=port)
        check_all(second, values)
    finally:
        second.finish()


def test_a_damaged_value_is_dropped_alone(segment_dir):
    first = start(segment_dir)
    values = put_all(first)
    raw = Raw(first.ipc)  # replica lists are for same-machine clients
    victim = "sock-70000"
    reply, _ = raw.call(pb.GET_REPLICA_LIST, [victim])
    replica = reply.replicas[0].replicas[0]
    segments = {s.id: s.name for s in raw.segments()}
    raw.close()
    path = segments[replica.segment_id]
    assert path.startswith(segment_dir), path
    assert first.stop() == 0
    first.remove()
    # One byte of the victim's value changes while the node is down.
    with open(path, "r+b") as f:
        f.seek(replica.offset + 12345)
        byte = f.read(1)
        f.seek(replica.offset + 12345)
        f.write(bytes([byte[0] ^ 0x5A]))
    second = start(segment_dir)
    try:
        raw = Raw(second.endpoint)
        assert raw.get(victim) == (OBJECT_NOT_FOUND, None)
        for key, value in values.items():
            if key != victim:
                assert raw.get(key) == (OK, value), key
        raw.close()
        line = adoption_line(second)
        assert "%d objects" % (len(values) - 1) in line and "1 failed verification" in line, line
    finally:
        second.finish()


def test_removed_objects_stay_removed(segment_dir):
    first = start(segment_dir)
    raw = Raw(first.endpoint)
    for i in range(20):
        assert raw.put("r-%d" % i, value_of("r-%d" % i, 1000 + i * 3000)) == OK
    for i in range(0, 20, 2):
        assert raw.remove("r-%d" % i) == OK
    # An upsert replaces a value: the new one comes back, never the old.
    reply, _ = raw.call(pb.UPSERT, ["r-1"], [value_of("new r-1", 5000)])
    assert (reply.status or reply.statuses[0]) == OK
    # Space freed by the removes is reused by new objects.
    for i in range(10):
        assert raw.put("n-%d" % i, value_of("n-%d" % i, 3000)) == OK
    raw.close()
    kill9(first)
    first.remove()
    second = start(segment_dir)
    try:
        raw = Raw(second.endpoint)
        for i in range(20):
            key = "r-%d" % i
            if i % 2 == 0:
                assert raw.get(key) == (OBJECT_NOT_FOUND, None), key
            elif i == 1:
                assert raw.get(key) == (OK, value_of("new r-1", 5000))
            else:
                assert raw.get(key) == (OK, value_of(key, 1000 + i * 3000)), key
        for i in range(10):
            assert raw.get("n-%d" % i) == (OK, value_of("n-%d" % i, 3000))
        raw.close()
    finally:
        second.finish()


def test_two_nodes_never_share_a_directory(segment_dir):
    first = start(segment_dir)
    try:
        with pytest.raises(AssertionError) as refused:
            start(segment_dir)
        assert "in use by another kvpoold" in str(refused.value)
    finally:
        first.finish()


def test_cluster_node_restart_is_readable_everywhere(segment_dir):
    master = Kvpoold("--role", "master", "--node-ttl", "2000", "--master", "tcp://127.0.0.1:*",
                     prefix="kvpool-master-")
    common = ("--role", "node", "--master", master.endpoint, "--segment-size", "32MiB",
              "--heartbeat-interval", "200", "--cluster-timeout", "1000")
    node_a = node_b = None

    def start_a(port=None):
        endpoints = ("tcp://127.0.0.1:%s" % port,) if port else ("tcp://127.0.0.1:*",)
        return Kvpoold(*common, "--host-id", "hA", "--node-id", "node-a", "--segment-dir",
                       segment_dir, endpoints=endpoints, prefix="kvpool-node-")

    def located(key):
        reply, _ = Raw(node_b.endpoint).call(pb.LOCATE, [key])
        if reply.status != OK or reply.statuses[0] != OK:
            return []
        return [reply.nodes[i].host_id for i in reply.locations[0].nodes]

    try:
        node_a = start_a()
        node_b = Kvpoold(*common, "--host-id", "hB", prefix="kvpool-node-")
        raw_a = Raw(node_a.endpoint)
        assert wait_for(lambda: sum(n.alive for n in raw_a.call(pb.NODES)[0].nodes) == 2, 10)
        values = {}
        for i in range(40):
            key = "c-%d" % i
            values[key] = value_of(key, SIZES[i % len(SIZES)])
            assert raw_a.put(key, values[key]) == OK
        raw_a.close()
        on_a = [k for k in values if located(k) == ["hA"]]
        assert len(on_a) >= 5, "placement put too few keys on node A"
        port = port_of(node_a)
        kill9(node_a)
        node_a.remove()
        node_a = start_a(port)
        # Back under its name: the master hears what it holds, and node B reads it. Until the
        # new process has registered, the master still answers from the old one's report, so
        # the wait is for the new report first.
        assert wait_for(lambda: "objects reported" in node_a.log_text(), 10)
        assert wait_for(lambda: all(located(k) == ["hA"] for k in on_a), 10)
        raw_b = Raw(node_b.endpoint)
        raw_a = Raw(node_a.endpoint)
        for key in on_a:
            assert raw_b.get(key) == (OK, values[key]), key
            assert raw_a.get(key) == (OK, values[key]), key
        for key in values:
            assert raw_b.get(key) == (OK, values[key]), key
        raw_a.close()
        raw_b.close()
    finally:
        logs = "\n".join(d.log_text(3000) for d in (node_a, node_b, master) if d)
        statuses = [d.stop() for d in (node_a, node_b, master) if d]
        for d in (node_a, node_b, master):
            if d:
                d.remove()
    assert statuses == [0] * len(statuses), logs


def test_without_segment_dir_nothing_is_kept():
    # Sealed memfds, gone with the node, nothing adopted.
    first = Kvpoold("--segment-size", "32MiB")
    raw = Raw(first.endpoint)
    assert raw.put("k", b"v" * 100) == OK
    names = [s.name for s in raw.segments()]
    raw.close()
    assert all(name.startswith("/proc/%d/fd/" % first.pid) for name in names), names
    first.finish()
    assert not any(os.path.exists(name) for name in names)
