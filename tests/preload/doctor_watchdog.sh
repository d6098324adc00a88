#!/usr/bin/env bash
# rdmashim doctor never hangs: a step that blocks (injected here) ends the
# command with exit 124 and names the step, within the watchdog timeout.
set -uo pipefail
bin=${RDMASHIM_BUILD:?set RDMASHIM_BUILD}/bin
start=$(date +%s)
out=$(RDMASHIM_DOCTOR_STALL_AT=devices timeout 30 "$bin/rdmashim" doctor --timeout 2 2>&1)
rc=$?
took=$(( $(date +%s) - start ))
echo "$out"
[ "$rc" -eq 124 ] || { echo "FAIL: expected exit 124, got $rc"; exit 1; }
grep -q "did not return within 2 s" <<<"$out" || { echo "FAIL: no watchdog message"; exit 1; }
[ "$took" -lt 10 ] || { echo "FAIL: took ${took}s"; exit 1; }
echo "ok: blocked step reported with exit 124 after ${took}s"
