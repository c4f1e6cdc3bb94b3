"""PREFIX_MATCH (issue 13, part 2): how many leading blocks of an ordered key list are stored,
a block counting only if every rank's key exists, answered by the node in one request,
through every door: the protocol, libkvpool over tcp and on the node's machine (where the
read index answers whole blocks with no request), the Python client, the Mooncake drop-in's
extension method, and the CLI. The counted blocks' keys are leased (a remove without force
is refused); keys past the first missing block are not.

Run by `make test` with Debian's /usr/bin/python3 (cwd = repo root, KVPOOL_BIN = build/bin).
"""

import os
import subprocess
import sys

import pytest

import kvpool
from kvpool.mooncake import MooncakeDistributedStore
from kvpool_daemon import Kvpoold
from kvpool_raw import Raw
from kvpool_test_pb import pb
from conftest import host_port

OK = 0
NOT_FOUND = -704
HAS_LEASE = -706
INVALID_PARAMS = -600
BIN = os.environ.get("KVPOOL_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build",
                                                "bin"))


@pytest.fixture(scope="module")
def node():
    """A kvpoold whose leases last long enough to see, and whose tcp endpoint is not on the
    same-machine path for a client that turns the fast path off."""
    server = Kvpoold("--segment-size", "64MiB", "--lease-ttl", "60000", prefix="kvpool-prefix-")
    yield server
    assert server.stop() == 0, server.log_text(4000)
    server.remove()


def blocks_of(prefix, n, ranks):
    """Block-major keys: n blocks of ranks keys."""
    return ["%sb%d-r%d" % (prefix, b, r) for b in range(n) for r in range(ranks)]


def store_keys(raw, keys):
    for key in keys:
        assert raw.put(key, b"v-" + key.encode()) == OK, key


def test_the_protocol_counts_whole_leading_blocks(node, prefix):
    raw = Raw(node.endpoint)
    keys = blocks_of(prefix, 6, 2)
    # Blocks 0, 1, 2 whole; block 3 lacks rank 1; blocks 4 and 5 whole again.
    store_keys(raw, [k for k in keys if k != prefix + "b3-r1"])
    reply, _ = raw.call(pb.PREFIX_MATCH, keys, ranks=2)
    assert reply.status == OK and reply.count == 3
    assert list(reply.statuses[:6]) == [OK] * 6
    assert all(s == NOT_FOUND for s in reply.statuses[6:])  # the missing block on: unchecked
    # One rank a block (ranks 0 means 1): the missing key ends it at 7 keys.
    reply, _ = raw.call(pb.PREFIX_MATCH, keys)
    assert reply.count == 7
    reply, _ = raw.call(pb.PREFIX_MATCH, keys[:6], ranks=2)
    assert reply.count == 3
    reply, _ = raw.call(pb.PREFIX_MATCH, [prefix + "nothing", keys[0]])
    assert reply.count == 0
    # Keys that are not whole blocks are refused.
    reply, _ = raw.call(pb.PREFIX_MATCH, keys[:3], ranks=2)
    assert reply.status == INVALID_PARAMS and "whole blocks" in reply.error


def test_counted_blocks_are_leased_and_the_rest_is_not(node, prefix):
    raw = Raw(node.endpoint)
    keys = blocks_of(prefix, 3, 2)
    store_keys(raw, keys[:2] + keys[4:])  # block 1 missing entirely
    reply, _ = raw.call(pb.PREFIX_MATCH, keys, ranks=2)
    assert reply.count == 1
    assert raw.remove(keys[0]) == HAS_LEASE and raw.remove(keys[1]) == HAS_LEASE
    # Block 2 exists but lies past the gap: not leased, removable at once.
    assert raw.remove(keys[4]) == OK and raw.remove(keys[5]) == OK


@pytest.mark.parametrize("fast_path", [True, False])
def test_libkvpool_and_the_python_client(node, prefix, fast_path):
    raw = Raw(node.endpoint)
    keys = blocks_of(prefix, 1000, 2)
    store_keys(raw, keys[:2 * 700])
    with kvpool.Client(node.endpoint, fast_path=fast_path) as client:
        before = client.stats()["requests"] if not fast_path else None
        assert client.prefix_match(keys, ranks=2) == 700
        assert client.prefix_match(keys[:2 * 10], ranks=2) == 10
        assert client.prefix_match(keys, ranks=1) == 1400
        assert client.prefix_match([], ranks=2) == 0
        if before is not None:
            # Over tcp: one request a call (the stats call itself is the fourth).
            assert client.stats()["requests"] - before == 4
        with pytest.raises(kvpool.Error):
            client.prefix_match(keys[:3], ranks=2)


def test_the_same_machine_path_leases_what_it_counts(node, prefix):
    # On the node's machine libkvpool answers the blocks the read index shows whole by itself
    # (the index's read stamps are the leases), and asks the node only from the first block
    # the index cannot vouch for.
    raw = Raw(node.endpoint)
    keys = blocks_of(prefix, 50, 2)
    store_keys(raw, keys[:2 * 40])
    with kvpool.Client(node.endpoint) as client:
        assert client.prefix_match(keys, ranks=2) == 40
    assert raw.remove(keys[0]) == HAS_LEASE and raw.remove(keys[79]) == HAS_LEASE


def test_the_dropin_extension(node, prefix):
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "",
                       host_port(node.endpoint)) == 0
    try:
        keys = blocks_of(prefix, 8, 4)
        assert store.batch_put_from is not None
        for key in keys[:4 * 5]:
            assert store.put(key, b"x" * 100) == 0
        assert store.batch_prefix_match(keys, 4) == 5
        assert store.batch_prefix_match(keys, ranks=1) == 20
        assert store.batch_prefix_match(keys[:5], 4) == INVALID_PARAMS
        # A key no store can hold (a NUL byte) ends the prefix at its block.
        bad = list(keys)
        bad[4 * 3 + 1] = "bad\0key"
        assert store.batch_prefix_match(bad, 4) == 3
        # The same answer as batch_is_exist and counting on the client.
        present = store.batch_is_exist(keys)
        counted = 0
        while counted < 8 and all(p == 1 for p in present[counted * 4:counted * 4 + 4]):
            counted += 1
        assert counted == 5
    finally:
        store.close()


def test_the_cli(node, prefix):
    raw = Raw(node.endpoint)
    keys = blocks_of(prefix, 3, 2)
    store_keys(raw, keys[:4])
    cli = os.path.join(BIN, "kvpool")
    run = subprocess.run([cli, "-s", node.endpoint, "prefix", "--ranks", "2"] + keys,
                         capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout.strip() == "2", run
    run = subprocess.run([cli, "-s", node.endpoint, "prefix", "--ranks", "2"] + keys[:4],
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "2", run
    run = subprocess.run([cli, "-s", node.endpoint, "prefix", "--ranks", "2"] + keys[:3],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "whole blocks" in run.stderr
