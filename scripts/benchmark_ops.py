#!/usr/bin/python3
# PyTorch twin of apps/benchmark_ops.cpp: the same cases, shapes, timing rule and output format.
"""Op micro-benchmark in PyTorch (forward; *_fwd_bwd cases also backward), twin of benchmark_ops.

Run with Debian's interpreter, which has torch:
  /usr/bin/python3 scripts/benchmark_ops.py [--device cpu|cuda|all] [--dtype f32|bf16] [--json]
                                            [--threads N]
Keep CASES, the batch sizes and the timing constants in step with apps/benchmark_ops.cpp.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

WARMUP_RUNS = 3
TARGET_SECONDS = 0.3
MIN_REPS, MAX_REPS = 5, 100
BATCHES = {"cpu": {"vit": 32, "caformer": 8}, "cuda": {"vit": 128, "caformer": 64}}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def shape_text(shape):
    return "x".join(str(s) for s in shape)


class CaseBuilder:
    def __init__(self, device, dtype):
        self.device, self.dtype = device, dtype
        self.gen = torch.Generator().manual_seed(1234)

    def random(self, *shape):
        return torch.randn(*shape, generator=self.gen).to(self.device, self.dtype)

    def linear(self, name, m, k, n):
        x, w = self.random(m, k), self.random(n, k)
        return (name, f"{shape_text((m, k))}*{shape_text((n, k))}^T", 2.0 * m * n * k, True,
                lambda: F.linear(x, w))

    def batched_abt(self, name, batch, m, k, n):
        a, b = self.random(batch, m, k), self.random(batch, n, k)
        return (name, f"{shape_text((batch, m, k))}@{shape_text((batch, n, k))}^T",
                2.0 * batch * m * n * k, True, lambda: torch.matmul(a, b.transpose(-2, -1)))

    def with_backward(self, case, leaves, channels_last=False):
        """<case>_fwd_bwd: forward, then backward from a fixed output gradient into every leaf
        (gradients cleared first); the work as in apps/benchmark_ops.cpp's with_backward."""
        name, shape, work, counts_flops, forward = case
        grad_y = self.random(*forward().shape)
        if channels_last:
            grad_y = grad_y.contiguous(memory_format=torch.channels_last)
        for leaf in leaves:
            leaf.requires_grad_(True)

        def run():
            with torch.enable_grad():
                for leaf in leaves:
                    leaf.grad = None
                y = forward()
                y.backward(grad_y)
            return y
        return (name + "_fwd_bwd", shape, 3.0 * work if counts_flops else 2.5 * work, counts_flops,
                run)

    def conv(self, name, x_shape, c_out, kernel, stride, padding, groups, bias, train=False,
             channels_last=False):
        x = self.random(*x_shape)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        w = self.random(c_out, x_shape[1] // groups, kernel, kernel)
        b = self.random(c_out) if bias else None
        h_out = (x_shape[2] + 2 * padding - kernel) // stride + 1
        w_out = (x_shape[3] + 2 * padding - kernel) // stride + 1
        flops = 2.0 * x_shape[0] * c_out * h_out * w_out * (x_shape[1] // groups) * kernel * kernel
        shape = f"{shape_text(x_shape)} k{kernel}s{stride}g{groups}->{c_out}"
        case = (name, shape, flops, True,
                lambda: F.conv2d(x, w, b, stride=stride, padding=padding, groups=groups))
        leaves = [x, w] + ([b] if bias else [])
        return self.with_backward(case, leaves, channels_last) if train else case

    def attention(self, name, batch, tokens, heads, head_dim, lsa, train=False, backend=None):
        """qkv_attention's twin: q, k, v strided views of one packed projection; `lsa` folds a
        learnable temperature into q and leaves the diagonal out, as the model twins do
        (scripts/golden_models/sdpa.py). backend: None (PyTorch's own choice of SDPA kernel), or
        one SDPA backend forced ("flash", "efficient", "cudnn", "math"), a row of its own."""
        if backend is not None and self.device.type != "cuda":
            return None  # the forced-backend rows are measured on CUDA only
        qkv = self.random(batch, tokens, 3 * heads * head_dim)
        scale = head_dim ** -0.5
        factor = torch.full((1,), scale, device=self.device) if lsa else None
        keep = ~torch.eye(tokens, dtype=torch.bool, device=self.device) if lsa else None

        def forward():
            q, k, v = qkv.view(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            if factor is not None:
                q = q * factor.to(q.dtype)
            with sdpa_backend(backend):
                return scaled_dot_attention(q, k, v, 1.0 if lsa else scale, keep)

        case = (name, f"{shape_text((batch, heads, tokens, head_dim))}{' lsa' if lsa else ''}",
                4.0 * batch * heads * tokens * tokens * head_dim, True, forward)
        if train:
            case = self.with_backward(case, [qkv] + ([factor] if lsa else []))
        return case if backend is None else (f"{case[0]}@{backend}",) + case[1:]

    def attention_qkv(self, name, lead, nq, nk, d, bias_shape, train=False, backend=None):
        """attention_qkv's twin: separate q, k, v and an additive bias broadcast over the leading
        dims it lacks (Swin's window attention, CaiT's class attention)."""
        if backend is not None and self.device.type != "cuda":
            return None
        q, k, v = self.random(*lead, nq, d), self.random(*lead, nk, d), self.random(*lead, nk, d)
        bias = self.random(*bias_shape) if bias_shape else None
        scale = d ** -0.5

        def forward():
            with sdpa_backend(backend):
                if has_sdpa():
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
                z = torch.matmul(q, k.transpose(-2, -1)) * scale
                return torch.matmul(torch.softmax(z if bias is None else z + bias, -1), v)

        n_lead = 1
        for x in lead:
            n_lead *= x
        shape = f"{shape_text((*lead, nq, d))}@{nk}" + \
            (f" bias {shape_text(bias_shape)}" if bias_shape else "")
        case = (name, shape, 4.0 * n_lead * nq * nk * d, True, forward)
        if train:
            case = self.with_backward(case, [q, k, v] + ([bias] if bias is not None else []))
        return case if backend is None else (f"{case[0]}@{backend}",) + case[1:]

    def bytes_of(self, t, passes):
        return float(t.numel() * t.element_size() * passes)

    def softmax(self, name, shape):
        x = self.random(*shape)
        return name, shape_text(shape), self.bytes_of(x, 2), False, lambda: torch.softmax(x, -1)

    def layer_norm(self, name, rows, width, train=False):
        x, w, b = self.random(rows, width), self.random(width), self.random(width)
        case = (name, shape_text((rows, width)), self.bytes_of(x, 2), False,
                lambda: F.layer_norm(x, (width,), w, b, 1e-5))
        return self.with_backward(case, [x, w, b]) if train else case

    def column_sum(self, name, rows, width):
        x = self.random(rows, width)
        return name, shape_text((rows, width)), self.bytes_of(x, 1), False, lambda: x.sum(0)

    def add(self, name, n):
        a, b = self.random(n), self.random(n)
        return name, shape_text((n,)), self.bytes_of(a, 3), False, lambda: torch.add(a, b)

    def star_relu(self, name, n, train=False):
        """MetaFormer's StarReLU as timm writes it: scale * relu(x) ** 2 + bias."""
        x, s, b = self.random(n), self.random(1), self.random(1)
        case = name, shape_text((n,)), self.bytes_of(x, 2), False, \
            lambda: s * F.relu(x) ** 2 + b
        return self.with_backward(case, [x, s, b]) if train else case

    def gelu(self, name, n, train=False):
        x = self.random(n)
        case = name, shape_text((n,)), self.bytes_of(x, 2), False, lambda: F.gelu(x)
        return self.with_backward(case, [x]) if train else case


def has_sdpa():
    """F.scaled_dot_product_attention with a `scale` argument (PyTorch 2.1 or later)."""
    return hasattr(F, "scaled_dot_product_attention") and \
        tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 1)


def scaled_dot_attention(q, k, v, scale, keep):
    """softmax(q k^T scale, entries where `keep` is False left out) v: SDPA where PyTorch has it,
    else the plain math (Debian's PyTorch 1.13)."""
    if has_sdpa():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)
    z = torch.matmul(q, k.transpose(-2, -1)) * scale
    if keep is not None:
        z = z.masked_fill(~keep, float("-inf"))
    return torch.matmul(torch.softmax(z, -1), v)


def sdpa_backend(name):
    """A context forcing one SDPA backend (torch.nn.attention.sdpa_kernel), or none for None."""
    if name is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([{"flash": SDPBackend.FLASH_ATTENTION,
                         "efficient": SDPBackend.EFFICIENT_ATTENTION,
                         "cudnn": SDPBackend.CUDNN_ATTENTION,
                         "math": SDPBackend.MATH}[name]])


SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


def attention_cases(bs, train):
    """The fused attention cases (ViT-S's LSA, plain multi-head attention of the same size,
    CAFormer-S18's stages 3 and 4, Swin-T's windows, CaiT-S's class attention), then on CUDA each with every SDPA backend forced: rows of
    PyTorch's alone (a backend that cannot take a problem, flash with a mask, is reported on
    stderr and skipped)."""
    shapes = [("vit_lsa_attention", bs["vit"], 65, 8, 64, True),
              ("vit_mhsa_attention", bs["vit"], 65, 8, 64, False),
              ("caf_s3_attention", bs["caformer"], 196, 10, 32, False),
              ("caf_s4_attention", bs["caformer"], 49, 16, 32, False)]
    forced = SDPA_BACKENDS if has_sdpa() and hasattr(torch.nn, "attention") else ()
    separate = [("swin_window_attention", (bs["vit"], 3, 16), 16, 16, 32, (3, 1, 16, 16)),
                ("cait_class_attention", (bs["vit"], 8), 1, 65, 64, ())]
    cases = []
    for b in (None,) + forced:
        cases += [lambda c, a=a, b=b: c.attention(*a, train=train, backend=b) for a in shapes]
        cases += [lambda c, a=a, b=b: c.attention_qkv(*a, train=train, backend=b)
                  for a in separate]
    return cases


def case_list(bs):
    vit_rows, s1_rows, caf = bs["vit"] * 65, bs["caformer"] * 3136, bs["caformer"]
    return [
        lambda c: c.linear("vit_qkv_linear", vit_rows, 512, 1536),
        lambda c: c.linear("vit_proj_linear", vit_rows, 512, 512),
        lambda c: c.batched_abt("vit_attn_qk", bs["vit"] * 8, 65, 64, 65),
        lambda c: c.linear("caf_s1_pw_linear", s1_rows, 64, 256),
        lambda c: c.linear("caf_s3_qkv_linear", caf * 196, 320, 960),
        lambda c: c.batched_abt("caf_s3_attn_qk", caf * 10, 196, 32, 196),
        lambda c: c.conv("caf_stem_conv7x7s4", (caf, 3, 224, 224), 64, 7, 4, 2, 1, True),
        lambda c: c.conv("caf_dwconv7x7", (caf, 128, 56, 56), 128, 7, 1, 3, 128, False),
        lambda c: c.conv("caf_down_conv3x3s2", (caf, 64, 56, 56), 128, 3, 2, 1, 1, True),
        lambda c: c.conv("caf_dwconv7x7_cl", (caf, 128, 56, 56), 128, 7, 1, 3, 128, False, False,
                         True),
        lambda c: c.conv("caf_down_conv3x3s2_cl", (caf, 64, 56, 56), 128, 3, 2, 1, 1, True, False,
                         True),
        lambda c: c.conv("cska_logits_conv3x3g8", (bs["vit"], 512, 8, 8), 520, 3, 1, 1, 8, True),
        lambda c: c.softmax("vit_softmax", (bs["vit"] * 8, 65, 65)),
        *attention_cases(bs, False),
        lambda c: c.layer_norm("caf_s1_layer_norm", s1_rows, 64),
        lambda c: c.layer_norm("vit_layer_norm", vit_rows, 512),
        lambda c: c.column_sum("vit_bias_grad", vit_rows, 512),
        lambda c: c.add("add_4M", 4 << 20),
        lambda c: c.gelu("gelu_4M", 4 << 20),
        lambda c: c.star_relu("caf_s1_star_relu", s1_rows * 256),
        # Forward and backward (training) of the ops whose backward has its own kernels.
        lambda c: c.conv("caf_stem_conv7x7s4", (caf, 3, 224, 224), 64, 7, 4, 2, 1, True, True),
        lambda c: c.conv("caf_dwconv7x7", (caf, 128, 56, 56), 128, 7, 1, 3, 128, False, True),
        lambda c: c.conv("caf_down_conv3x3s2", (caf, 64, 56, 56), 128, 3, 2, 1, 1, True, True),
        lambda c: c.conv("caf_dwconv7x7_cl", (caf, 128, 56, 56), 128, 7, 1, 3, 128, False, True,
                         True),
        lambda c: c.conv("caf_down_conv3x3s2_cl", (caf, 64, 56, 56), 128, 3, 2, 1, 1, True, True,
                         True),
        lambda c: c.conv("cska_logits_conv3x3g8", (bs["vit"], 512, 8, 8), 520, 3, 1, 1, 8, True,
                         True),
        lambda c: c.conv("cskaf_logits_conv3x3g8", (caf, 128, 28, 28), 6272, 3, 1, 1, 8, True,
                         True),
        *attention_cases(bs, True),
        lambda c: c.layer_norm("caf_s1_layer_norm", s1_rows, 64, True),
        lambda c: c.layer_norm("vit_layer_norm", vit_rows, 512, True),
        lambda c: c.gelu("gelu_4M", 4 << 20, True),
        lambda c: c.star_relu("caf_s1_star_relu", s1_rows * 256, True),
    ]


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_of_one_call(run, device):
    synchronize(device)
    start = time.perf_counter()
    run()
    synchronize(device)
    return time.perf_counter() - start


def time_case(run, device):
    warmup = 0.0
    for _ in range(WARMUP_RUNS):
        warmup = seconds_of_one_call(run, device)
    reps = min(max(int(TARGET_SECONDS / max(warmup, 1e-9)), MIN_REPS), MAX_REPS)
    return statistics.median(seconds_of_one_call(run, device) for _ in range(reps)), reps


def print_result(case, device, dtype_name, median, reps, as_json):
    name, shape, work, counts_flops, _ = case
    rate = work / median / 1e9
    unit = "GFLOP/s" if counts_flops else "GB/s"
    if as_json:
        print(json.dumps({"case": name, "shape": shape, "device": str(device), "dtype": dtype_name,
                          "median_ms": round(median * 1e3, 4), "rate": round(rate, 3),
                          "unit": unit, "reps": reps, "threads": torch.get_num_threads()}),
              flush=True)
    else:
        print(f"{name:<20} {str(device):<4} {dtype_name:<5} {shape:<34} {median * 1e3:10.3f} ms "
              f"{rate:10.2f} {unit}", flush=True)


def run_device(device, dtype_name, as_json, cases):
    builder = CaseBuilder(device, DTYPES[dtype_name])
    for make_case in case_list(BATCHES[device.type]):
        try:
            case = make_case(builder)
            if case is None:
                continue
            if cases and not any(part in case[0] for part in cases):
                continue
            median, reps = time_case(case[4], device)
            print_result(case, device, dtype_name, median, reps, as_json)
        except RuntimeError as e:  # e.g. an op without a kernel for this dtype
            print(f"case failed on {device}: {e}", file=sys.stderr)


def default_threads():
    """OpenMP's default in apps/benchmark_ops: OMP_NUM_THREADS, else the CPUs this process may use."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0]
    return int(env) if env.isdigit() and int(env) > 0 else len(os.sched_getaffinity(0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cases", default="",
                        help="only the cases whose name contains one of these comma-separated parts")
    parser.add_argument("--threads", type=int, default=default_threads(),
                        help="intra-op CPU threads (default: as OpenMP in benchmark_ops chooses)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmark_ops.py: --device cuda, but torch sees no CUDA device")
    devices = [] if args.device == "cuda" else [torch.device("cpu")]
    if args.device != "cpu" and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    if not args.json:
        print(f"# benchmark_ops.py: torch {torch.__version__}, {torch.get_num_threads()} threads, "
              f"dtype {args.dtype}, median of timed calls")
    with torch.no_grad():
        for device in devices:
            run_device(device, args.dtype, args.json, [p for p in args.cases.split(",") if p])


if __name__ == "__main__":
    main()
