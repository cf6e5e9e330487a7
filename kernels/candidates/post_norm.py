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

The pi family's expert has the same boundary with an (ada)RMSNorm, ``x = h * rstd * (1 + scale) + shift`` with the
output GEMM's gated residual ``h_new = h + gate * (a @ Wo^T)`` before it and the GeGLU gate_up after it, so

    x @ W^T = rstd * ((h * (1 + scale)) @ W^T) + shift @ W^T

* ``gated_residual_rms``: the gated residual, each block's row sums of squares, and ``xs = h_new * (1 + scale)``
  rounded once, plus ``shift`` as one more row of xs (the 64-row tile has room beside one item's 50-51 tokens);
* ``rms_linear_geglu``: gate_up against xs, rstd applied to the real rows' accumulators, the shift row's
  accumulator (``shift @ W^T``) added to every row, then GeGLU.

Rounding differs from the three-kernel path (the normalised activations are never rounded to bf16 before the
GEMM); against fp32 it is as close or closer. ``colsum`` is a property of the weight, made once at load (fp32).
References: ``residual_with_stats_ref``, ``norm_linear_gelu_ref``, ``gated_residual_rms_ref``, ``rms_linear_geglu_ref``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..common import HAVE_TRITON, available, check_tensors, pdl, release_dependents, tl, triton, wait_for_producer
from ..skinny_linear import MAX_ROWS, fit_stages, skinny_rows, split_plan

__all__ = ["available", "residual_with_stats", "norm_linear_gelu", "residual_with_stats_ref", "norm_linear_gelu_ref",
           "merge_stats_ref", "column_sums", "gated_residual_rms", "rms_linear_geglu", "gated_residual_rms_ref",
           "rms_linear_geglu_ref"]


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


def gated_residual_rms_ref(h, x, weight, gate, scale, shift, block_n: int):
    """(h_new, xs, stats) of ``gated_residual_rms`` in fp32 math: h_new = h + (x @ W^T) * gate (or + x @ W^T)
    rounded once; xs [M (+1), N] = h_new * (1 + scale) rounded once, then shift's row where given; stats
    [N / block_n, M] the blocks' row sums of squares of the rounded h_new. gate / scale / shift: [N]."""
    y = x.float().reshape(-1, weight.shape[1]) @ weight.float().T
    if gate is not None:
        y = y * gate.float().reshape(-1)
    h2 = h.reshape(-1, h.shape[-1])
    h_new = (h2.float() + y).to(h.dtype)
    xs = (h_new.float() * (1 + scale.float().reshape(-1))).to(h.dtype)
    if shift is not None:
        xs = torch.cat([xs, shift.float().reshape(1, -1).to(h.dtype)])
    m, n = h_new.shape
    stats = h_new.float().reshape(m, n // block_n, block_n).pow(2).sum(-1).T.contiguous()
    return h_new.view(h.shape), xs, stats


def rms_linear_geglu_ref(h, scale, shift, gate_up_w, eps: float) -> torch.Tensor:
    """gelu_tanh(x Wg^T) * (x Wu^T) for x = (ada)RMSNorm(h) = h * rstd * (1 + scale) (+ shift), fp32 math."""
    hf = h.float().reshape(-1, h.shape[-1])
    x = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * (1 + scale.float().reshape(-1))
    if shift is not None:
        x = x + shift.float().reshape(-1)
    y = x @ gate_up_w.float().T
    i = gate_up_w.shape[0] // 2
    out = torch.nn.functional.gelu(y[:, :i], approximate="tanh") * y[:, i:]
    return out.to(h.dtype).view(*h.shape[:-1], i)


# --------------------------------------------------------------------------- kernels
if HAVE_TRITON:
    from ..geglu import gelu_tanh_f32
    from ..skinny_linear import rows_times_weight

    @triton.jit
    def output_tile(X, sxm, W, swn, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PDL: tl.constexpr):
        """This program's output tile of X @ W^T over all of K (column block = program id), after waiting for X's
        producer: (acc fp32, rows, columns, row mask, column mask)."""
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        mmask = offs_m < M
        nmask = offs_n < N
        wait_for_producer(PDL, True)
        acc = rows_times_weight(X, sxm, W, swn, offs_m, mmask, offs_n, nmask, K, BLOCK_M, BLOCK_N, BLOCK_K)
        release_dependents(PDL)
        return acc, offs_m, offs_n, mmask, nmask

    @triton.jit
    def add_residual(acc, H, shm, HOUT, sho, offs_m, offs_n, mask):
        """h_new = h + acc rounded once to HOUT's dtype, stored; returned in fp32 (0 outside ``mask``)."""
        hv = tl.load(H + offs_m[:, None] * shm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        hn = (hv + acc).to(HOUT.dtype.element_ty)
        tl.store(HOUT + offs_m[:, None] * sho + offs_n[None, :], hn, mask=mask)
        return tl.where(mask, hn.to(tl.float32), 0.0)

    @triton.jit
    def _residual_stats_kernel(X, W, B, H, HOUT, STATS, M, N, K, sxm, swn, shm, sho, n_blocks,
                               HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        acc, offs_m, offs_n, mmask, nmask = output_tile(X, sxm, W, swn, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, PDL)
        if HAS_BIAS:
            acc += tl.load(B + offs_n).to(tl.float32)[None, :]
        hf = add_residual(acc, H, shm, HOUT, sho, offs_m, offs_n, mmask[:, None] & nmask[None, :])
        mean = tl.sum(hf, axis=1) / BLOCK_N
        d = hf - mean[:, None]
        pid_n = tl.program_id(0)
        tl.store(STATS + pid_n * M + offs_m, mean, mask=mmask)
        tl.store(STATS + (n_blocks + pid_n) * M + offs_m, tl.sum(d * d, axis=1), mask=mmask)

    @triton.jit
    def _norm_gemm_gelu_kernel(H, W, B, CS, STATS, Y, M, N, K, shm, swn, sym, n_stats, stat_width, eps,
                               HAS_BIAS: tl.constexpr, STATS_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        acc, offs_m, offs_n, mmask, nmask = output_tile(H, shm, W, swn, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, PDL)
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

    @triton.jit
    def _gated_residual_rms_kernel(X, W, G, SC, SH, H, HOUT, XS, STATS, M, N, K, sxm, swn, shm, sho, sxs,
                                   HAS_GATE: tl.constexpr, HAS_SHIFT: tl.constexpr, BLOCK_M: tl.constexpr,
                                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        acc, offs_m, offs_n, mmask, nmask = output_tile(X, sxm, W, swn, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, PDL)
        if HAS_GATE:
            acc *= tl.load(G + offs_n).to(tl.float32)[None, :]
        mask = mmask[:, None] & nmask[None, :]
        hf = add_residual(acc, H, shm, HOUT, sho, offs_m, offs_n, mask)
        tl.store(STATS + tl.program_id(0) * M + offs_m, tl.sum(hf * hf, axis=1), mask=mmask)
        scale = 1.0 + tl.load(SC + offs_n).to(tl.float32)
        tl.store(XS + offs_m[:, None] * sxs + offs_n[None, :], (hf * scale[None, :]).to(XS.dtype.element_ty),
                 mask=mask)
        if HAS_SHIFT:
            tl.store(XS + M * sxs + offs_n, tl.load(SH + offs_n).to(XS.dtype.element_ty))

    @triton.jit
    def _rms_gemm_geglu_kernel(XS, W, STATS, Y, M, I, K, sxs, swn, sym, n_stats, eps, HAS_SHIFT: tl.constexpr,
                               STATS_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        pid_n = tl.program_id(0)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        amask = offs_m < M + HAS_SHIFT     # the real rows and, where given, shift's row
        nmask = offs_n < I
        wait_for_producer(PDL, True)
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            km = k < K
            a = tl.load(XS + offs_m[:, None] * sxs + k[None, :], mask=amask[:, None] & km[None, :], other=0.0)
            wmask = nmask[:, None] & km[None, :]
            wg = tl.load(W + offs_n[:, None].to(tl.int64) * swn + k[None, :], mask=wmask, other=0.0)
            wu = tl.load(W + (offs_n[:, None] + I).to(tl.int64) * swn + k[None, :], mask=wmask, other=0.0)
            acc_g += tl.dot(a, tl.trans(wg))
            acc_u += tl.dot(a, tl.trans(wu))
        release_dependents(PDL)
        q = tl.arange(0, STATS_BLOCK)
        ss = tl.load(STATS + q[:, None] * M + offs_m[None, :], mask=(q[:, None] < n_stats) & (offs_m < M)[None, :],
                     other=0.0)
        rstd = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)[:, None]
        g = rstd * acc_g
        u = rstd * acc_u
        if HAS_SHIFT:
            shift_row = (offs_m == M)[:, None]
            g += tl.sum(tl.where(shift_row, acc_g, 0.0), axis=0)[None, :]
            u += tl.sum(tl.where(shift_row, acc_u, 0.0), axis=0)[None, :]
        out = gelu_tanh_f32(g) * u
        tl.store(Y + offs_m[:, None] * sym + offs_n[None, :], out.to(Y.dtype.element_ty),
                 mask=(offs_m < M)[:, None] & nmask[None, :])


# --------------------------------------------------------------------------- wrappers
def residual_with_stats(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                        *, block_n: int = 16, block_k: int = 128, num_warps: int = 4, num_stages: int = 5
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(h_new, stats) as ``residual_with_stats_ref``: h [..., N] the residual stream, x [..., K] (<= MAX_ROWS rows),
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


def norm_linear_gelu(h: torch.Tensor, stats: torch.Tensor, weight: torch.Tensor,
                     bias: Optional[torch.Tensor], colsum: torch.Tensor, eps: float, *, block_n: int = 64,
                     block_k: int = 128, num_warps: int = 4, num_stages: int = 5) -> torch.Tensor:
    """gelu_tanh(LayerNorm(h) @ weight^T + bias) -> [..., N], LN without affine, from ``residual_with_stats``'s
    statistics of h (equal blocks: K / stats.shape[1] wide) and ``colsum = column_sums(weight)``."""
    n, k = weight.shape
    h2 = skinny_rows(h, weight, n)
    m = h2.shape[0]
    check_tensors(("colsum", colsum))
    n_stats = stats.shape[1] if stats.dim() == 3 else 0
    if stats.shape != (2, n_stats, m) or stats.dtype != torch.float32 or not n_stats or k % n_stats:
        raise ValueError(f"stats must be [2, blocks dividing {k}, {m}] float32, got {tuple(stats.shape)}")
    stat_width = k // n_stats
    if colsum.shape != (n,) or colsum.dtype != torch.float32:
        raise ValueError(f"colsum must be [{n}] float32 (column_sums(weight)), got {tuple(colsum.shape)}")
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


def gated_residual_rms(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, gate: Optional[torch.Tensor],
                       scale: torch.Tensor, shift: Optional[torch.Tensor], *, block_n: int = 16, block_k: int = 128,
                       num_warps: int = 4, num_stages: int = 5) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h_new, xs, stats) as ``gated_residual_rms_ref``: one item's rows (x [..., K], at most 63 with a shift),
    gate / scale / shift one [N] vector each (fp32 or the model dtype), N a multiple of ``block_n``."""
    n = weight.shape[0]
    x2 = skinny_rows(x, weight, n)
    m, k = x2.shape
    mods = [("scale", scale)] + [(nm, t) for nm, t in (("gate", gate), ("shift", shift)) if t is not None]
    check_tensors(("h", h), ("x", x), *mods)
    if n % block_n or h.shape[:-1] != x.shape[:-1] or h.shape[-1] != n or h.dtype != x.dtype:
        raise ValueError(f"gated_residual_rms needs h [..., {n}] beside x {tuple(x.shape)} in its dtype and N a "
                         f"multiple of block_n={block_n}; got h {tuple(h.shape)} {h.dtype}")
    if any(t.numel() != n or not t.is_contiguous() for _, t in mods):
        raise ValueError(f"gate / scale / shift must be one contiguous [{n}] vector each (one item)")
    rows = m + (shift is not None)
    if rows > MAX_ROWS:
        raise ValueError(f"at most {MAX_ROWS - (shift is not None)} rows here, got {m}")
    h2 = h.reshape(-1, n)
    n_blocks = n // block_n
    block_m = split_plan(rows, n_blocks, k, block_k, x.device, 1)[0]
    h_new = torch.empty_like(h2)
    xs = torch.empty(rows, n, dtype=h.dtype, device=h.device)
    stats = torch.empty(n_blocks, m, dtype=torch.float32, device=x.device)
    _gated_residual_rms_kernel[(n_blocks,)](x2, weight, scale if gate is None else gate, scale,
                                            scale if shift is None else shift, h2, h_new, xs, stats, m, n, k,
                                            x2.stride(0), weight.stride(0), h2.stride(0), h_new.stride(0),
                                            xs.stride(0), HAS_GATE=gate is not None, HAS_SHIFT=shift is not None,
                                            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
                                            num_stages=fit_stages(num_stages, block_m, block_n, block_k,
                                                                  weight.element_size()),
                                            **pdl(x.device))
    return h_new.view(h.shape), xs, stats


def rms_linear_geglu(xs: torch.Tensor, stats: torch.Tensor, gate_up_w: torch.Tensor, eps: float, *,
                     block_n: int = 32, block_k: int = 128, num_warps: int = 4, num_stages: int = 4) -> torch.Tensor:
    """GeGLU of (ada)RMSNorm(h) @ [Wg; Wu]^T -> [rows, I] from ``gated_residual_rms``'s xs (with shift's row
    after the real ones when it has one more) and the rows' sums of squares ``stats`` [blocks, rows]."""
    two_i, k = gate_up_w.shape
    i = two_i // 2
    rows = stats.shape[-1]
    has_shift = xs.shape[0] == rows + 1
    if xs.shape[0] not in (rows, rows + 1) or xs.shape[1] != k or stats.dim() != 2 or stats.dtype != torch.float32:
        raise ValueError(f"xs must be [{rows}(+1), {k}] and stats [blocks, {rows}] float32; got {tuple(xs.shape)}, "
                         f"{tuple(stats.shape)}")
    skinny_rows(xs, gate_up_w, two_i)
    n_blocks = triton.cdiv(i, block_n)
    block_m = split_plan(xs.shape[0], n_blocks, k, block_k, xs.device, 1)[0]
    y = torch.empty(rows, i, dtype=xs.dtype, device=xs.device)
    _rms_gemm_geglu_kernel[(n_blocks,)](xs, gate_up_w, stats, y, rows, i, k, xs.stride(0), gate_up_w.stride(0),
                                        y.stride(0), stats.shape[0], eps, HAS_SHIFT=has_shift,
                                        STATS_BLOCK=triton.next_power_of_2(stats.shape[0]), BLOCK_M=block_m,
                                        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
                                        num_stages=fit_stages(num_stages, block_m, 2 * block_n, block_k,
                                                              gate_up_w.element_size()),
                                        **pdl(xs.device))
    return y
