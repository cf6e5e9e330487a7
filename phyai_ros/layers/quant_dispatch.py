"""Operator candidates for linear layers whose weight is a ``QuantizedWeight``.

``layers/linears.py`` routes every linear op to its quantized twin ("linear" -> "qlinear", "linear_geglu" ->
"qlinear_geglu", ...) when the weight is quantized, so the models call the same functions either way; this
module registers the twins' candidates with the selector when the layers package is imported (layers/__init__). The
candidates, in preference order:

* few rows (the expert's / DiT's tokens): ``kernels/quant_linear.py``'s weight-streaming GEMM, one candidate per
  launch shape, its fp32 partials summed by the same epilogue kernels the bf16 path fuses (bias / GELU, GeGLU,
  residual + RMSNorm / adaRMS);
* many rows, W8A8: ``torch._scaled_mm`` on fp8 tensor cores (Hopper, Ada, Blackwell incl. Thor) after a row kernel
  quantizes the activations;
* "dense": the bf16 op (as selected for its own shape) on the weight's dequantized copy, where the weight holds
  one (``quantized.plan_dense``): the measured plan. A quantized kernel does not pay at every shape (fp8 at batch 1
  on an H100 lost to bf16: its activations' quantization costs more than the halved weight bytes save), so a
  device's profile times this against the quantized candidates and names it where it wins; profiled only, and
  checked against itself (it computes the W8A16 product, more exact than W8A8's fake-quantized reference);
* the reference: dequantize and run the float GEMM (always usable; the fallback on any device).

The profile key carries the scheme's tag, so a device profile picks per scheme and shape.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from phyai_ros.kernels import layer_norm as layer_norm_kernels
from phyai_ros.kernels import quant_linear as quant_kernels
from phyai_ros.kernels import skinny_epilogue as epilogue_kernels
from phyai_ros.layers import ops
from phyai_ros.layers.activations import geglu
from phyai_ros.layers.linears import (SKINNY_ROWS, linear, linear_add_layer_norm, linear_add_rms_norm,
                                      linear_gated_ada_rms_norm, linear_geglu, linear_gelu_tanh)
from phyai_ros.layers.norms import add_rms_norm, gated_ada_rms_norm
from phyai_ros.layers.quantized import QuantizedWeight, observe
from phyai_ros.layers.registry import CUDA, register, triton_ok
from phyai_ros.layers.selector import Candidate

Tensor = torch.Tensor

# Launch shapes of the quantized weight-streaming GEMM (block_k is the group size for int4).
QUANT_TILINGS = {
    "triton": {},
    "triton_n32": {"block_n": 32, "num_stages": 4},
    "triton_n32_k256": {"block_n": 32, "block_k": 256},
    "triton_n64_k256": {"block_n": 64, "block_k": 256},
    "triton_n16_k256": {"block_n": 16, "block_k": 256},
    "triton_n32_s1": {"block_n": 32, "splits": 1, "num_stages": 4},
    "triton_n128_w8": {"block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
}

QUANT_OPS = {"linear": "qlinear", "linear_geglu": "qlinear_geglu", "linear_add_rms_norm": "qlinear_add_rms_norm",
             "linear_gated_ada_rms_norm": "qlinear_gated_ada_rms_norm",
             "linear_add_layer_norm": "qlinear_add_layer_norm", "linear_gelu_tanh": "qlinear_gelu_tanh"}


def _kargs(w: QuantizedWeight):
    return w.q, w.scale, w.group, w.act_quant, w.act_scale


# ----------------------------------------------------------------------------- references
def torch_qlinear(x: Tensor, w: QuantizedWeight, bias=None) -> Tensor:
    """Dequantize-and-GEMM in x's dtype (8-bit values are exact there; the per-channel scales multiply the
    product), activations fake-quantized to fp8 first for W8A8."""
    dt = x.dtype
    if w.group:
        return F.linear(x, w.dequantize(dt), bias)
    xs = None
    if w.act_quant:
        static = None if observe(w, x) or w.act_quant == "dynamic" else w.act_scale
        xq, xs = quant_kernels.quantize_activations_ref(x.reshape(-1, x.shape[-1]), static)
        x = xq.to(dt).view(x.shape)
    y = F.linear(x, w.q.to(dt)).float() * w.scale
    if xs is not None:
        y = y * xs.view(*x.shape[:-1], 1)
    if bias is not None:
        y = y + bias.float()
    return y.to(dt)


def _unfused_geglu(x, w):
    return geglu(linear(x, w))


def _unfused_add_rms(x, w, residual, norm_w, eps):
    return add_rms_norm(linear(x, w), residual, norm_w, eps)


def _unfused_gated_ada(x, w, h, gate, scale, shift, eps):
    return gated_ada_rms_norm(h, linear(x, w), gate, scale, shift, eps)


def _torch_add_layer_norm(h, x, w, bias, ln_w, ln_b, eps):
    h = h + linear(x, w, bias)
    return h, ops.layer_norm(h, ln_w, ln_b, eps)


def _unfused_gelu_tanh(x, w, bias):
    return ops.gelu_tanh(linear(x, w, bias))


# ----------------------------------------------------------------------------- kernels
def _few_rows(x, w, *rest) -> bool:
    return x.numel() // x.shape[-1] <= SKINNY_ROWS and x.dtype in (torch.float32, torch.bfloat16, torch.float16)


def _few_rows_per_item(x, w, h, gate, scale, shift, eps) -> bool:
    return _few_rows(x, w) and all(t.dim() == 3 and t.shape[1] == 1 for t in (gate, scale, shift))


def _triton_qlinear(x, w, bias=None, act=None, **tiling):
    return quant_kernels.quant_linear(x, *_kargs(w), bias=bias, act=act, **tiling)


def _triton_qgeglu(x, w, **tiling):
    return quant_kernels.quant_linear_geglu(x, *_kargs(w), **tiling)


def _triton_qadd_rms(x, w, residual, norm_w, eps, **tiling):
    return epilogue_kernels.norm_from_partials(quant_kernels.quant_partials(x, *_kargs(w), **tiling), x, residual,
                                               None, norm_w, None, eps)


def _triton_qgated_ada(x, w, h, gate, scale, shift, eps, **tiling):
    n = h.shape[-1]
    g, sc, sh = (t.reshape(-1, n) for t in (gate, scale, shift))
    normed, new_h = epilogue_kernels.norm_from_partials(quant_kernels.quant_partials(x, *_kargs(w), **tiling), x, h,
                                                        (g, sc, sh), None, h.numel() // n // g.shape[0], eps)
    return new_h, normed


def _triton_qadd_layer_norm(h, x, w, bias, ln_w, ln_b, eps):
    """The quantized GEMM without its bias (any candidate), then the add + LayerNorm kernel adds bias and h."""
    return layer_norm_kernels.add_layer_norm(h, linear(x, w), bias, ln_w, ln_b, eps)


def _scaled_mm_ok() -> bool:
    return torch.cuda.is_available() and hasattr(torch, "_scaled_mm") and \
        torch.cuda.get_device_capability() >= (8, 9) and triton_ok()


def _scaled_mm_fits(x, w, bias=None) -> bool:
    n, k = w.shape
    return (w.scheme.weight_format == "fp8" and w.act_quant is not None and x.dtype == torch.bfloat16
            and n % 16 == 0 and k % 16 == 0)


def _scaled_mm_qlinear(x, w, bias=None):
    """fp8 x fp8 on tensor cores with row-wise scales (activations per token, weights per channel)."""
    k = x.shape[-1]
    xq, xs = quant_kernels.quantize_rows(x.reshape(-1, k), w.act_scale if w.act_quant == "static" else None)
    y = torch._scaled_mm(xq, w.q.t(), scale_a=xs[:, None], scale_b=w.scale[None, :],
                         bias=None if bias is None else bias.to(x.dtype), out_dtype=x.dtype)
    return y.view(*x.shape[:-1], w.shape[0])


# ----------------------------------------------------------------------------- the bf16 path on the dense copy
def _holds_dense(position: int):
    def supports(*args) -> bool:
        return args[position].dense is not None
    return supports


def _dense(op, position: int = 1) -> Candidate:
    """The bf16 op on the weight's dequantized copy (argument ``position`` is the weight)."""
    def run(*args):
        args = list(args)
        args[position] = args[position].dense
        return op(*args)
    return Candidate("dense", run, supports=_holds_dense(position), profiled_only=True, own_reference=True)


