#!/usr/bin/env bash
# PostgreSQL 15, unmodified, under rdmashim: one case per run.
#
#   both          psql under rdmashim against a server under rdmashim
#   plain-client  plain psql against a server under rdmashim (fallback)
#   plain-server  psql under rdmashim against a plain server (fallback)
#       Each runs pg_script.sql (tables, inserts, updates, committed and
#       rolled-back transactions, a few MB of COPY in and out, ordered reads,
#       aggregates, md5 digests) in a fresh database and compares its stdout,
#       stderr and exit status byte for byte with the same script run by a
#       plain psql against a plain server. Then checks the transport every
#       rdmashim process reported for every connection (RDMASHIM_LOG=info):
#       both: all shm on both sides, as many server lines as client lines;
#       plain-client: the server says tcp:peer-plain; plain-server: the
#       client says tcp:not-advertised.
#   pgbench       pgbench -i and a short TPC-B-like run (both ends under
#       rdmashim): no errors, no failed transactions, balances consistent,
#       every connection on shm on both sides.
#
# usage: postgres.sh both|plain-client|plain-server|pgbench
# env:   RDMASHIM_BUILD (the build folder), PGBENCH_SECONDS (default 5),
#        KEEP_WORK=1 keeps the temp folder of a failed run.
# Exit 77 (skipped) when PostgreSQL 15 is missing and we may not install it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

mode=${1:?usage: postgres.sh both|plain-client|plain-server|pgbench}
case $mode in both|plain-client|plain-server|pgbench) ;; *) echo "unknown case $mode"; exit 2 ;; esac

sys_need_packages postgresql-15 postgresql-client-15
pgbin=/usr/lib/postgresql/15/bin
export PGCLIENTENCODING=UTF8 PGUSER=postgres PGCONNECT_TIMEOUT=10 PGAPPNAME=rdmashim-system
unset PGHOST PGPORT PGDATABASE PGOPTIONS PGSSLMODE PGSERVICE 2>/dev/null || true

sys_workdir
sys_install_shim
cd "$work"

# The server refuses to run as root: then it runs as the postgres user.
if [ "$(id -u)" -eq 0 ]; then
  pg_user=postgres as_pg=(runuser -u postgres --)
else
  pg_user=$(id -un) as_pg=()
fi
install -d -m 755 -o "$pg_user" "$work/pg"
# One initdb; every server of this test starts from a copy of it.
timeout 120 "${as_pg[@]}" "$pgbin/initdb" -D "$work/pg/template" -A trust -U postgres -E UTF8 --locale=C.UTF-8 -N \
  >"$work/initdb.log" 2>&1 || { echo "FAIL: initdb"; cat "$work/initdb.log"; exit 1; }

# pg_start NAME shim|plain: starts a server on a free port; sets port_NAME.
# Its log (with the rdmashim lines of every backend) is $work/pg/NAME.log.
pg_start() {
  local name=$1 how=$2 data=$work/pg/$1 port try launcher=()
  "${as_pg[@]}" cp -a "$work/pg/template" "$data"
  [ "$how" = shim ] && launcher=("$SHIM" run --log info --)
  for try in 1 2 3; do
    port=$(sys_free_port)
    sys_on_exit "pg_stop $name"
    if timeout 60 "${as_pg[@]}" "${launcher[@]}" "$pgbin/pg_ctl" -D "$data" -l "$work/pg/$name.log" -w -t 40 \
         -o "-p $port -k $work/pg -c listen_addresses=127.0.0.1 -c max_connections=30 -c fsync=off" \
         start >"$work/pg/$name.ctl" 2>&1 && sys_wait_port "$port" 10; then
      printf -v "port_$name" %s "$port"
      # SIGQUIT: the postmaster's immediate shutdown, backends included
      sys_watch QUIT "$(head -n 1 "$data/postmaster.pid")"
      return 0
    fi
    pg_stop "$name"   # maybe the port was taken under us: try another
  done
  echo "FAIL: could not start the $how PostgreSQL server"; cat "$work/pg/$name.ctl" "$work/pg/$name.log"
  exit 1
}
# pg_stop NAME: immediate shutdown, then SIGKILL whatever is left.
pg_stop() {
  local data=$work/pg/$1 pid
  [ -f "$data/postmaster.pid" ] || return 0
  pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
  timeout 20 "${as_pg[@]}" "$pgbin/pg_ctl" -D "$data" -m immediate -w -t 15 stop >/dev/null 2>&1 || true
  [ -n "$pid" ] && sys_alive "$pid" && sys_kill_tree "$pid"
  return 0
}

