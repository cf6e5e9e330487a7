"""Attention as selector ops, with its input: the fused QKV projection's split and RoPE (``qkv_rope``, Qwen3-VL's
``qkv_norm_rope``), attention (``attention``: SDPA or kernels/split_kv_attention.py by launch shape), the action
expert's attention over the prefix cache and its own keys without concatenating them (``attention_with_prefix``,
``rope_attention_with_prefix``), and an attention block from its normed input (``projected_attention``).

Key-split and row-tile launch shapes are candidates of their own (``ATTENTION_TILINGS``,
``PREFIX_ATTENTION_TILINGS``) for the device profile to pick; where none has an entry, short attention takes
``short_attention_tiling``'s rule and long attention SDPA. Every op's last candidate is its reference.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from phyai_ros.kernels import common as triton_common
from phyai_ros.kernels import rope as rope_kernels
from phyai_ros.kernels import split_kv_attention as split_kv_kernels
from phyai_ros.kernels.candidates import projected_attention as projected_attention_kernels
from phyai_ros.layers import ops
from phyai_ros.layers.linears import Weight, linear
from phyai_ros.layers.quantized import QuantizedWeight
from phyai_ros.layers.registry import CUDA, current_selector, register, triton_ok
from phyai_ros.layers.selector import Candidate, shape_key

Tensor = torch.Tensor


# ----------------------------------------------------------------------------- the QKV projection's heads and RoPE
def _torch_qkv_rope(qkv, cos, sin, hq, hkv, d):
    b, t, _ = qkv.shape
    q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
    q = q.view(b, t, hq, d).transpose(1, 2)
    k = k.view(b, t, hkv, d).transpose(1, 2)
    v = v.view(b, t, hkv, d).transpose(1, 2)
    return ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin), v


def _torch_qkv_norm_rope(qkv, cos, sin, hq, hkv, d, q_norm, k_norm, eps):
    """Qwen3-VL: per-head RMSNorm (plain weight) of q and k where given, then RoPE in float32 (cos / sin may
    be float32 tables for a bf16 qkv), cast back to qkv's dtype."""
    b, t, _ = qkv.shape
    q, k, v = (p.view(b, t, -1, d) for p in qkv.split((hq * d, hkv * d, hkv * d), dim=-1))
    if q_norm is not None:
        q, k = ops.rms_norm(q, q_norm, eps, 0.0), ops.rms_norm(k, k_norm, eps, 0.0)
    cos, sin = cos.float(), sin.float()
    rot = lambda x: ops.apply_rope(x.transpose(1, 2).float(), cos, sin).to(qkv.dtype)  # noqa: E731
    return rot(q), rot(k), v.transpose(1, 2)


def _triton_qkv_rope(qkv, cos, sin, hq, hkv, d, q_norm=None, k_norm=None, eps=1e-6):
    return rope_kernels.qkv_rope(qkv, cos, sin, hq, hkv, d, q_norm, k_norm, eps)


# ----------------------------------------------------------------------------- the expert's attention over its prefix
def _torch_attention_with_prefix(q, k_prefix, v_prefix, k_suffix, v_suffix, mask):
    return ops.attention(q, torch.cat([k_prefix, k_suffix], dim=2), torch.cat([v_prefix, v_suffix], dim=2), mask)


