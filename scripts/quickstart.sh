#!/usr/bin/env bash
# The quick start: installs what is missing, builds (Release, CPU is enough) and trains the small
# CSKA-ViT of configs/quickstart.yaml on Fashion-MNIST (Debian's dataset-fashion-mnist) on the CPU.
# Ends with: quickstart: test top-1 XX.XX% after N s (run dir: PATH)
# Environment: BUILD_DIR (default build), SKA_CUDA (default OFF here), JOBS, extra train arguments
# after the script name (e.g. scripts/quickstart.sh --set train.epochs=1).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build_dir="${BUILD_DIR:-build}"

scripts/setup.sh
if ! [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "quickstart: installing dataset-fashion-mnist"
  $sudo apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null
fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSKA_CUDA="${SKA_CUDA:-OFF}" >/dev/null
cmake --build "$build_dir" --target train ${JOBS:+-j "$JOBS"}

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$(date +%s)
"$build_dir/apps/train" --config quickstart "$@" | tee "$log"
end=$(date +%s)

# The train command's summary: "train: final top-1 X% ... (run dir: PATH)".
summary="$(grep '^train: final top-1' "$log" | tail -1)"
top1="$(sed -E 's/^train: final top-1 ([0-9.]+)%.*/\1/' <<<"$summary")"
run_dir="$(sed -E 's/.*\(run dir: (.*)\)$/\1/' <<<"$summary")"
echo "quickstart: test top-1 ${top1}% after $((end - start)) s (run dir: ${run_dir})"
