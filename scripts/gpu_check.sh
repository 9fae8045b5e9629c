#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds with CUDA, runs every [cuda]-tagged test, runs them again
# under compute-sanitizer memcheck, and prints a one-screen summary. Logs go to $LOG_DIR (default
# build-gpu/logs; $OUT when set). Dependencies missing on that machine can be carried as unpacked
# .deb files in .deps/root (see README, "GPU check").
set -uo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build-gpu}
logs=${LOG_DIR:-${OUT:-$build/logs}}
mkdir -p "$build" "$logs"

# Carried Debian packages (../shared/tools/device-deps.sh .deps).
if [ -d .deps/root/usr ]; then
  D=$PWD/.deps/root/usr
  export CMAKE_PREFIX_PATH=$D:$D/lib/x86_64-linux-gnu/cmake:$D/share/cmake:$D/lib/cmake:${CMAKE_PREFIX_PATH:-}
  export LD_LIBRARY_PATH=$D/lib/x86_64-linux-gnu:$D/lib/x86_64-linux-gnu/openblas-pthread:${LD_LIBRARY_PATH:-}
  export CPATH=$D/include:${CPATH:-}
fi
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH

# cuDNN: beside the toolkit, or from PyTorch's Python wheels (nvidia-cudnn).
cudnn_args=()
if [ ! -f /usr/local/cuda/include/cudnn.h ] && [ -z "${CUDNN_ROOT:-}" ]; then
  CUDNN_ROOT=$(python3 -c "import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))" 2>/dev/null || true)
fi
if [ -n "${CUDNN_ROOT:-}" ]; then
  cudnn_args+=(-DCUDNN_ROOT="$CUDNN_ROOT")
  export LD_LIBRARY_PATH=$CUDNN_ROOT/lib:${LD_LIBRARY_PATH:-}
  # The wheel ships libcudnn.so.9 only; give the linker the unversioned name.
  [ -e "$CUDNN_ROOT/lib/libcudnn.so" ] || ln -sf libcudnn.so.9 "$CUDNN_ROOT/lib/libcudnn.so" 2>/dev/null || true
fi

arch=${CMAKE_CUDA_ARCHITECTURES:-native}
echo "== configure ($build, CUDA architectures $arch)"
if ! cmake -S . -B "$build" -G Ninja -DSKA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
     "${cudnn_args[@]}" >"$logs/configure.log" 2>&1; then
  tail -30 "$logs/configure.log"; echo "gpu_check: configure FAILED"; exit 1
fi
echo "== build"
if ! cmake --build "$build" -j "$(nproc)" >"$logs/build.log" 2>&1; then
  grep -E "error|FAILED" "$logs/build.log" | head -40; echo "gpu_check: build FAILED"; exit 1
fi

tests=$build/tests/ska_tests
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'

echo "== [cuda] tests"
"$tests" "[cuda]" >"$logs/cuda_tests.log" 2>&1
tests_rc=$?
echo "== [cuda] tests under compute-sanitizer memcheck"
sanitizer_rc=-1
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --leak-check no --error-exitcode 99 "$tests" "[cuda]" \
    >"$logs/memcheck.log" 2>&1
  sanitizer_rc=$?
fi

echo
echo "================ gpu_check summary ================"
echo "[cuda] tests:      $(grep -E '^(All tests passed|test cases:)' "$logs/cuda_tests.log" | tail -1) (exit $tests_rc)"
grep -E "FAILED|skipped" "$logs/cuda_tests.log" | sort | uniq -c | head -15
if [ "$sanitizer_rc" = -1 ]; then
  echo "compute-sanitizer: not found"
else
  echo "memcheck:          $(grep -E 'ERROR SUMMARY' "$logs/memcheck.log" | tail -1) (exit $sanitizer_rc)"
fi
echo "logs:              $logs"
[ "$tests_rc" = 0 ] && { [ "$sanitizer_rc" = 0 ] || [ "$sanitizer_rc" = -1 ]; }
