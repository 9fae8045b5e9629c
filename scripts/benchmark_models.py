#!/usr/bin/python3
# PyTorch twin of apps/benchmark: builds the model of a config from our reference PyTorch models
# (scripts/golden_models/) and times training or inference steps exactly as apps/benchmark does.
"""Model throughput in PyTorch (images/s), for comparison with apps/benchmark.

Run with an interpreter that has torch (Debian's /usr/bin/python3 here, torch 2.x on a GPU box):
  /usr/bin/python3 scripts/benchmark_models.py --config quickstart [--mode train|infer]
      [--batch 64] [--device cpu|cuda] [--precision f32|bf16] [--warmup 3] [--iters 10]
      [--threads N] [--set key.path=value ...] [--json]

Like apps/benchmark: images are randn(batch, C, S, S) from seed 0 and labels i % classes; `train`
times the step a PyTorch user writes for the experiment's optim and train sections: forward and
cross-entropy (label smoothing) under autocast, backward, the non-finite check (GradScaler's
found_inf, kept on the device), clip_grad_norm_ (train.clip_grad), the optimizer (optim.name:
torch.optim's Adam/AdamW/SGD with their default foreach implementation, timm's Lamb where timm is
installed, else AdamW) and an EMA of the weights (train.ema_decay, torch._foreach_lerp_ as timm's
ModelEmaV3), gradients set to None; `infer` a no-grad forward in eval mode; `warmup` untimed steps, then `iters` timed ones,
each between two device synchronisations; the median (the upper one for an even count) is
reported. bf16 runs the forward and loss under torch.autocast on CUDA (our --dtype bf16 converts
the whole model instead). f32 on CUDA allows TF32 matmuls and convolutions, as our cuBLASLt and
cuDNN paths do.

Attention runs as PyTorch users get it at its best: with `--attention sdpa` (the default where
PyTorch has it, 2.1 or later) every softmax attention whose math allows it goes through
F.scaled_dot_product_attention, its scale, learnable temperature, diagonal mask, relative
position bias and window masks included (MHSA, LSA, SKA, Swin, CvT, SRA); CSKA's convolutional
logits, CaiT's talking heads and the Table 4 activations have no SDPA form and stay as written.
Before timing, the SDPA model's output is checked against the plain math path on the same input.
`--compile` wraps the model in torch.compile (default mode; its compilation happens during the
warm-up steps, so give it a few).

The models are scripts/golden_models' references with the config's dropout, drop path and
CaiT's layer dropout (scripts/golden_models/drop.py), at our models' sites: `train` draws the
masks our training step draws (nn.Dropout's F.dropout, timm's per-sample drop path, CaiT's
layers picked on the host as lucidrains' CaiT does) and reports how many a forward draws.
With --compile, CaiT's blocks are compiled one by one in `train` (its layer choice is Python).
Supported: vit (lsa, ska, cska), cait (mhsa, ska, cska), swin (mhsa, ska, cska), cvt (mhsa, ska,
cska) and metaformer (sepconv, mhsa, pooling, identity, ska, cska). The trainable parameter count
is printed so that scripts/benchmark.sh can check it against ours.
"""
import argparse
import contextlib
import copy
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "golden_models"))
import cait as ref_cait  # noqa: E402
import cvt as ref_cvt  # noqa: E402
import metaformer as ref_metaformer  # noqa: E402
import swin as ref_swin  # noqa: E402
import vit as ref_vit  # noqa: E402
import drop  # noqa: E402
import sdpa  # noqa: E402


class ConfigError(Exception):
    pass


# --- configs: the same lookup, includes and --set overrides as src/config ------------------------

def find_config(name):
    """A path, or a bare name looked up as configs/<name>.yaml, then configs/models/<name>.yaml
    (in $SKA_CONFIG_DIR, ./configs, then this repository's configs)."""
    if os.path.isfile(name):
        return name
    dirs = []
    for d in (os.environ.get("SKA_CONFIG_DIR"), os.path.join(os.getcwd(), "configs"),
              os.path.join(REPO, "configs")):
        if d and os.path.realpath(d) not in map(os.path.realpath, dirs):
            dirs.append(d)
    stem = name if name.endswith(".yaml") else name + ".yaml"
    for d in dirs:
        for candidate in (os.path.join(d, stem), os.path.join(d, "models", stem)):
            if os.path.isfile(candidate):
                return candidate
    raise ConfigError(f"config '{name}' not found (looked in {', '.join(dirs)})")


