#!/usr/bin/env python3
"""Loads a run folder with TensorBoard's own reader (the `tensorboard` package) and compares its
scalars with the run's metrics.jsonl: every tag with its number of points and last value, and
for the eval and loss series whether TensorBoard's values equal ours (as f32, which TensorBoard
stores). Exit status 1 when a compared series differs or TensorBoard finds no scalars.
Usage: scripts/tensorboard_check.py RUN_DIR"""
import json
import math
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
import numpy as np

run = Path(sys.argv[1])
acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
acc.Reload()
tags = sorted(acc.Tags()["scalars"])
if not tags:
    sys.exit(f"tensorboard_check: TensorBoard read no scalars in {run}")
for tag in tags:
    points = acc.Scalars(tag)
    print(f"{tag:<24} {len(points):>6} points, last {points[-1].value:.6g} at step {points[-1].step}")

# metrics.jsonl's epoch records against TensorBoard's eval series, value by value.
records = [json.loads(l) for l in open(run / "metrics.jsonl") if l.strip()]
ok = True
for field, tag in (("eval_top1", "eval/top1"), ("eval_loss", "eval/loss")):
    ours = [r[field] for r in records if r.get(field) is not None]
    if tag not in tags or not ours:
        continue
    theirs = [p.value for p in acc.Scalars(tag)]
    same = len(ours) == len(theirs) and all(
        float(np.float32(a)) == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(ours, theirs))
    ok &= same
    print(f"{tag}: {'equal to' if same else 'DIFFERS from'} metrics.jsonl's {field} ({len(ours)} values)")
sys.exit(0 if ok else 1)
