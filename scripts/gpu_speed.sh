#!/usr/bin/env bash
# The GPU speed matrix of the speed issue in one go: for each CONFIG[:BATCH], our training step
# beside eager PyTorch and torch.compile (scripts/benchmark.sh, bf16 autocast), then our step
# with the kernels' choices varied one at a time (train.KEY, `benchmark --variants`, all in one
# process per config, ROUNDS rounds in turn): the WMMA attention kernels, synchronous tile loads,
# the split attention backward and the tiled forward, the split layer-norm backward, the
# held-row layer-norm forward, the unfused residual norm, the unfused GELU + dropout, the
# dropouts before the residual sums, the fused talking heads, the parameters' casts per step,
# f32 linear-layer gradients (and both), cuDNN's depthwise convolutions and this project's
# forced, CSKA's logits as convolution / GEMM / direct kernels, the scalar and unfused attention,
# the reference elementwise kernels, f32 norm outputs, cuBLASLt's algorithms timed per problem,
# and every fast path not yet the default at once ("new"); then --cudnn-benchmark off
# and --cuda-graph, a process each. Should the --variants process fail (a kernel's error takes
# the process down), each variant runs on its own. Ends with one table.
# Usage: scripts/gpu_speed.sh [CONFIG[:BATCH] ...]
#        scripts/gpu_speed.sh --print-choices   (what it passes benchmark, one line each)
#   default: cifar10_vit_s:512 cifar10_cska_vit:512 imagenet_caformer_s18:128
#            imagenet_cskaformer_s18:128
# Environment: BUILD_DIR (default build-gpu), MODE (train|infer, default train), DEVICE (default
# cuda; cpu runs f32, for trying the script without a GPU), COMPILE
# (auto|off, default auto: the torch.compile column costs about a minute per model), TWIN
# (on|off, default on; off: only our step and its variants, no PyTorch), ITERS (default 20),
# ROUNDS (default 2).
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
bench=$build/apps/benchmark

# The kernel choices' variants, timed in one benchmark process per config (--variants: one model
# build and warm-up, the variants in turn, ROUNDS times); "new" is every fast path not yet the
# default at once. Then the switches that are not kernel choices, one process each.
kernel_variants=("attention=wmma" "attention_loads=sync" "attention_backward=split"
  "attention_backward=one_pass" "attention_registers=capped" "attention_schedule=persistent"
  "attention_forward=tiled" "norm_forward=held" "norm_backward=split" "residual_norm=unfused"
  "gelu_dropout=unfused" "dropout_add=unfused" "talking_heads=fused" "weight_casts=per_step"
  "linear_grads=f32" "weight_casts=per_step,linear_grads=f32" "depthwise_conv=cudnn"
  "depthwise_conv=direct" "conv_logits=conv" "conv_logits=gemm" "conv_logits=direct"
  "conv_logits_grad_w=per_row" "conv_logits=direct,conv_logits_grad_w=per_row" "attention=scalar" "attention=unfused" "elementwise=reference" "norm_output=f32"
  "gemm_algorithm=timed")
every_new="norm_forward=held,talking_heads=fused,weight_casts=per_step,linear_grads=f32,attention_backward=one_pass,gemm_algorithm=timed,conv_logits_grad_w=per_row"
kernel_variants+=("$every_new")
process_variants=("--cudnn-benchmark off" "--cuda-graph")
joined=$(IFS=';'; echo "${kernel_variants[*]}")

# A variant (KEY=VALUE,...) as benchmark's own flags, --key value ..., into the array flags.
variant_flags() {
  flags=()
  local pairs kv
  IFS=, read -r -a pairs <<<"$1"
  for kv in "${pairs[@]}"; do
    local key=${kv%%=*}
    flags+=("--${key//_/-}" "${kv#*=}")
  done
}

