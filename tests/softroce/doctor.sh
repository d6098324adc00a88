#!/usr/bin/env bash
# rdmashim doctor inside a Soft-RoCE guest: every step passes on rxe0.
set -euo pipefail
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
bin=${RDMASHIM_BUILD:?set RDMASHIM_BUILD}/bin
reason=$("$here/vm" check) || { echo "$reason"; exit 77; }
# The guest sees the host's files read-only, except /tmp, /run and /dev/shm,
# which are its own: stage the binary where the guest can see it.
stage=$(mktemp -d /var/tmp/rdmashim-doctor.XXXXXX)
trap 'rm -rf "$stage"' EXIT
install -m 755 "$bin/rdmashim" "$stage/rdmashim"
out=$("$here/vm" run1 --timeout 180 -- "$stage/rdmashim doctor --json")
echo "$out"
grep -q '"ok":true' <<<"$out" || { echo "FAIL: doctor did not report ready"; exit 1; }
grep -q '"step":"write","ok":true' <<<"$out" || { echo "FAIL: loopback write did not complete"; exit 1; }
# rxe0 is software: across hosts auto keeps TCP, and doctor says so (core/verbs/policy.h).
grep -q '"step":"policy","ok":true,"detail":"rxe0 is a software RDMA device ([^"]*vendor 0xffffff[^"]*connections to other hosts stay on TCP' <<<"$out" ||
	{ echo "FAIL: doctor did not say that rxe0 keeps connections to other hosts on TCP"; exit 1; }
echo "ok: rdmashim doctor ready on rxe0"
