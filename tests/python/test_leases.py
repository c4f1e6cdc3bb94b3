"""A read's lease lasts exactly --lease-ttl, whatever path the read took (issue 10, item 1).

A read grants its object a lease: a remove without force is refused (OBJECT_HAS_LEASE) until
--lease-ttl after the read, and succeeds after it. Reads take many paths through kvpoold and
libkvpool, and each must lease the same way:

  tcp get        a raw GET over tcp of a value too large for the api's index reads: the
                 replica-manager's GET
  tcp exist      EXIST / GET_SIZE over tcp of a key the read index does not hold (too long
                 for a slot): the replica-manager's
  node index     a raw GET / EXIST / GET_SIZE over tcp of a small published value: the api
                 answers from the read index itself and stamps the read
  client index   kvpool.Client on the node's machine reading a published key from the read
                 index with no round trip: libkvpool stamps the read
  replica list   kvpool.Client reading a key the index does not hold: GET_REPLICA_LIST with
                 a pin, then RELEASE (and a raw GET_REPLICA_LIST without a pin)
  lookup         the admin channel's lookup (vLLM's LookupKeyClient): an index hit is stamped
  touch          the TOUCH operation (old clients' lease renewal): exactly the TTL, no more

With --lease-ttl 500, a remove sent so that it is answered before 500 ms after the read began
must fail, and one sent 550 ms after the read returned must succeed (the lease ends within the
few milliseconds of the stamp's clock, never a second later as it used to). A later read never
shortens a lease. The margins hold on a noisy 2-core machine: the early remove is judged only
when its answer came back before the lease could have ended (otherwise the round is run
again), and the late one is sent 50 ms after the latest moment the lease can end.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import os
import time

import msgpack
import pytest
import zmq

import kvpool

from kvpool_daemon import Kvpoold  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402 (the generated protocol module)

OK = 0
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
BUFFER_OVERFLOW = -10

TTL = 0.5           # --lease-ttl 500
EARLY = 0.05        # a remove this long before the lease ends must be refused...
LATE = 0.05         # ... and one this long after it must succeed
SLACK = 0.005       # the stamp's clock counts whole milliseconds
ROUNDS = 4          # rounds a noisy machine may spoil before the test gives up
MODEL = "leases"
BIG = 100 * 1024    # more than the api's index reads copy (64 KiB): the replica-manager's GET
LONG = "L" * 230    # keys longer than an index slot holds (216 bytes) are never published


@pytest.fixture(scope="module")
def daemon():
    d = Kvpoold("--lease-ttl", str(int(TTL * 1000)), "--segment-size", "64MiB",
                "--lookup-model", MODEL, "--lookup-block-size", "16",
                admins=("tcp://127.0.0.1:*",), prefix="kvpool-leases-test-")
    yield d
    alive = d.alive()
    rc = d.stop()
    log = d.log_text(4000)
    d.remove()
    assert alive, "kvpoold died during the tests:\n" + log
    assert rc == 0, "kvpoold exited with %s:\n%s" % (rc, log)


@pytest.fixture(scope="module")
def raw(daemon):
    r = Raw(daemon.endpoint)
    yield r
    r.close()


@pytest.fixture(scope="module")
def local(daemon):
    """A raw client on the node's ipc endpoint: same machine, same user (shared-memory ops)."""
    r = Raw(daemon.ipc)
    yield r
    r.close()


@pytest.fixture(scope="module")
def client(daemon):
    c = kvpool.Client(daemon.endpoint)
    assert c.fast_path, "the test needs libkvpool's same-machine path"
    yield c
    c.close()


_counter = [0]


def fresh(prefix="k"):
    _counter[0] += 1
    return "%s-%d-%d" % (prefix, os.getpid(), _counter[0])


def sleep_until(deadline):
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.02))


