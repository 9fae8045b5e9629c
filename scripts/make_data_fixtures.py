#!/usr/bin/python3
# Writes the dataset-reader fixtures of tests/data/test_datasets.cpp: tiny files in the official
# formats (CIFAR binary, SVHN MAT level 5, Fashion-MNIST IDX), made by other tools than ours.
"""Dataset fixtures in the real file formats.

Run with Debian's interpreter, which has numpy and scipy:  /usr/bin/python3 scripts/make_data_fixtures.py
Writes under tests/fixtures/data/:
  cifar10/data_batch_{1..5}.bin (1 record each), cifar10/test_batch.bin (2 records)
  cifar100/train.bin (2 records), cifar100/test.bin (1 record)
  svhn/{train,test}_32x32.mat         scipy.io.savemat(do_compression=True), y as double
  svhn_plain/{train,test}_32x32.mat   scipy.io.savemat(do_compression=False), y as uint8
  fashion_mnist/train-*-ubyte.gz      gzip'd IDX (3 images); t10k-*-ubyte plain IDX (2 images)
The pixel formulas and labels below are repeated in the C++ test, which checks every value.
"""
import gzip
import os
import struct

import numpy as np
import scipy.io

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                       "data")


def cifar_pixel(n, c, h, w):
    return (n * 7 + c * 50 + h * 3 + w * 5) % 256


def svhn_pixel(n, r, c, ch):
    return (n * 11 + ch * 40 + r * 2 + c * 7) % 256


def fmnist_pixel(n, r, c):
    return (n * 13 + r * 5 + c * 3) % 256


def cifar_planes(n):
    """One image's 3072 bytes: the R, G and B planes, each 32x32 row-major."""
    h, w = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    return np.concatenate([cifar_pixel(n, c, h, w).astype(np.uint8).ravel() for c in range(3)])


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def write_cifar10():
    # Global record index n runs over data_batch_1..5 (one record each), then test (n = 5, 6).
    for b in range(5):
        n = b
        write(os.path.join(OUT_DIR, "cifar10", f"data_batch_{b + 1}.bin"),
              bytes([(n * 3 + 1) % 10]) + cifar_planes(n).tobytes())
    test = b"".join(bytes([(n * 3 + 1) % 10]) + cifar_planes(n).tobytes() for n in (5, 6))
    write(os.path.join(OUT_DIR, "cifar10", "test_batch.bin"), test)


def write_cifar100():
    def record(n):
        return bytes([n % 20, (n * 37 + 5) % 100]) + cifar_planes(n).tobytes()
    write(os.path.join(OUT_DIR, "cifar100", "train.bin"), record(0) + record(1))
    write(os.path.join(OUT_DIR, "cifar100", "test.bin"), record(2))


def svhn_arrays(first, count, label_dtype):
    """X as MATLAB stores it, [32, 32, 3, N]; y [N, 1] in 1..10 (10 is the digit 0)."""
    x = np.zeros((32, 32, 3, count), dtype=np.uint8)
    r, c, ch = np.meshgrid(np.arange(32), np.arange(32), np.arange(3), indexing="ij")
    for i in range(count):
        x[:, :, :, i] = svhn_pixel(first + i, r, c, ch)
    y = np.array([[(first + i) * 3 % 10 + 1] for i in range(count)], dtype=label_dtype)
    return x, y


def write_svhn(folder, compress, label_dtype):
    for split, first, count in (("train", 0, 3), ("test", 3, 2)):
        x, y = svhn_arrays(first, count, label_dtype)
        path = os.path.join(OUT_DIR, folder, f"{split}_32x32.mat")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # `note` is a char array: the reader must skip variables it does not need.
        scipy.io.savemat(path, {"note": "fixture", "X": x, "y": y}, do_compression=compress,
                         format="5", oned_as="column")


def idx_bytes(magic, dims, payload):
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload


def write_fashion_mnist():
    for split, first, labels, compress in (("train", 0, [9, 0, 4], True),
                                           ("t10k", 3, [2, 7], False)):
        count = len(labels)
        r, c = np.meshgrid(np.arange(28), np.arange(28), indexing="ij")
        images = np.stack([fmnist_pixel(first + i, r, c) for i in range(count)]).astype(np.uint8)
        files = {
            f"{split}-images-idx3-ubyte": idx_bytes(0x803, [count, 28, 28], images.tobytes()),
            f"{split}-labels-idx1-ubyte": idx_bytes(0x801, [count], bytes(labels)),
        }
        for name, data in files.items():
            if compress:
                # mtime=0 keeps the file identical across runs.
                write(os.path.join(OUT_DIR, "fashion_mnist", name + ".gz"),
                      gzip.compress(data, mtime=0))
            else:
                write(os.path.join(OUT_DIR, "fashion_mnist", name), data)


def main():
    write_cifar10()
    write_cifar100()
    write_svhn("svhn", True, np.float64)
    write_svhn("svhn_plain", False, np.uint8)
    write_fashion_mnist()
    for root, _, files in sorted(os.walk(OUT_DIR)):
        for f in sorted(files):
            p = os.path.join(root, f)
            print(f"{os.path.relpath(p, OUT_DIR)}: {os.path.getsize(p)} bytes")


if __name__ == "__main__":
    main()
