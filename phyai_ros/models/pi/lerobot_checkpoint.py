"""Generic parts of loading / writing pi-family checkpoints in the LeRobot layout (config.json +
model.safetensors): sizes resolution (model_dims.json or tensor shapes), config.json's robot interface
(cameras, state / action dims) and flow settings, and the config.json written for random checkpoints.

Why: pi0 and pi0.5 share all of this; their own checkpoint modules add only their action-side keys.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .checkpoint_io import count_layers, normalize_key_aliases

from phyai_ros.models.files import CheckpointError, Fields, fixed_file, read_json, read_safetensors, require_file
from phyai_ros.models.pi.modeling.config import GemmaConfig, SiglipConfig
from phyai_ros.models.pi.paligemma_keys import LM, VIS

IMAGE_PREFIX = "observation.images."
SIGLIP_HEADS_BY_WIDTH = {1152: 16}  # So400m; other widths need model_dims.json
_FLOW_KEYS = {"chunk_size": "chunk_size", "num_inference_steps": "num_steps", "tokenizer_max_length": "token_budget",
              "max_action_dim": "max_action_dim", "max_state_dim": "max_state_dim", "min_period": "min_period",
              "max_period": "max_period"}
MAX_DIM = 4096           # state / action widths
MAX_TOKENS = 4096        # the prompt's token budget (tokenizer_max_length): it sizes every prefix buffer
# config.json key -> (type, lowest, highest) of its value
_FLOW_KEYS_TYPES = {"chunk_size": (int, 1, 1000), "num_inference_steps": (int, 1, 1000),
                    "tokenizer_max_length": (int, 1, MAX_TOKENS), "max_action_dim": (int, 1, MAX_DIM),
                    "max_state_dim": (int, 1, MAX_DIM), "min_period": (float, 1e-9, 1e9),
                    "max_period": (float, 1e-9, 1e9)}


def strip_image_prefix(name: str) -> str:
    return name[len(IMAGE_PREFIX):] if name.startswith(IMAGE_PREFIX) else name


def read_lerobot_checkpoint(ckpt_dir, policy_type: str, weights: bool = True
                            ) -> Tuple[Path, dict, Dict[str, torch.Tensor]]:
    """A LeRobot policy folder -> (folder, its config.json, its tensors with key aliases normalized; none
    without ``weights``); clear errors for a missing folder or file, and for a checkpoint of another policy
    type."""
    ckpt_dir = require_file(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise NotADirectoryError(f"checkpoint path is not a directory: {ckpt_dir}")
    lr = read_json(fixed_file(ckpt_dir, "config.json"))
    if lr.get("type", policy_type) != policy_type:
        raise CheckpointError(f"checkpoint {ckpt_dir}: config.json says type {lr.get('type')} but model.type "
                              f"(the policy type asked for) is {policy_type}")
    if not weights:
        return ckpt_dir, lr, {}
    sd = normalize_key_aliases(read_safetensors(ckpt_dir))
    found = type_of_weights(sd)
    if found not in (None, policy_type):
        raise CheckpointError(f"checkpoint {ckpt_dir}: its weights are {found}'s but "
                              f"model.type (the policy type asked for) is {policy_type}")
    return ckpt_dir, lr, sd


def type_of_weights(sd: Dict[str, torch.Tensor]) -> Optional[str]:
    """'pi0' or 'pi05' when the weights hold the key only that one has (pi0's state projection, pi0.5's
    time MLP) and not the other's, else None: a mislabelled checkpoint is then named as such instead of
    failing with a key-mismatch dump (one holding both is left to that dump)."""
    pi0, pi05 = "model.state_proj.weight" in sd, "model.time_mlp_in.weight" in sd
    return "pi0" if pi0 and not pi05 else "pi05" if pi05 and not pi0 else None


def parse_features(lr: dict, source="config.json") -> Tuple[List[str], Optional[int], Optional[int]]:
    """config.json -> (camera names in config order without 'observation.images.', state dim, action dim), each
    checked (a wrong one names ``source`` and the key)."""
    f = Fields(lr, source)
    feats = f.section("input_features", default={})
    cams, state = [], None
    for key in feats.data:
        feat = feats.section(key)
        kind = feat.get("type", str, default="")
        if kind == "VISUAL":
            cams.append(strip_image_prefix(key))
        elif key == "observation.state":
            state = feat.ints("shape", 1, MAX_DIM, length=1)[0]
    action = f.section("output_features", default={}).section("action", default={}).ints(
        "shape", 1, MAX_DIM, length=1, default=(None,))[0]
    return cams, state, action


def find_model_dims(ckpt_dir: Path, policy_type: str) -> Optional[Tuple[dict, Path]]:
    """(model_dims.json, its path) next to config.json, else in the parent directory (parity-fixture layout)."""
    for cand in (fixed_file(ckpt_dir, "model_dims.json"), fixed_file(ckpt_dir.parent, "model_dims.json")):
        if cand.is_file():
            d = read_json(cand)
            if d.get("policy_type", policy_type) == policy_type:
                return d, cand
    return None


def flow_overrides(lr: dict, source="config.json") -> dict:
    """Flow settings from config.json as config-dataclass field names, each type- and range-checked."""
    f = Fields(lr, source)
    out = {ours: f.get(theirs, *_FLOW_KEYS_TYPES[theirs]) for theirs, ours in _FLOW_KEYS.items() if theirs in f}
    if out.get("min_period", 0) >= out.get("max_period", math.inf):
        raise CheckpointError(f"{source}: min_period {out['min_period']} must be below max_period {out['max_period']}")
    return out


def _shape(sd: Dict[str, torch.Tensor], k: str) -> tuple:
    if k not in sd:
        raise CheckpointError(f"cannot infer model sizes: missing key {k}")
    return tuple(sd[k].shape)


def gemma_from_shapes(sd: Dict[str, torch.Tensor], prefix: str) -> GemmaConfig:
    """Gemma sizes from `prefix`layers.* shapes (assumes 1 kv head, as every pi-family Gemma has)."""
    q, w = _shape(sd, prefix + "layers.0.self_attn.q_proj.weight")
    hd = _shape(sd, prefix + "layers.0.self_attn.k_proj.weight")[0]
    return GemmaConfig(width=w, depth=count_layers(sd, prefix + "layers."),
                       mlp_dim=_shape(sd, prefix + "layers.0.mlp.gate_proj.weight")[0], num_heads=q // hd,
                       num_kv_heads=1, head_dim=hd)


def prefix_dims_from_shapes(sd: Dict[str, torch.Tensor]) -> dict:
    """vlm / siglip / vocab_size inferred from tensor shapes (kwargs for the config dataclasses)."""
    ws, _, p, _ = _shape(sd, VIS + "embeddings.patch_embedding.weight")
    if ws not in SIGLIP_HEADS_BY_WIDTH:
        raise CheckpointError(f"cannot infer the SigLIP head count for width {ws}: put a model_dims.json "
                              "(fixture schema) next to config.json or pass dims=")
    n = _shape(sd, VIS + "embeddings.position_embedding.weight")[0]
    sig = SiglipConfig(width=ws, depth=count_layers(sd, VIS + "encoder.layers."), num_heads=SIGLIP_HEADS_BY_WIDTH[ws],
                       mlp_dim=_shape(sd, VIS + "encoder.layers.0.mlp.fc1.weight")[0], patch_size=p,
                       image_size=int(round(n ** 0.5)) * p)
    return {"vlm": gemma_from_shapes(sd, LM), "siglip": sig, "vocab_size": _shape(sd, LM + "embed_tokens.weight")[0]}


def lerobot_config_json(policy_type: str, cfg, camera_names: Sequence[str], state_dim: int, action_dim: int,
                        dtype: torch.dtype, norm: str) -> dict:
    """A LeRobot-style config.json for a random checkpoint (norm: 'QUANTILES' or 'MEAN_STD')."""
    size = cfg.siglip.image_size
    feats = {IMAGE_PREFIX + c: {"type": "VISUAL", "shape": [3, size, size]} for c in camera_names}
    feats["observation.state"] = {"type": "STATE", "shape": [state_dim]}
    return {"type": policy_type, "n_obs_steps": 1, "input_features": feats,
            "output_features": {"action": {"type": "ACTION", "shape": [action_dim]}},
            "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m",
            "dtype": "bfloat16" if dtype == torch.bfloat16 else "float32",
            "chunk_size": cfg.chunk_size, "n_action_steps": cfg.chunk_size, "max_state_dim": cfg.max_state_dim,
            "max_action_dim": cfg.max_action_dim, "num_inference_steps": cfg.num_steps,
            "min_period": cfg.min_period, "max_period": cfg.max_period, "image_resolution": [size, size],
            "empty_cameras": 0, "tokenizer_max_length": cfg.token_budget,
            "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": norm, "ACTION": norm}}


def random_state_dict(shapes: Dict[str, tuple], seed: int, std: float, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """Every tensor i.i.d. N(0, std), in sorted key order from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(s, generator=gen) * std).to(dtype) for k, s in sorted(shapes.items())}


