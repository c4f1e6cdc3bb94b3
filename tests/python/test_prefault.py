"""A node faults its segments' pages in after it starts (shm/segment.c, segment_prefault_start).

- The pages of a node's own segment end up mapped in the node (RssShmem reaches the segment's
  size) without a single put.
- Values put while the pages are being faulted in, and the bytes already in them, come back
  exactly: the fault-in never writes.
- A node stopped in the middle of the fault-in of a large segment stops at once.
- A --segment-dir node's files stay sparse until their adoption (no fault-in there).

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import os
import platform
import shutil
import tempfile
import time

import pytest

from kvpool_daemon import Kvpoold  # noqa: E402
from kvpool_raw import Raw  # noqa: E402

OK = 0
MiB = 1 << 20


def shmem_bytes(pid):
    with open("/proc/%d/status" % pid) as status:
        for line in status:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    return 0


def mapped_bytes(pid, path):
    """Rss of the node's mappings of the file at path, all of them (/proc/<pid>/smaps)."""
    total, seen = 0, False
    with open("/proc/%d/smaps" % pid) as smaps:
        inside = False
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
                inside = fields[-1] == path
                seen = seen or inside
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    assert seen, "%s is not mapped" % path
    return total


def kernel_faults_in():
    """MADV_POPULATE_WRITE came with Linux 5.14; before it a node does not fault in ahead."""
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (5, 14)


def needs(size):
    """Skips the test where /dev/shm cannot hold a segment of size bytes (kvpoold refuses)."""
    if not kernel_faults_in():
        pytest.skip("Linux %s has no MADV_POPULATE_WRITE" % platform.release())
    fs = os.statvfs("/dev/shm")
    if fs.f_blocks and fs.f_bavail * fs.f_frsize < 2 * size:
        pytest.skip("/dev/shm has %d MiB free" % (fs.f_bavail * fs.f_frsize // MiB))


def wait_shmem(pid, at_least, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if shmem_bytes(pid) >= at_least:
            return True
        time.sleep(0.05)
    return False


def value_of(i, size):
    return bytes([(i * 31 + j) % 251 for j in range(251)]) * (size // 251) + b"v" * (size % 251)


def test_a_node_maps_its_segment_without_a_put():
    needs(64 * MiB)
    d = Kvpoold("--segment-size", "64MiB")
    try:
        assert wait_shmem(d.pid, 64 * MiB, 60), \
            "RssShmem %d MiB of a 64 MiB segment" % (shmem_bytes(d.pid) // MiB)
    finally:
        d.stop()
        d.remove()


def test_values_put_during_the_fault_in_come_back_exactly():
    # Large enough that the puts, right after the start, land while it is faulted in.
    needs(512 * MiB)
    d = Kvpoold("--segment-size", "512MiB", "--max-value-size", "4MiB")
    try:
        raw = Raw(d.endpoint)
        sizes = [4096, 65536, 1 * MiB, 3 * MiB + 17]
        keys = []
        for i in range(48):
            size = sizes[i % len(sizes)]
            key = "pf/%d" % i
            assert raw.put(key, value_of(i, size)) == OK
            keys.append((key, i, size))
        assert wait_shmem(d.pid, 512 * MiB, 120)
        for key, i, size in keys:
            status, value = raw.get(key)
            assert status == OK and value == value_of(i, size), key
        raw.close()
    finally:
        d.stop()
        d.remove()


def test_a_stop_during_the_fault_in_is_prompt():
    needs(1024 * MiB)
    d = Kvpoold("--segment-size", "1GiB")
    try:
        assert wait_shmem(d.pid, 8 * MiB, 60)
        mapped = shmem_bytes(d.pid)
        started = time.monotonic()
        d.stop(timeout=10)
        if mapped < 1024 * MiB:  # (a fast machine may have finished already)
            assert time.monotonic() - started < 5
    finally:
        d.remove()


def test_segment_dir_files_stay_sparse():
    needs(64 * MiB)
    # tmpfs, as a node would use it; the files go with the test.
    base = tempfile.mkdtemp(prefix="kvpool-prefault-", dir="/dev/shm")
    folder = os.path.join(base, "segments")
    d = None
    try:
        d = Kvpoold("--segment-size", "64MiB", "--segment-dir", folder)
        raw = Raw(d.endpoint)
        assert raw.put("sparse/k", b"s" * 4096) == OK
        time.sleep(1.0)
        files = [os.path.join(folder, name) for name in os.listdir(folder)
                 if name.startswith("segment-")]
        assert files
        for f in files:
            assert mapped_bytes(d.pid, f) < 32 * MiB, f
        raw.close()
    finally:
        if d:
            d.stop()
            d.remove()
        shutil.rmtree(base, ignore_errors=True)
