#!/usr/bin/env bash
# OpenSSH (Debian's openssh-server and openssh-client), unmodified, under
# rdmashim. sshd runs its pre-authentication child in a seccomp sandbox that
# allows read/write/ppoll and little else (sandbox-seccomp-filter.c): a
# connection upgraded to shared memory must keep working in there.
#
#   both         ssh and sshd under rdmashim: every connection on shm (both sides)
#   sshd-only    plain ssh -> sshd under rdmashim: the server says tcp:peer-plain
#                or tcp:server-spoke-first (ssh and sshd both send their banner
#                at once; whichever the server sees first names the reason)
#   ssh-only     ssh under rdmashim -> plain sshd: the client says tcp:not-advertised
#   none         neither (the reference)
#
# Each case uploads 20 MiB (cat FILE | ssh HOST sha256sum) and downloads it
# again (ssh HOST cat FILE | sha256sum), comparing SHA-256, and runs a short
# command; sshd (own config, host key and authorized key in a temp folder,
# no PAM, key authentication for root, the default seccomp sandbox) listens
# on a free loopback port. Every step is bounded by a timeout.
#
# usage: sshd.sh both|sshd-only|ssh-only|none
# env:   RDMASHIM_BUILD (the build folder), KEEP_WORK=1 keeps the temp folder
#        of a failed run. Exit 77 (skipped) when OpenSSH is missing and we may
#        not install it, or when not root (sshd needs it here).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

mode=${1:?usage: sshd.sh both|sshd-only|ssh-only|none}
case $mode in both|sshd-only|ssh-only|none) ;; *) echo "unknown case $mode"; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "SKIP: sshd with privilege separation needs root"; exit "$SYSTEM_SKIP"; }

sys_need_packages openssh-server openssh-client
sys_workdir
sys_install_shim
cd "$work"
mkdir -p /run/sshd && chmod 755 /run/sshd   # sshd's privilege-separation chroot

ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/user_key"
cp "$work/user_key.pub" "$work/authorized_keys"
chmod 600 "$work/authorized_keys"

server_shim=0 client_shim=0
case $mode in both) server_shim=1 client_shim=1 ;; sshd-only) server_shim=1 ;; ssh-only) client_shim=1 ;; esac

# rdmashim's lines of every process of a side (sshd re-executes itself and
# forks its sandboxed child; their stderr is not always ours) go to one file.
server_log=$work/server.rdmashim
client_log=$work/client.rdmashim
: >"$server_log"
: >"$client_log"

port=
for try in 1 2 3; do
  port=$(sys_free_port)
  cat >"$work/sshd_config" <<CONF
Port $port
ListenAddress 127.0.0.1
HostKey $work/host_key
PidFile none
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile $work/authorized_keys
StrictModes no
LogLevel VERBOSE
CONF
  launcher=()
  [ "$server_shim" -eq 1 ] && launcher=(env RDMASHIM_LOG=info RDMASHIM_LOG_FILE="$server_log" "$SHIM" run --log info --)
  timeout -k 5 300 "${launcher[@]}" /usr/sbin/sshd -D -e -f "$work/sshd_config" >"$work/sshd.out" 2>"$work/sshd.err" &
  pid=$!
  disown "$pid"
  sys_on_exit "sys_kill_tree $pid"
  sys_watch TERM "$pid"
  sys_wait_port "$port" 10 && break
  sys_kill_tree "$pid"
  port=
done
[ -n "$port" ] || { echo "FAIL: could not start sshd"; cat "$work/sshd.err"; exit 1; }

ssh_cmd() {  # REMOTE-COMMAND: ssh to the test sshd, under rdmashim when asked
  local launcher=()
  [ "$client_shim" -eq 1 ] && launcher=(env RDMASHIM_LOG=info RDMASHIM_LOG_FILE="$client_log" "$SHIM" run --log info --)
  timeout -k 5 60 "${launcher[@]}" ssh -F none -i "$work/user_key" -p "$port" -o BatchMode=yes \
    -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=20 \
    root@127.0.0.1 "$1" 2>>"$work/ssh.err"
}
sha() { sha256sum | cut -d' ' -f1; }
check() {  # what expected actual
  if [ "$2" = "$3" ]; then echo "ok: $1"; else echo "FAIL: $1: expected '$2', got '$3'"; sys_failed=1; fi
}

head -c $((20 << 20)) /dev/urandom >"$work/data"
want=$(sha <"$work/data")
start=$(date +%s.%N)
got=$(ssh_cmd 'echo hello from $(id -un)') || true
check "short command" "hello from root" "$got"
got=$(ssh_cmd sha256sum <"$work/data" | cut -d' ' -f1) || true
check "20 MiB upload (cat file | ssh sha256sum)" "$want" "$got"
got=$(ssh_cmd "cat $work/data" | sha) || true
check "20 MiB download (ssh cat file | sha256sum)" "$want" "$got"
echo "3 sessions in $(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo '?') s"

connections=3
case $mode in
  both)
    sys_expect_transports "ssh (rdmashim) -> sshd (rdmashim)" "$client_log" client 1 shm "$connections"
    sys_expect_transports "ssh (rdmashim) -> sshd (rdmashim)" "$server_log" server 1 shm "$connections" ;;
  sshd-only)
    # The client's SYN is unmarked, so sshd's banner is not held (syn_mark.h):
    # it goes at once, as the client's does. Which reaches the other first is
    # the scheduler's choice (a loaded machine delays the client's), and the
    # server logs peer-plain or server-spoke-first accordingly: TCP either way.
    sys_expect_transports "plain ssh -> sshd (rdmashim)" "$server_log" server 1 "tcp:peer-plain|tcp:server-spoke-first" "$connections" ;;
  ssh-only)
    sys_expect_transports "ssh (rdmashim) -> plain sshd" "$client_log" client 1 tcp:not-advertised "$connections" ;;
  none) ;;
esac
sys_no_warnings client "$client_log"
sys_no_warnings server "$server_log"
# A sandbox violation kills sshd's child with SIGSYS; sshd logs it.
if grep -qiE 'signal 31|SIGSYS|killed by signal' "$work/sshd.err"; then
  echo "FAIL: sshd reports a child killed by a signal:"; grep -iE 'signal' "$work/sshd.err" | head -5; sys_failed=1
fi

if [ "$sys_failed" -ne 0 ]; then
  echo "--- ssh stderr"; head -30 "$work/ssh.err"
  echo "--- sshd stderr"; tail -30 "$work/sshd.err"
  echo "--- rdmashim (server)"; head -30 "$server_log"
  echo "--- rdmashim (client)"; head -30 "$client_log"
  exit 1
fi
echo "PASS: sshd $mode"
