"""Camera image preprocessing shared by pi0 / pi0.5: uint8 HxWx3 -> float [-1, 1] 3x224x224.

Why this exact recipe: the checkpoints were trained with it and small deviations (antialiasing, a different
rounding of the resized size, padding with 0 vs -1) shift the image tokens. Recipe (LeRobot): /255 ->
resize keeping aspect ratio with ratio = max(W/224, H/224), size (int(H/ratio), int(W/ratio)), bilinear,
align_corners=False, no antialias -> clamp [0, 1] -> zero pad centred (the odd pixel goes bottom/right)
-> x*2-1 (the pad becomes -1). Runs on whatever device the tensor is on.
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F


def resized_hw(h: int, w: int, out_h: int, out_w: int) -> Tuple[int, int]:
    """Aspect-preserving size that fits (out_h, out_w) (python float math, as the reference)."""
    ratio = max(w / out_w, h / out_h)
    return int(h / ratio), int(w / ratio)


def resize_with_pad(images: torch.Tensor, out_h: int, out_w: int) -> torch.Tensor:
    """[N, C, H, W] float in [0, 1] -> [N, C, out_h, out_w]: resize (bilinear) keeping aspect, zero pad centred."""
    h, w = images.shape[-2:]
    if (h, w) == (out_h, out_w):
        return images
    rh, rw = resized_hw(h, w, out_h, out_w)
    x = F.interpolate(images, size=(rh, rw), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    top, left = (out_h - rh) // 2, (out_w - rw) // 2
    return F.pad(x, (left, out_w - rw - left, top, out_h - rh - top), mode="constant", value=0.0)


def preprocess_uint8_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [N, H, W, 3] -> float32 [N, 3, size, size] in [-1, 1] (see module docstring)."""
    x = images.to(torch.float32) / 255
    x = x.permute(0, 3, 1, 2)
    return resize_with_pad(x, size, size) * 2.0 - 1.0
