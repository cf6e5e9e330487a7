"""Sinusoidal flow-matching time embedding (pi0 / pi0.5).

Why float64: the reference computes the periods and the sin/cos arguments in float64 and only then casts to
float32; doing it in float32 moves the embedding by ~1e-6. The embedding depends on t alone, so the runtime
precomputes it (and everything derived from it) for all solver steps before the loop.
"""
from __future__ import annotations

import math

import torch


def sinusoidal_time_embedding(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """t [N] -> [N, dim] float32 = [sin(t * 2pi / period), cos(...)], periods geometric in [min, max]."""
    if dim % 2:
        raise ValueError(f"time embedding dim must be even, got {dim}")
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    scaling = 1.0 / period * 2 * math.pi
    arg = scaling[None, :] * t.to(torch.float64)[:, None]
    return torch.cat([torch.sin(arg), torch.cos(arg)], dim=1).to(torch.float32)
