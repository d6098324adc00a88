#!/usr/bin/env bash
# Runs asio_test plainly (sanity: the program's own checks) or under
# `rdmashim run --log info` (its checks, plus: every connection it made was
# reported upgraded to shared memory exactly once on each side, and nothing
# else was reported).
#
# usage: run_asio.sh plain|preload [asio_test options...]
# env:   RDMASHIM_BUILD (the build folder), ASIO_WRAP (a command prefix)
set -euo pipefail

mode=$1
shift
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL: $*"
  echo "--- stdout"; cat "$work/out"
  echo "--- stderr ($(grep -c ' info: fd ' "$work/err" || true) per-connection rdmashim lines left out; first 100 others)"
  { grep -v ' info: fd ' "$work/err" || true; } | head -n 100
  exit 1
}

read -r -a prefix <<<"${ASIO_WRAP:-}"  # e.g. an older kernel: "seccomp_run --enosys epoll_pwait2 --"
[ "$mode" = preload ] && prefix+=("$bin/rdmashim" run --log info --)
rc=0
timeout -k 5 180 "${prefix[@]}" "$bin/asio_test" "$@" >"$work/out" 2>"$work/err" || rc=$?
[ "$rc" = 0 ] || fail "asio_test exited with $rc"
grep -qx 'asio_test: PASS' "$work/out" || fail "asio_test did not report PASS"
n=$(sed -n 's/^asio_test: connections=\([0-9]*\)$/\1/p' "$work/out")
[ -n "$n" ] && [ "$n" -gt 0 ] || fail "asio_test reported no connection count"

if [ "$mode" = plain ]; then
  ! grep -q '^rdmashim\[' "$work/err" || fail "rdmashim output in a plain run"
else
  reports=$(grep -c '^rdmashim\[[0-9]*\] info: fd [0-9]* (\(client\|server\)) -> ' "$work/err" || true)
  clients=$(grep -c '^rdmashim\[[0-9]*\] info: fd [0-9]* (client) -> shm$' "$work/err" || true)
  servers=$(grep -c '^rdmashim\[[0-9]*\] info: fd [0-9]* (server) -> shm$' "$work/err" || true)
  echo "connections: $n; rdmashim reports: $reports ($clients client -> shm, $servers server -> shm)"
  [ "$clients" = "$n" ] || fail "expected $n client-side '-> shm' reports, got $clients"
  [ "$servers" = "$n" ] || fail "expected $n server-side '-> shm' reports, got $servers"
  [ "$reports" = $((2 * n)) ] || fail "expected exactly $((2 * n)) connection reports, got $reports"
  ! grep -q '^rdmashim\[[0-9]*\] warn' "$work/err" || fail "rdmashim warned"
fi
cat "$work/out"
echo "ok: asio_test $* ($mode): $n connections"