def _triton_attention_with_prefix(q, k_prefix, v_prefix, k_suffix, v_suffix, mask, **tiling):
    b, hq, lq, d = q.shape
    # Written token-major, so the output projection reads it without a transpose copy.
    out = torch.empty(b, lq, hq, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    return split_kv_kernels.split_kv_attention(q, k_prefix, v_prefix, k_suffix, v_suffix, mask, out=out, **tiling)


# Key-split variants of the expert attention for the profile (default: ~2 programs per SM, >= 64-key chunks).
# Every split writes an fp32 partial of all query rows ([rows, D], 400 KB for pi0.5's 8 x 50 rows) that the merge
# reads back, so fewer splits with smaller query tiles (more tiles, the same parallelism) may stream less.
ATTENTION_TILINGS = {"triton": {}, "triton_s8": {"num_splits": 8}, "triton_m32": {"block_m": 32},
                     "triton_s4": {"num_splits": 4}, "triton_m32_s4": {"block_m": 32, "num_splits": 4},
                     "triton_m16_s4": {"block_m": 16, "num_splits": 4},
                     "triton_m16_s8": {"block_m": 16, "num_splits": 8},
                     # eight warps: half the registers per thread for the [64, 256] fp32 accumulator (batch 8-32)
                     "triton_w8": {"num_warps": 8}}


def _qkv_heads(qkv, k_prefix):
    """(hq, hkv, d) of a fused QKV projection output whose K/V heads match the prefix cache."""
    hkv, d = k_prefix.shape[1], k_prefix.shape[-1]
    return qkv.shape[-1] // d - 2 * hkv, hkv, d


def _triton_rope_attention(qkv, cos, sin, k_prefix, v_prefix, mask, **tiling):
    hq, _, d = _qkv_heads(qkv, k_prefix)
    b, t = qkv.shape[:2]
    out = torch.empty(b, t, hq, d, dtype=qkv.dtype, device=qkv.device).transpose(1, 2)  # token-major
    return split_kv_kernels.rope_split_kv_attention(qkv, cos, sin, k_prefix, v_prefix, mask, out=out, **tiling)


def _rope_attention_fits(qkv, cos, sin, k_prefix, v_prefix, mask):
    """RoPE is applied in the kernel to halves of D: D a power of two >= 32, cos / sin per suffix token."""
    d = k_prefix.shape[-1]
    return d >= 32 and d & (d - 1) == 0 and cos.shape == (qkv.shape[0], qkv.shape[1], d)


def _unfused_rope_attention(qkv, cos, sin, k_prefix, v_prefix, mask):
    q, k, v = qkv_rope(qkv, cos, sin, *_qkv_heads(qkv, k_prefix))
    return attention_with_prefix(q, k_prefix, v_prefix, k, v, mask)


# ----------------------------------------------------------------------------- attention
def sdpa(q, k, v, mask):
    """torch SDPA (flash / memory-efficient / cuDNN backends chosen by torch); GQA by expanding K/V views."""
    b, hq, _, d = q.shape
    if k.shape[1] != hq:
        k = k.expand(b, hq, k.shape[2], d) if k.shape[1] == 1 else k.repeat_interleave(hq // k.shape[1], 1)
        v = v.expand(b, hq, v.shape[2], d) if v.shape[1] == 1 else v.repeat_interleave(hq // v.shape[1], 1)
    if mask is not None:
        mask = mask.to(q.dtype)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _triton_attention(q, k, v, mask, **tiling):
    b, hq, lq, d = q.shape
    # Written token-major: every caller feeds [B, T, H*d] to its output projection, a view of this (a copy
    # kernel per call otherwise: 2.3 us x 64 in GR00T's loop on the H200).
    out = torch.empty(b, lq, hq, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    return split_kv_kernels.split_kv_attention(q, k, v, None, None, mask, out=out, **tiling)


# Long-query attention (the prefix pass: ~800-1000 queries x 8 heads against as many keys): the default splits
# the keys (~2 programs per SM) and merges the splits in a second kernel; with one split the row tiles alone
# fill the GPU and each program writes its rows' output directly (no fp32 workspace round trip).
# Short-query attention (GR00T's DiT: 41 queries per head against 41-170 keys, head_dim 48) runs one 64-row tile per
# head with the default tiles; 16- or 32-row tiles with every key in one block give more, shorter programs.
PREFIX_ATTENTION_TILINGS = {"triton": {}, "triton_s1": {"num_splits": 1},
                            "triton_s1_m128": {"num_splits": 1, "block_m": 128, "block_n": 64, "num_warps": 8},
                            "triton_s1_m16_n128": {"num_splits": 1, "block_m": 16, "block_n": 128},
                            "triton_s1_m32_n128": {"num_splits": 1, "block_m": 32, "block_n": 128},
                            # head_dim 256 (the pi prefix): a [64, 256] fp32 accumulator on eight warps, not four
                            "triton_w8": {"num_warps": 8}, "triton_s1_w8": {"num_splits": 1, "num_warps": 8},
                            "triton_s1_n64_w8": {"num_splits": 1, "block_n": 64, "num_warps": 8},
                            # the pi prefix fills only ~60 of 132 SMs with 128-row tiles and one split (61 tiles for
                            # pi0.5's 8 x 968 rows): two key splits double the programs for one merge; three stages
                            # of 32-key tiles keep more loads in flight than two of 64
                            "triton_s2_m128_w8": {"num_splits": 2, "block_m": 128, "block_n": 64, "num_warps": 8},
                            "triton_s2_n64_w8": {"num_splits": 2, "block_n": 64, "num_warps": 8},
                            "triton_s1_n32_w8_st3": {"num_splits": 1, "block_n": 32, "num_warps": 8, "num_stages": 3}}

# Where no profile has an entry (Jetson Thor ships none), short attention (<= 256 keys, head_dim <= 128: GR00T's
# DiT and backbone) takes the split-KV kernel with every key of a row in one program and the smallest row tile
# that keeps the programs within ~1.5 per multiprocessor, SDPA otherwise. On the H200 that rule's pick beat SDPA
# by 1.1-4.3x at every such profiled shape and was within 15% of the best tiling (profiles/h200.json, 2026-12-02;
# test_dispatch checks it against those timings); at the pi prefix's 968 keys of 256 SDPA stays first.
SHORT_ATTENTION_KEYS = 256


def short_attention_tiling(programs_per_row_tile: int, rows: int, sms: int) -> str:
    """The PREFIX_ATTENTION_TILINGS entry for a short attention of ``rows`` query rows per KV head (GQA-packed)
    and ``programs_per_row_tile`` = batch x KV heads: 16-, then 32-row tiles while they give at most ~1.5
    programs per multiprocessor, else the 64-row default."""
    for name, block_m in (("triton_s1_m16_n128", 16), ("triton_s1_m32_n128", 32)):
        if programs_per_row_tile * -(-rows // block_m) <= 1.5 * sms:
            return name
    return "triton_s1"


def _short_attention(q, k, v, mask=None) -> bool:
    return k.shape[2] <= SHORT_ATTENTION_KEYS and q.shape[-1] <= 128


def _triton_short_attention(q, k, v, mask=None):
    b, hq, lq, _ = q.shape
    hkv = k.shape[1]
    name = short_attention_tiling(b * hkv, hq // hkv * lq, triton_common.num_sms(q.device))
    return _triton_attention(q, k, v, mask, **PREFIX_ATTENTION_TILINGS[name])


# ----------------------------------------------------------------------------- an attention block from its input
def _unfused_projected_attention(y, weight, bias, n_heads, k_cache=None, v_cache=None, mask=None):
    """The reference: the projection (linear) and the attention as their own selector ops, [B, T, H * d]."""
    b, t, _ = y.shape
    p = linear(y, weight, bias)
    if k_cache is None:
        q, k_cache, v_cache = rope_kernels.split_heads(p, n_heads, n_heads, p.shape[-1] // (3 * n_heads))
    else:
        q = p.view(b, t, n_heads, -1).transpose(1, 2)
    a = attention(q, k_cache, v_cache, mask)
    return a.transpose(1, 2).reshape(b, t, -1)


def _projected_attention_fits(y, weight, bias, n_heads, k_cache=None, v_cache=None, mask=None) -> bool:
    return projected_attention_kernels.fits(y, weight, n_heads, k_cache, mask)


def _triton_projected_attention(y, weight, bias, n_heads, k_cache=None, v_cache=None, mask=None, **tiling):
    return projected_attention_kernels.projected_attention(y, weight, bias, n_heads, k_cache, v_cache, mask, **tiling)


register("qkv_rope", [Candidate("triton", _triton_qkv_rope, CUDA, available=triton_ok),
                      Candidate("torch", _torch_qkv_rope)])
register("qkv_norm_rope", [Candidate("triton", _triton_qkv_rope, CUDA, available=triton_ok),
                           Candidate("torch", _torch_qkv_norm_rope)])
# A few-row attention block's input projection and its attention as one kernel (kernels/candidates/
# projected_attention.py, GR00T's DiT): profiled-only, as on the H200 the two ops win (kernels/candidates/README.md).
register("projected_attention", [
    *(Candidate(name, functools.partial(_triton_projected_attention, **tiling), CUDA, available=triton_ok,
                profiled_only=True, supports=_projected_attention_fits)
      for name, tiling in (("fused", {}), ("fused_w8", {"num_warps": 8}), ("fused_s2", {"splits": 2}),
                           ("fused_s8", {"splits": 8}))),
    Candidate("unfused", _unfused_projected_attention)])
register("attention_with_prefix", [
    *(Candidate(name, functools.partial(_triton_attention_with_prefix, **tiling), CUDA, available=triton_ok)
      for name, tiling in ATTENTION_TILINGS.items()),
    Candidate("torch", _torch_attention_with_prefix)])
# The expert's attention from its QKV projection, RoPE applied as q and k are loaded; else qkv_rope first
# (the default: on the H200 the rotation inside the key loop costs more than the separate rope kernel).
register("rope_attention_with_prefix", [
    *(Candidate(name, functools.partial(_triton_rope_attention, **tiling), CUDA, available=triton_ok,
                supports=_rope_attention_fits, profiled_only=True) for name, tiling in ATTENTION_TILINGS.items()),
    Candidate("unfused", _unfused_rope_attention)])
# Short attention (GR00T's DiT and backbone) by short_attention_tiling's rule where no profile speaks; long
# attention (the pi prefix) SDPA first; every split-KV tiling a profiled option.
register("attention", [
    Candidate("triton_short", _triton_short_attention, CUDA, available=triton_ok, supports=_short_attention),
    Candidate("sdpa", sdpa, CUDA),
    *(Candidate(name, functools.partial(_triton_attention, **tiling), CUDA, available=triton_ok)
      for name, tiling in PREFIX_ATTENTION_TILINGS.items()),
    Candidate("torch", ops.attention)])


# ----------------------------------------------------------------------------- what the models call
def qkv_rope(qkv: Tensor, cos: Tensor, sin: Tensor, hq: int, hkv: int, d: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Fused QKV output [B, T, (hq + 2 hkv) d] -> rotated q [B, hq, T, d], rotated k and v [B, hkv, T, d]."""
    return current_selector().call("qkv_rope", shape_key(qkv), qkv.device, qkv, cos, sin, hq, hkv, d)


def qkv_norm_rope(qkv: Tensor, cos: Tensor, sin: Tensor, hq: int, hkv: int, d: int, q_norm: Optional[Tensor] = None,
                  k_norm: Optional[Tensor] = None, eps: float = 1e-6) -> Tuple[Tensor, Tensor, Tensor]:
    """Qwen3-VL's attention input: fused QKV output [B, T, (hq + 2 hkv) d] -> q [B, hq, T, d], k and v
    [B, hkv, T, d]; q and k RMS-normalised per head (plain weights [d], the LLM; None: the vision tower), then
    rotated with cos / sin [B, T, d] (float32 allowed) in float32."""
    return current_selector().call("qkv_norm_rope", shape_key(qkv), qkv.device, qkv, cos, sin, hq, hkv, d, q_norm,
                                   k_norm, eps)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    return current_selector().call("attention", shape_key(q, k), q.device, q, k, v, mask)


def attention_with_prefix(q: Tensor, k_prefix: Tensor, v_prefix: Tensor, k_suffix: Tensor, v_suffix: Tensor,
                          mask: Optional[Tensor]) -> Tensor:
    """Attention over [prefix cache; suffix] keys without concatenating them where a kernel can."""
    return current_selector().call("attention_with_prefix", shape_key(q, k_prefix), q.device, q, k_prefix, v_prefix,
                                   k_suffix, v_suffix, mask)


def rope_attention_with_prefix(qkv: Tensor, cos: Tensor, sin: Tensor, k_prefix: Tensor, v_prefix: Tensor,
                               mask: Optional[Tensor]) -> Tensor:
    """The action expert's attention from its fused QKV projection output [B, T, (hq + 2 hkv) d]: RoPE of q
    and of the suffix keys (cos / sin [B, T, d]), then attention over [prefix cache; suffix] -> [B, hq, T, d]."""
    return current_selector().call("rope_attention_with_prefix", shape_key(qkv, k_prefix), qkv.device, qkv, cos, sin,
                                   k_prefix, v_prefix, mask)


def projected_attention(y: Tensor, weight: Weight, bias: Optional[Tensor], n_heads: int,
                        k_cache: Optional[Tensor] = None, v_cache: Optional[Tensor] = None,
                        mask: Optional[Tensor] = None) -> Tensor:
    """An attention block from its normed input: heads of linear(y, weight, bias), then attention -> [B, T, H * d].
    Self-attention (no cache): weight is the fused q / k / v projection; cross-attention: weight projects q and
    k_cache / v_cache [B, H, L, d] hold the keys and values (mask additive, per key). Where a profile picks the fused
    candidate, one kernel (kernels/candidates/projected_attention.py); quantized weights run the two ops."""
    if isinstance(weight, QuantizedWeight):
        return _unfused_projected_attention(y, weight, bias, n_heads, k_cache, v_cache, mask)
    key = shape_key(y, weight) if k_cache is None else shape_key(y, weight, k_cache)
    return current_selector().call("projected_attention", key, y.device, y, weight, bias, n_heads, k_cache, v_cache,
                                   mask)
