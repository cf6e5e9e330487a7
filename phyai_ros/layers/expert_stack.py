"""The action expert's layer stack as one op (pi0 and pi0.5): its norms, its reference and its fused launches.

Why the whole stack is one op: the fused forms keep state between layers that the per-op path does not have
(the residual's row statistics instead of the normed activations, workspaces, ticket counters), and the
persistent forms run several layers in one kernel; only at the stack's boundary (the residual stream in, the
final norm's output out) do all forms agree. ``expert_stack`` (the op, below) selects among them:

* ``unfused`` (the reference, last): today's per-op path, each op selected on its own (skinny GEMMs with
  fused epilogues, the split-KV attention, ...), bit for bit what the models ran before this op existed;
* ``kernels``: kernels/candidates/expert_layer.py's phases, five kernels per layer, no reducers (up to 64 rows;
  ``kernels_wide`` is the same for more rows, ``kernels_s1`` / ``kernels_n16`` other tilings);
* ``layer`` / ``step``: the same phases as one persistent kernel per layer / per denoising step;
* ``unfused_l2_*``: the reference with each layer's o / gate_up / down weights (and the next layer's qkv)
  prefetched into L2 on a side branch while its attention runs (layers/prefetch_branch.py): the same kernels,
  the same values, the GEMMs reading L2 instead of HBM.

Every fused form is profiled-only (``FUSED_FORMS``, ``PREFETCH_FORMS``): without a device profile that measured it
faster, the reference runs; on the H200 none was (kernels/candidates/README.md).

Training-time RTC (modulation per token), quantized weights and anything the kernels do not take run the
reference. Design: design.md §8.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Sequence

import torch

from phyai_ros.kernels.candidates import expert_layer as expert_layer_kernels
from phyai_ros.layers import prefetch_branch as branch
from phyai_ros.layers.attention import rope_attention_with_prefix
from phyai_ros.layers.linears import linear, linear_add_rms_norm, linear_gated_ada_rms_norm
from phyai_ros.layers.norms import ada_rms_norm, rms_norm
from phyai_ros.layers.ops import attn_tokens
from phyai_ros.layers.post_norm import linear_gated_norm_geglu
from phyai_ros.layers.registry import CUDA, current_selector, register, triton_ok
from phyai_ros.layers.selector import Candidate, shape_key

Tensor = torch.Tensor


class ExpertNorms(NamedTuple):
    """The 2 * depth + 1 RMSNorms of an action expert, in order: layer 0's input norm, its post-attention norm,
    layer 1's input norm, ..., the final norm. Either adaRMS (pi0.5): ``mod`` [B|1, 2*depth+1, 3, 1|H, W]
    float32, (scale, shift, gate) per norm, where norm j's gate scales the residual of the sublayer it feeds
    (H: per token, training-time RTC); or plain Gemma RMSNorm (pi0): ``weights``, one [W] vector per norm,
    residuals ungated."""
    mod: Optional[Tensor] = None
    weights: tuple = ()

    @property
    def adaptive(self) -> bool:
        return self.mod is not None

    @property
    def count(self) -> int:
        return self.mod.shape[1] if self.adaptive else len(self.weights)

    @property
    def per_token(self) -> bool:
        return self.adaptive and self.mod.shape[3] > 1

    def scale(self, j: int) -> Tensor:
        """Norm j's scale ([B|1, 1|H, W] slice of mod) or plain weight ([W])."""
        return self.mod[:, j, 0] if self.adaptive else self.weights[j]

    def shift(self, j: int) -> Tensor:
        return self.mod[:, j, 1]

    def gate(self, j: int) -> Tensor:
        return self.mod[:, j, 2]

    def rows(self) -> tuple:
        """(scales, shifts, gates) as the kernels take them: [B|1, W] rows per norm; shifts and gates None for
        plain norms."""
        if not self.adaptive:
            return [w.reshape(1, -1) for w in self.weights], None, None
        w = self.mod.shape[-1]
        per = [[self.mod[:, j, c].reshape(-1, w) for j in range(self.count)] for c in range(3)]
        return per[0], per[1], per[2][:-1]


