#!/usr/bin/env bash
# The soak (see README.md beside this file): run.sh [--minutes M] [--conns N] [--seed X]
# The build folder: RDMASHIM_BUILD, else build/ in the source tree.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${RDMASHIM_BUILD:-$here/../../build}
[ -x "$build/bin/soak_peer" ] || { echo "tests/soak: build first (soak_peer missing in $build/bin)" >&2; exit 1; }
exec python3 "$here/soak.py" "$build" "$@"
