#!/usr/bin/env bash
# Runs every test of kvpool, each in its own process with a time limit, and prints one line
# per test and a closing "N passed, N failed". Called by `make test` with BIN set.
#   unit         each module's self test (kvpool-selftest --test NAME)
#   integration  each build/bin/test_* program: starts the real kvpoold on loopback
#   python       pytest over tests/python and python/tests with Debian's /usr/bin/python3
#                (under SANITIZE against the sanitized kvpoold, when the plain library exists)
#   extra        each tests/extra/*.sh script (fuzz smoke and the like)
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
export KVPOOL_BIN=$(cd "$BIN" && pwd)
LOGDIR=$(mktemp -d /tmp/kvpool-test.XXXXXX)
case "${SANITIZE:-}" in
  *thread*) export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp ${TSAN_OPTIONS:-}" ;;
  *address*) export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp print_suppressions=0 ${LSAN_OPTIONS:-}" ;;
esac
pass=0
fail=0
failed=()

run_one() {
  local name=$1 limit=$2
  shift 2
  local log="$LOGDIR/${name//\//_}.log"
  local start=$(date +%s%N)
  if timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1; then
    pass=$((pass + 1))
    local ms=$(( ($(date +%s%N) - start) / 1000000 ))
    printf 'PASS %-45s %4d.%02ds\n' "$name" $((ms / 1000)) $((ms % 1000 / 10))
  else
    local rc=$?
    fail=$((fail + 1))
    failed+=("$name")
    printf 'FAIL %-45s (exit %d)\n' "$name" "$rc"
    # What failed first (pytest's assertion lines and summary, a C test's failed check),
    # then the log's tail: a test that prints its daemons' logs on failure ends with them.
    grep -E '^(E  |FAILED |ERROR |FAIL:|.*Assertion .* failed)' "$log" | head -n 40 | cut -c1-400 | sed 's/^/     ! /'
    tail -n 150 "$log" | sed 's/^/     | /'
  fi
}

for t in $("$BIN/kvpool-selftest" --list); do
  run_one "unit/$t" 120 "$BIN/kvpool-selftest" --test "$t"
done

for t in "$BIN"/test_*; do
  [ -x "$t" ] || continue
  run_one "integration/$(basename "$t")" 300 "$t"
done

# Under sanitizers the fuzz and benchmark smoke runs are skipped (they have their own
# builds). The Python tests still run, against the sanitized kvpoold (KVPOOL_BIN): the
# client side loads the plain build/lib/libkvpool.so, so they need `make test` first.
SANITIZED=${SANITIZE:-}
for t in tests/extra/*.sh; do
  [ -f "$t" ] || continue
  [ -n "$SANITIZED" ] && continue
  run_one "extra/$(basename "$t" .sh)" 300 bash "$t"
done

if [ -z "$SANITIZED" ] || [ -f build/lib/libkvpool.so ]; then
  for f in tests/python/test_*.py python/tests/test_*.py; do
    [ -f "$f" ] || continue
    run_one "python/$(basename "$f" .py)" 600 env PYTHONPATH="$PWD/python" \
      /usr/bin/python3 -m pytest -q -p no:cacheprovider "$f"
  done
fi

echo
if [ $fail -gt 0 ]; then
  echo "failed: ${failed[*]}"
  echo "logs: $LOGDIR"
else
  rm -rf "$LOGDIR"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