# What this script passes benchmark, one line each ("variants STRING", "flags FLAG VALUE ...",
# "process FLAGS"), for tests/scripts/test_gpu_scripts.sh to try on the CPU.
if [ "${1:-}" = --print-choices ]; then
  echo "variants $joined"
  for v in "${kernel_variants[@]}"; do variant_flags "$v"; echo "flags ${flags[*]}"; done
  for v in "${process_variants[@]}"; do echo "process $v"; done
  exit 0
fi

mkdir -p "$logs"
[ -x "$bench" ] || { echo "gpu_speed: $bench not found (scripts/gpu_check.sh builds it)" >&2; exit 1; }
[ $# -gt 0 ] || set -- cifar10_vit_s:512 cifar10_cska_vit:512 imagenet_caformer_s18:128 \
  imagenet_cskaformer_s18:128
rows=$logs/speed_variants.jsonl
: >"$rows"

# Appends rows of benchmark's JSON ($1) to $rows: one per --variants entry ("command line" as
# "default"), or only the entry labelled $2 when given; a run without variants is one row, $2.
append_rows() {
  python3 -c 'import json, sys
run, only = json.load(open(sys.argv[1])), sys.argv[2]
for v in run.get("variants") or [dict(run, variant=only)]:
    if only and "variants" in run and v["variant"] != only:
        continue
    label = "default" if v["variant"] == "command line" else v["variant"]
    print(json.dumps({"config": run["config"], "variant": label,
                      "images_per_s": v["images_per_s"], "peak_bytes": v["peak_bytes"]}))' \
    "$1" "${2:-}" >>"$rows"
}

# One benchmark process; $1 the config, the rest its flags.
run_one() {
  local config=$1
  shift
  "$bench" --config "$config" --device "$device" --precision "$precision" --batch "$batch" \
    --mode "$mode" --iters "$iters" "$@" --json >"$logs/speed_one.json" 2>"$logs/speed_one.err"
}

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
  echo "== $config: our step and ${#kernel_variants[@]} kernel-choice variants, rounds: ${ROUNDS:-2}"
  if run_one "$config" --variants "$joined" --rounds "${ROUNDS:-2}"; then
    append_rows "$logs/speed_one.json"
  else
    # A variant that fails takes the process with it: then each on its own, to keep the rest.
    tail -3 "$logs/speed_one.err"
    echo "== $config: --variants failed; one process per variant"
    for v in default "${kernel_variants[@]}"; do
      flags=()
      [ "$v" = default ] || variant_flags "$v"
      if run_one "$config" "${flags[@]}"; then
        append_rows "$logs/speed_one.json" "$v"
      else
        echo "{\"config\": \"$config\", \"variant\": \"$v\", \"error\": true}" >>"$rows"
      fi
    done
  fi
  for v in "${process_variants[@]}"; do
    read -r -a flags <<<"$v"
    echo "== $config: our step, $v"
    if run_one "$config" "${flags[@]}"; then
      append_rows "$logs/speed_one.json" "$v"
    else
      tail -3 "$logs/speed_one.err"
      echo "{\"config\": \"$config\", \"variant\": \"$v\", \"error\": true}" >>"$rows"
    fi
  done
done

python3 - "$rows" "$mode, $precision" "$every_new" <<'EOF'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]


def short(label):  # the variant of every not-yet-default fast path at once is long
    return "new (every fast path not yet default)" if label == sys.argv[3] else label[:40]

print(f"\n{'config':<28} {'variant':<40} {'images/s':>10} {'vs default':>10} {'peak MiB':>9}")
base = {}
for r in rows:
    name = r["config"].split("/")[-1].removesuffix(".yaml")
    if r.get("error"):
        print(f"{name:<28} {short(r['variant']):<40} {'failed':>10}")
        continue
    rate = r["images_per_s"]
    if r["variant"] == "default":
        base[name] = rate
    ratio = rate / base[name] if base.get(name) else float("nan")
    print(f"{name:<28} {short(r['variant']):<40} {rate:>10.1f} {ratio:>10.2f} "
          f"{r['peak_bytes'] / 2**20:>9.0f}")
print(f"({sys.argv[2]}; 'vs default' above 1: our step was faster with that switch)")
EOF
