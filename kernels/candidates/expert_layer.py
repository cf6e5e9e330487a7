"""The pi0 / pi0.5 action expert's layer stack in few kernels: five per layer, one per layer, or one per step.

Per layer the work is five phases (design.md §8), each a tile function shared by every launch form:

    QKV     x = norm(h) (from h and its row statistics) -> q | k | v, RoPE on q and k   (expert_gemm ROPE)
    ATTN    attention over [prefix cache; suffix], the split merge by the last tile  (expert_attention)
    OPROJ   h += (attn @ Wo^T) * gate, and h's row statistics                        (expert_gemm RESID)
    GATE_UP x = norm(h) -> gelu_tanh(gate) * up                                       (expert_gemm GEGLU)
    DOWN    h += (mlp @ Wd^T) * gate, and h's row statistics                          (expert_gemm RESID)

plus ROWS before the first layer (h copied into the working residual, its row statistics) and FINAL after the
last (x = the final norm of h). No phase needs a reducer kernel: a norm is formed by its consumer from the
producer's per-column-block sums of squares, and split-K / split-KV partials are summed by the last-arriving
tile of each output tile.

``launch`` chooses how the phases become kernels (one ``_expert_kernel`` source, specialised by ``PHASES``):

* ``"kernels"``: each phase its own launch (grid = its tiles): 5 per layer + 2 per step, chained by
  programmatic dependent launch where the device has it (each kernel prefetches its weights into L2 before
  waiting on its producer);
* ``"layer"``: one persistent launch per layer (ROWS folded into the first, FINAL into the last), phases
  separated by grid barriers; ``"step"``: one persistent launch for all layers of a denoising step.

Persistent launches run ``grid`` programs (at most the co-resident ones: the SM count times the programs per
SM, cooperative launch where the driver offers it), each looping over a phase's tiles with stride ``grid``.
Grid barrier (``grid_barrier``): a CTA barrier orders every thread's stores of the phase before one thread's
acq_rel atomic increment of a counter at GPU scope (release); the thread then spins with acquire atomics until
the counter reaches phase number x grid (monotonic, no reset between phases), and a CTA barrier orders the
other threads' loads after that acquire. Data made by other programs is loaded past L1 (``.cg``). Before
arriving, a program prefetches the weights (or prefix KV) of its tiles of the next phase into L2. At exit a
second counter counts programs out; the last one resets both (every other program is past its last wait), so
the next launch or graph replay starts from zero.

Reference: ``expert_stack_ref`` (fp32 torch).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

import torch

from ..common import (HAVE_TRITON, LOG2E, available, cdiv, check_tensors, interpret_mode, next_power_of_2, num_sms,
                      pdl, require_triton, tl, triton, wait_for_producer)
from .expert_attention import attention_plan, expert_attention_ref
from .expert_gemm import (GEGLU, RESID, ROPE, gated_residual_ref, gemm_plan, norm_geglu_ref, norm_qkv_rope_ref,
                          row_norm_ref)
from ..skinny_linear import fit_stages
from ..split_kv_attention import mask_strides

__all__ = ["available", "StackLaunch", "ROWS", "QKV", "ATTN", "OPROJ", "GATE_UP", "DOWN", "FINAL", "LAYER", "LAUNCHES",
           "DEFAULT_TILING", "expert_stack", "expert_stack_ref", "stack_plans", "launch_stages", "kernels_per_step"]

ROWS, QKV, ATTN, OPROJ, GATE_UP, DOWN, FINAL = (1 << i for i in range(7))   # phase bits (PHASES constexpr)
LAYER = QKV | ATTN | OPROJ | GATE_UP | DOWN
LAUNCHES = ("kernels", "layer", "step")

# Launch shapes per phase; splits None: from the SM count (expert_gemm.gemm_plan / attention_plan).
DEFAULT_TILING = {
    "block_m": None,                                   # GEMM row tile: rows rounded up to 16..64
    "qkv": {"block_n": 32, "block_k": 128},
    "o": {"block_n": 32, "block_k": 128},
    "gate_up": {"block_n": 32, "block_k": 128},
    "down": {"block_n": 32, "block_k": 128},
    "attention": {"block_m": 16, "block_n": 64},
    "rows_block_m": 16,
    "num_warps": 4, "num_stages": 3,
    "grid_per_sm": 1,                                  # persistent launches: programs per SM
    "prefetch": True,                                  # L2 prefetch of upcoming weights (CUDA only)
    "cooperative": True,                               # persistent launches: cooperative (co-residency checked)
}


def kernels_per_step(launch: str, depth: int) -> int:
    """Kernel launches per denoising step of a ``depth``-layer stack (the counters' memset not counted)."""
    return {"kernels": 5 * depth + 2, "layer": depth, "step": 1}[launch]


# --------------------------------------------------------------------------- reference
def expert_stack_ref(h, qkv_w, o_w, gate_up_w, down_w, k_prefix, v_prefix, mask, cos, sin, scale, shift, gate,
                     eps: float, n_heads: int) -> torch.Tensor:
    """The stack in fp32 torch on the given tensors (pass fp32 copies for an fp32 reference): per layer
    norm -> qkv -> RoPE -> attention -> o -> (gated) residual -> norm -> GeGLU MLP -> (gated) residual; the
    final norm of h -> x [B, T, W]. scale / shift / gate: per norm [B|1, W] rows (shift, gate None: plain)."""
    b, t, w = h.shape
    rows = h.reshape(b * t, w)
    hq = n_heads
    hkv = k_prefix[0].shape[1]
    for i in range(len(qkv_w)):
        sh = None if shift is None else shift[2 * i]
        qkv = norm_qkv_rope_ref(rows, scale[2 * i], sh, qkv_w[i], cos, sin, hq, hkv, t, eps)
        att = expert_attention_ref(qkv, k_prefix[i], v_prefix[i], mask, hq, t)
        rows, _ = gated_residual_ref(att, o_w[i], rows, None if gate is None else gate[2 * i], t)
        sh = None if shift is None else shift[2 * i + 1]
        mlp = norm_geglu_ref(rows, scale[2 * i + 1], sh, gate_up_w[i], t, eps)
        rows, _ = gated_residual_ref(mlp, down_w[i], rows, None if gate is None else gate[2 * i + 1], t)
    n = len(qkv_w)
    return row_norm_ref(rows, scale[2 * n], None if shift is None else shift[2 * n], t, eps).view(b, t, w)


# --------------------------------------------------------------------------- kernels
if HAVE_TRITON:
    from .expert_attention import attention_tile, prefetch_attention_tile
    from .expert_gemm import gemm_tile, norm_rows, prefetch_gemm_tile, rows_rstd

    @triton.jit
    def grid_barrier(BAR, target):
        """Wait until ``target`` arrivals (phase number x programs) have been counted; see the module doc."""
        tl.debug_barrier()
        seen = tl.atomic_add(BAR, 1, sem="acq_rel", scope="gpu") + 1
        while seen < target:
            seen = tl.atomic_add(BAR, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()

    @triton.jit
    def rows_tile(tile, H, sh, HOUT, sho, STATS, n_stats, X, sx, SC, s_sc, SH, s_sh, M, width, n_mt, tokens, eps,
                  NORM: tl.constexpr, HAS_SHIFT: tl.constexpr, STATS_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, ITEMS: tl.constexpr):
        """NORM: X = norm(H) from the row statistics (the final norm); else H copied to HOUT and this column
        block's sums of squares into STATS[pb] (the statistics of the stack's input)."""
        mt = tile % n_mt
        pb = tile // n_mt
        rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < M
        cols = pb * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols < width)[None, :]
        hv = tl.load(H + rows[:, None].to(tl.int64) * sh + cols[None, :], mask=mask, other=0.0,
                     cache_modifier=".cg")
        if NORM:
            rstd = rows_rstd(STATS, n_stats, M, rows, rmask, width, eps, STATS_BLOCK)
            x = norm_rows(hv, rstd, SC, s_sc, SH, s_sh, rows // tokens, cols, mask, cols < width, HAS_SHIFT,
                          ITEMS)
            tl.store(X + rows[:, None].to(tl.int64) * sx + cols[None, :], x, mask=mask)
        else:
            tl.store(HOUT + rows[:, None].to(tl.int64) * sho + cols[None, :], hv, mask=mask)
            hf = hv.to(tl.float32)
            tl.store(STATS + pb * M + rows, tl.sum(hf * hf, axis=1), mask=rmask)

    @triton.jit
    def _pick(T, idx, REF, TABLES: tl.constexpr):
        """A per-layer (per-norm) operand: T itself, or entry idx of the int64 address table T, typed as REF."""
        if TABLES:
            return tl.load(T + idx).to(tl.pointer_type(REF.dtype.element_ty))
        else:
            return T

    @triton.jit
    def _expert_kernel(
            QKV_W, O_W, GU_W, DN_W, KP, VP, sw_q, sw_o, sw_g, sw_d, skb, skh, skn, svb, svh, svn,
            SC, SH, GT, NREF, s_sc, s_sh, s_g,
            H0, sh0, HB, shb, XO, sxo, QB, sqb, AB, sab, MB, smbuf, STATS, WS, CNT, BAR,
            MASK, smb, smq, smk, COS, SIN, scb, sct,
            M, W, I, T, P, Hq, Hkv, eps, qk_scale, layer0, layer1, n_layers,
            n_mt, q_splits, q_kper, q_tiles, a_mt, a_splits, a_chunk, a_tiles, o_splits, o_kper, o_tiles,
            g_splits, g_kper, g_tiles, d_splits, d_kper, d_tiles, r_mt, r_tiles, n_stats_o, n_stats_d,
            PHASES: tl.constexpr, TABLES: tl.constexpr, ADA: tl.constexpr, ITEMS: tl.constexpr, D: tl.constexpr,
            BLOCK_M: tl.constexpr, BN_Q: tl.constexpr, BK_Q: tl.constexpr, BN_O: tl.constexpr, BK_O: tl.constexpr,
            BN_G: tl.constexpr, BK_G: tl.constexpr, BN_D: tl.constexpr, BK_D: tl.constexpr,
            AM: tl.constexpr, AN: tl.constexpr, MASK_MODE: tl.constexpr,
            MASK_PER_KEY: tl.constexpr, DOT_PREC: tl.constexpr, RM: tl.constexpr, STATS_BLOCK: tl.constexpr,
            PDL: tl.constexpr, PREFETCH: tl.constexpr, LINE: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        MULTI: tl.constexpr = (PHASES & (PHASES - 1)) != 0    # several phases: a persistent launch
        HALF: tl.constexpr = D // 2
        n_qkv = (Hq + 2 * Hkv) * D
        if PREFETCH:   # the first phase's weights stream into L2 while the producer of its input still runs
            if PHASES & 2:
                for t in range(pid, q_tiles, nprog):
                    prefetch_gemm_tile(t, _pick(QKV_W, layer0, H0, TABLES), sw_q, W, n_qkv, n_mt, q_splits, q_kper,
                                       ROPE, HALF, BN_Q, BK_Q, LINE)
            if PHASES == 4:
                for t in range(pid, a_tiles, nprog):
                    prefetch_attention_tile(t, _pick(KP, layer0, H0, TABLES), _pick(VP, layer0, H0, TABLES), skb,
                                            skh, skn, svb, svh, svn, P, Hkv, a_mt, a_splits, a_chunk, D, AN, LINE)
            if PHASES == 8:
                for t in range(pid, o_tiles, nprog):
                    prefetch_gemm_tile(t, O_W, sw_o, Hq * D, W, n_mt, o_splits, o_kper, RESID, HALF, BN_O, BK_O,
                                       LINE)
            if PHASES == 16:
                for t in range(pid, g_tiles, nprog):
                    prefetch_gemm_tile(t, GU_W, sw_g, W, I, n_mt, g_splits, g_kper, GEGLU, HALF, BN_G, BK_G, LINE)
            if PHASES == 32:
                for t in range(pid, d_tiles, nprog):
                    prefetch_gemm_tile(t, DN_W, sw_d, I, W, n_mt, d_splits, d_kper, RESID, HALF, BN_D, BK_D, LINE)
        wait_for_producer(PDL)
        epoch = 0
        if PHASES & 1:   # ROWS (before the first layer): the working residual and its row statistics
            if layer0 == 0:
                for t in range(pid, r_tiles, nprog):
                    rows_tile(t, H0, sh0, HB, shb, STATS, n_stats_d, XO, sxo, SC, s_sc, SH, s_sh, M, W, r_mt, T,
                              eps, False, False, STATS_BLOCK, RM, BN_D, ITEMS)
                if MULTI:
                    epoch += 1
                    grid_barrier(BAR, epoch * nprog)
        for layer in range(layer0, layer1):
            if PHASES & 2:   # QKV
                w = _pick(QKV_W, layer, H0, TABLES)
                sc = _pick(SC, 2 * layer, NREF, TABLES)
                if ADA:
                    sh = _pick(SH, 2 * layer, NREF, TABLES)
                else:
                    sh = sc
                for t in range(pid, q_tiles, nprog):
                    gemm_tile(t, HB, shb, w, sw_q, QB, sqb, M, W, n_qkv, n_mt, q_splits, q_kper,
                              STATS, n_stats_d, sc, s_sc, sh, s_sh, T, eps,
                              COS, SIN, scb, sct, Hq + Hkv, HB, shb, sc, s_g, STATS, WS, CNT,
                              ROPE, True, ADA, False, HALF, STATS_BLOCK, BLOCK_M, BN_Q, BK_Q, ITEMS)
                if MULTI:
                    if PREFETCH:
                        kp = _pick(KP, layer, H0, TABLES)
                        vp = _pick(VP, layer, H0, TABLES)
                        for t in range(pid, a_tiles, nprog):
                            prefetch_attention_tile(t, kp, vp, skb, skh, skn, svb, svh, svn, P, Hkv, a_mt, a_splits,
                                                    a_chunk, D, AN, LINE)
                    epoch += 1
                    grid_barrier(BAR, epoch * nprog)
            if PHASES & 4:   # ATTN
                kp = _pick(KP, layer, H0, TABLES)
                vp = _pick(VP, layer, H0, TABLES)
                for t in range(pid, a_tiles, nprog):
                    attention_tile(t, QB, sqb, kp, vp, skb, skh, skn, svb, svh, svn, MASK, smb, smq, smk, AB, sab,
                                   WS, CNT, T, P, Hq, Hkv, (Hq // Hkv) * T, a_mt, a_splits, a_chunk, qk_scale,
                                   MASK_MODE, MASK_PER_KEY, AM, AN, D, DOT_PREC)
                if MULTI:
                    if PREFETCH:
                        w = _pick(O_W, layer, H0, TABLES)
                        for t in range(pid, o_tiles, nprog):
                            prefetch_gemm_tile(t, w, sw_o, Hq * D, W, n_mt, o_splits, o_kper, RESID, HALF, BN_O,
                                               BK_O, LINE)
                    epoch += 1
                    grid_barrier(BAR, epoch * nprog)
            if PHASES & 8:   # OPROJ
                w = _pick(O_W, layer, H0, TABLES)
                if ADA:
                    g = _pick(GT, 2 * layer, NREF, TABLES)
                else:
                    g = w
                for t in range(pid, o_tiles, nprog):
                    gemm_tile(t, AB, sab, w, sw_o, HB, shb, M, Hq * D, W, n_mt, o_splits, o_kper,
                              STATS, n_stats_d, g, s_sc, g, s_sh, T, eps,
                              COS, SIN, scb, sct, 0, HB, shb, g, s_g, STATS, WS, CNT,
                              RESID, False, False, ADA, HALF, STATS_BLOCK, BLOCK_M, BN_O, BK_O, ITEMS)
                if MULTI:
                    if PREFETCH:
                        w = _pick(GU_W, layer, H0, TABLES)
                        for t in range(pid, g_tiles, nprog):
                            prefetch_gemm_tile(t, w, sw_g, W, I, n_mt, g_splits, g_kper, GEGLU, HALF, BN_G, BK_G,
                                               LINE)
                    epoch += 1
                    grid_barrier(BAR, epoch * nprog)
            if PHASES & 16:  # GATE_UP
                w = _pick(GU_W, layer, H0, TABLES)
                sc = _pick(SC, 2 * layer + 1, NREF, TABLES)
                if ADA:
                    sh = _pick(SH, 2 * layer + 1, NREF, TABLES)
                else:
                    sh = sc
                for t in range(pid, g_tiles, nprog):
                    gemm_tile(t, HB, shb, w, sw_g, MB, smbuf, M, W, I, n_mt, g_splits, g_kper,
                              STATS, n_stats_o, sc, s_sc, sh, s_sh, T, eps,
                              COS, SIN, scb, sct, 0, HB, shb, sc, s_g, STATS, WS, CNT,
                              GEGLU, True, ADA, False, HALF, STATS_BLOCK, BLOCK_M, BN_G, BK_G, ITEMS)
                if MULTI:
                    if PREFETCH:
                        w = _pick(DN_W, layer, H0, TABLES)
                        for t in range(pid, d_tiles, nprog):
                            prefetch_gemm_tile(t, w, sw_d, I, W, n_mt, d_splits, d_kper, RESID, HALF, BN_D, BK_D,
                                               LINE)
                    epoch += 1
                    grid_barrier(BAR, epoch * nprog)
            if PHASES & 32:  # DOWN
                w = _pick(DN_W, layer, H0, TABLES)
                if ADA:
                    g = _pick(GT, 2 * layer + 1, NREF, TABLES)
                else:
                    g = w
                for t in range(pid, d_tiles, nprog):
                    gemm_tile(t, MB, smbuf, w, sw_d, HB, shb, M, I, W, n_mt, d_splits, d_kper,
                              STATS, n_stats_o, g, s_sc, g, s_sh, T, eps,
                              COS, SIN, scb, sct, 0, HB, shb, g, s_g, STATS, WS, CNT,
                              RESID, False, False, ADA, HALF, STATS_BLOCK, BLOCK_M, BN_D, BK_D, ITEMS)
                if MULTI:
                    if layer + 1 < layer1:
                        if PREFETCH:
                            w = _pick(QKV_W, layer + 1, H0, TABLES)
                            for t in range(pid, q_tiles, nprog):
                                prefetch_gemm_tile(t, w, sw_q, W, n_qkv, n_mt, q_splits, q_kper, ROPE, HALF, BN_Q,
                                                   BK_Q, LINE)
                        epoch += 1
                        grid_barrier(BAR, epoch * nprog)
                    elif layer1 == n_layers:   # FINAL follows
                        epoch += 1
                        grid_barrier(BAR, epoch * nprog)
        if PHASES & 64:  # FINAL (after the last layer): x = the last norm of h
            if layer1 == n_layers:
                sc = _pick(SC, 2 * layer1, NREF, TABLES)
                if ADA:
                    sh = _pick(SH, 2 * layer1, NREF, TABLES)
                else:
                    sh = sc
                for t in range(pid, r_tiles, nprog):
                    rows_tile(t, HB, shb, HB, shb, STATS, n_stats_d, XO, sxo, sc, s_sc, sh, s_sh, M, W, r_mt, T,
                              eps, True, ADA, STATS_BLOCK, RM, BN_D, ITEMS)
        if MULTI:   # count out; the last program resets both counters (all others are past their last wait)
            tl.debug_barrier()
            done = tl.atomic_add(BAR + 1, 1, sem="acq_rel", scope="gpu")
            if done == nprog - 1:
                tl.atomic_xchg(BAR, 0)
                tl.atomic_xchg(BAR + 1, 0)


# --------------------------------------------------------------------------- host side
_TABLES: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()
_TABLES_MAX = 512
# Tables a captured graph reads: the graph holds their addresses, not the tensors, so they are never dropped
# (a dropped table's memory could be reused while a graph still reads it). Bounded by the graphs captured.
_CAPTURED_TABLES: "dict[tuple, torch.Tensor]" = {}


def _address_table(tensors: Sequence[torch.Tensor], device: torch.device, captured: Optional[bool] = None
                   ) -> torch.Tensor:
    """int64 table of the tensors' addresses on ``device``; made once per address tuple (outside graph capture:
    the warm-up before a capture makes it with the same addresses) and kept: the least recently used dropped
    beyond _TABLES_MAX, except those a graph captured (``captured``: default, whether this stream is capturing)."""
    key = (device.type, device.index, tuple(t.data_ptr() for t in tensors))
    if captured is None:
        captured = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    table = _CAPTURED_TABLES.get(key)
    if table is not None:
        return table
    table = _TABLES.get(key)
    if table is not None:
        _TABLES.move_to_end(key)
    elif captured:
        raise RuntimeError("expert_stack: address tables are made before graph capture (run the call once first)")
    else:
        table = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64).to(device)
        _TABLES[key] = table
        if len(_TABLES) > _TABLES_MAX:
            _TABLES.popitem(last=False)
    if captured:
        _CAPTURED_TABLES[key] = _TABLES.pop(key)
    return table


def _rows(t: torch.Tensor, width: int, name: str) -> torch.Tensor:
    """A norm operand ([W], [B|1, W] or [B|1, 1, W]) as [B|1, W] rows with a contiguous last dim."""
    r = t.reshape(-1, width) if t.dim() != 2 else t
    if r.shape[-1] != width or r.stride(-1) != 1:
        raise ValueError(f"{name}: expected [W={width}] or per-item [B|1, W] rows, got {tuple(t.shape)}")
    return r


def _same_layout(tensors: Sequence[torch.Tensor], name: str) -> None:
    shape, stride, dtype = tensors[0].shape, tensors[0].stride(), tensors[0].dtype
    for t in tensors:
        if t.shape != shape or t.stride() != stride or t.dtype != dtype:
            raise ValueError(f"{name}: every layer must have one shape, layout and dtype "
                             f"({tuple(shape)} {dtype}), got {tuple(t.shape)} {t.dtype}")


def stack_plans(m: int, batch: int, tokens: int, width: int, mlp: int, n_heads: int, n_kv_heads: int, d: int,
                keys: int, device: torch.device, tiling: Optional[dict] = None):
    """(tiling, plans): the launch plan of every phase for these sizes (``tiling``: overrides of DEFAULT_TILING,
    per phase key by key)."""
    tiling = tiling or {}
    tl_ = {**DEFAULT_TILING, **tiling}
    for phase in ("qkv", "o", "gate_up", "down", "attention"):   # a phase's overrides go over its defaults
        tl_[phase] = {**DEFAULT_TILING[phase], **tiling.get(phase, {})}
    # a qkv tile pairs columns [c, c+BN) and [c+D/2, c+D/2+BN) of one head: BN at most D/2 (powers of two)
    tl_["qkv"] = {**tl_["qkv"], "block_n": min(tl_["qkv"]["block_n"], d // 2)}
    common = dict(block_m=tl_["block_m"], num_warps=tl_["num_warps"], num_stages=tl_["num_stages"])
    plans = {
        "qkv": gemm_plan(m, (n_heads + 2 * n_kv_heads) * (d // 2) // tl_["qkv"]["block_n"], width, device, **common,
                         **tl_["qkv"]),
        "o": gemm_plan(m, cdiv(width, tl_["o"]["block_n"]), n_heads * d, device, **common, **tl_["o"]),
        "gate_up": gemm_plan(m, cdiv(mlp, tl_["gate_up"]["block_n"]), width, device, **common, **tl_["gate_up"]),
        "down": gemm_plan(m, cdiv(width, tl_["down"]["block_n"]), mlp, device, **common, **tl_["down"]),
        "attention": attention_plan(batch, n_kv_heads, n_heads // n_kv_heads, tokens, keys, d, device,
                                    **tl_["attention"]),
    }
    return tl_, plans


def launch_stages(plans: dict, head_dim: int, element_size: int) -> dict:
    """Pipeline stages of each phase's kernel, and of a persistent launch (``"persistent"``: one value for every
    loop of the kernel, qkv's asked for), fitted to the shared-memory budget at this operand size: a GEMM stage
    holds a row tile and one or two weight tiles of block_k, an attention stage a key and a value tile of
    head_dim. fp32 operands take twice bf16's bytes (2026-12-03: fp32 at batch 2 gave the persistent launch
    qkv's three stages, 284 KB of shared memory, past the 227 KB a block may have); bf16 keeps every plan's."""
    a = plans["attention"]
    tiles = {"attention": (a.block_n, a.block_n, head_dim)}   # (rows, weight rows, depth) of one stage
    for name, halves in (("qkv", 2), ("o", 1), ("gate_up", 2), ("down", 1)):   # ROPE / GEGLU read two halves
        p = plans[name]
        tiles[name] = (p.block_m, halves * p.block_n, p.block_k)
    stages = {name: fit_stages(plans[name].num_stages, *t, element_size) for name, t in tiles.items()}
    stages["persistent"] = min(fit_stages(plans["qkv"].num_stages, *t, element_size) for t in tiles.values())
    return stages


class StackLaunch:
    """One ``expert_stack`` call: its checked operands, every phase's launch plan and the buffers the phases
    pass on (``h`` the working residual [M, W], ``stats`` its row statistics, ``qkv``, ``attn``, ``mlp`` and
    ``out``, the result [B, T, W]). ``phase`` launches one phase as its own kernel; ``persistent`` launches a
    span of layers as one kernel; ``run`` does a whole call in one of the LAUNCHES forms."""

    def __init__(self, h: torch.Tensor, qkv_w: Sequence[torch.Tensor], o_w: Sequence[torch.Tensor],
                 gate_up_w: Sequence[torch.Tensor], down_w: Sequence[torch.Tensor],
                 k_prefix: Sequence[torch.Tensor], v_prefix: Sequence[torch.Tensor], mask: Optional[torch.Tensor],
                 cos: torch.Tensor, sin: torch.Tensor, scale: Sequence[torch.Tensor],
                 shift: Optional[Sequence[torch.Tensor]], gate: Optional[Sequence[torch.Tensor]], eps: float, *,
                 n_heads: int, tiling: Optional[dict] = None):
        require_triton()
        n = len(qkv_w)
        if n == 0 or not (len(o_w) == len(gate_up_w) == len(down_w) == len(k_prefix) == len(v_prefix) == n):
            raise ValueError("qkv_w, o_w, gate_up_w, down_w, k_prefix and v_prefix need one entry per layer (>= 1)")
        ada = shift is not None
        if (gate is not None) != ada or len(scale) != 2 * n + 1 or (ada and (len(shift) != 2 * n + 1
                                                                             or len(gate) < 2 * n)):
            raise ValueError(f"norms: 2n+1 = {2 * n + 1} scales, and shifts (2n+1) and gates (2n) both or neither")
        check_tensors(("h", h), ("cos", cos), ("sin", sin),
                      ("mask", mask if mask is not None and mask.is_floating_point() else None),
                      *((f"layer weight {i}", t) for i, t in enumerate((*qkv_w, *o_w, *gate_up_w, *down_w))),
                      *(("k_prefix", t) for t in k_prefix), *(("v_prefix", t) for t in v_prefix))
        if h.dim() != 3 or not h.is_contiguous():
            raise ValueError(f"h must be a contiguous [B, T, W] tensor, got {tuple(h.shape)}")
        b, t, w = h.shape
        m = b * t
        dev, dt = h.device, h.dtype
        for name, ts in (("qkv_w", qkv_w), ("o_w", o_w), ("gate_up_w", gate_up_w), ("down_w", down_w),
                         ("k_prefix", k_prefix), ("v_prefix", v_prefix)):
            _same_layout(ts, name)
            if ts[0].dtype != dt or ts[0].stride(-1) != 1:
                raise ValueError(f"{name} must be in h's dtype {dt} with a contiguous last dim")
        if k_prefix[0].dim() != 4 or k_prefix[0].shape[0] != b or v_prefix[0].shape != k_prefix[0].shape:
            raise ValueError(f"k_prefix / v_prefix must be [B={b}, Hkv, P, D], got {tuple(k_prefix[0].shape)}")
        hkv, p, d = k_prefix[0].shape[1:]
        hq = int(n_heads)
        mlp = gate_up_w[0].shape[0] // 2
        if (qkv_w[0].shape != ((hq + 2 * hkv) * d, w) or o_w[0].shape != (w, hq * d)
                or gate_up_w[0].shape != (2 * mlp, w) or down_w[0].shape != (w, mlp) or hkv == 0 or hq % hkv):
            raise ValueError(f"layer shapes do not fit W={w}, Hq={hq}, Hkv={hkv}, D={d}: qkv "
                             f"{tuple(qkv_w[0].shape)}, o {tuple(o_w[0].shape)}, gate_up "
                             f"{tuple(gate_up_w[0].shape)}, down {tuple(down_w[0].shape)}")
        if d < 32 or d & (d - 1):
            raise ValueError(f"head_dim must be a power of two >= 32 (RoPE pairs of half-heads per tile), got {d}")
        if cos.shape != (b, t, d) or sin.shape != cos.shape or sin.stride() != cos.stride() or cos.stride(-1) != 1:
            raise ValueError(f"cos / sin must be [B={b}, T={t}, D={d}] with one layout")
        scale = [_rows(x, w, "scale") for x in scale]
        shift = [_rows(x, w, "shift") for x in shift] if ada else None
        gate = [_rows(x, w, "gate") for x in gate[:2 * n]] if ada else None
        for name, ts in (("scale", scale), ("shift", shift), ("gate", gate)):
            for r in ts or ():
                if r.shape[0] not in (1, b) or r.device != dev:
                    raise ValueError(f"{name}: rows must be 1 or B={b} on {dev}, got {tuple(r.shape)}")
        item_stride = lambda r: r.stride(0) if r.shape[0] > 1 else 0  # noqa: E731  one row: shared by the batch
        self.n_strides = (item_stride(scale[0]), item_stride(shift[0]) if ada else 0,
                          item_stride(gate[0]) if ada else 0)
        if any(item_stride(r) != st for rs, st in zip((scale, shift, gate), self.n_strides) for r in rs or ()):
            raise ValueError("every norm's scale / shift / gate rows need one item stride")
        self.tiling, plans = stack_plans(m, b, t, w, mlp, hq, hkv, d, p + t, dev, tiling)
        pq, pa, po, pg, pd = (plans[k] for k in ("qkv", "attention", "o", "gate_up", "down"))
        if (d // 2) % pq.block_n:
            raise ValueError(f"qkv block_n {pq.block_n} must divide D/2 = {d // 2}")
        if len({pq.block_m, po.block_m, pg.block_m, pd.block_m}) != 1:
            raise ValueError("every GEMM phase needs one block_m")
        if mask is not None:
            if mask.device != dev:
                raise ValueError("mask must be on h's device")
            mask_mode, per_key, smb, smq, smk = mask_strides(mask, b, t, p + t)
        else:
            mask_mode, per_key, smb, smq, smk = 0, True, 0, 0, 0
            mask = h
        self.n_layers, self.plans, self.device = n, plans, dev
        self.stages = launch_stages(plans, d, h.element_size())
        self.layer_weights = (qkv_w, o_w, gate_up_w, down_w, k_prefix, v_prefix)
        self.scale, self.shift, self.gate, self.ada = scale, shift, gate, ada

        self.h = torch.empty(m, w, dtype=dt, device=dev)
        self.out = torch.empty(b, t, w, dtype=dt, device=dev)
        self.qkv = torch.empty(m, (hq + 2 * hkv) * d, dtype=dt, device=dev)
        self.attn = torch.empty(m, hq * d, dtype=dt, device=dev)
        self.mlp = torch.empty(m, mlp, dtype=dt, device=dev)
        self.stats = torch.empty(max(po.n_pb, pd.n_pb), m, dtype=torch.float32, device=dev)
        self.ws = torch.empty(max(1, pq.ws_floats, pa.ws_floats, po.ws_floats, pg.ws_floats, pd.ws_floats),
                              dtype=torch.float32, device=dev)
        # ticket counters (one per output tile of the widest phase), then the grid barrier's two: all reset by
        # the kernels themselves once used, zeroed here once per call
        self.counters = torch.zeros(max(pq.n_pb * pq.n_mt, po.n_pb * po.n_mt, pg.n_pb * pg.n_mt,
                                        pd.n_pb * pd.n_mt, b * hkv * pa.n_mt) + 2, dtype=torch.int32, device=dev)
        rm = self.tiling["rows_block_m"]
        r_mt = cdiv(m, rm)
        self.rows_tiles = r_mt * pd.n_pb
        self.on_cuda = dev.type == "cuda" and not interpret_mode()
        self.launch_kw = pdl(dev)
        self.common = dict(
            M=m, W=w, I=mlp, T=t, P=p, Hq=hq, Hkv=hkv, eps=float(eps), qk_scale=d ** -0.5 * LOG2E,
            n_mt=pq.n_mt, q_splits=pq.splits, q_kper=pq.k_per, q_tiles=pq.n_tiles, a_mt=pa.n_mt,
            a_splits=pa.n_splits, a_chunk=pa.chunk, a_tiles=pa.n_tiles, o_splits=po.splits, o_kper=po.k_per,
            o_tiles=po.n_tiles, g_splits=pg.splits, g_kper=pg.k_per, g_tiles=pg.n_tiles, d_splits=pd.splits,
            d_kper=pd.k_per, d_tiles=pd.n_tiles, r_mt=r_mt, r_tiles=self.rows_tiles, n_stats_o=po.n_pb,
            n_stats_d=pd.n_pb, n_layers=n, ADA=ada, ITEMS=any(self.n_strides), D=d, BLOCK_M=pq.block_m,
            BN_Q=pq.block_n, BK_Q=pq.block_k, BN_O=po.block_n, BK_O=po.block_k, BN_G=pg.block_n, BK_G=pg.block_k,
            BN_D=pd.block_n, BK_D=pd.block_k, AM=pa.block_m, AN=pa.block_n, MASK_MODE=mask_mode,
            MASK_PER_KEY=per_key, DOT_PREC="ieee" if dt == torch.float32 else "tf32", RM=rm,
            STATS_BLOCK=next_power_of_2(max(po.n_pb, pd.n_pb)), LINE=128 // h.element_size(), **self.launch_kw)
        self.buffers = (h, h.stride(1), self.h, self.h.stride(0), self.out, self.out.stride(1), self.qkv,
                        self.qkv.stride(0), self.attn, self.attn.stride(0), self.mlp, self.mlp.stride(0), self.stats,
                        self.ws, self.counters, self.counters[-2:], mask, smb, smq, smk, cos, sin, cos.stride(0),
                        cos.stride(1))
        kp0, vp0 = k_prefix[0], v_prefix[0]
        self.strides = (qkv_w[0].stride(0), o_w[0].stride(0), gate_up_w[0].stride(0), down_w[0].stride(0),
                        kp0.stride(0), kp0.stride(1), kp0.stride(2), vp0.stride(0), vp0.stride(1), vp0.stride(2))

    # ------------------------------------------------------------------ one phase, its own kernel
    def phase(self, which: int, layer: int = 0) -> None:
        """Launch phase ``which`` (ROWS, QKV, ATTN, OPROJ, GATE_UP, DOWN or FINAL) of ``layer`` as one kernel
        (one program per tile; PDL-chained to the previous kernel where the device has it)."""
        n, sc, sh, g = self.n_layers, self.scale, self.shift, self.gate
        i = layer
        lw = tuple(ts[i] for ts in self.layer_weights) if which & LAYER else (self.buffers[0],) * 6
        none = sc[0]
        if which == ROWS:
            norms, tiles = (none, none, none), self.rows_tiles
        elif which == FINAL:
            i = n - 1
            norms, tiles = (sc[2 * n], sh[2 * n] if self.ada else none, none), self.rows_tiles
        elif which in (QKV, GATE_UP):
            j = 2 * i + (which == GATE_UP)
            norms = (sc[j], sh[j] if self.ada else none, none)
            tiles = self.plans["qkv" if which == QKV else "gate_up"].n_tiles
        elif which in (OPROJ, DOWN):
            j = 2 * i + (which == DOWN)
            norms = (none, none, g[j] if self.ada else none)
            tiles = self.plans["o" if which == OPROJ else "down"].n_tiles
        elif which == ATTN:
            norms, tiles = (none, none, none), self.plans["attention"].n_tiles
        else:
            raise ValueError(f"unknown phase {which}")
        plan = {QKV: "qkv", ATTN: "attention", OPROJ: "o", GATE_UP: "gate_up", DOWN: "down"}.get(which)
        warps, stages = (self.plans[plan].num_warps, self.stages[plan]) if plan else (4, 1)
        prefetch = bool(plan and self.tiling["prefetch"] and self.on_cuda and self.launch_kw["PDL"])
        _expert_kernel[(tiles,)](*lw, *self.strides, *norms, none, *self.n_strides, *self.buffers,
                                 layer0=i, layer1=i + 1, PHASES=which, TABLES=False, PREFETCH=prefetch,
                                 num_warps=warps, num_stages=stages, **self.common)

    # ------------------------------------------------------------------ layers l0 .. l1-1 in one kernel
    def persistent(self, l0: int, l1: int, grid: Optional[int] = None, cooperative: Optional[bool] = None) -> None:
        """One persistent launch over layers [l0, l1) (with ROWS when l0 == 0 and FINAL when l1 == n): ``grid``
        programs (default: SMs x grid_per_sm, at most the largest phase's tiles), grid barriers between phases,
        per-layer operands through address tables; a cooperative launch on CUDA unless ``cooperative`` (default:
        the tiling's) is off."""
        dev = self.device
        if any(x.dtype != torch.float32 for x in (*self.scale, *(self.shift or ()), *(self.gate or ()))):
            raise ValueError("persistent launches take float32 norm operands")
        tables = tuple(_address_table(ts, dev) for ts in self.layer_weights)
        st = _address_table(self.scale, dev)
        norm_tables = (st, _address_table(self.shift, dev) if self.ada else st,
                       _address_table(self.gate, dev) if self.ada else st)
        p = self.plans
        most = max(p["qkv"].n_tiles, p["attention"].n_tiles, p["o"].n_tiles, p["gate_up"].n_tiles,
                   p["down"].n_tiles, self.rows_tiles)
        g = grid or max(1, min(most, num_sms(dev) * self.tiling["grid_per_sm"]))
        if interpret_mode():   # the interpreter runs programs one after another: a barrier waits for one
            g = 1
        coop = self.tiling["cooperative"] if cooperative is None else cooperative
        extra = {"launch_cooperative_grid": True} if self.on_cuda and coop else {}
        _expert_kernel[(g,)](*tables, *self.strides, *norm_tables, self.scale[0], *self.n_strides, *self.buffers,
                             layer0=l0, layer1=l1, PHASES=ROWS | LAYER | FINAL, TABLES=True,
                             PREFETCH=bool(self.tiling["prefetch"] and self.on_cuda),
                             num_warps=max(p["qkv"].num_warps, p["attention"].num_warps),
                             num_stages=self.stages["persistent"], **self.common, **extra)

    def run(self, launch: str = "kernels", grid: Optional[int] = None,
            cooperative: Optional[bool] = None) -> torch.Tensor:
        if launch not in LAUNCHES:
            raise ValueError(f"launch must be one of {LAUNCHES}, got {launch!r}")
        n = self.n_layers
        if launch == "kernels":
            self.phase(ROWS)
            for i in range(n):
                for which in (QKV, ATTN, OPROJ, GATE_UP, DOWN):
                    self.phase(which, i)
            self.phase(FINAL)
        elif launch == "layer":
            for i in range(n):
                self.persistent(i, i + 1, grid, cooperative)
        else:
            self.persistent(0, n, grid, cooperative)
        return self.out


def expert_stack(h: torch.Tensor, qkv_w: Sequence[torch.Tensor], o_w: Sequence[torch.Tensor],
                 gate_up_w: Sequence[torch.Tensor], down_w: Sequence[torch.Tensor],
                 k_prefix: Sequence[torch.Tensor], v_prefix: Sequence[torch.Tensor], mask: Optional[torch.Tensor],
                 cos: torch.Tensor, sin: torch.Tensor, scale: Sequence[torch.Tensor],
                 shift: Optional[Sequence[torch.Tensor]], gate: Optional[Sequence[torch.Tensor]], eps: float, *,
                 n_heads: int, launch: str = "kernels", tiling: Optional[dict] = None,
                 grid: Optional[int] = None, cooperative: Optional[bool] = None) -> torch.Tensor:
    """The expert's layers on the residual stream h [B, T, W] -> x [B, T, W], the final norm of the last h
    (in h's dtype; h itself is not changed).

    Per layer i: qkv_w[i] [(Hq + 2 Hkv) D, W], o_w[i] [W, Hq D], gate_up_w[i] [2 I, W] ([gate; up]),
    down_w[i] [W, I], all h's dtype; k_prefix[i] / v_prefix[i] [B, Hkv, P, D] (keys rotated). mask over the
    P + T keys (additive float or bool; [B, 1, T|1, P+T] or [B, P+T]); cos / sin [B, T, D] of the T tokens.
    Norm j (2i: layer i's input, 2i+1: its post-attention norm, 2n: the final norm): scale[j] (pi0's plain
    Gemma weight [W], or adaRMS per item [B|1, W]), shift[j] (None: plain), gate[j] scaling the residual of
    the sublayer norm j feeds (None: plain residual). ``launch``: "kernels", "layer" or "step" (module doc);
    ``tiling``: overrides of DEFAULT_TILING (per phase key by key); ``grid``: programs of a persistent launch
    (default: SMs x grid_per_sm, at most the largest phase's tiles).
    """
    return StackLaunch(h, qkv_w, o_w, gate_up_w, down_w, k_prefix, v_prefix, mask, cos, sin, scale, shift, gate,
                       eps, n_heads=n_heads, tiling=tiling).run(launch, grid, cooperative)
