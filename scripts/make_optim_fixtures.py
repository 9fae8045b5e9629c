#!/usr/bin/python3
# Writes the optimizer goldens of tests/optim/test_optim.cpp: a few steps of each optimizer on
# small parameters with fixed gradients, computed by PyTorch in float64.
"""Optimizer golden fixtures.

Run with Debian's interpreter, which has torch:  /usr/bin/python3 scripts/make_optim_fixtures.py

SGD, Adam and AdamW are torch.optim's own (amsgrad off, foreach off). timm is not installed here,
so LAMB is our own re-implementation of timm.optim.Lamb's semantics (bias correction, grad
averaging, global grad-norm clip at max_grad_norm, weight decay added to the update, trust ratio
||w|| / ||update|| for groups with weight decay or always_adapt, optional trust_clip), written
from the description of the algorithm below, not copied.

Two parameter groups: "w" [3, 4] with weight decay, "b" [4] without (as the grouping helper
would split them). Names inside a fixture (K = STEPS):
  init.<p>          parameter values before the first step
  grad.<k>.<p>      the gradient given at step k (fixed, independent of the parameters)
  step.<k>.<p>      parameter values after step k
Hyperparameters are in the metadata; the C++ test reads them from there.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden_fixtures import save_safetensors  # noqa: E402

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                       "optim")
STEPS = 5
SHAPES = {"w": (3, 4), "b": (4,)}


def make_inputs(seed, grad_scale):
    g = torch.Generator().manual_seed(seed)
    init = {n: torch.rand(s, generator=g, dtype=torch.float64) * 2 - 1 for n, s in SHAPES.items()}
    # Gradient magnitudes vary by step so that LAMB's global clip engages on some steps only.
    grads = [{n: (torch.rand(s, generator=g, dtype=torch.float64) * 2 - 1) * grad_scale[k]
              for n, s in SHAPES.items()} for k in range(STEPS)]
    return init, grads


def lamb_reference(groups, grads, lr, betas, eps, max_grad_norm, always_adapt, trust_clip):
    """timm Lamb semantics, one list of {name: tensor} per step; updates `groups` in place."""
    beta1, beta2 = betas
    state = {}
    for step, grad in enumerate(grads, start=1):
        if max_grad_norm:
            global_norm = torch.sqrt(sum((g * g).sum() for g in grad.values()))
            divisor = torch.clamp(global_norm / max_grad_norm, min=1.0)
        else:
            divisor = torch.tensor(1.0, dtype=torch.float64)
        bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
        for group in groups:
            for name, p in group["params"].items():
                g = grad[name] / divisor
                m, v = state.setdefault(name, (torch.zeros_like(p), torch.zeros_like(p)))
                m = beta1 * m + (1 - beta1) * g
                v = beta2 * v + (1 - beta2) * g * g
                state[name] = (m, v)
                update = (m / bc1) / (torch.sqrt(v) / bc2 ** 0.5 + eps)
                wd = group["weight_decay"]
                if wd != 0:
                    update = update + wd * p
                if wd != 0 or always_adapt:
                    w_norm, u_norm = p.norm(), update.norm()
                    trust = w_norm / u_norm if w_norm > 0 and u_norm > 0 else torch.tensor(1.0)
                    if trust_clip:
                        trust = min(trust, torch.tensor(1.0, dtype=torch.float64))
                    update = update * trust
                p.sub_(lr * update)
        yield {n: t.clone() for group in groups for n, t in group["params"].items()}


def run_torch(make_opt, init, grads):
    params = {n: t.clone().requires_grad_(True) for n, t in init.items()}
    opt = make_opt(params)
    for grad in grads:
        for n, p in params.items():
            p.grad = grad[n].clone()
        opt.step()
        yield {n: p.detach().clone() for n, p in params.items()}


def write(name, steps, init, grads, meta):
    tensors = {f"init.{n}": t for n, t in init.items()}
    for k, (grad, after) in enumerate(zip(grads, steps)):
        tensors.update({f"grad.{k}.{n}": t for n, t in grad.items()})
        tensors.update({f"step.{k}.{n}": t for n, t in after.items()})
    meta = dict(meta, optimizer=meta.get("optimizer", name), steps=STEPS)
    save_safetensors(os.path.join(OUT_DIR, f"{name}.safetensors"), tensors, meta)


def torch_case(name, opt_class, wd, seed, **kwargs):
    init, grads = make_inputs(seed, [1.0] * STEPS)

    def make_opt(params):
        return opt_class([{"params": [params["w"]], "weight_decay": wd},
                          {"params": [params["b"]], "weight_decay": 0.0}], foreach=False, **kwargs)

    meta = {"optimizer": opt_class.__name__.lower(), "weight_decay": wd}
    for key, value in kwargs.items():
        meta[key] = ",".join(map(str, value)) if isinstance(value, tuple) else value
        if isinstance(value, bool):
            meta[key] = int(value)
    write(name, list(run_torch(make_opt, init, grads)), init, grads, meta)


def lamb_case(name, seed, wd, lr, max_grad_norm, always_adapt, trust_clip):
    init, grads = make_inputs(seed, [3.0, 0.2, 2.0, 0.1, 0.5])
    groups = [{"params": {"w": init["w"].clone()}, "weight_decay": wd},
              {"params": {"b": init["b"].clone()}, "weight_decay": 0.0}]
    betas, eps = (0.9, 0.999), 1e-6
    steps = list(lamb_reference(groups, grads, lr, betas, eps, max_grad_norm, always_adapt,
                                trust_clip))
    write(name, steps, init, grads,
          {"optimizer": "lamb", "lr": lr, "weight_decay": wd, "betas": "0.9,0.999", "eps": eps,
           "max_grad_norm": max_grad_norm, "always_adapt": int(always_adapt),
           "trust_clip": int(trust_clip)})


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    torch_case("sgd", torch.optim.SGD, 0.05, 1, lr=0.1, momentum=0.9)
    torch_case("sgd_nesterov", torch.optim.SGD, 0.05, 2, lr=0.1, momentum=0.9, nesterov=True)
    torch_case("sgd_plain", torch.optim.SGD, 0.0, 3, lr=0.1, momentum=0.0)
    torch_case("adam", torch.optim.Adam, 0.05, 4, lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    torch_case("adamw", torch.optim.AdamW, 0.05, 5, lr=0.01, betas=(0.9, 0.95), eps=1e-8)
    lamb_case("lamb", 6, wd=0.05, lr=0.01, max_grad_norm=1.0, always_adapt=False,
              trust_clip=False)
    lamb_case("lamb_adapt_all", 7, wd=0.05, lr=0.01, max_grad_norm=0.0, always_adapt=True,
              trust_clip=True)


if __name__ == "__main__":
    main()
