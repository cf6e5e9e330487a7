"""The action expert's attention as tiles whose last-arriving split merges: no merge kernel.

    q, k_suffix, v_suffix   read from the fused QKV rows [M = B*T, (Hq + 2 Hkv) D] (q and k already rotated:
                            kernels/candidates/expert_gemm.py's ROPE mode), where they lie
    k_prefix, v_prefix      the prefix KV cache [B, Hkv, P, D] (keys rotated)
    mask                    additive (float) or validity (bool) over the P + T keys, [B, 1|T, P+T] (strides)
    out                     token-major rows [M, Hq D], the o-projection's input

As kernels/split_kv_attention.py, the Hq / Hkv heads x T queries of a KV head are packed into one row axis
and the P + T keys are cut into chunks over the tiles (split-KV); a chunk may straddle the prefix / suffix
boundary (two key loops with one online softmax), so one split over all keys is possible too (then the tile
normalises and writes its rows itself). With several splits each tile stores its partial (running max,
sum, unnormalised accumulator, fp32) in a dense workspace slot and takes a ticket on its row tile's counter
(CTA barrier, then an acq_rel atomic at GPU scope); the tile that draws the last ticket merges every split in
split order (deterministic), loading the partials past L1 (``.cg``), writes the output and resets the counter.

fp32 accumulation; fp32 operands use IEEE dots. A query row whose keys are all masked yields 0.
Reference: ``expert_attention_ref``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..common import HAVE_TRITON, cdiv, num_sms, prefetch_l2, tl, triton
from .expert_gemm import MAX_SPLITS_CONST, MAX_SPLITS
from ..split_kv_attention import split_kv_attention_ref

__all__ = ["AttentionPlan", "attention_plan", "expert_attention_ref"]


def expert_attention_ref(qkv: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor,
                         mask: Optional[torch.Tensor], n_heads: int, tokens: int) -> torch.Tensor:
    """fp32 softmax attention of the QKV rows' queries over [prefix cache; their own keys] -> rows [M, Hq D]
    in qkv's dtype."""
    b, hkv, _, d = k_prefix.shape
    q, k, v = qkv.view(b, tokens, -1, d).split((n_heads, hkv, hkv), dim=2)
    out = split_kv_attention_ref(q.transpose(1, 2), k_prefix, v_prefix, k.transpose(1, 2), v.transpose(1, 2), mask)
    return out.transpose(1, 2).reshape(b * tokens, n_heads * d)


class AttentionPlan(NamedTuple):
    """Query tile rows, key block, key chunk per split, tile counts and the partials' workspace (floats)."""
    block_m: int
    block_n: int
    chunk: int
    n_splits: int
    n_mt: int
    n_tiles: int
    ws_floats: int
    num_warps: int
    num_stages: int


