#!/usr/bin/env bash
# What each of our CUDA kernels takes of an SM, by ptxas: registers a thread, spill stores and
# loads, stack frame and static shared memory, per instantiation, without a GPU (nvcc alone).
# With the block size and dynamic shared memory of a launch, the registers give how many blocks
# an SM holds: floor(65536 / (ceil(registers / 8) * 8 * threads)) on sm_80 and sm_90 (the
# README's occupancy figures come from this table).
# Usage: scripts/kernel_resources.sh [FILE.cu ...]   (default: every cuda/kernels/*.cu)
# Environment: ARCH (default sm_90), NVCC (default /usr/local/cuda/bin/nvcc, else nvcc on PATH),
# MATCH (a grep -E pattern on the demangled kernel names, e.g. "one_block|one_pass"),
# SPILLS=1 (only the kernels that spill), JOBS (parallel compiles, default 2).
# Prints one line a kernel: file, registers, spill stores/loads (bytes), stack (bytes), static
# smem (bytes), kernel; exits 1 when a compile fails.
set -uo pipefail
cd "$(dirname "$0")/.."

arch=${ARCH:-sm_90}
nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; else nvcc=nvcc; fi
fi
command -v "$nvcc" >/dev/null || { echo "kernel_resources: $nvcc not found (the CUDA toolkit)" >&2; exit 1; }
command -v c++filt >/dev/null || { echo "kernel_resources: c++filt not found (binutils)" >&2; exit 1; }
[ $# -gt 0 ] || set -- cuda/kernels/*.cu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The flags of the project's CUDA build (cuda/CMakeLists.txt), ptxas verbose, no object kept.
compile() {
  local f=$1 log=$2
  "$nvcc" -O3 -DNDEBUG -DSKA_WITH_CUDA --generate-code=arch=compute_${arch#sm_},code=$arch \
    --expt-relaxed-constexpr -std=c++17 -Isrc -I. -Xptxas -v -c "$f" -o /dev/null >"$log" 2>&1
}
export -f compile
export nvcc arch
status=0
printf '%s\n' "$@" | xargs -P "${JOBS:-2}" -I{} bash -c 'compile "$1" "$2/$(basename "$1").log" || { echo "kernel_resources: $1 did not compile:" >&2; tail -5 "$2/$(basename "$1").log" >&2; exit 1; }' _ {} "$work" || status=1

printf '%-22s %5s %13s %6s %6s  %s\n' file regs spill_st/ld stack smem kernel
for f in "$@"; do
  log=$work/$(basename "$f").log
  [ -f "$log" ] || continue
  # One record per entry function: its mangled name, then its properties and resource lines.
  awk -v file="$(basename "$f")" '
    /Compiling entry function/ { match($0, /'\''[^'\'']*'\''/); name = substr($0, RSTART + 1, RLENGTH - 2) }
    /bytes stack frame/ {
      stack = $1; st = $5; ld = $9
    }
    /Used [0-9]+ registers/ {
      regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
      smem = 0
      if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", smem) }
      print file "\t" regs "\t" st "/" ld "\t" stack "\t" smem "\t" name
      stack = 0; st = 0; ld = 0
    }' "$log"
done | while IFS=$'\t' read -r file regs spills stack smem name; do
  kernel=$(printf '%s\n' "$name" | c++filt | sed -E 's/\(anonymous namespace\):://g; s/ska::(cuda::)?(attn::)?//g; s/\(.*$//')
  [ -n "${MATCH:-}" ] && ! printf '%s\n' "$kernel" | grep -Eq "$MATCH" && continue
  [ "${SPILLS:-0}" = 1 ] && [ "$spills" = "0/0" ] && continue
  printf '%-22s %5s %13s %6s %6s  %s\n' "$file" "$regs" "$spills" "$stack" "$smem" "$kernel"
done
exit $status
