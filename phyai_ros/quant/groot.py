"""GR00T N1.7's quantized checkpoint: which of its weights are quantized, and its folder.

GR00T holds its weights in one dict under LeRobot's key names (phyai_ros/models/groot_n17), so a quantized
weight simply takes a key's place; the adapter fuses q/k/v and gate/up at load as for float ones (row-wise
concatenation, exact for per-row scales). Parts, in the project's one vocabulary: ``vision`` (Qwen3-VL's vision
blocks and mergers), ``prefix`` (the LLM layers the features come from), ``expert`` (the action head: the DiT
and the VL self-attention blocks). Kept in float: embeddings, the patch embedding, norms and the DiT's adaLN
modulation, the timestep encoder, the category-specific state / action encoders and decoders, proj_out.

Folder: the source checkpoint's files (config.json, the processor pipelines and their state) beside a
``model.safetensors`` of the float weights and the quantized ones as ``<key>.q`` / ``<key>.scale``, and the
manifest ``quantization.json`` (phyai_ros/quant/checkpoint.py's format) naming, besides the layers, the base-model
and backbone folders the source resolved to, since relative paths from the source no longer hold.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch

from phyai_ros.layers.quantized import QuantizedWeight, QuantScheme
from phyai_ros.models.common.checkpoint_io import CheckpointError

from .checkpoint import FORMAT, MANIFEST, _sha256
from .model import PARTS, check_parts

_VIS = "backbone.model.model.visual."
_LLM = "backbone.model.model.language_model.layers."
_HEAD = ("action_head.model.transformer_blocks.", "action_head.vl_self_attention.transformer_blocks.")
_LLM_LINEARS = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                "up_proj.weight", "down_proj.weight")
_HEAD_LINEARS = ("attn1.to_q.weight", "attn1.to_k.weight", "attn1.to_v.weight", "attn1.to_out.0.weight",
                 "ff.net.0.proj.weight", "ff.net.2.weight")


def part_of(key: str) -> str | None:
    """The part a quantizable GR00T weight belongs to, or None for what stays in float."""
    if key.startswith(_VIS) and key.endswith(".weight") and (
            ".attn.qkv." in key or ".attn.proj." in key or ".linear_fc" in key):
        return "vision"
    if key.startswith(_LLM) and key.endswith(_LLM_LINEARS):
        return "prefix"
    if key.startswith(_HEAD) and key.endswith(_HEAD_LINEARS):
        return "expert"
    return None


@torch.no_grad()
def quantize_weights(weights: Dict[str, torch.Tensor], config, scheme: QuantScheme, parts: Sequence[str]
                     ) -> Tuple[List[str], List[str]]:
    """In place: the weights of ``parts`` become QuantizedWeight (before the adapter fuses them; ``config`` is the
    checkpoint's GrootConfig, to check that fusion). Returns (quantized keys, skipped keys: K the scheme cannot
    store)."""
    from phyai_ros.models.groot_n17 import action_head, qwen3vl
    parts = check_parts(parts)
    if scheme.activations == "static":
        raise ValueError("static activation scales are not calibrated for GR00T N1.7 yet: use --activations dynamic")
    done, skipped = [], []
    for key in sorted(weights):
        if part_of(key) not in parts:
            continue
        w = weights[key]
        if not scheme.fits(w.shape[1]):
            skipped.append(key)
            continue
        weights[key] = QuantizedWeight.from_float(w, scheme)
        done.append(key)
    trial = dict(weights)   # the adapter's fusion, on a copy: a fused group must not mix quantized and float
    qwen3vl.fuse_projections(trial, config.text)
    action_head.fuse_projections(trial, config.head)
    return done, skipped


def write_quantized_groot(ckpt, out_dir, scheme: QuantScheme, parts, layers, skipped) -> Path:
    """Write the folder for a GrootCheckpoint whose ``weights`` were quantized in place (``quantize_weights``)."""
    from safetensors.torch import save_file
    src, out = Path(ckpt.ckpt_dir), Path(out_dir)
    if out.resolve() == src.resolve():
        raise ValueError("the output folder must differ from the source checkpoint")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "model.safetensors.index.json", MANIFEST):
            (out / f.name).unlink(missing_ok=True)
            shutil.copyfile(f, out / f.name)
    state = {}
    for key, w in ckpt.weights.items():
        if isinstance(w, QuantizedWeight):
            state.update({f"{key}.{n}": t.detach().contiguous().cpu() for n, t in w.state_dict().items()})
        else:
            state[key] = w.detach().contiguous().cpu()
    tmp = out / "model.safetensors.tmp"
    save_file(state, str(tmp))
    os.chmod(tmp, 0o644)
    os.replace(tmp, out / "model.safetensors")
    weights_file = src / "model.safetensors"
    manifest = {"format": FORMAT, "policy_type": "groot_n17", "scheme": scheme.to_json(), "parts": list(parts),
                "layers": list(layers), "skipped": list(skipped),
                "dtype": str(next(iter(ckpt.weights.values())).dtype).replace("torch.", ""),
                "source": {"path": str(src.resolve()),
                           "model_sha256": _sha256(weights_file) if weights_file.is_file() else None},
                "base_model": str(Path(ckpt.base_dir).resolve()), "backbone": str(Path(ckpt.backbone_dir).resolve()),
                "calibration": None}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return out


def quantized_state(sd: Dict[str, torch.Tensor], manifest: dict, source) -> Dict[str, object]:
    """A quantized folder's tensors -> the weight dict the loader checks: each manifest layer rebuilt as a
    QuantizedWeight under its key."""
    scheme = manifest["scheme_obj"]
    out = dict(sd)
    for key in manifest["layers"]:
        try:
            q, scale = out.pop(key + ".q"), out.pop(key + ".scale")
        except KeyError:
            raise CheckpointError(f"{source}: quantized layer {key} has no {key}.q / {key}.scale") from None
        try:
            out[key] = QuantizedWeight.from_tensors(scheme, q, scale, out.pop(key + ".act_scale", None))
        except (RuntimeError, ValueError) as exc:
            raise CheckpointError(f"{source}: quantized layer {key} does not match {scheme.tag}: {exc}") from None
    return out


__all__ = ["PARTS", "part_of", "quantize_weights", "write_quantized_groot", "quantized_state"]
