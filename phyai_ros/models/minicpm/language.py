"""Qwen3.5's hybrid text model, stateless: Gated-DeltaNet (linear attention) and gated full-attention layers.

Conventions (each a silent error if swapped):
- RMSNorm gains are (1 + w), computed in float32; the GDN's gated norm has a plain gain w and multiplies by
  SiLU(z) in float32;
- q_proj's output is per head [q (head_dim) | gate (head_dim)]; the attention output is multiplied by
  sigmoid(gate) before o_proj; q_norm / k_norm act on head_dim;
- RoPE rotates the first ``rotary_dim`` channels only (rotate-half within them). MiniCPM-V passes no position
  ids, so the three mRoPE axes carry the same 1-D position and the interleaved sections reduce to plain RoPE;
- GDN: causal depthwise conv (kernel 4, no bias) + SiLU over [q | k | v], beta = sigmoid(b),
  g = -exp(A_log) softplus(a + dt_bias), K heads repeated to the V heads (interleaved), gated delta rule
  (gated_delta.py); left-padded rows are zeroed before it (batched prompts of unequal length).
At load, each layer's input projections become one GEMM (GDN: qkv | z | b | a; attention: q | k | v; MLP:
gate | up), so a layer is 4-5 GEMMs.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from phyai_ros.layers import dispatch, gated_delta_ops, ops

from . import gated_delta
from .config import TextConfig
from .vision import Trace, Weights, record

Tensor = torch.Tensor
LM = "model.language_model."


def layer_prefix(i: int) -> str:
    return f"{LM}layers.{i}."


def rope_tables(t: TextConfig, length: int, device, dtype=torch.float32) -> Tuple[Tensor, Tensor]:
    """cos / sin [1, S, rotary_dim] for positions 0..S-1 (float32 math, then ``dtype``: the model's, as the
    reference casts them)."""
    inv_freq = 1.0 / (t.rope_theta ** (torch.arange(0, t.rotary_dim, 2, dtype=torch.int64).float() / t.rotary_dim))
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None]
    emb = torch.cat([freqs, freqs], dim=-1)[None]
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


def _partial_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, S, d]: rotate the first cos.shape[-1] channels."""
    r = cos.shape[-1]
    return torch.cat([ops.apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)


def causal_mask(attention_mask: Tensor, dtype=torch.float32) -> Tensor:
    """[B, S] 1/0 -> additive [B, 1, S, S]: causal, padded keys blocked."""
    s = attention_mask.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).tril()
    return ops.bool_to_additive_mask(causal[None] & attention_mask.bool()[:, None, :], dtype)


def full_attention(w: Weights, t: TextConfig, p: str, y: Tensor, cos: Tensor, sin: Tensor, mask: Tensor,
                   trace: Trace = None, name: str = "") -> Tensor:
    """Gated full attention of y [B, S, W] -> the o_proj input [B, S, H * hd]."""
    b, s, _ = y.shape
    h, kv, d = t.num_heads, t.num_kv_heads, t.head_dim
    qkv = dispatch.linear(y, w[p + "self_attn.qkv.weight"])
    record(trace, name + ".q_proj_out", qkv[..., :2 * h * d])
    qg, k, v = qkv.split([2 * h * d, kv * d, kv * d], dim=-1)
    qg = qg.view(b, s, h, 2 * d)
    q, gate = qg[..., :d], qg[..., d:].reshape(b, s, h * d)
    q = ops.rms_norm(q, w[p + "self_attn.q_norm.weight"], t.rms_eps).transpose(1, 2)
    k = ops.rms_norm(k.view(b, s, kv, d), w[p + "self_attn.k_norm.weight"], t.rms_eps).transpose(1, 2)
    v = v.view(b, s, kv, d).transpose(1, 2)
    q, k = _partial_rope(q, cos, sin), _partial_rope(k, cos, sin)
    record(trace, name + ".q_rope", q)
    record(trace, name + ".k_rope", k)
    record(trace, name + ".v", v)
    a = ops.attn_tokens(dispatch.attention(q, k, v, mask))
    record(trace, name + ".core_out", a.view(b, s, h, d))
    out = a * torch.sigmoid(gate)
    record(trace, name + ".gated_attn_out", out)
    return out


