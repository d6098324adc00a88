# Shared by the system tests (tests/system/*.sh) and bench/servers: packages,
# a private copy of rdmashim, free ports, server start/stop with cleanup, and
# the parsing of the one line per connection that RDMASHIM_LOG=info prints.
# Source it; do not run it. Needs: RDMASHIM_BUILD (the build folder).

SYSTEM_SKIP=77   # ctest SKIP_RETURN_CODE of every system test

# sys_need_packages PKG... : installs what is missing when root (apt-get);
# otherwise exits 77 (skipped) naming the apt-get line to run.
sys_need_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: missing Debian packages: ${missing[*]} (install with: sudo apt-get install ${missing[*]})"
    exit "$SYSTEM_SKIP"
  fi
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # policy-rc.d 101: the packages' maintainer scripts must not start the
  # distro's own service instances; these tests use their own on free ports.
  local rcd=/usr/sbin/policy-rc.d created_rcd=0
  if [ ! -e "$rcd" ]; then printf '#!/bin/sh\nexit 101\n' >"$rcd" && chmod 755 "$rcd" && created_rcd=1; fi
  local ok=0
  timeout 300 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
    { timeout 300 apt-get update -qq >/dev/null 2>&1 &&
        timeout 300 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; } || ok=1
  [ "$created_rcd" -eq 1 ] && rm -f "$rcd"
  if [ "$ok" -ne 0 ]; then echo "FAIL: could not install ${missing[*]} with apt-get"; exit 1; fi
}

# sys_workdir: a fresh world-readable temp folder in $work, removed by sys_cleanup.
# The server runs as another user (postgres), so it must be able to enter it.
sys_workdir() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/rdmashim-system.XXXXXX")
  chmod 755 "$work"
  sys_watchdog
}

# sys_watchdog: a detached process (its own session, so a test driver that
# kills our process group misses it) that waits for this script to die. If
# it died without running its EXIT trap (SIGKILL, e.g. a ctest timeout), it
# sends each server listed with sys_watch its signal, SIGKILL after 3 s, and
# removes $work. After a normal exit it just ends.
sys_watchdog() {
  : >"$work/.watch"
  setsid bash -c '
    script=$1 work=$2
    while kill -0 "$script" 2>/dev/null; do sleep 1; done
    [ -d "$work" ] && [ ! -e "$work/.done" ] || exit 0
    while read -r sig pid; do kill "-$sig" "$pid" 2>/dev/null; done <"$work/.watch"
    sleep 3
    while read -r sig pid; do kill -KILL "$pid" 2>/dev/null; done <"$work/.watch"
    rm -rf "$work"' rdmashim-system-watchdog "$$" "$work" </dev/null >/dev/null 2>&1 &
  disown $! 2>/dev/null || true
}
# sys_watch SIGNAL PID: the watchdog stops PID with SIGNAL.
sys_watch() { echo "$1 $2" >>"$work/.watch"; }

# sys_install_shim: a private, world-readable copy of the rdmashim launcher
# and library in $work/shim, so a concurrent rebuild of the build tree never
# replaces a library a running server has mapped, and other users can read it.
# Sets SHIM (the launcher).
sys_install_shim() {
  local build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder}
  [ -x "$build/bin/rdmashim" ] && [ -f "$build/lib/librdmashim.so" ] ||
    { echo "FAIL: build rdmashim first ($build/bin/rdmashim, $build/lib/librdmashim.so)"; exit 1; }
  install -d -m 755 "$work/shim/bin" "$work/shim/lib"
  install -m 755 "$build/bin/rdmashim" "$work/shim/bin/rdmashim"
  install -m 755 "$build/lib/librdmashim.so" "$work/shim/lib/librdmashim.so"
  SHIM=$work/shim/bin/rdmashim
}

# sys_free_port: a TCP port nobody on this host uses in any state right now,
# and that no earlier call of this process handed out. Taken below the
# kernel's ephemeral range (ip_local_port_range), so outgoing connections of
# other programs cannot grab it between this check and the server's bind().
sys_used_ports=" "
sys_free_port() {
  local port i lo=10000 hi eph
  eph=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  hi=$(( eph - 1 ))
  [ "$hi" -gt $(( lo + 1000 )) ] || { lo=20000 hi=60000; }
  for i in $(seq 200); do
    port=$(( lo + (RANDOM * 32768 + RANDOM) % (hi - lo + 1) ))
    case $sys_used_ports in *" $port "*) continue ;; esac
    if ! ss -Htan 2>/dev/null | awk '{print $4; print $5}' | grep -q ":$port\$"; then
      sys_used_ports="$sys_used_ports$port "
      echo "$port"
      return 0
    fi
  done
  echo "FAIL: no free port found" >&2
  return 1
}

