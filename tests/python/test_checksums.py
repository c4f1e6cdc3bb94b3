"""Values are checked end to end (issue "Cluster trust", item 4): a master and three nodes on
loopback, as in test_cluster.py.

- A node refuses a value another node sends whose bytes do not match the checksum sent
  with it (INVALID_WRITE, nothing stored, checksum_failures counted); the right checksum
  is taken.
- A replica corrupted behind the master's back (a byte flipped in the holder's segment
  memory) is never served through another node: the reading node verifies what it read,
  counts the mismatch and reads the other replica, or answers an error when there is none;
  whole values and values in stripes alike.
- libkvpool, following a REDIRECT to the corrupted holder, verifies what it read and falls
  back to the next holder or its own node's relayed read: never the corrupted bytes.
- With --verify-checksums off (at run time) the corrupted bytes do go through: what the
  checks are there for.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import mmap
import os
import re

import pytest

from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402
from test_cluster import Cluster, value_of  # noqa: E402

OK = 0
INVALID_WRITE = -700
TRANSFER_FAIL = -800
MiB = 1 << 20


@pytest.fixture
def cluster():
    # Node A shares B's host: A reads B's replicas first (same host first), so the corrupted
    # copy is the one it meets first.
    c = Cluster(hosts=("hB", "hB", "hC"))
    yield c
    logs = c.logs()
    alive = [d.alive() for d in c.nodes + [c.master]]
    statuses = [d.stop() for d in c.nodes + [c.master]]
    c.close()
    assert all(alive), (alive, logs)
    assert statuses == [0] * len(statuses), logs


def plane(node):
    """A raw client on a node's data plane, proving the cluster key."""
    endpoint = re.search(r"data plane (tcp://\S+)", node.log_text()).group(1)
    return Raw(endpoint, cluster_key=True)


def plane_write(raw, op, key, value, **fields):
    """A node's write on a data plane, confirmed as its writer confirms it once the master
    committed it (before that, the node serves it to no reader that does not name its
    version)."""
    reply, _ = raw.call(op, [key], [value], **fields)
    if reply.status == OK and reply.statuses[0] == OK:
        confirmed, _ = raw.call(pb.CONFIRM, [key], versions=[reply.versions[0]])
        assert confirmed.statuses[0] == OK, confirmed
    return reply


def node_ids(cluster):
    reply, _ = cluster.raw(0).call(pb.NODES)
    return [next(n.node_id for n in reply.nodes if n.client_endpoint == d.endpoint)
            for d in cluster.nodes]


