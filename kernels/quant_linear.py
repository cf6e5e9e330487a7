"""Quantized linear layers for few rows (the action expert's / DiT's tokens): weight-streaming like
skinny_linear.py, reading 8-bit or 4-bit weights and dequantizing them in registers.

Why: at <= 64 rows a linear layer is bound by reading its weight once; 8-bit weights halve those bytes and 4-bit
ones quarter them (on Jetson Thor, at 273 GB/s, the denoising loop is that read). The formats (the storage layout
owner is this module; ``phyai_ros.layers.quantized`` makes them):

* per-channel 8-bit: q [N, K] int8 (round-to-nearest, |q| <= 127) or float8_e4m3fn, scale [N] float32;
  w = q * scale[n]. Both are exact in bf16, so the GEMM runs on dequantized-in-register bf16 tiles and the
  per-channel scale is applied once to the fp32 sum (sum_k x_k q_nk s_n = s_n sum_k x_k q_nk).
* group-wise 4-bit: q [N, K/2] uint8, scale [N, K/G] float32, w = (nibble - 8) * scale[n, k // G]. Within each
  group of G columns, byte j holds column j in its low nibble and column j + G/2 in its high nibble, so a program
  unpacks a group into two contiguous half tiles (two dots, no interleave).
* activations (W8A8): fp8 e4m3 per token, dynamic (scale = row amax / 448) or static (one calibrated scale);
  the kernel quantizes x in registers (an extra pass over x's row for the amax: x is a few KB in L2), so no
  separate quantization kernel runs. y = s_x[m] s_w[n] sum_k fp8(x_mk / s_x) q_nk.

The GEMM writes fp32 split-K partials (also for one split); the row / element kernels of skinny_linear.py and
skinny_epilogue.py sum them and apply the bias / GELU / GeGLU / residual + norm epilogue the bf16 path fuses.
References (torch, the math the kernels must match): ``dequantize``, ``quantize_activations_ref``,
``quant_linear_ref``.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._common import HAVE_TRITON, available, num_sms, pdl, require_triton, tl, triton, wait_for_producer

__all__ = ["available", "FP8_MAX", "pack_int4", "unpack_int4", "dequantize", "quantize_activations_ref",
           "quant_linear_ref", "quant_partials", "quant_linear", "quantize_rows", "ACT_QUANT"]

FP8_MAX = 448.0  # largest finite float8_e4m3fn
ACT_QUANT = (None, "dynamic", "static")   # activation quantization of W8A8 (None: weight-only)
_MIN_SCALE = 1e-12


# --------------------------------------------------------------------------- layout and reference math
def pack_int4(q: torch.Tensor, group: int) -> torch.Tensor:
    """int values in [-8, 7], [N, K] (K a multiple of group, group even) -> packed uint8 [N, K/2] (layout above)."""
    n, k = q.shape
    if group % 2 or k % group:
        raise ValueError(f"K {k} must be a multiple of an even group size, got group {group}")
    u = (q.to(torch.int16) + 8).to(torch.uint8).view(n, k // group, 2, group // 2)
    return (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(n, k // 2)


def unpack_int4(packed: torch.Tensor, group: int) -> torch.Tensor:
    """packed uint8 [N, K/2] -> int8 values [N, K] in [-8, 7]."""
    n, half = packed.shape
    p = packed.view(n, half * 2 // group, group // 2)
    lo = (p & 15).to(torch.int8) - 8
    hi = (p >> 4).to(torch.int8) - 8
    return torch.stack((lo, hi), dim=2).reshape(n, half * 2)


def dequantize(q: torch.Tensor, scale: torch.Tensor, group: int = 0) -> torch.Tensor:
    """The float32 weight [N, K] a quantized one stands for (group 0: per-channel 8-bit)."""
    if q.dtype == torch.uint8:
        w = unpack_int4(q, group).float()
        return (w.view(w.shape[0], -1, group) * scale.float()[:, :, None]).reshape(w.shape)
    return q.float() * scale.float()[:, None]


def activation_scales(x2: torch.Tensor, static_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """Per-row fp8 scales [M] float32: the row's amax / 448 (dynamic) or the one static scale."""
    if static_scale is not None:
        return static_scale.float().reshape(1).expand(x2.shape[0])
    return (x2.float().abs().amax(dim=-1) / FP8_MAX).clamp_min(_MIN_SCALE)