def check_lease(raw, put, read, name):
    """put() makes a fresh object and returns its key; read(key) reads it once by the path
    under test. The read leases the object for exactly TTL: a remove answered before
    read start + TTL - SLACK is refused; one sent LATE after read end + TTL succeeds."""
    for _ in range(ROUNDS):
        key = put()
        start = time.monotonic()
        read(key)
        end = time.monotonic()
        if end - start > EARLY / 2:
            raw.remove(key, force=True)
            continue                      # the read itself was slow: inconclusive
        sleep_until(end + TTL - EARLY)
        early = raw.remove(key)
        answered = time.monotonic()
        sleep_until(end + TTL + LATE)
        late = raw.remove(key)
        if answered > start + TTL - SLACK:
            if late != OK:
                raw.remove(key, force=True)
            continue                      # answered too late to judge: run again
        assert early == OBJECT_HAS_LEASE, "%s: removed %.0f ms after the read" % (
            name, (answered - end) * 1000)
        assert late == OK, "%s: still leased %.0f ms after the read (status %d)" % (
            name, (time.monotonic() - end) * 1000, late)
        return
    pytest.fail("%s: the machine was too busy to judge the lease in %d rounds" % (name, ROUNDS))


def put_small(raw, prefix="small"):
    def put():
        key = fresh(prefix)
        assert raw.put(key, b"s" * 1000) == OK
        return key
    return put


def put_big(raw):
    def put():
        key = fresh("big")
        assert raw.put(key, b"b" * BIG) == OK
        return key
    return put


def put_long(raw):
    def put():
        key = LONG + fresh()
        assert raw.put(key, b"l" * 5000) == OK
        return key
    return put


# ---- the replica-manager's reads ---------------------------------------------------------

def test_tcp_get(raw):
    def read(key):
        status, value = raw.get(key)
        assert status == OK and value == b"b" * BIG
    check_lease(raw, put_big(raw), read, "tcp get")


def test_tcp_exist_and_get_size(raw):
    def exist(key):
        assert raw.status(pb.EXIST, key) == OK
    check_lease(raw, put_long(raw), exist, "tcp exist")

    def get_size(key):
        reply, _ = raw.call(pb.GET_SIZE, [key])
        assert reply.status == OK and reply.sizes[0] == 5000
    check_lease(raw, put_long(raw), get_size, "tcp get_size")


def test_touch_leases_exactly_the_ttl(raw):
    # What a same-machine client of an earlier version sends for its index reads: the lease
    # runs the TTL from the touch, not a second more.
    def touch(key):
        assert raw.status(pb.TOUCH, key) == OK
    check_lease(raw, put_small(raw), touch, "touch")


# ---- the node's own index reads ----------------------------------------------------------

def test_node_index_reads(raw):
    before = raw.index_gets()

    def get(key):
        status, value = raw.get(key)
        assert status == OK and value == b"s" * 1000
    check_lease(raw, put_small(raw), get, "node index get")
    assert raw.index_gets() > before, "the GET did not take the api's index path"

    def exist(key):
        assert raw.status(pb.EXIST, key) == OK
    check_lease(raw, put_small(raw), exist, "node index exist")

    def get_size(key):
        reply, _ = raw.call(pb.GET_SIZE, [key])
        assert reply.status == OK and reply.sizes[0] == 1000
    check_lease(raw, put_small(raw), get_size, "node index get_size")


# ---- a same-machine client's reads -------------------------------------------------------

def test_client_index_reads(raw, client):
    before = raw.index_gets()

    def get(key):
        assert client.get(key) == b"s" * 1000
    check_lease(raw, put_small(raw), get, "client index get")

    buf = bytearray(1000)

    def get_into(key):
        assert client.get_into(key, buf) == 1000
    check_lease(raw, put_small(raw), get_into, "client index get_into")

    def exist(key):
        assert client.exist(key)
    check_lease(raw, put_small(raw), exist, "client index exist")
    # The client reported its index reads (a TOUCH that carries their count).
    deadline = time.monotonic() + 5
    while raw.index_gets() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert raw.index_gets() > before, "the client's reads did not come from the index"


