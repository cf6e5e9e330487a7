"""The action expert's GEMMs as tiles with their neighbours fused in: the norm before, the epilogue after.

One tile function (``gemm_tile``) serves the four GEMMs of an expert layer, so that the same code runs as its
own kernel (one tile per program) or as a phase of the persistent kernel (kernels/candidates/expert_layer.py):

* **prologue, NORM**: x = (ada)RMSNorm(h) formed on the fly from the residual stream h and the per-row sums of
  squares the producer of h left behind (``STATS`` [n_stats, M] fp32, one partial per column block of the
  producer: no whole-row pass, no float atomics). x is rounded to the activation dtype once, as
  ``ops.ada_rms_norm`` / ``ops.rms_norm`` round it, before it meets the weights.
* **modes** (what the epilogue does with the fp32 accumulators):
  ``ROPE``  the fused q/k/v projection; a tile owns the column pairs [c, c+BN) and [c+D/2, c+D/2+BN) of one
            head, so rotate-half RoPE of q and k is local to the tile; v heads pass unrotated.
  ``GEGLU`` the fused [gate; up] projection; gelu_tanh(gate) * up, nothing rounded before the product.
  ``RESID`` the o / down projections; h_new = h + y * gate[item] (or h + y), rounded once, written in place,
            and each row's sum of squares of the rounded h_new over this tile's columns into ``STATS_OUT``
            [n_col_blocks, M] for the next consumer's norm.
* **split K with a last-arriving tile**: with splits > 1, each tile writes its fp32 partial to a dense slot of the
  workspace, then takes a ticket (an atomic add on its output tile's counter, acq_rel at GPU scope, after a
  CTA barrier so every thread's partial store is ordered before it). The tile that draws the last ticket
  sums all partials in split order (deterministic, whatever the arrival order), loading them past L1
  (``.cg``), runs the epilogue and resets the counter to 0 (so the next phase or graph replay starts clean).

Tiles are numbered split-fastest, then row tile, then column block: the splits of one output tile run side by
side, and row tiles that share a weight slice are adjacent (L2 reuse at large batch).
Reference functions (fp32 torch): ``norm_qkv_rope_ref``, ``norm_geglu_ref``, ``gated_residual_ref``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..ada_rms_norm import ada_rms_norm_ref
from ..common import HAVE_TRITON, cdiv, next_power_of_2, num_sms, prefetch_l2, tl, triton
from ..geglu import geglu_ref
from ..rms_norm import rms_norm_ref

__all__ = ["RESID", "ROPE", "GEGLU", "MAX_SPLITS", "GemmPlan", "gemm_plan", "row_norm_ref", "norm_qkv_rope_ref",
           "norm_geglu_ref", "gated_residual_ref"]

# the epilogue modes (MODE constexpr); constexpr objects so that kernels may name them
RESID, ROPE, GEGLU = (tl.constexpr(i) for i in range(3)) if HAVE_TRITON else (0, 1, 2)
# At most this many K splits: the last tile's sum over them is unrolled, so its loads are all in flight at once.
MAX_SPLITS = 8
MAX_SPLITS_CONST = tl.constexpr(MAX_SPLITS) if HAVE_TRITON else MAX_SPLITS


# --------------------------------------------------------------------------- references (fp32 torch)
def row_norm_ref(h: torch.Tensor, scale: torch.Tensor, shift: Optional[torch.Tensor], tokens: int,
                 eps: float) -> torch.Tensor:
    """(ada)RMSNorm of rows h [M, W]: h * rstd * (1 + scale[item]) (+ shift[item]), item = row // tokens, in
    fp32, rounded to h's dtype (scale / shift [B|1, W]; pi0's plain norm: its weight as a [1, W] scale): the
    norm kernels' references on the modulation gathered per row (one row per item)."""
    if shift is None:
        return rms_norm_ref(h, _per_row(scale, h.shape, tokens), eps)
    return ada_rms_norm_ref(h, _per_row(scale, h.shape, tokens), _per_row(shift, h.shape, tokens), 1, eps)


def _per_row(t: torch.Tensor, shape, tokens: int) -> torch.Tensor:
    """A [W] / [B|1, W] modulation as fp32 rows [M, W] (row r takes item r // tokens)."""
    rows = t.float().reshape(-1, shape[-1])
    items = torch.arange(shape[0], device=t.device) // tokens
    return rows[items.clamp_max(rows.shape[0] - 1)]


