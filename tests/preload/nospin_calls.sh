#!/usr/bin/env bash
# The waiting path costs no more system calls per message than TCP's
# (issue 11, part 3): a 64 B ping-pong with RDMASHIM_SPIN_US=0 (every wait
# sleeps), both processes under rdmashim, against plain TCP, counted with
# strace -f -c. MODE is the ping-pong's --wait: block (a blocking recv: TCP
# pays the send and the recv) or poll (a non-blocking socket and the
# program's own poll() before each recv; epoll works too, see CMakeLists).
#
# Before this test, a sleeping reader cost the peer's ring (a datagram
# write), its poll() and a read that drained the ring: 3 calls per message
# against TCP's 2 with --wait block.
#
# usage: nospin_calls.sh block|poll|epoll   (env: RDMASHIM_BUILD)
set -euo pipefail
mode=$1
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
source "$(dirname "$0")/../../scripts/lib.sh"
command -v strace >/dev/null || ensure_packages strace >/dev/null 2>&1 ||
  { echo "SKIP: strace is missing and cannot be installed"; exit 77; }

# The connection must really take shm (so this fails with RDMASHIM_TRANSPORT=tcp).
RDMASHIM_SPIN_US=0 RDMASHIM_LOG=info "$bin/rdmashim" run -- "$bin/tcpPingPong" --local --wait "$mode" \
  --iters 200 >/dev/null 2>"$work/err"
for side in client server; do
  grep -q "^rdmashim\[[0-9]*\] info: fd [0-9]* ($side) -> shm$" "$work/err" ||
    { cat "$work/err"; fail "the $side did not upgrade"; }
done

calls() { awk '/^-+/ { sep++; next } sep == 2 && $NF == "total" { print $(NF-2) ~ /^[0-9]+$/ && $(NF-1) ~ /^[0-9]+$/ ? $(NF-2) : $(NF-1) }' "$1"; }
count() {  # count tcp|shm ROUND_TRIPS: total system calls of both processes
  local out=$work/$1.$2
  if [ "$1" = tcp ]; then
    strace -f -c -o "$out" "$bin/tcpPingPong" --local --wait "$mode" --iters "$2" --warmup 1 >/dev/null
  else
    RDMASHIM_SPIN_US=0 RDMASHIM_LOG=off strace -f -c -o "$out" \
      "$bin/rdmashim" run -- "$bin/tcpPingPong" --local --wait "$mode" --iters "$2" --warmup 1 >/dev/null
  fi
  calls "$out"
}
# Runs of n and big round trips: their difference leaves out what a process
# and a connection cost once. Two messages per round trip.
n=1000 big=6000
t1=$(count tcp $n) t2=$(count tcp $big) s1=$(count shm $n) s2=$(count shm $big)
[ -n "$t1" ] && [ -n "$t2" ] && [ -n "$s1" ] && [ -n "$s2" ] || fail "no strace totals"
per() { awk -v a="$1" -v b="$2" -v m=$((2 * (big - n))) 'BEGIN { printf "%.2f", (b - a) / m }'; }
t=$(per "$t1" "$t2") s=$(per "$s1" "$s2")
echo "system calls per message, --wait $mode, no spinning (both processes): TCP $t, rdmashim $s"
awk -v s="$s" -v t="$t" 'BEGIN { exit !(s <= t) }' ||
  { sed -n '1,15p' "$work/shm.$big"; fail "rdmashim's waiting path costs $s system calls per message, TCP's $t"; }
echo "ok: at most TCP's system calls per message"
