#!/usr/bin/env bash
# softroce.verbs_local: in ONE guest, two processes forced onto the verbs link
# (RDMASHIM_TRANSPORT=verbs): rdmaPingPong --transport verbs, and the
# unmodified tcpPingPong under `rdmashim run`; then the asyncio echo of
# tests/buffering (a client writes 4 MiB before it reads) under `rdmashim
# run`; then a reader that does not look at its socket for STALL_SLEEP s while
# a non-blocking writer sends 64 B messages (guest/stalled_reader.py: EAGAIN,
# never a send() that waits for the reader, its grown ring filled while it
# sleeps, at least as far as TCP's buffers in the same boot,
# every byte once it reads; with a sleeping reader, a writer that exits
# (every byte, then the end); with a stopped one, a writer that shuts down
# (every byte, then the end) and ones that exit (every byte, the rest
# resent on TCP, then the end)); then
# a connection that moves 256 MiB and goes idle, which must give
# its registered memory back (guest/idle_peer.py, `rdmashim stat`); then one
# process opens MANY_N connections to a server whose verbs memory budget is
# 4 MiB (guest/many_conns.py). Passes when every run completes (the echoes
# byte-exact, without deadlock), every side logged "-> verbs", the idle
# connection's registration shrank, and the many connections split into K on
# verbs and the rest tcp:verbs-limit with `rdmashim stat` counting K QPs and
# the CQs they share; then SCQ_THREADS blocking threads, each on its own
# connection, with every wait asleep (guest/shared_cq_peer.py: past the
# first 8, the links of each process share CQs). Exit 77 (skip) when no guest can run.
# env: RDMASHIM_BUILD (build folder), PP_ITERS (round trips per run, 2000),
#      MANY_N (connections, 16), MANY_BYTES (echoed on each, 256 KiB),
#      SCQ_THREADS (24), SCQ_ROUNDS (messages per thread, 600), SCQ_SEED (replay),
#      STALL_SLEEP (the reader's absence, 8 s), STALL_WRITE (the writer's most, 4 s)
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"

softroce_skip_unless_vm
softroce_stage
# 2 vCPUs: the two ping-pong processes spin while they wait; on one vCPU
# they would only take turns at scheduler ticks.
export RDMASHIM_VM_SMP=${RDMASHIM_VM_SMP:-2}
st=0
out=$("$VM" run1 --timeout 540 -- "PP_ITERS=${PP_ITERS:-2000} MANY_N=${MANY_N:-16} MANY_BYTES=${MANY_BYTES:-262144} SCQ_THREADS=${SCQ_THREADS:-24} SCQ_ROUNDS=${SCQ_ROUNDS:-600} ${SCQ_SEED:+SCQ_SEED=$SCQ_SEED} STALL_SLEEP=${STALL_SLEEP:-8} STALL_WRITE=${STALL_WRITE:-4} bash $STAGE/guest/local_verbs.sh" 2>&1) || st=$?
printf '%s\n' "$out" | sed 's/^/  | /'

fail=0
check() { # NAME OK(0|1) DETAIL
	if [[ $2 == 1 ]]; then echo "ok:   $1 ($3)"; else echo "FAIL: $1 ($3)"; fail=1; fi
}
((st == 0)) || check "guest ran" 0 "vm run1 exited $st"
for tool in rdmaPingPong tcpPingPong; do
	c=$(result "$out" "$tool.client") s=$(result "$out" "$tool.server")
	json=$(kv "$c" json) rc=$(kv "$c" rc)
	rate=$(jf "$json" round_trips_per_s)
	check "$tool completed" "$([[ $rc == 0 && -n $rate ]] && echo 1 || echo 0)" \
		"rc=${rc:-none}, ${rate:-no} round trips/s, p50 $(jf "$json" p50_us) us, p99 $(jf "$json" p99_us) us"
	for side in client server; do
		line=$c
		[[ $side == server ]] && line=$s
		t=$(kv "$line" transport)
		check "$tool $side -> verbs" "$([[ $t == verbs ]] && echo 1 || echo 0)" "logged: ${t:-nothing}"
	done
