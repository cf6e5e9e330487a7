"""Stateless GR00T N1.7 action head: VL adapter, embodiment-specific encoders / decoder, AlternateVLDiT and
the flow solver (4 Euler steps, 1000-bucket timesteps, native RTC).

Conventions that differ from pi0 / pi0.5 (each a silent error if swapped):
- time runs 0 (noise) -> 1 (data); the networks see the integer bucket int(k / N * buckets);
- two sinusoidal embeddings: the action encoder's [sin, cos] with exponent / half, the DiT timestep's
  [cos, sin] (256 channels) with exponent / (half - 1);
- the blocks' AdaLayerNorm chunks (scale, shift), the output layer (shift, scale);
- embodiment layers pick their weights per batch item;
- the VL self-attention is unmasked (left-pad rows take part); DiT cross-attention masks pads, and even
  blocks attend to text or image tokens by block index.
What depends on the observation only (VL tokens, state token, every cross-attention K/V) and on the step
only (timestep embeddings) is computed once per call, before the loop (`HeadContext`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from .checkpoint import DIT, HEAD, VLSA
from .config import HeadConfig
from .qwen3vl import Trace, Weights, _record, layer_norm, linear

Tensor = torch.Tensor
ATTN_EPS = 1e-5
OUT_EPS = 1e-6
TIMESTEP_CHANNELS = 256


# ------------------------------------------------------------------ small pieces
def category_linear(x: Tensor, w: Weights, name: str, ids: Tensor) -> Tensor:
    """x [B, T, in] @ W[id] + b[id], one embodiment id per batch item."""
    return torch.bmm(x, w[name + ".W"][ids]) + w[name + ".b"][ids][:, None]


def category_mlp(x: Tensor, w: Weights, name: str, ids: Tensor) -> Tensor:
    return category_linear(F.relu(category_linear(x, w, name + ".layer1", ids)), w, name + ".layer2", ids)


def feed_forward(x: Tensor, w: Weights, b: str) -> Tensor:
    return linear(F.gelu(linear(x, w, b + "ff.net.0.proj"), approximate="tanh"), w, b + "ff.net.2")


def heads(x: Tensor, n: int) -> Tensor:
    """[B, T, n*d] -> [B, n, T, d]."""
    b, t, _ = x.shape
    return x.view(b, t, n, -1).transpose(1, 2)


def attend(x: Tensor, w: Weights, b: str, n_heads: int, kv: Tuple[Tensor, Tensor], mask: Optional[Tensor]) -> Tensor:
    """attn1 with precomputed K/V [B, n, Tk, d]; mask [B, Tk] bool (True = attend) or None."""
    q = heads(linear(x, w, b + "attn1.to_q"), n_heads)
    a = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=None if mask is None else mask[:, None, None])
    bsz, h, t, d = a.shape
    return linear(a.transpose(1, 2).reshape(bsz, t, h * d), w, b + "attn1.to_out.0")


def kv_of(src: Tensor, w: Weights, b: str, n_heads: int) -> Tuple[Tensor, Tensor]:
    return heads(linear(src, w, b + "attn1.to_k"), n_heads), heads(linear(src, w, b + "attn1.to_v"), n_heads)


# ------------------------------------------------------------------ VL adapter and state
def vl_tokens(w: Weights, h: HeadConfig, features: Tensor, trace: Trace = None) -> Tensor:
    """Backbone features -> vlln -> VL self-attention blocks (no mask: pad rows take part)."""
    x = layer_norm(features, w, HEAD + "vlln", ATTN_EPS) if h.use_vlln else features
    _record(trace, "vlln", x)
    for i in range(h.vlsa_layers):
        b = f"{VLSA}{i}."
        y = layer_norm(x, w, b + "norm1", ATTN_EPS)
        x = x + attend(y, w, b, h.vlsa_heads, kv_of(y, w, b, h.vlsa_heads), None)
        x = x + feed_forward(layer_norm(x, w, b + "norm3", ATTN_EPS), w, b)
    _record(trace, "vl_self_attention", x)
    return x


def state_token(w: Weights, state: Tensor, ids: Tensor) -> Tensor:
    """[B, 1, max_state_dim] -> [B, 1, input_embedding_dim]."""
    return category_mlp(state, w, HEAD + "state_encoder", ids)


# ------------------------------------------------------------------ time
def timestep_buckets(h: HeadConfig) -> List[int]:
    """int(k / N * buckets) for k = 0..N-1 (Python float, truncated: N = 3 gives 0, 333, 666)."""
    return [int(k / float(h.num_steps) * h.num_timestep_buckets) for k in range(h.num_steps)]


def action_time_embedding(t: Tensor, dim: int) -> Tensor:
    """Action encoder's sinusoid of the integer t [B, T]: [sin, cos], exponent over half."""
    half = dim // 2
    exponent = -torch.arange(half, dtype=torch.float, device=t.device) * (torch.log(torch.tensor(10000.0)) / half)
    freqs = t.float()[..., None] * exponent.exp()
    return torch.cat([freqs.sin(), freqs.cos()], dim=-1)


