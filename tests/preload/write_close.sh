#!/usr/bin/env bash
# Clients that write and close without ever reading (nc -q0), both ends under
# rdmashim (tests/preload/write_close.py; tests/interleave README,
# "unread-ack-reset"). Every byte and a clean EOF must reach the server:
#   late:   the server reads 400 ms after each accept, when the client has
#           closed (and exited): its Hello is answered by no Ack, and the
#           client neither draws an RST nor waits at exit for the server
#           (under 250 ms from its last line to its exit; the setup timeout
#           is 5 s), as a server that has not read the Hello can send none.
#   prompt: the server reads at once (its Ack races the client's close).
#   epoll:  the server reads 50 ms late; the client's socket is in an epoll
#           set since before connect() (asio's async_connect): the set never
#           reports it after close() (the held socket is dropped from it).
#   half-close: shutdown(SHUT_WR), then the reply read to EOF: still
#           upgraded (the client kept its announcement), every connection shm.
# In the client, a closed number is the lowest free one again, rdmashim's
# held socket closes with EBADF and can be dup2()'d over.
# usage: write_close.sh late|prompt|epoll|half-close
set -euo pipefail
mode=$1
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'kill "${server_pid:-}" 2>/dev/null || true; [ -n "${WC_KEEP:-}" ] || rm -rf "$work"' EXIT
count=20 size=200000 late=0 reply=() client=()
case $mode in
  late) count=4 late=400 size=1000 ;;
  prompt) ;;
  epoll) count=6 late=50 size=1000 client=(--epoll) ;;
  half-close) reply=(--reply) client=(--half-close) ;;
  *) echo "usage: $0 late|prompt|epoll|half-close" >&2; exit 2 ;;
esac
export RDMASHIM_SETUP_TIMEOUT_MS=5000
# Every connection here is short and each must try its upgrade.
export RDMASHIM_SHORT_CONN_MS=0
run=("$build/bin/rdmashim" run --log ${WC_LOG:-info} --)
timeout 60 "${run[@]}" python3 "$here/write_close.py" server --port-file "$work/port" --count "$count" --size "$size" \
  --late-ms "$late" "${reply[@]}" >"$work/server.json" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || { echo "FAIL: server did not start"; cat "$work/server.log"; exit 1; }
start=$(date +%s%N)
timeout 60 "${run[@]}" python3 "$here/write_close.py" client --port "$(cat "$work/port")" --count "$count" --size "$size" \
  "${client[@]}" >"$work/client.json" 2>"$work/client.log" || {
  echo "FAIL: client failed"; cat "$work/client.json" "$work/client.log"; exit 1; }
done=$(date +%s%N)
ms=$(((done - start) / 1000000))
# From the client's last line to its exit: what it waited for at exit.
exit_ms=$(python3 -c 'import json,sys; print(int(int(sys.argv[2]) / 1e6 - json.load(open(sys.argv[1]))["end"] * 1000))' \
  "$work/client.json" "$done")
wait "$server_pid" || { echo "FAIL: server failed"; cat "$work/server.json" "$work/server.log"; exit 1; }
cat "$work/server.json" "$work/client.json"
echo "client ran $ms ms for $count connections, $exit_ms ms of them after its last line"
grep -q '"bad": 0' "$work/server.json" || { echo "FAIL: server saw errors"; exit 1; }
! grep -q 'rdmashim\[[0-9]*\] warn' "$work/server.log" "$work/client.log" || { echo "FAIL: rdmashim warned"; exit 1; }
servers=$(grep -c 'info: fd [0-9]* (server) -> ' "$work/server.log" || true)
[ "$servers" = "$count" ] || { echo "FAIL: $servers server reports for $count connections"; exit 1; }
case $mode in
  late)
    # The server read after the client was gone: no Ack, TCP; the client's
    # exit did not wait out the setup timeout (5 s) per connection.
    n=$(grep -c '(server) -> tcp:setup-failed$' "$work/server.log" || true)
    [ "$n" = "$count" ] || { echo "FAIL: $n of $count server connections refused the Ack"; cat "$work/server.log"; exit 1; }
    [ "$exit_ms" -lt 250 ] || { echo "FAIL: the client waited $exit_ms ms at exit (for the server)"; exit 1; } ;;
  prompt|epoll)
    # Either way is fine here (the Ack races the close), but at least some
    # connection saw a Hello: no report may be tcp:peer-plain.
    ! grep -q 'tcp:peer-plain' "$work/server.log" || { echo "FAIL: a Hello was not seen"; exit 1; }
    [ "$exit_ms" -lt 3000 ] || { echo "FAIL: the client waited $exit_ms ms at exit"; exit 1; } ;;
  half-close)
    n=$(grep -c '(server) -> shm$' "$work/server.log" || true)
    c=$(grep -c '(client) -> shm$' "$work/client.log" || true)
    [ "$n" = "$count" ] && [ "$c" = "$count" ] || { echo "FAIL: shm on $n server / $c client connections of $count"; exit 1; } ;;
esac
echo "ok: write_close $mode"
