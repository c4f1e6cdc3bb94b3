#!/usr/bin/env bash
# lookup_fuzz.sh - fuzz smoke of the lookup/reset admin channel's request decoder.
# Builds build/bin/lookup-fuzz (lookup_server/fuzz.mk: clang, libFuzzer, ASan, UBSan) and runs
# it for about 20 s over a copy of the committed seed corpus lookup_server/fuzz-corpus/ (the
# committed corpus is never written). Fails if the build fails or the fuzzer finds a crash,
# a leak, undefined behaviour or a broken promise. Run by tests/run.sh with cwd = repo root.
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory build/bin/lookup-fuzz
work=$(mktemp -d /tmp/kvpool-lookup-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/crashes"
cp lookup_server/fuzz-corpus/* "$work/corpus/"
# Every seed must replay cleanly first (a regression in a known input shows up here).
build/bin/lookup-fuzz -runs=0 lookup_server/fuzz-corpus
build/bin/lookup-fuzz -max_total_time=${LOOKUP_FUZZ_SECONDS:-20} -rss_limit_mb=2048 \
  -timeout=10 -print_final_stats=1 -artifact_prefix="$work/crashes/" "$work/corpus"
if ls "$work/crashes"/* >/dev/null 2>&1; then
  echo "lookup_fuzz: crash inputs:"; ls -l "$work/crashes"
  exit 1
fi
echo "lookup_fuzz: no crash"
