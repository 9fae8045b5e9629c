#!/usr/bin/env bash
# The GPU time of every kernel in our training step, from Nsight Compute: each kernel's own
# duration on the device (gpu__time_duration), which `benchmark --profile`'s CUDA events cannot
# separate from the host's launch gaps when the GPU waits for the host. For each CONFIG[:BATCH]:
# the step timed without ncu (its wall-clock milliseconds), then ITERS steps recorded by
# `ncu --profile-from-start off` (benchmark --capture-range marks them), summed per kernel by
# scripts/ncu_kernels.py: launches and microseconds per step, the share of the GPU time, and how
# much of the wall-clock step the GPU was busy (the rest is launch overhead: a CUDA Graph's case).
# With DRAM=1 (the default) ncu also counts each kernel's DRAM bytes (a second replay pass), and
# the table adds the bandwidth each kernel reached, its share of the GPU's peak (PEAK_GBS, else
# from nvidia-smi's name: H100 SXM 3350, H100 PCIe 2000, H200 4800, A100 2039/1555 GB/s) and the
# microseconds it spends beyond moving its bytes at that peak: where a step's time is lost.
# Usage: scripts/gpu_kernels.sh [CONFIG[:BATCH] ...]
#   default: cifar10_vit_s:512 cifar10_cska_vit:512 imagenet_caformer_s18:128
#            imagenet_cskaformer_s18:128
# Environment: BUILD_DIR (default build-gpu), MODE (train|infer, default train), ITERS (recorded
# steps, default 1), TOP (kernels listed, default 30), NCU (default ncu), DRAM (1 or 0), PEAK_GBS,
# EXTRA (more benchmark
# flags, e.g. "--attention-backward one_block"). Logs, CSV and JSON go to $OUT (or
# BUILD_DIR/logs).
set -uo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build-gpu}
mode=${MODE:-train}
iters=${ITERS:-1}
top=${TOP:-30}
ncu=${NCU:-ncu}
logs=${OUT:-$build/logs}
mkdir -p "$logs"
bench=$build/apps/benchmark
[ -x "$bench" ] || { echo "gpu_kernels: $bench not found (scripts/gpu_check.sh builds it)" >&2; exit 1; }
command -v "$ncu" >/dev/null || { echo "gpu_kernels: $ncu not found (Nsight Compute)" >&2; exit 1; }
[ $# -gt 0 ] || set -- cifar10_vit_s:512 cifar10_cska_vit:512 imagenet_caformer_s18:128 \
  imagenet_cskaformer_s18:128
read -r -a extra <<<"${EXTRA:-}"
metrics=gpu__time_duration.sum
[ "${DRAM:-1}" = 1 ] && metrics+=,dram__bytes_read.sum,dram__bytes_write.sum
peak=${PEAK_GBS:-}
if [ -z "$peak" ]; then
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) peak=4800 ;;
    *H100*PCIe*) peak=2000 ;;
    *H100*) peak=3350 ;;
    *A100*80GB*) peak=2039 ;;
    *A100*) peak=1555 ;;
    *) peak=0 ;;
  esac
fi

status=0
for item in "$@"; do
  config=${item%%:*}
  batch=${item#*:}
  [ "$batch" = "$item" ] && batch=128
  common=(--config "$config" --device cuda --precision bf16 --batch "$batch" --mode "$mode"
          "${extra[@]}")
  echo "== $config, batch $batch, $mode ${extra[*]}"
  wall_ms=0
  if "$bench" "${common[@]}" --iters 10 --json >"$logs/kernels_$config.json" \
       2>"$logs/kernels_$config.err"; then
    wall_ms=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["median_ms"])' \
      "$logs/kernels_$config.json")
  else
    tail -3 "$logs/kernels_$config.err"
  fi
  # The duration in the first pass per kernel; caches and clocks as in a normal run.
  if ! "$ncu" --profile-from-start off --metrics "$metrics" --csv \
       --print-units base --cache-control none --clock-control none \
       --log-file "$logs/ncu_$config.csv" \
       "$bench" "${common[@]}" --warmup 3 --iters "$iters" --capture-range \
       >"$logs/ncu_$config.out" 2>&1; then
    echo "gpu_kernels: ncu failed for $config:"
    for f in "$logs/ncu_$config.out" "$logs/ncu_$config.csv"; do [ -f "$f" ] && tail -5 "$f"; done
    status=1
    continue
  fi
  python3 scripts/ncu_kernels.py "$logs/ncu_$config.csv" --steps "$iters" --top "$top" \
    --wall-ms "$wall_ms" --peak-gbs "$peak" --json "$logs/kernels_${config}_ncu.json" || status=1
done
exit $status
