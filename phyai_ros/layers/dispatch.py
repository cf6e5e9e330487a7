"""The layer ops the models call, in one namespace (``from phyai_ros.layers import dispatch``;
``dispatch.linear(...)``).

Each op is defined, with its torch reference, its Triton adapters and its candidates, in the module of its family;
this module only re-exports the public functions, so that a model reads as one list of ops and never depends on
how the ops are grouped:

* ``layers/norms.py``: rms_norm, add_rms_norm, ada_rms_norm, gated_ada_rms_norm, layer_norm;
* ``layers/activations.py``: geglu, swiglu;
* ``layers/linears.py``: linear and its fused epilogues (linear_gelu_tanh, linear_geglu, linear_add_rms_norm,
  linear_gated_ada_rms_norm, linear_add_layer_norm), the skinny GEMMs' tilings;
* ``layers/attention.py``: attention, attention_with_prefix, rope_attention_with_prefix, projected_attention,
  qkv_rope, qkv_norm_rope (and ``sdpa``, its SDPA candidate);
* ``layers/post_norm.py``: linear_add_norm_gelu, linear_gated_norm_geglu, up_column_sums;
* ``layers/expert_stack.py``: expert_stack.

Each op asks the operator selector (``SELECTOR``, or the running policy's; layers/selector.py) which candidate runs.
The quantized twins ("q" + an op's name) are registered by layers/quant_dispatch.py, the Gated-DeltaNet ops by
layers/gated_delta_ops.py; importing the layers package registers every family.
"""
from phyai_ros.layers.activations import geglu, swiglu
from phyai_ros.layers.attention import (attention, attention_with_prefix, projected_attention, qkv_norm_rope,
                                        qkv_rope, rope_attention_with_prefix, sdpa)
from phyai_ros.layers.expert_stack import expert_stack
from phyai_ros.layers.linears import (linear, linear_add_layer_norm, linear_add_rms_norm, linear_gated_ada_rms_norm,
                                      linear_geglu, linear_gelu_tanh)
from phyai_ros.layers.norms import ada_rms_norm, add_rms_norm, gated_ada_rms_norm, layer_norm, rms_norm
from phyai_ros.layers.post_norm import linear_add_norm_gelu, linear_gated_norm_geglu, up_column_sums
from phyai_ros.layers.selector import SELECTOR

__all__ = ["SELECTOR", "ada_rms_norm", "add_rms_norm", "attention", "attention_with_prefix", "expert_stack", "geglu",
           "gated_ada_rms_norm", "layer_norm", "linear", "linear_add_layer_norm", "linear_add_norm_gelu",
           "linear_add_rms_norm", "linear_gated_ada_rms_norm", "linear_gated_norm_geglu", "linear_geglu",
           "linear_gelu_tanh", "projected_attention", "qkv_norm_rope", "qkv_rope", "rms_norm",
           "rope_attention_with_prefix", "sdpa", "swiglu", "up_column_sums"]
