"""Linear layer for few rows (the action expert's 50 tokens): y = act(x @ W^T + b), weight-streaming.

At M <= 64 rows a bf16 GEMM is bound by reading W once, but library GEMMs tuned
for large M leave much of the memory bandwidth unused. Here every program owns a
BLOCK_N slice of W's rows and (with split-K) a slice of K, streams it once with
all M rows of x resident, and accumulates in fp32; split-K partials are summed by
a second small kernel. An optional bias and GELU (tanh) are the epilogue of whichever kernel writes y (the
GEMM without split-K, else the sum), applied to the fp32 sum and rounded once: the cuBLAS bias epilogue
picks split-K variants that stream a 41-row GEMM's weights at half the copy bandwidth (GR00T's DiT).
Reference: ``linear_ref``.
"""
from __future__ import annotations

from typing import Optional

import torch

from .common import (HAVE_TRITON, available, check_tensors, num_sms, pdl, prefetch_l2, release_dependents, tl,
                     triton, wait_for_producer)

__all__ = ["available", "skinny_linear", "linear_ref", "MAX_ROWS", "skinny_rows", "split_plan", "skinny_partials",
           "gemm_launch"]

MAX_ROWS = 64


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               act: Optional[str] = None) -> torch.Tensor:
    y = torch.nn.functional.linear(x, weight, bias)
    return torch.nn.functional.gelu(y, approximate="tanh") if act == "gelu_tanh" else y


ACTS = (None, "gelu_tanh")


