#!/usr/bin/env python3
"""CPU latency of the pi0.5 reference path, batch 1, 3 cameras (480x640 RGB), for the parity-fixture model
and a mid-size random model. Prints the median over --runs timed calls (after one warm-up) of the whole
`Pi05Adapter.predict` and of its stages (preprocess, embed_prefix, prefix_kv, time tables, 10-step loop).

    .venv/bin/python scripts/bench_cpu_latency.py [--runs 5] [--threads N] [--only fixture|mid]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phyai_ros.models.pi.modeling import solver  # noqa: E402
from phyai_ros.models.pi.modeling.config import GemmaConfig, SiglipConfig  # noqa: E402
from phyai_ros.models.pi.pi05 import Pi05Config, Pi05Adapter, make_random_checkpoint  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "lerobot_parity"
TOKENIZER = FIXTURES / "tokenizer" / "tokenizer.model"

MID = Pi05Config(vlm=GemmaConfig(width=512, depth=4, mlp_dim=2048, num_heads=8, num_kv_heads=1, head_dim=64),
                 expert=GemmaConfig(width=256, depth=4, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=64),
                 siglip=SiglipConfig(width=384, depth=6, num_heads=6, mlp_dim=1536), vocab_size=1024)


def timed(fn, runs):
    fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


@torch.no_grad()
def bench(name: str, policy: Pi05Adapter, runs: int):
    rng = np.random.default_rng(0)
    images = {c: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for c in policy.camera_names}
    state = np.zeros(policy.state_dim, np.float32)
    task = "pick up the red block and place it in the bowl"
    noise = torch.randn(1, policy.chunk_size, policy.config.max_action_dim)
    m = policy.model
    x = policy.prepare(images, state, task)
    embs, pad = m.embed_prefix(x.images, x.image_masks, x.tokens, x.token_masks)
    kv = m.prefix_kv(embs, pad)
    t_table, _ = solver.euler_schedule(policy.config.num_steps)
    mods = m.time_modulation(t_table)
    ctx = m.suffix_context(pad)
    res = {
        "predict (end to end)": timed(lambda: policy.predict(images, state, task, noise=noise[0]), runs),
        "  preprocess (images, prompt)": timed(lambda: policy.prepare(images, state, task), runs),
        "  embed_prefix (SigLIP x3 + embed)": timed(lambda: m.embed_prefix(x.images, x.image_masks, x.tokens,
                                                                           x.token_masks), runs),
        "  prefix_kv (VLM)": timed(lambda: m.prefix_kv(embs, pad), runs),
        "  time tables": timed(lambda: m.time_modulation(t_table), runs),
        "  denoise loop (10 steps)": timed(lambda: solver.sample(
            lambda xx, k: m.denoise_velocity(xx, kv, ctx=ctx, modulation=mods[k]), noise, policy.config.num_steps),
            runs),
    }
    cfg = policy.config
    print(f"\n{name}: vlm {cfg.vlm.width}x{cfg.vlm.depth}, expert {cfg.expert.width}x{cfg.expert.depth}, "
          f"siglip {cfg.siglip.width}x{cfg.siglip.depth}, prefix {embs.shape[1]} tokens, "
          f"{sum(b.numel() for b in m.buffers()) / 1e6:.1f} M params")
    for k, v in res.items():
        print(f"  {k:<38s} {v:8.1f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", choices=["fixture", "mid"], default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not TOKENIZER.is_file():
        sys.exit(f"needs the fixture tokenizer at {TOKENIZER}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, batch 1, 3 cameras 480x640")
    if args.only in (None, "fixture"):
        ck = FIXTURES / "pi05" / "checkpoint"
        bench("fixture-size pi0.5", Pi05Adapter.from_files(ck, TOKENIZER, FIXTURES / "pi05" / "norm_stats.json"),
              args.runs)
    if args.only in (None, "mid"):
        with tempfile.TemporaryDirectory() as d:
            make_random_checkpoint(d, MID, seed=0)
            bench("mid-size pi0.5 (random)", Pi05Adapter.from_files(d, TOKENIZER, Path(d) / "norm_stats.json"),
                  args.runs)


if __name__ == "__main__":
    main()
