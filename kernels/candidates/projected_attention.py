"""A few-row attention block's input projection and its attention as one kernel (GR00T's DiT, issue 23).

    y        [B, T, K]        the block's normed input (T <= 64 rows: GR00T's 41 state + action tokens)
    weight   [N, K], bias [N] self-attention: the fused to_qkv (N = 3 * H * d, q then k then v);
                              cross-attention: to_q (N = H * d), the keys and values cached per observation
    k_cache, v_cache          cross-attention only: [B, H, L, d] (any strides, last dim contiguous)
    mask                      cross-attention only: additive, per key ([B|1, 1, 1, L] or [B|1, L])
    out      [B, T, H * d]    token-major, what the output projection reads

Why one kernel: at batch 1 the projection is a few-row GEMM bound by its own latency (GR00T's 41 x 1536 -> 1536
q projection takes 6.4 us for 4.7 MB of weights on the H200, 2026-12-02) and the attention after it is ~1 us of
work in a 3-4 us kernel; each DiT block pays both launches, ramps and tails, 128 blocks a chunk.

How: one program per (batch item, head, K split) computes that head's q (and k, v) over its slice of K, the
reduction split so that the projection streams its weights from ~2 programs per multiprocessor. Each split writes
its fp32 partial to a dense workspace slot, then takes a ticket (CTA barrier, acq_rel atomic at GPU scope, as
kernels/candidates/expert_gemm.py); the program that draws the last ticket sums the partials in split order
(deterministic, loads past L1), adds the bias, rounds q / k / v to the activation dtype as the projection's output would be, runs
the head's attention (all keys in one block, softmax in fp32; a row with every key masked gives 0) and writes its
output columns; it resets the counter, so the next call or graph replay starts at 0.

The ticket counters are one buffer per device shared by every call: calls on one stream run one after another
and each leaves its counters at 0 (a call on a second stream at the same time would need its own).
Reference: ``projected_attention_ref`` (fp32 projection, rounded, then fp32 attention).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ..rope import split_heads
from ..common import (HAVE_TRITON, LOG2E, cdiv, check_tensors, next_power_of_2, num_sms, pdl, tl, triton,
                     wait_for_producer)

__all__ = ["MAX_ROWS", "MAX_KEYS", "MAX_SPLITS", "fits", "projected_attention", "projected_attention_ref"]

MAX_ROWS = 64      # query rows per item: one row tile holds them all
MAX_KEYS = 256     # cached keys per item: one key block holds them all
MAX_SPLITS = 8     # K splits per head at most
LOG2E_F = tl.constexpr(LOG2E) if HAVE_TRITON else LOG2E


# --------------------------------------------------------------------------- reference
def projected_attention_ref(y: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], n_heads: int,
                            k_cache: Optional[torch.Tensor] = None, v_cache: Optional[torch.Tensor] = None,
                            mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp32 projection rounded to y's dtype (as a GEMM's output), then fp32 attention; [B, T, H * d] in y's dtype
    (for rows that attend somewhere: where every key is masked the kernel gives 0)."""
    b, t, _ = y.shape
    p = torch.nn.functional.linear(y.float(), weight.float(), None if bias is None else bias.float()).to(y.dtype)
    if k_cache is None:
        q, k, v = (x.float() for x in split_heads(p, n_heads, n_heads, p.shape[-1] // (3 * n_heads)))
    else:
        q = p.view(b, t, n_heads, -1).transpose(1, 2).float()
        k, v = k_cache.float(), v_cache.float()
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if mask is not None:
        s = s + _per_key(mask, b, k.shape[2]).float()[:, None, None, :]
    o = torch.softmax(s, dim=-1) @ v
    return o.transpose(1, 2).reshape(b, t, -1).to(y.dtype)


def _per_key(mask: torch.Tensor, b: int, n_keys: int) -> torch.Tensor:
    """An additive per-key mask ([B|1, 1, 1, L] or [B|1, L]) as [B, L] (a view)."""
    m = mask.reshape(mask.shape[0], mask.shape[-1]) if mask.dim() in (2, 4) else None
    if m is None or mask.numel() != mask.shape[0] * n_keys or mask.shape[-1] != n_keys or m.shape[0] not in (1, b):
        raise ValueError(f"mask must be additive per key, [B|1, 1, 1, {n_keys}] or [B|1, {n_keys}]; got "
                         f"{tuple(mask.shape)}")
    return m.expand(b, n_keys)


def fits(y: torch.Tensor, weight: torch.Tensor, n_heads: int, k_cache: Optional[torch.Tensor] = None,
         mask: Optional[torch.Tensor] = None) -> bool:
    """Shapes the kernel takes: few rows, a head width that splits the projection, keys that fit one block, a mask
    per key (self-attention: none), one activation dtype."""
    parts = 3 if k_cache is None else 1     # q, k, v from the fused projection; else q alone
    if y.dim() != 3 or weight.dim() != 2 or y.shape[1] > MAX_ROWS or weight.shape[1] != y.shape[2]:
        return False
    if weight.shape[0] % (parts * n_heads) or y.dtype != weight.dtype:
        return False
    if k_cache is None:
        return mask is None
    d = weight.shape[0] // n_heads
    if k_cache.dim() != 4 or k_cache.shape[1] != n_heads or k_cache.shape[3] != d or k_cache.shape[2] > MAX_KEYS:
        return False
    if mask is None:
        return True
    return mask.dim() in (2, 4) and mask.numel() == mask.shape[0] * k_cache.shape[2] and \
        mask.shape[0] in (1, y.shape[0])


# --------------------------------------------------------------------------- kernel
if HAVE_TRITON:
    @triton.jit
    def _attend(q, kt, vt, keys, kmask, b, h, t, tmask, dd, dmask, MASK, s_mb, OUT, s_ob, s_ot, qk_scale,
                D: tl.constexpr, HAS_MASK: tl.constexpr, DOT_PREC: tl.constexpr):
        """softmax(q kt^T * scale + mask) vt for one head's rows, written into its columns of OUT."""
        s = tl.dot(q, tl.trans(kt), input_precision=DOT_PREC) * qk_scale
        if HAS_MASK:
            s += tl.load(MASK + b.to(tl.int64) * s_mb + keys, mask=kmask, other=0.0).to(tl.float32)[None, :] * LOG2E_F
        s = tl.where(kmask[None, :], s, float("-inf"))
        m = tl.max(s, axis=1)
        m = tl.where(m == float("-inf"), 0.0, m)      # every key masked: p = 0, the row's output 0
        p = tl.exp2(s - m[:, None])
        l = tl.sum(p, axis=1)
        o = tl.dot(p.to(vt.dtype), vt, input_precision=DOT_PREC) / tl.where(l > 0.0, l, 1.0)[:, None]
        dst = OUT + b.to(tl.int64) * s_ob + t[:, None].to(tl.int64) * s_ot + (h * D + dd)[None, :]
        tl.store(dst, o.to(OUT.dtype.element_ty), mask=tmask[:, None] & dmask[None, :])

    @triton.jit
    def _projected_attention_kernel(
            Y, W, BIAS, KC, VC, MASK, WS, CNT, OUT,
            T, K, L, n_heads, n_splits, k_per,
            s_yb, s_yt, s_w, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_ob, s_ot, qk_scale,
            D: tl.constexpr, SELF: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
            BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr,
            DOT_PREC: tl.constexpr, PDL: tl.constexpr):
        bh = tl.program_id(0)
        s = tl.program_id(1)
        b = bh // n_heads
        h = bh % n_heads
        HD = n_heads * D
        t = tl.arange(0, BLOCK_T)
        dd = tl.arange(0, BLOCK_D)
        tmask = t < T
        dmask = dd < D
        y_rows = Y + b.to(tl.int64) * s_yb + t[:, None].to(tl.int64) * s_yt
        w_q = W + (h * D + dd)[:, None].to(tl.int64) * s_w           # [BD, 1]: this head's q rows of the weight
        w_k = W + (HD + h * D + dd)[:, None].to(tl.int64) * s_w
        w_v = W + (2 * HD + h * D + dd)[:, None].to(tl.int64) * s_w
        wait_for_producer(PDL)
        acc_q = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        acc_k = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        acc_v = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        k0 = s * k_per
        offs_k = tl.arange(0, BLOCK_K)
        for kk in range(0, k_per, BLOCK_K):
            k = k0 + kk + offs_k
            km = k < K
            a = tl.load(y_rows + k[None, :], mask=tmask[:, None] & km[None, :], other=0.0)
            wmask = dmask[:, None] & km[None, :]
            acc_q += tl.dot(a, tl.trans(tl.load(w_q + k[None, :], mask=wmask, other=0.0)), input_precision=DOT_PREC)
            if SELF:
                acc_k += tl.dot(a, tl.trans(tl.load(w_k + k[None, :], mask=wmask, other=0.0)),
                                input_precision=DOT_PREC)
                acc_v += tl.dot(a, tl.trans(tl.load(w_v + k[None, :], mask=wmask, other=0.0)),
                                input_precision=DOT_PREC)
        mine = tmask[:, None] & dmask[None, :]
        if n_splits > 1:
            # dense slots [splits, parts, T, D] per (item, head); padding rows / columns are not stored
            parts = 3 if SELF else 1
            slot = t[:, None] * D + dd[None, :]
            first = WS + (bh * n_splits * parts).to(tl.int64) * (T * D)
            tl.store(first + (s * parts) * (T * D) + slot, acc_q, mask=mine)
            if SELF:
                tl.store(first + (s * parts + 1) * (T * D) + slot, acc_k, mask=mine)
                tl.store(first + (s * parts + 2) * (T * D) + slot, acc_v, mask=mine)
            tl.debug_barrier()        # every thread's partial is stored before the ticket (release) is taken
            ticket = tl.atomic_add(CNT + bh, 1, sem="acq_rel", scope="gpu")
            if ticket == n_splits - 1:   # the last split of this head: sum all, in split order, and attend
                tl.debug_barrier()
                acc_q = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
                acc_k = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
                acc_v = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
                for q in range(0, n_splits):   # not unrolled: 3 x 8 fp32 tiles in flight would spill
                    acc_q += tl.load(first + (q * parts) * (T * D) + slot, mask=mine, other=0.0, cache_modifier=".cg")
                    if SELF:
                        acc_k += tl.load(first + (q * parts + 1) * (T * D) + slot, mask=mine, other=0.0,
                                         cache_modifier=".cg")
                        acc_v += tl.load(first + (q * parts + 2) * (T * D) + slot, mask=mine, other=0.0,
                                         cache_modifier=".cg")
                tl.atomic_xchg(CNT + bh, 0)
                _finish(acc_q, acc_k, acc_v, b, h, t, tmask, dd, dmask, BIAS, KC, VC, MASK, OUT, L, HD,
                        s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_ob, s_ot, qk_scale,
                        D, SELF, HAS_BIAS, HAS_MASK, BLOCK_L, DOT_PREC)
        else:
            _finish(acc_q, acc_k, acc_v, b, h, t, tmask, dd, dmask, BIAS, KC, VC, MASK, OUT, L, HD,
                    s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_ob, s_ot, qk_scale,
                    D, SELF, HAS_BIAS, HAS_MASK, BLOCK_L, DOT_PREC)

    @triton.jit
    def _finish(acc_q, acc_k, acc_v, b, h, t, tmask, dd, dmask, BIAS, KC, VC, MASK, OUT, L, HD,
                s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_ob, s_ot, qk_scale,
                D: tl.constexpr, SELF: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
                BLOCK_L: tl.constexpr, DOT_PREC: tl.constexpr):
        """The projection's bias and rounding, then the attention over the head's keys."""
        dt = OUT.dtype.element_ty   # the activation dtype (out is y's)
        if HAS_BIAS:
            acc_q += tl.load(BIAS + h * D + dd, mask=dmask, other=0.0).to(tl.float32)[None, :]
        q = acc_q.to(dt)
        if SELF:   # keys and values are the rows themselves
            if HAS_BIAS:
                acc_k += tl.load(BIAS + HD + h * D + dd, mask=dmask, other=0.0).to(tl.float32)[None, :]
                acc_v += tl.load(BIAS + 2 * HD + h * D + dd, mask=dmask, other=0.0).to(tl.float32)[None, :]
            _attend(q, acc_k.to(dt), acc_v.to(dt), t, tmask, b, h, t, tmask, dd, dmask, OUT, 0, OUT, s_ob, s_ot,
                    qk_scale, D, False, DOT_PREC)
        else:
            j = tl.arange(0, BLOCK_L)
            jm = j < L
            cm = jm[:, None] & dmask[None, :]
            kt = tl.load(KC + b.to(tl.int64) * s_kb + h * s_kh + j[:, None] * s_kl + dd[None, :], mask=cm, other=0.0)
            vt = tl.load(VC + b.to(tl.int64) * s_vb + h * s_vh + j[:, None] * s_vl + dd[None, :], mask=cm, other=0.0)
            _attend(q, kt.to(dt), vt.to(dt), j, jm, b, h, t, tmask, dd, dmask, MASK, s_mb, OUT, s_ob, s_ot,
                    qk_scale, D, HAS_MASK, DOT_PREC)


# --------------------------------------------------------------------------- launch
_COUNTERS: Dict[tuple, torch.Tensor] = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """The device's ticket counters (zero between calls: every call's last programs reset theirs)."""
    key = (device.type, device.index)
    c = _COUNTERS.get(key)
    if c is None or c.numel() < n:
        c = _COUNTERS[key] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return c


def projected_attention(y: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], n_heads: int,
                        k_cache: Optional[torch.Tensor] = None, v_cache: Optional[torch.Tensor] = None,
                        mask: Optional[torch.Tensor] = None, *, splits: Optional[int] = None, block_k: int = 64,
                        num_warps: int = 4, num_stages: int = 2) -> torch.Tensor:
    """attention(heads(y @ weight^T + bias), ...) -> [B, T, H * d] in y's dtype (see the module docstring).
    ``splits``: K splits per head (default: ~2 programs per multiprocessor, each split >= 2 K blocks)."""
    check_tensors(("y", y), ("weight", weight), ("bias", bias), ("k_cache", k_cache), ("v_cache", v_cache))
    if (k_cache is None) != (v_cache is None):
        raise ValueError("pass both k_cache and v_cache (cross-attention), or neither (self-attention)")
    if not fits(y, weight, n_heads, k_cache, mask) or (v_cache is not None and v_cache.shape != k_cache.shape):
        raise ValueError(f"projected_attention does not take y {tuple(y.shape)}, weight {tuple(weight.shape)}, "
                         f"{n_heads} heads, keys {None if k_cache is None else tuple(k_cache.shape)}, mask "
                         f"{None if mask is None else tuple(mask.shape)}")
    self_attn = k_cache is None
    B, T, K = y.shape
    d = weight.shape[0] // (3 if self_attn else 1) // n_heads
    out = torch.empty(B, T, n_heads * d, dtype=y.dtype, device=y.device)
    if B == 0 or T == 0:
        return out
    if splits is None:
        splits = max(1, min(cdiv(2 * num_sms(y.device), B * n_heads), K // (2 * block_k)))
    splits = max(1, min(splits, MAX_SPLITS))
    k_per = cdiv(cdiv(K, splits), block_k) * block_k
    splits = cdiv(K, k_per)
    parts = 3 if self_attn else 1
    ws = torch.empty(B * n_heads * splits * parts * T * d if splits > 1 else 1, dtype=torch.float32,
                     device=y.device)
    if self_attn:
        kc = vc = y   # dummy pointers, never read
        L, ks, vs = T, (0, 0, 0), (0, 0, 0)
    else:
        kc, vc, L = k_cache, v_cache, k_cache.shape[2]
        ks, vs = k_cache.stride()[:3], v_cache.stride()[:3]
    if mask is not None:
        m = _per_key(mask, B, L)
        m_arg, s_mb = m, m.stride(0)
        if m.stride(1) != 1:
            m_arg, s_mb = m.contiguous(), L
    else:
        m_arg, s_mb = y, 0
    block_t = max(16, next_power_of_2(T))
    _projected_attention_kernel[(B * n_heads, splits)](
        y, weight, weight if bias is None else bias, kc, vc, m_arg, ws, _counters(y.device, B * n_heads), out,
        T, K, L, n_heads, splits, k_per,
        y.stride(0), y.stride(1), weight.stride(0), *ks, *vs, s_mb, out.stride(0), out.stride(1),
        d ** -0.5 * LOG2E,
        D=d, SELF=self_attn, HAS_BIAS=bias is not None, HAS_MASK=mask is not None, BLOCK_T=block_t,
        BLOCK_D=max(16, next_power_of_2(d)), BLOCK_K=block_k, BLOCK_L=block_t if self_attn else
        max(16, next_power_of_2(L)), DOT_PREC="ieee" if y.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages, **pdl(y.device))
    return out