def dit_time_embedding(w: Weights, t: Tensor) -> Tensor:
    """DiT timestep embedding [B] -> [B, C]: diffusers' flipped sinusoid (cos first, shift 1), then the MLP."""
    half = TIMESTEP_CHANNELS // 2
    exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32, device=t.device) / (half - 1)
    arg = t[:, None].float() * torch.exp(exponent)[None]
    emb = torch.cat([arg.cos(), arg.sin()], dim=-1)
    b = DIT + "timestep_encoder.timestep_embedder."
    return linear(F.silu(linear(emb.to(w[b + "linear_1.weight"].dtype), w, b + "linear_1")), w, b + "linear_2")


def action_features(w: Weights, h: HeadConfig, x: Tensor, t: Tensor, ids: Tensor) -> Tensor:
    """x [B, H, A] at bucket t [B] -> [B, H, E] (before the position embedding)."""
    e = h.input_embedding_dim
    a = category_linear(x, w, HEAD + "action_encoder.W1", ids)
    tau = action_time_embedding(t[:, None].expand(-1, x.shape[1]), e).to(a.dtype)
    y = F.silu(category_linear(torch.cat([a, tau], dim=-1), w, HEAD + "action_encoder.W2", ids))
    return category_linear(y, w, HEAD + "action_encoder.W3", ids)


# ------------------------------------------------------------------ DiT
@dataclass
class HeadContext:
    """Per-observation constants of the denoising loop."""
    state: Tensor                         # [B, 1, E] state token
    cross_kv: Dict[int, Tuple[Tensor, Tensor]]  # even block index -> K/V of the VL tokens
    masks: Dict[int, Tensor]              # even block index -> [B, L] bool (text or image tokens, valid only)
    ids: Tensor                           # [B] embodiment ids


def head_context(w: Weights, h: HeadConfig, vl: Tensor, attention_mask: Tensor, image_mask: Tensor,
                 state: Tensor, ids: Tensor) -> HeadContext:
    valid = attention_mask.bool()
    text, image = valid & ~image_mask, valid & image_mask
    kv, masks = {}, {}
    for i in range(0, h.dit_layers, 2):
        b = f"{DIT}transformer_blocks.{i}."
        kv[i] = kv_of(vl, w, b, h.dit_heads)
        masks[i] = text if i % (2 * h.attend_text_every_n_blocks) == 0 else image
    return HeadContext(state_token(w, state, ids), kv, masks, ids)


def dit(w: Weights, h: HeadConfig, x: Tensor, temb: Tensor, ctx: HeadContext) -> Tensor:
    """AlternateVLDiT: odd blocks self-attend over [state, actions], even blocks cross-attend to the VL tokens;
    AdaLayerNorm (scale, shift) before attention, plain LayerNorm before the GELU MLP; output layer (shift,
    scale) then proj_out_2."""
    cond = F.silu(temb)
    for i in range(h.dit_layers):
        b = f"{DIT}transformer_blocks.{i}."
        scale, shift = linear(cond, w, b + "norm1.linear").chunk(2, dim=-1)
        y = layer_norm(x, None, None, ATTN_EPS) * (1 + scale[:, None]) + shift[:, None]
        kv = ctx.cross_kv[i] if i % 2 == 0 else kv_of(y, w, b, h.dit_heads)
        x = x + attend(y, w, b, h.dit_heads, kv, ctx.masks.get(i))
        x = x + feed_forward(layer_norm(x, None, None, ATTN_EPS), w, b)
    shift, scale = linear(cond, w, DIT + "proj_out_1").chunk(2, dim=-1)
    x = layer_norm(x, None, None, OUT_EPS) * (1 + scale[:, None]) + shift[:, None]
    return linear(x, w, DIT + "proj_out_2")