def quantize_activations_ref(x2: torch.Tensor, static_scale: Optional[torch.Tensor] = None):
    """x [M, K] -> (fp8 e4m3 values as float32 [M, K], scales [M]): fp8(clamp(x / s, +-448))."""
    s = activation_scales(x2, static_scale)
    q = (x2.float() / s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.float(), s


def quant_linear_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int = 0,
                     act_quant: Optional[str] = None, act_scale: Optional[torch.Tensor] = None,
                     bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x @ w^T (+ bias) in float32 for a quantized weight, x [..., K] -> [..., N] float32; with act_quant
    the activations are fp8-quantized first (W8A8)."""
    x2 = x.reshape(-1, x.shape[-1]).float()
    if act_quant:
        xq, s = quantize_activations_ref(x2, act_scale if act_quant == "static" else None)
        y = (xq @ dequantize(q, torch.ones_like(scale), group).T) * s[:, None] * scale.float()[None, :]
    else:
        y = x2 @ dequantize(q, scale, group).T
    if bias is not None:
        y = y + bias.float()
    return y.view(*x.shape[:-1], q.shape[0])


# --------------------------------------------------------------------------- kernel
if HAVE_TRITON:

    @triton.jit
    def _fake_fp8(a, s):
        """x / s rounded to the nearest fp8 e4m3 value (ties to even, clamped to +-448), as float32.

        Rounded with fp32 bit arithmetic rather than a cast: identical to the hardware conversion, and Triton's
        interpreter (CI) casts to fp8 without carrying a rounded-up mantissa into the exponent (124.3 -> 64).
        Normal range (|v| >= 2^-6): keep 3 of fp32's 23 mantissa bits, round half to even on the 20 dropped;
        subnormals are multiples of 2^-9: adding and subtracting 1.5 * 2^14 rounds to those in fp32."""
        v = tl.minimum(tl.maximum(a.to(tl.float32) / s, -448.0), 448.0)
        bits = v.to(tl.int32, bitcast=True)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)
        subnormal = (v + 24576.0) - 24576.0
        return tl.where(tl.abs(v) < 0.015625, subnormal, normal)

    @triton.jit
    def _quant_skinny_kernel(X, XS, W, WS, P, M, N, K, k_per_split, sxm, swn, sws, spk, spm,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             INT4: tl.constexpr, AQ: tl.constexpr, PDL: tl.constexpr):
        """fp32 partials P[pid_k] = x[:, K slice] @ w[n block, K slice]^T, scaled (see module docstring).
        INT4: BLOCK_K is the group size and every split is whole groups. AQ: 0 none, 1 dynamic, 2 static."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mmask = offs_m < M
        nmask = offs_n < N
        k0 = pid_k * k_per_split
        wrows = W + offs_n[:, None].to(tl.int64) * swn
        cdt = X.dtype.element_ty
        if AQ != 0:
            cdt = tl.bfloat16 if X.dtype.element_ty == tl.bfloat16 else tl.float32
        wait_for_producer(PDL)
        xs = tl.full((BLOCK_M,), 1.0, tl.float32)
        if AQ == 1:  # the row's amax over all of K (not only this split's)
            amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for kk in range(0, K, BLOCK_K):
                k = kk + tl.arange(0, BLOCK_K)
                a = tl.load(X + offs_m[:, None] * sxm + k[None, :], mask=mmask[:, None] & (k < K)[None, :], other=0.0)
                amax = tl.maximum(amax, tl.max(tl.abs(a.to(tl.float32)), axis=1))
            xs = tl.maximum(amax / 448.0, 1e-12)
        if AQ == 2:
            xs = xs * tl.load(XS)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if INT4:
            HALF: tl.constexpr = BLOCK_K // 2
            offs_h = tl.arange(0, HALF)
            for kk in range(0, k_per_split, BLOCK_K):
                kg = k0 + kk
                gm = kg < K
                xrow = X + offs_m[:, None] * sxm + kg + offs_h[None, :]
                a_lo = tl.load(xrow, mask=mmask[:, None] & gm, other=0.0)
                a_hi = tl.load(xrow + HALF, mask=mmask[:, None] & gm, other=0.0)
                b = tl.load(wrows + kg // 2 + offs_h[None, :], mask=nmask[:, None] & gm, other=0).to(tl.int32)
                w_lo = ((b & 15) - 8).to(tl.float32).to(cdt)  # via fp32: exact (and int -> bf16 is not, under
                w_hi = ((b >> 4) - 8).to(tl.float32).to(cdt)  # the interpreter)
                part = tl.dot(a_lo, tl.trans(w_lo), input_precision="ieee")
                part += tl.dot(a_hi, tl.trans(w_hi), input_precision="ieee")
                s = tl.load(WS + offs_n * sws + kg // BLOCK_K, mask=nmask & gm, other=0.0)
                acc += part * s[None, :]
        else:
            offs_k = tl.arange(0, BLOCK_K)
            for kk in range(0, k_per_split, BLOCK_K):
                k = k0 + kk + offs_k
                km = k < K
                a = tl.load(X + offs_m[:, None] * sxm + k[None, :], mask=mmask[:, None] & km[None, :], other=0.0)
                if AQ != 0:
                    a = _fake_fp8(a, xs[:, None]).to(cdt)
                w = tl.load(wrows + k[None, :], mask=nmask[:, None] & km[None, :], other=0.0).to(tl.float32).to(cdt)
                acc += tl.dot(a, tl.trans(w), input_precision="ieee")
            acc = acc * tl.load(WS + offs_n, mask=nmask, other=0.0)[None, :]
        if AQ != 0:
            acc = acc * xs[:, None]
        dst = P + pid_k * spk + offs_m[:, None] * spm + offs_n[None, :]
        tl.store(dst, acc, mask=mmask[:, None] & nmask[None, :])


    @triton.jit
    def _quantize_rows_kernel(X, XS, Y, S, K, sxm, sym, BLOCK: tl.constexpr, STATIC: tl.constexpr,
                              PDL: tl.constexpr):
        """One row: scale = amax / 448 (or the static one), fp8 values of x / scale."""
        wait_for_producer(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < K
        a = tl.load(X + row * sxm + cols, mask=mask, other=0.0).to(tl.float32)
        if STATIC:
            s = tl.load(XS)
        else:
            s = tl.maximum(tl.max(tl.abs(a), axis=0) / 448.0, 1e-12)
        tl.store(Y + row * sym + cols, _fake_fp8(a, s).to(tl.float8e4nv), mask=mask)
        tl.store(S + row, s)


def quantize_rows(x2: torch.Tensor, static_scale: Optional[torch.Tensor] = None):
    """x [M, K] -> (float8_e4m3fn [M, K], float32 scales [M]): what ``quantize_activations_ref`` computes, for
    the fp8 tensor-core GEMM (``torch._scaled_mm``)."""
    require_triton()
    m, k = x2.shape
    y = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x2.device)
    s = torch.empty(m, dtype=torch.float32, device=x2.device)
    _quantize_rows_kernel[(m,)](x2, s if static_scale is None else static_scale, y, s, k, x2.stride(0), k,
                                BLOCK=triton.next_power_of_2(k), STATIC=static_scale is not None,
                                num_warps=4 if k <= 4096 else 8, **pdl(x2.device))
    return y, s


MAX_ROWS = 64


def _check(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int, act_quant: Optional[str]):
    require_triton()
    if act_quant not in ACT_QUANT:
        raise ValueError(f"act_quant must be one of {ACT_QUANT}, got {act_quant!r}")
    int4 = q.dtype == torch.uint8
    k = x.shape[-1]
    n = q.shape[0]
    if q.dtype not in (torch.int8, torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"quantized weight dtype {q.dtype}: int8, float8_e4m3fn or packed uint8 (int4)")
    if int4:
        if act_quant or group < 32 or group & (group - 1) or q.shape != (n, k // 2) or k % group:
            raise ValueError(f"int4 needs a power-of-two group >= 32 dividing K={k}, weight-only; got group {group}, "
                             f"packed {tuple(q.shape)}, act_quant {act_quant}")
        if scale.shape != (n, k // group):
            raise ValueError(f"int4 scales must be [{n}, {k // group}], got {tuple(scale.shape)}")
    elif q.shape != (n, k) or scale.shape != (n,):
        raise ValueError(f"8-bit weight [{n}, {k}] with scales [{n}] expected, got {tuple(q.shape)} / "
                         f"{tuple(scale.shape)}")
    x2 = x.reshape(-1, k)
    if x2.shape[0] > MAX_ROWS or x2.stride(-1) != 1 or q.stride(-1) != 1 or scale.dtype != torch.float32:
        raise ValueError(f"<= {MAX_ROWS} rows with contiguous rows and float32 scales expected")
    return x2, int4


def quant_partials(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int = 0,
                   act_quant: Optional[str] = None, act_scale: Optional[torch.Tensor] = None, *,
                   block_n: int = 64, block_k: int = 128, num_warps: int = 4, num_stages: int = 3,
                   splits: Optional[int] = None) -> torch.Tensor:
    """fp32 split-K partials [splits, M, N] of x [..., K] (<= 64 rows) times a quantized weight^T."""
    x2, int4 = _check(x, q, scale, group, act_quant)
    m, k = x2.shape
    n = q.shape[0]
    if int4:
        block_k = group
    n_blocks = triton.cdiv(n, block_n)
    if splits is None:  # about two programs per multiprocessor, each >= 2 K blocks
        splits = max(1, min(2 * num_sms(x.device) // n_blocks, k // (2 * block_k)))
    k_per = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    s = triton.cdiv(k, k_per)
    part = torch.empty(s, m, n, dtype=torch.float32, device=x.device)
    xs = act_scale if act_quant == "static" else scale
    _quant_skinny_kernel[(n_blocks, s)](x2, xs, q, scale, part, m, n, k, k_per, x2.stride(0), q.stride(0),
                                        scale.stride(0), part.stride(0), n,
                                        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, BLOCK_K=block_k,
                                        INT4=int4, AQ=ACT_QUANT.index(act_quant), num_warps=num_warps,
                                        num_stages=num_stages, **pdl(x.device))
    return part


def quant_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int = 0,
                 act_quant: Optional[str] = None, act_scale: Optional[torch.Tensor] = None,
                 bias: Optional[torch.Tensor] = None, act: Optional[str] = None, **tiling) -> torch.Tensor:
    """act(x @ w^T + bias) for a quantized weight -> [..., N] in x.dtype (act None or "gelu_tanh")."""
    from .skinny_linear import ACTS, _sum_splits_kernel
    part = quant_partials(x, q, scale, group, act_quant, act_scale, **tiling)
    s, m, n = part.shape
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block = 1024
    _sum_splits_kernel[(triton.cdiv(m * n, block),)](part, y, part if bias is None else bias, m, n, s,
                                                     part.stride(0), n, n, BLOCK=block, **pdl(x.device),
                                                     HAS_BIAS=bias is not None, ACT=ACTS.index(act))
    return y.view(*x.shape[:-1], n)
