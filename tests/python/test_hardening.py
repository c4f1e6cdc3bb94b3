"""Hostile and unlucky same-machine clients against the real kvpoold (issue: hardening).

Each test drives real client processes ("agents": this file run as a program, answering JSON
commands on stdin) against a real kvpoold, stops them with SIGSTOP or kills them with SIGKILL
in the middle of the shared-memory protocols, and checks with a digest of every byte that no
other object was touched and that everything the dead left behind is released.

- who may use the shared-memory operations: tcp clients never; ipc clients of another user
  never; a process mounts only its own memory, commits, revokes and releases only its own
  reservations and pins, unmounts only its own segments, and never the node's;
- a writer stopped past --put-timeout, or past a reset, never writes into another object;
- a reader stopped past its lease and a forced remove still copies the bytes it was promised;
- a reader or writer killed mid-protocol leaves nothing behind.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import hashlib
import json
import mmap
import os
import signal
import subprocess
import sys
import time

import pytest
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


from kvpool_daemon import Kvpoold, bin_dir, wait_for  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402 (the generated protocol module)

OK = 0
PERMISSION_DENIED = -604
INVALID_WRITE = -700
INVALID_READ = -701
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
TRANSFER_FAIL = -800

PUT_TIMEOUT_MS = 400
LEASE_MS = 300


def pattern(seed, size):
    """size bytes that depend on seed (a digest chain, so no two objects look alike)."""
    out = bytearray()
    block = hashlib.sha256(str(seed).encode()).digest()
    while len(out) < size:
        out += block
        block = hashlib.sha256(block).digest()
    return bytes(out[:size])


# ---- a raw protocol client ---------------------------------------------------------------

# ---- an agent: a client process of its own, driven over stdin ----------------------------

def agent_main(endpoint):
    """Runs in a child process: one JSON command a line in, one JSON answer a line out."""
    raw = Raw(endpoint, zmq.Context())
    maps = {}
    memfds = []
    copied = bytearray()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        answer = {}
        if op == "call":
            fields = dict(cmd.get("fields", {}))
            if "segment" in fields:
                fields["segment"] = pb.Segment(**fields["segment"])
            reply, _ = raw.call(getattr(pb, cmd["name"]), cmd.get("keys", []), **fields)
            answer = {"status": reply.status, "statuses": list(reply.statuses),
                      "error": reply.error,
                      "replicas": [[(r.segment_id, r.offset) for r in k.replicas]
                                   for k in reply.replicas],
                      "segments": [s.id for s in reply.segments]}
        elif op == "map":
            for seg in raw.segments():
                if not seg.owner and seg.id not in maps:  # the node's own: a sealed memfd
                    fd = os.open(seg.name, os.O_RDWR)
                    maps[seg.id] = mmap.mmap(fd, seg.size)
                    os.close(fd)
            answer = {"mapped": sorted(maps)}
        elif op == "write":
            data = pattern(cmd["seed"], cmd["end"])[cmd["start"]:cmd["end"]]
            base = cmd["offset"]
            maps[cmd["segment_id"]][base + cmd["start"]:base + cmd["end"]] = data
        elif op == "copy":
            base = cmd["offset"]
            copied += maps[cmd["segment_id"]][base + cmd["start"]:base + cmd["end"]]
        elif op == "digest":
            answer = {"sha": hashlib.sha256(bytes(copied)).hexdigest(), "size": len(copied)}
            copied = bytearray()
        elif op == "memfd":
            fd = os.memfd_create("kvpool-agent", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, cmd["size"])
            os.posix_fallocate(fd, 0, cmd["size"])
            import fcntl
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            memfds.append(fd)
            answer = {"name": "/proc/%d/fd/%d" % (os.getpid(), fd)}
        elif op == "pid":
            answer = {"pid": os.getpid()}
        answer["done"] = op
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class Agent:
    def __init__(self, endpoint, user=None):
        def demote():
            if user is not None:
                os.setgid(user)
                os.setuid(user)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--agent",
                                      endpoint], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, preexec_fn=demote,
                                     env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "python")))
        self.pid = self.proc.pid

    def send(self, op, **args):
        self.proc.stdin.write(json.dumps(dict(op=op, **args)) + "\n")
        self.proc.stdin.flush()

    def answer(self):
        line = self.proc.stdout.readline()
        assert line, "agent died"
        return json.loads(line)

    def do(self, op, **args):
        self.send(op, **args)
        return self.answer()

    def call(self, name, keys=(), **fields):
        return self.do("call", name=name, keys=list(keys), fields=fields)

    def stop(self):
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.pid, signal.SIGCONT)

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


# ---- the daemon --------------------------------------------------------------------------

def start_daemon(*extra):
    """kvpoold with short put and lease timeouts: .endpoint (tcp), .ipc, .admin."""
    return Kvpoold("--segment-size", "8MiB", "--put-timeout", str(PUT_TIMEOUT_MS),
                   "--lease-ttl", str(LEASE_MS), *extra, prefix="kvpool-hardening-")


@pytest.fixture
def daemon():
    d = start_daemon()
    yield d
    assert d.stop() == 0, d.log_text()
    d.remove()


def fill(raw, prefix, size, limit=10000):
    """Puts objects of `size` until the pool is full; returns {key: seed}. They are hard-pinned:
    the evictor may not make room by dropping them, so the pool does fill up."""
    stored = {}
    for i in range(limit):
        key = "%s/%d" % (prefix, i)
        status = raw.put(key, pattern(key, size), put=pb.PutOptions(hard_pin=True))
        if status == NO_AVAILABLE_HANDLE:
            break
        assert status == OK, status
        stored[key] = key
    return stored


def verify(raw, stored, size):
    """Every stored object reads back whole and exact; returns the number checked."""
    for key, seed in stored.items():
        status, value = raw.get(key)
        assert status == OK, (key, status)
        assert value == pattern(seed, size), "wrong bytes in %s" % key
    return len(stored)


# ---- who may do what ---------------------------------------------------------------------

def test_tcp_clients_cannot_touch_shared_memory(daemon):
    raw = Raw(daemon.endpoint)
    assert raw.put("t/a", b"secret" * 1000) == OK
    for op in (pb.PUT_END, pb.PUT_REVOKE, pb.GET_REPLICA_LIST, pb.RELEASE):
        reply, _ = raw.call(op, ["t/a"])
        assert reply.status == PERMISSION_DENIED and "ipc endpoint" in reply.error
    reply, _ = raw.call(pb.PUT_START, ["t/b"], sizes=[1 << 20])
    assert reply.status == PERMISSION_DENIED
    reply, _ = raw.call(pb.UNMOUNT_SEGMENT, segment=pb.Segment(id=1))
    assert reply.status == PERMISSION_DENIED
    reply, _ = raw.call(pb.PING)
    assert reply.local_endpoint == daemon.ipc
    # Nothing changed: the node's segment is still there and the value readable.
    assert len(raw.segments()) == 1
    assert raw.get("t/a") == (OK, b"secret" * 1000)
    raw.close()


def test_puts_by_address_read_only_the_asking_process(daemon):
    """PUT with vm_addrs: the node reads each value from the memory of the process the
    kernel names as the ipc peer. Not for tcp clients; an address that is not the process's
    memory, or a read that would end after the client's deadline, fails that key alone and
    stores nothing; a request that does not add up is refused whole."""
    import ctypes
    data = bytes(range(256)) * 40
    buf = ctypes.create_string_buffer(data, len(data))
    addr = ctypes.addressof(buf)
    tcp = Raw(daemon.endpoint)
    reply, _ = tcp.call(pb.PUT, ["va/tcp"], sizes=[len(data)], vm_addrs=[addr])
    assert reply.status == PERMISSION_DENIED and "ipc endpoint" in reply.error
    assert tcp.get("va/tcp")[0] == OBJECT_NOT_FOUND
    tcp.close()
    raw = Raw(daemon.ipc)
    reply, _ = raw.call(pb.PUT, ["va/good", "va/bad", "va/empty", "va/part"],
                        sizes=[len(data), 4096, 0, 100], vm_addrs=[addr, 4096, 0, addr + 7])
    assert reply.status == OK and list(reply.statuses) == [OK, TRANSFER_FAIL, OK, OK]
    assert raw.get("va/good") == (OK, data)
    assert raw.get("va/bad")[0] == OBJECT_NOT_FOUND
    assert raw.get("va/empty") == (OK, b"")
    assert raw.get("va/part") == (OK, data[7:107])
    # A value read by the node's copy pool a megabyte a task (over 1 MiB), whose last
    # megabyte is not mapped: the whole value fails, nothing is stored; mapped, it is whole.
    mib = 1 << 20
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    base = libc.mmap(None, 4 * mib, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value)
    ctypes.memset(base, ord("r"), 3 * mib)
    assert libc.munmap(base + 3 * mib, mib) == 0
    reply, _ = raw.call(pb.PUT, ["va/whole"], sizes=[3 * mib], vm_addrs=[base])
    assert list(reply.statuses) == [OK]
    assert raw.get("va/whole") == (OK, b"r" * (3 * mib))
    reply, _ = raw.call(pb.PUT, ["va/torn"], sizes=[3 * mib], vm_addrs=[base + mib])
    assert list(reply.statuses) == [TRANSFER_FAIL]
    assert raw.get("va/torn")[0] == OBJECT_NOT_FOUND
    libc.munmap(base, 3 * mib)
    # The client's deadline is past before the read ends: nothing stored.
    reply, _ = raw.call(pb.PUT, ["va/late"], sizes=[len(data)], vm_addrs=[addr],
                        vm_deadline_ns=1)
    assert list(reply.statuses) == [TRANSFER_FAIL] and "deadline" in reply.error
    assert raw.get("va/late")[0] == OBJECT_NOT_FOUND
    # Requests that do not add up, or ops that take no values by address.
    for op, keys, fields, values in (
            (pb.PUT, ["va/x"], dict(sizes=[10], vm_addrs=[addr, addr]), []),
            (pb.PUT, ["va/x"], dict(vm_addrs=[addr]), []),
            (pb.PUT, ["va/x"], dict(sizes=[3], vm_addrs=[addr]), [b"abc"]),
            (pb.UPSERT, ["va/x"], dict(sizes=[10], vm_addrs=[addr]), []),
            (pb.GET, ["va/good"], dict(vm_addrs=[addr]), [])):
        reply, _ = raw.call(op, keys, values, **fields)
        assert reply.status == INVALID_PARAMS, (op, fields, reply)
    assert raw.get("va/x")[0] == OBJECT_NOT_FOUND
    raw.close()


def test_removed_bytes_never_reach_another_client(daemon):
    """Item 7: a tcp client cannot reserve space and commit whatever was there before."""
    raw = Raw(daemon.endpoint)
    assert raw.put("secret", b"S" * (1 << 20)) == OK
    reply, _ = raw.call(pb.REMOVE, ["secret"], force=True)
    assert reply.statuses[0] == OK
    reply, _ = raw.call(pb.PUT_START, ["probe"], sizes=[1 << 20])
    assert reply.status == PERMISSION_DENIED
    assert raw.status(pb.PUT_END, "probe") == PERMISSION_DENIED
    assert raw.get("probe")[0] == OBJECT_NOT_FOUND
    raw.close()


def opens_as(user, path):
    """Whether a process of user (uid and gid) can open path read-only."""
    probe = subprocess.run(
        [sys.executable, "-c", "import os,sys; os.setgid(%d); os.setuid(%d); os.open(sys.argv[1], "
         "os.O_RDONLY)" % (user, user), path], capture_output=True, timeout=30)
    return probe.returncode == 0


def test_other_users_are_refused_on_the_ipc_endpoint(daemon):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    nobody = 65534
    agent = Agent(daemon.ipc, user=nobody)
    try:
        answer = agent.call("PING")
        assert answer["status"] == OK  # PING says where to go, nothing more
        answer = agent.call("EXIST", ["x"])
        assert answer["status"] == PERMISSION_DENIED and "user 65534" in answer["error"]
        answer = agent.call("PUT_START", ["x"], sizes=[4096])
        assert answer["status"] == PERMISSION_DENIED
    finally:
        agent.close()
    # ... and the node's shared memory is its user's alone: sealed memfds that another user
    # cannot even open.
    raw = Raw(daemon.endpoint)
    for seg in raw.segments():
        assert not opens_as(nobody, seg.name), seg.name
    raw.close()


def test_group_widens_access_to_one_group():
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    nobody = 65534  # user nobody, group nogroup
    d = start_daemon("--group", str(nobody))
    try:
        raw = Raw(d.endpoint)
        # The group gets the ipc endpoint, not the node's memory (shm/segment.c: a group
        # member who could open a segment could truncate it and kill the node).
        for seg in raw.segments():
            assert not opens_as(nobody, seg.name), seg.name
        agent = Agent(d.ipc, user=nobody)
        try:
            assert agent.call("EXIST", ["x"])["statuses"] == [OBJECT_NOT_FOUND]
            assert agent.call("PUT_START", ["g/x"], sizes=[4096])["statuses"] == [OK]
            # A put by address is for the node's own user only: a group member's process
            # could be read with the node's rights, not its own.
            answer = agent.call("PUT", ["g/y"], sizes=[16], vm_addrs=[4096])
            assert answer["status"] == PERMISSION_DENIED and "own user" in answer["error"]
        finally:
            agent.close()
        raw.close()
    finally:
        d.stop()
        d.remove()


def test_mount_only_own_memory_and_unmount_only_own_segments(daemon):
    """Item 2 and 8: another process's memfd, the node's segments, another's segment."""
    owner = Agent(daemon.ipc)
    intruder = Agent(daemon.ipc)
    raw = Raw(daemon.endpoint)
    try:
        name = owner.do("memfd", size=4 << 20)["name"]
        # The intruder names the owner's descriptor: refused, nothing opened.
        answer = intruder.call("MOUNT_SEGMENT", segment={"name": name, "size": 4 << 20})
        assert answer["status"] == PERMISSION_DENIED and "its own memory" in answer["error"]
        assert len(raw.segments()) == 1
        # The owner mounts it; the segment is the owner's, by pid.
        answer = owner.call("MOUNT_SEGMENT", segment={"name": name, "size": 4 << 20,
                                                       "owner": ""})
        assert answer["status"] == OK, answer
        seg_id = answer["segments"][0]
        listed = {s.id: s for s in raw.segments()}
        assert listed[seg_id].owner.startswith("pid:%d/" % owner.pid)
        # Nobody else unmounts it, and nobody unmounts the node's own segment.
        answer = intruder.call("UNMOUNT_SEGMENT", segment={"id": seg_id})
        assert answer["status"] == PERMISSION_DENIED and "another process" in answer["error"]
        node_seg = [s.id for s in raw.segments() if not s.owner][0]
        for agent in (owner, intruder):
            answer = agent.call("UNMOUNT_SEGMENT", segment={"id": node_seg})
            assert answer["status"] == PERMISSION_DENIED and "node's own" in answer["error"]
        assert len(raw.segments()) == 2
        assert raw.put("still/works", b"v" * 5000) == OK
        # Its owner dies: the segment goes with it.
        owner.kill()
        assert wait_for(lambda: len(raw.segments()) == 1, 5), raw.segments()
    finally:
        owner.close()
        intruder.close()
        raw.close()


