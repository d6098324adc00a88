#!/usr/bin/env bash
# In ONE guest (run by bench/softroce_scale.sh): one client process opens
# SCALE_N connections to one server process, both under `rdmashim run` with
# RDMASHIM_TRANSPORT=verbs (guest/many_conns.py), each echoing SCALE_BYTES;
# with every connection open, `rdmashim stat` and /proc give what each
# process holds. Twice: rings of SCALE_RING (64 KiB: every connection fits
# the default budget) and default rings under RDMASHIM_VERBS_MEM=SCALE_MEM
# (the budget turns the rest away as tcp:verbs-limit). Then a plain TCP run
# for the client's resident-memory baseline.
# Prints "@ scale.<run> k=v ..." lines.
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"
self=$RDMASHIM_VM_SELF
n=${SCALE_N:-1000} bytes=${SCALE_BYTES:-4096}
# The usual soft limit: a thousand sockets fit below it; our completion
# channels go above it (util/fd_budget.h), so the program never meets EMFILE.
ulimit -S -n 1024
export RDMASHIM_TRANSPORT=verbs
export PEERS_HOST=$self # where many_conns.py's server listens
cd /tmp || exit 1

stat_line() { # ROLE -> k=v of the process with live ROLE rows
	"$BIN/rdmashim" stat --json 2>/dev/null | python3 -c '
import json, sys
d = [p for p in json.load(sys.stdin) if any(c.get("role") == sys.argv[1] for c in p.get("live", []))]
p = max(d, key=lambda p: len(p["live"]), default={})
print(" ".join("%s=%s" % (k, p.get(k, "none")) for k in ("verbs_qps", "verbs_cqs", "verbs_mrs", "verbs_registered", "verbs_pooled")))' "$1"
}
rss_of() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null; }
pid_of() { # ROLE -> the pid of the python with live ROLE rows
	"$BIN/rdmashim" stat --json 2>/dev/null | python3 -c '
import json, sys
d = [p for p in json.load(sys.stdin) if any(c.get("role") == sys.argv[1] for c in p.get("live", []))]
print(max(d, key=lambda p: len(p["live"]), default={}).get("pid", 0))' "$1"
}

run() { # NAME ENV... : one server, one client of n connections
	local name=$1 t0 t1 crc spid
	shift
	rm -f "$name.port" "$name.mark" "$name.mark.go"
	env "$@" timeout 900 "${SHIM[@]}" python3 "$STAGE_DIR/guest/many_conns.py" server "$PWD/$name.port" 2>"$name.server.log" &
	spid=$!
	for ((i = 0; i < 300; i++)); do [[ -s $name.port ]] && break; sleep 0.1; done
	t0=$(now)
	env "$@" timeout 900 "${SHIM[@]}" python3 "$STAGE_DIR/guest/many_conns.py" client "$self" "$(cat "$name.port")" \
		"$n" "$bytes" "$PWD/$name.mark" 300 >"$name.client.out" 2>"$name.client.log" &
	local cpid=$!
	while kill -0 "$cpid" 2>/dev/null && [[ ! -e $name.mark ]]; do sleep 0.2; done
	t1=$(now)
	local cp sp
	cp=$(pid_of client) sp=$(pid_of server)
	say "scale.$name open_and_echo_s=$(elapsed "$t0" "$t1") client_verbs=$(grep -c '(client) -> verbs$' "$name.client.log") client_limit=$(grep -c '(client) -> tcp:verbs-limit' "$name.client.log") client_rss_kb=$(rss_of "$cp") client_fds=$(ls "/proc/$cp/fd" 2>/dev/null | wc -l) $(stat_line client | sed 's/\([a-z_]*\)=/client_\1=/g') server_rss_kb=$(rss_of "$sp") $(stat_line server | sed 's/\([a-z_]*\)=/server_\1=/g') memfree_kb=$(awk '/^MemAvailable/ { print $2 }' /proc/meminfo)"
	touch "$name.mark.go"
	wait "$cpid"
	crc=$?
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	say "scale.$name.done rc=$crc progress=$(grep -h '^many_conns:' "$name.client.log" | tail -1 | tr ' ' '_') client_err=$(grep -v 'info: fd' "$name.client.log" | tail -3 | oneline_in) warn=$(grep -h 'verbs-limit' "$name".*.log | grep -v ' -> ' | head -1 | tr ' ' '_') json=$(cat "$name.client.out" 2>/dev/null)"
}

say "scale.guest nofile=$(ulimit -Sn)/$(ulimit -Hn) memtotal_kb=$(awk '/^MemTotal/ { print $2 }' /proc/meminfo) memavailable_kb=$(awk '/^MemAvailable/ { print $2 }' /proc/meminfo)"
run small RDMASHIM_RING_SIZE="${SCALE_RING:-64k}"
run budget RDMASHIM_VERBS_MEM="${SCALE_MEM:-128m}"
run tcp RDMASHIM_TRANSPORT=tcp
