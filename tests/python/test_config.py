"""kvpoold's config file (--config FILE, ZPL) and --print-config (infra/config.c).

- Every setting is read from the file under its option's name; the command line overrides
  the file, and a repeatable setting given on the command line replaces the file's list;
- --print-config prints the settings as they came out, as a config file that kvpoold takes
  back unchanged;
- an unknown name, a value out of bounds, a section, a flag that is neither true nor false,
  a missing file: kvpoold refuses to start (exit 2) with a message naming them.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import os
import subprocess
import tempfile
import time

from kvpool_daemon import Kvpoold, bin_dir  # noqa: E402
from kvpool_raw import Raw  # noqa: E402

KVPOOLD = os.path.join(bin_dir(), "kvpoold")
MiB = 1 << 20


def write(text):
    fd, path = tempfile.mkstemp(prefix="kvpool-config-", suffix=".conf")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def run(*args):
    return subprocess.run([KVPOOLD] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=30)


def printed(*args):
    out = run(*args, "--print-config")
    assert out.returncode == 0, out.stderr
    values = {}
    for line in out.stdout.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition(" = ")
            values.setdefault(name, []).append(value.strip('"'))
    return out.stdout, values


def test_file_then_command_line():
    path = write("# a comment\nsegment-size = 32MiB\nsegments = 2\nlease-ttl = 2500\n"
                 "placement = free-ratio\nlock-memory = false\n"
                 "endpoint = tcp://127.0.0.1:1\nendpoint = tcp://127.0.0.1:2\n"
                 "lookup-model = \"my model\"\n")
    try:
        text, values = printed("--config", path)
        assert values["segment-size"] == [str(32 * MiB)] and values["segments"] == ["2"]
        assert values["lease-ttl"] == ["2500"] and values["placement"] == ["free-ratio"]
        assert values["lock-memory"] == ["false"] and values["lookup-model"] == ["my model"]
        assert values["endpoint"] == ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]
        # The command line wins, wherever --config stands; its endpoints replace the file's.
        _, values = printed("--segments", "1", "--config", path, "--endpoint",
                            "tcp://127.0.0.1:3")
        assert values["segments"] == ["1"] and values["segment-size"] == [str(32 * MiB)]
        assert values["endpoint"] == ["tcp://127.0.0.1:3"]
        # What --print-config prints is a config file that comes back the same.
        again = write(text)
        try:
            assert printed("--config", again)[0] == text
        finally:
            os.unlink(again)
        # A real node with the file's settings and one overridden.
        d = Kvpoold("--config", path, "--segments", "1")
        try:
            raw = Raw(d.endpoint)
            stats = raw.stats()
            assert stats.bytes_mounted == 32 * MiB and stats.segments == 1
            assert stats.lease_ttl_ms == 2500
            raw.close()
        finally:
            d.finish()
    finally:
        os.unlink(path)


def test_bad_files_are_refused_with_their_names():
    cases = [
        ("segment-size = 32MiB\nno-such-setting = 1\n", "unknown setting 'no-such-setting'"),
        ("segments = 999999\n", "--segments must be between"),
        ("eviction-high-watermark = 7\n", "--eviction-high-watermark takes a number"),
        ("lock-memory = maybe\n", "lock-memory takes true or false"),
        ("cluster\n    master = tcp://x:1\n", "'cluster' is a section"),
        ("segments =\n", "'segments' has no value"),
    ]
    for text, message in cases:
        path = write(text)
        try:
            out = run("--config", path, "--print-config")
            assert out.returncode == 2, (text, out.stdout)
            assert message in out.stderr, (text, out.stderr)
            assert path in out.stderr, out.stderr
        finally:
            os.unlink(path)
    out = run("--config", "/nonexistent/kvpoold.conf")
    assert out.returncode == 2 and "/nonexistent/kvpoold.conf" in out.stderr


KVPOOL = os.path.join(bin_dir(), "kvpool")


def cli(endpoint, *args):
    return subprocess.run([KVPOOL, "-s", endpoint] + list(args), capture_output=True, text=True,
                          timeout=30)


def test_settings_change_at_run_time():
    from kvpool_test_pb import pb
    d = Kvpoold("--segment-size", "32MiB", "--eviction-high-watermark", "0.9")
    try:
        out = cli(d.endpoint, "config", "get", "lease-ttl")
        assert out.returncode == 0 and out.stdout == "lease-ttl = 10000\n", out
        out = cli(d.endpoint, "config", "set", "lease-ttl", "1500")
        assert out.returncode == 0 and out.stdout == "lease-ttl = 1500\n", out
        raw = Raw(d.endpoint)
        assert raw.stats().lease_ttl_ms == 1500
        # The replica-manager took it: a read's lease now ends after 1.5 s, not 10.
        assert raw.put("leased", b"v") == 0 and raw.exist("leased")
        assert raw.remove("leased") == pb.OBJECT_HAS_LEASE
        time.sleep(1.7)
        assert raw.remove("leased") == 0
        # The evictor took its watermark: 20 MiB of 32 stays under 0.9, not under 0.5.
        for i in range(20):
            assert raw.put("fill-%d" % i, b"x" * MiB) == 0
        time.sleep(1.0)
        assert raw.stats().evictions == 0
        out = cli(d.endpoint, "config", "set", "eviction-high-watermark", "0.5")
        assert out.returncode == 0 and out.stdout == "eviction-high-watermark = 0.5\n", out
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and raw.stats().evictions == 0:
            time.sleep(0.2)
        assert raw.stats().evictions > 0
        # The log level, at once.
        assert " D api: request " not in d.log_text()
        assert cli(d.endpoint, "config", "set", "log-level", "debug").returncode == 0
        assert raw.exist("fill-19") in (True, False)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and " D api: request " not in d.log_text():
            time.sleep(0.1)
        assert " D api: request " in d.log_text()
        # Refused: a setting that needs a restart, a bad value, an unknown name.
        out = cli(d.endpoint, "config", "set", "segment-size", "64MiB")
        assert out.returncode == 1 and "only with a restart" in out.stderr, out
        out = cli(d.endpoint, "config", "set", "eviction-ratio", "7")
        assert out.returncode == 1 and "eviction-ratio" in out.stderr, out
        out = cli(d.endpoint, "config", "get", "no-such-thing")
        assert out.returncode == 1 and "no setting" in out.stderr, out
        assert cli(d.endpoint, "config", "get", "eviction-ratio").stdout == "eviction-ratio = 0.05\n"
        # Only same-machine clients of the node's user: over tcp it is refused.
        reply, _ = raw.call(pb.CONFIG, setting="lease-ttl", setting_value="1")
        assert reply.status == pb.PERMISSION_DENIED
        assert raw.stats().lease_ttl_ms == 1500
        raw.close()
    finally:
        d.finish()
