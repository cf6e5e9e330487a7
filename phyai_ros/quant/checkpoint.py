"""The quantized checkpoint folder: what the quantizer writes and the pi-family loaders read.

Layout: the source folder's files except its weights (config.json, normalizer / norm_stats files, ...), a
``model_dims.json`` (sizes, so nothing has to be inferred from quantized shapes), ``model.safetensors`` holding
the model's own state dict (quantized weights as ``<name>.q`` / ``<name>.scale`` [/ ``<name>.act_scale``],
everything else under its module name, in the storage dtype), and ``quantization.json``, the manifest:

    {"format": "phyai_ros-quantized-1", "policy_type": "pi05", "scheme": {...}, "parts": [...],
     "layers": [names quantized], "skipped": [names left in float], "dtype": "bfloat16",
     "source": {"path": ..., "model_sha256": ...}, "calibration": {...} | null}

Why the model's own layout (not LeRobot's keys with scales added): the fused q/k/v and gate/up matrices are
quantized per output channel as stored, and loading is one ``load_state_dict`` that checks every key and shape.
A folder with a manifest is loaded by ``load_quantized_model``; the node and ``predict`` take it as any
checkpoint (``model.quantization`` is read from the manifest, not set by hand).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from phyai_ros.layers.quantized import QuantScheme
from phyai_ros.models.common.checkpoint_io import CheckpointError, read_json, read_safetensors_file

from .model import quantize_model

MANIFEST = "quantization.json"
FORMAT = "phyai_ros-quantized-1"
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def read_manifest(ckpt_dir) -> Optional[dict]:
    """The manifest of a quantized checkpoint folder, None for a float one; a manifest of another format or
    with an invalid scheme raises CheckpointError naming the file."""
    path = Path(ckpt_dir) / MANIFEST
    if not path.is_file():
        return None
    m = read_json(path)
    if m.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {m.get('format')!r}, expected {FORMAT!r}")
    try:
        m["scheme_obj"] = QuantScheme(**m["scheme"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: invalid quantization scheme ({exc})") from None
    return m


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def write_quantized_checkpoint(src_dir, out_dir, model: nn.Module, policy_type: str, scheme: QuantScheme,
                               parts, layers, skipped, calibration: Optional[dict] = None) -> Path:
    """Write the folder described above for a model already quantized in place (``quantize_model``)."""
    from safetensors.torch import save_file
    src, out = Path(src_dir), Path(out_dir)
    if out.resolve() == src.resolve():
        raise ValueError("the output folder must differ from the source checkpoint")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in _WEIGHT_FILES + (MANIFEST,):
            (out / f.name).unlink(missing_ok=True)   # a read-only copy from an earlier run
            shutil.copyfile(f, out / f.name)
    (out / "model_dims.json").write_text(json.dumps(model.cfg.to_model_dims(), indent=1))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = out / "model.safetensors.tmp"
    save_file(state, str(tmp))
    os.chmod(tmp, 0o644)
    os.replace(tmp, out / "model.safetensors")
    src_weights = src / "model.safetensors"
    manifest = {"format": FORMAT, "policy_type": policy_type, "scheme": scheme.to_json(), "parts": list(parts),
                "layers": list(layers), "skipped": list(skipped),
                "dtype": str(model.dtype).replace("torch.", ""),
                "source": {"path": str(src.resolve()),
                           "model_sha256": _sha256(src_weights) if src_weights.is_file() else None},
                "calibration": calibration}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return out


def _check_finite(sd, source) -> None:
    for k, t in sd.items():
        if t.is_floating_point() and not bool(torch.isfinite(t.float()).all()):
            raise CheckpointError(f"checkpoint {source}: tensor {k} holds non-finite values (NaN/Inf): this "
                                  "checkpoint produces non-finite actions")


@torch.no_grad()
def load_quantized_model(ckpt_dir, model: nn.Module, manifest: dict) -> nn.Module:
    """Fill ``model`` (built from the folder's model_dims.json in the asked dtype / device) from a quantized
    folder: the manifest's layers become QuantizedWeight modules, then every key and shape is checked."""
    quantize_model(model, manifest["scheme_obj"], names=manifest["layers"], fill=False)
    path = Path(ckpt_dir) / "model.safetensors"
    sd = read_safetensors_file(path)
    _check_finite(sd, ckpt_dir)
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{path} does not match the model its manifest describes: {exc}") from None
    return model.eval()
