#!/usr/bin/env bash
# The data-parallel checks only a GPU machine can make (issue: NCCL data parallelism), in one go:
#  1. NCCL at world size 1 against no data parallelism: the same CIFAR training steps with and
#     without distributed.force_backend (communicator, comm stream, buckets, overlap), images/s of
#     both and their ratio (goal: within 3%), and the weights compared bit for bit;
#  2. benchmark_comm: all-reduce bus bandwidth over message sizes, 2 processes (on one GPU they
#     share it: NCCL may refuse, which the log then shows);
#  3. --nproc-per-node N on the GPUs there are (N = 2 also on one GPU).
# Needs a CUDA build (scripts/gpu_check.sh makes build-gpu) and Python with NumPy for the
# synthetic CIFAR-10 files. Usage: scripts/gpu_dp_check.sh [BUILD_DIR] [STEPS]; logs in
# $OUT or BUILD_DIR/logs.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
steps=${2:-300}
logs=${OUT:-$build/logs}
mkdir -p "$logs"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
python3 scripts/make_synthetic_cifar10.py "$data" --per-file 10000 || exit 1
train=("$build/apps/train" --config cifar10_cska_vit --set "data.root=$data" --device cuda
       --set "train.max_steps=$steps" --set train.eval_every=1000 --set checkpoint.every_epochs=0)

rate() { grep -oE '[0-9.]+ img/s' "$1" | tail -1; }
echo "== NCCL at world size 1 vs none ($steps steps of cifar10_cska_vit, bf16)"
"${train[@]}" --output "$data/plain" >"$logs/dp_plain.log" 2>&1
"${train[@]}" --output "$data/nccl1" --set distributed.force_backend=true \
  >"$logs/dp_nccl1.log" 2>&1
echo "  none:        $(rate "$logs/dp_plain.log")"
echo "  NCCL, 1 GPU: $(rate "$logs/dp_nccl1.log")  ($(grep -o 'data parallel: [^,]*' "$logs/dp_nccl1.log"))"
if cmp -s "$data/plain/checkpoints/$(cat "$data/plain/checkpoints/last")/model.safetensors" \
          "$data/nccl1/checkpoints/$(cat "$data/nccl1/checkpoints/last")/model.safetensors"; then
  echo "  weights: bit-identical"
else
  echo "  weights: DIFFER"
fi

echo "== benchmark_comm, 2 processes"
timeout 300 "$build/apps/benchmark_comm" --nproc-per-node 2 --device cuda --max 256M \
  >"$logs/comm.log" 2>&1
echo "  exit $?: $(tail -3 "$logs/comm.log" | tr '\n' ' ')"

ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
n=$(( ngpu > 1 ? ngpu : 2 ))
echo "== --nproc-per-node $n on $ngpu GPU(s)"
timeout 600 "${train[@]}" --output "$data/dp$n" --nproc-per-node "$n" >"$logs/dp_n.log" 2>&1
echo "  exit $?: $(rate "$logs/dp_n.log") ($(grep -o 'global batch [^(]*' "$logs/dp_n.log" | head -1))"
echo "logs: $logs"
