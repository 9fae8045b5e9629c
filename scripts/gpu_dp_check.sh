#!/usr/bin/env bash
# The data-parallel checks only a GPU machine can make (issue: NCCL data parallelism), in one go:
#  1. NCCL at world size 1 against no data parallelism: the same CIFAR training steps with and
#     without distributed.force_backend (communicator, comm stream, buckets, overlap), images/s of
#     both and their ratio (goal: within 3%), and the weights compared bit for bit;
#  2. benchmark_comm: all-reduce bus bandwidth over message sizes, one process per GPU;
#  3. --nproc-per-node N on the N GPUs there are.
# 2 and 3 need two GPUs or more (NCCL takes one GPU per worker; a second worker on a machine with
# one GPU is refused with an error naming its rank). On one GPU instead:
#  4. two workers made to share it (torchrun-style RANK 0 / 1 with LOCAL_RANK 0): what NCCL
#     says, and that both end within the 120 s they are given;
#  5. SIGTERM through NCCL at world size 1: the workers' stop agreement (an all-gather on the GPU
#     every train.log_every updates) writes a checkpoint where they stop, and train ends by
#     SIGTERM (exit 143).
# Needs a CUDA build (scripts/gpu_check.sh makes build-gpu) and Python with NumPy for the
# synthetic CIFAR-10 files. Usage: scripts/gpu_dp_check.sh [BUILD_DIR] [STEPS]; logs in
# $OUT or BUILD_DIR/logs.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build-gpu}
steps=${2:-300}
logs=${OUT:-$build/logs}
mkdir -p "$logs"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
python3 scripts/make_synthetic_cifar10.py "$data" --per-file 10000 || exit 1
# cuDNN's heuristic, deterministic algorithms: timed choices differ between processes, and some
# backward algorithms sum with atomics; either would make the weights differ without a fault.
train=("$build/apps/train" --config cifar10_cska_vit --set "data.root=$data" --device cuda
       --set "train.max_steps=$steps" --set train.eval_every=1000 --set checkpoint.every_epochs=0
       --set train.cudnn_benchmark=false --set train.cudnn_deterministic=true)

# The first epoch's images/s (the whole run's figure counts the start-up too).
rate() { grep -oE '[0-9.]+ img/s' "$1" | head -1; }
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

ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if (( ngpu < 2 )); then
  # NCCL takes one GPU per process: two workers cannot share the one there is.
  echo "== benchmark_comm and --nproc-per-node: skipped, $ngpu GPU (one per worker)"
  # What NCCL does when two workers are made to share it anyway (a torchrun-style environment
  # read as two nodes of one GPU each): it may refuse; either way both must end, not hang.
  echo "== two workers on the one GPU (RANK 0 and 1, LOCAL_RANK 0 each, 20 steps)"
  port=$((29500 + RANDOM % 1000)) t0=$SECONDS
  pids=()
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout -k 15 120 "${train[@]}" --output "$data/shared" --set train.max_steps=20 \
      >"$logs/dp_shared$r.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}"; s0=$?
  wait "${pids[1]}"; s1=$?
  echo "  exit $s0 / $s1 after $((SECONDS - t0)) s (124 or 137: still running at 120 s, a hang)"
  for r in 0 1; do
    echo "  rank $r: $(grep -iE 'error|nccl|duplicate|img/s' "$logs/dp_shared$r.log" | tail -2 | tr '\n' ' ')"
  done
else
  echo "== benchmark_comm, $ngpu processes"
  timeout 300 "$build/apps/benchmark_comm" --nproc-per-node "$ngpu" --device cuda --max 256M \
    >"$logs/comm.log" 2>&1
  echo "  exit $?: $(tail -3 "$logs/comm.log" | tr '\n' ' ')"
  echo "== --nproc-per-node $ngpu"
  timeout -k 30 600 "${train[@]}" --output "$data/dp$ngpu" --nproc-per-node "$ngpu" \
    >"$logs/dp_n.log" 2>&1
  status=$?
  batch=$(grep -o 'global batch [^(]*' "$logs/dp_n.log" | head -1)
  echo "  exit $status: $(rate "$logs/dp_n.log") ($batch)"
fi
echo "== SIGTERM through NCCL (world size 1)"
"${train[@]}" --output "$data/stop" --set distributed.force_backend=true --set train.log_every=10 \
  --set train.max_steps=1000000 >"$logs/dp_stop.log" 2>&1 &
pid=$!
for _ in $(seq 600); do  # until the first step record (update 10), at most 60 s
  grep -q '"kind":"step"' "$data/stop/metrics.jsonl" 2>/dev/null && break
  sleep 0.1
done
kill -TERM "$pid"
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$pid" 2>/dev/null && echo "  still running 60 s after SIGTERM: killed"
wait "$pid"
echo "  exit $? (143 expected): $(grep -E 'stopped (at|by)' "$logs/dp_stop.log" | tr '\n' ' ')"
echo "logs: $logs"
