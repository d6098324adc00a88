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
cd /tmp || exit 1

# Core API: rdmaPingPong logs its transport at info level too.
export RDMASHIM_LOG=info
pingpong rdmaPingPong \
	"$BIN/rdmaPingPong" server --port 18600 --transport verbs :: \
	"$BIN/rdmaPingPong" client "$self:18600" --transport verbs --iters "$iters" --json

# Preload: the unmodified tcpPingPong under rdmashim run.
pingpong tcpPingPong \
	"${SHIM[@]}" "$BIN/tcpPingPong" server --port 18601 :: \
	"${SHIM[@]}" "$BIN/tcpPingPong" client "$self:18601" --iters "$iters" --json
