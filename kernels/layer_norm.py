"""LayerNorm, plain and fused with the residual add of the SigLIP vision tower.

    layer_norm:      y = (x - mean(x)) * rsqrt(var(x) + eps) * w + b
    add_layer_norm:  h_new = h + (y + bias);  normed = layer_norm(h_new)

Why: the eager LayerNorm of a bf16 activation is three kernels (upcast, fp32
``F.layer_norm``, cast back) and the residual add before it a fourth; SigLIP
runs 55 of them per image batch, each a full read and write of the tokens.  Here
one program normalizes one row (width 1152 -> a masked block of 2048) in
registers: statistics in fp32, each output rounded once to the activation dtype.

``add_layer_norm`` takes the sublayer output ``y`` *without* its bias and adds
the bias in fp32 with the residual, so the GEMM before it needs no bias epilogue
and ``h + y + bias`` is rounded once (the eager path rounds ``y + bias`` in the
GEMM, then the sum).  The norm is taken of the rounded ``h_new``, the value the
residual stream stores, as the eager path does.

Reference functions: ``layer_norm_ref``, ``add_layer_norm_ref`` (eager torch,
same dtype rules; pass fp32 tensors for an fp32 reference).
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from .common import (HAVE_TRITON, available, check_tensors, next_power_of_2, pdl, rows_view, tl, triton,
                      wait_for_producer)

__all__ = ["available", "layer_norm", "add_layer_norm", "layer_norm_ref", "add_layer_norm_ref"]

MAX_WIDTH = 16384  # one row is held in registers (single pass)


# --------------------------------------------------------------------------- reference
def layer_norm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps).to(x.dtype)


def add_layer_norm_ref(h: torch.Tensor, y: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor,
                       ln_bias: torch.Tensor, eps: float = 1e-6) -> Tuple[torch.Tensor, torch.Tensor]:
    h_new = (h.float() + (y.float() + bias.float())).to(h.dtype)
    return h_new, layer_norm_ref(h_new, weight, ln_bias, eps)


# --------------------------------------------------------------------------- kernel
if HAVE_TRITON:

    @triton.jit
    def _layer_norm_kernel(X, Y, C, HO, W, B, OUT, n_cols, sx, sy, sho, so, eps,
                           HAS_ADD: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        wait_for_producer(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_ADD:
            y = tl.load(Y + row * sy + cols, mask=mask, other=0.0).to(tl.float32)
            c = tl.load(C + cols, mask=mask, other=0.0).to(tl.float32)
            h = (x + (y + c)).to(HO.dtype.element_ty)
            tl.store(HO + row * sho + cols, h, mask=mask)
            x = h.to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        xc = tl.where(mask, x - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + row * so + cols, (xc * rstd * w + b).to(OUT.dtype.element_ty), mask=mask)


def _check_vector(name: str, t: torch.Tensor, n_cols: int) -> None:
    if t.dim() != 1 or t.shape[0] != n_cols:
        raise ValueError(f"{name} must be [{n_cols}], got {tuple(t.shape)}")


def _run(x, weight, ln_bias, eps, y=None, bias=None):
    """Launch one program per row; with y and bias given, also write x + (y + bias)."""
    check_tensors(("x", x), ("y", y), ("bias", bias), ("weight", weight), ("ln_bias", ln_bias))
    n_cols = x.shape[-1]
    block = next_power_of_2(n_cols)
    if block > MAX_WIDTH:
        raise ValueError(f"width {n_cols} > {MAX_WIDTH} not supported (single-pass row kernel)")
    add = y is not None
    for name, t in [("weight", weight), ("ln_bias", ln_bias)] + ([("bias", bias)] if add else []):
        _check_vector(name, t, n_cols)
    if add and (y.shape != x.shape or y.dtype != x.dtype):
        raise ValueError(f"y must match h ({tuple(x.shape)} {x.dtype}), got {tuple(y.shape)} {y.dtype}")
    x2 = rows_view(x, "x")
    y2 = rows_view(y, "y") if add else x2
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h_new = torch.empty_like(out) if add else out
    o2, ho2 = out.view(-1, n_cols), h_new.view(-1, n_cols)
    if x2.shape[0] > 0 and n_cols > 0:
        _layer_norm_kernel[(x2.shape[0],)](
            x2, y2, bias if add else weight, ho2, weight, ln_bias, o2, n_cols,
            x2.stride(0), y2.stride(0), ho2.stride(0), o2.stride(0), float(eps),
            HAS_ADD=add, BLOCK=block, num_warps=min(16, max(1, block // 256)), **pdl(x.device))
    return h_new, out


# --------------------------------------------------------------------------- wrappers
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm of x [..., W] with weight, bias [W] (any float dtype, upcast); output in x.dtype.

    x: fp32/fp16/bf16, last dim contiguous (rows may be strided for 2-D x).
    """
    return _run(x, weight, bias, eps)[1]


def add_layer_norm(h: torch.Tensor, y: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor,
                   ln_bias: torch.Tensor, eps: float = 1e-6) -> Tuple[torch.Tensor, torch.Tensor]:
    """Fused ``h_new = h + (y + bias)``; ``normed = layer_norm(h_new, weight, ln_bias)``.

    Returns ``(h_new, normed)`` in h.dtype (h and y share shape and dtype; bias [W]
    of any float dtype is the sublayer's, added in fp32 before the one rounding).
    """
    return _run(h, weight, ln_bias, eps, y, bias)
