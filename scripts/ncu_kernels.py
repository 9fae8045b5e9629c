#!/usr/bin/env python3
"""Sums Nsight Compute's kernel durations by kernel: the table scripts/gpu_kernels.sh prints.

Input: the CSV that `ncu --csv --print-units base --metrics gpu__time_duration.sum` writes (its
own "==PROF==" lines and the program's output may come first; the table starts at the header
line naming "Kernel Name"). Each row is one kernel launch; the launches of --steps training steps
are summed per kernel (name without namespaces and parameters, template arguments kept) and
divided by the steps. Prints, the longest first, each kernel's launches and GPU microseconds per
step and its share of the step's GPU time; then the GPU time per step, and with --wall-ms the
share of the step's wall-clock time the GPU was busy (the rest: the host launching kernels).
"""
import argparse
import csv
import io
import json
import sys

UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
         "second": 1e6, "s": 1e6}


def short_name(name):
    """`void a::(anonymous namespace)::k<T, 64>(Args)` -> `k<T, 64>`."""
    name = name.strip().replace("(anonymous namespace)::", "")
    if name.startswith("void "):
        name = name[len("void "):]
    # Drop the parameter list: the last top-level (...) group.
    depth, cut = 0, len(name)
    for i in range(len(name) - 1, -1, -1):
        c = name[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                cut = i
                break
    name = name[:cut] if cut > 0 else name
    # Drop namespaces: the text up to the last "::" outside template brackets.
    depth, start = 0, 0
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == ":" and depth == 0 and name[i:i + 2] == "::":
            start = i + 2
    return name[start:]


def read_rows(text):
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "Kernel Name" in line and "Metric Value" in line:
            return list(csv.DictReader(io.StringIO("\n".join(lines[i:]))))
    raise SystemExit("ncu_kernels: no ncu CSV table (no header with 'Kernel Name' and "
                     "'Metric Value') in the input")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu's CSV output (a file, or - for stdin)")
    ap.add_argument("--steps", type=int, default=1, help="training steps the launches cover")
    ap.add_argument("--top", type=int, default=30, help="kernels listed")
    ap.add_argument("--wall-ms", type=float, default=0.0,
                    help="the step's wall-clock time without ncu, for the GPU's busy share")
    ap.add_argument("--json", help="also write the table as JSON to this file")
    args = ap.parse_args()
    text = sys.stdin.read() if args.csv == "-" else open(args.csv, errors="replace").read()
    totals = {}
    for row in read_rows(text):
        if row.get("Metric Name", "").strip() != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "nsecond").strip()
        if unit not in UNITS:
            raise SystemExit(f"ncu_kernels: unknown time unit '{unit}'")
        us = float(row["Metric Value"].replace(",", "")) * UNITS[unit]
        entry = totals.setdefault(short_name(row["Kernel Name"]), [0, 0.0])
        entry[0] += 1
        entry[1] += us
    if not totals:
        raise SystemExit("ncu_kernels: no gpu__time_duration.sum rows")
    steps = max(args.steps, 1)
    gpu_us = sum(us for _, us in totals.values()) / steps
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])
    print(f"{'kernel':<72} {'calls/step':>10} {'us/step':>10} {'share':>7}")
    for name, (calls, us) in ranked[:args.top]:
        print(f"{name[:72]:<72} {calls / steps:>10.1f} {us / steps:>10.1f} "
              f"{100.0 * us / steps / gpu_us:>6.1f}%")
    launches = sum(c for c, _ in totals.values()) / steps
    line = f"GPU time per step: {gpu_us / 1000.0:.3f} ms in {launches:.0f} kernel launches"
    if args.wall_ms > 0:
        line += (f"; wall-clock step {args.wall_ms:.3f} ms, the GPU busy "
                 f"{100.0 * gpu_us / 1000.0 / args.wall_ms:.0f}% of it")
    print(line)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"gpu_ms_per_step": gpu_us / 1000.0, "launches_per_step": launches,
                       "wall_ms": args.wall_ms or None,
                       "kernels": [{"name": n, "calls_per_step": c / steps, "us_per_step": u / steps}
                                   for n, (c, u) in ranked]}, out, indent=1)


if __name__ == "__main__":
    main()
