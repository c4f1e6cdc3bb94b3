"""The disk tier (issue 11, items 2 to 6): evicted objects kept on local disk and read back.

- on-evict below the watermark writes nothing to disk.
- 2x overflow of a 64 MiB pool: every object reads back bit-exact, most from disk, over tcp
  and through the same-machine client, and the pool ends under its high watermark.
- An offload path that is blocked (queue limit 0, or a disk whose copies are all leased)
  loses nothing: puts get NO_AVAILABLE_HANDLE; --offload-force-evict evicts anyway.
- Past its capacity the disk drops its oldest copies; a restarted node registers its disk
  copies and serves them; a half-written or corrupted file is dropped, never served.
- --offload eager copies every committed object; --promote-on-hit brings hot ones back.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import glob
import hashlib
import os
import resource
import shutil
import tempfile
import time

import pytest

import kvpool

from kvpool_daemon import Kvpoold, wait_for  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402

OK = 0
NO_AVAILABLE_HANDLE = -200
OBJECT_NOT_FOUND = -704
MiB = 1 << 20


def value_of(key, size=MiB):
    block = hashlib.sha256(key.encode()).digest()
    return (block * (size // 32 + 1))[:size]


@pytest.fixture
def disk_dir():
    # /tmp, not /dev/shm: a real filesystem, where O_DIRECT works.
    path = tempfile.mkdtemp(prefix="kvpool-disk-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(disk_dir, *args, pool="64MiB", capacity="1GiB"):
    return Kvpoold("--segment-size", pool, "--disk-dir", disk_dir, "--disk-capacity", capacity,
                   *args)


def put_until_refused(raw, prefix):
    """Puts 1 MiB values into a 16 MiB pool until one is refused, which must happen, with
    NO_AVAILABLE_HANDLE; returns the keys stored."""
    stored = []
    for i in range(40):
        key = "%s-%03d" % (prefix, i)
        status = raw.put(key, value_of(key))
        if status != OK:
            assert status == NO_AVAILABLE_HANDLE, status
            assert len(stored) >= 12, stored
            return stored
        stored.append(key)
    raise AssertionError("40 MiB went into a 16 MiB pool that could not evict")


def copies(disk_dir):
    return glob.glob(os.path.join(disk_dir, "*", "*.kv"))


def test_on_evict_below_the_watermark_writes_nothing(disk_dir):
    d = start(disk_dir)
    try:
        raw = Raw(d.endpoint)
        for i in range(40):  # 40 MiB of a 64 MiB pool
            assert raw.put("fits-%d" % i, value_of("fits-%d" % i)) == OK
        time.sleep(0.2)
        stats = raw.stats()
        assert stats.offloads == 0 and stats.evictions == 0 and stats.disk_objects == 0
        assert stats.disk_capacity == 1 << 30
        assert copies(disk_dir) == []
        raw.close()
    finally:
        d.finish()


def test_double_overflow_reads_back_from_disk(disk_dir):
    d = start(disk_dir)
    try:
        raw = Raw(d.endpoint)
        client = kvpool.Client(d.endpoint)  # same machine
        keys = ["double-%03d" % i for i in range(128)]
        for key in keys:
            client.put(key, value_of(key))
        # Half over tcp, half through the same-machine client; every one bit-exact.
        for key in keys[::2]:
            assert raw.get(key) == (OK, value_of(key)), key
        for key in keys[1::2]:
            assert client.get(key) == value_of(key), key
        stats = raw.stats()
        assert stats.disk_hits >= 60, stats
        assert stats.offloads >= 60 and stats.evictions_dropped == 0
        assert stats.offloaded_bytes == stats.offloads * MiB
        assert wait_for(lambda: raw.stats().bytes_allocated <= 0.9 * raw.stats().bytes_mounted)
        assert len(copies(disk_dir)) == raw.stats().disk_objects
        client.close()
        raw.close()
    finally:
        d.finish()


def test_a_blocked_offload_keeps_every_object(disk_dir):
    d = start(disk_dir, "--offload-queue-limit", "0", pool="16MiB")
    try:
        raw = Raw(d.endpoint)
        stored = put_until_refused(raw, "kept")
        for key in stored:
            assert raw.get(key) == (OK, value_of(key)), key
        stats = raw.stats()
        assert stats.evictions == 0 and stats.evict_skipped > 0 and stats.offloads == 0
        raw.close()
    finally:
        log = d.finish()
    assert "kept" in log and "no room for a disk copy" in log


def test_force_evict_proceeds_without_a_copy(disk_dir):
    d = start(disk_dir, "--offload-queue-limit", "0", "--offload-force-evict", pool="16MiB")
    try:
        raw = Raw(d.endpoint)
        for i in range(40):
            key = "forced-%03d" % i
            assert raw.put(key, value_of(key)) == OK, key
        stats = raw.stats()
        assert stats.evict_forced > 0 and stats.evictions_dropped == stats.evict_forced
        assert not raw.exist("forced-000") and raw.exist("forced-039")
        raw.close()
    finally:
        d.finish()


def test_a_disk_that_refuses_writes_loses_nothing(disk_dir):
    d = start(disk_dir, pool="16MiB")
    try:
        # Files of at most 256 KiB from now on: disk copies fail with EFBIG, as on a full
        # disk (kvpoold ignores SIGXFSZ; its segments exist already).
        resource.prlimit(d.pid, resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
        raw = Raw(d.endpoint)
        stored = put_until_refused(raw, "refused")
        for key in stored:
            assert raw.get(key) == (OK, value_of(key)), key
        stats = raw.stats()
        assert stats.offload_failures > 0 and stats.offloads == 0 and stats.evictions == 0
        raw.close()
    finally:
        d.finish()
    # Every failed write took its half-written file with it (the last ones once the node
    # stopped: it finishes the writes under way).
    assert copies(disk_dir) == [] and glob.glob(os.path.join(disk_dir, "*", "*.tmp")) == []


def test_the_disk_drops_its_oldest_copies(disk_dir):
    d = start(disk_dir, "--lease-ttl", "1", pool="16MiB", capacity="32MiB")
    try:
        raw = Raw(d.endpoint)
        keys = ["aging-%03d" % i for i in range(100)]
        for key in keys:
            assert raw.put(key, value_of(key)) == OK, key
        assert wait_for(lambda: raw.stats().disk_bytes <= 0.9 * 32 * MiB)
        stats = raw.stats()
        assert stats.disk_drops > 0 and stats.disk_bytes <= 0.9 * 32 * MiB
        assert not any(raw.exist(key) for key in keys[:20])
        # The newest: in memory (about 14) and the disk's most recent copies (down to its
        # low watermark, 24 of them, or fewer while the cycles run behind the puts).
        assert all(raw.exist(key) for key in keys[-24:])
        for key in keys:
            status, value = raw.get(key)
            assert status == OBJECT_NOT_FOUND or value == value_of(key), key
        assert sum(os.path.getsize(f) for f in copies(disk_dir)) <= 32 * MiB
        raw.close()
    finally:
        d.finish()


def test_a_restarted_node_serves_its_disk(disk_dir):
    keys = ["restart-%03d" % i for i in range(40)]
    d = start(disk_dir, pool="16MiB")
    try:
        raw = Raw(d.endpoint)
        for key in keys:
            assert raw.put(key, value_of(key)) == OK
        assert wait_for(lambda: raw.stats().offload_queue == 0)
        on_disk = raw.stats().disk_objects
        assert on_disk >= 20
        raw.close()
    finally:
        d.finish()
    # A write a crash cut short is a .tmp file: dropped, never served.
    half = os.path.join(disk_dir, "00", "00000000000fff00.tmp")
    os.makedirs(os.path.dirname(half), exist_ok=True)
    with open(half, "wb") as f:
        f.write(b"KVPDISK1" + b"\0" * 100)
    d = start(disk_dir, pool="16MiB")
    try:
        raw = Raw(d.endpoint)
        found = [key for key in keys if raw.exist(key)]
        assert len(found) == on_disk
        for key in found:
            assert raw.get(key) == (OK, value_of(key)), key
        assert raw.stats().disk_objects == on_disk
        assert not os.path.exists(half)
        raw.close()
    finally:
        log = d.finish()
    assert "found and registered" in log


def corrupt_copy_of(disk_dir, key):
    """Flips a byte of the value in key's disk copy; returns the file's path."""
    for path in copies(disk_dir):
        with open(path, "r+b") as f:
            data = f.read()
            at = data.find(key.encode())
            if at < 0 or at > 4096:
                continue
            start = 4096 * ((at + len(key) + 4095) // 4096)  # the value's first block
            f.seek(start + 100)
            f.write(bytes([data[start + 100] ^ 0xFF]))
            return path
    raise AssertionError("no disk copy of " + key)


def test_a_corrupt_copy_is_dropped_never_served(disk_dir):
    keys = ["bitrot-%03d" % i for i in range(30)]
    d = start(disk_dir, pool="16MiB")
    try:
        raw = Raw(d.endpoint)
        for key in keys:
            assert raw.put(key, value_of(key)) == OK
        assert wait_for(lambda: raw.stats().offload_queue == 0)
        path = corrupt_copy_of(disk_dir, keys[0])  # the oldest: on disk only
        status, value = raw.get(keys[0])
        assert status == OBJECT_NOT_FOUND and value is None
        assert wait_for(lambda: not os.path.exists(path))  # forgotten, then unlinked
        assert not raw.exist(keys[0])
        assert raw.stats().disk_corrupt == 1
        raw.close()
    finally:
        d.finish()
    # Corrupted while the node was down: dropped by the start-up scan.
    path = corrupt_copy_of(disk_dir, keys[1])
    d = start(disk_dir, pool="16MiB")
    try:
        raw = Raw(d.endpoint)
        assert not raw.exist(keys[1]) and not os.path.exists(path)
        assert raw.get(keys[2]) == (OK, value_of(keys[2]))
        raw.close()
    finally:
        log = d.finish()
    assert "corrupt" in log


def test_eager_copies_every_object(disk_dir):
    d = start(disk_dir, "--offload", "eager")
    try:
        raw = Raw(d.endpoint)
        for i in range(10):
            assert raw.put("eager-%d" % i, value_of("eager-%d" % i)) == OK
        assert wait_for(lambda: raw.stats().disk_objects == 10)
        stats = raw.stats()
        assert stats.offloads == 10 and stats.evictions == 0
        assert stats.bytes_stored == 10 * MiB  # still in memory too
        assert len(copies(disk_dir)) == 10
        raw.close()
    finally:
        d.finish()


def test_hot_disk_objects_are_promoted(disk_dir):
    d = start(disk_dir, "--promote-on-hit", "2", pool="16MiB")
    try:
        raw = Raw(d.endpoint)
        for i in range(30):
            assert raw.put("hot-%03d" % i, value_of("hot-%03d" % i)) == OK
        assert wait_for(lambda: raw.stats().offload_queue == 0)
        for i in range(30):  # let the pool drain under the watermark with room to spare
            if raw.stats().bytes_allocated < 10 * MiB:
                break
        assert raw.remove("hot-029", force=True) == OK  # room for the promotion
        assert raw.remove("hot-028", force=True) == OK
        key = "hot-000"  # the oldest: on disk only
        before = raw.stats().disk_hits
        assert raw.get(key) == (OK, value_of(key))
        assert raw.get(key) == (OK, value_of(key))  # the second disk read promotes it
        assert raw.stats().disk_hits == before + 2
        assert wait_for(lambda: raw.stats().promotions == 1)
        assert raw.get(key) == (OK, value_of(key))  # from memory now
        assert raw.stats().disk_hits == before + 2
        raw.close()
    finally:
        d.finish()


def test_ranges_and_replicas_from_disk(disk_dir):
    # Two segments, two replicas each: an evicted object leaves both replicas' memory in the
    # same cycle, and a ranged get of a value on disk only sends just the range.
    d = start(disk_dir, "--segments", "2", pool="16MiB")
    try:
        raw = Raw(d.endpoint)
        keys = ["twice-%03d" % i for i in range(30)]
        for key in keys:
            reply, _ = raw.call(pb.PUT, [key], [value_of(key)], put=pb.PutOptions(replica_num=2))
            assert (reply.status or reply.statuses[0]) == OK, key
        assert wait_for(lambda: raw.stats().offload_queue == 0)
        stats = raw.stats()
        # Memory holds two replicas of each object still there, none of those on disk only.
        in_memory = stats.bytes_stored // (2 * MiB)
        assert stats.bytes_stored == 2 * MiB * in_memory
        assert stats.disk_objects >= 30 - in_memory - 1 and stats.disk_objects >= 10
        key = keys[0]  # on disk only
        reply, frames = raw.call(pb.GET, [key], offsets=[1000], lengths=[5000])
        assert reply.statuses[0] == OK and reply.sizes[0] == 5000
        assert frames[0] == value_of(key)[1000:6000]
        reply, frames = raw.call(pb.GET, [key], offsets=[MiB - 10], lengths=[100])
        assert reply.statuses[0] == OK and frames[0] == value_of(key)[MiB - 10:]
        reply, _ = raw.call(pb.GET, [key], offsets=[MiB + 1], lengths=[1])
        assert reply.statuses[0] == -600  # INVALID_PARAMS: past the end
        raw.close()
    finally:
        d.finish()


def test_a_batch_whose_first_values_are_on_disk_comes_back_whole_and_in_order(disk_dir):
    """A batch get over the socket goes as two requests at the node at once (the first of
    4 MiB): here the first one's values are on disk only and the second one's in memory, so
    the node answers the second first. The client keeps that early reply for its request:
    every value lands in its own buffer, none is lost as a stale reply (which would time
    the call out), and the disk reads really happened."""
    d = start(disk_dir, "--promote-on-hit", "0", pool="16MiB")
    try:
        raw = Raw(d.endpoint)
        keys = ["order-%03d" % i for i in range(24)]
        for key in keys:
            assert raw.put(key, value_of(key)) == OK
        assert wait_for(lambda: raw.stats().offload_queue == 0)
        # The oldest went to disk as the pool filled (disk_hits below says they are read
        # from there); the newest are in memory.
        on_disk = keys[:4]
        in_memory = keys[-8:]
        batch = on_disk + in_memory
        before = raw.stats()
        with kvpool.Client(d.endpoint, fast_path=False) as client:
            for _ in range(3):
                buffers = [bytearray(MiB) for _ in batch]
                assert list(client.get_batch_into(batch, buffers)) == [MiB] * len(batch)
                assert [bytes(b) for b in buffers] == [value_of(k) for k in batch]
                values = client.get_batch(batch)
                assert [bytes(v) for v in values] == [value_of(k) for k in batch]
        assert raw.stats().disk_hits - before.disk_hits == 3 * 2 * len(on_disk)
        raw.close()
    finally:
        d.stop()
