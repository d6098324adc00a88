#!/usr/bin/env bash
# In TWO guests (run by ../servers.sh): unmodified PostgreSQL 15 and Redis 7
# across the Soft-RoCE link.
#   guest a (10.77.0.1)  initdb in /tmp as the postgres user, then postgres
#                        and redis-server, both under `rdmashim run --log info`;
#                        tells b it is ready, waits for b's "done", then
#                        reports the transport of every server-side connection
#   guest b (10.77.0.2)  waits for "ready", then the clients: psql with the
#                        script (under rdmashim, then plain into a second
#                        database, outputs compared), pgbench -i and a short
#                        run, redis-cli SET/GET of 1 B .. 1 MiB (SHA-256), a
#                        plain redis-cli, redis-benchmark GET/SET; reports the
#                        transport of every client-side connection
# "ready" and "done" go over separate plain connections (matrix_peer, 0
# bytes) so that no probe of the servers adds a connection to their logs.
# Prints "@ KEY k=v ..." lines; the host judges them. Each guest also keeps
# its logs and, every 20 s, what its processes are doing (threads, system
# calls, `rdmashim stat`) in $RDMASHIM_VM_OUT, which outlives a guest killed
# at its timeout: the host prints them when the run fails.
# env: PG_SCRIPT (the psql script, rows spliced in by the host),
#      PGBENCH_SECONDS (5), REDIS_BENCH_N (1000), WAIT_READY (300 s)
# Not set -e: every step reports, a failed one must not hide the next.
set -uo pipefail
source "$(dirname "$(readlink -f "$0")")/common.sh"

role=$RDMASHIM_VM_ROLE
server_ip=10.77.0.1 client_ip=10.77.0.2
pgbin=/usr/lib/postgresql/15/bin
pg_port=5432 redis_port=6379 ready_port=18901 done_port=18900
export PGCLIENTENCODING=UTF8 PGUSER=postgres PGCONNECT_TIMEOUT=60 PGAPPNAME=rdmashim-softroce
unset PGHOST PGPORT PGDATABASE PGOPTIONS PGSSLMODE PGSERVICE

OUT=${RDMASHIM_VM_OUT:-/tmp}

# state_watch NAME PATTERN: every 20 s, OUT/state.NAME says what the processes
# matching PATTERN are doing (replaced whole, so a killed guest leaves a
# complete one), until the script ends.
state_watch() {
	local name=$1 pat=$2 p t cmd
	while sleep 20; do
		{
			date -u +%T
			for p in $(pgrep -f "$pat"); do
				cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-100)
				[[ -n $cmd ]] || continue # gone, or pgrep's own subshell
				echo "pid $p: $cmd"
				for t in /proc/"$p"/task/*; do
					echo "  ${t##*/} $(cut -d' ' -f3 "$t/stat") wchan=$(cat "$t/wchan") syscall=$(cut -d' ' -f1-4 "$t/syscall")"
				done
			done 2>/dev/null
			"$BIN/rdmashim" stat 2>&1 | head -60
		} >"$OUT/state.$name.new" && mv "$OUT/state.$name.new" "$OUT/state.$name"
	done
}

# flat: stdin on one line for a result line (the guest's devtmpfs has no /dev/stdin)
flat() { tr '\n' '|' | tr ' ' '_' | cut -c1-300; }

notice_wait() { # PORT SECONDS: blocks until the other guest's notice arrives
	timeout "$2" "$BIN/matrix_peer" server --bind 0.0.0.0 --port "$1" --bytes 0 >/dev/null 2>&1
}
notice_send() { # HOST PORT
	timeout 120 "$BIN/matrix_peer" client --host "$1" --port "$2" --bytes 0 --connect-wait 100 >/dev/null 2>&1
}

