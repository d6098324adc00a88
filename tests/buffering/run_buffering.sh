#!/usr/bin/env bash
# Buffering and memory of upgraded connections (both ends under rdmashim,
# each must report its connections as shm in the info log):
#   asyncio_echo  an asyncio client writes 4 MiB and awaits drain() before
#                 reading the echo of a server that echoes 64 KiB at a time
#                 with drain(): TCP absorbs that much, so must the rings;
#                 byte-exact within the timeout
#   idle_memory   after 1 GiB over one connection and an idle moment, the
#                 connection's rings hold <= 64 KiB (memfd blocks)
#   many_idle     200 connections x 1 MiB on the ring each, then idle: the rings of all of
#                 them together hold <= 200 x 16 KiB
#   client_sndbuf a client that forced a 64 MiB send buffer (root: SO_SNDBUFFORCE;
#                 the kernel reports 128 MiB) writes to a server that reads
#                 nothing yet: the rings take at least what TCP takes in the
#                 same run, and every byte arrives; the other way, the
#                 server's writes to such a client that reads nothing are
#                 held to what they are for a default client
# usage: run_buffering.sh asyncio_echo|idle_memory|many_idle|client_sndbuf
# env:   RDMASHIM_BUILD (the build folder)
set -euo pipefail

what=${1:?usage: run_buffering.sh asyncio_echo|idle_memory|many_idle}
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
here=$(cd "$(dirname "$0")" && pwd)
python=$(command -v python3 || true)
[ -n "$python" ] || { apt-get install -y python3 >/dev/null 2>&1 || true; python=$(command -v python3 || true); }
[ -n "$python" ] || { echo "SKIP: python3 is not installed"; exit 77; }
work=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

die() {
  echo "FAIL: $*"
  for f in server.log client.log client.out; do [ -e "$work/$f" ] && { echo "--- $f"; tail -n 5 "$work/$f"; }; done
  exit 1
}
shm_count() { grep -c -- '-> shm' "$1" || true; }
start_server() {
  "$bin/rdmashim" run --log info -- "$python" "$here/peers.py" server "$work/port" "$1" 2>"$work/server.log" &
  server=$!
  for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
  [ -s "$work/port" ] || die "server did not start"
}
client() { "$bin/rdmashim" run --log info -- "$@" >"$work/client.out" 2>"$work/client.log"; }

case $what in
  asyncio_echo)
    start_server echo
    timeout 20 "$bin/rdmashim" run --log info -- "$python" "$here/peers.py" echo "$(cat "$work/port")" $((4 << 20)) \
      >"$work/client.out" 2>"$work/client.log" || die "the echo did not complete (exit $?: 124 is the timeout)"
    grep -q '"exact": true' "$work/client.out" || die "echo differs"
    [ "$(shm_count "$work/client.log")" -ge 1 ] || die "client not on shm"
    [ "$(shm_count "$work/server.log")" -ge 1 ] || die "server not on shm"
    echo "PASS: 4 MiB echoed byte-exact over shm: $(cat "$work/client.out")"
    ;;
  idle_memory)
    timeout 40 "$bin/rdmashim" run --log info -- "$bin/tcpPingPong" --local --stream --size 65536 --bytes 1g \
      --idle-ms 300 --json >"$work/client.out" 2>"$work/client.log" || die "stream failed"
    [ "$(shm_count "$work/client.log")" -ge 2 ] || die "connection not on shm"
    held=$(sed -n 's/.*"idle_conn_bytes":\([0-9-]*\).*/\1/p' "$work/client.out")
    [ -n "$held" ] && [ "$held" -le 65536 ] || die "idle connection holds $held bytes after 1 GiB (want <= 65536)"
    echo "PASS: idle connection holds $held bytes after 1 GiB"
    ;;
  many_idle)
    start_server sink
    conns=200
    timeout 40 "$bin/rdmashim" run --log info -- "$python" "$here/peers.py" many "$(cat "$work/port")" "$conns" \
      $((1 << 20)) >"$work/client.out" 2>"$work/client.log" || die "client failed"
    [ "$(shm_count "$work/client.log")" -ge "$conns" ] || die "not all $conns connections on shm"
    idle=$(sed -n 's/.*"ring_bytes_idle": \([0-9]*\).*/\1/p' "$work/client.out")
    [ -n "$idle" ] && [ "$idle" -le $((conns * 16384)) ] || die "rings hold $idle bytes when idle (want <= $((conns * 16384)))"
    echo "PASS: $(cat "$work/client.out")"
    ;;
  client_sndbuf)
    big=$((64 << 20))
    # fill LABEL read|write SNDBUF [PREFIX...]: one connection, the client's
    # SO_SNDBUF forced to SNDBUF (0: left alone); sets $buffered, $received.
    fill() {
      local label=$1 mode=$2 sndbuf=$3 writer reader st=0
      shift 3
      rm -f "$work/port" "$work/go"
      "$@" "$python" "$here/peers.py" fill_server "$work/port" "$work/go" "$mode" \
        >"$work/$label.server" 2>"$work/$label.server.log" &
      local spid=$!
      for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
      [ -s "$work/port" ] || die "$label: server did not start"
      "$@" "$python" "$here/peers.py" fill "$(cat "$work/port")" "$work/go" "$mode" "$sndbuf" \
        >"$work/$label.client" 2>"$work/$label.client.log" &
      local cpid=$!
      writer=$work/$label.client reader=$work/$label.server
      [ "$mode" = write ] && writer=$work/$label.server reader=$work/$label.client
      for _ in $(seq 600); do grep -q buffered "$writer" && break; sleep 0.05; done
      touch "$work/go"
      wait "$cpid" || st=$?
      if [ "$st" = 77 ]; then kill "$spid" 2>/dev/null; echo "SKIP: $(cat "$work/$label.client.log")"; exit 77; fi
      [ "$st" = 0 ] || die "$label: client exit $st: $(tail -n 3 "$work/$label.client.log")"
      wait "$spid" || die "$label: server failed: $(tail -n 3 "$work/$label.server.log")"
      if [ $# -gt 0 ]; then
        [ "$(shm_count "$work/$label.client.log")" -ge 1 ] || die "$label: client not on shm"
        [ "$(shm_count "$work/$label.server.log")" -ge 1 ] || die "$label: server not on shm"
      fi
      buffered=$(sed -n 's/.*"buffered": \([0-9]*\).*/\1/p' "$writer")
      received=$(sed -n 's/.*"received": \([0-9]*\).*/\1/p' "$reader")
      [ -n "$buffered" ] && [ "$received" = "$buffered" ] || die "$label: $received bytes received of $buffered"
    }
    shim=("$bin/rdmashim" run --log info --)
    fill tcp read $big && tcp_in=$buffered
    fill shm read $big "${shim[@]}" && shm_in=$buffered
    [ "$shm_in" -ge "$tcp_in" ] || die "client with a $((2 * big)) B send buffer: the rings took $shm_in bytes, TCP $tcp_in"
    fill own write 0 "${shim[@]}" && own=$buffered
    fill back write $big "${shim[@]}" && back=$buffered
    [ "$back" -le "$own" ] || die "a client's send buffer let the server buffer $back bytes for it (a default client: $own)"
    echo "PASS: client's SO_SNDBUF $((2 * big)): rings $shm_in bytes, TCP $tcp_in; server to it $back (default client $own)"
    ;;
  *) die "unknown test $what" ;;
esac
