"""MiniCPM-Robot's action head, stateless: a GR00T-style DiT that predicts clean actions, its embodiment banks,
and the 4-step sampler.

The sampler (step N .. 1, t = step / N, bucket = min(int(1000 t), 999)):

    noisy = t * noise + (1 - t) * actions          (actions start at 0)
    x = [future tokens | action_encoder([noisy | state], bucket, id) + position rows]
    actions = action_decoder(DiT(x, vl_embs, bucket), id)[:, -T:]     (a clean-action estimate)

Conventions that differ from GR00T N1.7's head (each a silent error if swapped): no state token (the state is
concatenated to every noisy action row), learned future tokens in front, no VL self-attention or vlln, every even
block cross-attends to all backbone tokens (no text / image split), and each step predicts clean actions, not a
velocity. Shared with it: the [sin | cos] action-encoder sinusoid (exponent / half), the DiT's flipped [cos | sin]
timestep sinusoid (exponent / (half - 1)), AdaLayerNorm chunks (scale, shift) in the blocks and (shift, scale) at
the output.

What depends on the step only (timestep embedding, every block's modulation, the encoder's sinusoid) is one table
per step; what depends on the observation (cross-attention K/V, the banks' weights of the batch's ids, the
state) one context per observation; the loop reads only fixed-shape tensors, so one CUDA graph holds all steps.

RTC (the loop's "native" mode here): clean-action inpainting. After every step the estimate's rows are blended
with the previous chunk's Y by the prefix weights W (1 for the d frozen rows, a ramp up to n, 0 beyond), so the
frozen rows come out exactly Y and the next steps denoise around them. No gradient of the network is taken.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from phyai_ros.layers import dispatch, ops

from .config import HeadConfig
from .vision import Trace, Weights

Tensor = torch.Tensor
HEAD = "action_head."
DIT = HEAD + "model."
BLOCK_EPS = 1e-5
OUT_EPS = 1e-6
BANK_LAYERS = ("action_encoder.W1", "action_encoder.W2", "action_encoder.W3", "action_decoder.layer1",
               "action_decoder.layer2")


def block(i: int) -> str:
    return f"{DIT}transformer_blocks.{i}."


def encoder_sinusoid(bucket: Tensor, width: int) -> Tensor:
    """The action encoder's [sin | cos] of the integer bucket [B] -> [B, width] (float32 recipe)."""
    half = width // 2
    freq = torch.exp(-torch.arange(half, dtype=torch.float32, device=bucket.device)
                     * (torch.log(torch.tensor(10000.0)) / half))
    angle = bucket.float()[:, None] * freq[None]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


def timestep_embedding(w: Weights, bucket: Tensor, channels: int) -> Tensor:
    """The DiT's timestep embedding [B] -> [B, width]: flipped sinusoid ([cos | sin], shift 1), then the MLP."""
    half = channels // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=bucket.device) / (half - 1)
    arg = bucket.float()[:, None] * torch.exp(exponent)[None]
    emb = torch.cat([arg.cos(), arg.sin()], dim=-1)
    p = DIT + "timestep_encoder.timestep_embedder."
    dtype = w[p + "linear_1.weight"].dtype
    h = F.silu(dispatch.linear(emb.to(dtype), w[p + "linear_1.weight"], w[p + "linear_1.bias"]))
    return dispatch.linear(h, w[p + "linear_2.weight"], w[p + "linear_2.bias"])


@dataclass
class StepTable:
    """One step's constants: its t and bucket, the encoder sinusoid [1, hidden], the timestep embedding, and per
    block and for the output layer the LayerNorm affine (1 + scale, shift) [width]."""
    t: float
    bucket: int
    tau: Tensor
    temb: Tensor
    mods: List[Tuple[Tensor, Tensor]]
    out: Tuple[Tensor, Tensor]


def step_tables(w: Weights, h: HeadConfig, device) -> List[StepTable]:
    """Every step's table (the same for every batch item: one bucket per step)."""
    tables = []
    dtype = w[HEAD + "position_embedding.weight"].dtype
    for t, bucket in zip(h.times(), h.buckets()):
        b = torch.tensor([bucket], dtype=torch.int64, device=device)
        temb = timestep_embedding(w, b, h.timestep_channels)
        cond = F.silu(temb)
        mods = []
        for i in range(h.depth):
            scale, shift = dispatch.linear(cond, w[block(i) + "norm1.linear.weight"],
                                           w[block(i) + "norm1.linear.bias"]).chunk(2, dim=-1)
            mods.append(((1 + scale)[0], shift[0]))
        shift, scale = dispatch.linear(cond, w[DIT + "proj_out_1.weight"], w[DIT + "proj_out_1.bias"]).chunk(2, -1)
        tables.append(StepTable(t, bucket, encoder_sinusoid(b, h.hidden).to(dtype), temb, mods,
                                ((1 + scale)[0], shift[0])))
    return tables


