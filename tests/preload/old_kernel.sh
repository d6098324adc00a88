#!/usr/bin/env bash
# rdmashim on an older kernel: system calls newer than ~4.18 that rdmashim
# uses fail with ENOSYS (seccomp_run), and the programs must still work and
# still upgrade to shared memory.
#   epoll_pwait2 (5.11): tcpPingPong --wait epoll sleeps in our epoll wait,
#                        which must fall back to epoll_pwait.
#   close_range (5.9):   an application's close_range() fails with ENOSYS and
#                        must leave its upgraded connection intact.
#
# usage: old_kernel.sh epoll_pwait2|close_range     env: RDMASHIM_BUILD
set -euo pipefail

case=$1
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
work=$(mktemp -d)
trap 'kill "${server_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
old=("$bin/seccomp_run" --enosys "$case" --)
shim=("$bin/rdmashim" run --log info --)

fail=0
shm_lines() { grep -c "info: fd [0-9]* ($2) -> shm$" "$1" || true; }
case $case in
  epoll_pwait2)
    # Spin 0: every wait sleeps in the kernel.
    RDMASHIM_SPIN_US=0 timeout 60 "${old[@]}" "${shim[@]}" "$bin/tcpPingPong" --local --wait epoll \
      --iters 3000 --size 64 >"$work/out" 2>"$work/err" || { echo "FAIL: tcpPingPong exited with $?"; fail=1; }
    c=$(shm_lines "$work/err" client) s=$(shm_lines "$work/err" server)
    [ "$c" -ge 1 ] && [ "$s" -ge 1 ] || { echo "FAIL: not upgraded (client shm: $c, server shm: $s)"; fail=1; }
    cat "$work/out" ;;
  close_range)
    "${shim[@]}" "$bin/hello_edge" server poll "$work/port" 2>"$work/server.log" &
    server_pid=$!
    for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
    [ -s "$work/port" ] || { echo "FAIL: server did not start"; exit 1; }
    timeout 30 "${old[@]}" "${shim[@]}" "$bin/hello_edge" control "$(cat "$work/port")" close-range \
      2>"$work/err" || fail=1
    [ "$(shm_lines "$work/err" client)" -ge 1 ] || { echo "FAIL: the client did not upgrade"; fail=1; } ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
[ "$fail" -eq 0 ] || { echo "--- rdmashim stderr"; tail -n 20 "$work/err"; }
exit "$fail"
