"""Attention mask and RoPE tables of the action-expert suffix (pi0 / pi0.5), computed once per observation.

Why: the suffix queries attend to [valid prefix tokens, suffix tokens]; within the suffix LeRobot's
cumsum rule gives a block structure: pi0.5's 50 action tokens see each other; pi0's leading state token
sees only the prefix and itself, its action tokens see everything. Positions continue after the number of
valid prefix tokens. None of this depends on t or x_t, so it is built outside the denoising loop.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from phyai_ros.layers import ops

Tensor = torch.Tensor


class SuffixContext(NamedTuple):
    """additive mask [B,1,T,P+T], RoPE cos/sin [B,T,hd] for the T suffix tokens."""
    mask: Tensor
    cos: Tensor
    sin: Tensor


def suffix_context(prefix_pad: Tensor, n_actions: int, n_state_tokens: int, inv_freq: Tensor,
                   dtype: torch.dtype) -> SuffixContext:
    """n_state_tokens leading tokens (pi0: 1, pi0.5: 0) that see only the prefix and themselves."""
    b, p = prefix_pad.shape
    t = n_state_tokens + n_actions
    dev = prefix_pad.device
    pos = prefix_pad.long().sum(dim=1, keepdim=True) + torch.arange(t, device=dev)[None, :]
    cos, sin = ops.rope_cos_sin(pos, inv_freq, dtype)
    q = torch.arange(t, device=dev)
    # cumsum of the att marks [1]*n_state + [1] + [0]*(n_actions-1): block id per token.
    block = torch.minimum(q, torch.full_like(q, n_state_tokens))
    suffix_ok = (block[None, :] <= block[:, None]).expand(b, t, t)
    allowed = torch.cat([prefix_pad[:, None, :].expand(b, t, p), suffix_ok], dim=2)
    return SuffixContext(ops.bool_to_additive_mask(allowed), cos, sin)
