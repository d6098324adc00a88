#!/usr/bin/env bash
# In ONE guest (run by ../verbs_local.sh): two processes on the same host,
# forced onto the verbs link (RDMASHIM_TRANSPORT=verbs), over rxe0's loopback.
#   1. rdmaPingPong server + client --transport verbs (core API)
#   2. tcpPingPong server + client, both under `rdmashim run`
# Prints "@ KEY rc=.. transport=.. json=.." lines; the host judges them.
# Not set -e: every step reports, a failed one must not hide the next.
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"

iters=${PP_ITERS:-2000}
self=$RDMASHIM_VM_SELF # the eth0 address: the one rxe0's RoCEv2 GID carries
export RDMASHIM_TRANSPORT=verbs
cd /tmp || exit 1

# Core API: rdmaPingPong logs its transport at info level too.
export RDMASHIM_LOG=info
pingpong rdmaPingPong \
	"$BIN/rdmaPingPong" server --port 18600 --transport verbs :: \
	"$BIN/rdmaPingPong" client "$self:18600" --transport verbs --iters "$iters" --json

# Preload: the unmodified tcpPingPong under rdmashim run.
pingpong tcpPingPong \
	"${SHIM[@]}" "$BIN/tcpPingPong" server --port 18601 :: \
	"${SHIM[@]}" "$BIN/tcpPingPong" client "$self:18601" --iters "$iters" --json

# Buffering: an asyncio client writes 4 MiB and awaits drain() before it
# reads the echo of a server that echoes with drain() (tests/buffering):
# TCP absorbs that much unread data, so must the verbs rings (1 MiB rings
# deadlocked here). The server's 4 MiB echo must come back byte-exact.
export PEERS_HOST=$self
rm -f echo.port
timeout 120 "${SHIM[@]}" python3 "$STAGE_DIR/guest/peers.py" server "$PWD/echo.port" echo 2>echo4m.server.log &
epid=$!
for ((i = 0; i < 300; i++)); do [[ -s echo.port ]] && break; sleep 0.1; done
t0=$(now)
out=$(timeout 60 "${SHIM[@]}" python3 "$STAGE_DIR/guest/peers.py" echo "$(cat echo.port 2>/dev/null)" $((4 << 20)) \
	2>echo4m.client.log)
rc=$?
t1=$(now)
say "echo4m.client rc=$rc secs=$(elapsed "$t0" "$t1") transport=$(transport_of echo4m.client.log) log=$(oneline echo4m.client.log) json=${out:-none}"

# Sized by us, not by the peer (issue 12 finding 5): a greedy client asks for
# the largest ring (256 MiB); the server still registers only its own
# TCP-sized ring, and what it keeps registered after the connections closed
# is within its pool's bound. Its memory, as `rdmashim stat` reports it.
registered() { # the largest verbs_registered/verbs_pooled among live processes
	"$BIN/rdmashim" stat --json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
best = max(d, key=lambda p: p.get("verbs_registered", 0), default={})
print("%d/%d" % (best.get("verbs_registered", 0), best.get("verbs_pooled", 0)))'
}
greedy=$(RDMASHIM_RING_SIZE=268435456 timeout 60 "${SHIM[@]}" python3 "$STAGE_DIR/guest/peers.py" echo \
	"$(cat echo.port 2>/dev/null)" 65536 2>echo4m.greedy.log)
grc=$?
sleep 0.5
say "echo4m.greedy rc=$grc transport=$(transport_of echo4m.greedy.log) server_registered=$(registered) json=${greedy:-none}"
kill "$epid" 2>/dev/null
wait "$epid" 2>/dev/null
say "echo4m.server transport=$(transport_of echo4m.server.log) log=$(oneline echo4m.server.log)"

