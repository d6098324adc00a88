#!/usr/bin/env bash
# 64-byte ping-pong between two processes in ONE Soft-RoCE guest (qemu TCG,
# rdma_rxe; see tests/softroce/README.md), every row in the same boot so the
# ratios are meaningful on a shared, noisy machine:
#   tcpPingPong                          plain kernel TCP (the baseline)
#   rdmashim run tcpPingPong             the same binary, RDMASHIM_TRANSPORT=verbs
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
set -euo pipefail
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
source "$here/../scripts/lib.sh"
source "$here/../tests/softroce/lib.sh"

size=64 iters=5000 json=no json_file="" cross_iters=2000 cross=yes
usage() { echo "usage: bench/softroce.sh [--size BYTES] [--iters N] [--cross-iters N] [--no-cross] [--json [FILE]]" >&2; exit 2; }
while (($#)); do
	case $1 in
	--size) size=${2:?}; shift 2 ;;
	--iters) iters=${2:?}; shift 2 ;;
	--cross-iters) cross_iters=${2:?}; shift 2 ;;
	--no-cross) cross=no; shift ;;
	--json)
		json=yes
		if [[ -n ${2:-} && $2 != -* ]]; then json_file=$2; shift; fi
		shift ;;
	*) usage ;;
	esac
done
export RDMASHIM_BUILD
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

# Each row: NAME OK RATE P50 P99 REASON. Rates are round trips per second;
# p50/p99 are round-trip times in microseconds.
declare -A ok rate p50 p99 why
pingpong_row() { # NAME NEEDS_VERBS(0|1)
	local c s j t st
	c=$(result "$out" "row.$1.client") s=$(result "$out" "row.$1.server")
	j=$(kv "$c" json) t=$(kv "$c" transport) st=$(kv "$s" transport)
	ok[$1]=0 rate[$1]="" p50[$1]="" p99[$1]=""
	if [[ $(kv "$c" rc) != 0 || -z $(jf "$j" round_trips_per_s) ]]; then
		why[$1]="exit $(kv "$c" rc): $(kv "$c" log | tr '|_' '  ' | cut -c1-120)"
	elif [[ $2 == 1 && ($t != verbs || $st != verbs) ]]; then
		why[$1]="not on verbs: client logged ${t:-nothing}, server ${st:-nothing}"
	else
		ok[$1]=1 rate[$1]=$(jf "$j" round_trips_per_s) p50[$1]=$(jf "$j" p50_us) p99[$1]=$(jf "$j" p99_us)
	fi
}
pingpong_row tcp 0
pingpong_row shim 1
pingpong_row rspreload 0
pingpong_row core 1
# ib_write_lat reports one-way latency (half the round trip of its write
# ping-pong), so: round trips/s = 1e6 / (2 * t_avg), p50 = 2 * t_typical
# (its median), p99 = 2 * its 99% percentile.
c=$(result "$out" row.ib_write_lat.client)
raw=$(kv "$c" raw)
ok[ibl]=0 rate[ibl]="" p50[ibl]="" p99[ibl]=""
if [[ $(kv "$c" rc) == 0 && $raw == *,*,* ]]; then
	IFS=, read -r _ _ _ _ ttyp tavg _ t99 _ <<<"$raw"
	ok[ibl]=1
	rate[ibl]=$(awk -v a="$tavg" 'BEGIN { printf "%.1f", 1e6 / (2 * a) }')
	p50[ibl]=$(awk -v a="$ttyp" 'BEGIN { printf "%.3f", 2 * a }')
	p99[ibl]=$(awk -v a="$t99" 'BEGIN { printf "%.3f", 2 * a }')
	ibl_note="ib_write_lat one-way: t_typical $ttyp us, t_avg $tavg us, 99% $t99 us"
else
	why[ibl]="exit $(kv "$c" rc): $(kv "$c" log | tr '|_' '  ' | cut -c1-120)"
	ibl_note="ib_write_lat failed"
fi

rows=(tcp shim rspreload core ibl)
declare -A label=(
	[tcp]="tcpPingPong (kernel TCP)"
	[shim]="rdmashim run tcpPingPong (verbs)"
	[rspreload]="librspreload tcpPingPong (rsocket)"
	[core]="rdmaPingPong --transport verbs"
	[ibl]="ib_write_lat (perftest) [1]"
)
ratio() { # RATE BASE_NAME -> "12.3x" or "-"
	[[ -n $1 && ${ok[$2]} == 1 ]] || { echo -; return; }
	awk -v a="$1" -v b="${rate[$2]}" 'BEGIN { printf "%.2fx", a / b }'
}
table() {
	printf '\nPing-pong, %s-byte messages, two processes in one Soft-RoCE guest (qemu TCG, %s vCPUs), %s round trips per row\n\n' \
		"$size" "$RDMASHIM_VM_SMP" "$iters"
	printf '%-36s %14s %10s %10s %8s %13s\n' what "round trips/s" "p50 us" "p99 us" "vs TCP" "vs rspreload"
	local r
	for r in "${rows[@]}"; do
		if [[ ${ok[$r]} == 1 ]]; then
			printf '%-36s %14.0f %10.1f %10.1f %8s %13s\n' "${label[$r]}" "${rate[$r]}" "${p50[$r]}" "${p99[$r]}" \
				"$(ratio "${rate[$r]}" tcp)" "$(ratio "${rate[$r]}" rspreload)"
		else
			printf '%-36s failed: %s\n' "${label[$r]}" "${why[$r]}"
		fi
	done
	printf '\n[1] %s; shown as a round trip: rate = 1e6 / (2 x t_avg), p50 = 2 x t_typical, p99 = 2 x 99%%.\n' "$ibl_note"
	printf 'Host load average (1 min) before/after: %s / %s (%s cores; TCG figures collapse when it exceeds them)\n\n' \
		"$load_before" "$load_after" "$(nproc)"
}
to_json() {
	local r sep=""
	printf '{"bench":"softroce","size":%s,"iters":%s,"vcpus":%s,"host_load":[%s,%s],"rows":[' \
		"$size" "$iters" "$RDMASHIM_VM_SMP" "$load_before" "$load_after"
	for r in "${rows[@]}"; do
		if [[ ${ok[$r]} == 1 ]]; then
			printf '%s{"row":"%s","what":"%s","ok":true,"round_trips_per_s":%s,"p50_us":%s,"p99_us":%s,"vs_tcp":%s,"vs_rspreload":%s}' \
				"$sep" "$r" "${label[$r]}" "${rate[$r]}" "${p50[$r]}" "${p99[$r]}" \
				"$(ratio "${rate[$r]}" tcp | tr -d x | sed 's/^-$/null/')" "$(ratio "${rate[$r]}" rspreload | tr -d x | sed 's/^-$/null/')"
		else
			printf '%s{"row":"%s","what":"%s","ok":false,"error":"%s"}' "$sep" "$r" "${label[$r]}" "${why[$r]//\"/\'}"
		fi
		sep=,
	done
	printf ']}\n'
}
if [[ $json == yes && -z $json_file ]]; then
	to_json
else
	table
	[[ -n $json_file ]] && to_json >"$json_file"
fi
[[ $cross == yes ]] || exit 0
xjson=()
[[ $json == yes ]] && xjson=(--json ${json_file:+"$json_file.cross"})
exec "$here/softroce_cross.sh" --size "$size" --iters "$cross_iters" "${xjson[@]}"
