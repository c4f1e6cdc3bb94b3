#!/usr/bin/env bash
# fuzz.sh - fuzz smoke of every libFuzzer target (tests/fuzz/fuzz.mk: clang, libFuzzer, ASan,
# UBSan): the lookup/reset admin channel's request decoder, kvpoold's settings parser and the
# client request decoder and checks.
# Builds each build/bin/NAME-fuzz, replays its committed seed corpus tests/fuzz/NAME/ (every
# input that ever crashed a target is kept there), then fuzzes it for FUZZ_SMOKE_SECONDS
# (default 30) over a copy of that corpus (the committed one is never written). Fails if a
# build fails or a target finds a crash, a leak, undefined behaviour or a broken promise.
# Run by tests/run.sh with cwd = repo root.
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=$(make --no-print-directory -s -f /dev/stdin <<<'include tests/fuzz/fuzz.mk
print: ; @echo $(FUZZ_TARGETS)' print)
work=$(mktemp -d /tmp/kvpool-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
status=0
for t in $targets; do
  make --no-print-directory "build/bin/$t-fuzz"
  mkdir -p "$work/$t/corpus" "$work/$t/crashes"
  cp "tests/fuzz/$t"/* "$work/$t/corpus/"
  # Every seed must replay cleanly first (a regression in a known input shows up here).
  "build/bin/$t-fuzz" -runs=0 -close_fd_mask=3 "tests/fuzz/$t"
  if ! "build/bin/$t-fuzz" -max_total_time="${FUZZ_SMOKE_SECONDS:-30}" -rss_limit_mb=2048 \
      -timeout=10 -close_fd_mask=3 -print_final_stats=1 \
      -artifact_prefix="$work/$t/crashes/" "$work/$t/corpus" 2>"$work/$t/log"; then
    tail -n 60 "$work/$t/log"
  fi
  grep -E '^stat::number_of_executed_units|^#[0-9]+ *DONE' "$work/$t/log" | sed "s/^/$t: /" || true
  if ls "$work/$t/crashes"/* >/dev/null 2>&1; then
    echo "fuzz: $t: crash inputs (add each to tests/fuzz/$t/ once fixed):"
    for f in "$work/$t/crashes"/*; do echo "  $f: $(xxd -p "$f" | head -c 200)"; done
    status=1
  else
    echo "fuzz: $t: no crash"
  fi
done
exit $status
