"""Logical FLOPs and bytes of Cosmos3's two transformer stages, for the stage-level roofline.

As runtime/roofline.py counts the pi stages and groot_n17.modeling GR00T's: what the math needs, not what kernels
do. Each weight read once per use of the stage (the generation pathway's once per denoising step), activations and
the text pathway's keys / values written or read once per use, 2 FLOPs per multiply-add, attention over every
(query, key) pair the shapes carry (the text pathway's causal attention over half of them). The embeddings, the
patch and action projections and the time embedding are left out (small next to the layers).
"""
from __future__ import annotations

from typing import Dict

from phyai_ros.runtime.roofline import StageCost

from .config import TransformerConfig


def cosmos3_stage_costs(c: TransformerConfig, rows: int, text: int, gen: int, steps: int, weight_bytes: int = 2,
                        act_bytes: int = 2) -> Dict[str, StageCost]:
    """'conditioning' (the text pathway over ``text`` tokens, for its per-layer keys / values: the last layer's
    MLP and attention output are not needed) and 'generation' (``steps`` passes of the generation pathway over
    ``gen`` tokens, attending to the text's keys / values and their own) for ``rows`` rows (every item's CFG
    passes)."""
    mlp = (3 if c.hidden_act == "silu" else 2) * c.hidden_size * c.intermediate_size
    proj = c.hidden_size * (c.q_dim + 2 * c.kv_dim) + c.q_dim * c.hidden_size
    text_weights = c.num_layers * proj + (c.num_layers - 1) * mlp
    cond = 2 * rows * text * text_weights + 2 * rows * text * text * c.q_dim * (c.num_layers - 1)
    step = 2 * rows * gen * c.num_layers * (proj + mlp) + 4 * rows * gen * (text + gen) * c.q_dim * c.num_layers
    text_kv = rows * text * c.num_layers * 2 * c.kv_dim * act_bytes   # written by the conditioning, read every step
    cond_bytes = text_weights * weight_bytes + rows * text * c.hidden_size * act_bytes + text_kv
    step_bytes = c.num_layers * (proj + mlp) * weight_bytes + text_kv + 2 * rows * gen * c.hidden_size * act_bytes
    return {"conditioning": StageCost(cond, cond_bytes), "generation": StageCost(steps * step, steps * step_bytes)}


__all__ = ["cosmos3_stage_costs"]
