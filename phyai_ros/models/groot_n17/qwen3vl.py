"""Stateless Qwen3-VL backbone of GR00T N1.7: vision tower (2-D RoPE, DeepStack, 2x2 merger) and the LLM cut
at select_layer (interleaved mRoPE, q/k RMSNorm, GQA). Weights are a flat dict with the LeRobot key names
(checkpoint.py); every function is plain torch, so the runner can capture or replace any stage.

Why the details matter (each moves the features past fp32 noise): the merger normalizes BEFORE the 2x2
merge and the DeepStack mergers AFTER it; after an image the mRoPE position advances by the merged grid's
longer side, not by its token count; left-pad query rows have an all-masked attention row whose output is
exactly 0 (their MLP still runs); the features are the last kept layer's output, before the final norm.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from .checkpoint import EMBED, LLM, VIS
from .config import TextConfig, VisionConfig

Tensor = torch.Tensor
Weights = Dict[str, Tensor]
Trace = Optional[Dict[str, Tensor]]


# ------------------------------------------------------------------ shared pieces
def linear(x: Tensor, w: Weights, name: str) -> Tensor:
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def layer_norm(x: Tensor, w: Optional[Weights], name: Optional[str], eps: float) -> Tensor:
    """LayerNorm over the last dim; affine from w[name.weight / name.bias] when name is given."""
    weight, bias = (w[name + ".weight"], w[name + ".bias"]) if name else (None, None)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Qwen RMSNorm: normalized in float32, cast back, times weight (not 1 + weight)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def rotate_half(x: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE in float32 (rotate_half convention), result in x's dtype."""
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """[B, H, Tq, d] x [B, Hkv, Tk, d] -> [B, Tq, H*d]; grouped kv heads repeated; mask bool (True = attend)."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    b, h, t, d = a.shape
    return a.transpose(1, 2).reshape(b, t, h * d)


# ------------------------------------------------------------------ vision
def merge_order(grid: Tensor, merge: int) -> List[Tuple[Tensor, Tensor]]:
    """Per image, the (row, col) patch coordinates in merge-block order (each 2x2 block contiguous)."""
    out = []
    for t, h, w in grid.tolist():
        rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
        cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
        rows, cols = rows.permute(0, 2, 1, 3).reshape(-1), cols.permute(0, 2, 1, 3).reshape(-1)
        out.append((rows.repeat(t), cols.repeat(t)))
    return out


def position_embedding(w: Weights, v: VisionConfig, grid: Tensor) -> Tensor:
    """The learned side x side table bilinearly interpolated to each image's patch grid, merge-block order."""
    table = w[VIS + "pos_embed.weight"]
    side = int(round(v.num_position_embeddings ** 0.5))
    out = []
    for (t, h, wd), (rows, cols) in zip(grid.tolist(), merge_order(grid, v.merge_size)):
        hi, wi = torch.linspace(0, side - 1, h), torch.linspace(0, side - 1, wd)
        h0, w0 = hi.int(), wi.int()
        h1, w1 = (h0 + 1).clamp(max=side - 1), (w0 + 1).clamp(max=side - 1)
        dh, dw = hi - h0, wi - w0
        corners = ((h0, w0, (1 - dh)[:, None] * (1 - dw)[None]), (h0, w1, (1 - dh)[:, None] * dw[None]),
                   (h1, w0, dh[:, None] * (1 - dw)[None]), (h1, w1, dh[:, None] * dw[None]))
        emb = 0
        for hh, ww, wt in corners:
            idx = (hh[:, None] * side + ww[None]).flatten().to(table.device)
            emb = emb + table[idx] * wt.flatten().to(table)[:, None]
        flat = (rows * wd + cols).to(table.device)
        out.append(emb[flat])
    return torch.cat(out)


def vision_rope(v: VisionConfig, grid: Tensor, device) -> Tuple[Tensor, Tensor]:
    """cos / sin [N_patches, head_dim]: half the rotary dims from the patch row, half from the column."""
    dim = v.head_dim // 2
    inv = 1.0 / (v.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
    rows, cols = (torch.cat(x).to(device) for x in zip(*merge_order(grid, v.merge_size)))
    freqs = torch.cat([rows[:, None].float() * inv, cols[:, None].float() * inv], dim=-1)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def vision_attention(x: Tensor, w: Weights, name: str, v: VisionConfig, cos: Tensor, sin: Tensor,
                     seqlens: List[int]) -> Tensor:
    """Self-attention within each image (images of one size run as one batch)."""
    n = x.shape[0]
    qkv = linear(x, w, name + ".qkv").view(n, 3, v.num_heads, v.head_dim)
    q, k = apply_rope(qkv[:, 0], cos[:, None], sin[:, None]), apply_rope(qkv[:, 1], cos[:, None], sin[:, None])
    val = qkv[:, 2]
    if len(set(seqlens)) == 1:
        shape = (len(seqlens), seqlens[0], v.num_heads, v.head_dim)
        split = [(q.view(shape), k.view(shape), val.view(shape))]
    else:
        split = [(a[None], b[None], c[None]) for a, b, c in zip(q.split(seqlens), k.split(seqlens), val.split(seqlens))]
    outs = [attention(a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2)).reshape(-1, v.width)
            for a, b, c in split]
    return linear(torch.cat(outs), w, name + ".proj")


