#!/usr/bin/env bash
# exports.sh - libkvpool.so exports the public API (kvpool_*) and nothing else: no internal
# module name can clash with an application's symbols. Also checks that every function
# include/kvpool.h declares is exported. Run by tests/run.sh with cwd = repo root.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib=${KVPOOL_BIN:-build/bin}/../lib/libkvpool.so
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort -u)
others=$(grep -v '^kvpool_' <<<"$exported" || true)
if [ -n "$others" ]; then
  echo "exports: libkvpool.so exports names outside the API:"; echo "$others"
  exit 1
fi
declared=$(grep -oE '\bkvpool_[a-z_]+ \(' include/kvpool.h | sed 's/ ($//' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$missing" ]; then
  echo "exports: declared in include/kvpool.h but not exported:"; echo "$missing"
  exit 1
fi
echo "exports: $(wc -l <<<"$exported") symbols, all kvpool_*, every declared function among them"
