#!/usr/bin/env bash
# softroce.scale, in two guests (tests/softroce/scale.sh): one client process
# in guest b opens SCALE_N connections to one server process in guest a, both
# under `rdmashim run` with RDMASHIM_TRANSPORT=verbs and 64 KiB rings
# (many_conns.py), each echoing SCALE_BYTES; with all open, each side reads
# its own `rdmashim stat`; then the client closes them all at once and opens
# one more, which the same server must serve. Guest a watches itself meanwhile
# (load, free memory, the server's progress and what it waits in) every 5 s.
# Then a client that vanishes (SCALE_KILL_N, 100; 0: skipped): a new server
# process on another port, N connections from one client process, which is
# SIGKILLed once every echo came (no exit flush, no Bye: its QPs are simply
# gone); the server closes all N on their EOFs and serves one more
# connection, from a new client process, timed from the kill.
# Prints "@ scale.server|client|watch|done|kill_done|kill_client k=v ..." lines.
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"
n=${SCALE_N:-1000} bytes=${SCALE_BYTES:-4096} role=${RDMASHIM_VM_ROLE:-a} port=18811
kill_n=${SCALE_KILL_N:-100} kill_port=18812
export RDMASHIM_PEERS=10.77.0.0/24 # the client's peer runs rdmashim
export RDMASHIM_TRANSPORT=verbs RDMASHIM_RING_SIZE=64k
ulimit -S -n 1024 # the usual soft limit: our completion channels go above it (util/fd_budget.h)
cd /tmp || exit 1
shim=("$BIN/rdmashim" run --log "${SCALE_LOG:-info}" --)

