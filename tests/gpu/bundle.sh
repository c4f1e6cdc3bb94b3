#!/usr/bin/env bash
# Gathers what kvpool-gpu-check needs on a machine without kvpool's build dependencies (no
# libzmq, say): the check, kvpoold, libkvpool.so and every shared library they load that the C
# library does not provide, in one folder. There:
#   LD_LIBRARY_PATH=$PWD ./kvpool-gpu-check --kvpoold $PWD/kvpoold
# Usage: bundle.sh BIN LIB OUT  (make gpu-bundle passes the build's folders)
set -euo pipefail
bin=$1 lib=$2 out=$3
rm -rf "$out"
mkdir -p "$out"
cp "$bin/kvpool-gpu-check" "$bin/kvpoold" "$out/"
cp "$lib/libkvpool.so" "$out/libkvpool.so.1"
# The Python package, its generated modules included, for torch_check.py (--python).
mkdir -p "$out/python"
cp -r "$(dirname "$0")/../../python/kvpool" "$out/python/"
rm -rf "$out/python/kvpool/__pycache__"
# The C library, its loader and the compiler's runtime are on every Linux machine (newer there
# is fine: they keep old symbols); everything else comes along.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libgcc_s|libstdc\+\+)\.so'
for program in "$out/kvpool-gpu-check" "$out/kvpoold" "$out/libkvpool.so.1"; do
  LD_LIBRARY_PATH="$out" ldd "$program" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  [ -e "$out/$name" ] || cp -L "$path" "$out/$name"
done
ls "$out"
