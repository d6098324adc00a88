#!/usr/bin/env bash
# Run by bench/softroce_scale.sh, in ONE guest (both ends) or TWO
# (SCALE_GUESTS=2: guest a the servers, guest b the clients): one client
# process opens SCALE_N connections to one server process, both under
# `rdmashim run` with RDMASHIM_TRANSPORT=verbs (guest/many_conns.py), each
# echoing SCALE_BYTES; with every connection open, `rdmashim stat` and /proc
# give what each process holds. Three runs:
#   small   rings of SCALE_RING (64 KiB: every connection fits the default budget)
#   budget  default rings under RDMASHIM_VERBS_MEM=SCALE_MEM: the rest tcp:verbs-limit
#   tcp     RDMASHIM_TRANSPORT=tcp: the resident-memory baseline
# Prints "@ scale.<run>.client|server|done k=v ..." lines.
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"
self=$RDMASHIM_VM_SELF
n=${SCALE_N:-1000} bytes=${SCALE_BYTES:-4096} two=${SCALE_GUESTS:-1} role=${RDMASHIM_VM_ROLE:-a}
server_ip=$self
if ((two == 2)); then
	server_ip=10.77.0.1
	export RDMASHIM_PEERS=10.77.0.0/24 # clients: the servers run rdmashim
fi
# The usual soft limit: a thousand sockets fit below it; our completion
# channels go above it (util/fd_budget.h), so the program never meets EMFILE.
ulimit -S -n 1024
export RDMASHIM_TRANSPORT=verbs
export PEERS_HOST=$server_ip # where many_conns.py's server listens
cd /tmp || exit 1

stat_line() { # PID PREFIX -> PREFIX_k=v of that process in `rdmashim stat`, its RSS and descriptors
	local s
	s=$("$BIN/rdmashim" stat --json 2>/dev/null | python3 -c '
import json, sys
p = ([p for p in json.load(sys.stdin) if p["pid"] == int(sys.argv[1])] or [{}])[0]
print(" ".join("%s_%s=%s" % (sys.argv[2], k, p.get(k, "none")) for k in ("verbs_qps", "verbs_cqs", "verbs_mrs", "verbs_registered", "verbs_pooled")))' "$1" "$2")
	printf '%s %s_rss_kb=%s %s_fds=%s' "$s" "$2" "$(awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null)" "$2" "$(ls "/proc/$1/fd" 2>/dev/null | wc -l)"
}
python_of() { pgrep -n -f "many_conns.py $1 .*$PWD/$2" || echo 0; } # ROLE NAME.port|NAME.mark

server_side() { # NAME PORT ENV...
	local name=$1 port=$2 spid
	shift 2
	rm -f "$name.port" "$name.port.all"
	env PEERS_PORT="$port" "$@" timeout 900 "${SHIM[@]}" python3 "$STAGE_DIR/guest/many_conns.py" server "$PWD/$name.port" "$n" \
		2>"$name.server.log" &
	spid=$!
	while kill -0 "$spid" 2>/dev/null && [[ ! -e $name.port.all ]]; do sleep 0.2; done
	say "scale.$name.server verbs=$(grep -c '(server) -> verbs$' "$name.server.log") limit=$(grep -c '(server) -> tcp:verbs-limit' "$name.server.log") $(stat_line "$(python_of server "$name.port")" server) memavailable_kb=$(awk '/^MemAvailable/ { print $2 }' /proc/meminfo)"
	wait "$spid"
}

client_side() { # NAME PORT HOLD ENV...
	local name=$1 port=$2 hold=$3 t0 t1 cpid crc
	shift 3
	rm -f "$name.mark" "$name.mark.go"
	t0=$(now)
	env "$@" timeout 900 "${SHIM[@]}" python3 "$STAGE_DIR/guest/many_conns.py" client "$server_ip" "$port" \
		"$n" "$bytes" "$PWD/$name.mark" 600 >"$name.client.out" 2>"$name.client.log" &
	cpid=$!
	while kill -0 "$cpid" 2>/dev/null && [[ ! -e $name.mark ]]; do sleep 0.2; done
	t1=$(now)
	say "scale.$name.client secs=$(elapsed "$t0" "$t1") verbs=$(grep -c '(client) -> verbs$' "$name.client.log") limit=$(grep -c '(client) -> tcp:verbs-limit' "$name.client.log") $(stat_line "$(python_of client "$name.mark")" client) memavailable_kb=$(awk '/^MemAvailable/ { print $2 }' /proc/meminfo)"
	sleep "$hold" # the server's guest reads its own stat meanwhile
	touch "$name.mark.go"
	wait "$cpid"
	crc=$?
	say "scale.$name.done rc=$crc progress=$(grep -h '^many_conns:' "$name.client.log" | tail -1 | tr ' ' '_') err=$(grep -v 'info: fd' "$name.client.log" | grep -v '^many_conns:' | tail -3 | oneline_in) json=$(cat "$name.client.out" 2>/dev/null)"
}

one() { # NAME PORT ENV...
	local name=$1 port=$2
	shift 2
	if ((two == 2)); then
		if [[ $role == a ]]; then server_side "$name" "$port" "$@"; else client_side "$name" "$port" 60 "$@"; fi
	else
		server_side "$name" "$port" "$@" &
		client_side "$name" "$port" 15 "$@"
		wait
	fi
}

say "scale.guest.$role nofile=$(ulimit -Sn)/$(ulimit -Hn) memtotal_kb=$(awk '/^MemTotal/ { print $2 }' /proc/meminfo) memavailable_kb=$(awk '/^MemAvailable/ { print $2 }' /proc/meminfo)"
one small 18801 RDMASHIM_RING_SIZE="${SCALE_RING:-64k}"
one budget 18802 RDMASHIM_VERBS_MEM="${SCALE_MEM:-128m}"
one tcp 18803 RDMASHIM_TRANSPORT=tcp
