#!/usr/bin/env bash
# Replays seeds of the interleaving harness, verbosely (plan, outcomes, time).
#   tests/interleave/run_seed.sh SEED [SEED...] [harness options, e.g. --repeat 20]
# A seed runs the same plan and the same library perturbations every time;
# the kernel's scheduling is not seeded, so a race may need --repeat.
# env: RDMASHIM_BUILD (default: build/ at the top of the tree)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${RDMASHIM_BUILD:-$here/../../build}
args=()
while [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; do args+=(--seed "$1"); shift; done
[ ${#args[@]} -gt 0 ] || { echo "usage: $0 SEED [SEED...] [interleave_run options]" >&2; exit 2; }
exec "$build/bin/interleave_run" --peer "$build/bin/interleave_peer" --lib "$build/lib/librdmashim.so" \
  "${args[@]}" --verbose "$@"
