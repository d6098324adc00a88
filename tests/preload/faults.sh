#!/usr/bin/env bash
# A setup step made to fail (RDMASHIM_TEST_FAULT, core/util/fault.h) on one
# side of a real client/server pair under the preload (matrix_peer, both
# under `rdmashim run`, client speaks first): the connection must fall back
# to TCP on both sides with the expected reasons, every byte intact both ways
# (count and SHA-256), no hang, and the faulted side must log that the fault
# point was reached. `none` runs the pair without a fault and requires shm on
# both sides, so each fault case is known to fall back because of its fault.
#
# usage: faults.sh none
#        faults.sh client|server STEP CLIENT_OUTCOME SERVER_OUTCOME
# env:   RDMASHIM_BUILD (the build folder), FAULT_BYTES (default 1 MiB + 7),
#        FAULT_PROTOCOL (matrix_peer --protocol, default client-first),
#        FAULT_HOST (the address, default 127.0.0.1), FAULT_UPGRADED (what
#        `none` must give, default shm; verbs in tests/softroce/guest/faults.sh),
#        FAULT_LIMIT_S (setup timeout and bound on a run, default 10; each
#        process is killed after 3x that), FAULT_BLOCK_MS (a *-block step,
#        which never returns: the faulted side's setup timeout, so its
#        watchdog gives up after that long, and it must warn that it did)
set -euo pipefail

upgraded=${FAULT_UPGRADED:-shm}
side=$1 step=${2:-} want_client=${3:-$upgraded} want_server=${4:-$upgraded}
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bytes=${FAULT_BYTES:-1048583} protocol=${FAULT_PROTOCOL:-client-first} host=${FAULT_HOST:-127.0.0.1}
peer="$build/bin/matrix_peer"
work=$(mktemp -d)
trap 'kill "${server_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

server_env=() client_env=()
case $side in
  none) ;;
  server) server_env=("RDMASHIM_TEST_FAULT=$step") ;;
  client) client_env=("RDMASHIM_TEST_FAULT=$step") ;;
  *) echo "usage: faults.sh none | client|server STEP CLIENT_OUTCOME SERVER_OUTCOME"; exit 2 ;;
esac

# A long setup timeout: a fallback that waited for it (instead of failing
# at once) is caught by the elapsed time below.
limit_s=${FAULT_LIMIT_S:-10}
export RDMASHIM_SETUP_TIMEOUT_MS=$((limit_s * 1000))
block_ms=${FAULT_BLOCK_MS:-}
if [ -n "$block_ms" ]; then
  case $side in
    server) server_env+=("RDMASHIM_SETUP_TIMEOUT_MS=$block_ms") ;;
    client) client_env+=("RDMASHIM_SETUP_TIMEOUT_MS=$block_ms") ;;
  esac
fi
start=$(date +%s%N)
env "${server_env[@]}" timeout $((3 * limit_s)) "$build/bin/rdmashim" run --log info -- "$peer" server --bind "$host" --port-file "$work/port" \
  --protocol "$protocol" --bytes "$bytes" >"$work/server.json" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || { echo "FAIL: server did not start"; cat "$work/server.log"; exit 1; }
env "${client_env[@]}" timeout $((3 * limit_s)) "$build/bin/rdmashim" run --log info -- "$peer" client --host "$host" --port "$(cat "$work/port")" \
  --protocol "$protocol" --bytes "$bytes" >"$work/client.json" 2>"$work/client.log" || {
  echo "FAIL: client exited with $?"; cat "$work/client.log" "$work/server.log"; exit 1; }
wait "$server_pid" || { echo "FAIL: server exited with $?"; cat "$work/server.log"; exit 1; }
elapsed_ms=$((($(date +%s%N) - start) / 1000000))

field() { sed -n "s/.*\"$2\":\"\\{0,1\\}\\([0-9a-f]*\\)\"\\{0,1\\}.*/\\1/p" "$work/$1.json"; }
fail=0
check() {  # what, expected, actual
  if [ "$2" != "$3" ]; then echo "FAIL: $1: expected '$2', got '$3'"; fail=1; fi
}
check "client->server bytes" "$(field client sent)" "$(field server received)"
check "client->server sha256" "$(field client sent_sha256)" "$(field server received_sha256)"
check "server->client bytes" "$(field server sent)" "$(field client received)"
check "server->client sha256" "$(field server sent_sha256)" "$(field client received_sha256)"
[ "$(field client sent)" -ge "$bytes" ] && [ "$(field server sent)" -ge "$bytes" ] || {
  echo "FAIL: a side sent too little"; fail=1; }

# A client that sends no Hello meets a server that speaks first: the server
# calls that server-spoke-first, not peer-plain.
[ "$protocol" = server-first ] && [ "$want_server" = tcp:peer-plain ] && want_server=tcp:server-spoke-first

# A server learns that its client could not attach from the client's Plain
# frame, which goes out with the client's next send (never on its own: it
# could reset a peer that already closed). A client-first client may send
# everything and half-close before it reads the Ack: then the server never
# learns, its record stays shm, while its bytes went framed over TCP (checked
# above). server-first makes the client read the Ack first: exact there.
allow_server=$want_server
[ "$protocol" = client-first ] && [ "$side" = client ] && [ "$want_server" = tcp:setup-failed ] &&
  allow_server="tcp:setup-failed $upgraded"

# The last report of each side's one connection (a server that counted an
# upgrade reports again when the client says it could not attach).
transport() { sed -n 's/.*rdmashim\[[0-9]*\] info: fd [0-9]* ([a-z]*) -> \(.*\)$/\1/p' "$work/$1.log" | tail -n 1; }
check "client transport" "$want_client" "$(transport client)"
got_server=$(transport server)
case " $allow_server " in
  *" $got_server "*) ;;
  *) echo "FAIL: server transport: expected '$allow_server', got '$got_server'"; fail=1 ;;
esac
if [ "$side" != none ]; then
  grep -q "info: test fault: ${step%%:*} made to fail" "$work/$side.log" || {
    echo "FAIL: the $side never reached the fault point '$step'"; fail=1; }
fi
[ "$elapsed_ms" -lt $((limit_s * 1000)) ] || { echo "FAIL: took ${elapsed_ms} ms: something waited for the setup timeout"; fail=1; }
if [ -n "$block_ms" ]; then
  # The watchdog gave up on the blocked provider call, once, and said so.
  grep -q 'rdmashim\[[0-9]*\] warn: verbs: the RDMA provider did not answer' "$work/$side.log" || {
    echo "FAIL: the $side did not warn that its watchdog gave up"; fail=1; }
  other=server; [ "$side" = server ] && other=client
  ! grep -q 'rdmashim\[[0-9]*\] warn' "$work/$other.log" || { echo "FAIL: rdmashim warned on the $other"; fail=1; }
else
  ! grep -q 'rdmashim\[[0-9]*\] warn' "$work/client.log" "$work/server.log" || { echo "FAIL: rdmashim warned"; fail=1; }
fi

if [ "$fail" -ne 0 ]; then
  echo "--- client.log"; cat "$work/client.log"; echo "--- server.log"; cat "$work/server.log"
  exit 1
fi
echo "ok: fault '${step:-none}' on the $side: client -> $(transport client), server -> $(transport server)," \
  "$(field client sent)+$(field server sent) bytes, sha256 match both ways, ${elapsed_ms} ms"
