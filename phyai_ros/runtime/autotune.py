"""The start-up operator autotune: a GPU that no profile matches gets its fast path in seconds, and keeps it.

Without a profile for its device a policy runs every op's default candidate (on an H100, 2026-12-06: pi0.5 bs1
17.84 ms against 16.96 ms with a profile that took 218 s to make). So on a device that no explicit, cached or
shipped profile matches (``layers.profiles``), the node, ``predict`` and the benches call ``tune`` before any
graph is captured:

1. the (op, shape) calls the model makes are recorded on a synthetic observation, eagerly through every bucket the
   runner will capture (``layers.profiling.record``; the quantized linears' "dense" pass too where they hold a
   dense copy);
2. per call, only a shortlist is timed (``layers.shortlist``: the candidates the nearest measured device found
   fastest at that shape, the default, and candidates no device measured), each in a CUDA graph of
   ``AUTOTUNE_REPS`` calls replayed ``AUTOTUNE_REPLAYS`` times, within a wall-time budget, the calls where the
   nearest device gained most first (calls not reached keep their defaults and are tuned at the next start);
3. the choices go into the device's cache file (stamped: kernels, Triton, torch), which later starts load.

Progress goes to the log (a line every few seconds and one at the end: calls, candidates timed, seconds).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from phyai_ros.layers import profiling
from phyai_ros.layers.profiles import ProfileChoice, cache_file, shipped_dir, write_profile
from phyai_ros.layers.quantized import dense_shapes, plan_dense
from phyai_ros.layers.selector import OperatorSelector, ProfileError, read_profile
from phyai_ros.layers.shortlist import SHORTLIST, Priors, shortlist

log = logging.getLogger(__name__)

# Each shortlisted candidate: a CUDA graph of >= 10 calls replayed 3 times (profile_ops: 20 x 7, every candidate).
AUTOTUNE_REPS, AUTOTUNE_REPLAYS = 10, 3
BUDGET_S = 30.0          # the node's model.op_autotune_budget default
PROGRESS_EVERY_S = 5.0
# Profiles a start extends with the calls they lack (the node's warm-up finds them): its own cache, and a shipped
# profile of its device made for other models (the H100's holds pi0.5 and GR00T; pi0 or Cosmos3 add theirs).
EXTENDED = ("cache", "shipped")
UNMEASURED_PRIORITY = 0.05   # us: a call no device measured is tuned after those that gained more


@dataclass(frozen=True)
class TuneSettings:
    """How a start-up autotune runs: its wall-time budget (s), the shortlist size (0: every usable candidate),
    the runner's prompt bucket and the fewest cameras an observation can have (the buckets to record)."""

    budget_s: float = BUDGET_S
    shortlist: int = SHORTLIST
    token_bucket: int = 0
    min_cameras: Optional[int] = None


def wanted(setting: str, device, selector: Optional[OperatorSelector] = None) -> bool:
    """The node's model.op_autotune: "on" anywhere, "auto" on CUDA devices (the CPU has one candidate per op,
    nothing to choose), "off" never; and never for a ``selector`` forced to one candidate (PHYAI_OPS=torch)."""
    if selector is not None and selector.forced:
        return False
    return setting == "on" or (setting == "auto" and torch.device(device).type == "cuda")


def synthetic_observation(camera_slots, state_dim: int, robot_cameras=None) -> tuple[dict, np.ndarray]:
    """The warm-up's observation: random 224x224 frames from every robot camera the model has (every slot of the
    model where the robot's are not known), a zero state."""
    rng = np.random.default_rng(0)
    slots = [s for s in camera_slots if s in (robot_cameras or ())] or list(camera_slots)
    images = {slot: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for slot in slots}
    return images, np.zeros(state_dim, dtype=np.float32)


