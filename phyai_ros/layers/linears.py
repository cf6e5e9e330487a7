"""The linear layers as selector ops: the GEMM alone, and the GEMM with the elementwise op after it fused in as its
epilogue (bias + GELU-tanh, GeGLU, residual + RMSNorm, gated residual + adaRMSNorm, residual + LayerNorm).

Few rows (the action expert's 50-51 tokens, GR00T's DiT's 41) are latency-bound: kernels/skinny_linear.py streams
the weight and kernels/skinny_epilogue.py sums its K splits with the epilogue, one candidate per launch shape
(``SKINNY_TILINGS``) so that a device profile picks the tiling, and ``depth_tiling``'s rule where none does. Many
rows run the library GEMM. Where a fused kernel does not apply, a fused op runs "unfused": the GEMM and the op
after it through their own entry points, each selected as alone. A ``QuantizedWeight`` in place of a weight runs
the op's quantized twin ("q" + the op's name; layers/quant_dispatch.py registers its candidates).
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from phyai_ros.kernels import common as triton_common
from phyai_ros.kernels import layer_norm as layer_norm_kernels
from phyai_ros.kernels import skinny_epilogue as epilogue_kernels
from phyai_ros.kernels import skinny_linear as skinny_kernels
from phyai_ros.layers import ops
from phyai_ros.layers.activations import geglu
from phyai_ros.layers.norms import add_rms_norm, gated_ada_rms_norm, modulation_rows
from phyai_ros.layers.quantized import QuantizedWeight, qshape_key
from phyai_ros.layers.registry import CUDA, current_selector, register, triton_ok
from phyai_ros.layers.selector import Candidate, shape_key

Tensor = torch.Tensor
Weight = "Tensor | QuantizedWeight"   # every linear op takes either (a quantized one runs its "q" twin op)
SKINNY_ROWS = skinny_kernels.MAX_ROWS   # the few-row GEMMs' limit


# ----------------------------------------------------------------------------- torch references
def _torch_linear_add_layer_norm(h, x, weight, bias, ln_weight, ln_bias, eps):
    h = h + ops.linear(x, weight, bias)
    return h, ops.layer_norm(h, ln_weight, ln_bias, eps)


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


# ----------------------------------------------------------------------------- fused ops' fallbacks
# The sub-ops through their own entry points, so each is selected as where it is called alone.
def _unfused_linear_geglu(x, gate_up_w):
    return geglu(linear(x, gate_up_w))


def _unfused_linear_add_rms(x, weight, residual, norm_w, eps):
    return add_rms_norm(linear(x, weight), residual, norm_w, eps)


def _unfused_linear_gated_ada(x, weight, h, gate, scale, shift, eps):
    return gated_ada_rms_norm(h, linear(x, weight), gate, scale, shift, eps)


# ----------------------------------------------------------------------------- Triton adapters
def _triton_linear_add_layer_norm(h, x, weight, bias, ln_weight, ln_bias, eps):
    """The GEMM without its bias epilogue; the kernel adds the bias with the residual, rounding once."""
    return layer_norm_kernels.add_layer_norm(h, ops.linear(x, weight), bias, ln_weight, ln_bias, eps)


def _triton_linear(x, weight, bias=None, **tiling):
    return skinny_kernels.skinny_linear(x, weight, bias, **tiling)


def _triton_linear_gelu_tanh(x, weight, bias, **tiling):
    return skinny_kernels.skinny_linear(x, weight, bias, "gelu_tanh", **tiling)


def _triton_skinny_add_layer_norm(h, x, weight, bias, ln_weight, ln_bias, eps, **tiling):
    return epilogue_kernels.linear_add_layer_norm(h, x, weight, bias, ln_weight, ln_bias, eps, **tiling)


def _triton_linear_geglu(x, gate_up_w, **tiling):
    return epilogue_kernels.linear_geglu(x, gate_up_w, **tiling)


def _triton_linear_add_rms(x, weight, residual, norm_w, eps, **tiling):
    return epilogue_kernels.linear_add_rms_norm(x, weight, residual, norm_w, eps, **tiling)


def _triton_linear_gated_ada(x, weight, h, gate, scale, shift, eps, **tiling):
    w = h.shape[-1]
    g, sc, sh = modulation_rows(gate, w), modulation_rows(scale, w), modulation_rows(shift, w)
    return epilogue_kernels.linear_gated_ada_rms_norm(x, weight, h, g, sc, sh,
                                                      tokens_per_item=h.numel() // w // g.shape[0], eps=eps,
                                                      **tiling)


# ----------------------------------------------------------------------------- which calls the skinny kernels take
def _skinny_shape(x, weight, bias=None):
    """Few rows (the expert's / DiT's tokens), x's dtype; a bias, if any, one [N] vector (added in the
    epilogue)."""
    return (x.numel() // x.shape[-1] <= SKINNY_ROWS and x.dtype == weight.dtype
            and (bias is None or bias.shape == weight.shape[:1]))


def _skinny_add_layer_norm(h, x, weight, bias, *rest):
    """Few rows, a residual h of the GEMM output's rows and dtype."""
    return _skinny_shape(x, weight, bias) and h.dtype == x.dtype and h.shape == (*x.shape[:-1], weight.shape[0])


