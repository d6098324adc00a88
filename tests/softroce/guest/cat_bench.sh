#!/usr/bin/env bash
# In TWO guests (run by bench/softroce_cat.sh): one file from guest b
# (10.77.0.2, the sender) to guest a (10.77.0.1, the receiver), into a file
# in the receiver's /tmp (tmpfs), by each tool in turn, in the same boot:
#   rdma       rdma_send FILE -> rdma_recv >FILE (no --transport, no
#              RDMASHIM_PEERS: RDMA-CM discovery must pick verbs by itself)
#   rdma_tcp   the same with --transport tcp on both ends (kernel TCP)
#   socat      socat -u OPEN:FILE TCP:.. -> socat -u TCP-LISTEN:.. CREATE:FILE
#   rcopy      rsocket's rcopy (rdmacm-utils): rcopy FILE a:DEST -> rcopy server
# Every row is timed the same way, on the sender's clock: from starting the
# sending tool until the receiver's "done" notice arrives (sent once the
# receiving tool has written and closed the whole file), so data still in a
# socket buffer when socat's sender exits is not counted as delivered. The
# notices travel over separate plain TCP connections (matrix_peer, 0 bytes).
# The receiver then hashes what arrived (SHA-256) and compares it with the
# sender's hash on the host.
# Prints "@ KEY k=v ..." lines; the host pairs and judges them.
# env: CAT_BYTES (134217728), CAT_RUNS (1), CAT_ROWS ("rdma rdma_tcp socat rcopy")
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"

role=$RDMASHIM_VM_ROLE
server_ip=10.77.0.1 client_ip=10.77.0.2
bytes=${CAT_BYTES:-134217728}
runs=${CAT_RUNS:-1}
read -r -a rows <<<"${CAT_ROWS:-rdma rdma_tcp socat rcopy}"
src=/tmp/cat-bench.src dst=/tmp/cat-bench.dst
cd /tmp || exit 1

notice_wait() { # PORT: blocks until the other guest's notice arrives
	timeout 300 "$BIN/matrix_peer" server --bind 0.0.0.0 --port "$1" --bytes 0 >/dev/null 2>&1
}
notice_send() { # HOST PORT
	timeout 120 "$BIN/matrix_peer" client --host "$1" --port "$2" --bytes 0 --connect-wait 100 >/dev/null 2>&1
}
# wait_for FILE PATTERN SECONDS: until FILE contains PATTERN
wait_for() {
	local i
	for ((i = 0; i < $3 * 20; i++)); do
		grep -q "$2" "$1" 2>/dev/null && return 0
		sleep 0.05
	done
	return 1
}

# ---------------------------------------------------------------- receiver ---
# serve ROW PORT: start the receiving tool, tell the sender it is ready, wait
# for the whole file, tell the sender it is done, hash it.
serve() {
	local row=$1 port=$2 pid rc=0 transport="" log=r.$1.log
	rm -f "$dst" "$log" r.port
	case $row in
	rdma | rdma_tcp)
		local t=()
		[[ $row == rdma_tcp ]] && t=(--transport tcp)
		timeout 300 "$BIN/rdma_recv" --listen "0.0.0.0:$port" --port-file r.port --json --no-progress "${t[@]}" \
			>"$dst" 2>"$log" &
		pid=$!
		wait_for r.port . 60
		;;
	socat)
		timeout 300 socat -u "TCP-LISTEN:$port,reuseaddr" "CREATE:$dst" 2>"$log" &
		pid=$!
		for ((i = 0; i < 1200; i++)); do ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.05; done
		;;
	rcopy)
		# It serves one client after another forever: stop it once it
		# printed "done" (after closing the file).
		timeout 300 stdbuf -o0 rcopy -p "$port" >"$log" 2>&1 &
		pid=$!
		wait_for "$log" 'waiting for connection' 60
		;;
	esac
	notice_send "$client_ip" $((port + 1))
	if [[ $row == rcopy ]]; then
		wait_for "$log" 'closing\.\.\.done' 300 || rc=1
		kill "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	else
		wait "$pid"
		rc=$?
	fi
	notice_send "$client_ip" $((port + 2))
	[[ $row == rdma* ]] && transport=$(sed -n 's/.*"transport":"\([^"]*\)".*/\1/p' "$log" | tail -n 1)
	say "row.$row.$run.server rc=$rc transport=${transport:-none} bytes=$(stat -c %s "$dst" 2>/dev/null || echo 0)" \
		"sha256=$(sha256sum <"$dst" 2>/dev/null | cut -d' ' -f1) log=$(grep -v '^{' "$log" | oneline_in)"
	rm -f "$dst"
}

# ------------------------------------------------------------------ sender ---
send() {
	local row=$1 port=$2 pid rc t0 t1 log=s.$1.log out
	notice_wait $((port + 1)) # the receiver listens
	notice_wait $((port + 2)) &
	local done_pid=$!
	sleep 0.2 # let the "done" listener bind before the transfer can end
	t0=$(now)
	case $row in
	rdma) "$BIN/rdma_send" --json --no-progress --wait 30 "$server_ip:$port" "$src" >s.json 2>"$log" ;;
	rdma_tcp) "$BIN/rdma_send" --json --no-progress --wait 30 --transport tcp "$server_ip:$port" "$src" >s.json 2>"$log" ;;
	socat) socat -u "OPEN:$src" "TCP:$server_ip:$port" 2>"$log" ;;
	rcopy) rcopy "$src" "$server_ip:$dst" -p "$port" >"$log" 2>&1 ;;
	esac
	rc=$?
	wait "$done_pid"
	t1=$(now)
	out="" self=""
	[[ $row == rdma* ]] && out=$(tail -n 1 s.json)
	# rcopy's own figure: "N bytes in S seconds = G Gb/sec"
	[[ $row == rcopy ]] && self=$(sed -n 's/.* bytes in \([0-9.]*\) seconds = \([0-9.]*\) Gb\/sec.*/self_s=\1 self_gbit=\2/p' "$log")
	say "row.$row.$run.client rc=$rc seconds=$(elapsed "$t0" "$t1") $self log=$(grep -v '^{' "$log" | oneline_in) json=${out:-none}"
}

if [[ $role == b ]]; then
	head -c "$bytes" /dev/urandom >"$src"
	say "source bytes=$(stat -c %s "$src") sha256=$(sha256sum <"$src" | cut -d' ' -f1)"
fi
port=18600
for ((run = 1; run <= runs; run++)); do
	for row in "${rows[@]}"; do
		port=$((port + 10))
		say "run run=$run row=$row"
		if [[ $role == a ]]; then serve "$row" "$port"; else send "$row" "$port"; fi
	done
done
rm -f "$src"
say "done.$role"
