"""The generated protobuf module of protocol/kvpool.proto, for the raw-protocol tests.

Loaded from python/kvpool/kvpool_pb2.py by path (made with `make python-proto` if missing),
so a test needs neither the kvpool package on sys.path nor an installed copy of it.
"""

import importlib.util
import os
import subprocess

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def load_pb2():
    path = os.path.join(REPO, "python", "kvpool", "kvpool_pb2.py")
    if not os.path.exists(path):
        subprocess.run(["make", "-C", REPO, "python-proto"], check=True,
                       stdout=subprocess.DEVNULL)
    spec = importlib.util.spec_from_file_location("kvpool_pb2_for_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pb = load_pb2()
