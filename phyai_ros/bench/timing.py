"""How the bench times a call, once for every family: warm-up calls first, then each timed call alone.

Every call the contract bench times (``predict``, ``serve_sample``) ends with the chunk on the host, so the
figure is the host clock from a drained device to the chunk in host memory: the latency a robot waits, host side
included. CUDA events would leave that host side out; the family scripts time device-side stages with them.
"""
from __future__ import annotations

import math
import time
from typing import Callable, List, Optional

import numpy as np
import torch


def sync(device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def call_ms(fn: Callable[[], object], iters: int, warmup: int, device) -> List[float]:
    """Milliseconds of each of ``iters`` calls of ``fn()``, after ``warmup`` untimed ones, the device drained
    before each (queued work of an earlier call must not count against the next)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        out.append(1e3 * (time.perf_counter() - start))
    return out


def summary(ms: List[float]) -> dict:
    """median / p90 / p99 / min / max / mean of a list of milliseconds; ValueError on an empty list or a time that
    is not a positive finite number (a broken clock must not become a figure)."""
    if not ms:
        raise ValueError("no timed calls")
    bad = [t for t in ms if not (math.isfinite(t) and t > 0)]
    if bad:
        raise ValueError(f"{len(bad)} of {len(ms)} call times are not positive finite numbers (first: {bad[0]})")
    a = np.asarray(ms, dtype=np.float64)
    return {"median_ms": float(np.median(a)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "min_ms": float(a.min()), "max_ms": float(a.max()),
            "mean_ms": float(a.mean()), "runs": len(ms)}


def timed(fn: Callable[[], object], iters: int, warmup: int, device) -> dict:
    """``summary`` of ``call_ms``."""
    return summary(call_ms(fn, iters, warmup, device))


def peak_gib(device) -> Optional[float]:
    """The device's peak allocated memory since the last reset, GiB (None on the CPU)."""
    return torch.cuda.max_memory_allocated() / 2 ** 30 if torch.device(device).type == "cuda" else None


def reset_peak(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


__all__ = ["sync", "call_ms", "summary", "timed", "peak_gib", "reset_peak"]
