#!/usr/bin/env bash
# Run by bench/softroce_profile.sh in ONE guest: where a 64 B verbs ping-pong
# spends its CPU. Each row runs under `perf record -a` (cpu-clock: a TCG
# guest has no PMU), whole system, so the provider's kernel work (rxe's
# tasklets, the uverbs doorbell) shows beside the user code; the report is
# printed as "@@ ROW line" lines: by command and shared object, then the top
# symbols. Rows: ib_write_lat (raw RDMA WRITE, polling memory), the core API
# (rdmaPingPong --transport verbs) and the preload (tcpPingPong under
# rdmashim), PROF_ITERS round trips each.
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"
self=$RDMASHIM_VM_SELF gid=$RDMASHIM_VM_GID_INDEX
n=${PROF_ITERS:-20000} top=${PROF_TOP:-40}
port=19500
cd /tmp || exit 1
export RDMASHIM_TRANSPORT=verbs
command -v perf >/dev/null || { say "profile.error reason=no_perf"; exit 1; }

# record ROW WARMUP CMD...: CMD (which runs both ends, n + WARMUP round
# trips) under a system-wide profile.
record() {
	local row=$1 warm=$2
	shift 2
	perf record -q -a -g -e cpu-clock -F 4999 -o "$row.data" -- "$@" >"$row.out" 2>"$row.err"
	say "profile.$row $(sed -n 's/.*"round_trips_per_s":\([0-9.]*\).*/rate=\1/p' "$row.out" | tail -n 1)"
	# Flat reports (-g none; the call chains stay in $row.data for a look by
	# hand), with each line's samples per 1,000 round trips (the rows' rates
	# differ: a share alone would hide where one row does more work).
	local trips=$((n + warm))
	perf report -q -g none -n -i "$row.data" --no-children --sort comm,dso >"$row.dso" 2>/dev/null
	perf report -q -g none -n -i "$row.data" --no-children --sort sym >"$row.sym" 2>/dev/null
	per_trip() { awk -v t="$trips" '$1 ~ /%$/ { s = $2; $2 = ""; printf "%8.1f %s\n", s * 1000 / t, $0 }'; }
	per_trip <"$row.dso" | sed -n "1,15s/^/@@ $row.dso /p"
	per_trip <"$row.sym" | sed -n "1,${top}s/^/@@ $row.sym /p"
}
pair() { # SERVER... :: CLIENT...: both ends, the client's output on stdout
	local srv=()
	while [[ $1 != :: ]]; do srv+=("$1"); shift; done
	shift
	timeout 60 "${srv[@]}" 2>/dev/null &
	local spid=$!
	wait_listening "$port" 20
	timeout 60 "$@"
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
}
ibl() {
	ib_write_lat_pair "$port" "$n" ibl.log
	ib_write_lat_rate ibl.log '{"round_trips_per_s":%.0f}\n'
}
export -f pair ibl wait_listening ib_write_lat_pair ib_write_lat_rate
export RDMASHIM_VM_GID_INDEX RDMASHIM_VM_SELF
export self gid n port BIN
warm=$((n / 10 < 10000 ? n / 10 : 10000))  # the ping-pong tools' default warm-up
port=$((port + 1)); record ibl 0 bash -c ibl
port=$((port + 1)); record core "$warm" bash -c "pair $BIN/rdmaPingPong server --port $port --size 64 --transport verbs :: \
	$BIN/rdmaPingPong client $self:$port --transport verbs --size 64 --iters $n --json"
port=$((port + 1)); record shim "$warm" bash -c "pair $BIN/rdmashim run -- $BIN/tcpPingPong server --port $port --size 64 :: \
	$BIN/rdmashim run -- $BIN/tcpPingPong client $self:$port --size 64 --iters $n --json"
exit 0