# counts FILE SIDE: "verbs=N peer_plain=M other=K all=T kinds=verbs:N,..." for
# the rdmashim connection lines of SIDE in FILE, and warnings=W.
counts() {
	local f=$1 side=$2 all v p w kinds
	all=$(sed -n "s/^rdmashim\[[0-9]*\] info: fd [0-9]* ($side) -> \([^ ]*\).*\$/\1/p" "$f" 2>/dev/null)
	v=$(grep -cx verbs <<<"$all")
	p=$(grep -cx tcp:peer-plain <<<"$all")
	t=$(grep -c . <<<"$all")
	kinds=$(grep . <<<"$all" | sort | uniq -c | awk '{ printf "%s%s:%s", s, $2, $1; s = "," }')
	w=$(grep -cE '^rdmashim\[[0-9]+\] (warn|error):' "$f" 2>/dev/null)
	echo "verbs=$v peer_plain=$p other=$((t - v - p)) all=$t kinds=${kinds:-none} warnings=$w"
}

# ---------------------------------------------------------------- guest a ---
servers() {
	local t0 rc redis_pid redis_ok=0 i
	mkdir -p /tmp/srv && cd /tmp/srv || exit 1
	install -d -m 755 -o postgres -g postgres /tmp/srv/pg
	t0=$(now)
	runuser -u postgres -- "$pgbin/initdb" -D /tmp/srv/pg/data -A trust -U postgres -E UTF8 --locale=C.UTF-8 -N \
		>initdb.log 2>&1
	rc=$?
	say "pg.initdb rc=$rc seconds=$(elapsed "$t0" "$(now)") log=$(tail -n 3 initdb.log | tr '\n' '|' | tr ' ' '_' | cut -c1-300)"
	# initdb -A trust covers local and 127.0.0.1; the clients come from guest b.
	echo "host all all 10.77.0.0/24 trust" >>/tmp/srv/pg/data/pg_hba.conf
	t0=$(now)
	# Small and cheap: a 1 GiB guest whose /tmp is RAM, one vCPU under TCG.
	runuser -u postgres -- "${SHIM[@]}" "$pgbin/pg_ctl" -D /tmp/srv/pg/data -l /tmp/srv/pg/server.log -w -t 120 \
		-o "-p $pg_port -k /tmp/srv/pg -c listen_addresses=$server_ip -c max_connections=20 -c fsync=off \
-c full_page_writes=off -c shared_buffers=32MB -c wal_level=minimal -c max_wal_senders=0 -c max_wal_size=64MB \
-c min_wal_size=32MB -c autovacuum=off" start >pg_ctl.log 2>&1
	rc=$?
	say "pg.start rc=$rc seconds=$(elapsed "$t0" "$(now)") log=$(oneline pg_ctl.log)"
	mkdir -p /tmp/srv/redis
	timeout 900 "${SHIM[@]}" redis-server --port "$redis_port" --bind "$server_ip" --save '' --appendonly no \
		--daemonize no --protected-mode no --dir /tmp/srv/redis >redis.out 2>"$OUT/redis.err" &
	redis_pid=$!
	ln -sf "$OUT/redis.err" redis.err
	state_watch a 'redis-server|postgres' >/dev/null 2>&1 &
	watch_pid=$!
	for ((i = 0; i < 300; i++)); do
		ss -Htln "sport = :$redis_port" | grep -q . && { redis_ok=1; break; }
		kill -0 "$redis_pid" 2>/dev/null || break
		sleep 0.1
	done
	say "redis.start ok=$redis_ok log=$(tail -n 3 redis.out | flat)"
	notice_send "$client_ip" "$ready_port"
	t0=$(now)
	notice_wait "$done_port" 600
	say "servers.wait rc=$? seconds=$(elapsed "$t0" "$(now)")"
	say "pg.server $(counts /tmp/srv/pg/server.log server)"
	say "redis.server $(counts redis.err server)"
	runuser -u postgres -- "$pgbin/pg_ctl" -D /tmp/srv/pg/data -m fast -w -t 60 stop >/dev/null 2>&1 ||
		say "pg.stop failed"
	kill "$redis_pid" 2>/dev/null
	wait "$redis_pid" 2>/dev/null
	if grep -qE '^rdmashim\[[0-9]+\] (warn|error):' /tmp/srv/pg/server.log redis.err; then
		grep -hE '^rdmashim\[[0-9]+\] (warn|error):' /tmp/srv/pg/server.log redis.err | head -20 | sed 's/^/server warning: /'
	fi
	# postgres' own complaints, if any (FATAL/PANIC/ERROR besides the script's
	# duplicate key), and a backend that died (the postmaster then restarts
	# every session: "not yet accepting connections")
	grep -E 'FATAL|PANIC|ERROR|terminated by signal|exited with exit code|all server processes terminated' /tmp/srv/pg/server.log |
		grep -v 'duplicate key' | head -20 | sed 's/^/server log: /'
}