def unfused(h: Tensor, layers: Sequence, kv: Sequence, ctx, norms: ExpertNorms, eps: float,
            prefetch: Optional[branch.PrefetchPlan] = None, reach: str = "layer") -> Tensor:
    """The reference: per layer qkv GEMM, RoPE + attention, o-proj with residual and norm and the GeGLU GEMM
    (one selected op, linear_gated_norm_geglu), down-proj with residual and norm, each through its own selected
    op; returns the final norm's output.
    ``prefetch``: as each layer's attention starts, its GEMMs' weights go into L2 on a side branch (``reach``:
    see ``prefetched_weights``); the values are the same."""
    n = len(layers)
    if norms.adaptive:
        x = ada_rms_norm(h, norms.scale(0), norms.shift(0), eps)
    else:
        x = rms_norm(h, norms.scale(0), eps)
    for i, layer in enumerate(layers):
        qkv = linear(x, layer.qkv_w)
        if prefetch is not None:
            branch.fork(layer, prefetched_weights(layers, i, reach), prefetch)
        a = attn_tokens(rope_attention_with_prefix(qkv, ctx.cos, ctx.sin, *kv[i], ctx.mask))
        if norms.adaptive:
            h, m = linear_gated_norm_geglu(a, layer.o_w, h, norms.gate(2 * i), norms.scale(2 * i + 1),
                                           norms.shift(2 * i + 1), layer.gate_up_w, eps)
            h, x = linear_gated_ada_rms_norm(m, layer.down_w, h, norms.gate(2 * i + 1), norms.scale(2 * i + 2),
                                             norms.shift(2 * i + 2), eps)
        else:
            h, m = linear_gated_norm_geglu(a, layer.o_w, h, None, norms.scale(2 * i + 1), None, layer.gate_up_w,
                                           eps)
            if i + 1 < n:
                x, h = linear_add_rms_norm(m, layer.down_w, h, norms.scale(2 * i + 2), eps)
            else:
                h = h + linear(m, layer.down_w)
                x = rms_norm(h, norms.scale(2 * n), eps)
    if prefetch is not None:
        branch.join(h.device)
    return x


REACHES = ("mlp", "layer")


def prefetched_weights(layers: Sequence, i: int, reach: str) -> list:
    """What layer i's attention overlaps: the weights read after it, in the order read. ``"mlp"``: gate_up and
    down; ``"layer"``: o, gate_up, down, and the next layer's qkv."""
    if reach not in REACHES:
        raise ValueError(f"reach must be one of {REACHES}, got {reach!r}")
    la = layers[i]
    if reach == "mlp":
        return [la.gate_up_w, la.down_w]
    return [la.o_w, la.gate_up_w, la.down_w] + ([layers[i + 1].qkv_w] if i + 1 < len(layers) else [])


def prefetch_fits(h: Tensor, layers: Sequence, kv: Sequence, ctx, norms: ExpertNorms, eps: float, *,
                  plan: branch.PrefetchPlan) -> bool:
    """The prefetching reference takes any call whose every layer's weights are contiguous CUDA tensors of one
    device its mode runs on (a quantized weight is the quantized ops' job: left to the plain reference)."""
    return bool(layers) and all(branch.usable([la.qkv_w, la.o_w, la.gate_up_w, la.down_w], plan) for la in layers)


def fused(h: Tensor, layers: Sequence, kv: Sequence, ctx, norms: ExpertNorms, eps: float, *, launch: str,
          tiling: Optional[dict] = None) -> Tensor:
    """kernels/candidates/expert_layer.py's stack in one of its launch forms."""
    scales, shifts, gates = norms.rows()
    k0 = kv[0][0]
    return expert_layer_kernels.expert_stack(
        h.contiguous(), [la.qkv_w for la in layers], [la.o_w for la in layers], [la.gate_up_w for la in layers],
        [la.down_w for la in layers], [k for k, _ in kv], [v for _, v in kv], ctx.mask, ctx.cos, ctx.sin, scales,
        shifts, gates, eps, n_heads=layers[0].qkv_w.shape[0] // k0.shape[-1] - 2 * k0.shape[1], launch=launch,
        tiling=tiling)


def fits(h: Tensor, layers: Sequence, kv: Sequence, ctx, norms: ExpertNorms, eps: float,
         max_rows: Optional[int] = None, min_rows: int = 0) -> bool:
    """What the fused forms take: float weights of h's dtype (a QuantizedWeight runs the reference), norms per
    batch item (not per token), a power-of-two head_dim >= 32, the suffix's RoPE tables per token; rows
    (B * T) within [min_rows, max_rows]."""
    if h.dim() != 3 or h.dtype not in (torch.float32, torch.float16, torch.bfloat16) or not layers:
        return False
    rows = h.shape[0] * h.shape[1]
    if rows < min_rows or (max_rows is not None and rows > max_rows) or norms.per_token:
        return False
    if norms.count != 2 * len(layers) + 1 or len(kv) != len(layers):
        return False
    weights = [getattr(la, n) for la in layers for n in ("qkv_w", "o_w", "gate_up_w", "down_w")]
    if not all(isinstance(w, torch.Tensor) and w.dtype == h.dtype for w in weights):
        return False
    d = kv[0][0].shape[-1]
    return (d >= 32 and d & (d - 1) == 0 and kv[0][0].dtype == h.dtype
            and tuple(ctx.cos.shape) == (h.shape[0], h.shape[1], d))


