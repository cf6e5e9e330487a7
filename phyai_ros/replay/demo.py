"""The main-job demo: a recorded session goes in, the node runs pi0.5, a report comes out.

    python -m phyai_ros.replay.demo [--workdir DIR] [--duration SECONDS] [--stress] [--rate-hz HZ] [--mode realtime|stepped]

(``scripts/demo.sh`` sets up the environment first.)  Steps, all on the CPU, no download:

1. the small pi0.5 trained on this demo's task (``checkpoints/tiny_pi05_demo``, fixture sizes,
   50-action chunks; a random-weight one for the stepped mode's 20-action chunks) and the fixture
   tokenizer (``$PHYAI_PARITY_FIXTURES``);
2. a synthetic robot session bag (3 cameras at 15-30 Hz, joint states at 50 Hz, an instruction);
3. the onboard policy node (``config/pi05_cpu_test.yaml``, 50 Hz control, ``use_sim_time``);
4. a real-time replay of the bag into it, recording chunks, margins, commands and diagnostics;
5. the report (HTML + Markdown + PNG plots), whose path is printed last.

The control rate is sized to the machine: before the node starts, the demo times the model's
end-to-end inference here and picks the fastest rate in ``CONTROL_RATES`` whose chunk (H
actions) lasts at least ``HEADROOM`` times the slowest of those calls, and says what it chose.
A healthy loop is the default; ``--stress`` adds a second replay of the same bag at 5x real
time (the robot's time runs 5x faster than this machine), whose verdict must be ERROR with the
misses and the silence counted; the report gets an "Overload run" section for it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from phyai_ros.fixtures import fixtures_dir, make_small_checkpoint, tokenizer_path
from phyai_ros.models.common.policy import norm_stats_file
from phyai_ros.models.pi05 import Pi05Adapter
from phyai_ros.replay.cli import format_summary, run_replay
from phyai_ros.replay.demo_bag import DEFAULT_CAMERAS, DemoBagConfig, make_demo_bag
from phyai_ros.replay.nodeproc import PACKAGE_ROOT, PolicyNode
from phyai_ros.replay.player import ReplayOptions
from phyai_ros.replay.report import make_report

CONTROL_RATES = (50.0, 25.0, 20.0, 10.0, 5.0)  # Hz, fastest first
HEADROOM = 4.0       # chunk duration >= HEADROOM x measured latency: room for the RTC overlap and the replay's load
STRESS_RATE = 5.0    # replay speed of the --stress run
MIN_CYCLES = 45      # chunk cycles a session should hold: the margin bound needs >= 32 hits (eps 0.05, 90 %)
RTC_OVERLAP = 5      # rtc.overlap of config/pi05_cpu_test.yaml


def session_length(requested: Optional[float], latency_s: float, dt: float, horizon: int) -> Tuple[float, str]:
    """Seconds of session: long enough for ``MIN_CYCLES`` chunk cycles (a cycle is the chunk
    minus the actions consumed during inference and the RTC overlap), unless given."""
    cycle = max(1, horizon - int(latency_s / dt + 1) - RTC_OVERLAP) * dt
    needed = MIN_CYCLES * cycle
    if requested is not None:
        note = "" if requested >= needed else (f" (fewer than {MIN_CYCLES} chunk cycles of ~{cycle:.2f} s: the margin "
                                               "target may not be demonstrable, expect WARN)")
        return requested, f"{requested:g} s as asked{note}"
    length = max(40.0, float(np.ceil(needed)))
    return length, f"{length:g} s ({MIN_CYCLES} chunk cycles of ~{cycle:.2f} s)"


def size_control_rate(latency_s: float, horizon: int) -> Tuple[float, str]:
    """The control period dt for a measured inference latency, and why."""
    for hz in CONTROL_RATES:
        if horizon / hz >= HEADROOM * latency_s:
            return 1.0 / hz, (f"{hz:g} Hz: a {horizon}-action chunk lasts {horizon / hz:.2f} s >= {HEADROOM:g} x "
                              f"{latency_s * 1e3:.0f} ms measured inference")
    hz = CONTROL_RATES[-1]
    return 1.0 / hz, (f"{hz:g} Hz (the slowest offered): {latency_s * 1e3:.0f} ms measured inference is too slow for "
                      f"a healthy loop on this machine; expect deadline misses")


def measure_inference(checkpoint, tokenizer, runs: int = 3) -> float:
    """Slowest of ``runs`` end-to-end calls (after one warm-up) of the model on this machine, with the
    demo's camera sizes: what the node will spend per chunk."""
    policy = Pi05Adapter.from_files(checkpoint, tokenizer, norm_stats_file(None, Path(checkpoint)))
    rng = np.random.default_rng(0)
    images = {name: rng.integers(0, 256, (cam.height, cam.width, 3), dtype=np.uint8)
              for name, cam in zip(policy.camera_names, DEFAULT_CAMERAS)}
    state = np.zeros(policy.state_dim, np.float32)
    times = []
    with torch.no_grad():
        for i in range(runs + 1):
            t = time.perf_counter()
            policy.predict(images, state, "pick up the red cube and put it in the blue bowl")
            if i:
                times.append(time.perf_counter() - t)
    return max(times)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default=os.environ.get("PHYAI_DEMO_DIR") or
                    str(Path(tempfile.gettempdir()) / "phyai_ros_demo"),
                    help="where the checkpoint, bags, node log and report go (default $PHYAI_DEMO_DIR or "
                         "<tmp>/phyai_ros_demo)")
    ap.add_argument("--duration", type=float, default=None,
                    help=f"session length in seconds (default: 40, or longer to hold {MIN_CYCLES} chunk cycles)")
    ap.add_argument("--mode", choices=("realtime", "stepped"), default="realtime")
    ap.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    ap.add_argument("--rate-hz", type=float, default=None,
                    help="control rate instead of the one sized to this machine (real-time mode)")
    ap.add_argument("--stress", action="store_true",
                    help=f"also replay the bag at {STRESS_RATE:g}x real time, an overload: the monitor must say ERROR")
    a = ap.parse_args(argv)
    t_start = time.monotonic()

    def say(msg: str) -> None:
        print(f"[demo {time.monotonic() - t_start:5.1f}s] {msg}", flush=True)

    tok = tokenizer_path()
    if tok is None:
        print(f"demo: the tokenizer is missing ({fixtures_dir() / 'tokenizer' / 'tokenizer.model'}).\n"
              "demo: the small pi0.5 needs it to run; set PHYAI_PARITY_FIXTURES to the lerobot_parity fixture "
              "folder (it holds tokenizer/tokenizer.model) and run again.", file=sys.stderr)
        return 1
    stepped = a.mode == "stepped"
    # Stepped replay needs one /diagnostics report per tick and the node accepts periods >= 0.05 s,
    # so the stepped demo runs the CPU config's 20 Hz with 20-action chunks; real time runs 50 Hz x 50.
    dt, horizon, state_rate = (0.05, 20, 20.0) if stepped else (0.02, 50, 50.0)
    run = Path(a.workdir) / time.strftime("%Y%m%d_%H%M%S")
    run.mkdir(parents=True, exist_ok=True)
    say(f"working in {run}")

    trained = PACKAGE_ROOT / "checkpoints" / "tiny_pi05_demo"
    if not stepped and (trained / "model.safetensors").is_file():
        ckpt = trained
        say(f"small pi0.5 trained on this demo's task (checkpoints/README.md; 50-action chunks for 50 Hz): {ckpt}")
    else:
        ckpt = make_small_checkpoint(run / "checkpoint", horizon=horizon)
        say(f"small pi0.5 checkpoint (random weights, {horizon}-action chunks): {ckpt}")
    if not stepped:
        latency = measure_inference(ckpt, tok)
        if a.rate_hz:
            dt, why = 1.0 / a.rate_hz, f"{a.rate_hz:g} Hz as asked (--rate-hz; {latency * 1e3:.0f} ms measured inference)"
        else:
            dt, why = size_control_rate(latency, horizon)
        state_rate = 1.0 / dt
        if ckpt == trained and abs(dt - 0.02) > 1e-9:
            why += f" (the policy was trained at 50 Hz: its motion plays {dt / 0.02:g}x slower)"
        say(f"control rate {why}")
        duration, why = session_length(a.duration, latency, dt, horizon)
        say(f"session length {why}")
    else:
        duration = a.duration or 40.0

    bag = make_demo_bag(run / "session", DemoBagConfig(duration=duration, storage=a.storage,
                                                       state_rate_hz=state_rate))
    say(f"demo session bag ({bag.storage}, {bag.duration:.0f} s, {bag.total} messages: "
        + ", ".join(f"{k.rsplit('/', 2)[-2] if k.count('/') > 1 else k.strip('/')} {v}"
                    for k, v in sorted(bag.counts.items())) + f"): {bag.path}")

    overrides = {"control.dt": dt, "control.horizon": horizon}

    def replay_once(name: str, rate: float):
        say(f"starting the policy node (pi05-small-cpu, {1 / dt:g} Hz control, use_sim_time)")
        node = PolicyNode(checkpoint=ckpt, tokenizer=tok, overrides=overrides, stepped=stepped,
                          log_path=run / f"{name}.node.log")
        try:
            say(f"replaying {a.mode} at {rate:g}x (about {duration / rate + 2:.0f} s)" if not stepped
                else "replaying stepped")
            result = run_replay(bag.path, out=run / name, options=ReplayOptions(mode=a.mode, rate=rate),
                                node_info=node.info, node_process=node, log=lambda m: None)
        except Exception as exc:  # noqa: BLE001 - explain and point at the node log
            print(f"demo: replay failed: {type(exc).__name__}: {exc}\n--- node log (last lines) ---\n"
                  f"{node.output(last=20)}", file=sys.stderr)
            return None
        finally:
            node.stop()
        print(format_summary(result), flush=True)
        return result

    result = replay_once("replay_out", 1.0)
    if result is None:
        return 1
    appendix = []
    if a.stress and not stepped:
        stress = replay_once("stress_out", STRESS_RATE)
        if stress is None:
            return 1
        srep = make_report(stress.out_path)
        say(f"overload report written: {srep.verdict_line}")
        appendix.append((f"Overload run (--stress): the same bag at {STRESS_RATE:g}x real time",
                         [f"Verdict: {srep.verdict_line}", srep.numbers["verdict"]["headline"],
                          *srep.numbers["verdict"]["facts"], f"Full report: {srep.index}"]))
    rep = make_report(result.out_path, appendix=appendix)
    say("report written")
    print(f"\nverdict: {rep.verdict_line}")
    if appendix:
        print(f"overload ({STRESS_RATE:g}x): {appendix[0][1][0][len('Verdict: '):]}")
    print(f"report:  {rep.index}")
    print(f"         {rep.markdown} (+ {len(rep.figures)} PNG plots in {rep.out_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
