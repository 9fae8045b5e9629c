#!/usr/bin/env bash
# The reproduction harness end to end on the CPU: scripts/reproduce.sh runs two tiny rows of
# table8-mini (one short epoch each, side by side in two slots of --gpus 0,0), the report's numbers
# are read back and checked against the runs' summary.csv, a second call skips the finished rows,
# --data-root reaches the right rows, --seeds trains a row once per seed and reports their mean and
# spread, and SIGTERM stops the rows with checkpoints that a second call continues.
# Usage: test_reproduce.sh BUILD_DIR. Exit 77 (skipped) without Fashion-MNIST or python3.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || {
  echo "skipped: /usr/share/datasets/fashion-mnist is not installed"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_reproduce: $*" >&2; exit 1; }

rows=table8_mini/vit,table8_mini/cska_vit
command=(env SKA_BUILD="$build" "$src/scripts/reproduce.sh" table8-mini --rows "$rows" --device cpu
         --runs "$tmp/runs" --reports "$tmp/reports" --set data.train_subset=2048
         --set data.eval_subset=500 --set data.workers=1)
run() { "${command[@]}" --epochs 1 "$@"; }

# --data-root reaches the rows of that dataset only (a dry run prints the commands).
dry=$(run --dry-run --data-root fashion_mnist=/some/where --data-root cifar10=/else)
[ "$(grep -c -- '--set data.root=/some/where' <<<"$dry")" = 2 ] || fail "data.root not set: $dry"
grep -q -- '/else' <<<"$dry" && fail "the cifar10 root reached a Fashion-MNIST row: $dry"
run --dry-run --data-root mnist=/x >/dev/null 2>&1 && fail "an unknown dataset was accepted"

# Both rows at once in two slots of one "GPU" (--gpus 0,0; on the CPU the variable is unused).
run --gpus 0,0 >"$tmp/first.log" 2>&1 || { cat "$tmp/first.log"; fail "the first run failed"; }
[ "$(grep -c 'on GPU 0 ' "$tmp/first.log")" = 2 ] || { cat "$tmp/first.log"; fail "not two slots"; }
report=$tmp/reports/table8-mini-1ep.md
[ -f "$report" ] && [ -f "$tmp/reports/table8-mini-1ep.html" ] || fail "no report in $tmp/reports"

# Every row's best and final top-1 in the report are its summary.csv's.
python3 - "$report" "$tmp/runs/table8-mini-1ep" <<'PY'
import csv, os, re, sys
report, runs = sys.argv[1], sys.argv[2]
checked = 0
for line in open(report):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    m = re.match(r"`table8_mini/(\w+)`", cells[1]) if len(cells) > 4 else None
    if not m:
        continue
    rows = [r for r in csv.DictReader(open(os.path.join(runs, m.group(1), "summary.csv")))
            if r["eval_top1"]]
    best = max(float(r["eval_top1"]) for r in rows)
    final = float(rows[-1]["eval_top1"])
    got_best = float(re.match(r"([\d.]+) \(ep \d+\)", cells[3]).group(1))
    got_final = float(cells[4])
    if abs(got_best - best) > 0.005 or abs(got_final - final) > 0.005:
        sys.exit(f"{m.group(1)}: report says best {got_best} final {got_final}, "
                 f"summary.csv {best} {final}")
    if not 10.0 < best <= 100.0:
        sys.exit(f"{m.group(1)}: top-1 {best} is not a trained model's")
    checked += 1
if checked != 2:
    sys.exit(f"expected 2 rows in the report, found {checked}")
PY

# --seeds: one row twice, with seeds 1 and 2, in <row>-seed1 and <row>-seed2; the report's cells
# are the mean and sample standard deviation of the two runs' summary.csv, each seed's figure is in
# the notes, and the seeds took effect (the two runs differ).
run --rows table8_mini/vit --seeds 1,2 --gpus 0,0 >"$tmp/seeds.log" 2>&1 ||
  { cat "$tmp/seeds.log"; fail "the seeded runs failed"; }
