#!/usr/bin/python3
"""Writes tests/fixtures/augment/resize.txt: PIL's crop-then-resize (torchvision's resized_crop,
the core of RandomResizedCrop and of the eval transform's resize) on windows of a 30x27 RGB and a
30x27 greyscale image, down, up, mixed and one axis unchanged, bicubic and bilinear: images tall
enough for several of image_resized_crop's 16-row tiles. Needs Pillow and numpy only (Debian's
/usr/bin/python3 with python3-pil). Each line: name height width channels values... (HWC uint8)."""
import os

import numpy as np
from PIL import Image

H, W = 30, 27


def pixel(i):  # tests/data/test_transforms.cpp has the same formula
    return (((i * 2654435761) % 2**32) >> 7) % 161 + 40


def base(channels):
    values = np.array([pixel(i) for i in range(H * W * channels)], dtype=np.uint8)
    if channels == 1:
        return Image.fromarray(values.reshape(H, W), "L")
    return Image.fromarray(values.reshape(H, W, channels), "RGB")


# name: (channels, (top, left, height, width) of the window, (height, width) out, filter)
CASES = {
    "CropDownBicubic": (3, (2, 3, 27, 22), (19, 14), Image.BICUBIC),
    "CropUpBicubic": (3, (5, 7, 13, 9), (35, 29), Image.BICUBIC),
    "CropMixedBilinear": (3, (0, 0, 30, 27), (17, 41), Image.BILINEAR),
    "CropKeepWidth": (3, (1, 4, 29, 20), (18, 20), Image.BICUBIC),
    "CropKeepHeight": (3, (3, 2, 25, 21), (25, 11), Image.BICUBIC),
    "CropGreyDownBicubic": (1, (1, 1, 28, 25), (20, 17), Image.BICUBIC),
    "CropGreyUpBilinear": (1, (5, 10, 20, 10), (41, 33), Image.BILINEAR),
}


def main():
    out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "augment",
                       "resize.txt")
    with open(out, "w") as f:
        for name, (channels, (top, left, h, w), (oh, ow), flt) in CASES.items():
            img = base(channels).crop((left, top, left + w, top + h)).resize((ow, oh), flt)
            a = np.asarray(img).reshape(oh, ow, channels)
            f.write("%s %d %d %d %s\n" % (name, oh, ow, channels, " ".join(map(str, a.ravel()))))


if __name__ == "__main__":
    main()
