#!/usr/bin/env bash
# softroce.servers: unmodified PostgreSQL 15 and Redis 7 across the Soft-RoCE
# link, in one two-guest boot. Guest a (10.77.0.1) runs postgres (initdb in
# its /tmp, as the postgres user) and redis-server, both under
# `rdmashim run --log info`; guest b (10.77.0.2) runs the clients:
#   psql     the system test's script (tests/system/pg_script.sql: tables,
#            inserts, updates, transactions, COPY of a few MB in and out, read
#            back) under rdmashim into one database, then plain into another
#            database of the same server: stdout, stderr and exit status equal
#   pgbench  -i -s 1 and -c 2 -T PGBENCH_SECONDS under rdmashim: no errors, no
#            failed transactions, balances consistent
#   redis    redis-cli SET/GET of 1 B, 1 KiB, 64 KiB, 1 MiB under rdmashim
#            (SHA-256 equal), one plain redis-cli SET/GET, redis-benchmark
#            -t get,set under rdmashim
# Transports: every connection of an rdmashim client logs "-> verbs" on the
# client side, the servers log as many "-> verbs" lines, plus one
# "-> tcp:peer-plain" per connection of a plain client (psql, redis-cli);
# no rdmashim warnings on either side. No RDMASHIM_PEERS: discovery finds them.
# Exit 77 (skip) when no guest can run or the server packages are missing
# (tests/system/postgres.sh and redis.sh install them when run as root).
# env: RDMASHIM_BUILD, PG_ROWS (COPY rows, 3000 = ~4.2 MB, as tests/system), PGBENCH_SECONDS (5),
#      REDIS_BENCH_N (1000 requests per test), SERVERS_TIMEOUT (600)
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"

missing=()
for p in postgresql-15 postgresql-client-15 redis-server redis-tools; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "SKIP: missing Debian packages: ${missing[*]} (the system tests install them as root:" \
		"tests/system/postgres.sh, tests/system/redis.sh; or apt-get install ${missing[*]})"
	exit 77
fi
softroce_skip_unless_vm
softroce_stage

# The psql script with its COPY rows spliced in, as tests/system/postgres.sh
# does (ids, 1000 hex digits, 400 base64 characters per row).
rows=${PG_ROWS:-3000}
paste <(seq "$rows") \
	<(head -c $((rows * 500)) /dev/urandom | basenc --base16 -w 1000 | tr 'A-F' 'a-f') \
	<(head -c $((rows * 300)) /dev/urandom | base64 -w 400) >"$STAGE/blobs.tsv"
sed -e "/^-- @BLOBS@\$/{r $STAGE/blobs.tsv" -e 'd}' "$SOFTROCE_DIR/../system/pg_script.sql" >"$STAGE/script.sql"
chmod 644 "$STAGE/script.sql"

envs="PG_SCRIPT=$STAGE/script.sql PGBENCH_SECONDS=${PGBENCH_SECONDS:-5} REDIS_BENCH_N=${REDIS_BENCH_N:-1000}"
cmd="$envs bash $STAGE/guest/servers.sh"
st=0
t0=$(date +%s.%N)
out=$("$VM" run2 --timeout "${SERVERS_TIMEOUT:-600}" -- "$cmd" -- "$cmd" 2>&1) || st=$?
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
printf '%s\n' "$out" | sed 's/^/  | /'

((st == 0)) || check "guests ran" 0 "vm run2 exited $st"
# What each guest kept (guest/servers.sh): on a failure, its last look at its
# processes and the ends of the logs, for a run that cannot be repeated.
show_guest_files() {
	local dir f
	for dir in $(sed -n 's/.*guest [ab]: artifacts in \(.*\)$/\1/p' <<<"$out"); do
		for f in "$dir"/state.* "$dir"/*.err; do
			[[ -s $f ]] || continue
			echo "--- ${f##*/job-} (last 40 lines)"
			tail -n 40 "$f" | cut -c1-300
		done
	done
}

# -- guest a: the servers came up
l=$(result "$out" pg.initdb)
check "initdb in guest a (postgres user)" "$(yes_if test "$(kv "$l" rc)" = 0)" "rc=$(kv "$l" rc), $(kv "$l" seconds) s"
l=$(result "$out" pg.start)
check "postgres started under rdmashim" "$(yes_if test "$(kv "$l" rc)" = 0)" "rc=$(kv "$l" rc), $(kv "$l" seconds) s $(kv "$l" log)"
l=$(result "$out" redis.start)
check "redis-server started under rdmashim" "$(yes_if test "$(kv "$l" ok)" = 1)" "listening on 10.77.0.1:6379"
[[ $(kv "$l" ok) == 1 ]] || echo "      redis-server: $(kv "$l" log)"

# -- psql script: rdmashim client, then plain, same server, output compared
s=$(result "$out" pg.script.shimdb) p=$(result "$out" pg.script.plaindb)
check "psql script, plain client" "$(yes_if test "$(kv "$p" create_rc)" = 0 -a "$(kv "$p" rc)" = 0 -a "$(kv "$p" dupkey)" = 1)" \
	"rc=$(kv "$p" rc), $(kv "$p" out_bytes) bytes of stdout, $(kv "$p" err_lines) lines of stderr (the expected duplicate key error), $(kv "$p" seconds) s"
