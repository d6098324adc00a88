#!/usr/bin/env bash
# softroce.daemons: the RDMA-CM advertisement outlives the process that
# called listen(). In guest a, forkingPingPong --detach (the listen() caller
# forks and exits; its child serves, --daemonize or --prefork 3); in guest b,
# 4 checked clients (one after another) found by discovery alone (no RDMASHIM_PEERS),
# all connecting after the listen() caller exited: every connection must log
# "-> verbs" on both sides (before the fix: tcp:not-advertised).
# env: RDMASHIM_BUILD
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"

softroce_skip_unless_vm
softroce_stage
cmd="bash $STAGE/guest/daemons.sh"
run_both "$cmd" "${DAEMONS_TIMEOUT:-400}"
for shape in daemonize prefork; do
	c=$(lines "dm.$shape.client" | tail -n 1) s=$(lines "dm.$shape.server" | tail -n 1)
	cv=$(kv "$c" verbs) sv=$(kv "$s" verbs) served=$(kv "$s" served)
	ok=0
	[[ $(kv "$c" rc) == 0 && $cv == 4 && $sv -ge 4 && $served -ge 4 ]] && ok=1
	check "--detach --$shape: 4 clients by discovery after the listen() caller exited, all on verbs both sides" "$ok" \
		"client rc=$(kv "$c" rc) verbs=$cv not-advertised=$(kv "$c" notadv); server verbs=$sv served=$served"
	((ok)) || printf '      client: %s\n      server: %s\n' "$(kv "$c" log)" "$(kv "$s" log)"
done
finish "softroce.daemons"
