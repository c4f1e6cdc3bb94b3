"""REMOVE_BY_REGEX under hostile patterns, against the real kvpoold (issue 8, item 1).

With glibc's regex on the replica-manager's thread, 13,000 nested parentheses crashed the
daemon (stack overflow in regcomp), (a+)+$ over 300 keys of 4 KB stalled every other request
for 51 s, (.*)(.*)(.*)\\3\\2\\1x for 17 s, and a{1,32767} took 6 GB. Now patterns are PCRE2,
compiled and matched under limits, and matched on a thread of their own. Each check here
must end within seconds, the daemon must keep answering (1 MiB gets over tcp, which go through
the replica-manager, keep flowing while a regex is matched), and a normal pattern must
still remove exactly what it matches.

Raw frames over pyzmq with the kvpool_pb2 module that `make` generates; kvpoold bound to
127.0.0.1. Run by `make test` with Debian's /usr/bin/python3.
"""

import threading
import time

import pytest
import zmq

from kvpool_daemon import Kvpoold
from kvpool_test_pb import pb  # the generated protocol module

MAX_REGEX_LEN = 30000          # the daemon's --max-regex-len here: 13,000 nested parens fit
KEY_COUNT = 300
BIG = 1 << 20                  # over the 64 KiB the api answers from its read index


class Daemon(Kvpoold):
    def __init__(self, *extra):
        super().__init__("--segment-size", "64MiB", "--max-value-size", "2MiB", *extra,
                         prefix="kvpool-regex-", start_timeout=20)

    def rss_kib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


class Client:
    """One DEALER; call() sends a request and waits for its reply (frames after the first
    are values)."""

    def __init__(self, endpoint, timeout_ms=10000):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        self.sock.connect(endpoint)
        self.next_id = 1

    def call(self, op, keys=(), values=(), **fields):
        wire = [k.encode() if isinstance(k, str) else k for k in keys]
        request = pb.Request(version=1, request_id=self.next_id, op=op, keys=wire, **fields)
        self.next_id += 1
        self.sock.send_multipart([request.SerializeToString()] + list(values))
        frames = self.sock.recv_multipart()
        reply = pb.Reply()
        reply.ParseFromString(frames[0])
        assert reply.request_id == request.request_id
        return reply, frames[1:]

    def regex(self, pattern, force=True):
        start = time.monotonic()
        reply, _ = self.call(pb.REMOVE_BY_REGEX, pattern=pattern, force=force)
        return reply, time.monotonic() - start

    def put(self, keys, values):
        reply, _ = self.call(pb.PUT, keys, values)
        assert reply.status == 0 and list(reply.statuses) == [0] * len(keys), reply
        return reply

    def exist(self, keys):
        reply, _ = self.call(pb.EXIST, keys)
        return [status == 0 for status in reply.statuses]

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def daemon():
    d = Daemon("--max-regex-len", str(MAX_REGEX_LEN), "--regex-time-limit", "3000")
    yield d
    assert d.stop() == 0, "kvpoold did not stop cleanly"
    d.remove()


@pytest.fixture
def client(daemon):
    c = Client(daemon.endpoint)
    c.call(pb.REMOVE_ALL, force=True)
    yield c
    c.close()


def _long_keys(prefix):
    # 4095 bytes each (the default key limit is 4096): a's, then a number.
    return ["a" * (4095 - len(prefix) - 5) + prefix + "%05d" % i for i in range(KEY_COUNT)]


def test_nested_parentheses_are_refused_and_the_daemon_lives(daemon, client):
    pattern = "(" * 13000 + ")" * 13000
    reply, seconds = client.regex(pattern)
    assert reply.status == pb.INVALID_PARAMS
    assert "too deeply nested" in reply.error, reply.error
    assert seconds < 5
    assert daemon.proc.poll() is None
    ping, _ = client.call(pb.PING)
    assert ping.status == 0


def test_too_long_a_pattern_is_refused_with_a_reason(client):
    reply, _ = client.regex("a" * (MAX_REGEX_LEN + 1))
    assert reply.status == pb.INVALID_PARAMS
    assert "longer than the limit of %d" % MAX_REGEX_LEN in reply.error, reply.error
    reply, _ = client.regex("([unclosed")
    assert reply.status == pb.INVALID_PARAMS and "bad regular expression" in reply.error


def test_wide_repeat_stays_small(daemon, client):
    client.put(["rss/%d" % i for i in range(20)], [b"v"] * 20)
    client.put(["ss/" + "a" * 4000], [b"v"])
    before = daemon.rss_kib()
    reply, seconds = client.regex("a{1,32767}")
    after = daemon.rss_kib()
    assert seconds < 5
    # Refused or bounded; either way memory stays put (glibc took 6 GB).
    assert reply.status in (0, pb.INVALID_PARAMS), reply
    if reply.status == 0:
        assert reply.count == 1
    assert after - before < 200 * 1024, (before, after)
    assert client.exist(["rss/0"]) == [True]


class Getter(threading.Thread):
    """GETs a 1 MiB value in a loop on its own socket, recording (start, latency)."""

    def __init__(self, endpoint, key):
        super().__init__(daemon=True)
        self.client = Client(endpoint, timeout_ms=5000)
        self.key = key
        self.samples = []
        self.stop = threading.Event()
        self.error = None

    def run(self):
        try:
            while not self.stop.is_set():
                start = time.monotonic()
                reply, values = self.client.call(pb.GET, [self.key])
                assert list(reply.statuses) == [0] and len(values[0]) == BIG
                self.samples.append((start, time.monotonic() - start))
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.error = error
        finally:
            self.client.close()

    def during(self, start, end):
        return [latency for begun, latency in self.samples if start <= begun <= end]


