#!/usr/bin/env bash
# install.sh - `make install` into a staging directory: the programs, the library and its
# headers, kvpool.pc (a C program builds with pkg-config's flags alone), the man pages
# (help2man, from --help, with SYNOPSIS, FILES, EXAMPLES and SEE ALSO from man/), the systemd unit pointing at the installed
# kvpoold and /etc/kvpool/kvpoold.conf, a settings file kvpoold takes as it is; a second
# install keeps a settings file the administrator edited; the Python package and its C helper
# module import from where they are installed. Run by tests/run.sh (cwd = repo
# root) on the plain build.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d /tmp/kvpool-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install: $*"; exit 1; }

make --no-print-directory -s install DESTDIR="$tmp" PREFIX=/usr >"$tmp.log" 2>&1 ||
  { cat "$tmp.log"; fail "make install failed"; }
rm -f "$tmp.log"
for f in usr/bin/kvpoold usr/bin/kvpool usr/lib/libkvpool.so.1 usr/include/kvpool.h \
  usr/share/man/man8/kvpoold.8 usr/share/man/man1/kvpool.1 usr/share/man/man1/kvpool-bench.1 \
  usr/lib/pkgconfig/kvpool.pc \
  usr/lib/systemd/system/kvpoold.service etc/kvpool/kvpoold.conf; do
  [ -e "$tmp/$f" ] || fail "no $f"
done
unit="$tmp/usr/lib/systemd/system/kvpoold.service"
grep -qx 'ExecStart=/usr/bin/kvpoold --config /etc/kvpool/kvpoold.conf' "$unit" || fail "ExecStart"
grep -qx 'KillSignal=SIGTERM' "$unit" && grep -qx 'User=kvpool' "$unit" &&
  grep -qx 'WantedBy=multi-user.target' "$unit" || fail "unit settings"
# The shipped settings file is one the installed kvpoold takes.
conf="$tmp/etc/kvpool/kvpoold.conf"
"$tmp/usr/bin/kvpoold" --config "$conf" --print-config | grep -qx 'segment-size = "4294967296"' ||
  fail "kvpoold does not take the shipped kvpoold.conf"
# The man pages are made from --help: every option is in them.
for option in metrics-port log-level segment-size config print-config; do
  grep -qF -- "\\-\\-${option//-/\\-}" "$tmp/usr/share/man/man8/kvpoold.8" ||
    fail "kvpoold.8 lacks --$option"
done
grep -q 'top' "$tmp/usr/share/man/man1/kvpool.1" || fail "kvpool.1 lacks top"
# ...with the sections a man page has beside the options, and nothing of --help's usage line
# left in the description.
for page in man8/kvpoold.8 man1/kvpool.1 man1/kvpool-bench.1; do
  for section in NAME SYNOPSIS DESCRIPTION FILES EXAMPLES '"SEE ALSO"'; do
    grep -qx ".SH $section" "$tmp/usr/share/man/$page" || fail "$page lacks $section"
  done
  sed -n '/^\.SH DESCRIPTION/,/^\.SH/p' "$tmp/usr/share/man/$page" | grep -qi 'usage:' &&
    fail "$page: a usage line in DESCRIPTION"
done
# A C program builds against the installed library with pkg-config's flags alone.
cat >"$tmp/hello.c" <<'C'
#include <stdio.h>
#include <kvpool.h>
int main (void) { printf ("%s\n", kvpool_status_name (KVPOOL_OBJECT_NOT_FOUND)); return 0; }
C
pc="$tmp/usr/lib/pkgconfig/kvpool.pc"
grep -qx "prefix=/usr" "$pc" || fail "kvpool.pc's prefix"
# The staged tree stands for /usr: pkg-config's sysroot maps the .pc's paths into it.
flags=$(PKG_CONFIG_PATH="$tmp/usr/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$tmp" \
  pkg-config --cflags --libs kvpool) || fail "pkg-config kvpool"
cc -o "$tmp/hello" "$tmp/hello.c" $flags || fail "cc \$(pkg-config --cflags --libs kvpool)"
[ "$(LD_LIBRARY_PATH="$tmp/usr/lib" "$tmp/hello")" = OBJECT_NOT_FOUND ] ||
  fail "the program built with kvpool.pc"
# The Python package imports from where it is installed, with its C helper module beside it.
pydir="$tmp/usr/lib/python3/dist-packages"
PYTHONPATH="$pydir" /usr/bin/python3 -c '
import sys, kvpool
from kvpool import _native
module = _native.batch_module
assert module is not None, "kvpool._batch did not load"
assert module.__file__.startswith(sys.argv[1]), module.__file__
assert _native.path.startswith(sys.argv[2]), _native.path
' "$pydir/kvpool/" "$tmp/usr/lib/" || fail "the installed python package or its kvpool._batch"
# An edited settings file survives the next install.
echo 'segments = 2' >>"$conf"
make --no-print-directory -s install DESTDIR="$tmp" PREFIX=/usr >/dev/null 2>&1
grep -qx 'segments = 2' "$conf" || fail "the second install overwrote kvpoold.conf"
echo "install: programs, library, man pages, unit and settings file in place"