# A reader away (no call on its socket for STALL_SLEEP s) and a writer of 64 B
# messages on a non-blocking socket: its receives run out, our sends wait
# in the send queue; the writer must get EAGAIN as from a full TCP buffer,
# not spin in send() until the reader is back. Then every byte, in order.
# Then the writer ends its stream while the reader is still away: a
# shutdown() (its FIN must not end the stream before the writes still queued:
# every byte, then the end), a close() in a process that lives on (its flush
# goes on in the background: every byte, then the end), a close() and exit
# (the exit gives up on the ring after the setup timeout) and an exit
# without close() (after the exit's one-second flush): the writes a stopped
# reader did not take go on TCP (Connection::resend_unconfirmed), every
# byte, then the end.
stall_run() { # NAME END SLEEP [AWAY]: one reader and writer pair; says NAME.client
	local name=$1 end=$2 sleep_s=$3 away=${4:-sleep} spid rc out
	rm -f "$name.port"
	timeout 120 "${SHIM[@]}" python3 "$STAGE_DIR/guest/stalled_reader.py" server "$PWD/$name.port" \
		"$sleep_s" "$away" >"$name.server.out" 2>"$name.server.log" &
	spid=$!
	for ((i = 0; i < 300; i++)); do [[ -s $name.port ]] && break; sleep 0.1; done
	if [[ $away == stop ]]; then # the reader stops itself once it greeted; continued SLEEP s later
		(
			pid=$(pgrep -n -f "stalled_reader.py server $PWD/$name.port") # the newest: python, not its timeout
			for ((i = 0; i < 600; i++)); do [[ $(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) == T ]] && break; sleep 0.1; done
			sleep "$sleep_s"
			kill -CONT "$pid"
		) &
	fi
	# (the writer logs at debug level: whether its end was announced)
	out=$(timeout 100 "$BIN/rdmashim" run --log debug -- python3 "$STAGE_DIR/guest/stalled_reader.py" client \
		"$(cat "$name.port" 2>/dev/null)" "${STALL_WRITE:-4}" "$end" 2>"$name.client.log")
	rc=$?
	wait "$spid"
	# (the first transport line: a connection that left its ring later says so again)
	say "$name.client rc=$rc transport=$(first_transport_of "$name.client.log") server=$(first_transport_of "$name.server.log") \
announced=$(grep -c 'Close frame sent' "$name.client.log") resent=$(grep -c 'server) -> tcp:downgraded:peer-resent' "$name.server.log") log=$(cat "$name.client.log" "$name.server.log" | oneline_in) server_json=$(cat "$name.server.out" 2>/dev/null | oneline_in) json=${out:-none}"
}
stall_run stall wait "${STALL_SLEEP:-8}" &
# The same on TCP (rdmashim on both sides, told to keep TCP), beside it:
# what TCP's buffers take while the reader is away, in this boot.
(
	export RDMASHIM_TRANSPORT=tcp
	stall_run stalltcp wait "${STALL_SLEEP:-8}"
) &
wait
# A sleeping reader's heartbeat thread reposts its receives (SharedCq::tend):
# the writer's exit must leave nothing behind. A stopped one's does not.
stall_run stallexit exit "${STALL_SLEEP:-8}" &
stall_run stallquit quit "${STALL_SLEEP:-8}" &
wait
stall_run stallshut shutdown "${STALL_SLEEP:-8}" stop &
stall_run stallclose close "${STALL_SLEEP:-8}" stop &
stall_run stallstop exit "${STALL_SLEEP:-8}" stop &
stall_run stallstopquit quit "${STALL_SLEEP:-8}" stop &
wait

# Elastic registered memory (verbs/regions.h): a connection that moved
# IDLE_BYTES (256 MiB) and then sits idle gives its registration back: the
# receiver's grown ring shrinks to its 256 KiB first region, the sender's
# staging likewise. Both processes' verbs_registered while idle; with
# fixed rings each kept 17 MiB (16 MiB ring + 1 MiB staging) for good.
registered_of() { # WORD -> the largest verbs_registered/verbs_pooled/count among processes whose command (comm) has WORD
	"$BIN/rdmashim" stat --json 2>/dev/null | python3 -c '
import json, sys
d = [p for p in json.load(sys.stdin) if sys.argv[1] in p.get("command", "")]
best = max(d, key=lambda p: p.get("verbs_registered", 0), default={})
print("%d/%d/%d" % (best.get("verbs_registered", 0), best.get("verbs_pooled", 0), len(d)))' "$1"
}
rm -f idle.port idle.mark idle.mark.done
timeout 120 "${SHIM[@]}" python3 "$STAGE_DIR/guest/idle_peer.py" server "$PWD/idle.port" >idle.server.out 2>idle.server.log &
ipid=$!
for ((i = 0; i < 300; i++)); do [[ -s idle.port ]] && break; sleep 0.1; done
t0=$(now)
timeout 120 "${SHIM[@]}" python3 "$STAGE_DIR/guest/idle_peer.py" client "$self" "$(cat idle.port 2>/dev/null)" \
	"${IDLE_BYTES:-268435456}" "$PWD/idle.mark" 60 2>idle.client.log &