def deep_merge(base, over):
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    merged = dict(base)
    for k, v in over.items():
        merged[k] = deep_merge(base[k], v) if k in base else v
    return merged


def resolve_includes(node, base_dir, chain):
    """`include: file` (or a list of files) in any map: the files' maps, relative to the including
    file, with the map's own keys merged over them."""
    if isinstance(node, list):
        return [resolve_includes(v, base_dir, chain) for v in node]
    if not isinstance(node, dict):
        return node
    own = {k: resolve_includes(v, base_dir, chain) for k, v in node.items() if k != "include"}
    if "include" not in node:
        return own
    files = node["include"] if isinstance(node["include"], list) else [node["include"]]
    base = {}
    for f in files:
        base = deep_merge(base, load_config_file(os.path.join(base_dir, f), chain))
    return deep_merge(base, own)


def load_config_file(path, chain=()):
    real = os.path.realpath(path)
    if real in chain:
        raise ConfigError("include cycle: " + " -> ".join(list(chain) + [real]))
    if not os.path.isfile(path):
        raise ConfigError(f"included file '{path}' not found")
    with open(path) as f:
        data = yaml.safe_load(f)
    return resolve_includes(data, os.path.dirname(path), tuple(chain) + (real,))


def apply_set(root, assignment):
    """key.path=value (a[1] indexes a list); the value is parsed as YAML."""
    if "=" not in assignment:
        raise ConfigError(f"--set '{assignment}': expected key.path=value")
    path, text = assignment.split("=", 1)
    steps = []
    for part in path.split("."):
        name, _, rest = part.partition("[")
        if name:
            steps.append(name)
        while rest:
            index, _, rest = rest.partition("]")
            steps.append(int(index))
            rest = rest.lstrip("[")
    node = root
    for step in steps[:-1]:
        node = node.setdefault(step, {}) if isinstance(step, str) else node[step]
    node[steps[-1]] = yaml.safe_load(text)


def experiment_config(name, sets):
    root = load_config_file(find_config(name))
    for assignment in sets:
        apply_set(root, assignment)
    return root


def model_config(name, sets):
    root = experiment_config(name, sets)
    return root["model"] if isinstance(root, dict) and "model" in root else root


def make_optimizer(params, optim_cfg):
    """The optimizer of the `optim:` section with the defaults of src/optim/optimizer.h."""
    name = optim_cfg.get("name", "adamw")
    lr = float(optim_cfg.get("lr", 1e-3))
    wd = float(optim_cfg.get("weight_decay", 0.0))
    betas = (float(optim_cfg.get("beta1", 0.9)), float(optim_cfg.get("beta2", 0.999)))
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(optim_cfg.get("momentum", 0.9)),
                               nesterov=bool(optim_cfg.get("nesterov", False)), weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=float(optim_cfg.get("eps", 1e-8)),
                                weight_decay=wd)
    if name == "lamb":
        try:
            from timm.optim import Lamb
            return Lamb(params, lr=lr, betas=betas, eps=float(optim_cfg.get("eps", 1e-6)),
                        weight_decay=wd, max_grad_norm=float(optim_cfg.get("max_grad_norm", 1.0)))
        except ImportError:
            pass
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=float(optim_cfg.get("eps", 1e-8)),
                             weight_decay=wd)


# --- models from the references -----------------------------------------------------------------

def mixer_spec(value, fallback):
    spec = {"type": value} if isinstance(value, str) else dict(value or {})
    spec.setdefault("type", fallback)
    return spec


def require_type(spec, allowed, where):
    if spec["type"] not in allowed:
        raise ConfigError(f"{where}: mixer '{spec['type']}' has no PyTorch reference here "
                          f"(supported: {', '.join(allowed)})")


