#!/usr/bin/env bash
# Where the 64 B verbs ping-pong spends its CPU, in ONE Soft-RoCE guest:
# ib_write_lat, the core API and the preload, each under a system-wide
# `perf record` (tests/softroce/guest/profile.sh), printed as per-command
# and per-symbol shares. Needs linux-perf (installed when run as root).
# usage: bench/softroce_profile.sh [--iters N] [--top K]
set -euo pipefail
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
source "$here/lib/softroce_bench.sh"
iters=20000 top=40
bench_opts "bench/softroce_profile.sh [--iters N] [--top K]" iters top -- "$@"
ensure_packages linux-perf
softroce_skip_unless_vm
softroce_stage
export RDMASHIM_VM_SMP=${RDMASHIM_VM_SMP:-2}
st=0
out=$("$VM" run1 --timeout 900 -- "PROF_ITERS=$iters PROF_TOP=$top bash $STAGE/guest/profile.sh" 2>&1) || st=$?
((st == 0)) || { echo "bench/softroce_profile.sh: the guest failed (vm exit $st):" >&2; printf '%s\n' "$out" | tail -30 >&2; exit 1; }
for row in ibl core shim; do
	printf '== %s: %s round trips/s\n' "$row" "$(kv "$(result "$out" "profile.$row")" rate)"
	sed -n "s/^@@ $row\.dso /  /p" <<<"$out"
	sed -n "s/^@@ $row\.sym /  /p" <<<"$out"
done
