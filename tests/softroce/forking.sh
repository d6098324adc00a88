#!/usr/bin/env bash
# softroce.forking: fork and exec with a verbs stream, across two guests.
# The server (guest a) has read part of the stream and left the client's
# next bytes unread in its verbs ring when it forks (the child serves the
# rest; or parent and child share it: "shared") or execs (the new program
# serves it), while the client (guest b) sleeps in recv(). Each part of the
# stream (fork_peer.py: A..E, both ways) must be received once, exactly as
# sent (SHA-256), and each side must log "-> verbs" first and then its
# downgrade (server tcp:downgraded:fork|exec, client tcp:downgraded:peer-...).
# The same scenarios on one host: tests/preload/fork_handover.sh. Then the
# forking servers of the shared-memory tests (forkingPingPong fork, prefork,
# daemonize) across the link: every connection on verbs both sides.
# env: RDMASHIM_BUILD
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"

softroce_skip_unless_vm
softroce_stage
cmd="bash $STAGE/guest/forking.sh"
run_both "$cmd" "${FORKING_TIMEOUT:-600}"
# order_ok LOG WANT...: each wanted transport appears, in this order.
order_ok() {
	local log=$1 w n last=0
	shift
	for w in "$@"; do
		n=$(grep -n -- "-> $w\( \|$\)" <<<"$log" | head -n 1 | cut -d: -f1)
		[[ -n $n && $n -gt $last ]] || return 1
		last=$n
	done
}
tmp=$(mktemp -d)
for sc in fork shared exec fork-poll; do
	reason=fork
	[[ $sc == exec ]] && reason="exec"
	lines "fork.$sc.client.out" >"$tmp/c"
	lines "fork.$sc.server.out" >"$tmp/s"
	verdict=$(python3 "$SOFTROCE_DIR/guest/fork_peer.py" check "$tmp/c" "$tmp/s") && ok=1 || ok=0
	check "$sc: every part once, as sent (SHA-256)" "$ok" "rc server=$(lines "fork.$sc.server.rc") client=$(lines "fork.$sc.client.rc")"
	printf '%s\n' "$verdict" | sed 's/^/      /'
	for side in server client; do
		e=$(lines "fork.$sc.$side.error")
		[[ -n $e ]] && echo "      $side: $e"
	done
	grep -q '^child exit 0' "$tmp/s" && ok=1 || ok=0
	check "$sc: the server's child (or new program) ended well" "$ok" "$(grep -h 'child exit\|parent read' "$tmp/s" | tr '\n' ' ')"
	slog=$(lines "fork.$sc.server.log") clog=$(lines "fork.$sc.client.log")
	order_ok "$slog" verbs "tcp:downgraded:$reason" && ok=1 || ok=0
	check "$sc: server -> verbs, then tcp:downgraded:$reason" "$ok" "$(grep -o -- '-> [^ ]*\|[0-9]* unread bytes[^|]*' <<<"$slog" | tr '\n' ' ')"
	order_ok "$clog" verbs "tcp:downgraded:peer-$reason" && ok=1 || ok=0
	check "$sc: client -> verbs, then tcp:downgraded:peer-$reason" "$ok" "$(grep -o -- '-> [^ ]*' <<<"$clog" | tr '\n' ' ')"
done
rm -rf "$tmp"
for shape in fork prefork daemonize; do
	c=$(lines "fp.$shape.client" | tail -n 1) s=$(lines "fp.$shape.server" | tail -n 1)
	cv=$(kv "$c" verbs) sv=$(kv "$s" verbs) served=$(kv "$s" served)
	ok=0
	[[ $(kv "$c" rc) == 0 && $cv == 4 && $sv -ge 4 && $served -ge 4 ]] && ok=1
	check "forkingPingPong $shape: 4 checked clients, all on verbs both sides" "$ok" \
		"client rc=$(kv "$c" rc) verbs=$cv; server rc=$(kv "$s" rc) verbs=$sv served=$served"
	((ok)) || printf '      client: %s\n      server: %s\n' "$(kv "$c" log)" "$(kv "$s" log)"
done
finish "softroce.forking"
