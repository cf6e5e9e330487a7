"""GR00T N1.7 as the stage functions a runner drives (phyai_ros/runtime/stage_runner.py), over the weights of
qwen3vl.py (the backbone) and action_head.py (the flow-matching head).

The runner knows no model: it copies what `observation` returns into static buffers of the observation's
shape bucket and runs `backbone` -> `context` once per observation and `loop` once per chunk, eagerly or as
CUDA graphs. Everything host-side (token layout, mRoPE positions, RTC's data-dependent prefix rows) happens in
`observation` and `solver_tensors`, so the three stages read only fixed-shape device tensors.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from phyai_ros.runtime.lru import LruCache
from phyai_ros.runtime.roofline import StageCost

from . import action_head, qwen3vl
from .config import GrootConfig
from .processor import GrootInputs

Tensor = torch.Tensor


class GrootModel:
    """GR00T N1.7's weights (one dict under LeRobot's key names, q/k/v and gate/up fused at load) and sizes as the
    runner's stage API."""

    def __init__(self, weights: Dict[str, Tensor], config: GrootConfig, device, dtype: torch.dtype):
        self.weights, self.config = weights, config
        self.device, self.dtype = torch.device(device), dtype
        # Backbone plans: per image grid the vision position embedding and RoPE, per token layout (instruction)
        # the mRoPE tables and image rows; bounded (qwen3vl.PLAN_CACHE).
        self._plans = LruCache(qwen3vl.PLAN_CACHE)

    # ---------------------------------------------------------------- host side
    def observation(self, inputs: GrootInputs) -> Dict[str, Tensor]:
        """Prepared inputs -> the observation's device tensors (fixed shapes per (batch, token length, grid))."""
        c = self.config
        obs = qwen3vl.backbone_plan(self.weights, c.vision, c.text, c.tokens.image, inputs.input_ids,
                                    inputs.attention_mask, inputs.pixel_values, inputs.image_grid_thw,
                                    cache=self._plans, host=inputs.host_layout)
        obs["state"] = inputs.state.to(self.device, self.dtype)
        obs["embodiment_id"] = inputs.embodiment_id.to(self.device)
        return obs

    @staticmethod
    def batch_size(obs: Dict[str, Tensor]) -> int:
        return obs["input_ids"].shape[0]

    def noise_shape(self, batch: int) -> Tuple[int, int, int]:
        h = self.config.head
        return batch, h.action_horizon, h.max_action_dim

    def step_tables(self, batch: int) -> List[action_head.StepTable]:
        with torch.no_grad():
            return action_head.step_tables(self.weights, self.config.head, batch, self.device)

    def solver_tensors(self, rtc: Optional[action_head.NativeRtc], batch: int) -> Tuple[Tensor, Tensor, Tensor]:
        """(seed, keep, weight) of GR00T's native RTC (normalized model space); RTC off when rtc is None."""
        return action_head.rtc_tensors(rtc, self.config.head, batch, self.device)

    # ---------------------------------------------------------------- capture-safe stages
    def backbone(self, obs: Dict[str, Tensor]) -> Tensor:
        c = self.config
        return qwen3vl.backbone_compute(self.weights, c.vision, c.text, obs)

    def context(self, obs: Dict[str, Tensor], features: Tensor) -> action_head.HeadContext:
        return action_head.observation_context(self.weights, self.config.head, features, obs["attention_mask"],
                                               obs["input_ids"] == self.config.tokens.image, obs["state"],
                                               obs["embodiment_id"])

    def loop(self, ctx: action_head.HeadContext, tables, noise: Tensor, seed: Tensor, keep: Tensor,
             weight: Tensor) -> Tensor:
        return action_head.euler(self.weights, self.config.head, ctx, tables, noise, seed, keep, weight)

# ---------------------------------------------------------------- stage costs (the stage roofline)
# Logical FLOPs and bytes of the three stages, as runtime/roofline.py counts the pi stages: what the math needs,
# not what kernels do. Each weight read once per use of the stage (the DiT's once per flow step), activations
# and the cross-attention K/V read once per use, 2 FLOPs per multiply-add, attention over every (query, key) pair
# the shapes carry. Embodiment layers count one weight copy per batch item (each item gathers its own).
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
