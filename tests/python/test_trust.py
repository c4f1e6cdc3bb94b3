"""The cluster's inner doors, tried as an attacker would (docs/security.md, "A cluster's
own doors"): a process without the cluster key gets nothing from the master or a data
plane; one with it (a node) cannot speak for another node, commit what it did not place,
report what it cannot hold, or write into another node's reservation; PUT_END commits
only a reservation whose every byte was written; and a same-machine client is refused
every operation meant for nodes. Each attack here succeeded before the cluster's trust
(a fake node's bytes were served with OK; a removed object's bytes read back).
"""

import importlib.util
import os
import re
import signal
import subprocess
import tempfile
import time

import pytest
import zmq

from kvpool_daemon import Kvpoold, wait_for  # noqa: F401
from kvpool_raw import OK, Raw, default_cluster_key
from kvpool_test_pb import REPO, pb
from test_cluster import Cluster, value_of

INVALID_PARAMS = -600
INVALID_WRITE = -700
PERMISSION_DENIED = -604
UNAVAILABLE = -1010
OBJECT_NOT_FOUND = -704
NO_AVAILABLE_HANDLE = -200
REFUSED_MS = 700


def _cluster_pb2():
    out = tempfile.mkdtemp(prefix="kvpool-cluster-pb-")
    subprocess.run(["protoc", "--python_out=" + out, "-I" + os.path.join(REPO, "protocol"),
                    os.path.join(REPO, "protocol", "cluster.proto")], check=True)
    spec = importlib.util.spec_from_file_location("cluster_pb2_for_tests",
                                                  os.path.join(out, "cluster_pb2.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cpb = _cluster_pb2()


class FakeNode:
    """A DEALER to the master speaking kvpool.cluster.v1, with or without the cluster key."""

    def __init__(self, endpoint, key=None, user="kvpool-node"):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        if key is not None:
            self.sock.plain_username = user.encode()
            self.sock.plain_password = key
        self.sock.connect(endpoint)
        self.next_id = 1

    def call(self, kind, node_id, timeout_ms=3000, **fields):
        node = fields.pop("node", None) or cpb.Node(node_id=node_id, host_id="h-" + node_id,
                                                   client_endpoint="tcp://127.0.0.1:1",
                                                   peer_endpoint="tcp://127.0.0.1:2",
                                                   capacity=1 << 20, free=1 << 20)
        request = cpb.NodeRequest(version=1, request_id=self.next_id, kind=kind, node=node,
                                  **fields)
        self.next_id += 1
        self.sock.send(request.SerializeToString())
        if not self.sock.poll(timeout_ms):
            return None
        reply = cpb.MasterReply()
        reply.ParseFromString(self.sock.recv())
        return reply

    def close(self):
        self.sock.close()


def plane_of(daemon):
    return re.search(r"data plane (tcp://\S+)", daemon.log_text()).group(1)


@pytest.fixture
def cluster():
    c = Cluster(hosts=("hA", "hB"))
    yield c
    statuses = [d.stop() for d in c.nodes + [c.master]]
    c.close()
    assert statuses == [0] * len(statuses)


def node_ids(cluster):
    reply, _ = cluster.raw(0).call(pb.NODES)
    return {n.host_id: n.node_id for n in reply.nodes}


def test_without_the_cluster_key_the_inner_doors_stay_shut(cluster):
    # A fake node with no key, or a wrong one, gets no answer from the master: it can
    # neither register nor report an inventory of keys nobody put.
    for key in (None, b"0" * 64):
        fake = FakeNode(cluster.master_endpoint, key)
        assert fake.call(cpb.REGISTER, "fake", timeout_ms=REFUSED_MS) is None
        fake.close()
    # The data plane, the same: the reservation trick that read back a removed object's
    # bytes (PUT_START, PUT_END with no PUT_PART, GET) gets no answer at all.
    plane = plane_of(cluster.nodes[1])
    for key in (None, b"0" * 64):
        raw = Raw(plane, timeout_ms=REFUSED_MS, **({} if key is None else {"cluster_key": key}))
        reply, _ = raw.recv(raw.send(pb.PUT_START, ["stolen"], sizes=[1 << 20]))
        assert reply is None
        raw.close()
    # With the key, the same door answers.
    raw = Raw(plane, cluster_key=True)
    assert raw.call(pb.PING)[0].status == OK
    raw.close()


def test_a_reservation_commits_only_written_and_only_for_its_maker(cluster):
    plane = plane_of(cluster.nodes[1])
    # A node reserves; PUT_END before every byte is written stores nothing, and nothing of
    # what the space held before is ever read back.
    maker = Raw(plane, cluster_key=True, node="kvpool-node/maker")
    assert cluster.raw(1).put("old", b"S" * (1 << 20)) == OK
    assert cluster.raw(1).call(pb.REMOVE, ["old"], force=True)[0].statuses[0] == OK
    reply, _ = maker.call(pb.PUT_START, ["r"], sizes=[1 << 20])
    assert reply.statuses[0] == OK, reply
    reply, _ = maker.call(pb.PUT_PART, ["r"], [b"x" * 1000], offsets=[0], lengths=[1000])
    assert reply.statuses[0] == OK
    reply, _ = maker.call(pb.PUT_END, ["r"])
    assert reply.statuses[0] == INVALID_WRITE and "were written" in reply.error, reply
    assert maker.get("r")[0] == OBJECT_NOT_FOUND
    # Another node's connection cannot write into the reservation, end it or revoke it.
    other = Raw(plane, cluster_key=True, node="kvpool-node/other")
    reply, _ = other.call(pb.PUT_PART, ["r"], [b"E" * 1000], offsets=[1000], lengths=[1000])
    assert reply.statuses[0] == INVALID_WRITE, reply
    assert other.call(pb.PUT_REVOKE, ["r"])[0].statuses[0] == INVALID_WRITE
    # The maker's parts, on any of its connections (stripes go over several), complete it.
    second = Raw(plane, cluster_key=True, node="kvpool-node/maker")
    rest = (1 << 20) - 1000
    reply, _ = second.call(pb.PUT_PART, ["r"], [b"y" * rest], offsets=[1000], lengths=[rest])
    assert reply.statuses[0] == OK, reply
    reply, _ = maker.call(pb.PUT_END, ["r"])
    assert reply.statuses[0] == OK
    # Stored, but served only to a read that names its version (which only the master
    # gives out) until its writer confirms it: no master committed it.
    assert maker.get("r")[0] == OBJECT_NOT_FOUND
    reply, frames = maker.call(pb.GET, ["r"], versions=[reply.versions[0]])
    assert reply.statuses[0] == OK and frames[0] == b"x" * 1000 + b"y" * rest
    assert maker.get("r") == (OK, b"x" * 1000 + b"y" * rest)
    for r in (maker, other, second):
        r.close()


def test_node_only_operations_are_refused_to_same_machine_clients(cluster):
    ipc = Raw(cluster.nodes[0].ipc)
    reply, _ = ipc.call(pb.PUT_PART, ["q"], [b"abc"], offsets=[0], lengths=[3])
    assert (reply.status or reply.statuses[0]) == PERMISSION_DENIED, reply
    reply, _ = ipc.call(pb.RDMA_CONNECT, rdma_data=b"\0" * 64)
    assert reply.status == PERMISSION_DENIED and "nodes" in reply.error, reply
    reply, _ = ipc.call(pb.CONFIRM, ["q"], versions=[1])
    assert reply.status == PERMISSION_DENIED and "nodes" in reply.error, reply
    ipc.close()


def test_a_copy_no_master_committed_is_served_to_nobody(cluster):
    # A node writes a copy here for a put whose commit never comes (the writer died, or it
    # fenced this node while the write waited in this node's socket): this node's clients
    # never read it, not even after a restart of the master, which it is not reported to.
    plane = plane_of(cluster.nodes[1])
    writer = Raw(plane, cluster_key=True, node="kvpool-node/writer")
    reply, _ = writer.call(pb.UPSERT, ["ghost"], [b"G" * 5000])
    assert reply.statuses[0] == OK, reply
    version = reply.versions[0]
    for client in (Raw(cluster.nodes[1].ipc), cluster.raw(1), cluster.raw(0)):
        assert client.get("ghost")[0] == OBJECT_NOT_FOUND
        assert not client.exist("ghost")
    # A CONFIRM of another version confirms nothing; of its own, the copy is served.
    assert writer.call(pb.CONFIRM, ["ghost"], versions=[version + 1])[0].statuses[0] \
        == OBJECT_NOT_FOUND
    assert cluster.raw(1).get("ghost")[0] == OBJECT_NOT_FOUND
    assert writer.call(pb.CONFIRM, ["ghost"], versions=[version])[0].statuses[0] == OK
    assert cluster.raw(1).get("ghost") == (OK, b"G" * 5000)
    # A CONFIRM names a version for each key.
    reply, _ = writer.call(pb.CONFIRM, ["ghost"])
    assert (reply.status or reply.statuses[0]) == INVALID_PARAMS, reply
    # A put's copies on other nodes are served there once it returns, through shared
    # memory too (its writer confirmed them).
    assert cluster.raw(0).put("both", b"B" * 7000, put={"replica_num": 2}) == OK
    ipc = Raw(cluster.nodes[1].ipc)
    before = ipc.index_gets()
    assert ipc.get("both") == (OK, b"B" * 7000)
    assert wait_for(lambda: ipc.get("both") == (OK, b"B" * 7000) and ipc.index_gets() > before)
    ipc.close()
    # A master that restarts is not told of such a copy (it would take it for a value).
    reply, _ = writer.call(pb.UPSERT, ["ghost-2"], [b"H" * 5000])
    assert reply.statuses[0] == OK
    version_2 = reply.versions[0]
    port = cluster.master_endpoint.rsplit(":", 1)[1]
    cluster.master.proc.kill()
    cluster.master.proc.wait()
    cluster.master = Kvpoold(*cluster.master_args, "--master", "tcp://127.0.0.1:%s" % port,
                             prefix="kvpool-master-")
    assert wait_for(lambda: cluster.raw(0).call(pb.LOCATE, ["ghost"])[0].statuses[0] == OK, 10)
    for client in (cluster.raw(1), cluster.raw(0)):
        assert client.get("ghost-2")[0] == OBJECT_NOT_FOUND
    assert cluster.raw(0).call(pb.LOCATE, ["ghost-2"])[0].statuses[0] == OBJECT_NOT_FOUND
    # Nor does a CONFIRM that comes after the node registered again serve it: whatever the
    # master knew of the node's copies then is gone (the copy went when it registered).
    assert writer.call(pb.CONFIRM, ["ghost-2"], versions=[version_2])[0].statuses[0] \
        == OBJECT_NOT_FOUND
    assert cluster.raw(1).get("ghost-2")[0] == OBJECT_NOT_FOUND
    writer.close()


def test_a_node_cannot_speak_for_another(cluster):
    key = default_cluster_key()
    ids = node_ids(cluster)
    a_id = ids["hA"]
    values = {"held-%d" % i: value_of("held-%d" % i, 5000 + i) for i in range(20)}
    for k, v in values.items():
        assert cluster.raw(0).put(k, v) == OK
    # A holder of the key that says it is another node is refused at REGISTER.
    liar = FakeNode(cluster.master_endpoint, key, "kvpool-node/someone-else")
    reply = liar.call(cpb.REGISTER, a_id)
    assert reply.status == PERMISSION_DENIED, reply
    liar.close()
    # A second connection under a live node's name is refused, and the node keeps its keys.
    twin = FakeNode(cluster.master_endpoint, key, "kvpool-node/" + a_id)
    reply = twin.call(cpb.REGISTER, a_id)
    assert reply.status == UNAVAILABLE and "registered already" in reply.error, reply
    epoch = reply.epoch
    # Heartbeats, inventories and removals without the node's registration are not its.
    reply = twin.call(cpb.HEARTBEAT, a_id, epoch=epoch, registration=12345)
    assert reply.status == INVALID_PARAMS and "unknown node" in reply.error
    reply = twin.call(cpb.INVENTORY, a_id, epoch=epoch, registration=12345,
                      keys=[b"never-put"], sizes=[10])
    assert reply.status == INVALID_PARAMS
    reply = twin.call(cpb.REMOVE_ALL, a_id, epoch=epoch, registration=12345)
    assert reply.status == UNAVAILABLE
    twin.close()
    assert cluster.raw(1).call(pb.LOCATE, ["never-put"])[0].statuses[0] == OBJECT_NOT_FOUND
    for reader in (0, 1):
        for k, v in values.items():
            assert cluster.raw(reader).get(k) == (OK, v), (reader, k)


def test_a_registered_node_commits_only_what_it_placed_and_reports_what_it_can_hold(cluster):
    key = default_cluster_key()
    ids = node_ids(cluster)
    assert cluster.raw(0).put("victim", b"the real value") == OK
    # A node of its own (it holds the key) registers with 1 MiB of memory and no disk.
    fake = FakeNode(cluster.master_endpoint, key, "kvpool-node/fake")
    reply = fake.call(cpb.REGISTER, "fake")
    assert reply.status == OK, reply
    session = dict(epoch=reply.epoch, registration=reply.registration)
    # A COMMIT without the tokens PLACE gave cannot move an existing key's holders to it.
    reply = fake.call(cpb.COMMIT, "fake", keys=[b"victim"], nodes=["fake"],
                      holders=[cpb.Holders(nodes=[0])], **session)
    assert reply.status == INVALID_PARAMS, reply
    # An inventory past its memory is refused past that point: 3 of 1 MiB fit none but
    # the first.
    reply = fake.call(cpb.INVENTORY, "fake", keys=[b"inv-1", b"inv-2", b"inv-3"],
                      sizes=[1 << 19, 1 << 20, 1 << 20], **session)
    assert reply.status == OK and reply.count == 1, reply
    assert sorted(reply.keys) == [b"inv-2", b"inv-3"]
    fake.close()
    assert cluster.raw(1).get("victim") == (OK, b"the real value")
    assert cluster.locate("victim") in (["hA"], ["hB"])
    assert ids  # the real nodes are untouched


def test_a_restarted_node_takes_its_place_at_once():
    # The connection that registered a node closes when it dies: a node restarted under
    # the same id registers within seconds, long before --node-ttl (60 s here) would let
    # another connection take the name.
    c = Cluster(hosts=("hA",), master_args=("--node-ttl", "60000"))
    try:
        node_id = node_ids(c)["hA"]
        assert c.raw(0).put("kept", b"v") == OK
        old = c.nodes[0]
        os.kill(old.pid, signal.SIGKILL)
        old.proc.wait()
        c.nodes[0] = c.start_node("hA", "--node-id", node_id)
        start = time.monotonic()
        registered = "node %s (host hA) registered" % node_id
        assert wait_for(lambda: c.master.log_text().count(registered) == 2
                        and c.live_nodes() == 1, 10), c.logs()
        assert time.monotonic() - start < 10
        old.remove()
    finally:
        c.close()


def test_a_cluster_key_others_can_read_is_refused():
    folder = tempfile.mkdtemp(prefix="kvpool-key-")
    key = os.path.join(folder, "cluster.key")
    with open(key, "w") as f:
        f.write("a" * 64 + "\n")
    os.chmod(key, 0o644)
    out = subprocess.run([os.path.join(os.environ.get("KVPOOL_BIN", "build/bin"), "kvpoold"),
                          "--role", "master", "--master", "tcp://127.0.0.1:*",
                          "--cluster-key", key, "--metrics-port", "0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "chmod 600" in out.stderr, out.stderr
    os.unlink(key)
    os.rmdir(folder)


def test_a_node_holds_at_most_max_node_objects_directory_entries():
    # One fake node reporting 1,000,000 keys cost the master 109 MB, and 225 ms when it went
    # silent; now a node's share is bounded by count as well as by bytes: past
    # --max-node-objects its INVENTORY is refused (the node drops those keys) and PLACE
    # chooses another node, or none.
    master = Kvpoold("--role", "master", "--master", "tcp://127.0.0.1:*",
                     "--max-node-objects", "100", prefix="kvpool-master-")
    fakes = []
    try:
        key = default_cluster_key()
        big = cpb.Node(node_id="big", host_id="h-big", client_endpoint="tcp://127.0.0.1:1",
                       peer_endpoint="tcp://127.0.0.1:2", capacity=1 << 30, free=1 << 30)
        fake = FakeNode(master.endpoint, key, "kvpool-node/big")
        fakes.append(fake)
        reply = fake.call(cpb.REGISTER, "big", node=big)
        assert reply.status == OK, reply
        session = dict(node=big, epoch=reply.epoch, registration=reply.registration)
        keys = [b"obj-%d" % i for i in range(150)]
        reply = fake.call(cpb.INVENTORY, "big", keys=keys, sizes=[100] * 150, **session)
        assert reply.status == OK and reply.count == 100, reply
        assert sorted(reply.keys) == sorted(keys[100:])
        # Reported again, the keys it holds are still its own; the others still refused.
        reply = fake.call(cpb.INVENTORY, "big", keys=keys[90:110], sizes=[100] * 20, **session)
        assert reply.count == 0 and sorted(reply.keys) == sorted(keys[100:110]), reply
        assert "--max-node-objects: 50 more it reported refused" in master.log_text()
        # PLACE passes over the full node: with no other, nothing is placed.
        reply = fake.call(cpb.PLACE, "big", keys=[b"new"], sizes=[100], replica_num=1,
                          **session)
        assert reply.status == OK and list(reply.statuses) == [NO_AVAILABLE_HANDLE], reply
        # Another node with room takes it.
        small = cpb.Node(node_id="small", host_id="h-small",
                         client_endpoint="tcp://127.0.0.1:3", peer_endpoint="tcp://127.0.0.1:4",
                         capacity=1 << 30, free=1 << 30)
        other = FakeNode(master.endpoint, key, "kvpool-node/small")
        fakes.append(other)
        assert other.call(cpb.REGISTER, "small", node=small).status == OK
        reply = fake.call(cpb.PLACE, "big", keys=[b"new"], sizes=[100], replica_num=1,
                          **session)
        assert reply.status == OK and list(reply.statuses) == [OK], reply
        assert [reply.nodes[i].node_id for i in reply.holders[0].nodes] == ["small"]
        # A COMMIT naming the full node as a holder leaves it out.
        reply = fake.call(cpb.COMMIT, "big", keys=[b"new"], nodes=["big", "small"],
                          holders=[cpb.Holders(nodes=[0, 1])], tokens=list(reply.tokens),
                          **session)
        assert reply.status == OK and list(reply.statuses) == [OK], reply
        reply = fake.call(cpb.LOCATE, "big", keys=[b"new"], **session)
        assert [reply.nodes[i].node_id for i in reply.holders[0].nodes] == ["small"], reply
    finally:
        for f in fakes:
            f.close()
        assert master.stop() == 0
