#!/usr/bin/env bash
# End-to-end tests of rdma_send / rdma_recv on this host: real binaries,
# data from cat_gen (deterministic, so the expected SHA-256 is computed from
# a second run of the generator instead of a stored file), SHA-256 of what
# arrived, exit codes, messages and the transport each side reported.
#
# usage: cat_test.sh CASE [ARGS...]
#   transfer BYTES [RING]     stdin -> rdma_send -> rdma_recv -> sha256sum, --verify, shm
#   file BYTES                the same with rdma_send FILE
#   chain BYTES               rdma_send -> rdma_recv | rdma_send -> rdma_recv
#   tcp BYTES                 --transport tcp on both ends
#   kill-sender [tcp]         SIGKILL rdma_send mid-transfer: rdma_recv fails fast, with a message
#   kill-receiver [tcp]       SIGKILL rdma_recv mid-transfer: rdma_send fails fast, with a message
#   closed-downstream         rdma_recv | head -c 10: both fail cleanly
#   corrupt                   a flipped byte (test hook) is caught by --verify
#   interactive               a trickle of input arrives as it is written, not held back
#   stray                     a connection that is not rdma_send is dropped; the real one is served
#   errors                    usage errors exit 2; refused connection, missing file exit 1
# Every case that moves data without --transport tcp also requires both tools
# to say (-v, or --json) they took shm, the default on one host: a failure
# path tested over plain TCP proves nothing about the ring's. So under
# RDMASHIM_TRANSPORT=tcp (or RDMASHIM_DISABLE=1) they fail; tcp.*, *.tcp and
# errors do not.
# env: RDMASHIM_BUILD (the build folder)
set -uo pipefail

build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
gen=$bin/cat_gen
case_name=${1:?usage: cat_test.sh CASE [ARGS...]}
shift
work=$(mktemp -d)
spawned=()

cleanup() {
  # What this script started, by id: each spawned shell's children, then it.
  for p in "${spawned[@]}"; do
    pkill -KILL -P "$p" 2>/dev/null
    kill -KILL "$p" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL ($case_name): $*"
  for f in "$work"/*.err "$work"/*.json; do
    [ -s "$f" ] && { echo "--- $(basename "$f")"; cat "$f"; }
  done
  exit 1
}

# Runs a command in the background with its pid in $work/NAME.pid and its
# exit code, once done, in $work/NAME.rc. stdin/stdout as given by the caller
# through the remaining words (evaluated by bash -c).
spawn() {
  local name=$1 cmd=$2
  bash -c "echo \$\$ >'$work/$name.pid'; $cmd; echo \$? >'$work/$name.rc'" &
  spawned+=($!)
  for _ in $(seq 500); do [ -s "$work/$name.pid" ] && break; sleep 0.01; done
}

# Waits at most SECONDS for NAME's exit code; prints it (or fails).
rc_of() {
  local name=$1 limit=${2:-120}
  for _ in $(seq $((limit * 20))); do
    [ -s "$work/$name.rc" ] && { cat "$work/$name.rc"; return 0; }
    sleep 0.05
  done
  fail "$name still running after ${limit} s"
}

# Starts rdma_recv NAME on a free port; its stdout goes through OUT (a shell
# command, default sha256sum into NAME.sha). Its exit code lands in NAME.rc,
# the whole pipeline's in NAME-pipe.rc; rdma_recv is a child of the pid in
# NAME.pid. Sets $port.
recv_start() {
  local name=$1 out=$2
  shift 2
  [ -n "$out" ] || out="sha256sum | cut -d' ' -f1 >'$work/$name.sha'"
  bash -c "echo \$\$ >'$work/$name.pid'
    $bin/rdma_recv --listen 127.0.0.1:0 --port-file '$work/$name.port' --json $* 2>'$work/$name.err' | $out
    echo \${PIPESTATUS[0]} >'$work/$name.rc'; echo done >'$work/$name-pipe.rc'" &
  spawned+=($!)
  for _ in $(seq 500); do [ -s "$work/$name.port" ] && break; sleep 0.01; done
  [ -s "$work/$name.port" ] || fail "rdma_recv $name did not start listening"
  port=$(cat "$work/$name.port")
}

expected_sha() { "$gen" "$1" "${2:-1}" | sha256sum | cut -d' ' -f1; }
json_field() { sed -n "s/.*\"$2\":\"\\{0,1\\}\\([^\",}]*\\)\"\\{0,1\\}[,}].*/\\1/p" "$1" | tail -n 1; }
# rdma_recv's --json line is the last line of its stderr.
recv_json() { grep '^{' "$work/$1.err" | tail -n 1 >"$work/$1.json"; }

check_eq() { [ "$2" = "$3" ] || fail "$1: expected '$2', got '$3'"; }

# The transport a tool run with -v said it took, from $work/NAME.err:
# "rdma_recv: receiving over T" / "rdma_send: connected to HOST:PORT over T".
said_transport() {
  sed -n 's/^rdma_recv: receiving over \([^ ]*\)$/\1/p; s/^rdma_send: connected to [^ ]* over \([^ ]*\)$/\1/p' \
    "$work/$1.err" | tail -n 1
}
# expect_transport WANT NAME...: each tool (run with -v) said it took WANT
# (shm, or tcp for any tcp:* reason).
expect_transport() {
  local want=$1 name t
  shift
  for name in "$@"; do
    t=$(said_transport "$name")
    case $want in
      tcp) [[ "$t" == tcp* ]] || fail "$name: transport '${t:-none said}', expected tcp" ;;
      *) check_eq "$name: transport" "$want" "${t:-none said}" ;;
    esac
  done
}

