#!/usr/bin/python3
"""bench_python.py - the Python binding's read throughput against the C client, in one run.

Measures, for 64 KiB and 1 MiB values in batches of 32 keys:
  C kvpool_get_batch_into        the C library called once per batch through ctypes with
                                 every argument array built beforehand: the C client's own
                                 throughput (one ctypes call costs about a microsecond)
  py batch_get_into              kvpool.mooncake.MooncakeDistributedStore.batch_get_into
                                 (keys, pointer list, size list), as the connectors call it
  py Client.get_batch_into       kvpool.Client.get_batch_into into numpy arrays
  C kvpool_get_batch             the C library's zero-copy batch get (values stay in the
                                 received messages), arrays built beforehand
  py get_batch (bytes)           MooncakeDistributedStore.get_batch: a list of bytes, each
                                 value copied once from the received message
each with the same-machine fast path on (the default; batch_get_into copies from the node's
shared segments) and off (everything over the TCP socket). Then the targets: py
batch_get_into of 1 MiB values within 10% of the C client; py get_batch (bytes) of 1 MiB
values at least half of py batch_get_into. Finally, unless --no-kvpool-bench, runs
build/bin/kvpool-bench --only kv against the same node and prints its batch-of-32 get rows.

Then the drop-in's batch methods beside the C calls they come down to, on both paths, with
the ratio py / C (the C calls through ctypes with every argument array built beforehand):
  batch_is_exist        1000 keys, all present and all absent (M keys/s), against
                        kvpool_exist_batch
  batch_put_from        32 values of 64 KiB, 1 MiB and 4 MiB (GB/s; each timed batch puts
                        fresh keys, removed untimed after it), against kvpool_put_batch
  batch_get_into        32 values of those sizes (GB/s), against kvpool_get_batch_into
Target: every batch method of the drop-in at least 0.80 of its C call.

Method: the machine is shared and noisy, so each measurement is repeated --reps times,
repetitions of the different paths interleaved, and the median reported. The first call of
each measurement is checked byte for byte against the values put. The C paths run in this
process, so under the same malloc settings as the Python ones (the package's glibc tuning,
applied when the first Client connects: see python/README.md); kvpool-bench is a separate
program linked with jemalloc and its own pre-faulted buffers, so its figures are a reference,
not the baseline of the targets.

    python3 python/bench/bench_python.py [--endpoint tcp://...] [--reps 5] [--time-ms 500]

Without --endpoint it starts build/bin/kvpoold (or $KVPOOL_BIN/kvpoold) on loopback ports with
a 1 GiB segment and stops it at the end. Exit status 0 when every call succeeded and every
check passed (missed targets are reported, not failed), 1 otherwise.
"""

import argparse
import array
import ctypes
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.append(os.path.join(REPO, "tests", "python"))  # kvpool_daemon, shared with the tests

import numpy as np  # noqa: E402

import kvpool  # noqa: E402
from kvpool import _native  # noqa: E402
from kvpool.mooncake import MooncakeDistributedStore  # noqa: E402
from kvpool_daemon import Kvpoold, bin_dir  # noqa: E402

BATCH = 32
SIZES = [(64 << 10, "64KiB"), (1 << 20, "1MiB")]
DROPIN_SIZES = [(64 << 10, "64KiB"), (1 << 20, "1MiB"), (4 << 20, "4MiB")]
EXIST_KEYS = 1000


def start_daemon():
    try:
        return Kvpoold("--segment-size", "1GiB", prefix="kvpool-bench-py-")
    except AssertionError as error:
        sys.exit("bench_python: %s" % error)


class CBatchInto:
    """kvpool_get_batch_into on a connection of its own, every array built once."""

    def __init__(self, endpoint, keys, buffers, size, fast_path):
        options = _native.Options()
        _native.options_init(ctypes.byref(options))
        options.timeout_ms = 60000
        options.fast_path = 1 if fast_path else 0
        self.handle = _native.connect(endpoint.encode(), ctypes.byref(options))
        if not self.handle:
            raise kvpool.RpcFailError(reason="cannot connect")
        self.n = len(keys)
        self.keys = (ctypes.c_char_p * self.n)(*[k.encode() for k in keys])
        self.ptrs = array.array("Q", [b.ctypes.data for b in buffers])
        self.caps = array.array("Q", [size] * self.n)
        self.results = array.array("q", [0] * self.n)
        self.args = (self.handle, self.n, self.keys, self.ptrs.buffer_info()[0],
                     self.caps.buffer_info()[0], self.results.buffer_info()[0])
        self.size = size

    def __call__(self):
        rc = _native.get_batch_into(*self.args)
        if rc != 0 or self.results.count(self.size) != self.n:
            raise kvpool.error_for(rc if rc < 0 else -1, "C batch_get_into: %r"
                                   % self.results.tolist())

    def close(self):
        _native.destroy(ctypes.byref(ctypes.c_void_p(self.handle)))


