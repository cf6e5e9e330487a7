"""Reading a checkpoint's files, shared by every family's loader: JSON and safetensors with clear errors,
key / shape validation against an architecture, and non-finite weights refused at load time.

Why: a checkpoint that does not fit the architecture must fail loudly at load time, naming the file and what is
wrong, never silently run with uninitialized or misplaced weights. No hub access: paths are local files only.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, Mapping, Tuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

Shapes = Dict[str, Tuple[int, ...]]


class CheckpointError(ValueError):
    """The checkpoint's keys or shapes do not match the architecture."""


def require_file(path) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"file not found: {p}")
    return p


def read_json(path) -> dict:
    """A JSON object from a file; a file that is not one names itself (a bare JSONDecodeError does not)."""
    p = require_file(path)
    try:
        data = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{p}: expected a JSON object, got a {type(data).__name__}")
    return data


def read_safetensors_file(path) -> Dict[str, torch.Tensor]:
    """One .safetensors file on CPU; a truncated or corrupt one names itself (safetensors' own error does not)."""
    p = require_file(path)
    try:
        return load_file(str(p))
    except SafetensorError as exc:
        raise CheckpointError(f"{p}: unreadable safetensors file, truncated or corrupt ({exc})") from None


def read_safetensors(ckpt_dir) -> Dict[str, torch.Tensor]:
    """model.safetensors (or the shards of model.safetensors.index.json) of a checkpoint dir, on CPU."""
    d = require_file(ckpt_dir)
    single, index = d / "model.safetensors", d / "model.safetensors.index.json"
    if single.is_file():
        return read_safetensors_file(single)
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map' object")
        sd: Dict[str, torch.Tensor] = {}
        for s in sorted(set(weight_map.values())):
            sd.update(read_safetensors_file(d / s))
        return sd
    raise FileNotFoundError(f"file not found: {single}")


def require_finite(sd: Mapping[str, torch.Tensor], keys: Iterable[str], source) -> None:
    """Refuse weights holding NaN/Inf at load time, naming the first such tensor: such a checkpoint
    produces only non-finite actions, which the control loop would drop forever after a 'ready'."""
    for k in keys:
        t = sd[k]
        # One float32 sum per tensor (no tensor-sized mask): NaN/Inf always survive a sum, and a finite
        # sum overflowing float32 would take weights no checkpoint has.
        if t.is_floating_point() and not bool(torch.isfinite(t.sum(dtype=torch.float32))):
            raise CheckpointError(f"checkpoint {source}: tensor {k} holds non-finite values (NaN/Inf): this checkpoint "
                                  "produces non-finite actions")


def validate_keys(sd: Mapping[str, torch.Tensor], expected: Shapes, ignored: Iterable[str] = ()) -> None:
    """Raise CheckpointError listing missing keys, unexpected keys and shape mismatches (all at once).
    Keys in `ignored` may be present or absent and are not checked."""
    ignored = set(ignored)
    missing = sorted(k for k in expected if k not in sd)
    unexpected = sorted(k for k in sd if k not in expected and k not in ignored)
    mismatched = sorted(f"{k}: checkpoint {tuple(sd[k].shape)}, model {tuple(s)}"
                        for k, s in expected.items() if k in sd and tuple(sd[k].shape) != tuple(s))
    if not (missing or unexpected or mismatched):
        return
    parts = []
    for title, items in (("missing keys", missing), ("unexpected keys", unexpected),
                         ("shape mismatches", mismatched)):
        if items:
            shown = items[:20] + ([f"... ({len(items) - 20} more)"] if len(items) > 20 else [])
            parts.append(f"{title} ({len(items)}):\n  " + "\n  ".join(shown))
    raise CheckpointError("checkpoint does not match the model architecture:\n" + "\n".join(parts))


__all__ = ["CheckpointError", "Shapes", "require_file", "read_json", "read_safetensors_file", "read_safetensors",
           "require_finite", "validate_keys"]
