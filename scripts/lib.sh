# Shared by scripts/test, scripts/demo and the bench scripts: install what is
# missing (Debian packages), configure and build. Source it; do not run it.

RDMASHIM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RDMASHIM_BUILD=${RDMASHIM_BUILD:-$RDMASHIM_ROOT/build}

# Packages for building and testing. Each script adds its own extras.
RDMASHIM_BUILD_PACKAGES=(g++ cmake make pkg-config libgtest-dev libibverbs-dev librdmacm-dev libxxhash-dev
                         ibverbs-providers libboost-dev libbenchmark-dev python3-matplotlib)
# The sanitizer and fuzz stages of scripts/test (CMakePresets.json): ninja for
# building single targets, clang and its runtimes for libFuzzer.
RDMASHIM_SANITIZER_PACKAGES=(ninja-build clang libclang-rt-14-dev)

# ensure_packages PKG... : installs the missing ones with apt-get when root,
# otherwise says exactly what to install and fails.
ensure_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "rdmashim: missing Debian packages: ${missing[*]}" >&2
    echo "rdmashim: install them with: sudo apt-get install ${missing[*]}" >&2
    return 1
  fi
  echo "rdmashim: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # An old or absent package list is refreshed once, then the install retried.
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
}

build_project() {
  cmake -S "$RDMASHIM_ROOT" -B "$RDMASHIM_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$RDMASHIM_BUILD" -j "$(nproc)" >/dev/null 2>"$RDMASHIM_BUILD.log" || {
    cat "$RDMASHIM_BUILD.log" >&2
    return 1
  }
}

# preset_stage PRESET [CMAKE_ARG...]: configures, builds and tests one
# CMakePresets.json preset (asan, tsan, fuzz): its folder (build-PRESET in
# the source tree), its build targets, its test labels and sanitizer options.
preset_configure() {
  local preset=$1
  shift
  (cd "$RDMASHIM_ROOT" && cmake --preset "$preset" "$@" >/dev/null)
}
preset_build() {
  local log=$RDMASHIM_ROOT/build-$1/build.log
  (cd "$RDMASHIM_ROOT" && cmake --build --preset "$1" -j "$(nproc)" >"$log" 2>&1) || {
    cat "$log" >&2
    return 1
  }
}
preset_test() {
  (cd "$RDMASHIM_ROOT" && ctest --preset "$1")
}