def norm_qkv_rope_ref(h, scale, shift, weight, cos, sin, n_heads: int, n_kv_heads: int, tokens: int, eps: float
                      ) -> torch.Tensor:
    """rows of [q | k | v] [M, (Hq + 2 Hkv) D] = norm(h) @ weight^T, q and k rotated (rotate-half) with cos /
    sin [B, T, D] at their tokens; computed in h's dtype's math as the reference ops do (fp32 for fp32 in)."""
    y = row_norm_ref(h, scale, shift, tokens, eps).float() @ weight.float().T
    d = cos.shape[-1]
    half = d // 2
    heads = y.view(h.shape[0], -1, d)
    c, s = cos.reshape(-1, 1, d).float(), sin.reshape(-1, 1, d).float()
    rot = torch.cat((-heads[..., half:], heads[..., :half]), dim=-1)
    turned = heads * c + rot * s
    n_rot = n_heads + n_kv_heads
    out = torch.cat((turned[:, :n_rot], heads[:, n_rot:]), dim=1)
    return out.reshape(h.shape[0], -1).to(h.dtype)


def norm_geglu_ref(h, scale, shift, gate_up_w, tokens: int, eps: float) -> torch.Tensor:
    """gelu_tanh(x Wg^T) * (x Wu^T) for x = norm(h), gate_up_w = [Wg; Wu]; fp32 math, h's dtype out."""
    return geglu_ref(row_norm_ref(h, scale, shift, tokens, eps).float() @ gate_up_w.float().T).to(h.dtype)


def gated_residual_ref(x, weight, h, gate: Optional[torch.Tensor], tokens: int):
    """(h_new, sum of squares per row): h_new = h + (x @ weight^T) * gate[item] (or + x @ weight^T) rounded once
    to h's dtype; the sums of the rounded h_new in fp32 ([M])."""
    y = x.float() @ weight.float().T
    if gate is not None:
        y = y * _per_row(gate, h.shape, tokens)
    h_new = (h.float() + y).to(h.dtype)
    return h_new, h_new.float().pow(2).sum(-1)


# --------------------------------------------------------------------------- launch plan
class GemmPlan(NamedTuple):
    """Launch shape of one GEMM phase: tile sizes, K splits (whole K blocks each), tile counts, and the fp32
    workspace (floats) its split-K partials need."""
    block_m: int
    block_n: int
    block_k: int
    splits: int
    k_per: int
    n_mt: int        # row tiles
    n_pb: int        # column blocks (column pairs for ROPE / GEGLU)
    n_tiles: int
    ws_floats: int
    num_warps: int
    num_stages: int


