"""Basic tensor operators used by every model in phyai_ros.

Why a module of plain functions: the modeling code calls only these, so the runtime can later dispatch
each one (by shape, dtype, device capability) to a Triton kernel, flashinfer or torch without touching the
models. Every function here is the fp32-faithful PyTorch reference that such kernels are checked against.

Rules: static shapes in, static shapes out; no host syncs (no ``.item()``, no data-dependent control flow),
so all of them can be captured in a CUDA graph. Normalizations and softmax are computed in float32 and cast
back to the input dtype (what the reference implementations do in bf16).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

# Additive mask value used by openpi / LeRobot for masked attention logits (float32-representable).
MASK_VALUE = -2.3819763e38


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """y = x @ weight.T + bias (weight [out, in], torch layout)."""
    return F.linear(x, weight, bias)


def embedding(ids: Tensor, table: Tensor) -> Tensor:
    """Row lookup table[ids]."""
    return F.embedding(ids, table)


def rms_norm(x: Tensor, weight: Tensor, eps: float, weight_offset: float = 1.0) -> Tensor:
    """Gemma RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + weight), in float32, cast back to x.dtype;
    weight_offset=0: Qwen's RMSNorm (times the plain weight)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (weight_offset + weight.float())).to(x.dtype)


def ada_rms_norm(x: Tensor, scale: Tensor, shift: Tensor, eps: float) -> Tensor:
    """Adaptive RMSNorm (pi0.5 expert): rms(x) * (1 + scale) + shift, in float32, cast back to x.dtype.

    scale / shift broadcast against x (e.g. [B, 1, W] or [1, 1, W] for x [B, T, W]).
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + scale.float()) + shift.float()).to(x.dtype)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """Standard LayerNorm over the last dim, in float32, cast back to x.dtype."""
    return F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps).to(x.dtype)


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU, tanh approximation (HF 'gelu_pytorch_tanh')."""
    return F.gelu(x, approximate="tanh")


def gelu_tanh_mul(gate: Tensor, up: Tensor) -> Tensor:
    """GeGLU core: gelu_tanh(gate) * up (gate/up may be views into one fused gate_up GEMM output)."""
    return F.gelu(gate, approximate="tanh") * up


def silu(x: Tensor) -> Tensor:
    return F.silu(x)


def gated_residual(x: Tensor, y: Tensor, gate: Optional[Tensor]) -> Tensor:
    """x + y * gate (adaRMS residual); plain x + y when gate is None."""
    return x + y if gate is None else x + y * gate


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Rotary tables for integer positions [B, T] -> cos, sin [B, T, head_dim] (computed in float32).

    inv_freq is [head_dim/2] = 1 / theta^(arange(0, hd, 2)/hd); the halves are duplicated (HF 'default' RoPE).
    """
    freqs = positions.float()[..., None] * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [B, heads, T, hd] with cos/sin [B, T, hd] (rotate-half convention)."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def attention(q: Tensor, k: Tensor, v: Tensor, additive_mask: Optional[Tensor] = None,
              scale: Optional[float] = None) -> Tensor:
    """Grouped-query attention, softmax in float32.

    q [B, Hq, Tq, D], k/v [B, Hkv, Tk, D] with Hq a multiple of Hkv (8 q heads share 1 kv head in Gemma),
    additive_mask broadcastable to [B, 1, Tq, Tk] (0 = attend, MASK_VALUE = blocked) or None.
    Returns [B, Hq, Tq, D] in q.dtype. A fully masked row attends uniformly (as the reference does).
    """
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = hq // hkv
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    qg = q.reshape(b, hkv, g * tq, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * scale
    scores = scores.view(b, hkv, g, tq, tk)
    if additive_mask is not None:
        scores = scores + additive_mask.float().unsqueeze(2)
    probs = torch.softmax(scores, dim=-1).to(q.dtype).view(b, hkv, g * tq, tk)
    out = torch.matmul(probs, v)
    return out.view(b, hq, tq, d)


def attn_tokens(a: Tensor) -> Tensor:
    """Attention output [B, Hq, T, hd] -> [B, T, Hq*hd], the o_proj input (a view where a is token-major)."""
    b, h, t, d = a.shape
    return a.transpose(1, 2).reshape(b, t, h * d)


def attention_unmasked(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Full bidirectional multi-head attention without a mask (vision encoder), q/k/v [B, H, T, D].

    torch SDPA: what the reference SigLIP runs (bitwise equal on CPU), flash/efficient kernels on GPU.
    """
    return F.scaled_dot_product_attention(q, k, v)


def patch_embed(pixels: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Non-overlapping patch embedding: pixels [N, C, H, W], weight [W, C, p, p] -> [N, (H/p)*(W/p), W]
    (row-major patch order), i.e. a stride-p convolution flattened to tokens."""
    p = weight.shape[-1]
    return F.conv2d(pixels, weight, bias, stride=p).flatten(2).transpose(1, 2)


_UNIT: dict = {}


def unit_affine(width: int, like: Tensor) -> Tuple[Tensor, Tensor]:
    """(ones, zeros) [width] on like's device / dtype, made once: a LayerNorm without affine as the selector's
    affine LayerNorm ops (no tensor is created per call, so a CUDA graph capture allocates nothing here)."""
    key = (width, like.device, like.dtype)
    if key not in _UNIT:
        _UNIT[key] = (torch.ones(width, device=like.device, dtype=like.dtype),
                      torch.zeros(width, device=like.device, dtype=like.dtype))
    return _UNIT[key]


def bool_to_additive_mask(allowed: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """[B, Tq, Tk] bool (True = may attend) -> additive [B, 1, Tq, Tk] (0 / MASK_VALUE)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    neg = torch.full((), MASK_VALUE, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, neg)[:, None]
