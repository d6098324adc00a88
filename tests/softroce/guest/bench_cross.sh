#!/usr/bin/env bash
# In TWO guests (run by bench/softroce.sh): 64-byte ping-pong across the link,
# guest a (10.77.0.1) serving, guest b (10.77.0.2) the client, every row in
# the same boot:
#   tcp        tcpPingPong, plain kernel TCP
#   auto       tcpPingPong under rdmashim run, RDMASHIM_SOFT_VERBS=0: auto
#              keeps it on TCP on Soft-RoCE (core/verbs/policy.h)
#   shim       tcpPingPong under rdmashim run, verbs asked for (common.sh)
#   rspreload  tcpPingPong with librspreload on both ends (rsocket)
#   ib_write_lat  perftest's raw RDMA write latency
# After each row the client tells the server's guest it is done (a plain
# matrix_peer connection on port 18919), and the server is stopped.
# Prints "@ xrow.NAME.client|server rc=.. transport=.. json=.." (ib_write_lat: raw=..).
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"

role=$RDMASHIM_VM_ROLE server_ip=10.77.0.1
iters=${BENCH_ITERS:-2000} size=${BENCH_SIZE:-64}
gid=$RDMASHIM_VM_GID_INDEX
rsp=${RSPRELOAD:-/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so}
pp=(--size "$size" --iters "$iters" --json)
done_port=18919
cd /tmp || exit 1

# serve NAME CMD...: guest a runs CMD until guest b's client says it is done.
serve() {
	local name=$1
	shift
	timeout 300 "$@" 2>"$name.server.log" &
	local spid=$!
	timeout 300 "$BIN/matrix_peer" server --bind 0.0.0.0 --port "$done_port" --bytes 0 >/dev/null 2>&1
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	say "$name.server transport=$(transport_of "$name.server.log") why=$(reason_of "$name.server.log") log=$(oneline "$name.server.log")"
}
# client NAME CMD...: guest b retries CMD until the server listens, reports, says done.
client() {
	local name=$1 rc=1 i out=
	shift
	for ((i = 0; i < 300; i++)); do
		out=$(timeout 300 "$@" 2>"$name.client.log") && { rc=0; break; }
		rc=$?
		grep -qi 'refused\|cannot connect\|unreachable' "$name.client.log" || break
		sleep 0.3
	done
	say "$name.client rc=$rc transport=$(transport_of "$name.client.log") why=$(reason_of "$name.client.log") log=$(oneline "$name.client.log") json=${out:-none}"
	timeout 120 "$BIN/matrix_peer" client --host "$server_ip" --port "$done_port" --bytes 0 --connect-wait 100 >/dev/null 2>&1
}
row() { # NAME PORT SERVER_PREFIX... :: CLIENT_PREFIX...: tcpPingPong across
	local name=$1 port=$2 sp=() cp=()
	shift 2
	while [[ $1 != :: ]]; do sp+=("$1"); shift; done
	shift
	cp=("$@")
	if [[ $role == a ]]; then
		serve "xrow.$name" "${sp[@]}" "$BIN/tcpPingPong" server --host "$server_ip" --port "$port" --size "$size"
	else
		client "xrow.$name" "${cp[@]}" "$BIN/tcpPingPong" client "$server_ip:$port" "${pp[@]}"
	fi
}

peers=(env RDMASHIM_PEERS=10.77.0.0/24)
row tcp 18911 env :: env
row auto 18912 env RDMASHIM_SOFT_VERBS=0 "${SHIM[@]}" :: "${peers[@]}" RDMASHIM_SOFT_VERBS=0 "${SHIM[@]}"
row shim 18913 "${SHIM[@]}" :: "${peers[@]}" "${SHIM[@]}"
if [[ -f $rsp ]]; then
	row rspreload 18914 env LD_PRELOAD="$rsp" :: env LD_PRELOAD="$rsp"
else
	say "xrow.rspreload.client rc=127 log=${rsp}_not_found_(apt-get_install_librdmacm1) json=none"
fi

# perftest: the server (guest a) first; the client retries until it listens.
# Its result row: "#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%" (us, one-way).
ibl=(ib_write_lat -F -d rxe0 -x "$gid" -s "$size" -n "$iters" -p 18915)
if ! command -v ib_write_lat >/dev/null; then
	say "xrow.ib_write_lat.client rc=127 log=ib_write_lat_not_found_(apt-get_install_perftest) raw=none"
elif [[ $role == a ]]; then
	timeout 300 "${ibl[@]}" >ibl.server.log 2>&1
	say "xrow.ib_write_lat.server rc=$? log=$(oneline ibl.server.log | tail -c 200)"
else
	rc=1
	for ((i = 0; i < 300; i++)); do
		timeout 300 "${ibl[@]}" "$server_ip" >ibl.client.log 2>&1 && { rc=0; break; }
		sleep 0.3
	done
	raw=$(awk -v s="$size" -v n="$iters" '$1 == s && $2 == n { $1 = $1; gsub(/ /, ","); print; exit }' ibl.client.log)
	say "xrow.ib_write_lat.client rc=$rc log=$(oneline ibl.client.log | tail -c 200) raw=${raw:-none}"
fi
say "xdone.$role"