def corrupt(node, value):
    """Flips one byte in the middle of value where the node holds it (its segments are
    memfds: /proc/<pid>/fd/N), behind the master's back. Returns how many copies it found."""
    found = 0
    fd_dir = "/proc/%d/fd" % node.pid
    for name in os.listdir(fd_dir):
        try:
            if not os.readlink(os.path.join(fd_dir, name)).startswith("/memfd:"):
                continue
            fd = os.open(os.path.join(fd_dir, name), os.O_RDWR)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            if size < len(value):
                continue
            try:
                m = mmap.mmap(fd, size)
            except OSError:
                continue  # a memfd sealed against writes (not a segment)
            with m:
                at = m.find(value)
                while at >= 0:
                    m[at + len(value) // 2] ^= 0x5A
                    found += 1
                    at = m.find(value, at + len(value))
        finally:
            os.close(fd)
    return found


def set_verify(cluster, i, value):
    """--verify-checksums of node i, changed at run time (CONFIG: on its ipc endpoint)."""
    reply, _ = cluster.raw(i).call(pb.PING)
    local = Raw(reply.local_endpoint)
    reply, _ = local.call(pb.CONFIG, setting="verify-checksums", setting_value=value)
    local.close()
    assert reply.status == OK, reply
    return reply.setting_value


def failures(cluster, i):
    return cluster.raw(i).stats().checksum_failures


def test_a_node_refuses_a_value_that_does_not_match_its_checksum(cluster):
    raw = plane(cluster.nodes[2])
    value = value_of("sum", 200 << 10)
    assert plane_write(raw, pb.PUT, "sum-plain", value).statuses[0] == OK
    # The node took the value's checksum as it copied it, and sends it with the value.
    reply, frames = raw.call(pb.GET, ["sum-plain"])
    assert reply.statuses[0] == OK and frames[0] == value and len(reply.checksums) == 1
    checksum = reply.checksums[0]
    assert checksum != 0
    # A ranged read carries the whole value's.
    reply, _ = raw.call(pb.GET, ["sum-plain"], offsets=[10], lengths=[10])
    assert list(reply.checksums) == [checksum]
    before = failures(cluster, 2)
    # An upsert from a node whose bytes are not the ones its checksum was taken of.
    reply, _ = raw.call(pb.UPSERT, ["sum-bad"], [value], checksums=[checksum ^ 1])
    assert reply.statuses[0] == INVALID_WRITE, reply
    assert "checksum" in reply.error
    assert raw.get("sum-bad")[0] != OK
    assert failures(cluster, 2) == before + 1
    # An upsert over an existing value with a wrong checksum replaces nothing.
    reply, _ = raw.call(pb.UPSERT, ["sum-plain"], [value_of("other", 200 << 10)],
                        checksums=[checksum])
    assert reply.statuses[0] == INVALID_WRITE
    assert raw.get("sum-plain") == (OK, value)
    # The right checksum is taken.
    reply = plane_write(raw, pb.UPSERT, "sum-good", value, checksums=[checksum])
    assert reply.statuses[0] == OK
    assert raw.get("sum-good") == (OK, value)
    # Checksums come one a key, or not at all.
    reply, _ = raw.call(pb.UPSERT, ["a", "b"], [b"1", b"2"], checksums=[1])
    assert reply.status != OK
    assert failures(cluster, 2) == before + 2


@pytest.mark.parametrize("size", [300 << 10, 3 * MiB + 5])
def test_a_corrupted_replica_is_not_served_through_another_node(cluster, size):
    # Written through C onto B and C (stripes for the larger size: --stripe-size 1MiB).
    a, b, c = node_ids(cluster)
    two = "two-%d" % size
    one = "one-%d" % size
    writer = cluster.raw(2)
    assert writer.put(two, value_of(two, size),
                      put={"replica_num": 2, "preferred_segments": [b, c]}) == OK
    assert writer.put(one, value_of(one, size), put={"preferred_segments": [b]}) == OK
    assert sorted(cluster.locate(two)) == ["hB", "hC"] and cluster.locate(one) == ["hB"]
    assert corrupt(cluster.nodes[1], value_of(two, size)) == 1
    assert corrupt(cluster.nodes[1], value_of(one, size)) == 1
    before = failures(cluster, 0)
    # A reads B first (same host): its copy does not verify, so C's is read.
    assert cluster.raw(0).get(two) == (OK, value_of(two, size))
    assert failures(cluster, 0) == before + 1
    # The only copy is corrupted: an error, never its bytes.
    status, got = cluster.raw(0).get(one)
    assert status == TRANSFER_FAIL and not got, status
    assert failures(cluster, 0) == before + 2
    # In a batch too.
    reply, frames = cluster.raw(0).call(pb.GET, [two, one])
    assert list(reply.statuses) == [OK, TRANSFER_FAIL]
    assert frames[0] == value_of(two, size)
    assert failures(cluster, 0) == before + 4
    # With the checks off (at run time), the corrupted bytes do go through.
    assert set_verify(cluster, 0, "off") == "off"
    status, got = cluster.raw(0).get(one)
    assert status == OK and got != value_of(one, size) and len(got) == size
    assert set_verify(cluster, 0, "on") == "on"
    assert cluster.raw(0).get(one)[0] == TRANSFER_FAIL


def test_libkvpool_does_not_take_corrupted_bytes_after_a_redirect(cluster):
    import kvpool
    a, b, c = node_ids(cluster)
    size = 300 << 10  # >= 64 KiB: node A answers REDIRECT, libkvpool reads the holder
    writer = cluster.raw(2)
    two = ["r-two-%d" % i for i in range(4)]
    one = "r-one"
    for key in two:
        assert writer.put(key, value_of(key, size),
                          put={"replica_num": 2, "preferred_segments": [b, c]}) == OK
        assert sorted(cluster.locate(key)) == ["hB", "hC"]
    assert writer.put(one, value_of(one, size), put={"preferred_segments": [b]}) == OK
    for key in two + [one]:
        assert corrupt(cluster.nodes[1], value_of(key, size)) == 1
    # Through A, which holds none of them (and is not on this machine's host id, so the
    # client takes no shared-memory path).
    before = cluster.raw(0).stats()
    with kvpool.Client(cluster.nodes[0].endpoint) as client:
        # Whichever holder the REDIRECT names first, the bytes that come back are right.
        for key in two:
            assert client.get(key) == value_of(key, size)
        assert client.get_batch(two) == [value_of(k, size) for k in two]
        into = [bytearray(size) for _ in two]
        assert list(client.get_batch_into(two, into)) == [size] * len(two)
        assert [bytes(x) for x in into] == [value_of(k, size) for k in two]
        # The only holder's copy is corrupted: libkvpool falls back to A's relayed read,
        # which A verifies too: an error, never the corrupted bytes.
        with pytest.raises(kvpool.Error) as raised:
            client.get(one)
        assert raised.value.status == TRANSFER_FAIL
        with pytest.raises(kvpool.Error):
            client.get_batch(two + [one])
    after = cluster.raw(0).stats()
    assert after.redirects > before.redirects
    # A relayed the key whose only copy was corrupted, and counted each mismatch it saw.
    assert after.checksum_failures - before.checksum_failures >= 2
