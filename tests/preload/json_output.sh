#!/usr/bin/env bash
# Every --json the tools print parses, whatever the names in it: servers
# under rdmashim named pp"x\y and with a tab and a control byte in their
# name show up in `rdmashim stat --json` by their exact names; doctor, the
# ping-pongs and rdma_send/rdma_recv print valid JSON too.
set -euo pipefail
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# parse_json FILE [PYTHON-EXPR over `d`]: exits non-zero unless FILE holds one
# JSON document and the expression is true.
parse_json() {
  python3 - "$1" "${2:-True}" <<'PY'
import json, sys
d = json.loads(open(sys.argv[1], encoding="utf-8").read())
if not eval(sys.argv[2]):
    sys.exit("expression false: " + sys.argv[2] + " for " + json.dumps(d))
PY
}

names=('pp"x\y' "$(printf 'c\tq\001z')")
for i in 0 1; do
  cp "$bin/tcpPingPong" "$work/${names[$i]}"
  "$bin/rdmashim" run -- "$work/${names[$i]}" server --port 0 2>"$work/port$i" &
  pids+=($!)
done
for i in 0 1; do
  for _ in $(seq 100); do grep -q "serving on port" "$work/port$i" && break; sleep 0.05; done
  port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/port$i")
  [ -n "$port" ] || fail "server $i did not start"
  "$bin/rdmashim" run -- "$bin/tcpPingPong" client "127.0.0.1:$port" --iters 10 >/dev/null
done
"$bin/rdmashim" stat --json >"$work/stat.json"
cat "$work/stat.json"
parse_json "$work/stat.json" 'any(p["command"] == "pp\"x\\y" for p in d)' ||
  fail "rdmashim stat --json: invalid, or no process named pp\"x\\y"
parse_json "$work/stat.json" 'any(p["command"] == "c\tq\u0001z" for p in d)' ||
  fail "rdmashim stat --json: no process named c<TAB>q<0x01>z"

# doctor fails here (no RDMA device) but its JSON must still parse.
"$bin/rdmashim" doctor --json --timeout 5 >"$work/doctor.json" || true
parse_json "$work/doctor.json" '"ok" in d and isinstance(d["steps"], list)' || fail "rdmashim doctor --json"

"$bin/tcpPingPong" --local --iters 100 --json >"$work/tcp.json"
parse_json "$work/tcp.json" 'd["round_trips_per_s"] > 0' || fail "tcpPingPong --json"
"$bin/rdmaPingPong" --local --iters 100 --json >"$work/rdma.json"
parse_json "$work/rdma.json" 'd["transport"] == "shm"' || fail "rdmaPingPong --json"

head -c 100000 /dev/urandom >"$work/in"
"$bin/rdma_recv" --listen 127.0.0.1:0 --port-file "$work/rport" --json >"$work/out" 2>"$work/recv.err" &
recv=$!
pids+=($recv)
for _ in $(seq 100); do [ -s "$work/rport" ] && break; sleep 0.05; done
rport=$(cat "$work/rport" 2>/dev/null || true)
[ -n "$rport" ] || { cat "$work/recv.err"; fail "rdma_recv did not write its port"; }
"$bin/rdma_send" "127.0.0.1:$rport" "$work/in" --json >"$work/send.json"
wait "$recv"
cmp -s "$work/in" "$work/out" || fail "rdma_send | rdma_recv changed the bytes"
parse_json "$work/send.json" 'd["bytes"] == 100000' || fail "rdma_send --json"
grep '^{' "$work/recv.err" >"$work/recv.json" || fail "rdma_recv printed no JSON"
parse_json "$work/recv.json" 'd["bytes"] == 100000' || fail "rdma_recv --json"
echo "ok: stat, doctor, tcpPingPong, rdmaPingPong, rdma_send and rdma_recv print valid JSON"
