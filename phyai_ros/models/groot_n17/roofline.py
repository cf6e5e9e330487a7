"""Logical FLOPs and bytes of GR00T N1.7's three runner stages, for the stage roofline.

As runtime/roofline.py counts the pi stages: what the math needs, not what kernels do. Each weight read once
per use of the stage (the DiT's once per flow step), activations and the cross-attention K/V read once per
use, 2 FLOPs per multiply-add, attention over every (query, key) pair the shapes carry. Embodiment layers
count one weight copy per batch item (each item gathers its own).
"""
from __future__ import annotations

from typing import Dict

from phyai_ros.runtime.roofline import StageCost

from .config import GrootConfig


def groot_stage_costs(cfg: GrootConfig, batch: int, n_images: int, patches_per_image: int, tokens: int,
                      weight_bytes: int = 2, act_bytes: int = 2) -> Dict[str, StageCost]:
    """'backbone' (vision + LLM cut at select_layer), 'context' (VL self-attention, cross K/V, state token),
    'loop' (all flow steps: action encoder, DiT, decoder) for `batch` items of `tokens` tokens each."""
    v, t, h = cfg.vision, cfg.text, cfg.head
    wb, ab, b, n, length = weight_bytes, act_bytes, batch, patches_per_image, tokens
    imgs = b * n_images
    # backbone
    block = 4 * v.width ** 2 + 2 * v.width * v.mlp_dim
    merged = v.width * v.merge_size ** 2
    mergers = (1 + len(v.deepstack_indexes)) * (merged * merged + merged * v.out_width)
    vis_params = v.patch_dim * v.width + v.depth * block + mergers
    vis_flops = imgs * (2 * n * (v.patch_dim * v.width + v.depth * block) + v.depth * 4 * n * n * v.width
                        + 2 * (n // v.merge_size ** 2) * mergers)
    q, kv = t.num_heads * t.head_dim, t.num_kv_heads * t.head_dim
    layer = t.width * (q + 2 * kv) + q * t.width + 3 * t.width * t.mlp_dim
    llm_flops = b * (2 * length * t.depth * layer + t.depth * 4 * length * length * q)
    bb_bytes = (vis_params + t.depth * layer) * wb + imgs * n * v.patch_dim * 4 + b * length * t.width * ab * 2
    # context (once per observation)
    d, c, e = h.backbone_dim, h.dit_width, h.input_embedding_dim
    cross_blocks = (h.dit_layers + 1) // 2
    vlsa = h.vlsa_layers * (4 * d * h.vlsa_width + 8 * d * d)
    ctx_params = vlsa + cross_blocks * 2 * d * c
    state_enc = h.max_state_dim * h.hidden_size + h.hidden_size * e
    ctx_flops = b * (2 * length * ctx_params + h.vlsa_layers * 4 * length * length * h.vlsa_width + 2 * state_enc)
    cross_kv = b * cross_blocks * 2 * length * c * ab
    ctx_bytes = ctx_params * wb + b * state_enc * wb + b * length * d * ab + cross_kv
    # loop: 1 state + H action tokens per step
    hor = h.action_horizon
    rows = 1 + hor
    self_blocks = h.dit_layers // 2
    dit_params = h.dit_layers * 8 * c * c + self_blocks * 4 * c * c + cross_blocks * 2 * c * c + c * h.dit_output_dim
    per_item = h.max_action_dim * e + 2 * e * e + e * e + h.dit_output_dim * h.hidden_size + h.hidden_size * h.max_action_dim
    attn = self_blocks * 4 * rows * rows * c + cross_blocks * 4 * rows * length * c
    step_flops = b * (2 * rows * dit_params + 2 * rows * per_item + attn)
    step_bytes = dit_params * wb + b * per_item * wb + cross_kv + b * rows * c * ab * 2
    return {"backbone": StageCost(vis_flops + llm_flops, bb_bytes), "context": StageCost(ctx_flops, ctx_bytes),
            "loop": StageCost(h.num_steps * step_flops, h.num_steps * step_bytes)}
