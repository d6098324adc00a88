#!/usr/bin/env bash
# In ONE guest (run by ../faults.sh): every verbs setup step made to fail
# (RDMASHIM_TEST_FAULT) on the side that runs it, between two local
# processes forced onto verbs (RDMASHIM_TRANSPORT=verbs), each run judged by
# tests/preload/faults.sh (staged as preload_faults.sh): TCP on both sides
# with the expected reasons, bytes intact both ways, the fault point reached.
# The server speaks first, so the client reads the Ack before it sends and a
# server whose client could not connect its QP learns it (exact outcomes).
# Prints "@ fault.SIDE.STEP rc=.. out=.." lines; the host judges them.
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"

export RDMASHIM_TRANSPORT=verbs FAULT_UPGRADED=verbs FAULT_PROTOCOL=server-first
export FAULT_HOST=$RDMASHIM_VM_SELF # the eth0 address: the one rxe0's RoCEv2 GID carries
export RDMASHIM_BUILD=$STAGE_DIR FAULT_LIMIT_S=40 # TCG is slow
cd /tmp || exit 1

run() { # NAME ARGS...
	local name=$1 out rc=0
	shift
	out=$(bash "$STAGE_DIR/guest/preload_faults.sh" "$@" 2>&1) || rc=$?
	say "fault.$name rc=$rc out=$(oneline_in <<<"$out")"
}

run none none
# No device, PD, ring or QP on the client: it offers nothing, sends no Hello.
for step in ibv-devices ibv-open ibv-pd ibv-mr ibv-channel ibv-cq ibv-qp ibv-qp-init ibv-gid; do
	run "client.$step" client "$step" tcp:setup-failed tcp:peer-plain
done
# The client's QP cannot reach RTR/RTS after the server's Ack: its Plain tells the server.
for step in ibv-qp-rtr ibv-qp-rts; do
	run "client.$step" client "$step" tcp:setup-failed tcp:setup-failed
done
# The server cannot build or connect its side: a negative Ack.
for step in ibv-devices ibv-open ibv-pd ibv-mr ibv-channel ibv-cq ibv-qp ibv-qp-init ibv-gid ibv-qp-rtr ibv-qp-rts; do
	run "server.$step" server "$step" tcp:setup-failed tcp:setup-failed
done
# The RDMA-CM advertisement only serves clients on other hosts: on this one
# the connection still takes verbs (the client's RDMA-CM steps, probing
# another host, run between two guests: cross.sh --discovery cmfaults).
for step in cm-channel cm-id cm-bind cm-listen; do
	run "server.$step" server "$step" verbs verbs
done
# A provider call that never returns (QP creation, the RTR transition): the
# watchdog leaves the connection on TCP after the faulted side's setup
# timeout (2 s here), bytes intact, and the process warns once and goes on.
for step in ibv-qp-block ibv-qp-rtr-block; do
	FAULT_BLOCK_MS=2000 run "client.$step" client "$step" tcp:setup-failed \
		"$([[ $step == ibv-qp-block ]] && echo tcp:peer-plain || echo tcp:setup-failed)"
	FAULT_BLOCK_MS=2000 run "server.$step" server "$step" tcp:setup-failed tcp:setup-failed
done
say "fault.done"
