#!/usr/bin/env python3
# A table's report: the paper's numbers (configs/paper_results.json) beside our runs' (summary.csv,
# metrics.jsonl, `summary --json`, `benchmark --mode infer`), as reports/<name>.md and a
# self-contained reports/<name>.html with inline SVG curves. Python 3 standard library only.
#
#   scripts/report.py table8-mini                  # runs/table8-mini/<config>/ -> reports/table8-mini.*
#   scripts/report.py table1 --name table1-2ep     # a shortened schedule's folders and report
#   scripts/report.py table8-mini --seeds 1,2,3    # runs/table8-mini/<config>-seed<S>/: mean, std
#   scripts/report.py --list table1                # the table's configs, one a line
#   scripts/report.py --status RUN_DIR             # finished | partial | none
import argparse
import csv
import datetime
import html
import re
import json
import math
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]


def load_results(path):
    with open(path) as f:
        return json.load(f)["tables"]


def epoch_records(run_dir):
    """metrics.jsonl's epoch records, the last one of each epoch (a resume may repeat one)."""
    records = {}
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    r = json.loads(line)
                    if r.get("kind") == "epoch":
                        records[r["epoch"]] = r
    return [records[e] for e in sorted(records)]


def summary_rows(run_dir):
    """summary.csv as {epoch: row} with floats (None for empty cells); last row of an epoch wins."""
    path = os.path.join(run_dir, "summary.csv")
    rows = {}
    if os.path.exists(path):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                rows[int(r["epoch"])] = {k: (float(v) if v not in ("", None) else None)
                                         for k, v in r.items()}
    return [rows[e] for e in sorted(rows)]


def run_status(run_dir):
    recs = epoch_records(run_dir)
    if not recs:
        return "none"
    last = recs[-1]
    return "finished" if "epochs" in last and last["epoch"] + 1 >= last["epochs"] else "partial"


def run_tool(args):
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    if out.returncode != 0:
        return None, (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]
    for text in (out.stdout, (out.stdout.strip().splitlines() or [""])[-1]):
        try:
            return json.loads(text), None
        except ValueError:
            pass
    return None, "no JSON in the output of " + " ".join(args)


def model_numbers(build, config_path):
    """Trainable parameters and GMACs from `summary --json`."""
    exe = os.path.join(build, "apps", "summary")
    if not os.path.exists(exe):
        return None, None, f"{exe} not built"
    j, err = run_tool([exe, "--config", config_path, "--json"])
    return (j["trainable_params"], j["gmacs"], None) if j else (None, None, err)


def throughput(build, config_path, run_dir, device, batch):
    """Inference images/s from `benchmark --mode infer`, cached in the run folder."""
    cache = os.path.join(run_dir, f"benchmark_infer_{device}_b{batch}.json")
    if os.path.exists(cache):
        with open(cache) as f:
            return json.load(f)["images_per_s"], None
    exe = os.path.join(build, "apps", "benchmark")
    if not os.path.exists(exe):
        return None, f"{exe} not built"
    j, err = run_tool([exe, "--config", config_path, "--mode", "infer", "--batch", str(batch),
                       "--device", device, "--json"])
    if j:
        with open(cache, "w") as f:
            json.dump(j, f)
        return j["images_per_s"], None
    return None, err


def collect_run(run_dir):
    """One run folder's figures: curves, best and final evaluation, epochs, training time."""
    rows, recs = summary_rows(run_dir), epoch_records(run_dir)
    evaluated = [r for r in rows if r.get("eval_top1") is not None]
    return {
        "run_dir": run_dir, "status": run_status(run_dir), "has_rows": bool(rows),
        "curve_epochs": [r["epoch"] for r in rows],
        "curve_loss": [r.get("train_loss") for r in rows],
        "curve_top1": [r.get("eval_top1") for r in rows],
        "best": max(evaluated, key=lambda r: r["eval_top1"]) if evaluated else None,
        "final": evaluated[-1] if evaluated else None,
        "epochs_run": len(rows),
        "epochs_planned": recs[-1].get("epochs") if recs else None,
        "train_seconds": sum(r.get("seconds", 0.0) for r in recs) if recs else None,
    }