def c_handle(endpoint, fast_path):
    options = _native.Options()
    _native.options_init(ctypes.byref(options))
    options.timeout_ms = 60000
    options.fast_path = 1 if fast_path else 0
    handle = _native.connect(endpoint.encode(), ctypes.byref(options))
    if not handle:
        raise kvpool.RpcFailError(reason="cannot connect")
    return handle


class CCall:
    """One C batch call on a connection of its own, every argument array built once."""

    def __init__(self, endpoint, fast_path, fn, keys, *arrays, check):
        self.handle = c_handle(endpoint, fast_path)
        self.keys = (ctypes.c_char_p * len(keys))(*[k.encode() for k in keys])
        self.arrays = arrays
        self.args = [self.handle, len(keys), self.keys]
        for a in arrays:
            self.args.append(a.buffer_info()[0] if isinstance(a, array.array) else a)
        self.fn = fn
        self.check = check

    def __call__(self):
        #  The results are checked on the first call (measure's untimed warm-up) only, so
        #  that the figure is the C call's alone.
        rc = self.fn(*self.args)
        if rc != 0 or (self.check is not None and not self.check()):
            raise kvpool.error_for(rc if rc < 0 else -1, "C %s" % self.fn.__name__)
        self.check = None

    def close(self):
        _native.destroy(ctypes.byref(ctypes.c_void_p(self.handle)))


class CGetBatch(CBatchInto):
    """kvpool_get_batch (zero-copy values), arrays built once; the values are dropped."""

    def __init__(self, endpoint, keys, size, fast_path):
        super().__init__(endpoint, keys, [], size, fast_path)
        self.statuses = array.array("i", [0] * self.n)
        self.values = ctypes.c_void_p()

    def __call__(self):
        rc = _native.get_batch(self.handle, self.n, self.keys, ctypes.byref(self.values),
                               self.statuses.buffer_info()[0])
        ok = rc == 0 and self.statuses.count(0) == self.n
        _native.values_destroy(ctypes.byref(self.values))
        if not ok:
            raise kvpool.error_for(rc if rc < 0 else -1, "C get_batch")


def measure(fn, time_ms):
    """Calls fn until time_ms passed; returns calls per second."""
    fn()                                        # warm: not timed
    calls = 0
    start = time.perf_counter()
    deadline = start + time_ms / 1000.0
    while True:
        fn()
        calls += 1
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - start)


def measure_with_cleanup(fn, cleanup, time_ms):
    """Calls fn, then cleanup untimed, until fn has taken time_ms; returns fn's calls per
    second."""
    fn()
    cleanup()
    calls, spent = 0, 0.0
    while spent < time_ms / 1000.0:
        start = time.perf_counter()
        fn()
        spent += time.perf_counter() - start
        calls += 1
        cleanup()
    return calls / spent


