"""The layer ops the models call where a fused kernel may replace torch.

Each function here asks the operator selector which candidate runs (see
selector.py): the fused Triton kernels of ``phyai_ros.kernels`` on CUDA where
Triton works, the torch reference of ``ops`` otherwise. Signatures follow the
reference ops; the Triton wrappers' row layout is adapted here, once. The
``linear_*`` ops are a skinny GEMM with the elementwise op after it fused in
(fewer kernels per expert layer); where that kernel does not apply they run
"unfused": the sub-ops through their own entry points, each selected as alone.
A ``QuantizedWeight`` in place of a weight runs the op's quantized twin ("q" + the op's name), whose candidates
layers/quant_dispatch.py registers; ``expert_stack``'s are registered by layers/expert_stack.py (the layers
package imports all three).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Optional, Tuple

import torch

from phyai_ros.kernels import common as _triton_common
from phyai_ros.kernels.skinny_linear import MAX_ROWS as SKINNY_ROWS   # the few-row GEMMs' limit (imports anywhere)
from phyai_ros.layers import flashinfer_backend, ops
from phyai_ros.layers.quantized import QuantizedWeight, qshape_key
from phyai_ros.layers.selector import SELECTOR, Candidate, active_selector, shape_key

if TYPE_CHECKING:
    from phyai_ros.layers.expert_stack import ExpertNorms

Tensor = torch.Tensor
Weight = "Tensor | QuantizedWeight"   # every linear op takes either (a quantized one runs its "q" twin op)
_CUDA = ("cuda",)


def _selector():
    """The running policy's selector, else the module default (scripts, tests)."""
    return active_selector() or SELECTOR


def triton_ok() -> bool:
    """Whether the Triton candidates can be offered here (Triton imported; the selector checks CUDA)."""
    return _triton_common.HAVE_TRITON


# ----------------------------------------------------------------------------- torch references
def _torch_add_rms_norm(x, residual, weight, eps, weight_offset=1.0):
    r = x + residual
    return ops.rms_norm(r, weight, eps, weight_offset), r


def _torch_linear_add_layer_norm(h, x, weight, bias, ln_weight, ln_bias, eps):
    h = h + ops.linear(x, weight, bias)
    return h, ops.layer_norm(h, ln_weight, ln_bias, eps)


def _torch_gated_ada(h, y, gate, scale, shift, eps):
    h = ops.gated_residual(h, y, gate.to(h.dtype))
    return h, ops.ada_rms_norm(h, scale, shift, eps)


def _torch_qkv_rope(qkv, cos, sin, hq, hkv, d):
    b, t, _ = qkv.shape
    q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
    q = q.view(b, t, hq, d).transpose(1, 2)
    k = k.view(b, t, hkv, d).transpose(1, 2)
    v = v.view(b, t, hkv, d).transpose(1, 2)
    return ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin), v


def _torch_qkv_norm_rope(qkv, cos, sin, hq, hkv, d, q_norm, k_norm, eps):
    """Qwen3-VL: per-head RMSNorm (plain weight) of q and k where given, then RoPE in float32 (cos / sin may
    be float32 tables for a bf16 qkv), cast back to qkv's dtype."""
    b, t, _ = qkv.shape
    q, k, v = (p.view(b, t, -1, d) for p in qkv.split((hq * d, hkv * d, hkv * d), dim=-1))
    if q_norm is not None:
        q, k = ops.rms_norm(q, q_norm, eps, 0.0), ops.rms_norm(k, k_norm, eps, 0.0)
    cos, sin = cos.float(), sin.float()
    rot = lambda x: ops.apply_rope(x.transpose(1, 2).float(), cos, sin).to(qkv.dtype)  # noqa: E731
    return rot(q), rot(k), v.transpose(1, 2)


def _torch_linear_gelu_tanh(x, weight, bias):
    return ops.gelu_tanh(ops.linear(x, weight, bias))


def _cublaslt_linear_gelu_tanh(x, weight, bias):
    """The library GEMM with bias and GELU-tanh as its epilogue (cuBLASLt's GELU_BIAS, one kernel; torch
    falls back to GEMM + GELU where the epilogue does not apply): many rows (SigLIP, Qwen3-VL's vision MLP),
    where the separate GELU kernel reads and writes the whole activation once more."""
    k = x.shape[-1]
    y = torch._addmm_activation(bias, x.reshape(-1, k), weight.t(), use_gelu=True)
    return y.view(*x.shape[:-1], weight.shape[0])


