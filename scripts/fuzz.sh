#!/usr/bin/env bash
# Builds (if needed) and runs one libFuzzer target: scripts/fuzz.sh TARGET [SECONDS]
# TARGET: config weight_map safetensors train_state idx cifar svhn_mat npy image, or "list".
# The build goes to build-fuzz (clang, -DSKA_FUZZ=ON: ASan + UBSan + coverage); the run starts
# from the committed seeds in fuzz/corpus/TARGET and keeps what it learns in build-fuzz/corpus/
# (never in the repository). A finding (crash, sanitizer report, uncaught non-ska exception,
# timeout > 10 s, > 2 GB RSS or one allocation > 2 GB) is written to build-fuzz/findings/TARGET/
# and fails the run. Environment: BUILD_DIR (default build-fuzz), JOBS (default: all cores),
# FUZZ_ARGS (more libFuzzer flags, e.g. "-jobs=2").
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:?usage: scripts/fuzz.sh TARGET [SECONDS]}
seconds=${2:-60}
dir=${BUILD_DIR:-build-fuzz}
targets=(config weight_map safetensors train_state idx cifar svhn_mat npy image)
if [ "$target" = list ]; then printf '%s\n' "${targets[@]}"; exit 0; fi
[[ " ${targets[*]} " == *" $target "* ]] || { echo "fuzz: unknown target '$target'; known: ${targets[*]}" >&2; exit 2; }

export CCACHE_NOHASHDIR=true CCACHE_BASEDIR=$PWD
if [ ! -f "$dir/build.ninja" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja "${launcher[@]}" -DSKA_FUZZ=ON -DSKA_CUDA=OFF \
    -DSKA_BUILD_TESTS=OFF -DSKA_BUILD_BENCHMARKS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$dir" -j "${JOBS:-$(nproc)}" --target "fuzz_$target" | grep -v "^\[\|^ninja: no work" || true
[ -x "$dir/fuzz/fuzz_$target" ] || { echo "fuzz: fuzz_$target did not build" >&2; exit 1; }

corpus=$dir/corpus/$target findings=$dir/findings/$target
mkdir -p "$corpus" "$findings"
echo "== fuzz $target for ${seconds}s"
log=$dir/fuzz_$target.log
set +e
# shellcheck disable=SC2086
"$dir/fuzz/fuzz_$target" "$corpus" "fuzz/corpus/$target" -max_total_time="$seconds" \
  -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$findings/" ${FUZZ_ARGS:-} >"$log" 2>&1
status=$?
set -e
tail -n "${FUZZ_TAIL:-40}" "$log"
if [ "$status" -ne 0 ]; then
  # The report itself, however short FUZZ_TAIL is: the error, the first frames, the input.
  echo "-- the finding (whole log: $log)" >&2
  grep -m1 -A30 -E '^==[0-9]+== ?ERROR|ERROR: libFuzzer|runtime error:|uncaught|deadly signal' "$log" >&2 || true
  grep -E '^(artifact_prefix|Base64):' "$log" >&2 || true
  echo "fuzz: $target: finding (exit $status), see $findings/" >&2
fi
exit "$status"
