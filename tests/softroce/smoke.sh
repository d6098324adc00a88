#!/usr/bin/env bash
# Smoke test for the Soft-RoCE guests: proves rxe0 comes up, verbs work
# inside one guest (ibv_rc_pingpong) and across two guests (perftest
# ib_write_lat over RoCEv2). Exit 77 (skip) when guests cannot run here.
set -euo pipefail

VM=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/vm
FAILED=0

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
fail() {
	echo "FAIL: $*"
	FAILED=1
}

st=0
reason=$("$VM" check) || st=$?
if ((st != 0)); then
	printf '%s\n' "$reason"
	exit 77
fi

# --- one guest: device state + RC ping-pong between two local processes ---
# -e (completion events): with one vCPU two busy-polling processes only
# alternate at scheduler ticks (~10 ms per iteration); events make it ~1 ms.
# The client retries until the server listens (port 18515).
# shellcheck disable=SC2016 # expanded inside the guest
run1_cmd='
g=$RDMASHIM_VM_GID_INDEX
echo "gid_index=$g"
ibv_devinfo -d rxe0 || exit 10
ibv_rc_pingpong -e -d rxe0 -g "$g" >/tmp/server.out 2>&1 &
srv=$!
ok=0
for i in $(seq 40); do
	if ibv_rc_pingpong -e -d rxe0 -g "$g" 127.0.0.1 >/tmp/client.out 2>&1; then ok=1; break; fi
	sleep 0.5
done
wait $srv; s=$?
sed "s/^/server: /" /tmp/server.out
sed "s/^/client: /" /tmp/client.out
[ $ok = 1 ] && [ $s = 0 ]'

echo "== run1: ibv_devinfo + ibv_rc_pingpong in one guest"
t0=$(now)
st=0
out=$("$VM" run1 --timeout 180 -- "$run1_cmd" 2>&1) || st=$?
printf '%s\n' "$out" | sed 's/^/  | /'
echo "run1: exit $st in $(since "$t0") s"
((st == 0)) || fail "run1 exited $st"
grep -q 'state:.*PORT_ACTIVE' <<<"$out" || fail "rxe0 port not PORT_ACTIVE"
lat=$(sed -n 's/^client: 1000 iters in .* = \(.*\) usec\/iter$/\1/p' <<<"$out")
if [[ -n $lat ]]; then
	echo "RESULT rc_pingpong (1 guest, events): $lat usec/iter"
else
	fail "no ping-pong result"
fi

# --- two guests: perftest RDMA write latency over the UDP-socket link ---
# shellcheck disable=SC2016 # expanded inside the guest
cmd_a='ib_write_lat -F -d rxe0 -x "$RDMASHIM_VM_GID_INDEX"'
# shellcheck disable=SC2016
cmd_b='for i in $(seq 60); do
	ib_write_lat -F -d rxe0 -x "$RDMASHIM_VM_GID_INDEX" "$RDMASHIM_VM_PEER" && exit 0
	sleep 1
done
exit 1'

echo "== run2: ib_write_lat server in guest a, client in guest b"
t0=$(now)
st=0
out=$("$VM" run2 --timeout 240 -- "$cmd_a" -- "$cmd_b" 2>&1) || st=$?
printf '%s\n' "$out" | sed 's/^/  | /'
echo "run2: exit $st in $(since "$t0") s"
((st == 0)) || fail "run2 exited $st"
grep -qx '\[a\] exit 0' <<<"$out" || fail "guest a (server) failed"
grep -qx '\[b\] exit 0' <<<"$out" || fail "guest b (client) failed"
# Result row: #bytes #iter t_min t_max t_typical t_avg ...
row=$(awk '$1 == "[b]" && $2 == 2 && $3 == 1000 {print; exit}' <<<"$out")
if [[ -n $row ]]; then
	awk '{printf "RESULT ib_write_lat (2 guests, 2 B): t_min %s us, t_typical %s us, t_avg %s us\n", $4, $6, $7}' <<<"$row"
else
	fail "no ib_write_lat result row"
fi

if ((FAILED)); then
	echo "softroce smoke: FAILED"
	exit 1
fi
echo "softroce smoke: OK"
