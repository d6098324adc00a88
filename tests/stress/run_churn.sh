#!/usr/bin/env bash
# A thousand connections opened, used and closed in a loop (conn_churn
# client against conn_churn server), both under `rdmashim run --log info`
# (preload) or both plain (baseline). Each side checks itself for leaked
# descriptors, resident memory growth, threads, and ring memfds left open or
# mapped (see conn_churn.cc); here we also check that under rdmashim every
# connection was reported on shared memory on both sides and that rings were
# really seen while connections were open.
#
# usage: run_churn.sh plain|preload
# env:   RDMASHIM_BUILD (the build folder), CHURN_CONNS (1000), CHURN_WARMUP (50),
#        CHURN_MAX_RSS_GROWTH_KB (4096), CHURN_MAX_FD_GROWTH (2),
#        CHURN_ALLOW_RESETS (0; 1: ECONNRESET where EOF is due is counted, not fatal)
set -euo pipefail

mode=$1
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
conns=${CHURN_CONNS:-1000}
warmup=${CHURN_WARMUP:-50}
limits=(--max-rss-growth-kb "${CHURN_MAX_RSS_GROWTH_KB:-4096}" --max-fd-growth "${CHURN_MAX_FD_GROWTH:-2}"
        --allow-resets "${CHURN_ALLOW_RESETS:-0}")
work=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

prefix=()
[ "$mode" = preload ] && prefix=("$bin/rdmashim" run --log info --)

die() {
  echo "FAIL: $*"
  for f in server.json client.json; do [ -e "$work/$f" ] && { echo "--- $f"; cat "$work/$f"; }; done
  for f in server.log client.log; do
    [ -e "$work/$f" ] && { echo "--- $f (without the per-connection info lines)"; { grep -v ' info: fd ' "$work/$f" || true; } | head -50; }
  done
  exit 1
}

timeout -k 5 240 "${prefix[@]}" "$bin/conn_churn" server --port-file "$work/port" --conns "$conns" \
  --warmup "$warmup" "${limits[@]}" >"$work/server.json" 2>"$work/server.log" &
server=$!
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || die "server did not start"

start=$(date +%s.%N)
rc=0
timeout -k 5 240 "${prefix[@]}" "$bin/conn_churn" client --port "$(cat "$work/port")" --conns "$conns" \
  --warmup "$warmup" "${limits[@]}" >"$work/client.json" 2>"$work/client.log" || rc=$?
src=0
wait "$server" || src=$?
server=
end=$(date +%s.%N)
[ "$rc" = 0 ] || die "client exited with $rc"
[ "$src" = 0 ] || die "server exited with $src"

field() { sed -n "s/.*\"$2\":\([0-9-]*\).*/\1/p" "$work/$1.json" | head -n 1; }
total=$((conns + warmup))
if [ "$mode" = preload ]; then
  for side in client server; do
    n_all=$(grep -c "^rdmashim\[[0-9]*\] info: fd [0-9]* ($side) -> " "$work/$side.log" || true)
    n_shm=$(grep -c "^rdmashim\[[0-9]*\] info: fd [0-9]* ($side) -> shm$" "$work/$side.log" || true)
    [ "$n_all" = "$total" ] && [ "$n_shm" = "$total" ] ||
      die "$side: expected $total connections reported '-> shm', got $n_all reports, $n_shm of them shm"
    [ "$(field "$side" ring_fds_open_max)" -gt 0 ] || die "$side: never saw a ring memfd (open or mapped) while a connection was open"
    ! grep -q '^rdmashim\[[0-9]*\] warn' "$work/$side.log" || die "$side: rdmashim warned"
  done
fi
for side in client server; do
  echo "$side: fd growth $(field "$side" fd_growth), VmRSS growth $(field "$side" rss_growth_kb) kB," \
    "ECONNRESET instead of EOF $(field "$side" resets_instead_of_eof)," \
    "rings open while connected (max) $(field "$side" ring_fds_open_max); $(cat "$work/$side.json")"
done
echo "ok: $total connections ($mode) in $(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b - a}') s;" \
  "no descriptor, memory, thread or ring left behind on either side"
