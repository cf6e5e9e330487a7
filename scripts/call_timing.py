"""What the benchmark scripts here share: per-call latency, a fresh process's start-up, a runner's inputs.

Why one module: the runtime benchmark and the LeRobot reference must time their calls the same way for
their ratio to mean anything: warm-up calls first, then CUDA events around each call on the GPU (the
device time of the call, launch included), the host clock on the CPU. The start-up figure and the synthetic
runner inputs are measured and built the same way by every script that reports them.
"""
from __future__ import annotations

import json
import subprocess
import sys
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


def startup_in_child(argv: list) -> dict:
    """Start-up of a fresh process: runs ``python *argv`` (a script's own --first-chunk mode, which prints its
    figures as the last line of its output, one JSON object) and returns them with the process's wall time;
    where it printed none, its stderr's tail as "error"."""
    t = time.perf_counter()
    child = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
    out = {"process_wall_s": time.perf_counter() - t}
    try:
        out.update(json.loads(child.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        out["error"] = child.stderr[-2000:]
    return out


def flow_runner_inputs(cfg, batch: int, cameras: int) -> tuple:
    """Random inputs of a pi0 / pi0.5 FlowRunner call on CUDA: (images in [-1, 1], image masks (every camera
    present), tokens, token mask (the first 40 of the budget valid), state, noise)."""
    images = torch.rand(batch, cameras, 3, 224, 224, device="cuda") * 2 - 1
    masks = torch.ones(batch, cameras, dtype=torch.bool, device="cuda")
    tokens = torch.randint(0, 1000, (batch, cfg.token_budget), device="cuda")
    tmask = torch.arange(cfg.token_budget, device="cuda")[None].expand(batch, -1) < min(40, cfg.token_budget)
    state = torch.randn(batch, cfg.max_state_dim, device="cuda")
    noise = torch.randn(batch, cfg.chunk_size, cfg.max_action_dim, device="cuda")
    return images, masks, tokens, tmask, state, noise
