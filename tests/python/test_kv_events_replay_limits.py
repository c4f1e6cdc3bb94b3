"""KV-events replay limits (actors/kv_events.c, docs/kv_events.md "Replay"): requesters that
ask for replays and never read them do not grow kvpoold without bound.

- A requester (routing id) has one replay queued at most: 8 DEALERs that never read send 40
  requests each; kvpoold's RSS grows by a bounded amount, and an honest requester still gets
  its whole replay.
- All replays queued take at most --kv-events-replay-bytes: with a 1 MiB cap, 60 DEALERs
  that never read queue a few replays, the rest are refused and counted (in the log at exit).

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import struct
import time

import zmq

from kvpool_daemon import Kvpoold  # noqa: E402
from kvpool_raw import Raw  # noqa: E402

OK = 0
LOOPBACK = "tcp://127.0.0.1:*"
END_SEQ = b"\xff" * 8
TOPIC = b"kv@pod-1@m"
MiB = 1 << 20


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def replay(endpoint, start, timeout_ms=10000):
    """[(seq, payload)] an honest requester gets: a DEALER that reads to the end marker."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    sock.send_multipart([b"", struct.pack(">Q", start)])
    got = []
    while True:
        assert sock.poll(timeout_ms), "no end marker from the replay service"
        frames = sock.recv_multipart()
        _, reply_topic, seq, payload = frames
        if payload == b"":
            assert seq == END_SEQ
            break
        got.append((struct.unpack(">Q", seq)[0], payload))
    sock.close()
    return got


def non_readers(endpoint, count):
    """DEALERs that take as little as they can and never read (tiny buffers, HWM 1)."""
    socks = []
    for _ in range(count):
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.linger = 0
        sock.rcvhwm = 1
        sock.setsockopt(zmq.RCVBUF, 4096)
        sock.connect(endpoint)
        socks.append(sock)
    return socks


def start_with_batches(*args):
    """A node whose replay ring holds about 1500 small batches (one put a millisecond)."""
    d = Kvpoold("--kv-events-endpoint", LOOPBACK, "--kv-events-replay-endpoint", LOOPBACK,
                "--kv-events-topic", TOPIC.decode(), "--lookup-model", "m",
                "--kv-events-interval", "1", "--segment-size", "64MiB", *args)
    raw = Raw(d.endpoint)
    deadline = time.monotonic() + 2.0
    i = 0
    while time.monotonic() < deadline:
        assert raw.put("ev-%06d" % i, b"x" * 16) == OK
        i += 1
        time.sleep(0.0005)
    raw.close()
    batches = len(replay(d.kv_events_replay, 0))
    assert batches >= 300, batches
    return d, batches


def test_one_replay_in_flight_per_requester():
    d, batches = start_with_batches()
    socks = []
    try:
        before = rss_kib(d.pid)
        socks = non_readers(d.kv_events_replay, 8)
        for _ in range(40):
            for sock in socks:
                sock.send_multipart([b"", struct.pack(">Q", 0)])
        time.sleep(1.0)
        after = rss_kib(d.pid)
        print("%d batches; RSS %d KiB before, %d KiB after 320 unread requests"
              % (batches, before, after))
        # 8 replays queued, not 320 (each ~batches x 5 frames)
        assert after - before < 32 * 1024, (before, after)
        got = replay(d.kv_events_replay, 0)
        assert len(got) >= batches and [s for s, _ in got] == sorted(s for s, _ in got)
    finally:
        for sock in socks:
            sock.close()
        log = d.finish()
    assert "replay requests refused" in log


def test_replay_bytes_cap():
    d, batches = start_with_batches("--kv-events-replay-bytes", "1MiB")
    socks = []
    try:
        before = rss_kib(d.pid)
        socks = non_readers(d.kv_events_replay, 60)
        for sock in socks:
            sock.send_multipart([b"", struct.pack(">Q", 0)])
        time.sleep(1.0)
        after = rss_kib(d.pid)
        print("%d batches; RSS %d KiB before, %d KiB after 60 unread requesters"
              % (batches, before, after))
        assert after - before < 32 * 1024, (before, after)
    finally:
        for sock in socks:
            sock.close()
        log = d.finish()
    assert "past --kv-events-replay-bytes" in log
    refused = int(log.split("queued, ")[1].split(" past")[0])
    assert refused > 0, log[-500:]