# client shim|plain CMD...: runs a client program (under rdmashim when asked)
# with a time limit.
client() {
  local how=$1; shift
  if [ "$how" = shim ]; then timeout 120 "$SHIM" run --log info -- "$@"
  else timeout 120 "$@"; fi
}

# The script, with the generated rows spliced in: ids, 1000 hex digits and
# 400 base64 characters per row, ~4.2 MB; the same file for every run.
rows=3000
paste <(seq "$rows") \
      <(head -c $((rows * 500)) /dev/urandom | basenc --base16 -w 1000 | tr 'A-F' 'a-f') \
      <(head -c $((rows * 300)) /dev/urandom | base64 -w 400) >"$work/blobs.tsv"
sed -e "/^-- @BLOBS@\$/{r $work/blobs.tsv" -e 'd}' "$here/pg_script.sql" >"$work/script.sql"

# run_script NAME CLIENT SERVER: creates database NAME and runs the script in
# it; $work/NAME.out/.err/.rc. Remembers where the server log stood before.
run_script() {
  local name=$1 chow=$2 server=$3 port rc=0
  port=$(eval echo "\$port_$server")
  client_err=$work/$name.client
  : >"$client_err"
  server_mark=$(( $(sys_lines "$work/pg/$server.log") + 1 ))
  client "$chow" "$pgbin/psql" -X -q -h 127.0.0.1 -p "$port" -d postgres -v ON_ERROR_STOP=1 \
    -c "CREATE DATABASE $name" 2>>"$client_err" || { echo "FAIL: CREATE DATABASE $name ($chow client, $server server)"; cat "$client_err"; exit 1; }
  client "$chow" "$pgbin/psql" -X -h 127.0.0.1 -p "$port" -d "$name" -v ON_ERROR_STOP=1 -f "$work/script.sql" \
    >"$work/$name.out" 2>"$work/$name.err" || rc=$?
  echo "$rc" >"$work/$name.rc"
  # the client's own lines are in $client_err; keep the script's stderr apart
  grep '^rdmashim\[' "$work/$name.err" >>"$client_err" || true
  grep -v '^rdmashim\[' "$work/$name.err" >"$work/$name.err.app" || true
}

# same NAME REF: stdout, stderr (without rdmashim's lines) and status equal.
same() {
  local f
  for f in out err.app rc; do
    if ! cmp -s "$work/$2.$f" "$work/$1.$f"; then
      echo "FAIL: $1: $f differs from the plain-TCP run ($2)"
      diff <(head -c 200000 "$work/$2.$f") <(head -c 200000 "$work/$1.$f") | cut -c 1-200 | head -40
      sys_failed=1
    fi
  done
  [ "$sys_failed" -eq 0 ] &&
    echo "ok: $1: script output identical to plain TCP ($(wc -c <"$work/$1.out") bytes of stdout, $(wc -l <"$work/$1.err.app") lines of stderr, exit $(cat "$work/$1.rc"))"
  return 0
}