def require_default(cfg, key, default, where):
    if key in cfg and cfg[key] != default:
        raise ConfigError(f"{where}.{key} = {cfg[key]}: the reference model only has {default}")


class FunctionalModel(nn.Module):
    """A reference written as forward(x, params, training) over a dict of named tensors, as a
    module."""

    def __init__(self, params, forward):
        super().__init__()
        self.names = list(params)
        self.values = nn.ParameterList([nn.Parameter(v.float()) for v in params.values()])
        self.forward_fn = forward

    def forward(self, x):
        return self.forward_fn(x, dict(zip(self.names, self.values)), self.training)


def build_vit(cfg):
    spec = mixer_spec(cfg.get("mixer"), "lsa")
    require_type(spec, ["lsa", "ska", "cska"], "mixer")
    default_heads = {"lsa": 8, "ska": 10, "cska": 8}[spec["type"]]
    side = cfg["image_size"] // cfg.get("patch_size", 4)
    m = dict(image=cfg["image_size"], channels=cfg["in_channels"], patch=cfg.get("patch_size", 4),
             dim=cfg.get("dim", 512), depth=cfg.get("depth", 6), mlp=cfg.get("mlp_dim", 512),
             classes=cfg["num_classes"], flavour="vit", cls=True, grid=(side, side),
             type=spec["type"], heads=spec.get("heads", cfg.get("heads", default_heads)),
             head_dim=spec.get("head_dim", cfg.get("head_dim", 64)),
             dropout=float(cfg.get("dropout", 0.1)), emb_dropout=float(cfg.get("emb_dropout", 0.1)))
    m["proj_drop"] = float(spec.get("proj_drop", m["dropout"]))  # as our mixers' hint
    for k in ("activation", "scale", "authors_row_order"):
        if k in spec:
            m[k] = spec[k]
    params = ref_vit.Params(0)
    ref_vit.vit_params(params, m)
    return FunctionalModel(params.p, lambda x, p, training: ref_vit.vit(x, p, m, training))


def build_cait(cfg):
    require_type(mixer_spec(cfg.get("mixer"), "mhsa"), ["mhsa", "ska", "cska"], "mixer")
    return ref_cait.CaiT(**{k: v for k, v in cfg.items() if k != "family"})


def build_swin(cfg):
    spec = mixer_spec(cfg.get("mixer"), "mhsa")
    require_type(spec, ["mhsa", "ska", "cska"], "mixer")
    require_default(cfg, "mlp_ratio", 4, "swin")
    return ref_swin.Swin(spec["type"], cfg["image_size"], cfg["in_channels"], cfg["num_classes"],
                         cfg.get("hidden_dim", 96), cfg.get("depths", [2, 2, 6, 2]),
                         cfg.get("heads", [3, 6, 12, 24]), cfg.get("head_dim", 32),
                         cfg.get("window_size", 4), cfg.get("downscaling_factors", [2, 2, 2, 1]))


def build_cvt(cfg):
    dims = cfg.get("dims", [64, 192, 384])
    specs = [mixer_spec(v, "mhsa") for v in cfg.get("mixers", ["mhsa"] * len(dims))]
    for i, s in enumerate(specs):
        require_type(s, ["mhsa", "ska", "cska"], f"mixers[{i}]")
    require_default(cfg, "mlp_ratio", 4, "cvt")
    require_default(cfg, "kv_stride", 2, "cvt")
    return ref_cvt.CvT([s["type"] for s in specs], cfg["image_size"], cfg["in_channels"],
                       cfg["num_classes"], dims, cfg.get("heads", [1, 3, 6]),
                       cfg.get("depths", [1, 2, 10]), cfg.get("kernels", [7, 3, 3]),
                       cfg.get("strides", [4, 2, 2]), cfg.get("paddings", [2, 1, 1]),
                       [s.get("scale", True) for s in specs], specs[-1].get("cls_key", "query"),
                       [float(r) for r in cfg.get("drop_path_rates", [0.0] * len(dims))])


