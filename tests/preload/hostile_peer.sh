#!/usr/bin/env bash
# A shared-memory peer run by another user cannot freeze us (issue 12): an
# attacker under rdmashim, as the throwaway user, connects to (or accepts)
# a victim under rdmashim, and once the stream is on shared memory writes
# hostile values into the segment and tampers with its doorbells
# (hostile_peer.py says what exactly). The victim must keep TCP's
# semantics: non-blocking recv returns at once, SO_RCVTIMEO fires, waiting
# costs no CPU, nothing blocks. Both directions: victim as client, then as
# server. Usage: hostile_peer.sh locks|doorbell. Needs root (throwaway user).
set -euo pipefail
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
attack=${1:?locks or doorbell}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=attacker_lib.sh
. "$here/attacker_lib.sh"
attacker_setup
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  attacker_cleanup
  rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"
cp "$here/hostile_peer.py" "$work/"
fail=0
for role in client server; do
  dir="$work/$role"
  mkdir "$dir"
  chmod 777 "$dir"
  "${AS_ATTACKER[@]}" "$build/bin/rdmashim" run --log info -- /usr/bin/python3 "$work/hostile_peer.py" \
    attacker "$attack" "$role" "$dir" >"$dir/attacker.out" 2>"$dir/attacker.log" &
  attacker=$!
  pids+=("$attacker")
  rc=0
  timeout -s KILL 15 "$build/bin/rdmashim" run --log info -- /usr/bin/python3 "$work/hostile_peer.py" \
    victim "$attack" "$role" "$dir" >"$dir/victim.out" 2>"$dir/victim.log" || rc=$?
  kill -KILL "$attacker" 2>/dev/null || true
  wait "$attacker" 2>/dev/null || true
  cat "$dir/victim.out"
  [ "$rc" = 137 ] && echo "FAIL: victim ($role) frozen: killed after 15 s"
  [ "$rc" = 0 ] || { fail=1; tail -3 "$dir/victim.log"; }
  # The attack must have happened on shared memory for the test to mean anything.
  grep -q "attack in place" "$dir/attacker.out" || { echo "FAIL: no attack ($role):"; tail -5 "$dir/attacker.log"; fail=1; }
  grep -q "($role) -> shm\$" "$dir/victim.log" || { echo "FAIL: the victim ($role) did not take shm:";
    grep -o "($role) -> .*" "$dir/victim.log" || true; fail=1; }
done
[ "$fail" = 0 ] || exit 1
echo "ok: the victim kept its semantics under the $attack attack, as client and as server"