run --dry-run --seeds 1,1 >/dev/null 2>&1 && fail "a repeated seed was accepted"
python3 - "$tmp/reports/table8-mini-1ep.md" "$tmp/runs/table8-mini-1ep" <<'PY'
import csv, os, re, statistics, sys
report, runs = sys.argv[1], sys.argv[2]
bests, finals = [], []
for seed in (1, 2):
    rows = [r for r in csv.DictReader(open(os.path.join(runs, f"vit-seed{seed}", "summary.csv")))
            if r["eval_top1"]]
    bests.append(max(float(r["eval_top1"]) for r in rows))
    finals.append(float(rows[-1]["eval_top1"]))
if bests[0] == bests[1] and finals[0] == finals[1]:
    sys.exit(f"seeds 1 and 2 trained the same model: {bests}")
text = open(report).read()
row = next(l for l in text.splitlines() if "`table8_mini/vit`" in l)
cells = [c.strip() for c in row.strip().strip("|").split("|")]
for cell, values in ((cells[3], bests), (cells[4], finals)):
    m = re.fullmatch(r"([\d.]+) ± ([\d.]+) \(n=2\)", cell)
    if not m:
        sys.exit(f"cell '{cell}' is not 'mean ± std (n=2)'")
    mean, std = float(m.group(1)), float(m.group(2))
    if abs(mean - statistics.fmean(values)) > 0.006 or abs(std - statistics.stdev(values)) > 0.006:
        sys.exit(f"cell '{cell}' is not the mean and spread of {values}")
for seed, best in zip((1, 2), bests):
    if f"seed {seed}: best {best:.2f}" not in text:
        sys.exit(f"the notes lack seed {seed}'s best {best:.2f}")
if "vit-seed{1,2}" not in row:
    sys.exit(f"the row does not name its run folders: {row}")
PY

# A second call trains nothing: both rows are finished.
stamp=$(stat -c %Y "$tmp/runs/table8-mini-1ep/vit/summary.csv")
run >"$tmp/second.log" 2>&1 || { cat "$tmp/second.log"; fail "the second run failed"; }
[ "$(grep -c 'finished already' "$tmp/second.log")" = 2 ] || { cat "$tmp/second.log"; fail "rows rerun"; }
[ "$(stat -c %Y "$tmp/runs/table8-mini-1ep/vit/summary.csv")" = "$stamp" ] || fail "a finished run changed"
# SIGTERM to reproduce.sh while both rows train: each writes a checkpoint and stops, the script
# exits 143; the same command then continues both rows from their checkpoints to the end.
two=$tmp/runs/table8-mini-2ep
two_epochs=("${command[@]}" --gpus 0,0 --epochs 2 --set checkpoint.every_steps=2)
(exec "${two_epochs[@]}" >"$tmp/stopped.log" 2>&1) &
pid=$!  # reproduce.sh itself (env execs it)
for _ in $(seq 1200); do
  [ -f "$two/vit/checkpoints/pointers.json" ] && [ -f "$two/cska_vit/checkpoints/pointers.json" ] &&
    break
  sleep 0.1
done
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
[ "$status" = 143 ] || { cat "$tmp/stopped.log"; fail "reproduce.sh ended with $status, not 143"; }
for row in vit cska_vit; do
  grep -q "stopped by SIGTERM" "$two/$row.console.log" ||
    { cat "$two/$row.console.log"; fail "$row did not stop cleanly"; }
done
"${two_epochs[@]}" >"$tmp/continued.log" 2>&1 ||
  { cat "$tmp/continued.log"; fail "the continued run failed"; }
for row in vit cska_vit; do
  grep -q "resumed from" "$two/$row.console.log" || fail "$row was not resumed"
  [ "$(grep -c '^1,' "$two/$row/summary.csv")" = 1 ] || fail "$row did not finish its 2 epochs"
done
echo "test_reproduce: ok"
