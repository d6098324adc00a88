#!/usr/bin/env bash
# Runs a command under the descriptor limits most users have: a soft limit of
# 1024 (or N) below a hard one far above it (systemd's is 524288). There
# rdmashim keeps its own descriptors above the soft limit (util/fd_budget.h)
# and reuses its probe and sock_diag sockets (util/reused_socket.h); where the
# soft limit equals the hard one (many containers, some CI machines) they go
# into the top sixteenth instead, and every other test covers that.
# Skipped (77) if the hard limit leaves no room above N.
#
# usage: soft_limit.sh [N] -- CMD...
set -euo pipefail
n=1024
[ "$1" != -- ] && { n=$1; shift; }
[ "$1" = -- ] && shift
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -le "$n" ]; then
  echo "SKIP: the hard descriptor limit ($hard) leaves no room above a soft limit of $n"
  exit 77
fi
ulimit -Sn "$n"
exec "$@"