def profiled_keys(choice: ProfileChoice) -> set:
    """The (op, shape key) pairs a profile file covers for the choice's device: chosen or timed."""
    try:
        data = read_profile(choice.path) if choice.path is not None else {"devices": {}, "timings": {}}
    except ProfileError:   # gone or rewritten (by hand, wrongly) since it was chosen: profile anew
        return set()
    keys = set()
    for section in ("devices", "timings"):
        for op, table in data[section].get(choice.signature, {}).items():
            keys |= {(op, key) for key in table}
    return keys


def shipped_priors(signature: str) -> Priors:
    """The shipped profiles' timings of other devices, nearest first (what the shortlist ranks by)."""
    folder = shipped_dir()
    return Priors.load(signature, sorted(folder.glob("*.json")) if folder is not None and folder.is_dir() else [])


def bounded_search(selector: OperatorSelector, priors: Priors, size: int = SHORTLIST) -> dict:
    """``profiling.profile_calls``' keywords of the bounded autotune: per call the shortlist (``size`` 0: every
    usable candidate), and the calls in order of what the nearest measured device gained at them over the
    default (unmeasured ones between those that gained and those that did not)."""
    def select(op, key, cands):
        return shortlist(priors, op, key, cands, size)

    def priority(op, key) -> float:
        default = next((c.name for c in selector.candidates[op] if not c.profiled_only), "")
        gained = priors.gain(op, key, default)
        return UNMEASURED_PRIORITY if gained is None else gained
    return {"select": select if size > 0 else None, "priority": priority}


def show_progress(stream=None) -> None:
    """A command-line tool's view of the autotune (predict, the benches): its progress and result lines on
    ``stream`` (default stderr). The node forwards them to its ROS log instead (node/logs.py). Idempotent."""
    if not any(getattr(h, "autotune_console", False) for h in log.handlers):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.autotune_console = True
        log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)


class _Progress:
    """The log's view of a running autotune: a line every PROGRESS_EVERY_S seconds."""

    def __init__(self, total: int, start: float):
        self.total, self.start, self.done, self.last = total, start, 0, start

    def __call__(self, op, key, entry, chosen) -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            log.info("op autotune: %d/%d calls in %.1f s (%s %s -> %s)", self.done, self.total, now - self.start,
                     op, key, chosen or "default")


def tune(selector: OperatorSelector, choice: ProfileChoice, adapter, observation: tuple, device,
         settings: TuneSettings = TuneSettings(), cache: Optional[Path] = None,
         priors: Optional[Priors] = None) -> ProfileChoice:
    """Autotune ``adapter``'s calls into ``selector``'s profile for ``device`` and the device's cache file (module
    docstring). ``choice``: where the profile came from; a cached or shipped one is extended by the calls it lacks
    (into the cache, which then holds the shipped table too). A cache that cannot be written costs only the next
    start's tuning. Leaves the adapter on an eager runner: start the runner after (the adapter is left on a fresh
    one of the kind it had)."""
    device = torch.device(device)
    t0 = time.perf_counter()
    had_graphs = getattr(adapter.runner, "use_graphs", False)
    if device.type == "cuda":   # the node's prompt buckets, without graphs (the graph warm-up would not call ops)
        with selector.active():
            adapter.use_runner(use_graphs=False, token_bucket=settings.token_bucket)
    images, state = observation
    dense = any(w.dense is not None for w in adapter.quantized_weights())
    calls = profiling.record(selector, lambda: adapter.capture_buckets(images, state, eager=True,
                                                                       min_cameras=settings.min_cameras),
                             extra=("dense",) if dense else ())
    done = profiled_keys(choice) if choice.origin in EXTENDED else set()
    todo = {k: v for k, v in calls.items() if k not in done}
    t1 = time.perf_counter()
    priors = shipped_priors(choice.signature) if priors is None else priors
    search = bounded_search(selector, priors, settings.shortlist)
    progress = _Progress(len(todo), t1)
    table, timings = profiling.profile_calls(selector, todo, device, reps=AUTOTUNE_REPS, replays=AUTOTUNE_REPLAYS,
                                             time_single=False, report=progress,
                                             deadline=t1 + max(0.0, settings.budget_s - (t1 - t0)), **search)
    reached = sum(len(keys) for keys in timings.values())
    timed = sum(isinstance(v, dict) for keys in timings.values() for entry in keys.values() for v in entry.values())
    t2 = time.perf_counter()
    detail = (f"{len(todo)} new (op, shape) calls of {len(calls)} recorded in {t1 - t0:.1f} s, {timed} candidate "
              f"timings in {t2 - t1:.1f} s" + (f" ({len(priors.tables)} measured devices ranked the shortlists)"
                                               if search["select"] and priors.tables else "")
              + (f"; budget {settings.budget_s:g} s reached: {len(todo) - reached} calls keep their defaults "
                 "until the next start" if reached < len(todo) else ""))
    if device.type == "cuda":
        with selector.active():
            adapter.use_runner(use_graphs=had_graphs, token_bucket=settings.token_bucket)
    path = choice.path if choice.origin == "cache" else cache_file(choice.signature, cache)
    if choice.origin == "shipped":   # the cache supersedes the shipped file at the next start: it holds both
        table, timings = _over_shipped(choice, table, timings)
    try:
        write_profile(path, choice.signature, table, timings)
    except OSError as exc:
        log.warning("op autotune: cannot write %s (%s); the profile holds for this run only", path, exc)
        return ProfileChoice(choice.signature, None, "autotune", detail=f"{detail}; not cached: {exc}")
    tuned = ProfileChoice(choice.signature, path, "autotune", detail=detail)
    log.info(tuned.describe())
    return tuned