done
# 4 MiB written before anything is read (the asyncio echo shape).
c=$(result "$out" echo4m.client) s=$(result "$out" echo4m.server)
check "4 MiB unread write echoed (no deadlock)" "$([[ $(kv "$c" rc) == 0 && $(kv "$c" json) == *'"exact": true'* ]] && echo 1 || echo 0)" \
	"rc=$(kv "$c" rc) (124 = the 60 s timeout) in $(kv "$c" secs) s, $(kv "$c" json)"
# A client asking for 256 MiB rings: echoed, and the server (all its
# connections closed by then) keeps registered at most its pool's 32 MiB;
# before, it registered 2 x 256 MiB per such connection and pooled them.
g=$(result "$out" echo4m.greedy)
reg=$(kv "$g" server_registered)
check "greedy 256 MiB client echoed" "$([[ $(kv "$g" rc) == 0 && $(kv "$g" json) == *'"exact": true'* && $(kv "$g" transport) == verbs ]] && echo 1 || echo 0)" \
	"rc=$(kv "$g" rc), $(kv "$g" transport), $(kv "$g" json)"
check "server's registered memory bounded" "$([[ -n $reg && ${reg%/*} -gt 0 && ${reg%/*} -le $((32 << 20)) ]] && echo 1 || echo 0)" \
	"verbs_registered/verbs_pooled bytes: ${reg:-none} (bound $((32 << 20)))"
# A reader away and a non-blocking writer of 64 B messages (guest/stalled_reader.py).
st=$(result "$out" stall.client)
sj=$(kv "$st" json)
check "stalled reader: the writer's non-blocking send never waits for it" \
	"$([[ $(kv "$st" rc) == 0 && -n $(jf "$sj" longest_call_s) ]] && awk -v l="$(jf "$sj" longest_call_s)" -v e="$(jf "$sj" eagain)" 'BEGIN { print (l < 1.0 && e > 0) ? 1 : 0 }' || echo 0)" \
	"longest send() $(jf "$sj" longest_call_s) s (the reader stays away ${STALL_SLEEP:-8} s), $(jf "$sj" eagain) EAGAIN, $(jf "$sj" sent) bytes sent, writable again after $(jf "$sj" writable_after_s) s"
check "stalled reader: every byte, in order, once it reads" \
	"$([[ -n $(jf "$sj" sent) && "$(jf "$sj" answer)" == "$(jf "$sj" sent) $(jf "$sj" sha256)" ]] && echo 1 || echo 0)" \
	"sent $(jf "$sj" sent) sha256 $(jf "$sj" sha256 | cut -c1-16)…, answer $(jf "$sj" answer | cut -c1-30)…"
check "stalled reader: both sides -> verbs" "$([[ $(kv "$st" transport) == verbs && $(kv "$st" server) == verbs ]] && echo 1 || echo 0)" \
	"client $(kv "$st" transport), server $(kv "$st" server)"
# Its heartbeat thread reposts the sleeping reader's receives (SharedCq::
# tend) and offers the bigger region the writer's pressure asks for
# (VerbsLink::tend_regions), so the writer fills the 256 KiB first region
# and then a 4 MiB one: at least what TCP's buffers take in the same boot
# (the same pair, told to keep TCP). Before, 31,232 bytes (256 receives,
# then RNR), then 1.25 MiB (a 1 MiB region) against TCP's 2.6 MB.
stcp=$(result "$out" stalltcp.client)
stj=$(kv "$stcp" json)
check "stalled reader: the writer fills the sleeping reader's grown ring, at least what TCP buffers" \
	"$([[ -n $(jf "$sj" sent) && -n $(jf "$stj" sent) && $(jf "$sj" sent) -ge $(jf "$stj" sent) && $(kv "$stcp" transport) == tcp:* ]] && echo 1 || echo 0)" \
	"sent $(jf "$sj" sent) bytes while the reader slept; TCP took $(jf "$stj" sent) ($(kv "$stcp" transport), every byte: $([[ "$(jf "$stj" answer)" == "$(jf "$stj" sent) $(jf "$stj" sha256)" ]] && echo yes || echo no))"
