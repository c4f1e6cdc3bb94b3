"""Concurrent clients: several processes (multiprocessing, spawn) each with its own
MooncakeDistributedStore, half of them contributing a segment, writing their own keys and
reading everyone's; and several threads sharing one store and one kvpool.Client."""

import multiprocessing
import os
import threading

import numpy as np

import kvpool
from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig
from conftest import host_port

WORKERS = 4
KEYS_PER_WORKER = 40


def value_of(worker, i):
    """The value worker writes under its key i: reproducible by any reader."""
    size = 1024 + (worker * 7919 + i * 104729) % (60 << 10)
    return np.random.default_rng(worker * 100000 + i).integers(0, 255, size, dtype=np.uint8)


def key_of(prefix, worker, i):
    return "%sw%d-%d" % (prefix, worker, i)


def worker_main(endpoint, prefix, worker, barrier, done, results, node_segment):
    problems = []
    store = MooncakeDistributedStore()
    segment = (16 << 20) if worker % 2 == 0 else 0
    rc = store.setup("proc-%d:1" % worker, "unused", segment, 0, "tcp", "", endpoint)
    if rc != 0:
        results.put((worker, ["setup returned %d" % rc]))
        barrier.wait(60)
        done.wait(60)
        return
    try:
        keys = [key_of(prefix, worker, i) for i in range(KEYS_PER_WORKER)]
        values = [value_of(worker, i) for i in range(KEYS_PER_WORKER)]
        #  Even workers keep their keys in their own segment, odd ones in the node's.
        config = ReplicateConfig()
        config.preferred_segment = store.get_hostname() if segment else node_segment
        half = KEYS_PER_WORKER // 2
        codes = store.batch_put_from(keys[:half], [v.ctypes.data for v in values[:half]],
                                     [v.nbytes for v in values[:half]], config)
        codes += [store.put(k, v, config) for k, v in zip(keys[half:], values[half:])]
        if codes != [0] * KEYS_PER_WORKER:
            problems.append("put codes %r" % codes)
        barrier.wait(60)
        for other in range(WORKERS):
            okeys = [key_of(prefix, other, i) for i in range(KEYS_PER_WORKER)]
            expect = [value_of(other, i) for i in range(KEYS_PER_WORKER)]
            if store.batch_is_exist(okeys) != [1] * KEYS_PER_WORKER:
                problems.append("worker %d's keys missing" % other)
            outs = [np.zeros(64 << 10, dtype=np.uint8) for _ in okeys]
            got = store.batch_get_into(okeys, [o.ctypes.data for o in outs],
                                       [o.nbytes for o in outs])
            for i, (n, out, value) in enumerate(zip(got, outs, expect)):
                if n != value.nbytes or out[:n].tobytes() != value.tobytes():
                    problems.append("batch_get_into %s: %d" % (okeys[i], n))
            for i in range(0, KEYS_PER_WORKER, 5):
                if store.get(okeys[i]) != expect[i].tobytes():
                    problems.append("get %s" % okeys[i])
    except Exception as exc:                                  # reported to the parent
        problems.append("exception %r" % (exc,))
    results.put((worker, problems))
    #  Objects in this worker's segment vanish when it closes: wait until all have read.
    done.wait(60)
    store.close()


def test_processes(daemon, prefix):
    with kvpool.Client(daemon.endpoint) as client:
        node_segment = client.segments()[0].name
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    done = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=worker_main,
                         args=(host_port(daemon.endpoint), prefix, w, barrier, done, results,
                               node_segment))
             for w in range(WORKERS)]
    for proc in procs:
        proc.start()
    try:
        reports = dict(results.get(timeout=120) for _ in range(WORKERS))
    finally:
        done.set()
        for proc in procs:
            proc.join(60)
    assert sorted(reports) == list(range(WORKERS))
    for worker, problems in sorted(reports.items()):
        assert problems == [], "worker %d: %s" % (worker, problems[:5])
    assert [proc.exitcode for proc in procs] == [0] * WORKERS
    with kvpool.Client(daemon.endpoint) as client:
        present = client.exist_batch([key_of(prefix, w, 0) for w in range(WORKERS)])
        # Keys in closed workers' segments left with them; the others stay.
        assert present[1] and present[3]
        assert not present[0] and not present[2]
        mine = [s.name for s in client.segments() if s.name.startswith("/kvpool-client-")]
        assert mine == []


def test_threads_share_a_store(daemon, prefix):
    store = MooncakeDistributedStore()
    assert store.setup("threads:1", "unused", 16 << 20, 0, "tcp", "",
                       host_port(daemon.endpoint)) == 0
    problems = []

    def work(t):
        for i in range(30):
            key = "%st%d-%d" % (prefix, t, i)
            value = os.urandom(2048 + i)
            if store.put(key, value) != 0:
                problems.append("put " + key)
            buf = np.zeros(4096, dtype=np.uint8)
            if store.get_into(key, buf.ctypes.data, buf.nbytes) != len(value):
                problems.append("get_into " + key)
            elif buf[:len(value)].tobytes() != value:
                problems.append("bytes " + key)
            if store.is_exist(key) != 1:
                problems.append("exist " + key)

    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert problems == []
        assert store.batch_is_exist(["%st%d-%d" % (prefix, t, i) for t in range(6)
                                     for i in range(30)]) == [1] * 180
    finally:
        store.close()
