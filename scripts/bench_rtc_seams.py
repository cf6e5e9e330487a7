#!/usr/bin/env python3
"""RTC at chunk switches, measured on the commands the robot receives, with the trained tiny pi0.5.

Why: a random-weight policy emits noise, so its chunk switches say nothing about smoothness. With the
trained checkpoints (scripts/train_tiny_policy.py) this compares, on the same observation stream, rtc.mode
off and guided (checkpoints/tiny_pi05_demo) and off and trained (checkpoints/tiny_pi05_demo_prefix, trained
with prefix-action conditioning).

Method (deterministic, no ROS, no wall-clock timing):
* The ROS-free ``ControlLoop`` with the real policy (``phyai_ros.policies.ControlPolicy`` over
  ``Pi05Adapter.from_files``, the node's loaders), on a ``FakeClock`` driven tick by tick (``TickDriver``):
  each inference takes a fixed ``--delay-ms`` of fake time, during which the action timer keeps ticking;
  the loop's RTC scheduling (delay estimate, trigger at remaining <= d + overlap, frozen prefix) is the
  node's. Noise seed 0 per mode.
* Observations: the demo session (phyai_ros/replay/demo_bag.py): joint states every tick, the three camera
  views rendered at the bag's sizes and rates (left wrist through a JPEG round trip), the demo instruction,
  from session time ``--start`` on; identical for every mode.
* At each chunk switch, t* = the first slot that executes an action the new chunk computed itself: its first
  executed index, or its frozen prefix end d if later (frozen actions are the old chunk's own).
  - "executed seam" = |cmd(t*) - cmd(t* - dt)|_inf: the first computed command of the new chunk minus the
    command sent just before it (the old chunk's last command, or its plan's action the frozen prefix
    repeated), i.e. the jump the robot receives;
  - "departure from old plan" = |a_new(t*) - a_old(t*)|_inf: how far the new chunk leaves the plan it
    replaces at t* (what docs/benchmarks.md's earlier "chunk-boundary jump" measured; it can be small while
    the executed seam is not, and vice versa);
  - both divided by the typical executed step inside a chunk (p50 of |cmd(k) - cmd(k-1)|_inf between slots
    of one chunk, away from switches). A seam near 1 step is as smooth as the motion itself.
* Also printed: tracking RMS of the commands vs the demo arm's true positions at the command times.

    .venv/bin/python scripts/bench_rtc_seams.py [--seconds 16] [--delay-ms 100] [--json out.json]
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from train_tiny_policy import ACTION_JOINTS, EPISODE_PERIOD, NAMES, SLOTS  # noqa: E402

CHECKPOINTS = REPO / "checkpoints"
# (label, checkpoint folder name, rtc mode)
RUNS = {"off": (NAMES["plain"], "off"), "guided": (NAMES["plain"], "guided"),
        "off-prefix": (NAMES["prefix"], "off"), "trained": (NAMES["prefix"], "trained")}


def load_policy(ckpt: Path, tokenizer: Path, noise_seed: int = 0):
    """The node's policy object for a checkpoint folder (its own norm_stats.json)."""
    from phyai_ros.models.pi.pi05 import Pi05Adapter
    from phyai_ros.policies import ControlPolicy
    adapter = Pi05Adapter.from_files(ckpt, tokenizer, ckpt / "norm_stats.json", camera_names=list(SLOTS.values()))
    return ControlPolicy(adapter, noise_seed=noise_seed)   # guided RTC: the adapter's default max guidance


