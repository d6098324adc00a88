#!/usr/bin/env bash
# In ONE guest (run by bench/softroce.sh): 64-byte ping-pong between two
# processes over every path we compare, one after the other in the same boot:
#   tcp        tcpPingPong, plain kernel TCP
#   rspreload  tcpPingPong with librspreload on both sides (rsocket; a plain
#              client cannot reach an rspreload server)
#   ib_write_lat  perftest's raw RDMA write latency
#   core       rdmaPingPong --transport verbs (rdmashim's core API)
#   shim       tcpPingPong under rdmashim run, RDMASHIM_TRANSPORT=verbs
#   shim_sleep the same with RDMASHIM_SPIN_US=0 (every wait sleeps)
# Prints "@ row.NAME.client rc=.. transport=.. json=.." (ib_write_lat: raw=..).
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"

iters=${BENCH_ITERS:-5000} size=${BENCH_SIZE:-64}
self=$RDMASHIM_VM_SELF gid=$RDMASHIM_VM_GID_INDEX
rsp=${RSPRELOAD:-/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so}
pp=(--size "$size" --iters "$iters" --json)
cd /tmp || exit 1

pingpong row.tcp \
	"$BIN/tcpPingPong" server --port 18901 --size "$size" :: \
	"$BIN/tcpPingPong" client "$self:18901" "${pp[@]}"

if [[ -f $rsp ]]; then
	# Bind the server to the rxe0 address: rsocket listens on RDMA-CM only.
	pingpong row.rspreload \
		env LD_PRELOAD="$rsp" "$BIN/tcpPingPong" server --host "$self" --port 18902 --size "$size" :: \
		env LD_PRELOAD="$rsp" "$BIN/tcpPingPong" client "$self:18902" "${pp[@]}"
else
	say "row.rspreload.client rc=127 log=${rsp}_not_found_(apt-get_install_librdmacm1) json=none"
fi

# perftest: server first, the client retries until it listens. The result row
# is "#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%" (us, one-way).
ibl=(ib_write_lat -F -d rxe0 -x "$gid" -s "$size" -n "$iters" -p 18903)
if command -v ib_write_lat >/dev/null; then
	timeout 120 "${ibl[@]}" >ibl.server.log 2>&1 &
	spid=$!
	rc=1
	for ((i = 0; i < 60; i++)); do
		timeout 120 "${ibl[@]}" "$self" >ibl.client.log 2>&1 && { rc=0; break; }
		sleep 0.5
	done
	wait "$spid" 2>/dev/null
	raw=$(awk -v s="$size" -v n="$iters" '$1 == s && $2 == n { $1 = $1; gsub(/ /, ","); print; exit }' ibl.client.log)
	say "row.ib_write_lat.client rc=$rc log=$(oneline ibl.client.log | tail -c 200) raw=${raw:-none}"
else
	say "row.ib_write_lat.client rc=127 log=ib_write_lat_not_found_(apt-get_install_perftest) raw=none"
fi

export RDMASHIM_LOG=info RDMASHIM_TRANSPORT=verbs
pingpong row.core \
	"$BIN/rdmaPingPong" server --port 18904 --size "$size" --transport verbs :: \
	"$BIN/rdmaPingPong" client "$self:18904" --transport verbs "${pp[@]}"
pingpong row.shim \
	"${SHIM[@]}" "$BIN/tcpPingPong" server --port 18905 --size "$size" :: \
	"${SHIM[@]}" "$BIN/tcpPingPong" client "$self:18905" "${pp[@]}"
# No spinning: every wait sleeps, woken through the shared CQ's watcher
# (core/verbs/shared_cq.h): what a busy machine's connections pay.
pingpong row.shim_sleep \
	env RDMASHIM_SPIN_US=0 "${SHIM[@]}" "$BIN/tcpPingPong" server --port 18906 --size "$size" :: \
	env RDMASHIM_SPIN_US=0 "${SHIM[@]}" "$BIN/tcpPingPong" client "$self:18906" "${pp[@]}"