class StaticKeyMixer(nn.Module):
    """ska / cska in a MetaFormer stage ([B, H, W, C] in and out) through golden_models/vit.py's
    functional mixers (MetaFormer flavour: no class token, fixed d^-0.5 scale)."""

    def __init__(self, spec, dim, grid):
        super().__init__()
        head_dim = spec.get("head_dim", 32 if spec["type"] == "ska" else 16)
        m = dict(flavour="metaformer", cls=False, grid=grid, type=spec["type"], head_dim=head_dim,
                 heads=spec.get("heads", max(1, dim // head_dim)))
        for k in ("activation", "scale"):
            if k in spec:
                m[k] = spec[k]
        params = ref_vit.Params(0)
        ref_vit.mixer_params(params, "", m, dim, grid[0] * grid[1])
        self.mixer = FunctionalModel(params.p,
                                     lambda x, p, _: ref_vit.MIXERS[m["type"]](x, p, "", m))

    def forward(self, x):
        b, h, w, c = x.shape
        return self.mixer(x.reshape(b, h * w, c)).reshape(b, h, w, c)


def build_metaformer(cfg):
    dims = cfg["dims"]
    specs = [mixer_spec(v, "sepconv") for v in cfg["mixers"]]
    for i, s in enumerate(specs):
        require_type(s, ["sepconv", "mhsa", "pooling", "identity", "ska", "cska"], f"mixers[{i}]")
        for key in ("attn_drop", "proj_drop"):  # the reference mixers have neither
            require_default(s, key, 0.0, f"mixers[{i}]")
    for key, default in (("mlp_activation", "starrelu"), ("norm_eps", 1e-6),
                         ("head_activation", "squared_relu")):
        require_default(cfg, key, default, "metaformer")
    # Stage grids: the 7x7 stride-4 stem, then a 3x3 stride-2 downsampling per stage.
    grids, side = [], cfg["image_size"]
    for i in range(len(dims)):
        side = (side + 4 - 7) // 4 + 1 if i == 0 else (side + 2 - 3) // 2 + 1
        grids.append((side, side))
    model = ref_metaformer.MetaFormer(
        cfg["in_channels"], cfg["num_classes"], cfg["depths"], dims,
        [s if s["type"] in ("sepconv", "mhsa", "pooling", "identity") else "identity"
         for s in specs],
        mlp_ratio=cfg.get("mlp_ratio", 4), res_scale_stages=cfg.get("res_scale_stages", (2, 3)),
        head_mlp_ratio=cfg.get("head_mlp_ratio", 4),
        head_norm_eps=float(cfg.get("head_norm_eps", 1e-6)),
        drop_path_rate=float(cfg.get("drop_path_rate", 0.0)),
        head_dropout=float(cfg.get("head_dropout", 0.0)))
    for stage, spec, dim, grid in zip(model.stages, specs, dims, grids):
        if spec["type"] in ("ska", "cska"):
            for block in stage:
                block.token_mixer = StaticKeyMixer(spec, dim, grid)
    return model


BUILDERS = {"vit": build_vit, "cait": build_cait, "swin": build_swin, "cvt": build_cvt,
            "metaformer": build_metaformer}


def build_model(cfg):
    family = cfg.get("family")
    if family not in BUILDERS:
        raise ConfigError(f"family '{family}' has no PyTorch reference here "
                          f"(supported: {', '.join(BUILDERS)})")
    for key in ("image_size", "in_channels", "num_classes"):
        if key not in cfg:
            raise ConfigError(f"model config has no '{key}'")
    # The metaformer reference reads mixer specs destructively; give each builder its own copy.
    return BUILDERS[family](copy.deepcopy(cfg))


# --- timing, as apps/benchmark.cpp ----------------------------------------------------------------

def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step, device, warmup, iters):
    for _ in range(warmup):
        step()
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    cuda = device.type == "cuda"
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    reserved = torch.cuda.max_memory_reserved(device) if cuda else None
    return times[len(times) // 2], peak, reserved


def saved_bytes_per_image(model, images, autocast):
    """What autograd saves for the backward pass of a training-mode forward, per image: the unique
    storages the saved-tensor hooks see, parameters left out, at n and 2n images (n = 2, or 1 for
    a batch under 4), their difference over n; apps/benchmark's activation figure (which also
    counts the output and dropout masks). None for a batch of 1 or without the hooks (PyTorch
    before 1.10)."""
    n = 2 if images.shape[0] >= 4 else 1
    if images.shape[0] < 2 * n or not hasattr(torch.autograd.graph, "saved_tensors_hooks"):
        return None
    params = {p.data_ptr() for p in model.parameters()}

    def saved(count):
        sizes = {}

        def pack(t):
            storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
            if storage.data_ptr() not in params:
                sizes[storage.data_ptr()] = storage.nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast():
            model(images[:count])
        return sum(sizes.values())
    return (saved(2 * n) - saved(n)) / n


def compile_model(model, mode):
    """torch.compile of the whole model; in training, of each block where the model picks its
    layers on the host (CaiT's layer dropout), since a graph of the whole forward would be
    compiled again for every new set of layers."""
    if mode == "train" and getattr(model, "layer_dropout", 0.0) > 0.0:
        for stack in (model.patch_layers, model.class_layers):
            for i in range(len(stack)):
                stack[i] = torch.compile(stack[i])
        return model
    return torch.compile(model)


def run(args):
    cfg = model_config(args.config, args.set)
    device = torch.device(args.device)
    if args.precision == "bf16" and device.type != "cuda":
        raise ConfigError("--precision bf16 needs --device cuda (the CPU runs f32)")
    if device.type == "cuda":
        # PyTorch's defaults, which are ours too (src/core/precision.h): strict f32 matrix
        # products, TF32 convolutions; cuDNN's algorithms timed or not as on our side.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
    sdpa.ENABLED = args.attention == "sdpa" and sdpa.available()
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    size, channels, classes = cfg["image_size"], cfg["in_channels"], cfg["num_classes"]
    images = torch.randn(args.batch, channels, size, size).to(device)
    labels = (torch.arange(args.batch) % classes).to(device)
    def autocast():
        if args.precision == "bf16":
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    sdpa_difference = None
    if sdpa.ENABLED:  # the fused path computes what the plain one does
        model.eval()
        with torch.no_grad(), autocast():
            fused = model(images[:8]).float()
            sdpa.ENABLED = False
            plain = model(images[:8]).float()
            sdpa.ENABLED = True
        sdpa_difference = ((fused - plain).abs().max() / plain.abs().max().clamp_min(1e-6)).item()
        limit = 5e-2 if args.precision == "bf16" else 1e-3
        if not sdpa_difference <= limit:
            raise ConfigError(f"SDPA and the math path disagree: relative difference "
                              f"{sdpa_difference:.2e} > {limit:g}")
    noise = None
    if args.mode == "train":  # the masks one training forward draws, counted before compiling
        model.train()
        drop.count(True)
        with torch.no_grad(), autocast():
            model(images[:2])
        drop.count(False)
        noise = dict(drop.SITES)
    if args.compile:
        if not hasattr(torch, "compile"):
            raise ConfigError(f"--compile needs PyTorch 2 (this is {torch.__version__})")
        model = compile_model(model, args.mode)

    step_text = ""
    if args.mode == "infer":
        model.eval()

        def step():
            with torch.no_grad(), autocast():
                model(images)
    else:
        model.train()
        root = experiment_config(args.config, args.set)
        optim_cfg = (root.get("optim") or {}) if "model" in root else {}
        train_cfg = (root.get("train") or {}) if "model" in root else {}
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_optimizer(trainable, optim_cfg)
        clip = float(train_cfg.get("clip_grad", 0.0))
        smoothing = float(train_cfg.get("label_smoothing", 0.0))
        ema_decay = float(train_cfg.get("ema_decay", 0.0))
        ema = [p.detach().clone() for p in model.parameters()] if ema_decay > 0 else None
        one = torch.ones(1, device=device)
        step_text = type(optimizer).__name__.lower() + (f", clip {clip:g}" if clip > 0 else "") + \
            (f", EMA {ema_decay:g}" if ema is not None else "")

        def step():
            with autocast():
                loss = F.cross_entropy(model(images).float(), labels, label_smoothing=smoothing)
            loss.backward()
            grads = [p.grad for p in trainable if p.grad is not None]
            # The check GradScaler makes, on the device (no .item()).
            if device.type == "cuda":
                found_inf = torch.zeros(1, device=device)
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, one)
            else:
                found_inf = ~torch.stack([torch.isfinite(g).all() for g in grads]).all()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(trainable, clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if ema is not None:
                with torch.no_grad():
                    torch._foreach_lerp_(ema, [p.detach() for p in model.parameters()],
                                         1.0 - ema_decay)
    median_ms, peak, reserved = time_steps(step, device, args.warmup, args.iters)
    activations = None
    if args.mode == "train":
        try:  # torch.compile's graphs may not take the hooks: then no figure
            activations = saved_bytes_per_image(model, images, autocast)
        except Exception:  # noqa: BLE001
            activations = None
    return {"config": find_config(args.config), "mode": args.mode, "device": str(device),
            "dtype": args.precision, "batch": args.batch,
            "images_per_s": args.batch * 1000.0 / median_ms, "median_ms": median_ms,
            "peak_bytes": peak, "peak_reserved_bytes": reserved, "trainable_params": params,
            "threads": torch.get_num_threads(),
            "step": step_text,
            "attention": "sdpa" if sdpa.ENABLED else "math", "sdpa_difference": sdpa_difference,
            "compiled": bool(args.compile), "activation_bytes_per_image": activations,
            "dropout_sites": noise["dropout"] if noise else None,
            "drop_path_sites": noise["drop_path"] if noise else None,
            "torch": torch.__version__}


def default_threads():
    """OpenMP's default in apps/benchmark: OMP_NUM_THREADS, else the CPUs this process may use."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0]
    return int(env) if env.isdigit() and int(env) > 0 else len(os.sched_getaffinity(0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a path or a bare config name")
    parser.add_argument("--mode", choices=["train", "infer"], default="train")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cudnn-benchmark", choices=["on", "off"], default="on",
                        help="torch.backends.cudnn.benchmark (our benchmark's flag of that name)")
    parser.add_argument("--attention", choices=["sdpa", "math"], default="sdpa",
                        help="F.scaled_dot_product_attention where the math allows (default, "
                             "PyTorch >= 2.1) or the references' plain softmax(q k^T) v")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()
    if args.batch < 1 or args.iters < 1 or args.warmup < 0:
        parser.error("--batch and --iters must be positive, --warmup non-negative")
    torch.set_num_threads(args.threads)
    try:
        r = run(args)
    except (ConfigError, yaml.YAMLError) as e:
        sys.exit(f"benchmark_models.py: error: {e}")
    if args.json:
        print(json.dumps(r), flush=True)
        return
    peak = (f", peak memory {r['peak_bytes'] / 2**20:.1f} MiB (reserved "
            f"{r['peak_reserved_bytes'] / 2**20:.1f} MiB)" if r["peak_bytes"] else "")
    print(f"{r['config']}  {r['mode']}  {r['device']}  {r['dtype']}  batch {r['batch']}:  "
          f"{r['images_per_s']:.1f} images/s  ({r['median_ms']:.1f} ms/step, median of "
          f"{args.iters}){peak}, {r['trainable_params']:,} trainable parameters (torch "
          f"{r['torch']}, {r['threads']} threads, attention {r['attention']}"
          f"{', compiled' if r['compiled'] else ''})" + (f" (step: {r['step']})" if r["step"] else ""))
    if r["dropout_sites"] is not None:
        print(f"  a training forward draws {r['dropout_sites']} dropout and "
              f"{r['drop_path_sites']} drop-path masks")
    if r["activation_bytes_per_image"] is not None:
        print(f"  autograd saves {r['activation_bytes_per_image'] / 2**20:.3f} MiB per image for "
              f"the backward pass")


if __name__ == "__main__":
    main()
