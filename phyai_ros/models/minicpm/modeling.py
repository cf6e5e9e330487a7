"""MiniCPM-Robot as the stage functions the observation runner drives (phyai_ros/runtime/stage_runner.py: backbone
and context once per observation, the whole clean-action loop once per chunk, eagerly or as CUDA graphs).

Host side (``observation``): the prepared batch as fixed-shape tensors (uint8 frames, token ids and mask, the
image tokens' rows, the RoPE tables of the prompt's length, state, embodiment ids). Device side, capture-safe:
``backbone`` (pixel values from the level table, vision tower, image-row scatter, the text model; its output cast
to the head's dtype as the reference's ``.float()``), ``context`` (cross-attention K/V, the banks of the batch's
ids), ``loop`` (every step). The VLM and the head keep their own dtypes (bf16 VLM, fp32 head by default).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from phyai_ros.models.rtc_weights import rtc_prefix_weights
from phyai_ros.runtime.lru import LruCache

from . import head, language, vision
from .config import MiniCpmConfig
from .processor import MiniCpmInputs, pixels_from_levels

Tensor = torch.Tensor


class MiniCpmModel:
    def __init__(self, weights: Dict[str, Tensor], config: MiniCpmConfig, levels: Tensor, device,
                 vlm_dtype: torch.dtype, head_dtype: torch.dtype):
        self.weights, self.config = weights, config
        self.device = torch.device(device)
        self.vlm_dtype, self.head_dtype = vlm_dtype, head_dtype
        self.levels = levels.to(self.device)
        self._rope = LruCache(16)
        self._tables: Optional[List[head.StepTable]] = None

    # ---------------------------------------------------------------- host side
    def rope(self, length: int) -> Tuple[Tensor, Tensor]:
        tables = self._rope.get(length)
        if tables is None:
            tables = language.rope_tables(self.config.text, length, self.device, self.vlm_dtype)
            self._rope.put(length, tables)
        return tables

    def observation(self, inputs: MiniCpmInputs) -> Dict[str, Tensor]:
        cos, sin = self.rope(inputs.input_ids.shape[1])
        return {"frames": inputs.frames, "input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask,
                "image_rows": inputs.image_rows, "cos": cos, "sin": sin,
                "state": inputs.state.to(self.head_dtype), "embodiment_id": inputs.embodiment_id}

    @staticmethod
    def batch_size(obs: Dict[str, Tensor]) -> int:
        return obs["input_ids"].shape[0]

    def noise_shape(self, batch: int) -> Tuple[int, int, int]:
        h = self.config.head
        return batch, h.horizon, h.action_dim

    def step_tables(self, batch: int = 1) -> List[head.StepTable]:
        if self._tables is None:
            with torch.no_grad():
                self._tables = head.step_tables(self.weights, self.config.head, self.device)
        return self._tables

    def solver_tensors(self, rtc: Optional[Tuple[np.ndarray, int, str]], batch: int) -> Tuple[Tensor, Tensor, Tensor]:
        """RTC as fixed-shape tensors: (prefix [B, T, A] float32, the blend weight [B, T, 1], an unused [1]).
        ``rtc``: (Y [n, A] in robot units, frozen count d, the ramp's schedule) or None (weight 0: the plain
        sampler, exactly)."""
        h = self.config.head
        prefix = torch.zeros(batch, h.horizon, h.action_dim)
        weight = torch.zeros(batch, h.horizon, 1)
        if rtc is not None:
            y, frozen, schedule = rtc
            n = min(len(y), h.horizon)
            prefix[:, :n] = torch.as_tensor(np.asarray(y[:n], dtype=np.float32))
            weight[:, :, 0] = rtc_prefix_weights(frozen, n, h.horizon, schedule)
        return prefix.to(self.device), weight.to(self.device), torch.zeros(1, device=self.device)

    # ---------------------------------------------------------------- capture-safe stages
    def backbone(self, obs: Dict[str, Tensor], trace=None) -> Tensor:
        c, w = self.config, self.weights
        pixels = pixels_from_levels(obs["frames"], self.levels, self.vlm_dtype)
        feats = vision.image_features(w, c, pixels, trace)
        embeds = language.scatter_image_rows(language.embed_tokens(w, obs["input_ids"]), obs["image_rows"], feats)
        vision.record(trace, "text.inputs_embeds", embeds)
        out = language.text_model(w, c.text, embeds, obs["attention_mask"], (obs["cos"], obs["sin"]), trace)
        return out.to(self.head_dtype)

    def context(self, obs: Dict[str, Tensor], vl_embs: Tensor) -> head.HeadContext:
        return head.context(self.weights, self.config.head, vl_embs, obs["attention_mask"], obs["state"],
                            obs["embodiment_id"])

    def loop(self, ctx: head.HeadContext, tables, noise: Tensor, prefix: Tensor, weight: Tensor,
             _unused: Tensor) -> Tensor:
        return head.sample(self.weights, self.config.head, ctx, tables, noise, prefix, weight)


__all__ = ["MiniCpmModel"]
