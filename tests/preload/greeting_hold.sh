#!/usr/bin/env bash
# A client that announces a Hello and never sends it cannot stall an
# event-loop server that speaks first (greeting_hold.py; WAIT: epoll,
# epoll-et, poll or select). Both under rdmashim:
#   - LAZY clients, run by another user, connect (non-blocking) and then do
#     nothing for 3 s (longer than the 2 s setup timeout);
#   - meanwhile 20 clients connect one after another: each greeting comes
#     within 500 ms of its connect (the server's loop was never held up for
#     the lazy ones; before, each held it 2 s) and every one is on shm at
#     both ends;
#   - each lazy client's greeting write met EAGAIN and went out raw once the
#     setup timeout passed (tcp:server-spoke-first), the lazy clients get
#     every byte.
# usage: greeting_hold.sh WAIT
set -euo pipefail
wait_in=$1
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=attacker_lib.sh
source "$here/attacker_lib.sh"
attacker_setup
peer="$here/greeting_hold.py"
work=$(mktemp -d)
chmod 755 "$work"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; attacker_cleanup; rm -rf "$work"' EXIT
lazy=4 good=20
shim=("$build/bin/rdmashim" run --log info --)

fail() {
  echo "FAIL: $*"
  for f in "$work"/*; do echo "--- $(basename "$f")"; grep -v ' info: fd .* -> ' "$f" | head -40 || true; done
  exit 1
}

timeout 60 "${shim[@]}" python3 "$peer" server --port-file "$work/port" --count $((lazy + good)) \
  --wait "$wait_in" >"$work/server.json" 2>"$work/server.log" &
server_pid=$!
pids+=("$server_pid")
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || fail "server did not start"
port=$(cat "$work/port")

for i in $(seq $lazy); do
  "${AS_ATTACKER[@]}" timeout 30 "${shim[@]}" python3 "$peer" lazy --port "$port" --sleep 3 \
    >"$work/lazy$i.json" 2>"$work/lazy$i.log" &
  pids+=("$!")
done
sleep 0.5  # all accepted, their greetings held
RDMASHIM_SHORT_CONN_MS=0 timeout 60 "${shim[@]}" python3 "$peer" clients --port "$port" --count $good \
  >"$work/clients.json" 2>"$work/clients.log" || fail "clients failed"
for i in $(seq $lazy); do
  wait "${pids[$i]}" || fail "lazy client $i failed"
done
wait "$server_pid" || fail "server failed"

python3 - "$work" "$lazy" "$good" <<'EOF' || fail "expectations not met"
import json, re, sys
work, lazy, good = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = json.load(open(work + "/server.json"))
cl = json.load(open(work + "/clients.json"))
log = open(work + "/server.log").read()
clog = open(work + "/clients.log").read()
lazies = [json.load(open("%s/lazy%d.json" % (work, i + 1))) for i in range(lazy)]
print("server:", srv)
print("clients:", cl)
print("lazy:", lazies)
ok = True
def check(cond, what):
    global ok
    print(("ok: " if cond else "FAIL: ") + what)
    ok = ok and cond
check(srv["bad_requests"] == 0 and cl["bad"] == 0 and all(l["bad"] == 0 for l in lazies), "every byte as sent")
check(cl["max_greeting_ms"] < 500, "greetings of the other clients within 500 ms of connect (max %.1f ms)" % cl["max_greeting_ms"])
check(srv["greetings_held"] >= lazy, "%d greeting writes met EAGAIN (the %d lazy clients' at least)" % (srv["greetings_held"], lazy))
slow = sorted(srv["greeting_ms"])[-lazy:]
check(all(1500 <= ms <= 3500 for ms in slow), "the lazy clients' greetings left at the setup timeout: %s ms" % slow)
shm_s = len(re.findall(r"info: fd \d+ \(server\) -> shm$", log, re.M))
shm_c = len(re.findall(r"info: fd \d+ \(client\) -> shm$", clog, re.M))
spoke = len(re.findall(r"info: fd \d+ \(server\) -> tcp:server-spoke-first$", log, re.M))
check(shm_s == good and shm_c == good, "the %d other connections on shm (server %d, client %d)" % (good, shm_s, shm_c))
check(spoke == lazy, "the lazy ones on TCP, tcp:server-spoke-first (%d)" % spoke)
sys.exit(0 if ok else 1)
EOF
echo "ok: greeting_hold $wait_in"