def write_random_checkpoint(out_dir, policy_type: str, cfg, shapes: Dict[str, tuple], seed: int, std: float,
                            dtype: torch.dtype, camera_names: Sequence[str], state_dim: int, action_dim: int,
                            norm_mode: str, stats_for) -> Dict[str, Path]:
    """Write config.json, model.safetensors (random_state_dict of `shapes`), model_dims.json and
    norm_stats.json (stats_for(rng, n) per feature) in the LeRobot layout; return their paths."""
    from safetensors.torch import save_file

    import numpy as np
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"config": out / "config.json", "weights": out / "model.safetensors",
             "dims": out / "model_dims.json", "norm_stats": out / "norm_stats.json"}
    save_file(random_state_dict(shapes, seed, std, dtype), str(paths["weights"]))
    paths["config"].write_text(json.dumps(lerobot_config_json(policy_type, cfg, camera_names, state_dim, action_dim,
                                                              dtype, norm_mode), indent=2))
    paths["dims"].write_text(json.dumps(cfg.to_model_dims(), indent=2))
    rng = np.random.default_rng(seed)
    stats = {"observation.state": stats_for(rng, state_dim), "action": stats_for(rng, action_dim)}
    paths["norm_stats"].write_text(json.dumps(stats, indent=2))
    return paths