def test_reservations_and_pins_belong_to_their_process(daemon):
    """Item 8: another process can neither commit, revoke nor release what A holds."""
    a = Agent(daemon.ipc)
    b = Agent(daemon.ipc)
    raw = Raw(daemon.endpoint)
    try:
        assert a.call("PUT_START", ["own/k"], sizes=[4096])["statuses"] == [OK]
        for name in ("PUT_END", "PUT_REVOKE"):
            answer = b.call(name, ["own/k"])
            assert answer["statuses"] == [INVALID_WRITE]
            assert "another client" in answer["error"]
        assert raw.get("own/k")[0] == OBJECT_NOT_FOUND
        assert a.call("PUT_END", ["own/k"])["statuses"] == [OK]
        assert raw.get("own/k")[0] == OK
        # A pins it; B's RELEASE does not drop A's pin.
        assert a.call("GET_REPLICA_LIST", ["own/k"], pin=True)["statuses"] == [OK]
        assert b.call("RELEASE", ["own/k"])["statuses"] == [INVALID_READ]
        time.sleep(LEASE_MS / 1000 + 0.1)
        assert raw.status(pb.REMOVE, "own/k") == OBJECT_HAS_LEASE  # A's pin holds
        assert a.call("RELEASE", ["own/k"])["statuses"] == [OK]
        assert raw.status(pb.REMOVE, "own/k") == OK
    finally:
        a.close()
        b.close()
        raw.close()


