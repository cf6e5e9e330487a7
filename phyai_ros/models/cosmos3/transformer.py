"""Cosmos3's mixture-of-transformers as stateless functions over a weight dict.

Every layer has two pathways with their own weights: the understanding (text) tokens attend causally among
themselves; the generation tokens (vision patches + action tokens) attend to every generation token and to
all text keys. The text pathway never reads a generation token, so its per-layer keys / values depend on the
prompt alone: `text_kv` computes them once per observation (the conditioning) and `gen_hidden` runs only the
generation tokens at every denoising step against that cache. diffusers recomputes both pathways per step and
pass; the arithmetic of each token is the same.

Tensor parallelism: the weights handed in may be one rank's shard (`shard_weights`: heads and MLP columns
split, the output projections' rows); `reduce` (an all-reduce over the tensor-parallel group, identity on one
device) sums the row-parallel partial outputs. Rows of every tensor are independent passes (cond / uncond,
batch items); the text cache of a row may be right-padded, its padding masked out of the generation keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from phyai_ros.layers import dispatch, ops
from phyai_ros.layers.quantized import QuantizedWeight, QuantScheme

from .config import TransformerConfig, head_shards

Tensor = torch.Tensor
Weights = Dict[str, Tensor]
Reduce = Callable[[Tensor], Tensor]
PATHWAYS = ("und", "gen")


def _identity(x: Tensor) -> Tensor:
    return x


# ----------------------------------------------------------------------------- checkpoint keys
def layer_keys(cfg: TransformerConfig, i: int) -> Dict[str, Dict[str, str]]:
    """Per pathway, our name -> diffusers' key of layer i (unfused projections)."""
    L = f"layers.{i}."
    a = L + "self_attn."
    keys = {"und": {"norm_in": L + "input_layernorm.weight", "q": a + "to_q", "k": a + "to_k", "v": a + "to_v",
                    "out": a + "to_out", "norm_post": L + "post_attention_layernorm.weight", "mlp": L + "mlp."},
            "gen": {"norm_in": L + "input_layernorm_moe_gen.weight", "q": a + "add_q_proj", "k": a + "add_k_proj",
                    "v": a + "add_v_proj", "out": a + "to_add_out",
                    "norm_post": L + "post_attention_layernorm_moe_gen.weight", "mlp": L + "mlp_moe_gen.",
                    "q_norm": a + "norm_added_q.weight", "k_norm": a + "norm_added_k.weight"}}
    if cfg.qk_norm_for_text:
        keys["und"].update(q_norm=a + "norm_q.weight", k_norm=a + "norm_k.weight")
    if cfg.k_norm_for_gen:
        keys["und"]["k_norm_gen"] = a + "k_norm_und_for_gen.weight"
    return keys


def key_shapes(cfg: TransformerConfig) -> Dict[str, Tuple[int, ...]]:
    """Every key of diffusers' Cosmos3OmniTransformer state dict (action head included, sound excluded)."""
    H, hd, s = cfg.hidden_size, cfg.head_dim, {}
    for i in range(cfg.num_layers):
        for path in PATHWAYS:
            k = layer_keys(cfg, i)[path]
            s[k["norm_in"]] = s[k["norm_post"]] = (H,)
            for name, rows in (("q", cfg.q_dim), ("k", cfg.kv_dim), ("v", cfg.kv_dim)):
                s[k[name] + ".weight"] = (rows, H)
                if cfg.attention_bias:
                    s[k[name] + ".bias"] = (rows,)
            s[k["out"] + ".weight"] = (H, cfg.q_dim)
            if cfg.attention_bias:
                s[k["out"] + ".bias"] = (H,)
            for name in ("q_norm", "k_norm", "k_norm_gen"):
                if name in k:
                    s[k[name]] = (hd,)
            mlp = ("gate_proj", "up_proj") if cfg.hidden_act == "silu" else ("up_proj",)
            for name in mlp:
                s[k["mlp"] + name + ".weight"] = (cfg.intermediate_size, H)
            s[k["mlp"] + "down_proj.weight"] = (H, cfg.intermediate_size)
    D, n = cfg.action_dim, cfg.num_domains
    s.update({"embed_tokens.weight": (cfg.vocab_size, H), "lm_head.weight": (cfg.vocab_size, H), "norm.weight": (H,),
              "norm_moe_gen.weight": (H,), "proj_in.weight": (H, cfg.patch_dim), "proj_in.bias": (H,),
              "proj_out.weight": (cfg.patch_dim, H), "proj_out.bias": (cfg.patch_dim,),
              "time_embedder.linear_1.weight": (H, cfg.time_channels), "time_embedder.linear_1.bias": (H,),
              "time_embedder.linear_2.weight": (H, H), "time_embedder.linear_2.bias": (H,),
              "action_proj_in.fc.weight": (n, D * H), "action_proj_in.bias.weight": (n, H),
              "action_proj_out.fc.weight": (n, H * D), "action_proj_out.bias.weight": (n, D),
              "action_modality_embed": (H,)})
    return s


