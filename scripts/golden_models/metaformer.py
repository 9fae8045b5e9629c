#!/usr/bin/python3
# Our PyTorch reference of the MetaFormer family (ConvFormer / CAFormer layouts with sepconv, mhsa,
# pooling, identity), written from the paper and our model notes; writes the fixtures of tests/models/test_metaformer.cpp.
"""MetaFormer golden fixtures and parameter counts.

Run with Debian's interpreter, which has torch:  /usr/bin/python3 scripts/golden_models/metaformer.py
  --count   prints the trainable parameter counts of caformer_s18/b36 and convformer_s18 instead.

Each fixture tests/fixtures/models/<case>.safetensors holds the weights under the C++ state_dict
names (prefix "param."), the input image "input", the logits "output", the fixed weight
"grad_weight" w, and the gradients "grad.input" and "grad.<param>" of sum(logits * w) for a few
parameters. Weights and input are rounded to float32 and stored as F32 (exact in float64, and half
the bytes); the reference computes in float64. The reduced model's YAML goes beside it.
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
from drop import drop_path, dropout  # noqa: E402  (training mode, for the benchmark twin only)

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "fixtures", "models")
mgf.MAX_FIXTURE_BYTES = 100 * 1024


class StarReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.scale * F.relu(x) ** 2 + self.bias


class SepConv(nn.Module):  # [B, H, W, C] -> [B, H, W, C]
    def __init__(self, dim):
        super().__init__()
        hidden = 2 * dim
        self.pwconv1 = nn.Linear(dim, hidden, bias=False)
        self.act1 = StarReLU()
        self.dwconv = nn.Conv2d(hidden, hidden, 7, padding=3, groups=hidden, bias=False)
        self.pwconv2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        h = self.act1(self.pwconv1(x))
        return self.pwconv2(self.dwconv(h.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


class Attention(nn.Module):
    def __init__(self, dim, head_dim=32, heads=0, qkv_bias=False, proj_bias=False):
        super().__init__()
        self.heads = heads if heads > 0 else max(1, dim // head_dim)
        self.d = head_dim
        a = self.heads * head_dim
        self.qkv = nn.Linear(dim, 3 * a, bias=qkv_bias)
        self.proj = nn.Linear(a, dim, bias=proj_bias)

    def forward(self, x):
        b, h, w, c = x.shape
        qkv = self.qkv(x).reshape(b, h * w, 3, self.heads, self.d).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if sdpa.ENABLED:
            out = sdpa.attention(q, k, v, self.d ** -0.5)
        else:
            out = (q @ k.transpose(-2, -1) * self.d ** -0.5).softmax(-1) @ v
        out = out.transpose(1, 2).reshape(b, h, w, self.heads * self.d)
        return self.proj(out)


class Pooling(nn.Module):
    def forward(self, x):
        y = F.avg_pool2d(x.permute(0, 3, 1, 2), 3, 1, 1, count_include_pad=False)
        return y.permute(0, 2, 3, 1) - x


class Identity(nn.Module):
    def forward(self, x):
        return x


def make_mixer(spec, dim):
    spec = {"type": spec} if isinstance(spec, str) else dict(spec)
    kind = spec.pop("type")
    if kind == "sepconv":
        return SepConv(dim)
    if kind == "mhsa":
        return Attention(dim, **spec)
    return Pooling() if kind == "pooling" else Identity()


class Scale(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.scale


def norm(dim, bias=False, eps=1e-6):
    return nn.LayerNorm(dim, eps=eps, elementwise_affine=True) if bias else NoBiasNorm(dim, eps)


class NoBiasNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, None, self.eps)


class Mlp(nn.Module):
    def __init__(self, dim, ratio):
        super().__init__()
        self.fc1 = nn.Linear(dim, int(ratio * dim), bias=False)
        self.act = StarReLU()
        self.fc2 = nn.Linear(int(ratio * dim), dim, bias=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, mixer, mlp_ratio, res_scale, drop_path=0.0):
        super().__init__()
        self.drop_path = drop_path  # on both branches, in training
        self.norm1 = norm(dim)
        self.token_mixer = make_mixer(mixer, dim)
        self.norm2 = norm(dim)
        self.mlp = Mlp(dim, mlp_ratio)
        if res_scale:
            self.res_scale1, self.res_scale2 = Scale(dim), Scale(dim)
        self.has_res_scale = res_scale

    def forward(self, x):
        rs1 = self.res_scale1 if self.has_res_scale else (lambda t: t)
        rs2 = self.res_scale2 if self.has_res_scale else (lambda t: t)
        x = rs1(x) + drop_path(self.token_mixer(self.norm1(x)), self.drop_path, self.training)
        return rs2(x) + drop_path(self.mlp(self.norm2(x)), self.drop_path, self.training)


class Downsampling(nn.Module):
    def __init__(self, cin, cout, stem):
        super().__init__()
        self.stem = stem
        if stem:
            self.conv = nn.Conv2d(cin, cout, 7, 4, 2)
            self.post_norm = norm(cout)
        else:
            self.pre_norm = norm(cin)
            self.conv = nn.Conv2d(cin, cout, 3, 2, 1)

    def forward(self, x):
        if self.stem:
            return self.post_norm(self.conv(x).permute(0, 2, 3, 1))
        return self.conv(self.pre_norm(x).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class MlpHead(nn.Module):
    def __init__(self, dim, classes, ratio, eps, dropout=0.0):
        super().__init__()
        self.drop = dropout  # before fc2, in training
        hidden = int(ratio * dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(dropout(self.norm(F.relu(self.fc1(x)) ** 2), self.drop, self.training))


class MetaFormer(nn.Module):
    def __init__(self, in_ch, classes, depths, dims, mixers, mlp_ratio=4, res_scale_stages=(2, 3),
                 head_mlp_ratio=4, head_norm_eps=1e-6, drop_path_rate=0.0, head_dropout=0.0):
        """drop_path_rate (ramped from 0 at the first block to it at the last, as ours and
        timm's) and head_dropout apply in training only; 0 unless given."""
        super().__init__()
        chans = [in_ch] + list(dims)
        self.downsample_layers = nn.ModuleList(
            [Downsampling(chans[i], chans[i + 1], i == 0) for i in range(len(dims))])
        total = sum(depths)
        rates = [drop_path_rate * i / (total - 1) if total > 1 else 0.0 for i in range(total)]
        self.stages = nn.ModuleList(
            [nn.Sequential(*[Block(dims[i], mixers[i], mlp_ratio, i in res_scale_stages,
                                   rates[sum(depths[:i]) + j])
                             for j in range(depths[i])]) for i in range(len(dims))])
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = MlpHead(dims[-1], classes, head_mlp_ratio, head_norm_eps, head_dropout)

    def forward(self, x):
        for down, stage in zip(self.downsample_layers, self.stages):
            x = stage(down(x))
        return self.head(self.norm(x.mean((1, 2))))


def count(depths, dims, mixers, classes=1000):
    model = MetaFormer(3, classes, depths, dims, mixers, head_norm_eps=1e-5)
    return sum(p.numel() for p in model.parameters())


def yaml_value(v):
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def make_case(case, seed, image, in_ch, classes, grad_params, **kw):
    torch.manual_seed(seed)
    model = MetaFormer(in_ch, classes, **kw).double()
    with torch.no_grad():  # every parameter away from its init, so each one matters; f32 values
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
            p.copy_(p.float().double())
    x = torch.randn(2, in_ch, image, image, dtype=torch.float64).float().double()
    x.requires_grad_(True)
    logits = model(x)
    w = torch.randn_like(logits)
    (logits * w).sum().backward()
    params = dict(model.named_parameters())
    tensors = {"param." + n: p.detach().float() for n, p in model.state_dict().items()}
    tensors.update({"input": x.detach().float(), "output": logits.detach(), "grad_weight": w,
                    "grad.input": x.grad})
    for n in grad_params:
        tensors["grad." + n] = params[n].grad
    mgf.save_safetensors(os.path.join(OUT_DIR, case + ".safetensors"), tensors,
                         {"generator": "scripts/golden_models/metaformer.py", "case": case})
    keys = {"family": "metaformer", "image_size": image, "in_channels": in_ch,
            "num_classes": classes, **kw}
    with open(os.path.join(OUT_DIR, case + ".yaml"), "w") as f:
        f.write("# Reduced MetaFormer for the golden test (scripts/golden_models/metaformer.py).\n")
        for k, v in keys.items():
            f.write(f"{k}: {yaml_value(v)}\n")


def main():
    if "--count" in sys.argv:
        s18, b36 = ([3, 3, 9, 3], [64, 128, 320, 512]), ([3, 12, 18, 3], [128, 256, 512, 768])
        ca, conv = ["sepconv", "sepconv", "mhsa", "mhsa"], ["sepconv"] * 4
        print("caformer_s18", count(*s18, ca), "convformer_s18", count(*s18, conv),
              "caformer_b36", count(*b36, ca))
        return
    os.makedirs(OUT_DIR, exist_ok=True)
    make_case("metaformer_mixed", 11, image=40, in_ch=1, classes=5, depths=[1, 1, 1, 1],
              dims=[4, 8, 12, 16],
              mixers=["sepconv", {"type": "mhsa", "head_dim": 4, "heads": 2, "qkv_bias": True,
                                  "proj_bias": True}, "pooling", {"type": "mhsa", "head_dim": 8}],
              mlp_ratio=2, res_scale_stages=[2, 3], head_mlp_ratio=2, head_norm_eps=1e-5,
              grad_params=["downsample_layers.0.conv.weight",
                           "stages.0.0.token_mixer.dwconv.weight",
                           "stages.0.0.token_mixer.act1.scale",
                           "stages.1.0.token_mixer.qkv.weight", "stages.1.0.token_mixer.proj.bias",
                           "stages.2.0.res_scale1.scale", "stages.3.0.mlp.act.bias",
                           "head.norm.weight", "head.fc2.bias"])
    make_case("metaformer_caformer", 12, image=40, in_ch=1, classes=4, depths=[2, 1, 1, 1],
              dims=[4, 8, 8, 16], mixers=["sepconv", "sepconv", "mhsa", {"type": "mhsa", "head_dim": 8}],
              mlp_ratio=2, res_scale_stages=[1, 3], head_mlp_ratio=2, head_norm_eps=1e-6,
              grad_params=["downsample_layers.1.pre_norm.weight",
                           "stages.0.1.token_mixer.pwconv1.weight",
                           "stages.1.0.res_scale2.scale", "stages.2.0.token_mixer.qkv.weight",
                           "stages.3.0.token_mixer.proj.weight", "norm.bias", "head.fc1.weight"])


if __name__ == "__main__":
    main()
