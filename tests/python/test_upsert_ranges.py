"""UPSERT and ranged GET over the raw protocol (protocol/kvpool.proto), against the real
kvpoold: an upsert replaces a value whole, a reader of the old one keeps its bytes, a key being
written is not replaced; a ranged GET moves only the range, with the node's own checks."""

import os
import sys
import threading
import time

import pytest
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvpool_daemon import Kvpoold  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402 (the generated protocol module)


@pytest.fixture(scope="module")
def daemon():
    # Room for every replaced value of the tests to wait out its lease at once: a pool that
    # filled would evict the current value, and a reader would find the key gone.
    d = Kvpoold("--segment-size", "256MiB", "--lease-ttl", "300")
    yield d
    assert d.stop() == 0
    d.remove()


class Client:
    def __init__(self, endpoint):
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.next_id = 1

    def call(self, op, keys=(), values=None, **fields):
        request = pb.Request(version=1, request_id=self.next_id, op=op,
                             keys=[k.encode() if isinstance(k, str) else k for k in keys],
                             **fields)
        self.next_id += 1
        self.sock.send_multipart([request.SerializeToString()] + list(values or []))
        assert self.sock.poll(10000), "no reply"
        frames = self.sock.recv_multipart()
        reply = pb.Reply()
        reply.ParseFromString(frames[0])
        assert reply.request_id == request.request_id
        return reply, frames[1:]

    def close(self):
        self.sock.close()


@pytest.fixture
def client(daemon):
    c = Client(daemon.endpoint)
    c.call(pb.REMOVE_ALL, force=True)
    yield c
    c.close()


def test_upsert_creates_then_replaces_whole(client):
    reply, _ = client.call(pb.UPSERT, ["u1"], [b"a" * 1000])
    assert reply.status == 0 and list(reply.statuses) == [0]
    # A PUT of the key is refused (objects stay immutable for PUT) ...
    reply, _ = client.call(pb.PUT, ["u1"], [b"b" * 10])
    assert list(reply.statuses) == [pb.OBJECT_ALREADY_EXISTS]
    # ... an UPSERT replaces it, with another size, and every read sees the new value.
    reply, _ = client.call(pb.UPSERT, ["u1"], [b"c" * 70000])
    assert list(reply.statuses) == [0]
    reply, values = client.call(pb.GET, ["u1"])
    assert list(reply.statuses) == [0] and values == [b"c" * 70000]
    reply, _ = client.call(pb.GET_SIZE, ["u1"])
    assert list(reply.sizes) == [70000]
    # Batched, with a bad key among them: per-key outcomes.
    reply, _ = client.call(pb.UPSERT, ["u1", "", "u2"], [b"d", b"x", b"e" * 5])
    assert list(reply.statuses) == [0, pb.INVALID_KEY, 0]
    reply, values = client.call(pb.GET, ["u1", "u2"])
    assert values == [b"d", b"e" * 5]


def test_upsert_of_a_key_being_written_is_not_ready(daemon, client):
    # PUT_START is a same-machine operation: on the ipc endpoint.
    local = Client(daemon.ipc)
    try:
        reply, _ = local.call(pb.PUT_START, ["w1"], sizes=[100])
        assert list(reply.statuses) == [0], reply
        reply, _ = client.call(pb.UPSERT, ["w1"], [b"z" * 100])
        assert list(reply.statuses) == [pb.REPLICA_IS_NOT_READY]
        reply, _ = local.call(pb.PUT_REVOKE, ["w1"])
        assert list(reply.statuses) == [0]
        reply, _ = client.call(pb.UPSERT, ["w1"], [b"z" * 100])
        assert list(reply.statuses) == [0]
    finally:
        local.close()


