"""Gemma decoder-layer weights and the per-layer math shared by the PaliGemma LM and the action experts.

Why: pi0 / pi0.5 run two Gemma stacks that meet only inside attention (the expert attends to the LM's
prefix K/V). Keeping the pieces (fused qkv projection + RoPE, output projection, GeGLU MLP) as small
functions lets each model wire its own stage order and norm type (RMSNorm vs adaRMS) around them.
Fused at load time: q/k/v in one matrix, gate/up in one matrix (one GEMM each).
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from phyai_ros.layers import dispatch
from phyai_ros.layers.ops import attn_tokens

from .config import GemmaConfig

Tensor = torch.Tensor


class GemmaLayer(nn.Module):
    """One decoder layer's weights. Norms are plain RMSNorm vectors, or, when ``cond_dim`` is set (pi0.5
    expert), adaRMS dense layers cond -> (scale, shift, gate) kept as ``*_dense_w/_b``."""

    def __init__(self, cfg: GemmaConfig, dtype: torch.dtype, device=None, cond_dim: int | None = None):
        super().__init__()
        w = cfg.width
        e = lambda shape, dt=dtype: torch.empty(shape, dtype=dt, device=device)  # noqa: E731
        self.register_buffer("qkv_w", e((cfg.q_dim + 2 * cfg.kv_dim, w)))
        self.register_buffer("o_w", e((w, cfg.q_dim)))
        self.register_buffer("gate_up_w", e((2 * cfg.mlp_dim, w)))
        self.register_buffer("down_w", e((w, cfg.mlp_dim)))
        if cond_dim is None:
            self.register_buffer("in_norm_w", e((w,), torch.float32))
            self.register_buffer("post_norm_w", e((w,), torch.float32))
        else:
            # Kept in float32 like every norm parameter: used once per step in the time precompute only.
            f32 = torch.float32
            self.register_buffer("in_norm_dense_w", e((3 * w, cond_dim), f32))
            self.register_buffer("in_norm_dense_b", e((3 * w,), f32))
            self.register_buffer("post_norm_dense_w", e((3 * w, cond_dim), f32))
            self.register_buffer("post_norm_dense_b", e((3 * w,), f32))


def rope_inv_freq(cfg: GemmaConfig, device=None) -> Tensor:
    """[head_dim/2] inverse frequencies of the default RoPE (float32)."""
    idx = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64, device=device).float()
    return 1.0 / (cfg.rope_theta ** (idx / cfg.head_dim))


def qkv_rope(x_normed: Tensor, layer: GemmaLayer, cfg: GemmaConfig, cos: Tensor, sin: Tensor
             ) -> Tuple[Tensor, Tensor, Tensor]:
    """x [B, T, W] -> q [B, Hq, T, hd], k / v [B, Hkv, T, hd]; RoPE applied to q and k (one fused
    split + rotate where a kernel can)."""
    return dispatch.qkv_rope(dispatch.linear(x_normed, layer.qkv_w), cos, sin, cfg.num_heads, cfg.num_kv_heads,
                             cfg.head_dim)


def attn_out(a: Tensor, layer: GemmaLayer) -> Tensor:
    """Attention output [B, Hq, T, hd] -> o_proj -> [B, T, W]."""
    return dispatch.linear(attn_tokens(a), layer.o_w)


def mlp_hidden(x_normed: Tensor, layer: GemmaLayer) -> Tensor:
    """gelu_tanh(gate) * up [B, T, mlp_dim] from the fused gate/up projection, the down_proj input."""
    return dispatch.linear_geglu(x_normed, layer.gate_up_w)


def mlp(x_normed: Tensor, layer: GemmaLayer, cfg: GemmaConfig) -> Tensor:
    """GeGLU MLP with fused gate/up: down(gelu_tanh(gate) * up)."""
    return dispatch.linear(mlp_hidden(x_normed, layer), layer.down_w)
