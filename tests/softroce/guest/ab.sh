#!/usr/bin/env bash
# Run by bench/softroce_ab.sh in ONE guest: the 64 B verbs ping-pong of two
# builds (A in $STAGE/a, B in $STAGE/bin), alternating, beside ib_write_lat,
# AB_ROUNDS times: `@ ab.ROUND.ROW rate=R p50=P` (round trips/s; p50 of a
# round trip in us; ib_write_lat's from its one-way figures).
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"
self=$RDMASHIM_VM_SELF gid=$RDMASHIM_VM_GID_INDEX
A=$STAGE_DIR/a/bin
n=${AB_ITERS:-20000} rounds=${AB_ROUNDS:-3}
port=19000
cd /tmp || exit 1
export RDMASHIM_TRANSPORT=verbs

# pair NAME SERVER... :: CLIENT...: the client's JSON as rate= p50=.
pair() {
	local name=$1 srv=() cli=()
	shift
	while [[ $1 != :: ]]; do srv+=("$1"); shift; done
	shift
	cli=("$@")
	timeout 60 "${srv[@]}" 2>"$name.server.log" &
	local spid=$!
	wait_listening "$port" 20
	local out
	out=$(timeout 60 "${cli[@]}" 2>"$name.client.log")
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	printf '%s\n' "$out" | sed -n 's/.*"round_trips_per_s":\([0-9.]*\).*"p50_us":\([0-9.]*\).*/rate=\1 p50=\2/p'
}
core() { # BIN
	port=$((port + 1))
	pair core "$1/rdmaPingPong" server --port $port --size 64 --transport verbs :: \
		"$1/rdmaPingPong" client "$self:$port" --transport verbs --size 64 --iters "$n" --json
}
shim() { # BIN
	port=$((port + 1))
	pair shim "$1/rdmashim" run -- "$1/tcpPingPong" server --port $port --size 64 :: \
		"$1/rdmashim" run -- "$1/tcpPingPong" client "$self:$port" --size 64 --iters "$n" --json
}
ibl() {
	port=$((port + 1))
	ib_write_lat_pair "$port" "$n" ibl.log
	ib_write_lat_rate ibl.log 'rate=%.0f p50=%.2f\n'
}
for ((r = 1; r <= rounds; r++)); do
	say "ab.$r.ibl $(ibl)"
	say "ab.$r.core_a $(core "$A")"
	say "ab.$r.core_b $(core "$BIN")"
	say "ab.$r.shim_a $(shim "$A")"
	say "ab.$r.shim_b $(shim "$BIN")"
done
