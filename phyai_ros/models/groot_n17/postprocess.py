"""GR00T N1.7 action decoding: normalized model actions -> robot units, as the checkpoint's postprocessor.

Two kinds of checkpoints (the postprocessor step says which):
- absolute (`groot_action_unpack_unnormalize_v2`): slice to the env action dim, clamp to [-1, 1], min/max
  unnormalize with the step's flat action stats (x = min where max == min);
- per-group (`groot_n1_7_action_decode_v1`): per action group in modality order, clamp and unnormalize with
  per-chunk-row stats for RELATIVE groups (relative_action min/max, [T, dim]) or the group's action
  q01/q99 (min/max without percentiles); RELATIVE joint groups add the raw state of their state group,
  RELATIVE end-effector groups (xyz + rot6d) compose poses with the raw state pose in float64.
Relative groups need the raw (unnormalized) state of the same observation: the adapter keeps it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

import numpy as np
import torch

from phyai_ros.models.files import CheckpointError

from .keys import UNNORM_STEP

Tensor = torch.Tensor


def unnormalize_min_max(y: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """y in [-1, 1] -> (y + 1) / 2 * (hi - lo) + lo; lo where hi == lo."""
    x = (y + 1) * 0.5 * (hi - lo) + lo
    return torch.where(hi == lo, lo.expand_as(x), x)


class AbsoluteDecoder:
    """Flat min/max unnormalization of the first env_dim action dims."""

    def __init__(self, cfg: Mapping, state: Mapping[str, Tensor]):
        for k in ("action.min", "action.max"):
            if k not in state:
                raise CheckpointError(f"postprocessor state file: no {k}")
        self.lo, self.hi = state["action.min"].float(), state["action.max"].float()
        self.env_dim = int(cfg.get("env_action_dim") or self.lo.numel())
        self.clip = bool(cfg.get("clip_normalized_action", True))
        if not cfg.get("normalize_min_max", True):
            raise CheckpointError("postprocessor: only min/max action normalization is supported")

    def __call__(self, y: Tensor, raw_state: Optional[Tensor] = None) -> Tensor:
        y = y[..., :self.env_dim].float()
        y = y.clamp(-1, 1) if self.clip else y
        return unnormalize_min_max(y, self.lo.to(y.device), self.hi.to(y.device))


# ------------------------------------------------------------------ per-group decoding
def rot6d_to_matrix(r6: np.ndarray) -> np.ndarray:
    """[..., 6] = the first two rows of R -> [..., 3, 3]: rows Gram-Schmidt-normalized, third = cross product."""
    a, b = r6[..., :3], r6[..., 3:6]
    r1 = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b - np.sum(r1 * b, axis=-1, keepdims=True) * r1
    r2 = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return np.stack([r1, r2, np.cross(r1, r2)], axis=-2)


def pose_matrix(xyz_rot6d: np.ndarray) -> np.ndarray:
    """[..., 9] -> homogeneous [..., 4, 4]."""
    t = np.zeros(xyz_rot6d.shape[:-1] + (4, 4))
    t[..., :3, :3] = rot6d_to_matrix(xyz_rot6d[..., 3:9])
    t[..., :3, 3] = xyz_rot6d[..., :3]
    t[..., 3, 3] = 1.0
    return t


def compose_eef(ref: np.ndarray, rel: np.ndarray) -> np.ndarray:
    """Absolute pose T(ref) @ T(rel) per chunk row, as xyz + the first two rows of R. ref [B, 9], rel [B, T, 9]."""
    pose = pose_matrix(ref.astype(np.float64))[:, None] @ pose_matrix(rel.astype(np.float64))
    return np.concatenate([pose[..., :3, 3], pose[..., 0, :3], pose[..., 1, :3]], axis=-1)


@dataclass(frozen=True)
class ActionGroup:
    key: str
    dim: int
    relative: bool
    eef: bool
    state_key: str


def _stat(stats: Mapping, kind: str, key: str, name: str) -> np.ndarray:
    try:
        return np.asarray(stats[kind][key][name], dtype=np.float32)
    except KeyError:
        raise CheckpointError(f"postprocessor raw_stats: no {kind}.{key}.{name}") from None


class GroupDecoder:
    """Per-group decoding of `groot_n1_7_action_decode_v1` (see module docstring)."""

    def __init__(self, cfg: Mapping):
        self.stats = cfg.get("raw_stats") or {}
        modality = cfg.get("modality_config") or {}
        action, state = modality.get("action") or {}, modality.get("state") or {}
        self.horizon = len(action.get("delta_indices") or []) or None
        self.percentiles = bool(cfg.get("use_percentiles", False))
        self.env_dim = cfg.get("env_action_dim")
        if cfg.get("action_decode_transform"):
            raise CheckpointError(f"postprocessor: action_decode_transform {cfg['action_decode_transform']!r} "
                                  "is not supported")
        use_rel = bool(cfg.get("use_relative_action", False))
        self.groups: List[ActionGroup] = []
        confs = action.get("action_configs") or [{}] * len(action.get("modality_keys") or [])
        for key, c in zip(action.get("modality_keys") or [], confs):
            rel = use_rel and (c or {}).get("rep") == "RELATIVE"
            eef = (c or {}).get("type") == "EEF"
            if rel and eef and (c or {}).get("format") != "XYZ_ROT6D":
                raise CheckpointError(f"action group {key}: EEF format {c.get('format')!r} (only XYZ_ROT6D)")
            dim = len(_stat(self.stats, "action", key, "min"))
            self.groups.append(ActionGroup(key, dim, rel, eef, (c or {}).get("state_key") or key))
        self.state_slices = {}
        start = 0
        for key in state.get("modality_keys") or []:
            n = len(_stat(self.stats, "state", key, "min"))
            self.state_slices[key] = slice(start, start + n)
            start += n

    def _bounds(self, g: ActionGroup, rows: int) -> Tuple[np.ndarray, np.ndarray]:
        if g.relative:
            lo, hi = (_stat(self.stats, "relative_action", g.key, n) for n in ("min", "max"))
            return lo[:rows], hi[:rows]
        names = ("q01", "q99") if self.percentiles else ("min", "max")
        return tuple(_stat(self.stats, "action", g.key, n) for n in names)

    def __call__(self, y: Tensor, raw_state: Optional[Tensor] = None) -> Tensor:
        y_np = y.detach().float().cpu().numpy()
        if self.horizon:
            y_np = y_np[:, :self.horizon]
        rows, out, start = y_np.shape[1], [], 0
        state = None if raw_state is None else raw_state.detach().float().cpu().numpy()
        for g in self.groups:
            part = np.clip(y_np[..., start:start + g.dim], -1, 1)
            start += g.dim
            lo, hi = self._bounds(g, rows)
            x = ((part + 1) * 0.5 * (hi - lo) + lo).astype(np.float32)
            if g.relative:
                if state is None or g.state_key not in self.state_slices:
                    raise ValueError(f"action group {g.key} is relative: needs the raw state group {g.state_key}")
                ref = state[:, self.state_slices[g.state_key]]
                x = compose_eef(ref, x).astype(np.float32) if g.eef else x + ref[:, None]
            out.append(x)
        actions = np.concatenate(out, axis=-1)
        if self.env_dim:
            actions = actions[..., :int(self.env_dim)]
        return torch.from_numpy(np.ascontiguousarray(actions)).to(y.device)


def make_decoder(step_name: str, cfg: Mapping, state: Mapping[str, Tensor]):
    """The decoder of the checkpoint's postprocessor step."""
    return AbsoluteDecoder(cfg, state) if step_name == UNNORM_STEP else GroupDecoder(cfg)
