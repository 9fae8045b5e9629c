#!/usr/bin/env bash
# A short GPU lease in one call: the checks only a GPU can make, most important first, each under
# a share of one deadline, so that a lease of a few minutes returns what matters and a stage that
# hangs cannot eat the rest. On the GPU machine, from the repository root:
#
#   scripts/gpu_session.sh [--budget SECONDS] [STAGE ...]
#   scripts/gpu_session.sh --print-choices   (the variants and forms the stages pass benchmark)
#
# Stages (default: all, in this order; each is skipped when too little time is left):
#   tests     every [cuda] test but the slow whole-zoo ones (CUDA against the CPU, bit-exact paths)
#   graphs    the [cuda][graph] tests: every zoo model's training step replayed as a CUDA Graph
#             against its eager steps, bit for bit (CaiT's with its layer dropout drawn on the
#             device; drawn on the host, its capture must be refused)
#   attention the fused attention op alone, ours (and its one-block kernels) against PyTorch's SDPA
#             with each backend forced, cuDNN's included (scripts/benchmark_ops.sh --cases
#             _attention, bf16: ViT-S's LSA and plain attention at 65 tokens, CAFormer-S18's
#             stages 3 and 4); then our bf16 training step with the default kernels and with
#             each switched back: WMMA attention, synchronous tile loads, the split backward,
#             that and the tiled forward, the split layer norm backward, the held-row forward,
#             the unfused residual add + layer norm, that and the unfused GELU + dropout, and
#             the held forward with fused talking heads, and the one-pass backward, in one
#             benchmark --variants process per
#             model, two rounds in turn:
#             cifar10_vit_s and cifar10_cska_vit at 512, imagenet_caformer_s18 at 128
#             (ATTN="CONFIG:BATCH ..." for others)
#   cait      CaiT's not-yet-default paths in our bf16 training step, one benchmark --variants
#             process per model, two rounds: fused talking heads, the stacked q/kv projections,
#             both, the parameters' casts once a step, the linear layers' gradients in f32, the
#             one-pass attention backward, and all of them; and the default's LayerScale sums
#             fused with their norms switched back (residual_norm=unfused): cifar10_cska_cait
#             and cifar10_cait_s at 512 (CAIT="CONFIG:BATCH ..." for others)
#   depthwise the channels-last depthwise 7x7 convolution (CAFormer-S18's first stage) on cuDNN
#             and on this project's kernels (scripts/benchmark_ops.sh --cases dwconv, bf16, against
#             PyTorch), then our bf16 training step with --depthwise-conv cudnn / direct / auto
#             (which prints its timings) back to back: imagenet_caformer_s18 and imagenet_cskaformer_s18 at 128
#             (DEPTHWISE="CONFIG:BATCH ..." for others)
#   logits    our bf16 training step with CSKA's logit convolution as a convolution, as
#             im2col + GEMM, the faster of the two per shape, and by this project's tensor-core
#             kernels (--conv-logits conv / gemm / auto / direct; auto prints its timings) back to
#             back: imagenet_cskaformer_s18 at 128,
#             cifar10_cska_vit at 512 (LOGITS="CONFIG:BATCH ..." for others; LOGITS_FORMS="auto
#             direct" runs only those forms)
#   convs     scripts/benchmark_ops.sh (bf16, against PyTorch) on the CSKA logit convolutions:
#             CSKAFormer-S18's (stage 2) and CSKA-ViT-S's, forward and backward, with the timed
#             backward-input choice and with each form forced (backward-data, rotated forward),
#             and as the mixers run them in each train.conv_logits form (conv, gemm, direct);
#             and a bias gradient's column sum (vit_bias_grad: ViT-S's [B * 65, 512] over its rows)
#             and StarReLU (caf_s1_star_relu: CAFormer-S18's stage-1 MLP), forward and backward
#   speed     ours against eager PyTorch, bf16 training: cifar10_cska_vit and cifar10_vit_s at
#             batch 512, imagenet_cskaformer_s18 and imagenet_caformer_s18 at 128, then
#             cifar10_cska_cait, cifar10_cska_swin and cifar10_cska_cvt at 512 while time lasts;
#             ours also with the step replayed as a CUDA Graph (GRAPH=off leaves it out;
#             COMPILE=on adds torch.compile, about a minute per model; SPEED="CONFIG:BATCH ..."
#             for others; SPEED_MODES="train infer" times inference too; SPEED_SETS="k=v ..."
#             passes config overrides, e.g. train.talking_heads=fused, to both sides)
#   dp        NCCL at world size 1 against no data parallelism (weights, speed); benchmark_comm
#             and --nproc-per-node N where there are N >= 2 GPUs (scripts/gpu_dp_check.sh,
#             DP_STEPS steps, default 100)
#   profile   benchmark --profile (bf16) of the configs short of their speed targets: ViT-S,
#             CSKA-ViT-S and CSKA-CaiT at batch 512: time by op family, kernel and operands, with
#             the rate each reached (TFLOP/s or GB/s) (PROFILE="CONFIG:BATCH ..." profiles others)
#   kernels   every kernel's own GPU time and DRAM bytes in one training step by Nsight Compute,
#             and the share of the wall-clock step the GPU was busy (scripts/gpu_kernels.sh):
#             ViT-S at 512 and CSKAFormer-S18 at 128 (KERNELS="CONFIG:BATCH ..." for others)
#   stalls    why the fused attention's and the layer norms' kernels take their time, by Nsight
#             Compute (scripts/gpu_stalls.sh): registers, blocks per SM and their limit, warps per
#             SM, issue rate, tensor-pipe and DRAM shares, and the warp stall reasons, in ViT-S's
#             bf16 step at 512 with the default kernels, the register-capped one-block backward
#             and the one-pass backward (STALLS="CONFIG:BATCH ...", STALL_KERNELS=REGEX and
#             STALL_VARIANTS="flags;flags" for others)
#   loader    benchmark_loader on that machine's cores: synthetic ImageNet-like JPEGs through the
#             MetaFormer augmentation, images/s at 1, 2, 4, 8 and 16 workers: the CPU cores an
#             ImageNet GPU needs
#   zoo       the whole-zoo [cuda][slow] tests: every model's logits and gradients against the
#             CPU, and its graph replays against its eager steps (graphs)
#   table8    scripts/reproduce.sh table8 --epochs T8_EPOCHS (default 1) when Fashion-MNIST's
#             four .gz files are in data/fashion_mnist (carried); runs in runs/gpu_session, so a
#             later call on the same machine resumes it; then TensorBoard reads one run folder
#             (scripts/tensorboard_check.py); T8_SLOTS runs at once (default 3, --gpus 0,0,0).
#             T8_SETS="k=v ..." adds config overrides, e.g.
#             T8_SETS=train.attention=unfused to step around a fast path the tests found broken;
#             T8_ROWS=a,b picks rows (default the 12 Fashion-MNIST ones; all: every row)
#   alloc     our bf16 training step of each ALLOC="CONFIG:BATCH ..." (default CSKA-CvT, CSKA-CaiT,
#             CSKAFormer-S18) under SKA_CUDA_ALLOCATOR=split and =whole_blocks: images/s and
#             the peak of the blocks, the tensors and the reserved memory; with split also what
#             is live at the peak, by size (benchmark --memory-census), to hold against the
#             CPU's census of the same step
#   variants  our step with each fast path switched off (scripts/gpu_speed.sh, no PyTorch)
#   memcheck  compute-sanitizer memcheck over the kernel tests of the newest kernels (attention,
#             elementwise and StarReLU, reductions, batch norm, dropout and dropout_add, layer
#             norm and add_layer_norm (the branch's dropout, the held-row forward), depthwise
#             convolution, residual sums, talking heads, multi-tensor casts, GEMM and column sums
#             into f32, conv logits),
#             then racecheck over the attention and conv-logit kernels' tile loads (asynchronous
#             copies) and the column reductions' lanes (a tree in shared memory)
#
# Carried (git-ignored): .deps.tar.xz (../shared/tools/device-deps.sh .deps libjpeg62-turbo
# libjpeg62-turbo-dev libpng16-16 libpng-dev), .gpu-build.tar.xz
# (scripts/gpu_prebuild.sh: programs built here, so no minutes go to compiling; without it, or
# when it does not match this checkout, the programs are built there) and data/fashion_mnist.
# Output: $OUT/summary.txt (one line per stage, and the figures) and $OUT/logs.tar.gz (every
# log); $OUT defaults to build-gpu/session. --budget defaults to 540 s (a 600 s call).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# The kernel choices the attention and cait stages time (benchmark --variants), and the forms
# the depthwise and logits stages run.
attention_variants="attention=wmma;attention_loads=sync;attention_backward=split;attention_backward=split,attention_forward=tiled;norm_backward=split;norm_forward=held;residual_norm=unfused;residual_norm=unfused,gelu_dropout=unfused;norm_forward=held,talking_heads=fused;attention_backward=one_pass;attention_registers=capped;attention_schedule=persistent"
cait_variants="talking_heads=fused;projections=stacked;talking_heads=fused,projections=stacked;weight_casts=per_step;linear_grads=f32;attention_backward=one_pass;attention_registers=capped;attention_schedule=persistent;talking_heads=fused,projections=stacked,weight_casts=per_step,linear_grads=f32,attention_backward=one_pass;residual_norm=unfused"
depthwise_forms="cudnn direct auto"
logits_forms=${LOGITS_FORMS:-conv gemm auto direct}