def mean_curve(runs, key):
    """The mean over the runs of `key` at each epoch that every run has evaluated."""
    per_run = [dict(zip(r["curve_epochs"], r[key])) for r in runs]
    epochs = sorted(set.intersection(*(set(e for e, v in p.items() if v is not None) for p in per_run)))
    return epochs, [statistics.fmean(p[e] for p in per_run) for e in epochs]


def spread(values):
    """(mean, sample standard deviation, n) of the values that are there; None when none are."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)


def combine_seeds(runs, seeds, base):
    """One row's figures over its seeds (runs in <base>-seed<S>): each seed's run, and their mean
    and spread."""
    out = {"seed_runs": list(zip(seeds, runs)),
           "run_dir": base + "-seed{" + ",".join(map(str, seeds)) + "}"}
    statuses = {r["status"] for r in runs}
    out["status"] = statuses.pop() if len(statuses) == 1 else "partial"
    out["has_rows"] = any(r["has_rows"] for r in runs)
    out["best_stats"] = spread([r["best"]["eval_top1"] if r["best"] else None for r in runs])
    out["final_stats"] = spread([r["final"]["eval_top1"] if r["final"] else None for r in runs])
    out["top5_stats"] = spread([r["final"]["eval_top5"] if r["final"] else None for r in runs])
    out["epochs_run"] = min(r["epochs_run"] for r in runs)
    out["epochs_planned"] = next((r["epochs_planned"] for r in runs if r["epochs_planned"]), None)
    times = [r["train_seconds"] for r in runs if r["train_seconds"] is not None]
    out["train_seconds"] = statistics.fmean(times) if times else None
    out["curve_epochs"], out["curve_loss"] = mean_curve(runs, "curve_loss")
    out["curve_top1"] = mean_curve(runs, "curve_top1")[1]
    return out


def collect(row, args):
    base = os.path.join(args.runs, args.name, os.path.basename(row["config"]))
    folders = [f"{base}-seed{s}" for s in args.seeds] if args.seeds else [base]
    run_configs = [os.path.join(d, "config.yaml") for d in folders if os.path.exists(os.path.join(d, "config.yaml"))]
    config_path = run_configs[0] if run_configs else os.path.join(ROOT, "configs", row["config"] + ".yaml")
    runs = [collect_run(d) for d in folders]
    out = dict(row, problems=[])
    out.update(combine_seeds(runs, args.seeds, base) if args.seeds else runs[0])
    out["params"], out["gmacs"], err = model_numbers(args.build, config_path)
    if err:
        out["problems"].append("parameters: " + err)
    out["tp"] = None
    measured = next((r["run_dir"] for r in runs if r["has_rows"]), None)
    if args.tp_device != "none" and measured:
        out["tp"], err = throughput(args.build, config_path, measured, args.tp_device, args.tp_batch)
        if err:
            out["problems"].append("throughput: " + err)
    return out


def fmt(v, digits=2, none="—"):
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def fmt_time(s):
    if s is None:
        return "—"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def fmt_spread(stats):
    """mean ± std (n) of a spread(), or — without values."""
    if stats is None:
        return "—"
    mean, std, n = stats
    return f"{mean:.2f} ± {std:.2f} (n={n})"


def table_cells(r):
    planned = r["epochs_planned"]
    if "seed_runs" in r:  # several seeds: means with their spread
        best_mean = r["best_stats"][0] if r["best_stats"] else None
        diff = best_mean - r["paper_top1"] if best_mean is not None and r["paper_top1"] is not None else None
        evaluation = [fmt_spread(r["best_stats"]), fmt_spread(r["final_stats"]),
                      fmt(r["top5_stats"][0]) if r["top5_stats"] else "—"]
    else:
        best, final = r["best"], r["final"]
        diff = best["eval_top1"] - r["paper_top1"] if best and r["paper_top1"] is not None else None
        evaluation = [f"{fmt(best['eval_top1'])} (ep {int(best['epoch'])})" if best else "—",
                      fmt(final["eval_top1"]) if final else "—",
                      fmt(final["eval_top5"]) if final else "—"]
    return [r["label"], f"`{r['config']}`", fmt(r["paper_top1"], 1)] + evaluation + [
            ("+" if diff is not None and diff >= 0 else "") + fmt(diff),
            fmt(r["paper_params_m"], 1), f"{r['params']:,}" if r["params"] else "—",
            f"{r['gmacs']:.4g}" if r["gmacs"] is not None else "—", fmt(r["tp"], 0), fmt(r["paper_tp"], 0, none="—"),
            f"{r['epochs_run']}/{planned}" if planned else str(r["epochs_run"] or "—"),
            fmt_time(r["train_seconds"]), f"`{r['run_dir']}`"]


HEADER = ["row", "config", "paper top-1", "ours best top-1", "final top-1", "final top-5",
          "best − paper", "paper params (M)", "our params", "GMACs", "Tp ours (img/s)",
          "Tp paper", "epochs", "train time", "run folder"]


def context_lines(table, args):
    seeds = ",".join(map(str, args.seeds or []))
    lines = [f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by `scripts/report.py "
             f"{args.table}{' --name ' + args.name if args.name != args.table else ''}"
             f"{' --seeds ' + seeds if seeds else ''}` from `{args.runs}/{args.name}/`."]
    if seeds:
        lines.append(f"Every row trained once per seed ({seeds}; `train.seed`, which sets the weights' "
                     "initialisation, the data order and every random draw): top-1 cells are the mean "
                     "± the sample standard deviation over the seeds that have evaluated (n); "
                     "top-5, train time and the curves are means; each seed's figures are in the notes.")
    if args.overrides:
        lines.append(f"Every run of this report trained with the overrides `{args.overrides}`.")
    if args.name != args.table:
        lines.append(f"**Shortened schedule** (`{args.name}`): every run trained for fewer epochs than the "
                     "paper's recipe, with the cosine schedule compressed into them; accuracies are not "
                     "comparable with the paper's.")
    lines.append("*best* is the highest test top-1 over the evaluated epochs (what the authors report), "
                 "*final* the last epoch's. *Tp* is `benchmark --mode infer` "
                 + (f"on `{args.tp_device}`, batch {args.tp_batch}, fp32" if args.tp_device != "none" else "(not measured)")
                 + " (the paper's: RTX 4090). *train time* sums metrics.jsonl's per-epoch training seconds "
                 "(evaluation excluded). GMACs per image from `summary`.")
    return lines + [f"Note: {n}" for n in table.get("notes", [])]


def seed_note(r):
    """Each seed's best (epoch) and final top-1 of a row trained with several seeds."""
    parts = []
    for seed, run in r["seed_runs"]:
        if run["best"]:
            parts.append(f"seed {seed}: best {run['best']['eval_top1']:.2f} (ep {int(run['best']['epoch'])}), "
                         f"final {run['final']['eval_top1']:.2f}")
        else:
            parts.append(f"seed {seed}: not evaluated yet")
    return "; ".join(parts)


