"""End-to-end tests of kvpoold's lookup/reset admin channel (lookup_server/, DESIGN section 6).

Each test talks to a real kvpoold on loopback, started by the fixtures below with an ephemeral
client port, an ephemeral tcp admin port plus an ipc admin endpoint, and --lookup-* options.
Keys are put with raw pyzmq and the generated protobuf module (python/kvpool/kvpool_pb2.py,
loaded by path so the package's __init__ is not needed). Lookups are framed exactly as vLLM's
Mooncake store connector's LookupKeyClient frames them: a REQ socket, then
  tagged msgpack   [b"lookup"][token_len: 4 bytes big-endian][msgpack list of hex strings]
  tagged binary    [b"lookup"][token_len][hash_len: 2 bytes big-endian][raw hashes]
  untagged         [token_len][msgpack list of hex strings]
and the reply is one frame, the hit token count as 4 bytes big-endian (b"\\x00" on an error).

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
Every wait is bounded; the daemons are killed in teardown.
"""

import json
import os
import random
import struct
import subprocess
import sys
import time

import msgpack
import pytest
import zmq

def _wire_keys(keys):
    """Keys as the wire carries them: bytes (str keys are UTF-8 encoded)."""
    return [k.encode() if isinstance(k, str) else k for k in keys]


TIMEOUT_MS = 10000


from kvpool_daemon import Kvpoold  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402 (the generated protocol module)


# ---- the daemon --------------------------------------------------------------------------

def start_daemon(lookup_args):
    """kvpoold with the given --lookup-* options: .endpoint, .admin (tcp), .admin_ipc."""
    ipc = "ipc://@kvpool-lookup-test-%d-%d" % (os.getpid(), random.randrange(1 << 30))
    d = Kvpoold("--segment-size", "64MiB", *lookup_args, admins=("tcp://127.0.0.1:*", ipc),
                prefix="kvpool-lookup-test-")
    assert d.admin_ipc == ipc
    assert not d.admin.endswith(":*")
    return d


def stop_daemon(d):
    """Stops the daemon; returns the tail of its log (the files are removed)."""
    try:
        d.stop(timeout=10)
    finally:
        text = d.log_text(4000)
        d.remove()
    return text


MODEL = "lookup-test"
BLOCK = 16


@pytest.fixture(scope="module")
def daemon():
    d = start_daemon(["--lookup-model", MODEL, "--lookup-tp-size", "2",
                "--lookup-block-size", str(BLOCK)])
    yield d
    alive = d.alive()
    log = stop_daemon(d)
    assert alive, "kvpoold died during the tests:\n" + log


@pytest.fixture(scope="module")
def daemon_pp():
    """Another engine's key template, 2 tp x 2 pp ranks, pcp/dcp ranks, 4-token blocks."""
    d = start_daemon(["--lookup-model", "other",
                "--lookup-key-template", "{model}/{hash}/tp{tp}/pp{pp}/c{pcp}d{dcp}",
                "--lookup-tp-size", "2", "--lookup-pp-size", "2",
                "--lookup-pcp-rank", "1", "--lookup-dcp-rank", "3",
                "--lookup-block-size", "4"])
    yield d
    alive = d.alive()
    log = stop_daemon(d)
    assert alive, "kvpoold died during the tests:\n" + log


# ---- the store, over its client protocol -------------------------------------------------

class Store:
    """A raw protocol-v1 client (DEALER, no delimiter, as libkvpool does)."""

    def __init__(self, endpoint):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        self.sock.connect(endpoint)
        self.next_id = 1

    def send(self, op, keys=(), values=(), **fields):
        request_id = self.next_id
        self.next_id += 1
        request = pb.Request(version=1, request_id=request_id, op=op, keys=_wire_keys(keys),
                             **fields)
        self.sock.send_multipart([request.SerializeToString()] + list(values))
        return request_id

    def recv(self):
        frames = self.sock.recv_multipart()
        reply = pb.Reply()
        reply.ParseFromString(frames[0])
        return reply

    def call(self, op, keys=(), values=(), **fields):
        request_id = self.send(op, keys, values, **fields)
        while True:
            reply = self.recv()
            if reply.request_id == request_id:
                return reply

    def put(self, keys, value=b"v" * 64):
        reply = self.call(pb.PUT, keys, [value] * len(keys))
        assert reply.status == 0, reply.error
        return list(reply.statuses)

    def exist(self, keys):
        reply = self.call(pb.EXIST, keys)
        assert reply.status == 0, reply.error
        return [s == 0 for s in reply.statuses]

    def close(self):
        self.sock.close(0)


