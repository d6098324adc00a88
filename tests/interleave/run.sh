#!/usr/bin/env bash
# The long run of the interleaving harness.
#   tests/interleave/run.sh --seeds 100000 [--first N] [--jobs J] [--include-known] [...]
# Defaults: --first 1, --jobs $(nproc), and the seeds of known bugs skipped
# (README.md). Failures print their seed and replay command as they come; the
# summary at the end lists every failing seed.
# env: RDMASHIM_BUILD (default: build/ at the top of the tree)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${RDMASHIM_BUILD:-$here/../../build}
have_first=0 have_jobs=0
for a in "$@"; do
  [ "$a" = --first ] && have_first=1
  [ "$a" = --jobs ] && have_jobs=1
done
extra=()
[ $have_first = 1 ] || extra+=(--first 1)
[ $have_jobs = 1 ] || extra+=(--jobs "$(nproc)")
exec "$build/bin/interleave_run" --peer "$build/bin/interleave_peer" --lib "$build/lib/librdmashim.so" \
  --exclude "$here/known_failing.txt" "${extra[@]}" "$@"