def velocity(w: Weights, h: HeadConfig, x: Tensor, t: Tensor, temb: Tensor, ctx: HeadContext,
             trace: Optional[Dict[str, list]] = None) -> Tensor:
    """One network evaluation: x [B, H, A] at bucket t -> velocity [B, H, A]."""
    a = action_features(w, h, x, t, ctx.ids)
    pos = w[HEAD + "position_embedding.weight"][:x.shape[1]] if h.add_pos_embed else 0
    sa = torch.cat([ctx.state, a + pos], dim=1)
    out = dit(w, h, sa, temb, ctx)
    v = category_mlp(out, w, HEAD + "action_decoder", ctx.ids)[:, -x.shape[1]:]
    if trace is not None:
        for key, val in (("action_features", a), ("sa_embs", sa), ("dit_out", out), ("temb", temb), ("v", v),
                         ("timestep", t)):
            trace.setdefault(key, []).append(val.detach())
    return v


# ------------------------------------------------------------------ solver
@dataclass
class NativeRtc:
    """GR00T's own RTC: the previous chunk's rows (normalized model space) seed the start of x, the first
    `frozen` rows never move, the next ones up to `overlap` move by a ramp weight."""
    prefix: Tensor       # [B, T', A] padded to max_action_dim
    overlap: int
    frozen: int


def native_rtc(prev: Tensor, inference_delay: int, execution_horizon: Optional[int], h: HeadConfig,
               batch: int) -> NativeRtc:
    """prev [T, D] or [B, T, D]: rows after the last row non-zero in any item dropped, at most action_horizon
    (the last) rows kept, zero-padded to max_action_dim; overlap = min(T', execution horizon), frozen =
    min(delay, overlap)."""
    if prev.dim() == 2:
        prev = prev[None].expand(batch, -1, -1)
    if prev.dim() != 3 or prev.shape[0] != batch or prev.shape[-1] > h.max_action_dim:
        raise ValueError(f"RTC prev_chunk_left_over: expected [T, D] or [{batch}, T, D] with D <= "
                         f"{h.max_action_dim}, got {tuple(prev.shape)}")
    nonzero = (prev != 0).any(dim=-1).any(dim=0).nonzero()
    rows = int(nonzero.max()) + 1 if nonzero.numel() else 0
    prev = prev[:, :rows][:, -h.action_horizon:]
    prev = F.pad(prev, (0, h.max_action_dim - prev.shape[-1]))
    n = prev.shape[1]
    overlap = n if execution_horizon is None else min(n, int(execution_horizon))
    return NativeRtc(prev, overlap, min(int(inference_delay), overlap))


def rtc_weights(rtc: NativeRtc, h: HeadConfig, like: Tensor) -> Tensor:
    """Per-row velocity weight [1, H, 1]: 0 frozen, ramp 1 - exp(-rate s) (normalized, ends dropped), then 1."""
    w = torch.ones(h.action_horizon, dtype=like.dtype, device=like.device)
    w[:rtc.frozen] = 0
    n = rtc.overlap - rtc.frozen
    if n > 0:
        s = torch.linspace(0, 1, n + 2, dtype=like.dtype, device=like.device)
        r = 1 - torch.exp(-h.rtc_ramp_rate * s)
        w[rtc.frozen:rtc.overlap] = (r / r[-1])[1:-1]
    return w[None, :, None]


def sample(w: Weights, h: HeadConfig, ctx: HeadContext, noise: Tensor, rtc: Optional[NativeRtc] = None,
           trace: Optional[Dict[str, list]] = None) -> Tensor:
    """Euler from noise (t = 0) to actions (t = 1) in num_steps steps -> [B, H, max_action_dim]."""
    x = noise.to(w[HEAD + "position_embedding.weight"].dtype)
    weight = None
    if rtc is not None and rtc.overlap > 0:
        x = x.clone()
        x[:, :rtc.overlap] = rtc.prefix[:, rtc.prefix.shape[1] - rtc.overlap:].to(x)
        weight = rtc_weights(rtc, h, x)
    dt = 1.0 / h.num_steps
    buckets = timestep_buckets(h)
    ts = [torch.full((x.shape[0],), b, dtype=torch.int64, device=x.device) for b in buckets]
    tembs = [dit_time_embedding(w, t) for t in ts]
    for k, (t, temb) in enumerate(zip(ts, tembs)):
        if trace is not None:
            trace.setdefault("x_t", []).append(x.detach())
        v = velocity(w, h, x, t, temb, ctx, trace)
        x = x + dt * (v if weight is None else v * weight)
    return x
