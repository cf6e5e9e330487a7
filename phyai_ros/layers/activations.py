"""The gated activations as selector ops: GeGLU (gelu_tanh(gate) * up: the Gemma MLPs) and SwiGLU (silu(gate) * up:
Qwen3's MLP) of a fused [gate | up] projection output. Candidates: kernels/geglu.py's one kernel on CUDA where
Triton works, the torch reference everywhere (last).
"""
from __future__ import annotations

import torch

from phyai_ros.kernels import geglu as geglu_kernels
from phyai_ros.layers import ops
from phyai_ros.layers.registry import CUDA, current_selector, register, triton_ok
from phyai_ros.layers.selector import Candidate, shape_key

Tensor = torch.Tensor


def _torch_geglu(gate_up):
    m = gate_up.shape[-1] // 2
    return ops.gelu_tanh_mul(gate_up[..., :m], gate_up[..., m:])


def _torch_swiglu(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


register("geglu", [Candidate("triton", geglu_kernels.geglu, CUDA, available=triton_ok),
                   Candidate("torch", _torch_geglu)])
register("swiglu", [Candidate("triton", geglu_kernels.swiglu, CUDA, available=triton_ok),
                    Candidate("torch", _torch_swiglu)])


def geglu(gate_up: Tensor) -> Tensor:
    """gelu_tanh(gate) * up for gate_up = [gate | up] along the last dim."""
    return current_selector().call("geglu", shape_key(gate_up), gate_up.device, gate_up)


def swiglu(gate_up: Tensor) -> Tensor:
    """silu(gate) * up of a fused [gate | up] projection output (Qwen3's MLP), one kernel where Triton runs."""
    return current_selector().call("swiglu", shape_key(gate_up), gate_up.device, gate_up)
