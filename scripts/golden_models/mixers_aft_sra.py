#!/usr/bin/python3
# Our PyTorch reference of the AFT token mixers (seed 003, eqs. 2-8) and PVT's SRA (seed 004);
# writes the mixer fixtures of tests/models/test_mixers_aft_sra.cpp.
"""AFT / SRA golden fixtures.

Run with Debian's interpreter, which has torch:
  /usr/bin/python3 scripts/golden_models/mixers_aft_sra.py

The AFT reference is written in the paper's direct form, independent of the C++ formulation:
w [T, T] is materialised (aft_conv's from its kernels by relative grid offset) and
Y_t = sigmoid(Q_t) * sum_t' exp(K_t' + w_tt') V_t' / sum_t' exp(K_t' + w_tt') is summed as written.
Each fixture tests/fixtures/models/<case>.safetensors holds the parameters ("state.<name>", C++
state_dict names), the tokens "input" [2, N, C], "output", "grad_weight" w and the gradients
"grad.input" and "grad.<param>" of sum(output * w) for every parameter; <case>.yaml holds
`dim`, `grid: [H, W]`, `cls_token`, `family` and the `mixer:` map (tests/models/model_golden.h).
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import make_golden_fixtures as mgf  # noqa: E402  (save_safetensors)
import sdpa  # noqa: E402  (PyTorch's fused attention, for the benchmark twin only)

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "fixtures", "models")
KERNEL_STD_EPS = 1e-5  # eq. 8's std taken as sqrt(var + eps)


def grid_positions(h, w, cls):
    """(row, col) per token; None for the class token."""
    return ([None] if cls else []) + [(r, c) for r in range(h) for c in range(w)]


class Aft(nn.Module):
    def __init__(self, kind, dim, grid, factor_dim=128, window=4, heads=1, kernel=7, qkv_bias=True):
        super().__init__()
        self.kind, self.grid, self.window = kind, grid, window
        self.heads, self.kernel = heads, kernel
        t = len(grid_positions(*grid))
        self.to_q = nn.Linear(dim, dim, bias=qkv_bias)
        self.to_k = nn.Linear(dim, heads if kind == "aft_conv" else dim, bias=qkv_bias)
        self.to_v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        if kind in ("aft_full", "aft_local"):
            self.pos_u = nn.Parameter(0.1 * torch.randn(t, factor_dim))
            self.pos_v = nn.Parameter(0.1 * torch.randn(t, factor_dim))
        if kind == "aft_conv":
            self.pos_kernel = nn.Parameter(torch.randn(heads, kernel, kernel))
            self.pos_gain = nn.Parameter(torch.zeros(heads))
            self.pos_shift = nn.Parameter(torch.zeros(heads))

    def biases(self):
        """w as [heads or 1, T, T] for the channel groups it applies to."""
        pos = grid_positions(*self.grid)
        t = len(pos)
        if self.kind == "aft_simple":
            return torch.zeros(1, t, t, dtype=self.proj.weight.dtype)
        if self.kind in ("aft_full", "aft_local"):
            w = self.pos_u @ self.pos_v.T
            if self.kind == "aft_local":
                near = lambda a, b: max(abs(a[0] - b[0]), abs(a[1] - b[1])) < self.window
                keep = torch.tensor([[a is None or b is None or near(a, b) for b in pos]
                                     for a in pos])
                w = torch.where(keep, w, torch.zeros_like(w))
            return w[None]
        k = self.pos_kernel
        mean = k.mean((1, 2), keepdim=True)
        std = ((k - mean) ** 2).mean((1, 2), keepdim=True).add(KERNEL_STD_EPS).sqrt()
        k = self.pos_gain[:, None, None] * (k - mean) / std + self.pos_shift[:, None, None]
        half = self.kernel // 2
        rows = []
        for a in pos:  # w[t, t'] = k[row' - row + half, col' - col + half] inside the kernel
            row = []
            for b in pos:
                dr, dc = (None, None) if a is None or b is None else (b[0] - a[0], b[1] - a[1])
                inside = dr is not None and abs(dr) <= half and abs(dc) <= half
                row.append(k[:, dr + half, dc + half] if inside
                           else torch.zeros(self.heads, dtype=k.dtype))
            rows.append(torch.stack(row, -1))
        return torch.stack(rows, -2)  # [h, T, T]

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        w = self.biases()
        groups = w.shape[0]
        if self.kind == "aft_conv":  # K has one channel per head: broadcast over its channels
            k = k.repeat_interleave(c // groups, dim=-1)
        w = w.repeat_interleave(c // groups, dim=0)  # [C, T, T]
        # e[b, t, t', c] = exp(K[b, t', c] + w[c, t, t'])
        e = torch.exp(k[:, None, :, :] + w.permute(1, 2, 0)[None])
        y = (e * v[:, None]).sum(2) / e.sum(2)
        return self.proj(torch.sigmoid(q) * y)


class Sra(nn.Module):
    def __init__(self, dim, grid, heads, head_dim, sr, qkv_bias=True):
        super().__init__()
        self.grid, self.h, self.d, self.sr = grid, heads, head_dim, sr
        a = heads * head_dim
        self.q = nn.Linear(dim, a, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * a, bias=qkv_bias)
        if sr > 1:
            self.sr_conv = nn.Conv2d(dim, dim, sr, stride=sr)
            self.norm = nn.LayerNorm(dim, eps=1e-5)
        self.proj = nn.Linear(a, dim)

    def named_for_cpp(self):
        return {n.replace("sr_conv.", "sr."): p for n, p in self.named_parameters()}

    def forward(self, x):
        b, n, c = x.shape
        hgt, wid, cls = self.grid
        ctx = x
        if self.sr > 1:
            first = 1 if cls else 0
            img = x[:, first:].transpose(1, 2).reshape(b, c, hgt, wid)
            red = self.sr_conv(img).flatten(2).transpose(1, 2)
            ctx = self.norm(torch.cat((x[:, :1], red), 1) if cls else red)
        q = self.q(x).reshape(b, n, self.h, self.d).transpose(1, 2)
        k, v = self.kv(ctx).reshape(b, -1, 2, self.h, self.d).permute(2, 0, 3, 1, 4)
        if sdpa.ENABLED:
            out = sdpa.attention(q, k, v, self.d ** -0.5)
        else:
            out = (q @ k.transpose(-1, -2) * self.d ** -0.5).softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, -1))


def yaml_value(v):
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def make_case(case, seed, module, params, dim, grid, mixer):
    torch.manual_seed(seed + 1000)
    module = module.double()
    with torch.no_grad():  # away from the init (aft_conv: gamma, beta != 0), f32-exact values
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
            p.copy_(p.float().double())
    hgt, wid, cls = grid
    x = torch.randn(2, hgt * wid + (1 if cls else 0), dim, dtype=torch.float64).float().double()
    x.requires_grad_(True)
    y = module(x)
    w = torch.randn_like(y)
    (y * w).sum().backward()
    named = params(module)
    tensors = {"state." + n: p.detach().float() for n, p in named.items()}
    tensors.update({"grad." + n: p.grad for n, p in named.items()})
    tensors.update({"input": x.detach(), "output": y.detach(), "grad_weight": w,
                    "grad.input": x.grad})
    mgf.save_safetensors(os.path.join(OUT_DIR, case + ".safetensors"), tensors,
                         {"generator": "scripts/golden_models/mixers_aft_sra.py", "case": case})
    with open(os.path.join(OUT_DIR, case + ".yaml"), "w") as f:
        f.write("# Mixer golden case (scripts/golden_models/mixers_aft_sra.py).\n")
        f.write(f"dim: {dim}\n")
        f.write(f"grid: [{hgt}, {wid}]\ncls_token: {yaml_value(cls)}\nfamily: vit\n")
        f.write(f"mixer: {yaml_value(mixer)}\n")


def aft_case(case, seed, grid, mixer, dim=8):
    opts = {k: v for k, v in mixer.items() if k != "type"}
    torch.manual_seed(seed)
    module = Aft(mixer["type"], dim, grid, **opts)
    make_case(case, seed, module, lambda m: dict(m.named_parameters()), dim, grid, mixer)


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    aft_case("mixer_aft_full", 31, (4, 4, False), {"type": "aft_full", "factor_dim": 6})
    aft_case("mixer_aft_simple", 32, (4, 4, True), {"type": "aft_simple", "qkv_bias": False})
    aft_case("mixer_aft_local", 33, (4, 4, True),
             {"type": "aft_local", "factor_dim": 5, "window": 2})
    aft_case("mixer_aft_conv", 34, (4, 4, False), {"type": "aft_conv", "heads": 2, "kernel": 3})
    aft_case("mixer_aft_conv_cls", 35, (4, 3, True), {"type": "aft_conv", "heads": 4, "kernel": 5})
    for case, seed, grid, sr in (("mixer_sra", 36, (4, 4, False), 2),
                                 ("mixer_sra_cls", 37, (4, 4, True), 3)):
        torch.manual_seed(seed)
        module = Sra(8, grid, heads=2, head_dim=3, sr=sr)
        make_case(case, seed, module, lambda m: m.named_for_cpp(), 8, grid,
                  {"type": "sra", "heads": 2, "head_dim": 3, "sr": sr})


if __name__ == "__main__":
    main()