# The writer ends its stream with the reader still away (guest/stalled_reader.py
# END shutdown, close, exit, quit). Before, the FIN could end the stream
# ahead of the writes still queued: the reader saw a clean, shorter stream.
# A reader that stopped (SIGSTOP) reposts nothing, so the writes wait in the
# writer's send queue: shutdown, close and exit run against one; a reader
# that sleeps takes them all, and exit and quit run against one.
ss=$(result "$out" stallshut.client)
ssj=$(kv "$ss" json) ssv=$(kv "$ss" server_json)
check "stopped reader, writer shuts down: every byte, then the end" \
	"$([[ -n $(jf "$ssj" sent) && "$(jf "$ssj" answer)" == "$(jf "$ssj" sent) $(jf "$ssj" sha256)" && $(jf "$ssv" end) == eof ]] && echo 1 || echo 0)" \
	"sent $(jf "$ssj" sent) (shutdown() took $(jf "$ssj" shutdown_s) s), the reader got $(jf "$ssv" got) then $(jf "$ssv" end), sha256 $([[ $(jf "$ssj" sha256) == "$(jf "$ssv" sha256)" ]] && echo equal || echo differs)"
# The case above is the one where the FIN could overtake the writes: the
# shutdown's flush ended unconfirmed, and the writer said where its stream
# ends (Connection::announce_end; the reader's side: tests/unit, Connection.
# FinAfterAnAnnouncedEndWaitsForTheRingToGetThere).
check "stopped reader, writer shuts down: its writes were still queued, and it announced its end" \
	"$([[ $(kv "$ss" announced) == 1 ]] && echo 1 || echo 0)" "Close frames logged by the writer: $(kv "$ss" announced)"
sc=$(result "$out" stallclose.client)
scj=$(kv "$sc" json) scv=$(kv "$sc" server_json)
check "stopped reader, writer closes and lives on: every byte, then the end" \
	"$([[ -n $(jf "$scj" sent) && $(jf "$scv" got) == "$(jf "$scj" sent)" && $(jf "$scv" sha256) == "$(jf "$scj" sha256)" && $(jf "$scv" end) == eof ]] && echo 1 || echo 0)" \
	"sent $(jf "$scj" sent), the reader got $(jf "$scv" got) then $(jf "$scv" end), sha256 $([[ $(jf "$scj" sha256) == "$(jf "$scv" sha256)" ]] && echo equal || echo differs)"
every_byte() { # CLIENT_JSON SERVER_JSON: the reader got what the writer sent, then EOF
	[[ -n $(jf "$1" sent) && $(jf "$2" got) == "$(jf "$1" sent)" && $(jf "$2" sha256) == "$(jf "$1" sha256)" && $(jf "$2" end) == eof ]]
}
check_every_byte() { # RESULT WHAT: that pair's reader got every byte, then EOF (before: 16,320 then a reset)
	local j v
	j=$(kv "$1" json) v=$(kv "$1" server_json)
	check "$2: every byte, then the end" "$(every_byte "$j" "$v" && echo 1 || echo 0)" \
		"sent $(jf "$j" sent), the reader got $(jf "$v" got) then $(jf "$v" end) (before: 16,320 then a reset)"
}
se=$(result "$out" stallexit.client)
check_every_byte "$se" "sleeping reader, writer closes and exits"
sq=$(result "$out" stallquit.client)
check_every_byte "$sq" "sleeping reader, writer exits without closing"
# A stopped reader takes no write of the exiting writer's, which stops its
# QP and sends the rest on TCP after a Downgrade frame (Connection::
# resend_unconfirmed), as a TCP socket's kernel would deliver its send
# queue.
sx=$(result "$out" stallstop.client)
check_every_byte "$sx" "stopped reader, writer closes and exits"
sy=$(result "$out" stallstopquit.client)
check_every_byte "$sy" "stopped reader, writer exits without closing"
check "stopped reader, writer exits: the rest came on TCP (the reader logged tcp:downgraded:peer-resent)" \
	"$([[ $(kv "$sx" resent) == 1 && $(kv "$sy" resent) == 1 ]] && echo 1 || echo 0)" \
	"close and exit: $(kv "$sx" resent), exit: $(kv "$sy" resent)"
