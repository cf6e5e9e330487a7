#!/usr/bin/env python3
"""Train the tiny pi0.5 (fixture dimensions) on the demo's pick-and-place task, on the CPU in minutes.

Why: a random-weight model emits noise, so the demo and the RTC benchmark could only show mechanics. This
makes two small policies that behave like trained ones (smooth joint trajectories that follow the arm), in
the real LeRobot checkpoint layout, loadable by the node and ``phyai_ros.predict`` through the real loaders:

* ``tiny_pi05_demo``: plain flow matching;
* ``tiny_pi05_demo_prefix``: the same with training-time RTC (prefix-action conditioning): with probability
  ``--prefix-prob`` a random-length prefix (1 .. ``--max-prefix`` actions) of the target is given clean at
  flow time 0 per token and left out of the loss, which is what ``rtc.mode: trained`` feeds at inference.

Data (phyai_ros/replay/demo_bag.py): at a session time t, the observation is the three camera views the
demo bag records (rendered at the bag's sizes, the left wrist through a JPEG round trip, then the adapter's
own preprocessing to 224x224), the 8 joint positions ``arm_joints`` (joint_0..joint_6 + gripper) and the
instruction; the target chunk is the next H positions of joint_0..joint_5 + gripper at t + (i+1) dt, the
node's action space (config/pi05_cpu_test.yaml). Normalization stats (q01/q99) are fitted to the demo's
state and action ranges. Training times are drawn in [0, 4 episodes); held-out times from another seed.

Cost: vision and the VLM stay at their random initialization (frozen), so each cached observation's prefix
K/V is computed once and training runs the action expert only (flow matching through
``Pi05Model.denoise_velocity``, phyai_ros/models/pi/pi05/training.py). The defaults take about 2.5 minutes of
training per model on a quiet 2-core machine (4-6 minutes with other work running; 11 minutes for both,
start to end, when the committed checkpoints were made). Seeded: two runs with the same arguments gave
bit-identical weights here (torch CPU kernels; another CPU or thread count may differ in the last bits).

    .venv/bin/python scripts/train_tiny_policy.py [--out checkpoints] [--steps 1500] [--only plain|prefix]

Prints the flow loss (train / held-out, fixed draws) and the action RMS error vs the true next-H trajectory
of the random-weight start and the trained model, plus "hold the current state" for scale.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from phyai_ros.models.pi.pi05 import Pi05Adapter, make_random_checkpoint  # noqa: E402
from phyai_ros.models.pi.pi05.training import (flow_matching_loss, lerobot_state_dict, sample_flow_time,  # noqa: E402
                                            train_parameters)
from phyai_ros.replay.demo_bag import (DEFAULT_CAMERAS, DEFAULT_INSTRUCTION, Renderer, arm_joints,  # noqa: E402
                                       scene_state)
from phyai_ros.testing import tokenizer_path  # noqa: E402

SLOTS = {"base": "base_0_rgb", "left_wrist": "left_wrist_0_rgb", "right_wrist": "right_wrist_0_rgb"}
ACTION_JOINTS = [0, 1, 2, 3, 4, 5, 7]      # joint_0..joint_5 + gripper of the 8 state joints
EPISODE_PERIOD = 12.0                      # DemoBagConfig.episode_period
NAMES = {"plain": "tiny_pi05_demo", "prefix": "tiny_pi05_demo_prefix"}


@dataclass
class Samples:
    """Observations at session times: raw images per slot [N, h, w, 3], state [N, 8], target [N, H, 7]."""
    times: np.ndarray
    images: Dict[str, np.ndarray]
    state: np.ndarray
    actions: np.ndarray


def trajectory(t: np.ndarray) -> np.ndarray:
    """Joint positions [len(t), 8] of the demo arm at session times t."""
    return np.stack([arm_joints(float(x), scene_state(float(x), EPISODE_PERIOD)) for x in t]).astype(np.float32)


def targets(t: np.ndarray, horizon: int, dt: float) -> np.ndarray:
    """[len(t), H, 7]: the next H positions of the action joints, action i at t + (i + 1) dt."""
    ahead = t[:, None] + dt * np.arange(1, horizon + 1)[None, :]
    return trajectory(ahead.reshape(-1)).reshape(len(t), horizon, 8)[..., ACTION_JOINTS]


def render_samples(times: np.ndarray, horizon: int, dt: float, seed: int) -> Samples:
    """The demo's camera views at the bag's sizes (left wrist JPEG-compressed as recorded) plus state/targets."""
    import cv2
    renderer = Renderer(seed)
    images: Dict[str, List[np.ndarray]] = {SLOTS[c.view]: [] for c in DEFAULT_CAMERAS}
    for t in times:
        s = scene_state(float(t), EPISODE_PERIOD)
        for cam in DEFAULT_CAMERAS:
            rgb = renderer.render(cam.view, cam.height, cam.width, float(t), s)
            if cam.compressed:
                ok, buf = cv2.imencode(".jpg", rgb[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 85])
                rgb = cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1]
            images[SLOTS[cam.view]].append(np.ascontiguousarray(rgb))
    return Samples(times, {k: np.stack(v) for k, v in images.items()}, trajectory(times), targets(times, horizon, dt))


def fit_norm_stats(horizon: int, dt: float, span: float) -> dict:
    """q01/q99 of the state and the action joints over the session (fixture norm_stats.json schema)."""
    q = trajectory(np.arange(0.0, span + horizon * dt, dt))

    def quant(x):
        return {"q01": np.quantile(x, 0.01, axis=0).astype(np.float32).tolist(),
                "q99": np.quantile(x, 0.99, axis=0).astype(np.float32).tolist()}
    return {"observation.state": quant(q), "action": quant(q[:, ACTION_JOINTS])}


# ----------------------------------------------------------------------------- model side
@dataclass
class Cache:
    """Frozen-prefix K/V of each observation (computed once) and its normalized, padded target."""
    kv: List[tuple]          # per VLM layer (k [N, 1, P, hd], v [N, 1, P, hd])
    pad: torch.Tensor        # [N, P]
    actions: torch.Tensor    # [N, H, max_action_dim] normalized, zero-padded


def prepare(policy: Pi05Adapter, s: Samples, idx) -> "object":
    return policy.prepare({k: v[idx] for k, v in s.images.items()}, s.state[idx], [DEFAULT_INSTRUCTION] * len(idx))


@torch.no_grad()
def build_cache(policy: Pi05Adapter, s: Samples, batch: int = 16) -> Cache:
    m = policy.model
    ks, vs, pads = [], [], []
    for i in range(0, len(s.times), batch):
        inp = prepare(policy, s, np.arange(i, min(i + batch, len(s.times))))
        embs, pad = m.embed_prefix(inp.images, inp.image_masks, inp.tokens, inp.token_masks)
        kv = m.prefix_kv(embs, pad)
        ks.append(torch.stack([k for k, _ in kv]))
        vs.append(torch.stack([v for _, v in kv]))
        pads.append(pad)
    k, v = torch.cat(ks, 1), torch.cat(vs, 1)
    a = policy.normalize_actions(torch.from_numpy(s.actions))
    a = torch.nn.functional.pad(a, (0, policy.config.max_action_dim - a.shape[-1]))
    return Cache([(k[i], v[i]) for i in range(k.shape[0])], torch.cat(pads), a)


def batch_loss(policy: Pi05Adapter, cache: Cache, idx: torch.Tensor, gen: torch.Generator,
               prefix_prob: float = 0.0, max_prefix: int = 0) -> torch.Tensor:
    a = cache.actions[idx]
    noise = torch.randn(a.shape, generator=gen)
    t = sample_flow_time(len(idx), gen)
    prefix = None
    if prefix_prob > 0:
        lens = torch.randint(1, max_prefix + 1, (len(idx),), generator=gen)
        prefix = torch.where(torch.rand(len(idx), generator=gen) < prefix_prob, lens, torch.zeros_like(lens))
    kv = [(k[idx], v[idx]) for k, v in cache.kv]
    return flow_matching_loss(policy.model, kv, cache.pad[idx], a, noise, t, policy.action_dim, prefix)


@torch.no_grad()
def fixed_loss(policy: Pi05Adapter, cache: Cache, seed: int, prefix_prob: float = 0.0, max_prefix: int = 0) -> float:
    """Flow loss over every cached observation with one fixed draw of noise / t (comparable across steps)."""
    gen = torch.Generator().manual_seed(seed)
    n = cache.actions.shape[0]
    total = 0.0
    for i in range(0, n, 32):
        idx = torch.arange(i, min(i + 32, n))
        total += float(batch_loss(policy, cache, idx, gen, prefix_prob, max_prefix)) * len(idx)
    return total / n


@torch.no_grad()
def action_rms(policy: Pi05Adapter, s: Samples, seed: int, prefix: int = 0, start: int = 0) -> float:
    """RMS error (robot units) of sampled chunks vs the true next-H trajectory from action ``start`` on, fixed
    noise per observation. ``prefix`` > 0: the true first ``prefix`` actions are given as the frozen prefix of
    ``rtc.mode: trained`` (how well the model continues a plan it is handed)."""
    gen = torch.Generator().manual_seed(seed)
    err = []
    for i in range(0, len(s.times), 16):
        idx = np.arange(i, min(i + 16, len(s.times)))
        inp = prepare(policy, s, idx)
        rtc = policy.rtc_tensors(policy.normalize_actions(torch.from_numpy(s.actions[idx])), prefix,
                                 policy.chunk_size, mode="trained") if prefix else None
        x = policy.sample_actions(inp, policy.make_noise(len(idx), gen), rtc)
        err.append((policy.unnormalize_actions(x).numpy()[:, start:] - s.actions[idx, start:]) ** 2)
    return float(np.sqrt(np.concatenate(err).mean()))


def hold_rms(s: Samples) -> float:
    """RMS error of 'hold the current position' (no model): the scale of the motion over one chunk."""
    return float(np.sqrt(((s.state[:, None, ACTION_JOINTS] - s.actions) ** 2).mean()))


def train(policy: Pi05Adapter, cache: Cache, args, prefix_prob: float, log) -> None:
    params = train_parameters(policy.model, ("expert",))
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(args.seed + 1)
    n = cache.actions.shape[0]
    t0, running = time.monotonic(), []
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, n, (args.batch,), generator=gen)
        loss = batch_loss(policy, cache, idx, gen, prefix_prob, args.max_prefix)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        running.append(float(loss.detach()))
        if step % args.log_every == 0 or step == args.steps:
            log(f"  step {step:5d}/{args.steps}  flow loss {np.mean(running):.4f}  ({time.monotonic() - t0:.0f} s)")
            running = []
    train_parameters(policy.model, ())
    policy.model.eval()


def save(policy: Pi05Adapter, out: Path) -> None:
    from safetensors.torch import load_file, save_file
    path = out / "model.safetensors"
    unused = {k: v for k, v in load_file(str(path)).items() if k not in (sd := lerobot_state_dict(policy.model))}
    save_file({**sd, **unused}, str(path))


def write_start(kind: str, args, stats: dict) -> Path:
    """The seeded random-weight start (the fixture init, std 0.1) with the fitted statistics, in place."""
    out = args.out / NAMES[kind]
    make_random_checkpoint(out, Pi05Adapter.small_config(args.horizon), seed=args.seed, dtype=torch.float32, std=0.1,
                           camera_names=tuple(SLOTS.values()), state_dim=8, action_dim=len(ACTION_JOINTS))
    (out / "norm_stats.json").write_text(json.dumps(stats, indent=2))
    return out


def make_one(kind: str, out: Path, args, tok: Path, data: Dict[str, Samples], caches: Dict[str, Cache],
             random_rms: float, log) -> dict:
    """Measure the random start, train, save, reload through the real loader, measure again."""
    policy = Pi05Adapter.from_files(out, tok, out / "norm_stats.json")
    prefix_prob = args.prefix_prob if kind == "prefix" else 0.0

    def losses():
        return [fixed_loss(policy, caches[k], args.seed, prefix_prob, args.max_prefix) for k in ("train", "held")]
    r = {"random_action_rms": random_rms}
    r["random_train_loss"], r["random_heldout_loss"] = losses()
    log(f"[{NAMES[kind]}] random weights: flow loss train {r['random_train_loss']:.4f} held-out "
        f"{r['random_heldout_loss']:.4f}, action RMS held-out {random_rms:.4f}")
    t0 = time.monotonic()
    train(policy, caches["train"], args, prefix_prob, log)
    r["train_seconds"] = round(time.monotonic() - t0, 1)
    save(policy, out)
    policy = Pi05Adapter.from_files(out, tok, out / "norm_stats.json")   # what the node will load
    r["train_loss"], r["heldout_loss"] = losses()
    r.update(train_action_rms=action_rms(policy, data["train_eval"], args.seed),
             action_rms=action_rms(policy, data["held"], args.seed), hold_rms=hold_rms(data["held"]),
             prefix_prob=prefix_prob)
    log(f"[{NAMES[kind]}] trained ({r['train_seconds']:.0f} s): flow loss train {r['train_loss']:.4f} held-out "
        f"{r['heldout_loss']:.4f}; action RMS train {r['train_action_rms']:.4f} held-out {r['action_rms']:.4f} "
        f"(random {random_rms:.4f}, hold-current-state {r['hold_rms']:.4f}) -> {out}")
    return r


def relative(path: Path) -> str:
    """A path as recorded in training.json: relative to the repository when inside it (no machine's paths)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "checkpoints", help="folder for the checkpoint folders")
    ap.add_argument("--only", choices=("plain", "prefix"), help="train one of the two (default both)")
    ap.add_argument("--horizon", type=int, default=50, help="chunk size H (the node's control.horizon)")
    ap.add_argument("--dt", type=float, default=0.02, help="action period (s) (the node's control.dt)")
    ap.add_argument("--frames", type=int, default=384, help="training observations")
    ap.add_argument("--held-out", type=int, default=48, help="held-out observations")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--prefix-prob", type=float, default=0.5, help="prefix model: share of samples with a prefix")
    ap.add_argument("--max-prefix", type=int, default=20, help="prefix model: longest clean prefix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args(argv)
    tok = tokenizer_path()
    if tok is None:
        print("train_tiny_policy: the fixture tokenizer is missing (set PHYAI_PARITY_FIXTURES)", file=sys.stderr)
        return 1
    torch.manual_seed(args.seed)
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", flush=True)

    span = 4 * EPISODE_PERIOD
    rng, held_rng = np.random.default_rng(args.seed), np.random.default_rng(args.seed + 1000)
    train_t = np.sort(rng.uniform(0.0, span, args.frames))
    held_t = np.sort(held_rng.uniform(0.0, span, args.held_out))
    data = {"train": render_samples(train_t, args.horizon, args.dt, args.seed),
            "held": render_samples(held_t, args.horizon, args.dt, args.seed + 1)}
    data["train_eval"] = Samples(train_t[:args.held_out], {k: v[:args.held_out] for k, v in data["train"].images.items()},
                                 data["train"].state[:args.held_out], data["train"].actions[:args.held_out])
    stats = fit_norm_stats(args.horizon, args.dt, span)
    log(f"rendered {args.frames} training and {args.held_out} held-out observations (H {args.horizon}, "
        f"dt {args.dt})")
    kinds = [args.only] if args.only else ["plain", "prefix"]
    outs = {k: write_start(k, args, stats) for k in kinds}
    # Same seed, same init: both starts share the frozen prefix side, so one K/V cache and one random baseline.
    start = Pi05Adapter.from_files(outs[kinds[0]], tok, outs[kinds[0]] / "norm_stats.json")
    caches = {k: build_cache(start, data[k]) for k in ("train", "held")}
    log(f"cached the prefix K/V of {args.frames} + {args.held_out} observations")
    random_rms = action_rms(start, data["held"], args.seed)
    results = {NAMES[k]: make_one(k, outs[k], args, tok, data, caches, random_rms, log) for k in kinds}
    summary = {"command": " ".join(["scripts/train_tiny_policy.py", *(argv if argv is not None else sys.argv[1:])]),
               "args": {k: (relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "torch": torch.__version__, "threads": torch.get_num_threads(), "results": results,
               "total_seconds": round(time.monotonic() - t_start, 1)}
    for kind in results:
        (args.out / kind / "training.json").write_text(json.dumps(summary, indent=2))
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
