#!/usr/bin/env bash
# The ping-pong options bench/run relies on do what they say:
#   tcpPingPong --unix      the connection is an abstract Unix socket (seen in
#                           /proc/net/unix while it runs), transport "unix"
#   --ms T                  a run of 10^8 round trips stops after about T ms;
#                           first_half_per_s / second_half_per_s bracket its rate
#   p999_us                 p50 <= p99 <= p99.9 <= max
#   --stream --rate B       the achieved rate is within 5% of B
#   rdmaPingPong --stream   every byte over shm
#   --hold N --then M --busy K  under rdmashim: the idle ones and the K busy
#                           ones upgraded (a line per side each), resident
#                           memory of both sides, the busy ones' rate and p99
set -euo pipefail
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
check() {  # FILE PYTHON-EXPR over d
  python3 - "$1" "$2" <<'PY' || fail "$2: $(cat "$1")"
import json, sys
d = json.loads(open(sys.argv[1]).read())
sys.exit(0 if eval(sys.argv[2]) else 1)
PY
}

"$bin/tcpPingPong" --local --unix --json --iters 100000000 --warmup 10 --ms 700 >"$work/unix.json" &
pp=$!
sleep 0.3
grep -q "@tcpPingPong-$pp" /proc/net/unix || fail "--unix: no abstract socket @tcpPingPong-$pp in /proc/net/unix"
wait "$pp"
check "$work/unix.json" 'd["transport"] == "unix" and d["iters"] < 100000000 and d["seconds"] < 1.5'
check "$work/unix.json" 'd["p50_us"] <= d["p99_us"] <= d["p999_us"] <= d["max_us"]'

start=$(date +%s%N)
"$bin/tcpPingPong" --local --json --iters 100000000 --warmup 10 --ms 300 >"$work/ms.json"
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$elapsed_ms" -lt 3000 ] || fail "--ms 300 took $elapsed_ms ms"
check "$work/ms.json" 'd["transport"] == "tcp" and 0 < d["iters"] < 100000000'
# the halves' rates: the run's rate lies between them (it is their harmonic mean, give or take the loop)
check "$work/ms.json" '0 < min(d["first_half_per_s"], d["second_half_per_s"]) * 0.8 <= d["round_trips_per_s"] <= max(d["first_half_per_s"], d["second_half_per_s"]) * 1.2'

"$bin/tcpPingPong" --local --json --stream --size 65536 --bytes 25m --rate 50000000 >"$work/paced.json"
check "$work/paced.json" 'abs(d["bytes_per_s"] / 50e6 - 1) <= 0.05'

"$bin/rdmaPingPong" --local --json --stream --size 65536 --bytes 64m >"$work/core.json"
check "$work/core.json" 'd["transport"] == "shm" and d["bytes"] == 64 << 20 and d["bytes_per_s"] > 0'

RDMASHIM_LOG=info "$bin/rdmashim" run -- "$bin/tcpPingPong" --local --json --hold 20 --then 1000 --busy 10 \
  >"$work/hold.json" 2>"$work/hold.err"
[ "$(grep -c -- '-> shm' "$work/hold.err")" -eq 60 ] ||
  fail "--hold 20 --then --busy 10: not all 30 connections on shm: $(cat "$work/hold.err")"
check "$work/hold.json" 'd["client_rss_kb"] > 0 and d["server_rss_kb"] > 0 and d["then_round_trips_per_s"] > 0 and d["then_p99_us"] > 0 and d["then_busy"] == 10'
echo "ok: --unix, --ms, p999_us, --rate, rdmaPingPong --stream, --hold --then --busy"