def run_dropin(endpoint, args, failures):
    """The drop-in's batch methods beside their C calls: name -> {(fast, path): figure}."""
    out = {}
    setup = kvpool.Client(endpoint, timeout=60)
    rng = np.random.default_rng(7)
    present = ["bench-exist-%05d" % i for i in range(EXIST_KEYS)]
    absent = ["bench-absent-%05d" % i for i in range(EXIST_KEYS)]
    setup.remove_batch(present, force=True)
    if setup.put_batch(present, [b"x"] * EXIST_KEYS) != [0] * EXIST_KEYS:
        failures.append("exist: put failed")
    for fast in args.fast_paths:
        store = MooncakeDistributedStore()
        store.timeout = 60
        if store.setup("bench", "", 0, 0, "tcp", "", endpoint) != 0:
            failures.append("store setup failed")
            continue
        store._client.fast_path = fast
        for label, keys, want in (("present", present, 1), ("absent", absent, 0)):
            results = array.array("i", [0] * EXIST_KEYS)
            c_exist = CCall(endpoint, fast, _native.exist_batch, keys, results,
                            check=lambda r=results, w=want: r.count(w) == EXIST_KEYS)

            def py_exist(keys=keys, want=want):
                got = store.batch_is_exist(keys)
                if got[0] != want or got[-1] != want:
                    raise kvpool.error_for(-1, "py batch_is_exist: %r" % got[:3])
            samples = {"C": [], "py": []}
            for _ in range(args.reps):
                samples["C"].append(measure(c_exist, args.time_ms) * EXIST_KEYS / 1e6)
                samples["py"].append(measure(py_exist, args.time_ms) * EXIST_KEYS / 1e6)
            c_exist.close()
            row = out.setdefault("batch_is_exist %d %s (M keys/s)" % (EXIST_KEYS, label), {})
            for path in samples:
                row[(fast, path)] = statistics.median(samples[path])
        for size, size_name in DROPIN_SIZES:
            keys = ["bench-dropin-%s-%d" % (size_name, i) for i in range(BATCH)]
            setup.remove_batch(keys, force=True)
            values = [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(BATCH)]
            ptrs = [v.ctypes.data for v in values]
            sizes = [size] * BATCH
            statuses = array.array("i", [0] * BATCH)
            c_put = CCall(endpoint, fast, _native.put_batch, keys, array.array("Q", ptrs),
                          array.array("Q", sizes), None, statuses,
                          check=lambda: statuses.count(0) == BATCH)

            def py_put(keys=keys, ptrs=ptrs, sizes=sizes):
                got = store.batch_put_from(keys, ptrs, sizes)
                if got[0] != 0 or got[-1] != 0:
                    raise kvpool.error_for(min(got), "py batch_put_from")

            def cleanup(keys=keys):
                setup.remove_batch(keys, force=True)
            outs = [np.zeros(size, dtype=np.uint8) for _ in range(BATCH)]
            out_ptrs = [o.ctypes.data for o in outs]
            got = array.array("q", [0] * BATCH)
            c_get = CCall(endpoint, fast, _native.get_batch_into, keys,
                          array.array("Q", out_ptrs), array.array("Q", sizes), got,
                          check=lambda: got.count(size) == BATCH)

            def py_get(keys=keys, out_ptrs=out_ptrs, sizes=sizes, size=size):
                result = store.batch_get_into(keys, out_ptrs, sizes)
                if result[0] != size or result[-1] != size:
                    raise kvpool.error_for(min(result), "py batch_get_into")
            samples = {(op, path): [] for op in ("put", "get") for path in ("C", "py")}
            try:
                for _ in range(args.reps):
                    samples[("put", "C")].append(measure_with_cleanup(c_put, cleanup,
                                                                      args.time_ms))
                    samples[("put", "py")].append(measure_with_cleanup(py_put, cleanup,
                                                                       args.time_ms))
                py_put()
                py_get()
                if any(not np.array_equal(o, v) for o, v in zip(outs, values)):
                    failures.append("py batch_get_into %s: other bytes" % size_name)
                for _ in range(args.reps):
                    samples[("get", "C")].append(measure(c_get, args.time_ms))
                    samples[("get", "py")].append(measure(py_get, args.time_ms))
            except kvpool.Error as exc:
                failures.append("drop-in %s: %s" % (size_name, exc))
            c_put.close()
            c_get.close()
            cleanup()
            for (op, path), values_ in samples.items():
                if values_:
                    name = "batch_%s %dx%s (GB/s)" % ("put_from" if op == "put" else "get_into",
                                                       BATCH, size_name)
                    out.setdefault(name, {})[(fast, path)] = (
                        statistics.median(values_) * BATCH * size / 1e9)
        store.close()
    setup.remove_batch(present, force=True)
    setup.close()
    return out


