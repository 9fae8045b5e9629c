#!/usr/bin/python3
"""The reference for benchmark_loader: the same JPEG folder through Pillow and timm's ImageNet
training transform (RandomResizedCrop 224 bicubic, horizontal flip, RandAugment
rand-m9-mstd0.5-inc1, ToTensor, Normalize), one thread, as one DataLoader worker runs it. Without
timm (Debian has none), torchvision's RandAugment(2 ops, magnitude 9) stands in, and the output
says so. Prints images/s for decoding alone and for decoding plus the transform.
Usage: benchmark_loader_reference.py FOLDER [SECONDS]"""
import glob
import os
import sys
import time

import torch
from PIL import Image

torch.set_num_threads(1)
folder, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
files = sorted(glob.glob(os.path.join(folder, "**", "*.JPEG"), recursive=True))
if not files:
    sys.exit(f"no .JPEG files under {folder}")
try:
    from timm.data import create_transform
    transform = create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
                                 interpolation="bicubic", re_prob=0.0)
    which = "timm " + __import__("timm").__version__ + " create_transform (rand-m9-mstd0.5-inc1)"
except ImportError:
    from torchvision import transforms as T
    transform = T.Compose([
        T.RandomResizedCrop(224, interpolation=T.InterpolationMode.BICUBIC),
        T.RandomHorizontalFlip(), T.RandAugment(2, 9), T.ToTensor(),
        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    which = "torchvision RandAugment(2, 9) (timm not installed)"


def rate(work):
    for f in files[:8]:
        work(f)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        work(files[done % len(files)])
        done += 1
    return done / (time.perf_counter() - start)


decode = rate(lambda f: Image.open(f).convert("RGB"))
whole = rate(lambda f: transform(Image.open(f).convert("RGB")))
print(f"# reference: Pillow {Image.__version__}, {which}, 1 thread")
print(f"reference decode only, 1 thread:      {decode:8.1f} images/s")
print(f"reference decode + augment, 1 thread: {whole:8.1f} images/s")
