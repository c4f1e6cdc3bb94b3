"""A real cluster (issue 12): one master and three nodes, each its own kvpoold process on
loopback, with distinct ports and host ids.

- A put on one node is read back, byte for byte, from every node (small values in one
  request, large ones in stripes); a key exists once in the cluster; removes reach every
  node that held the key.
- Replicas go to distinct hosts while there are enough, then to distinct nodes.
- kill -9 of a node under traffic: keys with a replica elsewhere still read back right, keys
  that lived only there become OBJECT_NOT_FOUND within --node-ttl plus a heartbeat, no read
  returns wrong bytes or hangs past its timeout, and new puts go to the survivors.
- kill -9 of the master: nodes keep serving what they hold and fail the rest fast; once a
  master is back on the same endpoint, every committed key is readable again within two
  heartbeats (the nodes re-register and report what they hold).

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from kvpool_daemon import Kvpoold, all_stopped, wait_for  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402

OK = 0
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
INVALID_PARAMS = -600
PERMISSION_DENIED = -604
INVALID_WRITE = -700
TRANSFER_FAIL = -800
MiB = 1 << 20

TTL_MS = 2000
HEARTBEAT_MS = 200
TIMEOUT_MS = 1000


def value_of(key, size):
    """size bytes that only this key has."""
    block = hashlib.sha256(key.encode()).digest()
    return (block * (size // 32 + 1))[:size]


class Cluster:
    """A master and nodes; hosts[i] is node i's --host-id."""

    def __init__(self, hosts=("hA", "hB", "hC"), master_args=(), node_args=()):
        self.master_args = ["--role", "master", "--node-ttl", str(TTL_MS)] + list(master_args)
        self.master = Kvpoold(*self.master_args, "--master", "tcp://127.0.0.1:*",
                              prefix="kvpool-master-")
        self.master_endpoint = self.master.endpoint
        self.nodes = []
        self.hosts = list(hosts)
        self.node_args = list(node_args)
        try:
            for host in hosts:
                self.nodes.append(self.start_node(host))
            assert wait_for(lambda: self.live_nodes() == len(hosts), 10), self.logs()
        except BaseException:
            self.close()
            raise

    def start_node(self, host, *extra):
        return Kvpoold("--role", "node", "--master", self.master_endpoint, "--host-id", host,
                       "--segment-size", "64MiB", "--heartbeat-interval", str(HEARTBEAT_MS),
                       "--cluster-timeout", str(TIMEOUT_MS), "--stripe-size", "1MiB",
                       *self.node_args, *extra, prefix="kvpool-node-")

    def raw(self, i, timeout_ms=10000):
        return Raw(self.nodes[i].endpoint, timeout_ms=timeout_ms)

    def live_nodes(self, via=0):
        reply, _ = self.raw(via).call(pb.NODES)
        if reply.status != OK:
            return -1
        return sum(1 for n in reply.nodes if n.alive and n.capacity > 0)

    def locate(self, key, via=0):
        """The host ids of the nodes that hold key, or None."""
        reply, _ = self.raw(via).call(pb.LOCATE, [key])
        if reply.status != OK or reply.statuses[0] != OK:
            return None
        return [reply.nodes[i].host_id for i in reply.locations[0].nodes]

    def logs(self):
        return "\n".join("--- %s\n%s" % (d.dir, d.log_text(3000))
                         for d in [self.master] + self.nodes)

    def close(self):
        for d in self.nodes + [self.master]:
            d.remove()


@pytest.fixture
def cluster():
    c = Cluster()
    yield c
    logs = c.logs()
    alive = [d.alive() for d in c.nodes + [c.master]]
    statuses = [d.stop() for d in c.nodes + [c.master]]
    c.close()
    assert all(alive), (alive, logs)
    assert statuses == [0] * len(statuses), (statuses, [d.log_text(6000) for d in c.nodes + [c.master]])


