# shellcheck shell=bash
# A throwaway local user for tests of what another user on the host can do
# (squat discovery names, flood rendezvous sockets). Created with useradd
# when root (removed on exit); without root the test is skipped (exit 77).
ATTACKER=rdmashim-attacker
attacker_created=0

attacker_setup() {
  if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root to create the throwaway user $ATTACKER"; exit 77; fi
  command -v useradd >/dev/null && command -v setpriv >/dev/null || {
    echo "SKIP: useradd or setpriv missing"; exit 77; }
  [ -x /usr/bin/python3 ] || { echo "SKIP: /usr/bin/python3 missing"; exit 77; }
  if ! id "$ATTACKER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$ATTACKER"
    attacker_created=1
  fi
}

attacker_cleanup() {
  # Its processes were ended by their pids; wait for them to be gone.
  for _ in $(seq 50); do pgrep -u "$ATTACKER" >/dev/null || break; sleep 0.1; done
  if [ "$attacker_created" = 1 ]; then userdel "$ATTACKER" 2>/dev/null || true; fi
}

# Prefix that runs a command as the attacker (no groups, no capabilities).
# An array, not a function, so that `"${AS_ATTACKER[@]}" CMD &` leaves the
# command itself in $! (setpriv execs it), for the test to end by its pid.
AS_ATTACKER=(setpriv --reuid="$ATTACKER" --regid="$ATTACKER" --clear-groups --inh-caps=-all --)
