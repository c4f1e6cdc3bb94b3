"""/metrics under slow clients (infra/metrics_http.c, docs/security.md "Limits"): 200
connections that send nothing, or a request line one byte at a time, do not lock a scraper
out; a real GET /metrics still answers 200 at once, kvpoold's descriptors stay bounded, and
the silent connections are closed after the idle timeout (3 s).

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import os
import socket
import threading
import time
import urllib.parse
import urllib.request

from kvpool_daemon import wait_for, with_metrics  # noqa: E402

SLOW = 200


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def timed_get(url):
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read()
        return response.status, body, time.monotonic() - started


def test_slow_clients_do_not_lock_out_metrics():
    d = with_metrics("--metrics-host", "127.0.0.1")
    slow = []
    stop = threading.Event()
    try:
        url = d.metrics + "/metrics"
        host, port = urllib.parse.urlsplit(d.metrics).netloc.rsplit(":", 1)
        status, _, _ = timed_get(url)
        assert status == 200
        before = fd_count(d.pid)
        for i in range(SLOW):
            s = socket.create_connection((host, int(port)), timeout=5)
            slow.append(s)
        silent, dribbling = slow[:SLOW // 2], slow[SLOW // 2:]

        # Half of them send "GET /metrics HTTP/1.1" a byte every 0.5 s, never finishing.
        line = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"

        def dribble():
            for i in range(len(line)):
                if stop.wait(0.5):
                    return
                for s in dribbling:
                    try:
                        s.send(line[i:i + 1])
                    except OSError:
                        pass

        thread = threading.Thread(target=dribble, daemon=True)
        thread.start()
        time.sleep(0.5)
        latencies = []
        for _ in range(5):
            status, body, took = timed_get(url)
            assert status == 200 and b"kvpool_" in body
            latencies.append(took)
        print("GET /metrics under %d slow connections: max %.3f s" % (SLOW, max(latencies)))
        assert max(latencies) < 2.0, latencies
        during = fd_count(d.pid)
        print("kvpoold fds: %d before, %d with %d slow connections" % (before, during, SLOW))
        assert during <= before + SLOW + 16

        # The silent ones are closed by kvpoold after its idle timeout.
        def closed(s):
            try:
                s.settimeout(0.01)
                return s.recv(1) == b""
            except socket.timeout:
                return False
            except OSError:
                return True

        assert wait_for(lambda: all(closed(s) for s in silent), seconds=8.0)
        stop.set()
        thread.join()
        status, _, took = timed_get(url)
        assert status == 200 and took < 2.0
    finally:
        stop.set()
        for s in slow:
            s.close()
        d.finish()
