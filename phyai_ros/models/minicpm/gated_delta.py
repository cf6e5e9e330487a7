"""The gated delta rule of Qwen3.5's Gated-DeltaNet layers, in two forms that compute the same thing.

Per head, a state S [dk, dv] starts at 0; for each token t (q, k l2-normalised, q scaled by 1 / sqrt(dk)):

    S <- exp(g_t) S;   S <- S + k_t (beta_t (v_t - k_t^T S))^T;   o_t = S^T q_t

``recurrent`` runs that token by token (the definition; also a decoder's one-token step). ``chunked`` is the
form a prefill runs: chunks of C tokens, inside a chunk the WY form of the delta updates, between chunks the
state. Inside a chunk with cumulative log-decays G (G_i = g_1 + ... + g_i) and L the strictly lower part of
diag(beta) K K^T (.) exp(G_i - G_j), the C corrected values are U = (I + L)^-1 [V beta | K beta exp(G)]. The
reference solves that by 63 row updates; here (I + L)^-1 = (I - L)(I + L^2)(I + L^4)... (L is nilpotent, L^C = 0),
log2(C) batched matrix products, so a CUDA graph holds a handful of GEMMs instead of a loop of small kernels.
Everything runs in float32, as the reference does.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
L2_EPS = 1e-6


def l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def _prepare(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, normalized: bool = False):
    """[B, S, H, d] / [B, S, H] -> float32 head-major [B, H, S, d] / [B, H, S], q and k normalised, q scaled
    (``normalized``: they come so already, layers.gated_delta_ops.conv_qkv_gates)."""
    if not normalized:
        q, k = l2norm(q.float()), l2norm(k.float())
        q = q * q.shape[-1] ** -0.5
    return [x.transpose(1, 2).float() for x in (q, k, v, g, beta)]


def recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
              state: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Token by token: (o [B, S, H, dv] in v's dtype, final state [B, H, dk, dv])."""
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    b, h, s, dk = k.shape
    dv = v.shape[-1]
    st = torch.zeros(b, h, dk, dv, device=v.device) if state is None else state.float()
    out = torch.empty(b, h, s, dv, device=v.device)
    for t in range(s):
        st = st * g[:, :, t].exp()[..., None, None]
        delta = (v[:, :, t] - (st * k[:, :, t, :, None]).sum(-2)) * beta[:, :, t, None]
        st = st + k[:, :, t, :, None] * delta[:, :, None, :]
        out[:, :, t] = (st * q[:, :, t, :, None]).sum(-2)
    return out.transpose(1, 2).to(dtype), st


def unit_lower_inverse(lower: Tensor) -> Tensor:
    """(I + L)^-1 for strictly lower-triangular L [..., C, C]: the product of (I + (-L)^(2^i)) while the power is
    not yet zero (C a power of two or not: ceil(log2 C) factors), two batched products per factor."""
    c = lower.shape[-1]
    shape = lower.shape
    power = (-lower).reshape(-1, c, c)
    inv = power + torch.eye(c, device=lower.device, dtype=lower.dtype)
    span = 2
    while span < c:
        power = torch.bmm(power, power)
        inv = torch.baddbmm(inv, inv, power)        # inv (I + power)
        span *= 2
    return inv.reshape(shape)


def chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, chunk: int = 64,
            state: Optional[Tensor] = None, normalized: bool = False) -> Tuple[Tensor, Tensor]:
    """Chunks of ``chunk`` tokens (the sequence zero-padded to a multiple): (o [B, S, H, dv] in v's dtype, final
    state). Fixed shapes and no host reads: capture-safe. Everything a chunk's state step needs besides the state
    is made for all chunks at once, chunk-major ([n, B*H, C, d]: each chunk's slice contiguous), so the sequential
    part is three fused matrix products per chunk."""
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta, normalized)
    b, h, s, dk = k.shape
    dv = v.shape[-1]
    pad = (-s) % chunk
    n = (s + pad) // chunk

    def chunks(x):   # [B, H, S, d] -> [n, B*H, C, d]
        x = F.pad(x, (0, 0, 0, pad)).reshape(b * h, n, chunk, x.shape[-1])
        return x.transpose(0, 1).contiguous()
    q, k, v = chunks(q), chunks(k), chunks(v)
    g = chunks(g[..., None])[..., 0].cumsum(-1)                      # [n, BH, C] cumulative log-decay
    beta = chunks(beta[..., None])[..., 0]
    lower_incl = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()
    decay = torch.where(lower_incl, (g[..., :, None] - g[..., None, :]).clamp(max=0).exp(), 0.0)
    kb = k * beta[..., None]
    strict = (kb @ k.transpose(-1, -2) * decay).tril(-1)
    solved = unit_lower_inverse(strict) @ torch.cat([v * beta[..., None], kb * g.exp()[..., None]], dim=-1)
    values, k_decay = solved[..., :dv].contiguous(), solved[..., dv:].contiguous()
    intra = q @ k.transpose(-1, -2) * decay
    q_decayed = q * g.exp()[..., None]
    k_tail = (k * (g[..., -1:] - g).exp()[..., None]).transpose(-1, -2).contiguous()   # decay to the chunk's end
    chunk_decay = g[..., -1].exp()[..., None, None]                  # [n, BH, 1, 1]
    st = torch.zeros(b * h, dk, dv, device=v.device) if state is None else state.float().reshape(b * h, dk, dv)
    outs = []
    for i in range(n):
        fresh = torch.baddbmm(values[i], k_decay[i], st, alpha=-1.0)
        outs.append(torch.baddbmm(torch.bmm(q_decayed[i], st), intra[i], fresh))
        st = torch.baddbmm(st * chunk_decay[i], k_tail[i], fresh)
    out = torch.stack(outs, 0).transpose(0, 1).reshape(b, h, n * chunk, dv)[:, :, :s]
    return out.transpose(1, 2).to(dtype), st.reshape(b, h, dk, dv)


__all__ = ["chunked", "recurrent", "l2norm", "unit_lower_inverse"]
