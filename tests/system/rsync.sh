#!/usr/bin/env bash
# rsync, unmodified: an rsync daemon (a server that speaks first: it greets
# with "@RSYNCD: <version>" before reading anything) and rsync:// clients.
#
#   both          daemon and 24 client runs under rdmashim: every connection
#                 upgraded on both ends (shm), whoever spoke first
#   plain-client  plain clients against the daemon under rdmashim: the
#                 daemon's greeting goes out at once, raw (tcp:server-spoke-first,
#                 or tcp:peer-plain when the client's own greeting came first)
#   Each run copies a module (1 MiB of random data and small files) into a
#   fresh folder; the copy must equal the module (diff -r).
#
# usage: rsync.sh both|plain-client
# Exit 77 (skipped) when rsync is missing and we may not install it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

mode=${1:?usage: rsync.sh both|plain-client}
case $mode in both|plain-client) ;; *) echo "unknown case $mode"; exit 2 ;; esac
runs=24

sys_need_packages rsync
sys_workdir
sys_install_shim
cd "$work"

mkdir -p module/sub
head -c 1048576 /dev/urandom >module/big.bin
for i in $(seq 20); do echo "file $i $RANDOM" >"module/sub/f$i.txt"; done
port=$(sys_free_port)
cat >rsyncd.conf <<CONF
use chroot = no
pid file = $work/rsyncd.pid
[mod]
  path = $work/module
  read only = yes
CONF
timeout -k 5 300 "$SHIM" run --log info -- rsync --daemon --no-detach --config="$work/rsyncd.conf" \
  --address=127.0.0.1 --port="$port" >"$work/daemon.out" 2>"$work/daemon.log" &
pid=$!
disown "$pid"
sys_on_exit "sys_kill_tree $pid"
sys_watch TERM "$pid"
sys_wait_port "$port" 10 || { echo "FAIL: the rsync daemon did not start"; cat "$work/daemon.log"; exit 1; }

launcher=()
[ "$mode" = both ] && launcher=("$SHIM" run --log info --)
for i in $(seq "$runs"); do
  timeout 60 "${launcher[@]}" rsync -a "rsync://127.0.0.1:$port/mod/" "$work/copy$i/" 2>>"$work/client.log" ||
    { echo "FAIL: rsync run $i failed"; cat "$work/client.log" "$work/daemon.log"; exit 1; }
  diff -r "$work/module" "$work/copy$i" >/dev/null || { echo "FAIL: copy $i differs"; exit 1; }
done

fail=0
count() { grep -c "($2) -> $3\$" "$work/$1" || true; }
expect() {  # log side transport
  local n; n=$(count "$1" "$2" "$3")
  if [ "$n" != "$runs" ]; then
    echo "FAIL: $n of $runs connections $2 -> $3 ($1):"; grep -o "($2) -> .*" "$work/$1" | sort | uniq -c; fail=1
  fi
}
if [ "$mode" = both ]; then
  expect client.log client shm
  expect daemon.log server shm
else
  # Both ends of the rsync protocol send their "@RSYNCD:" line at once, so
  # the plain client's may arrive before the daemon writes: either way TCP.
  n=$(( $(count daemon.log server tcp:server-spoke-first) + $(count daemon.log server tcp:peer-plain) ))
  [ "$n" = "$runs" ] || { echo "FAIL: $n of $runs daemon connections plain"; grep -o "(server) -> .*" daemon.log | sort | uniq -c; fail=1; }
fi
[ "$fail" = 0 ] || exit 1
echo "ok: $mode: $runs rsync runs, copies identical"