def gemm_plan(m: int, n_blocks: int, k: int, device: torch.device, *, block_m: Optional[int] = None,
              block_n: int = 32, block_k: int = 128, splits: Optional[int] = None, num_warps: int = 4,
              num_stages: int = 3, tiles_per_sm: int = 2) -> GemmPlan:
    """Split K until the tiles give every multiprocessor about ``tiles_per_sm`` of them (each split >= 2 K
    blocks); ``splits`` fixes it. Grid choices follow the device's SM count (Thor 20, H200 132)."""
    bm = block_m or min(64, max(16, next_power_of_2(m)))
    n_mt = cdiv(m, bm)
    if splits is None:
        splits = max(1, min(tiles_per_sm * num_sms(device) // max(1, n_blocks * n_mt), k // (2 * block_k)))
    splits = min(splits, MAX_SPLITS)
    k_per = cdiv(cdiv(k, splits), block_k) * block_k
    splits = cdiv(k, k_per)
    n_tiles = n_blocks * n_mt * splits
    ws = n_tiles * 2 * bm * block_n if splits > 1 else 0    # a slot holds both halves' partials
    stages = max(1, min(num_stages, k_per // block_k))      # no deeper than the K loop is long
    return GemmPlan(bm, block_n, block_k, splits, k_per, n_mt, n_blocks, n_tiles, ws, num_warps, stages)


# --------------------------------------------------------------------------- tile functions
if HAVE_TRITON:
    from ..geglu import gelu_tanh_f32

    @triton.jit
    def rows_rstd(STATS, n_stats, M, rows, rmask, width, eps, STATS_BLOCK: tl.constexpr):
        """1 / RMS of each row from the producer's per-column-block sums of squares ([n_stats, M])."""
        q = tl.arange(0, STATS_BLOCK)
        ss = tl.load(STATS + q[:, None] * M + rows[None, :], mask=(q[:, None] < n_stats) & rmask[None, :],
                     other=0.0, cache_modifier=".cg")
        return tl.rsqrt(tl.sum(ss, axis=0) / width + eps)

    @triton.jit
    def per_item(T, s_item, item, cols, mask, cmask, ITEMS: tl.constexpr):
        """Modulation T[item, cols] as fp32 [BM, BN] (0 where ``mask`` / the column mask ``cmask`` is off):
        gathered per row when it differs between batch items (ITEMS), else one [BN] vector for all rows."""
        if ITEMS:
            return tl.load(T + item[:, None] * s_item + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        else:
            return tl.load(T + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]

    @triton.jit
    def norm_rows(hv, rstd, SC, s_sc, SH, s_sh, item, k, mask, kmask, HAS_SHIFT: tl.constexpr,
                  ITEMS: tl.constexpr):
        """(ada)RMSNorm of a loaded tile hv [BM, BK] at columns k: fp32 math in the reference's order
        ((h * rstd) * (1 + scale) + shift), rounded once to hv's dtype."""
        y = hv.to(tl.float32) * rstd[:, None] * (1.0 + per_item(SC, s_sc, item, k, mask, kmask, ITEMS))
        if HAS_SHIFT:
            y += per_item(SH, s_sh, item, k, mask, kmask, ITEMS)
        return y.to(hv.dtype)

    @triton.jit
    def tile_columns(pb, n_cols, MODE: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr):
        """Weight rows (= output columns) of column block pb: (lo, hi, lo's offset inside its head, head).
        ROPE: a head's pair [j, j+BN) and [j+D/2, ...); GEGLU: gate columns and the up columns n_cols later;
        RESID: one block (hi = lo)."""
        c = tl.arange(0, BLOCK_N)
        if MODE == 1:
            head = pb // (HALF // BLOCK_N)
            d_lo = (pb % (HALF // BLOCK_N)) * BLOCK_N + c
            lo = head * (2 * HALF) + d_lo
            hi = lo + HALF
        elif MODE == 2:
            head = pb
            d_lo = pb * BLOCK_N + c
            lo = d_lo
            hi = lo + n_cols
        else:
            head = pb
            d_lo = pb * BLOCK_N + c
            lo = d_lo
            hi = lo
        return lo, hi, d_lo, head

    @triton.jit
    def prefetch_gemm_tile(tile, W, sw, K, n_cols, n_mt, splits, k_per, MODE: tl.constexpr, HALF: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LINE: tl.constexpr):
        """L2 prefetch of the weight slice tile ``tile`` will stream (one prefetch per 128-byte line): issued
        before waiting on a producer (PDL) or at a grid barrier, so the weights arrive while others finish."""
        pb = (tile // splits) // n_mt
        k0 = (tile % splits) * k_per
        lo, hi, d_lo, head = tile_columns(pb, n_cols, MODE, HALF, BLOCK_N)
        lines = tl.arange(0, BLOCK_K // LINE) * LINE
        for kk in range(0, k_per, BLOCK_K):
            kc = tl.minimum(k0 + kk + lines, K - 1)[None, :]
            prefetch_l2(W + lo[:, None].to(tl.int64) * sw + kc, True)
            if MODE != 0:
                prefetch_l2(W + hi[:, None].to(tl.int64) * sw + kc, True)

    @triton.jit
    def gemm_epilogue(acc, acc_hi, rows, rmask, lo, hi, d_lo, head, pb, item, n_cols, M, Y, sy,
                      COS, SIN, scb, sct, tokens, rot_heads, HOUT, sho, GATE, s_g, STATS_OUT,
                      MODE: tl.constexpr, HAS_GATE: tl.constexpr, HALF: tl.constexpr, ITEMS: tl.constexpr):
        cmask = lo < n_cols
        mask = rmask[:, None] & cmask[None, :]
        if MODE == 1:    # RoPE of q and k heads; v heads (head >= rot_heads) pass: cos 1, sin 0
            rot = mask & (head < rot_heads)
            trow = (rows // tokens).to(tl.int64) * scb + (rows % tokens).to(tl.int64) * sct
            cs = COS + trow[:, None] + d_lo[None, :]
            sn = SIN + trow[:, None] + d_lo[None, :]
            c_lo = tl.load(cs, mask=rot, other=1.0).to(tl.float32)
            c_hi = tl.load(cs + HALF, mask=rot, other=1.0).to(tl.float32)
            s_lo = tl.load(sn, mask=rot, other=0.0).to(tl.float32)
            s_hi = tl.load(sn + HALF, mask=rot, other=0.0).to(tl.float32)
            out_lo = acc * c_lo - acc_hi * s_lo
            out_hi = acc_hi * c_hi + acc * s_hi
            dst = Y + rows[:, None].to(tl.int64) * sy
            tl.store(dst + lo[None, :], out_lo.to(Y.dtype.element_ty), mask=mask)
            tl.store(dst + hi[None, :], out_hi.to(Y.dtype.element_ty), mask=mask)
        elif MODE == 2:  # GeGLU
            out = gelu_tanh_f32(acc) * acc_hi
            tl.store(Y + rows[:, None].to(tl.int64) * sy + lo[None, :], out.to(Y.dtype.element_ty), mask=mask)
        else:            # gated residual (in place) + this block's sums of squares of the rounded h_new
            dst = HOUT + rows[:, None].to(tl.int64) * sho + lo[None, :]
            hv = tl.load(dst, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
            if HAS_GATE:
                hn = (hv + acc * per_item(GATE, s_g, item, lo, mask, cmask, ITEMS)).to(HOUT.dtype.element_ty)
            else:
                hn = (hv + acc).to(HOUT.dtype.element_ty)
            tl.store(dst, hn, mask=mask)
            hf = tl.where(mask, hn.to(tl.float32), 0.0)
            tl.store(STATS_OUT + pb * M + rows, tl.sum(hf * hf, axis=1), mask=rmask)

    @triton.jit
    def gemm_tile(tile, X, sx, W, sw, Y, sy, M, K, n_cols, n_mt, splits, k_per,
                  STATS, n_stats, SC, s_sc, SH, s_sh, tokens, eps,
                  COS, SIN, scb, sct, rot_heads, HOUT, sho, GATE, s_g, STATS_OUT, WS, CNT,
                  MODE: tl.constexpr, NORM: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_GATE: tl.constexpr,
                  HALF: tl.constexpr, STATS_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, ITEMS: tl.constexpr):
        """One output tile (or one K split of it) of y = x @ W^T with x = X rows, normalised when NORM."""
        s = tile % splits
        rest = tile // splits
        mt = rest % n_mt
        pb = rest // n_mt
        rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < M
        item = rows // tokens
        lo, hi, d_lo, head = tile_columns(pb, n_cols, MODE, HALF, BLOCK_N)
        cmask = lo < n_cols
        if NORM:
            rstd = rows_rstd(STATS, n_stats, M, rows, rmask, K, eps, STATS_BLOCK)
        offs_k = tl.arange(0, BLOCK_K)
        k0 = s * k_per
        x_rows = X + rows[:, None].to(tl.int64) * sx
        w_lo = W + lo[:, None].to(tl.int64) * sw
        w_hi = W + hi[:, None].to(tl.int64) * sw
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_hi = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, k_per, BLOCK_K):
            k = k0 + kk + offs_k
            km = k < K
            amask = rmask[:, None] & km[None, :]
            a = tl.load(x_rows + k[None, :], mask=amask, other=0.0, cache_modifier=".cg")
            if NORM:
                a = norm_rows(a, rstd, SC, s_sc, SH, s_sh, item, k, amask, km, HAS_SHIFT, ITEMS)
            wmask = cmask[:, None] & km[None, :]
            acc += tl.dot(a, tl.trans(tl.load(w_lo + k[None, :], mask=wmask, other=0.0)), input_precision="ieee")
            if MODE != 0:
                acc_hi += tl.dot(a, tl.trans(tl.load(w_hi + k[None, :], mask=wmask, other=0.0)),
                                 input_precision="ieee")
        if splits > 1:
            blk = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            slot = 2 * BLOCK_M * BLOCK_N
            first = WS + (rest * splits).to(tl.int64) * slot
            tl.store(first + s * slot + blk, acc)
            if MODE != 0:
                tl.store(first + s * slot + BLOCK_M * BLOCK_N + blk, acc_hi)
            tl.debug_barrier()        # every thread's partial is stored before the ticket (release) is taken
            ticket = tl.atomic_add(CNT + rest, 1, sem="acq_rel", scope="gpu")
            if ticket == splits - 1:  # the last split of this output tile: sum all, in split order
                tl.debug_barrier()
                tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                tot_hi = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for q in tl.static_range(MAX_SPLITS_CONST):   # unrolled: every split's load issued up front
                    tot += tl.load(first + q * slot + blk, mask=q < splits, other=0.0, cache_modifier=".cg")
                    if MODE != 0:
                        tot_hi += tl.load(first + q * slot + BLOCK_M * BLOCK_N + blk, mask=q < splits, other=0.0,
                                          cache_modifier=".cg")
                tl.atomic_xchg(CNT + rest, 0)
                gemm_epilogue(tot, tot_hi, rows, rmask, lo, hi, d_lo, head, pb, item, n_cols, M, Y, sy,
                              COS, SIN, scb, sct, tokens, rot_heads, HOUT, sho, GATE, s_g, STATS_OUT,
                              MODE, HAS_GATE, HALF, ITEMS)
        else:
            gemm_epilogue(acc, acc_hi, rows, rmask, lo, hi, d_lo, head, pb, item, n_cols, M, Y, sy,
                          COS, SIN, scb, sct, tokens, rot_heads, HOUT, sho, GATE, s_g, STATS_OUT,
                          MODE, HAS_GATE, HALF, ITEMS)
