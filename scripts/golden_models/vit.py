#!/usr/bin/python3
# Golden fixtures of the `vit` family and the lsa / ska / cska mixers: our own float64 PyTorch
# reference written from the paper and our model notes, on reduced sizes, with the weights under our state_dict names.
"""Writes tests/fixtures/models/<case>.safetensors and <case>.yaml for tests/models/test_vit.cpp.

Run with Debian's interpreter, which has torch:  /usr/bin/python3 scripts/golden_models/vit.py

A fixture holds
  state.<name>     every parameter, under the C++ module's state_dict name
  input            images [B, C, H, W] (models) or tokens [B, N, C] (mixers)
  output           logits [B, classes] (models) or tokens (mixers), eval mode
  grad_weight      w, the weights of the scalar sum(output * w) that is back-propagated
  grad.input       d sum(output * w) / d input
  grad.<name>      the same for a few parameters
The YAML beside it is the model config (or, for a mixer, its width, grid, family and mixer map).
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import make_golden_fixtures as golden  # noqa: E402  (its safetensors writer)
import sdpa  # noqa: E402  (PyTorch's fused attention, for the benchmark twin only)
from drop import dropout  # noqa: E402  (training mode, for the benchmark twin only)

OUT_DIR = os.path.join(HERE, "..", "..", "tests", "fixtures", "models")
golden.MAX_FIXTURE_BYTES = 100 * 1024
LN_EPS = 1e-5


# --- reference mixers  ----------------------------------------------------

def split_heads(t, heads):
    b, n, a = t.shape
    return t.reshape(b, n, heads, a // heads).transpose(1, 2)


def merge_heads(t):
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def attention_weights(logits, activation, mask, p, prefix):
    """Softmax (masked entries at -finfo.max) or an elementwise activation (masked entries 0)."""
    if activation == "softmax":
        if mask is not None:
            logits = logits.masked_fill(mask, -torch.finfo(logits.dtype).max)
        return logits.softmax(dim=-1)
    if activation == "gelu":
        w = F.gelu(logits)
    elif activation == "relu":
        w = F.relu(logits)
    else:  # starrelu
        w = p[prefix + "attend.act.scale"] * F.relu(logits) ** 2 + p[prefix + "attend.act.bias"]
    return w.masked_fill(mask, 0.0) if mask is not None else w


def eye_mask(logits):
    """The diagonal of the last two dims of `logits`, on its device."""
    return torch.eye(*logits.shape[-2:], dtype=torch.bool, device=logits.device)


def lsa(x, p, pre, m):
    q, k, v = (split_heads(t, m["heads"]) for t in F.linear(x, p[pre + "qkv.weight"]).chunk(3, -1))
    if sdpa.ENABLED:
        keep = sdpa.off_diagonal(q.shape[-2], k.shape[-2], q.device)
        out = sdpa.attention(q, k, v, p[pre + "temperature"].exp(), keep=keep)
        return F.linear(merge_heads(out), p[pre + "proj.weight"], p[pre + "proj.bias"])
    logits = q @ k.transpose(-1, -2) * p[pre + "temperature"].exp()
    attn = attention_weights(logits, "softmax", eye_mask(logits), p, pre)
    return F.linear(merge_heads(attn @ v), p[pre + "proj.weight"], p[pre + "proj.bias"])


def ska(x, p, pre, m):
    h, d = m["heads"], m["head_dim"]
    if m["flavour"] == "vit":  # q and v from one Linear, learnable temperature, diagonal mask
        q, v = (split_heads(t, h) for t in F.linear(x, p[pre + "qv.weight"]).chunk(2, -1))
        scale, mask = p[pre + "temperature"].exp(), True
    else:  # MetaFormer STU: q is x itself, fixed d^-0.5
        q, v = split_heads(x, h), split_heads(F.linear(x, p[pre + "v.weight"]), h)
        scale, mask = d ** -0.5, False
    if sdpa.ENABLED and m.get("activation", "softmax") == "softmax":
        keys = p[pre + "k"]
        keep = sdpa.off_diagonal(q.shape[-2], keys.shape[-2], q.device) if mask else None
        out = sdpa.attention(q, keys, v, scale if m.get("scale", True) else 1.0, keep=keep)
        return F.linear(merge_heads(out), p[pre + "proj.weight"], p.get(pre + "proj.bias"))
    logits = q @ p[pre + "k"].transpose(-1, -2)
    if m.get("scale", True):
        logits = logits * scale
    mask = eye_mask(logits) if mask else None
    attn = attention_weights(logits, m.get("activation", "softmax"), mask, p, pre)
    return F.linear(merge_heads(attn @ v), p[pre + "proj.weight"], p.get(pre + "proj.bias"))


def cska(x, p, pre, m):
    h, d, (rows, cols), cls = m["heads"], m["head_dim"], m["grid"], m["cls"]
    b, n, _ = x.shape
    q, v = F.linear(x, p[pre + "qv.weight"]).chunk(2, -1)
    spatial = q[:, 1:] if cls else q
    image = spatial.transpose(1, 2).reshape(b, h * d, rows, cols)
    conv = F.conv2d(image, p[pre + "to_k.weight"], p[pre + "to_k.bias"], padding=1, groups=h)
    logits = conv.reshape(b, h, n, rows * cols).transpose(2, 3)   # [b, h, HW, n keys]
    if m["flavour"] == "metaformer" and m.get("scale", True):
        logits = logits * d ** -0.5
    if cls:  # the class query against its static key, with the learnable temperature
        cls_logits = split_heads(q[:, :1], h) @ p[pre + "cls_k"].transpose(-1, -2)
        cls_logits = cls_logits * p[pre + "temperature"].exp()
        rows_in_order = [logits, cls_logits] if m.get("authors_row_order") else [cls_logits, logits]
        logits = torch.cat(rows_in_order, dim=2)
    mask = eye_mask(logits) if m["flavour"] == "vit" else None
    attn = attention_weights(logits, m.get("activation", "softmax"), mask, p, pre)
    return F.linear(merge_heads(attn @ split_heads(v, h)), p[pre + "proj.weight"],
                    p.get(pre + "proj.bias"))


MIXERS = {"lsa": lsa, "ska": ska, "cska": cska}


# --- reference ViT for small datasets  -----------------------------------

def shifted_patches(images, patch):
    """The image and its four 1-pixel shifts (F.pad with a negative side crops), as patches."""
    shifts = ((1, -1, 0, 0), (-1, 1, 0, 0), (0, 0, 1, -1), (0, 0, -1, 1))
    x = torch.cat([images] + [F.pad(images, s) for s in shifts], dim=1)
    b, c = x.shape[:2]
    tiles = x.unfold(2, patch, patch).unfold(3, patch, patch)  # [b, c, rows, cols, p1, p2]
    return tiles.permute(0, 2, 3, 4, 5, 1).reshape(b, -1, patch * patch * c)


def layer_norm(x, p, name):
    return F.layer_norm(x, (x.shape[-1],), p[name + ".weight"], p[name + ".bias"], LN_EPS)


def vit(images, p, m, training=False):
    """Logits; in training, m's `emb_dropout` after the position embedding, `proj_drop` after
    the mixer's projection and `dropout` after GELU and after fc2 (our ViT's sites; all 0 by
    default)."""
    drop, emb_drop = m.get("dropout", 0.0), m.get("emb_dropout", 0.0)
    x = shifted_patches(images, m["patch"])
    x = F.linear(layer_norm(x, p, "patch_embed.norm"), p["patch_embed.proj.weight"],
                 p["patch_embed.proj.bias"])
    x = torch.cat([p["cls_token"].expand(x.shape[0], -1, -1), x], dim=1) + p["pos_embed"]
    x = dropout(x, emb_drop, training)
    for i in range(m["depth"]):
        pre = f"blocks.{i}."
        mixed = MIXERS[m["type"]](layer_norm(x, p, pre + "norm1"), p, pre + "mixer.", m)
        x = x + dropout(mixed, m.get("proj_drop", 0.0), training)
        h = F.gelu(F.linear(layer_norm(x, p, pre + "norm2"), p[pre + "mlp.fc1.weight"],
                            p[pre + "mlp.fc1.bias"]))
        h = F.linear(dropout(h, drop, training), p[pre + "mlp.fc2.weight"], p[pre + "mlp.fc2.bias"])
        x = x + dropout(h, drop, training)
    return F.linear(layer_norm(x[:, 0], p, "norm"), p["head.weight"], p["head.bias"])


# --- parameters ---------------------------------------------------------------------------------

class Params:
    """Random float64 parameters under our names (weights ~ U(+-1/sqrt(fan_in)), norms near 1)."""

    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)
        self.p = {}

    def randn(self, *shape, scale=1.0):
        return torch.randn(*shape, generator=self.gen, dtype=torch.float64) * scale

    def uniform(self, shape, bound):
        return (torch.rand(*shape, generator=self.gen, dtype=torch.float64) * 2 - 1) * bound

    def linear(self, name, out_f, in_f, bias=True):
        self.p[name + ".weight"] = self.uniform((out_f, in_f), in_f ** -0.5)
        if bias:
            self.p[name + ".bias"] = self.uniform((out_f,), in_f ** -0.5)

    def conv(self, name, out_c, in_per_group, k):
        fan_in = in_per_group * k * k
        self.p[name + ".weight"] = self.uniform((out_c, in_per_group, k, k), fan_in ** -0.5)
        self.p[name + ".bias"] = self.uniform((out_c,), fan_in ** -0.5)

    def norm(self, name, width):
        self.p[name + ".weight"] = 1.0 + self.randn(width, scale=0.1)
        self.p[name + ".bias"] = self.randn(width, scale=0.1)

    def temperature(self, name, head_dim):
        self.p[name] = torch.tensor([math.log(head_dim ** -0.5)], dtype=torch.float64) + \
            self.randn(1, scale=0.1)


def mixer_params(P, pre, m, dim, keys):
    h, d = m["heads"], m["head_dim"]
    a = h * d
    vit_flavour = m["flavour"] == "vit"
    if m["type"] == "lsa":
        P.linear(pre + "qkv", 3 * a, dim, bias=False)
        P.temperature(pre + "temperature", d)
    elif m["type"] == "ska":
        if vit_flavour:
            P.linear(pre + "qv", 2 * a, dim, bias=False)
            P.temperature(pre + "temperature", d)
        else:
            P.linear(pre + "v", a, dim, bias=False)
        P.p[pre + "k"] = P.randn(h, keys, d)
    else:  # cska
        P.linear(pre + "qv", 2 * a, dim, bias=False)
        P.conv(pre + "to_k", h * keys, d, 3)
        if m["cls"]:
            P.p[pre + "cls_k"] = P.randn(h, keys, d)
            P.temperature(pre + "temperature", d)
    if m.get("activation") == "starrelu":
        P.p[pre + "attend.act.scale"] = 1.0 + P.randn(1, scale=0.1)
        P.p[pre + "attend.act.bias"] = P.randn(1, scale=0.1)
    P.linear(pre + "proj", dim, a, bias=vit_flavour)


def vit_params(P, m):
    c, patch, dim = m["channels"], m["patch"], m["dim"]
    side = m["image"] // patch
    P.norm("patch_embed.norm", 5 * c * patch * patch)
    P.linear("patch_embed.proj", dim, 5 * c * patch * patch)
    P.p["cls_token"] = P.randn(1, 1, dim)
    P.p["pos_embed"] = P.randn(1, side * side + 1, dim)
    for i in range(m["depth"]):
        pre = f"blocks.{i}."
        P.norm(pre + "norm1", dim)
        mixer_params(P, pre + "mixer.", m, dim, side * side + 1)
        P.norm(pre + "norm2", dim)
        P.linear(pre + "mlp.fc1", m["mlp"], dim)
        P.linear(pre + "mlp.fc2", dim, m["mlp"])
    P.norm("norm", dim)
    P.linear("head", m["classes"], dim)


# --- fixtures -----------------------------------------------------------------------------------

def write_fixture(name, forward, params, inputs, grad_names, yaml_text, seed):
    gen = torch.Generator().manual_seed(seed + 1000)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    x = inputs.clone().requires_grad_(True)
    out = forward(x, leaves)
    w = torch.randn(*out.shape, generator=gen, dtype=torch.float64)
    (out * w).sum().backward()
    tensors = {"input": inputs, "output": out.detach(), "grad_weight": w, "grad.input": x.grad}
    for k, v in params.items():
        tensors["state." + k] = v
    for k in grad_names:
        tensors["grad." + k] = leaves[k].grad
    golden.save_safetensors(os.path.join(OUT_DIR, name + ".safetensors"), tensors,
                            {"writer": "scripts/golden_models/vit.py", "torch": torch.__version__,
                             "seed": seed})
    with open(os.path.join(OUT_DIR, name + ".yaml"), "w") as f:
        f.write(f"# Reduced config of tests/fixtures/models/{name}.safetensors "
                "(scripts/golden_models/vit.py).\n" + yaml_text)


def mixer_yaml(m):
    keys = {"type": m["type"], "heads": m["heads"], "head_dim": m["head_dim"]}
    for k in ("activation", "scale", "authors_row_order"):
        if k in m:
            keys[k] = str(m[k]).lower()
    return "{" + ", ".join(f"{k}: {v}" for k, v in keys.items()) + "}"


def write_vit_case(name, mixer, seed):
    m = dict(image=8, channels=2, patch=2, dim=16, depth=2, mlp=24, classes=3, flavour="vit",
             cls=True, grid=(4, 4), **mixer)
    P = Params(seed)
    vit_params(P, m)
    images = P.randn(2, m["channels"], m["image"], m["image"])
    yaml_text = (f"family: vit\nimage_size: {m['image']}\nin_channels: {m['channels']}\n"
                 f"num_classes: {m['classes']}\npatch_size: {m['patch']}\ndim: {m['dim']}\n"
                 f"depth: {m['depth']}\nmlp_dim: {m['mlp']}\ndropout: 0.1\nemb_dropout: 0.1\n"
                 f"mixer: {mixer_yaml(m)}\n")
    mixer_grads = [k for k in P.p if k.startswith("blocks.0.mixer.") and "proj" not in k]
    grads = ["patch_embed.proj.weight", "patch_embed.norm.weight", "cls_token", "pos_embed",
             "blocks.1.mlp.fc1.weight", "blocks.1.norm1.bias", "head.weight"] + mixer_grads
    write_fixture(name, lambda x, p: vit(x, p, m), P.p, images, grads, yaml_text, seed)


def write_mixer_case(name, mixer, seed, dim=16):
    m = dict(flavour="metaformer", cls=False, grid=(4, 4), **mixer)
    P = Params(seed)
    mixer_params(P, "", m, dim, 16)
    tokens = P.randn(2, 16, dim)
    yaml_text = (f"dim: {dim}\ngrid: [4, 4]\ncls_token: false\nfamily: metaformer\n"
                 f"mixer: {mixer_yaml(m)}\n")
    write_fixture(name, lambda x, p: MIXERS[m["type"]](x, p, "", m), P.p, tokens, list(P.p),
                  yaml_text, seed)


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    write_vit_case("vit_lsa", dict(type="lsa", heads=2, head_dim=4), seed=11)
    write_vit_case("vit_ska", dict(type="ska", heads=2, head_dim=4), seed=12)
    write_vit_case("vit_cska", dict(type="cska", heads=2, head_dim=4), seed=13)
    write_vit_case("vit_cska_authors_order",
                   dict(type="cska", heads=2, head_dim=4, authors_row_order=True), seed=14)
    write_mixer_case("mixer_ska_metaformer", dict(type="ska", heads=2, head_dim=8), seed=21)
    write_mixer_case("mixer_ska_metaformer_gelu_noscale",
                     dict(type="ska", heads=2, head_dim=8, activation="gelu", scale=False), seed=22)
    write_mixer_case("mixer_cska_metaformer", dict(type="cska", heads=4, head_dim=4), seed=23)
    write_mixer_case("mixer_cska_metaformer_starrelu",
                     dict(type="cska", heads=4, head_dim=4, activation="starrelu"), seed=24)
    write_mixer_case("mixer_cska_metaformer_relu_noscale",
                     dict(type="cska", heads=4, head_dim=4, activation="relu", scale=False),
                     seed=25)


if __name__ == "__main__":
    main()
