"""Fixtures of the Python tests: a real kvpoold on loopback, and unique key prefixes.

The daemon is build/bin/kvpoold ($KVPOOL_BIN/kvpoold when set, as `make test` does), bound to
tcp://127.0.0.1:* for clients and for the admin channel, with one 256 MiB segment, by
tests/python/kvpool_daemon.py (the helper every Python test folder shares): its ready file says
which ports it got. One daemon serves every test of a file (each file runs in its own
pytest process under `make test`); tests keep apart by using keys under their own prefix.
Teardown sends SIGTERM and waits; a daemon that will not stop is killed and fails the run.
"""

import os
import sys
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.append(os.path.join(REPO, "tests", "python"))  # kvpool_daemon, shared with tests/python

from kvpool_daemon import Kvpoold  # noqa: E402


@pytest.fixture(scope="module")
def daemon():
    """A running kvpoold (tests/python/kvpool_daemon.py): .endpoint and .admin
    (tcp://127.0.0.1:PORT), .proc, .log_path."""
    server = Kvpoold("--segment-size", "256MiB", prefix="kvpool-pytest-")
    yield server
    rc = server.stop()
    assert rc == 0, "kvpoold exited with %s:\n%s" % (rc, server.log_text(4000))
    server.remove()


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
