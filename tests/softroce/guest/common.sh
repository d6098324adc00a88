# Sourced by the in-guest scripts. They run as root inside a Soft-RoCE guest
# (see ../vm): the staged build is in $BIN, rxe0 is up.
# shellcheck shell=bash
STAGE_DIR=$(dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")
BIN=$STAGE_DIR/bin

# One result line for the host to read: "@ KEY k=v ...".
say() { printf '@ %s\n' "$*"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

# Soft-RoCE across two guests is slower than kernel TCP, so auto keeps such
# connections on TCP (core/verbs/policy.h): the guest tests are about the
# verbs path and ask for it here, once. A test of the policy itself unsets it.
export RDMASHIM_SOFT_VERBS=1

# "${SHIM[@]}" PROG ARGS: PROG under the preload, logging its transport.
# shellcheck disable=SC2034 # used by the scripts that source this
SHIM=("$BIN/rdmashim" run --log info --)

# The transport rdmashim logged for the last connection in a log file:
# "rdmashim[PID] info: fd 5 (client) -> verbs" -> verbs.
transport_of() {
	sed -n 's/.*rdmashim\[[0-9]*\] info: fd [0-9]* ([a-z]*) -> \([^ ]*\).*$/\1/p' "$1" 2>/dev/null | tail -n 1
}
first_transport_of() { # the same, the first line
	sed -n 's/.*rdmashim\[[0-9]*\] info: fd [0-9]* ([a-z]*) -> \([^ ]*\).*$/\1/p' "$1" 2>/dev/null | head -n 1
}

# Why, as the last transport line says after it: "-> tcp:policy (software
# rdma rxe0)" -> software_rdma_rxe0 (spaces made _ for a result line); "" if nothing.
reason_of() {
	sed -n 's/.*rdmashim\[[0-9]*\] info: fd [0-9]* ([a-z]*) -> [^ ]*\(.*\)$/\1/p' "$1" 2>/dev/null | tail -n 1 |
		sed -n 's/^ (\(.*\))$/\1/p' | tr ' ' '_'
}

# wait_for_transport LOG SECONDS: until rdmashim logged the connection's transport.
wait_for_transport() {
	local i
	for ((i = 0; i < $2 * 10; i++)); do
		[[ -n $(transport_of "$1") ]] && return 0
		sleep 0.1
	done
	return 1
}

# One line of a file, for a result line (no spaces: the host splits on them).
oneline() { tr '\n' '|' <"$1" 2>/dev/null | tr ' ' '_' | cut -c1-300; }
# The same for stdin (the guest has no /dev/stdin).
oneline_in() { tr '\n' '|' | tr ' ' '_' | cut -c1-300; }

# wait_listening PORT SECONDS: until a TCP socket listens on PORT (any address).
wait_listening() {
	local hex i
	hex=$(printf '%04X' "$1")
	for ((i = 0; i < $2 * 10; i++)); do
		awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
			/proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# pingpong NAME SERVER_CMD... :: CLIENT_CMD...: start the server, run the
# client (retrying until the server listens), stop the server, report.
pingpong() {
	local name=$1 srv=() cli=() rc=1 i out
	shift
	while [[ $1 != :: ]]; do srv+=("$1"); shift; done
	shift
	cli=("$@")
	timeout 120 "${srv[@]}" 2>"$name.server.log" &
	local spid=$!
	# A client that connects while the server is between advertising and
	# listen() takes TCP (the advertiser must own a listening socket), a
	# correct fallback but not the path under test: wait for the listen.
	local port
	port=$(printf '%s\n' "${srv[@]}" | sed -n '/^--port$/{n;p;q}')
	[[ -n $port ]] && wait_listening "$port" 30
	for ((i = 0; i < 100; i++)); do
		out=$(timeout 120 "${cli[@]}" 2>"$name.client.log") && { rc=0; break; }
		rc=$?
		# Retry only while the server is not listening yet.
		grep -qi 'refused\|cannot connect' "$name.client.log" || break
		sleep 0.2
	done
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	say "$name.client rc=$rc transport=$(transport_of "$name.client.log") log=$(oneline "$name.client.log") json=${out:-none}"
	say "$name.server transport=$(transport_of "$name.server.log") log=$(oneline "$name.server.log")"
}

# ib_write_lat_pair PORT N LOG: perftest's 64 B RDMA write latency, server
# and client on this guest's address (the client retries until the server
# listens), N iterations; the client's output in LOG.
# ib_write_lat_rate LOG FORMAT: its round trips/s (and p50 of a round trip
# in us, from the one-way figures) through printf FORMAT.
ib_write_lat_pair() {
	local cmd=(ib_write_lat -F -d rxe0 -x "$RDMASHIM_VM_GID_INDEX" -s 64 -n "$2" -p "$1") i
	timeout 60 "${cmd[@]}" >/dev/null 2>&1 &
	local spid=$!
	for ((i = 0; i < 40; i++)); do
		timeout 60 "${cmd[@]}" "$RDMASHIM_VM_SELF" >"$3" 2>&1 && break
		sleep 0.3
	done
	wait "$spid" 2>/dev/null
}
ib_write_lat_rate() {
	awk -v f="$2" '$1 == 64 && $2 ~ /^[0-9]+$/ && NF >= 6 { printf f, 1e6 / (2 * $6), 2 * $5 }' "$1"
}
