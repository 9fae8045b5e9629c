#!/usr/bin/env bash
# The ImageNet input pipeline, ours beside the PyTorch reference in one run: benchmark_loader on
# synthetic ImageNet-like JPEGs (or --images DIR) with the MetaFormer recipe's augmentation, then
# Pillow + timm's training transform (torchvision's RandAugment without timm) on the same files,
# one thread (scripts/benchmark_loader_reference.py). Prints the date, the CPU and both.
# Usage: scripts/benchmark_loader.sh [benchmark_loader options: --workers 1,2 --seconds 10 ...]
# Environment: BUILD_DIR (default build), PYTHON, REFERENCE_SECONDS (default 10 per measurement).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
python=$(scripts/torch_python.sh)
folder=$(mktemp -d)
trap 'rm -rf "$folder"' EXIT
echo "# $(date -I), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
images="" prev=""
for a in "$@"; do [ "$prev" = --images ] && images=$a; prev=$a; done
args=("$@")
[ -n "$images" ] || args+=(--synthetic 256 --keep)
"$build/apps/benchmark_loader" "${args[@]}" 2> >(tee "$folder/stderr" >&2)
if [ -z "$images" ]; then
  images=$(sed -n 's/^writing .* synthetic JPEGs to //p' "$folder/stderr")
  trap 'rm -rf "$folder" "$images"' EXIT
fi
"$python" scripts/benchmark_loader_reference.py "$images" "${REFERENCE_SECONDS:-10}"