def vision_block(x: Tensor, w: Weights, i: int, v: VisionConfig, cos: Tensor, sin: Tensor,
                 seqlens: List[int]) -> Tensor:
    b = f"{VIS}blocks.{i}."
    x = x + vision_attention(layer_norm(x, w, b + "norm1", v.ln_eps), w, b + "attn", v, cos, sin, seqlens)
    h = F.gelu(linear(layer_norm(x, w, b + "norm2", v.ln_eps), w, b + "mlp.linear_fc1"), approximate="tanh")
    return x + linear(h, w, b + "mlp.linear_fc2")


def patch_merger(x: Tensor, w: Weights, name: str, v: VisionConfig, norm_after_merge: bool) -> Tensor:
    """2x2 merge + MLP: the main merger normalizes each patch first, the DeepStack ones the merged rows."""
    merged = v.width * v.merge_size ** 2
    if norm_after_merge:
        x = layer_norm(x.reshape(-1, merged), w, VIS + name + ".norm", v.ln_eps)
    else:
        x = layer_norm(x, w, VIS + name + ".norm", v.ln_eps).reshape(-1, merged)
    return linear(F.gelu(linear(x, w, VIS + name + ".linear_fc1")), w, VIS + name + ".linear_fc2")


def vision_tower(w: Weights, v: VisionConfig, pixels: Tensor, grid: Tensor, trace: Trace = None
                 ) -> Tuple[Tensor, List[Tensor]]:
    """Pixel rows [N, C*tp*p*p] -> merged image embeddings [N/4, out] and the DeepStack features."""
    proj = w[VIS + "patch_embed.proj.weight"]
    x = F.linear(pixels.to(proj.dtype), proj.reshape(proj.shape[0], -1), w[VIS + "patch_embed.proj.bias"])
    pos = position_embedding(w, v, grid)
    _record(trace, "visual_patch_embed", x)
    _record(trace, "visual_pos_embeds", pos)
    x = x + pos
    cos, sin = vision_rope(v, grid, x.device)
    seqlens = [int(t * h * wd) for t, h, wd in grid.tolist()]
    deepstack = []
    for i in range(v.depth):
        x = vision_block(x, w, i, v, cos, sin, seqlens)
        _record(trace, f"visual_block_out.{i}", x)
        if i in v.deepstack_indexes:
            j = v.deepstack_indexes.index(i)
            deepstack.append(patch_merger(x, w, f"deepstack_merger_list.{j}", v, norm_after_merge=True))
            _record(trace, f"visual_deepstack.{j}", deepstack[-1])
    merged = patch_merger(x, w, "merger", v, norm_after_merge=False)
    _record(trace, "visual_merged", merged)
    return merged, deepstack


# ------------------------------------------------------------------ text
def mrope_positions(input_ids: Tensor, attention_mask: Tensor, grid: Tensor, image_token: int, merge: int
                    ) -> Tensor:
    """[3, B, L] (temporal, height, width) positions over each item's valid tokens; pads 0. Text runs count
    up on all rows; an image at running index s gets (s, s + merged row, s + merged col), and the running
    index then moves on by max(merged rows, merged cols)."""
    b, length = input_ids.shape
    pos = torch.zeros(3, b, length, dtype=torch.int64)
    images = iter(grid.tolist())
    ids_all, mask_all = input_ids.tolist(), attention_mask.tolist()
    for item in range(b):
        ids, mask = ids_all[item], mask_all[item]
        i, running = 0, 0
        while i < length:
            if not mask[i]:
                i += 1
                continue
            if ids[i] != image_token:
                pos[:, item, i] = running
                running, i = running + 1, i + 1
                continue
            t, h, w = next(images)
            gh, gw = h // merge, w // merge
            n = t * gh * gw
            r = torch.arange(gh).repeat_interleave(gw).repeat(t)
            c = torch.arange(gw).repeat(gh).repeat(t)
            pos[0, item, i:i + n] = running + torch.arange(t).repeat_interleave(gh * gw)
            pos[1, item, i:i + n] = running + r
            pos[2, item, i:i + n] = running + c
            running, i = running + max(t, gh, gw), i + n
    return pos


