#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora, fuzz/corpus/<target>/, from the test fixtures under
tests/fixtures, the configs and small handmade valid files (PNG, PPM, baseline JPEG), with the
standard library only. Run from anywhere:
    python3 fuzz/make_corpus.py
"""
import gzip
import json
import struct
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = ROOT / "fuzz" / "corpus"


def put(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def config_seeds():
    for p in ["configs/quickstart.yaml", "configs/cifar10_ska_vit.yaml", "configs/models/vit_s.yaml",
              "tests/fixtures/models/cvt_ska.yaml"]:
        put("config", Path(p).name, (ROOT / p).read_bytes())
    put("config", "anchors.yaml", b"base: &b {lr: 1.0e-3, betas: [0.9, 0.999]}\n"
        b"optim: *b\nsched: {<<: *b, name: cosine}\nlist: [1, 2.5, -3, null, true, 'x']\n")
    put("config", "multiline.yaml", b"a:\n  b:\n    - {c: 1}\n    - d: |\n        text\n"
        b"e: !!str 12\nf: 0x1F\ng: .inf\n")


def weight_map_seeds():
    for p in sorted((ROOT / "configs" / "weight_maps").glob("*.yaml")):
        put("weight_map", p.name, p.read_bytes())


def safetensors_bytes(tensors, metadata=None):
    header, blobs, offset = {}, b"", 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs += data
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + blobs


def safetensors_seeds():
    for name in ["python_all_dtypes.safetensors", "cross_entropy_head.safetensors"]:
        put("safetensors", name, (FIX / "golden" / name).read_bytes())
    put("safetensors", "small.safetensors", safetensors_bytes(
        {"w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), "b": ("BF16", [2], b"\x80\x3f\x00\x40"),
         "s": ("I64", [], struct.pack("<q", 7))}, {"format": "pt"}))
    put("safetensors", "empty.safetensors", safetensors_bytes({}))


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def train_state_bytes(version, tensors):
    """The layout write_train_state writes (src/train/checkpoint.cpp)."""
    header = {"epoch": 3, "batch": 2, "step": 50, "steps_per_epoch": 16, "nonfinite_total": 1,
              "lr": 1e-3, "best_top1": 41.5, "best_epoch": 2, "loss_scale": 65536.0,
              "info": {"config": "fuzz", "optimizer": "adamw"},
              "rngs": {"host": {"seed": 42, "offset": 1024}, "trainer": {"seed": 7, "offset": 0}}}
    if version >= 2:
        header.update({"loss_scale_growth_tracker": 5, "best_ema_top1": -1.0, "best_ema_epoch": -1})
    text = json.dumps(header).encode()
    out = b"SKATRAIN" + struct.pack("<IIQ", version, 0, len(text)) + text
    out += struct.pack("<Q", len(tensors))
    for name, dtype, shape, data in tensors:
        out += struct.pack("<I", len(name)) + name.encode() + struct.pack("<I", len(dtype)) + dtype.encode()
        out += struct.pack("<I", len(shape)) + b"".join(struct.pack("<q", d) for d in shape)
        out += struct.pack("<Q", len(data)) + data
    return out + struct.pack("<Q", fnv1a(out))


def train_state_seeds():
    put("train_state", "v2_empty.bin", train_state_bytes(2, []))
    put("train_state", "v1_one.bin", train_state_bytes(1, [("exp_avg.w", "F32", [2], struct.pack("<2f", 1, 2))]))
    put("train_state", "v2_two.bin", train_state_bytes(2, [
        ("exp_avg.w", "F32", [2, 3], struct.pack("<6f", *range(6))),
        ("step", "I64", [], struct.pack("<q", 50))]))


def idx_frame(flags, images, labels):  # the framing of fuzz_idx.cpp
    return bytes([flags]) + struct.pack("<H", len(labels)) + images + labels


def idx_seeds():
    fm = FIX / "data" / "fashion_mnist"
    images = (fm / "t10k-images-idx3-ubyte").read_bytes()
    labels = (fm / "t10k-labels-idx1-ubyte").read_bytes()
    put("idx", "plain", idx_frame(0, images, labels))
    put("idx", "gzip_by_fuzzer", idx_frame(3, images, labels))
    put("idx", "gz_files", idx_frame(0, (fm / "train-images-idx3-ubyte.gz").read_bytes(),
                                     (fm / "train-labels-idx1-ubyte.gz").read_bytes()))
    tiny_images = struct.pack(">IIII", 0x803, 2, 2, 3) + bytes(range(12))
    tiny_labels = struct.pack(">II", 0x801, 2) + bytes([3, 9])
    put("idx", "tiny", idx_frame(0, tiny_images, tiny_labels))
    put("idx", "tiny_gz", idx_frame(0, gzip.compress(tiny_images), gzip.compress(tiny_labels)))


def cifar_seeds():  # selector byte of fuzz_cifar.cpp: 0 CIFAR-10, 1 CIFAR-100
    put("cifar", "cifar10_test", b"\x00" + (FIX / "data" / "cifar10" / "test_batch.bin").read_bytes())
    put("cifar", "cifar100_test", b"\x01" + (FIX / "data" / "cifar100" / "test.bin").read_bytes())


def svhn_mat_seeds():
    put("svhn_mat", "compressed.mat", (FIX / "data" / "svhn" / "test_32x32.mat").read_bytes())
    put("svhn_mat", "plain.mat", (FIX / "data" / "svhn_plain" / "test_32x32.mat").read_bytes())


def npy_seeds():
    for p in sorted((FIX / "io").glob("*.npy")):
        put("npy", p.name, p.read_bytes())


def png_bytes(width, height, color_type, pixels):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    channels = {0: 1, 2: 3, 6: 4}[color_type]
    rows = b"".join(b"\x00" + pixels[y * width * channels:(y + 1) * width * channels] for y in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def image_seeds():
    put("image", "rgb_4x3.png", png_bytes(4, 3, 2, bytes(range(36))))
    put("image", "grey_3x2.png", png_bytes(3, 2, 0, bytes([0, 50, 100, 150, 200, 250])))
    put("image", "rgba_2x2.png", png_bytes(2, 2, 6, bytes(range(0, 256, 16))))
    put("image", "rgb_2x2.ppm", b"P6\n2 2\n255\n" + bytes(range(12)))
    put("image", "grey_8x8.jpg", jpeg_bytes([40]))
    put("image", "ycc_8x8.jpg", jpeg_bytes([40, -24, 16]))


def jpeg_bytes(dc_values):
    """A baseline 8x8 JPEG, one block per component holding only a DC value (1 to 3 components)."""
    def segment(marker, data):
        return bytes([0xFF, marker]) + struct.pack(">H", len(data) + 2) + data
    dc_bits = [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]  # the standard luminance DC table
    dc_codes, code, symbol = {}, 0, 0
    for length, count in enumerate(dc_bits, start=1):
        for _ in range(count):
            dc_codes[symbol] = (code, length)
            code, symbol = code + 1, symbol + 1
        code <<= 1
    bits = ""
    for value in dc_values:
        category = abs(value).bit_length()
        code, length = dc_codes[category]
        bits += format(code, f"0{length}b")
        if category:
            bits += format(value if value > 0 else value + (1 << category) - 1, f"0{category}b")
        bits += "0"  # AC: end of block (the one-symbol AC table below)
    bits += "1" * (-len(bits) % 8)
    scan = bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)).replace(b"\xff", b"\xff\x00")
    n = len(dc_values)
    comps = b"".join(bytes([i + 1, 0x11, 0]) for i in range(n))
    return (b"\xff\xd8" + segment(0xDB, b"\x00" + bytes([1] * 64))
            + segment(0xC0, struct.pack(">BHHB", 8, 8, 8, n) + comps)
            + segment(0xC4, b"\x00" + bytes(dc_bits) + bytes(range(12)))
            + segment(0xC4, b"\x10" + bytes([1] + [0] * 15) + b"\x00")
            + segment(0xDA, bytes([n]) + b"".join(bytes([i + 1, 0]) for i in range(n)) + b"\x00\x3f\x00")
            + scan + b"\xff\xd9")


if __name__ == "__main__":
    for gen in [config_seeds, weight_map_seeds, safetensors_seeds, train_state_seeds, idx_seeds,
                cifar_seeds, svhn_mat_seeds, npy_seeds, image_seeds]:
        gen()
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"make_corpus: {sum(1 for p in OUT.rglob('*') if p.is_file())} seeds, {total} bytes in {OUT}")
