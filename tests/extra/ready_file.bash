# ready_file.bash - the shell scripts' reader of kvpoold's ready file (sourced by cli.sh and
# pidns.sh; not a test of its own: tests/run.sh runs only *.sh). The C tests and kvpool-bench
# read it with infra/ready_file.c, the Python tests with tests/python/kvpool_daemon.py.
#
# kvpoold --ready-file PATH writes, once it serves, a line per bound endpoint and its pid
# ("endpoint=tcp://127.0.0.1:41234", "endpoint=ipc://@kvpool-41234", "admin=...", "pid=..."),
# under another name and then renamed, so a reader sees all of it or none.

# kvpoold_wait_ready READY PID LOG: waits up to 10 s for the ready file READY of the kvpoold
# PID and prints its first tcp client endpoint. Fails, with LOG on stderr, if PID dies first;
# fails if the time runs out.
kvpoold_wait_ready() {
  local ready=$1 pid=$2 log=$3 endpoint
  for _ in $(seq 1 500); do
    endpoint=$(sed -n 's/^endpoint=\(tcp:\/\/.*\)$/\1/p' "$ready" 2>/dev/null | head -1)
    [ -n "$endpoint" ] && { echo "$endpoint"; return 0; }
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "kvpoold died" >&2; return 1; }
    sleep 0.02
  done
  echo "kvpoold not ready within 10 s" >&2
  return 1
}
