#!/usr/bin/env bash
# In TWO guests (run by ../cross.sh): guest a (10.77.0.1) runs the servers,
# guest b (10.77.0.2) the clients. Both run the same parts in the same order;
# a client retries its connect until its server listens, so the parts line up
# without any other synchronisation.
#   matrix  the fallback matrix across the link: {rdmashim, plain} client x
#           {rdmashim, plain} server x {client-first, server-first}, matrix_peer
#           on both ends (SHA-256 of everything sent and received)
#   large   LARGE_BYTES of /dev/urandom through rdma_send | rdma_recv
#           --transport verbs --verify (XXH64 end to end), and the SHA-256
#           of what went into rdma_send and of what came out of rdma_recv
#   kill    a matrix_peer client (sending) is SIGKILLed mid-stream, then a server
#           (receiving); the survivor must end promptly (EOF, EPIPE or ECONNRESET)
#   catkill the same with rdma_send (killed, then surviving) and rdma_recv over
#           verbs: the survivor must exit 1 with its message
#   sfirst  a server that speaks first, 100 connections each (see part_sfirst)
#   gone    a client closes while the server's host is unreachable (its link
#           down, guest/close_host_gone.py): the close must not wait for
#           confirmations; last, since guest a's link is down for a while
# Prints "@ KEY k=v ... json=..." lines; the host pairs and judges them.
# env: CROSS_PEERS (RDMASHIM_PEERS for rdmashim clients, default 10.77.0.0/24;
#      "none": rely on discovery), MATRIX_BYTES, LARGE_BYTES, KILL_AFTER (s)
# Not set -e: every step reports, a failed one must not hide the next.
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"

role=$RDMASHIM_VM_ROLE
server_ip=10.77.0.1 client_ip=10.77.0.2
peers=${CROSS_PEERS:-10.77.0.0/24}
[[ $peers == none ]] && peers=
matrix_bytes=${MATRIX_BYTES:-4194311}
large_bytes=${LARGE_BYTES:-268435456}
kill_after=${KILL_AFTER:-2}
cd /tmp || exit 1

# The environment of an rdmashim client whose server runs rdmashim.
peer_env=(env)
[[ -n $peers ]] && peer_env+=("RDMASHIM_PEERS=$peers")

# ------------------------------------------------------------------ matrix ---
# name client server protocol (port = 18701 + index)
cells=(
	"shim-shim-cf rdmashim rdmashim client-first"
	"shim-shim-sf rdmashim rdmashim server-first"
	"shim-plain-cf rdmashim plain client-first"
	"shim-plain-sf rdmashim plain server-first"
	"plain-shim-cf plain rdmashim client-first"
	"plain-shim-sf plain rdmashim server-first"
	"soft-auto-cf rdmashim rdmashim client-first"
	"soft-srvauto-cf rdmashim rdmashim client-first"
)
# The verbs policy (core/verbs/policy.h): rxe is slower than TCP across hosts,
# so RDMASHIM_SOFT_VERBS=0 (auto) keeps these cells' connections on TCP:
# soft-auto on both ends (the client offers no verbs), soft-srvauto on the
# server only (it declines the client's offer in its Ack).
soft_env() { # NAME SIDE -> "env RDMASHIM_SOFT_VERBS=0" where the cell runs auto
	case $1.$2 in
	soft-auto-cf.* | soft-srvauto-cf.server) echo env RDMASHIM_SOFT_VERBS=0 ;;
	*) echo env ;;
	esac
}

matrix_server() { # NAME MODE PROTOCOL PORT
	local name=$1 mode=$2 proto=$3 port=$4 pre=() rc
	# shellcheck disable=SC2207 # words on purpose
	[[ $mode == rdmashim ]] && pre=($(soft_env "$name" server) "${SHIM[@]}")
	timeout 180 "${pre[@]}" "$BIN/matrix_peer" server --bind 0.0.0.0 --port "$port" --protocol "$proto" \
		--bytes "$matrix_bytes" >"m.$name.json" 2>"m.$name.log"
	rc=$?
	say "matrix.$name.server rc=$rc transport=$(transport_of "m.$name.log") why=$(reason_of "m.$name.log") log=$(oneline "m.$name.log") json=$(cat "m.$name.json")"
}

