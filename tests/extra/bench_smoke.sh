#!/usr/bin/env bash
# bench_smoke.sh - smoke run of the benchmark: build/bin/kvpool-bench --quick (it starts its own
# kvpoold and redis-server on loopback and stops them). Fails if the bench exits non-zero (a
# failed call, a value that did not read back, a server that would not start), takes 55 s or
# more, or prints no figures: it must print numeric kvpool and Redis throughputs for the
# 1 MiB batched get, a memcpy reference, the targets, and the tier section's figures (disk-tier
# reads against dd, puts under overflow), and --plot must draw its four PNG charts; then the
# latency section against two daemons (--compare) must print its table. Run by tests/run.sh with cwd = repo
# root; KVPOOL_BIN (set by run.sh) picks the build directory.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${KVPOOL_BIN:-build/bin}
if [ ! -x "$bin/kvpool-bench" ] || [ ! -x "$bin/kvpoold" ]; then
  echo "bench_smoke: $bin/kvpool-bench or $bin/kvpoold is missing (run make first)"
  exit 1
fi
out=$(mktemp /tmp/kvpool-bench-smoke.XXXXXX)
plots=$(mktemp -d /tmp/kvpool-bench-plots.XXXXXX)
trap 'rm -rf "$out" "$plots"' EXIT
start=$(date +%s)
timeout --kill-after=5 55 "$bin/kvpool-bench" --quick --plot "$plots" >"$out" 2>&1
rc=$?
cat "$out"
echo "bench_smoke: exit status $rc after $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then
  echo "bench_smoke: kvpool-bench --quick failed"
  exit 1
fi
num='[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?'
fail=0
expect() {
  if ! grep -Eq "$1" "$out"; then
    echo "bench_smoke: no line matches: $1"
    fail=1
  fi
}
expect "^memcpy reference: $num GB/s"
expect "^get 1MiB batch32 tcp: kvpool $num GB/s, redis $num GB/s, ratio $num"
expect "^get 1MiB batch32 same-machine: kvpool $num GB/s"
expect "^exist 1000 keys tcp: kvpool $num M keys/s, redis $num M keys/s"
expect "^== goals =="
expect "^== verdict: one line a section"
expect "^kv +against Redis on the same machine, kvpool is faster in [0-9]+ of [0-9]+ cases"
expect "^plots: $plots/"
for chart in get-throughput put-throughput get-latency put-latency; do
  # A PNG (its signature) of some size, and the data behind it with a row per value size.
  if [ "$(head -c 8 "$plots/$chart.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" != 89504e470d0a1a0a ] ||
    [ "$(stat -c %s "$plots/$chart.png")" -lt 10000 ] ||
    [ "$(grep -c '^[0-9]' "$plots/$chart.dat")" != 4 ]; then
    echo "bench_smoke: --plot drew no $chart.png (or its data is short)"
    fail=1
  fi
done
expect "^goal (met|not met): disk-tier get throughput of 1 MiB objects >= 80% of dd iflag=direct \\(${num}x"
expect "^goal (met|not met): 4 MiB put throughput at 1.5x overflow >= 80% of an empty pool's, 0 failed puts \\(memory only $num"
expect "^tier +1 MiB gets from the disk tier at ${num}x of dd"
# The latency section, with --compare (the same build twice: two daemons in one loop, every
# value read back and checked).
timeout --kill-after=5 30 "$bin/kvpool-bench" --only latency --quick --compare "$bin/kvpoold" >"$out" 2>&1
rc=$?
cat "$out"
if [ $rc -ne 0 ]; then
  echo "bench_smoke: kvpool-bench --only latency --compare failed"
  fail=1
fi
expect "^kvpoold \\(--compare\\) +put +$num"
expect "^put p50: this build against --compare: ${num}x \\((faster|slower|even)\\)"
expect "^goal (met|not met): 4 KiB get p50 <= 1.1x floor: ${num}x"
expect "^latency +4 KiB over tcp, p50: put ${num}x"
exit $fail
