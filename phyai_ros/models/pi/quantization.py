"""Quantized pi-family models: which linear weights each part holds, replacing them, the family's quantized
folder (phyai_ros/models/quantized_checkpoint.py's format, with the model's own state-dict layout) and the
calibration of static activation scales.

Parts: ``vision`` (SigLIP's qkv / out / fc1 / fc2), ``prefix`` (the PaliGemma LM layers' qkv / o / gate_up /
down), ``expert`` (the action expert's layers, same four). Kept in their float dtype: embeddings, norms and adaRMS
modulation layers, the multimodal projector, the action / state / time projections (small, read once per step or
once per observation, and where the action scale is set).

Why the model's own layout (not LeRobot's keys with scales added): the fused q/k/v and gate/up matrices are
quantized per output channel as stored, and loading is one ``load_state_dict`` that checks every key and shape;
``model_dims.json`` in the folder gives the sizes, so nothing is inferred from quantized shapes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from phyai_ros.layers.quantized import QuantizedWeight, QuantScheme, apply_calibration, calibrating
from phyai_ros.layers.selector import SELECTOR, OperatorSelector
from phyai_ros.models.files import CheckpointError, read_safetensors_file, require_finite
from phyai_ros.models.quantized_checkpoint import (PARTS, check_parts, copy_source_files, save_weights, summary,
                                                   write_manifest)

_GEMMA = ("qkv_w", "o_w", "gate_up_w", "down_w")
_SIGLIP = ("qkv_w", "o_w", "fc1_w", "fc2_w")
_PART_OF_MODULE = {"vision": "vision", "vlm_layers": "prefix", "expert_layers": "expert"}
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def linear_weights(model: nn.Module) -> Dict[str, List[Tuple[str, nn.Module, str]]]:
    """part -> [(qualified name, owning module, attribute)] of the quantizable weights, in model order."""
    found: Dict[str, List[Tuple[str, nn.Module, str]]] = {p: [] for p in PARTS}
    groups = (("vision", "vision.layers", model.vision.layers, _SIGLIP),
              ("prefix", "vlm_layers", model.vlm_layers, _GEMMA),
              ("expert", "expert_layers", model.expert_layers, _GEMMA))
    for part, path, layers, attrs in groups:
        for i, layer in enumerate(layers):
            found[part] += [(f"{path}.{i}.{a}", layer, a) for a in attrs]
    return found


@torch.no_grad()
def quantize_model(model: nn.Module, scheme: QuantScheme, parts: Sequence[str] = (), names: Sequence[str] = (),
                   fill: bool = True) -> Tuple[List[str], List[str]]:
    """Replace the weights of ``parts`` (or exactly ``names``) by QuantizedWeight modules, quantized from the
    current values (``fill``) or left empty for a state dict to be loaded into. Returns (quantized names,
    skipped names: weights whose K the scheme cannot store, e.g. int4 groups that do not tile K)."""
    table = linear_weights(model)
    wanted = set(names)
    chosen = [e for p in (check_parts(parts) if parts else PARTS) for e in table[p] if not wanted or e[0] in wanted]
    if wanted - {e[0] for e in chosen}:
        raise ValueError(f"not quantizable weights of this model: {sorted(wanted - {e[0] for e in chosen})[:5]}")
    done, skipped = [], []
    for name, owner, attr in chosen:
        w = getattr(owner, attr)
        if isinstance(w, QuantizedWeight):
            raise ValueError(f"{name} is already quantized ({w.scheme.tag})")
        if not scheme.fits(w.shape[1]):
            skipped.append(name)
            continue
        q = QuantizedWeight(scheme, w.shape[0], w.shape[1], w.device)
        if fill:
            q.quantize_(w)
        del owner._buffers[attr]
        owner.add_module(attr, q)
        done.append(name)
    return done, skipped


def part_of(name: str) -> Optional[str]:
    """The part a model weight's qualified name belongs to (None: kept in float)."""
    return _PART_OF_MODULE.get(name.split(".", 1)[0])


def quantization_summary(model: nn.Module) -> str:
    return summary(dict(model.named_modules()), part_of)


def write_quantized_checkpoint(src_dir, out_dir, model: nn.Module, policy_type: str, scheme: QuantScheme,
                               parts, layers, skipped, calibration: Optional[dict] = None) -> Path:
    """The folder (phyai_ros/models/quantized_checkpoint.py) for a model already quantized in place."""
    src, out = Path(src_dir), Path(out_dir)
    copy_source_files(src, out, _WEIGHT_FILES)
    (out / "model_dims.json").write_text(json.dumps(model.cfg.to_model_dims(), indent=1))
    save_weights(model.state_dict(), out / "model.safetensors")
    write_manifest(out, src, policy_type, scheme, parts, layers, skipped, str(model.dtype).replace("torch.", ""),
                   calibration)
    return out


@torch.no_grad()
def load_quantized_model(ckpt_dir, model: nn.Module, manifest: dict) -> nn.Module:
    """Fill ``model`` (built from the folder's model_dims.json in the asked dtype / device) from a quantized
    folder: the manifest's layers become QuantizedWeight modules, then every key and shape is checked."""
    quantize_model(model, manifest["scheme_obj"], names=manifest["layers"], fill=False)
    path = Path(ckpt_dir) / "model.safetensors"
    sd = read_safetensors_file(path)
    require_finite(sd, sd, ckpt_dir)
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{path} does not match the model its manifest describes: {exc}") from None
    return model.eval()


def calibrate(policy, case) -> dict:
    """Static activation scales: run ``policy`` (a pi-family adapter whose model holds static-scale weights) on
    every observation of ``case`` (phyai_ros/models/contract.py's PredictCase) with the scales being observed by
    the reference op, then set them."""
    reference = OperatorSelector(candidates=SELECTOR.candidates, forced="torch")  # the observing op runs
    images = {k: v.numpy() for k, v in case.images.items()}
    with reference.active(), calibrating() as seen:
        policy.predict_batch(images, case.state.numpy(), case.tasks)
    n = apply_calibration(seen)
    return {"inputs": case.source, "observations": case.batch, "layers_calibrated": n,
            "rule": "act_scale = max |x| over the calibration observations / 448"}


__all__ = ["linear_weights", "quantize_model", "part_of", "quantization_summary", "write_quantized_checkpoint",
           "load_quantized_model", "calibrate"]
