#!/usr/bin/env bash
# sandboxed_stream under rdmashim: both sides must report ok after streaming
# 8 MiB each way inside a strict seccomp filter, and both connections must
# have taken shm (so RDMASHIM_TRANSPORT=tcp fails this test).
# usage: sandboxed_stream.sh blocking|poll
set -u
mode=${1:?usage: sandboxed_stream.sh blocking|poll}
b=${RDMASHIM_BUILD:?}
[ "$(uname -m)" = x86_64 ] || { echo "SKIP: the test filter is x86-64 only"; exit 77; }
out=$(timeout 60 env RDMASHIM_LOG=info "$b/bin/rdmashim" run -- "$b/bin/sandboxed_stream" "$mode" 2>&1)
rc=$?
echo "$out"
fail=0
grep -q '^server: ok$' <<<"$out" || { echo "FAIL: the server side did not finish (exit $rc; SIGSYS kills silently)"; fail=1; }
grep -q '^client: ok$' <<<"$out" || { echo "FAIL: the client side did not finish"; fail=1; }
grep -Eq '^rdmashim\[[0-9]+\] info: fd [0-9]+ \(client\) -> shm$' <<<"$out" || { echo "FAIL: the client connection is not on shm"; fail=1; }
grep -Eq '^rdmashim\[[0-9]+\] info: fd [0-9]+ \(server\) -> shm$' <<<"$out" || { echo "FAIL: the server connection is not on shm"; fail=1; }
[ "$fail" -eq 0 ] && echo "PASS: sandboxed_stream $mode"
exit "$fail"
