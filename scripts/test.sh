#!/usr/bin/env bash
# The test command: installs what is missing, configures, builds and runs the whole test suite.
# With a CUDA compiler present the CUDA backend is built too (its [cuda] tests skip without a GPU).
# In CI (CI=true) a second, CPU-only build without OpenCV (-DSKA_CUDA=OFF -DSKA_OPENCV=OFF, the
# configuration of a GPU machine without our packages: it must build and pass too) is configured,
# built and tested as well, then a third under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan), and each libFuzzer
# target runs for FUZZ_SECONDS (default 30; 0 skips the stage) with scripts/fuzz.sh. With the
# CUDA toolkit's headers present, CI also builds the CUDA backend for the host on the emulated
# device (-DSKA_CUDA_EMULATION=ON, build-emu; tests/emu) and runs its [cuda] tests there but the
# [slow] and [emu-slow] ones (EMU=0 skips the stage).
# Environment: BUILD_DIR (default build), SKA_CUDA=ON|OFF to force, CMAKE_CUDA_ARCHITECTURES,
# JOBS (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

jobs=${JOBS:-$(nproc)}
export CCACHE_NOHASHDIR=true CCACHE_BASEDIR=$PWD
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

# Find nvcc where the CUDA toolkit usually lives, so CMake's CUDA detection sees it.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

cuda_args=()
[ -n "${SKA_CUDA:-}" ] && cuda_args+=(-DSKA_CUDA="$SKA_CUDA")
if [ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ]; then
  cuda_args+=(-DCMAKE_CUDA_ARCHITECTURES="$CMAKE_CUDA_ARCHITECTURES")
elif [ "${CI:-}" = "true" ]; then
  cuda_args+=(-DCMAKE_CUDA_ARCHITECTURES=90)  # one architecture keeps CI fast; it only compiles
fi

build_and_test() {  # build_and_test DIR [cmake args...]; CTEST_ARGS: more ctest arguments
  local dir=$1; shift
  echo "== configure $dir $*"
  cmake -S . -B "$dir" -G Ninja "${launcher[@]}" "$@" >"$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; return 1; }
  grep -E "^-- SKA" "$dir.configure.log" || true
  echo "== build $dir"
  cmake --build "$dir" -j "$jobs" || return 1
  echo "== test $dir"
  (cd "$dir" && ctest --output-on-failure -j "$jobs" ${CTEST_ARGS:-})
}

# The whole suite under ASan + UBSan. Reports also go to files (log_path), so one printed by a
# child process whose exit status a test does not check still fails the run.
sanitizer_build_and_test() {
  local dir=build-asan reports=$PWD/build-asan/sanitizer-reports
  mkdir -p "$dir"
  rm -rf "$reports" && mkdir -p "$reports"
  export ASAN_OPTIONS="halt_on_error=1:detect_leaks=0:log_path=$reports/asan"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan"
  local status=0
  build_and_test "$dir" -DSKA_CUDA=OFF -DSKA_SANITIZE=address,undefined || status=$?
  unset ASAN_OPTIONS UBSAN_OPTIONS
  if compgen -G "$reports/*" >/dev/null; then
    echo "== sanitizer reports:"; cat "$reports"/*; return 1
  fi
  return "$status"
}

mkdir -p "${BUILD_DIR:-build}"
build_and_test "${BUILD_DIR:-build}" "${cuda_args[@]}"
if [ "${CI:-}" = "true" ]; then
  mkdir -p build-cpu
  build_and_test build-cpu -DSKA_CUDA=OFF -DSKA_OPENCV=OFF
  sanitizer_build_and_test
  cuda_inc=/usr/local/cuda/include
  if [ "${EMU:-1}" != 0 ] && [ -f $cuda_inc/cuda_runtime.h ] && [ -f $cuda_inc/cudnn.h ] &&
    [ -f $cuda_inc/nccl.h ]; then
    mkdir -p build-emu
    build_and_test build-emu -DSKA_CUDA=OFF -DSKA_CUDA_EMULATION=ON -DSKA_BUILD_BENCHMARKS=OFF
  fi
  if [ "${FUZZ_SECONDS:-30}" -gt 0 ]; then
    for target in $(scripts/fuzz.sh list); do
      FUZZ_TAIL=5 scripts/fuzz.sh "$target" "${FUZZ_SECONDS:-30}"
    done
  fi
fi
