"""Losing a segment loses only the replicas on it; a node may own no memory at all (issue 10,
items 3 and 4).

- An object with three replicas on three segments that clients mounted survives the unmount of
  two of them, readable with its bytes by every path (libkvpool's read index and replica list,
  the node's index reads, the replica-manager's GET), and is gone with the third.
- A reader that pinned the object before its segment went keeps that replica's space until it
  lets go: the unmount waits for it, the object stays readable from its other replica.
- A client that dies takes only its replicas with it.
- `kvpoold --segments 0` owns no memory: puts fail with NO_AVAILABLE_HANDLE until a client
  mounts some; a client's close() takes its memory and the objects whose only replica was there.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import zmq

import kvpool
from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig

from kvpool_daemon import Kvpoold  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402 (the generated protocol module)

OK = 0
NO_AVAILABLE_HANDLE = -200
OBJECT_NOT_FOUND = -704
MiB = 1 << 20
LONG = "L" * 230    # keys longer than an index slot holds are read through replica lists


def value_of(key, size):
    seed = sum(key.encode()) % 251
    return bytes((seed + i * 7) % 256 for i in range(256)) * (size // 256) + b"t" * (size % 256)


def segment_ids(raw):
    reply, _ = raw.call(pb.SEGMENTS)
    return {s.id for s in reply.segments}


def stop(d):
    alive = d.alive()
    rc = d.stop()
    log = d.log_text(4000)
    d.remove()
    assert alive, "kvpoold died during the tests:\n" + log
    assert rc == 0, "kvpoold exited with %s:\n%s" % (rc, log)


@pytest.fixture(scope="module")
def daemon():
    d = Kvpoold("--segments", "1", "--segment-size", "64MiB", "--lease-ttl", "200",
                prefix="kvpool-segloss-test-")
    yield d
    stop(d)


@pytest.fixture()
def raws(daemon):
    tcp, local = Raw(daemon.endpoint), Raw(daemon.ipc)
    yield tcp, local
    tcp.close()
    local.close()


def read_everywhere(daemon, tcp, client, socket_client, key, value):
    """The object's bytes by every path: libkvpool's index (or replica list, for a long key),
    libkvpool over the socket, raw tcp GET (the api's index reads for small values, the
    replica-manager's GET for large ones), EXIST and GET_SIZE."""
    assert client.get(key) == value
    assert socket_client.get(key) == value
    status, got = tcp.get(key)
    assert status == OK and got == value
    assert client.exist(key) and client.get_size(key) == len(value)
    assert tcp.status(pb.EXIST, key) == OK


def gone_everywhere(tcp, client, socket_client, key):
    assert not client.exist(key)
    assert not socket_client.exist(key)
    assert tcp.status(pb.EXIST, key) == OBJECT_NOT_FOUND
    assert tcp.get(key)[0] == OBJECT_NOT_FOUND
    with pytest.raises(kvpool.ObjectNotFoundError):
        client.get(key)


def test_three_replicas_lose_one_segment_at_a_time(daemon, raws):
    tcp, local = raws
    owner = kvpool.Client(daemon.endpoint)
    reader = kvpool.Client(daemon.endpoint)
    socket_reader = kvpool.Client(daemon.endpoint, fast_path=False)
    segments = [kvpool.SharedSegment(8 * MiB) for _ in range(3)]
    try:
        assert reader.fast_path
        ids = [owner.mount_segment(s.name, s.size) for s in segments]
        opts = kvpool.PutOptions(replica_num=3, preferred_segments=[s.name for s in segments])
        objects = {"seg3-small-%d" % os.getpid(): 1000,        # the api answers from its index
                   "seg3-big-%d" % os.getpid(): 200 * 1024,    # the replica-manager's GET
                   LONG + "seg3-%d" % os.getpid(): 3000}       # never in the index
        for key, size in objects.items():
            owner.put(key, value_of(key, size), options=opts)
            assert local.replica_segments(key) == sorted(ids)
            read_everywhere(daemon, tcp, reader, socket_reader, key, value_of(key, size))
        stored = tcp.stats().bytes_stored
        assert stored >= 3 * sum(objects.values())

        # The first segment holds the replica the index publishes: the object is published
        # again with another one, and reads never miss a beat.
        for lost in range(2):
            owner.unmount_segment(ids[lost])
            assert ids[lost] not in segment_ids(tcp)
            for key, size in objects.items():
                assert local.replica_segments(key) == sorted(ids[lost + 1:])
                read_everywhere(daemon, tcp, reader, socket_reader, key, value_of(key, size))
            assert tcp.stats().bytes_stored == stored - (lost + 1) * sum(objects.values())

        # The last one goes: so do the objects.
        owner.unmount_segment(ids[2])
        for key in objects:
            gone_everywhere(tcp, reader, socket_reader, key)
            assert local.replica_segments(key) is None
        assert tcp.stats().bytes_stored == stored - 3 * sum(objects.values())
    finally:
        for c in (owner, reader, socket_reader):
            c.close()
        for s in segments:
            s.close()


def test_pinned_reader_keeps_the_departing_replica(daemon, raws):
    tcp, local = raws
    unmounter = Raw(daemon.ipc)
    owner = kvpool.Client(daemon.endpoint)
    segments = [kvpool.SharedSegment(8 * MiB) for _ in range(2)]
    try:
        ids = [owner.mount_segment(s.name, s.size) for s in segments]
        key = "pinned-%d" % os.getpid()
        value = value_of(key, 300 * 1024)
        opts = kvpool.PutOptions(replica_num=2, preferred_segments=[s.name for s in segments])
        owner.put(key, value, options=opts)
        # A same-machine reader pins the object (as libkvpool does before it copies).
        reply, _ = local.call(pb.GET_REPLICA_LIST, [key], pin=True)
        assert reply.statuses[0] == OK and len(reply.replicas[0].replicas) == 2
        # Its first segment goes: the unmount waits for the reader, who may be copying from
        # it; the object stays, readable from the other replica.
        request = unmounter.send(pb.UNMOUNT_SEGMENT, segment=pb.Segment(id=ids[0]))
        answer, _ = unmounter.recv(request, timeout_ms=400)
        assert answer is None, "the unmount did not wait for the pinned reader"
        assert local.replica_segments(key) == [ids[1]]
        status, got = tcp.get(key)
        assert status == OK and got == value
        assert owner.get(key) == value
        # ... until the reader lets go.
        assert local.status(pb.RELEASE, key) == OK
        answer, _ = unmounter.recv(request, timeout_ms=5000)
        assert answer is not None and answer.status == OK, answer
        assert ids[0] not in segment_ids(tcp)
        assert owner.get(key) == value
        owner.unmount_segment(ids[1])
        assert tcp.status(pb.EXIST, key) == OBJECT_NOT_FOUND
    finally:
        unmounter.close()
        owner.close()
        for s in segments:
            s.close()


DYING = r"""
import os, sys, time
import kvpool
endpoint, key, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = kvpool.Client(endpoint)
segment = kvpool.SharedSegment(8 << 20)
segment_id = client.mount_segment(segment.name, segment.size)
seed = sum(key.encode()) % 251
value = bytes((seed + i * 7) % 256 for i in range(256)) * (size // 256) + b"t" * (size % 256)
client.put(key, value, options=kvpool.PutOptions(replica_num=2,
                                                 preferred_segments=[segment.name]))
client.put(key + "-alone", value, options=kvpool.PutOptions(preferred_segments=[segment.name]))
print(segment_id, flush=True)
time.sleep(60)
"""


def test_dying_client_takes_only_its_replicas(daemon, raws):
    tcp, local = raws
    key = "dies-%d" % os.getpid()
    size = 50 * 1024
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", DYING, daemon.endpoint, key, str(size)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.strip(), "the client did not start"
        seg = int(line)
        assert seg in local.replica_segments(key) and len(local.replica_segments(key)) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 15
        while seg in segment_ids(tcp) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seg not in segment_ids(tcp), "the dead client's segment is still mounted"
        # The replica on the node's own segment stays; the object with none elsewhere goes.
        assert len(local.replica_segments(key)) == 1 and seg not in local.replica_segments(key)
        status, got = tcp.get(key)
        assert status == OK and got == value_of(key, size)
        assert tcp.status(pb.EXIST, key + "-alone") == OBJECT_NOT_FOUND
        assert tcp.status(pb.REMOVE, key, force=True) == OK
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- a node that owns no memory ------------------------------------------------------------

@pytest.fixture(scope="module")
def bare():
    d = Kvpoold("--segments", "0", "--lease-ttl", "200", prefix="kvpool-bare-test-")
    yield d
    stop(d)


def store_with_memory(endpoint, name, size=16 * MiB):
    store = MooncakeDistributedStore()
    assert store.setup(name, "unused", size, 0, "tcp", "", endpoint) == 0
    return store


def test_node_without_memory(bare):
    tcp = Raw(bare.endpoint)
    client = kvpool.Client(bare.endpoint)
    a = b = None
    try:
        stats = tcp.stats()
        assert stats.segments == 0 and stats.bytes_mounted == 0 and stats.utilisation == 0
        reply, _ = tcp.call(pb.SEGMENTS)
        assert not reply.segments and reply.index_name, "no read index without node memory"
        # Nothing to put into yet.
        reply, _ = tcp.call(pb.PUT, ["early"], [b"x" * 100])
        assert reply.statuses[0] == NO_AVAILABLE_HANDLE and "no segment" in reply.error
        with pytest.raises(kvpool.NoAvailableHandleError):
            client.put("early", b"x" * 100)

        # A client gives memory: everything lands in it.
        a = store_with_memory(bare.endpoint, "a:1")
        only_a = value_of("only-a", 100 * 1024)
        assert a.put("only-a", only_a) == 0
        small = value_of("small", 500)
        client.put("small", small)
        assert tcp.stats().segments == 1
        index_gets = tcp.stats().index_gets
        assert client.get("only-a") == only_a and client.get("small") == small
        assert a.get("only-a") == only_a
        assert tcp.get("small") == (OK, small)
        assert tcp.stats().index_gets > index_gets   # the read index serves them

        # Another gives memory too; a two-replica object lives in both.
        b = store_with_memory(bare.endpoint, "b:1")
        both = value_of("both", 64 * 1024)
        config = ReplicateConfig()
        config.replica_num = 2
        assert b.put("both", both, config) == 0

        # The first one leaves: its objects go, the one with a replica elsewhere stays.
        assert a.close() == 0
        a = None
        assert not client.exist("only-a") and not client.exist("small")
        assert tcp.get("only-a")[0] == OBJECT_NOT_FOUND
        assert client.get("both") == both and tcp.get("both") == (OK, both)
        assert b.get("both") == both

        # The last one leaves: nothing is stored, and nothing can be.
        assert b.close() == 0
        b = None
        assert tcp.get("both")[0] == OBJECT_NOT_FOUND
        stats = tcp.stats()
        assert stats.segments == 0 and stats.objects == 0 and stats.bytes_mounted == 0
        with pytest.raises(kvpool.NoAvailableHandleError):
            client.put("late", b"y" * 100)
    finally:
        for store in (a, b):
            if store is not None:
                store.close()
        client.close()
        tcp.close()
