"""The offline case format (the parity fixtures' ``inputs.safetensors`` + ``inputs.json``): reading it, and the
checks every reader of it applies. One home for what ``predict``, each family's case runner and the quantizer's
calibration read.

Keys: ``raw.observation.images.<camera>`` uint8 [B, H, W, 3], ``raw.observation.state`` float32 [B, D], optional
``noise`` and the families' own (RTC's previous chunk, embodiment ids). ``inputs.json`` holds a ``tasks`` list
(one per batch item) and each family's case facts.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from .contract import PredictCase
from .files import read_json, read_safetensors_file

IMG_PREFIX = "raw.observation.images."
STATE_KEY = "raw.observation.state"


class InputError(Exception):
    """A bad argument or input: reported on one line (predict's exit status 2)."""


def require_range(name: str, value, lo, hi=None) -> None:
    """A finite value in [lo, hi] (NaN and +-inf never pass); None passes (not given)."""
    if value is None:
        return
    if not (math.isfinite(value) and lo <= value and (hi is None or value <= hi)):
        want = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise InputError(f"{name} must be a finite number {want}, got {value}")


def require_finite_tensor(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise InputError(f"{name} holds {int((~torch.isfinite(t)).sum())} NaN/Inf values of {t.numel()}")
    return t


def read_tasks(path, batch: int) -> Tuple[dict, List[str]]:
    """(inputs.json as a dict, its ``tasks`` list)."""
    meta = read_json(path)
    tasks = meta.get("tasks")
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        raise InputError(f"--tasks-json {path}: needs a 'tasks' list of strings (one per batch item, {batch} here)")
    return meta, tasks


def load_noise(arg: Optional[str], inputs: Dict[str, torch.Tensor]) -> Optional[torch.Tensor]:
    """--noise: a safetensors file (key 'noise' or its only key) or a key of the inputs; None: the inputs'
    'noise', if any."""
    if arg is None:
        return inputs.get("noise")
    path = Path(arg)
    if path.is_file():
        d = read_safetensors_file(path)
        if "noise" in d:
            return d["noise"]
        if len(d) == 1:
            return next(iter(d.values()))
        raise InputError(f"--noise {path}: no 'noise' key and more than one tensor ({sorted(d)})")
    if arg in inputs:
        return inputs[arg]
    raise InputError(f"--noise {arg!r} is neither a file nor a key of --inputs ({sorted(inputs)})")


def read_case(inputs_path, tasks_json: Optional[str] = None, task: Optional[str] = None, **flags) -> PredictCase:
    """The case in ``inputs_path`` with its tasks (``tasks_json``'s list, else ``task`` for every item); ``flags``:
    PredictCase's case name and RTC fields."""
    inputs = read_safetensors_file(inputs_path)
    if STATE_KEY not in inputs:
        raise InputError(f"--inputs {inputs_path} lacks {STATE_KEY}")
    state = inputs[STATE_KEY]
    images = {k[len(IMG_PREFIX):]: v for k, v in inputs.items() if k.startswith(IMG_PREFIX)}
    batch = state.shape[0] if state.dim() == 2 else 1
    meta, tasks = read_tasks(tasks_json, batch) if tasks_json else (None, [task] * batch)
    return PredictCase(inputs=inputs, images=images, state=state, tasks=tasks, meta=meta, source=str(inputs_path),
                       **flags)


__all__ = ["IMG_PREFIX", "STATE_KEY", "InputError", "require_range", "require_finite_tensor", "read_tasks",
           "load_noise", "read_case"]
