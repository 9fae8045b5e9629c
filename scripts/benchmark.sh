#!/usr/bin/env bash
# Runs apps/benchmark and its PyTorch twin (scripts/benchmark_models.py: the same model from our
# reference PyTorch models) on one config with the same batch, mode, device, warm-up, timed steps
# and thread count, checks that both have the same trainable parameter count and prints a
# side-by-side table: images/s, ms per step, peak memory (ours: the allocator's blocks, and the
# tensors' own bytes, which is what torch's max_memory_allocated counts), ratio (ours / torch), against eager
# PyTorch (SDPA attention where the model allows) and, where PyTorch has it, torch.compile; then
# each side's TFLOP/s (model FLOPs from our MAC counter) and, on a known GPU, MFU.
# Usage: scripts/benchmark.sh CONFIG [--device cpu|cuda] [--batch N] [--mode train|infer]
#            [--dtype f32|bf16] [--warmup N] [--iters N] [--compile auto|off]
#            [--cuda-graph on|off] [--cudnn-benchmark on|off] [--set key=value ...]
#   Without --mode both modes run. --dtype bf16 (CUDA) is our bf16 autocast (f32 weights, as
#   train.precision: bf16) against torch's bf16 autocast. --compile auto (default) adds the
#   torch.compile column when PyTorch has it. --cuda-graph on (CUDA; default off) times ours a
#   second time with the step replayed as one CUDA Graph (benchmark --cuda-graph, what
#   train.cuda_graph does) and adds its column. --cudnn-benchmark (default on, as timm's training
#   scripts set it) times cuDNN's convolution algorithms on both sides. Environment: BUILD_DIR
#   (default build), where benchmark was built; PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '9,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 1; }
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || usage
config=$1
shift
device=cpu batch=64 dtype=f32 warmup=3 iters=10 compile=auto cudnn_benchmark=on graph=off
modes=(train infer)
sets=()
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "benchmark.sh: $1 needs a value" >&2; usage; }
  case $1 in
    --device) device=$2 ;;
    --batch) batch=$2 ;;
    --mode) modes=("$2") ;;
    --dtype) dtype=$2 ;;
    --warmup) warmup=$2 ;;
    --iters) iters=$2 ;;
    --set) sets+=(--set "$2") ;;
    --compile) compile=$2 ;;
    --cuda-graph) graph=$2 ;;
    --cudnn-benchmark) cudnn_benchmark=$2 ;;
    *) echo "benchmark.sh: unknown argument '$1'" >&2; usage ;;
  esac
  shift 2
done

case $graph in
  on) [ "$device" = cuda ] || { echo "benchmark.sh: --cuda-graph on needs --device cuda" >&2; exit 1; } ;;
  off) ;;
  *) echo "benchmark.sh: --cuda-graph takes on or off, not '$graph'" >&2; exit 1 ;;
esac

bench=${BUILD_DIR:-build}/apps/benchmark
if [ ! -x "$bench" ]; then
  echo "benchmark.sh: $bench not found; build it first (cmake --build ${BUILD_DIR:-build})" >&2
  exit 1
fi

py=$(scripts/torch_python.sh) || exit 1
if [ "$compile" = auto ]; then
  "$py" -c 'import sys, torch; sys.exit(0 if hasattr(torch, "compile") else 1)' 2>/dev/null \
    && compile=on || compile=off
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# OpenMP's default thread count in our benchmark; torch gets the same.
threads=$("$py" -c 'import os
env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0]
print(int(env) if env.isdigit() and int(env) > 0 else len(os.sched_getaffinity(0)))')

common=(--config "$config" --batch "$batch" --device "$device" --warmup "$warmup" --iters "$iters"
        --cudnn-benchmark "$cudnn_benchmark" "${sets[@]}")
for mode in "${modes[@]}"; do
  # bf16: our autocast (train.precision: bf16, f32 weights) against torch.autocast.
  precision=fp32
  [ "$dtype" = bf16 ] && precision=bf16
  "$bench" "${common[@]}" --mode "$mode" --precision "$precision" --json >>"$tmp/ours.jsonl"
  # A step that cannot be captured costs the column, not the eager figures.
  if [ "$graph" = on ] && "$bench" "${common[@]}" --mode "$mode" --precision "$precision" \
      --cuda-graph --json >"$tmp/graph.json"; then
    cat "$tmp/graph.json" >>"$tmp/graph.jsonl"
  else
    [ "$graph" = on ] && echo "benchmark.sh: $mode as a CUDA Graph failed (above); no graph column" >&2
    echo '{}' >>"$tmp/graph.jsonl"
  fi
  "$py" scripts/benchmark_models.py "${common[@]}" --mode "$mode" --precision "$dtype" \
    --threads "$threads" --json >>"$tmp/torch.jsonl"
  if [ "$compile" = on ]; then
    "$py" scripts/benchmark_models.py "${common[@]}" --mode "$mode" --precision "$dtype" \
      --threads "$threads" --compile --json >>"$tmp/compiled.jsonl"
  else
    echo '{}' >>"$tmp/compiled.jsonl"
  fi
done

"$py" - "$tmp/ours.jsonl" "$tmp/torch.jsonl" "$threads" "$tmp/compiled.jsonl" "$tmp/graph.jsonl" <<'EOF'
import json, sys

