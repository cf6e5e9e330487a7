"""pi0.5 checkpoint loading / writing in the LeRobot layout (config.json + model.safetensors).

Why: the adapter owns the mapping from LeRobot/openpi keys to our fused weights. Loading validates every
key and shape against the architecture and reports all problems at once (CheckpointError). Unused at
inference and therefore ignored if present: both lm_heads (`paligemma.lm_head`, `gemma_expert.lm_head`)
and the VLM's final norm (the prefix pass only produces K/V). fp32 or bf16 files; weights are converted to
the requested dtype. Local files only (no hub); a missing file raises FileNotFoundError naming the path.

Sizes: `dims` argument, else `model_dims.json` next to config.json, else in its parent directory (the parity
fixture layout), else inferred from tensor shapes (Gemma: 1 kv head; SigLIP heads known for So400m only).
Flow settings (chunk size, steps, token budget, periods) come from config.json when present.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch

from phyai_ros.models.pi.quantization import load_quantized_model
from phyai_ros.models.quantized_checkpoint import read_manifest
from phyai_ros.models.pi.checkpoint_io import gemma_key_shapes, load_gemma_layers
from phyai_ros.models.files import CheckpointError, read_json, require_finite, validate_keys
from phyai_ros.models.pi.lerobot_checkpoint import (IMAGE_PREFIX, find_model_dims, flow_overrides,
                                                        gemma_from_shapes, parse_features, prefix_dims_from_shapes,
                                                        random_state_dict, read_lerobot_checkpoint,
                                                        write_random_checkpoint)
from phyai_ros.models.pi.paligemma_keys import EXP, LM, PROJ, UNUSED_KEYS, VIS, load_paligemma, paligemma_key_shapes, unused_key_shapes

from .config import Pi05Config
from .modeling import Pi05Model

__all__ = ["CheckpointError", "Pi05Checkpoint", "load_pi05_checkpoint", "lerobot_key_shapes",
           "make_random_checkpoint", "make_random_model", "UNUSED_KEYS", "IMAGE_PREFIX", "LM", "EXP", "VIS", "PROJ"]


def lerobot_key_shapes(cfg: Pi05Config) -> Dict[str, tuple]:
    """Every key pi0.5 inference needs, with its shape, in the LeRobot layout."""
    x, a = cfg.expert, cfg.max_action_dim
    s = {"model.action_in_proj.weight": (x.width, a), "model.action_in_proj.bias": (x.width,),
         "model.action_out_proj.weight": (a, x.width), "model.action_out_proj.bias": (a,),
         "model.time_mlp_in.weight": (x.width, x.width), "model.time_mlp_in.bias": (x.width,),
         "model.time_mlp_out.weight": (x.width, x.width), "model.time_mlp_out.bias": (x.width,),
         EXP + "norm.dense.weight": (3 * x.width, x.width), EXP + "norm.dense.bias": (3 * x.width,)}
    s.update(paligemma_key_shapes(cfg.vlm, cfg.siglip, cfg.vocab_size))
    s.update(gemma_key_shapes(EXP, x, cond_dim=x.width))
    return s


def infer_config(sd: Dict[str, torch.Tensor]) -> Pi05Config:
    """Sizes from tensor shapes alone (assumes 1 kv head, So400m SigLIP heads)."""
    if "model.action_in_proj.weight" not in sd:
        raise CheckpointError("cannot infer model sizes: missing key model.action_in_proj.weight")
    return Pi05Config(**prefix_dims_from_shapes(sd), expert=gemma_from_shapes(sd, EXP),
                      max_action_dim=tuple(sd["model.action_in_proj.weight"].shape)[1])


def resolve_config(ckpt_dir: Path, sd: Dict[str, torch.Tensor], lr_config: dict,
                   dims: Union[None, str, Path, dict, Pi05Config] = None) -> Pi05Config:
    if isinstance(dims, Pi05Config):
        return dims
    source = "dims"
    if isinstance(dims, (str, Path)):
        dims, source = read_json(dims), dims
    if dims is None and (found := find_model_dims(ckpt_dir, "pi05")) is not None:
        dims, source = found
    cfg = Pi05Config.from_model_dims(dims, source) if dims is not None else infer_config(sd)
    return cfg.replace(**flow_overrides(lr_config, ckpt_dir / "config.json"))


@dataclass
class Pi05Checkpoint:
    """A loaded checkpoint: the model plus what config.json says about the robot interface."""
    model: Pi05Model
    config: Pi05Config
    camera_keys: List[str]            # VISUAL features in config order, without "observation.images."
    state_dim: Optional[int]
    action_dim: Optional[int]
    lerobot_config: dict = field(default_factory=dict)


def load_pi05_checkpoint(ckpt_dir, device="cpu", dtype: torch.dtype = torch.float32,
                         dims: Union[None, str, Path, dict, Pi05Config] = None) -> Pi05Checkpoint:
    """Load a LeRobot-layout pi0.5 checkpoint directory into a Pi05Model on `device` in `dtype`."""
    manifest = read_manifest(ckpt_dir)
    if manifest is not None:  # a quantized folder (phyai_ros/quant/checkpoint.py): sizes from its model_dims
        ckpt_dir, lr, _ = read_lerobot_checkpoint(ckpt_dir, "pi05", weights=False)
        cfg = resolve_config(ckpt_dir, {}, lr, dims)
        model = load_quantized_model(ckpt_dir, Pi05Model(cfg, dtype=dtype, device=device), manifest)
        cams, state_dim, action_dim = parse_features(lr, ckpt_dir / "config.json")
        return Pi05Checkpoint(model, cfg, cams, state_dim, action_dim, lr)
    ckpt_dir, lr, sd = read_lerobot_checkpoint(ckpt_dir, "pi05")
    cfg = resolve_config(ckpt_dir, sd, lr, dims)
    expected = lerobot_key_shapes(cfg)
    validate_keys(sd, expected, ignored=UNUSED_KEYS)
    require_finite(sd, expected, ckpt_dir)
    model = Pi05Model(cfg, dtype=dtype, device=device)
    load_state_dict(model, sd)
    cams, state_dim, action_dim = parse_features(lr, ckpt_dir / "config.json")
    return Pi05Checkpoint(model.eval(), cfg, cams, state_dim, action_dim, lr)


@torch.no_grad()
def load_state_dict(model: Pi05Model, sd: Dict[str, torch.Tensor]) -> None:
    """Copy (and fuse) LeRobot-layout tensors into the model; keys must have been validated."""
    pairs = {"action_in_w": "model.action_in_proj.weight", "action_in_b": "model.action_in_proj.bias",
             "action_out_w": "model.action_out_proj.weight", "action_out_b": "model.action_out_proj.bias",
             "time_in_w": "model.time_mlp_in.weight", "time_in_b": "model.time_mlp_in.bias",
             "time_out_w": "model.time_mlp_out.weight", "time_out_b": "model.time_mlp_out.bias",
             "final_norm_dense_w": EXP + "norm.dense.weight", "final_norm_dense_b": EXP + "norm.dense.bias"}
    for ours, theirs in pairs.items():
        getattr(model, ours).copy_(sd[theirs])
    load_paligemma(model, sd)
    load_gemma_layers(model.expert_layers, sd, EXP, adarms=True)


def make_random_model(config: Optional[Pi05Config] = None, seed: int = 0, std: float = 0.02,
                      dtype: torch.dtype = torch.float32, device="cpu") -> Pi05Model:
    """In-memory random-weight Pi05Model (the weights make_random_checkpoint writes for the same seed/std)."""
    cfg = config or Pi05Config()
    model = Pi05Model(cfg, dtype=dtype, device=device)
    shapes = {**lerobot_key_shapes(cfg), **unused_key_shapes(cfg)}
    load_state_dict(model, random_state_dict(shapes, seed, std, torch.float32))
    return model.eval()


def make_random_checkpoint(out_dir, config: Optional[Pi05Config] = None, seed: int = 0,
                           dtype: torch.dtype = torch.float32, std: float = 0.02,
                           camera_names: Sequence[str] = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
                           state_dim: int = 8, action_dim: int = 7, include_unused: bool = True) -> Dict[str, Path]:
    """Write a random-weight pi0.5 checkpoint in the LeRobot layout, loadable by `load_pi05_checkpoint`.

    Files: config.json, model.safetensors (every tensor i.i.d. N(0, std) in key order from one seeded
    generator; with include_unused also the lm_heads and VLM final norm), model_dims.json (sizes) and
    norm_stats.json (random q01 < q99 for state and action, fixture schema). Returns their paths.
    """
    cfg = config or Pi05Config()
    if action_dim > cfg.max_action_dim:
        raise ValueError(f"action_dim {action_dim} > max_action_dim {cfg.max_action_dim}")
    shapes = dict(lerobot_key_shapes(cfg))
    if include_unused:
        shapes.update(unused_key_shapes(cfg))

    def quantiles(rng, n):
        lo = -1.0 - rng.random(n)
        return {"q01": lo.astype(np.float32).tolist(), "q99": (lo + 2.0 + rng.random(n)).astype(np.float32).tolist()}
    return write_random_checkpoint(out_dir, "pi05", cfg, shapes, seed, std, dtype, camera_names, state_dim,
                                   action_dim, "QUANTILES", quantiles)
