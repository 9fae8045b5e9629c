#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds with CUDA, runs every [cuda]-tagged test, runs them again
# under compute-sanitizer memcheck, and prints a one-screen summary. Logs go to $LOG_DIR (default
# build-gpu/logs; $OUT when set). Dependencies missing on that machine can be carried as unpacked
# .deb files in .deps/root (see README, "GPU check"). MEMCHECK=0 skips the sanitizer passes
# (memcheck over every [cuda] test; racecheck and synccheck over the kernels with shared memory
# and block barriers: the optimizer, softmax, norm, reduction, attention and StarReLU tests);
# MEMCHECK_TIMEOUT (seconds, default 1800) bounds each. It ends with `benchmark --profile` of
# CSKA-ViT-S (bf16, batch 512).
set -uo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build-gpu}
logs=${LOG_DIR:-${OUT:-$build/logs}}
mkdir -p "$build" "$logs"

BUILD_DIR=$build LOG_DIR=$logs scripts/gpu_build.sh || exit 1
. scripts/gpu_env.sh  # the same environment for the programs

tests=$build/tests/ska_tests
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'

echo "== [cuda] tests"
"$tests" "[cuda]" >"$logs/cuda_tests.log" 2>&1
tests_rc=$?
# [oom] asks cudaMalloc for more than the GPU has on purpose: memcheck would count those as errors.
# [slow] (the whole zoo at full size) would take memcheck far longer than it has.
# memcheck sees the bounds of each cudaMalloc: with whole blocks, an access past a tensor's end
# is caught (past its block's rounding), where blocks cut from shared segments would hide it.
echo "== [cuda] tests under compute-sanitizer memcheck (without [oom] and [slow]; whole blocks)"
sanitizer_rc=-1
if [ "${MEMCHECK:-1}" != 0 ] && command -v compute-sanitizer >/dev/null; then
  SKA_CUDA_ALLOCATOR=whole_blocks timeout "${MEMCHECK_TIMEOUT:-1800}" compute-sanitizer --tool memcheck --leak-check no --error-exitcode 99 "$tests" "[cuda]~[oom]~[slow]" \
    >"$logs/memcheck.log" 2>&1
  sanitizer_rc=$?
fi

# RACECHECK_TESTS="[cuda]" runs them over every [cuda] test (racecheck is 10-100x slower).
block_tests=${RACECHECK_TESTS:-"[cuda][optim],CUDA softmax matches the CPU,cuda softmax*,\
CUDA norms match the CPU,cuda layer norm*,CUDA reductions match the CPU,cuda attention*,\
fused attention: CUDA*,CUDA column reductions*,CUDA pointwise ops match the CPU,\
scaled_residual on CUDA*,cuda conv logits: the kernels repeat*,cuda conv logits: grad_w by filter rows*"}
racecheck_rc=-1
synccheck_rc=-1
if [ "${MEMCHECK:-1}" != 0 ] && command -v compute-sanitizer >/dev/null; then
  echo "== racecheck and synccheck over the block-level kernels"
  timeout "${MEMCHECK_TIMEOUT:-1800}" compute-sanitizer --tool racecheck --error-exitcode 99 \
    "$tests" "$block_tests" >"$logs/racecheck.log" 2>&1
  racecheck_rc=$?
  timeout "${MEMCHECK_TIMEOUT:-1800}" compute-sanitizer --tool synccheck --error-exitcode 99 \
    "$tests" "$block_tests" >"$logs/synccheck.log" 2>&1
  synccheck_rc=$?
fi

# NCCL across processes: two workers on this machine's GPUs (on a single GPU both share it, which
# NCCL may refuse; the log says what happened).
echo "== NCCL: benchmark_comm with 2 processes"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
timeout 300 "$build/apps/benchmark_comm" --nproc-per-node 2 --device cuda --max 256M \
  >"$logs/nccl_comm.log" 2>&1
nccl_rc=$?

echo "== benchmark --profile: CSKA-ViT-S, bf16, batch 512"
timeout 300 "$build/apps/benchmark" --config cifar10_cska_vit --device cuda --precision bf16 \
  --batch 512 --warmup 5 --iters 10 --profile >"$logs/profile_cska_vit.log" 2>&1
profile_rc=$?

echo
echo "================ gpu_check summary ================"
echo "[cuda] tests:      $(grep -E '^(All tests passed|test cases:)' "$logs/cuda_tests.log" | tail -1) (exit $tests_rc)"
grep -E "FAILED|skipped" "$logs/cuda_tests.log" | sort | uniq -c | head -15
if [ "$sanitizer_rc" = -1 ]; then
  echo "compute-sanitizer: not run (MEMCHECK=0 or not found)"
else
  echo "memcheck:          $(grep -E 'ERROR SUMMARY' "$logs/memcheck.log" | tail -1) (exit $sanitizer_rc)"
fi
if [ "$racecheck_rc" != -1 ]; then
  echo "racecheck:         $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$logs/racecheck.log" | tail -1) (exit $racecheck_rc)"
  echo "synccheck:         $(grep -E 'ERROR SUMMARY' "$logs/synccheck.log" | tail -1) (exit $synccheck_rc)"
fi
echo "NCCL, 2 processes on $ngpu GPU(s): exit $nccl_rc ($(tail -1 "$logs/nccl_comm.log"))"
echo "profile (exit $profile_rc): $(grep -E '^profile:' "$logs/profile_cska_vit.log")"
echo "logs:              $logs"
sanitizers_ok() { for rc in "$@"; do [ "$rc" = 0 ] || [ "$rc" = -1 ] || return 1; done; }
[ "$tests_rc" = 0 ] && sanitizers_ok "$sanitizer_rc" "$racecheck_rc" "$synccheck_rc"
