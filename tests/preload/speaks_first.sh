#!/usr/bin/env bash
# A server that speaks first (greeting, then request/response) and 100
# connections (every other one from a non-blocking client that is busy for
# 3 ms after connect(), so its Hello comes late), in each pairing:
#   both | server-only | client-only | none   exact bytes, and the transports:
#     both: every connection upgraded (shm) on both ends, whoever spoke first;
#     server-only: tcp:server-spoke-first; client-only: tcp:not-advertised.
#   latency: a plain client's connect-to-greeting time against the server
#     under rdmashim is within LATENCY_BOUND_US (default 300) of the same
#     against the plain server (medians of 200): plain clients are not waited for.
#   wait-in-CALL (poll ppoll select pselect epoll epoll_pwait2 epoll-nested
#     poll-epoll poll-nofile; the last with RLIMIT_NOFILE at 1, where taking
#     the segment's descriptors fails: on shm, tcp:fd-budget or
#     tcp:setup-failed): both under
#     rdmashim; every other connection non-blocking, its connect slowed to
#     about 1 s (a SYN dropped at a full accept queue), waiting meanwhile for
#     the greeting only (readable) with CALL. Its Hello must leave as the
#     connect completes: every connection on shm on both ends, and the
#     server's greeting write never waited 500 ms (the setup timeout is 2 s).
#   marked-syn: the server under rdmashim (and strace) asks whether a client
#     announced a Hello only when its SYN carries the mark (discovery/syn_mark.h):
#     plain clients, no question at all (no sock_diag, no probe); plain clients
#     whose own TTL is the mark's 255, a question each and still no wait;
#     clients under rdmashim, their own TTL 17 or the default, every
#     connection on shm on both ends. In every run the client's TTL after the
#     greeting is what it was before connect() (its program's own).
# usage: speaks_first.sh both|server-only|client-only|none|latency|marked-syn|wait-in-CALL
set -euo pipefail
mode=$1
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
here=$(cd "$(dirname "$0")" && pwd)
peer="$here/speaks_first.py"
work=$(mktemp -d)
trap 'kill "${server_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
count=${COUNT:-100}
mixed=--mixed  # every other client connection non-blocking and busy for 3 ms after connect()
server_opts= client_opts= server_wrap=()

launcher() { if [ "$1" = rdmashim ]; then echo "$build/bin/rdmashim run --log info --"; fi; }

run() {  # server_mode client_mode tag
  rm -f "$work/port"
  # shellcheck disable=SC2046
  timeout 60 "${server_wrap[@]}" $(launcher "$1") python3 "$peer" server --port-file "$work/port" --count "$count" $server_opts \
    >"$work/$3.server.json" 2>"$work/$3.server.log" &
  server_pid=$!
  for _ in $(seq 600); do [ -s "$work/port" ] && break; sleep 0.05; done  # strace + ASan start slowly
  [ -s "$work/port" ] || { echo "FAIL: server did not start"; cat "$work/$3.server.log"; exit 1; }
  # shellcheck disable=SC2046
  timeout 60 $(launcher "$2") python3 "$peer" client --port "$(cat "$work/port")" --count "$count" $mixed $client_opts \
    >"$work/$3.client.json" 2>"$work/$3.client.log" || {
    echo "FAIL: client failed"; cat "$work/$3.client.json" "$work/$3.client.log" "$work/$3.server.log"; exit 1; }
  wait "$server_pid" || { echo "FAIL: server failed"; cat "$work/$3.server.json" "$work/$3.server.log"; exit 1; }
  grep -q '"bad": 0' "$work/$3.client.json" && grep -q '"bad_requests": 0' "$work/$3.server.json" || {
    echo "FAIL: bytes differ"; cat "$work/$3".*; exit 1; }
  grep -q '"ttl_changed": 0' "$work/$3.client.json" || {
    echo "FAIL: a client's TTL after the greeting is not its own"; cat "$work/$3.client.json"; exit 1; }
}

count_lines() {  # log side transport
  grep -c "info: fd [0-9]* ($2) -> $3\$" "$work/$1" || true
}

expect() {  # log side transport
  local n; n=$(count_lines "$1" "$2" "$3")
  if [ "$n" != "$count" ]; then
    echo "FAIL: $1: $n of $count connections $2 -> $3"; grep -o "($2) -> .*" "$work/$1" | sort | uniq -c; exit 1
  fi
}

