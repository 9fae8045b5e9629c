#!/usr/bin/python3
# Writes the golden fixtures of tests/golden/test_golden.cpp: small blocks computed by PyTorch in
# float64 (inputs, parameters, output, gradients of a fixed weighted sum of the output).
"""Golden fixtures from a PyTorch reference.

Run with Debian's interpreter, which has torch:  /usr/bin/python3 scripts/make_golden_fixtures.py
The files are safetensors, written here with struct + json (no safetensors package), so the C++
reader is also tested on files that another tool wrote.

Names inside a fixture:
  input.<n> / param.<n>   differentiable leaves (the C++ test converts them to the dtype under test)
  const.<n>               non-differentiable inputs (class targets), kept as they are
  output                  the block's output
  grad_weight             w, the weights of the scalar sum(output * w) that is back-propagated
  grad.<n>                d sum(output * w) / d <n> for every input.* and param.*
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                       "golden")
MAX_FIXTURE_BYTES = 50 * 1024

# Sizes shared with tests/golden/test_golden.cpp.
BATCH, TOKENS, WIDTH, HEADS, MLP_HIDDEN = 2, 5, 8, 2, 16
LN_EPS = 1e-5            # ska::layer_norm default
LN_CHANNELS_EPS = 1e-6   # ska::layer_norm_channels_first default
LABEL_SMOOTHING = 0.1

SAFETENSORS_DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.bfloat16: "BF16", torch.float16: "F16",
    torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8",
}


# --- safetensors writer -------------------------------------------------------------------------

def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: write the raw 16-bit patterns
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def save_safetensors(path, tensors, metadata):
    assert sys.byteorder == "little", "safetensors data is little-endian"
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        raw = tensor_bytes(t)
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    size = os.path.getsize(path)
    assert size < MAX_FIXTURE_BYTES, f"{path} is {size} bytes; fixtures must stay under 50 KB"
    print(f"{os.path.relpath(path)}: {size} bytes, {len(tensors)} tensors")


# --- reference blocks (float64) -----------------------------------------------------------------

def layer_norm_channels_first(x, weight, bias, eps):
    mean = x.mean(dim=1, keepdim=True)
    var = x.var(dim=1, unbiased=False, keepdim=True)
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return (x - mean) / torch.sqrt(var + eps) * weight.view(shape) + bias.view(shape)


def mlp_block(p):
    h = F.layer_norm(p["x"], (WIDTH,), p["ln.weight"], p["ln.bias"], LN_EPS)
    h = F.linear(F.gelu(F.linear(h, p["fc1.weight"], p["fc1.bias"])), p["fc2.weight"],
                 p["fc2.bias"])
    return p["x"] + h


def attention_block(p):
    x = p["x"]
    b, n, c = x.shape
    d = c // HEADS
    h = F.layer_norm(x, (c,), p["ln.weight"], p["ln.bias"], LN_EPS)
    qkv = F.linear(h, p["qkv.weight"], p["qkv.bias"]).reshape(b, n, 3, HEADS, d)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)                      # each [b, heads, n, d]
    attn = torch.softmax(q @ k.transpose(-2, -1) * d ** -0.5, dim=-1)
    o = (attn @ v).transpose(1, 2).reshape(b, n, c)
    return x + F.linear(o, p["proj.weight"], p["proj.bias"])


def conv_block(p):
    h = F.conv2d(p["x"], p["conv.weight"], p["conv.bias"], stride=2, padding=1)
    main = F.gelu(layer_norm_channels_first(h, p["ln.weight"], p["ln.bias"], LN_CHANNELS_EPS))
    branch = F.conv2d(h, p["dw.weight"], p["dw.bias"], padding=1, groups=h.shape[1])
    return main + branch


def cross_entropy_head(p, consts):
    logits = F.linear(p["x"], p["head.weight"], p["head.bias"])
    return F.cross_entropy(logits, consts["target"], label_smoothing=LABEL_SMOOTHING)


# --- fixtures -----------------------------------------------------------------------------------

def randn(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def make_fixture(name, block, inputs, params, seed, consts=None, metadata=None):
    gen = torch.Generator().manual_seed(seed + 1000)
    leaves = {k: v.clone().requires_grad_(True) for k, v in {**inputs, **params}.items()}
    out = block(leaves, consts) if consts is not None else block(leaves)
    # A scalar output (the loss) is weighted by a constant that is not 1, to catch a lost factor.
    grad_weight = randn(gen, *out.shape) if out.dim() > 0 else torch.tensor(0.75).double()
    (out * grad_weight).sum().backward()

    tensors = {"output": out.detach(), "grad_weight": grad_weight}
    for kind, group in (("input", inputs), ("param", params)):
        for k in group:
            tensors[f"{kind}.{k}"] = leaves[k].detach()
            tensors[f"grad.{k}"] = leaves[k].grad
    for k, v in (consts or {}).items():
        tensors[f"const.{k}"] = v
    meta = {"writer": "scripts/make_golden_fixtures.py", "torch": torch.__version__,
            "seed": seed, **(metadata or {})}
    save_safetensors(os.path.join(OUT_DIR, f"{name}.safetensors"), tensors, meta)


def linear_params(gen, prefix, out_features, in_features):
    bound = in_features ** -0.5
    return {f"{prefix}.weight": randn(gen, out_features, in_features, scale=bound),
            f"{prefix}.bias": randn(gen, out_features, scale=0.1)}


def norm_params(gen, prefix, width):
    # Not ones/zeros, so the gradients of weight and bias are exercised with general values.
    return {f"{prefix}.weight": 1.0 + randn(gen, width, scale=0.1),
            f"{prefix}.bias": randn(gen, width, scale=0.1)}


def write_mlp(seed=1):
    gen = torch.Generator().manual_seed(seed)
    params = {**norm_params(gen, "ln", WIDTH), **linear_params(gen, "fc1", MLP_HIDDEN, WIDTH),
              **linear_params(gen, "fc2", WIDTH, MLP_HIDDEN)}
    make_fixture("mlp_block", mlp_block, {"x": randn(gen, BATCH, TOKENS, WIDTH)}, params, seed,
                 metadata={"formula": "x + fc2(gelu(fc1(layer_norm(x))))", "ln_eps": LN_EPS})


def write_attention(seed=2):
    gen = torch.Generator().manual_seed(seed)
    params = {**norm_params(gen, "ln", WIDTH), **linear_params(gen, "qkv", 3 * WIDTH, WIDTH),
              **linear_params(gen, "proj", WIDTH, WIDTH)}
    make_fixture("attention_block", attention_block, {"x": randn(gen, BATCH, TOKENS, WIDTH)},
                 params, seed,
                 metadata={"formula": "x + proj(softmax(q k^T d^-0.5) v), qkv = qkv(layer_norm(x))",
                           "heads": HEADS, "ln_eps": LN_EPS})


def write_conv(seed=3):
    gen = torch.Generator().manual_seed(seed)
    c_in, c_out, size = 3, WIDTH, 8
    params = {"conv.weight": randn(gen, c_out, c_in, 3, 3, scale=(9 * c_in) ** -0.5),
              "conv.bias": randn(gen, c_out, scale=0.1), **norm_params(gen, "ln", c_out),
              "dw.weight": randn(gen, c_out, 1, 3, 3, scale=1 / 3),
              "dw.bias": randn(gen, c_out, scale=0.1)}
    make_fixture("conv_block", conv_block, {"x": randn(gen, BATCH, c_in, size, size)}, params, seed,
                 metadata={"formula": "h = conv3x3_s2_p1(x); gelu(layer_norm_channels_first(h)) "
                                      "+ depthwise_conv3x3_p1(h)", "ln_eps": LN_CHANNELS_EPS})


def write_cross_entropy(seed=4):
    gen = torch.Generator().manual_seed(seed)
    rows, classes = 6, 5
    params = linear_params(gen, "head", classes, WIDTH)
    target = torch.randint(0, classes, (rows,), generator=gen, dtype=torch.int64)
    make_fixture("cross_entropy_head", cross_entropy_head, {"x": randn(gen, rows, WIDTH)}, params,
                 seed, consts={"target": target},
                 metadata={"formula": "cross_entropy(head(x), target, label_smoothing)",
                           "label_smoothing": LABEL_SMOOTHING})


def write_all_dtypes():
    """One tensor per supported dtype, for the reader test (tests/io/test_safetensors.cpp)."""
    base = torch.arange(6, dtype=torch.float64).reshape(2, 3) - 2
    tensors = {name: base.to(dtype) for dtype, name in SAFETENSORS_DTYPES.items() if name != "U8"}
    tensors["U8"] = (base + 252).to(torch.uint8)
    tensors["scalar"] = torch.tensor(0.5, dtype=torch.float64)
    save_safetensors(os.path.join(OUT_DIR, "python_all_dtypes.safetensors"), tensors,
                     {"writer": "scripts/make_golden_fixtures.py"})


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    write_all_dtypes()
    write_mlp()
    write_attention()
    write_conv()
    write_cross_entropy()


if __name__ == "__main__":
    main()