def test_readers_see_old_or_new_never_a_mix(daemon, client):
    size = 1 << 20
    old, new = b"o" * size, b"n" * size
    client.call(pb.UPSERT, ["mix"], [old])
    stop = threading.Event()
    seen, bad = set(), []

    def reader():
        c = Client(daemon.endpoint)
        try:
            while not stop.is_set():
                reply, values = c.call(pb.GET, ["mix"])
                if reply.statuses[0] != 0:
                    bad.append(reply.statuses[0])
                    continue
                value = values[0]
                if value not in (old, new):
                    bad.append(value[:8] + value[-8:])
                seen.add(value[:1])
        finally:
            c.close()

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(60):
            client.call(pb.UPSERT, ["mix"], [new if i % 2 == 0 else old])
    finally:
        stop.set()
        for t in threads:
            t.join(20)
    assert not bad, bad[:3]
    assert seen, "no read completed"


def test_upsert_frees_the_old_space(client):
    # Replacing a value many times must not leak: stats count the stored bytes once, and the
    # allocator gets the replaced values' space back (at once when nobody read them; values
    # replaced under a lease, as in the test above, wait for it: 300 ms here).
    for i in range(50):
        reply, _ = client.call(pb.UPSERT, ["space"], [bytes([i]) * 200000])
        assert list(reply.statuses) == [0]
    deadline = time.monotonic() + 3
    while True:
        reply, _ = client.call(pb.STATS)
        if reply.stats.bytes_allocated < 2 * 200000 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert reply.stats.objects == 1 and reply.stats.bytes_stored == 200000
    assert reply.stats.bytes_allocated < 2 * 200000, reply.stats.bytes_allocated


def test_a_value_replaced_under_a_lease_keeps_its_space_until_the_lease_ends(client):
    client.call(pb.UPSERT, ["leased"], [b"L" * 300000])
    client.call(pb.GET, ["leased"])  # a lease of 300 ms
    reply, _ = client.call(pb.STATS)
    before = reply.stats.bytes_allocated
    start = time.monotonic()
    client.call(pb.UPSERT, ["leased"], [b"M" * 300000])
    reply, _ = client.call(pb.STATS)
    if time.monotonic() - start < 0.25:
        # Both values hold space while the old one's lease runs.
        assert reply.stats.bytes_allocated >= before + 300000, (before, reply.stats)
    time.sleep(0.5)
    reply, _ = client.call(pb.STATS)
    assert reply.stats.bytes_allocated < before + 300000, (before, reply.stats)


def test_ranged_get_moves_only_the_range(client):
    value = bytes(range(256)) * 400  # 102400 bytes
    client.call(pb.PUT, ["r1"], [value])
    client.call(pb.PUT, ["r2"], [b"short"])
    reply, frames = client.call(pb.GET, ["r1", "r2", "r1", "missing"],
                                offsets=[1000, 2, 102400, 0], lengths=[300, 100, 10, 5])
    assert list(reply.statuses) == [0, 0, 0, pb.OBJECT_NOT_FOUND]
    assert frames[0] == value[1000:1300]
    assert frames[1] == b"ort"                     # clipped at the value's end
    assert frames[2] == b""                        # offset == size: nothing left
    assert frames[3] == b""
    assert list(reply.sizes) == [300, 3, 0, 0]     # the bytes of the range sent


def test_ranged_get_checks(client):
    client.call(pb.PUT, ["r3"], [b"0123456789"])
    reply, frames = client.call(pb.GET, ["r3"], offsets=[11], lengths=[1])
    assert list(reply.statuses) == [pb.INVALID_PARAMS] and "past the end" in reply.error
    # One offset and one length a key, or none at all.
    reply, _ = client.call(pb.GET, ["r3", "r3"], offsets=[1], lengths=[1])
    assert reply.status == pb.INVALID_PARAMS
    reply, _ = client.call(pb.GET, ["r3"], offsets=[1])
    assert reply.status == pb.INVALID_PARAMS
    # Ranges belong to GET only.
    reply, _ = client.call(pb.EXIST, ["r3"], offsets=[1], lengths=[1])
    assert reply.status == pb.INVALID_PARAMS
    # A large range of a large value, zero copy from the segment.
    big = os.urandom(3 << 20)
    client.call(pb.PUT, ["big"], [big])
    reply, frames = client.call(pb.GET, ["big"], offsets=[12345], lengths=[2 << 20])
    assert list(reply.statuses) == [0] and frames[0] == big[12345:12345 + (2 << 20)]