# ---------------------------------------------------------------- guest b ---
pgerr=/tmp/cli/pg.client   # rdmashim's lines of every psql/pgbench under rdmashim
rerr=/tmp/cli/redis.client # rdmashim's lines of every redis-cli/-benchmark under rdmashim
pg_plain=0 redis_plain=0   # connections made by plain clients

# shim|plain CMD...: with a time limit; stderr to $E (set by the caller).
run() {
	local how=$1
	shift
	if [[ $how == shim ]]; then timeout 300 "${SHIM[@]}" "$@" 2>>"$E"; else timeout 300 "$@" 2>>"$E"; fi
}

psql_script() { # NAME shim|plain: CREATE DATABASE NAME, run the script in it
	local name=$1 how=$2 rc=0 t0 E=/tmp/cli/$1.create
	: >"$E"
	run "$how" "$pgbin/psql" -X -q -h "$server_ip" -p $pg_port -d postgres -v ON_ERROR_STOP=1 -c "CREATE DATABASE $name"
	rc=$?
	local pre=()
	[[ $how == shim ]] && pre=("${SHIM[@]}")
	t0=$(now)
	timeout 600 "${pre[@]}" "$pgbin/psql" -X -h "$server_ip" -p $pg_port -d "$name" \
		-v ON_ERROR_STOP=1 -f "$PG_SCRIPT" >"$name.out" 2>"$name.err"
	echo $? >"$name.rc"
	local secs
	secs=$(elapsed "$t0" "$(now)")
	grep -h '^rdmashim\[' "$E" "$name.err" >>"$pgerr"
	grep -v '^rdmashim\[' "$name.err" >"$name.err.app"
	grep -v '^rdmashim\[' "$E" >"$name.create.app"
	[[ $how == plain ]] && pg_plain=$((pg_plain + 2))
	say "pg.script.$name how=$how create_rc=$rc rc=$(cat "$name.rc") seconds=$secs out_bytes=$(wc -c <"$name.out") \
out_sha256=$(sha256sum <"$name.out" | cut -c1-16) err_lines=$(wc -l <"$name.err.app") \
dupkey=$(grep -c 'duplicate key value' "$name.err.app") log=$(cat "$name.create.app" "$name.err.app" | head -5 | flat)"
}

