#!/usr/bin/env bash
# Discovery cannot be squatted: another user binds the discovery names of the
# ports where two PLAIN servers listen (python3 -m http.server, and a server
# that records every byte it gets). Clients under rdmashim must treat them as
# the plain servers they are: curl gets exactly the page a plain curl gets,
# the recorder receives exactly the client's bytes (not a Hello, not frames),
# and the clients log tcp:not-advertised. Needs root (throwaway user).
set -euo pipefail
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=attacker_lib.sh
. "$here/attacker_lib.sh"
command -v curl >/dev/null || { echo "SKIP: curl missing"; exit 77; }
attacker_setup
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  attacker_cleanup
  rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"
cp "$here/squat.py" "$work/"
run() { "$build/bin/rdmashim" run --log info -- "$@"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http_port=$(free_port)
mkdir "$work/www" && printf 'hello from a plain server\n' >"$work/www/index.html"
(cd "$work/www" && exec python3 -m http.server --bind 127.0.0.1 "$http_port" >"$work/http.log" 2>&1) &
pids+=($!)
python3 "$here/plain_recorder.py" "$work/rec.port" 3 "$work/recorded" 2>"$work/rec.log" &
pids+=($!)
for _ in $(seq 200); do
  [ -s "$work/rec.port" ] && curl -s -o /dev/null "http://127.0.0.1:$http_port/" && break; sleep 0.05
done
rec_port=$(cat "$work/rec.port")

for port in "$http_port" "$rec_port"; do
  "${AS_ATTACKER[@]}" /usr/bin/python3 "$work/squat.py" "$port" >"$work/squat.$port" 2>&1 &
  pids+=($!)
done
for _ in $(seq 100); do
  [ "$(grep -c "@rdmashim/v1/tcp/127.0.0.1/\($http_port\|$rec_port\)\$" /proc/net/unix)" = 2 ] && break; sleep 0.05
done
grep -q "@rdmashim/v1/tcp/127.0.0.1/$http_port\$" /proc/net/unix || { echo "FAIL: the squatter did not bind"; cat "$work"/squat.*; exit 1; }

fail=0
# 1. curl against python3 -m http.server.
curl -s "http://127.0.0.1:$http_port/index.html" >"$work/plain.out"
run curl -s "http://127.0.0.1:$http_port/index.html" >"$work/shim.out" 2>"$work/curl.log"
cmp -s "$work/plain.out" "$work/shim.out" || { echo "FAIL: curl under rdmashim got something else:"; cat -v "$work/shim.out"; fail=1; }
grep -q "(client) -> tcp:not-advertised" "$work/curl.log" || { echo "FAIL: curl's transport:"; cat "$work/curl.log"; fail=1; }
if grep -q "501\|Unsupported\|rdmash" "$work/http.log"; then echo "FAIL: http.server saw:"; cat -v "$work/http.log"; fail=1; fi

# 2. The recorder gets exactly the client's bytes, three times.
: >"$work/sent"
for i in 1 2 3; do
  run python3 - "$rec_port" "$i" >>"$work/answers" 2>>"$work/client.log" <<'PY'
import hashlib, socket, sys
port, i = int(sys.argv[1]), int(sys.argv[2])
data = (b"GET /%d HTTP/1.0\r\n\r\n" % i) + bytes(range(256)) * 40 * i
s = socket.create_connection(("127.0.0.1", port))
s.sendall(data)
s.shutdown(socket.SHUT_WR)
ans = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    ans += b
sys.stdout.write(ans.decode() + "SENT " + hashlib.sha256(data).hexdigest() + "\n")
PY
  printf 'GET /%d HTTP/1.0\r\n\r\n' "$i" >>"$work/sent"
  python3 -c "import sys; sys.stdout.buffer.write(bytes(range(256)) * 40 * $i)" >>"$work/sent"
done
wait "${pids[1]}" || true
cmp -s "$work/sent" "$work/recorded" || {
  echo "FAIL: the plain server received $(wc -c <"$work/recorded") bytes, the clients sent $(wc -c <"$work/sent"):"
  head -c 200 "$work/recorded" | cat -v; echo; fail=1; }
if [ "$(grep -c '^PLAIN ' "$work/answers")" != 3 ]; then echo "FAIL: answers:"; cat "$work/answers"; fail=1; fi
paste -d' ' <(sed -n 's/^PLAIN //p' "$work/answers") <(sed -n 's/^SENT //p' "$work/answers") |
  awk '$1 != $2 { bad = 1 } END { exit bad }' || { echo "FAIL: the server's digest differs"; cat "$work/answers"; fail=1; }
[ "$(grep -c '(client) -> tcp:not-advertised' "$work/client.log")" = 3 ] || { echo "FAIL: client transports:"; cat "$work/client.log"; fail=1; }

[ "$fail" = 0 ] || exit 1
echo "ok: squatted names ignored; curl and 3 raw clients got plain TCP, byte for byte"
