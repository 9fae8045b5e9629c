#!/usr/bin/python3
# Our PyTorch reference of the Swin family (CIFAR Swin-T with mhsa / ska / cska window attention),
# written from the paper and our model notes; writes the golden fixtures of tests/models/test_swin.cpp.
"""Swin golden fixtures and parameter counts.

Run with Debian's interpreter, which has torch:  /usr/bin/python3 scripts/golden_models/swin.py
  --count   prints the trainable / all parameter counts of the full CIFAR configs instead.

Each fixture tests/fixtures/models/<case>.safetensors holds the weights under the C++ state_dict
names (prefix "param."), the input image "input", the logits "output", the fixed weight
"grad_weight" w, and the gradients "grad.input" and "grad.<param>" of sum(logits * w) for a few
parameters. The reduced model's YAML goes beside it (<case>.yaml).
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import make_golden_fixtures as mgf  # noqa: E402  (save_safetensors)
import sdpa  # noqa: E402  (PyTorch's fused attention, for the benchmark twin only)

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "fixtures", "models")
mgf.MAX_FIXTURE_BYTES = 100 * 1024


def shift_masks(w, s):
    """The two additive masks of a shifted window: last window row / last window column."""
    upper_lower = torch.zeros(w * w, w * w, dtype=torch.float64)
    upper_lower[-s * w:, :-s * w] = float("-inf")
    upper_lower[:-s * w, -s * w:] = float("-inf")
    lr = torch.zeros(w, w, w, w, dtype=torch.float64)
    lr[:, -s:, :, :-s] = float("-inf")
    lr[:, :-s, :, -s:] = float("-inf")
    return upper_lower, lr.reshape(w * w, w * w)


def relative_index(w):
    """Flat index into the (2w-1)^2 table for every (query, key) pair of a window."""
    coords = torch.tensor([[y, x] for y in range(w) for x in range(w)])
    rel = coords[None, :, :] - coords[:, None, :] + w - 1
    return rel[:, :, 0] * (2 * w - 1) + rel[:, :, 1]


def to_windows(t, heads, w):
    """[b, H, W, h*d] -> [b, h, n_windows, w*w, d]."""
    b, H, W, A = t.shape
    d = A // heads
    t = t.reshape(b, H // w, w, W // w, w, heads, d).permute(0, 5, 1, 3, 2, 4, 6)
    return t.reshape(b, heads, (H // w) * (W // w), w * w, d)


def from_windows(t, H, W, w):
    b, h, nw, _, d = t.shape
    t = t.reshape(b, h, H // w, W // w, w, w, d).permute(0, 2, 4, 3, 5, 1, 6)
    return t.reshape(b, H, W, h * d)


class WindowAttention(nn.Module):
    def __init__(self, kind, dim, heads, head_dim, window, grid, shifted):
        super().__init__()
        self.kind, self.heads, self.d, self.w, self.shifted = kind, heads, head_dim, window, shifted
        self.grid = grid
        inner = heads * head_dim
        self.n_windows = (grid // window) ** 2
        if kind == "mhsa":
            self.to_qkv = nn.Linear(dim, 3 * inner, bias=False)
        else:
            self.to_qv = nn.Linear(dim, 2 * inner, bias=False)
        if kind == "ska":
            self.keys = nn.Parameter(torch.randn(heads, self.n_windows, window * window, head_dim))
        if kind == "cska":
            groups = heads * self.n_windows
            self.to_k = nn.Conv2d(groups * head_dim, groups * head_dim, 3, padding=1,
                                  groups=groups)
        self.pos_embedding = nn.Parameter(torch.randn(2 * window - 1, 2 * window - 1))
        if shifted:
            ul, lr = shift_masks(window, window // 2)
            self.upper_lower_mask = nn.Parameter(ul, requires_grad=False)
            self.left_right_mask = nn.Parameter(lr, requires_grad=False)
        self.to_out = nn.Linear(inner, dim)
        self.register_buffer("rel", relative_index(window), persistent=False)

    def forward(self, x):
        s = self.w // 2
        if self.shifted:
            x = torch.roll(x, (-s, -s), (1, 2))
        b, H, W, _ = x.shape
        if self.kind == "mhsa":
            q, k, v = [to_windows(t, self.heads, self.w) for t in self.to_qkv(x).chunk(3, -1)]
        else:
            q, v = [to_windows(t, self.heads, self.w) for t in self.to_qv(x).chunk(2, -1)]
        if self.kind == "ska":
            k = self.keys.unsqueeze(0)
        elif self.kind == "cska":
            qc = q.permute(0, 1, 2, 4, 3).reshape(b, -1, self.w, self.w)
            k = self.to_k(qc).reshape(b, self.heads, self.n_windows, self.d, self.w * self.w)
            k = k.transpose(-1, -2)
        if sdpa.ENABLED:
            bias = self.pos_embedding.flatten()[self.rel]
            if self.shifted:  # the masks of the shifted windows, per window
                nw_w = W // self.w
                window_masks = torch.zeros(q.shape[2], *bias.shape, device=bias.device)
                window_masks[-nw_w:] += self.upper_lower_mask
                window_masks[nw_w - 1::nw_w] += self.left_right_mask
                bias = bias + window_masks
            out = from_windows(sdpa.attention(q, k, v, self.d ** -0.5, bias=bias), H, W, self.w)
            out = self.to_out(out)
            return torch.roll(out, (s, s), (1, 2)) if self.shifted else out
        dots = q @ k.transpose(-1, -2) * self.d ** -0.5
        dots = dots + self.pos_embedding.flatten()[self.rel]
        if self.shifted:
            nw_w = W // self.w
            dots[:, :, -nw_w:] += self.upper_lower_mask
            dots[:, :, nw_w - 1::nw_w] += self.left_right_mask
        out = from_windows(dots.softmax(-1) @ v, H, W, self.w)
        out = self.to_out(out)
        if self.shifted:
            out = torch.roll(out, (s, s), (1, 2))
        return out


class SwinBlock(nn.Module):
    def __init__(self, kind, dim, heads, head_dim, window, grid, shifted):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(kind, dim, heads, head_dim, window, grid, shifted)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential()
        self.mlp.fc1 = nn.Linear(dim, 4 * dim)
        self.mlp.act = nn.GELU()
        self.mlp.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Stage(nn.Module):
    def __init__(self, kind, cin, dim, depth, factor, heads, head_dim, window, grid):
        super().__init__()
        self.factor = factor
        self.patch_merge = nn.Linear(cin * factor * factor, dim)
        self.blocks = nn.ModuleList([SwinBlock(kind, dim, heads, head_dim, window, grid, i % 2 == 1)
                                     for i in range(depth)])

    def forward(self, x):  # [b, H, W, C] channels-last, as nn.Unfold's (c, ki, kj) order
        b, H, W, C = x.shape
        f = self.factor
        x = x.reshape(b, H // f, f, W // f, f, C).permute(0, 1, 3, 5, 2, 4)
        x = self.patch_merge(x.reshape(b, H // f, W // f, C * f * f))
        for blk in self.blocks:
            x = blk(x)
        return x


class Swin(nn.Module):
    def __init__(self, kind, image, in_ch, classes, hidden, depths, heads, head_dim, window,
                 factors):
        super().__init__()
        self.stages = nn.ModuleList()
        cin, grid = in_ch, image
        for i, (depth, h, f) in enumerate(zip(depths, heads, factors)):
            grid //= f
            dim = hidden * 2 ** i
            self.stages.append(Stage(kind, cin, dim, depth, f, h, head_dim, window, grid))
            cin = dim
        self.head_norm = nn.LayerNorm(cin)
        self.head = nn.Linear(cin, classes)

    def forward(self, img):
        x = img.permute(0, 2, 3, 1)
        for st in self.stages:
            x = st(x)
        return self.head(self.head_norm(x.mean(dim=(1, 2))))


def count(kind, classes=10):
    m = Swin(kind, 32, 3, classes, 96, (2, 2, 6, 2), (3, 6, 12, 24), 32, 4, (2, 2, 2, 1))
    trainable = sum(p.numel() for p in m.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in m.parameters())


YAML = """family: swin
image_size: {image}
in_channels: {in_ch}
num_classes: {classes}
mixer: {kind}
hidden_dim: {hidden}
depths: {depths}
heads: {heads}
head_dim: {head_dim}
window_size: {window}
downscaling_factors: {factors}
"""

GRAD_PARAMS = ["stages.0.patch_merge.weight", "stages.0.blocks.1.attn.pos_embedding",
               "head.weight"]
KIND_GRAD_PARAMS = {"mhsa": "stages.1.blocks.1.attn.to_qkv.weight",
                    "ska": "stages.1.blocks.1.attn.keys",
                    "cska": "stages.1.blocks.1.attn.to_k.weight"}


def make_case(kind, seed):
    torch.manual_seed(seed)
    cfg = dict(kind=kind, image=16, in_ch=2, classes=3, hidden=4, depths=[2, 2], heads=[1, 2],
               head_dim=4, window=4, factors=[2, 2])
    model = Swin(kind, cfg["image"], cfg["in_ch"], cfg["classes"], cfg["hidden"], cfg["depths"],
                 cfg["heads"], cfg["head_dim"], cfg["window"], cfg["factors"]).double()
    with torch.no_grad():  # visible biases: LayerNorm affine away from 1/0
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, cfg["in_ch"], cfg["image"], cfg["image"], dtype=torch.float64,
                    requires_grad=True)
    logits = model(x)
    w = torch.randn_like(logits)
    (logits * w).sum().backward()
    params = dict(model.named_parameters())
    tensors = {"param." + n: p.detach() for n, p in model.state_dict().items()}
    tensors.update({"input": x.detach(), "output": logits.detach(), "grad_weight": w,
                    "grad.input": x.grad})
    for n in GRAD_PARAMS + [KIND_GRAD_PARAMS[kind]]:
        tensors["grad." + n] = params[n].grad
    case = f"swin_{kind}"
    mgf.save_safetensors(os.path.join(OUT_DIR, case + ".safetensors"), tensors,
                         {"generator": "scripts/golden_models/swin.py", "case": case})
    with open(os.path.join(OUT_DIR, case + ".yaml"), "w") as f:
        f.write("# Reduced Swin for the golden test (scripts/golden_models/swin.py).\n")
        f.write(YAML.format(**cfg))


def main():
    if "--count" in sys.argv:
        for kind in ("mhsa", "ska", "cska"):
            print(kind, count(kind), count(kind, 100))
        return
    os.makedirs(OUT_DIR, exist_ok=True)
    for seed, kind in enumerate(("mhsa", "ska", "cska")):
        make_case(kind, 100 + seed)


if __name__ == "__main__":
    main()
