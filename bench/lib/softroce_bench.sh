# Sourced first by the Soft-RoCE benches (bench/softroce*.sh): the test
# suite's guest helpers (tests/softroce/lib.sh: result, kv, jf, $VM), their
# options and how they print.
# shellcheck shell=bash
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../../tests/softroce/lib.sh"
export RDMASHIM_BUILD

json=no json_file=""
# bench_opts USAGE SPEC... -- ARGS...: every bench takes --json [FILE]
# (json, json_file); a SPEC NAME takes --NAME VALUE into $NAME (dashes made
# underscores); NAME:VAR=VALUE is a flag --NAME that sets VAR to VALUE.
bench_opts() {
	local usage=$1 specs=() spec
	shift
	while [[ $1 != -- ]]; do specs+=("$1"); shift; done
	shift
	while (($#)); do
		if [[ $1 == --json ]]; then
			json=yes
			if [[ -n ${2:-} && $2 != -* ]]; then json_file=$2; shift; fi
			shift
			continue
		fi
		for spec in "${specs[@]}"; do
			if [[ $spec == *:* && $1 == "--${spec%%:*}" ]]; then
				spec=${spec#*:}
				printf -v "${spec%%=*}" '%s' "${spec#*=}"
				shift
				continue 2
			elif [[ $spec != *:* && $1 == "--$spec" && $# -ge 2 ]]; then
				printf -v "${spec//-/_}" '%s' "$2"
				shift 2
				continue 2
			fi
		done
		echo "usage: $usage" >&2
		exit 2
	done
}

# emit_results: --json alone prints the JSON (to_json), else the table
# (table), and --json FILE also writes the JSON there.
emit_results() {
	if [[ $json == yes && -z $json_file ]]; then
		to_json
	else
		table
		if [[ -n $json_file ]]; then to_json >"$json_file"; fi
	fi
}
