"""A cluster that heals itself (issue 33, items 3 and 4): replicas restored, nodes drained.

- A node killed: every object that had 2 replicas counts 2 live ones again, on the nodes
  left, within a bounded time, and reads back byte for byte from each of them.
- --repair-rate 0: no repair at all.
- A put asking 3 replicas of a cluster of 2 nodes stores 2 and says so per key
  (Reply.replicas_placed, Stats.puts_under_replicated); a node that joins later gets the
  third replica.
- kvpool node drain NODE: every object only that node holds is copied to others, and
  killing it then loses nothing.
- A rolling restart of 3 nodes with --drain-on-exit under load: every acknowledged key reads
  back with the right bytes.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import os
import subprocess
import threading
import time

import pytest

import urllib.request

from kvpool_daemon import Kvpoold, bin_dir, free_port, wait_for  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402
from test_cluster import MiB, OK, Cluster, value_of  # noqa: E402

REPAIR_WITHIN_S = 20


def live_holders(cluster, key, via):
    """The host ids of the live nodes that keep a replica of key (not cache copies)."""
    reply, _ = cluster.raw(via).call(pb.LOCATE, [key])
    if reply.status != OK or reply.statuses[0] != OK:
        return []
    return sorted(reply.nodes[i].host_id for i in reply.locations[0].nodes
                  if reply.nodes[i].alive)


def stop_clean(cluster):
    """Stops every daemon still running (nodes, then the master): each exits with 0 (a
    sanitizer's report, or a crash, fails the test)."""
    daemons = [d for d in cluster.nodes + [cluster.master] if d.alive()]
    statuses = [d.stop() for d in daemons]
    assert statuses == [0] * len(daemons), (statuses, [d.log_text(3000) for d in daemons])


def node_index(cluster, host):
    return cluster.hosts.index(host)


def put_many(cluster, keys, size, replicas, via=0):
    placed = []
    raw = cluster.raw(via)
    for key in keys:
        reply, _ = raw.call(pb.PUT, [key], [value_of(key, size)], put={"replica_num": replicas})
        assert reply.status == OK and reply.statuses[0] == OK, (key, reply)
        placed.append(reply.replicas_placed[0] if reply.replicas_placed else None)
    return placed


def reads_back_from_each_holder(cluster, keys, size, via):
    """Every key reads back right from every live node that holds it (its own memory)."""
    for key in keys:
        for host in live_holders(cluster, key, via):
            status, value = cluster.raw(node_index(cluster, host)).get(key)
            assert status == OK and value == value_of(key, size), (key, host, status)


def master_metric(cluster, name):
    """A master's /metrics value of name (a series without labels)."""
    with urllib.request.urlopen(cluster.master.metrics + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def test_killed_node_replicas_restored():
    c = Cluster(master_args=("--metrics-port", str(free_port())))
    try:
        keys = ["r-%d" % i for i in range(40)]
        size = 100 << 10
        put_many(c, keys, size, 2)
        assert all(len(live_holders(c, k, 0)) == 2 for k in keys)
        # The node with the most of them dies.
        counts = {h: sum(h in live_holders(c, k, 0) for k in keys) for h in c.hosts}
        victim = max(counts, key=counts.get)
        survivor = next(i for i, h in enumerate(c.hosts) if h != victim)
        c.nodes[node_index(c, victim)].proc.kill()
        started = time.monotonic()
        assert wait_for(lambda: c.live_nodes(survivor) == 2, 10)

        def restored():
            return all(len(live_holders(c, k, survivor)) == 2 for k in keys)

        assert wait_for(restored, REPAIR_WITHIN_S), (
            [live_holders(c, k, survivor) for k in keys], c.logs())
        took = time.monotonic() - started
        assert all(victim not in live_holders(c, k, survivor) for k in keys)
        reads_back_from_each_holder(c, keys, size, survivor)
        copied = sum(c.raw(i).stats().repairs_done for i, h in enumerate(c.hosts) if h != victim)
        assert copied >= counts[victim], (copied, counts)
        # The master's metrics: nothing lacks a replica now, every copy counted.
        assert wait_for(lambda: master_metric(c, "kvpool_cluster_replicas_missing") == 0, 5)
        assert master_metric(c, "kvpool_cluster_repairs_total") >= counts[victim]
        assert master_metric(c, "kvpool_cluster_repair_bytes_total") >= counts[victim] * size
        print("restored %d replicas within %.1f s of the kill" % (counts[victim], took))
        stop_clean(c)
    finally:
        c.close()


def test_repair_rate_zero_repairs_nothing():
    c = Cluster(node_args=("--repair-rate", "0"))
    try:
        keys = ["z-%d" % i for i in range(10)]
        put_many(c, keys, 10 << 10, 2)
        victim = c.hosts[2]
        lost = [k for k in keys if victim in live_holders(c, k, 0)]
        assert lost
        c.nodes[2].proc.kill()
        assert wait_for(lambda: all(len(live_holders(c, k, 0)) == 1 for k in lost), 10)
        time.sleep(3)
        assert all(len(live_holders(c, k, 0)) == 1 for k in lost)
        assert sum(c.raw(i).stats().repairs_done for i in range(2)) == 0
        stop_clean(c)
    finally:
        c.close()


def test_fewer_nodes_than_replicas_then_a_node_joins():
    c = Cluster(hosts=("hA", "hB"))
    try:
        keys = ["j-%d" % i for i in range(10)]
        placed = put_many(c, keys, 20 << 10, 3)
        assert placed == [2] * len(keys), placed
        assert c.raw(0).stats().puts_under_replicated == len(keys)
        assert all(len(live_holders(c, k, 0)) == 2 for k in keys)
        # A batch put says it per key too.
        reply, _ = c.raw(1).call(pb.PUT, ["j-b1", "j-b2"], [b"x", b"y"], put={"replica_num": 3})
        assert list(reply.statuses) == [OK, OK] and list(reply.replicas_placed) == [2, 2]
        c.nodes.append(c.start_node("hC"))
        c.hosts.append("hC")
        assert wait_for(lambda: all(len(live_holders(c, k, 0)) == 3 for k in keys),
                        REPAIR_WITHIN_S), c.logs()
        reads_back_from_each_holder(c, keys, 20 << 10, 0)
        stop_clean(c)
    finally:
        c.close()


def test_one_node_stores_fewer_replicas_and_says_so():
    """Role all, two segments: 3 replicas asked, 2 stored (one a segment), said per key by
    the reply and by the Python client, counted in the stats."""
    import kvpool
    daemon = Kvpoold("--segments", "2", "--segment-size", "16MiB")
    try:
        from kvpool_raw import Raw
        raw = Raw(daemon.endpoint)
        reply, _ = raw.call(pb.PUT, ["one-a", "one-b"], [b"a", b"b"], put={"replica_num": 3})
        assert list(reply.statuses) == [OK, OK] and list(reply.replicas_placed) == [2, 2]
        with kvpool.Client(daemon.endpoint) as client:
            statuses, placed = client.put_batch_placed(
                ["one-c"], [b"c"], kvpool.PutOptions(replica_num=3))
            assert statuses == [OK] and placed == [2]
            statuses, placed = client.put_batch_placed(["one-d"], [b"d"])
            assert statuses == [OK] and placed == [1]
        assert raw.stats().puts_under_replicated == 3
        assert "fewer replicas than asked" in daemon.log_text()
    finally:
        daemon.finish()
    # The default, one segment: 1 placed.
    daemon = Kvpoold()
    try:
        from kvpool_raw import Raw
        reply, _ = Raw(daemon.endpoint).call(pb.PUT, ["one-e"], [b"e"], put={"replica_num": 2})
        assert list(reply.statuses) == [OK] and list(reply.replicas_placed) == [1]
    finally:
        daemon.finish()


def node_ids(cluster, via=0):
    """host id -> node id, as the master names them."""
    reply, _ = cluster.raw(via).call(pb.NODES)
    return {n.host_id: n.node_id for n in reply.nodes}


def kvpool_cli(daemon, *args, timeout=60):
    return subprocess.run([os.path.join(bin_dir(), "kvpool"), "-s", daemon.ipc, *args],
                          capture_output=True, text=True, timeout=timeout)


def test_drain_moves_what_only_the_node_holds():
    c = Cluster()
    try:
        keys = ["d-%d" % i for i in range(60)]
        size = 50 << 10
        put_many(c, keys, size, 1)
        victim = c.hosts[1]
        only_there = [k for k in keys if live_holders(c, k, 0) == [victim]]
        assert only_there
        victim_id = node_ids(c)[victim]
        # Asked over tcp (not a same-machine client of the node): refused.
        reply, _ = c.raw(0).call(pb.DRAIN, [victim_id], pattern="start")
        assert reply.status != OK
        done = kvpool_cli(c.nodes[0], "node", "drain", "--timeout", "30", victim_id)
        assert done.returncode == 0, (done.stdout, done.stderr, c.logs())
        assert "draining, 0 objects only there" in done.stdout, done.stdout
        assert all([h for h in live_holders(c, k, 0) if h != victim] for k in keys)
        # Draining: nothing new is placed on it.
        fresh = ["d-new-%d" % i for i in range(20)]
        put_many(c, fresh, 1000, 1, via=1)
        assert all(victim not in live_holders(c, k, 0) for k in fresh)
        # Gone: nothing is lost.
        c.nodes[1].proc.kill()
        assert wait_for(lambda: c.live_nodes(0) == 2, 10)
        for key in keys:
            status, value = c.raw(0).get(key)
            assert status == OK and value == value_of(key, size), (key, status)
        status = kvpool_cli(c.nodes[0], "node", "status", victim_id)
        assert status.returncode == 0 and "0 objects only there" in status.stdout
        stop_clean(c)
    finally:
        c.close()


def test_drain_on_one_process_is_refused():
    daemon = Kvpoold()
    try:
        done = kvpool_cli(daemon, "node", "drain", "x")
        assert done.returncode == 1 and "no other node" in done.stderr, done.stderr
    finally:
        daemon.finish()


def test_rolling_restart_under_load_loses_nothing():
    """Each node in turn SIGTERMed with --drain-on-exit and started again (same node id),
    while a writer puts 1-replica values and a reader reads them; afterwards every put that
    was acknowledged reads back right."""
    c = Cluster(node_args=("--drain-on-exit", "on", "--drain-timeout", "20000"))
    size = 32 << 10
    acked = []
    up = set(range(3))
    lock = threading.Lock()
    stop = threading.Event()
    errors = []

    def writer():
        n = 0
        raws = {}
        while not stop.is_set():
            with lock:
                live = sorted(up)
            if not live:
                time.sleep(0.01)
                continue
            i = live[n % len(live)]
            key = "roll-%d" % n
            n += 1
            try:
                raw = raws.setdefault(i, (c.nodes[i], c.raw(i, timeout_ms=3000)))
                if raw[0] is not c.nodes[i]:
                    raw = raws[i] = (c.nodes[i], c.raw(i, timeout_ms=3000))
                if raw[1].put(key, value_of(key, size)) == OK:
                    acked.append(key)
                if acked and n % 5 == 0:
                    probe = acked[n % len(acked)]
                    status, value = raw[1].get(probe)
                    if status == OK and value != value_of(probe, size):
                        errors.append(("wrong bytes", probe))
            except Exception as e:  # a node going away mid-request: not acknowledged
                raws.pop(i, None)
                if not stop.is_set() and i in up:
                    time.sleep(0.05)
            time.sleep(0.002)

    thread = threading.Thread(target=writer)
    try:
        ids = node_ids(c)
        thread.start()
        time.sleep(1)
        for i in range(3):
            with lock:
                up.discard(i)
            time.sleep(0.2)  # the writer stops sending to it
            node = c.nodes[i]
            assert node.stop(timeout=40) == 0, node.log_text(4000)
            log = node.log_text()
            assert "drained (OK, 0 objects left behind)" in log, log[-3000:]
            c.nodes[i] = c.start_node(c.hosts[i], "--node-id", ids[c.hosts[i]])
            assert wait_for(lambda: c.live_nodes((i + 1) % 3) == 3, 15), c.logs()
            with lock:
                up.add(i)
            time.sleep(1)
        stop.set()
        thread.join(30)
        assert not errors, errors
        assert len(acked) > 100, len(acked)
        lost = []
        for key in acked:
            status, value = c.raw(0).get(key)
            if status != OK or value != value_of(key, size):
                lost.append((key, status))
        assert not lost, (len(lost), len(acked), lost[:10], c.logs())
        print("rolling restart: %d acknowledged puts, 0 lost" % len(acked))
        # Nothing left to drain: each node stops at once, with status 0.
        reply, _ = c.raw(0).call(pb.REMOVE_ALL, force=True)
        assert reply.status == OK
        stop_clean(c)
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(30)
        c.close()


def test_repair_never_brings_back_an_old_value():
    """Keys upserted while their lost replicas are being restored (slowly: --repair-rate
    1MiB): every live replica afterwards holds the new value, none the old one."""
    c = Cluster(node_args=("--repair-rate", "1MiB"))
    try:
        keys = ["u-%d" % i for i in range(40)]
        size = 64 << 10
        put_many(c, keys, size, 2)
        victim = c.hosts[2]
        c.nodes[2].proc.kill()
        assert wait_for(lambda: c.live_nodes(0) == 2, 10)
        raw = c.raw(0)
        for key in keys:  # while the repair runs
            new = value_of(key + "-new", size)
            reply, _ = raw.call(pb.UPSERT, [key], [new], put={"replica_num": 2})
            assert reply.statuses[0] == OK, reply
        assert wait_for(lambda: all(len(live_holders(c, k, 0)) == 2 for k in keys),
                        REPAIR_WITHIN_S), c.logs()
        time.sleep(1)  # copies under way land, or are refused
        for key in keys:
            for host in live_holders(c, key, 0):
                status, value = c.raw(node_index(c, host)).get(key)
                assert status == OK and value == value_of(key + "-new", size), (key, host)
        assert victim not in sum((live_holders(c, k, 0) for k in keys), [])
        stop_clean(c)
    finally:
        c.close()