# A persistent kernel has one program per SM: split so that every phase has about one tile per program (one round).
PERSISTENT_TILING = {"qkv": {"tiles_per_sm": 1}, "o": {"tiles_per_sm": 1}, "gate_up": {"tiles_per_sm": 1},
                     "down": {"tiles_per_sm": 1}, "attention": {"tiles_per_sm": 1}}

# Many rows (batch 8, 32): larger tiles, so that each weight tile serves more rows (fewer re-reads of x from L2).
WIDE_TILING = {"block_m": 128, "num_warps": 8, "qkv": {"block_n": 64, "block_k": 64},
               "o": {"block_n": 64, "block_k": 64}, "gate_up": {"block_n": 64, "block_k": 64},
               "down": {"block_n": 64, "block_k": 64}, "attention": {"block_m": 64, "block_n": 64}}

# Launch forms the profile may pick: (name, launch, tiling overrides, rows taken). Every fused form is profiled-only:
# it runs only where a device profile measured it faster than the reference: on the H200 (2026-12-01, the runner,
# pi0.5 batch 1) the 5-kernel form took the loop from 7.82 to 12.54 ms (docs/benchmarks.md, issue 21).
FUSED_FORMS = (
    ("kernels", "kernels", None, (0, 64)),
    ("kernels_wide", "kernels", WIDE_TILING, (65, None)),
    ("kernels_s1", "kernels", {n: {"block_n": 32, "block_k": 128, "splits": 1} for n in ("qkv", "o", "gate_up",
                                                                                         "down")}, (0, None)),
    ("kernels_n16", "kernels", {"qkv": {"block_n": 16, "block_k": 128}, "o": {"block_n": 16, "block_k": 256},
                                "gate_up": {"block_n": 16, "block_k": 128}, "down": {"block_n": 16, "block_k": 256},
                                "attention": {"block_m": 32, "block_n": 32}}, (0, None)),
    ("layer", "layer", PERSISTENT_TILING, (0, None)),
    ("step", "step", PERSISTENT_TILING, (0, None)),
)


# The prefetching reference in the variants a profile may pick: (name, plan, reach). Profiled-only: on the H200
# (2026-12-02, docs/benchmarks.md) the GEMMs are latency-bound, so L2-resident weights save ~2.5 us of a 38 us
# layer-step at most, and the prefetch itself competes with the attention; where weights stream slowly (Thor's
# 273 GB/s) the overlap is worth more. Bulk forms need sm_90+; "lines" is the portable one.
PREFETCH_FORMS = (
    ("unfused_l2_bulk16", branch.PrefetchPlan("bulk", 16), "layer"),
    ("unfused_l2_bulk64", branch.PrefetchPlan("bulk", 64), "layer"),
    ("unfused_l2_bulk16_mlp", branch.PrefetchPlan("bulk", 16), "mlp"),
    ("unfused_l2_lines64", branch.PrefetchPlan("lines", 64), "layer"),
)


def candidates() -> list:
    """The selector's candidates for "expert_stack", the reference last."""
    out = []
    for name, launch, tiling, (lo, hi) in FUSED_FORMS:
        out.append(Candidate(name, functools.partial(fused, launch=launch, tiling=tiling), CUDA, available=triton_ok,
                             supports=functools.partial(fits, min_rows=lo, max_rows=hi), profiled_only=True))
    for name, plan, reach in PREFETCH_FORMS:
        out.append(Candidate(name, functools.partial(unfused, prefetch=plan, reach=reach), CUDA, available=triton_ok,
                             supports=functools.partial(prefetch_fits, plan=plan), profiled_only=True))
    out.append(Candidate("unfused", unfused))
    return out


register("expert_stack", candidates())


def expert_stack(h: Tensor, layers, kv, ctx, norms: ExpertNorms, eps: float) -> Tensor:
    """The action expert's layers on its residual stream h [B, T, W] -> the final norm's output [B, T, W].
    layers: per layer qkv_w / o_w / gate_up_w / down_w (GemmaLayer); kv: per layer the prefix cache (k, v);
    ctx: the suffix's mask and RoPE tables (modeling.suffix.SuffixContext); norms: ExpertNorms (adaRMS modulation
    or plain weights, 2 * depth + 1 of them)."""
    kind = ("ada" if norms.adaptive else "rms") + ("_tok" if norms.per_token else "")
    key = f"{shape_key(h, kv[0][0])}|{kind}{len(layers)}"
    return current_selector().call("expert_stack", key, h.device, h, layers, kv, ctx, norms, eps)
