"""Split-KV (flash-decoding style) attention for the pi0.5 action expert.

    q        [B, Hq, Lq, D]        (pi0.5: 8 heads, 50 action queries, D = 256)
    k_prefix [B, Hkv, P, D], v_prefix   (prefix KV cache, P ~ 968; Hkv = 1)
    k_suffix [B, Hkv, S, D], v_suffix   (the S = 50 suffix keys), or None
    mask     over the P + S keys (prefix keys first):
             bool  -> validity (True = attend, SDPA convention), or
             float -> additive (added to the scaled scores),
             shape [B, P+S] (per key), [B, Lq, P+S], or SDPA-style [B, 1, Lq|1, P+S].
    out      [B, Hq, Lq, D] in q's dtype  = softmax(q k^T * scale + mask) v

The prefix and suffix K/V are read where they lie (no concatenation).  The
shape is latency-bound -- a few hundred query rows against ~1K keys of ONE KV
head -- so:

* all Hq/Hkv heads x Lq queries of a KV head are packed into one "row" axis
  (8 x 50 = 400 rows share every K/V tile: GQA packing);
* the keys are split into chunks over a second grid axis; each program runs an
  online softmax over its chunk for BLOCK_M packed rows and writes the partial
  (running max m, sum l, unnormalised acc) in fp32;
* a second small kernel merges the splits (log-sum-exp rescaling) and writes out;
* with one split (``num_splits=1`` and no suffix: long-query self-attention such as
  the prefix pass, where row tiles alone fill the GPU) the program normalises and
  writes the output itself: no workspace, no second kernel.

fp32 accumulation throughout; fp32 inputs use IEEE fp32 dots (no TF32).  A
query row whose keys are all masked out yields 0 (SDPA yields NaN there).

Measured (H200, bf16, pi0.5 shape, P=968, S=50, bool key mask; per call inside
a CUDA graph): B=1 10.6-10.8 us, B=4 ~19-22 us, vs torch SDPA 61-64 us.  Defaults
(BLOCK_M=64, BLOCK_N=32, 4 warps, 2 stages, ~2 programs/SM, >= 64-key chunks)
come from scripts/bench_kernels.py --sweep.  Launched eagerly the host cost
(~90 us: two Triton launches + one workspace allocation) exceeds the GPU time:
capture the expert step in a CUDA graph.

Reference function: ``split_kv_attention_ref`` (explicit fp32 softmax on
concatenated K/V).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .rope import qkv_rope_ref, split_heads
from .common import (HAVE_TRITON, LOG2E, available, check_tensors, next_power_of_2, num_sms, pdl,
                      release_dependents, tl, triton, wait_for_producer)

__all__ = ["available", "split_kv_attention", "split_kv_attention_ref", "rope_split_kv_attention",
           "rope_split_kv_attention_ref"]

_COMBINE_MAX_ELEMS = 8192  # splits x head_dim loaded at once by the combine kernel


# --------------------------------------------------------------------------- reference
def _mask_3d(mask: Optional[torch.Tensor], B: int, Lq: int, Lk: int) -> Optional[torch.Tensor]:
    """Normalise a mask to a [B, Lq|1, Lk] view (no copy)."""
    if mask is None:
        return None
    m = mask
    if m.dim() == 4:
        if m.shape[1] != 1:
            raise ValueError(f"4-D mask must be [B, 1, Lq|1, Lk] (same for all heads), got {tuple(m.shape)}")
        m = m[:, 0]
    elif m.dim() == 2:
        m = m[:, None, :]
    elif m.dim() != 3:
        raise ValueError(f"mask must be 2-, 3- or 4-D, got {tuple(m.shape)}")
    if m.shape[0] not in (1, B) or m.shape[1] not in (1, Lq) or m.shape[2] != Lk:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not broadcast to [B={B}, Lq={Lq}, Lk={Lk}]")
    return m.expand(B, m.shape[1], Lk)


def mask_strides(mask: torch.Tensor, B: int, Lq: int, Lk: int):
    """(mode, per_key, stride_b, stride_q, stride_k) of a mask broadcast to [B, Lq, Lk],
    read from its shape/strides without building views (cheap on the host)."""
    if mask.dtype == torch.bool:
        mode = 1
    elif mask.is_floating_point():
        mode = 2
    else:
        raise TypeError(f"mask must be bool or floating, got {mask.dtype}")
    shp, st = mask.shape, mask.stride()
    nd = len(shp)
    if nd == 4 and shp[1] == 1:
        shp, st = (shp[0], shp[2], shp[3]), (st[0], st[2], st[3])
    elif nd == 2:
        shp, st = (shp[0], 1, shp[1]), (st[0], 0, st[1])
    elif nd != 3:
        raise ValueError(f"mask must be [B, Lk], [B, Lq|1, Lk] or [B, 1, Lq|1, Lk], got {tuple(mask.shape)}")
    if shp[0] not in (1, B) or shp[1] not in (1, Lq) or shp[2] != Lk:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not broadcast to [B={B}, Lq={Lq}, Lk={Lk}]")
    smb = st[0] if shp[0] == B and B > 1 else 0
    per_key = shp[1] == 1 or st[1] == 0 or Lq == 1
    smq = 0 if per_key else st[1]
    return mode, per_key, smb, smq, st[2]


def split_kv_attention_ref(q, k_prefix, v_prefix, k_suffix=None, v_suffix=None,
                           mask=None, scale: Optional[float] = None) -> torch.Tensor:
    """Explicit softmax attention in fp32 (upcasts inputs), output in q.dtype.
    Fully-masked query rows give 0 (like the kernel)."""
    B, Hq, Lq, D = q.shape
    k = k_prefix if k_suffix is None else torch.cat([k_prefix, k_suffix], dim=2)
    v = v_prefix if v_suffix is None else torch.cat([v_prefix, v_suffix], dim=2)
    Hkv, Lk = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    k = k.float().repeat_interleave(Hq // Hkv, dim=1)
    v = v.float().repeat_interleave(Hq // Hkv, dim=1)
    s = torch.matmul(q.float(), k.transpose(-1, -2)) * scale  # [B, Hq, Lq, Lk]
    m = _mask_3d(mask, B, Lq, Lk)
    if m is not None:
        m = m[:, None]
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
    row_max = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max))
    denom = p.sum(-1, keepdim=True)
    out = torch.matmul(p, v) / torch.where(denom == 0, torch.ones_like(denom), denom)
    return out.to(q.dtype)


# --------------------------------------------------------------------------- kernels
if HAVE_TRITON:

    @triton.jit
    def masked_softmax_step(s, kidx, nmask, qi, rmask, b, m_i, l_i, MASK, smb, smq, smk, MASK_MODE: tl.constexpr,
                            MASK_PER_KEY: tl.constexpr):
        """One key block of the online softmax, shared by the split-KV and the expert-stack attention: scores
        ``s`` [rows, keys] (log2 units) of keys ``kidx`` masked (MASK_MODE 0: none; 1: bool / nonzero = attend;
        2: additive, converted to log2 units; MASK_PER_KEY: one [keys] row per item, else [rows, keys]), then
        the running max / sum updated. Returns (p, alpha, m_new, l_new): the block's probabilities, the factor
        the accumulator is rescaled by, and the new running max and sum."""
        if MASK_MODE == 0:
            valid = nmask[None, :]
        else:
            if MASK_PER_KEY:
                mv = tl.load(MASK + b * smb + kidx * smk, mask=nmask, other=0)[None, :]
            else:
                mv = tl.load(MASK + b * smb + qi[:, None] * smq + kidx[None, :] * smk,
                             mask=rmask[:, None] & nmask[None, :], other=0)
            if MASK_MODE == 1:
                valid = (mv != 0) & nmask[None, :]
            else:
                s = s + mv.to(tl.float32) * 1.4426950408889634
                valid = nmask[None, :]
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)

    @triton.jit
    def _rotate(x_lo, x_hi, cos_ptr, sin_ptr, offs, BLOCK_H: tl.constexpr, mask):
        """RoPE (rotate_half) of a tile split at D/2 into x_lo / x_hi, in fp32 and rounded back to x's
        dtype as kernels/rope.py does; where ``mask`` is off (cos 1, sin 0) x passes through unchanged."""
        c_lo = tl.load(cos_ptr + offs, mask=mask, other=1.0).to(tl.float32)
        c_hi = tl.load(cos_ptr + BLOCK_H + offs, mask=mask, other=1.0).to(tl.float32)
        s_lo = tl.load(sin_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        s_hi = tl.load(sin_ptr + BLOCK_H + offs, mask=mask, other=0.0).to(tl.float32)
        lo = x_lo.to(tl.float32)
        hi = x_hi.to(tl.float32)
        return (lo * c_lo - hi * s_lo).to(x_lo.dtype), (hi * c_hi + lo * s_hi).to(x_lo.dtype)

    @triton.jit
    def _attn_partial_kernel(
            Q, KP, VP, KS, VS, MASK, WS, COS, SIN, O, n_parts, sob, soh, som,
            sqb, sqh, sqm,
            skpb, skph, skpn, svpb, svph, svpn,
            sksb, sksh, sksn, svsb, svsh, svsn,
            smb, smq, smk, scb, sct,
            Hkv, G, Lq, P, S, D, n_rows, nsp, n_splits, chunk, qk_scale,
            MASK_MODE: tl.constexpr, MASK_PER_KEY: tl.constexpr, DOT_PREC: tl.constexpr, ROPE: tl.constexpr,
            DIRECT: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
            PDL: tl.constexpr):
        wait_for_producer(PDL, True)
        pid_m = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_bh = tl.program_id(2)
        b = pid_bh // Hkv
        hk = pid_bh % Hkv

        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < n_rows
        head = hk * G + rows // Lq
        qi = rows % Lq
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < D
        # q . k as two dots over the halves of D: RoPE (rotate_half) pairs element i with i + D/2
        offs_h = tl.arange(0, BLOCK_H)
        lo_mask = offs_h < D
        hi_mask = offs_h + BLOCK_H < D
        q_row = Q + b.to(tl.int64) * sqb + head[:, None].to(tl.int64) * sqh + qi[:, None] * sqm
        q_lo = tl.load(q_row + offs_h[None, :], mask=rmask[:, None] & lo_mask[None, :], other=0.0)
        q_hi = tl.load(q_row + BLOCK_H + offs_h[None, :], mask=rmask[:, None] & hi_mask[None, :], other=0.0)
        if ROPE:  # queries are the suffix tokens: rotate at their positions
            rope_q = b.to(tl.int64) * scb + qi[:, None] * sct
            q_lo, q_hi = _rotate(q_lo, q_hi, COS + rope_q, SIN + rope_q, offs_h[None, :], BLOCK_H, rmask[:, None])

        # which segment (prefix cache or suffix) and which chunk of it
        is_pref = pid_s < nsp
        if is_pref:
            kb = KP + b.to(tl.int64) * skpb + hk * skph
            vb = VP + b.to(tl.int64) * svpb + hk * svph
        else:
            kb = KS + b.to(tl.int64) * sksb + hk * sksh
            vb = VS + b.to(tl.int64) * svsb + hk * svsh
        skn = tl.where(is_pref, skpn, sksn)
        svn = tl.where(is_pref, svpn, svsn)
        seg_len = tl.where(is_pref, P, S)
        key_off = tl.where(is_pref, 0, P)
        lo = tl.where(is_pref, pid_s, pid_s - nsp) * chunk
        hi = tl.minimum(lo + chunk, seg_len)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            nmask = offs_n < hi
            k_ptr = kb + offs_n[None, :] * skn + offs_h[:, None]                  # [D/2, N] halves
            k_lo = tl.load(k_ptr, mask=nmask[None, :] & lo_mask[:, None], other=0.0)
            k_hi = tl.load(k_ptr + BLOCK_H, mask=nmask[None, :] & hi_mask[:, None], other=0.0)
            if ROPE:  # suffix keys are rotated as loaded; the prefix cache holds rotated keys already
                rope_k = b.to(tl.int64) * scb + offs_n[None, :] * sct
                k_lo, k_hi = _rotate(k_lo, k_hi, COS + rope_k, SIN + rope_k, offs_h[:, None], BLOCK_H,
                                     nmask[None, :] & (pid_s >= nsp))
            s = (tl.dot(q_lo, k_lo, input_precision=DOT_PREC)
                 + tl.dot(q_hi, k_hi, input_precision=DOT_PREC)) * qk_scale          # log2 units
            p, alpha, m_new, l_i = masked_softmax_step(s, key_off + offs_n, nmask, qi, rmask, b, m_i, l_i, MASK, smb,
                                                       smq, smk, MASK_MODE, MASK_PER_KEY)
            v = tl.load(vb + offs_n[:, None] * svn + offs_d[None, :],
                        mask=nmask[:, None] & dmask[None, :], other=0.0)          # [N, D]
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
            m_i = m_new
        release_dependents(PDL)

        if DIRECT:  # one split: this program saw every key of its rows, so it writes the output itself
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            o_ptrs = O + b.to(tl.int64) * sob + head[:, None].to(tl.int64) * soh + qi[:, None] * som + offs_d[None, :]
            tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])
        else:
            part = (pid_bh * n_splits + pid_s).to(tl.int64) * n_rows + rows
            MP = WS
            LP = WS + n_parts
            AP = WS + 2 * n_parts
            tl.store(MP + part, m_i, mask=rmask)
            tl.store(LP + part, l_i, mask=rmask)
            tl.store(AP + part[:, None] * BLOCK_D + offs_d[None, :], acc, mask=rmask[:, None])

    @triton.jit
    def _attn_combine_kernel(WS, n_parts, O, sob, soh, som, Hkv, G, Lq, D, n_rows, n_splits,
                             SPLIT_BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
        # one packed row per program; all its splits are loaded at once (one
        # memory round trip instead of a dependent chain per split)
        wait_for_producer(PDL)
        row = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // Hkv
        hk = pid_bh % Hkv
        MP = WS
        LP = WS + n_parts
        AP = WS + 2 * n_parts
        offs_d = tl.arange(0, BLOCK_D)
        m_run = tl.max(tl.full([SPLIT_BLOCK], float("-inf"), tl.float32), axis=0)
        l_run = tl.sum(tl.zeros([SPLIT_BLOCK], tl.float32), axis=0)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s0 in range(0, n_splits, SPLIT_BLOCK):
            sp = s0 + tl.arange(0, SPLIT_BLOCK)
            smask = sp < n_splits
            part = (pid_bh * n_splits + sp).to(tl.int64) * n_rows + row
            m_s = tl.load(MP + part, mask=smask, other=float("-inf"))
            l_s = tl.load(LP + part, mask=smask, other=0.0)
            a_s = tl.load(AP + part[:, None] * BLOCK_D + offs_d[None, :], mask=smask[:, None], other=0.0)
            m_new = tl.maximum(m_run, tl.max(m_s, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_run - m_safe)
            w = tl.exp2(m_s - m_safe)
            l_run = l_run * alpha + tl.sum(w * l_s, axis=0)
            acc = acc * alpha + tl.sum(w[:, None] * a_s, axis=0)
            m_run = m_new
        out = acc / tl.where(l_run == 0.0, 1.0, l_run)
        head = hk * G + row // Lq
        qi = row % Lq
        o_ptrs = O + b.to(tl.int64) * sob + head.to(tl.int64) * soh + qi * som + offs_d
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=offs_d < D)


# --------------------------------------------------------------------------- wrapper
def split_kv_attention(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor,
                       k_suffix: Optional[torch.Tensor] = None, v_suffix: Optional[torch.Tensor] = None,
                       mask: Optional[torch.Tensor] = None, scale: Optional[float] = None, *,
                       block_m: Optional[int] = None, block_n: Optional[int] = None,
                       num_splits: Optional[int] = None, num_warps: Optional[int] = None,
                       num_stages: Optional[int] = None, out: Optional[torch.Tensor] = None,
                       rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """softmax(q [k_prefix; k_suffix]^T * scale + mask) [v_prefix; v_suffix] -> [B, Hq, Lq, D], q.dtype.

    q/k/v: fp32/fp16/bf16 (K/V in q's dtype), last dim contiguous, other strides
    free.  Hq must be a multiple of Hkv.  scale defaults to D**-0.5.  mask: see
    module doc (bool = validity, float = additive, [B, Lk] / [B, Lq, Lk] /
    [B, 1, Lq|1, Lk]).  block_m/block_n/num_splits/num_warps/num_stages override
    the launch heuristics (num_splits = target number of key chunks).
    rope = (cos, sin) [B, Lq, D]: q and k_suffix are the suffix tokens before RoPE (rotated as loaded, at
    their token positions, as ``rope.qkv_rope`` would; needs S == Lq and D a power of two >= 32).
    """
    check_tensors(("q", q), ("k_prefix", k_prefix), ("v_prefix", v_prefix),
                  ("k_suffix", k_suffix), ("v_suffix", v_suffix))
    if (k_suffix is None) != (v_suffix is None):
        raise ValueError("pass both k_suffix and v_suffix, or neither")
    if q.dim() != 4 or k_prefix.dim() != 4 or v_prefix.dim() != 4:
        raise ValueError("q, k_prefix, v_prefix must be 4-D [B, H, L, D]")
    B, Hq, Lq, D = q.shape
    Hkv, P = k_prefix.shape[1], k_prefix.shape[2]
    if k_prefix.shape != (B, Hkv, P, D) or v_prefix.shape != k_prefix.shape:
        raise ValueError(f"k_prefix/v_prefix must be [B={B}, Hkv, P, D={D}] and equal, got "
                         f"{tuple(k_prefix.shape)} / {tuple(v_prefix.shape)}")
    if k_suffix is not None:
        S = k_suffix.shape[2]
        if k_suffix.shape != (B, Hkv, S, D) or v_suffix.shape != k_suffix.shape:
            raise ValueError(f"k_suffix/v_suffix must be [B={B}, Hkv={Hkv}, S, D={D}] and equal, got "
                             f"{tuple(k_suffix.shape)} / {tuple(v_suffix.shape)}")
    else:
        S = 0
        k_suffix, v_suffix = k_prefix, v_prefix  # dummies, never read
    for name, t in (("k_prefix", k_prefix), ("v_prefix", v_prefix), ("k_suffix", k_suffix), ("v_suffix", v_suffix)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} dtype {t.dtype} != q dtype {q.dtype}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"Hq ({Hq}) must be a multiple of Hkv ({Hkv})")
    Lk = P + S
    G = Hq // Hkv
    n_rows = G * Lq
    scale = D ** -0.5 if scale is None else float(scale)

    if mask is not None:
        mask_mode, per_key, smb, smq, smk = mask_strides(mask, B, Lq, Lk)
        if mask.device != q.device:
            raise ValueError("mask must be on q's device")
    else:
        mask_mode, per_key, smb, smq, smk = 0, True, 0, 0, 0
        mask = q  # dummy pointer, never read

    if out is None:
        out = torch.empty((B, Hq, Lq, D), dtype=q.dtype, device=q.device)
    elif tuple(out.shape) != (B, Hq, Lq, D) or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError("out must be [B, Hq, Lq, D] in q's dtype with a contiguous last dim")
    if B == 0 or n_rows == 0:
        return out

    block_d = max(32, next_power_of_2(D))
    if rope is not None:
        cos, sin = rope
        check_tensors(("cos", cos), ("sin", sin))
        if D != block_d or S != Lq:
            raise ValueError(f"rope needs D a power of two >= 32 (got {D}) and suffix keys = queries "
                             f"(S={S}, Lq={Lq})")
        if cos.shape != (B, Lq, D) or sin.shape != cos.shape or sin.stride() != cos.stride():
            raise ValueError(f"cos/sin must be [B={B}, Lq={Lq}, D={D}] with the same strides")
        scb, sct = cos.stride(0), cos.stride(1)
    else:
        cos = sin = q  # dummy pointers, never read
        scb = sct = 0
    wide = q.dtype == torch.float32 and block_d > 128
    if block_m is None:
        block_m = 64 if block_d <= 256 else 32
    if block_n is None:
        block_n = 32 if block_d > 128 else 64
    if num_warps is None:
        num_warps = 8 if wide else 4
    if num_stages is None:
        # Q tile + K and V tiles per stage must fit in shared memory (~227 KB on H100/H200)
        es = q.element_size()
        num_stages = 2  # H200 sweep: 2 ties 3 at B=1 and beats it at B=4
        budget = (160 if rope is not None else 200) * 1024  # rotating in the kernel stages cos / sin too
        while num_stages > 1 and (block_m + 2 * num_stages * block_n) * block_d * es > budget:
            num_stages -= 1
    n_mt = triton.cdiv(n_rows, block_m)
    one_split_asked = num_splits == 1
    if num_splits is None:
        # ~2 programs per SM in total, chunks of at least 64 keys (H200 sweep, B=1)
        num_splits = max(1, triton.cdiv(2 * num_sms(q.device), n_mt * B * Hkv))
        min_chunk = max(block_n, 64)
    else:
        min_chunk = block_n
    chunk = max(min_chunk, triton.cdiv(triton.cdiv(max(Lk, 1), num_splits), block_n) * block_n)
    nsp = triton.cdiv(P, chunk)
    nss = triton.cdiv(S, chunk)
    n_splits = max(1, nsp + nss)

    # One split asked for (every key in one chunk): the partial kernel normalises and writes the output itself.
    # Else one fp32 workspace: m [n_parts] | l [n_parts] | acc [n_parts, BLOCK_D], merged by the combine kernel
    # (also when the heuristic lands on one split: that path is the one measured on the device so far).
    direct = one_split_asked and n_splits == 1
    n_parts = 0 if direct else triton.cdiv(B * Hkv * n_splits * n_rows, 16) * 16
    ws = out if direct else torch.empty(n_parts * (2 + block_d), dtype=torch.float32, device=q.device)
    dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"
    _attn_partial_kernel[(n_mt, n_splits, B * Hkv)](
        q, k_prefix, v_prefix, k_suffix, v_suffix, mask, ws, cos, sin, out, n_parts,
        out.stride(0), out.stride(1), out.stride(2),
        q.stride(0), q.stride(1), q.stride(2),
        k_prefix.stride(0), k_prefix.stride(1), k_prefix.stride(2),
        v_prefix.stride(0), v_prefix.stride(1), v_prefix.stride(2),
        k_suffix.stride(0), k_suffix.stride(1), k_suffix.stride(2),
        v_suffix.stride(0), v_suffix.stride(1), v_suffix.stride(2),
        smb, smq, smk, scb, sct,
        Hkv, G, Lq, P, S, D, n_rows, nsp, n_splits, chunk, scale * LOG2E,
        MASK_MODE=mask_mode, MASK_PER_KEY=per_key, DOT_PREC=dot_prec, ROPE=rope is not None, DIRECT=direct,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_H=block_d // 2, num_warps=num_warps,
        num_stages=num_stages,
        **pdl(q.device))
    if direct:
        return out
    split_block = min(next_power_of_2(n_splits), max(1, _COMBINE_MAX_ELEMS // block_d))
    _attn_combine_kernel[(n_rows, B * Hkv)](
        ws, n_parts, out, out.stride(0), out.stride(1), out.stride(2),
        Hkv, G, Lq, D, n_rows, n_splits, SPLIT_BLOCK=split_block, BLOCK_D=block_d,
        num_warps=4 if split_block * block_d >= 2048 else 2, **pdl(q.device))
    return out


# --------------------------------------------------------------------------- from the fused QKV projection
def rope_split_kv_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_prefix: torch.Tensor,
                            v_prefix: torch.Tensor, mask: Optional[torch.Tensor] = None,
                            scale: Optional[float] = None, **launch) -> torch.Tensor:
    """The action expert's attention straight from its QKV projection: RoPE of q and of the suffix keys
    happens as they are loaded, so no rotated q / k tensors are written and read back (one kernel less per
    expert layer). qkv [B, T, (Hq + 2 Hkv) D]; cos / sin [B, T, D] of the T suffix tokens; k_prefix /
    v_prefix [B, Hkv, P, D] (keys rotated); mask over the P + T keys. ``launch``: split_kv_attention's
    block / split / warp overrides and ``out``. Returns [B, Hq, T, D]."""
    hkv, d = k_prefix.shape[1], k_prefix.shape[-1]
    hq = qkv.shape[-1] // d - 2 * hkv
    q, k, v = split_heads(qkv, hq, hkv, d)
    return split_kv_attention(q, k_prefix, v_prefix, k, v, mask, scale, rope=(cos, sin), **launch)


def rope_split_kv_attention_ref(qkv, cos, sin, k_prefix, v_prefix, mask=None, scale=None) -> torch.Tensor:
    """rope.qkv_rope_ref, then split_kv_attention_ref."""
    hkv, d = k_prefix.shape[1], k_prefix.shape[-1]
    q, k, v = qkv_rope_ref(qkv, cos, sin, qkv.shape[-1] // d - 2 * hkv, hkv, d)
    return split_kv_attention_ref(q, k_prefix, v_prefix, k, v, mask, scale)
