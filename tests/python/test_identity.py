"""A node's identity in a cluster, and what /health, /metrics and `kvpool top` say of it
(issue #33: identity that holds in containers; health and metrics say it).

- Nodes in network namespaces of their own on one machine (as containers are) share the
  boot id, but not the default host id (boot id and network namespace): their default
  node ids differ even on the same port, and the master keeps both.
- A second live node started under a live node's --node-id is refused, logs why and exits
  non-zero; the first keeps serving. A node restarted under its id is not refused.
- A node bound to a wildcard address refuses to start without --advertise; with it, it
  announces that address and serves through the cluster.
- A node's /health says degraded (503) while its master is gone, ok once it is back;
  `kvpool top` shows the master link.
- The master's /health and /metrics give the cluster's objects, bytes and capacity.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import json
import os
import random
import re
import signal
import socket
import subprocess
import urllib.error
import urllib.request

import pytest

from kvpool_daemon import Kvpoold, bin_dir, free_port, wait_for  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402
from test_cluster import (HEARTBEAT_MS, SUBNET, TIMEOUT_MS, Cluster, Netns,  # noqa: E402
                          _netns_usable, value_of)

OK = 0
MiB = 1 << 20
BOOT_ID = open("/proc/sys/kernel/random/boot_id").read().strip()


def http_get(url):
    """(status, body) of a GET of url."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def health(daemon):
    status, body = http_get(daemon.metrics + "/health")
    return status, json.loads(body)


def health_until(daemon, code, timeout):
    """The /health body of the first answer with HTTP status code within timeout seconds
    (each look is one request, so that status and body go together), or fails."""
    seen = []

    def look():
        seen[:] = [health(daemon)]
        return seen[0][0] == code

    assert wait_for(look, timeout), seen
    return seen[0][1]


