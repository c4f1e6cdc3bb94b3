#!/usr/bin/env bash
# pidns.sh - a second kvpoold in another pid namespace must not take a live daemon's
# segments for leftovers. Starts kvpoold A here, stores a value, then starts kvpoold B under
# `unshare --pid --fork --mount-proc` (where A's pid does not exist, so "is the pid alive?"
# would say no) on other ports; B's start-up cleaner must leave A's /dev/shm objects alone
# (A's are sealed memfds now, which no cleaner can see), while still removing a truly
# stale object nobody holds. A must
# keep serving gets and puts. A third daemon C in a pid namespace of its own has the same pid
# as B there (1): the names of their objects must still differ, so both start and serve.
# Needs root for unshare; skipped (exit 0) without it.
set -u
cd "$(dirname "$0")/../.."
. tests/extra/ready_file.bash
BIN=${KVPOOL_BIN:-build/bin}
KVPOOL="$BIN/kvpool"
TMP=$(mktemp -d /tmp/kvpool-pidns.XXXXXX)
A= B= C= STALE=
# unshare --fork ignores SIGTERM and waits for its child: B is stopped through the child.
stop_ns() {
  local wrapper=$1 sig=$2 child
  child=$(pgrep -P "$wrapper")
  [ -n "$child" ] && kill "-$sig" "$child" 2>/dev/null
  wait "$wrapper" 2>/dev/null
}
cleanup() {
  [ -n "$B" ] && stop_ns "$B" KILL
  [ -n "$C" ] && stop_ns "$C" KILL
  [ -n "$A" ] && kill -KILL "$A" 2>/dev/null && wait "$A" 2>/dev/null
  [ -n "$STALE" ] && rm -f "/dev/shm/$STALE"
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

if [ "$(id -u)" != 0 ] || ! unshare --pid --fork --mount-proc true 2>/dev/null; then
  echo "pidns: skipped (needs root and unshare --pid)"
  exit 0
fi

failures=0
fail() {
  echo "FAIL (line ${BASH_LINENO[0]}): $*" >&2
  failures=$((failures + 1))
}

"$BIN/kvpoold" --endpoint 'tcp://127.0.0.1:*' --admin 'tcp://127.0.0.1:*' \
  --ready-file "$TMP/ready-a" --segment-size 16MiB --segments 2 --metrics-port 0 >"$TMP/a.log" 2>&1 &
A=$!
EP=$(kvpoold_wait_ready "$TMP/ready-a" "$A" "$TMP/a.log") && [ -n "$EP" ] || { echo "A not ready"; exit 1; }
kv() { "$KVPOOL" -s "$EP" "$@"; }
head -c 200000 /dev/urandom >"$TMP/blob"
kv put before "$TMP/blob" || fail "put to A"
# A's segments are sealed memfds (shm/segment.c): nothing of A's is in /dev/shm for B's
# cleaner to take, and they live as long as A holds them.
mapfile -t a_files < <(ls /dev/shm | grep "^kvpool-$A-")
[ "${#a_files[@]}" -eq 0 ] || fail "A left objects in /dev/shm: ${a_files[*]}"
a_memfds=$(ls -l "/proc/$A/fd" | grep -c "memfd:")
[ "$a_memfds" -ge 2 ] || fail "A's segments are not memfds ($a_memfds)"

# A leftover of a process that is gone everywhere: a dead pid, and no lock holder.
sh -c 'exit 0' &
dead=$!
wait "$dead"
STALE="kvpool-$dead-leftover-0"
head -c 4096 /dev/zero >"/dev/shm/$STALE"

unshare --pid --fork --mount-proc "$BIN/kvpoold" --endpoint 'tcp://127.0.0.1:*' \
  --admin 'tcp://127.0.0.1:*' --ready-file "$TMP/ready-b" --segment-size 16MiB --metrics-port 0 \
  >"$TMP/b.log" 2>&1 &
B=$!
EPB=$(kvpoold_wait_ready "$TMP/ready-b" "$B" "$TMP/b.log") && [ -n "$EPB" ] || { echo "B not ready"; exit 1; }

for f in "${a_files[@]}"; do
  [ -e "/dev/shm/$f" ] || fail "B unlinked A's live object $f"
done
[ ! -e "/dev/shm/$STALE" ] || fail "B left the stale object $STALE"
grep -q "removed [0-9]* shared-memory" "$TMP/b.log" || fail "B did not report the removal"

# A still serves: the old value by both paths, a new put, and its stats.
kv get before | cmp -s "$TMP/blob" - || fail "get from A after B started"
"$KVPOOL" -s "$EP" --no-fast-path get before | cmp -s "$TMP/blob" - || fail "get --no-fast-path"
printf 'after' | kv put after || fail "put to A after B started"
[ "$(kv get after)" = after ] || fail "get of the new key"
printf 'b' | "$KVPOOL" -s "$EPB" put onb || fail "put to B"

# C: pid 1 in its namespace, as B is in its own.
unshare --pid --fork --mount-proc "$BIN/kvpoold" --endpoint 'tcp://127.0.0.1:*' \
  --admin 'tcp://127.0.0.1:*' --ready-file "$TMP/ready-c" --segment-size 16MiB --metrics-port 0 \
  >"$TMP/c.log" 2>&1 &
C=$!
EPC=$(kvpoold_wait_ready "$TMP/ready-c" "$C" "$TMP/c.log") && [ -n "$EPC" ] || fail "C did not start beside B"
if [ -n "${EPC:-}" ]; then
  printf 'c' | "$KVPOOL" -s "$EPC" put onc || fail "put to C"
  [ "$("$KVPOOL" -s "$EPB" get onb)" = b ] || fail "B's value after C started"
  [ "$("$KVPOOL" -s "$EPC" get onc)" = c ] || fail "C's value"
fi
stop_ns "$C" TERM
C=

stop_ns "$B" TERM
B=
kill -TERM "$A"
wait "$A" 2>/dev/null
A=
for f in "${a_files[@]}"; do
  [ ! -e "/dev/shm/$f" ] || fail "A left $f after a clean stop"
done

if [ $failures -gt 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "pidns: OK"