matrix_client() { # NAME MODE SERVER_MODE PROTOCOL PORT
	local name=$1 mode=$2 smode=$3 proto=$4 port=$5 pre=() rc
	if [[ $mode == rdmashim ]]; then
		# RDMASHIM_PEERS only toward rdmashim servers: it makes the client
		# speak rdmashim's Hello, which a plain server would take as data.
		if [[ $smode == rdmashim ]]; then pre=("${peer_env[@]}" "${SHIM[@]}"); else pre=("${SHIM[@]}"); fi
		# shellcheck disable=SC2207 # words on purpose
		pre=($(soft_env "$name" client) "${pre[@]}")
	fi
	timeout 180 "${pre[@]}" "$BIN/matrix_peer" client --host "$server_ip" --port "$port" --protocol "$proto" \
		--bytes "$matrix_bytes" --connect-wait 90 >"m.$name.json" 2>"m.$name.log"
	rc=$?
	say "matrix.$name.client rc=$rc transport=$(transport_of "m.$name.log") why=$(reason_of "m.$name.log") log=$(oneline "m.$name.log") json=$(cat "m.$name.json")"
}

part_matrix() {
	local i name cm sm proto t0
	t0=$(now)
	if [[ $role == a ]]; then
		# All servers listen at once; each serves one connection.
		for i in "${!cells[@]}"; do
			read -r name cm sm proto <<<"${cells[$i]}"
			matrix_server "$name" "$sm" "$proto" $((18701 + i)) &
		done
		wait
	else
		for i in "${!cells[@]}"; do
			read -r name cm sm proto <<<"${cells[$i]}"
			matrix_client "$name" "$cm" "$sm" "$proto" $((18701 + i))
		done
	fi
	say "matrix.$role.time seconds=$(elapsed "$t0" "$(now)")"
}

# ---------------------------------------------------------------- cmfaults ---
# The client's RDMA-CM discovery steps made to fail (RDMASHIM_TEST_FAULT), one
# connection each, client-first, rdmashim on both ends: the client must not
# speak rdmashim (tcp:*), the server sees a plain client, the bytes are intact.
# "none" first: without a fault the same pair takes verbs.
cm_steps=(none cm-channel cm-id cm-resolve-addr cm-resolve-route cm-connect)
part_cmfaults() {
	local i step port
	for i in "${!cm_steps[@]}"; do
		step=${cm_steps[$i]} port=$((18731 + i))
		if [[ $role == a ]]; then
			matrix_server "cmf-$step" rdmashim client-first "$port"
		else
			local fault=()
			[[ $step != none ]] && fault=(env "RDMASHIM_TEST_FAULT=$step")
			timeout 180 "${fault[@]}" "${peer_env[@]}" "${SHIM[@]}" "$BIN/matrix_peer" client --host "$server_ip" \
				--port "$port" --protocol client-first --bytes "$matrix_bytes" --connect-wait 90 \
				>"m.cmf-$step.json" 2>"m.cmf-$step.log"
			say "matrix.cmf-$step.client rc=$? transport=$(transport_of "m.cmf-$step.log") \
reached=$(grep -c "test fault: $step made to fail" "m.cmf-$step.log") log=$(oneline "m.cmf-$step.log") json=$(cat "m.cmf-$step.json")"
		fi
	done
}

