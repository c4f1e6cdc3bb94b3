"""kvpoold's log (infra/log.c): levels, the line format, the rate limit, syslog.

- at the default level (info) a flood of malformed requests writes nothing to the log;
- at --log-level debug every request is logged, one line each with a timestamp, the level
  and the actor, but a flood from one place is cut to 10 lines a second, and the next line
  says how many were left out;
- --log-syslog sends the lines to syslog (a datagram socket at /dev/log that this test
  listens on: its own, or bound over the real one in a private mount namespace).

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import os
import re
import socket
import tempfile
import time

import pytest
import zmq

from kvpool_daemon import Kvpoold  # noqa: E402
from kvpool_raw import Raw  # noqa: E402

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} [EWID] [\w-]+: ")


def flood(endpoint, count):
    """count requests that are not a kvpool.v1.Request (each answered PROTOCOL_ERROR)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    for _ in range(count):
        sock.send(b"\xff\xff not protobuf")
    for _ in range(count):
        assert sock.poll(10000), "no answer"
        sock.recv_multipart()
    sock.close()


def test_default_level_logs_nothing_per_request():
    d = Kvpoold("--segment-size", "16MiB")
    try:
        flood(d.endpoint, 2000)
        raw = Raw(d.endpoint)
        assert raw.put("k", b"v") == 0
        raw.close()
        log = d.log_text()
        assert "PROTOCOL_ERROR" not in log and " api: request " not in log, log
    finally:
        d.finish()


def test_debug_level_logs_requests_under_a_rate_limit():
    d = Kvpoold("--segment-size", "16MiB", "--log-level", "debug")
    try:
        start = time.monotonic()
        flood(d.endpoint, 3000)
        elapsed = time.monotonic() - start
        time.sleep(1.1)
        flood(d.endpoint, 1)  # a new second: this one is written, with the count left out
        log = d.log_text()
        lines = [line for line in log.splitlines() if "PROTOCOL_ERROR" in line]
        assert lines and all(LINE.match(line) for line in lines), lines[:3]
        assert all(" D api: request " in line for line in lines), lines[:3]
        assert len(lines) <= 10 * (int(elapsed) + 2) + 1, (len(lines), elapsed)
        # Some line carries the count of those left out before it. (Not always the last: when
        # a loaded machine ends the flood in a second under the limit, nothing was left out
        # before the last line, and it says so by carrying no count.)
        assert any(re.search(r"\((\d+) more suppressed\)$", line) for line in lines[1:]), lines
        # Each line says how many were left out since the one before it (a slow machine
        # spreads the flood over several seconds): every request is written or counted.
        suppressed = sum(int(m.group(1)) for line in lines
                         for m in [re.search(r"\((\d+) more suppressed\)$", line)] if m)
        assert suppressed + len(lines) == 3001, (suppressed, len(lines))
    finally:
        d.finish()


def test_trace_keys_logs_every_step_of_the_keys_it_matches():
    d = Kvpoold("--segment-size", "16MiB", "--trace-keys", "^traced/[0-9]+$")
    try:
        raw = Raw(d.endpoint)
        for i in range(30):  # past the rate limit of one call site (10 lines a second)
            assert raw.put("traced/%d" % i, b"v%d" % i) == 0
            assert raw.put("plain/%d" % i, b"p%d" % i) == 0
            assert raw.get("traced/%d" % i) == (0, b"v%d" % i)
        assert raw.remove("traced/0", force=True) == 0  # (just read: leased)
        raw.close()
        log = d.log_text()
        steps = [line for line in log.splitlines() if ": trace " in line]
        assert all(LINE.match(line) and " I " in line for line in steps), steps[:3]
        for i in range(30):
            assert re.search(r"trace traced/%d: stored v\d+" % i, log), i
            assert re.search(r"trace traced/%d: v\d+ read" % i, log), i
        assert re.search(r"trace traced/0: dropped v\d+", log)
        assert "plain/" not in log and "suppressed" not in log
    finally:
        d.finish()
    # A pattern that is not a regex stops kvpoold at once, saying so.
    with pytest.raises(AssertionError, match="--trace-keys: '\\(' is not a POSIX extended regex"):
        Kvpoold("--segment-size", "16MiB", "--trace-keys", "(")


def test_syslog():
    if os.geteuid() != 0:
        pytest.skip("needs root to listen at /dev/log")
    work = tempfile.mkdtemp(prefix="kvpool-syslog-")
    own = not os.path.exists("/dev/log")
    path = "/dev/log" if own else os.path.join(work, "log")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    listener.settimeout(10)
    # With a syslog daemon on /dev/log, kvpoold runs in a mount namespace of its own where
    # the test's socket is bound over it.
    wrapper = () if own else (
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount --bind "$0" /dev/log && exec "$@"', path)
    try:
        d = Kvpoold("--segment-size", "16MiB", "--log-syslog", "--log-level", "debug",
                    wrapper=wrapper)
        try:
            raw = Raw(d.endpoint)
            assert raw.put("k", b"v") == 0
            raw.close()
            got = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any("PUT" in g for g in got):
                got.append(listener.recv(4096).decode(errors="replace"))
            assert any(re.search(r"kvpoold\[\d+\]: api: request \d+ PUT", g) for g in got), got
            assert any(g.startswith("<31>") for g in got), got  # daemon.debug
            assert "request" not in d.log_text()  # nothing of it on stderr
        finally:
            d.finish()
    finally:
        listener.close()
        if own:
            os.unlink("/dev/log")
