"""Adaptive RMSNorm of the pi0.5 action expert, plain and fused with the gated residual.

    ada_rms_norm:   y = rms(x) * (1 + scale[b]) + shift[b],  rms(x) = x * rsqrt(mean(x^2) + eps)
    gated residual: new_residual = residual + y_sub * gate[b]

with b = row // tokens_per_item (modulation is per batch item, broadcast over its
tokens; rows = B * tokens_per_item).  No weight vector.  Norm math in fp32, output
cast to x's dtype (as openpi's ``GemmaRMSNorm`` with ``cond``).

``gated_residual_ada_rms_norm`` fuses the residual update after a sublayer with
the next AdaRMSNorm.  The new residual ``residual + y * gate`` is computed in
fp32 (one FMA on the GPU) and rounded ONCE to the activation dtype; the norm is
taken of that rounded new residual.  The unfused eager bf16 path rounds the
product ``y * gate`` to bf16 first, so the two differ by 1 bf16 ulp in a small
fraction of elements (the fused value is the correctly rounded one).  (Writing
the double rounding out explicitly did not reproduce eager bit for bit on the
H200 -- the compiler is free to narrow and contract it -- so no bit-exactness
with eager is promised here.)  In fp32 both agree to ~1 ulp.

scale / shift / gate are [B, W] with a contiguous last dim and any row stride,
so column chunks of one [B, 3W] modulation tensor are passed without a copy.

Reference functions: ``ada_rms_norm_ref``, ``gated_residual_ada_rms_norm_ref``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .common import (HAVE_TRITON, available, check_tensors, next_power_of_2, num_sms, pdl, rows_view, tl, triton,
                      wait_for_producer)

__all__ = ["available", "ada_rms_norm", "gated_residual_ada_rms_norm",
           "ada_rms_norm_ref", "gated_residual_ada_rms_norm_ref"]

MAX_WIDTH = 65536


# --------------------------------------------------------------------------- reference
def _per_item(t: torch.Tensor, tokens_per_item: int) -> torch.Tensor:
    """[B*T, W] -> [B, T, W] view (modulation [B, W] then broadcasts as [B, 1, W])."""
    return t.reshape(-1, tokens_per_item, t.shape[-1])


def ada_rms_norm_ref(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                     tokens_per_item: Optional[int] = None, eps: float = 1e-6) -> torch.Tensor:
    """Eager AdaRMSNorm (fp32 math, output in x.dtype); also the bench baseline."""
    x2 = x.reshape(-1, x.shape[-1])
    t = item_tokens(x2.shape[0], scale.shape[0], tokens_per_item)
    xf = _per_item(x2, t).float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = y * (1.0 + scale[:, None, :].float()) + shift[:, None, :].float()
    return y.to(x.dtype).reshape(x.shape)


def gated_residual_ada_rms_norm_ref(residual: torch.Tensor, y: torch.Tensor, gate: torch.Tensor,
                                    scale: torch.Tensor, shift: torch.Tensor,
                                    tokens_per_item: Optional[int] = None, eps: float = 1e-6
                                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eager ``residual + y * gate`` in the activation dtype (the unfused path: the
    product is rounded, then the sum), then AdaRMSNorm."""
    r2 = residual.reshape(-1, residual.shape[-1])
    t = item_tokens(r2.shape[0], gate.shape[0], tokens_per_item)
    prod = (_per_item(y.reshape(r2.shape), t) * gate[:, None, :]).to(residual.dtype)
    new_residual = (_per_item(r2, t) + prod).to(residual.dtype).reshape(residual.shape)
    return new_residual, ada_rms_norm_ref(new_residual, scale, shift, t, eps)


