"""A disk tier whose filesystem fills before --disk-capacity (docs/tiers.md, "A full
filesystem"): the first write refused with ENOSPC lowers the tier's capacity to what it holds,
and eviction goes on, dropping disk copies or objects, so every put is still placed.

The filesystem is an 8 MiB tmpfs mounted here (or one of 512 KiB, which takes no copy at
all: every evicted object then goes without one) (skipped where mount is not permitted);
--disk-capacity says 1 GiB, the pool 16 MiB, and 80 MiB are put.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import hashlib
import os
import shutil
import subprocess
import tempfile

import pytest

from kvpool_daemon import Kvpoold, wait_for  # noqa: E402
from kvpool_raw import Raw  # noqa: E402

OK = 0
OBJECT_NOT_FOUND = -704
MiB = 1 << 20


def value_of(key, size=MiB):
    block = hashlib.sha256(key.encode()).digest()
    return (block * (size // 32 + 1))[:size]


@pytest.fixture
def small_disk(request):
    size = getattr(request, "param", "8m")
    path = tempfile.mkdtemp(prefix="kvpool-small-disk-", dir="/tmp")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s,mode=0700" % size, "tmpfs",
                              path],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    if not mounted:
        os.rmdir(path)
        pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        shutil.rmtree(path, ignore_errors=True)


def test_a_disk_that_fills_before_its_capacity_keeps_puts_going(small_disk):
    d = Kvpoold("--segment-size", "16MiB", "--disk-dir", os.path.join(small_disk, "tier"),
                "--disk-capacity", "1GiB")
    try:
        raw = Raw(d.endpoint)
        keys = ["full-%03d" % i for i in range(80)]
        for key in keys:
            assert raw.put(key, value_of(key)) == OK, key
        assert wait_for(lambda: raw.stats().offload_queue == 0)
        stats = raw.stats()
        # The tier's capacity came down to what the 8 MiB filesystem held.
        assert stats.disk_capacity <= 8 * MiB, stats.disk_capacity
        assert stats.offload_failures > 0 and stats.offloads > 0
        found = 0
        for key in keys:
            status, value = raw.get(key)
            assert status in (OK, OBJECT_NOT_FOUND), (key, status)
            if status == OK:
                assert value == value_of(key), key
                found += 1
        assert found >= 12  # the pool's worth at least, and what the disk kept
        assert all(raw.get(key) == (OK, value_of(key)) for key in keys[-5:])
        raw.close()
    finally:
        log = d.finish()
    assert log.count("the filesystem is full") == 1


@pytest.mark.parametrize("small_disk", ["512k"], indirect=True)
def test_a_disk_that_takes_nothing_drops_objects_instead(small_disk):
    d = Kvpoold("--segment-size", "16MiB", "--disk-dir", os.path.join(small_disk, "tier"),
                "--disk-capacity", "1GiB")
    try:
        raw = Raw(d.endpoint)
        keys = ["none-%03d" % i for i in range(40)]
        for key in keys:
            assert raw.put(key, value_of(key)) == OK, key
        assert wait_for(lambda: raw.stats().offload_queue == 0)
        stats = raw.stats()
        assert stats.disk_capacity == 0 and stats.disk_objects == 0
        assert stats.evict_forced > 0 and stats.offload_failures > 0
        for key in keys:
            status, value = raw.get(key)
            assert status == OBJECT_NOT_FOUND or value == value_of(key), (key, status)
        assert raw.get(keys[-1]) == (OK, value_of(keys[-1]))
        raw.close()
    finally:
        d.finish()