both=1
for x in "$ss" "$sc" "$se" "$sq" "$sx" "$sy"; do [[ $(kv "$x" transport) == verbs && $(kv "$x" server) == verbs ]] || both=0; done
check "stalled reader, writer shuts down, closes, exits or quits: both sides -> verbs" "$both" \
	"shutdown: client $(kv "$ss" transport), server $(kv "$ss" server); close: client $(kv "$sc" transport), server $(kv "$sc" server); exit: client $(kv "$se" transport), server $(kv "$se" server); quit: client $(kv "$sq" transport), server $(kv "$sq" server); exit, reader stopped: client $(kv "$sx" transport), server $(kv "$sx" server); quit, reader stopped: client $(kv "$sy" transport), server $(kv "$sy" server)"
check "echo4m client -> verbs" "$([[ $(kv "$c" transport) == verbs ]] && echo 1 || echo 0)" "logged: $(kv "$c" transport)"
check "echo4m server -> verbs" "$([[ $(kv "$s" transport) == verbs ]] && echo 1 || echo 0)" "logged: $(kv "$s" transport)"
# Elastic registration: a connection that moved 256 MiB and went idle keeps
# about its first regions registered (256 KiB ring + 256 KiB staging per
# side, and the control slots), not the 16 MiB ring + 1 MiB staging it grew
# to (fixed rings kept those for good).
i=$(result "$out" idle.verbs)
busy=$(kv "$i" busy_registered) idle=$(kv "$i" idle_registered)
check "idle connection moved its bytes over verbs" "$([[ $(kv "$i" rc) == 0 && $(kv "$i" json) == *'"exact": true'* && $(kv "$i" json) == *'"last": true'* && $(kv "$i" client) == verbs && $(kv "$i" server) == verbs ]] && echo 1 || echo 0)" \
	"rc=$(kv "$i" rc) in $(kv "$i" secs) s, client $(kv "$i" client), server $(kv "$i" server), $(kv "$i" json)"
# (Growth itself: the 4 MiB echo above deadlocks in 256 KiB regions.)
echo "info: largest verbs_registered seen while moving: ${busy:-none} bytes (sampled; under TCG a sample takes seconds)"
check "idle connection gave its registration back" "$([[ -n $idle && ${idle%%/*} -gt 0 && ${idle%%/*} -le $((2 << 20)) && ${idle##*/} == 2 ]] && echo 1 || echo 0)" \
	"verbs_registered/verbs_pooled/processes while idle: ${idle:-none} (bound $((2 << 20)) each)"
# Many connections in one process, the server's verbs memory 4 MiB: the
# first K on verbs at both ends, the rest tcp:verbs-limit at both ends, every
# byte echoed, and `rdmashim stat` counting one QP per verbs connection and
# the CQs they share (cqs_for) in each process, three memory regions per server link (its
# regions may not grow past the budget), the server within its budget. The
# client's links may grow (up to two more regions each while a larger one is
# offered or an old staging drains) and its pool keeps the last refused
# link's three.
m=$(result "$out" many)
n=${MANY_N:-16}
k=$(kv "$m" server_verbs)
IFS=/ read -r cq cc cm creg cpool <<<"$(kv "$m" client_stat)"
IFS=/ read -r sq sc sm sreg spool <<<"$(kv "$m" server_stat)"
check "$n connections from one process: every byte echoed" "$([[ $(kv "$m" rc) == 0 && $(kv "$m" json) == *'"exact": true'* ]] && echo 1 || echo 0)" \
	"rc=$(kv "$m" rc), opened and moved in $(kv "$m" secs) s, $(kv "$m" json)"
