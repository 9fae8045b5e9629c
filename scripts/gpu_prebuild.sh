#!/usr/bin/env bash
# Builds, on a machine without a GPU, the CUDA programs a GPU lease runs, and packs them into
# .gpu-build.tar.xz (git-ignored) for scripts/gpu_session.sh: a lease is short (minutes), and
# compiling the kernels there would take a good part of it. The programs are built for one
# architecture (CMAKE_CUDA_ARCHITECTURES, default 90: the H100 and H200), without OpenCV (the GPU
# machine has none; binary datasets, JPEG and PNG still load), and link the Debian libraries that
# ../shared/tools/device-deps.sh packs (with libjpeg and libpng named too:
#   ../shared/tools/device-deps.sh .deps libjpeg62-turbo libjpeg62-turbo-dev libpng16-16 libpng-dev
# ) and the CUDA 13 libraries that machine has.
# Test fixtures and configs are found through the source path compiled in (this checkout's);
# gpu_session.sh makes that path lead to its own checkout.
# The test program runs the other programs from the build folder compiled into it, so the build
# folder is build-gpu, where gpu_session.sh unpacks them.
# Usage: scripts/gpu_prebuild.sh
set -euo pipefail
cd "$(dirname "$0")/.."

build=build-gpu
archive=.gpu-build.tar.xz
programs=(tests/ska_tests apps/train apps/benchmark apps/benchmark_comm apps/benchmark_ops apps/benchmark_loader
          apps/summary apps/inference apps/validate apps/attention_maps apps/export)

[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "gpu_prebuild: nvcc not found (CUDA toolkit)" >&2; exit 1; }
launcher=()
export CCACHE_NOHASHDIR=true CCACHE_BASEDIR=$PWD  # as scripts/test.sh: shares its cache entries
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                                          -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

cmake -S . -B "$build" -G Ninja "${launcher[@]}" -DSKA_CUDA=ON -DSKA_OPENCV=OFF \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}" \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
targets=()
for p in "${programs[@]}"; do targets+=(--target "$(basename "$p")"); done
cmake --build "$build" -j "${JOBS:-$(nproc)}" "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build-gpu/tests" "$stage/build-gpu/apps"
for p in "${programs[@]}"; do
  strip -o "$stage/build-gpu/$p" "$build/$p"
done
# What gpu_session.sh needs to know: where the programs look for configs and fixtures, and
# what they were built from (it builds anew when its checkout's sources differ).
echo "$PWD" >"$stage/build-gpu/SOURCE_DIR"
git rev-parse HEAD >"$stage/build-gpu/COMMIT"
scripts/source_hash.sh >"$stage/build-gpu/SOURCE_HASH"
if ! git diff --quiet HEAD -- src cuda apps tests CMakeLists.txt third_party; then
  echo "dirty" >>"$stage/build-gpu/COMMIT"
  echo "gpu_prebuild: note: built from uncommitted changes" >&2
fi
# xz -9: its 64 MiB window spans the programs, which share most of their code (36 MB at the
# default level, 11 MB so).
tar -C "$stage" -cf - build-gpu | xz -9 -T1 >"$archive"
du -h "$archive" | awk '{print "gpu_prebuild: " $2 ", " $1 " (carry it beside .deps.tar.xz)"}'