# sys_wait_port PORT SECONDS: until something listens on 127.0.0.1:PORT.
sys_wait_port() {
  local i
  for i in $(seq $(( $2 * 20 ))); do
    ss -Htln "sport = :$1" 2>/dev/null | grep -q . && return 0
    sleep 0.05
  done
  return 1
}

# Cleanup: every server started through these helpers is stopped on exit,
# whatever the exit path. sys_on_exit CMD adds a command to run first.
sys_exit_cmds=()
sys_on_exit() { sys_exit_cmds+=("$1"); }
sys_cleanup() {
  local rc=$? c
  for c in "${sys_exit_cmds[@]}"; do eval "$c" >/dev/null 2>&1 || true; done
  if [ -n "${work:-}" ] && [ -d "$work" ]; then
    : >"$work/.done"   # tells the watchdog all is handled
    if [ "${KEEP_WORK:-}" = all ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne "$SYSTEM_SKIP" ] && [ -n "${KEEP_WORK:-}" ]; }; then
      echo "kept $work"
    else
      rm -rf "$work"
    fi
  fi
  exit "$rc"
}
trap sys_cleanup EXIT
trap 'exit 130' INT TERM

# sys_alive PID: PID exists and is not a zombie (an orphan's zombie lingers
# until the init process of this machine gets round to reaping it).
sys_alive() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

# sys_kill_tree PID: stops PID and every descendant: SIGTERM to all of them,
# up to 5 s to go, then SIGKILL to whatever is left.
sys_kill_tree() {
  local pids=("$1") i=0 p alive
  while [ $i -lt ${#pids[@]} ]; do
    for p in $(ps -o pid= --ppid "${pids[$i]}" 2>/dev/null); do pids+=("$p"); done
    i=$((i + 1))
  done
  kill -TERM "${pids[@]}" 2>/dev/null || return 0
  for i in $(seq 50); do
    alive=0
    for p in "${pids[@]}"; do sys_alive "$p" && alive=1; done
    [ "$alive" -eq 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

# ---- the one line per connection (RDMASHIM_LOG=info) ----------------------
# "rdmashim[PID] info: fd N (client|server) -> TRANSPORT"
# sys_transports FILE SIDE [FROM_LINE]: one TRANSPORT per line, for the lines
# of SIDE (client|server) from line FROM_LINE (1-based, default 1) on.
sys_transports() {
  tail -n "+${3:-1}" "$1" | sed -n "s/^rdmashim\[[0-9]*\] info: fd [0-9]* ($2) -> \(.*\)\$/\1/p"
}

# sys_lines FILE: the number of lines of FILE now (0 if absent).
sys_lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }

# sys_expect_transports WHAT FILE SIDE FROM_LINE EXPECTED [COUNT]: every
# connection line of SIDE since FROM_LINE reports EXPECTED (shm, tcp:...;
# "a|b": either), there is at least one (exactly COUNT when given). Sets sys_failed=1 and
# says why otherwise; prints a summary either way.
sys_failed=0
sys_expect_transports() {
  local what=$1 file=$2 side=$3 from=$4 expected=$5 count=${6:-}
  local all n bad e alt pats=()
  all=$(sys_transports "$file" "$side" "$from")
  n=$(grep -c . <<<"$all" || true)
  IFS='|' read -ra alt <<<"$expected"
  for e in "${alt[@]}"; do pats+=(-e "$e"); done
  bad=$(grep -vxF "${pats[@]}" <<<"$all" | grep . | sort | uniq -c | tr -s ' ' | tr '\n' ';' || true)
  if [ "$n" -eq 0 ]; then
    echo "FAIL: $what: no $side connection line in $file (expected -> $expected)"; sys_failed=1
  elif [ -n "$bad" ]; then
    echo "FAIL: $what: $side connections not '$expected':$bad ($n in all)"; sys_failed=1
  elif [ -n "$count" ] && [ "$n" -ne "$count" ]; then
    echo "FAIL: $what: $n $side connection lines, expected $count"; sys_failed=1
  else
    echo "ok: $what: $n $side connection line(s), all -> $expected"
  fi
  # Echo the count for callers that compare client and server sides.
  sys_last_count=$n
}

# sys_no_warnings WHAT FILE [FROM_LINE]: rdmashim printed no warning/error.
sys_no_warnings() {
  local w
  w=$(tail -n "+${3:-1}" "$2" | grep -E '^rdmashim\[[0-9]+\] (warn|error)?:' || true)
  if [ -n "$w" ]; then echo "FAIL: $1: rdmashim warnings:"; echo "$w" | head -20; sys_failed=1; fi
}