def test_put_on_one_node_reads_back_from_every_node(cluster):
    sizes = [0, 1, 100, 64 << 10, MiB, 3 * MiB + 17]
    keys = ["k-%d-%d" % (size, i) for size in sizes for i in range(4)]
    writer = cluster.raw(0)
    for key in keys:
        size = int(key.split("-")[1])
        assert writer.put(key, value_of(key, size)) == OK, key
    # Random placement spread them: some are held only by other nodes than the writer.
    holders = {key: cluster.locate(key) for key in keys}
    assert all(h and len(h) == 1 for h in holders.values()), holders
    assert {h[0] for h in holders.values()} == {"hA", "hB", "hC"}
    for i in range(3):
        reader = cluster.raw(i)
        for key in keys:
            size = int(key.split("-")[1])
            status, value = reader.get(key)
            assert status == OK, (i, key, status)
            assert value == value_of(key, size), (i, key)
    # A batch get across nodes: one request, values from three nodes.
    reply, frames = cluster.raw(1).call(pb.GET, keys)
    assert reply.status == OK and list(reply.statuses) == [OK] * len(keys)
    for key, frame in zip(keys, frames):
        assert frame == value_of(key, int(key.split("-")[1]))
    # A prefix match through any node counts blocks held anywhere, up to the first gap.
    for i in range(3):
        reply, _ = cluster.raw(i).call(pb.PREFIX_MATCH, keys + ["nope"] + keys[:2], ranks=1)
        assert reply.status == OK and reply.count == len(keys), (i, reply.count)
    reply, _ = cluster.raw(1).call(pb.PREFIX_MATCH, keys[:4] + ["nope", keys[5]], ranks=2)
    assert reply.count == 2
    # Exist, size and ranges through any node.
    reader = cluster.raw(2)
    assert reader.exist(keys[-1]) and not reader.exist("nope")
    reply, _ = reader.call(pb.GET_SIZE, [keys[-1], "nope"])
    assert list(reply.statuses) == [OK, OBJECT_NOT_FOUND]
    assert reply.sizes[0] == 3 * MiB + 17
    reply, frames = reader.call(pb.GET, [keys[-1]], offsets=[MiB + 5], lengths=[1000])
    assert reply.statuses[0] == OK and frames[0] == value_of(keys[-1], 3 * MiB + 17)[MiB + 5:MiB + 1005]


def test_a_key_exists_once_in_the_cluster(cluster):
    assert cluster.raw(0).put("once", b"first") == OK
    assert cluster.raw(1).put("once", b"second") == OBJECT_ALREADY_EXISTS
    assert cluster.raw(2).put("once", b"third") == OBJECT_ALREADY_EXISTS
    for i in range(3):
        assert cluster.raw(i).get("once") == (OK, b"first")


def test_an_orphan_copy_never_stands_in_for_a_put(cluster):
    # A copy the master does not know (a commit that failed, whose removal did not reach its
    # node): here written straight into node B's data plane. A put of the key placed on B
    # must replace it, never commit the orphan's bytes.
    import re
    plane = re.search(r"data plane (tcp://\S+)", cluster.nodes[1].log_text()).group(1)
    assert Raw(plane, cluster_key=True).put("orphan", b"stale bytes") == OK
    reply, _ = cluster.raw(0).call(pb.NODES)
    b_id = next(n.node_id for n in reply.nodes if n.host_id == "hB")
    assert cluster.raw(0).put("orphan", b"the value",
                              put={"preferred_segments": [b_id]}) == OK
    assert cluster.locate("orphan") == ["hB"]
    for i in range(3):
        assert cluster.raw(i).get("orphan") == (OK, b"the value"), i


def test_large_values_move_in_stripes_both_ways(cluster):
    # --stripe-size is 1 MiB here. A 5 MiB + 3 value written through A and placed on B and
    # C goes to each as 6 PUT_PART stripes (reserved, written in parallel, committed);
    # read back through A it comes from one of them as 6 ranged reads.
    reply, _ = cluster.raw(0).call(pb.NODES)
    ids = {n.host_id: n.node_id for n in reply.nodes}
    size = 5 * MiB + 3
    before = cluster.raw(0).stats()
    for i in range(3):
        key = "striped-%d" % i
        assert cluster.raw(0).put(key, value_of(key, size),
                                  put={"replica_num": 2,
                                       "preferred_segments": [ids["hB"], ids["hC"]]}) == OK
        assert sorted(cluster.locate(key)) == ["hB", "hC"]
    after = cluster.raw(0).stats()
    assert after.remote_put_parts - before.remote_put_parts == 3 * 2 * 6
    assert after.remote_puts - before.remote_puts == 3 * 2
    for i in range(3):
        key = "striped-%d" % i
        assert cluster.raw(0).get(key) == (OK, value_of(key, size))
        for reader in (1, 2):  # held there: served from its own memory
            assert cluster.raw(reader).get(key) == (OK, value_of(key, size))
    assert cluster.raw(0).stats().remote_get_parts - after.remote_get_parts == 3 * 6
    # Nothing pending is left behind on B or C.
    for i in (1, 2):
        assert cluster.raw(i).stats().pending_puts == 0


