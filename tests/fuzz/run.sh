#!/usr/bin/env bash
# Runs the libFuzzer targets from their seed corpora (corpus/<target>/).
#
# usage: run.sh [--minutes M | --seconds S] [--bin DIR] [--keep] [TARGET...]
#   --minutes M: the whole run takes about M minutes, shared evenly by the
#                targets (the long run: run.sh --minutes 60)
#   --seconds S: each target runs S seconds (default 20: the ctest run)
#   --bin DIR:   where the fuzz binaries are; default: build-fuzz/bin, built
#                first with the "fuzz" CMake preset if missing
#   --keep:      grow a working corpus in build-fuzz/corpus/<target> across
#                runs (always on with --minutes); otherwise a scratch copy
#   no TARGET:   all of them
# A crash, leak, UB or timeout leaves its input in build-fuzz/findings/ and
# fails the run; replay it with: build-fuzz/bin/TARGET FILE
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${RDMASHIM_FUZZ_DIR:-$root/build-fuzz}
all=(fuzz_wire fuzz_server fuzz_client fuzz_ring)
seconds=20 minutes="" bin="" keep=0 targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) minutes=$2; keep=1; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
[ -n "$minutes" ] && seconds=$((minutes * 60 / ${#targets[@]}))
if [ -z "$bin" ]; then
  bin=$out/bin
  if [ ! -x "$bin/${targets[0]}" ]; then
    (cd "$root" && cmake --preset fuzz >/dev/null && cmake --build "$out" -j2 --target fuzz_all >/dev/null)
  fi
fi

mkdir -p "$out/findings"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
for t in "${targets[@]}"; do
  [ -x "$bin/$t" ] || { echo "FAIL $t: $bin/$t is missing"; failed=1; continue; }
  if [ "$keep" = 1 ]; then corpus=$out/corpus/$t; else corpus=$scratch/$t; fi
  mkdir -p "$corpus"
  cp -n "$here/corpus/$t/"* "$corpus/" 2>/dev/null || true
  log=$scratch/$t.log
  # rss/timeout: a leak or a hang is a finding too. One process: 2-core CI.
  if ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$bin/$t" -max_total_time="$seconds" -timeout=10 \
       -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
       -artifact_prefix="$out/findings/$t-" "$corpus" >"$log" 2>&1; then
    runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 runs in \2 s/p' "$log" | tail -n 1)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -n 1)
    echo "ok $t: ${runs:-?} ($cov)"
  else
    failed=1
    echo "FAIL $t: a finding (input in $out/findings/, replay: $bin/$t FILE)"
    grep -E '^==[0-9]+==ERROR|^SUMMARY|runtime error|Test unit written' "$log" | head -n 10 | sed 's/^/    /'
    tail -n 40 "$log" | sed 's/^/    /'
  fi
done
exit "$failed"
