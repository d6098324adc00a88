#!/usr/bin/env bash
# One cell of the fallback matrix: {rdmashim, plain} client x {rdmashim, plain}
# server x {client-first, server-first} protocol. Runs matrix_peer on both
# sides (under `rdmashim run` where asked), then checks that each side
# received exactly what the other sent (SHA-256 and count) and that every
# rdmashim side reported the transport this combination must give.
#
# usage: fallback_matrix.sh CLIENT SERVER PROTOCOL   (CLIENT/SERVER: rdmashim|plain)
# env:   RDMASHIM_BUILD (the build folder), MATRIX_BYTES (default 4 MiB + 7)
set -euo pipefail

client_mode=$1 server_mode=$2 protocol=$3
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bytes=${MATRIX_BYTES:-4194311}
peer="$build/bin/matrix_peer"
work=$(mktemp -d)
trap 'kill "${server_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

launcher() {  # prints the command prefix for a side
  if [ "$1" = rdmashim ]; then echo "$build/bin/rdmashim run --log info --"; fi
}

# shellcheck disable=SC2046
timeout 60 $(launcher "$server_mode") "$peer" server --port-file "$work/port" --protocol "$protocol" \
  --bytes "$bytes" >"$work/server.json" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || { echo "FAIL: server did not start"; cat "$work/server.log"; exit 1; }

# shellcheck disable=SC2046
timeout 60 $(launcher "$client_mode") "$peer" client --port "$(cat "$work/port")" --protocol "$protocol" \
  --bytes "$bytes" >"$work/client.json" 2>"$work/client.log" || {
  echo "FAIL: client exited with $?"; cat "$work/client.log" "$work/server.log"; exit 1; }
wait "$server_pid" || { echo "FAIL: server exited with $?"; cat "$work/server.log"; exit 1; }

field() { sed -n "s/.*\"$2\":\"\\{0,1\\}\\([0-9a-f]*\\)\"\\{0,1\\}.*/\\1/p" "$work/$1.json"; }
fail=0
check() {  # what, expected, actual
  if [ "$2" != "$3" ]; then echo "FAIL: $1: expected $2, got $3"; fail=1; fi
}
check "client->server bytes" "$(field client sent)" "$(field server received)"
check "client->server sha256" "$(field client sent_sha256)" "$(field server received_sha256)"
check "server->client bytes" "$(field server sent)" "$(field client received)"
check "server->client sha256" "$(field server sent_sha256)" "$(field client received_sha256)"
[ "$(field client sent)" -ge "$bytes" ] || { echo "FAIL: client sent too little"; fail=1; }

# The transport each rdmashim side reported for its one connection.
transport() { sed -n 's/.*rdmashim\[[0-9]*\] info: fd [0-9]* ([a-z]*) -> \(.*\)$/\1/p' "$work/$1.log" | tail -n 1; }
ct=plain st=plain
[ "$client_mode" = rdmashim ] && ct=$(transport client)
[ "$server_mode" = rdmashim ] && st=$(transport server)
expect_in() {  # side, actual, allowed...
  local side=$1 actual=$2; shift 2
  for ok in "$@"; do [ "$actual" = "$ok" ] && return 0; done
  echo "FAIL: $side reported '${actual:-nothing}', expected one of: $*"; fail=1
}
case "$client_mode/$server_mode" in
  rdmashim/rdmashim)
    if [ "$protocol" = client-first ]; then
      expect_in client "$ct" shm; expect_in server "$st" shm
    else
      # A greeting may beat the Hello; then both ends must agree on TCP.
      expect_in client "$ct" shm tcp:server-spoke-first
      expect_in server "$st" "$ct"
    fi ;;
  rdmashim/plain) expect_in client "$ct" tcp:not-advertised ;;
  plain/rdmashim)
    if [ "$protocol" = client-first ]; then expect_in server "$st" tcp:peer-plain
    else expect_in server "$st" tcp:server-spoke-first; fi ;;
esac

if [ "$fail" -ne 0 ]; then
  echo "--- client.log"; cat "$work/client.log"; echo "--- server.log"; cat "$work/server.log"
  exit 1
fi
echo "ok: $client_mode client, $server_mode server, $protocol: $(field client sent)+$(field server sent) bytes," \
  "sha256 match both ways; client transport: $ct, server transport: $st"