def row_notes(r):
    """The notes of a row: the paper's caveat, each seed's figures, problems met."""
    return (([r["note"]] if r.get("note") else []) + ([seed_note(r)] if "seed_runs" in r else [])
            + r["problems"])


def write_markdown(path, table, rows, args):
    out = [f"# {table['title']}", ""] + [l + "\n" for l in context_lines(table, args)]
    out += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(table_cells(r)) + " |" for r in rows]
    notes = [(r["label"], n) for r in rows for n in row_notes(r)]
    words = {"none": "not run yet", "partial": "interrupted or still running (reproduce.sh resumes it)"}
    status = [(r["label"], words[r["status"]]) for r in rows if r["status"] in words]
    if notes or status:
        out += ["", "## Notes", ""] + [f"* **{label}**: {n}" for label, n in notes + status]
    out += ["", f"Curves: `{os.path.basename(path)[:-3]}.html` (train loss and test top-1 per epoch); "
            "each run folder also holds `curves.png` and TensorBoard event files.", ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def nice_ticks(lo, hi, integer=False):
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if raw / mag <= m * 1.5 or m == 10)
    if integer:
        step = max(step, 1)
    start = math.floor(lo / step) * step
    ticks = [start]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(ticks[-1] + step)
    return ticks, step


def svg_plot(title, series, plot_width=470, height=300):
    """One SVG line chart: series = [(label, colour, xs, ys)]; a legend to the right, as wide as
    its longest label (about 6.5 px a character at font size 11)."""
    pts = [(x, y) for _, _, xs, ys in series for x, y in zip(xs, ys) if y is not None]
    legend = 46 + math.ceil(6.5 * max((len(label) for label, _, _, _ in series), default=0))
    width = plot_width + legend
    left, right, top, bottom = 56, plot_width, 28, height - 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="18" font-size="14">{html.escape(title)}</text>']
    if not pts:
        out.append(f'<text x="{left}" y="{height // 2}">no epochs recorded yet</text></svg>')
        return "\n".join(out)
    xt, xs_step = nice_ticks(min(p[0] for p in pts), max(p[0] for p in pts), True)
    yt, ys_step = nice_ticks(min(p[1] for p in pts), max(p[1] for p in pts))
    px = lambda x: left + (x - xt[0]) / (xt[-1] - xt[0] or 1) * (right - left)
    py = lambda y: bottom - (y - yt[0]) / (yt[-1] - yt[0] or 1) * (bottom - top)
    ydig = max(0, -math.floor(math.log10(ys_step) + 1e-9))
    for t in yt:
        out.append(f'<line x1="{left}" x2="{right}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e5e5e5"/>'
                   f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:.{ydig}f}</text>')
    for t in xt:
        out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top}" y2="{bottom}" stroke="#e5e5e5"/>'
                   f'<text x="{px(t):.1f}" y="{bottom + 16}" text-anchor="middle">{t:g}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="#444"/>'
               f'<text x="{(left + right) / 2}" y="{height - 6}" text-anchor="middle">epoch</text>')
    for i, (label, colour, xs, ys) in enumerate(series):
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys) if y is not None)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        ly = top + 10 + 16 * i
        out.append(f'<line x1="{right + 12}" x2="{right + 32}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"/>'
                   f'<text x="{right + 38}" y="{ly + 4}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def inline_markdown(text):
    """The Markdown of the report's prose lines as HTML: `code`, **bold**, *emphasis*."""
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)
    return re.sub(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])", r"<em>\1</em>", out)


