#!/usr/bin/env bash
# One command per table of the paper: trains every config of TABLE (configs/paper_results.json)
# into runs/<table>/<config>, resuming interrupted runs, then writes reports/<table>.{md,html}.
#
# Usage: scripts/reproduce.sh TABLE [--rows a,b] [--epochs N] [--seeds S,S,..] [--gpus 0,1,2,3]
#            [--nproc-per-node N] [--device cpu|cuda] [--runs DIR] [--reports DIR]
#            [--data-root DATASET=PATH ...] [--dry-run] [--set k=v ...]
#   TABLE              table1 table2 table4 table5 table8 table8-mini
#   --rows a,b         only these configs (names as in `--list`: cifar10_vit_s,...)
#   --epochs N         a shortened schedule: --set train.epochs=N, runs in runs/<table>-<N>ep/ and
#                      the report reports/<table>-<N>ep.* (never mixed with full-schedule runs)
#   --seeds 1,2,3      each row once per seed (train.seed), in <config>-seed<S>; the report gives
#                      the mean and standard deviation over the seeds and each seed's figure
#   --gpus 0,1,..      one run per GPU at a time (CUDA_VISIBLE_DEVICES), runs in parallel; a GPU
#                      named k times takes k runs at once (0,0,0: three small models that would
#                      each leave the GPU idle between kernels); with --nproc-per-node the runs
#                      go one after another on all these GPUs
#   --nproc-per-node N each run data-parallel over N workers (train --nproc-per-node)
#   --device           default: cuda when --gpus is given or nvidia-smi sees a GPU, else cpu
#   --runs DIR         where the run folders go (default runs)
#   --reports DIR      where the report goes (default reports)
#   --data-root D=PATH data.root of the rows whose data.dataset is D (cifar10, cifar100, svhn,
#                      fashion_mnist, imagenet); repeat for a table of several datasets. Without
#                      it a row reads data/<dataset>, as train does
#   --dry-run          print the commands, run nothing
# Environment: SKA_BUILD (default: build) holds apps/train, apps/summary and apps/benchmark.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${SKA_BUILD:-build}"
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
fail() { echo "reproduce.sh: $*" >&2; exit 2; }

TABLE="" ROWS="" EPOCHS="" SEEDS="" GPUS="" NPROC=1 DEVICE="" RUNS="runs" REPORTS="reports" DRY=0
SETS=()
declare -A DATA_ROOT=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --rows) ROWS="${2:?--rows needs a value}"; shift 2 ;;
    --epochs) EPOCHS="${2:?--epochs needs a value}"; shift 2 ;;
    --seeds) SEEDS="${2:?--seeds needs a value}"; shift 2 ;;
    --gpus) GPUS="${2:?--gpus needs a value}"; shift 2 ;;
    --nproc-per-node) NPROC="${2:?--nproc-per-node needs a value}"; shift 2 ;;
    --device) DEVICE="${2:?--device needs a value}"; shift 2 ;;
    --runs) RUNS="${2:?--runs needs a value}"; shift 2 ;;
    --reports) REPORTS="${2:?--reports needs a value}"; shift 2 ;;
    --data-root)
      [[ "${2:-}" =~ ^([a-z0-9_]+)=(.+)$ ]] || fail "--data-root '${2:-}' is not DATASET=PATH"
      DATA_ROOT[${BASH_REMATCH[1]}]="${BASH_REMATCH[2]}"; shift 2 ;;
    --set) SETS+=(--set "${2:?--set needs k=v}"); shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -*) fail "unknown option '$1' (see --help)" ;;
    *) [[ -z "$TABLE" ]] || fail "one TABLE only (got '$TABLE' and '$1')"; TABLE="$1"; shift ;;
  esac
done
[[ -n "$TABLE" ]] || usage 2
[[ -z "$EPOCHS" || "$EPOCHS" =~ ^[1-9][0-9]*$ ]] || fail "--epochs '$EPOCHS' is not a positive integer"
[[ -z "$SEEDS" || "$SEEDS" =~ ^[0-9]+(,[0-9]+)*$ ]] || fail "--seeds '$SEEDS' is not a list like 1,2,3"
[[ -z "$SEEDS" || -z "$(tr ',' '\n' <<<"$SEEDS" | sort | uniq -d)" ]] || fail "--seeds '$SEEDS' repeats a seed"
[[ "$NPROC" =~ ^[1-9][0-9]*$ ]] || fail "--nproc-per-node '$NPROC' is not a positive integer"
[[ -z "$GPUS" || "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]] || fail "--gpus '$GPUS' is not a list like 0,1,2"
if [[ -z "$DEVICE" ]]; then
  if [[ -n "$GPUS" ]] || nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi

REPORT=(python3 "$ROOT/scripts/report.py")
CONFIGS="$("${REPORT[@]}" --list "$TABLE" ${ROWS:+--rows "$ROWS"})" || exit 2
NAME="$TABLE${EPOCHS:+-${EPOCHS}ep}"
TRAIN="$BUILD/apps/train"
[[ $DRY -eq 1 || -x "$TRAIN" ]] || fail "$TRAIN is not built (cmake --build $BUILD --target train summary benchmark, or set SKA_BUILD)"

# data.dataset of a config file, following its include: lines ("" when none says).
dataset_of() {
  local file="$1" found="" inc
  found="$(sed -n 's/^[[:space:]]*dataset:[[:space:]]*\([A-Za-z0-9_]*\).*/\1/p' "$file" | head -n 1)"
  if [[ -z "$found" ]]; then
    for inc in $(sed -n 's/^include:[[:space:]]*\[\{0,1\}\([^]#]*\).*/\1/p' "$file" | tr ',' ' '); do
      [[ -f "$(dirname "$file")/$inc" ]] || continue
      found="$(dataset_of "$(dirname "$file")/$inc")"
      [[ -n "$found" ]] && break
    done
  fi
  echo "$found"
}
for dataset in "${!DATA_ROOT[@]}"; do
  case "$dataset" in cifar10|cifar100|svhn|fashion_mnist|imagenet) ;;
    *) fail "--data-root: unknown dataset '$dataset' (cifar10, cifar100, svhn, fashion_mnist, imagenet)" ;;
  esac