if HAVE_TRITON:
    from .geglu import gelu_tanh_f32

    @triton.jit
    def prefetch_weight_rows(W, rows, swn, k0, k_per_split, K, PDL: tl.constexpr, BLOCK_K: tl.constexpr,
                             LINE: tl.constexpr):
        """L2 prefetch of W[rows, k0:k0+k_per_split] (LINE elements per 128-byte line), before the wait."""
        if PDL:
            lines = tl.arange(0, BLOCK_K // LINE) * LINE
            base = W + rows[:, None].to(tl.int64) * swn
            for kk in range(0, k_per_split, BLOCK_K):
                prefetch_l2(base + tl.minimum(k0 + kk + lines, K - 1)[None, :], PDL)

    @triton.jit
    def rows_times_weight(X, sxm, W, swn, offs_m, mmask, offs_n, nmask, K, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """fp32 [BLOCK_M, BLOCK_N] = X[offs_m, :K] @ W[offs_n, :K]^T over all of K (one split): the loop of the
        kernels that own whole output tiles (kernels/candidates/post_norm.py)."""
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            km = k < K
            a = tl.load(X + offs_m[:, None] * sxm + k[None, :], mask=mmask[:, None] & km[None, :], other=0.0)
            w = tl.load(W + offs_n[:, None].to(tl.int64) * swn + k[None, :], mask=nmask[:, None] & km[None, :],
                        other=0.0)
            acc += tl.dot(a, tl.trans(w))
        return acc

    @triton.jit
    def bias_act(acc, B, offs_n, nmask, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
        """Epilogue on the fp32 sum: + bias[n], then GELU-tanh when ACT == 1."""
        if HAS_BIAS:
            acc += tl.load(B + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        if ACT == 1:
            acc = gelu_tanh_f32(acc)
        return acc

    @triton.jit
    def _skinny_kernel(X, W, P, B, M, N, K, k_per_split, sxm, swn, spk, spm,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PDL: tl.constexpr, PREFETCH: tl.constexpr, LINE: tl.constexpr,
                       HAS_BIAS: tl.constexpr = False, ACT: tl.constexpr = 0):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        k0 = pid_k * k_per_split
        if PREFETCH:
            prefetch_weight_rows(W, tl.minimum(offs_n, N - 1), swn, k0, k_per_split, K, PDL, BLOCK_K, LINE)
        wait_for_producer(PDL, True)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, k_per_split, BLOCK_K):
            k = k0 + kk + offs_k
            km = k < K
            a = tl.load(X + offs_m[:, None] * sxm + k[None, :], mask=(offs_m[:, None] < M) & km[None, :], other=0.0)
            w = tl.load(W + offs_n[:, None].to(tl.int64) * swn + k[None, :], mask=(offs_n[:, None] < N) & km[None, :],
                        other=0.0)
            acc += tl.dot(a, tl.trans(w), input_precision="ieee")
        release_dependents(PDL)
        acc = bias_act(acc, B, offs_n, offs_n < N, HAS_BIAS, ACT)
        dst = P + pid_k * spk + offs_m[:, None] * spm + offs_n[None, :]
        tl.store(dst, acc.to(P.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    @triton.jit
    def sum_splits_kernel(P, Y, B, M, N, SPLITS: tl.constexpr, spk, spm, sym, BLOCK: tl.constexpr, PDL: tl.constexpr,
                           HAS_BIAS: tl.constexpr = False, ACT: tl.constexpr = 0):
        wait_for_producer(PDL)
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs // N
        n = offs % N
        mask = offs < M * N
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(SPLITS):   # unrolled: every split's load in flight at once
            acc += tl.load(P + s * spk + m * spm + n, mask=mask, other=0.0)
        acc = tl.reshape(bias_act(acc[None, :], B, n, mask, HAS_BIAS, ACT), (BLOCK,))
        tl.store(Y + m * sym + n, acc.to(Y.dtype.element_ty), mask=mask)


def _split_k(n_blocks: int, k: int, block_k: int, device: torch.device) -> int:
    """Enough K splits to give every multiprocessor about two programs, each with >= 2 K blocks."""
    target = 2 * num_sms(device)
    splits = max(1, min(target // max(n_blocks, 1), k // (2 * block_k)))
    return splits


def skinny_rows(x: torch.Tensor, weight: torch.Tensor, n_rows_w: int) -> torch.Tensor:
    """Check x [..., K] against weight [n_rows_w, K] for the skinny kernels; x as [M, K] rows."""
    check_tensors(("x", x), ("weight", weight))
    if not HAVE_TRITON:
        raise RuntimeError("triton is not importable here; use linear_ref")
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if (m > MAX_ROWS or weight.shape != (n_rows_w, k) or weight.dtype != x.dtype or weight.stride(1) != 1):
        raise ValueError(f"skinny kernels need <= {MAX_ROWS} rows and a [{n_rows_w}, {k}] weight of x's dtype; "
                         f"got {m} rows, weight {tuple(weight.shape)} {weight.dtype}")
    return x2


def split_plan(m: int, n_blocks: int, k: int, block_k: int, device: torch.device, splits: Optional[int]):
    """(BLOCK_M, K splits, K per split): the split count rounded so that every split is whole K blocks."""
    s = splits or _split_k(n_blocks, k, block_k, device)
    k_per = triton.cdiv(triton.cdiv(k, s), block_k) * block_k
    return max(16, triton.next_power_of_2(m)), triton.cdiv(k, k_per), k_per


SHARED_BUDGET = 200 * 1024   # bytes of shared memory the pipeline stages may take (227 KB per block on sm_90 / Thor)


def fit_stages(num_stages: int, block_m: int, weight_rows: int, block_k: int, element_size: int) -> int:
    """Pipeline stages that fit the shared-memory budget: each holds an activation tile [block_m, block_k] and
    ``weight_rows`` weight rows of block_k (two blocks' worth for the gate / up pair), so that a deep tiling
    asked of a wide kernel runs shallower instead of failing to launch."""
    per_stage = (block_m + weight_rows) * block_k * element_size
    return max(1, min(num_stages, SHARED_BUDGET // per_stage))


def gemm_launch(weight: torch.Tensor, prefetch: bool) -> dict:
    """PDL keywords of a weight-streaming GEMM: with PDL (and ``prefetch``) its weight slice is prefetched
    into L2 while the producer of x still runs."""
    kw = pdl(weight.device)
    return {**kw, "PREFETCH": bool(prefetch and kw["PDL"]), "LINE": 128 // weight.element_size()}


def skinny_partials(x2: torch.Tensor, weight: torch.Tensor, *, block_n: int = 64, block_k: int = 128,
                    num_warps: int = 4, num_stages: int = 3, splits: Optional[int] = None,
                    prefetch: bool = False) -> torch.Tensor:
    """fp32 split-K partial products [splits, M, N] of x2 [M, K] @ weight [N, K]^T (always a workspace,
    also for one split, so that a row epilogue can sum them)."""
    m, k = x2.shape
    n = weight.shape[0]
    n_blocks = triton.cdiv(n, block_n)
    block_m, s, k_per = split_plan(m, n_blocks, k, block_k, x2.device, splits)
    part = torch.empty(s, m, n, dtype=torch.float32, device=x2.device)
    num_stages = fit_stages(num_stages, block_m, block_n, block_k, weight.element_size())
    _skinny_kernel[(n_blocks, s)](x2, weight, part, part, m, n, k, k_per, x2.stride(0), weight.stride(0), part.stride(0),
                                  n, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                  num_warps=num_warps, num_stages=num_stages, **gemm_launch(weight, prefetch))
    return part


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                  act: Optional[str] = None, *, block_n: int = 64, block_k: int = 128,
                  num_warps: int = 4, num_stages: int = 3, splits: Optional[int] = None,
                  prefetch: bool = False) -> torch.Tensor:
    """act(x [..., K] (at most MAX_ROWS rows after flattening) @ weight [N, K]^T + bias [N]) -> [..., N] in
    x.dtype; act None or "gelu_tanh". ``prefetch``: L2 prefetch of the weights before waiting for x (only where
    PDL is on)."""
    n = weight.shape[0]
    x2 = skinny_rows(x, weight, n)
    if act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}, got {act!r}")
    if bias is not None:
        check_tensors(("bias", bias), ("x", x))
        if bias.shape != (n,):
            raise ValueError(f"bias must be [{n}], got {tuple(bias.shape)}")
    epi = dict(HAS_BIAS=bias is not None, ACT=ACTS.index(act))
    b = weight if bias is None else bias
    m, k = x2.shape
    n_blocks = triton.cdiv(n, block_n)
    block_m, s, k_per = split_plan(m, n_blocks, k, block_k, x.device, splits)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if s == 1:
        num_stages = fit_stages(num_stages, block_m, block_n, block_k, weight.element_size())
        _skinny_kernel[(n_blocks, 1)](x2, weight, y, b, m, n, k, k_per, x2.stride(0), weight.stride(0), 0,
                                      n, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                      num_warps=num_warps, num_stages=num_stages, **gemm_launch(weight, prefetch),
                                      **epi)
    else:
        part = skinny_partials(x2, weight, block_n=block_n, block_k=block_k, num_warps=num_warps,
                               num_stages=num_stages, splits=s, prefetch=prefetch)
        block = 1024
        sum_splits_kernel[(triton.cdiv(m * n, block),)](part, y, b, m, n, s, part.stride(0), n, n, BLOCK=block,
                                                         **pdl(x.device), **epi)
    return y.view(*x.shape[:-1], n)
