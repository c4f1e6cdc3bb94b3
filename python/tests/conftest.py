"""Fixtures of the Python tests: a real kvpoold on loopback, and unique key prefixes.

The daemon is build/bin/kvpoold ($KVPOOL_BIN/kvpoold when set, as `make test` does), bound to
tcp://127.0.0.1:* for clients and for the admin channel, with one 256 MiB segment. Its ready
file says which ports it got. One daemon serves every test of a file (each file runs in its own
pytest process under `make test`); tests keep apart by using keys under their own prefix.
Teardown sends SIGTERM and waits; a daemon that will not stop is killed and fails the run.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

START_TIMEOUT = 15.0
STOP_TIMEOUT = 15.0


def bin_dir():
    return os.environ.get("KVPOOL_BIN") or os.path.join(REPO, "build", "bin")


class Daemon:
    """A running kvpoold: .endpoint and .admin (tcp://127.0.0.1:PORT), .proc, .log_path."""

    def __init__(self, extra_args=(), segment_size="256MiB"):
        self.dir = tempfile.mkdtemp(prefix="kvpool-pytest-")
        self.ready = os.path.join(self.dir, "ready")
        self.log_path = os.path.join(self.dir, "kvpoold.log")
        exe = os.path.join(bin_dir(), "kvpoold")
        if not os.access(exe, os.X_OK):
            pytest.fail("no kvpoold at %s: run make first" % exe)
        args = [exe, "--endpoint", "tcp://127.0.0.1:*", "--admin", "tcp://127.0.0.1:*",
                "--ready-file", self.ready, "--segment-size", segment_size] + list(extra_args)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        self.endpoint, self.admin = self._wait_ready()

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail("kvpoold exited with %s:\n%s" % (self.proc.returncode,
                                                            self.log_text()))
            if os.path.exists(self.ready):
                endpoints, admins = [], []
                with open(self.ready) as file:
                    for line in file:
                        name, _, value = line.strip().partition("=")
                        if name == "endpoint":
                            endpoints.append(value)
                        elif name == "admin":
                            admins.append(value)
                tcp = [e for e in endpoints if e.startswith("tcp://")]
                if tcp:
                    return tcp[0], (admins[0] if admins else None)
            time.sleep(0.02)
        self.stop()
        pytest.fail("kvpoold not ready after %.0f s:\n%s" % (START_TIMEOUT, self.log_text()))

    def log_text(self):
        try:
            with open(self.log_path, "rb") as file:
                return file.read()[-4000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        """SIGTERM and wait; returns the exit status (killed: fails the caller)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.log.close()
                raise AssertionError("kvpoold did not stop on SIGTERM:\n" + self.log_text())
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def daemon():
    server = Daemon()
    yield server
    rc = server.stop()
    assert rc == 0, "kvpoold exited with %s:\n%s" % (rc, server.log_text())


@pytest.fixture
def prefix():
    """A key prefix no other test uses."""
    return "t-%s-" % uuid.uuid4().hex[:12]


@pytest.fixture
def client(daemon):
    import kvpool
    with kvpool.Client(daemon.endpoint, timeout=5.0) as c:
        yield c


def host_port(endpoint):
    """"tcp://127.0.0.1:PORT" -> "127.0.0.1:PORT", the way Mooncake writes master addresses."""
    assert endpoint.startswith("tcp://")
    return endpoint[len("tcp://"):]
