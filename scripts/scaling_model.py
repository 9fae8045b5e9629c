#!/usr/bin/env python3
"""Predicts data-parallel scaling efficiency of our trainer on 8 GPUs (one node, NVLink) and 2x8
GPUs (InfiniBand) from a single-GPU step time, the model's gradient size and the way the trainer
overlaps gradient all-reduces with backward (GradReducer: buckets in reverse parameter order,
launched as soon as their last gradient is final, run one after another on the communication
stream; micro-steps of gradient accumulation do not communicate).

Model of one optimizer update on n GPUs, with `accumulate` micro-steps of step time T:
  - the first accumulate-1 micro-steps run at T (no communication);
  - in the last, backward takes the share `backward_share` of T; bucket k (bytes S_k) becomes
    ready when backward has produced the gradients of the parameters up to it, assumed in
    proportion to their size (replace with a measured timeline: --timeline FILE, JSON list of
    [seconds after backward start, bytes] per bucket);
  - a bucket's ring all-reduce takes latency + 2 (n-1)/n S_k / busbw; buckets queue on one stream;
  - the update waits for the last bucket: exposed = max(0, comm end - backward end);
  - NCCL kernels share the SMs with backward: overlapped communication slows compute by
    `INTERFERENCE` of its duration; each update adds two small all-reduces (the loss and the
    non-finite decision) and their host reads: `PER_UPDATE_S`.
  efficiency = accumulate T / (accumulate T + exposed + interference + per-update).
The loader is assumed to keep up (see README: cores per GPU). Usage:
  scripts/scaling_model.py [--json] [--timeline FILE --model NAME]
"""
import argparse
import json

# Inputs. Step times are per micro-batch on one H100 in bf16 autocast (README, Benchmarks,
# 2026-11: CAFormer-S18 562 img/s ours, 1,167 img/s eager PyTorch at batch 128; CSKA-ViT-S at
# batch 512 ~ 0.61 x PyTorch's). Models without a measured figure are scaled by GMACs from
# CAFormer-S18 ("est."). Parameter counts are the zoo's exact trainable counts.
MODELS = {
    #  name: (trainable params, micro-batch, seconds per micro-step ours, source)
    "caformer_s18": (26_341_656, 128, 128 / 562.0, "measured"),
    "cskaformer_s18": (28_983_186, 128, 128 / 562.0 * 6.399 / 4.107, "est. by GMACs"),
    "caformer_b36": (98_753_614, 128, 128 / 562.0 * 23.160 / 4.107, "est. by GMACs"),
    "cska_vit_s": (10_049_568, 512, 512 / 11_000.0, "est. (0.61 x eager)"),
}
# ImageNet recipe: global batch 4096 = 8 GPUs x 128 x accumulate 4; on 16 GPUs accumulate 2.
# The CIFAR recipe (CSKA-ViT-S) keeps its global batch of 512: 512 / n per GPU, no accumulation,
# so each GPU's step shrinks (assumed in proportion to its batch: optimistic for small batches)
# while the gradient stays the same size.
ACCUMULATE = {8: 4, 16: 2}
CIFAR_MODELS = {"cska_vit_s"}
BACKWARD_SHARE = 0.62  # of a micro-step; typical for these models (forward 1/3, backward 2/3)
# Published all-reduce bus bandwidths (nccl-tests, large messages): DGX H100 NVLink4 about
# 450 GB/s in one node; across nodes with 8x 400 Gb/s NDR InfiniBand per node about 350 GB/s at
# best. We take lower, sustained figures for 25 MB buckets.
LINKS = {8: ("1 node, NVLink 4", 360e9, 15e-6), 16: ("2 nodes x 8, NDR InfiniBand", 170e9, 40e-6)}
BUCKET_BYTES = 25 * 1024 * 1024
INTERFERENCE = 0.15   # share of overlapped all-reduce time lost by backward (assumed)
PER_UPDATE_S = 150e-6  # loss / skip-decision all-reduces and host reads per update (assumed)


def buckets(params, bytes_per_grad):
    total = params * bytes_per_grad
    sizes = []
    while total > 0:
        sizes.append(min(BUCKET_BYTES, total))
        total -= sizes[-1]
    return sizes


def exposed_comm(sizes, backward_s, n, busbw, latency, timeline=None):
    """Seconds the update waits for communication after backward, and the overlapped seconds."""
    total = float(sum(sizes))
    comm_end = 0.0
    produced = 0.0
    busy = 0.0
    for k, size in enumerate(sizes):
        produced += size
        ready = timeline[k][0] if timeline else backward_s * produced / total
        start = max(ready, comm_end)
        duration = latency + 2.0 * (n - 1) / n * size / busbw
        comm_end = start + duration
        busy += duration
    exposed = max(0.0, comm_end - backward_s)
    return exposed, busy - exposed


def predict(name, n, reduce_bytes, speedup, timeline=None):
    params, batch, step_s, source = MODELS[name]
    step_s /= speedup
    accumulate = ACCUMULATE[n]
    if name in CIFAR_MODELS:
        step_s *= (batch / n) / batch
        batch //= n
        accumulate = 1
    _, busbw, latency = LINKS[n]
    sizes = buckets(params, reduce_bytes)
    exposed, overlapped = exposed_comm(sizes, BACKWARD_SHARE * step_s, n, busbw, latency,
                                       timeline)
    update_s = accumulate * step_s
    lost = exposed + INTERFERENCE * overlapped + PER_UPDATE_S
    return {
        "model": name, "gpus": n, "step_s": step_s, "source": source, "accumulate": accumulate,
        "buckets": len(sizes), "exposed_ms": exposed * 1e3, "overlapped_ms": overlapped * 1e3,
        "lost_ms": lost * 1e3, "efficiency": update_s / (update_s + lost),
        "images_per_s": n * batch * accumulate / (update_s + lost),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--timeline", help="JSON [[ready_s, bytes], ...] of one model's buckets")
    ap.add_argument("--model", default="caformer_s18", help="the model --timeline belongs to")
    args = ap.parse_args()
    timeline = json.load(open(args.timeline)) if args.timeline else None
    rows = []
    for name in MODELS:
        for n in (8, 16):
            for label, reduce_bytes in (("f32", 4), ("bf16", 2)):
                for speed_label, speedup in (("ours today", 1.0), ("at 2x (issue target)", 2.0)):
                    r = predict(name, n, reduce_bytes, speedup,
                                timeline if name == args.model else None)
                    r.update(reduce_dtype=label, compute=speed_label)
                    rows.append(r)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'model':16} {'GPUs':>4} {'reduce':>6} {'compute':>21} {'step ms':>8} "
          f"{'comm ms':>8} {'lost ms':>8} {'efficiency':>10}")
    for r in rows:
        print(f"{r['model']:16} {r['gpus']:>4} {r['reduce_dtype']:>6} {r['compute']:>21} "
              f"{r['step_s'] * 1e3:8.1f} {r['exposed_ms'] + r['overlapped_ms']:8.2f} "
              f"{r['lost_ms']:8.2f} {100 * r['efficiency']:9.1f}%")
    print("links: " + "; ".join(f"{n} GPUs: {d}, {b / 1e9:.0f} GB/s bus bandwidth"
                                for n, (d, b, _) in LINKS.items()))


if __name__ == "__main__":
    main()
