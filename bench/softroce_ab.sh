#!/usr/bin/env bash
# Two builds' 64 B verbs ping-pong in ONE Soft-RoCE guest, alternating in the
# same boot beside ib_write_lat (a TCG guest's figures move by a third from
# boot to boot and with the host's load: compare builds only this way).
# Rows: rdmaPingPong --transport verbs (core API) and tcpPingPong under
# `rdmashim run` (preload), each of build A then build B, per round.
# usage: bench/softroce_ab.sh [--iters N] [--rounds R] BUILD_A [BUILD_B]
#   BUILD_B defaults to RDMASHIM_BUILD (or ./build); each a cmake build folder
set -euo pipefail
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
source "$here/lib/softroce_bench.sh"
iters=20000 rounds=3
args=()
while (($#)); do
	case $1 in
	--iters) iters=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	-*) echo "usage: bench/softroce_ab.sh [--iters N] [--rounds R] BUILD_A [BUILD_B]" >&2; exit 2 ;;
	*) args+=("$1"); shift ;;
	esac
done
((${#args[@]} >= 1)) || { echo "usage: bench/softroce_ab.sh [--iters N] [--rounds R] BUILD_A [BUILD_B]" >&2; exit 2; }
a=$(readlink -f "${args[0]}")
RDMASHIM_BUILD=$(readlink -f "${args[1]:-${RDMASHIM_BUILD:-$here/../build}}")
for b in "$a" "$RDMASHIM_BUILD"; do
	for t in rdmashim tcpPingPong rdmaPingPong lib/librdmashim.so; do
		[[ $t == lib/* ]] && f=$b/$t || f=$b/bin/$t
		[[ -e $f ]] || { echo "bench/softroce_ab.sh: $f missing (build first)" >&2; exit 1; }
	done
done
softroce_skip_unless_vm
softroce_stage
# Build A beside B, in the same layout (`rdmashim run` finds ../lib).
mkdir -p "$STAGE/a/bin" "$STAGE/a/lib"
for t in rdmashim tcpPingPong rdmaPingPong; do install -m 755 "$a/bin/$t" "$STAGE/a/bin/$t"; done
install -m 644 "$a/lib/librdmashim.so" "$STAGE/a/lib/librdmashim.so"
export RDMASHIM_VM_SMP=${RDMASHIM_VM_SMP:-2}
load_before=$(cut -d' ' -f1 /proc/loadavg)
st=0
out=$("$VM" run1 --timeout 900 -- "AB_ITERS=$iters AB_ROUNDS=$rounds bash $STAGE/guest/ab.sh" 2>&1) || st=$?
((st == 0)) || { echo "bench/softroce_ab.sh: the guest failed (vm exit $st):" >&2; printf '%s\n' "$out" | tail -30 >&2; exit 1; }
printf '64 B verbs ping-pong, one guest (%s vCPUs), %s round trips per run, host load %s before, %s after\n' \
	"$RDMASHIM_VM_SMP" "$iters" "$load_before" "$(cut -d' ' -f1 /proc/loadavg)"
printf 'A = %s\nB = %s\n' "$a" "$RDMASHIM_BUILD"
rows=""
for ((r = 1; r <= rounds; r++)); do
	rate() { kv "$(result "$out" "ab.$r.$1")" rate; }
	rows+="$r $(rate ibl) $(rate core_a) $(rate core_b) $(rate shim_a) $(rate shim_b)"$'\n'
done
# A failed run prints as 0 and is left out of the mean.
awk 'function f(x) { return x == "" ? 0 : x }
	function ratio(b, a) { return a > 0 && b > 0 ? sprintf("%.2fx", b / a) : "-" }
	BEGIN { printf "%-6s %12s %10s %10s %10s %10s %9s %9s %9s\n", "round", "ib_write_lat", "core_A", "core_B", "shim_A", "shim_B", "core B/A", "shim B/A", "shim_B/ibl" }
	NF {
		for (c = 2; c <= 6; c++) { v[c] = f($c); if (v[c] > 0) { sum[c] += v[c]; cnt[c]++ } }
		printf "%-6s %12.0f %10.0f %10.0f %10.0f %10.0f %9s %9s %9s\n", $1, v[2], v[3], v[4], v[5], v[6], ratio(v[4], v[3]), ratio(v[6], v[5]), ratio(v[6], v[2])
	}
	END {
		for (c = 2; c <= 6; c++) m[c] = cnt[c] ? sum[c] / cnt[c] : 0
		printf "%-6s %12.0f %10.0f %10.0f %10.0f %10.0f %9s %9s %9s\n", "mean", m[2], m[3], m[4], m[5], m[6], ratio(m[4], m[3]), ratio(m[6], m[5]), ratio(m[6], m[2])
	}' <<<"$rows"
