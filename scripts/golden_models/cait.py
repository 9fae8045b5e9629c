#!/usr/bin/python3
# Our PyTorch reference of the CaiT family (talking-heads attention with mhsa / ska / cska logits,
# class attention), written from the paper and our model notes; writes the fixtures of tests/models/test_cait.cpp.
"""CaiT golden fixtures and parameter counts.

Run with Debian's interpreter, which has torch:  /usr/bin/python3 scripts/golden_models/cait.py
  --count   prints the trainable parameter counts of cait_s, ska_cait_s and cska_cait_s instead.

Each fixture tests/fixtures/models/<case>.safetensors holds the weights under the C++ state_dict
names (prefix "state."), the input image "input", the logits "output" (eval mode), the fixed
weight "grad_weight" w, and the gradients "grad.input" and "grad.<param>" of sum(logits * w) for a
few parameters. Weights and input are rounded to float32 and stored as F32; the reference computes
in float64. The reduced model's YAML goes beside it.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import make_golden_fixtures as mgf  # noqa: E402  (save_safetensors)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from drop import dropout  # noqa: E402  (training mode, for the benchmark twin only)

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "fixtures", "models")
mgf.MAX_FIXTURE_BYTES = 100 * 1024


class Attention(nn.Module):
    """Talking-heads attention. logits: mhsa (q k^T), ska (static keys on a grid f times finer
    than the tokens, the f x f key weights pooled per token), cska (grouped conv of the query grid
    gives the logits). class_query: only token 0 queries."""

    def __init__(self, dim, heads, head_dim, grid, logits="mhsa", scaled=True, key_grid_factor=1,
                 activation="softmax", class_query=False, talking_heads=True, dropout=0.0):
        super().__init__()
        self.drop = dropout  # after the output projection, in training
        self.h, self.d, self.grid, self.kind = heads, head_dim, grid, logits
        self.scaled, self.f, self.act = scaled, key_grid_factor, activation
        self.class_query = class_query
        inner, n = heads * head_dim, grid * grid
        self.to_q = nn.Linear(dim, inner, bias=False)
        if logits == "mhsa":
            self.to_kv = nn.Linear(dim, 2 * inner, bias=False)
        elif logits == "cska":
            self.to_k = nn.Conv2d(inner, heads * n, 3, padding=1, groups=heads)
        else:
            self.static_key = nn.Parameter(torch.randn(heads, n * key_grid_factor ** 2, head_dim))
        if logits != "mhsa":
            self.to_v = nn.Linear(dim, inner, bias=False)
        self.talking_heads = talking_heads
        if talking_heads:
            self.mix_heads_pre_attn = nn.Parameter(torch.randn(heads, heads))
            self.mix_heads_post_attn = nn.Parameter(torch.randn(heads, heads))
        self.to_out = nn.Linear(inner, dim)

    def heads_of(self, t):  # [B, N, h*d] -> [B, h, N, d]
        return t.reshape(t.shape[0], t.shape[1], self.h, -1).transpose(1, 2)

    def forward(self, x):
        q_tok = self.to_q(x[:, :1] if self.class_query else x)
        q = self.heads_of(q_tok)
        if self.kind == "mhsa":
            k, v = self.to_kv(x).chunk(2, dim=-1)
            dots = q @ self.heads_of(k).transpose(-1, -2) * self.d ** -0.5
        else:
            v = self.to_v(x)
            if self.kind == "cska":
                b, n, a = q_tok.shape
                img = q_tok.transpose(1, 2).reshape(b, a, self.grid, self.grid)
                k = self.to_k(img)  # [B, h*K, g, g]
                dots = k.reshape(b, self.h, -1, n).transpose(2, 3)
            else:
                dots = torch.einsum("bhid,hjd->bhij", q, self.static_key)
            if self.scaled:
                dots = dots * self.d ** -0.5
        v = self.heads_of(v)
        if self.talking_heads:
            dots = torch.einsum("bhij,hg->bgij", dots, self.mix_heads_pre_attn)
        attn = {"softmax": lambda t: t.softmax(-1), "gelu": F.gelu, "relu": F.relu}[self.act](dots)
        if self.kind == "ska" and self.f > 1:
            b, h, i, _ = attn.shape
            g, f = self.grid, self.f
            attn = attn.reshape(b, h, i, g, f, g, f).sum((4, 6)).reshape(b, h, i, g * g)
        if self.talking_heads:
            attn = torch.einsum("bhij,hg->bgij", attn, self.mix_heads_post_attn)
        out = (attn @ v).transpose(1, 2).reshape(x.shape[0], -1, self.h * self.d)
        return dropout(self.to_out(out), self.drop, self.training)


class Scale(nn.Module):
    def __init__(self, dim, init):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x):
        return x * self.scale


class Mlp(nn.Module):
    def __init__(self, dim, hidden, dropout=0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = dropout  # after GELU and after fc2, in training

    def forward(self, x):
        h = dropout(F.gelu(self.fc1(x)), self.drop, self.training)
        return dropout(self.fc2(h), self.drop, self.training)


class Block(nn.Module):
    def __init__(self, dim, mlp_dim, attention, layer_scale_init=0.1, dropout=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attention
        self.ls1 = Scale(dim, layer_scale_init)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_dim, dropout)
        self.ls2 = Scale(dim, layer_scale_init)

    def forward(self, x):
        if not self.attn.class_query:
            x = x + self.ls1(self.attn(self.norm1(x)))
            return x + self.ls2(self.mlp(self.norm2(x)))
        cls, patches = x[:, :1], x[:, 1:]  # keys/values from [norm(cls), raw patches]
        cls = cls + self.ls1(self.attn(torch.cat((self.norm1(cls), patches), 1)))
        cls = cls + self.ls2(self.mlp(self.norm2(cls)))
        return torch.cat((cls, patches), 1)


class CaiT(nn.Module):
    def __init__(self, image_size, in_channels, num_classes, patch_size, dim, depth, cls_depth,
                 heads, head_dim, mlp_dim, mixer="mhsa", talking_heads=True, layer_scale_init=0.1,
                 dropout=0.0, emb_dropout=0.0, layer_dropout=0.0, **unused):
        """The dropout rates apply in training only and are 0 unless given (the golden fixtures
        are written in eval mode; the benchmark twin passes the config's)."""
        super().__init__()
        mix = {"type": mixer} if isinstance(mixer, str) else dict(mixer)
        kind = mix.pop("type")
        opts = {"logits": kind, "talking_heads": talking_heads, "dropout": dropout}
        self.emb_dropout, self.layer_dropout = emb_dropout, layer_dropout
        if kind != "mhsa":
            opts.update(scaled=mix.get("scale", kind == "ska"),
                        activation=mix.get("activation", "softmax"))
        if kind == "ska":
            opts["key_grid_factor"] = mix.get("key_grid_factor", 1)
        self.p, grid = patch_size, image_size // patch_size
        self.patch_embed = nn.Linear(in_channels * patch_size ** 2, dim)
        self.pos_embed = nn.Parameter(torch.randn(1, grid * grid, dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.patch_layers = nn.ModuleList(
            Block(dim, mlp_dim, Attention(dim, heads, head_dim, grid, **opts), layer_scale_init,
                  dropout)
            for _ in range(depth))
        self.class_layers = nn.ModuleList(
            Block(dim, mlp_dim, Attention(dim, heads, head_dim, grid, class_query=True,
                                          talking_heads=talking_heads, dropout=dropout),
                  layer_scale_init, dropout)
            for _ in range(cls_depth))
        self.head_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def kept(self, layers):
        """In training, each layer runs if its uniform draw is at least layer_dropout; when all
        drop out, one picked by a last draw runs (our kept_layers). Drawn on the host, as
        lucidrains' CaiT does."""
        if not self.training or self.layer_dropout <= 0.0 or len(layers) == 0:
            return list(layers)
        u = torch.rand(len(layers) + 1).tolist()
        kept = [layer for layer, ui in zip(layers, u) if ui >= self.layer_dropout]
        return kept or [layers[min(len(layers) - 1, int(u[-1] * len(layers)))]]

    def forward(self, img):
        b, c, hgt, wid = img.shape
        p = self.p
        x = img.reshape(b, c, hgt // p, p, wid // p, p).permute(0, 2, 4, 3, 5, 1)
        x = self.patch_embed(x.reshape(b, (hgt // p) * (wid // p), p * p * c)) + self.pos_embed
        x = dropout(x, self.emb_dropout, self.training)
        for layer in self.kept(self.patch_layers):
            x = layer(x)
        x = torch.cat((self.cls_token.expand(b, -1, -1), x), 1)
        for layer in self.kept(self.class_layers):
            x = layer(x)
        return self.head(self.head_norm(x[:, 0]))


def yaml_value(v):
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def make_case(case, seed, grad_params, **kw):
    torch.manual_seed(seed)
    model = CaiT(**kw).double().eval()
    with torch.no_grad():  # every parameter away from its init, so each one matters; f32 values
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
            p.copy_(p.float().double())
    image, ch = kw["image_size"], kw["in_channels"]
    x = torch.randn(2, ch, image, image, dtype=torch.float64).float().double()
    x.requires_grad_(True)
    logits = model(x)
    w = torch.randn_like(logits)
    (logits * w).sum().backward()
    params = dict(model.named_parameters())
    tensors = {"state." + n: p.detach().float() for n, p in model.state_dict().items()}
    tensors.update({"input": x.detach(), "output": logits.detach(), "grad_weight": w,
                    "grad.input": x.grad})
    for n in grad_params:
        tensors["grad." + n] = params[n].grad
    mgf.save_safetensors(os.path.join(OUT_DIR, case + ".safetensors"), tensors,
                         {"generator": "scripts/golden_models/cait.py", "case": case})
    keys = {"family": "cait", **kw, "dropout": 0.1, "emb_dropout": 0.1, "layer_dropout": 0.05}
    with open(os.path.join(OUT_DIR, case + ".yaml"), "w") as f:
        f.write("# Reduced CaiT for the golden test (scripts/golden_models/cait.py).\n")
        for k, v in keys.items():
            f.write(f"{k}: {yaml_value(v)}\n")


S_CONFIGS = {  # the paper's CIFAR models (patch 4 on 32x32)
    "cait_s": dict(heads=8, head_dim=64, mixer="mhsa"),
    "ska_cait_s": dict(heads=10, head_dim=62, mixer={"type": "ska", "key_grid_factor": 2}),
    "cska_cait_s": dict(heads=8, head_dim=64, mixer={"type": "cska", "scale": False}),
}


def main():
    if "--count" in sys.argv:
        for name, cfg in S_CONFIGS.items():
            m = CaiT(image_size=32, in_channels=3, num_classes=10, patch_size=4, dim=512, depth=6,
                     cls_depth=2, mlp_dim=512, **cfg)
            print(name, sum(p.numel() for p in m.parameters()))
        return
    os.makedirs(OUT_DIR, exist_ok=True)
    common = dict(image_size=16, in_channels=3, num_classes=5, patch_size=4, dim=16, depth=2,
                  cls_depth=1, mlp_dim=24)
    make_case("cait_mhsa", 21, heads=2, head_dim=8, mixer="mhsa", **common,
              grad_params=["patch_embed.weight", "pos_embed", "cls_token",
                           "patch_layers.0.attn.to_kv.weight",
                           "patch_layers.1.attn.mix_heads_pre_attn",
                           "patch_layers.1.attn.mix_heads_post_attn", "patch_layers.0.ls1.scale",
                           "class_layers.0.attn.to_q.weight", "class_layers.0.norm1.weight",
                           "class_layers.0.mlp.fc1.weight", "head_norm.bias", "head.weight"])
    make_case("cait_cska", 22, heads=2, head_dim=6, mixer={"type": "cska", "scale": False},
              **common,
              grad_params=["patch_layers.0.attn.to_k.weight", "patch_layers.0.attn.to_k.bias",
                           "patch_layers.1.attn.to_v.weight", "patch_layers.1.attn.to_q.weight",
                           "patch_layers.0.attn.mix_heads_pre_attn",
                           "class_layers.0.attn.to_kv.weight", "pos_embed"])
    make_case("cait_ska", 23, heads=3, head_dim=4,
              mixer={"type": "ska", "key_grid_factor": 2, "scale": True}, **common,
              grad_params=["patch_layers.0.attn.static_key", "patch_layers.1.attn.static_key",
                           "patch_layers.0.attn.to_v.weight", "patch_layers.1.attn.to_q.weight",
                           "patch_layers.1.attn.mix_heads_post_attn", "class_layers.0.ls2.scale"])


if __name__ == "__main__":
    main()
