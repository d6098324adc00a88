#!/usr/bin/env bash
# In TWO guests (run by ../forking.sh): a stream on verbs across the link
# whose server forks or execs with bytes of the client's still unread in its
# ring, while the client sleeps in recv() (fork_peer.py: scenarios fork,
# shared, exec; fork-poll: the client asleep in poll()). Guest a (10.77.0.1) runs the servers, guest b the clients;
# both sides force verbs (a software provider across hosts is used only when
# asked for) and the client is told its peers. Prints, per scenario and side,
# "@ fork.SCENARIO.SIDE.rc N", one "@ fork.SCENARIO.SIDE.out LINE" per line
# the program printed and one "@ fork.SCENARIO.SIDE.log LINE" per rdmashim
# log line; the host pairs and judges them.
# Then the forking servers of the shared-memory tests (tests/stress
# forking_pingpong.sh) across the link: forkingPingPong fork-per-connection,
# prefork and daemonize in guest a, 4 concurrent checked ping-pong clients in
# guest b: "@ fp.SHAPE.SIDE rc=N verbs=COUNT served=COUNT".
# Not set -e: every scenario reports, a failed one must not hide the next.
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"

role=$RDMASHIM_VM_ROLE
server_ip=10.77.0.1
peer=$STAGE_DIR/guest/fork_peer.py
cd /tmp || exit 1
export RDMASHIM_TRANSPORT=verbs

report() { # SCENARIO SIDE RC
	local l
	say "fork.$1.$2.rc $3"
	while IFS= read -r l; do say "fork.$1.$2.out $l"; done <"f.$1.out"
	grep 'rdmashim\[' "f.$1.log" >"f.$1.rdmashim"  # (no /dev/fd in the guest for <(...))
	while IFS= read -r l; do say "fork.$1.$2.log $l"; done <"f.$1.rdmashim"
	# A Python traceback's last line says what went wrong.
	grep -q Traceback "f.$1.log" && say "fork.$1.$2.error $(tail -n 1 "f.$1.log" | tr ' ' '_')"
	return 0
}

i=0
# fork-poll: as fork, the client asleep in poll() instead of recv().
for sc in fork shared exec fork-poll; do
	port=$((18801 + i))
	i=$((i + 1))
	if [[ $role == a ]]; then
		timeout 120 "${SHIM[@]}" python3 "$peer" server --port "$port" --scenario "${sc%-poll}" >"f.$sc.out" 2>"f.$sc.log"
		report "$sc" server $?
	else
		wait=recv
		[[ $sc == *-poll ]] && wait=poll
		RDMASHIM_PEERS=10.77.0.0/24 timeout 120 "${SHIM[@]}" python3 "$peer" client --host "$server_ip" \
			--port "$port" --connect-wait 90 --wait "$wait" >"f.$sc.out" 2>"f.$sc.log"
		report "$sc" client $?
	fi
done

# ---------------------------------------------- forkingPingPong shapes ---
i=0
for shape in fork prefork daemonize; do
	port=$((18811 + i))
	i=$((i + 1))
	args=()
	[[ $shape == prefork ]] && args=(--prefork 3)
	[[ $shape == daemonize ]] && args=(--daemonize)
	ready=$((18821 + i))
	if [[ $role == a ]]; then
		timeout 120 "${SHIM[@]}" "$BIN/forkingPingPong" server --port "$port" "${args[@]}" --conns 4 2>"fp.$shape.log" &
		spid=$!
		# Guest b starts its clients only once this server listens: a client
		# refused while it starts would retry and exceed the server's --conns.
		for ((t = 0; t < 300; t++)); do
			ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
			sleep 0.1
		done
		# One plain connection on the ready port tells guest b to start.
		timeout 100 python3 -c "
import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', $ready)); s.listen(1); c, _ = s.accept(); c.close()" &
		rpid=$!
		wait "$spid"
		rc=$?
		wait "$rpid" || true
		# A daemonized grandchild reports after its parent left.
		for ((t = 0; t < 100; t++)); do
			(($(grep -c 'served a connection' "fp.$shape.log") >= 4)) && break
			sleep 0.2
		done
		say "fp.$shape.server rc=$rc verbs=$(grep -c -- '-> verbs' "fp.$shape.log")\
 served=$(grep -c 'served a connection.*: ok' "fp.$shape.log") log=$(oneline "fp.$shape.log")"
	else
		for ((t = 0; t < 300; t++)); do
			python3 -c "import socket; socket.create_connection(('$server_ip', $ready), 1).close()" 2>/dev/null && break
			sleep 0.3
		done
		for ((t = 0; t < 300; t++)); do
			RDMASHIM_PEERS=10.77.0.0/24 timeout 120 "${SHIM[@]}" "$BIN/forkingPingPong" client "$server_ip:$port" \
				--clients 4 --iters 200 --json >"fp.$shape.json" 2>"fp.$shape.log" && { rc=0; break; }
			rc=$?
			grep -qi 'refused' "fp.$shape.log" || break
			sleep 0.3
		done
		say "fp.$shape.client rc=$rc verbs=$(grep -c -- '-> verbs' "fp.$shape.log") log=$(oneline "fp.$shape.log")"
	fi
done