cpid=$!
busy=0
for ((i = 0; i < 1200; i++)); do # the most either registered while moving
	[[ -e idle.mark ]] && break
	r=$(registered_of python)
	((${r%%/*} > busy)) && busy=${r%%/*}
	sleep 0.1
done
t1=$(now)
sleep 3.5 # idle: more than a second drained and quiet
idle=$(registered_of python)
touch idle.mark.done # the client sends its last byte and both end
wait "$cpid"
crc=$?
wait "$ipid"
say "idle.verbs rc=$crc secs=$(elapsed "$t0" "$t1") busy_registered=$busy idle_registered=$idle client=$(transport_of idle.client.log) server=$(transport_of idle.server.log) json=$(cat idle.server.out 2>/dev/null)"

# Many connections in one process, at the verbs limits (verbs/limits.h): the
# server may register RDMASHIM_VERBS_MEM=4m; a default link registers
# 528 KiB (256 KiB ring region, 256 KiB staging, 16 KiB control slots), so
# its first 7 connections take verbs and the rest stay on TCP with
# tcp:verbs-limit at both ends (the client is told so in the Ack). The
# client (no budget of its own) opens MANY_N, moves MANY_BYTES each way on
# every one (a region the server would grow into is refused: the ring keeps
# its size), then holds them while `rdmashim stat` counts both processes'
# queue pairs, completion queues and memory regions.
stat_of() { # ROLE -> qps/cqs/mrs/registered/pooled of the process with live ROLE rows (the others gone by now)
	"$BIN/rdmashim" stat --json 2>/dev/null | python3 -c '
import json, sys
d = [p for p in json.load(sys.stdin) if any(c.get("role") == sys.argv[1] for c in p.get("live", []))]
p = max(d, key=lambda p: len(p["live"]), default={})
print("/".join(str(p.get(k, "none")) for k in ("verbs_qps", "verbs_cqs", "verbs_mrs", "verbs_registered", "verbs_pooled")))' "$1"
}
tally() { grep -c -- "($2) -> $3\( \|$\)" "$1" 2>/dev/null; }
rm -f many.port many.mark many.mark.go
PEERS_HOST=$self RDMASHIM_VERBS_MEM=4m timeout 120 "${SHIM[@]}" python3 "$STAGE_DIR/guest/many_conns.py" server "$PWD/many.port" \
	2>many.server.log &
mpid=$!
for ((i = 0; i < 300; i++)); do [[ -s many.port ]] && break; sleep 0.1; done
t0=$(now)
timeout 120 "${SHIM[@]}" python3 "$STAGE_DIR/guest/many_conns.py" client "$self" "$(cat many.port 2>/dev/null)" \
	"${MANY_N:-16}" "${MANY_BYTES:-262144}" "$PWD/many.mark" 60 >many.client.out 2>many.client.log &
cpid=$!
while kill -0 "$cpid" 2>/dev/null && [[ ! -e many.mark ]]; do sleep 0.1; done
t1=$(now)
cstat=$(stat_of client) sstat=$(stat_of server)
touch many.mark.go
wait "$cpid"
crc=$?
kill "$mpid" 2>/dev/null
wait "$mpid" 2>/dev/null
say "many rc=$crc secs=$(elapsed "$t0" "$t1") client_verbs=$(tally many.client.log client verbs) client_limit=$(tally many.client.log client tcp:verbs-limit) server_verbs=$(tally many.server.log server verbs) server_limit=$(tally many.server.log server tcp:verbs-limit) client_stat=$cstat server_stat=$sstat client_reason=$(reason_of many.client.log) server_reason=$(reason_of many.server.log) json=$(cat many.client.out 2>/dev/null)"

# Shared CQs, every wait asleep (RDMASHIM_SPIN_US=0): SCQ_THREADS blocking
# threads in one client process, each on its own connection to a server
# with a thread per connection, so past the first 8 (a CQ each) each
# process's links share CQs (16: two); a
# completion is often polled by another thread or the CQ's watcher, which
# must ring the right link's doorbell (a lost wake-up hangs a thread).
# Seeded sizes and pauses (SCQ_SEED replays a run), every byte hashed.
rm -f scq.port
RDMASHIM_SPIN_US=0 timeout 180 "${SHIM[@]}" python3 "$STAGE_DIR/guest/shared_cq_peer.py" server "$PWD/scq.port" \
	2>scq.server.log &
spid=$!
for ((i = 0; i < 300; i++)); do [[ -s scq.port ]] && break; sleep 0.1; done
scq_seed=${SCQ_SEED:-$RANDOM}
out=$(RDMASHIM_SPIN_US=0 timeout 170 "${SHIM[@]}" python3 "$STAGE_DIR/guest/shared_cq_peer.py" client "$self" \
	"$(cat scq.port 2>/dev/null)" "${SCQ_THREADS:-24}" "${SCQ_ROUNDS:-600}" "$scq_seed" 2>scq.client.log)
crc=$?
kill "$spid" 2>/dev/null
wait "$spid" 2>/dev/null
say "scq rc=$crc seed=$scq_seed client_verbs=$(tally scq.client.log client verbs) server_verbs=$(tally scq.server.log server verbs) log=$(oneline scq.client.log | tail -c 300) json=${out:-none}"

# The idle heartbeat (RDMASHIM_HEARTBEAT_S=1 here, 60 by default): a live
# idle link beats every second, each beat completing; once its peer was
# SIGKILLed (no Bye: its QP is gone and rxe retries a beat forever) the
# server posts one more beat at most, not one a second. `rdmashim stat`
# counts the beats (verbs_beats).
beats_of() { # the verbs_beats of the process with a live server row
	"$BIN/rdmashim" stat --json 2>/dev/null | python3 -c '
import json, sys
d = [p for p in json.load(sys.stdin) if any(c.get("role") == "server" for c in p.get("live", []))]
print(max(d, key=lambda p: len(p["live"]), default={}).get("verbs_beats", "none"))'
}
rm -f beat.port beat.mark beat.pid
export RDMASHIM_HEARTBEAT_S=1
# The server holds its end 240 s and is killed after the last look: four
# looks of `rdmashim stat` under TCG on a busy host took more than the 60 s
# it once held (the last look then found no server: "none").
timeout 240 "${SHIM[@]}" python3 "$STAGE_DIR/guest/heartbeat_peer.py" server "$PWD/beat.port" "$PWD/beat.mark" 240 "$self" \
	2>beat.server.log &
bpid=$!
for ((i = 0; i < 300; i++)); do [[ -s beat.port ]] && break; sleep 0.1; done
timeout 60 "${SHIM[@]}" python3 "$STAGE_DIR/guest/heartbeat_peer.py" client "$(cat beat.port 2>/dev/null)" "$self" "$PWD/beat.pid" \
	2>beat.client.log &
cpid=$!
for ((i = 0; i < 300; i++)); do [[ -e beat.mark ]] && break; sleep 0.1; done
b0=$(beats_of)
sleep 4.5 # live and idle: about three beats, each completed
b1=$(beats_of)
kill -9 "$(cat beat.pid 2>/dev/null)" 2>/dev/null # the client itself (its timeout would outlive nothing)
wait "$cpid" 2>/dev/null
sleep 1
b2=$(beats_of) # (a look takes seconds under TCG: counted from here)
sleep 5.5 # the peer gone: one beat at most
b3=$(beats_of)
unset RDMASHIM_HEARTBEAT_S
alive=no
kill -0 "$bpid" 2>/dev/null && alive=yes
kill "$bpid" 2>/dev/null # it holds the connection for 240 s (stat takes seconds under TCG)
wait "$bpid" 2>/dev/null
say "beat live=$b0/$b1 dead=$b2/$b3 server_alive=$alive client=$(transport_of beat.client.log) server=$(transport_of beat.server.log)"