def key(model, tp, h, pp=0, pcp=0, dcp=0, group=0):
    """The connector's key today (--lookup-key-scheme current, the default)."""
    return "%s@tp_rank:%d@pcp%d@dcp%d@pp_rank:%d@group:%d@%s" % (model, tp, pcp, dcp, pp, group,
                                                                 h.hex())


def new_hashes(n, size=32):
    return [os.urandom(size) for _ in range(n)]


# ---- the admin channel, as vLLM frames it ------------------------------------------------

class Admin:
    def __init__(self, endpoint, kind=zmq.REQ):
        self.sock = zmq.Context.instance().socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        self.sock.connect(endpoint)

    def ask(self, frames):
        self.sock.send_multipart(frames)
        reply = self.sock.recv_multipart()
        assert len(reply) == 1, reply
        return reply[0]

    def lookup(self, token_len, hashes, form="msgpack"):
        tl = token_len.to_bytes(4, "big")
        if form == "msgpack":
            reply = self.ask([b"lookup", tl, msgpack.packb([h.hex() for h in hashes])])
        elif form == "untagged":
            reply = self.ask([tl, msgpack.packb([h.hex() for h in hashes])])
        else:  # binary, or binary with vLLM's apply_eagle frame ("eagle0", "eagle1")
            size = len(hashes[0]) if hashes else 0
            frames = [b"lookup", tl, size.to_bytes(2, "big"), b"".join(hashes)]
            if form.startswith("eagle"):
                frames.append(bytes([int(form[-1])]))
            reply = self.ask(frames)
        assert len(reply) == 4, "lookup failed: %r" % reply
        return int.from_bytes(reply, "big")

    def lookup_all_forms(self, token_len, hashes, binary=None):
        """The msgpack forms' hit. The binary forms (with or without the apply_eagle frame:
        the daemon runs no EAGLE) must answer `binary` (default: the same): they follow
        vLLM's newest rule, whole blocks within token_len and never all of it."""
        hits = {form: self.lookup(token_len, hashes, form)
                for form in ("msgpack", "untagged", "binary", "eagle0", "eagle1")}
        assert hits["msgpack"] == hits["untagged"], hits
        expected = hits["msgpack"] if binary is None else binary
        assert hits["binary"] == hits["eagle0"] == hits["eagle1"] == expected, hits
        return hits["msgpack"]

    def reset(self):
        return self.ask([b"reset"])

    def stats(self):
        return json.loads(self.ask([b"stats"]))

    def close(self):
        self.sock.close(0)


@pytest.fixture
def store(daemon):
    s = Store(daemon.endpoint)
    yield s
    s.close()


@pytest.fixture
def admin(daemon):
    a = Admin(daemon.admin)
    yield a
    a.close()


# ---- lookups -----------------------------------------------------------------------------

def test_ping_and_unknown_tags(admin):
    assert admin.ask([b"ping"]) == b"\x01"
    assert admin.ask([b"pong"]) == b"\x00"
    assert admin.ask([b"LOOKUP"]) == b"\x00"
    assert admin.ask([b"ping"]) == b"\x01"


def test_lookup_every_form_partial_ranks_and_miss_in_the_middle(store, admin):
    h = new_hashes(5)
    # Blocks 0, 1 on both tp ranks; block 2 on rank 0 only; blocks 3, 4 on both.
    keys = [key(MODEL, tp, h[b]) for b in range(5) for tp in (0, 1) if b != 2 or tp == 0]
    assert store.put(keys) == [0] * len(keys)
    # The partial block ends the prefix: 2 blocks x 16 tokens.
    assert admin.lookup_all_forms(1000, h) == 32
    # Without block 2 the three full blocks count.
    assert admin.lookup_all_forms(1000, [h[0], h[1], h[3]]) == 48
    # A first block that is missing: nothing, whatever follows.
    assert admin.lookup_all_forms(1000, [new_hashes(1)[0]] + h[:2]) == 0
    assert admin.lookup_all_forms(1000, h[2:]) == 0
    # The same block on the other rank only.
    lone = new_hashes(1)
    assert store.put([key(MODEL, 1, lone[0])]) == [0]
    assert admin.lookup_all_forms(1000, lone + h[:2]) == 0


