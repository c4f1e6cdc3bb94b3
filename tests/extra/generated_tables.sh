#!/usr/bin/env bash
# generated_tables.sh - the tables the documentation holds that kvpoold prints from its own
# tables must equal what it prints: README.md's and docs/settings.md's settings table (`kvpoold --help-markdown`,
# from infra/config_options.c) and docs/metrics.md's metric table (`kvpoold --metrics-markdown`,
# from infra/metrics.c), each between its begin/end markers. On a difference, `make
# readme-settings` / `make docs-metrics` rewrites the file from the binary. Run by
# tests/run.sh with cwd = repo root.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${KVPOOL_BIN:-build/bin}

check() { # file marker option make-target
  local file=$1 marker=$2 option=$3 target=$4
  local begin="<!-- $marker:begin -->" end="<!-- $marker:end -->"
  [ "$(grep -cxF "$begin" "$file")" = 1 ] && [ "$(grep -cxF "$end" "$file")" = 1 ] || {
    echo "generated_tables: $file needs one '$begin' and one '$end' line"
    exit 1
  }
  local held printed
  held=$(awk -v begin="$begin" -v end="$end" '$0 == end { inside = 0 } inside { print } $0 == begin { inside = 1 }' "$file")
  printed=$("$BIN/kvpoold" "$option")
  if [ "$held" != "$printed" ]; then
    echo "generated_tables: $file's $marker differs from kvpoold $option"
    echo "(run 'make $target'); $file -, kvpoold +:"
    diff <(echo "$held") <(echo "$printed") || true
    exit 1
  fi
  echo "generated_tables: $file's $marker matches kvpoold's $(($(wc -l <<<"$printed") - 2)) rows"
}

check README.md settings-table --help-markdown readme-settings
check docs/settings.md settings-table --help-markdown readme-settings
check docs/metrics.md metrics-table --metrics-markdown docs-metrics
