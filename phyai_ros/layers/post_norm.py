"""A sublayer's output GEMM, its residual and the next norm, and the MLP's up-projection after it, as one selector
op each, so that the norm can be applied after the up-projection's dot (design.md §8, "A norm after the next GEMM's
dot"): ``linear_add_norm_gelu`` (GR00T's DiT: LayerNorm without affine, GELU up) and ``linear_gated_norm_geglu``
(the pi expert: (ada)RMSNorm, GeGLU gate_up).

The fused form (kernels/candidates/post_norm.py) is profiled-only: on the H200 the two ops it replaces win
(kernels/candidates/README.md). The reference ("unfused", last) runs the two ops, each selected on its own, and is
what quantized weights always run.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from phyai_ros.kernels.candidates import post_norm as post_norm_kernels
from phyai_ros.layers import ops
from phyai_ros.layers.linears import (SKINNY_ROWS, Weight, linear_add_layer_norm, linear_add_rms_norm,
                                      linear_gated_ada_rms_norm, linear_geglu, linear_gelu_tanh)
from phyai_ros.layers.quantized import QuantizedWeight
from phyai_ros.layers.registry import CUDA, current_selector, register, triton_ok
from phyai_ros.layers.selector import Candidate, shape_key

Tensor = torch.Tensor


# ----------------------------------------------------------------------------- GR00T's DiT: LayerNorm, GELU up
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
    h_new, stats = post_norm_kernels.residual_with_stats(h, x, weight, bias, block_n=block_n)
    return h_new, post_norm_kernels.norm_linear_gelu(h_new, stats, up_weight, up_bias, up_colsum, eps,
                                                     block_n=up_block_n)


# ----------------------------------------------------------------------------- the pi expert: (ada)RMSNorm, GeGLU
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
    h_new, xs, stats = post_norm_kernels.gated_residual_rms(h, x, weight, gate, scale, shift, block_n=block_n)
    m = post_norm_kernels.rms_linear_geglu(xs, stats, gate_up_w, eps, block_n=up_block_n)
    return h_new, m.view(*x.shape[:-1], m.shape[-1])


register("linear_add_norm_gelu", [
    *(Candidate(name, functools.partial(_triton_post_norm, block_n=bn, up_block_n=ubn), CUDA, available=triton_ok,
                profiled_only=True, supports=functools.partial(_post_norm_fits, block_n=bn))
      for name, bn, ubn in (("post_norm", 16, 64), ("post_norm_n32", 32, 32))),
    Candidate("unfused", _linear_add_then_norm_gelu)])
register("linear_gated_norm_geglu", [
    *(Candidate(name, functools.partial(_triton_post_rms, block_n=16, up_block_n=ubn), CUDA, available=triton_ok,
                profiled_only=True, supports=functools.partial(_post_rms_fits, block_n=16))
      for name, ubn in (("post_norm", 32), ("post_norm_n16", 16))),
    Candidate("unfused", _linear_then_norm_geglu)])


# ----------------------------------------------------------------------------- what the models call
def linear_add_norm_gelu(h: Tensor, x: Tensor, weight: Weight, bias: Optional[Tensor], up_weight: Weight,
                         up_bias: Optional[Tensor], up_colsum: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor]:
    """(h_new, gelu_tanh(LayerNorm(h_new) @ up_weight^T + up_bias)) for h_new = h + linear(x, weight, bias), the
    LayerNorm without affine: a transformer block's attention output, residual add, and its MLP's norm and GELU
    up-projection (GR00T's DiT). ``up_colsum`` (``up_column_sums`` of up_weight, made at load) lets the fused
    candidate normalise after the up-projection's dot; without it, or with quantized weights, the two ops."""
    if up_colsum is None or isinstance(weight, QuantizedWeight) or isinstance(up_weight, QuantizedWeight):
        return _linear_add_then_norm_gelu(h, x, weight, bias, up_weight, up_bias, up_colsum, eps)
    return current_selector().call("linear_add_norm_gelu", shape_key(x, weight, up_weight), x.device, h, x, weight,
                                   bias, up_weight, up_bias, up_colsum, eps)


def linear_gated_norm_geglu(x: Tensor, weight: Weight, h: Tensor, gate: Optional[Tensor], scale: Tensor,
                            shift: Optional[Tensor], gate_up_w: Weight, eps: float) -> Tuple[Tensor, Tensor]:
    """(h_new, geglu(norm(h_new) @ gate_up_w^T)) for the pi expert's attention output: h_new = h + linear(x,
    weight) * gate, norm the adaRMSNorm with (scale, shift) (pi0.5), or h + linear(x, weight) and Gemma's RMSNorm
    with weight ``scale`` (pi0: gate and shift None). Where a profile picks the fused candidate, the norm is
    applied after gate_up's dot (kernels/candidates/post_norm.py); quantized weights run the two ops."""
    if isinstance(weight, QuantizedWeight) or isinstance(gate_up_w, QuantizedWeight):
        return _linear_then_norm_geglu(x, weight, h, gate, scale, shift, gate_up_w, eps)
    return current_selector().call("linear_gated_norm_geglu", shape_key(x, weight, gate_up_w, scale), x.device, x,
                                   weight, h, gate, scale, shift, gate_up_w, eps)


def up_column_sums(up_weight: Weight) -> Optional[Tensor]:
    """What linear_add_norm_gelu's fused candidate needs of the up-projection's weight, made once at load: its
    fp32 column sums (None for a quantized weight, which runs the two ops)."""
    if isinstance(up_weight, QuantizedWeight):
        return None
    return post_norm_kernels.column_sums(up_weight)