def _skinny_with_bias(x, weight, bias=None):
    """The bias-epilogue GEMMs only (GR00T), so that the default of pi0's bias-free GEMMs stays as it was."""
    return bias is not None and _skinny_shape(x, weight, bias)


def _skinny_without_bias(x, weight, bias=None):
    """The pi family's expert GEMMs (no bias): the skinny tilings are their default."""
    return bias is None and _skinny_shape(x, weight)


def _skinny_residual(x, weight, residual, *rest):
    """Few rows, and a residual of the GEMM output's rows and dtype (the fused epilogue's one layout)."""
    return (_skinny_shape(x, weight) and residual.dtype == x.dtype
            and residual.shape == (*x.shape[:-1], weight.shape[0]))


def _skinny_per_item(x, weight, h, gate, scale, shift, eps):
    """As _skinny_residual, with modulation per batch item ([B|1, 1, W]), not per token (training-time RTC)."""
    return _skinny_residual(x, weight, h) and all(t.dim() == 3 and t.shape[1] == 1 for t in (gate, scale, shift))


# ----------------------------------------------------------------------------- launch shapes
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
    x, weight = (args[1], args[2]) if fn is _triton_skinny_add_layer_norm else (args[0], args[1])
    name = depth_tiling(weight.shape[0], weight.shape[1], triton_common.num_sms(x.device))
    return fn(*args, **kw, **SKINNY_TILINGS[name])


def _depth_candidate(fn, supports, prefix: str = "triton", profiled_only: bool = False) -> Candidate:
    """A skinny GEMM launched with ``depth_tiling``'s shape, where no profile has an entry. The pi family's are
    the default (on the H200 the kernels' own default launch shape ran those GEMMs 10-90% slower than the
    profile's choice). GR00T's bias-epilogue ones are profiled-only: as the default (2026-12-01, same call) its
    4-step loop ran 7.24 ms against 6.91 ms on the library GEMM (docs/benchmarks.md), so a device profile must
    show them faster."""
    return Candidate(prefix + "_depth", functools.partial(_depth_tiling, fn), CUDA, available=triton_ok,
                     supports=supports, profiled_only=profiled_only)


def _skinny_candidates(fn, supports, prefix: str = "triton", profiled_only: bool = False) -> list:
    """One candidate per launch shape, named ``prefix`` + the tiling's suffix ("triton_n32" -> "skinny_n32"
    where an op already has a "triton" candidate)."""
    return [Candidate(prefix + name[len("triton"):], functools.partial(fn, **tiling), CUDA, available=triton_ok,
                      supports=supports, profiled_only=profiled_only) for name, tiling in SKINNY_TILINGS.items()]


# Few-row GEMMs (the action expert's tokens): a weight-streaming kernel; the library GEMM otherwise.
register("linear", [_depth_candidate(_triton_linear, _skinny_with_bias, profiled_only=True),
                    _depth_candidate(_triton_linear, _skinny_without_bias),
                    *_skinny_candidates(_triton_linear, _skinny_without_bias),
                    *_skinny_candidates(_triton_linear, _skinny_with_bias, profiled_only=True),
                    Candidate("torch", ops.linear)])
# Few rows (GR00T's DiT): the GEMM streams its weights and a row kernel adds bias + residual and normalises;
# many rows (SigLIP): the library GEMM, then the fused add + LayerNorm kernel.
register("linear_add_layer_norm", [
    _depth_candidate(_triton_skinny_add_layer_norm, _skinny_add_layer_norm, "skinny", profiled_only=True),
    *_skinny_candidates(_triton_skinny_add_layer_norm, _skinny_add_layer_norm, "skinny", profiled_only=True),
    Candidate("triton", _triton_linear_add_layer_norm, CUDA, available=triton_ok),
    Candidate("torch", _torch_linear_add_layer_norm)])
register("linear_gelu_tanh", [
    _depth_candidate(_triton_linear_gelu_tanh, _skinny_shape, profiled_only=True),
    *_skinny_candidates(_triton_linear_gelu_tanh, _skinny_shape, profiled_only=True),
    Candidate("cublaslt", _cublaslt_linear_gelu_tanh, CUDA, supports=_cublaslt_gelu_fits, profiled_only=True),
    Candidate("torch", _torch_linear_gelu_tanh)])
