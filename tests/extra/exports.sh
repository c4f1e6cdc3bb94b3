#!/usr/bin/env bash
# exports.sh - libkvpool.so exports the public API and nothing else: every function that
# include/kvpool.h declares, and no other name (internal modules, the generated protobuf code's
# kvpool__v1__* names), so nothing inside the library can clash with an application's symbols.
# Lists the library's dynamic symbols with `nm -D --defined-only`. Run by tests/run.sh with
# cwd = repo root.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib=${KVPOOL_BIN:-build/bin}/../lib/libkvpool.so
# Every defined dynamic symbol, whatever its type, but version definitions (type A); a
# version suffix (name@@VER) is cut.
exported=$(nm -D --defined-only "$lib" | awk '$2 != "A" {sub(/@.*/, "", $3); print $3}' | sort -u)
if [ -z "$exported" ]; then
  echo "exports: $lib exports nothing"
  exit 1
fi
others=$(grep -vE '^kvpool_[a-z]' <<<"$exported" || true)
if [ -n "$others" ]; then
  echo "exports: libkvpool.so exports names outside the API:"; echo "$others"
  exit 1
fi
declared=$(grep -oE '\bkvpool_[a-z_]+ \(' include/kvpool.h | sed 's/ ($//' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$missing" ]; then
  echo "exports: declared in include/kvpool.h but not exported (KVPOOL_EXPORT?):"; echo "$missing"
  exit 1
fi
undeclared=$(comm -13 <(echo "$declared") <(echo "$exported"))
if [ -n "$undeclared" ]; then
  echo "exports: exported but not declared in include/kvpool.h:"; echo "$undeclared"
  exit 1
fi
echo "exports: $(wc -l <<<"$exported") symbols, exactly the functions include/kvpool.h declares"
