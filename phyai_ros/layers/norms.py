"""The norms as selector ops: RMSNorm (Gemma's and Qwen's), the residual add + RMSNorm, pi0.5's adaRMSNorm and its
gated-residual form, LayerNorm. Each op's candidates: the Triton kernel on CUDA where Triton works
(kernels/rms_norm.py, ada_rms_norm.py, layer_norm.py), the torch reference of ``ops`` everywhere (last).
"""
from __future__ import annotations

from typing import Tuple

import torch

from phyai_ros.kernels import ada_rms_norm as ada_kernels
from phyai_ros.kernels import layer_norm as layer_norm_kernels
from phyai_ros.kernels import rms_norm as rms_kernels
from phyai_ros.layers import ops
from phyai_ros.layers.registry import CUDA, current_selector, register, triton_ok
from phyai_ros.layers.selector import Candidate, shape_key

Tensor = torch.Tensor


# ----------------------------------------------------------------------------- torch references
def _torch_add_rms_norm(x, residual, weight, eps, weight_offset=1.0):
    r = x + residual
    return ops.rms_norm(r, weight, eps, weight_offset), r


def _torch_gated_ada(h, y, gate, scale, shift, eps):
    h = ops.gated_residual(h, y, gate.to(h.dtype))
    return h, ops.ada_rms_norm(h, scale, shift, eps)


# ----------------------------------------------------------------------------- Triton adapters
def modulation_rows(t: Tensor, width: int) -> Tensor:
    """Modulation [B|1, 1, W] (broadcast over tokens) -> [B|1, W] rows, no copy: the row layout the adaRMS kernels
    (and the skinny GEMMs' adaRMS epilogue) take."""
    return t.reshape(-1, width)


def _triton_ada(x, scale, shift, eps):
    w = x.shape[-1]
    sc, sh = modulation_rows(scale, w), modulation_rows(shift, w)
    return ada_kernels.ada_rms_norm(x, sc, sh, tokens_per_item=x.numel() // w // sc.shape[0], eps=eps)


def _triton_gated_ada(h, y, gate, scale, shift, eps):
    w = h.shape[-1]
    g, sc, sh = modulation_rows(gate, w), modulation_rows(scale, w), modulation_rows(shift, w)
    return ada_kernels.gated_residual_ada_rms_norm(h, y.to(h.dtype), g, sc, sh,
                                                   tokens_per_item=h.numel() // w // g.shape[0], eps=eps)


def _triton_rms(x, weight, eps, weight_offset=1.0):
    return rms_kernels.rms_norm(x if x.is_contiguous() else x.contiguous(), weight, eps, weight_offset=weight_offset)


def _triton_add_rms(x, residual, weight, eps, weight_offset=1.0):
    return rms_kernels.add_rms_norm(x, residual, weight, eps, weight_offset=weight_offset)


def _triton_layer_norm(x, weight, bias, eps):
    return layer_norm_kernels.layer_norm(x if x.is_contiguous() else x.contiguous(), weight, bias, eps)


register("layer_norm", [Candidate("triton", _triton_layer_norm, CUDA, available=triton_ok),
                        Candidate("torch", ops.layer_norm)])
register("rms_norm", [Candidate("triton", _triton_rms, CUDA, available=triton_ok), Candidate("torch", ops.rms_norm)])
register("add_rms_norm", [Candidate("triton", _triton_add_rms, CUDA, available=triton_ok),
                          Candidate("torch", _torch_add_rms_norm)])
register("ada_rms_norm", [Candidate("triton", _triton_ada, CUDA, available=triton_ok),
                          Candidate("torch", ops.ada_rms_norm)])
register("gated_ada_rms_norm", [Candidate("triton", _triton_gated_ada, CUDA, available=triton_ok),
                                Candidate("torch", _torch_gated_ada)])


# ----------------------------------------------------------------------------- what the models call
def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    return current_selector().call("layer_norm", shape_key(x), x.device, x, weight, bias, eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float, weight_offset: float = 1.0) -> Tensor:
    """Gemma RMSNorm (times 1 + weight); weight_offset=0: Qwen's (times weight)."""
    return current_selector().call("rms_norm", shape_key(x), x.device, x, weight, eps, weight_offset)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, weight_offset: float = 1.0
                 ) -> Tuple[Tensor, Tensor]:
    """(rms_norm(x + residual), x + residual); weight_offset as rms_norm's (0: Qwen's plain weight)."""
    return current_selector().call("add_rms_norm", shape_key(x), x.device, x, residual, weight, eps, weight_offset)


def ada_rms_norm(x: Tensor, scale: Tensor, shift: Tensor, eps: float) -> Tensor:
    return current_selector().call("ada_rms_norm", shape_key(x), x.device, x, scale, shift, eps)


def gated_ada_rms_norm(h: Tensor, y: Tensor, gate: Tensor, scale: Tensor, shift: Tensor, eps: float
                       ) -> Tuple[Tensor, Tensor]:
    """(h + y * gate, ada_rms_norm(h + y * gate, scale, shift))."""
    return current_selector().call("gated_ada_rms_norm", shape_key(h), h.device, h, y, gate, scale, shift, eps)
