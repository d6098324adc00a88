#!/usr/bin/env bash
# The rendezvous cannot be flooded: another user connects to and sends junk
# to every rdmashim rendezvous socket it finds in /proc/net/unix while a
# client under rdmashim makes 50 connections to an echo server under rdmashim
# (which waits 50 ms before its first read, so each rendezvous is up that
# long). Every connection must still take shared memory on both ends, and
# every echo must be intact. Needs root (throwaway user).
set -euo pipefail
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=attacker_lib.sh
. "$here/attacker_lib.sh"
attacker_setup
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  attacker_cleanup
  rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"
cp "$here/flood.py" "$work/"
count=50
run() { "$build/bin/rdmashim" run --log info -- "$@"; }

run python3 "$here/flood_peer.py" server "$work/port" "$count" 2>"$work/server.log" &
pids+=($!)
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
"${AS_ATTACKER[@]}" /usr/bin/python3 "$work/flood.py" 15 >"$work/attacker.out" 2>&1 &
attacker=$!
pids+=("$attacker")
sleep 0.3
fail=0
run python3 "$here/flood_peer.py" client "$(cat "$work/port")" "$count" >"$work/client.out" 2>"$work/client.log" || {
  echo "FAIL: client:"; cat "$work/client.out"; fail=1; }
wait "${pids[0]}" || { echo "FAIL: server exited with $?"; fail=1; }
kill -INT "$attacker" 2>/dev/null || true

for side in client server; do
  n=$(grep -c "($side) -> shm\$" "$work/$side.log" || true)
  if [ "$n" != "$count" ]; then
    echo "FAIL: $n of $count connections $side -> shm:"; grep -o "($side) -> .*" "$work/$side.log" | sort | uniq -c; fail=1
  fi
done
# The attack must have happened for the test to mean anything.
attacked=$(grep -c "^rdmashim-rv-" "$work/attacker.out" || true)
echo "client: $(cat "$work/client.out"); the attacker flooded $attacked rendezvous sockets"
if [ "$attacked" -lt $((count / 2)) ]; then echo "FAIL: the attacker reached only $attacked rendezvous sockets"; cat "$work/attacker.out"; fail=1; fi
[ "$fail" = 0 ] || exit 1
echo "ok: $count connections upgraded and intact under a rendezvous flood"
