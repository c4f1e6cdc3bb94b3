"""kvpoold's KV events (--kv-events-endpoint, actors/kv_events.c, docs/kv_events.md).

A subscriber written from vLLM's decoder rules (not from kvpool's encoder) watches a real
kvpoold over tcp on loopback:
- a scripted workload (puts, a duplicate put, an upsert, a remove, a remove-all) gives
  BlockStored, BlockRemoved and AllBlocksCleared in order, with no sequence gap;
- keys that follow the lookup key template carry their parsed hash (a u64, as vLLM's int
  block hashes) and ranks; other keys are their own bytes hash;
- a subscriber that lost a range of batches gets it back, byte for byte, from the replay
  ROUTER (vLLM >= 0.26 layout: topic, seq, payload; then the end marker); a request older
  than the replay ring replays from its oldest batch; a malformed request is dropped;
- eviction (a small --segment-size) gives BlockRemoved for exactly the keys that went;
- segment loss (a client that mounted memory leaves) gives BlockRemoved for the keys whose
  only replica was there, and none for the others;
- a same-machine put (PUT_START, then PUT_END over ipc) gives BlockStored at PUT_END and not
  before; a revoked one (PUT_REVOKE) gives none; STATS counts the events noted
  (kv_events) and none dropped;
- without --kv-events-endpoint there is no publisher.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import hashlib
import struct
import time

import msgpack
import zmq

from kvpool_daemon import Kvpoold, wait_for  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402

OK = 0
MiB = 1 << 20
LOOPBACK = "tcp://127.0.0.1:*"
END_SEQ = b"\xff" * 8
TOPIC = b"kv@pod-1@m"
U64 = (1 << 64) - 1

# vLLM's KVCacheEvent classes: the fields with no default (always on the wire, even nil).
REQUIRED = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def decode_batch(payload):
    """vLLM's typed decoder, by its rules: the batch is an array [ts float, events, dp rank];
    each event a map tagged by "type" with a known class; required fields present; hashes
    ints (u64) or bytes. Raises AssertionError where msgspec would raise."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, dp_rank = batch
    assert isinstance(ts, float) and isinstance(events, list) and isinstance(dp_rank, int)
    assert payload[1] == 0xcb  # float64, as a Python float always is
    for event in events:
        assert isinstance(event, dict), "map-encoded events (vLLM >= 0.24)"
        assert next(iter(event)) == "type"
        kind = event["type"]
        assert kind in REQUIRED, "unknown tag fails the whole batch: %r" % kind
        for field in REQUIRED[kind]:
            assert field in event, (kind, field)
        if kind != "AllBlocksCleared":
            hashes = event["block_hashes"]
            assert isinstance(hashes, list) and hashes
            for h in hashes:
                assert isinstance(h, bytes) or (isinstance(h, int) and 0 <= h <= U64)
            assert isinstance(event["medium"], str)
        if kind == "BlockStored":
            assert isinstance(event["token_ids"], list) and isinstance(event["block_size"], int)
    return ts, events, dp_rank


class Subscriber:
    """A SUB socket as vLLM's example subscriber has it: 3 frames, seq 8 bytes big-endian."""

    def __init__(self, endpoint, topic=TOPIC):
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.linger = 0
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)
        self.topic = topic

    def recv(self, timeout_ms=5000):
        """(seq, payload) of the next message, or None after the timeout."""
        if not self.sock.poll(timeout_ms):
            return None
        frames = self.sock.recv_multipart()
        assert len(frames) == 3, frames
        topic, seq, payload = frames
        assert topic == self.topic and len(seq) == 8
        return struct.unpack(">Q", seq)[0], payload

    def close(self):
        self.sock.close()


