# shellcheck shell=bash
# Shared by the host-side Soft-RoCE tests and bench/softroce.sh. Source it.
#   softroce_skip_unless_vm    exit 77 with vm check's reason when no guest can run
#   softroce_stage             copy the build's tools and tests/softroce/guest/
#                              to a folder the guest can see; sets STAGE
# The guest mounts the host's / read-only but has its own /tmp, so a build in
# /tmp (as CI may use) would be invisible: always stage under /var/tmp.

SOFTROCE_DIR=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
VM=$SOFTROCE_DIR/vm

softroce_skip_unless_vm() {
	local reason st=0
	reason=$("$VM" check) || st=$?
	if ((st != 0)); then
		printf '%s\n' "$reason"
		exit 77
	fi
}

softroce_stage() {
	local build=${RDMASHIM_BUILD:?set RDMASHIM_BUILD to the build folder} t
	STAGE=$(mktemp -d /var/tmp/rdmashim-softroce.XXXXXX)
	# shellcheck disable=SC2064 # expand now: the path is fixed
	trap "rm -rf '$STAGE'" EXIT
	mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/guest"
	for t in rdmashim tcpPingPong rdmaPingPong forkingPingPong rdma_send rdma_recv matrix_peer; do
		[[ -x $build/bin/$t ]] || { echo "FAIL: $build/bin/$t missing (build first)"; exit 1; }
		install -m 755 "$build/bin/$t" "$STAGE/bin/$t"
	done
	# `rdmashim run` looks for the library in ../lib next to itself.
	install -m 644 "$build/lib/librdmashim.so" "$STAGE/lib/librdmashim.so"
	install -m 755 "$SOFTROCE_DIR"/guest/*.sh "$SOFTROCE_DIR"/guest/*.py "$STAGE/guest/"
	install -m 755 "$SOFTROCE_DIR/../buffering/peers.py" "$STAGE/guest/peers.py"
	install -m 755 "$SOFTROCE_DIR/../preload/speaks_first.py" "$STAGE/guest/speaks_first.py"
	chmod 755 "$STAGE"
}

# Lines the guest scripts print as "@ KEY k=v ... json={...}"; vm run2
# prefixes them with "[a] " or "[b] ". result OUT KEY -> the line's tail.
result() { sed -n "s/^\(\[[ab]\] \)\{0,1\}@ $2 //p" <<<"$1" | tail -n 1; }
# kv LINE NAME -> value of NAME=... (up to the next space; json= takes the rest)
kv() {
	if [[ $2 == json ]]; then sed -n 's/.*json=//p' <<<"$1"; else sed -n "s/.*\(^\| \)$2=\([^ ]*\).*/\2/p" <<<"$1"; fi
}
# jf JSON FIELD -> a number or a hex/plain string field of a one-line JSON object
jf() { sed -n "s/.*\"$2\":\"\{0,1\}\([^\",}]*\)\"\{0,1\}.*/\1/p" <<<"$1"; }

# The host side's verdict: check NAME OK(0|1) DETAIL prints "ok:" or "FAIL:"
# and remembers a failure; finish NAME ends the test with it.
fail=0
check() {
	if [[ $2 == 1 ]]; then echo "ok:   $1 ($3)"; else echo "FAIL: $1 ($3)"; fail=1; fi
}
yes_if() { if "$@"; then echo 1; else echo 0; fi; }
finish() {
	if ((fail)); then
		echo "$1: FAILED"
		exit 1
	fi
	echo "$1: OK"
}
# run_both CMD TIMEOUT: both guests run CMD (vm run2); $out is what they
# printed, shown here indented, $st vm's exit status (not 0: a failed check).
run_both() {
	st=0
	out=$("$VM" run2 --timeout "$2" -- "$1" -- "$1" 2>&1) || st=$?
	printf '%s\n' "$out" | sed 's/^/  | /'
	((st == 0)) || check "guests ran" 0 "vm run2 exited $st"
}
# lines KEY -> the tail of every "@ KEY" line in $out (result: the last one).
lines() { sed -n "s/^\(\[[ab]\] \)\{0,1\}@ $1 //p" <<<"$out"; }

# cqs_for N -> the completion queues a process's N verbs links use
# (core/verbs/shared_cq.h): the first 8 a CQ each, the rest shared, the
# first shared CQ serving 8 links, each next one twice as many, up to 64
# (rxe's max_cqe of 32,768 over 512 per link).
cqs_for() {
	local n=$1 c=0 cap=8
	if ((n <= 8)); then echo "$n"; return; fi
	n=$((n - 8)) c=8
	while ((n > 0)); do
		n=$((n - cap)) c=$((c + 1))
		if ((cap < 64)); then cap=$((cap * 2)); fi
	done
	echo "$c"
}
