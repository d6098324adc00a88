#!/usr/bin/env bash
# The waiting path costs no more system calls per message than TCP's.
#
# A 64 B ping-pong with RDMASHIM_SPIN_US=0 (every wait sleeps, as on a busy
# machine) against plain tcpPingPong, both processes under strace -f -c.
# Runs of n and 4n round trips: their difference leaves out what a process
# costs once (start-up, the upgrade, a sanitizer's runtime).
#   block   blocking recv/send: TCP sleeps in recv, 2 calls per message. A
#           sleep on the doorbell and the TCP side with poll() had to drain
#           the doorbell after: 3. A thread's own edge-triggered epoll
#           (core/conn/thread_epoll.h) needs no drain.
#   epoll   an event loop: non-blocking socket, epoll_wait after EAGAIN. The
#           doorbell sits in the program's set edge-triggered and was
#           drained after every wake-up all the same: 4 against TCP's 5.
#   poll    the same with poll(): the doorbell is polled level-triggered
#           and drained, as TCP's recv after poll.
# Allowed: TCP's count + 0.15 (queued rings are drained in batches of up to
# 32 rings, about 0.03 per message).
# With RDMASHIM_TRANSPORT=tcp the counts would be TCP's own, so the test
# first checks (info line) that the connection took shared memory.
#
# usage: waiting_calls.sh block|epoll|poll   (env: RDMASHIM_BUILD)
set -euo pipefail
mode=$1
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
calls=$(dirname "$0")/../support/strace_calls.sh
"$calls" -- true >/dev/null || exit $?  # strace there, or skipped

wait_args=()
[ "$mode" = block ] || wait_args=(--wait "$mode")
RDMASHIM_SPIN_US=0 RDMASHIM_LOG=info "$bin/rdmashim" run -- "$bin/tcpPingPong" --local --iters 200 "${wait_args[@]}" \
  >/dev/null 2>"$work/err"
grep -q '^rdmashim\[[0-9]*\] info: fd [0-9]* (client) -> shm$' "$work/err" ||
  { cat "$work/err"; fail "the connection did not take shared memory"; }

count() {  # count tcp|shm ITERS: total system calls of both processes
  local out=$work/$1.$2
  if [ "$1" = tcp ]; then
    "$calls" -o "$out" -- "$bin/tcpPingPong" --local --iters "$2" --warmup 1 "${wait_args[@]}"
  else
    RDMASHIM_SPIN_US=0 RDMASHIM_LOG=off \
      "$calls" -o "$out" -- "$bin/rdmashim" run -- "$bin/tcpPingPong" --local --iters "$2" --warmup 1 "${wait_args[@]}"
  fi
}
n=1000 big=4000
t1=$(count tcp $n) t2=$(count tcp $big) s1=$(count shm $n) s2=$(count shm $big)
[ -n "$t1" ] && [ -n "$t2" ] && [ -n "$s1" ] && [ -n "$s2" ] || fail "no strace totals"
per() { awk -v a="$1" -v b="$2" -v n=$((2 * (big - n))) 'BEGIN { printf "%.2f", (b - a) / n }'; }
t=$(per "$t1" "$t2") s=$(per "$s1" "$s2")
echo "$mode: system calls per message (both processes, runs of $n and $big round trips): TCP $t, rdmashim (no spin) $s"
awk -v s="$s" -v t="$t" 'BEGIN { exit !(s <= t + 0.15) }' ||
  { sed -n '1,20p' "$work/shm.$big"; fail "the waiting path costs $s system calls per message, TCP's $t"; }
echo "ok: at most TCP's + 0.15"