def demo_feeder(loop, start_ns: int, t_start: float, seed: int = 0):
    """Feed the demo session into the loop at each tick: joint state every tick, cameras at their bag rates."""
    import cv2

    from phyai_ros.replay.demo_bag import DEFAULT_CAMERAS, Renderer, arm_joints, scene_state
    renderer = Renderer(seed)
    next_frame = {cam.view: 0.0 for cam in DEFAULT_CAMERAS}

    def feed(now_ns: int) -> None:
        t = t_start + (now_ns - start_ns) / 1e9
        s = scene_state(t, EPISODE_PERIOD)
        for cam in DEFAULT_CAMERAS:
            if t >= next_frame[cam.view]:
                rgb = renderer.render(cam.view, cam.height, cam.width, t, s)
                if cam.compressed:
                    ok, buf = cv2.imencode(".jpg", rgb[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 85])
                    rgb = cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1]
                loop.on_image(SLOTS[cam.view], np.ascontiguousarray(rgb), now_ns)
                next_frame[cam.view] = t + 1.0 / cam.rate_hz
        loop.on_state(arm_joints(t, s).astype(np.float32), now_ns)
    return feed


@dataclass
class Run:
    chunks: Dict[int, object]           # seq -> ActionChunk
    emissions: List[object]             # Emission of every tick that sent a command
    start_ns: int
    t_start: float
    dt_ns: int
    counters: dict


def run_loop(policy, mode: str, *, seconds: float, delay_ms: float, t_start: float, dt: float,
             horizon: int, overlap: int = 5) -> Run:
    """Drive the ControlLoop with ``policy`` on the demo stream for ``seconds`` of fake time."""
    from phyai_ros.control import ControlConfig
    from phyai_ros.control.testing import make_sim
    from phyai_ros.replay.demo_bag import DEFAULT_INSTRUCTION
    cfg = ControlConfig(dt=dt, horizon=horizon, action_dim=len(ACTION_JOINTS),
                        cameras=(SLOTS["base"], SLOTS["left_wrist"]), optional_cameras=(SLOTS["right_wrist"],),
                        state_dim=8, max_observation_age=0.5, default_instruction=DEFAULT_INSTRUCTION,
                        rtc_mode=mode, rtc_schedule="exp", rtc_overlap=overlap, cold_start_inferences=0)
    sim = make_sim(cfg, lambda snap, rtc, _i: policy(snap, rtc), latency_ns=int(round(delay_ms * 1e6)), feed=False)
    start = sim.clock.now()
    sim.driver.feed = demo_feeder(sim.loop, start, t_start)
    sim.driver.run(int(round(seconds / dt)))
    ems = [e for _, e in sim.driver.ticks if e is not None and e.kind == "chunk"]
    return Run({c.seq: c for c in sim.chunks}, ems, start, t_start, cfg.dt_ns, sim.loop.counters())


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def seams(run: Run) -> dict:
    """Executed seam, departure from the old plan and the inside-chunk step (see module docstring)."""
    from phyai_ros.replay.demo_bag import arm_joints, scene_state
    cmd = {e.slot_ns: (e.action.astype(np.float64), e.chunk_seq) for e in run.emissions}
    executed, departure, switch_slots = [], [], set()
    for a, b in zip(run.emissions, run.emissions[1:]):
        if b.chunk_seq == a.chunk_seq:
            continue
        old, new = run.chunks[a.chunk_seq], run.chunks[b.chunk_seq]
        j = max(b.index, new.d)
        t_star = new.time_of(j)
        if j >= new.horizon or t_star not in cmd or t_star - run.dt_ns not in cmd or cmd[t_star][1] != b.chunk_seq:
            continue
        switch_slots.add(t_star)
        executed.append(float(np.max(np.abs(cmd[t_star][0] - cmd[t_star - run.dt_ns][0]))))
        planned = old.actions[min(max(old.index_at(t_star), 0), old.horizon - 1)]
        departure.append(float(np.max(np.abs(new.actions[j].astype(np.float64) - planned))))
    inside = [float(np.max(np.abs(b.action.astype(np.float64) - a.action)))
              for a, b in zip(run.emissions, run.emissions[1:])
              if b.chunk_seq == a.chunk_seq and b.slot_ns - a.slot_ns == run.dt_ns
              and b.slot_ns not in switch_slots]
    truth = np.stack([arm_joints(t, scene_state(t, EPISODE_PERIOD))[ACTION_JOINTS] for t in
                      (run.t_start + (e.slot_ns - run.start_ns) / 1e9 for e in run.emissions)])
    sent = np.stack([e.action for e in run.emissions])
    step = pct(inside, 50)
    return {"switches": len(executed), "executed_seam_p50": pct(executed, 50), "executed_seam_p95": pct(executed, 95),
            "executed_seam_mean": float(np.mean(executed)) if executed else float("nan"),
            "departure_p50": pct(departure, 50), "departure_p95": pct(departure, 95),
            "inside_step_p50": step, "inside_step_p95": pct(inside, 95),
            "executed_seam_over_step": pct(executed, 50) / step, "departure_over_step": pct(departure, 50) / step,
            "tracking_rms": float(np.sqrt(np.mean((sent - truth) ** 2))), "commands": len(run.emissions),
            "chunks": len(run.chunks), "late_chunks": run.counters.get("late_chunks", 0)}


