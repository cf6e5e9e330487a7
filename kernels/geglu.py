"""Gated activations on the fused gate|up GEMM output: GeGLU (Gemma), SwiGLU (Qwen3, GR00T's backbone).

    gate_up: [..., 2*M]  (gate = [..., :M], up = [..., M:], as concatenated at load time)
    out    = gelu_tanh(gate) * up   or   silu(gate) * up       -> [..., M]

The two halves are read in place (no split/copy).  Math in fp32 with no
intermediate rounding; output in gate_up's dtype.  (Eager bf16
``F.gelu(gate, approximate="tanh") * up`` rounds the gelu to bf16 before the
product, so the fused result can differ from it by ~1 bf16 ulp; it is closer to
the fp32 reference.)  gelu_tanh(g) = 0.5 g (1 + tanh(k)) is evaluated as
g * sigmoid(2k), k = sqrt(2/pi) (g + 0.044715 g^3) -- the same function, no tanh
intrinsic needed, and exact in the tails (no 1 + tanh cancellation).

SwiGLU's silu(g) = g / (1 + exp(-g)), in fp32 as well.

Reference functions: ``geglu_ref``, ``swiglu_ref``.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .common import (HAVE_TRITON, available, check_tensors, next_power_of_2, pdl, rows_view, tl, triton,
                      wait_for_producer)

__all__ = ["available", "geglu", "geglu_ref", "swiglu", "swiglu_ref"]

ACTS = ("gelu_tanh", "silu")


def geglu_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def swiglu_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


if HAVE_TRITON:

    @triton.jit
    def gelu_tanh_f32(g):
        """gelu_tanh of fp32 g as g * sigmoid(2k) (see the module doc); also used by skinny_epilogue."""
        k = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        # exp overflow -> inf -> result 0 (correct limit)
        return g / (1.0 + tl.exp(-2.0 * k))

    @triton.jit
    def _geglu_kernel(GU, OUT, n_cols, n_col_blocks, sgu, so, BLOCK: tl.constexpr, PDL: tl.constexpr,
                      ACT: tl.constexpr = 0):
        wait_for_producer(PDL)
        pid = tl.program_id(0)
        row = (pid // n_col_blocks).to(tl.int64)
        cols = (pid % n_col_blocks) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        base = GU + row * sgu
        g = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(base + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        if ACT == 1:   # SwiGLU
            a = g / (1.0 + tl.exp(-g))
        else:
            a = gelu_tanh_f32(g)
        tl.store(OUT + row * so + cols, (a * u).to(OUT.dtype.element_ty), mask=mask)


def swiglu(gate_up: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """silu(gate_up[..., :M]) * gate_up[..., M:] -> [..., M] in gate_up.dtype (as ``geglu``)."""
    return geglu(gate_up, out=out, act="silu")


def geglu(gate_up: torch.Tensor, *, out: Optional[torch.Tensor] = None, act: str = "gelu_tanh") -> torch.Tensor:
    """gelu_tanh(gate_up[..., :M]) * gate_up[..., M:] -> [..., M] in gate_up.dtype (act "silu": SwiGLU).

    gate_up: fp32/fp16/bf16, last dim even and contiguous (2-D inputs may be
    row-strided).  ``out``: optional [..., M] buffer of the same dtype.
    """
    if act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}, got {act!r}")
    check_tensors(("gate_up", gate_up), ("out", out))
    two_m = gate_up.shape[-1]
    if two_m % 2:
        raise ValueError(f"last dim of gate_up must be even (gate|up), got {two_m}")
    m = two_m // 2
    out_shape = (*gate_up.shape[:-1], m)
    if out is None:
        out = torch.empty(out_shape, dtype=gate_up.dtype, device=gate_up.device)
    elif tuple(out.shape) != out_shape or out.dtype != gate_up.dtype:
        raise ValueError(f"out must be {out_shape} {gate_up.dtype}, got {tuple(out.shape)} {out.dtype}")
    gu2 = rows_view(gate_up, "gate_up")
    o2 = rows_view(out, "out")
    n_rows = gu2.shape[0]
    if n_rows == 0 or m == 0:
        return out
    block = min(1024, next_power_of_2(m))
    n_col_blocks = triton.cdiv(m, block)
    num_warps = 4 if block >= 512 else (2 if block >= 128 else 1)
    _geglu_kernel[(n_rows * n_col_blocks,)](
        gu2, o2, m, n_col_blocks, gu2.stride(0), o2.stride(0), BLOCK=block, num_warps=num_warps,
        ACT=ACTS.index(act), **pdl(gu2.device))
    return out
