#!/usr/bin/python3
"""Writes tests/fixtures/augment/ops.txt: torchvision 0.14's RandAugment ops (the private
_apply_op, nearest, fill 0), PIL's bicubic rotate/translate (timm's ops) and PIL's resize
(RandomResizedCrop) applied to a fixed
12x10 RGB image. Run with Debian's /usr/bin/python3 (python3-torchvision, python3-pil).
Each line: name height width channels values... (HWC uint8)."""
import math
import os

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms.autoaugment import _apply_op

H, W, C = 12, 10, 3


def pixel(i):  # tests/data/test_transforms.cpp has the same formula
    return (((i * 2654435761) % 2**32) >> 7) % 161 + 40


def base_image():
    values = np.array([pixel(i) for i in range(H * W * C)], dtype=np.uint8)
    return Image.fromarray(values.reshape(H, W, C), "RGB")


def tv(op, magnitude):
    return _apply_op(base_image(), op, magnitude, InterpolationMode.NEAREST, [0.0, 0.0, 0.0])


def main():
    t = 150.0 / 331.0 * 9 / 30
    cases = {
        "ShearX+": tv("ShearX", 0.09), "ShearX-": tv("ShearX", -0.09),
        "ShearY+": tv("ShearY", 0.09), "ShearY-": tv("ShearY", -0.09),
        "TranslateX+": tv("TranslateX", t * W), "TranslateX-": tv("TranslateX", -t * W),
        "TranslateY+": tv("TranslateY", t * H), "TranslateY-": tv("TranslateY", -t * H),
        "Rotate+": tv("Rotate", 9.0), "Rotate-": tv("Rotate", -9.0),
        "Brightness+": tv("Brightness", 0.27), "Brightness-": tv("Brightness", -0.27),
        "Color+": tv("Color", 0.27), "Color-": tv("Color", -0.27),
        "Contrast+": tv("Contrast", 0.27), "Contrast-": tv("Contrast", -0.27),
        "Sharpness+": tv("Sharpness", 0.27), "Sharpness-": tv("Sharpness", -0.27),
        "Posterize7": tv("Posterize", 7.0), "Posterize4": tv("Posterize", 4.0),
        "Solarize": tv("Solarize", 178.5),
        "AutoContrast": tv("AutoContrast", 0.0), "Equalize": tv("Equalize", 0.0),
        # timm's geometry: PIL bicubic with the mean-pixel fill.
        "BicubicRotate": base_image().rotate(13.0, resample=Image.BICUBIC,
                                             fillcolor=(124, 116, 104)),
        "BicubicTranslate": base_image().transform((W, H), Image.AFFINE, (1, 0, 2.7, 0, 1, 0),
                                                   resample=Image.BICUBIC,
                                                   fillcolor=(124, 116, 104)),
        # RandomResizedCrop's resize (PIL Image.resize, size is (width, height)).
        "ResizeBicubicDown": base_image().resize((7, 5), Image.BICUBIC),
        "ResizeBicubicUp": base_image().resize((23, 17), Image.BICUBIC),
        "ResizeBilinearDown": base_image().resize((4, 9), Image.BILINEAR),
    }
    out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "augment", "ops.txt")
    with open(out, "w") as f:
        f.write("base %d %d %d %s\n" % (H, W, C, " ".join(map(str, np.asarray(base_image()).ravel()))))
        for name, img in cases.items():
            a = np.asarray(img)
            f.write("%s %d %d %d %s\n" % (name, a.shape[0], a.shape[1], a.shape[2],
                                          " ".join(map(str, a.ravel()))))


if __name__ == "__main__":
    main()