case $mode in
  both)
    run rdmashim rdmashim t
    expect t.client.log client shm; expect t.server.log server shm ;;
  server-only)
    run rdmashim plain t
    expect t.server.log server tcp:server-spoke-first ;;
  client-only)
    run plain rdmashim t
    expect t.client.log client tcp:not-advertised ;;
  none)
    run plain plain t ;;
  latency)
    count=200 mixed=
    run plain plain plain
    run rdmashim plain shim
    expect shim.server.log server tcp:server-spoke-first
    med() { sed -n 's/.*"median_greeting_us": \([0-9.]*\).*/\1/p' "$work/$1.client.json"; }
    plain=$(med plain) shim=$(med shim) bound=${LATENCY_BOUND_US:-300}
    echo "median connect-to-greeting: plain server ${plain} us, server under rdmashim ${shim} us (bound +${bound} us)"
    awk -v a="$plain" -v b="$shim" -v m="$bound" 'BEGIN { exit !(b - a <= m) }' || {
      echo "FAIL: a plain client waits $(awk -v a="$plain" -v b="$shim" 'BEGIN { print b - a }') us more"; exit 1; }
    ;;
  marked-syn)
    command -v strace >/dev/null || source "$here/../../scripts/lib.sh"
    command -v strace >/dev/null || ensure_packages strace >/dev/null 2>&1 ||
      { echo "SKIP: strace is missing and cannot be installed"; exit 77; }
    count=50
    asked() {  # tag: the server's questions (sock_diag requests, announcement probes)
      echo "$(grep -c "sendto(.*AF_NETLINK" "$work/$1.trace" || true) $(grep -c 'rdmashim/v1/client/' "$work/$1.trace" || true)"
    }
    # LeakSanitizer cannot run under ptrace (an ASan build would abort at exit).
    trace() {
      server_wrap=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
                   strace -f -qq -e trace=sendto,connect -o "$work/$1.trace")
    }
    trace plain; run rdmashim plain plain
    expect plain.server.log server tcp:server-spoke-first
    echo "plain clients: $(asked plain) (sock_diag questions, probes)"
    [ "$(asked plain)" = "0 0" ] || { echo "FAIL: the server asked about clients whose SYN was not marked"; exit 1; }
    trace own255; client_opts="--ttl 255" run rdmashim plain own255
    expect own255.server.log server tcp:server-spoke-first
    field() { sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p" "$work/$1"; }
    echo "plain clients with TTL 255: $(asked own255); slowest greeting $(field own255.client.json max_greeting_us) us"
    read -r diag probes <<<"$(asked own255)"
    [ "$probes" = "$count" ] && [ "$diag" -ge "$count" ] || { echo "FAIL: a marked SYN was not asked about"; exit 1; }
    awk -v g="$(field own255.client.json max_greeting_us)" 'BEGIN { exit !(g < 500000) }' || {
      echo "FAIL: a plain client with a marked SYN was waited for"; exit 1; }
    server_wrap=()
    for ttl in 17 0; do
      client_opts="--ttl $ttl" run rdmashim rdmashim "both$ttl"
      expect "both$ttl.client.log" client shm; expect "both$ttl.server.log" server shm
    done
    ;;
  wait-in-*)
    export RDMASHIM_SETUP_TIMEOUT_MS=2000
    count=4 mixed="--wait-in ${mode#wait-in-}" server_opts="--backlog 0 --accept-delay-ms 50"
    run rdmashim rdmashim t
    field() { sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p" "$work/$1"; }
    write=$(field t.server.json max_greeting_write_us) greet=$(field t.client.json max_greeting_us)
    echo "slowest greeting write (server) ${write} us; slowest connect-to-greeting of a waiting client ${greet} us (its connect ~1 s)"
    if [ "$mode" = wait-in-poll-nofile ]; then
      # A process that may hold no descriptor cannot take the segment's: the
      # clients that read their Ack while waiting so stay on TCP, at once
      # (tcp:fd-budget; tcp:setup-failed when a question that needs a new
      # descriptor, such as the server's owner, could not be asked first).
      n=$(( $(count_lines t.client.log client shm) + $(count_lines t.client.log client tcp:fd-budget) \
        + $(count_lines t.client.log client tcp:setup-failed) ))
      [ "$n" = "$count" ] || {
        echo "FAIL: $n of $count connections on shm, tcp:fd-budget or tcp:setup-failed"; cat "$work/t.client.log"; exit 1
      }
    else
      expect t.client.log client shm; expect t.server.log server shm
    fi
    awk -v w="$write" -v g="$greet" 'BEGIN { exit !(w < 500000 && g < 1500000) }' || {
      echo "FAIL: the server waited for a Hello (setup timeout 2 s)"; exit 1; }
    ;;
  *) echo "usage: $0 both|server-only|client-only|none|latency|wait-in-CALL"; exit 2 ;;
esac
echo "ok: $mode"
