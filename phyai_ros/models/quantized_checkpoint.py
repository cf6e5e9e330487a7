"""The quantized checkpoint folder every family writes (its ``quantize`` hook) and reads (its loader), and the
quantizer's vocabulary of model parts (design.md §6).

Folder: the source folder's files except its weights (config.json, statistics, processor files, ...), the
family's weights file (quantized weights as ``<name>.q`` / ``<name>.scale`` [/ ``<name>.act_scale``], everything
else as stored) and the manifest ``quantization.json``:

    {"format": "phyai_ros-quantized-1", "policy_type": <family>, "scheme": {...}, "parts": [...],
     "layers": [names quantized], "skipped": [names left in float], "dtype": "bfloat16",
     "source": {"path": ..., "model_sha256": ...}, "calibration": {...} | null, ...family fields}

Parts, one vocabulary for every family: ``vision`` (the image encoder), ``prefix`` (the language model the
observation runs through once), ``expert`` (what runs at every flow step). Kept in float whatever the parts:
embeddings, norms and modulation, projections between the parts (each family says which).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from phyai_ros.layers.quantized import QuantizedWeight, QuantScheme

from .files import CheckpointError, fixed_file, read_json

MANIFEST = "quantization.json"
FORMAT = "phyai_ros-quantized-1"
PARTS = ("vision", "prefix", "expert")
# Weight-only schemes: the expert (the bandwidth-bound loop; the prefix and vision are compute-bound, where
# dequantizing costs instead of saves); W8A8: everything (fp8 tensor cores for the compute-bound stages).
DEFAULT_PARTS = {"w8a16": ("expert",), "w8a8": PARTS, "w4a16": ("expert",)}


def check_parts(parts: Iterable[str]) -> Tuple[str, ...]:
    parts = tuple(dict.fromkeys(parts))
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ValueError(f"quantized parts must be a non-empty subset of {PARTS}, got {list(parts)}")
    return parts


def read_manifest(ckpt_dir) -> Optional[dict]:
    """The manifest of a quantized checkpoint folder, None for a float one; a manifest of another format or
    with an invalid scheme raises CheckpointError naming the file. ``scheme_obj``: the parsed QuantScheme."""
    path = fixed_file(ckpt_dir, MANIFEST)
    if not path.is_file():
        return None
    m = read_json(path)
    if m.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {m.get('format')!r}, expected {FORMAT!r}")
    try:
        m["scheme_obj"] = QuantScheme(**m["scheme"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: invalid quantization scheme ({exc})") from None
    if not isinstance(m.get("layers"), list) or not all(isinstance(n, str) for n in m["layers"]):
        raise CheckpointError(f"{path}: 'layers' must be a list of weight names")
    return m


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def copy_source_files(src: Path, out: Path, skip: Sequence[str]) -> None:
    """The source folder's files (not its weights: ``skip``) into the output folder, which must differ."""
    if out.resolve() == src.resolve():
        raise ValueError("the output folder must differ from the source checkpoint")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in tuple(skip) + (MANIFEST,):
            (out / f.name).unlink(missing_ok=True)   # a read-only copy from an earlier run
            shutil.copyfile(f, out / f.name)


def save_weights(state: Mapping, path: Path) -> None:
    """Write a safetensors file atomically (a crash leaves the old file or none, never half of one)."""
    from safetensors.torch import save_file
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_manifest(out: Path, src: Path, policy_type: str, scheme: QuantScheme, parts, layers, skipped, dtype: str,
                   calibration: Optional[dict] = None, **family_fields) -> None:
    weights = src / "model.safetensors"
    manifest = {"format": FORMAT, "policy_type": policy_type, "scheme": scheme.to_json(), "parts": list(parts),
                "layers": list(layers), "skipped": list(skipped), "dtype": dtype,
                "source": {"path": str(src.resolve()),
                           "model_sha256": file_sha256(weights) if weights.is_file() else None},
                "calibration": calibration, **family_fields}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))


def summary(weights: Mapping[str, object], part_of: Callable[[str], Optional[str]]) -> str:
    """One log line for the weights a model runs, e.g. 'quantization w8a16-int8: 72 weights (expert)', or
    'quantization none'; ``part_of``: the family's name -> part mapping."""
    found: Dict[str, QuantizedWeight] = {k: w for k, w in weights.items() if isinstance(w, QuantizedWeight)}
    if not found:
        return "quantization none"
    tags = sorted({w.scheme.tag for w in found.values()})
    parts = [p for p in PARTS if any(part_of(n) == p for n in found)]
    return f"quantization {', '.join(tags)}: {len(found)} weights ({', '.join(parts)})"


__all__ = ["MANIFEST", "FORMAT", "PARTS", "DEFAULT_PARTS", "check_parts", "read_manifest", "file_sha256",
           "copy_source_files", "save_weights", "write_manifest", "summary"]
