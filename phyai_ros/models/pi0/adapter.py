"""pi0 policy adapter: same node-facing API as pi0.5 (see pi05/adapter.py), with pi0's semantics:
mean/std normalization, prompt = task + '\n' (no other cleaning, no state in the prompt), 48-token budget,
and the normalized state (zero-padded to 32 dims) fed as one suffix token. An over-long task cannot cut
the state here; it is cut before its closing '\n' (which LeRobot's cut would drop), as pi0.5's is.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from phyai_ros.models.common import solver
from phyai_ros.models.common.normalize import ACTION, STATE, MeanStdNormalizer, load_norm_stats
from phyai_ros.models.common.policy import (FlowPolicy, PolicyInputs, PromptTruncatedWarning, RtcParams,
                                            RtcRequest, check_dims, resolve_cameras)
from phyai_ros.models.common.tokenizer import PromptTokenizer

from .checkpoint import load_pi0_checkpoint

Tensor = torch.Tensor
__all__ = ["Pi0Policy", "RtcRequest", "RtcParams", "PromptTruncatedWarning", "pi0_prompt"]


def pi0_prompt(task: str) -> str:
    return task if task.endswith("\n") else task + "\n"


class Pi0Policy(FlowPolicy):
    @classmethod
    def from_files(cls, checkpoint_dir, tokenizer_path, norm_stats_path=None,
                   camera_names: Optional[Sequence[str]] = None, device="cpu", dtype: torch.dtype = torch.float32,
                   action_dim: Optional[int] = None, dims=None) -> "Pi0Policy":
        """As Pi05Policy.from_files; stats need mean/std for observation.state and action."""
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

    @torch.no_grad()
    def sample_actions(self, inputs: PolicyInputs, noise=None, rtc: Optional[RtcParams] = None,
                       trace: Optional[Dict[str, list]] = None) -> Tensor:
        """prefix embed -> prefix KV -> state token, time table, suffix context -> Euler loop (optional RTC)."""
        m = self.model
        batch = inputs.tokens.shape[0]
        x0 = self._noise(noise, batch)
        embs, pad = m.embed_prefix(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_masks)
        kv = m.prefix_kv(embs, pad)
        state_emb = m.embed_state(self.state_padded(inputs))
        t_table, _ = solver.euler_schedule(self.config.num_steps, device=self.device)
        tbias = m.time_bias(t_table)
        ctx = m.suffix_context(pad)
        guide = self.rtc_guide(rtc, batch) if rtc is not None else None
        tbias_data = m.time_bias(torch.zeros(1, device=self.device))[0] if guide and guide.mode == "trained" \
            else None

        def velocity(x, k, frozen=None):
            tb = tbias[k] if frozen is None else solver.per_token(tbias[k], tbias_data, frozen, x.shape[0])
            return m.denoise_velocity(x, kv, state_emb, ctx=ctx, time_bias=tb)

        return solver.sample(velocity, x0, self.config.num_steps, guide, trace, t_table)
