#!/usr/bin/env bash
# The GPU speed matrix of the speed issue in one go: for each CONFIG[:BATCH], our training step
# beside eager PyTorch and torch.compile (scripts/benchmark.sh, bf16 autocast), then our step
# with one fast path switched off at a time, to see what each is worth: --attention wmma (the
# WMMA attention kernels instead of mma.sync), --attention-loads sync (the attention kernels'
# tiles loaded through registers, not cp.async), --attention-backward one_block (its backward in
# one block per head for up to 80 tokens), --attention-forward one_block (its forward likewise,
# for 65 to 80 tokens), --norm-backward fused (layer norm's backward in one
# pass), --residual-norm fused (a block's residual add and layer norm in one kernel each way),
# --gelu-dropout fused (an MLP's GELU and dropout in one kernel each way), --dropout-add fused
# (ViT's and CaiT's branch dropouts inside the residual sums' kernels),
# --talking-heads fused (CaiT's mix, softmax, mix in one kernel each way), --weight-casts
# per_step (the parameters' autocast casts in a launch per 32 before the forward pass),
# --linear-grads f32 (the linear layers' weight and bias gradients written in f32 by the GEMM and
# column sum, no cast), both of them together, --depthwise-conv
# direct / auto (channels-last depthwise convolutions on this project's kernels, or the faster of
# those and cuDNN's per shape),
# --conv-logits conv / gemm / direct (CSKA's logit
# convolution always as a convolution, always as im2col + GEMM, or by this project's tensor-core
# kernels, instead of the faster of the first two per shape), --attention scalar (no tensor cores),
# --attention unfused, --elementwise reference, --cudnn-benchmark off, --norm-output f32; and
# --cuda-graph on. Ends with one table.
# Usage: scripts/gpu_speed.sh [CONFIG[:BATCH] ...]
#   default: cifar10_vit_s:512 cifar10_cska_vit:512 imagenet_caformer_s18:128
#            imagenet_cskaformer_s18:128
# Environment: BUILD_DIR (default build-gpu), MODE (train|infer, default train), DEVICE (default
# cuda; cpu runs f32, for trying the script without a GPU), COMPILE
# (auto|off, default auto: the torch.compile column costs about a minute per model), TWIN
# (on|off, default on; off: only our step and its variants, no PyTorch), ITERS (default 20).
# Logs and JSON lines go to $OUT (or BUILD_DIR/logs).
set -uo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build-gpu}
mode=${MODE:-train}
device=${DEVICE:-cuda}
dtype=bf16 precision=bf16
[ "$device" = cpu ] && dtype=f32 precision=fp32
iters=${ITERS:-20}
logs=${OUT:-$build/logs}
mkdir -p "$logs"
bench=$build/apps/benchmark
[ -x "$bench" ] || { echo "gpu_speed: $bench not found (scripts/gpu_check.sh builds it)" >&2; exit 1; }
[ $# -gt 0 ] || set -- cifar10_vit_s:512 cifar10_cska_vit:512 imagenet_caformer_s18:128 \
  imagenet_cskaformer_s18:128

variants=(default "--attention wmma" "--attention-loads sync" "--attention-backward one_block"
          "--attention-forward one_block" "--norm-backward fused" "--residual-norm fused"
          "--gelu-dropout fused" "--dropout-add fused" "--talking-heads fused"
          "--weight-casts per_step" "--linear-grads f32" "--weight-casts per_step --linear-grads f32"
          "--depthwise-conv direct"
          "--depthwise-conv auto"
          "--conv-logits conv" "--conv-logits gemm" "--conv-logits direct" "--attention scalar"
          "--attention unfused"
          "--elementwise reference" "--cudnn-benchmark off" "--norm-output f32" "--cuda-graph")
rows=$logs/speed_variants.jsonl
: >"$rows"
for item in "$@"; do
  config=${item%%:*}
  batch=${item#*:}
  [ "$batch" = "$item" ] && batch=128
  if [ "${TWIN:-on}" != off ]; then
    echo "== $config, batch $batch, $mode: ours, eager PyTorch, torch.compile"
    BUILD_DIR=$build scripts/benchmark.sh "$config" --device "$device" --batch "$batch" \
      --dtype "$dtype" --mode "$mode" --iters "$iters" --compile "${COMPILE:-auto}" 2>&1 \
      | tee "$logs/speed_$config.log"
  fi
  for v in "${variants[@]}"; do
    flags=()
    [ "$v" = default ] || read -r -a flags <<<"$v"
    echo "== $config: our step, $v"
    if ! "$bench" --config "$config" --device "$device" --precision "$precision" --batch "$batch" \
         --mode "$mode" --iters "$iters" "${flags[@]}" --json >"$logs/speed_one.json" \
         2>"$logs/speed_one.err"; then
      tail -3 "$logs/speed_one.err"
      echo "{\"config\": \"$config\", \"variant\": \"$v\", \"error\": true}" >>"$rows"
      continue
    fi
    python3 -c 'import json, sys
row = json.load(open(sys.argv[1])); row["variant"] = sys.argv[2]; print(json.dumps(row))' \
      "$logs/speed_one.json" "$v" >>"$rows"
  done
done

python3 - "$rows" "$mode, $precision" <<'EOF'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"\n{'config':<28} {'variant':<26} {'images/s':>10} {'vs default':>10} {'peak MiB':>9}")
base = {}
for r in rows:
    name = r["config"].split("/")[-1].removesuffix(".yaml")
    if r.get("error"):
        print(f"{name:<28} {r['variant']:<26} {'failed':>10}")
        continue
    rate = r["images_per_s"]
    if r["variant"] == "default":
        base[name] = rate
    ratio = rate / base[name] if base.get(name) else float("nan")
    print(f"{name:<28} {r['variant']:<26} {rate:>10.1f} {ratio:>10.2f} "
          f"{r['peak_bytes'] / 2**20:>9.0f}")
print(f"({sys.argv[2]}; 'vs default' above 1: our step was faster with that switch)")
EOF
