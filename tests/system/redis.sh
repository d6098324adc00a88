#!/usr/bin/env bash
# Redis 7, unmodified, under rdmashim: one case per run.
#
#   both          redis-cli under rdmashim against redis-server under rdmashim
#   plain-client  plain redis-cli against redis-server under rdmashim (fallback)
#   plain-server  redis-cli under rdmashim against a plain redis-server (fallback)
#       Each sets keys to random values of 1 B, 1 KiB, 64 KiB and 1 MiB
#       (redis-cli -x set), reads them back (redis-cli --raw get) and
#       compares SHA-256 of what was set and what came back; runs 100 INCRs
#       on one connection and a multi-command session. Then checks the
#       transport every rdmashim process reported for every connection
#       (RDMASHIM_LOG=info): both: shm on both sides, as many server lines as
#       client lines; plain-client: the server says tcp:peer-plain;
#       plain-server: the client says tcp:not-advertised.
#   benchmark     redis-benchmark (both ends under rdmashim): GET, SET, LPUSH
#       with 10 clients, GET and SET pipelined (-P 16), SET/GET of 64 KiB
#       values: every test completes with no error reply; every connection
#       on shm on both sides.
#
# usage: redis.sh both|plain-client|plain-server|benchmark
# env:   RDMASHIM_BUILD (the build folder), KEEP_WORK=1 keeps the temp
#        folder of a failed run.
# Exit 77 (skipped) when Redis is missing and we may not install it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

mode=${1:?usage: redis.sh both|plain-client|plain-server|benchmark}
case $mode in both|plain-client|plain-server|benchmark) ;; *) echo "unknown case $mode"; exit 2 ;; esac

sys_need_packages redis-server redis-tools
sys_workdir
sys_install_shim
cd "$work"

# redis_start shim|plain: a server on a free port, in the foreground of a
# time-limited background job; sets port and server_log (its stderr, where
# rdmashim's lines go).
redis_start() {
  local how=$1 launcher=() try pid
  [ "$how" = shim ] && launcher=("$SHIM" run --log info --)
  server_log=$work/redis-$how.err
  for try in 1 2 3; do
    port=$(sys_free_port)
    timeout -k 5 600 "${launcher[@]}" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
      --daemonize no --protected-mode no --dir "$work" >"$work/redis-$how.out" 2>"$server_log" &
    pid=$!
    disown "$pid"   # stopped by us (sys_kill_tree), not reported by the shell
    sys_on_exit "sys_kill_tree $pid"
    sys_watch TERM "$pid"   # timeout(1) passes it on to the server
    sys_wait_port "$port" 10 && return 0
    sys_kill_tree "$pid"
  done
  echo "FAIL: could not start the $how redis-server"; cat "$work/redis-$how.out" "$server_log"
  exit 1
}

# cli shim|plain ARGS...: redis-cli (under rdmashim when asked) with a time
# limit; its stderr is appended to $client_err.
client_err=$work/client.err
: >"$client_err"
cli() {
  local how=$1; shift
  if [ "$how" = shim ]; then timeout 60 "$SHIM" run --log info -- "$@" 2>>"$client_err"
  else timeout 60 "$@" 2>>"$client_err"; fi
}

sha() { sha256sum | cut -d' ' -f1; }
check() {  # what expected actual
  if [ "$2" = "$3" ]; then echo "ok: $1"; else echo "FAIL: $1: expected '$2', got '$3'"; sys_failed=1; fi
}

