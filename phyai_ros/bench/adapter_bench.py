"""A checkpoint of any registered family benched through the adapter contract alone (phyai_ros/models/contract.py).

What the node and the serve engine call is what is timed, so a figure here is one a deployment sees, for every
family the registry knows (a plugin's too), with no family's internals in this file:

- start-up: ``load``, ``use_runner`` (CUDA graphs on a CUDA device), ``capture_buckets`` on the robot's frames,
  the first ``predict``;
- batch 1: ``predict`` from raw uint8 frames (``--images`` sizes) and a state to the chunk in robot units, as the
  node's policy bridge calls it, per ``--views`` count (cameras sending frames);
- batches: the serve engine's rows (``serve_prepare`` per request, one ``serve_sample`` per batch timed), for the
  families that batch requests (``serving == "batched"``); the others serve one request at a time.

The stages against their roofline floors, the references and the full-size weights are the family scripts' (see
full_size.py): they need each family's internals, which is what this bench leaves out.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from phyai_ros.layers.profiles import selector_for
from phyai_ros.models import family
from phyai_ros.models.contract import DTYPES
from phyai_ros.runtime.autotune import TuneSettings, prepare_profile, show_progress

from . import checkpoints
from .timing import peak_gib, reset_peak, sync, timed

TASK = "pick up the red block and place it in the blue bowl on the left side of the table"


@dataclass
class ContractOptions:
    model: str
    checkpoint: Optional[Path]          # None: the family's small random checkpoint, written under root
    root: Path
    device: str = "cpu"
    dtype: str = "float32"
    views: Optional[List[int]] = None   # cameras sending frames (None: all of the checkpoint's)
    images: List[Tuple[int, int]] = field(default_factory=lambda: [(480, 640)])
    batches: List[int] = field(default_factory=lambda: [1])
    iters: int = 10
    batch_iters: int = 5
    warmup: int = 3
    quant: Optional[str] = None
    options: Dict[str, str] = field(default_factory=dict)
    tokenizer: Optional[Path] = None
    op_autotune: str = "auto"           # the node's model.op_autotune (and its budget)
    op_autotune_budget: float = 30.0
    quant_plan: str = "measured"        # the node's model.quant_plan


def check(o: ContractOptions) -> None:
    """The options held to the family's class facts before anything is loaded (ValueError naming the fix)."""
    cls = family(o.model)
    if cls.serving != "batched" and any(b != 1 for b in o.batches):
        raise ValueError(f"--batches {','.join(map(str, o.batches))}: {o.model} serves one request at a time "
                         f"(serving '{cls.serving}'), so only batch 1 goes through its contract; its full-size "
                         "bench (no --small / --checkpoint) measures the runner's batches")
    cls.check_options(o.options)
    checkpoints.model_files(cls.needs_files, o.tokenizer)


def run(o: ContractOptions) -> dict:
    """Every measurement above, as the record's result."""
    check(o)
    cls = family(o.model)
    files = checkpoints.model_files(cls.needs_files, o.tokenizer)
    if o.device.startswith("cuda") and o.dtype == "float32":   # IEEE fp32, as predict and the tests mean it
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    o.root.mkdir(parents=True, exist_ok=True)
    selector, choice = selector_for(o.device)   # PHYAI_OP_PROFILE, else cached / shipped: as the node finds it
    with selector.active(), torch.no_grad():
        base = Path(o.checkpoint) if o.checkpoint else checkpoints.small(o.model, o.root)
        adapter, load_s = _load(cls, _maybe_quantized(base, o, files), o, files)
        show_progress()
        start = time.perf_counter()
        choice = prepare_profile(selector, choice, adapter, o.device, DTYPES[o.dtype],
                                 settings=TuneSettings(budget_s=o.op_autotune_budget), autotune=o.op_autotune,
                                 quant_plan=o.quant_plan)
        profile_s = time.perf_counter() - start
        cams = list(adapter.camera_names)
        views = o.views or [len(cams)]
        for n in views:
            if not 1 <= n <= len(cams):
                raise ValueError(f"--views {n}: the checkpoint has {len(cams)} camera(s) ({', '.join(cams)})")
        result = {"family": o.model, "checkpoint": str(base), "small_checkpoint": o.checkpoint is None,
                  "dtype": o.dtype, "device": o.device, "operator_profile": choice.describe(),
                  "operator_profile_origin": choice.origin, "autotune_s": round(profile_s, 2), "task": TASK,
                  "cameras": cams, "masks_cameras": cls.masks_cameras, "serving": cls.serving,
                  "state_dim": adapter.state_dim, "action_dim": adapter.action_dim, "chunk_size": adapter.chunk_size,
                  "quantization": adapter.quantization(), "runs": []}
        for group_views, group_adapter, group_load_s in _groups(cls, adapter, load_s, views, cams, o, files):
            result["runs"] += _bench_group(group_adapter, group_load_s, group_views, o)
            group_adapter.release()
            del group_adapter
            if torch.device(o.device).type == "cuda":
                torch.cuda.empty_cache()
    return result


def _maybe_quantized(ck: Path, o: ContractOptions, files) -> Path:
    if not o.quant:
        return ck
    label = ck.parent.name if ck.name == "checkpoint" else ck.name   # GR00T's folder is <root>/checkpoint
    return checkpoints.quantized(ck, o.quant, o.root / f"{label}-{o.quant}", o.device, o.dtype, files)


