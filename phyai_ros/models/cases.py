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
from typing import Dict, Optional

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
    PredictCase's case name and RTC fields. Without a state key (a family that reads no robot state, whose case
    facts live elsewhere in the file) the state is empty and the batch 1; the family checks what it needs."""
    inputs = read_safetensors_file(inputs_path)
    state = inputs.get(STATE_KEY, torch.zeros(1, 0))
    images = {k[len(IMG_PREFIX):]: v for k, v in inputs.items() if k.startswith(IMG_PREFIX)}
    if not images and STATE_KEY not in inputs and not flags.get("case"):
        raise InputError(f"--inputs {inputs_path} holds neither {IMG_PREFIX}* nor {STATE_KEY} (nor is a --case "
                         "given whose facts the file holds)")
    batch = state.shape[0] if state.dim() == 2 else 1
    if tasks_json:
        meta = read_json(tasks_json)
        tasks = meta.get("tasks", [task] * batch if task else [])
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
            raise InputError(f"--tasks-json {tasks_json}: 'tasks' must be a list of strings (one per batch item)")
    else:
        meta, tasks = None, [task] * batch
    return PredictCase(inputs=inputs, images=images, state=state, tasks=tasks, meta=meta, source=str(inputs_path),
                       **flags)


__all__ = ["IMG_PREFIX", "STATE_KEY", "InputError", "require_range", "require_finite_tensor",
           "load_noise", "read_case"]
