#!/usr/bin/env bash
# readme_settings.sh - README.md's settings table is the one kvpoold prints from its settings
# table (actors/config.c, `kvpoold --help-markdown`): the lines between the settings-table
# markers must equal that output. On a difference, `make readme-settings` rewrites the README
# from the binary. Run by tests/run.sh with cwd = repo root.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${KVPOOL_BIN:-build/bin}
begin='<!-- settings-table:begin -->'
end='<!-- settings-table:end -->'
[ "$(grep -cxF "$begin" README.md)" = 1 ] && [ "$(grep -cxF "$end" README.md)" = 1 ] || {
  echo "readme_settings: README.md needs one '$begin' and one '$end' line"
  exit 1
}
readme=$(awk -v begin="$begin" -v end="$end" '$0 == end { inside = 0 } inside { print } $0 == begin { inside = 1 }' README.md)
printed=$("$BIN/kvpoold" --help-markdown)
if [ "$readme" != "$printed" ]; then
  echo "readme_settings: README.md's settings table differs from kvpoold --help-markdown"
  echo "(run 'make readme-settings'); README.md -, kvpoold +:"
  diff <(echo "$readme") <(echo "$printed") || true
  exit 1
fi
echo "readme_settings: README.md's table matches kvpoold's $(($(wc -l <<<"$printed") - 2)) settings"