def test_token_len_shorter_than_stored_blocks(store, admin):
    h = new_hashes(4)
    keys = [key(MODEL, tp, x) for x in h for tp in (0, 1)]
    assert store.put(keys) == [0] * len(keys)
    assert admin.lookup_all_forms(64, h, binary=48) == 64  # binary: never every token
    assert admin.lookup_all_forms(1000, h) == 64
    assert admin.lookup_all_forms(40, h, binary=32) == 40   # capped at token_len
    assert admin.lookup_all_forms(16, h, binary=0) == 16
    assert admin.lookup_all_forms(1, h, binary=0) == 1
    assert admin.lookup_all_forms(0, h) == 0
    # The largest token_len the frame can carry.
    assert admin.lookup_all_forms(0xFFFFFFFF, h) == 64


def test_empty_list(admin):
    assert admin.lookup_all_forms(100, []) == 0
    assert admin.lookup_all_forms(0, []) == 0
    # hash_len 0 and an empty frame; a real hash_len and an empty frame.
    assert admin.ask([b"lookup", (100).to_bytes(4, "big"), b"\x00\x00", b""]) == b"\x00" * 4
    assert admin.ask([b"lookup", (100).to_bytes(4, "big"), b"\x00\x20", b""]) == b"\x00" * 4


def test_hash_sizes_and_uppercase_hex(store, admin):
    # vLLM hashes are 32 bytes; other engines use other sizes (all hashes of one binary
    # lookup share hash_len).
    for size in (8, 16, 64):
        h = new_hashes(3, size)
        assert store.put([key(MODEL, tp, x) for x in h for tp in (0, 1)]) == [0] * 6
        assert admin.lookup_all_forms(100, h) == 48
    h = new_hashes(2)
    assert store.put([key(MODEL, tp, x) for x in h for tp in (0, 1)]) == [0] * 4
    upper = msgpack.packb([x.hex().upper() for x in h])
    assert admin.ask([b"lookup", (100).to_bytes(4, "big"), upper]) == (32).to_bytes(4, "big")


def test_ipc_endpoint_and_many_clients_at_once(daemon, store):
    h = new_hashes(8)
    assert store.put([key(MODEL, tp, x) for x in h for tp in (0, 1)]) == [0] * 16
    ipc = Admin(daemon.admin_ipc)
    try:
        assert ipc.lookup_all_forms(1000, h) == 128
    finally:
        ipc.close()
    # Many REQ clients with a request out each, then all replies: each gets its own answer.
    clients = [Admin(daemon.admin if i % 2 else daemon.admin_ipc) for i in range(12)]
    try:
        for i, c in enumerate(clients):
            c.sock.send_multipart([b"lookup", (i * 10 + 5).to_bytes(4, "big"),
                                   msgpack.packb([x.hex() for x in h])])
        for i, c in enumerate(clients):
            assert int.from_bytes(c.sock.recv(), "big") == min(i * 10 + 5, 128)
    finally:
        for c in clients:
            c.close()
    # A DEALER client (no REQ envelope but the empty delimiter it adds itself) works too.
    dealer = Admin(daemon.admin, zmq.DEALER)
    try:
        dealer.sock.send_multipart([b"", b"ping"])
        assert dealer.sock.recv_multipart() == [b"", b"\x01"]
    finally:
        dealer.close()


def test_lookup_grants_a_read_lease(store, admin):
    h = new_hashes(1)
    keys = [key(MODEL, tp, h[0]) for tp in (0, 1)]
    assert store.put(keys) == [0, 0]
    assert admin.lookup(100, h) == 16
    # A remove that is not forced must respect the lease the lookup took.
    reply = store.call(pb.REMOVE, keys[:1], force=False)
    assert list(reply.statuses) == [pb.OBJECT_HAS_LEASE], reply
    reply = store.call(pb.REMOVE, keys[:1], force=True)
    assert list(reply.statuses) == [0], reply
    assert admin.lookup(100, h) == 0


