#!/usr/bin/env python3
"""Writes CIFAR-10 binary files (the official record layout: 1 label byte + 3072 pixel bytes,
data_batch_1..5.bin and test_batch.bin under DIR/cifar-10-batches-bin) filled with learnable
synthetic classes (a random template per class, half-strength, plus uniform noise). For checking a
machine's training pipeline and throughput where the real dataset cannot be downloaded; the
accuracies it gives mean nothing. Usage: scripts/make_synthetic_cifar10.py DIR [--per-file N]"""
import argparse
import os

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--per-file", type=int, default=10000, help="records per file (10000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    out = os.path.join(args.dir, "cifar-10-batches-bin")
    os.makedirs(out, exist_ok=True)
    templates = rng.integers(0, 256, (10, 3, 32, 32))
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    for name in names:
        labels = rng.integers(0, 10, args.per_file)
        noise = rng.integers(0, 128, (args.per_file, 3, 32, 32))
        images = np.clip(templates[labels] * 0.5 + noise, 0, 255).astype(np.uint8)
        records = np.concatenate([labels.astype(np.uint8)[:, None],
                                  images.reshape(args.per_file, -1)], axis=1)
        records.tofile(os.path.join(out, name))
    print(f"wrote {len(names)} files of {args.per_file} records to {out}")


if __name__ == "__main__":
    main()
