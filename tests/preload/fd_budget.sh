#!/usr/bin/env bash
# Descriptors: rdmashim never makes a program meet EMFILE it would not have
# met on TCP, and never changes the numbers the program's own calls get.
#   soft: soft limit 1024, hard 4096; 900 concurrent connections, both ends
#     under rdmashim: all work, no EMFILE, and every one is on shm on both ends
#     (rdmashim's descriptors live above the soft limit).
#   hard: soft = hard = 1024; 900 connections: all work, no EMFILE; the first
#     ones on shm, the rest on TCP with reason tcp:fd-budget (both ends log it).
#   numbers: after a connection on shm, the descriptors the program opens
#     have the numbers it gets without rdmashim (server and client),
#     and the connection survives the program closing every other number.
# usage: fd_budget.sh soft|hard|numbers
set -euo pipefail
mode=$1
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
here=$(cd "$(dirname "$0")" && pwd)
peer="$here/fd_budget.py"
work=$(mktemp -d)
trap 'kill "${server_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
count=${COUNT:-900}
shim="$build/bin/rdmashim run --log info --"

run() {  # tag: server and client of $count connections under the current limits
  rm -f "$work/port"
  timeout 100 $shim python3 "$peer" server --port-file "$work/port" --count "$count" \
    >"$work/$1.server.json" 2>"$work/$1.server.log" &
  server_pid=$!
  for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
  [ -s "$work/port" ] || { echo "FAIL: server did not start"; cat "$work/$1.server.log"; exit 1; }
  timeout 100 $shim python3 "$peer" client --port "$(cat "$work/port")" --count "$count" \
    >"$work/$1.client.json" 2>"$work/$1.client.log" || {
    echo "FAIL: client failed"; cat "$work/$1.client.json"; tail -5 "$work/$1.client.log" "$work/$1.server.log"
    kill "$server_pid" 2>/dev/null; exit 1; }
  wait "$server_pid" || { echo "FAIL: server failed"; cat "$work/$1.server.json"; tail -5 "$work/$1.server.log"; exit 1; }
  server_pid=
  cat "$work/$1.server.json" "$work/$1.client.json"
  grep -q "\"connected\": $count, \"good\": $((2 * count)), \"errors\": {}" "$work/$1.client.json" &&
    grep -q "\"accepted\": $count, \"answered\": $((2 * count)), \"errors\": {}" "$work/$1.server.json" || {
    echo "FAIL: not every connection worked (or an error such as EMFILE)"; exit 1; }
  if grep -q "Too many open files" "$work/$1".*; then echo "FAIL: EMFILE"; exit 1; fi
}

tally() {  # log side transport
  grep -c "info: fd [0-9]* ($2) -> $3\$" "$work/$1" || true
}

report() {  # tag
  for side in server client; do
    echo "$side: $(grep -o "($side) -> [a-z:-]*" "$work/$1.$side.log" | sort | uniq -c | tr '\n' ' ')"
  done
}

case $mode in
  soft)
    ulimit -Sn 1024
    ulimit -Hn 4096 2>/dev/null || { echo "SKIP: cannot set a hard limit of 4096"; exit 77; }
    run s; report s
    for side in server client; do
      n=$(tally s.$side.log $side shm)
      [ "$n" = "$count" ] || { echo "FAIL: $n of $count connections on shm ($side)"; exit 1; }
    done ;;
  hard)
    ulimit -n 1024
    run h; report h
    # The server sees a plain client (tcp:peer-plain) where the client's
    # budget said no before its Hello, and says tcp:fd-budget where its own did.
    for side in server client; do
      shm=$(tally h.$side.log $side shm); budget=$(tally h.$side.log $side tcp:fd-budget)
      plain=0; [ $side = client ] || plain=$(tally h.$side.log $side tcp:peer-plain)
      [ "$shm" -gt 0 ] || { echo "FAIL: no connection on shm ($side)"; exit 1; }
      [ "$((budget + plain))" -gt 0 ] || { echo "FAIL: no connection kept on TCP for the budget ($side)"; exit 1; }
      other=$(( $(grep -c "($side) -> " "$work/h.$side.log") - shm - budget - plain ))
      [ "$other" = 0 ] || { echo "FAIL: $other connections with another outcome ($side)"; exit 1; }
    done
    [ "$(tally h.client.log client tcp:fd-budget)" -gt 0 ] || { echo "FAIL: no tcp:fd-budget (client)"; exit 1; } ;;
  numbers)
    for t in shm tcp; do  # tcp: plain, without rdmashim
      launch=$shim; [ $t = tcp ] && launch=
      rm -f "$work/port"
      timeout 30 $launch python3 "$peer" numbers --port-file "$work/port" \
        >"$work/$t.server.json" 2>"$work/$t.server.log" &
      server_pid=$!
      for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
      timeout 30 $launch python3 "$peer" numbers --port "$(cat "$work/port")" \
        >"$work/$t.client.json" 2>"$work/$t.client.log" || { echo "FAIL: client ($t)"; tail -3 "$work/$t".*.log; exit 1; }
      wait "$server_pid" || { echo "FAIL: server ($t)"; tail -3 "$work/$t".*.log; exit 1; }
      server_pid=
    done
    grep -q "(server) -> shm" "$work/shm.server.log" && grep -q "(client) -> shm" "$work/shm.client.log" || {
      echo "FAIL: the connection did not take shm"; cat "$work"/shm.*.log; exit 1; }
    for side in server client; do
      echo "$side: shm $(cat "$work/shm.$side.json")  tcp $(cat "$work/tcp.$side.json")"
      cmp -s "$work/shm.$side.json" "$work/tcp.$side.json" || {
        echo "FAIL: the $side's descriptor numbers, or its connection once it closed every other descriptor, differ from plain TCP's"; exit 1; }
    done ;;
  *) echo "usage: $0 soft|hard|numbers"; exit 2 ;;
esac
echo PASS