def test_put_part_is_for_the_data_plane_and_checks_its_reservation(cluster):
    import re
    plane = Raw(re.search(r"data plane (tcp://\S+)", cluster.nodes[1].log_text()).group(1),
                cluster_key=True)
    # No reservation: refused, nothing written.
    reply, _ = plane.call(pb.PUT_PART, ["p"], [b"abc"], offsets=[0], lengths=[3])
    assert reply.statuses[0] == INVALID_WRITE
    reply, _ = plane.call(pb.PUT_START, ["p"], sizes=[10])
    assert reply.status == OK and reply.statuses[0] == OK, reply
    # Past the reservation's end, or a length that is not the frame's: INVALID_PARAMS.
    reply, _ = plane.call(pb.PUT_PART, ["p"], [b"abc"], offsets=[8], lengths=[3])
    assert reply.statuses[0] == INVALID_PARAMS
    reply, _ = plane.call(pb.PUT_PART, ["p"], [b"abc"], offsets=[0], lengths=[4])
    assert reply.statuses[0] == INVALID_PARAMS
    # Parts in any order, then the end: the value is the parts.
    for offset, part in ((5, b"56789"), (0, b"01234")):
        reply, _ = plane.call(pb.PUT_PART, ["p"], [part], offsets=[offset], lengths=[5])
        assert reply.status == OK and reply.statuses[0] == OK, reply
    reply, _ = plane.call(pb.PUT_END, ["p"])
    assert reply.statuses[0] == OK
    # (Served once its writer confirms it, as after a commit at the master.)
    assert plane.call(pb.CONFIRM, ["p"], versions=[reply.versions[0]])[0].statuses[0] == OK
    assert plane.get("p") == (OK, b"0123456789")
    # Values by RDMA over a connection the node does not have (or with no RDMA at all):
    # each key fails, and the space placed for an upsert is given back.
    before = cluster.raw(1).stats()
    reply, _ = plane.call(pb.UPSERT, ["r1", "r2"], sizes=[5000, 70000], rdma_conn=12345,
                          rdma_addrs=[4096, 8192], rdma_keys=[1, 2])
    assert list(reply.statuses) == [TRANSFER_FAIL] * 2, reply
    after = cluster.raw(1).stats()
    assert after.bytes_allocated == before.bytes_allocated
    assert after.objects == before.objects and plane.get("r1")[0] == OBJECT_NOT_FOUND
    reply, _ = plane.call(pb.GET, ["p"], rdma_conn=12345, rdma_addrs=[4096], rdma_keys=[1],
                          rdma_lengths=[10])
    assert reply.statuses[0] == TRANSFER_FAIL
    # A client's socket does not take PUT_PART (nor PUT_START) over tcp.
    reply, _ = cluster.raw(1).call(pb.PUT_PART, ["q"], [b"abc"], offsets=[0], lengths=[3])
    assert (reply.status or reply.statuses[0]) == PERMISSION_DENIED


