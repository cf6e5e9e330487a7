"""The conditioning frame: a camera image -> the padded canvas the VAE encodes, and the latent crop.

diffusers 0.42.1's action path, step by step: the image is snapped to a multiple of 16 (floor, PIL bilinear
when it is not one); the canvas is the resolution tier's bin nearest in H / W ratio; the image is downscaled
only if larger than the canvas (bicubic with antialias, on [-1, 1] floats), then padded right / bottom,
`replicate` when a pad is at least the content size, else `reflect`. The VAE sees the padding (its receptive
field), so it must be exact; the latent is then cropped to content // 16. The caption carries the canvas size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
import torch
import torch.nn.functional as F

from phyai_ros.models.frames import FRAME

Tensor = torch.Tensor

# Tier -> {H / W ratio (diffusers' key strings) -> (H, W)}.
RESOLUTION_BINS = {
    256: {"1.0": (256, 256), "0.8": (256, 320), "1.25": (320, 256), "0.6": (192, 320),
          "1.6666666666666667": (320, 192)},
    480: {"1.0": (640, 640), "0.7391304347826086": (544, 736), "1.3529411764705883": (736, 544),
          "0.5769230769230769": (480, 832), "1.7333333333333334": (832, 480)},
    704: {"1.0": (960, 960), "0.7647058823529411": (832, 1088), "1.3076923076923077": (1088, 832),
          "0.55": (704, 1280), "1.8181818181818181": (1280, 704)},
    720: {"1.0": (960, 960), "0.7536231884057971": (832, 1104), "1.3269230769230769": (1104, 832),
          "0.5625": (720, 1280), "1.7777777777777777": (1280, 720)},
}
MAX_SIDE = 8192


@dataclass(frozen=True)
class Canvas:
    """Where the content sits: canvas (H, W), content (H, W) at its top-left, the latent crop (h, w)."""

    height: int
    width: int
    content_h: int
    content_w: int
    latent_h: int
    latent_w: int


def check_image(image) -> np.ndarray:
    """uint8 [H, W, 3] RGB, each side in [16, MAX_SIDE]; anything else is a clear error."""
    a = image.numpy() if isinstance(image, Tensor) else np.asarray(image)
    FRAME.check(a)
    if not (16 <= a.shape[0] <= MAX_SIDE and 16 <= a.shape[1] <= MAX_SIDE):
        raise ValueError(f"the camera image must be 16..{MAX_SIDE} px per side, got {a.shape[0]}x{a.shape[1]}")
    return np.ascontiguousarray(a)


def snap(image: np.ndarray, multiple: int = 16) -> np.ndarray:
    """Floor both sides to a multiple (PIL bilinear resize when needed, as diffusers' image processor)."""
    h, w = image.shape[:2]
    hs, ws = h - h % multiple, w - w % multiple
    if (hs, ws) == (h, w):
        return image
    from PIL import Image
    return np.array(Image.fromarray(image).resize((ws, hs), resample=Image.BILINEAR))


def choose_canvas(h: int, w: int, tier: int, spatial: int = 16) -> Canvas:
    """The tier's bin nearest to h / w, the content size after the (downscale-only) fit, and the latent crop."""
    if tier not in RESOLUTION_BINS:
        raise ValueError(f"resolution tier {tier!r}: one of {sorted(RESOLUTION_BINS)}")
    bins = RESOLUTION_BINS[tier]
    ratio = float(h / w)
    th, tw = bins[min(bins, key=lambda r: abs(float(r) - ratio))]
    scale = min(tw / w, th / h, 1.0)
    ch, cw = max(1, int(scale * h + 0.5)), max(1, int(scale * w + 0.5))
    return Canvas(th, tw, ch, cw, max(ch // spatial, 1), max(cw // spatial, 1))


def canvas_frame(image, tier: int, spatial: int = 16) -> Tuple[Tensor, Canvas]:
    """uint8 [H, W, 3] -> ([1, 3, Hc, Wc] float32 in [-1, 1], its Canvas): what every frame of the
    conditioning clip is."""
    img = snap(check_image(image), spatial)
    h, w = img.shape[:2]
    c = choose_canvas(h, w, tier, spatial)
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255.0
    x = 2.0 * x - 1.0
    if (c.content_h, c.content_w) != (h, w):
        x = F.interpolate(x, size=(c.content_h, c.content_w), mode="bicubic", align_corners=False, antialias=True)
    pad_r, pad_b = c.width - c.content_w, c.height - c.content_h
    if pad_r or pad_b:
        mode = "replicate" if pad_r >= c.content_w or pad_b >= c.content_h else "reflect"
        x = F.pad(x, (0, pad_r, 0, pad_b), mode=mode)
    return x, c


def canvas_uint8(frame: Tensor) -> Tensor:
    """[1, 3, H, W] in [-1, 1] -> uint8 [H, W, 3] (exact for frames that were uint8 and only padded)."""
    return ((frame[0].permute(1, 2, 0) + 1.0) / 2.0 * 255.0).round().clamp(0, 255).to(torch.uint8)


__all__ = ["Canvas", "RESOLUTION_BINS", "check_image", "snap", "choose_canvas", "canvas_frame", "canvas_uint8"]
