"""A real kvpoold for the Python tests and the Python bench: started, waited for, stopped.

The one helper of tests/python, python/tests (through conftest.py) and python/bench: each
adds this folder to sys.path (pytest does it for tests/python) and imports Kvpoold.

    daemon = Kvpoold("--segment-size", "64MiB")       # extra kvpoold options
    sock.connect(daemon.endpoint)
    ...
    assert daemon.stop() == 0, daemon.log_text()

Kvpoold binds tcp://127.0.0.1:* (ephemeral ports) for clients and for the admin channel unless
told other endpoints, sends kvpoold's output to a log file in a temporary folder of its own,
and learns which ports it got from kvpoold's ready file (--ready-file). That file holds a line
per bound endpoint and the pid (tools/kvpoold.c writes it once it serves, under another name,
then renames it, so a reader sees all of it or none):

    endpoint=tcp://127.0.0.1:41234
    endpoint=ipc://@kvpool-41234       (the same-machine endpoint kvpoold adds by itself)
    admin=tcp://127.0.0.1:41235
    kv_events=tcp://127.0.0.1:41236    (with --kv-events-endpoint)
    kv_events_replay=tcp://127.0.0.1:41237   (with --kv-events-replay-endpoint)
    metrics=http://127.0.0.1:41238     (with --metrics-port; the helper passes 0, no HTTP,
                                        unless the test gives one: free_port() finds one)
    pid=12345

read_ready_file here is its only reader in Python; the C tests and kvpool-bench have
infra/ready_file.c. Only the standard library: the raw-protocol tests use it without the
kvpool package or libkvpool.
"""

import os
import shutil
import socket
import signal
import subprocess
import tempfile
import time

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LOOPBACK = "tcp://127.0.0.1:*"


def bin_dir():
    """Where kvpoold is: $KVPOOL_BIN (tests/run.sh sets it) or build/bin."""
    return os.environ.get("KVPOOL_BIN") or os.path.join(REPO, "build", "bin")