done

# The train command of one config (and seed, or "" for the config's own), as an array in CMD.
make_command() {
  local config="$1" out="$2" seed="$3" dataset
  CMD=("$TRAIN" --config "$ROOT/configs/$config.yaml" --output "$out" --resume auto --device "$DEVICE")
  [[ "$NPROC" -gt 1 ]] && CMD+=(--nproc-per-node "$NPROC")
  [[ -n "$EPOCHS" ]] && CMD+=(--set "train.epochs=$EPOCHS")
  [[ -n "$seed" ]] && CMD+=(--set "train.seed=$seed")
  dataset="$(dataset_of "$ROOT/configs/$config.yaml")"
  [[ -n "$dataset" && -n "${DATA_ROOT[$dataset]:-}" ]] && CMD+=(--set "data.root=${DATA_ROOT[$dataset]}")
  CMD+=("${SETS[@]+"${SETS[@]}"}")
  return 0
}

read -r -a SLOTS <<<"${GPUS//,/ }"  # the GPU of each slot; a GPU may have several
SLOT_PID=() PIDS=() FAILED=0 CURRENT=""  # CURRENT: the row running in the foreground
# Starts CMD in the background in a free slot of --gpus (waiting for one), or runs it here.
launch() {
  local out="$1" slot=""
  if [[ -n "$GPUS" && "$NPROC" -eq 1 ]]; then
    while [[ -z "$slot" ]]; do
      for s in "${!SLOTS[@]}"; do
        local pid="${SLOT_PID[$s]:-}"
        if [[ -z "$pid" ]] || ! kill -0 "$pid" 2>/dev/null; then slot="$s"; break; fi
      done
      [[ -n "$slot" ]] || sleep 1
    done
    local gpu="${SLOTS[$slot]}"
    echo "reproduce.sh: $(basename "$out") on GPU $gpu (console: $out.console.log)"
    CUDA_VISIBLE_DEVICES="$gpu" "${CMD[@]}" >"$out.console.log" 2>&1 &
    SLOT_PID[$slot]=$!
    PIDS+=($!)
  else
    echo "reproduce.sh: $(basename "$out") (console: $out.console.log)"
    # In the background and waited for, so that a signal reaches the trap below at once.
    env ${GPUS:+CUDA_VISIBLE_DEVICES="$GPUS"} "${CMD[@]}" >"$out.console.log" 2>&1 &
    CURRENT=$!
    if ! wait "$CURRENT"; then
      echo "reproduce.sh: $(basename "$out") failed; see $out.console.log" >&2
      FAILED=$((FAILED + 1))
    fi
  fi
}

# Ctrl-C or SIGTERM: every running row writes a checkpoint and stops (train's own handling of
# SIGTERM); the same command later continues them.
interrupted() {
  trap - INT TERM
  echo "reproduce.sh: $1: stopping the running rows (each writes a checkpoint); run the same" \
       "command again to continue" >&2
  for pid in "${PIDS[@]+"${PIDS[@]}"}" $CURRENT; do kill -TERM "$pid" 2>/dev/null || true; done
  wait || true
  exit $((128 + $(kill -l "$1")))
}
trap 'interrupted INT' INT
trap 'interrupted TERM' TERM

read -r -a SEED_LIST <<<"${SEEDS//,/ }"
[[ ${#SEED_LIST[@]} -gt 0 ]] || SEED_LIST=("")
for config in $CONFIGS; do
  for seed in "${SEED_LIST[@]}"; do
    out="$RUNS/$NAME/$(basename "$config")${seed:+-seed$seed}"
    status="$("${REPORT[@]}" --status "$out")"
    if [[ "$status" == finished ]]; then
      echo "reproduce.sh: $(basename "$out") finished already ($out); skipped"
      continue
    fi
    make_command "$config" "$out" "$seed"
    if [[ $DRY -eq 1 ]]; then
      printf '%s' "${GPUS:+CUDA_VISIBLE_DEVICES=<one of $GPUS> }"
      printf '%q ' "${CMD[@]}"
      echo "  # $status"
      continue
    fi
    mkdir -p "$RUNS/$NAME"
    launch "$out"
  done
done
for pid in "${PIDS[@]+"${PIDS[@]}"}"; do
  wait "$pid" || FAILED=$((FAILED + 1))
done

REPORT_CMD=("${REPORT[@]}" "$TABLE" --name "$NAME" --runs "$RUNS" --out "$REPORTS" --build "$BUILD"
            ${ROWS:+--rows "$ROWS"} ${SEEDS:+--seeds "$SEEDS"})
[[ ${#SETS[@]} -eq 0 ]] || REPORT_CMD+=(--overrides "${SETS[*]}")
if [[ $DRY -eq 1 ]]; then
  printf '%q ' "${REPORT_CMD[@]}"
  echo
  exit 0
fi
SKA_BUILD="$BUILD" "${REPORT_CMD[@]}"
[[ $FAILED -eq 0 ]] || fail "$FAILED run(s) failed; the report shows how far each got"