# One transfer from stdin with --verify; checks everything a success means.
transfer() {
  local bytes=$1 seed=${2:-1} send_args=${3:-} recv_args=${4:-} want_transport=${5:-shm}
  recv_start r "" "$recv_args"
  "$gen" "$bytes" "$seed" | timeout 300 "$bin/rdma_send" --json $send_args "127.0.0.1:$port" \
    >"$work/s.json" 2>"$work/s.err"
  local src=${PIPESTATUS[1]}
  check_eq "rdma_send exit code" 0 "$src"
  check_eq "rdma_recv exit code" 0 "$(rc_of r)"
  rc_of r-pipe >/dev/null
  recv_json r
  check_eq "sha256 of what arrived" "$(expected_sha "$bytes" "$seed")" "$(cat "$work/r.sha")"
  check_eq "bytes (rdma_send json)" "$bytes" "$(json_field "$work/s.json" bytes)"
  check_eq "bytes (rdma_recv json)" "$bytes" "$(json_field "$work/r.json" bytes)"
  case $want_transport in
    tcp) [[ "$(json_field "$work/s.json" transport)" == tcp* ]] || fail "rdma_send transport $(json_field "$work/s.json" transport), expected tcp"
         [[ "$(json_field "$work/r.json" transport)" == tcp* ]] || fail "rdma_recv transport $(json_field "$work/r.json" transport), expected tcp" ;;
    *) check_eq "rdma_send transport" "$want_transport" "$(json_field "$work/s.json" transport)"
       check_eq "rdma_recv transport" "$want_transport" "$(json_field "$work/r.json" transport)" ;;
  esac
}

# Kills one end of a long transfer mid-way; the other must exit 1 within
# 5 s with a message naming what happened.
kill_one() {
  local victim=$1 flags=${2:-}
  recv_start r "cat >/dev/null" "-v $flags"
  spawn s "$gen 1000g | exec $bin/rdma_send -v $flags 127.0.0.1:$port 2>'$work/s.err'"
  # Mid-transfer: wait until bytes flow (rdma_recv's stdout is a pipe we
  # cannot see; give it a moment, the generator makes GB/s).
  sleep 1
  local other pid
  if [ "$victim" = sender ]; then
    pid=$(pgrep -P "$(cat "$work/s.pid")" -x rdma_send || cat "$work/s.pid")
    other=r
  else
    pid=$(pgrep -P "$(cat "$work/r.pid")" -x rdma_recv)
    other=s
  fi
  [ -n "$pid" ] || fail "no $victim process to kill"
  [ -s "$work/$other.rc" ] && fail "the transfer ended before the kill: $(cat "$work/$other.rc")"
  # Both ends on the transport this case is about: shm, or tcp with --transport tcp.
  if [ -n "$flags" ]; then expect_transport tcp r s; else expect_transport shm r s; fi
  kill -KILL "$pid"
  local t0=$SECONDS rc
  rc=$(rc_of "$other" 5)
  [ "$rc" -eq 1 ] || fail "the surviving end exited $rc, expected 1"
  if [ "$victim" = sender ]; then
    grep -q "rdma_recv: sender closed the connection after [0-9]* bytes, before the end of the stream\|rdma_recv: connection to the sender failed after" "$work/r.err" ||
      fail "rdma_recv's message does not say the sender went away"
  else
    grep -q "rdma_send: connection to rdma_recv lost after [0-9]* bytes\|rdma_send: rdma_recv closed the connection" "$work/s.err" ||
      fail "rdma_send's message does not say the receiver went away"
  fi
  echo "ok: $other noticed in $((SECONDS - t0)) s: $(cat "$work/$other.err")"
}