# ------------------------------------------------------------------ sfirst ---
# A server that speaks first (tests/preload/speaks_first.py: a greeting, then
# request/response), SFIRST_COUNT connections per server:
#   shim   both ends under rdmashim (every other connection from a
#          non-blocking client that, once its connect completed, is busy for
#          3 ms, so its Hello comes late): every connection must log
#          "-> verbs" on both sides.
#   fork   the same with a server that forks a child per connection, which
#          greets (an rsync daemon): the parent answers the probes
#   waitin the same with a client whose every other connection is
#          non-blocking and, while still connecting (a round trip here),
#          waits for the greeting only (poll for POLLIN, as SMTP, MySQL or
#          SSH clients do): the wait hooks watch the connect, so the Hello
#          leaves as it completes (speaks_first.py --wait-in)
#   plain  a plain client, its connections interleaved between the same
#          server under rdmashim (port 18842) and without (port 18843): the
#          median of the paired connect-to-greeting differences, judged on
#          the host (no added wait)
# Each client first waits for its server(s) with one uncounted connection.
part_sfirst() {
	local count=${SFIRST_COUNT:-100} py=$STAGE_DIR/guest/speaks_first.py
	local SHIM_DEBUG=("$BIN/rdmashim" run --log debug --) # says why a connection stayed on TCP
	if [[ $role == a ]]; then
		sfirst_server shim 18841 "${SHIM_DEBUG[@]}"
		sfirst_server fork 18844 --fork "${SHIM_DEBUG[@]}"
		sfirst_server waitin 18845 "${SHIM_DEBUG[@]}"
		sfirst_server plain 18842 "${SHIM_DEBUG[@]}" &
		sfirst_server bare 18843
		wait
	else
		# Short connections in a row would otherwise skip the upgrade (by design).
		sfirst_client shim --port 18841 --mixed --mixed-connected "${peer_env[@]}" RDMASHIM_SHORT_CONN_MS=0 "${SHIM_DEBUG[@]}"
		sfirst_client fork --port 18844 --mixed --mixed-connected "${peer_env[@]}" RDMASHIM_SHORT_CONN_MS=0 "${SHIM_DEBUG[@]}"
		sfirst_client waitin --port 18845 --wait-in poll "${peer_env[@]}" RDMASHIM_SHORT_CONN_MS=0 "${SHIM_DEBUG[@]}"
		sfirst_client plain --port 18842 --compare-port 18843
	fi
}
sfirst_server() { # NAME PORT [--fork] [LAUNCHER...]
	local name=$1 port=$2 fork=()
	shift 2
	[[ ${1:-} == --fork ]] && { fork=(--fork); shift; }
	timeout 240 "$@" python3 "$py" server --bind 0.0.0.0 --port "$port" --count "$count" --extra 1 "${fork[@]}" \
		>"s.$name.server.json" 2>"s.$name.server.log"
	say "sfirst.$name.server rc=$? transports=$(transports_in "s.$name.server.log") \
waits=$(grep -c 'waiting for the Hello' "s.$name.server.log") json=$(tr -d ' ' <"s.$name.server.json")"
	sfirst_why "$name.server"
}
# What rdmashim said (at debug level) before each connection that stayed on TCP.
sfirst_why() {
	grep -q -- '-> tcp' "s.$1.log" || return 0
	say "sfirst.$1.why text=$({ grep -m 3 'warn\|cannot answer' "s.$1.log"
		grep -B4 -- '-> tcp' "s.$1.log" | grep -v 'info: fd .* -> verbs' | tail -n 24; } |
		tr '\n' '|' | tr ' ' '_' | cut -c1-3000)"
}
sfirst_client() { # NAME OPTIONS... [LAUNCHER...] (options first, each with its value or alone)
	local name=$1 opts=()
	shift
	while [[ $# -gt 0 && $1 == --* ]]; do
		case $1 in --mixed*) opts+=("$1"); shift ;; *) opts+=("$1" "$2"); shift 2 ;; esac
	done
	timeout 240 "$@" python3 "$py" client --host "$server_ip" --count "$count" --connect-wait 90 "${opts[@]}" \
		>"s.$name.client.json" 2>"s.$name.client.log"
	say "sfirst.$name.client rc=$? transports=$(transports_in "s.$name.client.log") \
log=$(grep -v 'rdmashim\[' "s.$name.client.log" | oneline_in) json=$(tr -d ' ' <"s.$name.client.json")"
	sfirst_why "$name.client"
}
# Each transport rdmashim logged, with its count: "verbs:100,tcp:server-spoke-first:2".
transports_in() {
	sed -n 's/.*rdmashim\[[0-9]*\] info: fd [0-9]* ([a-z]*) -> \([^ ]*\).*$/\1/p' "$1" | sort | uniq -c |
		awk '{ printf "%s%s:%s", (NR > 1 ? "," : ""), $2, $1 }'
}

