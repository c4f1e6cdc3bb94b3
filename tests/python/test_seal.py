"""Nothing a node maps can be cut short under it (shm/segment.c: SIGBUS).

A process that truncates a shared-memory object another process has mapped makes that
process's next touch past the new end fault with SIGBUS. kvpoold keeps every object in such
mappings, so an attacker who could truncate one would kill the node. These tests are that
attacker, against a real kvpoold:

- the node's own user (root here, who can open everything): every object the node maps,
  found as /dev/shm/kvpool-<pid>-* names and as the memfds in /proc/<pid>/fd, refuses to
  shrink or grow (EPERM: sealed), and the node serves exact values after;
- a --group member of another user: can open none of them (and the ipc endpoint still
  serves it, over the socket);
- --segment-dir files: the directory is 0700 and the files 0600, the node's user's alone; a
  --group member can open none of them.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from kvpool_daemon import Kvpoold, bin_dir  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402

OK = 0
MiB = 1 << 20
NOBODY = 65534
F_GET_SEALS = 1034
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW = 1, 2, 4

# The attacker, run as some user: for every path given and every object it can find of the
# node (by /dev/shm name, and the memfds among /proc/<pid>/fd), it opens the object read-write
# and tries to shrink it to nothing and to grow it. Prints {path: outcome} as JSON: "opened"
# is never reported alone; "truncated" means the attack worked.
ATTACK = r"""
import errno, json, os, sys
pid, paths = int(sys.argv[1]), sys.argv[2:]
for entry in sorted(os.listdir("/dev/shm")):
    if entry.startswith("kvpool-%d-" % pid):
        paths.append("/dev/shm/" + entry)
try:
    for fd in sorted(os.listdir("/proc/%d/fd" % pid), key=int):
        path = "/proc/%d/fd/%s" % (pid, fd)
        try:
            if os.readlink(path).startswith("/memfd:"):
                paths.append(path)
        except OSError:
            pass
except OSError as e:
    print("cannot list /proc/%d/fd: %s" % (pid, e), file=sys.stderr)
out = {}
for path in paths:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        out[path] = "open: " + errno.errorcode[e.errno]
        continue
    outcome = []
    for length in (0, os.fstat(fd).st_size * 2 + 4096):
        try:
            os.ftruncate(fd, length)
            outcome.append("truncated")
        except OSError as e:
            outcome.append(errno.errorcode[e.errno])
    os.close(fd)
    out[path] = " ".join(outcome)
print(json.dumps(out))
"""


def value(seed, size):
    out = bytearray()
    block = hashlib.sha256(str(seed).encode()).digest()
    while len(out) < size:
        out += block
        block = hashlib.sha256(block).digest()
    return bytes(out[:size])


def setpriv(user, groups=None):
    """The command prefix that runs a command as user (uid = gid = user), in groups (a list
    of gids) or in none."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    if not shutil.which("setpriv"):
        pytest.skip("no setpriv")
    prefix = ["setpriv", "--reuid=%d" % user, "--regid=%d" % user]
    if groups:
        prefix.append("--groups=" + ",".join(str(g) for g in groups))
    else:
        prefix.append("--clear-groups")
    return prefix


