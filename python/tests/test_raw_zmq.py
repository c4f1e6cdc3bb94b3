"""The pure-ZeroMQ example (python/examples/raw_zmq_client.py) runs against a real kvpoold:
put and get with only pyzmq and the protobuf module generated from protocol/kvpool.proto."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

EXAMPLE = os.path.join(REPO, "python", "examples", "raw_zmq_client.py")


def run_example(daemon, *extra):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)          # the example must not need the kvpool package
    return subprocess.run([sys.executable, EXAMPLE, "--endpoint", daemon.endpoint,
                           "--timeout-ms", "5000"] + list(extra),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_example_with_protoc_output(daemon):
    result = run_example(daemon, "--proto", os.path.join(REPO, "protocol", "kvpool.proto"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all steps ok" in result.stdout
    assert "FAILED" not in result.stdout


def test_example_with_generated_module(daemon):
    if not os.path.exists(os.path.join(REPO, "python", "kvpool", "kvpool_pb2.py")):
        pytest.skip("python/kvpool/kvpool_pb2.py not generated (make python-proto)")
    result = run_example(daemon)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all steps ok" in result.stdout and "GET returns the value" in result.stdout


def test_example_reports_a_dead_endpoint():
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    result = subprocess.run([sys.executable, EXAMPLE, "--endpoint", "tcp://127.0.0.1:1",
                             "--timeout-ms", "300", "--proto",
                             os.path.join(REPO, "protocol", "kvpool.proto")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "no reply" in result.stdout
