#!/usr/bin/env bash
# Many verbs connections from one process (issue 13, "scale on verbs"; not in
# the test suite: minutes under TCG). One client process opens N connections
# (default 1,000) to one server process, both under `rdmashim run` forced
# onto verbs (tests/softroce/guest/scale.sh, many_conns.py), each echoing
# 4 KiB; with all of them open it reports per process: connections on verbs
# and tcp:verbs-limit, registered (pinned) bytes, queue pairs, completion
# queues and memory regions (`rdmashim stat`), resident memory, descriptors,
# and per verbs connection: registered bytes, MRs, and resident memory above
# the plain-TCP run's.
#   small:  RDMASHIM_RING_SIZE=64k: 64 KiB rings (every connection fits)
#   budget: default rings (256 KiB first regions), RDMASHIM_VERBS_MEM=128m:
#           the first ones on verbs, the rest tcp:verbs-limit
#   tcp:    RDMASHIM_TRANSPORT=tcp, the resident-memory baseline
# usage: bench/softroce_scale.sh [--two] [N]
#   --two: server in guest a, client in guest b (1 GiB each); else both in one
#          guest (1 GiB for both ends: about 300 connections fit)
# env: RDMASHIM_BUILD, SCALE_BYTES (4096), SCALE_RING (64k), SCALE_MEM (128m)
set -euo pipefail
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
source "$here/../scripts/lib.sh"
source "$here/../tests/softroce/lib.sh"
two=1
[[ ${1:-} == --two ]] && { two=2; shift; }
n=${1:-1000}
export RDMASHIM_BUILD
softroce_skip_unless_vm
softroce_stage
export RDMASHIM_VM_SMP=${RDMASHIM_VM_SMP:-2}
cmd="SCALE_GUESTS=$two SCALE_N=$n SCALE_BYTES=${SCALE_BYTES:-4096} SCALE_RING=${SCALE_RING:-64k} SCALE_MEM=${SCALE_MEM:-128m} bash $STAGE/guest/scale.sh"
st=0
if ((two == 2)); then
	out=$("$VM" run2 --timeout 1500 -- "$cmd" -- "$cmd" 2>&1) || st=$?
else
	out=$("$VM" run1 --timeout 1500 -- "$cmd" 2>&1) || st=$?
fi
printf '%s\n' "$out" | grep '@ scale' || true
((st == 0)) || { echo "bench/softroce_scale.sh: the guest failed (vm exit $st):" >&2; printf '%s\n' "$out" | tail -40 >&2; exit 1; }
base=$(kv "$(result "$out" scale.tcp.client)" client_rss_kb)
sbase=$(kv "$(result "$out" scale.tcp.server)" server_rss_kb)
printf '\n%s connections from one process, %s guest(s)\n' "$n" "$two"
printf '%-7s %-7s %6s %7s %8s %9s %10s %8s %8s %11s %6s\n' run side verbs limited qps/cqs mrs registered reg/conn mrs/conn rss/conn_kB fds
for r in small budget; do
	for side in client server; do
		l=$(result "$out" "scale.$r.$side")
		b=$base
		[[ $side == server ]] && b=$sbase
		awk -v r="$r" -v side="$side" -v v="$(kv "$l" verbs)" -v lim="$(kv "$l" limit)" \
			-v q="$(kv "$l" ${side}_verbs_qps)" -v c="$(kv "$l" ${side}_verbs_cqs)" -v m="$(kv "$l" ${side}_verbs_mrs)" \
			-v reg="$(kv "$l" ${side}_verbs_registered)" -v rss="$(kv "$l" ${side}_rss_kb)" -v base="$b" \
			-v fds="$(kv "$l" ${side}_fds)" -v n="$n" 'BEGIN {
			vv = v > 0 ? v : 1
			printf "%-7s %-7s %6s %7s %4s/%-4s %8s %9.1fM %7.0fK %8.2f %11.1f %6s\n", r, side, v, lim, q, c, m,
				reg / 1048576, reg / vv / 1024, m / vv, (rss - base) / n, fds }'
	done
	d=$(result "$out" "scale.$r.done")
	echo "        opened and echoed in $(kv "$(result "$out" "scale.$r.client")" secs) s: rc=$(kv "$d" rc) $(kv "$d" json)"
done
echo "(rss/conn_kB: resident memory above the plain-TCP run's, per connection; reg/conn and mrs/conn: per verbs connection)"