def write_html(path, table, rows, args):
    groups = {}
    for r in rows:  # one pair of plots per dataset (the config's prefix)
        config = r["config"]
        groups.setdefault(config.split("/")[0] if "/" in config else config.split("_")[0], []).append(r)
    body = [f"<h1>{html.escape(table['title'])}</h1>"]
    body += [f"<p>{inline_markdown(l)}</p>" for l in context_lines(table, args)]
    body.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in HEADER) + "</tr>")
    for r in rows:
        body.append("<tr>" + "".join(f"<td>{html.escape(c.strip('`'))}</td>" for c in table_cells(r)) + "</tr>")
    body.append("</table><ul>")
    body += [f"<li><b>{html.escape(r['label'])}</b>: {html.escape(n)}</li>"
             for r in rows for n in row_notes(r)]
    body.append("</ul>")
    for group, members in groups.items():
        colours = [PALETTE[i % len(PALETTE)] for i in range(len(members))]
        for key, title in (("curve_loss", "train loss"), ("curve_top1", "test top-1 (%)")):
            if args.seeds:
                title += f", mean of {len(args.seeds)} seeds"
            series = [(m["label"], c, m["curve_epochs"], m[key]) for m, c in zip(members, colours)]
            body.append(svg_plot(f"{group}: {title}", series))
    style = ("body{font-family:sans-serif;margin:24px;max-width:1400px}table{border-collapse:collapse;"
             "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
             "td:first-child,td:nth-child(2),td:last-child{text-align:left}svg{margin:8px 8px 0 0}")
    with open(path, "w") as f:
        f.write(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(args.name)}</title>"
                f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def default_tp_device():
    smi = shutil.which("nvidia-smi")
    if smi and subprocess.run([smi, "-L"], capture_output=True).returncode == 0:
        return "cuda"
    return "cpu"