def port_below_ephemeral():
    """A free loopback port under the ephemeral range (ip_local_port_range starts at 32768
    by default). A master restarted on its port needs one: while it is away its nodes
    reconnect to that port every 100 ms, and a connect to a port in the ephemeral range can
    be given that very port as its own (a TCP self-connect), which then holds it."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(100):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port under %d" % low)


def nodes(endpoint):
    reply, _ = Raw(endpoint).call(pb.NODES)
    assert reply.status == OK, reply
    return list(reply.nodes)


@pytest.mark.skipif(not _netns_usable(), reason="needs root and ip netns")
def test_nodes_in_their_own_network_namespaces_are_told_apart():
    # Two nodes, each in a namespace of its own, on the same client port and with no
    # --host-id nor --node-id: as containers started from one image are.
    net = Netns(2)
    daemons = []
    try:
        master = Kvpoold("--role", "master", "--master", "tcp://%s.1:*" % SUBNET, "--insecure",
                         prefix="kvpool-master-")
        daemons.append(master)
        port = free_port()
        members = []
        for i in range(2):
            here = "tcp://%s:%d" % (Netns.address(i), port)
            node = Kvpoold("--role", "node", "--master", master.endpoint, "--insecure",
                           "--segment-size", "32MiB", "--heartbeat-interval", str(HEARTBEAT_MS),
                           "--cluster-timeout", str(TIMEOUT_MS),
                           endpoints=(here,), admins=("tcp://%s:*" % Netns.address(i),),
                           prefix="kvpool-node-", wrapper=("ip", "netns", "exec", net.names[i]))
            daemons.append(node)
            members.append(node)

        def both_live():
            return sum(1 for n in nodes(members[0].endpoint) if n.alive and n.capacity) == 2

        assert wait_for(both_live, 10), [d.log_text(3000) for d in daemons]
        listed = nodes(members[0].endpoint)
        hosts = {n.host_id for n in listed}
        assert len(hosts) == 2, listed
        # Each is the boot id and the inode of its namespace, as the node's own process sees it.
        for i in range(2):
            inode = subprocess.run(["ip", "netns", "exec", net.names[i], "stat", "-L", "-c",
                                    "%i", "/proc/self/ns/net"], capture_output=True, text=True,
                                   check=True).stdout.strip()
            assert "%s-net%s" % (BOOT_ID, inode) in hosts, (inode, hosts)
        assert len({n.node_id for n in listed}) == 2
        assert "refused" not in master.log_text()
        # Two replicas of a key go to the two of them: distinct hosts.
        assert Raw(members[0].endpoint).put("ns-key", value_of("ns-key", 5000),
                                            put={"replica_num": 2}) == OK
        reply, _ = Raw(members[1].endpoint).call(pb.LOCATE, ["ns-key"])
        assert len({reply.nodes[n].host_id for n in reply.locations[0].nodes}) == 2
        assert Raw(members[1].endpoint).get("ns-key") == (OK, value_of("ns-key", 5000))
        for d in reversed(daemons):
            assert d.stop() == 0, d.log_text(3000)
    finally:
        for d in daemons:
            d.remove()
        net.close()


def test_a_second_live_node_under_a_taken_id_is_refused_and_exits():
    c = Cluster(hosts=("hA",))
    twin = None
    try:
        first = c.nodes[0]
        node_id = nodes(first.endpoint)[0].node_id
        assert c.raw(0).put("before", b"kept") == OK
        twin = Kvpoold("--role", "node", "--master", c.master_endpoint, "--host-id", "hB",
                       "--node-id", node_id, "--segment-size", "16MiB",
                       "--heartbeat-interval", str(HEARTBEAT_MS), prefix="kvpool-twin-")
        assert wait_for(lambda: not twin.alive(), 10), twin.log_text(3000)
        assert twin.stop() == 1, twin.log_text(3000)
        log = twin.log_text()
        assert "another live node (clients %s) has this id" % first.endpoint in log, log
        assert "this node stops" in log, log
        # The first keeps its name, its keys, and serves on.
        assert first.alive()
        listed = nodes(first.endpoint)
        assert [(n.node_id, n.client_endpoint, n.alive) for n in listed] \
            == [(node_id, first.endpoint, True)]
        assert c.raw(0).get("before") == (OK, b"kept")
        assert c.raw(0).put("after", b"new") == OK
        assert "refused a REGISTER of node %s" % node_id in c.master.log_text()
        for d in c.nodes + [c.master]:
            assert d.stop() == 0, c.logs()
    finally:
        if twin:
            twin.remove()
        c.close()


def test_a_node_restarted_at_once_on_its_endpoints_is_not_refused():
    # Killed and started again at once under its id and on its ports: whether or not the
    # master saw its old connection close first, it is never taken for a second node.
    master = Kvpoold("--role", "master", "--node-ttl", "60000", "--master", "tcp://127.0.0.1:*",
                     prefix="kvpool-master-")
    node = None
    try:
        args = ("--role", "node", "--master", master.endpoint, "--host-id", "hA",
                "--node-id", "restarted", "--segment-size", "16MiB", "--heartbeat-interval",
                str(HEARTBEAT_MS), "--peer-endpoint", "tcp://127.0.0.1:%d" % free_port())
        endpoints = ("tcp://127.0.0.1:%d" % free_port(),)
        for round in range(3):
            node = Kvpoold(*args, endpoints=endpoints, prefix="kvpool-node-")
            registered = "node restarted (host hA) registered"
            assert wait_for(lambda: master.log_text().count(registered) == round + 1, 10), \
                (master.log_text(3000), node.log_text(3000))
            assert wait_for(lambda: Raw(node.endpoint).put("r-%d" % round, b"v") == OK, 5)
            assert node.alive() and "this node stops" not in node.log_text()
            os.kill(node.pid, signal.SIGKILL)
            node.proc.wait()
            node.remove()
        assert master.stop() == 0
    finally:
        if node:
            node.remove()
        master.remove()


def test_a_wildcard_bind_is_announced_as_advertise_says():
    c = Cluster(hosts=("hA",))
    wide = None
    try:
        args = ("--role", "node", "--master", c.master_endpoint, "--host-id", "hW",
                "--insecure", "--segment-size", "32MiB", "--heartbeat-interval",
                str(HEARTBEAT_MS), "--cluster-timeout", str(TIMEOUT_MS))
        with pytest.raises(AssertionError) as refused:
            Kvpoold(*args, endpoints=("tcp://0.0.0.0:*",), prefix="kvpool-wide-")
        assert "binds every address" in str(refused.value) \
            and "--advertise HOST" in str(refused.value), refused.value
        assert c.live_nodes() == 1
        wide = Kvpoold(*args, "--advertise", "127.0.0.1", endpoints=("tcp://0.0.0.0:*",),
                       prefix="kvpool-wide-")
        port = wide.endpoint.rsplit(":", 1)[1]
        assert wide.endpoint.startswith("tcp://0.0.0.0:")
        assert wait_for(lambda: c.live_nodes() == 2, 10), c.logs()
        listed = {n.host_id: n for n in nodes(c.nodes[0].endpoint)}
        assert listed["hW"].client_endpoint == "tcp://127.0.0.1:" + port, listed
        plane = re.search(r"announced as \S+, data plane (tcp://\S+)", wide.log_text()).group(1)
        assert plane.startswith("tcp://127.0.0.1:"), plane
        # Values cross to and from it through the cluster: some of these land on it.
        near = Raw("tcp://127.0.0.1:" + port)
        keys = ["w-%d" % i for i in range(24)]
        for i, key in enumerate(keys):
            writer = c.raw(0) if i % 2 else near
            assert writer.put(key, value_of(key, 2000 + i)) == OK, key
        held = {key: c.locate(key)[0] for key in keys}
        assert set(held.values()) == {"hA", "hW"}, held
        for key in keys:
            assert c.raw(0).get(key) == (OK, value_of(key, 2000 + keys.index(key)))
            assert near.get(key) == (OK, value_of(key, 2000 + keys.index(key)))
        assert wide.stop() == 0, wide.log_text(3000)
        for d in c.nodes + [c.master]:
            assert d.stop() == 0, c.logs()
    finally:
        if wide:
            wide.remove()
        c.close()


def test_health_says_degraded_while_the_master_is_gone():
    # The master on a port it can have again once it is gone (port_below_ephemeral).
    master_args = ("--role", "master", "--node-ttl", "2000", "--master",
                   "tcp://127.0.0.1:%d" % port_below_ephemeral())
    master = Kvpoold(*master_args, prefix="kvpool-master-")
    node = None
    try:
        node = Kvpoold("--role", "node", "--master", master.endpoint, "--host-id", "hA",
                       "--segment-size", "16MiB", "--heartbeat-interval", str(HEARTBEAT_MS),
                       "--metrics-port", str(free_port()), prefix="kvpool-node-")
        body = health_until(node, 200, 10)
        assert body["status"] == "ok" and body["master"]["connected"] is True, body
        assert body["master"]["endpoint"] == master.endpoint, body
        assert body["master"]["term"] == 0 and body["master"]["registered"] is True
        assert body["master"]["lease_seconds"] == pytest.approx(3 * HEARTBEAT_MS / 1000)
        top = subprocess.run([os.path.join(bin_dir(), "kvpool"), "-s", node.endpoint, "top",
                              "--once", "--interval", "300"], capture_output=True, text=True,
                             timeout=30)
        assert top.returncode == 0, top.stderr
        assert re.search(r"^master\s+connected\s+%s\s+term 0\s+silent" % re.escape(
            master.endpoint), top.stdout, re.M), top.stdout
        master.proc.kill()
        master.proc.wait()
        # Past its lease (3 heartbeats) without a word from the master: degraded.
        body = health_until(node, 503, 5)
        assert body["status"] == "degraded" and body["master"]["connected"] is False, body
        assert body["master"]["silence_seconds"] > 3 * HEARTBEAT_MS / 1000, body
        assert Raw(node.endpoint).stats().master_connected == 0
        top = subprocess.run([os.path.join(bin_dir(), "kvpool"), "-s", node.endpoint, "top",
                              "--once", "--interval", "300"], capture_output=True, text=True,
                             timeout=30)
        assert re.search(r"^master\s+DEGRADED", top.stdout, re.M), top.stdout
        # The master back on its endpoint: the node registers again, and is ok.
        master.remove()
        master = Kvpoold(*master_args, prefix="kvpool-master-")
        body = health_until(node, 200, 10)
        assert body["status"] == "ok" and body["master"]["connected"] is True, body
        assert wait_for(lambda: Raw(node.endpoint).stats().master_connected == 1, 5)
        assert node.stop() == 0, node.log_text(3000)
        assert master.stop() == 0, master.log_text(3000)
    finally:
        if node:
            node.remove()
        master.remove()


def test_the_master_reports_the_cluster():
    c = Cluster(hosts=("hA", "hB"), master_args=("--metrics-port", str(free_port())))
    try:
        master = c.master
        capacity = sum(n.capacity for n in nodes(c.nodes[0].endpoint))
        assert capacity > 0
        keys = ["c-%d" % i for i in range(10)]
        for i, key in enumerate(keys):
            assert c.raw(i % 2).put(key, value_of(key, 100 * 1024)) == OK

        def reported():
            status, body = health(master)
            return (status == 200 and body["objects"] == 10
                    and body["stored_bytes"] >= 10 * 100 * 1024
                    and body["capacity_bytes"] == capacity)

        assert wait_for(reported, 10), health(master)
        status, body = health(master)
        assert body["nodes_alive"] == 2 and body["keys"] == 10, body
        assert body["replicas_missing"] == 0 and body["failovers"] == 0, body
        status, text = http_get(master.metrics + "/metrics")
        assert status == 200
        assert "\nkvpool_cluster_objects 10\n" in text, text
        assert "\nkvpool_cluster_capacity_bytes %d\n" % capacity in text, text
        used = int(re.search(r"^kvpool_cluster_used_bytes (\d+)$", text, re.M).group(1))
        assert used >= 10 * 100 * 1024
        for name in ("kvpool_cluster_replicas_missing", "kvpool_cluster_repairs_total",
                     "kvpool_master_failovers_total"):
            assert re.search(r"^%s 0$" % name, text, re.M), name
        for d in c.nodes + [c.master]:
            assert d.stop() == 0, c.logs()
    finally:
        c.close()
