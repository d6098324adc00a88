#!/usr/bin/env bash
# HAProxy (Debian package), unmodified, in mode tcp with option
# splice-request and option splice-response: it moves the bytes with
# splice() through pipes, SPLICE_F_NONBLOCK on blocking pipes. A client
# (curl) downloads 50 MiB twice through it from a small backend
# (sendfile_server.py: socket.sendfile, i.e. os.sendfile with an offset);
# each download's SHA-256 must match. One case per run, naming who runs
# under rdmashim:
#
#   all          client, haproxy and backend (every connection on shm)
#   haproxy      haproxy only (both of its sides fall back to TCP)
#   server-side  haproxy and the backend (client side TCP, backend side shm)
#   ends         client and backend, not haproxy (all TCP)
#   none         nobody (the reference)
#
# Checks: both downloads complete within their time limit with the right
# SHA-256; haproxy really used pipes (PipesUsed + PipesFree of "show info");
# every process under rdmashim reported each connection with the transport
# its pairing implies (RDMASHIM_LOG=info), so RDMASHIM_TRANSPORT=tcp fails
# the cases that claim shm; no rdmashim warning.
#
# usage: haproxy.sh all|haproxy|server-side|ends|none
# env:   RDMASHIM_BUILD (the build folder), KEEP_WORK=1 keeps the temp
#        folder of a failed run.
# Exit 77 (skipped) when HAProxy or curl is missing and we may not install them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

mode=${1:?usage: haproxy.sh all|haproxy|server-side|ends|none}
case $mode in all|haproxy|server-side|ends|none) ;; *) echo "unknown case $mode"; exit 2 ;; esac

sys_need_packages haproxy curl
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit "$SYSTEM_SKIP"; }
sys_workdir
sys_install_shim
cd "$work"

# under WHO: whether WHO (client, haproxy, backend) runs under rdmashim here.
under() {
  case $mode:$1 in
    all:*|haproxy:haproxy|server-side:haproxy|server-side:backend|ends:client|ends:backend) return 0 ;;
    *) return 1 ;;
  esac
}
# launcher WHO: the command prefix for WHO.
launcher() { if under "$1"; then echo "$SHIM run --log info --"; fi; }

size=$((50 * 1024 * 1024))
head -c "$size" /dev/urandom >big
want=$(sha256sum big | cut -d' ' -f1)

# start NAME PORT CMD...: a server in a time-limited background job; its
# stderr (where rdmashim's lines go) in NAME.err.
start() {
  local name=$1 port=$2 pid; shift 2
  timeout -k 5 300 "$@" >"$work/$name.out" 2>"$work/$name.err" &
  pid=$!
  disown "$pid"
  sys_on_exit "sys_kill_tree $pid"
  sys_watch TERM "$pid"
  sys_wait_port "$port" 10 || { echo "FAIL: $name did not start"; cat "$work/$name.out" "$work/$name.err"; exit 1; }
}

bport=$(sys_free_port)
hport=$(sys_free_port)
# shellcheck disable=SC2046
start backend "$bport" $(launcher backend) python3 "$here/sendfile_server.py" "$bport" "$work/big"
cat >haproxy.cfg <<CFG
global
  maxconn 100
  stats socket $work/haproxy.sock mode 600 level admin
defaults
  mode tcp
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option splice-request
  option splice-response
frontend fe
  bind 127.0.0.1:$hport
  default_backend be
backend be
  server s1 127.0.0.1:$bport
CFG
# shellcheck disable=SC2046
start haproxy "$hport" $(launcher haproxy) haproxy -db -f "$work/haproxy.cfg"

: >client.err
for i in 1 2; do
  rm -f got
  # shellcheck disable=SC2046
  if ! timeout -k 5 40 $(launcher client) curl -sS --max-time 30 -o got "http://127.0.0.1:$hport/big" 2>>client.err; then
    echo "FAIL: download $i did not complete (haproxy hung?)"; sys_failed=1
    tail -5 client.err
    break
  fi
  got=$(sha256sum got | cut -d' ' -f1)
  if [ "$got" = "$want" ]; then echo "ok: download $i: 50 MiB, SHA-256 matches"
  else echo "FAIL: download $i: SHA-256 $got, expected $want ($(stat -c %s got) bytes)"; sys_failed=1; fi
done

# haproxy's own account of its pipes: splicing really happened.
pipes=$(timeout 10 python3 - "$work/haproxy.sock" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"show info\n")
data = b""
while True:
    c = s.recv(65536)
    if not c:
        break
    data += c
info = dict(l.split(": ", 1) for l in data.decode().splitlines() if ": " in l)
print(int(info.get("PipesUsed", 0)) + int(info.get("PipesFree", 0)))
PY
) || pipes=0
if [ "${pipes:-0}" -ge 1 ]; then echo "ok: haproxy used $pipes pipe(s) (splice)"
else echo "FAIL: haproxy reports no pipes: it did not splice"; sys_failed=1; fi

downloads=2
case $mode in
  all)
    sys_expect_transports "client" client.err client 1 shm "$downloads"
    sys_expect_transports "haproxy, from the client" haproxy.err server 1 shm "$downloads"
    sys_expect_transports "haproxy, to the backend" haproxy.err client 1 shm "$downloads"
    sys_expect_transports "backend" backend.err server 1 shm "$downloads" ;;
  haproxy)
    sys_expect_transports "haproxy, from the plain client" haproxy.err server 1 tcp:peer-plain "$downloads"
    sys_expect_transports "haproxy, to the plain backend" haproxy.err client 1 tcp:not-advertised "$downloads" ;;
  server-side)
    sys_expect_transports "haproxy, from the plain client" haproxy.err server 1 tcp:peer-plain "$downloads"
    sys_expect_transports "haproxy, to the backend" haproxy.err client 1 shm "$downloads"
    sys_expect_transports "backend" backend.err server 1 shm "$downloads" ;;
  ends)
    sys_expect_transports "client, to plain haproxy" client.err client 1 tcp:not-advertised "$downloads"
    sys_expect_transports "backend, from plain haproxy" backend.err server 1 tcp:peer-plain "$downloads" ;;
  none)
    if grep -h '^rdmashim\[' client.err haproxy.err backend.err; then echo "FAIL: rdmashim lines without rdmashim"; sys_failed=1; fi ;;
esac
for f in client haproxy backend; do sys_no_warnings "$f" "$f.err"; done

if [ "$sys_failed" -ne 0 ]; then echo "FAIL: haproxy splice ($mode)"; exit 1; fi
echo "PASS: haproxy splice ($mode)"
