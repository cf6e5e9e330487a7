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

from .common import (HAVE_TRITON, available, interpret_mode, num_sms, pdl, release_dependents, require_triton, tl,
                      triton, wait_for_producer)

__all__ = ["available", "FP8_MAX", "pack_int4", "unpack_int4", "dequantize", "quantize_activations_ref",
           "quant_linear_ref", "quant_partials", "quant_linear", "quant_linear_geglu", "quantize_rows", "ACT_QUANT"]

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
    from .geglu import gelu_tanh_f32
    from .skinny_linear import bias_act

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
    def _dequant_tile_dot(acc, X, xrow_mask, wrows, nmask, WS, wsrow, k0, K, sxm, offs_m,
                          BLOCK_K: tl.constexpr, INT4: tl.constexpr, CDT: tl.constexpr, FP8_DOT: tl.constexpr):
        """acc += x[:, k0:k0+BLOCK_K] @ w[rows, same]^T for one K block (int4: one group, scaled here; 8-bit:
        unscaled, the per-channel scale is applied to the finished sum)."""
        if INT4:
            HALF: tl.constexpr = BLOCK_K // 2
            offs_h = tl.arange(0, HALF)
            gm = k0 < K
            xrow = X + offs_m[:, None] * sxm + k0 + offs_h[None, :]
            a_lo = tl.load(xrow, mask=xrow_mask[:, None] & gm, other=0.0).to(CDT)
            a_hi = tl.load(xrow + HALF, mask=xrow_mask[:, None] & gm, other=0.0).to(CDT)
            b = tl.load(wrows + k0 // 2 + offs_h[None, :], mask=nmask[:, None] & gm, other=0).to(tl.int32)
            # via fp32: exact (and int -> bf16 is not, under the interpreter)
            w_lo = ((b & 15) - 8).to(tl.float32).to(CDT)
            w_hi = ((b >> 4) - 8).to(tl.float32).to(CDT)
            part = tl.dot(a_lo, tl.trans(w_lo), input_precision="ieee")
            part += tl.dot(a_hi, tl.trans(w_hi), input_precision="ieee")
            s = tl.load(WS + wsrow + k0 // BLOCK_K, mask=nmask & gm, other=0.0)
            acc += part * s[None, :]
        else:
            k = k0 + tl.arange(0, BLOCK_K)
            km = k < K
            a = tl.load(X + offs_m[:, None] * sxm + k[None, :], mask=xrow_mask[:, None] & km[None, :], other=0.0)
            w = tl.load(wrows + k[None, :], mask=nmask[:, None] & km[None, :], other=0.0)
            if FP8_DOT:   # fp8 activations and weights: the fp8 tensor-core product, fp32 accumulation
                acc += tl.dot(a, tl.trans(w))
            else:   # int8 via fp32 (exact; int -> bf16 is wrong under the interpreter), fp8 directly
                if w.dtype == tl.int8:
                    w = w.to(tl.float32)
                acc += tl.dot(a.to(CDT), tl.trans(w.to(CDT)), input_precision="ieee")
        return acc

    @triton.jit
    def _quant_skinny_kernel(X, XS, W, WS, P, Y, B, M, N, K, k_per_split, sxm, swn, sws, spk, spm, sym,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             INT4: tl.constexpr, XQ: tl.constexpr, FP8_DOT: tl.constexpr, F32: tl.constexpr,
                             GEGLU: tl.constexpr,
                             DIRECT: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, PDL: tl.constexpr):
        """x [M, K] (XQ: fp8 with per-row scales XS) times a quantized weight's rows, over this program's K slice.
        GEGLU: rows n (gate) and N + n (up) of a [gate; up] weight, N = I. DIRECT (one split): the epilogue
        (bias, GELU / GeGLU) and Y in its dtype; else fp32 partials P[pid_k] (GEGLU: gate at n, up at N + n)."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mmask = offs_m < M
        nmask = offs_n < N
        k0 = pid_k * k_per_split
        CDT: tl.constexpr = tl.float32 if F32 else tl.bfloat16
        rows = offs_n[:, None].to(tl.int64) * swn
        wsrow = offs_n * sws
        up = N.to(tl.int64) * swn
        wait_for_producer(PDL, True)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, k_per_split, BLOCK_K):
            acc = _dequant_tile_dot(acc, X, mmask, W + rows, nmask, WS, wsrow, k0 + kk, K, sxm, offs_m, BLOCK_K,
                                    INT4, CDT, FP8_DOT)
            if GEGLU:
                acc_u = _dequant_tile_dot(acc_u, X, mmask, W + up + rows, nmask, WS, wsrow + N * sws, k0 + kk, K,
                                          sxm, offs_m, BLOCK_K, INT4, CDT, FP8_DOT)
        release_dependents(PDL)
        if not INT4:
            acc = acc * tl.load(WS + offs_n, mask=nmask, other=0.0)[None, :]
            if GEGLU:
                acc_u = acc_u * tl.load(WS + N + offs_n, mask=nmask, other=0.0)[None, :]
        if XQ:
            xs = tl.load(XS + offs_m, mask=mmask, other=0.0)[:, None]
            acc = acc * xs
            acc_u = acc_u * xs
        mask = mmask[:, None] & nmask[None, :]
        if DIRECT:
            if GEGLU:
                out = gelu_tanh_f32(acc) * acc_u
            else:
                out = bias_act(acc, B, offs_n, nmask, HAS_BIAS, ACT)
            tl.store(Y + offs_m[:, None] * sym + offs_n[None, :], out.to(Y.dtype.element_ty), mask=mask)
        else:
            dst = P + pid_k * spk + offs_m[:, None] * spm + offs_n[None, :]
            tl.store(dst, acc, mask=mask)
            if GEGLU:
                tl.store(dst + N, acc_u, mask=mask)

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


def _check(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int, act_quant: Optional[str], n: int):
    require_triton()
    if act_quant not in ACT_QUANT:
        raise ValueError(f"act_quant must be one of {ACT_QUANT}, got {act_quant!r}")
    int4 = q.dtype == torch.uint8
    k = x.shape[-1]
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
    if act_quant and q.dtype != torch.float8_e4m3fn:
        raise ValueError("fp8 activations go with fp8 weights (W8A8)")
    x2 = x.reshape(-1, k)
    if x2.shape[0] > MAX_ROWS or x2.stride(-1) != 1 or q.stride(-1) != 1 or scale.dtype != torch.float32:
        raise ValueError(f"<= {MAX_ROWS} rows with contiguous rows and float32 scales expected")
    return x2, int4


def _launch(x, q, scale, group, act_quant, act_scale, *, geglu=False, direct=None, bias=None, act=None,
            block_n: int = 64, block_k: int = 128, num_warps: int = 4, num_stages: int = 3,
            splits: Optional[int] = None):
    """One GEMM launch -> (Y, None) where ``direct`` and the launch has one K split, else (None, fp32 partials).
    W8A8: the activations are quantized to fp8 once first (``quantize_rows``)."""
    from .skinny_linear import ACTS
    n = q.shape[0] // 2 if geglu else q.shape[0]
    if geglu and q.shape[0] % 2:
        raise ValueError(f"a [gate; up] weight has an even number of rows, got {q.shape[0]}")
    x2, int4 = _check(x, q[:n], scale[:n], group, act_quant, n)
    m, k = x2.shape
    xs = scale
    if act_quant:   # fp8 activations, once per call (dynamic: per-row amax; static: the calibrated scale)
        x2, xs = quantize_rows(x2, act_scale if act_quant == "static" else None)
    if int4:
        block_k = group
    n_blocks = triton.cdiv(n, block_n)
    if splits is None:  # about two programs per multiprocessor, each >= 2 K blocks
        splits = max(1, min(2 * num_sms(x.device) // n_blocks, k // (2 * block_k)))
    k_per = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    s = triton.cdiv(k, k_per)
    write = bool(direct) and s == 1
    y = torch.empty(m, n, dtype=x.dtype, device=x.device) if write else None
    part = None if write else torch.empty(s, m, 2 * n if geglu else n, dtype=torch.float32, device=x.device)
    f32 = x.dtype == torch.float32 or interpret_mode()   # the interpreter's bf16 dots are wrong: fp32 there
    _quant_skinny_kernel[(n_blocks, s)](
        x2, xs, q, scale, part if part is not None else y, y if y is not None else part,
        bias if bias is not None else scale, m, n, k, k_per, x2.stride(0), q.stride(0), scale.stride(0),
        part.stride(0) if part is not None else 0, part.stride(1) if part is not None else 0, n,
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, BLOCK_K=block_k, INT4=int4,
        XQ=bool(act_quant), FP8_DOT=bool(act_quant) and not f32, F32=f32, GEGLU=geglu, DIRECT=write, HAS_BIAS=bias is not None and write,
        ACT=ACTS.index(act) if write else 0, num_warps=num_warps, num_stages=num_stages, **pdl(x.device))
    return y, part


def quant_partials(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int = 0,
                   act_quant: Optional[str] = None, act_scale: Optional[torch.Tensor] = None, **tiling) -> torch.Tensor:
    """fp32 split-K partials [splits, M, N] of x [..., K] (<= 64 rows) times a quantized weight^T (the
    residual + norm epilogues of skinny_epilogue.py sum them)."""
    return _launch(x, q, scale, group, act_quant, act_scale, direct=False, **tiling)[1]


def quant_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int = 0,
                 act_quant: Optional[str] = None, act_scale: Optional[torch.Tensor] = None,
                 bias: Optional[torch.Tensor] = None, act: Optional[str] = None, **tiling) -> torch.Tensor:
    """act(x @ w^T + bias) for a quantized weight -> [..., N] in x.dtype (act None or "gelu_tanh"); one kernel
    where the launch has one K split, else the split sum applies the epilogue."""
    from .skinny_linear import ACTS, sum_splits_kernel
    if act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}, got {act!r}")
    y, part = _launch(x, q, scale, group, act_quant, act_scale, direct=True, bias=bias, act=act, **tiling)
    n = q.shape[0]
    if y is None:
        s, m, _ = part.shape
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        block = 1024
        sum_splits_kernel[(triton.cdiv(m * n, block),)](part, y, part if bias is None else bias, m, n, s,
                                                         part.stride(0), n, n, BLOCK=block, **pdl(x.device),
                                                         HAS_BIAS=bias is not None, ACT=ACTS.index(act))
    return y.view(*x.shape[:-1], n)


def quant_linear_geglu(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int = 0,
                       act_quant: Optional[str] = None, act_scale: Optional[torch.Tensor] = None, **tiling
                       ) -> torch.Tensor:
    """gelu_tanh(x @ Wg^T) * (x @ Wu^T) for a quantized [gate; up] weight [2I, K] -> [..., I] in x.dtype; one
    kernel where the launch has one K split, else the GeGLU sum of skinny_epilogue.py."""
    from .skinny_epilogue import geglu_from_partials
    y, part = _launch(x, q, scale, group, act_quant, act_scale, geglu=True, direct=True, **tiling)
    if y is None:
        return geglu_from_partials(part, x)
    return y.view(*x.shape[:-1], q.shape[0] // 2)
