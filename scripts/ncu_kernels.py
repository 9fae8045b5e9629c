#!/usr/bin/env python3
"""Sums Nsight Compute's kernel durations (and DRAM traffic) by kernel: gpu_kernels.sh's table.

Input: the CSV that `ncu --csv --print-units base --metrics gpu__time_duration.sum[,
dram__bytes_read.sum,dram__bytes_write.sum]` writes (its own "==PROF==" lines and the program's
output may come first; the table starts at the header line naming "Kernel Name"). Each launch
(the "ID" column) has a row per metric; the launches of --steps training steps are summed per
kernel (name without namespaces and parameters, template arguments kept) and divided by the
steps. Prints, the longest first, each kernel's launches and GPU microseconds per step and its
share of the step's GPU time; with the DRAM metrics also its bytes moved per step, the bandwidth
it reached and, against --peak-gbs (the GPU's DRAM bandwidth), the share of it and the
microseconds it spends beyond moving its bytes at that peak ("over"): a memory-bound kernel far
from the peak has room, one near it does not (its FLOPs aside). Then the GPU time per step, and
with --wall-ms the share of the step's wall-clock time the GPU was busy (the rest: the host
launching kernels).
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


METRICS = {"gpu__time_duration.sum": "time", "dram__bytes_read.sum": "read",
           "dram__bytes_write.sum": "write"}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def launches(rows):
    """{launch id: (kernel name, {"time": us, "read": bytes, "write": bytes})} from ncu's rows."""
    out = {}
    for n, row in enumerate(rows):
        metric = METRICS.get((row.get("Metric Name") or "").strip())
        if metric is None:
            continue
        unit = (row.get("Metric Unit") or "").strip()
        value = float(row["Metric Value"].replace(",", ""))
        if metric == "time":
            if unit not in UNITS:
                raise SystemExit(f"ncu_kernels: unknown time unit '{unit}'")
            value *= UNITS[unit]
        else:
            if unit not in BYTES:
                raise SystemExit(f"ncu_kernels: unknown byte unit '{unit}'")
            value *= BYTES[unit]
        key = (row.get("ID") or "").strip() or f"row {n}"
        name, values = out.setdefault(key, (short_name(row["Kernel Name"]), {}))
        values[metric] = values.get(metric, 0.0) + value
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu's CSV output (a file, or - for stdin)")
    ap.add_argument("--steps", type=int, default=1, help="training steps the launches cover")
    ap.add_argument("--top", type=int, default=30, help="kernels listed")
    ap.add_argument("--wall-ms", type=float, default=0.0,
                    help="the step's wall-clock time without ncu, for the GPU's busy share")
    ap.add_argument("--peak-gbs", type=float, default=0.0,
                    help="the GPU's DRAM bandwidth in GB/s, for the bandwidth columns")
    ap.add_argument("--json", help="also write the table as JSON to this file")
    args = ap.parse_args()
    text = sys.stdin.read() if args.csv == "-" else open(args.csv, errors="replace").read()
    totals = {}  # name -> [launches, us, bytes]
    with_bytes = False
    for name, values in launches(read_rows(text)).values():
        if "time" not in values:
            continue
        entry = totals.setdefault(name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += values["time"]
        if "read" in values or "write" in values:
            with_bytes = True
            entry[2] += values.get("read", 0.0) + values.get("write", 0.0)
    if not totals:
        raise SystemExit("ncu_kernels: no gpu__time_duration.sum rows")
    steps = max(args.steps, 1)
    gpu_us = sum(us for _, us, _ in totals.values()) / steps
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])
    peak = args.peak_gbs if with_bytes else 0.0

    def over_us(us, nbytes):  # beyond moving the bytes at the peak bandwidth
        return max(us - nbytes / (peak * 1e3), 0.0) if peak > 0 else 0.0

    header = f"{'kernel':<64} {'calls/step':>10} {'us/step':>10} {'share':>7}"
    if with_bytes:
        header += f" {'MB/step':>9} {'GB/s':>7}"
        if peak > 0:
            header += f" {'of peak':>7} {'over us':>9}"
    print(header)
    for name, (calls, us, nbytes) in ranked[:args.top]:
        line = (f"{name[:64]:<64} {calls / steps:>10.1f} {us / steps:>10.1f} "
                f"{100.0 * us / steps / gpu_us:>6.1f}%")
        if with_bytes:
            gbs = nbytes / (us * 1e3) if us > 0 else 0.0
            line += f" {nbytes / steps / 1e6:>9.1f} {gbs:>7.0f}"
            if peak > 0:
                line += f" {100.0 * gbs / peak:>6.0f}% {over_us(us, nbytes) / steps:>9.1f}"
        print(line)
    total_launches = sum(c for c, _, _ in totals.values()) / steps
    line = f"GPU time per step: {gpu_us / 1000.0:.3f} ms in {total_launches:.0f} kernel launches"
    if args.wall_ms > 0:
        line += (f"; wall-clock step {args.wall_ms:.3f} ms, the GPU busy "
                 f"{100.0 * gpu_us / 1000.0 / args.wall_ms:.0f}% of it")
    print(line)
    if peak > 0:
        over = sum(over_us(us, b) for _, us, b in totals.values()) / steps
        moved = sum(b for _, _, b in totals.values()) / steps
        print(f"DRAM traffic per step: {moved / 1e9:.2f} GB, {moved / (peak * 1e3) / 1000.0:.3f} ms "
              f"at the peak {peak:.0f} GB/s; the kernels spend {over / 1000.0:.3f} ms beyond it")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"gpu_ms_per_step": gpu_us / 1000.0, "launches_per_step": total_launches,
                       "wall_ms": args.wall_ms or None, "peak_gbs": peak or None,
                       "kernels": [{"name": n, "calls_per_step": c / steps,
                                    "us_per_step": u / steps,
                                    "bytes_per_step": b / steps if with_bytes else None}
                                   for n, (c, u, b) in ranked]}, out, indent=1)


if __name__ == "__main__":
    main()