def print_dropin(out, args):
    print("\n== Mooncake drop-in batch methods vs the C calls under them (medians of %d runs "
          "of %d ms; ratio py / C, target >= 0.80) ==" % (args.reps, args.time_ms))
    for fast in args.fast_paths:
        print("\nfast path %s" % ("on (same-machine)" if fast else "off (tcp)"))
        print("%-40s %10s %10s %8s" % ("method", "C", "py", "py/C"))
        for name, row in out.items():
            c, py = row.get((fast, "C")), row.get((fast, "py"))
            if c is None or py is None:
                continue
            print("%-40s %10.3f %10.3f %8.2f  %s" % (name, c, py, py / c,
                                                      "met" if py / c >= 0.8 else "MISSED"))
    sys.stdout.flush()


def run(args):
    daemon = None
    endpoint = args.endpoint
    if not endpoint:
        daemon = start_daemon()
        endpoint = daemon.endpoint
    failures = []
    results = {}            # (size_name, fast, path) -> GB/s
    try:
        setup = kvpool.Client(endpoint, timeout=60)
        rng = np.random.default_rng(5)
        for size, size_name in SIZES:
            keys = ["bench-py-%s-%d" % (size_name, i) for i in range(BATCH)]
            setup.remove_batch(keys, force=True)
            values = [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(BATCH)]
            codes = setup.put_batch(keys, values)
            if codes != [0] * BATCH:
                failures.append("put %s: %r" % (size_name, codes))
                continue
            for fast in args.fast_paths:
                paths = make_paths(endpoint, keys, values, size, fast, failures)
                samples = {name: [] for name in paths}
                for _ in range(args.reps):
                    for name, (fn, _) in paths.items():
                        try:
                            samples[name].append(measure(fn, args.time_ms) * BATCH * size / 1e9)
                        except kvpool.Error as exc:
                            failures.append("%s %s: %s" % (name, size_name, exc))
                for name, (_, closer) in paths.items():
                    closer()
                    if samples[name]:
                        results[(size_name, fast, name)] = statistics.median(samples[name])
            setup.remove_batch(keys, force=True)
        setup.close()
        print_results(results, args)
        if args.dropin:
            print_dropin(run_dropin(endpoint, args, failures), args)
        if args.kvpool_bench:
            run_kvpool_bench(endpoint, args, failures)
    finally:
        if daemon is not None:
            try:
                daemon.stop(timeout=20)
            except AssertionError as error:
                failures.append(str(error))
            else:
                daemon.remove()
    for failure in failures:
        print("FAILED: " + failure)
    return 1 if failures else 0


def make_paths(endpoint, keys, values, size, fast, failures):
    """name -> (callable doing one batch, closer). Checks each path's bytes once."""
    paths = {}
    out = [np.zeros(size, dtype=np.uint8) for _ in range(BATCH)]

    def check(name):
        for i, (o, v) in enumerate(zip(out, values)):
            if not np.array_equal(o, v):
                failures.append("%s: value %d differs" % (name, i))
                break
            o[:] = 0

    c_into = CBatchInto(endpoint, keys, out, size, fast)
    c_into()
    check("C kvpool_get_batch_into")
    paths["C kvpool_get_batch_into"] = (c_into, c_into.close)

    store = MooncakeDistributedStore()
    store.timeout = 60
    rc = store.setup("bench", "", 0, 0, "tcp", "", endpoint)
    if rc != 0:
        failures.append("store setup: %d" % rc)
        return paths
    store._client.fast_path = fast
    ptrs = [o.ctypes.data for o in out]
    sizes = [size] * BATCH
    got = store.batch_get_into(keys, ptrs, sizes)
    if got != sizes:
        failures.append("py batch_get_into: %r" % got)
    check("py batch_get_into")

    def py_into():
        result = store.batch_get_into(keys, ptrs, sizes)
        if result[0] != size or result[-1] != size:
            raise kvpool.error_for(min(result), "py batch_get_into")
    paths["py batch_get_into"] = (py_into, lambda: None)

    client = kvpool.Client(endpoint, timeout=60, fast_path=fast)
    client.get_batch_into(keys, out)
    check("py Client.get_batch_into")

    def py_client_into():
        client.get_batch_into(keys, out)
    paths["py Client.get_batch_into"] = (py_client_into, client.close)

    c_get = CGetBatch(endpoint, keys, size, fast)
    paths["C kvpool_get_batch"] = (c_get, c_get.close)

    got = store.get_batch(keys)
    if [len(g) for g in got] != sizes or any(g != v.tobytes() for g, v in zip(got, values)):
        failures.append("py get_batch returned other bytes")

    def py_get_batch():
        result = store.get_batch(keys)
        if len(result[0]) != size or len(result[-1]) != size:
            raise kvpool.error_for(-704, "py get_batch")
    paths["py get_batch (bytes)"] = (py_get_batch, store.close)
    return paths


