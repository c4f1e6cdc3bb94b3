"""CURVE on every socket of kvpoold that another process reaches (docs/security.md).

Certificates are made with `kvpool keygen`, in CZMQ's zcert format. Each socket is checked
three ways: a client whose public certificate is in the node's --curve-allow directory gets
answers; a client with another key, and a client without CURVE, get nothing. The sockets: the
client ROUTER over tcp and over ipc, the lookup/reset admin channel, the KV-events PUB and
replay ROUTER, and in a cluster the master, the data plane between nodes, and libkvpool's
REDIRECT to another node (whose key differs from the first node's). Also: the directory is
read again when it changes; another user with an allowed key still cannot use the ipc
endpoint or the shared-memory files; without CURVE kvpoold binds loopback only unless
--insecure.

Run by `make test` (KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3; every daemon binds
loopback and is stopped in teardown.
"""

import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import msgpack
import pytest
import zmq

from kvpool_daemon import Kvpoold, bin_dir, wait_for
from kvpool_raw import Raw
from kvpool_test_pb import pb

import kvpool
from kvpool import mooncake

OK = 0
REFUSED_MS = 700  # a refused client hears nothing; this long is enough to say so


class Cert:
    """A certificate kvpool keygen wrote: .public (path), .secret (path), .public_key and
    .secret_key (Z85 bytes)."""

    def __init__(self, folder, name):
        self.public = os.path.join(folder, name)
        self.secret = self.public + "_secret"
        out = subprocess.run([os.path.join(bin_dir(), "kvpool"), "keygen", self.public],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        text = open(self.secret).read()
        self.public_key = re.search(r'public-key = "(.{40})"', text).group(1).encode()
        self.secret_key = re.search(r'secret-key = "(.{40})"', text).group(1).encode()

    def allow(self, folder):
        shutil.copy(self.public, folder)

    def curve(self, server):
        """Raw()'s curve argument: this client's keys and server's public key."""
        return (self.public_key, self.secret_key, server.public_key)


@pytest.fixture
def keys():
    folder = tempfile.mkdtemp(prefix="kvpool-curve-")
    allow = os.path.join(folder, "allow")
    os.mkdir(allow)
    made = {name: Cert(folder, name) for name in ("server", "client", "stranger")}
    made["client"].allow(allow)
    made["folder"], made["allow"] = folder, allow
    yield made
    shutil.rmtree(folder, ignore_errors=True)


def curve_node(keys, *args):
    return Kvpoold("--segment-size", "64MiB", "--curve-secret", keys["server"].secret,
                   "--curve-allow", keys["allow"], *args, prefix="kvpool-curve-")


def answers(endpoint, curve=None, timeout_ms=5000):
    """PING's status over a fresh DEALER, or None when nothing came back in time."""
    raw = Raw(endpoint, timeout_ms=timeout_ms, curve=curve)
    try:
        reply, _ = raw.recv(raw.send(pb.PING))
        return None if reply is None else reply.status
    finally:
        raw.close()


def master_answers(endpoint, curve=None, timeout_ms=5000):
    """Whether a master answers anything (here: a protocol error) over a fresh DEALER."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    if curve:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
    sock.connect(endpoint)
    sock.send(b"not a NodeRequest")
    got = sock.poll(timeout_ms)
    sock.close()
    return bool(got)


def lookup_answer(endpoint, curve=None, timeout_ms=5000):
    """The admin channel's answer to a tagged msgpack lookup, or None."""
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.linger = 0
    if curve:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
    sock.connect(endpoint)
    sock.send_multipart([b"lookup", struct.pack(">I", 32), msgpack.packb(["00" * 16])])
    got = sock.recv() if sock.poll(timeout_ms) else None
    sock.close()
    return got


def test_keygen_writes_a_certificate_pair(keys):
    server = keys["server"]
    assert os.stat(server.secret).st_mode & 0o777 == 0o600
    public = open(server.public).read()
    assert server.public_key.decode() in public and "secret-key" not in public
    again = subprocess.run([os.path.join(bin_dir(), "kvpool"), "keygen", server.public],
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 1 and "not overwritten" in again.stderr
    assert open(server.public).read() == public


def test_client_endpoints_admit_allowed_keys_only(keys):
    d = curve_node(keys)
    try:
        client, stranger, server = keys["client"], keys["stranger"], keys["server"]
        assert "CURVE on every endpoint" in d.log_text()
        for endpoint in (d.endpoint, d.ipc):
            assert answers(endpoint, client.curve(server)) == OK, endpoint
            assert answers(endpoint, stranger.curve(server), REFUSED_MS) is None, endpoint
            assert answers(endpoint, None, REFUSED_MS) is None, endpoint  # no CURVE at all
        # A value goes in and comes back over CURVE.
        raw = Raw(d.endpoint, curve=client.curve(server))
        assert raw.put("k", b"v" * 5000) == OK
        assert raw.get("k") == (OK, b"v" * 5000)
        raw.close()
    finally:
        d.finish()


def test_the_allow_directory_is_read_again(keys):
    d = curve_node(keys)
    try:
        stranger, server = keys["stranger"], keys["server"]
        assert answers(d.endpoint, stranger.curve(server), REFUSED_MS) is None
        stranger.allow(keys["allow"])
        as_stranger = stranger.curve(server)
        assert wait_for(lambda: answers(d.endpoint, as_stranger, REFUSED_MS) == OK, 10)
        os.unlink(os.path.join(keys["allow"], "stranger"))
        assert wait_for(lambda: answers(d.endpoint, as_stranger, REFUSED_MS) is None, 10)
    finally:
        d.finish()


def test_admin_channel_and_kv_events(keys):
    d = curve_node(keys, "--kv-events-endpoint", "tcp://127.0.0.1:*",
                   "--kv-events-replay-endpoint", "tcp://127.0.0.1:*")
    client, stranger, server = keys["client"], keys["stranger"], keys["server"]
    subs = []
    try:
        # The admin channel (vLLM's lookup/reset).
        assert lookup_answer(d.admin, client.curve(server)) == struct.pack(">I", 0)
        assert lookup_answer(d.admin, stranger.curve(server), REFUSED_MS) is None
        assert lookup_answer(d.admin, None, REFUSED_MS) is None
        # KV events: only the allowed subscriber hears a put.
        for curve in (client.curve(server), stranger.curve(server)):
            sub = zmq.Context.instance().socket(zmq.SUB)
            sub.linger = 0
            sub.curve_publickey, sub.curve_secretkey, sub.curve_serverkey = curve
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(d.kv_events)
            subs.append(sub)
        raw = Raw(d.endpoint, curve=client.curve(server))

        def heard():
            raw.put("event-%d" % heard.n, b"x")
            heard.n += 1
            return subs[0].poll(200)
        heard.n = 0
        assert wait_for(heard, 10), "the allowed subscriber heard no event"
        assert not subs[1].poll(REFUSED_MS), "a stranger's subscription got an event"
        raw.close()
        # The replay ROUTER.
        for curve, expect in ((client.curve(server), True), (stranger.curve(server), False),
                              (None, False)):
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.linger = 0
            if curve:
                sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
            sock.connect(d.kv_events_replay)
            sock.send_multipart([b"", struct.pack(">Q", 0)])
            assert bool(sock.poll(5000 if expect else REFUSED_MS)) == expect, curve
            sock.close()
    finally:
        for sub in subs:
            sub.close()
        d.finish()


def test_python_client_and_mooncake_drop_in(keys):
    d = curve_node(keys)
    client, stranger, server = keys["client"], keys["stranger"], keys["server"]
    try:
        c = kvpool.Client(d.endpoint, curve_secret=client.secret, curve_server=server.public)
        c.put("py", b"p" * 100000)
        assert c.get("py") == b"p" * 100000
        c.close()
        with pytest.raises(kvpool.RpcFailError) as refused:
            kvpool.Client(d.endpoint, connect_timeout=REFUSED_MS / 1000,
                          curve_secret=stranger.secret, curve_server=server.public)
        assert "refused this client's CURVE key" in str(refused.value)
        with pytest.raises(kvpool.RpcFailError) as plain:
            kvpool.Client(d.endpoint, connect_timeout=REFUSED_MS / 1000)
        assert "CURVE handshake failed" in str(plain.value)
        with pytest.raises(kvpool.InvalidParamsError):
            kvpool.Client(d.endpoint, curve_secret=client.secret)

        host, port = d.endpoint[len("tcp://"):].rsplit(":", 1)
        store = mooncake.MooncakeDistributedStore()
        assert store.setup("localhost", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "",
                           "%s:%s" % (host, port), curve_secret=client.secret,
                           curve_server=server.public) == 0
        assert store.put("dropin", b"d" * 4096) == 0
        assert store.get("dropin") == b"d" * 4096
        store.close()
        store = mooncake.MooncakeDistributedStore()
        store.timeout = REFUSED_MS / 1000
        assert store.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "",
                           "%s:%s" % (host, port)) < 0
    finally:
        d.finish()


def test_cli_takes_certificates(keys):
    d = curve_node(keys)
    client, stranger, server = keys["client"], keys["stranger"], keys["server"]
    kvpool_cli = os.path.join(bin_dir(), "kvpool")
    try:
        def cli(cert, *args, stdin=None):
            return subprocess.run([kvpool_cli, "-s", d.endpoint, "-t", str(REFUSED_MS),
                                   "--curve-secret", cert.secret, "--curve-server",
                                   server.public] + list(args), input=stdin,
                                  capture_output=True, timeout=30)
        assert cli(client, "put", "cli-key", stdin=b"by the cli").returncode == 0
        got = cli(client, "get", "cli-key")
        assert got.returncode == 0 and got.stdout == b"by the cli"
        refused = cli(stranger, "ping")
        assert refused.returncode == 1 and b"refused this client's CURVE key" in refused.stderr
    finally:
        d.finish()


def test_another_user_with_an_allowed_key_gets_no_shared_memory(keys):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    d = curve_node(keys)
    client, server = keys["client"], keys["server"]
    try:
        # nobody holds an allowed key (readable by it for the test's sake).
        os.chmod(keys["folder"], 0o755)
        os.chmod(client.secret, 0o644)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        base = nobody + [os.path.join(bin_dir(), "kvpool"), "--curve-secret", client.secret,
                         "--curve-server", server.public]
        ping = subprocess.run(base + ["-s", d.endpoint, "ping"], capture_output=True, text=True,
                              timeout=30)
        assert ping.returncode == 0 and "fast path on" not in ping.stdout, ping
        put = subprocess.run(base + ["-s", d.endpoint, "put", "nobody-key"], input="hers",
                             capture_output=True, text=True, timeout=30)
        assert put.returncode == 0, put.stderr
        # Straight at the ipc endpoint: authenticated, and still refused by its uid.
        on_ipc = subprocess.run(base + ["-s", d.ipc, "exists", "nobody-key"],
                                capture_output=True, text=True, timeout=30)
        assert on_ipc.returncode != 0 and "PERMISSION_DENIED" in on_ipc.stderr, on_ipc
        raw = Raw(d.endpoint, curve=client.curve(server))
        for seg in raw.segments():  # sealed memfds another user cannot open
            probe = subprocess.run(nobody + [sys.executable, "-c",
                                             "import os,sys; os.open(sys.argv[1], os.O_RDONLY)",
                                             seg.name], capture_output=True, timeout=30)
            assert probe.returncode != 0 and b"PermissionError" in probe.stderr, probe
        raw.close()
    finally:
        d.finish()


def test_loopback_only_without_curve():
    kvpoold = os.path.join(bin_dir(), "kvpoold")
    for args in (["--endpoint", "tcp://0.0.0.0:0"], ["--endpoint", "tcp://*:0"],
                 ["--admin", "tcp://0.0.0.0:0"], ["--role", "master", "--master", "tcp://*:0"],
                 ["--kv-events-endpoint", "tcp://*:0"]):
        out = subprocess.run([kvpoold, "--metrics-port", "0"] + args, capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 2 and "is not a loopback address" in out.stderr, (args, out)
    d = Kvpoold("--segment-size", "32MiB", prefix="kvpool-curve-")
    try:
        assert "no CURVE: every endpoint binds loopback only" in d.log_text()
    finally:
        d.finish()
    d = Kvpoold("--segment-size", "32MiB", "--insecure", endpoints=("tcp://0.0.0.0:*",),
                prefix="kvpool-curve-")
    try:
        assert "binds without CURVE (--insecure)" in d.log_text()
        port = d.endpoint.rsplit(":", 1)[1]
        assert answers("tcp://127.0.0.1:" + port) == OK
    finally:
        d.finish()


def test_cluster_nodes_and_master_authenticate_each_other(keys):
    folder, allow = keys["folder"], keys["allow"]
    master_cert, a_cert, b_cert = (Cert(folder, n) for n in ("master", "node-a", "node-b"))
    outsider = Cert(folder, "outsider")  # a node whose key nobody admits
    # The cluster's own keys: admitted at the master and the data planes, and nowhere else;
    # the clients' (--curve-allow) are never admitted there.
    nodes = os.path.join(folder, "nodes")
    os.mkdir(nodes)
    for cert in (master_cert, a_cert, b_cert):
        cert.allow(nodes)
    client = keys["client"]
    daemons = []

    def node(cert, node_id):
        d = Kvpoold("--role", "node", "--master", master.endpoint, "--node-id", node_id,
                    "--host-id", node_id, "--segment-size", "32MiB", "--heartbeat-interval",
                    "200", "--curve-secret", cert.secret, "--curve-allow", allow,
                    "--curve-nodes", nodes, "--curve-master", master_cert.public,
                    prefix="kvpool-curve-node-")
        daemons.append(d)
        return d

    try:
        master = Kvpoold("--role", "master", "--master", "tcp://127.0.0.1:*", "--node-ttl",
                         "2000", "--curve-secret", master_cert.secret, "--curve-allow", allow,
                         "--curve-nodes", nodes, prefix="kvpool-curve-master-")
        daemons.append(master)
        node_a, node_b = node(a_cert, "a"), node(b_cert, "b")
        raw_a = Raw(node_a.endpoint, curve=client.curve(a_cert))
        raw_b = Raw(node_b.endpoint, curve=client.curve(b_cert))

        def alive():
            reply, _ = raw_a.call(pb.NODES)
            return sorted(n.node_id for n in reply.nodes if n.alive)
        assert wait_for(lambda: alive() == ["a", "b"], 10), alive()
        # Each node's key travels with its endpoints.
        reply, _ = raw_a.call(pb.NODES)
        keys_of = {n.node_id: n.curve_key.encode() for n in reply.nodes}
        assert keys_of == {"a": a_cert.public_key, "b": b_cert.public_key}
        # Values put through A are read through B; those A holds come over the data plane,
        # which runs CURVE too.
        values = {"c-%d" % i: os.urandom(1000 + i * 3000) for i in range(24)}
        for key, value in values.items():
            assert raw_a.put(key, value) == OK
        def on_a(keys):
            found = []
            for key in keys:
                reply, _ = raw_b.call(pb.LOCATE, [key])
                if [reply.nodes[i].node_id for i in reply.locations[0].nodes] == ["a"]:
                    found.append(key)
            return found
        remote_before = raw_b.stats().remote_gets
        for key, value in values.items():
            assert raw_b.get(key) == (OK, value), key
        assert raw_b.stats().remote_gets - remote_before == len(on_a(values)) > 0
        # libkvpool through B follows REDIRECTs to A with A's own key.
        c = kvpool.Client(node_b.endpoint, curve_secret=client.secret,
                          curve_server=b_cert.public, fast_path=False)
        big = {"big-%d" % i: os.urandom(128 << 10) for i in range(16)}
        for key, value in big.items():
            assert raw_a.put(key, value) == OK
        before = raw_b.stats()
        for key, value in big.items():
            assert c.get(key) == value, key
        c.close()
        # B sent the client to A and relayed nothing: the client spoke CURVE to A with A's
        # key, which only the REDIRECT carried.
        after = raw_b.stats()
        assert after.redirects - before.redirects == len(on_a(big)) > 0
        assert after.remote_gets == before.remote_gets
        # The data plane admits the cluster's keys alone: a stranger gets nothing there.
        plane = re.search(r"data plane (tcp://\S+)", node_a.log_text()).group(1)
        assert answers(plane, b_cert.curve(a_cert)) == OK
        assert answers(plane, keys["stranger"].curve(a_cert), REFUSED_MS) is None
        assert answers(plane, None, REFUSED_MS) is None
        # ... nor does an admitted client's key open it, or the master's door.
        assert answers(node_a.endpoint, client.curve(a_cert)) == OK
        assert answers(plane, client.curve(a_cert), REFUSED_MS) is None
        assert master_answers(master.endpoint, b_cert.curve(master_cert))
        assert not master_answers(master.endpoint, client.curve(master_cert), REFUSED_MS)
        assert not master_answers(master.endpoint, None, REFUSED_MS)
        # A node whose key the master does not admit never joins.
        node(outsider, "outsider")
        assert not wait_for(lambda: "outsider" in alive(), 2)
        raw_a.close()
        raw_b.close()
    finally:
        # Every daemon is stopped, even when one of them failed; then the first failure
        # is raised.
        failures = []
        for d in reversed(daemons):
            try:
                d.finish()
            except AssertionError as failure:
                failures.append(failure)
        if failures:
            raise failures[0]


def _disconnected_within(monitor, seconds):
    """Seconds until the monitor saw the connection close, or None if it did not in time."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if monitor.poll(50):
            event = monitor.recv_multipart()
            kind = struct.unpack("<H", event[0][:2])[0]
            if kind == zmq.EVENT_DISCONNECTED:
                return time.monotonic() - start
    return None


def _monitor(sock):
    return sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)


def _close_monitored(pairs):
    """Closes (socket, monitor) pairs, each monitor switched off first: an event sent to a
    closed monitor blocks libzmq's I/O thread, and with it every socket of the context."""
    for sock, monitor in pairs:
        if not sock.closed:
            sock.disable_monitor()
        monitor.close()
        sock.close()


def _unanswered(sock, frames):
    """Whether frames sent on sock get no answer: libzmq gives up a connection whose
    handshake was refused, and then has nowhere to send (EAGAIN, not a wait)."""
    sock.sndtimeo = 0
    try:
        sock.send_multipart(frames)
    except zmq.Again:
        return True
    return not sock.poll(REFUSED_MS)


def test_a_revoked_key_loses_its_open_connections(keys):
    """Removing a client's certificate from --curve-allow closes the connections it has open
    (client endpoints tcp and ipc, and the admin channel) within a second; another admitted
    client goes on, and the file back admits the key again (infra/key_watch.c)."""
    folder, allow, server, client = keys["folder"], keys["allow"], keys["server"], keys["client"]
    other = Cert(folder, "other")
    other.allow(allow)
    d = curve_node(keys)
    socks, monitored = [], []
    try:
        tcp = Raw(d.endpoint, curve=client.curve(server))
        ipc = Raw(d.ipc, curve=client.curve(server))
        admin = zmq.Context.instance().socket(zmq.DEALER)
        admin.linger = 0
        admin.curve_publickey, admin.curve_secretkey, admin.curve_serverkey = \
            client.curve(server)
        admin.connect(d.admin)
        keep = Raw(d.endpoint, curve=other.curve(server))
        socks += [tcp.sock, ipc.sock, admin, keep.sock]
        lookup = [b"lookup", struct.pack(">I", 32), msgpack.packb(["00" * 16])]
        admin.send_multipart([b""] + lookup)
        assert admin.poll(5000) and admin.recv_multipart()[-1] == struct.pack(">I", 0)
        assert tcp.put("revoked-k", b"v" * 1000) == OK
        assert ipc.get("revoked-k") == (OK, b"v" * 1000)
        assert keep.get("revoked-k") == (OK, b"v" * 1000)
        monitors = [_monitor(s) for s in (tcp.sock, ipc.sock, admin)]
        monitored = list(zip((tcp.sock, ipc.sock, admin), monitors))
        os.unlink(os.path.join(allow, "client"))
        took = [_disconnected_within(m, 3) for m in monitors]
        assert all(t is not None and t < 1.0 for t in took), took
        # Nothing more is answered on them (their reconnections are refused at the
        # handshake); the other client is served as before.
        ping = [pb.Request(version=1, request_id=99, op=pb.PING).SerializeToString()]
        assert _unanswered(tcp.sock, ping)
        assert _unanswered(ipc.sock, ping)
        assert _unanswered(admin, [b""] + lookup)
        assert keep.get("revoked-k") == (OK, b"v" * 1000)
        assert "closed 1 connections of 1 CURVE keys no longer in" in d.log_text()
        # Its file back, the key gets in again.
        client.allow(allow)
        assert wait_for(lambda: answers(d.endpoint, client.curve(server), REFUSED_MS) == OK, 10)
    finally:
        _close_monitored(monitored)
        for s in socks:
            s.close()
        d.finish()


def test_a_revoked_node_key_loses_its_connection_to_the_master(keys):
    """A node key removed from the master's --curve-nodes: its open connection is closed
    within a second, and nothing it sends is answered."""
    folder, allow = keys["folder"], keys["allow"]
    master_cert, node_cert = Cert(folder, "master"), Cert(folder, "node-x")
    nodes = os.path.join(folder, "nodes")
    os.mkdir(nodes)
    master_cert.allow(nodes)
    node_cert.allow(nodes)
    master = Kvpoold("--role", "master", "--master", "tcp://127.0.0.1:*", "--curve-secret",
                     master_cert.secret, "--curve-allow", allow, "--curve-nodes", nodes,
                     prefix="kvpool-curve-master-")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = \
            node_cert.curve(master_cert)
        sock.connect(master.endpoint)
        sock.send(b"not a NodeRequest")
        assert sock.poll(5000)
        sock.recv_multipart()
        monitor = _monitor(sock)
        os.unlink(os.path.join(nodes, "node-x"))
        took = _disconnected_within(monitor, 3)
        assert took is not None and took < 1.0, took
        assert _unanswered(sock, [b"not a NodeRequest"])
        _close_monitored([(sock, monitor)])
    finally:
        sock.close()
        master.finish()