stat_line() { # PID SIDE -> SIDE_k=v of that process in `rdmashim stat`, its RSS and descriptors
	local s
	s=$("$BIN/rdmashim" stat --json 2>/dev/null | python3 -c '
import json, sys
p = ([p for p in json.load(sys.stdin) if p["pid"] == int(sys.argv[1])] or [{}])[0]
print(" ".join("%s_%s=%s" % (sys.argv[2], k, p.get(k, "none")) for k in ("verbs_qps", "verbs_cqs", "verbs_mrs", "verbs_registered", "verbs_pooled")))' "$1" "$2")
	printf '%s %s_rss_kb=%s %s_fds=%s memavailable_kb=%s' "$s" "$2" "$(awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null)" \
		"$2" "$(ls "/proc/$1/fd" 2>/dev/null | wc -l)" "$(awk '/^MemAvailable/ { print $2 }' /proc/meminfo)"
}
python_of() { pgrep -n -f "many_conns.py $1 " || echo 0; }

if [[ $role == a ]]; then
	rm -f srv.port srv.port.all srv.port.closed
	env PEERS_HOST=10.77.0.1 PEERS_PORT=$port timeout 900 "${shim[@]}" python3 "$STAGE_DIR/guest/many_conns.py" server "$PWD/srv.port" "$n" 1 \
		2>srv.log &
	spid=$!
	while kill -0 "$spid" 2>/dev/null && [[ ! -e srv.port.all ]]; do sleep 0.2; done
	py=$(python_of server)
	say "scale.server verbs=$(grep -c '(server) -> verbs$' srv.log) other=$(grep '(server) -> ' srv.log | grep -vc -- '-> verbs$') $(stat_line "$py" server)"
	t0=$(now) closed=
	while kill -0 "$spid" 2>/dev/null; do # every 5 s: how guest a is doing while the server closes
		[[ -z $closed && -e srv.port.closed ]] && closed=$(elapsed "$t0" "$(now)")
		say "scale.watch t=$(elapsed "$t0" "$(now)") load=$(cut -d' ' -f1 /proc/loadavg) memavailable_kb=$(awk '/^MemAvailable/ { print $2 }' /proc/meminfo) progress=$(grep -h '^many_conns:' srv.log | tail -1 | tr ' ' '_') wchan=$(cat "/proc/$py/wchan" 2>/dev/null) state=$(awk '/^State/ { print $2 }' "/proc/$py/status" 2>/dev/null)"
		for ((i = 0; i < 25; i++)); do kill -0 "$spid" 2>/dev/null || break; sleep 0.2; done
	done
	wait "$spid"
	rc=$?
	say "scale.done rc=$rc closed_s=$(cat srv.port.closed 2>/dev/null || echo none) verbs=$(grep -c '(server) -> verbs$' srv.log) progress=$(grep -h '^many_conns:' srv.log | oneline_in) dmesg=$(dmesg | tail -5 | oneline_in) err=$(grep -v ' info: ' srv.log | grep -v '^many_conns:' | tail -5 | oneline_in)"
	if ((kill_n > 0)); then
		rm -f kil.port kil.port.all kil.port.closed
		env PEERS_HOST=10.77.0.1 PEERS_PORT=$kill_port timeout 300 "${shim[@]}" python3 "$STAGE_DIR/guest/many_conns.py" server "$PWD/kil.port" "$kill_n" 1 \
			2>kil.log
		rc=$?
		say "scale.kill_done rc=$rc closed_s=$(cat kil.port.closed 2>/dev/null || echo none) verbs=$(grep -c '(server) -> verbs$' kil.log) other=$(grep '(server) -> ' kil.log | grep -vc -- '-> verbs$') progress=$(grep -h '^many_conns:' kil.log | oneline_in) err=$(grep -v ' info: ' kil.log | grep -v '^many_conns:' | tail -5 | oneline_in)"
	fi
else
	rm -f cli.mark cli.mark.go
	t0=$(now)
	MANY_CONNS_PIPELINE=1 timeout 900 "${shim[@]}" python3 "$STAGE_DIR/guest/many_conns.py" client 10.77.0.1 "$port" "$n" "$bytes" "$PWD/cli.mark" 600 1 \
		>cli.out 2>cli.log &
	cpid=$!
	while kill -0 "$cpid" 2>/dev/null && [[ ! -e cli.mark ]]; do sleep 0.2; done
	say "scale.client secs=$(elapsed "$t0" "$(now)") verbs=$(grep -c '(client) -> verbs$' cli.log) other=$(grep '(client) -> ' cli.log | grep -vc -- '-> verbs$') $(stat_line "$(python_of client)" client)"
	sleep "${SCALE_HOLD:-10}" # guest a reads its own stat meanwhile
	touch cli.mark.go
	wait "$cpid"
	rc=$?
	say "scale.client_done rc=$rc verbs=$(grep -c '(client) -> verbs$' cli.log) err=$(grep -v ' info: ' cli.log | grep -v '^many_conns: [0-9]* open' | tail -5 | oneline_in) json=$(cat cli.out 2>/dev/null)"
	if ((kill_n > 0)); then
		rm -f kil.mark kil.mark.go kil2.mark kil2.mark.go kil2.go kil2.go.ready
		timeout 300 "${shim[@]}" python3 "$STAGE_DIR/guest/many_conns.py" client 10.77.0.1 "$kill_port" "$kill_n" "$bytes" "$PWD/kil.mark" 600 \
			>kil.out 2>kil.log &
		kpid=$!
		# The next connection, from a new process started now and connecting
		# at the kill: python takes seconds to start in a TCG guest (more on a
		# busy host), which is not what this step times.
		MANY_CONNS_GO=$PWD/kil2.go timeout 300 "${shim[@]}" python3 "$STAGE_DIR/guest/many_conns.py" client 10.77.0.1 "$kill_port" 1 "$bytes" "$PWD/kil2.mark" 0 \
			>kil2.out 2>kil2.log &
		k2pid=$!
		while kill -0 "$kpid" 2>/dev/null && [[ ! -e kil.mark ]]; do sleep 0.2; done
		while kill -0 "$k2pid" 2>/dev/null && [[ ! -e kil2.go.ready ]]; do sleep 0.05; done
		py=$(python_of "client 10.77.0.1 $kill_port $kill_n")
		verbs=$(grep -c '(client) -> verbs$' kil.log)
		kill -9 "$py" # vanishes: no exit flush, no Bye
		t0=$(now)
		touch kil2.go # served once the server closed the N (or while it does)
		wait "$kpid"
		t_wait=$(now)
		wait "$k2pid"
		rc=$?
		say "scale.kill_client verbs=$verbs again_s=$(elapsed "$t0" "$(now)") wait_s=$(elapsed "$t0" "$t_wait") again_rc=$rc again_verbs=$(grep -c '(client) -> verbs$' kil2.log) err=$(grep -v ' info: ' kil2.log | tail -3 | oneline_in) json=$(cat kil2.out 2>/dev/null)"
	fi
fi