case $case_name in
  transfer)
    bytes=$1
    if [ -n "${2:-}" ]; then export RDMASHIM_RING_SIZE=$2; fi
    transfer "$bytes" 3 --verify
    ;;
  file)
    bytes=$1
    "$gen" "$bytes" 5 >"$work/input"
    recv_start r ""
    timeout 120 "$bin/rdma_send" --json --verify "127.0.0.1:$port" "$work/input" >"$work/s.json" 2>"$work/s.err"
    check_eq "rdma_send exit code" 0 "$?"
    check_eq "rdma_recv exit code" 0 "$(rc_of r)"
    rc_of r-pipe >/dev/null
    check_eq "sha256" "$(sha256sum <"$work/input" | cut -d' ' -f1)" "$(cat "$work/r.sha")"
    check_eq "verified" true "$(json_field "$work/s.json" verified)"
    check_eq "transport" shm "$(json_field "$work/s.json" transport)"
    recv_json r
    check_eq "rdma_recv transport" shm "$(json_field "$work/r.json" transport)"
    ;;
  tcp)
    transfer "$1" 4 "--transport tcp --verify" "--transport tcp" tcp
    ;;
  chain)
    bytes=$1
    recv_start c ""           # last stage
    port_c=$port
    recv_start b "$bin/rdma_send --json 127.0.0.1:$port_c >'$work/bs.json' 2>'$work/bs.err'" --verify
    port_b=$port
    "$gen" "$bytes" 9 | timeout 120 "$bin/rdma_send" --json --verify "127.0.0.1:$port_b" >"$work/a.json" 2>"$work/a.err"
    check_eq "first rdma_send exit code" 0 "${PIPESTATUS[1]}"
    check_eq "middle rdma_recv exit code" 0 "$(rc_of b)"
    check_eq "last rdma_recv exit code" 0 "$(rc_of c)"
    rc_of b-pipe >/dev/null
    rc_of c-pipe >/dev/null
    recv_json b
    recv_json c
    check_eq "sha256 at the end of the chain" "$(expected_sha "$bytes" 9)" "$(cat "$work/c.sha")"
    for j in a.json b.json bs.json c.json; do
      check_eq "$j transport" shm "$(json_field "$work/$j" transport)"
      check_eq "$j bytes" "$bytes" "$(json_field "$work/$j" bytes)"
    done
    ;;
  kill-sender)
    kill_one sender "${1:+--transport $1}"
    ;;
  kill-receiver)
    kill_one receiver "${1:+--transport $1}"
    ;;
  closed-downstream)
    recv_start r "head -c 10 >'$work/head.out'" -v
    spawn s "$gen 100g | exec $bin/rdma_send -v 127.0.0.1:$port 2>'$work/s.err'"
    check_eq "rdma_recv exit code" 1 "$(rc_of r 10)"
    check_eq "rdma_send exit code" 1 "$(rc_of s 10)"
    check_eq "what head kept" "$("$gen" 10 | od -An -tx1)" "$(od -An -tx1 <"$work/head.out")"
    grep -q "rdma_recv: writing to stdout failed after [0-9]* bytes: Broken pipe" "$work/r.err" ||
      fail "rdma_recv does not say its output was closed"
    grep -q "rdma_send: rdma_recv stopped the transfer: writing its output failed (Broken pipe)" "$work/s.err" ||
      fail "rdma_send does not say why the receiver stopped"
    expect_transport shm r s
    cat "$work/r.err" "$work/s.err"
    # A downstream that goes away after the whole stream arrived, while
    # rdma_recv still writes it out: found after the trailer, and still
    # reported to both ends (3 MiB: more than the pipe holds, fewer than
    # rdma_recv's buffers).
    recv_start r2 "bash -c 'sleep 1; exec 0<&-; sleep 3'" -v
    "$gen" 3m | timeout 20 "$bin/rdma_send" -v "127.0.0.1:$port" 2>"$work/s2.err"
    check_eq "rdma_send exit code (small transfer)" 1 "${PIPESTATUS[1]}"
    check_eq "rdma_recv exit code (small transfer)" 1 "$(rc_of r2 10)"
    grep -q "rdma_recv: writing to stdout failed after [0-9]* bytes: Broken pipe" "$work/r2.err" ||
      fail "rdma_recv does not say its output was closed (small transfer)"
    grep -q "rdma_send: rdma_recv reports writing its output failed (Broken pipe)" "$work/s2.err" ||
      fail "rdma_send does not say why the receiver failed (small transfer)"
    expect_transport shm r2 s2
    ;;
  corrupt)
    # The sender flips one bit after taking the checksum: rdma_recv must
    # refuse the data (exit 1) and rdma_send must report it (exit 1).
    recv_start r "" -v --verify
    "$gen" 3m 2 | RDMACAT_TEST_CORRUPT_AT=1234567 timeout 60 "$bin/rdma_send" -v "127.0.0.1:$port" 2>"$work/s.err"
    check_eq "rdma_send exit code" 1 "${PIPESTATUS[1]}"
    check_eq "rdma_recv exit code" 1 "$(rc_of r)"
    grep -q "rdma_recv: checksum mismatch over 3145728 bytes" "$work/r.err" || fail "no checksum mismatch message"
    grep -q "rdma_send: rdma_recv reports checksum mismatch" "$work/s.err" || fail "rdma_send does not report it"
    expect_transport shm r s
    # Without a checksum the same corruption goes through (which is why --verify exists).
    recv_start r2 "" -v
    "$gen" 3m 2 | RDMACAT_TEST_CORRUPT_AT=1234567 timeout 60 "$bin/rdma_send" -v "127.0.0.1:$port" 2>"$work/s2.err"
    check_eq "rdma_send exit code without --verify" 0 "${PIPESTATUS[1]}"
    check_eq "rdma_recv exit code without --verify" 0 "$(rc_of r2)"
    rc_of r2-pipe >/dev/null
    [ "$(cat "$work/r2.sha")" != "$(expected_sha 3m 2)" ] || fail "the test hook did not corrupt anything"
    expect_transport shm r2 s2
    ;;
  interactive)
    # A slow producer: each piece must reach rdma_recv's stdout while the
    # producer still sleeps (no waiting for a full buffer).
    recv_start r "cat >'$work/out'" -v
    spawn s "{ printf first; sleep 2; printf second; sleep 2; } | exec $bin/rdma_send -v 127.0.0.1:$port 2>'$work/s.err'"
    sleep 1
    check_eq "after 1 s" first "$(cat "$work/out")"
    sleep 2
    check_eq "after 3 s" firstsecond "$(cat "$work/out")"
    check_eq "rdma_send exit code" 0 "$(rc_of s 10)"
    check_eq "rdma_recv exit code" 0 "$(rc_of r 10)"
    expect_transport shm r s
    ;;
  stray)
    recv_start r "" -v
    # Something that is not rdma_send connects, says nonsense and leaves.
    exec 3<>"/dev/tcp/127.0.0.1/$port"
    printf 'GET / HTTP/1.0\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' >&3
    exec 3>&-
    sleep 0.5
    [ -s "$work/r.rc" ] && fail "rdma_recv exited after a stray connection"
    "$gen" 1m 6 | timeout 60 "$bin/rdma_send" -v "127.0.0.1:$port" 2>"$work/s.err"
    check_eq "rdma_send exit code" 0 "${PIPESTATUS[1]}"
    check_eq "rdma_recv exit code" 0 "$(rc_of r)"
    rc_of r-pipe >/dev/null
    check_eq "sha256" "$(expected_sha 1m 6)" "$(cat "$work/r.sha")"
    grep -q "dropped a connection that is not rdma_send (bad header)" "$work/r.err" || fail "no warning about the stray connection"
    # The real one, after the stray: on shm.
    expect_transport shm r s
    ;;
  errors)
    "$bin/rdma_send" >/dev/null 2>&1; check_eq "rdma_send without arguments" 2 "$?"
    "$bin/rdma_send" --bogus h:1 >/dev/null 2>&1; check_eq "rdma_send --bogus" 2 "$?"
    "$bin/rdma_send" h:99999 >/dev/null 2>&1; check_eq "rdma_send bad port" 2 "$?"
    "$bin/rdma_send" --transport carrier-pigeon h >/dev/null 2>&1; check_eq "rdma_send bad transport" 2 "$?"
    "$bin/rdma_recv" extra >/dev/null 2>&1; check_eq "rdma_recv extra argument" 2 "$?"
    "$bin/rdma_recv" --listen 1.2.3.4:x >/dev/null 2>&1; check_eq "rdma_recv bad --listen" 2 "$?"
    # A port nobody listens on (the kernel picks a free one, we close it).
    free_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$bin/rdma_send" --wait 0 "127.0.0.1:$free_port" </dev/null 2>"$work/refused.err"
    check_eq "rdma_send to a closed port" 1 "$?"
    grep -q "cannot connect to 127.0.0.1:$free_port: Connection refused" "$work/refused.err" || fail "no refusal message"
    "$bin/rdma_send" 127.0.0.1:1 "$work/no-such-file" 2>"$work/nofile.err"
    check_eq "rdma_send missing file" 1 "$?"
    grep -q "cannot open" "$work/nofile.err" || fail "no message for a missing file"
    ;;
  *)
    echo "unknown case $case_name" >&2
    exit 2
    ;;
esac
echo "PASS ($case_name $*)"
