#!/usr/bin/env bash
# A server under rdmashim in one I/O model (blocking, poll, select, epoll-lt,
# epoll-et) serves plain clients whose bytes start like rdmashim's Hello as
# TCP would: bytes that differ from the magic at once, a stalled true prefix
# at the latest after the setup timeout, with the server idle meanwhile
# (hello_edge client checks times and the server's CPU time). A control
# client under rdmashim must still upgrade to shared memory, so the test
# fails if the preload is not in the path.
#
# usage: hello_edge.sh MODEL     env: RDMASHIM_BUILD (the build folder)
set -euo pipefail

model=$1
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
prog="$build/bin/hello_edge"
timeout_ms=300
work=$(mktemp -d)
trap 'kill "${server_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
export RDMASHIM_SETUP_TIMEOUT_MS=$timeout_ms

"$build/bin/rdmashim" run --log info -- "$prog" server "$model" "$work/port" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || { echo "FAIL: server did not start"; cat "$work/server.log"; exit 1; }
port=$(cat "$work/port")

fail=0
# Plain clients (no preload), timed against the server process.
timeout 60 "$prog" client "$port" "$server_pid" "$timeout_ms" || fail=1
# An rdmashim client: must take shared memory with this server.
timeout 30 "$build/bin/rdmashim" run --log info -- "$prog" control "$port" 2>"$work/control.log" || fail=1
sleep 0.2

grep -q 'info: fd [0-9]* (client) -> shm$' "$work/control.log" ||
  { echo "FAIL: the control client did not upgrade to shm:"; cat "$work/control.log"; fail=1; }
grep -q 'info: fd [0-9]* (server) -> shm$' "$work/server.log" ||
  { echo "FAIL: the server did not upgrade the control connection to shm"; fail=1; }
# Every plain client was served as plain TCP.
plain=$(grep -c 'info: fd [0-9]* (server) -> tcp:peer-plain$' "$work/server.log" || true)
[ "$plain" -eq 5 ] || { echo "FAIL: expected 5 plain connections on the server, saw $plain"; fail=1; }
[ "$fail" -eq 0 ] || { echo "--- server log"; cat "$work/server.log"; }
exit "$fail"