UNUSED_KEYS = ("lm_head.weight", "norm.weight")     # text generation head and the text pathway's final norm
FP32_PREFIX = "time_embedder."                      # diffusers keeps the time embedder in float32


def _rows(w: Tensor, heads: int, per_rank: int, rank: int, hd: int) -> Tensor:
    return w.view(heads, hd, *w.shape[1:])[rank * per_rank:(rank + 1) * per_rank].reshape(-1, *w.shape[1:])


def shard_weights(raw: Weights, cfg: TransformerConfig, dtype: torch.dtype, device, tp_rank: int = 0,
                  tp_size: int = 1) -> Weights:
    """diffusers' state dict -> our weights on `device`: q/k/v fused per pathway (and gate/up for silu), heads
    and MLP columns of rank `tp_rank` of `tp_size`; the time embedder stays float32 (as diffusers keeps it)."""
    hq, hkv = head_shards(cfg, tp_size)
    hd, I = cfg.head_dim, cfg.intermediate_size // tp_size
    r = tp_rank
    put = lambda t, fp32=False: t.to(device=device, dtype=torch.float32 if fp32 else dtype).contiguous()  # noqa
    w: Weights = {}
    for i in range(cfg.num_layers):
        for path, k in layer_keys(cfg, i).items():
            P = f"layers.{i}.{path}."
            proj = [_rows(raw[k["q"] + ".weight"], cfg.num_heads, hq, r, hd),
                    _rows(raw[k["k"] + ".weight"], cfg.num_kv_heads, hkv, r, hd),
                    _rows(raw[k["v"] + ".weight"], cfg.num_kv_heads, hkv, r, hd)]
            w[P + "qkv"] = put(torch.cat(proj))
            if cfg.attention_bias:
                w[P + "qkv_bias"] = put(torch.cat([
                    _rows(raw[k["q"] + ".bias"], cfg.num_heads, hq, r, hd),
                    _rows(raw[k["k"] + ".bias"], cfg.num_kv_heads, hkv, r, hd),
                    _rows(raw[k["v"] + ".bias"], cfg.num_kv_heads, hkv, r, hd)]))
                w[P + "out_bias"] = put(raw[k["out"] + ".bias"])
            w[P + "out"] = put(raw[k["out"] + ".weight"].view(cfg.hidden_size, cfg.num_heads, hd)
                               [:, r * hq:(r + 1) * hq].reshape(cfg.hidden_size, hq * hd))
            for name in ("norm_in", "norm_post", "q_norm", "k_norm", "k_norm_gen"):
                if name in k:
                    w[P + name] = put(raw[k[name]])
            cols = slice(r * I, (r + 1) * I)
            up = raw[k["mlp"] + "up_proj.weight"][cols]
            w[P + "up"] = put(torch.cat([raw[k["mlp"] + "gate_proj.weight"][cols], up])
                              if cfg.hidden_act == "silu" else up)
            w[P + "down"] = put(raw[k["mlp"] + "down_proj.weight"][:, cols])
    n, D, H = cfg.num_domains, cfg.action_dim, cfg.hidden_size
    w.update({"embed": put(raw["embed_tokens.weight"]), "norm_gen": put(raw["norm_moe_gen.weight"]),
              "proj_in": put(raw["proj_in.weight"]), "proj_in_bias": put(raw["proj_in.bias"]),
              "proj_out": put(raw["proj_out.weight"]), "proj_out_bias": put(raw["proj_out.bias"]),
              "action_in": put(raw["action_proj_in.fc.weight"].view(n, D, H)),
              "action_in_bias": put(raw["action_proj_in.bias.weight"]),
              "action_out": put(raw["action_proj_out.fc.weight"].view(n, H, D)),
              "action_out_bias": put(raw["action_proj_out.bias.weight"]),
              "action_embed": put(raw["action_modality_embed"])})
    for name in ("linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias"):
        w["time." + name] = put(raw[FP32_PREFIX + name], fp32=True)
    return w


