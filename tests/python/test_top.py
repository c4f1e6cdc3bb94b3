"""`kvpool top` (tools/kvpool_top.c): a live view of one node over the client socket.

- `kvpool top --once` prints one frame with the expected fields, and the operations a
  workload ran during its interval with a request rate above zero;
- the interactive view, driven under tmux (a terminal of its own, on a private tmux
  server), draws its table, redraws it, and quits on `q`, leaving nothing running.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import os
import re
import shutil
import subprocess
import threading
import time

from kvpool_daemon import Kvpoold, bin_dir  # noqa: E402
from kvpool_raw import Raw  # noqa: E402

OK = 0
KVPOOL = os.path.join(bin_dir(), "kvpool")


def busy(endpoint, stop):
    raw = Raw(endpoint)
    i = 0
    while not stop.is_set():
        assert raw.put("top-%d" % i, b"x" * 1024) == OK
        assert raw.get("top-%d" % i)[0] == OK
        i += 1
    raw.close()


def test_top_once_prints_a_frame():
    d = Kvpoold("--segment-size", "32MiB")
    stop = threading.Event()
    worker = threading.Thread(target=busy, args=(d.endpoint, stop))
    worker.start()
    try:
        out = subprocess.run([KVPOOL, "-s", d.endpoint, "top", "--once", "--interval", "700"],
                             capture_output=True, text=True, timeout=30)
        stop.set()
        worker.join()
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert text.startswith("kvpool top  " + d.endpoint)
        for field in ("memory ", "disk ", "traffic ", "hit rate ", "nodes ", "operation",
                      "req/s", "p50 ms", "p99 ms"):
            assert field in text, (field, text)
        assert "\033[" not in text  # --once draws no screen
        rows = {m.group(1): float(m.group(2))
                for m in re.finditer(r"^(\w+)\s+([\d.]+)\s+[\d.]+\s", text, re.M)}
        assert rows.get("PUT", 0) > 0 and rows.get("GET", 0) > 0, text
        assert re.search(r"^nodes\s+1 alive of 1", text, re.M), text
        assert re.search(r"in [\d.]+ \w+/s", text)
    finally:
        stop.set()
        d.finish()


def test_top_interactive_quits_on_q():
    tmux = shutil.which("tmux")
    assert tmux, "tmux (Debian's package) drives the terminal test"
    d = Kvpoold("--segment-size", "32MiB")
    server = "kvpool-test-%d" % os.getpid()
    base = [tmux, "-L", server, "-f", "/dev/null"]
    try:
        subprocess.run(base + ["new-session", "-d", "-s", "top", "-x", "120", "-y", "40",
                               "%s -s %s top --interval 200" % (KVPOOL, d.endpoint)],
                       check=True, timeout=10)

        def screen():
            return subprocess.run(base + ["capture-pane", "-p", "-t", "top"],
                                  capture_output=True, text=True, timeout=10).stdout

        deadline = time.monotonic() + 15
        text = ""
        while time.monotonic() < deadline and "operation" not in text:
            time.sleep(0.2)
            text = screen()
        assert "operation" in text and "(q quits)" in text, text
        # It redraws: the STATS row counts the view's own requests, so its rate shows.
        assert re.search(r"^STATS\s+[\d.]+", text, re.M), text
        subprocess.run(base + ["send-keys", "-t", "top", "q"], check=True, timeout=10)
        deadline = time.monotonic() + 10
        alive = True
        while time.monotonic() < deadline and alive:
            time.sleep(0.2)
            alive = subprocess.run(base + ["has-session", "-t", "top"],
                                   capture_output=True, timeout=10).returncode == 0
        assert not alive, "kvpool top did not quit on q:\n" + screen()
    finally:
        subprocess.run(base + ["kill-server"], capture_output=True, timeout=10)
        d.finish()
