#!/usr/bin/env python3
"""Why kernels are slow, from Nsight Compute: occupancy, issue rate and warp stall reasons.

Input: the CSV that `ncu --csv --print-units base --metrics M1,M2,...` writes for the metrics of
METRICS below (gpu_stalls.sh passes them; the program's own output and ncu's "==PROF==" lines may
come first). Each launch (the "ID" column) has a row per metric. Launches of one kernel (name
without namespaces and parameters, template arguments kept) are averaged. Per kernel it prints:

  calls, us/call   launches and mean GPU microseconds each
  regs, block      registers per thread, threads per block
  blocks/SM        blocks that fit on an SM at once, and what limits them (registers, shared
                   memory, warps, the block limit): the launch's theoretical occupancy
  warps/SM         theoretical and achieved (average active) warps per SM, of 64 on sm_80/sm_90
  issue            instructions issued per cycle per scheduler (1.00 at most)
  tensor, DRAM, SM tensor-pipe busy share; DRAM and SM throughput as a share of their peaks
  cycles/inst      cycles between two instructions of a warp, and the stall reasons that make
                   them up, the largest first: how a warp's time splits (long_scoreboard:
                   waiting for global memory; short_scoreboard: shared memory or special
                   functions; barrier: __syncthreads; mio_throttle: the shared-memory queue full;
                   math_pipe_throttle: the pipe busy; wait: fixed latencies between dependent
                   instructions; not_selected: ready, another warp issued)

A kernel with few warps per SM and most of its cycles in long_scoreboard, barrier or wait is
latency-bound: more warps (fewer registers, less shared memory) or more independent work per warp
is the remedy; one with a busy tensor pipe or math_pipe_throttle is compute-bound. A metric that
ncu reports as "n/a" (unsupported on the GPU) is left blank.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_kernels import UNITS, read_rows, short_name  # noqa: E402

STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
STALLS = ["long_scoreboard", "short_scoreboard", "barrier", "mio_throttle", "lg_throttle",
          "math_pipe_throttle", "wait", "not_selected", "selected", "dispatch_stall",
          "no_instruction", "branch_resolving", "membar", "drain", "imc_miss", "tex_throttle",
          "sleeping", "misc"]
# What the columns read (name in the table -> ncu metric). The first group is what the table
# needs (gpu_stalls.sh falls back to it when ncu rejects a name of the rest).
CORE = {
    "time": "gpu__time_duration.sum",
    "regs": "launch__registers_per_thread",
    "block": "launch__block_size",
    "limit_registers": "launch__occupancy_limit_registers",
    "limit_shared_mem": "launch__occupancy_limit_shared_mem",
    "limit_warps": "launch__occupancy_limit_warps",
    "limit_blocks": "launch__occupancy_limit_blocks",
    "theoretical_pct": "sm__maximum_warps_per_active_cycle_pct",
    "achieved_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue": "smsp__issue_active.avg.per_cycle_active",
    "cycles_per_inst": "smsp__average_warps_active_per_issue_active.ratio",
}
EXTRA = {
    "tensor_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
}
EXTRA.update({"stall_" + s: STALL_PREFIX + s + STALL_SUFFIX for s in STALLS})
METRICS = {**CORE, **EXTRA}
BY_METRIC = {m: k for k, m in METRICS.items()}
MAX_WARPS = 64  # warps an SM holds on sm_80 and sm_90


def number(text):
    """ncu's value, or None for "n/a" and empty cells; thousands separators removed."""
    text = (text or "").strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def per_launch(rows):
    """{launch id: (kernel name, {column: value})} from ncu's rows of METRICS."""
    out = {}
    for n, row in enumerate(rows):
        column = BY_METRIC.get((row.get("Metric Name") or "").strip())
        if column is None:
            continue
        value = number(row.get("Metric Value"))
        if value is None:
            continue
        if column == "time":
            unit = (row.get("Metric Unit") or "").strip()
            if unit not in UNITS:
                raise SystemExit(f"ncu_stalls: unknown time unit '{unit}'")
            value *= UNITS[unit]
        key = (row.get("ID") or "").strip() or f"row {n}"
        out.setdefault(key, (short_name(row["Kernel Name"]), {}))[1][column] = value
    return out