GENERATION_PROJECTIONS = ("qkv", "out", "up", "down")


def quantize_generation(w: Weights, cfg: TransformerConfig, scheme: QuantScheme) -> Weights:
    """The generation pathway's four projections of every layer as QuantizedWeight (per output channel; w8a8:
    fp8 activations scaled per token at run time, no calibration): they are the denoising loop's GEMMs, which
    are compute-bound at the 480 tier. The text pathway runs once per instruction and keeps its dtype. Returns
    a new dict (the float copies of those weights are dropped with the old one)."""
    out = dict(w)
    for i in range(cfg.num_layers):
        for name in GENERATION_PROJECTIONS:
            key = f"layers.{i}.gen.{name}"
            if not scheme.fits(out[key].shape[1]):
                raise ValueError(f"{scheme.tag}: {key} has K = {out[key].shape[1]}, not a multiple of its group")
            out[key] = QuantizedWeight.from_float(out[key], scheme)
    return out


def quantized_part(key: str) -> Optional[str]:
    """quantized_checkpoint.summary's part of a quantizable weight: the generation pathway is the action model."""
    return "expert" if ".gen." in key and key.rsplit(".", 1)[-1] in GENERATION_PROJECTIONS else None


# ----------------------------------------------------------------------------- pieces
def _norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm times the plain weight, in float32 (Nemotron's; diffusers' RMSNorm equals it in float32)."""
    return dispatch.rms_norm(x, weight, eps, weight_offset=0.0)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [R, T, H, d] -> rotated [R, H, T, d] in float32, cast back."""
    return ops.apply_rope(x.transpose(1, 2).float(), cos, sin).to(x.dtype)


def _mlp(x: Tensor, w: Weights, P: str, cfg: TransformerConfig, reduce: Reduce) -> Tensor:
    h = dispatch.linear(x, w[P + "up"])
    if cfg.hidden_act == "silu":
        h = dispatch.swiglu(h)    # one pass over the [gate | up] rows where Triton runs, not silu's copy + a product
    else:
        h = torch.relu(h).square()
    return reduce(dispatch.linear(h, w[P + "down"]))


def _attn_out(a: Tensor, w: Weights, P: str, reduce: Reduce) -> Tensor:
    """[R, H, T, d] -> output projection (row-parallel: partial sums reduced, the bias added once)."""
    r, h, t, d = a.shape
    y = reduce(dispatch.linear(a.transpose(1, 2).reshape(r, t, h * d), w[P + "out"]))
    return y + w[P + "out_bias"] if P + "out_bias" in w else y


def local_heads(w: Weights, cfg: TransformerConfig) -> Tuple[int, int]:
    """(q heads, kv heads) held by these weights (a tensor-parallel shard holds a slice)."""
    rows = w["layers.0.gen.qkv"].shape[0] // cfg.head_dim
    out_heads = w["layers.0.gen.out"].shape[1] // cfg.head_dim
    return out_heads, (rows - out_heads) // 2


# ----------------------------------------------------------------------------- text pathway (once per prompt)
@dataclass
class TextCache:
    """Per layer, the text keys as the generation tokens read them (normed, rotated) and the text values:
    [R, kv heads, und_len, d] each; `mask` [R, 1, 1, und_len + gen tokens] additive (None: no padding)."""

    keys: List[Tensor]
    values: List[Tensor]
    mask: Optional[Tensor]


