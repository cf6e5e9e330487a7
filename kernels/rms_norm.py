"""Gemma-style RMSNorm, plain and fused with the residual add.

    y = x * rsqrt(mean(x^2) + eps) * (1 + w)

computed in fp32 and cast back to x's dtype (as HF/openpi ``GemmaRMSNorm``).  ``weight_offset=0``
gives Qwen's RMSNorm (``x * rsqrt(...) * w``, GR00T's backbone), the same kernel with the plain weight.

``add_rms_norm`` fuses the pre-norm residual add.  The new residual is
``x + residual`` rounded to the activation dtype -- exactly what the unfused
eager path stores (a bf16 ``+`` computes in fp32 and rounds) -- and the norm is
taken of that rounded value, so both outputs match the unfused path bit for bit
up to the order of the fp32 row sum.

Reference functions: ``rms_norm_ref``, ``add_rms_norm_ref`` (eager torch, same
dtype rules; pass fp32 tensors for an fp32 reference).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .common import (HAVE_TRITON, available, check_tensors, next_power_of_2, num_sms, pdl, rows_view, tl, triton,
                      wait_for_producer)

__all__ = ["available", "rms_norm", "add_rms_norm", "rms_norm_ref", "add_rms_norm_ref"]

MAX_WIDTH = 65536  # one row is held in registers (single pass)


# --------------------------------------------------------------------------- reference
def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, weight_offset: float = 1.0
                 ) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (weight_offset + weight.float())).to(x.dtype)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float = 1e-6, weight_offset: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    new_residual = x + residual  # in the activation dtype, like the unfused path
    return rms_norm_ref(new_residual, weight, eps, weight_offset), new_residual


# --------------------------------------------------------------------------- kernel
if HAVE_TRITON:

    @triton.jit
    def _rms_norm_kernel(X, R, W, Y, RO, n_rows, n_cols, sx, sr, sy, sro, eps,
                         HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         PDL: tl.constexpr, UNIT_OFFSET: tl.constexpr = True):
        wait_for_producer(PDL)
        pid = tl.program_id(0)
        rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = tl.arange(0, BLOCK_N)
        cmask = cols < n_cols
        mask = (rows < n_rows)[:, None] & cmask[None, :]
        x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=mask, other=0.0)
        if HAS_RES:
            r = tl.load(R + rows[:, None] * sr + cols[None, :], mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(RO.dtype.element_ty)
            tl.store(RO + rows[:, None] * sro + cols[None, :], x, mask=mask)
        xf = x.to(tl.float32)
        ms = tl.sum(xf * xf, axis=1) / n_cols
        rstd = tl.rsqrt(ms + eps)
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        if UNIT_OFFSET:  # Gemma: 1 + w; Qwen: w
            w = 1.0 + w
        y = xf * rstd[:, None] * w[None, :]
        tl.store(Y + rows[:, None] * sy + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


def _launch_cfg(n_rows: int, n_cols: int, device: torch.device):
    """Rows per program and warps: ~4K elements a program, but keep >= 2 programs
    per SM when rows are few (latency-bound shapes such as 50 expert rows)."""
    block_n = next_power_of_2(n_cols)
    if block_n > MAX_WIDTH:
        raise ValueError(f"width {n_cols} > {MAX_WIDTH} not supported (single-pass row kernel)")
    block_m = max(1, min(16, 4096 // block_n))
    target = 2 * num_sms(device)
    while block_m > 1 and triton.cdiv(n_rows, block_m) < target:
        block_m //= 2
    elems = block_m * block_n
    num_warps = 4 if elems <= 2048 else (8 if elems <= 8192 else 16)
    return block_m, block_n, num_warps


def _check_out(out: Optional[torch.Tensor], like: torch.Tensor, name: str) -> torch.Tensor:
    if out is None:
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
    if out.shape != like.shape or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(f"{name}: expected {tuple(like.shape)} {like.dtype} on {like.device}, "
                         f"got {tuple(out.shape)} {out.dtype} on {out.device}")
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension")
    return out


def _run(x, residual, weight, eps, out, residual_out, weight_offset=1.0):
    if weight_offset not in (0.0, 1.0):
        raise ValueError(f"weight_offset must be 1 (Gemma) or 0 (Qwen), got {weight_offset}")
    check_tensors(("x", x), ("residual", residual), ("weight", weight))
    n_cols = x.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != n_cols:
        raise ValueError(f"weight must be [{n_cols}], got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must match x ({tuple(x.shape)} {x.dtype}), got "
                         f"{tuple(residual.shape)} {residual.dtype}")
    x2 = rows_view(x, "x")
    out = _check_out(out, x, "out")
    y2 = rows_view(out, "out")
    if residual is not None:
        r2 = rows_view(residual, "residual")
        residual_out = _check_out(residual_out, x, "residual_out")
        ro2 = rows_view(residual_out, "residual_out")
    else:
        r2 = ro2 = x2  # unused (HAS_RES=False)
    n_rows = x2.shape[0]
    if n_rows > 0 and n_cols > 0:
        block_m, block_n, num_warps = _launch_cfg(n_rows, n_cols, x.device)
        grid = (triton.cdiv(n_rows, block_m),)
        _rms_norm_kernel[grid](
            x2, r2, weight, y2, ro2, n_rows, n_cols,
            x2.stride(0), r2.stride(0), y2.stride(0), ro2.stride(0), float(eps),
            HAS_RES=residual is not None, BLOCK_M=block_m, BLOCK_N=block_n, UNIT_OFFSET=weight_offset == 1.0,
            num_warps=num_warps, **pdl(x.device))
    return out, residual_out


# --------------------------------------------------------------------------- wrappers
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
             out: Optional[torch.Tensor] = None, weight_offset: float = 1.0) -> torch.Tensor:
    """Gemma RMSNorm of x [..., W] with weight [W]; fp32 math, output in x.dtype.

    x: fp32/fp16/bf16, last dim contiguous (rows may be strided for 2-D x);
    weight: any float dtype (upcast to fp32).  ``out`` (optional, x's shape and
    dtype) may alias x. ``weight_offset``: 1 Gemma (1 + w), 0 Qwen (plain w).
    """
    y, _ = _run(x, None, weight, eps, out, None, weight_offset)
    return y


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float = 1e-6, *, out: Optional[torch.Tensor] = None,
                 residual_out: Optional[torch.Tensor] = None, weight_offset: float = 1.0
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Fused ``new_residual = x + residual``; ``normed = rms_norm(new_residual)``.

    Returns ``(normed, new_residual)``, both in x.dtype (x and residual must share
    shape and dtype).  new_residual is rounded to x.dtype before the norm, like
    the unfused eager path.  ``residual_out`` may alias ``residual`` (in-place
    update of the residual stream); ``out`` may alias x. ``weight_offset`` as rms_norm's (0: Qwen).
    """
    return _run(x, residual, weight, eps, out, residual_out, weight_offset)