@dataclass
class HeadContext:
    """Per-observation constants of the loop."""
    cross_kv: Dict[int, Tuple[Tensor, Tensor]]      # even block -> K, V [B, H, L, d] of the backbone tokens
    mask: Optional[Tensor]                          # additive [B, 1, 1, L] over padded tokens, None: no padding
    state: Tensor                                   # [B, 1, state_dim]
    banks: Dict[str, Tuple[Tensor, Tensor]]         # BANK_LAYERS -> W[ids] [B, in, out], b[ids] [B, 1, out]


def heads(x: Tensor, n: int) -> Tensor:
    b, t, _ = x.shape
    return x.view(b, t, n, -1).transpose(1, 2)


def context(w: Weights, h: HeadConfig, vl_embs: Tensor, attention_mask: Optional[Tensor], state: Tensor,
            ids: Tensor) -> HeadContext:
    """vl_embs [B, L, text width] (the head's dtype), state [B, state_dim], ids [B] -> HeadContext."""
    kv = {}
    for i in range(0, h.depth, 2):
        k, v = dispatch.linear(vl_embs, w[block(i) + "attn1.to_kv.weight"],
                               w[block(i) + "attn1.to_kv.bias"]).chunk(2, dim=-1)
        kv[i] = (heads(k, h.num_heads), heads(v, h.num_heads))
    mask = None if attention_mask is None else ops.bool_to_additive_mask(attention_mask.bool()[:, None, :],
                                                                         vl_embs.dtype)
    banks = {name: (w[HEAD + name + ".W"][ids], w[HEAD + name + ".b"][ids][:, None]) for name in BANK_LAYERS}
    return HeadContext(kv, mask, state[:, None, :].to(vl_embs.dtype), banks)


def bank_linear(x: Tensor, bank: Tuple[Tensor, Tensor]) -> Tensor:
    """x [B, T, in] @ W[id] + b[id], each item its own bank."""
    return torch.baddbmm(bank[1], x, bank[0])


def action_encoder(x: Tensor, tau: Tensor, ctx: HeadContext) -> Tensor:
    """[noisy | state] [B, T, A + S] and the step's sinusoid [1, hidden] -> [B, T, DiT width]."""
    a = bank_linear(x, ctx.banks["action_encoder.W1"])
    y = F.silu(bank_linear(torch.cat([a, tau.expand(a.shape[0], a.shape[1], -1)], dim=-1),
                           ctx.banks["action_encoder.W2"]))
    return bank_linear(y, ctx.banks["action_encoder.W3"])


def action_decoder(x: Tensor, ctx: HeadContext) -> Tensor:
    return bank_linear(F.relu(bank_linear(x, ctx.banks["action_decoder.layer1"])), ctx.banks["action_decoder.layer2"])


def dit(w: Weights, h: HeadConfig, x: Tensor, table: StepTable, ctx: HeadContext) -> Tensor:
    """The DiT on x [B, n_future + T, width] -> [B, n_future + T, output_dim]. Per block: AdaLayerNorm (the table's
    affine) -> attention (odd: self over x, fused q | k | v; even: cross to the context's K/V) -> out projection,
    residual add, LayerNorm and the GELU up-projection as one selector op (linear_add_norm_gelu) -> down
    projection, residual add and the next block's AdaLayerNorm as another (linear_add_layer_norm)."""
    y = dispatch.layer_norm(x, *table.mods[0], BLOCK_EPS)
    for i in range(h.depth):
        b = block(i)
        if i % 2:
            a = dispatch.projected_attention(y, w[b + "attn1.to_qkv.weight"], w[b + "attn1.to_qkv.bias"], h.num_heads)
        else:
            a = dispatch.projected_attention(y, w[b + "attn1.to_q.weight"], w[b + "attn1.to_q.bias"], h.num_heads,
                                             *ctx.cross_kv[i], ctx.mask)
        x, f = dispatch.linear_add_norm_gelu(x, a, w[b + "attn1.to_out.0.weight"], w[b + "attn1.to_out.0.bias"],
                                             w[b + "ff.net.0.proj.weight"], w[b + "ff.net.0.proj.bias"],
                                             w.get(b + "ff.net.0.proj.colsum"), BLOCK_EPS)
        last = i + 1 == h.depth
        x, y = dispatch.linear_add_layer_norm(x, f, w[b + "ff.net.2.weight"], w[b + "ff.net.2.bias"],
                                              *(table.out if last else table.mods[i + 1]),
                                              OUT_EPS if last else BLOCK_EPS)
    return dispatch.linear(y, w[DIT + "proj_out_2.weight"], w[DIT + "proj_out_2.bias"])