# ------------------------------------------------------------------- large ---
part_large() {
	local rc t0
	t0=$(now)
	if [[ $role == a ]]; then
		timeout 300 "$BIN/rdma_recv" --listen 0.0.0.0:18800 --transport verbs --verify --json --no-progress \
			2>large.log | sha256sum >large.sha
		rc=${PIPESTATUS[0]}
		grep -v '^{' large.log >large.msgs # its messages; the JSON is the last line starting with {
		say "large.recv rc=$rc sha256=$(cut -d' ' -f1 large.sha) log=$(oneline large.msgs) json=$(grep '^{' large.log | tail -n 1)"
	else
		# rdma_send prints its JSON on stdout; its input is a pipe, so the
		# size is only known at the end (as for any streaming producer).
		# SHA-256 of exactly what went into rdma_send, taken through a fifo
		# (the receiver hashes what came out of rdma_recv).
		rm -f large.fifo
		mkfifo large.fifo
		sha256sum <large.fifo >large.sha &
		local hpid=$!
		head -c "$large_bytes" /dev/urandom | tee large.fifo |
			timeout 300 "${peer_env[@]}" "$BIN/rdma_send" --transport verbs --verify --json --no-progress \
				--wait 90 "$server_ip:18800" >large.json 2>large.log
		rc=${PIPESTATUS[2]}
		wait "$hpid"
		say "large.send rc=$rc sha256=$(cut -d' ' -f1 large.sha) log=$(oneline large.log) json=$(tail -n 1 large.json)"
	fi
	say "large.$role.time seconds=$(elapsed "$t0" "$(now)")"
}

# -------------------------------------------------------------------- kill ---
# The side that kills tells the survivor's guest when it did, over a separate
# plain connection (matrix_peer without the preload, 0 bytes), so the survivor
# can time its own reaction on its own clock.
notice_wait() { # PORT: blocks until the killer's notice arrives
	timeout 180 "$BIN/matrix_peer" server --bind 0.0.0.0 --port "$1" --bytes 0 >/dev/null 2>&1
}
notice_send() { # HOST PORT
	timeout 60 "$BIN/matrix_peer" client --host "$1" --port "$2" --bytes 0 --connect-wait 50 >/dev/null 2>&1
}

# survive NAME CMD...: runs the survivor in the background, waits for the
# notice on port $notice_port, then for the survivor; reports how long after
# the notice it ended (negative: before the notice arrived).
survive() {
	local name=$1 t_notice t_end rc
	shift
	(
		timeout 120 "$@" >"k.$name.json" 2>"k.$name.log"
		echo $? >"k.$name.rc"
		now >"k.$name.end"
	) &
	local pid=$!
	notice_wait "$notice_port"
	t_notice=$(now)
	wait "$pid"
	rc=$(cat "k.$name.rc") t_end=$(cat "k.$name.end")
	say "kill.$name.survivor rc=$rc after_kill_s=$(elapsed "$t_notice" "$t_end") transport=$(transport_of "k.$name.log") log=$(oneline "k.$name.log") json=$(cat "k.$name.json")"
}

# victim NAME NOTICE_HOST CMD...: starts CMD, waits until its connection is
# set up (rdmashim logs the transport), lets data flow, SIGKILLs it.
victim() {
	local name=$1 host=$2 pid
	shift 2
	"$@" >/dev/null 2>"k.$name.victim.log" &
	pid=$!
	wait_for_transport "k.$name.victim.log" 90 || say "kill.$name.victim note=no-transport-logged"
	sleep "$kill_after"
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null
	say "kill.$name.victim transport=$(transport_of "k.$name.victim.log") log=$(oneline "k.$name.victim.log")"
	notice_send "$host" "$notice_port"
}

part_kill() {
	local big=8589934592 # 8 GiB: far more than can move before the kill
	# 1. The client (sending) dies; the server (reading) must see EOF.
	notice_port=18821
	if [[ $role == a ]]; then
		survive client-killed "${SHIM[@]}" "$BIN/matrix_peer" server --bind 0.0.0.0 --port 18810 --bytes 1048576
	else
		victim client-killed "$server_ip" "${peer_env[@]}" "${SHIM[@]}" "$BIN/matrix_peer" client \
			--host "$server_ip" --port 18810 --bytes "$big" --connect-wait 90
	fi
	# 2. The server (reading) dies; the client (sending) must get EPIPE/ECONNRESET.
	notice_port=18822
	if [[ $role == a ]]; then
		victim server-killed "$client_ip" "${SHIM[@]}" "$BIN/matrix_peer" server --bind 0.0.0.0 --port 18811 --bytes 1
	else
		survive server-killed "${peer_env[@]}" "${SHIM[@]}" "$BIN/matrix_peer" client \
			--host "$server_ip" --port 18811 --bytes "$big" --connect-wait 90
	fi
}