def replay(endpoint, start, topic=TOPIC, timeout_ms=5000):
    """[(seq, payload)] the replay ROUTER sends from start, as llm-d asks: a DEALER sending
    an empty delimiter and the seq; every reply [b"", topic, seq, payload], then the end."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    sock.send_multipart([b"", struct.pack(">Q", start)])
    got = []
    while True:
        assert sock.poll(timeout_ms), "no end marker from the replay service"
        frames = sock.recv_multipart()
        assert len(frames) == 4 and frames[0] == b"", frames
        _, reply_topic, seq, payload = frames
        if payload == b"":
            assert seq == END_SEQ and reply_topic == b""
            break
        assert reply_topic == topic and len(seq) == 8
        got.append((struct.unpack(">Q", seq)[0], payload))
    sock.close()
    return got


def events_daemon(*args):
    return Kvpoold("--kv-events-endpoint", LOOPBACK, "--kv-events-replay-endpoint", LOOPBACK,
                   "--kv-events-topic", TOPIC.decode(), "--lookup-model", "m", *args)


def subscribed(daemon, raw):
    """A subscriber that is known to be receiving (a SUB socket's subscription reaches the
    PUB socket some time after connect): probe puts until one's event arrives, then read up
    to the remove-all that clears them, so the stream starts clean."""
    sub = Subscriber(daemon.kv_events)
    for i in range(100):
        assert raw.put("probe-%d" % i, b"p") == OK
        if sub.sock.poll(50):
            break
    reply, _ = raw.call(pb.REMOVE_ALL, force=True)
    assert reply.status == OK
    while True:
        message = sub.recv()
        assert message is not None, "no AllBlocksCleared after the probes"
        if any(e["type"] == "AllBlocksCleared" for e in decode_batch(message[1])[1]):
            return sub, message[0]


def collect(sub, until, last_seq, timeout=5.0):
    """Events from the live stream until one satisfies until; checks seq has no gap.
    Returns (events, [(seq, payload)])."""
    events, messages = [], []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = sub.recv(100)
        if message is None:
            continue
        seq, payload = message
        assert seq == last_seq + 1, "sequence gap: %d after %d" % (seq, last_seq)
        last_seq = seq
        messages.append(message)
        batch_events = decode_batch(payload)[1]
        events.extend(batch_events)
        if any(until(e) for e in batch_events):
            return events, messages
    raise AssertionError("the awaited event never came; got %r" % events)


def template_key(hex_hash, tp=0, pp=0):
    return "m@tp_rank:%d@pcp0@dcp0@pp_rank:%d@group:0@%s" % (tp, pp, hex_hash)


def brief(event):
    """(type, hash, ranks) of an event, for comparing sequences."""
    if event["type"] == "AllBlocksCleared":
        return ("AllBlocksCleared",)
    ranks = (event.get("kvpool_tp_rank"), event.get("kvpool_pp_rank"))
    return (event["type"], event["block_hashes"][0], ranks)


def test_workload_in_order_with_template_hashes():
    d = events_daemon("--segment-size", "64MiB")
    try:
        raw = Raw(d.endpoint)
        sub, last_seq = subscribed(d, raw)
        digest = hashlib.sha256(b"block-0").digest()
        hex_hash = digest.hex()
        # vLLM's int block hash of this digest (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).
        vllm_hash = int.from_bytes(digest, "big") & U64
        assert raw.put("plain-1", b"a" * 4096) == OK
        assert raw.put(template_key(hex_hash), b"b" * 4096) == OK
        assert raw.put(template_key("00ff", tp=1, pp=2), b"c") == OK
        assert raw.put("plain-2", b"d") == OK
        assert raw.put("plain-2", b"again") != OK  # exists: no event
        assert raw.remove("plain-1") == OK
        reply, _ = raw.call(pb.UPSERT, ["plain-2"], [b"new"])
        assert reply.statuses[0] == OK  # the old value goes, the new one comes
        upserted = reply.versions[0]
        assert raw.remove("never-there") != OK  # no event
        reply, _ = raw.call(pb.REMOVE_ALL, force=True)
        assert reply.status == OK and reply.count == 3
        events, messages = collect(sub, lambda e: e["type"] == "AllBlocksCleared", last_seq)
        assert [brief(e) for e in events] == [
            ("BlockStored", b"plain-1", (None, None)),
            ("BlockStored", vllm_hash, (0, 0)),
            ("BlockStored", 0xff, (1, 2)),
            ("BlockStored", b"plain-2", (None, None)),
            ("BlockRemoved", b"plain-1", (None, None)),
            ("BlockRemoved", b"plain-2", (None, None)),
            ("BlockStored", b"plain-2", (None, None)),
            ("AllBlocksCleared",),
        ]
        # Each stored and removed event names the object's version (kvpool's own key): the
        # removal of plain-2's first value names that value's, the upsert's a new one.
        versions = [e.get("kvpool_version") for e in events[:7]]
        assert all(versions) and len(set(versions[:4])) == 4, versions
        assert versions[5] == versions[3] and versions[6] == upserted not in versions[:6], versions
        stored = events[0]
        assert stored["parent_block_hash"] is None and stored["token_ids"] == []
        assert stored["block_size"] == 16 and stored["medium"] == "shared_storage"
        # A remove-all that leaves leased objects behind says which went, key by key.
        assert raw.put("kept", b"k") == OK and raw.put("gone", b"g") == OK
        assert raw.exist("kept")  # a read: leased for --lease-ttl
        reply, _ = raw.call(pb.REMOVE_ALL)
        assert reply.status == OK and reply.count == 1
        events, _ = collect(sub, lambda e: e["type"] == "BlockRemoved", messages[-1][0])
        assert [brief(e) for e in events] == [
            ("BlockStored", b"kept", (None, None)),
            ("BlockStored", b"gone", (None, None)),
            ("BlockRemoved", b"gone", (None, None)),
        ]
        raw.close()
        sub.close()
    finally:
        d.finish()


def test_replay_recovers_a_dropped_range():
    d = events_daemon("--segment-size", "64MiB", "--kv-events-replay-size", "1000",
                      "--kv-events-interval", "1")
    try:
        raw = Raw(d.endpoint)
        sub, last_seq = subscribed(d, raw)
        for i in range(12):  # one batch each: the gathering interval is 1 ms
            assert raw.put("r-%02d" % i, b"x") == OK
            time.sleep(0.01)
        reply, _ = raw.call(pb.REMOVE_ALL, force=True)
        _, messages = collect(sub, lambda e: e["type"] == "AllBlocksCleared", last_seq)
        assert len(messages) >= 4
        # Pretend batches 2..4 of those were lost (the PUB socket's high-water mark): the
        # subscriber sees the gap and asks the replay service from the first missing seq.
        kept = messages[:2] + messages[5:]
        missing_from = messages[2][0]
        assert kept[2][0] - kept[1][0] == 4  # the gap it saw
        got = replay(d.kv_events_replay, missing_from)
        # Every batch from there on, oldest first, byte for byte what PUB sent.
        assert got == messages[2:]
        recovered = sorted(kept + [m for m in got if m[0] < kept[2][0]])
        assert recovered == messages
        # From 0: the whole stream since start, the probes and their clear included.
        everything = replay(d.kv_events_replay, 0)
        assert [s for s, _ in everything] == list(range(len(everything)))
        assert everything[-len(messages):] == messages
        # From past the end: only the end marker.
        assert replay(d.kv_events_replay, messages[-1][0] + 1) == []
        # A malformed request is dropped; the service still answers.
        bad = zmq.Context.instance().socket(zmq.DEALER)
        bad.linger = 0
        bad.connect(d.kv_events_replay)
        bad.send_multipart([b"", b"short"])
        bad.send_multipart([b"", b"x" * 8, b"extra"])
        assert not bad.poll(200)
        bad.close()
        assert replay(d.kv_events_replay, messages[-1][0]) == messages[-1:]
        raw.close()
        sub.close()
    finally:
        d.finish()


def test_replay_older_than_the_ring():
    d = events_daemon("--segment-size", "64MiB", "--kv-events-replay-size", "4",
                      "--kv-events-interval", "1")
    try:
        raw = Raw(d.endpoint)
        for i in range(10):
            assert raw.put("o-%02d" % i, b"x") == OK
            time.sleep(0.01)
        assert wait_for(lambda: len(replay(d.kv_events_replay, 0)) == 4)
        got = replay(d.kv_events_replay, 0)
        # The ring keeps the newest 4: the first seq is later than asked for (the sign
        # llm-d takes to reset its index), and they follow each other.
        first = got[0][0]
        assert first > 0 and [s for s, _ in got] == list(range(first, first + 4))
        assert decode_batch(got[-1][1])[1][-1]["block_hashes"] == [b"o-09"]
        raw.close()
    finally:
        d.finish()


def test_eviction_gives_removed_events():
    d = events_daemon("--segment-size", "32MiB")
    try:
        raw = Raw(d.endpoint)
        sub, last_seq = subscribed(d, raw)
        keys = ["ev-%03d" % i for i in range(24)]  # 24 x 2 MiB = 1.5 x the pool
        for key in keys:
            assert raw.put(key, hashlib.sha256(key.encode()).digest() * (2 * MiB // 32)) == OK
        missing = [k for k in keys if not raw.exist(k)]
        assert missing, "nothing was evicted from a pool written 1.5 times over"
        raw.call(pb.REMOVE_ALL, force=True)
        events, _ = collect(sub, lambda e: e["type"] == "AllBlocksCleared", last_seq)
        stored = [e["block_hashes"][0] for e in events if e["type"] == "BlockStored"]
        removed = [e["block_hashes"][0] for e in events if e["type"] == "BlockRemoved"]
        assert stored == [k.encode() for k in keys]
        assert sorted(removed) == sorted(k.encode() for k in missing)
        # Each key's removal comes after its store.
        order = [brief(e) for e in events]
        for key in missing:
            assert order.index(("BlockStored", key.encode(), (None, None))) < order.index(
                ("BlockRemoved", key.encode(), (None, None)))
        raw.close()
        sub.close()
    finally:
        d.finish()


def test_segment_loss_gives_removed_events():
    from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig

    d = events_daemon("--segments", "0")
    stores = []
    try:
        def mount(name):
            store = MooncakeDistributedStore()
            assert store.setup(name, "unused", 16 * MiB, 0, "tcp", "", d.endpoint) == 0
            stores.append(store)
            return store

        a = mount("a:1")
        raw = Raw(d.endpoint)
        sub, last_seq = subscribed(d, raw)
        assert a.put("only-a", b"x" * 1000) == 0  # the only memory there is: a's
        b = mount("b:1")
        config = ReplicateConfig()
        config.replica_num = 2
        assert b.put("both", b"y" * 1000, config) == 0  # one replica in each
        assert a.close() == 0  # its segment goes, with "only-a" (and "both"'s replica there)
        stores.remove(a)
        assert not raw.exist("only-a") and raw.exist("both")
        assert raw.remove("both", force=True) == OK
        events, _ = collect(sub, lambda e: brief(e)[:2] == ("BlockRemoved", b"both"), last_seq)
        assert [brief(e)[:2] for e in events] == [
            ("BlockStored", b"only-a"), ("BlockStored", b"both"),
            ("BlockRemoved", b"only-a"), ("BlockRemoved", b"both")]
        raw.close()
        sub.close()
    finally:
        for store in stores:
            store.close()
        d.finish()


def test_put_start_and_end_over_ipc():
    d = events_daemon("--segment-size", "64MiB")
    try:
        raw = Raw(d.endpoint)
        sub, last_seq = subscribed(d, raw)
        before = raw.stats()
        local = Raw(d.ipc)  # the shared-memory operations: the same machine, over ipc
        reply, _ = local.call(pb.PUT_START, ["two-phase", "revoked"], sizes=[4096, 4096])
        assert list(reply.statuses) == [OK, OK]
        # Reserved, not visible: nothing is published for either key yet.
        assert raw.put("marker-1", b"m") == OK
        events, last = collect(sub, lambda e: brief(e)[:2] == ("BlockStored", b"marker-1"),
                               last_seq)
        assert [brief(e)[:2] for e in events] == [("BlockStored", b"marker-1")]
        last_seq = last[-1][0]
        reply, _ = local.call(pb.PUT_END, ["two-phase"])
        assert reply.status == OK
        reply, _ = local.call(pb.PUT_REVOKE, ["revoked"])
        assert reply.status == OK
        assert raw.exist("two-phase") and not raw.exist("revoked")
        assert raw.put("marker-2", b"m") == OK
        events, _ = collect(sub, lambda e: brief(e)[:2] == ("BlockStored", b"marker-2"),
                            last_seq)
        assert [brief(e)[:2] for e in events] == [
            ("BlockStored", b"two-phase"), ("BlockStored", b"marker-2")]
        after = raw.stats()
        assert after.kv_events - before.kv_events == 3  # marker-1, two-phase, marker-2
        assert after.kv_events_dropped == 0
        local.close()
        raw.close()
        sub.close()
    finally:
        d.finish()


def test_no_endpoint_no_events():
    d = Kvpoold("--segment-size", "16MiB")
    try:
        assert d.kv_events is None and d.kv_events_replay is None
        raw = Raw(d.endpoint)
        assert raw.put("k", b"v") == OK
        raw.close()
        assert "kv events" not in d.log_text()
    finally:
        d.finish()
