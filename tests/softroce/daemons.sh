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
install -m 755 "$RDMASHIM_BUILD/bin/forkingPingPong" "$STAGE/bin/forkingPingPong"
cmd="bash $STAGE/guest/daemons.sh"
st=0
out=$("$VM" run2 --timeout "${DAEMONS_TIMEOUT:-400}" -- "$cmd" -- "$cmd" 2>&1) || st=$?
printf '%s\n' "$out" | sed 's/^/  | /'

fail=0
check() { # NAME OK(0|1) DETAIL
	if [[ $2 == 1 ]]; then echo "ok:   $1 ($3)"; else echo "FAIL: $1 ($3)"; fail=1; fi
}
((st == 0)) || check "guests ran" 0 "vm run2 exited $st"
lines() { sed -n "s/^\(\[[ab]\] \)\{0,1\}@ $1 //p" <<<"$out"; }
for shape in daemonize prefork; do
	c=$(lines "dm.$shape.client" | tail -n 1) s=$(lines "dm.$shape.server" | tail -n 1)
	cv=$(kv "$c" verbs) sv=$(kv "$s" verbs) served=$(kv "$s" served)
	ok=0
	[[ $(kv "$c" rc) == 0 && $cv == 4 && $sv -ge 4 && $served -ge 4 ]] && ok=1
	check "--detach --$shape: 4 clients by discovery after the listen() caller exited, all on verbs both sides" "$ok" \
		"client rc=$(kv "$c" rc) verbs=$cv not-advertised=$(kv "$c" notadv); server verbs=$sv served=$served"
	((ok)) || printf '      client: %s\n      server: %s\n' "$(kv "$c" log)" "$(kv "$s" log)"
done
if ((fail)); then
	echo "softroce.daemons: FAILED"
	exit 1
fi
echo "softroce.daemons: OK"
