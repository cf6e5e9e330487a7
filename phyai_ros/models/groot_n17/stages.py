"""GR00T N1.7 as the stage functions a runner drives (phyai_ros/runtime/groot_runner.py).

The runner knows no model: it copies what `observation` returns into static buffers of the observation's
shape bucket and runs `backbone` -> `context` once per observation and `loop` once per chunk, eagerly or as
CUDA graphs. Everything host-side (token layout, mRoPE positions, RTC's data-dependent prefix rows) happens in
`observation` and `solver_tensors`, so the three stages read only fixed-shape device tensors.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from . import action_head, qwen3vl
from .adapter import GrootPolicy, GrootRtc
from .processor import GrootInputs

Tensor = torch.Tensor


class GrootStages:
    """A GrootPolicy's weights and sizes as the runner's stage API."""

    def __init__(self, policy: GrootPolicy):
        self.policy = policy
        self.weights, self.config = policy.weights, policy.config
        self.device, self.dtype = policy.device, policy.dtype
        self._vision_tables: dict = {}     # per image grid: vision position embedding and RoPE

    # ---------------------------------------------------------------- host side
    def observation(self, inputs: GrootInputs) -> Dict[str, Tensor]:
        """Prepared inputs -> the observation's device tensors (fixed shapes per (batch, token length, grid))."""
        c = self.config
        obs = qwen3vl.backbone_plan(self.weights, c.vision, c.text, c.tokens.image, inputs.input_ids,
                                    inputs.attention_mask, inputs.pixel_values, inputs.image_grid_thw,
                                    cache=self._vision_tables)
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

    def solver_tensors(self, rtc: Optional[GrootRtc], batch: int) -> Tuple[Tensor, Tensor, Tensor]:
        """(seed, keep, weight) of GR00T's native RTC (normalized model space); RTC off when rtc is None."""
        return action_head.rtc_tensors(self.policy.native_rtc(rtc, batch), self.config.head, batch, self.device)

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
