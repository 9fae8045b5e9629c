#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds with CUDA, runs every [cuda]-tagged test, runs them again
# under compute-sanitizer memcheck, and prints a one-screen summary. Logs go to $LOG_DIR (default
# build-gpu/logs; $OUT when set). Dependencies missing on that machine can be carried as unpacked
# .deb files in .deps/root (see README, "GPU check"). MEMCHECK=0 skips the sanitizer pass;
# MEMCHECK_TIMEOUT (seconds, default 1800) bounds it.
set -uo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build-gpu}
logs=${LOG_DIR:-${OUT:-$build/logs}}
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
  tail -30 "$logs/configure.log"; echo "gpu_check: configure FAILED"; exit 1
fi
echo "== build"
if ! cmake --build "$build" -j "$(nproc)" -- -k 0 >"$logs/build.log" 2>&1; then
  grep -E "error|FAILED" "$logs/build.log" | head -60; echo "gpu_check: build FAILED"; exit 1
fi

tests=$build/tests/ska_tests
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'

echo "== [cuda] tests"
"$tests" "[cuda]" >"$logs/cuda_tests.log" 2>&1
tests_rc=$?
# [oom] asks cudaMalloc for more than the GPU has on purpose: memcheck would count those as errors.
echo "== [cuda] tests under compute-sanitizer memcheck (without [oom])"
sanitizer_rc=-1
if [ "${MEMCHECK:-1}" != 0 ] && command -v compute-sanitizer >/dev/null; then
  timeout "${MEMCHECK_TIMEOUT:-1800}" compute-sanitizer --tool memcheck --leak-check no --error-exitcode 99 "$tests" "[cuda]~[oom]" \
    >"$logs/memcheck.log" 2>&1
  sanitizer_rc=$?
fi

# NCCL across processes: two workers on this machine's GPUs (on a single GPU both share it, which
# NCCL may refuse; the log says what happened).
echo "== NCCL: benchmark_comm with 2 processes"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
timeout 300 "$build/apps/benchmark_comm" --nproc-per-node 2 --device cuda --max 256M \
  >"$logs/nccl_comm.log" 2>&1
nccl_rc=$?

echo
echo "================ gpu_check summary ================"
echo "[cuda] tests:      $(grep -E '^(All tests passed|test cases:)' "$logs/cuda_tests.log" | tail -1) (exit $tests_rc)"
grep -E "FAILED|skipped" "$logs/cuda_tests.log" | sort | uniq -c | head -15
if [ "$sanitizer_rc" = -1 ]; then
  echo "compute-sanitizer: not run (MEMCHECK=0 or not found)"
else
  echo "memcheck:          $(grep -E 'ERROR SUMMARY' "$logs/memcheck.log" | tail -1) (exit $sanitizer_rc)"
fi
echo "NCCL, 2 processes on $ngpu GPU(s): exit $nccl_rc ($(tail -1 "$logs/nccl_comm.log"))"
echo "logs:              $logs"
[ "$tests_rc" = 0 ] && { [ "$sanitizer_rc" = 0 ] || [ "$sanitizer_rc" = -1 ]; }