check "psql script under rdmashim" "$(yes_if test "$(kv "$s" create_rc)" = 0 -a "$(kv "$s" rc)" = 0)" \
	"rc=$(kv "$s" rc), $(kv "$s" out_bytes) bytes of stdout, $(kv "$s" seconds) s"
[[ $(kv "$s" rc) == 0 && $(kv "$s" create_rc) == 0 ]] || echo "      psql stderr: $(kv "$s" log)"
l=$(result "$out" pg.script.same)
check "psql script output identical to plain" "$(yes_if test "$(kv "$l" same)" = 1 -a -n "$(kv "$s" out_sha256)")" \
	"stdout sha256 $(kv "$s" out_sha256)… vs $(kv "$p" out_sha256)…, stderr and exit status compared"

# -- pgbench
l=$(result "$out" pgbench.init)
check "pgbench -i -s 1" "$(yes_if test "$(kv "$l" rc)" = 0 -a "$(kv "$l" "done")" = 1)" "rc=$(kv "$l" rc), $(kv "$l" seconds) s"
l=$(result "$out" pgbench.run)
IFS='|' read -r a b t h n <<<"$(kv "$l" sums)"
processed=$(kv "$l" processed)
check "pgbench -c 2 -T $(kv "$l" duration)" "$(yes_if test "$(kv "$l" rc)" = 0 -a "$(kv "$l" failed)" = 0 \
	-a "$(kv "$l" errors)" = 0 -a "${processed:-0}" != none -a "${processed:-0}" != 0)" \
	"rc=$(kv "$l" rc), $processed transactions, $(kv "$l" failed) failed, $(kv "$l" errors) error lines, $(kv "$l" tps) tps"
[[ $(kv "$l" rc) == 0 ]] || echo "      pgbench stderr: $(kv "$l" log)"
check "pgbench balances consistent" "$(yes_if test -n "$h" -a "$a" = "$h" -a "$b" = "$h" -a "$t" = "$h" -a "$n" = "$processed")" \
	"accounts $a branches $b tellers $t history $h over $n rows"

# -- redis
while read -r l; do
	[[ -n $l ]] || continue
	size=$(kv "$l" size)
	check "redis SET/GET $size bytes (rdmashim client)" "$(yes_if test "$(kv "$l" set)" = OK -a "$(kv "$l" get_rc)" = 0 \
		-a "$(kv "$l" sent)" = "$(kv "$l" got)" -a "$(kv "$l" got_bytes)" = "$size")" \
		"set $(kv "$l" set), get rc $(kv "$l" get_rc), $(kv "$l" got_bytes) bytes back, sha256 $(kv "$l" sent)… vs $(kv "$l" got)…"
done < <(sed -n 's/^\[b\] @ redis.value //p' <<<"$out")
[[ $(sed -n 's/^\[b\] @ redis.value //p' <<<"$out" | grep -c .) == 4 ]] || check "redis values" 0 "not all 4 sizes reported"
l=$(result "$out" redis.plain)
check "redis SET/GET 64 KiB (plain client)" "$(yes_if test "$(kv "$l" set)" = OK -a "$(kv "$l" get_rc)" = 0 -a "$(kv "$l" sent)" = "$(kv "$l" got)")" \
	"set $(kv "$l" set), sha256 $(kv "$l" sent)… vs $(kv "$l" got)…"
l=$(result "$out" redis.bench)
check "redis-benchmark -t get,set -c 4" "$(yes_if test "$(kv "$l" rc)" = 0 -a "$(kv "$l" rows)" = 2 -a "$(kv "$l" errors)" = 0)" \
	"rc=$(kv "$l" rc), requests/s: $(kv "$l" rates | tr ';' ' ')$(kv "$l" seconds) s"

# -- transports: client lines all verbs; the server saw as many verbs
# connections, plus exactly the plain clients' connections as tcp:peer-plain
for srv in pg redis; do
	c=$(result "$out" "$srv.client") s=$(result "$out" "$srv.server")
	cv=$(kv "$c" verbs) sv=$(kv "$s" verbs) plain=$(kv "$c" plain_connections)
	check "$srv clients (rdmashim) -> verbs" "$(yes_if test -n "$cv" -a "${cv:-0}" -gt 0 -a "$(kv "$c" all)" = "$cv")" \
		"client side: $(kv "$c" kinds)"
	# as many verbs lines as rdmashim client connections (not merely as many as the client's verbs lines)
	check "$srv server (rdmashim) -> verbs for each rdmashim client" "$(yes_if test -n "$sv" -a "${sv:-0}" -gt 0 -a "$sv" = "$(kv "$c" all)")" \
		"server side $sv verbs, $(kv "$c" all) rdmashim client connections"
	check "$srv server -> tcp:peer-plain for the plain client" "$(yes_if test -n "$plain" -a "$(kv "$s" peer_plain)" = "$plain" -a "$(kv "$s" other)" = 0)" \
		"server side: $(kv "$s" kinds); $plain plain connections"
	check "$srv: no rdmashim warnings" "$(yes_if test "$(kv "$c" warnings)" = 0 -a "$(kv "$s" warnings)" = 0)" \
		"client $(kv "$c" warnings), server $(kv "$s" warnings)"
done

for g in a b; do
	t=$(result "$out" "servers.$g.time")
	[[ -n $t ]] && echo "time: guest $g: $(kv "$t" seconds) s"
done
echo "time: wall (boot to poweroff, staging excluded): $wall s"
((fail)) && show_guest_files
finish "softroce.servers"
