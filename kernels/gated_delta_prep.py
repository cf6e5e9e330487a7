"""The Gated-DeltaNet layer's elementwise work around its input projection and its rule, fused (Qwen3.5 /
MiniCPM-Robot's LM): two kernels where torch runs about twenty.

``conv_qkv_gates(proj, conv_w, a_log, dt_bias, hk, hv, dk, dv)``: the fused input projection's output
``proj [B, S, conv_dim + value_dim + 2 hv]`` (channels q | k | v | z | b | a) ->

    q, k [B, S, hk, dk]: SiLU(causal depthwise conv of the q / k channels), l2-normalised, q times dk^-1/2
    v    [B, S, hv, dv]: SiLU(causal conv of the v channels)
    beta [B, S, hv]    : sigmoid(b);   g [B, S, hv]: -exp(A_log) * softplus(a + dt_bias)

all float32 (what the delta rule reads). One program per (token, head) reads the head's channels of the last
``kernel`` tokens of its own sequence (earlier rows are the causal zero padding).

``gated_rms_norm(x, z, weight, eps)``: per head, rmsnorm(x) * weight * SiLU(z) -> x's shape in ``out_dtype``
(the out projection's input); z may be a strided view into ``proj``.

Math in float32 with one rounding at the end; the torch references (``*_ref``) round where the model's eager code
does (bf16 between the conv and the norm in a bf16 model), so in bf16 the fused result is the closer to float32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import HAVE_TRITON, available, next_power_of_2, pdl, tl, triton, wait_for_producer

__all__ = ["available", "conv_qkv_gates", "conv_qkv_gates_ref", "gated_rms_norm", "gated_rms_norm_ref"]
L2_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0   # torch's: above it softplus(x) = x


def conv_qkv_gates_ref(proj, conv_w, a_log, dt_bias, hk: int, hv: int, dk: int, dv: int):
    b, s, _ = proj.shape
    key, value = hk * dk, hv * dv
    conv = 2 * key + value
    mixed = F.conv1d(F.pad(proj[..., :conv].transpose(1, 2), (conv_w.shape[-1] - 1, 0)), conv_w, groups=conv)
    mixed = F.silu(mixed).transpose(1, 2).float()
    q, k, v = mixed.split([key, key, value], dim=-1)
    q, k = q.reshape(b, s, hk, dk), k.reshape(b, s, hk, dk)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2_EPS) * dk ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
    gates = proj[..., conv + value:].float()
    beta = gates[..., :hv].sigmoid()
    g = -a_log.float().exp() * F.softplus(gates[..., hv:] + dt_bias.float())
    return q, k, v.reshape(b, s, hv, dv), beta, g


def gated_rms_norm_ref(x, z, weight, eps: float, out_dtype=None):
    """x [B, S, H, D], z [B, S, H * D] -> [B, S, H * D]."""
    b, s, h, d = x.shape
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = normed * weight.float() * F.silu(z.reshape(b, s, h, d).float())
    return out.reshape(b, s, h * d).to(out_dtype or x.dtype)


if HAVE_TRITON:

    @triton.jit
    def _conv_qkv_gates_kernel(P, W, ALOG, DTB, Q, K, V, BETA, G, S, sp_b, sp_s, HK: tl.constexpr,
                               HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, KERNEL: tl.constexpr,
                               BLOCK: tl.constexpr, PDL: tl.constexpr):
        wait_for_producer(PDL)
        row = tl.program_id(0).to(tl.int64)          # b * S + t
        head = tl.program_id(1)                      # q heads, k heads, v heads
        bi = row // S
        t = row % S
        is_q = head < HK
        is_k = (head >= HK) & (head < 2 * HK)
        width = tl.where(head < 2 * HK, DK, DV)
        start = tl.where(head < 2 * HK, head * DK, 2 * HK * DK + (head - 2 * HK) * DV)
        offs = tl.arange(0, BLOCK)
        cmask = offs < width
        ch = start + offs
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        base = P + bi * sp_b
        for i in tl.static_range(KERNEL):
            src = t - (KERNEL - 1) + i
            w = tl.load(W + ch * KERNEL + i, mask=cmask, other=0.0).to(tl.float32)
            x = tl.load(base + src * sp_s + ch, mask=cmask & (src >= 0), other=0.0).to(tl.float32)
            acc += w * x
        y = acc / (1.0 + tl.exp(-acc))                # SiLU
        if head < 2 * HK:
            inv = 1.0 / tl.sqrt(tl.sum(tl.where(cmask, y * y, 0.0), axis=0) + 1e-6)
            y = y * inv
            if is_q:
                y = y * (1.0 / tl.sqrt(DK * 1.0))
                tl.store(Q + row * (HK * DK) + head * DK + offs, y, mask=cmask)
            if is_k:
                tl.store(K + row * (HK * DK) + (head - HK) * DK + offs, y, mask=cmask)
        else:
            vh = head - 2 * HK
            tl.store(V + row * (HV * DV) + vh * DV + offs, y, mask=cmask)
        if head < HV:                                 # the gates of V head `head`
            gate_base = base + t * sp_s + 2 * HK * DK + 2 * HV * DV
            b = tl.load(gate_base + head).to(tl.float32)
            a = tl.load(gate_base + HV + head).to(tl.float32) + tl.load(DTB + head).to(tl.float32)
            softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
            tl.store(BETA + row * HV + head, 1.0 / (1.0 + tl.exp(-b)))
            tl.store(G + row * HV + head, -tl.exp(tl.load(ALOG + head).to(tl.float32)) * softplus)

    @triton.jit
    def _gated_rms_kernel(X, Z, W, OUT, H, sx, sz, so, eps, D: tl.constexpr, BLOCK: tl.constexpr,
                          PDL: tl.constexpr):
        wait_for_producer(PDL)
        row = tl.program_id(0).to(tl.int64)          # token
        head = tl.program_id(1)
        offs = tl.arange(0, BLOCK)
        mask = offs < D
        x = tl.load(X + row * sx + head * D + offs, mask=mask, other=0.0).to(tl.float32)
        z = tl.load(Z + row * sz + head * D + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
        y = x * rstd * w * (z / (1.0 + tl.exp(-z)))
        tl.store(OUT + row * so + head * D + offs, y.to(OUT.dtype.element_ty), mask=mask)


def conv_qkv_gates(proj, conv_w, a_log, dt_bias, hk: int, hv: int, dk: int, dv: int):
    """See the module docstring. proj [B, S, P] with a contiguous last dim; conv_w [conv_dim, 1, kernel]."""
    b, s, p = proj.shape
    conv = 2 * hk * dk + hv * dv
    if p != conv + hv * dv + 2 * hv or proj.stride(-1) != 1 or conv_w.shape[0] != conv:
        raise ValueError(f"proj [.., {p}] / conv weight {tuple(conv_w.shape)} do not fit hk={hk} hv={hv} "
                         f"dk={dk} dv={dv}")
    dev = proj.device
    q = torch.empty(b, s, hk, dk, device=dev, dtype=torch.float32)
    k = torch.empty_like(q)
    v = torch.empty(b, s, hv, dv, device=dev, dtype=torch.float32)
    beta = torch.empty(b, s, hv, device=dev, dtype=torch.float32)
    g = torch.empty_like(beta)
    if b * s == 0:
        return q, k, v, beta, g
    w = conv_w.reshape(conv, -1).contiguous()
    block = next_power_of_2(max(dk, dv))
    _conv_qkv_gates_kernel[(b * s, 2 * hk + hv)](
        proj, w, a_log, dt_bias, q, k, v, beta, g, s, proj.stride(0), proj.stride(1), HK=hk, HV=hv, DK=dk, DV=dv,
        KERNEL=w.shape[1], BLOCK=block, num_warps=1 if block <= 128 else 2, **pdl(dev))
    return q, k, v, beta, g


def gated_rms_norm(x, z, weight, eps: float, out_dtype=None):
    """x [B, S, H, D] (contiguous), z [B, S, H * D] (last dim contiguous, rows strided) -> [B, S, H * D]."""
    b, s, h, d = x.shape
    out = torch.empty(b, s, h * d, device=x.device, dtype=out_dtype or x.dtype)
    if b * s == 0:
        return out
    x2, z2 = x.reshape(b * s, h * d), z.reshape(b * s, h * d)
    if x2.stride(-1) != 1 or z2.stride(-1) != 1:
        raise ValueError("gated_rms_norm: x and z need a contiguous last dim")
    block = next_power_of_2(d)
    _gated_rms_kernel[(b * s, h)](x2, z2, weight, out, h, x2.stride(0), z2.stride(0), h * d, float(eps), D=d,
                                  BLOCK=block, num_warps=1 if block <= 128 else 2, **pdl(x.device))
    return out