def attack(pid, paths=(), prefix=()):
    done = subprocess.run(list(prefix) + [sys.executable, "-c", ATTACK, str(pid)] + list(paths),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def listed(endpoint):
    """The node's own segments' names and its read index's name, as it tells clients."""
    raw = Raw(endpoint)
    reply, _ = raw.call(pb.SEGMENTS)
    names = [s.name for s in reply.segments if not s.owner]
    index = reply.index_name
    raw.close()
    return names, index


def put_and_check(d, keys, size=300 * 1024):
    """Puts keys (new values), reads every one back over the socket (the node reads its
    segments), removes half (the node reads the read stamps), and checks the rest."""
    raw = Raw(d.endpoint)
    for i, key in enumerate(keys):
        assert raw.put(key, value(key, size + i)) == OK, key
    for i, key in enumerate(keys):
        status, got = raw.get(key)
        assert status == OK and got == value(key, size + i), key
    for key in keys[::2]:
        assert raw.remove(key, force=True) == OK, key
    for i, key in enumerate(keys):
        if i % 2:
            status, got = raw.get(key)
            assert status == OK and got == value(key, size + i), key
    raw.close()
    assert d.alive(), d.log_text(4000)


def test_nothing_the_node_maps_can_be_shrunk_or_grown():
    d = Kvpoold("--segment-size", "32MiB", "--segments", "2")
    try:
        put_and_check(d, ["before-%d" % i for i in range(20)])
        names, index = listed(d.endpoint)
        assert len(names) == 2 and index
        # Each is a sealed memfd of the node's, named by its descriptor.
        for name in names + [index]:
            assert name.startswith("/proc/%d/fd/" % d.pid), name
            assert os.readlink(name).startswith("/memfd:"), name
            fd = os.open(name, os.O_RDONLY)
            seals = fcntl.fcntl(fd, F_GET_SEALS)
            os.close(fd)
            want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL
            assert seals & want == want, (name, seals)
        # The node's user (root: it could open anything) attacks all it finds.
        outcome = attack(d.pid, names + [index])
        assert set(names + [index]) <= set(outcome), outcome
        assert len(outcome) >= 4, outcome  # two segments, the index and its read stamps
        worked = {path: how for path, how in outcome.items() if "truncated" in how}
        assert not worked, worked
        assert all(how == "EPERM EPERM" for how in outcome.values()), outcome
        assert not [e for e in os.listdir("/dev/shm") if e.startswith("kvpool-%d-" % d.pid)]
        # The node lives, old values are exact, new ones go in and come back.
        raw = Raw(d.endpoint)
        for i in range(1, 20, 2):
            key = "before-%d" % i
            status, got = raw.get(key)
            assert status == OK and got == value(key, 300 * 1024 + i), key
        raw.close()
        put_and_check(d, ["after-%d" % i for i in range(40)])
    finally:
        d.finish()


def test_a_group_member_reaches_none_of_the_nodes_memory():
    prefix = setpriv(NOBODY, groups=[NOBODY])
    d = Kvpoold("--segment-size", "32MiB", "--group", str(NOBODY))
    try:
        put_and_check(d, ["mine-%d" % i for i in range(10)])
        names, index = listed(d.endpoint)
        outcome = attack(d.pid, names + [index], prefix=prefix)
        assert set(names + [index]) <= set(outcome), outcome
        worked = {path: how for path, how in outcome.items() if "truncated" in how}
        assert not worked, worked
        assert all(how.startswith("open: ") for how in outcome.values()), outcome
        # The group member is still served, over the socket (no fast path).
        kvpool = [os.path.join(bin_dir(), "kvpool"), "-s", d.endpoint]
        ping = subprocess.run(prefix + kvpool + ["ping"], capture_output=True, text=True,
                              timeout=30)
        assert ping.returncode == 0 and "fast path on" not in ping.stdout, ping
        theirs = value("theirs", 200 * 1024)
        put = subprocess.run(prefix + kvpool + ["put", "group-key"], input=theirs,
                             capture_output=True, timeout=30)
        assert put.returncode == 0, put.stderr
        get = subprocess.run(prefix + kvpool + ["get", "group-key"], capture_output=True,
                             timeout=30)
        assert get.returncode == 0 and get.stdout == theirs, get.stderr
        # ... over the ipc endpoint too, which lets the group in.
        get = subprocess.run(prefix + [os.path.join(bin_dir(), "kvpool"), "-s", d.ipc, "get",
                                       "group-key"], capture_output=True, timeout=30)
        assert get.returncode == 0 and get.stdout == theirs, get.stderr
        # The node's own user still gets the fast path.
        ping = subprocess.run(kvpool + ["ping"], capture_output=True, text=True, timeout=30)
        assert "fast path on" in ping.stdout, ping.stdout
        raw = Raw(d.endpoint)
        status, got = raw.get("group-key")
        assert status == OK and got == theirs
        raw.close()
        put_and_check(d, ["mine-after-%d" % i for i in range(10)])
    finally:
        d.finish()


def test_segment_dir_files_are_the_nodes_users_alone():
    prefix = setpriv(NOBODY, groups=[NOBODY])
    base = tempfile.mkdtemp(prefix="kvpool-seal-", dir="/dev/shm")
    folder = os.path.join(base, "segments")
    os.mkdir(folder, 0o777)
    os.chmod(folder, 0o777)  # as loose as can be: the node closes it
    os.chmod(base, 0o755)
    d = None
    try:
        d = Kvpoold("--segment-size", "16MiB", "--segment-dir", folder, "--group", str(NOBODY))
        put_and_check(d, ["dir-%d" % i for i in range(10)])
        info = os.stat(folder)
        assert stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
        files = [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith("segment-")]
        assert files
        for path in files:
            info = os.stat(path)
            assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_gid != NOBODY, path
        outcome = attack(d.pid, files, prefix=prefix)
        worked = {path: how for path, how in outcome.items() if "truncated" in how}
        assert not worked, worked
        for path in files:
            assert outcome[path] == "open: EACCES", outcome
        put_and_check(d, ["dir-after-%d" % i for i in range(10)])
    finally:
        if d:
            d.finish()
        shutil.rmtree(base, ignore_errors=True)


def test_segment_dir_left_open_by_an_older_node_is_closed_again():
    """An older kvpoold opened the directory (0750) and its files (0660) to --group: a node
    that starts on it makes both the node's user's alone before it maps anything."""
    prefix = setpriv(NOBODY, groups=[NOBODY])
    base = tempfile.mkdtemp(prefix="kvpool-seal-", dir="/dev/shm")
    folder = os.path.join(base, "segments")
    try:
        first = Kvpoold("--segment-size", "16MiB", "--segment-dir", folder)
        put_and_check(first, ["kept-%d" % i for i in range(6)])
        first.finish()
        os.chmod(base, 0o755)
        os.chown(folder, -1, NOBODY)
        os.chmod(folder, 0o750)
        for name in os.listdir(folder):
            os.chown(os.path.join(folder, name), -1, NOBODY)
            os.chmod(os.path.join(folder, name), 0o660)
        d = Kvpoold("--segment-size", "16MiB", "--segment-dir", folder, "--group", str(NOBODY))
        try:
            assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
            files = [os.path.join(folder, n) for n in os.listdir(folder)
                     if n.startswith("segment-")]
            outcome = attack(d.pid, files, prefix=prefix)
            worked = {path: how for path, how in outcome.items() if "truncated" in how}
            assert not worked, worked
            raw = Raw(d.endpoint)
            for i in range(1, 6, 2):  # put_and_check removed the even ones
                key = "kept-%d" % i
                status, got = raw.get(key)
                assert status == OK and got == value(key, 300 * 1024 + i), key
            raw.close()
            put_and_check(d, ["new-%d" % i for i in range(6)])
        finally:
            d.finish()
    finally:
        shutil.rmtree(base, ignore_errors=True)