def test_values_move_by_rdma_on_the_loop_device():
    # --transport rdma --rdma-device kvpool-loop: values between nodes move by one-sided RDMA
    # (the loop device: process_vm_readv/writev standing in for the HCA), requests on tcp.
    # Node C serves tcp only: A reaches it over tcp, and B's values never touch a frame.
    # (No hot cache: every read through A must move its value between the nodes, and the
    # last one reads a value replaced behind the master's back, which no cache can know of.)
    rdma = ("--transport", "rdma", "--rdma-device", "kvpool-loop", "--hot-cache-size", "0")
    c = Cluster(hosts=("hA", "hB"), node_args=rdma)
    try:
        c.nodes.append(c.start_node("hC", "--transport", "tcp"))
        c.hosts.append("hC")
        assert wait_for(lambda: c.live_nodes() == 3, 10), c.logs()
        log = c.nodes[0].log_text()
        assert "data plane transport rdma" in log and "kvpool-loop" in log, log
        assert "data plane transport tcp" in c.nodes[2].log_text()
        reply, _ = c.raw(0).call(pb.NODES)
        ids = {n.host_id: n.node_id for n in reply.nodes}
        sizes = [1, 100, 64 << 10, MiB, 3 * MiB + 17]
        before = c.raw(0).stats()
        for host in ("hB", "hC"):
            for size in sizes:
                key = "rdma-%s-%d" % (host, size)
                assert c.raw(0).put(key, value_of(key, size),
                                    put={"preferred_segments": [ids[host]]}) == OK, key
                assert c.locate(key) == [host], key
        after_puts = c.raw(0).stats()
        # To B: four whole values and four stripes of the largest, each by RDMA; to C none.
        assert after_puts.rdma_transfers - before.rdma_transfers == 4 + 4
        assert after_puts.remote_put_parts - before.remote_put_parts == 2 * 4
        for host in ("hB", "hC"):
            for size in sizes:
                key = "rdma-%s-%d" % (host, size)
                for reader in range(3):
                    assert c.raw(reader).get(key) == (OK, value_of(key, size)), (key, reader)
        # Reads through A of B's values: four whole, four stripes, by RDMA.
        assert c.raw(0).stats().rdma_transfers - after_puts.rdma_transfers == 8
        # A batch through A: B's by RDMA, C's by tcp, all exact.
        keys = ["rdma-%s-%d" % (h, s) for h in ("hB", "hC") for s in sizes]
        reply, frames = c.raw(0).call(pb.GET, keys)
        assert list(reply.statuses) == [OK] * len(keys)
        assert frames == [value_of(k, int(k.rsplit("-", 1)[1])) for k in keys]
        # A value replaced on B (another size) reads back as the new one.
        key = "rdma-hB-100"
        assert c.raw(1).call(pb.UPSERT, [key], [b"n" * 5000])[0].statuses[0] == OK
        assert c.raw(0).get(key) == (OK, b"n" * 5000)
        # Replaced on B's data plane behind the master's back, larger than the master says:
        # the room A offers is too small, so that one value comes over tcp, whole.
        import re
        plane = Raw(re.search(r"data plane (tcp://\S+)", c.nodes[1].log_text()).group(1),
                    cluster_key=True)
        key = "rdma-hB-%d" % MiB
        # (as a node's write would, with the version the master gave the value)
        version = c.raw(0).call(pb.LOCATE, [key])[0].versions[0]
        reply, _ = plane.call(pb.UPSERT, [key], [b"L" * (MiB + 100)], versions=[version])
        assert reply.statuses[0] == OK
        assert plane.call(pb.CONFIRM, [key], versions=[reply.versions[0]])[0].statuses[0] == OK
        moved = c.raw(0).stats().rdma_transfers
        assert c.raw(0).get(key) == (OK, b"L" * (MiB + 100))
        assert c.raw(0).stats().rdma_transfers == moved
        statuses = [d.stop() for d in c.nodes + [c.master]]
        assert statuses == [0] * len(statuses), [d.log_text(6000) for d in c.nodes]
    finally:
        c.close()


def test_replicas_on_distinct_hosts(cluster):
    for i in range(10):
        key = "r3-%d" % i
        assert cluster.raw(i % 3).put(key, value_of(key, 5000), put={"replica_num": 3}) == OK
        assert sorted(cluster.locate(key)) == ["hA", "hB", "hC"]
        key = "r2-%d" % i
        assert cluster.raw(i % 3).put(key, value_of(key, 5000), put={"replica_num": 2}) == OK
        hosts = cluster.locate(key)
        assert len(hosts) == 2 and len(set(hosts)) == 2


def test_replicas_on_one_host_go_to_distinct_nodes():
    c = Cluster(hosts=("hA", "hB", "hB"))
    try:
        for i in range(10):
            key = "k%d" % i
            assert c.raw(0).put(key, b"v" * 100, put={"replica_num": 2}) == OK
            assert sorted(c.locate(key)) == ["hA", "hB"], key  # distinct hosts first
            key = "all%d" % i
            assert c.raw(1).put(key, b"w" * 100, put={"replica_num": 3}) == OK
            reply, _ = c.raw(2).call(pb.LOCATE, [key])
            assert len(set(reply.locations[0].nodes)) == 3  # then distinct nodes
        for d in c.nodes + [c.master]:
            assert d.stop() == 0, c.logs()
    finally:
        c.close()


def test_removes_reach_every_holder(cluster):
    for i in range(6):
        assert cluster.raw(0).put("rm-%d" % i, b"x" * 1000, put={"replica_num": 3}) == OK
    assert cluster.raw(1).remove("rm-0") == OK
    for i in range(3):
        assert cluster.raw(i).get("rm-0")[0] == OBJECT_NOT_FOUND
        stats = cluster.raw(i).stats()
        assert stats.objects == 5, (i, stats.objects)  # each node dropped its own copy
    reply, _ = cluster.raw(2).call(pb.REMOVE_BY_REGEX, pattern="^rm-[12]$")
    assert reply.status == OK and reply.count == 2
    for i in range(3):
        assert not cluster.raw(i).exist("rm-1") and cluster.raw(i).exist("rm-3")
        assert cluster.raw(i).stats().objects == 3
    reply, _ = cluster.raw(0).call(pb.REMOVE_ALL, force=True)
    assert reply.status == OK and reply.count == 3
    for i in range(3):
        assert cluster.raw(i).stats().objects == 0
        assert not cluster.raw(i).exist("rm-5")
    # The key is free again: a new put of it succeeds.
    assert cluster.raw(1).put("rm-0", b"again") == OK
    assert cluster.raw(2).get("rm-0") == (OK, b"again")