def _tiled(name: str, fn, supports) -> list:
    return [Candidate(name + suffix[len("triton"):], functools.partial(fn, **tiling), CUDA, available=triton_ok,
                      supports=supports) for suffix, tiling in QUANT_TILINGS.items()]


QUANT_REGISTRY = {
    "qlinear": [*_tiled("triton", _triton_qlinear, _few_rows),
                Candidate("scaled_mm", _scaled_mm_qlinear, CUDA, available=_scaled_mm_ok, supports=_scaled_mm_fits),
                _dense(linear), Candidate("torch", torch_qlinear)],
    "qlinear_geglu": [*_tiled("triton", _triton_qgeglu, _few_rows), _dense(linear_geglu),
                      Candidate("unfused", _unfused_geglu)],
    "qlinear_add_rms_norm": [*_tiled("triton", _triton_qadd_rms, _few_rows), _dense(linear_add_rms_norm),
                             Candidate("unfused", _unfused_add_rms)],
    "qlinear_gated_ada_rms_norm": [*_tiled("triton", _triton_qgated_ada, _few_rows_per_item),
                                   _dense(linear_gated_ada_rms_norm), Candidate("unfused", _unfused_gated_ada)],
    "qlinear_add_layer_norm": [Candidate("triton", _triton_qadd_layer_norm, CUDA, available=triton_ok),
                               _dense(linear_add_layer_norm, 2), Candidate("torch", _torch_add_layer_norm)],
    "qlinear_gelu_tanh": [*_tiled("triton", functools.partial(_triton_qlinear, act="gelu_tanh"), _few_rows),
                          _dense(linear_gelu_tanh), Candidate("unfused", _unfused_gelu_tanh)],
}
for _op, _cands in QUANT_REGISTRY.items():
    register(_op, _cands)