check "the first K on verbs, the rest tcp:verbs-limit, at both ends" \
	"$([[ -n $k && $k -ge 1 && $k -lt $n && $(kv "$m" client_verbs) == "$k" && $(kv "$m" server_limit) == $((n - k)) && $(kv "$m" client_limit) == $((n - k)) ]] && echo 1 || echo 0)" \
	"K=$k: client $(kv "$m" client_verbs) verbs + $(kv "$m" client_limit) limited ($(kv "$m" client_reason)), server $k verbs + $(kv "$m" server_limit) limited ($(kv "$m" server_reason))"
check "rdmashim stat: server QPs = K, CQs = cqs_for K, MRs = 3K, within 4 MiB" \
	"$([[ $sq == "$k" && $sc == "$(cqs_for "$k")" && $sm == $((3 * k)) && -n $sreg && $sreg -le $((4 << 20)) ]] && echo 1 || echo 0)" \
	"qps/cqs/mrs/registered/pooled: $(kv "$m" server_stat)"
# The client's refused link (made before the server's Ack said no) left its
# own CQ to the next: it may hold the CQs of K + 1 links.
check "rdmashim stat: client QPs = K, CQs = cqs_for K or K + 1, MRs 3K..5K+3" \
	"$([[ $cq == "$k" && $cc -ge $(cqs_for "$k") && $cc -le $(cqs_for $((k + 1))) && $cm -ge $((3 * k)) && $cm -le $((5 * k + 3)) ]] && echo 1 || echo 0)" \
	"qps/cqs/mrs/registered/pooled: $(kv "$m" client_stat)"
# The idle heartbeat at 1 s: a live idle link beats (two or more in 4.5 s),
# and from a second after its peer's SIGKILL at most one more in 5.5 s (one a
# second before a beat waited for the last one to complete).
# Shared CQs with every wait asleep: each of SCQ_THREADS (24) blocking threads
# on its own verbs connection, seeded random sizes, every echo hashed, no
# thread stuck (a lost wake-up hangs one: seed printed to replay).
q=$(result "$out" scq)
threads=${SCQ_THREADS:-24}
check "shared CQs, no spin: $threads threads' echoes exact on verbs at both ends" \
	"$([[ $(kv "$q" rc) == 0 && $(kv "$q" json) == *'"exact": true'* && $(kv "$q" client_verbs) == "$threads" && $(kv "$q" server_verbs) == "$threads" ]] && echo 1 || echo 0)" \
	"rc=$(kv "$q" rc), seed $(kv "$q" seed) (SCQ_SEED replays), verbs client $(kv "$q" client_verbs) server $(kv "$q" server_verbs), $(kv "$q" json) $(kv "$q" log)"
b=$(result "$out" beat)
IFS=/ read -r b0 b1 <<<"$(kv "$b" live)"
IFS=/ read -r b2 b3 <<<"$(kv "$b" dead)"
check "idle heartbeat: a live link beats" "$([[ $b0 =~ ^[0-9]+$ && $b1 =~ ^[0-9]+$ && $((b1 - b0)) -ge 2 && $(kv "$b" server) == verbs ]] && echo 1 || echo 0)" \
	"verbs_beats $b0 -> $b1 in 4.5 s idle, server $(kv "$b" server), client $(kv "$b" client)"
check "idle heartbeat: one beat at most to a killed peer" "$([[ $b2 =~ ^[0-9]+$ && $b3 =~ ^[0-9]+$ && $((b3 - b2)) -le 1 && $b2 -gt 0 && $(kv "$b" server) == verbs ]] && echo 1 || echo 0)" \
	"verbs_beats $b2 -> $b3 in 5.5 s, from 1 s after the kill (server $(kv "$b" server), still running at the last look: $(kv "$b" server_alive))"
if ((fail)); then
	echo "softroce.verbs_local: FAILED"
	exit 1
fi
echo "softroce.verbs_local: OK"
