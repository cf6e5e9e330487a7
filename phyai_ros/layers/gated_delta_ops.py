"""The Gated-DeltaNet layer's two fused ops (Qwen3.5's linear-attention layers, MiniCPM-Robot's LM) and their
candidates: kernels/gated_delta_prep.py's Triton kernels on CUDA, the torch references everywhere.

``gdn_conv_qkv_gates``: the fused input projection's output -> q, k (conv, SiLU, l2-normed, q scaled), v, beta,
g, all float32; ``gdn_gated_norm``: rmsnorm(x) * w * SiLU(z) per head. Why a module of their own: these ops have
one caller family and no GEMM; the shared op families (norms, linears, attention, ...) stay the shared ops'.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from phyai_ros.kernels import gated_delta_prep as prep
from phyai_ros.layers.registry import CUDA, current_selector, register, triton_ok
from phyai_ros.layers.selector import Candidate, shape_key

Tensor = torch.Tensor

register("gdn_conv_qkv_gates", [Candidate("triton", prep.conv_qkv_gates, CUDA, available=triton_ok),
                                Candidate("torch", prep.conv_qkv_gates_ref)])
register("gdn_gated_norm", [Candidate("triton", prep.gated_rms_norm, CUDA, available=triton_ok),
                            Candidate("torch", prep.gated_rms_norm_ref)])


def conv_qkv_gates(proj: Tensor, conv_w: Tensor, a_log: Tensor, dt_bias: Tensor, hk: int, hv: int, dk: int,
                   dv: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return current_selector().call("gdn_conv_qkv_gates", shape_key(proj), proj.device, proj, conv_w, a_log, dt_bias,
                                   hk, hv, dk, dv)


def gated_norm(x: Tensor, z: Tensor, weight: Tensor, eps: float, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    return current_selector().call("gdn_gated_norm", shape_key(x), x.device, x, z, weight, eps, out_dtype or x.dtype)


__all__ = ["conv_qkv_gates", "gated_norm"]
