#!/usr/bin/env bash
# CPU training throughput under a fixed background load: the quick-start model for one epoch of
# 1024 images, with LOAD busy processes (`yes`, default one per core) beside it, under three
# OpenMP wait settings: libgomp's default spin (GOMP_SPINCOUNT=300000), ours (10000, what the
# apps set when the user sets nothing) and passive waiting. Then the same with no load.
# Usage: scripts/benchmark_cpu_load.sh [BUILD_DIR]   (BUILD_DIR default: build)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
load=${LOAD:-$(nproc)}
out=$(mktemp -d)
trap 'rm -rf "$out"; kill $(jobs -p) 2>/dev/null' EXIT

run() {  # run LABEL ENV...: prints the epoch's images/s
  rm -rf "$out/run"
  local rate
  rate=$(env "${@:2}" timeout -k 15 300 "$build/apps/train" --config quickstart --set train.epochs=1 \
           --set data.train_subset=1024 --set data.eval_subset=100 --output "$out/run" 2>&1 |
         grep -oE '[0-9.]+ img/s' | head -1)
  printf '  %-34s %s\n' "$1" "${rate:-failed}"
}

settings() {
  run "GOMP_SPINCOUNT=300000 (libgomp)" GOMP_SPINCOUNT=300000
  run "GOMP_SPINCOUNT=10000 (our default)" GOMP_SPINCOUNT=10000
  run "OMP_WAIT_POLICY=passive" OMP_WAIT_POLICY=passive
}

echo "$(date -I), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
echo "with $load busy processes beside it:"
for _ in $(seq "$load"); do yes >/dev/null & done
settings
kill $(jobs -p) 2>/dev/null
wait 2>/dev/null
echo "idle:"
settings
