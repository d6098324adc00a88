#!/usr/bin/env bash
# A connection that fell back to TCP after a negative Ack answers as fast as
# TCP: the Plain frame goes out with the request (MSG_MORE), not alone ahead
# of it, where Nagle held the request for the server's delayed ACK.
# Fails if 5 or more of 80 round trips took over 35 ms (each connection paid
# ~40 ms before the fix), or if the connections did not fall back as set up.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${RDMASHIM_BUILD:-$here/../../build}
shim=$build/bin/rdmashim
work=$(mktemp -d)
trap 'kill $spid 2>/dev/null; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export RDMASHIM_SHORT_CONN_MS=0 RDMASHIM_LOG=info
RDMASHIM_TEST_FAULT=memfd "$shim" run -- python3 "$here/fallback_latency.py" server "$port" >"$work/s.out" 2>"$work/s.err" &
spid=$!
for _ in $(seq 100); do grep -q listening "$work/s.out" 2>/dev/null && break; sleep 0.05; done
out=$("$shim" run -- python3 "$here/fallback_latency.py" client "$port" 2>"$work/c.err") || { echo "FAIL: client: $out"; cat "$work/c.err"; exit 1; }
wait "$spid"
echo "$out"
fell=$(grep -c -- '-> tcp:setup-failed' "$work/c.err")
[ "$fell" -eq 20 ] || { echo "FAIL: $fell of 20 client connections report tcp:setup-failed"; grep -- '->' "$work/c.err" | head; exit 1; }
slow=$(sed -n 's/slow round trips: \([0-9]*\) of.*/\1/p' <<<"$out")
[ -n "$slow" ] && [ "$slow" -lt 5 ] || { echo "FAIL: $out (Nagle behind a lone Plain frame?)"; exit 1; }
echo "ok"
