#!/usr/bin/env bash
# `rdmashim stat` reports, per process under rdmashim, how its connections
# ended up: here one server that served one rdmashim client (shm) and one
# plain client (tcp:peer-plain).
set -euo pipefail
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
port_file=$(mktemp)
trap 'kill "${server:-}" 2>/dev/null || true; rm -f "$port_file"' EXIT

"$bin/rdmashim" run -- "$bin/tcpPingPong" server --port 0 2>"$port_file" &
server=$!
for _ in $(seq 100); do grep -q "serving on port" "$port_file" && break; sleep 0.05; done
port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$port_file")
[ -n "$port" ] || { echo "FAIL: server did not start"; exit 1; }
"$bin/rdmashim" run -- "$bin/tcpPingPong" client "127.0.0.1:$port" --iters 100 >/dev/null
"$bin/tcpPingPong" client "127.0.0.1:$port" --iters 100 >/dev/null
sleep 0.2
server_pid=$(pgrep -P "$server" -x tcpPingPong || echo "$server")
json=$("$bin/rdmashim" stat --json)
echo "$json"
row=$(tr '}' '\n' <<<"$json" | grep "\"pid\":$server_pid," || true)
[ -n "$row" ] || { echo "FAIL: no stats for the server (pid $server_pid)"; exit 1; }
grep -q '"shm":1,' <<<"$row" || { echo "FAIL: expected one shm connection"; exit 1; }
grep -q '"tcp:peer-plain":1,' <<<"$row" || { echo "FAIL: expected one plain client"; exit 1; }
"$bin/rdmashim" stat
echo "ok: rdmashim stat counts one shm and one plain connection for the server"
