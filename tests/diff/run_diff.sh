#!/usr/bin/env bash
# Differential test driver. For each scenario: runs `diff_scenarios NAME` on
# plain TCP and under `rdmashim run --log info --`, compares the two
# transcripts, and checks that the rdmashim run reported its connections on
# shm (at least the scenario's min_shm "-> shm" lines, at most max_tcp
# "-> tcp:..." lines). Prints `ok NAME` or `FAIL NAME: why` and the diff.
#
# usage: run_diff.sh [--repeat N] [--plain-only] [--keep DIR] [NAME...]
#   no NAME:      every scenario (diff_scenarios --list, then the fortify ones)
#   --repeat N:   run the plain side N times; a plain transcript that changes
#                 between runs is a broken scenario (FAIL ... not deterministic)
#   --plain-only: only the plain runs (validates the scenarios against the kernel)
#   --keep DIR:   keep every transcript and stderr in DIR/NAME/
# env: RDMASHIM_BUILD (the build folder; default: ../../build from here)
#      DIFF_RUN_TIMEOUT (seconds per run, default 30)
#      DIFF_WRAP (a command prefix for both sides, e.g. an older kernel:
#                 "seccomp_run --enosys epoll_pwait2 --")
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${RDMASHIM_BUILD:-$here/../../build}
build=$(cd "$build" && pwd)
bin=$build/bin/diff_scenarios
shim=$build/bin/rdmashim
run_timeout=${DIFF_RUN_TIMEOUT:-30}
repeat=1 plain_only=0 keep=""
names=()
while [ $# -gt 0 ]; do
  case $1 in
    --repeat) repeat=$2; shift 2 ;;
    --plain-only) plain_only=1; shift ;;
    --keep) keep=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) names+=("$1"); shift ;;
  esac
done
for b in "$bin" "${bin}_fortify" "$shim"; do
  [ -x "$b" ] || { echo "FAIL: $b is missing: build first"; exit 2; }
done
if [ ${#names[@]} -eq 0 ]; then
  mapfile -t names < <({ "$bin" --list; "${bin}_fortify" --list; } | awk '{print $1}')
fi

exe_for() { case $1 in fortify_*) echo "${bin}_fortify" ;; *) echo "$bin" ;; esac; }

# Runs one side: $1 = out prefix, rest = command. Records the exit code.
read -r -a wrap <<<"${DIFF_WRAP:-}"
run_side() {
  local out=$1; shift
  timeout -k 5 "$run_timeout" "${wrap[@]}" "$@" >"$out.out" 2>"$out.err"
  echo $? >"$out.rc"
}

indent() { sed 's/^/    /'; }

total=0 failed=0
for name in "${names[@]}"; do
  total=$((total + 1))
  exe=$(exe_for "$name")
  info=$("$exe" --list | awk -v n="$name" '$1 == n')
  if [ -z "$info" ]; then
    echo "FAIL $name: no such scenario"; failed=$((failed + 1)); continue
  fi
  read -r _ min_shm max_tcp <<<"$info"
  work=$(mktemp -d)
  why=()
  details=""

  if [[ $name == fortify_* ]]; then
    syms=$(nm -D --undefined-only "$exe" 2>/dev/null)
    for s in __read_chk __recv_chk __recvfrom_chk __poll_chk __ppoll_chk; do
      grep -qw "$s" <<<"$syms" || why+=("the fortified binary does not reference $s")
    done
  fi

  # Plain TCP: the reference, and a check of the scenario itself.
  for i in $(seq 1 "$repeat"); do
    run_side "$work/plain.$i" env -u LD_PRELOAD "$exe" "$name" </dev/null
    if [ "$(cat "$work/plain.$i.rc")" != 0 ] || grep -q '^HANG' "$work/plain.$i.out"; then
      why+=("plain run $i failed (rc $(cat "$work/plain.$i.rc")): the scenario is broken")
      details+=$'--- plain transcript\n'"$(cat "$work/plain.$i.out")"$'\n--- plain stderr\n'"$(tail -n 20 "$work/plain.$i.err")"$'\n'
      break
    fi
    if grep -qE 'FATAL|HANG|killed by|exit=[1-9]' "$work/plain.$i.out"; then
      why+=("plain run $i has FATAL/HANG/killed/exit lines: the scenario is broken")
      details+="$(grep -E 'FATAL|HANG|killed by|exit=[1-9]' "$work/plain.$i.out")"$'\n'
    fi
    if [ "$i" -gt 1 ] && ! cmp -s "$work/plain.1.out" "$work/plain.$i.out"; then
      why+=("plain transcript not deterministic (run 1 vs run $i)")
      details+="$(diff -u "$work/plain.1.out" "$work/plain.$i.out" | tail -n +3)"$'\n'
      break
    fi
  done

  if [ "$plain_only" = 0 ] && [ ${#why[@]} -eq 0 ]; then
    run_side "$work/shim" "$shim" run --log info -- "$exe" "$name" </dev/null
    rc=$(cat "$work/shim.rc")
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      why+=("hang: the rdmashim run was killed after ${run_timeout}s")
    elif grep -q '^HANG' "$work/shim.out"; then
      why+=("hang: $(grep '^HANG' "$work/shim.out" | sed 's/^HANG: //')")
    elif grep -qE 'killed by SIGALRM|HANG: still running|did not arrive in time' "$work/shim.out"; then
      why+=("hang: $(grep -oE '^(\[[^]]*\] )?[^ ]* (killed by SIGALRM|HANG: still running)|^\[[^]]*\] FATAL: ctl: the other end did not arrive' "$work/shim.out" | sort -u | xargs)")
    fi
    if grep -qE 'killed by SIG(SEGV|BUS|ABRT|ILL|FPE)' "$work/shim.out"; then
      why+=("crash: $(grep -oE '[^ ]* killed by SIG(SEGV|BUS|ABRT|ILL|FPE)' "$work/shim.out" | sort -u | xargs)")
    fi
    if ! cmp -s "$work/plain.1.out" "$work/shim.out"; then
      why+=("transcripts differ")
      details+="$(diff -u --label plain --label rdmashim "$work/plain.1.out" "$work/shim.out" | tail -n +3)"$'\n'
    fi
    shm=$(grep -c -- '-> shm$' "$work/shim.err")
    tcp=$(grep -c -- '-> tcp' "$work/shim.err")
    if [ "$shm" -lt "$min_shm" ]; then
      why+=("only $shm connection end(s) reported '-> shm', expected at least $min_shm")
    fi
    if [ "$tcp" -gt "$max_tcp" ]; then
      why+=("fallback: $tcp connection end(s) stayed TCP ($(grep -o -- '-> tcp[^ ]*' "$work/shim.err" | sort | uniq -c | xargs))")
    fi
    if [ ${#why[@]} -gt 0 ]; then
      details+=$'--- rdmashim stderr (last 15 lines)\n'"$(tail -n 15 "$work/shim.err")"$'\n'
    fi
  fi

  if [ ${#why[@]} -eq 0 ]; then
    if [ "$plain_only" = 1 ]; then echo "ok $name (plain, $repeat run(s))"; else echo "ok $name"; fi
  else
    failed=$((failed + 1))
    (IFS=';'; echo "FAIL $name: ${why[*]}" | sed 's/;/; /g')
    [ -n "$details" ] && printf '%s' "$details" | indent
  fi
  if [ -n "$keep" ]; then mkdir -p "$keep/$name" && cp "$work"/* "$keep/$name/"; fi
  rm -rf "$work"
done
[ "$total" -gt 1 ] && echo "$((total - failed)) of $total scenarios ok"
[ "$failed" -eq 0 ]