# A skinny GEMM with the elementwise op after it as its epilogue; elsewhere the sub-ops one by one.
register("linear_geglu", [_depth_candidate(_triton_linear_geglu, _skinny_shape),
                          *_skinny_candidates(_triton_linear_geglu, _skinny_shape),
                          Candidate("unfused", _unfused_linear_geglu)])
register("linear_add_rms_norm", [_depth_candidate(_triton_linear_add_rms, _skinny_residual),
                                 *_skinny_candidates(_triton_linear_add_rms, _skinny_residual),
                                 Candidate("unfused", _unfused_linear_add_rms)])
register("linear_gated_ada_rms_norm", [_depth_candidate(_triton_linear_gated_ada, _skinny_per_item),
                                       *_skinny_candidates(_triton_linear_gated_ada, _skinny_per_item),
                                       Candidate("unfused", _unfused_linear_gated_ada)])


# ----------------------------------------------------------------------------- what the models call
def linear(x: Tensor, weight: Weight, bias: Optional[Tensor] = None) -> Tensor:
    if isinstance(weight, QuantizedWeight):
        return current_selector().call("qlinear", qshape_key(x, weight), x.device, x, weight, bias)
    return current_selector().call("linear", shape_key(x, weight), x.device, x, weight, bias)


def linear_add_layer_norm(h: Tensor, x: Tensor, weight: Weight, bias: Tensor, ln_weight: Tensor, ln_bias: Tensor,
                          eps: float) -> Tuple[Tensor, Tensor]:
    """(h + linear(x, weight, bias), layer_norm of that): a sublayer's output GEMM, residual add and the next LN.

    Why the GEMM is inside the op: the torch candidate keeps the eager sequence (bias added in the GEMM, then
    the add, then LN), bitwise what SigLIP computed before, while the fused one runs the GEMM without bias and
    adds it in the LN kernel with the residual (one rounding, one kernel instead of four).
    """
    if isinstance(weight, QuantizedWeight):
        return current_selector().call("qlinear_add_layer_norm", qshape_key(x, weight), x.device, h, x, weight, bias,
                                       ln_weight, ln_bias, eps)
    return current_selector().call("linear_add_layer_norm", shape_key(x, weight), x.device, h, x, weight, bias,
                                   ln_weight, ln_bias, eps)


def linear_gelu_tanh(x: Tensor, weight: Weight, bias: Optional[Tensor] = None) -> Tensor:
    """gelu_tanh(linear(x, weight, bias)): the DiT's / VL adapter's MLP up-projection, GELU as the epilogue."""
    if isinstance(weight, QuantizedWeight):
        return current_selector().call("qlinear_gelu_tanh", qshape_key(x, weight), x.device, x, weight, bias)
    return current_selector().call("linear_gelu_tanh", shape_key(x, weight), x.device, x, weight, bias)


def linear_geglu(x: Tensor, gate_up_w: Weight) -> Tensor:
    """geglu(linear(x, gate_up_w)) for the fused [gate; up] weight [2I, K] -> [..., I]."""
    if isinstance(gate_up_w, QuantizedWeight):
        return current_selector().call("qlinear_geglu", qshape_key(x, gate_up_w), x.device, x, gate_up_w)
    return current_selector().call("linear_geglu", shape_key(x, gate_up_w), x.device, x, gate_up_w)


def linear_add_rms_norm(x: Tensor, weight: Weight, residual: Tensor, norm_w: Tensor, eps: float
                        ) -> Tuple[Tensor, Tensor]:
    """add_rms_norm(linear(x, weight), residual, norm_w, eps): (rms_norm(r), r) for r = residual + x @ W^T."""
    if isinstance(weight, QuantizedWeight):
        return current_selector().call("qlinear_add_rms_norm", qshape_key(x, weight), x.device, x, weight, residual,
                                       norm_w, eps)
    return current_selector().call("linear_add_rms_norm", shape_key(x, weight), x.device, x, weight, residual,
                                   norm_w, eps)


def linear_gated_ada_rms_norm(x: Tensor, weight: Weight, h: Tensor, gate: Tensor, scale: Tensor, shift: Tensor,
                              eps: float) -> Tuple[Tensor, Tensor]:
    """gated_ada_rms_norm(h, linear(x, weight), gate, scale, shift, eps): (r, ada_rms_norm(r)) for
    r = h + (x @ W^T) * gate."""
    if isinstance(weight, QuantizedWeight):
        return current_selector().call("qlinear_gated_ada_rms_norm", qshape_key(x, weight, gate), x.device, x, weight,
                                       h, gate, scale, shift, eps)
    return current_selector().call("linear_gated_ada_rms_norm", shape_key(x, weight, gate), x.device, x, weight, h,
                                   gate, scale, shift, eps)