def text_kv(w: Weights, cfg: TransformerConfig, ids: Tensor, cos: Tensor, sin: Tensor, causal: Tensor,
            reduce: Reduce = _identity) -> Tuple[List[Tensor], List[Tensor]]:
    """ids [R, L] -> per-layer (keys for generation, values). The last layer's own attention output and MLP
    feed nothing the generation tokens read, so they are not computed."""
    hq, hkv = local_heads(w, cfg)
    d, eps = cfg.head_dim, cfg.rms_norm_eps
    h = ops.embedding(ids, w["embed"])
    keys, values = [], []
    for i in range(cfg.num_layers):
        P = f"layers.{i}.und."
        x = _norm(h, w[P + "norm_in"], eps)
        qkv = dispatch.linear(x, w[P + "qkv"], w.get(P + "qkv_bias"))
        q, k, v = dispatch.qkv_norm_rope(qkv, cos, sin, hq, hkv, d, w.get(P + "q_norm"), w.get(P + "k_norm"), eps)
        if P + "k_norm_gen" in w:   # only without text q/k norms: the raw keys, normed for the generation tokens
            r, t, _ = qkv.shape
            raw_k = qkv[..., hq * d:(hq + hkv) * d].reshape(r, t, hkv, d)
            keys.append(_rope(_norm(raw_k, w[P + "k_norm_gen"], eps), cos, sin))
        else:
            keys.append(k)
        values.append(v.contiguous())          # v is a view into qkv: keep only what the cache needs
        if i == cfg.num_layers - 1:
            break
        h = h + _attn_out(dispatch.attention(q, k, v, causal), w, P, reduce)
        h = h + _mlp(_norm(h, w[P + "norm_post"], eps), w, P, cfg, reduce)
    return keys, values


def causal_mask(length: int, device, dtype=torch.float32) -> Tensor:
    """Additive [1, 1, L, L] lower-triangular mask."""
    allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return ops.bool_to_additive_mask(allowed[None], dtype)


def gen_mask(text_lens: Tensor, padded_len: int, gen_len: int, dtype=torch.float32) -> Optional[Tensor]:
    """Additive [R, 1, 1, padded_len + gen_len] masking each row's text padding (host tensors; None when no row
    is padded)."""
    if bool((text_lens == padded_len).all()):
        return None
    keys = torch.arange(padded_len + gen_len)
    allowed = (keys[None] < text_lens[:, None]) | (keys[None] >= padded_len)
    return ops.bool_to_additive_mask(allowed[:, None], dtype)


# ----------------------------------------------------------------------------- generation pathway (every step)
def time_embedding(w: Weights, cfg: TransformerConfig, timesteps: Tensor) -> Tensor:
    """Integer scheduler timesteps [N] -> [N, hidden] float32: time_embedder(time_proj(t * timestep_scale))."""
    t = timesteps.to(w["time.linear_1.weight"].device) * cfg.timestep_scale        # int64 * float -> float32
    half = cfg.time_channels // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device)
    emb = t[:, None].float() * torch.exp(exponent / half)[None, :]
    emb = torch.cat([torch.cos(emb), torch.sin(emb)], dim=-1)                       # flip_sin_to_cos
    h = F.silu(ops.linear(emb, w["time.linear_1.weight"], w["time.linear_1.bias"]))
    return ops.linear(h, w["time.linear_2.weight"], w["time.linear_2.bias"])


