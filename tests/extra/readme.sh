#!/usr/bin/env bash
# readme.sh - the README's code blocks, run as a reader would run them, so that the README
# cannot drift from what works:
#   - the CLI block, every line but its first, against a kvpoold started as `make run` starts
#     it (its defaults: tcp://127.0.0.1:50051, one 1 GiB segment), each line's exit status as
#     the block's comments say (exists: 1, one key missing); `top` on a terminal, quit with q;
#   - the C block, inside a main() that declares what it names, built against the build tree
#     (-Iinclude -Ibuild/gen -Lbuild/lib, as the README says) and run against that node;
#   - the Python block, with Debian's python3;
#   - the CURVE block as written (10.0.0.2 is given to the namespace's loopback);
#   - the settings-file block: kvpoold takes it (--print-config).
# The cluster and install blocks are not run: they name several machines and sudo.
# Everything runs in a network namespace of its own (unshare -n), where the README's fixed
# port and ipc name cannot clash with another test. Needs root for unshare.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${KVPOOL_README_NETNS:-}" != 1 ]; then
  if ! unshare -n true 2>/dev/null; then
    echo "readme: skipped (unshare -n needs root)"
    exit 0
  fi
  exec unshare -n env KVPOOL_README_NETNS=1 bash "$0" "$@"
fi
ip link set lo up
ip addr add 10.0.0.2/32 dev lo
tmp=$(mktemp -d /tmp/kvpool-readme.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "readme: $*"; exit 1; }

# block LANG TEXT: the body of the README's fenced block of that language holding TEXT.
block() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import re, sys
lang, needle = sys.argv[1], sys.argv[2]
text = open("README.md").read()
for info, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
    if info == lang and needle in body:
        sys.stdout.write(body)
        sys.exit(0)
sys.exit("no %s block holding %r" % (lang, needle))
PY
}

wait_ping() {
  for _ in $(seq 100); do
    build/bin/kvpool -t 200 -s "$1" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

# ---- the CLI block, against make run's kvpoold --------------------------------------------
run_line=$(awk '/^run: / {f = 1; next} f && /[$][(]BIN[)][/]kvpoold/ {
  sub(/.*[$][(]BIN[)][/]kvpoold */, ""); print; exit }' Makefile)
[ -n "$run_line" ] || fail "cannot read make run's kvpoold options from the Makefile"
# shellcheck disable=SC2086
build/bin/kvpoold $run_line >"$tmp/kvpoold.log" 2>&1 &
pids+=($!)
wait_ping tcp://127.0.0.1:50051 || { cat "$tmp/kvpoold.log"; fail "make run's kvpoold"; }
block sh 'build/bin/kvpool put greeting' | tail -n +2 >"$tmp/cli.sh"
[ "$(wc -l <"$tmp/cli.sh")" -ge 8 ] || fail "the CLI block is shorter than expected"
n=0
while IFS= read -r line; do
  n=$((n + 1))
  command=${line%%#*}
  case "$command" in
  *" top"*)
    # A live view on a terminal: q quits.
    /usr/bin/python3 - "$command" <<'PY' || fail "line $n: $line"
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp("bash", ["bash", "-c", sys.argv[1]])
deadline, seen = time.time() + 10, b""
while time.time() < deadline and b"get" not in seen.lower():
    if select.select([fd], [], [], 0.2)[0]:
        seen += os.read(fd, 4096)
os.write(fd, b"q")
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done or time.time() > deadline + 5:
        break
    time.sleep(0.05)
sys.exit(0 if done and os.waitstatus_to_exitcode(status) == 0 else 1)
PY
    ;;
  *" exists "*)
    set +e
    bash -c "$command" >"$tmp/out" 2>&1
    rc=$?
    set -e
    [ $rc = 1 ] && grep -qx 'greeting: yes' "$tmp/out" && grep -qx 'other: no' "$tmp/out" ||
      fail "line $n: $line: status $rc, $(cat "$tmp/out")"
    ;;
  *)
    bash -c "$command" >"$tmp/out" 2>&1 || fail "line $n: $line: $(cat "$tmp/out")"
    ;;
  esac
  case "$command" in
  *"kvpool get greeting"*) grep -qx hello "$tmp/out" || fail "get greeting: $(cat "$tmp/out")" ;;
  *"--regex"*) grep -qx 1 "$tmp/out" || fail "rm --regex: $(cat "$tmp/out")" ;;
  *" ping"*) grep -q . "$tmp/out" || fail "ping printed nothing" ;;
  esac