def test_pp_ranks_and_custom_template(daemon_pp):
    s, a = Store(daemon_pp.endpoint), Admin(daemon_pp.admin)
    try:
        def k(h, tp, pp):
            return "other/%s/tp%d/pp%d/c1d3" % (h.hex(), tp, pp)
        h = new_hashes(4)
        ranks = [(tp, pp) for tp in (0, 1) for pp in (0, 1)]
        keys = [k(x, tp, pp) for x in h[:3] for tp, pp in ranks]
        keys += [k(h[3], tp, pp) for tp, pp in ranks if (tp, pp) != (1, 1)]
        assert s.put(keys) == [0] * len(keys)
        assert a.lookup_all_forms(100, h) == 12  # 3 blocks x 4 tokens; block 3 lacks tp1/pp1
        assert a.lookup_all_forms(10, h, binary=8) == 10
        assert s.put([k(h[3], 1, 1)]) == [0]
        assert a.lookup_all_forms(100, h) == 16
        # Keys of the default template do not count here.
        g = new_hashes(1)
        assert s.put([key("other", tp, g[0], pp) for tp in (0, 1) for pp in (0, 1)]) == [0] * 4
        assert a.lookup_all_forms(100, g) == 0
    finally:
        s.close()
        a.close()


# ---- every form vLLM has sent, as each version frames it (docs/lookup.md) --------------

def vllm_frames(form, num_tokens, hashes, block=BLOCK):
    """A lookup as vLLM's LookupKeyClient of each era sends it:
    A #40900 (2026-05-13): untagged, token_len aligned by the client, msgpack hex list
    B #42694 (05-27): b"lookup", aligned token_len, msgpack hex list
    C #45969 (06-20): b"lookup", aligned token_len, hash_len u16, raw hashes
    D #49481 (07-23): as C but the raw token count (the server aligns)
    E (lookahead hashing): D plus the one-byte apply_eagle flag (0 here: hashes cover it)"""
    aligned = num_tokens // block * block
    hexes = msgpack.packb([h.hex() for h in hashes])
    blob = [len(hashes[0]).to_bytes(2, "big") if hashes else b"\0\0", b"".join(hashes)]
    if form == "A":
        return [aligned.to_bytes(4, "big"), hexes]
    if form == "B":
        return [b"lookup", aligned.to_bytes(4, "big"), hexes]
    if form == "C":
        return [b"lookup", aligned.to_bytes(4, "big")] + blob
    if form == "D":
        return [b"lookup", num_tokens.to_bytes(4, "big")] + blob
    return [b"lookup", num_tokens.to_bytes(4, "big")] + blob + [b"\0"]


