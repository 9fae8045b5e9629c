"""Dropout and drop path of the references in training mode, for the benchmark twin.

The golden fixtures are written in eval mode (rates 0 or eval()), where both are the identity.
scripts/benchmark_models.py builds the references with the config's rates, so that its training
step draws the masks our models draw: F.dropout as nn.Dropout applies it, and drop path as timm's
DropPath (one Bernoulli factor per sample, divided by the keep probability).
While COUNTING, SITES counts the masks drawn (the twin counts one forward, then stops, so that
torch.compile traces no bookkeeping).
"""
import torch.nn.functional as F

SITES = {"dropout": 0, "drop_path": 0}
COUNTING = False


def count(on):
    """Starts counting from zero (on) or stops."""
    global COUNTING
    COUNTING = on
    if on:
        for k in SITES:
            SITES[k] = 0


def dropout(x, p, training):
    if not training or p <= 0.0:
        return x
    if COUNTING:
        SITES["dropout"] += 1
    return F.dropout(x, p, True)


def drop_path(x, p, training):
    if not training or p <= 0.0:
        return x
    if COUNTING:
        SITES["drop_path"] += 1
    keep = 1.0 - p
    factor = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
    return x * factor.div_(keep)
