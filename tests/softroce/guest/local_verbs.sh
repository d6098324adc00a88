#!/usr/bin/env bash
# In ONE guest (run by ../verbs_local.sh): two processes on the same host,
# forced onto the verbs link (RDMASHIM_TRANSPORT=verbs), over rxe0's loopback.
#   1. rdmaPingPong server + client --transport verbs (core API)
#   2. tcpPingPong server + client, both under `rdmashim run`
# Prints "@ KEY rc=.. transport=.. json=.." lines; the host judges them.
# Not set -e: every step reports, a failed one must not hide the next.
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"

iters=${PP_ITERS:-2000}
self=$RDMASHIM_VM_SELF # the eth0 address: the one rxe0's RoCEv2 GID carries
export RDMASHIM_TRANSPORT=verbs
cd /tmp

# pingpong NAME PORT SERVER_CMD... :: CLIENT_CMD...: start the server, run the
# client (retrying until the server listens), stop the server, report.
pingpong() {
	local name=$1 port=$2 srv=() cli=() rc=1 i out
	shift 2
	while [[ $1 != :: ]]; do srv+=("$1"); shift; done
	shift
	cli=("$@")
	timeout 120 "${srv[@]}" 2>"$name.server.log" &
	local spid=$!
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

# Core API: rdmaPingPong logs its transport at info level too.
export RDMASHIM_LOG=info
pingpong rdmaPingPong 18600 \
	"$BIN/rdmaPingPong" server --port 18600 --transport verbs :: \
	"$BIN/rdmaPingPong" client "$self:18600" --transport verbs --iters "$iters" --json

# Preload: the unmodified tcpPingPong under rdmashim run.
pingpong tcpPingPong 18601 \
	"${SHIM[@]}" "$BIN/tcpPingPong" server --port 18601 :: \
	"${SHIM[@]}" "$BIN/tcpPingPong" client "$self:18601" --iters "$iters" --json