def _cublaslt_gelu_fits(x, weight, bias=None):
    """More rows than the skinny kernels take: a few-row GEMM inside a loop of PDL-chained kernels (the DiT's)
    loses the overlap with its neighbours in a library kernel (+0.09 ms on GR00T's loop, H200 2026-12-02)."""
    return (bias is not None and bias.dim() == 1 and x.dtype == weight.dtype == bias.dtype
            and x.dtype in (torch.float16, torch.bfloat16) and x.stride(-1) == 1 and weight.is_contiguous()
            and x.numel() // x.shape[-1] > SKINNY_ROWS)


def _torch_geglu(gate_up):
    m = gate_up.shape[-1] // 2
    return ops.gelu_tanh_mul(gate_up[..., :m], gate_up[..., m:])


def _torch_swiglu(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _torch_attention_with_prefix(q, k_prefix, v_prefix, k_suffix, v_suffix, mask):
    return ops.attention(q, torch.cat([k_prefix, k_suffix], dim=2), torch.cat([v_prefix, v_suffix], dim=2), mask)


def sdpa(q, k, v, mask):
    """torch SDPA (flash / memory-efficient / cuDNN backends chosen by torch); GQA by expanding K/V views."""
    b, hq, _, d = q.shape
    if k.shape[1] != hq:
        k = k.expand(b, hq, k.shape[2], d) if k.shape[1] == 1 else k.repeat_interleave(hq // k.shape[1], 1)
        v = v.expand(b, hq, v.shape[2], d) if v.shape[1] == 1 else v.repeat_interleave(hq // v.shape[1], 1)
    if mask is not None:
        mask = mask.to(q.dtype)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


# ----------------------------------------------------------------------------- fused ops' fallbacks
# The sub-ops through their own entry points below, so each is selected as where it is called alone.
def _unfused_linear_geglu(x, gate_up_w):
    return geglu(linear(x, gate_up_w))


def _unfused_linear_add_rms(x, weight, residual, norm_w, eps):
    return add_rms_norm(linear(x, weight), residual, norm_w, eps)


def _unfused_linear_gated_ada(x, weight, h, gate, scale, shift, eps):
    return gated_ada_rms_norm(h, linear(x, weight), gate, scale, shift, eps)


# ----------------------------------------------------------------------------- Triton adapters
# Each adapter imports its kernel module when its candidate first runs: the kernels need Triton (the optional
# 'gpu' extra), and a machine without it must still import the layers and run the torch candidates.
def _mod_rows(t: Tensor, width: int) -> Tensor:
    """Modulation [B|1, 1, W] (broadcast over tokens) -> [B|1, W] rows, no copy."""
    return t.reshape(-1, width)


def _triton_ada(x, scale, shift, eps):
    from phyai_ros.kernels.ada_rms_norm import ada_rms_norm
    w = x.shape[-1]
    sc, sh = _mod_rows(scale, w), _mod_rows(shift, w)
    return ada_rms_norm(x, sc, sh, tokens_per_item=x.numel() // w // sc.shape[0], eps=eps)


def _triton_gated_ada(h, y, gate, scale, shift, eps):
    from phyai_ros.kernels.ada_rms_norm import gated_residual_ada_rms_norm
    w = h.shape[-1]
    g, sc, sh = _mod_rows(gate, w), _mod_rows(scale, w), _mod_rows(shift, w)
    return gated_residual_ada_rms_norm(h, y.to(h.dtype), g, sc, sh, tokens_per_item=h.numel() // w // g.shape[0],
                                       eps=eps)


def _triton_rms(x, weight, eps, weight_offset=1.0):
    from phyai_ros.kernels.rms_norm import rms_norm
    return rms_norm(x if x.is_contiguous() else x.contiguous(), weight, eps, weight_offset=weight_offset)


def _triton_add_rms(x, residual, weight, eps, weight_offset=1.0):
    from phyai_ros.kernels.rms_norm import add_rms_norm
    return add_rms_norm(x, residual, weight, eps, weight_offset=weight_offset)


def _triton_layer_norm(x, weight, bias, eps):
    from phyai_ros.kernels.layer_norm import layer_norm
    return layer_norm(x if x.is_contiguous() else x.contiguous(), weight, bias, eps)


def _triton_linear_add_layer_norm(h, x, weight, bias, ln_weight, ln_bias, eps):
    """The GEMM without its bias epilogue; the kernel adds the bias with the residual, rounding once."""
    from phyai_ros.kernels.layer_norm import add_layer_norm
    return add_layer_norm(h, ops.linear(x, weight), bias, ln_weight, ln_bias, eps)


def _triton_qkv_rope(qkv, cos, sin, hq, hkv, d, q_norm=None, k_norm=None, eps=1e-6):
    from phyai_ros.kernels.rope import qkv_rope
    return qkv_rope(qkv, cos, sin, hq, hkv, d, q_norm, k_norm, eps)


def _triton_linear(x, weight, bias=None, **tiling):
    from phyai_ros.kernels.skinny_linear import skinny_linear
    return skinny_linear(x, weight, bias, **tiling)


def _triton_linear_gelu_tanh(x, weight, bias, **tiling):
    from phyai_ros.kernels.skinny_linear import skinny_linear
    return skinny_linear(x, weight, bias, "gelu_tanh", **tiling)


def _skinny_shape(x, weight, bias=None):
    """Few rows (the expert's / DiT's tokens), x's dtype; a bias, if any, one [N] vector (added in the
    epilogue)."""
    return (x.numel() // x.shape[-1] <= SKINNY_ROWS and x.dtype == weight.dtype
            and (bias is None or bias.shape == weight.shape[:1]))


def _triton_skinny_add_layer_norm(h, x, weight, bias, ln_weight, ln_bias, eps, **tiling):
    from phyai_ros.kernels.skinny_epilogue import linear_add_layer_norm
    return linear_add_layer_norm(h, x, weight, bias, ln_weight, ln_bias, eps, **tiling)


def _skinny_add_layer_norm(h, x, weight, bias, *rest):
    """Few rows, a residual h of the GEMM output's rows and dtype."""
    return _skinny_shape(x, weight, bias) and h.dtype == x.dtype and h.shape == (*x.shape[:-1], weight.shape[0])


def _triton_linear_geglu(x, gate_up_w, **tiling):
    from phyai_ros.kernels.skinny_epilogue import linear_geglu
    return linear_geglu(x, gate_up_w, **tiling)


def _triton_linear_add_rms(x, weight, residual, norm_w, eps, **tiling):
    from phyai_ros.kernels.skinny_epilogue import linear_add_rms_norm
    return linear_add_rms_norm(x, weight, residual, norm_w, eps, **tiling)


def _triton_linear_gated_ada(x, weight, h, gate, scale, shift, eps, **tiling):
    from phyai_ros.kernels.skinny_epilogue import linear_gated_ada_rms_norm
    w = h.shape[-1]
    g, sc, sh = _mod_rows(gate, w), _mod_rows(scale, w), _mod_rows(shift, w)
    return linear_gated_ada_rms_norm(x, weight, h, g, sc, sh, tokens_per_item=h.numel() // w // g.shape[0], eps=eps,
                                     **tiling)


# Launch shapes of the skinny GEMMs, each its own candidate (the first is the default where a profile has no
# entry): streaming a few-row GEMM's weight is latency-bound, and which tile / K-split shape wins depends on
# N, K and the device, so the operator profile measures them on the target instead of a guess here.
SKINNY_TILINGS = {
    "triton": {},
    "triton_n32": {"block_n": 32, "num_stages": 4},
    "triton_n32_k256": {"block_n": 32, "block_k": 256},
    "triton_n16_k256": {"block_n": 16, "block_k": 256},
    "triton_n128_w8": {"block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    # one program per N block over all of K: no fp32 partials and, for the plain GEMM, no reduce kernel
    "triton_n16_s1": {"block_n": 16, "splits": 1, "num_stages": 4},
    "triton_n32_s1": {"block_n": 32, "splits": 1, "num_stages": 4},
    # with programmatic dependent launch (sm_90+): the weight slice is prefetched into L2 while the kernel
    # that produces x still runs (kernels/common.py); the same as the variant without "_pf" elsewhere
    "triton_n32_pf": {"block_n": 32, "num_stages": 4, "prefetch": True},
    "triton_n32_k256_pf": {"block_n": 32, "block_k": 256, "prefetch": True},
    "triton_n16_s1_pf": {"block_n": 16, "splits": 1, "num_stages": 4, "prefetch": True},
    "triton_n32_s1_pf": {"block_n": 32, "splits": 1, "num_stages": 4, "prefetch": True},
    # five stages in flight: the best of `bench_kernels.py --gemm-sweep` (H200, cold weights, 2026-12-02) at the
    # DiT's GELU up / o-proj and the expert's gate_up (one split) and the down projections (K split, 64-wide)
    "triton_n64_s1_st5": {"block_n": 64, "splits": 1, "num_stages": 5},
    "triton_n16_s1_st5": {"block_n": 16, "splits": 1, "num_stages": 5},
    "triton_n64_k64_st5": {"block_n": 64, "block_k": 64, "num_stages": 5},
    "triton_n32_k64_st5": {"block_n": 32, "block_k": 64, "num_stages": 5},
}


def depth_tiling(n: int, k: int, sms: int) -> str:
    """The skinny tiling an unprofiled device starts from, by the GEMM's shape (the name of a SKINNY_TILINGS
    entry). From the H200 profile's timings of the pi expert's GEMMs (profiles/h200.json; test_dispatch checks
    the rule against them): one program per 32-wide N block over all of K when those blocks alone give half the
    multiprocessors one each (no fp32 partials to reduce); else split K, in 256-wide blocks up to K = 2048 and
    in the default 128-wide ones beyond."""
    if -(-n // 32) * 2 >= sms:
        return "triton_n32_s1"
    return "triton_n32_k256" if k <= 2048 else "triton_n32"


def _depth_tiling(fn, *args, **kw):
    from phyai_ros.kernels.common import num_sms
    x, weight = (args[1], args[2]) if fn is _triton_skinny_add_layer_norm else (args[0], args[1])
    name = depth_tiling(weight.shape[0], weight.shape[1], num_sms(x.device))
    return fn(*args, **kw, **SKINNY_TILINGS[name])


def _depth_candidate(fn, supports, prefix: str = "triton", profiled_only: bool = False) -> Candidate:
    """A skinny GEMM launched with ``depth_tiling``'s shape, where no profile has an entry. The pi family's are
    the default (on the H200 the kernels' own default launch shape ran those GEMMs 10-90% slower than the
    profile's choice). GR00T's bias-epilogue ones are profiled-only: as the default (2026-12-01, same call) its
    4-step loop ran 7.24 ms against 6.91 ms on the library GEMM (docs/benchmarks.md), so a device profile must
    show them faster."""
    return Candidate(prefix + "_depth", functools.partial(_depth_tiling, fn), _CUDA, available=triton_ok,
                     supports=supports, profiled_only=profiled_only)


def _skinny_with_bias(x, weight, bias=None):
    """The bias-epilogue GEMMs only (GR00T), so that the default of pi0's bias-free GEMMs stays as it was."""
    return bias is not None and _skinny_shape(x, weight, bias)


def _skinny_without_bias(x, weight, bias=None):
    """The pi family's expert GEMMs (no bias): the skinny tilings are their default."""
    return bias is None and _skinny_shape(x, weight)


def _skinny_candidates(fn, supports, prefix: str = "triton", profiled_only: bool = False) -> list:
    """One candidate per launch shape, named ``prefix`` + the tiling's suffix ("triton_n32" -> "skinny_n32"
    where an op already has a "triton" candidate)."""
    return [Candidate(prefix + name[len("triton"):], functools.partial(fn, **tiling), _CUDA, available=triton_ok,
                      supports=supports, profiled_only=profiled_only) for name, tiling in SKINNY_TILINGS.items()]


def _skinny_residual(x, weight, residual, *rest):
    """Few rows, and a residual of the GEMM output's rows and dtype (the fused epilogue's one layout)."""
    return (_skinny_shape(x, weight) and residual.dtype == x.dtype
            and residual.shape == (*x.shape[:-1], weight.shape[0]))


def _skinny_per_item(x, weight, h, gate, scale, shift, eps):
    """As _skinny_residual, with modulation per batch item ([B|1, 1, W]), not per token (training-time RTC)."""
    return _skinny_residual(x, weight, h) and all(t.dim() == 3 and t.shape[1] == 1 for t in (gate, scale, shift))


def _triton_geglu(gate_up):
    from phyai_ros.kernels.geglu import geglu
    return geglu(gate_up)


def _triton_swiglu(gate_up):
    from phyai_ros.kernels.geglu import swiglu
    return swiglu(gate_up)


def _triton_attention_with_prefix(q, k_prefix, v_prefix, k_suffix, v_suffix, mask, **tiling):
    from phyai_ros.kernels.split_kv_attention import split_kv_attention
    b, hq, lq, d = q.shape
    # Written token-major, so the output projection reads it without a transpose copy.
    out = torch.empty(b, lq, hq, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    return split_kv_attention(q, k_prefix, v_prefix, k_suffix, v_suffix, mask, out=out, **tiling)


# Key-split variants of the expert attention for the profile (default: ~2 programs per SM, >= 64-key chunks).
# Every split writes an fp32 partial of all query rows ([rows, D], 400 KB for pi0.5's 8 x 50 rows) that the merge
# reads back, so fewer splits with smaller query tiles (more tiles, the same parallelism) may stream less.
ATTENTION_TILINGS = {"triton": {}, "triton_s8": {"num_splits": 8}, "triton_m32": {"block_m": 32},
                     "triton_s4": {"num_splits": 4}, "triton_m32_s4": {"block_m": 32, "num_splits": 4},
                     "triton_m16_s4": {"block_m": 16, "num_splits": 4},
                     "triton_m16_s8": {"block_m": 16, "num_splits": 8},
                     # eight warps: half the registers per thread for the [64, 256] fp32 accumulator (batch 8-32)
                     "triton_w8": {"num_warps": 8}}


def _qkv_heads(qkv, k_prefix):
    """(hq, hkv, d) of a fused QKV projection output whose K/V heads match the prefix cache."""
    hkv, d = k_prefix.shape[1], k_prefix.shape[-1]
    return qkv.shape[-1] // d - 2 * hkv, hkv, d


def _triton_rope_attention(qkv, cos, sin, k_prefix, v_prefix, mask, **tiling):
    from phyai_ros.kernels.split_kv_attention import rope_split_kv_attention
    hq, _, d = _qkv_heads(qkv, k_prefix)
    b, t = qkv.shape[:2]
    out = torch.empty(b, t, hq, d, dtype=qkv.dtype, device=qkv.device).transpose(1, 2)  # token-major
    return rope_split_kv_attention(qkv, cos, sin, k_prefix, v_prefix, mask, out=out, **tiling)


def _rope_attention_fits(qkv, cos, sin, k_prefix, v_prefix, mask):
    """RoPE is applied in the kernel to halves of D: D a power of two >= 32, cos / sin per suffix token."""
    d = k_prefix.shape[-1]
    return d >= 32 and d & (d - 1) == 0 and cos.shape == (qkv.shape[0], qkv.shape[1], d)


def _unfused_rope_attention(qkv, cos, sin, k_prefix, v_prefix, mask):
    q, k, v = qkv_rope(qkv, cos, sin, *_qkv_heads(qkv, k_prefix))
    return attention_with_prefix(q, k_prefix, v_prefix, k, v, mask)


def _triton_attention(q, k, v, mask, **tiling):
    from phyai_ros.kernels.split_kv_attention import split_kv_attention
    b, hq, lq, d = q.shape
    # Written token-major: every caller feeds [B, T, H*d] to its output projection, a view of this (a copy
    # kernel per call otherwise: 2.3 us x 64 in GR00T's loop on the H200).
    out = torch.empty(b, lq, hq, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    return split_kv_attention(q, k, v, None, None, mask, out=out, **tiling)


# Long-query attention (the prefix pass: ~800-1000 queries x 8 heads against as many keys): the default splits
# the keys (~2 programs per SM) and merges the splits in a second kernel; with one split the row tiles alone
# fill the GPU and each program writes its rows' output directly (no fp32 workspace round trip).
# Short-query attention (GR00T's DiT: 41 queries per head against 41-170 keys, head_dim 48) runs one 64-row tile per
# head with the default tiles; 16- or 32-row tiles with every key in one block give more, shorter programs.
PREFIX_ATTENTION_TILINGS = {"triton": {}, "triton_s1": {"num_splits": 1},
                            "triton_s1_m128": {"num_splits": 1, "block_m": 128, "block_n": 64, "num_warps": 8},
                            "triton_s1_m16_n128": {"num_splits": 1, "block_m": 16, "block_n": 128},
                            "triton_s1_m32_n128": {"num_splits": 1, "block_m": 32, "block_n": 128},
                            # head_dim 256 (the pi prefix): a [64, 256] fp32 accumulator on eight warps, not four
                            "triton_w8": {"num_warps": 8}, "triton_s1_w8": {"num_splits": 1, "num_warps": 8},
                            "triton_s1_n64_w8": {"num_splits": 1, "block_n": 64, "num_warps": 8},
                            # the pi prefix fills only ~60 of 132 SMs with 128-row tiles and one split (61 tiles for
                            # pi0.5's 8 x 968 rows): two key splits double the programs for one merge; three stages
                            # of 32-key tiles keep more loads in flight than two of 64
                            "triton_s2_m128_w8": {"num_splits": 2, "block_m": 128, "block_n": 64, "num_warps": 8},
                            "triton_s2_n64_w8": {"num_splits": 2, "block_n": 64, "num_warps": 8},
                            "triton_s1_n32_w8_st3": {"num_splits": 1, "block_n": 32, "num_warps": 8, "num_stages": 3}}


def _linear_add_then_norm_gelu(h, x, weight, bias, up_weight, up_bias, up_colsum, eps):
    """The reference: linear_add_layer_norm with a unit affine, then linear_gelu_tanh, each its own selector op."""
    one, zero = ops.unit_affine(h.shape[-1], h)
    h_new, normed = linear_add_layer_norm(h, x, weight, bias, one, zero, eps)
    return h_new, linear_gelu_tanh(normed, up_weight, up_bias)


def _post_norm_fits(h, x, weight, bias, up_weight, up_bias, up_colsum, eps, *, block_n: int) -> bool:
    """Few rows (one item of the DiT), the output width a multiple of the producer's blocks, one dtype."""
    rows = x.numel() // x.shape[-1]
    return (rows <= SKINNY_ROWS and weight.shape[0] % block_n == 0 and h.dtype == x.dtype == weight.dtype
            == up_weight.dtype and h.is_contiguous() and x.stride(-1) == 1)


def _triton_post_norm(h, x, weight, bias, up_weight, up_bias, up_colsum, eps, *, block_n: int, up_block_n: int):
    from phyai_ros.kernels.post_norm import norm_linear_gelu, residual_with_stats
    h_new, stats = residual_with_stats(h, x, weight, bias, block_n=block_n)
    return h_new, norm_linear_gelu(h_new, stats, up_weight, up_bias, up_colsum, eps, block_n=up_block_n)


def _unfused_projected_attention(y, weight, bias, n_heads, k_cache=None, v_cache=None, mask=None):
    """The reference: the projection (linear) and the attention as their own selector ops, [B, T, H * d]."""
    from phyai_ros.kernels.rope import split_heads
    b, t, _ = y.shape
    p = linear(y, weight, bias)
    if k_cache is None:
        q, k_cache, v_cache = split_heads(p, n_heads, n_heads, p.shape[-1] // (3 * n_heads))
    else:
        q = p.view(b, t, n_heads, -1).transpose(1, 2)
    a = attention(q, k_cache, v_cache, mask)
    return a.transpose(1, 2).reshape(b, t, -1)


def _projected_attention_fits(y, weight, bias, n_heads, k_cache=None, v_cache=None, mask=None) -> bool:
    from phyai_ros.kernels.projected_attention import fits
    return fits(y, weight, n_heads, k_cache, mask)


def _triton_projected_attention(y, weight, bias, n_heads, k_cache=None, v_cache=None, mask=None, **tiling):
    from phyai_ros.kernels.projected_attention import projected_attention as fused
    return fused(y, weight, bias, n_heads, k_cache, v_cache, mask, **tiling)


def _linear_then_norm_geglu(x, weight, h, gate, scale, shift, gate_up_w, eps):
    """The reference: the output GEMM with its (gated) residual and (ada)RMSNorm as one selector op, then the
    GeGLU gate_up as another (what the expert ran before this op existed)."""
    if gate is None and shift is None:
        normed, h_new = linear_add_rms_norm(x, weight, h, scale, eps)
    else:
        h_new, normed = linear_gated_ada_rms_norm(x, weight, h, gate, scale, shift, eps)
    return h_new, linear_geglu(normed, gate_up_w)


def _post_rms_fits(x, weight, h, gate, scale, shift, gate_up_w, eps, *, block_n: int) -> bool:
    """One item (its rows, plus shift's row, within a 64-row tile), modulation one vector each (not per token),
    adaRMS (gate and shift) or the plain norm (neither), plain weights of h's dtype."""
    n = weight.shape[0]
    rows = x.numel() // x.shape[-1] + (shift is not None)
    mods = [t for t in (gate, scale, shift) if t is not None]
    return ((gate is None) == (shift is None) and rows <= SKINNY_ROWS and n % block_n == 0 and h.is_contiguous()
            and h.dtype == x.dtype == weight.dtype == gate_up_w.dtype and x.stride(-1) == 1
            and all(t.numel() == n and t.is_contiguous() for t in mods))


def _triton_post_rms(x, weight, h, gate, scale, shift, gate_up_w, eps, *, block_n: int, up_block_n: int):
    from phyai_ros.kernels.post_norm import gated_residual_rms, rms_linear_geglu
    h_new, xs, stats = gated_residual_rms(h, x, weight, gate, scale, shift, block_n=block_n)
    m = rms_linear_geglu(xs, stats, gate_up_w, eps, block_n=up_block_n)
    return h_new, m.view(*x.shape[:-1], m.shape[-1])


# Where no profile has an entry (Jetson Thor ships none), short attention (<= 256 keys, head_dim <= 128: GR00T's
# DiT and backbone) takes the split-KV kernel with every key of a row in one program and the smallest row tile
# that keeps the programs within ~1.5 per multiprocessor, SDPA otherwise. On the H200 that rule's pick beat SDPA
# by 1.1-4.3x at every such profiled shape and was within 15% of the best tiling (profiles/h200.json, 2026-12-02;
# test_dispatch checks it against those timings); at the pi prefix's 968 keys of 256 SDPA stays first.
SHORT_ATTENTION_KEYS = 256


def short_attention_tiling(programs_per_row_tile: int, rows: int, sms: int) -> str:
    """The PREFIX_ATTENTION_TILINGS entry for a short attention of ``rows`` query rows per KV head (GQA-packed)
    and ``programs_per_row_tile`` = batch x KV heads: 16-, then 32-row tiles while they give at most ~1.5
    programs per multiprocessor, else the 64-row default."""
    for name, block_m in (("triton_s1_m16_n128", 16), ("triton_s1_m32_n128", 32)):
        if programs_per_row_tile * -(-rows // block_m) <= 1.5 * sms:
            return name
    return "triton_s1"


def _short_attention(q, k, v, mask=None) -> bool:
    return k.shape[2] <= SHORT_ATTENTION_KEYS and q.shape[-1] <= 128


def _triton_short_attention(q, k, v, mask=None):
    from phyai_ros.kernels.common import num_sms
    b, hq, lq, _ = q.shape
    hkv = k.shape[1]
    name = short_attention_tiling(b * hkv, hq // hkv * lq, num_sms(q.device))
    return _triton_attention(q, k, v, mask, **PREFIX_ATTENTION_TILINGS[name])


_REGISTRY = {
    # Few-row GEMMs (the action expert's tokens): a weight-streaming kernel; the library GEMM otherwise.
    "linear": [_depth_candidate(_triton_linear, _skinny_with_bias, profiled_only=True),
               _depth_candidate(_triton_linear, _skinny_without_bias),
               *_skinny_candidates(_triton_linear, _skinny_without_bias),
               *_skinny_candidates(_triton_linear, _skinny_with_bias, profiled_only=True),
               Candidate("torch", ops.linear)],
    "layer_norm": [Candidate("triton", _triton_layer_norm, _CUDA, available=triton_ok),
                   Candidate("torch", ops.layer_norm)],
    # Few rows (GR00T's DiT): the GEMM streams its weights and a row kernel adds bias + residual and normalises;
    # many rows (SigLIP): the library GEMM, then the fused add + LayerNorm kernel.
    "linear_add_layer_norm": [_depth_candidate(_triton_skinny_add_layer_norm, _skinny_add_layer_norm, "skinny",
                                                               profiled_only=True),
                              *_skinny_candidates(_triton_skinny_add_layer_norm, _skinny_add_layer_norm, "skinny",
                                                  profiled_only=True),
                              Candidate("triton", _triton_linear_add_layer_norm, _CUDA, available=triton_ok),
                              Candidate("torch", _torch_linear_add_layer_norm)],
    "linear_gelu_tanh": [_depth_candidate(_triton_linear_gelu_tanh, _skinny_shape, profiled_only=True),
                         *_skinny_candidates(_triton_linear_gelu_tanh, _skinny_shape, profiled_only=True),
                         Candidate("cublaslt", _cublaslt_linear_gelu_tanh, _CUDA, supports=_cublaslt_gelu_fits,
                                   profiled_only=True),
                         Candidate("torch", _torch_linear_gelu_tanh)],
    "rms_norm": [Candidate("triton", _triton_rms, _CUDA, available=triton_ok), Candidate("torch", ops.rms_norm)],
    "add_rms_norm": [Candidate("triton", _triton_add_rms, _CUDA, available=triton_ok),
                     Candidate("torch", _torch_add_rms_norm)],
    "ada_rms_norm": [Candidate("triton", _triton_ada, _CUDA, available=triton_ok),
                     Candidate("torch", ops.ada_rms_norm)],
    "gated_ada_rms_norm": [Candidate("triton", _triton_gated_ada, _CUDA, available=triton_ok),
                           Candidate("torch", _torch_gated_ada)],
    "qkv_rope": [Candidate("triton", _triton_qkv_rope, _CUDA, available=triton_ok),
                 Candidate("torch", _torch_qkv_rope)],
    "qkv_norm_rope": [Candidate("triton", _triton_qkv_rope, _CUDA, available=triton_ok),
                      Candidate("torch", _torch_qkv_norm_rope)],
    "geglu": [Candidate("triton", _triton_geglu, _CUDA, available=triton_ok), Candidate("torch", _torch_geglu)],
    "swiglu": [Candidate("triton", _triton_swiglu, _CUDA, available=triton_ok), Candidate("torch", _torch_swiglu)],
    # A skinny GEMM with the elementwise op after it as its epilogue; elsewhere the sub-ops one by one.
    "linear_geglu": [_depth_candidate(_triton_linear_geglu, _skinny_shape),
                     *_skinny_candidates(_triton_linear_geglu, _skinny_shape),
                     Candidate("unfused", _unfused_linear_geglu)],
    "linear_add_rms_norm": [_depth_candidate(_triton_linear_add_rms, _skinny_residual),
                            *_skinny_candidates(_triton_linear_add_rms, _skinny_residual),
                            Candidate("unfused", _unfused_linear_add_rms)],
    "linear_gated_ada_rms_norm": [_depth_candidate(_triton_linear_gated_ada, _skinny_per_item),
                                  *_skinny_candidates(_triton_linear_gated_ada, _skinny_per_item),
                                  Candidate("unfused", _unfused_linear_gated_ada)],
    # The norm after the next GEMM's dot (kernels/post_norm.py): two kernels where three ran; profiled-only
    # until a device profile times it (written 2026-12-02 after that day's device time, not yet measured).
    "linear_add_norm_gelu": [*(Candidate(name, functools.partial(_triton_post_norm, block_n=bn, up_block_n=ubn),
                                         _CUDA, available=triton_ok, profiled_only=True,
                                         supports=functools.partial(_post_norm_fits, block_n=bn))
                               for name, bn, ubn in (("post_norm", 16, 64), ("post_norm_n32", 32, 32))),
                             Candidate("unfused", _linear_add_then_norm_gelu)],
    # The same for the pi expert's (ada)RMSNorm between its output GEMM and its GeGLU gate_up (one item).
    "linear_gated_norm_geglu": [*(Candidate(name, functools.partial(_triton_post_rms, block_n=16, up_block_n=ubn),
                                            _CUDA, available=triton_ok, profiled_only=True,
                                            supports=functools.partial(_post_rms_fits, block_n=16))
                                  for name, ubn in (("post_norm", 32), ("post_norm_n16", 16))),
                                Candidate("unfused", _linear_then_norm_geglu)],
    # A few-row attention block's input projection and its attention as one kernel (kernels/projected_attention.py,
    # GR00T's DiT): profiled-only until a device profile times it (written 2026-12-02, not yet measured).
    "projected_attention": [*(Candidate(name, functools.partial(_triton_projected_attention, **tiling), _CUDA,
                                        available=triton_ok, profiled_only=True, supports=_projected_attention_fits)
                              for name, tiling in (("fused", {}), ("fused_w8", {"num_warps": 8}),
                                                   ("fused_s2", {"splits": 2}), ("fused_s8", {"splits": 8}))),
                            Candidate("unfused", _unfused_projected_attention)],
    "attention_with_prefix": [*(Candidate(name, functools.partial(_triton_attention_with_prefix, **tiling), _CUDA,
                                          available=triton_ok) for name, tiling in ATTENTION_TILINGS.items()),
                              Candidate("torch", _torch_attention_with_prefix)],
    # The expert's attention from its QKV projection, RoPE applied as q and k are loaded; else qkv_rope first
    # (the default: on the H200 the rotation inside the key loop costs more than the separate rope kernel).
    "rope_attention_with_prefix": [
        *(Candidate(name, functools.partial(_triton_rope_attention, **tiling), _CUDA, available=triton_ok,
                    supports=_rope_attention_fits, profiled_only=True) for name, tiling in ATTENTION_TILINGS.items()),
        Candidate("unfused", _unfused_rope_attention)],
    # Short attention (GR00T's DiT and backbone) by short_attention_tiling's rule where no profile speaks; long
    # attention (the pi prefix) SDPA first; every split-KV tiling a profiled option.
    "attention": [Candidate("triton_short", _triton_short_attention, _CUDA, available=triton_ok,
                            supports=_short_attention),
                  Candidate("sdpa", sdpa, _CUDA),
                  *(Candidate(name, functools.partial(_triton_attention, **tiling), _CUDA, available=triton_ok)
                    for name, tiling in PREFIX_ATTENTION_TILINGS.items()),
                  Candidate("torch", ops.attention)],
}
for _op, _cands in _REGISTRY.items():
    for _c in _cands:
        SELECTOR.register(_op, _c)
# Optional backends (flashinfer): profiled-only candidates inserted before each op's reference, so that only a
# device profile that measured them faster picks them; where the package is missing nothing changes.
for _op, _c in flashinfer_backend.candidates():
    SELECTOR.candidates[_op].insert(len(SELECTOR.candidates[_op]) - 1, _c)


# ----------------------------------------------------------------------------- what the models call
def linear(x: Tensor, weight: Weight, bias: Optional[Tensor] = None) -> Tensor:
    if isinstance(weight, QuantizedWeight):
        return _selector().call("qlinear", qshape_key(x, weight), x.device, x, weight, bias)
    return _selector().call("linear", shape_key(x, weight), x.device, x, weight, bias)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    return _selector().call("layer_norm", shape_key(x), x.device, x, weight, bias, eps)


def linear_add_layer_norm(h: Tensor, x: Tensor, weight: Tensor, bias: Tensor, ln_weight: Tensor, ln_bias: Tensor,
                          eps: float) -> Tuple[Tensor, Tensor]:
    """(h + linear(x, weight, bias), layer_norm of that): a sublayer's output GEMM, residual add and the next LN.

    Why the GEMM is inside the op: the torch candidate keeps the eager sequence (bias added in the GEMM, then
    the add, then LN), bitwise what SigLIP computed before, while the fused one runs the GEMM without bias and
    adds it in the LN kernel with the residual (one rounding, one kernel instead of four).
    """
    if isinstance(weight, QuantizedWeight):
        return _selector().call("qlinear_add_layer_norm", qshape_key(x, weight), x.device, h, x, weight, bias,
                                ln_weight, ln_bias, eps)
    return _selector().call("linear_add_layer_norm", shape_key(x, weight), x.device, h, x, weight, bias, ln_weight,
                         ln_bias, eps)


def linear_add_norm_gelu(h: Tensor, x: Tensor, weight: Weight, bias: Optional[Tensor], up_weight: Weight,
                         up_bias: Optional[Tensor], up_colsum: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor]:
    """(h_new, gelu_tanh(LayerNorm(h_new) @ up_weight^T + up_bias)) for h_new = h + linear(x, weight, bias), the
    LayerNorm without affine: a transformer block's attention output, residual add, and its MLP's norm and GELU
    up-projection (GR00T's DiT). ``up_colsum`` (kernels.post_norm.column_sums of up_weight, made at load) lets the
    fused candidate normalise after the up-projection's dot; without it, or with quantized weights, the two ops."""
    if up_colsum is None or isinstance(weight, QuantizedWeight) or isinstance(up_weight, QuantizedWeight):
        return _linear_add_then_norm_gelu(h, x, weight, bias, up_weight, up_bias, up_colsum, eps)
    return _selector().call("linear_add_norm_gelu", shape_key(x, weight, up_weight), x.device, h, x, weight, bias,
                            up_weight, up_bias, up_colsum, eps)


def projected_attention(y: Tensor, weight: Weight, bias: Optional[Tensor], n_heads: int,
                        k_cache: Optional[Tensor] = None, v_cache: Optional[Tensor] = None,
                        mask: Optional[Tensor] = None) -> Tensor:
    """An attention block from its normed input: heads of linear(y, weight, bias), then attention -> [B, T, H * d].
    Self-attention (no cache): weight is the fused q / k / v projection; cross-attention: weight projects q and
    k_cache / v_cache [B, H, L, d] hold the keys and values (mask additive, per key). Where a profile picks the fused
    candidate, one kernel (kernels/projected_attention.py); quantized weights run the two ops."""
    if isinstance(weight, QuantizedWeight):
        return _unfused_projected_attention(y, weight, bias, n_heads, k_cache, v_cache, mask)
    key = shape_key(y, weight) if k_cache is None else shape_key(y, weight, k_cache)
    return _selector().call("projected_attention", key, y.device, y, weight, bias, n_heads, k_cache, v_cache, mask)


def linear_gated_norm_geglu(x: Tensor, weight: Weight, h: Tensor, gate: Optional[Tensor], scale: Tensor,
                            shift: Optional[Tensor], gate_up_w: Weight, eps: float) -> Tuple[Tensor, Tensor]:
    """(h_new, geglu(norm(h_new) @ gate_up_w^T)) for the pi expert's attention output: h_new = h + linear(x,
    weight) * gate, norm the adaRMSNorm with (scale, shift) (pi0.5), or h + linear(x, weight) and Gemma's RMSNorm
    with weight ``scale`` (pi0: gate and shift None). Where a profile picks the fused candidate, the norm is
    applied after gate_up's dot (kernels/post_norm.py); quantized weights run the two ops."""
    if isinstance(weight, QuantizedWeight) or isinstance(gate_up_w, QuantizedWeight):
        return _linear_then_norm_geglu(x, weight, h, gate, scale, shift, gate_up_w, eps)
    return _selector().call("linear_gated_norm_geglu", shape_key(x, weight, gate_up_w, scale), x.device, x, weight,
                            h, gate, scale, shift, gate_up_w, eps)


def up_column_sums(up_weight: Weight) -> Optional[Tensor]:
    """What linear_add_norm_gelu's fused candidate needs of the up-projection's weight, made once at load: its
    fp32 column sums (None for a quantized weight, which runs the two ops)."""
    if isinstance(up_weight, QuantizedWeight):
        return None
    from phyai_ros.kernels.post_norm import column_sums
    return column_sums(up_weight)


def rms_norm(x: Tensor, weight: Tensor, eps: float, weight_offset: float = 1.0) -> Tensor:
    """Gemma RMSNorm (times 1 + weight); weight_offset=0: Qwen's (times weight)."""
    return _selector().call("rms_norm", shape_key(x), x.device, x, weight, eps, weight_offset)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, weight_offset: float = 1.0
                 ) -> Tuple[Tensor, Tensor]:
    """(rms_norm(x + residual), x + residual); weight_offset as rms_norm's (0: Qwen's plain weight)."""
    return _selector().call("add_rms_norm", shape_key(x), x.device, x, residual, weight, eps, weight_offset)


def ada_rms_norm(x: Tensor, scale: Tensor, shift: Tensor, eps: float) -> Tensor:
    return _selector().call("ada_rms_norm", shape_key(x), x.device, x, scale, shift, eps)


def gated_ada_rms_norm(h: Tensor, y: Tensor, gate: Tensor, scale: Tensor, shift: Tensor, eps: float
                       ) -> Tuple[Tensor, Tensor]:
    """(h + y * gate, ada_rms_norm(h + y * gate, scale, shift))."""
    return _selector().call("gated_ada_rms_norm", shape_key(h), h.device, h, y, gate, scale, shift, eps)


def qkv_rope(qkv: Tensor, cos: Tensor, sin: Tensor, hq: int, hkv: int, d: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Fused QKV output [B, T, (hq + 2 hkv) d] -> rotated q [B, hq, T, d], rotated k and v [B, hkv, T, d]."""
    return _selector().call("qkv_rope", shape_key(qkv), qkv.device, qkv, cos, sin, hq, hkv, d)


def qkv_norm_rope(qkv: Tensor, cos: Tensor, sin: Tensor, hq: int, hkv: int, d: int, q_norm: Optional[Tensor] = None,
                  k_norm: Optional[Tensor] = None, eps: float = 1e-6) -> Tuple[Tensor, Tensor, Tensor]:
    """Qwen3-VL's attention input: fused QKV output [B, T, (hq + 2 hkv) d] -> q [B, hq, T, d], k and v
    [B, hkv, T, d]; q and k RMS-normalised per head (plain weights [d], the LLM; None: the vision tower), then
    rotated with cos / sin [B, T, d] (float32 allowed) in float32."""
    return _selector().call("qkv_norm_rope", shape_key(qkv), qkv.device, qkv, cos, sin, hq, hkv, d, q_norm,
                            k_norm, eps)


def linear_gelu_tanh(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """gelu_tanh(linear(x, weight, bias)): the DiT's / VL adapter's MLP up-projection, GELU as the epilogue."""
    if isinstance(weight, QuantizedWeight):
        return _selector().call("qlinear_gelu_tanh", qshape_key(x, weight), x.device, x, weight, bias)
    return _selector().call("linear_gelu_tanh", shape_key(x, weight), x.device, x, weight, bias)


def geglu(gate_up: Tensor) -> Tensor:
    """gelu_tanh(gate) * up for gate_up = [gate | up] along the last dim."""
    return _selector().call("geglu", shape_key(gate_up), gate_up.device, gate_up)


def swiglu(gate_up: Tensor) -> Tensor:
    """silu(gate) * up of a fused [gate | up] projection output (Qwen3's MLP), one kernel where Triton runs."""
    return _selector().call("swiglu", shape_key(gate_up), gate_up.device, gate_up)


def linear_geglu(x: Tensor, gate_up_w: Weight) -> Tensor:
    """geglu(linear(x, gate_up_w)) for the fused [gate; up] weight [2I, K] -> [..., I]."""
    if isinstance(gate_up_w, QuantizedWeight):
        return _selector().call("qlinear_geglu", qshape_key(x, gate_up_w), x.device, x, gate_up_w)
    return _selector().call("linear_geglu", shape_key(x, gate_up_w), x.device, x, gate_up_w)


def linear_add_rms_norm(x: Tensor, weight: Tensor, residual: Tensor, norm_w: Tensor, eps: float
                        ) -> Tuple[Tensor, Tensor]:
    """add_rms_norm(linear(x, weight), residual, norm_w, eps): (rms_norm(r), r) for r = residual + x @ W^T."""
    if isinstance(weight, QuantizedWeight):
        return _selector().call("qlinear_add_rms_norm", qshape_key(x, weight), x.device, x, weight, residual, norm_w,
                                eps)
    return _selector().call("linear_add_rms_norm", shape_key(x, weight), x.device, x, weight, residual, norm_w, eps)


def linear_gated_ada_rms_norm(x: Tensor, weight: Tensor, h: Tensor, gate: Tensor, scale: Tensor, shift: Tensor,
                              eps: float) -> Tuple[Tensor, Tensor]:
    """gated_ada_rms_norm(h, linear(x, weight), gate, scale, shift, eps): (r, ada_rms_norm(r)) for
    r = h + (x @ W^T) * gate."""
    if isinstance(weight, QuantizedWeight):
        return _selector().call("qlinear_gated_ada_rms_norm", qshape_key(x, weight, gate), x.device, x, weight, h,
                                gate, scale, shift, eps)
    return _selector().call("linear_gated_ada_rms_norm", shape_key(x, weight, gate), x.device, x, weight, h, gate,
                         scale, shift, eps)


def attention_with_prefix(q: Tensor, k_prefix: Tensor, v_prefix: Tensor, k_suffix: Tensor, v_suffix: Tensor,
                          mask: Optional[Tensor]) -> Tensor:
    """Attention over [prefix cache; suffix] keys without concatenating them where a kernel can."""
    return _selector().call("attention_with_prefix", shape_key(q, k_prefix), q.device, q, k_prefix, v_prefix,
                         k_suffix, v_suffix, mask)


def rope_attention_with_prefix(qkv: Tensor, cos: Tensor, sin: Tensor, k_prefix: Tensor, v_prefix: Tensor,
                               mask: Optional[Tensor]) -> Tensor:
    """The action expert's attention from its fused QKV projection output [B, T, (hq + 2 hkv) d]: RoPE of q
    and of the suffix keys (cos / sin [B, T, d]), then attention over [prefix cache; suffix] -> [B, hq, T, d]."""
    return _selector().call("rope_attention_with_prefix", shape_key(qkv, k_prefix), qkv.device, qkv, cos, sin,
                         k_prefix, v_prefix, mask)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    return _selector().call("attention", shape_key(q, k), q.device, q, k, v, mask)


def expert_stack(h: Tensor, layers, kv, ctx, norms: "ExpertNorms", eps: float) -> Tensor:
    """The action expert's layers on its residual stream h [B, T, W] -> the final norm's output [B, T, W].
    layers: per layer qkv_w / o_w / gate_up_w / down_w (GemmaLayer); kv: per layer the prefix cache (k, v);
    ctx: the suffix's mask and RoPE tables (modeling.suffix.SuffixContext); norms: layers.expert_stack's
    ExpertNorms (adaRMS modulation or plain weights, 2 * depth + 1 of them)."""
    kind = ("ada" if norms.adaptive else "rms") + ("_tok" if norms.per_token else "")
    key = f"{shape_key(h, kv[0][0])}|{kind}{len(layers)}"
    return _selector().call("expert_stack", key, h.device, h, layers, kv, ctx, norms, eps)
