#!/usr/bin/env bash
# The GPU lease scripts against this build, on the CPU: every script parses (bash -n), and every
# kernel-choice variant, form and flag that scripts/gpu_session.sh and scripts/gpu_speed.sh pass
# benchmark (their --print-choices) is one benchmark takes, tried on a 2-image step of the quick
# start model. A renamed key or value fails here, not minutes into a GPU lease.
# Usage: test_gpu_scripts.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
bench=$build/apps/benchmark
[ -x "$bench" ] || { echo "test_gpu_scripts: $bench not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "test_gpu_scripts: $*" >&2; failures=$((failures + 1)); }

for f in "$src"/scripts/gpu_*.sh "$src"/scripts/benchmark*.sh; do
  bash -n "$f" || fail "$f does not parse"
done

# One step of the quick start model on the CPU with the given flags (a flag that is refused
# only for wanting a GPU, --cuda-graph, was understood).
try() {
  if ! "$bench" --config quickstart --device cpu --batch 2 --warmup 0 --iters 1 "$@" \
      >"$tmp/out" 2>&1 && ! grep -q "needs --device cuda" "$tmp/out"; then
    fail "benchmark $* failed: $(tail -2 "$tmp/out")"
  fi
}

checked=0
for script in gpu_session.sh gpu_speed.sh; do
  "$src/scripts/$script" --print-choices >"$tmp/choices" || fail "$script --print-choices failed"
  [ -s "$tmp/choices" ] || fail "$script --print-choices printed nothing"
  while read -r kind rest; do
    case $kind in
      variants) try --variants "$rest" ;;
      option | flags | process)
        read -r -a flags <<<"$rest"
        try "${flags[@]}" ;;
      *) fail "$script --print-choices: unknown line '$kind $rest'" ;;
    esac
    checked=$((checked + 1))
  done <"$tmp/choices"
done
[ "$checked" -ge 10 ] || fail "only $checked choice lines checked"
[ "$failures" = 0 ] || exit 1
echo "test_gpu_scripts: $checked choice lines pass benchmark's checks"
