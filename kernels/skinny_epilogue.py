"""Skinny linear layers (few rows, see skinny_linear.py) with the elementwise op that follows them fused in.

In the action expert's denoising loop (50 tokens, width 1024) every kernel costs a few microseconds of
latency plus a launch gap, and the GeGLU and the residual + norm kernels after a GEMM only re-read what
the GEMM just wrote. Here they become the GEMM's epilogue:

* ``linear_geglu``: gelu_tanh(x @ Wg^T) * (x @ Wu^T) for the load-time fused gate_up weight [Wg; Wu]
  ([2I, K]). A program for n-block j streams gate rows j*BN.. and up rows I + j*BN.. with two fp32
  accumulators. Without split-K its epilogue applies the GeGLU; with split-K both partials go to the fp32
  workspace and the reduce kernel applies it while summing. Nothing is rounded before the product (as
  kernels/geglu.py), so in bf16 it is closer to fp32 than the unfused GEMM + GeGLU.
* ``linear_add_rms_norm`` and ``linear_gated_ada_rms_norm``: the GEMM always writes fp32 split-K partials
  (also for one split) and the reduce kernel, one program per row (the whole row in one block), sums them,
  adds the residual (``residual + y`` or ``residual + y * gate``, rounded once to the activation dtype as
  kernels/rms_norm.py and kernels/ada_rms_norm.py do) and normalises that rounded residual with fp32
  statistics. The GEMM output itself is never rounded, so in bf16 these differ from the unfused path by
  about one ulp of the residual in a few elements.

* ``linear_add_layer_norm`` (GR00T's DiT, 41 rows): the same with a bias and a LayerNorm, h_new = h + (y +
  bias) rounded once (as kernels/layer_norm.py's add_layer_norm) and the LayerNorm of that rounded value.

Modulation of the gated form is per batch item ([B, W] rows, item = row // tokens_per_item).
Reference functions: ``linear_geglu_ref``, ``linear_add_rms_norm_ref``, ``linear_gated_ada_rms_norm_ref``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .common import (HAVE_TRITON, available, check_tensors, next_power_of_2, pdl, release_dependents, tl, triton,
                     wait_for_producer)
from .ada_rms_norm import check_mod, item_tokens, gated_residual_ada_rms_norm_ref
from .geglu import geglu_ref
from .layer_norm import add_layer_norm_ref
from .rms_norm import add_rms_norm_ref
from .skinny_linear import fit_stages, gemm_launch, linear_ref, skinny_partials, skinny_rows, split_plan

__all__ = ["available", "norm_from_partials", "geglu_from_partials", "linear_geglu", "linear_add_rms_norm", "linear_gated_ada_rms_norm", "linear_add_layer_norm",
           "linear_geglu_ref", "linear_add_rms_norm_ref", "linear_gated_ada_rms_norm_ref",
           "linear_add_layer_norm_ref"]

MAX_WIDTH = 16384  # the norm epilogue holds one output row in registers


# --------------------------------------------------------------------------- reference
def linear_geglu_ref(x: torch.Tensor, gate_up_w: torch.Tensor) -> torch.Tensor:
    return geglu_ref(linear_ref(x, gate_up_w))


def linear_add_rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_w: torch.Tensor,
                            eps: float = 1e-6) -> Tuple[torch.Tensor, torch.Tensor]:
    return add_rms_norm_ref(linear_ref(x, weight), residual, norm_w, eps)


def linear_gated_ada_rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, gate: torch.Tensor,
                                  scale: torch.Tensor, shift: torch.Tensor, tokens_per_item: Optional[int] = None,
                                  eps: float = 1e-6) -> Tuple[torch.Tensor, torch.Tensor]:
    return gated_residual_ada_rms_norm_ref(residual, linear_ref(x, weight), gate, scale, shift, tokens_per_item, eps)


def linear_add_layer_norm_ref(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                              ln_w: torch.Tensor, ln_b: torch.Tensor, eps: float = 1e-5
                              ) -> Tuple[torch.Tensor, torch.Tensor]:
    return add_layer_norm_ref(h, linear_ref(x, weight), bias, ln_w, ln_b, eps)


# --------------------------------------------------------------------------- kernels
if HAVE_TRITON:
    from .geglu import gelu_tanh_f32
    from .skinny_linear import prefetch_weight_rows

    @triton.jit
    def _gate_up_kernel(X, W, P, Y, M, I, K, k_per_split, sxm, swn, spk, spm, sym,
                        SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PDL: tl.constexpr, PREFETCH: tl.constexpr, LINE: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        mmask = offs_m < M
        nmask = offs_n < I
        gate_rows = W + offs_n[:, None].to(tl.int64) * swn
        up_rows = W + (offs_n[:, None] + I).to(tl.int64) * swn
        k0 = pid_k * k_per_split
        if PREFETCH:
            rows = tl.minimum(offs_n, I - 1)
            prefetch_weight_rows(W, rows, swn, k0, k_per_split, K, PDL, BLOCK_K, LINE)
            prefetch_weight_rows(W, rows + I, swn, k0, k_per_split, K, PDL, BLOCK_K, LINE)
        wait_for_producer(PDL, True)
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, k_per_split, BLOCK_K):
            k = k0 + kk + offs_k
            km = k < K
            a = tl.load(X + offs_m[:, None] * sxm + k[None, :], mask=mmask[:, None] & km[None, :], other=0.0)
            wmask = nmask[:, None] & km[None, :]
            wg = tl.load(gate_rows + k[None, :], mask=wmask, other=0.0)
            wu = tl.load(up_rows + k[None, :], mask=wmask, other=0.0)
            acc_g += tl.dot(a, tl.trans(wg), input_precision="ieee")
            acc_u += tl.dot(a, tl.trans(wu), input_precision="ieee")
        release_dependents(PDL)
        mask = mmask[:, None] & nmask[None, :]
        if SPLIT:  # workspace [splits, M, 2I]: gate partials, then up partials
            dst = P + pid_k * spk + offs_m[:, None] * spm + offs_n[None, :]
            tl.store(dst, acc_g, mask=mask)
            tl.store(dst + I, acc_u, mask=mask)
        else:
            out = gelu_tanh_f32(acc_g) * acc_u
            tl.store(Y + offs_m[:, None] * sym + offs_n[None, :], out.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _sum_splits_geglu_kernel(P, Y, M, I, SPLITS: tl.constexpr, spk, spm, sym, BLOCK: tl.constexpr,
                                 PDL: tl.constexpr):
        wait_for_producer(PDL)
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs // I
        n = offs % I
        mask = offs < M * I
        g = tl.zeros((BLOCK,), dtype=tl.float32)
        u = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(SPLITS):   # unrolled: every split's load in flight at once
            src = P + s * spk + m * spm + n
            g += tl.load(src, mask=mask, other=0.0)
            u += tl.load(src + I, mask=mask, other=0.0)
        tl.store(Y + m * sym + n, (gelu_tanh_f32(g) * u).to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _sum_splits_norm_kernel(P, R, G, SC, SH, RO, Y, N, SPLITS: tl.constexpr, tokens, spk, spm, sr, sg, ssc, ssh,
                                sro, sy, eps, ADA: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
        """One row: y = sum of the partials; r = residual + y (* gate); norm of r rounded to RO's dtype.
        Plain RMSNorm passes its weight as SC with item stride 0."""
        wait_for_producer(PDL)
        row = tl.program_id(0).to(tl.int64)
        item = row // tokens
        cols = tl.arange(0, BLOCK_N)
        mask = cols < N
        y = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for s in tl.static_range(SPLITS):   # unrolled: every split's load in flight at once
            y += tl.load(P + s * spk + row * spm + cols, mask=mask, other=0.0)
        r = tl.load(R + row * sr + cols, mask=mask, other=0.0).to(tl.float32)
        if ADA:
            r = r + y * tl.load(G + item * sg + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            r = r + y
        r = r.to(RO.dtype.element_ty)
        tl.store(RO + row * sro + cols, r, mask=mask)
        rf = r.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(rf * rf, axis=0) / N + eps)
        out = rf * rstd * (1.0 + tl.load(SC + item * ssc + cols, mask=mask, other=0.0).to(tl.float32))
        if ADA:
            out += tl.load(SH + item * ssh + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * sy + cols, out.to(Y.dtype.element_ty), mask=mask)


    @triton.jit
    def _sum_splits_layer_norm_kernel(P, C, H, W, B, HO, Y, N, SPLITS: tl.constexpr, spk, spm, sh, sho, sy, eps,
                                      BLOCK_N: tl.constexpr, PDL: tl.constexpr):
        """One row: h_new = h + (sum of the partials + bias) rounded to HO's dtype; y = LayerNorm(h_new)."""
        wait_for_producer(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_N)
        mask = cols < N
        y = tl.load(C + cols, mask=mask, other=0.0).to(tl.float32)
        for s in tl.static_range(SPLITS):   # unrolled: every split's load in flight at once
            y += tl.load(P + s * spk + row * spm + cols, mask=mask, other=0.0)
        h = tl.load(H + row * sh + cols, mask=mask, other=0.0).to(tl.float32)
        h = (h + y).to(HO.dtype.element_ty)
        tl.store(HO + row * sho + cols, h, mask=mask)
        hf = h.to(tl.float32)
        mean = tl.sum(hf, axis=0) / N
        hc = tl.where(mask, hf - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(hc * hc, axis=0) / N + eps)
        out = hc * rstd * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        out += tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * sy + cols, out.to(Y.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- wrappers
def linear_geglu(x: torch.Tensor, gate_up_w: torch.Tensor, *, block_n: int = 64, block_k: int = 128,
                 num_warps: int = 4, num_stages: int = 3, splits: Optional[int] = None,
                 prefetch: bool = False) -> torch.Tensor:
    """gelu_tanh(x @ Wg^T) * (x @ Wu^T) for gate_up_w = [Wg; Wu] [2I, K]; x [..., K] (<= 64 rows) -> [..., I]
    in x.dtype."""
    two_i, k = gate_up_w.shape
    if two_i % 2:
        raise ValueError(f"gate_up_w must have an even number of rows (gate | up), got {two_i}")
    x2 = skinny_rows(x, gate_up_w, two_i)
    m, i = x2.shape[0], two_i // 2
    n_blocks = triton.cdiv(i, block_n)
    block_m, s, k_per = split_plan(m, n_blocks, k, block_k, x.device, splits)
    y = torch.empty(m, i, dtype=x.dtype, device=x.device)
    part = y if s == 1 else torch.empty(s, m, two_i, dtype=torch.float32, device=x.device)
    num_stages = fit_stages(num_stages, block_m, 2 * block_n, block_k, gate_up_w.element_size())
    _gate_up_kernel[(n_blocks, s)](x2, gate_up_w, part, y, m, i, k, k_per, x2.stride(0), gate_up_w.stride(0),
                                   part.stride(0) if s > 1 else 0, two_i, i, SPLIT=s > 1, BLOCK_M=block_m,
                                   BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
                                   **gemm_launch(gate_up_w, prefetch))
    if s > 1:
        block = 1024
        _sum_splits_geglu_kernel[(triton.cdiv(m * i, block),)](part, y, m, i, s, part.stride(0), two_i, i,
                                                               BLOCK=block, **pdl(x.device))
    return y.view(*x.shape[:-1], i)


def _residual_rows(residual: torch.Tensor, m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    if residual.numel() != m * n or residual.shape[-1] != n or residual.dtype != dtype:
        raise ValueError(f"residual must hold {m} rows of [{n}] {dtype}, got {tuple(residual.shape)} "
                         f"{residual.dtype}")
    return residual.reshape(m, n)


def _norm_epilogue(x, weight, residual, mod, norm_w, tokens_per_item, eps, tiling):
    """GEMM partials, then the row kernel; mod = (gate, scale, shift) [B, N] or None (plain RMSNorm)."""
    x2 = skinny_rows(x, weight, weight.shape[0])
    return norm_from_partials(skinny_partials(x2, weight, **tiling), x, residual, mod, norm_w, tokens_per_item, eps)


def norm_from_partials(part: torch.Tensor, x: torch.Tensor, residual: torch.Tensor, mod, norm_w, tokens_per_item,
                       eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """The residual + norm epilogue over fp32 GEMM partials [S, M, N] (any GEMM that writes them, e.g.
    kernels/quant_linear.py's): returns (normed, new residual) in x.dtype. mod = (gate, scale, shift) [B, N]
    (adaRMS) or None (plain RMSNorm with norm_w)."""
    _, m, n = part.shape
    check_tensors(("residual", residual), ("norm_w", norm_w),
                  *(zip(("gate", "scale", "shift"), mod) if mod else ()))
    block_n = next_power_of_2(n)
    if block_n > MAX_WIDTH:
        raise ValueError(f"output width {n} > {MAX_WIDTH} not supported (one row per program)")
    r2 = _residual_rows(residual, m, n, x.dtype)
    if mod:
        for name, t in zip(("gate", "scale", "shift"), mod):
            check_mod(t, name, n)
        if not mod[0].shape[0] == mod[1].shape[0] == mod[2].shape[0]:
            raise ValueError("gate, scale and shift must have the same B")
        gate, scale, shift = mod
        tokens = item_tokens(m, gate.shape[0], tokens_per_item)
    else:
        if norm_w.shape != (n,):
            raise ValueError(f"norm weight must be [{n}], got {tuple(norm_w.shape)}")
        gate = scale = shift = norm_w
        tokens = max(m, 1)
    new_res = torch.empty(residual.shape, dtype=x.dtype, device=x.device)
    normed = torch.empty(residual.shape, dtype=x.dtype, device=x.device)
    ro2, y2 = new_res.view(m, n), normed.view(m, n)
    stride0 = lambda t: t.stride(0) if mod else 0  # noqa: E731  plain RMSNorm: one weight row for all
    _sum_splits_norm_kernel[(m,)](part, r2, gate, scale, shift, ro2, y2, n, part.shape[0], tokens,
                                  part.stride(0), part.stride(1), r2.stride(0), stride0(gate), stride0(scale),
                                  stride0(shift), ro2.stride(0), y2.stride(0), float(eps),
                                  ADA=bool(mod), BLOCK_N=block_n, num_warps=4 if block_n <= 2048 else 8,
                                  **pdl(x.device))
    return normed, new_res


def geglu_from_partials(part: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up from fp32 GEMM partials [S, M, 2I] of a [gate; up] weight -> [..., I] in x.dtype."""
    s, m, two_i = part.shape
    i = two_i // 2
    y = torch.empty(m, i, dtype=x.dtype, device=x.device)
    block = 1024
    _sum_splits_geglu_kernel[(triton.cdiv(m * i, block),)](part, y, m, i, s, part.stride(0), two_i, i,
                                                           BLOCK=block, **pdl(x.device))
    return y.view(*x.shape[:-1], i)


def linear_add_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_w: torch.Tensor,
                        eps: float = 1e-6, **tiling) -> Tuple[torch.Tensor, torch.Tensor]:
    """r = residual + x @ weight^T (rounded once to x.dtype); returns (Gemma rms_norm(r, norm_w), r).

    x [..., K] (<= 64 rows), weight [N, K] of x's dtype, residual with x's rows of [N] in x.dtype, norm_w [N]
    of any float dtype. ``tiling``: block_n / block_k / num_warps / num_stages / splits / prefetch of the GEMM.
    """
    return _norm_epilogue(x, weight, residual, None, norm_w, None, eps, tiling)


def linear_gated_ada_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, gate: torch.Tensor,
                              scale: torch.Tensor, shift: torch.Tensor, tokens_per_item: Optional[int] = None,
                              eps: float = 1e-6, **tiling) -> Tuple[torch.Tensor, torch.Tensor]:
    """r = residual + (x @ weight^T) * gate[b] (rounded once to x.dtype); returns (r, ada_rms_norm(r, scale,
    shift)) -- the order of ``gated_residual_ada_rms_norm``. gate / scale / shift: [B, N] per item, any float
    dtype, row-strided views allowed; the item of a row is row // tokens_per_item (None: rows // B)."""
    normed, new_res = _norm_epilogue(x, weight, residual, (gate, scale, shift), None, tokens_per_item, eps, tiling)
    return new_res, normed


def linear_add_layer_norm(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                          ln_w: torch.Tensor, ln_b: torch.Tensor, eps: float = 1e-5, **tiling
                          ) -> Tuple[torch.Tensor, torch.Tensor]:
    """h_new = h + (x @ weight^T + bias) (rounded once to x.dtype); returns (h_new, layer_norm(h_new, ln_w,
    ln_b)) -- the order of layers' ``linear_add_layer_norm``. x [..., K] (<= 64 rows), weight [N, K] of x's
    dtype, h with x's rows of [N] in x.dtype, bias / ln_w / ln_b [N] of any float dtype."""
    n = weight.shape[0]
    x2 = skinny_rows(x, weight, n)
    m = x2.shape[0]
    check_tensors(("h", h), ("bias", bias), ("ln_w", ln_w), ("ln_b", ln_b))
    for name, t in (("bias", bias), ("ln_w", ln_w), ("ln_b", ln_b)):
        if t.shape != (n,):
            raise ValueError(f"{name} must be [{n}], got {tuple(t.shape)}")
    block_n = next_power_of_2(n)
    if block_n > MAX_WIDTH:
        raise ValueError(f"output width {n} > {MAX_WIDTH} not supported (one row per program)")
    h2 = _residual_rows(h, m, n, x.dtype)
    part = skinny_partials(x2, weight, **tiling)
    new_h = torch.empty(h.shape, dtype=x.dtype, device=x.device)
    normed = torch.empty(h.shape, dtype=x.dtype, device=x.device)
    ho2, y2 = new_h.view(m, n), normed.view(m, n)
    _sum_splits_layer_norm_kernel[(m,)](part, bias, h2, ln_w, ln_b, ho2, y2, n, part.shape[0], part.stride(0),
                                        part.stride(1), h2.stride(0), ho2.stride(0), y2.stride(0), float(eps),
                                        BLOCK_N=block_n, num_warps=4 if block_n <= 2048 else 8, **pdl(x.device))
    return new_h, normed