# ----------------------------------------------------------------- catkill ---
# rdma_send / rdma_recv across the link (verbs, RDMASHIM_LOG=info to see it):
# 1. rdma_send (guest b, reading /dev/zero) is SIGKILLed; rdma_recv must exit 1
#    with a message. 2. rdma_recv (guest a) is SIGKILLed; rdma_send likewise.
# cat_survive NAME CMD: like survive, plus the tool's own message lines (rdma_*:).
cat_survive() {
	local name=$1
	survive "$@"
	say "catkill.$name.message text=$(grep '^rdma_' "k.$name.log" | oneline_in)"
}
cat_victim() { # NAME NOTICE_HOST CMD (a command line for bash: exec'd, so $! is the tool)
	local name=$1 host=$2 pid
	RDMASHIM_LOG=info bash -c "exec $3" 2>"k.$name.victim.log" &
	pid=$!
	wait_for_transport "k.$name.victim.log" 90 || say "kill.$name.victim note=no-transport-logged"
	sleep "$kill_after"
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null
	say "kill.$name.victim transport=$(transport_of "k.$name.victim.log") log=$(oneline "k.$name.victim.log")"
	notice_send "$host" "$notice_port"
}
part_catkill() {
	notice_port=18823
	if [[ $role == a ]]; then
		cat_survive send-killed env RDMASHIM_LOG=info \
			bash -c "exec $BIN/rdma_recv --listen 0.0.0.0:18812 --no-progress >/dev/null"
	else
		cat_victim send-killed "$server_ip" \
			"${peer_env[*]} $BIN/rdma_send --no-progress --wait 90 $server_ip:18812 </dev/zero"
	fi
	notice_port=18824
	if [[ $role == a ]]; then
		cat_victim recv-killed "$client_ip" "$BIN/rdma_recv --listen 0.0.0.0:18813 --no-progress >/dev/null"
	else
		cat_survive recv-killed env RDMASHIM_LOG=info \
			bash -c "exec ${peer_env[*]} $BIN/rdma_send --no-progress --wait 90 $server_ip:18813 </dev/zero"
	fi
}

# -------------------------------------------------------------------- gone ---
part_gone() {
	local t0 t1
	if [[ $role == a ]]; then
		RDMASHIM_TRANSPORT=verbs timeout 60 "${SHIM[@]}" python3 "$STAGE_DIR/guest/close_host_gone.py" server 18820 4 \
			>gone.out 2>gone.log
		say "gone.server rc=$? $(grep -o 'down_ok=[0-9]' gone.out) transport=$(transport_of gone.log) log=$(oneline gone.log)"
	else
		t0=$(now)
		RDMASHIM_TRANSPORT=verbs timeout 60 "${peer_env[@]}" "${SHIM[@]}" python3 "$STAGE_DIR/guest/close_host_gone.py" \
			client "$server_ip" 18820 65536 >gone.out 2>gone.log
		local rc=$?
		t1=$(now)
		# (the first transport line: the writes its exit gave up on go on TCP, tcp:downgraded:resent)
		say "gone.client rc=$rc $(grep -o 'close_ms=[0-9]*' gone.out) total_s=$(elapsed "$t0" "$t1") transport=$(first_transport_of gone.log) log=$(oneline gone.log)"
	fi
}

for part in "${@:-matrix large kill catkill}"; do
	for p in $part; do
		case $p in
		matrix) part_matrix ;;
		large) part_large ;;
		kill) part_kill ;;
		catkill) part_catkill ;;
		cmfaults) part_cmfaults ;;
		sfirst) part_sfirst ;;
		gone) part_gone ;;
		*) say "error unknown-part=$p" ;;
		esac
	done
done
say "done.$role"
