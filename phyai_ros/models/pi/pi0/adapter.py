"""pi0 policy adapter: same node-facing API as pi0.5 (see pi05/adapter.py), with pi0's semantics:
mean/std normalization, prompt = task + '\n' (no other cleaning, no state in the prompt), 48-token budget,
and the normalized state (zero-padded to 32 dims) fed as one suffix token. An over-long task cannot cut
the state here; it is cut before its closing '\n' (which LeRobot's cut would drop), as pi0.5's is.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from phyai_ros.models.pi.normalize import ACTION, STATE, MeanStdNormalizer, load_norm_stats
from phyai_ros.models.pi.policy import FlowAdapter, PromptTruncatedWarning, check_dims, resolve_cameras
from phyai_ros.models.pi.tokenizer import PromptTokenizer

from .checkpoint import load_pi0_checkpoint, make_random_checkpoint
from .config import Pi0Config

Tensor = torch.Tensor
__all__ = ["Pi0Adapter", "PromptTruncatedWarning", "pi0_prompt"]


def pi0_prompt(task: str) -> str:
    return task if task.endswith("\n") else task + "\n"


class Pi0Adapter(FlowAdapter):
    family = "pi0"
    checkpoint_types = ("pi0",)
    config_class = Pi0Config
    checkpoint_loader = staticmethod(load_pi0_checkpoint)
    random_checkpoint_writer = staticmethod(make_random_checkpoint)

    @classmethod
    def from_files(cls, checkpoint_dir, tokenizer_path, norm_stats_path=None,
                   camera_names: Optional[Sequence[str]] = None, device="cpu", dtype: torch.dtype = torch.float32,
                   action_dim: Optional[int] = None, dims=None) -> "Pi0Adapter":
        """As Pi05Adapter.from_files; stats need mean/std for observation.state and action."""
        ckpt = load_pi0_checkpoint(checkpoint_dir, device=device, dtype=dtype, dims=dims)
        tok = PromptTokenizer(tokenizer_path, ckpt.config.token_budget)
        stats = load_norm_stats(norm_stats_path if norm_stats_path is not None else checkpoint_dir)
        state_norm = MeanStdNormalizer.from_stats(stats, STATE)
        action_norm = MeanStdNormalizer.from_stats(stats, ACTION)
        check_dims(ckpt.state_dim, ckpt.action_dim, state_norm, action_norm, action_dim)
        if state_norm.dim > ckpt.config.max_state_dim:
            raise ValueError(f"state dim {state_norm.dim} > max_state_dim {ckpt.config.max_state_dim}")
        slots = resolve_cameras(ckpt.camera_keys, camera_names)
        return cls(ckpt.model, tok, state_norm, action_norm, slots, device=device, dtype=dtype)

    def prompt_parts(self, tasks: List[str], state_normalized: np.ndarray) -> List[Tuple[str, str, str]]:
        return [("", pi0_prompt(t)[:-1], "\n") for t in tasks]