def machine():
    """The machine's CPUs and, where the kernel says, its CPU idle driver and a virtual
    machine's guest halt polling: with polling off every thread wake-up is slow (kvpool-bench
    prints the same; docs/troubleshooting.md)."""
    def first_line(path):
        try:
            with open(path) as f:
                return f.readline().strip()
        except OSError:
            return ""
    out = "%d CPUs" % os.cpu_count()
    driver = first_line("/sys/devices/system/cpu/cpuidle/current_driver")
    poll_ns = first_line("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    if driver:
        out += ", cpuidle %s" % driver
    if poll_ns:
        out += ", guest_halt_poll_ns %s" % poll_ns
    return out


def print_results(results, args):
    print("\n== Python binding vs C client: get, batch of %d, median of %d runs of %d ms "
          "(GB/s) ==" % (BATCH, args.reps, args.time_ms))
    print("library %s, malloc tuning %s" % (kvpool.library_path,
                                             "on" if _native._malloc["done"] else "off"))
    print("machine: %s" % machine())
    names = ["C kvpool_get_batch_into", "py batch_get_into", "py Client.get_batch_into",
             "C kvpool_get_batch", "py get_batch (bytes)"]
    for fast in args.fast_paths:
        print("\nfast path %s" % ("on (same-machine)" if fast else "off (tcp)"))
        print("%-28s" % "path" + "".join("%12s" % name for _, name in SIZES))
        for name in names:
            row = "%-28s" % name
            for _, size_name in SIZES:
                value = results.get((size_name, fast, name))
                row += "%12s" % ("%.3f" % value if value is not None else "-")
            print(row)
    print("\ntargets (1MiB values, batch of 32):")
    for fast in args.fast_paths:
        label = "fast path on" if fast else "fast path off"
        c = results.get(("1MiB", fast, "C kvpool_get_batch_into"))
        py = results.get(("1MiB", fast, "py batch_get_into"))
        b = results.get(("1MiB", fast, "py get_batch (bytes)"))
        if c and py:
            print("  %-14s py batch_get_into / C = %.3f  (target >= 0.90: %s)"
                  % (label, py / c, "met" if py / c >= 0.9 else "MISSED"))
        if py and b:
            print("  %-14s py get_batch bytes / py batch_get_into = %.3f  (target >= 0.50: %s)"
                  % (label, b / py, "met" if b / py >= 0.5 else "MISSED"))
    sys.stdout.flush()


def run_kvpool_bench(endpoint, args, failures):
    exe = os.path.join(bin_dir(), "kvpool-bench")
    if not os.access(exe, os.X_OK):
        print("\n(kvpool-bench not built: no C bench figures)")
        return
    print("\n== kvpool-bench --only kv against the same node (its batch-of-32 get rows) ==")
    try:
        result = subprocess.run([exe, "--only", "kv", "--endpoint", endpoint, "--reps",
                                 str(args.reps), "--time-ms", str(args.time_ms)],
                                capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        failures.append("kvpool-bench timed out")
        return
    header = [line for line in result.stdout.splitlines() if line.startswith("op ")]
    if header:
        print(header[0])
    for line in result.stdout.splitlines():
        if re.match(r"^get\s+(64KiB|1MiB)\s+32\s+kvpool", line):
            print(line)
    if result.returncode != 0:
        failures.append("kvpool-bench exited with %d: %s" % (result.returncode,
                                                             result.stderr[-500:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", help="an existing kvpoold (default: start one)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--time-ms", type=int, default=500)
    parser.add_argument("--fast-path", choices=["both", "on", "off"], default="both")
    parser.add_argument("--no-kvpool-bench", dest="kvpool_bench", action="store_false")
    parser.add_argument("--no-dropin", dest="dropin", action="store_false",
                        help="skip the drop-in batch methods' section")
    args = parser.parse_args()
    args.fast_paths = {"both": [True, False], "on": [True], "off": [False]}[args.fast_path]
    if args.reps < 1 or args.time_ms < 1:
        parser.error("--reps and --time-ms must be positive")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