# --------------------------------------------------------------------------- kernel
if HAVE_TRITON:

    @triton.jit
    def _ada_rms_norm_kernel(X, YS, G, SC, SH, OUT, RO, n_rows, n_cols, tokens,
                             sx, sys, sg, ssc, ssh, so, sro, eps,
                             GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             PDL: tl.constexpr):
        wait_for_producer(PDL)
        pid = tl.program_id(0)
        rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rmask = rows < n_rows
        item = rows // tokens
        cols = tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols < n_cols)[None, :]
        x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=mask, other=0.0)
        if GATED:
            ysub = tl.load(YS + rows[:, None] * sys + cols[None, :], mask=mask, other=0.0)
            g = tl.load(G + item[:, None] * sg + cols[None, :], mask=mask, other=0.0)
            # fp32 (GPU: one FMA), rounded once to the activation dtype
            x = (x.to(tl.float32) + ysub.to(tl.float32) * g.to(tl.float32)).to(RO.dtype.element_ty)
            tl.store(RO + rows[:, None] * sro + cols[None, :], x, mask=mask)
        xf = x.to(tl.float32)
        ms = tl.sum(xf * xf, axis=1) / n_cols
        rstd = tl.rsqrt(ms + eps)
        sc = tl.load(SC + item[:, None] * ssc + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        sh = tl.load(SH + item[:, None] * ssh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = xf * rstd[:, None] * (1.0 + sc) + sh
        tl.store(OUT + rows[:, None] * so + cols[None, :], y.to(OUT.dtype.element_ty), mask=mask)


def item_tokens(n_rows: int, n_items: int, tokens_per_item: Optional[int]) -> int:
    if tokens_per_item is None:
        if n_items <= 0 or n_rows % n_items:
            raise ValueError(f"{n_rows} rows are not a whole number of tokens per item for B={n_items}")
        tokens_per_item = n_rows // n_items
    if tokens_per_item <= 0 or n_rows != n_items * tokens_per_item:
        raise ValueError(f"rows ({n_rows}) must equal B ({n_items}) * tokens_per_item ({tokens_per_item})")
    return int(tokens_per_item)


def check_mod(t: torch.Tensor, name: str, n_cols: int) -> None:
    if t.dim() != 2 or t.shape[1] != n_cols:
        raise ValueError(f"{name} must be [B, {n_cols}], got {tuple(t.shape)}")


def _new_or_check(out: Optional[torch.Tensor], like: torch.Tensor, name: str) -> torch.Tensor:
    if out is None:
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
    if out.shape != like.shape or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(f"{name}: expected {tuple(like.shape)} {like.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension")
    return out


def _launch(x2, ys2, g, sc, sh, o2, ro2, tokens, eps, gated):
    n_rows, n_cols = x2.shape
    if n_rows == 0 or n_cols == 0:
        return
    block_n = next_power_of_2(n_cols)
    if block_n > MAX_WIDTH:
        raise ValueError(f"width {n_cols} > {MAX_WIDTH} not supported (single-pass row kernel)")
    block_m = max(1, min(16, 4096 // block_n))
    target = 2 * num_sms(x2.device)
    while block_m > 1 and triton.cdiv(n_rows, block_m) < target:
        block_m //= 2
    elems = block_m * block_n
    num_warps = 4 if elems <= 2048 else (8 if elems <= 8192 else 16)
    _ada_rms_norm_kernel[(triton.cdiv(n_rows, block_m),)](
        x2, ys2, g, sc, sh, o2, ro2, n_rows, n_cols, tokens,
        x2.stride(0), ys2.stride(0), g.stride(0), sc.stride(0), sh.stride(0),
        o2.stride(0), ro2.stride(0), float(eps),
        GATED=gated, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, **pdl(x2.device))


# --------------------------------------------------------------------------- wrappers
def ada_rms_norm(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                 tokens_per_item: Optional[int] = None, eps: float = 1e-6, *,
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """AdaRMSNorm of x [rows, W] (or [..., W] flattened to rows) with per-item
    scale/shift [B, W]; item of a row = row // tokens_per_item (None: rows // B).

    fp32 math; output in x.dtype.  scale/shift: any float dtype, last dim
    contiguous, any row stride (chunks of a [B, 3W] modulation are fine).
    """
    check_tensors(("x", x), ("scale", scale), ("shift", shift))
    n_cols = x.shape[-1]
    check_mod(scale, "scale", n_cols)
    check_mod(shift, "shift", n_cols)
    if shift.shape[0] != scale.shape[0]:
        raise ValueError("scale and shift must have the same B")
    x2 = rows_view(x, "x")
    t = item_tokens(x2.shape[0], scale.shape[0], tokens_per_item)
    out = _new_or_check(out, x, "out")
    o2 = rows_view(out, "out")
    _launch(x2, x2, scale, scale, shift, o2, o2, t, eps, gated=False)
    return out


def gated_residual_ada_rms_norm(residual: torch.Tensor, y: torch.Tensor, gate: torch.Tensor,
                                scale: torch.Tensor, shift: torch.Tensor,
                                tokens_per_item: Optional[int] = None, eps: float = 1e-6, *,
                                out: Optional[torch.Tensor] = None,
                                residual_out: Optional[torch.Tensor] = None
                                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Fused ``new_residual = residual + y * gate[b]``; ``normed = ada_rms_norm(new_residual, scale, shift)``.

    Returns ``(new_residual, normed)`` (note: the order differs from
    ``add_rms_norm``), both in residual.dtype; y must match residual's shape and
    dtype.  gate/scale/shift: [B, W], any float dtype, row-strided views allowed.
    new_residual = fp32 ``residual + y * gate`` rounded once to residual.dtype
    (eager bf16 rounds the product too: <= 1 ulp apart, see module doc).  ``residual_out`` may alias ``residual``
    (in-place residual stream); ``out`` may alias y.
    """
    check_tensors(("residual", residual), ("y", y), ("gate", gate), ("scale", scale), ("shift", shift))
    n_cols = residual.shape[-1]
    if y.shape != residual.shape or y.dtype != residual.dtype:
        raise ValueError(f"y must match residual ({tuple(residual.shape)} {residual.dtype}), "
                         f"got {tuple(y.shape)} {y.dtype}")
    for name, t in (("gate", gate), ("scale", scale), ("shift", shift)):
        check_mod(t, name, n_cols)
        if t.shape[0] != gate.shape[0]:
            raise ValueError("gate, scale and shift must have the same B")
    r2 = rows_view(residual, "residual")
    y2 = rows_view(y, "y")
    t = item_tokens(r2.shape[0], gate.shape[0], tokens_per_item)
    out = _new_or_check(out, residual, "out")
    residual_out = _new_or_check(residual_out, residual, "residual_out")
    _launch(r2, y2, gate, scale, shift, rows_view(out, "out"), rows_view(residual_out, "residual_out"),
            t, eps, gated=True)
    return residual_out, out
