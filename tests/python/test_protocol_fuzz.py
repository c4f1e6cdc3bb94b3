"""A storm of malformed client-protocol messages against the real kvpoold.

Random frames, random frame counts, truncated and bit-flipped copies of valid Requests, values
that do not match their keys, every operation number: thousands of them from several sockets.
Afterwards the daemon must still be alive, answer a valid put and get correctly, and have
kept its promise that nothing a client sends crashes or hangs it. The message stream is
seeded, so a failure replays.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import random
import time

import zmq

from kvpool_daemon import Kvpoold
from kvpool_test_pb import pb  # the generated protocol module

MESSAGES = 4000


def _valid_request(rng):
    request = pb.Request()
    request.version = 1
    request.request_id = rng.getrandbits(32)
    request.op = rng.randrange(0, 25)
    for _ in range(rng.randrange(0, 6)):
        request.keys.append(("fuzz/" + "".join(rng.choice("abc/é\t\0") for _ in
                                               range(rng.randrange(0, 12)))).encode())
    if rng.random() < 0.3:
        request.sizes.extend(rng.randrange(0, 1 << 21) for _ in range(rng.randrange(0, 6)))
    if rng.random() < 0.3:
        request.put.replica_num = rng.randrange(0, 12)
        request.put.preferred_segments.extend(["/nope", "/kvpool-x"][: rng.randrange(0, 3)])
    if rng.random() < 0.2:
        request.pattern = rng.choice(["^fuzz", "([", ".*", ""])
        request.force = rng.random() < 0.5
    if rng.random() < 0.1:
        request.segment.name = rng.choice(["/kvpool-fuzz-none", "no-slash", "/a/b", ""])
        request.segment.size = rng.randrange(0, 1 << 30)
        request.segment.id = rng.randrange(0, 8)
    return request.SerializeToString()


def _mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        kind = rng.random()
        if kind < 0.4 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind < 0.7:
            data = data[: rng.randrange(len(data) + 1)]
        else:
            data += bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 16)))
    return bytes(data)


def _message(rng):
    choice = rng.random()
    if choice < 0.25:
        frames = [bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64)))
                  for _ in range(rng.randrange(1, 5))]
    elif choice < 0.6:
        frames = [_mutate(rng, _valid_request(rng))]
    else:
        frames = [_valid_request(rng)]
    # Value frames that may or may not match the keys, some over the 1 MiB limit.
    for _ in range(rng.randrange(0, 4)):
        size = rng.choice([0, 1, 100, 5000, (1 << 20) + 1])
        frames.append(b"v" * size)
    if rng.random() < 0.1:
        frames.insert(0, b"")  # a REQ-style delimiter on a DEALER
    return frames


def _put_and_get(endpoint):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    put = pb.Request(version=1, request_id=1, op=pb.PUT, keys=[b"after/fuzz"])
    sock.send_multipart([put.SerializeToString(), b"still serving"])
    reply = pb.Reply()
    reply.ParseFromString(sock.recv_multipart()[0])
    assert reply.request_id == 1 and reply.status == 0 and list(reply.statuses) == [0]
    get = pb.Request(version=1, request_id=2, op=pb.GET, keys=[b"after/fuzz"])
    sock.send_multipart([get.SerializeToString()])
    frames = sock.recv_multipart()
    reply.ParseFromString(frames[0])
    assert reply.request_id == 2 and list(reply.statuses) == [0]
    assert frames[1] == b"still serving"
    sock.close()


def test_malformed_storm_leaves_the_daemon_serving():
    daemon = Kvpoold("--segment-size", "64MiB", "--max-value-size", "1MiB",
                     prefix="kvpool-fuzz-", start_timeout=10)
    # The same-machine ipc endpoint: there every operation is allowed (tcp clients are refused
    # the shared-memory ones before their handlers), so the storm reaches every handler.
    proc, endpoint = daemon.proc, daemon.ipc
    try:
        rng = random.Random(20261122)
        ctx = zmq.Context.instance()
        socks = []
        for _ in range(4):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 100000)
            sock.connect(endpoint)
            socks.append(sock)
        for i in range(MESSAGES):
            socks[i % len(socks)].send_multipart(_message(rng))
            # Drain replies now and then so nothing backs up.
            for sock in socks:
                while sock.poll(0):
                    sock.recv_multipart()
        # Whatever came back is well-formed: every reply decodes as a Reply.
        deadline = time.monotonic() + 3
        replies = 0
        while time.monotonic() < deadline:
            got = False
            for sock in socks:
                while sock.poll(50):
                    frames = sock.recv_multipart()
                    reply = pb.Reply()
                    reply.ParseFromString(frames[0])
                    replies += 1
                    got = True
            if not got:
                break
        for sock in socks:
            sock.close()
        assert proc.poll() is None, "kvpoold died under malformed input"
        _put_and_get(endpoint)
        assert proc.poll() is None
    finally:
        try:
            assert daemon.stop(timeout=10) == 0, "kvpoold did not stop cleanly"
        finally:
            daemon.remove()