def main():
    p = argparse.ArgumentParser(description="Writes reports/<name>.md and .html for a table of the paper.")
    p.add_argument("table", nargs="?")
    p.add_argument("--name", help="run and report name (default: the table; reproduce.sh adds -<N>ep)")
    p.add_argument("--runs", default="runs", help="runs folder (runs of TABLE in <runs>/<name>/<config>)")
    p.add_argument("--out", default=os.path.join(ROOT, "reports"), help="where the reports go")
    p.add_argument("--build", default=os.environ.get("SKA_BUILD", os.path.join(ROOT, "build")))
    p.add_argument("--results", default=os.path.join(ROOT, "configs", "paper_results.json"))
    p.add_argument("--rows", help="only these configs (comma-separated names)")
    p.add_argument("--seeds", help="rows trained once per seed (comma-separated), in <config>-seed<S>")
    p.add_argument("--overrides", default="", help="the --set options the runs had (printed in the report)")
    p.add_argument("--tp-device", help="device of the Tp measurement: cpu, cuda, or none (default: cuda if present)")
    p.add_argument("--tp-batch", type=int, help="batch of the Tp measurement (default 256 on cuda, 64 on cpu)")
    p.add_argument("--list", action="store_true", help="print the table's configs and exit")
    p.add_argument("--status", metavar="RUN_DIR", help="print finished, partial or none for a run folder")
    args = p.parse_args()
    if args.status:
        print(run_status(args.status))
        return 0
    tables = load_results(args.results)
    if args.table not in tables:
        sys.exit(f"report.py: unknown table '{args.table}' (known: {', '.join(tables)}) in {args.results}")
    table = tables[args.table]
    rows = table["rows"]
    if args.rows:
        # A row is named by its config as --list prints it, or by the config's file name.
        wanted = args.rows.split(",")
        names = lambda r: (r["config"], os.path.basename(r["config"]))  # noqa: E731
        unknown = [w for w in wanted if not any(w in names(r) for r in rows)]
        if unknown:
            sys.exit(f"report.py: {args.table} has no row {', '.join(unknown)} "
                     f"(rows: {', '.join(r['config'] for r in rows)})")
        rows = [r for r in rows if any(n in wanted for n in names(r))]
    if args.list:
        print("\n".join(r["config"] for r in rows))
        return 0
    args.name = args.name or args.table
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    except ValueError:
        sys.exit(f"report.py: --seeds '{args.seeds}' is not a comma-separated list of integers")
    args.tp_device = args.tp_device or default_tp_device()
    args.tp_batch = args.tp_batch or (256 if args.tp_device == "cuda" else 64)
    collected = [collect(r, args) for r in rows]
    os.makedirs(args.out, exist_ok=True)
    md, page = (os.path.join(args.out, args.name + ext) for ext in (".md", ".html"))
    write_markdown(md, table, collected, args)
    write_html(page, table, collected, args)
    print(f"report.py: wrote {md} and {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