def vllm_hit(admin, form, num_tokens, hashes):
    """The hit as each client era decodes and then lowers it (A-C lower a full hit)."""
    reply = admin.ask(vllm_frames(form, num_tokens, hashes))
    assert len(reply) == 4, reply  # one 4-byte frame: what every client decodes
    hit = int.from_bytes(reply, "big")
    if form in "ABC" and hit == num_tokens:
        hit = max(0, (num_tokens - 1) // BLOCK * BLOCK)
    return hit


def test_every_vllm_form_as_its_client_sends_it(store, admin):
    h = new_hashes(6)
    store.put([key(MODEL, tp, x) for x in h[:4] for tp in (0, 1)])
    # 70 tokens: four whole blocks stored, the prompt goes on; every era hits 64.
    for form in "ABCDE":
        expected = 48 if form == "C" else 64  # C: an aligned 64 may not hit every token
        assert vllm_hit(admin, form, 70, h) == expected, form
    # An aligned prompt whose every block is stored: never every token (the engine must
    # compute one), in every era.
    for form in "ABCDE":
        assert vllm_hit(admin, form, 64, h[:4]) == 48, form
    # The apply_eagle frame is one byte 0 or 1; anything else is refused with b"\x00".
    bad = vllm_frames("E", 70, h)
    bad[-1] = b"\x02"
    assert admin.ask(bad) == b"\x00"
    bad[-1] = b"\x00\x00"
    assert admin.ask(bad) == b"\x00"


def test_an_eagle_deployment_drops_the_last_block():
    d = start_daemon(["--lookup-model", MODEL, "--lookup-eagle"])
    s, a = Store(d.endpoint), Admin(d.admin)
    try:
        h = new_hashes(5)
        s.put([key(MODEL, 0, x) for x in h[:4]])
        assert vllm_hit(a, "D", 100, h) == 48          # four blocks, the last one dropped
        assert vllm_hit(a, "B", 96, h) == 48
        assert int.from_bytes(a.ask(vllm_frames("E", 100, h)), "big") == 64  # flag 0: kept
        assert vllm_hit(a, "D", 16, h) == 0             # one block, dropped
    finally:
        s.close()
        a.close()
        stop_daemon(d)


def test_key_schemes_and_hash_blocks():
    # Blocks of 16 tokens, hashes of 4: a block's key carries its last hash (current) or its
    # four hashes concatenated (group); v1 keys have no group; a cache prefix leads.
    h = new_hashes(12)  # 3 blocks of 4 hashes
    cases = [
        (["--lookup-key-scheme", "current", "--lookup-hash-block-size", "4",
          "--lookup-cache-prefix", "pfx", "--lookup-group", "1"],
         lambda b: "pfx@%s@tp_rank:0@pcp0@dcp0@pp_rank:0@group:1@%s" % (MODEL, h[4 * b + 3].hex())),
        (["--lookup-key-scheme", "group", "--lookup-hash-block-size", "4"],
         lambda b: "%s@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%s"
         % (MODEL, b"".join(h[4 * b:4 * b + 4]).hex())),
        (["--lookup-key-scheme", "v1"],
         lambda b: "%s@tp_rank:0@pcp0@dcp0@pp_rank:0@%s" % (MODEL, h[b].hex())),
    ]
    for args, block_key in cases:
        d = start_daemon(["--lookup-model", MODEL] + args)
        s, a = Store(d.endpoint), Admin(d.admin)
        try:
            s.put([block_key(0), block_key(1)])
            hashes = h if "v1" not in args else h[:3]
            assert vllm_hit(a, "D", 1000, hashes) == 32, args
            assert vllm_hit(a, "B", 1000 // 16 * 16, hashes) == 32, args
        finally:
            s.close()
            a.close()
            stop_daemon(d)
    # A hash block that does not divide the block, or v1 with several hashes a block, stops
    # the daemon at start with the reason.
    for args in (["--lookup-hash-block-size", "5"],
                 ["--lookup-key-scheme", "v1", "--lookup-hash-block-size", "4"],
                 ["--lookup-key-scheme", "v7"]):
        with pytest.raises(Exception):
            d = start_daemon(args)
            stop_daemon(d)


def test_stats(store, admin):
    before = admin.stats()
    for field in ("objects", "bytes_used", "lookups_served", "hit_tokens", "resets"):
        assert isinstance(before[field], int), (field, before)
    h = new_hashes(2)
    assert store.put([key(MODEL, tp, x) for x in h for tp in (0, 1)]) == [0] * 4
    assert admin.lookup(100, h) == 32
    after = admin.stats()
    assert after["objects"] >= before["objects"] + 4
    assert after["bytes_used"] >= before["bytes_used"] + 4 * 64
    assert after["lookups_served"] == before["lookups_served"] + 1
    assert after["hit_tokens"] == before["hit_tokens"] + 32


# ---- never dies on input -----------------------------------------------------------------

def malformed_requests():
    tl = (16).to_bytes(4, "big")
    one = msgpack.packb(["abcd"])
    return [
        [b"hello"], [b""], [b"lookupx", tl, one], [b"Lookup", tl, one],
        [b"reset", b"extra"], [b"ping", b""], [b"stats", b"x"],
        [b"lookup"], [b"lookup", tl],                                  # missing frames
        [b"lookup", tl, b"\x00\x01", b"a", b"extra"],                  # an extra frame
        [tl], [tl, one, b"extra"],                                     # untagged, wrong count
        [b"lookup", b"\x00\x10", one], [b"lookup", b"\x00\x00\x00\x00\x10", one],
        [b"\x00\x10", one], [b"\x00\x00\x00\x00\x10", one],            # token_len not 4 bytes
        [b"lookup", tl, b"\x01", b"a"], [b"lookup", tl, b"\x00\x00\x01", b"a"],  # hash_len size
        [b"lookup", tl, b""], [b"lookup", tl, b"\x92\xa2ab"],          # bad msgpack
        [b"lookup", tl, b"\xc1"], [b"lookup", tl, one + b"\x00"],
        [b"lookup", tl, msgpack.packb({"a": "b"})], [tl, b"\xdc\x00"],
        [b"lookup", tl, msgpack.packb([1, 2])],                        # non-string entries
        [b"lookup", tl, msgpack.packb([b"\xab\xcd"], use_bin_type=True)],
        [b"lookup", tl, msgpack.packb([["ab"]])], [tl, msgpack.packb([None])],
        [b"lookup", tl, msgpack.packb(["xyz1"])], [b"lookup", tl, msgpack.packb(["abc"])],
        [b"lookup", tl, msgpack.packb([""])], [tl, msgpack.packb(["ab", "g0"])],  # not hex
        [b"lookup", tl, b"\x00\x04", b"abcdefg"],                      # not a multiple
        [b"lookup", tl, b"\x00\x00", b"x"],                            # hash_len 0 with data
        [b"lookup", tl, b"\xdd\xff\xff\xff\xff"],                      # 4e9 entries, 5 bytes
        [b"lookup", tl, b"\x00\x01", b"\x00" * 1000001],               # too many hashes
        [b"lookup", tl, b"\xdd\x00\x0f\x42\x41" + b"\xa2ab" * 1000001],
        [b"lookup", tl, msgpack.packb(["ab" * 40000])],                # key past the limit
        [b"lookup"] + [b""] * 20,                                      # many frames
    ]


def test_malformed_sweep_then_a_valid_lookup(daemon, store, admin):
    h = new_hashes(3)
    assert store.put([key(MODEL, tp, x) for x in h for tp in (0, 1)]) == [0] * 6
    before = admin.stats()
    bad = malformed_requests()
    for frames in bad:
        assert admin.ask(frames) == b"\x00", frames[:3]
    # Random garbage whose first frame is never a tag nor 4 bytes long.
    rng = random.Random(1234)
    for _ in range(300):
        frames = [bytes([0xFF]) + rng.randbytes(rng.choice([0, 1, 2, 4, 5, 7, 40]))]
        frames += [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(0, 5))]
        assert admin.ask(frames) == b"\x00"
    # A client that sends and goes away before the reply.
    for _ in range(5):
        gone = Admin(daemon.admin)
        gone.sock.send_multipart([b"lookup", (100).to_bytes(4, "big"),
                                  msgpack.packb([x.hex() for x in h])])
        gone.close()
    assert daemon.alive()
    assert admin.ask([b"ping"]) == b"\x01"
    assert admin.lookup_all_forms(1000, h) == 48
    after = admin.stats()
    assert after["refused_requests"] >= before["refused_requests"] + len(bad) + 300


# ---- reset -------------------------------------------------------------------------------

def test_reset_removes_everything_then_new_puts_stay(store, admin):
    h = new_hashes(3)
    keys = [key(MODEL, tp, x) for x in h for tp in (0, 1)]
    assert store.put(keys) == [0] * 6
    assert admin.lookup(100, h) == 48   # also takes read leases: the reset is forced past them
    resets = admin.stats()["resets"]
    assert admin.reset() == b"\x01"
    assert admin.lookup_all_forms(100, h) == 0
    assert store.exist(keys) == [False] * 6
    stats = admin.stats()
    assert stats["objects"] == 0 and stats["resets"] == resets + 1
    assert store.put(keys) == [0] * 6
    assert admin.lookup_all_forms(100, h) == 48


HAMMER_WINDOW = 4          # PUT requests in flight at once
HAMMER_BATCH = 4           # keys per PUT
HAMMER_VALUE = 2048        # bytes per value
HAMMER_MAX_KEYS = 16000    # at most 32 MiB in the 64 MiB segment: no eviction


def hammer(endpoint, log_path, ready_path, stop_path):
    """Puts as fast as it can, HAMMER_WINDOW requests in flight, until stop_path exists (or
    20 s pass). Every 10 replies it writes how many it has had into ready_path (first after
    20 successful ones). At the end it writes one JSON line per request into log_path: keys,
    send and reply times (time.monotonic_ns, CLOCK_MONOTONIC: the same clock as the test's),
    per-key statuses."""
    store = Store(endpoint)
    value = os.urandom(HAMMER_VALUE)
    sent = {}
    done = []
    serial = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stopping = os.path.exists(stop_path) or serial >= HAMMER_MAX_KEYS
        if not stopping and len(sent) < HAMMER_WINDOW:
            keys = ["hammer-%d-%06d" % (os.getpid(), serial + i) for i in range(HAMMER_BATCH)]
            serial += HAMMER_BATCH
            request_id = store.send(pb.PUT, keys, [value] * len(keys))
            sent[request_id] = (keys, time.monotonic_ns())
            continue
        if not sent:
            if stopping:
                break
            continue
        reply = store.recv()
        now = time.monotonic_ns()
        keys, started = sent.pop(reply.request_id)
        done.append({"keys": keys, "sent": started, "replied": now,
                     "status": reply.status, "statuses": list(reply.statuses)})
        if len(done) % 10 == 0 and sum(1 for d in done if d["status"] == 0) >= 20:
            with open(ready_path + ".tmp", "w") as file:
                file.write(str(len(done)))
            os.replace(ready_path + ".tmp", ready_path)
    with open(log_path, "w") as file:
        for d in done:
            file.write(json.dumps(d) + "\n")
    store.close()


def hammer_progress(path):
    with open(path) as file:
        return int(file.read() or 0)


def test_reset_with_puts_in_flight_from_another_process(daemon, admin, store, tmp_path):
    log, ready, stop = (str(tmp_path / n) for n in ("log", "ready", "stop"))
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "hammer",
                             daemon.endpoint, log, ready, stop])
    try:
        deadline = time.monotonic() + 15
        while not os.path.exists(ready) and time.monotonic() < deadline:
            assert proc.poll() is None, "the hammer died"
            time.sleep(0.01)
        assert os.path.exists(ready), "the hammer made no progress"
        time.sleep(0.1)
        reset_sent = time.monotonic_ns()
        assert admin.reset() == b"\x01"
        reset_replied = time.monotonic_ns()
        # Let the hammer answer a few more requests, so some were sent after the reply.
        replies = hammer_progress(ready)
        deadline = time.monotonic() + 10
        while hammer_progress(ready) < replies + 4 * HAMMER_WINDOW and \
                time.monotonic() < deadline:
            assert proc.poll() is None, "the hammer died"
            time.sleep(0.01)
        open(stop, "w").close()
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0
    with open(log) as file:
        done = [json.loads(line) for line in file]

    before, after, straddling = [], [], []
    for d in done:
        ok_keys = [k for k, s in zip(d["keys"], d["statuses"]) if d["status"] == 0 and s == 0]
        if d["replied"] < reset_sent:
            before += ok_keys             # accepted and answered before the reset was asked
        elif d["sent"] > reset_replied:
            after += ok_keys              # started after the reset's reply
        else:
            straddling += d["keys"]       # either side of the reset: both outcomes are right
    assert len(before) >= 20, "no put finished before the reset"
    assert len(after) > 0, "no put started after the reset's reply"
    present = dict(zip(before + after, store.exist(before + after)))
    survivors = [k for k in before if present[k]]
    assert survivors == [], "put before the reset, still there after it: %s" % survivors[:5]
    lost = [k for k in after if not present[k]]
    assert lost == [], "put after the reset's reply, gone: %s" % lost[:5]
    # Nothing of what was in the store before the reset is left, apart from the puts that
    # were in flight around it and those made after it.
    allowed = set(after) | set(straddling)
    stats = admin.stats()
    assert stats["objects"] <= len(allowed), (stats, len(allowed))
    # And the pool is clean for the tests that follow.
    assert admin.reset() == b"\x01"
    assert admin.stats()["objects"] == 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "hammer":
        hammer(*sys.argv[2:6])
    else:
        sys.exit("usage: test_lookup.py hammer ENDPOINT LOG READY STOP")
