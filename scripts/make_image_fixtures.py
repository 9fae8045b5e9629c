#!/usr/bin/python3
"""Writes tests/fixtures/images/: small JPEG and PNG files written by Pillow in the layouts image
datasets come in (baseline 4:2:0, progressive 4:4:4, greyscale, Adobe CMYK; RGBA, palette with
transparency, grey + alpha, 1-bit), and expected.txt with the pixels Pillow decodes from each,
converted to RGB (what torchvision's and timm's loaders see); and eval.txt, timm's evaluation
transform (torchvision Resize(floor(size / crop_pct)) on the shorter side, CenterCrop(size),
ToTensor, Normalize with ImageNet's mean and std) of rgb420.jpg and grey.jpg at a few sizes.
The window_*.jpg files (several iMCUs wide and tall, in each chroma layout) test window decoding
against our own whole-image decode, so they have no expected pixels.
Run with Debian's /usr/bin/python3 (python3-pil, python3-torchvision, libjpeg62-turbo).
Each line of expected.txt: file height width 3 values... (HWC uint8).
Each line of eval.txt: file size crop_pct interpolation channels values... (CHW float32)."""
import math
import os

import numpy as np
from PIL import Image
from torchvision import transforms

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "images")


def content(h, w, c, seed):
    """Smooth gradients plus noise: real DCT coefficients in every block."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    planes = [(x * 255 / max(w - 1, 1)), (y * 255 / max(h - 1, 1)), ((x + y) * 9 % 256)]
    base = np.stack([planes[i % 3] for i in range(c)], axis=-1)
    noisy = base + rng.normal(0, 24, size=base.shape)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def main():
    os.makedirs(OUT, exist_ok=True)
    files = {}
    rgb = Image.fromarray(content(9, 13, 3, 1), "RGB")
    rgb.save(f"{OUT}/rgb420.jpg", quality=90)  # Pillow's default subsampling: 4:2:0
    files["rgb420.jpg"] = rgb
    prog = Image.fromarray(content(11, 16, 3, 2), "RGB")
    prog.save(f"{OUT}/rgb444_progressive.jpg", quality=95, subsampling=0, progressive=True)
    grey = Image.fromarray(content(7, 10, 1, 3)[:, :, 0], "L")
    grey.save(f"{OUT}/grey.jpg", quality=85)
    cmyk = Image.fromarray(content(8, 9, 4, 4), "CMYK")
    cmyk.save(f"{OUT}/cmyk.jpg", quality=92)  # Pillow writes an Adobe marker, inverted values
    rgba = content(6, 7, 4, 5)
    Image.fromarray(rgba, "RGBA").save(f"{OUT}/rgba.png")
    palette = Image.fromarray(content(5, 8, 3, 6), "RGB").quantize(colors=12)
    palette.save(f"{OUT}/palette.png", transparency=3)
    Image.fromarray(content(6, 5, 2, 7), "LA").save(f"{OUT}/grey_alpha.png")
    Image.fromarray(content(4, 11, 1, 8)[:, :, 0] > 128).save(f"{OUT}/bilevel.png")
    Image.fromarray(content(50, 70, 3, 9), "RGB").save(f"{OUT}/window_420.jpg", quality=90)
    Image.fromarray(content(45, 67, 3, 10), "RGB").save(
        f"{OUT}/window_422_progressive.jpg", quality=90, subsampling=1, progressive=True)
    Image.fromarray(content(33, 41, 3, 11), "RGB").save(f"{OUT}/window_444.jpg", quality=90,
                                                        subsampling=0)
    Image.fromarray(content(29, 37, 1, 12)[:, :, 0], "L").save(f"{OUT}/window_grey.jpg", quality=90)
    names = ["rgb420.jpg", "rgb444_progressive.jpg", "grey.jpg", "cmyk.jpg", "rgba.png",
             "palette.png", "grey_alpha.png", "bilevel.png"]
    with open(f"{OUT}/expected.txt", "w") as f:
        for name in names:
            pixels = np.asarray(Image.open(f"{OUT}/{name}").convert("RGB"))
            h, w, c = pixels.shape
            f.write(" ".join([name, str(h), str(w), str(c)] + [str(v) for v in pixels.ravel()]))
            f.write("\n")
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    cases = [("rgb420.jpg", 5, 0.875, "bicubic", 3), ("rgb420.jpg", 7, 0.875, "bicubic", 3),
             ("rgb420.jpg", 6, 0.75, "bilinear", 3), ("rgb420.jpg", 16, 0.875, "bicubic", 3),
             ("grey.jpg", 6, 0.9, "bicubic", 3), ("rgb420.jpg", 5, 1.0, "bilinear", 1)]
    modes = {"bicubic": transforms.InterpolationMode.BICUBIC,
             "bilinear": transforms.InterpolationMode.BILINEAR}
    with open(f"{OUT}/eval.txt", "w") as f:
        for name, size, crop_pct, interpolation, channels in cases:
            image = Image.open(f"{OUT}/{name}").convert("RGB" if channels == 3 else "L")
            m = mean if channels == 3 else [sum(mean) / 3]
            sd = std if channels == 3 else [sum(std) / 3]
            t = transforms.Compose([
                transforms.Resize(math.floor(size / crop_pct), interpolation=modes[interpolation]),
                transforms.CenterCrop(size), transforms.ToTensor(), transforms.Normalize(m, sd)])
            values = t(image).numpy().ravel()
            f.write(" ".join([name, str(size), repr(crop_pct), interpolation, str(channels)] +
                             [repr(float(v)) for v in values]))
            f.write("\n")


if __name__ == "__main__":
    main()