def causal_conv_silu(x: Tensor, weight: Tensor) -> Tensor:
    """SiLU(depthwise causal conv1d) over time: x [B, S, C], weight [C, 1, K] -> [B, S, C]."""
    kernel = weight.shape[-1]
    y = F.conv1d(F.pad(x.transpose(1, 2), (kernel - 1, 0)), weight, groups=x.shape[-1])
    return F.silu(y).transpose(1, 2)


def gated_rms_norm(x: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    """rmsnorm(x) * w * SiLU(z) over the last dim; float32 inside, x's dtype out (the reference's roundings)."""
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * normed * F.silu(z.float())).to(x.dtype)


def delta_net(w: Weights, t: TextConfig, p: str, y: Tensor, row_mask: Optional[Tensor], trace: Trace = None,
              name: str = "") -> Tensor:
    """Gated-DeltaNet of y [B, S, W] -> the out_proj input [B, S, value_dim]. ``row_mask`` [B, S, 1] zeroes
    padded rows first (None: no padding). Around the rule two selector ops (layers.gated_delta_ops: conv + SiLU
    + split + l2 norms + gates, and the gated norm); with ``trace`` the same math step by step, recorded."""
    if row_mask is not None:
        y = y * row_mask
    b, s, _ = y.shape
    hk, hv, dk, dv = t.gdn_k_heads, t.gdn_v_heads, t.gdn_k_dim, t.gdn_v_dim
    proj = dispatch.linear(y, w[p + "linear_attn.in_proj.weight"])
    z = proj[..., t.conv_dim:t.conv_dim + t.value_dim]
    if trace is None:
        q, k, v, beta, g = gated_delta_ops.conv_qkv_gates(proj, w[p + "linear_attn.conv1d.weight"],
                                                          w[p + "linear_attn.A_log"], w[p + "linear_attn.dt_bias"],
                                                          hk, hv, dk, dv)
        if hv > hk:
            q, k = q.repeat_interleave(hv // hk, dim=2), k.repeat_interleave(hv // hk, dim=2)
        core, _ = gated_delta.chunked(q, k, v, g, beta, t.gdn_chunk, normalized=True)
        return gated_delta_ops.gated_norm(core, z, w[p + "linear_attn.norm.weight"], t.rms_eps, y.dtype)
    mixed, _, beta, a = proj.split([t.conv_dim, t.value_dim, hv, hv], dim=-1)
    mixed = causal_conv_silu(mixed, w[p + "linear_attn.conv1d.weight"])
    record(trace, name + ".conv_out_silu", mixed)
    record(trace, name + ".z", z)
    q, k, v = mixed.split([t.key_dim, t.key_dim, t.value_dim], dim=-1)
    q, k, v = q.reshape(b, s, hk, dk), k.reshape(b, s, hk, dk), v.reshape(b, s, hv, dv)
    beta = beta.sigmoid()
    g = -w[p + "linear_attn.A_log"].float().exp() * F.softplus(a.float() + w[p + "linear_attn.dt_bias"])
    record(trace, name + ".beta", beta)
    record(trace, name + ".g", g)
    if hv > hk:
        q, k = q.repeat_interleave(hv // hk, dim=2), k.repeat_interleave(hv // hk, dim=2)
    core, _ = gated_delta.chunked(q, k, v, g, beta, t.gdn_chunk)
    record(trace, name + ".core_attn_out", core)
    out = gated_rms_norm(core, z.reshape(b, s, hv, dv), w[p + "linear_attn.norm.weight"], t.rms_eps)
    record(trace, name + ".gated_norm_out", out.reshape(-1, dv))
    return out.reshape(b, s, hv * dv)


def text_model(w: Weights, t: TextConfig, x: Tensor, attention_mask: Tensor, tables: Tuple[Tensor, Tensor],
               trace: Trace = None) -> Tensor:
    """inputs_embeds [B, S, W] -> the final RMSNorm's output [B, S, W] (what MiniCPM-V's hidden_states[-1] is).
    ``tables``: rope_tables of S; ``attention_mask`` [B, S] (1 = token)."""
    mask = causal_mask(attention_mask)
    row_mask = attention_mask[..., None].to(x.dtype)   # padded rows zeroed before every GDN layer (x 1: exact)
    cos, sin = tables
    hidden: List[Tensor] = [x]
    y = ops.rms_norm(x, w[layer_prefix(0) + "input_layernorm.weight"], t.rms_eps)
    for i, kind in enumerate(t.layer_types):
        p = layer_prefix(i)
        if kind == "linear_attention":
            name = f"text.gdn{i}"
            a = delta_net(w, t, p, y, row_mask, trace, name)
            out_w = w[p + "linear_attn.out_proj.weight"]
        else:
            name = f"text.attn{i}"
            a = full_attention(w, t, p, y, cos, sin, mask, trace, name)
            out_w = w[p + "self_attn.o_proj.weight"]
        y, x = dispatch.linear_add_rms_norm(a, out_w, x, w[p + "post_attention_layernorm.weight"], t.rms_eps)
        if trace is not None:
            record(trace, name + ".out", dispatch.linear(a, out_w))
        up = dispatch.swiglu(dispatch.linear(y, w[p + "mlp.gate_up.weight"]))
        last = i + 1 == t.depth
        nxt = LM + "norm.weight" if last else layer_prefix(i + 1) + "input_layernorm.weight"
        y, x = dispatch.linear_add_rms_norm(up, w[p + "mlp.down_proj.weight"], x, w[nxt], t.rms_eps)
        hidden.append(x)
    if trace is not None:
        for i, h in enumerate(hidden[:-1]):
            record(trace, f"text.hidden_states.{i}", h)
        record(trace, f"text.layer{t.depth - 1}_out_prenorm", hidden[-1])
        record(trace, f"text.hidden_states.{t.depth}", y)
        record(trace, "text.last_hidden_state", y)
    return y


def fuse_projections(w: Weights, t: TextConfig) -> None:
    """In place: one input GEMM per mixer and one gate | up GEMM per MLP (the original keys are dropped)."""
    for i, kind in enumerate(t.layer_types):
        p = layer_prefix(i)
        if kind == "linear_attention":
            parts = [p + f"linear_attn.in_proj_{n}.weight" for n in ("qkv", "z", "b", "a")]
            w[p + "linear_attn.in_proj.weight"] = torch.cat([w.pop(k) for k in parts], dim=0)
        else:
            parts = [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
            w[p + "self_attn.qkv.weight"] = torch.cat([w.pop(k) for k in parts], dim=0)
        w[p + "mlp.gate_up.weight"] = torch.cat([w.pop(p + "mlp.gate_proj.weight"), w.pop(p + "mlp.up_proj.weight")], 0)


def embed_tokens(w: Weights, input_ids: Tensor) -> Tensor:
    return ops.embedding(input_ids, w[LM + "embed_tokens.weight"])


def scatter_image_rows(embeds: Tensor, image_rows: Tensor, features: Tensor) -> Tensor:
    """inputs_embeds [B, S, W] with the rows ``image_rows`` (flat indices into B*S, in order) replaced by the
    image features [N, W] in order (the reference's masked_scatter)."""
    b, s, width = embeds.shape
    flat = embeds.reshape(b * s, width).index_copy(0, image_rows, features.reshape(-1, width).to(embeds.dtype))
    return flat.view(b, s, width)


__all__ = ["text_model", "fuse_projections", "rope_tables", "embed_tokens", "scatter_image_rows", "causal_mask",
           "gated_rms_norm", "causal_conv_silu", "LM"]
