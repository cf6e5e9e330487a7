"""GR00T N1.7's quantized checkpoint: which of its weights are quantized, its folder, and reading it back.

GR00T holds its weights in one dict under LeRobot's key names (phyai_ros/models/groot_n17), so a quantized
weight simply takes a key's place; the adapter fuses q/k/v and gate/up at load as for float ones (row-wise
concatenation, exact for per-row scales). Parts, in the project's one vocabulary: ``vision`` (Qwen3-VL's vision
blocks and mergers), ``prefix`` (the LLM layers the features come from), ``expert`` (the action head: the DiT
and the VL self-attention blocks). Kept in float: embeddings, the patch embedding, norms and the DiT's adaLN
modulation, the timestep encoder, the category-specific state / action encoders and decoders, proj_out.

Folder: the source checkpoint's files (config.json, the processor pipelines and their state) beside a
``model.safetensors`` of the float weights and the quantized ones as ``<key>.q`` / ``<key>.scale``, and the
manifest ``quantization.json`` (phyai_ros/models/quantized_checkpoint.py's format) naming, besides the layers,
the base-model and backbone folders the source resolved to, since relative paths from the source no longer hold.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from phyai_ros.layers.quantized import QuantizedWeight, QuantScheme
from phyai_ros.models.files import CheckpointError
from phyai_ros.models.quantized_checkpoint import (check_parts, copy_source_files, save_weights, summary,
                                                   write_manifest)

from . import action_head, qwen3vl
from .config import GrootConfig
from .keys import DIT, LLM, VIS, VLSA

_LLM_LAYERS = LLM + "layers."
_HEAD_BLOCKS = (DIT + "transformer_blocks.", VLSA)
_LLM_LINEARS = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                "up_proj.weight", "down_proj.weight")
_HEAD_LINEARS = ("attn1.to_q.weight", "attn1.to_k.weight", "attn1.to_v.weight", "attn1.to_out.0.weight",
                 "ff.net.0.proj.weight", "ff.net.2.weight")


def part_of(key: str) -> Optional[str]:
    """The part a quantizable GR00T weight belongs to, or None for what stays in float."""
    if key.startswith(VIS) and key.endswith(".weight") and (
            ".attn.qkv." in key or ".attn.proj." in key or ".linear_fc" in key):
        return "vision"
    if key.startswith(_LLM_LAYERS) and key.endswith(_LLM_LINEARS):
        return "prefix"
    if key.startswith(_HEAD_BLOCKS) and key.endswith(_HEAD_LINEARS):
        return "expert"
    return None


@torch.no_grad()
def quantize_weights(weights: Dict[str, torch.Tensor], config: GrootConfig, scheme: QuantScheme,
                     parts: Sequence[str]) -> Tuple[List[str], List[str]]:
    """In place: the weights of ``parts`` become QuantizedWeight (before the adapter fuses them; ``config`` is the
    checkpoint's GrootConfig, to check that fusion). Returns (quantized keys, skipped keys: K the scheme cannot
    store)."""
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
    src, out = Path(ckpt.ckpt_dir), Path(out_dir)
    copy_source_files(src, out, ("model.safetensors", "model.safetensors.index.json"))
    state = {}
    for key, w in ckpt.weights.items():
        if isinstance(w, QuantizedWeight):
            state.update({f"{key}.{n}": t for n, t in w.state_dict().items()})
        else:
            state[key] = w
    save_weights(state, out / "model.safetensors")
    write_manifest(out, src, "groot_n17", scheme, parts, layers, skipped,
                   str(next(iter(ckpt.weights.values())).dtype).replace("torch.", ""),
                   base_model=str(Path(ckpt.base_dir).resolve()), backbone=str(Path(ckpt.backbone_dir).resolve()))
    return out


def quantization_summary(weights: Dict[str, object]) -> str:
    return summary(weights, part_of)


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


__all__ = ["part_of", "quantize_weights", "write_quantized_groot", "quantized_state", "quantization_summary"]
