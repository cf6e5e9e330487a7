"""The main-job demo: a recorded session goes in, the node runs pi0.5, a report comes out.

    python -m phyai_ros.replay.demo [--workdir DIR] [--duration SECONDS] [--stress] [--rate-hz HZ] [--mode realtime|stepped]

(``scripts/demo.sh`` sets up the environment first.)  Steps, all on the CPU, no download:

1. the small pi0.5 trained on this demo's task (``checkpoints/tiny_pi05_demo``, fixture sizes,
   50-action chunks; a random-weight one for the stepped mode's 20-action chunks) and the fixture
   tokenizer (``$PHYAI_PARITY_FIXTURES``);
2. synthetic robot session bags (3 cameras at 15-30 Hz, joint states at 50 Hz, an instruction): a
   short warm-up and the session (kept in ``<workdir>/bags``: a later run with the same generator reuses them);
3. a warm-up replay: the onboard policy node (``config/pi05_cpu_test.yaml``, ``use_sim_time``) at 50 Hz,
   inferring back to back while the warm-up bag plays into it in real time, so its compute time
   (queue + inference + actuate, from its ControlMargins) is measured the way the session will run:
   the node's threads, the replay beside it, whatever else loads this machine;
4. the control plan from that distribution (``plan_control``): the fastest rate in ``CONTROL_RATES``
   whose RTC trigger leaves ``TAIL_SAFETY`` x the p99 compute time before a chunk runs out and still
   lets the node rest between inferences, and a session of ``MIN_CYCLES`` chunk cycles (``SESSION_S``,
   up to ``SESSION_MAX_S``); it says what it chose and why;
5. a fresh node with that plan and a real-time replay of the session into it, recording chunks,
   margins, commands and diagnostics;
6. the report (HTML + Markdown + PNG plots), whose path is printed last.

``--stress`` adds a second replay of the same bag, sped up until the measured inference p50 spans
``STRESS_CHUNKS`` chunks of the robot's time (at least ``STRESS_MIN_RATE`` x): an overload, whose
verdict must be ERROR with the misses and the silence counted; the report gets an "Overload run"
section for it.  ``--mode stepped`` replays deterministically on the ``/clock`` the replay drives
(no warm-up: inference takes no simulated time there).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from phyai_ros.fixtures import fixtures_dir, make_small_checkpoint, tokenizer_path
from phyai_ros.replay.cli import format_summary, run_replay
from phyai_ros.replay import demo_bag as demo_bag_module
from phyai_ros.replay.demo_bag import DemoBag, DemoBagConfig, make_demo_bag
from phyai_ros.replay.nodeproc import PACKAGE_ROOT, PolicyNode
from phyai_ros.replay.player import ReplayOptions
from phyai_ros.replay.report import make_report

CONTROL_RATES = (50.0, 25.0, 20.0, 10.0, 5.0)  # Hz, fastest first (the demo policy was trained at 50 Hz)
TAIL_SAFETY = 3.5     # the trigger leaves this many times the p99 compute time: the load can change after the warm-up
MIN_CYCLES = 40       # chunk cycles a session holds: the margin bound needs >= 32 hits (eps 0.05, 90 %)
SESSION_S = 30.0      # session length (s): the demo stays about a minute
SESSION_MAX_S = 45.0  # ... or up to this, where chunk cycles that must outlast the p99 need it
MIN_OVERLAP = 5       # rtc.overlap of config/pi05_cpu_test.yaml: the trigger never comes later than that
WARMUP_S = 8.0        # warm-up session length (s)
STATE_RATE_HZ = 50.0  # the robot publishes joint states at 50 Hz whatever the policy's rate
STRESS_CHUNKS = 2.0   # --stress: inference p50 spans this many chunks of robot time
STRESS_MIN_RATE = 5.0


@dataclass(frozen=True)
class ControlPlan:
    """What the demo runs the node with: the control period, the RTC overlap (``rtc.overlap``), the session
    length, and the reasons, one line each."""

    dt: float
    overlap: int
    session_s: float
    why_rate: str
    why_session: str

    @property
    def hz(self) -> float:
        return 1.0 / self.dt


def compute_times(margins) -> np.ndarray:
    """Seconds from snapshot to chunk with the timer (L_queue + L_inference + L_actuate) of every chunk a
    node reported a margin for: the part of the critical path that the RTC trigger has to cover."""
    out = [m.latency_queue + m.latency_inference + m.latency_actuate for m in margins]
    return np.array([c for c in out if math.isfinite(c) and c > 0], float)


def plan_control(compute_s: Sequence[float], horizon: int, *, rate_hz: Optional[float] = None,
                 duration: Optional[float] = None) -> ControlPlan:
    """The control plan for a measured compute-time distribution (seconds, as ``compute_times``).

    A chunk triggered with R actions left must reach the timer within (R + 1) dt (design.md §3: M_ctrl =
    cover_end - ready); the node triggers at R = d_est + rtc.overlap, d_est its own high quantile of the
    actions consumed while past inferences ran: from d_min (the fastest measured) to d95.  So, per rate:

    * budget: even at d_min, (d_min + overlap + 1) dt >= TAIL_SAFETY x p99 (the smallest overlap);
    * rest: a chunk cycle, (H - d_est - overlap) dt, outlasts the p99 even at d95, so the node rests between
      inferences (the largest overlap);
    * session: within those, the overlap that brings the longest cycle (at d_min) nearest to
      SESSION_S / MIN_CYCLES; the session then holds MIN_CYCLES of the longest cycles (SESSION_S, longer up to
      SESSION_MAX_S where needed; ``duration`` instead when given).

    The fastest rate of ``CONTROL_RATES`` where the budget fits under the rest is chosen (``rate_hz``: that rate
    instead, said to be too fast when it is)."""
    c = np.asarray(compute_s, float)
    if c.size == 0:
        raise ValueError("no compute-time samples: the warm-up produced no chunk")
    p50, p99 = float(np.percentile(c, 50)), float(np.percentile(c, 99))
    need = TAIL_SAFETY * p99
    measured = f"compute p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms over {c.size} chunks"
    rates = (float(rate_hz),) if rate_hz else CONTROL_RATES
    for i, hz in enumerate(rates):
        dt = 1.0 / hz
        d_min = int(np.floor(c.min() / dt))
        d95 = int(np.quantile(np.ceil(c / dt), 0.95, method="higher"))
        rest = max(1, int(np.ceil(p99 / dt - 1e-9)))
        smallest = max(MIN_OVERLAP, int(np.ceil(need / dt - 1e-9)) - 1 - d_min)   # the budget at d_min
        largest = min(horizon - 1, horizon - d95 - rest)                          # the rest at d95
        fits = smallest <= largest
        if not fits and not rate_hz and i + 1 < len(rates):
            continue
        target = horizon - d_min - int(SESSION_S / MIN_CYCLES / dt + 1e-9)      # longest cycle ~ SESSION_S/MIN_CYCLES
        overlap = min(horizon - 1, max(smallest, min(largest, target)))
        budget = (d_min + overlap + 1) * dt
        cycle = max(horizon - d_min - overlap, 1) * dt                            # the longest cycle
        why = (f"{hz:g} Hz, RTC trigger d_est+{overlap} actions before a chunk ends (rtc.overlap {overlap}): a budget "
               f"of at least {budget * 1e3:.0f} ms {'>=' if budget >= need - 1e-9 else '<'} {TAIL_SAFETY:g} x p99, "
               f"chunk cycles of {(horizon - d95 - overlap) * dt:.2f}-{cycle:.2f} s ({measured})")
        if rate_hz:
            why += " [--rate-hz]" + ("" if fits else "; too fast for this machine: expect deadline misses")
        elif not fits:
            why += "; the slowest offered, still too fast for this machine: expect deadline misses"
        session = float(duration) if duration is not None else float(
            min(SESSION_MAX_S, max(SESSION_S, np.ceil(MIN_CYCLES * cycle))))
        held = session / cycle
        note = "" if held >= MIN_CYCLES - 1e-9 else (
            f"; fewer than {MIN_CYCLES} chunk cycles: the margin target may not be demonstrable, expect WARN")
        origin = "as asked" if duration is not None else f"at least {held:.0f} chunk cycles"
        return ControlPlan(dt, overlap, session, why, f"{session:g} s ({origin}{note})")
    raise AssertionError("unreachable: the last rate always returns")


def stress_rate(compute_s: Sequence[float], plan: ControlPlan, horizon: int) -> float:
    """Replay speed of the overload run: the robot's time runs so much faster that the measured inference p50
    spans ``STRESS_CHUNKS`` chunks of it (a chunk is stale before it is computed), at least STRESS_MIN_RATE."""
    p50 = float(np.percentile(np.asarray(compute_s, float), 50))
    return float(max(STRESS_MIN_RATE, np.ceil(STRESS_CHUNKS * horizon * plan.dt / p50)))


def cached_demo_bag(cache: Path, name: str, config: DemoBagConfig) -> tuple:
    """``make_demo_bag`` once per generator version and configuration: the bag is written under ``cache`` (its
    folder name holds the configuration and a hash of the generator's source) and reused afterwards.
    Returns (DemoBag, whether it was reused)."""
    source = Path(demo_bag_module.__file__).read_bytes()
    key = hashlib.sha256(source + repr(config).encode()).hexdigest()[:12]
    folder = cache / f"{name}_{config.duration:g}s_{config.storage}_{key}"
    info = folder / "demo_bag.json"
    if info.is_file():
        d = json.loads(info.read_text())
        return DemoBag(path=folder / name, storage=d["storage"], duration=d["duration"], counts=d["counts"],
                       truth=d["truth"]), True
    partial = cache / f".{folder.name}.{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    bag = make_demo_bag(partial / name, config)
    (partial / "demo_bag.json").write_text(json.dumps({"storage": bag.storage, "duration": bag.duration,
                                                       "counts": bag.counts, "truth": bag.truth}))
    try:
        partial.rename(folder)     # atomic: a concurrent demo sees the whole bag or none
    except OSError:                # another demo wrote it first
        shutil.rmtree(partial, ignore_errors=True)
    return DemoBag(path=folder / name, storage=bag.storage, duration=bag.duration, counts=bag.counts,
                   truth=bag.truth), False


def overload_section(report, rate: float) -> tuple:
    """The main report's "Overload run" section (title, lines) from the overload run's own report: its
    verdict line, headline and facts as that report says them (the same numbers)."""
    v = report.numbers["verdict"]
    return (f"Overload run (--stress): the same bag at {rate:g}x real time (inference p50 spans "
            f"{STRESS_CHUNKS:g} chunks of the robot's time)",
            [f"Verdict: {report.verdict_line}", v["headline"], *v["facts"], f"Full report: {report.index}"])


def load_note() -> str:
    """The machine's load when the plan was made (other processes share the CPU)."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return ""
    return f"; load average {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} CPUs"


def build_parser() -> argparse.ArgumentParser:
    """The demo's options (scripts/demo.sh's header lists every one)."""
    ap = argparse.ArgumentParser(prog="demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default=os.environ.get("PHYAI_DEMO_DIR") or
                    str(Path(tempfile.gettempdir()) / "phyai_ros_demo"),
                    help="where the checkpoint, bags, node log and report go (default $PHYAI_DEMO_DIR or "
                         "<tmp>/phyai_ros_demo)")
    ap.add_argument("--duration", type=float, default=None, help=f"session length in seconds (default {SESSION_S:g})")
    ap.add_argument("--mode", choices=("realtime", "stepped"), default="realtime",
                    help="realtime (default): the bag's timing, the node measured; stepped: deterministic, "
                         "/clock-driven, inference takes no simulated time")
    ap.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    ap.add_argument("--rate-hz", type=float, default=None,
                    help="control rate instead of the one planned from the warm-up (real-time mode)")
    ap.add_argument("--stress", action="store_true",
                    help="also replay the bag sped up until inference spans several chunks of the robot's time "
                         f"(at least {STRESS_MIN_RATE:g}x), an overload: the monitor must say ERROR")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = build_parser().parse_args(argv)
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
    # so the stepped demo runs the CPU config's 20 Hz with 20-action chunks; real time plans its rate.
    horizon = 20 if stepped else 50
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

    def bag_of(name: str, duration: float, seed: int, state_rate: float):
        bag, reused = cached_demo_bag(Path(a.workdir) / "bags", name, DemoBagConfig(
            duration=duration, storage=a.storage, seed=seed, state_rate_hz=state_rate))
        say(f"demo {name} bag ({'reused, ' if reused else ''}{bag.storage}, {bag.duration:.0f} s, {bag.total} "
            "messages: " + ", ".join(f"{k.rsplit('/', 2)[-2] if k.count('/') > 1 else k.strip('/')} {v}"
                                     for k, v in sorted(bag.counts.items())) + f"): {bag.path}")
        return bag

    def replay_once(name: str, bag, overrides: dict, rate: float = 1.0,
                    started: Optional[Callable[[], object]] = None):
        hz = 1.0 / overrides["control.dt"]
        say(f"starting the policy node (pi05-small-cpu, {hz:g} Hz control, rtc.overlap "
            f"{overrides.get('rtc.overlap', MIN_OVERLAP)}, use_sim_time)")
        node = PolicyNode(checkpoint=ckpt, tokenizer=tok, overrides=overrides, stepped=stepped,
                          log_path=run / f"{name}.node.log")
        try:
            if started is not None:
                started()   # work for this process while the node loads (its own process)
            say(f"replaying the {bag.path.name} bag {a.mode} at {rate:g}x (about {bag.duration / rate + 2:.0f} s)"
                if not stepped else f"replaying the {bag.path.name} bag stepped")
            result = run_replay(bag.path, out=run / name,
                                options=ReplayOptions(mode=a.mode, rate=rate), node_info=node.info,
                                node_process=node, log=lambda m: None)
        except Exception as exc:  # noqa: BLE001 - explain and point at the node log
            print(f"demo: replay failed: {type(exc).__name__}: {exc}\n--- node log (last lines) ---\n"
                  f"{node.output(last=20)}", file=sys.stderr)
            return None
        finally:
            node.stop()
        return result

    session: list = []
    if stepped:
        plan = ControlPlan(0.05, MIN_OVERLAP, a.duration or SESSION_S, "20 Hz (stepped: simulated time)", "")
        session.append(bag_of("session", plan.session_s, 0, plan.hz))
        compute = np.array([])
    else:
        # The warm-up: the node at 50 Hz inferring back to back (the trigger always on), the warm-up bag
        # playing into it; the session bag is written while that node loads.
        warmup = bag_of("warmup", WARMUP_S, 1, STATE_RATE_HZ)
        duration = a.duration or SESSION_S
        measured = replay_once("warmup_out", warmup, {"control.dt": 1.0 / CONTROL_RATES[0], "control.horizon": horizon,
                                                      "rtc.overlap": horizon - 1},
                               started=lambda: session.append(bag_of("session", duration, 0, STATE_RATE_HZ)))
        if measured is None:
            return 1
        compute = compute_times(measured.margin_values)
        if compute.size == 0:
            print("demo: the warm-up produced no chunk; node log: " + str(run / "warmup_out.node.log"),
                  file=sys.stderr)
            return 1
        plan = plan_control(compute, horizon, rate_hz=a.rate_hz, duration=a.duration)
        why = plan.why_rate
        if ckpt == trained and abs(plan.dt - 0.02) > 1e-9:
            why += f" (the policy was trained at 50 Hz: its motion plays {plan.dt / 0.02:g}x slower)"
        say(f"control plan from the warm-up{load_note()}: {why}")
        say(f"session length {plan.why_session}")
    bag = session[0]
    overrides = {"control.dt": plan.dt, "control.horizon": horizon, "rtc.overlap": plan.overlap}

    result = replay_once("replay_out", bag, overrides)
    if result is None:
        return 1
    print(format_summary(result), flush=True)
    appendix = []
    if a.stress and not stepped:
        rate = stress_rate(compute, plan, horizon)
        stress = replay_once("stress_out", bag, overrides, rate=rate)
        if stress is None:
            return 1
        print(format_summary(stress), flush=True)
        srep = make_report(stress.out_path)
        say(f"overload report written: {srep.verdict_line}")
        appendix.append(overload_section(srep, rate))
    rep = make_report(result.out_path, appendix=appendix)
    say("report written")
    print(f"\nverdict: {rep.verdict_line}")
    if appendix:
        print(f"overload ({rate:g}x): {appendix[0][1][0][len('Verdict: '):]}")
    print(f"report:  {rep.index}")
    print(f"         {rep.markdown} (+ {len(rep.figures)} PNG plots in {rep.out_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
