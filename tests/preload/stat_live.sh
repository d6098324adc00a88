#!/usr/bin/env bash
# `rdmashim stat` lists every live connection: three rdmashim clients (shm)
# and one plain client held open against a server under rdmashim. Every field
# of `--json` is checked per connection on both sides (addresses, transport,
# bytes and calls each way as the programs counted them, ring size, the
# unread/unacked fill: 3000 bytes written and never read on one of them), then the text table, `--watch 0.2 --count 3`, and a
# server with more connections than rows ("(+N not listed)").
set -euo pipefail
build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
bin=$build/bin
here=$(cd "$(dirname "$0")" && pwd)
peer=$here/stat_live.py
work=$(mktemp -d)
pids=()
cleanup() {
  exec 3>&- 2>/dev/null || true
  kill "${pids[@]}" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
wait_file() { for _ in $(seq 200); do [ -e "$1" ] && return 0; sleep 0.05; done; fail "timed out waiting for $1"; }

mkfifo "$work/hold"
exec 3<>"$work/hold"  # the clients hold their connections until this closes

"$bin/rdmashim" run -- python3 "$peer" server "$work/port" "$work/server.out" &
server=$!
pids+=($server)
wait_file "$work/port"
port=$(cat "$work/port")

sizes=(100 5000 20000)
extras=(0 0 3000)
client_pids=()
for i in 0 1 2; do
  "$bin/rdmashim" run -- python3 "$peer" client "$port" "${sizes[$i]}" "${extras[$i]}" "$work/c$i.out" \
    "$work/c$i.ready" <"$work/hold" &
  pids+=($!)
  client_pids+=($!)
done
python3 "$peer" client "$port" 777 0 "$work/plain.out" "$work/plain.ready" <"$work/hold" &
pids+=($!)
for i in 0 1 2; do wait_file "$work/c$i.ready"; done
wait_file "$work/plain.ready"
for _ in $(seq 100); do [ "$(wc -l <"$work/server.out")" -ge 4 ] && break; sleep 0.05; done

"$bin/rdmashim" stat --json >"$work/stat.json"
cat "$work/stat.json"
python3 - "$work" "$server" "${client_pids[@]}" <<'PY' || fail "rdmashim stat --json does not match the connections"
import json, sys
work, server, clients = sys.argv[1], int(sys.argv[2]), [int(p) for p in sys.argv[3:]]
procs = {p["pid"]: p for p in json.load(open(work + "/stat.json"))}
errors = []
def check(what, got, want):
    if got != want:
        errors.append("%s: %r, expected %r" % (what, got, want))

def rows(pid):
    if pid not in procs:
        errors.append("no stats for pid %d" % pid)
        return []
    check("pid %d page_version" % pid, procs[pid]["page_version"], 2)
    check("pid %d not_listed" % pid, procs[pid]["not_listed"], 0)
    check("pid %d verbs_registered (shm pins nothing)" % pid, procs[pid]["verbs_registered"], 0)
    return procs[pid]["live"]

server_rows = {r["peer"]: r for r in rows(server)}
check("server rows", len(server_rows), 4)
served = {}
for line in open(work + "/server.out"):
    s = json.loads(line)
    served[s["peer"]] = s
for i, pid in enumerate(clients):
    c = json.loads(open("%s/c%d.out" % (work, i)).read())
    live = rows(pid)
    check("client %d rows" % i, len(live), 1)
    if not live:
        continue
    r = live[0]
    for key in ("local", "peer", "tx_bytes", "tx_msgs", "rx_bytes", "rx_msgs"):
        check("client %d %s" % (i, key), r[key], c[key])
    check("client %d transport" % i, r["transport"], "shm")
    check("client %d role" % i, r["role"], "client")
    check("client %d counted_by" % i, r["counted_by"], "rdmashim")
    check("client %d ring_bytes > 0" % i, r["ring_bytes"] > 0, True)
    check("client %d rx_unread" % i, r["rx_unread"], 0)
    check("client %d tx_unacked" % i, r["tx_unacked"], c["extra"])
    check("client %d fill" % i, r["fill"], "both-ends")
    s = server_rows.get(c["local"])
    if not s:
        errors.append("server lists no connection from %s" % c["local"])
        continue
    want = served[c["local"]]
    for key in ("local", "peer", "tx_bytes", "tx_msgs", "rx_bytes", "rx_msgs"):
        check("server side of client %d %s" % (i, key), s[key], want[key])
    check("server side of client %d local" % i, s["local"], c["peer"])
    check("server side of client %d transport" % i, s["transport"], "shm")
    check("server side of client %d role" % i, s["role"], "server")
    check("server side of client %d ring_bytes" % i, s["ring_bytes"], r["ring_bytes"])
    check("server side of client %d fill" % i, (s["rx_unread"], s["tx_unacked"], s["fill"]), (c["extra"], 0, "both-ends"))
p = json.loads(open(work + "/plain.out").read())
s = server_rows.get(p["local"])
if not s:
    errors.append("server lists no connection from the plain client %s" % p["local"])
else:
    check("plain local", s["local"], p["peer"])
    check("plain transport", s["transport"], "tcp:peer-plain")
    check("plain counted_by", s["counted_by"], "kernel")
    check("plain tx_bytes", s["tx_bytes"], p["rx_bytes"])
    check("plain rx_bytes", s["rx_bytes"], p["tx_bytes"])
    check("plain msgs", (s["tx_msgs"], s["rx_msgs"]), (None, None))
    check("plain ring", (s["ring_bytes"], s["rx_unread"], s["tx_unacked"], s["fill"]), (0, 0, 0, "kernel"))
check("server counts", (procs.get(server, {}).get("connections", {}).get("shm"),
                        procs.get(server, {}).get("connections", {}).get("tcp:peer-plain")), (3, 1))
if errors:
    sys.exit("\n".join(errors))
PY

"$bin/rdmashim" stat >"$work/stat.txt"
cat "$work/stat.txt"
for i in 0 1 2; do
  local_addr=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["local"])' "$work/c$i.out")
  grep -E "^${client_pids[$i]} .* client +${local_addr//./\\.} .* shm " "$work/stat.txt" >/dev/null ||
    fail "text: no shm row for client $i ($local_addr)"
  [ "$(grep -cE "^$server .* server +127\.0\.0\.1:$port +${local_addr//./\\.} +shm " "$work/stat.txt")" = 1 ] ||
    fail "text: no server row for client $i"
done
grep -qE "^$server .* tcp:peer-plain .* - +0 +0 *$" "$work/stat.txt" || fail "text: no plain row on the server"

"$bin/rdmashim" stat --watch 0.2 --count 3 >"$work/watch.txt"
[ "$(grep -c '^rdmashim stat, every 0.2s' "$work/watch.txt")" = 3 ] || fail "--watch --count 3 did not refresh 3 times"
[ "$(grep -cE "^$server .* shm " "$work/watch.txt")" = 9 ] || fail "--watch: the server's 3 shm rows not in each refresh"

# More connections than rows: 260 plain clients more on the same server.
python3 "$peer" plainmany "$port" 260 "$work/many.ready" <"$work/hold" &
pids+=($!)
wait_file "$work/many.ready"
for _ in $(seq 100); do
  "$bin/rdmashim" stat --json >"$work/stat2.json"
  python3 -c 'import json,sys; d={p["pid"]:p for p in json.load(open(sys.argv[1]))}[int(sys.argv[2])]
sys.exit(0 if len(d["live"]) + d["not_listed"] == 264 else 1)' "$work/stat2.json" "$server" && break
  sleep 0.05
done
python3 -c 'import json,sys; d={p["pid"]:p for p in json.load(open(sys.argv[1]))}[int(sys.argv[2])]
sys.exit(0 if (len(d["live"]), d["not_listed"]) == (255, 9) else "rows %d, not listed %d" % (len(d["live"]), d["not_listed"]))' \
  "$work/stat2.json" "$server" || fail "a full table: expected 255 rows and 9 not listed"
# Into a file, not a pipe: grep -q leaves at the match, and rows of other
# processes under rdmashim on the machine printed after it would then end
# stat with SIGPIPE (a failure under pipefail).
"$bin/rdmashim" stat >"$work/stat3.txt"
grep -q "^$server  *(+9 not listed)" "$work/stat3.txt" || fail "text: no (+9 not listed)"
echo "ok: rdmashim stat lists each live connection with its addresses, transport, bytes, calls and ring fill"
