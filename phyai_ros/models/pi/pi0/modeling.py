"""pi0 network as stateless stage functions (prefix shared with pi0.5 via PaliGemmaPrefix).

  embed_images / join_prefix / prefix_kv      as pi0.5 (models/pi/modeling/paligemma.py)
  embed_state(state_padded [B,32]) -> [B,1,We] the state token (once per observation)
  time_bias(t [N]) -> [N,We]                   time half of action_time_mlp_in: W_t sincos(t) + b; depends on
                                               t only, so the runner precomputes it for all solver steps
  suffix_context(prefix_pad) -> SuffixContext  51 suffix tokens: the state token sees prefix + itself, the
                                               50 action tokens see prefix + all suffix tokens
  denoise_velocity(x_t [B,H,A], kv, state_emb, prefix_pad=None, *, t=None | time_bias=..., ctx=None)
      -> v [B,H,A] float32

action_time_mlp_in's weight [We, 2We] is split at load time into its action and time halves, so the time
half is one precomputed vector per step instead of a GEMM over 50 tokens (same math, LeRobot concatenates
[action_emb, time_emb] first). Expert norms are plain Gemma RMSNorms. Precision policy as pi0.5.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from phyai_ros.layers import dispatch, ops
from phyai_ros.layers.expert_stack import ExpertNorms
from phyai_ros.models.pi.modeling.gemma import GemmaLayer, rope_inv_freq
from phyai_ros.models.pi.modeling.paligemma import PaliGemmaPrefix, PrefixKV, prefix_positions
from phyai_ros.models.pi.modeling.suffix import SuffixContext, suffix_context
from phyai_ros.models.pi.modeling.time_embedding import sinusoidal_time_embedding

from .config import Pi0Config

Tensor = torch.Tensor
__all__ = ["Pi0Model", "SuffixContext", "PrefixKV", "prefix_positions"]


class Pi0Model(PaliGemmaPrefix):
    def __init__(self, cfg: Pi0Config, dtype: torch.dtype = torch.float32, device=None):
        super().__init__(cfg, dtype, device)
        e = lambda shape: torch.empty(shape, dtype=torch.float32, device=device)  # noqa: E731
        x, w = cfg.expert, cfg.expert.width
        self.expert_layers = nn.ModuleList(GemmaLayer(x, dtype, device) for _ in range(x.depth))
        self.register_buffer("final_norm_w", e((w,)))
        self.register_buffer("state_w", e((w, cfg.max_state_dim)))
        self.register_buffer("state_b", e((w,)))
        self.register_buffer("action_in_w", e((w, cfg.max_action_dim)))
        self.register_buffer("action_in_b", e((w,)))
        self.register_buffer("action_out_w", e((cfg.max_action_dim, w)))
        self.register_buffer("action_out_b", e((cfg.max_action_dim,)))
        self.register_buffer("atm_in_action_w", e((w, w)))
        self.register_buffer("atm_in_time_w", e((w, w)))
        self.register_buffer("atm_in_b", e((w,)))
        self.register_buffer("atm_out_w", e((w, w)))
        self.register_buffer("atm_out_b", e((w,)))
        self.register_buffer("expert_inv_freq", rope_inv_freq(x, device))

    # ------------------------------------------------------------------ runner-facing stage API (shared with pi0.5)
    def prefix_state(self, prefix_embs: Tensor, prefix_pad: Tensor, state_padded: Tensor):
        """What every denoising step of one observation reuses: (prefix KV, suffix context, state token)."""
        return (self.prefix_kv(prefix_embs, prefix_pad), self.suffix_context(prefix_pad),
                self.embed_state(state_padded))

    def step_tables(self, t_table: Tensor) -> Tensor:
        """Per-step time conditioning computed before the loop: the time half of action_time_mlp_in."""
        return self.time_bias(t_table)

    def velocity(self, x_t: Tensor, prefix_state, table: Tensor) -> Tensor:
        kv, ctx, state_emb = prefix_state
        return self.denoise_velocity(x_t, kv, state_emb, ctx=ctx, time_bias=table)

    def embed_state(self, state_padded: Tensor) -> Tensor:
        """Normalized state zero-padded to max_state_dim [B, 32] -> state token [B, 1, We] (float32)."""
        return ops.linear(state_padded.to(torch.float32), self.state_w, self.state_b)[:, None, :]

    def time_bias(self, t: Tensor) -> Tensor:
        """t [N] -> [N, We] float32: the time half of action_time_mlp_in plus its bias."""
        emb = sinusoidal_time_embedding(t.reshape(-1), self.cfg.expert.width, self.cfg.min_period,
                                        self.cfg.max_period)
        return ops.linear(emb, self.atm_in_time_w, self.atm_in_b)

    def suffix_context(self, prefix_pad: Tensor) -> SuffixContext:
        return suffix_context(prefix_pad, self.cfg.chunk_size, 1, self.expert_inv_freq, self.dtype)

    def embed_suffix(self, x_t: Tensor, state_emb: Tensor, time_bias: Tensor) -> Tensor:
        """[state token, action_time_mlp_out(silu(W_a action_in_proj(x_t) + time_bias))] -> [B, 1+H, We] float32.
        time_bias: [We] (shared by the batch), [B, We], or per token [B, H, We]."""
        a = ops.linear(x_t.to(torch.float32), self.action_in_w, self.action_in_b)
        tb = time_bias if time_bias.dim() >= 2 else time_bias[None]
        tb = tb if tb.dim() == 3 else tb[:, None, :]   # per token [B, H, We] (training-time RTC) as given
        h = ops.silu(ops.linear(a, self.atm_in_action_w) + tb)
        h = ops.linear(h, self.atm_out_w, self.atm_out_b)
        return torch.cat([state_emb.expand(h.shape[0], -1, -1), h], dim=1)

    def denoise_velocity(self, x_t: Tensor, kv: PrefixKV, state_emb: Tensor, prefix_pad: Optional[Tensor] = None,
                         *, t: Optional[Tensor] = None, time_bias: Optional[Tensor] = None,
                         ctx: Optional[SuffixContext] = None) -> Tensor:
        """Velocity [B,H,A] float32. Give t [B] or a precomputed time_bias ([We] or [B, We]); ctx or prefix_pad."""
        cfg = self.cfg.expert
        if ctx is None:
            ctx = self.suffix_context(prefix_pad)
        if time_bias is None:
            time_bias = self.time_bias(t)
        h = self.embed_suffix(x_t, state_emb, time_bias).to(self.dtype)
        layers = self.expert_layers
        # The expert's layers as one op (layers/expert_stack.py): plain Gemma RMSNorms (input, post-attention,
        # ..., final), residuals ungated; few kernels per layer where they run, else op by op. The final norm
        # is per row, so the state token's row is dropped after it.
        norms = ExpertNorms(weights=(*(w for la in layers for w in (la.in_norm_w, la.post_norm_w)),
                                     self.final_norm_w))
        x = dispatch.expert_stack(h, layers, kv, ctx, norms, cfg.rms_eps)[:, -self.cfg.chunk_size:].contiguous()
        return ops.linear(x.to(torch.float32), self.action_out_w, self.action_out_b)
