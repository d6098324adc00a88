#!/usr/bin/env bash
# Bulk file transfer between TWO Soft-RoCE guests (qemu TCG, rdma_rxe; see
# tests/softroce/README.md), every row in the same boot so the ratios are
# meaningful on a shared, noisy machine. The same file (random, made in the
# sender's /tmp) goes from guest b to a file in guest a's /tmp through
#   rdma_send FILE -> rdma_recv >FILE     rdmashim's tools, transport found by
#                                         RDMA-CM discovery (must be verbs)
#   rdma_send --transport tcp             the same tools over kernel TCP
#   socat -u, TCP                         kernel TCP, a plain program
#   rcopy                                 rsocket's file copy (rdmacm-utils)
# Each row is timed from starting the sending tool until the receiver says
# the whole file is written (see tests/softroce/guest/cat_bench.sh), and the
# SHA-256 of what arrived must equal the source's. With --runs N the rows go
# round-robin N times and the best time of each counts.
#
# usage: bench/softroce_cat.sh [--size BYTES] [--runs N] [--json [FILE]]
#   --size   file size (default 134217728 = 128 MiB; k/m/g suffixes allowed)
#   --json   print the JSON instead of the table; --json FILE writes it too
# env: RDMASHIM_BUILD, SOFTROCE_CAT_TIMEOUT (vm run2 timeout, default 900 s)
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
source "$here/lib/softroce_bench.sh"

size=134217728 runs=1
bench_opts "bench/softroce_cat.sh [--size BYTES] [--runs N] [--json [FILE]]" size runs -- "$@"
size=$(numfmt --from=iec "${size^^}") || { echo "bench/softroce_cat.sh: --size takes bytes (k/m/g allowed)" >&2; exit 2; }
[[ -x $RDMASHIM_BUILD/bin/rdma_send ]] || { echo "bench/softroce_cat.sh: build first (./scripts/test)" >&2; exit 1; }
command -v socat >/dev/null || ensure_packages socat || { echo "bench/softroce_cat.sh: socat is needed" >&2; exit 1; }

softroce_skip_unless_vm
softroce_stage
load_before=$(cut -d' ' -f1 /proc/loadavg)
rows=(rdma rdma_tcp socat rcopy)
cmd="CAT_BYTES=$size CAT_RUNS=$runs bash $STAGE/guest/cat_bench.sh"
st=0
out=$("$VM" run2 --timeout "${SOFTROCE_CAT_TIMEOUT:-900}" -- "$cmd" -- "$cmd" 2>&1) || st=$?
load_after=$(cut -d' ' -f1 /proc/loadavg)
if ((st != 0)); then
	echo "bench/softroce_cat.sh: the guests failed (vm run2 exit $st):" >&2
	printf '%s\n' "$out" >&2
	exit 1
fi

src=$(result "$out" source)
src_sha=$(kv "$src" sha256) src_bytes=$(kv "$src" bytes)
declare -A ok best why transport note
for r in "${rows[@]}"; do
	ok[$r]=0 best[$r]="" why[$r]="" transport[$r]="" note[$r]=""
	for ((run = 1; run <= runs; run++)); do
		c=$(result "$out" "row.$r.$run.client") s=$(result "$out" "row.$r.$run.server")
		t=$(kv "$s" transport)
		if [[ -z $c || -z $s ]]; then
			why[$r]="no result from the guests (run $run)"
		elif [[ $(kv "$c" rc) != 0 || $(kv "$s" rc) != 0 ]]; then
			why[$r]="exit sender $(kv "$c" rc), receiver $(kv "$s" rc): $(kv "$c" log | tr '|_' '  ' | cut -c1-100) $(kv "$s" log | tr '|_' '  ' | cut -c1-100)"
		elif [[ $(kv "$s" bytes) != "$src_bytes" || $(kv "$s" sha256) != "$src_sha" ]]; then
			why[$r]="data differ: $(kv "$s" bytes) of $src_bytes bytes, sha256 $(kv "$s" sha256) vs $src_sha"
		elif [[ $r == rdma && $t != verbs ]]; then
			why[$r]="not on verbs: rdma_recv reported ${t:-nothing}"
		elif [[ $r == rdma_tcp && $t != tcp* ]]; then
			why[$r]="not on tcp: rdma_recv reported ${t:-nothing}"
		else
			sec=$(kv "$c" seconds)
			if [[ -z ${best[$r]} ]] || awk -v a="$sec" -v b="${best[$r]}" 'BEGIN { exit !(a < b) }'; then
				best[$r]=$sec
			fi
			case $r in
			socat) t=tcp ;;
			rcopy) t=rsocket ;;
			esac
			transport[$r]=$t
			[[ $r == rcopy ]] && note[$r]="rcopy's own figure: $(kv "$c" self_gbit) Gbit/s over $(kv "$c" self_s) s (from after its open to the last ack)"
			continue
		fi
		best[$r]="" # a failed run fails the row
		break
	done
	[[ -n ${best[$r]} ]] && ok[$r]=1
