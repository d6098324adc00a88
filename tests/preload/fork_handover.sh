#!/usr/bin/env bash
# Fork and exec with a stream whose ring cannot follow them, on one host: the
# shared-memory ring made to behave as a verbs one at fork and exec
# (RDMASHIM_TEST_FAULT=shm-fork, server side), so the hand-over of
# core/conn/handover.cc runs here as it does across hosts (softroce.forking,
# same program: tests/softroce/guest/fork_peer.py). The server forks (the
# child serves; or "shared": parent and child both read) or execs with the
# client's bytes unread in its ring while the client sleeps in recv(). Every
# part must arrive once, as sent (SHA-256), the server must log shm, then
# tcp:downgraded:fork|exec and the bytes it kept; the client shm, then
# tcp:downgraded:peer-fork|exec. With `shm` as the second argument the
# same scenario runs on a plain shared-memory ring (which follows fork and
# exec by itself): no downgrade at all.
# usage: fork_handover.sh fork|shared|exec|fork-poll [pinned|shm]
#   fork-poll: fork, the client asleep in poll() rather than recv()
set -euo pipefail
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
here=$(cd "$(dirname "$0")" && pwd)
peer=$here/../softroce/guest/fork_peer.py
scenario=$1 ring=${2:-pinned} wait=recv
[[ $scenario == *-poll ]] && wait=poll scenario=${scenario%-poll}
work=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fault=()
[[ $ring == pinned ]] && fault=(RDMASHIM_TEST_FAULT=shm-fork)

env "${fault[@]}" timeout 60 "$build/bin/rdmashim" run --log info -- python3 "$peer" server --bind 127.0.0.1 \
  --port "$port" --scenario "$scenario" >"$work/s.out" 2>"$work/s.log" &
server=$!
# The client connects only once the server listens: one that connects while
# the server is still starting finds no advertisement and (rightly) stays on
# TCP, which this test is not about.
for _ in $(seq 1 300); do
  ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
  sleep 0.05
done
rc=0
timeout 60 "$build/bin/rdmashim" run --log info -- python3 "$peer" client --host 127.0.0.1 --port "$port" \
  --wait "$wait" >"$work/c.out" 2>"$work/c.log" || rc=$?
wait "$server" || rc=$?
server=

fail=0
check() { if [[ $2 == 1 ]]; then echo "ok:   $1"; else echo "FAIL: $1"; fail=1; fi; }
# order LOG WANT...: each "-> WANT" logged, in this order.
order() {
  local log=$1 w n last=0
  shift
  for w in "$@"; do
    n=$(grep -n -- "-> $w\( \|$\)" "$log" | head -n 1 | cut -d: -f1)
    [[ -n $n && $n -gt $last ]] || return 1
    last=$n
  done
}
yes_if() { if "$@"; then echo 1; else echo 0; fi; }
parts_ok() { python3 "$peer" check "$work/c.out" "$work/s.out" >/dev/null; }
python3 "$peer" check "$work/c.out" "$work/s.out" | sed 's/^/  /'
check "every part once, as sent (client and server exited $rc)" "$(yes_if parts_ok)"
check "the child (or the new program) ended well" "$(yes_if grep -q '^child exit 0' "$work/s.out")"
reason=fork
[[ $scenario == exec ]] && reason="exec"
if [[ $ring == pinned ]]; then
  check "server: shm, then tcp:downgraded:$reason" "$(yes_if order "$work/s.log" shm "tcp:downgraded:$reason")"
  check "server: kept the unread bytes for the $([[ $reason == exec ]] && echo new program || echo child)" \
    "$(yes_if grep -q 'unread bytes of its shm stream kept for the' "$work/s.log")"
  check "client: shm, then tcp:downgraded:peer-$reason" "$(yes_if order "$work/c.log" shm "tcp:downgraded:peer-$reason")"
else
  check "server and client: shm, never downgraded" "$(yes_if test "$(grep -c -- '-> shm' "$work/s.log")" -ge 1 -a \
    "$(grep -c -- '-> shm' "$work/c.log")" -ge 1 -a "$(cat "$work/s.log" "$work/c.log" | grep -c downgraded)" = 0)"
fi
if ((fail)); then
  for f in "$work"/*; do echo "--- $f"; grep -v '^stream' "$f" | head -n 40; done
  exit 1
fi
