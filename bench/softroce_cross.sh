#!/usr/bin/env bash
# 64-byte ping-pong between TWO Soft-RoCE guests (qemu TCG, rdma_rxe, one
# link; see tests/softroce/README.md), every row in the same boot: guest a
# serves, guest b is the client.
#   tcpPingPong                        plain kernel TCP (the baseline)
#   rdmashim run tcpPingPong (auto)    RDMASHIM_SOFT_VERBS=0: the policy keeps
#                                      it on TCP (core/verbs/policy.h)
#   rdmashim run tcpPingPong (verbs)   the same, verbs asked for (RDMASHIM_SOFT_VERBS=1)
#   librspreload tcpPingPong           rsocket's preload on both ends
#   ib_write_lat                       perftest, raw RDMA write, busy polling
# Each row with its ratio to ib_write_lat and to TCP. Run by bench/softroce.sh
# after its one-guest table; runs alone as well.
#
# usage: bench/softroce_cross.sh [--size BYTES] [--iters N] [--json [FILE]]
# env: RDMASHIM_BUILD, BENCH_CROSS_SMP (vCPUs per guest, default 1: two guests
#      on two host cores), RSPRELOAD (librspreload.so), BENCH_CROSS_REPLAY (a
#      run folder of tests/softroce/vm, runs/<id>: its table again, no boot)
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
source "$here/lib/softroce_bench.sh"

size=64 iters=2000
bench_opts "bench/softroce_cross.sh [--size BYTES] [--iters N] [--json [FILE]]" size iters -- "$@"
[[ -x $RDMASHIM_BUILD/bin/tcpPingPong ]] || { echo "bench/softroce_cross.sh: build first (./scripts/test)" >&2; exit 1; }

export RDMASHIM_VM_SMP=${BENCH_CROSS_SMP:-1}
load_before=$(cut -d' ' -f1 /proc/loadavg)
st=0
if [[ -n ${BENCH_CROSS_REPLAY:-} ]]; then
	# The table of an earlier boot, from its guests' output (vm's runs/<id>).
	out=$(sed 's/^/[a] /' "$BENCH_CROSS_REPLAY/job-a/stdout"; sed 's/^/[b] /' "$BENCH_CROSS_REPLAY/job-b/stdout")
else
	softroce_skip_unless_vm
	softroce_stage
	cmd="BENCH_SIZE=$size BENCH_ITERS=$iters ${RSPRELOAD:+RSPRELOAD=$RSPRELOAD} bash $STAGE/guest/bench_cross.sh"
	out=$("$VM" run2 --timeout 900 -- "$cmd" -- "$cmd" 2>&1) || st=$?
fi
load_after=$(cut -d' ' -f1 /proc/loadavg)
((st == 0)) || { echo "bench/softroce_cross.sh: the guests failed (vm run2 exit $st):" >&2; printf '%s\n' "$out" >&2; exit 1; }

source "$here/lib/softroce_rows.sh"
pingpong_row xrow.tcp tcp ""
pingpong_row xrow.auto auto tcp:policy
pingpong_row xrow.shim shim verbs
pingpong_row xrow.rspreload rspreload ""
ib_write_lat_row xrow.ib_write_lat

rows=(tcp auto shim rspreload ibl)
table() {
	print_rows "Ping-pong, $size-byte messages, between two Soft-RoCE guests (qemu TCG, $RDMASHIM_VM_SMP vCPU each, one link), $iters round trips per row" \
		ibl "vs ibwl" tcp "vs TCP"
	printf '\n'
	for r in auto shim; do
		if [[ -n ${note[$r]:-} ]]; then printf '%s: %s\n' "${label[$r]}" "${note[$r]}"; fi
	done
	printf '[1] ib_write_lat one-way times doubled: rate = 1e6 / (2 x t_avg), p50 = 2 x t_typical, p99 = 2 x 99%%.\n'
	printf 'Host load average (1 min) before/after: %s / %s (%s cores)\n\n' "$load_before" "$load_after" "$(nproc)"
}
to_json() {
	rows_json "$(printf '"bench":"softroce_cross","size":%s,"iters":%s,"vcpus_per_guest":%s,"host_load":[%s,%s]' \
		"$size" "$iters" "$RDMASHIM_VM_SMP" "$load_before" "$load_after")" ibl vs_ib_write_lat tcp vs_tcp
}
emit_results
exit 0
