#!/usr/bin/env bash
# On a GPU machine: configures and builds the CUDA build (BUILD_DIR, default build-gpu) with the
# carried Debian packages and the cuDNN/NCCL of PyTorch's wheels (scripts/gpu_env.sh), for the
# GPU there (CMAKE_CUDA_ARCHITECTURES, default native). TARGETS (space-separated) builds only
# those; logs (configure.log, build.log) go to LOG_DIR (default BUILD_DIR/logs). Used by
# scripts/gpu_check.sh and scripts/gpu_session.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-gpu}
logs=${LOG_DIR:-$build/logs}
mkdir -p "$build" "$logs"

. scripts/gpu_env.sh  # carried Debian packages, cuDNN/NCCL from the Python wheels
cudnn_args=()
[ -n "${CUDNN_ROOT:-}" ] && cudnn_args+=(-DCUDNN_ROOT="$CUDNN_ROOT")

# No OpenCV there (no package registry): build without image decoding; binary datasets still work.
opencv_args=()
if [ ! -d /usr/include/opencv4 ] && [ ! -d "${D:-/nonexistent}/include/opencv4" ]; then
  opencv_args+=(-DSKA_OPENCV=OFF)
fi

arch=${CMAKE_CUDA_ARCHITECTURES:-native}
echo "== configure ($build, CUDA architectures $arch)"
if ! cmake -S . -B "$build" -G Ninja -DSKA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
     "${cudnn_args[@]}" "${opencv_args[@]}" >"$logs/configure.log" 2>&1; then
  tail -30 "$logs/configure.log"; echo "gpu_build: configure FAILED"; exit 1
fi
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
echo "== build ${TARGETS:-(everything)}"
if ! cmake --build "$build" -j "$(nproc)" "${targets[@]}" -- -k 0 >"$logs/build.log" 2>&1; then
  grep -E "error|FAILED" "$logs/build.log" | head -60; echo "gpu_build: build FAILED"; exit 1
fi
