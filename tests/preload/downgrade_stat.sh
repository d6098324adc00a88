#!/usr/bin/env bash
# A connection that leaves its rings mid-stream (RDMASHIM_TEST_SCHEDULE=<seed>,
# downgrade=1: the client's first data call on a ring moves it back to TCP)
# still moves every byte (the peers check lengths), logs `shm` then
# `tcp:downgraded:test`, and `rdmashim stat --json` shows the client's row
# with that transport. The server reads no more after its answer, so it sees
# the Downgrade only if its last read happened to look at the TCP side after
# it came: its row is `shm` or `tcp:downgraded:peer-test` (logged as such).
set -euo pipefail
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
here=$(cd "$(dirname "$0")" && pwd)
peer=$here/stat_live.py
work=$(mktemp -d)
pids=()
cleanup() {
  exec 3>&- 2>/dev/null || true
  kill "${pids[@]}" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
wait_file() { for _ in $(seq 400); do [ -e "$1" ] && return 0; sleep 0.05; done; fail "timed out waiting for $1"; }

mkfifo "$work/hold"
exec 3<>"$work/hold"  # the client holds its connection until this closes

RDMASHIM_LOG=info "$bin/rdmashim" run -- python3 "$peer" server "$work/port" "$work/server.out" 2>"$work/server.log" &
pids+=($!)
wait_file "$work/port"
port=$(cat "$work/port")
# 20 kB up, 40 kB back (one send each: stat_live.py fails a short send),
# then 3000 bytes up the server never reads (sent after the client switched:
# the trigger moves that send to TCP).
RDMASHIM_LOG=${DG_LOG:-info} RDMASHIM_TEST_SCHEDULE=7,downgrade=1 "$bin/rdmashim" run -- \
  python3 "$peer" client "$port" 20000 3000 "$work/c.out" "$work/c.ready" <"$work/hold" 2>"$work/client.log" &
pids+=($!)
wait_file "$work/c.ready"
for _ in $(seq 100); do [ -s "$work/server.out" ] && break; sleep 0.05; done
cat "$work/client.log" "$work/server.log"
grep -q -- '-> shm$' "$work/client.log" || fail "the client did not upgrade"
grep -q -- '-> shm$' "$work/server.log" || fail "the server did not upgrade"
grep -q -- '-> tcp:downgraded:test$' "$work/client.log" || fail "the client did not log its downgrade"
if grep -q 'warn' "$work/client.log" "$work/server.log"; then fail "library warnings"; fi
if grep -q -- '-> tcp:downgraded:' "$work/server.log" && ! grep -q -- '-> tcp:downgraded:peer-test$' "$work/server.log"; then
  fail "the server logged another downgrade reason"
fi

"$bin/rdmashim" stat --json >"$work/stat.json"
python3 - "$work/stat.json" "$(cat "$work/c.out")" <<'PY' || fail "rdmashim stat does not show the downgraded rows"
import json, sys
procs = json.load(open(sys.argv[1]))
client = json.loads(sys.argv[2])
rows = [c for p in procs for c in p["live"] if {c["local"], c["peer"]} == {client["local"], client["peer"]}]
got = sorted((c["role"], c["transport"]) for c in rows)
print(got)
ok = len(got) == 2 and got[0] == ("client", "tcp:downgraded:test") and got[1] in (("server", "shm"), ("server", "tcp:downgraded:peer-test"))
sys.exit(0 if ok else 1)
PY
echo "PASS"