pgbench_part() {
	local E=$OUT/pgbench.err rc t0 secs=${PGBENCH_SECONDS:-5} processed failed errors tps sums
	: >"$E"
	run shim "$pgbin/psql" -X -q -h "$server_ip" -p $pg_port -d postgres -c "CREATE DATABASE bench"
	t0=$(now)
	run shim "$pgbin/pgbench" -h "$server_ip" -p $pg_port -i -s 1 bench >pgbench-init.out
	rc=$?
	say "pgbench.init rc=$rc done=$(grep -c '^done' "$E") seconds=$(elapsed "$t0" "$(now)")"
	t0=$(now)
	rc=0
	run shim "$pgbin/pgbench" -h "$server_ip" -p $pg_port -c 2 -j 1 -T "$secs" bench >pgbench-run.out || rc=$?
	processed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' pgbench-run.out)
	failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' pgbench-run.out)
	tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' pgbench-run.out)
	errors=$(grep -v '^rdmashim\[' "$E" | grep -ci 'error')
	sums=$(run shim "$pgbin/psql" -X -At -h "$server_ip" -p $pg_port -d bench -c \
		"SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),
		        (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history),
		        (SELECT count(*) FROM pgbench_history)")
	say "pgbench.run rc=$rc seconds=$(elapsed "$t0" "$(now)") clients=2 duration=$secs processed=${processed:-none} \
failed=${failed:-none} tps=${tps:-none} errors=$errors sums=${sums:-none} log=$(grep -v '^rdmashim\[' "$E" | tail -n 3 | flat)"
	grep -h '^rdmashim\[' "$E" >>"$pgerr"
}

redis_part() {
	local E=$OUT/redis.err size f got rc t0 out
	: >"$E"
	t0=$(now)
	for size in 1 1024 65536 1048576; do
		f=value.$size
		head -c "$size" /dev/urandom >"$f"
		got=$(run shim redis-cli -h "$server_ip" -p $redis_port -x set "key:$size" <"$f")
		rc=0
		run shim redis-cli -h "$server_ip" -p $redis_port --raw get "key:$size" >"got.$size" || rc=$?
		# --raw prints the value and one newline: drop exactly that byte.
		say "redis.value size=$size set=${got:-none} get_rc=$rc sent=$(sha256sum <"$f" | cut -c1-16) \
got=$(head -c -1 "got.$size" | sha256sum | cut -c1-16) got_bytes=$(($(wc -c <"got.$size") - 1))"
	done
	say "redis.values.time seconds=$(elapsed "$t0" "$(now)")"
	# One plain client against the rdmashim server: SET and GET of 64 KiB.
	got=$(run plain redis-cli -h "$server_ip" -p $redis_port -x set key:plain <value.65536)
	rc=0
	run plain redis-cli -h "$server_ip" -p $redis_port --raw get key:plain >got.plain || rc=$?
	redis_plain=$((redis_plain + 2))
	say "redis.plain set=${got:-none} get_rc=$rc sent=$(sha256sum <value.65536 | cut -c1-16) \
got=$(head -c -1 got.plain | sha256sum | cut -c1-16)"
	grep -h '^rdmashim\[' "$E" >>"$rerr"
	grep -v '^rdmashim\[' "$E" | head -5 | sed 's/^/redis-cli: /'
	# redis-benchmark GET and SET, short: every test must report a rate.
	E=$OUT/redis-bench.err
	: >"$E"
	t0=$(now)
	rc=0
	out=$(run shim redis-benchmark -h "$server_ip" -p $redis_port --csv -t get,set -n "${REDIS_BENCH_N:-1000}" -c 4) || rc=$?
	say "redis.bench rc=$rc seconds=$(elapsed "$t0" "$(now)") rows=$(grep -c '^"[A-Z]*","[0-9.]*"' <<<"$out") \
errors=$(grep -ci 'err' <<<"$out") rates=$(grep '^"[A-Z]' <<<"$out" | cut -d, -f1,2 | tr -d '"' | tr '\n' ';')"
	grep -h '^rdmashim\[' "$E" >>"$rerr"
	grep -v '^rdmashim\[' "$E" | head -5 | sed 's/^/redis-benchmark: /'
}

clients() {
	local t0
	mkdir -p /tmp/cli && cd /tmp/cli || exit 1
	: >"$pgerr"
	: >"$rerr"
	state_watch b 'redis-cli|redis-benchmark|psql|pgbench' >/dev/null 2>&1 &
	watch_pid=$!
	t0=$(now)
	notice_wait "$ready_port" "${WAIT_READY:-300}"
	say "clients.wait rc=$? seconds=$(elapsed "$t0" "$(now)")"
	psql_script shimdb shim
	psql_script plaindb plain
	local same=1 f
	for f in out err.app rc; do cmp -s "shimdb.$f" "plaindb.$f" || {
		same=0
		echo "differs: $f"
		diff <(head -c 100000 "plaindb.$f") <(head -c 100000 "shimdb.$f") | cut -c1-200 | head -20
	}; done
	say "pg.script.same same=$same"
	pgbench_part
	redis_part
	say "pg.client $(counts "$pgerr" client) plain_connections=$pg_plain"
	say "redis.client $(counts "$rerr" client) plain_connections=$redis_plain"
	grep -hE '^rdmashim\[[0-9]+\] (warn|error):' "$pgerr" "$rerr" | head -20 | sed 's/^/client warning: /'
	notice_send "$server_ip" "$done_port"
}

t_start=$(now)
watch_pid=
if [[ $role == a ]]; then servers; else clients; fi
[[ -n $watch_pid ]] && kill "$watch_pid" 2>/dev/null
say "servers.$role.time seconds=$(elapsed "$t_start" "$(now)")"
say "done.$role"
