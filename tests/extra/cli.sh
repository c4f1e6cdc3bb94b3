#!/usr/bin/env bash
# cli.sh - drives the kvpool command-line tool against a kvpoold it starts on a loopback port:
# put from stdin and from a file, get to stdout and to a file (byte-equal), exists exit codes,
# size, rm (keys, --regex with its count, --all), stats, segments, ping, and the errors (an
# input over the node's value limit among them): each
# must exit non-zero with one "kvpool: ..." line on stderr. The daemon is killed on any exit.
set -u
cd "$(dirname "$0")/../.."
. tests/extra/ready_file.bash
BIN=${KVPOOL_BIN:-build/bin}
KVPOOL="$BIN/kvpool"
TMP=$(mktemp -d /tmp/kvpool-cli.XXXXXX)
DAEMON=
cleanup() {
  [ -n "$DAEMON" ] && kill -KILL "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

failures=0
fail() {
  echo "FAIL (line ${BASH_LINENO[0]}): $*" >&2
  failures=$((failures + 1))
}

# ---- start the daemon -------------------------------------------------------------------
"$BIN/kvpoold" --endpoint 'tcp://127.0.0.1:*' --admin 'tcp://127.0.0.1:*' \
  --ready-file "$TMP/ready" --segment-size 64MiB --segments 2 --metrics-port 0 >"$TMP/daemon.log" 2>&1 &
DAEMON=$!
EP=$(kvpoold_wait_ready "$TMP/ready" "$DAEMON" "$TMP/daemon.log") || { echo "kvpoold not ready"; exit 1; }
kv() { "$KVPOOL" -s "$EP" "$@"; }

# Runs a command that must fail: non-zero exit, exactly one stderr line starting "kvpool: ".
expect_error() {
  local pattern=$1
  shift
  if "$@" >"$TMP/out" 2>"$TMP/err"; then
    fail "succeeded: $*"
    return
  fi
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "not one line on stderr for: $* ($(cat "$TMP/err"))"
  grep -q "^kvpool: .*$pattern" "$TMP/err" || fail "stderr of '$*' lacks '$pattern': $(cat "$TMP/err")"
}

# ---- help and usage --------------------------------------------------------------------
"$KVPOOL" --help | grep -q '^Usage: kvpool' || fail "--help"
"$KVPOOL" -s "$EP" frobnicate >/dev/null 2>&1
[ $? -eq 2 ] || fail "unknown command must exit 2"
"$KVPOOL" -s "$EP" put >/dev/null 2>&1
[ $? -eq 2 ] || fail "put without KEY must exit 2"

# ---- ping, put, get ----------------------------------------------------------------------
kv ping | grep -q "^pong from $EP: [0-9.]* ms" || fail "ping"
# An address written host:port means tcp://host:port.
"$KVPOOL" -s "${EP#tcp://}" ping | grep -q "^pong from ${EP#tcp://}: [0-9.]* ms" || fail "ping host:port"

printf 'hello from stdin' | kv put greeting || fail "put from stdin"
[ "$(kv get greeting)" = "hello from stdin" ] || fail "get to stdout"
# A put typed at a terminal says it reads standard input, then takes what is typed until
# Ctrl-D (a pseudo-terminal stands in for the terminal).
/usr/bin/python3 - "$KVPOOL" "$EP" >"$TMP/tty.out" 2>&1 <<'PY' || fail "put at a terminal: $(cat "$TMP/tty.out")"
import os, pty, select, subprocess, sys, time
master, slave = pty.openpty()
p = subprocess.Popen([sys.argv[1], "-s", sys.argv[2], "put", "typed"], stdin=slave,
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
os.close(slave)
if not select.select([p.stderr], [], [], 5)[0]:
    p.kill()
    sys.exit("put at a terminal said nothing for 5 s")
line = p.stderr.readline().decode()
assert "reading the value from standard input" in line, line
os.write(master, b"typed value")
time.sleep(0.2)
os.write(master, b"\x04\x04")  # Ctrl-D sends the line, a second one ends the input
assert p.wait(10) == 0, p.stderr.read()
PY
[ "$(kv get typed)" = "typed value" ] || fail "the value typed at a terminal"

head -c 3000000 /dev/urandom >"$TMP/blob"
kv put blob "$TMP/blob" || fail "put from file"
kv get blob >"$TMP/blob.stdout" || fail "get blob to stdout"
cmp -s "$TMP/blob" "$TMP/blob.stdout" || fail "blob via stdout differs"
kv get blob "$TMP/blob.file" || fail "get blob to file"
cmp -s "$TMP/blob" "$TMP/blob.file" || fail "blob via file differs"
# The same through the socket only.
"$KVPOOL" -s "$EP" --no-fast-path get blob | cmp -s "$TMP/blob" - || fail "get --no-fast-path"
head -c 100000 /dev/urandom >"$TMP/blob2"
"$KVPOOL" -s "$EP" --no-fast-path put blob2 <"$TMP/blob2" || fail "put --no-fast-path"
kv get blob2 | cmp -s "$TMP/blob2" - || fail "blob2 differs"

# Binary data with NULs, an empty value, put options.
printf 'a\0b\0c' | kv put binary || fail "put binary"
kv get binary | cmp -s <(printf 'a\0b\0c') - || fail "binary value differs"
kv put --replicas 2 --soft-pin twice <"$TMP/blob2" || fail "put --replicas 2 --soft-pin"
kv get twice | cmp -s "$TMP/blob2" - || fail "replicated value differs"
kv put --hard-pin pinned </dev/null || true  # an empty value: the node decides
printf x | kv put pinned2 --hard-pin || fail "put with the option after KEY"

# ---- exists, size --------------------------------------------------------------------------
out=$(kv exists greeting blob)
[ $? -eq 0 ] || fail "exists of present keys must exit 0"
[ "$out" = $'greeting: yes\nblob: yes' ] || fail "exists output: $out"
out=$(kv exists greeting nope)
[ $? -eq 1 ] || fail "exists with a missing key must exit 1"
[ "$out" = $'greeting: yes\nnope: no' ] || fail "exists output: $out"
[ "$(kv size blob greeting)" = $'blob: 3000000\ngreeting: 16' ] || fail "size"

# ---- errors ------------------------------------------------------------------------------
expect_error "get nope: object not found (OBJECT_NOT_FOUND)" kv get nope
[ ! -e "$TMP/nope.out" ] || fail "setup"
expect_error "get nope: object not found" kv get nope "$TMP/nope.out"
[ ! -e "$TMP/nope.out" ] || fail "a failed get must not create its file"
printf 'other' >"$TMP/other"
expect_error "put greeting: object already exists (OBJECT_ALREADY_EXISTS)" kv put greeting "$TMP/other"
[ "$(kv get greeting)" = "hello from stdin" ] || fail "the first value must be kept"
# --upsert replaces it (and makes a key that is new).
kv put --upsert greeting "$TMP/other" || fail "put --upsert of an existing key"
[ "$(kv get greeting)" = "other" ] || fail "put --upsert must replace the value"
printf 'fresh' | kv put --upsert upserted || fail "put --upsert of a new key"
[ "$(kv get upserted)" = "fresh" ] || fail "put --upsert of a new key must store it"
expect_error "size nope: object not found" kv size nope
expect_error "rm nope: object not found" kv rm nope
expect_error "put : invalid key" kv put "" "$TMP/blob2"
expect_error "cannot read" kv put k "$TMP/does-not-exist"
# An endless or oversized input is refused at the node's limit (64 MiB here), not read
# until the client runs out of memory.
expect_error "put zero: /dev/zero is larger than the node's largest value (67108864 bytes)" \
  kv put zero /dev/zero
expect_error "put zero: stdin is larger than the node's largest value" kv put zero </dev/zero
truncate -s $((64 * 1024 * 1024 + 1)) "$TMP/over"
expect_error "is larger than the node's largest value" kv put over "$TMP/over"
kv exists zero over >/dev/null
[ $? -eq 1 ] || fail "refused puts must store nothing"
head -c 5000000 /dev/zero | kv put zeros || fail "a large value from stdin, under the limit"
[ "$(kv size zeros)" = "zeros: 5000000" ] || fail "size of zeros"
kv rm --force zeros || fail "rm zeros"
# Nothing listening is said at once (within the 500 ms refusal window, not the 5 s timeout).
started=$(date +%s%N)
expect_error "cannot connect to 127.0.0.1:1: connection refused: nothing listens on \
tcp://127.0.0.1:1 (Connection refused)$" "$KVPOOL" -s 127.0.0.1:1 ping
spent_ms=$((($(date +%s%N) - started) / 1000000))
[ "$spent_ms" -lt 1500 ] || fail "a refused connect took $spent_ms ms"
expect_error "nothing listens on ipc://$TMP/no-socket (No such file or directory)$" \
  "$KVPOOL" -s "ipc://$TMP/no-socket" ping
expect_error "invalid parameters (INVALID_PARAMS): " kv rm --regex '([unclosed'

# ---- rm -------------------------------------------------------------------------------------
# greeting was read above: a plain rm is refused, saying how long the lease lasts and what
# --force does.
expect_error "lease ends in [0-9]* ms; a remove with force (kvpool rm --force) takes it now" \
  "$KVPOOL" -s "$EP" rm greeting
kv rm --force greeting || fail "rm --force"
kv exists greeting >/dev/null
[ $? -eq 1 ] || fail "removed key still exists"
for k in job-1 job-2 job-3 keep-1; do printf '%s' "$k" | kv put "$k" || fail "put $k"; done
[ "$(kv rm --force --regex '^job-[0-9]+$')" = 3 ] || fail "rm --regex must print 3"
[ "$(kv rm --force --regex '^job-')" = 0 ] || fail "second rm --regex must print 0"
kv exists keep-1 >/dev/null || fail "keep-1 must survive the regex"
# Keys a regex matched but a read lease kept are said (not "0" alone), with what --force
# does, and the exit status is 1.
for k in leased-1 leased-2 free-1; do printf '%s' "$k" | kv put "$k" || fail "put $k"; done
kv get leased-1 >/dev/null && kv get leased-2 >/dev/null || fail "get leased-*"
removed=$("$KVPOOL" -s "$EP" rm --regex '^(leased|free)-' 2>"$TMP/err")
[ $? -eq 1 ] || fail "rm --regex that kept leased keys must exit 1"
[ "$removed" = 1 ] || fail "rm --regex must print the 1 it removed, printed '$removed'"
grep -qxF "kvpool: rm --regex ^(leased|free)-: removed 1 of 3 matching keys; 2 kept by a read \
lease (--force removes them)" "$TMP/err" || fail "rm --regex said: $(cat "$TMP/err")"
[ "$(kv rm --force --regex '^leased-')" = 2 ] || fail "rm --force --regex must take leased keys"
"$KVPOOL" -s "$EP" rm --all --regex x >/dev/null 2>&1
[ $? -eq 2 ] || fail "rm with two modes must exit 2"

# ---- stats, segments --------------------------------------------------------------------
kv stats >"$TMP/stats" || fail "stats"
grep -Eq '^objects: [0-9]+$' "$TMP/stats" || fail "stats lacks objects"
grep -Eq '^segments: 2$' "$TMP/stats" || fail "stats must show 2 segments"
grep -Eq '^bytes_mounted: 134217728$' "$TMP/stats" || fail "stats bytes_mounted"
grep -Eq '^utilisation: [0-9.]+$' "$TMP/stats" || fail "stats utilisation"
! grep -Ev '^[a-z_]+: [0-9.]+$' "$TMP/stats" || fail "stats lines must be 'name: value'"
[ "$(kv segments | grep -c ' 67108864 ')" = 2 ] || fail "segments must list 2 of 64 MiB"

objects=$(sed -n 's/^objects: //p' "$TMP/stats")
count=$(kv rm --all --force) || fail "rm --all"
[ "$count" = "$objects" ] || fail "rm --all printed $count, stats said $objects"
[ "$(kv stats | sed -n 's/^objects: //p')" = 0 ] || fail "objects after rm --all"
printf r | kv put r1 && printf r | kv put r2 || fail "put before reset"
[ "$(kv reset)" = 2 ] || fail "reset must print 2"

# ---- the daemon gone -------------------------------------------------------------------
kill -TERM "$DAEMON"
wait "$DAEMON" 2>/dev/null
DAEMON=
expect_error "cannot connect" "$KVPOOL" -s "$EP" -t 300 stats

if [ $failures -gt 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "cli: OK"