def test_replica_list_reads(raw, local, client):
    # libkvpool's get of a key the index lacks: GET_REPLICA_LIST (pinned), copy, RELEASE.
    def get(key):
        assert client.get(key) == b"l" * 5000
    check_lease(raw, put_long(raw), get, "client replica-list get")

    # A raw GET_REPLICA_LIST without a pin.
    def listed(key):
        reply, _ = local.call(pb.GET_REPLICA_LIST, [key])
        assert reply.status == OK and reply.statuses[0] == OK and reply.replicas[0].replicas
    check_lease(raw, put_long(raw), listed, "replica list")


def test_lookup_hits(daemon, raw):
    admin = zmq.Context.instance().socket(zmq.REQ)
    admin.linger = 0
    admin.rcvtimeo = 10000
    admin.connect(daemon.admin)

    def put():
        digest = os.urandom(32)
        key = "%s@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%s" % (MODEL, digest.hex())
        assert raw.put(key, b"k" * 100) == OK
        return key

    def lookup(key):
        admin.send_multipart([b"lookup", (16).to_bytes(4, "big"),
                              msgpack.packb([key.rsplit("@", 1)[1]])])
        assert int.from_bytes(admin.recv(), "big") == 16
    try:
        check_lease(raw, put, lookup, "lookup")
    finally:
        admin.close()


# ---- a later read never shortens a lease --------------------------------------------------

def test_later_reads_only_lengthen(raw, client):
    # The case: a get from the index, then a get_into that fails for a small buffer
    # (it goes through GET_REPLICA_LIST). The lease runs TTL from the later read, and never
    # ends before TTL after the first.
    small = bytearray(10)
    for _ in range(ROUNDS):
        key = put_small(raw)()
        first_start = time.monotonic()
        assert client.get(key) == b"s" * 1000
        time.sleep(0.2)
        with pytest.raises(kvpool.BufferOverflowError):
            client.get_into(key, small)
        second_end = time.monotonic()
        sleep_until(second_end + TTL - EARLY)
        early = raw.remove(key)
        answered = time.monotonic()
        sleep_until(second_end + TTL + LATE)
        late = raw.remove(key)
        if answered > second_end + TTL - SLACK - 0.01 or second_end - first_start > 0.3:
            if late != OK:
                raw.remove(key, force=True)
            continue
        assert early == OBJECT_HAS_LEASE
        assert late == OK
        break
    else:
        pytest.fail("the machine was too busy to judge the lease")

    # Reads on different paths: the replica-manager's (tcp, large value) first, the index
    # (the client's own read) 200 ms later. The lease is the later one's, whichever path
    # the removal's check looks at first.
    for _ in range(ROUNDS):
        key = put_big(raw)()
        assert raw.get(key)[0] == OK
        time.sleep(0.2)
        start = time.monotonic()
        assert client.get(key) == b"b" * BIG
        end = time.monotonic()
        sleep_until(end + TTL - EARLY)
        early = raw.remove(key)
        answered = time.monotonic()
        sleep_until(end + TTL + LATE)
        late = raw.remove(key)
        if answered > start + TTL - SLACK:
            if late != OK:
                raw.remove(key, force=True)
            continue
        assert early == OBJECT_HAS_LEASE
        assert late == OK
        break
    else:
        pytest.fail("the machine was too busy to judge the lease")


def test_remove_all_and_regex_see_index_leases(raw, client):
    # Removals of many objects look at the index's read stamps too.
    keys = [fresh("many") for _ in range(3)]
    for key in keys:
        assert raw.put(key, b"m" * 100) == OK
    assert client.get(keys[0]) == b"m" * 100
    reply, _ = raw.call(pb.REMOVE_BY_REGEX, pattern="^many-%d-" % os.getpid())
    assert reply.status == OK and reply.count == 2
    assert raw.status(pb.EXIST, keys[0]) == OK
    time.sleep(TTL + LATE)
    assert client.get(keys[0]) == b"m" * 100     # leased again
    reply, _ = raw.call(pb.REMOVE_ALL)
    assert raw.status(pb.EXIST, keys[0]) == OK
    time.sleep(TTL + LATE)
    reply, _ = raw.call(pb.REMOVE_ALL)
    assert reply.status == OK
    assert raw.status(pb.EXIST, keys[0]) == OBJECT_NOT_FOUND
