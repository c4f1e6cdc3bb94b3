"""Connecting where nothing listens is said at once, as "connection refused" (issue 34,
item 6; client/connection.c, client/connect_probe.c).

libzmq retries a refused connect silently; libkvpool watches the socket's events while the
first PING waits, and gives up once every attempt was refused for 500 ms (or for the whole
connect timeout, when that is shorter), far within the 5 s timeout a node that is there but
slow gets. A node that starts listening within that window is connected to as before.

- tcp and ipc (a path with no socket file, an abstract name): RpcFailError within 1.5 s with
  the default timeout, "connection refused: nothing listens on ENDPOINT (errno text)",
  .errno ECONNREFUSED; the CLI says the same and exits 1.
- A node (here a ROUTER that answers PING) that binds 250 ms after the client started
  connecting is reached; one that binds only after 1.5 s is not (refused, at 0.5 s).

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import errno
import os
import subprocess
import threading
import time

import pytest
import zmq

import kvpool
from kvpool_daemon import bin_dir, free_port  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402


def refused(endpoint, **options):
    start = time.monotonic()
    with pytest.raises(kvpool.RpcFailError) as failed:
        kvpool.Client(endpoint, **options)
    return str(failed.value), failed.value.errno, time.monotonic() - start


@pytest.mark.parametrize("endpoint, why", [
    ("tcp://127.0.0.1:%d" % free_port(), "Connection refused"),
    ("ipc:///tmp/kvpool-test-nothing-%d" % os.getpid(), "No such file or directory"),
    ("ipc://@kvpool-test-nothing-%d" % os.getpid(), "Connection refused"),
])
def test_nothing_listening_is_said_at_once(endpoint, why):
    text, code, spent = refused(endpoint)
    assert "cannot connect to %s: connection refused: nothing listens on %s (%s)" % (
        endpoint, endpoint, why) in text, text
    assert code == errno.ECONNREFUSED
    assert 0.45 <= spent < 1.5, spent


def test_host_port_is_refused_as_tcp():
    port = free_port()
    text, code, spent = refused("127.0.0.1:%d" % port, timeout=10.0)
    assert "nothing listens on tcp://127.0.0.1:%d (Connection refused)" % port in text, text
    assert spent < 1.5, spent


def test_a_short_connect_timeout_still_says_refused():
    text, code, spent = refused("tcp://127.0.0.1:%d" % free_port(), connect_timeout=0.2)
    assert "connection refused" in text and code == errno.ECONNREFUSED, text
    assert spent < 1.0, spent


def test_the_cli_says_refused_at_once():
    endpoint = "127.0.0.1:%d" % free_port()
    start = time.monotonic()
    out = subprocess.run([os.path.join(bin_dir(), "kvpool"), "-s", endpoint, "ping"],
                         capture_output=True, text=True, timeout=30)
    spent = time.monotonic() - start
    assert out.returncode == 1, out
    assert out.stderr == ("kvpool: cannot connect to %s: connection refused: nothing listens on "
                          "tcp://%s (Connection refused)\n" % (endpoint, endpoint)), out.stderr
    assert spent < 1.5, spent


def late_node(port, delay, stop):
    """A ROUTER on port, bound after delay seconds, answering PINGs until stop is set."""
    ctx = zmq.Context.instance()
    time.sleep(delay)
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind("tcp://127.0.0.1:%d" % port)
    try:
        while not stop.is_set():
            if not router.poll(50):
                continue
            identity, data = router.recv_multipart()[:2]
            request = pb.Request.FromString(data)
            reply = pb.Reply(version=1, request_id=request.request_id, op=request.op,
                             status=0)
            router.send_multipart([identity, reply.SerializeToString()])
    finally:
        router.close()


def with_late_node(delay, **options):
    port = free_port()
    stop = threading.Event()
    thread = threading.Thread(target=late_node, args=(port, delay, stop), daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        try:
            kvpool.Client("tcp://127.0.0.1:%d" % port, fast_path=False, **options).close()
            return None, time.monotonic() - start
        except kvpool.RpcFailError as failed:
            return failed, time.monotonic() - start
    finally:
        stop.set()
        thread.join()


def test_a_node_that_starts_a_little_later_is_reached():
    failed, spent = with_late_node(0.25)
    assert failed is None, failed
    assert spent >= 0.2, spent


def test_a_node_that_starts_after_the_window_is_refused():
    failed, spent = with_late_node(1.5)
    assert failed is not None and failed.errno == errno.ECONNREFUSED, failed
    assert spent < 1.4, spent