def attention_plan(batch: int, n_kv_heads: int, group: int, tokens: int, keys: int, d: int, device: torch.device,
                   *, block_m: int = 16, block_n: int = 64, splits: Optional[int] = None,
                   num_warps: Optional[int] = None, num_stages: int = 2, tiles_per_sm: int = 2) -> AttentionPlan:
    """Key chunks so that the tiles give every multiprocessor about ``tiles_per_sm`` of them (chunks of at least
    two key blocks); ``splits`` fixes the count (1: every tile sees all keys and writes directly)."""
    n_rows = group * tokens
    n_mt = cdiv(n_rows, block_m)
    if splits is None:
        splits = max(1, min(tiles_per_sm * num_sms(device) // max(1, n_mt * batch * n_kv_heads),
                            keys // (2 * block_n)))
    splits = min(splits, MAX_SPLITS)
    chunk = cdiv(cdiv(keys, splits), block_n) * block_n
    splits = cdiv(keys, chunk)
    n_tiles = batch * n_kv_heads * n_mt * splits
    ws = n_tiles * block_m * (d + 2) if splits > 1 else 0
    warps = num_warps or (4 if block_m * d <= 16 * 256 else 8)
    return AttentionPlan(block_m, block_n, chunk, splits, n_mt, n_tiles, ws, warps, num_stages)


if HAVE_TRITON:
    from ..split_kv_attention import masked_softmax_step

    @triton.jit
    def attend_keys(q, m_i, l_i, acc, kb, vb, kn, vn, start, stop, key_off, b, qi, rmask, MASK, smb, smq, smk,
                    qk_scale, MASK_MODE: tl.constexpr, MASK_PER_KEY: tl.constexpr, BLOCK_N: tl.constexpr,
                    D: tl.constexpr, DOT_PREC: tl.constexpr):
        """Online softmax of q's rows over keys [start, stop) of one segment (rows of kb / vb with strides kn /
        vn); key_off: the segment's first key index in the mask."""
        offs_d = tl.arange(0, D)
        for s0 in range(start, stop, BLOCK_N):
            offs_n = s0 + tl.arange(0, BLOCK_N)
            nmask = offs_n < stop
            k = tl.load(kb + offs_n[None, :].to(tl.int64) * kn + offs_d[:, None], mask=nmask[None, :], other=0.0,
                        cache_modifier=".cg")
            s = tl.dot(q, k, input_precision=DOT_PREC) * qk_scale          # log2 units
            p, alpha, m_new, l_i = masked_softmax_step(s, key_off + offs_n, nmask, qi, rmask, b, m_i, l_i, MASK, smb,
                                                       smq, smk, MASK_MODE, MASK_PER_KEY)
            v = tl.load(vb + offs_n[:, None].to(tl.int64) * vn + offs_d[None, :], mask=nmask[:, None], other=0.0,
                        cache_modifier=".cg")
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
            m_i = m_new
        return m_i, l_i, acc

    @triton.jit
    def prefetch_attention_tile(tile, KP, VP, skb, skh, skn, svb, svh, svn, P, Hkv, n_mt, n_splits, chunk,
                                D: tl.constexpr, BLOCK_N: tl.constexpr, LINE: tl.constexpr):
        """L2 prefetch of the prefix keys and values tile ``tile`` will read (the cache is written long before
        the loop, so this may run before any wait)."""
        s = tile % n_splits
        bh = (tile // n_splits) // n_mt
        b = (bh // Hkv).to(tl.int64)
        hk = bh % Hkv
        lines = tl.arange(0, D // LINE) * LINE
        lo = s * chunk
        hi = tl.minimum(lo + chunk, P)
        for s0 in range(lo, hi, BLOCK_N):
            n = tl.minimum(s0 + tl.arange(0, BLOCK_N), P - 1).to(tl.int64)
            prefetch_l2(KP + b * skb + hk * skh + n[:, None] * skn + lines[None, :], True)
            prefetch_l2(VP + b * svb + hk * svh + n[:, None] * svn + lines[None, :], True)

    @triton.jit
    def attention_tile(tile, QKV, sq, KP, VP, skb, skh, skn, svb, svh, svn, MASK, smb, smq, smk, O, so, WS, CNT,
                       T, P, Hq, Hkv, n_rows, n_mt, n_splits, chunk, qk_scale,
                       MASK_MODE: tl.constexpr, MASK_PER_KEY: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, D: tl.constexpr, DOT_PREC: tl.constexpr):
        """One (KV head of one item, query row tile, key split) of the attention; see the module doc."""
        s = tile % n_splits
        rest = tile // n_splits
        mt = rest % n_mt
        bh = rest // n_mt
        b = bh // Hkv
        hk = bh % Hkv
        rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < n_rows
        head = hk * (Hq // Hkv) + rows // T
        qi = rows % T
        offs_d = tl.arange(0, D)
        tok = (b * T + qi).to(tl.int64)
        q = tl.load(QKV + tok[:, None] * sq + head[:, None] * D + offs_d[None, :], mask=rmask[:, None], other=0.0,
                    cache_modifier=".cg")
        lo = s * chunk
        hi = tl.minimum(lo + chunk, P + T)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        # the chunk's part in the prefix cache, then its part in the suffix (its own QKV rows)
        m_i, l_i, acc = attend_keys(q, m_i, l_i, acc, KP + b.to(tl.int64) * skb + hk * skh,
                                    VP + b.to(tl.int64) * svb + hk * svh, skn, svn, lo, tl.minimum(hi, P), 0,
                                    b, qi, rmask, MASK, smb, smq, smk, qk_scale, MASK_MODE, MASK_PER_KEY, BLOCK_N,
                                    D, DOT_PREC)
        suffix = QKV + (b * T).to(tl.int64) * sq
        m_i, l_i, acc = attend_keys(q, m_i, l_i, acc, suffix + (Hq + hk) * D, suffix + (Hq + Hkv + hk) * D, sq, sq,
                                    tl.maximum(lo, P) - P, hi - P, P, b, qi, rmask, MASK, smb, smq, smk, qk_scale,
                                    MASK_MODE, MASK_PER_KEY, BLOCK_N, D, DOT_PREC)
        o_ptrs = O + tok[:, None] * so + head[:, None] * D + offs_d[None, :]
        if n_splits == 1:   # every key seen: normalise and write
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=rmask[:, None])
        else:
            r = tl.arange(0, BLOCK_M)
            slot = BLOCK_M * (D + 2)
            first = WS + (rest * n_splits).to(tl.int64) * slot
            mine = first + s * slot
            tl.store(mine + r, m_i)
            tl.store(mine + BLOCK_M + r, l_i)
            tl.store(mine + 2 * BLOCK_M + r[:, None] * D + offs_d[None, :], acc)
            tl.debug_barrier()        # every thread's partial is stored before the ticket (release) is taken
            ticket = tl.atomic_add(CNT + rest, 1, sem="acq_rel", scope="gpu")
            if ticket == n_splits - 1:   # the last split of this row tile merges all, in split order
                tl.debug_barrier()
                m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
                l_run = tl.zeros([BLOCK_M], tl.float32)
                a_run = tl.zeros([BLOCK_M, D], tl.float32)
                for q_s in tl.static_range(MAX_SPLITS_CONST):   # unrolled: the loads of every split in flight at once
                    part = first + q_s * slot
                    here = q_s < n_splits
                    m_s = tl.load(part + r, mask=here, other=float("-inf"), cache_modifier=".cg")
                    l_s = tl.load(part + BLOCK_M + r, mask=here, other=0.0, cache_modifier=".cg")
                    a_s = tl.load(part + 2 * BLOCK_M + r[:, None] * D + offs_d[None, :], mask=here, other=0.0,
                                  cache_modifier=".cg")
                    m_new = tl.maximum(m_run, m_s)
                    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                    alpha = tl.exp2(m_run - m_safe)
                    w = tl.exp2(m_s - m_safe)
                    l_run = l_run * alpha + w * l_s
                    a_run = a_run * alpha[:, None] + w[:, None] * a_s
                    m_run = m_new
                tl.atomic_xchg(CNT + rest, 0)
                out = a_run / tl.where(l_run == 0.0, 1.0, l_run)[:, None]
                tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=rmask[:, None])
