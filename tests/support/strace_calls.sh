#!/usr/bin/env bash
# Runs CMD under `strace -f -c` and prints the total number of system calls
# of all its processes (the summary's "total" row; its columns differ when
# there were no errors). Exit 77 (skip) if strace is missing and cannot be
# installed; CMD's stdout and exit status are discarded. -o keeps strace's summary there.
#
# usage: strace_calls.sh [-o SUMMARY] -- CMD...
set -euo pipefail
out=
[ "${1:-}" = -o ] && { out=$2; shift 2; }
[ "${1:-}" = -- ] && shift
source "$(dirname "$0")/../../scripts/lib.sh"
command -v strace >/dev/null || ensure_packages strace >/dev/null 2>&1 ||
  { echo "SKIP: strace is missing and cannot be installed" >&2; exit 77; }
if [ -z "$out" ]; then
  out=$(mktemp)
  trap 'rm -f "$out"' EXIT
fi
# CMD's own status is not ours to judge: under ptrace a sanitizer's leak
# check fails at exit (ASan builds), and the count is what is asked for.
strace -f -c -o "$out" "$@" >/dev/null || true
awk '/^-+/ { sep++; next } sep == 2 && $NF == "total" { print $(NF-2) ~ /^[0-9]+$/ && $(NF-1) ~ /^[0-9]+$/ ? $(NF-2) : $(NF-1) }' "$out"
