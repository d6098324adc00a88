#!/usr/bin/env bash
# 64-byte ping-pong between two processes in ONE Soft-RoCE guest (qemu TCG,
# rdma_rxe; see tests/softroce/README.md), every row in the same boot so the
# ratios are meaningful on a shared, noisy machine:
#   tcpPingPong                          plain kernel TCP (the baseline)
#   rdmashim run tcpPingPong             the same binary, RDMASHIM_TRANSPORT=verbs
#     ..., RDMASHIM_SPIN_US=0            the same with every wait asleep (no spin)
#   librspreload tcpPingPong             the same binary under rsocket's preload
#                                        (both ends: a plain client cannot reach it)
#   rdmaPingPong --transport verbs       rdmashim's core API
#   ib_write_lat                         perftest, raw RDMA write, busy polling
# A row that fails (or an rdmashim row that did not run on verbs) is printed as
# failed with the reason; the other rows still count.
# Then bench/softroce_cross.sh: the ping-pong between TWO guests in one boot
# (TCP, rdmashim left to auto, rdmashim on verbs, librspreload, ib_write_lat).
#
# usage: bench/softroce.sh [--size BYTES] [--iters N] [--cross-iters N] [--no-cross] [--json [FILE]]
#   --json        print the JSON instead of the table (one object per table, one per line)
#   --json FILE   print the table and write the JSON to FILE (the two-guest one to FILE.cross)
#   --cross-iters round trips per two-guest row (default 2000)
# env: RDMASHIM_BUILD, RDMASHIM_VM_SMP (vCPUs, default 2), RSPRELOAD (librspreload.so)
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
source "$here/lib/softroce_bench.sh"

size=64 iters=5000 cross_iters=2000 cross=yes
bench_opts "bench/softroce.sh [--size BYTES] [--iters N] [--cross-iters N] [--no-cross] [--json [FILE]]" size iters cross-iters no-cross:cross=no -- "$@"
[[ -x $RDMASHIM_BUILD/bin/tcpPingPong ]] || { echo "bench/softroce.sh: build first (./scripts/test)" >&2; exit 1; }

softroce_skip_unless_vm
softroce_stage
# 2 vCPUs: both ends of each ping-pong busy-poll (ib_write_lat always does);
# on one vCPU they would only take turns at scheduler ticks.
export RDMASHIM_VM_SMP=${RDMASHIM_VM_SMP:-2}
# TCG guests are very sensitive to other work on the host's cores: record the
# host's load average around the run, to read the figures with.
load_before=$(cut -d' ' -f1 /proc/loadavg)
st=0
out=$("$VM" run1 --timeout 600 -- \
	"BENCH_SIZE=$size BENCH_ITERS=$iters ${RSPRELOAD:+RSPRELOAD=$RSPRELOAD} bash $STAGE/guest/bench.sh" 2>&1) || st=$?
load_after=$(cut -d' ' -f1 /proc/loadavg)
((st == 0)) || { echo "bench/softroce.sh: the guest failed (vm run1 exit $st):" >&2; printf '%s\n' "$out" >&2; exit 1; }

source "$here/lib/softroce_rows.sh"
pingpong_row row.tcp tcp ""
pingpong_row row.shim shim verbs
pingpong_row row.shim_sleep sleep verbs
pingpong_row row.rspreload rspreload ""
pingpong_row row.core core verbs
ib_write_lat_row row.ib_write_lat

rows=(tcp shim sleep rspreload core ibl)
table() {
	print_rows "Ping-pong, $size-byte messages, two processes in one Soft-RoCE guest (qemu TCG, $RDMASHIM_VM_SMP vCPUs), $iters round trips per row" \
		tcp "vs TCP" rspreload "vs rspreload"
	printf '\n[1] %s; shown as a round trip: rate = 1e6 / (2 x t_avg), p50 = 2 x t_typical, p99 = 2 x 99%%.\n' "$ibl_note"
	printf 'Host load average (1 min) before/after: %s / %s (%s cores; TCG figures collapse when it exceeds them)\n\n' \
		"$load_before" "$load_after" "$(nproc)"
}
to_json() {
	rows_json "$(printf '"bench":"softroce","size":%s,"iters":%s,"vcpus":%s,"host_load":[%s,%s]' \
		"$size" "$iters" "$RDMASHIM_VM_SMP" "$load_before" "$load_after")" tcp vs_tcp rspreload vs_rspreload
}
emit_results
[[ $cross == yes ]] || exit 0
xjson=()
[[ $json == yes ]] && xjson=(--json ${json_file:+"$json_file.cross"})
exec "$here/softroce_cross.sh" --size "$size" --iters "$cross_iters" "${xjson[@]}"
