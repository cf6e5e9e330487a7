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
What depends on the observation only (VL tokens, state token, every cross-attention K/V) is computed once
per observation (`HeadContext`), what depends on the step only (timestep embedding, every block's AdaLayerNorm
modulation, the action encoder's sinusoid) once per batch size (`step_tables`); the Euler loop (`euler`) then
reads only fixed-shape tensors, so a runner can capture it in one CUDA graph with native RTC inside.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from phyai_ros.layers import dispatch

from .keys import DIT, HEAD, VLSA
from .config import HeadConfig
from .qwen3vl import Trace, Weights, record, additive_mask, attention, fuse, layer_norm, linear

Tensor = torch.Tensor
ATTN_EPS = 1e-5
OUT_EPS = 1e-6
TIMESTEP_CHANNELS = 256


# ------------------------------------------------------------------ small pieces
# The embodiment-indexed layers the denoising loop runs every step: their weights are gathered for the batch's
# embodiment ids once per observation (HeadContext.embodiment), not in every step (an index kernel and a copy of
# the whole matrix per layer and step).
LOOP_CATEGORY_LAYERS = ("action_encoder.W1", "action_encoder.W2", "action_encoder.W3", "action_decoder.layer1",
                        "action_decoder.layer2")
CategoryWeights = Tuple[Tensor, Tensor]   # W[ids] [B, in, out], b[ids] [B, 1, out]


def category_weights(w: Weights, name: str, ids: Tensor) -> CategoryWeights:
    """One embodiment-indexed layer's weights for the batch's ids (one id per batch item)."""
    return w[name + ".W"][ids], w[name + ".b"][ids][:, None]


def category_linear(x: Tensor, w: Weights, name: str, ids: Tensor, gathered: Optional[CategoryWeights] = None
                    ) -> Tensor:
    """x [B, T, in] @ W[id] + b[id], one embodiment id per batch item (``gathered``: those weights already)."""
    weight, bias = gathered if gathered is not None else category_weights(w, name, ids)
    return torch.bmm(x, weight) + bias


def category_mlp(x: Tensor, w: Weights, name: str, ids: Tensor,
                 gathered: Optional[Dict[str, CategoryWeights]] = None) -> Tensor:
    g = gathered or {}
    y = F.relu(category_linear(x, w, name + ".layer1", ids, g.get(name + ".layer1")))
    return category_linear(y, w, name + ".layer2", ids, g.get(name + ".layer2"))


def feed_forward(x: Tensor, w: Weights, b: str) -> Tensor:
    return linear(gelu_up(x, w, b), w, b + "ff.net.2")


def gelu_up(x: Tensor, w: Weights, b: str) -> Tensor:
    """gelu_tanh(ff.net.0.proj(x)): one skinny kernel (GELU in its epilogue) where the selector has one."""
    return dispatch.linear_gelu_tanh(x, w[b + "ff.net.0.proj.weight"], w.get(b + "ff.net.0.proj.bias"))


def heads(x: Tensor, n: int) -> Tensor:
    """[B, T, n*d] -> [B, n, T, d]."""
    b, t, _ = x.shape
    return x.view(b, t, n, -1).transpose(1, 2)


def self_qkv(x: Tensor, w: Weights, b: str, n_heads: int) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
    """q and (k, v) [B, n, T, d] of a self-attention block from its one fused projection (to_qkv)."""
    q, k, v = linear(x, w, b + "attn1.to_qkv").chunk(3, dim=-1)
    return heads(q, n_heads), (heads(k, n_heads), heads(v, n_heads))


def kv_of(src: Tensor, w: Weights, b: str, n_heads: int) -> Tuple[Tensor, Tensor]:
    """Cross-attention K/V [B, n, Tk, d] of the VL tokens from the fused to_kv projection."""
    k, v = linear(src, w, b + "attn1.to_kv").chunk(2, dim=-1)
    return heads(k, n_heads), heads(v, n_heads)


def fuse_projections(w: Weights, h: HeadConfig) -> None:
    """In place: one GEMM per attention input: to_qkv for the VL self-attention and the DiT's self-attention
    (odd) blocks, to_kv for the cross-attention (even) blocks; the original keys become views."""
    blocks = [(f"{VLSA}{i}.", "qkv") for i in range(h.vlsa_layers)]
    blocks += [(f"{DIT}transformer_blocks.{i}.", "kv" if i % 2 == 0 else "qkv") for i in range(h.dit_layers)]
    for b, parts in blocks:
        fuse(w, [f"{b}attn1.to_{n}" for n in parts], f"{b}attn1.to_{parts}")


def post_norm_sums(w: Weights, h: HeadConfig) -> None:
    """In place: every DiT block's GELU up-projection's column sums ("ff.net.0.proj.colsum", fp32), from the
    weights as the GEMM reads them, so that the MLP's LayerNorm may run after that GEMM's dot
    (dispatch.linear_add_norm_gelu); none for a quantized projection."""
    for i in range(h.dit_layers):
        key = f"{DIT}transformer_blocks.{i}.ff.net.0.proj."
        sums = dispatch.up_column_sums(w[key + "weight"])
        if sums is not None:
            w[key + "colsum"] = sums


# ------------------------------------------------------------------ VL adapter and state
def vl_tokens(w: Weights, h: HeadConfig, features: Tensor, trace: Trace = None) -> Tensor:
    """Backbone features -> vlln -> VL self-attention blocks (no mask: pad rows take part)."""
    x = layer_norm(features, w, HEAD + "vlln", ATTN_EPS) if h.use_vlln else features
    record(trace, "vlln", x)
    for i in range(h.vlsa_layers):
        b = f"{VLSA}{i}."
        q, kv = self_qkv(layer_norm(x, w, b + "norm1", ATTN_EPS), w, b, h.vlsa_heads)
        x = x + linear(attention(q, kv[0], kv[1]), w, b + "attn1.to_out.0")
        x = x + feed_forward(layer_norm(x, w, b + "norm3", ATTN_EPS), w, b)
    record(trace, "vl_self_attention", x)
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


def action_features(w: Weights, x: Tensor, tau: Tensor, ids: Tensor,
                    gathered: Optional[Dict[str, CategoryWeights]] = None) -> Tensor:
    """x [B, H, A] with the step's sinusoid tau [B, H, E] -> [B, H, E] (before the position embedding)."""
    g, n = gathered or {}, HEAD + "action_encoder."
    a = category_linear(x, w, n + "W1", ids, g.get(n + "W1"))
    y = F.silu(category_linear(torch.cat([a, tau], dim=-1), w, n + "W2", ids, g.get(n + "W2")))
    return category_linear(y, w, n + "W3", ids, g.get(n + "W3"))


@dataclass
class StepTable:
    """What one Euler step needs that depends on the step (its timestep bucket) only."""
    t: Tensor                            # [B] int64 bucket
    temb: Tensor                         # [B, C] DiT timestep embedding
    tau: Tensor                          # [B, H, E] action encoder sinusoid
    # Per DiT block and for the output layer: AdaLayerNorm's (1 + scale, shift) as [C] vectors. They depend on
    # the step only (every row has the step's timestep), so they are the LayerNorm's own affine in the loop.
    mods: List[Tuple[Tensor, Tensor]]
    out: Tuple[Tensor, Tensor]


def step_tables(w: Weights, h: HeadConfig, batch: int, device) -> List[StepTable]:
    """Per step: timestep embedding and every block's AdaLayerNorm modulation (a [2C, C] GEMM per block and
    step in the loop otherwise: 32 x 4 of them at full size), computed once per batch size."""
    dtype = w[HEAD + "position_embedding.weight"].dtype
    tables = []
    for bucket in timestep_buckets(h):
        t = torch.full((batch,), bucket, dtype=torch.int64, device=device)
        temb = dit_time_embedding(w, t)
        cond = F.silu(temb)
        mods = []
        for i in range(h.dit_layers):
            scale, shift = linear(cond, w, f"{DIT}transformer_blocks.{i}.norm1.linear").chunk(2, dim=-1)
            mods.append(((1 + scale)[0], shift[0]))
        shift, scale = linear(cond, w, DIT + "proj_out_1").chunk(2, dim=-1)
        tau = action_time_embedding(t[:, None].expand(-1, h.action_horizon), h.input_embedding_dim).to(dtype)
        tables.append(StepTable(t, temb, tau, mods, ((1 + scale)[0], shift[0])))
    return tables


# ------------------------------------------------------------------ DiT
@dataclass
class HeadContext:
    """Per-observation constants of the denoising loop."""
    state: Tensor                         # [B, 1, E] state token
    cross_kv: Dict[int, Tuple[Tensor, Tensor]]  # even block index -> K/V of the VL tokens
    masks: Dict[int, Tensor]              # even block index -> additive [B, 1, 1, L] (text or image tokens, valid)
    ids: Tensor                           # [B] embodiment ids
    embodiment: Dict[str, CategoryWeights] = field(default_factory=dict)   # LOOP_CATEGORY_LAYERS for ids


def head_context(w: Weights, h: HeadConfig, vl: Tensor, attention_mask: Tensor, image_mask: Tensor,
                 state: Tensor, ids: Tensor) -> HeadContext:
    valid = attention_mask.bool()
    text, image = (additive_mask(m[:, None], vl.dtype) for m in (valid & ~image_mask, valid & image_mask))
    kv, masks = {}, {}
    for i in range(0, h.dit_layers, 2):
        b = f"{DIT}transformer_blocks.{i}."
        kv[i] = kv_of(vl, w, b, h.dit_heads)
        masks[i] = text if i % (2 * h.attend_text_every_n_blocks) == 0 else image
    gathered = {HEAD + n: category_weights(w, HEAD + n, ids) for n in LOOP_CATEGORY_LAYERS}
    return HeadContext(state_token(w, state, ids), kv, masks, ids, gathered)


def observation_context(w: Weights, h: HeadConfig, features: Tensor, attention_mask: Tensor, image_mask: Tensor,
                        state: Tensor, ids: Tensor, trace: Trace = None) -> HeadContext:
    """Backbone features -> everything the denoising loop reuses for this observation."""
    ctx = head_context(w, h, vl_tokens(w, h, features, trace), attention_mask, image_mask, state, ids)
    record(trace, "state_features", ctx.state)
    return ctx


def dit(w: Weights, h: HeadConfig, x: Tensor, table: StepTable, ctx: HeadContext) -> Tensor:
    """AlternateVLDiT: odd blocks self-attend over [state, actions], even blocks cross-attend to the VL tokens;
    AdaLayerNorm (the step table's 1 + scale, shift) before attention, plain LayerNorm before the GELU MLP;
    output layer then proj_out_2. Each residual add runs with the LayerNorm after it (and the output GEMM's
    bias) as one selector op, linear_add_layer_norm; the LayerNorm before a block's attention (and before the
    output layer) carries that block's AdaLayerNorm modulation as its affine, so no separate modulation kernel
    runs (one bf16 rounding instead of two). A block's input projection and its attention are one selector op
    (projected_attention: where a profile picks it, one kernel, kernels/candidates/projected_attention.py); the
    cross-attention blocks' keys and values come from the observation's context. The attention half's output GEMM,
    residual add, the MLP's LayerNorm and its GELU up-projection are one selector op (linear_add_norm_gelu: where a
    profile picks it, the LayerNorm is applied after the up-projection's dot, kernels/candidates/post_norm.py)."""
    scale, shift = table.mods[0]
    y = dispatch.layer_norm(x, scale, shift, ATTN_EPS)
    for i in range(h.dit_layers):
        b = f"{DIT}transformer_blocks.{i}."
        if i % 2:
            a = dispatch.projected_attention(y, w[b + "attn1.to_qkv.weight"], w.get(b + "attn1.to_qkv.bias"),
                                             h.dit_heads)
        else:
            a = dispatch.projected_attention(y, w[b + "attn1.to_q.weight"], w.get(b + "attn1.to_q.bias"),
                                             h.dit_heads, *ctx.cross_kv[i], ctx.masks.get(i))
        x, f = dispatch.linear_add_norm_gelu(x, a, w[b + "attn1.to_out.0.weight"], w[b + "attn1.to_out.0.bias"],
                                             w[b + "ff.net.0.proj.weight"], w.get(b + "ff.net.0.proj.bias"),
                                             w.get(b + "ff.net.0.proj.colsum"), ATTN_EPS)
        last = i + 1 == h.dit_layers
        scale, shift = table.out if last else table.mods[i + 1]
        x, y = dispatch.linear_add_layer_norm(x, f, w[b + "ff.net.2.weight"], w[b + "ff.net.2.bias"], scale, shift,
                                              OUT_EPS if last else ATTN_EPS)
    return linear(y, w, DIT + "proj_out_2")


def velocity(w: Weights, h: HeadConfig, x: Tensor, table: StepTable, ctx: HeadContext,
             trace: Optional[Dict[str, list]] = None) -> Tensor:
    """One network evaluation: x [B, H, A] (float32) at the step's bucket -> velocity [B, H, A]."""
    x = x.to(table.tau.dtype)
    a = action_features(w, x, table.tau, ctx.ids, ctx.embodiment)
    pos = w[HEAD + "position_embedding.weight"][:x.shape[1]] if h.add_pos_embed else 0
    sa = torch.cat([ctx.state, a + pos], dim=1)
    out = dit(w, h, sa, table, ctx)
    v = category_mlp(out, w, HEAD + "action_decoder", ctx.ids, ctx.embodiment)[:, -x.shape[1]:]
    if trace is not None:
        for key, val in (("action_features", a), ("sa_embs", sa), ("dit_out", out), ("temb", table.temb),
                         ("v", v), ("timestep", table.t)):
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


def rtc_tensors(rtc: Optional[NativeRtc], h: HeadConfig, batch: int, device) -> Tuple[Tensor, Tensor, Tensor]:
    """Native RTC as fixed-shape float32 tensors, so one captured loop serves with and without it:
    x0 = noise * keep + seed (seed = the previous chunk's last `overlap` rows in rows 0..overlap-1, keep 0
    there) and the per-row velocity weight [1, H, 1]. RTC off: keep 1, seed 0, weight 1, i.e. x0 = noise and
    v unchanged, exactly."""
    seed = torch.zeros(batch, h.action_horizon, h.max_action_dim)
    keep = torch.ones(1, h.action_horizon, 1)
    weight = keep.clone()
    if rtc is not None and rtc.overlap > 0:
        seed[:, :rtc.overlap] = rtc.prefix[:, rtc.prefix.shape[1] - rtc.overlap:].float().cpu()
        keep[:, :rtc.overlap] = 0
        weight = rtc_weights(rtc, h, weight)
    return seed.to(device), keep.to(device), weight.to(device)


def euler(w: Weights, h: HeadConfig, ctx: HeadContext, tables: List[StepTable], noise: Tensor, seed: Tensor,
          keep: Tensor, weight: Tensor, trace: Optional[Dict[str, list]] = None) -> Tensor:
    """Euler from noise (t = 0) to actions (t = 1), one step per table, x kept in float32 ->
    [B, H, max_action_dim]. Fixed shapes and no host reads: capture-safe (rtc_tensors' seed / keep / weight)."""
    x = noise * keep + seed
    dt = 1.0 / len(tables)
    for table in tables:
        if trace is not None:
            trace.setdefault("x_t", []).append(x.detach())
        v = velocity(w, h, x, table, ctx, trace)
        x = x + dt * (v.float() * weight)
    return x


def sample(w: Weights, h: HeadConfig, ctx: HeadContext, noise: Tensor, rtc: Optional[NativeRtc] = None,
           trace: Optional[Dict[str, list]] = None) -> Tensor:
    """Eager: step tables and RTC tensors for this batch, then euler."""
    batch = noise.shape[0]
    return euler(w, h, ctx, step_tables(w, h, batch, noise.device), noise.float(),
                 *rtc_tensors(rtc, h, batch, noise.device), trace)
