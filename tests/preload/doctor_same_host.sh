#!/usr/bin/env bash
# rdmashim doctor tells the truth about the same-host path: where it says
# ready, a connection between two local processes upgrades; where discovery
# cannot work (sock_diag made to fail: RDMASHIM_TEST_FAULT=sockdiag, the way
# a kernel without inet_diag answers) or no segment can be made
# (RDMASHIM_TEST_FAULT=memfd) it says so, and the connection indeed stays on
# TCP; RDMASHIM_TRANSPORT=tcp is reported as what keeps everything
# on TCP. Its verbs part is tested in a Soft-RoCE guest (softroce.doctor).
set -uo pipefail
bin=${RDMASHIM_BUILD:?set RDMASHIM_BUILD}/bin
fail() { echo "FAIL: $*"; exit 1; }
step() { grep -o "\"step\":\"$1\",\"ok\":[a-z]*" <<<"$2" | sed 's/.*://'; }
transport() { # the client's outcome for a local ping-pong under rdmashim
	"$bin/rdmashim" run --log info -- "$bin/tcpPingPong" --local --iters 200 2>&1 >/dev/null |
		sed -n 's/.*(client) -> \([a-z:-]*\).*/\1/p' | head -n 1
}

out=$("$bin/rdmashim" doctor --json --timeout 5)
echo "$out"
grep -q '"same_host":true' <<<"$out" || fail "doctor: same host not ready here"
[ "$(step shm-memfd "$out")" = true ] && [ "$(step shm-discovery "$out")" = true ] || fail "a same-host step failed"
[ "$(transport)" = shm ] || fail "doctor said ready, but the connection did not upgrade"

out=$(RDMASHIM_TEST_FAULT=sockdiag "$bin/rdmashim" doctor --json --timeout 5)
grep -q '"same_host":false' <<<"$out" || fail "doctor missed a sock_diag that does not answer: $out"
[ "$(step shm-discovery "$out")" = false ] || fail "shm-discovery not the failing step: $out"
got=$(RDMASHIM_TEST_FAULT=sockdiag transport)
[ "$got" = tcp:not-advertised ] || fail "with sock_diag failing the connection went $got"

out=$(RDMASHIM_TEST_FAULT=memfd "$bin/rdmashim" doctor --json --timeout 5)
grep -q '"same_host":false' <<<"$out" || fail "doctor missed a segment that cannot be made: $out"
[ "$(step shm-memfd "$out")" = false ] || fail "shm-memfd not the failing step: $out"
got=$(RDMASHIM_TEST_FAULT=memfd transport)
[ "$got" = tcp:setup-failed ] || fail "with memfd failing the connection went $got"

out=$(RDMASHIM_TRANSPORT=tcp "$bin/rdmashim" doctor --timeout 5)
grep -q '^FAIL  settings RDMASHIM_TRANSPORT=tcp' <<<"$out" || fail "RDMASHIM_TRANSPORT=tcp not reported: $out"
grep -q '^same host: not ready' <<<"$out" || fail "RDMASHIM_TRANSPORT=tcp still called ready: $out"
echo "ok: doctor's same-host verdict matches what a local connection does (shm; tcp:not-advertised without sock_diag; tcp:setup-failed without a segment)"
