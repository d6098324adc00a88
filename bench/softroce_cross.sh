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
set -euo pipefail
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
source "$here/../scripts/lib.sh"
source "$here/../tests/softroce/lib.sh"

size=64 iters=2000 json=no json_file=""
usage() { echo "usage: bench/softroce_cross.sh [--size BYTES] [--iters N] [--json [FILE]]" >&2; exit 2; }
while (($#)); do
	case $1 in
	--size) size=${2:?}; shift 2 ;;
	--iters) iters=${2:?}; shift 2 ;;
	--json)
		json=yes
		if [[ -n ${2:-} && $2 != -* ]]; then json_file=$2; shift; fi
		shift ;;
	*) usage ;;
	esac
done
export RDMASHIM_BUILD
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

# Each row: OK RATE P50 P99 WHY (rates in round trips/s, times in us).
declare -A ok rate p50 p99 why note
row() { # NAME EXPECTED_CLIENT_TRANSPORT ("" for any)
	local c s j t st w
	c=$(result "$out" "xrow.$1.client") s=$(result "$out" "xrow.$1.server")
	j=$(kv "$c" json) t=$(kv "$c" transport) st=$(kv "$s" transport)
	ok[$1]=0 note[$1]=""
	if [[ $(kv "$c" rc) != 0 || -z $(jf "$j" round_trips_per_s) ]]; then
		why[$1]="exit $(kv "$c" rc): $(kv "$c" log | tr '|_' '  ' | cut -c1-120)"
	elif [[ -n $2 && $t != "$2" ]]; then
		why[$1]="client logged ${t:-nothing} (server ${st:-nothing}), expected $2"
	elif [[ $2 == verbs && $st != verbs ]]; then
		why[$1]="server logged ${st:-nothing}, expected verbs"
	else
		ok[$1]=1 rate[$1]=$(jf "$j" round_trips_per_s) p50[$1]=$(jf "$j" p50_us) p99[$1]=$(jf "$j" p99_us)
		if [[ -n $t ]]; then
			w=$(kv "$c" why)
			note[$1]="client $t${w:+ (${w//_/ })}, server $st"
		fi
	fi
}
row tcp ""
row auto tcp:policy
row shim verbs
row rspreload ""
# ib_write_lat: one-way latency, half its write ping-pong's round trip.
c=$(result "$out" xrow.ib_write_lat.client)
raw=$(kv "$c" raw)
ok[ibl]=0
if [[ $(kv "$c" rc) == 0 && $raw == *,*,* ]]; then
	IFS=, read -r _ _ _ _ ttyp tavg _ t99 _ <<<"$raw"
	ok[ibl]=1
	rate[ibl]=$(awk -v a="$tavg" 'BEGIN { printf "%.1f", 1e6 / (2 * a) }')
	p50[ibl]=$(awk -v a="$ttyp" 'BEGIN { printf "%.3f", 2 * a }')
	p99[ibl]=$(awk -v a="$t99" 'BEGIN { printf "%.3f", 2 * a }')
else
	why[ibl]="exit $(kv "$c" rc): $(kv "$c" log | tr '|_' '  ' | cut -c1-120)"
fi

rows=(tcp auto shim rspreload ibl)
declare -A label=(
	[tcp]="tcpPingPong (kernel TCP)"
	[auto]="rdmashim run tcpPingPong (auto)"
	[shim]="rdmashim run tcpPingPong (verbs)"
	[rspreload]="librspreload tcpPingPong (rsocket)"
	[ibl]="ib_write_lat (perftest) [1]"
)
ratio() { # RATE BASE_NAME -> "0.38x" or "-"
	[[ -n $1 && ${ok[$2]} == 1 ]] || { echo -; return; }
	awk -v a="$1" -v b="${rate[$2]}" 'BEGIN { printf "%.2fx", a / b }'
}
table() {
	printf '\nPing-pong, %s-byte messages, between two Soft-RoCE guests (qemu TCG, %s vCPU each, one link), %s round trips per row\n\n' \
		"$size" "$RDMASHIM_VM_SMP" "$iters"
	printf '%-36s %14s %10s %10s %9s %8s\n' what "round trips/s" "p50 us" "p99 us" "vs ibwl" "vs TCP"
	local r
	for r in "${rows[@]}"; do
		if [[ ${ok[$r]} == 1 ]]; then
			printf '%-36s %14.0f %10.1f %10.1f %9s %8s\n' "${label[$r]}" "${rate[$r]}" "${p50[$r]}" "${p99[$r]}" \
				"$(ratio "${rate[$r]}" ibl)" "$(ratio "${rate[$r]}" tcp)"
		else
			printf '%-36s failed: %s\n' "${label[$r]}" "${why[$r]}"
		fi
	done
	printf '\n'
	for r in auto shim; do
		if [[ -n ${note[$r]:-} ]]; then printf '%s: %s\n' "${label[$r]}" "${note[$r]}"; fi
	done
	printf '[1] ib_write_lat one-way times doubled: rate = 1e6 / (2 x t_avg), p50 = 2 x t_typical, p99 = 2 x 99%%.\n'
	printf 'Host load average (1 min) before/after: %s / %s (%s cores)\n\n' "$load_before" "$load_after" "$(nproc)"
}
to_json() {
	local r sep=""
	printf '{"bench":"softroce_cross","size":%s,"iters":%s,"vcpus_per_guest":%s,"host_load":[%s,%s],"rows":[' \
		"$size" "$iters" "$RDMASHIM_VM_SMP" "$load_before" "$load_after"
	for r in "${rows[@]}"; do
		if [[ ${ok[$r]} == 1 ]]; then
			printf '%s{"row":"%s","what":"%s","ok":true,"round_trips_per_s":%s,"p50_us":%s,"p99_us":%s,"vs_ib_write_lat":%s,"vs_tcp":%s}' \
				"$sep" "$r" "${label[$r]}" "${rate[$r]}" "${p50[$r]}" "${p99[$r]}" \
				"$(ratio "${rate[$r]}" ibl | tr -d x | sed 's/^-$/null/')" "$(ratio "${rate[$r]}" tcp | tr -d x | sed 's/^-$/null/')"
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
exit 0
