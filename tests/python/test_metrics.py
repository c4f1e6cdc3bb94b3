"""kvpoold's metrics over HTTP (--metrics-port, infra/metrics_http.c, docs/metrics.md).

- A real Prometheus (Debian's prometheus package), started here on loopback with a scrape
  config pointing at kvpoold, scrapes /metrics; its query API returns kvpool series, and the
  counters it reports move after a scripted workload (puts, gets, a miss) by what was done.
- /metrics read directly: per-operation requests, failures (request-level errors; a miss
  is not one) and latency histograms, value
  bytes by transport, the STATS figures (objects, stored bytes) and each segment.
- /health: JSON with status, role, uptime and version; other paths 404, other methods 405.
- STATS over the client socket carries the same per-operation counters (Reply.op_stats),
  which is what `kvpool top` reads.
- --metrics-port 0: no HTTP server at all; a port in use fails the start.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from kvpool_daemon import Kvpoold, free_port, with_metrics  # noqa: E402
from kvpool_raw import Raw  # noqa: E402
from kvpool_test_pb import pb  # noqa: E402

OK = 0
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def http_get(url, method="GET"):
    """(status, headers, body) of a request to url."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode()


def samples(text):
    """{series: value} of an exposition, series as written ('name{labels}')."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


def wait_for(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out waiting for %s" % what)


@pytest.fixture
def daemon():
    d = with_metrics("--segment-size", "64MiB")
    yield d
    d.finish()


def workload(raw, prefix, count):
    for i in range(count):
        assert raw.put("%s-%d" % (prefix, i), b"v" * 4096) == OK
    for i in range(count):
        status, value = raw.get("%s-%d" % (prefix, i))
        assert status == OK and len(value) == 4096
    status, _ = raw.get("%s-missing" % prefix)
    assert status != OK  # a miss: the key's status, not the request's
    reply, _ = raw.call(pb.PUT, ["%s-no-value" % prefix])
    assert reply.status != OK  # a request-level error: a failure


def test_metrics_and_health_over_http(daemon):
    assert daemon.metrics.startswith("http://127.0.0.1:")
    raw = Raw(daemon.endpoint)
    workload(raw, "m", 5)
    status, headers, body = http_get(daemon.metrics + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    got = samples(body)
    assert got['kvpool_requests_total{op="PUT"}'] == 6
    assert got['kvpool_requests_total{op="GET"}'] == 6
    assert got['kvpool_request_failures_total{op="GET"}'] == 0
    assert got['kvpool_request_failures_total{op="PUT"}'] == 1
    assert got['kvpool_request_duration_seconds_count{op="PUT"}'] == 6
    assert got['kvpool_request_duration_seconds_bucket{op="PUT",le="+Inf"}'] == 6
    assert got['kvpool_request_duration_seconds_sum{op="PUT"}'] > 0
    assert got['kvpool_value_bytes_total{transport="tcp",direction="in"}'] == 5 * 4096
    assert got['kvpool_value_bytes_total{transport="tcp",direction="out"}'] == 5 * 4096
    assert got['kvpool_info{role="all",version="0.1.0"}'] == 1
    # The STATS figures come from a snapshot taken every second.
    got = wait_for(lambda: (lambda s: s if s.get("kvpool_objects") == 5 else None)(
        samples(http_get(daemon.metrics + "/metrics")[2])), what="the snapshot")
    assert got["kvpool_stored_bytes"] == 5 * 4096
    assert got["kvpool_capacity_bytes"] == 64 << 20
    assert got["kvpool_puts_total"] == 5
    assert got["kvpool_stats_age_seconds"] < 5
    segment = [s for s in got if s.startswith("kvpool_segment_capacity_bytes{")]
    assert len(segment) == 1 and got[segment[0]] == 64 << 20

    # Pinned (hard, or a soft pin) and leased (read) objects.
    assert raw.put("hard", b"h", put=pb.PutOptions(hard_pin=True)) == OK
    assert raw.put("soft", b"s", put=pb.PutOptions(soft_pin=True, soft_pin_ttl_ms=60000)) == OK
    assert raw.exist("m-0")
    got = wait_for(lambda: (lambda s: s if s.get("kvpool_pinned_objects") == 2 else None)(
        samples(http_get(daemon.metrics + "/metrics")[2])), what="the pinned count")
    assert got["kvpool_leased_objects"] >= 1

    status, headers, body = http_get(daemon.metrics + "/health")
    assert status == 200 and headers["Content-Type"] == "application/json"
    health = json.loads(body)
    assert health["status"] == "ok" and health["role"] == "all"
    assert health["version"] == "0.1.0" and health["uptime_seconds"] > 0
    assert health["objects"] == 7
    assert http_get(daemon.metrics + "/nothing")[0] == 404
    assert http_get(daemon.metrics + "/metrics", method="POST")[0] == 405
    assert http_get(daemon.metrics + "/metrics", method="HEAD")[0] == 200

    # The same per-operation counters over the client socket (what kvpool top reads).
    reply, _ = raw.call(pb.STATS)
    ops = {pb.Op.Name(entry.op): entry for entry in reply.op_stats}
    assert ops["PUT"].requests == 8 and ops["PUT"].failures == 1 and ops["GET"].failures == 0
    assert len(ops["PUT"].latency_buckets) == 17 and sum(ops["PUT"].latency_buckets) == 8
    raw.close()


def test_no_http_with_port_zero():
    d = Kvpoold("--segment-size", "16MiB")  # the helper passes --metrics-port 0
    try:
        assert d.metrics is None
        assert "metrics" not in d.log_text()
    finally:
        d.finish()


def test_a_port_in_use_fails_the_start():
    """A metrics port that cannot be bound is not skipped: the node would run without the
    metrics it was asked for. The start fails (exit 1), naming the port and the option."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        for role in ([], ["--role", "master", "--master", "tcp://127.0.0.1:*"]):
            with pytest.raises(AssertionError) as failed:
                d = Kvpoold("--segment-size", "16MiB", "--metrics-port", port, *role)
                d.finish()
            text = str(failed.value)
            assert "exited with 1 at start" in text, text
            assert ("cannot serve /metrics on 127.0.0.1 port %d: Address already in use" % port
                    in text), text
            assert "--metrics-port 0" in text, text
    finally:
        taken.close()
    d = Kvpoold("--segment-size", "16MiB", "--metrics-port", "0")
    try:
        assert d.metrics is None
    finally:
        d.finish()