def measure(label: str, tokenizer: Path, checkpoints: Path = CHECKPOINTS, **kw) -> dict:
    name, mode = RUNS[label]
    policy = load_policy(checkpoints / name, tokenizer)
    horizon = policy.adapter.chunk_size
    return seams(run_loop(policy, mode, horizon=horizon, **kw))


ROWS = [
    ("switches measured", lambda r: f"{r['switches']}"),
    ("executed seam |cmd(t*)-cmd(t*-dt)| p50/p95", lambda r: f"{r['executed_seam_p50']:.4f} / {r['executed_seam_p95']:.4f}"),
    ("departure from old plan |a_new(t*)-a_old(t*)| p50/p95",
     lambda r: f"{r['departure_p50']:.4f} / {r['departure_p95']:.4f}"),
    ("executed step inside chunks p50/p95", lambda r: f"{r['inside_step_p50']:.4f} / {r['inside_step_p95']:.4f}"),
    ("executed seam / inside step (p50)", lambda r: f"{r['executed_seam_over_step']:.2f}"),
    ("departure from old plan / inside step (p50)", lambda r: f"{r['departure_over_step']:.2f}"),
    ("tracking RMS vs demo arm (rad)", lambda r: f"{r['tracking_rms']:.4f}"),
    ("chunks / commands", lambda r: f"{r['chunks']} / {r['commands']}"),
]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoints", type=Path, default=CHECKPOINTS, help="folder holding the two checkpoints")
    ap.add_argument("--tokenizer", type=Path, help="SentencePiece model (default: the fixture tokenizer)")
    ap.add_argument("--seconds", type=float, default=16.0, help="fake-time length of the stream per mode")
    ap.add_argument("--delay-ms", type=float, default=100.0, help="fixed inference latency (fake time)")
    ap.add_argument("--start", type=float, default=1.0, help="session time of the first observation (s)")
    ap.add_argument("--dt", type=float, default=0.02, help="control period (s): the checkpoints' training dt")
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    from phyai_ros.testing import tokenizer_path
    tok = args.tokenizer or tokenizer_path()
    if tok is None or not Path(tok).is_file():
        print("bench_rtc_seams: tokenizer not found (pass --tokenizer or set PHYAI_PARITY_FIXTURES)", file=sys.stderr)
        return 1
    results = {}
    for label in args.runs:
        t0 = time.monotonic()
        results[label] = measure(label, Path(tok), args.checkpoints, seconds=args.seconds, delay_ms=args.delay_ms,
                                 t_start=args.start, dt=args.dt)
        print(f"{label}: {results[label]['switches']} switches in {time.monotonic() - t0:.0f} s", flush=True)
    print(f"\nbench_rtc_seams: {args.seconds:.0f} s of the demo stream per mode, dt {args.dt * 1e3:.0f} ms, "
          f"inference delay {args.delay_ms:.0f} ms (fixed, fake clock), inf-norm over the 7 action dims (rad)")
    heads = [f"{lbl} ({RUNS[lbl][0].replace('tiny_pi05_', '')})" for lbl in results]
    print(f"{'':52s}" + "".join(f"{h:>26s}" for h in heads))
    for label, fmt in ROWS:
        print(f"{label:52s}" + "".join(f"{fmt(r):>26s}" for r in results.values()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
