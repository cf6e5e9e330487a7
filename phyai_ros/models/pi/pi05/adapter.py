"""pi0.5 policy adapter: robot observation in, action chunk out.

Owns policy semantics on top of the stateless model stages (modeling.py): image / state / prompt
preprocessing, normalization, the solver request (Euler, RTC guidance), action conversion and checkpoint
loading. It samples through the runtime's FlowRunner (`policy.runner`, which holds the stage order: eager
buffers by default, CUDA graphs after `use_runner(use_graphs=True)`) and picks no kernels.

API used by the onboard node (batch 1, numpy in / numpy out)::

    policy = Pi05Adapter.from_files(checkpoint_dir, tokenizer_path, norm_stats_path, camera_names,
                                   device="cpu", dtype=torch.float32, action_dim=None)
    actions = policy.predict(images={"base_0_rgb": rgb_uint8_HxWx3, "left_wrist_0_rgb": None, ...},
                             state=np.float32[state_dim], task="pick up the cup",
                             noise=None,                     # or a tensor [H, 32] / [1, H, 32] (x at t=1)
                             rtc=make_request(prev_left_over_robot_units, 3, mode="guided",
                                              schedule="linear", horizon=H))   # phyai_ros.control.rtc
    # -> np.float32 [H, action_dim], UNNORMALIZED (robot units)

- images: camera name -> uint8 HxWx3 RGB (any size: resized with pad to 224x224) or None / missing when
  that camera has no frame (its slot is masked). At least one camera is required; unknown names are an
  error. Slot order follows the checkpoint's config (present cameras first, then absent, as LeRobot).
- state: raw robot units, length state_dim, finite. task: non-empty text.
- A prompt longer than the token budget has its task cut to fit (LeRobot cuts the prompt's tail, which
  here is the state: the model would act blind to it); a PromptTruncatedWarning is issued.
- RTC: the control loop's `RtcRequest` (phyai_ros/control/rtc.py): `prefix` Y is the previous chunk's
  not-yet-executed actions in UNNORMALIZED robot units (what the node holds); the adapter normalizes them
  with the action statistics (`request_tensors`). The tensor-level path (`sample_actions` with the solver's
  `RtcTensors` from `rtc_tensors`) takes them already normalized (as the LeRobot fixtures do).
  d: leading actions frozen to the old chunk (weight 1); beyond len(Y) (LeRobot's execution horizon)
  actions are free (weight 0); in between the schedule ramps ('linear' or 'exp'). Modes: `rtc_modes`.
- Errors: ValueError for bad inputs (image dtype/shape, state length, NaN/inf, empty task, bad noise / RTC
  shapes); FileNotFoundError / CheckpointError at load time.

Batched tensor-level path (parity tests, offline prediction, rollouts):
`prepare(images_batched, state [B, D], tasks) -> Pi05Inputs`, `sample_actions(inputs, noise, rtc) ->
normalized padded actions [B, H, 32]`, `predict_batch(...) -> unnormalized [B, H, action_dim]`.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from phyai_ros.models.pi.normalize import ACTION, STATE, QuantileNormalizer, load_norm_stats
from phyai_ros.models.pi.policy import (FlowAdapter, PolicyInputs, PromptTruncatedWarning, check_dims,
                                            resolve_cameras)
from phyai_ros.models.pi.tokenizer import PromptTokenizer

from .checkpoint import load_pi05_checkpoint, make_random_checkpoint
from .config import Pi05Config
from .preprocess import prompt_parts

Tensor = torch.Tensor
Pi05Inputs = PolicyInputs

__all__ = ["Pi05Adapter", "Pi05Inputs", "PromptTruncatedWarning"]


class Pi05Adapter(FlowAdapter):
    family = "pi05"
    checkpoint_types = ("pi05", "")          # "": a config.json that names no type (the parity fixtures')
    config_class = Pi05Config
    checkpoint_loader = staticmethod(load_pi05_checkpoint)
    random_checkpoint_writer = staticmethod(make_random_checkpoint)

    @classmethod
    def from_files(cls, checkpoint_dir, tokenizer_path, norm_stats_path=None,
                   camera_names: Optional[Sequence[str]] = None, device="cpu", dtype: torch.dtype = torch.float32,
                   action_dim: Optional[int] = None, dims=None) -> "Pi05Adapter":
        """Load checkpoint (LeRobot layout), tokenizer (SentencePiece .model) and normalization stats
        (norm_stats.json / normalizer .safetensors; default: the normalizer file in checkpoint_dir).

        camera_names: the cameras the caller will provide, a subset of the checkpoint's VISUAL features
        (prefix 'observation.images.' optional); None = all of them. Slots the caller never provides stay
        masked. action_dim: override for the number of real action dims (default: config / stats).
        dims: model sizes (model_dims.json path / dict / Pi05Config) when the checkpoint dir has none."""
        ckpt = load_pi05_checkpoint(checkpoint_dir, device=device, dtype=dtype, dims=dims)
        tok = PromptTokenizer(tokenizer_path, ckpt.config.token_budget)
        stats = load_norm_stats(norm_stats_path if norm_stats_path is not None else checkpoint_dir)
        state_norm = QuantileNormalizer.from_stats(stats, STATE)
        action_norm = QuantileNormalizer.from_stats(stats, ACTION)
        check_dims(ckpt.state_dim, ckpt.action_dim, state_norm, action_norm, action_dim)
        slots = resolve_cameras(ckpt.camera_keys, camera_names)
        return cls(ckpt.model, tok, state_norm, action_norm, slots, device=device, dtype=dtype)

    def prompt_parts(self, tasks: List[str], state_normalized: np.ndarray) -> List[Tuple[str, str, str]]:
        return prompt_parts(tasks, state_normalized)