def test_prometheus_scrapes_kvpoold(daemon):
    assert os.access(PROMETHEUS, os.X_OK), "Debian's prometheus package (make deps installs it)"
    work = tempfile.mkdtemp(prefix="kvpool-prometheus-")
    target = urllib.parse.urlparse(daemon.metrics).netloc
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: kvpool\n    static_configs:\n"
                "      - targets: ['%s']\n" % target)
    web = "127.0.0.1:%d" % free_port()
    log = open(os.path.join(work, "prometheus.log"), "wb")
    proc = subprocess.Popen([PROMETHEUS, "--config.file=" + config,
                             "--storage.tsdb.path=" + os.path.join(work, "data"),
                             "--web.listen-address=" + web, "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        def query(expr):
            url = "http://%s/api/v1/query?%s" % (web, urllib.parse.urlencode({"query": expr}))
            try:
                status, _, body = http_get(url)
            except (urllib.error.URLError, ConnectionError):
                return None
            if status != 200:
                return None
            result = json.loads(body)["data"]["result"]
            return float(result[0]["value"][1]) if result else None

        raw = Raw(daemon.endpoint)
        workload(raw, "p", 3)
        # Prometheus scrapes kvpoold and holds its series.
        assert wait_for(lambda: query('up{job="kvpool"}') == 1, 30, "the scrape") == 1
        before = wait_for(lambda: query('kvpool_requests_total{op="PUT"}'), 30,
                          "kvpool_requests_total in Prometheus")
        assert before >= 4
        # A scripted workload moves the counters Prometheus reports, by what it did.
        workload(raw, "q", 7)
        wait_for(lambda: (query('kvpool_requests_total{op="PUT"}') or 0) >= before + 8, 30,
                 "the PUT counter to move")
        wait_for(lambda: (query("kvpool_objects") or 0) >= 10, 30, "kvpool_objects to move")
        assert query('kvpool_request_failures_total{op="PUT"}') == 2
        assert query('kvpool_request_duration_seconds_count{op="GET"}') == 3 + 1 + 7 + 1
        assert query("kvpool_get_hits_total") >= 10
        raw.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def test_dashboard_queries_name_metrics_that_exist():
    """docs/grafana-kvpool.json asks only for metrics kvpoold serves (docs/metrics.md's table,
    printed by kvpoold --metrics-markdown)."""
    import re
    repo = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    exe = os.path.join(os.environ.get("KVPOOL_BIN") or os.path.join(repo, "build", "bin"),
                       "kvpoold")
    table = subprocess.run([exe, "--metrics-markdown"], capture_output=True, text=True,
                           check=True).stdout
    served = set(re.findall(r"`(kvpool_\w+)`", table))
    with open(os.path.join(repo, "docs", "grafana-kvpool.json")) as f:
        dashboard = json.load(f)
    asked = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            asked |= {re.sub(r"_bucket$", "", name)
                      for name in re.findall(r"kvpool_\w+", target["expr"])}
    assert asked and asked <= served, asked - served


def test_a_master_serves_its_nodes():
    """A master's /metrics: the nodes it knows, alive and dead, and the keys it places;
    /health follows its liveness tick."""
    master = with_metrics("--role", "master", "--node-ttl", "600", "--master",
                          "tcp://127.0.0.1:*", prefix="kvpool-master-")
    nodes = []
    try:
        assert master.metrics
        for host in ("mA", "mB"):
            nodes.append(Kvpoold("--role", "node", "--master", master.endpoint, "--host-id", host,
                                 "--segment-size", "16MiB", "--heartbeat-interval", "100"))

        def scrape():
            return samples(http_get(master.metrics + "/metrics")[2])
        got = wait_for(lambda: (lambda s: s if s.get('kvpool_cluster_nodes{state="alive"}') == 2
                                else None)(scrape()), what="two alive nodes")
        assert got['kvpool_cluster_nodes{state="dead"}'] == 0
        assert got["kvpool_master_tick_age_seconds"] < 1
        raw = Raw(nodes[0].endpoint)
        for i in range(5):
            assert raw.put("mk-%d" % i, b"v") == OK
        raw.close()
        wait_for(lambda: scrape().get("kvpool_cluster_keys", 0) >= 5, what="the keys")
        status, _, body = http_get(master.metrics + "/health")
        health = json.loads(body)
        assert status == 200 and health["role"] == "master" and health["status"] == "ok"
        # A node that stops is dead after the node TTL.
        nodes.pop().finish()
        wait_for(lambda: scrape().get('kvpool_cluster_nodes{state="dead"}') == 1,
                 what="the dead node")
    finally:
        for node in nodes:
            node.finish()
        master.finish()
