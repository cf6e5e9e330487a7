#!/usr/bin/env python3
"""How far Cosmos3's bf16 actions drift from its fp32 ones, by depth and guidance: the scale against which a bf16
difference between two implementations is judged (issue 25: at full size, H200, ours and diffusers' pipeline both
in bf16 differ by max-abs 0.53 on actions up to 6.8).

Random weights (the benchmark's N(0, 0.02)) at a reduced width, the full model's head size and MLP ratio, the full
VAE's levels and latent width at a narrow base width (it only encodes the conditioning frame; at full width it
takes minutes per call on a CPU); one set of weights run in float32 and in bfloat16 (cast at load, as the node does) from the same image, instruction
and noise, on the CPU. Prints, per depth and guidance, max |a32 - a16| / max |a32| (the figure quoted above is
0.53 / 6.8 = 7.8%) and the RMS of the difference over the RMS of the actions.

    .venv/bin/python scripts/cosmos3_precision.py                     # width 1024, 4 / 8 / 16 layers, g 1 and 3
    .venv/bin/python scripts/cosmos3_precision.py --width 512 --layers 2,4
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from phyai_ros.models.cosmos3 import Cosmos3Adapter, Cosmos3Settings  # noqa: E402
from phyai_ros.models.cosmos3.checkpoint import random_checkpoint  # noqa: E402
from phyai_ros.models.cosmos3.config import FULL_TRANSFORMER, FULL_VAE  # noqa: E402

TASK = "pick up the red block from the table and place it in the blue bowl"


def actions(ckpt, dtype, settings: Cosmos3Settings, image: np.ndarray) -> torch.Tensor:
    policy = Cosmos3Adapter(ckpt, settings, "cpu", dtype)
    x = policy.prepare({"image": image}, TASK)
    noise = policy.make_noise(x, torch.Generator().manual_seed(0))
    return policy.sample_actions(x, noise).float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", default="4,8,16")
    ap.add_argument("--guidance", default="1,3")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--image", default="96x160", help="camera image HxW (its content sets the vision tokens)")
    ap.add_argument("--vae-base", type=int, default=8, help="the VAE's base width (the full one: 160)")
    a = ap.parse_args()
    full = FULL_TRANSFORMER
    heads = a.width // full.head_dim
    h, w = (int(v) for v in a.image.split("x"))
    image = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
    print(f"width {a.width} ({heads} heads of {full.head_dim}, {max(1, heads // 4)} KV), MLP x"
          f"{full.intermediate_size / full.hidden_size:g}, VAE base {a.vae_base}, {a.steps} steps, chunk {a.chunk}, image {a.image}")
    print(f"{'layers':>6} {'guidance':>8} {'max|a|':>8} {'max-abs diff':>12} {'/ max|a|':>9} {'RMS ratio':>9} {'s':>6}")
    for layers in (int(v) for v in a.layers.split(",")):
        cfg = dataclasses.replace(full, hidden_size=a.width, num_heads=heads, num_kv_heads=max(1, heads // 4),
                                  intermediate_size=a.width * full.intermediate_size // full.hidden_size,
                                  num_layers=layers)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = random_checkpoint(tmp, cfg, dataclasses.replace(FULL_VAE, base_dim=a.vae_base), seed=0)
            for g in (float(v) for v in a.guidance.split(",")):
                t = time.perf_counter()
                s = Cosmos3Settings(num_steps=a.steps, guidance=g, chunk_size=a.chunk, view_point="ego_view",
                                    domain="droid_lerobot")
                a32, a16 = actions(ckpt, torch.float32, s, image), actions(ckpt, torch.bfloat16, s, image)
                d = (a32 - a16).abs()
                rms = float(((a32 - a16) ** 2).mean().sqrt() / (a32 ** 2).mean().sqrt())
                print(f"{layers:>6} {g:>8g} {float(a32.abs().max()):>8.3f} {float(d.max()):>12.4f} "
                      f"{float(d.max() / a32.abs().max()):>9.2%} {rms:>9.2%} {time.perf_counter() - t:>6.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
