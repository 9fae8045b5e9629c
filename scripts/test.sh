#!/usr/bin/env bash
# The test command: installs what is missing, configures, builds and runs the whole test suite.
# With a CUDA compiler present the CUDA backend is built too (its [cuda] tests skip without a GPU).
# In CI (CI=true) a second, CPU-only build (-DSKA_CUDA=OFF) is configured, built and tested as well.
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

build_and_test() {  # build_and_test DIR [cmake args...]
  local dir=$1; shift
  echo "== configure $dir $*"
  cmake -S . -B "$dir" -G Ninja "${launcher[@]}" "$@" >"$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; return 1; }
  grep -E "^-- SKA" "$dir.configure.log" || true
  echo "== build $dir"
  cmake --build "$dir" -j "$jobs"
  echo "== test $dir"
  (cd "$dir" && ctest --output-on-failure -j "$jobs")
}

mkdir -p "${BUILD_DIR:-build}"
build_and_test "${BUILD_DIR:-build}" "${cuda_args[@]}"
if [ "${CI:-}" = "true" ]; then
  mkdir -p build-cpu
  build_and_test build-cpu -DSKA_CUDA=OFF
fi
