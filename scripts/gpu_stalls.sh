#!/usr/bin/env bash
# Why the kernels of our training step take the time they take, from Nsight Compute: for the
# kernels whose names match MATCH (default: the fused attention's and the layer norms'), in one
# bf16 training step of each CONFIG[:BATCH], their registers, the blocks an SM holds and what
# limits them, the warps per SM (theoretical and achieved), the issue rate, the tensor pipe's,
# DRAM's and the SM's busy shares, and the warp stall reasons that make up the cycles between two
# instructions (scripts/ncu_stalls.py explains the columns). Each VARIANTS entry is a run with
# those benchmark flags, so that kernel choices can be compared side by side.
# Usage: scripts/gpu_stalls.sh [CONFIG[:BATCH] ...]      default: cifar10_vit_s:512
# Environment: BUILD_DIR (default build-gpu), MATCH (an ncu kernel-name regex, default
# "mma_|wmma_|attention_|layer_norm"), VARIANTS (benchmark flag sets separated by ";", an empty
# one for the defaults; default ";--attention-registers capped;--attention-schedule persistent;
# --attention-backward one_pass"),
# TOP (kernels listed, default 20), NCU (default ncu), OUT (logs, CSV and JSON; default
# BUILD_DIR/logs). Exits 1 when a run or ncu fails.
set -uo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build-gpu}
regex=${MATCH:-mma_|wmma_|attention_|layer_norm}
variants=${VARIANTS-;--attention-registers capped;--attention-schedule persistent;--attention-backward one_pass}
top=${TOP:-20}
ncu=${NCU:-ncu}
logs=${OUT:-$build/logs}
mkdir -p "$logs"
bench=$build/apps/benchmark
[ -x "$bench" ] || { echo "gpu_stalls: $bench not found (scripts/gpu_check.sh builds it)" >&2; exit 1; }
command -v "$ncu" >/dev/null || { echo "gpu_stalls: $ncu not found (Nsight Compute)" >&2; exit 1; }
[ $# -gt 0 ] || set -- cifar10_vit_s:512
all_metrics=$(python3 scripts/ncu_stalls.py --metrics all) || exit 1
core_metrics=$(python3 scripts/ncu_stalls.py --metrics core) || exit 1

status=0
n=0
for item in "$@"; do
  config=${item%%:*}
  batch=${item#*:}
  [ "$batch" = "$item" ] && batch=128
  IFS=';' read -r -a sets <<<"$variants"
  [ ${#sets[@]} -gt 0 ] || sets=("")
  for flags in "${sets[@]}"; do
    n=$((n + 1))
    read -r -a extra <<<"$flags"
    base=$logs/stalls_${config}_$n
    echo "== $config, batch $batch, ${flags:-the default kernels}"
    run_ncu() {  # METRICS: one training step's matching kernels under ncu
      "$ncu" --profile-from-start off --kernel-name "regex:$regex" --metrics "$1" --csv \
        --print-units base --log-file "$base.csv" \
        "$bench" --config "$config" --device cuda --precision bf16 --batch "$batch" \
        --mode train "${extra[@]}" --warmup 3 --iters 1 --capture-range >"$base.out" 2>&1
    }
    # A metric this ncu does not know fails the whole run: the ones it names are left out and the
    # run repeated (five times at most); a failure that names none leaves the table's core
    # metrics (less those named) for a last try.
    metrics=$all_metrics
    unknown_all=""
    ok=0
    for attempt in 1 2 3 4 5 6; do
      if run_ncu "$metrics"; then ok=1; break; fi
      unknown=$(cat "$base.out" "$base.csv" 2>/dev/null | grep -i "failed to find metric" |
                grep -o '[a-z0-9_]*__[A-Za-z0-9_.]*' | sort -u)
      [ -n "$unknown" ] || { [ "$metrics" = "$core_metrics" ] && break; metrics=$core_metrics; }
      for m in $unknown; do
        echo "gpu_stalls: this ncu has no metric $m; leaving it out"
        unknown_all+=" $m"
      done
      for m in $unknown_all; do
        metrics=$(tr ',' '\n' <<<"$metrics" | grep -vxF "$m" | paste -sd, -)
      done
    done
    if [ $ok = 0 ]; then
      echo "gpu_stalls: ncu failed for $config${flags:+ $flags}:"
      for f in "$base.out" "$base.csv"; do [ -f "$f" ] && tail -5 "$f"; done
      status=1
      continue
    fi
    python3 scripts/ncu_stalls.py "$base.csv" --top "$top" --json "$base.json" || status=1
  done
done
exit $status
