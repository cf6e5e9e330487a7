"""Fused QKV split + rotary embedding for the Gemma stacks.

    qkv  [B, T, (Hq + 2*Hkv) * D]   output of the fused QKV GEMM (q heads, k heads, v heads)
    cos, sin [B, T, D]              rotary tables (halves duplicated, rotate-half convention)
    -> q [B, Hq, T, D], k [B, Hkv, T, D] rotated and head-major, v a strided view of qkv

With ``q_norm`` / ``k_norm`` (Qwen3's per-head RMSNorm of q and k, plain weight [D]) each head is normalised
before it is rotated, in the same pass: GR00T's Qwen3-VL LLM (mRoPE: the interleaving lives in the cos / sin
tables, the rotation is this one). Its vision tower (2-D RoPE, no norm) uses it as it is.

Unfused this is a split, two transposes and, per tensor, a negate, a concat, two
multiplies and an add (about ten kernels per layer); here it is one launch.
Math in fp32, one rounding to the output dtype (eager bf16 rounds each step, so
results can differ by ~1 ulp). Reference: ``qkv_rope_ref``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .common import HAVE_TRITON, available, check_tensors, next_power_of_2, pdl, tl, triton, wait_for_producer
from .rms_norm import rms_norm_ref

__all__ = ["available", "qkv_rope", "qkv_rope_ref", "rope_plan"]


def split_heads(qkv: torch.Tensor, hq: int, hkv: int, d: int):
    """Fused QKV output [B, T, (hq + 2 hkv) d] -> q [B, hq, T, d], k, v [B, hkv, T, d] as strided views."""
    b, t, _ = qkv.shape
    q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
    return (q.view(b, t, hq, d).transpose(1, 2), k.view(b, t, hkv, d).transpose(1, 2),
            v.view(b, t, hkv, d).transpose(1, 2))


def qkv_rope_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int, d: int,
                 q_norm: Optional[torch.Tensor] = None, k_norm: Optional[torch.Tensor] = None, eps: float = 1e-6
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = split_heads(qkv, hq, hkv, d)
    if q_norm is not None:
        q, k = rms_norm_ref(q, q_norm, eps, weight_offset=0.0), rms_norm_ref(k, k_norm, eps, weight_offset=0.0)

    def rope(x):
        half = d // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos.unsqueeze(1) + rot * sin.unsqueeze(1)

    return rope(q), rope(k), v


if HAVE_TRITON:

    @triton.jit
    def _qkv_rope_kernel(QKV, COS, SIN, Q, K, n_rows, T, HQ, HKV, sqb, sqt, scb, sct, sob_q, soh_q, sot_q,
                         sob_k, soh_k, sot_k, QN, KN, eps, HALF: tl.constexpr, BLOCK: tl.constexpr,
                         ROWS: tl.constexpr, PDL: tl.constexpr, NORM: tl.constexpr = False):
        wait_for_producer(PDL)
        # ROWS rows of the flattened (b, t, head) index of q and k heads per program: one (b, t, head) each
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        live = r < n_rows
        heads = HQ + HKV
        h = r % heads
        bt = r // heads
        b = (bt // T).to(tl.int64)
        t = (bt % T).to(tl.int64)
        is_q = h < HQ
        offs = tl.arange(0, BLOCK)
        m = live[:, None] & (offs < HALF)[None, :]
        src = (QKV + b * sqb + t * sqt + h * (2 * HALF))[:, None] + offs[None, :]
        x1 = tl.load(src, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF, mask=m, other=0.0).to(tl.float32)
        if NORM:  # Qwen3 q / k RMSNorm of the head (plain weight), fp32
            rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
            hm = offs < HALF
            q1 = tl.load(QN + offs, mask=hm, other=0.0).to(tl.float32)[None, :]
            q2 = tl.load(QN + HALF + offs, mask=hm, other=0.0).to(tl.float32)[None, :]
            k1 = tl.load(KN + offs, mask=hm, other=0.0).to(tl.float32)[None, :]
            k2 = tl.load(KN + HALF + offs, mask=hm, other=0.0).to(tl.float32)[None, :]
            x1 = x1 * rstd[:, None] * tl.where(is_q[:, None], q1, k1)
            x2 = x2 * rstd[:, None] * tl.where(is_q[:, None], q2, k2)
        tab = (b * scb + t * sct)[:, None] + offs[None, :]
        c1 = tl.load(COS + tab, mask=m, other=0.0).to(tl.float32)
        c2 = tl.load(COS + HALF + tab, mask=m, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + tab, mask=m, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + HALF + tab, mask=m, other=0.0).to(tl.float32)
        o1 = (x1 * c1 - x2 * s1).to(Q.dtype.element_ty)
        o2 = (x2 * c2 + x1 * s2).to(Q.dtype.element_ty)
        q_dst = (Q + b * sob_q + h.to(tl.int64) * soh_q + t * sot_q)[:, None] + offs[None, :]
        k_dst = (K + b * sob_k + (h - HQ).to(tl.int64) * soh_k + t * sot_k)[:, None] + offs[None, :]
        tl.store(q_dst, o1, mask=m & is_q[:, None])
        tl.store(q_dst + HALF, o2, mask=m & is_q[:, None])
        tl.store(k_dst, o1, mask=m & ~is_q[:, None])
        tl.store(k_dst + HALF, o2, mask=m & ~is_q[:, None])


# One (b, t, head) row per program made ~8K programs of one warp at GR00T's vision tower (256 patches x 32 heads):
# ~10.6 us per call for 1.5 MB on an H200, 11.2 us at pi0.5's 968-token prefix. Blocks of rows of about 512 elements
# per half-head measured best at every large shape (H200, 2026-12-02, `bench_kernels.py --rope-sweep`: 1.45, 3.0-3.3
# and 1.56 us at the vision tower, the prefix and Qwen3's LLM); below _BLOCKED_FROM rows (pi0.5's 450 expert rows)
# a row per program stays: the blocked launch was ~0.1-0.2 us faster alone but slower inside the expert's PDL chain.
_TILE = 512
_BLOCKED_FROM = 2048


def rope_plan(n_rows: int, block: int) -> Tuple[int, int]:
    """(rows per program, warps) for ``n_rows`` (token, head) rows of ``block`` elements per half."""
    if n_rows < _BLOCKED_FROM:
        return 1, 1 if block <= 64 else 2
    return max(1, _TILE // block), 4


def qkv_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int, d: int,
             q_norm: Optional[torch.Tensor] = None, k_norm: Optional[torch.Tensor] = None, eps: float = 1e-6, *,
             rows: Optional[int] = None, num_warps: Optional[int] = None
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One launch: q, k (RMS-normalised per head first when q_norm / k_norm [D] are given) rotated into new
    [B, H, T, D] tensors; v returned as a view of qkv. cos / sin may be float32 for a bf16 qkv. ``rows`` (a power
    of two: (token, head) rows per program) and ``num_warps`` override the launch plan (``rope_plan``)."""
    check_tensors(("qkv", qkv), ("cos", cos), ("sin", sin), ("q_norm", q_norm), ("k_norm", k_norm))
    if (q_norm is None) != (k_norm is None) or (q_norm is not None and (q_norm.shape != (d,)
                                                                        or k_norm.shape != (d,))):
        raise ValueError(f"q_norm and k_norm: both [{d}] or both None, got "
                         f"{None if q_norm is None else tuple(q_norm.shape)} / "
                         f"{None if k_norm is None else tuple(k_norm.shape)}")
    if not HAVE_TRITON:
        raise RuntimeError("triton is not importable here; use qkv_rope_ref")
    b, t, n = qkv.shape
    if n != (hq + 2 * hkv) * d or d % 2:
        raise ValueError(f"qkv last dim {n} != (Hq + 2 Hkv) * D = ({hq} + 2*{hkv}) * {d} with even D")
    if cos.shape != (b, t, d) or sin.shape != cos.shape or cos.stride(-1) != 1 or sin.stride() != cos.stride():
        raise ValueError(f"cos/sin must be [B={b}, T={t}, D={d}] with the same strides")
    q = torch.empty(b, hq, t, d, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(b, hkv, t, d, dtype=qkv.dtype, device=qkv.device)
    half = d // 2
    block = max(16, next_power_of_2(half))
    n_rows = b * t * (hq + hkv)
    if n_rows == 0:
        return q, k, split_heads(qkv, hq, hkv, d)[2]
    plan_rows, plan_warps = rope_plan(n_rows, block)
    rows, num_warps = rows or plan_rows, num_warps or plan_warps
    _qkv_rope_kernel[(triton.cdiv(n_rows, rows),)](
        qkv, cos, sin, q, k, n_rows, t, hq, hkv, qkv.stride(0), qkv.stride(1), cos.stride(0), cos.stride(1),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        cos if q_norm is None else q_norm, cos if k_norm is None else k_norm, float(eps), NORM=q_norm is not None,
        HALF=half, BLOCK=block, ROWS=rows, num_warps=num_warps, **pdl(qkv.device))
    return q, k, split_heads(qkv, hq, hkv, d)[2]
