"""The disk tier's files are its own: names planted in its directory are never followed,
never read, never hang it (docs/security.md, "Limits").

- A symlink at the .tmp name of an object about to be offloaded: the write removes the link
  and creates its own file, so the file the link points to keeps its bytes and every object
  reads back bit-exact.
- A FIFO named like a copy: the restart's scan skips it (lstat) and logs it, instead of
  blocking for ever in open; the good copies are served.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import hashlib
import os
import shutil
import tempfile
import time

import pytest

from kvpool_daemon import Kvpoold, wait_for  # noqa: E402
from kvpool_raw import Raw  # noqa: E402

OK = 0
MiB = 1 << 20


def value_of(key, size=MiB):
    block = hashlib.sha256(key.encode()).digest()
    return (block * (size // 32 + 1))[:size]


@pytest.fixture
def disk_dir():
    path = tempfile.mkdtemp(prefix="kvpool-disk-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def copy_path(disk_dir, copy_id, ext):
    return os.path.join(disk_dir, "%02x" % (copy_id % 256), "%016x.%s" % (copy_id, ext))


def start(disk_dir, **kwargs):
    return Kvpoold("--segment-size", "16MiB", "--disk-dir", disk_dir, "--disk-capacity",
                   "1GiB", **kwargs)


def test_a_symlink_at_the_tmp_name_is_not_followed(disk_dir):
    outside = tempfile.mkdtemp(prefix="kvpool-victim-", dir="/tmp")
    victim = os.path.join(outside, "victim")
    with open(victim, "wb") as f:
        f.write(b"precious bytes")
    d = start(disk_dir)
    try:
        # Copies get ids 1, 2, ... in the order they are written: a link at each .tmp name
        # the next 40 writes will use.
        for copy_id in range(1, 41):
            os.symlink(victim, copy_path(disk_dir, copy_id, "tmp"))
        raw = Raw(d.endpoint)
        keys = ["linked-%03d" % i for i in range(40)]
        for key in keys:
            assert raw.put(key, value_of(key)) == OK, key
        assert wait_for(lambda: raw.stats().offload_queue == 0)
        stats = raw.stats()
        assert stats.offloads >= 20 and stats.offload_failures == 0, stats
        for key in keys:
            assert raw.get(key) == (OK, value_of(key)), key
        assert raw.stats().disk_corrupt == 0
        raw.close()
    finally:
        d.finish()
        with open(victim, "rb") as f:
            kept = f.read()
        shutil.rmtree(outside, ignore_errors=True)
    assert kept == b"precious bytes"


def test_a_fifo_named_like_a_copy_does_not_hang_the_restart(disk_dir):
    keys = ["fifo-%03d" % i for i in range(30)]
    d = start(disk_dir)
    try:
        raw = Raw(d.endpoint)
        for key in keys:
            assert raw.put(key, value_of(key)) == OK
        assert wait_for(lambda: raw.stats().offload_queue == 0)
        on_disk = raw.stats().disk_objects
        assert on_disk >= 10
        raw.close()
    finally:
        d.finish()
    fifo = copy_path(disk_dir, 0x12345, "kv")  # right name, right directory
    os.mkfifo(fifo)
    dangling = copy_path(disk_dir, 0x12346, "kv")
    os.symlink("/dev/zero", dangling)
    started = time.monotonic()
    d = start(disk_dir, start_timeout=10.0)
    try:
        took = time.monotonic() - started
        raw = Raw(d.endpoint)
        found = [key for key in keys if raw.exist(key)]
        assert len(found) >= on_disk
        for key in found:
            assert raw.get(key) == (OK, value_of(key)), key
        assert raw.stats().disk_objects == on_disk
        raw.close()
    finally:
        log = d.finish()
    assert took < 10.0
    assert os.path.exists(fifo) and os.path.islink(dangling)  # left alone, not followed
    assert "not regular files" in log and "skipped" in log
