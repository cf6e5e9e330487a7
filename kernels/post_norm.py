"""A LayerNorm between two few-row GEMMs applied after the second GEMM's dot, so that it needs no kernel of its own.

GR00T's DiT block ends its attention half with ``h_new = h + a @ Wo^T + bo`` and starts its MLP with
``gelu_tanh(LN(h_new) @ Wu^T + bu)``, LN without affine. Today that is three kernels (the output GEMM's split-K,
a reduce kernel that adds the residual and normalises, the GELU-up GEMM). Because the LayerNorm is affine per row,

    LN(h) @ Wu^T = rstd * (h @ Wu^T - mean * colsum(Wu)),      colsum(Wu)[n] = sum_k Wu[n, k]

the up-projection can run on the residual stream itself and normalise its fp32 accumulator in the epilogue, given
each row's mean and rstd. Two kernels remain:

* ``residual_with_stats``: y = a @ Wo^T over all of K in one program per column block, the epilogue adds the bias
  and the residual (rounded once, as ``ops.layer_norm``'s reference add) and writes, per row, the block's mean and
  sum of squared deviations (Chan's parallel form: no cancellation, no float atomics, deterministic);
* ``norm_linear_gelu``: merges those per-block statistics into each row's mean and rstd, streams Wu against the
  bf16 residual rows, and applies rstd, the mean correction, the bias and GELU-tanh to the accumulator.

Rounding differs from the three-kernel path (the normalised activations are never rounded to bf16 before the
GEMM); against fp32 it is as close or closer. ``colsum`` is a property of the weight, made once at load (fp32).
References: ``residual_with_stats_ref``, ``norm_linear_gelu_ref``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .common import HAVE_TRITON, available, check_tensors, pdl, release_dependents, tl, triton, wait_for_producer
from .skinny_linear import fit_stages, skinny_rows, split_plan

__all__ = ["available", "residual_with_stats", "norm_linear_gelu", "residual_with_stats_ref", "norm_linear_gelu_ref",
           "merge_stats_ref", "column_sums"]


# --------------------------------------------------------------------------- references
def column_sums(weight: torch.Tensor) -> torch.Tensor:
    """colsum(W) [N] in fp32 of a [N, K] weight, summed from its stored values."""
    return weight.float().sum(dim=1)


def residual_with_stats_ref(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                            block_n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(h_new, stats): h_new = h + (x @ W^T + b) rounded once to h's dtype; stats [2, N / block_n, M] fp32, per
    column block the rows' mean and sum of squared deviations of the rounded h_new."""
    y = x.float() @ weight.float().T
    if bias is not None:
        y = y + bias.float()
    h_new = (h.float() + y).to(h.dtype)
    m = h_new.shape[-1]
    blocks = h_new.float().reshape(-1, m // block_n, block_n)
    mean = blocks.mean(-1)
    m2 = (blocks - mean[..., None]).pow(2).sum(-1)
    return h_new, torch.stack([mean.T, m2.T]).contiguous()


def merge_stats_ref(stats: torch.Tensor, block_n: int, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each row's (mean, rstd) from per-block means and squared-deviation sums of equal-width blocks."""
    means, m2 = stats[0], stats[1]
    mean = means.mean(0)
    var = (m2.sum(0) + block_n * (means - mean).pow(2).sum(0)) / (block_n * means.shape[0])
    return mean, torch.rsqrt(var + eps)


def norm_linear_gelu_ref(h: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float
                         ) -> torch.Tensor:
    """gelu_tanh(LayerNorm(h) @ W^T + b), LN without affine, in fp32, rounded to h's dtype."""
    hf = h.float()
    y = torch.nn.functional.layer_norm(hf, (hf.shape[-1],), eps=eps) @ weight.float().T
    if bias is not None:
        y = y + bias.float()
    return torch.nn.functional.gelu(y, approximate="tanh").to(h.dtype)


# --------------------------------------------------------------------------- kernels
if HAVE_TRITON:
    from .geglu import gelu_tanh_f32
    from .skinny_linear import rows_times_weight

    @triton.jit
    def _residual_stats_kernel(X, W, B, H, HOUT, STATS, M, N, K, sxm, swn, shm, sho, n_blocks,
                               HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        pid_n = tl.program_id(0)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mmask = offs_m < M
        nmask = offs_n < N
        wait_for_producer(PDL, True)
        acc = rows_times_weight(X, sxm, W, swn, offs_m, mmask, offs_n, nmask, K, BLOCK_M, BLOCK_N, BLOCK_K)
        release_dependents(PDL)
        if HAS_BIAS:
            acc += tl.load(B + offs_n).to(tl.float32)[None, :]
        mask = mmask[:, None] & nmask[None, :]
        hv = tl.load(H + offs_m[:, None] * shm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        hn = (hv + acc).to(HOUT.dtype.element_ty)
        tl.store(HOUT + offs_m[:, None] * sho + offs_n[None, :], hn, mask=mask)
        hf = hn.to(tl.float32)
        mean = tl.sum(hf, axis=1) / BLOCK_N
        d = hf - mean[:, None]
        tl.store(STATS + pid_n * M + offs_m, mean, mask=mmask)
        tl.store(STATS + (n_blocks + pid_n) * M + offs_m, tl.sum(d * d, axis=1), mask=mmask)

    @triton.jit
    def _norm_gemm_gelu_kernel(H, W, B, CS, STATS, Y, M, N, K, shm, swn, sym, n_stats, stat_width, eps,
                               HAS_BIAS: tl.constexpr, STATS_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        pid_n = tl.program_id(0)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mmask = offs_m < M
        nmask = offs_n < N
        wait_for_producer(PDL, True)
        acc = rows_times_weight(H, shm, W, swn, offs_m, mmask, offs_n, nmask, K, BLOCK_M, BLOCK_N, BLOCK_K)
        release_dependents(PDL)
        # each row's mean and rstd from the producer's equal-width blocks (Chan's merge)
        q = tl.arange(0, STATS_BLOCK)
        smask = (q[:, None] < n_stats) & mmask[None, :]
        means = tl.load(STATS + q[:, None] * M + offs_m[None, :], mask=smask, other=0.0)
        m2 = tl.load(STATS + (n_stats + q[:, None]) * M + offs_m[None, :], mask=smask, other=0.0)
        mean = tl.sum(means, axis=0) / n_stats
        dev = tl.where(smask, means - mean[None, :], 0.0)
        var = (tl.sum(m2, axis=0) + stat_width * tl.sum(dev * dev, axis=0)) / (stat_width * n_stats)
        rstd = tl.rsqrt(var + eps)
        cs = tl.load(CS + offs_n, mask=nmask, other=0.0)
        y = rstd[:, None] * (acc - mean[:, None] * cs[None, :])
        if HAS_BIAS:
            y += tl.load(B + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        y = gelu_tanh_f32(y)
        tl.store(Y + offs_m[:, None] * sym + offs_n[None, :], y.to(Y.dtype.element_ty),
                 mask=mmask[:, None] & nmask[None, :])


# --------------------------------------------------------------------------- wrappers
def residual_with_stats(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                        *, block_n: int = 16, block_k: int = 128, num_warps: int = 4, num_stages: int = 5
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(h_new, stats) as ``residual_with_stats_ref``: h [..., N] the residual stream, x [..., K] (<= 64 rows),
    weight [N, K] with N a multiple of ``block_n``; one program per column block over all of K."""
    n = weight.shape[0]
    x2 = skinny_rows(x, weight, n)
    check_tensors(("h", h), ("x", x))
    if n % block_n or h.shape[:-1] != x.shape[:-1] or h.shape[-1] != n or h.dtype != x.dtype:
        raise ValueError(f"residual_with_stats needs h [..., {n}] beside x {tuple(x.shape)} in its dtype and N a "
                         f"multiple of block_n={block_n}; got h {tuple(h.shape)} {h.dtype}")
    h2 = h.reshape(-1, n)
    m, k = x2.shape
    n_blocks = n // block_n
    block_m = split_plan(m, n_blocks, k, block_k, x.device, 1)[0]
    h_new = torch.empty_like(h2)
    stats = torch.empty(2, n_blocks, m, dtype=torch.float32, device=x.device)
    _residual_stats_kernel[(n_blocks,)](x2, weight, weight if bias is None else bias, h2, h_new, stats, m, n, k,
                                        x2.stride(0), weight.stride(0), h2.stride(0), h_new.stride(0), n_blocks,
                                        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                        num_warps=num_warps,
                                        num_stages=fit_stages(num_stages, block_m, block_n, block_k,
                                                              weight.element_size()),
                                        **pdl(x.device))
    return h_new.view(h.shape), stats


def norm_linear_gelu(h: torch.Tensor, stats: torch.Tensor, stat_width: int, weight: torch.Tensor,
                     bias: Optional[torch.Tensor], colsum: torch.Tensor, eps: float, *, block_n: int = 64,
                     block_k: int = 128, num_warps: int = 4, num_stages: int = 5) -> torch.Tensor:
    """gelu_tanh(LayerNorm(h) @ weight^T + bias) -> [..., N], LN without affine, from ``residual_with_stats``'s
    statistics of h (blocks ``stat_width`` wide) and ``colsum = column_sums(weight)``."""
    n, k = weight.shape
    h2 = skinny_rows(h, weight, n)
    m = h2.shape[0]
    check_tensors(("colsum", colsum))
    if stats.shape != (2, k // stat_width, m) or stats.dtype != torch.float32 or k % stat_width:
        raise ValueError(f"stats must be [2, {k} / {stat_width}, {m}] float32, got {tuple(stats.shape)}")
    if colsum.shape != (n,) or colsum.dtype != torch.float32:
        raise ValueError(f"colsum must be [{n}] float32 (column_sums(weight)), got {tuple(colsum.shape)}")
    n_stats = stats.shape[1]
    n_blocks = triton.cdiv(n, block_n)
    block_m = split_plan(m, n_blocks, k, block_k, h.device, 1)[0]
    y = torch.empty(m, n, dtype=h.dtype, device=h.device)
    _norm_gemm_gelu_kernel[(n_blocks,)](h2, weight, weight if bias is None else bias, colsum, stats, y, m, n, k,
                                        h2.stride(0), weight.stride(0), y.stride(0), n_stats, stat_width, eps,
                                        HAS_BIAS=bias is not None, STATS_BLOCK=triton.next_power_of_2(n_stats),
                                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
                                        num_stages=fit_stages(num_stages, block_m, block_n, block_k,
                                                              weight.element_size()),
                                        **pdl(h.device))
    return y.view(*h.shape[:-1], n)
