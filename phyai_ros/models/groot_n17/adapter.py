"""GR00T N1.7 policy adapter: robot observation in, action chunk out (LeRobot 0.6.1 semantics).

    policy = GrootPolicy.from_files(checkpoint_dir, device="cpu", dtype=torch.float32)
    actions = policy.predict(images={"front": rgb_uint8_HxWx3, "wrist": ...}, state=np.float32[state_dim],
                             task="pick up the cup", noise=None,             # or [H, A] / [1, H, A] (x at t=0)
                             rtc=GrootRtc(prev_left_over, inference_delay=3, execution_horizon=8))
    # -> np.float32 [horizon, action_dim] in robot units

Stage order (what a runner drives): `prepare` (processor.py) -> `backbone` (qwen3vl.py) -> `context` (VL
adapter, state token, cross-attention K/V: once per observation) -> `action_head.sample` (4 Euler steps)
-> `decode` (postprocess.py). Tensor-level batch path: `prepare` / `sample_actions` / `decode`.

- images: every camera the checkpoint's pack step uses (its order: `camera_names`), uint8 RGB, all of one
  size; unknown extra cameras are ignored as LeRobot drops them.
- embodiment: the checkpoint's tag (pack step) unless `embodiment_tag` / per-item ids are given.
- RTC is GR00T's native one: prev_left_over in NORMALIZED model space for the tensor path (`GrootRtc`),
  robot units for `predict` (absolute-action checkpoints only: relative ones cannot be re-normalized, and
  LeRobot turns RTC off for them, so asking for it is an error here).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from . import action_head, qwen3vl
from .checkpoint import UNNORM_STEP, GrootCheckpoint, load_groot_checkpoint
from .postprocess import make_decoder, unnormalize_min_max
from .processor import GrootInputs, GrootProcessor, resolve_resize_mode, to_image_batch

Tensor = torch.Tensor


@dataclass
class GrootRtc:
    """Native RTC request: prev_left_over [T, D] or [B, T, D] in normalized model space."""
    prev_left_over: Union[Tensor, np.ndarray]
    inference_delay: int
    execution_horizon: Optional[int] = None


class GrootPolicy:
    def __init__(self, ckpt: GrootCheckpoint, device="cpu", dtype: torch.dtype = torch.float32,
                 resize_mode: str = "auto", embodiment_tag: Optional[str] = None):
        self.ckpt = ckpt
        self.config = ckpt.config
        self.weights = ckpt.weights
        qwen3vl.fuse_projections(self.weights, self.config.text)       # one GEMM where the math allows
        action_head.fuse_projections(self.weights, self.config.head)
        self.device = torch.device(device)
        self.dtype = dtype
        self.resize_mode = resolve_resize_mode(resize_mode, self.device)   # "auto": the policy's device
        p = ckpt.pipelines
        self.processor = GrootProcessor(p.pack, p.pack_state, p.vlm, ckpt.backbone_dir, self.config.tokens.image,
                                        ckpt.camera_keys, self.config.head.max_state_dim)
        self.embodiment_tag = embodiment_tag or p.pack.get("embodiment_tag")
        self.default_embodiment_id = self.processor.embodiment_id(self.embodiment_tag)
        self.decoder = make_decoder(p.post_name, p.post, p.post_state)
        self.relative = p.post_name != UNNORM_STEP or bool(ckpt.lerobot_config.get("use_relative_actions"))

    @classmethod
    def from_files(cls, checkpoint_dir, device="cpu", dtype: torch.dtype = torch.float32,
                   base_model: Optional[str] = None, backbone: Optional[str] = None, resize_mode: str = "auto",
                   embodiment_tag: Optional[str] = None) -> "GrootPolicy":
        """Load a LeRobot GR00T N1.7 checkpoint folder (and the base-model / backbone folders it names)."""
        ckpt = load_groot_checkpoint(checkpoint_dir, device=device, dtype=dtype, base_model=base_model,
                                     backbone=backbone)
        return cls(ckpt, device, dtype, resize_mode, embodiment_tag)

    def use_embodiment(self, value: str) -> None:
        """Act as the embodiment ``value`` names: a tag of the checkpoint's mapping (pack step) or its numeric id;
        anything else is an error listing the valid ones."""
        mapping = {str(t): int(i) for t, i in (self.processor.pack.get("embodiment_mapping") or {}).items()}
        text = str(value).strip()
        tag = next((t for t, i in mapping.items() if text.isdigit() and i == int(text)), text)
        if tag not in mapping:
            valid = ", ".join(f"{t} (id {i})" for t, i in mapping.items()) or "none"
            raise ValueError(f"embodiment {value!r} is not one of the checkpoint's embodiments: {valid} "
                             "(give a tag or its id)")
        self.embodiment_tag, self.default_embodiment_id = tag, mapping[tag]

    # ---------------------------------------------------------------- interface facts
    @property
    def camera_names(self):
        return list(self.processor.cameras)

    @property
    def state_dim(self) -> int:
        return self.processor.state_dim

    @property
    def action_dim(self) -> int:
        env = self.decoder.env_dim
        return int(env) if env else self.config.head.max_action_dim

    @property
    def chunk_size(self) -> int:
        """Actions per chunk: min(action_horizon, the tag's delta_indices, chunk_size, n_action_steps)."""
        lr, h = self.ckpt.lerobot_config, self.config.head.action_horizon
        tags = ((self.ckpt.base_processor.get("processor_kwargs") or {}).get("modality_configs") or {})
        delta = ((tags.get(self.embodiment_tag) or {}).get("action") or {}).get("delta_indices")
        cands = [h] + [int(x) for x in (len(delta) if delta else None, lr.get("chunk_size"),
                                         lr.get("n_action_steps")) if x]
        return min(cands)

    # ---------------------------------------------------------------- stages
    def prepare(self, images: Mapping[str, object], state, tasks: Union[str, Sequence[str]],
                embodiment_id: Optional[Sequence[int]] = None) -> GrootInputs:
        """Raw batch (camera -> uint8 [B, H, W, 3], state [B, D] robot units, one task per item) -> inputs."""
        st = torch.as_tensor(np.asarray(state, dtype=np.float32))
        st = st[None] if st.dim() == 1 else st
        if not bool(torch.isfinite(st).all()):
            raise ValueError(f"state holds {int((~torch.isfinite(st)).sum())} NaN/Inf values")
        tasks = [tasks] * st.shape[0] if isinstance(tasks, str) else list(tasks)
        ids = embodiment_id if embodiment_id is not None else [self.default_embodiment_id] * st.shape[0]
        return self.processor(to_image_batch(images), st, tasks, ids, self.device, self.resize_mode)

    def backbone(self, inputs: GrootInputs, trace: Optional[Dict[str, Tensor]] = None) -> Tensor:
        c = self.config
        return qwen3vl.backbone_features(self.weights, c.vision, c.text, c.tokens.image, inputs.input_ids,
                                         inputs.attention_mask, inputs.pixel_values.to(self.dtype),
                                         inputs.image_grid_thw, trace)

    def context(self, inputs: GrootInputs, features: Tensor,
                trace: Optional[Dict[str, Tensor]] = None) -> action_head.HeadContext:
        return action_head.observation_context(self.weights, self.config.head, features, inputs.attention_mask,
                                               inputs.input_ids == self.config.tokens.image,
                                               inputs.state.to(self.dtype), inputs.embodiment_id, trace)

    def make_noise(self, batch: int, generator: Optional[torch.Generator] = None) -> Tensor:
        h = self.config.head
        return torch.randn(batch, h.action_horizon, h.max_action_dim, generator=generator)

    def _noise(self, noise, batch: int) -> Tensor:
        h = self.config.head
        if noise is None:
            noise = self.make_noise(batch)
        noise = torch.as_tensor(noise, dtype=torch.float32)
        noise = noise[None].expand(batch, -1, -1) if noise.dim() == 2 else noise
        if tuple(noise.shape) != (batch, h.action_horizon, h.max_action_dim):
            raise ValueError(f"noise: expected [{batch}, {h.action_horizon}, {h.max_action_dim}], "
                             f"got {tuple(noise.shape)}")
        return noise.to(self.device, torch.float32)      # x stays float32 through the loop

    def native_rtc(self, rtc: Optional[GrootRtc], batch: int) -> Optional[action_head.NativeRtc]:
        """A checked RTC request (normalized model space) as the head's NativeRtc, or None."""
        if rtc is None:
            return None
        if self.relative:
            raise ValueError("RTC is not available for relative-action checkpoints (LeRobot disables it for them)")
        prev = torch.as_tensor(np.asarray(rtc.prev_left_over, dtype=np.float32)) \
            if not isinstance(rtc.prev_left_over, Tensor) else rtc.prev_left_over.float()
        if not bool(torch.isfinite(prev).all()):
            raise ValueError("RTC prev_left_over holds NaN/Inf values")
        if rtc.inference_delay < 0 or (rtc.execution_horizon is not None and rtc.execution_horizon < 0):
            raise ValueError(f"RTC inference_delay {rtc.inference_delay} / execution_horizon "
                             f"{rtc.execution_horizon} must be >= 0")
        return action_head.native_rtc(prev.to(self.device), rtc.inference_delay, rtc.execution_horizon,
                                      self.config.head, batch)

    @torch.no_grad()
    def sample_actions(self, inputs: GrootInputs, noise=None, rtc: Optional[GrootRtc] = None,
                       trace: Optional[Dict[str, object]] = None) -> Tensor:
        """-> x at t = 1: normalized actions [B, action_horizon, max_action_dim] (LeRobot's action_pred).
        trace (optional dict) receives the backbone / head intermediates and per-step lists."""
        batch = inputs.input_ids.shape[0]
        x0 = self._noise(noise, batch)
        native = self.native_rtc(rtc, batch)
        feats = self.backbone(inputs, trace)
        ctx = self.context(inputs, feats, trace)
        return action_head.sample(self.weights, self.config.head, ctx, x0, native, trace).float()

    def policy_actions(self, actions_model: Tensor) -> Tensor:
        """[B, H, A] -> [B, chunk_size, action_dim] (LeRobot's predict_action_chunk, still normalized)."""
        return actions_model[:, :self.chunk_size, :self.action_dim]

    def decode(self, actions_model: Tensor, inputs: GrootInputs) -> Tensor:
        """Normalized model actions -> robot units [B, chunk_size, action_dim] (the postprocessor)."""
        return self.decoder(self.policy_actions(actions_model), inputs.raw_state)

    def normalize_actions(self, actions: Tensor) -> Tensor:
        """Robot units -> normalized model space (absolute-action checkpoints), for RTC's previous chunk."""
        if self.relative:
            raise ValueError("relative-action checkpoints have no inverse action normalization")
        lo, hi = self.decoder.lo.to(actions.device), self.decoder.hi.to(actions.device)
        span = torch.where(hi == lo, torch.ones_like(hi), hi - lo)
        return torch.where(hi == lo, torch.zeros_like(actions), 2 * (actions.float() - lo) / span - 1)

    # ---------------------------------------------------------------- node API (batch 1)
    def predict(self, images: Mapping[str, object], state: np.ndarray, task: str, noise=None,
                rtc: Optional[GrootRtc] = None) -> np.ndarray:
        """One observation -> [chunk_size, action_dim] float32 in robot units. rtc.prev_left_over in robot
        units here ([n, action_dim]); it is normalized with the action stats."""
        inputs = self.prepare(images, np.asarray(state, dtype=np.float32)[None], [task])
        if rtc is not None:
            prev = self.normalize_actions(torch.as_tensor(np.asarray(rtc.prev_left_over, dtype=np.float32)))
            rtc = GrootRtc(prev, rtc.inference_delay, rtc.execution_horizon)
        actions = self.decode(self.sample_actions(inputs, noise, rtc), inputs)
        return actions[0].float().cpu().numpy()


__all__ = ["GrootPolicy", "GrootRtc", "GrootInputs", "unnormalize_min_max"]
