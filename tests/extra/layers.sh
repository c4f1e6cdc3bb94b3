#!/usr/bin/env bash
# Folders are layers (docs/architecture.md): a C file includes headers of its own folder and
# of folders on a lower floor, never of a folder on its own floor or above. So no folder
# reaches up, no two folders include each other, and bench/ includes nothing of tests/.
# A folder with C files that is not on a floor here fails the check too: a new folder is
# placed on purpose. And no C file outside tests/ and bench/ grows past 1,500 lines. Prints each include that breaks the rule, and exits 1 if there is one.
set -u
cd "$(dirname "$0")/../.."

declare -A floor=(
  [include]=0 [protocol]=0
  [shm]=1 [transfer]=1 [alloc]=1 [tier]=1 [rdma]=1
  [messages]=2 [client]=2
  [infra]=3
  [dataplane]=4 [lookup_server]=4
  [actors]=5 [master]=5
  [tools]=6 [tests]=6 [bench]=6 [python]=6
)

bad=0
files=$(git ls-files '*.c' '*.h' 2>/dev/null || find . -name '*.[ch]' -not -path './build/*' | sed 's|^\./||')
for f in $files; do
  from=${f%%/*}
  if [ "$from" = "$f" ]; then
    continue    # a file at the top has no floor (there is none today)
  fi
  if [ -z "${floor[$from]+x}" ]; then
    echo "$f: folder $from/ is on no floor of tests/extra/layers.sh"
    bad=1
    continue
  fi
  while IFS=: read -r line inc; do
    to=${inc%%/*}
    [ "$to" = "$inc" ] && continue          # no folder: a generated or system header
    [ "$to" = "$from" ] && continue
    [ -z "${floor[$to]+x}" ] && continue     # not one of ours (e.g. "gen/...")
    if [ "${floor[$to]}" -ge "${floor[$from]}" ]; then
      echo "$f:$line: includes $inc ($to/ is floor ${floor[$to]}, $from/ is floor ${floor[$from]})"
      bad=1
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*"' "$f" \
           | sed 's/^\([0-9]*\):.*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1:\2/')
done

# A C file of over 1,500 lines outside tests/ and bench/ is a room to split.
for f in $files; do
  case "$f" in tests/* | bench/* | *.h) continue ;; esac
  n=$(wc -l < "$f")
  if [ "$n" -gt 1500 ]; then
    echo "$f: $n lines (the limit is 1,500 outside tests/ and bench/)"
    bad=1
  fi
done

# ../shared/STYLE.md points at kvpool's files by path; one that is gone is reported (not a
# failure: that file is not ours to change), so the pointer can be corrected there.
style=../shared/STYLE.md
if [ -f "$style" ]; then
  for p in $(grep -o '`[a-z_]*/[a-z_./]*`' "$style" | tr -d '`' | sort -u); do
    [ -e "$p" ] || echo "note: $style names $p, which is not in the tree"
  done
fi

if [ $bad -ne 0 ]; then
  echo "layers: broken (see docs/architecture.md, \"Folders are layers\")"
  exit 1
fi
echo "layers: every include goes down a floor; no C file over 1,500 lines"