ours = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
torch_rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
threads = sys.argv[3]
compiled = [json.loads(l) for l in open(sys.argv[4]) if l.strip()]
graphs = [json.loads(l) for l in open(sys.argv[5]) if l.strip()]

def mib(b):
    return f"{b / 2**20:9.1f}" if b else f"{'-':>9}"

first = ours[0]
print(f"# {first['config']}: {first['device']}, {first['precision']}, batch {first['batch']}, "
      f"{threads} CPU threads, torch {torch_rows[0]['torch']} (attention "
      f"{torch_rows[0].get('attention', 'math')}); ratio = ours / torch images/s (> 1: ours "
      f"faster); compile = torch.compile, default mode"
      + ("; graph = ours with the step replayed as one CUDA Graph" if any(graphs) else ""))
print(f"{'mode':<6} {'params ours':>12} {'params torch':>12} {'ours img/s':>11} "
      f"{'torch img/s':>11} {'ratio':>6} {'compile img/s':>13} {'ratio':>6} {'ours ms':>9} "
      f"{'torch ms':>9} {'ours MiB':>9} {'tensors':>9} {'torch MiB':>9}"
      + (f" {'graph img/s':>11} {'/torch':>6} {'/comp.':>6} {'graph ms':>9}" if any(graphs) else ""))
mismatch = False
for o, t, c, g in zip(ours, torch_rows, compiled, graphs):
    same = o["trainable_params"] == t["trainable_params"]
    mismatch |= not same
    c_ips = f"{c['images_per_s']:>13.1f}" if c else f"{'-':>13}"
    c_ratio = f"{o['images_per_s'] / c['images_per_s']:>6.2f}" if c else f"{'-':>6}"
    print(f"{o['mode']:<6} {o['trainable_params']:>12,} {t['trainable_params']:>12,} "
          f"{o['images_per_s']:>11.1f} {t['images_per_s']:>11.1f} "
          f"{o['images_per_s'] / t['images_per_s']:>6.2f} {c_ips} {c_ratio} {o['median_ms']:>9.1f} "
          f"{t['median_ms']:>9.1f} {mib(o['peak_bytes'])} {mib(o.get('peak_requested_bytes', 0))} "
          f"{mib(t['peak_bytes'])}"
          + (f" {g['images_per_s']:>11.1f} {g['images_per_s'] / t['images_per_s']:>6.2f} "
             + (f"{g['images_per_s'] / c['images_per_s']:>6.2f}" if c else f"{'-':>6}")
             + f" {g['median_ms']:>9.1f}" if g else "")
          + ("" if same else "  PARAMETER COUNTS DIFFER"))
# Model FLOPs from our MAC counter (the same model on both sides): achieved TFLOP/s and, on a GPU
# in the peak table (or with a known peak), MFU against its bf16 dense peak.
for o, t, c, g in zip(ours, torch_rows, compiled, graphs):
    per_image = o.get("gflops_per_image", 0.0)
    if not per_image:
        continue
    peak = o.get("peak_tflops", 0.0)
    def rate(ips):
        tf = per_image * ips * 1e-3
        return f"{tf:.2f} TFLOP/s" + (f" (MFU {100 * tf / peak:.1f}%)" if peak else "")
    line = (f"{o['mode']}: {per_image:.3g} GFLOP/image; ours {rate(o['images_per_s'])}, "
            f"torch {rate(t['images_per_s'])}")
    if c:
        line += f", compile {rate(c['images_per_s'])}"
    if g:
        line += f", ours as a CUDA Graph {rate(g['images_per_s'])}"
    if peak:
        line += f"; peak {peak:g} TFLOP/s ({o.get('peak_of', '')})"
    print(line)
# What each forward pass keeps for its backward pass, per image (train only): ours from the
# allocator (saved activations, outputs, dropout masks), torch's from its saved-tensor hooks.
for o, t in zip(ours, torch_rows):
    a, b = o.get("activation_bytes_per_image"), t.get("activation_bytes_per_image")
    if a is not None and b is not None and b > 0:
        print(f"{o['mode']}: activations kept for the backward pass, ours "
              f"{a / 2**20:.3f} MiB/image, torch {b / 2**20:.3f} MiB/image ({a / b:.2f}x)")
# The masks the twin's training forward draws (dropout and drop path at our models' sites).
for t in torch_rows:
    if t.get("dropout_sites") is not None:
        print(f"{t['mode']}: torch's forward draws {t['dropout_sites']} dropout and "
              f"{t['drop_path_sites']} drop-path masks (the config's rates, at our models' sites)")
# What each side held from the device at most, its cache included (what nvidia-smi shows, less
# the CUDA context): ours MemoryStats::peak_reserved, torch's max_memory_reserved.
for o, t in zip(ours, torch_rows):
    a, b = o.get("peak_reserved_bytes"), t.get("peak_reserved_bytes")
    if a and b:
        print(f"{o['mode']}: reserved at most, ours {a / 2**20:.1f} MiB, torch {b / 2**20:.1f} MiB "
              f"({a / b:.2f}x)")
if mismatch:
    sys.exit("benchmark.sh: the two models differ in trainable parameters; not the same model")
EOF
