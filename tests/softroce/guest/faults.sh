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
# A close after the peer exited (its QP destroyed) with the client's last
# credit still unacknowledged: the close returns at once, not after the
# setup timeout (rxe retries a retry count of 7 forever). close_peer_gone.py.
peer_gone() {
	local d out rc=0 ms why=
	d=$(mktemp -d)
	export RDMASHIM_RING_SIZE=262144 RDMASHIM_SETUP_TIMEOUT_MS=20000
	timeout 60 "$BIN/rdmashim" run --log info -- python3 "$STAGE_DIR/guest/close_peer_gone.py" \
		server "$d/port" 131072 "$FAULT_HOST" 2>"$d/server.log" &
	local spid=$!
	for _ in $(seq 200); do [[ -s $d/port ]] && break; sleep 0.05; done
	out=$(timeout 60 "$BIN/rdmashim" run --log debug -- python3 "$STAGE_DIR/guest/close_peer_gone.py" \
		client "$(cat "$d/port" 2>/dev/null)" 131072 "$FAULT_HOST" 2>"$d/client.log") || rc=$?
	wait "$spid" || rc=$((rc ? rc : 10))
	unset RDMASHIM_RING_SIZE RDMASHIM_SETUP_TIMEOUT_MS
	ms=$(sed -n 's/.*close_ms=\([0-9]*\) received=131072$/\1/p' <<<"$out")
	[[ -n $ms ]] || why="not all bytes: $out"
	[[ -z $why && $ms -ge 2000 ]] && why="close took $ms ms"
	[[ $(transport_of "$d/client.log") == verbs && $(transport_of "$d/server.log") == verbs ]] || why="$why not on verbs"
	((rc == 0)) && [[ -n $why ]] && rc=1
	say "fault.close-peer-gone rc=$rc out=${why:-ok}_close_ms=$ms|$(oneline "$d/client.log")"
	rm -rf "$d"
}
peer_gone
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
