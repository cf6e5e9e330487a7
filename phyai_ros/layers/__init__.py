"""Operator layer: the only place model code gets its math from (see ops.py for why). Importing it registers
every op's candidates with the operator selector, one module per op family (norms, activations, linears,
attention, post_norm, expert_stack; ``dispatch`` re-exports their public ops), then the Gated-DeltaNet layer's
(gated_delta_ops) and the quantized twins' (quant_dispatch)."""
from . import dispatch, expert_stack, gated_delta_ops, ops, quant_dispatch

__all__ = ["dispatch", "expert_stack", "gated_delta_ops", "ops", "quant_dispatch"]
