#!/usr/bin/env bash
# Runs apps/benchmark_ops and its PyTorch twin (scripts/benchmark_ops.py) on the same cases and
# thread count, and prints a side-by-side table: case, ours, torch, ratio (ours / torch rate).
# Usage: scripts/benchmark_ops.sh [--device cpu|cuda|all] [--dtype f32|bf16] [--cases A,B]
# Environment: BUILD_DIR (default build), where benchmark_ops was built.
set -euo pipefail
cd "$(dirname "$0")/.."

bench=${BUILD_DIR:-build}/apps/benchmark_ops
if [ ! -x "$bench" ]; then
  echo "benchmark_ops.sh: $bench not found; build it first (cmake --build ${BUILD_DIR:-build})" >&2
  exit 1
fi

py=$(scripts/torch_python.sh) || exit 1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bench" --json "$@" >"$tmp/ours.jsonl"
threads=$("$py" -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(next((r["threads"] for r in rows if "threads" in r), 0))' "$tmp/ours.jsonl")
threads_arg=()
[ "$threads" -gt 0 ] && threads_arg=(--threads "$threads")
"$py" scripts/benchmark_ops.py --json "${threads_arg[@]}" "$@" >"$tmp/torch.jsonl"

"$py" - "$tmp/ours.jsonl" "$tmp/torch.jsonl" "$threads" <<'EOF'
import json, sys

def load(path):
    rows = {}
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            if "error" not in r:
                rows[(r["case"], r["device"].split(":")[0])] = r
    return rows

ours, torch_rows, threads = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]

def rate(r):
    return f"{r['rate']:9.2f} {r['unit'].replace('FLOP', 'F'):<6}" if r else f"{'n/a':>16}"

print(f"# ours vs PyTorch, {threads} CPU threads each; ratio = ours / torch (> 1: ours faster)")
print(f"{'case':<20} {'dev':<4} {'dtype':<5} {'shape':<34} {'ours':>16} {'torch':>16} {'ratio':>6}")
keys = list(ours) + [k for k in torch_rows if k not in ours]  # our case order first
for key in keys:
    o, t = ours.get(key), torch_rows.get(key)
    ref = o or t
    ratio = f"{o['rate'] / t['rate']:6.2f}" if o and t and t["rate"] > 0 else f"{'-':>6}"
    note = "" if not (o and t) or o["shape"] == t["shape"] else "  SHAPE MISMATCH"
    print(f"{key[0]:<20} {key[1]:<4} {ref['dtype']:<5} {ref['shape']:<34} {rate(o)} {rate(t)} "
          f"{ratio}{note}")
EOF
