"""State / action normalization and the loaders for its statistics.

Why here: the policy sees normalized state and emits normalized actions; the robot speaks raw units. pi0.5
uses quantile normalization (q01/q99 -> [-1, 1]), pi0 mean/std. Formulas and op order follow LeRobot's
normalizer processor (float32 torch), including its eps: a zero q99-q01 (or std) range is replaced by eps
for quantiles and eps is added to std for mean/std.

Accepted statistics sources (all give {feature: {stat: float32 array}}):
- a JSON file {"observation.state": {"q01": [...], "q99": [...], ...}, "action": {...}} (LeRobot/fixture),
- an openpi norm_stats.json {"norm_stats": {"state": {...}, "actions": {...}}} (keys mapped to the above),
- a LeRobot normalizer state .safetensors (keys "observation.state.q01", ...),
- a checkpoint directory holding such a file (policy_preprocessor_step_*_normalizer_processor.safetensors).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict

import numpy as np
import torch

from phyai_ros.models.files import read_json, read_safetensors_file

Stats = Dict[str, Dict[str, np.ndarray]]

STATE = "observation.state"
ACTION = "action"
_OPENPI_KEYS = {"state": STATE, "actions": ACTION}


def load_norm_stats(path) -> Stats:
    """Load statistics from a JSON / safetensors file or a checkpoint directory (see module docstring)."""
    p = Path(path)
    if p.is_dir():
        found = sorted(p.glob("policy_preprocessor_step_*_normalizer_processor.safetensors"))
        if not found:
            raise FileNotFoundError(f"no normalizer stats (policy_preprocessor_step_*_normalizer_processor"
                                    f".safetensors) in {p}")
        p = found[0]
    if not p.is_file():
        raise FileNotFoundError(f"normalization stats file not found: {p}")
    stats: Stats = {}
    if p.suffix == ".safetensors":
        for key, arr in read_safetensors_file(p).items():
            feat, _, stat = key.rpartition(".")
            stats.setdefault(feat, {})[stat] = arr.to(torch.float32).numpy()
        return stats
    raw = read_json(p)
    if "norm_stats" in raw:  # openpi layout
        raw = {_OPENPI_KEYS.get(k, k): v for k, v in raw["norm_stats"].items()}
    for feat, d in raw.items():
        if isinstance(d, dict):
            stats[feat] = {k: np.asarray(v, dtype=np.float32) for k, v in d.items() if isinstance(v, list)}
    return stats


def _vec(x, device) -> torch.Tensor:
    """list / numpy / tensor (any device) -> float32 tensor on `device`."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(device=device, dtype=torch.float32)
    return torch.as_tensor(np.asarray(x, dtype=np.float32), device=device)


class QuantileNormalizer:
    """x -> 2 (x - q01) / (q99 - q01) - 1 and its inverse, float32 on a given device."""

    def __init__(self, q01, q99, eps: float = 1e-8, device=None):
        self.q01 = _vec(q01, device)
        self.q99 = _vec(q99, device)
        if self.q01.shape != self.q99.shape or self.q01.dim() != 1:
            raise ValueError(f"q01/q99 must be equal-length vectors, got {tuple(self.q01.shape)} / "
                             f"{tuple(self.q99.shape)}")
        denom = self.q99 - self.q01
        self.denom = torch.where(denom == 0, torch.full_like(denom, eps), denom)

    @classmethod
    def from_stats(cls, stats: Stats, feature: str, device=None) -> "QuantileNormalizer":
        d = stats.get(feature)
        if d is None or "q01" not in d or "q99" not in d:
            raise ValueError(f"normalization stats lack {feature}.q01 / {feature}.q99 "
                             f"(features present: {sorted(stats)})")
        return cls(d["q01"], d["q99"], device=device)

    @property
    def dim(self) -> int:
        return self.q01.shape[0]

    def to(self, device) -> "QuantileNormalizer":
        out = object.__new__(QuantileNormalizer)
        out.q01, out.q99, out.denom = (t.to(device) for t in (self.q01, self.q99, self.denom))
        return out

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return 2.0 * (x - self.q01) / self.denom - 1.0

    def unnormalize(self, y: torch.Tensor) -> torch.Tensor:
        return (y + 1.0) * self.denom / 2.0 + self.q01


class MeanStdNormalizer:
    """x -> (x - mean) / (std + eps); inverse y * std + mean (no eps, as the reference)."""

    def __init__(self, mean, std, eps: float = 1e-8, device=None):
        self.mean = _vec(mean, device)
        self.std = _vec(std, device)
        self.eps = eps

    @classmethod
    def from_stats(cls, stats: Stats, feature: str, device=None) -> "MeanStdNormalizer":
        d = stats.get(feature)
        if d is None or "mean" not in d or "std" not in d:
            raise ValueError(f"normalization stats lack {feature}.mean / {feature}.std "
                             f"(features present: {sorted(stats)})")
        return cls(d["mean"], d["std"], device=device)

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    def to(self, device) -> "MeanStdNormalizer":
        return MeanStdNormalizer(self.mean.to(device), self.std.to(device), self.eps)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / (self.std + self.eps)

    def unnormalize(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.std + self.mean
