#!/usr/bin/env bash
# In TWO guests (run by ../daemons.sh): servers whose listen() caller exits
# before any client comes (forkingPingPong --detach: it forks and leaves; its
# child serves as --daemonize or --prefork 3) in guest a, clients in guest b
# (4 client processes in turn, one connection each) that find them by
# DISCOVERY (no RDMASHIM_PEERS: the RDMA-CM probe must be
# answered by a process that did not call listen()). Each client runs only
# after guest a says, on a plain "ready" port, that the listen() caller has
# exited and two seconds have passed. Prints per shape
# "@ dm.SHAPE.SIDE rc=N verbs=COUNT served=COUNT notadv=COUNT log=...".
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"

role=$RDMASHIM_VM_ROLE
server_ip=10.77.0.1
cd /tmp || exit 1
unset RDMASHIM_PEERS
export RDMASHIM_TRANSPORT=verbs

i=0
for shape in daemonize prefork; do
	port=$((18831 + i))
	ready=$((18841 + i))
	i=$((i + 1))
	args=(--detach)
	[[ $shape == prefork ]] && args+=(--prefork 3)
	[[ $shape == daemonize ]] && args+=(--daemonize)
	if [[ $role == a ]]; then
		# Returns at once: the process that called listen() exits after its fork.
		timeout 120 "$BIN/rdmashim" run --log debug -- "$BIN/forkingPingPong" server --port "$port" "${args[@]}" \
			--conns 4 2>"dm.$shape.log"
		rc=$?
		sleep 2
		# One plain connection on the ready port tells guest b to start.
		timeout 100 python3 -c "
import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', $ready)); s.listen(1); c, _ = s.accept(); c.close()"
		for ((t = 0; t < 150; t++)); do
			(($(grep -c 'served a connection' "dm.$shape.log") >= 4)) && break
			sleep 0.2
		done
		say "dm.$shape.server rc=$rc verbs=$(grep -c -- '-> verbs' "dm.$shape.log")\
 served=$(grep -c 'served a connection.*: ok' "dm.$shape.log") notadv=$(grep -c 'not-advertised' "dm.$shape.log")\
 log=$(grep -e '->' -e 'rdma-cm' -e 'forkingPingPong' "dm.$shape.log" | tr '\n' '|' | tr ' ' '_' | cut -c1-1500)"
	else
		for ((t = 0; t < 300; t++)); do
			python3 -c "import socket; socket.create_connection(('$server_ip', $ready), 1).close()" 2>/dev/null && break
			sleep 0.3
		done
		# One connection per client process, one after another: four
		# concurrent RDMA-CM probes from a TCG guest can outlast the probe's
		# 1 s bound (then "no", whoever answers).
		rc=0
		: >"dm.$shape.log"
		for ((c = 0; c < 4; c++)); do
			timeout 60 "${SHIM[@]}" "$BIN/forkingPingPong" client "$server_ip:$port" \
				--clients 1 --iters 200 --json >"dm.$shape.json" 2>>"dm.$shape.log" || rc=$?
		done
		say "dm.$shape.client rc=$rc verbs=$(grep -c -- '-> verbs' "dm.$shape.log")\
 notadv=$(grep -c 'not-advertised' "dm.$shape.log")\
 log=$(grep -e '->' -e 'forkingPingPong' "dm.$shape.log" | tr '\n' '|' | tr ' ' '_' | cut -c1-1500)"
	fi
done