budget=540
stages=()
while [ $# -gt 0 ]; do
  case $1 in
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    # What the stages pass benchmark, one line each ("variants STRING", "option FLAG FORM"), for
    # tests/scripts/test_gpu_scripts.sh to try on the CPU before a lease finds a typo.
    --print-choices)
      echo "variants $attention_variants"
      echo "variants $cait_variants"
      for f in $depthwise_forms; do echo "option --depthwise-conv $f"; done
      for f in $logits_forms; do echo "option --conv-logits $f"; done
      exit 0 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -*) echo "gpu_session: unknown option '$1'" >&2; exit 2 ;;
    *) stages+=("$1"); shift ;;
  esac
done
all=(tests graphs attention cait depthwise logits convs speed alloc dp profile kernels stalls loader zoo
     table8 variants memcheck)
[ ${#stages[@]} -gt 0 ] || stages=("${all[@]}")
for s in "${stages[@]}"; do
  [[ " ${all[*]} " == *" $s "* ]] || { echo "gpu_session: unknown stage '$s' (${all[*]})" >&2; exit 2; }
done

start=$SECONDS
out=${OUT:-build-gpu/session}
mkdir -p "$out"
logs=$(mktemp -d)
summary=$logs/summary.txt
pack() {
  cp "$summary" "$out/summary.txt"
  tar -czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null
}
trap pack EXIT
say() { echo "$*" | tee -a "$summary"; }
left() { echo $(( budget - (SECONDS - start) )); }

# stage_run NAME MAX_SECONDS COMMAND...: COMMAND's output to NAME.log, under a timeout of
# MAX_SECONDS or what is left of the budget (15 s kept for packing), whichever is less.
stage_run() {
  local name=$1 max=$2; shift 2
  local avail=$(( $(left) - 15 ))
  if (( avail < 20 )); then say "$name: skipped, $(left) s left"; return 125; fi
  (( max > avail )) && max=$avail
  local t0=$SECONDS rc
  timeout --kill-after=5 "$max" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  local why=""
  [ $rc = 124 ] || [ $rc = 137 ] && why=" (stopped at its ${max} s limit)"
  say "$name: exit $rc in $(( SECONDS - t0 )) s$why"
  return $rc
}

# Catch2 (console reporter): the test cases that failed, once each.
failed_cases() {
  awk '/^-+$/ && length($0) == 79 { if (!inhead) { inhead = 1; name = "" } else inhead = 0; next }
       inhead && name == "" { name = $0; next }
       /FAILED:$|failed: / { if (name != "" && !(name in seen)) { seen[name] = 1; print "  FAILED: " name } }' "$1"
}

say "gpu_session $(date -u +%FT%TZ), budget ${budget} s, stages: ${stages[*]}"
say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
say "PyTorch: $(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())' 2>/dev/null)"

[ -f .deps.tar.xz ] && [ ! -d .deps/root ] && tar -xJf .deps.tar.xz
# The tests that train on Fashion-MNIST read Debian's dataset-fashion-mnist folder: where that
# is missing and may be made, it leads to the carried files, so that they run rather than skip.
fmnist=/usr/share/datasets/fashion-mnist
if [ ! -e "$fmnist" ] && ls data/fashion_mnist/*.gz >/dev/null 2>&1 &&
   mkdir -p "$(dirname "$fmnist")" 2>/dev/null && ln -s "$PWD/data/fashion_mnist" "$fmnist"; then
  say "Fashion-MNIST: $fmnist leads to the carried data/fashion_mnist"
fi
. scripts/gpu_env.sh
build=build-gpu
# Programs built elsewhere (scripts/gpu_prebuild.sh), carried in .gpu-build.tar.xz or left by
# an earlier call on this machine, when they fit this checkout; else a build here.
use_prebuilt() {
  if [ -f .gpu-build.tar.xz ] && [ ! -f "$build/CMakeCache.txt" ]; then
    rm -rf "$build" && tar -xJf .gpu-build.tar.xz || return 1
  fi
  [ -f "$build/SOURCE_HASH" ] || { say "programs: none prebuilt"; return 1; }
  if [ "$(cat "$build/SOURCE_HASH")" != "$(scripts/source_hash.sh)" ]; then
    say "programs: the prebuilt ones come from other sources than this checkout's"; return 1
  fi
  # Configs and fixtures are found through the source path compiled in: lead it here.
  local src
  src=$(cat "$build/SOURCE_DIR")
  if [ "$src" != "$PWD" ]; then
    if [ -e "$src" ] && [ "$(cd "$src" && pwd -P)" != "$(pwd -P)" ]; then
      say "programs: $src exists here and is not this checkout"; return 1
    fi
    mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src" || return 1
  fi
  local missing
  missing=$(ldd "$build"/tests/ska_tests "$build"/apps/* | grep "not found" | sort -u)
  if [ -n "$missing" ]; then say "programs: prebuilt ones lack libraries: $missing"; return 1; fi
  # LD_BIND_NOW: every symbol resolved at start, so that an older cuDNN or NCCL there that lacks
  # a function we call fails here rather than in the middle of a test.
  LD_BIND_NOW=1 "$build/tests/ska_tests" --help >/dev/null 2>&1 \
    || { say "programs: the prebuilt ska_tests does not start"; return 1; }
  say "programs: prebuilt from $(head -1 "$build/COMMIT")"
}
if ! use_prebuilt; then
  [ -f "$build/CMakeCache.txt" ] || rm -rf "$build"
  stage_run build 360 env BUILD_DIR="$build" LOG_DIR="$logs" \
    TARGETS="ska_tests benchmark_comm benchmark_ops benchmark_loader" scripts/gpu_build.sh \
    || { say "build failed: see logs.tar.gz build.log"; exit 1; }
fi
tests=$build/tests/ska_tests

# test_stage NAME MAX_SECONDS FILTER: the Catch2 test cases FILTER selects, their count and the
# names of those that failed.
test_stage() {
  stage_run "$1" "$2" "$tests" "$3"
  [ $? = 125 ] && return
  say "  $(grep -E '^(All tests passed|test cases:)' "$logs/$1.log" | tail -1)"
  failed_cases "$logs/$1.log" | head -40 | tee -a "$summary"
}

# variants_stage PREFIX "CONFIG:BATCH ..." VARIANTS: our bf16 training step of each config in one
# benchmark --variants process (150 s at most): the defaults first, then each of the
# ';'-separated VARIANTS, two rounds in turn; the table (or, from a run cut short, the rounds it
# measured: benchmark's stderr) goes to the summary.
variants_stage() {
  local prefix=$1 items=$2 variants=$3 item config batch
  for item in $items; do
    config=${item%%:*} batch=${item#*:}
    stage_run "${prefix}_$config" 150 "$build/apps/benchmark" --config "$config" \
      --device cuda --precision bf16 --batch "$batch" --iters 20 --rounds 2 --variants "$variants"
    [ $? = 125 ] && continue
    { grep -q '^variants' "$logs/${prefix}_$config.log" &&
        sed -n '/^variants/,$p' "$logs/${prefix}_$config.log" ||
        grep '^variant ' "$logs/${prefix}_$config.log"; } | sed 's/^/  /' | tee -a "$summary"
  done
}

# forms_stage PREFIX OPTION "FORMS" "CONFIG:BATCH ..." PATTERN: our bf16 training step (10 steps,
# 60 s at most) of each config with OPTION set to each form in turn, back to back; the lines of
# its output matching PATTERN go to the summary.
forms_stage() {
  local prefix=$1 option=$2 forms=$3 items=$4 pattern=$5 item config batch form
  for item in $items; do
    config=${item%%:*} batch=${item#*:}
    for form in $forms; do
      stage_run "${prefix}_${config}_$form" 60 "$build/apps/benchmark" --config "$config" \
        --device cuda --precision bf16 --batch "$batch" --iters 10 "$option" "$form"
      [ $? = 125 ] && continue
      grep -E "$pattern" "$logs/${prefix}_${config}_$form.log" |
        sed "s/^ */  $form: /" | tee -a "$summary"
    done
  done
}

for stage in "${stages[@]}"; do
  case $stage in
  tests) test_stage cuda_tests 200 "[cuda]~[slow]" ;;
  graphs) test_stage graphs 150 "[cuda][graph]" ;;
  attention)
    stage_run attention_ops 90 env BUILD_DIR="$build" scripts/benchmark_ops.sh --device cuda \
      --dtype bf16 --cases _attention
    [ $? = 125 ] || grep -E "_attention" "$logs/attention_ops.log" | sed 's/^/  /' | tee -a "$summary"
    variants_stage attention \
      "${ATTN:-cifar10_vit_s:512 cifar10_cska_vit:512 imagenet_caformer_s18:128}" \
      "$attention_variants" ;;
  cait)
    variants_stage cait "${CAIT:-cifar10_cska_cait:512 cifar10_cait_s:512}" "$cait_variants" ;;
  depthwise)
    stage_run depthwise_ops 90 env BUILD_DIR="$build" scripts/benchmark_ops.sh --device cuda \
      --dtype bf16 --cases dwconv
    [ $? = 125 ] && continue
    grep -E "dwconv" "$logs/depthwise_ops.log" | sed 's/^/  /' | tee -a "$summary"
    forms_stage depthwise --depthwise-conv "$depthwise_forms" \
      "${DEPTHWISE:-imagenet_caformer_s18:128 imagenet_cskaformer_s18:128}" "images/s|depthwise conv " ;;
  logits)
    forms_stage logits --conv-logits "$logits_forms" \
      "${LOGITS:-imagenet_cskaformer_s18:128 cifar10_cska_vit:512}" "images/s|conv logits " ;;
  convs)
    stage_run convs 90 env BUILD_DIR="$build" scripts/benchmark_ops.sh --device cuda --dtype bf16 \
      --cases cskaf,cska_logits,cska_conv_logits,bias_grad,star_relu
    [ $? = 125 ] && continue
    grep -E "cska|bias_grad|star_relu" "$logs/convs.log" | sed 's/^/  /' | tee -a "$summary" ;;
  speed)
    for item in ${SPEED:-cifar10_cska_vit:512 cifar10_vit_s:512 imagenet_cskaformer_s18:128 \
                imagenet_caformer_s18:128 cifar10_cska_cait:512 cifar10_cska_swin:512 \
                cifar10_cska_cvt:512}; do
      config=${item%%:*} batch=${item#*:}
      for mode in ${SPEED_MODES:-train}; do
        name=speed_$config; [ "$mode" = train ] || name=speed_${mode}_$config
        sets=()
        for kv in ${SPEED_SETS:-}; do sets+=(--set "$kv"); done
        stage_run "$name" 150 env BUILD_DIR="$build" scripts/benchmark.sh "$config" \
          --device cuda --batch "$batch" --dtype bf16 --mode "$mode" --iters 20 \
          --compile "${COMPILE:-off}" --cuda-graph "${GRAPH:-on}" ${sets[@]+"${sets[@]}"}
        [ $? = 125 ] && continue
        grep -E "^(# |mode |train|infer)" "$logs/$name.log" | sed 's/^/  /' | tee -a "$summary"
      done
    done ;;
  alloc)
    # Our bf16 training step under each CUDA allocator policy, back to back: speed and the peak
    # of the blocks, the tensors and the reserved memory.
    for item in ${ALLOC:-cifar10_cska_cvt:512 cifar10_cska_cait:512 imagenet_cskaformer_s18:128}; do
      config=${item%%:*} batch=${item#*:}
      for policy in split whole_blocks; do
        census=()
        [ "$policy" = split ] && census=(--memory-census)
        stage_run "alloc_${config}_$policy" 60 env SKA_CUDA_ALLOCATOR=$policy \
          "$build/apps/benchmark" --config "$config" --device cuda --precision bf16 \
          --batch "$batch" --iters 10 "${census[@]}"
        [ $? = 125 ] && continue
        grep -E "images/s|live at the peak" "$logs/alloc_${config}_$policy.log" |
          sed "s/^/  $policy: /" | tee -a "$summary"
      done
    done ;;
  profile)
    for item in ${PROFILE:-cifar10_vit_s:512 cifar10_cska_vit:512 cifar10_cska_cait:512}; do
      config=${item%%:*} batch=${item#*:}
      stage_run "profile_$config" 60 "$build/apps/benchmark" --config "$config" --device cuda \
        --precision bf16 --batch "$batch" --warmup 5 --iters 10 --profile --top 30
      [ $? = 125 ] && continue
      head -90 "$logs/profile_$config.log" | sed 's/^/  /' >>"$summary"
    done ;;
  kernels)
    for item in ${KERNELS:-cifar10_vit_s:512 imagenet_cskaformer_s18:128}; do
      config=${item%%:*}
      stage_run "kernels_$config" 120 env BUILD_DIR="$build" OUT="$logs/kernels" \
        scripts/gpu_kernels.sh "$item"
      [ $? = 125 ] && continue
      sed 's/^/  /' "$logs/kernels_$config.log" | head -40 | tee -a "$summary"
    done ;;
  stalls)
    for item in ${STALLS:-cifar10_vit_s:512}; do
      config=${item%%:*}
      stage_run "stalls_$config" 150 env BUILD_DIR="$build" OUT="$logs/stalls" \
        MATCH="${STALL_KERNELS:-mma_|wmma_|attention_|layer_norm}" \
        VARIANTS="${STALL_VARIANTS-;--attention-registers capped;--attention-schedule persistent;--attention-backward one_pass}" \
        scripts/gpu_stalls.sh "$item"
      [ $? = 125 ] && continue
      sed 's/^/  /' "$logs/stalls_$config.log" | head -80 | tee -a "$summary"
    done ;;
  dp)
    stage_run dp 200 env OUT="$logs/dp" scripts/gpu_dp_check.sh "$build" "${DP_STEPS:-100}"
    [ $? = 125 ] && continue
    grep -E "^ |^==" "$logs/dp.log" | tee -a "$summary" ;;
  loader)
    stage_run loader 90 "$build/apps/benchmark_loader" --synthetic 256 --seconds 5
    [ $? = 125 ] && continue
    sed 's/^/  /' "$logs/loader.log" | tee -a "$summary" ;;
  zoo) test_stage zoo 300 "[cuda][slow]" ;;
  variants)
    stage_run variants 200 env BUILD_DIR="$build" OUT="$logs/variants" TWIN=off ITERS=10 \
      scripts/gpu_speed.sh cifar10_cska_vit:512 imagenet_cskaformer_s18:128
    [ $? = 125 ] && continue
    sed -n '/^config .*variant/,$p' "$logs/variants.log" | tee -a "$summary" ;;
  table8)
    if ls data/fashion_mnist/*.gz >/dev/null 2>&1; then
      # Run folders hold checkpoints: kept out of the logs, but for their metrics and events; in
      # runs/ so that a later call on the same machine resumes the rows this one did not finish.
      runs=$PWD/runs/gpu_session
      sets=()
      for kv in ${T8_SETS:-}; do sets+=(--set "$kv"); done
      # The Fashion-MNIST rows (SVHN is not in Debian, so never carried); T8_ROWS=all: every row.
      rows=
      for model in vit_s ska_vit cska_vit cait_s ska_cait cska_cait swin_t ska_swin cska_swin \
                   cvt_13 ska_cvt cska_cvt; do
        rows+=${rows:+,}fmnist_$model
      done
      rows=${T8_ROWS:-$rows}
      [ "$rows" = all ] && rows=
      # T8_SLOTS runs at once on the one GPU (these models leave most of it idle).
      if ! [[ ${T8_SLOTS:-3} =~ ^[1-9][0-9]?$ ]]; then
        say "table8: T8_SLOTS='$T8_SLOTS' is not a number of runs from 1 to 99"; continue
      fi
      slots=0
      for (( k = 1; k < ${T8_SLOTS:-3}; ++k )); do slots+=,0; done
      stage_run table8 400 env SKA_BUILD="$build" scripts/reproduce.sh table8 \
        ${rows:+--rows "$rows"} --epochs "${T8_EPOCHS:-1}" --gpus "$slots" --runs "$runs" \
        --reports "$logs/reports" \
        --data-root fashion_mnist="$PWD/data/fashion_mnist" ${sets[@]+"${sets[@]}"}
      [ $? = 125 ] && continue
      cp "$logs"/reports/table8-*ep.md "$logs"/reports/table8-*ep.html "$out"/ 2>/dev/null
      grep -E "^\| (row|Fashion)" "$logs"/reports/table8-*ep.md 2>/dev/null | tee -a "$summary"
      (cd "$runs" && find . \( -name '*.jsonl' -o -name '*.csv' -o -name '*.log' -o -name '*.png' \
         -o -name 'events.out.tfevents.*' \) -print0 | tar --null -czf "$logs/table8_runs.tar.gz" -T -)
      first=$(find "$runs" -name metrics.jsonl | sort | head -1)
      if [ -n "$first" ] && python3 -c 'import tensorboard' 2>/dev/null; then
        stage_run tensorboard 60 python3 scripts/tensorboard_check.py "$(dirname "$first")"
        [ $? = 125 ] || sed 's/^/  /' "$logs/tensorboard.log" | tee -a "$summary"
      fi
    else
      say "table8: skipped, no data/fashion_mnist/*.gz carried"
    fi ;;
  memcheck)
    command -v compute-sanitizer >/dev/null || { say "memcheck: skipped, no compute-sanitizer"; continue; }
    # Whole blocks: memcheck sees each tensor's own cudaMalloc bounds (gpu_check.sh says why).
    SKA_CUDA_ALLOCATOR=whole_blocks stage_run memcheck 300 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 99 \
      "$tests" "cuda attention*,fused attention: CUDA*,cuda elementwise*,CUDA pointwise ops match the CPU,CUDA column reductions*,CUDA norms match the CPU,cuda batch norm*,dropout on CUDA*,cuda layer norm*,cuda add_layer_norm*,cuda depthwise conv*,scaled_residual on CUDA*,scaled_residual with a dropout of y on CUDA*,dropout_add on CUDA*,talking_heads_softmax on CUDA*,multi_cast on CUDA*,CUDA gemm and column sums*,cuda conv logits*"
    [ $? = 125 ] && continue
    say "  $(grep -E 'ERROR SUMMARY' "$logs/memcheck.log" | tail -1)"
    # The asynchronous tile copies of the attention and conv-logit kernels: a missing wait or
    # barrier is a shared-memory race.
    stage_run racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 99 "$tests" \
      "cuda attention: synchronous tile loads*,cuda attention: tensor cores, head dims*,cuda conv logits: the kernels repeat*,cuda conv logits: grad_w by filter rows*,CUDA column reductions*"
    [ $? = 125 ] && continue
    say "  racecheck: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$logs/racecheck.log" | tail -1)" ;;
  esac
done
say "done in $(( SECONDS - start )) s"