def mrope_cos_sin(t: TextConfig, positions: Tensor) -> Tuple[Tensor, Tensor]:
    """Interleaved mRoPE tables [B, L, head_dim]: frequency j uses the height row when j % 3 == 1 and
    j < 3*section[1], the width row when j % 3 == 2 and j < 3*section[2], else the temporal row."""
    inv = 1.0 / (t.rope_theta ** (torch.arange(0, t.head_dim, 2, dtype=torch.int64, device=positions.device)
                                  .float() / t.head_dim))
    freqs = positions.float()[..., None] * inv          # [3, B, L, hd/2]
    out = freqs[0].clone()
    for row in (1, 2):
        sl = slice(row, 3 * t.mrope_section[row], 3)
        out[..., sl] = freqs[row][..., sl]
    emb = torch.cat([out, out], dim=-1)
    return emb.cos(), emb.sin()


def text_attention(x: Tensor, w: Weights, b: str, t: TextConfig, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
    bsz, length, _ = x.shape
    q = rms_norm(linear(x, w, b + "q_proj").view(bsz, length, t.num_heads, t.head_dim), w[b + "q_norm.weight"],
                 t.rms_eps).transpose(1, 2)
    k = rms_norm(linear(x, w, b + "k_proj").view(bsz, length, t.num_kv_heads, t.head_dim), w[b + "k_norm.weight"],
                 t.rms_eps).transpose(1, 2)
    v = linear(x, w, b + "v_proj").view(bsz, length, t.num_kv_heads, t.head_dim).transpose(1, 2)
    q, k = apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None], sin[:, None])
    return linear(attention(q, k, v, mask), w, b + "o_proj")


def decoder_layer(x: Tensor, w: Weights, i: int, t: TextConfig, cos: Tensor, sin: Tensor, mask: Tensor,
                  query_valid: Tensor) -> Tensor:
    b = f"{LLM}layers.{i}."
    a = text_attention(rms_norm(x, w[b + "input_layernorm.weight"], t.rms_eps), w, b + "self_attn.", t, cos, sin, mask)
    x = x + a * query_valid          # a pad row attends to nothing: its attention output is 0
    h = rms_norm(x, w[b + "post_attention_layernorm.weight"], t.rms_eps)
    gate, up = linear(h, w, b + "mlp.gate_proj"), linear(h, w, b + "mlp.up_proj")
    return x + linear(F.silu(gate) * up, w, b + "mlp.down_proj")


def causal_padding_mask(attention_mask: Tensor) -> Tensor:
    """[B, 1, L, L] bool: causal and key valid; all-masked (pad) query rows get their own key so the softmax
    stays finite (their output is zeroed by the caller)."""
    length = attention_mask.shape[1]
    valid = attention_mask.bool()
    causal = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    mask = causal[None] & valid[:, None, :]
    eye = torch.eye(length, dtype=torch.bool, device=valid.device)[None]
    return (mask | (eye & ~valid[:, :, None]))[:, None]


def language_model(w: Weights, t: TextConfig, embeds: Tensor, positions: Tensor, attention_mask: Tensor,
                   image_mask: Tensor, deepstack: List[Tensor], trace: Trace = None) -> Tensor:
    """The kept decoder layers; DeepStack features added at image positions after the first layers (never
    after the last kept one: the features are taken before it). Returns [B, L, W]."""
    cos, sin = mrope_cos_sin(t, positions.to(embeds.device))
    cos, sin = cos.to(embeds.dtype), sin.to(embeds.dtype)
    mask = causal_padding_mask(attention_mask)
    query_valid = attention_mask.bool()[..., None].to(embeds.dtype)
    x = embeds
    for i in range(t.depth):
        x = decoder_layer(x, w, i, t, cos, sin, mask, query_valid)
        _record(trace, f"layer_out.{i}", x)
        if i < len(deepstack) and i < t.depth - 1:
            x = x.clone()
            x[image_mask] = x[image_mask] + deepstack[i].to(x.dtype)
    return x


def backbone_features(w: Weights, v: VisionConfig, t: TextConfig, image_token: int, input_ids: Tensor,
                      attention_mask: Tensor, pixels: Tensor, grid: Tensor, trace: Trace = None) -> Tensor:
    """Tokens + images -> backbone features [B, L, W] (output of decoder layer select_layer - 1)."""
    merged, deepstack = vision_tower(w, v, pixels, grid, trace)
    table = w[EMBED]
    embeds = table[input_ids]
    image_mask = input_ids == image_token
    if int(image_mask.sum()) != merged.shape[0]:
        raise ValueError(f"{int(image_mask.sum())} image tokens but {merged.shape[0]} merged image embeddings")
    embeds = embeds.masked_scatter(image_mask[..., None], merged.to(embeds.dtype))
    _record(trace, "inputs_embeds", embeds)
    positions = mrope_positions(input_ids.cpu(), attention_mask.cpu(), grid.cpu(), image_token, v.merge_size)
    _record(trace, "position_ids", positions)
    feats = language_model(w, t, embeds, positions, attention_mask, image_mask, deepstack, trace)
    _record(trace, "features", feats)
    return feats


def _record(trace: Trace, key: str, x: Tensor) -> None:
    if trace is not None:
        trace[key] = x.detach()