case $mode in
  both|plain-client|plain-server)
    pg_start plain plain
    [ "$mode" != plain-server ] && pg_start shimmed shim
    run_script reference plain plain
    [ "$(cat "$work/reference.rc")" = 0 ] || { echo "FAIL: the plain run failed"; cat "$work/reference.err"; exit 1; }
    grep -q 'duplicate key value' "$work/reference.err.app" ||
      { echo "FAIL: the reference run lacks the expected error"; exit 1; }
    case $mode in
      both)
        run_script variant shim shimmed
        same variant reference
        sys_expect_transports "psql (rdmashim) -> server (rdmashim)" "$client_err" client 1 shm 2
        sys_expect_transports "psql (rdmashim) -> server (rdmashim)" "$work/pg/shimmed.log" server "$server_mark" shm 2 ;;
      plain-client)
        run_script variant plain shimmed
        same variant reference
        sys_expect_transports "plain psql -> server (rdmashim)" "$work/pg/shimmed.log" server "$server_mark" tcp:peer-plain 2 ;;
      plain-server)
        run_script variant shim plain
        same variant reference
        sys_expect_transports "psql (rdmashim) -> plain server" "$client_err" client 1 tcp:not-advertised 2 ;;
    esac
    sys_no_warnings "client" "$client_err"
    [ -f "$work/pg/shimmed.log" ] && sys_no_warnings "server" "$work/pg/shimmed.log"
    ;;

  pgbench)
    seconds=${PGBENCH_SECONDS:-5}
    pg_start shimmed shim
    port=$port_shimmed
    client_err=$work/pgbench.client
    : >"$client_err"
    client shim "$pgbin/psql" -X -q -h 127.0.0.1 -p "$port" -d postgres -c "CREATE DATABASE bench" 2>>"$client_err" ||
      { echo "FAIL: CREATE DATABASE"; cat "$client_err"; exit 1; }
    if ! client shim "$pgbin/pgbench" -h 127.0.0.1 -p "$port" -i -s 1 bench >"$work/init.out" 2>>"$client_err"; then
      echo "FAIL: pgbench -i"; cat "$work/init.out" "$client_err"; exit 1
    fi
    grep -q '^done' "$client_err" || { echo "FAIL: pgbench -i did not say done"; cat "$client_err"; exit 1; }
    echo "ok: pgbench -i -s 1"
    rc=0
    client shim "$pgbin/pgbench" -h 127.0.0.1 -p "$port" -c 4 -j 2 -T "$seconds" bench >"$work/run.out" 2>>"$client_err" || rc=$?
    processed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/run.out")
    failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$work/run.out")
    errors=$(grep -ci 'error' "$client_err" || true)
    if [ "$rc" -ne 0 ] || [ -z "$processed" ] || [ "$processed" -eq 0 ] || [ "${failed:-x}" != 0 ] || [ "$errors" -ne 0 ]; then
      echo "FAIL: pgbench run: exit $rc, processed ${processed:-?}, failed ${failed:-?}, error lines $errors"
      cat "$work/run.out"; grep -v '^rdmashim\[' "$client_err" | head -20
      exit 1
    fi
    echo "ok: pgbench -c 4 -j 2 -T $seconds: $processed transactions, 0 failed, $(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$work/run.out") tps"
    # TPC-B keeps the books: every balance change is one history row.
    sums=$(client shim "$pgbin/psql" -X -At -h 127.0.0.1 -p "$port" -d bench -c \
      "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),
              (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history),
              (SELECT count(*) FROM pgbench_history)" 2>>"$client_err")
    IFS='|' read -r a b t h n <<<"$sums"
    if [ "$a" != "$h" ] || [ "$b" != "$h" ] || [ "$t" != "$h" ] || [ "$n" != "$processed" ]; then
      echo "FAIL: balances disagree: accounts $a branches $b tellers $t history $h ($n rows, $processed transactions)"
      sys_failed=1
    else
      echo "ok: balances consistent (sum $h over $n history rows)"
    fi
    sys_expect_transports "pgbench (rdmashim) -> server (rdmashim)" "$client_err" client 1 shm
    clients=$sys_last_count
    sys_expect_transports "pgbench (rdmashim) -> server (rdmashim)" "$work/pg/shimmed.log" server 1 shm "$clients"
    sys_no_warnings "client" "$client_err"
    sys_no_warnings "server" "$work/pg/shimmed.log"
    ;;
esac

if [ "$sys_failed" -ne 0 ]; then
  echo "--- client stderr"; head -50 "$client_err"
  for l in "$work"/pg/*.log; do echo "--- $l"; tail -30 "$l"; done
  exit 1
fi
echo "PASS: postgres $mode"