# ---- stalls and deaths -------------------------------------------------------------------

SIZE = 256 * 1024


def test_stalled_writer_never_writes_into_other_objects(daemon):
    """Item 3: SIGSTOP past --put-timeout, the pool refilled, then SIGCONT: no corruption."""
    writer = Agent(daemon.ipc)
    raw = Raw(daemon.endpoint)
    try:
        answer = writer.call("PUT_START", ["w/stalled"], sizes=[SIZE])
        assert answer["statuses"] == [OK]
        seg, off = answer["replicas"][0][0]
        writer.do("map")
        writer.send("write", segment_id=seg, offset=off, start=0, end=SIZE // 2, seed="junk")
        writer.answer()
        writer.stop()
        time.sleep(PUT_TIMEOUT_MS / 1000 + 0.4)
        # Revoked for everyone else: the key is free, and the pool fills up around it.
        assert raw.stats().pending_puts == 0
        stored = fill(raw, "w/other", SIZE)
        assert len(stored) > 10
        writer.resume()
        # The writer finishes its copy into the space it was given, then commits: refused.
        writer.send("write", segment_id=seg, offset=off, start=SIZE // 2, end=SIZE, seed="junk")
        writer.answer()
        assert verify(raw, stored, SIZE) == len(stored)
        answer = writer.call("PUT_END", ["w/stalled"])
        assert answer["statuses"] == [INVALID_WRITE] and "revoked" in answer["error"]
        assert raw.get("w/stalled")[0] == OBJECT_NOT_FOUND
        # ... and its space is back in the pool now.
        assert raw.put("w/after", pattern("w/after", SIZE)) == OK
    finally:
        writer.close()
        raw.close()


def test_reset_revokes_writes_in_flight(daemon):
    """Item 5: a reset mid-copy: nothing lands after its reply, nobody else is corrupted."""
    writer = Agent(daemon.ipc)
    raw = Raw(daemon.endpoint)
    admin = zmq.Context.instance().socket(zmq.REQ)
    admin.linger = 0
    admin.rcvtimeo = 10000
    admin.connect(daemon.admin)
    try:
        answer = writer.call("PUT_START", ["r/inflight"], sizes=[SIZE])
        seg, off = answer["replicas"][0][0]
        writer.do("map")
        writer.do("write", segment_id=seg, offset=off, start=0, end=SIZE // 2, seed="late")
        writer.stop()
        admin.send_multipart([b"reset"])
        assert admin.recv() == b"\x01"
        stored = fill(raw, "r/other", SIZE)
        writer.resume()
        writer.do("write", segment_id=seg, offset=off, start=SIZE // 2, end=SIZE, seed="late")
        answer = writer.call("PUT_END", ["r/inflight"])
        assert answer["statuses"] == [INVALID_WRITE]
        assert raw.get("r/inflight")[0] == OBJECT_NOT_FOUND
        assert verify(raw, stored, SIZE) == len(stored)
    finally:
        admin.close()
        writer.close()
        raw.close()


def test_stalled_reader_copies_what_it_was_promised(daemon):
    """Item 4: a reader stopped past its lease, its object force-removed and the space
    wanted by others, still copies exactly its value when it resumes."""
    reader = Agent(daemon.ipc)
    raw = Raw(daemon.endpoint)
    long_key = "s/" + "k" * 400  # too long for the read index: the replica-list path
    try:
        value = pattern(long_key, SIZE)
        assert raw.put(long_key, value) == OK
        answer = reader.call("GET_REPLICA_LIST", [long_key], pin=True)
        assert answer["statuses"] == [OK]
        seg, off = answer["replicas"][0][0]
        reader.do("map")
        reader.do("copy", segment_id=seg, offset=off, start=0, end=SIZE // 2)
        reader.stop()
        time.sleep(LEASE_MS / 1000 + 0.3)
        reply, _ = raw.call(pb.REMOVE, [long_key], force=True)
        assert reply.statuses[0] == OK
        stored = fill(raw, "s/other", SIZE)
        reader.resume()
        reader.do("copy", segment_id=seg, offset=off, start=SIZE // 2, end=SIZE)
        digest = reader.do("digest")
        assert digest["size"] == SIZE
        assert digest["sha"] == hashlib.sha256(value).hexdigest()
        assert reader.call("RELEASE", [long_key])["statuses"] == [OK]
        assert verify(raw, stored, SIZE) == len(stored)
        # The space comes back once the pin is gone.
        assert wait_for(lambda: raw.put("s/after", pattern("s/after", SIZE)) == OK, 3)
    finally:
        reader.close()
        raw.close()


def test_killed_clients_leave_nothing_behind(daemon):
    """Item 6: SIGKILL after GET_REPLICA_LIST(pin), after PUT_START, after MOUNT_SEGMENT."""
    raw = Raw(daemon.endpoint)
    try:
        assert raw.put("k/pinned", pattern("k/pinned", SIZE)) == OK
        before = raw.stats()
        agent = Agent(daemon.ipc)
        assert agent.call("GET_REPLICA_LIST", ["k/pinned"], pin=True)["statuses"] == [OK]
        assert agent.call("PUT_START", ["k/reserved"], sizes=[SIZE])["statuses"] == [OK]
        name = agent.do("memfd", size=4 << 20)["name"]
        assert agent.call("MOUNT_SEGMENT", segment={"name": name, "size": 4 << 20})[
            "status"] == OK
        assert raw.stats().pending_puts == 1 and len(raw.segments()) == 2
        agent.kill()
        time.sleep(LEASE_MS / 1000 + 0.1)
        # Within a bounded time: the pin, the reservation and the segment are gone.
        assert wait_for(lambda: raw.status(pb.REMOVE, "k/pinned") == OK, 4)
        assert wait_for(lambda: raw.stats().pending_puts == 0, 4)
        assert wait_for(lambda: len(raw.segments()) == 1, 4)
        after = raw.stats()
        assert after.bytes_allocated <= before.bytes_allocated
        assert raw.put("k/reserved", b"x" * 10) == OK
    finally:
        raw.close()


@pytest.mark.parametrize("step", ["put-start", "mid-write", "written", "pinned", "mid-read",
                                  "mounted"])
def test_sigkill_at_each_step_releases_everything(daemon, step):
    """Item 6 and the dead-client rule: SIGKILL at each step of the same-machine protocols;
    whatever the process held is released, and every other object is intact."""
    raw = Raw(daemon.endpoint)
    try:
        stored = {}
        for i in range(4):
            key = "step/%s/%d" % (step, i)
            assert raw.put(key, pattern(key, SIZE)) == OK
            stored[key] = key
        agent = Agent(daemon.ipc)
        agent.do("map")
        target = "step/%s/0" % step
        if step in ("put-start", "mid-write", "written"):
            answer = agent.call("PUT_START", ["step/new"], sizes=[SIZE])
            seg, off = answer["replicas"][0][0]
            end = {"put-start": 0, "mid-write": SIZE // 2, "written": SIZE}[step]
            if end:
                agent.do("write", segment_id=seg, offset=off, start=0, end=end, seed="dead")
        elif step in ("pinned", "mid-read"):
            answer = agent.call("GET_REPLICA_LIST", [target], pin=True)
            seg, off = answer["replicas"][0][0]
            if step == "mid-read":
                agent.do("copy", segment_id=seg, offset=off, start=0, end=SIZE // 2)
        else:
            name = agent.do("memfd", size=4 << 20)["name"]
            assert agent.call("MOUNT_SEGMENT", segment={"name": name, "size": 4 << 20})[
                "status"] == OK
        agent.kill()
        time.sleep(LEASE_MS / 1000 + 0.1)
        assert wait_for(lambda: raw.stats().pending_puts == 0, 4)
        assert wait_for(lambda: len(raw.segments()) == 1, 4)
        assert wait_for(lambda: raw.status(pb.REMOVE, target) == OK, 4)
        del stored[target]
        assert raw.get("step/new")[0] == OBJECT_NOT_FOUND
        assert raw.put("step/new", pattern("step/new", SIZE)) == OK
        stored["step/new"] = "step/new"
        assert verify(raw, stored, SIZE) == len(stored)
    finally:
        raw.close()


# ---- resources a client can exhaust -------------------------------------------------------

def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_too_many_value_bytes_in_one_request():
    """Item 11: the limit covers a request's value frames together, not one frame."""
    d = start_daemon("--max-value-size", "1MiB", "--max-request-bytes", "8MiB")
    try:
        raw = Raw(d.endpoint)
        keys = ["big/%d" % i for i in range(40)]
        reply, _ = raw.call(pb.PUT, keys, [b"x" * (1 << 20)] * len(keys))
        assert reply.status == -602 and "--max-request-bytes" in reply.error
        assert raw.get("big/0")[0] == OBJECT_NOT_FOUND
        reply, _ = raw.call(pb.PUT, keys[:4], [b"y" * (1 << 20)] * 4)
        assert list(reply.statuses) == [OK] * 4
        too_many = ["k%d" % i for i in range(101)]
        d2 = None
        reply, _ = raw.call(pb.EXIST, too_many)
        assert reply.status == OK  # the default allows it
        raw.close()
    finally:
        d.stop()
        d.remove()
    d2 = start_daemon("--max-keys", "100")
    try:
        raw = Raw(d2.endpoint)
        reply, _ = raw.call(pb.EXIST, too_many)
        assert reply.status == -600 and "--max-keys" in reply.error
        raw.close()
    finally:
        d2.stop()
        d2.remove()


def test_reply_amplification_costs_frames_not_copies(daemon):
    """Item 12: one 8000-byte key asked 100,000 times in one GET, the reply left unread."""
    raw = Raw(daemon.endpoint)
    assert raw.put("amp/k", b"a" * 8000) == OK
    before = rss_bytes(daemon.proc.pid)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.rcvbuf = 4096
    sock.connect(daemon.endpoint)
    request = pb.Request(version=1, request_id=1, op=pb.GET, keys=[b"amp/k"] * 100000)
    sock.send(request.SerializeToString())
    time.sleep(1.5)
    grown = rss_bytes(daemon.proc.pid) - before
    assert grown < 300 << 20, "RSS grew by %d MB" % (grown >> 20)
    assert raw.get("amp/k") == (OK, b"a" * 8000)  # still serving
    sock.close()
    raw.close()


class SilentDealer:
    """A ZMTP 3.0 DEALER over a plain TCP socket that sends requests and never reads: unlike
    a libzmq socket, nothing on the client side drains the replies into memory."""

    def __init__(self, endpoint):
        import socket
        import struct
        self.struct = struct
        host, port = endpoint[len("tcp://"):].rsplit(":", 1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, int(port)))
        greeting = b"\xff" + b"\x00" * 7 + b"\x01\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\x00")
        greeting += b"\x00" * 32
        body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
        body += b"\x08Identity" + struct.pack(">I", 0)
        self.sock.sendall(greeting + b"\x04" + bytes([len(body)]) + body)
        # The node's greeting and READY, read before any message: a frame that arrives
        # before the handshake ends is taken for a command.
        self._read(64)
        flags, size = self._read(2)
        self._read(size if flags == 4 else struct.unpack(">Q", bytes([size]) + self._read(7))[0])

    def _read(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the node closed the connection during the handshake"
            data += chunk
        return data

    def send(self, data):
        if len(data) < 256:
            frame = b"\x00" + bytes([len(data)]) + data
        else:
            frame = b"\x02" + self.struct.pack(">Q", len(data)) + data
        self.sock.sendall(frame)

    def close(self):
        self.sock.close()


def test_a_client_that_never_reads_loses_its_connection_and_its_pins():
    """Item 13: GETs never read, a forced remove-all: the pinned space comes back."""
    d = start_daemon("--max-unread-bytes", "4MiB")
    try:
        raw = Raw(d.endpoint)
        value = pattern("nr", 2 << 20)
        assert raw.put("nr/k", value) == OK
        silent = SilentDealer(d.endpoint)
        # One reply of 16 MiB: far more than the kernel's socket buffers take off libzmq.
        for i in range(3):
            request = pb.Request(version=1, request_id=i + 1, op=pb.GET, keys=[b"nr/k"] * 8)
            silent.send(request.SerializeToString())
        assert wait_for(lambda: raw.stats().gets >= 8, 5)
        reply, _ = raw.call(pb.REMOVE_ALL, force=True)
        assert reply.count == 1
        assert raw.stats().bytes_allocated >= 2 << 20  # pinned by the unread reply
        # Within CONNECTION_DROP_MS (10 s) plus a sweep the connection is closed and the
        # space freed; the daemon serves everyone else all along.
        assert wait_for(lambda: raw.stats().bytes_allocated == 0, 15)
        assert raw.put("nr/after", value) == OK
        silent.close()
        raw.close()
    finally:
        d.stop()
    assert "replies unread" in d.log_text()
    d.remove()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--agent":
    agent_main(sys.argv[2])


def test_another_user_keeps_the_tcp_connection():
    """libkvpool moves a client on the node's machine to the ipc endpoint only when the node
    lets its user in there: another user (not in --group) stays on tcp and uses whole
    values, instead of being moved and refused everything."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    d = start_daemon()
    try:
        kvpool = os.path.join(bin_dir(), "kvpool")
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        put = subprocess.run(nobody + [kvpool, "-s", d.endpoint, "put", "nobody-key"],
                             input=b"from nobody", capture_output=True, timeout=30)
        assert put.returncode == 0, put.stderr
        get = subprocess.run(nobody + [kvpool, "-s", d.endpoint, "get", "nobody-key"],
                             capture_output=True, timeout=30)
        assert get.returncode == 0 and get.stdout == b"from nobody", get.stderr
        ping = subprocess.run(nobody + [kvpool, "-s", d.endpoint, "ping"], capture_output=True,
                              text=True, timeout=30)
        assert ping.returncode == 0 and "fast path on" not in ping.stdout, ping.stdout
        # The node's own user still moves to the same-machine path.
        ping = subprocess.run([kvpool, "-s", d.endpoint, "ping"], capture_output=True, text=True,
                              timeout=30)
        assert "fast path on" in ping.stdout, ping.stdout
    finally:
        d.finish()
