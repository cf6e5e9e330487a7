"""The joint token sequence of one Cosmos3 pass and its 3-D mRoPE positions.

[text: the prompt, causal understanding pathway | vision: T x h' x w' latent patches, frame-major |
actions: one token per chunk step]. Text positions run 0..und_len-1 on all three axes; vision and actions
both start at the temporal offset und_len + margin (temporal siblings, not a sequence): vision frame f at
offset + f * (base_fps / tf) / (fps / tf) when fps modulation is on and T > 1, h / w from 0 (reset); action k
at offset + (k + 1) * (base_fps / tf) / fps, h = w = 0. Computed in float32 with the same operations as
diffusers 0.42.1 (the RoPE angles are products of these floats, so they must be the same floats).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import TransformerConfig

Tensor = torch.Tensor


@dataclass(frozen=True)
class GenLayout:
    """Shapes of the generation part of the sequence (vision patches + action tokens)."""

    frames: int          # latent T
    height: int          # latent h (content, before patch padding)
    width: int           # latent w
    patch: int
    chunk: int

    @property
    def grid(self) -> tuple:
        p = self.patch
        return self.frames, -(-self.height // p), -(-self.width // p)

    @property
    def frame_tokens(self) -> int:
        _, hp, wp = self.grid
        return hp * wp

    @property
    def vision_tokens(self) -> int:
        return self.frames * self.frame_tokens

    @property
    def tokens(self) -> int:
        return self.vision_tokens + self.chunk


def _time_axis(n: int, offset, fps, base_fps: float, tf: int, base_tf: int, start: int, per: int) -> Tensor:
    """diffusers' get_3d_mrope_ids_vae_tokens temporal axis ([n * per])."""
    if fps is not None and n > 1:
        tps, base_tps = fps / tf, base_fps / base_tf
        t = (torch.arange(n, dtype=torch.float32) + start) / tps * base_tps + offset
        return t.view(-1, 1).expand(-1, per).flatten()
    return (torch.arange(n, dtype=torch.long).view(-1, 1).expand(-1, per).flatten() + int(offset) + start).float()


def position_ids(cfg: TransformerConfig, und_len: int, layout: GenLayout, fps: float, temporal_factor: int) -> Tensor:
    """[3, und_len + layout.tokens] float32 (t, h, w) of one pass."""
    text = torch.arange(und_len, dtype=torch.float32).unsqueeze(0).expand(3, -1)
    offset = und_len + cfg.modality_margin
    fps = fps if cfg.enable_fps_modulation else None
    t, hp, wp = layout.grid
    vt = _time_axis(t, offset, fps, float(cfg.base_fps), temporal_factor, temporal_factor, 0, hp * wp)
    vh = torch.arange(hp).view(1, -1, 1).expand(t, -1, wp).flatten()
    vw = torch.arange(wp).view(1, 1, -1).expand(t, hp, -1).flatten()
    at = _time_axis(layout.chunk, offset, fps, float(cfg.base_fps), 1, temporal_factor, 1, 1)
    zeros = torch.zeros(layout.chunk)
    if not cfg.reset_spatial_ids:
        vh, vw, zeros = vh + int(offset), vw + int(offset), zeros + int(offset)
    vision = torch.stack([vt, vh.float(), vw.float()])
    action = torch.stack([at, zeros.float(), zeros.float()])
    return torch.cat([text, vision, action], dim=1)


def rope_axis(cfg: TransformerConfig) -> Tensor:
    """Per rotary frequency (head_dim / 2 of them), the position axis it reads: interleaved T/H/W (H at 1, 4, ...,
    W at 2, 5, ... for rope_axes_dim[1 or 2] * 3 entries, T elsewhere)."""
    axis = torch.zeros(cfg.head_dim // 2, dtype=torch.long)
    axis[1:cfg.rope_axes_dim[1] * 3:3] = 1
    axis[2:cfg.rope_axes_dim[2] * 3:3] = 2
    return axis


def inv_freq(cfg: TransformerConfig) -> Tensor:
    return 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))


def mrope_cos_sin(cfg: TransformerConfig, positions: Tensor) -> tuple:
    """positions [..., 3, L] float32 -> cos, sin [..., L, head_dim] float32 (the interleaved-mRoPE tables)."""
    axis = rope_axis(cfg).to(positions.device)
    pos = positions.float().index_select(-2, axis)                  # [..., hd/2, L]
    freqs = (pos * inv_freq(cfg).to(positions.device)[:, None]).transpose(-1, -2)   # [..., L, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


__all__ = ["GenLayout", "position_ids", "mrope_cos_sin", "rope_axis", "inv_freq"]