def _percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def _regex_while_getting(daemon, client, pattern):
    getter = Getter(daemon.endpoint, "huge")
    getter.start()
    try:
        idle_start = time.monotonic()
        time.sleep(0.5)
        start = time.monotonic()
        reply, seconds = client.regex(pattern)
        end = time.monotonic()
        time.sleep(0.1)
    finally:
        getter.stop.set()
        getter.join(10)
    assert getter.error is None, getter.error
    idle, during = getter.during(idle_start + 0.1, start), getter.during(start, end)
    if during:
        print("1 MiB gets over tcp, p50/p99 ms: idle %.2f/%.2f, during the regex %.2f/%.2f "
              "(p99 ratio %.2f)" % (1000 * _percentile(idle, 0.5), 1000 * _percentile(idle, 0.99),
                                    1000 * _percentile(during, 0.5),
                                    1000 * _percentile(during, 0.99),
                                    _percentile(during, 0.99) / max(_percentile(idle, 0.99), 1e-9)))
    return reply, seconds, during


@pytest.mark.parametrize("pattern", ["(a+)+$", "(.*)(.*)(.*)\\3\\2\\1x", "a*[bc]"])
def test_costly_patterns_end_quickly_and_gets_keep_flowing(daemon, client, pattern):
    keys = _long_keys("k")
    for i in range(0, KEY_COUNT, 50):
        client.put(keys[i:i + 50], [b"v"] * 50)
    client.put(["huge"], [b"B" * BIG])   # a key none of the patterns matches
    reply, seconds, latencies = _regex_while_getting(daemon, client, pattern)
    print("%s: status %d (%s), count %d, %.3f s; %d gets meanwhile, max %.1f ms"
          % (pattern, reply.status, reply.error, reply.count, seconds, len(latencies),
             1000 * max(latencies, default=0)))
    # A clear error or a result, within a few seconds (the time limit here is 3 s).
    assert seconds < 6
    if reply.status == 0:
        assert reply.count == 0          # none of the keys matches any of these
    else:
        assert reply.status == pb.INVALID_PARAMS
        assert "nothing removed" in reply.error, reply.error
    assert all(client.exist(keys[:3] + keys[-3:]))
    # The store kept serving: the gets issued during the regex came back quickly. (PCRE2
    # sometimes proves a pattern cannot match in a millisecond or two; then no get fits in.)
    if seconds > 0.2:
        assert latencies, "no get completed during the regex"
    assert max(latencies, default=0) < 1.0, max(latencies)
    if seconds > 1.0:
        assert len(latencies) >= 10, len(latencies)
    assert daemon.proc.poll() is None


def test_a_normal_pattern_removes_exactly_its_matches(client):
    keys = ["rx/job-1", "rx/job-22", "rx/job-x", "keep/job-3", "rx/job-\n", "rx/job-4\n",
            "rx/JOB-5"]
    client.put(keys, [b"v"] * len(keys))
    reply, _ = client.regex("^rx/job-[0-9]+$")
    assert reply.status == 0 and reply.count == 2, reply
    assert client.exist(keys) == [False, False, True, True, True, True, True]
    # Unanchored like regexec; '.' matches a newline; '$' is the very end, not before a
    # final newline; case matters.
    reply, _ = client.regex("job-.$")
    assert reply.status == 0 and reply.count == 3, reply
    assert client.exist(keys) == [False, False, False, False, False, True, True]
    # A lease protects without force.
    client.put(["leased/1"], [b"v"])
    client.call(pb.GET, ["leased/1"])
    reply, _ = client.regex("^leased/", force=False)
    assert reply.status == 0 and reply.count == 0
    reply, _ = client.regex("^leased/", force=True)
    assert reply.status == 0 and reply.count == 1


def test_the_default_length_limit():
    d = Daemon()
    try:
        c = Client(d.endpoint)
        reply, _ = c.regex("x" * 4097)
        assert reply.status == pb.INVALID_PARAMS and "limit of 4096" in reply.error
        reply, _ = c.regex("x" * 4096)
        assert reply.status == 0 and reply.count == 0
        c.close()
    finally:
        assert d.stop() == 0
    d.remove()


def test_stopping_while_a_regex_runs_is_clean():
    d = Daemon("--regex-time-limit", "20000")
    try:
        c = Client(d.endpoint)
        keys = _long_keys("s")
        for i in range(0, KEY_COUNT, 50):
            c.put(keys[i:i + 50], [b"v"] * 50)
        # About 10-25 ms a key: seconds of matching, cut short by the stop.
        request = pb.Request(version=1, request_id=99, op=pb.REMOVE_BY_REGEX, pattern="a*[bc]",
                             force=True)
        c.sock.send_multipart([request.SerializeToString()])
        time.sleep(0.3)
        start = time.monotonic()
        status = d.stop(timeout=30)
        assert status == 0, d.log_text(2000)
        print("stopped in %.2f s" % (time.monotonic() - start))
        c.close()
    finally:
        d.remove()
