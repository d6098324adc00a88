#!/usr/bin/env bash
# softroce.faults: in ONE guest, every verbs setup step (device, PD, MR,
# completion channel, CQ, QP, the INIT/RTR/RTS transitions, GID, and the
# server's RDMA-CM advertisement) made to fail with RDMASHIM_TEST_FAULT on the
# side that runs it (guest/faults.sh, judged by tests/preload/faults.sh); and
# QP creation and the RTR transition made to block for good: the watchdog
# leaves the connection on TCP. And a close after the peer exited returns at
# once (close-peer-gone, guest/close_peer_gone.py).
# Passes when every case passed and all of them ran. Exit 77 (skip) when no
# guest can run.
# env: RDMASHIM_BUILD (build folder)
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"

softroce_skip_unless_vm
softroce_stage
install -m 755 "$SOFTROCE_DIR/../preload/faults.sh" "$STAGE/guest/preload_faults.sh"
export RDMASHIM_VM_SMP=${RDMASHIM_VM_SMP:-2}
st=0
out=$("$VM" run1 --timeout 800 -- "bash $STAGE/guest/faults.sh" 2>&1) || st=$?
printf '%s\n' "$out" | sed 's/^/  | /'

expected=32 # none, close-peer-gone, 9 + 2 client steps, 11 server ibv steps, 4 server cm steps, 2 x 2 blocking steps (guest/faults.sh)
((st == 0)) || { echo "FAIL: vm run1 exited $st"; fail=1; }
cases=$(sed -n 's/^\(\[[ab]\] \)\{0,1\}@ \(fault\.[^ ]*\) rc=\([0-9]*\).*/\2 \3/p' <<<"$out")
ran=$(grep -c . <<<"$cases" || true)
bad=$(awk '$2 != 0 { print $1 }' <<<"$cases")
[[ -z $bad ]] || { echo "FAIL: $(tr '\n' ' ' <<<"$bad")"; fail=1; }
((ran == expected)) || { echo "FAIL: $ran cases reported, expected $expected"; fail=1; }
grep -q '@ fault\.done' <<<"$out" || { echo "FAIL: the guest did not finish"; fail=1; }
echo "cases reported: $ran"
finish "softroce.faults"