def _load(cls, ck: Path, o: ContractOptions, files, cameras: Optional[Sequence[str]] = None):
    start = time.perf_counter()
    adapter = cls.load(ck, files, camera_names=cameras, device=o.device, dtype=DTYPES[o.dtype], options=o.options)
    sync(o.device)
    return adapter, time.perf_counter() - start


def _groups(cls, adapter, load_s: float, views: List[int], cams: List[str], o: ContractOptions, files):
    """(views, adapter, load seconds) per checkpoint: one for a family that masks absent cameras (frames of the
    first n cameras, the rest absent); one per view count for a family that takes every camera of its checkpoint
    (a small checkpoint of the first n cameras; a given checkpoint has the cameras it has)."""
    full = [n for n in views if n == len(cams)]
    if cls.masks_cameras or len(full) == len(views):
        yield views, adapter, load_s
        return
    if full:
        yield full, adapter, load_s
    else:
        adapter.release()
    if o.checkpoint is not None:
        raise ValueError(f"--views {','.join(map(str, views))}: {o.model} takes every camera of its checkpoint "
                         f"({len(cams)}); a checkpoint with fewer views is another checkpoint (--checkpoint DIR)")
    for n in (n for n in views if n != len(cams)):
        ck = _maybe_quantized(checkpoints.small(o.model, o.root, cams[:n]), o, files)
        yield [n], *_load(cls, ck, o, files)


def _frames(rng, cams: Sequence[str], hw: Tuple[int, int]) -> Dict[str, np.ndarray]:
    return {c: rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for c in cams}


def _bench_group(adapter, load_s: float, views: List[int], o: ContractOptions) -> List[dict]:
    rng = np.random.default_rng(0)
    cams = list(adapter.camera_names)
    state = rng.standard_normal(adapter.state_dim).astype(np.float32)
    runner = adapter.use_runner(use_graphs=torch.device(o.device).type == "cuda")
    start = time.perf_counter()
    buckets = adapter.capture_buckets(_frames(rng, cams, o.images[0]), state,
                                      min_cameras=min(views) if adapter.masks_cameras else None)
    sync(o.device)
    capture_s = time.perf_counter() - start
    start = time.perf_counter()
    adapter.predict(_frames(rng, cams[:views[0]], o.images[0]), state, TASK)
    startup = {"load_s": load_s, "capture_s": capture_s, "buckets": len(buckets),
               "first_chunk_s": time.perf_counter() - start, "graphs": bool(getattr(runner, "use_graphs", False))}
    runs = []
    for n in views:
        for hw in o.images:
            frames = _frames(rng, cams[:n], hw)   # the cameras after the first n send nothing (absent)
            reset_peak(o.device)
            chunk = adapter.predict(frames, state, TASK)
            run = {"views": n, "cameras_sent": cams[:n], "image": f"{hw[0]}x{hw[1]}", "startup": startup,
                   "chunk_shape": list(np.shape(chunk)), "finite": bool(np.isfinite(chunk).all()),
                   "batch1": {"what": "predict: raw uint8 frames + state -> chunk in robot units (host clock)",
                              **timed(lambda: adapter.predict(frames, state, TASK), o.iters, o.warmup, o.device)},
                   "batching": {}}
            for b in (b for b in o.batches if adapter.serving == "batched"):
                run["batching"][str(b)] = _batch(adapter, frames, state, b, o)
            run["peak_mem_gib"] = peak_gib(o.device)
            runs.append(run)
            _print_run(o.model, run)
    return runs


def _batch(adapter, frames, state, b: int, o: ContractOptions) -> dict:
    """One runner call for ``b`` served rows (each request prepared alone, as the serve engine does)."""
    rows = [adapter.serve_prepare(frames, state, TASK, seed, None) for seed in range(b)]
    t = timed(lambda: adapter.serve_sample(rows), o.batch_iters, min(o.warmup, 2), o.device)
    return {"T_sync_ms": t["median_ms"], "T_sync_p99_ms": t["p99_ms"], "Q_per_s": 1e3 * b / t["median_ms"],
            "T_amort_ms": t["median_ms"] / b, "runs": t["runs"]}


def _print_run(model: str, run: dict) -> None:
    s, b1 = run["startup"], run["batch1"]
    print(f"{model}: {run['views']} view(s) at {run['image']}: batch 1 median {b1['median_ms']:.2f} ms, p99 "
          f"{b1['p99_ms']:.2f} ({b1['runs']} runs); load {s['load_s']:.2f} s, capture {s['capture_s']:.2f} s "
          f"({s['buckets']} buckets), first chunk {s['first_chunk_s']:.3f} s; chunk {run['chunk_shape']}"
          f"{'' if run['finite'] else ' NOT FINITE'}", flush=True)
    for b, r in run["batching"].items():
        print(f"  batch {b:>3}: T_sync {r['T_sync_ms']:.2f} ms, Q {r['Q_per_s']:.1f} chunks/s, "
              f"T_amort {r['T_amort_ms']:.2f} ms", flush=True)


__all__ = ["ContractOptions", "check", "run", "TASK"]
