#!/usr/bin/env bash
# Idle CPU: a client waiting (epoll_wait by default) on an upgraded socket,
# after some round trips so the connection is on the shared-memory ring,
# must use under 1% of a core: utime+stime from /proc/<pid>/stat over 5 s,
# after a settle period. Both ends run under `rdmashim run --log info`, both
# must report the connection as shm, and the client must then wake up for the
# server's unprompted message (so the wait really was on that socket).
#
# usage: run_idle.sh [epoll|poll|recv]
# env:   RDMASHIM_BUILD (the build folder), IDLE_SETTLE_S (1), IDLE_MEASURE_S (5),
#        IDLE_MAX_PERCENT (1.0)
set -euo pipefail

wait_mode=${1:-epoll}
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
settle=${IDLE_SETTLE_S:-1}
measure=${IDLE_MEASURE_S:-5}
max_percent=${IDLE_MAX_PERCENT:-1.0}
work=$(mktemp -d)
trap 'kill "${server:-}" "${client:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

die() {
  echo "FAIL: $*"
  for f in server.log client.log client.out; do [ -e "$work/$f" ] && { echo "--- $f"; cat "$work/$f"; }; done
  exit 1
}

# Both processes are exec'd by `rdmashim run`, so $! is the measured process.
"$bin/rdmashim" run --log info -- "$bin/idle_peer" server --port-file "$work/port" 2>"$work/server.log" &
server=$!
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || die "server did not start"
"$bin/rdmashim" run --log info -- "$bin/idle_peer" client --port "$(cat "$work/port")" --ready-file "$work/ready" \
  --wait "$wait_mode" >"$work/client.out" 2>"$work/client.log" &
client=$!
for _ in $(seq 200); do [ -s "$work/ready" ] && break; sleep 0.05; done
[ -s "$work/ready" ] || die "client did not get ready"
[ "$(cat "$work/ready")" = "$client" ] || die "client pid $(cat "$work/ready") is not the measured pid $client"

grep -q "^rdmashim\[$client\] info: fd [0-9]* (client) -> shm$" "$work/client.log" ||
  die "the client did not report its connection on shm"
grep -q "^rdmashim\[$server\] info: fd [0-9]* (server) -> shm$" "$work/server.log" ||
  die "the server did not report its connection on shm"

ticks() {  # utime + stime of a process, in clock ticks (fields 14 and 15 of /proc/PID/stat)
  sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}
hz=$(getconf CLK_TCK)
cpu_ns() {  # on-CPU time of all threads in ns (/proc/PID/task/*/schedstat), finer than the ticks
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d", s}'
}
sleep "$settle"
c0=$(ticks "$client") s0=$(ticks "$server") cn0=$(cpu_ns "$client") sn0=$(cpu_ns "$server") t0=$(date +%s.%N)
sleep "$measure"
c1=$(ticks "$client") s1=$(ticks "$server") cn1=$(cpu_ns "$client") sn1=$(cpu_ns "$server") t1=$(date +%s.%N)
state=$(sed 's/^.*) //' "/proc/$client/stat" | awk '{print $1}')

percent() { awk -v d="$1" -v hz="$hz" -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", 100 * d / hz / (b - a)}'; }
cp=$(percent $((c1 - c0)))
sp=$(percent $((s1 - s0)))
fine() { awk -v d="$1" -v a="$t0" -v b="$t1" 'BEGIN{printf "%.4f", 100 * d / 1e9 / (b - a)}'; }
echo "idle CPU over $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b - a}') s ($wait_mode wait):" \
  "client $cp% of a core ($((c1 - c0)) ticks at $hz/s, state $state), server $sp% ($((s1 - s0)) ticks);" \
  "schedstat: client $(fine $((cn1 - cn0)))%, server $(fine $((sn1 - sn0)))%"

# Wake the client: the server speaks unprompted; the client must see it and exit 0.
kill -USR1 "$server"
rc=0
for _ in $(seq 100); do kill -0 "$client" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$client" 2>/dev/null; then die "the client did not wake up for the server's message within 5 s"; fi
wait "$client" || rc=$?
client=
[ "$rc" = 0 ] || die "client exited with $rc"
src=0
for _ in $(seq 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$server" 2>/dev/null; then die "the server did not exit within 5 s of the client's close"; fi
wait "$server" || src=$?
server=
[ "$src" = 0 ] || die "server exited with $src"
cat "$work/client.out"

awk -v p="$cp" -v m="$max_percent" 'BEGIN{exit !(p < m)}' || die "idle client used $cp% of a core (limit $max_percent%)"
awk -v p="$sp" -v m="$max_percent" 'BEGIN{exit !(p < m)}' || die "idle server used $sp% of a core (limit $max_percent%)"
echo "ok: idle $wait_mode client $cp%, server $sp% of a core (limit $max_percent%)"