def sample(w: Weights, h: HeadConfig, ctx: HeadContext, tables: List[StepTable], noise: Tensor, prefix: Tensor,
           prefix_weight: Tensor, trace: Trace = None) -> Tensor:
    """The clean-action loop from ``noise`` [B, T, A] -> actions [B, T, A] (float32). RTC: ``prefix`` [B, T, A]
    (the previous chunk's rows, zero beyond them) and ``prefix_weight`` [B, T, 1] (0 everywhere: RTC off,
    exactly the plain sampler). Fixed shapes, no host reads: capture-safe."""
    dtype = ctx.state.dtype
    noise = noise.float()
    batch, horizon = noise.shape[:2]
    actions = torch.zeros_like(noise)
    future = w[HEAD + "future_tokens.weight"][None].expand(batch, -1, -1)
    pos = w[HEAD + "position_embedding.weight"][:horizon]
    state = ctx.state.expand(-1, horizon, -1)
    for s, table in enumerate(tables):
        noisy = table.t * noise + (1 - table.t) * actions
        x = torch.cat([noisy.to(dtype), state], dim=-1)
        enc = action_encoder(x, table.tau, ctx)
        feats = enc + pos
        seq = torch.cat([future, feats], dim=1)
        out = dit(w, h, seq, table, ctx)
        if trace is not None:
            dit_trace(w, h, seq, table, ctx, s, trace)
        decoded = action_decoder(out, ctx)
        actions = decoded[:, -horizon:].float()
        actions = torch.lerp(actions, prefix, prefix_weight)   # weight 1: exactly the prefix
        if trace is not None:
            for key, value in (("encoder_input", x), ("action_encoder_out", enc), ("action_features", feats),
                               ("sa_embs", seq), ("model_output", out), ("decoded", decoded), ("actions", actions),
                               ("noisy_action", noisy), ("temb", table.temb.expand(batch, -1)),
                               ("bucket", torch.full((batch,), table.bucket, dtype=torch.int64))):
                trace[f"head.step{s}.{key}"] = value.detach()
    return actions


def dit_trace(w: Weights, h: HeadConfig, x: Tensor, table: StepTable, ctx: HeadContext, step: int,
              trace: Dict[str, Tensor]) -> None:
    """Block outputs of one step (the fixtures' head.step{s}.block{i}), by the reference's own sequence."""
    for i in range(h.depth):
        b = block(i)
        n = F.layer_norm(x, (x.shape[-1],), eps=BLOCK_EPS) * table.mods[i][0] + table.mods[i][1]
        if i % 2:
            q, k, v = dispatch.linear(n, w[b + "attn1.to_qkv.weight"], w[b + "attn1.to_qkv.bias"]).chunk(3, dim=-1)
            k, v = heads(k, h.num_heads), heads(v, h.num_heads)
        else:
            q = dispatch.linear(n, w[b + "attn1.to_q.weight"], w[b + "attn1.to_q.bias"])
            k, v = ctx.cross_kv[i]
        a = F.scaled_dot_product_attention(heads(q, h.num_heads), k, v, attn_mask=None if i % 2 else ctx.mask)
        a = a.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        x = x + dispatch.linear(a, w[b + "attn1.to_out.0.weight"], w[b + "attn1.to_out.0.bias"])
        f = F.gelu(dispatch.linear(F.layer_norm(x, (x.shape[-1],), eps=BLOCK_EPS), w[b + "ff.net.0.proj.weight"],
                                   w[b + "ff.net.0.proj.bias"]), approximate="tanh")
        x = x + dispatch.linear(f, w[b + "ff.net.2.weight"], w[b + "ff.net.2.bias"])
        trace[f"head.step{step}.block{i}"] = x.detach()


def fuse_projections(w: Weights, h: HeadConfig) -> None:
    """In place: self-attention blocks' q | k | v and cross-attention blocks' k | v as one GEMM each, and the
    up-projections' column sums the fused post-norm candidate reads (dispatch.up_column_sums)."""
    for i in range(h.depth):
        b = block(i) + "attn1."
        parts = ("q", "k", "v") if i % 2 else ("k", "v")
        name = "to_" + "".join(parts)
        for kind in ("weight", "bias"):
            w[b + name + "." + kind] = torch.cat([w.pop(b + f"to_{p}.{kind}") for p in parts], dim=0)
        sums = dispatch.up_column_sums(w[block(i) + "ff.net.0.proj.weight"])
        if sums is not None:
            w[block(i) + "ff.net.0.proj.colsum"] = sums


__all__ = ["StepTable", "HeadContext", "step_tables", "context", "sample", "dit", "dit_trace", "fuse_projections",
           "encoder_sinusoid", "timestep_embedding", "BANK_LAYERS", "HEAD", "DIT"]
