#!/usr/bin/python3
# Our PyTorch reference of the CvT family (CIFAR CvT-13 with mhsa / ska / cska conv attention),
# written from the paper and our model notes; writes the golden fixtures of tests/models/test_cvt.cpp.
"""CvT golden fixtures and parameter counts.

Run with Debian's interpreter, which has torch:  /usr/bin/python3 scripts/golden_models/cvt.py
  --count   prints the trainable / all parameter counts of the full CIFAR configs instead.

Fixture layout as in swin.py. CSKA rows are ordered [cls, patches] (not the authors' defect 1) and
every key gets its own logit (not defect 3): in the cls stage the keys are [cls, strided grid];
the patch queries' grid logits come from the grouped conv, the cls query's grid logits from the
static keys, and the cls key column is q . cls_key where cls_key is the cls token's own query
(`cls_key: query`, parameter-free) or a learnable static key (`cls_key: static`).
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import make_golden_fixtures as mgf  # noqa: E402  (save_safetensors)
import sdpa  # noqa: E402  (PyTorch's fused attention, for the benchmark twin only)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from drop import drop_path  # noqa: E402  (training mode, for the benchmark twin only)

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "fixtures", "models")
mgf.MAX_FIXTURE_BYTES = 100 * 1024


def quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


class DwBn(nn.Module):
    def __init__(self, dim, stride):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, 3, stride, 1, bias=False, groups=dim)
        self.bn = nn.BatchNorm2d(dim)

    def forward(self, grid):  # [b, C, H, W] -> [b, T, C]
        return self.bn(self.conv(grid)).flatten(2).transpose(1, 2)


class ConvAttention(nn.Module):
    def __init__(self, kind, dim, heads, grid, cls, scale, cls_key):
        super().__init__()
        self.kind, self.heads, self.d, self.cls = kind, heads, dim // heads, cls
        self.grid, self.use_scale, self.cls_key_mode = grid, scale, cls_key
        kv_grid = (grid + 2 - 3) // 2 + 1
        self.n_grid_keys = kv_grid * kv_grid
        self.scale = dim ** -0.5
        self.conv_proj_q = DwBn(dim, 1)
        if kind == "mhsa":
            self.conv_proj_k = DwBn(dim, 2)
        self.conv_proj_v = DwBn(dim, 2)
        self.proj_q = nn.Linear(dim, dim)
        if kind == "mhsa":
            self.proj_k = nn.Linear(dim, dim)
        self.proj_v = nn.Linear(dim, dim)
        if kind == "ska":
            self.keys = nn.Parameter(torch.randn(heads, self.n_grid_keys + cls, self.d))
        if kind == "cska":
            self.to_logits = nn.Conv2d(dim, heads * self.n_grid_keys, 3, padding=1, groups=heads)
            if cls:
                self.cls_query_keys = nn.Parameter(torch.randn(heads, self.n_grid_keys, self.d))
                if cls_key == "static":
                    self.cls_key = nn.Parameter(torch.randn(heads, 1, self.d))
        self.proj = nn.Linear(dim, dim)

    def split_heads(self, t):
        b, n, _ = t.shape
        return t.reshape(b, n, self.heads, self.d).transpose(1, 2)

    def forward(self, x):
        b, n, c = x.shape
        cls_tok, tokens = (x[:, :1], x[:, 1:]) if self.cls else (None, x)
        grid = tokens.transpose(1, 2).reshape(b, c, self.grid, self.grid)
        q, v = self.conv_proj_q(grid), self.conv_proj_v(grid)
        if self.cls:
            q, v = torch.cat([cls_tok, q], 1), torch.cat([cls_tok, v], 1)
        q = self.split_heads(self.proj_q(q))
        v = self.split_heads(self.proj_v(v))
        if sdpa.ENABLED and self.kind != "cska":
            if self.kind == "mhsa":
                k = self.conv_proj_k(grid)
                k = self.split_heads(self.proj_k(torch.cat([cls_tok, k], 1) if self.cls else k))
            else:
                k = self.keys
            out = sdpa.attention(q, k, v, self.scale).transpose(1, 2).reshape(b, n, c)
            return self.proj(out)
        if self.kind == "mhsa":
            k = self.conv_proj_k(grid)
            if self.cls:
                k = torch.cat([cls_tok, k], 1)
            logits = q @ self.split_heads(self.proj_k(k)).transpose(-1, -2)
        elif self.kind == "ska":
            logits = q @ self.keys.transpose(-1, -2)
        else:
            logits = self.cska_logits(q)
        if self.kind != "cska" or self.use_scale:
            logits = logits * self.scale
        out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(out)

    def cska_logits(self, q):
        b = q.shape[0]
        qp = q[:, :, 1:] if self.cls else q
        qgrid = qp.transpose(-1, -2).reshape(b, -1, self.grid, self.grid)
        grid_logits = self.to_logits(qgrid).reshape(b, self.heads, self.n_grid_keys, -1)
        grid_logits = grid_logits.transpose(-1, -2)  # [b, h, patches, grid keys]
        if not self.cls:
            return grid_logits
        qc = q[:, :, :1]
        cls_key = self.cls_key.unsqueeze(0) if self.cls_key_mode == "static" else qc
        cls_col = q @ cls_key.transpose(-1, -2)  # [b, h, 1 + patches, 1]
        cls_row = qc @ self.cls_query_keys.transpose(-1, -2)  # [b, h, 1, grid keys]
        rows = torch.cat([cls_row, grid_logits], 2)
        return torch.cat([cls_col, rows], 3)


class Block(nn.Module):
    def __init__(self, kind, dim, heads, grid, cls, scale, cls_key, drop_path=0.0):
        super().__init__()
        self.drop_path = drop_path  # on both branches, in training
        self.norm1 = nn.LayerNorm(dim)
        self.attn = ConvAttention(kind, dim, heads, grid, cls, scale, cls_key)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential()
        self.mlp.fc1 = nn.Linear(dim, 4 * dim)
        self.mlp.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + drop_path(self.attn(self.norm1(x)), self.drop_path, self.training)
        h = self.mlp.fc2(quick_gelu(self.mlp.fc1(self.norm2(x))))
        return x + drop_path(h, self.drop_path, self.training)


class Embed(nn.Module):
    def __init__(self, cin, dim, k, s, p):
        super().__init__()
        self.proj = nn.Conv2d(cin, dim, k, s, p)
        self.norm = nn.LayerNorm(dim)


class Stage(nn.Module):
    def __init__(self, kind, cin, dim, heads, depth, k, s, p, grid, cls, scale, cls_key,
                 drop_path=0.0):
        super().__init__()
        self.embed = Embed(cin, dim, k, s, p)
        self.cls = cls
        if cls:
            self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        # Drop path ramps from 0 at the stage's first block to `drop_path` at its last (ours).
        rates = [drop_path * i / (depth - 1) if depth > 1 else 0.0 for i in range(depth)]
        self.blocks = nn.ModuleList([Block(kind, dim, heads, grid, cls, scale, cls_key, r)
                                     for r in rates])

    def forward(self, img):
        t = self.embed.proj(img)
        b, c, H, W = t.shape
        x = self.embed.norm(t.flatten(2).transpose(1, 2))
        if self.cls:
            x = torch.cat([self.cls_token.expand(b, -1, -1), x], 1)
        for blk in self.blocks:
            x = blk(x)
        cls_tok = x[:, 0] if self.cls else None
        grid = (x[:, 1:] if self.cls else x).transpose(1, 2).reshape(b, c, H, W)
        return grid, cls_tok


class CvT(nn.Module):
    def __init__(self, kinds, image, in_ch, classes, dims, heads, depths, kernels, strides, pads,
                 scales, cls_key="query", drop_path_rates=None):
        super().__init__()
        self.stages = nn.ModuleList()
        grid, cin, n = image, in_ch, len(dims)
        rates = drop_path_rates or [0.0] * n  # each stage's last block's, in training
        for i in range(n):
            grid = (grid + 2 * pads[i] - kernels[i]) // strides[i] + 1
            self.stages.append(Stage(kinds[i], cin, dims[i], heads[i], depths[i], kernels[i],
                                     strides[i], pads[i], grid, i == n - 1, scales[i], cls_key,
                                     rates[i]))
            cin = dims[i]
        self.norm = nn.LayerNorm(cin)
        self.head = nn.Linear(cin, classes)

    def forward(self, img):
        x = img
        for st in self.stages:
            x, cls_tok = st(x)
        return self.head(self.norm(cls_tok))


CVT13 = dict(heads=[1, 3, 6], depths=[1, 2, 10], kernels=[7, 3, 3], strides=[4, 2, 2],
             pads=[2, 1, 1])


def count(kind, classes=10):
    dims = [64, 198, 402] if kind == "ska" else [64, 192, 384]
    scales = [False, False, True] if kind == "cska" else [True] * 3
    m = CvT([kind] * 3, 32, 3, classes, dims, scales=scales, **CVT13)
    trainable = sum(p.numel() for p in m.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in m.parameters())


YAML = """family: cvt
image_size: {image}
in_channels: {in_ch}
num_classes: {classes}
mixers: {mixers}
dims: {dims}
heads: {heads}
depths: {depths}
kernels: {kernels}
strides: {strides}
paddings: {pads}
"""

GRAD_PARAMS = ["stages.0.embed.proj.weight", "stages.1.blocks.0.attn.proj_q.weight",
               "stages.1.blocks.0.attn.conv_proj_v.conv.weight", "head.weight"]
KIND_GRAD_PARAMS = {"mhsa": ["stages.1.blocks.0.attn.proj_k.weight"],
                    "ska": ["stages.0.blocks.0.attn.keys", "stages.1.blocks.0.attn.keys"],
                    "cska": ["stages.0.blocks.0.attn.to_logits.weight",
                             "stages.1.blocks.0.attn.to_logits.weight",
                             "stages.1.blocks.0.attn.cls_query_keys"]}


def randomize_norms(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".bn." in name:
                p.add_(0.1 * torch.randn_like(p))
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.copy_(0.1 * torch.randn_like(buf))
            if name.endswith("running_var"):
                buf.copy_(1 + 0.2 * torch.rand_like(buf))


def make_case(kind, seed, cls_key="query"):
    torch.manual_seed(seed)
    scales = [False, True] if kind == "cska" else [True, True]
    cfg = dict(image=16, in_ch=2, classes=3, dims=[4, 6], heads=[1, 2], depths=[1, 1],
               kernels=[3, 3], strides=[2, 2], pads=[1, 1])
    model = CvT([kind] * 2, cfg["image"], cfg["in_ch"], cfg["classes"], cfg["dims"],
                cfg["heads"], cfg["depths"], cfg["kernels"], cfg["strides"], cfg["pads"],
                scales, cls_key).double()
    randomize_norms(model)
    model.eval()
    x = torch.randn(2, cfg["in_ch"], cfg["image"], cfg["image"], dtype=torch.float64,
                    requires_grad=True)
    logits = model(x)
    w = torch.randn_like(logits)
    (logits * w).sum().backward()
    params = dict(model.named_parameters())
    tensors = {"param." + n: p.detach() for n, p in model.state_dict().items()}
    tensors.update({"input": x.detach(), "output": logits.detach(), "grad_weight": w,
                    "grad.input": x.grad})
    for n in GRAD_PARAMS + KIND_GRAD_PARAMS[kind]:
        tensors["grad." + n] = params[n].grad
    if kind == "cska":
        mixers = ("[{type: cska, scale: false}, {type: cska, scale: true, cls_key: %s}]"
                  % cls_key)
    else:
        mixers = f"[{kind}, {kind}]"
    case = f"cvt_{kind}" + ("" if cls_key == "query" else "_" + cls_key)
    mgf.save_safetensors(os.path.join(OUT_DIR, case + ".safetensors"), tensors,
                         {"generator": "scripts/golden_models/cvt.py", "case": case})
    with open(os.path.join(OUT_DIR, case + ".yaml"), "w") as f:
        f.write("# Reduced CvT for the golden test (scripts/golden_models/cvt.py).\n")
        f.write(YAML.format(mixers=mixers, **cfg))


def main():
    if "--count" in sys.argv:
        for kind in ("mhsa", "ska", "cska"):
            print(kind, count(kind), count(kind, 100))
        return
    os.makedirs(OUT_DIR, exist_ok=True)
    for seed, kind in enumerate(("mhsa", "ska", "cska")):
        make_case(kind, 200 + seed)
    make_case("cska", 210, cls_key="static")


if __name__ == "__main__":
    main()
