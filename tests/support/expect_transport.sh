#!/usr/bin/env bash
# Runs a self-checking test program (client and server in the one program, or
# in processes it forks) under `rdmashim run --log info` and requires, on top
# of its exit status 0, that every connection it made took the transport the
# test claims to test: exactly CONNS per-connection reports on the client
# side and CONNS on the server side, all "-> EXPECT", no other per-connection
# report and no rdmashim warning. So the test fails when the upgrade is off
# (with RDMASHIM_TRANSPORT=tcp or RDMASHIM_DISABLE=1 the client reports
# nothing and the server at most tcp:peer-plain) instead of passing on plain
# TCP.
#
# usage: expect_transport.sh [--expect shm] --conns N -- CMD [ARGS...]
# env:   RDMASHIM_BUILD (the build folder)
set -euo pipefail

expect=shm conns=
while [ $# -gt 0 ]; do
  case $1 in
    --expect) expect=$2; shift 2 ;;
    --conns) conns=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: expect_transport.sh [--expect shm] --conns N -- CMD [ARGS...]"; exit 2 ;;
  esac
done
[ -n "$conns" ] && [ $# -gt 0 ] || { echo "usage: expect_transport.sh [--expect shm] --conns N -- CMD [ARGS...]"; exit 2; }
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL: $*"
  echo "--- stderr ($(grep -c ' info: fd ' "$work/err" || true) per-connection rdmashim lines left out; first 50 others)"
  { grep -v ' info: fd ' "$work/err" || true; } | head -n 50
  echo "--- per-connection rdmashim lines, by outcome"
  sed -n 's/^rdmashim\[[0-9]*\] info: fd [0-9]* (\(client\|server\)) -> \(.*\)$/\1 -> \2/p' "$work/err" | sort | uniq -c
  exit 1
}

rc=0
"$build/bin/rdmashim" run --log info -- "$@" 2>"$work/err" || rc=$?
[ "$rc" = 77 ] && exit 77  # the program skipped (it said why)
[ "$rc" = 0 ] || fail "$(basename "$1") exited with $rc"

reports=$(grep -c '^rdmashim\[[0-9]*\] info: fd [0-9]* (\(client\|server\)) -> ' "$work/err" || true)
clients=$(grep -c "^rdmashim\[[0-9]*\] info: fd [0-9]* (client) -> $expect\$" "$work/err" || true)
servers=$(grep -c "^rdmashim\[[0-9]*\] info: fd [0-9]* (server) -> $expect\$" "$work/err" || true)
echo "rdmashim reports: $reports ($clients client -> $expect, $servers server -> $expect; expected $conns of each)"
[ "$clients" = "$conns" ] || fail "expected $conns client-side '-> $expect' reports, got $clients"
[ "$servers" = "$conns" ] || fail "expected $conns server-side '-> $expect' reports, got $servers"
[ "$reports" = $((2 * conns)) ] || fail "expected exactly $((2 * conns)) connection reports, got $reports"
! grep -q '^rdmashim\[[0-9]*\] warn' "$work/err" || fail "rdmashim warned"
echo "ok: $(basename "$1"): $conns connection(s), every one '-> $expect' on both sides"