def patchify(latents: Tensor, p: int) -> Tensor:
    """[B, C, T, h, w] -> [B, T * h' * w', p * p * C] (frame-major; zero-padded to a multiple of p)."""
    b, c, t, h, wd = latents.shape
    hp, wp = -(-h // p), -(-wd // p)
    if (hp * p, wp * p) != (h, wd):
        latents = F.pad(latents, (0, wp * p - wd, 0, hp * p - h))
    x = latents.reshape(b, c, t, hp, p, wp, p).permute(0, 2, 3, 5, 4, 6, 1)
    return x.reshape(b, t * hp * wp, p * p * c)


def unpatchify(tokens: Tensor, c: int, t: int, h: int, wd: int, p: int) -> Tensor:
    """[B, t * h' * w', p * p * C] -> [B, C, t, h, w] (cropped back from the patch padding)."""
    b = tokens.shape[0]
    hp, wp = -(-h // p), -(-wd // p)
    x = tokens.reshape(b, t, hp, wp, p, p, c).permute(0, 6, 1, 2, 4, 3, 5)
    return x.reshape(b, c, t, hp * p, wp * p)[..., :h, :wd]


def gen_tokens(w: Weights, cfg: TransformerConfig, vision: Tensor, actions: Tensor, temb: Tensor,
               action_in: Tensor, action_in_bias: Tensor, frame_tokens: int) -> Tensor:
    """Latents -> generation tokens [B, vision + chunk, hidden]: patches projected, the time embedding added to
    every patch of the noisy frames (>= 1; the clean frame 0 gets none) and to every action token; action
    tokens through their domain's projection (action_in [B, D, hidden], bias [B, hidden]) + the modality
    embedding."""
    dtype = w["proj_in"].dtype
    temb = temb.to(dtype)
    v = dispatch.linear(patchify(vision.to(dtype), cfg.latent_patch_size), w["proj_in"], w["proj_in_bias"])
    v = torch.cat([v[:, :frame_tokens], v[:, frame_tokens:] + temb], dim=1)
    a = torch.bmm(actions.to(dtype), action_in) + action_in_bias[:, None]
    a = a + w["action_embed"] + temb
    return torch.cat([v, a], dim=1)


def gen_hidden(w: Weights, cfg: TransformerConfig, x: Tensor, cos: Tensor, sin: Tensor, cache: TextCache,
               reduce: Reduce = _identity) -> Tensor:
    """Generation tokens [R, G, hidden] through every layer against the text cache -> final-normed hidden."""
    hq, hkv = local_heads(w, cfg)
    d, eps = cfg.head_dim, cfg.rms_norm_eps
    for i in range(cfg.num_layers):
        P = f"layers.{i}.gen."
        y = _norm(x, w[P + "norm_in"], eps)
        qkv = dispatch.linear(y, w[P + "qkv"], w.get(P + "qkv_bias"))
        q, k, v = dispatch.qkv_norm_rope(qkv, cos, sin, hq, hkv, d, w[P + "q_norm"], w[P + "k_norm"], eps)
        a = dispatch.attention(q, torch.cat([cache.keys[i], k], dim=2), torch.cat([cache.values[i], v], dim=2),
                               cache.mask)
        x = x + _attn_out(a, w, P, reduce)
        x = x + _mlp(_norm(x, w[P + "norm_post"], eps), w, P, cfg, reduce)
    return _norm(x, w["norm_gen"], eps)


def velocities(w: Weights, cfg: TransformerConfig, hidden: Tensor, vision_shape: Tuple[int, ...], frame_tokens: int,
               action_out: Tensor, action_out_bias: Tensor) -> Tuple[Tensor, Tensor]:
    """Final hidden [R, G, hidden] -> (vision velocity [R, C, T, h, w] with frame 0 zero, action velocity
    [R, chunk, action_dim]), both float32, before any masking."""
    _, c, t, h, wd = vision_shape
    n_vision = t * frame_tokens
    pv = dispatch.linear(hidden[:, frame_tokens:n_vision], w["proj_out"], w["proj_out_bias"])
    noisy = unpatchify(pv, c, t - 1, h, wd, cfg.latent_patch_size).float()
    vision = torch.cat([noisy.new_zeros(noisy.shape[0], c, 1, h, wd), noisy], dim=2)   # T = 1: all clean, all zero
    action = torch.bmm(hidden[:, n_vision:], action_out) + action_out_bias[:, None]
    return vision, action.float()


__all__ = ["TextCache", "text_kv", "gen_tokens", "gen_hidden", "velocities", "time_embedding", "shard_weights",
           "key_shapes", "layer_keys", "causal_mask", "gen_mask", "patchify", "unpatchify", "local_heads",
           "UNUSED_KEYS"]