def _over_shipped(choice: ProfileChoice, table: dict, timings: dict) -> tuple[dict, dict]:
    """The shipped profile's table and timings for the device with the newly tuned calls over them."""
    try:
        data = read_profile(choice.path)
    except ProfileError:   # gone since it was chosen: the new calls alone
        return table, timings
    merged = []
    for section, new in (("devices", table), ("timings", timings)):
        base = {op: dict(keys) for op, keys in data[section].get(choice.signature, {}).items()}
        for op, keys in new.items():
            base.setdefault(op, {}).update(keys)
        merged.append(base)
    return merged[0], merged[1]


def apply_quant_plan(selector: OperatorSelector, signature: str, weights, dtype: torch.dtype) -> int:
    """After the profile is final: a quantized weight keeps its dense copy only where the profile chose the
    bf16 path at one of its shapes (``quantized.dense_shapes``); returns how many keep one, and logs it."""
    if not weights:
        return 0
    held = plan_dense(weights, dense_shapes(selector.profile.get(signature, {})), dtype)
    log.info("quantized plan: %d of %d quantized weights also run bf16 at some shape (the profile measured it "
             "faster there)", held, len(weights))
    return held


def prepare_profile(selector: OperatorSelector, choice: ProfileChoice, adapter, device, dtype: torch.dtype,
                    observation: Optional[tuple] = None, settings: TuneSettings = TuneSettings(),
                    autotune: str = "auto", quant_plan: str = "measured", retune: bool = False,
                    cache: Optional[Path] = None) -> ProfileChoice:
    """What every tool that runs an adapter does before capturing graphs (the node, predict, the benches, a serve
    replica): autotune where ``autotune`` wants it and no profile matched (``retune``: a cached profile that lacks
    calls, extended) on ``observation`` (default: ``synthetic_observation`` of the adapter's cameras), with the
    quantized weights' dense copies measured alongside under ``quant_plan`` "measured"; then the quantized plan
    applied to the final profile. Returns the profile's choice (the tuned one, or ``choice``)."""
    weights = adapter.quantized_weights() if quant_plan == "measured" else []
    if wanted(autotune, device, selector) and (choice.origin == "none" or retune):
        plan_dense(weights, None, dtype)
        if observation is None:
            observation = synthetic_observation(adapter.camera_names, adapter.state_dim)
        choice = tune(selector, choice, adapter, observation, device, settings, cache=cache)
    apply_quant_plan(selector, choice.signature, weights, dtype)
    return choice