done

mbps() { awk -v b="$src_bytes" -v s="$1" 'BEGIN { printf "%.1f", b / s / 1e6 }'; }
ratio() { # ROW BASE_ROW -> throughput of ROW / throughput of BASE ("1.23x") or "-"
	[[ ${ok[$1]} == 1 && ${ok[$2]} == 1 ]] || { echo -; return; }
	awk -v a="${best[$2]}" -v b="${best[$1]}" 'BEGIN { printf "%.2fx", a / b }'
}
declare -A label=(
	[rdma]="rdma_send FILE | rdma_recv >FILE"
	[rdma_tcp]="  the same, --transport tcp"
	[socat]="socat -u, kernel TCP"
	[rcopy]="rcopy (rsocket)"
)
table() {
	printf '\nFile transfer of %s bytes between two Soft-RoCE guests (qemu TCG, %s vCPU each), best of %s, sha256 checked\n\n' \
		"$src_bytes" "${RDMASHIM_VM_SMP:-1}" "$runs"
	printf '%-36s %-16s %9s %8s %10s %10s\n' what transport "MB/s" seconds "vs socat" "vs rcopy"
	local r
	for r in "${rows[@]}"; do
		if [[ ${ok[$r]} == 1 ]]; then
			printf '%-36s %-16s %9s %8s %10s %10s\n' "${label[$r]}" "${transport[$r]}" "$(mbps "${best[$r]}")" \
				"${best[$r]}" "$(ratio "$r" socat)" "$(ratio "$r" rcopy)"
		else
			printf '%-36s failed: %s\n' "${label[$r]}" "${why[$r]}"
		fi
	done
	[[ -n ${note[rcopy]} ]] && printf '\n%s\n' "${note[rcopy]}"
	printf 'Host load average (1 min) before/after: %s / %s (%s cores; TCG figures collapse when it exceeds them)\n\n' \
		"$load_before" "$load_after" "$(nproc)"
}
to_json() {
	local r sep=""
	printf '{"bench":"softroce_cat","bytes":%s,"runs":%s,"sha256":"%s","host_load":[%s,%s],"rows":[' \
		"$src_bytes" "$runs" "$src_sha" "$load_before" "$load_after"
	for r in "${rows[@]}"; do
		if [[ ${ok[$r]} == 1 ]]; then
			printf '%s{"row":"%s","ok":true,"transport":"%s","seconds":%s,"mb_per_s":%s,"vs_socat":%s,"vs_rcopy":%s}' \
				"$sep" "$r" "${transport[$r]}" "${best[$r]}" "$(mbps "${best[$r]}")" \
				"$(ratio "$r" socat | tr -d x | sed 's/^-$/null/')" "$(ratio "$r" rcopy | tr -d x | sed 's/^-$/null/')"
		else
			printf '%s{"row":"%s","ok":false,"error":"%s"}' "$sep" "$r" "${why[$r]//\"/\'}"
		fi
		sep=,
	done
	printf ']}\n'
}
emit_results
fail=0
for r in "${rows[@]}"; do [[ ${ok[$r]} == 1 ]] || fail=1; done
exit $fail
