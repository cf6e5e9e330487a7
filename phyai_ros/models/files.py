"""Reading a checkpoint's files, shared by every family's loader: JSON and safetensors with clear errors,
key / shape validation against an architecture, and non-finite weights refused at load time.

Why: a checkpoint that does not fit the architecture must fail loudly at load time, naming the file and what is
wrong, never silently run with uninitialized or misplaced weights. No hub access: paths are local files only.
A checkpoint is data from outside: the files it names must lie inside its folder (``inside``), and the values
of its configs are type- and range-checked where they are read (``Fields``), one error naming the file and key.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

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


def inside(folder, name, what: str, source) -> Path:
    """``name``, a relative path read from ``source``, resolved inside ``folder``: an absolute path, '..' or a
    symlink leading out of it is refused, with one error whether the file outside exists or not (so a checkpoint
    can neither read nor probe files elsewhere)."""
    if not isinstance(name, str) or not name.strip():
        raise CheckpointError(f"{source}: {what} must be a non-empty relative path, got {name!r}")
    root = Path(folder).resolve()
    path = (root / name).resolve()   # follows symlinks; a missing file resolves as far as its folders exist
    if path != root and root not in path.parents:
        raise CheckpointError(f"{source}: {what} {name!r} is not inside the checkpoint folder {folder}")
    return path


def fixed_file(folder, name: str) -> Path:
    """``folder / name``, a file the format names (config.json, model.safetensors, tokenizer.json): like a name read
    from a file (``inside``), a symlink leading out of ``folder`` is refused, with one error whether its target
    exists or not, before anything looks at it (an optional file's absence would tell too). Returns the path as
    named (errors keep naming it)."""
    inside(folder, name, "file", folder)
    return Path(folder) / name


def read_safetensors(ckpt_dir) -> Dict[str, torch.Tensor]:
    """model.safetensors (or the shards model.safetensors.index.json names, each resolved inside the folder: a
    Hugging Face cache snapshot, whose files link to ../../blobs, is copied out first) of a checkpoint dir, on CPU."""
    d = require_file(ckpt_dir)
    single, index = fixed_file(d, "model.safetensors"), fixed_file(d, "model.safetensors.index.json")
    if single.is_file():
        return read_safetensors_file(single)
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map' object")
        shards = [inside(d, s, f"weight_map shard of {k!r}", index) for k, s in weight_map.items()]
        sd: Dict[str, torch.Tensor] = {}
        for s in sorted(set(shards)):
            sd.update(read_safetensors_file(s))
        return sd
    raise FileNotFoundError(f"file not found: {single}")


_REQUIRED = object()
_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
          dict: "an object"}


class Fields:
    """Typed reading of one JSON config (or a section of it): each value checked for its type and range where it is
    read, a wrong one a CheckpointError naming the file and the key (``tokenizer_max_length: 1e8``, ``chunk_size:
    "50"``, an int where a path belongs), never a failure deep inside the model."""

    def __init__(self, data, source, prefix: str = ""):
        if not isinstance(data, dict):
            raise CheckpointError(f"{source}: {prefix.rstrip('.') or 'the file'} must be an object, got "
                                  f"{type(data).__name__}")
        self.data, self.source, self.prefix = data, source, prefix

    def __contains__(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _fail(self, key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{self.source}: {self.prefix}{key} {why}")

    def get(self, key: str, kind: type, lo: Optional[float] = None, hi: Optional[float] = None,
            default: Any = _REQUIRED) -> Any:
        """``data[key]`` of type ``kind`` (int: a JSON integer, not a bool; float: any finite JSON number) within
        [lo, hi]; ``default`` when it is missing or null (no default: required)."""
        value = self.data.get(key)
        if value is None:
            if default is _REQUIRED:
                raise self._fail(key, "is missing")
            return default
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise self._fail(key, f"must be {_KINDS.get(kind, kind.__name__)}, got {value!r}"[:300])
        if kind is float and not math.isfinite(value):
            raise self._fail(key, f"must be finite, got {value!r}")
        if lo is not None and value < lo or hi is not None and value > hi:
            raise self._fail(key, f"= {value!r} is outside [{lo:g}, {hi:g}]")
        return value

    def ints(self, key: str, lo: int, hi: int, length: Optional[int] = None, default: Any = _REQUIRED) -> tuple:
        """A list of integers in [lo, hi] (of ``length`` when given)."""
        values = self.get(key, list, default=default)
        if values is default and default is not _REQUIRED:
            return default
        if length is not None and len(values) != length or \
                not all(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi for v in values):
            raise self._fail(key, f"must be a list of {length or ''} integers in [{lo}, {hi}], got {values!r}"[:300])
        return tuple(values)

    def section(self, key: str, default: Any = _REQUIRED) -> "Fields":
        """The object under ``key`` as Fields (missing with a default: that default's fields)."""
        value = self.data.get(key)
        if value is None and default is not _REQUIRED:
            value = default
        elif value is None:
            raise self._fail(key, "is missing")
        return Fields(value, self.source, f"{self.prefix}{key}.")


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


__all__ = ["CheckpointError", "Shapes", "Fields", "inside", "fixed_file", "require_file", "read_json", "read_safetensors_file",
           "read_safetensors", "require_finite", "validate_keys"]
