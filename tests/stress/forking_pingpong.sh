#!/usr/bin/env bash
# forkingPingPong under rdmashim: a fork-per-connection, prefork or
# double-fork (daemonize) server and several concurrent clients complete a
# checked ping-pong, and every connection ends up where the fork-generation
# policy says: on shared memory on both sides (the upgrade happens lazily in
# the process that does the I/O), or, with RDMASHIM_FORKGEN naming another
# generation on the server, plain TCP (tcp:policy) that still works.
#
# usage: forking_pingpong.sh split|local fork|prefork|daemonize FORKGEN EXPECT
#   split: server and client are separate `rdmashim run` commands;
#   local: one `forkingPingPong --local` (it forks its own server)
#   FORKGEN: RDMASHIM_FORKGEN for the server, or - for unset (the client never has it)
#   EXPECT: shm | tcp:policy, what both sides of every connection must report
# env:   RDMASHIM_BUILD (the build folder), FORKING_CLIENTS (4), FORKING_ITERS (2000)
set -euo pipefail

mode=$1 shape=$2 forkgen=$3 expect=$4
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
clients=${FORKING_CLIENTS:-4}
iters=${FORKING_ITERS:-2000}
bin=$build/bin
work=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
unset RDMASHIM_FORKGEN

shape_args=()
case "$shape" in
  fork) ;;
  prefork) shape_args=(--prefork 3) ;;
  daemonize) shape_args=(--daemonize) ;;
  *) echo "unknown shape $shape"; exit 2 ;;
esac
server_env=()
[ "$forkgen" != - ] && server_env=(RDMASHIM_FORKGEN="$forkgen")

fail=0
die() { echo "FAIL: $*"; for f in "$work"/*.log "$work"/*.json; do [ -e "$f" ] && { echo "--- $f"; cat "$f"; }; done; exit 1; }

if [ "$mode" = split ]; then
  env "${server_env[@]}" timeout 90 "$bin/rdmashim" run --log info -- "$bin/forkingPingPong" server --port 0 \
    "${shape_args[@]}" --conns "$clients" 2>"$work/server.log" &
  server=$!
  for _ in $(seq 200); do grep -q "serving on port" "$work/server.log" && break; sleep 0.05; done
  port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/server.log")
  [ -n "$port" ] || die "server did not start"
  server_pid=$(sed -n 's/^forkingPingPong\[\([0-9]*\)\]: serving on port.*/\1/p' "$work/server.log")
  timeout 60 "$bin/rdmashim" run --log info -- "$bin/forkingPingPong" client "127.0.0.1:$port" \
    --clients "$clients" --iters "$iters" --json >"$work/client.json" 2>"$work/client.log" ||
    die "client exited with $?"
  wait "$server" || die "server exited with $?"
  server=
else
  timeout 90 "$bin/rdmashim" run --log info -- "$bin/forkingPingPong" --local "${shape_args[@]}" \
    --clients "$clients" --iters "$iters" --json >"$work/client.json" 2>"$work/all.log" ||
    die "forkingPingPong --local exited with $?"
  server_pid=none
fi

# A daemonized grandchild is nobody's child: wait (bounded) for its report.
log=$work/server.log
[ "$mode" = local ] && log=$work/all.log
served() { grep -c 'served a connection' "$log" || true; }
for _ in $(seq 200); do [ "$(served)" -ge "$clients" ] && break; sleep 0.05; done
sleep 0.1

grep -q '"round_trips_per_s":' "$work/client.json" || die "no report from the client"
[ "$(served)" = "$clients" ] || die "expected $clients served connections, got $(served)"
bad=$(grep 'served a connection' "$log" | grep -vc ': ok$' || true)
[ "$bad" = 0 ] || die "$bad connection(s) ended with an error on the server"

# What rdmashim reported, per side.
client_log=$work/client.log
[ "$mode" = local ] && client_log=$work/all.log
outcomes() {  # log role -> one outcome per line
  sed -n "s/^rdmashim\[[0-9]*\] info: fd [0-9]* ($2) -> \(.*\)$/\1/p" "$1"
}
check_side() {  # role log
  local n_all n_ok
  n_all=$(outcomes "$2" "$1" | wc -l)
  n_ok=$(outcomes "$2" "$1" | grep -cx "$expect" || true)
  if [ "$n_all" != "$clients" ] || [ "$n_ok" != "$clients" ]; then
    echo "FAIL: $1 side: expected $clients connections reported '$expect', got $n_all reports," \
      "$n_ok of them '$expect': $(outcomes "$2" "$1" | sort | uniq -c | tr '\n' ' ')"
    fail=1
  fi
}
check_side client "$client_log"
check_side server "$log"

# The server side of every connection was reported by a process that served
# one, never by the accepting parent.
serving=$(sed -n 's/^forkingPingPong\[\([0-9]*\)\]: served a connection.*/\1/p' "$log" | sort -u)
reporting=$(sed -n 's/^rdmashim\[\([0-9]*\)\] info: fd [0-9]* (server) -> .*/\1/p' "$log" | sort -u)
for p in $reporting; do
  grep -qx "$p" <<<"$serving" || { echo "FAIL: server-side report from pid $p, which served nothing"; fail=1; }
  [ "$p" != "$server_pid" ] || { echo "FAIL: the accepting parent $p did the server side"; fail=1; }
done
if [ "$shape" != prefork ] && [ "$(wc -l <<<"$serving")" != "$clients" ]; then
  echo "FAIL: expected $clients distinct serving processes, got $(wc -l <<<"$serving")"; fail=1
fi
if grep -q '^rdmashim\[[0-9]*\] warn' "$log" "$client_log"; then
  echo "FAIL: rdmashim warned"; grep -h '^rdmashim\[[0-9]*\] warn' "$log" "$client_log"; fail=1
fi

[ "$fail" = 0 ] || die "see above"
echo "ok: $mode $shape (server RDMASHIM_FORKGEN=$forkgen): $clients clients x $iters round trips," \
  "every connection '$expect' on both sides, served by $(wc -l <<<"$serving") process(es)"
cat "$work/client.json"