def test_node_killed_under_traffic():
    c = Cluster()
    try:
        # Keys with two replicas survive any one node; keys with one may not.
        both, single = [], []
        for i in range(60):
            key = "two-%d" % i
            assert c.raw(i % 3).put(key, value_of(key, 20000), put={"replica_num": 2}) == OK
            both.append(key)
            key = "one-%d" % i
            assert c.raw(i % 3).put(key, value_of(key, 20000)) == OK
            single.append(key)
        victim = 2
        on_victim = [k for k in single if c.locate(k) == ["hC"]]
        elsewhere = [k for k in single if c.locate(k) != ["hC"]]
        assert on_victim and elsewhere

        wrong, slow, errors = [], [], []
        stop = threading.Event()

        def reader(node):
            raw = c.raw(node, timeout_ms=TIMEOUT_MS * 4)
            while not stop.is_set():
                for key in both + elsewhere:
                    started = time.monotonic()
                    reply, frames = raw.recv(raw.send(pb.GET, [key]))
                    took = time.monotonic() - started
                    if reply is None:
                        slow.append((key, took))
                        continue
                    status = reply.status or reply.statuses[0]
                    if status == OK and frames[0] != value_of(key, 20000):
                        wrong.append(key)
                    elif status != OK:
                        errors.append((key, status))

        threads = [threading.Thread(target=reader, args=(n,)) for n in (0, 1)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        killed = time.monotonic()
        c.nodes[victim].proc.kill()
        c.nodes[victim].proc.wait()
        # Its single-replica keys are gone once the master gives up on it.
        gone = wait_for(lambda: all(c.raw(0).get(k)[0] == OBJECT_NOT_FOUND for k in on_victim),
                        TTL_MS / 1000 + 5)
        invalidated = time.monotonic() - killed
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join()
        assert gone, c.logs()
        assert invalidated <= (TTL_MS + HEARTBEAT_MS) / 1000 + 1.0, invalidated
        assert not wrong, wrong
        assert not slow, slow  # every read answered within its timeout
        assert not errors, errors[:10]
        # Every key with a replica elsewhere reads back from both survivors.
        for node in (0, 1):
            for key in both + elsewhere:
                assert c.raw(node).get(key) == (OK, value_of(key, 20000)), (node, key)
        # New puts go to the survivors only.
        for i in range(20):
            key = "after-%d" % i
            assert c.raw(i % 2).put(key, b"z" * 100, put={"replica_num": 2}) == OK
            assert sorted(c.locate(key)) == ["hA", "hB"]
        assert c.live_nodes() == 2
        for d in c.nodes[:2] + [c.master]:
            assert d.stop() == 0, c.logs()
    finally:
        c.close()


def test_master_restart_keeps_the_cache():
    c = Cluster()
    try:
        keys = ["m-%d" % i for i in range(300)]
        for i, key in enumerate(keys):
            assert c.raw(i % 3).put(key, value_of(key, 3000)) == OK
        where = {key: c.locate(key)[0] for key in keys}
        port = c.master_endpoint.rsplit(":", 1)[1]
        c.master.proc.kill()
        c.master.proc.wait()
        # The master is away: a node serves what it holds, and fails the rest fast.
        node_a = c.raw(0)
        mine = [k for k in keys if where[k] == "hA"]
        other = [k for k in keys if where[k] != "hA"]
        for key in mine[:20]:
            assert node_a.get(key) == (OK, value_of(key, 3000))
        started = time.monotonic()
        status, _ = node_a.get(other[0])
        assert status not in (OK, OBJECT_NOT_FOUND), status  # a clear error, not a miss
        assert time.monotonic() - started < TIMEOUT_MS / 1000 + 0.5
        # A master comes back on the same endpoint: everything is readable within two
        # heartbeats (plus start-up and scheduling slack on a loaded 2-core machine).
        c.master = Kvpoold(*c.master_args, "--master", "tcp://127.0.0.1:%s" % port,
                           prefix="kvpool-master-")
        back = time.monotonic()

        def all_readable():
            # LOCATE asks the master (EXIST would count what the asking node holds itself).
            reply, _ = c.raw(1).call(pb.LOCATE, keys)
            return reply.status == OK and list(reply.statuses) == [OK] * len(keys)

        assert wait_for(all_readable, 10), c.logs()
        took = time.monotonic() - back
        assert took <= 2 * HEARTBEAT_MS / 1000 + 1.0, took
        for i in range(3):
            for key in keys[::7]:
                assert c.raw(i).get(key) == (OK, value_of(key, 3000)), (i, key, c.locate(key), c.logs())
        for d in c.nodes + [c.master]:
            assert d.stop() == 0, c.logs()
    finally:
        c.close()


def test_a_same_machine_client_reads_what_other_nodes_hold():
    """libkvpool on the machine of a node (the node's default host id, boot id and network
    namespace, as its host id): the fast path copies what that node holds, and a key another
    node holds is fetched through it, never taken for a miss."""
    import kvpool
    boot_id = "%s-net%d" % (open("/proc/sys/kernel/random/boot_id").read().strip(),
                            os.stat("/proc/self/ns/net").st_ino)
    c = Cluster(hosts=(boot_id, "hB"))
    try:
        raw_b = c.raw(1)
        keys = ["far-%d" % i for i in range(24)]
        for i, key in enumerate(keys):
            assert raw_b.put(key, value_of(key, 1000 + 5000 * i)) == OK
        far = [k for k in keys if c.locate(k) == ["hB"]]
        near = [k for k in keys if c.locate(k) == [boot_id]]
        assert far and near, (far, near)
        client = kvpool.Client(c.nodes[0].endpoint)
        assert client.fast_path
        for key in keys:
            size = 1000 + 5000 * keys.index(key)
            assert client.get(key) == value_of(key, size), key
            buffer = bytearray(size)
            assert client.get_into(key, buffer) == size and bytes(buffer) == value_of(key, size)
        got = client.get_batch(far + near)
        assert [bytes(v) for v in got] == [value_of(k, 1000 + 5000 * keys.index(k))
                                           for k in far + near]
        with pytest.raises(kvpool.ObjectNotFoundError):
            client.get_into("nowhere", bytearray(10))
        # A key not in this node's index is not taken for absent: a node of a cluster does not
        # vouch for absence (other nodes hold keys), so exist and prefix match ask it.
        assert client.exist_batch(far + near + ["nowhere"]) == [True] * len(keys) + [False]
        assert client.prefix_match(far + ["nowhere"] + near) == len(far)
        # Its puts are placed by the master: never by address (which a cluster node refuses),
        # and each key is found where the master put it.
        puts = ["near-put-%d" % i for i in range(4)]
        assert client.put_batch(puts, [value_of(k, 65536) for k in puts]) == [0] * 4
        assert [bytes(v) for v in client.get_batch(puts)] == [value_of(k, 65536) for k in puts]
        assert all(c.locate(k) for k in puts)
        import ctypes
        buf = ctypes.create_string_buffer(64)
        local = Raw(c.nodes[0].ipc)
        reply, _ = local.call(pb.PUT, ["by-address"], sizes=[64],
                              vm_addrs=[ctypes.addressof(buf)])
        assert reply.status == INVALID_PARAMS and "cluster" in reply.error
        assert local.get("by-address")[0] == OBJECT_NOT_FOUND
        local.close()
        client.close()
        raw_b.close()
    finally:
        for d in c.nodes + [c.master]:
            d.stop()
        c.close()


def test_a_frozen_master_fails_puts_and_nothing_else():
    """A master that stops answering (SIGSTOP: its connections stay up, requests go
    unanswered) fails a put after --cluster-timeout with a clear error; the node lives on,
    and puts work again once the master does."""
    c = Cluster()
    try:
        node_a = c.raw(0)
        assert node_a.put("before", value_of("before", 3000)) == OK
        os.kill(c.master.pid, signal.SIGSTOP)
        try:
            assert wait_for(lambda: all_stopped(c.master.pid), 5), "the master did not stop"
            started = time.monotonic()
            for i in range(5):
                status = node_a.put("frozen-%d" % i, value_of("frozen", 3000))
                assert status != OK, (i, time.monotonic() - started, c.logs())
            assert time.monotonic() - started < 5 * (TIMEOUT_MS / 1000 + 0.5)
            for node in c.nodes:
                assert node.alive(), c.logs()
        finally:
            os.kill(c.master.pid, signal.SIGCONT)
        assert wait_for(lambda: node_a.put("after", value_of("after", 3000)) == OK, 10), c.logs()
        assert c.raw(1).get("after") == (OK, value_of("after", 3000)), (
            c.locate("after"), node_a.get("after")[0], c.raw(2).get("after")[0], c.logs())
        for d in c.nodes + [c.master]:
            assert d.stop() == 0, c.logs()
    finally:
        c.close()


@pytest.fixture
def uncached():
    """A cluster whose nodes keep no hot cache: every remote read moves its value."""
    c = Cluster(node_args=("--hot-cache-size", "0"))
    yield c
    c.close()


def test_libkvpool_reads_large_values_from_the_node_that_holds_them(uncached):
    cluster = uncached
    import kvpool
    # Large values written through node A; read with libkvpool through node B. Those held
    # by C come straight from C (one hop): C serves the gets, B relays none of them.
    writer = cluster.raw(0)
    keys = ["big-%d" % i for i in range(24)]
    for key in keys:
        assert writer.put(key, value_of(key, 300 << 10)) == OK
    on_c = [k for k in keys if cluster.locate(k) == ["hC"]]
    assert on_c
    before = cluster.raw(1).stats()
    with kvpool.Client(cluster.nodes[1].endpoint) as client:
        for key in on_c:
            assert client.get(key) == value_of(key, 300 << 10)
        values = client.get_batch(keys)
        assert values == [value_of(k, 300 << 10) for k in keys]
        into = [bytearray(300 << 10) for _ in on_c]
        sizes = client.get_batch_into(on_c, into)
        assert list(sizes) == [300 << 10] * len(on_c)
        assert [bytes(b) for b in into] == [value_of(k, 300 << 10) for k in on_c]
    after = cluster.raw(1).stats()
    # B sent the client to the nodes that hold the values (one hop) and relayed none.
    assert after.redirects - before.redirects >= 2 * len(on_c) + len(on_c)
    assert after.remote_gets == before.remote_gets
    # A raw client that did not ask for redirects gets the same bytes relayed by B.
    status, value = cluster.raw(1).get(on_c[0])
    assert status == OK and value == value_of(on_c[0], 300 << 10)
    assert cluster.raw(1).stats().remote_gets == before.remote_gets + 1
    # Small values are relayed even for libkvpool (one round trip fewer for the client).
    assert writer.put("small", b"s" * 100) == OK
    small_on = cluster.locate("small")
    reader = [i for i, h in enumerate(["hA", "hB", "hC"]) if h not in small_on][0]
    before = cluster.raw(reader).stats()
    with kvpool.Client(cluster.nodes[reader].endpoint) as client:
        assert client.get("small") == b"s" * 100
    after = cluster.raw(reader).stats()
    assert after.remote_gets == before.remote_gets + 1 and after.redirects == before.redirects


def test_vllm_lookup_and_reset_through_any_node():
    import msgpack
    import zmq
    c = Cluster(node_args=("--lookup-model", "m", "--lookup-tp-size", "1",
                           "--lookup-block-size", "16"))
    try:
        hashes = [bytes([i]) * 32 for i in range(1, 9)]
        # Blocks 0..5 stored through three different nodes; 6 and 7 missing.
        for i, h in enumerate(hashes[:6]):
            key = "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + h.hex()
            assert c.raw(i % 3).put(key, b"kv" * 100) == OK

        def lookup(node):
            sock = zmq.Context.instance().socket(zmq.REQ)
            sock.linger = 0
            sock.rcvtimeo = 10000
            sock.connect(c.nodes[node].admin)
            sock.send_multipart([b"lookup", (1000).to_bytes(4, "big"),
                                 msgpack.packb([h.hex() for h in hashes])])
            reply = sock.recv_multipart()
            sock.close()
            return int.from_bytes(reply[0], "big")

        # Every node sees the leading six blocks, wherever they live.
        assert [lookup(n) for n in range(3)] == [96, 96, 96]
        # A reset through one node empties the whole cluster.
        sock = zmq.Context.instance().socket(zmq.REQ)
        sock.linger = 0
        sock.rcvtimeo = 10000
        sock.connect(c.nodes[1].admin)
        sock.send_multipart([b"reset"])
        assert sock.recv_multipart() == [b"\x01"]
        sock.close()
        assert [lookup(n) for n in range(3)] == [0, 0, 0]
        for n in range(3):
            assert c.raw(n).stats().objects == 0
        for d in c.nodes + [c.master]:
            assert d.stop() == 0, c.logs()
    finally:
        c.close()


# ---- each node in its own network namespace ----------------------------------------------

NETNS_PREFIX = "kvpt%d" % (os.getpid() % 100000)
SUBNET = "10.%d.%d" % (100 + os.getpid() % 100, os.getpid() // 100 % 250)


def _ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), check=check, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode


def _netns_usable():
    if os.geteuid() != 0 or not shutil.which("ip"):
        return False
    name = NETNS_PREFIX + "probe"
    if _ip("netns", "add", name, check=False) != 0:
        return False
    _ip("netns", "del", name, check=False)
    return True


class Netns:
    """A bridge in this namespace (SUBNET.1) and one namespace a node, each on a veth pair
    with its own address (SUBNET.11, .12, ...). Only these addresses: nothing leaves the
    machine."""

    def __init__(self, count):
        self.names = []
        self.bridge = NETNS_PREFIX + "br"
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", SUBNET + ".1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(count):
                name = "%sn%d" % (NETNS_PREFIX, i)
                veth, peer = "%sv%d" % (NETNS_PREFIX, i), "%sp%d" % (NETNS_PREFIX, i)
                _ip("netns", "add", name)
                self.names.append(name)
                _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", name)
                _ip("link", "set", veth, "master", self.bridge, "up")
                _ip("netns", "exec", name, "ip", "addr", "add", self.address(i) + "/24", "dev",
                    peer)
                _ip("netns", "exec", name, "ip", "link", "set", peer, "up")
                _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def address(i):
        return "%s.%d" % (SUBNET, 11 + i)

    def close(self):
        for name in self.names:
            _ip("netns", "del", name, check=False)  # its end of the veth pair goes with it
        _ip("link", "del", self.bridge, check=False)


@pytest.mark.skipif(not _netns_usable(), reason="needs root and ip netns")
def test_nodes_in_their_own_network_namespaces():
    net = Netns(3)
    daemons = []
    try:
        # Addresses other than loopback: without CURVE, only with --insecure (test_curve.py
        # runs a cluster with CURVE).
        master = Kvpoold("--role", "master", "--node-ttl", str(TTL_MS), "--master",
                         "tcp://%s.1:*" % SUBNET, "--insecure", prefix="kvpool-master-")
        daemons.append(master)
        nodes = []
        for i in range(3):
            here = "tcp://%s:*" % Netns.address(i)
            node = Kvpoold("--role", "node", "--master", master.endpoint, "--host-id", "ns%d" % i,
                           "--insecure",
                           "--segment-size", "64MiB", "--heartbeat-interval", str(HEARTBEAT_MS),
                           "--cluster-timeout", str(TIMEOUT_MS), "--stripe-size", "1MiB",
                           endpoints=(here,), admins=(here,), prefix="kvpool-node-",
                           wrapper=("ip", "netns", "exec", net.names[i]))
            daemons.append(node)
            nodes.append(node)
            assert node.endpoint.startswith("tcp://" + Netns.address(i))

        def live():
            reply, _ = Raw(nodes[0].endpoint).call(pb.NODES)
            return sum(1 for n in reply.nodes if n.alive and n.capacity) == 3

        assert wait_for(live, 10)
        keys = ["ns-%d" % i for i in range(30)]
        for i, key in enumerate(keys):
            size = 2 * MiB + i if i % 10 == 0 else 1000 + i
            assert Raw(nodes[i % 3].endpoint).put(key, value_of(key, size),
                                                  put={"replica_num": 2}) == OK
        for node in nodes:
            raw = Raw(node.endpoint)
            for i, key in enumerate(keys):
                size = 2 * MiB + i if i % 10 == 0 else 1000 + i
                assert raw.get(key) == (OK, value_of(key, size)), (node.endpoint, key)
        reply, _ = Raw(nodes[1].endpoint).call(pb.LOCATE, keys)
        for where in reply.locations:
            hosts = {reply.nodes[n].host_id for n in where.nodes}
            assert len(hosts) == 2
        # Each node's data plane is on its own address.
        assert all(n.client_endpoint.startswith("tcp://" + SUBNET) for n in reply.nodes)
        for d in reversed(daemons):
            assert d.stop() == 0, d.log_text(3000)
    finally:
        for d in daemons:
            d.remove()
        net.close()


def test_a_node_says_when_its_master_does_not_answer():
    """A node whose master never answers keeps serving and says so in its log, once."""
    from kvpool_daemon import free_port
    node = Kvpoold("--role", "node", "--master", "tcp://127.0.0.1:%d" % free_port(),
                   "--host-id", "lonely", "--segment-size", "16MiB", "--heartbeat-interval", "200",
                   prefix="kvpool-node-")
    try:
        assert wait_for(lambda: "no answer from the master" in node.log_text(), 15), \
            node.log_text()
        assert node.log_text().count("no answer from the master") == 1
        raw = Raw(node.endpoint)
        assert raw.call(pb.PING)[0].status == 0  # it serves on
        raw.close()
    finally:
        node.finish()
