"""Per-call latency of a function, as every benchmark script here measures it.

Why one module: the runtime benchmark and the LeRobot reference must time their calls the same way for
their ratio to mean anything: warm-up calls first, then CUDA events around each call on the GPU (the
device time of the call, launch included), the host clock on the CPU.
"""
from __future__ import annotations

import time

import torch


def call_ms(fn, iters: int, warmup: int = 3, device: str = "cuda") -> list[float]:
    """Milliseconds of each of `iters` calls of fn(), after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        if device != "cuda":
            t = time.perf_counter()
            fn()
            out.append(1e3 * (time.perf_counter() - t))
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out