# values CLIENT: the key/value round trips; counts the connections made.
connections=0
values() {
  local how=$1 size f got rc
  for size in 1 1024 65536 1048576; do
    f=$work/value.$size
    head -c "$size" /dev/urandom >"$f"
    got=$(cli "$how" redis-cli -h 127.0.0.1 -p "$port" -x set "key:$size" <"$f") || true
    check "set $size-byte value" OK "$got"
    # --raw prints the value and one newline: drop exactly that byte.
    rc=0
    cli "$how" redis-cli -h 127.0.0.1 -p "$port" --raw get "key:$size" >"$work/got.$size" || rc=$?
    check "get $size-byte value: exit status" 0 "$rc"
    check "get $size-byte value: sha256" "$(sha <"$f")" "$(head -c -1 "$work/got.$size" | sha)"
    check "strlen of the $size-byte value" "$size" "$(cli "$how" redis-cli -h 127.0.0.1 -p "$port" strlen "key:$size")"
    connections=$((connections + 3))
  done
  check "100 INCRs on one connection" 100 \
    "$(cli "$how" redis-cli -h 127.0.0.1 -p "$port" -r 100 incr counter | tail -n 1)"
  # One connection, several commands read from stdin, replies in order.
  got=$(printf '%s\n' 'DEL list' 'RPUSH list a b c d' 'LRANGE list 0 -1' 'MGET key:1024 nokey' 'DBSIZE' 'GET counter' |
        cli "$how" redis-cli -h 127.0.0.1 -p "$port" --raw | sha)
  expected=$( { printf '%s\n' 0 4 a b c d; cat "$work/value.1024"; printf '\n\n%s\n%s\n' 6 100; } | sha)
  check "multi-command session (6 commands, replies in order)" "$expected" "$got"
  connections=$((connections + 2))
}

case $mode in
  both)
    redis_start shim
    values shim
    sys_expect_transports "redis-cli (rdmashim) -> redis-server (rdmashim)" "$client_err" client 1 shm "$connections"
    sys_expect_transports "redis-cli (rdmashim) -> redis-server (rdmashim)" "$server_log" server 1 shm "$connections" ;;
  plain-client)
    redis_start shim
    values plain
    sys_expect_transports "plain redis-cli -> redis-server (rdmashim)" "$server_log" server 1 tcp:peer-plain "$connections" ;;
  plain-server)
    redis_start plain
    values shim
    # Every redis-cli makes one connection, reported once even though hiredis
    # connects non-blocking and then calls connect() again to learn the result.
    sys_expect_transports "redis-cli (rdmashim) -> plain redis-server" "$client_err" client 1 tcp:not-advertised "$connections"
    ;;
  benchmark)
    redis_start shim
    bench() {  # what ARGS...: one redis-benchmark run; every test must report a rate
      local what=$1 out rc=0; shift
      out=$(cli shim redis-benchmark -h 127.0.0.1 -p "$port" --csv -e "$@") || rc=$?
      local rows errors
      rows=$(grep -c '^"[A-Z_ ()0-9]*","[0-9.]*"' <<<"$out" || true)
      errors=$(grep -ci 'err' <<<"$out" || true)
      if [ "$rc" -ne 0 ] || [ "$errors" -ne 0 ] || [ "$rows" -ne "$expect_rows" ] || grep -q '"0.00"' <<<"$out"; then
        echo "FAIL: redis-benchmark $what: exit $rc, $rows result rows (expected $expect_rows), $errors error lines"
        echo "$out" | head -20; sys_failed=1
      else
        echo "ok: redis-benchmark $what: $(grep '^"[A-Z]' <<<"$out" | cut -d, -f1,2 | tr -d '"' | tr '\n' ' ')(requests/s)"
      fi
    }
    expect_rows=3 bench "GET, SET, LPUSH, 10 clients" -t get,set,lpush -n 20000 -c 10
    expect_rows=3 bench "GET, SET, LPUSH, 1 client" -t get,set,lpush -n 20000 -c 1
    expect_rows=2 bench "GET, SET pipelined -P 16, 10 clients" -t get,set -n 200000 -c 10 -P 16
    expect_rows=2 bench "GET, SET of 64 KiB values, 4 clients" -t set,get -n 2000 -c 4 -d 65536
    sys_expect_transports "redis-benchmark (rdmashim) -> redis-server (rdmashim)" "$client_err" client 1 shm
    sys_expect_transports "redis-benchmark (rdmashim) -> redis-server (rdmashim)" "$server_log" server 1 shm "$sys_last_count" ;;
esac
sys_no_warnings client "$client_err"
[ -f "$work/redis-shim.err" ] && sys_no_warnings server "$work/redis-shim.err"

if [ "$sys_failed" -ne 0 ]; then
  echo "--- client stderr"; head -50 "$client_err"
  echo "--- server stderr"; head -50 "$server_log"
  exit 1
fi
echo "PASS: redis $mode"
