"""pi0.5 network as stateless stage functions over loaded weights.

Why stages: the runner executes them under CUDA graphs with static buffers, so each stage has static
shapes, no host syncs and no data-dependent Python control flow:

  embed_images(images [B,S,3,224,224]) -> [B,S*256,Wv]  (frames alone: it runs while the prompt is built)
  join_prefix(image_embs, image_masks [B,S], tokens [B,L], token_masks [B,L])
      -> prefix_embs [B,P,Wv], prefix_pad [B,P]          (P = S*256 + L; masked slots/tokens are computed too)
  embed_prefix(images, image_masks, tokens, token_masks) = join_prefix(embed_images(images), ...)
  prefix_kv(prefix_embs, prefix_pad) -> [(k, v)] per VLM layer, [B,Hkv,P,hd], keys after RoPE
      (the cache every denoising step reuses; valid until the observation changes)
  time_modulation(t [N]) -> [N, 2*depth+1, 3, We] float32 adaRMS (scale, shift, gate) per expert norm
      (order: layer0 input, layer0 post-attn, layer1 input, ..., final norm); depends on t only, so it is
      precomputed for all solver steps before the loop
  suffix_context(prefix_pad) -> SuffixContext (suffix attention mask and RoPE tables; once per observation)
  denoise_velocity(x_t [B,H,A], kv, prefix_pad, t=None | modulation=..., ctx=None) -> v [B,H,A] float32

Precision: weights in `dtype` (float32 or bfloat16) except norm parameters (RMS/LayerNorm vectors, adaRMS
dense layers) and the small action/time projections, which stay float32; norms and softmax run in float32;
x_t and v are float32. Math follows LeRobot 0.6.1 / openpi pi0.5 (see the parity fixture README).
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

from .config import Pi05Config

Tensor = torch.Tensor
__all__ = ["Pi05Model", "SuffixContext", "PrefixKV", "prefix_positions"]


class Pi05Model(PaliGemmaPrefix):
    """embed_prefix / prefix_kv come from PaliGemmaPrefix (shared with pi0); the rest is the pi0.5 expert."""

    def __init__(self, cfg: Pi05Config, dtype: torch.dtype = torch.float32, device=None):
        super().__init__(cfg, dtype, device)
        f32 = torch.float32
        e = lambda shape, dt=dtype: torch.empty(shape, dtype=dt, device=device)  # noqa: E731
        x = cfg.expert
        self.expert_layers = nn.ModuleList(GemmaLayer(x, dtype, device, cond_dim=x.width) for _ in range(x.depth))
        self.register_buffer("final_norm_dense_w", e((3 * x.width, x.width), f32))
        self.register_buffer("final_norm_dense_b", e((3 * x.width,), f32))
        self.register_buffer("action_in_w", e((x.width, cfg.max_action_dim), f32))
        self.register_buffer("action_in_b", e((x.width,), f32))
        self.register_buffer("action_out_w", e((cfg.max_action_dim, x.width), f32))
        self.register_buffer("action_out_b", e((cfg.max_action_dim,), f32))
        self.register_buffer("time_in_w", e((x.width, x.width), f32))
        self.register_buffer("time_in_b", e((x.width,), f32))
        self.register_buffer("time_out_w", e((x.width, x.width), f32))
        self.register_buffer("time_out_b", e((x.width,), f32))
        self.register_buffer("expert_inv_freq", rope_inv_freq(x, device))

    # ------------------------------------------------------------------ time conditioning
    def adarms_cond(self, t: Tensor) -> Tensor:
        """t [N] -> silu(time_mlp_out(silu(time_mlp_in(sincos(t))))) [N, We] float32."""
        emb = sinusoidal_time_embedding(t.reshape(-1), self.cfg.expert.width, self.cfg.min_period,
                                        self.cfg.max_period)
        h = ops.silu(ops.linear(emb, self.time_in_w, self.time_in_b))
        return ops.silu(ops.linear(h, self.time_out_w, self.time_out_b))

    def time_modulation(self, t: Tensor) -> Tensor:
        """t [N] -> adaRMS modulation [N, 2*depth+1, 3, We] float32 (see module docstring for the order)."""
        cond = self.adarms_cond(t)
        mods = []
        for layer in self.expert_layers:
            mods.append(ops.linear(cond, layer.in_norm_dense_w, layer.in_norm_dense_b))
            mods.append(ops.linear(cond, layer.post_norm_dense_w, layer.post_norm_dense_b))
        mods.append(ops.linear(cond, self.final_norm_dense_w, self.final_norm_dense_b))
        n, w = cond.shape
        return torch.stack(mods, dim=1).view(n, len(mods), 3, w)

    # ------------------------------------------------------------------ runner-facing stage API (shared with pi0)
    def prefix_state(self, prefix_embs: Tensor, prefix_pad: Tensor, state_padded: Optional[Tensor] = None):
        """What every denoising step of one observation reuses: (prefix KV, suffix context). The state is
        already in the prompt for pi0.5, so state_padded is unused."""
        return self.prefix_kv(prefix_embs, prefix_pad), self.suffix_context(prefix_pad)

    def step_tables(self, t_table: Tensor) -> Tensor:
        """Per-step time conditioning computed before the loop: the adaRMS modulation of every norm."""
        return self.time_modulation(t_table)

    def velocity(self, x_t: Tensor, prefix_state, table: Tensor) -> Tensor:
        kv, ctx = prefix_state
        return self.denoise_velocity(x_t, kv, ctx=ctx, modulation=table)

    # ------------------------------------------------------------------ denoising
    def embed_actions(self, x_t: Tensor) -> Tensor:
        """Action tokens: action_in_proj(x_t) [B,H,We] (float32 projection, cast to the model dtype)."""
        return ops.linear(x_t.to(torch.float32), self.action_in_w, self.action_in_b).to(self.dtype)

    def suffix_context(self, prefix_pad: Tensor) -> SuffixContext:
        """Action tokens see every valid prefix token and all action tokens; positions continue after the
        valid prefix tokens."""
        return suffix_context(prefix_pad, self.cfg.chunk_size, 0, self.expert_inv_freq, self.dtype)

    def denoise_velocity(self, x_t: Tensor, kv: PrefixKV, prefix_pad: Optional[Tensor] = None, *,
                         t: Optional[Tensor] = None, modulation: Optional[Tensor] = None,
                         ctx: Optional[SuffixContext] = None) -> Tensor:
        """Velocity v(x_t, t) [B,H,A] float32. Give either t [B] or precomputed modulation
        ([2*depth+1, 3, We] shared by the batch, [B, ...], or per token [B, 2*depth+1, 3, H, We]); give ctx
        or prefix_pad."""
        cfg = self.cfg.expert
        if ctx is None:
            ctx = self.suffix_context(prefix_pad)
        if modulation is None:
            modulation = self.time_modulation(t)
        if modulation.dim() == 3:
            modulation = modulation.unsqueeze(0)
        # [B|1, 2*depth+1, 3, 1, We], or per token [B, 2*depth+1, 3, H, We] (training-time RTC)
        mod = modulation if modulation.dim() == 5 else modulation.unsqueeze(3)
        n = len(self.expert_layers)
        assert mod.shape[1] == 2 * n + 1
        h = self.embed_actions(x_t)
        # The expert's layers as one op (layers/expert_stack.py): the norm before each sublayer (adaRMS), the
        # gated residuals, and the final norm; few kernels per layer where they run, else op by op.
        x = dispatch.expert_stack(h, self.expert_layers, kv, ctx, ExpertNorms(mod=mod), cfg.rms_eps)
        return ops.linear(x.to(torch.float32), self.action_out_w, self.action_out_b)
