"""A message of many frames is buffered whole by libzmq before kvpoold sees it: each frame is
bounded (ZMQ_MAXMSGSIZE), their number and sum are not. kvpoold bounds what one tcp
connection may have buffered (infra/conn_guard.c: the kernel's count of bytes received less
what the api read) at the largest request it would accept, shuts down a connection past it,
and prints at start the worst case over --max-connections (docs/security.md, Limits).

Run by `make test` (KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import re
import time

import zmq

from kvpool_daemon import Kvpoold, wait_for
from kvpool_raw import OK, Raw
from kvpool_test_pb import pb

MiB = 1 << 20


def status_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"^%s:\s+(\d+) kB" % field, f.read(), re.M).group(1))


def flood(endpoint, connections, frames):
    """connections DEALERs, each sending one PUT of frames frames of 1 MiB (no reconnection:
    a connection the node closes stays closed). Returns the sockets and their monitors."""
    chunk = bytes(MiB)
    socks, monitors = [], []
    for c in range(connections):
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.linger = 0
        sock.setsockopt(zmq.RECONNECT_IVL, -1)
        monitors.append(sock.get_monitor_socket(zmq.EVENT_DISCONNECTED))
        sock.connect(endpoint)
        request = pb.Request(version=1, request_id=1, op=pb.PUT,
                             keys=[b"flood-%d-%d" % (c, i) for i in range(frames)])
        sock.send_multipart([request.SerializeToString()] + [chunk] * frames, copy=False)
        socks.append(sock)
    return socks, monitors


def test_a_message_of_many_frames_is_cut_off_past_the_largest_request():
    # The largest request: 16 MiB of values and a 1 MiB + 64 MiB frame = 81 MiB a connection.
    d = Kvpoold("--segment-size", "64MiB", "--max-request-bytes", "16MiB", "--max-value-size",
                "1MiB", "--max-connections", "64", prefix="kvpool-buffer-")
    socks, monitors = [], []
    try:
        assert re.search(r"incoming requests buffered at most 5\.1 GiB: 64 client connections "
                         r"\(--max-connections\) x 0\.08 GiB", d.log_text()), d.log_text()
        base = status_kb(d.pid, "VmRSS")
        # 4 connections x 600 frames of 1 MiB: 2.4 GB buffered before, now each connection
        # is closed once it holds more than 81 MiB (checked every 100 ms: a share may be
        # overshot by what arrives meanwhile).
        socks, monitors = flood(d.endpoint, 4, 600)
        closed = 0
        deadline = time.monotonic() + 60
        while closed < 4 and time.monotonic() < deadline:
            for m in monitors:
                if m.poll(10):
                    m.recv_multipart()
                    closed += 1
        peak_mb = (status_kb(d.pid, "VmHWM") - base) / 1024
        assert closed == 4 and peak_mb < 4 * 81 + 300, \
            "%d of 4 connections closed; peak %.0f MB" % (closed, peak_mb)
        assert d.log_text().count("libzmq holds unread") == 4
        # The node goes on serving.
        raw = Raw(d.endpoint)
        assert raw.put("after", b"v" * 1000) == OK
        assert raw.get("after") == (OK, b"v" * 1000)
        raw.close()
    finally:
        # Each monitor switched off before it closes: an event sent to a closed monitor
        # blocks libzmq's I/O thread, and every socket of the context with it.
        for sock, monitor in zip(socks, monitors):
            sock.disable_monitor()
            monitor.close()
            sock.close()
        d.finish()


def test_a_large_request_within_the_bound_is_served():
    # 16 MiB of values in one message of 16 frames is no more than a request may be.
    d = Kvpoold("--segment-size", "64MiB", "--max-request-bytes", "16MiB", "--max-value-size",
                "1MiB", prefix="kvpool-buffer-")
    try:
        raw = Raw(d.endpoint)
        keys = ["big-%d" % i for i in range(16)]
        reply, _ = raw.call(pb.PUT, keys, [bytes([i]) * MiB for i in range(16)])
        assert reply.status == OK and list(reply.statuses) == [OK] * 16
        assert raw.get("big-3") == (OK, bytes([3]) * MiB)
        raw.close()
        assert "libzmq holds unread" not in d.log_text()
    finally:
        d.finish()