def summarise(launches):
    """[(kernel, {column: mean over its launches, "calls": n})], the most GPU time first."""
    grouped = {}
    for name, values in launches.values():
        grouped.setdefault(name, []).append(values)
    table = []
    for name, runs in grouped.items():
        mean = {"calls": len(runs)}
        for column in METRICS:
            seen = [r[column] for r in runs if column in r]
            if seen:
                mean[column] = sum(seen) / len(seen)
        table.append((name, mean))
    table.sort(key=lambda item: -item[1].get("time", 0.0) * item[1]["calls"])
    return table


def blocks_per_sm(m):
    """(blocks an SM holds, what limits them) from the launch's occupancy limits."""
    limits = {k[len("limit_"):]: m[k] for k in m if k.startswith("limit_")}
    if not limits:
        return None, ""
    least = min(limits.values())
    return least, "/".join(k for k, v in sorted(limits.items()) if v == least)


def stalls_of(m, top):
    """The `top` largest stall reasons as (reason, cycles per issued instruction)."""
    found = [(k[len("stall_"):], v) for k, v in m.items() if k.startswith("stall_") and v > 0]
    return sorted(found, key=lambda kv: -kv[1])[:top]


def fmt(value, spec, unit=""):
    return "-" if value is None else format(value, spec) + unit


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", help="ncu's CSV output (a file, or - for stdin)")
    ap.add_argument("--top", type=int, default=20, help="kernels listed")
    ap.add_argument("--stalls", type=int, default=4, help="stall reasons listed per kernel")
    ap.add_argument("--json", help="also write the table as JSON to this file")
    ap.add_argument("--metrics", choices=["all", "core"],
                    help="print the metrics to pass to ncu --metrics (comma-separated), and exit")
    args = ap.parse_args()
    if args.metrics:
        print(",".join((METRICS if args.metrics == "all" else CORE).values()))
        return
    if not args.csv:
        ap.error("the CSV file is required")
    text = sys.stdin.read() if args.csv == "-" else open(args.csv, errors="replace").read()
    table = summarise(per_launch(read_rows(text)))
    if not any("time" in m for _, m in table):
        raise SystemExit("ncu_stalls: no gpu__time_duration.sum rows")
    print(f"{'kernel':<56} {'calls':>5} {'us/call':>8} {'regs':>4} {'block':>5} "
          f"{'blocks/SM':>19} {'warps/SM':>11} {'issue':>5} {'tensor':>6} {'DRAM':>4} "
          f"{'SM':>4} {'cycles/inst':>11}  stalls (cycles/inst)")
    for name, m in table[:args.top]:
        blocks, limiter = blocks_per_sm(m)
        theo = m.get("theoretical_pct")
        ach = m.get("achieved_pct")
        warps = (f"{fmt(theo and theo * MAX_WARPS / 100, '.0f')}/"
                 f"{fmt(ach and ach * MAX_WARPS / 100, '.1f')}")
        stalls = ", ".join(f"{r} {v:.1f}" for r, v in stalls_of(m, args.stalls))
        blocks_text = "-" if blocks is None else f"{blocks:.0f} ({limiter})"
        print(f"{name[:56]:<56} {m['calls']:>5} {fmt(m.get('time'), '.1f'):>8} "
              f"{fmt(m.get('regs'), '.0f'):>4} {fmt(m.get('block'), '.0f'):>5} "
              f"{blocks_text[:19]:>19} {warps:>11} {fmt(m.get('issue'), '.2f'):>5} "
              f"{fmt(m.get('tensor_pct'), '.0f', '%'):>6} {fmt(m.get('dram_pct'), '.0f', '%'):>4} "
              f"{fmt(m.get('sm_pct'), '.0f', '%'):>4} {fmt(m.get('cycles_per_inst'), '.1f'):>11}  "
              f"{stalls}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump([{"name": n, **m} for n, m in table], out, indent=1)


if __name__ == "__main__":
    main()