done <"$tmp/cli.sh"
[ "$(build/bin/kvpool get greeting)" = again ] || fail "the upsert did not replace greeting"

# ---- the C block ----------------------------------------------------------------------------
{
  echo '#include <stdio.h>'
  echo '#include <string.h>'
  block c 'kvpool_connect' | sed -n '1p'
  echo 'int main (void) {'
  echo '    char data[] = "value of block 42", buffer[64];'
  echo '    size_t size = sizeof data, capacity = sizeof buffer;'
  echo '    char names[32][16], blocks[32][64];'
  echo '    const char *keys[32]; void *buffers[32]; size_t capacities[32];'
  echo '    for (int i = 0; i < 32; i++) {'
  echo '        snprintf (names[i], sizeof names[i], "block/%d", i);'
  echo '        keys[i] = names[i]; buffers[i] = blocks[i]; capacities[i] = sizeof blocks[i];'
  echo '    }'
  block c 'kvpool_connect' | sed '1d' | sed 's/kvpool_destroy (&pool);/if (rc != 0 || got != (int64_t) size || memcmp (buffer, data, size) || results[0] != -704 || results[1] != -704) return 1;\n    kvpool_destroy (\&pool);/'
  echo '    return 0;'
  echo '}'
} >"$tmp/readme.c"
grep -q 'kvpool_get_batch_into' "$tmp/readme.c" || fail "the C block"
cc -o "$tmp/readme" "$tmp/readme.c" -Iinclude -Ibuild/gen -Lbuild/lib -lkvpool ||
  fail "the C block does not build with the README's flags"
LD_LIBRARY_PATH=build/lib "$tmp/readme" || fail "the C block's calls"

# ---- the Python block -----------------------------------------------------------------------
block python 'import kvpool' >"$tmp/readme.py"
PYTHONPATH=python /usr/bin/python3 "$tmp/readme.py" || fail "the Python block"

# ---- the CURVE block, as written (after make run's node is gone: the same admin port) ----------
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
wait
pids=()
mkdir "$tmp/curve"
block sh 'kvpool keygen node' >"$tmp/curve.sh"
(
  cd "$tmp/curve"
  repo=$OLDPWD
  sed "s|build/bin/|$repo/build/bin/|g; s|&\$|\\& echo \$! >kvpoold.pid|" "$tmp/curve.sh" >run.sh
  # The daemon's line ends with &: the client's line waits for it to answer.
  awk '/kvpoold/ {print; print "for i in $(seq 50); do [ -e node ] && '"$repo"'/build/bin/kvpool -t 200 --curve-secret app_secret --curve-server node -s tcp://10.0.0.2:50051 ping >/dev/null 2>&1 && break; sleep 0.1; done"; next} {print}' run.sh >run2.sh
  bash -e run2.sh >out 2>&1 || { cat out; exit 1; }
  grep -q '^objects' out || { cat out; exit 1; }
  kill "$(cat kvpoold.pid)" 2>/dev/null || true
) || fail "the CURVE block"

# ---- the settings-file block (its certificate paths pointed at the CURVE block's files) ------
block '' 'segment-size = 8GiB' |
  sed "s|/etc/kvpool/node_secret|$tmp/curve/node_secret|; s|/etc/kvpool/allow|$tmp/curve/allow|" \
    >"$tmp/kvpoold.conf"
build/bin/kvpoold --config "$tmp/kvpoold.conf" --print-config >"$tmp/out" 2>&1 ||
  fail "kvpoold does not take the README's settings file: $(cat "$tmp/out")"
grep -qx 'segments = "4"' "$tmp/out" || fail "the settings file's segments: $(cat "$tmp/out")"

echo "readme: the CLI block against make run's kvpoold, the C, Python, CURVE and settings blocks"