def free_port():
    """A TCP port on loopback that was free a moment ago (for --metrics-port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_ready_file(path):
    """{"endpoint": [...], "admin": [...], "pid": [...]} in the file's order (a name the file
    does not have maps to []), or None when there is no file yet."""
    try:
        with open(path) as file:
            lines = file.read().splitlines()
    except FileNotFoundError:
        return None
    values = {"endpoint": [], "admin": [], "pid": []}
    for line in lines:
        name, eq, value = line.partition("=")
        if eq:
            values.setdefault(name, []).append(value)
    return values


def _first(endpoints, scheme):
    return next((e for e in endpoints if e.startswith(scheme)), None)


class Kvpoold:
    """A running kvpoold.

    .endpoint   its first tcp client endpoint (None if it has none)
    .ipc        its first ipc client endpoint (None if it has none)
    .admin      its first tcp admin endpoint; .admin_ipc its first ipc one
    .endpoints, .admins   every client and admin endpoint, in the ready file's order
    .proc, .pid           the process; .dir its folder, .log_path its output

    args are extra kvpoold options. endpoints and admins replace the loopback defaults
    (--endpoint and --admin each). preexec_fn runs in the child before kvpoold (limits).
    wrapper is a command that runs kvpoold (["ip", "netns", "exec", NAME]: one that execs it,
    so that .pid stays kvpoold's).
    Raises AssertionError, with the end of the log, if kvpoold exits or is not ready within
    start_timeout seconds (then it is killed).
    """

    def __init__(self, *args, endpoints=(LOOPBACK,), admins=(LOOPBACK,), prefix="kvpool-test-",
                 start_timeout=15.0, preexec_fn=None, wrapper=()):
        exe = os.path.join(bin_dir(), "kvpoold")
        if not os.access(exe, os.X_OK):
            raise AssertionError("no kvpoold at %s: run make first" % exe)
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.ready_path = os.path.join(self.dir, "ready")
        self.log_path = os.path.join(self.dir, "kvpoold.log")
        command = list(wrapper) + [exe]
        for endpoint in endpoints:
            command += ["--endpoint", endpoint]
        for admin in admins:
            command += ["--admin", admin]
        args = [str(a) for a in args]
        if not any(a == "--metrics-port" or a.startswith("--metrics-port=") for a in args):
            args = ["--metrics-port", "0"] + args  # many test daemons: none takes port 9003
        command += ["--ready-file", self.ready_path] + args
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec_fn)
        self.pid = self.proc.pid
        ready = self._wait_ready(start_timeout)
        self.endpoints = ready["endpoint"]
        self.admins = ready["admin"]
        self.endpoint = _first(self.endpoints, "tcp://")
        self.ipc = _first(self.endpoints, "ipc://")
        self.admin = _first(self.admins, "tcp://")
        self.admin_ipc = _first(self.admins, "ipc://")
        # --kv-events-endpoint / --kv-events-replay-endpoint, as bound (None when not asked)
        self.kv_events = _first(ready.get("kv_events", []), "")
        self.kv_events_replay = _first(ready.get("kv_events_replay", []), "")
        # --metrics-port: the HTTP server's base URL, or None
        self.metrics = _first(ready.get("metrics", []), "")

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            # Read before looking at the process: a daemon that served and then died still
            # fails, at the caller's first request, not here.
            ready = read_ready_file(self.ready_path)
            if ready is not None and ready["endpoint"]:
                return ready
            if self.proc.poll() is not None:
                self._log.close()
                raise AssertionError("kvpoold exited with %s at start:\n%s"
                                     % (self.proc.returncode, self.log_text(4000)))
            if time.monotonic() >= deadline:
                self.proc.kill()
                self.proc.wait()
                self._log.close()
                raise AssertionError("kvpoold not ready after %.0f s:\n%s"
                                     % (timeout, self.log_text(4000)))
            time.sleep(0.02)

    def alive(self):
        return self.proc.poll() is None

    def stop(self, timeout=15.0):
        """SIGTERM and wait; returns the exit status. A daemon still running after timeout
        seconds is killed and fails the caller (AssertionError). Stopping twice is harmless."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._log.close()
                raise AssertionError("kvpoold did not stop within %g s of SIGTERM:\n%s"
                                     % (timeout, self.log_text(4000)))
        self._log.close()
        return self.proc.returncode

    def finish(self):
        """The end of a test: checks that kvpoold was still running and stops cleanly (exit
        status 0), removes its folder, and returns its log."""
        alive = self.alive()
        status = self.stop()
        log = self.log_text()
        self.remove()
        assert alive, "kvpoold died during the test:\n" + log[-4000:]
        assert status == 0, "kvpoold exited with %s:\n%s" % (status, log[-4000:])
        return log

    def log_text(self, tail=None):
        """kvpoold's output so far (its last `tail` characters when given)."""
        try:
            with open(self.log_path, "rb") as file:
                text = file.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return text[-tail:] if tail else text

    def remove(self):
        """Stops kvpoold if it runs (killing it) and removes its folder and log."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def with_metrics(*args, tries=5, **kwargs):
    """A Kvpoold serving /metrics on a port that was free a moment ago; started again on
    another when something took that one in the moment between (a port that cannot be bound
    fails the start)."""
    for _ in range(tries):
        try:
            return Kvpoold(*args, "--metrics-port", free_port(), **kwargs)
        except AssertionError as failed:
            if "cannot serve /metrics" not in str(failed):
                raise
    raise AssertionError("no free port for --metrics-port in %d tries" % tries)


def wait_for(predicate, seconds=5.0):
    """Polls predicate until it holds or seconds have passed; returns its last value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def all_stopped(pid):
    """Whether every thread of pid is stopped (state T). SIGSTOP is delivered to each thread
    on its own, so a test that needs a frozen daemon waits for this after os.kill."""
    try:
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, task)) as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "T":
                    return False
    except OSError:
        return False
    return True
