"""pi0 checkpoint loading / writing in the LeRobot layout (see pi05/checkpoint.py for the rules: all keys and
shapes validated at once, lm_heads and the VLM final norm ignored, fp32/bf16, local files only).

pi0-specific keys: state_proj, action_time_mlp_in (split at load into action / time halves),
action_time_mlp_out, and a plain RMSNorm expert with final norm weight `gemma_expert.model.norm.weight`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from phyai_ros.models.pi.quantization import load_quantized_model
from phyai_ros.models.quantized_checkpoint import read_manifest
from phyai_ros.models.pi.checkpoint_io import gemma_key_shapes, load_gemma_layers
from phyai_ros.models.files import CheckpointError, read_json, require_finite, validate_keys
from phyai_ros.models.pi.lerobot_checkpoint import (find_model_dims, flow_overrides, gemma_from_shapes,
                                                        parse_features, prefix_dims_from_shapes,
                                                        read_lerobot_checkpoint, write_random_checkpoint)
from phyai_ros.models.pi.paligemma_keys import EXP, UNUSED_KEYS, load_paligemma, paligemma_key_shapes, unused_key_shapes

from .config import Pi0Config
from .modeling import Pi0Model

__all__ = ["CheckpointError", "Pi0Checkpoint", "load_pi0_checkpoint", "lerobot_key_shapes",
           "make_random_checkpoint"]


def lerobot_key_shapes(cfg: Pi0Config) -> Dict[str, tuple]:
    w, a = cfg.expert.width, cfg.max_action_dim
    s = {"model.action_in_proj.weight": (w, a), "model.action_in_proj.bias": (w,),
         "model.action_out_proj.weight": (a, w), "model.action_out_proj.bias": (a,),
         "model.state_proj.weight": (w, cfg.max_state_dim), "model.state_proj.bias": (w,),
         "model.action_time_mlp_in.weight": (w, 2 * w), "model.action_time_mlp_in.bias": (w,),
         "model.action_time_mlp_out.weight": (w, w), "model.action_time_mlp_out.bias": (w,),
         EXP + "norm.weight": (w,)}
    s.update(paligemma_key_shapes(cfg.vlm, cfg.siglip, cfg.vocab_size))
    s.update(gemma_key_shapes(EXP, cfg.expert))
    return s


def resolve_config(ckpt_dir: Path, sd, lr: dict, dims=None) -> Pi0Config:
    if isinstance(dims, Pi0Config):
        return dims
    source = "dims"
    if isinstance(dims, (str, Path)):
        dims, source = read_json(dims), dims
    if dims is None and (found := find_model_dims(ckpt_dir, "pi0")) is not None:
        dims, source = found
    if dims is not None:
        cfg = Pi0Config.from_model_dims(dims, source)
    else:
        if "model.action_in_proj.weight" not in sd or "model.state_proj.weight" not in sd:
            raise CheckpointError("cannot infer model sizes: missing model.action_in_proj / model.state_proj")
        cfg = Pi0Config(**prefix_dims_from_shapes(sd), expert=gemma_from_shapes(sd, EXP),
                        max_action_dim=tuple(sd["model.action_in_proj.weight"].shape)[1],
                        max_state_dim=tuple(sd["model.state_proj.weight"].shape)[1])
    return cfg.replace(**flow_overrides(lr, ckpt_dir / "config.json"))


@dataclass
class Pi0Checkpoint:
    model: Pi0Model
    config: Pi0Config
    camera_keys: List[str]
    state_dim: Optional[int]
    action_dim: Optional[int]
    lerobot_config: dict = field(default_factory=dict)


def load_pi0_checkpoint(ckpt_dir, device="cpu", dtype: torch.dtype = torch.float32, dims=None) -> Pi0Checkpoint:
    manifest = read_manifest(ckpt_dir)
    if manifest is not None:  # a quantized folder (phyai_ros/quant/checkpoint.py): sizes from its model_dims
        ckpt_dir, lr, _ = read_lerobot_checkpoint(ckpt_dir, "pi0", weights=False)
        cfg = resolve_config(ckpt_dir, {}, lr, dims)
        model = load_quantized_model(ckpt_dir, Pi0Model(cfg, dtype=dtype, device=device), manifest)
        cams, state_dim, action_dim = parse_features(lr, ckpt_dir / "config.json")
        return Pi0Checkpoint(model, cfg, cams, state_dim, action_dim, lr)
    ckpt_dir, lr, sd = read_lerobot_checkpoint(ckpt_dir, "pi0")
    cfg = resolve_config(ckpt_dir, sd, lr, dims)
    expected = lerobot_key_shapes(cfg)
    validate_keys(sd, expected, ignored=UNUSED_KEYS)
    require_finite(sd, expected, ckpt_dir)
    model = Pi0Model(cfg, dtype=dtype, device=device)
    load_state_dict(model, sd)
    cams, state_dim, action_dim = parse_features(lr, ckpt_dir / "config.json")
    return Pi0Checkpoint(model.eval(), cfg, cams, state_dim, action_dim, lr)


@torch.no_grad()
def load_state_dict(model: Pi0Model, sd: Dict[str, torch.Tensor]) -> None:
    w = model.cfg.expert.width
    pairs = {"action_in_w": "model.action_in_proj.weight", "action_in_b": "model.action_in_proj.bias",
             "action_out_w": "model.action_out_proj.weight", "action_out_b": "model.action_out_proj.bias",
             "state_w": "model.state_proj.weight", "state_b": "model.state_proj.bias",
             "atm_in_b": "model.action_time_mlp_in.bias", "atm_out_w": "model.action_time_mlp_out.weight",
             "atm_out_b": "model.action_time_mlp_out.bias", "final_norm_w": EXP + "norm.weight"}
    for ours, theirs in pairs.items():
        getattr(model, ours).copy_(sd[theirs])
    atm_in = sd["model.action_time_mlp_in.weight"]  # input = cat([action_emb, time_emb])
    model.atm_in_action_w.copy_(atm_in[:, :w])
    model.atm_in_time_w.copy_(atm_in[:, w:])
    load_paligemma(model, sd)
    load_gemma_layers(model.expert_layers, sd, EXP, adarms=False)


def make_random_checkpoint(out_dir, config: Optional[Pi0Config] = None, seed: int = 0,
                           dtype: torch.dtype = torch.float32, std: float = 0.02,
                           camera_names: Sequence[str] = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
                           state_dim: int = 8, action_dim: int = 7, include_unused: bool = True) -> Dict[str, Path]:
    """Random-weight pi0 checkpoint (config.json, model.safetensors, model_dims.json, norm_stats.json with
    mean/std), loadable by `load_pi0_checkpoint`."""
    cfg = config or Pi0Config()
    shapes = dict(lerobot_key_shapes(cfg))
    if include_unused:
        shapes.update(unused_key_shapes(cfg))

    def mean_std(rng, n):
        return {"mean": rng.normal(size=n).astype(np.float32).tolist(),
                "std": (0.5 + rng.random(n)).astype(np.float32).tolist()}
    return write_random_checkpoint(out_dir, "pi0", cfg, shapes, seed, std, dtype, camera_names, state_dim, action_dim,
                                   "MEAN_STD", mean_std)
